//! The floors: locks done by hand with redis-rs on one multiplexed connection.
//!
//! * [`Floor`], the **same-scripts floor**: the very Lua text of the runtime
//!   (`include_str!` of `lock-runtime/src/scripts/*.lua`), so that the server
//!   does identical work and only the client side differs. What distlock costs
//!   on top of its own protocol. A first attempt is the runtime's plain
//!   `SET NX PX GET`; a waiting attempt one `EVALSHA` of `acquire.lua` (which
//!   marks the lock: the floor's waiters do not queue, they wait for the
//!   release's broadcast, as the runtime's waiters on a Redlock do); a
//!   release is the runtime's too: a hold that did not wait sends
//!   `release_free.lua` (the lock's key alone) and only if it declines (a
//!   waiter marked the lock) `release.lua`, which publishes the wake-up; a
//!   hold that waited sends `release.lua` (releasing every hold with
//!   `release.lua`, as the floor did before `cab7e89`, is more server work
//!   than distlock's free release: ratios to the floor from `7168656` to
//!   then flatter distlock, 1.00x-1.01x where this floor gives 1.03x). A
//!   waiter listens on a pub/sub
//!   connection opened and subscribed before the measurement and retries
//!   when woken, or after a short fallback sleep.
//!   Renewal is one pipeline of `renew.lua` calls per 512 locks. The scripts'
//!   arguments are built in one place, [`same_scripts`], to follow the runtime
//!   when their signatures change.
//! * [`Minimal`], the **minimal floor**: `SET key owner NX PX lease` to acquire
//!   and a compare-and-delete script to release: the least a lock can do (no
//!   fencing token, no re-entry, no wake-up).
//!
//! Both connect to one server, or to a Redis Cluster ([`Conn`]): the
//! **cluster floor** is the same-scripts floor sending the same `EVALSHA`s
//! over one multiplexed connection per master, each to the master of its
//! first key's slot (a lock's names share one hash tag) in a slot map read
//! once ([`ClusterConns`]), as distlock routes its own: the least a client
//! can do on a cluster that does not change under it. Pub/sub stays a plain
//! connection to one node: a classic `PUBLISH` on any cluster node reaches
//! the subscribers of every node.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Script, ScriptInvocation, Value};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::error::{bail, context, Result};

/// What the implementations connect to.
#[derive(Debug, Clone)]
pub enum Target {
    /// One redis-server (or a counting proxy in front of it).
    Single(String),
    /// A Redis Cluster, by the URLs of its nodes: distlock through
    /// `cluster_builder`, the floors through [`ClusterConns`].
    Cluster(Vec<String>),
    /// Independent redis-servers, one URL each: distlock through
    /// `redlock_builder` only (no floor, no peer).
    Redlock(Vec<String>),
}

/// One multiplexed connection to a server, or one per master of a cluster.
#[derive(Clone)]
pub enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConns),
}

/// A Redis Cluster as the floors reach it: the slot map read once with
/// `CLUSTER SLOTS`, one multiplexed connection per master, each request
/// (a pipeline: its first keyed command) sent to the master of its first
/// key's slot; a `SCRIPT` command (`SCRIPT LOAD` after `NOSCRIPT`) to every
/// master, the first master's reply returned. No redirection is followed:
/// the bench's cluster does not change while it runs, and a `MOVED` fails
/// the run. A clone shares the connections (each request clones the one it
/// uses, as a single server's floor clones its connection per cycle).
#[derive(Clone)]
pub struct ClusterConns {
    /// `(first slot, last slot, index in conns)`, sorted.
    ranges: Arc<Vec<(u16, u16, usize)>>,
    conns: Arc<[MultiplexedConnection]>,
}

/// Where a request goes.
enum Route {
    Master(usize),
    EveryMaster,
}

