//! Redis Cluster: one call per lock on the master of its slot, renewals
//! pipelined per node, wake-ups over classic pub/sub on any node.
//!
//! - The manager routes its own requests: a slot map read with `CLUSTER
//!   SLOTS` names each slot's master, and every request goes on the
//!   manager's own connection to that node (one per node, see
//!   `Cluster::node_connection`). A lock's names share one hash tag (see
//!   `keys.rs`), so each script runs on one node. A request follows `MOVED`
//!   (the map names the new master for that slot) and `ASK` (`ASKING` in the
//!   same write), and
//!   is sent once more only when its connection broke before the reply (see
//!   `SlotConn`). `TRYAGAIN`, `CLUSTERDOWN` and a redirection that outlives
//!   five hops make an acquisition "busy", so the
//!   waiting loop retries it within `wait`; the script never ran, so nothing
//!   was granted. Release and renewal retry them within the command timeout.
//!   redis-rs's cluster client is not used: a request for a master it was
//!   reconnecting (a dead one) made it drop and remake every node connection,
//!   and in its slot refresh after a `MOVED` it could wait for a lock that a
//!   request it had stopped polling held, answering nothing for good; every
//!   lock on every master timed out while one master was down.
//! - A node that could not be connected to (refused, no answer in time) is
//!   not tried again for 100 ms, and one attempt to connect to a node runs
//!   at a time, in a task of its own: until the cluster has failed a dead
//!   master over, calls on its keys fail without being sent once its
//!   connection is gone (at once when its host refuses connections; a host
//!   that vanished without closing them costs those calls their timeout,
//!   until a reading of the map shows the failover), and the map is read
//!   again on calls' behalf at most every 100 ms.
//! - Renewal groups a batch by the node that owns each lock's slot and sends
//!   one pipeline per node, all at once: one round trip per node per tick. A
//!   node that answers `MOVED`/`ASK` (a stale map) gets its leases renewed
//!   one call each after a map refresh.
//! - A release of several locks (a multi-key guard, the shutdown) sends one
//!   pipeline per node too, sent once: a lock whose reply redirects was not
//!   touched and is released with a call of its own (see
//!   `Cluster::release_many`); sending the pipeline again whole would find the
//!   locks of its first send gone.
//! - Wake-ups: `release.lua` publishes with classic `PUBLISH`, which the cluster
//!   bus carries to every node, so a RESP2 subscriber connection on any live
//!   node hears every lock's releases, whichever node owns the slot, and slot
//!   migrations do not move it. The manager keeps one per master (as the
//!   cluster was at start-up, see `pubsub_sources`) only to hear each release
//!   from the master that published it, before the bus relays it.
//!   Sharded pub/sub (`SSUBSCRIBE`/`SPUBLISH`) would save the bus fan-out (N-1
//!   messages per publish), but redis-rs 1.8.1 loses shard subscriptions: after
//!   a node reconnect it re-subscribes all of a node's shard channels in one
//!   `SSUBSCRIBE`, which the server refuses with `CROSSSLOT` when they are in
//!   different slots (the error goes nowhere), and a slot migration ends the
//!   subscription with an `SUNSUBSCRIBE` push that nothing renews.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::FutureExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value};

use super::calls::{KeyCall, Release};
use super::scripts::{self, AcquireReply, AcquireSpec, Scripts};
use super::single::failed_all;
use super::LeaseEnd;
use super::{bounded_call, read_renewals, CallError, ExpectedWaiters, ManyReleased, Renewal};
use crate::config::{redact_all, Config, ReplicaAck, TlsSettings};
use crate::error::{BackendErrorKind, LockError};
use crate::keys::RedisNames;
use crate::lease::Lease;

/// How long a caller treats a lock as busy after its slot answered with a
/// migration or redirection error that its request's redirections did not
/// clear.
const RESHARD_BUSY: Duration = Duration::from_millis(10);

pub(crate) struct Cluster {
    /// A client per seed; their connection settings (password, TLS) are reused
    /// for every node the slot map names.
    seeds: Vec<redis::Client>,
    /// Masters by slot range: where each call goes, and how renewals are
    /// grouped per node; a slot a node answers MOVED for is reassigned, and
    /// the map read again when a call or a renewal could not reach its node.
    slots: Mutex<SlotMap>,
    /// Held while the slot map is read again on a call's behalf (see
    /// [`Cluster::refresh_soon`]), and when that last began.
    refreshing: tokio::sync::Mutex<()>,
    refreshed_at: Mutex<Option<Instant>>,
    /// Per subscriber connection (one per master at start-up): how many
    /// fallback attempts in a row failed (the next moves on that many nodes
    /// from its own master), and since when its own master has failed
    /// (`None` while it answers).
    subscriber_turns: Vec<AtomicUsize>,
    subscriber_failing_since: Vec<Mutex<Option<std::time::Instant>>>,
    /// Per subscriber connection, the master it listens to (see
    /// [`Cluster::own_master`]).
    subscriber_masters: Mutex<Vec<Option<Node>>>,
    scripts: Scripts,
    /// Replicas that must confirm an acquisition, if asked for.
    replica_ack: Option<ReplicaAck>,
    pub(super) command_timeout: Duration,
    connect_timeout: Duration,
    /// Round trips spent on renewals (see `Backend::renewal_round_trips`).
    pub(crate) renewal_round_trips: AtomicU64,
    /// The manager's connection per node (see [`Cluster::node_connection`]):
    /// made on first use, reconnected by redis-rs when the server closes
    /// it, dropped after a request that failed in a way that leaves it in
    /// doubt. Boxed: `Backend`'s variants stay of a size.
    node_conns: Box<Mutex<Vec<(Node, NodeLink)>>>,
    /// The generation of the next node connection.
    node_generations: AtomicU64,
    /// Nodes that could not be connected to, when, and why (see
    /// [`NODE_DOWN_FOR`]).
    nodes_down: Mutex<Vec<(Node, Instant, RedisError)>>,
    /// Per node, the connection attempt under way (see
    /// [`Cluster::node_connection`]): one at a time, however many calls need
    /// it (a dead master's keys are asked for by every caller at once).
    node_connecting: Mutex<Vec<(Node, Connecting)>>,
    /// Nodes on which a blocking release failed (see
    /// [`Cluster::release_blocking`]).
    blocking_releases_failed: Mutex<Vec<Option<Node>>>,
    /// Their settings (those of a single server's connection).
    node_conn_config: Box<ConnectionManagerConfig>,
    /// The runtime the manager was built on (`build()` needs one): node
    /// connections are made there (their tasks run on the runtime that made them), so that one
    /// first needed by a call on another runtime, which may stop being
    /// driven, serves every caller for as long as the manager lives.
    runtime: Option<tokio::runtime::Handle>,
}

/// A node's address. The host is shared: every request names its node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    host: Arc<str>,
    port: u16,
}

/// The host of an endpoint a node named (in `CLUSTER SLOTS` or a
/// redirection) when it was asked at `asked`, as Redis defines it: NULL
/// (`cluster-preferred-endpoint-type unknown-endpoint`, behind a load
/// balancer) and empty (a node that does not know its own address) mean
/// "the host you asked", `?` (a hostname a node lacks) no endpoint at all
/// (`Ok(None)`). An error: the asked host is meant but not known here.
fn endpoint_host(named: Option<&str>, asked: Option<&str>) -> RedisResult<Option<Arc<str>>> {
    match named {
        Some("?") => Ok(None),
        Some(host) if !host.is_empty() => Ok(Some(host.into())),
        _ => match asked {
            Some(asked) => Ok(Some(asked.into())),
            None => Err(RedisError::from((
                ErrorKind::Parse,
                "a node named the asked node's host, which is not known here",
            ))),
        },
    }
}

/// Slot ranges `(first, last, master)`, sorted by first slot.
#[derive(Debug, Default)]
struct SlotMap {
    ranges: Vec<(u16, u16, Node)>,
    /// The replicas the reply named: asked for the map when no master
    /// answers (after every master the map knew failed over).
    replicas: Vec<Node>,
}

impl SlotMap {
    fn master_of(&self, slot: u16) -> Option<&Node> {
        let i = self.ranges.partition_point(|(first, _, _)| *first <= slot);
        let (first, last, node) = self.ranges.get(i.checked_sub(1)?)?;
        (*first <= slot && slot <= *last).then_some(node)
    }

    /// Makes `node` the master of `slot` (a `MOVED` said so), until the map
    /// is read again.
    fn assign(&mut self, slot: u16, node: Node) {
        let Some(i) = self
            .ranges
            .iter()
            .position(|(first, last, _)| *first <= slot && slot <= *last)
        else {
            self.ranges.push((slot, slot, node));
            self.ranges.sort_by_key(|(first, _, _)| *first);
            return;
        };
        let (first, last, old) = self.ranges.remove(i);
        let mut pieces = vec![(slot, slot, node)];
        if first < slot {
            pieces.push((first, slot - 1, old.clone()));
        }
        if slot < last {
            pieces.push((slot + 1, last, old));
        }
        self.ranges.extend(pieces);
        self.ranges.sort_by_key(|(first, _, _)| *first);
    }

