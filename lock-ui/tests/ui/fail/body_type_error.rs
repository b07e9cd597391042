// Mistakes in the body are reported exactly as without the attribute.
use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "order:{order_id}")]
async fn wrong_ok_type(order_id: u64) -> Result<u32, AppError> {
    if order_id == 0 {
        return Ok("none");
    }
    Ok(order_id)
}

#[distributed_lock(key = "order:{order_id}")]
async fn unconvertible_question_mark(order_id: &str) -> Result<u32, AppError> {
    let n: u32 = order_id.parse()?;
    Ok(n)
}

fn main() {}
