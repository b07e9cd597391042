//! A torture worker: one OS process with its own `LockManager`, taking locks from
//! many tokio tasks and logging every critical section (see `lock_torture::history`).
//!
//! ```text
//! torture-worker --id=N --log=PATH --url=REDIS_URL --store-url=STORE_URL [options] --mode=run|script
//! torture-worker --id=N --log=PATH --cluster-urls=URL1,URL2,... --store-url=STORE_URL [options] --mode=run|script
//! torture-worker --id=N --log=PATH --redlock-urls=URL1,URL2,URL3,... --store-url=STORE_URL [options] --mode=run|script
//! torture-worker --id=N --log=PATH --sentinel-urls=URL1,... --master-name=NAME --store-url=STORE_URL [options] --mode=run|script
//! ```
//!
//! `--sentinel-urls` (comma-separated sentinels, with `--master-name`, built with
//! `LockManager::sentinel_builder`) is used when neither list above is given.
//! `--replica-ack=N:MS` builds with `replica_ack(N, MS ms)`.
//! `--postgres-synchronous-standby=1` (`postgres` feature) builds with
//! `postgres_synchronous_standby(true)`.
//!
//! The lock server is one Redis (`--url`, built with `LockManager::builder`), a
//! Redis Cluster (`--cluster-urls`: comma-separated seed URLs, built with
//! `LockManager::cluster_builder`) or a Redlock over independent masters
//! (`--redlock-urls`: comma-separated, at least 3, one URL per master, built with
//! `LockManager::redlock_builder`). With either list, `--url` is ignored; giving
//! both lists is an error. With the `postgres` feature, `--url` may be a
//! `postgres://` URL (the lock on PostgreSQL). The fenced store (`--store-url`)
//! is one plain Redis, or (`postgres` feature) a PostgreSQL database whose
//! store the test created (`PgStore::create`); `--store-unchecked=1` turns that
//! one's token check off (a sabotage for the checker).
//!
//! In `--mode=run`, an acquisition that fails with `Timeout`, `Backend`,
//! `Connect`, (Redlock) `QuorumFailed` or (`--replica-ack`) `NotReplicated` or
//! `TokenNotReplicated` (a campaign's token) is logged and retried; any other error
//! is fatal.
//!
//! Common options: `--prefix` (key prefix of the manager), `--cmd-timeout-ms`,
//! `--connect-timeout-ms`, `--seed`.
//!
//! `--mode=run`: `--tasks` tasks take `--sections` critical sections in all (0: until
//! `stop` on stdin) on `--keys` (comma-separated), with `--lease-ms`, `--wait-ms`,
//! bodies of `--body-us=MIN-MAX` microseconds (read the protected counter, sleep,
//! write it plus one to the fenced store), `--cancel-pct` of them cancelled
//! mid-body (the section's future is dropped), `--panic-pct` panicking mid-body
//! (inside a spawned task). With `--body-step-ms=N` the body sleeps in steps of
//! N ms (one poll each), so that its last poll in the log follows a body that
//! runs on to within N ms (0, the default: two sleeps, half the body each).
//! Prints `PROGRESS n` every `--progress` sections and
//! `DONE n` at the end. `--kind` selects what the tasks take: `lock` (the
//! default, `manager.lock`), `semaphore` (`manager.semaphore(key, --permits)`) or `rw`
//! (`manager.write_lock` for `--write-pct` % of the sections, else
//! `manager.read_lock`); readers and permit holders read the counter but never
//! write it, and their sections are logged with their kind. `--kind=leader`:
//! each key is a leader election (`manager.leader(key)`, terms of
//! `--lease-ms`), each section one term: campaign (for at most `--wait-ms`),
//! the body writes with the term's epoch as its token, then resign. Two
//! sabotages for the terms' checker: `--fake-leader=1` campaigns for nothing
//! but acts as leader, with the epoch it reads, whenever it sees one lead;
//! `--stale-writes=1` writes once more after each term, with the term's
//! epoch, once the store holds a newer one (logged as a zombie write).
//!
//! `--mode=script`: commands on stdin, events on stdout:
//! - `acquire ID KEY LEASE_MS WAIT_MS STEP_MS` -> `ACQ ID ok TOKEN T_REQ T_ACQ DEADLINE`
//!   or `ACQ ID err KIND T_REQ T_END MESSAGE`; then the holder's body wakes every
//!   STEP_MS, printing `RENEWED ID DEADLINE` when its lease was extended, until
//!   `release ID` (body writes counter+1, then releases: `REL ID RESULT T0 T1`) or a
//!   lost lease (`LOST ID T_LOST LAST_ACTIVE DEADLINE PREV_ACTIVE`, then `REL ...`;
//!   LAST_ACTIVE / PREV_ACTIVE: ends of the body's last two polls).
//!   With a 7th word `late`, the holder takes no fencing token at acquisition
//!   (`ACQ` shows 0): its body asks for it when it writes, and after a loss it
//!   asks once (`LATE_TOKEN ID granted TOKEN` or `LATE_TOKEN ID refused KIND`).
//! - `zombie ID` (after a loss): writes with the lost token anyway ->
//!   `ZOMBIE ID accepted|rejected TOKEN`.
//! - `exit` or end of input: release everything and exit.
//!
//! Both modes print `READY` once connected, and at the end drop the manager, wait
//! for its background tasks (releases handed off by dropped guards) to finish,
//! print `DRAINED MS TASKS_LEFT` and exit 0.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use distlock::{Leadership, LockError, LockGuard, LockManager};
use lock_torture::clock::{mono_ns, ns};
use lock_torture::history::{
    Call, CallKind, CallResult, Kind, Outcome, Record, Release, Section, Write, Zombie,
};
use lock_torture::store::StoreConn;
use tokio::sync::{mpsc, oneshot, watch};

