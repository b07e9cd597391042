// `fair = true`: `LockManager::fair_lock(manager, key)`, giving the ordinary
// `LockRequest` and `LockGuard`; `fair = false` is the default lock.
use distlock::{distributed_lock, LockError, LockGuard, LockManager};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "queue:{name}", fair = true)]
async fn take_turn(name: &str) -> Result<(), AppError> {
    let _ = name;
    Ok(())
}

#[distributed_lock(fair = true, key = "queue", lease = "5s", wait = "1m", guard = turn, manager = manager)]
async fn with_options(manager: &LockManager) -> Result<u64, AppError> {
    let _: &LockGuard = turn;
    Ok(turn.fencing_token().await?)
}

#[distributed_lock(key = "queue", fair = false)]
async fn unfair() -> Result<(), AppError> {
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn exercise(manager: LockManager) {
    assert_send(take_turn("q"));
    assert_send(with_options(&manager));
    assert_send(unfair());
}

fn main() {
    let _: fn(LockManager) = exercise;
}
