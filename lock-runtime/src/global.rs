//! The process-wide default manager used by `#[distributed_lock]` without `manager = ...`.

use std::sync::OnceLock;

use crate::error::LockError;
use crate::manager::LockManager;

static GLOBAL: OnceLock<LockManager> = OnceLock::new();
static FROM_ENV: tokio::sync::OnceCell<LockManager> = tokio::sync::OnceCell::const_new();

/// Sets the manager that locked functions use when they name none.
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

/// The global manager, or one connected on first use to `DISTLOCK_REDIS_URL` or
/// `REDIS_URL`. The manager built from the environment runs its background tasks
/// on the runtime that first asked for it.
pub async fn default_manager() -> Result<LockManager, LockError> {
    if let Some(manager) = global() {
        return Ok(manager);
    }
    FROM_ENV
        .get_or_try_init(|| async {
            let url = std::env::var("DISTLOCK_REDIS_URL")
                .or_else(|_| std::env::var("REDIS_URL"))
                .map_err(|_| LockError::NotConfigured)?;
            LockManager::connect(&url).await
        })
        .await
        .cloned()
}
