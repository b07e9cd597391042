//! Multi-key locks (`LockManager::lock_all`) against real servers: deadlock
//! freedom in both orders, all or nothing, re-entry on a subset, the lost
//! signal, the one-round-trip cost on one server, and the same behaviour on a
//! Redis Cluster with keys on different masters, under Redlock and (with the
//! `postgres` feature) on PostgreSQL, where a deadlock abort of the one
//! function call is retried, never surfaced. The store-neutral tests run on
//! every store (`on_stores!`).

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

/// Where a test looks at the locks behind a manager's back.
trait Store {
    /// Whether the lock of `key` is held.
    async fn held(&mut self, m: &LockManager, key: &str) -> bool;
    /// Deletes the lock of `key` as an outsider would, without telling its holder.
    async fn delete(&mut self, m: &LockManager, key: &str);
}

/// One Redis server (a Redlock member's, where a leaked lock would be) or a
/// cluster connection.
struct Raw<'a, C>(&'a mut C);

impl<C: ConnectionLike + Send> Store for Raw<'_, C> {
    async fn held(&mut self, m: &LockManager, key: &str) -> bool {
        held(self.0, m, key).await
    }

    async fn delete(&mut self, m: &LockManager, key: &str) {
        let _: () = redis::cmd("DEL")
            .arg(m.redis_names(key).lock)
            .query_async(self.0)
            .await
            .unwrap();
    }
}

/// A test deployment of any store: held as `is_locked` reads it.
struct Deployed<'a>(&'a Deployment);

impl Store for Deployed<'_> {
    async fn held(&mut self, m: &LockManager, key: &str) -> bool {
        m.is_locked(key).await.unwrap()
    }

    async fn delete(&mut self, m: &LockManager, key: &str) {
        #[cfg(feature = "postgres")]
        if let Deployment::Postgres { server, schema } = self.0 {
            let name = m.redis_names(key).lock.replace('\'', "''");
            server
                .psql(&format!("DELETE FROM {schema}.locks WHERE name = '{name}'"))
                .unwrap();
            return;
        }
        let mut conn = self.0.raw_for(m, key).await;
        Raw(&mut conn).delete(m, key).await;
    }
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

async fn both_orders_concurrently_never_deadlock(d: Deployment) {
    both_orders([d.manager().await, d.manager().await], "acct:a", "acct:b").await;
}

