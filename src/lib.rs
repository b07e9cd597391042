//! # distlock
//!
//! Declarative distributed locks on Redis: every replica of a service, on every
//! machine, runs a locked function for one key at a time. The lease is renewed
//! while the body runs, waiters are woken by the release instead of polling,
//! re-entry from the same call chain is recognised, a lost lease is signalled to
//! the body, and a holder can ask for a fencing token (issued on its first request,
//! one round trip; or with the acquisition under `eager_fencing`) that storage can use
//! to reject a stale holder.
//!
//! ```
//! use std::time::Duration;
//! use distlock::{LockError, LockManager};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let redis = distlock_testing::RedisServer::spawn()?;
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
//! // Issued on first request (one round trip); pass it to storage with every write.
//! let token = guard.fencing_token().await?;
//! assert!(token > 0);
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! With the attribute, the function acquires before its body and releases after
//! it, on every exit:
//!
//! ```
//! use distlock::{distributed_lock, LockError, LockManager};
//!
//! #[derive(Debug)]
//! enum ShipError {
//!     Lock(LockError),
//! }
//!
//! impl From<LockError> for ShipError {
//!     fn from(e: LockError) -> Self {
//!         ShipError::Lock(e)
//!     }
//! }
//!
//! #[distributed_lock(key = "order:{order_id}", lease = "30s", wait = "0s", guard = lock, manager = locks)]
//! async fn ship(locks: &LockManager, order_id: u64) -> Result<u64, ShipError> {
//!     // One caller per order_id at a time, across every process on this Redis.
//!     Ok(lock.fencing_token().await?)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let redis = distlock_testing::RedisServer::spawn()?;
//! let locks = LockManager::connect(&redis.url()).await?;
//! let token = ship(&locks, 42).await.map_err(|e| format!("{e:?}"))?;
//!
//! // While someone else holds the order, `wait = "0s"` gives up at once.
//! let held = locks.lock("order:42").acquire().await?;
//! let busy = tokio::spawn({
//!     let locks = locks.clone();
//!     async move { ship(&locks, 42).await }
//! });
//! assert!(matches!(busy.await?, Err(ShipError::Lock(LockError::Timeout { .. }))));
//! held.release().await?;
//! assert!(ship(&locks, 42).await.map_err(|e| format!("{e:?}"))? > token);
//! # Ok(()) }
//! ```
//!
//! In tests, give each test its own Redis and manager with
//! [`with_default_manager`]: the locked functions it calls without
//! `manager = ...` use it (the `distlock-testing` crate, a dev-dependency, starts private
//! servers):
//!
//! ```
//! use distlock::{distributed_lock, LockError, LockManager};
//!
//! #[distributed_lock(key = "job:{id}")]
//! async fn job(id: u64) -> Result<u64, LockError> {
//!     Ok(id)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = distlock_testing::RedisServer::spawn()?;
//! let manager = LockManager::connect(&redis.url()).await?;
//! let ran = distlock::with_default_manager(manager, async { job(7).await }).await?;
//! assert_eq!(ran, 7);
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tls` | on | `rediss://` and `valkeys://` URLs through rustls, trusting the system's roots, a CA given to [`LockManagerBuilder::tls_ca_pem`], or none with the redis crate's `#insecure` URL form; a client certificate with [`LockManagerBuilder::tls_client_identity`]. Without it such URLs and certificates fail `build()` with [`LockError::InvalidConfig`] |
//! | `testing` | off | deprecated, removed in the next release: `distlock::testing`, a re-export of the `distlock-testing` crate (private `redis-server` processes, a cluster, a Sentinel setup, a fault-injecting proxy, for your tests); add `distlock-testing` as a dev-dependency instead |
//! | `metrics` | off | counters, histograms and a gauge on the [`metrics`](https://docs.rs/metrics) facade crate; names and labels in the repository's `docs/operating.md` |
//! | `postgres` | off | the PostgreSQL store for the default lock, read-write locks, semaphores and counting semaphores: `postgres://` and `postgresql://` URLs for [`LockManager::builder`] (tokio-postgres); setup, schema, privileges and guarantees in the repository's `docs/postgres.md`. Without it such URLs fail `build()` with [`LockError::InvalidConfig`] |
//!
//! Items that need a feature say so on docs.rs.
//!
//! # Where to read on
//!
//! - [`distributed_lock`]: the attribute and every one of its options.
//! - [`semantics`]: what a lock does, exactly: the protocol, leases and renewal,
//!   waiting, re-entry, lost leases, fencing tokens, cost, memory in Redis, and the
//!   guarantees and their limits.
//! - [`lock_family`]: read-write locks, semaphores, and several keys at once.
//! - [`LockManager`], [`LockManagerBuilder`], [`LockRequest`] and [`LockGuard`]: the
//!   API without the attribute.
//!
//! The repository's guides cover the rest: `docs/deploying.md` (TLS, passwords and
//! ACL users, server checks, shutdown, managed services), `docs/operating.md`
//! (inspecting and freeing locks, the `distlock` CLI, metrics and spans),
//! `docs/scaling-out.md` (Redis Cluster, Sentinel, acknowledged replicas, Redlock),
//! `docs/postgres.md` (PostgreSQL as the store: setup, schema, privileges,
//! guarantees by deployment) and `docs/testing.md` (private servers for your tests,
//! from `distlock-testing`).
//!
//! The runtime lives in `distlock-runtime` and the attribute macro in `distlock-macros`;
//! this crate re-exports both, and is the only one to depend on.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The attribute's documentation lives in this package (so that it is packaged
// with it) and is attached here, to the re-export: rustdoc runs the examples
// of `distlock`'s own items, this `use` included, as `distlock`'s doctests,
// and shows this text first on the inlined macro's page.
#[doc = include_str!("distributed_lock.md")]
#[doc(inline)]
pub use distlock_macros::distributed_lock;
pub use distlock_runtime::*;

/// The test fixtures of the [`distlock-testing`](distlock_testing) crate, re-exported: private
/// `redis-server` processes, Redis Cluster and Sentinel setups, and a fault-injecting proxy.
///
/// **Deprecated**: kept for one release, then removed. Add `distlock-testing` as a
/// dev-dependency and write `distlock_testing::RedisServer` instead of
/// `distlock::testing::RedisServer`; the items are the same.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use distlock_testing as testing;

#[doc = include_str!("semantics.md")]
pub mod semantics {}

#[doc = include_str!("lock_family.md")]
pub mod lock_family {}

// The guides under docs/ and the README are compiled as doctests, so that every
// Rust snippet in them builds (those that need a Redis are `no_run`). Not part of
// the API: these items exist only under `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/deploying.md")]
pub struct DeployingGuide;

#[cfg(doctest)]
#[doc = include_str!("../docs/operating.md")]
pub struct OperatingGuide;

#[cfg(doctest)]
#[doc = include_str!("../docs/postgres.md")]
pub struct PostgresGuide;

#[cfg(doctest)]
#[doc = include_str!("../docs/scaling-out.md")]
pub struct ScalingOutGuide;

#[cfg(doctest)]
#[doc = include_str!("../docs/testing.md")]
pub struct TestingGuide;

#[cfg(doctest)]
#[doc = include_str!("../docs/leader-election.md")]
pub struct LeaderElectionGuide;
