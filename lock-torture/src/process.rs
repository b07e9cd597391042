//! Test side of the worker processes: start them, read what they print, signal
//! them, and clean up whatever happens.
//!
//! A worker prints one event per line on stdout (`READY`, `ACQ ...`, `PROGRESS n`,
//! ...); tests wait for those lines instead of sleeping. Every [`Worker`] is killed
//! and reaped when dropped, also when a test panics, and asks the kernel to kill it
//! if the test process dies first (`PR_SET_PDEATHSIG`).

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::sync::mpsc;

/// A scratch directory for one run's logs. Removed when dropped, unless the thread
/// is panicking: then it is kept and its path printed, for a look at the logs.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Creates `$TMPDIR/distlock-torture-<name>-<pid>-<n>`.
    pub fn new(name: &str) -> RunDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "distlock-torture-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create the run directory");
        RunDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A file in the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("torture: logs kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A running worker process.
pub struct Worker {
    /// The worker number given with `--id`.
    pub id: u32,
    /// Its log file.
    pub log: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
    stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// Starts `bin --id=<id> --log=<dir>/worker-<id>.log <args...>` (arguments as
    /// `--name=value`).
    ///
    /// Call this from the test's own thread (not from a spawned task): the worker is
    /// killed when the thread that started it ends.
    pub fn spawn(bin: &Path, id: u32, dir: &RunDir, args: &[(&str, String)]) -> Worker {
        let log = dir.file(&format!("worker-{id}.log"));
        let stderr = dir.file(&format!("worker-{id}.stderr"));
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--id={id}"))
            .arg(format!("--log={}", log.display()));
        for (name, value) in args {
            cmd.arg(format!("--{name}={value}"));
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("create the stderr file"));
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("start torture-worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name(format!("worker-{id}-stdout"))
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    match line {
                        Ok(l) => {
                            if tx.send(l).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            })
            .expect("spawn the stdout reader");
        Worker {
            id,
            log,
            stdin: child.stdin.take(),
            child,
            lines,
            seen: Vec::new(),
            stderr,
            status: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> libc::pid_t {
        libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t")
    }

    fn signal(&self, sig: libc::c_int) {
        assert!(self.status.is_none(), "worker {} already exited", self.id);
        // SAFETY: plain kill(2) on our own unreaped child.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(
            rc,
            0,
            "kill({sig}) worker {}: {}",
            self.id,
            std::io::Error::last_os_error()
        );
    }

    /// Freezes the worker (SIGSTOP).
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen worker go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Kills the worker with SIGKILL and reaps it.
    pub fn kill9(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL);
        let status = self.child.wait().expect("reap the worker");
        self.status = Some(status);
        status
    }

    /// Sends one command line to the worker.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("write to worker {}: {e}", self.id));
    }

    /// Closes the worker's stdin (its signal to finish).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next line, or `None` at end of output or after `limit`.
    pub async fn next_line(&mut self, limit: Duration) -> Option<String> {
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(line)) => {
                self.seen.push(line.clone());
                Some(line)
            }
            _ => None,
        }
    }

    /// Reads lines until one satisfies `pred` and returns it; panics (with the
    /// worker's output) after `limit` or at end of output.
    pub async fn expect(
        &mut self,
        what: &str,
        limit: Duration,
        mut pred: impl FnMut(&str) -> bool,
    ) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_line(left).await {
                Some(line) if pred(&line) => return line,
                Some(_) => {}
                None => panic!(
                    "worker {}: no {what} within {limit:?}; last lines:\n{}\nstderr:\n{}",
                    self.id,
                    self.tail(15),
                    self.stderr_tail()
                ),
            }
        }
    }

    /// Waits for a line starting with `word ` (or equal to `word`) and returns its
    /// whitespace-separated fields after the word.
    pub async fn expect_word(&mut self, word: &str, limit: Duration) -> Vec<String> {
        let line = self
            .expect(word, limit, |l| l.split_whitespace().next() == Some(word))
            .await;
        line.split_whitespace().skip(1).map(str::to_owned).collect()
    }

    /// Waits for the line `word id ...` (e.g. `ACQ a1 ok ...`) and returns the fields
    /// after the id.
    pub async fn expect_event(&mut self, word: &str, id: &str, limit: Duration) -> Vec<String> {
        let line = self
            .expect(&format!("{word} {id}"), limit, |l| {
                let mut it = l.split_whitespace();
                it.next() == Some(word) && it.next() == Some(id)
            })
            .await;
        line.split_whitespace().skip(2).map(str::to_owned).collect()
    }

    /// Reads the rest of the output and waits for the process to exit; panics
    /// after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                panic!(
                    "worker {} did not exit within {limit:?}; last lines:\n{}\nstderr:\n{}",
                    self.id,
                    self.tail(15),
                    self.stderr_tail()
                );
            }
            match tokio::time::timeout(left, self.lines.recv()).await {
                Ok(Some(line)) => self.seen.push(line),
                Ok(None) => break,
                Err(_) => {}
            }
        }
        // Output closed: the process has exited (or closed stdout just before).
        let status = self.child.wait().expect("reap the worker");
        self.status = Some(status);
        status
    }

    /// Waits for a clean exit (status 0) and returns the worker's `DRAINED` figures.
    pub async fn finish(&mut self, limit: Duration) {
        let status = self.wait_exit(limit).await;
        assert!(
            status.success(),
            "worker {} exited with {status}; last lines:\n{}\nstderr:\n{}",
            self.id,
            self.tail(15),
            self.stderr_tail()
        );
    }

    /// The last `n` lines read.
    pub fn tail(&self, n: usize) -> String {
        let from = self.seen.len().saturating_sub(n);
        self.seen[from..].join("\n")
    }

    /// The last lines of the worker's stderr.
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// All lines seen so far that start with `word`, as fields after the word.
    pub fn seen_words(&self, word: &str) -> Vec<Vec<String>> {
        self.seen
            .iter()
            .filter(|l| l.split_whitespace().next() == Some(word))
            .map(|l| l.split_whitespace().skip(1).map(str::to_owned).collect())
            .collect()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.status.is_none() {
            // SIGKILL works on a stopped process too.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Parses a field as a number, with a useful message.
pub fn num(fields: &[String], i: usize) -> u64 {
    fields
        .get(i)
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("field {i} of {fields:?} is not a number"))
}
