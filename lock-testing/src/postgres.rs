//! [`PostgresServer`]: a private PostgreSQL instance (`initdb` + `pg_ctl`) in a temporary
//! directory on a free loopback port, for tests that need a real database beside Redis.

use std::fmt::Write as _;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};
use tempfile::TempDir;

use super::server::pick_port;
use super::tls::{make_client_identity, TlsCa, TlsFiles};
use super::TestingError;

/// How long `pg_ctl start` and `pg_ctl restart` may wait for the server to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `pg_ctl stop` may wait in `Drop`, per attempt (a fast stop, then an immediate one):
/// `Drop` never waits longer than twice this for `pg_ctl`.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `psql` may take to connect (libpq's `connect_timeout`; it counts whole seconds,
/// at least 2): a paused server makes [`PostgresServer::psql`] fail after this rather than hang.
const CONNECT_TIMEOUT_SECS: u32 = 5;

/// How many ports to try: another process can take the port between the probe and the
/// server's bind.
const PORT_ATTEMPTS: usize = 3;

/// The users the server runs as when the test runs as root, which `initdb`, `pg_ctl` and
/// `postgres` refuse: the PostgreSQL package's own user, else `nobody`.
const UNPRIVILEGED_USERS: [&str; 2] = ["postgres", "nobody"];

/// Configures and starts a [`PostgresServer`].
///
/// ```no_run
/// use distlock_testing::PostgresServer;
///
/// # fn example() -> Result<(), distlock_testing::TestingError> {
/// // Faster writes, at the cost of what a crash keeps.
/// let pg = PostgresServer::builder()
///     .fsync(false)
///     .setting("max_connections", "20")
///     .start()?;
/// assert_eq!(pg.psql("SHOW fsync")?, "off");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until start() is called"]
pub struct PostgresServerBuilder {
    fsync: bool,
    tls: bool,
    client_certificates: bool,
    settings: Vec<(String, String)>,
}

impl Default for PostgresServerBuilder {
    fn default() -> PostgresServerBuilder {
        PostgresServerBuilder {
            fsync: true,
            tls: false,
            client_certificates: false,
            settings: Vec::new(),
        }
    }
}

impl PostgresServerBuilder {
    /// Whether commits are flushed to disk (default on, as in production). Off also turns off
    /// `synchronous_commit` and `full_page_writes`: faster, but a crash
    /// ([`PostgresServer::restart_immediate`]) may then lose commits a client saw.
    pub fn fsync(mut self, on: bool) -> PostgresServerBuilder {
        self.fsync = on;
        self
    }

    /// Whether TCP connections must use TLS (default `false`).
    ///
    /// A TLS server gets a certificate authority of its own, made at start, and a
    /// certificate signed by it for `localhost` and `127.0.0.1` (`ssl = on`), and its
    /// `pg_hba.conf` admits TCP clients by `hostssl` lines only, so that a client that does
    /// not speak TLS is refused (`no pg_hba.conf entry ... no encryption`). Clients must
    /// trust [`PostgresServer::ca_cert_pem`] and ask for TLS (`sslmode=require` or stricter;
    /// [`url`](PostgresServer::url) does not say it). Client certificates are not asked for.
    pub fn tls(mut self, tls: bool) -> PostgresServerBuilder {
        self.tls = tls;
        self
    }

    /// Whether TCP clients must also present a certificate signed by the server's CA (default
    /// `false`; `true` turns [`tls`](Self::tls) on): `clientcert=verify-ca` on the `hostssl`
    /// lines. [`PostgresServer::client_identity`] is such a certificate, which
    /// [`psql`](PostgresServer::psql) presents.
    pub fn tls_client_certificates(mut self, on: bool) -> PostgresServerBuilder {
        self.client_certificates = on;
        self.tls |= on;
        self
    }

    /// A `postgresql.conf` setting, written as `name = 'value'` (the value is quoted, so give
    /// it unquoted: `setting("max_connections", "20")`). Later settings win.
    pub fn setting(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> PostgresServerBuilder {
        self.settings.push((name.into(), value.into()));
        self
    }

    /// Initialises a database cluster in a new temporary directory and starts it on a free
    /// port of 127.0.0.1, with trust authentication for the superuser `postgres` (it listens
    /// on loopback and on a Unix socket inside the temporary directory only), and waits until
    /// it accepts connections. Blocks for about a second (`initdb` takes most of it).
    ///
    /// As root (CI runs as root), `initdb`, `pg_ctl` and the server run as the unprivileged
    /// user `postgres` (which the server package creates; `nobody` if it does not exist), with
    /// the temporary directory handed to that user.
    ///
    /// # Errors
    ///
    /// [`TestingError::PostgresNotFound`] without the server binaries;
    /// [`TestingError::Postgres`] when a tool fails (with its output and the server's log).
    pub fn start(self) -> Result<PostgresServer, TestingError> {
        let bin = bindir()?;
        let dir = tempfile::Builder::new().prefix("distlock-pg-").tempdir()?;
        let run_as = if Uid::effective().is_root() {
            let (uid, gid) = unprivileged_user()?;
            std::os::unix::fs::chown(dir.path(), Some(uid.as_raw()), Some(gid.as_raw()))?;
            Some((uid, gid))
        } else {
            None
        };
        let data = dir.path().join("data");
        let log = dir.path().join("server.log");

        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
            ])
            // The cluster is thrown away with the test: flushing its template files to disk
            // would only cost time. The server's own fsync setting is separate.
            .arg("--no-sync");
        run(&mut initdb, run_as, dir.path(), "initdb")?;
        let tls = if self.tls {
            Some(write_tls_files(
                dir.path(),
                run_as,
                self.client_certificates,
            )?)
        } else {
            None
        };
        write_settings(&data, dir.path(), &self, tls.as_ref())?;