    fn masters(&self) -> Vec<Node> {
        let mut nodes: Vec<Node> = Vec::new();
        for (_, _, node) in &self.ranges {
            if !nodes.contains(node) {
                nodes.push(node.clone());
            }
        }
        nodes
    }

    /// Reads a `CLUSTER SLOTS` reply: `[[first, last, [host, port, id, ..], replicas..], ..]`,
    /// sent by the node at `asked` (its host, when known).
    fn parse(reply: Value, asked: Option<&str>) -> RedisResult<SlotMap> {
        let mut ranges = Vec::new();
        let mut replicas: Vec<Node> = Vec::new();
        for range in redis::from_redis_value::<Vec<Vec<Value>>>(reply)? {
            let mut fields = range.into_iter();
            let (Some(first), Some(last), Some(master)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(malformed_slots());
            };
            let first: u16 = redis::from_redis_value(first)?;
            let last: u16 = redis::from_redis_value(last)?;
            let mut master = redis::from_redis_value::<Vec<Value>>(master)?.into_iter();
            let (Some(host), Some(port)) = (master.next(), master.next()) else {
                return Err(malformed_slots());
            };
            // A master with no endpoint (`?`): its slots stay out of the
            // map, and a call on them is refused as in a cluster that is
            // down (busy, for an acquisition) until a reading names one.
            let host: Option<String> = redis::from_redis_value(host)?;
            let Some(host) = endpoint_host(host.as_deref(), asked)? else {
                continue;
            };
            let node = Node {
                host,
                port: redis::from_redis_value(port)?,
            };
            ranges.push((first, last, node));
            for replica in fields {
                let mut replica = redis::from_redis_value::<Vec<Value>>(replica)?.into_iter();
                let (Some(host), Some(port)) = (replica.next(), replica.next()) else {
                    continue;
                };
                let host: Option<String> = redis::from_redis_value(host)?;
                let (Some(host), Ok(port)) = (host, redis::from_redis_value::<u16>(port)) else {
                    continue;
                };
                if host.is_empty() || host == "?" {
                    continue;
                }
                let replica = Node {
                    host: host.into(),
                    port,
                };
                if !replicas.contains(&replica) {
                    replicas.push(replica);
                }
            }
        }
        if ranges.is_empty() {
            return Err(RedisError::from((
                ErrorKind::Parse,
                "CLUSTER SLOTS names no master with an endpoint",
            )));
        }
        ranges.sort_by_key(|(first, _, _)| *first);
        Ok(SlotMap { ranges, replicas })
    }
}

fn malformed_slots() -> RedisError {
    RedisError::from((ErrorKind::Parse, "unexpected CLUSTER SLOTS reply"))
}

/// The cluster slot of a Redis key: CRC16 of its hash tag (or of the whole key
/// without one), modulo 16384.
pub(crate) fn slot_of(key: impl AsRef<[u8]>) -> u16 {
    let bytes = key.as_ref();
    let hashed = bytes
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % 16384
}

/// How long a subscriber connection waits for its own master (or the replica
/// promoted in its place) before it listens to another node: longer than a
/// failover takes with the default `cluster-node-timeout` (15 s). Meanwhile
/// that shard's expiry notices are not heard, and on a cluster without
/// replicas whose first master died for good, neither are published events
/// (heard on the first source) for that long. Once on another node, the
/// connection stays there until it breaks: the shard's own master, back or
/// promoted later, is not heard until then.
const SUBSCRIBER_FALLBACK_AFTER: Duration = Duration::from_secs(30);

/// An error the cluster gives while a slot moves or its master changes: the
/// command did not run.
fn is_resharding(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
        )
    )
}

/// How many redirections (`MOVED`, `ASK`) one request follows before the
/// last one is its caller's error.
const MAX_REDIRECTS: usize = 5;

/// How long a node that could not be connected to (refused, no answer in
/// time, refused credentials) is not tried again: until the cluster has
/// failed a dead master over, every call on its keys is routed to it, and
/// each would try to connect.
const NODE_DOWN_FOR: Duration = Duration::from_millis(100);

/// The shortest time between two readings of the slot map on calls'
/// behalf (every call that meets a moved slot or a dead master asks for
/// one).
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// A connection attempt to a node, shared by the calls that wait for it:
/// when it ended, and how.
type Connecting = futures_util::future::Shared<
    futures_util::future::BoxFuture<
        'static,
        (
            Instant,
            RedisResult<(ConnectionManager, redis::ProtocolVersion)>,
        ),
    >,
>;

/// The manager's connection to a node, which connection of that node's it
/// is (a later one has a larger number), and the protocol it speaks.
#[derive(Clone)]
struct NodeLink {
    conn: ConnectionManager,
    generation: u64,
    protocol: redis::ProtocolVersion,
}

/// What one call's requests leave behind, for the call to act on when it
/// fails.
#[derive(Default)]
struct CallTrack {
    /// The node, and the generation of its connection, of the last request.
    last: Mutex<Option<(Node, u64)>>,
    /// Whether a request was written: a call that ends before (its node
    /// could not be connected to) was not sent.
    sent: AtomicBool,
}

impl CallTrack {
    /// A request about to be written on `link`, to `node`.
    fn took(&self, node: &Node, link: &NodeLink) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((node.clone(), link.generation));
        self.sent.store(true, Ordering::Relaxed);
    }
}

/// The connection one call on a key makes its requests on: each goes to the
/// master of its first key's slot in the slot map, on the manager's own
/// connection to that node, and follows `MOVED` (the map names the new
/// master for that slot) and
/// `ASK` (`ASKING` first, in the same write). A request without keys (a
/// `SCRIPT LOAD` after `NOSCRIPT`) goes where the previous one went. One
/// whose connection broke before its reply is sent once more, on a new
/// connection, as redis-rs's cluster client did (every script takes effect
/// once when sent again, `tests/resent_calls.rs`); one that got no reply in
/// time is not.
struct SlotConn<'c> {
    cluster: &'c Cluster,
    track: Arc<CallTrack>,
}

impl SlotConn<'_> {
    /// The node for a request on `slot`: its master in the map, or, for a
    /// request without keys, the node of the previous request (the first
    /// master not known to be down, for a call's first).
    fn target(&self, slot: Option<u16>) -> RedisResult<Node> {
        let previous = self
            .track
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(node, _)| node.clone());
        let map = self.cluster.slots.lock().unwrap_or_else(|e| e.into_inner());
        let node = match slot {
            Some(slot) => map.master_of(slot).cloned(),
            None => previous.or_else(|| {
                let masters = map.masters();
                let down = self
                    .cluster
                    .nodes_down
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                masters
                    .iter()
                    .find(|m| {
                        !down
                            .iter()
                            .any(|(n, at, _)| n == *m && at.elapsed() < NODE_DOWN_FOR)
                    })
                    .or(masters.first())
                    .cloned()
            }),
        };
        node.ok_or_else(|| {
            RedisError::from((
                ErrorKind::Server(ServerErrorKind::ClusterDown),
                "no master with an endpoint is known for the slot",
            ))
        })
    }

    /// Where a reply from `from` redirects to (and whether it is an `ASK`),
    /// if it does and names an address (read as in `CLUSTER SLOTS`, see
    /// [`endpoint_host`]).
    fn redirect(e: &RedisError, from: &Node) -> Option<(Node, bool)> {
        let asking = match e.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => false,
            ErrorKind::Server(ServerErrorKind::Ask) => true,
            _ => return None,
        };
        let (addr, _) = e.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = endpoint_host(Some(host), Some(&from.host)).ok()??;
        Some((
            Node {
                host,
                port: port.parse().ok()?,
            },
            asking,
        ))
    }

    /// Sends with `send` (on the node's connection, in its protocol, with
    /// `ASKING` first or not) until a reply does not redirect, at most
    /// [`MAX_REDIRECTS`] times; `redirect_in` finds a redirection in a reply,
    /// `failed` tells a reply that is or carries an error.
    async fn route<T, Fut>(
        &mut self,
        slot: Option<u16>,
        send: impl Fn(ConnectionManager, redis::ProtocolVersion, bool) -> Fut,
        redirect_in: impl Fn(&RedisResult<T>) -> Option<RedisError>,
        failed: impl Fn(&RedisResult<T>) -> bool,
    ) -> RedisResult<T>
    where
        Fut: Future<Output = RedisResult<T>>,
    {
        let cluster = self.cluster;
        let mut next: Option<(Node, bool)> = None;
        let mut redirects = 0;
        // The error of a send whose connection broke, once it is sent again:
        // what the call answers unless the second send succeeds (the first
        // may have run).
        let mut dropped: Option<RedisError> = None;
        loop {
            let (node, asking) = match next.take() {
                Some(next) => next,
                None => match self.target(slot) {
                    Ok(node) => (node, false),
                    Err(e) => {
                        cluster.refresh_soon().await;
                        return Err(dropped.unwrap_or(e));
                    }
                },
            };
            let link = match cluster.node_link(&node).await {
                Ok(link) => link,
                Err(e) => {
                    // Nothing to retire: the failure is this node's
                    // connecting, not a connection that was used.
                    *self.track.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    return Err(dropped.unwrap_or(e));
                }
            };
            self.track.took(&node, &link);
            let reply = send(link.conn, link.protocol, asking).await;
            if let Some(first) = dropped {
                if !failed(&reply) {
                    return reply;
                }
                // The first send's connection was retired already; this one
                // answered (an error reply), so it stays.
                if !reply
                    .as_ref()
                    .is_err_and(|e| e.is_io_error() || e.is_timeout())
                {
                    *self.track.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
                return Err(first);
            }
            if let Err(e) = &reply {
                if e.is_connection_dropped() && !e.is_connection_refusal() {
                    cluster.retire_node_connection(&node, link.generation);
                    dropped = Some(e.clone());
                    next = Some((node, asking));
                    continue;
                }
            }
            let Some(e) = redirect_in(&reply) else {
                return reply;
            };
            let Some((to, asking)) = Self::redirect(&e, &node) else {
                // A redirection to no address: the map is read again, and
                // the caller retries or counts the lock busy.
                cluster.refresh_soon().await;
                return reply;
            };
            redirects += 1;
            if redirects > MAX_REDIRECTS {
                return reply;
            }
            if let (false, Some(slot)) = (asking, slot) {
                // The map is out of date for this slot: it names the new
                // master from now on (a renewal round reads the whole map).
                cluster
                    .slots
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .assign(slot, to.clone());
            }
            next = Some((to, asking));
        }
    }
}

