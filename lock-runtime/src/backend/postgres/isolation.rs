//! The isolation level of distlock's data sessions: READ COMMITTED, which
//! the schema's functions are written for, whatever the database or role
//! sets as its default.
//!
//! Each function takes the key's advisory lock and then reads and writes the
//! key's rows; under READ COMMITTED every statement after the lock wait sees
//! what the previous holder of that lock committed. Under REPEATABLE READ or
//! SERIALIZABLE (`ALTER DATABASE ... SET default_transaction_isolation`) the
//! snapshot is taken before the wait, so a release behind a waiter's queue
//! update, an acquire behind a release, or a renewal batch with one queued
//! lease fails with a serialization error (40001): never two holders, but
//! errors in the callers' hands for ordinary contention.

use tokio_postgres::Client;

use super::{pg_message, Inner};
use crate::error::LockError;

/// The level the functions need, as `transaction_isolation` names it.
const NEEDED: &str = "read committed";

/// The startup option that sets it for a session (the space escaped, as
/// PostgreSQL's `options` splits on spaces).
pub(super) const OPTION: &str = "-c default_transaction_isolation=read\\ committed";

/// The isolation level of a transaction on `client`'s session, or `None`
/// when it is READ COMMITTED.
pub(super) async fn other_level(
    client: &Client,
    inner: &Inner,
) -> Result<Option<String>, LockError> {
    let row = tokio::time::timeout(
        inner.command_timeout,
        // Unnamed, as every statement of the backend (a transaction-mode
        // pooler may send a named one's steps to different sessions).
        client.query_typed("SELECT current_setting('transaction_isolation')", &[]),
    )
    .await
    .map_err(|_| LockError::command_timeout("", inner.command_timeout))?
    .map_err(|e| LockError::ServerCheck {
        url: inner.shown_url.clone(),
        reason: format!("cannot read the isolation level: {}", pg_message(&e)),
    })?;
    let level: String = row
        .first()
        .ok_or_else(|| LockError::ServerCheck {
            url: inner.shown_url.clone(),
            reason: "cannot read the isolation level: no row".to_owned(),
        })?
        .try_get(0)
        .map_err(|e| LockError::ServerCheck {
            url: inner.shown_url.clone(),
            reason: format!("cannot read the isolation level: {}", pg_message(&e)),
        })?;
    Ok((level != NEEDED).then_some(level))
}

/// The refusal of a session that runs at `level` even with [`OPTION`] (a
/// pooler that drops or refuses startup options), or could not connect
/// with it (`connect`).
pub(super) fn refusal(inner: &Inner, level: &str, connect: Option<&LockError>) -> LockError {
    let cause = match connect {
        Some(e) => format!("failed to connect with it as a startup option ({e})"),
        None => "keeps it even with a startup option (a pooler may drop it)".to_owned(),
    };
    LockError::ServerCheck {
        url: inner.shown_url.clone(),
        reason: format!(
            "distlock's sessions run at {level:?} isolation, and its functions need read \
             committed (contention would fail with serialization errors); the session {cause}: \
             ALTER ROLE <distlock's role> SET default_transaction_isolation = 'read committed'"
        ),
    }
}
