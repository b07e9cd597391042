//! The torture scenarios on a private Redis Cluster: the baseline and a killed
//! holder as on one server, then a master killed, a slot migrated and a master
//! paused under load.
//!
//! Each test prints a `TORTURE ...` line with its figures (run with `--nocapture`),
//! kept as a results file when `TORTURE_RESULTS` is set (`support::torture_line`);
//! `DISTLOCK_SOAK=1` multiplies the sizes by 20. The tests take a process-wide lock
//! so they run one at a time: they measure time, and the machine has 2 cores.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use distlock_testing::RedisCluster;
use lock_torture::checker::Faults;
use lock_torture::clock::{diff_ms, mono_ns, ns};
use lock_torture::history::{History, Section};
use lock_torture::process::Worker;

mod support;

use support::*;

/// Scenario 1 on a 3-master Redis Cluster, each master owning a key's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1c_baseline_torture_on_a_cluster() {
    baseline(On::Cluster).await;
}

/// Scenario 7 on a 3-master Redis Cluster, each master owning a key's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s7c_a_killed_holder_frees_its_lock_within_the_lease_on_a_cluster() {
    killed_holder(On::Cluster).await;
}

/// What scenarios 13c-15c do to the master of the first key, mid-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClusterFault {
    /// `kill -9`; its replica is promoted by the cluster.
    KillMaster,
    /// The first key's slot (every Redis name of the key shares it) moved to
    /// another master, keys and all (`MIGRATING`/`IMPORTING`, `MIGRATE`; the
    /// clients meet `ASK` and `MOVED`).
    MigrateSlot,
    /// SIGSTOP for 1.5 leases, then SIGCONT: past the lease, short of the
    /// cluster's node timeout (2 s), so no failover.
    PauseMaster,
}

/// Scenario 13c: a master of a 3-master cluster (one replica each) holding
/// locks is killed with `kill -9` mid-run; its replica is promoted by the
/// cluster. Expected, from the guarantees: no overlap unless the earlier holder
/// had reported its loss, or the failover forgot the lock (a write not yet
/// replicated: the checker's amnesia window, from the kill to the promotion);
/// tokens keep growing; the fenced store refuses out-of-order writes (lost
/// updates at most one per forgotten lock); nothing leaked; and every worker
/// goes on working on every key once the replica has taken over (this found a
/// client that kept calling the dead master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s13c_a_killed_cluster_master_is_failed_over_under_load() {
    cluster_fault(ClusterFault::KillMaster).await;
}

/// Scenario 14c: the slot of a contended, locked key migrates to another
/// master under load. Expected: no overlap at all (a migration moves the lock
/// with its TTL; nothing is forgotten), tokens increase, exact store, nothing
/// leaked, every key granted again after the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s14c_a_slot_migrates_under_load() {
    cluster_fault(ClusterFault::MigrateSlot).await;
}

/// Scenario 15c: a master is paused (SIGSTOP) past the lease, then resumed.
/// Expected: holders of its locks, in bodies longer than the lease, stop by
/// their local deadline (no body poll past the pause + lease), and no one else
/// is granted its locks before Redis (resumed) finds them expired: no overlap
/// unless the earlier holder reported its loss first; tokens increase; no
/// stale write accepted; nothing leaked; work goes on after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s15c_a_paused_cluster_master_costs_leases_not_safety() {
    cluster_fault(ClusterFault::PauseMaster).await;
}

/// How a cluster scenario loads the cluster.
struct ClusterLoad {
    lease: Duration,
    body_us: &'static str,
    step_ms: u32,
    tasks: u32,
    /// Sections per progress mark.
    every: u32,
    /// Progress marks awaited before the fault and after it.
    before: usize,
    after: usize,
    /// Grants of each key after the fault, at least.
    granted_after: usize,
}

impl ClusterLoad {
    fn of(fault: ClusterFault) -> Self {
        match fault {
            // The pause must outlast the lease and stay short of the node
            // timeout. Its bodies (2-4 s) outlast the lease plus the slack of
            // the bound below, so that a holder the pause catches is most
            // often still in its body past its local deadline (down + lease -
            // drift), and sometimes past the resume: it must stop by that
            // deadline. They sleep in 20 ms steps, so that the log's last poll
            // follows a body that runs on. 8 tasks a process (32 for 6 keys,
            // every key contended): with 32, a process could wait more than
            // 30 s for a section.
            ClusterFault::PauseMaster => ClusterLoad {
                lease: Duration::from_millis(1000),
                body_us: "2000000-4000000",
                step_ms: 20,
                tasks: 8,
                every: 1,
                before: 1,
                after: 1,
                granted_after: 1,
            },
            // Short bodies, for many sections.
            ClusterFault::KillMaster | ClusterFault::MigrateSlot => ClusterLoad {
                lease: Duration::from_millis(2000),
                body_us: "200-5000",
                step_ms: 0,
                tasks: 32,
                every: 50,
                before: 2,
                after: 4,
                granted_after: 5,
            },
        }
    }
}

