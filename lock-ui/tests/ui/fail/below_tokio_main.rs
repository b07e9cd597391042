// `#[tokio::main]` (or `#[tokio::test]`) above `#[distributed_lock]` has already
// made the function blocking when the lock attribute runs.
use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[tokio::main]
#[distributed_lock(key = "jobs:main")]
async fn main() -> Result<(), AppError> {
    Ok(())
}
