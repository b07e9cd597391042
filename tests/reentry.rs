//! Re-entry travels with the call chain (a task-local context), not the task id.
// Spawning from inside a scope returns a JoinHandle on purpose: the spawn is what
// captures the scope's held locks.
#![allow(clippy::async_yields_async)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use distlock::{LockError, LockManager};

#[tokio::test]
async fn nested_acquire_in_scope_reenters_with_the_same_token() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let lock_key = m.redis_names("k").lock;

    let outer = m.lock("k").acquire().await.unwrap();
    let token = outer.fencing_token().await.unwrap();
    let (inner_token, still_held) = outer
        .scope(async {
            let start = std::time::Instant::now();
            let inner = m.lock("k").wait(Duration::ZERO).acquire().await.unwrap();
            assert!(
                start.elapsed() < Duration::from_millis(50),
                "re-entry must not wait"
            );
            let t = inner.fencing_token().await.unwrap();
            // Deeper nesting, through a function of its own.
            nested_use(&m).await;
            inner.release().await.unwrap();
            (t, exists(&mut raw, &lock_key).await)
        })
        .await;
    assert_eq!(inner_token, token);
    assert!(still_held, "inner release must not free the outer hold");
    let mut raw = common::raw(&redis).await;
    assert!(exists(&mut raw, &lock_key).await);
    outer.release().await.unwrap();
    assert!(!exists(&mut raw, &lock_key).await);
}

async fn nested_use(m: &LockManager) {
    let g = m.lock("k").acquire().await.unwrap();
    g.scope(async {
        let again = m.lock("k").try_acquire().await.unwrap().expect("re-entry");
        drop(again);
    })
    .await;
    g.release().await.unwrap();
}

/// Two futures joined in one task share the task id; they must still exclude
/// each other when each locks from outside any hold.
#[tokio::test]
async fn joined_futures_in_one_task_exclude_each_other() {
    let redis = server();
    let m = manager(&redis).await;
    let inside = AtomicUsize::new(0);
    let max_inside = AtomicUsize::new(0);
    let run = || async {
        for _ in 0..20 {
            let g = m
                .lock("k")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            max_inside.fetch_max(now, Ordering::SeqCst);
            // Yield inside the critical section so the other future gets to run.
            tokio::time::sleep(Duration::from_millis(2)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            g.release().await.unwrap();
        }
    };
    tokio::join!(run(), run());
    assert_eq!(max_inside.load(Ordering::SeqCst), 1);

    // And inside a scope, joined siblings each holding a *different* context
    // still exclude each other on a key the parent does not hold.
    let parent = m.lock("parent").acquire().await.unwrap();
    parent.scope(async { tokio::join!(run(), run()) }).await;
    assert_eq!(max_inside.load(Ordering::SeqCst), 1);
    parent.release().await.unwrap();
}

#[tokio::test]
async fn a_spawned_task_is_another_owner_unless_handed_the_locks() {
    let redis = server();
    let m = manager(&redis).await;
    let outer = m.lock("k").acquire().await.unwrap();
    let token = outer.fencing_token().await.unwrap();

    let m2 = m.clone();
    let plain = outer
        .scope(async move {
            tokio::spawn(async move {
                m2.lock("k")
                    .wait(Duration::from_millis(150))
                    .acquire()
                    .await
            })
        })
        .await;
    assert!(matches!(
        plain.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));

    let m3 = m.clone();
    let handed = outer
        .scope(async move {
            distlock::spawn_with_locks(async move {
                let g = m3.lock("k").wait(Duration::ZERO).acquire().await?;
                let t = g.fencing_token().await.unwrap();
                g.release().await?;
                Ok::<_, LockError>(t)
            })
        })
        .await;
    assert_eq!(handed.await.unwrap().unwrap(), token);
    outer.release().await.unwrap();
}

/// A hold handed to a subtask keeps the lock until the subtask releases it, even
/// when the parent releases first.
#[tokio::test]
async fn the_last_hold_frees_the_lock() {
    let redis = server();
    let m = manager(&redis).await;
    let other = manager(&redis).await;
    let outer = m.lock("k").acquire().await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let m2 = m.clone();
    let child = outer
        .scope(async move {
            distlock::spawn_with_locks(async move {
                let g = m2.lock("k").acquire().await.unwrap();
                rx.await.unwrap();
                g.release().await.unwrap();
            })
        })
        .await;
    // Wait until the child holds it: the only way to know is that it re-entered,
    // so give it a moment through a yield loop bounded by time.
    while m.held_count() == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    outer.release().await.unwrap();
    assert!(other.lock("k").try_acquire().await.unwrap().is_none());
    tx.send(()).unwrap();
    child.await.unwrap();
    assert!(other.lock("k").try_acquire().await.unwrap().is_some());
}

#[tokio::test]
async fn different_managers_do_not_reenter_each_other() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let g = a.lock("k").acquire().await.unwrap();
    let r = g
        .scope(async { b.lock("k").wait(Duration::ZERO).acquire().await })
        .await;
    assert!(matches!(r, Err(LockError::Timeout { .. })));
    g.release().await.unwrap();
    let _keep = Arc::new(());
}
