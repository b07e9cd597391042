//! The backend boundary: everything that talks to the store.
//!
//! Above this module, the manager, requests, guards, leases, re-entry, the
//! waiting queues, lock events and leader elections know only the operations
//! below (acquire, release, renew a batch, issue a token, inspect,
//! force-unlock, scan, publish, and whether and how the store tells of
//! expiries); they never see a command connection, a script, a node or a
//! client library's type. What the store pushes arrives through one
//! [`MessageConnection`] per source ([`messages`]): exact channels, patterns
//! where the store has them, a stream of [`Message`]s that ends when the
//! connection breaks. The manager's subscriber (`waiting/subscriber.rs`)
//! owns those connections for waiters, events and watches alike. The
//! client's errors become [`LockError`] and
//! [`BackendError`](crate::error::BackendError) here ([`redis_errors`]).
//! Below it, each backend decides how those operations reach Redis:
//!
//! - [`single::Single`]: one server, one multiplexed connection and a direct
//!   lane beside it for the call that finds it idle ([`direct`]);
//! - [`cluster::Cluster`]: Redis Cluster; one call per lock on its slot's
//!   master, routed by distlock (MOVED/ASK followed, TRYAGAIN retried),
//!   renewals pipelined per node;
//! - [`redlock::Redlock`]: N independent masters, each a `Single`; a lock is
//!   held while a majority holds it;
//! - [`sentinel::Sentinel`]: the master the sentinels name, as a `Single`,
//!   replaced when they name another after a failover.
//!
//! A closed enum rather than a trait object: the set is closed, and the enum
//! keeps the one-round-trip hot path free of boxed futures.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::RedisResult;

use crate::config::{Config, TlsSettings};
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::keys::{CounterNames, KeyNames, RedisNames};
use crate::lease::Lease;

pub(crate) mod calls;
pub(crate) mod check;
pub(crate) mod cluster;
pub(crate) mod direct;
pub(crate) mod messages;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod redis_errors;
use redis_errors::server_answered;
pub(crate) mod redlock;
#[cfg(feature = "tls")]
pub(crate) mod rustls_config;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod single;

use calls::{
    CounterAcquire, CounterChange, ForceUnlock, ForceUnlockShared, Inspect, InspectKey, IsLocked,
    IssueToken, IssueTokenAcked, KeyCall, PermitCounts, PermitGiveBack, PermitSplit, Publish,
    Release,
};
pub(crate) use messages::{KeyNotice, Message, MessageConnection};
pub(crate) use scripts::{
    AcquireAllReply, AcquireReply, AcquireSpec, CounterOp, CounterOutcome, CounterReply, HeldLock,
    KeyReading, PermitReply, SharedRelease,
};

/// What a holder's manager knows of the lock's waiters when it releases,
/// which decides how the release is sent (`Backend::release`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpectedWaiters {
    /// The hold did not wait for the lock and nobody said they queued: most
    /// likely nobody waits. The release that touches the lock's key alone
    /// is tried first; the full one follows only if someone queued.
    Unlikely,
    /// Not known (the hold waited for the lock, a release in the
    /// background, a give-back): the full release.
    Unknown,
    /// A waiter of another manager told this one that it queued, or another
    /// acquisition of this manager is queued: the full release, which hands
    /// the lock over, sent behind a `PING` in the same write (see
    /// `Scripts::release`; on a cluster, without it).
    Likely,
    /// Not a release of a hold: an acquisition gives back a grant it cannot
    /// use (Redlock's grants short of a majority, a grant its replicas did
    /// not confirm), and its owner token may hold the lock later. The full
    /// release, whose wake-up is marked as a give-back's (see release.lua):
    /// a manager that hears each release several times drops the copies by
    /// payload, and would otherwise take the owner's real release, later,
    /// for one more copy of the give-back.
    GivenBack,
}

/// Where the manager's Redis is.
#[derive(Clone)]
pub(crate) enum Target {
    /// One server.
    Single(String),
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
    /// The independent masters of a Redlock.
    Redlock(Vec<String>),
    /// Sentinels, and the name of the master they watch.
    Sentinel(Vec<String>, String),
    /// A PostgreSQL server (a `postgres://` or `postgresql://` URL).
    #[cfg(feature = "postgres")]
    Postgres(String),
}

/// Without passwords: a builder's or manager's `Debug` shows it.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::config::{redact, redact_all};
        match self {
            Target::Single(url) => f.debug_tuple("Single").field(&redact(url)).finish(),
            Target::Cluster(urls) => f.debug_tuple("Cluster").field(&redact_all(urls)).finish(),
            Target::Redlock(urls) => f.debug_tuple("Redlock").field(&redact_all(urls)).finish(),
            Target::Sentinel(urls, master) => f
                .debug_tuple("Sentinel")
                .field(&redact_all(urls))
                .field(master)
                .finish(),
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => f.debug_tuple("Postgres").field(&redact(url)).finish(),
        }
    }
}

pub(crate) enum Backend {
    Single(single::Single),
    Cluster(cluster::Cluster),
    Redlock(redlock::Redlock),
    Sentinel(sentinel::Sentinel),
    #[cfg(feature = "postgres")]
    Postgres(postgres::Postgres),
}

/// A failed Redis call, and whether the server may have executed it anyway (its
/// reply was lost): then a lock it took may be held in our name.
pub(crate) struct CallError {
    pub(crate) error: LockError,
    pub(crate) maybe_executed: bool,
}

