//! The Redis Cluster backend against real clusters: the lock behaviour on keys of
//! every master, renewal cost per node, wake-ups across a subscriber reconnect,
//! resharding and failover under held locks, bad seeds, and the macro.
//!
//! Tests that only take locks share one process-wide cluster (unique keys per
//! test); tests that kill, migrate or disconnect get a cluster of their own.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{eventually, wait_once, RENEWED_LEASE};
use distlock::testing::{key_slot, RedisCluster, RedisServer};
use distlock::{distributed_lock, LockError, LockManager};
use redis::aio::ConnectionLike;

const MASTERS: usize = 3;

fn shared() -> &'static RedisCluster {
    RedisCluster::process_wide().expect("redis-server must be installed to run the tests")
}

fn own_cluster() -> RedisCluster {
    RedisCluster::spawn().expect("spawn a cluster")
}

/// Held by the tests that kill, pause or reshard a cluster of their own: on
/// two cores, several clusters failing over at once stretch a failover past
/// the leases the tests choose.
static FAULTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn manager_on(cluster: &RedisCluster) -> LockManager {
    manager_on_with(cluster, Duration::from_millis(500)).await
}

/// [`manager_on`] with its own command timeout.
async fn manager_on_with(cluster: &RedisCluster, command_timeout: Duration) -> LockManager {
    LockManager::cluster_builder(cluster.urls())
        .command_timeout(command_timeout)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect to the test cluster")
}

/// A cluster of its own with a replica per master, and `args` for every
/// node.
fn cluster_with_replicas(args: &[&str]) -> RedisCluster {
    RedisCluster::builder()
        .masters(MASTERS)
        .replicas_per_master(1)
        .args(args.iter().copied())
        .spawn()
        .expect("spawn a cluster with replicas")
}

/// `per_master` keys starting with `prefix` whose locks live on each master:
/// `result[i]` are on master `i` (asserted with the lock's Redis name).
fn keys_on_each_master(
    cluster: &RedisCluster,
    m: &LockManager,
    prefix: &str,
    per_master: usize,
) -> Vec<Vec<String>> {
    let mut keys = vec![Vec::new(); MASTERS];
    let mut i = 0;
    while keys.iter().any(|k| k.len() < per_master) {
        let key = format!("{prefix}:{i}");
        i += 1;
        let names = m.redis_names(&key);
        let master = cluster.master_of_key(&names.lock).unwrap();
        assert_eq!(
            key_slot(names.lock.as_bytes()),
            key_slot(names.fencing_counter().as_bytes())
        );
        if keys[master].len() < per_master {
            keys[master].push(key);
        }
    }
    for (master, ks) in keys.iter().enumerate() {
        for k in ks {
            assert_eq!(
                cluster.master_of_key(&m.redis_names(k).lock).unwrap(),
                master
            );
        }
    }
    keys
}

