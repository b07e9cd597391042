use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", leese = "30s")]
async fn typo() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", timeout = "5s")]
async fn alias() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", retries = 3)]
async fn unrelated() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
