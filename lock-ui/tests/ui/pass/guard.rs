// `guard = IDENT` binds `&LockGuard` in the body, also with `on_lost = "ignore"`.
use distlock::{distributed_lock, LockError, LockGuard};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

fn write_with_token(token: u64) -> u64 {
    token
}

#[distributed_lock(key = "file:{name}", guard = lock)]
async fn fenced(name: &str) -> Result<u64, AppError> {
    let _ = name;
    let _: &LockGuard = lock;
    let _: &str = lock.key();
    Ok(write_with_token(lock.fencing_token().await?))
}

#[distributed_lock(key = "file:{name}", guard = hold, on_lost = "ignore")]
async fn checks_itself(name: &str) -> Result<bool, AppError> {
    let _ = name;
    Ok(hold.is_lost())
}

#[distributed_lock(key = "file:{name}", on_lost = "abort")]
async fn explicit_abort(name: &str) -> Result<(), AppError> {
    let _ = name;
    Ok(())
}

fn main() {
    drop(fenced("a"));
    drop(checks_itself("a"));
    drop(explicit_abort("a"));
}
