//! `handoff-postgres`: one key passed from holder to waiter, with 2 and with 4
//! contenders. Hand-off latency runs from the moment the holder starts its release
//! to the moment another contender holds; a holder that takes the key again itself
//! is a re-grab, counted apart. Wait is one acquire call (the floor: from the end
//! of the client's previous release to holding).
//!
//! * **NOTIFY hand-off floor**: clients on the lease row, each with its own data
//!   connection and its own LISTEN connection (channel), strictly alternating in a
//!   ring: the holder frees the row and notifies the next client's channel in one
//!   statement; the next client, parked on its notifications in its own task, takes
//!   the row with its own statement. One release round trip and commit, one
//!   notification, one acquire round trip and commit; 0 re-grabs by construction
//!   (`busy tries/acq` checks that the woken client never finds the row taken).
//! * **sqlx `PgAdvisoryLock`**: as many tasks, each on its own connection, loop
//!   acquire (a blocking `pg_advisory_lock`: the server queues the waiters and
//!   wakes one at the unlock) / empty body / release.
//! * **distlock**: a task per manager, twice: its statements sent unnamed (the
//!   default: parsed and planned at every call) and prepared per connection
//!   (`postgres_prepared_statements`), as the floor's are.
//!
//! Implementations alternate in 3 time slices of 1 s each, rotating the order,
//! after 0.3 s of warm-up each (`--quick`: one slice of 0.3 s, no warm-up). The
//! advisory and lease-row floors have no wake-up, so no row here.
//!
//! What bounds distlock's rows (probes of 2026-11-29 on a 2-vCPU VM, not kept:
//! client clocks beside `clock_timestamp()` logged in `release` and `acquire`).
//! On 4 managers, prepared, at 1.08x the floor, the new holder spends 8 us between
//! hearing the notification and holding, where the floor spends 178 us on its
//! take. distlock loses before that: its release reaches the waiter about 150 us
//! later than the floor's. About 85 us of that is the old holder's next
//! `acquire`, which re-queues it and reaches the server with the new holder's
//! release, since both answer the same commit. Either it holds the key's lock
//! first and the release waits behind it, or it waits out the release's commit
//! and then runs while the notification is being delivered. The rest is the
//! release's own PL/pgSQL (72 us against the floor's one statement). The floor's
//! clients send nothing until notified, so its ring never meets this traffic.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sqlx::postgres::PgAdvisoryLock;
use tokio::sync::mpsc;
use tokio_postgres::{Client, Notification};

