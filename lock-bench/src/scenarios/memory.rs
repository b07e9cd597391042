//! Scenario `memory`: what one held lock costs, in the client and in Redis.
//!
//! One distlock manager takes `--locks N` locks (100,000 by default) with a
//! 10 s lease and renewal on, so that its renewal task holds them all, then:
//!
//! * client bytes per held lock: live heap bytes of the bench process (a
//!   counting `#[global_allocator]`) after acquiring minus before, over N. It
//!   **includes** the key string (the bench hands `format!("mem:{i}")` to the
//!   library, which keeps it), the `LockGuard` itself (in a `Vec` sized
//!   exactly N) and whatever the runtime keeps per lock (renewal entry, Redis
//!   names, owner token).
//! * Redis bytes per held lock: `MEMORY USAGE` of a sample of lock keys and of
//!   their fencing counters, and the `INFO memory` `used_memory` delta over N.

use std::time::Duration;

use distlock::{LockGuard, LockManager};

use crate::alloc_count::live_bytes;
use crate::error::{bail, BoxError, Result};
use crate::floor::Names;
use crate::redis_stats::used_memory;
use crate::report::{Better, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::Env;

const TASKS: usize = 64;
const LEASE: Duration = Duration::from_secs(10);
const SAMPLE: usize = 100;
const LABEL: &str = "distlock";

fn key(i: usize) -> String {
    format!("mem:{i}")
}

/// `MEMORY USAGE` of `name` (0 when the key does not exist).
async fn memory_usage(env: &Env, name: &str) -> Result<u64> {
    let mut conn = env.stats[0].clone();
    let bytes: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(name)
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut conn)
        .await?;
    Ok(bytes.unwrap_or(0))
}

async fn take_all(manager: &LockManager, n: usize) -> Result<Vec<LockGuard>> {
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let m = manager.clone();
        handles.push(tokio::spawn(async move {
            let mut held = Vec::with_capacity(n / TASKS + 1);
            for i in (t..n).step_by(TASKS) {
                match m.lock(key(i)).try_acquire().await? {
                    Some(g) => held.push(g),
                    None => bail!("distlock: {} was busy", key(i)),
                }
            }
            Ok::<_, BoxError>(held)
        }));
    }
    let mut guards = Vec::with_capacity(n);
    for h in handles {
        guards.extend(h.await??);
    }
    Ok(guards)
}

/// Releases `guards` from [`TASKS`] tasks at once; a lost lease's error is
/// ignored (the callers count lost leases before).
pub(super) async fn release_all(guards: Vec<LockGuard>) -> Result<()> {
    let mut chunks: Vec<Vec<LockGuard>> = (0..TASKS).map(|_| Vec::new()).collect();
    for (i, g) in guards.into_iter().enumerate() {
        chunks[i % TASKS].push(g);
    }
    let mut handles = Vec::new();
    for chunk in chunks {
        handles.push(tokio::spawn(async move {
            for g in chunk {
                // A lost lease reports Lost here; it is counted before.
                let _ = g.release().await;
            }
        }));
    }
    for h in handles {
        h.await?;
    }
    Ok(())
}

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    let n = env
        .locks
        .unwrap_or(if env.quick { 1_000 } else { 100_000 })
        .max(1);
    let manager = LockManager::builder(&env.url)
        .direct_lane(crate::scenarios::common::direct_lane())
        .default_lease(LEASE)
        .build()
        .await?;
    // Warm-up: connections, scripts, the renewal task, buffers.
    let warm = take_all(&manager, TASKS * 4).await?;
    release_all(warm).await?;
    env.flush().await?;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut stats = env.stats[0].clone();
    let redis_before = used_memory(&mut stats).await?;
    let before = live_bytes();
    let guards = take_all(&manager, n).await?;
    // Let replies in flight and tasks finish settling.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = live_bytes();
    let redis_after = used_memory(&mut stats).await?;
    if manager.held_count() != n {
        bail!(
            "distlock holds {} locks, expected {n}",
            manager.held_count()
        );
    }

    let mut lock_bytes = 0;
    let mut fence_bytes = 0;
    let step = (n / SAMPLE).max(1);
    let sampled: Vec<usize> = (0..n).step_by(step).take(SAMPLE).collect();
    for &i in &sampled {
        let names = Names::new(manager.key_prefix(), &key(i));
        lock_bytes += memory_usage(env, &names.lock).await?;
        fence_bytes += memory_usage(env, &names.fence).await?;
    }
    let per_sample = |b: u64| b as f64 / sampled.len() as f64;
    let key_len =
        (0..n).step_by(step).map(|i| key(i).len()).sum::<usize>() as f64 / sampled.len() as f64;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    release_all(guards).await?;
    env.flush().await?;

    let mut row = Row::new(LABEL);
    row.push("locks", n as f64, Better::Neutral)
        .push(
            "client B/lock",
            (after - before) as f64 / n as f64,
            Better::Lower,
        )
        .push("key B/lock", key_len, Better::Neutral)
        .push(
            "guard B (size_of)",
            std::mem::size_of::<LockGuard>() as f64,
            Better::Neutral,
        )
        .push(
            "redis used_memory B/lock",
            (redis_after as f64 - redis_before as f64) / n as f64,
            Better::Lower,
        )
        .push(
            "redis MEMORY USAGE lock key B",
            per_sample(lock_bytes),
            Better::Lower,
        )
        .push(
            "redis MEMORY USAGE fence key B",
            per_sample(fence_bytes),
            Better::Lower,
        )
        .push("lost", lost as f64, Better::Lower);
    Ok(ScenarioResult {
        name: "memory",
        title: format!(
            "{n} locks held by one manager, lease {LEASE:?} with renewal on; bytes per held lock"
        ),
        notes: vec![
            "client B/lock: live heap bytes of the bench process (counting global allocator) after acquiring minus before, over the lock count; includes the key string, the LockGuard (in a Vec sized exactly to the count) and the runtime's per-lock state; excludes allocator overhead per block".to_owned(),
            format!("redis MEMORY USAGE: mean over {} sampled locks (SAMPLES 0); a held lock is its lock key plus its fencing counter; used_memory B/lock is the INFO memory delta over the count", sampled.len()),
        ],
        rows: vec![row],
        references: 0,
        targets: vec![Target::absolute(
            "distlock client memory < 1 KiB per held lock",
            LABEL,
            "client B/lock",
            Check::AtMost(1023.0),
        )],
    })
}
