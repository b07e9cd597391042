//! The calls every backend makes the same way: one script or command on the
//! server that holds a key's names. Each is a value implementing [`KeyCall`];
//! each backend says once how it runs one (`Single::on_key`: the current
//! connection under the command timeout; `Cluster::on_key`: the master of the
//! key's slot, through slot migrations; `Sentinel::on_key`: the current
//! master, once more on the next one after a failover), and Redlock runs it
//! on every member and counts the answers its own way.

use std::future::Future;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::RedisResult;

use super::scripts::{
    CounterOp, CounterReply, HeldLock, KeyReading, PermitReply, ReceiptTerms, Scripts,
    SharedRelease,
};
use super::ExpectedWaiters;
use crate::config::ReplicaAck;
use crate::keys::{CounterNames, KeyNames, RedisNames};

/// One call on the server that holds a key's names.
pub(crate) trait KeyCall: Sync {
    /// What the call answers.
    type Output: Send;

    /// Makes the call on `conn` (with `scripts`, which reload themselves on
    /// `NOSCRIPT`).
    fn call<C: ConnectionLike + Send>(
        &self,
        scripts: &Scripts,
        conn: &mut C,
    ) -> impl Future<Output = RedisResult<Self::Output>> + Send;

    /// How long the call may take beyond the command timeout (a `WAIT` for
    /// replicas pipelined after it).
    fn time_beyond_command_timeout(&self) -> Duration {
        Duration::ZERO
    }
}

/// Declares a call: its fields (borrowed from the caller) and the `Scripts`
/// method it makes.
macro_rules! key_call {
    ($(#[$doc:meta])* $name:ident { $($field:ident: $ty:ty),* $(,)? } -> $output:ty,
     |$scripts:ident, $conn:ident, $this:ident| $body:expr) => {
        $(#[$doc])*
        pub(crate) struct $name<'a> {
            $(pub(crate) $field: $ty,)*
        }

        impl KeyCall for $name<'_> {
            type Output = $output;

            fn call<C: ConnectionLike + Send>(
                &self,
                $scripts: &Scripts,
                $conn: &mut C,
            ) -> impl Future<Output = RedisResult<$output>> + Send {
                let $this = self;
                $body
            }
        }
    };
}

key_call!(
    /// Releases `owner`'s hold (or keeps it `keep_ms` more); true when it was
    /// still ours. `waiters` picks how it is sent (see `ExpectedWaiters`);
    /// `receipt` leaves a receipt that makes it safe to send again, drawn
    /// once for the call (see `Scripts::release`).
    Release {
        keys: &'a RedisNames,
        owner: &'a str,
        keep_ms: u64,
        waiters: ExpectedWaiters,
        receipt: Option<ReceiptTerms>,
    } -> bool,
    |scripts, conn, c| scripts.release(conn, c.keys, c.owner, c.keep_ms, c.waiters, c.receipt)
);

key_call!(
    /// Issues `owner`'s fencing token, or reads the one it has; `None` when
    /// the lock is not `owner`'s.
    IssueToken { keys: &'a RedisNames, owner: &'a str, fence_ttl_ms: u64 } -> Option<u64>,
    |scripts, conn, c| scripts.issue_token(conn, c.keys, c.owner, c.fence_ttl_ms)
);

/// [`IssueToken`] followed by a `WAIT` for `ack`'s replicas on the same
/// connection (`replica_ack`): the token, and how many replicas confirmed.
pub(crate) struct IssueTokenAcked<'a> {
    pub(crate) keys: &'a RedisNames,
    pub(crate) owner: &'a str,
    pub(crate) fence_ttl_ms: u64,
    pub(crate) ack: ReplicaAck,
}

impl KeyCall for IssueTokenAcked<'_> {
    type Output = (Option<u64>, u32);

    fn call<C: ConnectionLike + Send>(
        &self,
        scripts: &Scripts,
        conn: &mut C,
    ) -> impl Future<Output = RedisResult<Self::Output>> + Send {
        scripts.issue_token_acked(conn, self.keys, self.owner, self.fence_ttl_ms, &self.ack)
    }

    fn time_beyond_command_timeout(&self) -> Duration {
        self.ack.timeout
    }
}

