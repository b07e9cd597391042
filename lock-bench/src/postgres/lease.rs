//! The lease-row floor's SQL, by hand on tokio-postgres: the one place that speaks
//! to the bench's own lease table. It is the least a durable lease row costs (one
//! upsert, one update), and the NOTIFY hand-off and renewal floors are built on it.
//! distlock's own statements by hand (its schema's functions, which also keep the
//! queue, the holder's description and the hand-off channel) are a floor of their
//! own in `uncontended.rs` (`PgCycler::SameSql`).

use tokio_postgres::{Client, Statement};

use crate::error::{context, Result};

/// The table and the sequence; `CREATE ... IF NOT EXISTS`, run once per server.
pub const SCHEMA: &str = include_str!("../sql/schema.sql");

/// The lease-row statements, prepared on one connection.
#[derive(Clone)]
pub struct LeaseSql {
    acquire: Statement,
    release: Statement,
    release_notify: Statement,
    renew: Statement,
    hold_many: Statement,
    free_owner: Statement,
}

impl LeaseSql {
    /// Prepares every statement on `client` (prepared statements belong to a
    /// connection, so each connection of a floor prepares its own).
    pub async fn prepare(client: &Client) -> Result<LeaseSql> {
        let prepare = |sql: &'static str| async move {
            client
                .prepare(sql)
                .await
                .map_err(context("preparing the lease-row floor's SQL"))
        };
        Ok(LeaseSql {
            acquire: prepare(include_str!("../sql/acquire.sql")).await?,
            release: prepare(include_str!("../sql/release.sql")).await?,
            release_notify: prepare(include_str!("../sql/release_notify.sql")).await?,
            renew: prepare(include_str!("../sql/renew.sql")).await?,
            hold_many: prepare(include_str!("../sql/hold_many.sql")).await?,
            free_owner: prepare(include_str!("../sql/free_owner.sql")).await?,
        })
    }

    /// One statement: the fencing token of a new hold, or `None` when the lock is
    /// held and not expired.
    pub async fn acquire(
        &self,
        client: &Client,
        key: &str,
        owner: &str,
        lease_secs: f64,
    ) -> Result<Option<i64>> {
        let row = client
            .query_opt(&self.acquire, &[&key, &owner, &lease_secs])
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// One statement: frees the hold; whether it was still this owner's.
    pub async fn release(
        &self,
        client: &Client,
        key: &str,
        owner: &str,
        token: i64,
    ) -> Result<bool> {
        Ok(client
            .execute(&self.release, &[&key, &owner, &token])
            .await?
            == 1)
    }

    /// One statement: frees the hold and notifies `channel` with `payload` at its
    /// commit (only when it freed it); whether it did.
    pub async fn release_notify(
        &self,
        client: &Client,
        key: &str,
        owner: &str,
        token: i64,
        channel: &str,
        payload: &str,
    ) -> Result<bool> {
        Ok(client
            .query_opt(
                &self.release_notify,
                &[&key, &owner, &token, &channel, &payload],
            )
            .await?
            .is_some())
    }

    /// One statement for the whole batch: extends every hold in `keys` and
    /// `tokens` still owned by `owner`; how many it extended.
    pub async fn renew(
        &self,
        client: &Client,
        keys: &[String],
        tokens: &[i64],
        owner: &str,
        lease_secs: f64,
    ) -> Result<u64> {
        Ok(client
            .execute(&self.renew, &[&keys, &tokens, &owner, &lease_secs])
            .await?)
    }

    /// One statement: takes every (fresh) key in `keys`; their tokens, in the
    /// order of `keys`.
    pub async fn hold_many(
        &self,
        client: &Client,
        keys: &[String],
        owner: &str,
        lease_secs: f64,
    ) -> Result<Vec<i64>> {
        let rows = client
            .query(&self.hold_many, &[&keys, &owner, &lease_secs])
            .await?;
        let by_key: std::collections::HashMap<String, i64> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        keys.iter()
            .map(|k| {
                by_key
                    .get(k)
                    .copied()
                    .ok_or_else(|| format!("hold_many did not take {k}").into())
            })
            .collect()
    }

    /// One statement: deletes every row `owner` holds; how many.
    pub async fn free_owner(&self, client: &Client, owner: &str) -> Result<u64> {
        Ok(client.execute(&self.free_owner, &[&owner]).await?)
    }
}