        let server = PostgresServer {
            bin,
            data,
            log,
            port: 0,
            run_as,
            tls,
            dir_path: dir.path().to_path_buf(),
            dir: None,
        };
        server.start_on_a_free_port(dir)
    }
}

/// How a standby started by [`PostgresServer::start_standby`] confirms what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The primary names the standby in `synchronous_standby_names`: a commit returns to its
    /// client (under `synchronous_commit = on`, the default) only once the standby flushed
    /// its WAL. With the standby stopped, commits wait.
    Synchronous,
    /// The primary does not wait: a commit its client saw may be missing from the standby.
    Asynchronous,
}

/// A private PostgreSQL server: its own `initdb`-made cluster in a temporary directory, on a
/// free port of 127.0.0.1, with fsync on by default. Stopped on drop (a fast shutdown, or an
/// immediate one if that does not finish in time, waiting at most about 20 s in all) and its
/// directory removed.
///
/// It can be crashed and restarted ([`restart_immediate`](Self::restart_immediate)), frozen
/// ([`pause`](Self::pause), [`pause_backend`](Self::pause_backend)), and have client
/// connections cut ([`kill_backend`](Self::kill_backend),
/// [`kill_backends_named`](Self::kill_backends_named)). It needs the PostgreSQL server
/// binaries (`initdb`, `pg_ctl`, `psql`), found through `pg_config --bindir`, else in the
/// newest `/usr/lib/postgresql/*/bin` (Debian keeps them off `PATH`), else on `PATH`. It does
/// not depend on a PostgreSQL client crate: connect with the one your code uses, through
/// [`url`](Self::url).
///
/// ```no_run
/// use distlock_testing::PostgresServer;
///
/// # fn example() -> Result<(), distlock_testing::TestingError> {
/// let mut pg = PostgresServer::start()?;
/// // postgresql://postgres@127.0.0.1:PORT/postgres?connect_timeout=5
/// let url = pg.url();
/// # let _ = url;
/// pg.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")?;
///
/// // Cut every connection a client opened with application_name=worker.
/// let cut = pg.kill_backends_named("worker")?;
/// # let _ = cut;
///
/// // Crash and recover: committed rows survive (fsync is on).
/// pg.restart_immediate()?;
/// assert_eq!(pg.psql("SELECT v FROM t")?, "1");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PostgresServer {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    run_as: Option<(Uid, Gid)>,
    tls: Option<ServerTls>,
    dir_path: PathBuf,
    // Dropped (the directory removed) after `Drop::drop` stopped the server; `None` only
    // while `start` still tries ports.
    dir: Option<TempDir>,
}

