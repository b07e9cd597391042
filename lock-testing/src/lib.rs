//! Test fixtures for distlock (and any redis-rs code): private `redis-server` processes (plain,
//! TLS or with a password), Redis Cluster and Sentinel setups, PostgreSQL, and a fault-injecting
//! TCP proxy.
//!
//! Every [`RedisServer`] is its own `redis-server` child process on its own loopback port, with
//! persistence off and a private temporary directory, so tests can run in parallel and kill,
//! pause, flush or restart their server without disturbing each other (or a Redis the machine
//! may already run on port 6379). [`RedisServer::builder`] starts servers that speak TLS only
//! (with a certificate authority made for that server) or require a password. [`FaultProxy`]
//! sits between a client and a server and delays, black-holes or resets traffic, or drops
//! single replies, to simulate network faults. [`RedisCluster`] starts a private Redis Cluster
//! (3 masters by default, optionally with replicas, optionally TLS-only with one certificate
//! authority for every node) and kills, pauses or reshards it.
//! [`RedisSentinel`] starts a master with replicas watched by three Redis Sentinels, and fails
//! it over or kills its master. [`PostgresServer`] starts a private PostgreSQL (plain, or
//! TLS-only with [`PostgresServerBuilder::tls`]), and crashes, pauses or cuts the connections
//! of it; [`PostgresServer::start_standby`] adds a streaming standby to fail over to.
//!
//! Add this crate as a dev-dependency; distlock itself does not depend on it. It only works on
//! Unix, because it pauses and kills servers with signals.
//!
//! Some signatures return redis-rs types, as redis-rs's own `redis-test` does:
//! [`RedisServer::client`] gives a `redis::aio::MultiplexedConnection`, the `blocking_client`
//! methods a `redis::Connection`, and [`TestingError::Redis`] carries a `redis::RedisError`.
//! Use the redis-rs version this crate depends on (the one distlock uses) for those values to
//! fit your code's.
//!
//! ```no_run
//! use distlock_testing::{FaultMode, FaultProxy, RedisServer};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let mut server = RedisServer::spawn()?;
//! let mut conn = server.client().await?;
//! let _: () = redis::cmd("SET").arg("k").arg("v").query_async(&mut conn).await?;
//!
//! // Freeze Redis as a stalled primary would be, then let it go on.
//! server.pause()?;
//! server.resume()?;
//!
//! // Same port, empty data set.
//! server.restart()?;
//!
//! // Route a client through a proxy and cut it off from the server.
//! let proxy = FaultProxy::start(server.addr()).await?;
//! let mut through_proxy = redis::Client::open(proxy.url())?
//!     .get_multiplexed_async_connection()
//!     .await?;
//! proxy.set_mode(FaultMode::BlackHole);
//! # let _ = &mut through_proxy;
//! # Ok(())
//! # }
//! ```
//!
//! A server that only speaks TLS and wants a password; [`RedisServer::url`] carries both
//! (`rediss://:PASSWORD@127.0.0.1:PORT`), and [`RedisServer::ca_cert_pem`] is the certificate
//! authority a client must trust:
//!
//! ```no_run
//! use distlock_testing::RedisServer;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let mut server = RedisServer::builder()
//!     .tls(true)
//!     .password("s3cret")
//!     .arg("--maxmemory")
//!     .arg("10mb")
//!     .spawn()?;
//! assert!(server.url().starts_with("rediss://:s3cret@127.0.0.1:"));
//! let ca_pem: &[u8] = server.ca_cert_pem().ok_or("no CA for a TLS server")?;
//! # let _ = ca_pem;
//!
//! // client() trusts that CA and logs in.
//! let mut conn = server.client().await?;
//! let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
//! assert_eq!(pong, "PONG");
//!
//! // Same port, same certificates, same password.
//! server.restart()?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

mod cluster;
mod pgbouncer;
mod postgres;
mod proxy;
mod sentinel;
mod server;
mod tls;

pub use cluster::{
    key_slot, ClusterMigration, ClusterNode, ClusterNodeRole, RedisCluster, RedisClusterBuilder,
    CLUSTER_SLOTS,
};
pub use pgbouncer::PgBouncer;
pub use postgres::{PostgresServer, PostgresServerBuilder, Replication};
pub use proxy::{FaultMode, FaultProxy};
pub use sentinel::{DataNodeRole, RedisSentinel, RedisSentinelBuilder, SentinelDataNode};
pub use server::{RedisServer, RedisServerBuilder};

