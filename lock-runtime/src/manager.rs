//! `LockManager` and its builder: the public face of a manager; the work is done
//! by the layers below (requests, guards, the core and its backend).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, SharedRelease, Target};
use crate::config::{Config, TlsSettings};
pub use crate::config::{DEFAULT_FENCE_RETENTION, MAX_DURATION, MIN_LEASE};
use crate::core::{Core, ManagerInner};
use crate::error::LockError;
use crate::info::{HoldKind, KeyState, LockInfo, WaiterInfo};
use crate::keys::{KeyNames, LockKind};
use crate::multi::MultiLockRequest;
use crate::request::LockRequest;

/// Hands out locks on one Redis server, a Redis Cluster, the master Sentinel
/// names, or Redlock's independent masters.
///
/// Cheap to clone (an `Arc`); clones share the command connections (the
/// repository's `docs/deploying.md`, "Connections", lists them), one pub/sub
/// subscriber that its waiters, [`events`](Self::events) streams and leader
/// [`watch`](crate::LeaderElection::watch)es share (opened at the first need, in
/// the background of the first acquisition of a default lock at the latest, one
/// connection per server it listens to), and one renewal task that renews every live lock of the manager in
/// pipelined batches. The background tasks stop when the
/// last clone and the last guard are dropped.
///
/// Create it inside a tokio runtime with time and I/O enabled (as `#[tokio::main]`
/// does); its background tasks run on that runtime.
///
/// ```no_run
/// use std::time::Duration;
/// use distlock_runtime::{LockError, LockManager};
///
/// # async fn demo() -> Result<(), LockError> {
/// let manager = LockManager::builder("redis://127.0.0.1:6379")
///     .key_prefix("myapp:locks:")
///     .default_lease(Duration::from_secs(30))
///     .default_wait(Duration::from_secs(10))
///     .build()
///     .await?;
/// let guard = manager.lock("order:42").acquire().await?;
/// println!("fencing token {}", guard.fencing_token().await?);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockManager {
    pub(crate) inner: Arc<ManagerInner>,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl LockManager {
    /// Connects with the default settings (prefix `distlock:`, lease 30 s, wait 10 s).
    pub async fn connect(url: &str) -> Result<LockManager, LockError> {
        LockManager::builder(url).build().await
    }

    /// Starts configuring a manager for the Redis server at `url`:
    /// `redis://[[user]:password@]host:port[/db]`, or `rediss://...` for TLS (the
    /// `tls` feature, on by default). A TLS server's certificate is checked
    /// against the system's roots, or the CA given to
    /// [`tls_ca_pem`](LockManagerBuilder::tls_ca_pem); `rediss://host:port/#insecure`
    /// skips the check (for trying things out only).
    ///
    /// A `postgres://` or `postgresql://` URL chooses the PostgreSQL store
    /// instead (the `postgres` feature, off by default): the default lock,
    /// read-write locks, semaphores and counting semaphores, on tables that
    /// `build()` creates when missing (see
    /// [`postgres_schema`](LockManagerBuilder::postgres_schema)).
    /// `?sslmode=require` (or libpq's `verify-ca`, `verify-full`) connects to
    /// PostgreSQL over TLS (with the `tls` feature too), always checking the
    /// server's certificate and name against the system's roots or
    /// [`tls_ca_pem`](LockManagerBuilder::tls_ca_pem); without `sslmode`
    /// (libpq's `prefer`) TLS is used only when certificates are given.
    pub fn builder(url: &str) -> LockManagerBuilder {
        #[cfg(feature = "postgres")]
        if is_postgres_url(url) {
            return LockManagerBuilder::for_target(Target::Postgres(url.to_owned()));
        }
        LockManagerBuilder::for_target(Target::Single(url.to_owned()))
    }

    /// Starts configuring a manager for a Redis Cluster, given any of its nodes
    /// (`redis://host:port` or `rediss://host:port`; more than one, so that the
    /// manager can start while one is down). The manager learns the others
    /// from the cluster. Every option of [`builder`](Self::builder) applies, and
    /// `#[distributed_lock]`, [`LockRequest`] and [`LockGuard`](crate::LockGuard)
    /// work unchanged.
    ///
    /// A lock's Redis names share one hash tag, so every script runs on the one
    /// master that owns the lock's slot; calls follow `MOVED` and `ASK`, and a
    /// slot in migration (`TRYAGAIN`) counts as busy and is retried within
    /// `wait`. Renewals cost one round trip per master per tick.
    ///
    /// ```no_run
    /// use distlock_runtime::{LockError, LockManager};
    ///
    /// # async fn demo() -> Result<(), LockError> {
    /// let manager = LockManager::cluster_builder([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://10.0.0.3:6379",
    /// ])
    /// .key_prefix("myapp:locks:")
    /// .build()
    /// .await?;
    /// let guard = manager.lock("order:42").acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn cluster_builder<I, S>(nodes: I) -> LockManagerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockManagerBuilder::for_target(Target::Cluster(nodes.into_iter().map(Into::into).collect()))
    }

    /// Starts configuring a manager for Redlock over independent Redis masters
    /// (at least 3; an odd number, such as 5, tolerates the most failures per
    /// member): a lock is held while a majority of them holds it, so it survives
    /// the loss or partition of a minority; a member that restarts empty must
    /// stay down for a lease first (else a lock held on exactly a majority
    /// that includes it can be granted again: see the semantics' table of
    /// faults). Every option of
    /// [`builder`](Self::builder) applies (except
    /// [`replica_ack`](LockManagerBuilder::replica_ack)), and locked functions,
    /// requests and guards work unchanged.
    ///
    /// Each operation goes to all members at once, each bounded by a tenth of
    /// the lease (at most the command timeout): an acquisition is two rounds
    /// (grant, then writing the chosen fencing token back to the majority),
    /// renewal one pipeline per member per tick, release one round. When errors
    /// rather than other owners keep a majority away, the acquisition fails with
    /// [`LockError::QuorumFailed`]. See `docs/scaling-out.md`, "Redlock over
    /// independent masters", for what Redlock does and does not promise.
    ///
    /// ```no_run
    /// use distlock_runtime::{LockError, LockManager};
    ///
    /// # async fn demo() -> Result<(), LockError> {
    /// let manager = LockManager::redlock_builder([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.1.1:6379",
    ///     "redis://10.0.2.1:6379",
    ///     "redis://10.0.3.1:6379",
    ///     "redis://10.0.4.1:6379",
    /// ])
    /// .build()
    /// .await?;
    /// let guard = manager.lock("order:42").acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn redlock_builder<I, S>(masters: I) -> LockManagerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockManagerBuilder::for_target(Target::Redlock(
            masters.into_iter().map(Into::into).collect(),
        ))
    }

    /// Starts configuring a manager for the master that Redis Sentinel watches
    /// under `master_name`, given some of its sentinels (`redis://host:26379`).
    /// The manager asks the sentinels for the master, and asks again whenever a
    /// call fails in a way a failover explains (the master is gone, or answers
    /// `READONLY` because it was demoted): every later call, renewals and the
    /// wake-up subscriber included, then goes to the master they name. While
    /// it makes calls, it also asks them in the background, at most every
    /// 500 ms on one connection it keeps, and follows a planned failover
    /// (`SENTINEL FAILOVER`) that fails no call: the sentinels demote the old
    /// master 8 to 18 s after they promote a replica, and it takes writes
    /// until then. It asks the sentinels in the order given (the background
    /// check first the one it keeps a connection to), the next one too when
    /// the one before has not answered within 250 ms (a sentinel cut off
    /// holds no query up for its timeouts), and follows the first that names
    /// the master; a build that finds none names each sentinel's failure.
    /// The
    /// master and its replicas take the user, password and TLS settings of the
    /// sentinel URLs. Every option of [`builder`](Self::builder) applies,
    /// [`replica_ack`](LockManagerBuilder::replica_ack) included.
    ///
    /// ```no_run
    /// use distlock_runtime::{LockError, LockManager};
    ///
    /// # async fn demo() -> Result<(), LockError> {
    /// let manager = LockManager::sentinel_builder(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .build()
    /// .await?;
    /// let guard = manager.lock("order:42").acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel_builder<I, S>(sentinels: I, master_name: &str) -> LockManagerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LockManagerBuilder::for_target(Target::Sentinel(
            sentinels.into_iter().map(Into::into).collect(),
            master_name.to_owned(),
        ))
    }

    /// Starts a request for the lock named `key` (any non-empty UTF-8 string).
    /// Nothing is sent until [`LockRequest::acquire`] or [`LockRequest::try_acquire`].
    ///
    /// The lock is the cheapest there is when nobody competes and fair when
    /// many do:
    /// - **Free**, it is taken with one plain `SET NX PX` and released by one
    ///   script (`GET` + `DEL`): two round trips and four Redis commands a
    ///   cycle, with no fencing counter (see [`LockGuard::fencing_token`]).
    /// - **Busy**, waiters from every process queue in Redis in arrival order,
    ///   each entry with a queue lease of its own (3 s, refreshed by the
    ///   waiter's attempts every 0.4-0.8 s, so a waiter that died holds up the
    ///   queue at most that long). The release hands the lock straight to the
    ///   head in the same script and tells the head's manager with one message
    ///   (on that manager's one hand-off channel, subscribed by its first
    ///   queued waiter and kept for the manager's lifetime: one pub/sub channel
    ///   per manager however many keys it waited for):
    ///   the new holder needs no round trip of its own. A lost message costs
    ///   one attempt, which finds the lock already its own.
    /// - A lock with a live queue is handed over, never freed, so a newcomer's
    ///   `SET NX` cannot overtake the queue. Arrival is when a waiter's
    ///   queueing attempt reaches Redis: its first try is the plain `SET NX`,
    ///   and if the lock is busy the queueing script follows one round trip
    ///   later. A release in between finds nobody queued and frees the lock,
    ///   which anyone may take first, the releasing task included; the waiter
    ///   then queues behind that hold. (Queueing from the first try would close
    ///   this, at the price of a script on every free acquisition.) The other
    ///   window: a holder whose lease ran out (it crashed, or lost the lock)
    ///   leaves the lock free while others queue; a newcomer can take it until
    ///   the next attempt of a queued waiter, which hands it to the head. Queued waiters attempt
    ///   again 2-4 ms after the lease their last attempt saw runs out (at the
    ///   latest one refresh, 0.8 s, after their last attempt), so the window is
    ///   a few milliseconds after an expiry (5 ms measured on loopback by
    ///   `tests/fair.rs::the_overtaking_window_on_expiry_is_bounded_by_the_heads_next_attempt`),
    ///   0.8 s at most.
    /// - The handed-off lock's TTL is at most the queue lease (or the lease if
    ///   shorter), so a head that died meanwhile holds it no longer; the new
    ///   holder's first renewal brings it up to its lease. With `renew(false)`
    ///   and a longer lease, the new holder confirms the hand-off with one more
    ///   attempt, which sets the whole lease.
    /// - On a Redlock manager waiters do not queue (a queue on each independent
    ///   member could hand the lock to different waiters): a release there
    ///   wakes this manager's longest waiter, which attempts again.
    ///
    /// [`LockGuard::fencing_token`]: crate::LockGuard::fencing_token
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.inner.clone(), key.into())
    }

    /// Starts a request for the **read** side of the read-write lock `key`:
    /// any number of readers hold it at once, while no writer holds it.
    ///
    /// - Writers do not starve: a writer that waits for readers to leave
    ///   announces itself, and new readers then wait behind it (a writer that
    ///   dies while waiting stops blocking readers within its lease; one that
    ///   gives up withdraws at once).
    /// - Each reader has its own lease, renewed while its guard lives, so a
    ///   crashed reader frees its share within its lease.
    /// - Re-entry: a read inside a read or inside a write of the same key (in
    ///   the same call chain) re-enters the outer hold. A write inside a read
    ///   fails with [`LockError::UpgradeRefused`] rather than wait for itself.
    /// - Fencing tokens come from one counter for readers and writers, so each
    ///   writer's token is above every token issued before it.
    /// - A read-write lock is a lock of its own: `read_lock(k)` and
    ///   `write_lock(k)` do not exclude `lock(k)` or `semaphore(k, n)`.
    ///
    /// Cost: one script round trip to acquire, release or renew (pipelined
    /// with the other renewals), as for [`lock`](Self::lock). Not available on
    /// a Redlock manager ([`LockError::InvalidConfig`]).
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let reading = manager.read_lock("catalog").acquire().await?;
    /// // ... other readers may hold it too; no writer does.
    /// reading.release().await?;
    /// let writing = manager.write_lock("catalog").acquire().await?;
    /// // ... nobody else holds it.
    /// writing.release().await
    /// # }
    /// ```
    pub fn read_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::of_kind(self.inner.clone(), key.into(), LockKind::Read)
    }

    /// Starts a request for the **write** side of the read-write lock `key`:
    /// one writer, and no reader. See [`read_lock`](Self::read_lock).
    pub fn write_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::of_kind(self.inner.clone(), key.into(), LockKind::Write)
    }

    /// Starts a request for one of the `permits` permits of the semaphore
    /// `key`: up to `permits` holders at once.
    ///
    /// Each permit is a hold of its own, as a lock is: its own lease renewed
    /// while the guard lives, a lost signal, a fencing token (one counter per
    /// semaphore), release on every exit. A crashed holder's permit returns
    /// within its lease. A release wakes one waiter of each manager when the
    /// semaphore was full. Re-entry: a call chain that holds a permit of `key`
    /// re-enters it rather than take a second one.
    ///
    /// The count is shared by the holders: a request with another count than
    /// the current holders' fails with [`LockError::PermitsDiffer`] unless it
    /// asks to [resize](LockRequest::resize_permits). A semaphore is a lock of
    /// its own: it does not exclude `lock(key)`.
    ///
    /// Cost: one script round trip to acquire, release or renew. `permits`
    /// must be at least 1. Not available on a Redlock manager (each member
    /// would count permits on its own, and majorities of different holders
    /// can overlap).
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // At most 4 replicas talk to the partner API at once.
    /// let permit = manager.semaphore("partner-api", 4).acquire().await?;
    /// // ...
    /// permit.release().await
    /// # }
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> LockRequest {
        LockRequest::of_kind(self.inner.clone(), key.into(), LockKind::Permit { permits })
    }

    /// The counting semaphore `key`: available permits as a counter in Redis
    /// that any caller may take from, give to or set, as Redisson's
    /// `RSemaphore` (see [`CountingSemaphore`](crate::CountingSemaphore)).
    /// Permits have no lease: a process that crashes after taking permits
    /// never gives them back. For permits that return when their holder
    /// dies, use [`semaphore`](Self::semaphore). Its names are its own: the
    /// leased semaphore and the locks of `key` are independent of it. Local:
    /// no round trip until an operation.
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let slots = manager.counting_semaphore("render-slots");
    /// slots.try_set_permits(4).await?;
    /// if slots.try_acquire(2).await? {
    ///     // ... render ...
    ///     slots.release(2).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn counting_semaphore(&self, key: impl Into<String>) -> crate::CountingSemaphore {
        crate::counting::CountingSemaphore::new(self.inner.clone(), key.into())
    }

    /// Starts a request for several locks at once, taken all or nothing (see
    /// [`MultiLockRequest`]). The keys are de-duplicated and sorted by their
    /// bytes, one global order for every multi-key acquisition, so that
    /// `lock_all(["a", "b"])` and `lock_all(["b", "a"])` never deadlock. Each
    /// key is an ordinary lock: `lock("a")` and `lock_all(["a", "b"])` exclude
    /// each other. An empty set gives an empty guard without a Redis call.
    ///
    /// Uncontended, it costs one round trip on one server (a script takes every
    /// lock), and one per key in a Redis Cluster (the locks live in distinct
    /// slots) or under Redlock. At most [`MAX_LOCK_ALL_KEYS`](crate::MAX_LOCK_ALL_KEYS)
    /// distinct keys: more fail with [`LockError::InvalidConfig`] before any
    /// Redis call.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // Move stock between two warehouses: both rows locked, or neither.
    /// let guard = manager
    ///     .lock_all(["stock:berlin:42", "stock:paris:42"])
    ///     .lease(Duration::from_secs(5))
    ///     .wait(Duration::from_secs(1))
    ///     .acquire()
    ///     .await?;
    /// // One per key, in guard.keys() order (issued now: one round trip per key).
    /// let tokens = guard.fencing_tokens().await?;
    /// // ... write both rows, each with its key's fencing token ...
    /// # let _ = tokens;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_all<I, K>(&self, keys: I) -> MultiLockRequest
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        MultiLockRequest::new(
            self.inner.clone(),
            keys.into_iter().map(Into::into).collect(),
        )
    }

    /// Whether the current call chain holds the default lock of `key` on this
    /// manager: `self.lock(key).is_held_by_current_chain()` (see
    /// [`LockRequest::is_held_by_current_chain`], which also answers for read
    /// and write locks and semaphores). Local: no round trip.
    pub fn is_held_by_current_chain(&self, key: &str) -> bool {
        self.lock(key).is_held_by_current_chain()
    }

    /// The prefix of every Redis key this manager writes.
    pub fn key_prefix(&self) -> &str {
        &self.inner.core.config.key_prefix
    }

    /// The lease used when a request sets none.
    pub fn default_lease(&self) -> Duration {
        self.inner.core.config.default_lease
    }

    /// The wait used when a request sets none.
    pub fn default_wait(&self) -> Duration {
        self.inner.core.config.default_wait
    }

    /// The Redis names behind lock `key`: the lock string
    /// ([`RedisNames::lock`](crate::RedisNames::lock)), the fencing
    /// counter and the wake-up channel (methods), for inspection and tests.
    pub fn redis_names(&self, key: &str) -> crate::keys::RedisNames {
        self.inner.core.keys(key)
    }

    /// Frees the default lock of `key` whoever holds it, for an operator
    /// unsticking a lock (every kind of hold on the key:
    /// [`force_unlock_all`](Self::force_unlock_all); one reader, permit or
    /// holder: [`force_unlock_hold`](Self::force_unlock_hold)):
    /// takes it from its holder in Redis (on every member under Redlock).
    /// Returns whether it was held.
    ///
    /// With nobody queued, the lock is deleted and its waiters woken. With
    /// waiters queued (the default lock's waiters queue in Redis, but on
    /// Redlock), it is not left free: the same script hands it to the head of
    /// the queue, as a release would, so a newcomer cannot overtake the
    /// queue. The head is whichever entry is live, and a waiter that died
    /// keeps its entry for up to its queue lease (3 s): a lock handed to it
    /// is held (its TTL at most that queue lease) until it expires and goes
    /// to the next. To unstick a lock whose queue is stuck too, call it again
    /// for each dead waiter (each call frees one hold), or wait out the queue
    /// lease. One round trip (one per member under Redlock). The holder learns it at its next
    /// renewal (within a third of its lease): its guard reports the lease lost,
    /// `#[distributed_lock]` stops the body as for any loss, and its
    /// `release()` returns [`LockError::Lost`]. The fencing counter is kept, so
    /// the next holder's token is larger than the forced-out holder's.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::Backend`] when Redis
    /// fails or does not answer in time, [`LockError::ForeignValue`] when the
    /// lock's Redis name holds a value distlock did not write (another
    /// program's key, or a key of another type): it is left as it is, as
    /// every other call leaves it.
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        crate::keys::validate_key(key)?;
        self.force_unlock_default(key, "").await
    }

    /// Frees the default lock of `key` (if `only` is not empty, only when that
    /// owner holds it), tells its waiters, counts and logs it.
    async fn force_unlock_default(&self, key: &str, only: &str) -> Result<bool, LockError> {
        let core = &self.inner.core;
        // Told to `events` subscribers whether or not this manager publishes
        // lock events: an operator's manager (the CLI's) seldom does. Not on
        // Redlock, whose members would each tell it.
        let keys = match core.backend {
            crate::backend::Backend::Redlock(_) => core.keys(key),
            _ => core.keys(key).with_events(&core.config.key_prefix, key),
        };
        let token = crate::config::owner_token();
        let freed = core
            .backend
            .force_unlock(key, &keys, &token, only, core.config.receipt_ms())
            .await
            .map_err(|e| e.error)?
            .ok_or_else(|| LockError::ForeignValue {
                key: key.to_owned(),
            })?;
        if freed {
            crate::telemetry::force_unlocked();
            tracing::warn!(target: "distlock::release",
                key = %crate::error::KeyPreview(key),
                "lock freed by force_unlock"
            );
        }
        Ok(freed)
    }

    /// Who holds the default lock of `key`, since when, until when, with which
    /// fencing token; `None` when nobody holds it. Every kind of hold on the
    /// key, and the lock's queue: [`inspect_all`](Self::inspect_all). One round trip (one per member under
    /// Redlock, where the answer is the hold a majority agrees on). A
    /// snapshot for operators: it may be stale by the time it arrives.
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// if let Some(info) = manager.inspect("order:42").await? {
    ///     println!("held by {} with token {}, {:?} left", info.holder, info.fencing_token, info.ttl);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::Backend`] when Redis
    /// fails or does not answer in time, or the key holds a value distlock did
    /// not write.
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        crate::keys::validate_key(key)?;
        let core = &self.inner.core;
        let held = core
            .backend
            .inspect(key, &core.keys(key))
            .await
            .map_err(|e| e.error)?;
        held.map(|held| {
            LockInfo::parse(key.to_owned(), &held.value, held.pttl).ok_or_else(|| {
                LockError::ForeignValue {
                    key: key.to_owned(),
                }
            })
        })
        .transpose()
    }

    /// Every hold of every kind under this manager's key prefix whose key
    /// matches the glob `pattern` (Redis `SCAN MATCH` syntax: `*` any run, `?`
    /// one character, `[abc]` a class, `\` escapes; `"*"` for all), sorted by
    /// key: default locks, read-write locks' writers and readers, semaphores'
    /// holders, each with its [`kind`](LockInfo::kind). The keys of one
    /// `lock_all` hold share an [`acquisition_id`](LockInfo::acquisition_id).
    ///
    /// It walks the keyspace with `SCAN` (on every master of a cluster, on
    /// every member under Redlock), then reads each key as
    /// [`inspect_all`](Self::inspect_all) does: an operator's tool, not for a
    /// hot path. Holds released during the walk are left out. The ACL user
    /// needs `scan`, which a lock itself does not.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails or does not answer in time.
    pub async fn list(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let core = &self.inner.core;
        let prefix = &core.config.key_prefix;
        let names = core
            .backend
            .scan_locks(&crate::keys::any_kind_scan_pattern(prefix, pattern))
            .await
            .map_err(|e| e.error)?;
        let mut keys: Vec<&str> = names
            .iter()
            .filter_map(|name| crate::keys::held_key_of(prefix, name))
            // The scan's pattern puts a `*` where the kind is, which can also
            // take in the start of a user key holding `:{<tag>}:` itself.
            .filter(|key| crate::keys::glob_matches(pattern, key))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut holds = Vec::with_capacity(keys.len());
        for key in keys {
            // A key with a value some other program wrote under our prefix is
            // left out.
            if let Some(state) = self.read_key(key).await? {
                holds.extend(state.holds);
            }
        }
        Ok(holds)
    }

    /// Every counting semaphore under this manager's key prefix whose key
    /// matches the glob `pattern` (as [`list`](Self::list)), sorted by key,
    /// with its counts (counting semaphores have no holders, so `list` does
    /// not show them). A `SCAN` of the keyspace (on every master of a
    /// cluster), then one round trip per counter: an operator's tool. A
    /// counter whose name holds a value distlock did not write is left out.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis fails or does not answer in time.
    pub async fn list_counting_semaphores(
        &self,
        pattern: &str,
    ) -> Result<Vec<(String, crate::CountingPermits)>, LockError> {
        let core = &self.inner.core;
        let prefix = &core.config.key_prefix;
        let names = core
            .backend
            .scan_locks(&crate::keys::counter_scan_pattern(prefix, pattern))
            .await
            .map_err(|e| e.error)?;
        let mut keys: Vec<&str> = names
            .iter()
            .filter_map(|name| crate::keys::counter_key_of(prefix, name))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut counters = Vec::with_capacity(keys.len());
        for key in keys {
            match self.counting_semaphore(key).counts().await {
                // Deleted since the scan saw it.
                Ok(counts) if !counts.exists => {}
                Ok(counts) => counters.push((key.to_owned(), counts)),
                Err(LockError::ForeignValue { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(counters)
    }

    /// Everything held on `key`, of every kind: the default lock's holder
    /// and its queue of waiters in order, a read-write lock's writer, readers
    /// and waiting writer, a semaphore's holders (each with its lease) and
    /// permit count, a counting semaphore's available permits and waiters
    /// (it has no holders). One round trip (one script reads it all; on Redlock,
    /// which has only the default lock and no queue, one per member and the
    /// hold a majority agrees on). A snapshot for operators.
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let state = manager.inspect_all("pool").await?;
    /// for hold in &state.holds {
    ///     println!("{} held by {} ({:?} left)", hold.kind, hold.holder, hold.ttl);
    /// }
    /// println!("{} waiting", state.waiters.len());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::Backend`] when Redis
    /// fails or does not answer in time, [`LockError::ForeignValue`] when one
    /// of the key's names holds a value distlock did not write.
    pub async fn inspect_all(&self, key: &str) -> Result<KeyState, LockError> {
        crate::keys::validate_key(key)?;
        self.read_key(key)
            .await?
            .ok_or_else(|| LockError::ForeignValue {
                key: key.to_owned(),
            })
    }

    /// [`inspect_all`](Self::inspect_all)'s reading; `None` for a foreign value.
    async fn read_key(&self, key: &str) -> Result<Option<KeyState>, LockError> {
        let core = &self.inner.core;
        let names = KeyNames::of(&core.config.key_prefix, key);
        let Some(read) = core
            .backend
            .inspect_key(key, &names)
            .await
            .map_err(|e| e.error)?
        else {
            return Ok(None);
        };
        let mut holds = Vec::new();
        for (held, kind) in [
            (&read.lock, HoldKind::Lock),
            (&read.writer, HoldKind::Write),
        ] {
            if let Some(held) = held {
                let Some(mut info) = LockInfo::parse(key.to_owned(), &held.value, held.pttl) else {
                    return Ok(None);
                };
                info.kind = kind;
                holds.push(info);
            }
        }
        for reader in read.readers {
            holds.push(LockInfo::of_shared(
                key,
                HoldKind::Read,
                reader.member,
                reader.ends_ms,
                read.now_ms,
                reader.details.as_deref(),
            ));
        }
        for holder in read.permit_holders {
            let permits = crate::info::permits_of(&holder.member);
            holds.push(LockInfo::of_shared(
                key,
                HoldKind::Permits(permits),
                holder.member,
                holder.ends_ms,
                read.now_ms,
                holder.details.as_deref(),
            ));
        }
        let waiters = read
            .queue
            .into_iter()
            .map(|(owner, entry)| WaiterInfo::parse(owner, entry.as_deref(), read.now_ms))
            .collect();
        Ok(Some(KeyState {
            key: key.to_owned(),
            holds,
            waiters,
            writer_waiting: read.writer_waiting,
            permits: read.permit_count,
            counting_permits: read.counter,
            counting_waiters: read.counter_waiters,
        }))
    }

    /// Frees every hold on `key`, of every kind (the default lock, a
    /// read-write lock's writer and readers and its waiting writer's intent,
    /// a semaphore's holders), whoever holds them, and tells their waiters;
    /// returns how many holds it freed. For an operator unsticking a key; each
    /// holder learns it as from [`force_unlock`](Self::force_unlock). Two
    /// round trips (the default lock, then the shared kinds); on Redlock one
    /// per member for the default lock, the only kind there.
    ///
    /// # Errors
    /// As [`force_unlock`](Self::force_unlock); when the default lock's name
    /// holds a foreign value, nothing is freed.
    pub async fn force_unlock_all(&self, key: &str) -> Result<u64, LockError> {
        let mut freed = u64::from(self.force_unlock(key).await?);
        let core = &self.inner.core;
        let names = KeyNames::of(&core.config.key_prefix, key);
        let token = crate::config::owner_token();
        let shared = core
            .backend
            .force_unlock_shared(
                key,
                &names,
                SharedRelease::All,
                &token,
                core.config.receipt_ms(),
            )
            .await
            .map_err(|e| e.error)?;
        if shared > 0 {
            crate::telemetry::force_unlocked();
            tracing::warn!(target: "distlock::release",
                key = %crate::error::KeyPreview(key),
                holds = shared,
                "read-write lock and semaphore holds freed by force_unlock_all"
            );
        }
        freed += shared;
        Ok(freed)
    }

    /// Frees one hold, as [`inspect_all`](Self::inspect_all) or
    /// [`list`](Self::list) described it, if it is still held by the same
    /// holder (its [`hold_id`](LockInfo::hold_id)): one reader of a
    /// read-write lock, one semaphore holder, the writer, or the default lock
    /// (of one key of a `lock_all` hold: the others stay held). Returns
    /// whether it was still held. Its waiters are told, and the holder learns
    /// it at its next renewal, as from [`force_unlock`](Self::force_unlock).
    ///
    /// # Errors
    /// As [`force_unlock`](Self::force_unlock).
    pub async fn force_unlock_hold(&self, hold: &LockInfo) -> Result<bool, LockError> {
        let key = hold.key.as_str();
        crate::keys::validate_key(key)?;
        let core = &self.inner.core;
        let token = crate::config::owner_token();
        let what = match hold.kind {
            HoldKind::Lock => return self.force_unlock_default(key, &hold.hold_id).await,
            HoldKind::Write => SharedRelease::Writer(&hold.hold_id),
            HoldKind::Read => SharedRelease::Reader(&hold.hold_id),
            HoldKind::Permits(_) => SharedRelease::Permit(&hold.hold_id),
        };
        let names = KeyNames::of(&core.config.key_prefix, key);
        let freed = core
            .backend
            .force_unlock_shared(key, &names, what, &token, core.config.receipt_ms())
            .await
            .map_err(|e| e.error)?
            > 0;
        if freed {
            crate::telemetry::force_unlocked();
            tracing::warn!(target: "distlock::release",
                key = %crate::error::KeyPreview(key),
                kind = %hold.kind,
                "hold freed by force_unlock_hold"
            );
        }
        Ok(freed)
    }

    /// Whether anyone holds the default lock of `key` right now (under
    /// Redlock: a majority of the members). A snapshot: the answer may be
    /// stale by the time it arrives; take the lock to act on it. For the other
    /// kinds: [`LockRequest::is_locked`] (`manager.semaphore(key,
    /// n).is_locked()`), or [`inspect_all`](Self::inspect_all) for everything.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::Backend`] when Redis
    /// fails or does not answer in time.
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        crate::keys::validate_key(key)?;
        let core = &self.inner.core;
        core.backend
            .is_locked(key, &core.keys(key))
            .await
            .map_err(|e| e.error)
    }

    /// Shuts the manager down: releases every lock it holds, in pipelined round
    /// trips, and returns once Redis has confirmed the releases (each round trip
    /// bounded by the command timeout) and the releases of guards dropped
    /// before it, which run in the background, are done (up to one more
    /// command timeout; so are a counting semaphore's permits that a call
    /// cut short had taken); wakes every waiting acquisition with
    /// [`LockError::ShutDown`]; and stops the renewal and subscriber tasks.
    /// A program that exits calls it before `main` returns (for the default
    /// manager built from the environment:
    /// [`shutdown_default_manager`](crate::shutdown_default_manager)), so
    /// that no lock waits out its lease.
    ///
    /// Afterwards the guards report their leases lost (`is_lost()`, `lost()`,
    /// and [`LockError::Lost`] from `release()`), since their work is no longer
    /// protected, and every new acquisition fails with [`LockError::ShutDown`].
    /// Calling it again (from another task) returns `Ok` once the first call
    /// is done (or dropped) and the background releases are (up to a command
    /// timeout), whatever the first call returned. An acquisition that completes
    /// while the shutdown runs may still leave its lock to its lease.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis failed to confirm the releases; the
    /// locks not confirmed are then released in the background, retried
    /// for up to a lease while the runtime lives (as they are when this
    /// future is dropped before it completes).
    pub async fn shutdown(&self) -> Result<(), LockError> {
        crate::release::shut_down(&self.inner).await
    }

    /// Whether the manager's background tasks (renewal, wake-ups) still run:
    /// false after [`shutdown`](Self::shutdown), or once the tokio runtime it was
    /// built on has shut down.
    pub fn is_running(&self) -> bool {
        self.inner.is_running()
    }

    /// How many locks this manager currently holds (with their renewal running or
    /// not), counting re-entrant holds of one lock once.
    pub fn held_count(&self) -> usize {
        self.inner.core.renewals.live_count()
    }
}

/// Counters for tests that check what a manager's background work costs.
/// Not a stable API.
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
impl LockManager {
    /// How often the renewal task has woken up since the manager was built: for
    /// tests that check an acquire/release cycle does not wake it. Not a stable API.
    pub fn renewal_task_wakeups(&self) -> u64 {
        self.inner.core.renewals.wakeups()
    }

    /// How many release messages have woken one of this manager's waiters (a
    /// Redlock release heard from several members counts once): for tests.
    /// Not a stable API.
    pub fn wake_ups_delivered(&self) -> u64 {
        self.inner.core.subscriber.delivered()
    }

    /// How many acquisitions of this manager wait in its queues for a
    /// wake-up now (the default lock's waiters, which queue in the store,
    /// wait there too): for tests that need a waiter parked. Not a stable API.
    pub fn waiting_acquisitions(&self) -> usize {
        self.inner.core.subscriber.waiter_count()
    }

    /// How many releases of this manager run in the background now (after a
    /// guard's drop, or a release cancelled or failed half way), with the
    /// counting semaphores' calls that take permits in a task and their
    /// give-backs, for tests that must tell a release still on its way from
    /// one that ran. Not a stable API.
    pub fn background_releases_running(&self) -> usize {
        self.inner
            .core
            .background_releases
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many notices "a waiter queued for one of your holds" this manager
    /// has heard on its hand-off channel: for tests. Not a stable API.
    pub fn waited_for_notices_heard(&self) -> u64 {
        self.inner.core.subscriber.waited_for_heard()
    }

    /// How many of this manager's listening connections were found not to
    /// hear notifications (PostgreSQL behind a transaction-mode pooler,
    /// without `postgres_listen_url`): for tests. Not a stable API.
    pub fn deaf_listeners(&self) -> u64 {
        self.inner.core.backend.deaf_listeners()
    }

    /// The PostgreSQL channel (a `LISTEN` identifier) on which the store
    /// notifies this manager's logical channel `logical` (such as
    /// [`redis_names`](Self::redis_names)`(key).channel()`, or its sibling of
    /// another lock kind), in its schema: for tests that listen beside the
    /// managers on a session of their own. Not a stable API.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_channel(&self, logical: &str) -> String {
        crate::backend::postgres::channel_ident(&self.inner.core.config.postgres.schema, logical)
    }

    /// How many round trips renewals have taken since the manager was built
    /// (pipelines and single calls): for tests that check renewal costs one
    /// round trip per server per tick. Not a stable API.
    pub fn renewal_round_trips(&self) -> u64 {
        self.inner.core.backend.renewal_round_trips()
    }

    /// The leases and the time of each renewal batch (the backend's renewal
    /// call, one round trip per server, and its outcomes applied to the
    /// leases) since the last call, oldest first; at most 4,096 are kept
    /// between two calls. For the bench, which times distlock's renewal
    /// against the same statement sent by hand. Not a stable API.
    pub fn take_renewal_batches(&self) -> Vec<(usize, Duration)> {
        self.inner.core.renewals.take_batches()
    }
}

/// Settings for a [`LockManager`]; from [`LockManager::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build().await"]
pub struct LockManagerBuilder {
    target: Target,
    config: Config,
    tls: TlsSettings,
}

impl LockManagerBuilder {
    /// A builder for `target` with every setting at its default.
    fn for_target(target: Target) -> Self {
        LockManagerBuilder {
            target,
            config: Config::default(),
            tls: TlsSettings::default(),
        }
    }

    /// Prefix of every Redis key and channel the manager writes (default
    /// `"distlock:"`). May not contain `{` or `}`. Applications that share
    /// one Redis in different databases (`redis://host/1`) need different
    /// prefixes: pub/sub ignores the database, so with one prefix each
    /// would hear the other's wake-ups (extra attempts) and lock events (as
    /// its own locks').
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.key_prefix = prefix.into();
        self
    }

    /// Lease of requests that set none (default 30 s; 10 ms to 30 days).
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.config.default_lease = lease;
        self
    }

    /// Wait of requests that set none (default 10 s; zero means one attempt).
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.config.default_wait = wait;
        self
    }

    /// How long one Redis call may take before it fails with
    /// [`LockError::Backend`] (default 2 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.config.command_timeout = timeout;
        self
    }

    /// How long connecting (and reconnecting) may take (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// How long a lock's fencing counter stays in Redis after the lease of the
    /// acquisition that last wrote it (default 10 minutes; zero to 30 days).
    ///
    /// Nothing a lock writes stays in Redis longer than `lease + retention` after
    /// the lock is released or expires, so memory stays bounded however many
    /// distinct keys are locked. Fencing tokens still strictly increase: once a
    /// counter has expired, the next token is the server's time in microseconds,
    /// which is above every earlier token unless the server's clock has stepped
    /// back by more than `lease + retention` since the last acquisition of the key
    /// (see `distlock::semantics`, "Fencing").
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.config.fence_retention = retention;
        self
    }

    /// Trusts this CA (PEM) for `rediss://` and PostgreSQL's TLS instead of the
    /// system's roots: for managed Redis or PostgreSQL with a private CA, and
    /// self-signed test servers.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// A client certificate and its private key (both PEM), for servers that
    /// require mutual TLS (`tls-auth-clients yes`; on PostgreSQL, `clientcert`
    /// or `cert` authentication in `pg_hba.conf`).
    pub fn tls_client_identity(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client_identity = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// Counts an acquisition only once `replicas` replicas of the master confirm
    /// it, waiting up to `timeout` for them (Redis `WAIT`, pipelined after the
    /// acquire script on the same connection: still one round trip, longer by the
    /// replication delay). With fewer confirmations the lock is given back at
    /// once and the acquisition fails with [`LockError::NotReplicated`]; it is
    /// not retried within `wait`, since a replica that lags or is gone will not
    /// answer the next attempt sooner.
    ///
    /// This narrows the window in which a failover loses a fresh lock; it does
    /// not close it: a confirming replica is not always the one promoted, and
    /// Redis may still lose a write it acknowledged (see `distlock::semantics`,
    /// "Cannot be promised"). A fencing token issued on demand is waited for
    /// the same way (too few confirmations: [`LockError::TokenNotReplicated`],
    /// the lock kept); renewals are not. Off by default.
    pub fn replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.config.replica_ack = Some(crate::config::ReplicaAck { replicas, timeout });
        self
    }

    /// Who holds this manager's locks, as operators see it in
    /// [`LockInfo::holder`] (from [`LockManager::inspect`], [`LockManager::list`]
    /// and the `distlock` CLI): for example a pod name and a role. At most 256
    /// bytes, stored with every hold. Default: `<hostname> pid <pid> <program>`.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.config.holder = holder.into();
        self
    }

    /// Whether acquisitions issue their fencing token at once (default:
    /// false): the manager's default for [`LockRequest::eager_fencing`].
    ///
    /// Off, a hold pays nothing for fencing (no counter read or written, no
    /// counter key left in Redis, a plain `SET NX PX` to take a free lock)
    /// until it calls [`LockGuard::fencing_token`](crate::LockGuard::fencing_token),
    /// which issues the token in one round trip; on, every acquisition issues
    /// it in its own script, for services whose every hold writes with its
    /// token. Tokens strictly increase across every holder that took one
    /// either way.
    pub fn eager_fencing(mut self, eager: bool) -> Self {
        self.config.eager_fencing = eager;
        self
    }

    /// How waiting acquisitions pace their attempts when no message brings
    /// them the lock (default: [`Backoff::default`](crate::Backoff), 8 ms doubling to 1 s with
    /// full jitter); a request may set its own with
    /// [`LockRequest::backoff`](crate::LockRequest::backoff). Checked by
    /// [`build`](Self::build).
    pub fn backoff(mut self, backoff: crate::Backoff) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// Whether this manager's default locks publish their events (default
    /// off): acquired, released, handed over and lost, for
    /// [`LockManager::events`] in any process. Each costs one `PUBLISH` inside
    /// the script that changes the lock (an uncontended acquisition then runs
    /// the acquire script rather than a plain `SET NX`); turn it on in every
    /// process that takes the locks to be watched. On PostgreSQL each is one
    /// `pg_notify` inside the function that changes the lock, on the
    /// schema's one events channel (off, the functions skip it). Not
    /// available on a Redlock manager ([`build`](Self::build) refuses it).
    pub fn lock_events(mut self, publish: bool) -> Self {
        self.config.lock_events = publish;
        self
    }

    /// Makes [`build`](Self::build) fail with [`LockError::ServerCheck`] when the
    /// server's `maxmemory-policy` may evict lock keys (`allkeys-*`, or
    /// `volatile-*`, which evicts keys with a TTL: every held lock). By default
    /// such a policy is only logged as a warning. Where `CONFIG GET` is not
    /// allowed (managed Redis), the policy cannot be read: that is logged at
    /// debug level and does not fail.
    pub fn reject_evicting_policy(mut self, reject: bool) -> Self {
        self.config.reject_evicting_policy = reject;
        self
    }

    /// The PostgreSQL schema that holds distlock's tables and functions
    /// (default `distlock`; lower-case letters, digits and `_`, not a
    /// keyword PostgreSQL reserves such as `user`: [`build`](Self::build)
    /// fails with [`LockError::InvalidConfig`] otherwise). Ignored on Redis.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_schema(mut self, schema: impl Into<String>) -> Self {
        self.config.postgres.schema = schema.into();
        self
    }

    /// Whether [`build`](Self::build) creates the PostgreSQL schema when it is
    /// missing, or migrates it when it is of an older version (default
    /// true). Off, a missing or older schema fails the build with
    /// [`LockError::ServerCheck`]; a DBA creates or migrates it with the SQL
    /// of [`postgres_schema_sql`](crate::postgres_schema_sql). Ignored on
    /// Redis.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn create_postgres_schema(mut self, create: bool) -> Self {
        self.config.postgres.create_schema = create;
        self
    }

    /// How often a PostgreSQL manager deletes the rows of expired locks and
    /// dead waiters, at most 1000 of each per statement (default 10 s). Each
    /// lock it deletes is reported `Expired` to [`LockManager::events`]
    /// streams, so this bounds how late an expiry nobody else came across
    /// is told (the shortest interval of the schema's managers counts).
    /// Ignored on Redis.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_sweep_interval(mut self, interval: Duration) -> Self {
        self.config.postgres.sweep_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// Where a PostgreSQL manager's listening connection (LISTEN, for
    /// wake-ups and hand-offs) goes, when the main URL leads through a
    /// transaction-mode pooler (PgBouncer's `pool_mode = transaction`), which
    /// does not carry notifications: a URL of the server itself, or of a
    /// session-mode pool. Data still goes through the main URL. Without it
    /// the listening connection uses the main URL; when a probe notification
    /// sent through the main URL does not reach it within the command
    /// timeout, the manager logs a warning once and its waiters are served
    /// by their timers instead (a release is noticed within about 0.8 s, a
    /// crashed holder's lease as it runs out). Ignored on Redis.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_listen_url(mut self, url: impl Into<String>) -> Self {
        self.config.postgres.listen_url = Some(url.into());
        self
    }

    /// Whether a PostgreSQL manager prepares each of its statements once per
    /// data connection (named prepared statements) rather than sending it
    /// unnamed, parsed and planned again, with every call (off by default).
    /// On, a call skips the server's parse and plan (in
    /// `lock-bench --backend postgres`, `uncontended-postgres`, the gap
    /// between the rows of distlock's SQL by hand prepared and unnamed);
    /// each statement costs one more round trip the first time a connection
    /// runs it.
    ///
    /// Only for a connection that reaches one server session for its
    /// lifetime: the server itself, or a pooler in session mode. Through a
    /// transaction-mode pooler (PgBouncer's `pool_mode = transaction` before
    /// 1.21, or without `max_prepared_statements`) a statement prepared on
    /// one server connection is missing on the next one the pooler hands
    /// out, or is another client's of the same name, so leave it off there.
    /// Ignored on Redis.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_prepared_statements(mut self, enabled: bool) -> Self {
        self.config.postgres.prepared_statements = enabled;
        self
    }

    /// Whether a PostgreSQL manager requires synchronous replication (default
    /// false): [`build`](Self::build) fails with [`LockError::ServerCheck`]
    /// naming what is missing unless the server is a primary whose
    /// `synchronous_standby_names` is set and at least one standby is in sync
    /// now (`pg_stat_replication.sync_state` `sync` or `quorum`, which the
    /// role needs `pg_monitor` or `pg_read_all_stats` to read), and distlock's
    /// sessions commit with `synchronous_commit` `on`, `remote_write` or
    /// `remote_apply` (when the role's own setting is `local` or `off`, the
    /// data connection sets `on` as a startup option, and turns a
    /// `transaction_timeout` off, which could end a commit's wait). A pooler
    /// that drops startup options fails the check unless the role's own
    /// settings already wait.
    ///
    /// Then every grant, renewal, hand-off and fencing token is confirmed by
    /// a synchronous standby before the call returns (a hand-off's new holder
    /// is notified only after that too), so a standby promoted after the
    /// primary crashed issues no token twice and grants no lock that a holder
    /// still trusts. The price: while no standby confirms, calls that write
    /// wait and fail with a command timeout rather than grant. Without it,
    /// an asynchronous standby promoted after a crash may lack the last
    /// grants. The check is made once, at build. Ignored on Redis (see
    /// [`replica_ack`](Self::replica_ack) there).
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres_synchronous_standby(mut self, required: bool) -> Self {
        self.config.postgres.synchronous_standby = required;
        self
    }

    /// Whether a call that finds the manager's connection to a server idle
    /// may take the direct lane: a second connection per server (TCP, or a
    /// TLS session of its own for `rediss://`, verified with the same
    /// certificates) on which the call writes its command and reads its own
    /// reply, without redis-rs's connection task (on by default; an
    /// `#insecure` URL never has one). Off, every call goes through the multiplexed connection and no
    /// second connection is opened. For measuring what the lane gains; it
    /// changes no behaviour but latency.
    pub fn direct_lane(mut self, enabled: bool) -> Self {
        self.config.direct_lane = enabled;
        self
    }

    /// Checks the settings, connects, checks the server, and starts the
    /// background tasks on the current tokio runtime.
    ///
    /// The server check is one pipelined round trip plus one short-lived pub/sub
    /// connection: it authenticates, loads the scripts, takes and releases a probe
    /// lock under the key prefix (so that every command, key and channel a lock
    /// needs is tried with this user's ACL), subscribes once, and reads
    /// `maxmemory-policy`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for bad settings or URLs,
    /// [`LockError::Connect`] when Redis cannot be reached, does not answer
    /// the check's first `PING` in time, is still loading its data after a restart
    /// (`LOADING`), the TLS handshake fails, or a password is missing or
    /// wrong (all within the connect timeout),
    /// [`LockError::ServerCheck`] when the ACL user lacks a permission a lock needs
    /// (the message names it), if asked, the eviction policy is unsafe, or
    /// the server answered `PING` but not the rest of the check in time.
    /// A Redlock manager builds while a majority of its members passes the
    /// check: a member that cannot be reached or is not ready yet (a
    /// `Connect` error) is connected on first use and used once it passes
    /// the same check (run in the background at its first use; again at
    /// its next use while it is down, or at its first use 5 s later after
    /// it answered and failed; until it passes its calls are refused, as a
    /// member's that is down); one that answers and fails the check at
    /// `build()` fails the build.
    pub async fn build(self) -> Result<LockManager, LockError> {
        let LockManagerBuilder {
            target,
            config,
            tls,
        } = self;
        config.validate()?;
        if let Target::Single(url) = &target {
            if is_postgres_url(url) {
                return Err(LockError::InvalidConfig(
                    "a postgres:// URL needs distlock's `postgres` feature (off by default)"
                        .to_owned(),
                ));
            }
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            LockError::InvalidConfig("LockManager must be built inside a tokio runtime".to_owned())
        })?;
        let backend = Backend::connect(&target, &config, &tls).await?;
        Ok(LockManager {
            inner: Arc::new(ManagerInner::start(Core::new(config, backend, runtime))),
        })
    }
}

/// Whether `url` names a PostgreSQL server (`postgres://`, `postgresql://`,
/// in any case).
fn is_postgres_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
}

#[cfg(all(test, not(feature = "postgres")))]
mod postgres_url_tests {
    use super::*;

    #[tokio::test]
    async fn a_postgres_url_without_the_feature_names_it() {
        for url in [
            "postgres://u@127.0.0.1:1/db",
            "PostgreSQL://u@127.0.0.1:1/db",
        ] {
            match LockManager::builder(url).build().await {
                Err(LockError::InvalidConfig(message)) => {
                    assert!(message.contains("`postgres` feature"), "{message}")
                }
                other => panic!("{url}: expected InvalidConfig, got {:?}", other.map(drop)),
            }
        }
    }
}
