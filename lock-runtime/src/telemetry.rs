//! Metrics (feature `metrics`, on the `metrics` facade crate): what a lock
//! manager reports, in one place. Without the feature every function is empty.
//!
//! | name | kind | meaning | `lock` label |
//! |---|---|---|---|
//! | `distlock_acquired_total` | counter | acquisitions granted (re-entries not counted) | yes |
//! | `distlock_busy_total` | counter | `try_acquire` attempts that found the lock held | yes |
//! | `distlock_timeouts_total` | counter | acquisitions that waited their whole `wait` | yes |
//! | `distlock_lost_total` | counter | leases lost while held | yes |
//! | `distlock_released_total` | counter | holds released (by `release()` or drop) | yes |
//! | `distlock_force_unlocked_total` | counter | locks freed by `force_unlock` | no |
//! | `distlock_wait_seconds` | histogram | how long granted acquisitions waited | yes |
//! | `distlock_hold_seconds` | histogram | from grant to release | yes |
//! | `distlock_renewal_lag_seconds` | histogram | how late each renewal was sent against its due time | no |
//! | `distlock_round_trip_seconds` | histogram | one acquire call to Redis | no |
//! | `distlock_held_locks` | gauge | locks held by the process's managers | yes |
//! | `distlock_waiting_acquisitions` | gauge | acquisitions waiting for a busy lock | yes |
//!
//! No label carries a lock key, so the number of series stays bounded however
//! many keys are locked. A request given a
//! [`metrics_label`](crate::LockRequest::metrics_label) (every lock taken by
//! `#[distributed_lock]` is, with its key template, e.g. `"order:{order_id}"`)
//! adds the label `lock = "<label>"` to the metrics of that hold: acquired,
//! busy, timeouts, lost, released, the wait and hold histograms and the held
//! gauge. Requests without one report without the label. The renewal-lag and
//! round-trip histograms and the force-unlock counter never carry it (they
//! describe the connection and the manager, not one lock).
//!
//! A process reports at most [`MAX_METRIC_LABELS`] distinct `lock` labels: holds of
//! any further label report `lock = "other"` (and a warning is logged once),
//! so that labels made at run time (say, leaked strings built from keys) cannot
//! grow the number of series without bound.

/// The most distinct `lock` label values one process reports; the rest report
/// `"other"`.
pub const MAX_METRIC_LABELS: usize = 100;

use std::time::Duration;

#[cfg(feature = "metrics")]
mod emit {
    use std::time::Duration;

    /// The `lock` label of a hold, when its request has one.
    type Label = Option<&'static str>;

    /// `label`, or `"other"` once [`super::MAX_METRIC_LABELS`] others were reported.
    fn capped(label: Label) -> Label {
        use std::collections::HashSet;
        use std::sync::{Mutex, OnceLock};
        static SEEN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
        let lock = label?;
        let mut seen = SEEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if seen.contains(lock) {
            return Some(lock);
        }
        if seen.len() < super::MAX_METRIC_LABELS {
            seen.insert(lock);
            return Some(lock);
        }
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(target: "distlock::metrics",
                max = super::MAX_METRIC_LABELS, label = lock,
                "too many distinct lock labels; further ones are reported as \"other\""
            );
        });
        Some("other")
    }

    fn counter(name: &'static str, label: Label) -> metrics::Counter {
        match capped(label) {
            Some(lock) => metrics::counter!(name, "lock" => lock),
            None => metrics::counter!(name),
        }
    }

    fn histogram(name: &'static str, label: Label) -> metrics::Histogram {
        match capped(label) {
            Some(lock) => metrics::histogram!(name, "lock" => lock),
            None => metrics::histogram!(name),
        }
    }

    fn held_gauge(label: Label) -> metrics::Gauge {
        gauge("distlock_held_locks", label)
    }

    pub(super) fn gauge(name: &'static str, label: Label) -> metrics::Gauge {
        match capped(label) {
            Some(lock) => metrics::gauge!(name, "lock" => lock),
            None => metrics::gauge!(name),
        }
    }

    pub(super) fn acquired(label: Label, waited: Duration) {
        counter("distlock_acquired_total", label).increment(1);
        histogram("distlock_wait_seconds", label).record(waited.as_secs_f64());
        held_gauge(label).increment(1.0);
    }

    pub(super) fn busy(label: Label) {
        counter("distlock_busy_total", label).increment(1);
    }

    pub(super) fn timed_out(label: Label) {
        counter("distlock_timeouts_total", label).increment(1);
    }

    pub(super) fn lost(label: Label) {
        counter("distlock_lost_total", label).increment(1);
    }

    pub(super) fn force_unlocked() {
        metrics::counter!("distlock_force_unlocked_total").increment(1);
    }

    pub(super) fn released(label: Label, held: Duration) {
        counter("distlock_released_total", label).increment(1);
        histogram("distlock_hold_seconds", label).record(held.as_secs_f64());
        held_gauge(label).decrement(1.0);
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
    pub(super) fn busy(_: Option<&'static str>) {}
    pub(super) fn force_unlocked() {}
    pub(super) fn timed_out(_: Option<&'static str>) {}
    pub(super) fn lost(_: Option<&'static str>) {}
}

// The durations are passed as closures, so that without the feature not even
// the clock is read.

/// A lock was granted after waiting `waited`.
#[inline]
pub(crate) fn acquired(label: Option<&'static str>, waited: impl FnOnce() -> Duration) {
    #[cfg(feature = "metrics")]
    emit::acquired(label, waited());
    #[cfg(not(feature = "metrics"))]
    let _ = (label, waited);
}

/// An acquisition waiting for a busy lock, counted in the waiters gauge until
/// it is dropped (granted, timed out, failed or cancelled).
#[must_use]
pub(crate) struct Waiting {
    #[cfg(feature = "metrics")]
    label: Option<&'static str>,
}

/// An acquisition starts waiting.
#[inline]
pub(crate) fn waiting(label: Option<&'static str>) -> Waiting {
    #[cfg(feature = "metrics")]
    {
        emit::gauge("distlock_waiting_acquisitions", label).increment(1.0);
        Waiting { label }
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = label;
        Waiting {}
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        emit::gauge("distlock_waiting_acquisitions", self.label).decrement(1.0);
    }
}

/// A single attempt found the lock held.
#[inline]
pub(crate) fn busy(label: Option<&'static str>) {
    emit::busy(label)
}

/// An acquisition gave up after its wait.
#[inline]
pub(crate) fn timed_out(label: Option<&'static str>) {
    emit::timed_out(label)
}

/// A lock was freed by `force_unlock`.
#[inline]
pub(crate) fn force_unlocked() {
    emit::force_unlocked()
}

/// A held lease was lost.
#[inline]
pub(crate) fn lost(label: Option<&'static str>) {
    emit::lost(label)
}

/// A granted lock was released (or dropped) after `held`.
#[inline]
pub(crate) fn released(label: Option<&'static str>, held: impl FnOnce() -> Duration) {
    #[cfg(feature = "metrics")]
    emit::released(label, held());
    #[cfg(not(feature = "metrics"))]
    let _ = (label, held);
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
