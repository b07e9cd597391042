//! The Lua scripts and how their replies are read.
//!
//! Every check-and-act on a lock is one script, so it is atomic on the server and
//! costs one round trip (EVALSHA; on NOSCRIPT, after a restart or a flush, the
//! script is loaded and the call repeated).
//!
//! Every reply echoes the owner token of its request, and the client checks it:
//! Redis replies carry no request id, so a connection that ever lost a reply
//! would hand each later reply to the wrong caller. A mismatch is an error that
//! also retires the connection (see `single::Single::call`).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult};

use super::{is_noscript, ExpectedWaiters, LeaseEnd};
use crate::config::ReplicaAck;
use crate::keys::{CounterNames, KeyNames, LockKind, RedisNames};

/// What the acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// The lock is ours, with this fencing token; a semaphore has
    /// `permits_left` permits still free (0 for the other kinds), for the
    /// next waiter of the caller's manager.
    Acquired {
        fencing_token: u64,
        permits_left: u32,
    },
    /// Another owner holds it; `remaining` is its lease left, when it has one.
    Busy { remaining: Option<Duration> },
    /// A semaphore's holders use `held_with` permits, and the request gave
    /// another count without asking to resize.
    PermitsDiffer { held_with: u32 },
    /// The lock's Redis name holds a value distlock did not write; nothing
    /// was changed.
    Foreign,
    /// Not taken (`Foreign` when `foreign`, else `Busy { remaining }`), but
    /// a grant that a member made in the caller's name may be left there:
    /// Redlock, when a member that did not answer the attempt could not be
    /// told to give it back either. The caller gives it back by its owner
    /// token once it leaves without the lock.
    LeftBehind {
        foreign: bool,
        remaining: Option<Duration>,
    },
}

/// What the acquire-all script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireAllReply {
    /// Every lock is ours, with these fencing tokens (in the order asked).
    Acquired { fencing_tokens: Vec<u64> },
    /// Lock `index` (0-based) is held by another owner for `remaining` more;
    /// none was taken.
    Busy {
        index: usize,
        remaining: Option<Duration>,
    },
    /// Lock `index` (0-based) holds a value distlock did not write; none was
    /// taken.
    Foreign { index: usize },
}

/// What an acquire writes into the lock besides its owner token and lease.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireSpec<'a> {
    /// TTL of the fencing counter (lease + retention) when the token is
    /// issued with the acquisition (eager fencing); `None` when it is not
    /// (the token is 0 until the holder asks for one, see `issue_token.lua`).
    pub(crate) fence_ttl_ms: Option<u64>,
    /// The caller listens for this lock's wake-ups: it marks the lock, so the
    /// holder's release publishes one.
    pub(crate) waiting: bool,
    /// Acquisition time, client clock, milliseconds since the Unix epoch.
    pub(crate) since_ms: u64,
    /// The holder's description, for operators.
    pub(crate) holder: &'a str,
    /// For a semaphore: replace the permit count its holders use with this
    /// request's (an explicit resize) rather than refuse a different one.
    pub(crate) resize_permits: bool,
    /// For a semaphore: the most permits a waiter of the caller's manager
    /// waits for (the caller's own included; 1 when it does not wait), for
    /// the script to record (see `scripts/permit_acquire.lua`).
    pub(crate) largest_waiting_weight: u32,
    /// For the default lock: a waiting caller queues up in Redis (false on a
    /// Redlock member: it only marks the lock, see `scripts/acquire.lua`).
    pub(crate) queue: bool,
    /// For the default lock: how long the caller's queue entry lasts unless
    /// its next attempt refreshes it (milliseconds).
    pub(crate) queue_lease_ms: u64,
    /// For the default lock: the TTL the lock gets when a release hands it to
    /// the caller (see `scripts/acquire.lua`).
    pub(crate) handoff_ttl_ms: u64,
    /// For the default lock: the hand-off route of the caller's manager
    /// (hex), kept in its queue entry; a hand-off to the caller is published
    /// on `<channel>:<route>` (see `scripts/queue_prelude.lua`).
    pub(crate) handoff_route: &'a str,
    /// For the default lock: the number of this attempt, kept in the queue
    /// entry and echoed by a hand-off that consumes it.
    pub(crate) attempt: u32,
}

impl<'a> AcquireSpec<'a> {
    /// An acquisition begun now that does not wait: nothing to mark, queue
    /// or hand off. `fence_ttl_ms` as the field says.
    pub(crate) fn without_waiting(holder: &'a str, fence_ttl_ms: Option<u64>) -> Self {
        AcquireSpec {
            fence_ttl_ms,
            waiting: false,
            since_ms: crate::info::now_ms(),
            holder,
            resize_permits: false,
            largest_waiting_weight: 1,
            queue: false,
            queue_lease_ms: 0,
            handoff_ttl_ms: 0,
            handoff_route: "",
            attempt: 0,
        }
    }
}

/// One script: its source, for SCRIPT LOAD, and its SHA1, for EVALSHA.
struct Lua {
    source: &'static str,
    hash: String,
}

impl Lua {
    fn new(source: &'static str) -> Self {
        Lua {
            source,
            hash: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// `EVALSHA hash numkeys keys...`, with room for `args` more arguments of
    /// about `args_len` bytes in all, so that adding them does not reallocate.
    /// Numbers are added as numbers (`Cmd::arg` formats them in place), not as
    /// `String`s.
    fn call(&self, keys: &[&str], args: usize, args_len: usize) -> Cmd {
        let keys_len: usize = keys.iter().map(|k| k.len()).sum();
        let mut cmd = Cmd::with_capacity(3 + keys.len() + args, 64 + keys_len + args_len);
        cmd.arg("EVALSHA").arg(&self.hash).arg(keys.len()).arg(keys);
        cmd
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        match cmd.query_async(conn).await {
            Err(e) if is_noscript(&e) => {
                self.load(conn).await?;
                cmd.query_async(conn).await
            }
            other => other,
        }
    }

    /// [`Lua::invoke`] of `cmd` behind a `PING`, both in one write: the
    /// server runs the two in one go, and the `PING`'s reply makes the caller
    /// a client with output pending before the script runs. Redis (and
    /// Valkey) write the clients with pending output most recent first, so a
    /// subscriber that the script publishes to is written before the caller,
    /// where it would otherwise come after. For a hand-off, the waiter's
    /// message then leaves first, and on a busy machine the waiter's reader
    /// gets a CPU before the holder's: the hand-off is that much shorter.
    ///
    /// The script's reply is read as a single command's (`ignore_errors`):
    /// its error keeps its own kind and code (a pipeline's error would be a
    /// pipeline failure), and a `PING` refused (an ACL without it) costs
    /// nothing, the release having run. Not for a cluster connection (see
    /// `Scripts::ping_before_handoff`).
    async fn invoke_after_ping<T: redis::FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors()
            .cmd("PING")
            .ignore()
            .add_command(cmd.clone());
        let (reply,): (redis::Value,) = pipe.query_async(conn).await?;
        match reply.extract_error() {
            Ok(value) => Ok(redis::from_redis_value(value)?),
            Err(e) if is_noscript(&e) => {
                self.load(conn).await?;
                cmd.query_async(conn).await
            }
            Err(e) => Err(e),
        }
    }

    fn invoke_blocking<T: redis::FromRedisValue>(
        &self,
        conn: &mut redis::Connection,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        match cmd.query(conn) {
            Err(e) if is_noscript(&e) => {
                let hash: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(self.source)
                    .query(conn)?;
                self.check_loaded(&hash)?;
                cmd.query(conn)
            }
            other => other,
        }
    }

    async fn load(&self, conn: &mut impl ConnectionLike) -> RedisResult<()> {
        let hash: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(self.source)
            .query_async(conn)
            .await?;
        self.check_loaded(&hash)
    }

    fn check_loaded(&self, hash: &str) -> RedisResult<()> {
        if hash == self.hash {
            Ok(())
        } else {
            Err(out_of_sync(
                "SCRIPT LOAD answered with another script's hash",
            ))
        }
    }
}

/// The error for a reply that belongs to another request.
pub(crate) fn out_of_sync(detail: &str) -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "reply does not belong to this request: the connection is out of sync",
        detail.to_owned(),
    ))
}

/// A pipeline reply as `T`, a server error as itself.
fn from_value<T: redis::FromRedisValue>(value: redis::Value) -> RedisResult<T> {
    match value {
        redis::Value::ServerError(e) => Err(RedisError::from(e)),
        value => redis::from_redis_value(value).map_err(RedisError::from),
    }
}

/// An acquire script's reply: `{status, value, owner}`, and for a permit
/// granted, a fourth item: the permits left free (see `permit_acquire.lua`).
fn read_acquire(reply: Vec<redis::Value>, owner: &str) -> RedisResult<AcquireReply> {
    let mut items = reply.into_iter();
    let (Some(status), Some(value), Some(echoed)) = (items.next(), items.next(), items.next())
    else {
        return Err(out_of_sync("an acquire reply of the wrong length"));
    };
    let status: i64 = redis::from_redis_value(status)?;
    let value: i64 = redis::from_redis_value(value)?;
    let echoed: String = redis::from_redis_value(echoed)?;
    check_owner(&echoed, owner)?;
    Ok(if status == 1 {
        let permits_left: i64 = match items.next() {
            Some(left) => redis::from_redis_value(left)?,
            None => 0,
        };
        AcquireReply::Acquired {
            fencing_token: u64::try_from(value).unwrap_or(0),
            permits_left: u32::try_from(permits_left).unwrap_or(0),
        }
    } else if status == 2 {
        AcquireReply::PermitsDiffer {
            held_with: u32::try_from(value).unwrap_or(u32::MAX),
        }
    } else if status == 3 {
        AcquireReply::Foreign
    } else {
        AcquireReply::Busy {
            remaining: u64::try_from(value).ok().map(Duration::from_millis),
        }
    })
}

