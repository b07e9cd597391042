//! Scenario `handoff`: 16 tasks contend for one key with an empty body.
//!
//! Hand-off latency runs from the moment the holder starts its release to the
//! moment another task holds the lock (a holder that takes the lock again
//! itself is a re-grab, counted apart). Wait is the time one acquire call
//! takes, per task.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock::{LockGuard, LockManager};
use hdrhistogram::Histogram;

use crate::error::Result;
use crate::floor::{Floor, Names};
use crate::redis_stats::Delta;
use crate::report::{new_histogram, us, Better, Check, Row, ScenarioResult, Target};
use crate::rng::Rng;
use crate::scenarios::common::{manager, nanos, Env, Kind, LEASE, LEASE_MS};

const TASKS: usize = 16;
const KEY: &str = "bench:handoff";
/// The floor with waiters in a FIFO queue that keeps their place: what the
/// runtime would do with the proposed fairness fix.
const FIFO_LABEL: &str = "floor + FIFO wait queue (fix sketch)";

#[derive(Clone)]
enum Imp {
    Floor(Floor, Arc<Names>),
    FloorFifo(Floor, Arc<Names>),
    Distlock(LockManager),
    Rslock(rslock::LockManager),
}

enum Held {
    Floor(String),
    Distlock(LockGuard),
    Rslock(rslock::Lock),
}

impl Imp {
    async fn acquire(&self, rng: &mut Rng) -> Result<Held> {
        Ok(match self {
            Imp::Floor(floor, names) => {
                let owner = rng.hex32();
                floor.acquire(names, &owner, LEASE_MS).await?;
                Held::Floor(owner)
            }
            Imp::FloorFifo(floor, names) => {
                let owner = rng.hex32();
                floor.acquire_fifo(names, &owner, LEASE_MS).await?;
                Held::Floor(owner)
            }
            Imp::Distlock(m) => Held::Distlock(m.lock(KEY).lease(LEASE).acquire().await?),
            Imp::Rslock(m) => Held::Rslock(m.acquire_no_guard(KEY, LEASE).await?),
        })
    }

    async fn release(&self, held: Held) -> Result<()> {
        match (self, held) {
            (Imp::Floor(floor, names) | Imp::FloorFifo(floor, names), Held::Floor(owner)) => {
                floor.release(names, &owner).await?;
            }
            (Imp::Distlock(_), Held::Distlock(g)) => g.release().await?,
            (Imp::Rslock(m), Held::Rslock(lock)) => m.unlock(&lock).await,
            _ => crate::error::bail!("handoff: a lock released by the wrong implementation"),
        }
        Ok(())
    }
}

/// Who released last, and when the release started.
type LastRelease = Arc<Mutex<Option<(Instant, usize)>>>;

struct TaskStats {
    waits: Histogram<u64>,
    /// Waits of acquisitions that took the lock from another task.
    contended: Histogram<u64>,
    handoffs: Histogram<u64>,
    /// Hand-offs to this task completed before the deadline.
    handoffs_in_time: u64,
    regrabs: u64,
}

#[derive(Default)]
struct Totals {
    acquisitions: u64,
    seconds: f64,
    redis: Delta,
    regrabs: u64,
    handoffs_in_time: u64,
    /// Per task, over all rounds.
    waits: Vec<Option<Histogram<u64>>>,
    handoffs: Option<Histogram<u64>>,
    contended: Option<Histogram<u64>>,
}