impl ClusterLoad {
    /// Four workers of this load on `keys` of the cluster, ready: a 5 s
    /// wait, 500 ms timeouts.
    async fn start(&self, setup: &Setup, keys: &[String]) -> Vec<Worker> {
        let timing = (
            self.lease,
            Duration::from_millis(5000),
            Duration::from_millis(500),
        );
        let more: [(&'static str, &dyn ToString); 4] = [
            ("tasks", &self.tasks),
            ("body-us", &self.body_us),
            ("body-step-ms", &self.step_ms),
            ("progress", &self.every),
        ];
        let load_of = |id| timed_load(id, &keys.join(","), timing, &more);
        ready_all(
            (0..4)
                .map(|id| setup.target_worker(id, "run", &load_of(id)))
                .collect(),
        )
        .await
    }
}

/// The master a cluster scenario strikes: the first key's, with the Redis
/// names of that key's lock and fencing counter, and the keys whose locks it
/// owns (before a migration moves one).
struct Victim {
    master: usize,
    first_lock: String,
    first_counter: String,
    keys: BTreeSet<String>,
}

async fn victim(setup: &Setup, keys: &[String]) -> Victim {
    let manager = setup.manager().await;
    let first_lock = manager.redis_names(&keys[0]).lock;
    let first_counter = manager.redis_names(&keys[0]).fencing_counter().to_owned();
    let lock_names: Vec<String> = keys.iter().map(|k| manager.redis_names(k).lock).collect();
    drop(manager);
    let LockTarget::Cluster(cluster) = &setup.target else {
        unreachable!("a cluster target");
    };
    let master = cluster
        .master_of_key(&first_lock)
        .expect("the first key's master");
    let keys = keys
        .iter()
        .zip(&lock_names)
        .filter(|(_, lock)| cluster.master_of_key(lock).expect("master_of_key") == master)
        .map(|(key, _)| key.clone())
        .collect();
    Victim {
        master,
        first_lock,
        first_counter,
        keys,
    }
}

/// The times of a fault: when it began, when the killed master was dead (for
/// the other faults, when it began) and when it ended (the promotion, the
/// last stage of the migration, the resume).
struct Struck {
    down: u64,
    killed: u64,
    up: u64,
}

/// Does `fault` to the victim.
async fn strike(
    cluster: &mut RedisCluster,
    fault: ClusterFault,
    victim: &Victim,
    lease: Duration,
) -> Struck {
    let down = mono_ns();
    let mut killed = down;
    match fault {
        ClusterFault::KillMaster => {
            tokio::task::block_in_place(|| cluster.kill(victim.master).expect("kill the master"));
            killed = mono_ns();
            // The node timeout is 2 s; an election on two loaded cores may
            // take several more.
            tokio::task::block_in_place(|| {
                cluster
                    .wait_for_failover(Duration::from_secs(20))
                    .expect("the replica takes over")
            });
        }
        ClusterFault::MigrateSlot => {
            // Slowly, so that the clients work through every stage: 1 s with
            // the slot MIGRATING/IMPORTING and every key still on the source;
            // 1 s with the fencing counter moved and the lock not (a script
            // on both gets TRYAGAIN, a key that moved gets ASK); then the
            // rest, and the slot given to the target (MOVED).
            let slot = distlock_testing::key_slot(victim.first_lock.as_bytes());
            let to = (0..3)
                .find(|m| *m != victim.master)
                .expect("another master");
            let mut migration = cluster
                .begin_migration(slot, to)
                .expect("begin the migration");
            tokio::time::sleep(Duration::from_secs(1)).await;
            let counter = victim.first_counter.as_str();
            tokio::task::block_in_place(|| {
                migration
                    .migrate_keys(&[counter])
                    .expect("move the fencing counter")
            });
            tokio::time::sleep(Duration::from_secs(1)).await;
            tokio::task::block_in_place(|| migration.finish().expect("finish the migration"));
        }
        ClusterFault::PauseMaster => {
            cluster.pause(victim.master).expect("pause the master");
            tokio::time::sleep(lease * 3 / 2).await;
            cluster.resume(victim.master).expect("resume the master");
        }
    }
    Struck {
        down,
        killed,
        up: mono_ns(),
    }
}

async fn cluster_fault(fault: ClusterFault) {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let (dir, name, what) = match fault {
        ClusterFault::KillMaster => ("s13c", "s13c_cluster_master_killed", "1xkill9_master"),
        ClusterFault::MigrateSlot => ("s14c", "s14c_cluster_slot_migrated", "1xmigrate_slot"),
        ClusterFault::PauseMaster => ("s15c", "s15c_cluster_master_paused", "1xpause_master"),
    };
    let cluster = RedisCluster::builder()
        .masters(3)
        .replicas_per_master(1)
        .spawn()
        .expect("redis-server must be installed (cluster with replicas)");
    let mut setup = Setup::new(LockTarget::Cluster(cluster), dir);
    let load = ClusterLoad::of(fault);
    let lease = load.lease;
    let keys = setup.keys(6).await;
    let mut workers = load.start(&setup, &keys).await;
    let limit = Duration::from_secs(30);
    progress_all(&mut workers, load.before, limit).await;
    let victim = victim(&setup, &keys).await;
    let LockTarget::Cluster(cluster) = &mut setup.target else {
        unreachable!("a cluster target");
    };
    let Struck { down, killed, up } = strike(cluster, fault, &victim, lease).await;
    // Every worker goes on: more progress reports within 30 s of the end of
    // the fault, where a healthy run makes one in well under a second (long
    // bodies: a few seconds).
    progress_all(&mut workers, load.after, limit).await;
    stop_all(&mut workers, limit).await;
    let h = history_of(&workers);
    // Only a failover may forget a lock (a write not yet replicated): the
    // old master's grants, seen up to GRANTS_READ_LATE after its kill.
    let faults = Faults {
        amnesia: if fault == ClusterFault::KillMaster {
            vec![(killed + ns(GRANTS_READ_LATE), up)]
        } else {
            Vec::new()
        },
        ..Faults::default()
    };
    let (report, stored, leaked) = judge(&setup, &h, &keys, &faults).await;
    // Every key was locked again after the fault, the victim's too.
    assert_every_key_granted_after(&h, &keys, up, load.granted_after, "fault");
    let paused = (fault == ClusterFault::PauseMaster)
        .then(|| HoldersOfThePaused::of(&h, &victim, down, lease));
    figures(
        name,
        &report,
        &stored,
        what,
        leaked.len(),
        &format!(
            "fault_ms={:.0} forgotten_overlaps={} repeated_tokens={}{} secs={:.1}",
            diff_ms(up, down),
            report.amnesia_overlaps.len(),
            report.amnesia_token_order.len(),
            paused
                .as_ref()
                .map_or(String::new(), |p| p.figures(&victim, down, lease)),
            started.elapsed().as_secs_f64()
        ),
    );
    report.assert_clean(name);
    if let Some(paused) = &paused {
        paused.assert_stopped_by_their_deadline(down);
    }
    assert_lost_updates_within_amnesia(&report, &stored, "the failover");
    assert!(leaked.is_empty(), "locks left in Redis: {leaked:?}");
}

/// The holders of the paused master's locks granted before the pause and
/// still in their body when it came.
///
/// The paused master answers nothing from `down` to `up` (1.5 leases, and its
/// locks expire in it meanwhile): such a holder sent its last successful
/// renewal (or the acquisition) before `down`, trusts it until that + lease -
/// drift, and its body is dropped at that local deadline. So no body poll of
/// such a holder ends after down + lease, plus SLACK / 3 for scheduling (as in
/// s5). A holder that ignored its deadline would run on to the resume, and
/// past it until a renewal reached the master.
struct HoldersOfThePaused<'h> {
    caught: Vec<&'h Section>,
    past_deadline: Vec<&'h Section>,
}