fn read_acquire_all(
    reply: Vec<redis::Value>,
    owner: &str,
    count: usize,
) -> RedisResult<AcquireAllReply> {
    let mut values = reply.into_iter();
    let (Some(status), Some(echoed)) = (values.next(), values.next()) else {
        return Err(out_of_sync("an acquire-all reply of the wrong length"));
    };
    let status: i64 = redis::from_redis_value(status)?;
    let echoed: String = redis::from_redis_value(echoed)?;
    check_owner(&echoed, owner)?;
    let numbers: Vec<i64> = values
        .map(redis::from_redis_value)
        .collect::<Result<_, _>>()?;
    if status == 3 {
        return match numbers[..] {
            [index] if index >= 1 && usize::try_from(index).is_ok_and(|i| i <= count) => {
                Ok(AcquireAllReply::Foreign {
                    index: usize::try_from(index - 1).unwrap_or(0),
                })
            }
            _ => Err(out_of_sync(
                "an acquire-all foreign reply of the wrong shape",
            )),
        };
    }
    if status == 1 {
        if numbers.len() != count {
            return Err(out_of_sync("an acquire-all reply of the wrong length"));
        }
        return Ok(AcquireAllReply::Acquired {
            fencing_tokens: numbers
                .into_iter()
                .map(|t| u64::try_from(t).unwrap_or(0))
                .collect(),
        });
    }
    match numbers[..] {
        [index, pttl] if index >= 1 && usize::try_from(index).is_ok_and(|i| i <= count) => {
            Ok(AcquireAllReply::Busy {
                index: usize::try_from(index - 1).unwrap_or(0),
                remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            })
        }
        _ => Err(out_of_sync("an acquire-all busy reply of the wrong shape")),
    }
}

/// What `permit_counts.lua` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitReply {
    /// Permits held now, and the count the holders use (`None`: no holder).
    Counts { held: u32, stored: Option<u32> },
    /// A name of the semaphore holds a value distlock did not write.
    Foreign,
}

/// A lock as the inspect script read it: its value and its remaining lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeldLock {
    /// `<owner><mark><token>:<since>:<holder>` (see acquire.lua).
    pub(crate) value: String,
    /// Milliseconds left; -1 when the key has no TTL.
    pub(crate) pttl: i64,
}

fn read_inspect(reply: Vec<redis::Value>) -> RedisResult<Option<HeldLock>> {
    match <[redis::Value; 2]>::try_from(reply) {
        Ok([value, pttl]) => Ok(Some(HeldLock {
            value: redis::from_redis_value(value)?,
            pttl: redis::from_redis_value(pttl)?,
        })),
        Err(reply) if reply.is_empty() => Ok(None),
        Err(_) => Err(out_of_sync("an inspect reply of the wrong length")),
    }
}

/// A holder of a shared kind (a read hold, a permit) as `inspect_key.lua`
/// read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedHolder {
    /// Its member in the holders' set: the owner token (a weighted permit
    /// hold's with `:<n>`).
    pub(crate) member: String,
    /// When its lease ends, server clock, ms.
    pub(crate) ends_ms: i64,
    /// `<token>:<since>:<holder>`, when recorded (holds taken by a distlock
    /// that kept no details have none).
    pub(crate) details: Option<String>,
}

/// Every hold on one user key, from `inspect_key.lua`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct KeyReading {
    pub(crate) lock: Option<HeldLock>,
    /// The default lock's waiters in arrival order: owner token and queue
    /// entry (see `queue_prelude.lua`).
    pub(crate) queue: Vec<(String, Option<String>)>,
    pub(crate) writer: Option<HeldLock>,
    pub(crate) readers: Vec<SharedHolder>,
    /// Whether a writer waits for the readers to leave.
    pub(crate) writer_waiting: bool,
    pub(crate) permit_holders: Vec<SharedHolder>,
    pub(crate) permit_count: Option<u32>,
    /// The server clock when read, ms.
    pub(crate) now_ms: i64,
    /// The counting semaphore's available permits, when it exists.
    pub(crate) counter: Option<i64>,
    /// The counting semaphore's waiting acquisitions.
    pub(crate) counter_waiters: u64,
}

/// Which shared holds an operator frees.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SharedRelease<'a> {
    /// Every hold of the read-write lock and the semaphore.
    All,
    /// The writer, if this owner holds it.
    Writer(&'a str),
    /// This owner's read hold.
    Reader(&'a str),
    /// This member's permits.
    Permit(&'a str),
}

fn read_key(reply: Vec<redis::Value>) -> RedisResult<Option<KeyReading>> {
    fn held(value: redis::Value, pttl: redis::Value) -> RedisResult<Option<HeldLock>> {
        let value: Option<String> = redis::from_redis_value(value)?;
        let pttl: i64 = redis::from_redis_value(pttl)?;
        Ok(value.map(|value| HeldLock { value, pttl }))
    }
    fn holders(value: redis::Value) -> RedisResult<Vec<SharedHolder>> {
        let flat: Vec<redis::Value> = redis::from_redis_value(value)?;
        if !flat.len().is_multiple_of(3) {
            return Err(out_of_sync(
                "an inspect-key holder list of the wrong length",
            ));
        }
        let mut out = Vec::with_capacity(flat.len() / 3);
        let mut flat = flat.into_iter();
        while let (Some(member), Some(ends), Some(details)) =
            (flat.next(), flat.next(), flat.next())
        {
            let ends: f64 = redis::from_redis_value(ends)?;
            out.push(SharedHolder {
                member: redis::from_redis_value(member)?,
                // Scores are whole milliseconds (see permit_acquire.lua).
                #[allow(clippy::cast_possible_truncation)]
                ends_ms: ends as i64,
                details: redis::from_redis_value(details)?,
            });
        }
        Ok(out)
    }
    let mut values = reply.into_iter();
    let status: i64 = match values.next() {
        Some(status) => redis::from_redis_value(status)?,
        None => return Err(out_of_sync("an empty inspect-key reply")),
    };
    if status == 3 {
        return Ok(None);
    }
    let fields: Vec<redis::Value> = values.collect();
    let Ok(
        [lock, lock_pttl, queue, writer, writer_pttl, readers, intent_pttl, permits, count, now, counter, counter_waiters],
    ) = <[redis::Value; 12]>::try_from(fields)
    else {
        return Err(out_of_sync("an inspect-key reply of the wrong length"));
    };
    let queue: Vec<redis::Value> = redis::from_redis_value(queue)?;
    if !queue.len().is_multiple_of(2) {
        return Err(out_of_sync("an inspect-key queue of the wrong length"));
    }
    let mut waiters = Vec::with_capacity(queue.len() / 2);
    let mut queue = queue.into_iter();
    while let (Some(owner), Some(entry)) = (queue.next(), queue.next()) {
        waiters.push((
            redis::from_redis_value(owner)?,
            redis::from_redis_value(entry)?,
        ));
    }
    let intent_pttl: i64 = redis::from_redis_value(intent_pttl)?;
    let count: Option<String> = redis::from_redis_value(count)?;
    Ok(Some(KeyReading {
        lock: held(lock, lock_pttl)?,
        queue: waiters,
        writer: held(writer, writer_pttl)?,
        readers: holders(readers)?,
        writer_waiting: intent_pttl != -2,
        permit_holders: holders(permits)?,
        permit_count: count.and_then(|c| c.parse().ok()),
        now_ms: redis::from_redis_value(now)?,
        counter: redis::from_redis_value::<Option<String>>(counter)?
            .map(|c| c.parse())
            .transpose()
            .map_err(|_| out_of_sync("an inspect-key counter that is not an integer"))?,
        counter_waiters: redis::from_redis_value::<i64>(counter_waiters)?
            .try_into()
            .unwrap_or(0),
    }))
}

/// One `SCAN` page of the keys matching `pattern`: the next cursor (0: done)
/// and the names (of any type: holds live in strings and sorted sets).
pub(crate) fn scan_cmd(cursor: u64, pattern: &str) -> Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000);
    cmd
}

/// `<prefix>handoff`: the base of every manager's hand-off channel,
/// `<prefix>handoff:<route>` (under the prefix, so the least-privilege ACL's
/// `&<prefix>*` covers it).
pub(crate) fn handoff_base(key_prefix: &str) -> String {
    format!("{key_prefix}handoff")
}

/// Whether `value` is a lock value distlock wrote,
/// `<32 hex owner><mark><token>:<since>:<holder>` (the Lua twin is
/// `is_lock_value` in `scripts/queue_prelude.lua`).
pub(crate) fn is_lock_value(value: &[u8]) -> bool {
    let Some((owner, rest)) = value.split_at_checked(32) else {
        return false;
    };
    let Some((&mark, rest)) = rest.split_first() else {
        return false;
    };
    let digits = |part: &[u8]| !part.is_empty() && part.iter().all(u8::is_ascii_digit);
    let mut parts = rest.splitn(3, |&b| b == b':');
    owner.iter().all(u8::is_ascii_hexdigit)
        && (mark == b'+' || mark == b'-')
        && parts.next().is_some_and(digits)
        && parts.next().is_some_and(digits)
        && parts.next().is_some()
}

