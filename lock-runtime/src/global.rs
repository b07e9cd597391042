//! The default manager used by `#[distributed_lock]` without `manager = ...`,
//! and [`spawn_with_locks`], which hands a subtask the call chain's holds and
//! its default manager.
//!
//! In order: the manager of the current call chain's [`with_default_manager`]
//! scope, the one set with [`set_global`], or one built on first use from the
//! first of `DISTLOCK_URL` (any store's URL: `redis://`, `postgres://`, ...),
//! `DISTLOCK_REDIS_URL` and `REDIS_URL` that is set.
//!
//! The manager built from the environment runs its background work (renewal,
//! wake-ups, the connection's own tasks) on a small runtime of its own, not on
//! the runtime that first asked for it: a test suite runs each `#[tokio::test]`
//! on a runtime of its own and ends it with the test, which would otherwise take
//! the manager's tasks down with the first test.

use std::future::Future;
use std::sync::OnceLock;

use crate::context::LockContext;
use crate::error::LockError;
use crate::manager::LockManager;

static GLOBAL: OnceLock<LockManager> = OnceLock::new();
static FROM_ENV: tokio::sync::OnceCell<LockManager> = tokio::sync::OnceCell::const_new();
static BACKGROUND: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();

tokio::task_local! {
    static SCOPED: LockManager;
}

/// Sets the manager that locked functions use when they name none.
///
/// Its background tasks run on the runtime it was built on, so build it on a
/// runtime that lives as long as the program (in tests, where each test has its
/// own runtime, use [`with_default_manager`] instead).
///
/// # Errors
/// [`LockError::InvalidConfig`] if a global manager was already set; the first
/// one stays.
pub fn set_global(manager: LockManager) -> Result<(), LockError> {
    GLOBAL
        .set(manager)
        .map_err(|_| LockError::InvalidConfig("a global lock manager is already set".to_owned()))
}

/// The manager set with [`set_global`], if any.
pub fn global() -> Option<LockManager> {
    GLOBAL.get().cloned()
}

/// Runs `fut` with `manager` as the default manager of its call chain: locked
/// functions that name no manager use it, in `fut` and everything it awaits
/// (not in tasks it spawns, unless spawned with
/// [`spawn_with_locks`](crate::spawn_with_locks)).
///
/// The way to give each test its own Redis and its own manager (the facade's
/// crate documentation shows it with `#[distributed_lock]`):
///
/// ```no_run
/// # async fn demo(manager: distlock_runtime::LockManager) {
/// # async fn locked_job(id: u64) -> u64 { id }
/// // `locked_job` stands for a function under `#[distributed_lock]` without
/// // `manager = ...`: inside this future, it uses `manager`.
/// let ran = distlock_runtime::with_default_manager(manager, async { locked_job(7).await }).await;
/// # let _ = ran;
/// # }
/// ```
pub async fn with_default_manager<F: Future>(manager: LockManager, fut: F) -> F::Output {
    SCOPED.scope(manager, fut).await
}

/// Spawns a task that inherits the locks the current call chain holds.
///
/// A `tokio::spawn`ed task is a different owner: acquiring a lock its parent holds
/// waits like any other caller. `spawn_with_locks` hands the parent's holds to the
/// subtask on purpose, so that it re-enters them instead. The subtask's re-entrant
/// guards keep the lock held until they are released, even if the parent releases
/// first; once every holder has released, the subtask acquires afresh.
///
/// The subtask also keeps the call chain's default manager
/// ([`with_default_manager`]), so that a locked function it calls without
/// `manager = ...` re-enters there too.
///
/// Must be called from within a tokio runtime, like `tokio::spawn`.
///
/// ```no_run
/// # use distlock_runtime::{LockError, LockManager};
/// # async fn demo(manager: LockManager) -> Result<(), LockError> {
/// let guard = manager.lock("report:7").acquire().await?;
/// let m = manager.clone();
/// let child = guard
///     .scope(async move {
///         distlock_runtime::spawn_with_locks(async move {
///             // Re-enters the parent's hold at once instead of waiting for it.
///             let again = m.lock("report:7").acquire().await?;
///             again.release().await
///         })
///     })
///     .await;
/// child.await.expect("subtask panicked")?;
/// guard.release().await
/// # }
/// ```
pub fn spawn_with_locks<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let holding = LockContext::current().scope(fut);
    match SCOPED.try_with(LockManager::clone) {
        Ok(manager) => tokio::spawn(SCOPED.scope(manager, holding)),
        Err(_) => tokio::spawn(holding),
    }
}

