//! A locked function without `manager = ...`: the global manager, else one from
//! DISTLOCK_URL / DISTLOCK_REDIS_URL / REDIS_URL (the first set), else `LockError::NotConfigured`. One test in
//! its own binary, because it changes process-wide state (env, global manager).
//! `shutdown_default_manager` then waits for the release of a cancelled call.

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
    // Through a proxy, for the shutdown below to slow down.
    let proxy = distlock::testing::FaultProxy::start(redis.addr())
        .await
        .unwrap();
    // DISTLOCK_URL comes first: the Redis-only variable names a port where
    // nothing listens, which would fail the build if it were used.
    std::env::set_var("DISTLOCK_URL", proxy.url());
    std::env::set_var("DISTLOCK_REDIS_URL", "redis://127.0.0.1:1");
    assert_eq!(job().await.unwrap(), 7);
    // It used that server: the fencing counter of "job" is there.
    let mut raw = raw(&redis).await;
    assert!(all_keys(&mut raw)
        .await
        .iter()
        .any(|k| k.contains("fence") && k.ends_with(":job")));
    shutdown_waits_for_a_cancelled_calls_release(&proxy, &mut raw).await;
}

/// Told by `sleepy` once it holds its lock.
static SLEEPY_HOLDS: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[distributed_lock(key = "sleepy")]
async fn sleepy() -> Result<(), LockError> {
    SLEEPY_HOLDS.notify_one();
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    Ok(())
}

/// `shutdown_default_manager` before a program ends waits for the release of
/// a locked call cut short (a `select!` on ctrl-c), which runs in a task of
/// the default manager's own runtime: the exit would end that task, and the
/// lock would wait out its lease. The manager reaches its server through
/// `proxy`, which now holds each chunk 300 ms, so that the release takes
/// 600 ms, long after a shutdown that did not wait for it would have
/// returned; `raw` reads the server directly.
async fn shutdown_waits_for_a_cancelled_calls_release(
    proxy: &distlock::testing::FaultProxy,
    raw: &mut redis::aio::MultiplexedConnection,
) {
    tokio::select! {
        _ = sleepy() => unreachable!("it sleeps a minute"),
        // Slowed only once the body runs, so that what is cut short is the
        // body, with its guard, not the acquisition.
        () = SLEEPY_HOLDS.notified() => proxy.set_mode(distlock::testing::FaultMode::Delay(
            std::time::Duration::from_millis(300),
        )),
    }
    assert!(kinds_of(raw, "sleepy").await.contains(&"lock".to_owned()));
    // `sleepy` dropped: its guard's release runs in the background.
    distlock::shutdown_default_manager().await.unwrap();
    assert!(
        !kinds_of(raw, "sleepy").await.contains(&"lock".to_owned()),
        "the lock outlived the shutdown"
    );
    assert!(matches!(job().await, Err(LockError::ShutDown { .. })));
}
