use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:{order}")]
async fn typo(order_id: u64, user: &str) -> Result<u64, AppError> {
    let _ = user;
    Ok(order_id)
}

#[distributed_lock(key = "order:{tenant}:{id}")]
async fn unrelated(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = "order:{id}")]
async fn no_params() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
