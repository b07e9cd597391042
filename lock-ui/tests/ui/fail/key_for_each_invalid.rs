use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

// A placeholder may name a parameter or a name bound by the element's `for`;
// the bindings are suggested first.
#[distributed_lock(key = ["order:{id}", "sku:{skuu}" for sku in skus])]
async fn typo(id: u64, skus: Vec<String>) -> Result<usize, AppError> {
    Ok(skus.len() + id as usize)
}

// A template that uses none of the loop's names gives one key for every item.
#[distributed_lock(key = "order:{id}" for sku in skus)]
async fn unused(id: u64, skus: Vec<String>) -> Result<usize, AppError> {
    Ok(skus.len() + id as usize)
}

#[distributed_lock(key = ["sku" for _ in skus])]
async fn binds_nothing(skus: Vec<String>) -> Result<usize, AppError> {
    Ok(skus.len())
}

// The template before `for` must be a string literal.
#[distributed_lock(key = sku for sku in skus)]
async fn not_a_template(skus: Vec<String>) -> Result<usize, AppError> {
    Ok(skus.len())
}

fn main() {}