/// Errors of [`RedisServer`], [`RedisCluster`], [`RedisSentinel`] and [`PostgresServer`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestingError {
    /// No `redis-server` binary could be found.
    #[error("{}", not_found_message(.env_override.as_deref()))]
    RedisServerNotFound {
        /// The value of `REDIS_SERVER_BIN` if it was set but named no executable file; `None`
        /// when `PATH` was searched.
        env_override: Option<PathBuf>,
    },
    /// An I/O error while starting, signalling or waiting for the server.
    #[error("I/O error while managing redis-server: {0}")]
    Io(#[from] io::Error),
    /// The server did not answer `PING` in time.
    #[error(
        "redis-server on port {port} did not answer PING within {} s; last log lines:\n{}",
        server::START_TIMEOUT.as_secs(),
        or_empty(.log_tail)
    )]
    StartTimeout {
        /// The port the server was started on.
        port: u16,
        /// The last lines of the server's log and standard error.
        log_tail: String,
    },
    /// The server exited before it answered `PING` (for example because of an invalid argument).
    #[error(
        "redis-server on port {port} exited before answering PING ({status}); last log \
         lines:\n{}",
        or_empty(.log_tail)
    )]
    Exited {
        /// The port the server was started on.
        port: u16,
        /// How the process ended.
        status: ExitStatus,
        /// The last lines of the server's log and standard error.
        log_tail: String,
    },
    /// Another process holds the port, so the server could not listen on it.
    #[error(
        "port {port} is taken by another process, so redis-server could not listen on it; last \
         log lines:\n{}",
        or_empty(.log_tail)
    )]
    PortInUse {
        /// The contested port.
        port: u16,
        /// The last lines of the server's log and standard error.
        log_tail: String,
    },
    /// The operation needs a running server, but it was stopped or killed.
    #[error("redis-server is not running (stopped or killed)")]
    NotRunning,
    /// Opening a client connection failed.
    #[error("could not connect to redis-server: {0}")]
    Redis(#[from] redis::RedisError),
    /// The TLS certificates for a server could not be made.
    #[error("could not make TLS certificates for redis-server: {0}")]
    Certificate(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A node of a [`RedisCluster`] did not reach the state it was waited for in time.
    #[error(
        "cluster node {node} (port {port}) {what} (waited {} ms); log {}, last lines:\n{}",
        .waited.as_millis(),
        .log_path.display(),
        or_empty(.log_tail)
    )]
    ClusterTimeout {
        /// The index of the node, as in [`RedisCluster::nodes`].
        node: usize,
        /// The node's port.
        port: u16,
        /// What the node did not do, such as "did not report cluster_state:ok".
        what: String,
        /// How long it was waited for.
        waited: Duration,
        /// The node's log file.
        log_path: PathBuf,
        /// The last lines of the node's log and standard error.
        log_tail: String,
    },
    /// A [`RedisCluster`] method was given a node index the cluster does not have.
    #[error("the cluster has no node {node} (it has {nodes})")]
    NoSuchNode {
        /// The index asked for.
        node: usize,
        /// How many nodes the cluster has.
        nodes: usize,
    },
    /// A [`RedisCluster`] answered something unexpected, or an operation cannot be done in its
    /// current state (for example no node is left to ask).
    #[error("redis cluster: {0}")]
    Cluster(String),
    /// A process of a [`RedisSentinel`] did not reach the state it was waited for in time.
    #[error(
        "{node} (port {port}) {what} (waited {} ms); log {}, last lines:\n{}",
        .waited.as_millis(),
        .log_path.display(),
        or_empty(.log_tail)
    )]
    SentinelTimeout {
        /// Which process: `"sentinel N"` or `"data node N"` (indexes as in
        /// [`RedisSentinel::sentinel_urls`] and [`RedisSentinel::data_nodes`]).
        node: String,
        /// The process's port.
        port: u16,
        /// What it did not do, such as "did not report master_link_status:up".
        what: String,
        /// How long it was waited for.
        waited: Duration,
        /// The process's log file.
        log_path: PathBuf,
        /// The last lines of the process's log and standard error.
        log_tail: String,
    },
    /// A [`RedisSentinel`] was given a bad setting or index, answered something unexpected, or
    /// an operation cannot be done in its current state (for example no sentinel is left to
    /// ask).
    #[error("redis sentinel: {0}")]
    Sentinel(String),
    /// The PostgreSQL server binaries could not be found.
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl, psql) not found: looked in `pg_config \
         --bindir`, /usr/lib/postgresql/*/bin and PATH; install them (Debian/Ubuntu: `apt-get \
         install postgresql`, macOS: `brew install postgresql`)"
    )]
    PostgresNotFound,
    /// A [`PostgresServer`] tool (`initdb`, `pg_ctl`, `psql`) failed, with its output (and the
    /// server's log when starting), or the server is not running.
    #[error("private PostgreSQL: {0}")]
    Postgres(String),
}

const NOT_FOUND_HELP: &str = "redis-server was not found on PATH; install it (Debian/Ubuntu: \
     `apt-get install redis-server`, macOS: `brew install redis`) or set REDIS_SERVER_BIN to its \
     path";

fn not_found_message(env_override: Option<&std::path::Path>) -> String {
    match env_override {
        None => NOT_FOUND_HELP.to_owned(),
        Some(path) => format!(
            "REDIS_SERVER_BIN is set to `{}`, which is not an executable file; point it at \
             redis-server, or unset it to use redis-server from PATH (Debian/Ubuntu: \
             `apt-get install redis-server`, macOS: `brew install redis`)",
            path.display()
        ),
    }
}

fn or_empty(log_tail: &str) -> &str {
    if log_tail.trim().is_empty() {
        "(log is empty)"
    } else {
        log_tail
    }
}

/// Helpers shared by the unit tests of the fixtures.
#[cfg(test)]
mod test_support {
    use std::time::Duration;

    use redis::aio::MultiplexedConnection;
    use redis::AsyncConnectionConfig;

    pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

    pub(crate) async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
        redis::cmd("PING").query_async(conn).await
    }

    /// A connection whose own response timeout is long enough to not interfere with the
    /// (shorter or longer) deadlines the tests set.
    pub(crate) async fn patient_client(url: String) -> redis::RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        redis::Client::open(url)?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// Whether a process with this pid exists (signal 0 only checks).
    pub(crate) fn process_exists(pid: u32) -> bool {
        let Ok(pid) = i32::try_from(pid) else {
            return false;
        };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
    }
}
