//! `LockError::Backend` and `LockError::Connect` carry distlock's own
//! `BackendError`, whose kind tells what failed, whatever the Redis client
//! underneath reported it as.

mod common;

use std::error::Error as _;
use std::time::Duration;

use common::*;
use distlock::testing::{FaultMode, FaultProxy, RedisServer};
use distlock::{BackendErrorKind, LockError, LockManager};

fn backend_kind(e: &LockError) -> Option<BackendErrorKind> {
    match e {
        LockError::Backend { source, .. } | LockError::Connect { source, .. } => {
            Some(source.kind())
        }
        _ => None,
    }
}

/// Asserts that `err` is a server's error reply with the code `code`.
fn assert_server_error(err: &LockError, code: &str) {
    assert_eq!(backend_kind(err), Some(BackendErrorKind::Server), "{err:?}");
    let LockError::Backend { source, .. } = err else {
        unreachable!()
    };
    assert_eq!(source.code(), Some(code), "{err:?}");
}

/// A refused connection is tried again twice (within about 150 ms), then
/// reported as refused, a connection error, well within the connect
/// timeout (before, the tries went on for up to 600 ms, and a shorter
/// connect timeout turned the refusal into a timeout that hid its cause).
#[tokio::test]
async fn nothing_listening_is_a_refused_connection() {
    let started = std::time::Instant::now();
    let err = LockManager::builder("redis://127.0.0.1:1")
        .connect_timeout(Duration::from_millis(1_000))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Connect { .. }), "{err:?}");
    assert_eq!(
        backend_kind(&err),
        Some(BackendErrorKind::Connection),
        "{err:?}"
    );
    assert!(err.to_string().contains("refused"), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1_000));
}

#[tokio::test]
async fn a_wrong_password_is_an_auth_failure() {
    let redis = RedisServer::builder().password("s3cret").spawn().unwrap();
    let err = LockManager::connect(&redis.url().replace("s3cret", "wrong"))
        .await
        .unwrap_err();
    assert_eq!(backend_kind(&err), Some(BackendErrorKind::Auth), "{err:?}");
    // The client's own error is kept, boxed, as the source.
    let LockError::Connect { source, .. } = &err else {
        unreachable!()
    };
    assert!(source.source().is_some());
}

#[tokio::test]
async fn no_reply_in_time_is_a_timeout() {
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let m = manager_at(&proxy.url()).await; // command timeout 500 ms
    proxy.set_mode(FaultMode::BlackHole);
    let err = m.lock("k").try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert_eq!(
        backend_kind(&err),
        Some(BackendErrorKind::Timeout),
        "{err:?}"
    );
    let LockError::Backend { source, .. } = &err else {
        unreachable!()
    };
    assert!(source.is_timeout());
    assert!(err.is_transient());
}

#[tokio::test]
async fn an_error_reply_is_a_server_error_with_its_code() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    // Writes refused the way a full Redis refuses them.
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    let err = m.lock("k").try_acquire().await.unwrap_err();
    assert_server_error(&err, "OOM");
}

/// A release that most likely hands the lock over (its manager heard the
/// waiter's notice) goes behind a `PING` in one pipeline: an error reply to
/// its script is still a server error with its own code, not a pipeline
/// failure. Here the queue's key holds a string, so the script's read of the
/// queue is refused (`WRONGTYPE`). Once the key is gone, the release retried
/// in the background frees the lock and the waiter's next attempt takes it.
#[tokio::test]
async fn an_error_reply_to_a_release_behind_a_ping_keeps_its_code() {
    let redis = server();
    let holder = manager(&redis).await;
    let waiter = manager(&redis).await;
    wait_once(&holder, &waiter, "warm-up").await;
    let heard = holder.waited_for_notices_heard();
    let guard = holder.lock("k").acquire().await.unwrap();
    let waiting = spawn_waiter(&waiter, "k");
    eventually(Duration::from_secs(5), async || {
        holder.waited_for_notices_heard() > heard
    })
    .await
    .expect("the holder's manager hears that a waiter queued");
    let mut raw = raw(&redis).await;
    let queue = all_keys(&mut raw)
        .await
        .into_iter()
        .find(|k| k.contains("lockq:") && k.ends_with(":k"))
        .expect("the queue's key");
    let _: () = redis::pipe()
        .atomic()
        .del(&queue)
        .set(&queue, "not a queue")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = guard.release().await.unwrap_err();
    assert_server_error(&err, "WRONGTYPE");
    del(&mut raw, &queue).await;
    let handed = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter holds once the queue's key is gone")
        .unwrap();
    assert!(handed.is_ok(), "{handed:?}");
}
