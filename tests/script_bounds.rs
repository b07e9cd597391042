//! Work inside Redis is bounded by what a call carries, never by a number it
//! carries: a script loops at most once per key it was sent (a `lock_all`'s
//! locks), per live holder or queue entry (each put there by an acquisition
//! of its own), and publishes once per release whatever the weight (see
//! `tests/semaphore.rs`, `a_release_of_any_weight_is_one_message`).

mod common;

use std::time::Duration;

use common::*;

/// A `lock_all` of many keys is one script on one server, looping once per
/// key it was sent: taken and released within the command timeout, and the
/// server answers others right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_all_of_ten_thousand_keys_is_taken_and_released() {
    const KEYS: usize = 10_000;
    let redis = server();
    let m = manager(&redis).await;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("many:{i}")).collect();
    let guard = m
        .lock_all(keys.iter().map(String::as_str))
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .expect("every key in one script");
    let mut raw = raw(&redis).await;
    let held: i64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    assert!(held >= KEYS as i64, "{held} names for {KEYS} locks");
    guard.release().await.expect("every key released");
    assert!(m.lock("many:0").try_acquire().await.unwrap().is_some());
}
