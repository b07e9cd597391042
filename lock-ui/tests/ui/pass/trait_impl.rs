// Methods of trait impls (native `async fn` in traits) and trait default
// methods with a body.
use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

trait Inventory {
    type Error: From<LockError>;

    async fn reserve(&self, sku: &str, qty: u32) -> Result<u32, Self::Error>;

    #[distributed_lock(key = "inventory:audit:{who}")]
    async fn audit(&self, who: &str) -> Result<(), Self::Error> {
        let _ = who;
        Ok(())
    }
}

pub struct Warehouse {
    id: u16,
}

impl Inventory for Warehouse {
    type Error = AppError;

    #[distributed_lock(key = "warehouse:{self.id}:sku:{sku}")]
    async fn reserve(&self, sku: &str, qty: u32) -> Result<u32, Self::Error> {
        Ok(qty + u32::from(self.id))
    }
}

fn main() {
    let w = Warehouse { id: 1 };
    drop(w.reserve("a", 1));
    drop(w.audit("me"));
}
