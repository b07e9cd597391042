//! Multi-key locks (`LockManager::lock_all`) against real redis-server
//! processes: deadlock freedom in both orders, all or nothing, re-entry on a
//! subset, the lost signal, the one-round-trip cost on one server, and the same
//! behaviour on a Redis Cluster with keys on different masters.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use distlock::testing::RedisCluster;
use distlock::{LockError, LockManager, MultiLockGuard};
use redis::aio::ConnectionLike;

/// Whether the lock of `key` exists in Redis, through any connection
/// (a cluster connection follows MOVED).
async fn held(conn: &mut impl ConnectionLike, m: &LockManager, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(m.redis_names(key).lock)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

/// Marks the critical section of each key of one holder: panics if another
/// holder is inside any of them.
struct Sections {
    inside: Vec<AtomicBool>,
    entered: AtomicUsize,
}

impl Sections {
    fn new(keys: usize) -> Arc<Self> {
        Arc::new(Sections {
            inside: (0..keys).map(|_| AtomicBool::new(false)).collect(),
            entered: AtomicUsize::new(0),
        })
    }

    async fn run(&self, keys: &[usize]) {
        for &k in keys {
            assert!(
                !self.inside[k].swap(true, Ordering::SeqCst),
                "two holders of key {k} at once"
            );
        }
        self.entered.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1)).await;
        for &k in keys {
            self.inside[k].store(false, Ordering::SeqCst);
        }
    }
}

/// 16 tasks on 2 managers lock `[a, b]` and `[b, a]` (and some `lock(a)`,
/// `lock(b)` alone) over and over: each finishes within a bound, and no two
/// holders of one key ever overlap.
async fn both_orders(managers: [LockManager; 2], a: &str, b: &str) {
    let sections = Sections::new(2);
    let mut tasks = Vec::new();
    for t in 0..16 {
        let m = managers[t % 2].clone();
        let (a, b) = (a.to_owned(), b.to_owned());
        let sections = sections.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            for i in 0..8 {
                let lease = Duration::from_secs(5);
                let wait = Duration::from_secs(20);
                match (t + i) % 5 {
                    0 => {
                        let g = m.lock(&a).lease(lease).wait(wait).acquire().await.unwrap();
                        sections.run(&[0]).await;
                        g.release().await.unwrap();
                    }
                    1 => {
                        let g = m.lock(&b).lease(lease).wait(wait).acquire().await.unwrap();
                        sections.run(&[1]).await;
                        g.release().await.unwrap();
                    }
                    n => {
                        let keys = if n % 2 == 0 {
                            [a.clone(), b.clone()]
                        } else {
                            [b.clone(), a.clone()]
                        };
                        let g = m
                            .lock_all(keys)
                            .lease(lease)
                            .wait(wait)
                            .acquire()
                            .await
                            .unwrap();
                        let mut sorted = [a.clone(), b.clone()];
                        sorted.sort();
                        assert_eq!(g.keys(), sorted);
                        sections.run(&[0, 1]).await;
                        g.release().await.unwrap();
                    }
                }
            }
            started.elapsed()
        }));
    }
    for task in tasks {
        let took = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a task deadlocked (or starved)")
            .unwrap();
        assert!(took < Duration::from_secs(30));
    }
    assert_eq!(sections.entered.load(Ordering::SeqCst), 16 * 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_orders_concurrently_never_deadlock() {
    let redis = server();
    both_orders(
        [manager(&redis).await, manager(&redis).await],
        "acct:a",
        "acct:b",
    )
    .await;
}

#[tokio::test]
async fn keys_are_deduplicated_and_sorted() {
    let redis = server();
    let m = manager(&redis).await;
    let request = m.lock_all(["b", "a", "b", "c"]);
    assert_eq!(request.keys(), ["a", "b", "c"]);
    let g = request.acquire().await.unwrap();
    assert_eq!(g.keys(), ["a", "b", "c"]);
    let tokens = g.fencing_tokens().await.unwrap();
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(|t| *t > 0));
    assert_eq!(g.fencing_token("b").await.unwrap(), Some(tokens[1]));
    assert_eq!(g.fencing_token("z").await.unwrap(), None);
    g.release().await.unwrap();

    // Fencing tokens per key keep increasing, shared with `lock(k)`.
    let single = m.lock("b").acquire().await.unwrap();
    assert!(single.fencing_token().await.unwrap() > tokens[1]);
    single.release().await.unwrap();
}

