// `manager = EXPR`: a field, a reference, an `Arc`, a function call returning
// an owned manager, evaluated per call.
use std::sync::{Arc, LazyLock, OnceLock};

use distlock::{distributed_lock, LockError, LockManager};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

static LOCKS: OnceLock<LockManager> = OnceLock::new();

fn locks() -> &'static LockManager {
    LOCKS.get().expect("set at startup")
}

fn fresh_manager() -> LockManager {
    locks().clone()
}

pub struct Service {
    locks: LockManager,
    shared: Arc<LockManager>,
    by_ref: &'static LockManager,
}

impl Service {
    #[distributed_lock(key = "a:{id}", manager = self.locks)]
    async fn field(&self, id: u32) -> Result<(), AppError> {
        let _ = id;
        Ok(())
    }

    #[distributed_lock(key = "a:{id}", manager = self.shared)]
    async fn arc(&self, id: u32) -> Result<(), AppError> {
        let _ = id;
        Ok(())
    }

    #[distributed_lock(key = "a:{id}", manager = self.by_ref)]
    async fn reference(&self, id: u32) -> Result<(), AppError> {
        let _ = id;
        Ok(())
    }

    #[distributed_lock(key = "a", manager = self.shared.clone())]
    async fn cloned(self) -> Result<Self, AppError> {
        Ok(self)
    }
}

#[distributed_lock(key = "b:{id}", manager = locks())]
async fn global(id: u32) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

// A `LazyLock` static, dereferenced as the docs and the macro's hint say.
static LAZY: LazyLock<LockManager> = LazyLock::new(fresh_manager);

#[distributed_lock(key = "b:{id}", manager = &*LAZY)]
async fn lazy(id: u32) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key = "b:{id}", manager = fresh_manager())]
async fn owned(id: u32) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

// The manager may also come from a parameter.
#[distributed_lock(key = "c:{id}", manager = manager)]
async fn param(manager: &LockManager, id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[distributed_lock(key = "c:{id}", manager = &manager)]
async fn param_owned(manager: LockManager, id: u32) -> Result<LockManager, AppError> {
    let _ = id;
    Ok(manager)
}

fn assert_send<T: Send>(_: T) {}

fn exercise(manager: LockManager) {
    let s = Service {
        locks: manager.clone(),
        shared: Arc::new(manager),
        by_ref: locks(),
    };
    assert_send(s.field(1));
    assert_send(s.arc(1));
    assert_send(s.reference(1));
    assert_send(s.cloned());
    assert_send(global(1));
    assert_send(owned(1));
    assert_send(param(locks(), 1));
    assert_send(param_owned(fresh_manager(), 1));
}

fn main() {
    let _: fn(LockManager) = exercise;
}
