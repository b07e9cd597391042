// `mode = "read"` / `"write"`: `LockManager::read_lock` / `write_lock`, giving
// the ordinary `LockRequest` and `LockGuard`; `"exclusive"` is the default lock.
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockGuard, LockManager};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "catalog:{id}", mode = "read")]
async fn show(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(
    mode = "write",
    key = "catalog:{id}",
    lease = "30s",
    wait = Duration::from_secs(5),
    max_hold = "1m",
    min_hold = "10ms",
    renew = false,
    guard = lock
)]
async fn edit(id: u64) -> Result<u64, AppError> {
    let _: &LockGuard = lock;
    Ok(lock.fencing_token().await? + id)
}

#[distributed_lock(key = "catalog", mode = "exclusive", on_lost = "ignore", guard = lock)]
async fn rebuild() -> Result<bool, AppError> {
    Ok(lock.is_lost())
}

pub struct Catalog {
    locks: LockManager,
}

impl Catalog {
    #[distributed_lock(key = "catalog:{id}", mode = "read", manager = self.locks, crate = "::distlock")]
    async fn get(&self, id: u64) -> Result<u64, AppError> {
        Ok(id)
    }
}

fn assert_send<T: Send>(_: T) {}

fn exercise(manager: LockManager) {
    assert_send(show(1));
    assert_send(edit(1));
    assert_send(rebuild());
    let catalog = Catalog { locks: manager };
    assert_send(catalog.get(1));
}

fn main() {
    let _: fn(LockManager) = exercise;
}
