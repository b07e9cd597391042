#![deny(warnings, clippy::all)]
// The expansion triggers no rustc warning and no clippy lint in user crates,
// and the generated futures are `Send` whenever the body's future is.
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
    Invalid,
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

pub struct Orders {
    locks: LockManager,
    region: String,
}

impl Orders {
    /// Reserves stock for an order.
    #[distributed_lock(
        key = "order:{self.region}:{order_id}",
        lease = "30s",
        wait = "5s",
        renew = true,
        manager = self.locks,
        guard = lock,
        on_lost = "abort"
    )]
    pub async fn reserve(&self, order_id: u64, qty: u32) -> Result<u64, AppError> {
        if qty == 0 {
            return Err(AppError::Invalid);
        }
        Ok(lock.fencing_token().await? + order_id)
    }

    #[distributed_lock(key = "order:{order_id}", lease = Duration::from_secs(5), on_lost = "ignore")]
    pub async fn cancel(&mut self, order_id: u64) -> Result<(), AppError> {
        let _ = order_id;
        self.region.clear();
        Ok(())
    }
}

#[distributed_lock(key = "reports:daily", wait = "0s")]
pub async fn daily_report() -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock(key = "item:{id}")]
pub async fn generic<T: std::fmt::Display + Send + Sync>(id: &T) -> Result<String, AppError> {
    Ok(id.to_string())
}

fn assert_send<T: Send>(_: T) {}

fn exercise(locks: LockManager) {
    let mut orders = Orders {
        locks,
        region: String::from("eu"),
    };
    assert_send(orders.reserve(1, 1));
    assert_send(orders.cancel(1));
    assert_send(daily_report());
    assert_send(generic(&1));
}

fn main() {
    let _: fn(LockManager) = exercise;
}
