// Generics, lifetimes, where-clauses, `impl Trait` arguments and generic
// error types.
use std::fmt::Display;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

#[distributed_lock(key = "item:{id}")]
async fn generic<T: Display + Send>(id: T) -> Result<String, AppError> {
    Ok(id.to_string())
}

#[distributed_lock(key = "item:{name}")]
async fn borrowed<'a, 'b: 'a>(name: &'a str, rest: &'b [u8]) -> Result<&'a str, AppError> {
    let _ = rest.len();
    Ok(name)
}

#[distributed_lock(key = "item:{id}")]
async fn with_where<T, E>(id: T) -> Result<T, E>
where
    T: Display + Clone + Send,
    E: From<LockError>,
{
    Ok(id.clone())
}

#[distributed_lock(key = "item:{id}")]
async fn impl_arg(id: impl Display, items: impl IntoIterator<Item = u8>) -> Result<u32, AppError> {
    Ok(items.into_iter().map(u32::from).sum())
}

#[distributed_lock(key = "item:{id}")]
async fn const_generic<const N: usize>(id: u8, buf: [u8; N]) -> Result<usize, AppError> {
    Ok(buf.len() + usize::from(id))
}

pub struct Repo<T> {
    name: T,
}

impl<T: Display + Sync> Repo<T> {
    #[distributed_lock(key = "repo:{self.name}:{key}")]
    async fn get<'k, K>(&self, key: &'k K) -> Result<&'k K, AppError>
    where
        K: Display + Sync + ?Sized,
    {
        Ok(key)
    }
}

// `impl Trait` in the return type of the body's `Result`.
#[distributed_lock(key = "display")]
async fn impl_return() -> Result<impl Display, AppError> {
    Ok(5)
}

fn main() {
    drop(generic(1));
    drop(borrowed("a", &[]));
    drop(with_where::<u8, AppError>(1));
    drop(impl_arg("x", vec![1, 2]));
    drop(const_generic(1, [0u8; 4]));
    let repo = Repo { name: "r" };
    drop(repo.get("k"));
    drop(impl_return());
}
