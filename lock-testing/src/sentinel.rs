//! [`RedisSentinel`]: a private master with replicas, watched by Redis Sentinels, all of them
//! `redis-server` child processes.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use super::server::{RedisServer, RedisServerBuilder};
use super::TestingError;

/// How long [`RedisSentinelBuilder::spawn`] waits for the replicas to link and the sentinels to
/// agree, after the processes answer `PING`.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

/// How long [`RedisSentinel::failover`] waits. Sentinel turns the old master into a replica
/// only some 8 to 18 s after the switch (it waits 8 s after the role change it sees in `INFO`,
/// which it asks replicas for every 10 s).
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(40);

/// `sentinel down-after-milliseconds`: a killed master is subjectively down after 1 s.
const DOWN_AFTER_MS: u32 = 1_000;

/// `sentinel failover-timeout`: kept short so that a failed election is retried soon.
const SENTINEL_FAILOVER_TIMEOUT_MS: u32 = 5_000;

const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Configures and starts a [`RedisSentinel`]: how many replicas and sentinels, the master's
/// name, extra `redis-server` arguments for the data nodes.
///
/// ```no_run
/// use distlock_testing::RedisSentinel;
///
/// # fn example() -> Result<(), distlock_testing::TestingError> {
/// let sentinel = RedisSentinel::builder()
///     .replicas(2)
///     .master_name("locks")
///     .spawn()?;
/// assert_eq!(sentinel.data_nodes().len(), 3);
/// assert_eq!(sentinel.sentinel_urls().len(), 3);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until spawn() is called"]
pub struct RedisSentinelBuilder {
    replicas: usize,
    sentinels: usize,
    master_name: String,
    args: Vec<String>,
}

impl Default for RedisSentinelBuilder {
    fn default() -> RedisSentinelBuilder {
        RedisSentinelBuilder {
            replicas: 1,
            sentinels: 3,
            master_name: "distlock".to_owned(),
            args: Vec::new(),
        }
    }
}

impl RedisSentinelBuilder {
    /// A builder for one master, one replica and three sentinels watching the master as
    /// `distlock`; the same as [`RedisSentinel::builder`].
    pub fn new() -> RedisSentinelBuilder {
        RedisSentinelBuilder::default()
    }

    /// The number of replicas of the master (default 1). Sentinel can only fail over to a
    /// replica, so tests that fail over want at least one.
    pub fn replicas(mut self, replicas: usize) -> RedisSentinelBuilder {
        self.replicas = replicas;
        self
    }

    /// The number of sentinels (default 3, at least 1). The quorum is a majority of them (2 of
    /// 3), and a majority must also elect the sentinel that runs a failover.
    pub fn sentinels(mut self, sentinels: usize) -> RedisSentinelBuilder {
        self.sentinels = sentinels;
        self
    }

    /// The name the sentinels know the master by (default `"distlock"`): the name clients pass
    /// to `SENTINEL GET-MASTER-ADDR-BY-NAME`. It must be non-empty and have no whitespace.
    pub fn master_name(mut self, name: impl Into<String>) -> RedisSentinelBuilder {
        self.master_name = name.into();
        self
    }

    /// Adds one `redis-server` argument for every data node (master and replicas, not the
    /// sentinels), such as `"--maxmemory"` or `"10mb"`.
    ///
    /// Extra arguments come after the defaults, so they override them; do not override the
    /// port, `--bind`, `--dir`, `--logfile` or `--replicaof`.
    pub fn arg(mut self, arg: impl Into<String>) -> RedisSentinelBuilder {
        self.args.push(arg.into());
        self
    }

