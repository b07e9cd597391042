use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", renew = "yes")]
async fn renew_string() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = 42)]
async fn key_number() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", lease = 30)]
async fn lease_number() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", guard = "lock")]
async fn guard_string() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", on_lost = abort)]
async fn on_lost_ident() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", manager = "redis://localhost")]
async fn manager_url() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", renew)]
async fn flag_without_value() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
