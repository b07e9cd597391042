//! The counting semaphore on PostgreSQL: the counters' section of
//! `schema.sql` (`counters`, `counter_waiters` and their functions), called
//! with the replies and wake-ups of `counter_acquire.lua` and
//! `counter_change.lua`, so that `counting.rs` above is the same on both
//! stores.

use tokio_postgres::types::Type;

use super::{channel_ident, get, param, Postgres};
use crate::backend::scripts::{CounterOp, CounterOutcome, CounterReply};
use crate::backend::CallError;
use crate::keys::CounterNames;

/// The counters' statements, with the schema's name in them.
pub(super) struct CounterSql {
    acquire: String,
    change: String,
    pub(super) scan: String,
    pub(super) sweep: String,
}

impl CounterSql {
    pub(super) fn new(schema: &str) -> CounterSql {
        CounterSql {
            acquire: format!(
                "SELECT o_status, o_count, o_waiters FROM {schema}.counter_acquire($1, $2, $3, $4)"
            ),
            change: format!(
                "SELECT o_status, o_count, o_waiters FROM {schema}.counter_change(\
                 $1, $2, $3, $4, $5)"
            ),
            scan: format!("SELECT {schema}.scan_counters($1)"),
            sweep: format!("SELECT {schema}.sweep_counters($1)"),
        }
    }
}

/// The operation's name in `counter_change` and its amount.
fn op_and_amount(op: CounterOp) -> (&'static str, i64) {
    match op {
        CounterOp::Add(n) => ("add", n),
        CounterOp::TrySet(n) => ("try_set", n),
        CounterOp::Set(n) => ("set", n),
        CounterOp::Drain => ("drain", 0),
        CounterOp::Read => ("read", 0),
        CounterOp::Delete => ("delete", 0),
    }
}

/// A `(status, count, waiters)` row as a [`CounterReply`].
fn reply(key: &str, row: &tokio_postgres::Row) -> Result<CounterReply, CallError> {
    let status: i32 = get(key, row, 0)?;
    let count: i64 = get(key, row, 1)?;
    let waiters: i64 = get(key, row, 2)?;
    let outcome = match status {
        1 => CounterOutcome::Done,
        4 => CounterOutcome::Overflow,
        _ => CounterOutcome::NotDone,
    };
    Ok(CounterReply {
        outcome,
        count,
        waiters: u64::try_from(waiters).unwrap_or(0),
    })
}

impl Postgres {
    /// See `Backend::counter_acquire`: one function call.
    pub(crate) async fn counter_acquire(
        &self,
        key: &str,
        names: &CounterNames,
        owner: &str,
        wanted: i64,
        register_ms: u64,
    ) -> Result<CounterReply, CallError> {
        let inner = &self.inner;
        let register = super::ms(register_ms);
        let row = inner
            .one(
                key,
                &inner.counters.acquire,
                &[
                    param(&names.counter, Type::TEXT),
                    param(&owner, Type::TEXT),
                    param(&wanted, Type::INT8),
                    param(&register, Type::INT8),
                ],
            )
            .await?;
        reply(key, &row)
    }

    /// See `Backend::counter_change`: one function call.
    pub(crate) async fn counter_change(
        &self,
        key: &str,
        names: &CounterNames,
        owner: &str,
        op: CounterOp,
    ) -> Result<CounterReply, CallError> {
        let inner = &self.inner;
        let (op, amount) = op_and_amount(op);
        let wake = channel_ident(&self.inner.schema, &names.channel);
        let row = inner
            .one(
                key,
                &inner.counters.change,
                &[
                    param(&names.counter, Type::TEXT),
                    param(&owner, Type::TEXT),
                    param(&op, Type::TEXT),
                    param(&amount, Type::INT8),
                    param(&wake, Type::TEXT),
                ],
            )
            .await?;
        reply(key, &row)
    }
}
