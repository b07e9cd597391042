// `?`, `return`, `.into()` and `Default::default()` in the body infer exactly
// as in an unannotated function; error types by alias, generic or boxed.
use std::num::ParseIntError;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub enum AppError {
    Lock(LockError),
    Parse(ParseIntError),
    Other(String),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<ParseIntError> for AppError {
    fn from(e: ParseIntError) -> Self {
        AppError::Parse(e)
    }
}

impl From<&str> for AppError {
    fn from(e: &str) -> Self {
        AppError::Other(e.to_owned())
    }
}

pub type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "parse:{input}")]
async fn question_mark(input: &str) -> Result<u64, AppError> {
    let n: u64 = input.parse()?;
    if n == 0 {
        return Err("zero".into());
    }
    if n == 1 {
        return Ok(Default::default());
    }
    let doubled = Ok::<u64, ParseIntError>(n * 2)?;
    Ok(doubled)
}

// A one-parameter alias: the error type is inferred.
#[distributed_lock(key = "parse:{input}")]
async fn alias(input: &str) -> AppResult<u64> {
    Ok(input.parse()?)
}

#[distributed_lock(key = "parse:{input}")]
async fn boxed(input: &str) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    Ok(input.parse::<u64>()?)
}

#[distributed_lock(key = "parse:{input}")]
async fn lock_error(input: &str) -> Result<u64, LockError> {
    Ok(input.len() as u64)
}

#[distributed_lock(key = "parse:{input}")]
async fn fully_qualified(input: &str) -> ::core::result::Result<u64, AppError> {
    let n = input.parse::<u64>().map_err(AppError::from)?;
    Ok(n)
}

// `std::io::Result`: an alias whose error, `std::io::Error`, is built from a
// `LockError` by the runtime's `From`.
#[distributed_lock(key = "parse:{input}")]
async fn io_result(input: &str) -> std::io::Result<u64> {
    input.parse().map_err(std::io::Error::other)
}

// Nested async blocks and closures keep their own `?` scopes.
#[distributed_lock(key = "parse:{input}")]
async fn nested(input: &str) -> Result<u64, AppError> {
    let inner = async { input.parse::<u64>() };
    let parse = |s: &str| -> Result<u64, ParseIntError> { s.parse() };
    Ok(inner.await? + parse("1")?)
}

fn main() {
    drop(question_mark("1"));
    drop(alias("1"));
    drop(boxed("1"));
    drop(lock_error("1"));
    drop(fully_qualified("1"));
    drop(nested("1"));
    drop(io_result("1"));
}
