//! Code written as a user of distlock would write it: a function that runs under a
//! distributed lock. Its test (in `tests/`) runs it against a private `redis-server`.

use std::sync::atomic::{AtomicU32, Ordering};

use distlock::{distributed_lock, LockError, LockManager};

/// The error of [`run_job`].
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The lock could not be taken.
    #[error("lock: {0}")]
    Lock(#[from] LockError),
}

/// Runs job `id` under the lock `job:{id}`, counting runs in `runs`, and returns `id * 2`.
#[distributed_lock(key = "job:{id}", manager = locks)]
pub async fn run_job(locks: &LockManager, id: u64, runs: &AtomicU32) -> Result<u64, JobError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id * 2)
}
