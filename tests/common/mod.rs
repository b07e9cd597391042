//! Helpers shared by the integration tests: a private redis-server per test, and
//! managers with short timeouts so that failure tests finish quickly.
#![allow(dead_code)]

use std::time::Duration;

use distlock::testing::RedisServer;
use distlock::{Backoff, LockManager};
use redis::aio::MultiplexedConnection;

pub fn server() -> RedisServer {
    RedisServer::spawn().expect("redis-server must be installed to run the tests")
}

pub async fn manager(server: &RedisServer) -> LockManager {
    manager_at(&server.url()).await
}

pub async fn manager_at(url: &str) -> LockManager {
    manager_with_timeout(url, Duration::from_millis(500)).await
}

/// The lease of a hold that must survive its renewals on a loaded CI machine
/// (2 vCPUs, tests side by side, PostgreSQL committing to disk): renewed
/// every 300 ms (a third of it), it is lost only by a renewal or a grant's
/// reply 600 ms late; a 300 ms lease is lost by one 200 ms late.
pub const RENEWED_LEASE: Duration = Duration::from_millis(900);

/// [`manager_at`] with its own command timeout (connections: 500 ms), for a
/// manager behind a proxy that holds its replies.
pub async fn manager_with_timeout(url: &str, command_timeout: Duration) -> LockManager {
    LockManager::builder(url)
        .command_timeout(command_timeout)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect to the test redis-server")
}

/// Takes `key` (30 s lease) with `m` in a task of its own that never ends,
/// and returns once the task holds it: the guard goes with the task when
/// the runtime shuts down, as a guard held as `#[tokio::main]` returns.
pub async fn hold_until_the_runtime_ends(m: &LockManager, key: String) {
    let (held, is_held) = tokio::sync::oneshot::channel();
    let holder = m.clone();
    tokio::spawn(async move {
        let _g = holder
            .lock(key)
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let _ = held.send(());
        std::future::pending::<()>().await;
    });
    is_held.await.unwrap();
}

pub async fn raw(server: &RedisServer) -> MultiplexedConnection {
    server.client().await.expect("raw connection")
}

/// Turns on keyspace notifications of expired keys (`Kx`) on the server
/// behind `conn`.
pub async fn expiry_notices_on(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Kx")
        .query_async(conn)
        .await
        .unwrap();
}

pub async fn exists(conn: &mut MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

pub async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

pub async fn del(conn: &mut MultiplexedConnection, key: &str) {
    redis::cmd("DEL")
        .arg(key)
        .query_async::<()>(conn)
        .await
        .expect("DEL")
}

/// How many connections subscribe to `channel` or, for a default lock's
/// channel (`<prefix>wake:{tag}:<key>`), to the hand-off channels
/// (`<prefix>handoff:<route>`) of the managers queued for that lock (the
/// routes their queue entries name), where those managers' queued waiters of
/// every lock listen. Managers that only hold locks listen on their hand-off
/// channels too (for the notices of their waiters); they do not count here.
pub async fn numsub(conn: &mut MultiplexedConnection, channel: &str) -> i64 {
    let handoffs: Vec<String> = match channel.split_once("wake:{") {
        Some((prefix, _)) => {
            let entries: Vec<String> = redis::cmd("HVALS")
                .arg(channel.replacen("wake:{", "lockqe:{", 1))
                .query_async(&mut *conn)
                .await
                .expect("HVALS");
            let mut routes: Vec<String> = entries
                .iter()
                .filter_map(|entry| entry.split(':').nth(3))
                .map(|route| format!("{prefix}handoff:{route}"))
                .collect();
            routes.sort();
            routes.dedup();
            routes
        }
        None => Vec::new(),
    };
    let mut total = 0;
    for name in std::iter::once(channel.to_owned()).chain(handoffs) {
        total += subscribers(conn, &name).await;
    }
    total
}

/// `PUBSUB NUMSUB` of one channel.
pub async fn subscribers(conn: &mut MultiplexedConnection, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut *conn)
        .await
        .expect("PUBSUB NUMSUB");
    n
}