impl PostgresServer {
    /// Starts the server (`pg_ctl start`) on a free port, trying [`PORT_ATTEMPTS`] ports; on
    /// success the server owns `dir`.
    fn start_on_a_free_port(mut self, dir: TempDir) -> Result<PostgresServer, TestingError> {
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            self.port = pick_port()?;
            match self.pg_ctl_start("start") {
                Ok(()) => {
                    self.dir = Some(dir);
                    return Ok(self);
                }
                Err(e) => {
                    // A half-started server must not outlive the attempt.
                    self.stop();
                    last_error = e.to_string();
                }
            }
        }
        // `self` is dropped before `dir` removes the directory (declared after it).
        Err(TestingError::Postgres(format!(
            "could not start on {PORT_ATTEMPTS} ports; the last attempt: {last_error}"
        )))
    }

    /// Starts a streaming-replication standby of this server in a new temporary directory,
    /// on a free port of 127.0.0.1, and returns once this server reports it streaming (and,
    /// for [`Replication::Synchronous`], in sync). The standby is copied with `pg_basebackup`
    /// (so it has this server's settings), follows with `primary_conninfo` and
    /// `standby.signal`, and answers read-only queries (`hot_standby`). For
    /// [`Replication::Synchronous`] this server's `synchronous_standby_names` is set to the
    /// standby's name (`ALTER SYSTEM`, then a reload); one synchronous standby per primary.
    ///
    /// Make it the primary with [`promote`](Self::promote), typically after
    /// [`stop_immediate`](Self::stop_immediate) of this one.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] for a TLS server (its `pg_hba.conf` admits no replication
    /// connection), or when a tool fails or the standby does not stream within 30 s.
    pub fn start_standby(&self, replication: Replication) -> Result<PostgresServer, TestingError> {
        if self.tls.is_some() {
            return Err(TestingError::Postgres(
                "standbys of a TLS server are not supported".to_owned(),
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("distlock-pg-standby-")
            .tempdir()?;
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid.as_raw()), Some(gid.as_raw()))?;
        }
        let data = dir.path().join("data");
        let mut basebackup = Command::new(self.bin.join("pg_basebackup"));
        basebackup
            .arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-U", "postgres", "-X", "stream"])
            .args(["-c", "fast", "--no-sync"])
            .arg("-p")
            .arg(self.port.to_string());
        run(&mut basebackup, self.run_as, dir.path(), "pg_basebackup")?;
        let name = standby_name(dir.path());
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name={name}",
            self.port
        );
        // Later lines of postgresql.conf win over the copied primary's: the socket goes into
        // the standby's own directory, which outlives the primary's.
        let conf = format!(
            "\n# distlock-testing standby\nunix_socket_directories = {}\nprimary_conninfo = {}\n\
             hot_standby = 'on'\n",
            quote_literal(&dir.path().display().to_string()),
            quote_literal(&conninfo)
        );
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))?;
        io::Write::write_all(&mut file, conf.as_bytes())?;
        // A primary that has a synchronous standby already passed its
        // synchronous_standby_names (ALTER SYSTEM's file) on: after a promotion this server
        // would wait for a standby of its own that does not exist.
        let auto_conf = data.join("postgresql.auto.conf");
        if let Ok(text) = std::fs::read_to_string(&auto_conf) {
            let kept: String = text
                .lines()
                .filter(|line| !line.trim_start().starts_with("synchronous_standby_names"))
                .map(|line| format!("{line}\n"))
                .collect();
            std::fs::write(&auto_conf, kept)?;
        }
        std::fs::write(data.join("standby.signal"), "")?;
        if let Some((uid, gid)) = self.run_as {
            std::os::unix::fs::chown(
                data.join("standby.signal"),
                Some(uid.as_raw()),
                Some(gid.as_raw()),
            )?;
        }
        let standby = PostgresServer {
            bin: self.bin.clone(),
            data,
            log: dir.path().join("server.log"),
            port: 0,
            run_as: self.run_as,
            tls: None,
            dir_path: dir.path().to_path_buf(),
            dir: None,
        }
        .start_on_a_free_port(dir)?;
        if replication == Replication::Synchronous {
            // Two calls: `psql -c` runs its statements as one transaction, which ALTER
            // SYSTEM refuses.
            self.psql(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = {}",
                quote_literal(&name)
            ))?;
            self.psql("SELECT pg_reload_conf()")?;
        }
        self.wait_for_standby(&standby, replication)?;
        Ok(standby)
    }

    /// Waits up to 30 s until this server reports `standby` streaming from it (and in sync, for
    /// [`Replication::Synchronous`]) in `pg_stat_replication`: after
    /// [`start_standby`](Self::start_standby), or after the standby was started again.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] when it does not, with both servers' logs.
    pub fn wait_for_standby(
        &self,
        standby: &PostgresServer,
        replication: Replication,
    ) -> Result<(), TestingError> {
        let want = match replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let states = self.psql(&format!(
                "SELECT state || ' ' || sync_state FROM pg_stat_replication \
                 WHERE application_name = {}",
                quote_literal(&standby_name(&standby.dir_path))
            ))?;
            if states.lines().any(|s| s == format!("streaming {want}")) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestingError::Postgres(format!(
                    "the standby on port {} is not streaming ({want}) after {:?}: \
                     pg_stat_replication says {states:?}\nprimary log:\n{}\nstandby log:\n{}",
                    standby.port,
                    START_TIMEOUT,
                    self.log_tail(),
                    standby.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to 30 s until `standby` replayed everything this server had written when
    /// called (`pg_current_wal_lsn()` here, `pg_last_wal_replay_lsn()` there): what was
    /// committed here is then visible there, and survives a promotion.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] when it does not catch up in time.
    pub fn wait_for_replay(&self, standby: &PostgresServer) -> Result<(), TestingError> {
        let written = self.psql("SELECT pg_current_wal_lsn()")?;
        let deadline = Instant::now() + START_TIMEOUT;
        let caught_up = format!(
            "SELECT coalesce(pg_last_wal_replay_lsn() >= {}::pg_lsn, false)",
            quote_literal(&written)
        );
        while standby.psql(&caught_up)? != "t" {
            if Instant::now() >= deadline {
                return Err(TestingError::Postgres(format!(
                    "the standby on port {} did not replay up to {written} within {:?}",
                    standby.port, START_TIMEOUT
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Crashes the server and leaves it down (`pg_ctl stop -m immediate`): every connection
    /// is cut, no shutdown checkpoint is written, and nothing more reaches a standby. Start it
    /// again with [`start_again`](Self::start_again). Resumes a paused server first.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] with `pg_ctl`'s output.
    pub fn stop_immediate(&self) -> Result<(), TestingError> {
        self.resume()?;
        self.pg_ctl_stop("immediate")
    }

    /// Starts a server stopped by [`stop_immediate`](Self::stop_immediate) again on its port,
    /// recovering from its WAL (a standby goes on following its primary).
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] with `pg_ctl`'s output and the server's log.
    pub fn start_again(&self) -> Result<(), TestingError> {
        self.pg_ctl_start("start")
    }

    /// Makes a standby the primary (`pg_ctl promote`), and returns once it accepts writes.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] when the server is no standby or does not finish promoting
    /// within 30 s.
    pub fn promote(&self) -> Result<(), TestingError> {
        let mut pg_ctl = Command::new(self.bin.join("pg_ctl"));
        pg_ctl
            .arg("promote")
            .arg("-D")
            .arg(&self.data)
            .arg("-w")
            .arg("-t")
            .arg(START_TIMEOUT.as_secs().to_string());
        run(&mut pg_ctl, self.run_as, &self.dir_path, "pg_ctl promote").map_err(|e| {
            TestingError::Postgres(format!("{e}\nserver log:\n{}", self.log_tail()))
        })?;
        match self.psql("SELECT pg_is_in_recovery()")?.as_str() {
            "f" => Ok(()),
            other => Err(TestingError::Postgres(format!(
                "still in recovery after pg_ctl promote ({other})"
            ))),
        }
    }

    /// Starts a server with the default settings (fsync on); see
    /// [`PostgresServerBuilder::start`].
    ///
    /// # Errors
    ///
    /// As [`PostgresServerBuilder::start`].
    pub fn start() -> Result<PostgresServer, TestingError> {
        PostgresServerBuilder::default().start()
    }

    /// A builder for a server with other settings.
    pub fn builder() -> PostgresServerBuilder {
        PostgresServerBuilder::default()
    }

    /// The port the server listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URL for the superuser `postgres` and the database `postgres`:
    /// `postgresql://postgres@127.0.0.1:PORT/postgres?connect_timeout=5`. `tokio-postgres`,
    /// `sqlx` and libpq all accept it.
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{}/postgres?connect_timeout={CONNECT_TIMEOUT_SECS}",
            self.port
        )
    }

    /// Whether TCP clients must speak TLS (see [`PostgresServerBuilder::tls`]).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The PEM certificate of the authority that signed a TLS server's certificate, for
    /// clients to trust; `None` for a server without TLS.
    pub fn ca_cert_pem(&self) -> Option<&[u8]> {
        self.tls.as_ref().map(|t| t.files.ca_pem())
    }

    /// A client certificate signed by the server's CA for the user `postgres`, and its key
    /// (PEMs), when the server asks for one
    /// ([`tls_client_certificates`](PostgresServerBuilder::tls_client_certificates)).
    pub fn client_identity(&self) -> Option<(&[u8], &[u8])> {
        let client = self.tls.as_ref()?.client.as_ref()?;
        Some((&client.cert_pem, &client.key_pem))
    }

    /// The file holding [`ca_cert_pem`](Self::ca_cert_pem) (libpq's `sslrootcert`), in the
    /// server's temporary directory; `None` for a server without TLS.
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.files.ca_path())
    }

    /// The user and group the server runs as when the tests run as root (`None`
    /// otherwise), for the helpers that run beside it (PgBouncer refuses root too).
    pub(crate) fn run_as(&self) -> Option<(Uid, Gid)> {
        self.run_as
    }

    /// The server's log file (`pg_ctl -l`), for a failing test to show.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Runs `sql` (one or more statements) with `psql` as `postgres`, and returns what the
    /// last statement printed, unaligned and without headers (`-At`: one row per line, columns
    /// separated by `|`), trimmed. One new connection per call.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] with `psql`'s output if a statement fails or it cannot
    /// connect within 5 s (say, while the server is paused).
    pub fn psql(&self, sql: &str) -> Result<String, TestingError> {
        let mut psql = Command::new(self.bin.join("psql"));
        psql.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres"])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(sql)
            .env("PGCONNECT_TIMEOUT", CONNECT_TIMEOUT_SECS.to_string())
            .env("PGAPPNAME", "distlock-testing");
        if let Some(tls) = &self.tls {
            // Verified as a careful client would, rather than libpq's unverified `prefer`.
            psql.env("PGSSLMODE", "verify-full")
                .env("PGSSLROOTCERT", tls.files.ca_path());
            if let Some(client) = &tls.client {
                psql.env("PGSSLCERT", &client.cert_path)
                    .env("PGSSLKEY", &client.key_path);
            }
        }
        // psql is a client: it runs as whoever we are, root included.
        let stdout = run(&mut psql, None, &self.dir_path, "psql")?;
        Ok(stdout.trim().to_owned())
    }

    /// The process ids of the backends serving connections whose `application_name` is
    /// `application_name` (from `pg_stat_activity`).
    ///
    /// # Errors
    ///
    /// As [`psql`](Self::psql).
    pub fn backend_pids(&self, application_name: &str) -> Result<Vec<u32>, TestingError> {
        let out = self.psql(&format!(
            "SELECT pid FROM pg_stat_activity WHERE application_name = {} ORDER BY pid",
            quote_literal(application_name)
        ))?;
        out.lines()
            .map(|line| {
                line.trim().parse().map_err(|_| {
                    TestingError::Postgres(format!("pg_stat_activity gave pid {line:?}"))
                })
            })
            .collect()
    }

    /// Terminates the backend `pid` (`pg_terminate_backend`): its client's connection is cut
    /// and its open transaction rolled back, as when an administrator or an idle-session
    /// killer ends it. Returns whether `pid` was a backend of this server.
    ///
    /// # Errors
    ///
    /// As [`psql`](Self::psql).
    pub fn kill_backend(&self, pid: u32) -> Result<bool, TestingError> {
        // A pid that is no backend gives a WARNING on stderr and `f`, not an error.
        Ok(self.psql(&format!("SELECT pg_terminate_backend({pid})"))? == "t")
    }

    /// Terminates every backend whose connection has this `application_name` (as
    /// [`kill_backend`](Self::kill_backend)), and returns how many it terminated.
    ///
    /// # Errors
    ///
    /// As [`psql`](Self::psql).
    pub fn kill_backends_named(&self, application_name: &str) -> Result<usize, TestingError> {
        let out = self.psql(&format!(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = {} AND pid <> pg_backend_pid()",
            quote_literal(application_name)
        ))?;
        out.parse()
            .map_err(|_| TestingError::Postgres(format!("pg_terminate_backend count {out:?}")))
    }

    /// Crashes the server and starts it again on the same port (`pg_ctl restart -m
    /// immediate`): every connection is cut without a shutdown checkpoint, and the server
    /// recovers from its WAL, as after a power loss with fsync on (with
    /// [`fsync(false)`](PostgresServerBuilder::fsync), recent commits may be lost). Resumes a
    /// paused server first. Returns once the server accepts connections again.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] with `pg_ctl`'s output and the server's log.
    pub fn restart_immediate(&mut self) -> Result<(), TestingError> {
        self.resume()?;
        self.pg_ctl_start("restart")
    }

    /// The process id of the postmaster (from `postmaster.pid`), which forks a backend per
    /// connection.
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] if the server is not running.
    pub fn postmaster_pid(&self) -> Result<u32, TestingError> {
        let path = self.data.join("postmaster.pid");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            TestingError::Postgres(format!(
                "the server is not running ({}: {e})",
                path.display()
            ))
        })?;
        text.lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .ok_or_else(|| TestingError::Postgres(format!("{} names no pid", path.display())))
    }

    /// Freezes the whole server with `SIGSTOP`: the postmaster first (so that it forks no new
    /// backend), then its children (backends, checkpointer, WAL writer...), and returns once
    /// each has stopped (signals arrive asynchronously; seen in `/proc` on Linux). Connections
    /// stay open, queries and new connections hang, as on a stalled machine, until
    /// [`resume`](Self::resume).
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] if the server is not running; [`TestingError::Io`] if a
    /// signal cannot be sent.
    pub fn pause(&self) -> Result<(), TestingError> {
        let postmaster = self.postmaster_pid()?;
        signal(postmaster, Signal::SIGSTOP)?;
        wait_for_state(postmaster, Stopped::Yes)?;
        for child in children_of(postmaster)? {
            // A child that exited in between is not an error.
            if signal(child, Signal::SIGSTOP).is_ok() {
                wait_for_state(child, Stopped::Yes)?;
            }
        }
        Ok(())
    }

    /// Lets a server frozen by [`pause`](Self::pause) (or backends frozen by
    /// [`pause_backend`](Self::pause_backend)) go on: `SIGCONT` to the children, then the
    /// postmaster. Harmless on a running server.
    ///
    /// # Errors
    ///
    /// As [`pause`](Self::pause).
    pub fn resume(&self) -> Result<(), TestingError> {
        let postmaster = self.postmaster_pid()?;
        for child in children_of(postmaster)? {
            if signal(child, Signal::SIGCONT).is_ok() {
                wait_for_state(child, Stopped::No)?;
            }
        }
        signal(postmaster, Signal::SIGCONT)?;
        wait_for_state(postmaster, Stopped::No)?;
        Ok(())
    }

    /// Freezes one backend with `SIGSTOP` (find it with
    /// [`backend_pids`](Self::backend_pids)): its connection stays open and its locks held, but
    /// it answers nothing, while the rest of the server runs on. Undo with
    /// [`resume_backend`](Self::resume_backend) or [`resume`](Self::resume).
    ///
    /// # Errors
    ///
    /// [`TestingError::Postgres`] if `pid` is not a child of this server's postmaster (so that
    /// a test never stops another process).
    pub fn pause_backend(&self, pid: u32) -> Result<(), TestingError> {
        self.signal_child(pid, Signal::SIGSTOP)
    }

    /// Lets a backend frozen by [`pause_backend`](Self::pause_backend) go on (`SIGCONT`).
    ///
    /// # Errors
    ///
    /// As [`pause_backend`](Self::pause_backend).
    pub fn resume_backend(&self, pid: u32) -> Result<(), TestingError> {
        self.signal_child(pid, Signal::SIGCONT)
    }

    fn signal_child(&self, pid: u32, sig: Signal) -> Result<(), TestingError> {
        let postmaster = self.postmaster_pid()?;
        if !children_of(postmaster)?.contains(&pid) {
            return Err(TestingError::Postgres(format!(
                "process {pid} is not a backend of the server on port {}",
                self.port
            )));
        }
        signal(pid, sig)?;
        let want = if sig == Signal::SIGSTOP {
            Stopped::Yes
        } else {
            Stopped::No
        };
        wait_for_state(pid, want)
    }

    /// `pg_ctl start` or `pg_ctl restart -m immediate` on this server's port, waiting until it
    /// accepts connections.
    fn pg_ctl_start(&self, action: &str) -> Result<(), TestingError> {
        let mut pg_ctl = Command::new(self.bin.join("pg_ctl"));
        pg_ctl.arg(action).arg("-D").arg(&self.data);
        if action == "restart" {
            pg_ctl.args(["-m", "immediate"]);
        }
        pg_ctl
            .arg("-l")
            .arg(&self.log)
            .arg("-o")
            .arg(format!("-p {}", self.port))
            .arg("-w")
            .arg("-t")
            .arg(START_TIMEOUT.as_secs().to_string());
        let what = format!("pg_ctl {action}");
        run(&mut pg_ctl, self.run_as, &self.dir_path, &what)
            .map(drop)
            .map_err(|e| TestingError::Postgres(format!("{e}\nserver log:\n{}", self.log_tail())))
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), TestingError> {
        let mut pg_ctl = Command::new(self.bin.join("pg_ctl"));
        pg_ctl
            .arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", mode, "-w", "-t"])
            .arg(STOP_TIMEOUT.as_secs().to_string());
        run(&mut pg_ctl, self.run_as, &self.dir_path, "pg_ctl stop").map(drop)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl PostgresServer {
    /// Stops the server if it runs, waiting at most twice [`STOP_TIMEOUT`] for `pg_ctl`: a
    /// fast shutdown, an immediate one if that fails, then `SIGKILL` to the postmaster.
    fn stop(&self) {
        // Nothing to stop if no server started (postmaster.pid is missing).
        let Ok(postmaster) = self.postmaster_pid() else {
            return;
        };
        // A paused server could not shut down: resume it first.
        let _ = self.resume();
        let stopped = self
            .pg_ctl_stop("fast")
            .or_else(|_| self.pg_ctl_stop("immediate"));
        if let Err(e) = stopped {
            tracing::warn!(
                port = self.port,
                error = %e,
                "the private PostgreSQL did not stop; killing its postmaster"
            );
            // Its children exit when they notice the postmaster is gone.
            let _ = signal(postmaster, Signal::SIGKILL);
        }
    }
}

/// Appends the builder's settings to `postgresql.conf`: there, rather than on a command line,
/// no path needs shell quoting. The port is given at start.
fn write_settings(
    data: &Path,
    socket_dir: &Path,
    builder: &PostgresServerBuilder,
    tls: Option<&ServerTls>,
) -> Result<(), TestingError> {
    let mut conf = String::from("\n# distlock-testing\n");
    let mut setting = |name: &str, value: &str| {
        let _ = writeln!(conf, "{name} = {}", quote_literal(value));
    };
    setting("listen_addresses", "127.0.0.1");
    setting("unix_socket_directories", &socket_dir.display().to_string());
    if !builder.fsync {
        setting("fsync", "off");
        setting("synchronous_commit", "off");
        setting("full_page_writes", "off");
    }
    if let Some(tls) = tls {
        setting("ssl", "on");
        setting(
            "ssl_cert_file",
            &tls.files.cert_path().display().to_string(),
        );
        setting("ssl_key_file", &tls.files.key_path().display().to_string());
        if tls.client.is_some() {
            setting("ssl_ca_file", &tls.files.ca_path().display().to_string());
        }
    }
    for (name, value) in &builder.settings {
        setting(name, value);
    }
    let path = data.join("postgresql.conf");
    let mut file = std::fs::OpenOptions::new().append(true).open(&path)?;
    io::Write::write_all(&mut file, conf.as_bytes())?;
    if let Some(tls) = tls {
        // Replaces initdb's `host` lines: over TCP, only TLS sessions find an entry.
        let option = if tls.client.is_some() {
            " clientcert=verify-ca"
        } else {
            ""
        };
        std::fs::write(
            data.join("pg_hba.conf"),
            format!(
                "# distlock-testing: TLS only over TCP\n\
                 local all all trust\n\
                 hostssl all all 127.0.0.1/32 trust{option}\n\
                 hostssl all all ::1/128 trust{option}\n"
            ),
        )?;
    }
    Ok(())
}

/// Makes a CA and a server certificate (`TlsFiles`) in `dir`, the server's files readable by
/// their owner only and owned by the user the server runs as: PostgreSQL refuses a key file
/// that others can read, or that is neither its user's nor root's.
fn write_tls_files(
    dir: &Path,
    run_as: Option<(Uid, Gid)>,
    client_certificates: bool,
) -> Result<ServerTls, TestingError> {
    use std::os::unix::fs::PermissionsExt as _;
    let ca = TlsCa::new()?;
    let files = TlsFiles::create_signed_by(dir, &ca)?;
    for path in [files.cert_path(), files.key_path()] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(path, Some(uid.as_raw()), Some(gid.as_raw()))?;
        }
    }
    let client = if client_certificates {
        let (cert_pem, key_pem) = make_client_identity(&ca, "postgres")?;
        // psql's (run as us): libpq too refuses a key file that others can read.
        let (cert_path, key_path) = (dir.join("client.crt"), dir.join("client.key"));
        std::fs::write(&cert_path, &cert_pem)?;
        std::fs::write(&key_path, &key_pem)?;
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))?;
        Some(ClientFiles {
            cert_pem: cert_pem.into_bytes(),
            key_pem: key_pem.into_bytes(),
            cert_path,
            key_path,
        })
    } else {
        None
    };
    Ok(ServerTls { files, client })
}

