//! The one error type of the library.

use std::fmt;
use std::time::Duration;

/// Everything that can go wrong while taking, holding or releasing a lock.
///
/// Each variant names the lock key it concerns (shortened in the message when the
/// key is very long; the field holds it whole).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock stayed held by someone else for the whole `wait`.
    #[error(
        "lock {} is held by another owner (gave up after {waited:?})",
        KeyPreview(key)
    )]
    Timeout {
        /// The lock key.
        key: String,
        /// How long the acquisition waited before giving up.
        waited: Duration,
    },

    /// The lease ran out or was taken over while the lock was held: another holder
    /// may have run since. Work done under the lock must be treated as unprotected.
    /// An acquisition returns it when the grant's reply came after the lease it
    /// started had ended (a round trip, or the replicas' acknowledgement, longer
    /// than the lease): no guard is handed out.
    #[error("lease on lock {} was lost", KeyPreview(key))]
    Lost {
        /// The lock key.
        key: String,
    },

    /// The lock's Redis name holds a value distlock did not write (another
    /// program's key, or a key of another type, under the manager's prefix).
    /// distlock leaves such a value as it is and does not wait for it.
    #[error(
        "lock {}: its Redis name holds a value distlock did not write; it was left unchanged",
        KeyPreview(key)
    )]
    ForeignValue {
        /// The lock key.
        key: String,
    },

    /// The key cannot be used as a lock key: empty or too long for distlock,
    /// or, on PostgreSQL, holding a NUL character or a name too long for its
    /// index (about 2,700 bytes after compression).
    #[error("invalid lock key {}: {reason}", KeyPreview(key))]
    InvalidKey {
        /// The rejected key.
        key: String,
        /// Why it was rejected.
        reason: String,
    },

    /// A setting (duration, prefix, URL) is out of range or malformed.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),

    /// No manager was given to a locked function, none was set with
    /// `distlock::set_global`, and none of `DISTLOCK_URL`, `DISTLOCK_REDIS_URL`
    /// and `REDIS_URL` is set.
    #[error(
        "no lock manager configured: pass `manager = ...`, call `distlock::set_global`, \
         or set DISTLOCK_URL (or DISTLOCK_REDIS_URL or REDIS_URL)"
    )]
    NotConfigured,

    /// The manager was shut down with [`LockManager::shutdown`](crate::LockManager::shutdown)
    /// while this acquisition waited, or before it started.
    #[error("lock {}: the lock manager was shut down", KeyPreview(key))]
    ShutDown {
        /// The lock key.
        key: String,
    },

    /// The master granted the lock, but fewer replicas than
    /// [`replica_ack`](crate::LockManagerBuilder::replica_ack) asks for confirmed
    /// it within its timeout. The lock was given back (by owner token) before this
    /// error was returned, so nothing is held.
    #[error(
        "lock {}: {acked} of {wanted} replicas confirmed the acquisition in time; the lock was \
         given back",
        KeyPreview(key)
    )]
    NotReplicated {
        /// The lock key.
        key: String,
        /// How many replicas confirmed it.
        acked: u32,
        /// How many were asked for.
        wanted: u32,
    },

    /// A fencing token issued on demand ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token)),
    /// but fewer replicas than [`replica_ack`](crate::LockManagerBuilder::replica_ack)
    /// asks for confirmed it within its timeout: a failover to a replica
    /// without it could issue the same token to the next holder, so it is not
    /// handed out. The lock is still held; a later call reads the token
    /// issued and waits for the replicas again.
    #[error(
        "lock {}: {acked} of {wanted} replicas confirmed its fencing token in time; the lock \
         is still held, the token not handed out",
        KeyPreview(key)
    )]
    TokenNotReplicated {
        /// The lock key.
        key: String,
        /// How many replicas confirmed it.
        acked: u32,
        /// How many were asked for.
        wanted: u32,
    },

    /// Under Redlock, so many members failed, were unreachable or answered too
    /// late that the others could not make a majority, whoever holds the lock.
    /// Partial grants were given back. (With fewer failures, other owners'
    /// shares make the lock busy, and the acquisition waits as usual.)
    #[error(
        "lock {}: only {granted} of the {needed} Redlock members needed granted it; the others \
         failed or did not answer in time",
        KeyPreview(key)
    )]
    QuorumFailed {
        /// The lock key.
        key: String,
        /// How many members granted it.
        granted: u32,
        /// How many members make a majority.
        needed: u32,
    },

    /// A semaphore is held with another permit count than this request's:
    /// counts change only on purpose, with
    /// [`LockRequest::resize_permits`](crate::LockRequest::resize_permits).
    #[error(
        "semaphore {} is held with {held_with} permits; this request asked for {requested} \
         (change the count with .resize_permits())",
        KeyPreview(key)
    )]
    PermitsDiffer {
        /// The semaphore key.
        key: String,
        /// The count its current holders use.
        held_with: u32,
        /// The count this request gave.
        requested: u32,
    },

    /// A counting semaphore was asked for a count it cannot take: zero
    /// permits to acquire or release, more than `i64::MAX`, or a change that
    /// would take its count out of the 64-bit range (nothing was changed).
    #[error("counting semaphore {}: {reason}", KeyPreview(key))]
    InvalidPermits {
        /// The counting semaphore's key.
        key: String,
        /// What was wrong with the count.
        reason: String,
    },

    /// A request made not re-entrant ([`LockRequest::reentrant`], the
    /// attribute's `reentrant = false`) for a key that this call chain
    /// already holds: it fails at once instead of re-entering, and never waits
    /// for its own chain's hold.
    ///
    /// [`LockRequest::reentrant`]: crate::LockRequest::reentrant
    #[error(
        "lock {} is already held by this call chain, and the request is not re-entrant",
        KeyPreview(key)
    )]
    AlreadyHeld {
        /// The lock key.
        key: String,
    },

    /// Taking the write side of a read-write lock that this call chain holds
    /// for reading: it would wait for its own read hold for ever. Release the
    /// read hold first (a write hold may take reads: that re-enters).
    #[error(
        "read-write lock {}: this call chain holds it for reading and cannot take it for writing",
        KeyPreview(key)
    )]
    UpgradeRefused {
        /// The lock key.
        key: String,
    },

    /// Redis failed or did not answer in time while working on the lock.
    #[error("redis failed on lock {}: {source}", KeyPreview(key))]
    Backend {
        /// The lock key (empty when connecting, before any key is involved).
        key: String,
        /// What failed: [`BackendError::kind`] tells a timeout from a broken
        /// connection, a refusal by the ACL or an error reply of Redis.
        #[source]
        source: BackendError,
    },

    /// The manager could not connect to its store (Redis, PostgreSQL):
    /// unreachable or not answering, still loading its data after a restart
    /// (Redis's `LOADING`), a TLS handshake that failed (an untrusted
    /// certificate), or a password that is missing or wrong.
    #[error("cannot connect to the lock store at {url}: {source}")]
    Connect {
        /// The URL, with any password removed.
        url: String,
        /// What failed (see [`BackendError::kind`]).
        #[source]
        source: BackendError,
    },

    /// The store answers, but cannot serve locks safely as configured: on Redis,
    /// the ACL user may not run a command or touch a key or channel a lock
    /// needs, or (with
    /// [`reject_evicting_policy`](crate::LockManagerBuilder::reject_evicting_policy))
    /// its `maxmemory-policy` may evict held locks; on PostgreSQL, distlock's
    /// schema is missing and may not be created, or is newer than the library. Found by
    /// [`build`](crate::LockManagerBuilder::build), before any lock is taken.
    #[error("the lock store at {url} cannot serve locks: {reason}")]
    ServerCheck {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A subscription to lock events that include expiry
    /// ([`LockManager::events`](crate::LockManager::events)) found Redis's
    /// keyspace notifications off for expired keys (or could not read the
    /// setting): Redis tells of an expiry only through them.
    #[error(
        "lock events for {}: redis does not notify expired keys (notify-keyspace-events is {setting:?}); \
         run `{config_set}` on every server that holds locks, and set it on the replicas a \
         failover may promote (their configuration file), or subscribe with .expiry(false)",
        KeyPreview(pattern)
    )]
    ExpiryNotifications {
        /// The key pattern subscribed to.
        pattern: String,
        /// The setting found (`"?"` when it could not be read).
        setting: String,
        /// The command that turns the notifications on, keeping the flags
        /// already set.
        config_set: String,
    },

    /// The primitive or option asked for exists on Redis but not yet on the
    /// manager's store: refused before anything is written. (PostgreSQL
    /// now serves every primitive; a store added later may not.)
    #[error("{feature} is not available on {store} yet (key {})", KeyPreview(key))]
    Unsupported {
        /// The lock key (empty when no key is involved).
        key: String,
        /// What was asked for: "lock events", "a semaphore", ...
        feature: String,
        /// The store that lacks it: "PostgreSQL".
        store: &'static str,
    },
}

