use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

// Every mistake in one attribute is reported together.
#[rustfmt::skip]
#[distributed_lock(key = "order:{ordr}", leese = "30s", wait = "0.1us", renew = 1, on_lost = "stop")]
async fn many(order_id: u64) -> Result<u64, AppError> {
    Ok(order_id)
}

fn main() {}