/// Waits (up to 5 s) until the manager whose hold or queue entry has the
/// owner token `hold_id` listens on its hand-off channel (under the default
/// prefix; the token's last 8 digits are the manager's route), which it
/// subscribes in the background of its first default-lock acquisition.
pub async fn await_handoff_listener(conn: &mut MultiplexedConnection, hold_id: &str) {
    let channel = format!("distlock:handoff:{}", &hold_id[hold_id.len() - 8..]);
    let listening = eventually(Duration::from_secs(5), async || {
        subscribers(conn, &channel).await == 1
    })
    .await;
    assert!(listening.is_some(), "nobody listens on {channel}");
}

/// Waits until the holder of the default lock `key` (as `m` reads it) listens
/// on its manager's hand-off channel: after it, that manager sends nothing
/// more on its own (a test counting commands from there on counts only what
/// it asks for).
pub async fn await_holder_listening(conn: &mut MultiplexedConnection, m: &LockManager, key: &str) {
    let hold_id = m.inspect(key).await.unwrap().expect("held").hold_id;
    await_handoff_listener(conn, &hold_id).await;
}

/// `text` as a Redis glob pattern that matches only itself.
pub fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The channels with at least one subscriber.
pub async fn pubsub_channels(conn: &mut MultiplexedConnection) -> Vec<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(conn)
        .await
        .expect("PUBSUB CHANNELS")
}

/// Kills every pub/sub connection; returns how many there were.
pub async fn kill_subscribers(conn: &mut MultiplexedConnection) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .expect("CLIENT KILL")
}

/// Every key in the server, for leak checks.
pub async fn all_keys(conn: &mut MultiplexedConnection) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("KEYS")
}

/// A backoff that cannot get a waiter in within 10 s (no jitter, and every
/// holder's lease is longer): what gets it in sooner is a wake-up, or a timer
/// capped by the holder's lease.
pub fn slow_backoff() -> Backoff {
    Backoff::new(Duration::from_secs(10), Duration::from_secs(10)).with_jitter(0.0)
}

/// Acquires and releases the lock `"warm-up"` once, so that every connection
/// of `m` is open (the wake-up subscriber's too) and its scripts are loaded:
/// a fault injected after it meets the call under test, not a connection's
/// start-up.
pub async fn open_every_connection(m: &LockManager) {
    m.lock("warm-up")
        .acquire()
        .await
        .expect("the warm-up lock")
        .release()
        .await
        .expect("the warm-up release");
}

/// Waits (up to 10 s) until `waiters` acquisitions of `m` are parked in its
/// queues.
pub async fn await_parked(m: &LockManager, waiters: usize) {
    let parked = eventually(Duration::from_secs(10), async || {
        m.waiting_acquisitions() >= waiters
    })
    .await;
    assert!(
        parked.is_some(),
        "{} of {waiters} waiters parked",
        m.waiting_acquisitions()
    );
}

