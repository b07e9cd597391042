//! Fencing on demand: a hold that never asks for its token pays nothing for
//! fencing (no counter, a plain `SET NX PX` to take a free lock); the first
//! `fencing_token()` issues the token in one round trip and records it in the
//! lock; later calls are local; a holder that lost its lock gets none; an
//! eager request issues it inside the acquisition.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use distlock::testing::{RedisCluster, RedisServer};
use distlock::{LockError, LockManager};

async fn manager_for(url: &str) -> LockManager {
    LockManager::builder(url)
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

/// 8 tasks over 2 managers, 40 sections each: never two inside at once, every
/// waiter is served, and no hold has a token it did not ask for.
async fn exclusive(a: &LockManager, b: &LockManager) {
    let inside = Arc::new(AtomicBool::new(false));
    let sections = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let m = if t % 2 == 0 { a.clone() } else { b.clone() };
            let (inside, sections) = (inside.clone(), sections.clone());
            tokio::spawn(async move {
                for _ in 0..40 {
                    let g = m
                        .lock("shared")
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .await
                        .unwrap();
                    assert_eq!(g.issued_fencing_token(), None);
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    tokio::task::yield_now().await;
                    inside.store(false, Ordering::SeqCst);
                    sections.fetch_add(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(sections.load(Ordering::SeqCst), 320);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_that_never_ask_leave_no_counter() {
    let redis = server();
    let (a, b) = (
        manager_for(&redis.url()).await,
        manager_for(&redis.url()).await,
    );
    exclusive(&a, &b).await;

    let mut raw = raw(&redis).await;
    let names = a.redis_names("shared");
    assert!(!exists(&mut raw, names.fencing_counter()).await);
    assert!(!exists(&mut raw, &names.lock).await);
    assert_eq!(all_keys(&mut raw).await, Vec::<String>::new());

    // The holder is still recorded for operators, with no token.
    let g = a.lock("seen").acquire().await.unwrap();
    let info = b.inspect("seen").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, 0);
    assert!(info.holder.contains(&format!("pid {}", std::process::id())));
    g.release().await.unwrap();
}

/// The first call issues the token in one script (which records it in the
/// lock, so inspect shows it); the second is local; tokens grow across holders
/// that take one, also when holders without a token came between.
#[tokio::test]
async fn a_token_on_demand_is_one_round_trip_then_local_and_grows() {
    let redis = server();
    let m = manager_for(&redis.url()).await;
    let mut raw = raw(&redis).await;
    let mut last = 0;
    for round in 0..5 {
        // A hold that never asks, between ones that do.
        m.lock("k")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let g = m.lock("k").acquire().await.unwrap();
        reset_stats(&mut raw).await;
        let token = g.fencing_token().await.unwrap();
        assert!(token > last, "round {round}: {token} after {last}");
        assert_eq!(g.issued_fencing_token(), Some(token));
        assert_eq!(g.fencing_token().await.unwrap(), token);
        let calls = command_calls(&mut raw).await;
        assert_eq!(
            calls.get("evalsha").copied().unwrap_or(0),
            1,
            "one script for two calls: {calls:#?}"
        );
        let info = m.inspect("k").await.unwrap().unwrap();
        assert_eq!(info.fencing_token, token);
        // Re-entry shares the token, locally.
        let inner = g
            .scope(async { m.lock("k").acquire().await.unwrap() })
            .await;
        assert_eq!(inner.issued_fencing_token(), Some(token));
        drop(inner);
        last = token;
        g.release().await.unwrap();
    }
}

/// A holder whose lock is gone is refused a token, and is told it lost the
/// lock; nothing is written to the counter for it.
#[tokio::test]
async fn a_token_asked_for_after_the_lock_was_lost_is_refused() {
    let redis = server();
    let m = manager_for(&redis.url()).await;
    let g = m.lock("gone").acquire().await.unwrap();
    let mut raw = raw(&redis).await;
    let names = m.redis_names("gone");
    // Someone else's lock now: the holder's lease is gone in Redis.
    del(&mut raw, &names.lock).await;
    let other = manager_for(&redis.url()).await;
    let thief = other.lock("gone").acquire().await.unwrap();
    match g.fencing_token().await {
        Err(LockError::Lost { key }) => assert_eq!(key, "gone"),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(g.is_lost());
    assert!(!exists(&mut raw, names.fencing_counter()).await);
    // The new holder's token is unaffected.
    assert!(thief.fencing_token().await.unwrap() > 0);
    // A lease already known to be lost is refused locally too.
    assert!(matches!(
        g.fencing_token().await,
        Err(LockError::Lost { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster() {
    let cluster = RedisCluster::process_wide().unwrap();
    let m = || async {
        LockManager::cluster_builder(cluster.urls())
            .key_prefix("ondemand:")
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (m().await, m().await);
    exclusive(&a, &b).await;
    let g = a.lock("c").acquire().await.unwrap();
    let t1 = g.fencing_token().await.unwrap();
    g.release().await.unwrap();
    let g = b.lock("c").acquire().await.unwrap();
    assert!(g.fencing_token().await.unwrap() > t1);
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redlock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let m = || async {
        LockManager::redlock_builder(urls.clone())
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (m().await, m().await);
    exclusive(&a, &b).await;
    let mut last = 0;
    for _ in 0..5 {
        let g = a.lock("r").acquire().await.unwrap();
        let t = g.fencing_token().await.unwrap();
        assert!(t > last);
        last = t;
        g.release().await.unwrap();
        // One without a token between.
        b.lock("r")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    let d = Deployment::postgres();
    let (a, b) = (d.manager().await, d.manager().await);
    exclusive(&a, &b).await;
    let g = a.lock("c").acquire().await.unwrap();
    // No token until asked: inspect shows 0, then the issued one.
    assert_eq!(b.inspect("c").await.unwrap().unwrap().fencing_token, 0);
    let t1 = g.fencing_token().await.unwrap();
    assert_eq!(b.inspect("c").await.unwrap().unwrap().fencing_token, t1);
    g.release().await.unwrap();
    let g = b.lock("c").acquire().await.unwrap();
    assert!(g.fencing_token().await.unwrap() > t1);
    g.release().await.unwrap();
}

/// A holder whose lock was freed and taken by another is refused a token and
/// told it lost the lock; the new holder's token is larger; an eager request
/// (per request or the manager's default) has its token at once. On every
/// store.
async fn lost_and_eager_tokens_on_every_store(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    let early = m.lock("gone").acquire().await.unwrap();
    let early_token = early.fencing_token().await.unwrap();
    early.release().await.unwrap();
    let g = m.lock("gone").acquire().await.unwrap();
    assert!(other.force_unlock("gone").await.unwrap());
    let thief = other.lock("gone").acquire().await.unwrap();
    match g.fencing_token().await {
        Err(LockError::Lost { key }) => assert_eq!(key, "gone"),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(g.is_lost());
    assert!(thief.fencing_token().await.unwrap() > early_token);
    assert!(matches!(
        g.fencing_token().await,
        Err(LockError::Lost { .. })
    ));
    thief.release().await.unwrap();

    let g = m.lock("eager").eager_fencing(true).acquire().await.unwrap();
    let token = g.issued_fencing_token().expect("issued at acquisition");
    assert_eq!(
        other.inspect("eager").await.unwrap().unwrap().fencing_token,
        token
    );
    g.release().await.unwrap();
    let eager = d.builder().eager_fencing(true).build().await.unwrap();
    let g2 = eager.lock("eager").acquire().await.unwrap();
    assert!(g2.issued_fencing_token().unwrap() > token);
    g2.release().await.unwrap();
}

on_stores!(lost_and_eager_tokens_on_every_store);