/// release.lua's call: the owner token alone when it can be, `keep_ms` and
/// the events channel only when set (the script derives the wake-up channel
/// and hand-off base from the names), since every argument costs the server
/// an object and a Lua string on each release; the give-back mark only for
/// a give-back (see [`ExpectedWaiters::GivenBack`]).
fn default_release_cmd(
    lua: &Lua,
    keys: &RedisNames,
    owner: &str,
    keep_ms: u64,
    given_back: bool,
    receipt: Option<&Receipt>,
) -> Cmd {
    let with_events = !keys.events.is_empty();
    let argc = match (receipt, given_back, with_events, keep_ms > 0) {
        (Some(_), ..) => 6,
        (None, true, _, _) => 4,
        (None, false, true, _) => 3,
        (None, false, false, true) => 2,
        (None, false, false, false) => 1,
    };
    let names = [
        keys.lock.as_str(),
        keys.fencing_counter(),
        keys.related(),
        keys.intent(),
        receipt.map_or("", |r| r.name.as_str()),
    ];
    let mut cmd = lua.call(
        &names[..4 + usize::from(receipt.is_some())],
        argc,
        owner.len() + 40 + keys.events.len(),
    );
    cmd.arg(owner);
    if argc > 1 {
        cmd.arg(keep_ms);
    }
    if argc > 2 {
        cmd.arg(&keys.events);
    }
    if argc > 3 {
        cmd.arg(if given_back { GIVEN_BACK } else { "" });
    }
    if let Some(receipt) = receipt {
        cmd.arg(receipt.terms.ms).arg(receipt.terms.id);
    }
    cmd
}

/// A release's receipt (Cluster and Sentinel): the name the release script
/// sets when the hold was ours, to the release call's id, for `ms`, so that
/// the script sent again after its reply was lost answers "ours" (see
/// `release.lua`).
pub(crate) struct Receipt {
    name: String,
    terms: ReceiptTerms,
}

/// How a release call leaves its receipt (see [`Receipt`]): kept `ms`, with
/// the value `id`, drawn once per call, so that the call sent again (on a
/// new connection, or on the next master) recognises its own and another
/// release by the same owner token does not.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReceiptTerms {
    ms: u64,
    id: u64,
}

impl ReceiptTerms {
    /// Terms for one release call, its receipt kept `ms`; none for 0.
    pub(crate) fn drawn(ms: u64) -> Option<Self> {
        (ms > 0).then(|| ReceiptTerms {
            ms,
            id: rand::random(),
        })
    }
}

/// release.lua's ARGV[4] for a give-back: its wake-up is `<owner>~`.
const GIVEN_BACK: &str = "~";

/// release_free.lua's call: the lock's key alone, the claim (the owner
/// token and the unmarked byte, see [`Unmarked`]), and the events channel
/// when set.
fn release_free_cmd(lua: &Lua, keys: &RedisNames, owner: &str, receipt: Option<&Receipt>) -> Cmd {
    let with_events = !keys.events.is_empty();
    let Some(receipt) = receipt else {
        let mut cmd = lua.call(
            &[&keys.lock],
            1 + usize::from(with_events),
            owner.len() + 1 + keys.events.len(),
        );
        cmd.arg(Unmarked(owner));
        if with_events {
            cmd.arg(&keys.events);
        }
        return cmd;
    };
    let mut cmd = lua.call(
        &[&keys.lock, &receipt.name],
        4,
        owner.len() + 41 + keys.events.len(),
    );
    cmd.arg(Unmarked(owner))
        .arg(&keys.events)
        .arg(receipt.terms.ms)
        .arg(receipt.terms.id);
    cmd
}

/// The prefix of a default lock's value while nobody has queued for it: the
/// owner token and `-` (a queued waiter makes it `+`), written as one
/// argument without building a string for it.
struct Unmarked<'a>(&'a str);

impl redis::ToRedisArgs for Unmarked<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        use std::io::Write as _;
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's own buffer, which cannot fail.
        let _ = arg.write_all(self.0.as_bytes());
        let _ = arg.write_all(b"-");
    }
}

/// The value a free acquisition writes with `SET NX`,
/// `<owner>-0:<since>:<holder>` (see acquire.lua: nobody waits, no token
/// yet), written into the command's buffer as one argument without building
/// a string for it.
struct FreeValue<'a> {
    owner: &'a str,
    /// The acquisition time, milliseconds since the Unix epoch.
    since_ms: u64,
    holder: &'a str,
}

impl FreeValue<'_> {
    /// An upper bound of its length in bytes, for the command's buffer.
    fn len(&self) -> usize {
        self.owner.len() + self.holder.len() + 4 + 20
    }
}

impl redis::ToRedisArgs for FreeValue<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        use std::io::Write as _;
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's own buffer, which cannot fail.
        let _ = write!(arg, "{}-0:{}:{}", self.owner, self.since_ms, self.holder);
    }
}

/// Whether `value` is one `FreeValue` of `owner` wrote (any acquisition
/// time and holder), perhaps marked since by a waiter that queued behind it
/// (`+`, see acquire.lua): owner tokens are unique per acquisition.
fn is_own_free_value(value: &[u8], owner: &str) -> bool {
    value
        .strip_prefix(owner.as_bytes())
        .is_some_and(|rest| rest.starts_with(b"-0:") || rest.starts_with(b"+0:"))
}

/// release_free.lua's reply: the claim echoed (released), or 0 (not done:
/// the full release follows). `None` for 0.
fn release_free_reply(reply: redis::Value, owner: &str) -> RedisResult<Option<bool>> {
    match reply {
        redis::Value::Int(0) => Ok(None),
        redis::Value::BulkString(ref echoed)
            if echoed.strip_suffix(b"-") == Some(owner.as_bytes()) =>
        {
            Ok(Some(true))
        }
        redis::Value::BulkString(_) => Err(out_of_sync("the reply names another owner token")),
        _ => Err(out_of_sync("the free release got a reply of another shape")),
    }
}

/// A release script's reply: `owner` alone (released: the default lock's
/// common reply), or `{released, owner}`; true when the hold was ours.
fn release_reply(reply: redis::Value, owner: &str) -> RedisResult<bool> {
    if let redis::Value::BulkString(echoed) = &reply {
        check_owner(&String::from_utf8_lossy(echoed), owner)?;
        return Ok(true);
    }
    let (released, echoed): (i64, String) = redis::from_redis_value(reply)?;
    check_owner(&echoed, owner)?;
    Ok(released == 1)
}

fn check_owner(echoed: &str, owner: &str) -> RedisResult<()> {
    if echoed == owner {
        Ok(())
    } else {
        Err(out_of_sync("the reply names another owner token"))
    }
}

/// One command of the start-up probe, for naming what a refusal concerns.
pub(crate) struct ProbeStep {
    pub(crate) name: &'static str,
    source: Option<&'static str>,
}

impl ProbeStep {
    fn command(name: &'static str) -> Self {
        ProbeStep { name, source: None }
    }

    fn script(name: &'static str, lua: &Lua) -> Self {
        ProbeStep {
            name,
            source: Some(lua.source),
        }
    }

    /// The Redis command a script error is about: Redis names the script line
    /// (`@user_script:13`) but not the command an ACL refused there.
    pub(crate) fn command_in(&self, error: &str) -> Option<String> {
        let line: usize = error
            .split("@user_script:")
            .nth(1)?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()?;
        let text = self.source?.lines().nth(line.checked_sub(1)?)?;
        let call = text.split("redis.call('").nth(1)?;
        Some(call.split('\'').next()?.to_ascii_lowercase())
    }
}

pub(crate) struct Scripts {
    acquire: Lua,
    acquire_all: Lua,
    release: Lua,
    release_free: Lua,
    renew: Lua,
    raise_fence: Lua,
    force_unlock: Lua,
    inspect: Lua,
    write_acquire: Lua,
    write_release: Lua,
    read_acquire: Lua,
    read_release: Lua,
    permit_acquire: Lua,
    permit_release: Lua,
    permit_give_back: Lua,
    permit_split: Lua,
    shared_renew: Lua,
    issue_token: Lua,
    permit_counts: Lua,
    inspect_key: Lua,
    force_unlock_shared: Lua,
    counter_acquire: Lua,
    counter_change: Lua,
    /// `<prefix>handoff`: a hand-off to a queued waiter is published on
    /// `<handoff_base>:<route of its manager>`, one channel per manager for
    /// all its locks (see `scripts/queue_prelude.lua`).
    handoff_base: String,
    /// `<prefix>unlocked`: force-unlocks' receipts are
    /// `<prefix>unlocked:{<tag>}:<token>` (see `force_unlock.lua`).
    unlock_receipts: String,
    /// `<prefix>released`: releases' receipts are
    /// `<prefix>released:{<tag>}:<owner>` (see [`Receipt`]).
    release_receipts: String,
    /// Whether a release that likely hands the lock over goes behind a
    /// `PING` ([`Lua::invoke_after_ping`]). Not on a cluster, whose hand-off
    /// was measured without it (`lock-bench`'s `handoff-cluster`). It was
    /// left out there because redis-rs's cluster client followed an `ASK`
    /// with one `ASKING` before the whole pipeline, which the `PING` used up;
    /// distlock's own routing sends one before each command, so turning it
    /// on is a matter of a measurement.
    ping_before_handoff: bool,
}

