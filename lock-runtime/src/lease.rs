//! The state one acquisition shares between its guards and the renewal task.
//!
//! A re-entrant acquisition in the same call chain shares the `Lease` of the outer
//! one (same owner token, same fencing token) and only counts one more hold.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::keys::RedisNames;
use crate::options::Hold;

const HELD: u8 = 0;
const LOST: u8 = 1;
const RELEASED: u8 = 2;
/// Released by this lease, its hold not: a ticket or a renamed hold owns it.
const HANDED_OVER: u8 = 3;

/// What the holder may safely assume of its lease: it trusts the lease only until
/// `renewal sent + lease - drift` on its own clock, where drift covers the rate
/// difference between its clock and Redis's.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// Milliseconds (rounded up) from now to `until`, 0 when it has passed or is
/// `None`: what a release passes as `keep_ms` for a `min_hold`.
pub(crate) fn keep_ms(until: Option<Instant>) -> u64 {
    let Some(until) = until else { return 0 };
    let left = until.saturating_duration_since(Instant::now());
    let ms = left.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) manager_id: u64,
    pub(crate) key: String,
    pub(crate) keys: RedisNames,
    pub(crate) owner: String,
    /// The hold's fencing token; 0 until one is issued (at the acquisition
    /// with eager fencing, else at the holder's first request for it).
    fencing_token: AtomicU64,
    /// The lease in milliseconds; `LockGuard::extend` may change it.
    lease_ms: AtomicU64,
    pub(crate) renew: bool,
    /// The request's `metrics_label`, for the metrics of this hold.
    pub(crate) metrics_label: Option<&'static str>,
    /// The acquisition waited for the lock, so its release goes straight to
    /// the script that hands the lock over (see `Backend::release`).
    pub(crate) waited: bool,
    /// When the acquisition that granted it was sent.
    pub(crate) granted_at: Instant,
    /// The holder gives the lock up (its lease turns lost) at this instant, if
    /// the request set a `max_hold`.
    max_hold_until: Option<Instant>,
    /// The lock stays taken until this instant, released or not, if the request
    /// set a `min_hold`: the acquisition's reply arrived at `min_hold_until -
    /// min_hold` (monotonic clock), and a release before then keeps the lock
    /// for the rest (see [`Lease::keep_ms`]), unless
    /// [`forgone`](Lease::forgo_min_hold).
    min_hold_until: Option<Instant>,
    /// Set when the acquisition that took the lock failed as a whole (a
    /// `lock_all` that could not take its other keys): its caller never held
    /// it, so `min_hold` keeps nothing.
    min_hold_forgone: AtomicBool,
    epoch: Instant,
    /// Local validity deadline, nanoseconds after `epoch`.
    valid_until: AtomicU64,
    /// When the renewal task should next renew, nanoseconds after `epoch`.
    next_renewal: AtomicU64,
    /// How much earlier than `next_renewal` the task may renew, in
    /// nanoseconds, so that leases due close together share a batch: a
    /// quarter of the period that ends at `next_renewal` (see
    /// [`Lease::renewal_window`]).
    renewal_window: AtomicU64,
    state: AtomicU8,
    holds: AtomicUsize,
    lost_notify: Notify,
    /// The latest renewal trouble (a failed or late renewal), for holders
    /// that watch for it (`LockGuard::renewal_trouble`), who wait on
    /// `trouble_notify`. Not a `watch` channel: that allocates at every grant
    /// and wakes its (absent) receivers at every release, while a trouble is
    /// rare and few holders watch for one.
    trouble: std::sync::Mutex<Option<RenewalTrouble>>,
    trouble_notify: Notify,
}