/// What a release of several locks ([`Backend::release_many`]) came to.
pub(crate) struct ManyReleased {
    /// Per lock, in the order asked: whether it was still ours, or `None`
    /// when its release is unknown (its call failed, or may not have run).
    pub(crate) ours: Vec<Option<bool>>,
    /// The first failure behind a `None`; `None` when every release is known.
    pub(crate) error: Option<CallError>,
}

impl ManyReleased {
    /// Every release known, as `ours` says.
    pub(crate) fn known(ours: Vec<bool>) -> Self {
        ManyReleased {
            ours: ours.into_iter().map(Some).collect(),
            error: None,
        }
    }

    /// Every one of `count` releases unknown, for `error`.
    pub(crate) fn failed(count: usize, error: CallError) -> Self {
        ManyReleased {
            ours: vec![None; count],
            error: Some(error),
        }
    }

    /// One call for all `count` releases.
    pub(crate) fn of_one_call(count: usize, reply: Result<Vec<bool>, CallError>) -> Self {
        match reply {
            Ok(ours) => ManyReleased::known(ours),
            Err(error) => ManyReleased::failed(count, error),
        }
    }

    /// One call per release.
    pub(crate) fn of_each(replies: impl IntoIterator<Item = Result<bool, CallError>>) -> Self {
        let mut released = ManyReleased {
            ours: Vec::new(),
            error: None,
        };
        for reply in replies {
            match reply {
                Ok(ours) => released.ours.push(Some(ours)),
                Err(error) => {
                    released.ours.push(None);
                    released.error.get_or_insert(error);
                }
            }
        }
        released
    }
}

impl CallError {
    /// The connection was refused: the call was never sent, and the server
    /// is down (the one connection error `call_outcome` counts as not run).
    pub(crate) fn was_refused(&self) -> bool {
        !self.maybe_executed
            && matches!(&self.error, LockError::Backend { source, .. }
                if source.kind() == crate::error::BackendErrorKind::Connection)
    }
}

/// Where a renewal moves a lease's end in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseEnd {
    /// A whole lease from now, or the end the store keeps if that is later:
    /// the renewal task's renewals and a ticket's resumption. A renewal never
    /// shortens a lease, so that one run late (stranded on a connection
    /// replaced for silence and run by the server after an `extend` to a
    /// longer lease went through its successor) cannot end the lock before
    /// the deadline its holder trusts.
    AtLeastALease,
    /// A whole lease from now, shorter or longer than what is left: `extend`,
    /// which may shorten a lease on purpose (the holder's deadline comes down
    /// before it is sent).
    ExactlyALease,
}

/// How long a renewal round of the renewal task (or a ticket's resumption)
/// waits for its reply: the command timeout, or a third of the batch's
/// shortest lease when that is less (half of what is left when a renewal
/// goes out on time). A reply lost on a connection that stays open (a
/// stalled peer, a dropped segment) otherwise held the round a whole
/// command timeout: a lease shorter than about that was lost though a retry
/// on a new connection (a timed-out call retires its own) would have renewed
/// it in time. The lease's length, not what is left of it, bounds it, so
/// that a lease near its `max_hold`, or one being retried, does not cut the
/// round short for the rest of its batch. `extend` keeps the command
/// timeout: it is its caller's call.
pub(crate) fn renewal_timeout(
    batch: &[Arc<Lease>],
    end: LeaseEnd,
    command_timeout: Duration,
) -> Duration {
    if end == LeaseEnd::ExactlyALease {
        return command_timeout;
    }
    batch
        .iter()
        .map(|lease| lease.duration() / 3)
        .min()
        .unwrap_or(command_timeout)
        .max(MIN_RENEWAL_TIMEOUT)
        .min(command_timeout)
}

/// The least a renewal round waits for its reply (see [`renewal_timeout`]),
/// when the command timeout is longer: under it, a slow reply from a busy
/// server or machine is more likely than a lost one, and giving it up costs
/// a new connection.
const MIN_RENEWAL_TIMEOUT: Duration = Duration::from_millis(50);

/// What one lease's renewal came to.
#[derive(Debug)]
pub(crate) enum Renewal {
    /// Still ours; the lease now runs from `sent_at`.
    Renewed { sent_at: Instant },
    /// The lock was gone or held by another owner.
    NotOurs,
    /// Redis could not be asked; retry soon.
    Failed(String),
    /// Nothing was decided but the cause is fixed (a script was reloaded, the
    /// slot map refreshed): retry at once.
    Retry,
}

