//! Every call path reloads a script Redis no longer has (after `SCRIPT FLUSH`,
//! a restart or a failover to a replica that never loaded it) and retries once
//! by itself: no call hands the caller a "try again" (issue: `extend` on a
//! semaphore permit failed the first time, since `build()` loads only the
//! default lock's scripts).

mod common;

use std::time::Duration;

use common::*;
use distlock::LockManager;

/// `SCRIPT FLUSH` on every server of the deployment.
async fn flush(d: &Deployment) {
    let urls: Vec<String> = match d {
        Deployment::Single(s) => vec![s.url()],
        Deployment::Cluster(c) => c
            .nodes()
            .iter()
            .filter(|n| n.is_running)
            .map(|n| n.url.clone())
            .collect(),
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    };
    for url in urls {
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

const LEASE: Duration = Duration::from_secs(10);

async fn the_default_lock(d: &Deployment, m: &LockManager, other: &LockManager) {
    flush(d).await;
    let g = m.lock("reload:x").lease(LEASE).acquire().await.unwrap();
    flush(d).await;
    g.extend(LEASE).await.unwrap();
    flush(d).await;
    let token = g.fencing_token().await.unwrap();
    flush(d).await;
    assert_eq!(
        m.inspect("reload:x").await.unwrap().unwrap().fencing_token,
        token
    );
    // A queued waiter (its attempts are scripts), then a release that hands
    // the lock over, each after a flush. On one server the holder's manager
    // listens before the waiter queues and hears its notice, so that the
    // release is the one sent behind a PING (a pipeline, whose NOSCRIPT is
    // retried alone); a cluster's release sends no PING.
    flush(d).await;
    let heard_before = m.waited_for_notices_heard();
    let single = matches!(d, Deployment::Single(_));
    if let Deployment::Single(s) = d {
        await_holder_listening(&mut raw(s).await, m, "reload:x").await;
    }
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move {
            other
                .lock("reload:x")
                .lease(LEASE)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    await_waiter(m, "reload:x").await;
    if single {
        eventually(Duration::from_secs(5), async || {
            m.waited_for_notices_heard() > heard_before
        })
        .await
        .expect("the holder's manager hears that a waiter queued");
    }
    flush(d).await;
    g.release().await.unwrap();
    let handed = waiter.await.unwrap().unwrap();
    flush(d).await;
    assert!(handed.fencing_token().await.unwrap() > token);
    flush(d).await;
    assert!(m.force_unlock("reload:x").await.unwrap());
    flush(d).await;
    assert!(matches!(
        handed.release().await,
        Err(distlock::LockError::Lost { .. })
    ));
    // An eager acquisition is a script too.
    flush(d).await;
    let e = m
        .lock("reload:e")
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap();
    flush(d).await;
    e.release().await.unwrap();
}

async fn the_lock_family(d: &Deployment, m: &LockManager) {
    flush(d).await;
    let r = m
        .read_lock("reload:rw")
        .lease(LEASE)
        .acquire()
        .await
        .unwrap();
    flush(d).await;
    r.extend(LEASE).await.unwrap();
    flush(d).await;
    r.release().await.unwrap();

    flush(d).await;
    let w = m
        .write_lock("reload:rw")
        .lease(LEASE)
        .acquire()
        .await
        .unwrap();
    flush(d).await;
    w.extend(LEASE).await.unwrap();
    flush(d).await;
    w.fencing_token().await.unwrap();
    flush(d).await;
    w.release().await.unwrap();

    // The reported case: the first extend of a semaphore permit.
    flush(d).await;
    let p = m
        .semaphore("reload:s", 2)
        .lease(LEASE)
        .acquire()
        .await
        .unwrap();
    flush(d).await;
    p.extend(LEASE).await.unwrap();
    flush(d).await;
    p.release().await.unwrap();

    flush(d).await;
    let all = m
        .lock_all(["reload:a", "reload:b"])
        .lease(LEASE)
        .acquire()
        .await
        .unwrap();
    flush(d).await;
    assert_eq!(all.fencing_tokens().await.unwrap().len(), 2);
    flush(d).await;
    all.release().await.unwrap();
}

async fn every_call_reloads_a_flushed_script(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    the_default_lock(&d, &m, &other).await;
    the_lock_family(&d, &m).await;
}

on_both!(every_call_reloads_a_flushed_script);

/// Redlock (the default lock only): every member reloads on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redlock_every_call_reloads_a_flushed_script() {
    let servers: Vec<_> = (0..3).map(|_| server()).collect();
    let m = LockManager::redlock_builder(servers.iter().map(|s| s.url()))
        .build()
        .await
        .unwrap();
    let flush_all = async || {
        for s in &servers {
            let mut conn = raw(s).await;
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    flush_all().await;
    let g = m.lock("reload:r").lease(LEASE).acquire().await.unwrap();
    flush_all().await;
    g.extend(LEASE).await.unwrap();
    flush_all().await;
    g.fencing_token().await.unwrap();
    flush_all().await;
    assert!(m.inspect("reload:r").await.unwrap().is_some());
    flush_all().await;
    g.release().await.unwrap();
}

/// On a cluster, a reload goes to the masters, not to every node: with a
/// replica that stopped answering, the renewals, calls and release of a lock
/// on another master reload its scripts and go on. (redis-rs sends a plain
/// SCRIPT LOAD to every node, replicas included, and waits for all of them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_reload_does_not_wait_for_a_silent_replica() {
    use distlock::testing::{ClusterNodeRole, RedisCluster};
    let cluster = RedisCluster::builder()
        .masters(3)
        .replicas_per_master(1)
        .spawn()
        .unwrap();
    let m = LockManager::cluster_builder(cluster.urls())
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let silent = cluster
        .nodes()
        .iter()
        .find(|n| n.role == ClusterNodeRole::Replica { of: 0 })
        .unwrap()
        .index;
    let key = (0..)
        .map(|i| format!("silent:{i}"))
        .find(|k| cluster.master_of_key(&m.redis_names(k).lock).unwrap() == 1)
        .unwrap();
    let flush_master = || {
        tokio::task::block_in_place(|| {
            let mut conn = cluster.blocking_client(1).unwrap();
            redis::cmd("SCRIPT").arg("FLUSH").exec(&mut conn).unwrap();
        })
    };
    let lease = Duration::from_millis(1500);
    let g = m.lock(&key).lease(lease).acquire().await.unwrap();
    flush_master();
    cluster.pause(silent).unwrap();
    // The renewal is due every lease / 3 = 500 ms; had none succeeded, the
    // lease of 1.5 s would run out and the guard say so within two leases
    // (3 s), the bound here.
    let lost = tokio::time::timeout(2 * lease, g.lost()).await;
    assert!(
        lost.is_err(),
        "the hold was lost while a replica was paused"
    );
    // Each of these reloads a script within the command timeout
    // (before, `extend` timed out at 500 ms waiting for the paused replica).
    flush_master();
    g.extend(lease).await.unwrap();
    flush_master();
    g.fencing_token().await.unwrap();
    flush_master();
    g.release().await.unwrap();
    cluster.resume(silent).unwrap();
}