impl LockError {
    /// The lock key this error concerns, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            LockError::Timeout { key, .. }
            | LockError::Lost { key }
            | LockError::ForeignValue { key }
            | LockError::ShutDown { key }
            | LockError::NotReplicated { key, .. }
            | LockError::TokenNotReplicated { key, .. }
            | LockError::QuorumFailed { key, .. }
            | LockError::PermitsDiffer { key, .. }
            | LockError::InvalidPermits { key, .. }
            | LockError::UpgradeRefused { key }
            | LockError::AlreadyHeld { key }
            | LockError::InvalidKey { key, .. }
            | LockError::Unsupported { key, .. }
            | LockError::Backend { key, .. } => Some(key),
            LockError::InvalidConfig(_)
            | LockError::NotConfigured
            | LockError::Connect { .. }
            | LockError::ServerCheck { .. }
            | LockError::ExpiryNotifications { .. } => None,
        }
    }

    /// True when trying again later may succeed (the lock was busy, or Redis failed);
    /// false for mistakes in the call itself.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LockError::Timeout { .. }
                | LockError::Lost { .. }
                | LockError::NotReplicated { .. }
                | LockError::TokenNotReplicated { .. }
                | LockError::QuorumFailed { .. }
                | LockError::Backend { .. }
                | LockError::Connect { .. }
        )
    }

    pub(crate) fn command_timeout(key: &str, timeout: Duration) -> Self {
        LockError::Backend {
            key: key.to_owned(),
            source: BackendError::new(
                BackendErrorKind::Timeout,
                format!("no reply within the command timeout of {timeout:?}"),
            ),
        }
    }
}

