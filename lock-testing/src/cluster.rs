//! [`RedisCluster`]: a private Redis Cluster of `redis-server` child processes, formed by hand
//! over the fixture's own connections (no `redis-cli` needed).

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::Value;

use super::server::{pick_port, RedisServer, RedisServerBuilder};
use super::tls::TlsCa;
use super::TestingError;

/// The number of hash slots of a Redis Cluster (0 to 16383).
pub const CLUSTER_SLOTS: u16 = 16_384;

/// How long [`RedisClusterBuilder::spawn`] waits for the cluster to form, after its processes
/// answer `PING`.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a migration waits for every node to agree on the new owner of the slot.
const AGREE_TIMEOUT: Duration = Duration::from_secs(10);

/// `cluster-node-timeout` of every node: a killed master is failed over about a second after it.
const NODE_TIMEOUT_MS: &str = "2000";

/// How often a node is started again on fresh ports after losing a race for its bus port.
const NODE_SPAWN_ATTEMPTS: u32 = 4;

/// Keys moved by one `MIGRATE` while a slot is emptied.
const MIGRATE_BATCH: usize = 100;

/// `MIGRATE`'s own timeout, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 5_000;

const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of its
/// hash tag (the part between the first `{` and the next `}`, if not empty), modulo 16384.
///
/// ```
/// use distlock_testing::key_slot;
///
/// assert_eq!(key_slot(b"foo"), 12182);
/// assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
/// ```
//
// Computed here rather than taken from distlock-runtime (which keeps its own private): the
// fixtures do not depend on the runtime, and a test that compares the slots of the runtime's
// key names with this one checks them against the specification, not against themselves.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % CLUSTER_SLOTS
}

/// Configures and starts a [`RedisCluster`]: how many masters, how many replicas each, TLS,
/// extra `redis-server` arguments.
///
/// ```no_run
/// use distlock_testing::RedisCluster;
///
/// # fn example() -> Result<(), distlock_testing::TestingError> {
/// let cluster = RedisCluster::builder()
///     .masters(3)
///     .replicas_per_master(1)
///     .spawn()?;
/// assert_eq!(cluster.nodes().len(), 6);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until spawn() is called"]
pub struct RedisClusterBuilder {
    masters: usize,
    replicas_per_master: usize,
    tls: bool,
    args: Vec<String>,
    dies_with_process: bool,
}

impl Default for RedisClusterBuilder {
    fn default() -> RedisClusterBuilder {
        RedisClusterBuilder {
            masters: 3,
            replicas_per_master: 0,
            tls: false,
            args: Vec::new(),
            dies_with_process: false,
        }
    }
}

impl RedisClusterBuilder {
    /// A builder for 3 masters without replicas; the same as [`RedisCluster::builder`].
    pub fn new() -> RedisClusterBuilder {
        RedisClusterBuilder::default()
    }

    /// The number of masters (default 3); the 16384 slots are split evenly between them.
    ///
    /// Redis needs a majority of masters to fail one over, so tests that kill a master want at
    /// least 3.
    pub fn masters(mut self, masters: usize) -> RedisClusterBuilder {
        self.masters = masters;
        self
    }

    /// The number of replicas of every master (default 0).
    pub fn replicas_per_master(mut self, replicas: usize) -> RedisClusterBuilder {
        self.replicas_per_master = replicas;
        self
    }

    /// Whether the cluster speaks TLS only (default `false`).
    ///
    /// Every node then listens for clients on a TLS port only (its plain port is off), and
    /// the cluster bus and replication go over TLS too (`tls-cluster yes`, `tls-replication
    /// yes`). All node certificates (for `localhost` and `127.0.0.1`) are signed by one
    /// certificate authority made for the cluster, so the nodes trust each other; clients must
    /// trust [`RedisCluster::ca_cert_pem`]. [`RedisCluster::urls`] are then
    /// `rediss://127.0.0.1:PORT`, and the fixture's own connections (forming the cluster,
    /// [`RedisCluster::blocking_client`], [`RedisCluster::cluster_connection`], migrations)
    /// use TLS with that CA. Client certificates are not asked for.
    ///
    /// [`RedisCluster::migrate_slot`] works too: Redis (6.0 and later) opens `MIGRATE`'s
    /// connection to the target node over TLS when `tls-cluster` is on.
    pub fn tls(mut self, tls: bool) -> RedisClusterBuilder {
        self.tls = tls;
        self
    }

    /// Adds one `redis-server` argument for every node, such as `"--maxmemory"` or `"10mb"`.
    ///
    /// Extra arguments come after the defaults, so they override them; do not override the
    /// ports, `--bind`, `--dir`, `--logfile`, `--cluster-enabled` or `--cluster-config-file`.
    pub fn arg(mut self, arg: impl Into<String>) -> RedisClusterBuilder {
        self.args.push(arg.into());
        self
    }

    /// Adds several `redis-server` arguments for every node; see [`arg`](Self::arg).
    pub fn args<I, S>(mut self, args: I) -> RedisClusterBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the nodes, forms the cluster and waits until it is ready.
    ///
    /// Ready means: every node reports `cluster_state:ok` and knows every other node, every
    /// replica's link to its master is up, and every node's `CLUSTER SLOTS` covers all 16384
    /// slots with the masters they were given, so a client that connects right away sees the
    /// full map. This takes a little over 2 s (Redis keeps a new master from turning
    /// `cluster_state:ok` for 2 s). Fails after 20 s with an error naming the node that was
    /// not ready and the end of its log.
    pub fn spawn(&self) -> Result<RedisCluster, TestingError> {
        if self.masters == 0 || self.masters > usize::from(CLUSTER_SLOTS) {
            return Err(TestingError::Cluster(format!(
                "a cluster needs 1 to {CLUSTER_SLOTS} masters, not {}",
                self.masters
            )));
        }
        let tls_ca = if self.tls {
            Some(Arc::new(TlsCa::new()?))
        } else {
            None
        };
        let total = self.masters * (1 + self.replicas_per_master);
        let mut nodes = Vec::with_capacity(total);
        for index in 0..total {
            let replica_of = (index >= self.masters).then(|| (index - self.masters) % self.masters);
            nodes.push(self.spawn_node(index, replica_of, tls_ca.as_ref())?);
        }
        let mut cluster = RedisCluster {
            nodes,
            masters: self.masters,
            tls_ca,
        };
        // On failure `cluster` is dropped, which kills the nodes started so far.
        cluster.form()?;
        Ok(cluster)
    }

