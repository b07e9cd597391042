//! A periodic job that runs once per period across all replicas.
//!
//! Three replicas (each with its own `LockManager`, as separate machines would
//! have) fire the same job on the same schedule, but their clocks disagree by
//! up to 120 ms, longer than the job takes. `wait = "0s"` makes the losers skip
//! at once instead of queueing up, and `min_hold = "250ms"` keeps the lock
//! taken for 250 ms after the winner took it, however fast the job: the replica
//! whose clock fires late still finds it taken, and does not run the job again.
//! (`min_hold` must be longer than the replicas' disagreement and shorter than
//! the period.)
//!
//! ```sh
//! cargo run --example scheduled_job
//! ```

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager};

struct Replica {
    name: &'static str,
    locks: LockManager,
}

/// What happened in each period: who ran the job, who skipped it.
type Journal = Arc<Mutex<BTreeMap<u32, Vec<String>>>>;

/// The job: at most one replica at a time, and once per period.
#[distributed_lock(
    key = "job:nightly-report",
    lease = "10s",
    wait = "0s",
    min_hold = "250ms",
    manager = replica.locks
)]
async fn nightly_report(replica: &Replica) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_millis(40)).await; // the report itself
    Ok(())
}

async fn replica_loop(replica: Replica, periods: u32, journal: Journal) -> Result<(), LockError> {
    let start = tokio::time::Instant::now();
    for period in 1..=periods {
        // Replicas' clocks disagree: fire up to 120 ms apart, three times
        // longer than the job takes.
        let skew = Duration::from_millis(match replica.name {
            "replica-a" => 0,
            "replica-b" => 50,
            _ => 120,
        });
        tokio::time::sleep_until(start + Duration::from_millis(400) * period + skew).await;
        let what = match nightly_report(&replica).await {
            Ok(()) => "ran the job",
            Err(LockError::Timeout { .. }) => "skipped: another replica has it (or just had it)",
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

    let journal = Journal::default();
    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b", "replica-c"] {
        let replica = Replica {
            name,
            locks: LockManager::builder(&url)
                .key_prefix(format!("{}locks:", support::PREFIX))
                .build()
                .await?,
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
