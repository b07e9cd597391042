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
    // 900 ms, renewed every 300 ms: a renewal 200 ms late loses a 300 ms
    // lease on a loaded machine; 900 ms takes one 600 ms late.
    let g = m.lock("k").lease(RENEWED_LEASE).acquire().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Renewals at 300 ms, 600 ms, ... must survive the flush; 1.2 s outlasts
    // the lease, so a renewal that failed shows.
    tokio::time::sleep(Duration::from_millis(1200)).await;
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

// The same behaviour on every store (`on_stores!`: single, cluster,
// PostgreSQL), through the public API only.

/// A hold is seen from outside with its lease, and a release frees it.
async fn a_hold_is_seen_and_a_release_frees_it(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    let guard = m.lock("order:42").acquire().await.unwrap();
    assert_eq!(guard.key(), "order:42");
    assert!(!guard.is_lost());
    assert!(guard.remaining_lease() > Duration::from_secs(25));
    let info = other.inspect("order:42").await.unwrap().expect("held");
    let ttl = info.ttl.expect("a lease");
    // The default lease is 30 s; 5 s leave room for a slow machine.
    assert!(
        ttl > Duration::from_secs(25) && ttl <= Duration::from_secs(30),
        "ttl {ttl:?}"
    );
    assert!(other.is_locked("order:42").await.unwrap());
    assert_eq!(m.held_count(), 1);

    guard.release().await.unwrap();
    assert!(other.inspect("order:42").await.unwrap().is_none());
    assert!(!other.is_locked("order:42").await.unwrap());
    assert_eq!(m.held_count(), 0);
}

async fn a_try_is_one_attempt(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let held = a
        .lock("try")
        .try_acquire()
        .await
        .unwrap()
        .expect("free lock");
    let start = std::time::Instant::now();
    assert!(b.lock("try").try_acquire().await.unwrap().is_none());
    // One round trip, not a wait (which would take the default wait).
    assert!(start.elapsed() < Duration::from_millis(400));
    held.release().await.unwrap();
    assert!(b.lock("try").try_acquire().await.unwrap().is_some());
}

/// A stale holder (its lock force-unlocked and taken by another) neither
/// extends, shortens nor deletes the next holder's lock.
async fn a_stale_holder_leaves_the_next_holders_lock_alone(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let stale = a
        .lock("shared")
        .lease(Duration::from_millis(90))
        .acquire()
        .await
        .unwrap();
    assert!(b.force_unlock("shared").await.unwrap());
    let next = b
        .lock("shared")
        .lease(Duration::from_millis(600))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    // The stale holder's renewals (every 30 ms) find another owner.
    stale.lost().await;
    assert!(matches!(stale.release().await, Err(LockError::Lost { .. })));
    let info = b.inspect("shared").await.unwrap().expect("still held");
    let ttl = info.ttl.expect("a lease");
    assert!(
        ttl > Duration::from_millis(300) && ttl <= Duration::from_millis(600),
        "next holder's ttl changed: {ttl:?}"
    );
    assert!(!next.is_lost());
    next.release().await.unwrap();
}