use super::lease::LeaseSql;
use super::{connect, listen, server_note, sqlx_connect, PgEnv, LEASE_SECS};
use crate::error::{bail, BoxError, Result};
use crate::report::{new_histogram, us, Better, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::nanos;

const FLOOR_2: &str = "NOTIFY hand-off floor (2 clients alternating)";
const FLOOR_4: &str = "NOTIFY hand-off floor (4 clients alternating)";
const SQLX_2: &str = "sqlx 0.8 PgAdvisoryLock (2 connections)";
const SQLX_4: &str = "sqlx 0.8 PgAdvisoryLock (4 connections)";
const DISTLOCK_2: &str = "distlock (2 managers)";
const DISTLOCK_4: &str = "distlock (4 managers)";
const DISTLOCK_2_PREPARED: &str = "distlock (2 managers, prepared statements)";
const DISTLOCK_4_PREPARED: &str = "distlock (4 managers, prepared statements)";

/// One contender's figures in one slice.
struct Stats {
    handoffs: Histogram<u64>,
    waits: Histogram<u64>,
    acquired: u64,
    regrabs: u64,
    busy: u64,
}

impl Stats {
    fn new() -> Result<Stats> {
        Ok(Stats {
            handoffs: new_histogram()?,
            waits: new_histogram()?,
            acquired: 0,
            regrabs: 0,
            busy: 0,
        })
    }

    /// Counts contender `me`'s hold, asked for at `asked` and taken at `held`,
    /// if taken before `deadline`: its wait, and a hand-off from another
    /// contender's release or a re-grab of its own. Then marks `me` as the
    /// last to release, from now: its release follows at once.
    fn count_hold(
        &mut self,
        me: usize,
        asked: Instant,
        held: Instant,
        deadline: Instant,
        last: &LastRelease,
    ) -> Result<()> {
        if held < deadline {
            self.acquired += 1;
            self.waits.saturating_record(nanos(held - asked));
            match last.lock().map_err(|_| "poisoned")?.take() {
                Some((_, who)) if who == me => self.regrabs += 1,
                Some((at, _)) => self.handoffs.saturating_record(nanos(held - at)),
                None => {}
            }
        }
        *last.lock().map_err(|_| "poisoned")? = Some((Instant::now(), me));
        Ok(())
    }
}

/// When the last release of sqlx's or distlock's contenders started, and
/// whose it was: what tells a hand-off from a re-grab.
type LastRelease = Mutex<Option<(Instant, usize)>>;

/// One client of the NOTIFY floor's ring.
struct FloorClient {
    /// Kept: dropping it would close the LISTEN connection.
    _listener: Client,
    client: Client,
    sql: LeaseSql,
    notifications: mpsc::UnboundedReceiver<Notification>,
    owner: String,
    /// The next client's channel, which this one notifies at its release.
    next: String,
}

struct Ring {
    key: String,
    clients: Vec<FloorClient>,
}

impl Ring {
    async fn new(env: &PgEnv, size: usize) -> Result<Ring> {
        let mut clients = Vec::new();
        for i in 0..size {
            let client = connect(&env.url, "lock-bench-handoff-floor").await?;
            let sql = LeaseSql::prepare(&client).await?;
            let channel = format!("bench_handoff_{size}_{i}");
            let (listener, notifications) =
                listen(&env.url, "lock-bench-handoff-listen", &channel).await?;
            clients.push(FloorClient {
                _listener: listener,
                client,
                sql,
                notifications,
                owner: format!("handoff-floor-{size}-{i}"),
                next: format!("bench_handoff_{size}_{}", (i + 1) % size),
            });
        }
        Ok(Ring {
            key: format!("bench:handoff:floor:{size}"),
            clients,
        })
    }

    /// One slice: client 0 takes the row, then the ring turns until `length` has
    /// passed; each client ends after the first release it makes past the deadline
    /// (so its successor, notified, wakes once more and ends too).
    async fn slice(self, length: Duration, tag: String) -> Result<(Ring, Vec<Stats>)> {
        let deadline = Instant::now() + length;
        let released: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        let key = Arc::new(self.key.clone());
        let mut tasks = Vec::new();
        for (i, mut c) in self.clients.into_iter().enumerate() {
            let (released, key, tag) = (released.clone(), key.clone(), tag.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = Stats::new()?;
                let mut first = i == 0;
                let mut since = None::<Instant>;
                loop {
                    if !first {
                        // Parked until the predecessor's release reaches this client.
                        // Notifications of an earlier slice (the ring's last one goes
                        // to a client that had ended) carry another tag: skipped.
                        loop {
                            let Some(n) = c.notifications.recv().await else {
                                bail!("the NOTIFY floor's listening connection closed");
                            };
                            if n.payload() == tag.as_str() {
                                break;
                            }
                        }
                    }
                    first = false;
                    let token = loop {
                        match c.sql.acquire(&c.client, &key, &c.owner, LEASE_SECS).await? {
                            Some(t) => break t,
                            None => s.busy += 1,
                        }
                    };
                    let held = Instant::now();
                    if held < deadline {
                        s.acquired += 1;
                        if let Some(r) = released.lock().map_err(|_| "poisoned")?.take() {
                            s.handoffs.saturating_record(nanos(held - r));
                        }
                        if let Some(w) = since {
                            s.waits.saturating_record(nanos(held - w));
                        }
                    }
                    *released.lock().map_err(|_| "poisoned")? = Some(Instant::now());
                    if !c
                        .sql
                        .release_notify(&c.client, &key, &c.owner, token, &c.next, &tag)
                        .await?
                    {
                        bail!("the NOTIFY floor lost a hold it had just taken");
                    }
                    since = Some(Instant::now());
                    if Instant::now() >= deadline {
                        return Ok::<_, BoxError>((c, s));
                    }
                }
            }));
        }
        let mut clients = Vec::new();
        let mut stats = Vec::new();
        for t in tasks {
            let (c, s) = t.await??;
            clients.push(c);
            stats.push(s);
        }
        Ok((
            Ring {
                key: self.key,
                clients,
            },
            stats,
        ))
    }
}

/// sqlx's contenders: a connection each, one key.
struct SqlxGroup {
    lock: Arc<PgAdvisoryLock>,
    conns: Vec<sqlx::PgConnection>,
}

impl SqlxGroup {
    async fn new(env: &PgEnv, size: usize) -> Result<SqlxGroup> {
        let mut conns = Vec::new();
        for _ in 0..size {
            conns.push(sqlx_connect(&env.url, "lock-bench-handoff-sqlx").await?);
        }
        Ok(SqlxGroup {
            lock: Arc::new(PgAdvisoryLock::new(format!("bench:handoff:sqlx:{size}"))),
            conns,
        })
    }

