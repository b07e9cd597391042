//! Waiting: pub/sub wake-ups through one subscriber, backoff as the fallback,
//! and the timeout bounds.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::testing::{FaultMode, FaultProxy};
use distlock::LockError;

/// A waiter is woken by the release, not by polling: while the holder keeps the
/// lock for a long time, the waiter makes few attempts, and it gets the lock
/// right after the release.
#[tokio::test]
async fn release_wakes_a_waiter_without_polling() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let holder = a.lock("k").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = b
            .lock("k")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap();
        (Instant::now(), g)
    });
    // Wait until the waiter's subscription is in place.
    let channel = a.redis_names("k").channel().to_owned();
    eventually(Duration::from_secs(5), async || {
        numsub(&mut raw, &channel).await == 1
    })
    .await
    .expect("waiter subscribed");
    let before: i64 = script_calls(&mut raw).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = script_calls(&mut raw).await - before;
    // Full-jitter backoff capped at 1 s: a handful of attempts in 1.5 s, not
    // the 150 of a 10 ms poll.
    assert!(during <= 12, "{during} attempts while the lock was held");
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (acquired_at, _g) = waiter.await.unwrap();
    let handoff = acquired_at - released_at;
    // Generous bound: the wake-up makes it a few round trips, the fallback
    // backoff alone could take up to 1 s.
    assert!(
        handoff < Duration::from_millis(500),
        "hand-off took {handoff:?}"
    );
}

async fn script_calls(raw: &mut redis::aio::MultiplexedConnection) -> i64 {
    calls_of(raw, "evalsha").await as i64
}

/// Many waiters in one manager share one subscriber connection.
#[tokio::test]
async fn one_subscriber_connection_per_manager() {
    // The default lock's queued waiters of a manager share one hand-off channel.
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let holder = a.lock("k0").acquire().await.unwrap();
    let mut others = Vec::new();
    for i in 1..5 {
        others.push(a.lock(format!("k{i}")).acquire().await.unwrap());
    }
    let mut waiters = Vec::new();
    for i in 0..20 {
        let b = b.clone();
        waiters.push(tokio::spawn(async move {
            let g = b
                .lock(format!("k{}", i % 5))
                .wait(Duration::from_secs(20))
                .acquire()
                .await?;
            g.release().await
        }));
    }
    eventually(Duration::from_secs(5), async || {
        let n: i64 = redis::cmd("PUBSUB")
            .arg("NUMPAT")
            .query_async::<i64>(&mut raw)
            .await
            .unwrap();
        let channels = pubsub_channels(&mut raw).await;
        n == 0
            && channels.len() == 2
            && channels.iter().all(|c| c.starts_with("distlock:handoff:"))
    })
    .await
    .expect("each manager's one hand-off channel subscribed: the waiters' for all 5 keys, the holders' for the notices of its waiters");
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut raw)
        .await
        .unwrap();
    let subscribers = clients.lines().filter(|l| !l.contains(" sub=0 ")).count();
    assert_eq!(subscribers, 2, "{clients}");
    drop(holder);
    drop(others);
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    // The hand-off channel stays subscribed after the last waiter: the next
    // wait of this manager, on any key, subscribes to nothing.
    let before = pubsub_channels(&mut raw).await;
    assert_eq!(before.len(), 2, "{before:?}");
    let held = a.lock("k9").acquire().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("k9").acquire().await?.release().await })
    };
    let queue = a.redis_names("k9").lock.replacen(":lock:", ":lockq:", 1);
    let queued = eventually(Duration::from_secs(5), async || {
        let n: i64 = redis::cmd("ZCARD")
            .arg(&queue)
            .query_async(&mut raw)
            .await
            .unwrap();
        n == 1
    })
    .await;
    assert!(queued.is_some(), "the waiter never queued");
    assert_eq!(pubsub_channels(&mut raw).await, before);
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
}

