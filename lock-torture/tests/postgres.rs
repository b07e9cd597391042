//! The torture scenarios with the locks on PostgreSQL (the `postgres`
//! feature): worker processes on a private PostgreSQL while its own faults are
//! injected, judged by the same history checker as the Redis scenarios, and
//! the sabotages that checker must catch there.
//!
//! The fenced store is a PostgreSQL table (`lock_torture::store::PgStore`,
//! `src/store.sql`) on a second private server, so that the faults of the lock
//! server (terminated backends, an immediate restart) do not touch it, as the
//! Redis scenarios keep their store on a `redis-server` of its own.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use distlock_testing::PostgresServer;
use lock_torture::checker::{check_sections, check_store, Faults, StoreReport};
use lock_torture::clock::{diff_ms, mono_ns, ns};
use lock_torture::history::{History, Kind, Outcome, Release, Section, Write};
use lock_torture::process::{num, RunDir, Worker};
use lock_torture::soak_factor;
use lock_torture::store::PgStore;

use support::{
    args, assert_every_key_granted_after, drift, figures, finish, history, keys, progress,
    progress_all, ready, sleep_until, stop_all, PREFIX, QUEUE_LEASE, SERIAL, SLACK, WORKER,
};

/// The application names the PostgreSQL backend gives its data and listening
/// connections (`DATA_APPLICATION`, `LISTEN_APPLICATION` in
/// lock-runtime/src/backend/postgres/mod.rs): the faults find the workers'
/// sessions by them.
const DATA_APPLICATION: &str = "distlock";
const LISTEN_APPLICATION: &str = "distlock-listen";

/// The schema distlock creates by default.
const SCHEMA: &str = "distlock";

/// A scenario's servers and scratch directory: the locks on one private
/// PostgreSQL (the one faults go to), the fenced store on another.
struct PgSetup {
    lock: PostgresServer,
    store: PostgresServer,
    dir: RunDir,
}

impl PgSetup {
    async fn new(name: &str) -> PgSetup {
        let lock = PostgresServer::start().expect("PostgreSQL must be installed");
        let store = PostgresServer::start().expect("PostgreSQL must be installed");
        PgStore::create(&store.url())
            .await
            .expect("create the fenced store");
        PgSetup {
            lock,
            store,
            dir: RunDir::new(name),
        }
    }

    /// A worker on the lock server and the PostgreSQL store.
    fn worker(&self, id: u32, mode: &str, more: &[(&str, String)]) -> Worker {
        let mut all: Vec<(&str, String)> = vec![
            ("url", self.lock.url()),
            ("store-url", self.store.url()),
            ("prefix", PREFIX.to_owned()),
            ("mode", mode.to_owned()),
        ];
        all.extend(more.iter().cloned());
        Worker::spawn(Path::new(WORKER), id, &self.dir, &all)
    }

    /// The store's log of every key checked against the history: the
    /// clients and the log agree, and (when `fenced`) no stale write was
    /// accepted.
    async fn store_report(&self, h: &History, keys: &[String], fenced: bool) -> StoreReport {
        let store = PgStore::connect(&self.store.url())
            .await
            .expect("connect to the store");
        let mut total = StoreReport::default();
        for key in keys {
            let log = store.log(key).await.expect("store log");
            let stats = store.stats(key).await.expect("store stats");
            total.merge(&check_store(key, &h.sections, &h.zombies, &log, stats));
        }
        assert!(
            total.mismatches.is_empty(),
            "the store's log disagrees with the clients:\n{}",
            total.mismatches.join("\n")
        );
        if fenced {
            assert_eq!(
                total.stale_accepted, 0,
                "the store accepted writes with tokens lower than one it had seen"
            );
        }
        total
    }

    /// Counts rows of distlock's tables on the lock server: `filter` is a
    /// WHERE clause.
    fn rows(&self, table: &str, filter: &str) -> usize {
        let out = self
            .lock
            .psql(&format!(
                "SELECT count(*) FROM {SCHEMA}.{table} WHERE {filter}"
            ))
            .expect("count rows");
        out.parse().expect("a count")
    }