    async fn slice(self, length: Duration) -> Result<(SqlxGroup, Vec<Stats>)> {
        let deadline = Instant::now() + length;
        // Who released last, and when the release started.
        let last: Arc<LastRelease> = Arc::new(Mutex::new(None));
        let mut tasks = Vec::new();
        for (me, mut conn) in self.conns.into_iter().enumerate() {
            let (lock, last) = (self.lock.clone(), last.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = Stats::new()?;
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    let guard = lock.acquire(&mut conn).await?;
                    s.count_hold(me, asked, Instant::now(), deadline, &last)?;
                    guard.release_now().await?;
                }
                Ok::<_, BoxError>((conn, s))
            }));
        }
        let mut conns = Vec::new();
        let mut stats = Vec::new();
        for t in tasks {
            let (c, s) = t.await??;
            conns.push(c);
            stats.push(s);
        }
        Ok((
            SqlxGroup {
                lock: self.lock,
                conns,
            },
            stats,
        ))
    }
}

/// distlock's contenders: a manager each (as processes of a service would be),
/// one task per manager, one key.
struct DistlockGroup {
    key: Arc<String>,
    managers: Vec<distlock::LockManager>,
}

impl DistlockGroup {
    /// `size` managers, their statements sent unnamed (distlock's default)
    /// or `prepared` per connection, as the floors' are.
    async fn new(env: &PgEnv, size: usize, prepared: bool) -> Result<DistlockGroup> {
        let mut managers = Vec::new();
        for _ in 0..size {
            managers.push(super::distlock_manager_with(&env.url, prepared).await?);
        }
        let sent = if prepared { "prepared" } else { "unnamed" };
        Ok(DistlockGroup {
            key: Arc::new(format!("bench:handoff:distlock:{size}:{sent}")),
            managers,
        })
    }

    async fn slice(self, length: Duration) -> Result<(DistlockGroup, Vec<Stats>)> {
        let deadline = Instant::now() + length;
        let last: Arc<LastRelease> = Arc::new(Mutex::new(None));
        let mut tasks = Vec::new();
        for (me, manager) in self.managers.iter().cloned().enumerate() {
            let (key, last) = (self.key.clone(), last.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = Stats::new()?;
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    let guard = manager.lock(key.as_str()).acquire().await?;
                    s.count_hold(me, asked, Instant::now(), deadline, &last)?;
                    guard.release().await?;
                }
                Ok::<_, BoxError>(s)
            }));
        }
        let mut stats = Vec::new();
        for t in tasks {
            stats.push(t.await??);
        }
        Ok((self, stats))
    }
}

enum Contenders {
    Ring(Ring),
    Sqlx(SqlxGroup),
    Distlock(DistlockGroup),
}

impl Contenders {
    async fn slice(self, length: Duration, tag: String) -> Result<(Contenders, Vec<Stats>)> {
        Ok(match self {
            Contenders::Ring(r) => {
                let (r, s) = r.slice(length, tag).await?;
                (Contenders::Ring(r), s)
            }
            Contenders::Sqlx(g) => {
                let (g, s) = g.slice(length).await?;
                (Contenders::Sqlx(g), s)
            }
            Contenders::Distlock(g) => {
                let (g, s) = g.slice(length).await?;
                (Contenders::Distlock(g), s)
            }
        })
    }
}

/// Sums of the slices, for one row.
struct Totals {
    handoffs: Histogram<u64>,
    waits: Histogram<u64>,
    acquired: u64,
    regrabs: u64,
    busy: u64,
    seconds: f64,
}

fn row(label: &str, t: &Totals) -> Row {
    let mut row = Row::new(label);
    let mean_wait = t.waits.mean();
    row.push(
        "handoff p50 us",
        us(t.handoffs.value_at_quantile(0.50)),
        Better::Lower,
    )
    .push(
        "handoff p99 us",
        us(t.handoffs.value_at_quantile(0.99)),
        Better::Lower,
    )
    .push(
        "handoffs/s",
        t.handoffs.len() as f64 / t.seconds,
        Better::Higher,
    )
    .push("acq/s", t.acquired as f64 / t.seconds, Better::Higher)
    .push(
        "regrab %",
        t.regrabs as f64 * 100.0 / t.acquired.max(1) as f64,
        Better::Lower,
    )
    .push(
        "wait p50 us",
        us(t.waits.value_at_quantile(0.50)),
        Better::Lower,
    )
    .push("wait max us", us(t.waits.max()), Better::Lower)
    .push(
        "max/mean wait",
        if mean_wait > 0.0 {
            t.waits.max() as f64 / mean_wait
        } else {
            f64::NAN
        },
        Better::Lower,
    )
    .push(
        "busy tries/acq",
        t.busy as f64 / t.acquired.max(1) as f64,
        Better::Neutral,
    );
    row
}

