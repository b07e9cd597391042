//! `LockGuard`: a held lock, released on every exit.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::error::{KeyPreview, LockError};
use crate::keys::LockKeys;
use crate::lease::Lease;
use crate::manager::{Core, LockManager};

/// A held lock. Dropping it releases the lock in the background; [`release`]
/// releases it and reports how that went.
///
/// The lease is renewed in the background while the guard lives (unless the
/// request turned renewal off). If the lease is lost — the renewal found the lock
/// gone or taken over, or could not reach Redis before the lease ran out on this
/// machine's clock — [`is_lost`] turns true and [`lost`] completes; work still
/// running should stop, and writes should carry the [`fencing_token`] so that
/// storage can reject them.
///
/// [`release`]: LockGuard::release
/// [`is_lost`]: LockGuard::is_lost
/// [`lost`]: LockGuard::lost
/// [`fencing_token`]: LockGuard::fencing_token
#[must_use = "dropping the guard at once releases the lock at once"]
pub struct LockGuard {
    manager: LockManager,
    lease: Arc<Lease>,
    /// Set by `release`, so that `Drop` has nothing left to do.
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lease.key)
            .field("fencing_token", &self.lease.fencing_token)
            .field("lost", &self.lease.is_lost())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(manager: LockManager, lease: Arc<Lease>) -> Self {
        LockGuard {
            manager,
            lease,
            released: false,
        }
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.lease.key
    }

    /// The fencing token of this acquisition: greater than every token issued
    /// earlier for this key, also across Redis restarts. Re-entrant guards share
    /// the outer acquisition's token. Pass it to storage that rejects writes with
    /// a token lower than one it has seen.
    pub fn fencing_token(&self) -> u64 {
        self.lease.fencing_token
    }

    /// The lease this lock was taken with.
    pub fn lease(&self) -> Duration {
        self.lease.lease
    }

    /// True once the lease is lost. Checks the local deadline itself, so it is
    /// right even when the renewal task has not run.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Completes when the lease is lost (at once if it already is); never
    /// completes while the lease holds.
    pub async fn lost(&self) {
        self.lease.lost().await
    }

    /// How long this holder may still trust its lease without another renewal
    /// (zero once lost).
    pub fn remaining_lease(&self) -> Duration {
        self.lease.remaining()
    }

    /// Runs `fut` with this hold in the call chain's lock context: inside it,
    /// acquiring the same key on the same manager re-enters at once (same lease,
    /// same fencing token) instead of waiting for ourselves.
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        crate::context::scope_with(&self.lease, fut).await
    }

    /// Like [`scope`](Self::scope), but stops `fut` when the lease is lost: `fut`
    /// is dropped at its next poll (so no `.await` in it completes after the loss
    /// is known) and the result is `Err(LockError::Lost)`.
    pub async fn scope_until_lost<F: Future>(&self, fut: F) -> Result<F::Output, LockError> {
        let mut body = pin!(self.scope(fut));
        let mut lost = pin!(self.lease.lost());
        poll_fn(|cx| {
            if self.lease.is_lost() {
                return Poll::Ready(Err(self.lost_error()));
            }
            if let Poll::Ready(out) = body.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            match lost.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(self.lost_error())),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.lease.key.clone(),
        }
    }

    /// Releases this hold: one round trip that deletes the lock if it is still
    /// ours and wakes the waiters. A re-entrant hold only gives back its count;
    /// the lock goes when the last hold of the call chain is released.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lease had been lost (the lock is released
    /// anyway if it is still ours); [`LockError::Backend`] when Redis fails, in
    /// which case the release is retried in the background until the lease ends.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        let lease = self.lease.clone();
        if !lease.drop_hold() {
            return if lease.is_lost() {
                Err(self.lost_error())
            } else {
                Ok(())
            };
        }
        let core = &self.manager.inner.core;
        let was_lost = lease.mark_released();
        core.renewals.remove(lease.id);
        let mut conn = core.conn.clone();
        let started = Instant::now();
        match core
            .call(
                &lease.key,
                core.scripts.release(&mut conn, &lease.keys, &lease.owner),
            )
            .await
        {
            Ok(true) if !was_lost => {
                tracing::debug!(
                    key = %KeyPreview(&lease.key),
                    took_us = started.elapsed().as_micros() as u64,
                    "distlock: released"
                );
                Ok(())
            }
            Ok(deleted) => {
                if !was_lost {
                    tracing::warn!(
                        key = %KeyPreview(&lease.key),
                        fencing_token = lease.fencing_token,
                        "distlock: lease lost: at release the lock was no longer ours"
                    );
                }
                tracing::debug!(deleted, "distlock: released a lost lease");
                Err(self.lost_error())
            }
            Err(e) => {
                tracing::warn!(
                    key = %KeyPreview(&lease.key),
                    error = %e.error,
                    "distlock: release failed; retrying in the background"
                );
                release_in_background(
                    core,
                    lease.key.clone(),
                    lease.keys.clone(),
                    lease.owner.clone(),
                    lease.lease,
                );
                Err(e.error)
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released || !self.lease.drop_hold() {
            return;
        }
        let core = &self.manager.inner.core;
        self.lease.mark_released();
        core.renewals.remove(self.lease.id);
        release_in_background(
            core,
            self.lease.key.clone(),
            self.lease.keys.clone(),
            self.lease.owner.clone(),
            self.lease.lease,
        );
    }
}

/// Deletes the lock if `owner` still holds it, from a task of its own, retrying
/// until it succeeds or the lease has run out anyway. Never blocks; when the
/// runtime is gone, the lease is the fallback.
pub(crate) fn release_in_background(
    core: &Arc<Core>,
    key: String,
    keys: LockKeys,
    owner: String,
    lease: Duration,
) {
    let task_core = core.clone();
    let give_up = Instant::now() + lease;
    let retry_cap = (lease / 3).max(Duration::from_millis(5));
    // Spawning on a runtime that is shutting down drops the task instead of
    // running it; the lease then frees the lock.
    drop(core.runtime.spawn(async move {
        let core = task_core;
        let mut delay = Duration::from_millis(5);
        loop {
            let mut conn = core.conn.clone();
            match core
                .call(&key, core.scripts.release(&mut conn, &keys, &owner))
                .await
            {
                Ok(deleted) => {
                    tracing::debug!(key = %KeyPreview(&key), deleted, "distlock: released in the background");
                    return;
                }
                Err(e) if Instant::now() + delay < give_up => {
                    tracing::debug!(key = %KeyPreview(&key), error = %e.error, "distlock: background release failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(retry_cap);
                }
                Err(e) => {
                    tracing::warn!(
                        key = %KeyPreview(&key),
                        error = %e.error,
                        "distlock: could not release; the lease will free the lock"
                    );
                    return;
                }
            }
        }
    }));
}