/// A TLS server's certificate files, and the client certificate it asks for, if any.
#[derive(Debug)]
struct ServerTls {
    files: TlsFiles,
    client: Option<ClientFiles>,
}

/// A client certificate and key, in memory and as files for `psql`.
struct ClientFiles {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    cert_path: PathBuf,
    key_path: PathBuf,
}

impl std::fmt::Debug for ClientFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientFiles")
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

/// A standby's name in its primary's `pg_stat_replication` and `synchronous_standby_names`
/// (its `application_name`): made from its temporary directory's, so unique per standby.
fn standby_name(dir: &Path) -> String {
    let unique = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("x")
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        .to_ascii_lowercase();
    format!("standby_{unique}")
}

/// `value` as an SQL (and `postgresql.conf`) string literal.
fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// The folder of the server binaries: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin`, else `PATH` (the same places `.ci/run` looks).
fn bindir() -> Result<PathBuf, TestingError> {
    let mut candidates = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            candidates.push(PathBuf::from(
                String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            ));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev().map(|(_, dir)| dir));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates
        .into_iter()
        .find(|dir| {
            ["initdb", "pg_ctl", "psql"]
                .iter()
                .all(|t| dir.join(t).is_file())
        })
        .ok_or(TestingError::PostgresNotFound)
}