/// A script of the default lock's queue, after the helpers of every kind and
/// the queue's own.
macro_rules! with_queue_prelude {
    ($file:literal) => {
        Lua::new(concat!(
            include_str!("../scripts/shared_prelude.lua"),
            include_str!("../scripts/queue_prelude.lua"),
            include_str!(concat!("../scripts/", $file))
        ))
    };
}

/// A script of a read-write lock or a semaphore, after the helpers they share.
macro_rules! with_prelude {
    ($file:literal) => {
        Lua::new(concat!(
            include_str!("../scripts/shared_prelude.lua"),
            include_str!(concat!("../scripts/", $file))
        ))
    };
}

/// A script of the counting semaphore, after its helpers.
macro_rules! with_counter_prelude {
    ($file:literal) => {
        Lua::new(concat!(
            include_str!("../scripts/counter_prelude.lua"),
            include_str!(concat!("../scripts/", $file))
        ))
    };
}

impl Scripts {
    /// The scripts of a manager whose keys start with `key_prefix`.
    pub(crate) fn new(key_prefix: &str) -> Self {
        Scripts {
            handoff_base: handoff_base(key_prefix),
            unlock_receipts: format!("{key_prefix}unlocked"),
            release_receipts: format!("{key_prefix}released"),
            acquire: with_queue_prelude!("acquire.lua"),
            acquire_all: with_queue_prelude!("acquire_all.lua"),
            // The fast path first (see the file's header), then the helpers
            // and the queue's part.
            release: Lua::new(concat!(
                include_str!("../scripts/release.lua"),
                include_str!("../scripts/shared_prelude.lua"),
                include_str!("../scripts/queue_prelude.lua"),
                include_str!("../scripts/release_queue.lua")
            )),
            release_free: Lua::new(include_str!("../scripts/release_free.lua")),
            renew: Lua::new(include_str!("../scripts/renew.lua")),
            raise_fence: Lua::new(include_str!("../scripts/raise_fence.lua")),
            force_unlock: with_queue_prelude!("force_unlock.lua"),
            inspect: Lua::new(include_str!("../scripts/inspect.lua")),
            write_acquire: with_prelude!("write_acquire.lua"),
            write_release: Lua::new(include_str!("../scripts/write_release.lua")),
            read_acquire: with_prelude!("read_acquire.lua"),
            read_release: with_prelude!("read_release.lua"),
            permit_acquire: with_prelude!("permit_acquire.lua"),
            permit_release: with_prelude!("permit_release.lua"),
            permit_give_back: with_prelude!("permit_give_back.lua"),
            permit_split: with_prelude!("permit_split.lua"),
            shared_renew: with_prelude!("shared_renew.lua"),
            issue_token: with_prelude!("issue_token.lua"),
            permit_counts: with_prelude!("permit_counts.lua"),
            inspect_key: with_prelude!("inspect_key.lua"),
            force_unlock_shared: with_prelude!("force_unlock_shared.lua"),
            counter_acquire: with_counter_prelude!("counter_acquire.lua"),
            counter_change: with_counter_prelude!("counter_change.lua"),
            ping_before_handoff: true,
        }
    }

    /// The scripts of a cluster's manager: as [`Scripts::new`], with no
    /// `PING` before a hand-off (see `ping_before_handoff`).
    pub(crate) fn for_cluster(key_prefix: &str) -> Self {
        Scripts {
            ping_before_handoff: false,
            ..Scripts::new(key_prefix)
        }
    }

    fn acquire_lua(&self, kind: LockKind) -> &Lua {
        match kind {
            LockKind::Exclusive => &self.acquire,
            LockKind::Write => &self.write_acquire,
            LockKind::Read => &self.read_acquire,
            LockKind::Permit { .. } => &self.permit_acquire,
        }
    }

    fn release_lua(&self, kind: LockKind) -> &Lua {
        match kind {
            LockKind::Exclusive => &self.release,
            LockKind::Write => &self.write_release,
            LockKind::Read => &self.read_release,
            LockKind::Permit { .. } => &self.permit_release,
        }
    }

    fn renew_lua(&self, kind: LockKind) -> &Lua {
        match kind {
            LockKind::Exclusive | LockKind::Write => &self.renew,
            LockKind::Read | LockKind::Permit { .. } => &self.shared_renew,
        }
    }