/// The default manager for a locked function that names none.
///
/// # Errors
/// [`LockError::NotConfigured`] when there is none and no URL in the
/// environment; [`LockError::InvalidConfig`] when the global manager's runtime
/// has shut down (it was built on a runtime that has ended, such as another
/// test's); and what [`LockManager::connect`] returns for the URL.
pub async fn default_manager() -> Result<LockManager, LockError> {
    if let Ok(manager) = SCOPED.try_with(LockManager::clone) {
        return Ok(manager);
    }
    if let Some(manager) = global() {
        if !manager.is_running() {
            return Err(LockError::InvalidConfig(
                "the global lock manager was built on a tokio runtime that has shut down; \
                 set_global a manager built on a runtime that lives as long as the program \
                 (in tests, use distlock::with_default_manager)"
                    .to_owned(),
            ));
        }
        return Ok(manager);
    }
    if let Some(manager) = FROM_ENV.get() {
        return Ok(manager.clone());
    }
    let url = url_from(|name| std::env::var(name).ok()).ok_or(LockError::NotConfigured)?;
    built_once(&FROM_ENV, background_runtime()?, async move {
        LockManager::connect(&url).await
    })
    .await
}

/// Shuts down the manager that locked functions built from the environment
/// (`DISTLOCK_URL`, `DISTLOCK_REDIS_URL`, `REDIS_URL`), if they built one:
/// see [`LockManager::shutdown`]. A program whose locked functions use it
/// calls this before `main` returns. That manager runs on a runtime of its
/// own, which the process's exit ends where it stands: a guard dropped as
/// the program ends (a locked call cancelled by a `select!` on ctrl-c) is
/// released by a task of that runtime, which the exit would cut short,
/// leaving the lock to its lease. Afterwards locked functions that use it
/// fail with [`LockError::ShutDown`]. Does nothing when none was built (a
/// locked function called later builds one), and a manager given to
/// [`set_global`] is shut down through its own handle.
///
/// ```no_run
/// # async fn run() {}
/// #[tokio::main]
/// async fn main() -> Result<(), distlock_runtime::LockError> {
///     tokio::select! {
///         () = run() => {}
///         _ = tokio::signal::ctrl_c() => {}
///     }
///     distlock_runtime::shutdown_default_manager().await
/// }
/// ```
///
/// # Errors
/// As [`LockManager::shutdown`].
pub async fn shutdown_default_manager() -> Result<(), LockError> {
    match FROM_ENV.get() {
        Some(manager) => manager.shutdown().await,
        None => Ok(()),
    }
}

/// What `cell` holds, built by `build` on `runtime` if it holds nothing yet.
/// The build runs in a task of its own, which fills the cell itself: a
/// caller that stops waiting (a request's timeout, a `select!`) leaves it to
/// finish for the next caller, which would otherwise start it over (and,
/// with every caller's budget shorter than the build, never get a manager).
/// A build that fails leaves the cell empty: the next caller tries again. A
/// task whose caller left before its turn came builds nothing: through an
/// outage, abandoned tasks would otherwise each run a build in turn, ahead
/// of the callers still waiting.
async fn built_once<T, F>(
    cell: &'static tokio::sync::OnceCell<T>,
    runtime: &tokio::runtime::Runtime,
    build: F,
) -> Result<T, LockError>
where
    T: Clone + Send + Sync + 'static,
    F: Future<Output = Result<T, LockError>> + Send + 'static,
{
    let waiting = std::sync::Arc::new(());
    let caller = std::sync::Arc::downgrade(&waiting);
    let built = runtime
        .spawn(async move {
            cell.get_or_try_init(|| async move {
                if caller.strong_count() == 0 {
                    return Err(LockError::InvalidConfig(
                        "nobody waits for this build of the default manager".to_owned(),
                    ));
                }
                build.await
            })
            .await
            .cloned()
        })
        .await;
    drop(waiting);
    built.map_err(|e| {
        LockError::InvalidConfig(format!("building the default manager failed: {e}"))
    })?
}

