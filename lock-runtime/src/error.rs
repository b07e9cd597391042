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
    #[error("lease on lock {} was lost", KeyPreview(key))]
    Lost {
        /// The lock key.
        key: String,
    },

    /// An operation needed the lock to be held by this caller, and it is not.
    #[error("lock {} is not held by this owner", KeyPreview(key))]
    NotHeld {
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

    /// The key cannot be used as a lock key.
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
    /// `distlock::set_global`, and neither `DISTLOCK_REDIS_URL` nor `REDIS_URL` is set.
    #[error(
        "no lock manager configured: pass `manager = ...`, call `distlock::set_global`, \
         or set DISTLOCK_REDIS_URL or REDIS_URL"
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
        /// The error from the Redis client, or a timed-out I/O error.
        #[source]
        source: redis::RedisError,
    },

    /// The manager could not connect to Redis: unreachable, a TLS handshake that
    /// failed (an untrusted certificate), or a password that is missing or wrong.
    #[error("cannot connect to redis at {url}: {source}")]
    Connect {
        /// The URL, with any password removed.
        url: String,
        /// The error from the Redis client.
        #[source]
        source: redis::RedisError,
    },

    /// Redis answers, but cannot serve locks safely as configured: the ACL user
    /// may not run a command or touch a key or channel a lock needs, or (with
    /// [`reject_evicting_policy`](crate::LockManagerBuilder::reject_evicting_policy))
    /// its `maxmemory-policy` may evict held locks. Found by
    /// [`build`](crate::LockManagerBuilder::build), before any lock is taken.
    #[error("redis at {url} cannot serve locks: {reason}")]
    ServerCheck {
        /// The URL, with any password removed.
        url: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

impl LockError {
    /// The lock key this error concerns, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            LockError::Timeout { key, .. }
            | LockError::Lost { key }
            | LockError::NotHeld { key }
            | LockError::ForeignValue { key }
            | LockError::ShutDown { key }
            | LockError::NotReplicated { key, .. }
            | LockError::QuorumFailed { key, .. }
            | LockError::PermitsDiffer { key, .. }
            | LockError::UpgradeRefused { key }
            | LockError::InvalidKey { key, .. }
            | LockError::Backend { key, .. } => Some(key),
            LockError::InvalidConfig(_)
            | LockError::NotConfigured
            | LockError::Connect { .. }
            | LockError::ServerCheck { .. } => None,
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
                | LockError::QuorumFailed { .. }
                | LockError::Backend { .. }
                | LockError::Connect { .. }
        )
    }

    pub(crate) fn backend(key: &str, source: redis::RedisError) -> Self {
        LockError::Backend {
            key: key.to_owned(),
            source,
        }
    }

    pub(crate) fn command_timeout(key: &str, timeout: Duration) -> Self {
        let io = std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no reply within the command timeout of {timeout:?}"),
        );
        LockError::backend(key, redis::RedisError::from(io))
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
    fn long_keys_are_shortened_in_messages_only() {
        let key = "é".repeat(10_000);
        let e = LockError::Lost { key: key.clone() };
        let text = e.to_string();
        assert!(text.len() < 400, "{}", text.len());
        assert!(text.contains("(20000 bytes)"));
        assert_eq!(e.key(), Some(key.as_str()));
    }
}
