//! The default lock's queue: waiters of several managers (each with its own
//! connections, as separate processes would have) are served in arrival order, through a
//! direct hand-off at release; dead and cancelled waiters do not hold up the
//! queue; the hand-off costs the new holder no round trip; and the same on a
//! Redis Cluster.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use distlock::testing::RedisCluster;
use distlock::{distributed_lock, LockError, LockGuard, LockManager};
use redis::aio::MultiplexedConnection;

/// The Redis name of fair-lock `kind` (`fair`, `fairq`, `fairqe`, ...) of `key`
/// that exists now on the server behind `conn`, if any.
async fn fair_name(conn: &mut MultiplexedConnection, kind: &str, key: &str) -> Option<String> {
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("distlock:{kind}:*"))
        .query_async(conn)
        .await
        .expect("KEYS");
    names
        .into_iter()
        .find(|n| n.ends_with(&format!("}}:{key}")))
}

/// How many waiters the fair lock `key` has queued, over the servers behind
/// `conns` (one, or every master of a cluster).
async fn queue_len(conns: &mut [MultiplexedConnection], key: &str) -> usize {
    let mut n = 0;
    for conn in conns.iter_mut() {
        if let Some(queue) = fair_name(conn, "lockq", key).await {
            let len: usize = redis::cmd("ZCARD")
                .arg(&queue)
                .query_async(conn)
                .await
                .expect("ZCARD");
            n += len;
        }
    }
    n
}

async fn wait_for_queue(conns: &mut [MultiplexedConnection], key: &str, len: usize) {
    let reached = eventually(Duration::from_secs(10), async || {
        queue_len(conns, key).await == len
    })
    .await;
    assert!(
        reached.is_some(),
        "the queue of {key} never had {len} entries"
    );
}

/// Starts waiters on `managers` (waiter `i` on manager `i % managers.len()`),
/// one at a time, each queued before the next starts; each records its number
/// when it gets the lock, holds it 20 ms and releases it.
async fn queue_waiters(
    managers: &[LockManager],
    conns: &mut [MultiplexedConnection],
    key: &str,
    count: usize,
    served: &Arc<Mutex<Vec<usize>>>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    let mut tasks = Vec::new();
    for i in 0..count {
        let m = managers[i % managers.len()].clone();
        let owned_key = key.to_owned();
        let served = served.clone();
        tasks.push(tokio::spawn(async move {
            let guard = m
                .lock(&owned_key)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            served.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let token = guard.fencing_token().await.unwrap();
            guard.release().await.unwrap();
            token
        }));
        wait_for_queue(conns, key, i + 1).await;
    }
    tasks
}

async fn managers(redis: &distlock::testing::RedisServer, n: usize) -> Vec<LockManager> {
    let mut all = Vec::new();
    for _ in 0..n {
        all.push(manager(redis).await);
    }
    all
}

#[tokio::test]
async fn waiters_of_four_managers_are_served_in_arrival_order() {
    let redis = server();
    let ms = managers(&redis, 4).await;
    let mut conns = vec![raw(&redis).await];
    let holder = manager(&redis).await;

    let guard = holder.lock("turns").acquire().await.unwrap();
    let first_token = guard.fencing_token().await.unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_waiters(&ms, &mut conns, "turns", 8, &served).await;
    guard.release().await.unwrap();
    let mut tokens = vec![first_token];
    for t in tasks {
        tokens.push(t.await.unwrap());
    }
    assert_eq!(*served.lock().unwrap(), (0..8).collect::<Vec<_>>());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens increase along the queue: {tokens:?}"
    );
    // Nothing is left behind but the fencing counter.
    assert_eq!(fair_name(&mut conns[0], "lockq", "turns").await, None);
    assert_eq!(fair_name(&mut conns[0], "lockqe", "turns").await, None);
    assert_eq!(fair_name(&mut conns[0], "lock", "turns").await, None);
}