/// A key held elsewhere: `try_acquire` takes none of the others, and a
/// waiting `acquire` times out having given back what it took meanwhile.
async fn partial_holds(
    a: &LockManager,
    b: &LockManager,
    conn: &mut impl ConnectionLike,
    [x, busy, y]: [&str; 3],
) {
    let holder = a.lock(busy).acquire().await.unwrap();

    assert!(b
        .lock_all([x, busy, y])
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(!held(conn, b, x).await);
    assert!(!held(conn, b, y).await);

    // `wait(0)` is one attempt: a timeout naming the busy key, nothing held.
    match b
        .lock_all([x, busy, y])
        .wait(Duration::ZERO)
        .acquire()
        .await
    {
        Err(LockError::Timeout { key, .. }) => assert_eq!(key, busy),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(!held(conn, b, x).await);
    assert!(!held(conn, b, y).await);

    let started = Instant::now();
    let err = b
        .lock_all([y, busy, x])
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    match &err {
        LockError::Timeout { key, waited } => {
            assert_eq!(key, busy);
            assert!(*waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(!held(conn, b, x).await);
    assert!(!held(conn, b, y).await);
    assert!(held(conn, b, busy).await);

    // Nothing of b's stayed: every other key is free for a at once.
    for k in [x, y] {
        a.lock(k)
            .try_acquire()
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    holder.release().await.unwrap();
    // And with the holder gone the whole set is free.
    b.lock_all([x, busy, y])
        .try_acquire()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn partial_holds_never_leak() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let mut conn = raw(&redis).await;
    partial_holds(&a, &b, &mut conn, ["x", "held", "y"]).await;
}

/// A waiting `lock_all` takes the free keys, waits for the busy one in lock
/// order, and gets it when its holder releases.
#[tokio::test]
async fn a_busy_key_is_waited_for_in_order() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let mut conn = raw(&redis).await;
    let holder = a.lock("q:2").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = b
            .lock_all(["q:3", "q:2", "q:1"])
            .wait(Duration::from_secs(5))
            .acquire()
            .await
            .unwrap();
        (b, g)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Lock order: q:1 is taken and held while q:2 is waited for; q:3 not yet.
    assert!(held(&mut conn, &a, "q:1").await);
    assert!(!held(&mut conn, &a, "q:3").await);
    let released = Instant::now();
    holder.release().await.unwrap();
    let (_b, g) = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(1));
    assert_eq!(g.keys(), ["q:1", "q:2", "q:3"]);
    for k in ["q:1", "q:2", "q:3"] {
        assert!(held(&mut conn, &a, k).await);
    }
    g.release().await.unwrap();
}

#[tokio::test]
async fn single_and_multi_key_locks_exclude_each_other() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let single = a.lock("e:1").acquire().await.unwrap();
    assert!(b
        .lock_all(["e:1", "e:2"])
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    single.release().await.unwrap();

    let multi = b.lock_all(["e:1", "e:2"]).acquire().await.unwrap();
    assert!(a.lock("e:2").try_acquire().await.unwrap().is_none());
    assert!(a
        .lock_all(["e:2", "e:3"])
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    multi.release().await.unwrap();
    a.lock("e:2")
        .try_acquire()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn reentry_on_a_subset() {
    let redis = server();
    let m = manager(&redis).await;
    let mut conn = raw(&redis).await;
    let outer = m.lock_all(["r:a", "r:b"]).acquire().await.unwrap();
    let (ta, tb) = (
        outer.fencing_token("r:a").await.unwrap().unwrap(),
        outer.fencing_token("r:b").await.unwrap().unwrap(),
    );
    outer
        .scope(async {
            let fast = Duration::from_millis(100);
            let a = tokio::time::timeout(fast, m.lock("r:a").acquire())
                .await
                .expect("re-entry is immediate")
                .unwrap();
            assert_eq!(a.fencing_token().await.unwrap(), ta);
            let sub = tokio::time::timeout(fast, m.lock_all(["r:a"]).acquire())
                .await
                .expect("re-entry is immediate")
                .unwrap();
            assert_eq!(sub.fencing_tokens().await.unwrap(), [ta]);
            // Partly held: re-enters r:b, acquires r:c.
            let partly = m
                .lock_all(["r:c", "r:b"])
                .wait(Duration::from_millis(100))
                .acquire()
                .await
                .unwrap();
            assert_eq!(partly.fencing_token("r:b").await.unwrap(), Some(tb));
            assert!(partly.fencing_token("r:c").await.unwrap().unwrap() > 0);
            // Nested scopes of the inner guards re-enter too.
            partly
                .scope(async {
                    let c = m.lock("r:c").try_acquire().await.unwrap().unwrap();
                    assert_eq!(
                        c.fencing_token().await.unwrap(),
                        partly.fencing_token("r:c").await.unwrap().unwrap()
                    );
                    c.release().await.unwrap();
                })
                .await;
            a.release().await.unwrap();
            sub.release().await.unwrap();
            partly.release().await.unwrap();
        })
        .await;
    // The inner releases only gave back their holds (r:c was theirs alone).
    assert!(held(&mut conn, &m, "r:a").await);
    assert!(held(&mut conn, &m, "r:b").await);
    assert!(!held(&mut conn, &m, "r:c").await);
    // Outside the scope the keys are not ours: another lock_all waits.
    assert!(m.lock_all(["r:a"]).try_acquire().await.unwrap().is_none());
    outer.release().await.unwrap();
    assert!(!held(&mut conn, &m, "r:a").await);
    assert!(!held(&mut conn, &m, "r:b").await);
}

async fn lost_within(g: &MultiLockGuard, limit: Duration) {
    tokio::time::timeout(limit, g.lost())
        .await
        .expect("lost() completes");
    assert!(g.is_lost());
    assert_eq!(g.remaining_lease(), Duration::ZERO);
}

/// Losing one lease (its lock deleted behind the holder's back, or
/// force-unlocked) is the guard's loss, named by key.
async fn lost_signal(
    m: &LockManager,
    other: &LockManager,
    conn: &mut impl ConnectionLike,
    keys: [&str; 3],
) {
    let lease = Duration::from_millis(600);

    let g = m.lock_all(keys).lease(lease).acquire().await.unwrap();
    assert!(!g.is_lost());
    let _: () = redis::cmd("DEL")
        .arg(m.redis_names(keys[1]).lock)
        .query_async(conn)
        .await
        .unwrap();
    lost_within(&g, lease * 2).await;
    let err = g.scope_until_lost(async { 1 }).await.unwrap_err();
    assert!(
        matches!(&err, LockError::Lost { key } if key == keys[1]),
        "{err:?}"
    );
    match g.release().await {
        Err(LockError::Lost { key }) => assert_eq!(key, keys[1]),
        other => panic!("expected Lost, got {other:?}"),
    }
    // The other keys were released all the same.
    for k in keys {
        assert!(!held(conn, m, k).await);
    }

    let g = m.lock_all(keys).lease(lease).acquire().await.unwrap();
    let body_ran_on = Arc::new(AtomicBool::new(false));
    let flag = body_ran_on.clone();
    let (stopped, ()) = tokio::join!(
        g.scope_until_lost(async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            flag.store(true, Ordering::SeqCst);
        }),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(other.force_unlock(keys[2]).await.unwrap());
        }
    );
    assert!(
        matches!(&stopped, Err(LockError::Lost { key }) if key == keys[2]),
        "{stopped:?}"
    );
    assert!(!body_ran_on.load(Ordering::SeqCst));
    drop(g);
}

#[tokio::test]
async fn one_lost_lease_is_the_guards_loss() {
    let redis = server();
    let (m, other) = (manager(&redis).await, manager(&redis).await);
    let mut conn = raw(&redis).await;
    lost_signal(&m, &other, &mut conn, ["l:a", "l:b", "l:c"]).await;
}

/// An uncontended `lock_all` of 3 keys on one server is one EVALSHA (the
/// script's own commands: 3 GETs of the locks, 3 GETs of the fencing counters,
/// 6 SETs); its release is one pipeline of release scripts.
#[tokio::test]
async fn one_round_trip_on_a_single_server() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    // Warm-up: the first use loads the scripts; and the fencing counters exist
    // from then on (no TIME).
    let keys = ["rt:1", "rt:2", "rt:3"];
    m.lock_all(keys)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    reset_stats(&mut raw).await;
    let g = m
        .lock_all(keys)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let calls = command_calls(&mut raw).await;
    // No fencing counters: the holds take their tokens on demand.
    assert_eq!(calls.get("evalsha"), Some(&1), "{calls:#?}");
    assert_eq!(calls.get("get"), Some(&3), "{calls:#?}");
    assert_eq!(calls.get("set"), Some(&3), "{calls:#?}");
    assert_eq!(calls.values().sum::<u64>(), 7, "{calls:#?}");

    reset_stats(&mut raw).await;
    g.release().await.unwrap();
    let calls = command_calls(&mut raw).await;
    assert_eq!(calls.get("evalsha"), Some(&3), "{calls:#?}");
    assert_eq!(calls.get("del"), Some(&3), "{calls:#?}");
    assert_eq!(calls.get("publish"), None, "{calls:#?}");

    // A busy key costs one script and writes nothing.
    let other = manager(&redis).await;
    let holder = other.lock("rt:2").acquire().await.unwrap();
    reset_stats(&mut raw).await;
    assert!(m.lock_all(keys).try_acquire().await.unwrap().is_none());
    let calls = command_calls(&mut raw).await;
    assert_eq!(calls.get("evalsha"), Some(&1), "{calls:#?}");
    assert_eq!(calls.get("set"), None, "{calls:#?}");
    holder.release().await.unwrap();
}

#[tokio::test]
async fn an_empty_key_set_is_an_empty_guard_without_a_redis_call() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    reset_stats(&mut raw).await;
    let g = m.lock_all(Vec::<String>::new()).acquire().await.unwrap();
    assert!(g.keys().is_empty());
    assert!(g.fencing_tokens().await.unwrap().is_empty());
    assert!(!g.is_lost());
    assert_eq!(g.remaining_lease(), Duration::MAX);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), g.lost())
            .await
            .is_err(),
        "an empty guard is never lost"
    );
    assert_eq!(g.scope_until_lost(async { 7 }).await.unwrap(), 7);
    g.release().await.unwrap();
    let g = m
        .lock_all(Vec::<String>::new())
        .try_acquire()
        .await
        .unwrap();
    drop(g.unwrap());
    assert_eq!(command_calls(&mut raw).await, Default::default());
}