    /// Adds several `redis-server` arguments for every data node; see [`arg`](Self::arg).
    pub fn args<I, S>(mut self, args: I) -> RedisSentinelBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the master, the replicas and the sentinels, and waits until they are ready.
    ///
    /// Ready means: every replica reports `master_link_status:up`, and every sentinel names
    /// the master, reports it with flags `master` only (not down, no failover), knows every
    /// replica (each with flags `slave` and its link up) and every other sentinel. This takes
    /// about 2 s (sentinels find each other through hello messages sent every 2 s). Fails
    /// after 20 s with an error naming the process that was not ready and the end of its log.
    pub fn spawn(&self) -> Result<RedisSentinel, TestingError> {
        if self.sentinels == 0 {
            return Err(TestingError::Sentinel(
                "a sentinel deployment needs at least 1 sentinel".to_owned(),
            ));
        }
        if self.master_name.is_empty() || self.master_name.chars().any(char::is_whitespace) {
            return Err(TestingError::Sentinel(format!(
                "the master name must be non-empty and without whitespace, not {:?}",
                self.master_name
            )));
        }
        let started = Instant::now();
        let master = self.data_builder().spawn()?;
        let master_port = master.port();
        let mut data = vec![master];
        for _ in 0..self.replicas {
            data.push(
                self.data_builder()
                    .arg("--replicaof")
                    .arg("127.0.0.1")
                    .arg(master_port.to_string())
                    .spawn()?,
            );
        }
        let mut deployment = RedisSentinel {
            sentinels: Vec::with_capacity(self.sentinels),
            data,
            master_name: self.master_name.clone(),
        };
        // Linked replicas are in the master's first INFO reply to each sentinel, so the
        // sentinels know them at once. On failure `deployment` is dropped, which kills what
        // was started so far.
        deployment.wait_until(started + FORM_TIMEOUT, |d| d.check_replicas_linked(0))?;
        let quorum = self.sentinels / 2 + 1;
        let name = &self.master_name;
        let directives = format!(
            "sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {name} {SENTINEL_FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {name} 1"
        );
        for _ in 0..self.sentinels {
            let sentinel = RedisServerBuilder::new()
                .sentinel(directives.clone())
                .spawn()?;
            deployment.sentinels.push(sentinel);
        }
        deployment.wait_until(started + FORM_TIMEOUT, |d| d.check_sentinels_agree(0))?;
        tracing::debug!(
            replicas = self.replicas,
            sentinels = self.sentinels,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "redis sentinel deployment ready"
        );
        Ok(deployment)
    }

    fn data_builder(&self) -> RedisServerBuilder {
        RedisServerBuilder::new()
            // The default 5 s delay before a diskless sync would make replicas slow to link.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(self.args.iter().cloned())
    }
}

/// The replication role a data node of a [`RedisSentinel`] reports now (`INFO replication`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataNodeRole {
    /// `role:master`.
    Master,
    /// `role:slave`.
    Replica {
        /// The index of the data node it replicates from, or `None` if its master is not one
        /// of the deployment's nodes.
        of: Option<usize>,
        /// Whether it reports `master_link_status:up`.
        link_up: bool,
    },
}

/// What [`RedisSentinel::data_nodes`] tells about one data node (the master or a replica).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentinelDataNode {
    /// The node's index: 0 was the master at spawn time, the replicas follow.
    pub index: usize,
    /// The node's port on 127.0.0.1.
    pub port: u16,
    /// `redis://127.0.0.1:PORT`.
    pub url: String,
    /// The process id, or `None` once the node was killed.
    pub pid: Option<u32>,
    /// Whether the process is alive.
    pub is_running: bool,
    /// The role the node reports now; `None` if it is not running or did not answer.
    pub role: Option<DataNodeRole>,
}

/// Which process a readiness check blames.
#[derive(Clone, Copy, Debug)]
enum Blame {
    Data(usize),
    Sentinel(usize),
}