#[tokio::test]
async fn arrival_order_holds_when_the_holders_lease_runs_out() {
    let redis = server();
    let ms = managers(&redis, 4).await;
    let mut conns = vec![raw(&redis).await];
    let holder = manager(&redis).await;

    let guard = holder
        .lock("expiring")
        .lease(Duration::from_secs(1))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_waiters(&ms, &mut conns, "expiring", 8, &served).await;
    // The holder vanishes without a release: its lease runs out.
    std::mem::forget(guard);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

/// A queue entry nobody refreshes (its waiter died: inserted here by hand, with
/// an owner token of the scripts' shape (32 hex digits),
/// a 1.5 s queue lease and hand-off TTL, and a route no manager listens to)
/// holds up the waiter behind it no longer than that. The entry is in the
/// scripts' format, so the release really hands the lock to the dead waiter.
#[tokio::test]
async fn a_dead_waiter_holds_up_the_queue_at_most_its_queue_lease() {
    let redis = server();
    let holder = manager(&redis).await;
    let live = manager(&redis).await;
    let mut conns = vec![raw(&redis).await];
    let guard = holder.lock("dead").acquire().await.unwrap();

    let lock = fair_name(&mut conns[0], "lock", "dead").await.unwrap();
    let queue = lock.replacen("distlock:lock:", "distlock:lockq:", 1);
    let entries = lock.replacen("distlock:lock:", "distlock:lockqe:", 1);
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conns[0]).await.unwrap();
    let expiry = secs * 1000 + micros / 1000 + 1500;
    let _: () = redis::pipe()
        .cmd("ZADD")
        .arg(&queue)
        .arg(1)
        .arg("deadbeefdeadbeefdeadbeefdeadbeef")
        .cmd("HSET")
        .arg(&entries)
        .arg("deadbeefdeadbeefdeadbeefdeadbeef")
        .arg(format!("{expiry}:1500:0:dead:1:a dead waiter"))
        .query_async(&mut conns[0])
        .await
        .unwrap();

    let waiter = tokio::spawn(async move {
        let g = live
            .lock("dead")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let at = Instant::now();
        g.release().await.unwrap();
        at
    });
    wait_for_queue(&mut conns, "dead", 2).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let got = waiter.await.unwrap();
    let delay = got - released;
    assert!(
        delay < Duration::from_millis(1500 + 1200),
        "held up {delay:?} by a dead waiter with a 1.5 s queue lease"
    );
    // The lock went to the dead waiter first and expired with its hand-off
    // TTL (an entry the scripts could not read would be skipped at once).
    assert!(
        delay >= Duration::from_millis(1000),
        "not held up at all ({delay:?}): the dead entry was not handed the lock"
    );
}

/// A waiter queued in a runtime that goes away (its process dies: no
/// withdrawal, no refresh, its connections closed) holds up the waiter behind
/// it at most its queue lease (3 s) after the hand-off it never hears.
#[tokio::test]
async fn a_waiter_whose_runtime_dies_holds_up_the_queue_at_most_its_queue_lease() {
    held_up_by_a_waiter_whose_runtime_dies("killed", true, Duration::from_secs(30)).await;
}

/// The same for a waiter that does not renew, with a lease of a minute: the
/// hand-off gave it the whole lease, so the lock stayed with the dead
/// process for that minute. A hand-off now gives it the queue lease, and the
/// waiter, alive, confirms it with one more attempt (which sets the lease).
#[tokio::test]
async fn a_dead_waiter_that_would_not_renew_holds_up_the_queue_at_most_its_queue_lease() {
    held_up_by_a_waiter_whose_runtime_dies("killed-no-renew", false, Duration::from_secs(60)).await;
}