async fn keys_are_deduplicated_and_sorted(d: Deployment) {
    let m = d.manager().await;
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
    conn: &mut impl Store,
    [x, busy, y]: [&str; 3],
) {
    let holder = a.lock(busy).acquire().await.unwrap();

    assert!(b
        .lock_all([x, busy, y])
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(!conn.held(b, x).await);
    assert!(!conn.held(b, y).await);

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
    assert!(!conn.held(b, x).await);
    assert!(!conn.held(b, y).await);

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
    assert!(!conn.held(b, x).await);
    assert!(!conn.held(b, y).await);
    assert!(conn.held(b, busy).await);

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

async fn partial_holds_never_leak(d: Deployment) {
    let (a, b) = (d.manager().await, d.manager().await);
    partial_holds(&a, &b, &mut Deployed(&d), ["x", "held", "y"]).await;
}

/// A waiting `lock_all` takes the free keys, waits for the busy one in lock
/// order, and gets it when its holder releases.
async fn a_busy_key_is_waited_for_in_order(d: Deployment) {
    let (a, b) = (d.manager().await, d.manager().await);
    let conn = &mut Deployed(&d);
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
    // Lock order: q:1 is taken and held while q:2 is waited for; q:3 not yet.
    await_waiter(&a, "q:2").await;
    assert!(conn.held(&a, "q:1").await);
    assert!(!conn.held(&a, "q:3").await);
    let released = Instant::now();
    holder.release().await.unwrap();
    let (_b, g) = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(1));
    assert_eq!(g.keys(), ["q:1", "q:2", "q:3"]);
    for k in ["q:1", "q:2", "q:3"] {
        assert!(conn.held(&a, k).await);
    }
    g.release().await.unwrap();
}

async fn single_and_multi_key_locks_exclude_each_other(d: Deployment) {
    let (a, b) = (d.manager().await, d.manager().await);
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

async fn reentry_on_a_subset(d: Deployment) {
    let m = d.manager().await;
    let conn = &mut Deployed(&d);
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
    assert!(conn.held(&m, "r:a").await);
    assert!(conn.held(&m, "r:b").await);
    assert!(!conn.held(&m, "r:c").await);
    // Outside the scope the keys are not ours: another lock_all waits.
    assert!(m.lock_all(["r:a"]).try_acquire().await.unwrap().is_none());
    outer.release().await.unwrap();
    assert!(!conn.held(&m, "r:a").await);
    assert!(!conn.held(&m, "r:b").await);
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
async fn lost_signal(m: &LockManager, other: &LockManager, conn: &mut impl Store, keys: [&str; 3]) {
    let lease = Duration::from_millis(600);

    let g = m.lock_all(keys).lease(lease).acquire().await.unwrap();
    assert!(!g.is_lost());
    conn.delete(m, keys[1]).await;
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
        assert!(!conn.held(m, k).await);
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

async fn one_lost_lease_is_the_guards_loss(d: Deployment) {
    let (m, other) = (d.manager().await, d.manager().await);
    lost_signal(&m, &other, &mut Deployed(&d), ["l:a", "l:b", "l:c"]).await;
}

/// An uncontended `lock_all` of 3 keys on one server is one EVALSHA (the
/// script's own commands: 3 GETs of the locks, 3 ZRANGEs of their empty
/// queues, 3 SETs); its release is one pipeline of release scripts.
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
    // Whether a live waiter heads a free lock's queue (it gets the lock).
    assert_eq!(calls.get("zrange"), Some(&3), "{calls:#?}");
    assert_eq!(calls.values().sum::<u64>(), 10, "{calls:#?}");

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

async fn bad_input_is_refused(d: Deployment) {
    let m = d.manager().await;
    assert!(matches!(
        m.lock_all(["ok", ""]).acquire().await,
        Err(LockError::InvalidKey { .. })
    ));
    assert!(matches!(
        m.lock_all(["ok"]).lease(Duration::ZERO).acquire().await,
        Err(LockError::InvalidConfig(_))
    ));
    assert!(!m.is_locked("ok").await.unwrap());
}

async fn release_and_drop(m: &LockManager, conn: &mut impl Store, keys: [&str; 3]) {
    let g = m.lock_all(keys).acquire().await.unwrap();
    for k in keys {
        assert!(conn.held(m, k).await);
    }
    g.release().await.unwrap();
    for k in keys {
        assert!(!conn.held(m, k).await);
    }

    let g = m.lock_all(keys).acquire().await.unwrap();
    drop(g);
    let started = Instant::now();
    loop {
        let mut any = false;
        for k in keys {
            any |= conn.held(m, k).await;
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

async fn release_frees_all_and_drop_releases_in_the_background(d: Deployment) {
    let m = d.manager().await;
    release_and_drop(&m, &mut Deployed(&d), ["d:1", "d:2", "d:3"]).await;
}

/// A `lock_all` whose future is dropped while it waits leaves nothing held.
async fn a_cancelled_acquisition_leaves_nothing_held(d: Deployment) {
    let (a, b) = (d.manager().await, d.manager().await);
    let conn = &mut Deployed(&d);
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
        eventually(Duration::from_secs(2), async || !conn.held(&a, "c:1").await)
            .await
            .is_some()
    );
    assert!(!conn.held(&a, "c:3").await);
    holder.release().await.unwrap();
}

/// A `lock_all` with a `min_hold` that fails (times out, or its future is
/// dropped) gives back the locks it took at once: its caller never held
/// them, so the `min_hold` keeps none of them.
async fn a_failed_acquisition_keeps_nothing_for_its_min_hold(d: Deployment) {
    let (a, b) = (d.manager().await, d.manager().await);
    let conn = &mut Deployed(&d);
    let holder = a.lock("m:2").acquire().await.unwrap();
    // m:1 is taken in lock order, then m:2 waited for until the wait ends.
    let timed_out = b
        .lock_all(["m:1", "m:2"])
        .min_hold(Duration::from_secs(300))
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    assert!(
        !conn.held(&a, "m:1").await,
        "kept for the min_hold after a timeout"
    );
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        b.lock_all(["m:1", "m:2"])
            .min_hold(Duration::from_secs(300))
            .wait(Duration::from_secs(10))
            .acquire(),
    )
    .await;
    assert!(cancelled.is_err());
    // Released in the background by the dropped future.
    assert!(
        eventually(Duration::from_secs(2), async || !conn.held(&a, "m:1").await)
            .await
            .is_some(),
        "kept for the min_hold after the acquisition was dropped"
    );
    holder.release().await.unwrap();
}

/// A lock taken first whose lease runs out unrenewed while a later one is
/// waited for fails the acquisition with `Lost` and gives everything back:
/// a guard handed out then would claim a lock another may hold.
async fn a_lock_lost_while_the_others_are_waited_for_fails_the_acquisition(d: Deployment) {
    let (a, b) = (d.manager().await, d.manager().await);
    let conn = &mut Deployed(&d);
    let holder = a.lock("e:2").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        b.lock_all(["e:1", "e:2"])
            .lease(Duration::from_millis(500))
            .renew(false)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
    });
    // e:1 is taken in lock order, then e:2 waited for; e:1's lease ends in
    // the store 0.5 s after it was sent, and the waiter's local deadline for
    // it ended before that.
    await_waiter(&a, "e:2").await;
    assert!(
        eventually(Duration::from_secs(5), async || !conn.held(&a, "e:1").await)
            .await
            .is_some()
    );
    holder.release().await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&acquired, Err(LockError::Lost { key }) if key == "e:1"),
        "{acquired:?}"
    );
    assert!(
        eventually(Duration::from_secs(2), async || !conn.held(&a, "e:2").await)
            .await
            .is_some(),
        "e:2 was not given back"
    );
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

    partial_holds(&a, &b, &mut Raw(&mut conn), keys).await;
    release_and_drop(&a, &mut Raw(&mut conn), keys).await;
    lost_signal(&a, &b, &mut Raw(&mut conn), keys).await;

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
    partial_holds(&a, &b, &mut Raw(&mut conn), ["rl:x", "rl:held", "rl:y"]).await;
}

on_stores!(
    both_orders_concurrently_never_deadlock,
    a_lock_lost_while_the_others_are_waited_for_fails_the_acquisition,
    a_failed_acquisition_keeps_nothing_for_its_min_hold,
    keys_are_deduplicated_and_sorted,
    partial_holds_never_leak,
    a_busy_key_is_waited_for_in_order,
    single_and_multi_key_locks_exclude_each_other,
    reentry_on_a_subset,
    one_lost_lease_is_the_guards_loss,
    bad_input_is_refused,
    release_frees_all_and_drop_releases_in_the_background,
    a_cancelled_acquisition_leaves_nothing_held,
);

/// A key left free with a live waiter at the head of its queue (its holder's
/// lease ran out: the lock is deleted here behind its holder's back) is busy
/// for a `lock_all` that takes its keys in one call: the call hands it to
/// that waiter, as a single lock's acquisition does, instead of taking it
/// past the queue and leaving it unmarked (then its release handed nothing
/// over and the waiter waited for its next attempt). The other keys of the
/// call are not taken.
///
/// The waiter's next attempt of its own is far off: its attempt saw a 10 s
/// lease, and it refreshes its queue entry only every 0.4-0.8 s, while
/// the `lock_all` follows the deletion within milliseconds. (Should the
/// waiter's refresh fall in between, it takes the key itself and the test
/// passes without proving anything: rare, never a false failure.)
/// One server and PostgreSQL only: in a cluster a `lock_all` that does not
/// wait takes each key with a single lock's plain `SET NX`, whose window
/// after an expiry is documented (`fair.rs`).
async fn a_free_key_with_a_live_waiter_is_handed_to_it_not_taken(d: Deployment) {
    let (a, b, c) = (d.manager().await, d.manager().await, d.manager().await);
    let holder = a
        .lock("h:1")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&b, "h:1");
    await_waiter(&a, "h:1").await;
    Deployed(&d).delete(&a, "h:1").await;

    let multi = c
        .lock_all(["h:0", "h:1", "h:2"])
        .try_acquire()
        .await
        .unwrap();
    assert!(
        multi.is_none(),
        "lock_all took a free key past the waiter at the head of its queue"
    );
    let handed = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter never got the key")
        .unwrap()
        .unwrap();
    assert_eq!(handed.key(), "h:1");
    assert!(!handed.is_lost());
    for k in ["h:0", "h:2"] {
        assert!(!Deployed(&d).held(&a, k).await, "{k} was taken");
    }
    handed.release().await.unwrap();
    drop(holder);
}

