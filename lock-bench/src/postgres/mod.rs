//! The PostgreSQL pass (`--backend postgres`): floors by hand on tokio-postgres and
//! sqlx's `PgAdvisoryLock` (the peer a Rust user picks today), on a private
//! PostgreSQL the bench starts itself (fsync on, the data directory on the disk
//! under the target directory, a free port: never the shared 5432).
//!
//! * **advisory floor**: `pg_try_advisory_lock` + `pg_advisory_unlock`, prepared,
//!   on one connection: two statements and no commit's WAL flush, the least a lock
//!   on PostgreSQL can cost (no lease, no token, no wake-up; held by the session).
//! * **lease-row floor**: distlock's protocol by hand ([`lease::LeaseSql`]): an
//!   upsert that takes a free or expired row and returns a token from a sequence,
//!   then an update that frees it: two commits, each a WAL flush.
//! * **NOTIFY hand-off floor**: clients on the lease row, strictly alternating; the
//!   holder frees the row and notifies the next client's channel in one statement,
//!   the next client (its own task and LISTEN connection, parked) takes the row
//!   with its own statement.
//! * **sqlx `PgAdvisoryLock`**: `acquire` (a blocking `pg_advisory_lock`) and
//!   `release_now` per cycle, on its own `PgConnection`.
//! * **distlock**: `LockManager::builder("postgres://...")` (the `postgres`
//!   feature), acquire + release per cycle; in `many-keys` 16 tasks on one
//!   manager, in `handoff` one task per manager; in `renewal` its own renewal
//!   task's batches, timed inside the task (`LockManager::take_renewal_batches`,
//!   distlock's `testing` feature); in `shared` read-write locks and semaphores
//!   against their own SQL by hand.
//!
//! The server is `distlock_testing::PostgresServer` (`initdb` + `pg_ctl` on a free
//! port). Its data directory is under `TMPDIR`, which `main` points at
//! `<target dir>/tmp`, so that commits flush to the real disk: a tmpfs `/tmp`
//! would make the WAL flush, most of a lease-row cycle, free. The first line of
//! the output, every table's notes and the results files (`server_version`,
//! `server_settings`) give the version, `synchronous_commit`, `fsync`,
//! `wal_sync_method` and where the data directory is.
//!
//! What bounds the figures: a lease-row cycle is two commits, and with
//! `synchronous_commit = on` each waits for its WAL flush (`fdatasync` of the WAL
//! segment). On a VM's disk that flush is most of the cycle and moves with the
//! disk's other traffic (other builds on the machine), so only ratios of one run
//! compare, with the advisory floor (no flush) read beside them. With many
//! connections PostgreSQL's group commit flushes several commits at once, so
//! `many-keys` cycles/s grows with the connections; one pipelined connection gets
//! no group commit. Relaxing durability (`synchronous_commit = off`, unlogged
//! tables) removes the flush, and with it what a crash keeps: a grant a client
//! saw, and a sequence's advance (tokens) unless a restart moves the sequence past
//! every token issued.
//!
//! `rt/op` (`uncontended`) and `rt/batch` (`renewal`) are counted in a pass of
//! their own through [`proxy`], never in the timed cycles, and only for rows where
//! one client waits for its answers.

pub mod handoff;
pub mod interleaved;
pub mod leader;
pub mod lease;
pub mod lock_all;
pub mod many_keys;
pub mod proxy;
pub mod renewal;
pub mod shared;
pub mod uncontended;

use std::time::Instant;

use distlock_testing::PostgresServer;
use tokio::sync::mpsc;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, NoTls, Notification};

use crate::error::{bail, context, Result};
use crate::report::ScenarioResult;

/// The scenarios the PostgreSQL pass runs; the others are skipped with a note.
pub const SCENARIOS: &[&str] = &[
    "uncontended",
    "many-keys",
    "handoff",
    "renewal",
    "lock-all",
    "shared",
    "leader",
];

/// Lease of every hold that is not renewed: never ends during a cycle.
pub const LEASE_SECS: f64 = 30.0;