/// A live waiter that does not renew gets its whole lease by the hand-off:
/// the hand-off's TTL (the queue lease), then one more attempt that finds the
/// lock its own and sets the lease.
#[tokio::test]
async fn a_waiter_that_does_not_renew_is_handed_its_whole_lease() {
    let redis = server();
    let holder = manager(&redis).await;
    let live = manager(&redis).await;
    let mut conns = vec![raw(&redis).await];
    let guard = holder.lock("no-renew").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = live
            .lock("no-renew")
            .renew(false)
            .lease(Duration::from_secs(60))
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        (live, g)
    });
    wait_for_queue(&mut conns, "no-renew", 1).await;
    guard.release().await.unwrap();
    let (live, g) = waiter.await.unwrap();
    let name = fair_name(&mut conns[0], "lock", "no-renew").await.unwrap();
    let ttl = pttl(&mut conns[0], &name).await;
    // Set by the confirming attempt a round trip ago: nearly 60 s.
    assert!(ttl > 55_000, "{ttl} ms left of a 60 s lease");
    assert!(
        g.remaining_lease() > Duration::from_secs(55),
        "{:?}",
        g.remaining_lease()
    );
    g.release().await.unwrap();
    drop(live);
}

async fn held_up_by_a_waiter_whose_runtime_dies(key: &'static str, renew: bool, lease: Duration) {
    let redis = server();
    let holder = manager(&redis).await;
    let live = manager(&redis).await;
    let mut conns = vec![raw(&redis).await];
    let guard = holder.lock(key).acquire().await.unwrap();

    let url = redis.url();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let m = manager_at(&url).await;
            tokio::spawn(async move {
                let _ = m
                    .lock(key)
                    .renew(renew)
                    .lease(lease)
                    .wait(Duration::from_secs(60))
                    .acquire()
                    .await;
            });
            let mut conns = [redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap()];
            wait_for_queue(&mut conns, key, 1).await;
        });
        // The waiter's task, its manager and its connections go with the
        // runtime; the withdrawal it would spawn finds no runtime to run on.
        drop(rt);
    })
    .join()
    .unwrap();
    assert_eq!(queue_len(&mut conns, key).await, 1, "left queued");

    let waiter = tokio::spawn(async move {
        let g = live
            .lock(key)
            .wait(Duration::from_secs(15))
            .acquire()
            .await
            .unwrap();
        let at = Instant::now();
        g.release().await.unwrap();
        at
    });
    wait_for_queue(&mut conns, key, 2).await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let got = waiter.await.unwrap();
    let delay = got - released;
    assert!(
        delay < Duration::from_millis(3000 + 1200),
        "held up {delay:?} by a dead waiter with a 3 s queue lease"
    );
}

#[tokio::test]
async fn a_cancelled_waiter_withdraws_and_the_next_gets_the_lock_directly() {
    let redis = server();
    let ms = managers(&redis, 3).await;
    let mut conns = vec![raw(&redis).await];
    let guard = ms[0].lock("cancel").acquire().await.unwrap();

    // Dropped while queued: the acquire future is aborted.
    let cancelled = {
        let m = ms[1].clone();
        tokio::spawn(async move {
            let _ = m
                .lock("cancel")
                .wait(Duration::from_secs(30))
                .acquire()
                .await;
        })
    };
    wait_for_queue(&mut conns, "cancel", 1).await;
    // Gives up at its wait: `tokio::time::timeout` around a longer wait.
    let timed_out = {
        let m = ms[1].clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                Duration::from_millis(600),
                m.lock("cancel").wait(Duration::from_secs(30)).acquire(),
            )
            .await
            .is_err()
        })
    };
    wait_for_queue(&mut conns, "cancel", 2).await;
    let next = {
        let m = ms[2].clone();
        tokio::spawn(async move {
            let g = m
                .lock("cancel")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        })
    };
    wait_for_queue(&mut conns, "cancel", 3).await;
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    assert!(timed_out.await.unwrap(), "the timeout fired");
    wait_for_queue(&mut conns, "cancel", 1).await;

    let released = Instant::now();
    guard.release().await.unwrap();
    let got = next.await.unwrap();
    assert!(
        got - released < Duration::from_millis(300),
        "the next waiter is handed the lock, not left to its timer: {:?}",
        got - released
    );

    // A fair waiter whose own `wait` runs out withdraws too.
    let g = ms[0].lock("cancel").acquire().await.unwrap();
    let err = ms[1]
        .lock("cancel")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    wait_for_queue(&mut conns, "cancel", 0).await;
    g.release().await.unwrap();
}

