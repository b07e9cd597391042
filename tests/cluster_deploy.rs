//! Deploying on a Redis Cluster: a least-privilege ACL user (set on every node,
//! as ACLs are per node) works, and one without the topology command is refused
//! by `build()` with a typed error naming it; shutting down (the manager, or the
//! runtime under a held guard) frees the locks on every master. The behaviour
//! suite: `tests/cluster.rs`.

mod common;

use std::time::Duration;

use distlock::testing::RedisCluster;
use distlock::{LockError, LockManager};

/// The single-server least-privilege rules (`tests/server_checks.rs`, README)
/// plus what the cluster client needs to read the topology.
const CLUSTER_LEAST_PRIVILEGE: &str = "~distlock:* &distlock:* +ping +evalsha +script|load +time \
     +get +set +hget +hset +hexists +pexpire +pttl +del +publish +subscribe +unsubscribe \
     +cluster|slots";

fn set_user_everywhere(cluster: &RedisCluster, rules: &str) {
    for node in cluster.nodes() {
        let mut conn = cluster.blocking_client(node.index).unwrap();
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER")
            .arg("locker")
            .arg("reset")
            .arg("on")
            .arg(">pw");
        for rule in rules.split_whitespace() {
            cmd.arg(rule);
        }
        cmd.query::<()>(&mut conn).unwrap();
    }
}

fn user_urls(cluster: &RedisCluster) -> Vec<String> {
    cluster
        .urls()
        .iter()
        .map(|url| url.replacen("redis://", "redis://locker:pw@", 1))
        .collect()
}

#[tokio::test]
async fn a_least_privilege_acl_user_locks_on_every_master() {
    let cluster = RedisCluster::spawn().unwrap();
    set_user_everywhere(&cluster, CLUSTER_LEAST_PRIVILEGE);
    let m = LockManager::cluster_builder(user_urls(&cluster))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    // Keys until every master has held one.
    let mut masters_seen = std::collections::HashSet::new();
    for i in 0..64 {
        let key = format!("acl:{i}");
        let node = cluster.master_of_key(&m.redis_names(&key).lock).unwrap();
        let guard = m.lock(&key).acquire().await.unwrap();
        // A waiter on another manager exercises SUBSCRIBE under the same user.
        let other = LockManager::cluster_builder(user_urls(&cluster))
            .build()
            .await
            .unwrap();
        let waiter = tokio::spawn(async move {
            other
                .lock(key)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .map(|g| g.fencing_token())
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let token = guard.fencing_token();
        guard.release().await.unwrap();
        assert!(waiter.await.unwrap().unwrap() > token);
        masters_seen.insert(node);
        if masters_seen.len() == 3 {
            return;
        }
    }
    panic!("keys reached only masters {masters_seen:?}");
}

#[tokio::test]
async fn a_user_who_may_not_read_the_topology_is_refused_by_build() {
    let cluster = RedisCluster::spawn().unwrap();
    set_user_everywhere(
        &cluster,
        &CLUSTER_LEAST_PRIVILEGE.replace(" +cluster|slots", ""),
    );
    let started = std::time::Instant::now();
    let refused = LockManager::cluster_builder(user_urls(&cluster))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(
            refused,
            LockError::Connect { .. } | LockError::ServerCheck { .. }
        ),
        "{refused:?}"
    );
    let text = refused.to_string();
    println!("{text}");
    assert!(text.to_lowercase().contains("cluster"), "{text}");
}

/// Keys whose locks live on each of the cluster's masters (one per master).
fn one_key_per_master(cluster: &RedisCluster, m: &LockManager, stem: &str) -> Vec<String> {
    let mut keys: Vec<Option<String>> = vec![None; 3];
    for i in 0.. {
        let key = format!("{stem}:{i}");
        let node = cluster.master_of_key(&m.redis_names(&key).lock).unwrap();
        if keys[node].is_none() {
            keys[node] = Some(key);
        }
        if keys.iter().all(Option::is_some) {
            break;
        }
    }
    keys.into_iter().flatten().collect()
}

#[tokio::test]
async fn shutdown_releases_on_every_master() {
    let cluster = RedisCluster::process_wide().unwrap();
    let m = LockManager::cluster_builder(cluster.urls())
        .build()
        .await
        .unwrap();
    let keys = one_key_per_master(cluster, &m, "shutdown");
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(m.lock(key).acquire().await.unwrap());
    }
    let mut conn = cluster.cluster_connection().await.unwrap();
    m.shutdown().await.unwrap();
    for key in &keys {
        let exists: bool = redis::cmd("EXISTS")
            .arg(m.redis_names(key).lock)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!exists, "{key} still held after shutdown");
    }
    assert!(guards.iter().all(|g| g.is_lost()));
}

/// A guard dropped as its runtime ends: the release runs over a blocking
/// connection to the lock's master (the slot map says which), so the next run
/// of the program does not wait out the lease.
#[test]
fn a_lock_held_as_the_runtime_ends_is_released_on_its_master() {
    let cluster = RedisCluster::process_wide().unwrap();
    let urls = cluster.urls();
    let lock_name = common::lock_held_as_runtime_ends(|| async move {
        LockManager::cluster_builder(urls).build().await.unwrap()
    });
    let node = cluster.master_of_key(&lock_name).unwrap();
    let mut conn = cluster.blocking_client(node).unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg(&lock_name)
        .query(&mut conn)
        .unwrap();
    assert!(!exists, "the lock outlived its runtime");
}