async fn round(
    env: &Env,
    imp: &Imp,
    duration: Duration,
    seed: u64,
) -> Result<(Vec<TaskStats>, u64, f64, Delta)> {
    let last: LastRelease = Arc::default();
    let before = env.snapshot().await?;
    let started = Instant::now();
    let deadline = started + duration;
    let mut handles = Vec::new();
    for me in 0..TASKS {
        let imp = imp.clone();
        let last = last.clone();
        handles.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed * 100 + me as u64);
            let mut s = TaskStats {
                waits: new_histogram()?,
                contended: new_histogram()?,
                handoffs: new_histogram()?,
                handoffs_in_time: 0,
                regrabs: 0,
            };
            let mut in_time = 0u64;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let held = imp.acquire(&mut rng).await?;
                let t1 = Instant::now();
                s.waits.saturating_record(nanos(t1 - t0));
                if t1 < deadline {
                    in_time += 1;
                }
                {
                    let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                    match *last {
                        Some((_, who)) if who == me => s.regrabs += 1,
                        Some((at, _)) => {
                            s.handoffs.saturating_record(nanos(t1 - at));
                            s.contended.saturating_record(nanos(t1 - t0));
                            if t1 < deadline {
                                s.handoffs_in_time += 1;
                            }
                        }
                        None => {}
                    }
                    // The body is empty: the release starts now.
                    *last = Some((Instant::now(), me));
                }
                imp.release(held).await?;
            }
            Ok::<_, crate::error::BoxError>((s, in_time))
        }));
    }
    let mut stats = Vec::new();
    let mut acquisitions = 0;
    for h in handles {
        let (s, n) = h.await??;
        stats.push(s);
        acquisitions += n;
    }
    let redis = before.delta(&env.snapshot().await?);
    Ok((stats, acquisitions, duration.as_secs_f64(), redis))
}

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    let (rounds, slice, warm) = if env.quick {
        (1, Duration::from_millis(200), Duration::from_millis(50))
    } else {
        (3, Duration::from_secs(1), Duration::from_millis(300))
    };
    let floor = Floor::connect(&env.url).await?;
    let names = Arc::new(Names::new("floor:", KEY));
    let _subscription = floor
        .subscribe(&env.url, std::slice::from_ref(&names.channel), None)
        .await?;
    // The FIFO sketch on a connection and key of its own.
    let fifo_floor = Floor::connect(&env.url).await?;
    let fifo_names = Arc::new(Names::new("fifo:", KEY));
    let _fifo_subscription = fifo_floor
        .subscribe(&env.url, std::slice::from_ref(&fifo_names.channel), None)
        .await?;
    let imps = [
        Imp::Floor(floor, names),
        Imp::Distlock(manager(&env.url).await?),
        Imp::Rslock(rslock::LockManager::new(vec![env.url.clone()])),
        Imp::FloorFifo(fifo_floor, fifo_names),
    ];
    let labels = [
        Kind::Floor.label(),
        Kind::Distlock.label(),
        Kind::Rslock.label(),
        FIFO_LABEL,
    ];
    let mut totals: Vec<Totals> = labels
        .iter()
        .map(|_| Totals {
            waits: (0..TASKS).map(|_| None).collect(),
            ..Totals::default()
        })
        .collect();
    for (i, imp) in imps.iter().enumerate() {
        round(env, imp, warm, 1000 + i as u64).await?;
    }
    for r in 0..rounds {
        for k in 0..imps.len() {
            let i = (k + r) % imps.len();
            let (stats, n, secs, redis) = round(env, &imps[i], slice, (r * 10 + i) as u64).await?;
            let t = &mut totals[i];
            t.acquisitions += n;
            t.seconds += secs;
            t.redis += redis;
            for (task, s) in stats.into_iter().enumerate() {
                t.regrabs += s.regrabs;
                t.handoffs_in_time += s.handoffs_in_time;
                match &mut t.waits[task] {
                    Some(h) => h.add(&s.waits)?,
                    slot => *slot = Some(s.waits),
                }
                match &mut t.handoffs {
                    Some(h) => h.add(&s.handoffs)?,
                    slot => *slot = Some(s.handoffs),
                }
                match &mut t.contended {
                    Some(h) => h.add(&s.contended)?,
                    slot => *slot = Some(s.contended),
                }
            }
        }
    }

    let mut rows = Vec::new();
    for (label, t) in labels.iter().zip(totals) {
        let handoffs = match t.handoffs {
            Some(h) => h,
            None => new_histogram()?,
        };
        let contended = match t.contended {
            Some(h) => h,
            None => new_histogram()?,
        };
        let waits: Vec<Histogram<u64>> = t.waits.into_iter().flatten().collect();
        let mut all_waits = new_histogram()?;
        for w in &waits {
            all_waits.add(w)?;
        }
        let acquired_total = all_waits.len();
        let mut row = Row::standard(
            *label,
            t.acquisitions,
            t.seconds,
            handoffs.clone(),
            t.redis,
            None,
        );
        // Per acquisition, not per hand-off: re-grabs are acquisitions too.
        let per_acq = |x: f64| x / t.acquisitions.max(1) as f64;
        for m in &mut row.metrics {
            match m.name {
                "cmds/op" => m.value = per_acq(t.redis.commands as f64),
                "evalsha/op" => m.value = per_acq(t.redis.scripts as f64),
                "redis cpu us/op" => m.value = per_acq(t.redis.cpu_seconds * 1e6),
                "client cpu us/op" => m.value = per_acq(t.redis.client_cpu_seconds * 1e6),
                _ => {}
            }
        }
        let worst_p99 = waits
            .iter()
            .map(|w| w.value_at_quantile(0.99))
            .max()
            .unwrap_or(0);
        let max_wait = all_waits.max();
        let mean_wait = all_waits.mean();
        let mean_contended = contended.mean();
        let per_task: Vec<u64> = waits.iter().map(Histogram::len).collect();
        row.push(
            "handoffs/s",
            t.handoffs_in_time as f64 / t.seconds,
            Better::Higher,
        )
        .push(
            "regrab %",
            100.0 * t.regrabs as f64 / acquired_total.max(1) as f64,
            Better::Lower,
        )
        .push(
            "contended wait p99 us",
            us(contended.value_at_quantile(0.99)),
            Better::Lower,
        )
        .push("wait p99 us (worst task)", us(worst_p99), Better::Lower)
        .push("wait max us", us(max_wait), Better::Lower)
        .push("wait mean us", mean_wait / 1000.0, Better::Lower)
        .push(
            "contended wait mean us",
            mean_contended / 1000.0,
            Better::Lower,
        )
        .push(
            "max/mean wait",
            max_wait as f64 / mean_wait.max(1.0),
            Better::Lower,
        )
        .push(
            "max/mean contended wait",
            contended.max() as f64 / mean_contended.max(1.0),
            Better::Lower,
        )
        .push(
            "acq/task min",
            per_task.iter().copied().min().unwrap_or(0) as f64,
            Better::Higher,
        )
        .push(
            "acq/task max",
            per_task.iter().copied().max().unwrap_or(0) as f64,
            Better::Neutral,
        );
        rows.push(row);
    }
    let f = Kind::Floor.label();
    let d = Kind::Distlock.label();
    let p = Kind::Rslock.label();
    Ok(ScenarioResult {
        name: "handoff",
        title: format!("{TASKS} tasks loop acquire / empty body / release on one key; latency = release start -> another task holds the lock"),
        notes: vec![
            "ops/s counts acquisitions (re-grabs included); handoffs/s only passes to another task; per-op server figures are per acquisition".to_owned(),
            "the floor wakes the longest-waiting task on each release message, like distlock; rslock retries SET NX after random 0-200 ms sleeps".to_owned(),
        ],
        rows,
        targets: vec![
            Target::ratio("distlock hand-off p50 <= 1.3x the pub/sub floor", d, "p50 us", f, Check::AtMost(1.3)),
            Target::times_better(
                "distlock p99 wait (contended acquisitions) >= 5x better than rslock",
                d,
                "contended wait p99 us",
                p,
                Check::AtLeast(5.0),
            ),

            Target::absolute(
                "distlock max wait <= 20x mean wait, contended (no starvation)",
                d,
                "max/mean contended wait",
                Check::AtMost(20.0),
            ),
            Target::absolute(
                "distlock max wait <= 20x mean wait, all acquisitions",
                d,
                "max/mean wait",
                Check::AtMost(20.0),
            ),
        ],
    })
}
