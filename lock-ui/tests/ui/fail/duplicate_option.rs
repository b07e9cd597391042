use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "a", lease = "10s", key = "b")]
async fn twice() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