mod a_free_key_with_a_live_waiter_is_handed_to_it_not_taken {
    use super::*;

    #[tokio::test]
    async fn single() {
        super::a_free_key_with_a_live_waiter_is_handed_to_it_not_taken(Deployment::single()).await
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::a_free_key_with_a_live_waiter_is_handed_to_it_not_taken(Deployment::postgres()).await
    }
}

// --- PostgreSQL: one function call, and what it does under contention. ---

/// Tasks of two managers lock overlapping key sets, each in the opposite
/// order of another's (`[a, b, c]` against `[c, b, d]`, `[d, a]` against
/// `[a, d]`), some with one call only (`try_acquire`, the function call
/// alone), some waiting: nobody gets a deadlock error, no two holders of a
/// key overlap, and every task finishes.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_overlapping_sets_in_opposite_orders_never_deadlock() {
    let d = Deployment::postgres();
    let managers = [d.manager().await, d.manager().await];
    let names = ["ov:a", "ov:b", "ov:c", "ov:d"];
    let sets: [&[usize]; 4] = [&[0, 1, 2], &[2, 1, 3], &[3, 0], &[0, 3]];
    let sections = Sections::new(names.len());
    let attempts = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let m = managers[t % 2].clone();
        let sections = sections.clone();
        let attempts = attempts.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            for i in 0..12 {
                let set = sets[(t + i) % sets.len()];
                let keys: Vec<&str> = set.iter().map(|&k| names[k]).collect();
                let request = m.lock_all(keys).lease(Duration::from_secs(5));
                attempts.fetch_add(1, Ordering::SeqCst);
                let guard = if t % 2 == 0 {
                    match request.try_acquire().await.unwrap() {
                        Some(guard) => guard,
                        None => continue,
                    }
                } else {
                    request
                        .wait(Duration::from_secs(20))
                        .acquire()
                        .await
                        .unwrap()
                };
                sections.run(set).await;
                guard.release().await.unwrap();
                done += 1;
            }
            done
        }));
    }
    let mut done = 0;
    for task in tasks {
        done += tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("a task deadlocked (or starved)")
            .unwrap();
    }
    assert_eq!(attempts.load(Ordering::SeqCst), 8 * 12);
    // Every waiting task's acquisitions got in; the one-call tasks' did when
    // their keys were free.
    assert!(done >= 4 * 12, "{done}");
    assert_eq!(sections.entered.load(Ordering::SeqCst), done);
    for name in names {
        assert!(!managers[0].is_locked(name).await.unwrap());
    }
}

