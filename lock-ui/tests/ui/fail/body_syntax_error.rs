// A syntax error in the body is reported by rustc alone, at the error: the
// attribute locks a body it cannot parse as raw tokens, without adding an
// error of its own (which would wrongly say it is not on an `async fn`).
use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k:{id}")]
async fn f(id: u64) -> Result<(), AppError> {
    let x = ;
    Ok(())
}

fn main() {}
