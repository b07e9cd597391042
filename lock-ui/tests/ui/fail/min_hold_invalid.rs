use std::time::Duration;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", min_hold = "0s")]
async fn zero() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", min_hold = "30 parsecs")]
async fn bad_unit() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", min_hold = "30")]
async fn no_unit() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", min_hold = 30)]
async fn bare_number() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", min_hold = "31days")]
async fn too_long() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", min_hold = Duration::from_secs(1).as_secs())]
async fn expression_of_wrong_type() -> Result<(), AppError> {
    Ok(())
}

// ShedLock's name and the other synonyms people reach for.
#[distributed_lock(key = "k", lock_at_least_for = "30s")]
async fn shedlock_name() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", hold_at_least = "30s")]
async fn hold_at_least() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", min_duration = "30s")]
async fn min_duration() -> Result<(), AppError> {
    Ok(())
}

// Held at least longer than at most.
#[distributed_lock(key = "k", max_hold = "1m", min_hold = "2m")]
async fn above_max_hold() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