/// From the release to the new holder: one EVALSHA (the release, which hands
/// the lock off and publishes), and no acquire call by the waiter (its first
/// renewal, which brings the hand-off's short TTL up to its lease, comes a
/// second later). A waiter's
/// periodic refresh (every 0.4 to 0.8 s) may fall into the measured window,
/// so up to three cycles are measured and one clean one is required.
#[tokio::test]
async fn the_handoff_costs_the_new_holder_no_round_trip() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut conns = vec![raw(&redis).await];
    let mut seen = Vec::new();
    for round in 0..3 {
        let key = format!("cost:{round}");
        // Eager tokens: the hand-off itself issues the new holder's token.
        let guard = a.lock(&key).eager_fencing(true).acquire().await.unwrap();
        let (got_tx, got_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let waiter = {
            let b = b.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let g = b
                    .lock(&key)
                    .eager_fencing(true)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                let _ = got_tx.send(g.issued_fencing_token().unwrap());
                let _ = done_rx.await;
                g.release().await.unwrap();
            })
        };
        wait_for_queue(&mut conns, &key, 1).await;
        // Subscribed too: the waiter's manager listens on its own hand-off
        // channel, `<prefix>handoff:<route>`, for all its locks; so does the
        // holder's (for the notices of its waiters), and nothing else does.
        let channel = a.redis_names(&key).channel().to_owned();
        let subscribed = eventually(Duration::from_secs(5), async || {
            let listened: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg("distlock:handoff:*")
                .query_async(&mut conns[0])
                .await
                .expect("PUBSUB CHANNELS");
            listened.len() == 2 && numsub(&mut conns[0], &channel).await == 1
        })
        .await;
        assert!(subscribed.is_some());
        reset_stats(&mut conns[0]).await;
        let token = guard.fencing_token().await.unwrap();
        guard.release().await.unwrap();
        let handed = got_rx.await.unwrap();
        let calls = command_calls(&mut conns[0]).await;
        assert_eq!(handed, token + 1);
        let _ = done_tx.send(());
        waiter.await.unwrap();
        // Every acquire script starts with TIME (the server clock); so does the
        // release. The new holder's first renewal (GET + PEXPIRE, no TIME) is
        // due a third of the hand-off's TTL (the 3 s queue lease) after the
        // waiter's last attempt, which a slow machine may bring into the
        // window. A cycle is not clean when the holder's manager missed its
        // waiter's notice (sent before its hand-off channel was subscribed,
        // in the background, at its first acquisition): its release then
        // tries release_free.lua first (one more EVALSHA, a GET alone).
        let renewals = calls.get("pexpire").copied().unwrap_or(0);
        if calls.get("time") == Some(&1)
            && calls.get("publish") == Some(&1)
            && renewals <= 1
            && calls.get("evalsha").copied().unwrap_or(0) <= 1 + renewals
        {
            return;
        }
        seen.push(calls);
    }
    panic!("every measured hand-off had more than the release's call: {seen:#?}");
}

/// release.lua derives the hand-off channel's base (`<prefix>handoff`) from
/// the lock's names: under a prefix that itself contains "lock:" and
/// "lockq:", the queued waiter still learns of its hand-off from the message.
/// Without the message it would hold the lock only at its next attempt, at
/// least 0.4 s after the attempt that queued it (the refresh interval is 0.4
/// to 0.8 s), and the release follows that attempt within milliseconds: 300 ms
/// tells the two apart.
#[tokio::test]
async fn a_hand_off_under_any_prefix_takes_one_message() {
    let redis = server();
    let with_prefix = async || {
        LockManager::builder(&redis.url())
            .key_prefix("lock:lockq:")
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (with_prefix().await, with_prefix().await);
    let guard = a.lock("prefixed").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        b.lock("prefixed")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .map(|g| (Instant::now(), g))
    });
    await_waiter(&a, "prefixed").await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let (held_at, handed) = waiter.await.unwrap().unwrap();
    let took = held_at - released;
    assert!(took < Duration::from_millis(300), "hand-off took {took:?}");
    handed.release().await.unwrap();
}

