//! `fencing(false)`: no fencing counter, tokens 0, and a free lock taken with a
//! plain `SET NX PX` (no script); everything else as with fencing.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use distlock::testing::{RedisCluster, RedisServer};
use distlock::LockManager;

async fn unfenced(url: &str) -> LockManager {
    LockManager::builder(url)
        .fencing(false)
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

/// 8 tasks over 2 managers, 40 sections each: never two inside at once, and
/// every waiter is served (by wake-ups: the waiting attempts mark the lock).
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
                    assert_eq!(g.fencing_token(), 0);
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
async fn on_one_server_tokens_are_zero_and_no_counter_is_kept() {
    let redis = server();
    let (a, b) = (unfenced(&redis.url()).await, unfenced(&redis.url()).await);
    exclusive(&a, &b).await;

    let mut raw = raw(&redis).await;
    let names = a.redis_names("shared");
    assert!(!exists(&mut raw, &names.fencing_counter).await);
    assert!(!exists(&mut raw, &names.lock).await);

    // The holder is still recorded for operators.
    let g = a.lock("seen").acquire().await.unwrap();
    let info = b.inspect("seen").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, 0);
    assert!(info.holder.contains(&format!("pid {}", std::process::id())));
    g.release().await.unwrap();
}

/// An uncontended cycle: `SET NX PX` + `ECHO`, then the release script (`GET`,
/// `DEL`): 5 Redis commands and one `EVALSHA`.
#[tokio::test]
async fn an_uncontended_unfenced_cycle_is_five_redis_commands() {
    let redis = server();
    let m = unfenced(&redis.url()).await;
    m.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut raw = raw(&redis).await;
    reset_stats(&mut raw).await;
    for _ in 0..100 {
        m.lock("k")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let calls = command_calls(&mut raw).await;
    let count = |name: &str| calls.get(name).copied().unwrap_or(0);
    assert_eq!(count("set"), 100, "{calls:#?}");
    assert_eq!(count("echo"), 100, "{calls:#?}");
    assert_eq!(count("evalsha"), 100, "{calls:#?}");
    assert_eq!(count("get"), 100, "{calls:#?}");
    assert_eq!(count("del"), 100, "{calls:#?}");
    assert_eq!(count("publish"), 0, "{calls:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster() {
    let cluster = RedisCluster::process_wide().unwrap();
    let m = || async {
        LockManager::cluster_builder(cluster.urls())
            .key_prefix("unfenced:")
            .fencing(false)
            .build()
            .await
            .unwrap()
    };
    exclusive(&m().await, &m().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redlock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let m = || async {
        LockManager::redlock_builder(urls.clone())
            .fencing(false)
            .build()
            .await
            .unwrap()
    };
    exclusive(&m().await, &m().await).await;
}
