//! Three `#[tokio::test]`s (each on a runtime of its own, ended with the test)
//! calling a locked function through the default manager built from
//! `DISTLOCK_REDIS_URL`. They pass in any order, in parallel or with
//! `--test-threads=1`: the default manager's background work runs on a runtime
//! of its own, which no test's runtime takes down with it.
//!
//! The fourth test shows the per-test alternative, `with_default_manager`.

mod common;

use std::sync::Once;
use std::time::Duration;

use common::*;
use distlock::testing::RedisServer;
use distlock::{distributed_lock, LockError, LockManager};

/// One redis-server for the whole test binary, named by the environment the
/// way a user's CI would set it.
fn environment() -> &'static RedisServer {
    static ENV: Once = Once::new();
    let redis = RedisServer::process_wide().expect("redis-server");
    ENV.call_once(|| {
        // Set once, before any test reads it; never changed afterwards.
        std::env::set_var("DISTLOCK_REDIS_URL", redis.url());
    });
    redis
}

/// 900 ms, renewed every 300 ms: a renewal 200 ms late loses a 300 ms lease
/// on a loaded machine, 900 ms takes one 600 ms late.
#[distributed_lock(key = "job:{id}", lease = "900ms")]
async fn job(id: u64) -> Result<u64, LockError> {
    // Longer than the lease (past its local deadline, 891 ms): the renewal
    // (on the default manager's own runtime) must keep it, or the body is
    // aborted with `Lost`.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    Ok(id)
}

async fn run(id: u64) {
    environment();
    assert_eq!(job(id).await.unwrap(), id);
    // And the lock is really free again, for a manager of this test's own.
    let mine = LockManager::connect(&environment().url()).await.unwrap();
    let again = mine.lock(format!("job:{id}")).try_acquire().await.unwrap();
    assert!(again.is_some(), "job:{id} was left held");
}

#[tokio::test]
async fn first_test_on_its_own_runtime() {
    run(1).await;
}

#[tokio::test]
async fn second_test_on_its_own_runtime() {
    run(2).await;
}

#[tokio::test]
async fn third_test_on_its_own_runtime() {
    run(3).await;
}

/// Takes its fencing token, which leaves the lock's counter on the server the
/// manager talks to: the trace that shows which server was used.
#[distributed_lock(key = "scoped:{id}", guard = lock)]
async fn scoped_job(id: u64) -> Result<u64, LockError> {
    lock.fencing_token().await?;
    Ok(id)
}

/// Each test with a server and a manager of its own, for the locked functions
/// it calls: `with_default_manager` scopes the default to the call chain.
#[tokio::test]
async fn a_test_with_a_default_manager_of_its_own() {
    let redis = server();
    let manager = LockManager::connect(&redis.url()).await.unwrap();
    let names = manager.redis_names("scoped:9");
    let ran = distlock::with_default_manager(manager, async { scoped_job(9).await })
        .await
        .unwrap();
    assert_eq!(ran, 9);
    // It used this test's server, not the environment's.
    let mut raw = raw(&redis).await;
    assert!(exists(&mut raw, names.fencing_counter()).await);
}

/// Locks its key and takes its fencing token, then runs `inner_job` on the
/// same key in a subtask started with `spawn_with_locks`; answers both
/// tokens. The subtask re-enters the hold (the same token) only if it uses the
/// same manager, so it must keep the call chain's default manager too.
#[distributed_lock(key = "handed:{id}", guard = lock)]
async fn outer_job(id: u64) -> Result<(u64, u64), LockError> {
    let outer = lock.fencing_token().await?;
    let inner = distlock::spawn_with_locks(inner_job(id))
        .await
        .expect("the subtask panicked")?;
    Ok((outer, inner))
}

#[distributed_lock(key = "handed:{id}", wait = "200ms", guard = lock)]
async fn inner_job(id: u64) -> Result<u64, LockError> {
    let _ = id;
    lock.fencing_token().await
}

#[tokio::test]
async fn a_subtask_spawned_with_the_chains_locks_keeps_its_default_manager() {
    let redis = server();
    let manager = LockManager::connect(&redis.url()).await.unwrap();
    let (outer, inner) = distlock::with_default_manager(manager.clone(), outer_job(4))
        .await
        .unwrap();
    // A hold of its own (on another manager, or the same key of the
    // environment's server) would have had a token of its own.
    assert_eq!(inner, outer, "the subtask took a hold of its own");
    assert!(!manager.is_locked("handed:4").await.unwrap());
}