/// The slot of the first key among `cmds`' arguments (`None`: no keys).
fn first_key_slot<'a>(cmds: impl IntoIterator<Item = &'a redis::Cmd>) -> Option<u16> {
    cmds.into_iter().find_map(first_key).map(slot_of)
}

/// The first key of a command distlock sends (`None` for one without keys);
/// a `PUBLISH`'s channel counts as one (it goes to its channel's slot's
/// master; any master would do, the bus carries it to every node).
fn first_key(cmd: &redis::Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => bytes,
        _ => &[],
    });
    let name = args.next()?;
    let is = |names: &[&[u8]]| names.iter().any(|n| name.eq_ignore_ascii_case(n));
    if is(&[
        b"EVAL",
        b"EVALSHA",
        b"EVAL_RO",
        b"EVALSHA_RO",
        b"FCALL",
        b"FCALL_RO",
    ]) {
        let _script = args.next()?;
        let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
        if keys == 0 {
            return None;
        }
        return args.next();
    }
    if is(&[
        b"PING",
        b"SCRIPT",
        b"WAIT",
        b"HELLO",
        b"CONFIG",
        b"SCAN",
        b"ASKING",
        b"INFO",
        b"CLUSTER",
        b"CLIENT",
        b"ACL",
        b"READONLY",
        b"MULTI",
        b"EXEC",
    ]) {
        return None;
    }
    args.next()
}

fn is_redirect(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    )
}

fn is_hello(cmd: &redis::Cmd) -> bool {
    cmd.args_iter().next().is_some_and(
        |arg| matches!(arg, redis::Arg::Simple(name) if name.eq_ignore_ascii_case(b"HELLO")),
    )
}

/// The redirection a reply (or a pipeline's replies) carries.
fn redirect_error(value: &Value) -> Option<RedisError> {
    match value {
        Value::ServerError(e) => {
            let e = RedisError::from(e.clone());
            is_redirect(&e).then_some(e)
        }
        _ => None,
    }
}

/// A reply that is an error, or a pipeline's replies that carry one.
fn carries_error(reply: Result<&[Value], &RedisError>) -> bool {
    match reply {
        Ok(values) => values.iter().any(|v| matches!(v, Value::ServerError(_))),
        Err(_) => true,
    }
}