/// A private Redis Sentinel deployment on loopback ports, for tests: one master, its replicas
/// (1 by default) and sentinels (3 by default, quorum 2) watching it.
///
/// Every process is a [`RedisServer`] with its own port, no persistence and its own temporary
/// directory; each sentinel has its own `sentinel.conf` there, which it rewrites. The sentinels
/// declare the master down after 1 s (`down-after-milliseconds 1000`) and use a
/// `failover-timeout` of 5 s, so a killed master is replaced within a few seconds. Dropping the
/// value kills every process it started (its own children only) and removes their directories.
///
/// The methods are blocking and need no async runtime, so they work in plain `#[test]`s as well
/// as inside `#[tokio::test]`s.
///
/// ```no_run
/// use std::time::Duration;
/// use distlock_testing::RedisSentinel;
///
/// # fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let mut sentinel = RedisSentinel::spawn()?;
/// let client = redis::Client::open(sentinel.master_url()?)?;
/// # let _ = client;
///
/// // A planned switch: the replica becomes master, the old master its replica.
/// sentinel.failover()?;
///
/// // A crash: wait until the sentinels promote a replica.
/// let old = sentinel.kill_master()?;
/// let new = sentinel.wait_for_new_master(old, Duration::from_secs(10))?;
/// assert_ne!(old, new);
/// # Ok(())
/// # }
/// ```
pub struct RedisSentinel {
    sentinels: Vec<RedisServer>,
    /// The master at spawn time first, then the replicas.
    data: Vec<RedisServer>,
    master_name: String,
}

impl fmt::Debug for RedisSentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSentinel")
            .field("master_name", &self.master_name)
            .field("data", &self.data)
            .field("sentinels", &self.sentinels)
            .finish()
    }
}

impl RedisSentinel {
    /// A builder for more replicas or sentinels, another master name or extra arguments.
    pub fn builder() -> RedisSentinelBuilder {
        RedisSentinelBuilder::new()
    }

    /// Starts one master, one replica and three sentinels and waits until they are ready; short
    /// for `RedisSentinel::builder().spawn()`. See [`RedisSentinelBuilder::spawn`].
    pub fn spawn() -> Result<RedisSentinel, TestingError> {
        RedisSentinelBuilder::new().spawn()
    }