/// For functions that return [`std::io::Result`] (a `#[distributed_lock]`
/// function among them): the lock error becomes the I/O error's inner error,
/// which [`get_ref`](std::io::Error::get_ref) and `downcast` give back. Its
/// kind is [`TimedOut`](std::io::ErrorKind::TimedOut) for a
/// [`LockError::Timeout`], [`Other`](std::io::ErrorKind::Other) otherwise.
impl From<LockError> for std::io::Error {
    fn from(error: LockError) -> Self {
        let kind = match error {
            LockError::Timeout { .. } => std::io::ErrorKind::TimedOut,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, error)
    }
}

/// What failed on the way to Redis or in it: the cause of
/// [`LockError::Backend`] and [`LockError::Connect`].
///
/// distlock's own type, so that the Redis client underneath can change
/// without changing distlock's API. Match on [`kind`](Self::kind) and
/// [`code`](Self::code); the client's own error, when there is one, is the
/// [`source`](std::error::Error::source) (boxed: downcast it only if you
/// depend on that client yourself).
#[derive(Debug)]
pub struct BackendError {
    kind: BackendErrorKind,
    code: Option<String>,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// The kind of a [`BackendError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// No reply within the command timeout or the connect timeout.
    Timeout,
    /// The connection could not be made, or broke: refused, reset, closed,
    /// a TLS handshake that failed.
    Connection,
    /// The server refused the credentials or the ACL user's permissions
    /// (`WRONGPASS`, `NOAUTH`, `NOPERM`).
    Auth,
    /// The server answered with an error; [`BackendError::code`] names it
    /// (`READONLY`, `OOM`, `MOVED`, `CLUSTERDOWN`, ...).
    Server,
    /// The server answered something distlock does not expect (a reply of
    /// another shape, a script that is not distlock's).
    Protocol,
    /// Anything else (a client-side failure, a bad client configuration).
    Other,
}