/// The default manager's URL from the environment variables `var` reads:
/// `DISTLOCK_URL`, else `DISTLOCK_REDIS_URL`, else `REDIS_URL`. A variable
/// set but empty (as a compose file's `${DISTLOCK_URL}` leaves it) counts as
/// unset, as the CLI reads them.
fn url_from(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    ["DISTLOCK_URL", "DISTLOCK_REDIS_URL", "REDIS_URL"]
        .into_iter()
        .find_map(|name| var(name).filter(|value| !value.trim().is_empty()))
}

/// The runtime the environment's manager runs on: one worker thread, for the
/// life of the process.
fn background_runtime() -> Result<&'static tokio::runtime::Runtime, LockError> {
    BACKGROUND
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("distlock-default-manager")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            LockError::InvalidConfig(format!("cannot start the default manager's runtime: {e}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives `attempt` until `builds` shows its build has begun, then drops
    /// it: a caller whose timeout comes during the build.
    async fn give_up_once_begun<T>(
        attempt: impl Future<Output = Result<T, LockError>>,
        builds: &std::sync::atomic::AtomicU64,
    ) {
        let begun = async {
            while builds.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        };
        tokio::select! {
            _ = attempt => panic!("the build ended before its caller gave up"),
            () = begun => {}
        }
    }

    /// A background runtime as the default manager's, and one for callers.
    fn runtimes() -> (tokio::runtime::Runtime, tokio::runtime::Runtime) {
        let background = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let caller = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (background, caller)
    }

    #[test]
    fn a_build_whose_caller_stopped_waiting_is_kept_for_the_next_caller() {
        static CELL: tokio::sync::OnceCell<u64> = tokio::sync::OnceCell::const_new();
        static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let build = || async {
            BUILDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
            Ok(7)
        };
        let (background, caller) = runtimes();
        caller.block_on(async {
            // The first caller gives up once the 1 s build has begun.
            give_up_once_begun(built_once(&CELL, &background, build()), &BUILDS).await;
            assert_eq!(built_once(&CELL, &background, build()).await.unwrap(), 7);
        });
        assert_eq!(
            BUILDS.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the next caller started the build over"
        );
    }

    #[test]
    fn a_build_whose_caller_left_before_its_turn_is_not_run() {
        static CELL: tokio::sync::OnceCell<u64> = tokio::sync::OnceCell::const_new();
        static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let failing = || async {
            BUILDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            Err::<u64, _>(LockError::NotConfigured)
        };
        let (background, caller) = runtimes();
        caller.block_on(async {
            // The first build runs (its caller was there when it began);
            // five callers queue behind it and leave long before its 3 s
            // end.
            give_up_once_begun(built_once(&CELL, &background, failing()), &BUILDS).await;
            for _ in 0..5 {
                let attempt = built_once(&CELL, &background, failing());
                let gives_up = std::time::Duration::from_millis(20);
                assert!(tokio::time::timeout(gives_up, attempt).await.is_err());
            }
            // A caller that stays gets the next build's answer: the first
            // failed, and none of the five abandoned ones ran.
            assert!(built_once(&CELL, &background, failing()).await.is_err());
        });
        assert_eq!(BUILDS.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn an_empty_variable_counts_as_unset() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            url_from(env(&[("DISTLOCK_URL", ""), ("REDIS_URL", "redis://r")])),
            Some("redis://r".to_owned())
        );
        assert_eq!(
            url_from(env(&[
                ("DISTLOCK_URL", "redis://d"),
                ("REDIS_URL", "redis://r")
            ])),
            Some("redis://d".to_owned())
        );
        assert_eq!(url_from(env(&[("DISTLOCK_REDIS_URL", "  ")])), None);
    }
}
