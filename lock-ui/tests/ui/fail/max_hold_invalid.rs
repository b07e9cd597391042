use std::time::Duration;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", max_hold = "10")]
async fn no_unit() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", max_hold = "ten minutes")]
async fn unparsable() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", max_hold = "0s")]
async fn zero() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", max_hold = "500us")]
async fn sub_millisecond() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", max_hold = "31days")]
async fn too_long() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", max_hold = 600)]
async fn bare_number() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", max_hold = 600u32)]
async fn wrong_type() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", max_hold = Duration::from_secs(1).as_secs())]
async fn expression_of_wrong_type() -> Result<(), AppError> {
    Ok(())
}

// Every mistake at once, and the synonym people reach for.
#[rustfmt::skip]
#[distributed_lock(key = "k", lease = "0s", max_hold = "0s", max_duration = "10m")]
async fn together() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