/// An outside session holds the advisory key of one lock and then asks for
/// the other's, which a `lock_all` of both holds while it waits for the
/// first: a cycle, which PostgreSQL breaks by aborting the `lock_all`'s call
/// (SQLSTATE 40P01), since its wait began first and the outsider's
/// `deadlock_timeout` is longer. The caller never sees that abort: the call
/// is sent again, waits for the outsider's commit and takes both locks.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_deadlock_abort_of_lock_all_is_retried_not_surfaced() {
    let d = Deployment::postgres();
    let Deployment::Postgres { server, .. } = &d else {
        unreachable!()
    };
    let m = d.manager().await;
    let outsider = pg_client(server).await;
    let keys = ["deadlock:x", "deadlock:y"];
    // The function takes the advisory keys in ascending order: `first` is
    // the one the `lock_all` holds while it waits for `second`.
    let mut advisory = Vec::new();
    for key in keys {
        let name = m.redis_names(key).lock;
        let row = outsider
            .query_one("SELECT hashtext($1)", &[&name])
            .await
            .unwrap();
        advisory.push(row.get::<_, i32>(0));
    }
    assert_ne!(advisory[0], advisory[1], "the test's keys share a hash");
    let (first, second) = (
        *advisory.iter().min().unwrap(),
        *advisory.iter().max().unwrap(),
    );
    outsider
        .batch_execute("SET deadlock_timeout = '10s'; BEGIN")
        .await
        .unwrap();
    outsider
        .execute("SELECT pg_advisory_xact_lock(1684826880, $1)", &[&second])
        .await
        .unwrap();
    let taking = tokio::spawn({
        let m = m.clone();
        async move { m.lock_all(keys).try_acquire().await }
    });
    // The `lock_all`'s call holds `first` and waits for `second`.
    let watcher = pg_client(server).await;
    let waits = eventually(Duration::from_secs(10), async || {
        let row = watcher
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
                 AND classid = 1684826880 AND objid = ($1::int4)::oid",
                &[&second],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == 1
    })
    .await;
    assert!(
        waits.is_some(),
        "the lock_all never waited for the outsider"
    );
    // The cycle: the server's deadlock check (after its 1 s default
    // deadlock_timeout) aborts the `lock_all`'s call, which lets the outsider
    // through; the outsider's own check would come only after 10 s.
    tokio::time::timeout(
        Duration::from_secs(5),
        outsider.execute("SELECT pg_advisory_xact_lock(1684826880, $1)", &[&first]),
    )
    .await
    .expect("the lock_all's call was aborted as the deadlock's victim")
    .unwrap();
    outsider.batch_execute("COMMIT").await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), taking)
        .await
        .expect("the retried call completes")
        .unwrap()
        .expect("no deadlock error reaches the caller")
        .expect("both locks were free once the outsider committed");
    assert_eq!(guard.keys(), keys);
    guard.release().await.unwrap();
}

