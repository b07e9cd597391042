// Visibility, doc comments, other outer attributes and inner attributes are
// kept.
#![allow(clippy::needless_return)]

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

mod jobs {
    use super::*;

    /// Documented, crate-visible, `#[must_use]` and `#[inline]`.
    ///
    /// # Errors
    /// When the lock cannot be taken.
    #[must_use = "the lock is only taken when awaited"]
    #[inline]
    #[distributed_lock(key = "job:{id}")]
    pub(crate) async fn run(id: u32) -> Result<u32, AppError> {
        #![allow(unused_variables)]
        let unused = 1;
        return Ok(id);
    }

    #[distributed_lock(key = "job:{id}")]
    #[cfg_attr(test, allow(dead_code))]
    pub async fn public(id: u32) -> Result<u32, AppError> {
        Ok(id)
    }

    #[distributed_lock(key = "job:{id}")]
    pub(super) async fn in_super(id: u32) -> Result<u32, AppError> {
        Ok(id)
    }

    #[distributed_lock(key = "job:{id}")]
    pub(in crate::jobs) async fn in_path(id: u32) -> Result<u32, AppError> {
        Ok(id)
    }

    pub fn use_in_path() {
        drop(in_path(1));
    }

    /// Unsafe async fns keep their `unsafe`.
    ///
    /// # Safety
    /// None needed; this only checks the expansion.
    #[distributed_lock(key = "job:{id}")]
    pub async unsafe fn unsafe_fn(id: u32) -> Result<u32, AppError> {
        Ok(id)
    }
}

fn main() {
    drop(jobs::run(1));
    drop(jobs::public(1));
    drop(jobs::in_super(1));
    jobs::use_in_path();
    drop(unsafe { jobs::unsafe_fn(1) });
}
