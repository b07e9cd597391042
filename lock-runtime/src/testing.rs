//! Test support: private `redis-server` processes and a fault-injecting TCP proxy.
//!
//! Every [`RedisServer`] is its own `redis-server` child process on its own loopback port, with
//! persistence off and a private temporary directory, so tests can run in parallel and kill,
//! pause, flush or restart their server without disturbing each other (or a Redis the machine
//! may already run on port 6379). [`FaultProxy`] sits between a client and a server and delays,
//! black-holes or resets traffic, or drops single replies, to simulate network faults.
//!
//! This module is only compiled with the `testing` feature and only works on Unix, because it
//! pauses and kills servers with signals.
//!
//! ```no_run
//! use distlock_runtime::testing::{FaultMode, FaultProxy, RedisServer};
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

use std::collections::hash_map::RandomState;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener, TcpStream as StdTcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Environment variable naming the `redis-server` binary to run instead of the one on `PATH`.
const BIN_ENV: &str = "REDIS_SERVER_BIN";

const NOT_FOUND_HELP: &str = "redis-server was not found on PATH; install it (Debian/Ubuntu: \
     `apt-get install redis-server`, macOS: `brew install redis`) or set REDIS_SERVER_BIN to its \
     path";

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// `stop` falls back to SIGKILL after this, so a wedged server cannot hang a test suite.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Upper bound for one readiness probe; something that accepts connections on our port but does
/// not answer is found out by the next probe instead of stalling the whole start-up budget.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How often `spawn` picks a new port after losing a race for the previous one.
const SPAWN_ATTEMPTS: u32 = 8;

/// Ports are picked below Linux's default ephemeral range (32768-60999) and macOS's
/// (49152-65535): outgoing connections take their local ports from there, and one of them could
/// otherwise occupy our port while the server is down between `stop` and `start`.
const PORT_RANGE_START: u16 = 20_000;
const PORT_RANGE_LEN: u16 = 12_000;

const LOG_TAIL_LINES: usize = 20;

/// Numbers temp dirs and seeds port choice, so servers spawned by one process never collide.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Errors of [`RedisServer`].
#[derive(Debug)]
#[non_exhaustive]
pub enum TestingError {
    /// No `redis-server` binary could be found.
    RedisServerNotFound {
        /// The value of `REDIS_SERVER_BIN` if it was set but named no executable file; `None`
        /// when `PATH` was searched.
        env_override: Option<PathBuf>,
    },
    /// An I/O error while starting, signalling or waiting for the server.
    Io(io::Error),
    /// The server did not answer `PING` in time.
    StartTimeout {
        /// The port the server was started on.
        port: u16,
        /// The last lines of the server's log and standard error.
        log_tail: String,
    },
    /// The server exited before it answered `PING` (for example because of an invalid argument).
    Exited {
        /// The port the server was started on.
        port: u16,
        /// How the process ended.
        status: ExitStatus,
        /// The last lines of the server's log and standard error.
        log_tail: String,
    },
    /// Another process holds the port, so the server could not listen on it.
    PortInUse {
        /// The contested port.
        port: u16,
        /// The last lines of the server's log and standard error.
        log_tail: String,
    },
    /// The operation needs a running server, but it was stopped or killed.
    NotRunning,
    /// Opening a client connection failed.
    Redis(redis::RedisError),
}

