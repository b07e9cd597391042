//! A private PostgreSQL instance for the fencing-against-a-database example and
//! test: `initdb` + `pg_ctl` from the installed server binaries, in a temporary
//! directory, on a free loopback port, stopped when the handle drops.
//!
//! Shared by `examples/postgres_fencing.rs` and `tests/postgres_fencing.rs`
//! (both include this file with `#[path]`). It never touches a PostgreSQL that
//! is already running on the machine.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// How long `pg_ctl start` may wait for the server to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How many free ports to try: another process can take the port between our
/// probe releasing it and the server binding it.
const PORT_ATTEMPTS: usize = 3;

/// The user the server runs as when we are root (see [`Postgres::start`]).
const UNPRIVILEGED_USERS: [&str; 2] = ["postgres", "nobody"];

/// A running private PostgreSQL server; stopped (`pg_ctl stop -m immediate`)
/// and its data directory removed on drop.
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    run_as: Option<(u32, u32)>,
    // Dropped after `Drop::drop` has stopped the server.
    dir: tempfile::TempDir,
}

impl Postgres {
    /// Initialises a cluster in a new temporary directory and starts it on a
    /// free port of 127.0.0.1, with trust authentication (local test use only:
    /// it listens on loopback and on a unix socket inside the temporary
    /// directory), and waits until it accepts connections.
    ///
    /// `initdb`, `pg_ctl` and `postgres` refuse to run as root. When we are
    /// root (as here and on CI), they run as the unprivileged `postgres` user
    /// (created by the server package; `nobody` otherwise), with the temporary
    /// directory chowned to it. Privileges are dropped with `Command::uid` and
    /// `Command::gid` (std also clears the supplementary groups) rather than
    /// through `runuser` or `su`: no extra tool, no shell quoting, and the
    /// child's environment and exit status come through unchanged.
    pub fn start() -> Result<Postgres, String> {
        let bin = bindir()?;
        let dir = tempfile::Builder::new()
            .prefix("distlock-pg-")
            .tempdir()
            .map_err(|e| format!("create a temporary directory: {e}"))?;
        let run_as = if is_root() {
            let (uid, gid) = unprivileged_user()?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("chown {} to uid {uid}: {e}", dir.path().display()))?;
            Some((uid, gid))
        } else {
            None
        };
        let data = dir.path().join("data");
        let socket_dir = dir.path().to_path_buf();

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
            .arg("--no-sync");
        run(&mut initdb, run_as, dir.path(), "initdb")?;

        // Settings go into the configuration file rather than onto a command
        // line, so that no path needs quoting. The port is given on start.
        let mut conf = String::new();
        let _ = writeln!(conf, "\n# distlock test instance");
        let _ = writeln!(conf, "listen_addresses = '127.0.0.1'");
        let _ = writeln!(
            conf,
            "unix_socket_directories = '{}'",
            socket_dir.display().to_string().replace('\'', "''")
        );
        let _ = writeln!(conf, "fsync = off");
        let _ = writeln!(conf, "synchronous_commit = off");
        let _ = writeln!(conf, "full_page_writes = off");
        let conf_path = data.join("postgresql.conf");
        let mut existing = std::fs::read_to_string(&conf_path)
            .map_err(|e| format!("read {}: {e}", conf_path.display()))?;
        existing.push_str(&conf);
        std::fs::write(&conf_path, existing)
            .map_err(|e| format!("write {}: {e}", conf_path.display()))?;

        let log = dir.path().join("server.log");
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let mut pg_ctl = Command::new(bin.join("pg_ctl"));
            pg_ctl
                .arg("start")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .arg("-o")
                .arg(format!("-p {port}"))
                .arg("-w")
                .arg("-t")
                .arg(START_TIMEOUT.as_secs().to_string());
            match run(&mut pg_ctl, run_as, dir.path(), "pg_ctl start") {
                Ok(()) => {
                    return Ok(Postgres {
                        bin,
                        data,
                        port,
                        run_as,
                        dir,
                    })
                }
                Err(e) => {
                    // Make sure a half-started server does not outlive us.
                    let _ = stop(&bin, &data, run_as, dir.path());
                    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
                    last_error = format!("{e}\nserver log:\n{server_log}");
                }
            }
        }
        Err(last_error)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `tokio-postgres` connection string for the `postgres` database.
    pub fn connection_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=5",
            self.port
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Never panics: a failure is reported, and the temporary directory is
        // removed by `TempDir` either way.
        if let Err(e) = stop(&self.bin, &self.data, self.run_as, self.dir.path()) {
            eprintln!("stopping the private PostgreSQL on port {}: {e}", self.port);
        }
    }
}

fn stop(bin: &Path, data: &Path, run_as: Option<(u32, u32)>, cwd: &Path) -> Result<(), String> {
    let mut pg_ctl = Command::new(bin.join("pg_ctl"));
    pg_ctl
        .arg("stop")
        .arg("-D")
        .arg(data)
        .args(["-m", "immediate", "-w", "-t", "10"]);
    run(&mut pg_ctl, run_as, cwd, "pg_ctl stop")
}

/// The folder of the server binaries: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian keeps them off PATH), else PATH.
fn bindir() -> Result<PathBuf, String> {
    let mut candidates = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            candidates.push(PathBuf::from(dir));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev().map(|(_, p)| p));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
        .ok_or_else(|| {
            "PostgreSQL server binaries (initdb, pg_ctl) not found: looked in \
             `pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH. Install them \
             (Debian/Ubuntu: `apt-get install postgresql`, macOS: `brew install postgresql`)."
                .to_owned()
        })
}

fn is_root() -> bool {
    // std has no getuid(); the owner of our own /proc entry is our uid.
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata("/proc/self") {
        Ok(meta) => meta.uid() == 0,
        Err(_) => id(&["-u"]).is_some_and(|uid| uid == 0),
    }
}

/// The uid and primary gid of the first unprivileged user that exists.
fn unprivileged_user() -> Result<(u32, u32), String> {
    UNPRIVILEGED_USERS
        .iter()
        .find_map(|user| Some((id(&["-u", user])?, id(&["-g", user])?)))
        .ok_or_else(|| {
            format!(
                "running as root, and none of the users {UNPRIVILEGED_USERS:?} exists to run \
                 PostgreSQL as (initdb refuses root); install the postgresql package, which \
                 creates `postgres`"
            )
        })
}

fn id(args: &[&str]) -> Option<u32> {
    let out = Command::new("id").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// A port that was free on 127.0.0.1 a moment ago.
fn free_port() -> Result<u16, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("find a free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("find a free port: {e}"))
}

fn run(
    cmd: &mut Command,
    run_as: Option<(u32, u32)>,
    cwd: &Path,
    what: &str,
) -> Result<(), String> {
    // Run from the temporary directory: the unprivileged user may not be able
    // to read our working directory.
    cmd.current_dir(cwd);
    if let Some((uid, gid)) = run_as {
        cmd.uid(uid).gid(gid);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().map_err(|e| format!("run {what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({status}):\n{}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ))
    }
}
