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
    // A 2 s command timeout, so that a lease trusted until its hung renewal
    // gave up would be lost well after the bound below.
    let a = manager_with_timeout(&redis.url(), Duration::from_secs(2)).await;
    let lease = Duration::from_millis(400);
    let sent = Instant::now();
    let g = a.lock("k").lease(lease).acquire().await.unwrap();
    let acquired = Instant::now();
    redis.pause().unwrap();
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost");
    let (at, since_sent) = (acquired.elapsed(), sent.elapsed());
    redis.resume().unwrap();
    // Renewals at ~133 ms and later all failed: lost by 400 - 6 ms after the
    // last successful one (the acquire, or the first renewal just before the
    // pause). 1 s more for a loaded machine's late timer and task wake-up:
    // a lease trusted until its hung renewal gave up would be lost after
    // that renewal's 2 s command timeout, at 133 + 2000 = 2133 ms at the
    // soonest, 733 ms beyond the bound.
    assert!(
        at < lease + Duration::from_secs(1),
        "lost only after {at:?}"
    );
    // Not before the deadline, 394 ms after the acquire was sent (`sent` is
    // earlier), with 20 ms for the timer's rounding.
    assert!(
        since_sent >= lease - Duration::from_millis(6 + 20),
        "lost early: {since_sent:?}"
    );
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
    // 900 ms, renewed every 300 ms: the hold must last until the
    // force-unlock, and on PostgreSQL a grant's reply or renewal 200 ms late
    // loses a 300 ms lease (the body then stops before step 5); 900 ms
    // takes 600 ms.
    let g = a
        .lock("freed")
        .lease(RENEWED_LEASE)
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
    // Renewal runs every 300 ms (lease / 3): the next one finds the lock
    // gone within 30 steps of 10 ms after the force-unlock (step 5), and a
    // slow machine only makes fewer steps. 65 leaves 300 ms for a late
    // renewal and stays under the ~90 steps to the local deadline (891 ms
    // after a renewal just before the force-unlock), which alone would end
    // a hold whose renewal did not notice.
    let n = steps.load(std::sync::atomic::Ordering::SeqCst);
    assert!((5..65).contains(&n), "{n} steps");
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