const DELIBERATE_PANIC: &str = "torture: deliberate panic";

struct Args(HashMap<String, String>);

impl Args {
    fn parse() -> Args {
        let mut map = HashMap::new();
        for a in std::env::args().skip(1) {
            let Some(rest) = a.strip_prefix("--") else {
                fatal(&format!("bad argument {a:?}: expected --name=value"));
            };
            let (k, v) = rest.split_once('=').unwrap_or((rest, "1"));
            map.insert(k.to_owned(), v.to_owned());
        }
        Args(map)
    }

    fn get<T: FromStr>(&self, name: &str, default: T) -> T
    where
        T::Err: std::fmt::Display,
    {
        match self.0.get(name) {
            None => default,
            Some(v) => v
                .parse()
                .unwrap_or_else(|e| fatal(&format!("--{name}={v}: {e}"))),
        }
    }

    fn req(&self, name: &str) -> String {
        self.0
            .get(name)
            .cloned()
            .unwrap_or_else(|| fatal(&format!("--{name} is required")))
    }
}

fn fatal(msg: &str) -> ! {
    eprintln!("torture-worker: {msg}");
    println!("FATAL {msg}");
    std::process::exit(2)
}

/// The worker's log file: one record per line, each written with one `write`
/// call so that a killed worker leaves at most its last line torn.
struct Log {
    file: Mutex<std::fs::File>,
}

impl Log {
    fn open(path: &str) -> Log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| fatal(&format!("open log {path}: {e}")));
        Log {
            file: Mutex::new(file),
        }
    }

    fn write(&self, r: Record) {
        use std::io::Write as _;
        let line = format!("{r}\n");
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(line.as_bytes())
            .unwrap_or_else(|e| fatal(&format!("write log: {e}")));
    }
}

/// Shared by everything in one worker.
struct Ctx {
    worker: u32,
    manager: LockManager,
    /// The fenced store (Redis, or PostgreSQL for `postgres://` URLs).
    store_conn: StoreConn,
    log: Log,
}

impl Ctx {
    /// Marks the end of a hold before anything can free its lock (see
    /// `CallKind::Ending`).
    fn ending(&self, task: u32, key: &str, at: u64) {
        self.call(task, CallKind::Ending, key, at, CallResult::Ok);
    }

    fn call(&self, task: u32, kind: CallKind, key: &str, start: u64, result: CallResult) {
        self.log.write(Record::Call(Call {
            worker: self.worker,
            task,
            kind,
            key: key.to_owned(),
            start,
            end: mono_ns(),
            result,
        }));
    }
}

fn main() {
    let args = Args::parse();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let deliberate = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|s| *s == DELIBERATE_PANIC);
        if !deliberate {
            default_hook(info);
        }
    }));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| fatal(&format!("tokio runtime: {e}")));
    let code = rt.block_on(async_main(args));
    std::process::exit(code);
}

