use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", on_lost = "abrt")]
async fn typo() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", on_lost = "retry")]
async fn unsupported() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