impl Backend {
    /// Connects to `target` and checks the server (see [`check`]).
    pub(crate) async fn connect(
        target: &Target,
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Backend, LockError> {
        match target {
            Target::Single(url) => Ok(Backend::Single(
                single::Single::connect(url, config, tls).await?,
            )),
            Target::Cluster(seeds) => Ok(Backend::Cluster(
                cluster::Cluster::connect(seeds, config, tls).await?,
            )),
            Target::Redlock(_) if config.replica_ack.is_some() => Err(LockError::InvalidConfig(
                "replica_ack does not apply to Redlock: its members are independent masters"
                    .to_owned(),
            )),
            Target::Redlock(_) if config.lock_events => Err(LockError::InvalidConfig(
                "lock_events is not available on Redlock: every member would publish each \
                 event, and no member's order is the lock's"
                    .to_owned(),
            )),
            Target::Redlock(urls) => Ok(Backend::Redlock(
                redlock::Redlock::connect(urls, config, tls).await?,
            )),
            Target::Sentinel(urls, name) => Ok(Backend::Sentinel(
                sentinel::Sentinel::connect(urls, name, config, tls).await?,
            )),
            #[cfg(feature = "postgres")]
            Target::Postgres(_) if config.replica_ack.is_some() => Err(LockError::InvalidConfig(
                "replica_ack does not apply to PostgreSQL: use synchronous replication".to_owned(),
            )),
            #[cfg(feature = "postgres")]
            Target::Postgres(url) => Ok(Backend::Postgres(
                postgres::Postgres::connect(url, config, tls).await?,
            )),
        }
    }

    /// Runs the acquire script: take the lock for `owner` with a lease of
    /// `lease_ms`, writing what `spec` says (fencing counter TTL, waiting mark,
    /// holder description and time).
    pub(crate) async fn acquire(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Result<AcquireReply, CallError> {
        match self {
            Backend::Single(b) => b.acquire(key, keys, owner, lease_ms, spec).await,
            Backend::Cluster(b) => b.acquire(key, keys, owner, lease_ms, spec).await,
            Backend::Redlock(b) => b.acquire(key, keys, owner, lease_ms, spec).await,
            Backend::Sentinel(b) => b.acquire(key, keys, owner, lease_ms, spec).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.acquire(key, keys, owner, lease_ms, spec).await,
        }
    }

    /// Takes all of `locks` for `owner` in one script call (on PostgreSQL one
    /// function call), or none of them (see `acquire_all.lua`); `key` names the first lock in errors. `None`
    /// when this backend cannot take them in one call: a cluster (distinct
    /// locks live in distinct slots), Redlock (each lock is its own majority
    /// vote), or a server whose acquisitions need replicas to confirm them
    /// (`replica_ack`); the caller then takes them one by one with
    /// [`acquire`](Self::acquire).
    pub(crate) async fn acquire_all(
        &self,
        key: &str,
        locks: &[&RedisNames],
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Option<Result<AcquireAllReply, CallError>> {
        match self {
            Backend::Single(b) => b.acquire_all(key, locks, owner, lease_ms, spec).await,
            Backend::Sentinel(b) => b.acquire_all(key, locks, owner, lease_ms, spec).await,
            Backend::Cluster(_) | Backend::Redlock(_) => None,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => Some(b.acquire_all(key, locks, owner, lease_ms, spec).await),
        }
    }

    /// Makes `call` on the server that holds `key`'s names: the one dispatch
    /// point of the calls every backend but Redlock makes the same way (see
    /// `calls.rs`). Redlock, which counts its members' answers per call, is
    /// handled by each caller; here it is refused.
    async fn on_key<K: KeyCall>(&self, key: &str, call: &K) -> Result<K::Output, CallError> {
        match self {
            Backend::Single(b) => b.on_key(key, call).await,
            Backend::Cluster(b) => b.on_key(key, call).await,
            Backend::Sentinel(b) => b.on_key(key, call).await,
            Backend::Redlock(_) => Err(CallError {
                error: LockError::InvalidConfig(format!(
                    "not available on a Redlock manager (key {})",
                    crate::error::KeyPreview(key)
                )),
                maybe_executed: false,
            }),
            // Every operation PostgreSQL serves has an arm of its own.
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => Err(CallError {
                error: LockError::Unsupported {
                    key: key.to_owned(),
                    feature: "this operation".to_owned(),
                    store: postgres::STORE,
                },
                maybe_executed: false,
            }),
        }
    }

    /// Deletes the lock if `owner` holds it and wakes its waiters; true when it
    /// was ours. With `keep_ms` above zero (the rest of a `min_hold`) the lock
    /// is not deleted but set to expire in `keep_ms`, and nobody is woken.
    /// `waiters`: what the holder's manager knows of the lock's waiters,
    /// which picks how a Redis release is sent (see [`ExpectedWaiters`]).
    pub(crate) async fn release(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
        waiters: ExpectedWaiters,
    ) -> Result<bool, CallError> {
        match self {
            // Redlock: one script per member, so that the members' wake-ups go
            // out together and the waiters' managers hear them as one.
            Backend::Redlock(b) => b.release(key, keys, owner, keep_ms).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.release(key, keys, owner, keep_ms).await,
            _ => {
                let release = Release {
                    keys,
                    owner,
                    keep_ms,
                    waiters,
                    receipt: scripts::ReceiptTerms::drawn(self.release_receipt_ms()),
                };
                self.on_key(key, &release).await
            }
        }
    }

    /// [`release`](Self::release) of a grant an acquisition left on a
    /// Redlock member (`AcquireReply::LeftBehind`), from a background task
    /// that retries it: under Redlock it succeeds only once every member
    /// answered or is down (refuses connections), where a release is done once a majority did (a member that
    /// missed that keeps the lock for the rest of its lease). The
    /// acquisition is over, so a late retry undoes nothing of its owner's.
    pub(crate) async fn release_everywhere(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> Result<bool, CallError> {
        match self {
            Backend::Redlock(b) => b.release_everywhere(key, keys, owner, keep_ms).await,
            _ => {
                self.release(key, keys, owner, keep_ms, ExpectedWaiters::Unknown)
                    .await
            }
        }
    }

    /// Issues `owner`'s fencing token if it holds the lock and has none, or
    /// reads the one it has (under Redlock: at a majority, written back);
    /// `None` when the lock is not `owner`'s. With `ack` (`replica_ack`), the
    /// token counts only once that many replicas confirm it, as an
    /// acquisition does: otherwise [`LockError::TokenNotReplicated`], the lock
    /// kept (a failover to a replica without it could issue the same token
    /// again; the next call reads the token and waits for them again).
    pub(crate) async fn issue_token(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        fence_ttl_ms: u64,
        ack: Option<crate::config::ReplicaAck>,
    ) -> Result<Option<u64>, CallError> {
        match (self, ack) {
            (Backend::Redlock(b), _) => b.issue_token(key, keys, owner, fence_ttl_ms).await,
            #[cfg(feature = "postgres")]
            (Backend::Postgres(b), _) => b.issue_token(key, keys, owner).await,
            (_, Some(ack)) => {
                let issue = IssueTokenAcked {
                    keys,
                    owner,
                    fence_ttl_ms,
                    ack,
                };
                let (token, acked) = self.on_key(key, &issue).await?;
                if token.is_some() && acked < ack.replicas {
                    return Err(CallError {
                        error: LockError::TokenNotReplicated {
                            key: key.to_owned(),
                            acked,
                            wanted: ack.replicas,
                        },
                        maybe_executed: false,
                    });
                }
                Ok(token)
            }
            (_, None) => {
                let issue = IssueToken {
                    keys,
                    owner,
                    fence_ttl_ms,
                };
                self.on_key(key, &issue).await
            }
        }
    }

    /// Deletes the lock whoever holds it (or only if `only` does, when not
    /// empty) and wakes its waiters (`token`: a fresh random wake-up payload);
    /// true when it was held, `None` when the lock's name holds a value
    /// distlock did not write (left as it is; never on PostgreSQL, whose
    /// table holds nothing else). On Cluster and Sentinel it leaves a receipt
    /// kept `receipt_ms`: sent again after its reply was lost, it would
    /// otherwise free the lock it had just handed to a waiter.
    pub(crate) async fn force_unlock(
        &self,
        key: &str,
        keys: &RedisNames,
        token: &str,
        only: &str,
        receipt_ms: u64,
    ) -> Result<Option<bool>, CallError> {
        match self {
            Backend::Redlock(b) => b.force_unlock(key, keys, token, only).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.force_unlock(key, keys, token, only).await.map(Some),
            _ => {
                let force = ForceUnlock {
                    keys,
                    token,
                    only,
                    receipt_ms: self.receipt_ms(receipt_ms),
                };
                self.on_key(key, &force).await
            }
        }
    }

    /// Every hold on one user key, of every kind, and the default lock's
    /// queue; `None` when a name holds a value of another type. On Redlock,
    /// which has neither shared kinds nor queues, the default lock as a
    /// majority holds it.
    pub(crate) async fn inspect_key(
        &self,
        key: &str,
        names: &KeyNames,
    ) -> Result<Option<KeyReading>, CallError> {
        match self {
            Backend::Redlock(b) => Ok(Some(KeyReading {
                lock: b.inspect(key, &names.lock).await?,
                ..KeyReading::default()
            })),
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.inspect_key(key, names).await,
            _ => self.on_key(key, &InspectKey { names }).await,
        }
    }

    /// Frees shared holds (a read-write lock's, a semaphore's): all, or one
    /// holder's; how many were freed. None on Redlock, which has no shared
    /// kinds. A receipt as `force_unlock`'s.
    pub(crate) async fn force_unlock_shared(
        &self,
        key: &str,
        names: &KeyNames,
        what: SharedRelease<'_>,
        token: &str,
        receipt_ms: u64,
    ) -> Result<u64, CallError> {
        match self {
            Backend::Redlock(_) => Ok(0),
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.force_unlock_shared(key, names, what, token).await,
            _ => {
                let force = ForceUnlockShared {
                    names,
                    what,
                    token,
                    receipt_ms: self.receipt_ms(receipt_ms),
                };
                self.on_key(key, &force).await
            }
        }
    }

    /// Whether anyone holds the lock (under Redlock: a majority of the members).
    pub(crate) async fn is_locked(&self, key: &str, keys: &RedisNames) -> Result<bool, CallError> {
        match self {
            Backend::Redlock(b) => b.is_locked(key, keys).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.is_locked(key, keys).await,
            _ => self.on_key(key, &IsLocked { keys }).await,
        }
    }

    /// A semaphore's held permits and stored count. Redlock has no semaphores
    /// (refused by `on_key`; requests refuse them first).
    pub(crate) async fn permit_counts(
        &self,
        key: &str,
        keys: &RedisNames,
    ) -> Result<PermitReply, CallError> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.permit_counts(key, keys).await,
            _ => self.on_key(key, &PermitCounts { keys }).await,
        }
    }

    /// Gives back part of `owner`'s weighted semaphore hold and keeps the
    /// rest as `kept_owner`'s: one script. Redlock has no semaphores.
    pub(crate) async fn permit_give_back(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        kept_owner: &str,
    ) -> Result<bool, CallError> {
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(b) = self {
            return b.permit_give_back(key, keys, owner, kept_owner).await;
        }
        self.on_key(
            key,
            &PermitGiveBack {
                keys,
                owner,
                kept_owner,
            },
        )
        .await
    }

    /// Splits `owner`'s weighted semaphore hold into one hold per permit,
    /// under `permit_owners`: one script. Redlock has no semaphores.
    pub(crate) async fn permit_split(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        permit_owners: &[String],
    ) -> Result<bool, CallError> {
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(b) = self {
            return b.permit_split(key, keys, owner, permit_owners).await;
        }
        self.on_key(
            key,
            &PermitSplit {
                keys,
                owner,
                permit_owners,
            },
        )
        .await
    }

    /// Takes `wanted` permits of the counting semaphore `names` (of `key`), or
    /// records `owner` as waiting for `register_ms` (0: not waiting). One
    /// script; Redlock has no counting semaphores (refused by `on_key`). On
    /// Cluster and Sentinel, the permits taken leave a receipt kept
    /// `receipt_ms`, so that the script sent again (by Cluster's client, by
    /// Sentinel's failover) takes nothing more; one server's and
    /// PostgreSQL's calls are never sent twice.
    pub(crate) async fn counter_acquire(
        &self,
        key: &str,
        names: &CounterNames,
        owner: &str,
        wanted: i64,
        register_ms: u64,
        receipt_ms: u64,
    ) -> Result<CounterReply, CallError> {
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(b) = self {
            return b
                .counter_acquire(key, names, owner, wanted, register_ms)
                .await;
        }
        let call = CounterAcquire {
            names,
            owner,
            wanted,
            register_ms,
            receipt_ms: self.receipt_ms(receipt_ms),
        };
        self.on_key(key, &call).await
    }

    /// How long a counting semaphore's change keeps its receipt here: 0 (none
    /// written) on one server, whose connections never send a call twice;
    /// `wanted` on Cluster and Sentinel, which do.
    fn receipt_ms(&self, wanted: u64) -> u64 {
        match self {
            Backend::Cluster(_) | Backend::Sentinel(_) => wanted,
            _ => 0,
        }
    }

    /// How long a release keeps its receipt here (see `Scripts::release`):
    /// 0 (none written) on one server and under Redlock, whose calls are
    /// never sent twice; on Cluster and Sentinel, which send a call again
    /// when its connection broke before the reply, the window of
    /// [`Config::receipt_ms`](crate::config::Config::receipt_ms).
    fn release_receipt_ms(&self) -> u64 {
        match self {
            Backend::Cluster(b) => crate::config::receipt_window_ms(b.command_timeout),
            Backend::Sentinel(b) => b.config.receipt_ms(),
            _ => 0,
        }
    }

    /// Changes or reads the counting semaphore `names` (of `key`). One
    /// script; a change leaves a receipt as `counter_acquire` does.
    pub(crate) async fn counter_change(
        &self,
        key: &str,
        names: &CounterNames,
        owner: &str,
        op: CounterOp,
        receipt_ms: u64,
    ) -> Result<CounterReply, CallError> {
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(b) = self {
            return b.counter_change(key, names, owner, op).await;
        }
        let call = CounterChange {
            names,
            owner,
            op,
            receipt_ms: self.receipt_ms(receipt_ms),
        };
        self.on_key(key, &call).await
    }

    /// The value of server setting `name` on every server that holds locks
    /// (`None` where the server has no such setting).
    async fn config_get(&self, name: &str) -> Result<Vec<Option<String>>, CallError> {
        match self {
            Backend::Single(b) => b.config_get(name).await.map(|v| vec![v]),
            Backend::Sentinel(b) => b.config_get(name).await.map(|v| vec![v]),
            Backend::Cluster(b) => b.config_get(name).await,
            Backend::Redlock(b) => {
                let mut values = Vec::new();
                for member in b.members() {
                    values.push(member.config_get(name).await?);
                }
                Ok(values)
            }
            // No Redis setting exists on PostgreSQL.
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => Ok(vec![None]),
        }
    }

    /// Whether the store tells of each lock's expiry as a message (Redis:
    /// every server that holds locks has `notify-keyspace-events` with `K`
    /// and `x`, or `A` for `x`); false when a setting cannot be read.
    pub(crate) async fn notifies_expiry(&self) -> bool {
        match self.config_get(KEYSPACE_EVENTS).await {
            Ok(settings) => settings
                .iter()
                .all(|flags| notifies_expired_keys(flags.as_deref().unwrap_or(""))),
            Err(_) => false,
        }
    }

    /// Fails with [`LockError::ExpiryNotifications`] (for the lock events
    /// of `pattern`) unless the store tells of each lock's expiry as a
    /// message, naming what turns that on. A setting that cannot be read
    /// counts as off.
    pub(crate) async fn ensure_expiry_notices(&self, pattern: &str) -> Result<(), LockError> {
        // PostgreSQL's expiries are told by the sweep: nothing to turn on.
        #[cfg(feature = "postgres")]
        if let Backend::Postgres(_) = self {
            return Ok(());
        }
        let settings = match self.config_get(KEYSPACE_EVENTS).await {
            Ok(settings) => settings,
            Err(e) => {
                tracing::debug!(target: "distlock::events", error = %e.error,
                    "could not read notify-keyspace-events");
                vec![None]
            }
        };
        for setting in settings {
            let flags = setting.clone().unwrap_or_default();
            if !notifies_expired_keys(&flags) {
                let mut wanted = flags.clone();
                for flag in ['K', 'x'] {
                    // `A` stands for every event class, `x` included.
                    let set = wanted.contains(flag) || (flag == 'x' && wanted.contains('A'));
                    if !set {
                        wanted.push(flag);
                    }
                }
                return Err(LockError::ExpiryNotifications {
                    pattern: pattern.to_owned(),
                    setting: setting.unwrap_or_else(|| "?".to_owned()),
                    config_set: format!("CONFIG SET {KEYSPACE_EVENTS} {wanted}"),
                });
            }
        }
        Ok(())
    }

    /// The pattern whose messages are the store's notices of the keys whose
    /// stored names match the glob `names` (read them with
    /// [`Message::key_notice`]), on every source, or `None` where the store
    /// has no such notices. Redis: the keyspace notifications of those names
    /// on any database (the URL chooses it; a cluster has only 0).
    pub(crate) fn expiry_pattern(&self, names: &str) -> Option<String> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => None,
            _ => Some(format!("__keyspace@*__:{names}")),
        }
    }