    /// The name the sentinels know the master by.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The URLs (`redis://127.0.0.1:PORT`) of the sentinels that run, in index order.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .filter(|sentinel| sentinel.is_running())
            .map(RedisServer::url)
            .collect()
    }

    /// The URL of the current master (`redis://IP:PORT`), as the first running sentinel that
    /// answers names it (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    ///
    /// Right after a failover sentinels may disagree for a moment;
    /// [`failover`](Self::failover) and [`wait_for_new_master`](Self::wait_for_new_master)
    /// return only once all of them agree.
    pub fn master_url(&self) -> Result<String, TestingError> {
        let (ip, port) = self.ask_sentinels(|conn| self.master_addr(conn))?;
        Ok(format!("redis://{ip}:{port}"))
    }

    /// Every data node, the master at spawn time first, with its port, pid and the role it
    /// reports now.
    pub fn data_nodes(&self) -> Vec<SentinelDataNode> {
        self.data
            .iter()
            .enumerate()
            .map(|(index, server)| {
                let pid = server.pid();
                let role = pid
                    .and_then(|_| self.replication(index).ok())
                    .and_then(|info| self.role_of(&info));
                SentinelDataNode {
                    index,
                    port: server.port(),
                    url: server.url(),
                    pid,
                    is_running: pid.is_some(),
                    role,
                }
            })
            .collect()
    }

    /// Asks a sentinel for a planned failover (`SENTINEL FAILOVER <name>`) and waits until it
    /// is complete: every running sentinel names another node as master, that node reports
    /// `role:master`, and the old master reports itself a replica of it with its link up.
    ///
    /// Sentinel promotes the replica within about a second, but turns the old master into a
    /// replica only 8 to 18 s later, so this takes 10 to 20 s. If the sentinels refuse because
    /// no replica is promotable yet (`NOGOODSLAVE`, as for a second failover right after one,
    /// until they have seen the old master replicate) or another failover runs (`INPROG`), the
    /// request is repeated. Fails after 40 s with an error naming the node that was not there
    /// yet, or the sentinels' refusal.
    pub fn failover(&self) -> Result<(), TestingError> {
        let started = Instant::now();
        let deadline = started + FAILOVER_TIMEOUT;
        let old = loop {
            let old = self.current_master()?;
            // Command errors are answers; only a sentinel that cannot be reached is skipped.
            let refused = self.ask_sentinels(|conn| {
                Ok(redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg(&self.master_name)
                    .exec(conn)
                    .err())
            })?;
            let Some(refused) = refused else {
                break old;
            };
            // NOGOODSLAVE: no replica the sentinels consider promotable yet (such as the old
            // master of a failover a moment ago, until they see it replicate); INPROG: another
            // failover runs. Both pass.
            let passing = matches!(refused.code(), Some("NOGOODSLAVE" | "INPROG"));
            if !passing || Instant::now() >= deadline {
                return Err(TestingError::Sentinel(format!(
                    "SENTINEL FAILOVER {} was refused (after {} ms): {refused}",
                    self.master_name,
                    started.elapsed().as_millis()
                )));
            }
            std::thread::sleep(POLL_INTERVAL);
        };
        let new = self.wait_until(deadline, |d| d.check_new_master(old))?;
        self.wait_until(deadline, |d| {
            d.check_replica_of(old, new)?;
            d.check_new_master(old).map(drop)
        })?;
        tracing::debug!(
            old,
            new,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "sentinel failover complete"
        );
        Ok(())
    }

    /// Kills the current master (as the sentinels name it) with SIGKILL, as a crash would, and
    /// returns its index in [`data_nodes`](Self::data_nodes). Then call
    /// [`wait_for_new_master`](Self::wait_for_new_master).
    ///
    /// Fails with [`TestingError::Sentinel`] if the node the sentinels name is not running (it
    /// was killed already and no replica took over yet).
    pub fn kill_master(&mut self) -> Result<usize, TestingError> {
        let master = self.current_master()?;
        if !self.data[master].is_running() {
            return Err(TestingError::Sentinel(format!(
                "the sentinels still name data node {master} as master, which is not running \
                 (killed already); wait_for_new_master first"
            )));
        }
        self.data[master].kill()?;
        Ok(master)
    }

    /// Starts data node `node` again after [`kill_master`](Self::kill_master), on its port and
    /// with its arguments, empty (nothing is persisted): the sentinels then find the old
    /// master back and turn it into a replica of the new one (a demoted master that comes
    /// back). Does nothing to a node that runs.
    pub fn restart_data_node(&mut self, node: usize) -> Result<(), TestingError> {
        let Some(server) = self.data.get_mut(node) else {
            return Err(TestingError::Sentinel(format!("no data node {node}")));
        };
        if server.is_running() {
            return Ok(());
        }
        server.start()
    }

    /// Waits until every running sentinel names the same running node other than `old` as
    /// master and that node reports `role:master`; returns its index. After
    /// [`kill_master`](Self::kill_master) this takes about 2 to 4 s (1 s until the master is
    /// declared down, then an election and the promotion). Other replicas are pointed at the
    /// new master by the sentinels right after; this does not wait for that. Fails with
    /// [`TestingError::SentinelTimeout`] after `timeout`.
    pub fn wait_for_new_master(
        &self,
        old: usize,
        timeout: Duration,
    ) -> Result<usize, TestingError> {
        self.wait_until(Instant::now() + timeout, |d| d.check_new_master(old))
    }

    /// Opens a blocking connection to one data node, with connect, read and write timeouts of
    /// 5 s.
    pub fn blocking_client(&self, node: usize) -> Result<redis::Connection, TestingError> {
        self.data_node(node)?.blocking_client()
    }

    fn data_node(&self, node: usize) -> Result<&RedisServer, TestingError> {
        self.data.get(node).ok_or_else(|| {
            TestingError::Sentinel(format!(
                "there is no data node {node} (there are {})",
                self.data.len()
            ))
        })
    }

    /// The index of the master the first sentinel that answers names.
    fn current_master(&self) -> Result<usize, TestingError> {
        let (_, port) = self.ask_sentinels(|conn| self.master_addr(conn))?;
        self.index_of_port(port).ok_or_else(|| {
            TestingError::Sentinel(format!(
                "the sentinels name 127.0.0.1:{port} as master, which is no data node of this \
                 deployment"
            ))
        })
    }

    /// Runs `ask` on the running sentinels in index order until one succeeds.
    fn ask_sentinels<T>(
        &self,
        mut ask: impl FnMut(&mut redis::Connection) -> Result<T, TestingError>,
    ) -> Result<T, TestingError> {
        let mut last = None;
        for (index, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_running() {
                continue;
            }
            match sentinel
                .blocking_client()
                .and_then(|mut conn| ask(&mut conn))
            {
                Ok(answer) => return Ok(answer),
                Err(err) => last = Some(format!("sentinel {index}: {err}")),
            }
        }
        Err(TestingError::Sentinel(match last {
            Some(last) => format!("no sentinel answered; last error from {last}"),
            None => "no sentinel is running".to_owned(),
        }))
    }

    fn master_addr(&self, conn: &mut redis::Connection) -> Result<(String, u16), TestingError> {
        let addr: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master_name)
            .query(conn)?;
        let (ip, port) = addr.ok_or_else(|| {
            TestingError::Sentinel(format!(
                "the sentinel knows no master {:?}",
                self.master_name
            ))
        })?;
        let port = port
            .parse()
            .map_err(|_| TestingError::Sentinel(format!("the sentinel named port {port:?}")))?;
        Ok((ip, port))
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.data.iter().position(|server| server.port() == port)
    }

    /// `INFO replication` of a data node, as a map.
    fn replication(&self, node: usize) -> Result<HashMap<String, String>, TestingError> {
        let mut conn = self.data_node(node)?.blocking_client()?;
        let info: String = redis::cmd("INFO").arg("replication").query(&mut conn)?;
        Ok(info_fields(&info))
    }

    fn role_of(&self, info: &HashMap<String, String>) -> Option<DataNodeRole> {
        match info.get("role").map(String::as_str) {
            Some("master") => Some(DataNodeRole::Master),
            Some("slave") => Some(DataNodeRole::Replica {
                of: info
                    .get("master_port")
                    .and_then(|port| port.parse().ok())
                    .and_then(|port| self.index_of_port(port)),
                link_up: info.get("master_link_status").map(String::as_str) == Some("up"),
            }),
            _ => None,
        }
    }

    /// Polls `check` until it succeeds or `deadline` passes; on timeout the error names the
    /// process the last check blamed.
    fn wait_until<T>(
        &self,
        deadline: Instant,
        mut check: impl FnMut(&Self) -> Result<T, (Blame, String)>,
    ) -> Result<T, TestingError> {
        let started = Instant::now();
        loop {
            let (blame, what) = match check(self) {
                Ok(done) => return Ok(done),
                Err(problem) => problem,
            };
            if Instant::now() >= deadline {
                return Err(self.timeout_error(blame, what, started.elapsed()));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn timeout_error(&self, blame: Blame, what: String, waited: Duration) -> TestingError {
        let (node, server) = match blame {
            Blame::Data(index) => (format!("data node {index}"), &self.data[index]),
            Blame::Sentinel(index) => (format!("sentinel {index}"), &self.sentinels[index]),
        };
        TestingError::SentinelTimeout {
            node,
            port: server.port(),
            what,
            waited,
            log_path: server.log_path(),
            log_tail: server.log_tail(),
        }
    }

    /// Every running data node but `master` reports `master_link_status:up` to `master`.
    fn check_replicas_linked(&self, master: usize) -> Result<(), (Blame, String)> {
        for index in 0..self.data.len() {
            if index != master && self.data[index].is_running() {
                self.check_replica_of(index, master)?;
            }
        }
        Ok(())
    }

    /// Data node `replica` reports itself a replica of `master` with its link up.
    fn check_replica_of(&self, replica: usize, master: usize) -> Result<(), (Blame, String)> {
        let fail = |what: String| (Blame::Data(replica), what);
        if !self.data[replica].is_running() {
            return Err(fail("is not running".to_owned()));
        }
        let info = self
            .replication(replica)
            .map_err(|e| fail(format!("INFO replication: {e}")))?;
        match self.role_of(&info) {
            Some(DataNodeRole::Replica { of, link_up: true }) if of == Some(master) => Ok(()),
            role => Err(fail(format!(
                "did not report itself a replica of data node {master} with \
                 master_link_status:up (role now {role:?})"
            ))),
        }
    }

    /// Every running sentinel names `master` with flags `master` only, knows every running
    /// replica (flags `slave`, link ok) and every other running sentinel.
    fn check_sentinels_agree(&self, master: usize) -> Result<(), (Blame, String)> {
        let master_port = self.data[master].port();
        let replicas: Vec<u16> = self
            .data
            .iter()
            .enumerate()
            .filter(|(index, server)| *index != master && server.is_running())
            .map(|(_, server)| server.port())
            .collect();
        let other_sentinels = self
            .sentinels
            .iter()
            .filter(|sentinel| sentinel.is_running())
            .count()
            .saturating_sub(1);
        for (index, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_running() {
                continue;
            }
            let fail = |what: String| (Blame::Sentinel(index), what);
            let mut conn = sentinel
                .blocking_client()
                .map_err(|e| fail(format!("did not answer: {e}")))?;
            let fields: Vec<String> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.master_name)
                .query(&mut conn)
                .map_err(|e| fail(format!("SENTINEL MASTER: {e}")))?;
            let fields = pairs(fields);
            let field = |name: &str| fields.get(name).map(String::as_str).unwrap_or("");
            if field("port") != master_port.to_string() {
                return Err(fail(format!(
                    "named port {} as master, not data node {master} (port {master_port})",
                    field("port")
                )));
            }
            if field("flags") != "master" {
                return Err(fail(format!(
                    "reported the master with flags {:?}, not \"master\"",
                    field("flags")
                )));
            }
            if field("num-other-sentinels") != other_sentinels.to_string() {
                return Err(fail(format!(
                    "knew {} other sentinels, not {other_sentinels}",
                    field("num-other-sentinels")
                )));
            }
            let known: Vec<Vec<String>> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(&self.master_name)
                .query(&mut conn)
                .map_err(|e| fail(format!("SENTINEL REPLICAS: {e}")))?;
            for port in &replicas {
                let replica = known
                    .iter()
                    .map(|fields| pairs(fields.clone()))
                    .find(|fields| fields.get("port") == Some(&port.to_string()));
                let healthy = replica.as_ref().is_some_and(|fields| {
                    fields.get("flags").map(String::as_str) == Some("slave")
                        && fields.get("master-link-status").map(String::as_str) == Some("ok")
                        && fields.get("master-port") == Some(&master_port.to_string())
                });
                if !healthy {
                    return Err(fail(format!(
                        "did not know the replica on port {port} as a healthy replica of the \
                         master ({:?})",
                        replica
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every running sentinel names the same running data node other than `old`, and that node
    /// reports `role:master`; gives its index.
    fn check_new_master(&self, old: usize) -> Result<usize, (Blame, String)> {
        let mut named: Option<usize> = None;
        for (index, sentinel) in self.sentinels.iter().enumerate() {
            if !sentinel.is_running() {
                continue;
            }
            let fail = |what: String| (Blame::Sentinel(index), what);
            let mut conn = sentinel
                .blocking_client()
                .map_err(|e| fail(format!("did not answer: {e}")))?;
            let (_, port) = self
                .master_addr(&mut conn)
                .map_err(|e| fail(format!("GET-MASTER-ADDR-BY-NAME: {e}")))?;
            let Some(node) = self.index_of_port(port) else {
                return Err(fail(format!("named port {port}, which is no data node")));
            };
            if node == old {
                return Err(fail(format!("still named the old master, data node {old}")));
            }
            if !self.data[node].is_running() {
                return Err(fail(format!(
                    "named data node {node}, which is not running"
                )));
            }
            match named {
                Some(first) if first != node => {
                    return Err(fail(format!(
                        "named data node {node}, another sentinel named data node {first}"
                    )))
                }
                _ => named = Some(node),
            }
        }
        let Some(node) = named else {
            return Err((Blame::Data(old), "no sentinel is running".to_owned()));
        };
        let info = self
            .replication(node)
            .map_err(|e| (Blame::Data(node), format!("INFO replication: {e}")))?;
        if self.role_of(&info) != Some(DataNodeRole::Master) {
            return Err((
                Blame::Data(node),
                "is named master by the sentinels but did not report role:master".to_owned(),
            ));
        }
        Ok(node)
    }
}

/// `field:value` lines of an `INFO` reply.
fn info_fields(info: &str) -> HashMap<String, String> {
    info.lines()
        .filter_map(|line| line.trim_end().split_once(':'))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

/// A flat `[name, value, name, value, ...]` reply as a map.
fn pairs(flat: Vec<String>) -> HashMap<String, String> {
    let mut map = HashMap::with_capacity(flat.len() / 2);
    let mut items = flat.into_iter();
    while let (Some(name), Some(value)) = (items.next(), items.next()) {
        map.insert(name, value);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{process_exists, TestResult};

    fn port_of(url: &str) -> Result<u16, Box<dyn std::error::Error>> {
        Ok(url.rsplit(':').next().ok_or("no port")?.parse()?)
    }

    fn role(conn: &mut redis::Connection) -> Result<String, redis::RedisError> {
        let info: String = redis::cmd("INFO").arg("replication").query(conn)?;
        Ok(info_fields(&info).remove("role").unwrap_or_default())
    }

    #[test]
    fn spawn_replicates_writes_at_the_master() -> TestResult {
        let started = Instant::now();
        let sentinel = RedisSentinel::spawn()?;
        println!(
            "1 master + 1 replica + 3 sentinels ready in {:?}",
            started.elapsed()
        );
        assert_eq!(sentinel.master_name(), "distlock");
        let urls = sentinel.sentinel_urls();
        assert_eq!(urls.len(), 3);
        for url in &urls {
            assert_ne!(port_of(url)?, 6379);
        }
        let nodes = sentinel.data_nodes();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].role, Some(DataNodeRole::Master));
        assert_eq!(
            nodes[1].role,
            Some(DataNodeRole::Replica {
                of: Some(0),
                link_up: true
            })
        );
        let master_url = sentinel.master_url()?;
        assert_eq!(master_url, nodes[0].url);
        let mut master = redis::Client::open(master_url)?.get_connection()?;
        assert_eq!(role(&mut master)?, "master");
        let () = redis::cmd("SET").arg("k").arg("v").query(&mut master)?;
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut master)?;
        assert_eq!(acked, 1);
        let mut replica = sentinel.blocking_client(1)?;
        let value: String = redis::cmd("GET").arg("k").query(&mut replica)?;
        assert_eq!(value, "v");
        assert!(matches!(
            sentinel.blocking_client(2),
            Err(TestingError::Sentinel(_))
        ));
        Ok(())
    }

    #[tokio::test]
    async fn failover_swaps_master_and_replica_and_keeps_the_data() -> TestResult {
        let sentinel = RedisSentinel::spawn()?;
        let mut master = sentinel.blocking_client(0)?;
        let () = redis::cmd("SET").arg("kept").arg("1").query(&mut master)?;
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut master)?;
        assert_eq!(acked, 1);
        let started = Instant::now();
        sentinel.failover()?;
        println!("failover() took {:?}", started.elapsed());
        let nodes = sentinel.data_nodes();
        assert_eq!(nodes[1].role, Some(DataNodeRole::Master));
        assert_eq!(
            nodes[0].role,
            Some(DataNodeRole::Replica {
                of: Some(1),
                link_up: true
            })
        );
        assert_eq!(sentinel.master_url()?, nodes[1].url);
        let mut new_master = redis::Client::open(sentinel.master_url()?)?.get_connection()?;
        let value: String = redis::cmd("GET").arg("kept").query(&mut new_master)?;
        assert_eq!(value, "1");
        // The old master now refuses writes.
        let mut old = sentinel.blocking_client(0)?;
        let refused = redis::cmd("SET")
            .arg("x")
            .arg("y")
            .exec(&mut old)
            .expect_err("a replica refuses writes");
        assert_eq!(refused.code(), Some("READONLY"), "{refused}");
        // And back, right away.
        let started = Instant::now();
        sentinel.failover()?;
        println!("second failover() took {:?}", started.elapsed());
        assert_eq!(sentinel.master_url()?, sentinel.data_nodes()[0].url);
        let mut master = sentinel.blocking_client(0)?;
        let value: String = redis::cmd("GET").arg("kept").query(&mut master)?;
        assert_eq!(value, "1");
        Ok(())
    }

    #[test]
    fn a_replica_takes_over_a_killed_master() -> TestResult {
        let mut sentinel = RedisSentinel::spawn()?;
        let mut master = sentinel.blocking_client(0)?;
        let () = redis::cmd("SET").arg("kept").arg("1").query(&mut master)?;
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut master)?;
        assert_eq!(acked, 1);
        let pid = sentinel.data_nodes()[0].pid.ok_or("no pid")?;
        let old = sentinel.kill_master()?;
        assert_eq!(old, 0);
        assert!(!process_exists(pid));
        assert!(!sentinel.data_nodes()[0].is_running);
        assert_eq!(sentinel.data_nodes()[0].role, None);
        let killed = Instant::now();
        let new = sentinel.wait_for_new_master(old, Duration::from_secs(10))?;
        println!("new master {:?} after the kill", killed.elapsed());
        assert_eq!(new, 1);
        assert_eq!(sentinel.master_url()?, sentinel.data_nodes()[1].url);
        let mut conn = sentinel.blocking_client(new)?;
        assert_eq!(role(&mut conn)?, "master");
        let value: String = redis::cmd("GET").arg("kept").query(&mut conn)?;
        assert_eq!(value, "1");
        let () = redis::cmd("SET").arg("after").arg("2").query(&mut conn)?;
        Ok(())
    }

    #[test]
    fn wait_for_new_master_names_the_process_that_is_not_ready() -> TestResult {
        // Without a replica nobody can take over.
        let mut sentinel = RedisSentinel::builder().replicas(0).spawn()?;
        let old = sentinel.kill_master()?;
        assert!(matches!(
            sentinel.kill_master(),
            Err(TestingError::Sentinel(message)) if message.contains("not running")
        ));
        match sentinel.wait_for_new_master(old, Duration::from_millis(300)) {
            Err(err @ TestingError::SentinelTimeout { .. }) => {
                let message = err.to_string();
                assert!(message.starts_with("sentinel 0 (port "), "{message}");
                assert!(message.contains("still named the old master"), "{message}");
                let TestingError::SentinelTimeout { log_path, .. } = err else {
                    unreachable!()
                };
                assert!(log_path.is_file(), "{}", log_path.display());
            }
            other => panic!("expected SentinelTimeout, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn builder_rejects_bad_settings() {
        for builder in [
            RedisSentinel::builder().sentinels(0),
            RedisSentinel::builder().master_name(""),
            RedisSentinel::builder().master_name("two words"),
        ] {
            assert!(
                matches!(builder.spawn(), Err(TestingError::Sentinel(_))),
                "{builder:?}"
            );
        }
    }

    #[test]
    fn drop_kills_every_process() -> TestResult {
        let sentinel = RedisSentinel::builder()
            .replicas(2)
            .master_name("other")
            .arg("--maxmemory")
            .arg("10mb")
            .spawn()?;
        assert_eq!(sentinel.master_name(), "other");
        let mut pids: Vec<u32> = sentinel
            .data_nodes()
            .iter()
            .filter_map(|node| node.pid)
            .collect();
        pids.extend(sentinel.sentinels.iter().filter_map(RedisServer::pid));
        assert_eq!(pids.len(), 6);
        let mut replica = sentinel.blocking_client(2)?;
        let maxmemory: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory")
            .query(&mut replica)?;
        assert_eq!(maxmemory, ["maxmemory", "10485760"]);
        drop(sentinel);
        for pid in pids {
            assert!(!process_exists(pid), "pid {pid} survived the drop");
        }
        Ok(())
    }
}
