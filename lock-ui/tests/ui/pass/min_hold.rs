// `min_hold` as a literal (also longer than the lease: the lock is renewed while
// held, then kept for the rest) and as an expression of type `std::time::Duration`.
use std::time::Duration;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

const PERIOD: Duration = Duration::from_secs(60);

#[distributed_lock(key = "report:{day}", min_hold = "30s", wait = "0s")]
async fn literal(day: u32) -> Result<(), AppError> {
    let _ = day;
    Ok(())
}

#[distributed_lock(key = "k", lease = "10s", min_hold = "5m", max_hold = "10m")]
async fn above_the_lease() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", min_hold = PERIOD / 2, wait = "0s")]
async fn expression() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k:{id}", min_hold = at_least)]
async fn from_param(id: u8, at_least: Duration) -> Result<Duration, AppError> {
    let _ = id;
    Ok(at_least)
}

fn main() {
    drop(literal(1));
    drop(above_the_lease());
    drop(expression());
    drop(from_param(1, PERIOD));
}
