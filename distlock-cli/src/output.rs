//! Formatting of what the commands print: the lock table, one lock's fields,
//! check lines, durations, and their JSON forms.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::{CountingPermits, KeyState, LockInfo};
use serde_json::{json, Value};

/// How one server check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Nothing to worry about.
    Ok,
    /// Works, but may hand a lock to two holders or lose it in some event.
    Warn,
    /// distlock cannot work (well) against this server.
    Fail,
}

impl Status {
    /// The word printed for this status.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// The result of one server check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// What was checked (`version`, `maxmemory-policy`, ...), with the node
    /// when several are checked.
    pub check: String,
    /// How it came out.
    pub status: Status,
    /// What was found, and what to do about it.
    pub detail: String,
}

/// A duration for people: `850ms`, `4.2s`, `42s`, `3m12s`, `2h05m`, `3d04h`.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let secs = d.as_secs();
    if ms < 1000 {
        format!("{ms}ms")
    } else if secs < 10 {
        // Tenths, rounded down so that a lease never looks longer than it is.
        format!("{}.{}s", secs, d.subsec_millis() / 100)
    } else if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{}h{:02}m", secs / 3600, secs % 3600 / 60)
    } else {
        format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3600)
    }
}

/// The lease left, or `-` for a key without a TTL.
fn ttl_text(info: &LockInfo) -> String {
    info.ttl.map_or_else(|| "-".to_owned(), human_duration)
}

/// How long the lock has been held, by this machine's clock (0 when the
/// holder's clock is ahead).
fn held_for(info: &LockInfo, now: SystemTime) -> Duration {
    now.duration_since(info.held_since).unwrap_or_default()
}