    /// Waits until no lock row is held and no queue entry is live, within
    /// `limit`; then runs the sweep once, after which both tables must be
    /// empty. The rows left (held locks, live queue entries, rows the sweep
    /// did not take), empty when nothing leaked.
    async fn leaks(&self, limit: Duration) -> Vec<String> {
        let until = Instant::now() + limit;
        let live = "expires_at > clock_timestamp()";
        while (self.rows("locks", live) + self.rows("waiters", live)) > 0 && Instant::now() < until
        {
            // Polled: rows end by the server's clock, which sends no event.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.lock
            .psql(&format!("SELECT {SCHEMA}.sweep(100000)"))
            .expect("sweep");
        let left = self
            .lock
            .psql(&format!(
                "SELECT 'lock ' || name || ' ' || owner || ' live=' || (expires_at > clock_timestamp()) \
                 FROM {SCHEMA}.locks UNION ALL \
                 SELECT 'waiter ' || name || ' ' || owner || ' live=' || (expires_at > clock_timestamp()) \
                 FROM {SCHEMA}.waiters"
            ))
            .expect("rows left");
        left.lines().map(str::to_owned).collect()
    }
}

/// Sabotage: the unsafe client of `s0_the_checker_catches_an_unsafe_client`
/// (single.rs) on PostgreSQL — it ignores a lost lease, never renews, and its
/// bodies outlast its lease — must show overlaps and lost updates; the fenced
/// store still accepts no stale write. Then the same client on a store with
/// its token check off (`--store-unchecked`): the store check must find the
/// stale writes it accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p0_the_checker_catches_an_unsafe_client_on_postgres() {
    let _serial = SERIAL.lock().await;
    let setup = PgSetup::new("p0").await;
    let min_lease_us = distlock::MIN_LEASE.as_micros();
    for (round, unchecked) in [(0usize, false), (1, true)] {
        let key = format!("k{round}");
        let mut workers: Vec<Worker> = (0..2)
            .map(|id| {
                setup.worker(
                    2 * round as u32 + id,
                    "run",
                    &args(&[
                        ("keys", &key),
                        ("tasks", &4),
                        ("sections", &100),
                        ("body-us", &format!("{}-{}", min_lease_us, 3 * min_lease_us)),
                        ("lease-ms", &distlock::MIN_LEASE.as_millis()),
                        ("renew", &0),
                        ("ignore-loss", &1),
                        ("wait-ms", &10_000),
                        ("store-unchecked", &u8::from(unchecked)),
                        ("seed", &(id + 1)),
                    ]),
                )
            })
            .collect();
        ready(&mut workers.iter_mut().collect::<Vec<_>>()).await;
        for w in &mut workers {
            finish(w, Duration::from_secs(120)).await;
        }
        let h = history(&workers.iter().collect::<Vec<_>>());
        let report = check_sections(&h.sections, &Faults::default());
        let stored = setup.store_report(&h, &[key], !unchecked).await;
        let name = if unchecked {
            "p0_control_postgres_unchecked_store"
        } else {
            "p0_control_postgres"
        };
        figures(name, &report, &stored, "unsafe-client", 0, "");
        assert_eq!(report.sections, 200);
        assert!(
            !report.overlaps.is_empty(),
            "the checker found no overlap in a run of an unsafe client"
        );
        if unchecked {
            assert!(
                stored.stale_accepted > 0,
                "the store check found no stale write accepted by a store without its token check"
            );
        } else {
            assert!(
                stored.lost_updates > 0,
                "the store check found no lost update in a run of an unsafe client"
            );
        }
    }
}