    /// Where this store's lock events are heard when not on a channel per
    /// lock: `Some` of the one channel that carries every lock event of the
    /// store (PostgreSQL, whose LISTEN takes no patterns), each message
    /// naming its lock (read it with [`named_event`]), expiries included;
    /// `None` where each lock has its own events channel
    /// (`<prefix>events:<key>`, subscribed by pattern) and expiries are
    /// [`expiry_pattern`](Self::expiry_pattern)'s notices.
    pub(crate) fn lock_events_channel(&self) -> Option<&str> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => Some(b.events_channel()),
            _ => None,
        }
    }

    /// Tells lock events subscribers `event` (the text of a Redis events
    /// message, such as `lost <token>`) of the lock `keys` (of `key`), which
    /// has an events channel (`keys.events` is set).
    pub(crate) async fn publish_lock_event(
        &self,
        key: &str,
        keys: &RedisNames,
        event: &str,
    ) -> Result<(), CallError> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.publish_lock_event(key, keys, event).await,
            _ => self.publish(key, &keys.events, event).await,
        }
    }

    /// Publishes `payload` on `channel` where this backend's subscribers
    /// listen (for `key`, which names it in errors; on a cluster the
    /// channel routes the call).
    pub(crate) async fn publish(
        &self,
        key: &str,
        channel: &str,
        payload: &str,
    ) -> Result<(), CallError> {
        match self {
            Backend::Redlock(b) => b.publish(key, channel, payload).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.publish(key, channel, payload).await,
            _ => self.on_key(key, &Publish { channel, payload }).await,
        }
    }

    /// The lock's stored value and remaining lease, when anyone holds it.
    pub(crate) async fn inspect(
        &self,
        key: &str,
        keys: &RedisNames,
    ) -> Result<Option<HeldLock>, CallError> {
        match self {
            Backend::Redlock(b) => b.inspect(key, keys).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.inspect(key, keys).await,
            _ => self.on_key(key, &Inspect { keys }).await,
        }
    }

    /// Names of the lock keys matching `pattern` (a `SCAN MATCH` pattern), on
    /// every server that holds locks.
    pub(crate) async fn scan_locks(&self, pattern: &str) -> Result<Vec<String>, CallError> {
        match self {
            Backend::Single(b) => b.scan_locks(pattern).await,
            Backend::Cluster(b) => b.scan_locks(pattern).await,
            Backend::Redlock(b) => b.scan_locks(pattern).await,
            Backend::Sentinel(b) => b.scan_locks(pattern).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.scan_locks(pattern).await,
        }
    }

    /// Releases many locks in as few round trips as the backend allows (one per
    /// server, and on a cluster one more per lock whose slot moved); per lock (keys, owner, keep_ms as for `release`), whether it
    /// was still ours, or unknown when the backend could not confirm its
    /// release (Redlock: fewer than a majority answered for it), which the
    /// caller retries (releasing a lock again is harmless).
    pub(crate) async fn release_many(&self, locks: &[(&RedisNames, &str, u64)]) -> ManyReleased {
        match self {
            Backend::Single(b) => {
                ManyReleased::of_one_call(locks.len(), b.release_many(locks, None).await)
            }
            Backend::Cluster(b) => b.release_many(locks).await,
            Backend::Redlock(b) => b.release_many(locks).await,
            Backend::Sentinel(b) => {
                ManyReleased::of_one_call(locks.len(), b.release_many(locks).await)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.release_many(locks).await,
        }
    }

    /// Releases over a blocking connection of its own, bounded by the connect
    /// and command timeouts: for the moment a tokio runtime shuts down.
    /// Whether the lock was still ours.
    pub(crate) fn release_blocking(
        &self,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> Result<bool, LockError> {
        let released = match self {
            Backend::Single(b) => b.release_blocking(keys, owner, keep_ms),
            Backend::Cluster(b) => b.release_blocking(keys, owner, keep_ms),
            Backend::Redlock(b) => b.release_blocking(keys, owner, keep_ms),
            Backend::Sentinel(b) => b.release_blocking(keys, owner, keep_ms),
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => return b.release_blocking(keys, owner, keep_ms),
        };
        released.map_err(|e| LockError::backend(&keys.lock, e))
    }

    /// Renews a batch of leases, each to end where `end` says: one round
    /// trip per server; one outcome per lease, in order.
    pub(crate) async fn renew(&self, batch: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        match self {
            Backend::Single(b) => b.renew(batch, end).await,
            Backend::Cluster(b) => b.renew(batch, end).await,
            Backend::Redlock(b) => b.renew(batch, end).await,
            Backend::Sentinel(b) => b.renew(batch, end).await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.renew(batch, end).await,
        }
    }

    /// Whether a waiting acquisition of the default lock queues up from its
    /// first attempt. On Redis a first try without a token is a plain
    /// `SET NX` rather than the queueing script, cheaper for a lock that is
    /// most often free, so it goes first and the queueing attempt follows if
    /// the lock is busy. That leaves a round trip in which a release finds
    /// nobody queued and frees the lock, and a newcomer (the releasing task
    /// too) takes it ahead of the waiter: the re-grabs of the bench's
    /// `many-keys` pass over 4 processes. Queueing from the first attempt
    /// (tried with a temporary switch, `40eb80a`) removed them there, but
    /// made every free cycle a script: the bench's uncontended p50 1.77x
    /// (68.6 against 38.8 us), and half the acquisitions per second of
    /// many-keys over 4 processes. On PostgreSQL both are one call of the same
    /// function, equal in cost when the lock is free; queueing at once saves
    /// a busy lock its second statement, and leaves no gap between the try
    /// and the queueing in which the holder can release to nobody and take
    /// the lock again ahead of this waiter.
    pub(crate) fn queues_at_first_attempt(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => true,
            _ => false,
        }
    }

    /// Whether this manager's listening connections hear what the store
    /// pushes: false once one was found deaf (PostgreSQL behind a
    /// transaction-mode pooler, without `postgres_listen_url`); Redis always
    /// delivers what it accepts to subscribe.
    pub(crate) fn hears_messages(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.hears_messages(),
            _ => true,
        }
    }

    /// How many listening connections did not hear the probe notification
    /// sent through the data connection (PostgreSQL behind a
    /// transaction-mode pooler); Redis never probes.
    #[cfg(feature = "testing")]
    pub(crate) fn deaf_listeners(&self) -> u64 {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.deaf_listeners(),
            _ => 0,
        }
    }

    /// How many round trips renewals have taken so far (pipelines and single
    /// calls), for tests that count them per tick.
    #[cfg(feature = "testing")]
    pub(crate) fn renewal_round_trips(&self) -> u64 {
        match self {
            Backend::Single(b) => b
                .renewal_round_trips
                .load(std::sync::atomic::Ordering::Relaxed),
            Backend::Cluster(b) => b
                .renewal_round_trips
                .load(std::sync::atomic::Ordering::Relaxed),
            Backend::Redlock(b) => b.renewal_round_trips(),
            Backend::Sentinel(b) => b.renewal_round_trips(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => b.renewal_round_trips(),
        }
    }

    /// How many sources push messages (wake-ups, hand-offs, events), each
    /// needing a listening connection of its own: a Redis server, every master
    /// of a cluster, every Redlock member.
    pub(crate) fn message_sources(&self) -> usize {
        match self {
            Backend::Single(_) => 1,
            Backend::Cluster(b) => b.pubsub_sources(),
            Backend::Redlock(b) => b.members().len(),
            Backend::Sentinel(_) => 1,
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => 1,
        }
    }

    /// Opens a listening connection to message source `source` (below
    /// [`message_sources`](Self::message_sources)).
    pub(crate) async fn messages(&self, source: usize) -> Result<MessageConnection, BackendError> {
        let pubsub = match self {
            Backend::Single(b) => b.pubsub().await,
            Backend::Cluster(b) => b.pubsub(source).await,
            Backend::Sentinel(b) => b.pubsub().await,
            Backend::Redlock(b) => match b.members().get(source) {
                Some(member) => member.pubsub().await,
                None => {
                    return Err(BackendError::new(
                        BackendErrorKind::Other,
                        format!("no Redlock member {source}"),
                    ))
                }
            },
            #[cfg(feature = "postgres")]
            Backend::Postgres(b) => {
                return b
                    .listener()
                    .await
                    .map(|l| MessageConnection::Postgres(Box::new(l)))
            }
        };
        pubsub
            .map(MessageConnection::redis)
            .map_err(BackendError::from_redis)
    }
}

