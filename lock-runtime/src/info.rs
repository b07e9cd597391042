//! What an operator sees of a held lock ([`LockInfo`]), read from the value the
//! acquire script stores: `<owner><mark><token>:<since>:<holder>` (see
//! `scripts/acquire.lua`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Length of an owner token (32 hex digits), which opens every lock value.
pub(crate) const OWNER_LEN: usize = 32;

/// Digits of an owner token that name the acquisition that made it: the keys
/// of one multi-key hold share them (see `config::owner_token_of`).
pub(crate) const ACQUISITION_ID_LEN: usize = 16;

/// Longest accepted holder description, in bytes. It is stored with every hold,
/// so it should say who holds the lock, not carry data.
pub(crate) const MAX_HOLDER_BYTES: usize = 256;

/// Which kind of hold a [`LockInfo`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HoldKind {
    /// The default lock: `lock`, or one key of a `lock_all`
    /// hold (whose keys share one
    /// [`acquisition_id`](LockInfo::acquisition_id)).
    Lock,
    /// The writer of a read-write lock.
    Write,
    /// One reader of a read-write lock.
    Read,
    /// One holder of a semaphore, with the permits it holds (more than one
    /// for a [`weight`](crate::LockRequest::weight)ed hold).
    Permits(u32),
}

impl std::fmt::Display for HoldKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HoldKind::Lock => f.write_str("lock"),
            HoldKind::Write => f.write_str("write"),
            HoldKind::Read => f.write_str("read"),
            HoldKind::Permits(1) => f.write_str("permit"),
            HoldKind::Permits(n) => write!(f, "{n} permits"),
        }
    }
}

/// A hold as Redis stores it, for operators: which kind, who holds it, since
/// when, until when, and with which fencing token. From
/// [`LockManager::inspect`](crate::LockManager::inspect) (the default lock),
/// [`LockManager::inspect_all`](crate::LockManager::inspect_all) and
/// [`LockManager::list`](crate::LockManager::list) (every kind).
///
/// Re-entrant holds of one task are not visible here: re-entry happens inside
/// the holding process, which keeps one lock in Redis however deep it nests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock key, as the program named it.
    pub key: String,
    /// The kind of hold: the default lock, a read-write lock's writer or one
    /// of its readers, a semaphore's holder.
    pub kind: HoldKind,
    /// Names this hold for
    /// [`LockManager::force_unlock_hold`](crate::LockManager::force_unlock_hold):
    /// its owner token (a weighted semaphore hold's with `:<permits>`), unique
    /// to the hold (the keys of one `lock_all` hold taken in one script share
    /// it, which is why `force_unlock_hold` also names the key). Whoever
    /// knows it can free the hold, so treat it as an operator's detail.
    pub hold_id: String,
    /// The acquisition that took this hold: the keys of one `lock_all` hold
    /// share it (on every deployment, whether the keys were taken in one
    /// script or one by one); holds taken apart have different ones.
    pub acquisition_id: String,
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
            kind: HoldKind::Lock,
            hold_id: value.get(..OWNER_LEN)?.to_owned(),
            acquisition_id: value.get(..ACQUISITION_ID_LEN)?.to_owned(),
            holder: holder.to_owned(),
            fencing_token: token.parse().ok()?,
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            held_since: UNIX_EPOCH.checked_add(Duration::from_millis(since.parse().ok()?))?,
            waited_for: mark == "+",
        })
    }

    /// A read hold's or a permit's entry: `member` in the holders' set (the
    /// owner token, `:<n>` for n permits), the end of its lease and the
    /// server's clock (ms), and its details `<token>:<since>:<holder>` when
    /// recorded.
    pub(crate) fn of_shared(
        key: &str,
        kind: HoldKind,
        member: String,
        ends_ms: i64,
        now_ms: i64,
        details: Option<&str>,
    ) -> LockInfo {
        let parsed = details.and_then(|details| {
            let (token, rest) = details.split_once(':')?;
            let (since, holder) = rest.split_once(':')?;
            Some((token.parse().ok()?, since.parse().ok()?, holder.to_owned()))
        });
        // Holds taken by a distlock that recorded no details (before 0.3)
        // show no holder, token or start.
        let (fencing_token, since, holder) = parsed.unwrap_or((0, 0, String::new()));
        LockInfo {
            key: key.to_owned(),
            kind,
            acquisition_id: member
                .get(..ACQUISITION_ID_LEN)
                .unwrap_or(&member)
                .to_owned(),
            hold_id: member,
            holder,
            fencing_token,
            ttl: u64::try_from(ends_ms.saturating_sub(now_ms))
                .ok()
                .map(Duration::from_millis),
            held_since: UNIX_EPOCH
                .checked_add(Duration::from_millis(since))
                .unwrap_or(UNIX_EPOCH),
            waited_for: false,
        }
    }
}