async fn async_main(args: Args) -> i32 {
    let worker: u32 = args.get("id", 0);
    let store_url = args.req("store-url");
    let list = |name: &str| -> Vec<String> {
        args.get(name, String::new())
            .split(',')
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (cluster_urls, redlock_urls) = (list("cluster-urls"), list("redlock-urls"));
    let sentinel_urls = list("sentinel-urls");
    let (builder, url) = match (cluster_urls.is_empty(), redlock_urls.is_empty()) {
        (true, true) if !sentinel_urls.is_empty() => {
            let joined = sentinel_urls.join(",");
            let master = args.get("master-name", "distlock".to_owned());
            (
                LockManager::sentinel_builder(sentinel_urls, &master),
                joined,
            )
        }
        (true, true) => {
            let url = args.req("url");
            (LockManager::builder(&url), url)
        }
        (false, true) => {
            let joined = cluster_urls.join(",");
            (LockManager::cluster_builder(cluster_urls), joined)
        }
        (true, false) => {
            let joined = redlock_urls.join(",");
            (LockManager::redlock_builder(redlock_urls), joined)
        }
        (false, false) => fatal("--cluster-urls and --redlock-urls exclude each other"),
    };
    // `--replica-ack=N:MS`: an acquisition counts once N replicas confirmed it
    // within MS milliseconds.
    let builder = match args.get("replica-ack", String::new()).split_once(':') {
        Some((replicas, ms)) => builder.replica_ack(
            replicas
                .parse()
                .unwrap_or_else(|_| fatal("--replica-ack=N:MS")),
            Duration::from_millis(ms.parse().unwrap_or_else(|_| fatal("--replica-ack=N:MS"))),
        ),
        None => builder,
    };
    // `--postgres-synchronous-standby=1`: every grant waits for the primary's
    // synchronous standby (checked at build), so that a promoted standby has
    // every grant and token its holder was told of.
    #[cfg(feature = "postgres")]
    let builder =
        builder.postgres_synchronous_standby(args.get("postgres-synchronous-standby", 0u8) == 1);
    let manager = builder
        .key_prefix(args.get("prefix", "torture:".to_owned()))
        .command_timeout(Duration::from_millis(args.get("cmd-timeout-ms", 500)))
        .connect_timeout(Duration::from_millis(args.get("connect-timeout-ms", 500)))
        .build()
        .await
        .unwrap_or_else(|e| fatal(&format!("connect to {url}: {e}")));
    let store_conn = StoreConn::connect(&store_url)
        .await
        .unwrap_or_else(|e| fatal(&format!("connect to the store {store_url}: {e}")));
    // `--store-unchecked`: the PostgreSQL store with its token check off, the
    // sabotage its scenario's checker must catch.
    #[cfg(feature = "postgres")]
    let store_conn = match store_conn {
        StoreConn::Postgres(pg) if args.get("store-unchecked", 0u8) == 1 => {
            StoreConn::Postgres(pg.unchecked())
        }
        other => other,
    };
    let ctx = Arc::new(Ctx {
        worker,
        manager,
        store_conn,
        log: Log::open(&args.req("log")),
    });
    let commands = stdin_lines();
    println!("READY");
    let mode = args.get("mode", "run".to_owned());
    match mode.as_str() {
        "run" => run(ctx, &args, commands).await,
        "script" => script(ctx, commands).await,
        other => fatal(&format!("unknown --mode={other}")),
    }
    // Every clone of the manager and of the store connection is gone now; wait for
    // the background tasks (releases handed off by dropped guards, connection
    // drivers) to end, so that exiting does not leave a lock to its lease.
    let started = mono_ns();
    let metrics = tokio::runtime::Handle::current().metrics();
    let limit = started + ns(Duration::from_secs(args.get("drain-s", 10)));
    while metrics.num_alive_tasks() > 0 && mono_ns() < limit {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    println!(
        "DRAINED {} {}",
        (mono_ns() - started) / 1_000_000,
        metrics.num_alive_tasks()
    );
    0
}

/// Lines of stdin, read on a plain thread (not a runtime task, so the drain does
/// not wait for it). The channel closes at end of input.
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

// ---------------------------------------------------------------------------
// The recorded critical section

/// What is known of one section while it runs; shared with the code that logs it
/// whatever way it ends (completion, cancellation, panic).
#[derive(Default)]
struct State {
    token: u64,
    acquired: u64,
    last_active: u64,
    /// The end of the poll before the last one.
    prev_active: u64,
    deadline: u64,
    write: Option<Write>,
    dropped_at: u64,
    /// The kind of hold (logged with the section).
    kind: Kind,
}

type Slot = Arc<Mutex<State>>;

fn lock(slot: &Slot) -> std::sync::MutexGuard<'_, State> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records the guard's local deadline on the monotonic clock. The clock is
/// read before the remaining lease, so a SIGSTOP between the two reads makes
/// the sample early, never late: read the other way round, a freeze of 3
/// leases there put the deadline 3 leases late and s2 saw the other holder
/// "890 ms before" it. Samples only raise the recorded deadline, so an early
/// one is harmless.
fn sample_deadline(slot: &Slot, guard: &LockGuard) -> u64 {
    let now = mono_ns();
    let rem = guard.remaining_lease();
    let mut s = lock(slot);
    if !rem.is_zero() {
        s.deadline = s.deadline.max(now + ns(rem));
    }
    s.deadline
}

/// Wraps a body: records when it last ran (the end of each poll, also when a poll
/// panics) and the guard's validity deadline before each poll.
struct Timed<'g, F> {
    inner: Pin<Box<F>>,
    slot: Slot,
    guard: &'g LockGuard,
}

struct MarkActive<'a>(&'a Slot);

impl Drop for MarkActive<'_> {
    fn drop(&mut self) {
        let mut s = lock(self.0);
        s.prev_active = s.last_active;
        s.last_active = mono_ns();
    }
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        sample_deadline(&this.slot, this.guard);
        let _mark = MarkActive(&this.slot);
        this.inner.as_mut().poll(cx)
    }
}

/// Sleeps `total`, in steps of `step` (each a poll of the body) unless `step`
/// is zero.
async fn nap(total: Duration, step: Duration) {
    if step.is_zero() {
        tokio::time::sleep(total).await;
        return;
    }
    let until = tokio::time::Instant::now() + total;
    loop {
        let now = tokio::time::Instant::now();
        if now >= until {
            return;
        }
        tokio::time::sleep((until - now).min(step)).await;
    }
}

/// Reads the counter, waits, writes it plus one with our token.
async fn write_increment(ctx: &Ctx, slot: &Slot, key: &str, token: u64) -> Result<(), String> {
    let mut conn = ctx.store_conn.clone();
    let v = conn.read(key).await?;
    lock(slot).write = Some(Write::Sent);
    let accepted = conn.write(key, token, v + 1).await?;
    lock(slot).write = Some(if accepted {
        Write::Accepted
    } else {
        Write::Rejected
    });
    Ok(())
}

