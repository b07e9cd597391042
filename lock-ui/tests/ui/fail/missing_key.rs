use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock]
async fn no_args(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(lease = "30s")]
async fn no_key(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