/// The Redis setting that turns keyspace notifications on.
const KEYSPACE_EVENTS: &str = "notify-keyspace-events";

/// Whether `notify-keyspace-events` set to `flags` notifies expired keys.
fn notifies_expired_keys(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('x') || flags.contains('A'))
}

/// Runs `fut` under `timeout`, naming `key` in the error. A server error reply
/// means the command ran and failed, or never ran, and a refused connection
/// that it was never sent (a connection is only refused before it opens: the
/// call waited for a reconnection that failed); anything else (a timeout,
/// I/O, a reply of the wrong shape or for another owner) may have come after the
/// server executed it.
pub(crate) async fn bounded_call<T>(
    key: &str,
    timeout: Duration,
    fut: impl Future<Output = RedisResult<T>>,
) -> Result<T, CallError> {
    call_outcome(key, timeout, tokio::time::timeout(timeout, fut).await)
}

/// [`bounded_call`]'s answer for what `tokio::time::timeout(timeout, ..)` gave.
pub(crate) fn call_outcome<T>(
    key: &str,
    timeout: Duration,
    outcome: Result<RedisResult<T>, tokio::time::error::Elapsed>,
) -> Result<T, CallError> {
    let error = match outcome {
        Ok(Ok(value)) => return Ok(value),
        // Answered with an error, or refused a connection (a reconnection
        // the call waited for failed to connect: the call was never written).
        Ok(Err(e)) if server_answered(&e) || e.is_connection_refusal() => {
            return Err(CallError {
                error: LockError::backend(key, e),
                maybe_executed: false,
            });
        }
        Ok(Err(e)) => LockError::backend(key, e),
        Err(_) => LockError::command_timeout(key, timeout),
    };
    Err(CallError {
        error,
        maybe_executed: true,
    })
}

