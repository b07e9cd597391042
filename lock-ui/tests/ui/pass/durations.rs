// `lease`/`wait` as expressions of type `std::time::Duration`.
use std::time::Duration;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

const LEASE: Duration = Duration::from_secs(10);

pub struct Config {
    lease: Duration,
    wait: Duration,
}

#[distributed_lock(key = "k", lease = Duration::from_secs(30), wait = Duration::ZERO)]
async fn calls() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", lease = LEASE, wait = LEASE / 2)]
async fn consts() -> Result<(), AppError> {
    Ok(())
}

impl Config {
    #[distributed_lock(key = "k", lease = self.lease, wait = self.wait)]
    async fn fields(&self) -> Result<(), AppError> {
        Ok(())
    }
}

#[distributed_lock(key = "k:{id}", lease = lease, wait = "2s")]
async fn from_param(id: u8, lease: Duration) -> Result<Duration, AppError> {
    let _ = id;
    Ok(lease)
}

fn main() {
    drop(calls());
    drop(consts());
    let c = Config {
        lease: LEASE,
        wait: LEASE,
    };
    drop(c.fields());
    drop(from_param(1, LEASE));
}
