use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "")]
async fn empty(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
