use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

pub struct Order {
    pub id: u64,
    pub tags: Vec<String>,
}

#[distributed_lock(key = "order:{order.number}")]
async fn missing_field(order: &Order) -> Result<(), AppError> {
    let _ = order;
    Ok(())
}

#[distributed_lock(key = "order:{order.tags}")]
async fn not_display(order: &Order) -> Result<(), AppError> {
    let _ = order;
    Ok(())
}

fn main() {}