fn log_section(ctx: &Ctx, task: u32, key: &str, slot: &Slot, end: SectionEnd) {
    let s = lock(slot);
    ctx.log.write(Record::Section(Section {
        worker: ctx.worker,
        task,
        key: key.to_owned(),
        token: s.token,
        outcome: end.outcome,
        lost: end.lost_at != 0,
        lost_at: end.lost_at,
        acquired: s.acquired,
        last_active: s.last_active.max(s.acquired),
        deadline: s.deadline,
        write: s.write.unwrap_or(Write::None),
        release: end.release,
        release_start: end.release_start,
        release_end: end.release_end,
        kind: s.kind,
    }));
}

struct SectionEnd {
    outcome: Outcome,
    lost_at: u64,
    release: Release,
    release_start: u64,
    release_end: u64,
}

/// What a section holds: a lock's guard, or a leader's term (whose release
/// is a resignation).
enum Holding {
    Guard(LockGuard),
    Term(Leadership),
}

impl Holding {
    fn guard(&self) -> &LockGuard {
        match self {
            Holding::Guard(g) => g,
            Holding::Term(t) => t.guard(),
        }
    }

    /// The key the section is logged under: the lock's, or the election's name.
    fn key(&self) -> &str {
        match self {
            Holding::Guard(g) => g.key(),
            Holding::Term(t) => t.name(),
        }
    }

    /// The section's fencing token: the one issued with the acquisition (a
    /// hold with none writes with 0, which the store rejects as stale), or
    /// the term's epoch.
    fn token(&self) -> u64 {
        match self {
            Holding::Guard(g) => g.issued_fencing_token().unwrap_or(0),
            Holding::Term(t) => t.epoch(),
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Holding::Guard(g) => g.release().await,
            Holding::Term(t) => t.resign().await,
        }
    }
}

/// After the body: notes a loss the body did not see, releases, and classifies.
async fn finish(
    ctx: &Ctx,
    task: u32,
    held: Holding,
    body: Result<Result<(), String>, LockError>,
) -> SectionEnd {
    let t_end = mono_ns();
    let (outcome, mut lost_at) = match body {
        Ok(Ok(())) => (Outcome::Ok, 0),
        Ok(Err(_)) => (Outcome::Failed, 0),
        Err(LockError::Lost { .. }) => (Outcome::Lost, t_end),
        Err(_) => (Outcome::Failed, 0),
    };
    if lost_at == 0 && held.guard().is_lost() {
        lost_at = mono_ns();
    }
    let key = held.key().to_owned();
    let release_start = mono_ns();
    ctx.ending(task, &key, release_start);
    let r = held.release().await;
    let release_end = mono_ns();
    ctx.call(
        task,
        CallKind::Release,
        &key,
        release_start,
        CallResult::of(&r),
    );
    let release = match r {
        Ok(()) => Release::Ok,
        Err(LockError::Lost { .. }) => {
            if lost_at == 0 {
                lost_at = release_end;
            }
            Release::Lost
        }
        Err(_) => Release::Failed,
    };
    SectionEnd {
        outcome,
        lost_at,
        release,
        release_start,
        release_end,
    }
}

// ---------------------------------------------------------------------------
// run mode

