//! The backoff timer: how long a waiter sleeps between attempts when no
//! wake-up comes (a lost message, a lease that ran out without a release).

use std::time::Duration;

/// A waiter's sleeps, drawn from its [`Backoff`](crate::Backoff): the series
/// value doubles from `first` to `cap` and never exceeds the holder's
/// remaining lease (a lock whose holder died without releasing is retried as
/// it expires).
#[derive(Debug)]
pub(crate) struct BackoffTimer {
    policy: crate::Backoff,
    next_value: Duration,
}

impl Default for BackoffTimer {
    fn default() -> Self {
        BackoffTimer::new(crate::Backoff::default())
    }
}

impl BackoffTimer {
    pub(crate) fn new(policy: crate::Backoff) -> Self {
        BackoffTimer {
            policy,
            next_value: policy.first(),
        }
    }

    /// A random sleep in `[0, max]`, uniform, from the thread's generator:
    /// jitter needs spread, not secrecy, and no seed, since no test or
    /// caller replays a series.
    pub(crate) fn jitter(max: Duration) -> Duration {
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::random_range(0..=nanos))
    }

    pub(crate) fn next(&mut self, holder_remaining: Option<Duration>) -> Duration {
        let value = self
            .next_value
            .min(holder_remaining.unwrap_or(Duration::MAX))
            .max(Duration::from_millis(1));
        self.next_value = self.policy.grow(self.next_value);
        // `jitter` is checked to be within [0, 1] before a timer is made.
        let random_part = value.mul_f64(self.policy.jitter());
        (value - random_part) + Self::jitter(random_part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_bound_down_to_zero_and_up_to_the_longest_sleep() {
        assert_eq!(BackoffTimer::jitter(Duration::ZERO), Duration::ZERO);
        let ms = Duration::from_millis;
        let draws: Vec<_> = (0..200).map(|_| BackoffTimer::jitter(ms(5))).collect();
        assert!(draws.iter().all(|d| *d <= ms(5)), "{draws:?}");
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
        // Past u64 nanoseconds the bound is u64::MAX ns, the whole range.
        assert!(BackoffTimer::jitter(Duration::MAX) <= Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn backoff_is_capped_by_the_holders_remaining_lease() {
        let mut b = BackoffTimer::default();
        for _ in 0..50 {
            assert!(b.next(Some(Duration::from_millis(3))) <= Duration::from_millis(3));
        }
        let mut b = BackoffTimer::default();
        let naps: Vec<_> = (0..20).map(|_| b.next(None)).collect();
        let default = crate::Backoff::default();
        assert!(naps.iter().all(|n| *n <= default.cap()));
        assert!(naps[0] <= default.first());
        // Jitter: not all the same.
        assert!(naps.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn a_backoff_without_jitter_doubles_up_to_its_cap() {
        let ms = Duration::from_millis;
        let mut b = BackoffTimer::new(crate::Backoff::new(ms(10), ms(50)).with_jitter(0.0));
        let naps: Vec<_> = (0..5).map(|_| b.next(None)).collect();
        assert_eq!(naps, [ms(10), ms(20), ms(40), ms(50), ms(50)]);
        // The holder's remaining lease still caps a sleep.
        assert_eq!(b.next(Some(ms(7))), ms(7));
    }

    #[test]
    fn a_partial_jitter_keeps_the_fixed_part_of_each_sleep() {
        let ms = Duration::from_millis;
        let mut b = BackoffTimer::new(crate::Backoff::new(ms(100), ms(100)).with_jitter(0.25));
        let naps: Vec<_> = (0..200).map(|_| b.next(None)).collect();
        assert!(
            naps.iter().all(|n| (ms(75)..=ms(100)).contains(n)),
            "{naps:?}"
        );
        assert!(naps.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn bad_backoffs_are_refused_with_what_is_wrong() {
        let ms = Duration::from_millis;
        for (backoff, says) in [
            (crate::Backoff::new(ms(0), ms(10)), "start at 1 ms"),
            (
                crate::Backoff::new(ms(20), ms(10)),
                "no less than its start",
            ),
            (
                crate::Backoff::new(ms(10), ms(20)).with_jitter(1.5),
                "jitter of 1.5",
            ),
            (
                crate::Backoff::new(ms(10), ms(20)).with_jitter(f64::NAN),
                "jitter of NaN",
            ),
        ] {
            let err = backoff.validate("the request's backoff").unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        assert!(crate::Backoff::default().validate("default").is_ok());
    }
}
