//! Compile-time checks of `lease = "30s"` / `wait = "5s"` / `max_hold = "10m"` /
//! `min_hold = "30s"` literals.

use std::time::Duration;

/// Which option a duration literal belongs to; they differ in what they allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DurationKind {
    /// The lease (TTL in Redis). At least [`MIN_LEASE`].
    Lease,
    /// How long acquisition may wait. Zero means one attempt.
    Wait,
    /// The longest the lock may be held. Above zero; shorter than the lease
    /// is allowed (it only caps the hold).
    MaxHold,
    /// The shortest the lock is held (kept after an early release). Above
    /// zero; longer than the lease is allowed (renewed while held, then kept).
    MinHold,
}

impl DurationKind {
    pub(crate) fn option_name(self) -> &'static str {
        match self {
            DurationKind::Lease => "lease",
            DurationKind::Wait => "wait",
            DurationKind::MaxHold => "max_hold",
            DurationKind::MinHold => "min_hold",
        }
    }
}

/// The runtime's shortest lease (`distlock::MIN_LEASE`): the holder trusts a
/// lease for `lease - 1% - 2 ms` and renews it every lease/3, which below 10 ms
/// cannot happen in time. A proc-macro crate cannot use the runtime's constant
/// at build time; `tests::limits_are_the_runtimes` keeps the two equal.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(10);

