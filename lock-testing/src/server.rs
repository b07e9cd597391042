//! [`RedisServer`]: private `redis-server` child processes, and the process helpers they need.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use tempfile::TempDir;

use super::tls::{TlsCa, TlsFiles};
use super::TestingError;

/// Environment variable naming the `redis-server` binary to run instead of the one on `PATH`.
const BIN_ENV: &str = "REDIS_SERVER_BIN";

pub(super) const START_TIMEOUT: Duration = Duration::from_secs(10);

/// `stop` falls back to SIGKILL after this, so a wedged server cannot hang a test suite.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Upper bound for one readiness probe; something that accepts connections on our port but does
/// not answer is found out by the next probe instead of stalling the whole start-up budget.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long `stop` waits for the connection and the reply of `SHUTDOWN`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// How often `spawn` picks a new port after losing a race for the previous one.
const SPAWN_ATTEMPTS: u32 = 8;

/// Ports are picked below Linux's default ephemeral range (32768-60999) and macOS's
/// (49152-65535): outgoing connections take their local ports from there, and one of them could
/// otherwise occupy our port while the server is down between `stop` and `start`.
const PORT_RANGE_START: u16 = 20_000;
const PORT_RANGE_LEN: u16 = 12_000;

const LOG_TAIL_LINES: usize = 20;

/// Characters a password must not carry unescaped in the user-info part of a URL: everything
/// but the RFC 3986 "unreserved" characters.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Configures and starts a [`RedisServer`]: TLS, a password, extra `redis-server` arguments.
///
/// ```no_run
/// use distlock_testing::RedisServer;
///
/// # fn example() -> Result<(), distlock_testing::TestingError> {
/// let server = RedisServer::builder()
///     .tls(true)
///     .password("s3cret")
///     .args(["--maxmemory", "10mb"])
///     .spawn()?;
/// assert!(server.is_tls());
/// assert_eq!(server.password(), Some("s3cret"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
#[must_use = "a builder does nothing until spawn() is called"]
pub struct RedisServerBuilder {
    tls: bool,
    /// The CA that signs the certificate of a TLS server; `None` makes one per server.
    tls_ca: Option<Arc<TlsCa>>,
    password: Option<String>,
    args: Vec<String>,
    dies_with_process: bool,
    /// Sentinel directives: start `redis-server sentinel.conf --sentinel` instead of a data
    /// server. See [`RedisServerBuilder::sentinel`].
    sentinel: Option<String>,
}

impl fmt::Debug for RedisServerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServerBuilder")
            .field("tls", &self.tls)
            .field("shared_tls_ca", &self.tls_ca.is_some())
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .field("args", &self.args)
            .field("sentinel", &self.sentinel)
            .finish()
    }
}

impl RedisServerBuilder {
    /// A builder for a plain-TCP server without a password; the same as
    /// [`RedisServer::builder`].
    pub fn new() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// Whether the server speaks TLS only (default `false`).
    ///
    /// A TLS server gets a certificate authority of its own, made at spawn time, and a
    /// certificate signed by it for `localhost` and `127.0.0.1`; the plain-TCP port is off.
    /// Clients must trust [`RedisServer::ca_cert_pem`]. Client certificates are not asked for.
    pub fn tls(mut self, tls: bool) -> RedisServerBuilder {
        self.tls = tls;
        self
    }

    /// Makes the server speak TLS only, with a certificate signed by `ca` instead of a CA of its
    /// own; for the nodes of a TLS [`RedisCluster`](super::RedisCluster), which must trust
    /// each other. Clients trust `ca` ([`RedisServer::ca_cert_pem`] is its certificate).
    pub(super) fn tls_ca(mut self, ca: Arc<TlsCa>) -> RedisServerBuilder {
        self.tls = true;
        self.tls_ca = Some(ca);
        self
    }

    /// Makes the server require this password (`--requirepass`) from the default user.
    ///
    /// An empty password means none, as it does for `redis-server`.
    pub fn password(mut self, password: impl Into<String>) -> RedisServerBuilder {
        let password = password.into();
        self.password = Some(password).filter(|password| !password.is_empty());
        self
    }

    /// Adds one `redis-server` argument, such as `"--maxmemory"` or `"10mb"`.
    ///
    /// Extra arguments come after the defaults, so they override them (`["--save", "60 1"]`
    /// turns snapshots back on); do not override `--port`, `--tls-port`, `--bind`, `--dir`,
    /// `--logfile` or the TLS file options.
    pub fn arg(mut self, arg: impl Into<String>) -> RedisServerBuilder {
        self.args.push(arg.into());
        self
    }

