//! Scenario `many-keys`: 64 tasks, each cycling acquire+release, on distinct
//! keys (no contention) and on keys drawn from a Zipf law over 1,000 keys
//! (hot keys contend, and waiters are woken by the releases).

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::LockManager;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};

use crate::error::{self, Result};
use crate::floor::{Floor, Names, Subscription};
use crate::redis_stats::Delta;
use crate::report::{new_histogram, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::{manager, nanos, owner_token, Cycler, Env, Kind, LEASE, LEASE_MS};

const TASKS: usize = 64;
const ZIPF_KEYS: usize = 1_000;
const ZIPF_S: f64 = 0.99;

/// One task's cycle: a fixed key, or a Zipf-drawn one.
enum Worker {
    Fixed(Cycler),
    Zipf(ZipfWorker),
}

struct ZipfWorker {
    imp: ZipfImpl,
    /// Ranks 1..=ZIPF_KEYS (rand_distr draws them as floats).
    zipf: Zipf<f64>,
    rng: SmallRng,
    tokens: fastrand::Rng,
}

/// The probability of the hottest key (rank 1) under Zipf(`s`) over `n` keys.
fn hottest(n: usize, s: f64) -> f64 {
    1.0 / (1..=n).map(|k| (k as f64).powf(-s)).sum::<f64>()
}

#[derive(Clone)]
enum ZipfImpl {
    Floor(Floor, Arc<Vec<Names>>),
    Distlock(LockManager),
    Rslock(rslock::LockManager),
}

impl Worker {
    async fn cycle(&mut self) -> Result<()> {
        match self {
            Worker::Fixed(c) => c.cycle().await,
            Worker::Zipf(w) => {
                let k = (w.zipf.sample(&mut w.rng) as usize).clamp(1, ZIPF_KEYS) - 1;
                match &w.imp {
                    ZipfImpl::Floor(floor, names) => {
                        let owner = owner_token(&mut w.tokens);
                        if floor.acquire(&names[k], &owner, LEASE_MS).await? {
                            floor.release(&names[k], &owner).await?;
                        } else {
                            floor.release_unwaited(&names[k], &owner).await?;
                        }
                    }
                    ZipfImpl::Distlock(m) => {
                        let g = m.lock(format!("zipf:{k}")).lease(LEASE).acquire().await?;
                        g.release().await?;
                    }
                    ZipfImpl::Rslock(m) => {
                        let lock = m
                            .acquire_no_guard(format!("zipf:{k}").as_str(), LEASE)
                            .await?;
                        m.unlock(&lock).await;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Runs every worker in a task of its own until `duration` has passed; gives the
/// workers back for the next round.
async fn round(
    env: &Env,
    workers: Vec<Worker>,
    duration: Duration,
) -> Result<(Vec<Worker>, u64, f64, Histogram<u64>, Delta)> {
    let before = env.snapshot().await?;
    let started = Instant::now();
    let deadline = started + duration;
    let mut handles = Vec::new();
    for mut w in workers {
        handles.push(tokio::spawn(async move {
            let mut hist = new_histogram()?;
            let mut n = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                w.cycle().await?;
                hist.saturating_record(nanos(t.elapsed()));
                n += 1;
            }
            Ok::<_, crate::error::BoxError>((w, n, hist))
        }));
    }
    let mut workers = Vec::new();
    let mut ops = 0;
    let mut hist = new_histogram()?;
    for h in handles {
        let (w, n, h) = h.await??;
        workers.push(w);
        ops += n;
        hist.add(h)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let redis = before.delta(&env.snapshot().await?);
    Ok((workers, ops, seconds, hist, redis))
}

struct Totals {
    ops: u64,
    seconds: f64,
    hist: Histogram<u64>,
    redis: Delta,
}

/// Alternates rounds of each implementation; the first round of each is a warm-up.
async fn measure(env: &Env, mut sets: Vec<Vec<Worker>>) -> Result<Vec<Totals>> {
    let (rounds, slice, warm) = if env.quick {
        (1, Duration::from_millis(200), Duration::from_millis(50))
    } else {
        (4, Duration::from_millis(750), Duration::from_millis(250))
    };
    let mut totals = Vec::new();
    for set in &mut sets {
        let (w, ..) = round(env, std::mem::take(set), warm).await?;
        *set = w;
        totals.push(Totals {
            ops: 0,
            seconds: 0.0,
            hist: new_histogram()?,
            redis: Delta::default(),
        });
    }
    for r in 0..rounds {
        for k in 0..sets.len() {
            let i = (k + r) % sets.len();
            let (w, ops, seconds, hist, redis) =
                round(env, std::mem::take(&mut sets[i]), slice).await?;
            sets[i] = w;
            let t = &mut totals[i];
            t.ops += ops;
            t.seconds += seconds;
            t.hist.add(hist)?;
            t.redis += redis;
        }
    }
    Ok(totals)
}

pub async fn run(env: &Env) -> Result<Vec<ScenarioResult>> {
    let cluster = env.is_cluster();
    // rslock has no Redis Cluster support.
    let kinds: &[Kind] = if cluster {
        &[
            Kind::Floor,
            Kind::Minimal,
            Kind::Distlock,
            Kind::DistlockEager,
        ]
    } else {
        &[
            Kind::Floor,
            Kind::Minimal,
            Kind::Distlock,
            Kind::DistlockEager,
            Kind::Rslock,
        ]
    };
    let d = Kind::Distlock.label();
    let f = env.label(Kind::Floor);
    let p = Kind::Rslock.label();
    // Single server: against rslock; cluster: against the cluster floor.
    let target = |text_single: &str| {
        if cluster {
            Target::ratio(
                "distlock cycles/s >= 0.9x cluster floor",
                d,
                "ops/s",
                f,
                Check::AtLeast(0.9),
            )
        } else {
            Target::ratio(text_single, d, "ops/s", p, Check::AtLeast(1.0))
        }
    };
    let on = if cluster {
        "; on a 3-master Redis Cluster"
    } else {
        ""
    };
    let cluster_note = "cluster: the floors send the same commands over one connection per master, routed by a slot map read once (as distlock routes); server figures are summed over the 3 masters; no rslock row (no Redis Cluster support)".to_owned();

    // Distinct keys: one connection (one manager) per implementation, 64 tasks on it.
    env.flush().await?;
    let mut sets = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let base = Cycler::connect(*kind, &env.target, "many:base", i as u64).await?;
        sets.push(
            (0..TASKS)
                .map(|t| Worker::Fixed(base.fork(&format!("many:{t}"), (i * 1000 + t) as u64)))
                .collect(),
        );
    }
    let totals = measure(env, sets).await?;
    let rows = kinds
        .iter()
        .zip(totals)
        .map(|(k, t)| Row::standard(env.label(*k), t.ops, t.seconds, t.hist, t.redis, None))
        .collect();
    let mut notes = vec![
        format!("{f}: distlock's Lua scripts by hand; minimal floor: SET NX PX + compare-and-delete script"),
        "rt/op is not reported: 64 tasks share one connection, so their requests overlap".to_owned(),
    ];
    if cluster {
        notes.push(cluster_note.clone());
    }
    let distinct = ScenarioResult {
        name: env.name("many-keys", "many-keys-cluster"),
        title: format!("{TASKS} tasks on distinct keys, one connection per implementation; latency is one acquire+release cycle{on}"),
        notes,
        rows,
        references: 2,
        targets: if cluster {
            vec![target("distlock cycles/s >= rslock's")]
        } else {
            vec![
                target("distlock cycles/s >= rslock's"),
                Target::ratio(
                    "distlock Redis CPU/cycle <= 1.10x rslock's",
                    d,
                    "redis cpu us/op",
                    p,
                    Check::AtMost(1.10),
                ),
            ]
        },
    };

    let mut distinct = distinct;
    if env.tls {
        // The TLS pass's floor target: the same scripts over the same TLS.
        distinct.targets.push(Target::ratio(
            "distlock cycles/s >= 1/1.05 of the same-scripts floor's (TLS)",
            d,
            "ops/s",
            f,
            Check::AtLeast(1.0 / 1.05),
        ));
    }

    // Zipf over 1,000 keys: hot keys contend.
    env.flush().await?;
    let zipf =
        Zipf::new(ZIPF_KEYS as f64, ZIPF_S).map_err(|e| error::BenchError(format!("Zipf: {e}")))?;
    let names: Arc<Vec<Names>> = Arc::new(
        (0..ZIPF_KEYS)
            .map(|k| Names::new("floor:", &format!("zipf:{k}")))
            .collect(),
    );
    let floor = Floor::connect(&env.target).await?;
    let channels: Vec<String> = names.iter().map(|n| n.channel.clone()).collect();
    // On a cluster, one subscriber on the first node hears every node's PUBLISH.
    let _subscription: Subscription = floor.subscribe(&env.url, &channels, None).await?;
    let mut imps = vec![
        ZipfImpl::Floor(floor, names),
        ZipfImpl::Distlock(manager(&env.target).await?),
    ];
    let mut zipf_kinds = vec![Kind::Floor, Kind::Distlock];
    if !cluster {
        imps.push(ZipfImpl::Rslock(crate::scenarios::common::rslock_manager(
            &env.url,
        )?));
        zipf_kinds.push(Kind::Rslock);
    }
    let sets = imps
        .iter()
        .enumerate()
        .map(|(i, imp)| {
            (0..TASKS)
                .map(|t| {
                    Worker::Zipf(ZipfWorker {
                        imp: imp.clone(),
                        zipf,
                        rng: SmallRng::seed_from_u64((i * 1000 + t) as u64),
                        tokens: fastrand::Rng::with_seed((i * 1000 + t) as u64),
                    })
                })
                .collect()
        })
        .collect();
    let totals = measure(env, sets).await?;
    let rows = zipf_kinds
        .iter()
        .zip(totals)
        .map(|(k, t)| Row::standard(env.label(*k), t.ops, t.seconds, t.hist, t.redis, None))
        .collect();
    let mut notes = vec![
        "the floor subscribes to all 1,000 wake-up channels before measuring (no subscribe cost, but every release is delivered); distlock subscribes on demand".to_owned(),
        "no minimal-floor row here: SET NX PX has no wake-up, so it has no waiting to compare with".to_owned(),
    ];
    if cluster {
        notes.push(cluster_note);
    } else {
        notes.push(
            "rslock waits by retrying SET NX after a random 0-200 ms sleep (its defaults)"
                .to_owned(),
        );
    }
    let skewed = ScenarioResult {
        name: env.name("many-keys-zipf", "many-keys-zipf-cluster"),
        title: format!(
            "{TASKS} tasks, each cycle on a key drawn from Zipf(s={ZIPF_S}) over {ZIPF_KEYS} keys (hottest key {:.1}% of draws); latency includes waiting{on}",
            hottest(ZIPF_KEYS, ZIPF_S) * 100.0
        ),
        notes,
        rows,
        references: 1,
        targets: vec![target("distlock cycles/s >= rslock's")],
    };
    Ok(vec![distinct, skewed])
}
