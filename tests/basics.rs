//! Acquire, release, owner safety, mutual exclusion, keys and input validation.

mod common;

use std::time::Duration;

use common::*;
use distlock::LockError;

#[tokio::test]
async fn acquire_then_release_frees_the_lock() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let names = m.redis_names("order:42");

    let guard = m.lock("order:42").acquire().await.unwrap();
    assert_eq!(guard.key(), "order:42");
    assert!(!guard.is_lost());
    assert!(guard.remaining_lease() > Duration::from_secs(25));
    assert!(exists(&mut raw, &names.lock).await);
    let ttl = pttl(&mut raw, &names.lock).await;
    assert!(ttl > 25_000 && ttl <= 30_000, "ttl {ttl}");
    assert_eq!(m.held_count(), 1);

    guard.release().await.unwrap();
    assert!(!exists(&mut raw, &names.lock).await);
    assert_eq!(m.held_count(), 0);
    // The hold never asked for a fencing token: no counter was written.
    assert!(!exists(&mut raw, names.fencing_counter()).await);
}

#[tokio::test]
async fn try_acquire_is_one_attempt() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let held = a.lock("k").try_acquire().await.unwrap().expect("free lock");
    let start = std::time::Instant::now();
    assert!(b.lock("k").try_acquire().await.unwrap().is_none());
    assert!(start.elapsed() < Duration::from_millis(400));
    held.release().await.unwrap();
    assert!(b.lock("k").try_acquire().await.unwrap().is_some());
}

/// Owner tokens are random 128-bit values, and only the owner can release or
/// renew: a stale holder's release or renewal leaves the next holder's lock alone.
#[tokio::test]
async fn only_the_owner_releases_or_renews() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let names = a.redis_names("shared");

    // Owner tokens: 32 hex digits, different for each acquisition of the same key.
    let mut owners = Vec::new();
    for _ in 0..3 {
        let g = a.lock("shared").acquire().await.unwrap();
        let value: String = redis::cmd("GET")
            .arg(&names.lock)
            .query_async(&mut raw)
            .await
            .unwrap();
        let owner = value[..32].to_owned();
        assert_eq!(owner.len(), 32);
        assert!(owner.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(!owner.contains("shared"));
        owners.push(owner);
        g.release().await.unwrap();
    }
    owners.sort();
    owners.dedup();
    assert_eq!(owners.len(), 3);

    // A stale holder (renewing, lease lost to a DEL) meets the next holder's lock.
    let stale = a
        .lock("shared")
        .lease(Duration::from_millis(90))
        .acquire()
        .await
        .unwrap();
    del(&mut raw, &names.lock).await;
    let next = b
        .lock("shared")
        .lease(Duration::from_millis(600))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    // The stale holder's renewal (every 30 ms) must neither extend nor shorten it,
    // and the stale release must not delete it.
    stale.lost().await;
    assert!(matches!(stale.release().await, Err(LockError::Lost { .. })));
    assert!(exists(&mut raw, &names.lock).await);
    let ttl = pttl(&mut raw, &names.lock).await;
    assert!(ttl > 300 && ttl <= 600, "next holder's ttl changed: {ttl}");
    assert!(!next.is_lost());
    next.release().await.unwrap();
}

