//! One clock for all processes of the machine.

use std::time::Duration;

/// `CLOCK_MONOTONIC` in nanoseconds. Every process on the machine reads the same
/// clock, so times logged by different workers and by the test can be compared. It
/// keeps running while a process is stopped with SIGSTOP.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    u64::try_from(ts.tv_sec).expect("monotonic seconds are positive") * 1_000_000_000
        + u64::try_from(ts.tv_nsec).expect("nanoseconds are positive")
}

/// Nanoseconds of a duration, saturating.
pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A nanosecond span as milliseconds with one decimal, for messages.
pub fn ms(ns: u64) -> f64 {
    (ns / 100_000) as f64 / 10.0
}

/// Signed difference `a - b` in milliseconds, for messages.
pub fn diff_ms(a: u64, b: u64) -> f64 {
    if a >= b {
        ms(a - b)
    } else {
        -ms(b - a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_runs_forward_with_instant() {
        let a = mono_ns();
        let i = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        let b = mono_ns();
        let el = ns(i.elapsed());
        assert!(b > a);
        assert!((b - a) + 1_000_000 >= el && (b - a) <= el + 1_000_000);
    }

    #[test]
    fn formatting_helpers() {
        assert_eq!(ms(1_234_567), 1.2);
        assert_eq!(diff_ms(1_000_000, 3_000_000), -2.0);
    }
}
