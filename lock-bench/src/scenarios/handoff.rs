//! Scenario `handoff`: one key passed from holder to waiter.
//!
//! * **true hand-off floor**: [`FLOOR_CLIENTS`] clients, each with its own
//!   connection and its own pub/sub connection subscribed before the
//!   measurement, strictly alternating: client `i` acquires only after the
//!   wake-up message of client `i - 1`'s release has reached it (every client
//!   counts the messages of the channel; all see them in the same order). So
//!   every acquisition is a hand-off to another connection, by construction:
//!   the least time a hand-off through these scripts and pub/sub can take.
//! * **distlock**: [`TASKS`] tasks loop acquire / empty body / release on one
//!   key, spread over [`MANAGERS`] `LockManager`s (each its own connections and
//!   subscriber), as processes of one service would be, and over
//!   [`FOUR_MANAGERS`]: waiters queue in Redis and each release hands the lock
//!   to the head of the queue (no acquire round trip).
//! * **rslock**: the same, on [`MANAGERS`] rslock managers (single server only:
//!   rslock has no Redis Cluster support).
//!
//! On a Redlock (`--backend redlock`) there is no floor and no peer: distlock
//! on one of the members (`builder`) is the reference row, interleaved with
//! distlock on all five (`redlock_builder`), the same tasks and managers.
//!
//! On a cluster (`--backend cluster`) the floor sends its scripts over one
//! connection per master (`floor::ClusterConns`) and subscribes on the first node (a classic
//! `PUBLISH` on any node reaches it); distlock's managers are built with
//! `cluster_builder`.
//!
//! Hand-off latency runs from the moment the holder starts its release to the
//! moment another task holds the lock. A holder that takes the lock again
//! itself is a re-grab: counted apart, never as a hand-off. Wait is the time
//! one acquire call takes (the floor: from the end of the client's previous
//! release to holding).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::{LockGuard, LockManager};
use hdrhistogram::Histogram;
use tokio::sync::watch;