struct RunConfig {
    keys: Vec<String>,
    tasks: u32,
    quota: Option<u64>,
    body_us: (u64, u64),
    /// The body's sleeps go in steps of this length (zero: in one go).
    body_step: Duration,
    cancel_pct: u64,
    panic_pct: u64,
    lease: Duration,
    wait: Duration,
    retry: Duration,
    progress: u64,
    seed: u64,
    /// Take the lock without renewal (`.renew(false)`).
    no_renew: bool,
    /// Run the body under `guard.scope` instead of `scope_until_lost`: a client that
    /// ignores a lost lease (for the checker's negative control).
    ignore_loss: bool,
    /// What the tasks take: `lock`, `semaphore`
    /// (`permits` permits), or `rw` (`write_pct` % of the sections write locks,
    /// the others read locks), or `leader` (terms of elections).
    kind: RunKind,
    /// `--kind=leader` sabotage: act as leader without a term.
    fake_leader: bool,
    /// `--kind=leader` sabotage: write with each term's epoch after it ended.
    stale_writes: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RunKind {
    Lock,
    Semaphore { permits: u32 },
    ReadWrite { write_pct: u64 },
    Leader,
}

#[derive(Clone)]
struct Plan {
    key: String,
    hold: Kind,
    body: Duration,
    cancel_frac_pct: Option<u64>,
    panic: bool,
}

enum Attempt {
    Done(SectionEnd),
    Cancelled,
    NotAcquired(CallResult),
    Stopped,
}

async fn run(ctx: Arc<Ctx>, args: &Args, mut commands: mpsc::UnboundedReceiver<String>) {
    let body = args.get("body-us", "0-5000".to_owned());
    let (lo, hi) = body
        .split_once('-')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .unwrap_or_else(|| fatal(&format!("--body-us={body}: expected MIN-MAX")));
    let sections: u64 = args.get("sections", 0);
    let cfg = Arc::new(RunConfig {
        keys: args
            .get("keys", "k0,k1,k2".to_owned())
            .split(',')
            .map(str::to_owned)
            .collect(),
        tasks: args.get("tasks", 8),
        quota: (sections > 0).then_some(sections),
        body_us: (lo, hi),
        body_step: Duration::from_millis(args.get("body-step-ms", 0)),
        cancel_pct: args.get("cancel-pct", 0),
        panic_pct: args.get("panic-pct", 0),
        lease: Duration::from_millis(args.get("lease-ms", 2000)),
        wait: Duration::from_millis(args.get("wait-ms", 30_000)),
        retry: Duration::from_millis(args.get("retry-ms", 10)),
        progress: args.get("progress", 0),
        seed: args.get("seed", 1),
        no_renew: args.get::<u8>("renew", 1) == 0,
        ignore_loss: args.get::<u8>("ignore-loss", 0) == 1,
        kind: match args.get("kind", "lock".to_owned()).as_str() {
            "lock" => RunKind::Lock,
            "semaphore" => RunKind::Semaphore {
                permits: args.get("permits", 1),
            },
            "rw" => RunKind::ReadWrite {
                write_pct: args.get("write-pct", 20),
            },
            "leader" => RunKind::Leader,
            other => fatal(&format!(
                "unknown --kind={other}: lock, semaphore, rw or leader"
            )),
        },
        fake_leader: args.get::<u8>("fake-leader", 0) == 1,
        stale_writes: args.get::<u8>("stale-writes", 0) == 1,
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    // `stop` (or end of input) ends the run after the sections in progress.
    let watcher = tokio::spawn(async move {
        while let Some(line) = commands.recv().await {
            if line.trim() == "stop" {
                break;
            }
        }
        let _ = stop_tx.send(true);
    });
    let tickets = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for task in 0..cfg.tasks {
        set.spawn(task_loop(
            ctx.clone(),
            cfg.clone(),
            task,
            stop_rx.clone(),
            tickets.clone(),
            done.clone(),
        ));
    }
    while let Some(r) = set.join_next().await {
        if let Err(e) = r {
            fatal(&format!("a task loop failed: {e}"));
        }
    }
    println!("DONE {}", done.load(Ordering::SeqCst));
    // The stdin watcher may still wait for input; it must not keep the drain waiting.
    watcher.abort();
    let _ = watcher.await;
}

async fn task_loop(
    ctx: Arc<Ctx>,
    cfg: Arc<RunConfig>,
    task: u32,
    stop: watch::Receiver<bool>,
    tickets: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
) {
    // Seeded: a run's workload choices repeat with its seed.
    let mut rng = fastrand::Rng::with_seed(
        cfg.seed ^ (u64::from(ctx.worker) << 40) ^ (u64::from(task) << 20),
    );
    'sections: loop {
        if *stop.borrow() {
            return;
        }
        if let Some(q) = cfg.quota {
            if tickets.fetch_add(1, Ordering::SeqCst) >= q {
                return;
            }
        }
        let key = cfg.keys[rng.usize(..cfg.keys.len())].clone();
        let body = Duration::from_micros(rng.u64(cfg.body_us.0..=cfg.body_us.1.max(cfg.body_us.0)));
        let cancel = body >= Duration::from_millis(1) && rng.u64(..100) < cfg.cancel_pct;
        let hold = match cfg.kind {
            RunKind::Lock => Kind::Lock,
            RunKind::Semaphore { .. } => Kind::Permit,
            RunKind::Leader => Kind::Term,
            RunKind::ReadWrite { write_pct } => {
                if rng.u64(..100) < write_pct {
                    Kind::Write
                } else {
                    Kind::Read
                }
            }
        };
        let plan = Plan {
            key,
            hold,
            body,
            cancel_frac_pct: cancel.then(|| rng.u64(20..=80)),
            panic: !cancel && rng.u64(..100) < cfg.panic_pct,
        };
        // One ticket is one critical section: retry the acquisition until it works.
        loop {
            let slot: Slot = Arc::default();
            let handle = tokio::spawn(attempt(
                ctx.clone(),
                cfg.clone(),
                task,
                plan.clone(),
                slot.clone(),
                stop.clone(),
            ));
            let end = match handle.await {
                Ok(Attempt::Done(end)) => end,
                Ok(Attempt::Cancelled) => {
                    let at = lock(&slot).dropped_at;
                    SectionEnd {
                        outcome: Outcome::Cancelled,
                        lost_at: 0,
                        release: Release::Dropped,
                        release_start: at,
                        release_end: at,
                    }
                }
                Err(e) if e.is_panic() => {
                    let at = lock(&slot).dropped_at;
                    SectionEnd {
                        outcome: Outcome::Panicked,
                        lost_at: 0,
                        release: Release::Dropped,
                        release_start: at,
                        release_end: at,
                    }
                }
                Err(e) => fatal(&format!("section task failed: {e}")),
                Ok(Attempt::Stopped) => return,
                Ok(Attempt::NotAcquired(result)) => {
                    if *stop.borrow() {
                        return;
                    }
                    if result != CallResult::Timeout {
                        tokio::time::sleep(cfg.retry).await;
                    }
                    continue;
                }
            };
            log_section(&ctx, task, &plan.key, &slot, end);
            let n = done.fetch_add(1, Ordering::SeqCst) + 1;
            if cfg.progress > 0 && n.is_multiple_of(cfg.progress) {
                println!("PROGRESS {n}");
            }
            continue 'sections;
        }
    }
}

/// One attempt at one critical section, in a task of its own (so a panicking body
/// is caught by the join handle).
async fn attempt(
    ctx: Arc<Ctx>,
    cfg: Arc<RunConfig>,
    task: u32,
    plan: Plan,
    slot: Slot,
    mut stop: watch::Receiver<bool>,
) -> Attempt {
    let t_req = mono_ns();
    lock(&slot).kind = plan.hold;
    if cfg.kind == RunKind::Leader && cfg.fake_leader {
        return fake_term(&ctx, &cfg, task, &plan, &slot, stop).await;
    }
    let r = if cfg.kind == RunKind::Leader {
        // A campaign waits as long as it takes: `--wait-ms` bounds it here,
        // as it bounds the other kinds' acquisitions.
        let election = ctx.manager.leader(plan.key.clone()).lease(cfg.lease);
        let campaign = tokio::time::timeout(cfg.wait, election.campaign());
        match tokio::select! {
            r = campaign => r,
            _ = stop.wait_for(|s| *s) => return Attempt::Stopped,
        } {
            Ok(r) => r.map(Holding::Term),
            Err(_elapsed) => {
                ctx.call(
                    task,
                    CallKind::Acquire,
                    &plan.key,
                    t_req,
                    CallResult::Timeout,
                );
                return Attempt::NotAcquired(CallResult::Timeout);
            }
        }
    } else {
        let request = match cfg.kind {
            RunKind::Semaphore { permits } => ctx.manager.semaphore(plan.key.clone(), permits),
            RunKind::ReadWrite { .. } if plan.hold == Kind::Write => {
                ctx.manager.write_lock(plan.key.clone())
            }
            RunKind::ReadWrite { .. } => ctx.manager.read_lock(plan.key.clone()),
            RunKind::Lock | RunKind::Leader => ctx.manager.lock(plan.key.clone()),
        };
        // Run mode takes each token with its acquisition (eager fencing), so
        // that every section the checker counts has one; scripted holds (s2)
        // take theirs on demand, before or after a pause.
        let acquire = request
            .lease(cfg.lease)
            .wait(cfg.wait)
            .renew(!cfg.no_renew)
            .eager_fencing(true)
            .acquire();
        // Stopping drops an acquisition in flight: that is a cancellation too.
        tokio::select! {
            r = acquire => r.map(Holding::Guard),
            _ = stop.wait_for(|s| *s) => return Attempt::Stopped,
        }
    };
    let result = CallResult::of(&r);
    ctx.call(task, CallKind::Acquire, &plan.key, t_req, result);
    let held = match r {
        Ok(held) => held,
        Err(
            LockError::Timeout { .. }
            // Granted, but answered after its lease had ended (a pause).
            | LockError::Lost { .. }
            | LockError::Backend { .. }
            | LockError::Connect { .. }
            | LockError::QuorumFailed { .. }
            | LockError::NotReplicated { .. }
            | LockError::TokenNotReplicated { .. },
        ) => return Attempt::NotAcquired(result),
        Err(e) => fatal(&format!("acquire {}: {e}", plan.key)),
    };
    let token = held.token();
    let guard = held.guard();
    let started = tokio::time::Instant::now();
    {
        let mut s = lock(&slot);
        s.token = token;
        s.acquired = mono_ns();
        s.last_active = s.acquired;
    }
    // The body's own idea of when it is cancelled: past this point it never starts
    // its write, so a cancellation can never leave a write in flight.
    let cancel_at = plan.cancel_frac_pct.map(|pct| {
        (
            started + plan.body * pct as u32 / 100,
            mono_ns() + ns(plan.body) * pct / 100,
        )
    });
    let body = {
        let ctx = &ctx;
        let slot = &slot;
        let plan = &plan;
        let step = cfg.body_step;
        async move {
            let mut conn = ctx.store_conn.clone();
            let v = conn.read(&plan.key).await?;
            nap(plan.body / 2, step).await;
            if plan.panic {
                let at = mono_ns();
                lock(slot).dropped_at = at;
                ctx.ending(task, &plan.key, at);
                std::panic::panic_any(DELIBERATE_PANIC);
            }
            nap(plan.body - plan.body / 2, step).await;
            if let Some((_, at)) = cancel_at {
                if mono_ns() >= at {
                    std::future::pending::<()>().await;
                }
            }
            // Readers and permit holders share the lock: they read, never write
            // (the fenced counter is for exclusive holders).
            if matches!(plan.hold, Kind::Read | Kind::Permit) {
                return Ok::<(), String>(());
            }
            lock(slot).write = Some(Write::Sent);
            let accepted = conn.write(&plan.key, token, v + 1).await?;
            lock(slot).write = Some(if accepted {
                Write::Accepted
            } else {
                Write::Rejected
            });
            Ok::<(), String>(())
        }
    };
    let timed = Timed {
        inner: Box::pin(body),
        slot: slot.clone(),
        guard,
    };
    type Boxed<'a> =
        Pin<Box<dyn Future<Output = Result<Result<(), String>, LockError>> + Send + 'a>>;
    let section: Boxed<'_> = if cfg.ignore_loss {
        Box::pin(async { Ok(guard.scope(timed).await) })
    } else {
        Box::pin(guard.scope_until_lost(timed))
    };
    let body_result = match cancel_at {
        None => section.await,
        Some((at, _)) => {
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(at) => {
                    // The caller gives up: the section's future is dropped, and
                    // with `held` the guard, whose Drop releases in the
                    // background.
                    let at = mono_ns();
                    lock(&slot).dropped_at = at;
                    ctx.ending(task, &plan.key, at);
                    return Attempt::Cancelled;
                }
                r = section => r,
            }
        }
    };
    let end = finish(&ctx, task, held, body_result).await;
    if cfg.stale_writes && cfg.kind == RunKind::Leader {
        stale_write(&ctx, &plan.key, token).await;
    }
    Attempt::Done(end)
}

