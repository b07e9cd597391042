// `permits = N`: `LockManager::semaphore(manager, key, N)`, giving the ordinary
// `LockRequest` and `LockGuard`. N is an integer literal (1 to `u32::MAX`) or
// an expression of type `u32`.
use distlock::{distributed_lock, LockError, LockGuard, LockManager};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

const SLOTS: u32 = 8;

#[distributed_lock(key = "exports", permits = 3)]
async fn export() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "api:{tenant}", permits = 1, wait = "0s", guard = slot)]
async fn one(tenant: &str) -> Result<u64, AppError> {
    let _: &LockGuard = slot;
    let _ = tenant;
    Ok(slot.fencing_token().await?)
}

#[distributed_lock(key = "k", permits = 4_294_967_295u32)]
async fn most() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", permits = 0x10)]
async fn hex() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "k", permits = SLOTS * 2)]
async fn constant() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "jobs:{kind}", permits = limit, lease = "1m")]
async fn from_param(kind: &str, limit: u32) -> Result<u32, AppError> {
    let _ = kind;
    Ok(limit)
}

pub struct Pool {
    locks: LockManager,
    size: u32,
}

impl Pool {
    #[distributed_lock(key = "pool", permits = self.size, manager = self.locks, on_lost = "ignore")]
    async fn enter(&self) -> Result<(), AppError> {
        Ok(())
    }
}

fn assert_send<T: Send>(_: T) {}

fn exercise(manager: LockManager) {
    assert_send(export());
    assert_send(one("t"));
    assert_send(most());
    assert_send(hex());
    assert_send(constant());
    assert_send(from_param("k", 2));
    let pool = Pool {
        locks: manager,
        size: 4,
    };
    assert_send(pool.enter());
}

fn main() {
    let _: fn(LockManager) = exercise;
}
