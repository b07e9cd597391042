//! Redis memory stays bounded: nothing a lock writes outlives it by more than
//! `lease + fence retention`, and fencing tokens keep growing after a counter expired.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::LockManager;
use redis::aio::MultiplexedConnection;

async fn dbsize(conn: &mut MultiplexedConnection) -> i64 {
    redis::cmd("DBSIZE")
        .query_async(conn)
        .await
        .expect("DBSIZE")
}

async fn manager_with(url: &str, retention: Duration) -> LockManager {
    LockManager::builder(url)
        .fence_retention(retention)
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_released_keys_leave_nothing_behind_once_the_bound_has_passed() {
    const KEYS: usize = 10_000;
    const TASKS: usize = 50;
    let redis = server();
    let mut raw = raw(&redis).await;
    let baseline = dbsize(&mut raw).await;
    let lease = Duration::from_millis(1000);
    let retention = Duration::from_millis(1500);
    let m = manager_with(&redis.url(), retention).await;

    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let m = m.clone();
            tokio::spawn(async move {
                for i in (t..KEYS).step_by(TASKS) {
                    // Tokens taken, so that counters are left to expire.
                    let g = m
                        .lock(format!("order:{i}"))
                        .lease(lease)
                        .eager_fencing(true)
                        .acquire()
                        .await
                        .unwrap();
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let released = Instant::now();
    // Right after: the locks are gone; fencing counters stay for now (those of the
    // first keys may have expired already), each with a TTL.
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        !left.is_empty() && left.len() <= KEYS,
        "{} keys",
        left.len()
    );
    assert!(left.iter().all(|k| k.starts_with("distlock:fence:")));
    for key in left.iter().step_by(97) {
        // -2: expired since KEYS listed it; never -1 (no TTL).
        let ttl = pttl(&mut raw, key).await;
        assert!(
            ttl == -2 || (ttl > 0 && ttl <= (lease + retention).as_millis() as i64),
            "{key} has PTTL {ttl}"
        );
    }

    // Once `lease + retention` has passed since the last acquisition, every key
    // has expired: touching each one finds it gone, and DBSIZE is back to the baseline.
    tokio::time::sleep_until((released + lease + retention + Duration::from_millis(50)).into())
        .await;
    for key in &left {
        assert_eq!(pttl(&mut raw, key).await, -2, "{key} outlived the bound");
    }
    assert_eq!(dbsize(&mut raw).await, baseline);
}

#[tokio::test]
async fn a_key_whose_counter_expired_still_gets_a_larger_token() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let m = manager_with(&redis.url(), Duration::ZERO).await;
    let names = m.redis_names("k");
    let mut highest = 0;
    for round in 0..5 {
        // Several acquisitions in a row push the counter along... Each hold
        // need only last its three round trips: 500 ms unrenewed, so that
        // only a 500 ms stall loses one (a renewed 100 ms lease is lost by
        // a renewal 67 ms late). Each round waits about a lease for the
        // counter to expire, so a longer one costs five times over.
        for _ in 0..20 {
            let g = m
                .lock("k")
                .lease(Duration::from_millis(500))
                .renew(false)
                .acquire()
                .await
                .unwrap();
            assert!(g.fencing_token().await.unwrap() > highest);
            highest = g.fencing_token().await.unwrap();
            g.release().await.unwrap();
        }
        // ...then it expires with the lease (retention zero) and is gone.
        let deadline = Instant::now() + Duration::from_secs(2);
        while exists(&mut raw, names.fencing_counter()).await {
            assert!(Instant::now() < deadline, "the counter never expired");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let g = m.lock("k").acquire().await.unwrap();
        assert!(
            g.fencing_token().await.unwrap() > highest,
            "round {round}: {} after {highest} with the counter expired",
            g.fencing_token().await.unwrap()
        );
        highest = g.fencing_token().await.unwrap();
        g.release().await.unwrap();
    }
}

/// `MEMORY USAGE` of one held lock, for the docs (`distlock::semantics`, "Memory
/// in Redis", and lock-bench/README.md): without a token it is the
/// lock's string alone (no fencing counter is written); with one, the string
/// and its fencing counter. `cargo test --test memory -- --nocapture`.
#[tokio::test]
async fn memory_usage_of_a_held_lock() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let m = manager(&redis).await;
    let key = "order:1234567";
    let names = m.redis_names(key);
    let usage = async |raw: &mut redis::aio::MultiplexedConnection, name: &str| -> Option<i64> {
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(name)
            .query_async(raw)
            .await
            .unwrap()
    };
    let g = m.lock(key).acquire().await.unwrap();
    let lock = usage(&mut raw, &names.lock).await.expect("the lock");
    assert_eq!(usage(&mut raw, names.fencing_counter()).await, None);
    assert_eq!(all_keys(&mut raw).await, std::slice::from_ref(&names.lock));
    g.fencing_token().await.unwrap();
    let with_token = usage(&mut raw, &names.lock).await.expect("the lock")
        + usage(&mut raw, names.fencing_counter())
            .await
            .expect("the counter");
    println!(
        "MEMORY USAGE of a held lock on {key:?} (prefix {:?}): {lock} bytes without a token \
         (the lock string alone), {with_token} bytes with one (lock string + fencing counter)",
        m.key_prefix()
    );
    // Small keys; a count that does not drift for a given key length.
    assert!(lock > 0 && lock < 250, "{lock} bytes");
    assert!(with_token > lock && with_token < 400, "{with_token} bytes");
    g.release().await.unwrap();
}