/// Runs `f` until it returns true or `limit` passes; returns how long it took.
/// For conditions that only time can bring (a lease running out), with generous
/// limits.
pub async fn eventually(limit: Duration, mut f: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Waits (up to 5 s) until someone waits for the default lock of `key`, as
/// `m` reads it (`inspect`'s `waited_for`); fails the test if nobody does.
pub async fn await_waiter(m: &LockManager, key: &str) {
    let queued = eventually(Duration::from_secs(5), async || {
        m.inspect(key).await.unwrap().is_some_and(|i| i.waited_for)
    })
    .await;
    assert!(queued.is_some(), "nobody ever waited for {key}");
}

/// Spawns an acquisition of `key` by `m` that waits for it (up to 10 s), for
/// a test that holds the lock meanwhile.
pub fn spawn_waiter(
    m: &LockManager,
    key: &str,
) -> tokio::task::JoinHandle<Result<distlock::LockGuard, distlock::LockError>> {
    let (m, key) = (m.clone(), key.to_owned());
    tokio::spawn(async move { m.lock(key).wait(Duration::from_secs(10)).acquire().await })
}

/// Makes `m` wait for a lock `other` holds (`key`) until a hand-off reaches
/// it by message (its `wake_ups_delivered` grows), at most ten times: then
/// `m`'s hand-off channel is subscribed and confirmed, so a test that counts
/// pushed hand-offs does not count one published before `m` listened (the
/// subscription is made in the background at `m`'s first acquisition).
pub async fn await_listening(m: &LockManager, other: &LockManager, key: &str) {
    let before = m.wake_ups_delivered();
    for _ in 0..10 {
        wait_once(m, other, key).await;
        if m.wake_ups_delivered() > before {
            return;
        }
    }
    panic!("no hand-off of {key} reached its waiter by message in ten tries");
}

/// Makes `m` wait once for a lock `other` holds (`key`), which subscribes
/// `m`'s hand-off channel for good, as in a service that has run a while.
pub async fn wait_once(m: &LockManager, other: &LockManager, key: &str) {
    let held = other.lock(key).acquire().await.unwrap();
    let waiting = spawn_waiter(m, key);
    await_waiter(other, key).await;
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
}

thread_local! {
    /// Where `logged` collects this thread's log lines, while it runs.
    static CAPTURE: std::cell::RefCell<Option<Vec<u8>>> = const { std::cell::RefCell::new(None) };
}

/// Writes into this thread's `CAPTURE`, if any.
struct ThreadCapture;

impl std::io::Write for ThreadCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(captured) = c.borrow_mut().as_mut() {
                captured.extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` on a current-thread runtime and returns what `distlock=debug` logged
/// meanwhile on this thread (every task of a current-thread runtime runs on it).
///
/// The subscriber is the process's global default, set once: a scoped one
/// (`set_default`) can miss events whose callsites another test's thread
/// registered first, when only the no-op subscriber was there to ask.
pub fn logged<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) -> String {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("distlock=debug"))
            .with_writer(|| ThreadCapture)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in the tests");
    });
    CAPTURE.with(|c| *c.borrow_mut() = Some(Vec::new()));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f());
    let captured = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    String::from_utf8(captured).unwrap()
}

/// Takes lock "job" (30 s lease) with the manager `connect` builds, on a runtime
/// that then ends with the guard dropped inside it, as a guard does when
/// `#[tokio::main]` returns early; returns the lock's Redis name. The guard's
/// release was spawned on that runtime and never ran there.
pub fn lock_held_as_runtime_ends<F, Fut>(connect: F) -> String
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = LockManager>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = connect().await;
        let _g = m
            .lock("job")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        m.redis_names("job").lock
        // `_g` dropped here, inside the runtime: Drop spawns the release.
    })
}

/// Where a test's locks live: a private server, or the process-wide cluster
/// (tests of one binary share it; each test uses keys of its own). Tests of
/// the lock family run once on each (`on_both!`).
pub enum Deployment {
    Single(Box<distlock::testing::RedisServer>),
    Cluster(&'static distlock::testing::RedisCluster),
    /// The process-wide PostgreSQL ([`postgres_server`]) and a schema of this
    /// deployment's own, so that a test's `list`, `inspect_all` and fencing
    /// sequence see only its own locks.
    #[cfg(feature = "postgres")]
    Postgres {
        server: &'static distlock_testing::PostgresServer,
        schema: String,
    },
}

/// A plain SQL connection to `url`, for reading distlock's tables beside a
/// manager (its driver runs in a task of its own).
#[cfg(feature = "postgres")]
pub async fn sql_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The one `bigint` that `sql` answers.
#[cfg(feature = "postgres")]
pub async fn count(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.expect(sql).get(0)
}

/// Waits (up to 5 s) until a session whose `application_name` is
/// `application` waits for a lock not granted (a row lock, an advisory
/// lock); whether it did.
#[cfg(feature = "postgres")]
pub async fn a_session_waits(db: &tokio_postgres::Client, application: &str) -> bool {
    let sql = format!(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE NOT l.granted AND a.application_name = '{application}'"
    );
    eventually(Duration::from_secs(5), async || count(db, &sql).await > 0)
        .await
        .is_some()
}

/// How many acquisitions are queued in the default schema's `waiters`.
#[cfg(feature = "postgres")]
pub async fn queued(db: &tokio_postgres::Client) -> i64 {
    count(db, "SELECT count(*) FROM distlock.waiters").await
}

/// How many statements calling `function` of distlock's schema (any of them
/// with `""`) `pg`'s log holds, sent as simple queries or as unnamed
/// statements. A server started with `log_statement = all` logs each
/// statement before it answers, so every statement of a call that returned is
/// in the log.
#[cfg(feature = "postgres")]
pub fn distlock_statements_logged(pg: &distlock_testing::PostgresServer, function: &str) -> usize {
    std::fs::read_to_string(pg.log_path())
        .expect("the server's log")
        .lines()
        .filter(|l| logs_distlock_statement(l, function))
        .count()
}

/// Whether the server's log line `line` is a statement calling `function` of
/// distlock's schema (any of them with `""`), sent as a simple query or as an
/// unnamed statement: the lines [`distlock_statements_logged`] counts.
pub fn logs_distlock_statement(line: &str, function: &str) -> bool {
    (line.contains("statement: ") || line.contains("execute <unnamed>"))
        && line.contains(&format!("distlock.{function}"))
}

/// One private PostgreSQL for the whole test binary: `initdb` and a start cost
/// about 1.5 s, once per test would cost more than the tests. Never dropped
/// (a static), so a watchdog stops it when this process is gone, however it
/// ends (`pg_ctl` detaches the server, so it would outlive the process).
#[cfg(feature = "postgres")]
// The watchdog must outlive this process, so it is never waited for (init
// reaps it).
#[allow(clippy::zombie_processes)]
pub fn postgres_server() -> &'static distlock_testing::PostgresServer {
    static SHARED: std::sync::OnceLock<distlock_testing::PostgresServer> =
        std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let pg = distlock_testing::PostgresServer::start()
            .expect("PostgreSQL (initdb, pg_ctl) must be installed to run the tests");
        let postmaster = pg.postmaster_pid().expect("the postmaster's pid");
        let dir = pg.log_path().parent().expect("the server's directory");
        // SIGQUIT is PostgreSQL's immediate shutdown; the directory is the
        // server's own temporary one.
        let script = format!(
            "while kill -0 {test} 2>/dev/null; do sleep 0.5; done; \
             kill -QUIT {postmaster} 2>/dev/null; \
             while kill -0 {postmaster} 2>/dev/null; do sleep 0.1; done; \
             rm -rf '{dir}'",
            test = std::process::id(),
            dir = dir.display(),
        );
        std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the PostgreSQL watchdog");
        pg
    })
}

