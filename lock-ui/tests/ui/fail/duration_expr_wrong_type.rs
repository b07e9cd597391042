use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

const LEASE_SECS: u64 = 30;

#[distributed_lock(key = "k", lease = LEASE_SECS)]
async fn lease_u64() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
