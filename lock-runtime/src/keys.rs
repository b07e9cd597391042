//! Names of the Redis keys and channel behind one lock.
//!
//! A lock on user key `K` uses names that share one Redis Cluster hash tag,
//! so that one script may touch them all in cluster mode:
//!
//! ```text
//! <prefix>lock:{<tag>}:<K>    string "<owner><mark><token>:<since>:<holder>" (see
//!                             scripts/acquire.lua), with the lease as TTL
//! <prefix>fence:{<tag>}:<K>   last fencing token issued (TTL: lease + retention)
//! <prefix>wake:{<tag>}:<K>    pub/sub channel; release publishes its wake-up on
//!                             it (a hand-off goes to the head's manager's
//!                             `<prefix>handoff:<route>`, see `Core::handoff_channel`)
//! <prefix>lockq:{<tag>}:<K>   queue of waiters: owner token scored by arrival
//! <prefix>lockqe:{<tag>}:<K>  each queue entry's queue lease and hand-off
//!                             details (see scripts/queue_prelude.lua)
//! ```
//!
//! A read-write lock uses `rw` (the writer's string, in the lock's format),
//! `rwr` (a sorted set of readers: owner token scored by its lease's end, server
//! clock in ms), `rwrd` (each reader's token, start and holder, for operators),
//! `rwi` (a waiting writer's intent), `rwfence` and `rwwake`; a semaphore `sem`
//! (a sorted set of permit holders, scored the same way), `semd` (each
//! holder's details), `semp` (its permit count), `semfence` and `semwake`; a
//! counting semaphore `csem` (its available permits, a decimal string),
//! `csemw` (its waiters: owner token scored by the end of the registration,
//! server clock in ms), `csemwake` and, on Cluster and Sentinel, one short-lived
//! `csemdone:{tag}:K:<owner>` per change (its receipt; see [`CounterNames`]).
//! A force-unlock on Cluster and Sentinel leaves a short-lived receipt too,
//! `unlocked:{tag}:<token>` (see `force_unlock.lua`).
//! Every kind's names share the key's hash tag.
//!
//! The tag is a hash of `K` written in hex, so braces in `K` cannot move the tag:
//! Redis takes the first `{...}` of a name, and the prefix may not contain braces.
//! The kind (`lock`, `fence`, `wake`) comes before the tag, so no user key can make
//! one lock's name equal another's.

use crate::error::LockError;

/// Longest accepted user key. Redis takes keys up to 512 MiB, but a lock key that
/// large is a bug in the caller, and each script call carries the key three times.
pub(crate) const MAX_KEY_BYTES: usize = 1 << 20;

/// What kind of hold a lock is: each kind has its own Redis names (so one user
/// key may be an exclusive lock, a read-write lock and a semaphore at once,
/// independently) and its own scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// `LockManager::lock`: one holder; waiters queue in Redis and are handed
    /// the lock in arrival order.
    Exclusive,
    /// `LockManager::write_lock`: one holder, and no reader.
    Write,
    /// `LockManager::read_lock`: any number of readers while no writer holds
    /// or waits.
    Read,
    /// `LockManager::semaphore`: up to `permits` holders.
    Permit { permits: u32 },
}

impl LockKind {
    /// The kinds that share Redis names: a write and a read lock on one key
    /// are one read-write lock.
    pub(crate) fn family(self) -> LockFamily {
        match self {
            LockKind::Exclusive => LockFamily::Lock,
            LockKind::Write | LockKind::Read => LockFamily::ReadWrite,
            LockKind::Permit { .. } => LockFamily::Semaphore,
        }
    }
}

/// The locks that share Redis names on one key: what re-entry matches a hold
/// on, and how messages name the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockFamily {
    /// The default lock (`lock`, `lock_all`).
    Lock,
    /// A read-write lock: its read and write holds.
    ReadWrite,
    /// A semaphore.
    Semaphore,
}

impl std::fmt::Display for LockFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LockFamily::Lock => "lock",
            LockFamily::ReadWrite => "read-write lock",
            LockFamily::Semaphore => "semaphore",
        })
    }
}

