use distlock::{distributed_lock, LockError};

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

// An empty list names no lock: reported on the brackets.
#[distributed_lock(key = [])]
async fn empty() -> Result<(), AppError> {
    Ok(())
}

// Every element is checked as a single key is, each reported on its literal:
// an unknown placeholder, a template that does not parse, a non-literal, a
// duplicate; the valid elements are still checked.
#[rustfmt::skip]
#[distributed_lock(key = ["order:{id}", "user:{usr.id}", "shard:{id", order_id, "order:{id}"])]
async fn elements(id: u64, user: &User) -> Result<u64, AppError> {
    Ok(id + user.id)
}

fn main() {}