impl Deployment {
    pub fn single() -> Self {
        Deployment::Single(Box::new(server()))
    }

    pub fn cluster() -> Self {
        Deployment::Cluster(
            distlock::testing::RedisCluster::process_wide()
                .expect("redis-server must be installed to run the tests"),
        )
    }

    /// A deployment on the process-wide PostgreSQL, in a schema of its own,
    /// created here (by `psql`, before any manager), so that no manager's
    /// `build()` spends its timeouts creating it while other tests run.
    #[cfg(feature = "postgres")]
    pub fn postgres() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let server = postgres_server();
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let schema = format!("t{n}");
        let sql = distlock::postgres_schema_sql(&schema).expect("a valid schema name");
        server.psql(&sql).expect("create the test's schema");
        Deployment::Postgres { server, schema }
    }

    /// A builder of a manager of this deployment, with short timeouts so that
    /// failure tests finish quickly, for a test to add its own options to.
    pub fn builder(&self) -> distlock::LockManagerBuilder {
        match self {
            Deployment::Single(s) => LockManager::builder(&s.url())
                .command_timeout(Duration::from_millis(500))
                .connect_timeout(Duration::from_millis(500)),
            Deployment::Cluster(c) => LockManager::cluster_builder(c.urls())
                .command_timeout(Duration::from_millis(500))
                .connect_timeout(Duration::from_millis(500)),
            // A statement commits (a WAL flush, fsync on) where Redis answers
            // from memory, on a machine the parallel tests share: 2 s.
            #[cfg(feature = "postgres")]
            Deployment::Postgres { server, schema } => LockManager::builder(&server.url())
                .command_timeout(Duration::from_secs(2))
                .connect_timeout(Duration::from_secs(2))
                .postgres_schema(schema.clone()),
        }
    }

    pub async fn manager(&self) -> LockManager {
        self.builder()
            .build()
            .await
            .expect("connect to the test deployment")
    }

    /// Whether this is the PostgreSQL store.
    pub fn is_postgres(&self) -> bool {
        #[cfg(feature = "postgres")]
        return matches!(self, Deployment::Postgres { .. });
        #[cfg(not(feature = "postgres"))]
        false
    }

    /// A pub/sub connection to the server that holds the Redis names of
    /// `user_key`, subscribed to `channel`: what that server publishes there,
    /// in order. `None` on PostgreSQL.
    pub async fn redis_subscriber_for(
        &self,
        m: &LockManager,
        user_key: &str,
        channel: &str,
    ) -> Option<redis::aio::PubSub> {
        let url = self.redis_url_for(m, user_key)?;
        let mut pubsub = redis::Client::open(url.as_str())
            .expect("node url")
            .get_async_pubsub()
            .await
            .expect("connect to the node");
        pubsub.subscribe(channel).await.expect("subscribe");
        Some(pubsub)
    }

    /// The URL of the server that holds the Redis names of `user_key` (all
    /// of one key's names share a hash tag, so one node). `None` on
    /// PostgreSQL.
    pub fn redis_url_for(&self, m: &LockManager, user_key: &str) -> Option<String> {
        match self {
            Deployment::Single(s) => Some(s.url()),
            Deployment::Cluster(c) => {
                let node = c
                    .master_of_key(&m.redis_names(user_key).lock)
                    .expect("the key's master");
                Some(c.nodes()[node].url.clone())
            }
            #[cfg(feature = "postgres")]
            Deployment::Postgres { .. } => None,
        }
    }

    /// What the store publishes on `channel` (a logical channel of
    /// `user_key`: `redis_names(user_key).channel()`, or its sibling of
    /// another lock kind), heard beside the managers, in
    /// order: a subscription on the server that holds the key's Redis
    /// names, or on PostgreSQL a session of its own that LISTENs there.
    /// Ready when this returns.
    pub async fn listen_for(&self, m: &LockManager, user_key: &str, channel: &str) -> Heard {
        #[cfg(feature = "postgres")]
        if let Deployment::Postgres { server, .. } = self {
            use futures_util::StreamExt as _;
            let (client, mut connection) =
                tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
                    .await
                    .expect("connect");
            let (heard, payloads) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(async move {
                let mut messages =
                    futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(Ok(message)) = messages.next().await {
                    if let tokio_postgres::AsyncMessage::Notification(n) = message {
                        let _ = heard.send(n.payload().as_bytes().to_vec());
                    }
                }
            });
            let listen = format!("LISTEN {}", m.postgres_channel(channel));
            client.batch_execute(&listen).await.expect("LISTEN");
            return Heard::Postgres {
                _session: client,
                payloads,
            };
        }
        Heard::Redis(
            self.redis_subscriber_for(m, user_key, channel)
                .await
                .expect("a Redis deployment"),
        )
    }

    /// A raw connection to the server that holds the Redis names of
    /// `user_key` (all of one key's names share a hash tag, so one node).
    pub async fn raw_for(&self, m: &LockManager, user_key: &str) -> MultiplexedConnection {
        if let Deployment::Single(s) = self {
            return raw(s).await;
        }
        let url = self
            .redis_url_for(m, user_key)
            .expect("no Redis connection on PostgreSQL");
        redis::Client::open(url.as_str())
            .expect("node url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the node")
    }
}

