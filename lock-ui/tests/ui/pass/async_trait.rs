// `#[async_trait]` on the impl, `#[distributed_lock]` on the method: parameters
// used only by the key, `{self.field}` keys, and `?Send` all compile cleanly.
#![deny(warnings, clippy::all)]

use distlock::{distributed_lock, LockError, LockManager};

pub struct Shop {
    locks: LockManager,
    name: String,
}

#[async_trait::async_trait]
pub trait Orders {
    async fn ship(&self, order_id: u64, qty: u32) -> Result<u32, LockError>;
    async fn close(self: Box<Self>, day: u32) -> Result<(), LockError>;
}

#[async_trait::async_trait]
impl Orders for Shop {
    #[distributed_lock(key = "{self.name}:order:{order_id}", manager = self.locks)]
    async fn ship(&self, order_id: u64, qty: u32) -> Result<u32, LockError> {
        Ok(qty)
    }

    #[distributed_lock(key = "{self.name}:day:{day}", manager = self.locks.clone())]
    async fn close(self: Box<Self>, day: u32) -> Result<(), LockError> {
        drop(self);
        Ok(())
    }
}

#[async_trait::async_trait(?Send)]
pub trait Local {
    async fn touch(&self, id: u8) -> Result<(), LockError>;
}

#[async_trait::async_trait(?Send)]
impl Local for Shop {
    #[distributed_lock(key = "touch:{id}", manager = self.locks)]
    async fn touch(&self, id: u8) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {}