/// Milliseconds since the Unix epoch (0 before it).
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The held locks as a table with a header, or a sentence when there are none
/// (naming the pattern unless it is `*`).
pub fn lock_table(locks: &[LockInfo], prefix: &str, pattern: &str, now: SystemTime) -> String {
    if locks.is_empty() {
        return if pattern == "*" {
            format!("no locks held under prefix {prefix}\n")
        } else {
            format!("no locks matching {pattern:?} held under prefix {prefix}\n")
        };
    }
    let header = [
        "KEY", "KIND", "HOLDER", "TOKEN", "TTL", "HELD FOR", "WAITERS",
    ];
    let rows: Vec<[String; 7]> = locks
        .iter()
        .map(|info| {
            [
                info.key.clone(),
                info.kind.to_string(),
                info.holder.clone(),
                info.fencing_token.to_string(),
                ttl_text(info),
                human_duration(held_for(info, now)),
                if info.waited_for { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// One hold's fields, one per line.
pub fn lock_details(info: &LockInfo, now: SystemTime) -> String {
    let since = humantime::format_rfc3339_millis(info.held_since);
    format!(
        "key:        {}\n\
         kind:       {}\n\
         hold:       {}\n\
         holder:     {}\n\
         token:      {}\n\
         ttl:        {}\n\
         held since: {} ({} ago)\n\
         waiters:    {}\n",
        info.key,
        info.kind,
        info.hold_id,
        info.holder,
        info.fencing_token,
        ttl_text(info),
        since,
        human_duration(held_for(info, now)),
        if info.waited_for { "yes" } else { "no" },
    )
}

/// Everything on one key: each hold's fields (as [`lock_details`], a blank
/// line between holds), then the read-write lock's waiting writer and the
/// lock's queue in order.
pub fn key_details(state: &KeyState, now: SystemTime) -> String {
    let mut out = state
        .holds
        .iter()
        .map(|hold| lock_details(hold, now))
        .collect::<Vec<_>>()
        .join("\n");
    if let Some(permits) = state.permits {
        let _ = writeln!(out, "\npermits:    {permits}");
    }
    if let Some(available) = state.counting_permits {
        let _ = writeln!(
            out,
            "\ncounting semaphore: {available} available, {} waiting",
            state.counting_waiters
        );
    } else if state.counting_waiters > 0 {
        let _ = writeln!(
            out,
            "\ncounting semaphore: no counter, {} waiting",
            state.counting_waiters
        );
    }
    if state.writer_waiting {
        out.push_str("\na writer waits for the readers to leave\n");
    }
    if !state.waiters.is_empty() {
        let _ = writeln!(out, "\nqueue of {} ({}):", state.key, state.waiters.len());
        for (n, waiter) in state.waiters.iter().enumerate() {
            let _ = writeln!(
                out,
                "{:>4}. {}  (hold {}, queue lease {})",
                n + 1,
                waiter.holder,
                waiter.hold_id,
                human_duration(waiter.queue_lease_left)
            );
        }
    }
    out
}

/// Everything on one key as a JSON object: `key`, `holds` (as
/// [`lock_json`]), `waiters` (`holder`, `hold_id`, `queue_lease_ms`, in
/// order), `writer_waiting`, `permits` (null unless a semaphore is held),
/// `counting_permits` (a counting semaphore's available permits, null
/// without its counter), `counting_waiters`.
pub fn key_json(state: &KeyState) -> Value {
    json!({
        "key": state.key,
        "holds": locks_json(&state.holds),
        "waiters": state.waiters.iter().map(|w| json!({
            "holder": w.holder,
            "hold_id": w.hold_id,
            "queue_lease_ms": u64::try_from(w.queue_lease_left.as_millis()).unwrap_or(u64::MAX),
        })).collect::<Vec<_>>(),
        "writer_waiting": state.writer_waiting,
        "permits": state.permits,
        "counting_permits": state.counting_permits,
        "counting_waiters": state.counting_waiters,
    })
}

/// The counting semaphores as a table (`KEY AVAILABLE WAITERS`) after a
/// heading; nothing when there are none.
pub fn counter_table(counters: &[(String, CountingPermits)]) -> String {
    if counters.is_empty() {
        return String::new();
    }
    let width = counters
        .iter()
        .map(|(key, _)| key.chars().count())
        .max()
        .unwrap_or(0)
        .max("COUNTING SEMAPHORE".len());
    let mut out = format!("\n{:<width$}  AVAILABLE  WAITERS\n", "COUNTING SEMAPHORE");
    for (key, counts) in counters {
        let _ = writeln!(
            out,
            "{key:<width$}  {:<9}  {}",
            counts.available, counts.waiters
        );
    }
    out
}

/// One counting semaphore's counts on one line.
pub fn counter_line(key: &str, counts: &CountingPermits) -> String {
    format!(
        "counting semaphore {key}: {} available, {} waiting\n",
        counts.available, counts.waiters
    )
}

/// One counting semaphore's counts as a JSON object: `key`, `exists`,
/// `available`, `waiters`.
pub fn counter_json(key: &str, counts: &CountingPermits) -> Value {
    json!({
        "key": key,
        "exists": counts.exists,
        "available": counts.available,
        "waiters": counts.waiters,
    })
}

/// One hold as a JSON object: `key`, `kind` (`lock`, `write`, `read`,
/// `permit`, `<n> permits`), `permits` (for semaphore holds), `hold_id`,
/// `acquisition_id`, `holder`, `fencing_token`, `ttl_ms` (null without a
/// TTL), `held_since_ms` (Unix milliseconds), `waited_for`.
pub fn lock_json(info: &LockInfo) -> Value {
    json!({
        "key": info.key,
        "kind": info.kind.to_string(),
        "permits": match info.kind {
            distlock::HoldKind::Permits(n) => Some(n),
            _ => None,
        },
        "hold_id": info.hold_id,
        "acquisition_id": info.acquisition_id,
        "holder": info.holder,
        "fencing_token": info.fencing_token,
        "ttl_ms": info.ttl.map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
        "held_since_ms": unix_ms(info.held_since),
        "waited_for": info.waited_for,
    })
}

/// Several locks as a JSON array.
pub fn locks_json(locks: &[LockInfo]) -> Value {
    Value::Array(locks.iter().map(lock_json).collect())
}

/// The check results as lines `ok|warn|fail  <check>: <detail>`.
pub fn check_lines(results: &[CheckResult]) -> String {
    results
        .iter()
        .map(|r| format!("{:<4}  {}: {}\n", r.status.as_str(), r.check, r.detail))
        .collect()
}

/// The check results as a JSON array of `{check, status, detail}`.
pub fn checks_json(results: &[CheckResult]) -> Value {
    Value::Array(
        results
            .iter()
            .map(|r| json!({"check": r.check, "status": r.status.as_str(), "detail": r.detail}))
            .collect(),
    )
}

/// The URL without its password, for messages (the library's redaction,
/// also of a `password=` or `pass=` query parameter).
pub fn redact(url: &str) -> String {
    distlock::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        let ms = Duration::from_millis;
        assert_eq!(human_duration(ms(850)), "850ms");
        assert_eq!(human_duration(ms(4_290)), "4.2s");
        assert_eq!(human_duration(ms(42_000)), "42s");
        assert_eq!(human_duration(ms(192_000)), "3m12s");
        assert_eq!(human_duration(ms(7_500_000)), "2h05m");
        assert_eq!(human_duration(ms(273_600_000)), "3d04h");
    }

    #[test]
    fn an_empty_table_names_the_prefix() {
        let now = SystemTime::now();
        assert_eq!(
            lock_table(&[], "app:", "*", now),
            "no locks held under prefix app:\n"
        );
        assert_eq!(
            lock_table(&[], "app:", "job:*", now),
            "no locks matching \"job:*\" held under prefix app:\n"
        );
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://:pw@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn check_lines_are_aligned() {
        let results = [CheckResult {
            check: "version".into(),
            status: Status::Ok,
            detail: "7.2.4".into(),
        }];
        assert_eq!(check_lines(&results), "ok    version: 7.2.4\n");
    }
}