/// A holder that vanishes without releasing publishes nothing: the waiter's
/// backoff, capped by the remaining lease, takes the lock soon after it expires.
#[tokio::test]
async fn an_expired_lock_is_taken_without_a_wake_up() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    // 1 s: the grant's reply must come within the lease, or the acquire
    // answers `Lost`; 400 ms leaves a loaded machine too little room.
    let lease = Duration::from_millis(1000);
    // Taken before the acquire: the lease starts in Redis after this,
    // however late the reply comes.
    let start = Instant::now();
    let g = a
        .lock("k")
        .lease(lease)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(g); // no release, no publish
    let got = b
        .lock("k")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let took = start.elapsed();
    // Not before the lease ended, less 20 ms: Redis's clock and ours tick
    // apart. Within 1 s after it on a loaded machine, where a waiter left to
    // its 10 s wait would fail.
    assert!(took >= lease - Duration::from_millis(20), "took {took:?}");
    assert!(took < lease + Duration::from_secs(1), "took {took:?}");
    got.release().await.unwrap();
}

/// The subscriber connection dies while a waiter waits: the waiter still gets the
/// lock after the release (backoff covers the gap), and the subscriber reconnects
/// and subscribes again.
#[tokio::test]
async fn a_killed_subscriber_reconnects_and_waiters_still_get_the_lock() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let channel = a.redis_names("k").channel().to_owned();
    let holder = a.lock("k").acquire().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("k").wait(Duration::from_secs(20)).acquire().await })
    };
    eventually(Duration::from_secs(5), async || {
        numsub(&mut raw, &channel).await == 1
    })
    .await
    .expect("subscribed");
    // The waiter's manager's and the holder's (which listens for the notices
    // of its waiters, subscribing in the background).
    await_holder_listening(&mut raw, &a, "k").await;
    let killed = kill_subscribers(&mut raw).await;
    assert_eq!(killed, 2);
    eventually(Duration::from_secs(5), async || {
        numsub(&mut raw, &channel).await == 1
    })
    .await
    .expect("re-subscribed after the connection was killed");
    holder.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("waiter got the lock")
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
}

/// When leases run out without a release (here `renew(false)`, never released),
/// nobody publishes; the lock still goes to this manager's waiters in the order
/// they arrived, because only the first in line retries on its timer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_keep_their_order_when_leases_run_out() {
    const WAITERS: usize = 8;
    let redis = server();
    let holder = manager(&redis).await;
    let waiters = manager(&redis).await;
    let lease = Duration::from_secs(1);
    let first = holder
        .lock("k")
        .lease(lease)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(first); // never released: the lease runs out
    let mut raw = raw(&redis).await;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let m = waiters.clone();
        let served = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = m
                .lock("k")
                .lease(lease)
                .renew(false)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            served.lock().unwrap().push(i);
            std::mem::forget(g);
        }));
        // Arrival order is queue order: each queued before the next starts.
        await_in_line(&mut raw, "k", i + 1, &order).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>());
}