/// The Redis names behind one lock, from
/// [`LockManager::redis_names`](crate::LockManager::redis_names): for
/// inspection and tests. The runtime uses the same value for every call on
/// the lock (with names only its scripts need).
///
/// Only the lock's own name is built with the value: a lock taken while free
/// and released with nobody waiting touches no other name, so the others are
/// built at their first use (each derived from the lock's name, whose prefix
/// and tagged key they share).
#[derive(Clone)]
#[non_exhaustive]
pub struct RedisNames {
    /// Where the hold lives: for the default lock and a write lock a string
    /// `<owner><mark><token>:<since>:<holder>` whose TTL is the lease; for read
    /// locks and semaphores a sorted set of holders, which the renewal resets.
    pub lock: String,
    /// The length of the key prefix at the start of `lock`.
    prefix_len: usize,
    pub(crate) kind: LockKind,
    /// The other names, once one of them is asked for.
    siblings: std::sync::OnceLock<Siblings>,
    /// Where the scripts publish this lock's events (`<prefix>events:<key>`,
    /// see `LockManager::events`); empty when the manager does not publish
    /// them.
    pub(crate) events: String,
}

/// The names of a lock besides its own (see [`RedisNames`]'s accessors).
#[derive(Debug, Clone)]
struct Siblings {
    fencing_counter: String,
    channel: String,
    related: String,
    intent: String,
    details: String,
}

/// The channel a lock's events are published on: `<prefix>events:<key>`, so
/// that a subscriber's glob over keys is a `PSUBSCRIBE` pattern.
pub(crate) fn events_channel(prefix: &str, key: &str) -> String {
    format!("{prefix}{EVENTS_INFIX}{key}")
}

/// What follows the prefix in an events channel's name.
pub(crate) const EVENTS_INFIX: &str = "events:";

impl RedisNames {
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        Self::of(prefix, key, LockKind::Exclusive)
    }

    /// These names with the lock's events channel set (the default lock
    /// only: the other kinds publish no events).
    pub(crate) fn with_events(mut self, prefix: &str, key: &str) -> Self {
        if self.kind == LockKind::Exclusive {
            self.events = events_channel(prefix, key);
        }
        self
    }

    pub(crate) fn of(prefix: &str, key: &str, kind: LockKind) -> Self {
        RedisNames {
            lock: tagged_name(prefix, kind.names().lock, key),
            prefix_len: prefix.len(),
            kind,
            siblings: std::sync::OnceLock::new(),
            events: String::new(),
        }
    }

    /// The last fencing token issued for this lock; it outlives the lock by the
    /// manager's [fence retention](crate::LockManagerBuilder::fence_retention).
    pub fn fencing_counter(&self) -> &str {
        &self.siblings().fencing_counter
    }

    /// The pub/sub channel on which a release wakes waiters that do not queue.
    pub fn channel(&self) -> &str {
        &self.siblings().channel
    }

    /// The other name a hold's scripts read: for a write lock the readers'
    /// set, for a read lock the writer's string, for a semaphore its permit
    /// count, for the default lock its queue of waiters.
    pub(crate) fn related(&self) -> &str {
        &self.siblings().related
    }

    /// A read-write lock's writer intent: a waiting writer's owner token,
    /// which keeps new readers out (so readers cannot starve writers); the
    /// default lock's queue entries (each waiter's queue lease); empty for a
    /// semaphore.
    pub(crate) fn intent(&self) -> &str {
        &self.siblings().intent
    }

    /// A shared kind's holder details (`rwrd`, `semd`: owner token ->
    /// `<token>:<since>:<holder>`, see `scripts/shared_prelude.lua`); empty
    /// for the default lock.
    pub(crate) fn details(&self) -> &str {
        &self.siblings().details
    }

    fn siblings(&self) -> &Siblings {
        self.siblings.get_or_init(|| {
            let kinds = self.kind.names();
            // `lock` is `<prefix><kind>:{<tag>}:<key>`: every sibling is the
            // same with its own kind.
            let prefix = self.lock.get(..self.prefix_len).unwrap_or_default();
            let tagged_key = self
                .lock
                .get(self.prefix_len + kinds.lock.len()..)
                .unwrap_or_default();
            let name = |kind: &str| {
                if kind.is_empty() {
                    return String::new();
                }
                let mut s = String::with_capacity(prefix.len() + kind.len() + tagged_key.len());
                s.push_str(prefix);
                s.push_str(kind);
                s.push_str(tagged_key);
                s
            };
            Siblings {
                fencing_counter: name(kinds.fencing_counter),
                channel: name(kinds.channel),
                related: name(kinds.related),
                intent: name(kinds.intent),
                details: name(kinds.details),
            }
        })
    }
}

