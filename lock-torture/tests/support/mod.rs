//! What the torture scenarios share: the servers and scratch directory of a
//! scenario ([`Setup`]), starting and talking to worker processes, judging
//! their logs, and the scenarios run on several deployments (`baseline`,
//! `killed_holder`). Each deployment's scenarios are in a test file of their
//! own (`single.rs`, `cluster.rs`, `sentinel.rs`, `redlock.rs`; `postgres.rs`
//! has a small setup of its own and uses the runner's phases and figures); a
//! new store adds its file beside them and its variant to [`LockTarget`], and
//! runs `baseline` and `killed_holder` first: they are the checks every store
//! must pass before its own faults mean anything.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use distlock::LockManager;
use distlock_testing::{ClusterNodeRole, RedisCluster, RedisSentinel, RedisServer};
use lock_torture::checker::{check_store, Faults, Report, StoreReport};
use lock_torture::clock::{diff_ms, mono_ns, ms, ns};
use lock_torture::history::{CallKind, CallResult, History, Outcome};
use lock_torture::process::{num, RunDir, Worker};
use lock_torture::soak_factor;
use lock_torture::store::{self, FencedStore};
use redis::aio::MultiplexedConnection;

mod runner;

pub use runner::*;

pub const WORKER: &str = env!("CARGO_BIN_EXE_torture-worker");
pub const PREFIX: &str = "torture:";

/// One scenario at a time: they measure time, and the machine has 2 cores.
/// Every scenario holds it throughout (`let _serial = SERIAL.lock().await;`
/// first): its guard writes the scenario's results files at the end.
pub static SERIAL: Serial = Serial::new();

/// The servers and scratch directory of one scenario. The lock server is the one
/// faults are injected into; the fenced store lives on a server of its own.
pub struct Setup {
    pub target: LockTarget,
    pub store: RedisServer,
    pub dir: RunDir,
}

/// Where a scenario's locks live.
pub enum LockTarget {
    /// One redis-server (every scenario).
    Server(Box<RedisServer>),
    /// A private 3-master Redis Cluster (the scenarios parameterised over [`On`]).
    Cluster(RedisCluster),
    /// Five independent redis-servers, one Redlock (the scenarios parameterised
    /// over [`On`], and the Redlock ones).
    Redlock(Vec<RedisServer>),
    /// A master with replicas watched by sentinels (the Sentinel scenarios).
    Sentinel(Box<RedisSentinel>),
}

/// Members of the Redlock target.
pub const REDLOCK_MEMBERS: usize = 5;

/// Which lock target a parameterised scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    Server,
    Cluster,
    Redlock,
}

pub fn setup(name: &str) -> Setup {
    setup_on(name, On::Server)
}

pub fn setup_on(name: &str, on: On) -> Setup {
    Setup::new(
        match on {
            On::Server => LockTarget::Server(Box::new(
                RedisServer::spawn().expect("redis-server must be installed"),
            )),
            On::Cluster => LockTarget::Cluster(
                RedisCluster::spawn().expect("redis-server must be installed (cluster)"),
            ),
            On::Redlock => LockTarget::Redlock(
                (0..REDLOCK_MEMBERS)
                    .map(|_| RedisServer::spawn().expect("redis-server must be installed"))
                    .collect(),
            ),
        },
        name,
    )
}

impl Setup {
    /// A scenario on `target`, with a fenced store of its own and a scratch
    /// directory named `name`.
    pub fn new(target: LockTarget, name: &str) -> Setup {
        Setup {
            target,
            store: RedisServer::spawn().expect("redis-server must be installed"),
            dir: RunDir::new(name),
        }
    }

    /// The single lock server; the scenarios that inject faults into it run on
    /// one server only.
    pub fn lock(&self) -> &RedisServer {
        match &self.target {
            LockTarget::Server(s) => s,
            LockTarget::Cluster(_) | LockTarget::Redlock(_) | LockTarget::Sentinel(_) => {
                panic!("this scenario runs on a single lock server")
            }
        }
    }

