//! Release on every exit: return, panic, abort; `Drop` never blocks or panics.

mod common;

use std::time::{Duration, Instant};

use common::*;

async fn freed_within(
    redis: &distlock::testing::RedisServer,
    key: &str,
    limit: Duration,
) -> Duration {
    let other = manager(redis).await;
    let start = Instant::now();
    let g = other
        .lock(key)
        .wait(limit)
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("not freed within {limit:?}: {e}"));
    g.release().await.unwrap();
    start.elapsed()
}

/// An acquire cancelled while its script is in flight must not leave the lock
/// held in its name for the whole lease.
#[tokio::test]
async fn a_cancelled_acquire_leaves_no_lock_behind() {
    let redis = server();
    let a = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let lock_key = a.redis_names("k").lock;
    for _ in 0..50 {
        // Cancel at the first poll that does not complete: the request was sent.
        let fut = a.lock("k").lease(Duration::from_secs(30)).acquire();
        let _ = tokio::time::timeout(Duration::from_micros(1), fut).await;
    }
    let free = eventually(Duration::from_secs(2), async || {
        !exists(&mut raw, &lock_key).await
    })
    .await;
    assert!(free.is_some(), "a cancelled acquire left the lock held");
    freed_within(&redis, "k", Duration::from_millis(500)).await;
}

/// Without a runtime, dropping a guard neither blocks nor panics; the lease frees
/// the lock.
#[test]
fn drop_without_a_runtime_falls_back_to_the_lease() {
    let redis = server();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let g = rt.block_on(async {
        let a = manager(&redis).await;
        a.lock("k")
            .lease(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap()
    });
    drop(rt);
    let start = Instant::now();
    drop(g);
    // A drop that does no I/O takes microseconds; one that waited for a
    // release with no runtime to drive it would wait out the command timeout
    // (500 ms) or for ever. 250 ms lies between, with room for a loaded
    // machine's scheduler.
    assert!(start.elapsed() < Duration::from_millis(250));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // The 300 ms lease began before the drop; 1 s more for the waiter's
        // attempt on a loaded machine. Its 3 s wait fails a lock that stays.
        let took = freed_within(&redis, "k", Duration::from_secs(3)).await;
        assert!(took < Duration::from_millis(300 + 1000), "{took:?}");
    });
}

// Release on every exit, on every store (`on_stores!`).

/// How long until another manager of `d` gets `key` (waiting up to `limit`).
async fn freed_on(d: &Deployment, key: &str, limit: Duration) -> Duration {
    let other = d.manager().await;
    let start = Instant::now();
    let g = other
        .lock(key)
        .wait(limit)
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("not freed within {limit:?}: {e}"));
    g.release().await.unwrap();
    start.elapsed()
}

/// Dropped, panicked and aborted holders of a 30 s lease release within 1 s,
/// and cancelled acquisitions leave no lock behind.
async fn every_exit_releases_on_every_store(d: Deployment) {
    let a = d.manager().await;
    let g = a
        .lock("dropped")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    drop(g);
    freed_on(&d, "dropped", Duration::from_secs(1)).await;

    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let m = a.clone();
    let task = tokio::spawn(async move {
        let _g = m
            .lock("panicked")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        held_tx.send(()).unwrap();
        panic!("the body failed");
    });
    held_rx.await.unwrap();
    assert!(task.await.unwrap_err().is_panic());
    freed_on(&d, "panicked", Duration::from_secs(1)).await;

    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let m = a.clone();
    let task = tokio::spawn(async move {
        let g = m
            .lock("aborted")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        held_tx.send(()).unwrap();
        g.scope(std::future::pending::<()>()).await;
    });
    held_rx.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    freed_on(&d, "aborted", Duration::from_secs(1)).await;

    for _ in 0..50 {
        // Cancel at the first poll that does not complete: the request was sent.
        let fut = a.lock("cancelled").lease(Duration::from_secs(30)).acquire();
        let _ = tokio::time::timeout(Duration::from_micros(1), fut).await;
    }
    let free = eventually(Duration::from_secs(2), async || {
        !a.is_locked("cancelled").await.unwrap()
    })
    .await;
    assert!(free.is_some(), "a cancelled acquire left the lock held");
    freed_on(&d, "cancelled", Duration::from_millis(500)).await;
}

on_stores!(every_exit_releases_on_every_store);
