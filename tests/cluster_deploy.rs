//! Deploying on a Redis Cluster: a least-privilege ACL user (set on every node,
//! as ACLs are per node) works, and one without the topology command is refused
//! by `build()` with a typed error naming it. The behaviour suite:
//! `tests/cluster.rs`.

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