#[tokio::test]
async fn bad_input_is_refused() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    assert!(matches!(
        m.lock_all(["ok", ""]).acquire().await,
        Err(LockError::InvalidKey { .. })
    ));
    assert!(matches!(
        m.lock_all(["ok"]).lease(Duration::ZERO).acquire().await,
        Err(LockError::InvalidConfig(_))
    ));
    assert!(!held(&mut raw, &m, "ok").await);
}

async fn release_and_drop(m: &LockManager, conn: &mut impl ConnectionLike, keys: [&str; 3]) {
    let g = m.lock_all(keys).acquire().await.unwrap();
    for k in keys {
        assert!(held(conn, m, k).await);
    }
    g.release().await.unwrap();
    for k in keys {
        assert!(!held(conn, m, k).await);
    }

    let g = m.lock_all(keys).acquire().await.unwrap();
    drop(g);
    let started = Instant::now();
    loop {
        let mut any = false;
        for k in keys {
            any |= held(conn, m, k).await;
        }
        if !any {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "drop did not release"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn release_frees_all_and_drop_releases_in_the_background() {
    let redis = server();
    let m = manager(&redis).await;
    let mut conn = raw(&redis).await;
    release_and_drop(&m, &mut conn, ["d:1", "d:2", "d:3"]).await;
}

/// A `lock_all` whose future is dropped while it waits leaves nothing held.
#[tokio::test]
async fn a_cancelled_acquisition_leaves_nothing_held() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let mut conn = raw(&redis).await;
    let holder = a.lock("c:2").acquire().await.unwrap();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        b.lock_all(["c:1", "c:2", "c:3"])
            .wait(Duration::from_secs(10))
            .acquire(),
    )
    .await;
    assert!(cancelled.is_err());
    assert!(
        eventually(Duration::from_secs(2), async || !held(&mut conn, &a, "c:1")
            .await)
        .await
        .is_some()
    );
    assert!(!held(&mut conn, &a, "c:3").await);
    holder.release().await.unwrap();
}

// --- Redis Cluster: keys on different masters, one acquire per key. ---

fn cluster() -> &'static RedisCluster {
    RedisCluster::process_wide().expect("redis-server must be installed to run the tests")
}