use crate::error::{bail, BoxError, Result};
use crate::floor::{Attempt, Floor, Names};
use crate::redis_stats::Delta;
use crate::report::{new_histogram, us, Better, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::{manager, nanos, owner_token, Env, LEASE, LEASE_MS};

const TASKS: usize = 16;
const MANAGERS: usize = 2;
const FOUR_MANAGERS: usize = 4;
const FLOOR_CLIENTS: usize = 2;
const KEY: &str = "bench:handoff";

const FLOOR_LABEL: &str = "true hand-off floor (same scripts, 2 clients alternating)";
const CLUSTER_FLOOR_LABEL: &str =
    "true hand-off cluster floor (same scripts, 2 clients alternating)";
const DISTLOCK_LABEL: &str = "distlock (16 tasks, 2 managers)";
const DISTLOCK_FOUR_LABEL: &str = "distlock (16 tasks, 4 managers)";
const RSLOCK_LABEL: &str = "rslock 0.10 (16 tasks, 2 managers)";
const SINGLE_NODE_LABEL: &str = "distlock single-node (member 1; 16 tasks, 2 managers)";
const REDLOCK_LABEL: &str = "distlock Redlock (5 members; 16 tasks, 2 managers)";

#[derive(Clone)]
enum Imp {
    Distlock(Vec<LockManager>),
    Rslock(Vec<rslock::LockManager>),
}

enum Held {
    Distlock(LockGuard),
    Rslock(rslock::Lock),
}

impl Imp {
    async fn acquire(&self, me: usize) -> Result<Held> {
        Ok(match self {
            Imp::Distlock(m) => {
                Held::Distlock(m[me % m.len()].lock(KEY).lease(LEASE).acquire().await?)
            }
            Imp::Rslock(m) => Held::Rslock(m[me % m.len()].acquire_no_guard(KEY, LEASE).await?),
        })
    }

    async fn release(&self, me: usize, held: Held) -> Result<()> {
        match (self, held) {
            (Imp::Distlock(_), Held::Distlock(g)) => g.release().await?,
            (Imp::Rslock(m), Held::Rslock(lock)) => m[me % m.len()].unlock(&lock).await,
            _ => bail!("handoff: a lock released by the wrong implementation"),
        }
        Ok(())
    }
}

/// Who released last (task, manager or client), and when the release started.
type LastRelease = Arc<Mutex<Option<(Instant, usize, usize)>>>;

/// One task's (or floor client's) figures in one round.
struct TaskStats {
    waits: Histogram<u64>,
    handoffs: Histogram<u64>,
    /// Acquisitions completed before the deadline (re-grabs included).
    acquired_in_time: u64,
    /// Hand-offs to this task completed before the deadline.
    handoffs_in_time: u64,
    /// Hand-offs to this task from a task of another manager (client).
    cross: u64,
    regrabs: u64,
    /// Floor only: acquire attempts that found the lock busy (0 by construction).
    busy: u64,
}

impl TaskStats {
    fn new() -> Result<TaskStats> {
        Ok(TaskStats {
            waits: new_histogram()?,
            handoffs: new_histogram()?,
            acquired_in_time: 0,
            handoffs_in_time: 0,
            cross: 0,
            regrabs: 0,
            busy: 0,
        })
    }

    /// Records an acquisition at `t1` that waited since `t0`, by `me` of
    /// `group`, and marks the release that starts now.
    fn acquired(
        &mut self,
        last: &LastRelease,
        me: usize,
        group: usize,
        t0: Instant,
        t1: Instant,
        deadline: Instant,
    ) {
        self.waits.saturating_record(nanos(t1 - t0));
        let in_time = t1 < deadline;
        if in_time {
            self.acquired_in_time += 1;
        }
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        match *last {
            Some((_, who, _)) if who == me => self.regrabs += 1,
            Some((at, _, from)) => {
                self.handoffs.saturating_record(nanos(t1 - at));
                if in_time {
                    self.handoffs_in_time += 1;
                }
                if from != group {
                    self.cross += 1;
                }
            }
            None => {}
        }
        // The body is empty: the release starts now.
        *last = Some((Instant::now(), me, group));
    }
}

struct Round {
    stats: Vec<TaskStats>,
    seconds: f64,
    redis: Delta,
}

/// distlock or rslock: every task loops acquire / release until the deadline.
async fn library_round(env: &Env, imp: &Imp, duration: Duration) -> Result<Round> {
    let last: LastRelease = Arc::default();
    let groups = match imp {
        Imp::Distlock(m) => m.len(),
        Imp::Rslock(m) => m.len(),
    };
    let before = env.snapshot().await?;
    let started = Instant::now();
    let deadline = started + duration;
    let mut handles = Vec::new();
    for me in 0..TASKS {
        let imp = imp.clone();
        let last = last.clone();
        handles.push(tokio::spawn(async move {
            let mut s = TaskStats::new()?;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let held = imp.acquire(me).await?;
                s.acquired(&last, me, me % groups, t0, Instant::now(), deadline);
                imp.release(me, held).await?;
            }
            Ok::<_, BoxError>(s)
        }));
    }
    let mut stats = Vec::new();
    for h in handles {
        stats.push(h.await??);
    }
    let seconds = started.elapsed().as_secs_f64();
    let redis = before.delta(&env.snapshot().await?);
    Ok(Round {
        stats,
        seconds,
        redis,
    })
}

