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
}

const READ: &str = "SELECT current_setting('synchronous_commit'), \
     current_setting('synchronous_standby_names'), \
     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')), \
     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL), \
     pg_is_in_recovery()";

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
        })
    });
    read.ok_or_else(|| {
        refused("the replication settings' query answered no readable row".to_owned())
    })
}

impl Replication {
    /// Whether this session's commits wait for the synchronous standbys.
    pub(super) fn commits_wait_for_standby(&self) -> bool {
        WAITING_COMMITS.contains(&self.synchronous_commit.as_str())
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
        if !self.commits_wait_for_standby() {
            return Some(format!(
                "synchronous_commit is {:?} for distlock's sessions even when set as a startup \
                 option (a pooler may drop it): it must be on, remote_write or remote_apply \
                 (ALTER ROLE ... SET synchronous_commit = on)",
                self.synchronous_commit
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

/// Makes `pg`'s sessions wait for the synchronous standbys at commit:
/// `-c synchronous_commit=on` added to its startup options, after whatever
/// options the URL gave.
pub(super) fn wait_in_this_session(pg: &mut tokio_postgres::Config) {
    let options = match pg.get_options() {
        Some(given) if !given.trim().is_empty() => {
            format!("{given} -c synchronous_commit=on")
        }
        _ => "-c synchronous_commit=on".to_owned(),
    };
    pg.options(&options);
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
        }
    }

    #[test]
    fn each_missing_piece_is_named() {
        assert!(state("on", "s1", 1, 0).missing().is_none());
        assert!(state("remote_apply", "ANY 1 (a, b)", 2, 0)
            .missing()
            .is_none());
        let said = |s: Replication| s.missing().unwrap_or_default();
        assert!(said(state("on", "", 0, 0)).contains("synchronous_standby_names is empty"));
        assert!(said(state("local", "s1", 1, 0)).contains("synchronous_commit is \"local\""));
        assert!(said(state("on", "s1", 0, 1)).contains("pg_monitor"));
        assert!(said(state("on", "s1", 0, 0)).contains("no standby is in sync"));
        let mut standby = state("on", "s1", 1, 0);
        standby.in_recovery = true;
        assert!(said(standby).contains("is a standby"));
    }

    #[test]
    fn the_startup_option_keeps_the_urls_own() {
        let mut pg: tokio_postgres::Config = "postgres://u@h/db?options=-c%20search_path%3Dx"
            .parse()
            .unwrap_or_else(|_| tokio_postgres::Config::new());
        wait_in_this_session(&mut pg);
        assert_eq!(
            pg.get_options(),
            Some("-c search_path=x -c synchronous_commit=on")
        );
        let mut bare = tokio_postgres::Config::new();
        wait_in_this_session(&mut bare);
        assert_eq!(bare.get_options(), Some("-c synchronous_commit=on"));
    }
}
