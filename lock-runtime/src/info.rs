//! What an operator sees of a held lock ([`LockInfo`]), read from the value the
//! acquire script stores: `<owner><mark><token>:<since>:<holder>` (see
//! `scripts/acquire.lua`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Length of an owner token (32 hex digits), which opens every lock value.
pub(crate) const OWNER_LEN: usize = 32;

/// Longest accepted holder description, in bytes. It is stored with every hold,
/// so it should say who holds the lock, not carry data.
pub(crate) const MAX_HOLDER_BYTES: usize = 256;

/// A held lock as Redis stores it, for operators: who holds it, since when,
/// until when, and with which fencing token. From
/// [`LockManager::inspect`](crate::LockManager::inspect) and
/// [`LockManager::list`](crate::LockManager::list).
///
/// Re-entrant holds of one task are not visible here: re-entry happens inside
/// the holding process, which keeps one lock in Redis however deep it nests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock key, as the program named it.
    pub key: String,
    /// The holder's description: the manager's
    /// [`holder`](crate::LockManagerBuilder::holder), by default
    /// `<hostname> pid <pid> <program>`.
    pub holder: String,
    /// The hold's fencing token.
    pub fencing_token: u64,
    /// Lease left, as Redis counts it; `None` when the key has no TTL (only a
    /// foreign writer causes that).
    pub ttl: Option<Duration>,
    /// When the hold began, by the holder's clock.
    pub held_since: SystemTime,
    /// Whether an acquisition waited for this hold (then its release publishes
    /// a wake-up).
    pub waited_for: bool,
}

impl LockInfo {
    /// Reads a stored lock value; `None` when distlock did not write it.
    pub(crate) fn parse(key: String, value: &str, pttl: i64) -> Option<LockInfo> {
        let mark = value.get(OWNER_LEN..OWNER_LEN + 1)?;
        let rest = value.get(OWNER_LEN + 1..)?;
        let (token, rest) = rest.split_once(':')?;
        let (since, holder) = rest.split_once(':')?;
        Some(LockInfo {
            key,
            holder: holder.to_owned(),
            fencing_token: token.parse().ok()?,
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            held_since: UNIX_EPOCH + Duration::from_millis(since.parse().ok()?),
            waited_for: mark == "+",
        })
    }
}

/// The fencing token recorded in a lock value (0 when it has none).
pub(crate) fn token_of(value: &str) -> u64 {
    value
        .get(OWNER_LEN + 1..)
        .and_then(|rest| rest.split(':').next())
        .and_then(|token| token.parse().ok())
        .unwrap_or(0)
}

/// The owner token that opens a lock value (the whole value if shorter).
pub(crate) fn owner_of(value: &str) -> &str {
    value.get(..OWNER_LEN).unwrap_or(value)
}

/// Milliseconds since the Unix epoch by this machine's clock (0 before 1970).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The default holder description: `<hostname> pid <pid> <program>`.
pub(crate) fn default_holder() -> String {
    let host = gethostname::gethostname();
    let program = std::env::current_exe()
        .ok()
        .and_then(|path| path.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".to_owned());
    let mut holder = format!(
        "{} pid {} {}",
        host.to_string_lossy(),
        std::process::id(),
        program
    );
    truncate(&mut holder, MAX_HOLDER_BYTES);
    holder
}

fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_back() {
        let owner = "0123456789abcdef0123456789abcdef";
        let info = LockInfo::parse(
            "order:42".into(),
            &format!("{owner}+1700000000000001:1700000000123:web-1 pid 7 api: v2"),
            2500,
        )
        .unwrap();
        assert_eq!(info.fencing_token, 1_700_000_000_000_001);
        assert_eq!(info.holder, "web-1 pid 7 api: v2");
        assert_eq!(info.ttl, Some(Duration::from_millis(2500)));
        assert_eq!(
            info.held_since,
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)
        );
        assert!(info.waited_for);
        assert_eq!(owner_of(&format!("{owner}-1:2:x")), owner);
        assert_eq!(token_of(&format!("{owner}-17:2:x")), 17);
        assert_eq!(token_of("short"), 0);
        let no_ttl = LockInfo::parse("k".into(), &format!("{owner}-1:2:"), -1).unwrap();
        assert_eq!(no_ttl.ttl, None);
        assert!(!no_ttl.waited_for);
    }

    #[test]
    fn foreign_values_are_refused() {
        assert_eq!(LockInfo::parse("k".into(), "hello", 10), None);
        assert_eq!(
            LockInfo::parse("k".into(), &format!("{}-x:2:h", "a".repeat(32)), 10),
            None
        );
    }

    #[test]
    fn the_default_holder_names_the_process() {
        let holder = default_holder();
        assert!(holder.contains(&format!(" pid {} ", std::process::id())));
        assert!(holder.len() <= MAX_HOLDER_BYTES);
    }
}

/// A semaphore's permits, from [`LockRequest::permit_counts`](crate::LockRequest::permit_counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitCounts {
    /// The permit count in force: the one the current holders use, or, when
    /// nobody holds a permit, the request's (the count lives as long as its
    /// holders).
    pub configured: u32,
    /// Permits held now by holders whose lease has not run out.
    pub held: u32,
    /// `configured - held`, or 0 when a resize left more holders than permits.
    pub available: u32,
}