impl ClusterConns {
    /// Reads the slot map from the first of `urls` (every node's URL) and
    /// connects to each master.
    async fn open(urls: &[String]) -> Result<ClusterConns> {
        let Some(seed) = urls.first() else {
            bail!("no cluster node URL");
        };
        let mut first = crate::scenarios::common::redis_client(seed)?
            .get_multiplexed_async_connection()
            .await?;
        let reply: Vec<Vec<Value>> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut first)
            .await?;
        let mut ports: Vec<u16> = Vec::new();
        let mut ranges = Vec::new();
        for range in reply {
            let mut fields = range.into_iter();
            let (Some(first), Some(last), Some(master)) =
                (fields.next(), fields.next(), fields.next())
            else {
                bail!("unexpected CLUSTER SLOTS reply");
            };
            let (_host, port): (Value, u16) =
                match redis::from_redis_value::<Vec<Value>>(master)?.as_slice() {
                    [host, port, ..] => (host.clone(), redis::from_redis_value(port.clone())?),
                    _ => bail!("unexpected CLUSTER SLOTS master"),
                };
            let index = match ports.iter().position(|p| *p == port) {
                Some(index) => index,
                None => {
                    ports.push(port);
                    ports.len() - 1
                }
            };
            ranges.push((
                redis::from_redis_value::<u16>(first)?,
                redis::from_redis_value::<u16>(last)?,
                index,
            ));
        }
        ranges.sort_unstable();
        let mut conns = Vec::new();
        for port in ports {
            // The fixtures' nodes all listen on 127.0.0.1: a master is the
            // node URL with its port.
            let Some(url) = urls.iter().find(|url| url.ends_with(&format!(":{port}"))) else {
                bail!("no node URL with port {port}");
            };
            conns.push(
                crate::scenarios::common::redis_client(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            );
        }
        Ok(ClusterConns {
            ranges: Arc::new(ranges),
            conns: conns.into(),
        })
    }

    /// Where `cmds` go: the master of their first key's slot, every master
    /// for `SCRIPT`; an error for anything else (no key, or a slot no
    /// master serves).
    fn route<'a, I: Iterator<Item = &'a Cmd>>(
        &self,
        cmds: impl Fn() -> I,
    ) -> redis::RedisResult<Route> {
        if cmds().all(is_script) {
            return Ok(Route::EveryMaster);
        }
        let unrouted = || {
            redis::RedisError::from((
                redis::ErrorKind::Client,
                "the cluster floor cannot route this request",
            ))
        };
        let key = cmds().find_map(first_key).ok_or_else(unrouted)?;
        let slot = distlock_testing::key_slot(key);
        let i = self.ranges.partition_point(|(first, _, _)| *first <= slot);
        match i.checked_sub(1).and_then(|i| self.ranges.get(i)) {
            Some((_, last, index)) if slot <= *last => Ok(Route::Master(*index)),
            _ => Err(unrouted()),
        }
    }
}

/// Sends with `send` to every master in turn; the first master's reply.
async fn on_every_master<T, Fut>(
    conns: &[MultiplexedConnection],
    send: impl Fn(MultiplexedConnection) -> Fut,
) -> redis::RedisResult<T>
where
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    let mut first = None;
    for conn in conns {
        let reply = send(conn.clone()).await?;
        first.get_or_insert(reply);
    }
    first.ok_or_else(|| (redis::ErrorKind::Client, "no master").into())
}

fn is_script(cmd: &Cmd) -> bool {
    cmd.args_iter().next().is_some_and(
        |arg| matches!(arg, redis::Arg::Simple(name) if name.eq_ignore_ascii_case(b"SCRIPT")),
    )
}

/// The first key of a command the floors send (`EVALSHA sha n key..`, `SET
/// key ..`); `None` for a script without keys.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => bytes,
        _ => &[],
    });
    let name = args.next()?;
    if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL") {
        let _script = args.next()?;
        let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
        return if keys == 0 { None } else { args.next() };
    }
    args.next()
}

