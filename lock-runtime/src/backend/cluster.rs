//! Redis Cluster: one call per lock through redis-rs's cluster client, renewals
//! pipelined per node, wake-ups over classic pub/sub on any node.
//!
//! - A lock's names share one hash tag (see `keys.rs`), so each script
//!   runs on the master of one slot. redis-rs routes EVALSHA by its first key,
//!   follows `MOVED` and `ASK`, and retries `TRYAGAIN`/`CLUSTERDOWN` a few times
//!   with short waits (5-100 ms, not its 1.28 s default). A redirection or
//!   migration error that outlives those retries makes an acquire "busy", so the
//!   waiting loop retries it within `wait`; the script never ran, so nothing was
//!   granted. Release and renewal retry it themselves within the command timeout.
//! - Renewal groups a batch by the node that owns each lock's slot (a slot map
//!   from `CLUSTER SLOTS`) and sends one pipeline per node, all at once: one
//!   round trip per node per tick. A node that answers `MOVED`/`ASK` (a stale
//!   map) gets its leases renewed one call each after a map refresh.
//! - A release of several locks (a multi-key guard, the shutdown) sends one
//!   pipeline per node too, on a connection of its own per master, not the
//!   cluster connection: redis-rs sends a pipeline again whole, to the new
//!   master, when one of its replies redirects, and a release run twice
//!   finds its lock gone. A lock whose reply redirects was not touched and
//!   is released with a call of its own (see `Cluster::release_many`).
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
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, SingleNodeRoutingInfo,
};
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
/// migration or redirection error that redis-rs's own retries did not clear.
const RESHARD_BUSY: Duration = Duration::from_millis(10);

pub(crate) struct Cluster {
    client: ClusterClient,
    /// The cluster connection; `None` after it was retired (a reply that may
    /// belong to another request), until the next call connects afresh.
    conn: Mutex<Option<ClusterConnection>>,
    /// A client per seed; their connection settings (password, TLS) are reused
    /// for every node the slot map names.
    seeds: Vec<redis::Client>,
    /// Masters by slot range, for grouping renewals per node and for the
    /// blocking release; refreshed when a node answers MOVED or ASK.
    slots: Mutex<SlotMap>,
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
    command_timeout: Duration,
    connect_timeout: Duration,
    /// Round trips spent on renewals (see `Backend::renewal_round_trips`).
    pub(crate) renewal_round_trips: AtomicU64,
    /// When the connection was last retired for a node that could not be
    /// reached (see [`Cluster::after_failure`]), to do it at most once a
    /// second.
    unreachable_retired_at: Mutex<Option<std::time::Instant>>,
    /// A connection of its own per master for the release pipelines (see
    /// [`Cluster::release_many`]): made on first use, reconnected by
    /// redis-rs when the server closes it, dropped after a pipeline that
    /// failed as a whole or got replies of the wrong shape. Boxed:
    /// `Backend`'s variants stay of a size.
    release_conns: Box<Mutex<Vec<(Node, ConnectionManager)>>>,
    /// Their settings (those of a single server's connection).
    release_conn_config: Box<ConnectionManagerConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    host: String,
    port: u16,
}

/// Slot ranges `(first, last, master)`, sorted by first slot.
#[derive(Debug, Default)]
struct SlotMap {
    ranges: Vec<(u16, u16, Node)>,
}

