//! `LockManager`: the connection, the settings, and the background tasks.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::RedisResult;

use crate::error::LockError;
use crate::keys::{self, LockKeys};
use crate::renewal::Renewals;
use crate::request::LockRequest;
use crate::scripts::Scripts;
use crate::waiting::Subscriber;

/// Shortest lease accepted. The holder trusts a lease for `lease - 1% - 2 ms` and
/// renews it every `lease / 3`; below 10 ms the renewal cannot come in time.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Longest lease or wait accepted; anything longer is taken for a unit mistake.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Default of [`LockManagerBuilder::fence_retention`].
pub const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(10 * 60);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Hands out locks on one Redis server.
///
/// Cheap to clone (an `Arc`); clones share one multiplexed connection, one pub/sub
/// subscriber (opened on first contention), and one renewal task that renews every
/// live lock of the manager in pipelined batches. The background tasks stop when the
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
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockManager {
    pub(crate) inner: Arc<ManagerInner>,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("id", &self.inner.core.id)
            .field("config", &self.inner.core.config)
            .finish_non_exhaustive()
    }
}

/// Owned by the manager's clones and its guards; stops the background tasks when
/// the last of them goes.
pub(crate) struct ManagerInner {
    pub(crate) core: Arc<Core>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for ManagerInner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What the background tasks and background releases need: everything but the
/// task handles, so that they do not keep the manager alive.
pub(crate) struct Core {
    pub(crate) id: u64,
    /// The multiplexed connection every call goes through, replaced after a
    /// call fails in a way that may leave it out of sync (see [`Core::call`]).
    conn: Mutex<Conn>,
    conn_config: ConnectionManagerConfig,
    /// For the blocking release at runtime shutdown.
    pub(crate) client: redis::Client,
    pub(crate) config: Config,
    pub(crate) scripts: Scripts,
    pub(crate) renewals: Renewals,
    pub(crate) subscriber: Subscriber,
    pub(crate) runtime: tokio::runtime::Handle,
    /// Origin of the lease clocks (`Instant`s stored as nanoseconds after it).
    pub(crate) epoch: Instant,
    /// Set by [`LockManager::shutdown`].
    shut_down: AtomicBool,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) key_prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// How long a fencing counter outlives the lease of the acquisition that last
    /// wrote it.
    pub(crate) fence_retention: Duration,
    /// Refuse to build when `maxmemory-policy` may evict lock keys (else: warn).
    pub(crate) reject_evicting_policy: bool,
}

/// The current connection, and which one it is.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) generation: u64,
    pub(crate) redis: ConnectionManager,
}