impl ConnectionLike for SlotConn<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let slot = first_key_slot([cmd]);
            self.route(
                slot,
                |mut conn, protocol, asking| async move {
                    if is_hello(cmd) {
                        // A HELLO (the start-up check's) names the protocol
                        // of this node's connection, which the manager chose
                        // (another would switch the connection under
                        // redis-rs).
                        let version = if protocol.supports_resp3() { 3 } else { 2 };
                        return conn
                            .req_packed_command(redis::cmd("HELLO").arg(version))
                            .await;
                    }
                    if asking {
                        let mut pipe = redis::pipe();
                        pipe.cmd("ASKING").add_command(cmd.clone());
                        let mut replies = conn.req_packed_commands(&pipe, 1, 1).await?;
                        replies.pop().ok_or_else(|| {
                            RedisError::from((ErrorKind::Parse, "no reply after ASKING"))
                        })
                    } else {
                        conn.req_packed_command(cmd).await
                    }
                },
                |reply| match reply {
                    Ok(value) => redirect_error(value),
                    Err(e) => is_redirect(e).then(|| e.clone()),
                },
                |reply| carries_error(reply.as_ref().map(std::slice::from_ref)),
            )
            .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let slot = first_key_slot(pipeline.cmd_iter());
            self.route(
                slot,
                |mut conn, _protocol, asking| async move {
                    if !asking {
                        return conn.req_packed_commands(pipeline, offset, count).await;
                    }
                    // ASKING holds for the next command only: one before
                    // each, and their replies left out.
                    let mut asked = redis::pipe();
                    for cmd in pipeline.cmd_iter() {
                        asked.cmd("ASKING").add_command(cmd.clone());
                    }
                    let replies = conn.req_packed_commands(&asked, 0, asked.len()).await?;
                    Ok(replies
                        .into_iter()
                        .skip(1)
                        .step_by(2)
                        .skip(offset)
                        .take(count)
                        .collect())
                },
                |replies| match replies {
                    Ok(values) => values.iter().find_map(redirect_error),
                    Err(e) => is_redirect(e).then(|| e.clone()),
                },
                |replies| carries_error(replies.as_ref().map(Vec::as_slice)),
            )
            .await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl Cluster {
    /// Reads the slot map from `seeds` and runs the server check on the
    /// master of the probe lock's slot.
    pub(crate) async fn connect(
        seeds: &[String],
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Cluster, LockError> {
        if seeds.is_empty() {
            return Err(LockError::InvalidConfig(
                "cluster_builder needs at least one node URL".to_owned(),
            ));
        }
        let shown = redact_all(seeds);
        let invalid =
            |e: RedisError| LockError::InvalidConfig(format!("invalid cluster URLs {shown}: {e}"));
        let seed_clients = seeds
            .iter()
            .map(|url| super::open_client(url, tls))
            .collect::<RedisResult<Vec<_>>>()
            .map_err(invalid)?;
        let mut cluster = Cluster {
            seeds: seed_clients,
            slots: Mutex::new(SlotMap::default()),
            refreshing: tokio::sync::Mutex::const_new(()),
            refreshed_at: Mutex::new(None),
            subscriber_turns: Vec::new(),
            subscriber_failing_since: Vec::new(),
            subscriber_masters: Mutex::new(Vec::new()),
            scripts: Scripts::for_cluster(&config.key_prefix),
            replica_ack: config.replica_ack,
            command_timeout: config.command_timeout,
            connect_timeout: config.connect_timeout,
            renewal_round_trips: AtomicU64::new(0),
            node_conns: Box::default(),
            node_generations: AtomicU64::new(0),
            nodes_down: Mutex::new(Vec::new()),
            node_connecting: Mutex::new(Vec::new()),
            blocking_releases_failed: Mutex::new(Vec::new()),
            // One try to connect: a request for a node that refuses fails at
            // once (it was not sent), and the next one tries again.
            node_conn_config: Box::new(
                super::single::connection_config(config).set_number_of_retries(0),
            ),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        let first_map = tokio::time::timeout(config.connect_timeout, cluster.refresh_slots());
        match first_map.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(connect_error(e, shown)),
            Err(_) => return Err(super::connect_timed_out(shown, config.connect_timeout)),
        }
        let masters = cluster
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .masters()
            .len();
        cluster.subscriber_turns = (0..masters.max(1)).map(|_| AtomicUsize::new(0)).collect();
        cluster.subscriber_failing_since = (0..masters.max(1)).map(|_| Mutex::new(None)).collect();
        cluster.subscriber_masters = Mutex::new(vec![None; masters.max(1)]);
        // The check runs where its requests route (the probe lock's master),
        // on the manager's own connections (see `SlotConn`).
        let protocol = cluster.seeds[0]
            .get_connection_info()
            .redis_settings()
            .protocol();
        let mut conn = SlotConn {
            cluster: &cluster,
            track: Arc::default(),
        };
        super::check::check(
            &mut conn,
            protocol,
            || cluster.pubsub(0),
            &cluster.scripts,
            config,
            &shown,
        )
        .await?;
        Ok(cluster)
    }

    /// The manager's connection to `node` as a call's request needs it: a
    /// node that could not be connected to within [`NODE_DOWN_FOR`] is not
    /// tried again, and one that cannot be connected to now is refused. A
    /// refusal is a connection refused (the request was not sent), but for
    /// refused credentials, which keep their own error.
    async fn node_link(&self, node: &Node) -> RedisResult<NodeLink> {
        let failed = |e: RedisError| {
            if e.is_io_error() || e.is_timeout() {
                RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!(
                        "cluster node {}:{} could not be reached: {e}",
                        node.host, node.port
                    ),
                ))
            } else {
                e
            }
        };
        if let Some(e) = self.recently_down(node) {
            return Err(failed(e));
        }
        self.node_connection(node).await.map_err(failed)
    }

    /// Why `node` could not be connected to, if that was within
    /// [`NODE_DOWN_FOR`].
    fn recently_down(&self, node: &Node) -> Option<RedisError> {
        let mut down = self.nodes_down.lock().unwrap_or_else(|e| e.into_inner());
        down.retain(|(_, at, _)| at.elapsed() < NODE_DOWN_FOR);
        down.iter()
            .find(|(n, _, _)| n == node)
            .map(|(_, _, e)| e.clone())
    }

    /// Reads the slot map again on a call's behalf: at most once every
    /// [`REFRESH_AT_MOST_EVERY`], within a quarter of the connect timeout;
    /// a call that finds a reading under way does not wait for it. Whether
    /// this call read the map.
    async fn refresh_soon(&self) -> bool {
        let Ok(_turn) = self.refreshing.try_lock() else {
            return false;
        };
        let recent = self
            .refreshed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < REFRESH_AT_MOST_EVERY);
        if recent {
            return false;
        }
        let reading = tokio::time::timeout(self.connect_timeout / 4, self.refresh_slots()).await;
        // When it ended (a reading cut short by its caller does not count).
        *self.refreshed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let error = match reading {
            Ok(Ok(())) => return true,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no slot map in time".to_owned(),
        };
        tracing::debug!(target: "distlock::connection", error = %error, "could not read the slot map again");
        false
    }

    /// What a failed call leaves behind: a call that wrote nothing was not
    /// sent; the connection of the node it went to is dropped when a reply
    /// may be missing or another request's, or the connection broke (not
    /// for a timeout: the connection stays in step, and a paused node's
    /// replies come later); a node that could not be reached may have
    /// failed over, so the slot map is read again.
    async fn after_failure(&self, e: &mut CallError, track: &CallTrack) {
        self.settle(e, track);
        if unreachable(e) {
            self.refresh_soon().await;
        }
    }

    /// [`Cluster::after_failure`] but for the slot map.
    fn settle(&self, e: &mut CallError, track: &CallTrack) {
        if !track.sent.load(Ordering::Relaxed) {
            e.maybe_executed = false;
        }
        if needs_new_connection(e) {
            let last = track.last.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some((node, generation)) = last {
                self.retire_node_connection(&node, generation);
            }
        }
    }

    /// Runs `call` under the command timeout, retrying a slot in migration
    /// until the timeout.
    async fn call<'c, T, F, Fut>(&'c self, key: &str, call: F) -> Result<T, CallError>
    where
        F: FnMut(SlotConn<'c>) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.call_within(key, self.command_timeout, call).await
    }

    /// [`Cluster::call`] under `timeout`.
    async fn call_within<'c, T, F, Fut>(
        &'c self,
        key: &str,
        timeout: Duration,
        mut call: F,
    ) -> Result<T, CallError>
    where
        F: FnMut(SlotConn<'c>) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let track = Arc::new(CallTrack::default());
        let deadline = tokio::time::Instant::now() + timeout;
        let retrying = async {
            let mut delay = Duration::from_millis(5);
            loop {
                let conn = SlotConn {
                    cluster: self,
                    track: track.clone(),
                };
                match call(conn).await {
                    Err(e)
                        if is_resharding(&e) && tokio::time::Instant::now() + delay < deadline =>
                    {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_millis(100));
                    }
                    other => return other,
                }
            }
        };
        let mut result = bounded_call(key, timeout, retrying).await;
        if let Err(e) = &mut result {
            self.after_failure(e, &track).await;
        }
        result
    }

    /// Makes `call` on the master of `key`'s slot (see `calls.rs`), through
    /// slot migrations.
    pub(crate) async fn on_key<K: KeyCall>(
        &self,
        key: &str,
        call: &K,
    ) -> Result<K::Output, CallError> {
        let scripts = &self.scripts;
        let timeout = self.command_timeout + call.time_beyond_command_timeout();
        self.call_within(key, timeout, |mut conn| async move {
            call.call(scripts, &mut conn).await
        })
        .await
    }

    pub(crate) async fn acquire(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Result<AcquireReply, CallError> {
        let track = Arc::new(CallTrack::default());
        let mut conn = SlotConn {
            cluster: self,
            track: track.clone(),
        };
        let ack = self.replica_ack;
        let acquire = async {
            let reply = match &ack {
                None => self
                    .scripts
                    .acquire(&mut conn, keys, owner, lease_ms, spec)
                    .await
                    .map(|reply| (reply, 0)),
                // A pipeline goes to the node of its first keyed command, and
                // WAIT rides along on that node's connection: it counts the
                // replicas of the lock's master. Boxed: its future is larger
                // than the plain call's, which every acquisition without
                // `replica_ack` would carry.
                Some(ack) => {
                    Box::pin(
                        self.scripts
                            .acquire_acked(&mut conn, keys, owner, lease_ms, spec, ack),
                    )
                    .await
                }
            };
            match reply {
                // The script did not run: busy until the slot has moved or
                // the cluster is up again.
                Err(e) if is_resharding(&e) => {
                    tracing::debug!(target: "distlock::acquire", error = %e, "slot moving or cluster down; busy");
                    Ok((
                        AcquireReply::Busy {
                            remaining: Some(RESHARD_BUSY),
                        },
                        0,
                    ))
                }
                other => other,
            }
        };
        let timeout = self.command_timeout + ack.map_or(Duration::ZERO, |a| a.timeout);
        let mut result = bounded_call(key, timeout, acquire).await;
        if let Err(e) = &mut result {
            self.after_failure(e, &track).await;
        }
        let (reply, acked) = result?;
        match &ack {
            None => Ok(reply),
            Some(ack) => {
                let release = Release {
                    keys,
                    owner,
                    keep_ms: 0,
                    waiters: ExpectedWaiters::GivenBack,
                    receipt: None,
                };
                // Boxed, as the acknowledged call above.
                Box::pin(super::require_replicas(
                    key,
                    reply,
                    acked,
                    ack,
                    self.on_key(key, &release),
                ))
                .await
            }
        }
    }

    /// The masters, for a command on each: the slot map read again first
    /// (an operator's call, rare): a map refreshed only when a call met a
    /// moved slot still names a master that failed over, or misses one
    /// added since, for a manager that made no call meanwhile. A refresh
    /// that fails leaves the map as it was.
    async fn every_master(&self) -> Vec<Node> {
        if let Err(e) = self.refresh_slots().await {
            tracing::debug!(target: "distlock::connection", error = %e,
                "could not read the slot map again; using the one known");
        }
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .masters()
    }

    /// Sends `cmd` to `node` on its own connection, within the command
    /// timeout; the connection is dropped when a reply may be another
    /// request's or the connection broke.
    async fn on_node(&self, node: &Node, cmd: redis::Cmd) -> Result<Value, CallError> {
        let track = CallTrack::default();
        let reply = tokio::time::timeout(self.command_timeout, async {
            let mut link = self.node_link(node).await?;
            track.took(node, &link);
            link.conn
                .req_packed_command(&cmd)
                .await
                .and_then(|reply| reply.extract_error())
        })
        .await;
        let mut reply = super::call_outcome("", self.command_timeout, reply);
        if let Err(e) = &mut reply {
            self.settle(e, &track);
        }
        reply
    }

    /// The value of server setting `name` on every master.
    pub(crate) async fn config_get(&self, name: &str) -> Result<Vec<Option<String>>, CallError> {
        let mut values = Vec::new();
        for node in self.every_master().await {
            let mut get = redis::cmd("CONFIG");
            get.arg("GET").arg(name);
            let reply = self.on_node(&node, get).await?;
            let reply: std::collections::HashMap<String, String> = redis::from_redis_value(reply)
                .map_err(|e| CallError {
                error: LockError::backend("", e.into()),
                maybe_executed: false,
            })?;
            values.push(reply.get(name).cloned());
        }
        Ok(values)
    }

    /// Names of the lock keys matching `pattern` on every master.
    pub(crate) async fn scan_locks(&self, pattern: &str) -> Result<Vec<String>, CallError> {
        let mut names = Vec::new();
        for node in self.every_master().await {
            let mut cursor = 0;
            loop {
                let reply = self
                    .on_node(&node, scripts::scan_cmd(cursor, pattern))
                    .await?;
                let (next, page): (u64, Vec<String>) =
                    redis::from_redis_value(reply).map_err(|e| CallError {
                        error: LockError::backend("", e.into()),
                        maybe_executed: false,
                    })?;
                names.extend(page);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(names)
    }

    /// One pipeline per node, all at once, each on the manager's own
    /// connection to that node ([`Cluster::node_connection`]), sent once
    /// (sent again whole, as redis-rs's cluster client did when one of its
    /// replies redirected, a lock released by the first send was found gone
    /// by the second and reported lost): a lock whose reply
    /// redirects (`MOVED`, `ASK`) or says its slot is moving (`TRYAGAIN`,
    /// `CLUSTERDOWN`, ...) was not touched (its slot moved since the slot map
    /// was read) and is released again at once with a call of its own, which
    /// follows the cluster to the slot's master; the slot map is read again.
    /// The locks of a node missing from the slot map are released one call
    /// each. A pipeline that failed as a whole (no reply in time, a
    /// connection lost) leaves its locks unknown, and so does a lock whose
    /// own reply is any other error: released again one by one, a lock whose
    /// first release ran late would be found gone and reported lost.
    pub(crate) async fn release_many(&self, locks: &[(&RedisNames, &str, u64)]) -> ManyReleased {
        let groups = self.group_by_node(locks.iter().map(|(keys, _, _)| keys.lock.as_str()));
        let stale_map = AtomicBool::new(false);
        let sends = groups.into_iter().map(|(node, indices)| {
            let stale_map = &stale_map;
            let group: Vec<(&RedisNames, &str, u64)> = indices.iter().map(|i| locks[*i]).collect();
            async move {
                let released = match node {
                    Some(node) => self.release_on_node(&node, &group, stale_map).await,
                    None => ManyReleased::of_each(
                        join_all(group.iter().map(|lock| self.release_one(lock))).await,
                    ),
                };
                (indices, released)
            }
        });
        let mut out = ManyReleased {
            ours: vec![None; locks.len()],
            error: None,
        };
        for (indices, released) in join_all(sends).await {
            for (i, ours) in indices.into_iter().zip(released.ours) {
                out.ours[i] = ours;
            }
            if let Some(e) = released.error {
                out.error.get_or_insert(e);
            }
        }
        if stale_map.load(Ordering::Relaxed) {
            // Briefly: the caller waits for it, and the next renewal round
            // reads the map again anyway.
            let refreshed = tokio::time::timeout(self.connect_timeout / 4, self.refresh_slots())
                .await
                .map_err(|_| "no slot map in time".to_owned())
                .and_then(|r| r.map_err(|e| e.to_string()));
            if let Err(e) = refreshed {
                tracing::debug!(target: "distlock::release", error = %e, "could not refresh the slot map");
            }
        }
        out
    }

    /// Releases `group`, all on `node` in the slot map, in one pipeline on
    /// its own connection (see [`Cluster::release_many`]); sets `stale_map`
    /// when the map proved out of date.
    async fn release_on_node(
        &self,
        node: &Node,
        group: &[(&RedisNames, &str, u64)],
        stale_map: &AtomicBool,
    ) -> ManyReleased {
        // Sent once (see `release_many`): no receipts.
        let pipe = self.scripts.release_many_pipeline(group, None);
        let track = CallTrack::default();
        let sent = tokio::time::timeout(self.command_timeout, async {
            let mut link = self.node_link(node).await?;
            track.took(node, &link);
            link.conn.req_packed_commands(&pipe, 0, pipe.len()).await
        })
        .await;
        let sent = super::call_outcome("", self.command_timeout, sent);
        let each = sent.and_then(|replies| {
            self.scripts
                .release_many_replies_each(group, replies)
                .map_err(|e| CallError {
                    error: LockError::backend("", e),
                    maybe_executed: true,
                })
        });
        let each = match each {
            Ok(each) => each,
            Err(mut e) => {
                // A node that did not answer may have failed over: the slot
                // map is read again.
                self.settle(&mut e, &track);
                if unreachable(&e) {
                    stale_map.store(true, Ordering::Relaxed);
                }
                return ManyReleased::failed(group.len(), e);
            }
        };
        // A reply of the wrong shape or for another owner may be another
        // request's: the connection is retired. An error reply (BUSY, OOM,
        // ...) leaves its lock unknown and the connection as it is.
        if each
            .iter()
            .any(|r| r.as_ref().is_err_and(|e| !super::server_answered(e)))
        {
            if let Some((node, generation)) =
                track.last.lock().unwrap_or_else(|e| e.into_inner()).take()
            {
                self.retire_node_connection(&node, generation);
            }
        }
        // A lock whose slot moved was not touched: released again now, where
        // its slot is.
        let outcomes = each.into_iter().zip(group).map(|(reply, lock)| async move {
            match reply {
                Err(e) if is_resharding(&e) => {
                    stale_map.store(true, Ordering::Relaxed);
                    self.release_one(lock).await
                }
                reply => reply.map_err(|e| CallError {
                    error: LockError::backend("", e),
                    maybe_executed: true,
                }),
            }
        });
        ManyReleased::of_each(join_all(outcomes).await)
    }

    /// Releases one lock with a call of its own, routed by its key (which
    /// follows the cluster to its slot's master).
    async fn release_one(
        &self,
        (keys, owner, keep_ms): &(&RedisNames, &str, u64),
    ) -> Result<bool, CallError> {
        let release = Release {
            keys,
            owner,
            keep_ms: *keep_ms,
            waiters: ExpectedWaiters::Unknown,
            // Routed by its key, so sent again if its connection breaks.
            receipt: super::scripts::ReceiptTerms::drawn(crate::config::receipt_window_ms(
                self.command_timeout,
            )),
        };
        self.on_key("", &release).await
    }

    /// The manager's own connection to `node`, on which every request to
    /// that node goes, connected on first use (with the seed's settings:
    /// password, TLS) within the connect timeout. One attempt per node runs
    /// at a time, in a task of its own: the callers wait for it within their
    /// own time, and one that gives up leaves it running, so that it ends;
    /// a failure marks the node down for [`NODE_DOWN_FOR`] when a caller
    /// collects it (one that every caller gave up on is found by the next
    /// call for that node). Connections to nodes that are
    /// neither masters in the slot map nor seeds are dropped when a new one
    /// is made.
    async fn node_connection(&self, node: &Node) -> RedisResult<NodeLink> {
        if let Some(link) = self.made_connection(node) {
            return Ok(link);
        }
        if let Some(e) = self.recently_down(node) {
            return Err(e);
        }
        let attempt = {
            let mut connecting = self
                .node_connecting
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // An attempt that failed (its callers may all have given up
            // before it ended): the node is down for a while after, then
            // tried again.
            let mut recent_failure = None;
            connecting.retain(|(n, attempt)| match attempt.peek() {
                Some((ended, Err(e))) if n == node => {
                    if ended.elapsed() < NODE_DOWN_FOR {
                        recent_failure = Some(e.clone());
                    }
                    false
                }
                _ => true,
            });
            if let Some(e) = recent_failure {
                return Err(e);
            }
            match connecting.iter().find(|(n, _)| n == node) {
                Some((_, attempt)) => attempt.clone(),
                None => {
                    let attempt = self.start_connecting(node)?;
                    connecting.push((node.clone(), attempt.clone()));
                    attempt
                }
            }
        };
        let (ended, outcome) = attempt.clone().await;
        self.node_connecting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, other)| !(n == node && other.ptr_eq(&attempt)));
        let (conn, protocol) = match outcome {
            Ok(made) => made,
            Err(e) => {
                self.nodes_down
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((node.clone(), ended, e.clone()));
                return Err(e);
            }
        };
        let mut kept = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .masters();
        kept.extend(self.seed_nodes());
        let mut conns = self.node_conns.lock().unwrap_or_else(|e| e.into_inner());
        // Another caller of the same attempt installed it already.
        if let Some((_, link)) = conns.iter().find(|(n, _)| n == node) {
            return Ok(link.clone());
        }
        conns.retain(|(n, _)| kept.contains(n));
        let link = NodeLink {
            conn,
            generation: self.node_generations.fetch_add(1, Ordering::Relaxed),
            protocol,
        };
        conns.push((node.clone(), link.clone()));
        Ok(link)
    }

    /// The connection to `node` made already, if any.
    fn made_connection(&self, node: &Node) -> Option<NodeLink> {
        self.node_conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, link)| link.clone())
    }

    /// Starts connecting to `node` in a task of its own on the manager's
    /// runtime, within the connect timeout.
    fn start_connecting(&self, node: &Node) -> RedisResult<Connecting> {
        // RESP3 whatever the URL says, where the server speaks it: redis-rs
        // then sees the server close an idle connection (its `timeout`, a
        // proxy's idle limit) and makes it again at once; under RESP2 the
        // next request would be written into the dead connection and fail.
        // (The replies read the same in both.)
        let client = self.client_for(node)?;
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let resp3 = redis::Client::open(info.set_redis_settings(settings))?;
        let config = (*self.node_conn_config).clone();
        let timeout = self.connect_timeout;
        let connect = move |client: redis::Client, config: ConnectionManagerConfig| async move {
            let protocol = client.get_connection_info().redis_settings().protocol();
            let made =
                tokio::time::timeout(timeout, ConnectionManager::new_with_config(client, config))
                    .await
                    .unwrap_or_else(|_| {
                        Err(RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no connection within {timeout:?}"),
                        )))
                    })?;
            Ok::<_, RedisError>((made, protocol))
        };
        let connecting = async move {
            let outcome = match connect(resp3, config.clone()).await {
                Ok(made) => Ok(made),
                // A server that answered but refused RESP3 (`HELLO 3` unknown
                // or renamed, a proxy that speaks RESP2 only): the URL's
                // protocol, without the early reconnection. (Refused
                // credentials would be refused again.)
                Err(e)
                    if !(e.is_io_error() || e.is_timeout())
                        && e.kind() != ErrorKind::AuthenticationFailed =>
                {
                    connect(client, config).await
                }
                Err(e) => Err(e),
            };
            (Instant::now(), outcome)
        };
        let runtime = (self.runtime.clone()).or_else(|| tokio::runtime::Handle::try_current().ok());
        let attempt: futures_util::future::BoxFuture<'static, _> = match runtime {
            Some(runtime) => {
                let task = runtime.spawn(connecting);
                Box::pin(async move {
                    task.await.unwrap_or_else(|e| {
                        (
                            Instant::now(),
                            Err(RedisError::from(std::io::Error::other(
                                if e.is_cancelled() {
                                    "the manager's runtime has shut down: no connection \
                                     can be made"
                                        .to_owned()
                                } else {
                                    format!("the connecting task ended: {e}")
                                },
                            ))),
                        )
                    })
                })
            }
            None => Box::pin(connecting),
        };
        Ok(attempt.shared())
    }

    /// Drops the manager's connection to `node` after a failure on it (a reply may be missing
    /// or another request's, or the connection broke), if it is still the
    /// one of `generation` (a later one, made meanwhile, stays).
    fn retire_node_connection(&self, node: &Node, generation: u64) {
        self.node_conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, link)| !(n == node && link.generation == generation));
    }

    pub(crate) fn release_blocking(
        &self,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> RedisResult<bool> {
        let node = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .master_of(slot_of(&keys.lock))
            .cloned();
        // Each waits up to the connect and command timeouts: once one failed
        // on a node (unreachable as the runtime shuts down), the later ones
        // for that node (`None`: the first seed) are left to their leases,
        // so that a shutdown with many guards does not wait out each in
        // turn, while the other masters' locks are still released.
        let failed_before = || {
            self.blocking_releases_failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&node)
        };
        if failed_before() {
            return Err(RedisError::from((
                ErrorKind::Client,
                "not sent: an earlier release at runtime shutdown failed on this node",
            )));
        }
        let released = (|| {
            let client = match &node {
                Some(node) => self.client_for(node)?,
                None => self.seeds.first().cloned().ok_or_else(|| {
                    RedisError::from((ErrorKind::Client, "no cluster node known"))
                })?,
            };
            let mut conn = client.get_connection_with_timeout(self.connect_timeout)?;
            conn.set_read_timeout(Some(self.command_timeout))?;
            conn.set_write_timeout(Some(self.command_timeout))?;
            self.scripts
                .release_blocking(&mut conn, keys, owner, keep_ms)
        })();
        if released.is_err() && !failed_before() {
            self.blocking_releases_failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(node);
        }
        released
    }

    /// One pipeline per node, sent to all nodes at once.
    pub(crate) async fn renew(&self, batch: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        let groups = self.group_by_node(batch.iter().map(|lease| lease.keys.lock.as_str()));
        let (stale_map, map_read) = (AtomicBool::new(false), AtomicBool::new(false));
        let sends = groups.into_iter().map(|(node, indices)| {
            let (stale_map, map_read) = (&stale_map, &map_read);
            async move {
                let leases: Vec<Arc<Lease>> = indices.iter().map(|i| batch[*i].clone()).collect();
                let outcomes = match node {
                    Some(node) => self.renew_on(&node, &leases, end, stale_map).await,
                    None => None,
                };
                let outcomes = match outcomes {
                    Some(outcomes) => outcomes,
                    None => {
                        stale_map.store(true, Ordering::Relaxed);
                        if self.refresh_soon().await {
                            map_read.store(true, Ordering::Relaxed);
                        }
                        self.renew_each(&leases, end).await
                    }
                };
                (indices, outcomes)
            }
        });
        let mut out: Vec<Renewal> = batch.iter().map(|_| Renewal::Retry).collect();
        for (indices, outcomes) in join_all(sends).await {
            for (i, outcome) in indices.into_iter().zip(outcomes) {
                out[i] = outcome;
            }
        }
        // Read once for the round, unless a group read it already. Not cut
        // short as a call's reading is: when every master the map knows
        // hangs, only a reading that waits them out asks the replicas (where
        // a failover shows).
        if stale_map.load(Ordering::Relaxed) && !map_read.load(Ordering::Relaxed) {
            if let Err(e) = self.refresh_slots().await {
                tracing::debug!(target: "distlock::renewal", error = %e, "could not refresh the slot map");
            }
        }
        out
    }

    /// Renews `leases`, all owned by `node`, in one pipeline on the manager's
    /// own connection to it, within the command timeout (connecting
    /// included); `None` when the node did not own them all (a stale slot
    /// map), could not be connected to, or the pipeline failed as a whole in
    /// a way a per-lock call may not. A node that cannot be reached sets
    /// `stale_map` too: it may have failed over to a replica.
    async fn renew_on(
        &self,
        node: &Node,
        leases: &[Arc<Lease>],
        end: LeaseEnd,
        stale_map: &AtomicBool,
    ) -> Option<Vec<Renewal>> {
        let mut pipe = redis::pipe();
        for lease in leases {
            pipe.add_command(self.scripts.renew_cmd(
                &lease.keys,
                &lease.owner,
                lease.lease_ms(),
                end,
            ));
        }
        let sent_at = Instant::now();
        let timeout = self.command_timeout;
        let track = CallTrack::default();
        let link = std::sync::Mutex::new(None);
        let sent = tokio::time::timeout(timeout, async {
            let mut conn = self.node_link(node).await?;
            track.took(node, &conn);
            *link.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
            self.renewal_round_trips.fetch_add(1, Ordering::Relaxed);
            conn.conn.req_packed_commands(&pipe, 0, leases.len()).await
        })
        .await;
        let mut replies = super::call_outcome("", timeout, sent);
        if let Err(e) = &mut replies {
            self.settle(e, &track);
        }
        let replies = match replies {
            Ok(replies) => replies,
            // Never sent (no connection, or refused): the map may be stale
            // (a failover), so it is read again and these leases are renewed
            // one call each, routed by their keys.
            Err(e) if !e.maybe_executed => {
                stale_map.store(true, Ordering::Relaxed);
                return None;
            }
            // No reply in time: the node is paused, overloaded or cut off.
            // Renewing these leases one call each would wait for it as long
            // again (they route to the same node) and hold up the
            // whole round, and with it the next renewals of every master's
            // leases. They fail now and are retried a third of their
            // interval later, after the slot map is read again (where a
            // failover shows).
            Err(e)
                if matches!(&e.error, LockError::Backend { source, .. }
                    if source.is_timeout()) =>
            {
                stale_map.store(true, Ordering::Relaxed);
                return Some(failed_all(leases, &e.error.to_string()));
            }
            Err(e) if may_be_out_of_sync(&e) => {
                stale_map.store(true, Ordering::Relaxed);
                return Some(failed_all(leases, &e.error.to_string()));
            }
            // The node is gone (its connection broke): as for one never sent.
            Err(_) => {
                stale_map.store(true, Ordering::Relaxed);
                return None;
            }
        };
        let replies: Vec<RedisResult<(i64, String)>> = replies
            .into_iter()
            .map(|reply| match reply {
                Value::ServerError(e) => Err(RedisError::from(e)),
                reply => redis::from_redis_value(reply).map_err(RedisError::from),
            })
            .collect();
        if replies.iter().any(|r| r.as_ref().is_err_and(is_resharding)) {
            return None;
        }
        let (mut missing_script, mut out_of_sync) = (false, false);
        let outcomes = read_renewals(
            leases,
            replies,
            sent_at,
            &mut missing_script,
            &mut out_of_sync,
        );
        let link = link.into_inner().unwrap_or_else(|e| e.into_inner());
        if let (true, Some(link)) = (out_of_sync, &link) {
            self.retire_node_connection(node, link.generation);
        }
        let Some(mut outcomes) = outcomes else {
            let error = scripts::out_of_sync("a renewal pipeline got the wrong number of replies");
            return Some(failed_all(leases, &error.to_string()));
        };
        if let (true, false, Some(NodeLink { mut conn, .. })) = (missing_script, out_of_sync, link)
        {
            // The node restarted, flushed its scripts, was promoted, or never
            // ran a renewal: the scripts are loaded there, within the command
            // timeout; the leases are retried at once.
            let loaded = bounded_call("", self.command_timeout, self.scripts.load_renew(&mut conn))
                .await
                .map_err(|e| e.error.to_string());
            if let Err(e) = loaded {
                for outcome in &mut outcomes {
                    if matches!(outcome, Renewal::Retry) {
                        *outcome = Renewal::Failed(e.clone());
                    }
                }
            }
        }
        Some(outcomes)
    }

    /// Renews each lease with a call of its own (routed by its key, following
    /// redirections), all at once.
    async fn renew_each(&self, leases: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        let each = leases.iter().map(|lease| async move {
            let sent_at = Instant::now();
            self.renewal_round_trips.fetch_add(1, Ordering::Relaxed);
            let scripts = &self.scripts;
            let cmd = scripts.renew_cmd(&lease.keys, &lease.owner, lease.lease_ms(), end);
            let renewed = self
                .call(&lease.key, |mut conn| {
                    let cmd = cmd.clone();
                    async move { scripts.invoke_renew(&mut conn, lease.keys.kind, &cmd).await }
                })
                .await;
            match renewed.map(|reply| Scripts::renew_reply(reply, &lease.owner)) {
                Ok(Ok(true)) => Renewal::Renewed { sent_at },
                Ok(Ok(false)) => Renewal::NotOurs,
                Ok(Err(e)) => Renewal::Failed(e.to_string()),
                Err(e) => Renewal::Failed(e.error.to_string()),
            }
        });
        join_all(each).await
    }

    /// Groups lock names by the master of their slot (`None`: not in the map).
    fn group_by_node<'a>(
        &self,
        names: impl Iterator<Item = &'a str>,
    ) -> Vec<(Option<Node>, Vec<usize>)> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut groups: Vec<(Option<Node>, Vec<usize>)> = Vec::new();
        for (i, name) in names.enumerate() {
            let node = slots.master_of(slot_of(name)).cloned();
            match groups.iter_mut().find(|(n, _)| *n == node) {
                Some((_, indices)) => indices.push(i),
                None => groups.push((node, vec![i])),
            }
        }
        groups
    }

    /// Reads `CLUSTER SLOTS` from every master of the current map at once,
    /// each on the manager's own connection to it, and keeps the first
    /// answer: a dead or stopped master, which is when the map needs
    /// refreshing, must not hold the refresh up. When no master answers
    /// (every one the map knew failed over, or before the first map), the
    /// replicas the map names and the seeds are asked the same way.
    async fn refresh_slots(&self) -> Result<(), LockError> {
        let (masters, replicas) = {
            let map = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            (map.masters(), map.replicas.clone())
        };
        let mut others: Vec<Node> = Vec::new();
        for node in replicas.into_iter().chain(self.seed_nodes()) {
            if !masters.contains(&node) && !others.contains(&node) {
                others.push(node);
            }
        }
        let mut last_error = None;
        for asked in [masters, others] {
            if asked.is_empty() {
                continue;
            }
            // Asked by address, so that a reply naming "the host you asked"
            // can be read.
            let asks = asked.into_iter().map(|node| {
                Box::pin(async move {
                    let reply = self
                        .on_node(&node, redis::cmd("CLUSTER").arg("SLOTS").clone())
                        .await
                        .map_err(|e| e.error)?;
                    SlotMap::parse(reply, Some(&node.host)).map_err(|e| LockError::backend("", e))
                })
            });
            match futures_util::future::select_ok(asks).await {
                Ok((map, _)) => {
                    *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = map;
                    return Ok(());
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            LockError::backend(
                "",
                RedisError::from((ErrorKind::Client, "no cluster node known")),
            )
        }))
    }

    /// The seeds' addresses (TCP or TLS).
    fn seed_nodes(&self) -> Vec<Node> {
        self.seeds
            .iter()
            .filter_map(|seed| match seed.get_connection_info().addr() {
                redis::ConnectionAddr::Tcp(host, port)
                | redis::ConnectionAddr::TcpTls { host, port, .. } => Some(Node {
                    host: host.as_str().into(),
                    port: *port,
                }),
                _ => None,
            })
            .collect()
    }

    /// A client for `node` with the first seed's settings (password, TLS).
    fn client_for(&self, node: &Node) -> RedisResult<redis::Client> {
        let seed = self
            .seeds
            .first()
            .ok_or_else(|| RedisError::from((ErrorKind::Client, "no cluster node known")))?;
        super::client_at(seed, &node.host, node.port)
    }

    /// How many subscriber connections the manager keeps: one per master (as
    /// the cluster was at start-up), so that every release is heard from the
    /// master that published it, without waiting for the cluster bus.
    pub(crate) fn pubsub_sources(&self) -> usize {
        self.subscriber_turns.len()
    }

    /// A pub/sub connection for subscriber `source`: to its own master (see
    /// [`Cluster::own_master`]) in the slot map, read again first. Once that master has failed for
    /// [`SUBSCRIBER_FALLBACK_AFTER`], each attempt that finds it still down
    /// tries the next master or seed in turn (classic pub/sub messages reach
    /// every node through the cluster bus, so any node hears every release,
    /// only later; a key's expiry notices, only its own master).
    pub(crate) async fn pubsub(&self, source: usize) -> RedisResult<redis::aio::PubSub> {
        // Renewals refresh the map, but a manager that only listens renews
        // nothing; after a failover the source's master is the promoted
        // replica, which must be heard rather than the next shard's master
        // (whose expiry notices another source hears already). Within a
        // part of the connect budget the subscriber gives this call.
        let _ = tokio::time::timeout(self.connect_timeout / 4, self.refresh_slots()).await;
        let masters = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .masters();
        // This source's own master, first among the candidates.
        let own = self.own_master(source, &masters);
        let mut candidates: Vec<redis::Client> = own
            .iter()
            .chain(masters.iter().filter(|node| Some(*node) != own.as_ref()))
            .filter_map(|node| self.client_for(node).ok())
            .collect();
        candidates.extend(self.seeds.iter().cloned());
        let (Some(turns), Some(failing_since)) = (
            self.subscriber_turns.get(source),
            self.subscriber_failing_since.get(source),
        ) else {
            return candidates[0].get_async_pubsub().await;
        };
        // Counted from before the attempt: one that hangs is cut short by
        // the subscriber's timeout, and must count as a failure too.
        let failing_for = {
            let now = std::time::Instant::now();
            let mut since = failing_since.lock().unwrap_or_else(|e| e.into_inner());
            now.duration_since(*since.get_or_insert(now))
        };
        let succeeded = || {
            *failing_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
            turns.store(0, Ordering::Relaxed);
        };
        let own_attempt = candidates[0].get_async_pubsub();
        // Down for less than a failover takes: wait for the promoted replica
        // (the subscriber tries again after its backoff).
        if failing_for < SUBSCRIBER_FALLBACK_AFTER {
            let own = own_attempt.await;
            if own.is_ok() {
                succeeded();
            }
            return own;
        }
        // Down for long: its own master first, for half of the budget, then
        // the next node in turn (never the own one again: `turn` runs from 1
        // to the number of others).
        if let Ok(Ok(own)) = tokio::time::timeout(self.connect_timeout / 2, own_attempt).await {
            succeeded();
            return Ok(own);
        }
        let others = candidates.len().saturating_sub(1).max(1);
        let turn = turns.fetch_add(1, Ordering::Relaxed) % others + 1;
        candidates[turn % candidates.len()].get_async_pubsub().await
    }

    /// The master subscriber connection `source` listens to, among `masters`
    /// (the slot map's): the one it listened to, while it still is a master;
    /// else the first that no other source listens to (the replica promoted
    /// in its place, or at start-up any). By node, not by place in the map:
    /// the map lists masters by their lowest slot, an order a slot migration
    /// changes, and a source reconnecting by place could land on another
    /// source's master, which would then be heard twice (its expiry notices
    /// reported twice) and its own by nobody. `None` when every master has a
    /// source already (more sources than masters: a shard was removed since
    /// the manager was built); that source then listens to the first master,
    /// whose expiries are reported twice.
    fn own_master(&self, source: usize, masters: &[Node]) -> Option<Node> {
        let mut listened = self
            .subscriber_masters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let kept = listened
            .get(source)
            .cloned()
            .flatten()
            .filter(|node| masters.contains(node));
        let own = kept.or_else(|| {
            masters
                .iter()
                .find(|node| {
                    !listened
                        .iter()
                        .enumerate()
                        .any(|(other, listens)| other != source && listens.as_ref() == Some(node))
                })
                .cloned()
        });
        if let Some(entry) = listened.get_mut(source) {
            entry.clone_from(&own);
        }
        own
    }
}

