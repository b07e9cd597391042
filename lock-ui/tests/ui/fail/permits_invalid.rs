use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", permits = 0)]
async fn zero() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", permits = -2)]
async fn negative() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", permits = 4_294_967_296)]
async fn too_large() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", permits = 2.5)]
async fn fraction() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", permits = "3")]
async fn string() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", permits = 3u64)]
async fn suffix() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", semaphore = 3)]
async fn option_name() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