/// Five waiters of one manager (one woken per message) get the lock one after
/// the other, each by the previous holder's wake-up, not by their fallback:
/// a queued waiter's next attempt, which comes every 0.4-0.8 s.
#[tokio::test]
async fn a_chain_of_hand_offs_is_woken_by_publishes() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let holder = a.lock("k").acquire().await.unwrap();
    let handoffs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for _ in 0..5 {
        let (b, handoffs) = (b.clone(), handoffs.clone());
        waiters.push(tokio::spawn(async move {
            let g = b
                .lock("k")
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            handoffs.lock().unwrap().push(Instant::now());
            tokio::time::sleep(Duration::from_millis(200)).await;
            let released = Instant::now();
            g.release().await.unwrap();
            released
        }));
    }
    let channel = a.redis_names("k").channel().to_owned();
    eventually(Duration::from_secs(5), async || {
        numsub(&mut raw, &channel).await == 1
    })
    .await
    .expect("waiters subscribed");
    // Long enough for every waiter to be queued and attempting on its
    // 0.4-0.8 s cycle.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let publishes_before = publish_calls(&mut raw).await;
    let first_release = Instant::now();
    holder.release().await.unwrap();
    let mut releases = vec![first_release];
    for w in waiters {
        releases.push(w.await.unwrap());
    }
    releases.sort();
    let mut acquired = handoffs.lock().unwrap().clone();
    acquired.sort();
    // A pushed hand-off takes a millisecond or so, and more only on a loaded
    // machine. Without the push, each would wait for the next waiter's next
    // attempt: a queued waiter attempts every 0.4-0.8 s, so the wait is
    // under X ms with probability X / 600 (X up to 400). 250 ms leaves a
    // late wake-up 250 ms, and five such waits would all come under it with
    // probability (250 / 600)^5, about 1.3% (three under 150 ms: 1.6%).
    for (released, taken) in releases.iter().zip(&acquired) {
        let handoff = *taken - *released;
        assert!(
            handoff < Duration::from_millis(250),
            "hand-off took {handoff:?}"
        );
    }
    // One publish per hand-off (five); the last release, which nobody
    // waited for, publishes nothing.
    assert_eq!(publish_calls(&mut raw).await - publishes_before, 5);
}

/// Waits (up to 10 s) until `waiters` acquisitions of the default lock `key`
/// are queued on `raw`'s server or among those already `served`.
async fn await_in_line(
    raw: &mut redis::aio::MultiplexedConnection,
    key: &str,
    waiters: usize,
    served: &std::sync::Mutex<Vec<usize>>,
) {
    let queued = eventually(Duration::from_secs(10), async || {
        let queued: usize = match name_of(raw, "lockq", key).await {
            Some(queue) => redis::cmd("ZCARD")
                .arg(queue)
                .query_async(raw)
                .await
                .expect("ZCARD"),
            None => 0,
        };
        queued + served.lock().unwrap().len() >= waiters
    })
    .await;
    assert!(queued.is_some(), "{waiters} waiters never queued for {key}");
}

async fn publish_calls(raw: &mut redis::aio::MultiplexedConnection) -> i64 {
    calls_of(raw, "publish").await as i64
}

/// A waiter keeps its place in its manager's line when the attempt a wake-up
/// gave it finds the lock taken (here by a wake-up published while the lock is
/// still held, as when another manager's waiter took the lock first): the next
/// release goes to it again, not to a waiter that arrived after it. With one
/// shared wake-up per channel, the woken waiter listened again behind the later
/// arrivals, and they were served first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_loses_a_wake_up_keeps_its_place() {
    const WAITERS: usize = 3;
    let redis = server();
    let holder_manager = manager(&redis).await;
    let waiters = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let holder = holder_manager.lock("k").acquire().await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (m, served) = (waiters.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = m
                .lock("k")
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            served.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        // Arrival order is queue order: each queued before the next starts.
        await_in_line(&mut raw, "k", i + 1, &order).await;
    }
    let channel = holder_manager.redis_names("k").channel().to_owned();
    eventually(Duration::from_secs(5), async || {
        numsub(&mut raw, &channel).await == 1
    })
    .await
    .expect("waiters subscribed");
    // The first waiter's timer retries have backed off to their 1 s cap, so
    // they are unlikely to decide who gets the lock.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..2 {
        let attempts = script_calls(&mut raw).await;
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&channel)
            .arg("taken-by-another-manager")
            .query_async(&mut raw)
            .await
            .unwrap();
        eventually(Duration::from_secs(5), async || {
            script_calls(&mut raw).await > attempts
        })
        .await
        .expect("the woken waiter attempts");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>());
}

