use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", lease = "30")]
async fn no_unit() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", lease = "soon")]
async fn unparsable() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", lease = "0s")]
async fn zero() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", lease = "500us")]
async fn sub_millisecond() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", lease = "2ms")]
async fn too_short() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", lease = "31days")]
async fn lease_too_long() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