/// With a lease shorter than a waiter's refresh interval (0.4 to 0.8 s), a
/// hand-off usually comes longer than the lease after the waiter's last
/// attempt, the moment from which the new holder can count its lease: such a
/// hand-off is confirmed by an attempt rather than granted with a lease
/// already run out. Four rounds, each handed off at a different point of the
/// waiter's refresh cycle; every new holder must start with most of its lease.
#[tokio::test]
async fn a_short_lease_handed_off_long_after_the_last_attempt_is_not_lost() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    // The waiter's lease is the subject: shorter than its 0.4-0.8 s refresh
    // cycle. The holder's is 900 ms (renewed every 300 ms), not the same
    // 300: it must last until its release, 0.9-1.4 s in, and a renewal
    // 200 ms late loses a 300 ms one; 900 ms takes one 600 ms late.
    let lease = Duration::from_millis(300);
    let holder_lease = RENEWED_LEASE;
    for round in 0..4u64 {
        let key = format!("short:{round}");
        let held = a.lock(&key).lease(holder_lease).acquire().await.unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let g = b
                    .lock(&key)
                    .lease(lease)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .unwrap();
                let remaining = g.remaining_lease();
                let lost = g.is_lost();
                g.release().await.unwrap();
                (remaining, lost)
            })
        };
        // Past at least one refresh of the waiter, at a different phase of
        // its cycle each round; the holder's lease is renewed meanwhile.
        tokio::time::sleep(Duration::from_millis(900 + 170 * round)).await;
        held.release().await.unwrap();
        let (remaining, lost) = waiter.await.unwrap();
        assert!(!lost, "round {round}: the new holder was lost at once");
        assert!(
            remaining > lease / 2,
            "round {round}: the new holder started with {remaining:?} of a {lease:?} lease"
        );
    }
}

/// A hand-off whose message is lost (made here by hand: the lock written in
/// the head's name, its entry removed, nothing published) reaches the waiter
/// at its next attempt, which finds the lock already its own.
#[tokio::test]
async fn a_lost_handoff_message_is_made_up_for_by_the_next_attempt() {
    let redis = server();
    let holder = manager(&redis).await;
    let waiter_manager = manager(&redis).await;
    let mut conns = vec![raw(&redis).await];
    let guard = holder
        .lock("lost-msg")
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        waiter_manager
            .lock("lost-msg")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap()
    });
    wait_for_queue(&mut conns, "lost-msg", 1).await;
    let lock = fair_name(&mut conns[0], "lock", "lost-msg").await.unwrap();
    let queue = lock.replacen("distlock:lock:", "distlock:lockq:", 1);
    let entries = lock.replacen("distlock:lock:", "distlock:lockqe:", 1);
    let head: Vec<String> = redis::cmd("ZRANGE")
        .arg(&queue)
        .arg(0)
        .arg(0)
        .query_async(&mut conns[0])
        .await
        .unwrap();
    let token = guard.fencing_token().await.unwrap() + 1;
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(&lock)
        .arg(format!("{}-{token}:0:handed off by hand", head[0]))
        .arg("PX")
        .arg(3000)
        .cmd("DEL")
        .arg(&queue)
        .arg(&entries)
        .query_async(&mut conns[0])
        .await
        .unwrap();
    std::mem::forget(guard);
    let got = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the next attempt comes within the hand-off's TTL")
        .unwrap();
    assert_eq!(got.fencing_token().await.unwrap(), token);
    assert!(!got.is_lost());
    got.release().await.unwrap();
    assert_eq!(fair_name(&mut conns[0], "lock", "lost-msg").await, None);
}