/// The true hand-off floor: [`FLOOR_CLIENTS`] clients strictly alternating.
async fn floor_round(env: &Env, duration: Duration) -> Result<Round> {
    let names = Arc::new(Names::new("floor:", KEY));
    let mut clients = Vec::new();
    for _ in 0..FLOOR_CLIENTS {
        let floor = Floor::connect(&env.target).await?;
        let (sub, rx) = Floor::subscribe_counted(&env.url, &names.channel).await?;
        clients.push((floor, sub, rx));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let last: LastRelease = Arc::default();
    let before = env.snapshot().await?;
    let started = Instant::now();
    let deadline = started + duration;
    let mut handles = Vec::new();
    for (me, (floor, sub, mut rx)) in clients.into_iter().enumerate() {
        let (names, last, stop_tx, mut stop_rx) = (
            names.clone(),
            last.clone(),
            stop_tx.clone(),
            stop_rx.clone(),
        );
        let stop_on_error = stop_tx.clone();
        let client = async move {
            let _sub = sub;
            let mut s = TaskStats::new()?;
            let mut rng = fastrand::Rng::with_seed(me as u64);
            // Messages seen; message m (from 1) is the wake-up of release m,
            // made by client (m - 1) % FLOOR_CLIENTS.
            let mut seen = 0usize;
            let previous = (me + FLOOR_CLIENTS - 1) % FLOOR_CLIENTS;
            let mut first = me == 0;
            let mut t0 = Instant::now();
            loop {
                if !first {
                    // Wait for the wake-up of the previous client's release.
                    loop {
                        tokio::select! {
                            m = rx.recv() => {
                                if m.is_none() {
                                    bail!("floor: the pub/sub connection closed");
                                }
                                seen += 1;
                                if (seen - 1) % FLOOR_CLIENTS == previous {
                                    break;
                                }
                            }
                            _ = stop_rx.changed() => return Ok(s),
                        }
                    }
                }
                first = false;
                let owner = owner_token(&mut rng);
                loop {
                    // The other client waits for this hold's release: it is
                    // marked, as a woken distlock waiter marks its own hold.
                    match floor.try_acquire(&names, &owner, LEASE_MS, true).await? {
                        Attempt::Acquired => break,
                        Attempt::Busy(_) => {
                            s.busy += 1;
                            tokio::task::yield_now().await;
                        }
                    }
                }
                let t1 = Instant::now();
                s.acquired(&last, me, me, t0, t1, deadline);
                let done = t1 >= deadline;
                if done {
                    let _ = stop_tx.send(true);
                }
                floor.release(&names, &owner).await?;
                if done {
                    return Ok(s);
                }
                t0 = Instant::now();
            }
        };
        handles.push(tokio::spawn(async move {
            let result: Result<TaskStats> = client.await;
            if result.is_err() {
                // The other client would wait for a wake-up that never comes.
                let _ = stop_on_error.send(true);
            }
            result
        }));
    }
    let mut stats = Vec::new();
    for h in handles {
        stats.push(h.await??);
    }
    let seconds = started.elapsed().as_secs_f64();
    let redis = before.delta(&env.snapshot().await?);
    // No lock left for the next round.
    env.flush().await?;
    Ok(Round {
        stats,
        seconds,
        redis,
    })
}

#[derive(Default)]
struct Totals {
    seconds: f64,
    redis: Delta,
    /// Per task, over all rounds.
    tasks: Vec<Option<TaskStats>>,
}

impl Totals {
    fn add(&mut self, r: Round) -> Result<()> {
        self.seconds += r.seconds;
        self.redis += r.redis;
        if self.tasks.len() < r.stats.len() {
            self.tasks.resize_with(r.stats.len(), || None);
        }
        for (slot, s) in self.tasks.iter_mut().zip(r.stats) {
            match slot {
                Some(t) => {
                    t.waits.add(&s.waits)?;
                    t.handoffs.add(&s.handoffs)?;
                    t.acquired_in_time += s.acquired_in_time;
                    t.handoffs_in_time += s.handoffs_in_time;
                    t.cross += s.cross;
                    t.regrabs += s.regrabs;
                    t.busy += s.busy;
                }
                None => *slot = Some(s),
            }
        }
        Ok(())
    }

    fn row(self, label: &str) -> Result<Row> {
        let tasks: Vec<TaskStats> = self.tasks.into_iter().flatten().collect();
        let mut waits = new_histogram()?;
        let mut handoffs = new_histogram()?;
        let (mut acquired, mut passed, mut cross, mut regrabs, mut busy) = (0, 0, 0, 0, 0);
        for t in &tasks {
            waits.add(&t.waits)?;
            handoffs.add(&t.handoffs)?;
            acquired += t.acquired_in_time;
            passed += t.handoffs_in_time;
            cross += t.cross;
            regrabs += t.regrabs;
            busy += t.busy;
        }
        let all = waits.len().max(1) as f64;
        let per_acq = |x: f64| x / acquired.max(1) as f64;
        let per_task: Vec<u64> = tasks.iter().map(|t| t.waits.len()).collect();
        let mean_per_task = per_task.iter().sum::<u64>() as f64 / per_task.len().max(1) as f64;
        let mean_wait = waits.mean();
        let mut row = Row::new(label);
        row.push(
            "handoff p50 us",
            us(handoffs.value_at_quantile(0.5)),
            Better::Lower,
        )
        .push(
            "handoff p99 us",
            us(handoffs.value_at_quantile(0.99)),
            Better::Lower,
        )
        .push("handoffs/s", passed as f64 / self.seconds, Better::Higher)
        .push("acq/s", acquired as f64 / self.seconds, Better::Higher)
        .push("regrab %", 100.0 * regrabs as f64 / all, Better::Lower)
        .push(
            "cross-mgr %",
            100.0 * cross as f64 / handoffs.len().max(1) as f64,
            Better::Neutral,
        )
        .push("busy tries/acq", busy as f64 / all, Better::Lower)
        .push(
            "wait p50 us",
            us(waits.value_at_quantile(0.5)),
            Better::Lower,
        )
        .push(
            "wait p99 us",
            us(waits.value_at_quantile(0.99)),
            Better::Lower,
        )
        .push("wait max us", us(waits.max()), Better::Lower)
        .push(
            "max/mean wait",
            waits.max() as f64 / mean_wait.max(1.0),
            Better::Lower,
        )
        .push(
            "acq/task min/mean",
            per_task.iter().copied().min().unwrap_or(0) as f64 / mean_per_task.max(1.0),
            Better::Higher,
        )
        .push(
            "cmds/acq",
            per_acq(self.redis.commands as f64),
            Better::Neutral,
        )
        .push(
            "evalsha/acq",
            per_acq(self.redis.scripts as f64),
            Better::Neutral,
        )
        .push(
            "redis cpu us/acq",
            per_acq(self.redis.cpu_seconds * 1e6),
            Better::Lower,
        )
        .push(
            "client cpu us/acq",
            per_acq(self.redis.client_cpu_seconds * 1e6),
            Better::Lower,
        );
        row.histogram = Some(handoffs);
        Ok(row)
    }
}

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    let (rounds, slice, warm) = if env.quick {
        (1, Duration::from_millis(200), Duration::from_millis(50))
    } else {
        (3, Duration::from_secs(1), Duration::from_millis(300))
    };
    if env.is_redlock() {
        return redlock(env, rounds, slice, warm).await;
    }
    let cluster = env.is_cluster();
    let mut distlock = Vec::new();
    let mut rslock = Vec::new();
    for _ in 0..MANAGERS {
        distlock.push(manager(&env.target).await?);
        if !cluster {
            rslock.push(crate::scenarios::common::rslock_manager(&env.url)?);
        }
    }
    let mut four = Vec::new();
    for _ in 0..FOUR_MANAGERS {
        four.push(manager(&env.target).await?);
    }
    let floor_label = if cluster {
        CLUSTER_FLOOR_LABEL
    } else {
        FLOOR_LABEL
    };
    let mut labels = vec![floor_label, DISTLOCK_LABEL, DISTLOCK_FOUR_LABEL];
    let mut imps = vec![Imp::Distlock(distlock), Imp::Distlock(four)];
    if !cluster {
        imps.push(Imp::Rslock(rslock));
        labels.push(RSLOCK_LABEL);
    }
    // Index 0 is the floor, then the libraries.
    let mut totals: Vec<Totals> = (0..=imps.len()).map(|_| Totals::default()).collect();
    floor_round(env, warm).await?;
    for imp in &imps {
        library_round(env, imp, warm).await?;
    }
    for r in 0..rounds {
        for k in 0..=imps.len() {
            let i = (k + r) % (imps.len() + 1);
            let round = match i {
                0 => floor_round(env, slice).await?,
                _ => library_round(env, &imps[i - 1], slice).await?,
            };
            totals[i].add(round)?;
        }
    }
    let rows = labels
        .iter()
        .zip(totals)
        .map(|(l, t)| t.row(l))
        .collect::<Result<Vec<_>>>()?;
    let mut notes = vec![
        format!("the floor: {FLOOR_CLIENTS} clients, each its own connection and pub/sub connection (subscribed before measuring), strictly alternating: a client acquires only after the wake-up of the other's release reached it, so it never re-grabs"),
        "a re-grab (the releasing task takes the lock again) is never counted as a hand-off; regrab % is per acquisition".to_owned(),
        "wait = one acquire call (floor: from the client's previous release to holding); per-acquisition server figures include re-grabs".to_owned(),
    ];
    notes.push("distlock: waiters from every manager queue in Redis in arrival order; a release hands the lock to the head of the queue and tells its manager with one message, so the new holder needs no acquire round trip (the floor does)".to_owned());
    let mut targets = Vec::new();
    for label in [DISTLOCK_LABEL, DISTLOCK_FOUR_LABEL] {
        targets.push(Target::absolute(
            &format!("{label}: 0 re-grabs"),
            label,
            "regrab %",
            Check::AtMost(0.0),
        ));
        targets.push(Target::ratio(
            &format!("{label}: hand-off p50 <= 1.0x the true hand-off floor"),
            label,
            "handoff p50 us",
            floor_label,
            Check::AtMost(1.0),
        ));
        targets.push(Target::absolute(
            &format!("{label}: max wait <= 5x the mean wait"),
            label,
            "max/mean wait",
            Check::AtMost(5.0),
        ));
        targets.push(Target::absolute(
            &format!("{label}: every task within 0.9x of the mean acquisitions"),
            label,
            "acq/task min/mean",
            Check::AtLeast(0.9),
        ));
    }
    if cluster {
        notes.push("cluster: the floor's scripts go over one connection per master, routed by a slot map read once, its pub/sub to the first node (a classic PUBLISH reaches every node); server figures are summed over the 3 masters; no rslock row (no Redis Cluster support)".to_owned());
    } else {
        notes.push(
            "rslock waits by retrying SET NX after a random 0-200 ms sleep (its defaults)"
                .to_owned(),
        );
        for label in [DISTLOCK_LABEL, DISTLOCK_FOUR_LABEL] {
            targets.push(Target::ratio(
                &format!("{label}: max wait below rslock's"),
                label,
                "wait max us",
                RSLOCK_LABEL,
                Check::Below(1.0),
            ));
        }
    }
    let libraries = if cluster {
        "distlock"
    } else {
        "distlock and rslock"
    };
    let on = if cluster {
        "; on a 3-master Redis Cluster"
    } else {
        ""
    };
    Ok(ScenarioResult {
        name: env.name("handoff", "handoff-cluster"),
        title: format!(
            "one key; hand-off = release start -> another task holds; {libraries}: {TASKS} tasks over {MANAGERS} managers loop acquire / empty body / release{on}"
        ),
        notes,
        rows,
        references: 1,
        targets,
    })
}