/// 2 managers x 32 tasks x 500 increments of a GET-then-SET counter under one lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_keeps_a_plain_counter_exact() {
    const TASKS: usize = 32;
    const ROUNDS: usize = 500;
    let redis = server();
    let managers = [manager(&redis).await, manager(&redis).await];
    let mut tasks = Vec::new();
    for m in &managers {
        for _ in 0..TASKS {
            let m = m.clone();
            let mut conn = raw(&redis).await;
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = m
                        .lock("counter")
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                        .unwrap();
                    let n: i64 = redis::cmd("GET")
                        .arg("counter-value")
                        .query_async::<Option<i64>>(&mut conn)
                        .await
                        .unwrap()
                        .unwrap_or(0);
                    let _: () = redis::cmd("SET")
                        .arg("counter-value")
                        .arg(n + 1)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut conn = raw(&redis).await;
    let total: i64 = redis::cmd("GET")
        .arg("counter-value")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(total, (2 * TASKS * ROUNDS) as i64);
    assert!(!exists(&mut conn, &managers[0].redis_names("counter").lock).await);
}

#[tokio::test]
async fn any_utf8_key_works_and_stays_out_of_lua_source() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let _: () = redis::cmd("SET")
        .arg("bystander")
        .arg(1)
        .query_async(&mut raw)
        .await
        .unwrap();
    let keys = [
        "with spaces".to_owned(),
        "new\nline\r\n".to_owned(),
        "quotes ' \" `".to_owned(),
        "{braces}".to_owned(),
        "}{".to_owned(),
        "{}".to_owned(),
        "ünïcødé 🔒 ключ 鍵".to_owned(),
        "'); redis.call('FLUSHALL'); --".to_owned(),
        "\0nul\0".to_owned(),
        "x".repeat(10 * 1024),
    ];
    for key in &keys {
        let g = m.lock(key.as_str()).acquire().await.unwrap();
        assert_eq!(g.key(), key);
        let names = m.redis_names(key);
        assert!(exists(&mut raw, &names.lock).await, "{key:?}");
        g.release().await.unwrap();
        assert!(!exists(&mut raw, &names.lock).await, "{key:?}");
    }
    assert!(exists(&mut raw, "bystander").await);
    // Distinct keys are distinct locks, even with braces that look like tags.
    let a = m.lock("{x}a").acquire().await.unwrap();
    let b = m.lock("{x}b").try_acquire().await.unwrap();
    assert!(b.is_some());
    drop((a, b));
}

#[tokio::test]
async fn bad_input_is_a_typed_error() {
    let redis = server();
    let m = manager(&redis).await;
    assert!(matches!(
        m.lock("").acquire().await,
        Err(LockError::InvalidKey { .. })
    ));
    assert!(matches!(
        m.lock("k").lease(Duration::ZERO).acquire().await,
        Err(LockError::InvalidConfig(_))
    ));
    assert!(matches!(
        m.lock("k").lease(Duration::from_millis(2)).acquire().await,
        Err(LockError::InvalidConfig(_))
    ));
    assert!(matches!(
        m.lock("k")
            .lease(Duration::from_secs(u64::MAX))
            .acquire()
            .await,
        Err(LockError::InvalidConfig(_))
    ));
    assert!(matches!(
        m.lock("k")
            .wait(Duration::from_secs(u64::MAX))
            .acquire()
            .await,
        Err(LockError::InvalidConfig(_))
    ));
    let built = distlock::LockManager::builder(&redis.url())
        .key_prefix("bad{prefix}")
        .build()
        .await;
    assert!(matches!(built, Err(LockError::InvalidConfig(_))));
    let built = distlock::LockManager::builder(&redis.url())
        .default_lease(Duration::ZERO)
        .build()
        .await;
    assert!(matches!(built, Err(LockError::InvalidConfig(_))));
    let built = distlock::LockManager::connect("not a url").await;
    assert!(matches!(built, Err(LockError::InvalidConfig(_))));
}

#[tokio::test]
async fn key_prefix_is_respected() {
    let redis = server();
    let m = distlock::LockManager::builder(&redis.url())
        .key_prefix("myapp:locks:")
        .default_lease(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let mut raw = raw(&redis).await;
    let g = m.lock("a").acquire().await.unwrap();
    g.fencing_token().await.unwrap();
    // The lock and, once a token is issued, its fencing counter.
    let keys = all_keys(&mut raw).await;
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter().all(|k| k.starts_with("myapp:locks:")),
        "{keys:?}"
    );
    assert!(pttl(&mut raw, &m.redis_names("a").lock).await <= 5000);
    g.release().await.unwrap();
}

#[tokio::test]
async fn global_manager_is_set_once() {
    let redis = server();
    let m = manager(&redis).await;
    distlock::set_global(m.clone()).unwrap();
    assert!(distlock::global().is_some());
    assert!(matches!(
        distlock::set_global(m),
        Err(LockError::InvalidConfig(_))
    ));
    let from_private = distlock::__private::default_manager().await.unwrap();
    assert_eq!(from_private.key_prefix(), "distlock:");
}

/// Scripts are sent by hash; when Redis has forgotten them (restart, SCRIPT
/// FLUSH) the next call loads them, for acquire, release and renewal alike.
#[tokio::test]
async fn forgotten_scripts_are_reloaded() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let g = m
        .lock("k")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Renewals at 100 ms, 200 ms, ... must survive the flush.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!g.is_lost());
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    g.release().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    m.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
