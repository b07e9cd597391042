//! Work inside Redis is bounded by what a call carries, never by a number it
//! carries: a script loops at most once per key it was sent (a `lock_all`'s
//! locks, at most `MAX_LOCK_ALL_KEYS`), per live holder or queue entry (each put there by an acquisition
//! of its own), and publishes once per release whatever the weight (see
//! `tests/semaphore.rs`, `a_release_of_any_weight_is_one_message`).

mod common;

use std::time::Duration;

use common::*;
use distlock::{LockError, MAX_LOCK_ALL_KEYS};
use futures_util::StreamExt;

/// A `lock_all` of the most keys allowed is one script on one server, looping
/// once per key it was sent: taken and released, and the server answers
/// others right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_all_of_the_most_keys_allowed_is_taken_and_released() {
    let redis = server();
    let m = manager(&redis).await;
    let keys: Vec<String> = (0..MAX_LOCK_ALL_KEYS)
        .map(|i| format!("many:{i}"))
        .collect();
    let guard = m
        .lock_all(keys.iter().map(String::as_str))
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .expect("every key in one script");
    let mut raw = raw(&redis).await;
    let held: i64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    assert!(
        held >= MAX_LOCK_ALL_KEYS as i64,
        "{held} names for {MAX_LOCK_ALL_KEYS} locks"
    );
    guard.release().await.expect("every key released");
    assert!(m.lock("many:0").try_acquire().await.unwrap().is_some());
}

/// A million keys (or one more than the limit) are refused at once, naming
/// the count and the limit, and nothing reaches the server: MONITOR shows no
/// command from the manager between two markers of the test's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_all_of_a_million_keys_is_refused_without_a_command() {
    let redis = server();
    let m = manager(&redis).await;
    // The manager's connection is open and its scripts loaded before MONITOR.
    m.lock_all(["warm-up"])
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut raw = raw(&redis).await;
    let mut lines = monitor(&redis).await;
    let _: String = redis::cmd("ECHO")
        .arg("begin")
        .query_async(&mut raw)
        .await
        .unwrap();

    for count in [MAX_LOCK_ALL_KEYS + 1, 1_000_000] {
        let keys = (0..count).map(|i| format!("huge:{i}"));
        let err = m
            .lock_all(keys)
            .acquire()
            .await
            .expect_err("more keys than the limit");
        assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&count.to_string()), "{text}");
        assert!(text.contains(&MAX_LOCK_ALL_KEYS.to_string()), "{text}");
        let once = m
            .lock_all((0..count).map(|i| format!("huge:{i}")))
            .try_acquire()
            .await;
        assert!(matches!(once, Err(LockError::InvalidConfig(_))), "{once:?}");
    }

    let _: String = redis::cmd("ECHO")
        .arg("end")
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut between = Vec::new();
    let mut begun = false;
    while let Some(line) = tokio::time::timeout(Duration::from_secs(5), lines.next())
        .await
        .expect("monitor output")
    {
        if line.contains("\"end\"") {
            break;
        }
        if begun {
            between.push(line);
        } else if line.contains("\"begin\"") {
            begun = true;
        }
    }
    assert!(begun, "the first marker was seen");
    assert!(between.is_empty(), "{between:#?}");
    assert!(m.lock("huge:0").try_acquire().await.unwrap().is_some());
}