    pub(crate) async fn acquire(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> RedisResult<AcquireReply> {
        if spec.fence_ttl_ms.is_none()
            && !spec.waiting
            && keys.kind == LockKind::Exclusive
            && keys.events.is_empty()
        {
            return self.acquire_plain(conn, keys, owner, lease_ms, spec).await;
        }
        let cmd = self.acquire_cmd(keys, owner, lease_ms, spec);
        let reply: Vec<redis::Value> = self.acquire_lua(keys.kind).invoke(conn, &cmd).await?;
        read_acquire(reply, owner)
    }

    /// Takes every lock of `locks` for `owner`, or none when one is held by
    /// another owner or free with another owner's waiter at the head of its
    /// queue (handed to that waiter): one script call (see
    /// `acquire_all.lua`). All the locks must be on the connection's server
    /// (one slot in a cluster).
    pub(crate) async fn acquire_all(
        &self,
        conn: &mut impl ConnectionLike,
        locks: &[&RedisNames],
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> RedisResult<AcquireAllReply> {
        let names: Vec<&str> = locks
            .iter()
            .flat_map(|keys| {
                [
                    keys.lock.as_str(),
                    keys.fencing_counter(),
                    keys.related(),
                    keys.intent(),
                ]
            })
            .collect();
        let publishes = locks.iter().any(|keys| !keys.events.is_empty());
        let events_len: usize = locks.iter().map(|keys| keys.events.len()).sum();
        let mut cmd = self.acquire_all.call(
            &names,
            if publishes { 6 + locks.len() } else { 6 },
            owner.len() + spec.holder.len() + self.handoff_base.len() + 70 + events_len,
        );
        cmd.arg(owner)
            .arg(lease_ms)
            .arg(spec.fence_ttl_ms.unwrap_or(0))
            .arg(spec.since_ms)
            .arg(spec.holder)
            .arg(&self.handoff_base);
        if publishes {
            for keys in locks {
                cmd.arg(&keys.events);
            }
        }
        let reply: Vec<redis::Value> = self.acquire_all.invoke(conn, &cmd).await?;
        read_acquire_all(reply, owner, locks.len())
    }

    /// An attempt that neither asks for its token nor waits needs no script: a
    /// plain `SET NX PX` of the lock's value (token 0), rslock's command. `GET`
    /// makes a busy lock answer with its value, so a value distlock did not
    /// write is told apart at once (and `WRONGTYPE`, a key of another type).
    /// A busy lock's remaining lease is not read (a waiting attempt's script
    /// reads it, and queues up).
    ///
    /// This is the one reply that carries no echo of the owner token (an
    /// `ECHO` would be a fifth command per cycle): the connection matches
    /// replies to requests in order, and the first renewal or release of the
    /// hold, which do echo it, would find a reply handed to the wrong caller.
    async fn acquire_plain(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> RedisResult<AcquireReply> {
        let value = FreeValue {
            owner,
            since_ms: spec.since_ms,
            holder: spec.holder,
        };
        let mut cmd = Cmd::with_capacity(7, keys.lock.len() + value.len() + 24);
        cmd.arg("SET")
            .arg(&keys.lock)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .arg("GET");
        let held: Option<Vec<u8>> = match cmd.query_async(conn).await {
            Ok(held) => held,
            Err(e) if e.code() == Some("WRONGTYPE") => return Ok(AcquireReply::Foreign),
            Err(e) => return Err(e),
        };
        Ok(match held {
            None => AcquireReply::Acquired {
                fencing_token: 0,
                permits_left: 0,
            },
            // Our own value: this command ran already, and its reply was lost
            // with its connection (a cluster client sends the command again
            // on a new one). The lock is ours, as the first run made it.
            Some(held) if is_own_free_value(&held, owner) => AcquireReply::Acquired {
                fencing_token: 0,
                permits_left: 0,
            },
            Some(held) if is_lock_value(&held) => AcquireReply::Busy { remaining: None },
            Some(_) => AcquireReply::Foreign,
        })
    }

    /// The acquire script followed by `WAIT replicas timeout` in one pipeline on
    /// `conn`: `WAIT` counts the replicas that have every earlier write of *its*
    /// connection, so it must follow the script on the same one. Returns the
    /// reply and how many replicas confirmed.
    pub(crate) async fn acquire_acked(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
        ack: &ReplicaAck,
    ) -> RedisResult<(AcquireReply, u32)> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.add_command(self.acquire_cmd(keys, owner, lease_ms, spec));
        pipe.cmd("WAIT").arg(ack.replicas).arg(ack.timeout_ms());
        let mut replies: Vec<redis::Value> = pipe.query_async(conn).await?;
        if matches!(replies.first(), Some(redis::Value::ServerError(e)) if e.code() == "NOSCRIPT") {
            self.acquire_lua(keys.kind).load(conn).await?;
            replies = pipe.query_async(conn).await?;
        }
        let [reply, acked]: [redis::Value; 2] = replies
            .try_into()
            .map_err(|_| out_of_sync("an acquire pipeline got the wrong number of replies"))?;
        let reply = read_acquire(from_value(reply)?, owner)?;
        let acked: i64 = from_value(acked)?;
        Ok((reply, u32::try_from(acked).unwrap_or(0)))
    }

    fn acquire_cmd(
        &self,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Cmd {
        let lua = self.acquire_lua(keys.kind);
        let args_len = owner.len() + spec.holder.len() + 70;
        let mut cmd = match keys.kind {
            LockKind::Exclusive => lua.call(
                &[
                    &keys.lock,
                    keys.fencing_counter(),
                    keys.related(),
                    keys.intent(),
                ],
                13,
                args_len
                    + self.handoff_base.len()
                    + spec.handoff_route.len()
                    + keys.events.len()
                    + 40,
            ),
            LockKind::Write | LockKind::Read => lua.call(
                &[
                    &keys.lock,
                    keys.fencing_counter(),
                    keys.related(),
                    keys.intent(),
                    keys.details(),
                ],
                6,
                args_len,
            ),
            LockKind::Permit { .. } => lua.call(
                &[
                    &keys.lock,
                    keys.fencing_counter(),
                    keys.related(),
                    keys.details(),
                ],
                9,
                args_len,
            ),
        };
        cmd.arg(owner)
            .arg(lease_ms)
            .arg(spec.fence_ttl_ms.unwrap_or(0))
            .arg(if spec.waiting { "+" } else { "-" });
        match keys.kind {
            LockKind::Write | LockKind::Read => {
                cmd.arg(spec.since_ms).arg(spec.holder);
            }
            LockKind::Exclusive => {
                cmd.arg(spec.since_ms)
                    .arg(spec.holder)
                    .arg(if spec.queue { "1" } else { "0" })
                    .arg(spec.queue_lease_ms)
                    .arg(spec.handoff_ttl_ms)
                    .arg(&self.handoff_base)
                    .arg(spec.handoff_route)
                    .arg(spec.attempt)
                    .arg(&keys.events);
            }
            LockKind::Permit { permits } => {
                cmd.arg(permits)
                    .arg(if spec.resize_permits { "1" } else { "0" })
                    .arg(spec.since_ms)
                    .arg(spec.holder)
                    .arg(spec.largest_waiting_weight);
            }
        }
        cmd
    }

    /// Releases many locks in one round trip (the script is loaded first, so no
    /// NOSCRIPT can come back); per lock, whether it was still ours.
    /// `receipt`: see [`Scripts::release_many_pipeline`].
    pub(crate) async fn release_many(
        &self,
        conn: &mut impl ConnectionLike,
        locks: &[(&RedisNames, &str, u64)],
        receipt: Option<ReceiptTerms>,
    ) -> RedisResult<Vec<bool>> {
        let replies: Vec<redis::Value> = self
            .release_many_pipeline(locks, receipt)
            .query_async(conn)
            .await?;
        self.release_many_replies(locks, replies)
    }

    /// The pipeline of [`Scripts::release_many`]: SCRIPT LOAD, then one release per lock.
    /// `receipt`: each release leaves a receipt on those terms (Sentinel,
    /// which sends the pipeline again on the next master after a failover).
    pub(crate) fn release_many_pipeline(
        &self,
        locks: &[(&RedisNames, &str, u64)],
        receipt: Option<ReceiptTerms>,
    ) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        for lua in self.release_luas(locks) {
            pipe.cmd("SCRIPT").arg("LOAD").arg(lua.source);
        }
        for (keys, owner, keep_ms) in locks {
            let receipt = self.release_receipt(keys, owner, receipt);
            pipe.add_command(self.release_cmd(keys, owner, *keep_ms, false, receipt.as_ref()));
        }
        pipe
    }

    /// Reads the replies of [`Scripts::release_many_pipeline`].
    pub(crate) fn release_many_replies(
        &self,
        locks: &[(&RedisNames, &str, u64)],
        all: Vec<redis::Value>,
    ) -> RedisResult<Vec<bool>> {
        self.release_many_replies_each(locks, all)?
            .into_iter()
            .collect()
    }

    /// [`Scripts::release_many_replies`], each lock's reply on its own: the
    /// outer error when the pipeline's replies as a whole are not its own
    /// (their count, a script's hash).
    pub(crate) fn release_many_replies_each(
        &self,
        locks: &[(&RedisNames, &str, u64)],
        mut all: Vec<redis::Value>,
    ) -> RedisResult<Vec<RedisResult<bool>>> {
        let luas = self.release_luas(locks);
        if all.len() != locks.len() + luas.len() {
            return Err(out_of_sync(
                "a release pipeline got the wrong number of replies",
            ));
        }
        let replies = all.split_off(luas.len());
        for (lua, hash) in luas.into_iter().zip(all) {
            // A `SCRIPT LOAD` the server refused (LOADING, OOM, ...): the
            // releases after it answer for themselves.
            if !matches!(hash, redis::Value::ServerError(_)) {
                lua.check_loaded(&redis::from_redis_value::<String>(hash)?)?;
            }
        }
        Ok(locks
            .iter()
            .zip(replies)
            .map(|((_, owner, _), reply)| match reply {
                redis::Value::ServerError(e) => Err(RedisError::from(e)),
                reply => release_reply(reply, owner),
            })
            .collect())
    }

    /// The release scripts `locks` need, each once, in a fixed order.
    fn release_luas(&self, locks: &[(&RedisNames, &str, u64)]) -> Vec<&Lua> {
        let mut luas: Vec<&Lua> = Vec::new();
        for (keys, _, _) in locks {
            let lua = self.release_lua(keys.kind);
            if !luas.iter().any(|l| std::ptr::eq(*l, lua)) {
                luas.push(lua);
            }
        }
        luas
    }

    /// `keep_ms`: above zero, the lock is kept that many milliseconds more
    /// (its TTL set to it) instead of deleted, for a request's `min_hold`.
    /// The release script's call for `keys`' kind; `given_back` marks a
    /// default lock's give-back (the other kinds' acquisitions give nothing
    /// back by release).
    /// `receipt`: see [`Receipt`] (none where a call is never sent twice).
    fn release_cmd(
        &self,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
        given_back: bool,
        receipt: Option<&Receipt>,
    ) -> Cmd {
        let lua = self.release_lua(keys.kind);
        let args_len = owner.len() + keys.channel().len() + 40;
        let receipt_name = receipt.map_or("", |r| r.name.as_str());
        let with_receipt = usize::from(receipt.is_some());
        let mut cmd = match keys.kind {
            LockKind::Exclusive => {
                return default_release_cmd(lua, keys, owner, keep_ms, given_back, receipt)
            }
            LockKind::Write => {
                let names = [keys.lock.as_str(), keys.intent(), receipt_name];
                lua.call(&names[..2 + with_receipt], 3 + 2 * with_receipt, args_len)
            }
            LockKind::Read => {
                let names = [
                    keys.lock.as_str(),
                    keys.intent(),
                    keys.details(),
                    receipt_name,
                ];
                lua.call(&names[..3 + with_receipt], 3 + 2 * with_receipt, args_len)
            }
            LockKind::Permit { .. } => {
                let names = [
                    keys.lock.as_str(),
                    keys.related(),
                    keys.details(),
                    receipt_name,
                ];
                lua.call(&names[..3 + with_receipt], 3 + 2 * with_receipt, args_len)
            }
        };
        cmd.arg(owner).arg(keys.channel()).arg(keep_ms);
        if let Some(receipt) = receipt {
            cmd.arg(receipt.terms.ms).arg(receipt.terms.id);
        }
        cmd
    }

    /// The receipt of `owner`'s release of `keys` on `terms`:
    /// `<prefix>released:{<tag>}:<owner>`, on the lock's slot.
    fn release_receipt(
        &self,
        keys: &RedisNames,
        owner: &str,
        terms: Option<ReceiptTerms>,
    ) -> Option<Receipt> {
        terms.map(|terms| Receipt {
            name: receipt_name(&self.release_receipts, &keys.lock, owner),
            terms,
        })
    }

    /// Deletes the lock if `owner` holds it and publishes a wake-up (or, with
    /// `keep_ms` above zero, leaves it `keep_ms` more); true when it was ours.
    /// `waiters` (see [`ExpectedWaiters`]): a lock nobody likely waits for
    /// tries the one-key release first; a default lock someone likely waits
    /// for (told, or the one-key release declined) is released behind a
    /// `PING`, so that the hand-off's message leaves before the reply (see
    /// [`Lua::invoke_after_ping`]; not on a cluster). Only then: a free
    /// cycle sends no `PING`.
    /// `receipt` (Cluster, Sentinel): the release leaves a receipt on those
    /// terms (see [`Receipt`]).
    pub(crate) async fn release(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
        waiters: ExpectedWaiters,
        receipt: Option<ReceiptTerms>,
    ) -> RedisResult<bool> {
        let receipt = self.release_receipt(keys, owner, receipt);
        match self
            .release_with(conn, keys, owner, keep_ms, waiters, receipt.as_ref())
            .await
        {
            // While the lock's slot moves between two masters, a node runs a
            // script only if every key it names is there (else `TRYAGAIN`,
            // and the script did not run), and a receipt's name is never
            // there before its release: sent again without it, as before
            // receipts. A release is sent twice only when its connection
            // breaks before the reply, which a resharding alone does not do.
            Err(e)
                if receipt.is_some()
                    && e.kind() == ErrorKind::Server(redis::ServerErrorKind::TryAgain) =>
            {
                self.release_with(conn, keys, owner, keep_ms, waiters, None)
                    .await
            }
            outcome => outcome,
        }
    }

    /// [`Scripts::release`] with `receipt` or none.
    async fn release_with(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
        mut waiters: ExpectedWaiters,
        receipt: Option<&Receipt>,
    ) -> RedisResult<bool> {
        let handing_over = keep_ms == 0 && keys.kind == LockKind::Exclusive;
        if handing_over && waiters == ExpectedWaiters::Unlikely {
            let cmd = release_free_cmd(&self.release_free, keys, owner, receipt);
            let reply: redis::Value = self.release_free.invoke(conn, &cmd).await?;
            if let Some(released) = release_free_reply(reply, owner)? {
                return Ok(released);
            }
            // Declined: someone queued since.
            waiters = ExpectedWaiters::Likely;
        }
        let given_back = waiters == ExpectedWaiters::GivenBack;
        let cmd = self.release_cmd(keys, owner, keep_ms, given_back, receipt);
        let lua = self.release_lua(keys.kind);
        let reply =
            if handing_over && waiters == ExpectedWaiters::Likely && self.ping_before_handoff {
                lua.invoke_after_ping(conn, &cmd).await?
            } else {
                lua.invoke(conn, &cmd).await?
            };
        release_reply(reply, owner)
    }

    /// Gives back part of `owner`'s weighted semaphore hold, keeping the rest
    /// as `kept_owner`'s (see `permit_give_back.lua`); true when the hold was
    /// still ours.
    pub(crate) async fn permit_give_back(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        kept_owner: &str,
    ) -> RedisResult<bool> {
        let args_len = owner.len() + kept_owner.len() + keys.channel().len();
        let mut cmd =
            self.permit_give_back
                .call(&[&keys.lock, keys.related(), keys.details()], 3, args_len);
        cmd.arg(owner).arg(kept_owner).arg(keys.channel());
        let reply = self.permit_give_back.invoke(conn, &cmd).await?;
        release_reply(reply, owner)
    }

    /// Splits `owner`'s weighted semaphore hold into one hold per permit,
    /// under `permit_owners` (see `permit_split.lua`); true when the hold
    /// was still ours.
    pub(crate) async fn permit_split(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        permit_owners: &[String],
    ) -> RedisResult<bool> {
        let args_len = owner.len() + permit_owners.iter().map(String::len).sum::<usize>();
        let mut cmd = self.permit_split.call(
            &[&keys.lock, keys.related(), keys.details()],
            1 + permit_owners.len(),
            args_len,
        );
        cmd.arg(owner).arg(permit_owners);
        let reply = self.permit_split.invoke(conn, &cmd).await?;
        release_reply(reply, owner)
    }

    /// The release script over a blocking connection, for runtime shutdown.
    pub(crate) fn release_blocking(
        &self,
        conn: &mut redis::Connection,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> RedisResult<bool> {
        let cmd = self.release_cmd(keys, owner, keep_ms, false, None);
        let reply = self.release_lua(keys.kind).invoke_blocking(conn, &cmd)?;
        release_reply(reply, owner)
    }

    /// One EVALSHA of the renew script, for a pipeline of renewals (the caller
    /// handles NOSCRIPT through [`Scripts::load_renew`] and reads the reply with
    /// [`Scripts::renew_reply`]).
    pub(crate) fn renew_cmd(
        &self,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        end: LeaseEnd,
    ) -> Cmd {
        let lua = self.renew_lua(keys.kind);
        let mut cmd = match keys.kind {
            LockKind::Permit { .. } => lua.call(
                &[&keys.lock, keys.details(), keys.related()],
                3,
                owner.len() + 21,
            ),
            LockKind::Read => lua.call(&[&keys.lock, keys.details()], 3, owner.len() + 21),
            LockKind::Exclusive | LockKind::Write => lua.call(&[&keys.lock], 3, owner.len() + 21),
        };
        cmd.arg(owner)
            .arg(lease_ms)
            .arg(u8::from(end == LeaseEnd::ExactlyALease));
        cmd
    }

    /// Whether a renewal found the lock still ours.
    pub(crate) fn renew_reply(reply: (i64, String), owner: &str) -> RedisResult<bool> {
        check_owner(&reply.1, owner)?;
        Ok(reply.0 == 1)
    }

    /// Raises the fencing counter to `token` and records it as `owner`'s token
    /// if `owner` holds the lock; true when it does.
    pub(crate) async fn raise_fence(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        token: u64,
        fence_ttl_ms: u64,
    ) -> RedisResult<bool> {
        let mut cmd =
            self.raise_fence
                .call(&[&keys.lock, keys.fencing_counter()], 3, owner.len() + 40);
        cmd.arg(owner).arg(token).arg(fence_ttl_ms);
        let (ours, echoed): (i64, String) = self.raise_fence.invoke(conn, &cmd).await?;
        check_owner(&echoed, owner)?;
        Ok(ours == 1)
    }

    /// Issues `owner`'s fencing token if it holds the lock and has none yet,
    /// or reads the one it has (see `issue_token.lua`); `None` when the lock
    /// is not `owner`'s (gone or another owner's).
    pub(crate) async fn issue_token(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        fence_ttl_ms: u64,
    ) -> RedisResult<Option<u64>> {
        let mut cmd =
            self.issue_token
                .call(&[&keys.lock, keys.fencing_counter()], 2, owner.len() + 20);
        cmd.arg(owner).arg(fence_ttl_ms);
        let (ours, token, echoed): (i64, i64, String) = self.issue_token.invoke(conn, &cmd).await?;
        check_owner(&echoed, owner)?;
        Ok((ours == 1).then(|| u64::try_from(token).unwrap_or(0)))
    }

    /// `issue_token` followed by `WAIT replicas timeout` in one pipeline on
    /// `conn` (see `acquire_acked`): the token and how many replicas
    /// confirmed every write of the connection up to it.
    pub(crate) async fn issue_token_acked(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        owner: &str,
        fence_ttl_ms: u64,
        ack: &ReplicaAck,
    ) -> RedisResult<(Option<u64>, u32)> {
        let mut cmd =
            self.issue_token
                .call(&[&keys.lock, keys.fencing_counter()], 2, owner.len() + 20);
        cmd.arg(owner).arg(fence_ttl_ms);
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.add_command(cmd);
        pipe.cmd("WAIT").arg(ack.replicas).arg(ack.timeout_ms());
        let mut replies: Vec<redis::Value> = pipe.query_async(conn).await?;
        if matches!(replies.first(), Some(redis::Value::ServerError(e)) if e.code() == "NOSCRIPT") {
            self.issue_token.load(conn).await?;
            replies = pipe.query_async(conn).await?;
        }
        let [reply, acked]: [redis::Value; 2] = replies
            .try_into()
            .map_err(|_| out_of_sync("a token pipeline got the wrong number of replies"))?;
        let (ours, token, echoed): (i64, i64, String) = from_value(reply)?;
        check_owner(&echoed, owner)?;
        let acked: i64 = from_value(acked)?;
        Ok((
            (ours == 1).then(|| u64::try_from(token).unwrap_or(0)),
            u32::try_from(acked).unwrap_or(0),
        ))
    }

    /// Deletes the lock whoever holds it and tells its waiters (a hand-off to
    /// the head of its queue, or a wake-up); `Some(true)` when it was held,
    /// `None` when its name holds a value distlock did not write (left as it
    /// is). `only`: an owner token to free the lock only if that owner holds
    /// it; empty for whoever holds it.
    pub(crate) async fn force_unlock(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
        token: &str,
        only: &str,
        receipt_ms: u64,
    ) -> RedisResult<Option<bool>> {
        let receipt = self.unlock_receipt(&keys.lock, token);
        let mut cmd = self.force_unlock.call(
            &[
                &keys.lock,
                keys.fencing_counter(),
                keys.related(),
                keys.intent(),
                &receipt,
            ],
            6,
            keys.channel().len()
                + token.len()
                + self.handoff_base.len()
                + keys.events.len()
                + only.len()
                + 20,
        );
        cmd.arg(keys.channel())
            .arg(token)
            .arg(&self.handoff_base)
            .arg(&keys.events)
            .arg(only)
            .arg(receipt_ms);
        let (deleted, echoed): (i64, String) = self.force_unlock.invoke(conn, &cmd).await?;
        check_owner(&echoed, token)?;
        Ok((deleted != 3).then_some(deleted == 1))
    }

    /// The receipt of the force-unlock whose token is `token`, under the
    /// hash tag of `name` (a name of its key), so that it shares their slot.
    fn unlock_receipt(&self, name: &str, token: &str) -> String {
        receipt_name(&self.unlock_receipts, name, token)
    }

    /// Every hold on one user key, of every kind, and the default lock's
    /// queue; `None` when a name holds a value of a type distlock does not
    /// write there.
    pub(crate) async fn inspect_key(
        &self,
        conn: &mut impl ConnectionLike,
        names: &KeyNames,
    ) -> RedisResult<Option<KeyReading>> {
        let (lock, rw, sem) = (&names.lock, &names.read_write, &names.semaphore);
        let cmd = self.inspect_key.call(
            &[
                &lock.lock,
                lock.related(),
                lock.intent(),
                &rw.lock,
                rw.related(),
                rw.details(),
                rw.intent(),
                &sem.lock,
                sem.details(),
                sem.related(),
                &names.counter.counter,
                &names.counter.waiters,
            ],
            0,
            0,
        );
        let reply: Vec<redis::Value> = self.inspect_key.invoke(conn, &cmd).await?;
        read_key(reply)
    }

    /// Frees a read-write lock's or a semaphore's holds: every one
    /// ([`SharedRelease::All`]) or one holder's; how many were freed.
    pub(crate) async fn force_unlock_shared(
        &self,
        conn: &mut impl ConnectionLike,
        names: &KeyNames,
        what: SharedRelease<'_>,
        token: &str,
        receipt_ms: u64,
    ) -> RedisResult<u64> {
        let (rw, sem) = (&names.read_write, &names.semaphore);
        let receipt = self.unlock_receipt(&rw.lock, token);
        let (mode, owner) = match what {
            SharedRelease::All => ("all", ""),
            SharedRelease::Writer(owner) => ("write", owner),
            SharedRelease::Reader(owner) => ("read", owner),
            SharedRelease::Permit(member) => ("permit", member),
        };
        let mut cmd = self.force_unlock_shared.call(
            &[
                &rw.lock,
                rw.related(),
                rw.details(),
                rw.intent(),
                &sem.lock,
                sem.details(),
                sem.related(),
                &receipt,
            ],
            6,
            rw.channel().len() + sem.channel().len() + token.len() + owner.len() + 28,
        );
        cmd.arg(rw.channel())
            .arg(sem.channel())
            .arg(token)
            .arg(mode)
            .arg(owner)
            .arg(receipt_ms);
        let (freed, echoed): (i64, String) = self.force_unlock_shared.invoke(conn, &cmd).await?;
        check_owner(&echoed, token)?;
        Ok(u64::try_from(freed).unwrap_or(0))
    }

    /// Whether the lock exists (is held by anyone). `PTTL` (-2: no such key)
    /// rather than `EXISTS`, which the least-privilege ACL does not grant.
    pub(crate) async fn is_locked(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
    ) -> RedisResult<bool> {
        redis::cmd("PTTL")
            .arg(&keys.lock)
            .query_async::<i64>(conn)
            .await
            .map(|pttl| pttl != -2)
    }

    fn inspect_cmd(&self, keys: &RedisNames) -> Cmd {
        self.inspect.call(&[&keys.lock], 0, 0)
    }

    /// The lock's value and remaining lease, when anyone holds it.
    pub(crate) async fn inspect(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
    ) -> RedisResult<Option<HeldLock>> {
        let reply: Vec<redis::Value> = self.inspect.invoke(conn, &self.inspect_cmd(keys)).await?;
        read_inspect(reply)
    }

    /// A semaphore's held permits and stored permit count (`None` when nobody
    /// holds one); `Err` with a foreign-value error when its names hold values
    /// distlock did not write.
    pub(crate) async fn permit_counts(
        &self,
        conn: &mut impl ConnectionLike,
        keys: &RedisNames,
    ) -> RedisResult<PermitReply> {
        let cmd = self
            .permit_counts
            .call(&[&keys.lock, keys.related(), keys.details()], 0, 0);
        let (held, count): (i64, i64) = self.permit_counts.invoke(conn, &cmd).await?;
        Ok(match (held, count) {
            (-2, _) => PermitReply::Foreign,
            (held, -1) => PermitReply::Counts {
                held: u32::try_from(held).unwrap_or(u32::MAX),
                stored: None,
            },
            (held, count) => PermitReply::Counts {
                held: u32::try_from(held).unwrap_or(u32::MAX),
                stored: Some(u32::try_from(count).unwrap_or(u32::MAX)),
            },
        })
    }

    /// One renew script call, loading the script on NOSCRIPT.
    pub(crate) async fn invoke_renew(
        &self,
        conn: &mut impl ConnectionLike,
        kind: LockKind,
        cmd: &Cmd,
    ) -> RedisResult<(i64, String)> {
        self.renew_lua(kind).invoke(conn, cmd).await
    }

    /// Loads both renew scripts (exclusive locks and shared holds), for a
    /// renewal pipeline that met NOSCRIPT.
    pub(crate) async fn load_renew(&self, conn: &mut impl ConnectionLike) -> RedisResult<()> {
        self.renew.load(conn).await?;
        self.shared_renew.load(conn).await
    }

    /// A pipeline that loads the default lock's scripts and runs each path of
    /// them once on the lock `keys` (take with `SET NX`, take again as the same
    /// owner, a waiter that queues up, issue a fencing token, renew, release
    /// with a hand-off to the waiter, release with nobody waiting), with errors
    /// kept as values; and a name for each of its replies. Every command a lock
    /// needs runs, so a missing ACL permission shows up here.
    pub(crate) fn startup_probe(
        &self,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
    ) -> (redis::Pipeline, Vec<ProbeStep>) {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut steps = Vec::new();
        for lua in [
            &self.acquire,
            &self.release,
            &self.release_free,
            &self.renew,
            &self.inspect,
            &self.issue_token,
        ] {
            pipe.cmd("SCRIPT").arg("LOAD").arg(lua.source);
            steps.push(ProbeStep::command("SCRIPT LOAD"));
        }
        // Without a counter a token is the server's TIME.
        pipe.cmd("DEL").arg(keys.fencing_counter());
        steps.push(ProbeStep::command("DEL"));
        let spec = AcquireSpec {
            queue: true,
            queue_lease_ms: lease_ms,
            handoff_ttl_ms: lease_ms,
            handoff_route: "0",
            ..AcquireSpec::without_waiting("distlock start-up probe", None)
        };
        let mut take = redis::cmd("SET");
        take.arg(&keys.lock)
            .arg(format!("{owner}-0:0:distlock start-up probe"))
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .arg("GET");
        pipe.add_command(take);
        steps.push(ProbeStep::command("SET NX PX GET"));
        pipe.add_command(self.acquire_cmd(keys, owner, lease_ms, &spec));
        steps.push(ProbeStep::script(
            "the acquire script (re-entry)",
            &self.acquire,
        ));
        let other = crate::config::owner_token();
        let waiting = AcquireSpec {
            waiting: true,
            fence_ttl_ms: Some(lease_ms),
            ..spec
        };
        pipe.add_command(self.acquire_cmd(keys, &other, lease_ms, &waiting));
        steps.push(ProbeStep::script(
            "the acquire script (busy: queueing up)",
            &self.acquire,
        ));
        pipe.add_command(self.inspect_cmd(keys));
        steps.push(ProbeStep::script("the inspect script", &self.inspect));
        let mut issue =
            self.issue_token
                .call(&[&keys.lock, keys.fencing_counter()], 2, owner.len() + 20);
        issue.arg(owner).arg(lease_ms);
        pipe.add_command(issue);
        steps.push(ProbeStep::script(
            "the fencing token script",
            &self.issue_token,
        ));
        pipe.add_command(self.renew_cmd(keys, owner, lease_ms, LeaseEnd::AtLeastALease));
        steps.push(ProbeStep::script("the renew script", &self.renew));
        // A waiter queued: the free release declines, the full one hands
        // the lock over; the new holder, with nobody behind it, releases by
        // the free one.
        pipe.add_command(release_free_cmd(&self.release_free, keys, owner, None));
        steps.push(ProbeStep::script(
            "the free release script (declining)",
            &self.release_free,
        ));
        pipe.add_command(self.release_cmd(keys, owner, 0, false, None));
        steps.push(ProbeStep::script(
            "the release script (hand-off)",
            &self.release,
        ));
        pipe.add_command(release_free_cmd(&self.release_free, keys, &other, None));
        steps.push(ProbeStep::script(
            "the free release script",
            &self.release_free,
        ));
        // Nothing left to release: the full script answers not ours.
        pipe.add_command(self.release_cmd(keys, &other, 0, false, None));
        steps.push(ProbeStep::script("the release script", &self.release));
        // Leave nothing behind (the counter would otherwise live out its TTL).
        pipe.cmd("DEL").arg(keys.fencing_counter());
        steps.push(ProbeStep::command("DEL"));
        (pipe, steps)
    }
}

/// What a counting semaphore's script answered (`counter_acquire.lua`,
/// `counter_change.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CounterReply {
    pub(crate) outcome: CounterOutcome,
    /// The count the operation reports (see the scripts' headers): what is
    /// left, the new count, what was drained.
    pub(crate) count: i64,
    /// Acquisitions registered as waiting after the call.
    pub(crate) waiters: u64,
}

/// How a counting semaphore's operation came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CounterOutcome {
    /// Done (see each operation).
    Done,
    /// Not done: too few permits, a counter that exists or does not.
    NotDone,
    /// A name holds a value distlock did not write; nothing changed.
    Foreign,
    /// The change would leave the 64-bit range; nothing changed.
    Overflow,
}

/// One change or reading of a counting semaphore (see `counter_change.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CounterOp {
    /// Add this many (negative: remove); a release is an add.
    Add(i64),
    /// Create the counter at this count unless it exists.
    TrySet(i64),
    /// Set the counter to this count.
    Set(i64),
    /// Take every available permit.
    Drain,
    /// Read the count and the waiters.
    Read,
    /// Delete the counter.
    Delete,
}