/// The `--fake-leader` sabotage: no campaign, but a term all the same,
/// whenever it sees someone lead: the body runs with the real leader's epoch
/// and writes with it, and the "term" ends as if resigned.
async fn fake_term(
    ctx: &Ctx,
    cfg: &RunConfig,
    task: u32,
    plan: &Plan,
    slot: &Slot,
    mut stop: watch::Receiver<bool>,
) -> Attempt {
    let t_req = mono_ns();
    let election = ctx.manager.leader(plan.key.clone());
    let until = tokio::time::Instant::now() + cfg.wait;
    let epoch = loop {
        if *stop.borrow_and_update() {
            return Attempt::Stopped;
        }
        match election.current().await {
            Ok(Some(info)) => break info.epoch,
            Ok(None) | Err(_) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok(None) | Err(_) => {
                ctx.call(
                    task,
                    CallKind::Acquire,
                    &plan.key,
                    t_req,
                    CallResult::Timeout,
                );
                return Attempt::NotAcquired(CallResult::Timeout);
            }
        }
    };
    ctx.call(task, CallKind::Acquire, &plan.key, t_req, CallResult::Ok);
    {
        let mut s = lock(slot);
        s.token = epoch;
        s.acquired = mono_ns();
        s.last_active = s.acquired;
    }
    let outcome = match write_increment_after(ctx, slot, &plan.key, epoch, plan.body).await {
        Ok(()) => Outcome::Ok,
        Err(_) => Outcome::Failed,
    };
    let end = mono_ns();
    lock(slot).last_active = end;
    ctx.ending(task, &plan.key, end);
    Attempt::Done(SectionEnd {
        outcome,
        lost_at: 0,
        release: Release::Ok,
        release_start: end,
        release_end: end,
    })
}

