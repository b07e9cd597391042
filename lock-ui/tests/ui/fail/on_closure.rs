use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[allow(unused_variables)]
fn main_like() {
    let reserve = #[distributed_lock(key = "k")]
    async || -> Result<(), AppError> { Ok(()) };
}

fn main() {}
