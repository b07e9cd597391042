use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", mode = "raed")]
async fn typo() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", mode = "shared")]
async fn other_name() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", mode = "sometimes")]
async fn unknown() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", mode = read)]
async fn not_a_string() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", read = true)]
async fn option_name() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
