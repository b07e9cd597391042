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

/// Whether the call chain holds a key, and how many holds share it: local
/// answers that follow the chain as re-entry does (a scope, a nested
/// acquisition, `spawn_with_locks`), not the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_knows_what_it_holds_and_how_often() {
    let redis = server();
    let m = manager(&redis).await;
    assert!(!m.is_held_by_current_chain("k"));
    assert_eq!(m.lock("k").hold_count(), 0);
    let outer = m.lock("k").acquire().await.unwrap();
    // The guard alone does not put the chain in a scope: the hold is the
    // guard's until a scope (or a locked function) hands it to a chain.
    assert!(!m.is_held_by_current_chain("k"));
    let (inside, inner_count, other_key, read_side, spawned, handed) = outer
        .scope(async {
            let inside = m.is_held_by_current_chain("k");
            let inner = m.lock("k").acquire().await.unwrap();
            let inner_count = m.lock("k").hold_count();
            let other_key = m.is_held_by_current_chain("other");
            let read_side = m.read_lock("k").is_held_by_current_chain();
            let m2 = m.clone();
            let spawned = tokio::spawn(async move { m2.is_held_by_current_chain("k") })
                .await
                .unwrap();
            let m3 = m.clone();
            let handed =
                distlock::spawn_with_locks(async move { m3.is_held_by_current_chain("k") })
                    .await
                    .unwrap();
            inner.release().await.unwrap();
            (inside, inner_count, other_key, read_side, spawned, handed)
        })
        .await;
    assert!(inside, "inside the guard's scope");
    assert_eq!(inner_count, 2, "the acquisition and one re-entry");
    assert!(!other_key);
    assert!(
        !read_side,
        "a read-write lock of the same key is another lock"
    );
    assert!(!spawned, "a tokio::spawn'ed task is another chain");
    assert!(handed, "spawn_with_locks hands the chain's holds on");
    assert_eq!(outer.scope(async { m.lock("k").hold_count() }).await, 1);
    outer.release().await.unwrap();
}

/// A request that is not re-entrant fails at once for a key the chain holds,
/// instead of re-entering (or waiting for itself), on every kind and for
/// multi-key requests; the macro's `reentrant = false` does the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_reentrant_request_fails_at_once_for_a_held_key() {
    let redis = server();
    let m = manager(&redis).await;
    let outer = m.lock("k").acquire().await.unwrap();
    let wait = Duration::from_secs(5);
    let started = std::time::Instant::now();
    let (single, multi, nested) = outer
        .scope(async {
            let single = m.lock("k").reentrant(false).wait(wait).acquire().await;
            let multi = m
                .lock_all(["a", "k"])
                .reentrant(false)
                .wait(wait)
                .acquire()
                .await;
            let nested = not_reentrant(&m).await;
            (single, multi, nested)
        })
        .await;
    // At once: far below the 5 s wait a waiting request would spend.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&single, Err(LockError::AlreadyHeld { key }) if key == "k"),
        "{single:?}"
    );
    assert!(
        matches!(&multi, Err(LockError::AlreadyHeld { key }) if key == "k"),
        "{multi:?}"
    );
    assert!(
        matches!(&nested, Err(LockError::AlreadyHeld { key }) if key == "k"),
        "{nested:?}"
    );
    // Nothing was taken by the failed multi-key request.
    assert!(!m.is_locked("a").await.unwrap());
    outer.release().await.unwrap();

    // Not held: the same requests acquire as usual.
    let g = m.lock("k").reentrant(false).acquire().await.unwrap();
    g.release().await.unwrap();
    let semaphore = m.semaphore("s", 2).acquire().await.unwrap();
    let again = semaphore
        .scope(async { m.semaphore("s", 2).reentrant(false).acquire().await })
        .await;
    assert!(
        matches!(again, Err(LockError::AlreadyHeld { .. })),
        "{again:?}"
    );
    semaphore.release().await.unwrap();
}

#[distlock::distributed_lock(key = "k", manager = m, reentrant = false)]
async fn not_reentrant(m: &LockManager) -> Result<(), LockError> {
    Ok(())
}

/// Re-entry in scope takes no round trip and shares the token; an inner
/// release keeps the outer hold, the last frees the lock; another manager
/// never re-enters: on every store, seen through `is_locked`.
async fn reentry_on_every_store(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    let key = "reenter";
    let outer = m.lock(key).acquire().await.unwrap();
    let token = outer.fencing_token().await.unwrap();
    let inner_token = outer
        .scope(async {
            let start = std::time::Instant::now();
            let inner = m.lock(key).wait(Duration::ZERO).acquire().await.unwrap();
            assert!(
                start.elapsed() < Duration::from_millis(50),
                "re-entry must not wait"
            );
            let t = inner.fencing_token().await.unwrap();
            nested_use_of(&m, key).await;
            inner.release().await.unwrap();
            assert!(other.is_locked(key).await.unwrap(), "inner release kept it");
            t
        })
        .await;
    assert_eq!(inner_token, token);
    assert!(other.lock(key).try_acquire().await.unwrap().is_none());
    // Outside the scope the same manager is another owner.
    assert!(m.lock(key).try_acquire().await.unwrap().is_none());
    outer.release().await.unwrap();
    assert!(!other.is_locked(key).await.unwrap());
}

async fn nested_use_of(m: &LockManager, key: &str) {
    let g = m.lock(key).acquire().await.unwrap();
    g.scope(async {
        let again = m.lock(key).try_acquire().await.unwrap().expect("re-entry");
        drop(again);
    })
    .await;
    g.release().await.unwrap();
}

on_stores!(reentry_on_every_store);