/// One acquisition waiting in the default lock's queue, from
/// [`LockManager::inspect_all`](crate::LockManager::inspect_all).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaiterInfo {
    /// The waiting manager's description (as [`LockInfo::holder`]).
    pub holder: String,
    /// The owner token the lock will be held under once handed to it.
    pub hold_id: String,
    /// How long its queue entry lasts unless the waiter refreshes it (it does
    /// every 0.4-0.8 s while it waits; a dead waiter's entry runs out).
    pub queue_lease_left: Duration,
}

impl WaiterInfo {
    /// A queue entry, `<expiry>:<ttl>:<fence_ttl>:<route>:<attempt>:<holder>`
    /// (see `scripts/queue_prelude.lua`), read at `now_ms` by the server's
    /// clock.
    pub(crate) fn parse(owner: String, entry: Option<&str>, now_ms: i64) -> WaiterInfo {
        let mut fields = entry.unwrap_or("").splitn(6, ':');
        let expiry: i64 = fields.next().and_then(|e| e.parse().ok()).unwrap_or(0);
        let holder = fields.nth(4).unwrap_or("").to_owned();
        WaiterInfo {
            holder,
            hold_id: owner,
            queue_lease_left: Duration::from_millis(
                u64::try_from(expiry.saturating_sub(now_ms)).unwrap_or(0),
            ),
        }
    }
}

/// Everything held on one key, of every kind, from
/// [`LockManager::inspect_all`](crate::LockManager::inspect_all): one
/// consistent snapshot (one script), which may be stale by the time it
/// arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The key, as the program named it.
    pub key: String,
    /// Every hold: the default lock's holder, a read-write lock's writer and
    /// its readers, a semaphore's holders (readers and semaphore holders in
    /// the order their leases end, soonest first).
    pub holds: Vec<LockInfo>,
    /// The default lock's waiters, in the order they will be served.
    pub waiters: Vec<WaiterInfo>,
    /// Whether a writer waits for the read-write lock's readers to leave
    /// (no new reader enters meanwhile).
    pub writer_waiting: bool,
    /// The semaphore's permit count, while anyone holds a permit.
    pub permits: Option<u32>,
    /// The counting semaphore's available permits
    /// ([`LockManager::counting_semaphore`](crate::LockManager::counting_semaphore)),
    /// when its counter exists. It has no holders: nothing of it is in
    /// [`holds`](Self::holds), and [`is_held`](Self::is_held) does not count it.
    pub counting_permits: Option<i64>,
    /// Acquisitions waiting for the counting semaphore's permits.
    pub counting_waiters: u64,
}

impl KeyState {
    /// Whether anyone holds anything on this key.
    pub fn is_held(&self) -> bool {
        !self.holds.is_empty()
    }

    /// The holds of one kind (for [`HoldKind::Permits`], every semaphore
    /// holder whatever its permits).
    pub fn holds_of(&self, kind: HoldKind) -> impl Iterator<Item = &LockInfo> {
        self.holds.iter().filter(move |h| match kind {
            HoldKind::Permits(_) => matches!(h.kind, HoldKind::Permits(_)),
            kind => h.kind == kind,
        })
    }
}

/// The permits a semaphore holder's member stands for: `<owner>:<n>` holds
/// n, a plain owner token one (as `weight_of` in the scripts).
pub(crate) fn permits_of(member: &str) -> u32 {
    member
        .get(OWNER_LEN..)
        .and_then(|rest| rest.strip_prefix(':'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
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
    /// `configured - held`, or 0 when a resize left more holders than permits
    /// (then [`overcommitted`](Self::overcommitted) says by how many).
    pub available: u32,
    /// `held - configured` when a resize shrank the count below the permits
    /// held (current holders keep theirs), else 0: how many permits must come
    /// back before anyone new enters. At most one of `available` and
    /// `overcommitted` is above 0; `available as i64 - overcommitted as i64`
    /// is the signed balance ([`balance`](Self::balance)).
    pub overcommitted: u32,
}

impl PermitCounts {
    /// `configured - held`, signed: below 0 when a resize left more permits
    /// held than the count in force.
    ///
    /// ```
    /// # fn demo(counts: distlock_runtime::PermitCounts) {
    /// if counts.balance() < 0 {
    ///     println!("{} permits over the count; nobody new enters", -counts.balance());
    /// }
    /// # }
    /// ```
    pub fn balance(&self) -> i64 {
        i64::from(self.configured) - i64::from(self.held)
    }
}