async fn cluster_manager(cluster: &RedisCluster) -> LockManager {
    LockManager::cluster_builder(cluster.urls())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect to the test cluster")
}

/// Three keys starting with `prefix` whose locks live on three different masters.
fn keys_on_three_masters(cluster: &RedisCluster, m: &LockManager, prefix: &str) -> [String; 3] {
    let mut found: Vec<Option<String>> = vec![None; 3];
    let mut i = 0;
    while found.iter().any(Option::is_none) {
        let key = format!("{prefix}:{i}");
        i += 1;
        let master = cluster.master_of_key(&m.redis_names(&key).lock).unwrap();
        if found[master].is_none() {
            found[master] = Some(key);
        }
    }
    let mut keys: Vec<String> = found.into_iter().flatten().collect();
    // Not in lock order, on purpose.
    keys.reverse();
    keys.try_into().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_across_masters() {
    let cluster = cluster();
    let (a, b) = (
        cluster_manager(cluster).await,
        cluster_manager(cluster).await,
    );
    let mut conn = cluster.cluster_connection().await.unwrap();

    let [k1, k2, k3] = keys_on_three_masters(cluster, &a, "mk-cluster");
    let keys = [k1.as_str(), k2.as_str(), k3.as_str()];
    let slots: std::collections::BTreeSet<u16> = keys
        .iter()
        .map(|k| distlock::testing::key_slot(a.redis_names(k).lock.as_bytes()))
        .collect();
    assert_eq!(slots.len(), 3);

    // Fencing tokens and exclusion.
    let g = a.lock_all(keys).acquire().await.unwrap();
    assert_eq!(g.fencing_tokens().await.unwrap().len(), 3);
    assert!(g.fencing_tokens().await.unwrap().iter().all(|t| *t > 0));
    assert!(b.lock(keys[0]).try_acquire().await.unwrap().is_none());
    g.release().await.unwrap();

    partial_holds(&a, &b, &mut conn, keys).await;
    release_and_drop(&a, &mut conn, keys).await;
    lost_signal(&a, &b, &mut conn, keys).await;

    // Re-entry works the same.
    let outer = a.lock_all(keys).acquire().await.unwrap();
    outer
        .scope(async {
            let sub = a
                .lock_all([keys[2], keys[0]])
                .try_acquire()
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                sub.fencing_token(keys[0]).await.unwrap(),
                outer.fencing_token(keys[0]).await.unwrap()
            );
            sub.release().await.unwrap();
        })
        .await;
    outer.release().await.unwrap();

    let [x, y, _] = keys_on_three_masters(cluster, &a, "mk-cluster-orders");
    both_orders([a, b], &x, &y).await;
}

// --- Redlock: the same ordered per-key path, each key a majority vote. ---

#[tokio::test]
async fn under_redlock() {
    let servers: Vec<_> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let redlock = |urls: Vec<String>| async move {
        LockManager::redlock_builder(urls)
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .expect("a Redlock manager")
    };
    let (a, b) = (redlock(urls.clone()).await, redlock(urls).await);
    let mut conn = raw(&servers[0]).await;

    let g = a.lock_all(["rl:b", "rl:a"]).acquire().await.unwrap();
    assert_eq!(g.keys(), ["rl:a", "rl:b"]);
    assert!(g.fencing_tokens().await.unwrap().iter().all(|t| *t > 0));
    assert!(b.lock("rl:a").try_acquire().await.unwrap().is_none());
    g.release().await.unwrap();
    for s in &servers {
        let mut c = raw(s).await;
        assert!(!held(&mut c, &a, "rl:a").await);
        assert!(!held(&mut c, &a, "rl:b").await);
    }

    // The per-server checks of `partial_holds` look at one member: a lock
    // that leaked would be on every member that granted it.
    partial_holds(&a, &b, &mut conn, ["rl:x", "rl:held", "rl:y"]).await;
}