/// Reads the counter, waits `body`, writes it plus one with `token`.
async fn write_increment_after(
    ctx: &Ctx,
    slot: &Slot,
    key: &str,
    token: u64,
    body: Duration,
) -> Result<(), String> {
    let mut conn = ctx.store_conn.clone();
    let v = conn.read(key).await?;
    tokio::time::sleep(body).await;
    lock(slot).write = Some(Write::Sent);
    let accepted = conn.write(key, token, v + 1).await?;
    lock(slot).write = Some(if accepted {
        Write::Accepted
    } else {
        Write::Rejected
    });
    Ok(())
}

/// How long a `--stale-writes` worker waits for a newer epoch in the store
/// after its term: the next term's campaign and body, with room for a busy
/// machine; the run's last term has no successor and gives up after it.
const STALE_WRITE_WAIT: Duration = Duration::from_secs(2);

/// The `--stale-writes` sabotage: once the store holds an epoch newer than
/// `epoch` (a later term wrote), writes the counter plus one with `epoch`
/// anyway, as a deposed leader that ignored its loss would; logged as a
/// zombie write, which the fenced store must reject.
async fn stale_write(ctx: &Ctx, key: &str, epoch: u64) {
    let mut conn = ctx.store_conn.clone();
    let until = tokio::time::Instant::now() + STALE_WRITE_WAIT;
    loop {
        match conn.token(key).await {
            Ok(newest) if newest > epoch => break,
            _ if tokio::time::Instant::now() >= until => return,
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
    let Ok(v) = conn.read(key).await else { return };
    let Ok(accepted) = conn.write(key, epoch, v + 1).await else {
        return;
    };
    ctx.log.write(Record::Zombie(Zombie {
        worker: ctx.worker,
        key: key.to_owned(),
        token: epoch,
        at: mono_ns(),
        accepted,
    }));
}

// ---------------------------------------------------------------------------
// script mode

struct Held {
    key: String,
    token: u64,
    release: Option<oneshot::Sender<()>>,
}

async fn script(ctx: Arc<Ctx>, mut commands: mpsc::UnboundedReceiver<String>) {
    let held: Arc<Mutex<HashMap<String, Held>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(line) = commands.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["acquire", id, key, lease, wait, step, rest @ ..] => {
                let late = match rest {
                    [] => false,
                    ["late"] => true,
                    _ => fatal(&format!("bad acquire options in {line:?}")),
                };
                let parse = |s: &str| -> u64 {
                    s.parse()
                        .unwrap_or_else(|_| fatal(&format!("bad number in {line:?}")))
                };
                let (lease, wait, step) = (
                    Duration::from_millis(parse(lease)),
                    Duration::from_millis(parse(wait)),
                    Duration::from_millis(parse(step)),
                );
                tasks.spawn(hold(
                    ctx.clone(),
                    held.clone(),
                    (*id).to_owned(),
                    (*key).to_owned(),
                    HoldPlan {
                        lease,
                        wait,
                        step,
                        late,
                    },
                ));
            }
            ["release", id] => {
                let tx = held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(*id)
                    .and_then(|h| h.release.take());
                match tx {
                    Some(tx) => {
                        let _ = tx.send(());
                    }
                    None => println!("NOTHELD {id}"),
                }
            }
            ["zombie", id] => {
                let found = held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(*id)
                    .map(|h| (h.key.clone(), h.token));
                let Some((key, token)) = found else {
                    println!("NOTHELD {id}");
                    continue;
                };
                let mut conn = ctx.store_conn.clone();
                let v = conn.read(&key).await.unwrap_or(0);
                let accepted = conn
                    .write(&key, token, v + 1)
                    .await
                    .unwrap_or_else(|e| fatal(&format!("zombie write: {e}")));
                ctx.log.write(Record::Zombie(Zombie {
                    worker: ctx.worker,
                    key,
                    token,
                    at: mono_ns(),
                    accepted,
                }));
                println!(
                    "ZOMBIE {id} {} {token}",
                    if accepted { "accepted" } else { "rejected" }
                );
            }
            ["exit"] => break,
            [] => {}
            _ => fatal(&format!("unknown command {line:?}")),
        }
    }
    // Release whatever is still held, and wait for the holders to finish.
    for h in held.lock().unwrap_or_else(|e| e.into_inner()).values_mut() {
        if let Some(tx) = h.release.take() {
            let _ = tx.send(());
        }
    }
    while tasks.join_next().await.is_some() {}
}