    pub fn lock_mut(&mut self) -> &mut RedisServer {
        match &mut self.target {
            LockTarget::Server(s) => s,
            LockTarget::Cluster(_) | LockTarget::Redlock(_) | LockTarget::Sentinel(_) => {
                panic!("this scenario runs on a single lock server")
            }
        }
    }

    /// A worker connected to `url` (the lock server or a proxy in front of it).
    pub fn worker(&self, id: u32, url: &str, mode: &str, args: &[(&str, String)]) -> Worker {
        self.worker_with(id, ("url", url.to_owned()), mode, args)
    }

    /// A worker connected to the lock target itself: `--url` of the server,
    /// `--cluster-urls` of every cluster node, or `--redlock-urls` of every
    /// Redlock member.
    pub fn target_worker(&self, id: u32, mode: &str, args: &[(&str, String)]) -> Worker {
        let target = match &self.target {
            LockTarget::Server(s) => ("url", s.url()),
            LockTarget::Cluster(c) => ("cluster-urls", c.urls().join(",")),
            LockTarget::Redlock(members) => ("redlock-urls", redlock_urls(members).join(",")),
            LockTarget::Sentinel(fixture) => ("sentinel-urls", fixture.sentinel_urls().join(",")),
        };
        let mut args = args.to_vec();
        if let LockTarget::Sentinel(fixture) = &self.target {
            args.push(("master-name", fixture.master_name().to_owned()));
        }
        self.worker_with(id, target, mode, &args)
    }

    pub fn worker_with(
        &self,
        id: u32,
        target: (&str, String),
        mode: &str,
        args: &[(&str, String)],
    ) -> Worker {
        let mut all: Vec<(&str, String)> = vec![
            target,
            ("store-url", self.store.url()),
            ("prefix", PREFIX.to_owned()),
            ("mode", mode.to_owned()),
        ];
        all.extend(args.iter().cloned());
        Worker::spawn(Path::new(WORKER), id, &self.dir, &all)
    }

    pub async fn store_conn(&self) -> MultiplexedConnection {
        store::connect(&self.store.url())
            .await
            .expect("connect to the store")
    }

    pub async fn lock_conn(&self) -> MultiplexedConnection {
        self.lock()
            .client()
            .await
            .expect("connect to the lock server")
    }