/// The uid and gid of the first of [`UNPRIVILEGED_USERS`] that exists.
fn unprivileged_user() -> Result<(Uid, Gid), TestingError> {
    UNPRIVILEGED_USERS
        .iter()
        .find_map(|name| User::from_name(name).ok().flatten())
        .map(|user| (user.uid, user.gid))
        .ok_or_else(|| {
            TestingError::Postgres(format!(
                "running as root, and none of the users {UNPRIVILEGED_USERS:?} exists to run \
                 PostgreSQL as (initdb refuses root); install the postgresql package, which \
                 creates `postgres`"
            ))
        })
}

/// Runs `cmd` from `cwd` (which the unprivileged user can read, unlike perhaps ours), as
/// `run_as` if given, and returns its standard output; its output is in the error if it fails.
fn run(
    cmd: &mut Command,
    run_as: Option<(Uid, Gid)>,
    cwd: &Path,
    what: &str,
) -> Result<String, TestingError> {
    cmd.current_dir(cwd);
    if let Some((uid, gid)) = run_as {
        // std's uid/gid also clear the supplementary groups: no tool (runuser, su) and no
        // shell quoting, and the exit status comes through unchanged.
        cmd.uid(uid.as_raw()).gid(gid.as_raw());
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output()?;
    if status.success() {
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    } else {
        Err(TestingError::Postgres(format!(
            "{what} failed ({status}):\n{}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )))
    }
}

fn signal(pid: u32, sig: Signal) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)?;
    Ok(())
}

/// How long [`wait_for_state`] waits for a signalled process to stop or go on: the kernel
/// does it at the process's next scheduling, so this only bounds a badly overloaded machine.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    Yes,
    No,
}

/// Waits until `pid` is stopped (state `T`) or not, as `want`s: `kill` returns before the
/// signal took effect. A process that exited counts as done; without `/proc` (not Linux) this
/// returns at once.
fn wait_for_state(pid: u32, want: Stopped) -> Result<(), TestingError> {
    let deadline = Instant::now() + SIGNAL_TIMEOUT;
    loop {
        let Some(state) = process_state(pid) else {
            return Ok(());
        };
        let stopped = if state == 'T' {
            Stopped::Yes
        } else {
            Stopped::No
        };
        if stopped == want || state == 'Z' {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(TestingError::Postgres(format!(
                "process {pid} is in state {state:?}, not {}, {} ms after the signal",
                if want == Stopped::Yes {
                    "stopped"
                } else {
                    "running"
                },
                SIGNAL_TIMEOUT.as_millis()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The state letter of `pid` in `/proc/PID/stat` (`T`: stopped by a signal, `Z`: exited but
/// not reaped); `None` if there is no such entry.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// The processes whose parent is `parent`: from `/proc` on Linux, else from `pgrep -P`.
fn children_of(parent: u32) -> io::Result<Vec<u32>> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        let out = Command::new("pgrep")
            .arg("-P")
            .arg(parent.to_string())
            .output()?;
        return Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect());
    };
    Ok(entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect())
}

/// The parent of `pid`, from `/proc/PID/stat`: the field after the state, which follows the
/// command name in parentheses (a name may itself hold spaces or parentheses).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::TestResult;
    use std::process::{Child, Stdio};

    /// A `psql` session with this application name that runs `sql` (say, a long `pg_sleep`),
    /// and the pid of the backend serving it once it shows in `pg_stat_activity`.
    fn session(pg: &PostgresServer, name: &str, sql: &str) -> Result<(Child, u32), TestingError> {
        let child = Command::new(pg.bin.join("psql"))
            .args([
                "-X",
                "-q",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .arg("-p")
            .arg(pg.port().to_string())
            .arg("-c")
            .arg(sql)
            .env("PGAPPNAME", name)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(&pid) = pg.backend_pids(name)?.first() {
                return Ok((child, pid));
            }
            if Instant::now() > deadline {
                return Err(TestingError::Postgres(format!("no backend named {name}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `within` for `child` to exit, and returns whether it did.
    fn exits_within(child: &mut Child, within: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(child.try_wait()?.is_some())
    }

    /// Whether `pid` has exited: gone, or a zombie (the postmaster is daemonized by `pg_ctl`, so
    /// whoever adopted it reaps it, maybe later or never).
    fn has_exited(pid: u32) -> bool {
        matches!(process_state(pid), None | Some('Z'))
    }

    #[test]
    fn a_tls_server_admits_tcp_clients_over_tls_only() -> TestResult {
        use std::os::unix::fs::PermissionsExt as _;
        let pg = PostgresServer::builder().tls(true).start()?;
        assert!(pg.is_tls());
        let ca = pg.ca_cert_pem().ok_or("no CA")?;
        assert!(ca.starts_with(b"-----BEGIN CERTIFICATE-----"));
        assert_eq!(std::fs::read(pg.ca_cert_path().ok_or("no CA file")?)?, ca);
        let tls = &pg.tls.as_ref().ok_or("no TLS files")?.files;
        for file in [tls.cert_path(), tls.key_path()] {
            assert_eq!(std::fs::metadata(file)?.permissions().mode() & 0o777, 0o600);
        }
        // psql verifies the server against the CA (verify-full) and is served over TLS.
        assert_eq!(
            pg.psql("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")?,
            "t"
        );
        // Without TLS, TCP finds no pg_hba.conf entry.
        let plain = Command::new(pg.bin.join("psql"))
            .args([
                "-X",
                "-At",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .arg("-p")
            .arg(pg.port().to_string())
            .args(["-c", "SELECT 1"])
            .env("PGSSLMODE", "disable")
            .env("PGCONNECT_TIMEOUT", "5")
            .output()?;
        assert!(!plain.status.success());
        let stderr = String::from_utf8_lossy(&plain.stderr);
        assert!(stderr.contains("no encryption"), "{stderr}");
        // A server without TLS says so.
        assert_eq!(PostgresServer::start()?.ca_cert_pem(), None);
        Ok(())
    }

    #[test]
    fn starts_on_a_private_port_with_fsync_on_and_stops_on_drop() -> TestResult {
        let pg = PostgresServer::start()?;
        assert_ne!(pg.port(), 5432);
        assert_eq!(
            pg.url(),
            format!(
                "postgresql://postgres@127.0.0.1:{}/postgres?connect_timeout=5",
                pg.port()
            )
        );
        assert_eq!(pg.psql("SELECT 1 + 1")?, "2");
        assert_eq!(pg.psql("SHOW fsync")?, "on");
        assert_eq!(pg.psql("SHOW port")?, pg.port().to_string());
        let postmaster = pg.postmaster_pid()?;
        let dir = pg.dir_path.clone();
        drop(pg);
        assert!(has_exited(postmaster), "the postmaster outlived the drop");
        assert!(!dir.exists(), "the temporary directory outlived the drop");
        Ok(())
    }

    #[test]
    fn builder_settings_reach_the_server() -> TestResult {
        let pg = PostgresServer::builder()
            .fsync(false)
            .setting("cluster_name", "it's set")
            .start()?;
        assert_eq!(pg.psql("SHOW fsync")?, "off");
        assert_eq!(pg.psql("SHOW synchronous_commit")?, "off");
        // The quote inside the value survives postgresql.conf's quoting.
        assert_eq!(pg.psql("SHOW cluster_name")?, "it's set");
        Ok(())
    }

    #[test]
    fn kill_backends_named_cuts_only_that_session() -> TestResult {
        let pg = PostgresServer::start()?;
        let (mut victim, victim_pid) = session(&pg, "victim", "SELECT pg_sleep(60)")?;
        let (mut bystander, _) = session(&pg, "bystander", "SELECT pg_sleep(60)")?;
        assert_eq!(pg.kill_backends_named("victim")?, 1);
        // pg_sleep(60) would keep psql 60 s; 10 s is far more than a cut connection needs.
        assert!(exits_within(&mut victim, Duration::from_secs(10))?);
        assert!(!pg.backend_pids("victim")?.contains(&victim_pid));
        assert_eq!(pg.backend_pids("bystander")?.len(), 1);
        assert!(
            !pg.kill_backend(victim_pid)?,
            "a gone backend is no backend"
        );
        let bystander_pid = pg.backend_pids("bystander")?[0];
        assert!(pg.kill_backend(bystander_pid)?);
        assert!(exits_within(&mut bystander, Duration::from_secs(10))?);
        Ok(())
    }

    #[test]
    fn restart_immediate_keeps_committed_rows_and_the_port() -> TestResult {
        let mut pg = PostgresServer::start()?;
        pg.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (7)")?;
        let (mut session, _) = session(&pg, "held", "SELECT pg_sleep(60)")?;
        let before = pg.postmaster_pid()?;
        let port = pg.port();
        pg.restart_immediate()?;
        assert_ne!(
            pg.postmaster_pid()?,
            before,
            "the postmaster was not restarted"
        );
        assert!(has_exited(before));
        assert_eq!(pg.port(), port);
        // fsync is on: the commit psql saw survives the crash.
        assert_eq!(pg.psql("SELECT v FROM t")?, "7");
        assert!(exits_within(&mut session, Duration::from_secs(10))?);
        Ok(())
    }

    #[test]
    fn pause_freezes_the_postmaster_and_its_children_until_resume() -> TestResult {
        let pg = PostgresServer::start()?;
        let (mut session, backend) = session(&pg, "frozen", "SELECT pg_sleep(60)")?;
        let postmaster = pg.postmaster_pid()?;
        pg.pause()?;
        assert_eq!(process_state(postmaster), Some('T'));
        let children = children_of(postmaster)?;
        assert!(children.contains(&backend));
        assert_eq!(process_state(backend), Some('T'));
        for child in &children {
            // The backend of a psql that just looked something up may have exited and wait,
            // a zombie, for the frozen postmaster to reap it; nothing else may run on.
            let state = process_state(*child);
            assert!(
                matches!(state, Some('T' | 'Z') | None),
                "child {child} runs on ({state:?})"
            );
        }
        pg.resume()?;
        assert_ne!(process_state(postmaster), Some('T'));
        assert_eq!(pg.psql("SELECT 1")?, "1");
        pg.kill_backend(backend)?;
        assert!(exits_within(&mut session, Duration::from_secs(10))?);
        Ok(())
    }

    #[test]
    fn pause_backend_freezes_one_backend_only() -> TestResult {
        let pg = PostgresServer::start()?;
        let (mut session, backend) = session(&pg, "one", "SELECT pg_sleep(60)")?;
        pg.pause_backend(backend)?;
        assert_eq!(process_state(backend), Some('T'));
        // The rest of the server answers.
        assert_eq!(pg.psql("SELECT 1")?, "1");
        pg.resume_backend(backend)?;
        assert_ne!(process_state(backend), Some('T'));
        // Not a child of the postmaster: refused, nothing signalled.
        assert!(pg.pause_backend(std::process::id()).is_err());
        pg.kill_backend(backend)?;
        assert!(exits_within(&mut session, Duration::from_secs(10))?);
        Ok(())
    }

    #[test]
    fn a_promoted_synchronous_standby_has_every_commit_its_primary_confirmed() -> TestResult {
        let primary = PostgresServer::start()?;
        primary.psql("CREATE TABLE t (v int)")?;
        let standby = primary.start_standby(Replication::Synchronous)?;
        assert_ne!(standby.port(), primary.port());
        assert_eq!(
            primary.psql("SHOW synchronous_standby_names")?,
            standby_name(&standby.dir_path)
        );
        assert_eq!(standby.psql("SELECT pg_is_in_recovery()")?, "t");
        primary.psql("INSERT INTO t VALUES (1)")?;
        primary.stop_immediate()?;
        assert!(primary.postmaster_pid().is_err(), "the primary still runs");
        standby.promote()?;
        // Flushed on the standby before the INSERT returned; promotion replays it.
        assert_eq!(standby.psql("SELECT v FROM t")?, "1");
        standby.psql("INSERT INTO t VALUES (2)")?;
        // The old primary comes back as a primary of its own (no fencing between them: that
        // is the test's to arrange), still without the promoted server's write.
        primary.start_again()?;
        assert_eq!(primary.psql("SELECT count(*) FROM t")?, "1");
        Ok(())
    }

    #[test]
    fn a_second_standby_promoted_waits_for_no_standby() -> TestResult {
        let primary = PostgresServer::start()?;
        let _synchronous = primary.start_standby(Replication::Synchronous)?;
        let second = primary.start_standby(Replication::Asynchronous)?;
        primary.stop_immediate()?;
        second.promote()?;
        assert_eq!(second.psql("SHOW synchronous_standby_names")?, "");
        // A commit returns: nothing to wait for.
        second.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")?;
        Ok(())
    }

    #[test]
    fn an_asynchronous_standby_streams_and_can_be_stopped_and_started() -> TestResult {
        let primary = PostgresServer::start()?;
        let standby = primary.start_standby(Replication::Asynchronous)?;
        assert_eq!(primary.psql("SHOW synchronous_standby_names")?, "");
        standby.stop_immediate()?;
        // Nothing waits for an asynchronous standby.
        primary.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")?;
        standby.start_again()?;
        primary.wait_for_standby(&standby, Replication::Asynchronous)?;
        primary.wait_for_replay(&standby)?;
        assert_eq!(standby.psql("SELECT v FROM t")?, "1");
        Ok(())
    }

    #[test]
    fn drop_of_a_paused_server_stops_it() -> TestResult {
        let pg = PostgresServer::start()?;
        let postmaster = pg.postmaster_pid()?;
        pg.pause()?;
        let started = Instant::now();
        drop(pg);
        assert!(has_exited(postmaster));
        // Drop resumes before a fast stop; it must not have needed the fallbacks' timeouts.
        assert!(
            started.elapsed() < STOP_TIMEOUT,
            "took {:?}",
            started.elapsed()
        );
        Ok(())
    }
}
