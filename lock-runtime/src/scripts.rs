//! The three Lua scripts and how their replies are read.
//!
//! Every check-and-act on a lock is one script, so it is atomic on the server and
//! costs one round trip. `redis::Script` sends EVALSHA and, when the server answers
//! NOSCRIPT (first use, or after a restart), loads the script and retries.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Cmd, RedisResult, Script};

use crate::keys::LockKeys;

/// What the acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The lock is ours, with this fencing token.
    Acquired { fencing_token: u64 },
    /// Another owner holds it; `remaining` is its lease left, when it has one.
    Busy { remaining: Option<Duration> },
}

pub(crate) struct Scripts {
    acquire: Script,
    release: Script,
    renew: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            acquire: Script::new(include_str!("scripts/acquire.lua")),
            release: Script::new(include_str!("scripts/release.lua")),
            renew: Script::new(include_str!("scripts/renew.lua")),
        }
    }

    pub(crate) async fn acquire(
        &self,
        conn: &mut ConnectionManager,
        keys: &LockKeys,
        owner: &str,
        lease_ms: u64,
    ) -> RedisResult<AcquireReply> {
        let (status, value): (i64, i64) = self
            .acquire
            .key(&keys.lock)
            .key(&keys.fence)
            .arg(owner)
            .arg(lease_ms)
            .invoke_async(conn)
            .await?;
        Ok(if status == 1 {
            AcquireReply::Acquired {
                fencing_token: u64::try_from(value).unwrap_or(0),
            }
        } else {
            AcquireReply::Busy {
                remaining: u64::try_from(value).ok().map(Duration::from_millis),
            }
        })
    }

    /// Deletes the lock if `owner` holds it and publishes a wake-up; true when it did.
    pub(crate) async fn release(
        &self,
        conn: &mut ConnectionManager,
        keys: &LockKeys,
        owner: &str,
    ) -> RedisResult<bool> {
        let released: i64 = self
            .release
            .key(&keys.lock)
            .arg(owner)
            .arg(&keys.channel)
            .invoke_async(conn)
            .await?;
        Ok(released == 1)
    }

    /// The release script over a blocking connection, for runtime shutdown.
    pub(crate) fn release_blocking(
        &self,
        conn: &mut redis::Connection,
        keys: &LockKeys,
        owner: &str,
    ) -> RedisResult<bool> {
        let released: i64 = self
            .release
            .key(&keys.lock)
            .arg(owner)
            .arg(&keys.channel)
            .invoke(conn)?;
        Ok(released == 1)
    }

    /// One EVALSHA of the renew script, for a pipeline of renewals (the pipeline
    /// handles NOSCRIPT itself through [`Scripts::load_renew`]).
    pub(crate) fn renew_cmd(&self, lock_key: &str, owner: &str, lease_ms: u64) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.renew.get_hash())
            .arg(1)
            .arg(lock_key)
            .arg(owner)
            .arg(lease_ms);
        cmd
    }

    pub(crate) async fn load_renew(&self, conn: &mut ConnectionManager) -> RedisResult<()> {
        self.renew.prepare_invoke().load_async(conn).await.map(drop)
    }
}
