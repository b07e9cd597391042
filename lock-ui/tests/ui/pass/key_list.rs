// `key = [..]`: exclusive locks on every key, taken together with
// `LockManager::lock_all`; `guard = g` binds `&MultiLockGuard`. Static keys,
// fields, `self`, a one-element list, a trailing comma, the builder options, a
// manager, `on_lost = "ignore"` and the `crate` override.
use std::sync::Arc;
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager, MultiLockGuard};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

pub struct User {
    pub id: u64,
}

#[distributed_lock(key = ["order:{id}", "user:{user.id}"])]
async fn transfer(id: u64, user: &User) -> Result<u64, AppError> {
    Ok(id + user.id)
}

#[distributed_lock(
    key = ["ledger", "order:{id}", "pair:{pair.0}:{pair.1}",],
    lease = "30s",
    wait = "5s",
    max_hold = "10m",
    min_hold = "1s",
    renew = false,
    guard = held
)]
async fn all_options(id: u64, pair: (u8, u8)) -> Result<(), AppError> {
    let _: &MultiLockGuard = held;
    let _ = (id, pair);
    Ok(())
}

#[distributed_lock(key = ["only:{id}"], lease = LEASE, wait = Duration::from_millis(10))]
async fn one_element(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

const LEASE: Duration = Duration::from_secs(10);

pub struct Accounts {
    locks: Arc<LockManager>,
    shard: u32,
}

impl Accounts {
    #[distributed_lock(
        key = ["shard:{self.shard}", "account:{from}", "account:{to}"],
        manager = self.locks,
        on_lost = "ignore",
        guard = g
    )]
    async fn move_funds(&self, from: u64, to: u64) -> Result<bool, AppError> {
        let _: &MultiLockGuard = g;
        Ok(from == to)
    }
}

mod renamed {
    pub use distlock as locks;
}

#[distributed_lock(key = ["a", "b"], crate = "crate::renamed::locks")]
async fn through_a_re_export() -> Result<(), AppError> {
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn exercise(manager: LockManager) {
    let user = User { id: 1 };
    assert_send(transfer(1, &user));
    assert_send(all_options(1, (2, 3)));
    assert_send(one_element(1));
    let accounts = Accounts {
        locks: Arc::new(manager),
        shard: 0,
    };
    assert_send(accounts.move_funds(1, 2));
    assert_send(through_a_re_export());
}

fn main() {
    let _: fn(LockManager) = exercise;
}
