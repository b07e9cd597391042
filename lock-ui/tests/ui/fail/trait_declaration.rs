use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[allow(dead_code)]
trait Inventory {
    #[distributed_lock(key = "sku:{sku}")]
    async fn reserve(&self, sku: &str) -> Result<u32, AppError>;
}

fn main() {}
