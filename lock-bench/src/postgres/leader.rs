//! `leader-postgres`: leader hand-over between two candidates. A leads; B
//! campaigns and is queued behind A's lock; the hand-over runs from the start of
//! A's resignation to B's campaign returning, and rounds alternate who leads.
//!
//! * **distlock's leader SQL by hand**: two clients, each a data connection and a
//!   LISTEN connection on its own channel, with the statements distlock's
//!   election sends, prepared: the follower queued by its schema's `acquire`
//!   (waiting, fencing) beforehand; the leader's `release`, which hands the lock
//!   to the queued follower and notifies its channel `=<owner>:<token>:<attempt>`,
//!   then the resignation's announcement (`pg_notify`); the follower, parked on
//!   its notifications in its own task, then does what `campaign` does once it
//!   holds: `inspect` of the lock and the term's announcement (`pg_notify`). The
//!   floor of the target.
//! * **the same, hand-off only**: the follower stops at the notification: the
//!   hand-off alone, what the campaign's reading and announcing add on top.
//! * **distlock**: two managers, `leader(name).campaign()` in a task of its own
//!   for B (queued: `inspect` shows the lock waited for before A resigns), A's
//!   `Leadership::resign()`.
//!
//! Every row starts its hand-over the same way: the follower queued, then
//! [`PARKED`] of quiet before the resignation, so that each starts from the
//! same idle machine. Without it the floor resigned the instant its follower's
//! `acquire` returned, with every thread and CPU still busy, while distlock's
//! round resigned after its `inspect` polling's last 1 ms sleep: the same
//! statements then cost distlock 1.2x; with the floor's round preceded by
//! the same polling, 1.10x and 1.05x, and with client and server each on a
//! CPU of its own, 1.02x and 1.01x (probes of 2026-11-28, not kept): most of
//! the gap was where the round starts, not the work.
//!
//! The NOTIFY hand-off floor of `handoff.rs` does not fit: it is the bench's own
//! lease row, with no queue (the ring decides who is next) and no term to read or
//! announce.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::sync::mpsc;
use tokio_postgres::{Client, Notification, Statement};