impl SlotMap {
    fn master_of(&self, slot: u16) -> Option<&Node> {
        let i = self.ranges.partition_point(|(first, _, _)| *first <= slot);
        let (first, last, node) = self.ranges.get(i.checked_sub(1)?)?;
        (*first <= slot && slot <= *last).then_some(node)
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
            // NULL (`cluster-preferred-endpoint-type unknown-endpoint`, behind
            // a load balancer) and an empty endpoint (a node that does not
            // know its own address) mean "the host you sent CLUSTER SLOTS
            // to", with the port given; `?` (a hostname a node lacks) names
            // no endpoint at all: that master's slots stay out of the map,
            // and their locks are renewed and released one call each,
            // routed by redis-rs. (Before, any of them failed the refresh.)
            let host: Option<String> = redis::from_redis_value(host)?;
            let host =
                match host {
                    Some(host) if host == "?" => continue,
                    Some(host) if !host.is_empty() => host,
                    _ => match asked {
                        Some(asked) => asked.to_owned(),
                        None => return Err(RedisError::from((
                            ErrorKind::Parse,
                            "CLUSTER SLOTS names the asked node's host, which is not known here",
                        ))),
                    },
                };
            let node = Node {
                host,
                port: redis::from_redis_value(port)?,
            };
            ranges.push((first, last, node));
        }
        if ranges.is_empty() {
            return Err(RedisError::from((
                ErrorKind::Parse,
                "CLUSTER SLOTS names no master with an endpoint",
            )));
        }
        ranges.sort_by_key(|(first, _, _)| *first);
        Ok(SlotMap { ranges })
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

/// The cluster connection as the scripts use it: a `SCRIPT LOAD` (a script's
/// reload after NOSCRIPT) goes to every master. redis-rs sends it to every
/// node, replicas included, and waits for all of them, so one replica that
/// accepted connections but stopped answering (paused, overloaded) made every
/// reload time out, and with it the call that met NOSCRIPT, on any master.
/// Replicas run no scripts; a promoted one loads them at its first NOSCRIPT.
struct ScriptConn(ClusterConnection);

impl ConnectionLike for ScriptConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        if is_script_load(cmd) {
            let every_master = RoutingInfo::MultiNode((
                MultipleNodeRoutingInfo::AllMasters,
                Some(ResponsePolicy::AllSucceeded),
            ));
            Box::pin(self.0.route_command(cmd.clone(), every_master))
        } else {
            self.0.req_packed_command(cmd)
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

fn is_script_load(cmd: &redis::Cmd) -> bool {
    let mut args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => bytes,
        _ => &[],
    });
    args.next()
        .is_some_and(|a| a.eq_ignore_ascii_case(b"SCRIPT"))
        && args.next().is_some_and(|a| a.eq_ignore_ascii_case(b"LOAD"))
}

impl Cluster {
    /// Connects to the cluster through `seeds` and runs the server check on the
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
        // redis-rs speaks the first seed's protocol to every node.
        let protocol = seed_clients[0]
            .get_connection_info()
            .redis_settings()
            .protocol();
        let builder =
            ClusterClientBuilder::new(seed_clients.iter().map(|c| c.get_connection_info().clone()))
                // redis-rs's defaults retry 16 times, waiting 1.28 s or more before
                // retrying TRYAGAIN or CLUSTERDOWN; a slot migration clears in
                // milliseconds, and the layers above retry anyway (an acquisition
                // counts the lock busy within its wait; release and renewal retry
                // within the command timeout), so a cluster that is down during a
                // failover shows up as busy rather than as a timed-out call.
                .retries(1)
                .min_retry_wait(5)
                .max_retry_wait(100)
                .connection_timeout(config.connect_timeout);
        #[cfg(feature = "tls")]
        let builder = match super::tls_certificates(tls) {
            Some(certs) => builder.certs(certs),
            None => builder,
        };
        let client = builder.build().map_err(invalid)?;
        let connecting = client.get_async_connection();
        let mut conn = match tokio::time::timeout(config.connect_timeout, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(connect_error(e, shown)),
            Err(_) => return Err(super::connect_timed_out(shown, config.connect_timeout)),
        };
        let mut cluster = Cluster {
            client,
            conn: Mutex::new(None),
            seeds: seed_clients,
            slots: Mutex::new(SlotMap::default()),
            subscriber_turns: Vec::new(),
            subscriber_failing_since: Vec::new(),
            subscriber_masters: Mutex::new(Vec::new()),
            scripts: Scripts::for_cluster(&config.key_prefix),
            replica_ack: config.replica_ack,
            command_timeout: config.command_timeout,
            connect_timeout: config.connect_timeout,
            renewal_round_trips: AtomicU64::new(0),
            unreachable_retired_at: Mutex::new(None),
            release_conns: Box::default(),
            release_conn_config: Box::new(super::single::connection_config(config)),
        };
        if let Err(e) = cluster.refresh_slots(&mut conn).await {
            return Err(LockError::ServerCheck {
                url: shown,
                reason: format!("CLUSTER SLOTS failed: {e}"),
            });
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
        super::check::check(
            &mut conn,
            protocol,
            || cluster.pubsub(0),
            &cluster.scripts,
            config,
            &shown,
        )
        .await?;
        *cluster.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
        Ok(cluster)
    }

