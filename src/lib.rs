//! # distlock
//!
//! Declarative distributed locks on Redis: every replica of a service, on every
//! machine, runs a locked function for one key at a time. The lease is renewed
//! while the body runs, waiters are woken by the release instead of polling,
//! re-entry from the same call chain is recognised, a lost lease is signalled to
//! the body, and every acquisition carries a fencing token that storage can use to
//! reject a stale holder.
//!
//! ```
//! use std::time::Duration;
//! use distlock::{LockError, LockManager};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let redis = distlock::testing::RedisServer::spawn()?;
//! # let url = redis.url();
//! // let url = "redis://127.0.0.1:6379";
//! let manager = LockManager::connect(&url).await?;
//!
//! let guard = manager
//!     .lock("order:42")
//!     .lease(Duration::from_secs(5))
//!     .wait(Duration::from_secs(1))
//!     .acquire()
//!     .await?;
//!
//! // Another task is another owner: it finds the lock busy.
//! let m = manager.clone();
//! let other = tokio::spawn(async move { m.lock("order:42").try_acquire().await });
//! assert!(other.await??.is_none());
//!
//! let token = guard.fencing_token(); // pass it to storage with every write
//! assert!(token > 0);
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! The runtime lives in `lock-runtime` and the attribute macro in `lock-macros`;
//! this crate re-exports both, and is the only one to depend on.
#![warn(missing_docs)]

pub use lock_macros::distributed_lock;
pub use lock_runtime::*;