use super::proxy::PgCountingProxy;
use super::{connect, listen, server_note, PgEnv, LEASE_SECS};
use crate::error::{bail, BoxError, Result};
use crate::report::{new_histogram, us, Better, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::nanos;

const SAME_SQL: &str = "distlock's leader SQL by hand (hand-off, inspect, announce; prepared)";
const HANDOFF_ONLY: &str = "distlock's leader SQL by hand, hand-off only (release + NOTIFY)";
const DISTLOCK: &str = "distlock (2 managers, prepared statements, resign -> campaign)";

const ACQUIRE: &str = "SELECT o_status, o_token, o_remaining_ms FROM distlock.acquire(\
     $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";
const RELEASE: &str = "SELECT distlock.release($1, $2, $3, $4, $5)";
const INSPECT: &str =
    "SELECT value, pttl, queue_owners, queue_entries, now_ms FROM distlock.inspect($1)";
const PUBLISH: &str = "SELECT pg_notify($1, $2)::text";
/// What distlock sends for an election: the election's announcement channel
/// and the lock's wake-up channel (placeholders of `channel_ident`'s form:
/// nothing listens on them), a holder description, a route. The lock's full
/// name is [`lock_name`]'s.
const ANNOUNCE_CHANNEL: &str = "distlock_22222222222222222222222222222222";
const WAKE_CHANNEL: &str = "distlock_33333333333333333333333333333333";
const HOLDER: &str = "lock-bench leader floor";
const ROUTE: &str = "0000000b";
/// The queue lease (ms), as distlock's waiter sends it (`QUEUE_LEASE`, 3 s).
/// The lease a hand-off gives is the whole lease, as distlock sends it for a
/// hold it does not renew: the floor never renews, and its term waits out
/// the other rows' blocks (more than 3 s once every round parks 5 ms).
const QUEUE_LEASE_MS: i64 = 3_000;
/// Which pass of the scenario this is (`--runs N` runs it N times on one
/// server): each pass elects under names of its own, so that no term of an
/// earlier pass (its lease still running) stands in the way.
static PASS: AtomicU64 = AtomicU64::new(0);

/// The full lock name distlock writes for election `election`.
fn lock_name(election: &str) -> String {
    format!("distlock:lock:{{leader:{election}}}:leader:{election}")
}
/// How long the distlock round waits for B to show in A's lock's queue.
const QUEUED_WITHIN: Duration = Duration::from_secs(5);
/// How long every row's follower is parked, queued, before the leader
/// resigns: as `parked-handoff`'s waiter, long enough for its task to sleep
/// and its thread and CPU to go idle, in every row alike.
const PARKED: Duration = Duration::from_millis(5);

/// One candidate of the SQL floor.
struct Candidate {
    /// Kept: dropping it would close the LISTEN connection.
    _listener: Client,
    client: Client,
    acquire: Statement,
    release: Statement,
    inspect: Statement,
    publish: Statement,
    notifications: mpsc::UnboundedReceiver<Notification>,
    owner: String,
    channel: String,
    /// The lock's full name.
    name: String,
}

impl Candidate {
    async fn new(url: &str, i: usize, name: &str) -> Result<Candidate> {
        let client = connect(url, "lock-bench-leader-sql").await?;
        client
            .batch_execute(&distlock::postgres_schema_sql(super::DISTLOCK_SCHEMA)?)
            .await?;
        let channel = format!("bench_leader_{i}");
        let (listener, notifications) = listen(url, "lock-bench-leader-listen", &channel).await?;
        Ok(Candidate {
            _listener: listener,
            acquire: client.prepare(ACQUIRE).await?,
            release: client.prepare(RELEASE).await?,
            inspect: client.prepare(INSPECT).await?,
            publish: client.prepare(PUBLISH).await?,
            client,
            notifications,
            // Distinct owner tokens of distlock's length.
            owner: format!("{i:0>32}"),
            channel,
            name: name.to_owned(),
        })
    }

    /// `acquire` as a campaign sends it (waiting, fencing); the status.
    async fn acquire(&self, attempt: i64) -> Result<i32> {
        let since = super::epoch_ms()?;
        let lease_ms = (LEASE_SECS * 1000.0) as i64;
        let (fence, waiting, events) = (true, true, "");
        let row = self
            .client
            .query_one(
                &self.acquire,
                &[
                    &self.name,
                    &self.owner,
                    &lease_ms,
                    &fence,
                    &waiting,
                    &since,
                    &HOLDER,
                    &QUEUE_LEASE_MS,
                    &lease_ms,
                    &ROUTE,
                    &self.channel,
                    &attempt,
                    &events,
                ],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Resigns: `release` (which hands the lock to the queued candidate), then
    /// the resignation's announcement.
    async fn resign(&self, epoch: i64) -> Result<()> {
        let (keep, events) = (0i64, "");
        let freed: bool = self
            .client
            .query_one(
                &self.release,
                &[&self.name, &self.owner, &keep, &WAKE_CHANNEL, &events],
            )
            .await?
            .get(0);
        if !freed {
            bail!("the leader SQL floor lost a term it held");
        }
        let message = format!("R {epoch}");
        self.client
            .query_one(&self.publish, &[&ANNOUNCE_CHANNEL, &message])
            .await?;
        Ok(())
    }

    /// Parked until the hand-off reaches this candidate; its token (the epoch).
    /// Other notifications (a first waiter's notice to the holder) are skipped.
    async fn handed_off(&mut self) -> Result<i64> {
        let mine = format!("={}:", self.owner);
        loop {
            let Some(n) = self.notifications.recv().await else {
                bail!("the leader SQL floor's listening connection closed");
            };
            if let Some(rest) = n.payload().strip_prefix(&mine) {
                return Ok(rest
                    .split(':')
                    .next()
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0));
            }
        }
    }

    /// What a campaign does once it holds: reads the lock, announces the term.
    async fn announce(&self, epoch: i64) -> Result<()> {
        self.client.query(&self.inspect, &[&self.name]).await?;
        let message = format!("T {epoch} 0 {} {HOLDER}", (LEASE_SECS * 1000.0) as i64);
        self.client
            .query_one(&self.publish, &[&ANNOUNCE_CHANNEL, &message])
            .await?;
        Ok(())
    }
}

/// The SQL floor: two candidates, the leader's index and its epoch.
struct SqlPair {
    candidates: Vec<Option<Candidate>>,
    leader: usize,
    epoch: i64,
    attempt: i64,
    /// Hand-off only: the follower stops at the notification.
    handoff_only: bool,
}

impl SqlPair {
    async fn new(url: &str, handoff_only: bool, pass: String) -> Result<SqlPair> {
        let base = if handoff_only { 2 } else { 0 };
        let name = lock_name(&format!("bench-sql-{base}-{pass}"));
        let a = Candidate::new(url, base, &name).await?;
        let b = Candidate::new(url, base + 1, &name).await?;
        if a.acquire(1).await? != 1 {
            bail!("the leader SQL floor's first campaign found the lock held");
        }
        Ok(SqlPair {
            candidates: vec![Some(a), Some(b)],
            leader: 0,
            epoch: 0,
            attempt: 1,
            handoff_only,
        })
    }

    /// One hand-over; its latency.
    async fn round(&mut self, counter: Option<&PgCountingProxy>) -> Result<(Duration, u64)> {
        let follower = 1 - self.leader;
        let Some(mut next) = self.candidates[follower].take() else {
            bail!("a candidate was lost by an earlier failure");
        };
        self.attempt += 1;
        if next.acquire(self.attempt).await? != 0 {
            bail!("the leader SQL floor's follower took a lock its leader holds");
        }
        let handoff_only = self.handoff_only;
        let task = tokio::spawn(async move {
            let epoch = next.handed_off().await?;
            if !handoff_only {
                next.announce(epoch).await?;
            }
            Ok::<_, BoxError>((next, epoch, Instant::now()))
        });
        tokio::time::sleep(PARKED).await;
        let Some(leader) = self.candidates[self.leader].as_ref() else {
            bail!("a candidate was lost by an earlier failure");
        };
        let before = counter.map_or(0, |c| c.round_trips());
        let started = Instant::now();
        leader.resign(self.epoch).await?;
        let (next, epoch, held) = task.await??;
        self.candidates[follower] = Some(next);
        self.leader = follower;
        self.epoch = epoch;
        let round_trips = counter.map_or(0, |c| c.round_trips() - before);
        Ok((held - started, round_trips))
    }
}

/// distlock's candidates: a manager each.
struct DistlockPair {
    election: String,
    managers: Vec<distlock::LockManager>,
    term: Option<distlock::Leadership>,
    leader: usize,
}

impl DistlockPair {
    async fn new(url: &str, pass: String) -> Result<DistlockPair> {
        let managers = vec![
            // Prepared statements, as the floor's (its SQL by hand, prepared).
            super::distlock_manager_with(url, true).await?,
            super::distlock_manager_with(url, true).await?,
        ];
        let election = format!("bench-leader-{pass}");
        let term = managers[0].leader(election.as_str()).campaign().await?;
        Ok(DistlockPair {
            election,
            managers,
            term: Some(term),
            leader: 0,
        })
    }

    async fn round(&mut self, counter: Option<&PgCountingProxy>) -> Result<(Duration, u64)> {
        let follower = 1 - self.leader;
        let election = self.managers[follower].leader(self.election.as_str());
        let key = election.lock_key();
        let task = tokio::spawn(async move {
            let term = election.campaign().await?;
            Ok::<_, BoxError>((term, Instant::now()))
        });
        // B is queued once its campaign's first attempt marked the lock waited for.
        let asked = Instant::now();
        loop {
            match self.managers[self.leader].inspect(&key).await? {
                Some(info) if info.waited_for => break,
                _ if asked.elapsed() > QUEUED_WITHIN => {
                    bail!("distlock's follower was not queued within {QUEUED_WITHIN:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
        tokio::time::sleep(PARKED).await;
        let Some(term) = self.term.take() else {
            bail!("the term was lost by an earlier failure");
        };
        let before = counter.map_or(0, |c| c.round_trips());
        let started = Instant::now();
        term.resign().await?;
        let (term, held) = task.await??;
        self.term = Some(term);
        self.leader = follower;
        let round_trips = counter.map_or(0, |c| c.round_trips() - before);
        Ok((held - started, round_trips))
    }
}

enum Pair {
    Sql(SqlPair),
    /// Boxed: the held term is large beside a pair of SQL clients.
    Distlock(Box<DistlockPair>),
}

impl Pair {
    async fn round(&mut self, counter: Option<&PgCountingProxy>) -> Result<(Duration, u64)> {
        match self {
            Pair::Sql(p) => p.round(counter).await,
            Pair::Distlock(p) => p.round(counter).await,
        }
    }
}

/// The rows' candidates on `url`, electing under names of pass `pass`.
async fn new_pairs(url: &str, pass: String) -> Result<Vec<Pair>> {
    Ok(vec![
        Pair::Sql(SqlPair::new(url, false, pass.clone()).await?),
        Pair::Sql(SqlPair::new(url, true, pass.clone()).await?),
        Pair::Distlock(Box::new(DistlockPair::new(url, pass).await?)),
    ])
}

pub async fn run(env: &PgEnv) -> Result<ScenarioResult> {
    let (warmup, rounds, block): (u64, u64, u64) = if env.quick {
        (4, 30, 10)
    } else {
        (50, 1_000, 100)
    };
    let labels = [SAME_SQL, HANDOFF_ONLY, DISTLOCK];
    let n = labels.len();
    let pass = PASS.fetch_add(1, Ordering::Relaxed);
    let mut pairs = new_pairs(&env.url, pass.to_string()).await?;
    for p in &mut pairs {
        for _ in 0..warmup {
            p.round(None).await?;
        }
    }
    let mut hist: Vec<Histogram<u64>> = (0..n).map(|_| new_histogram()).collect::<Result<_>>()?;
    for b in 0..rounds.div_ceil(block) {
        let this_block = block.min(rounds - b * block);
        for k in 0..n {
            let i = (k + b as usize) % n;
            for _ in 0..this_block {
                let (took, _) = pairs[i].round(None).await?;
                hist[i].saturating_record(nanos(took));
            }
        }
    }
    drop(pairs);
    // Round trips per hand-over, in a pass of their own through a counting
    // proxy: every connection's, from the start of the resignation until both
    // the resignation and the campaign returned.
    let rt_rounds = if env.quick { 6 } else { 50 };
    let (proxy, proxied) = super::counting_proxy(env).await?;
    let mut round_trips = Vec::new();
    for mut p in new_pairs(&proxied, format!("{pass}-rt")).await? {
        p.round(None).await?;
        let mut sum = 0;
        for _ in 0..rt_rounds {
            sum += p.round(Some(&proxy)).await?.1;
        }
        round_trips.push(sum as f64 / rt_rounds as f64);
    }
    let rows: Vec<Row> = (0..n)
        .map(|i| {
            let h = &hist[i];
            let mut row = Row::new(labels[i]);
            row.push(
                "handover p50 us",
                us(h.value_at_quantile(0.50)),
                Better::Lower,
            )
            .push(
                "handover p99 us",
                us(h.value_at_quantile(0.99)),
                Better::Lower,
            )
            .push("handover max us", us(h.max()), Better::Lower)
            .push("rt/handover", round_trips[i], Better::Neutral);
            row.histogram = Some(h.clone());
            row
        })
        .collect();
    Ok(ScenarioResult {
        name: "leader-postgres",
        title: format!(
            "leader hand-over between 2 candidates, {rounds} rounds per implementation in interleaved blocks of {block}, who leads alternating"
        ),
        notes: vec![
            server_note(env),
            "hand-over: from the start of the leader's resignation to the follower's campaign returning; the follower is queued before it starts (distlock: inspect shows the lock waited for), then parked for 5 ms in every row, so that each round starts from the same idle machine".to_owned(),
            "distlock's leader SQL by hand: release (one commit, which hands the lock to the queued follower and notifies it), the resignation's pg_notify, the follower's inspect and the term's pg_notify, prepared; hand-off only: the follower stops at the notification".to_owned(),
            "not pinned to one CPU: the follower is parked in a task of its own, as in handoff".to_owned(),
            "rt/handover: round trips of every connection from the start of the resignation until both it and the campaign returned, counted in a pass of its own through a proxy (the floor: release, resignation's pg_notify, inspect, term's pg_notify)".to_owned(),
        ],
        rows,
        references: 2,
        targets: vec![Target::ratio(
            "distlock hand-over p50 <= 1.10x its own leader SQL by hand",
            DISTLOCK,
            "handover p50 us",
            SAME_SQL,
            Check::AtMost(1.10),
        )],
    })
}