impl std::fmt::Debug for RedisNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisNames")
            .field("lock", &self.lock)
            .field("fencing_counter", &self.fencing_counter())
            .field("channel", &self.channel())
            .field("kind", &self.kind)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// Equal when they name the same lock: every other name follows from the
/// lock's own and its kind.
impl PartialEq for RedisNames {
    fn eq(&self, other: &Self) -> bool {
        self.lock == other.lock
            && self.prefix_len == other.prefix_len
            && self.kind == other.kind
            && self.events == other.events
    }
}

impl Eq for RedisNames {}

/// The kind part of each of a lock's names (`<prefix><kind>:{<tag>}:<key>`);
/// empty for a name the kind does not have.
struct KindNames {
    lock: &'static str,
    fencing_counter: &'static str,
    channel: &'static str,
    related: &'static str,
    intent: &'static str,
    details: &'static str,
}

impl LockKind {
    fn names(self) -> KindNames {
        let (lock, fencing_counter, channel, related, intent, details) = match self {
            LockKind::Exclusive => ("lock", "fence", "wake", "lockq", "lockqe", ""),
            LockKind::Write => ("rw", "rwfence", "rwwake", "rwr", "rwi", "rwrd"),
            LockKind::Read => ("rwr", "rwfence", "rwwake", "rw", "rwi", "rwrd"),
            LockKind::Permit { .. } => ("sem", "semfence", "semwake", "semp", "", "semd"),
        };
        KindNames {
            lock,
            fencing_counter,
            channel,
            related,
            intent,
            details,
        }
    }
}

/// `<prefix><kind>:{<tag>}:<key>`, the tag being a hash of the key.
fn tagged_name(prefix: &str, kind: &str, key: &str) -> String {
    let tag = hash_tag(key);
    let tag = tag.as_str();
    let mut s = String::with_capacity(prefix.len() + kind.len() + tag.len() + key.len() + 4);
    s.push_str(prefix);
    s.push_str(kind);
    s.push_str(":{");
    s.push_str(tag);
    s.push_str("}:");
    s.push_str(key);
    s
}

/// Every kind's names of one user key, for an operator's reading or
/// force-unlock of all of them (one script: they share the key's hash tag).
#[derive(Debug, Clone)]
pub(crate) struct KeyNames {
    /// The default lock's (with its queue).
    pub(crate) lock: RedisNames,
    /// The read-write lock's (a write lock's names: the writer first).
    pub(crate) read_write: RedisNames,
    /// The semaphore's.
    pub(crate) semaphore: RedisNames,
    /// The counting semaphore's.
    pub(crate) counter: CounterNames,
}

impl KeyNames {
    pub(crate) fn of(prefix: &str, key: &str) -> Self {
        KeyNames {
            lock: RedisNames::of(prefix, key, LockKind::Exclusive),
            read_write: RedisNames::of(prefix, key, LockKind::Write),
            semaphore: RedisNames::of(prefix, key, LockKind::Permit { permits: 1 }),
            counter: CounterNames::of(prefix, key),
        }
    }
}

