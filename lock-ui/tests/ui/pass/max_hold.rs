// `max_hold` as a literal (also shorter than the lease: it only caps the hold)
// and as an expression of type `std::time::Duration`.
use std::time::Duration;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

const LIMIT: Duration = Duration::from_secs(600);

#[distributed_lock(key = "import:{feed}", lease = "30s", max_hold = "10m")]
async fn literal(feed: &str) -> Result<(), AppError> {
    let _ = feed;
    Ok(())
}

#[distributed_lock(key = "k", lease = "30s", max_hold = "5s")]
async fn below_the_lease() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", max_hold = LIMIT / 2, wait = "0s")]
async fn expression() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k:{id}", max_hold = limit)]
async fn from_param(id: u8, limit: Duration) -> Result<Duration, AppError> {
    let _ = id;
    Ok(limit)
}

fn main() {
    drop(literal("feed"));
    drop(below_the_lease());
    drop(expression());
    drop(from_param(1, LIMIT));
}