/// The outcome of an acquisition that asked `ack` replicas to confirm it:
/// `reply` when they did (or the lock was busy); otherwise the lock is given
/// back with `give_back` first, and the error says how many confirmed (if the
/// give-back failed, the error says the lock may be held, so that the caller
/// releases it later).
pub(crate) async fn require_replicas(
    key: &str,
    reply: AcquireReply,
    acked: u32,
    ack: &crate::config::ReplicaAck,
    give_back: impl Future<Output = Result<bool, CallError>>,
) -> Result<AcquireReply, CallError> {
    if !matches!(reply, AcquireReply::Acquired { .. }) || acked >= ack.replicas {
        return Ok(reply);
    }
    let given_back = give_back.await;
    Err(CallError {
        error: LockError::NotReplicated {
            key: key.to_owned(),
            acked,
            wanted: ack.replicas,
        },
        maybe_executed: given_back.is_err(),
    })
}

/// Turns the replies of a renewal pipeline into outcomes; `None` when the reply
/// count is wrong (the connection is out of sync). NOSCRIPT replies are left as
/// `Retry` and reported through `missing_script`; `out_of_sync` is set when a
/// reply belongs to another request.
pub(crate) fn read_renewals(
    batch: &[Arc<Lease>],
    replies: Vec<RedisResult<(i64, String)>>,
    sent_at: Instant,
    missing_script: &mut bool,
    out_of_sync: &mut bool,
) -> Option<Vec<Renewal>> {
    if replies.len() != batch.len() {
        *out_of_sync = true;
        return None;
    }
    Some(
        batch
            .iter()
            .zip(replies)
            .map(|(lease, reply)| {
                match reply.and_then(|reply| scripts::Scripts::renew_reply(reply, &lease.owner)) {
                    Ok(true) => Renewal::Renewed { sent_at },
                    Ok(false) => Renewal::NotOurs,
                    Err(e) if is_noscript(&e) => {
                        *missing_script = true;
                        Renewal::Retry
                    }
                    Err(e) => {
                        // A reply of the wrong shape or for another owner: the
                        // connection cannot be trusted any more.
                        *out_of_sync |= !server_answered(&e);
                        Renewal::Failed(e.to_string())
                    }
                }
            })
            .collect(),
    )
}

pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// A client for `url`, trusting the CA and presenting the client certificate of
/// `tls` when given.
pub(crate) fn open_client(url: &str, tls: &TlsSettings) -> RedisResult<redis::Client> {
    check_tls_feature(url, tls)?;
    #[cfg(feature = "tls")]
    if let Some(certs) = tls_certificates(tls) {
        return redis::Client::build_with_tls(url, certs);
    }
    redis::Client::open(url)
}

fn check_tls_feature(url: &str, tls: &TlsSettings) -> RedisResult<()> {
    if (url.starts_with("rediss://") || url.starts_with("valkeys://")) && !cfg!(feature = "tls") {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "rediss:// and valkeys:// need distlock's `tls` feature (on by default; turned off here)",
        )));
    }
    if !cfg!(feature = "tls") && (tls.ca_pem.is_some() || tls.client_identity.is_some()) {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS certificates were given, but distlock's `tls` feature is off",
        )));
    }
    Ok(())
}

/// A client for `host:port` with the settings (user, password, TLS and its
/// certificates) of `template`: for servers that a cluster or the sentinels
/// name, which take the credentials of the URLs the manager was given.
pub(crate) fn client_at(
    template: &redis::Client,
    host: &str,
    port: u16,
) -> RedisResult<redis::Client> {
    let info = template.get_connection_info().clone();
    let addr = match info.addr() {
        redis::ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => redis::ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => redis::ConnectionAddr::Tcp(host.to_owned(), port),
    };
    redis::Client::open(info.set_addr(addr))
}

#[cfg(feature = "tls")]
fn tls_certificates(tls: &TlsSettings) -> Option<redis::TlsCertificates> {
    if tls.ca_pem.is_none() && tls.client_identity.is_none() {
        return None;
    }
    Some(redis::TlsCertificates {
        client_tls: tls
            .client_identity
            .clone()
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: tls.ca_pem.clone(),
    })
}

/// The error `build()` returns when nothing answered in time.
pub(crate) fn connect_timed_out(shown_url: String, timeout: Duration) -> LockError {
    LockError::Connect {
        url: shown_url,
        source: BackendError::new(
            BackendErrorKind::Timeout,
            format!("no answer within {timeout:?}"),
        ),
    }
}
