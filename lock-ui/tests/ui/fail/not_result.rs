use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k")]
async fn returns_number() -> u64 {
    1
}

#[distributed_lock(key = "k")]
async fn returns_nothing() {}

#[distributed_lock(key = "k")]
async fn returns_option() -> Option<u64> {
    None
}

fn main() {}