/// What every scenario of the pass needs.
pub struct PgEnv {
    /// The private server's URL (`postgresql://postgres@127.0.0.1:PORT/postgres?...`).
    pub url: String,
    /// Where the server listens (127.0.0.1), for the round-trip counting proxy.
    pub port: u16,
    pub quick: bool,
    /// `--locks N`: held by `renewal` (10,000 by default; 1,000 with `--quick`).
    pub locks: Option<usize>,
    /// The server's processes at the start: the postmaster and its children.
    pub postmaster: u32,
    /// `server_version`, and the settings that bound a cycle, as printed.
    pub version: String,
    pub settings: String,
}

/// Starts the private server (fsync on, the default) with its data directory under
/// `TMPDIR` (which `main` points at the target directory), creates the lease table.
pub async fn start(quick: bool, locks: Option<usize>) -> Result<(PostgresServer, PgEnv)> {
    let server = tokio::task::spawn_blocking(|| {
        PostgresServer::builder()
            // The hand-off and many-keys rows open a connection per task.
            .setting("max_connections", "200")
            .start()
    })
    .await?
    .map_err(context("starting a private PostgreSQL"))?;
    let client = connect(&server.url(), "lock-bench-setup").await?;
    client
        .batch_execute(lease::SCHEMA)
        .await
        .map_err(context("creating the lease-row floor's table"))?;
    let show = |name: &'static str| {
        let client = &client;
        async move {
            let row = client.query_one(&format!("SHOW {name}"), &[]).await?;
            Ok::<String, crate::error::BoxError>(row.get(0))
        }
    };
    let version = show("server_version").await?;
    let settings = format!(
        "synchronous_commit={} fsync={} wal_sync_method={} data_directory on {}",
        show("synchronous_commit").await?,
        show("fsync").await?,
        show("wal_sync_method").await?,
        std::env::temp_dir().display(),
    );
    let postmaster = server
        .postmaster_pid()
        .map_err(context("reading the postmaster's pid"))?;
    let env = PgEnv {
        url: server.url(),
        port: server.port(),
        quick,
        locks,
        postmaster,
        version,
        settings,
    };
    Ok((server, env))
}