impl CounterOp {
    fn name_and_amount(self) -> (&'static str, i64) {
        match self {
            CounterOp::Add(n) => ("add", n),
            CounterOp::TrySet(n) => ("try_set", n),
            CounterOp::Set(n) => ("set", n),
            CounterOp::Drain => ("drain", 0),
            CounterOp::Read => ("read", 0),
            CounterOp::Delete => ("delete", 0),
        }
    }
}

fn read_counter_reply(reply: (i64, String, String, i64), owner: &str) -> RedisResult<CounterReply> {
    let (status, count, echoed, waiters) = reply;
    check_owner(&echoed, owner)?;
    let outcome = match status {
        1 => CounterOutcome::Done,
        0 => CounterOutcome::NotDone,
        3 => CounterOutcome::Foreign,
        4 => CounterOutcome::Overflow,
        _ => {
            return Err(out_of_sync(
                "a counting semaphore reply with an unknown status",
            ))
        }
    };
    let count = count
        .parse()
        .map_err(|_| out_of_sync("a counting semaphore reply whose count is not an integer"))?;
    Ok(CounterReply {
        outcome,
        count,
        waiters: u64::try_from(waiters).unwrap_or(0),
    })
}

impl Scripts {
    /// Takes `wanted` permits of the counting semaphore `names` if that
    /// many are available; otherwise, with `register_ms` above 0, records
    /// `owner` as waiting for that long (see `counter_acquire.lua`). Taken,
    /// its receipt is kept `receipt_ms`: sent again within that time, it
    /// answers the same and takes nothing more.
    pub(crate) async fn counter_acquire(
        &self,
        conn: &mut impl ConnectionLike,
        names: &CounterNames,
        owner: &str,
        wanted: i64,
        register_ms: u64,
        receipt_ms: u64,
    ) -> RedisResult<CounterReply> {
        let receipt = names.receipt(owner);
        let mut cmd = self.counter_acquire.call(
            &[&names.counter, &names.waiters, &receipt],
            4,
            owner.len() + 60,
        );
        cmd.arg(owner).arg(wanted).arg(register_ms).arg(receipt_ms);
        let reply = self.counter_acquire.invoke(conn, &cmd).await?;
        read_counter_reply(reply, owner)
    }

