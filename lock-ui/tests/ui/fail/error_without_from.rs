use distlock::distributed_lock;

#[derive(Debug)]
pub struct PlainError;

pub type PlainResult<T> = Result<T, PlainError>;

#[distributed_lock(key = "k")]
async fn no_from_impl() -> Result<(), PlainError> {
    Ok(())
}

// Through an alias the error type is not visible to the macro; rustc still
// points at the return type.
#[distributed_lock(key = "k")]
async fn through_alias() -> PlainResult<()> {
    Ok(())
}

fn main() {}
