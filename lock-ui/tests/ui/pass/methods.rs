// Methods taking `&self`, `&mut self` and `self`; keys reading fields of
// `self` and of parameters.
use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(e)
    }
}

pub struct Customer {
    pub id: u32,
}

pub struct Order {
    pub id: u64,
    pub customer: Customer,
    pub pair: (u8, u8),
}

pub struct Service {
    shard: u16,
    processed: u64,
}

impl Service {
    #[distributed_lock(
        key = "shard:{self.shard}:order:{order.id}:{order.customer.id}:{order.pair.1}"
    )]
    async fn by_ref(&self, order: &Order) -> Result<u16, AppError> {
        Ok(self.shard + u16::from(order.pair.0))
    }

    #[distributed_lock(key = "shard:{self.shard}")]
    async fn by_mut(&mut self, n: u64) -> Result<u64, AppError> {
        self.processed += n;
        Ok(self.processed)
    }

    #[distributed_lock(key = "shard:{self.shard}")]
    async fn by_value(self) -> Result<Service, AppError> {
        Ok(self)
    }

    #[distributed_lock(key = "shard:{self.shard}")]
    async fn boxed(self: Box<Self>) -> Result<u16, AppError> {
        Ok(self.shard)
    }

    // `mut` parameters stay mutable in the body.
    #[distributed_lock(key = "count:{count}")]
    async fn mut_param(&self, mut count: u32) -> Result<u32, AppError> {
        count += 1;
        Ok(count)
    }
}

fn main() {
    let mut service = Service {
        shard: 1,
        processed: 0,
    };
    let order = Order {
        id: 1,
        customer: Customer { id: 2 },
        pair: (3, 4),
    };
    drop(service.by_ref(&order));
    drop(service.by_mut(1));
    drop(service.mut_param(1));
    drop(
        Box::new(Service {
            shard: 2,
            processed: 0,
        })
        .boxed(),
    );
    drop(service.by_value());
}