/// A queued waiter that timed out is out of the queue when `acquire` returns:
/// the holder's release right after frees the lock rather than handing it to
/// the waiter that left (whose withdrawal would give it back later, a lock
/// held by nobody meanwhile). The waiter's traffic is delayed by a proxy, so a
/// withdrawal left to the background would reach Redis after the release.
#[tokio::test]
async fn a_timed_out_waiter_has_left_the_queue_when_acquire_returns() {
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let a = manager(&redis).await;
    let b = manager_at(&proxy.url()).await;
    let mut raw = raw(&redis).await;
    let name = a.redis_names("k").lock;
    let held = a.lock("k").acquire().await.unwrap();
    // 30 ms each way: b's plain attempt and its queuing attempt take 60 ms
    // each, so the second one (which queues b) ends past b's 100 ms wait.
    proxy.set_mode(FaultMode::Delay(Duration::from_millis(30)));
    let err = b
        .lock("k")
        .wait(Duration::from_millis(100))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    held.release().await.unwrap();
    assert!(
        !exists(&mut raw, &name).await,
        "the release handed the lock to the waiter that had left"
    );
}

// The same waiting contract on every store (`on_stores!`), through the
// public API only.

async fn wait_zero_and_timeouts_on_every_store(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let _g = a.lock("timeouts").acquire().await.unwrap();
    let start = Instant::now();
    match b.lock("timeouts").wait(Duration::ZERO).acquire().await {
        Err(LockError::Timeout { key, waited }) => {
            assert_eq!(key, "timeouts");
            assert!(waited < Duration::from_millis(300));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_millis(300));
    for wait_ms in [1u64, 40, 250] {
        let wait = Duration::from_millis(wait_ms);
        let start = Instant::now();
        let r = b.lock("timeouts").wait(wait).acquire().await;
        let took = start.elapsed();
        match r {
            Err(LockError::Timeout { waited, .. }) => {
                assert!(waited >= wait, "reported {waited:?} < {wait:?}");
                assert!(took >= wait, "returned after {took:?} < {wait:?}");
                assert!(took < wait + Duration::from_millis(500), "took {took:?}");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
    // No timed-out waiter is left in the queue.
    let left = eventually(Duration::from_secs(2), async || {
        a.inspect_all("timeouts").await.unwrap().waiters.is_empty()
    })
    .await;
    assert!(left.is_some(), "a timed-out waiter stayed queued");
}

/// A waiter queued behind a long hold gets the lock right after the release
/// (a message, not its backoff, which has grown to its 1 s cap by then).
async fn a_release_hands_the_lock_to_the_waiter_at_once(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let holder = a.lock("wake").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = b
            .lock("wake")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap();
        (Instant::now(), g)
    });
    await_waiter(&a, "wake").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let released_at = Instant::now();
    holder.release().await.unwrap();
    let (acquired_at, g) = waiter.await.unwrap();
    let handoff = acquired_at - released_at;
    // A hand-off is one message after the release; the fallback backoff
    // alone could take up to 1 s. 500 ms leaves room for a slow machine.
    assert!(
        handoff < Duration::from_millis(500),
        "hand-off took {handoff:?}"
    );
    g.release().await.unwrap();
}

/// A task that releases and at once asks again queues behind the
/// acquisitions already waiting.
async fn a_releasing_task_does_not_jump_the_queue_on_any_store(d: Deployment) {
    const TASKS: usize = 4;
    const ROUNDS: usize = 20;
    let m = d.manager().await;
    let holders = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for id in 0..TASKS {
        let (m, holders) = (m.clone(), holders.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let g = m
                    .lock("no-jump")
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                holders.lock().unwrap().push(id);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = holders.lock().unwrap().clone();
    // Only the last rounds can repeat a holder legitimately (no one else left).
    let regrabs = order[..order.len() - ROUNDS]
        .windows(2)
        .filter(|w| w[0] == w[1])
        .count();
    assert!(
        regrabs * 10 < order.len(),
        "{regrabs} of {} acquisitions went back to the task that had just released",
        order.len()
    );
}

on_stores!(
    wait_zero_and_timeouts_on_every_store,
    a_release_hands_the_lock_to_the_waiter_at_once,
    a_releasing_task_does_not_jump_the_queue_on_any_store,
);