pub async fn run(env: &PgEnv) -> Result<ScenarioResult> {
    let (slices, length, warmup) = if env.quick {
        (1, Duration::from_millis(300), None)
    } else {
        (3, Duration::from_secs(1), Some(Duration::from_millis(300)))
    };
    let labels = [
        FLOOR_2,
        FLOOR_4,
        SQLX_2,
        SQLX_4,
        DISTLOCK_2,
        DISTLOCK_4,
        DISTLOCK_2_PREPARED,
        DISTLOCK_4_PREPARED,
    ];
    let mut groups = vec![
        Some(Contenders::Ring(Ring::new(env, 2).await?)),
        Some(Contenders::Ring(Ring::new(env, 4).await?)),
        Some(Contenders::Sqlx(SqlxGroup::new(env, 2).await?)),
        Some(Contenders::Sqlx(SqlxGroup::new(env, 4).await?)),
    ];
    // In the order of `labels`: unnamed statements, then prepared ones.
    for prepared in [false, true] {
        for managers in [2, 4] {
            groups.push(Some(Contenders::Distlock(
                DistlockGroup::new(env, managers, prepared).await?,
            )));
        }
    }
    let n = labels.len();
    let mut totals: Vec<Totals> = (0..n)
        .map(|_| {
            Ok(Totals {
                handoffs: new_histogram()?,
                waits: new_histogram()?,
                acquired: 0,
                regrabs: 0,
                busy: 0,
                seconds: 0.0,
            })
        })
        .collect::<Result<_>>()?;
    let mut tag = 0u64;
    if let Some(w) = warmup {
        for g in &mut groups {
            let Some(c) = g.take() else {
                bail!("contenders lost")
            };
            tag += 1;
            *g = Some(c.slice(w, format!("slice-{tag}")).await?.0);
        }
    }
    for round in 0..slices {
        for k in 0..n {
            let i = (k + round) % n;
            let Some(c) = groups[i].take() else {
                bail!("contenders lost by an earlier failure");
            };
            tag += 1;
            let started = Instant::now();
            let (c, stats) = c.slice(length, format!("slice-{tag}")).await?;
            totals[i].seconds += started.elapsed().as_secs_f64().min(length.as_secs_f64());
            for s in stats {
                totals[i].handoffs.add(s.handoffs)?;
                totals[i].waits.add(s.waits)?;
                totals[i].acquired += s.acquired;
                totals[i].regrabs += s.regrabs;
                totals[i].busy += s.busy;
            }
            groups[i] = Some(c);
        }
    }
    let rows: Vec<Row> = labels.iter().zip(&totals).map(|(l, t)| row(l, t)).collect();
    let mut targets = Vec::new();
    for (distlock, floor) in [
        (DISTLOCK_2, FLOOR_2),
        (DISTLOCK_4, FLOOR_4),
        (DISTLOCK_2_PREPARED, FLOOR_2),
        (DISTLOCK_4_PREPARED, FLOOR_4),
    ] {
        targets.push(Target::ratio(
            &format!("{distlock}: hand-off p50 <= 1.0x its floor"),
            distlock,
            "handoff p50 us",
            floor,
            Check::AtMost(1.0),
        ));
        targets.push(Target::absolute(
            &format!("{distlock}: 0 re-grabs"),
            distlock,
            "regrab %",
            Check::AtMost(0.0),
        ));
        targets.push(Target::absolute(
            &format!("{distlock}: max wait <= 5x the mean"),
            distlock,
            "max/mean wait",
            Check::AtMost(5.0),
        ));
    }
    Ok(ScenarioResult {
        name: "handoff-postgres",
        title: format!(
            "one key passed between holders; {slices} interleaved slice(s) of {:.1} s per implementation",
            length.as_secs_f64()
        ),
        notes: vec![
            server_note(env),
            "hand-off: from the start of the holder's release to another contender holding; the floors' releases and acquires are each a commit".to_owned(),
            "each row's ratios are to both floors; compare a row with the floor of its own size".to_owned(),
            "sqlx and distlock: one task per connection (manager); a hold taken again by the task that released it is a re-grab".to_owned(),
            "the floors' statements are prepared: distlock's prepared rows send theirs the same way, its default rows unnamed".to_owned(),
        ],
        rows,
        references: 2,
        targets,
    })
}