impl ConnectionLike for ClusterConns {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let route = self.route(|| std::iter::once(cmd));
        Box::pin(async move {
            match route? {
                Route::Master(i) => self.conns[i].clone().req_packed_command(cmd).await,
                Route::EveryMaster => {
                    on_every_master(&self.conns, |mut conn| async move {
                        conn.req_packed_command(cmd).await
                    })
                    .await
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let route = self.route(|| pipeline.cmd_iter());
        Box::pin(async move {
            match route? {
                Route::Master(i) => {
                    let mut conn = self.conns[i].clone();
                    conn.req_packed_commands(pipeline, offset, count).await
                }
                Route::EveryMaster => {
                    on_every_master(&self.conns, |mut conn| async move {
                        conn.req_packed_commands(pipeline, offset, count).await
                    })
                    .await
                }
            }
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl Conn {
    pub async fn open(target: &Target) -> Result<Conn> {
        Ok(match target {
            Target::Single(url) => Conn::Single(
                crate::scenarios::common::redis_client(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            Target::Cluster(urls) => Conn::Cluster(ClusterConns::open(urls).await?),
            Target::Redlock(_) => bail!("the floors run on one server or a cluster, not a Redlock"),
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// `acquire.lua` after the helpers it is prepended with, as the runtime sends it.
pub const ACQUIRE_LUA: &str = concat!(
    include_str!("../../lock-runtime/src/scripts/shared_prelude.lua"),
    include_str!("../../lock-runtime/src/scripts/queue_prelude.lua"),
    include_str!("../../lock-runtime/src/scripts/acquire.lua")
);
/// `release.lua` after its helpers, as the runtime sends it.
pub const RELEASE_LUA: &str = concat!(
    include_str!("../../lock-runtime/src/scripts/release.lua"),
    include_str!("../../lock-runtime/src/scripts/shared_prelude.lua"),
    include_str!("../../lock-runtime/src/scripts/queue_prelude.lua"),
    include_str!("../../lock-runtime/src/scripts/release_queue.lua")
);
pub const RENEW_LUA: &str = include_str!("../../lock-runtime/src/scripts/renew.lua");
/// `release_free.lua`, the runtime's first release of a hold that did not wait.
pub const RELEASE_FREE_LUA: &str = include_str!("../../lock-runtime/src/scripts/release_free.lua");

/// Renewals per pipeline, as in the runtime.
pub const RENEW_BATCH: usize = 512;

/// The Redis names of one lock, built exactly as the runtime builds them, so
/// that names (and so the bytes sent and hashed) have the same length.
#[derive(Debug, Clone)]
pub struct Names {
    pub lock: String,
    pub fence: String,
    pub channel: String,
    pub queue: String,
    pub entries: String,
}

impl Names {
    pub fn new(prefix: &str, key: &str) -> Names {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let hash = key
            .bytes()
            .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
        let name = |kind: &str| format!("{prefix}{kind}:{{{hash:016x}}}:{key}");
        Names {
            lock: name("lock"),
            fence: name("fence"),
            channel: name("wake"),
            queue: name("lockq"),
            entries: name("lockqe"),
        }
    }
}

/// One acquire attempt's answer.
pub enum Attempt {
    Acquired,
    /// Held by another owner for this many more milliseconds (-1: no TTL).
    Busy(i64),
}

#[derive(Clone)]
pub struct Floor {
    conn: Conn,
    scripts: Arc<(Script, Script, Script)>,
    release_free: Arc<Script>,
    wakeups: Arc<Wakeups>,
}

#[derive(Default)]
struct Wakeups {
    by_channel: Mutex<HashMap<String, Channel>>,
}

/// The waiters of one channel, all on one `Notify`: each message wakes the one
/// registered first (a waiter re-registers, at the back, every time it sleeps).
#[derive(Default)]
struct Channel {
    shared: Arc<Notify>,
}

impl Wakeups {
    fn with<T>(&self, channel: &str, f: impl FnOnce(&mut Channel) -> T) -> T {
        let mut map = self.by_channel.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(channel) {
            Some(c) => f(c),
            None => f(map.entry(channel.to_owned()).or_default()),
        }
    }

    fn notify(&self, channel: &str) -> Arc<Notify> {
        self.with(channel, |c| c.shared.clone())
    }

    fn wake(&self, channel: &str) {
        self.with(channel, |c| c.shared.notify_one());
    }
}

/// The floor's subscriber task; stops when dropped.
pub struct Subscription(JoinHandle<()>);

impl Drop for Subscription {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Floor {
    pub async fn connect(target: &Target) -> Result<Floor> {
        let conn = Conn::open(target)
            .await
            .map_err(context("floor: connect"))?;
        Ok(Floor {
            conn,
            scripts: Arc::new((
                Script::new(ACQUIRE_LUA),
                Script::new(RELEASE_LUA),
                Script::new(RENEW_LUA),
            )),
            release_free: Arc::new(Script::new(RELEASE_FREE_LUA)),
            wakeups: Arc::default(),
        })
    }

    /// Opens the pub/sub connection and subscribes to `channels` (or, with
    /// `pattern`, to one pattern) before anything is measured. Each message
    /// wakes the waiter of that channel that has waited longest.
    pub async fn subscribe(
        &self,
        url: &str,
        channels: &[String],
        pattern: Option<&str>,
    ) -> Result<Subscription> {
        use futures_util::StreamExt;
        let client = crate::scenarios::common::redis_client(url)?;
        let mut pubsub = client
            .get_async_pubsub()
            .await
            .map_err(context("floor: pub/sub connect"))?;
        for c in channels {
            pubsub
                .subscribe(c)
                .await
                .map_err(context("floor: SUBSCRIBE"))?;
            self.wakeups.with(c, |_| ());
        }
        if let Some(p) = pattern {
            pubsub
                .psubscribe(p)
                .await
                .map_err(context("floor: PSUBSCRIBE"))?;
        }
        let wakeups = self.wakeups.clone();
        Ok(Subscription(tokio::spawn(async move {
            let mut stream = pubsub.into_on_message();
            while let Some(msg) = stream.next().await {
                wakeups.wake(msg.get_channel_name());
            }
        })))
    }

    /// Opens a pub/sub connection of its own subscribed to `channel`; every
    /// message on it arrives, in order, on the returned receiver.
    pub async fn subscribe_counted(
        url: &str,
        channel: &str,
    ) -> Result<(Subscription, mpsc::UnboundedReceiver<()>)> {
        use futures_util::StreamExt;
        let client = crate::scenarios::common::redis_client(url)?;
        let mut pubsub = client
            .get_async_pubsub()
            .await
            .map_err(context("floor: pub/sub connect"))?;
        pubsub
            .subscribe(channel)
            .await
            .map_err(context("floor: SUBSCRIBE"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut stream = pubsub.into_on_message();
            while stream.next().await.is_some() {
                if tx.send(()).is_err() {
                    return;
                }
            }
        });
        Ok((Subscription(task), rx))
    }

    /// One attempt: the runtime's plain `SET NX PX GET` for a first try, the
    /// acquire script when `waiting` (this client listens for the lock's
    /// wake-ups: it marks the lock, so the holder's release publishes one).
    pub async fn try_acquire(
        &self,
        names: &Names,
        owner: &str,
        lease_ms: u64,
        waiting: bool,
    ) -> Result<Attempt> {
        let mut conn = self.conn.clone();
        if !waiting {
            let held: Option<Vec<u8>> = same_scripts::take(names, owner, lease_ms)
                .query_async(&mut conn)
                .await
                .map_err(context("floor: SET NX PX GET"))?;
            return Ok(match held {
                None => Attempt::Acquired,
                Some(_) => Attempt::Busy(-1),
            });
        }
        // The scripts echo the owner token (the runtime checks it; the floor,
        // doing the least, only reads past it).
        let (status, value, _owner): (i64, i64, String) =
            same_scripts::acquire(&self.scripts.0, names, owner, lease_ms, waiting)
                .invoke_async(&mut conn)
                .await
                .map_err(context("floor: acquire"))?;
        Ok(if status == 1 {
            Attempt::Acquired
        } else {
            Attempt::Busy(value)
        })
    }

    /// Acquires, waiting for a wake-up (or a fallback nap) while the lock is busy;
    /// true when it waited. Needs [`Floor::subscribe`] to cover `names.channel`
    /// for prompt wake-ups.
    pub async fn acquire(&self, names: &Names, owner: &str, lease_ms: u64) -> Result<bool> {
        let notify = self.wakeups.notify(&names.channel);
        let mut waiting = false;
        loop {
            // Listen before the attempt, so a release between the two still wakes us.
            let mut woken = pin!(notify.notified());
            woken.as_mut().enable();
            match self.try_acquire(names, owner, lease_ms, waiting).await? {
                Attempt::Acquired => return Ok(waiting),
                Attempt::Busy(pttl) => {
                    waiting = true;
                    let nap = Duration::from_millis(u64::try_from(pttl).unwrap_or(50).clamp(1, 50));
                    tokio::select! {
                        _ = woken => {}
                        _ = tokio::time::sleep(nap) => {}
                    }
                }
            }
        }
    }

    /// Acquires as the least a waiter that listens can do: `SET NX`; when
    /// busy, the acquire script marks the lock (so its release publishes a
    /// wake-up) and the waiter sleeps until the wake-up (or a fallback nap),
    /// then `SET NX` again. Needs [`Floor::subscribe`] to cover `names.channel`.
    pub async fn acquire_by_set_nx(&self, names: &Names, owner: &str, lease_ms: u64) -> Result<()> {
        let notify = self.wakeups.notify(&names.channel);
        let mut mark = false;
        loop {
            let mut woken = pin!(notify.notified());
            woken.as_mut().enable();
            match self.try_acquire(names, owner, lease_ms, mark).await? {
                Attempt::Acquired => return Ok(()),
                // Not marked yet: mark it at once, before any sleep.
                Attempt::Busy(_) if !mark => mark = true,
                Attempt::Busy(pttl) => {
                    let nap = Duration::from_millis(u64::try_from(pttl).unwrap_or(50).clamp(1, 50));
                    tokio::select! {
                        _ = woken => {}
                        _ = tokio::time::sleep(nap) => {}
                    }
                    mark = false;
                }
            }
        }
    }

    pub async fn release(&self, names: &Names, owner: &str) -> Result<bool> {
        let mut conn = self.conn.clone();
        // The runtime's reply: the owner token alone when released, else
        // `{0, owner}`.
        let reply: Value = same_scripts::release(&self.scripts.1, names, owner)
            .invoke_async(&mut conn)
            .await
            .map_err(context("floor: release"))?;
        Ok(matches!(reply, Value::BulkString(_)))
    }

    /// The runtime's release of a hold that did not wait: `release_free.lua`
    /// (the lock's key alone), then `release.lua` only if a waiter marked the
    /// lock since (or it is no longer ours).
    pub async fn release_unwaited(&self, names: &Names, owner: &str) -> Result<bool> {
        let mut conn = self.conn.clone();
        // The claim: the owner token and the unmarked byte, as the runtime's.
        let reply: Value = self
            .release_free
            .key(&names.lock)
            .arg(format!("{owner}-"))
            .invoke_async(&mut conn)
            .await
            .map_err(context("floor: free release"))?;
        match reply {
            Value::BulkString(_) => Ok(true),
            _ => self.release(names, owner).await,
        }
    }

    /// Loads the renew script, so that pipelines of `EVALSHA` find it.
    pub async fn load_renew(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        self.scripts
            .2
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .map_err(context("floor: SCRIPT LOAD renew"))?;
        Ok(())
    }

    /// Renews `locks` (lock name, owner) in pipelines of [`RENEW_BATCH`];
    /// returns how many were no longer ours.
    pub async fn renew_all(&self, locks: &[(Names, String)], lease_ms: u64) -> Result<usize> {
        let sha = self.scripts.2.get_hash().to_owned();
        let mut lost = 0;
        for batch in locks.chunks(RENEW_BATCH) {
            let mut pipe = redis::pipe();
            for (names, owner) in batch {
                same_scripts::renew(&mut pipe, &sha, names, owner, lease_ms);
            }
            let mut conn = self.conn.clone();
            let replies: Vec<(i64, String)> = pipe
                .query_async(&mut conn)
                .await
                .map_err(context("floor: renew pipeline"))?;
            lost += replies.iter().filter(|(r, _)| *r != 1).count();
        }
        Ok(lost)
    }
}

/// The arguments of the runtime's scripts, in one place: when the runtime
/// changes a script's signature, only this module follows it.
pub mod same_scripts {
    use super::{Names, Script, ScriptInvocation};

    /// The runtime's hand-off base for the default prefix (`<prefix>handoff`).
    const HANDOFF_BASE: &str = "distlock:handoff";

    /// The holder description: about as long as the runtime's default
    /// (`<host> pid <pid> <program>`).
    const HOLDER: &str = "bench-host pid 12345 lock-bench";

    fn since_ms() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// The runtime's attempt without a token that does not wait: `SET NX PX
    /// GET` of the lock's value (token 0).
    pub fn take(names: &Names, owner: &str, lease_ms: u64) -> redis::Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg(&names.lock)
            .arg(format!("{owner}-0:{}:{HOLDER}", since_ms()))
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .arg("GET");
        cmd
    }

    /// `acquire.lua`: KEYS lock, fence, queue, entries; ARGV owner, lease ms,
    /// fence TTL ms ('0': no token, as the runtime's default), waiting mark,
    /// acquisition time (ms), holder description, queue ('0': mark only),
    /// queue lease, hand-off TTL, hand-off base, route, attempt number, events
    /// channel ('': none, as the runtime's default).
    pub fn acquire<'a>(
        script: &'a Script,
        names: &Names,
        owner: &str,
        lease_ms: u64,
        waiting: bool,
    ) -> ScriptInvocation<'a> {
        let mut inv = script.key(&names.lock);
        inv.key(&names.fence)
            .key(&names.queue)
            .key(&names.entries)
            .arg(owner)
            .arg(lease_ms)
            .arg("0")
            .arg(if waiting { "+" } else { "-" })
            .arg(since_ms())
            .arg(HOLDER)
            .arg("0")
            .arg(3000)
            .arg(lease_ms)
            .arg(HANDOFF_BASE)
            .arg("0")
            .arg(0)
            .arg("");
        inv
    }

    /// `release.lua`: KEYS lock, fence, queue, entries; ARGV owner (no
    /// `min_hold`, no lock events: the runtime's default sends nothing else).
    pub fn release<'a>(script: &'a Script, names: &Names, owner: &str) -> ScriptInvocation<'a> {
        let mut inv = script.key(&names.lock);
        inv.key(&names.fence)
            .key(&names.queue)
            .key(&names.entries)
            .arg(owner);
        inv
    }

    /// `renew.lua` as one `EVALSHA` of a pipeline: KEYS lock; ARGV owner,
    /// lease ms, 0 (a renewal, which never shortens the lease).
    pub fn renew(pipe: &mut redis::Pipeline, sha: &str, names: &Names, owner: &str, lease_ms: u64) {
        pipe.cmd("EVALSHA")
            .arg(sha)
            .arg(1)
            .arg(&names.lock)
            .arg(owner)
            .arg(lease_ms)
            .arg(0);
    }
}

/// Compare-and-delete: the minimal floor's release.
pub const MINIMAL_RELEASE_LUA: &str = "\
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

/// The minimal floor: `SET NX PX` and a compare-and-delete script.
#[derive(Clone)]
pub struct Minimal {
    conn: Conn,
    release: Arc<Script>,
}

impl Minimal {
    pub async fn connect(target: &Target) -> Result<Minimal> {
        let conn = Conn::open(target)
            .await
            .map_err(context("minimal floor: connect"))?;
        Ok(Minimal {
            conn,
            release: Arc::new(Script::new(MINIMAL_RELEASE_LUA)),
        })
    }

    /// One attempt: true when the lock is ours.
    pub async fn try_acquire(&self, key: &str, owner: &str, lease_ms: u64) -> Result<bool> {
        let mut conn = self.conn.clone();
        let reply: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .query_async(&mut conn)
            .await
            .map_err(context("minimal floor: SET NX PX"))?;
        Ok(reply.is_some())
    }

    /// True when the lock was still ours (and is now deleted).
    pub async fn release(&self, key: &str, owner: &str) -> Result<bool> {
        let mut conn = self.conn.clone();
        let deleted: i64 = self
            .release
            .key(key)
            .arg(owner)
            .invoke_async(&mut conn)
            .await
            .map_err(context("minimal floor: release"))?;
        Ok(deleted == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_runtime() {
        // Pinned against `LockManager::redis_names` in the runtime's format.
        let n = Names::new("distlock:", "a");
        assert_eq!(n.lock, "distlock:lock:{af63dc4c8601ec8c}:a");
        assert_eq!(n.fence, "distlock:fence:{af63dc4c8601ec8c}:a");
        assert_eq!(n.channel, "distlock:wake:{af63dc4c8601ec8c}:a");
    }
}

/// The **raw-socket floor**: the minimal floor's two commands (`SET key owner
/// NX PX lease`, then `EVALSHA` of the compare-and-delete script) written as
/// RESP by hand on one `TcpStream`, the reply read in the calling task. No
/// redis-rs: no channel to a connection task, no reply parser, no `Value`.
/// What the multiplexed connection that distlock, rslock and both other floors
/// use costs a cycle. One server only, and one task at a time (the stream is
/// behind a mutex: no pipelining), so it is a row of `uncontended` and a
/// `--profile` target, nothing else.
#[derive(Clone)]
pub struct RawMinimal {
    conn: Arc<tokio::sync::Mutex<RawConn>>,
    release_sha: Arc<str>,
}

struct RawConn {
    stream: tokio::net::TcpStream,
    out: Vec<u8>,
    reply: Vec<u8>,
}

impl RawMinimal {
    pub async fn connect(target: &Target) -> Result<RawMinimal> {
        let Target::Single(url) = target else {
            bail!("the raw-socket floor runs on one server only");
        };
        let addr = url
            .strip_prefix("redis://")
            .and_then(|rest| rest.split('/').next())
            .filter(|addr| !addr.contains('@'))
            .ok_or_else(|| {
                format!("raw-socket floor: a plain redis:// URL without a password, not {url}")
            })?;
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(context("raw-socket floor: connect"))?;
        stream
            .set_nodelay(true)
            .map_err(context("raw-socket floor: TCP_NODELAY"))?;
        let mut conn = RawConn {
            stream,
            out: Vec::with_capacity(256),
            reply: Vec::with_capacity(256),
        };
        let sha = conn
            .call(&[b"SCRIPT", b"LOAD", MINIMAL_RELEASE_LUA.as_bytes()])
            .await?;
        let sha = sha
            .strip_prefix(b"$40\r\n")
            .and_then(|s| std::str::from_utf8(&s[..40.min(s.len())]).ok())
            .ok_or("raw-socket floor: SCRIPT LOAD replied with no SHA1")?
            .into();
        Ok(RawMinimal {
            conn: Arc::new(tokio::sync::Mutex::new(conn)),
            release_sha: sha,
        })
    }

    /// One attempt: true when the lock is ours.
    pub async fn try_acquire(&self, key: &str, owner: &str, lease_ms: u64) -> Result<bool> {
        let mut lease = itoa::Buffer::new();
        let mut conn = self.conn.lock().await;
        let reply = conn
            .call(&[
                b"SET",
                key.as_bytes(),
                owner.as_bytes(),
                b"NX",
                b"PX",
                lease.format(lease_ms).as_bytes(),
            ])
            .await?;
        match reply {
            b"+OK\r\n" => Ok(true),
            b"$-1\r\n" => Ok(false),
            other => bail!(
                "raw-socket floor: SET NX PX replied {:?}",
                String::from_utf8_lossy(other)
            ),
        }
    }

    /// True when the lock was still ours (and is now deleted).
    pub async fn release(&self, key: &str, owner: &str) -> Result<bool> {
        let mut conn = self.conn.lock().await;
        let reply = conn
            .call(&[
                b"EVALSHA",
                self.release_sha.as_bytes(),
                b"1",
                key.as_bytes(),
                owner.as_bytes(),
            ])
            .await?;
        match reply {
            b":1\r\n" => Ok(true),
            b":0\r\n" => Ok(false),
            other => bail!(
                "raw-socket floor: release replied {:?}",
                String::from_utf8_lossy(other)
            ),
        }
    }
}

impl RawConn {
    /// Sends one command and returns its reply, which must be one line or one
    /// bulk string (all the replies this floor gets).
    async fn call(&mut self, args: &[&[u8]]) -> Result<&[u8]> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut n = itoa::Buffer::new();
        self.out.clear();
        self.out.push(b'*');
        self.out.extend_from_slice(n.format(args.len()).as_bytes());
        self.out.extend_from_slice(b"\r\n");
        for arg in args {
            self.out.push(b'$');
            self.out.extend_from_slice(n.format(arg.len()).as_bytes());
            self.out.extend_from_slice(b"\r\n");
            self.out.extend_from_slice(arg);
            self.out.extend_from_slice(b"\r\n");
        }
        self.stream
            .write_all(&self.out)
            .await
            .map_err(context("raw-socket floor: write"))?;
        self.reply.clear();
        loop {
            if reply_complete(&self.reply) {
                return Ok(&self.reply);
            }
            let mut chunk = [0u8; 256];
            let read = self
                .stream
                .read(&mut chunk)
                .await
                .map_err(context("raw-socket floor: read"))?;
            if read == 0 {
                bail!("raw-socket floor: the server closed the connection");
            }
            self.reply.extend_from_slice(&chunk[..read]);
        }
    }
}

/// Whether `reply` holds a whole line reply, or a whole bulk string.
fn reply_complete(reply: &[u8]) -> bool {
    let Some(eol) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    if reply.first() != Some(&b'$') {
        return true;
    }
    match std::str::from_utf8(&reply[1..eol])
        .ok()
        .and_then(|n| n.parse::<i64>().ok())
    {
        Some(len) if len >= 0 => reply.len() >= eol + 2 + len as usize + 2,
        _ => true,
    }
}
