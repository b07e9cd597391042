use distlock::distributed_lock;

#[distributed_lock(key = "k")]
pub struct Order {
    pub id: u64,
}

fn main() {}