/// `--backend redlock`: distlock on one member, then on the Redlock of all
/// five, in alternating rounds.
async fn redlock(
    env: &Env,
    rounds: usize,
    slice: Duration,
    warm: Duration,
) -> Result<ScenarioResult> {
    let (mut single, mut redlock) = (Vec::new(), Vec::new());
    for _ in 0..MANAGERS {
        single.push(manager(&env.single_target()).await?);
        redlock.push(manager(&env.target).await?);
    }
    let imps = [Imp::Distlock(single), Imp::Distlock(redlock)];
    let mut totals: Vec<Totals> = (0..imps.len()).map(|_| Totals::default()).collect();
    for imp in &imps {
        library_round(env, imp, warm).await?;
    }
    for r in 0..rounds {
        for k in 0..imps.len() {
            let i = (k + r) % imps.len();
            totals[i].add(library_round(env, &imps[i], slice).await?)?;
        }
    }
    let rows = [SINGLE_NODE_LABEL, REDLOCK_LABEL]
        .iter()
        .zip(totals)
        .map(|(l, t)| t.row(l))
        .collect::<Result<Vec<_>>>()?;
    Ok(ScenarioResult {
        name: "handoff-redlock",
        title: format!(
            "one key; hand-off = release start -> another task holds; distlock: {TASKS} tasks over {MANAGERS} managers loop acquire / empty body / release; on a Redlock of 5 private redis-servers against distlock on one of them"
        ),
        notes: vec![
            "reference row: distlock built with LockManager::builder on member 1 of the Redlock, in alternating rounds of the same run; the Redlock row's ratios are to it".to_owned(),
            "no floor for Redlock (a by-hand Redlock hand-off floor is not written): the single-node row is the reference".to_owned(),
            "a Redlock release publishes on every member; each manager keeps a subscriber per member and wakes one waiter per release".to_owned(),
            "server figures are summed over the 5 members; per-acquisition figures include re-grabs".to_owned(),
        ],
        rows,
        references: 1,
        targets: vec![
            Target::absolute(
                "no task starved: Redlock max wait <= 20x mean wait",
                REDLOCK_LABEL,
                "max/mean wait",
                Check::AtMost(20.0),
            ),
            Target::absolute(
                "no task starved: Redlock fewest acquisitions of a task >= 0.5x the mean",
                REDLOCK_LABEL,
                "acq/task min/mean",
                Check::AtLeast(0.5),
            ),
        ],
    })
}
