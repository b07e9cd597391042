//! `postgres_synchronous_standby`: the check, at `build()`, that every
//! commit of distlock's data connection waits for a synchronous standby.
//!
//! Why a commit must wait: with asynchronous replication a standby promoted
//! after the primary crashed may lack the last grants, renewals and fencing
//! tokens a holder was told about, and would hand the lock (and a token
//! again) to someone else. Under synchronous replication a commit returns to
//! its client only after a synchronous standby flushed its WAL (or wrote, or
//! applied it: `synchronous_commit` of `remote_write`, `on`, `remote_apply`),
//! and the committing transaction stays in progress to every other session
//! meanwhile: a hand-off's NOTIFY, queued at commit, is read by a listener
//! only once the transaction is no longer in progress, so the new holder
//! hears of its grant after the standby confirmed it too.
//!
//! A wait that is cancelled ends the other way: the commit, already in the
//! primary's WAL, becomes visible unconfirmed (PostgreSQL warns "the
//! transaction has already committed locally"). distlock never cancels: its
//! command timeout sends no cancel request, it only stops waiting for the
//! reply. `statement_timeout` does not reach the wait either (PostgreSQL
//! stops its timer before committing; `tests/postgres_failover.rs` holds a
//! grant under a shorter one). `transaction_timeout` (17+) counts the whole
//! transaction, so distlock's sessions turn it off, as a precaution; an
//! operator's `pg_cancel_backend` or `pg_terminate_backend` of a waiting
//! session still makes its commit visible unconfirmed.

use tokio_postgres::Client;

use super::{pg_message, Inner};
use crate::error::LockError;

/// The `synchronous_commit` values under which a commit waits for the
/// synchronous standbys (`local` and `off` do not).
const WAITING_COMMITS: [&str; 3] = ["on", "remote_write", "remote_apply"];

/// What the server says about replication, read in one statement.
#[derive(Debug)]
pub(super) struct Replication {
    /// This session's `synchronous_commit`.
    synchronous_commit: String,
    /// The server's `synchronous_standby_names`.
    standby_names: String,
    /// Standbys whose `sync_state` is `sync` or `quorum`.
    in_sync: i64,
    /// Standbys whose state this role may not read (`sync_state` NULL:
    /// `pg_stat_replication` hides it from roles without
    /// `pg_read_all_stats`).
    hidden: i64,
    /// Whether the server is itself a standby.
    in_recovery: bool,
    /// This session's `transaction_timeout`; `None` before PostgreSQL 17.
    transaction_timeout: Option<String>,
}

const READ: &str = "SELECT current_setting('synchronous_commit'), \
     current_setting('synchronous_standby_names'), \
     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')), \
     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL), \
     pg_is_in_recovery(), \
     current_setting('transaction_timeout', true)";

/// Reads [`Replication`] on `client`'s session.
pub(super) async fn read(client: &Client, inner: &Inner) -> Result<Replication, LockError> {
    let refused = |reason: String| LockError::ServerCheck {
        url: inner.shown_url.clone(),
        reason,
    };
    let rows = tokio::time::timeout(inner.command_timeout, client.query_typed(READ, &[]))
        .await
        .map_err(|_| LockError::command_timeout("", inner.command_timeout))?
        .map_err(|e| {
            refused(format!(
                "cannot read the replication settings: {}",
                pg_message(&e)
            ))
        })?;
    let read = rows.first().and_then(|row| {
        Some(Replication {
            synchronous_commit: row.try_get(0).ok()?,
            standby_names: row.try_get(1).ok()?,
            in_sync: row.try_get(2).ok()?,
            hidden: row.try_get(3).ok()?,
            in_recovery: row.try_get(4).ok()?,
            transaction_timeout: row.try_get(5).ok()?,
        })
    });
    read.ok_or_else(|| {
        refused("the replication settings' query answered no readable row".to_owned())
    })
}