    fn spawn_node(
        &self,
        index: usize,
        replica_of: Option<usize>,
        tls_ca: Option<&Arc<TlsCa>>,
    ) -> Result<Node, TestingError> {
        let mut attempt = 1;
        loop {
            // The default bus port (port + 10000) would fall into the ephemeral port range.
            let bus_port = pick_port()?;
            let mut builder = RedisServerBuilder::new();
            if let Some(ca) = tls_ca {
                builder = builder.tls_ca(Arc::clone(ca)).args([
                    "--tls-cluster",
                    "yes",
                    "--tls-replication",
                    "yes",
                ]);
            }
            let spawned = builder
                .dies_with_process(self.dies_with_process)
                .args(["--cluster-enabled", "yes"])
                // Relative to --dir, the node's own temporary directory.
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--cluster-node-timeout", NODE_TIMEOUT_MS])
                .arg("--cluster-port")
                .arg(bus_port.to_string())
                .args(["--repl-diskless-sync-delay", "0"])
                .args(self.args.iter().cloned())
                .spawn();
            match spawned {
                Ok(server) => {
                    return Ok(Node {
                        index,
                        server,
                        bus_port,
                        id: String::new(),
                        replica_of,
                        paused: AtomicBool::new(false),
                    })
                }
                // Also what a taken bus port looks like.
                Err(TestingError::PortInUse { .. }) if attempt < NODE_SPAWN_ATTEMPTS => {
                    tracing::debug!(index, bus_port, attempt, "port taken; retrying node");
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// The role a node of a [`RedisCluster`] was given at spawn time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterNodeRole {
    /// A master that was given a share of the slots.
    Master,
    /// A replica of the master with this index.
    Replica {
        /// The index of its master in [`RedisCluster::nodes`].
        of: usize,
    },
}

/// What [`RedisCluster::nodes`] tells about one node.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterNode {
    /// The node's index: masters come first (`0..masters`), then the replicas.
    pub index: usize,
    /// The node's data port on 127.0.0.1.
    pub port: u16,
    /// The node's cluster bus port.
    pub bus_port: u16,
    /// `redis://127.0.0.1:PORT`, or `rediss://127.0.0.1:PORT` on a TLS cluster.
    pub url: String,
    /// The node's cluster id (`CLUSTER MYID`).
    pub id: String,
    /// The role given at spawn time; after a failover a replica may be the master of the slots
    /// (ask [`RedisCluster::master_of_slot`]).
    pub role: ClusterNodeRole,
    /// The process id, or `None` once the node was killed.
    pub pid: Option<u32>,
    /// Whether the process is alive (a paused node counts as running).
    pub is_running: bool,
    /// Whether the node is paused with [`RedisCluster::pause`].
    pub is_paused: bool,
}

struct Node {
    index: usize,
    server: RedisServer,
    bus_port: u16,
    id: String,
    replica_of: Option<usize>,
    paused: AtomicBool,
}

impl Node {
    fn conn(&self) -> Result<redis::Connection, TestingError> {
        self.server.blocking_client()
    }

    /// Running and not paused: can answer.
    fn answers(&self) -> bool {
        self.server.is_running() && !self.paused.load(Ordering::SeqCst)
    }

    fn timeout_error(&self, what: impl Into<String>, waited: Duration) -> TestingError {
        TestingError::ClusterTimeout {
            node: self.index,
            port: self.server.port(),
            what: what.into(),
            waited,
            log_path: self.server.log_path(),
            log_tail: self.server.log_tail(),
        }
    }
}

/// A private Redis Cluster on loopback ports, for tests: masters (3 by default) sharing the
/// 16384 slots evenly, optionally with replicas.
///
/// Every node is a [`RedisServer`]-style child process with its own ports (data and cluster
/// bus, both picked below the ephemeral port range), no persistence, `cluster-node-timeout
/// 2000` and its own temporary directory. Dropping the value kills every process it started
/// (its own children only) and removes their directories.
///
/// The methods that manage the cluster are blocking and need no async runtime;
/// [`cluster_connection`](Self::cluster_connection) gives tests a redis-rs cluster client.
///
/// ```no_run
/// use distlock_testing::RedisCluster;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let mut cluster = RedisCluster::builder().replicas_per_master(1).spawn()?;
/// let mut conn = cluster.cluster_connection().await?;
/// let () = redis::cmd("SET").arg("k").arg("v").query_async(&mut conn).await?;
///
/// // Move the key's slot to another master, as a reshard would.
/// let owner = cluster.master_of_key("k")?;
/// cluster.migrate_slot(distlock_testing::key_slot(b"k"), (owner + 1) % 3)?;
///
/// // Crash a master and wait until its replica took over.
/// cluster.kill(0)?;
/// cluster.wait_for_failover(std::time::Duration::from_secs(10))?;
/// # Ok(())
/// # }
/// ```
pub struct RedisCluster {
    nodes: Vec<Node>,
    masters: usize,
    /// The CA that signed every node's certificate; `None` for a plain-TCP cluster.
    tls_ca: Option<Arc<TlsCa>>,
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("masters", &self.masters)
            .field("tls", &self.is_tls())
            .field("nodes", &self.nodes())
            .finish()
    }
}

impl RedisCluster {
    /// A builder for a cluster with more or fewer masters, replicas or extra arguments.
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder::new()
    }

    /// Starts a cluster of 3 masters without replicas and waits until it is ready; short for
    /// `RedisCluster::builder().spawn()`. See [`RedisClusterBuilder::spawn`].
    pub fn spawn() -> Result<RedisCluster, TestingError> {
        RedisClusterBuilder::new().spawn()
    }

    /// One 3-master cluster for the whole test binary, started on first call and shared by
    /// every test in the process. Give tests that kill, pause or reshard a cluster of their
    /// own.
    ///
    /// It is never dropped: on Linux it is started from a thread that lives as long as the
    /// process, with a parent-death signal, so the kernel kills its nodes when the test
    /// process exits, even after a panic or `kill -9`. Elsewhere they outlive the process;
    /// stop them by hand.
    pub fn process_wide() -> Result<&'static RedisCluster, TestingError> {
        static SHARED: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                super::server::spawn_for_the_process("cluster", || {
                    let mut builder = RedisClusterBuilder::new();
                    builder.dies_with_process = true;
                    builder.spawn()
                })
            })
            .as_ref()
            .map_err(|e| TestingError::Io(io::Error::other(format!("process-wide cluster: {e}"))))
    }

    /// Every node, masters first, with its ports, id, role and whether it runs.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        self.nodes
            .iter()
            .map(|node| {
                let pid = node.server.pid();
                ClusterNode {
                    index: node.index,
                    port: node.server.port(),
                    bus_port: node.bus_port,
                    url: node.server.url(),
                    id: node.id.clone(),
                    role: match node.replica_of {
                        None => ClusterNodeRole::Master,
                        Some(of) => ClusterNodeRole::Replica { of },
                    },
                    pid,
                    is_running: pid.is_some(),
                    is_paused: node.paused.load(Ordering::SeqCst),
                }
            })
            .collect()
    }

    /// Whether the cluster speaks TLS only; see [`RedisClusterBuilder::tls`].
    pub fn is_tls(&self) -> bool {
        self.tls_ca.is_some()
    }

    /// The PEM certificate of the authority that signed every node's certificate, for clients
    /// to trust; `None` for a plain-TCP cluster.
    pub fn ca_cert_pem(&self) -> Option<&[u8]> {
        self.tls_ca.as_deref().map(TlsCa::pem)
    }

    /// The URLs (`redis://127.0.0.1:PORT`, or `rediss://127.0.0.1:PORT` on a TLS cluster) of
    /// every running node, masters first; paused nodes are included.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|node| node.server.is_running())
            .map(|node| node.server.url())
            .collect()
    }

    /// The index of the node that owns `slot` now, according to the first node (in index
    /// order) that runs and is not paused.
    pub fn master_of_slot(&self, slot: u16) -> Result<usize, TestingError> {
        if slot >= CLUSTER_SLOTS {
            return Err(TestingError::Cluster(format!("there is no slot {slot}")));
        }
        let node = self
            .nodes
            .iter()
            .find(|node| node.answers())
            .ok_or_else(|| TestingError::Cluster("no node is running and unpaused".to_owned()))?;
        let ranges = slot_ranges(&mut node.conn()?)?;
        let port = ranges
            .iter()
            .find(|range| range.start <= slot && slot <= range.end)
            .map(|range| range.port)
            .ok_or_else(|| {
                TestingError::Cluster(format!("node {} knows no owner of slot {slot}", node.index))
            })?;
        self.index_of_port(port)
    }

    /// The index of the node that owns the slot of `key` now; see
    /// [`master_of_slot`](Self::master_of_slot) and [`key_slot`].
    pub fn master_of_key(&self, key: &str) -> Result<usize, TestingError> {
        self.master_of_slot(key_slot(key.as_bytes()))
    }

    /// Kills a node with SIGKILL, as a crash would, and reaps the process. Does nothing if it
    /// was killed already.
    ///
    /// With replicas, call [`wait_for_failover`](Self::wait_for_failover) to wait until one of
    /// them took over a killed master's slots (about 3 s).
    pub fn kill(&mut self, node: usize) -> Result<(), TestingError> {
        let total = self.nodes.len();
        let node = self
            .nodes
            .get_mut(node)
            .ok_or(TestingError::NoSuchNode { node, nodes: total })?;
        node.server.kill()?;
        node.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Freezes a node with SIGSTOP: connections stay open but nothing is answered, and it
    /// neither gossips nor votes, so after about 2 s the other nodes mark it as failing.
    ///
    /// Pausing a replica does **not** stop it from receiving what its master replicates
    /// before it is paused: writes already in its kernel socket buffer are applied when it is
    /// resumed (or, after a failover, are there on the promoted replica). To cut a replica
    /// off, kill it, or cut its link some other way.
    pub fn pause(&self, node: usize) -> Result<(), TestingError> {
        let node = self.node(node)?;
        node.server.pause()?;
        node.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Lets a paused node go on with SIGCONT.
    pub fn resume(&self, node: usize) -> Result<(), TestingError> {
        let node = self.node(node)?;
        node.server.resume()?;
        node.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Opens a blocking connection to one node (not cluster-aware: it gets `MOVED` for keys
    /// of other nodes), with connect, read and write timeouts of 5 s.
    pub fn blocking_client(&self, node: usize) -> Result<redis::Connection, TestingError> {
        self.node(node)?.conn()
    }

    /// Opens a redis-rs async cluster connection seeded with every running node (see
    /// [`urls`](Self::urls)), which follows `MOVED` and `ASK` to read and write keys wherever
    /// they live. Open it before pausing nodes: a paused node accepts connections but never
    /// answers, so the client would wait for it.
    ///
    /// On a TLS cluster it trusts [`ca_cert_pem`](Self::ca_cert_pem).
    pub async fn cluster_connection(
        &self,
    ) -> Result<redis::cluster_async::ClusterConnection, TestingError> {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.urls());
        if let Some(ca) = &self.tls_ca {
            // rustls needs a process-wide crypto provider; an error only means one is
            // installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.pem().to_vec()),
            });
        }
        Ok(builder.build()?.get_async_connection().await?)
    }

    /// Moves `slot` with its keys (and their TTLs) to the master `to`, as `redis-cli --cluster
    /// reshard` does, and waits until every running, unpaused node names `to` as its owner.
    /// Does nothing if `to` owns it already.
    ///
    /// Use [`begin_migration`](Self::begin_migration) to stop in the middle.
    pub fn migrate_slot(&self, slot: u16, to: usize) -> Result<(), TestingError> {
        if self.master_of_slot(slot)? == to {
            return Ok(());
        }
        self.begin_migration(slot, to)?.finish()
    }

    /// Starts moving `slot` to the master `to`: `CLUSTER SETSLOT slot IMPORTING` on `to`, then
    /// `MIGRATING` on the current owner. Keys are moved by the returned [`ClusterMigration`].
    ///
    /// While it is open, the owner answers `ASK` for keys it no longer has and `TRYAGAIN` for
    /// multi-key commands whose keys are split between the nodes.
    pub fn begin_migration(
        &self,
        slot: u16,
        to: usize,
    ) -> Result<ClusterMigration<'_>, TestingError> {
        let from = self.master_of_slot(slot)?;
        let dst = self.node(to)?;
        if from == to {
            return Err(TestingError::Cluster(format!(
                "node {to} owns slot {slot} already"
            )));
        }
        let src = self.node(from)?;
        let mut dst_conn = dst.conn()?;
        let mut src_conn = src.conn()?;
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&src.id)
            .exec(&mut dst_conn)?;
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&dst.id)
            .exec(&mut src_conn)?;
        Ok(ClusterMigration {
            cluster: self,
            slot,
            from,
            to,
            src_conn,
            dst_conn,
        })
    }

    /// Waits until every running, unpaused node reports `cluster_state:ok` and a `CLUSTER
    /// SLOTS` that covers all 16384 slots with running nodes only, all nodes agreeing.
    ///
    /// After [`kill`](Self::kill) of a master with replicas this returns once a replica took
    /// over its slots (about 3 s with the fixture's `cluster-node-timeout` of 2 s). Fails with
    /// [`TestingError::ClusterTimeout`] after `timeout`.
    pub fn wait_for_failover(&self, timeout: Duration) -> Result<(), TestingError> {
        self.wait_until_ok(timeout)
    }

    /// The same as [`wait_for_failover`](Self::wait_for_failover): waits until the cluster is
    /// whole again after a change.
    pub fn wait_until_ok(&self, timeout: Duration) -> Result<(), TestingError> {
        let started = Instant::now();
        let deadline = started + timeout;
        loop {
            let problem = match self.check_ok() {
                Ok(()) => return Ok(()),
                Err(problem) => problem,
            };
            if Instant::now() >= deadline {
                let (node, what) = problem;
                return Err(self.nodes[node].timeout_error(what, started.elapsed()));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// `Err((node, what))` names the first node that is not ready yet and why.
    fn check_ok(&self) -> Result<(), (usize, String)> {
        let running_ports: HashSet<u16> = self
            .nodes
            .iter()
            .filter(|node| node.server.is_running())
            .map(|node| node.server.port())
            .collect();
        let mut first_view: Option<Vec<SlotRange>> = None;
        for node in self.nodes.iter().filter(|node| node.answers()) {
            let fail = |what: String| (node.index, what);
            let mut conn = node
                .conn()
                .map_err(|e| fail(format!("did not answer: {e}")))?;
            let info = cluster_info(&mut conn).map_err(|e| fail(format!("CLUSTER INFO: {e}")))?;
            if !info.contains("cluster_state:ok") {
                return Err(fail("did not report cluster_state:ok".to_owned()));
            }
            let mut view =
                slot_ranges(&mut conn).map_err(|e| fail(format!("CLUSTER SLOTS: {e}")))?;
            view.sort_by_key(|range| range.start);
            if !covers_all_slots(&view) {
                return Err(fail("did not see all 16384 slots covered".to_owned()));
            }
            if let Some(dead) = view.iter().find(|r| !running_ports.contains(&r.port)) {
                return Err(fail(format!(
                    "still had slots {}-{} at the killed node on port {}",
                    dead.start, dead.end, dead.port
                )));
            }
            match &first_view {
                None => first_view = Some(view),
                Some(first) if *first != view => {
                    return Err(fail(
                        "did not agree with the other nodes' CLUSTER SLOTS".into(),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn node(&self, node: usize) -> Result<&Node, TestingError> {
        self.nodes.get(node).ok_or(TestingError::NoSuchNode {
            node,
            nodes: self.nodes.len(),
        })
    }

    fn index_of_port(&self, port: u16) -> Result<usize, TestingError> {
        self.nodes
            .iter()
            .position(|node| node.server.port() == port)
            .ok_or_else(|| {
                TestingError::Cluster(format!("no node of this cluster has port {port}"))
            })
    }

    /// Assigns the slots, introduces the nodes to each other, attaches the replicas and waits
    /// until the cluster is ready.
    fn form(&mut self) -> Result<(), TestingError> {
        let started = Instant::now();
        let deadline = started + FORM_TIMEOUT;
        let mut conns = Vec::with_capacity(self.nodes.len());
        for node in &mut self.nodes {
            let mut conn = node.conn()?;
            node.id = redis::cmd("CLUSTER").arg("MYID").query(&mut conn)?;
            conns.push(conn);
        }
        let masters = self.masters;
        for (index, conn) in conns.iter_mut().enumerate() {
            if index < masters {
                let (first, last) = slot_share(index, masters);
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(first)
                    .arg(last)
                    .exec(conn)?;
            }
            // Distinct epochs spare Redis its collision handling; only allowed while a node
            // knows no other node.
            redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(index + 1)
                .exec(conn)?;
        }
        if let Some(first) = conns.first_mut() {
            for node in &self.nodes[1..] {
                redis::cmd("CLUSTER")
                    .arg("MEET")
                    .arg("127.0.0.1")
                    .arg(node.server.port())
                    .arg(node.bus_port)
                    .exec(first)?;
            }
        }
        // A replica can only REPLICATE a master it knows; do it as soon as it does, so that the
        // first sync overlaps with Redis's 2 s delay before cluster_state:ok.
        for (node, conn) in self.nodes.iter().zip(conns.iter_mut()) {
            let Some(of) = node.replica_of else {
                continue;
            };
            let master_id = &self.nodes[of].id;
            loop {
                let known: String = redis::cmd("CLUSTER").arg("NODES").query(conn)?;
                if known
                    .lines()
                    .any(|line| line.starts_with(master_id.as_str()))
                {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(node.timeout_error(
                        format!("did not learn of its master (node {of})"),
                        started.elapsed(),
                    ));
                }
                std::thread::sleep(POLL_INTERVAL);
            }
            redis::cmd("CLUSTER")
                .arg("REPLICATE")
                .arg(master_id)
                .exec(conn)?;
        }
        let total = self.nodes.len();
        loop {
            let problem = self.check_formed(&mut conns, total);
            let Err((index, what)) = problem else {
                break;
            };
            if Instant::now() >= deadline || !self.nodes[index].server.is_running() {
                return Err(self.nodes[index].timeout_error(what, started.elapsed()));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        tracing::debug!(
            nodes = total,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "redis cluster formed"
        );
        Ok(())
    }

    /// `Err((node, what))` names the first node that is not ready yet and why.
    fn check_formed(
        &self,
        conns: &mut [redis::Connection],
        total: usize,
    ) -> Result<(), (usize, String)> {
        let expected: Vec<SlotRange> = (0..self.masters)
            .map(|index| {
                let (start, end) = slot_share(index, self.masters);
                SlotRange {
                    start,
                    end,
                    port: self.nodes[index].server.port(),
                }
            })
            .collect();
        for (node, conn) in self.nodes.iter().zip(conns.iter_mut()) {
            let fail = |what: String| (node.index, what);
            if !node.server.is_running() {
                return Err(fail("exited while the cluster was formed".to_owned()));
            }
            let info = cluster_info(conn).map_err(|e| fail(format!("CLUSTER INFO: {e}")))?;
            if !info.contains("cluster_state:ok") {
                return Err(fail("did not report cluster_state:ok".to_owned()));
            }
            if !info.contains(&format!("cluster_known_nodes:{total}\r")) {
                return Err(fail(format!("did not know all {total} nodes")));
            }
            if node.replica_of.is_some() {
                let replication: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(conn)
                    .map_err(|e| fail(format!("INFO replication: {e}")))?;
                if !replication.contains("master_link_status:up") {
                    return Err(fail("did not report master_link_status:up".to_owned()));
                }
            }
            let mut view = slot_ranges(conn).map_err(|e| fail(format!("CLUSTER SLOTS: {e}")))?;
            view.sort_by_key(|range| range.start);
            if view != expected {
                return Err(fail(
                    "did not see all 16384 slots at their masters in CLUSTER SLOTS".to_owned(),
                ));
            }
        }
        Ok(())
    }
}

/// The first and last slot of master `index` of `masters`.
fn slot_share(index: usize, masters: usize) -> (u16, u16) {
    let slots = usize::from(CLUSTER_SLOTS);
    let first = index * slots / masters;
    let end = (index + 1) * slots / masters;
    // Both are below 16384.
    (
        u16::try_from(first).unwrap_or(CLUSTER_SLOTS - 1),
        u16::try_from(end - 1).unwrap_or(CLUSTER_SLOTS - 1),
    )
}

/// One entry of `CLUSTER SLOTS`: a range and the port of its master.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SlotRange {
    start: u16,
    end: u16,
    port: u16,
}

fn cluster_info(conn: &mut redis::Connection) -> Result<String, TestingError> {
    Ok(redis::cmd("CLUSTER").arg("INFO").query(conn)?)
}

fn slot_ranges(conn: &mut redis::Connection) -> Result<Vec<SlotRange>, TestingError> {
    let entries: Vec<Vec<Value>> = redis::cmd("CLUSTER").arg("SLOTS").query(conn)?;
    entries
        .iter()
        .map(|entry| {
            let bad = || TestingError::Cluster(format!("unexpected CLUSTER SLOTS entry {entry:?}"));
            let int = |value: Option<&Value>| -> Result<u16, TestingError> {
                value
                    .and_then(|value| redis::from_redis_value_ref::<u16>(value).ok())
                    .ok_or_else(bad)
            };
            let master = match entry.get(2) {
                Some(Value::Array(master)) => master,
                _ => return Err(bad()),
            };
            Ok(SlotRange {
                start: int(entry.first())?,
                end: int(entry.get(1))?,
                port: int(master.get(1))?,
            })
        })
        .collect()
}

fn covers_all_slots(sorted: &[SlotRange]) -> bool {
    let mut next: u32 = 0;
    for range in sorted {
        if u32::from(range.start) != next || range.end < range.start {
            return false;
        }
        next = u32::from(range.end) + 1;
    }
    next == u32::from(CLUSTER_SLOTS)
}

/// A slot being moved between two masters, from [`RedisCluster::begin_migration`]; move keys
/// with [`migrate_keys`](Self::migrate_keys), end with [`finish`](Self::finish).
///
/// Dropping it without `finish` leaves the slot half-moved (`MIGRATING` on the old owner,
/// `IMPORTING` on the new one), as an interrupted reshard would.
pub struct ClusterMigration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    from: usize,
    to: usize,
    src_conn: redis::Connection,
    dst_conn: redis::Connection,
}

impl fmt::Debug for ClusterMigration<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterMigration")
            .field("slot", &self.slot)
            .field("from", &self.from)
            .field("to", &self.to)
            .finish()
    }
}

impl ClusterMigration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the node the slot is moved from.
    pub fn from(&self) -> usize {
        self.from
    }

    /// The index of the node the slot is moved to.
    pub fn to(&self) -> usize {
        self.to
    }

    /// Moves these keys (with their TTLs) from the old owner to the new one with one `MIGRATE`;
    /// keys the old owner does not have are skipped. The keys must be in the slot.
    pub fn migrate_keys(&mut self, keys: &[&str]) -> Result<(), TestingError> {
        if let Some(key) = keys
            .iter()
            .find(|key| key_slot(key.as_bytes()) != self.slot)
        {
            return Err(TestingError::Cluster(format!(
                "key {key:?} is not in slot {}",
                self.slot
            )));
        }
        self.migrate(keys)
    }

    fn migrate<K: redis::ToRedisArgs>(&mut self, keys: &[K]) -> Result<(), TestingError> {
        if keys.is_empty() {
            return Ok(());
        }
        let port = self.cluster.nodes[self.to].server.port();
        // Answers OK, or NOKEY if none of the keys was there.
        let _: Value = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(port)
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            .arg("KEYS")
            .arg(keys)
            .query(&mut self.src_conn)?;
        Ok(())
    }

    /// Moves every key the old owner still has in the slot, and returns how many; the slot
    /// itself stays migrating (the old owner answers `ASK` for them), until
    /// [`finish`](Self::finish).
    ///
    /// # Errors
    ///
    /// [`TestingError::Redis`] when a node refuses a command.
    pub fn migrate_remaining_keys(&mut self) -> Result<usize, TestingError> {
        let mut moved = 0;
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(MIGRATE_BATCH)
                .query(&mut self.src_conn)?;
            if keys.is_empty() {
                return Ok(moved);
            }
            moved += keys.len();
            self.migrate(&keys)?;
        }
    }

    /// Moves the keys left in the slot, assigns the slot to the new owner (`CLUSTER SETSLOT
    /// NODE` on it, then on the old owner, then on the other running, unpaused masters) and
    /// waits until every running, unpaused node names the new owner.
    pub fn finish(mut self) -> Result<(), TestingError> {
        self.migrate_remaining_keys()?;
        let cluster = self.cluster;
        let dst_id = &cluster.nodes[self.to].id;
        let setslot = |conn: &mut redis::Connection| {
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(self.slot)
                .arg("NODE")
                .arg(dst_id)
                .exec(conn)
        };
        setslot(&mut self.dst_conn)?;
        setslot(&mut self.src_conn)?;
        for node in &cluster.nodes {
            if node.index == self.from || node.index == self.to || !node.answers() {
                continue;
            }
            // Masters now, which may include promoted replicas.
            let mut conn = node.conn()?;
            let role: Value = redis::cmd("ROLE").query(&mut conn)?;
            let is_master = matches!(&role, Value::Array(parts)
                if parts.first().and_then(|p| redis::from_redis_value_ref::<String>(p).ok()).as_deref() == Some("master"));
            if is_master {
                setslot(&mut conn)?;
            }
        }
        let dst_port = cluster.nodes[self.to].server.port();
        let started = Instant::now();
        for node in cluster.nodes.iter().filter(|node| node.answers()) {
            let mut conn = node.conn()?;
            loop {
                let ranges = slot_ranges(&mut conn)?;
                let owner = ranges
                    .iter()
                    .find(|r| r.start <= self.slot && self.slot <= r.end)
                    .map(|r| r.port);
                if owner == Some(dst_port) {
                    break;
                }
                if started.elapsed() >= AGREE_TIMEOUT {
                    return Err(node.timeout_error(
                        format!(
                            "did not name node {} as owner of slot {}",
                            self.to, self.slot
                        ),
                        started.elapsed(),
                    ));
                }
                std::thread::sleep(POLL_INTERVAL);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{process_exists, TestResult};

    /// A key whose slot master `master` owns, found by trying `prefix:0`, `prefix:1`, ...
    fn key_of(cluster: &RedisCluster, master: usize, prefix: &str) -> Result<String, TestingError> {
        for n in 0..10_000 {
            let key = format!("{prefix}:{n}");
            if cluster.master_of_key(&key)? == master {
                return Ok(key);
            }
        }
        Err(TestingError::Cluster(format!("no key for node {master}")))
    }

    #[test]
    fn key_slot_follows_the_cluster_spec() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"123456789"), 0x31C3 % CLUSTER_SLOTS);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(
            key_slot(b"foo{}{bar}"),
            crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % CLUSTER_SLOTS
        );
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(slot_share(0, 3), (0, 5460));
        assert_eq!(slot_share(1, 3), (5461, 10921));
        assert_eq!(slot_share(2, 3), (10922, 16383));
        assert_eq!(slot_share(0, 1), (0, 16383));
    }

    #[tokio::test]
    async fn three_masters_cover_all_slots_and_serve_keys() -> TestResult {
        let started = Instant::now();
        let cluster = RedisCluster::spawn()?;
        println!("3-master cluster ready in {:?}", started.elapsed());
        let nodes = cluster.nodes();
        assert_eq!(nodes.len(), 3);
        assert_eq!(cluster.urls().len(), 3);
        for node in &nodes {
            assert_eq!(node.role, ClusterNodeRole::Master);
            assert!(node.is_running);
            assert_ne!(node.port, 6379);
            assert_ne!(node.bus_port, node.port + 10_000);
            assert_eq!(node.url, format!("redis://127.0.0.1:{}", node.port));
            assert_eq!(node.id.len(), 40);
            let mut conn = cluster.blocking_client(node.index)?;
            let mut view = slot_ranges(&mut conn)?;
            view.sort_by_key(|r| r.start);
            assert!(covers_all_slots(&view), "{view:?}");
            for key in [
                "foo",
                "{user1000}.following",
                "lock:42",
                "",
                "foo{}{bar}",
                "foo{{bar}}zap",
                "{a}{b}",
            ] {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query(&mut conn)?;
                assert_eq!(slot, key_slot(key.as_bytes()), "{key:?}");
            }
        }
        assert_eq!(cluster.master_of_slot(0)?, 0);
        assert_eq!(cluster.master_of_slot(5461)?, 1);
        assert_eq!(cluster.master_of_slot(16383)?, 2);
        assert!(cluster.master_of_slot(16384).is_err());
        assert!(matches!(
            cluster.blocking_client(3),
            Err(TestingError::NoSuchNode { node: 3, nodes: 3 })
        ));
        let mut conn = cluster.cluster_connection().await?;
        for master in 0..3 {
            let key = key_of(&cluster, master, "k")?;
            let () = redis::cmd("SET")
                .arg(&key)
                .arg(master)
                .query_async(&mut conn)
                .await?;
            let value: usize = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
            assert_eq!(value, master);
            // The key is on that master itself.
            let mut direct = cluster.blocking_client(master)?;
            let value: usize = redis::cmd("GET").arg(&key).query(&mut direct)?;
            assert_eq!(value, master);
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_tls_cluster_serves_keys_on_every_master() -> TestResult {
        let started = Instant::now();
        let cluster = RedisCluster::builder().tls(true).spawn()?;
        println!("3-master TLS cluster ready in {:?}", started.elapsed());
        assert!(cluster.is_tls());
        let ca = cluster.ca_cert_pem().ok_or("no CA for a TLS cluster")?;
        assert!(ca.starts_with(b"-----BEGIN CERTIFICATE-----"));
        let nodes = cluster.nodes();
        assert_eq!(nodes.len(), 3);
        for node in &nodes {
            assert_eq!(node.url, format!("rediss://127.0.0.1:{}", node.port));
            // One CA for the whole cluster.
            let server = &cluster.nodes[node.index].server;
            assert_eq!(server.ca_cert_pem(), Some(ca));
        }
        assert_eq!(
            cluster.urls(),
            nodes.iter().map(|n| n.url.clone()).collect::<Vec<_>>()
        );
        // Plain TCP is off.
        let plain = redis::Client::open(format!("redis://127.0.0.1:{}", nodes[0].port))?
            .get_connection_with_timeout(Duration::from_secs(2))
            .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn));
        assert!(plain.is_err(), "{plain:?}");
        // The bus runs over TLS.
        let mut direct = cluster.blocking_client(0)?;
        let tls_cluster: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("tls-cluster")
            .query(&mut direct)?;
        assert_eq!(tls_cluster, ["tls-cluster", "yes"]);
        let mut conn = cluster.cluster_connection().await?;
        for master in 0..3 {
            let key = key_of(&cluster, master, "tls")?;
            let () = redis::cmd("SET")
                .arg(&key)
                .arg(master)
                .query_async(&mut conn)
                .await?;
            let value: usize = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
            assert_eq!(value, master);
            let mut direct = cluster.blocking_client(master)?;
            let value: usize = redis::cmd("GET").arg(&key).query(&mut direct)?;
            assert_eq!(value, master);
        }
        // MIGRATE between TLS-only nodes: Redis opens its connection with TLS when
        // tls-cluster is on.
        let key = key_of(&cluster, 0, "tls")?;
        cluster.migrate_slot(key_slot(key.as_bytes()), 1)?;
        let mut dst = cluster.blocking_client(1)?;
        let value: usize = redis::cmd("GET").arg(&key).query(&mut dst)?;
        assert_eq!(value, 0);
        let value: usize = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
        assert_eq!(value, 0);
        Ok(())
    }

    #[test]
    fn a_tls_cluster_replicates_over_tls() -> TestResult {
        // spawn() waits for master_link_status:up on every replica.
        let cluster = RedisCluster::builder()
            .tls(true)
            .masters(2)
            .replicas_per_master(1)
            .spawn()?;
        let key = key_of(&cluster, 0, "tls-replica")?;
        let mut master = cluster.blocking_client(0)?;
        let () = redis::cmd("SET").arg(&key).arg("v").query(&mut master)?;
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut master)?;
        assert_eq!(acked, 1);
        let mut replica = cluster.blocking_client(2)?;
        let () = redis::cmd("READONLY").query(&mut replica)?;
        let value: String = redis::cmd("GET").arg(&key).query(&mut replica)?;
        assert_eq!(value, "v");
        Ok(())
    }

    #[tokio::test]
    async fn migrate_slot_moves_keys_with_their_ttl() -> TestResult {
        let cluster = RedisCluster::spawn()?;
        let key = key_of(&cluster, 0, "ttl")?;
        let slot = key_slot(key.as_bytes());
        let mut conn = cluster.cluster_connection().await?;
        let () = redis::cmd("SET")
            .arg(&key)
            .arg("v")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await?;
        let started = Instant::now();
        cluster.migrate_slot(slot, 2)?;
        println!("migrate_slot of 1 key took {:?}", started.elapsed());
        assert_eq!(cluster.master_of_slot(slot)?, 2);
        assert_eq!(cluster.master_of_key(&key)?, 2);
        let mut dst = cluster.blocking_client(2)?;
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut dst)?;
        assert!(ttl > 50_000 && ttl <= 60_000, "TTL not kept: {ttl}");
        let value: String = redis::cmd("GET").arg(&key).query(&mut dst)?;
        assert_eq!(value, "v");
        let mut src = cluster.blocking_client(0)?;
        let moved = redis::cmd("GET")
            .arg(&key)
            .query::<Option<String>>(&mut src)
            .expect_err("the old owner redirects");
        assert!(
            moved.to_string().to_uppercase().contains("MOVED"),
            "{moved}"
        );
        // The cluster client follows MOVED.
        let value: String = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
        assert_eq!(value, "v");
        // Moving to the owner is a no-op.
        cluster.migrate_slot(slot, 2)?;
        Ok(())
    }

    #[tokio::test]
    async fn a_migration_can_stop_halfway() -> TestResult {
        let cluster = RedisCluster::spawn()?;
        let first = key_of(&cluster, 1, "half")?;
        let second = format!("{{{first}}}:second");
        let slot = key_slot(first.as_bytes());
        let mut src = cluster.blocking_client(1)?;
        for key in [&first, &second] {
            let () = redis::cmd("SET").arg(key).arg("v").query(&mut src)?;
        }
        let mut migration = cluster.begin_migration(slot, 0)?;
        assert_eq!(
            (migration.slot(), migration.from(), migration.to()),
            (slot, 1, 0)
        );
        assert!(migration.migrate_keys(&["not-in-the-slot-xyz"]).is_err());
        migration.migrate_keys(&[first.as_str()])?;
        // The moved key is asked for at the new owner, the other is still served.
        let ask = redis::cmd("GET")
            .arg(&first)
            .query::<Option<String>>(&mut src)
            .expect_err("a moved key is redirected");
        assert!(ask.to_string().to_uppercase().contains("ASK"), "{ask}");
        let value: String = redis::cmd("GET").arg(&second).query(&mut src)?;
        assert_eq!(value, "v");
        assert_eq!(cluster.master_of_slot(slot)?, 1);
        migration.finish()?;
        assert_eq!(cluster.master_of_slot(slot)?, 0);
        let mut dst = cluster.blocking_client(0)?;
        for key in [&first, &second] {
            let value: String = redis::cmd("GET").arg(key).query(&mut dst)?;
            assert_eq!(value, "v");
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_replica_takes_over_a_killed_master() -> TestResult {
        let started = Instant::now();
        let mut cluster = RedisCluster::builder().replicas_per_master(1).spawn()?;
        println!("3+3 cluster ready in {:?}", started.elapsed());
        let nodes = cluster.nodes();
        assert_eq!(nodes.len(), 6);
        assert_eq!(nodes[3].role, ClusterNodeRole::Replica { of: 0 });
        assert_eq!(nodes[5].role, ClusterNodeRole::Replica { of: 2 });
        let key = key_of(&cluster, 0, "failover")?;
        let mut master = cluster.blocking_client(0)?;
        let () = redis::cmd("SET").arg(&key).arg("kept").query(&mut master)?;
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(1000).query(&mut master)?;
        assert_eq!(acked, 1);
        let pid = nodes[0].pid.ok_or("no pid")?;
        cluster.kill(0)?;
        assert!(!process_exists(pid));
        assert!(!cluster.nodes()[0].is_running);
        assert_eq!(cluster.urls().len(), 5);
        let killed = Instant::now();
        cluster.wait_for_failover(Duration::from_secs(15))?;
        println!("failover done {:?} after the kill", killed.elapsed());
        assert_eq!(cluster.master_of_key(&key)?, 3);
        assert_eq!(cluster.master_of_slot(0)?, 3);
        let mut conn = cluster.cluster_connection().await?;
        let value: String = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
        assert_eq!(value, "kept");
        Ok(())
    }

    #[test]
    fn wait_until_ok_names_the_node_that_is_not_ready() -> TestResult {
        let mut cluster = RedisCluster::spawn()?;
        let killed_port = cluster.nodes()[2].port;
        cluster.kill(2)?;
        // No replica can take over, so the cluster never becomes whole again.
        match cluster.wait_until_ok(Duration::from_millis(500)) {
            Err(err @ TestingError::ClusterTimeout { .. }) => {
                let message = err.to_string();
                assert!(message.starts_with("cluster node 0 (port "), "{message}");
                assert!(message.contains(&killed_port.to_string()), "{message}");
                let TestingError::ClusterTimeout { log_path, .. } = err else {
                    unreachable!()
                };
                assert!(log_path.is_file(), "{}", log_path.display());
            }
            other => panic!("expected ClusterTimeout, got {other:?}"),
        }
        assert!(matches!(
            cluster.kill(3),
            Err(TestingError::NoSuchNode { node: 3, nodes: 3 })
        ));
        Ok(())
    }

    #[test]
    fn drop_kills_every_node() -> TestResult {
        let cluster = RedisCluster::builder()
            .masters(2)
            .replicas_per_master(1)
            .spawn()?;
        let pids: Vec<u32> = cluster.nodes().iter().filter_map(|node| node.pid).collect();
        assert_eq!(pids.len(), 4);
        cluster.pause(3)?;
        assert!(cluster.nodes()[3].is_paused);
        drop(cluster);
        for pid in pids {
            assert!(!process_exists(pid), "pid {pid} survived the drop");
        }
        Ok(())
    }

    #[test]
    fn process_wide_is_shared() -> TestResult {
        let first = RedisCluster::process_wide()?;
        let second = RedisCluster::process_wide()?;
        assert!(std::ptr::eq(first, second));
        assert_eq!(first.nodes().len(), 3);
        first.wait_until_ok(Duration::from_secs(5))?;
        Ok(())
    }
}
