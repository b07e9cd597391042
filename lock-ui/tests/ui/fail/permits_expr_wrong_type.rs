use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

const SLOTS: u64 = 4;

// A `permits` expression is bound to a `u32` local first: a wrong type is
// reported on the expression.
#[distributed_lock(key = "k", permits = SLOTS)]
async fn permits_u64() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