    /// Changes or reads the counting semaphore `names` (see
    /// `counter_change.lua`); `owner` is echoed. A change that took effect
    /// keeps its receipt `receipt_ms`, as `counter_acquire` does.
    pub(crate) async fn counter_change(
        &self,
        conn: &mut impl ConnectionLike,
        names: &CounterNames,
        owner: &str,
        op: CounterOp,
        receipt_ms: u64,
    ) -> RedisResult<CounterReply> {
        let (name, amount) = op.name_and_amount();
        let receipt = names.receipt(owner);
        let mut cmd = self.counter_change.call(
            &[&names.counter, &names.waiters, &receipt],
            5,
            owner.len() + names.channel.len() + 52,
        );
        cmd.arg(owner)
            .arg(name)
            .arg(amount)
            .arg(&names.channel)
            .arg(receipt_ms);
        let reply = self.counter_change.invoke(conn, &cmd).await?;
        read_counter_reply(reply, owner)
    }
}

/// `<base>:{<tag>}:<id>`: a receipt under the hash tag of `name` (a name of
/// its key), so that it shares their slot.
fn receipt_name(base: &str, name: &str, id: &str) -> String {
    let tag = name
        .find('{')
        .and_then(|open| name[open..].find('}').map(|len| &name[open..=open + len]))
        .unwrap_or("{}");
    format!("{base}:{tag}:{id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn release_replies_are_read_and_checked() {
        // The default lock's release: the owner token alone when released.
        assert!(release_reply(text("me"), "me").unwrap());
        // Every release: `{released, owner}`.
        assert!(release_reply(Value::Array(vec![Value::Int(1), text("me")]), "me").unwrap());
        assert!(!release_reply(Value::Array(vec![Value::Int(0), text("me")]), "me").unwrap());
        // Another request's reply (another owner, or another command's shape:
        // the nil of a SET ... GET on a free lock) is out of sync.
        assert!(release_reply(text("you"), "me").is_err());
        assert!(release_reply(Value::Array(vec![Value::Int(1), text("you")]), "me").is_err());
        assert!(release_reply(Value::Nil, "me").is_err());
        assert!(release_reply(Value::Int(1), "me").is_err());
    }

    #[test]
    fn a_plain_acquisition_knows_its_own_value() {
        let owner = "0123456789abcdef0123456789abcdef";
        let mut cmd = Cmd::new();
        cmd.arg(FreeValue {
            owner,
            since_ms: 1_700_000_000_000,
            holder: "host:1",
        });
        let Some(redis::Arg::Simple(written)) = cmd.args_iter().next() else {
            panic!("one argument");
        };
        assert!(is_own_free_value(written, owner));
        assert!(is_lock_value(written));
        assert!(!is_own_free_value(
            written,
            "0123456789abcdef0123456789abcde0"
        ));
        // Marked by a waiter since: still ours.
        assert!(is_own_free_value(
            b"0123456789abcdef0123456789abcdef+0:1700000000000:host:1",
            owner
        ));
        // A prefix of the owner is not the owner; nor is a fenced value.
        assert!(!is_own_free_value(written, "0123456789abcdef"));
        assert!(!is_own_free_value(
            b"0123456789abcdef0123456789abcdef+7:1:h",
            owner
        ));
    }

    #[test]
    fn the_free_release_sends_and_checks_the_claim() {
        // The claim: the owner token and the unmarked byte, as one argument.
        let mut cmd = Cmd::new();
        cmd.arg(Unmarked("me"));
        assert_eq!(cmd.args_iter().count(), 1);
        assert!(matches!(
            cmd.args_iter().next(),
            Some(redis::Arg::Simple(arg)) if arg == b"me-"
        ));
        // Released: the claim echoed; not done: 0.
        assert_eq!(release_free_reply(text("me-"), "me").unwrap(), Some(true));
        assert_eq!(release_free_reply(Value::Int(0), "me").unwrap(), None);
        // Another request's reply is out of sync.
        assert!(release_free_reply(text("me"), "me").is_err());
        assert!(release_free_reply(text("you-"), "me").is_err());
        assert!(release_free_reply(Value::Nil, "me").is_err());
        assert!(release_free_reply(Value::Int(1), "me").is_err());
    }

    #[test]
    fn a_free_acquisition_writes_the_value_in_one_argument() {
        let mut cmd = Cmd::new();
        let value = FreeValue {
            owner: "me",
            since_ms: 1_700_000_000_123,
            holder: "host:42 a:b",
        };
        assert!(value.len() >= b"me-0:1700000000123:host:42 a:b".len());
        cmd.arg(value);
        assert_eq!(cmd.args_iter().count(), 1);
        assert!(matches!(
            cmd.args_iter().next(),
            Some(redis::Arg::Simple(arg)) if arg == b"me-0:1700000000123:host:42 a:b"
        ));
        assert!(is_lock_value(
            b"0123456789abcdef0123456789abcdef-0:1700000000123:h"
        ));
    }

    #[test]
    fn acquire_all_replies_are_read_and_checked() {
        let ok = vec![Value::Int(1), text("me"), Value::Int(7), Value::Int(9)];
        assert_eq!(
            read_acquire_all(ok.clone(), "me", 2).unwrap(),
            AcquireAllReply::Acquired {
                fencing_tokens: vec![7, 9]
            }
        );
        // Another request's reply, or one of the wrong length, is out of sync.
        assert!(read_acquire_all(ok.clone(), "you", 2).is_err());
        assert!(read_acquire_all(ok, "me", 3).is_err());
        assert!(read_acquire_all(vec![Value::Int(1)], "me", 0).is_err());

        let busy = vec![Value::Int(0), text("me"), Value::Int(2), Value::Int(1500)];
        assert_eq!(
            read_acquire_all(busy, "me", 3).unwrap(),
            AcquireAllReply::Busy {
                index: 1,
                remaining: Some(Duration::from_millis(1500))
            }
        );
        let no_ttl = vec![Value::Int(0), text("me"), Value::Int(1), Value::Int(-1)];
        assert_eq!(
            read_acquire_all(no_ttl, "me", 1).unwrap(),
            AcquireAllReply::Busy {
                index: 0,
                remaining: None
            }
        );
        for index in [0, 4] {
            let bad = vec![Value::Int(0), text("me"), Value::Int(index), Value::Int(5)];
            assert!(read_acquire_all(bad, "me", 3).is_err());
        }
    }

    #[test]
    fn the_acquire_all_script_documents_its_interface() {
        let source = include_str!("../scripts/acquire_all.lua");
        for part in ["KEYS[4i-3]", "KEYS[4i]", "ARGV[6]", "Returns"] {
            assert!(source.contains(part), "{part}");
        }
    }

    #[test]
    fn counter_replies_are_read_exactly_and_checked() {
        let reply = |status, count: &str, owner: &str, waiters| {
            (status, count.to_owned(), owner.to_owned(), waiters)
        };
        assert_eq!(
            read_counter_reply(reply(1, "-9223372036854775808", "me", 2), "me").unwrap(),
            CounterReply {
                outcome: CounterOutcome::Done,
                count: i64::MIN,
                waiters: 2
            }
        );
        let overflow = read_counter_reply(reply(4, "9223372036854775807", "me", 0), "me");
        assert_eq!(overflow.unwrap().outcome, CounterOutcome::Overflow);
        assert!(read_counter_reply(reply(1, "1", "other", 0), "me").is_err());
        assert!(read_counter_reply(reply(7, "1", "me", 0), "me").is_err());
        assert!(read_counter_reply(reply(1, "1.5", "me", 0), "me").is_err());
    }
}
