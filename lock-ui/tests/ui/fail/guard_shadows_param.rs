use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:{order_id}", guard = order_id)]
async fn shadow(order_id: u64) -> Result<u64, AppError> {
    Ok(order_id)
}

fn main() {}