/// How a scripted hold is taken and kept (see `acquire` in the module docs).
struct HoldPlan {
    lease: Duration,
    wait: Duration,
    /// How often the body wakes to report renewals.
    step: Duration,
    /// The fencing token is asked for only when the body writes.
    late: bool,
}

async fn hold(
    ctx: Arc<Ctx>,
    held: Arc<Mutex<HashMap<String, Held>>>,
    id: String,
    key: String,
    plan: HoldPlan,
) {
    let HoldPlan {
        lease,
        wait,
        step,
        late,
    } = plan;
    let t_req = mono_ns();
    let r = ctx
        .manager
        .lock(key.clone())
        .lease(lease)
        .wait(wait)
        .acquire()
        .await;
    let t_acq = mono_ns();
    let class = CallResult::of(&r);
    ctx.call(0, CallKind::Acquire, &key, t_req, class);
    let guard = match r {
        Ok(g) => g,
        Err(e) => {
            println!("ACQ {id} err {} {t_req} {t_acq} {e}", class.word());
            return;
        }
    };
    // Fencing on demand: one round trip here, or (`late`) only when the body
    // writes. A hold found lost already gets no token; its writes then carry
    // 0, which the store rejects as stale.
    let token = if late {
        0
    } else {
        guard.fencing_token().await.unwrap_or(0)
    };
    let slot: Slot = Arc::default();
    {
        let mut s = lock(&slot);
        s.token = token;
        s.acquired = t_acq;
        s.last_active = t_acq;
    }
    let deadline = sample_deadline(&slot, &guard);
    let (tx, mut rx) = oneshot::channel();
    held.lock().unwrap_or_else(|e| e.into_inner()).insert(
        id.clone(),
        Held {
            key: key.clone(),
            token,
            release: Some(tx),
        },
    );
    println!("ACQ {id} ok {token} {t_req} {t_acq} {deadline}");
    let body = {
        let (ctx, slot, guard, id, key) = (&ctx, &slot, &guard, &id, &key);
        async move {
            let mut shown = deadline;
            loop {
                tokio::select! {
                    _ = &mut rx => break,
                    _ = tokio::time::sleep(step) => {}
                }
                let d = sample_deadline(slot, guard);
                if d > shown + ns(lease) / 10 {
                    println!("RENEWED {id} {d}");
                    shown = d;
                }
            }
            let token = if late {
                let token = guard.fencing_token().await.unwrap_or(0);
                lock(slot).token = token;
                token
            } else {
                token
            };
            write_increment(ctx, slot, key, token).await
        }
    };
    let timed = Timed {
        inner: Box::pin(body),
        slot: slot.clone(),
        guard: &guard,
    };
    let r = guard.scope_until_lost(timed).await;
    if let Err(LockError::Lost { .. }) = &r {
        {
            let s = lock(&slot);
            println!(
                "LOST {id} {} {} {} {}",
                mono_ns(),
                s.last_active,
                s.deadline,
                s.prev_active
            );
        }
        if late {
            // A holder that never took its token asks for it only now, after
            // the loss: it must be refused (its zombie write then carries 0).
            match guard.fencing_token().await {
                Ok(token) => {
                    lock(&slot).token = token;
                    if let Some(h) = held.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&id) {
                        h.token = token;
                    }
                    println!("LATE_TOKEN {id} granted {token}");
                }
                Err(LockError::Lost { .. }) => println!("LATE_TOKEN {id} refused lost"),
                Err(e) => println!("LATE_TOKEN {id} refused other {e}"),
            }
        }
    }
    let end = finish(&ctx, 0, Holding::Guard(guard), r).await;
    println!(
        "REL {id} {} {} {}",
        end.release.word(),
        end.release_start,
        end.release_end
    );
    log_section(&ctx, 0, &key, &slot, end);
}