    /// Adds several `redis-server` arguments; see [`arg`](Self::arg).
    pub fn args<I, S>(mut self, args: I) -> RedisServerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the server with a parent-death signal (Linux), for servers started from a thread
    /// that lives as long as the process: see [`RedisServer::process_wide`].
    pub(super) fn dies_with_process(mut self, dies_with_process: bool) -> RedisServerBuilder {
        self.dies_with_process = dies_with_process;
        self
    }

    /// Starts a Redis Sentinel (`redis-server <dir>/sentinel.conf --sentinel`) instead of a data
    /// server, for [`RedisSentinel`](super::RedisSentinel).
    ///
    /// `directives` (such as `sentinel monitor ...` lines) go into a `sentinel.conf` that is
    /// written once at spawn time into the server's own directory, after `port`, `bind
    /// 127.0.0.1`, `daemonize no` and `dir`; Sentinel rewrites that file with what it learns,
    /// and a restart reads it back. The other defaults (log file, no persistence) are passed
    /// on the command line as for a data server; TLS and a password are not supported.
    pub(super) fn sentinel(mut self, directives: impl Into<String>) -> RedisServerBuilder {
        self.sentinel = Some(directives.into());
        self
    }

    /// Starts `redis-server` on a free loopback port and waits until it answers `PING`.
    ///
    /// The binary is `REDIS_SERVER_BIN` if that is set, otherwise `redis-server` from `PATH`.
    /// If another process takes the chosen port before the server binds it, another port is
    /// tried. The builder can spawn any number of servers.
    pub fn spawn(&self) -> Result<RedisServer, TestingError> {
        let bin = find_redis_server(std::env::var_os(BIN_ENV), std::env::var_os("PATH"))?;
        let mut attempt = 1;
        loop {
            let port = pick_port()?;
            let dir = tempfile::Builder::new()
                .prefix(&format!("distlock-redis-{port}-"))
                .tempdir()?;
            // redis-server changes into --dir before it opens --logfile, so paths must be
            // absolute; canonical, so that they stay valid whatever the temp dir links to.
            let dir_path = std::fs::canonicalize(dir.path())?;
            let tls = match (&self.tls_ca, self.tls) {
                (_, false) => None,
                (Some(ca), true) => Some(TlsFiles::create_signed_by(&dir_path, ca)?),
                (None, true) => Some(TlsFiles::create(&dir_path)?),
            };
            let sentinel_config = match &self.sentinel {
                Some(directives) => {
                    let path = dir_path.join("sentinel.conf");
                    std::fs::write(
                        &path,
                        format!(
                            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir \"{}\"\n{directives}\n",
                            dir_path.display()
                        ),
                    )?;
                    Some(path)
                }
                None => None,
            };
            let mut server = RedisServer {
                port,
                bin: bin.clone(),
                extra_args: self.args.clone(),
                password: self.password.clone(),
                tls,
                sentinel_config,
                dir_path,
                _dir: dir,
                generation: 0,
                child: Mutex::new(None),
                dies_with_process: self.dies_with_process,
            };
            match server.start() {
                Ok(()) => return Ok(server),
                Err(TestingError::PortInUse { .. }) if attempt < SPAWN_ATTEMPTS => {
                    tracing::debug!(
                        port,
                        attempt,
                        "port taken before redis-server bound it; retrying"
                    );
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// A private `redis-server` child process on a loopback port, for tests.
///
/// The server listens on `127.0.0.1` only, keeps no data on disk (`--save "" --appendonly no`)
/// and works in a temporary directory of its own. Dropping the value kills the process and
/// removes the directory. [`RedisServer::builder`] starts servers with TLS or a password.
///
/// The methods are blocking and need no async runtime, so they work in plain `#[test]`s as well
/// as inside `#[tokio::test]`s.
pub struct RedisServer {
    /// The port the server listens on: the TLS port of a TLS server.
    port: u16,
    bin: PathBuf,
    extra_args: Vec<String>,
    password: Option<String>,
    /// Certificates and keys in `dir`; `None` for a plain-TCP server.
    tls: Option<TlsFiles>,
    /// The `sentinel.conf` of a Sentinel, in `dir`; `None` for a data server.
    sentinel_config: Option<PathBuf>,
    /// The canonical path of `dir`.
    dir_path: PathBuf,
    /// Removes the directory when dropped, after `Drop for RedisServer` killed the process.
    _dir: TempDir,
    /// Counts starts; each start logs to files of its own so a start-up error shows only the
    /// lines of the failed start.
    generation: u64,
    /// `None` while stopped. Behind a mutex so `pause`, `resume` and `is_running` can take
    /// `&self` and a server can be shared between tasks.
    child: Mutex<Option<Child>>,
    /// Started with a parent-death signal (Linux), from a thread that never ends: see
    /// [`RedisServer::process_wide`].
    dies_with_process: bool,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // try_lock: Debug must not deadlock if it is ever called while the lock is held.
        let pid = self
            .child
            .try_lock()
            .ok()
            .and_then(|child| child.as_ref().map(Child::id));
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("pid", &pid)
            .field("tls", &self.is_tls())
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .field("dir", &self.dir_path)
            .field("extra_args", &self.extra_args)
            .finish()
    }
}

/// Runs `spawn` on a thread that lives as long as the process and returns what
/// it made: processes started with a parent-death signal die with the thread that
/// forked them, so that thread must outlive every test. For the `process_wide`
/// servers and clusters.
pub(super) fn spawn_for_the_process<T: Send + 'static>(
    what: &str,
    spawn: impl FnOnce() -> Result<T, TestingError> + Send + 'static,
) -> Result<T, String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(format!("distlock-testing-{what}"))
        .spawn(move || {
            let _ = sender.send(spawn().map_err(|e| e.to_string()));
            loop {
                std::thread::park();
            }
        });
    match spawned {
        Ok(_) => receiver
            .recv()
            .unwrap_or_else(|_| Err(format!("the {what} thread ended"))),
        Err(e) => Err(e.to_string()),
    }
}

impl RedisServer {
    /// One plain server for the whole test binary, started on first call and shared
    /// by every test in the process (each `#[tokio::test]` has a runtime of its own;
    /// this server outlives them all). Use it where tests must agree on one URL, such
    /// as `DISTLOCK_REDIS_URL` for the default manager; give tests that flush, stop or
    /// pause their server a [`RedisServer`] of their own.
    ///
    /// It is never dropped: on Linux it is started from a thread that lives as long as
    /// the process, with a parent-death signal, so the kernel kills it when the test
    /// process exits, even after a panic or `kill -9`. Elsewhere it outlives the
    /// process; stop it by hand.
    pub fn process_wide() -> Result<&'static RedisServer, TestingError> {
        static SHARED: OnceLock<Result<RedisServer, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                spawn_for_the_process("server", || {
                    let mut builder = RedisServerBuilder::new();
                    builder.dies_with_process = true;
                    builder.spawn()
                })
            })
            .as_ref()
            .map_err(|e| TestingError::Io(io::Error::other(format!("process-wide server: {e}"))))
    }

    /// A builder for a server with TLS, a password or extra arguments.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::new()
    }

    /// Starts a plain-TCP `redis-server` without a password on a free loopback port and waits
    /// until it answers `PING`; short for `RedisServer::builder().spawn()`.
    ///
    /// The binary is `REDIS_SERVER_BIN` if that is set, otherwise `redis-server` from `PATH`.
    /// If another process takes the chosen port before the server binds it, another port is
    /// tried.
    pub fn spawn() -> Result<RedisServer, TestingError> {
        RedisServerBuilder::new().spawn()
    }

    /// Like [`spawn`](Self::spawn), with extra `redis-server` arguments such as
    /// `["--maxmemory", "10mb"]`; short for `RedisServer::builder().args(extra).spawn()`.
    ///
    /// They come after the defaults, so they override them (`["--save", "60 1"]` turns
    /// snapshots back on); do not override `--port`, `--bind`, `--dir` or `--logfile`.
    pub fn spawn_with_args(extra: &[&str]) -> Result<RedisServer, TestingError> {
        RedisServerBuilder::new()
            .args(extra.iter().copied())
            .spawn()
    }

    /// The TCP port the server listens on (the TLS port of a TLS server); it stays the same
    /// across `stop`/`start`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address the server listens on (`127.0.0.1:PORT`), e.g. for
    /// [`FaultProxy::start`](super::FaultProxy::start).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The connection URL: `redis://127.0.0.1:PORT`, or `rediss://127.0.0.1:PORT` for a TLS
    /// server, with the password in it (`redis://:PASSWORD@127.0.0.1:PORT`, percent-encoded)
    /// when one is set.
    ///
    /// Clients of a TLS server must trust [`ca_cert_pem`](Self::ca_cert_pem); the system's
    /// roots do not include it.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!(
                "{}://:{}@127.0.0.1:{}",
                self.scheme(),
                utf8_percent_encode(password, USERINFO),
                self.port
            ),
            None => self.url_without_password(),
        }
    }

    /// The connection URL without the password: `redis://127.0.0.1:PORT` or
    /// `rediss://127.0.0.1:PORT`.
    pub fn url_without_password(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.port)
    }

    fn scheme(&self) -> &'static str {
        if self.is_tls() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// Whether the server speaks TLS (and only TLS).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The PEM certificate of the authority that signed a TLS server's certificate, for
    /// clients to trust; `None` for a plain-TCP server.
    pub fn ca_cert_pem(&self) -> Option<&[u8]> {
        self.tls.as_ref().map(TlsFiles::ca_pem)
    }

    /// The file holding [`ca_cert_pem`](Self::ca_cert_pem), in the server's temporary
    /// directory; `None` for a plain-TCP server.
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.tls.as_ref().map(TlsFiles::ca_path)
    }

    /// The password the server requires, if any.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The server's process id, or `None` while it is not running.
    pub fn pid(&self) -> Option<u32> {
        live_pid(&mut self.lock_child())
    }

    /// The log file of the current (or last) run of the server.
    pub fn log_path(&self) -> PathBuf {
        self.dir_path.join(format!("redis-{}.log", self.generation))
    }

    /// Whether the server process is alive (a paused server counts as running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// A `redis::Client` for [`url`](Self::url) that trusts the server's certificate authority
    /// if it speaks TLS.
    fn redis_client(&self) -> Result<redis::Client, TestingError> {
        match &self.tls {
            Some(tls) => {
                // rustls needs a process-wide crypto provider; an error only means one is
                // installed already.
                let _ = rustls::crypto::ring::default_provider().install_default();
                Ok(redis::Client::build_with_tls(
                    self.url(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(tls.ca_pem().to_vec()),
                    },
                )?)
            }
            None => Ok(redis::Client::open(self.url())?),
        }
    }

    /// Opens a multiplexed async connection to the server (default redis-rs timeouts), over
    /// TLS and logged in as needed.
    pub async fn client(&self) -> Result<redis::aio::MultiplexedConnection, TestingError> {
        let client = self.redis_client()?;
        Ok(client.get_multiplexed_async_connection().await?)
    }

    /// Opens a blocking connection to the server, over TLS and logged in as needed, with
    /// connect, read and write timeouts of 5 s.
    pub fn blocking_client(&self) -> Result<redis::Connection, TestingError> {
        self.blocking_client_with_timeout(Duration::from_secs(5))
    }

    fn blocking_client_with_timeout(
        &self,
        timeout: Duration,
    ) -> Result<redis::Connection, TestingError> {
        let timeout = timeout.max(Duration::from_millis(1));
        let conn = self.redis_client()?.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        Ok(conn)
    }

    /// Shuts the server down without saving and waits for the process to exit.
    ///
    /// A paused server is resumed first. If it does not exit within 10 s it is killed. Does
    /// nothing if the server is not running.
    pub fn stop(&mut self) -> Result<(), TestingError> {
        let port = self.port;
        let mut guard = self.lock_child();
        let Some(pid) = live_pid(&mut guard) else {
            *guard = None;
            return Ok(());
        };
        // A stopped process would never read the SHUTDOWN nor handle SIGTERM.
        signal(pid, Signal::SIGCONT)?;
        if let Err(err) = self.send_shutdown() {
            tracing::debug!(port, error = %err, "SHUTDOWN NOSAVE failed; sending SIGTERM");
            signal(pid, Signal::SIGTERM)?;
        }
        let Some(child) = guard.as_mut() else {
            return Ok(());
        };
        if wait_timeout(child, STOP_TIMEOUT)?.is_none() {
            tracing::warn!(
                port,
                pid,
                "redis-server did not shut down in time; killing it"
            );
            child.kill()?;
            child.wait()?;
        }
        *guard = None;
        Ok(())
    }

    /// Kills the server with SIGKILL (as a crash would) and reaps the process.
    ///
    /// Does nothing if the server is not running.
    pub fn kill(&mut self) -> Result<(), TestingError> {
        let mut guard = self.lock_child();
        if let Some(child) = guard.as_mut() {
            // std's kill is SIGKILL and is a no-op for a child that was already reaped.
            child.kill()?;
            child.wait()?;
        }
        *guard = None;
        Ok(())
    }

    /// Freezes the server with SIGSTOP: connections stay open but nothing is answered.
    pub fn pause(&self) -> Result<(), TestingError> {
        let pid = self.pid().ok_or(TestingError::NotRunning)?;
        signal(pid, Signal::SIGSTOP)?;
        Ok(())
    }

    /// Lets a paused server go on with SIGCONT.
    pub fn resume(&self) -> Result<(), TestingError> {
        let pid = self.pid().ok_or(TestingError::NotRunning)?;
        signal(pid, Signal::SIGCONT)?;
        Ok(())
    }

    /// Stops the server if it runs and starts it again on the same port, with the same TLS
    /// certificates and password.
    ///
    /// With the default arguments the new server starts empty; if persistence was turned on
    /// with extra arguments, it loads what was saved.
    pub fn restart(&mut self) -> Result<(), TestingError> {
        self.stop()?;
        self.start()
    }

    /// Starts the server again after [`stop`](Self::stop) or [`kill`](Self::kill), on the same
    /// port (with the same TLS certificates and password), and waits until it answers `PING`.
    ///
    /// Does nothing if the server is running. Fails with [`TestingError::PortInUse`] if another
    /// process took the port meanwhile.
    pub fn start(&mut self) -> Result<(), TestingError> {
        if self.is_running() {
            return Ok(());
        }
        self.generation += 1;
        let log = self.log_path();
        // Errors found before the log file is opened (e.g. a bad argument) only reach stderr.
        let stderr = File::create(self.stderr_path())?;
        let mut command = Command::new(&self.bin);
        if let Some(config) = &self.sentinel_config {
            // The configuration file must be the first argument.
            command.arg(config).arg("--sentinel");
        }
        match &self.tls {
            Some(tls) => {
                command
                    .args(["--port", "0", "--tls-port"])
                    .arg(self.port.to_string())
                    .arg("--tls-cert-file")
                    .arg(tls.cert_path())
                    .arg("--tls-key-file")
                    .arg(tls.key_path())
                    .arg("--tls-ca-cert-file")
                    .arg(tls.ca_path())
                    .args(["--tls-auth-clients", "no"]);
            }
            None => {
                command.arg("--port").arg(self.port.to_string());
            }
        }
        if let Some(password) = &self.password {
            command.arg("--requirepass").arg(password);
        }
        #[cfg(target_os = "linux")]
        if self.dies_with_process {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec and only makes
            // one prctl(2) system call, which is async-signal-safe; it allocates nothing.
            unsafe {
                command.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                        .map_err(io::Error::from)
                });
            }
        }
        let child = command
            .args(["--bind", "127.0.0.1", "--daemonize", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir_path)
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        *self.lock_child() = Some(child);
        let ready = self.wait_ready();
        if ready.is_err() {
            let mut guard = self.lock_child();
            if let Some(mut child) = guard.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        ready
    }

    fn stderr_path(&self) -> PathBuf {
        self.dir_path
            .join(format!("redis-{}.stderr", self.generation))
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        // The guarded state stays consistent even if a holder panicked, so poisoning is moot.
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_ready(&self) -> Result<(), TestingError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut backoff = Duration::from_millis(2);
        loop {
            let pid = {
                let mut guard = self.lock_child();
                let Some(child) = guard.as_mut() else {
                    return Err(TestingError::NotRunning);
                };
                if let Some(status) = child.try_wait()? {
                    let log_tail = self.log_tail();
                    return Err(if log_tail.contains("Address already in use") {
                        TestingError::PortInUse {
                            port: self.port,
                            log_tail,
                        }
                    } else {
                        TestingError::Exited {
                            port: self.port,
                            status,
                            log_tail,
                        }
                    });
                }
                child.id()
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            match self.probe(remaining.min(PROBE_TIMEOUT)) {
                Ok(answering) if answering == pid => return Ok(()),
                Ok(other) => {
                    // Another server answers on our port; ours cannot bind it and will exit.
                    tracing::debug!(
                        port = self.port,
                        other,
                        "port answered by another redis-server"
                    );
                    return Err(TestingError::PortInUse {
                        port: self.port,
                        log_tail: self.log_tail(),
                    });
                }
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                return Err(TestingError::StartTimeout {
                    port: self.port,
                    log_tail: self.log_tail(),
                });
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// Sends `PING` and `INFO server` and returns the pid of the server that answered, so that a
    /// server of another test that grabbed our port is not mistaken for ours.
    fn probe(&self, timeout: Duration) -> Result<u32, TestingError> {
        let mut conn = self.blocking_client_with_timeout(timeout)?;
        redis::cmd("PING").exec(&mut conn)?;
        let info: redis::InfoDict = redis::cmd("INFO").arg("server").query(&mut conn)?;
        info.get::<u32>("process_id")
            .ok_or_else(|| TestingError::Io(io::Error::other("INFO server has no process_id")))
    }

    /// Sends `SHUTDOWN NOSAVE NOW`; `NOW` keeps Redis 7 from waiting for lagging replicas. Older
    /// servers reject it, and the caller falls back to SIGTERM.
    fn send_shutdown(&self) -> Result<(), TestingError> {
        let mut conn = self.blocking_client_with_timeout(SHUTDOWN_TIMEOUT)?;
        match redis::cmd("SHUTDOWN")
            .arg("NOSAVE")
            .arg("NOW")
            .exec(&mut conn)
        {
            // A successful SHUTDOWN has no reply: the server just closes the connection.
            Err(err) if err.is_io_error() || err.is_connection_dropped() => Ok(()),
            Err(err) => Err(err.into()),
            Ok(()) => Err(TestingError::Io(io::Error::other(
                "SHUTDOWN answered OK but the server went on",
            ))),
        }
    }

    pub(super) fn log_tail(&self) -> String {
        let mut tail = file_tail(&self.log_path());
        let stderr = file_tail(&self.stderr_path());
        if !stderr.trim().is_empty() {
            if !tail.is_empty() {
                tail.push('\n');
            }
            tail.push_str("stderr:\n");
            tail.push_str(&stderr);
        }
        tail
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut child) = child {
            if let Ok(None) = child.try_wait() {
                // POSIX already lets SIGKILL end a stopped process; SIGCONT is cheap insurance.
                let _ = signal(child.id(), Signal::SIGCONT);
                let _ = child.kill();
            }
            // SIGKILL cannot be ignored, so this wait is short; it keeps zombies from piling up.
            let _ = child.wait();
        }
        // `self._dir` (a TempDir) removes the directory when the fields are dropped, now that
        // the process is gone.
    }
}

/// The pid of a child that has not exited. Clears `slot` if the child exited on its own.
fn live_pid(slot: &mut Option<Child>) -> Option<u32> {
    let child = slot.as_mut()?;
    match child.try_wait() {
        Ok(None) => Some(child.id()),
        Ok(Some(_)) | Err(_) => {
            *slot = None;
            None
        }
    }
}

/// Sends `sig` to `pid`, which must be an unreaped child so that it cannot name a recycled pid.
fn signal(pid: u32, sig: Signal) -> io::Result<()> {
    let pid = i32::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)?;
    Ok(())
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(20));
    }
}