/// On Redlock the default lock's waiters do not queue (a queue on each
/// independent member could hand the lock to different waiters): a release
/// wakes a waiter, which takes the lock by a majority; no queue key is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redlock_waiters_do_not_queue() {
    let servers: Vec<_> = (0..3).map(|_| server()).collect();
    let m = || async {
        LockManager::redlock_builder(servers.iter().map(|s| s.url()))
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (m().await, m().await);
    let held = a.lock("k").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = b
            .lock("k")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
    });
    // The waiter has marked the lock on a majority: its attempt ran.
    let mut conns = Vec::new();
    for s in &servers {
        conns.push(raw(s).await);
    }
    let marked = eventually(Duration::from_secs(5), async || {
        let mut n = 0;
        for conn in conns.iter_mut() {
            let name = fair_name(conn, "lock", "k").await;
            if let Some(name) = name {
                let v: Option<String> = redis::cmd("GET")
                    .arg(&name)
                    .query_async(conn)
                    .await
                    .unwrap();
                if v.is_some_and(|v| v.as_bytes().get(32) == Some(&b'+')) {
                    n += 1;
                }
            }
        }
        n >= 2
    })
    .await;
    assert!(marked.is_some(), "the waiter never marked the lock");
    held.release().await.unwrap();
    waiter.await.unwrap();
    for conn in conns.iter_mut() {
        assert_eq!(fair_name(conn, "lockq", "k").await, None);
        assert_eq!(fair_name(conn, "lockqe", "k").await, None);
    }
}

#[tokio::test]
async fn arrival_order_holds_on_a_cluster() {
    let cluster = RedisCluster::process_wide().expect("cluster");
    let mut ms = Vec::new();
    for _ in 0..4 {
        ms.push(
            LockManager::cluster_builder(cluster.urls())
                .build()
                .await
                .unwrap(),
        );
    }
    let mut conns = Vec::new();
    for url in cluster.urls() {
        conns.push(
            redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        );
    }
    let key = format!("fair-cluster:{}", std::process::id());
    let guard = ms[0].lock(&key).acquire().await.unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_waiters(&ms, &mut conns, &key, 6, &served).await;
    guard.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), (0..6).collect::<Vec<_>>());
}

#[distributed_lock(key = "macro:{id}", wait = "10s", manager = m, guard = held)]
async fn queued_body(m: &LockManager, id: u64) -> Result<u64, LockError> {
    let _: &LockGuard = held;
    // Inside the body the key is held by this call chain: re-entered.
    let inner = m.lock(format!("macro:{id}")).try_acquire().await?;
    inner.expect("re-entered").release().await?;
    Ok(held.fencing_token().await.unwrap())
}

#[tokio::test]
async fn the_macro_waits_in_the_queue() {
    let redis = server();
    let m = manager(&redis).await;
    let mut conns = vec![raw(&redis).await];
    let outer = m.lock("macro:7").acquire().await.unwrap();
    let task = {
        let m = manager(&redis).await;
        tokio::spawn(async move { queued_body(&m, 7).await.unwrap() })
    };
    // The macro's call waits in the lock's queue.
    wait_for_queue(&mut conns, "macro:7", 1).await;
    let token = outer.fencing_token().await.unwrap();
    outer.release().await.unwrap();
    assert_eq!(task.await.unwrap(), token + 1);
}

