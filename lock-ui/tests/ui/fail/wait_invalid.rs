use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", wait = "5 seconds please")]
async fn unparsable() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", wait = "250us")]
async fn sub_millisecond() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", wait = "31days")]
async fn wait_too_long() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