    /// The cluster connection, connecting a fresh one after a retirement.
    async fn connection(&self, key: &str) -> Result<ClusterConnection, CallError> {
        if let Some(conn) = self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(conn);
        }
        let conn = bounded_call(
            key,
            self.connect_timeout,
            self.client.get_async_connection(),
        )
        .await?;
        let mut current = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        Ok(current.get_or_insert(conn).clone())
    }

    /// Drops the cluster connection after a call that may have lost its reply:
    /// redis-rs's per-node connections are multiplexed, so this should not
    /// happen; if a reply for another owner ever comes, trust nothing on it.
    fn retire_connection(&self) {
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        tracing::debug!(target: "distlock::connection", "cluster connection retired after a failed call");
    }

    /// What a failed call leaves behind. A reply that may belong to another
    /// request retires the connection at once. A node that cannot be reached
    /// (refused, reset, timed out) retires it too, at most once a second:
    /// redis-rs's cluster connection learns a new topology only from a MOVED
    /// reply, which a dead master never sends, so after its replica took over
    /// the connection would go on calling the dead address for the slots it
    /// served. A fresh connection reads the slot map from the live nodes.
    fn after_failure(&self, e: &CallError) {
        if may_be_out_of_sync(e) {
            self.retire_connection();
            return;
        }
        if !unreachable(e) {
            return;
        }
        let now = std::time::Instant::now();
        {
            let mut last = self
                .unreachable_retired_at
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
                return;
            }
            *last = Some(now);
        }
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        tracing::debug!(target: "distlock::connection",
            error = %e.error,
            "cluster connection retired after a node could not be reached; the next call reads the topology again"
        );
    }

    /// Runs `call` on the cluster connection under the command timeout,
    /// retrying a slot in migration until the timeout.
    async fn call<T, F, Fut>(&self, key: &str, call: F) -> Result<T, CallError>
    where
        F: FnMut(ClusterConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.call_within(key, self.command_timeout, call).await
    }

    /// [`Cluster::call`] under `timeout`.
    async fn call_within<T, F, Fut>(
        &self,
        key: &str,
        timeout: Duration,
        mut call: F,
    ) -> Result<T, CallError>
    where
        F: FnMut(ClusterConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let conn = self.connection(key).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let retrying = async {
            let mut delay = Duration::from_millis(5);
            loop {
                match call(conn.clone()).await {
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
        let result = bounded_call(key, timeout, retrying).await;
        if let Err(e) = &result {
            self.after_failure(e);
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
        self.call_within(key, timeout, |conn| async move {
            call.call(scripts, &mut ScriptConn(conn)).await
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
        let mut conn = ScriptConn(self.connection(key).await?);
        let ack = self.replica_ack;
        let deadline = tokio::time::Instant::now() + self.command_timeout;
        let acquire = async {
            let mut delay = Duration::from_millis(5);
            loop {
                let reply = match &ack {
                    None => self
                        .scripts
                        .acquire(&mut conn, keys, owner, lease_ms, spec)
                        .await
                        .map(|reply| (reply, 0)),
                    // A pipeline goes to the node of its first keyed command, and
                    // WAIT (a command for all nodes) rides along on that node's
                    // connection: it counts the replicas of the lock's master.
                    // Boxed: its future is larger than the plain call's, which
                    // every acquisition without `replica_ack` would carry.
                    Some(ack) => {
                        Box::pin(
                            self.scripts
                                .acquire_acked(&mut conn, keys, owner, lease_ms, spec, ack),
                        )
                        .await
                    }
                };
                match reply {
                    // redis-rs follows a MOVED itself; one that reaches us came
                    // to the copy it sent after the first one's connection broke
                    // (its reply lost), routed to another node while the
                    // master's connection was made again. The first may have
                    // taken the lock: the next attempt reaches the master and
                    // finds it ours (every acquisition answers "ours" to its
                    // own owner token), where "busy" would leave it held for
                    // its lease.
                    Err(e)
                        if e.kind() == ErrorKind::Server(ServerErrorKind::Moved)
                            && tokio::time::Instant::now() + delay < deadline =>
                    {
                        tracing::debug!(target: "distlock::acquire", error = %e, "MOVED after a resend; attempting again");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_millis(100));
                    }
                    // The script did not run: busy until the slot has moved or the
                    // cluster is up again.
                    Err(e) if is_resharding(&e) => {
                        tracing::debug!(target: "distlock::acquire", error = %e, "slot moving or cluster down; busy");
                        return Ok((
                            AcquireReply::Busy {
                                remaining: Some(RESHARD_BUSY),
                            },
                            0,
                        ));
                    }
                    other => return other,
                }
            }
        };
        let timeout = self.command_timeout + ack.map_or(Duration::ZERO, |a| a.timeout);
        let result = bounded_call(key, timeout, acquire).await;
        if let Err(e) = &result {
            self.after_failure(e);
        }
        let (reply, acked) = result?;
        match &ack {
            None => Ok(reply),
            Some(ack) => {
                let release = Release {
                    keys,
                    owner,
                    keep_ms: 0,
                    waiters: ExpectedWaiters::Unknown,
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

    /// The connection, and the masters it routes to, for a command on each:
    /// the slot map read again first (an operator's call, rare): a map
    /// refreshed only when a call met a moved slot still names a master
    /// that failed over, or misses one added since, for a manager that made
    /// no call meanwhile. A refresh that fails leaves the map as it was.
    async fn every_master(&self) -> Result<(ClusterConnection, Vec<Node>), CallError> {
        let mut conn = self.connection("").await?;
        if let Err(e) = self.refresh_slots(&mut conn).await {
            tracing::debug!(target: "distlock::connection", error = %e,
                "could not read the slot map again; using the one known");
        }
        let masters = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .masters();
        Ok((conn, masters))
    }

    /// The value of server setting `name` on every master.
    pub(crate) async fn config_get(&self, name: &str) -> Result<Vec<Option<String>>, CallError> {
        let (conn, masters) = self.every_master().await?;
        let mut values = Vec::new();
        for node in masters {
            let mut conn = conn.clone();
            let mut get = redis::cmd("CONFIG");
            get.arg("GET").arg(name);
            let reply = bounded_call(
                "",
                self.command_timeout,
                conn.route_command(get, RoutingInfo::SingleNode(by_address(&node))),
            )
            .await?;
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
        let (conn, masters) = self.every_master().await?;
        let mut names = Vec::new();
        for node in masters {
            let mut cursor = 0;
            loop {
                let mut conn = conn.clone();
                let reply = bounded_call(
                    "",
                    self.command_timeout,
                    conn.route_command(
                        scripts::scan_cmd(cursor, pattern),
                        RoutingInfo::SingleNode(by_address(&node)),
                    ),
                )
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

    /// One pipeline per node, all at once, each on a connection of its own to
    /// that node ([`Cluster::release_connection`]), never on the cluster
    /// connection: redis-rs sends a pipeline again whole, to the new
    /// address, when one of its replies redirects, so a lock released by
    /// the first send was found gone by the second and reported lost. On a
    /// connection of its own a pipeline is sent once: a lock whose reply
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
                let Some(node) = node else {
                    let each = group.iter().map(|(keys, owner, keep_ms)| async move {
                        let release = Release {
                            keys,
                            owner,
                            keep_ms: *keep_ms,
                            waiters: ExpectedWaiters::Unknown,
                        };
                        self.on_key("", &release).await
                    });
                    return (indices, ManyReleased::of_each(join_all(each).await));
                };
                let pipe = self.scripts.release_many_pipeline(&group);
                let sent = match self.release_connection(&node).await {
                    Ok(mut node_conn) => {
                        bounded_call("", self.command_timeout, async {
                            node_conn.req_packed_commands(&pipe, 0, pipe.len()).await
                        })
                        .await
                    }
                    Err(e) => Err(e),
                };
                let sent = sent.and_then(|replies| {
                    self.scripts
                        .release_many_replies_each(&group, replies)
                        .map_err(|e| CallError {
                            error: LockError::backend("", e),
                            maybe_executed: true,
                        })
                });
                let released = match sent {
                    Ok(each) => {
                        // A reply of the wrong shape or for another owner
                        // may be another request's: the connection is
                        // retired. An error reply (BUSY, OOM, ...) leaves
                        // its lock unknown and the connection as it is.
                        if each.iter().any(|r| {
                            r.as_ref()
                                .is_err_and(|e| !matches!(e.kind(), ErrorKind::Server(_)))
                        }) {
                            self.retire_release_connection(&node);
                        }
                        // A lock whose slot moved was not touched: released
                        // again now, where its slot is.
                        let again =
                            each.iter()
                                .zip(&group)
                                .map(|(reply, (keys, owner, keep_ms))| {
                                    let moved = reply.as_ref().is_err_and(is_resharding);
                                    async move {
                                        if !moved {
                                            return None;
                                        }
                                        stale_map.store(true, Ordering::Relaxed);
                                        let release = Release {
                                            keys,
                                            owner,
                                            keep_ms: *keep_ms,
                                            waiters: ExpectedWaiters::Unknown,
                                        };
                                        Some(self.on_key("", &release).await)
                                    }
                                });
                        let again = join_all(again).await;
                        ManyReleased::of_each(each.into_iter().zip(again).map(|(reply, again)| {
                            again.unwrap_or_else(|| {
                                reply.map_err(|e| CallError {
                                    error: LockError::backend("", e),
                                    maybe_executed: true,
                                })
                            })
                        }))
                    }
                    Err(e) => {
                        // The node's connection goes. A node that did not
                        // answer may have failed over: the cluster
                        // connection learns it from a fresh one, and the
                        // slot map is read again. (Replies out of sync on
                        // this connection say nothing about that one.)
                        self.retire_release_connection(&node);
                        if unreachable(&e) {
                            self.after_failure(&e);
                            stale_map.store(true, Ordering::Relaxed);
                        }
                        ManyReleased::failed(group.len(), e)
                    }
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
            let refreshing = async {
                match self.connection("").await {
                    Ok(mut conn) => self
                        .refresh_slots(&mut conn)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.error.to_string()),
                }
            };
            let refreshed = tokio::time::timeout(self.connect_timeout / 4, refreshing)
                .await
                .unwrap_or_else(|_| Err("no slot map in time".to_owned()));
            if let Err(e) = refreshed {
                tracing::debug!(target: "distlock::release", error = %e, "could not refresh the slot map");
            }
        }
        out
    }

    /// The connection to `node` for release pipelines, connected on first
    /// use (with the seed's settings: password, TLS) within the connect
    /// timeout. Connections to nodes no longer masters in the slot map are
    /// dropped when a new one is made.
    async fn release_connection(&self, node: &Node) -> Result<ConnectionManager, CallError> {
        if let Some((_, conn)) = self
            .release_conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(n, _)| n == node)
        {
            return Ok(conn.clone());
        }
        // RESP3 whatever the URL says, where the server speaks it: redis-rs
        // then sees the server close an idle connection (its `timeout`, a
        // proxy's idle limit) and makes it again at once; under RESP2 the
        // next release would be written into the dead connection and fail,
        // leaving its locks unknown. (The release scripts' replies read the
        // same in both.)
        let client = self
            .client_for(node)
            .and_then(|client| {
                let info = client.get_connection_info().clone();
                let settings = info
                    .redis_settings()
                    .clone()
                    .set_protocol(redis::ProtocolVersion::RESP3);
                redis::Client::open(info.set_redis_settings(settings))
            })
            .map_err(|e| CallError {
                error: LockError::backend("", e),
                maybe_executed: false,
            })?;
        let connect = |client: redis::Client| {
            bounded_call(
                "",
                self.connect_timeout,
                ConnectionManager::new_with_config(client, (*self.release_conn_config).clone()),
            )
        };
        let conn = match connect(client).await {
            Ok(conn) => Ok(conn),
            // A server that answered but refused RESP3 (`HELLO 3` unknown or
            // renamed, a proxy that speaks RESP2 only): the URL's protocol,
            // without the early reconnection. (Refused credentials would be
            // refused again.)
            Err(e)
                if !unreachable(&e)
                    && !matches!(&e.error, LockError::Backend { source, .. }
                        if source.kind() == BackendErrorKind::Auth) =>
            {
                match self.client_for(node) {
                    Ok(client) => connect(client).await,
                    Err(_) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
        // Nothing was sent on a connection that was never made.
        .map_err(|e| CallError {
            maybe_executed: false,
            ..e
        })?;
        let masters = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .masters();
        let mut conns = self.release_conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|(n, _)| masters.contains(n));
        if let Some((_, made)) = conns.iter().find(|(n, _)| n == node) {
            return Ok(made.clone());
        }
        conns.push((node.clone(), conn.clone()));
        Ok(conn)
    }

    /// Drops the release connection to `node` after a failure: a reply may
    /// be missing or another request's.
    fn retire_release_connection(&self, node: &Node) {
        self.release_conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, _)| n != node);
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
        let client =
            match node {
                Some(node) => self.client_for(&node)?,
                None => self.seeds.first().cloned().ok_or_else(|| {
                    RedisError::from((ErrorKind::Client, "no cluster node known"))
                })?,
            };
        let mut conn = client.get_connection_with_timeout(self.connect_timeout)?;
        conn.set_read_timeout(Some(self.command_timeout))?;
        conn.set_write_timeout(Some(self.command_timeout))?;
        self.scripts
            .release_blocking(&mut conn, keys, owner, keep_ms)
    }

    /// One pipeline per node, sent to all nodes at once.
    pub(crate) async fn renew(&self, batch: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        let conn = match self.connection("").await {
            Ok(conn) => conn,
            Err(e) => return failed_all(batch, &e.error.to_string()),
        };
        let groups = self.group_by_node(batch.iter().map(|lease| lease.keys.lock.as_str()));
        let group_count = groups.len();
        let stale_map = AtomicBool::new(false);
        let timed_out = AtomicUsize::new(0);
        let sends = groups.into_iter().map(|(node, indices)| {
            let conn = conn.clone();
            let (stale_map, timed_out) = (&stale_map, &timed_out);
            async move {
                let leases: Vec<Arc<Lease>> = indices.iter().map(|i| batch[*i].clone()).collect();
                let outcomes = match node {
                    Some(node) => {
                        self.renew_on(conn, &node, &leases, end, stale_map, timed_out)
                            .await
                    }
                    None => None,
                };
                let outcomes = match outcomes {
                    Some(outcomes) => outcomes,
                    None => {
                        stale_map.store(true, Ordering::Relaxed);
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
        // No node of several answered: redis-rs's connection itself may be
        // stuck (busy with a silent node); retired as a failed call retires
        // it. One paused node, alone in a round or among others that
        // answered, does not retire it: a fresh connection would wait for
        // that node too, and hold up the next round.
        if group_count > 1 && timed_out.load(Ordering::Relaxed) == group_count {
            self.after_failure(&CallError {
                error: LockError::command_timeout("", self.command_timeout),
                maybe_executed: true,
            });
        }
        if stale_map.load(Ordering::Relaxed) {
            let mut conn = conn;
            if let Err(e) = self.refresh_slots(&mut conn).await {
                tracing::debug!(target: "distlock::renewal", error = %e, "could not refresh the slot map");
            }
        }
        out
    }

    /// Renews `leases`, all owned by `node`, in one pipeline; `None` when the
    /// node did not own them all (a stale slot map) or the pipeline failed as a
    /// whole in a way a per-lock call may not. A node that cannot be reached
    /// sets `stale_map` too: it may have failed over to a replica.
    async fn renew_on(
        &self,
        mut conn: ClusterConnection,
        node: &Node,
        leases: &[Arc<Lease>],
        end: LeaseEnd,
        stale_map: &AtomicBool,
        timed_out: &AtomicUsize,
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
        self.renewal_round_trips.fetch_add(1, Ordering::Relaxed);
        let replies = bounded_call(
            "",
            self.command_timeout,
            conn.route_pipeline(pipe, 0, leases.len(), by_address(node)),
        )
        .await;
        let replies = match replies {
            Ok(replies) => replies,
            Err(e) if !e.maybe_executed => return None,
            Err(e) if may_be_out_of_sync(&e) => {
                self.retire_connection();
                stale_map.store(true, Ordering::Relaxed);
                return Some(failed_all(leases, &e.error.to_string()));
            }
            // No reply in time: the node is paused, overloaded or cut off.
            // Renewing these leases one call each would wait for it as long
            // again (redis-rs routes them to the same node) and hold up the
            // whole round, and with it the next renewals of every master's
            // leases. They fail now and are retried a third of their
            // interval later, after the slot map is read again (where a
            // failover shows). (When every node timed out, `renew` retires
            // the cluster connection: redis-rs's, busy with a silent node,
            // may answer nothing.)
            Err(e)
                if matches!(&e.error, LockError::Backend { source, .. }
                    if source.is_timeout()) =>
            {
                timed_out.fetch_add(1, Ordering::Relaxed);
                stale_map.store(true, Ordering::Relaxed);
                return Some(failed_all(leases, &e.error.to_string()));
            }
            // The node is gone (its connection broke): the map may be stale
            // (a failover), so renew these leases one call each, routed by
            // redis-rs, which follows the cluster to the new master.
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
        if out_of_sync {
            self.retire_connection();
        }
        let Some(mut outcomes) = outcomes else {
            let error = scripts::out_of_sync("a renewal pipeline got the wrong number of replies");
            return Some(failed_all(leases, &error.to_string()));
        };
        if missing_script && !out_of_sync {
            // A node restarted, flushed its scripts, was promoted, or never
            // ran a renewal: SCRIPT LOAD goes to every master, within the
            // command timeout (unbounded, it waited for a master that stopped
            // answering and held up the renewals of every node); the leases
            // are retried at once.
            let mut conn = ScriptConn(conn);
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

    /// Renews each lease with a call of its own (redis-rs routes it and follows
    /// redirections), all at once.
    async fn renew_each(&self, leases: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        let each = leases.iter().map(|lease| async move {
            let sent_at = Instant::now();
            self.renewal_round_trips.fetch_add(1, Ordering::Relaxed);
            let scripts = &self.scripts;
            let cmd = scripts.renew_cmd(&lease.keys, &lease.owner, lease.lease_ms(), end);
            let renewed = self
                .call(&lease.key, |conn| {
                    let cmd = cmd.clone();
                    async move {
                        scripts
                            .invoke_renew(&mut ScriptConn(conn), lease.keys.kind, &cmd)
                            .await
                    }
                })
                .await;
            match renewed.map(|reply| Scripts::renew_reply(reply, &lease.owner)) {
                Ok(Ok(true)) => Renewal::Renewed { sent_at },
                Ok(Ok(false)) => Renewal::NotOurs,
                Ok(Err(e)) => {
                    self.retire_connection();
                    Renewal::Failed(e.to_string())
                }
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

    /// Reads `CLUSTER SLOTS` from every master of the current map at once (and
    /// from any node when the map is empty) and keeps the first answer: a dead
    /// or stopped master, which is when the map needs refreshing, must not
    /// hold the refresh up.
    async fn refresh_slots(&self, conn: &mut ClusterConnection) -> RedisResult<()> {
        let masters = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .masters();
        // Asked by address (so that a reply naming "the host you asked" can
        // be read): the masters, or before the first map the seeds.
        let asked = if masters.is_empty() {
            self.seed_nodes()
        } else {
            masters
        };
        let mut routes: Vec<(SingleNodeRoutingInfo, Option<String>)> = asked
            .into_iter()
            .map(|node| (by_address(&node), Some(node.host)))
            .collect();
        routes.push((SingleNodeRoutingInfo::Random, None));
        let asks = routes.into_iter().map(|(route, asked)| {
            let mut conn = conn.clone();
            Box::pin(async move {
                let reply = tokio::time::timeout(
                    self.command_timeout,
                    conn.route_command(
                        redis::cmd("CLUSTER").arg("SLOTS").clone(),
                        RoutingInfo::SingleNode(route),
                    ),
                )
                .await
                .map_err(|_| {
                    RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "CLUSTER SLOTS timed out",
                    ))
                })??;
                SlotMap::parse(reply, asked.as_deref())
            })
        });
        let (map, _) = futures_util::future::select_ok(asks).await?;
        *self.slots.lock().unwrap_or_else(|e| e.into_inner()) = map;
        Ok(())
    }

    /// The seeds' addresses (TCP or TLS).
    fn seed_nodes(&self) -> Vec<Node> {
        self.seeds
            .iter()
            .filter_map(|seed| match seed.get_connection_info().addr() {
                redis::ConnectionAddr::Tcp(host, port)
                | redis::ConnectionAddr::TcpTls { host, port, .. } => Some(Node {
                    host: host.clone(),
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
        // (whose expiry notices another source hears already).
        // Through the cluster connection in use only (a new one waits for
        // every seed, a hung one for its whole timeout), and within a part
        // of the connect budget the subscriber gives this call.
        let cached = self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(mut conn) = cached {
            let _ =
                tokio::time::timeout(self.connect_timeout / 4, self.refresh_slots(&mut conn)).await;
        }
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
/// missing node connection does not: redis-rs's per-node connections are
/// multiplexed and drop the reply of an abandoned request. Retiring the
/// cluster connection for those made the next call of every lock, on every
/// node, wait for a fresh connection to all nodes, which hangs on a master
/// that stopped answering.
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

/// A call that failed because its node could not be reached: refused,
/// reset, or no reply in time.
fn unreachable(e: &CallError) -> bool {
    matches!(&e.error, LockError::Backend { source, .. }
        if matches!(source.kind(), BackendErrorKind::Connection | BackendErrorKind::Timeout))
}

fn by_address(node: &Node) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::ByAddress {
        host: node.host.clone(),
        port: node.port,
    }
}

/// Why the cluster client could not start: a server that is no cluster node, an
/// ACL user who may not read the topology, or no node answering.
fn connect_error(e: RedisError, shown: String) -> LockError {
    if is_not_a_cluster(&e) {
        return LockError::ServerCheck {
            url: shown,
            reason: format!(
                "the server is not a Redis Cluster node ({e}); use LockManager::builder for a \
                 single server"
            ),
        };
    }
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        return LockError::ServerCheck {
            url: shown,
            reason: format!(
                "reading the cluster's topology was refused: {e}; on a cluster the ACL user \
                 needs +cluster|slots besides what one server needs (docs/scaling-out.md, \
                 \"Redis Cluster\")"
            ),
        };
    }
    LockError::connect(shown, e)
}

fn is_not_a_cluster(e: &RedisError) -> bool {
    let text = e.to_string();
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
            host: host.to_owned(),
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
    fn the_slot_map_finds_each_slots_master() {
        let node = |port| Node {
            host: "127.0.0.1".to_owned(),
            port,
        };
        let map = SlotMap {
            ranges: vec![
                (0, 5460, node(1)),
                (5461, 10922, node(2)),
                (10923, 16383, node(3)),
            ],
        };
        assert_eq!(map.master_of(0), Some(&node(1)));
        assert_eq!(map.master_of(5460), Some(&node(1)));
        assert_eq!(map.master_of(5461), Some(&node(2)));
        assert_eq!(map.master_of(16383), Some(&node(3)));
        assert_eq!(SlotMap::default().master_of(7), None);
        assert_eq!(map.masters().len(), 3);
    }
}