/// Whether a failed call may have left a reply behind for another caller (a
/// reply of the wrong shape or owner). A timeout or a broken, refused or
/// missing node connection does not: the node connections are multiplexed
/// and drop the reply of an abandoned request.
fn may_be_out_of_sync(e: &CallError) -> bool {
    if !e.maybe_executed {
        return false;
    }
    match &e.error {
        LockError::Backend { source, .. } => !matches!(
            source.kind(),
            BackendErrorKind::Connection | BackendErrorKind::Timeout
        ),
        _ => true,
    }
}

/// Whether a failed call leaves its node's connection unfit for the next:
/// a reply may be another request's, or the connection broke. (A timeout
/// does not: the connection stays in step, and a paused node answers
/// later.)
fn needs_new_connection(e: &CallError) -> bool {
    may_be_out_of_sync(e)
        || matches!(&e.error, LockError::Backend { source, .. }
            if source.kind() == BackendErrorKind::Connection)
}

/// A call that failed because its node could not be reached: refused,
/// reset, or no reply in time.
fn unreachable(e: &CallError) -> bool {
    matches!(&e.error, LockError::Backend { source, .. }
        if matches!(source.kind(), BackendErrorKind::Connection | BackendErrorKind::Timeout))
}

/// Why no slot map could be read from the seeds: a server that is no
/// cluster node, an ACL user who may not read the topology, or no node
/// answering.
fn connect_error(e: LockError, shown: String) -> LockError {
    if is_not_a_cluster(&e.to_string()) {
        return LockError::ServerCheck {
            url: shown,
            reason: format!(
                "the server is not a Redis Cluster node ({e}); use LockManager::builder for a \
                 single server"
            ),
        };
    }
    match e {
        LockError::Backend { source, .. } if source.code() == Some("NOPERM") => {
            LockError::ServerCheck {
                url: shown,
                reason: format!(
                    "reading the cluster's topology was refused: {source}; on a cluster the ACL \
                     user needs +cluster|slots besides what one server needs \
                     (docs/scaling-out.md, \"Redis Cluster\")"
                ),
            }
        }
        LockError::Backend { source, .. } => LockError::Connect { url: shown, source },
        other => other,
    }
}