impl Core {
    pub(crate) fn connection(&self) -> Conn {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs one Redis call on connection `generation` under the command timeout,
    /// naming `key` in the error. That timeout is the only one on the call (the
    /// connection has no response timeout of its own): it bounds whatever the
    /// call does, a reconnect and a NOSCRIPT reload and retry included.
    ///
    /// A server error reply means the command ran and failed, or never ran.
    /// Anything else (a timeout, I/O, a reply of the wrong shape or for another
    /// owner) may have come after the server executed the command, and may mean
    /// a reply went missing on a connection that stays open: Redis replies carry
    /// no request id, so every later reply on it would go to the wrong caller.
    /// Such a connection is retired and the next call opens a fresh one.
    pub(crate) async fn call<T>(
        &self,
        key: &str,
        generation: u64,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, CallError> {
        let error = match tokio::time::timeout(self.config.command_timeout, fut).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {
                return Err(CallError {
                    error: LockError::backend(key, e),
                    maybe_executed: false,
                });
            }
            Ok(Err(e)) => LockError::backend(key, e),
            Err(_) => LockError::command_timeout(key, self.config.command_timeout),
        };
        self.retire_connection(generation);
        Err(CallError {
            error,
            maybe_executed: true,
        })
    }

    /// Replaces connection `generation` with a fresh one (connected on first
    /// use), unless another caller already did.
    pub(crate) fn retire_connection(&self, generation: u64) {
        let mut current = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if current.generation != generation {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.conn_config.clone())
        {
            Ok(fresh) => {
                *current = Conn {
                    generation: generation + 1,
                    redis: fresh,
                };
                tracing::debug!(target: "distlock::connection",
                    generation,
                    "connection retired after a failed call"
                );
            }
            Err(e) => {
                tracing::warn!(target: "distlock::connection", error = %e, "could not open a fresh connection")
            }
        }
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    pub(crate) fn keys(&self, key: &str) -> LockKeys {
        LockKeys::new(&self.config.key_prefix, key)
    }
}

/// A failed Redis call, and whether the server may have executed it anyway (its
/// reply was lost): then a lock it took may be held in our name.
pub(crate) struct CallError {
    pub(crate) error: LockError,
    pub(crate) maybe_executed: bool,
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
    pub fn builder(url: &str) -> LockManagerBuilder {
        LockManagerBuilder {
            url: url.to_owned(),
            config: Config {
                key_prefix: "distlock:".to_owned(),
                default_lease: Duration::from_secs(30),
                default_wait: Duration::from_secs(10),
                command_timeout: Duration::from_secs(2),
                connect_timeout: Duration::from_secs(2),
                fence_retention: DEFAULT_FENCE_RETENTION,
                reject_evicting_policy: false,
            },
            tls: TlsSettings::default(),
        }
    }

    /// Starts a request for the lock named `key` (any non-empty UTF-8 string).
    /// Nothing is sent until [`LockRequest::acquire`] or [`LockRequest::try_acquire`].
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(self.clone(), key.into())
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

    /// The Redis names behind lock `key`: the lock hash, the fencing counter and the
    /// wake-up channel, for inspection and tests.
    pub fn redis_names(&self, key: &str) -> RedisNames {
        let k = self.inner.core.keys(key);
        RedisNames {
            lock: k.lock,
            fencing_counter: k.fence,
            channel: k.channel,
        }
    }

    /// Shuts the manager down: releases every lock it holds, in pipelined round
    /// trips, and returns once Redis has confirmed the releases (each round trip
    /// bounded by the command timeout); wakes every waiting acquisition with
    /// [`LockError::ShutDown`]; and stops the renewal and subscriber tasks.
    ///
    /// Afterwards the guards report their leases lost (`is_lost()`, `lost()`,
    /// and [`LockError::Lost`] from `release()`), since their work is no longer
    /// protected, and every new acquisition fails with [`LockError::ShutDown`].
    /// Calling it again does nothing.
    ///
    /// # Errors
    /// [`LockError::Backend`] when Redis failed to confirm the releases; the
    /// locks not confirmed are then freed by their leases.
    pub async fn shutdown(&self) -> Result<(), LockError> {
        let core = &self.inner.core;
        if core.shut_down.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let leases = core.renewals.close();
        for lease in &leases {
            lease.end_by_shutdown();
        }
        core.subscriber.wake_everyone();
        for task in &self.inner.tasks {
            task.abort();
        }
        let mut outcome = Ok(());
        for batch in leases.chunks(512) {
            let locks: Vec<_> = batch
                .iter()
                .map(|lease| (&lease.keys, lease.owner.as_str()))
                .collect();
            let conn = core.connection();
            let mut redis = conn.redis.clone();
            let released = core
                .call(
                    "",
                    conn.generation,
                    core.scripts.release_many(&mut redis, &locks),
                )
                .await;
            match released {
                Ok(released) => tracing::debug!(
                    target: "distlock::release",
                    locks = locks.len(),
                    released = released.iter().filter(|r| **r).count(),
                    "released at shutdown"
                ),
                Err(e) => {
                    tracing::warn!(
                        target: "distlock::release",
                        locks = locks.len(),
                        error = %e.error,
                        "could not release at shutdown; the leases will free the locks"
                    );
                    outcome = Err(e.error);
                }
            }
        }
        outcome
    }

    /// Whether the manager's background tasks (renewal, wake-ups) still run:
    /// false after [`shutdown`](Self::shutdown), or once the tokio runtime it was
    /// built on has shut down.
    pub fn is_running(&self) -> bool {
        !self.inner.core.is_shut_down() && self.inner.tasks.iter().all(|t| !t.is_finished())
    }

    /// How many locks this manager currently holds (with their renewal running or
    /// not), counting re-entrant holds of one lock once.
    pub fn held_count(&self) -> usize {
        self.inner.core.renewals.live_count()
    }

    /// How often the renewal task has woken up since the manager was built: for
    /// tests that check an acquire/release cycle does not wake it. Not a stable API.
    #[doc(hidden)]
    pub fn renewal_task_wakeups(&self) -> u64 {
        self.inner.core.renewals.wakeups()
    }
}

/// The Redis names behind one lock, from [`LockManager::redis_names`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisNames {
    /// The lock itself: a hash `{owner token -> fencing token}` whose TTL is the
    /// lease, plus a field `waiters` once someone waits for it.
    pub lock: String,
    /// The last fencing token issued for this lock; it outlives the lock by the
    /// manager's [fence retention](LockManagerBuilder::fence_retention).
    pub fencing_counter: String,
    /// The pub/sub channel on which release wakes waiters.
    pub channel: String,
}

/// Settings for a [`LockManager`]; from [`LockManager::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build().await"]
pub struct LockManagerBuilder {
    url: String,
    config: Config,
    tls: TlsSettings,
}

/// Certificates for `rediss://` beyond the system's trust store.
#[derive(Clone, Default)]
struct TlsSettings {
    ca_pem: Option<Vec<u8>>,
    client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "<set>"))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl LockManagerBuilder {
    /// Prefix of every Redis key and channel the manager writes (default
    /// `"distlock:"`). May not contain `{` or `}`.
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
    /// (see the README's "Fencing" section).
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.config.fence_retention = retention;
        self
    }

    /// Trusts this CA (PEM) for `rediss://` instead of the system's roots: for
    /// managed Redis with a private CA, and self-signed test servers.
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// A client certificate and its private key (both PEM), for servers that
    /// require mutual TLS (`tls-auth-clients yes`).
    pub fn tls_client_identity(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client_identity = Some((certificate_pem.into(), key_pem.into()));
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
    /// [`LockError::Connect`] when Redis cannot be reached, the TLS handshake
    /// fails, or a password is missing or wrong (all within the connect timeout),
    /// [`LockError::ServerCheck`] when the ACL user lacks a permission a lock needs
    /// (the message names it) or, if asked, the eviction policy is unsafe.
    pub async fn build(self) -> Result<LockManager, LockError> {
        let LockManagerBuilder { url, config, tls } = self;
        keys::validate_prefix(&config.key_prefix)?;
        validate_lease(config.default_lease, "default lease")?;
        validate_wait(config.default_wait, "default wait")?;
        validate_wait(config.fence_retention, "fence retention")?;
        for (what, d) in [
            ("command timeout", config.command_timeout),
            ("connect timeout", config.connect_timeout),
        ] {
            if d.is_zero() || d > MAX_DURATION {
                return Err(LockError::InvalidConfig(format!(
                    "{what} is {d:?}; it must be above zero and at most 30 days"
                )));
            }
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            LockError::InvalidConfig("LockManager must be built inside a tokio runtime".to_owned())
        })?;
        let shown_url = redact(&url);
        let client = open_client(&url, &tls)
            .map_err(|e| LockError::InvalidConfig(format!("invalid redis URL {shown_url}: {e}")))?;
        let conn_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            // No response timeout here: `Core::call`'s timeout is the one bound
            // on a call, covering a reconnect, a script reload and the retry
            // together; a second timer per call only cost time (two timers
            // armed and cancelled per round trip).
            .set_response_timeout(None)
            // Reconnection is retried by every later call; a few quick tries here
            // keep a call that meets a restart from waiting long.
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(200));
        let connecting = ConnectionManager::new_with_config(client.clone(), conn_config.clone());
        let mut conn = match tokio::time::timeout(config.connect_timeout, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(source)) => {
                return Err(LockError::Connect {
                    url: shown_url,
                    source,
                })
            }
            Err(_) => {
                let io = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {:?}", config.connect_timeout),
                );
                return Err(LockError::Connect {
                    url: shown_url,
                    source: io.into(),
                });
            }
        };
        let scripts = Scripts::new();
        crate::server_check::check(&mut conn, &client, &scripts, &config, &shown_url).await?;
        let core = Arc::new(Core {
            id: next_id(),
            conn: Mutex::new(Conn {
                generation: 0,
                redis: conn,
            }),
            conn_config,
            subscriber: Subscriber::new(
                client.clone(),
                config.connect_timeout,
                config.command_timeout,
            ),
            client,
            config,
            scripts,
            renewals: Renewals::default(),
            runtime: runtime.clone(),
            epoch: Instant::now(),
            shut_down: AtomicBool::new(false),
        });
        let tasks = vec![
            runtime
                .spawn(crate::renewal::run(core.clone()))
                .abort_handle(),
            runtime
                .spawn(crate::waiting::run_subscriber(core.clone()))
                .abort_handle(),
        ];
        Ok(LockManager {
            inner: Arc::new(ManagerInner { core, tasks }),
        })
    }
}