impl BackendError {
    /// What kind of failure this is.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// The error code of an error reply of the server (its first word, e.g.
    /// `NOPERM` or `READONLY`), when the server sent one.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// Whether the failure was a timeout.
    pub fn is_timeout(&self) -> bool {
        self.kind == BackendErrorKind::Timeout
    }

    pub(crate) fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        BackendError {
            kind,
            code: None,
            message: message.into(),
            source: None,
        }
    }

    /// This error with the server's error code (a SQLSTATE on PostgreSQL).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn with_code(mut self, code: &str) -> Self {
        self.code = Some(code.to_owned());
        self
    }

    /// The same failure told as `message` (its kind, code and source kept):
    /// for a failure that stands for several, whose message names them all.
    pub(crate) fn described(mut self, message: String) -> Self {
        self.message = message;
        self
    }

    /// The same failure without its source, for a second reader of it.
    pub(crate) fn summary(&self) -> Self {
        BackendError {
            kind: self.kind,
            code: self.code.clone(),
            message: self.message.clone(),
            source: None,
        }
    }

    /// A failure the store's client reported: `code` is the server's error
    /// code when it sent one, `source` the client's own error.
    pub(crate) fn from_client(
        kind: BackendErrorKind,
        code: Option<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BackendError {
            kind,
            code,
            message: source.to_string(),
            source: Some(Box::new(source)),
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Shows a key in error messages, quoted and cut at 120 characters so that a
/// 10 KiB key does not flood a log line.
pub(crate) struct KeyPreview<'a>(pub(crate) &'a str);

impl fmt::Display for KeyPreview<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const LIMIT: usize = 120;
        match self.0.char_indices().nth(LIMIT) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => write!(f, "{:?}... ({} bytes)", &self.0[..cut], self.0.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_key() {
        let e = LockError::Timeout {
            key: "order:42".into(),
            waited: Duration::from_millis(1500),
        };
        assert_eq!(
            e.to_string(),
            "lock \"order:42\" is held by another owner (gave up after 1.5s)"
        );
        assert_eq!(
            LockError::Lost { key: "a b".into() }.to_string(),
            "lease on lock \"a b\" was lost"
        );
        assert_eq!(e.key(), Some("order:42"));
    }

    #[test]
    fn an_io_error_keeps_the_lock_error_and_says_timed_out_for_a_timeout() {
        let timeout: std::io::Error = LockError::Timeout {
            key: "k".into(),
            waited: Duration::from_secs(1),
        }
        .into();
        assert_eq!(timeout.kind(), std::io::ErrorKind::TimedOut);
        let lost: std::io::Error = LockError::Lost { key: "k".into() }.into();
        assert_eq!(lost.kind(), std::io::ErrorKind::Other);
        let inner = lost.into_inner().unwrap().downcast::<LockError>().unwrap();
        assert!(matches!(*inner, LockError::Lost { ref key } if key == "k"));
    }

    #[test]
    fn long_keys_are_shortened_in_messages_only() {
        let key = "é".repeat(10_000);
        let e = LockError::Lost { key: key.clone() };
        let text = e.to_string();
        assert!(text.len() < 400, "{}", text.len());
        assert!(text.contains("(20000 bytes)"));
        assert_eq!(e.key(), Some(key.as_str()));
    }
}
