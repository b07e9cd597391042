//! `LockGuard`: a held lock, released on every exit.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::backend::{LeaseEnd, Renewal};
use crate::core::{Core, ManagerInner};
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::lease::{Lease, NewLease};
use crate::release::{drop_holds, release_holds, release_lease_in_background};

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
    /// Keeps the manager's background tasks (renewal above all) running.
    manager: Arc<ManagerInner>,
    lease: Arc<Lease>,
    /// Set by `release`, so that `Drop` has nothing left to do.
    released: bool,
    /// The `distlock.hold` span of the acquisition that granted the lock (none
    /// for a re-entry); it ends with the guard.
    hold_span: tracing::Span,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lease.key)
            .field("fencing_token", &self.lease.fencing_token())
            .field("lost", &self.lease.is_lost())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(manager: Arc<ManagerInner>, lease: Arc<Lease>) -> Self {
        LockGuard {
            manager,
            lease,
            released: false,
            hold_span: tracing::Span::none(),
        }
    }

    /// Hands this guard's hold over to the caller (a `MultiLockGuard`), which
    /// then owns one hold of the lease and must give it back: the guard itself
    /// neither releases nor drops a hold.
    pub(crate) fn into_lease(mut self) -> Arc<Lease> {
        self.released = true;
        self.lease.clone()
    }

    /// The hold's lease, whose lost signal outlives the guard's move into a
    /// task (leader election's `run`).
    pub(crate) fn lease_handle(&self) -> Arc<Lease> {
        self.lease.clone()
    }

    /// The manager, for guards made from this one's hold (permits.rs).
    pub(crate) fn manager(&self) -> &Arc<ManagerInner> {
        &self.manager
    }

    /// The manager's shared state (ticket.rs, permits.rs).
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.manager.core
    }

    /// Puts `lease` in place of this guard's (`LockGuard::release_permits`,
    /// whose kept permits are a hold under another owner token).
    pub(crate) fn replace_lease(&mut self, lease: Arc<Lease>) {
        self.lease = lease;
    }

    pub(crate) fn set_hold_span(&mut self, span: tracing::Span) {
        self.hold_span = span;
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.lease.key
    }

    /// The fencing token of this hold: greater than every token issued
    /// earlier for this key to a holder that took one, also across Redis
    /// restarts. Pass it to storage that rejects writes with a token lower
    /// than one it has seen. Re-entrant guards share the outer hold's token.
    ///
    /// Fencing is on demand: unless the acquisition asked for its token
    /// eagerly ([`LockRequest::eager_fencing`](crate::LockRequest::eager_fencing)),
    /// the first call issues it in one round trip (a script that checks the
    /// hold is still ours, takes the next token and records it in the lock, so
    /// `inspect` and the CLI show it); later calls are local.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lease is lost (or found lost now: no token
    /// is issued to a holder that lost its lock), [`LockError::Backend`] when
    /// Redis fails, [`LockError::TokenNotReplicated`] when
    /// [`replica_ack`](crate::LockManagerBuilder::replica_ack) is on and too
    /// few replicas confirmed the token issued (the lock stays held).
    pub async fn fencing_token(&self) -> Result<u64, LockError> {
        fencing_token_of(&self.manager.core, &self.lease).await
    }

    /// The fencing token, if this hold has one already (taken eagerly, or by
    /// an earlier [`fencing_token`](Self::fencing_token) call); `None` until
    /// then. Never a round trip.
    pub fn issued_fencing_token(&self) -> Option<u64> {
        Some(self.lease.fencing_token()).filter(|&token| token != 0)
    }

    /// The lease this lock was taken with.
    pub fn lease(&self) -> Duration {
        self.lease.duration()
    }

    /// Sets a new lease: the lock's TTL in Redis becomes `lease` from now (it
    /// replaces the time left, never adds to it), and later renewals keep that
    /// length. One round trip. Re-entrant guards share the outer lease, so
    /// extending one extends them all. A lease shorter than the one left
    /// shortens the holder's deadline too.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a lease outside 10 ms to 30 days,
    /// [`LockError::Lost`] when the lease was lost (or is found lost now, or
    /// was told lost while the call was out: the loss stands, and the
    /// release deletes the lock the store kept),
    /// [`LockError::Backend`] when the store fails. The store may or may not
    /// have taken the new lease then (a reply lost after it ran): the holder
    /// trusts the shorter of the old deadline and the new lease from the
    /// call, and later renewals use the new length (renewals never shorten
    /// what the store keeps, so after a failed extend to a shorter lease the
    /// lock may stay until the old lease's end if the holder dies). The same
    /// holds when the returned future is dropped before it completes.
    ///
    /// An extend that failed may still run later (sent on a connection
    /// replaced for silence, whose session was alive): if another extend
    /// went through meanwhile, the late one's lease wins. Call `extend` again
    /// after a failed one only with a lease no longer than the failed one's,
    /// or wait for the lease to be renewed first; renewals, which never
    /// shorten, are not affected.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        crate::config::validate_lease(lease, "lease")?;
        let lease = Duration::from_millis(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
        if self.lease.is_lost() {
            return Err(self.lost_error());
        }
        self.lease.set_lease(lease);
        let lease_ms = self.lease.lease_ms();
        let core = &self.manager.core;
        // A shorter lease binds the holder from now on, answered or not, and
        // the renewal task must come sooner than it planned.
        self.lease.shorten_to_new_length(Instant::now());
        core.renewals.rescheduled(&self.lease);
        let renew_once = || async {
            core.backend
                .renew(std::slice::from_ref(&self.lease), LeaseEnd::ExactlyALease)
                .await
                .pop()
        };
        let mut outcome = renew_once().await;
        if matches!(outcome, Some(Renewal::Retry)) {
            // The cause is fixed (a script reloaded after NOSCRIPT, a slot map
            // refreshed, a new master found): once more, as the renewal task
            // would, rather than hand the caller a retry.
            outcome = renew_once().await;
        }
        match outcome {
            Some(Renewal::Renewed { sent_at }) => {
                self.lease.extended(sent_at, lease_ms);
                // Told lost while the call was out (its local deadline
                // passed, or the shutdown ended it): the loss stands, as the
                // holder may have acted on it. The store keeps the lock for
                // the new lease until the guard's release deletes it.
                if self.lease.is_lost() {
                    return Err(self.lost_error());
                }
                core.renewals.rescheduled(&self.lease);
                Ok(())
            }
            Some(Renewal::NotOurs) => {
                self.lease
                    .mark_lost("extend found the lock gone or held by another owner");
                Err(self.lost_error())
            }
            Some(Renewal::Failed(reason)) => Err(LockError::Backend {
                key: self.lease.key.clone(),
                source: BackendError::new(
                    BackendErrorKind::Connection,
                    format!("extend failed: {reason}"),
                ),
            }),
            Some(Renewal::Retry) | None => Err(LockError::Backend {
                key: self.lease.key.clone(),
                source: BackendError::new(
                    BackendErrorKind::Other,
                    "extend failed: Redis asked twice in a row to retry the renewal",
                ),
            }),
        }
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

    /// Completes at the next renewal of this lease that fails (Redis failed or
    /// did not answer in time) or comes late (sent more than a tenth of the
    /// lease after it was due), while the lease still holds: an early warning,
    /// before [`lost`](Self::lost), to log or shed work. Renewal goes on
    /// after a trouble; call it again for the next one. Never completes for a
    /// request without renewal.
    ///
    /// ```no_run
    /// # async fn demo(guard: distlock_runtime::LockGuard) {
    /// tokio::select! {
    ///     trouble = guard.renewal_trouble() => tracing::warn!(?trouble, "lock renewal in trouble"),
    ///     () = guard.lost() => tracing::error!("lock lost"),
    /// }
    /// # }
    /// ```
    pub async fn renewal_trouble(&self) -> crate::RenewalTrouble {
        self.lease.next_trouble().await
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
    /// ours and wakes the waiters (before the request's
    /// [`min_hold`](crate::LockRequest::min_hold) has passed, it sets the lock
    /// to expire when it does instead). A re-entrant hold only gives back its count;
    /// the lock goes when the last hold of the call chain is released.
    ///
    /// # Errors
    /// [`LockError::Lost`] when the lease had been lost (the lock is released
    /// anyway if it is still ours), also when the release's call fails;
    /// [`LockError::Backend`] when Redis fails, in which case the release is
    /// retried in the background until the lease ends.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        release_holds(&self.manager.core, std::slice::from_ref(&self.lease)).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            drop_holds(&self.manager.core, std::slice::from_ref(&self.lease));
        }
    }
}