impl Replication {
    /// The startup options (`-c name=value`) this session lacks for its
    /// commits to wait for the synchronous standbys until they confirm:
    /// empty when it has what it needs.
    pub(super) fn session_options(&self) -> Vec<&'static str> {
        let mut options = Vec::new();
        if !WAITING_COMMITS.contains(&self.synchronous_commit.as_str()) {
            options.push("-c synchronous_commit=on");
        }
        if self
            .transaction_timeout
            .as_deref()
            .is_some_and(|timeout| timeout != "0")
        {
            options.push("-c transaction_timeout=0");
        }
        options
    }

    /// What keeps a commit from being confirmed by a standby, if anything.
    fn missing(&self) -> Option<String> {
        if self.in_recovery {
            return Some(
                "the server is a standby (read-only); give distlock the primary's URL".to_owned(),
            );
        }
        if self.standby_names.trim().is_empty() {
            return Some(
                "synchronous_standby_names is empty, so commits wait for no standby: name the \
                 standby (or standbys) in it on the primary"
                    .to_owned(),
            );
        }
        if !self.session_options().is_empty() {
            return Some(format!(
                "distlock's sessions keep synchronous_commit = {:?} (transaction_timeout = \
                 {:?}) even when set as startup options (a pooler may drop them): commits must \
                 wait for the standby (on, remote_write or remote_apply) and no transaction \
                 timeout may cut that wait (ALTER ROLE ... SET synchronous_commit = on, \
                 transaction_timeout = 0)",
                self.synchronous_commit,
                self.transaction_timeout.as_deref().unwrap_or("0")
            ));
        }
        if self.in_sync == 0 && self.hidden > 0 {
            return Some(
                "this role cannot see the standbys' sync_state in pg_stat_replication: grant it \
                 pg_monitor (or pg_read_all_stats)"
                    .to_owned(),
            );
        }
        if self.in_sync == 0 {
            return Some(format!(
                "no standby is in sync now (synchronous_standby_names is {:?}, and \
                 pg_stat_replication shows none with sync_state sync or quorum): commits would \
                 wait until one is",
                self.standby_names
            ));
        }
        None
    }
}

/// Adds `options` to `pg`'s startup options, after whatever options the URL
/// gave (later settings win).
pub(super) fn set_in_session(pg: &mut tokio_postgres::Config, options: &[&str]) {
    let mut all: Vec<&str> = pg
        .get_options()
        .map(str::trim)
        .filter(|given| !given.is_empty())
        .into_iter()
        .collect();
    all.extend_from_slice(options);
    let all = all.join(" ");
    pg.options(&all);
}

/// Reads the replication state on `client` and refuses, with
/// [`LockError::ServerCheck`] naming what is missing, unless its commits
/// wait for a synchronous standby that is in sync now.
pub(super) async fn require_synchronous_standby(
    client: &Client,
    inner: &Inner,
) -> Result<(), LockError> {
    let found = read(client, inner).await?;
    match found.missing() {
        None => Ok(()),
        Some(reason) => Err(LockError::ServerCheck {
            url: inner.shown_url.clone(),
            reason: format!("postgres_synchronous_standby is on, but {reason}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(commit: &str, names: &str, in_sync: i64, hidden: i64) -> Replication {
        Replication {
            synchronous_commit: commit.to_owned(),
            standby_names: names.to_owned(),
            in_sync,
            hidden,
            in_recovery: false,
            transaction_timeout: None,
        }
    }

    #[test]
    fn a_session_that_would_not_wait_for_its_standby_gets_startup_options() {
        assert!(state("on", "s1", 1, 0).session_options().is_empty());
        assert_eq!(
            state("local", "s1", 1, 0).session_options(),
            ["-c synchronous_commit=on"]
        );
        let mut timed = state("remote_apply", "s1", 1, 0);
        timed.transaction_timeout = Some("1min".to_owned());
        assert_eq!(timed.session_options(), ["-c transaction_timeout=0"]);
        assert!(timed
            .missing()
            .unwrap_or_default()
            .contains("transaction_timeout"));
        timed.transaction_timeout = Some("0".to_owned());
        assert!(timed.session_options().is_empty());
    }

    #[test]
    fn each_missing_piece_is_named() {
        assert!(state("on", "s1", 1, 0).missing().is_none());
        assert!(state("remote_apply", "ANY 1 (a, b)", 2, 0)
            .missing()
            .is_none());
        let said = |s: Replication| s.missing().unwrap_or_default();
        assert!(said(state("on", "", 0, 0)).contains("synchronous_standby_names is empty"));
        assert!(said(state("local", "s1", 1, 0)).contains("synchronous_commit = \"local\""));
        assert!(said(state("on", "s1", 0, 1)).contains("pg_monitor"));
        assert!(said(state("on", "s1", 0, 0)).contains("no standby is in sync"));
        let mut standby = state("on", "s1", 1, 0);
        standby.in_recovery = true;
        assert!(said(standby).contains("is a standby"));
    }

    #[test]
    fn the_startup_options_keep_the_urls_own() {
        let mut pg: tokio_postgres::Config = "postgres://u@h/db?options=-c%20search_path%3Dx"
            .parse()
            .unwrap_or_else(|_| tokio_postgres::Config::new());
        set_in_session(&mut pg, &["-c synchronous_commit=on"]);
        assert_eq!(
            pg.get_options(),
            Some("-c search_path=x -c synchronous_commit=on")
        );
        let mut bare = tokio_postgres::Config::new();
        set_in_session(
            &mut bare,
            &["-c synchronous_commit=on", "-c transaction_timeout=0"],
        );
        assert_eq!(
            bare.get_options(),
            Some("-c synchronous_commit=on -c transaction_timeout=0")
        );
    }
}
