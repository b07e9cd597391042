//! Read-write locks and semaphores on PostgreSQL: the shared holds' section
//! of `schema.sql` (`shared_holds`, `shared_keys` and their functions),
//! called here with the replies and wake-ups of the Redis scripts they
//! mirror (`write_acquire.lua`, `read_acquire.lua`, `permit_acquire.lua`,
//! their releases, `permit_give_back.lua`, `permit_split.lua`,
//! `force_unlock_shared.lua`, `inspect_key.lua`), so that the waiting layer
//! and the guards above are the same on both stores.
//!
//! A family's rows are keyed by one name: a read-write lock's writer name
//! (its readers' holds included, so that one transaction lock serialises
//! both sides) or a semaphore's name ([`family_name`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::types::Type;

use super::{channel_ident, get, ms, param, protocol, Postgres};
use crate::backend::scripts::{
    AcquireReply, AcquireSpec, HeldLock, KeyReading, PermitReply, SharedHolder, SharedRelease,
};
use crate::backend::{CallError, LeaseEnd, Renewal};
use crate::keys::{KeyNames, LockKind, RedisNames};
use crate::lease::Lease;

/// The statements of the shared holds, with the schema's name in them.
pub(super) struct SharedSql {
    write_acquire: String,
    read_acquire: String,
    permit_acquire: String,
    pub(super) release: String,
    give_back: String,
    split: String,
    counts: String,
    renew: String,
    issue_token: String,
    force_unlock: String,
    pub(super) inspect_key: String,
    pub(super) scan: String,
    pub(super) sweep: String,
}

impl SharedSql {
    pub(super) fn new(schema: &str) -> SharedSql {
        let acquire = |function: &str, params: &str| {
            format!("SELECT o_status, o_token, o_remaining_ms FROM {schema}.{function}({params})")
        };
        SharedSql {
            write_acquire: acquire("write_acquire", "$1, $2, $3, $4, $5, $6, $7"),
            read_acquire: acquire("read_acquire", "$1, $2, $3, $4, $5, $6, $7"),
            permit_acquire: acquire("permit_acquire", "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10"),
            release: format!("SELECT {schema}.shared_release($1, $2, $3, $4, $5)"),
            give_back: format!("SELECT {schema}.permit_give_back($1, $2, $3, $4)"),
            split: format!("SELECT {schema}.permit_split($1, $2, $3)"),
            counts: format!("SELECT held, stored FROM {schema}.permit_counts($1)"),
            renew: format!("SELECT i, renewed FROM {schema}.shared_renew($1, $2, $3, $4)"),
            issue_token: format!("SELECT {schema}.write_issue_token($1, $2)"),
            force_unlock: format!(
                "SELECT {schema}.force_unlock_shared($1, $2, $3, $4, $5, $6, $7)"
            ),
            // One statement, so one round trip, for the default lock's part
            // and the shared kinds' part of an operator's reading.
            inspect_key: format!(
                "SELECT i.value, i.pttl, i.queue_owners, i.queue_entries, i.now_ms, \
                 s.writer, s.writer_pttl, s.reader_owners, s.reader_ends, s.reader_details, \
                 s.writer_waiting, s.permit_owners, s.permit_ends, s.permit_details, \
                 s.permit_count, c.counter, c.counter_waiters \
                 FROM {schema}.inspect($1) i CROSS JOIN {schema}.inspect_shared($2, $3) s \
                 CROSS JOIN {schema}.inspect_counter($4) c"
            ),
            scan: format!("SELECT {schema}.scan_shared($1)"),
            sweep: format!("SELECT {schema}.sweep_shared($1)"),
        }
    }
}

/// The name a hold's rows are kept under: a read-write lock's writer name
/// for its writer and its readers alike (a read hold's own name is its
/// readers' set on Redis), a semaphore's own name.
pub(super) fn family_name(keys: &RedisNames) -> &str {
    match keys.kind {
        LockKind::Read => keys.related(),
        _ => &keys.lock,
    }
}

/// The `kind` column of a hold of `kind` (the default lock has no rows
/// here; its callers never pass it).
pub(super) fn kind_code(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Read => "r",
        LockKind::Permit { .. } => "p",
        LockKind::Write | LockKind::Exclusive => "w",
    }
}