/// Turns a lock just taken in Redis into a held lease, the one grant step of
/// every acquisition (single-key and multi-key): registered with the renewal
/// task and counted as acquired. A lock `handed_off` by a release got that
/// TTL counted from the attempt sent at `new.sent_at`. If the manager was
/// shut down while the acquisition was in flight, the lock goes straight back
/// in the background (unless `resumed` from a ticket) and the caller gets
/// [`LockError::ShutDown`]; if the reply came after the lease's deadline,
/// [`LockError::Lost`] (the lock goes back too, unless `resumed`).
pub(crate) fn grant(
    core: &Arc<Core>,
    new: NewLease,
    started: Instant,
    handed_off: Option<Duration>,
    resumed: bool,
) -> Result<Arc<Lease>, LockError> {
    let (sent_at, metrics_label) = (new.sent_at, new.hold.metrics_label);
    let lease = Arc::new(Lease::new(new));
    if let Some(ttl) = handed_off {
        lease.handed_off(sent_at, ttl);
    }
    // The grant's reply came after the lease it started had ended (a round
    // trip, or the replicas' acknowledgement, longer than the lease, less
    // the drift allowance): the lock may be another's by now, so no guard is
    // handed out. What the store may still keep of it is given back, unless
    // it is a ticket's hold, which other guards resumed from the ticket
    // may share.
    if Instant::now() >= lease.valid_until() {
        lease.mark_never_held();
        if !resumed {
            release_lease_in_background(core, &lease, None);
        }
        tracing::debug!(target: "distlock::acquire",
            key = %crate::error::KeyPreview(&lease.key),
            "the grant's lease ended before its reply came; not handed out"
        );
        return Err(LockError::Lost {
            key: lease.key.clone(),
        });
    }
    if !core.renewals.insert(lease.clone()) {
        lease.mark_released();
        // The holder never had it: no min_hold to keep. A ticket's hold
        // stays, as above: the ticket may be resumed again elsewhere.
        if !resumed {
            release_lease_in_background(core, &lease, None);
        }
        return Err(LockError::ShutDown {
            key: lease.key.clone(),
        });
    }
    crate::telemetry::acquired(metrics_label, || started.elapsed());
    Ok(lease)
}

/// The fencing token of `lease`, issued now if it has none (see
/// [`LockGuard::fencing_token`]).
pub(crate) async fn fencing_token_of(core: &Core, lease: &Lease) -> Result<u64, LockError> {
    let token = lease.fencing_token();
    if token != 0 {
        return Ok(token);
    }
    if lease.is_lost() {
        return Err(LockError::Lost {
            key: lease.key.clone(),
        });
    }
    let retention_ms = u64::try_from(core.config.fence_retention.as_millis()).unwrap_or(u64::MAX);
    let fence_ttl_ms = lease.lease_ms().saturating_add(retention_ms);
    match core
        .backend
        .issue_token(
            &lease.key,
            &lease.keys,
            &lease.owner,
            fence_ttl_ms,
            core.config.replica_ack,
        )
        .await
        .map_err(|e| e.error)?
    {
        Some(token) => {
            lease.set_fencing_token(token);
            Ok(token)
        }
        None => {
            lease
                .mark_lost("the fencing token script found the lock gone or held by another owner");
            Err(LockError::Lost {
                key: lease.key.clone(),
            })
        }
    }
}
