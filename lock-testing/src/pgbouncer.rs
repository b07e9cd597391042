//! [`PgBouncer`]: a private PgBouncer in transaction mode in front of a [`PostgresServer`],
//! on a free loopback port, for tests of what a pooler changes (no LISTEN/NOTIFY, no session
//! state kept between transactions).

use std::fmt::Write as _;
use std::net::TcpStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::postgres::PostgresServer;
use super::server::pick_port;
use super::TestingError;

/// How long [`PgBouncer::start`] waits for PgBouncer to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How many ports to try: another process can take the port between the probe and the bind.
const PORT_ATTEMPTS: usize = 3;

/// A private PgBouncer (`pool_mode = transaction`, trust authentication, the `postgres`
/// user) in front of one [`PostgresServer`], on a free port of 127.0.0.1: each transaction
/// of a client may run on another server session, LISTEN is accepted but its notifications
/// never reach the client, and session settings do not stick. Killed on drop and its
/// directory removed. Needs the `pgbouncer` binary (Debian's `pgbouncer` package, whose
/// service need not run), found as `/usr/sbin/pgbouncer` or on `PATH`; as root it runs as
/// the user the server runs as (PgBouncer refuses root).
///
/// ```no_run
/// use distlock_testing::{PgBouncer, PostgresServer};
///
/// # fn example() -> Result<(), distlock_testing::TestingError> {
/// let pg = PostgresServer::start()?;
/// let pooler = PgBouncer::start(&pg)?;
/// // postgresql://postgres@127.0.0.1:PORT/postgres?connect_timeout=5, through the pooler
/// let url = pooler.url();
/// # let _ = url;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PgBouncer {
    child: Child,
    port: u16,
    log: PathBuf,
    // Removed after `Drop::drop` killed the process (declared after `child`).
    _dir: TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in transaction mode in front of `server` (at most 20 server
    /// sessions) and waits until it accepts connections.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] when the `pgbouncer` binary is missing, or it does not
    /// start (with its log); [`TestingError::Io`] for the temporary directory.
    pub fn start(server: &PostgresServer) -> Result<PgBouncer, TestingError> {
        PgBouncer::start_with(server, &[])
    }

    /// [`start`](Self::start) with more settings of the `[pgbouncer]` section, such as
    /// `("query_timeout", "1")`; a setting given twice takes the last value.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); a setting PgBouncer does not know fails the start.
    pub fn start_with(
        server: &PostgresServer,
        settings: &[(&str, &str)],
    ) -> Result<PgBouncer, TestingError> {
        let bin = binary()?;
        let dir = tempfile::Builder::new()
            .prefix("distlock-pgbouncer-")
            .tempdir()?;
        let run_as = server.run_as();
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid.as_raw()), Some(gid.as_raw()))?;
        }
        let log = dir.path().join("pgbouncer.log");
        let users = dir.path().join("users.txt");
        // Trust authentication still looks the user up in the auth file.
        std::fs::write(&users, "\"postgres\" \"\"\n")?;
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = pick_port()?;
            let ini = dir.path().join("pgbouncer.ini");
            let mut text = config(server.port(), port, &users, &log);
            for (name, value) in settings {
                let _ = writeln!(text, "{name} = {value}");
            }
            std::fs::write(&ini, text)?;
            let mut cmd = Command::new(&bin);
            cmd.arg(&ini)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = run_as {
                cmd.uid(uid.as_raw()).gid(gid.as_raw());
            }
            let mut child = cmd.spawn()?;
            match wait_until_accepting(&mut child, port) {
                Ok(()) => {
                    return Ok(PgBouncer {
                        child,
                        port,
                        log,
                        _dir: dir,
                    })
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_error = format!(
                        "{e}; its log:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
            }
        }
        Err(TestingError::Postgres(format!(
            "pgbouncer did not start on {PORT_ATTEMPTS} ports; the last attempt: {last_error}"
        )))
    }

    /// The port PgBouncer listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL through the pooler, as [`PostgresServer::url`] is to the server:
    /// `postgresql://postgres@127.0.0.1:PORT/postgres?connect_timeout=5`.
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{}/postgres?connect_timeout=5",
            self.port
        )
    }

    /// PgBouncer's log file, for a failing test to show.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(server_port: u16, port: u16, users: &Path, log: &Path) -> String {
    let mut ini = String::new();
    let _ = writeln!(ini, "[databases]");
    let _ = writeln!(
        ini,
        "postgres = host=127.0.0.1 port={server_port} dbname=postgres user=postgres"
    );
    let _ = writeln!(ini, "[pgbouncer]");
    let _ = writeln!(ini, "listen_addr = 127.0.0.1");
    let _ = writeln!(ini, "listen_port = {port}");
    // No Unix socket: its directory would have to be writable by the user it runs as.
    let _ = writeln!(ini, "unix_socket_dir =");
    let _ = writeln!(ini, "auth_type = trust");
    let _ = writeln!(ini, "auth_file = {}", users.display());
    let _ = writeln!(ini, "pool_mode = transaction");
    let _ = writeln!(ini, "max_client_conn = 200");
    let _ = writeln!(ini, "default_pool_size = 20");
    // Startup parameters some clients send and transaction mode cannot keep.
    let _ = writeln!(
        ini,
        "ignore_startup_parameters = extra_float_digits,options"
    );
    let _ = writeln!(ini, "logfile = {}", log.display());
    ini
}

/// Polls `port` until it accepts a TCP connection, failing if `child` exits first.
fn wait_until_accepting(child: &mut Child, port: u16) -> Result<(), String> {
    let started = Instant::now();
    while started.elapsed() < START_TIMEOUT {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("pgbouncer exited ({status})"));
        }
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("pgbouncer did not listen within {START_TIMEOUT:?}"))
}

/// `/usr/sbin/pgbouncer` (Debian puts it there, off a user's `PATH`), else `PATH`.
fn binary() -> Result<PathBuf, TestingError> {
    let mut candidates = vec![PathBuf::from("/usr/sbin/pgbouncer")];
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("pgbouncer")));
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        TestingError::Postgres(
            "no pgbouncer binary (/usr/sbin/pgbouncer or on PATH): install the pgbouncer \
                 package (its service need not run)"
                .to_owned(),
        )
    })
}
