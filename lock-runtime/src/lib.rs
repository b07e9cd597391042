//! The runtime of [distlock](https://docs.rs/distlock): lease locks on Redis with
//! renewal, re-entry, fencing tokens and pub/sub wake-ups.
//!
//! Users depend on the `distlock` facade, which re-exports this crate and the
//! `#[distributed_lock]` macro. This crate is the engine:
//!
//! - [`LockManager`] holds its command connections to Redis, the subscriber
//!   its waiters, lock events and leader watches share (one listening
//!   connection per server, opened at the first need) and one renewal task;
//! - [`LockManager::lock`] gives a [`LockRequest`]; its
//!   [`acquire`](LockRequest::acquire) is one round trip when the lock is free
//!   (a plain `SET NX PX`), and otherwise queues and waits for the holder's
//!   release to hand the lock over;
//! - [`LockManager::lock_all`] gives a [`MultiLockRequest`] for several keys,
//!   taken all or nothing in one global order (one round trip on one server);
//! - the [`LockGuard`] carries the lost-lease signal, issues the fencing token
//!   when asked ([`LockGuard::fencing_token`], one round trip the first time),
//!   renews the lease while it lives, and releases on every exit, drop included.
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock_runtime::{LockError, LockManager};
//!
//! # async fn demo() -> Result<(), LockError> {
//! let manager = LockManager::connect("redis://127.0.0.1:6379").await?;
//! let guard = manager
//!     .lock("order:42")
//!     .lease(Duration::from_secs(5))
//!     .wait(Duration::from_secs(1))
//!     .acquire()
//!     .await?;
//! // ... work, passing guard.fencing_token().await? to storage ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The layers, top down; each module uses only those below it (ARCHITECTURE.md):
// events, leader, ticket (a hold handed to another process), permits (part of a
// weighted hold given back) > global > manager > multi, counting
// (a counting semaphore's handle) > request > guard > release (giving leases
// back, at once or in the background) > core >
// renewal, waiting > backend > context, lease > telemetry, keys, config, info, error,
// buffer (the bounded buffer behind the events and leader streams);
// options (a request's hold options) sits with config, under lease. Events and leader are not built
// on the public API alone: they reach into `core.backend` (PUBLISH, whether the
// store tells of expiries) and register their channels and patterns with the
// waiting subscriber, which owns the manager's listening connections (one per
// source) for waiters, events and watches alike; the leader also reaches into
// the guard's lease. `backend` is the boundary: every call to the store and
// every listening connection go through it, and no module above it names a
// client library's type (redis-rs's errors become `LockError` in
// `backend/redis_errors.rs`).
mod backend;
mod buffer;
mod config;
mod context;
mod core;
mod counting;
mod error;
mod events;
mod global;
mod guard;
mod info;
mod keys;
mod leader;
mod lease;
mod manager;
mod multi;
mod options;
mod permits;
mod release;
mod renewal;
mod request;
mod telemetry;
mod ticket;
mod waiting;

/// The SQL that creates distlock's PostgreSQL schema (for a DBA, or
/// `distlock schema`); see [`LockManagerBuilder::postgres_schema`].
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use backend::postgres::schema_sql as postgres_schema_sql;
/// The version of distlock's PostgreSQL schema that this library reads and
/// writes (the row of `<schema>.version`), for tools that compare it with a
/// database's.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use backend::postgres::SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION;
pub use config::Backoff;
/// A store URL without its password (of the user part, or a `password=` or
/// `pass=` query parameter), for messages and logs: what distlock's own
/// errors and `Debug` output show.
///
/// ```
/// assert_eq!(
///     distlock_runtime::redact_url("redis://:s3cret@cache:6379/0"),
///     "redis://***@cache:6379/0"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    config::redact(url)
}
pub use counting::{CountingPermits, CountingSemaphore};
pub use error::{BackendError, BackendErrorKind, LockError};
pub use events::{
    EventsSkipped, LockEvent, LockEventKind, LockEvents, LockEventsRequest, DEFAULT_EVENTS_CAPACITY,
};
pub use global::{
    global, set_global, shutdown_default_manager, spawn_with_locks, with_default_manager,
};
pub use guard::LockGuard;
pub use info::{HoldKind, KeyState, LockInfo, PermitCounts, WaiterInfo};
pub use keys::RedisNames;
pub use leader::{
    LeaderElection, LeaderInfo, LeaderWatch, Leadership, LEADER_KEY_PREFIX, LEADER_WATCH_CAPACITY,
};
pub use lease::RenewalTrouble;
pub use manager::{
    LockManager, LockManagerBuilder, DEFAULT_FENCE_RETENTION, MAX_DURATION, MIN_LEASE,
};
pub use multi::{MultiLockGuard, MultiLockRequest, MAX_LOCK_ALL_KEYS};
pub use permits::MAX_SPLIT_PERMITS;
pub use request::LockRequest;
pub use telemetry::MAX_METRIC_LABELS;
pub use ticket::HoldTicket;

/// Support for the code `#[distributed_lock]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "postgres")]
    pub use crate::backend::postgres::connect_as_a_manager_would;
    pub use crate::global::default_manager;
}