/// The runtime's longest lease or wait (`distlock::MAX_DURATION`), kept equal
/// to it by `tests::limits_are_the_runtimes`.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Parses and validates a humantime literal such as `"30s"`, `"1m 30s"` or
/// `"500ms"`.
pub(crate) fn parse(kind: DurationKind, src: &str) -> Result<Duration, String> {
    let name = kind.option_name();
    let d = humantime::parse_duration(src).map_err(|e| {
        format!(
            "invalid `{name}` duration \"{src}\": {e}; write e.g. \"30s\", \"1m 30s\" or \"500ms\", \
             or pass an expression of type `std::time::Duration`"
        )
    })?;
    if d.is_zero() {
        return match kind {
            DurationKind::Lease => Err(format!(
                "`lease` must be longer than zero (\"{src}\"): a zero lease would expire at once; \
                 the shortest lease is {}",
                humantime::format_duration(MIN_LEASE)
            )),
            DurationKind::Wait => Ok(d),
            DurationKind::MaxHold => Err(format!(
                "`max_hold` must be longer than zero (\"{src}\"): a zero limit would end the hold \
                 at once; leave `max_hold` out for no limit"
            )),
            DurationKind::MinHold => Err(format!(
                "`min_hold` must be longer than zero (\"{src}\"): leave `min_hold` out to \
                 release the lock as soon as the body is done"
            )),
        };
    }
    if d < Duration::from_millis(1) {
        return Err(format!(
            "`{name}` of \"{src}\" is below one millisecond, the resolution of Redis lock timing{}",
            if kind == DurationKind::Wait {
                "; use \"0s\" for a single attempt"
            } else {
                ""
            }
        ));
    }
    if kind == DurationKind::Lease && d < MIN_LEASE {
        return Err(format!(
            "`lease` of \"{src}\" is too short: the holder trusts it for lease - 1% - 2 ms and renews it every lease/3, so it must be at least {}",
            humantime::format_duration(MIN_LEASE)
        ));
    }
    if d > MAX_DURATION {
        return Err(format!(
            "`{name}` of \"{src}\" is too long: the limit is {} (longer is taken for a unit mistake)",
            humantime::format_duration(MAX_DURATION)
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_humantime_forms() {
        let ok = |k, s| parse(k, s).unwrap();
        assert_eq!(ok(DurationKind::Lease, "30s"), Duration::from_secs(30));
        assert_eq!(ok(DurationKind::Lease, "1m 30s"), Duration::from_secs(90));
        assert_eq!(ok(DurationKind::Lease, "1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(DurationKind::Lease, "500ms"), Duration::from_millis(500));
        assert_eq!(ok(DurationKind::Lease, "10ms"), Duration::from_millis(10));
        assert_eq!(ok(DurationKind::Wait, "1ms"), Duration::from_millis(1));
        assert_eq!(
            ok(DurationKind::Wait, "1500us"),
            Duration::from_micros(1500)
        );
    }

    #[test]
    fn zero_is_a_single_attempt_for_wait_only() {
        assert_eq!(parse(DurationKind::Wait, "0s").unwrap(), Duration::ZERO);
        let e = parse(DurationKind::Lease, "0s").unwrap_err();
        assert!(e.contains("longer than zero"), "{e}");
    }

    #[test]
    fn rejects_unparsable() {
        for s in ["30", "", "soon", "5 parsecs", "-1s"] {
            let e = parse(DurationKind::Lease, s).unwrap_err();
            assert!(e.starts_with("invalid `lease` duration"), "{s}: {e}");
        }
        let e = parse(DurationKind::Wait, "30").unwrap_err();
        assert!(e.starts_with("invalid `wait` duration \"30\""), "{e}");
    }

    #[test]
    fn rejects_sub_millisecond() {
        let e = parse(DurationKind::Lease, "500us").unwrap_err();
        assert!(e.contains("below one millisecond"), "{e}");
        let e = parse(DurationKind::Wait, "999us").unwrap_err();
        assert!(e.contains("use \"0s\" for a single attempt"), "{e}");
    }

    #[test]
    fn rejects_short_lease() {
        let e = parse(DurationKind::Lease, "2ms").unwrap_err();
        assert!(e.contains("at least 10ms"), "{e}");
        assert_eq!(
            parse(DurationKind::Wait, "2ms").unwrap(),
            Duration::from_millis(2)
        );
    }

    #[test]
    fn max_hold_is_above_zero_and_may_be_below_the_shortest_lease() {
        let e = parse(DurationKind::MaxHold, "0s").unwrap_err();
        assert!(
            e.starts_with("`max_hold` must be longer than zero (\"0s\")"),
            "{e}"
        );
        assert_eq!(
            parse(DurationKind::MaxHold, "10m").unwrap(),
            Duration::from_secs(600)
        );
        assert_eq!(
            parse(DurationKind::MaxHold, "2ms").unwrap(),
            Duration::from_millis(2)
        );
        let e = parse(DurationKind::MaxHold, "soon").unwrap_err();
        assert!(e.starts_with("invalid `max_hold` duration"), "{e}");
        let e = parse(DurationKind::MaxHold, "31days").unwrap_err();
        assert!(e.contains("too long"), "{e}");
    }

    #[test]
    fn min_hold_is_above_zero_and_may_exceed_the_lease() {
        let e = parse(DurationKind::MinHold, "0s").unwrap_err();
        assert!(
            e.starts_with("`min_hold` must be longer than zero (\"0s\")"),
            "{e}"
        );
        assert_eq!(
            parse(DurationKind::MinHold, "30s").unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            parse(DurationKind::MinHold, "2ms").unwrap(),
            Duration::from_millis(2)
        );
        let e = parse(DurationKind::MinHold, "30").unwrap_err();
        assert!(e.starts_with("invalid `min_hold` duration"), "{e}");
        let e = parse(DurationKind::MinHold, "31days").unwrap_err();
        assert!(e.contains("too long"), "{e}");
    }

    #[test]
    fn rejects_huge() {
        let e = parse(DurationKind::Lease, "100000000000years").unwrap_err();
        assert!(e.contains("too long") || e.contains("invalid"), "{e}");
        let e = parse(DurationKind::Wait, "31days").unwrap_err();
        assert!(e.contains("too long"), "{e}");
        assert!(parse(DurationKind::Wait, "30days").is_ok());
    }

    /// The attribute refuses at compile time what the runtime would refuse
    /// at run time: a literal the macro accepts must not fail the request,
    /// and one the runtime accepts is not a compile error, except below one
    /// millisecond (a `wait`, `min_hold` or `max_hold` of `"500us"`), which
    /// the store's timing cannot honour and the macro takes for a mistake.
    #[test]
    fn limits_are_the_runtimes() {
        assert_eq!(MIN_LEASE, distlock_runtime::MIN_LEASE);
        assert_eq!(MAX_DURATION, distlock_runtime::MAX_DURATION);

        // And `parse` draws the line at them: the shortest and longest lease
        // pass, a millisecond beyond either fails.
        let literal = |d: Duration| format!("{}ms", d.as_millis());
        let millisecond = Duration::from_millis(1);
        let shortest = distlock_runtime::MIN_LEASE;
        let longest = distlock_runtime::MAX_DURATION;
        assert_eq!(parse(DurationKind::Lease, &literal(shortest)), Ok(shortest));
        assert!(parse(DurationKind::Lease, &literal(shortest - millisecond)).is_err());
        for kind in [
            DurationKind::Lease,
            DurationKind::Wait,
            DurationKind::MaxHold,
            DurationKind::MinHold,
        ] {
            assert_eq!(parse(kind, &literal(longest)), Ok(longest), "{kind:?}");
            let e = parse(kind, &literal(longest + millisecond)).unwrap_err();
            assert!(e.contains("too long"), "{kind:?}: {e}");
        }
    }
}
