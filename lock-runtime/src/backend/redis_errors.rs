//! redis-rs's errors as distlock's: the one place that reads a
//! `redis::RedisError`, so that [`BackendError`] and [`LockError`] name no
//! client type and a second store brings its own conversions beside these.

use crate::error::{BackendError, BackendErrorKind, LockError};

/// Whether the server answered with this error reply: any error code, one
/// redis-rs knows (`ErrorKind::Server`: `ERR`, `NOSCRIPT`, `READONLY`, ...)
/// or one it does not (`ErrorKind::Extension`: `OOM`, `BUSY`, `MISCONF`,
/// `NOREPLICAS`, `WRONGTYPE`, a script's own error). Such a reply is the
/// call's own: its connection is in step, and a write it refused was not
/// made. redis-rs builds an error with a code only from a server's reply.
pub(crate) fn server_answered(e: &redis::RedisError) -> bool {
    e.code().is_some()
}

/// Whether the server refused the connection's credentials or their rights:
/// a password missing or wrong, or an ACL user without the permission.
pub(crate) fn refused_authentication(e: &redis::RedisError) -> bool {
    const AUTH_CODES: [&str; 3] = ["NOPERM", "WRONGPASS", "NOAUTH"];
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || e.code().is_some_and(|c| AUTH_CODES.contains(&c))
}

impl BackendError {
    /// A redis-rs error, classified by what a caller can do about it.
    pub(crate) fn from_redis(e: redis::RedisError) -> Self {
        let code = e.code().map(str::to_owned);
        let kind = if e.is_timeout() {
            BackendErrorKind::Timeout
        } else if refused_authentication(&e) {
            BackendErrorKind::Auth
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            BackendErrorKind::Connection
        } else if code.is_some() {
            BackendErrorKind::Server
        } else if matches!(
            e.kind(),
            redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType
        ) {
            BackendErrorKind::Protocol
        } else {
            BackendErrorKind::Other
        };
        BackendError::from_client(kind, code, e)
    }
}

impl LockError {
    /// Redis failed on the call for lock `key`.
    pub(crate) fn backend(key: &str, source: redis::RedisError) -> Self {
        LockError::Backend {
            key: key.to_owned(),
            source: BackendError::from_redis(source),
        }
    }

    /// Redis at `url` (as shown, without credentials) could not be reached.
    pub(crate) fn connect(url: String, source: redis::RedisError) -> Self {
        LockError::Connect {
            url,
            source: BackendError::from_redis(source),
        }
    }
}