pub(crate) fn validate_lease(lease: Duration, what: &str) -> Result<(), LockError> {
    if lease < MIN_LEASE || lease > MAX_DURATION {
        return Err(LockError::InvalidConfig(format!(
            "{what} is {lease:?}; it must be between 10 ms and 30 days"
        )));
    }
    Ok(())
}

pub(crate) fn validate_wait(wait: Duration, what: &str) -> Result<(), LockError> {
    if wait > MAX_DURATION {
        return Err(LockError::InvalidConfig(format!(
            "{what} is {wait:?}; it must be at most 30 days"
        )));
    }
    Ok(())
}

/// A client for `url`, trusting the CA and presenting the client certificate of
/// `tls` when given.
fn open_client(url: &str, tls: &TlsSettings) -> RedisResult<redis::Client> {
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "rediss:// needs distlock's `tls` feature (on by default; turned off here)",
        )));
    }
    #[cfg(feature = "tls")]
    if tls.ca_pem.is_some() || tls.client_identity.is_some() {
        return redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: tls
                    .client_identity
                    .clone()
                    .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }),
                root_cert: tls.ca_pem.clone(),
            },
        );
    }
    #[cfg(not(feature = "tls"))]
    if tls.ca_pem.is_some() || tls.client_identity.is_some() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS certificates were given, but distlock's `tls` feature is off",
        )));
    }
    redis::Client::open(url)
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password_in_messages() {
        assert_eq!(
            redact("redis://:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn durations_are_range_checked() {
        assert!(validate_lease(Duration::ZERO, "lease").is_err());
        assert!(validate_lease(Duration::from_millis(2), "lease").is_err());
        assert!(validate_lease(MIN_LEASE, "lease").is_ok());
        assert!(validate_lease(MAX_DURATION + Duration::from_secs(1), "lease").is_err());
        assert!(validate_wait(Duration::ZERO, "wait").is_ok());
        assert!(validate_wait(Duration::from_secs(u64::MAX), "wait").is_err());
    }
}