fn token_of(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

impl Postgres {
    /// See `Backend::acquire`, for a write, read or permit hold: one
    /// function call.
    pub(super) async fn acquire_shared(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Result<AcquireReply, CallError> {
        let inner = &self.inner;
        let name = family_name(keys);
        let fence = spec.fence_ttl_ms.is_some();
        let (lease, since) = (ms(lease_ms), ms(spec.since_ms));
        let common = [
            param(&name, Type::TEXT),
            param(&owner, Type::TEXT),
            param(&lease, Type::INT8),
            param(&fence, Type::BOOL),
            param(&spec.waiting, Type::BOOL),
        ];
        let row = match keys.kind {
            LockKind::Permit { permits } => {
                let permits = i64::from(permits);
                let waiting_weight = i64::from(spec.largest_waiting_weight);
                let mut params = common.to_vec();
                params.extend([
                    param(&permits, Type::INT8),
                    param(&spec.resize_permits, Type::BOOL),
                    param(&since, Type::INT8),
                    param(&spec.holder, Type::TEXT),
                    param(&waiting_weight, Type::INT8),
                ]);
                inner
                    .one(key, &inner.shared.permit_acquire, &params)
                    .await?
            }
            kind => {
                let sql = if kind == LockKind::Read {
                    &inner.shared.read_acquire
                } else {
                    &inner.shared.write_acquire
                };
                let mut params = common.to_vec();
                params.extend([param(&since, Type::INT8), param(&spec.holder, Type::TEXT)]);
                inner.one(key, sql, &params).await?
            }
        };
        let status: i32 = get(key, &row, 0)?;
        let value: i64 = get(key, &row, 1)?;
        let remaining: i64 = get(key, &row, 2)?;
        Ok(match status {
            // A permit's grant says in its third column how many permits
            // are left free (see permit_acquire in schema.sql).
            1 => AcquireReply::Acquired {
                fencing_token: token_of(value),
                permits_left: match keys.kind {
                    LockKind::Permit { .. } => u32::try_from(remaining).unwrap_or(0),
                    _ => 0,
                },
            },
            2 => AcquireReply::PermitsDiffer {
                held_with: u32::try_from(value).unwrap_or(u32::MAX),
            },
            _ => AcquireReply::Busy {
                remaining: Some(Duration::from_millis(u64::try_from(remaining).unwrap_or(0))),
            },
        })
    }

    /// See `Backend::release`, for a write, read or permit hold (a writer
    /// also withdraws its intent): one function call.
    pub(super) async fn release_shared(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> Result<bool, CallError> {
        let inner = &self.inner;
        let wake = channel_ident(&self.inner.schema, keys.channel());
        let keep = ms(keep_ms);
        let row = inner
            .one(
                key,
                &inner.shared.release,
                &[
                    param(&family_name(keys), Type::TEXT),
                    param(&kind_code(keys.kind), Type::TEXT),
                    param(&owner, Type::TEXT),
                    param(&keep, Type::INT8),
                    param(&wake, Type::TEXT),
                ],
            )
            .await?;
        get(key, &row, 0)
    }

    /// See `Backend::issue_token`, for a write hold.
    pub(super) async fn issue_write_token(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
    ) -> Result<Option<u64>, CallError> {
        let inner = &self.inner;
        let row = inner
            .one(
                key,
                &inner.shared.issue_token,
                &[
                    param(&family_name(keys), Type::TEXT),
                    param(&owner, Type::TEXT),
                ],
            )
            .await?;
        let token: Option<i64> = get(key, &row, 0)?;
        Ok(token.map(token_of))
    }

    /// See `Backend::permit_counts`: reads only (expired holders are left
    /// for the next acquisition or the sweep, and never counted).
    pub(crate) async fn permit_counts(
        &self,
        key: &str,
        keys: &RedisNames,
    ) -> Result<PermitReply, CallError> {
        let inner = &self.inner;
        let row = inner
            .one(key, &inner.shared.counts, &[param(&keys.lock, Type::TEXT)])
            .await?;
        let held: i64 = get(key, &row, 0)?;
        let stored: Option<i64> = get(key, &row, 1)?;
        Ok(PermitReply::Counts {
            held: u32::try_from(held).unwrap_or(u32::MAX),
            stored: stored.map(|s| u32::try_from(s).unwrap_or(0)),
        })
    }

    /// See `Backend::permit_give_back`: one function call.
    pub(crate) async fn permit_give_back(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        kept_owner: &str,
    ) -> Result<bool, CallError> {
        let inner = &self.inner;
        let wake = channel_ident(&self.inner.schema, keys.channel());
        let row = inner
            .one(
                key,
                &inner.shared.give_back,
                &[
                    param(&keys.lock, Type::TEXT),
                    param(&owner, Type::TEXT),
                    param(&kept_owner, Type::TEXT),
                    param(&wake, Type::TEXT),
                ],
            )
            .await?;
        get(key, &row, 0)
    }

    /// See `Backend::permit_split`: one function call.
    pub(crate) async fn permit_split(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        permit_owners: &[String],
    ) -> Result<bool, CallError> {
        let inner = &self.inner;
        let row = inner
            .one(
                key,
                &inner.shared.split,
                &[
                    param(&keys.lock, Type::TEXT),
                    param(&owner, Type::TEXT),
                    param(&permit_owners, Type::TEXT_ARRAY),
                ],
            )
            .await?;
        get(key, &row, 0)
    }

    /// See `Backend::force_unlock_shared`: one function call.
    pub(crate) async fn force_unlock_shared(
        &self,
        key: &str,
        names: &KeyNames,
        what: SharedRelease<'_>,
        token: &str,
    ) -> Result<u64, CallError> {
        let inner = &self.inner;
        let (mode, owner) = match what {
            SharedRelease::All => ("all", ""),
            SharedRelease::Writer(owner) => ("write", owner),
            SharedRelease::Reader(owner) => ("read", owner),
            SharedRelease::Permit(member) => ("permit", member),
        };
        let (rw, sem) = (&names.read_write, &names.semaphore);
        let rw_wake = channel_ident(&self.inner.schema, rw.channel());
        let sem_wake = channel_ident(&self.inner.schema, sem.channel());
        let row = inner
            .one(
                key,
                &inner.shared.force_unlock,
                &[
                    param(&rw.lock, Type::TEXT),
                    param(&sem.lock, Type::TEXT),
                    param(&rw_wake, Type::TEXT),
                    param(&sem_wake, Type::TEXT),
                    param(&token, Type::TEXT),
                    param(&mode, Type::TEXT),
                    param(&owner, Type::TEXT),
                ],
            )
            .await?;
        let freed: i64 = get(key, &row, 0)?;
        Ok(u64::try_from(freed).unwrap_or(0))
    }

    /// See `Backend::inspect_key`: the default lock and its queue, the
    /// read-write lock, the semaphore and the counting semaphore, in one
    /// statement.
    pub(crate) async fn inspect_key(
        &self,
        key: &str,
        names: &KeyNames,
    ) -> Result<Option<KeyReading>, CallError> {
        let inner = &self.inner;
        let row = inner
            .one(
                key,
                &inner.shared.inspect_key,
                &[
                    param(&names.lock.lock, Type::TEXT),
                    param(&names.read_write.lock, Type::TEXT),
                    param(&names.semaphore.lock, Type::TEXT),
                    param(&names.counter.counter, Type::TEXT),
                ],
            )
            .await?;
        let mut reading = super::key_reading(key, &row)?;
        let writer: Option<String> = get(key, &row, 5)?;
        let writer_pttl: Option<i64> = get(key, &row, 6)?;
        reading.writer = writer.map(|value| HeldLock {
            value,
            pttl: writer_pttl.unwrap_or(-1).max(1),
        });
        reading.readers = holders(key, &row, 7)?;
        reading.writer_waiting = get(key, &row, 10)?;
        reading.permit_holders = holders(key, &row, 11)?;
        let count: Option<i64> = get(key, &row, 14)?;
        reading.permit_count = count.map(|c| u32::try_from(c).unwrap_or(0));
        reading.counter = get(key, &row, 15)?;
        let counter_waiters: i64 = get(key, &row, 16)?;
        reading.counter_waiters = u64::try_from(counter_waiters).unwrap_or(0);
        Ok(Some(reading))
    }

    /// Renews the leases of write, read and permit holds of a batch (the
    /// default lock's are `renew`'s): one statement.
    pub(super) async fn renew_shared(&self, batch: &[&Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        let inner = &self.inner;
        let names: Vec<&str> = batch.iter().map(|l| family_name(&l.keys)).collect();
        let owners: Vec<&str> = batch.iter().map(|l| l.owner.as_str()).collect();
        let leases: Vec<i64> = batch.iter().map(|l| ms(l.lease_ms())).collect();
        let sent_at = Instant::now();
        let rows = inner
            .query(
                "",
                &inner.shared.renew,
                &[
                    param(&names, Type::TEXT_ARRAY),
                    param(&owners, Type::TEXT_ARRAY),
                    param(&leases, Type::INT8_ARRAY),
                    param(&(end == LeaseEnd::ExactlyALease), Type::BOOL),
                ],
            )
            .await;
        super::renewals(batch.len(), rows, sent_at)
    }
}

/// The holders in columns `first..first + 3` of an `inspect_shared` row:
/// owner tokens, lease ends (server ms), details.
fn holders(
    key: &str,
    row: &tokio_postgres::Row,
    first: usize,
) -> Result<Vec<SharedHolder>, CallError> {
    let members: Vec<String> = get(key, row, first)?;
    let ends: Vec<i64> = get(key, row, first + 1)?;
    let details: Vec<String> = get(key, row, first + 2)?;
    if members.len() != ends.len() || members.len() != details.len() {
        return Err(protocol(
            key,
            "an inspect_shared holder list of uneven length".to_owned(),
        ));
    }
    Ok(members
        .into_iter()
        .zip(ends)
        .zip(details)
        .map(|((member, ends_ms), details)| SharedHolder {
            member,
            ends_ms,
            details: Some(details),
        })
        .collect())
}
