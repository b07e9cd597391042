//! `LockManager::shutdown`: every held lock released and confirmed, waiters woken
//! with an error, guards lost, new acquisitions refused.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::LockError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_every_lock_and_wakes_waiters() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let keys: Vec<String> = (0..100).map(|i| format!("order:{i}")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            a.lock(key.as_str())
                .lease(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap(),
        );
    }
    // A waiter of the same manager, on a lock held elsewhere.
    let elsewhere = b.lock("busy").acquire().await.unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.lock("busy").wait(Duration::from_secs(30)).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let started = Instant::now();
    a.shutdown().await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "{took:?}");

    // Confirmed by Redis before shutdown returned: the keys are gone already.
    for key in &keys {
        assert!(!exists(&mut raw, &a.redis_names(key).lock).await, "{key}");
    }
    // So another manager takes each at once (one attempt, no waiting).
    for key in &keys {
        let g = b.lock(key.as_str()).try_acquire().await.unwrap();
        assert!(g.is_some(), "{key} was still held");
    }
    // The guards report their leases lost, and so does their release.
    assert!(guards.iter().all(|g| g.is_lost()));
    tokio::time::timeout(Duration::from_millis(100), guards[0].lost())
        .await
        .expect("lost() completes");
    for g in guards.drain(..10) {
        assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
    }
    drop(guards);
    // The waiter was woken with an error, promptly.
    let woken = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter is woken")
        .unwrap();
    assert!(
        matches!(woken, Err(LockError::ShutDown { ref key }) if key == "busy"),
        "{woken:?}"
    );
    // New acquisitions are refused; a second shutdown is a no-op.
    assert!(matches!(
        a.lock("new").acquire().await,
        Err(LockError::ShutDown { .. })
    ));
    a.shutdown().await.unwrap();
    assert_eq!(a.held_count(), 0);
    // The other manager is unaffected.
    elsewhere.release().await.unwrap();
}

/// A manager that reaches `redis` through a fault proxy, with a command
/// timeout (3 s) longer than the delays the tests put on the proxy.
async fn behind_a_proxy(
    redis: &distlock::testing::RedisServer,
) -> (distlock::testing::FaultProxy, distlock::LockManager) {
    let proxy = distlock::testing::FaultProxy::start(redis.addr())
        .await
        .unwrap();
    let m = distlock::LockManager::builder(&proxy.url())
        .command_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    (proxy, m)
}

/// A second `shutdown()`, while the first still releases, returns once the
/// first is done, not at once: a program whose signal handler shuts the
/// manager down and whose `main` shuts it down again before returning would
/// otherwise exit in the middle of the releases. The manager reaches its
/// server through a proxy that holds each chunk 150 ms, so that the first
/// call's releases take a few hundred ms (within its 3 s command timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_shutdown_returns_once_the_first_is_done() {
    let redis = server();
    let (proxy, m) = behind_a_proxy(&redis).await;
    let _held = m.lock("shut-twice").acquire().await.unwrap();
    proxy.set_mode(distlock::testing::FaultMode::Delay(Duration::from_millis(
        150,
    )));
    let first = tokio::spawn({
        let m = m.clone();
        async move { m.shutdown().await }
    });
    eventually(Duration::from_secs(5), async || !m.is_running())
        .await
        .expect("the first shutdown began");
    m.shutdown().await.unwrap();
    let mut raw = raw(&redis).await;
    assert!(
        !exists(&mut raw, &m.redis_names("shut-twice").lock).await,
        "the second shutdown returned before the first had released"
    );
    first.await.unwrap().unwrap();
}

/// A shutdown cut short (its caller's timeout drops it while Redis does not
/// answer) leaves no lock to its lease: the batches not sent, and the one
/// whose reply never came, are released in the background once Redis
/// answers again. 600 locks make two batches (of 512 and 88); the proxy
/// discards every byte while the shutdown runs (a partition: what it
/// discarded stays lost), so the first batch never reaches Redis and the
/// second is never sent. Before, all 600 locks stayed held for their whole
/// lease (10 s): nothing renewed them and nothing released them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_cut_short_releases_the_rest_in_the_background() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let proxy = distlock::testing::FaultProxy::start(redis.addr())
        .await
        .unwrap();
    let m = manager_at(&proxy.url()).await;
    let keys: Vec<String> = (0..600).map(|i| format!("cut-short:{i}")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            m.lock(key.as_str())
                .lease(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap(),
        );
    }
    proxy.set_mode(distlock::testing::FaultMode::BlackHole);
    let cut = tokio::time::timeout(Duration::from_millis(300), m.shutdown()).await;
    proxy.set_mode(distlock::testing::FaultMode::Pass);
    let healed_at = Instant::now();
    assert!(cut.is_err(), "the shutdown finished through a black hole");
    assert!(!m.is_running());
    // The background releases sent into the black hole time out (500 ms,
    // which retires the connection); their retries, 5 ms on and doubling,
    // go through a fresh one. Within 5 s every lock is free, while their
    // leases (renewed last at most a third of the lease before) had more
    // than 6 s left.
    let names: Vec<String> = keys.iter().map(|k| m.redis_names(k).lock).collect();
    let held = async |raw: &mut redis::aio::MultiplexedConnection| -> i64 {
        redis::cmd("EXISTS")
            .arg(&names)
            .query_async(raw)
            .await
            .unwrap()
    };
    let freed = eventually(Duration::from_secs(5), async || held(&mut raw).await == 0).await;
    assert!(
        freed.is_some(),
        "{} locks still held {:?} after the partition healed",
        held(&mut raw).await,
        healed_at.elapsed()
    );
    assert!(guards.iter().all(|g| g.is_lost()));
}

/// A weighted semaphore hold renamed (`release_permits`) while the manager
/// shuts down: the shutdown does not see the hold (it is out of the renewal
/// task while the rename runs), so the call releases it and its guard reports
/// the hold lost, as every hold is after a shutdown. Before, the guard's
/// lease was marked released, not lost: `is_lost()` said false and `lost()`
/// never completed, for a hold that was gone. The proxy holds each chunk
/// 200 ms, so that the rename is in flight when the shutdown starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_hold_renamed_during_a_shutdown_is_reported_lost() {
    let redis = server();
    let (proxy, m) = behind_a_proxy(&redis).await;
    let mut slots = m
        .semaphore("renamed-at-shutdown", 4)
        .weight(3)
        .acquire()
        .await
        .unwrap();
    proxy.set_mode(distlock::testing::FaultMode::Delay(Duration::from_millis(
        200,
    )));
    let (renamed, shut) = tokio::join!(slots.release_permits(1), async {
        // The rename is sent first (this future is polled second).
        m.shutdown().await
    });
    assert!(
        matches!(renamed, Err(LockError::ShutDown { .. })),
        "{renamed:?}"
    );
    shut.unwrap();
    assert!(
        slots.is_lost(),
        "the guard of a hold the shutdown took is lost"
    );
    tokio::time::timeout(Duration::from_millis(100), slots.lost())
        .await
        .expect("lost() completes");
    proxy.set_mode(distlock::testing::FaultMode::Pass);
    let mut raw = raw(&redis).await;
    let names = m.redis_names("renamed-at-shutdown");
    eventually(Duration::from_secs(5), async || {
        !exists(&mut raw, &names.lock).await
    })
    .await
    .expect("the renamed hold is released");
}
