use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", fair = "yes")]
async fn string() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", fair = 1)]
async fn number() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", fair)]
async fn flag() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
