//! The options of one hold, shared by the single- and multi-key requests: what
//! the caller asked for ([`HoldOptions`]), and the same checked and completed
//! with the manager's defaults ([`Hold`]), in one place.

use std::time::Duration;

use crate::config::{self, Backoff, Config};
use crate::error::LockError;

/// How long an acquisition (single- or multi-key) keeps at a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// One attempt; a busy lock is `Ok(None)`.
    Once,
    /// Attempts until `wait` has passed; a busy lock is `Err(Timeout)`.
    Wait,
}

/// A request's hold options as the caller set them (`None`: the manager's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldOptions {
    pub(crate) lease: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) renew: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) metrics_label: Option<&'static str>,
    pub(crate) eager_fencing: Option<bool>,
    pub(crate) backoff: Option<Backoff>,
    pub(crate) reentrant: bool,
}

impl Default for HoldOptions {
    fn default() -> Self {
        HoldOptions {
            lease: None,
            wait: None,
            renew: true,
            max_hold: None,
            min_hold: None,
            metrics_label: None,
            eager_fencing: None,
            backoff: None,
            reentrant: true,
        }
    }
}

/// Hold options checked and completed: what an acquisition runs with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    /// Whole milliseconds: Redis keeps no more, and trusting the
    /// sub-millisecond rest locally would outlive the TTL.
    pub(crate) lease: Duration,
    /// Zero for one attempt.
    pub(crate) wait: Duration,
    pub(crate) renew: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) metrics_label: Option<&'static str>,
    pub(crate) eager_fencing: bool,
    pub(crate) backoff: Backoff,
    pub(crate) reentrant: bool,
}

impl HoldOptions {
    /// Checks every option and fills in the manager's defaults; the first bad
    /// option is the error.
    pub(crate) fn resolve(&self, config: &Config, patience: Patience) -> Result<Hold, LockError> {
        config::validate_hold(self.max_hold, "max_hold")?;
        config::validate_hold(self.min_hold, "min_hold")?;
        if let (Some(min_hold), Some(max_hold)) = (self.min_hold, self.max_hold) {
            // As ShedLock refuses `lockAtLeastFor` above `lockAtMostFor`: the
            // hold would be cut off (lost) before it could be kept for the rest.
            if min_hold > max_hold {
                return Err(LockError::InvalidConfig(format!(
                    "min_hold is {min_hold:?}, longer than max_hold {max_hold:?}: \
                     the hold would be cut off at max_hold before min_hold has \
                     passed; make min_hold at most max_hold"
                )));
            }
        }
        let backoff = match self.backoff {
            Some(backoff) => {
                backoff.validate("the request's backoff")?;
                backoff
            }
            None => config.backoff,
        };
        let lease = self.lease.unwrap_or(config.default_lease);
        config::validate_lease(lease, "lease")?;
        let lease = Duration::from_millis(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
        let wait = match patience {
            Patience::Once => Duration::ZERO,
            Patience::Wait => {
                let wait = self.wait.unwrap_or(config.default_wait);
                config::validate_wait(wait, "wait")?;
                wait
            }
        };
        Ok(Hold {
            lease,
            wait,
            renew: self.renew,
            max_hold: self.max_hold,
            min_hold: self.min_hold,
            metrics_label: self.metrics_label,
            eager_fencing: self.eager_fencing.unwrap_or(config.eager_fencing),
            backoff,
            reentrant: self.reentrant,
        })
    }
}

impl Hold {
    /// The same hold as options, for the per-key requests of a multi-key
    /// acquisition.
    pub(crate) fn as_options(&self) -> HoldOptions {
        HoldOptions {
            lease: Some(self.lease),
            wait: Some(self.wait),
            renew: self.renew,
            max_hold: self.max_hold,
            min_hold: self.min_hold,
            metrics_label: self.metrics_label,
            eager_fencing: Some(self.eager_fencing),
            backoff: Some(self.backoff),
            reentrant: self.reentrant,
        }
    }
}