/// A connection, its driver spawned; `name` shows in `pg_stat_activity`.
pub async fn connect(url: &str, name: &str) -> Result<Client> {
    let url = with_name(url, name);
    let (client, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .map_err(context(&format!("connecting to {url}")))?;
    tokio::spawn(async move {
        // Its error is the client's next error.
        let _ = connection.await;
    });
    Ok(client)
}

/// A connection that listens on `channel`, and its notifications: the connection's
/// driver forwards each to the channel's receiver, which a waiter parks on.
pub async fn listen(
    url: &str,
    name: &str,
    channel: &str,
) -> Result<(Client, mpsc::UnboundedReceiver<Notification>)> {
    let url = with_name(url, name);
    let (client, mut connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .map_err(context(&format!("connecting to {url}")))?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(n) = message {
                if tx.send(n).is_err() {
                    break;
                }
            }
        }
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    Ok((client, rx))
}

/// A distlock manager on the server (its data and listening connections).
pub async fn distlock_manager(url: &str) -> Result<distlock::LockManager> {
    distlock_manager_with(url, false).await
}

/// A distlock manager on `url`, its statements prepared per connection
/// (`postgres_prepared_statements`) or sent unnamed (the default).
pub async fn distlock_manager_with(url: &str, prepared: bool) -> Result<distlock::LockManager> {
    distlock::LockManager::builder(url)
        .default_lease(std::time::Duration::from_secs_f64(LEASE_SECS))
        .postgres_prepared_statements(prepared)
        .build()
        .await
        .map_err(context(&format!("building a distlock manager on {url}")))
}

/// The schema distlock's managers use by default, where the floors of its
/// own SQL by hand find its functions.
pub const DISTLOCK_SCHEMA: &str = "distlock";

/// A connection for distlock's SQL by hand, named `name`: distlock's schema
/// created on it as its managers create it (idempotent), its `acquire` and
/// `release` statements prepared when `prepared` (else they are sent unnamed),
/// and the pid of its backend (for its CPU time).
pub async fn same_sql_client(
    url: &str,
    name: &str,
    prepared: bool,
    (acquire, release): (&str, &str),
) -> Result<(
    Client,
    Option<(tokio_postgres::Statement, tokio_postgres::Statement)>,
    u32,
)> {
    let client = connect(url, name).await?;
    client
        .batch_execute(&distlock::postgres_schema_sql(DISTLOCK_SCHEMA)?)
        .await?;
    let statements = if prepared {
        Some((
            client.prepare(acquire).await?,
            client.prepare(release).await?,
        ))
    } else {
        None
    };
    let pid = uncontended::backend_pid(&client).await?;
    Ok((client, statements, pid))
}

/// Milliseconds since the Unix epoch: the `since` distlock sends with an
/// acquisition (when the holder started to wait).
pub fn epoch_ms() -> Result<i64> {
    Ok(i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?)
}

/// One call of a distlock function by hand: its `statement` prepared once, or
/// (`None`) `sql` sent unnamed, parsed with each call, as distlock sends it by
/// default; the one row it answers.
pub async fn call_one(
    client: &Client,
    statement: Option<&tokio_postgres::Statement>,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<tokio_postgres::Row> {
    match statement {
        Some(statement) => {
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            Ok(client.query_one(statement, &values).await?)
        }
        None => match client.query_typed(sql, params).await?.into_iter().next() {
            Some(row) => Ok(row),
            None => bail!("distlock's function answered no row"),
        },
    }
}

/// A sqlx connection for the peer.
pub async fn sqlx_connect(url: &str, name: &str) -> Result<sqlx::PgConnection> {
    use sqlx::Connection as _;
    let url = with_name(url, name);
    sqlx::PgConnection::connect(&url)
        .await
        .map_err(context(&format!("sqlx connecting to {url}")))
}

fn with_name(url: &str, name: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={name}")
}

/// The postmaster and every process it started (backends, WAL writer,
/// checkpointer...), for `pin.rs`: new backends inherit the postmaster's CPU set.
pub fn server_pids(postmaster: u32) -> Vec<u32> {
    let mut pids = vec![postmaster];
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The parent is the second field after the name, which is in parentheses.
            let parent = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if parent == Some(postmaster) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// A round-trip counting proxy in front of the server, and the URL through it.
pub async fn counting_proxy(env: &PgEnv) -> Result<(proxy::PgCountingProxy, String)> {
    let p = proxy::PgCountingProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], env.port)))
        .await?;
    let url = p.url(&env.url, env.port);
    Ok((p, url))
}

/// Runs the pass's scenarios among `names`, in the usual order.
pub async fn run_once(env: &PgEnv, names: &[String]) -> Result<Vec<ScenarioResult>> {
    let mut results = Vec::new();
    for name in crate::scenarios::ALL {
        if !names.iter().any(|n| n == name) {
            continue;
        }
        if !SCENARIOS.contains(name) {
            println!(
                "== {name}: skipped under --backend postgres (the PostgreSQL pass runs only {})\n",
                SCENARIOS.join(", ")
            );
            continue;
        }
        let started = Instant::now();
        let got = match *name {
            "uncontended" => uncontended::run(env).await?,
            "many-keys" => many_keys::run(env).await?,
            "handoff" => handoff::run(env).await?,
            "renewal" => renewal::run(env).await?,
            "lock-all" => lock_all::run(env).await?,
            "shared" => shared::run(env).await?,
            "leader" => leader::run(env).await?,
            other => bail!("unknown scenario {other:?}"),
        };
        println!("{}", got.render());
        println!(
            "  ({name} took {:.1} s; load average now {})\n",
            started.elapsed().as_secs_f64(),
            crate::load_average()
        );
        results.push(got);
    }
    Ok(results)
}

/// The note every table of the pass carries: what the server was.
pub fn server_note(env: &PgEnv) -> String {
    format!(
        "PostgreSQL {} (private), {}; each cycle of a lease row is two commits, each a WAL flush",
        env.version, env.settings
    )
}
