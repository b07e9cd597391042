//! A locked function without `manager = ...` on PostgreSQL: the default
//! manager built from `DISTLOCK_URL=postgres://...`. One test in its own
//! binary, because it sets process-wide state (the environment, the default
//! manager built once from it).

mod common;

use std::time::Duration;

use common::*;
use distlock::{distributed_lock, LockError, LockManager};

// Holds "nightly" until told to finish, and returns its fencing token.
#[distributed_lock(key = "nightly", guard = lock)]
async fn nightly(
    started: tokio::sync::oneshot::Sender<()>,
    finish: tokio::sync::oneshot::Receiver<()>,
) -> Result<u64, LockError> {
    let token = lock.fencing_token().await?;
    let _ = started.send(());
    let _ = finish.await;
    Ok(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_manager_comes_from_a_postgres_url() {
    let pg = postgres_server();
    // Env changes are safe here: this binary runs one test.
    std::env::remove_var("DISTLOCK_REDIS_URL");
    std::env::remove_var("REDIS_URL");
    std::env::set_var("DISTLOCK_URL", pg.url());
    // An observer on the same server and schema (the default one).
    let observer = LockManager::builder(&pg.url()).build().await.unwrap();

    let (started, started_rx) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel();
    let run = tokio::spawn(nightly(started, finish_rx));
    started_rx.await.expect("the body ran");
    // The body holds the lock on this server while it runs.
    let info = observer.inspect("nightly").await.unwrap().expect("held");
    assert!(info.fencing_token > 0);
    assert!(observer
        .lock("nightly")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    finish.send(()).unwrap();
    let token = run.await.unwrap().unwrap();
    assert_eq!(token, info.fencing_token);
    // Released at the end of the body.
    let freed = eventually(Duration::from_secs(5), async || {
        !observer.is_locked("nightly").await.unwrap()
    })
    .await;
    assert!(freed.is_some(), "released after the body");
}