impl Deployment {
    /// [`raw_for`](Self::raw_for) on Redis, `None` on PostgreSQL: for a test
    /// whose Redis-only assertions (the names a hold leaves) sit beside
    /// store-neutral ones.
    pub async fn redis_raw_for(
        &self,
        m: &LockManager,
        user_key: &str,
    ) -> Option<MultiplexedConnection> {
        if self.is_postgres() {
            None
        } else {
            Some(self.raw_for(m, user_key).await)
        }
    }

    /// The largest weight PostgreSQL recorded as waited for on semaphore
    /// `user_key` (its row of `shared_keys`), which a waiter's first attempt
    /// after its subscription writes: what a test awaits there where it
    /// awaits the subscription on Redis. `None` on Redis or without a row.
    pub fn recorded_waiting_weight(&self, m: &LockManager, user_key: &str) -> Option<u64> {
        #[cfg(feature = "postgres")]
        if let Deployment::Postgres { server, schema } = self {
            let name = m.redis_names(user_key).lock.replacen(":lock:", ":sem:", 1);
            let out = server
                .psql(&format!(
                    "SELECT waiting_weight FROM {schema}.shared_keys WHERE name = '{}'",
                    name.replace('\'', "''")
                ))
                .expect("read shared_keys");
            return out.trim().parse().ok();
        }
        let _ = (m, user_key);
        None
    }
}

/// Runs `async fn $test(d: Deployment)` as two tests, `$test::single` and
/// `$test::cluster`.
#[macro_export]
macro_rules! on_both {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test]
            async fn single() {
                super::$test($crate::common::Deployment::single()).await
            }
            #[tokio::test]
            async fn cluster() {
                super::$test($crate::common::Deployment::cluster()).await
            }
        }
    )*};
}

