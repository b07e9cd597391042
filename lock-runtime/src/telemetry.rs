//! Metrics (feature `metrics`, on the `metrics` facade crate): what a lock
//! manager reports, in one place. Without the feature every function is empty.
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `distlock_acquired_total` | counter | acquisitions granted (re-entries not counted) |
//! | `distlock_busy_total` | counter | `try_acquire` attempts that found the lock held |
//! | `distlock_timeouts_total` | counter | acquisitions that waited their whole `wait` |
//! | `distlock_lost_total` | counter | leases lost while held |
//! | `distlock_released_total` | counter | holds released (by `release()` or drop) |
//! | `distlock_force_unlocked_total` | counter | locks freed by `force_unlock` |
//! | `distlock_wait_seconds` | histogram | how long granted acquisitions waited |
//! | `distlock_hold_seconds` | histogram | from grant to release |
//! | `distlock_renewal_lag_seconds` | histogram | how late each renewal was sent against its due time |
//! | `distlock_round_trip_seconds` | histogram | one acquire call to Redis |
//! | `distlock_held_locks` | gauge | locks held by the process's managers |
//!
//! No label carries a lock key, so the number of series stays bounded however
//! many keys are locked.

use std::time::Duration;

#[cfg(feature = "metrics")]
mod emit {
    use std::time::Duration;

    pub(super) fn acquired(waited: Duration) {
        metrics::counter!("distlock_acquired_total").increment(1);
        metrics::histogram!("distlock_wait_seconds").record(waited.as_secs_f64());
        metrics::gauge!("distlock_held_locks").increment(1.0);
    }

    pub(super) fn busy() {
        metrics::counter!("distlock_busy_total").increment(1);
    }

    pub(super) fn timed_out() {
        metrics::counter!("distlock_timeouts_total").increment(1);
    }

    pub(super) fn lost() {
        metrics::counter!("distlock_lost_total").increment(1);
    }

    pub(super) fn force_unlocked() {
        metrics::counter!("distlock_force_unlocked_total").increment(1);
    }

    pub(super) fn released(held: Duration) {
        metrics::counter!("distlock_released_total").increment(1);
        metrics::histogram!("distlock_hold_seconds").record(held.as_secs_f64());
        metrics::gauge!("distlock_held_locks").decrement(1.0);
    }

    pub(super) fn renewal_lag(lag: Duration) {
        metrics::histogram!("distlock_renewal_lag_seconds").record(lag.as_secs_f64());
    }

    pub(super) fn round_trip(took: Duration) {
        metrics::histogram!("distlock_round_trip_seconds").record(took.as_secs_f64());
    }
}

#[cfg(not(feature = "metrics"))]
mod emit {
    pub(super) fn busy() {}
    pub(super) fn force_unlocked() {}
    pub(super) fn timed_out() {}
    pub(super) fn lost() {}
}

// The durations are passed as closures, so that without the feature not even
// the clock is read.

/// A lock was granted after waiting `waited`.
#[inline]
pub(crate) fn acquired(waited: impl FnOnce() -> Duration) {
    #[cfg(feature = "metrics")]
    emit::acquired(waited());
    #[cfg(not(feature = "metrics"))]
    let _ = waited;
}

/// A single attempt found the lock held.
#[inline]
pub(crate) fn busy() {
    emit::busy()
}

/// An acquisition gave up after its wait.
#[inline]
pub(crate) fn timed_out() {
    emit::timed_out()
}

/// A lock was freed by `force_unlock`.
#[inline]
pub(crate) fn force_unlocked() {
    emit::force_unlocked()
}

/// A held lease was lost.
#[inline]
pub(crate) fn lost() {
    emit::lost()
}

/// A granted lock was released (or dropped) after `held`.
#[inline]
pub(crate) fn released(held: impl FnOnce() -> Duration) {
    #[cfg(feature = "metrics")]
    emit::released(held());
    #[cfg(not(feature = "metrics"))]
    let _ = held;
}

/// A renewal went out `lag` after it was due.
#[inline]
pub(crate) fn renewal_lag(lag: impl FnOnce() -> Duration) {
    #[cfg(feature = "metrics")]
    emit::renewal_lag(lag());
    #[cfg(not(feature = "metrics"))]
    let _ = lag;
}

/// One acquire call took `took`.
#[inline]
pub(crate) fn round_trip(took: impl FnOnce() -> Duration) {
    #[cfg(feature = "metrics")]
    emit::round_trip(took());
    #[cfg(not(feature = "metrics"))]
    let _ = took;
}