fn file_tail(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => String::new(),
        Err(err) => format!("(could not read {}: {err})", path.display()),
    }
}

/// Finds `redis-server`: `env_override` (the value of `REDIS_SERVER_BIN`) if set, otherwise on
/// `path_var`. Takes both as arguments so tests need not change process-global variables.
fn find_redis_server(
    env_override: Option<OsString>,
    path_var: Option<OsString>,
) -> Result<PathBuf, TestingError> {
    if let Some(bin) = env_override.filter(|bin| !bin.is_empty()) {
        let bin = PathBuf::from(bin);
        // A bare name is looked up on PATH, as a shell would.
        let is_bare_name = bin.parent().is_some_and(|dir| dir.as_os_str().is_empty());
        let found = if is_bare_name {
            find_on_path(bin.as_os_str(), path_var.as_deref())
        } else {
            Some(bin.clone()).filter(|bin| is_executable_file(bin))
        };
        return found.ok_or(TestingError::RedisServerNotFound {
            env_override: Some(bin),
        });
    }
    find_on_path(OsStr::new("redis-server"), path_var.as_deref())
        .ok_or(TestingError::RedisServerNotFound { env_override: None })
}

fn find_on_path(name: &OsStr, path_var: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path_var?)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable_file(candidate))
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Picks a port nothing listens on right now. The server binds it a little later, so the
/// caller must still cope with losing a race for it.
pub(super) fn pick_port() -> io::Result<u16> {
    // fastrand's generator is seeded randomly per thread, so parallel test processes do not
    // march through the same ports.
    for _ in 0..64 {
        let port = fastrand::u16(PORT_RANGE_START..PORT_RANGE_START + PORT_RANGE_LEN);
        if StdTcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    // The range is crowded; take whatever the kernel hands out.
    Ok(StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{ping, process_exists, TestResult};
    use tokio::time::timeout;

    #[tokio::test]
    async fn spawn_answers_ping_on_its_port() -> TestResult {
        let server = RedisServer::spawn()?;
        assert_ne!(server.port(), 6379);
        assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
        assert_eq!(
            server.addr(),
            SocketAddr::from(([127, 0, 0, 1], server.port()))
        );
        assert!(server.is_running());
        assert!(server.pid().is_some());
        let mut conn = server.client().await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        let save: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("save")
            .query_async(&mut conn)
            .await?;
        assert_eq!(save, ["save", ""]);
        Ok(())
    }

    #[tokio::test]
    async fn pause_stalls_replies_until_resume() -> TestResult {
        let server = RedisServer::spawn()?;
        let mut conn = server.client().await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        server.pause()?;
        assert!(server.is_running(), "a paused server still runs");
        assert!(timeout(Duration::from_millis(300), ping(&mut conn))
            .await
            .is_err());
        server.resume()?;
        assert_eq!(
            timeout(Duration::from_secs(5), ping(&mut conn)).await??,
            "PONG"
        );
        Ok(())
    }

    #[tokio::test]
    async fn kill_then_start_uses_the_same_port() -> TestResult {
        let mut server = RedisServer::spawn()?;
        let port = server.port();
        let pid = server.pid().ok_or("no pid")?;
        server.kill()?;
        assert!(!server.is_running());
        assert_eq!(server.pid(), None);
        assert!(!process_exists(pid));
        assert!(matches!(server.pause(), Err(TestingError::NotRunning)));
        assert!(server.client().await.is_err());
        server.start()?;
        assert_eq!(server.port(), port);
        assert!(server.is_running());
        let mut conn = server.client().await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn restart_gives_an_empty_server() -> TestResult {
        let mut server = RedisServer::spawn()?;
        let port = server.port();
        let mut conn = server.client().await?;
        let () = redis::cmd("SET")
            .arg("key")
            .arg("value")
            .query_async(&mut conn)
            .await?;
        server.restart()?;
        assert_eq!(server.port(), port);
        let mut conn = server.client().await?;
        let value: Option<String> = redis::cmd("GET").arg("key").query_async(&mut conn).await?;
        assert_eq!(value, None);
        Ok(())
    }

    #[test]
    fn stop_ends_a_paused_server_promptly() -> TestResult {
        let mut server = RedisServer::spawn()?;
        let pid = server.pid().ok_or("no pid")?;
        server.pause()?;
        let started = Instant::now();
        server.stop()?;
        assert!(
            started.elapsed() < STOP_TIMEOUT,
            "stop fell back to its timeout"
        );
        assert!(!server.is_running());
        assert!(!process_exists(pid));
        server.stop()?; // stopping twice is fine
        server.start()?;
        assert!(server.is_running());
        Ok(())
    }

    #[test]
    fn drop_kills_the_process_and_removes_its_dir() -> TestResult {
        let server = RedisServer::spawn()?;
        let pid = server.pid().ok_or("no pid")?;
        let dir = server.log_path().parent().ok_or("no dir")?.to_path_buf();
        assert!(dir.is_dir());
        server.pause()?;
        drop(server);
        assert!(!process_exists(pid));
        assert!(!dir.exists());
        Ok(())
    }

    #[test]
    fn start_reports_a_taken_port() -> TestResult {
        let mut server = RedisServer::spawn()?;
        server.kill()?;
        let _squatter = StdTcpListener::bind(server.addr())?;
        match server.start() {
            Err(TestingError::PortInUse { port, log_tail }) => {
                assert_eq!(port, server.port());
                assert!(log_tail.contains("Address already in use"), "{log_tail}");
            }
            other => panic!("expected PortInUse, got {other:?}"),
        }
        assert!(!server.is_running());
        Ok(())
    }

    #[test]
    fn bad_argument_error_shows_the_server_output() {
        match RedisServer::spawn_with_args(&["--no-such-option", "1"]) {
            Err(err @ TestingError::Exited { .. }) => {
                let message = err.to_string();
                assert!(message.contains("Bad directive"), "{message}");
            }
            other => panic!("expected Exited, got {other:?}"),
        }
    }

    #[test]
    fn missing_binary_error_says_how_to_install() {
        let err = find_redis_server(None, Some("/nonexistent-distlock-dir".into()))
            .expect_err("no redis-server there");
        assert_eq!(
            err.to_string(),
            "redis-server was not found on PATH; install it (Debian/Ubuntu: `apt-get install \
             redis-server`, macOS: `brew install redis`) or set REDIS_SERVER_BIN to its path"
        );
        let err = find_redis_server(
            Some("/nonexistent-distlock-dir/redis-server".into()),
            std::env::var_os("PATH"),
        )
        .expect_err("REDIS_SERVER_BIN names nothing");
        let message = err.to_string();
        assert!(
            message.contains("REDIS_SERVER_BIN is set to `/nonexistent-distlock-dir/redis-server`"),
            "{message}"
        );
        assert!(
            message.contains("apt-get install redis-server"),
            "{message}"
        );
    }

    #[test]
    fn binary_lookup_honours_the_override() -> TestResult {
        let path = std::env::var_os("PATH");
        let on_path = find_redis_server(None, path.clone())?;
        let by_name = find_redis_server(Some("redis-server".into()), path.clone())?;
        assert_eq!(on_path, by_name);
        let by_path = find_redis_server(Some(on_path.clone().into_os_string()), None)?;
        assert_eq!(by_path, on_path);
        // Empty counts as unset, as it does for PATH-like variables in shells.
        assert_eq!(find_redis_server(Some(OsString::new()), path)?, on_path);
        Ok(())
    }

    /// A client that trusts the server's CA (if any) but sends no password.
    async fn unauthenticated(
        server: &RedisServer,
    ) -> Result<redis::aio::MultiplexedConnection, redis::RedisError> {
        let url = server.url_without_password();
        let client = match server.ca_cert_pem() {
            Some(pem) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.to_vec()),
                },
            )?,
            None => redis::Client::open(url)?,
        };
        client.get_multiplexed_async_connection().await
    }

    /// Whether the log of a run says the server was shut down by the SHUTDOWN command (and not
    /// by the SIGTERM fallback).
    fn shut_down_by_command(log: &Path) -> bool {
        std::fs::read_to_string(log)
            .map(|text| text.contains("User requested shutdown"))
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn tls_server_answers_ping_through_client() -> TestResult {
        let server = RedisServer::builder().tls(true).spawn()?;
        assert!(server.is_tls());
        assert_eq!(server.password(), None);
        assert_eq!(
            server.url(),
            format!("rediss://127.0.0.1:{}", server.port())
        );
        assert_eq!(server.url(), server.url_without_password());
        let pem = server.ca_cert_pem().ok_or("no CA")?;
        assert!(pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
        let path = server.ca_cert_path().ok_or("no CA path")?;
        assert_eq!(std::fs::read(path)?, pem);
        let mut conn = server.client().await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        let mut blocking = server.blocking_client()?;
        let pong: String = redis::cmd("PING").query(&mut blocking)?;
        assert_eq!(pong, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn plain_tcp_client_to_the_tls_port_fails() -> TestResult {
        let server = RedisServer::builder().tls(true).spawn()?;
        let plain_url = format!("redis://127.0.0.1:{}", server.port());
        let attempt = timeout(Duration::from_secs(5), async {
            let mut conn = redis::Client::open(plain_url)?
                .get_multiplexed_async_connection()
                .await?;
            ping(&mut conn).await
        })
        .await?;
        assert!(
            attempt.is_err(),
            "plain TCP to a TLS port answered: {attempt:?}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn plain_server_has_no_tls_and_no_password() -> TestResult {
        let server = RedisServer::spawn()?;
        assert!(!server.is_tls());
        assert_eq!(server.ca_cert_pem(), None);
        assert_eq!(server.ca_cert_path(), None);
        assert_eq!(server.password(), None);
        assert_eq!(server.url(), server.url_without_password());
        Ok(())
    }

    #[tokio::test]
    async fn password_server_refuses_unauthenticated_commands() -> TestResult {
        let password = "s3cret p@ss:/";
        let server = RedisServer::builder().password(password).spawn()?;
        assert_eq!(server.password(), Some(password));
        assert_eq!(
            server.url(),
            format!("redis://:s3cret%20p%40ss%3A%2F@127.0.0.1:{}", server.port())
        );
        assert_eq!(
            server.url_without_password(),
            format!("redis://127.0.0.1:{}", server.port())
        );
        let mut anonymous = unauthenticated(&server).await?;
        let refused = ping(&mut anonymous).await.expect_err("PING without AUTH");
        assert_eq!(refused.code(), Some("NOAUTH"), "{refused}");
        let mut conn = server.client().await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        // The URL alone is enough for any client.
        let mut by_url = redis::Client::open(server.url())?
            .get_multiplexed_async_connection()
            .await?;
        assert_eq!(ping(&mut by_url).await?, "PONG");
        Ok(())
    }

    #[test]
    fn an_empty_password_means_none() -> TestResult {
        let server = RedisServer::builder().password("").spawn()?;
        assert_eq!(server.password(), None);
        let mut conn = server.blocking_client()?;
        let pong: String = redis::cmd("PING").query(&mut conn)?;
        assert_eq!(pong, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn restart_keeps_tls_and_password() -> TestResult {
        let mut server = RedisServer::builder()
            .tls(true)
            .password("pw")
            .args(["--maxmemory", "10mb"])
            .spawn()?;
        let port = server.port();
        let ca = server.ca_cert_pem().ok_or("no CA")?.to_vec();
        assert_eq!(
            server.url(),
            format!("rediss://:pw@127.0.0.1:{}", server.port())
        );
        let mut conn = server.client().await?;
        let () = redis::cmd("SET")
            .arg("key")
            .arg("value")
            .query_async(&mut conn)
            .await?;
        let first_log = server.log_path();
        server.restart()?;
        assert!(
            shut_down_by_command(&first_log),
            "stop did not use SHUTDOWN over TLS with the password"
        );
        assert_eq!(server.port(), port);
        assert!(server.is_tls());
        assert_eq!(server.password(), Some("pw"));
        assert_eq!(server.ca_cert_pem(), Some(ca.as_slice()));
        let mut conn = server.client().await?;
        let value: Option<String> = redis::cmd("GET").arg("key").query_async(&mut conn).await?;
        assert_eq!(value, None);
        let maxmemory: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory")
            .query_async(&mut conn)
            .await?;
        assert_eq!(maxmemory, ["maxmemory", "10485760"]);
        let mut anonymous = unauthenticated(&server).await?;
        let refused = ping(&mut anonymous).await.expect_err("PING without AUTH");
        assert_eq!(refused.code(), Some("NOAUTH"), "{refused}");
        Ok(())
    }

    #[test]
    fn stop_uses_shutdown() -> TestResult {
        let mut server = RedisServer::spawn()?;
        server.stop()?;
        assert!(shut_down_by_command(&server.log_path()));
        Ok(())
    }
}