/// A renewal that failed or came late while the lease still held: the lease may
/// be lost soon if this goes on. From [`LockGuard::renewal_trouble`], so that a
/// holder can log it or shed work before [`LockGuard::lost`].
///
/// [`LockGuard::renewal_trouble`]: crate::LockGuard::renewal_trouble
/// [`LockGuard::lost`]: crate::LockGuard::lost
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewalTrouble {
    /// A renewal failed (Redis failed or did not answer in time); the renewal
    /// is retried, sooner than a full interval.
    Failed {
        /// What went wrong.
        error: String,
        /// How long the holder may still trust its lease.
        remaining: Duration,
    },
    /// A renewal was sent later than it was due by more than a tenth of the
    /// lease (a starved runtime or a blocked thread), and succeeded.
    Late {
        /// How late it was sent.
        late_by: Duration,
        /// How long the lease had left when it was sent.
        remaining: Duration,
    },
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("fencing_token", &self.fencing_token())
            .field("duration", &self.duration())
            .field("renew", &self.renew)
            .field("state", &self.state.load(Ordering::Relaxed))
            .field("holds", &self.holds.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

pub(crate) struct NewLease {
    pub(crate) id: u64,
    pub(crate) manager_id: u64,
    pub(crate) key: String,
    pub(crate) keys: RedisNames,
    pub(crate) owner: String,
    pub(crate) fencing_token: u64,
    /// The request's options: the lease, renewal, `max_hold`, `min_hold` and
    /// metrics label of this hold.
    pub(crate) hold: Hold,
    pub(crate) epoch: Instant,
    /// When the acquire that set the lease in Redis was sent.
    pub(crate) sent_at: Instant,
    /// When its reply arrived: the lock was taken between the two, so
    /// `min_hold` counts from here (at least `min_hold` on the server too).
    pub(crate) acquired_at: Instant,
    /// The acquisition waited for the lock (queued, or was handed it): others
    /// most likely wait behind it.
    pub(crate) waited: bool,
}

impl Lease {
    pub(crate) fn new(n: NewLease) -> Self {
        let lease = Lease {
            id: n.id,
            manager_id: n.manager_id,
            key: n.key,
            keys: n.keys,
            owner: n.owner,
            fencing_token: AtomicU64::new(n.fencing_token),
            lease_ms: AtomicU64::new(u64::try_from(n.hold.lease.as_millis()).unwrap_or(u64::MAX)),
            renew: n.hold.renew,
            metrics_label: n.hold.metrics_label,
            waited: n.waited,
            granted_at: n.sent_at,
            max_hold_until: n.hold.max_hold.and_then(|d| n.sent_at.checked_add(d)),
            min_hold_until: n.hold.min_hold.and_then(|d| n.acquired_at.checked_add(d)),
            min_hold_forgone: AtomicBool::new(false),
            epoch: n.epoch,
            valid_until: AtomicU64::new(0),
            next_renewal: AtomicU64::new(0),
            renewal_window: AtomicU64::new(0),
            state: AtomicU8::new(HELD),
            holds: AtomicUsize::new(1),
            lost_notify: Notify::new(),
            trouble: std::sync::Mutex::new(None),
            trouble_notify: Notify::new(),
        };
        lease.renewed(n.sent_at, lease.lease_ms());
        lease
    }

    /// The fencing token issued to this hold; 0 while none is.
    pub(crate) fn fencing_token(&self) -> u64 {
        self.fencing_token.load(Ordering::Acquire)
    }

    /// Records the token issued to this hold (see `LockGuard::fencing_token`).
    pub(crate) fn set_fencing_token(&self, token: u64) {
        self.fencing_token.store(token, Ordering::Release);
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn instant(&self, nanos: u64) -> Instant {
        self.epoch + Duration::from_nanos(nanos)
    }

    /// The lease in whole milliseconds, as Redis takes it.
    pub(crate) fn lease_ms(&self) -> u64 {
        self.lease_ms.load(Ordering::Acquire)
    }

    /// The lease: the lock's TTL in Redis, at least this much after every
    /// renewal.
    pub(crate) fn duration(&self) -> Duration {
        Duration::from_millis(self.lease_ms())
    }

    /// Changes the lease that later renewals set (see `LockGuard::extend`).
    pub(crate) fn set_lease(&self, lease: Duration) {
        self.lease_ms.store(
            u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            Ordering::Release,
        );
    }

    pub(crate) fn renewal_interval(&self) -> Duration {
        self.duration() / 3
    }

    /// How long the holder may trust a renewal sent at `sent_at`: the lease
    /// less the drift, and never past `max_hold`.
    fn valid_after(&self, sent_at: Instant) -> Instant {
        self.valid_for(sent_at, self.duration())
    }

    /// [`valid_after`](Self::valid_after) for a renewal that carried `sent`
    /// milliseconds: the shorter of that and the length now. A renewal reads
    /// the length before it goes out, and an `extend` may change it in
    /// between: the store then holds what the renewal carried, whatever the
    /// length is when its reply comes.
    fn valid_after_sending(&self, sent_at: Instant, sent: u64) -> Instant {
        self.valid_for(sent_at, Duration::from_millis(sent).min(self.duration()))
    }

    fn valid_for(&self, sent_at: Instant, lease: Duration) -> Instant {
        let valid = sent_at + lease.saturating_sub(drift(lease));
        self.max_hold_until.map_or(valid, |limit| valid.min(limit))
    }

    /// Records a renewal sent at `sent_at` that replaced the TTL with a lease
    /// of a new length, `sent` milliseconds (read before it went out): the
    /// local deadline follows it, down as well as up. A `lost()` already
    /// waiting re-reads the deadline.
    pub(crate) fn extended(&self, sent_at: Instant, sent: u64) {
        self.valid_until.store(
            self.nanos(self.valid_after_sending(sent_at, sent)),
            Ordering::Release,
        );
        self.renew_after(sent_at, self.renewal_interval());
        self.lost_notify.notify_waiters();
    }

    /// Before a renewal with a new lease length (set by `set_lease`) is sent
    /// at `sent_at`: the local deadline and the next renewal come down to
    /// what the new length allows, never up. The store may run the renewal
    /// even when its reply never comes (a timeout, a dropped `extend`), so a
    /// shorter lease is trusted from the moment it is sent; a longer one
    /// only once the store confirms it (`extended`). A `lost()` already
    /// waiting re-reads the deadline.
    pub(crate) fn shorten_to_new_length(&self, sent_at: Instant) {
        let valid = self.nanos(self.valid_after(sent_at));
        let previous = self.valid_until.fetch_min(valid, Ordering::AcqRel);
        let interval = self.renewal_interval();
        let next = self.nanos(sent_at + interval);
        if next < self.next_renewal.load(Ordering::Acquire) {
            self.renew_after(sent_at, interval);
        }
        if valid < previous {
            self.lost_notify.notify_waiters();
        }
    }

    /// Records a successful renewal (or the acquire) sent at `sent_at` with
    /// a lease of `sent` milliseconds, read before it went out (see
    /// [`lease_ms`](Self::lease_ms)).
    pub(crate) fn renewed(&self, sent_at: Instant, sent: u64) {
        let valid = self.valid_after_sending(sent_at, sent);
        self.valid_until
            .fetch_max(self.nanos(valid), Ordering::AcqRel);
        self.renew_after(sent_at, self.renewal_interval());
    }

    /// Asks for the next renewal `period` after `sent_at`, allowing it a
    /// quarter of `period` early (see [`Lease::renewal_window`]).
    fn renew_after(&self, sent_at: Instant, period: Duration) {
        self.renewal_window.store(
            u64::try_from((period / 4).as_nanos()).unwrap_or(u64::MAX),
            Ordering::Release,
        );
        self.next_renewal
            .store(self.nanos(sent_at + period), Ordering::Release);
    }

    /// How much earlier than it is due the renewal task may renew this
    /// lease, so that leases due close together share one batch: a quarter
    /// of the period that ends when it is due. The period is the renewal
    /// interval, or after a hand-off a third of the TTL the hand-off gave,
    /// which is shorter: measured on the interval, a handed-off lease due a
    /// second from now would be renewed at once, one more statement queued
    /// on the new holder's connection just as its body starts.
    pub(crate) fn renewal_window(&self) -> Duration {
        Duration::from_nanos(self.renewal_window.load(Ordering::Acquire))
    }

    /// Records a lock handed to this holder by another's release, which
    /// set its TTL to `ttl` (at most the queue lease) at some time after
    /// `sent_at` (the holder's last attempt before the hand-off): the holder
    /// trusts it until `sent_at + ttl - drift`, and renews it a third of `ttl`
    /// after `sent_at` (at once, if that has passed), which brings the TTL up
    /// to the whole lease.
    pub(crate) fn handed_off(&self, sent_at: Instant, ttl: Duration) {
        let valid = (sent_at + ttl.saturating_sub(drift(ttl))).min(self.valid_after(sent_at));
        self.valid_until.store(self.nanos(valid), Ordering::Release);
        self.renew_after(sent_at, (ttl / 3).min(self.renewal_interval()));
    }

    /// Asks for the next renewal attempt at `at` (after a failure: sooner than usual).
    pub(crate) fn retry_renewal_at(&self, at: Instant) {
        self.next_renewal.store(self.nanos(at), Ordering::Release);
    }

    /// `next_renewal` as nanoseconds after the manager's epoch.
    pub(crate) fn next_renewal_nanos(&self) -> u64 {
        self.next_renewal.load(Ordering::Acquire)
    }

    pub(crate) fn next_renewal(&self) -> Instant {
        self.instant(self.next_renewal.load(Ordering::Acquire))
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.instant(self.valid_until.load(Ordering::Acquire))
    }

    /// How long a release now must keep the lock (whole milliseconds, rounded
    /// up): the rest of `min_hold`, 0 without one or once it has passed.
    pub(crate) fn keep_ms(&self) -> u64 {
        keep_ms(self.min_hold_until())
    }

    /// Until when a release must keep the lock (`min_hold`), if at all.
    pub(crate) fn min_hold_until(&self) -> Option<Instant> {
        self.min_hold_until
            .filter(|_| !self.min_hold_forgone.load(Ordering::Acquire))
    }

    /// The acquisition that took this lock failed as a whole and gives it
    /// back: released now, it is not kept for `min_hold`.
    pub(crate) fn forgo_min_hold(&self) {
        self.min_hold_forgone.store(true, Ordering::Release);
    }

    /// Lost: the renewal found the lock not ours, or the local deadline passed.
    /// Checking is enough to notice the deadline; no task has to be awake for it.
    pub(crate) fn is_lost(&self) -> bool {
        match self.state.load(Ordering::Acquire) {
            LOST => true,
            RELEASED | HANDED_OVER => false,
            _ => {
                if Instant::now() >= self.valid_until() {
                    self.mark_lost("the lease was not renewed before its local deadline");
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Released, or handed over ([`mark_handed_over`](Self::mark_handed_over)).
    pub(crate) fn is_released(&self) -> bool {
        matches!(self.state.load(Ordering::Acquire), RELEASED | HANDED_OVER)
    }

    /// Released by its own release (not handed over): the lock in the store
    /// is this lease's to keep for its `min_hold`.
    pub(crate) fn is_released_by_itself(&self) -> bool {
        self.state.load(Ordering::Acquire) == RELEASED
    }

    pub(crate) fn is_held(&self) -> bool {
        self.state.load(Ordering::Acquire) == HELD && !self.is_lost()
    }

    /// Reports a renewal trouble to the holders watching for one.
    pub(crate) fn report_trouble(&self, trouble: RenewalTrouble) {
        *self.trouble.lock().unwrap_or_else(|e| e.into_inner()) = Some(trouble);
        self.trouble_notify.notify_waiters();
    }

    /// Completes at the next renewal trouble after the call.
    pub(crate) async fn next_trouble(&self) -> RenewalTrouble {
        loop {
            // Registered before any report that follows the call: the
            // report stores the trouble, then wakes every registered waiter.
            self.trouble_notify.notified().await;
            if let Some(trouble) = self
                .trouble
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
            {
                return trouble;
            }
        }
    }

    /// Turns a held lease lost and wakes everyone waiting on `lost()`. Returns
    /// whether this call made the change.
    pub(crate) fn mark_lost(&self, why: &str) -> bool {
        let changed = self
            .state
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if changed {
            crate::telemetry::lost(self.metrics_label);
            tracing::warn!(target: "distlock::lease",
                key = %crate::error::KeyPreview(&self.key),
                fencing_token = self.fencing_token(),
                reason = why,
                "lease lost"
            );
            self.lost_notify.notify_waiters();
        }
        changed
    }

    /// Ends a held lease because its manager is shutting down: lost to the
    /// holder (its work is no longer protected), without the warning a loss
    /// gets, since the shutdown was asked for.
    pub(crate) fn end_by_shutdown(&self) {
        if self
            .state
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.lost_notify.notify_waiters();
        }
    }

    /// Marks the lease released; returns true when it had been lost before.
    pub(crate) fn mark_released(&self) -> bool {
        let was_lost = self.is_lost();
        self.state.store(RELEASED, Ordering::Release);
        self.lost_notify.notify_waiters();
        was_lost
    }

    /// Marks a lease never handed to a holder released (a grant answered
    /// after its deadline): unlike [`mark_released`](Self::mark_released),
    /// it is not first found lost, so no loss is logged or counted for a
    /// hold nobody had.
    pub(crate) fn mark_never_held(&self) {
        self.state.store(RELEASED, Ordering::Release);
        self.lost_notify.notify_waiters();
    }

    /// Marks the lease released while its hold lives on under another owner
    /// (a ticket, a renamed semaphore hold): nothing this lease does may
    /// touch the store any more, not even a renewal reply's `min_hold` keep.
    pub(crate) fn mark_handed_over(&self) {
        self.state.store(HANDED_OVER, Ordering::Release);
        self.lost_notify.notify_waiters();
    }

    /// Adds a hold for a re-entrant acquisition, unless the last hold is already
    /// gone (the lease is being released).
    /// The holds sharing this lease now: the acquisition's guard and one per
    /// re-entry still alive (0 once the last is released).
    pub(crate) fn hold_count(&self) -> usize {
        self.holds.load(Ordering::Acquire)
    }

    pub(crate) fn add_hold(&self) -> bool {
        self.holds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n > 0).then_some(n + 1)
            })
            .is_ok()
    }

    /// Takes the only hold away for a change of owner (a ticket, a renamed
    /// semaphore hold): from one hold to none, in one step, so that no
    /// re-entrant acquisition joins the lease meanwhile (`add_hold` refuses,
    /// and it acquires afresh). False, and nothing taken, when re-entrant
    /// guards share the hold. A change that fails puts it back
    /// ([`Lease::restore_sole_hold`]).
    pub(crate) fn take_sole_hold(&self) -> bool {
        self.holds
            .compare_exchange(1, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives back the hold [`Lease::take_sole_hold`] took: the guard keeps
    /// its lease after all.
    pub(crate) fn restore_sole_hold(&self) {
        self.holds.store(1, Ordering::Release);
    }

    /// Drops one hold; true when it was the last one.
    pub(crate) fn drop_hold(&self) -> bool {
        self.holds.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// The same hold under another owner token (a weighted semaphore hold
    /// renamed to a smaller weight, `LockGuard::release_permits`): the same
    /// key, lease, fencing token, deadlines and renewal schedule, one hold,
    /// a new id for the renewal task.
    pub(crate) fn renamed(&self, id: u64, owner: String) -> Lease {
        Lease {
            id,
            manager_id: self.manager_id,
            key: self.key.clone(),
            keys: self.keys.clone(),
            owner,
            fencing_token: AtomicU64::new(self.fencing_token()),
            lease_ms: AtomicU64::new(self.lease_ms()),
            renew: self.renew,
            metrics_label: self.metrics_label,
            waited: self.waited,
            granted_at: self.granted_at,
            max_hold_until: self.max_hold_until,
            min_hold_until: self.min_hold_until(),
            min_hold_forgone: AtomicBool::new(false),
            epoch: self.epoch,
            valid_until: AtomicU64::new(self.valid_until.load(Ordering::Acquire)),
            next_renewal: AtomicU64::new(self.next_renewal.load(Ordering::Acquire)),
            renewal_window: AtomicU64::new(self.renewal_window.load(Ordering::Acquire)),
            state: AtomicU8::new(HELD),
            holds: AtomicUsize::new(1),
            lost_notify: Notify::new(),
            trouble: std::sync::Mutex::new(None),
            trouble_notify: Notify::new(),
        }
    }

    pub(crate) fn remaining(&self) -> Duration {
        if self.is_lost() || self.is_released() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Completes when the lease is lost: at once if it already is, when the renewal
    /// reports it, or when the local deadline passes without a renewal.
    pub(crate) async fn lost(&self) {
        loop {
            let mut notified = pin!(self.lost_notify.notified());
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            if self.is_released() {
                // A released lease never turns lost; nothing more will happen.
                std::future::pending::<()>().await;
            }
            let deadline = tokio::time::Instant::from_std(self.valid_until());
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}
