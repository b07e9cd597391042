//! A locked function without `manager = ...`: the global manager, else one from
//! DISTLOCK_URL / DISTLOCK_REDIS_URL / REDIS_URL (the first set), else `LockError::NotConfigured`. One test in
//! its own binary, because it changes process-wide state (env, global manager).

mod common;

use common::*;
use distlock::{distributed_lock, LockError};

// Takes its fencing token, which leaves the counter the test looks for.
#[distributed_lock(key = "job", guard = lock)]
async fn job() -> Result<u64, LockError> {
    lock.fencing_token().await?;
    Ok(7)
}

#[tokio::test]
async fn default_manager_comes_from_the_environment_or_is_not_configured() {
    // Env changes are safe here: this binary runs one test, on this thread.
    std::env::remove_var("DISTLOCK_URL");
    std::env::remove_var("DISTLOCK_REDIS_URL");
    std::env::remove_var("REDIS_URL");
    assert!(matches!(job().await, Err(LockError::NotConfigured)));
    let message = LockError::NotConfigured.to_string();
    assert!(
        message.contains("set_global") && message.contains("REDIS_URL"),
        "{message}"
    );

    let redis = server();
    // DISTLOCK_URL comes first: the Redis-only variable names a port where
    // nothing listens, which would fail the build if it were used.
    std::env::set_var("DISTLOCK_URL", redis.url());
    std::env::set_var("DISTLOCK_REDIS_URL", "redis://127.0.0.1:1");
    assert_eq!(job().await.unwrap(), 7);
    // It used that server: the fencing counter of "job" is there.
    let mut raw = raw(&redis).await;
    assert!(all_keys(&mut raw)
        .await
        .iter()
        .any(|k| k.contains("fence") && k.ends_with(":job")));
}
