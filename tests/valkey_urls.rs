//! `valkey://` and `valkeys://` URLs work wherever `redis://` and `rediss://`
//! do: the builder, TLS, cluster seeds, Sentinel, Redlock members and the
//! environment variables of the default manager. CI runs this file against
//! Valkey 8 and 9 too (`REDIS_SERVER_BIN`); the CLI's test is in
//! `distlock-cli/tests/cli.rs`.

mod common;

use std::time::Duration;

use distlock::testing::{RedisCluster, RedisSentinel, RedisServer};
use distlock::LockManager;

fn as_valkey(url: &str) -> String {
    url.replacen("rediss://", "valkeys://", 1)
        .replacen("redis://", "valkey://", 1)
}

async fn lock_and_release(m: &LockManager, key: &str) {
    let g = m.lock(key).acquire().await.unwrap();
    assert!(g.fencing_token().await.unwrap() > 0);
    g.release().await.unwrap();
}

#[tokio::test]
async fn a_single_server() {
    let redis = RedisServer::spawn().unwrap();
    let url = as_valkey(&redis.url());
    assert!(url.starts_with("valkey://"), "{url}");
    let m = LockManager::connect(&url).await.unwrap();
    lock_and_release(&m, "k").await;
}

#[tokio::test]
async fn tls() {
    let redis = RedisServer::builder().tls(true).spawn().unwrap();
    let url = as_valkey(&redis.url());
    assert!(url.starts_with("valkeys://"), "{url}");
    let m = LockManager::builder(&url)
        .tls_ca_pem(redis.ca_cert_pem().unwrap())
        .build()
        .await
        .unwrap();
    lock_and_release(&m, "k").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_seeds() {
    let cluster = RedisCluster::spawn().unwrap();
    let seeds: Vec<String> = cluster.urls().iter().map(|u| as_valkey(u)).collect();
    let m = LockManager::cluster_builder(seeds).build().await.unwrap();
    lock_and_release(&m, "k").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels() {
    let fixture = RedisSentinel::spawn().unwrap();
    let sentinels: Vec<String> = fixture
        .sentinel_urls()
        .iter()
        .map(|u| as_valkey(u))
        .collect();
    let m = LockManager::sentinel_builder(sentinels, fixture.master_name())
        .build()
        .await
        .unwrap();
    lock_and_release(&m, "k").await;
}

#[tokio::test]
async fn redlock_members() {
    let members: Vec<RedisServer> = (0..3).map(|_| RedisServer::spawn().unwrap()).collect();
    let urls: Vec<String> = members.iter().map(|s| as_valkey(&s.url())).collect();
    let m = LockManager::redlock_builder(urls)
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    lock_and_release(&m, "k").await;
}

/// The default manager, from `DISTLOCK_REDIS_URL`. The only test of this
/// binary that reads the environment, so setting it races nothing.
#[distlock::distributed_lock(key = "job:{id}")]
async fn job(id: u64) -> Result<u64, distlock::LockError> {
    Ok(id)
}

#[tokio::test]
async fn the_default_manager_from_the_environment() {
    let redis = RedisServer::spawn().unwrap();
    // SAFETY: no other thread of this test binary reads or writes the
    // environment (see above).
    unsafe { std::env::set_var("DISTLOCK_REDIS_URL", as_valkey(&redis.url())) };
    assert_eq!(job(7).await.unwrap(), 7);
}