/// Runs `async fn $test(d: Deployment)` on every store: `$test::single`,
/// `$test::cluster` and, with the `postgres` feature, `$test::postgres` (so
/// that `cargo test -- postgres` selects the PostgreSQL cases and `--skip
/// postgres` leaves them out). For tests of the default lock through the
/// store-neutral API.
#[macro_export]
macro_rules! on_stores {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test]
            async fn single() {
                super::$test($crate::common::Deployment::single()).await
            }
            #[tokio::test]
            async fn cluster() {
                super::$test($crate::common::Deployment::cluster()).await
            }
            // Multi-threaded: the PostgreSQL client's connection tasks then
            // run beside the test's own.
            #[cfg(feature = "postgres")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$test($crate::common::Deployment::postgres()).await
            }
        }
    )*};
}

/// The kinds (`lock`, `rw`, `rwr`, `sem`, ...) of the Redis names of
/// `user_key` under the default prefix that exist on `conn`, sorted.
pub async fn kinds_of(conn: &mut MultiplexedConnection, user_key: &str) -> Vec<String> {
    let suffix = format!("}}:{user_key}");
    let mut kinds: Vec<String> = all_keys(conn)
        .await
        .into_iter()
        .filter(|k| k.ends_with(&suffix))
        .filter_map(|k| Some(k.strip_prefix("distlock:")?.split(":{").next()?.to_owned()))
        .collect();
    kinds.sort();
    kinds
}

/// The Redis name of kind `kind` of `user_key` on `conn`, if it exists.
pub async fn name_of(
    conn: &mut MultiplexedConnection,
    kind: &str,
    user_key: &str,
) -> Option<String> {
    let (head, tail) = (format!("distlock:{kind}:{{"), format!("}}:{user_key}"));
    all_keys(conn)
        .await
        .into_iter()
        .find(|k| k.starts_with(&head) && k.ends_with(&tail))
}

/// Calls per command since the last `CONFIG RESETSTAT`, from `INFO
/// commandstats` (commands that scripts run included), without the statistics
/// calls themselves and without the `CLIENT SETINFO` that redis-rs sends on
/// each new connection to a server that knows it (Redis 7.2+, every Valkey):
/// what distlock itself sent.
pub async fn command_calls(
    raw: &mut MultiplexedConnection,
) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            (!name.starts_with("config") && !name.starts_with("info") && name != "client|setinfo")
                .then(|| (name.to_owned(), calls))
        })
        .collect()
}

/// How often `command` ran since the last `CONFIG RESETSTAT`.
pub async fn calls_of(raw: &mut MultiplexedConnection, command: &str) -> u64 {
    command_calls(raw).await.get(command).copied().unwrap_or(0)
}

/// Connections the server (or sentinel) accepted so far (`INFO stats`).
pub async fn connections_received(raw: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_connections_received")
}

/// Zeroes the server's command statistics.
pub async fn reset_stats(raw: &mut MultiplexedConnection) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(raw)
        .await
        .expect("CONFIG RESETSTAT");
}

/// The lines MONITOR shows from now on.
pub async fn monitor(
    redis: &distlock::testing::RedisServer,
) -> impl futures_util::Stream<Item = String> + Unpin {
    redis::Client::open(redis.url())
        .unwrap()
        .get_async_monitor()
        .await
        .unwrap()
        .into_on_message::<String>()
}

/// What a store publishes on one channel, heard beside the managers (see
/// [`Deployment::listen_for`]).
pub enum Heard {
    Redis(redis::aio::PubSub),
    #[cfg(feature = "postgres")]
    Postgres {
        /// Kept: dropping it would end the LISTEN.
        _session: tokio_postgres::Client,
        payloads: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    },
}

impl Heard {
    /// The payload of the next message, if one comes within `within`.
    pub async fn next(&mut self, within: Duration) -> Option<Vec<u8>> {
        use futures_util::StreamExt as _;
        match self {
            Heard::Redis(pubsub) => tokio::time::timeout(within, pubsub.on_message().next())
                .await
                .ok()
                .flatten()
                .map(|m| m.get_payload_bytes().to_vec()),
            #[cfg(feature = "postgres")]
            Heard::Postgres { payloads, .. } => tokio::time::timeout(within, payloads.recv())
                .await
                .ok()
                .flatten(),
        }
    }
}
