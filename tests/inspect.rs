//! Holder identity and queries: every hold records who holds it and since when
//! (in the acquire's one round trip), `inspect` reads it back with the fencing
//! token and the lease left, and `list` finds the held locks by pattern. On one
//! server, a cluster and a Redlock.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use distlock::testing::{RedisCluster, RedisServer};
use distlock::{LockError, LockManager};

async fn holds_are_seen_from_outside(holder: &LockManager, operator: &LockManager) {
    let key = "order:42";
    assert_eq!(operator.inspect(key).await.unwrap(), None);

    let before = SystemTime::now();
    let g = holder
        .lock(key)
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let after = SystemTime::now();
    // No token until the holder asks for one; then inspect shows it.
    let info = operator.inspect(key).await.unwrap().expect("held");
    assert_eq!(info.fencing_token, 0);
    let token = g.fencing_token().await.unwrap();
    let info = operator.inspect(key).await.unwrap().expect("held");
    assert_eq!(info.key, key);
    assert_eq!(info.holder, "web-1 checkout worker");
    assert_eq!(info.fencing_token, token);
    let ttl = info.ttl.expect("a held lock has a TTL");
    assert!(
        ttl > Duration::from_secs(3) && ttl <= Duration::from_secs(5),
        "{ttl:?}"
    );
    // The holder's clock, in whole milliseconds.
    assert!(
        info.held_since + Duration::from_millis(1) >= before && info.held_since <= after,
        "{:?} not within {before:?}..{after:?}",
        info.held_since
    );
    assert!(!info.waited_for);

    // A waiter marks the hold as waited for.
    let waiter = {
        let operator = operator.clone();
        tokio::spawn(async move {
            operator
                .lock(key)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = operator.inspect(key).await.unwrap().expect("still held");
        if info.waited_for {
            assert_eq!(info.fencing_token, g.fencing_token().await.unwrap());
            assert_eq!(info.holder, "web-1 checkout worker");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never marked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // list: by pattern, sorted by key, only this prefix's locks.
    let others: Vec<_> = futures_util::future::join_all(["order:7", "user:1"].map(|k| {
        holder
            .lock(k)
            .lease(Duration::from_secs(5))
            .eager_fencing(true)
            .acquire()
    }))
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let orders = operator.list("order:*").await.unwrap();
    let keys: Vec<&str> = orders.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["order:42", "order:7"]);
    assert_eq!(orders[0].fencing_token, g.fencing_token().await.unwrap());
    assert_eq!(
        orders[1].fencing_token,
        others[0].fencing_token().await.unwrap()
    );
    assert_eq!(operator.list("*").await.unwrap().len(), 3);
    assert!(operator.list("nothing:*").await.unwrap().is_empty());

    g.release().await.unwrap();
    waiter.await.unwrap();
    for g in others {
        g.release().await.unwrap();
    }
    assert_eq!(operator.inspect(key).await.unwrap(), None);
    assert!(operator.list("*").await.unwrap().is_empty());
}

#[tokio::test]
async fn on_one_server() {
    let redis = server();
    let holder = LockManager::builder(&redis.url())
        .holder("web-1 checkout worker")
        .build()
        .await
        .unwrap();
    holds_are_seen_from_outside(&holder, &manager(&redis).await).await;

    // Another prefix's locks and foreign keys under ours are not listed.
    let other = LockManager::builder(&redis.url())
        .key_prefix("other:")
        .build()
        .await
        .unwrap();
    let _held = other.lock("order:1").acquire().await.unwrap();
    let mut raw = raw(&redis).await;
    let foreign = manager(&redis).await.redis_names("order:9").lock;
    let _: () = redis::cmd("SET")
        .arg(&foreign)
        .arg("not a lock")
        .query_async(&mut raw)
        .await
        .unwrap();
    let m = manager(&redis).await;
    assert!(m.list("*").await.unwrap().is_empty());
    assert_eq!(other.list("*").await.unwrap().len(), 1);
    // Inspecting the foreign value names the problem rather than inventing a holder.
    let err = m.inspect("order:9").await.unwrap_err();
    assert!(err.to_string().contains("did not write"), "{err}");
}

/// A lock key written by distlock 0.1 (a hash) is refused as a value distlock
/// (this version) did not write, not shared: mixed versions during a rolling
/// upgrade cannot both hold one lock.
#[tokio::test]
async fn a_lock_of_the_previous_key_format_is_refused() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let name = m.redis_names("legacy").lock;
    let _: () = redis::cmd("HSET")
        .arg(&name)
        .arg("0123456789abcdef0123456789abcdef")
        .arg("17")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = m.lock("legacy").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::ForeignValue { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster() {
    let cluster = RedisCluster::process_wide().unwrap();
    let holder = LockManager::cluster_builder(cluster.urls())
        .key_prefix("inspect:")
        .holder("web-1 checkout worker")
        .build()
        .await
        .unwrap();
    let operator = LockManager::cluster_builder(cluster.urls())
        .key_prefix("inspect:")
        .build()
        .await
        .unwrap();
    holds_are_seen_from_outside(&holder, &operator).await;
}

#[tokio::test]
async fn on_a_redlock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let holder = LockManager::redlock_builder(urls.clone())
        .holder("web-1 checkout worker")
        .build()
        .await
        .unwrap();
    let operator = LockManager::redlock_builder(urls).build().await.unwrap();
    holds_are_seen_from_outside(&holder, &operator).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    let d = Deployment::postgres();
    let holder = d
        .builder()
        .holder("web-1 checkout worker")
        .build()
        .await
        .unwrap();
    holds_are_seen_from_outside(&holder, &d.manager().await).await;

    // Another prefix's locks are not listed.
    let other = d.builder().key_prefix("other:").build().await.unwrap();
    let _held = other.lock("order:1").acquire().await.unwrap();
    let m = d.manager().await;
    assert!(m.list("*").await.unwrap().is_empty());
    assert_eq!(other.list("*").await.unwrap().len(), 1);
}

/// The default holder description names host, pid and program, and an
/// over-long one is refused, on every store.
async fn the_default_holder_on_every_store(d: Deployment) {
    let m = d.manager().await;
    let _g = m.lock("holder").acquire().await.unwrap();
    let info = m.inspect("holder").await.unwrap().unwrap();
    let program = std::env::current_exe().unwrap();
    let program = program.file_name().unwrap().to_string_lossy();
    assert!(
        info.holder
            .ends_with(&format!(" pid {} {program}", std::process::id())),
        "{}",
        info.holder
    );
    let too_long = d.builder().holder("x".repeat(257)).build().await;
    assert!(matches!(too_long, Err(LockError::InvalidConfig(_))));
}

on_stores!(
    the_default_holder_on_every_store,
    list_returns_only_keys_that_match_its_pattern
);

/// `list(pattern)` returns the held keys the pattern matches, and no other:
/// on Redis the names it scans for put a `*` where the lock's kind is
/// (`<prefix>*:{tag}:<pattern>`), which can also swallow the start of a user
/// key that holds `:{` + 16 characters + `}:` itself.
async fn list_returns_only_keys_that_match_its_pattern(d: Deployment) {
    let m = d.manager().await;
    let tricky = "x:{0123456789abcdef}:y";
    let g = m.lock(tricky).acquire().await.unwrap();
    assert!(m.list("y").await.unwrap().is_empty());
    assert!(m.list("*:y").await.unwrap().iter().any(|i| i.key == tricky));
    assert_eq!(m.list(tricky).await.unwrap().len(), 1);
    // A range written backwards is the same range on every store (Redis
    // swaps its ends; PostgreSQL's regular expressions refused it).
    assert_eq!(m.list("x:{[9-0]*").await.unwrap().len(), 1);
    assert_eq!(m.list("x:{[0-9]*").await.unwrap().len(), 1);
    g.release().await.unwrap();
}