/// Scenario p1: run workers on three keys while PostgreSQL's own faults hit
/// them, each fault awaited until every survivor completed sections again:
/// the workers' data connections terminated (`pg_terminate_backend`), their
/// listening connections terminated, the server restarted with `-m
/// immediate`, a holder frozen (SIGSTOP) for three leases (a lost signal at
/// resume, its zombie write refused), a holder killed with `kill -9` after a
/// renewal and a worker with long bodies killed too. `DISTLOCK_SOAK` repeats
/// the cycle of faults. Judged: no overlap without a prior lost signal,
/// tokens growing per key, no stale fenced write accepted, no lock row or
/// queue entry left once every worker is gone and the leases passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_postgres_faults() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let mut setup = PgSetup::new("p1").await;
    let lease = Duration::from_millis(1000);
    let lease_ms = lease.as_millis();
    let keys = keys(3);
    let t = Duration::from_secs(30);
    let run_args = |id: u32, body: &str, tasks: u32| {
        args(&[
            ("keys", &keys.join(",")),
            ("tasks", &tasks),
            ("body-us", &body.to_owned()),
            ("lease-ms", &lease_ms),
            ("wait-ms", &10_000),
            ("cmd-timeout-ms", &1000),
            ("connect-timeout-ms", &1000),
            ("retry-ms", &20),
            ("progress", &20),
            ("seed", &(id + 1)),
        ])
    };
    let mut survivors: Vec<Worker> = (0..3)
        .map(|id| setup.worker(id, "run", &run_args(id, "0-5000", 8)))
        .collect();
    let mut frozen = setup.worker(10, "script", &[]);
    let mut doomed = Vec::new();
    let mut victims = Vec::new();
    {
        let mut all: Vec<&mut Worker> = survivors.iter_mut().collect();
        all.push(&mut frozen);
        ready(&mut all).await;
    }
    progress_all(&mut survivors, 1, t).await;

    let rounds = soak_factor() as usize;
    let mut faults = Faults::default();
    let mut killed_sections = Vec::new();
    // (SIGSTOP, the frozen holder's last known deadline) of each round.
    let mut frozen_holds = Vec::new();
    let (mut data_killed, mut listen_killed, mut worst_restart_ms) = (0, 0, 0u64);
    let mut t_last_fault = 0;
    for r in 0..rounds {
        // Long bodies: it holds a lock most of the time when killed.
        let id = 20 + r as u32;
        let mut d = setup.worker(id, "run", &run_args(id, "20000-100000", 4));
        let mut v = setup.worker(30 + r as u32, "script", &[]);
        ready(&mut [&mut d, &mut v]).await;

        // 1. The workers' data connections, then their listening ones.
        data_killed += setup
            .lock
            .kill_backends_named(DATA_APPLICATION)
            .expect("terminate the data connections");
        progress_all(&mut survivors, 2, t).await;
        listen_killed += setup
            .lock
            .kill_backends_named(LISTEN_APPLICATION)
            .expect("terminate the listening connections");
        progress_all(&mut survivors, 2, t).await;

        // 2. An immediate restart: no checkpoint, every session cut; the
        // committed lease rows (and the fencing sequence) survive it.
        let t0 = mono_ns();
        setup
            .lock
            .restart_immediate()
            .expect("restart -m immediate");
        worst_restart_ms = worst_restart_ms.max((mono_ns() - t0) / 1_000_000);
        progress_all(&mut survivors, 2, t).await;

        // 3. A holder of k0 frozen for three leases while the survivors take
        // k0: its lease runs out, it learns so at resume (lost signal), and
        // its write with the old token is refused by the store, which has
        // accepted a newer one meanwhile.
        let a = format!("f{r}");
        frozen.send(&format!("acquire {a} k0 {lease_ms} 10000 5"));
        let acq = frozen.expect_event("ACQ", &a, t).await;
        assert_eq!(acq[0], "ok", "{acq:?}");
        frozen.expect_event("RENEWED", &a, t).await;
        let t_stop = mono_ns();
        frozen.pause();
        // Time is the subject: the pause must outlast the lease.
        sleep_until(t_stop + 3 * ns(lease)).await;
        let t_cont = mono_ns();
        frozen.resume();
        faults.frozen.push((frozen.id, t_stop, t_cont));
        let lost = frozen.expect_event("LOST", &a, t).await;
        let (t_lost, last_active) = (num(&lost, 0), num(&lost, 1));
        let (deadline, prev_active) = (num(&lost, 2), num(&lost, 3));
        // The body is never polled again once the loss is known: only a poll
        // that had begun when SIGSTOP froze the process may end after SIGCONT
        // (the checker excuses the overlaps of that one poll, `frozen`).
        assert!(
            last_active <= t_stop || prev_active <= t_stop,
            "round {r}: the frozen holder's body was polled twice after SIGCONT \
             (polls ended {:.1} and {:.1} ms after SIGSTOP)",
            diff_ms(prev_active, t_stop),
            diff_ms(last_active, t_stop)
        );
        // The loss is known at resume: its deadline passed during the pause.
        assert!(
            t_lost >= t_cont && t_lost - t_cont <= ns(SLACK),
            "round {r}: loss seen {:.1} ms after SIGCONT",
            diff_ms(t_lost, t_cont)
        );
        frozen_holds.push((t_stop, deadline));
        let rel = frozen.expect_event("REL", &a, t).await;
        assert_eq!(
            rel[0], "lost",
            "round {r}: the frozen holder's release: {rel:?}"
        );
        progress_all(&mut survivors, 1, t).await;
        frozen.send(&format!("zombie {a}"));
        let zombie = frozen.expect_event("ZOMBIE", &a, t).await;
        assert_eq!(
            zombie[0], "rejected",
            "round {r}: the frozen holder's stale write was accepted: {zombie:?}"
        );

        // 4. kill -9 of a holder of k1 after a renewal, and of the worker with
        // long bodies.
        // The worker with long bodies is at work first: once the holder has
        // k1, its tasks (and the survivors') queue there until the kill.
        progress(&mut d, 1, t).await;
        v.send(&format!("acquire v k1 {lease_ms} 10000 5"));
        let acq = v.expect_event("ACQ", "v", t).await;
        assert_eq!(acq[0], "ok", "{acq:?}");
        v.expect_event("RENEWED", "v", t).await;
        let at = mono_ns();
        v.kill9();
        d.kill9();
        t_last_fault = mono_ns();
        while v.next_line(Duration::from_millis(200)).await.is_some() {}
        let deadline = v
            .seen_words("RENEWED")
            .iter()
            .map(|f| num(f, 1))
            .chain([num(&acq, 4)])
            .max()
            .expect("a deadline");
        killed_sections.push(killed_section(v.id, "k1", &acq, at, deadline));
        progress_all(&mut survivors, 2, t).await;
        doomed.push(d);
        victims.push(v);
    }

    // Every key is taken again after the last kill: the killed holders'
    // leases ran out (within a lease), their queue entries (within the queue
    // lease) too.
    progress_all(&mut survivors, 3, t).await;
    let drains = stop_all(&mut survivors, t).await;
    frozen.send("exit");
    finish(&mut frozen, t).await;
    let mut all: Vec<&Worker> = survivors.iter().collect();
    all.push(&frozen);
    all.extend(doomed.iter());
    let mut h = history(&all);
    h.sections.extend(killed_sections);
    let report = check_sections(&h.sections, &faults);
    let stored = setup.store_report(&h, &keys, true).await;
    // Every worker is gone: what is left must end within the killed
    // holders' lease and the queue lease of their entries, counted from the
    // last kill (plus SLACK for scheduling); `leaks` polls until then.
    let bound = (ns(QUEUE_LEASE.max(lease)) + ns(SLACK)).saturating_sub(mono_ns() - t_last_fault);
    let leaked = setup.leaks(Duration::from_nanos(bound)).await;
    figures(
        "p1_postgres_faults",
        &report,
        &stored,
        &format!("{rounds}x(kill-data+kill-listen+restart-immediate+SIGSTOP+2xkill-9)"),
        leaked.len(),
        &format!(
            "data_backends_killed={data_killed} listen_backends_killed={listen_killed} \
             restart_ms_max={worst_restart_ms} unreported_writes={} drain_ms_max={} secs={:.1}",
            stored.unreported,
            support::longest_drain(&drains),
            started.elapsed().as_secs_f64()
        ),
    );
    assert!(
        data_killed >= 3 * rounds && listen_killed >= 3 * rounds,
        "the faults found the workers' sessions: {data_killed} data, {listen_killed} listening"
    );
    report.assert_clean("PostgreSQL faults");
    assert!(
        report.lost >= rounds,
        "the frozen holder's loss is in the history: {} lost",
        report.lost
    );
    assert!(report.count(Outcome::Ok) > 0, "{:?}", report.outcomes);
    // A killed worker may leave its write in flight, unreported.
    assert!(
        stored.unreported <= 2 * rounds,
        "{} unreported writes",
        stored.unreported
    );
    assert_eq!(stored.zombies_accepted, 0);
    assert_eq!(stored.zombies_rejected, rounds);
    assert!(
        leaked.is_empty(),
        "rows left in distlock's tables: {leaked:?}"
    );
    assert_every_key_granted_after(&h, &keys, t_last_fault, 1, "last kill");
    // Nobody took k0 from the frozen holder before its deadline (+ the
    // runtime's drift allowance, less 1 ms for the clocks' reading order).
    for (t_stop, deadline) in frozen_holds {
        let next = h
            .sections
            .iter()
            .filter(|s| s.key == "k0" && s.worker != frozen.id && s.acquired > t_stop)
            .map(|s| s.acquired)
            .min()
            .expect("k0 was taken during the freeze");
        assert!(
            next > deadline + ns(drift(lease)) - 1_000_000,
            "k0 was taken {:.1} ms after the frozen holder's deadline",
            diff_ms(next, deadline)
        );
    }
    support::assert_drained(&survivors, &drains);
}

/// A killed script holder's section as far as it got: granted (its `ACQ`
/// line), killed at `at`, its last known deadline `deadline`.
fn killed_section(worker: u32, key: &str, acq: &[String], at: u64, deadline: u64) -> Section {
    Section {
        worker,
        task: 0,
        key: key.to_owned(),
        token: num(acq, 1),
        outcome: Outcome::Cancelled,
        lost: false,
        lost_at: 0,
        acquired: num(acq, 3),
        last_active: at,
        deadline,
        write: Write::None,
        release: Release::Dropped,
        release_start: at,
        release_end: at,
        kind: Kind::Lock,
    }
}