/// A plain client of the deployment's server, its connection driven by a task.
#[cfg(feature = "postgres")]
async fn pg_client(server: &distlock_testing::PostgresServer) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// An uncontended `lock_all` of 3 keys on PostgreSQL is one statement (the
/// `acquire_all` function call), eager fencing tokens included; one with a
/// busy key is one statement too and takes none; the release is one
/// statement per key (pipelined). Counted in the server's statement log.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_uncontended_lock_all_is_one_statement() {
    let pg = distlock_testing::PostgresServer::builder()
        .setting("log_statement", "all")
        .start()
        .unwrap();
    let manager = async || {
        LockManager::builder(&pg.url())
            // No sweep statement may fall between two counts.
            .postgres_sweep_interval(Duration::from_secs(3600))
            .build()
            .await
            .unwrap()
    };
    let (m, other) = (manager().await, manager().await);
    let keys = ["st:1", "st:2", "st:3"];
    // Warm up (the managers' first statements, the schema check).
    for manager in [&m, &other] {
        manager
            .lock_all(keys)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let statements = |function: &str| common::distlock_statements_logged(&pg, function);
    // The log is written by the server process before it answers, so every
    // statement is in it once the call that sent it returned.
    let (acquires, all, releases) = (
        statements("acquire("),
        statements("acquire_all("),
        statements("release("),
    );
    let g = m
        .lock_all(keys)
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap();
    let tokens = g.fencing_tokens().await.unwrap();
    assert_eq!(statements("acquire_all(") - all, 1);
    assert_eq!(statements("acquire(") - acquires, 0);
    assert_eq!(
        statements("issue_token("),
        0,
        "the tokens came with the grant"
    );
    assert!(tokens.iter().all(|t| *t > 0), "{tokens:?}");
    assert!(tokens.windows(2).all(|w| w[0] != w[1]), "{tokens:?}");
    g.release().await.unwrap();
    assert_eq!(statements("release(") - releases, 3);

    let holder = other.lock("st:2").acquire().await.unwrap();
    let all = statements("acquire_all(");
    assert!(m.lock_all(keys).try_acquire().await.unwrap().is_none());
    assert_eq!(statements("acquire_all(") - all, 1);
    for key in ["st:1", "st:3"] {
        assert!(!m.is_locked(key).await.unwrap(), "{key} was taken");
    }
    holder.release().await.unwrap();
}