/// Uncontended, the default lock costs no more for its queue: `SET NX PX`,
/// then one release script (`GET`, `DEL`), no publish, no subscription: 4
/// commands a cycle, counted here for 100 cycles. (The manager's one
/// subscription, its hand-off channel, made in the background of its first
/// acquisition, is in place before the count.)
#[tokio::test]
async fn an_uncontended_cycle_is_four_commands() {
    let redis = distlock::testing::RedisServer::spawn().unwrap();
    let m = LockManager::connect(&redis.url()).await.unwrap();
    let mut raw = redis.client().await.unwrap();
    // Load the scripts first: a first call meets NOSCRIPT.
    let warm_up = m.lock("u").acquire().await.unwrap();
    await_holder_listening(&mut raw, &m, "u").await;
    warm_up.release().await.unwrap();
    reset_stats(&mut raw).await;
    for _ in 0..100 {
        m.lock("u")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let calls = command_calls(&mut raw).await;
    assert_eq!(calls.get("evalsha"), Some(&100), "{calls:#?}");
    assert_eq!(calls.get("publish"), None, "{calls:#?}");
    let per_cycle = calls.values().sum::<u64>() / 100;
    assert_eq!(per_cycle, 4, "{calls:#?}");
    assert_eq!(
        calls.get("subscribe"),
        None,
        "a free lock needs no subscription"
    );
}

/// The one window in which a newcomer can overtake the queue, as the docs of
/// `LockManager::lock` state it: a holder whose lease ran out (here: no
/// renewal, 500 ms) leaves the lock free; a newcomer polling with `SET NX`
/// may take it only from that expiry until the queue's head attempts again,
/// which it does when the lease its last attempt saw runs out (and at the
/// latest one refresh, 0.8 s, later). So the head holds the lock within
/// expiry + 0.8 s (+ 200 ms for round trips on a loaded machine), and no
/// newcomer ever held it before the expiry or after the head got it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overtaking_window_on_expiry_is_bounded_by_the_heads_next_attempt() {
    let redis = server();
    let (a, b, c) = (
        manager(&redis).await,
        manager(&redis).await,
        manager(&redis).await,
    );
    let mut conns = vec![raw(&redis).await];
    let lease = Duration::from_millis(500);
    let sent = Instant::now();
    let holder = a
        .lock("window")
        .lease(lease)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let replied = Instant::now();
    let (earliest_expiry, latest_expiry) = (sent + lease, replied + lease);
    // The head keeps the lock until the newcomer has stopped trying, so any
    // newcomer success after the head's would be an overlap.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let head = tokio::spawn(async move {
        let g = b
            .lock("window")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let at = Instant::now();
        let _ = done_rx.await;
        g.release().await.unwrap();
        at
    });
    wait_for_queue(&mut conns, "window", 1).await;
    let newcomer = tokio::spawn(async move {
        let mut held = Vec::new();
        let stop = latest_expiry + Duration::from_millis(1500);
        while Instant::now() < stop {
            let tried = Instant::now();
            if let Some(g) = c.lock("window").try_acquire().await.unwrap() {
                held.push((tried, Instant::now()));
                g.release().await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        held
    });
    let overtakes = newcomer.await.unwrap();
    let _ = done_tx.send(());
    let head_at = head.await.unwrap();
    drop(holder);
    assert!(
        head_at <= latest_expiry + Duration::from_millis(800 + 200),
        "the head got the lock {:?} after the holder's lease ran out",
        head_at.saturating_duration_since(latest_expiry)
    );
    for (tried, got) in &overtakes {
        assert!(
            *got >= earliest_expiry,
            "a newcomer held the lock before the holder's lease ran out"
        );
        assert!(
            *tried <= head_at,
            "a newcomer took the lock after the head had it ({:?} later)",
            tried.saturating_duration_since(head_at)
        );
    }
    eprintln!(
        "head got the lock {:?} after the expiry; {} overtakes",
        head_at.saturating_duration_since(latest_expiry),
        overtakes.len()
    );
}

/// 16 tasks over 2 managers loop acquire / empty body / release on one key
/// (the benchmark's hand-off loop): every task gets its turns, nothing hangs.
/// Each cycle is a hand-off of a few round trips; 16 x 30 cycles finish in
/// well under the 60 s bound even on a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_passed_around_by_sixteen_tasks_never_stalls() {
    let redis = server();
    let managers = [manager(&redis).await, manager(&redis).await];
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let m = managers[t % 2].clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..30 {
                let g = m
                    .lock("hot")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                g.release().await.unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert!(
        all.is_ok(),
        "stalled after {} of 480 cycles",
        done.load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// The first waiter that queues for a free hold tells the holder's manager so
/// (`!<owner>` on the holder's hand-off channel, published by the queue-up
/// script), on one server and on a cluster, where the script runs on the
/// lock's master and the holder's manager may listen on another node: each
/// notice arrives before the release, and each release hands the lock over.
/// (What the holder then sends is counted in
/// `tests/round_trips.rs::a_hold_told_of_its_first_waiter_releases_by_the_full_script_at_once`.)
/// On PostgreSQL, whose one release function hands over whenever someone
/// queued, no notice is sent (a NOTIFY wakes every listening session), and
/// each release hands the lock over all the same.
async fn a_holder_hears_of_its_first_waiter(d: Deployment) {
    let holder = d.manager().await;
    let waiter = d.manager().await;
    wait_once(&holder, &waiter, "first-wait").await;
    let before = holder.waited_for_notices_heard();
    let notices = u64::from(!d.is_postgres());

    // Five keys: on a cluster they fall on different masters.
    for i in 0..5u64 {
        let key = format!("told:{i}");
        let g = holder.lock(&key).acquire().await.unwrap();
        let waiting = spawn_waiter(&waiter, &key);
        await_waiter(&holder, &key).await;
        eventually(Duration::from_secs(5), async || {
            holder.waited_for_notices_heard() == before + (i + 1) * notices
        })
        .await
        .unwrap_or_else(|| panic!("the holder of {key} heard of its waiter"));
        g.release().await.unwrap();
        let handed = waiting.await.unwrap().unwrap();
        handed.release().await.unwrap();
    }
    // Holds nobody queued for send no notice.
    for i in 0..5 {
        let g = holder.lock(format!("free:{i}")).acquire().await.unwrap();
        g.release().await.unwrap();
    }
    assert_eq!(holder.waited_for_notices_heard(), before + 5 * notices);
}

/// Six waiters of three managers, each queued before the next starts, are
/// served in arrival order, each by a hand-off to its manager: the order is
/// read from the public API (`inspect_all`'s waiters) on every store.
async fn waiters_of_three_managers_are_served_in_arrival_order(d: Deployment) {
    let managers = [d.manager().await, d.manager().await, d.manager().await];
    // Every manager listens before the count starts (see await_listening).
    for (i, m) in managers.iter().enumerate() {
        common::await_listening(m, &managers[(i + 1) % 3], "arrival-warm-up").await;
    }
    // A queued waiter also refreshes its entry every 0.4-0.8 s; a refresh in
    // flight when the lock is handed to it finds the lock its own and takes
    // it, and the hand-off message heard after that names a waiter that has
    // gone, so it is not counted (a round has a few percent chance of that).
    // So a round may fall one short, but with hand-offs not pushed every
    // round falls six short: up to three rounds, one of which must hear
    // every hand-off.
    let mut heard = Vec::new();
    for round in 0..3 {
        let key = format!("arrival:{round}");
        let delivered = arrival_order_chain(&managers, &key).await;
        heard.push(delivered);
        let state = managers[1].inspect_all(&key).await.unwrap();
        assert!(
            state.holds.is_empty() && state.waiters.is_empty(),
            "{state:?}"
        );
        if delivered >= 6 {
            break;
        }
    }
    assert!(
        heard.iter().any(|&delivered| delivered >= 6),
        "hand-offs heard for 6 grants, per round: {heard:?}"
    );
}

/// A holder of `managers[0]` and six waiters queued in turn on the three
/// managers, each queued before the next starts: asserts they are served in
/// arrival order after the holder's release, and returns how many hand-off
/// messages the managers heard meanwhile.
async fn arrival_order_chain(managers: &[LockManager; 3], key: &str) -> u64 {
    let holder = managers[0].lock(key).acquire().await.unwrap();
    let served = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6usize {
        let m = managers[i % 3].clone();
        let served = served.clone();
        let task_key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            let guard = m
                .lock(task_key)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            served.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        let queued = eventually(Duration::from_secs(10), async || {
            managers[0].inspect_all(key).await.unwrap().waiters.len() == i + 1
        })
        .await;
        assert!(queued.is_some(), "waiter {i} never queued");
    }
    let delivered_before: u64 = managers.iter().map(|m| m.wake_ups_delivered()).sum();
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
    let delivered: u64 = managers.iter().map(|m| m.wake_ups_delivered()).sum();
    delivered - delivered_before
}

on_stores!(
    a_holder_hears_of_its_first_waiter,
    waiters_of_three_managers_are_served_in_arrival_order
);