/// 2 managers x 8 tasks x 50 increments of a read-yield-write counter under
/// one lock: without exclusion the yields would lose increments.
async fn mutual_exclusion_keeps_a_counter_exact(d: Deployment) {
    const TASKS: usize = 8;
    const ROUNDS: usize = 50;
    let counter = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let managers = [d.manager().await, d.manager().await];
    let mut tasks = Vec::new();
    for m in &managers {
        for _ in 0..TASKS {
            let (m, counter) = (m.clone(), counter.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = m
                        .lock("counter")
                        .wait(Duration::from_secs(60))
                        .acquire()
                        .await
                        .unwrap();
                    let n = counter.load(std::sync::atomic::Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(n + 1, std::sync::atomic::Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        counter.load(std::sync::atomic::Ordering::SeqCst),
        2 * TASKS * ROUNDS
    );
    assert!(!managers[0].is_locked("counter").await.unwrap());
}

async fn any_utf8_key_is_its_own_lock(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    let keys = [
        "with spaces".to_owned(),
        "new\nline\r\n".to_owned(),
        "quotes ' \" `".to_owned(),
        "{braces}".to_owned(),
        "}{".to_owned(),
        "{}".to_owned(),
        "ünïcødé 🔒 ключ 鍵".to_owned(),
        "'); DROP TABLE locks; --".to_owned(),
        "%_.*[a-z]\\".to_owned(),
        "\0nul\0".to_owned(),
        "x".repeat(10 * 1024),
    ];
    for key in &keys {
        // PostgreSQL's text holds no NUL: there such a key is refused with a
        // typed error, and nothing is left behind.
        if d.is_postgres() && key.contains('\0') {
            let refused = m.lock(key.as_str()).acquire().await;
            assert!(
                matches!(refused, Err(LockError::InvalidKey { .. })),
                "{refused:?}"
            );
            assert!(matches!(
                other.inspect(key).await,
                Err(LockError::InvalidKey { .. })
            ));
            continue;
        }
        let g = m.lock(key.as_str()).acquire().await.unwrap();
        assert_eq!(g.key(), key);
        let info = other.inspect(key).await.unwrap();
        assert_eq!(info.map(|i| i.key), Some(key.clone()), "{key:?}");
        assert!(other
            .lock(key.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_none());
        g.release().await.unwrap();
        assert!(!other.is_locked(key).await.unwrap(), "{key:?}");
    }
    // Distinct keys are distinct locks, even with braces that look like tags.
    let a = m.lock("{x}a").acquire().await.unwrap();
    let b = m.lock("{x}b").try_acquire().await.unwrap();
    assert!(b.is_some());
    drop((a, b));
}

async fn bad_input_is_a_typed_error_on_every_store(d: Deployment) {
    let m = d.manager().await;
    assert!(matches!(
        m.lock("").acquire().await,
        Err(LockError::InvalidKey { .. })
    ));
    for lease in [
        Duration::ZERO,
        Duration::from_millis(2),
        Duration::from_secs(u64::MAX),
    ] {
        assert!(matches!(
            m.lock("k").lease(lease).acquire().await,
            Err(LockError::InvalidConfig(_))
        ));
    }
    assert!(matches!(
        m.lock("k")
            .wait(Duration::from_secs(u64::MAX))
            .acquire()
            .await,
        Err(LockError::InvalidConfig(_))
    ));
    let built = d.builder().key_prefix("bad{prefix}").build().await;
    assert!(matches!(built, Err(LockError::InvalidConfig(_))));
    let built = d.builder().default_lease(Duration::ZERO).build().await;
    assert!(matches!(built, Err(LockError::InvalidConfig(_))));
    let built = distlock::LockManager::connect("not a url").await;
    assert!(matches!(built, Err(LockError::InvalidConfig(_))));
}

/// Managers under different prefixes hold different locks of one key, and
/// each sees only its own.
async fn key_prefixes_are_separate_namespaces(d: Deployment) {
    // Prefixes of this test's own: the cluster is shared by the binary's tests.
    let app = d
        .builder()
        .key_prefix("myapp:locks:")
        .build()
        .await
        .unwrap();
    let plain = d.builder().key_prefix("other:").build().await.unwrap();
    let g = app.lock("a").acquire().await.unwrap();
    assert!(app.is_locked("a").await.unwrap());
    assert!(!plain.is_locked("a").await.unwrap());
    let keys: Vec<String> = app
        .list("*")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(keys, ["a"]);
    assert!(plain.list("*").await.unwrap().is_empty());
    let h = plain.lock("a").try_acquire().await.unwrap();
    assert!(h.is_some(), "another prefix's lock of the same key");
    g.release().await.unwrap();
}

on_stores!(
    a_hold_is_seen_and_a_release_frees_it,
    a_try_is_one_attempt,
    a_stale_holder_leaves_the_next_holders_lock_alone,
    mutual_exclusion_keeps_a_counter_exact,
    any_utf8_key_is_its_own_lock,
    bad_input_is_a_typed_error_on_every_store,
    key_prefixes_are_separate_namespaces,
);