impl fmt::Display for TestingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TestingError::RedisServerNotFound { env_override: None } => f.write_str(NOT_FOUND_HELP),
            TestingError::RedisServerNotFound {
                env_override: Some(path),
            } => write!(
                f,
                "REDIS_SERVER_BIN is set to `{}`, which is not an executable file; point it at \
                 redis-server, or unset it to use redis-server from PATH (Debian/Ubuntu: \
                 `apt-get install redis-server`, macOS: `brew install redis`)",
                path.display()
            ),
            TestingError::Io(err) => write!(f, "I/O error while managing redis-server: {err}"),
            TestingError::StartTimeout { port, log_tail } => write!(
                f,
                "redis-server on port {port} did not answer PING within {} s; last log lines:\n{}",
                START_TIMEOUT.as_secs(),
                or_empty(log_tail)
            ),
            TestingError::Exited {
                port,
                status,
                log_tail,
            } => write!(
                f,
                "redis-server on port {port} exited before answering PING ({status}); last log \
                 lines:\n{}",
                or_empty(log_tail)
            ),
            TestingError::PortInUse { port, log_tail } => write!(
                f,
                "port {port} is taken by another process, so redis-server could not listen on \
                 it; last log lines:\n{}",
                or_empty(log_tail)
            ),
            TestingError::NotRunning => {
                f.write_str("redis-server is not running (stopped or killed)")
            }
            TestingError::Redis(err) => write!(f, "could not connect to redis-server: {err}"),
        }
    }
}

fn or_empty(log_tail: &str) -> &str {
    if log_tail.trim().is_empty() {
        "(log is empty)"
    } else {
        log_tail
    }
}

impl std::error::Error for TestingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TestingError::Io(err) => Some(err),
            TestingError::Redis(err) => Some(err),
            _ => None,
        }
    }
}

impl From<io::Error> for TestingError {
    fn from(err: io::Error) -> Self {
        TestingError::Io(err)
    }
}

impl From<redis::RedisError> for TestingError {
    fn from(err: redis::RedisError) -> Self {
        TestingError::Redis(err)
    }
}

