//! Deploying on a Redis Cluster: a least-privilege ACL user (set on every node,
//! as ACLs are per node) works, and one without the topology command is refused
//! by `build()` with a typed error naming it; a TLS-only cluster works through
//! `rediss://` seeds and a private CA, and refuses to connect without it. The
//! behaviour suite: `tests/cluster.rs`.

mod common;

use std::time::Duration;

use distlock::testing::RedisCluster;
use distlock::{LockError, LockManager};

/// The single-server least-privilege rules (`tests/server_checks.rs`, docs/deploying.md)
/// plus what the cluster client needs to read the topology.
const CLUSTER_LEAST_PRIVILEGE: &str = "~distlock:* &distlock:* +ping +evalsha +script|load +time \
     +get +set +pexpire +pttl +del +publish +subscribe +unsubscribe \
     +zadd +zrange +zrem +zcard +hset +hget +hdel \
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
            let g = other
                .lock(key)
                .wait(Duration::from_secs(5))
                .acquire()
                .await?;
            g.fencing_token().await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let token = guard.fencing_token().await.unwrap();
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

#[tokio::test]
async fn a_tls_cluster_locks_with_rediss_seeds() {
    let cluster = RedisCluster::builder().tls(true).spawn().unwrap();
    let seeds = cluster.urls();
    assert!(
        seeds.iter().all(|url| url.starts_with("rediss://")),
        "{seeds:?}"
    );
    let ca = cluster.ca_cert_pem().unwrap().to_vec();
    let holder = LockManager::cluster_builder(seeds.clone())
        .tls_ca_pem(ca.clone())
        .default_lease(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    // The waiters' manager: its subscriber connections go over TLS too.
    let waiters = LockManager::cluster_builder(seeds.clone())
        .tls_ca_pem(ca.clone())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    // A hand-off reaches the waiters' manager by a message on each master.
    // Its subscription there starts in the background of its first wait on
    // that master (TLS connections, SUBSCRIBE): a hand-off published before
    // it is confirmed is taken on the wake that follows the subscription,
    // uncounted. So a master may miss a round; up to three rounds each, on
    // keys of that master, one of which must count the message.
    let mut heard_on = std::collections::HashSet::new();
    let mut missed = std::collections::HashMap::<usize, u32>::new();
    for i in 0..64 {
        let key = format!("tls:{i}");
        let node = cluster
            .master_of_key(&holder.redis_names(&key).lock)
            .unwrap();
        if heard_on.contains(&node) {
            continue;
        }
        let guard = holder.lock(&key).acquire().await.unwrap();
        let waiting = waiters.clone();
        let waited_key = key.clone();
        let waiter = tokio::spawn(async move {
            waiting
                .lock(waited_key)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        });
        // The waiter queued for the held lock, so the release hands it over.
        common::await_waiter(&holder, &key).await;
        let token = guard.fencing_token().await.unwrap();
        let wake_ups = waiters.wake_ups_delivered();
        guard.release().await.unwrap();
        let acquired = waiter.await.unwrap().unwrap();
        assert!(acquired.fencing_token().await.unwrap() > token);
        acquired.release().await.unwrap();
        if waiters.wake_ups_delivered() > wake_ups {
            heard_on.insert(node);
            if heard_on.len() == 3 {
                return;
            }
        } else {
            let misses = missed.entry(node).or_default();
            *misses += 1;
            assert!(
                *misses < 3,
                "master {node}: no release message reached the waiter in three hand-offs"
            );
        }
    }
    panic!("release messages heard only on masters {heard_on:?} (misses: {missed:?})");
}

#[tokio::test]
async fn a_tls_cluster_without_its_ca_is_refused_by_build() {
    let cluster = RedisCluster::builder().tls(true).spawn().unwrap();
    let started = std::time::Instant::now();
    let refused = LockManager::cluster_builder(cluster.urls())
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    println!("refused after {elapsed:?}: {refused}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert!(matches!(refused, LockError::Connect { .. }), "{refused:?}");
}
