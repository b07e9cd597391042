//! A periodic job that runs once per period across all replicas.
//!
//! Three replicas (each with its own `LockManager`, as separate machines would
//! have) fire the same job on the same schedule. `wait = "0s"` makes the losers
//! skip at once instead of queueing up; a per-period marker written under the
//! lock covers the replica whose clock fires late, after the winner finished.
//!
//! ```sh
//! cargo run --example scheduled_job
//! ```

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager};
use redis::AsyncCommands;

#[derive(Debug, thiserror::Error)]
enum JobError {
    #[error("lock: {0}")]
    Lock(#[from] LockError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

struct Replica {
    name: &'static str,
    locks: LockManager,
    redis: redis::aio::MultiplexedConnection,
}

/// What happened in each period: who ran the job, who skipped it.
type Journal = Arc<Mutex<BTreeMap<u32, Vec<String>>>>;

/// The job: at most one replica at a time, and once per period.
#[distributed_lock(key = "job:nightly-report", lease = "10s", wait = "0s", manager = replica.locks)]
async fn nightly_report(replica: &Replica, period: u32) -> Result<bool, JobError> {
    let mut redis = replica.redis.clone();
    let marker = format!("{}job:nightly-report:last-period", support::PREFIX);
    let last: Option<u32> = redis.get(&marker).await?;
    if last.is_some_and(|last| last >= period) {
        return Ok(false); // another replica already ran this period
    }
    tokio::time::sleep(Duration::from_millis(40)).await; // the report itself
    let () = redis.set(&marker, period).await?;
    Ok(true)
}

async fn replica_loop(replica: Replica, periods: u32, journal: Journal) -> Result<(), JobError> {
    let start = tokio::time::Instant::now();
    for period in 1..=periods {
        // Replicas' clocks disagree a little: fire a few ms apart.
        let skew = Duration::from_millis(match replica.name {
            "replica-a" => 0,
            "replica-b" => 3,
            _ => 7,
        });
        tokio::time::sleep_until(start + Duration::from_millis(200) * period + skew).await;
        let what = match nightly_report(&replica, period).await {
            Ok(true) => "ran the job".to_owned(),
            Ok(false) => "skipped: already done this period".to_owned(),
            Err(JobError::Lock(LockError::Timeout { .. })) => {
                "skipped: another replica is running it".to_owned()
            }
            Err(e) => return Err(e),
        };
        journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(period)
            .or_default()
            .push(format!("{}: {what}", replica.name));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url();
    let client = redis::Client::open(url.as_str())?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let _: () = redis
        .del(format!("{}job:nightly-report:last-period", support::PREFIX))
        .await?;

    let journal = Journal::default();
    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b", "replica-c"] {
        let replica = Replica {
            name,
            locks: LockManager::builder(&url)
                .key_prefix(format!("{}locks:", support::PREFIX))
                .build()
                .await?,
            redis: client.get_multiplexed_async_connection().await?,
        };
        replicas.push(tokio::spawn(replica_loop(replica, 5, journal.clone())));
    }
    for r in replicas {
        if let Err(e) = r.await? {
            return Err(format!("replica failed: {e}").into());
        }
    }

    let journal = journal.lock().unwrap_or_else(|e| e.into_inner());
    let mut ran_once = true;
    for (period, events) in journal.iter() {
        println!("period {period}:");
        for e in events {
            println!("  {e}");
        }
        ran_once &= events.iter().filter(|e| e.ends_with("ran the job")).count() == 1;
    }
    if ran_once {
        println!("\nThe job ran exactly once in every period.");
        Ok(())
    } else {
        Err("the job ran more or less than once in some period".into())
    }
}