/// The Redis names of a counting semaphore
/// ([`LockManager::counting_semaphore`](crate::LockManager::counting_semaphore)),
/// which has no holders and no lease, so none of a lock's other names: all
/// three share the key's hash tag (one script touches them on one cluster
/// slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CounterNames {
    /// `<prefix>csem:{<tag>}:<key>`: the available permits, a decimal string
    /// (negative after a shrink below what is taken); no TTL.
    pub(crate) counter: String,
    /// `<prefix>csemw:{<tag>}:<key>`: the acquisitions waiting now, owner
    /// token scored by the end of its registration (server clock, ms), so
    /// that a change publishes a wake-up only when someone may be waiting.
    pub(crate) waiters: String,
    /// `<prefix>csemwake:{<tag>}:<key>`: the pub/sub channel of its
    /// wake-ups.
    pub(crate) channel: String,
    /// `<prefix>csemdone:{<tag>}:<key>`: the start of the names of its
    /// changes' receipts (see [`receipt`](Self::receipt)).
    receipts: String,
}

/// The kind part of a counting semaphore's counter (`<prefix>csem:{..}:<key>`).
const COUNTER_KIND: &str = "csem";

impl CounterNames {
    pub(crate) fn of(prefix: &str, key: &str) -> Self {
        CounterNames {
            counter: tagged_name(prefix, COUNTER_KIND, key),
            waiters: tagged_name(prefix, "csemw", key),
            channel: tagged_name(prefix, "csemwake", key),
            receipts: tagged_name(prefix, "csemdone", key),
        }
    }

    /// `<prefix>csemdone:{<tag>}:<key>:<owner>`: the receipt of the change
    /// made under owner token `owner`, a string that expires; a script sent
    /// again after its reply was lost finds it and answers what it did the
    /// first time, instead of doing it twice (see `counter_prelude.lua`).
    pub(crate) fn receipt(&self, owner: &str) -> String {
        let mut name = String::with_capacity(self.receipts.len() + 1 + owner.len());
        name.push_str(&self.receipts);
        name.push(':');
        name.push_str(owner);
        name
    }
}

/// The `SCAN MATCH` pattern for the counting semaphores' counters under
/// `prefix` whose user key matches the glob `user_pattern`.
pub(crate) fn counter_scan_pattern(prefix: &str, user_pattern: &str) -> String {
    name_pattern(prefix, COUNTER_KIND, user_pattern)
}

/// The user key of counting semaphore counter `name` under `prefix`, when it
/// is one.
pub(crate) fn counter_key_of<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
    key_of_kind(prefix, name, &[COUNTER_KIND])
}

/// The `SCAN MATCH` pattern for the lock keys under `prefix` whose user key
/// matches the glob `user_pattern` (Redis glob syntax: `*`, `?`, `[..]`, `\\`).
pub(crate) fn lock_scan_pattern(prefix: &str, user_pattern: &str) -> String {
    name_pattern(prefix, "lock", user_pattern)
}

/// `<prefix><kind>:{<any tag>}:<user pattern>`, the prefix escaped; `kind` is
/// a glob itself.
fn name_pattern(prefix: &str, kind: &str, user_pattern: &str) -> String {
    let mut pattern = escape_glob(prefix);
    pattern.push_str(kind);
    pattern.push_str(":{");
    pattern.push_str(&"?".repeat(16));
    pattern.push_str("}:");
    pattern.push_str(user_pattern);
    pattern
}

/// The `SCAN MATCH` pattern for every name of every kind under `prefix`
/// whose user key matches the glob `user_pattern`; [`held_key_of`] keeps the
/// names that hold a lock.
pub(crate) fn any_kind_scan_pattern(prefix: &str, user_pattern: &str) -> String {
    name_pattern(prefix, "*", user_pattern)
}

/// The user key of `name` under `prefix` when `name` holds holds: a default
/// lock (`lock`), a read-write lock's writer (`rw`) or readers (`rwr`), a
/// semaphore's holders (`sem`).
pub(crate) fn held_key_of<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
    key_of_kind(prefix, name, &["lock", "rw", "rwr", "sem"])
}

/// The user key of `name`, a name of one of `kinds` under `prefix`.
fn key_of_kind<'a>(prefix: &str, name: &'a str, kinds: &[&str]) -> Option<&'a str> {
    let (kind, rest) = name.strip_prefix(prefix)?.split_once(":{")?;
    if !kinds.contains(&kind) {
        return None;
    }
    let (tag, key) = (rest.get(..16)?, rest.get(16..)?.strip_prefix("}:")?);
    (hash_tag(key).as_str() == tag).then_some(key)
}