impl<'h> HoldersOfThePaused<'h> {
    fn of(h: &'h History, victim: &Victim, down: u64, lease: Duration) -> Self {
        let caught: Vec<_> = h
            .sections
            .iter()
            .filter(|s| victim.keys.contains(&s.key))
            .filter(|s| s.acquired < down && s.last_active > down)
            .collect();
        let past_deadline = caught
            .iter()
            .copied()
            .filter(|s| s.last_active > down + ns(lease + SLACK / 3))
            .collect();
        HoldersOfThePaused {
            caught,
            past_deadline,
        }
    }

    fn figures(&self, victim: &Victim, down: u64, lease: Duration) -> String {
        format!(
            " victim_keys={} holders_in_body_at_the_pause={} told_of_the_loss={} last_poll_after_pause_ms={:.1} bound_ms={}",
            victim.keys.len(),
            self.caught.len(),
            self.caught.iter().filter(|s| s.lost).count(),
            self.caught
                .iter()
                .map(|s| diff_ms(s.last_active, down))
                .fold(0.0, f64::max),
            (lease + SLACK / 3).as_millis()
        )
    }

    fn assert_stopped_by_their_deadline(&self, down: u64) {
        let past_deadline = &self.past_deadline;
        assert!(
            past_deadline.is_empty(),
            "{} holders of the paused master's locks ran their body past their local deadline; \
             the first, worker {} task {} on {} (lost {}), last polled {:.1} ms after the pause \
             (bound: lease + {:?})",
            past_deadline.len(),
            past_deadline[0].worker,
            past_deadline[0].task,
            past_deadline[0].key,
            past_deadline[0].lost,
            diff_ms(past_deadline[0].last_active, down),
            SLACK / 3
        );
    }
}
