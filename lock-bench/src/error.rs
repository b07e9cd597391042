//! The bench's error type: any error, boxed, with a message where context helps.

use std::fmt;

/// Every fallible path of the bench returns this.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
pub type Result<T> = std::result::Result<T, BoxError>;

/// An error with a message of our own (bad arguments, a failed check).
#[derive(Debug)]
pub struct BenchError(pub String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

/// `Err(BenchError)` from a format string.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::BoxError::from($crate::error::BenchError(format!($($arg)*))))
    };
}
pub(crate) use bail;

/// Wraps an error with what was being done.
pub fn context<E: fmt::Display>(what: &str) -> impl FnOnce(E) -> BoxError + '_ {
    move |e| Box::new(BenchError(format!("{what}: {e}")))
}