/// `text` with its glob characters escaped, so that as a `SCAN MATCH` or
/// `PSUBSCRIBE` pattern it matches itself only.
pub(crate) fn escape_glob(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Whether `text` matches the glob `pattern` as `PSUBSCRIBE` and `SCAN
/// MATCH` read it (`*`, `?`, `[abc]`, `[a-z]`, `[^a]`, `\` escapes; `[!a]`
/// too, as PostgreSQL's `list` takes it): for a store whose channels take no
/// patterns, where the subscriber filters the events itself. An unclosed or
/// empty class matches nothing.
pub(crate) fn glob_matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // The last `*` seen: the pattern after it, and the text it has eaten up
    // to. A mismatch lets it eat one character more (one star suffices:
    // whatever an earlier star would eat more, the later one can).
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if p.get(pi) == Some(&'*') {
            pi += 1;
            star = Some((pi, ti));
            continue;
        }
        if pi < p.len() {
            let (matched, next) = glob_element_matches(&p, pi, t[ti]);
            if matched {
                pi = next;
                ti += 1;
                continue;
            }
        }
        match star {
            Some((after, eaten)) => {
                pi = after;
                ti = eaten + 1;
                star = Some((after, eaten + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether the pattern element at `p[i]` (not `*`) matches `c`, and where
/// the next element starts.
fn glob_element_matches(p: &[char], i: usize, c: char) -> (bool, usize) {
    match p[i] {
        '?' => (true, i + 1),
        '\\' if i + 1 < p.len() => (p[i + 1] == c, i + 2),
        '[' => {
            let mut j = i + 1;
            let negated = matches!(p.get(j), Some('^') | Some('!'));
            if negated {
                j += 1;
            }
            let (mut matched, mut members) = (false, 0);
            loop {
                match p.get(j) {
                    None => return (false, p.len()),
                    Some(']') => {
                        j += 1;
                        break;
                    }
                    Some('\\') if j + 1 < p.len() => {
                        matched |= p[j + 1] == c;
                        j += 2;
                    }
                    Some(&low)
                        if p.get(j + 1) == Some(&'-')
                            && !matches!(p.get(j + 2), None | Some(']')) =>
                    {
                        let high = p[j + 2];
                        let (low, high) = if low <= high {
                            (low, high)
                        } else {
                            (high, low)
                        };
                        matched |= (low..=high).contains(&c);
                        j += 3;
                    }
                    Some(&other) => {
                        matched |= other == c;
                        j += 1;
                    }
                }
                members += 1;
            }
            (members > 0 && matched != negated, j)
        }
        other => (other == c, i + 1),
    }
}

/// The user key of lock key `name` under `prefix`, when it is one.
pub(crate) fn user_key_of<'a>(prefix: &str, name: &'a str) -> Option<&'a str> {
    key_of_kind(prefix, name, &["lock"])
}

/// Checks a user key: any non-empty UTF-8 string up to [`MAX_KEY_BYTES`].
pub(crate) fn validate_key(key: &str) -> Result<(), LockError> {
    let reason = if key.is_empty() {
        "the key is empty".to_owned()
    } else if key.len() > MAX_KEY_BYTES {
        format!(
            "the key is {} bytes long; the limit is {MAX_KEY_BYTES}",
            key.len()
        )
    } else {
        return Ok(());
    };
    Err(LockError::InvalidKey {
        key: key.to_owned(),
        reason,
    })
}

/// Checks a key prefix: it may not contain `{` or `}`, which would move the
/// cluster hash tag out of our control.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.contains(['{', '}']) {
        return Err(LockError::InvalidConfig(format!(
            "key prefix {prefix:?} contains a brace; braces would change the Redis Cluster hash slot of lock keys"
        )));
    }
    if prefix.len() > 1024 {
        return Err(LockError::InvalidConfig(format!(
            "key prefix is {} bytes long; the limit is 1024",
            prefix.len()
        )));
    }
    Ok(())
}

/// 64-bit FNV-1a of the key in 16 hex digits. Stable across processes, versions
/// and platforms (unlike `std`'s hasher), which every replica relies on.
fn hash_tag(key: &str) -> HashTag {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = key
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    let mut digits = [0u8; 16];
    for (i, d) in digits.iter_mut().enumerate() {
        *d = b"0123456789abcdef"[((hash >> (60 - 4 * i)) & 0xf) as usize];
    }
    HashTag(digits)
}

/// The 16 hex digits of a hash tag, on the stack: one allocation fewer per
/// acquisition than a `String`.
struct HashTag([u8; 16]);

impl HashTag {
    fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs_match_as_redis_reads_them() {
        for (pattern, text, expected) in [
            ("order:*", "order:1", true),
            ("order:*", "orders:1", false),
            ("*", "", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("[ab]x", "bx", true),
            ("[^ab]x", "bx", false),
            ("[!ab]x", "cx", true),
            ("[a-c]", "b", true),
            ("[c-a]", "b", true),
            ("[a-]", "-", true),
            ("\\*", "*", true),
            ("\\*", "x", false),
            ("[ab", "a", false),
            ("[]", "a", false),
            ("é*", "étage", true),
            ("a b", "a b", true),
        ] {
            assert_eq!(
                glob_matches(pattern, text),
                expected,
                "{pattern:?} on {text:?}"
            );
        }
    }

    use super::*;

    #[test]
    fn lock_names_map_back_to_user_keys() {
        let keys = RedisNames::new("app*1:", "order:}:42");
        assert_eq!(user_key_of("app*1:", &keys.lock), Some("order:}:42"));
        assert_eq!(user_key_of("app*1:", keys.fencing_counter()), None);
        assert_eq!(user_key_of("other:", &keys.lock), None);
        for kind in [
            LockKind::Exclusive,
            LockKind::Write,
            LockKind::Read,
            LockKind::Permit { permits: 2 },
        ] {
            let names = RedisNames::of("app*1:", "order:}:42", kind);
            assert_eq!(held_key_of("app*1:", &names.lock), Some("order:}:42"));
            assert_eq!(held_key_of("app*1:", names.fencing_counter()), None);
            assert_eq!(held_key_of("app*1:", names.channel()), None);
        }
        assert_eq!(
            any_kind_scan_pattern("app*1:", "order:*"),
            format!("app\\*1:*:{{{}}}:order:*", "?".repeat(16))
        );
        assert_eq!(
            lock_scan_pattern("app*1:", "order:*"),
            "app\\*1:lock:{????????????????}:order:*"
        );
    }

    /// What Redis Cluster hashes: the part between the first `{` and the next `}`,
    /// when non-empty; otherwise the whole name.
    fn cluster_hash_part(name: &str) -> &str {
        if let Some(open) = name.find('{') {
            if let Some(len) = name[open + 1..].find('}') {
                if len > 0 {
                    return &name[open + 1..open + 1 + len];
                }
            }
        }
        name
    }

    #[test]
    fn names_share_one_hash_tag_whatever_the_key() {
        for key in [
            "order:42",
            "{a}",
            "}{",
            "{}",
            "a{b}c",
            "{{x}}",
            "ünï cødé\n\"q\"",
        ] {
            let k = RedisNames::new("distlock:", key);
            let tag = cluster_hash_part(&k.lock);
            assert_eq!(tag.len(), 16, "{key:?} -> {}", k.lock);
            assert_eq!(cluster_hash_part(k.fencing_counter()), tag);
            assert_eq!(cluster_hash_part(k.channel()), tag);
            assert!(k.lock.starts_with("distlock:lock:{"));
            assert!(k.lock.ends_with(key));
        }
    }

    #[test]
    fn the_queue_names_share_the_tag_and_are_not_lock_names() {
        let keys = RedisNames::new("distlock:", "k");
        let tag = cluster_hash_part(&keys.lock);
        for name in [&keys.related(), &keys.intent()] {
            assert_eq!(cluster_hash_part(name), tag, "{name}");
            assert_eq!(user_key_of("distlock:", name), None);
        }
        assert!(keys.related().starts_with("distlock:lockq:{"));
        assert!(keys.intent().starts_with("distlock:lockqe:{"));
    }

    #[test]
    fn sibling_names_are_built_from_the_lock_name_for_every_kind() {
        let tag = hash_tag("a:{b}").as_str().to_owned();
        let full = |kind: &str| format!("app*1:{kind}:{{{tag}}}:a:{{b}}");
        let expected = [
            (
                LockKind::Exclusive,
                ["lock", "fence", "wake", "lockq", "lockqe", ""],
            ),
            (
                LockKind::Write,
                ["rw", "rwfence", "rwwake", "rwr", "rwi", "rwrd"],
            ),
            (
                LockKind::Read,
                ["rwr", "rwfence", "rwwake", "rw", "rwi", "rwrd"],
            ),
            (
                LockKind::Permit { permits: 3 },
                ["sem", "semfence", "semwake", "semp", "", "semd"],
            ),
        ];
        for (kind, [lock, fence, wake, related, intent, details]) in expected {
            let names = RedisNames::of("app*1:", "a:{b}", kind);
            // A clone taken before the siblings are built builds the same.
            let early = names.clone();
            let name_or_empty = |k: &str| if k.is_empty() { String::new() } else { full(k) };
            assert_eq!(names.lock, full(lock));
            assert_eq!(names.fencing_counter(), full(fence));
            assert_eq!(names.channel(), full(wake));
            assert_eq!(names.related(), full(related));
            assert_eq!(names.intent(), name_or_empty(intent));
            assert_eq!(names.details(), name_or_empty(details));
            assert_eq!(early.fencing_counter(), names.fencing_counter());
            assert_eq!(early, names);
        }
    }

    #[test]
    fn counting_semaphore_names_share_the_tag_and_map_back() {
        let names = CounterNames::of("app*1:", "pool:{x}");
        let tag = cluster_hash_part(&names.counter);
        let receipt = names.receipt("0123abcd");
        assert!(receipt.starts_with("app*1:csemdone:{"), "{receipt}");
        assert!(receipt.ends_with(":pool:{x}:0123abcd"), "{receipt}");
        for name in [&names.counter, &names.waiters, &names.channel, &receipt] {
            assert_eq!(cluster_hash_part(name), tag, "{name}");
            assert_eq!(held_key_of("app*1:", name), None, "not a hold: {name}");
            assert_eq!(
                counter_key_of("app*1:", name).is_some(),
                name == &names.counter
            );
        }
        assert!(names.counter.starts_with("app*1:csem:{"));
        assert_eq!(counter_key_of("app*1:", &names.counter), Some("pool:{x}"));
        assert_eq!(counter_key_of("app*1:", &names.waiters), None);
        assert_eq!(
            counter_scan_pattern("app*1:", "pool:*"),
            "app\\*1:csem:{????????????????}:pool:*"
        );
        let leased = RedisNames::of("app*1:", "pool:{x}", LockKind::Permit { permits: 1 });
        assert_ne!(leased.lock, names.counter);
    }

    #[test]
    fn distinct_keys_get_distinct_names() {
        let a = RedisNames::new("p:", "a");
        let b = RedisNames::new("p:", "a:fence");
        assert_ne!(a.lock, b.lock);
        assert_ne!(a.fencing_counter(), b.lock);
        assert_ne!(a.lock, RedisNames::new("p:", "b").lock);
    }

    #[test]
    fn hash_tag_is_stable() {
        // Pinned: a change would make replicas of different versions disagree.
        assert_eq!(hash_tag("").as_str(), "cbf29ce484222325");
        assert_eq!(hash_tag("a").as_str(), "af63dc4c8601ec8c");
    }

    #[test]
    fn key_and_prefix_validation() {
        assert!(matches!(
            validate_key(""),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(validate_key(&"x".repeat(10 * 1024)).is_ok());
        assert!(validate_key(&"x".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(validate_prefix("app:locks:").is_ok());
        assert!(validate_prefix("").is_ok());
        assert!(matches!(
            validate_prefix("a{b"),
            Err(LockError::InvalidConfig(_))
        ));
    }
}
