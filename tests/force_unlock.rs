//! `force_unlock` frees a lock whoever holds it: waiters are woken, the holder
//! learns it at its next renewal (lost signal, `Err(Lost)` from release), and the
//! next token is still larger. `is_locked` answers whether anyone holds a lock.
//! On one server, a cluster and a Redlock.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::testing::{RedisCluster, RedisServer};
use distlock::{LockError, LockManager};

async fn freed_under_its_holder(
    holder: &LockManager,
    operator: &LockManager,
    waiter: &LockManager,
) {
    let key = "stuck";
    // The waiter's manager listens from here on (its subscriber started):
    // parked below, it hears the force-unlock's message.
    open_every_connection(waiter).await;
    assert!(!operator.is_locked(key).await.unwrap());
    let lease = Duration::from_millis(900);
    let g = holder.lock(key).lease(lease).acquire().await.unwrap();
    let token = g.fencing_token().await.unwrap();
    assert!(operator.is_locked(key).await.unwrap());
    let w = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let g = waiter
                .lock(key)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            (Instant::now(), g)
        })
    };
    await_parked(waiter, 1).await;
    let freed_at = Instant::now();
    assert!(operator.force_unlock(key).await.unwrap());
    // The waiter is woken by the force-unlock's message, not by its backoff.
    let (acquired_at, next) = w.await.unwrap();
    assert!(acquired_at - freed_at < Duration::from_millis(500));
    assert!(next.fencing_token().await.unwrap() > token);
    // The holder learns it at its next renewal (every lease / 3).
    tokio::time::timeout(lease, g.lost())
        .await
        .expect("the holder learns of the loss");
    assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
    next.release().await.unwrap();
    assert!(
        !operator.force_unlock(key).await.unwrap(),
        "nothing left to free"
    );
    assert!(!operator.is_locked(key).await.unwrap());
}

#[tokio::test]
async fn on_one_server() {
    let redis = server();
    let (a, b, c) = (
        manager(&redis).await,
        manager(&redis).await,
        manager(&redis).await,
    );
    freed_under_its_holder(&a, &b, &c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster() {
    let cluster = RedisCluster::process_wide().unwrap();
    let m = || async {
        LockManager::cluster_builder(cluster.urls())
            .build()
            .await
            .unwrap()
    };
    freed_under_its_holder(&m().await, &m().await, &m().await).await;
}

#[tokio::test]
async fn on_a_redlock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let m = || async {
        LockManager::redlock_builder(urls.clone())
            .build()
            .await
            .unwrap()
    };
    freed_under_its_holder(&m().await, &m().await, &m().await).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    let d = Deployment::postgres();
    let (a, b, c) = (d.manager().await, d.manager().await, d.manager().await);
    freed_under_its_holder(&a, &b, &c).await;
}
