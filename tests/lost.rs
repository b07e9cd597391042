//! Lost leases are always signalled, and `release` of a lost guard says so.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::LockError;

async fn lost_within(g: &distlock::LockGuard, limit: Duration) -> Duration {
    let start = Instant::now();
    tokio::time::timeout(limit, g.lost())
        .await
        .expect("lost() completes");
    assert!(g.is_lost());
    assert_eq!(g.remaining_lease(), Duration::ZERO);
    start.elapsed()
}

#[tokio::test]
async fn flushall_del_and_restart_are_noticed_by_renewal() {
    let mut redis = server();
    let a = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let lease = Duration::from_millis(600);

    let g = a.lock("k").lease(lease).acquire().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    lost_within(&g, lease).await;
    assert!(matches!(g.release().await, Err(LockError::Lost { .. })));

    let g = a.lock("k").lease(lease).acquire().await.unwrap();
    del(&mut raw, &a.redis_names("k").lock).await;
    lost_within(&g, lease).await;
    drop(g);

    let g = a.lock("k").lease(lease).acquire().await.unwrap();
    redis.restart().unwrap();
    lost_within(&g, lease).await;
    assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
    // The same manager works again after the restart.
    let g = a.lock("k").acquire().await.unwrap();
    g.release().await.unwrap();
}

/// A holder that cannot reach Redis stops trusting its lease at
/// `last renewal + lease - drift` on its own clock, even while calls hang.
#[tokio::test]
async fn an_unreachable_redis_costs_the_lease_by_the_local_deadline() {
    let redis = server();
    let a = manager(&redis).await;
    let lease = Duration::from_millis(400);
    let g = a.lock("k").lease(lease).acquire().await.unwrap();
    let acquired = Instant::now();
    redis.pause().unwrap();
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost");
    let at = acquired.elapsed();
    redis.resume().unwrap();
    // Renewals at ~133 ms and later all failed: lost by 400 - 6 ms after the
    // last successful one (the acquire, or the first renewal just before the
    // pause). 150 ms more for a loaded machine's late timer and task wake-up:
    // a lease trusted until its hung renewal gave up would be lost after
    // that renewal's 500 ms command timeout, at 133 + 500 = 633 ms at the
    // soonest, beyond the bound.
    assert!(
        at < lease + Duration::from_millis(150),
        "lost only after {at:?}"
    );
    assert!(at >= Duration::from_millis(300), "lost early: {at:?}");
}

#[tokio::test]
async fn scope_until_lost_stops_the_body_at_its_next_await() {
    let redis = server();
    let a = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let g = a
        .lock("k")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let key = a.redis_names("k").lock;
    let steps = std::sync::atomic::AtomicUsize::new(0);
    let r = g
        .scope_until_lost(async {
            loop {
                steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                if steps.load(std::sync::atomic::Ordering::SeqCst) == 5 {
                    del(&mut raw, &key).await;
                }
            }
        })
        .await;
    assert!(matches!(r, Err(LockError::Lost { .. })));
    // Renewal runs every 100 ms; the body stopped within a few steps after that.
    let n = steps.load(std::sync::atomic::Ordering::SeqCst);
    assert!((5..40).contains(&n), "{n} steps");
    let ok = g.scope_until_lost(async { 1 }).await;
    assert!(ok.is_err(), "a lost guard runs nothing more");
}

/// A lock freed under its holder (`force_unlock`) is noticed at the next
/// renewal: `scope_until_lost` stops the body at its next await, on every store.
async fn a_freed_lock_stops_the_body(d: Deployment) {
    let a = d.manager().await;
    let operator = d.manager().await;
    let g = a
        .lock("freed")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let steps = std::sync::atomic::AtomicUsize::new(0);
    let r = g
        .scope_until_lost(async {
            loop {
                steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                if steps.load(std::sync::atomic::Ordering::SeqCst) == 5 {
                    operator.force_unlock("freed").await.unwrap();
                }
            }
        })
        .await;
    assert!(matches!(r, Err(LockError::Lost { .. })));
    // Renewal runs every 100 ms (lease / 3): the body stopped within a few
    // 10 ms steps after it (40 leaves room for a slow machine).
    let n = steps.load(std::sync::atomic::Ordering::SeqCst);
    assert!((5..40).contains(&n), "{n} steps");
    assert!(g.scope_until_lost(async { 1 }).await.is_err());
    assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
}

on_stores!(a_freed_lock_stops_the_body);

/// A grant whose reply came after the lease it started had ended (here a
/// round trip of 300 ms for a lease of 200 ms) is no hold: by then the lock
/// may be another's. The acquisition handed out a guard lost at birth, and a
/// caller that did not look ran its body unprotected.
#[tokio::test]
async fn a_grant_answered_after_its_lease_ended_is_not_handed_out() {
    let redis = server();
    let proxy = distlock::testing::FaultProxy::start(redis.addr())
        .await
        .unwrap();
    let slow = manager_at(&proxy.url()).await;
    // 150 ms each way: the reply comes 300 ms after the attempt went out.
    proxy.set_mode(distlock::testing::FaultMode::Delay(Duration::from_millis(
        150,
    )));
    let taken = slow
        .lock("late")
        .lease(Duration::from_millis(200))
        .acquire()
        .await;
    assert!(
        matches!(taken, Err(LockError::Lost { .. })),
        "{:?}",
        taken.map(|g| g.is_lost())
    );
    // Given back (or expired): another manager takes it within its lease.
    let other = manager(&redis).await;
    let next = other
        .lock("late")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    next.release().await.unwrap();
}
