use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

// The default lock is fair already: there is no `fair` option.
#[distributed_lock(key = "k", fair = true)]
async fn fair() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