async fn exists(conn: &mut impl ConnectionLike, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

async fn pttl(conn: &mut impl ConnectionLike, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

/// Subscribers of `channel` (or of the hand-off channels of the managers
/// queued for its lock, see `node_numsub`), over every running node.
fn numsub(cluster: &RedisCluster, channel: &str) -> i64 {
    let handoffs = queued_handoffs(cluster, channel);
    cluster
        .nodes()
        .iter()
        .filter(|n| n.is_running)
        .map(|node| {
            node_numsub(
                &mut cluster.blocking_client(node.index).unwrap(),
                channel,
                &handoffs,
            )
        })
        .sum()
}

/// For a default lock's channel (`<prefix>wake:{tag}:<key>`), the hand-off
/// channels (`<prefix>handoff:<route>`) of the managers queued for that lock,
/// by the routes their queue entries name (read on whichever node holds
/// them; the others answer MOVED). Managers that only hold locks listen on
/// their hand-off channels too (for their waiters' notices): they do not
/// count.
fn queued_handoffs(cluster: &RedisCluster, channel: &str) -> Vec<String> {
    let Some((prefix, _)) = channel.split_once("wake:{") else {
        return Vec::new();
    };
    let entries = channel.replacen("wake:{", "lockqe:{", 1);
    let mut handoffs: Vec<String> = cluster
        .nodes()
        .iter()
        .filter(|n| n.is_running)
        .flat_map(|node| {
            let mut conn = cluster.blocking_client(node.index).unwrap();
            redis::cmd("HVALS")
                .arg(&entries)
                .query::<Vec<String>>(&mut conn)
                .unwrap_or_default()
        })
        .filter_map(|entry| entry.split(':').nth(3).map(str::to_owned))
        .map(|route| format!("{prefix}handoff:{route}"))
        .collect();
    handoffs.sort();
    handoffs.dedup();
    handoffs
}

/// Subscribers of `channel` and of `handoffs` (see `queued_handoffs`) on one
/// node.
fn node_numsub(conn: &mut redis::Connection, channel: &str, handoffs: &[String]) -> i64 {
    std::iter::once(channel)
        .chain(handoffs.iter().map(String::as_str))
        .map(|name| {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(name)
                .query(conn)
                .expect("PUBSUB NUMSUB");
            n
        })
        .sum()
}

// ---------------------------------------------------------------- behaviour

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_on_every_master() {
    let cluster = shared();
    let a = manager_on(cluster).await;
    let b = manager_on(cluster).await;
    let keys = keys_on_each_master(cluster, &a, "ct-mutex", 1);
    let mut tasks = Vec::new();
    let done = Arc::new(AtomicUsize::new(0));
    for key in keys.into_iter().flatten() {
        let inside = Arc::new(AtomicBool::new(false));
        for t in 0..6 {
            let m = if t % 2 == 0 { a.clone() } else { b.clone() };
            let (key, inside, done) = (key.clone(), inside.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    let g = m
                        .lock(key.clone())
                        .lease(Duration::from_secs(5))
                        .wait(Duration::from_secs(20))
                        .acquire()
                        .await
                        .unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders of {key}");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.store(false, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 3 * 6 * 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_in_scope_gets_the_same_token() {
    let cluster = shared();
    let m = manager_on(cluster).await;
    let mut conn = cluster.cluster_connection().await.unwrap();
    for key in keys_on_each_master(cluster, &m, "ct-reenter", 1)
        .into_iter()
        .flatten()
    {
        let name = m.redis_names(&key).lock;
        let outer = m.lock(key.clone()).acquire().await.unwrap();
        let token = outer.fencing_token().await.unwrap();
        let inner_token = outer
            .scope(async {
                let inner = m
                    .lock(key.clone())
                    .wait(Duration::ZERO)
                    .acquire()
                    .await
                    .unwrap();
                let t = inner.fencing_token().await.unwrap();
                inner.release().await.unwrap();
                t
            })
            .await;
        assert_eq!(inner_token, token);
        assert!(
            exists(&mut conn, &name).await,
            "inner release keeps the outer hold"
        );
        outer.release().await.unwrap();
        assert!(!exists(&mut conn, &name).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lock_beyond_its_lease() {
    let cluster = shared();
    let a = manager_on(cluster).await;
    let b = manager_on(cluster).await;
    let mut conn = cluster.cluster_connection().await.unwrap();
    let keys: Vec<String> = keys_on_each_master(cluster, &a, "ct-renew", 1)
        .into_iter()
        .flatten()
        .collect();
    // 900 ms leases, renewed every 300 ms: losing one takes a renewal 600 ms
    // late (a 300 ms lease is lost by one 200 ms late on a loaded machine).
    // The 1.5 s below outlast a lease, so a lock not renewed is seen lost.
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            a.lock(key.clone())
                .lease(RENEWED_LEASE)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        for (key, g) in keys.iter().zip(&guards) {
            assert!(!g.is_lost(), "{key} lost");
            assert!(b.lock(key.clone()).try_acquire().await.unwrap().is_none());
            let ttl = pttl(&mut conn, &a.redis_names(key).lock).await;
            assert!(ttl > 0 && ttl <= 900, "{key}: pttl {ttl}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lock_is_reported_lost() {
    let cluster = shared();
    let m = manager_on(cluster).await;
    let mut conn = cluster.cluster_connection().await.unwrap();
    for key in keys_on_each_master(cluster, &m, "ct-lost", 1)
        .into_iter()
        .flatten()
    {
        let g = m
            .lock(key.clone())
            .lease(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
        redis::cmd("DEL")
            .arg(m.redis_names(&key).lock)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(2), g.lost())
            .await
            .unwrap_or_else(|_| panic!("{key}: loss not noticed"));
        assert!(g.is_lost());
        let r = g.release().await;
        assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_on_every_master() {
    let cluster = shared();
    let a = manager_on(cluster).await;
    let b = manager_on(cluster).await;
    for key in keys_on_each_master(cluster, &a, "ct-fence", 1)
        .into_iter()
        .flatten()
    {
        let mut last = 0;
        for i in 0..6 {
            let m = if i % 2 == 0 { &a } else { &b };
            let g = m.lock(key.clone()).acquire().await.unwrap();
            assert!(
                g.fencing_token().await.unwrap() > last,
                "{key}: {} after {last}",
                g.fencing_token().await.unwrap()
            );
            last = g.fencing_token().await.unwrap();
            g.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exit_releases() {
    let cluster = shared();
    let m = manager_on(cluster).await;
    let keys = keys_on_each_master(cluster, &m, "ct-exit", 3);
    let mut names = Vec::new();
    for ks in &keys {
        // Drop.
        let g = m.lock(ks[0].clone()).acquire().await.unwrap();
        drop(g);
        // A cancelled future holding the guard.
        let m2 = m.clone();
        let k = ks[1].clone();
        let held = Arc::new(tokio::sync::Notify::new());
        let held2 = held.clone();
        let fut = async move {
            let _g = m2.lock(k).acquire().await.unwrap();
            held2.notify_one();
            std::future::pending::<()>().await;
        };
        let task = tokio::spawn(fut);
        held.notified().await;
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        // A panic in a spawned task.
        let m3 = m.clone();
        let k = ks[2].clone();
        let r = tokio::spawn(async move {
            let _g = m3.lock(k).acquire().await.unwrap();
            panic!("body failed");
        })
        .await;
        assert!(r.unwrap_err().is_panic());
        names.extend(ks.iter().map(|k| m.redis_names(k).lock));
    }
    let mut conn = cluster.cluster_connection().await.unwrap();
    let start = Instant::now();
    for name in &names {
        while exists(&mut conn, name).await {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{name} not released"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(m.held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release() {
    let cluster = shared();
    let a = manager_on(cluster).await;
    let b = manager_on(cluster).await;
    for key in keys_on_each_master(cluster, &a, "ct-handoff", 1)
        .into_iter()
        .flatten()
    {
        let channel = a.redis_names(&key).channel().to_owned();
        let held = a
            .lock(key.clone())
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let b2 = b.clone();
        let k = key.clone();
        let waiter = tokio::spawn(async move {
            let g = b2
                .lock(k)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            (Instant::now(), g)
        });
        let subscribed = tokio::task::block_in_place(|| {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(3) {
                if numsub(cluster, &channel) >= 1 {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        });
        assert!(
            subscribed,
            "{key}: the waiter never subscribed to {channel}"
        );
        assert!(!waiter.is_finished());
        let token = held.fencing_token().await.unwrap();
        let released_at = Instant::now();
        held.release().await.unwrap();
        let (acquired_at, g) = waiter.await.unwrap();
        let delay = acquired_at - released_at;
        assert!(
            delay < Duration::from_millis(500),
            "{key}: woken after {delay:?}"
        );
        assert!(g.fencing_token().await.unwrap() > token);
        g.release().await.unwrap();
    }
}

// ---------------------------------------------------------------- renewal cost

fn moved_errors(cluster: &RedisCluster) -> Vec<u64> {
    error_counts(cluster, "MOVED")
}

/// Per running node, how many `kind` error replies (`MOVED`, `ASK`) it sent.
fn error_counts(cluster: &RedisCluster, kind: &str) -> Vec<u64> {
    let prefix = format!("errorstat_{kind}:count=");
    cluster
        .nodes()
        .iter()
        .filter(|n| n.is_running)
        .map(|n| {
            let mut conn = cluster.blocking_client(n.index).unwrap();
            let info: String = redis::cmd("INFO")
                .arg("errorstats")
                .query(&mut conn)
                .unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .map(|n| n.trim().parse().unwrap())
                .unwrap_or(0)
        })
        .collect()
}

/// 300 locks over 3 masters cost one renewal round trip per master per tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_cost_one_round_trip_per_master() {
    let cluster = shared();
    let m = manager_on(cluster).await;
    let keys = keys_on_each_master(cluster, &m, "ct-cost", 100);
    let moved_before = tokio::task::block_in_place(|| moved_errors(cluster));
    let lease = Duration::from_millis(600);
    let acquires = keys.iter().flatten().map(|k| {
        let m = m.clone();
        let k = k.clone();
        async move { m.lock(k).lease(lease).acquire().await.unwrap() }
    });
    let guards = futures_util::future::join_all(acquires).await;
    assert_eq!(m.held_count(), 300);
    let trips_before = m.renewal_round_trips();
    let wakeups_before = m.renewal_task_wakeups();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        assert!(guards.iter().all(|g| !g.is_lost()), "a lease was lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = start.elapsed();
    let trips = m.renewal_round_trips() - trips_before;
    let ticks = m.renewal_task_wakeups() - wakeups_before;
    eprintln!("{trips} renewal round trips in {ticks} ticks over {elapsed:?}");
    assert!(guards.iter().all(|g| !g.is_lost()), "a lease was lost");
    // A tick every lease / 3 = 200 ms: about 10 in 2 s (the leases may start
    // in a few groups, each renewed on a tick of its own).
    let interval = lease / 3;
    let expected_ticks = (elapsed.as_millis() / interval.as_millis()) as u64;
    assert!(
        ticks >= expected_ticks / 2,
        "{ticks} renewal ticks in {elapsed:?}"
    );
    assert!(
        trips >= expected_ticks / 2 * MASTERS as u64 / 2,
        "{trips} round trips"
    );
    assert!(
        trips <= ticks * (MASTERS as u64 + 1),
        "{trips} round trips in {ticks} ticks"
    );
    assert!(
        ticks <= expected_ticks * 4 + 4,
        "{ticks} ticks in {elapsed:?}: leases renewed one by one?"
    );
    let moved_after = tokio::task::block_in_place(|| moved_errors(cluster));
    assert_eq!(
        moved_before, moved_after,
        "renewals were sent to the wrong node"
    );
    for g in guards {
        g.release().await.unwrap();
    }
}

// ---------------------------------------------------------------- subscriber reconnect

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_survive_a_subscriber_reconnect() {
    let _faults = FAULTS.lock().await;
    let cluster = own_cluster();
    let a = manager_on(&cluster).await;
    let b = manager_on(&cluster).await;
    let key = "ct-resub".to_owned();
    let channel = a.redis_names(&key).channel().to_owned();
    let held = a
        .lock(key.clone())
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let b2 = b.clone();
    let k = key.clone();
    let waiter = tokio::spawn(async move {
        let g = b2
            .lock(k)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        (Instant::now(), g)
    });
    tokio::task::block_in_place(|| {
        // One subscriber connection per master, each subscribed.
        assert!(
            wait_blocking(Duration::from_secs(3), || numsub(&cluster, &channel)
                == MASTERS as i64),
            "never subscribed"
        );
        for node in cluster.nodes() {
            let mut conn = cluster.blocking_client(node.index).unwrap();
            let _: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("pubsub")
                .query(&mut conn)
                .unwrap();
        }
        assert!(
            wait_blocking(Duration::from_secs(5), || numsub(&cluster, &channel)
                == MASTERS as i64),
            "the subscriptions did not come back"
        );
    });
    assert!(!waiter.is_finished());
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (acquired_at, g) = waiter.await.unwrap();
    let delay = acquired_at - released_at;
    assert!(delay < Duration::from_millis(500), "woken after {delay:?}");
    g.release().await.unwrap();
}

fn wait_blocking(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

// ---------------------------------------------------------------- resharding

/// `key` held by `m` (10 s lease) with its fencing token issued (so that its
/// fencing counter exists and moves with the rest): its slot, its master,
/// and the next master, to move it to.
async fn held_with_its_fence(
    cluster: &RedisCluster,
    m: &LockManager,
    key: &'static str,
) -> (u16, usize, usize, distlock::LockGuard) {
    let slot = key_slot(m.redis_names(key).lock.as_bytes());
    let from = cluster.master_of_slot(slot).unwrap();
    let held = m
        .lock(key)
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    held.fencing_token().await.unwrap();
    (slot, from, (from + 1) % MASTERS, held)
}

/// The keys in `slot` on master `from`.
fn keys_in_slot(cluster: &RedisCluster, from: usize, slot: u16) -> Vec<String> {
    let mut conn = cluster.blocking_client(from).unwrap();
    redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query(&mut conn)
        .unwrap()
}

/// Begins moving `slot` to master `to` and moves every key it holds (the
/// lock's: `expected` of them), leaving the slot itself migrating: its old
/// master answers `ASK` for them.
fn move_every_key_of_slot(
    cluster: &RedisCluster,
    slot: u16,
    to: usize,
    expected: usize,
) -> distlock::testing::ClusterMigration<'_> {
    let mut migration = cluster.begin_migration(slot, to).unwrap();
    assert_eq!(migration.migrate_remaining_keys().unwrap(), expected);
    migration
}

/// `ASK` and `MOVED` replies sent so far, summed over the running nodes.
fn redirections(cluster: &RedisCluster) -> (u64, u64) {
    tokio::task::block_in_place(|| {
        (
            error_counts(cluster, "ASK").iter().sum(),
            moved_errors(cluster).iter().sum(),
        )
    })
}

/// An acquisition with `replica_ack` is a pipeline (the script, then `WAIT`):
/// while its lock's slot migrates, every key of the lock already on the new
/// master, the old master answers `ASK`, and the pipeline goes to the new
/// master behind `ASKING`, where it finds the lock held: busy, with no
/// `MOVED` anywhere (a pipeline sent there without `ASKING` is answered
/// `MOVED`, back to the old master, until the redirections run out). Once
/// the lock is released and the slot has moved, the acquisition holds, with
/// its replica's acknowledgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_acquisition_follows_an_ask_with_its_pipeline() {
    let _faults = FAULTS.lock().await;
    let cluster = cluster_with_replicas(&[]);
    let a = manager_on(&cluster).await;
    let b = manager_on(&cluster).await;
    let acked = LockManager::cluster_builder(cluster.urls())
        .command_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(500))
        .replica_ack(1, Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let key = "ct-acked-migrating";
    let (slot, from, to, held) = held_with_its_fence(&cluster, &a, key).await;
    // A queued waiter, so that the lock's queue keys exist too: a script on
    // a slot being imported runs only when every key it names is there.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock(key).wait(Duration::from_secs(30)).acquire().await })
    };
    eventually(Duration::from_secs(5), async || {
        tokio::task::block_in_place(|| keys_in_slot(&cluster, from, slot).len() == 4)
    })
    .await
    .expect("the waiter queued");
    let migration = tokio::task::block_in_place(|| move_every_key_of_slot(&cluster, slot, to, 4));
    let (asks_before, moved_before) = redirections(&cluster);
    for _ in 0..3 {
        let tried = acked.lock(key).try_acquire().await;
        assert!(matches!(tried, Ok(None)), "{tried:?} while the slot moves");
    }
    let (asks, moved) = redirections(&cluster);
    assert!(
        asks >= asks_before + 3,
        "{asks_before} -> {asks} ASK replies"
    );
    assert_eq!(moved, moved_before, "MOVED replies while the slot migrates");
    held.release().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter holds")
        .unwrap()
        .unwrap();
    tokio::task::block_in_place(|| migration.finish().unwrap());
    handed.release().await.unwrap();
    let guard = acked
        .lock(key)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("acknowledged once the slot has moved");
    assert_eq!(cluster.master_of_slot(slot).unwrap(), to);
    guard.release().await.unwrap();
}

/// A release that hands the lock over while the lock's slot migrates, every
/// key of the lock already on the new master (the old one answers `ASK`):
/// it follows the redirection as any call does, and the waiter holds. Its
/// manager was told that a waiter queued, so the release most likely hands
/// over: on one server, such a release goes behind a `PING` in one pipeline;
/// a cluster's release sends none, and follows the `ASK` with `ASKING` and
/// the script (were it a pipeline, `ASKING` would go before each command:
/// one before the whole pipeline is used up by its first command, and the
/// script would be answered `MOVED`, back to the old master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_while_its_slot_migrates_follows_the_redirection() {
    let _faults = FAULTS.lock().await;
    let cluster = own_cluster();
    let a = manager_on(&cluster).await;
    let b = manager_on(&cluster).await;
    // Each manager waits once, so that both listen on their hand-off
    // channels: the holder's hears the waiter's notice below.
    wait_once(&a, &b, "ct-warm").await;
    wait_once(&b, &a, "ct-warm").await;

    let key = "ct-handoff-migrating";
    let (slot, _, to, held) = held_with_its_fence(&cluster, &a, key).await;
    let heard = a.waited_for_notices_heard();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock(key).wait(Duration::from_secs(30)).acquire().await })
    };
    eventually(Duration::from_secs(5), async || {
        a.waited_for_notices_heard() > heard
    })
    .await
    .expect("the holder's manager hears that a waiter queued");
    // Every key of the slot (the lock, its fence, queue and queue entries),
    // moved; the slot itself not yet.
    let migration = tokio::task::block_in_place(|| move_every_key_of_slot(&cluster, slot, to, 4));
    let released = held.release().await;
    assert!(released.is_ok(), "{released:?}");
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter holds")
        .unwrap();
    assert!(handed.is_ok(), "{handed:?}");
    tokio::task::block_in_place(|| migration.finish().unwrap());
    handed.unwrap().release().await.unwrap();
}

/// Moves a held and contended lock's slot to another master while its holder
/// renews and a waiter waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_a_held_and_contended_lock() {
    let _faults = FAULTS.lock().await;
    let cluster = own_cluster();
    let a = manager_on(&cluster).await;
    let b = manager_on(&cluster).await;
    let c = manager_on(&cluster).await;

    for (key, stepwise) in [("ct-reshard-whole", false), ("ct-reshard-steps", true)] {
        let names = a.redis_names(key);
        let slot = key_slot(names.lock.as_bytes());
        let from = cluster.master_of_slot(slot).unwrap();
        let to = (from + 1) % MASTERS;
        let held = a
            .lock(key)
            .lease(Duration::from_secs(1))
            .acquire()
            .await
            .unwrap();
        let token = held.fencing_token().await.unwrap();
        let b2 = b.clone();
        let waiter = tokio::spawn(async move {
            b2.lock(key)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap()
        });
        // Let the waiter wait (it is subscribed once NUMSUB says so).
        tokio::task::block_in_place(|| {
            assert!(wait_blocking(Duration::from_secs(3), || numsub(
                &cluster,
                names.channel()
            ) >= 1));
        });

        if stepwise {
            let mut migration = tokio::task::block_in_place(|| {
                let mut migration = cluster.begin_migration(slot, to).unwrap();
                migration.migrate_keys(&[names.fencing_counter()]).unwrap();
                migration
            });
            // The lock and its fence are now split between two nodes: an
            // acquisition cannot run, and is busy, never an error.
            let start = Instant::now();
            while start.elapsed() < Duration::from_millis(1500) {
                let r = c.lock(key).try_acquire().await;
                assert!(matches!(r, Ok(None)), "{key}: {r:?} while the slot moves");
                assert!(!held.is_lost(), "{key}: lost while the slot moves");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Both keys on the new owner, the slot still migrating: the old
            // owner answers ASK. The holder renews beyond its lease through
            // the redirection; the lock stays busy for everyone else.
            tokio::task::block_in_place(|| {
                migration.migrate_keys(&[names.lock.as_str()]).unwrap();
            });
            let start = Instant::now();
            while start.elapsed() < Duration::from_millis(1500) {
                let r = c.lock(key).try_acquire().await;
                assert!(matches!(r, Ok(None)), "{key}: {r:?} while the slot moves");
                assert!(!held.is_lost(), "{key}: lost while the slot moves");
                assert!(!waiter.is_finished(), "{key}: two holders");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::task::block_in_place(|| migration.finish().unwrap());
        } else {
            tokio::task::block_in_place(|| cluster.migrate_slot(slot, to).unwrap());
        }
        assert_eq!(cluster.master_of_slot(slot).unwrap(), to);

        // The holder keeps renewing on the new node, beyond its lease.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(1500) {
            assert!(!held.is_lost(), "{key}: lost after the slot moved");
            assert!(!waiter.is_finished(), "{key}: two holders");
            assert!(c.lock(key).try_acquire().await.unwrap().is_none());
            let ttl = tokio::task::block_in_place(|| {
                let mut conn = cluster.blocking_client(to).unwrap();
                redis::cmd("PTTL")
                    .arg(&names.lock)
                    .query::<i64>(&mut conn)
                    .unwrap()
            });
            assert!(ttl > 0, "{key}: pttl {ttl} on the new master");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        held.release().await.unwrap();
        let g = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("the waiter got the lock after the release")
            .unwrap();
        assert!(
            g.fencing_token().await.unwrap() > token,
            "{key}: token went back"
        );
        g.release().await.unwrap();
    }
}

// ---------------------------------------------------------------- failover

/// A master with held locks dies; its replica takes over. An intruder may take a
/// lock only once its holder knows the lease is lost, and tokens keep growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_of_a_master_with_held_locks() {
    let _faults = FAULTS.lock().await;
    let mut cluster = cluster_with_replicas(&[]);
    let a = manager_on(&cluster).await;
    let b = manager_on(&cluster).await;
    // A waiter of manager b, subscribed before the kill; the master that dies
    // is the one its subscriber is connected to (the waited-for lock is on
    // master 0, which may be that master too).
    let waiting_on = keys_on_each_master(&cluster, &a, "ct-failover-wait", 1)[0][0].clone();
    let channel = a.redis_names(&waiting_on).channel().to_owned();
    let other_held = a
        .lock(waiting_on.clone())
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let b2 = b.clone();
    let k = waiting_on.clone();
    let waiter = tokio::spawn(async move {
        // A caller retries transient errors (none is expected here: the
        // lock's master stays up; see a_dead_master_holds_up_no_other_masters_locks).
        loop {
            match b2
                .lock(k.clone())
                .wait(Duration::from_secs(60))
                .acquire()
                .await
            {
                Ok(g) => return (Instant::now(), g),
                Err(LockError::Backend { .. }) => continue,
                Err(e) => panic!("{e}"),
            }
        }
    });
    // Manager b keeps a subscriber connection on every master; the victim is
    // not the waited-for lock's master (0), so only b's subscriber there dies.
    let victim = 1;
    tokio::task::block_in_place(|| {
        assert!(wait_blocking(Duration::from_secs(3), || numsub(
            &cluster, &channel
        ) == MASTERS
            as i64));
        let handoffs = queued_handoffs(&cluster, &channel);
        let mut conn = cluster.blocking_client(victim).unwrap();
        assert_eq!(
            node_numsub(&mut conn, &channel, &handoffs),
            1,
            "no subscriber on the victim"
        );
    });

    // Locks on the victim; the last one has a lease longer than the failover:
    // its holder should keep it, renewing on the promoted replica.
    let keys = keys_on_each_master(&cluster, &a, "ct-failover", 4).swap_remove(victim);
    let leases = [2, 2, 2, 10].map(Duration::from_secs);
    let replica = cluster
        .nodes()
        .iter()
        .find(|n| n.role == distlock::testing::ClusterNodeRole::Replica { of: victim })
        .unwrap()
        .index;
    let mut guards = Vec::new();
    for (key, lease) in keys.iter().zip(leases) {
        let g = a.lock(key.clone()).lease(lease).acquire().await.unwrap();
        guards.push(Arc::new(g));
    }
    let mut tokens_before: Vec<u64> = Vec::new();
    for g in &guards {
        tokens_before.push(g.fencing_token().await.unwrap());
    }
    tokio::task::block_in_place(|| {
        let mut conn = cluster.blocking_client(replica).unwrap();
        redis::cmd("READONLY").exec(&mut conn).unwrap();
        for key in &keys {
            let name = a.redis_names(key).lock;
            assert!(
                wait_blocking(Duration::from_secs(3), || redis::cmd("EXISTS")
                    .arg(&name)
                    .query::<i64>(&mut conn)
                    .unwrap()
                    == 1),
                "{name} never reached the replica"
            );
        }
    });

    let killed_at = Instant::now();
    tokio::task::block_in_place(|| cluster.kill(victim).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let intruders: Vec<_> = keys
        .iter()
        .zip(&guards)
        .map(|(key, guard)| {
            let (b, key, guard, stop) = (b.clone(), key.clone(), guard.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(Some(g)) = b.lock(key.clone()).try_acquire().await {
                        // The original holder must know its lease is gone.
                        let holder_lost = guard.is_lost();
                        return Some((g, holder_lost));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                None
            })
        })
        .collect();
    tokio::task::block_in_place(|| cluster.wait_for_failover(Duration::from_secs(15)).unwrap());
    let failed_over_after = killed_at.elapsed();
    // Give the intruders, and the holder's renewals, time after the failover.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    let mut taken_over = 0;
    for (((key, _guard), intruder), before) in
        keys.iter().zip(&guards).zip(intruders).zip(&tokens_before)
    {
        // Kept, or reported lost and not (yet) taken: both are safe. On two
        // loaded cores a failover can outlast even the 10 s lease's renewals.
        if let Some((g, holder_lost)) = intruder.await.unwrap() {
            assert!(
                holder_lost,
                "{key}: taken while its holder still trusted its lease"
            );
            assert!(
                g.fencing_token().await.unwrap() > *before,
                "{key}: token went back"
            );
            taken_over += 1;
            g.release().await.unwrap();
        }
    }
    // Renewals resumed on the promoted replica: the long lease was renewed
    // after the failover (a renewal resets its PTTL to 10 s; the lease was
    // taken more than 6 s ago).
    let long = guards.last().unwrap();
    if !long.is_lost() {
        let mut conn = cluster.cluster_connection().await.unwrap();
        let name = a.redis_names(keys.last().unwrap()).lock;
        let renewed = async {
            while pttl(&mut conn, &name).await < 5_000 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), renewed)
            .await
            .expect("the long lease was never renewed on the promoted replica");
        assert!(!long.is_lost());
    }
    // The waiter is subscribed again, and woken by the release. The
    // subscriber retries a lost connection after a backoff that doubles up to
    // 2 s, reading the slot map again each time, so that once the failover
    // is done it connects to the promoted replica: two capped retries, each
    // with the 500 ms connect timeout, plus the SUBSCRIBE, fit in 10 s also
    // on a loaded machine (5 s did not, once).
    tokio::task::block_in_place(|| {
        assert!(
            wait_blocking(Duration::from_secs(10), || numsub(&cluster, &channel)
                == MASTERS as i64),
            "the waiter's subscription did not come back after the failover"
        )
    });
    assert!(!waiter.is_finished(), "{waiting_on}: two holders");
    let released_at = Instant::now();
    other_held.release().await.unwrap();
    let (acquired_at, g) = waiter.await.unwrap();
    let delay = acquired_at - released_at;
    assert!(delay < Duration::from_millis(500), "woken after {delay:?}");
    g.release().await.unwrap();
    // The same manager holds a new lock on the failed-over slots beyond its
    // lease: 900 ms, renewed every 300 ms, so that only a renewal 600 ms late
    // loses it (600 ms is lost by one 400 ms late), and the 2 s below still
    // outlast it.
    let fresh = a
        .lock(keys[0].clone())
        .lease(RENEWED_LEASE)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!fresh.is_lost(), "renewal after the failover failed");
    assert!(fresh.fencing_token().await.unwrap() > tokens_before[0]);
    fresh.release().await.unwrap();
    eprintln!(
        "failover after {failed_over_after:?}; {taken_over} of {} locks taken over",
        keys.len()
    );
    drop(guards);
    // New acquisitions on the failed-over slots succeed within a bound, with
    // larger tokens.
    let c = manager_on(&cluster).await;
    for (key, before) in keys.iter().zip(&tokens_before) {
        let start = Instant::now();
        let g = c
            .lock(key.clone())
            .lease(Duration::from_secs(2))
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(
            g.fencing_token().await.unwrap() > *before,
            "{key}: token went back"
        );
        g.release().await.unwrap();
    }
}

// ---------------------------------------------------------------- bad input

#[tokio::test]
async fn bad_seeds_fail_build_with_a_typed_error() {
    let builder = |urls: Vec<String>| {
        LockManager::cluster_builder(urls)
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(500))
    };

    let start = Instant::now();
    let r = builder(Vec::new()).build().await;
    assert!(matches!(r, Err(LockError::InvalidConfig(_))), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(3));

    // Nothing listens on these ports (a server bound and dropped them).
    let closed: Vec<String> = (0..2)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("redis://127.0.0.1:{}", l.local_addr().unwrap().port())
        })
        .collect();
    let start = Instant::now();
    let r = builder(closed.clone()).build().await;
    assert!(matches!(r, Err(LockError::Connect { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(3));

    // One dead seed among live ones is not an error.
    let mut mixed = vec![closed[0].clone()];
    mixed.extend(shared().urls());
    let start = Instant::now();
    let m = builder(mixed)
        .build()
        .await
        .expect("one live seed is enough");
    assert!(start.elapsed() < Duration::from_secs(3));
    m.lock("ct-mixed-seeds")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let single = RedisServer::spawn().unwrap();
    let start = Instant::now();
    let r = builder(vec![single.url()]).build().await;
    match &r {
        Err(LockError::ServerCheck { reason, .. }) => {
            assert!(reason.contains("not a Redis Cluster"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(3));
}

// ---------------------------------------------------------------- macro

#[derive(Debug)]
enum AppError {
    // Read through Debug, in the test's panic messages.
    #[allow(dead_code)]
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

#[distributed_lock(key = "ct-macro:{id}", lease = "300ms", guard = lock, manager = m)]
async fn locked_step(m: &LockManager, id: u64, inside: &AtomicBool) -> Result<u64, AppError> {
    assert!(!inside.swap(true, Ordering::SeqCst), "two bodies at once");
    tokio::time::sleep(Duration::from_millis(5)).await;
    inside.store(false, Ordering::SeqCst);
    Ok(lock.fencing_token().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_macro_locks_through_a_cluster_manager() {
    let cluster = shared();
    let m = manager_on(cluster).await;
    let mut conn = cluster.cluster_connection().await.unwrap();
    let inside = AtomicBool::new(false);
    let runs = (0..8).map(|_| locked_step(&m, 7, &inside));
    let mut tokens: Vec<u64> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 8, "each run had a token of its own");
    assert!(!exists(&mut conn, &m.redis_names("ct-macro:7").lock).await);
}

// ---------------------------------------------------------------- shutdown

/// `shutdown()` releases the locks of every master (one pipeline per node), and
/// a guard dropped as its runtime ends is released by the blocking path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_and_runtime_end_release_on_every_master() {
    let cluster = shared();
    let m = manager_on(cluster).await;
    let keys = keys_on_each_master(cluster, &m, "ct-shutdown", 2);
    let mut guards = Vec::new();
    for key in keys.iter().flatten() {
        guards.push(
            m.lock(key.clone())
                .lease(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let mut conn = cluster.cluster_connection().await.unwrap();
    m.shutdown().await.unwrap();
    for key in keys.iter().flatten() {
        let name = m.redis_names(key).lock;
        assert!(!exists(&mut conn, &name).await, "{name} outlived shutdown");
    }
    assert!(guards.iter().all(|g| g.is_lost()));

    // A guard dropped inside a runtime that then ends, on every master.
    let names = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let m = manager_on(cluster).await;
            let keys = keys_on_each_master(cluster, &m, "ct-runtime-end", 1);
            let mut names = Vec::new();
            let mut guards = Vec::new();
            for key in keys.iter().flatten() {
                guards.push(
                    m.lock(key.clone())
                        .lease(Duration::from_secs(30))
                        .acquire()
                        .await
                        .unwrap(),
                );
                names.push(m.redis_names(key).lock);
            }
            names
            // `guards` dropped here, inside the runtime: their releases are
            // spawned on it and never run there.
        })
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for name in &names {
        let ttl = pttl(&mut conn, name).await;
        assert!(ttl < 0, "{name} outlived its runtime: {ttl} ms left");
    }
}

/// A node connection works for every runtime the manager is used from. After
/// a failover, the promoted master's connection is first needed by a call on
/// another runtime, which then stops being driven (a current-thread runtime
/// outside `block_on`): calls on the manager's own runtime still get
/// answers. (Before, the connection was made on the runtime of the call
/// that first needed it, its tasks never ran again, and every later call on
/// that node's keys timed out: a timeout does not retire a connection.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_connection_first_needed_on_another_runtime_outlives_it() {
    let _faults = FAULTS.lock().await;
    let mut cluster = cluster_with_replicas(&[]);
    // One seed, a master (so that the build connects to the masters, not
    // to the replica promoted later). A command timeout of 2 s: calls on a
    // loaded machine may wait for a CPU longer than 500 ms, and before the
    // fix they failed whatever the timeout.
    let m = LockManager::cluster_builder(vec![cluster.urls()[0].clone()])
        .command_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let victim = 1;
    let key = keys_on_each_master(&cluster, &m, "ct-other-runtime", 1)[victim][0].clone();
    kill_and_await_failover(&mut cluster, victim);
    let (used, idle) = std::sync::mpsc::channel();
    let (finish, finished) = std::sync::mpsc::channel::<()>();
    let other = {
        let (m, key) = (m.clone(), key.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            // The first calls meet the dead master (refused: the map is read
            // again); one on the promoted master makes its connection.
            let outcome = rt.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match m.lock(key.clone()).acquire().await {
                        Ok(guard) => return guard.release().await,
                        Err(e) if Instant::now() > deadline => return Err(e),
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            });
            used.send(outcome).unwrap();
            // Alive, but no longer driven: its tasks do not run.
            let _ = finished.recv();
            drop(rt);
        })
    };
    tokio::task::spawn_blocking(move || idle.recv().unwrap())
        .await
        .unwrap()
        .expect("the promoted master's lock, on the other runtime");
    for _ in 0..3 {
        let guard = m.lock(key.clone()).acquire().await;
        let guard = guard.unwrap_or_else(|e| panic!("on the manager's runtime: {e}"));
        guard.release().await.unwrap();
    }
    finish.send(()).unwrap();
    tokio::task::spawn_blocking(move || other.join().unwrap())
        .await
        .unwrap();
}

/// The manager's node connections speak RESP3 (so that redis-rs sees a
/// server close one while idle), whatever the URL says, and stay so: the
/// start-up check's `HELLO` (in the URL's protocol, RESP2 here) is sent in
/// the node connection's own protocol, or it would switch that connection
/// to RESP2 under redis-rs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_connections_stay_resp3_after_the_start_up_check() {
    let cluster = own_cluster();
    let m = manager_on(&cluster).await;
    for key in keys_on_each_master(&cluster, &m, "ct-resp3", 1)
        .iter()
        .flatten()
    {
        m.lock(key.clone())
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    tokio::task::block_in_place(|| {
        for master in 0..MASTERS {
            let mut conn = cluster.blocking_client(master).unwrap();
            let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut conn).unwrap();
            let scripts: Vec<&str> = clients
                .lines()
                .filter(|line| line.contains(" cmd=evalsha "))
                .collect();
            assert!(
                !scripts.is_empty(),
                "master {master}: no script caller in {clients}"
            );
            for line in scripts {
                assert!(line.contains(" resp=3"), "master {master}: {line}");
            }
        }
    });
}

/// A server that refuses RESP3 (`HELLO` renamed away, as on some managed
/// services and proxies): node connections fall back to the URL's protocol,
/// and the manager works on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_connections_fall_back_to_resp2_where_the_server_refuses_resp3() {
    let cluster = RedisCluster::builder()
        .masters(MASTERS)
        .args(["--rename-command", "HELLO", ""])
        .spawn()
        .expect("spawn a cluster without HELLO");
    let m = manager_on(&cluster).await;
    for key in keys_on_each_master(&cluster, &m, "ct-resp2", 1)
        .iter()
        .flatten()
    {
        let guard = m.lock(key.clone()).acquire().await.unwrap();
        assert!(m.is_locked(key).await.unwrap());
        guard.release().await.unwrap();
    }
}

// ---------------------------------------------------------------- a stuck master

/// A master that stops answering (SIGSTOP) costs its own locks, not those of
/// the other masters: renewals go to every node at once, each bounded by the
/// command timeout. A renewal tick waits for its slowest node, once: a tick
/// that meets the paused master takes one command timeout (500 ms), not two
/// (before, its leases were renewed again one call each, to the same paused
/// node); so the other masters' leases are kept at 3x the command timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_loses_only_its_own_locks() {
    let _faults = FAULTS.lock().await;
    let cluster = own_cluster();
    let m = manager_on(&cluster).await;
    let keys: Vec<String> = keys_on_each_master(&cluster, &m, "ct-paused", 1)
        .into_iter()
        .flatten()
        .collect();
    // The paused master's lock has a lease shorter than the pause; the others
    // a lease longer than it. The pause stays below cluster-node-timeout (2 s),
    // so the cluster does not mark the master failed (and go CLUSTERDOWN).
    let mut guards = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let lease = if i == 0 { 800 } else { 1_500 };
        guards.push(
            m.lock(key.clone())
                .lease(Duration::from_millis(lease))
                .acquire()
                .await
                .unwrap(),
        );
    }
    m.take_renewal_batches();
    let paused_at = Instant::now();
    cluster.pause(0).unwrap();
    tokio::time::timeout(Duration::from_millis(1_500), guards[0].lost())
        .await
        .expect("the paused master's lock is reported lost");
    while paused_at.elapsed() < Duration::from_millis(1_600) {
        for (key, g) in keys.iter().zip(&guards).skip(1) {
            assert!(
                !g.is_lost(),
                "{key} lost {:?} after another master was paused",
                paused_at.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.resume(0).unwrap();
    // Every tick took less than two command timeouts (1 s): one for the
    // paused master, and the rest of the second for a loaded machine.
    let batches = m.take_renewal_batches();
    assert!(!batches.is_empty());
    for (leases, took) in &batches {
        assert!(
            *took < Duration::from_millis(1_000),
            "a renewal tick of {leases} leases took {took:?}"
        );
    }
    let mut guards = guards.into_iter();
    let start = Instant::now();
    let r = guards.next().unwrap().release().await;
    assert!(matches!(r, Err(LockError::Lost { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Runs `call` while master 0 of `cluster` is paused for `stall`.
async fn while_master_0_stalls<T>(
    cluster: &RedisCluster,
    stall: Duration,
    call: impl std::future::Future<Output = T>,
) -> T {
    cluster.pause(0).unwrap();
    let (out, ()) = tokio::join!(call, async {
        tokio::time::sleep(stall).await;
        cluster.resume(0).unwrap();
    });
    out
}

/// A release that a stalled master answers late is a failed release, not a
/// lock found gone: its pipeline times out (500 ms) but runs when the master
/// resumes (1.2 s), so releasing each lock again on that node would find it
/// gone and report it lost. The guard's release says it failed (not `Lost`)
/// and retries in the background; a shutdown that could not confirm its
/// releases returns the error. Before, an unanswered pipeline fell back to
/// one call per lock, whose errors (or late "not ours") counted as locks
/// found gone: `release()` returned `Lost`, and the shutdown `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_a_stalled_master_answers_late_is_not_reported_lost() {
    let _faults = FAULTS.lock().await;
    let cluster = own_cluster();
    let m = manager_on(&cluster).await;
    let keys = keys_on_each_master(&cluster, &m, "ct-unanswered", 2);
    let mut conn = cluster.cluster_connection().await.unwrap();
    // Each stall lasts 1.2 s: past the 500 ms command timeout with room to
    // spare, below cluster-node-timeout (2 s), so that the cluster does not
    // fail the master over.
    let stall = Duration::from_millis(1_200);
    let lease = Duration::from_secs(10);
    let both = m
        .lock_all(keys[0].clone())
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let r = while_master_0_stalls(&cluster, stall, both.release()).await;
    assert!(
        matches!(&r, Err(LockError::Backend { .. })),
        "a release whose reply came late must fail as such, not as lost: {r:?}"
    );
    // Freed once the master answered (by the late pipeline or the retry).
    for key in &keys[0] {
        let name = m.redis_names(key).lock;
        eventually(Duration::from_secs(3), async || {
            !exists(&mut conn, &name).await
        })
        .await
        .unwrap_or_else(|| panic!("{name} still held"));
    }

    // A shutdown whose releases on one master come late fails; the other
    // master's lock is released.
    let _stuck = m
        .lock(keys[0][0].clone())
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let _other = m
        .lock(keys[1][0].clone())
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let r = while_master_0_stalls(&cluster, stall, m.shutdown()).await;
    assert!(
        matches!(&r, Err(LockError::Backend { .. })),
        "a shutdown that could not confirm a release must say so: {r:?}"
    );
    assert!(!exists(&mut conn, &m.redis_names(&keys[1][0]).lock).await);
    let name = m.redis_names(&keys[0][0]).lock;
    eventually(Duration::from_secs(3), async || {
        !exists(&mut conn, &name).await
    })
    .await
    .unwrap_or_else(|| panic!("{name} still held after the shutdown"));
}

/// At shutdown a manager releases its locks in one pipeline per node, which
/// first loads each release script it uses: an exclusive lock and a read
/// lock on one node make two loads. Every reply of the pipeline is read (one
/// too few, and the releases fell back one by one, each reading the reply
/// meant for the one before it: both reported not released, a stray reply
/// left for the connection's next request), so the shutdown says both were
/// released.
#[test]
fn a_shutdown_releases_two_kinds_of_lock_on_one_node_in_one_pipeline() {
    let cluster = RedisCluster::process_wide().unwrap();
    let logs = common::logged(|| async {
        let m = LockManager::cluster_builder(cluster.urls())
            .build()
            .await
            .unwrap();
        let exclusive = "mixed-kinds-a".to_owned();
        let node = cluster
            .master_of_key(&m.redis_names(&exclusive).lock)
            .unwrap();
        let shared = (0..)
            .map(|i| format!("mixed-kinds-b{i}"))
            .find(|key| cluster.master_of_key(&m.redis_names(key).lock).unwrap() == node)
            .unwrap();
        let a = m.lock(exclusive.as_str()).acquire().await.unwrap();
        let b = m.read_lock(shared.as_str()).acquire().await.unwrap();
        m.shutdown().await.unwrap();
        drop((a, b));
    });
    assert!(
        logs.contains("released at shutdown locks=2 released=2"),
        "{logs}"
    );
}

/// After a master fails over, a manager that only listens (an events stream:
/// it renews nothing, which is what refreshed its slot map) listens to the
/// promoted replica: an expiry on that shard is reported, once, and one on
/// another shard once too. Before, the listening connection of the dead
/// master's shard moved on to the next master, which another connection
/// heard already: the shard's expiries went unreported and the next one's
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_stream_follows_a_failover_to_the_promoted_master() {
    use futures_util::StreamExt;
    let _faults = FAULTS.lock().await;
    let mut cluster = cluster_with_replicas(&["--notify-keyspace-events", "Kx"]);
    let observer = manager_on(&cluster).await;
    let mut events = observer.events("fo:*").await.unwrap();
    let keys = keys_on_each_master(&cluster, &observer, "fo", 1);
    let victim = 1;
    let (on_victim, on_other) = (keys[victim][0].clone(), keys[2][0].clone());
    kill_and_await_failover(&mut cluster, victim);
    // The connection to the dead master broke: once made again (to the
    // promoted replica), the stream says it may have missed events.
    let notice = tokio::time::timeout(Duration::from_secs(15), events.next())
        .await
        .expect("the listening connection was made again within 15 s");
    assert!(
        matches!(notice, Some(Err(distlock::EventsSkipped { count: 0, .. }))),
        "{notice:?}"
    );
    // Locks that expire on both shards (their names written as a holder
    // that died would leave them).
    let mut conn = cluster.cluster_connection().await.unwrap();
    for key in [&on_victim, &on_other] {
        let () = redis::cmd("SET")
            .arg(&observer.redis_names(key).lock)
            .arg("0123456789abcdef0123456789abcdef-0:1:gone")
            .arg("PX")
            .arg(200)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let mut expired = Vec::new();
    // Each expiry within its 200 ms TTL and Redis's active expiry cycle
    // (100 ms); 5 s for a loaded machine, then 1 s more for a duplicate.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while expired.len() < 2 {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("both expiries reported within 5 s")
            .expect("the stream goes on");
        if let Ok(event) = event {
            expired.push(event.key);
        }
    }
    if let Ok(Some(Ok(extra))) = tokio::time::timeout(Duration::from_secs(1), events.next()).await {
        expired.push(extra.key);
    }
    expired.sort();
    let mut wanted = vec![on_victim, on_other];
    wanted.sort();
    assert_eq!(expired, wanted, "each expiry once");
}

/// A master that dies holds up no other master's locks: from the kill until
/// its replica has taken over, every acquisition and release of a lock on
/// the other masters succeeds, while other tasks keep asking for the dead
/// master's locks. (`cluster-require-full-coverage no`, so that the cluster
/// does not refuse every key while the dead master's slots have no master.)
/// Before, through redis-rs's cluster client, 94-127 of a few thousand calls
/// on the live masters timed out: its slot refresh after a `MOVED` from the
/// dead master's replica could wait for good, and requests by address to
/// the dead node made it remake every node connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_holds_up_no_other_masters_locks() {
    let _faults = FAULTS.lock().await;
    let mut cluster = cluster_with_replicas(&["--cluster-require-full-coverage", "no"]);
    // A command timeout of 2 s, not the other tests' 500 ms: on a loaded
    // machine (the whole suite in parallel) a call to a live master may wait
    // for a CPU longer than 500 ms. The stall this test is about does not
    // end with time: the old connection answered nothing until a call's
    // failure retired it, whatever the timeout.
    let m = manager_on_with(&cluster, Duration::from_secs(2)).await;
    let victim = 0;
    let keys = keys_on_each_master(&cluster, &m, "ct-dead-master", 4);
    // Locks held on the victim: each renewal round meets the dead master.
    let mut held = Vec::new();
    for key in &keys[victim] {
        held.push(
            m.lock(key.clone())
                .lease(Duration::from_millis(1_500))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let live: Vec<usize> = (0..MASTERS).filter(|i| *i != victim).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let cycles = Arc::new(AtomicUsize::new(0));
    let others: Vec<String> = live.iter().flat_map(|i| keys[*i].clone()).collect();
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (m, stop, failures, cycles) =
                (m.clone(), stop.clone(), failures.clone(), cycles.clone());
            let others = others.clone();
            tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::SeqCst) {
                    let key = &others[i % others.len()];
                    i += 1;
                    let outcome = match m
                        .lock(key.clone())
                        .lease(Duration::from_secs(2))
                        .wait(Duration::from_secs(5))
                        .acquire()
                        .await
                    {
                        Ok(g) => g.release().await.map_err(|e| format!("release {key}: {e}")),
                        Err(e) => Err(format!("acquire {key}: {e}")),
                    };
                    match outcome {
                        Ok(()) => {
                            cycles.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                }
            })
        })
        .collect();
    // Tasks that want the victim's locks meanwhile (their calls fail until
    // the failover: not counted).
    let on_victim: Vec<_> = (0..8)
        .map(|t| {
            let (m, stop) = (m.clone(), stop.clone());
            let key = keys[victim][t % keys[victim].len()].clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(g) = m
                        .lock(key.clone())
                        .lease(Duration::from_secs(2))
                        .wait(Duration::from_millis(500))
                        .acquire()
                        .await
                    {
                        let _ = g.release().await;
                    }
                }
            })
        })
        .collect();
    // Some cycles before the kill, so that every task is in its loop.
    eventually(Duration::from_secs(5), async || {
        cycles.load(Ordering::Relaxed) >= 50
    })
    .await
    .expect("cycles before the kill");
    let killed_at = Instant::now();
    kill_and_await_failover(&mut cluster, victim);
    let failed_over_after = killed_at.elapsed();
    // And a second after it, when the manager reads the new slot map.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks.into_iter().chain(on_victim) {
        task.await.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    eprintln!(
        "failover after {failed_over_after:?}: {} cycles, {} failed",
        cycles.load(Ordering::Relaxed),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} calls on live masters failed, first: {:?}",
        failures.len(),
        failures.first()
    );
    drop(held);
}

/// Kills master `victim` of a cluster with replicas and returns once a
/// replica took its place (a failover takes a few seconds with the
/// fixture's node timeout; 15 s leaves room for a loaded machine).
fn kill_and_await_failover(cluster: &mut RedisCluster, victim: usize) {
    tokio::task::block_in_place(|| {
        cluster.kill(victim).unwrap();
        cluster.wait_for_failover(Duration::from_secs(15)).unwrap();
    });
}

/// `list` by a manager that saw none of a failover (it made no call since)
/// reads every master the cluster has now: the slot map is read again
/// first. Its map still named the dead master, where the scan went, and the
/// promoted one's locks were not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_after_a_failover_the_manager_did_not_see_reads_the_promoted_master() {
    let _faults = FAULTS.lock().await;
    let mut cluster = cluster_with_replicas(&[]);
    let idle = manager_on(&cluster).await;
    let victim = 1;
    kill_and_await_failover(&mut cluster, victim);
    // Taken by a manager built after the failover, on a key of the promoted
    // master (a replica at spawn time: index 3 and up).
    let taker = manager_on(&cluster).await;
    let key = (0..)
        .map(|i| format!("unseen:{i}"))
        .find(|key| cluster.master_of_key(&taker.redis_names(key).lock).unwrap() >= 3)
        .unwrap();
    let guard = taker.lock(key.as_str()).acquire().await.unwrap();
    let listed = idle.list("unseen:*").await.unwrap();
    assert!(
        listed.iter().any(|info| info.key == key),
        "{key} not listed: {listed:?}"
    );
    guard.release().await.unwrap();
}

/// A multi-lock release meets a slot that moved since the manager last read
/// the slot map: the pipeline goes to the old master, which releases the
/// lock still there and answers `MOVED` for the other. Neither is reported
/// lost (the moved one was never touched; it is released on its new master)
/// and both end free. Before, redis-rs sent the whole pipeline again on the
/// redirection, so the lock the first send had released was found gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_meets_a_moved_slot_reports_nothing_lost() {
    let _faults = FAULTS.lock().await;
    let cluster = own_cluster();
    let m = manager_on(&cluster).await;
    let keys = keys_on_each_master(&cluster, &m, "ct-moved", 2);
    let mut conn = cluster.cluster_connection().await.unwrap();
    // Not renewed (a renewal would find the move and read the slot map
    // again), on a lease that outlasts the migration.
    let both = m
        .lock_all(keys[0].clone())
        .lease(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let moved = m.redis_names(&keys[0][1]).lock;
    let slot = key_slot(moved.as_bytes());
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, 1).unwrap());
    assert_eq!(cluster.master_of_slot(slot).unwrap(), 1);
    assert!(
        exists(&mut conn, &moved).await,
        "the lock moved with its slot"
    );
    let r = both.release().await;
    assert!(r.is_ok(), "a release across a moved slot: {r:?}");
    for key in &keys[0] {
        let name = m.redis_names(key).lock;
        assert!(!exists(&mut conn, &name).await, "{name} still held");
    }
}

/// A master closes every client connection (`CLIENT KILL`, as its `timeout`
/// or a proxy's idle limit would): the manager's connection of its own for
/// multi-lock releases to that master is made again by itself, so the next
/// such release succeeds rather than failing on a dead connection (and
/// leaving its locks to the background).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_connection_the_server_closed_is_made_again() {
    let cluster = own_cluster();
    // The acquisition after `CLIENT KILL` waits for the cluster connection to
    // be made again, which took more than 500 ms once under a full CI run's
    // load: 5 s. A release on a connection that is not made again fails at
    // once (the server closed it), so the longer timeout hides nothing.
    let m = manager_on_with(&cluster, Duration::from_secs(5)).await;
    let keys = keys_on_each_master(&cluster, &m, "ct-closed", 2);
    let mut conn = cluster.cluster_connection().await.unwrap();
    // The first multi-lock release on master 0 opens its connection.
    let g = m.lock_all(keys[0].clone()).acquire().await.unwrap();
    g.release().await.unwrap();
    tokio::task::block_in_place(|| {
        let mut master = cluster.blocking_client(0).unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut master)
            .unwrap();
        assert!(killed >= 2, "killed {killed} connections");
    });
    let g = m.lock_all(keys[0].clone()).acquire().await.unwrap();
    let r = g.release().await;
    assert!(
        r.is_ok(),
        "a release after the server closed its connection: {r:?}"
    );
    for key in &keys[0] {
        let name = m.redis_names(key).lock;
        assert!(!exists(&mut conn, &name).await, "{name} still held");
    }
}