key_call!(
    /// Raises the fencing counter to `token` and records it as `owner`'s
    /// (Redlock's write-back round); true when the lock was ours.
    RaiseFence {
        keys: &'a RedisNames,
        owner: &'a str,
        token: u64,
        fence_ttl_ms: u64,
    } -> bool,
    |scripts, conn, c| scripts.raise_fence(conn, c.keys, c.owner, c.token, c.fence_ttl_ms)
);

key_call!(
    /// Frees the default lock whoever holds it (or only if `only` does) and
    /// tells its waiters; true when it was held, `None` for a foreign value
    /// (left as it is). Its receipt, kept
    /// `receipt_ms` (0: none), makes it safe to send again.
    ForceUnlock {
        keys: &'a RedisNames,
        token: &'a str,
        only: &'a str,
        receipt_ms: u64,
    } -> Option<bool>,
    |scripts, conn, c| scripts.force_unlock(conn, c.keys, c.token, c.only, c.receipt_ms)
);

key_call!(
    /// Frees shared holds (a read-write lock's, a semaphore's); how many.
    ForceUnlockShared {
        names: &'a KeyNames,
        what: SharedRelease<'a>,
        token: &'a str,
        receipt_ms: u64,
    } -> u64,
    |scripts, conn, c| scripts.force_unlock_shared(conn, c.names, c.what, c.token, c.receipt_ms)
);

key_call!(
    /// Every hold on a key and the default lock's queue; `None` for a
    /// foreign value.
    InspectKey { names: &'a KeyNames } -> Option<KeyReading>,
    |scripts, conn, c| scripts.inspect_key(conn, c.names)
);

key_call!(
    /// The default lock's value and lease left, when held.
    Inspect { keys: &'a RedisNames } -> Option<HeldLock>,
    |scripts, conn, c| scripts.inspect(conn, c.keys)
);

key_call!(
    /// Whether the lock exists.
    IsLocked { keys: &'a RedisNames } -> bool,
    |scripts, conn, c| scripts.is_locked(conn, c.keys)
);

key_call!(
    /// Publishes `payload` on `channel` (classic PUBLISH: on a cluster, the
    /// bus carries it to every node); on a cluster the call goes to the
    /// master of the channel's slot.
    Publish { channel: &'a str, payload: &'a str } -> (),
    |_scripts, conn, c| async move {
        redis::cmd("PUBLISH")
            .arg(c.channel)
            .arg(c.payload)
            .query_async::<i64>(conn)
            .await
            .map(drop)
    }
);

key_call!(
    /// A semaphore's held permits and stored count.
    PermitCounts { keys: &'a RedisNames } -> PermitReply,
    |scripts, conn, c| scripts.permit_counts(conn, c.keys)
);

key_call!(
    /// Gives back part of a weighted semaphore hold, keeping the rest under
    /// `kept_owner`; true when the hold was still `owner`'s.
    PermitGiveBack { keys: &'a RedisNames, owner: &'a str, kept_owner: &'a str } -> bool,
    |scripts, conn, c| scripts.permit_give_back(conn, c.keys, c.owner, c.kept_owner)
);

key_call!(
    /// Splits a weighted semaphore hold into one hold per permit, under
    /// `permit_owners`; true when the hold was still `owner`'s.
    PermitSplit { keys: &'a RedisNames, owner: &'a str, permit_owners: &'a [String] } -> bool,
    |scripts, conn, c| scripts.permit_split(conn, c.keys, c.owner, c.permit_owners)
);

key_call!(
    /// Takes `wanted` permits of a counting semaphore, or records `owner` as
    /// waiting for `register_ms` (0: not waiting). Its receipt, kept
    /// `receipt_ms`, makes it safe to send again (see `counter_prelude.lua`).
    CounterAcquire {
        names: &'a CounterNames,
        owner: &'a str,
        wanted: i64,
        register_ms: u64,
        receipt_ms: u64,
    } -> CounterReply,
    |scripts, conn, c| scripts.counter_acquire(
        conn, c.names, c.owner, c.wanted, c.register_ms, c.receipt_ms
    )
);

key_call!(
    /// Changes or reads a counting semaphore; safe to send again, as
    /// `CounterAcquire`.
    CounterChange {
        names: &'a CounterNames,
        owner: &'a str,
        op: CounterOp,
        receipt_ms: u64,
    } -> CounterReply,
    |scripts, conn, c| scripts.counter_change(conn, c.names, c.owner, c.op, c.receipt_ms)
);
