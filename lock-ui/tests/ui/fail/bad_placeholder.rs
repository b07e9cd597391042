use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:{}")]
async fn empty_placeholder(order_id: u64) -> Result<u64, AppError> {
    Ok(order_id)
}

#[distributed_lock(key = "order:{order_id:>8}")]
async fn format_spec(order_id: u64) -> Result<u64, AppError> {
    Ok(order_id)
}

#[distributed_lock(key = "order:{order-id}")]
async fn not_an_ident(order_id: u64) -> Result<u64, AppError> {
    Ok(order_id)
}

fn main() {}