fn is_not_a_cluster(text: &str) -> bool {
    text.contains("cluster support disabled") || text.contains("This instance has cluster")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.0.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("a{}b"), slot_of("a{}b"));
        assert_eq!(
            slot_of("{}x"),
            crc16::State::<crc16::XMODEM>::calculate(b"{}x") % 16384
        );
        let keys = RedisNames::new("distlock:", "order:42");
        assert_eq!(slot_of(&keys.lock), slot_of(keys.fencing_counter()));
        assert_eq!(slot_of(&keys.lock), slot_of(keys.channel()));
    }

    #[test]
    fn an_endpoint_left_out_is_the_asked_host_and_a_question_mark_no_master() {
        let range = |first: i64, last: i64, host: Value| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                Value::Array(vec![
                    host,
                    Value::Int(7000),
                    Value::BulkString(b"id".to_vec()),
                ]),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 99, Value::BulkString(b"10.0.0.1".to_vec())),
            range(100, 199, Value::Nil),
            range(200, 299, Value::BulkString(b"?".to_vec())),
            range(300, 399, Value::BulkString(Vec::new())),
        ]);
        let node = |host: &str| Node {
            host: host.into(),
            port: 7000,
        };
        let map = SlotMap::parse(reply.clone(), Some("10.9.9.9")).unwrap();
        assert_eq!(map.master_of(50), Some(&node("10.0.0.1")));
        // NULL and empty: the host CLUSTER SLOTS was sent to.
        assert_eq!(map.master_of(150), Some(&node("10.9.9.9")));
        assert_eq!(map.master_of(350), Some(&node("10.9.9.9")));
        // `?`: no endpoint, out of the map.
        assert_eq!(map.master_of(250), None);
        assert_eq!(map.masters().len(), 2);
        // Sent to a node whose host is not known here: not a map to keep.
        assert!(SlotMap::parse(reply, None).is_err());
        let nothing = Value::Array(vec![range(0, 99, Value::BulkString(b"?".to_vec()))]);
        assert!(SlotMap::parse(nothing, Some("10.9.9.9")).is_err());
    }

    #[test]
    fn a_moved_slot_gets_its_new_master_and_replicas_are_kept() {
        let node = |port| Node {
            host: "127.0.0.1".into(),
            port,
        };
        let entry = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(8191), entry(1), entry(11)]),
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                entry(2),
                entry(12),
                entry(11),
            ]),
        ]);
        let mut map = SlotMap::parse(reply, None).unwrap();
        assert_eq!(map.replicas, vec![node(11), node(12)]);
        map.assign(100, node(3));
        assert_eq!(map.master_of(99), Some(&node(1)));
        assert_eq!(map.master_of(100), Some(&node(3)));
        assert_eq!(map.master_of(101), Some(&node(1)));
        assert_eq!(map.master_of(8191), Some(&node(1)));
        map.assign(0, node(3));
        map.assign(16383, node(3));
        assert_eq!(map.master_of(0), Some(&node(3)));
        assert_eq!(map.master_of(1), Some(&node(1)));
        assert_eq!(map.master_of(16383), Some(&node(3)));
        assert_eq!(map.master_of(16382), Some(&node(2)));
        assert_eq!(map.masters().len(), 3);
    }

    #[test]
    fn the_slot_map_finds_each_slots_master() {
        let node = |port| Node {
            host: "127.0.0.1".into(),
            port,
        };
        let map = SlotMap {
            ranges: vec![
                (0, 5460, node(1)),
                (5461, 10922, node(2)),
                (10923, 16383, node(3)),
            ],
            replicas: Vec::new(),
        };
        assert_eq!(map.master_of(0), Some(&node(1)));
        assert_eq!(map.master_of(5460), Some(&node(1)));
        assert_eq!(map.master_of(5461), Some(&node(2)));
        assert_eq!(map.master_of(16383), Some(&node(3)));
        assert_eq!(SlotMap::default().master_of(7), None);
        assert_eq!(map.masters().len(), 3);
    }

    /// A redirection names its target as `CLUSTER SLOTS` does: an empty
    /// host is the node that answered, `?` no address (not followed).
    #[test]
    fn a_redirection_reads_its_host_as_the_slot_map_does() {
        let from = Node {
            host: "10.0.0.9".into(),
            port: 7000,
        };
        let error = |reply: &str| match redis::parse_redis_value(reply.as_bytes()) {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            other => panic!("not an error reply: {other:?}"),
        };
        let to = |host: &str, port| Node {
            host: host.into(),
            port,
        };
        assert_eq!(
            SlotConn::redirect(&error("-MOVED 3999 10.0.0.1:7001\r\n"), &from),
            Some((to("10.0.0.1", 7001), false))
        );
        assert_eq!(
            SlotConn::redirect(&error("-ASK 3999 :7002\r\n"), &from),
            Some((to("10.0.0.9", 7002), true))
        );
        assert_eq!(
            SlotConn::redirect(&error("-MOVED 3999 [::1]:7003\r\n"), &from),
            Some((to("::1", 7003), false))
        );
        assert_eq!(
            SlotConn::redirect(&error("-MOVED 3999 ?:7004\r\n"), &from),
            None
        );
        assert_eq!(SlotConn::redirect(&error("-ERR nope\r\n"), &from), None);
    }

    /// The first key routes a request; its command name is matched in any
    /// case, a script's keys come after its key count.
    #[test]
    fn a_request_routes_by_its_first_key() {
        let key = |cmd: &redis::Cmd| first_key(cmd).map(<[u8]>::to_vec);
        let evalsha = redis::cmd("evalsha")
            .arg("sha")
            .arg(2)
            .arg("{a}:lock")
            .arg("{a}:q")
            .clone();
        assert_eq!(key(&evalsha), Some(b"{a}:lock".to_vec()));
        let keyless = redis::cmd("EVALSHA").arg("sha").arg(0).arg("x").clone();
        assert_eq!(key(&keyless), None);
        assert_eq!(key(redis::cmd("Script").arg("LOAD").arg("x")), None);
        assert_eq!(key(&redis::cmd("PING")), None);
        let publish = redis::cmd("PUBLISH").arg("chan").arg("m").clone();
        assert_eq!(key(&publish), Some(b"chan".to_vec()));
        assert_eq!(
            key(redis::cmd("pexpire").arg("k").arg(5)),
            Some(b"k".to_vec())
        );
    }
}
