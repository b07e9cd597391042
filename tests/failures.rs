//! Redis failures are errors, not panics or hangs, and the manager recovers.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::testing::{FaultMode, FaultProxy};
use distlock::LockError;

#[tokio::test]
async fn redis_down_gives_backend_errors_in_bounded_time_then_recovers() {
    let mut redis = server();
    let a = manager(&redis).await; // command timeout 500 ms
    let held = a
        .lock("held")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    redis.kill().unwrap();

    for _ in 0..3 {
        let start = Instant::now();
        let r = a.lock("k").wait(Duration::from_secs(5)).acquire().await;
        assert!(matches!(r, Err(LockError::Backend { .. })), "{r:?}");
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "{:?}",
            start.elapsed()
        );
    }
    let start = Instant::now();
    assert!(matches!(
        held.release().await,
        Err(LockError::Backend { .. })
    ));
    assert!(start.elapsed() < Duration::from_millis(1500));

    redis.start().unwrap();
    let back = eventually(Duration::from_secs(5), async || {
        a.lock("k").try_acquire().await.is_ok()
    })
    .await;
    assert!(back.is_some(), "the same manager works again");
    let g = a.lock("k2").acquire().await.unwrap();
    g.release().await.unwrap();
}

#[tokio::test]
async fn connecting_to_nothing_fails_fast() {
    let start = Instant::now();
    let r = distlock::LockManager::builder("redis://127.0.0.1:1")
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await;
    assert!(matches!(r, Err(LockError::Connect { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

/// A stalled Redis (SIGSTOP) makes calls fail within the command timeout, and all
/// works after SIGCONT.
#[tokio::test]
async fn a_stalled_redis_times_out_calls() {
    let redis = server();
    let a = manager(&redis).await;
    redis.pause().unwrap();
    let start = Instant::now();
    let r = a.lock("k").acquire().await;
    let took = start.elapsed();
    redis.resume().unwrap();
    assert!(matches!(r, Err(LockError::Backend { .. })), "{r:?}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    let back = eventually(Duration::from_secs(5), async || {
        a.lock("k").try_acquire().await.is_ok()
    })
    .await;
    assert!(back.is_some());
}

/// The reply to an acquire is lost after Redis executed it: the client reports an
/// error, so the lock it took in its name is released by token.
#[tokio::test]
async fn an_acquire_whose_reply_was_lost_leaves_no_orphan() {
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let a = manager_at(&proxy.url()).await;
    let mut raw = raw(&redis).await;
    let lock_key = a.redis_names("k").lock;

    proxy.drop_next_replies(1);
    let r = a.lock("k").lease(Duration::from_secs(30)).acquire().await;
    assert!(matches!(r, Err(LockError::Backend { .. })), "{r:?}");
    let freed = eventually(Duration::from_secs(5), async || {
        !exists(&mut raw, &lock_key).await
    })
    .await;
    assert!(freed.is_some(), "orphaned lock still held");
    proxy.set_mode(FaultMode::Pass);
    let other = manager(&redis).await;
    let g = other
        .lock("k")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
}
