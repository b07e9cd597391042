//! distlock-testing as a user sees it: a private server, a manager, a locked function.

use std::sync::atomic::{AtomicU32, Ordering};

use distlock::LockManager;
use distlock_external_user::run_job;
use distlock_testing::RedisServer;

#[tokio::test]
async fn locked_function_runs_against_a_private_server() -> Result<(), Box<dyn std::error::Error>> {
    let server = RedisServer::spawn()?;
    let locks = LockManager::connect(&server.url()).await?;
    let runs = AtomicU32::new(0);
    assert_eq!(run_job(&locks, 21, &runs).await?, 42);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The attribute released the lock on return: another owner gets it at once.
    let guard = locks
        .lock("job:21")
        .try_acquire()
        .await?
        .ok_or("job:21 is still locked")?;
    guard.release().await?;
    Ok(())
}