    /// One connection to every node of the lock target (not cluster-aware: for
    /// `KEYS`, which a cluster node answers for its own slots only); every
    /// Redlock member that runs.
    pub async fn lock_node_conns(&self) -> Vec<MultiplexedConnection> {
        match &self.target {
            LockTarget::Server(_) => vec![self.lock_conn().await],
            LockTarget::Cluster(c) => {
                let mut conns = Vec::new();
                for node in c.nodes().into_iter().filter(|n| n.is_running) {
                    let client = redis::Client::open(node.url.as_str()).expect("node url");
                    conns.push(
                        client
                            .get_multiplexed_async_connection()
                            .await
                            .expect("connect to a cluster node"),
                    );
                }
                conns
            }
            LockTarget::Redlock(members) => {
                let mut conns = Vec::new();
                for m in members.iter().filter(|m| m.is_running()) {
                    conns.push(m.client().await.expect("connect to a Redlock member"));
                }
                conns
            }
            // The master the sentinels name (its replicas hold copies).
            LockTarget::Sentinel(fixture) => {
                let url = fixture.master_url().expect("the current master");
                vec![redis::Client::open(url.as_str())
                    .expect("master url")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect to the master")]
            }
        }
    }

    /// `PTTL` of a key of the lock target, wherever its slot lives (on a
    /// Redlock, the largest over the members).
    pub async fn pttl(&self, key: &str) -> i64 {
        let mut cmd = redis::cmd("PTTL");
        cmd.arg(key);
        match &self.target {
            LockTarget::Server(_) => cmd.query_async(&mut self.lock_conn().await).await,
            LockTarget::Cluster(c) => {
                let mut conn = c.cluster_connection().await.expect("cluster connection");
                cmd.query_async(&mut conn).await
            }
            LockTarget::Sentinel(_) => {
                let mut conns = self.lock_node_conns().await;
                cmd.query_async(&mut conns[0]).await
            }
            LockTarget::Redlock(_) => {
                let mut largest = -2;
                for mut conn in self.lock_node_conns().await {
                    let pttl: i64 = cmd.query_async(&mut conn).await.expect("PTTL");
                    largest = largest.max(pttl);
                }
                Ok(largest)
            }
        }
        .expect("PTTL")
    }

    /// A manager on the lock target, for `redis_names` and direct probing.
    pub async fn manager(&self) -> LockManager {
        let builder = match &self.target {
            LockTarget::Server(s) => LockManager::builder(&s.url()),
            LockTarget::Cluster(c) => LockManager::cluster_builder(c.urls()),
            LockTarget::Redlock(members) => LockManager::redlock_builder(redlock_urls(members)),
            LockTarget::Sentinel(fixture) => {
                LockManager::sentinel_builder(fixture.sentinel_urls(), fixture.master_name())
            }
        };
        builder
            .key_prefix(PREFIX)
            .build()
            .await
            .expect("connect to the lock target")
    }

    /// `n` user keys `k0`, `k1`, ... for the scenario; on a cluster, chosen (in
    /// that order, `k0` always first) so that every master owns at least one
    /// lock, checked against the cluster's slot map.
    pub async fn keys(&self, n: usize) -> Vec<String> {
        let LockTarget::Cluster(c) = &self.target else {
            return keys(n);
        };
        let manager = self.manager().await;
        let masters = c
            .nodes()
            .iter()
            .filter(|n| matches!(n.role, ClusterNodeRole::Master))
            .count();
        assert!(n >= masters, "{n} keys cannot cover {masters} masters");
        let mut chosen: Vec<(String, usize)> = Vec::new();
        for i in 0.. {
            let key = format!("k{i}");
            let owner = c
                .master_of_key(&manager.redis_names(&key).lock)
                .expect("master_of_key");
            let covered: BTreeSet<usize> = chosen.iter().map(|(_, o)| *o).collect();
            let missing = masters - covered.len();
            let left = n - chosen.len();
            // Take a key of a master not covered yet, or any key once the rest
            // of the places can still cover the missing masters.
            if !covered.contains(&owner) || left > missing || i == 0 {
                chosen.push((key, owner));
            }
            if chosen.len() == n {
                break;
            }
        }
        let owners: BTreeSet<usize> = chosen.iter().map(|(_, o)| *o).collect();
        assert_eq!(
            owners.len(),
            masters,
            "every master owns a lock: {chosen:?}"
        );
        println!("cluster keys (key, master): {chosen:?}");
        chosen.into_iter().map(|(k, _)| k).collect()
    }
}

pub fn redlock_urls(members: &[RedisServer]) -> Vec<String> {
    members.iter().map(RedisServer::url).collect()
}

pub fn args(pairs: &[(&'static str, &dyn ToString)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// A worker of the baseline load: 32 tasks on `keys` (comma-separated),
/// bodies of 0-5 ms, 10 % cancelled mid-body, 5 % panicking, `lease_ms`, a
/// 60 s wait, seeded by the worker's id; `more` adds (or overrides) arguments.
pub fn mixed_load(
    id: u32,
    keys: &str,
    lease_ms: u128,
    more: &[(&'static str, &dyn ToString)],
) -> Vec<(&'static str, String)> {
    let mut all = args(&[
        ("keys", &keys),
        ("tasks", &32),
        ("body-us", &"0-5000"),
        ("cancel-pct", &10),
        ("panic-pct", &5),
        ("lease-ms", &lease_ms),
        ("wait-ms", &60_000),
        ("seed", &(id + 1)),
    ]);
    all.extend(args(more));
    all
}

pub async fn ready(workers: &mut [&mut Worker]) {
    for w in workers.iter_mut() {
        w.expect_word("READY", Duration::from_secs(20)).await;
    }
}

/// Waits for a clean exit and returns the `DRAINED` figures (ms, tasks left).
pub async fn finish(w: &mut Worker, limit: Duration) -> (u64, u64) {
    w.finish(limit).await;
    let drained = w
        .seen_words("DRAINED")
        .pop()
        .unwrap_or_else(|| panic!("worker {} did not print DRAINED", w.id));
    (num(&drained, 0), num(&drained, 1))
}

pub fn history(workers: &[&Worker]) -> History {
    let paths: Vec<PathBuf> = workers.iter().map(|w| w.log.clone()).collect();
    History::read_all(paths.iter().map(PathBuf::as_path)).expect("read the worker logs")
}

/// Checks the store of every key against the history.
pub async fn store_report(setup: &Setup, h: &History, keys: &[String]) -> StoreReport {
    let mut conn = setup.store_conn().await;
    let store = FencedStore::default();
    let mut total = StoreReport::default();
    for key in keys {
        let log = store.log(&mut conn, key).await.expect("store log");
        let stats = store.stats(&mut conn, key).await.expect("store stats");
        total.merge(&check_store(key, &h.sections, &h.zombies, &log, stats));
    }
    assert!(
        total.mismatches.is_empty(),
        "the store's log disagrees with the clients:\n{}",
        total.mismatches.join("\n")
    );
    assert_eq!(
        total.stale_accepted, 0,
        "the store accepted writes with tokens lower than one it had seen"
    );
    total
}

/// Lock keys left in the lock target: every key under the prefix, on every node,
/// must be a fencing counter of one of `keys` (so no lock of `keys` exists),
/// or a release's receipt (`released:`, on Cluster and Sentinel), which
/// expires within seconds on its own.
pub async fn leaked_locks(setup: &Setup, keys: &[String]) -> Vec<String> {
    let manager = setup.manager().await;
    let counters: BTreeSet<String> = keys
        .iter()
        .map(|k| manager.redis_names(k).fencing_counter().to_owned())
        .collect();
    let receipts = format!("{}released:{{", manager.key_prefix());
    let mut leaked = Vec::new();
    for mut conn in setup.lock_node_conns().await {
        let all: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        leaked.extend(
            all.into_iter()
                .filter(|k| !counters.contains(k) && !k.starts_with(&receipts)),
        );
    }
    leaked
}

pub fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i}")).collect()
}

/// Prints the figures every lock scenario has (the checker's and the store's
/// reports, the faults, the leaks) and the scenario's own, `extra`, as its
/// `TORTURE` line ([`torture_line`]).
pub fn figures(name: &str, r: &Report, s: &StoreReport, faults: &str, leaked: usize, extra: &str) {
    torture_line(
        name,
        None,
        &format!(
            "sections={} faults={faults} overlaps={} amnesia_overlaps={} frozen_overlaps={} \
             stale_writes_accepted={} leaked_locks={leaked} lost={} ok={} cancelled={} panicked={} \
             lost_outcome={} writes_accepted={} writes_rejected={} lost_updates={} zombies_rejected={} \
             zombies_accepted={} {extra}",
            r.sections,
            r.overlaps.len(),
            r.amnesia_overlaps.len(),
            r.frozen_overlaps.len(),
            s.stale_accepted + s.zombies_accepted,
            r.lost,
            r.count(Outcome::Ok),
            r.count(Outcome::Cancelled),
            r.count(Outcome::Panicked),
            r.count(Outcome::Lost),
            s.accepted,
            s.rejected,
            s.lost_updates,
            s.zombies_rejected,
            s.zombies_accepted,
        ),
    );
}

pub async fn baseline(on: On) {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let (dir, name) = match on {
        On::Server => ("s1", "s1_baseline"),
        On::Cluster => ("s1c", "s1_baseline_cluster"),
        On::Redlock => ("s1r", "s1_baseline_redlock"),
    };
    let setup = setup_on(dir, on);
    // 128 tasks on 3 keys make about 20-30 Redlock sections/s here, against
    // about 160 on one server (split votes between concurrent acquirers end in
    // back-off; see the README): fewer sections keep the test near 30 s.
    let total = match on {
        On::Redlock => 500,
        On::Server | On::Cluster => 5_000,
    } * soak_factor();
    let processes = 4u32;
    let keys = setup.keys(3).await;
    let mut workers = ready_all(
        (0..processes)
            .map(|id| {
                let share = total / u64::from(processes)
                    + u64::from(id < (total % u64::from(processes)) as u32);
                setup.target_worker(
                    id,
                    "run",
                    &mixed_load(id, &keys.join(","), 2000, &[("sections", &share)]),
                )
            })
            .collect(),
    )
    .await;
    let drains = finish_all(
        &mut workers,
        Duration::from_secs(300) * soak_factor() as u32,
    )
    .await;
    let h = history_of(&workers);
    let (report, stored, leaked) = judge(&setup, &h, &keys, &Faults::default()).await;
    figures(
        name,
        &report,
        &stored,
        &cancels_and_panics(&report),
        leaked.len(),
        &format!(
            "drain_ms_max={} secs={:.1}",
            longest_drain(&drains),
            started.elapsed().as_secs_f64()
        ),
    );

    assert_eq!(report.sections as u64, total, "every ticket is one section");
    report.assert_clean("baseline");
    assert_eq!(report.lost, 0, "no lease may be lost without a fault");
    let ok = report.count(Outcome::Ok) as u64;
    assert_eq!(
        ok + report.count(Outcome::Cancelled) as u64 + report.count(Outcome::Panicked) as u64,
        total,
        "{:?}",
        report.outcomes
    );
    // The injections happened: about 10 % and 5 % (bodies under 1 ms are never cancelled).
    assert!(
        report.count(Outcome::Cancelled) as u64 >= total / 25,
        "{:?}",
        report.outcomes
    );
    assert!(
        report.count(Outcome::Panicked) as u64 >= total / 50,
        "{:?}",
        report.outcomes
    );
    // The exact counter: every completed section added one, nothing else did.
    assert_exact_counter(&report, &stored);
    assert!(leaked.is_empty(), "locks left in Redis: {leaked:?}");
    assert_drained(&workers, &drains);
}

/// How long a queued waiter's entry lasts without a refresh (`QUEUE_LEASE` in
/// lock-runtime/src/request.rs).
pub const QUEUE_LEASE: Duration = Duration::from_secs(3);

/// Slack for "at most X after Y" bounds: scheduling on a busy 2-core machine.
pub const SLACK: Duration = Duration::from_millis(300);

/// How long after a master's kill a worker may still read a grant that master
/// made before it. A failover's amnesia window (`Faults::amnesia`) starts this
/// long after the kill: the checker excuses only the grants seen before the
/// window's start, and a worker on a loaded machine reads a reply late. Sound
/// while no other master can grant the old master's locks this soon: Sentinel
/// declares a master down after 1 s (`down-after-milliseconds`), a cluster
/// after its node timeout (2 s).
pub const GRANTS_READ_LATE: Duration = Duration::from_millis(500);

pub fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// Reads whatever lines are already there, then waits for `n` more `PROGRESS`
/// lines: the worker completed sections after this call.
pub async fn progress(w: &mut Worker, n: usize, limit: Duration) {
    while w.next_line(Duration::ZERO).await.is_some() {}
    for _ in 0..n {
        w.expect_word("PROGRESS", limit).await;
    }
}

/// Longest acquire and release calls of `worker` (all workers if `None`), checked
/// against their bounds: an acquire may wait `wait` and then run one more attempt
/// of at most the command timeout; a release is one call.
pub fn assert_calls_bounded(
    h: &History,
    worker: Option<u32>,
    wait: Duration,
    cmd_timeout: Duration,
) -> (u64, u64, usize) {
    let (mut acq, mut rel, mut errors) = (0u64, 0u64, 0usize);
    for c in h
        .calls
        .iter()
        .filter(|c| worker.is_none_or(|w| c.worker == w))
    {
        let took = c.end - c.start;
        let bound = match c.kind {
            CallKind::Acquire => {
                acq = acq.max(took);
                wait + cmd_timeout + SLACK
            }
            CallKind::Release => {
                rel = rel.max(took);
                cmd_timeout + SLACK
            }
            CallKind::Ending => continue,
        };
        errors += usize::from(!matches!(c.result, CallResult::Ok | CallResult::Lost));
        assert!(
            took <= ns(bound),
            "worker {} {:?} of {} took {:.1} ms (bound {bound:?}): {:?}",
            c.worker,
            c.kind,
            c.key,
            ms(took),
            c.result
        );
    }
    (acq, rel, errors)
}

pub async fn killed_holder(on: On) {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let (dir, name) = match on {
        On::Server => ("s7", "s7_kill9"),
        On::Cluster => ("s7c", "s7_kill9_cluster"),
        On::Redlock => ("s7r", "s7_kill9_redlock"),
    };
    let setup = setup_on(dir, on);
    let lease = Duration::from_millis(500);
    let lease_ms = lease.as_millis();
    let keys = setup.keys(3).await;
    // The victim's key; `k0` on both targets.
    let k0 = keys[0].clone();
    let run_args = |id: u32, body: &str, tasks: u32| {
        args(&[
            ("keys", &keys.join(",")),
            ("tasks", &tasks),
            ("body-us", &body.to_owned()),
            ("lease-ms", &lease_ms),
            ("wait-ms", &5000),
            ("progress", &20),
            ("seed", &(id + 1)),
        ])
    };
    let survivors = vec![
        setup.target_worker(0, "run", &run_args(0, "0-5000", 8)),
        setup.target_worker(1, "run", &run_args(1, "0-5000", 8)),
    ];
    // Long bodies: it holds a lock most of the time when killed.
    let mut doomed = setup.target_worker(2, "run", &run_args(2, "20000-100000", 4));
    let mut victim = setup.target_worker(3, "script", &[]);
    let t = Duration::from_secs(30);
    let mut survivors = ready_all_beside(survivors, &mut [&mut doomed, &mut victim]).await;
    progress_all(&mut survivors, 1, t).await;
    progress(&mut doomed, 1, t).await;

    let mut killed = KilledHolder::acquire_and_kill(&mut victim, &k0, lease_ms, t).await;
    let lock_name = setup.manager().await.redis_names(&k0).lock;
    let pttl = setup.pttl(&lock_name).await;
    let t_kill2 = mono_ns();
    doomed.kill9();
    killed.read_last_deadline(&mut victim).await;

    progress_all(&mut survivors, 3, t).await;
    // Let the killed workers' leases run out before the leak check.
    sleep_until(t_kill2 + ns(lease) + 50_000_000).await;
    stop_all(&mut survivors, t).await;
    let mut h = history(&[&survivors[0], &survivors[1], &doomed]);
    h.sections.push(killed.section(&k0));
    let (report, stored, leaked) = judge(&setup, &h, &keys, &Faults::default()).await;
    let next_v = first_granted_after(&h, &k0, killed.at);
    let worst_gap = keys
        .iter()
        .map(|k| first_granted_after(&h, k, t_kill2) - t_kill2)
        .max()
        .unwrap_or(0);
    figures(
        name,
        &report,
        &stored,
        "2xkill-9",
        leaked.len(),
        &format!(
            "pttl_at_kill_ms={pttl} k0_free_after_kill_ms={:.1} worst_key_gap_after_kill_ms={:.1} unreported_writes={} secs={:.1}",
            diff_ms(next_v, killed.at),
            ms(worst_gap),
            stored.unreported,
            started.elapsed().as_secs_f64()
        ),
    );
    assert!(
        pttl > 0 && pttl <= lease_ms as i64,
        "PTTL {pttl} at the kill"
    );
    killed.assert_freed(&k0, next_v, worst_gap, lease);
    report.assert_clean("kill -9");
    assert!(
        stored.unreported <= 4,
        "{} unreported writes",
        stored.unreported
    );
    assert_eq!(stored.lost_updates, 0);
    assert!(leaked.is_empty(), "locks left in Redis: {leaked:?}");
}

/// When the first section of `key` after `at` was granted.
pub fn first_granted_after(h: &History, key: &str, at: u64) -> u64 {
    h.sections
        .iter()
        .filter(|s| s.key == key && s.acquired > at)
        .map(|s| s.acquired)
        .min()
        .unwrap_or_else(|| panic!("nobody took {key} after the kill"))
}

/// The hold of s7's victim, killed with `kill -9` after a renewal.
pub struct KilledHolder {
    /// Its `ACQ` line.
    acq: Vec<String>,
    /// When it was killed.
    pub at: u64,
    /// Its last known deadline.
    deadline: u64,
}

impl KilledHolder {
    /// Has `victim` (a script worker) take `key`, awaits a renewal, kills it.
    async fn acquire_and_kill(victim: &mut Worker, key: &str, lease_ms: u128, t: Duration) -> Self {
        victim.send(&format!("acquire v {key} {lease_ms} 10000 5"));
        let acq = victim.expect_event("ACQ", "v", t).await;
        assert_eq!(acq[0], "ok", "{acq:?}");
        victim.expect_event("RENEWED", "v", t).await;
        let at = mono_ns();
        victim.kill9();
        KilledHolder {
            acq,
            at,
            deadline: 0,
        }
    }

    /// The victim's last known deadline (lines it printed before dying).
    async fn read_last_deadline(&mut self, victim: &mut Worker) {
        while victim.next_line(Duration::from_millis(200)).await.is_some() {}
        self.deadline = victim
            .seen_words("RENEWED")
            .iter()
            .map(|f| num(f, 1))
            .chain([num(&self.acq, 4)])
            .max()
            .expect("a deadline");
    }

    /// The victim's section as far as it got: granted, killed.
    fn section(&self, key: &str) -> lock_torture::history::Section {
        use lock_torture::history::{Kind, Release, Section, Write};
        Section {
            worker: 3,
            task: 0,
            key: key.to_owned(),
            token: num(&self.acq, 1),
            outcome: Outcome::Cancelled,
            lost: false,
            lost_at: 0,
            acquired: num(&self.acq, 3),
            last_active: self.at,
            deadline: self.deadline,
            write: Write::None,
            release: Release::Dropped,
            release_start: self.at,
            release_end: self.at,
            kind: Kind::Lock,
        }
    }

    /// `key`, the victim's, was next granted at `next` and every key within
    /// `worst_gap` of the second kill.
    fn assert_freed(&self, key: &str, next: u64, worst_gap: u64, lease: Duration) {
        // The victim's lock runs out within its lease. The default lock is fair:
        // the doomed worker, killed just after, may have waiters queued on k0
        // ahead of the survivors'. A dead waiter's entry is dropped once its queue
        // lease (3 s after its last refresh, before the kill) has run out, and a
        // lock handed to one meanwhile lasts at most the hand-off TTL (the lease
        // here, which is shorter than the queue lease). So a survivor holds k0
        // within lease + queue lease + lease (+ SLACK for scheduling).
        let free_bound = lease + QUEUE_LEASE + lease + SLACK;
        assert!(
            next - self.at <= ns(free_bound),
            "{key} was taken again only {:.1} ms after its holder was killed (bound {free_bound:?})",
            diff_ms(next, self.at)
        );
        assert!(
            next > self.deadline + ns(drift(lease)) - 1_000_000,
            "{key} was taken again {:.1} ms after the killed holder's deadline",
            diff_ms(next, self.deadline)
        );
        // The same bound for every key after the second kill (see `free_bound`).
        assert!(
            worst_gap <= ns(free_bound),
            "a key stayed locked {:.1} ms after a kill",
            ms(worst_gap)
        );
    }
}
