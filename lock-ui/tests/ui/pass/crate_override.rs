// `crate = "path"` when the facade is renamed or re-exported.
extern crate distlock as my_locks;

mod infra {
    pub use my_locks::*;
}

use my_locks::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "k", crate = "::my_locks")]
async fn renamed() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", crate = "crate::infra", guard = g)]
async fn reexported() -> Result<u64, AppError> {
    Ok(g.fencing_token().await?)
}

fn main() {
    drop(renamed());
    drop(reexported());
}