/// A private `redis-server` child process on a loopback port, for tests.
///
/// The server listens on `127.0.0.1` only, keeps no data on disk (`--save "" --appendonly no`)
/// and works in a temporary directory of its own. Dropping the value kills the process and
/// removes the directory.
///
/// The methods are blocking and need no async runtime, so they work in plain `#[test]`s as well
/// as inside `#[tokio::test]`s.
pub struct RedisServer {
    port: u16,
    bin: PathBuf,
    extra_args: Vec<String>,
    dir: PathBuf,
    /// Counts starts; each start logs to files of its own so a start-up error shows only the
    /// lines of the failed start.
    generation: u64,
    /// `None` while stopped. Behind a mutex so `pause`, `resume` and `is_running` can take
    /// `&self` and a server can be shared between tasks.
    child: Mutex<Option<Child>>,
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
            .field("dir", &self.dir)
            .field("extra_args", &self.extra_args)
            .finish()
    }
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port and waits until it answers `PING`.
    ///
    /// The binary is `REDIS_SERVER_BIN` if that is set, otherwise `redis-server` from `PATH`.
    /// If another process takes the chosen port before the server binds it, another port is
    /// tried.
    pub fn spawn() -> Result<RedisServer, TestingError> {
        Self::spawn_with_args(&[])
    }

    /// Like [`spawn`](Self::spawn), with extra `redis-server` arguments such as
    /// `["--maxmemory", "10mb"]`.
    ///
    /// They come after the defaults, so they override them (`["--save", "60 1"]` turns
    /// snapshots back on); do not override `--port`, `--bind`, `--dir` or `--logfile`.
    pub fn spawn_with_args(extra: &[&str]) -> Result<RedisServer, TestingError> {
        let bin = find_redis_server(std::env::var_os(BIN_ENV), std::env::var_os("PATH"))?;
        let extra_args: Vec<String> = extra.iter().map(|arg| (*arg).to_owned()).collect();
        let mut attempt = 1;
        loop {
            let port = pick_port()?;
            let dir = fresh_dir(port)?;
            let mut server = RedisServer {
                port,
                bin: bin.clone(),
                extra_args: extra_args.clone(),
                dir,
                generation: 0,
                child: Mutex::new(None),
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

    /// The TCP port the server listens on; it stays the same across `stop`/`start`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address the server listens on (`127.0.0.1:PORT`), e.g. for
    /// [`FaultProxy::start`].
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The connection URL, `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id, or `None` while it is not running.
    pub fn pid(&self) -> Option<u32> {
        live_pid(&mut self.lock_child())
    }

    /// The log file of the current (or last) run of the server.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("redis-{}.log", self.generation))
    }

    /// Whether the server process is alive (a paused server counts as running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Opens a multiplexed async connection to the server (default redis-rs timeouts).
    pub async fn client(&self) -> Result<redis::aio::MultiplexedConnection, TestingError> {
        let client = redis::Client::open(self.url())?;
        Ok(client.get_multiplexed_async_connection().await?)
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
        let Some(child) = guard.as_mut() else {
            return Ok(());
        };
        // A stopped process would never read the SHUTDOWN nor handle SIGTERM.
        signal(pid, libc::SIGCONT)?;
        if let Err(err) = send_shutdown(port) {
            tracing::debug!(port, error = %err, "SHUTDOWN NOSAVE failed; sending SIGTERM");
            signal(pid, libc::SIGTERM)?;
        }
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
        signal(pid, libc::SIGSTOP)?;
        Ok(())
    }

    /// Lets a paused server go on with SIGCONT.
    pub fn resume(&self) -> Result<(), TestingError> {
        let pid = self.pid().ok_or(TestingError::NotRunning)?;
        signal(pid, libc::SIGCONT)?;
        Ok(())
    }

    /// Stops the server if it runs and starts it again on the same port.
    ///
    /// With the default arguments the new server starts empty; if persistence was turned on
    /// with extra arguments, it loads what was saved.
    pub fn restart(&mut self) -> Result<(), TestingError> {
        self.stop()?;
        self.start()
    }

    /// Starts the server again after [`stop`](Self::stop) or [`kill`](Self::kill), on the same
    /// port, and waits until it answers `PING`.
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
        let child = Command::new(&self.bin)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--daemonize", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
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
        self.dir.join(format!("redis-{}.stderr", self.generation))
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
            match probe(self.port, remaining.min(PROBE_TIMEOUT)) {
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

    fn log_tail(&self) -> String {
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
                let _ = signal(child.id(), libc::SIGCONT);
                let _ = child.kill();
            }
            // SIGKILL cannot be ignored, so this wait is short; it keeps zombies from piling up.
            let _ = child.wait();
        }
        if let Err(err) = std::fs::remove_dir_all(&self.dir) {
            tracing::debug!(dir = %self.dir.display(), error = %err, "could not remove redis-server temp dir");
        }
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
fn signal(pid: u32, sig: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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

/// Sends `PING` and `INFO server` and returns the pid of the server that answered, so that a
/// server of another test that grabbed our port is not mistaken for ours.
fn probe(port: u16, timeout: Duration) -> io::Result<u32> {
    let timeout = timeout.max(Duration::from_millis(1));
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = StdTcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")?;
    let mut reader = BufReader::new(stream);
    let pong = read_resp_line(&mut reader)?;
    if pong != "+PONG" {
        return Err(io::Error::other(format!("PING answered with {pong:?}")));
    }
    let header = read_resp_line(&mut reader)?;
    let len: usize = header
        .strip_prefix('$')
        .and_then(|len| len.parse().ok())
        .ok_or_else(|| io::Error::other(format!("INFO answered with {header:?}")))?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .ok_or_else(|| io::Error::other("INFO server has no process_id"))
}

fn read_resp_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim_end().to_owned())
}

/// Sends `SHUTDOWN NOSAVE NOW`; `NOW` keeps Redis 7 from waiting for lagging replicas. Older
/// servers reject it, and the caller falls back to SIGTERM.
fn send_shutdown(port: u16) -> io::Result<()> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = StdTcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    stream.write_all(b"*3\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n$3\r\nNOW\r\n")?;
    let mut reply = [0u8; 256];
    // A successful SHUTDOWN has no reply: the server just closes the connection.
    match stream.read(&mut reply) {
        Ok(0) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::ConnectionReset => Ok(()),
        Ok(n) => Err(io::Error::other(format!(
            "SHUTDOWN answered with {:?}",
            String::from_utf8_lossy(&reply[..n]).trim_end()
        ))),
        Err(err) => Err(err),
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

fn random_u64() -> u64 {
    // RandomState is seeded randomly per thread and advanced per instance: enough to keep
    // parallel test processes from marching through the same ports, without a rand crate.
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(NEXT_ID.fetch_add(1, Ordering::Relaxed));
    if let Ok(now) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}

/// Picks a port nothing listens on right now. The server binds it a little later, so the
/// caller must still cope with losing a race for it.
fn pick_port() -> io::Result<u16> {
    for _ in 0..64 {
        let offset = u16::try_from(random_u64() % u64::from(PORT_RANGE_LEN)).unwrap_or(0);
        let port = PORT_RANGE_START + offset;
        if StdTcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    // The range is crowded; take whatever the kernel hands out.
    Ok(StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn fresh_dir(port: u16) -> io::Result<PathBuf> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("distlock-redis-{}-{id}-{port}", std::process::id()));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        // Left behind by an earlier, killed process that had our pid; nobody uses it any more.
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_dir_all(&dir)?;
            std::fs::create_dir(&dir)?;
        }
        Err(err) => return Err(err),
    }
    // redis-server changes into --dir before it opens --logfile, so both must be absolute.
    std::fs::canonicalize(&dir)
}

/// What a [`FaultProxy`] does with the traffic it forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultMode {
    /// Forward bytes both ways unchanged.
    Pass,
    /// Hold each chunk of bytes this long before forwarding it (in both directions).
    Delay(Duration),
    /// Keep connections open and accept new ones, but silently discard all bytes in both
    /// directions, like a network partition: clients see neither a reply nor a reset. Bytes
    /// discarded stay lost when the mode changes back.
    BlackHole,
    /// Reset (TCP RST) all open connections at once, and new ones as soon as they are accepted.
    Reset,
}

/// A TCP proxy for fault injection between clients and a Redis server.
///
/// Clients connect to [`url`](Self::url); each connection is forwarded to the upstream
/// address according to the current [`FaultMode`]. Dropping the proxy closes its listener and
/// all connections.
pub struct FaultProxy {
    local_addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<FaultMode>,
    drop_replies: Arc<AtomicUsize>,
    /// Owns the connection tasks (in a `JoinSet`), so aborting it ends them too.
    accept_task: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("local_addr", &self.local_addr)
            .field("upstream", &self.upstream)
            .field("mode", &self.mode())
            .field("drop_replies", &self.drop_replies.load(Ordering::Relaxed))
            .finish()
    }
}

impl FaultProxy {
    /// Listens on a free port of `127.0.0.1` and forwards each accepted connection to
    /// `upstream`, starting in [`FaultMode::Pass`].
    ///
    /// Must be called inside a tokio runtime (with I/O and timers enabled); the proxy's tasks
    /// run on it.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        // Report a missing runtime as an error rather than letting tokio::spawn panic.
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let local_addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(FaultMode::Pass);
        let drop_replies = Arc::new(AtomicUsize::new(0));
        let accept_task = runtime.spawn(accept_loop(
            listener,
            upstream,
            mode_rx,
            Arc::clone(&drop_replies),
        ));
        Ok(FaultProxy {
            local_addr,
            upstream,
            mode,
            drop_replies,
            accept_task,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The connection URL of the proxy, `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.local_addr.port())
    }

    /// Switches the mode; it applies at once to open and new connections.
    pub fn set_mode(&self, mode: FaultMode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> FaultMode {
        *self.mode.borrow()
    }

    /// Discards the next `n` chunks read from the server (on any connection) instead of
    /// forwarding them, while requests still pass: the server executes commands whose replies
    /// the client never sees. Replaces any count still pending; `0` cancels it.
    ///
    /// A chunk is what one read returns, normally the replies to one request or pipeline.
    /// Chunks discarded by [`FaultMode::BlackHole`] do not count.
    pub fn drop_next_replies(&self, n: usize) {
        self.drop_replies.store(n, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<FaultMode>,
    drop_replies: Arc<AtomicUsize>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    if *mode.borrow() == FaultMode::Reset {
                        reset(client);
                        continue;
                    }
                    connections.spawn(forward_connection(
                        client,
                        upstream,
                        mode.clone(),
                        Arc::clone(&drop_replies),
                    ));
                }
                Err(err) => {
                    tracing::debug!(error = %err, "fault proxy accept failed");
                    // Errors like EMFILE persist for a while; don't spin on them.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            // Reap finished connections so the set does not grow with every connection.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

enum Forwarded {
    Done,
    Reset,
    Failed(io::Error),
}

async fn forward_connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<FaultMode>,
    drop_replies: Arc<AtomicUsize>,
) {
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(err) => {
            tracing::debug!(%upstream, error = %err, "fault proxy could not reach upstream");
            // The client sees roughly what a direct connection to a dead server would show.
            reset(client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut client_buf = vec![0u8; 16 * 1024];
    let mut server_buf = vec![0u8; 16 * 1024];
    let mut client_eof = false;
    let mut server_eof = false;
    loop {
        if *mode.borrow_and_update() == FaultMode::Reset {
            reset(client);
            reset(server);
            return;
        }
        let (direction, read) = tokio::select! {
            read = client.read(&mut client_buf), if !client_eof => (Direction::ToServer, read),
            read = server.read(&mut server_buf), if !server_eof => (Direction::ToClient, read),
            changed = mode.changed() => {
                if changed.is_err() {
                    // The proxy is gone.
                    return;
                }
                continue;
            }
        };
        let (data, dst) = match direction {
            Direction::ToServer => (&client_buf[..], &mut server),
            Direction::ToClient => (&server_buf[..], &mut client),
        };
        let outcome = match read {
            Ok(0) => {
                // Pass the half-close on; the other direction may still carry data.
                let _ = dst.shutdown().await;
                match direction {
                    Direction::ToServer => client_eof = true,
                    Direction::ToClient => server_eof = true,
                }
                if client_eof && server_eof {
                    return;
                }
                Forwarded::Done
            }
            Ok(n) => forward_chunk(&data[..n], dst, direction, &mut mode, &drop_replies).await,
            Err(err) => Forwarded::Failed(err),
        };
        match outcome {
            Forwarded::Done => {}
            Forwarded::Reset => {
                reset(client);
                reset(server);
                return;
            }
            Forwarded::Failed(err) => {
                tracing::debug!(error = %err, "fault proxy connection failed");
                // Mirror the failure of one side to the other, as a broken path would.
                reset(client);
                reset(server);
                return;
            }
        }
    }
}

async fn forward_chunk(
    data: &[u8],
    dst: &mut TcpStream,
    direction: Direction,
    mode: &mut watch::Receiver<FaultMode>,
    drop_replies: &AtomicUsize,
) -> Forwarded {
    let delay = match *mode.borrow() {
        FaultMode::Pass => None,
        FaultMode::Delay(delay) => Some(delay),
        FaultMode::BlackHole => return Forwarded::Done,
        FaultMode::Reset => return Forwarded::Reset,
    };
    if direction == Direction::ToClient
        && drop_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        return Forwarded::Done;
    }
    if let Some(delay) = delay {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = reset_requested(mode) => return Forwarded::Reset,
        }
        // A partition that began while the chunk was held swallows it too.
        if *mode.borrow() == FaultMode::BlackHole {
            return Forwarded::Done;
        }
    }
    // A peer that stops reading must not keep a reset from taking effect.
    tokio::select! {
        written = dst.write_all(data) => match written {
            Ok(()) => Forwarded::Done,
            Err(err) => Forwarded::Failed(err),
        },
        () = reset_requested(mode) => Forwarded::Reset,
    }
}

/// Completes when the mode is (or becomes) [`FaultMode::Reset`].
async fn reset_requested(mode: &mut watch::Receiver<FaultMode>) {
    loop {
        if *mode.borrow_and_update() == FaultMode::Reset {
            return;
        }
        if mode.changed().await.is_err() {
            // The proxy is gone and is aborting this task; nothing will change any more.
            std::future::pending::<()>().await;
        }
    }
}

/// Closes `stream` with an RST instead of a FIN.
#[allow(deprecated)] // set_linger: a zero linger never blocks; set_zero_linger needs tokio 1.50.
fn reset(stream: TcpStream) {
    if let Err(err) = stream.set_linger(Some(Duration::ZERO)) {
        tracing::debug!(error = %err, "could not set SO_LINGER; closing without RST");
    }
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::aio::MultiplexedConnection;
    use redis::AsyncConnectionConfig;
    use tokio::time::timeout;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
        redis::cmd("PING").query_async(conn).await
    }

    /// A connection whose own response timeout is long enough to not interfere with the
    /// (shorter or longer) deadlines the tests set.
    async fn patient_client(url: String) -> redis::RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        redis::Client::open(url)?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    fn process_exists(pid: u32) -> bool {
        let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
        // SAFETY: signal 0 only checks whether the process exists.
        unsafe { libc::kill(pid, 0) == 0 }
    }

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

    #[tokio::test]
    async fn proxy_passes_traffic() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        assert_eq!(proxy.mode(), FaultMode::Pass);
        assert_eq!(proxy.url(), format!("redis://{}", proxy.local_addr()));
        assert_ne!(proxy.local_addr().port(), server.port());
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn black_hole_swallows_requests_until_pass() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        proxy.set_mode(FaultMode::BlackHole);
        assert_eq!(proxy.mode(), FaultMode::BlackHole);
        assert!(timeout(Duration::from_millis(300), ping(&mut conn))
            .await
            .is_err());
        proxy.set_mode(FaultMode::Pass);
        let mut fresh = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut fresh).await?, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn reset_breaks_open_connections_quickly() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        proxy.set_mode(FaultMode::Reset);
        let started = Instant::now();
        let result = timeout(Duration::from_secs(2), ping(&mut conn)).await?;
        assert!(result.is_err(), "PING through a reset connection answered");
        assert!(started.elapsed() < Duration::from_secs(1));
        // New connections are reset too, until the mode changes.
        assert!(patient_client(proxy.url()).await.is_err());
        proxy.set_mode(FaultMode::Pass);
        let mut fresh = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut fresh).await?, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn delay_holds_each_chunk() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        proxy.set_mode(FaultMode::Delay(Duration::from_millis(200)));
        let started = Instant::now();
        assert_eq!(ping(&mut conn).await?, "PONG");
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        Ok(())
    }

    #[tokio::test]
    async fn dropped_reply_times_out_and_the_next_connection_works() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        proxy.drop_next_replies(1);
        // The request still reaches the server: the SET happens, its reply is lost.
        let mut set = redis::cmd("SET");
        set.arg("lost").arg("reply");
        let lost = timeout(Duration::from_millis(300), set.query_async::<()>(&mut conn)).await;
        assert!(lost.is_err(), "the reply was not dropped: {lost:?}");
        let mut fresh = patient_client(proxy.url()).await?;
        let value: Option<String> = redis::cmd("GET")
            .arg("lost")
            .query_async(&mut fresh)
            .await?;
        assert_eq!(value.as_deref(), Some("reply"));
        Ok(())
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_everything() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let url = proxy.url();
        let mut conn = patient_client(url.clone()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        drop(proxy);
        let result = timeout(Duration::from_secs(2), ping(&mut conn)).await?;
        assert!(result.is_err(), "PING through a dropped proxy answered");
        assert!(patient_client(url).await.is_err());
        Ok(())
    }
}
