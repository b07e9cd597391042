//! The manager's settings, their limits, and how they are checked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::LockError;

/// Shortest lease accepted. The holder trusts a lease for `lease - 1% - 2 ms` and
/// renews it every `lease / 3`; below 10 ms the renewal cannot come in time.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Longest lease or wait accepted; anything longer is taken for a unit mistake.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Default of [`LockManagerBuilder::fence_retention`](crate::LockManagerBuilder::fence_retention).
pub const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(10 * 60);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A process-wide unique id (managers, leases, waiter registrations).
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) key_prefix: String,
    pub(crate) default_lease: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    /// How long a fencing counter outlives the lease of the acquisition that last
    /// wrote it.
    pub(crate) fence_retention: Duration,
    /// Refuse to build when `maxmemory-policy` may evict lock keys (else: warn).
    pub(crate) reject_evicting_policy: bool,
    /// Calls that find the shared connection idle may take the direct lane
    /// (`backend/direct.rs`), a second connection per server; off, every call
    /// goes through the multiplexed connection.
    pub(crate) direct_lane: bool,
    /// Count an acquisition only once this many replicas confirmed it.
    pub(crate) replica_ack: Option<ReplicaAck>,
    /// Who holds this manager's locks, as operators see it (`LockInfo::holder`).
    pub(crate) holder: String,
    /// Issue a hold's fencing token inside its acquisition by default, rather
    /// than when the holder first asks for it.
    pub(crate) eager_fencing: bool,
    /// How waiters that are not handed their lock pace their attempts.
    pub(crate) backoff: Backoff,
    /// Publish the default lock's events (acquired, released, handed over,
    /// lost) for `LockManager::events`.
    pub(crate) lock_events: bool,
    /// How often a Redis connection tries to reconnect within one call
    /// before the call fails (see `single::connection_config`); Redlock sets
    /// 0 for its members (see `Redlock::connect`). Not a builder option.
    pub(crate) reconnect_retries: usize,
    /// The PostgreSQL store's settings (unused on Redis).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) postgres: PostgresSettings,
}

/// Settings of the PostgreSQL store.
#[derive(Clone)]
pub(crate) struct PostgresSettings {
    /// The schema that holds distlock's tables and functions.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) schema: String,
    /// Create the schema in `build()` when it is missing.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) create_schema: bool,
    /// How often the manager deletes dead rows (expired locks, dead waiters).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) sweep_interval: Duration,
    /// Where the listening connection goes, when not to the main URL: a
    /// direct connection beside a transaction-mode pooler, which does not
    /// carry notifications.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) listen_url: Option<String>,
    /// Prepare each statement once per data connection (named prepared
    /// statements) instead of sending it unnamed with each call.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) prepared_statements: bool,
    /// Refuse to build unless every grant's commit waits for a synchronous
    /// standby (see `backend/postgres/replication.rs`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) synchronous_standby: bool,
}

impl Default for PostgresSettings {
    fn default() -> Self {
        PostgresSettings {
            schema: "distlock".to_owned(),
            create_schema: true,
            sweep_interval: Duration::from_secs(10),
            prepared_statements: false,
            listen_url: None,
            synchronous_standby: false,
        }
    }
}

/// How a waiting acquisition paces its attempts when no message brings it the
/// lock: each sleep is drawn from an exponential series that starts at
/// [`first`](Self::first) and doubles up to [`cap`](Self::cap), with a
/// [`jitter`](Self::with_jitter) fraction of it random.
///
/// The default (8 ms doubling to 1 s, full jitter) suits a Redis on the same
/// network: a wake-up message normally ends the wait long before the timer
/// does, and the timer only covers for a lost message or a holder that died
/// (its sleep is then also capped by the holder's remaining lease, so a lock
/// that expires is retried as it does). A Redis far away or heavily shared
/// wants fewer attempts: a larger `first` and `cap`.
///
/// It paces read-write locks, semaphores, Redlock and the ordered path of
/// [`lock_all`](crate::LockManager::lock_all). The default lock's queued
/// waiters on one server, Cluster and Sentinel do not poll: they are handed
/// the lock by a message and refresh their place in the queue every 0.4-0.8 s,
/// whatever the backoff.
///
/// ```
/// use std::time::Duration;
/// use distlock_runtime::Backoff;
///
/// // Start at 50 ms, double up to 2 s, half of each sleep random.
/// let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2)).with_jitter(0.5);
/// assert_eq!(backoff.cap(), Duration::from_secs(2));
///
/// // Grow by half each time instead of doubling: 50, 75, 112.5 ms, ...
/// let gentle = backoff.with_factor(1.5);
/// assert_eq!(gentle.factor(), 1.5);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    jitter: f64,
    factor: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            first: Duration::from_millis(8),
            cap: Duration::from_secs(1),
            jitter: 1.0,
            factor: 2.0,
        }
    }
}

impl Backoff {
    /// Sleeps that start at `first` and double (see
    /// [`with_factor`](Self::with_factor)) up to `cap`, with full jitter
    /// (each sleep a random duration up to the series' value). Checked when
    /// used: `first` at least 1 ms, `cap` at least `first` and at most 30 days.
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff {
            first,
            cap,
            jitter: 1.0,
            factor: 2.0,
        }
    }

    /// How much each series value grows over the one before (default `2.0`,
    /// doubling), up to `cap`: `1.0` keeps every sleep at `first` (a fixed
    /// interval), a larger factor reaches `cap` in fewer attempts. Checked
    /// when used: finite, from 1.0 to 16.0.
    pub fn with_factor(mut self, factor: f64) -> Backoff {
        self.factor = factor;
        self
    }

    /// The growth factor of the series.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// The series value after `value`: `value * factor`, at most `cap` and
    /// never below `first` (whatever an unchecked factor says).
    pub(crate) fn grow(&self, value: Duration) -> Duration {
        Duration::try_from_secs_f64(value.as_secs_f64() * self.factor)
            .unwrap_or(self.cap)
            .min(self.cap)
            .max(self.first)
    }

    /// The random part of each sleep, from `0.0` (every sleep is the series'
    /// value: attempts in lockstep with other waiters that started together)
    /// to `1.0` (the default: a random sleep up to the series' value). A
    /// sleep is `value * (1 - jitter) + random(0 ..= value * jitter)`.
    pub fn with_jitter(mut self, jitter: f64) -> Backoff {
        self.jitter = jitter;
        self
    }

    /// The first sleep's series value.
    pub fn first(&self) -> Duration {
        self.first
    }

    /// The longest series value.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The random fraction of each sleep.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    pub(crate) fn validate(&self, what: &str) -> Result<(), LockError> {
        if self.first < Duration::from_millis(1) || self.cap < self.first || self.cap > MAX_DURATION
        {
            return Err(LockError::InvalidConfig(format!(
                "{what} starts at {:?} and is capped at {:?}; it must start at 1 ms or more \
                 and be capped at no less than its start and at most 30 days",
                self.first, self.cap
            )));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(LockError::InvalidConfig(format!(
                "{what} has a jitter of {}; it must be between 0.0 and 1.0",
                self.jitter
            )));
        }
        if !(1.0..=16.0).contains(&self.factor) {
            return Err(LockError::InvalidConfig(format!(
                "{what} has a growth factor of {}; it must be between 1.0 and 16.0",
                self.factor
            )));
        }
        Ok(())
    }
}

/// How many replicas must confirm an acquisition (`WAIT`), and how long to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl Config {
    /// How long a receipt is kept on Redis (counting semaphore changes,
    /// force-unlocks): a call is sent again within its call, which the
    /// command timeout bounds (Cluster's client sends it again on a new
    /// connection at once; Sentinel's backend after asking the sentinels, a
    /// call on each master); four command timeouts and 10 s more cover both
    /// with room.
    pub(crate) fn receipt_ms(&self) -> u64 {
        receipt_window_ms(self.command_timeout)
    }
}

/// [`Config::receipt_ms`] for a command timeout of `command_timeout`.
pub(crate) fn receipt_window_ms(command_timeout: Duration) -> u64 {
    let window = command_timeout.saturating_mul(4) + Duration::from_secs(10);
    u64::try_from(window.as_millis()).unwrap_or(u64::MAX)
}

impl ReplicaAck {
    pub(crate) fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            key_prefix: "distlock:".to_owned(),
            default_lease: Duration::from_secs(30),
            default_wait: Duration::from_secs(10),
            command_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            fence_retention: DEFAULT_FENCE_RETENTION,
            reject_evicting_policy: false,
            direct_lane: true,
            replica_ack: None,
            holder: crate::info::default_holder(),
            eager_fencing: false,
            backoff: Backoff::default(),
            lock_events: false,
            reconnect_retries: 2,
            postgres: PostgresSettings::default(),
        }
    }
}

impl Config {
    /// Checks every setting; the first bad one is the error.
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        crate::keys::validate_prefix(&self.key_prefix)?;
        if self.holder.len() > crate::info::MAX_HOLDER_BYTES {
            return Err(LockError::InvalidConfig(format!(
                "the holder description is {} bytes long; the limit is {}",
                self.holder.len(),
                crate::info::MAX_HOLDER_BYTES
            )));
        }
        validate_lease(self.default_lease, "default lease")?;
        self.backoff.validate("the manager's backoff")?;
        validate_wait(self.default_wait, "default wait")?;
        validate_wait(self.fence_retention, "fence retention")?;
        for (what, d) in [
            ("command timeout", self.command_timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            if d.is_zero() || d > MAX_DURATION {
                return Err(LockError::InvalidConfig(format!(
                    "{what} is {d:?}; it must be above zero and at most 30 days"
                )));
            }
        }
        if let Some(ack) = self.replica_ack {
            // WAIT takes whole milliseconds, and 0 would mean "for ever".
            if ack.replicas == 0
                || ack.timeout < Duration::from_millis(1)
                || ack.timeout > MAX_DURATION
            {
                return Err(LockError::InvalidConfig(format!(
                    "replica_ack({}, {:?}): it needs at least 1 replica and a timeout of 1 ms to \
                     30 days",
                    ack.replicas, ack.timeout
                )));
            }
        }
        Ok(())
    }
}

/// Certificates for `rediss://` and PostgreSQL's TLS beyond the system's trust
/// store.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca_pem", &self.ca_pem.as_ref().map(|_| "<set>"))
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

pub(crate) fn validate_lease(lease: Duration, what: &str) -> Result<(), LockError> {
    if lease < MIN_LEASE || lease > MAX_DURATION {
        return Err(LockError::InvalidConfig(format!(
            "{what} is {lease:?}; it must be between 10 ms and 30 days"
        )));
    }
    Ok(())
}

/// Checks a `max_hold` or `min_hold`, when given: above zero, at most 30 days.
pub(crate) fn validate_hold(hold: Option<Duration>, what: &str) -> Result<(), LockError> {
    match hold {
        Some(d) if d.is_zero() || d > MAX_DURATION => Err(LockError::InvalidConfig(format!(
            "{what} is {d:?}; it must be above zero and at most 30 days"
        ))),
        _ => Ok(()),
    }
}

pub(crate) fn validate_wait(wait: Duration, what: &str) -> Result<(), LockError> {
    if wait > MAX_DURATION {
        return Err(LockError::InvalidConfig(format!(
            "{what} is {wait:?}; it must be at most 30 days"
        )));
    }
    Ok(())
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    if !url.contains("://") {
        return redact_key_values(url);
    }
    let url = match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***@{}", &url[..scheme_end], &url[at + 1..])
        }
        _ => url.to_owned(),
    };
    // A password may also be a query parameter: `password=` (PostgreSQL's
    // URLs), `pass=` (redis-rs's `redis+unix://` URLs).
    let Some((base, query)) = url.split_once('?') else {
        return url;
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _))
                if name.eq_ignore_ascii_case("password") || name.eq_ignore_ascii_case("pass") =>
            {
                format!("{name}=***")
            }
            _ => param.to_owned(),
        })
        .collect();
    format!("{base}?{}", params.join("&"))
}

impl std::fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("schema", &self.schema)
            .field("create_schema", &self.create_schema)
            .field("sweep_interval", &self.sweep_interval)
            .field("listen_url", &self.listen_url.as_deref().map(redact))
            .field("prepared_statements", &self.prepared_statements)
            .field("synchronous_standby", &self.synchronous_standby)
            .finish()
    }
}

/// A connection string that is not a URL, such as libpq's key/value form
/// (`host=db user=app password=s3cret`), given where a URL was expected:
/// the value of each `password` or `pass` keyword (spaces around `=`
/// allowed, quoted or not) masked.
fn redact_key_values(text: &str) -> String {
    // Before a keyword; a value ends at the first of these but `?`.
    let separator = |c: char| c.is_whitespace() || matches!(c, '&' | ';' | '?');
    let value_end = |c: char| c.is_whitespace() || matches!(c, '&' | ';');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        // The keyword: the word before `=`, spaces before it skipped.
        let before = rest[..eq].trim_end();
        let name_start = before
            .char_indices()
            .rev()
            .find(|&(_, c)| separator(c))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let name = &before[name_start..];
        out.push_str(&rest[..=eq]);
        rest = &rest[eq + 1..];
        if !(name.eq_ignore_ascii_case("password") || name.eq_ignore_ascii_case("pass")) {
            continue;
        }
        let value = rest.trim_start();
        out.push_str(&rest[..rest.len() - value.len()]);
        let end = match value.strip_prefix('\'') {
            // A quoted value runs to its closing quote (`\'` escapes one).
            Some(quoted) => {
                let mut escaped = false;
                quoted
                    .char_indices()
                    .find(|&(_, c)| {
                        let closes = c == '\'' && !escaped;
                        escaped = c == '\\' && !escaped;
                        closes
                    })
                    .map_or(value.len(), |(i, _)| i + 2)
            }
            None => value.find(value_end).unwrap_or(value.len()),
        };
        out.push_str("***");
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

/// Several URLs without their passwords, comma-separated, for messages.
pub(crate) fn redact_all(urls: &[String]) -> String {
    urls.iter()
        .map(|url| redact(url))
        .collect::<Vec<_>>()
        .join(",")
}

/// A fresh owner token: 128 random bits in 32 hex digits, from the thread's
/// ChaCha12 generator (seeded from the OS, reseeded every 64 KiB of output),
/// so that no other client can guess or collide with it, without a `getrandom`
/// system call per acquisition.
pub(crate) fn owner_token() -> String {
    let mut token = String::with_capacity(32);
    push_hex(&mut token, rand::random::<u128>(), 32);
    token
}

/// Appends the low `digits` hex digits of `value`, zero-padded: an owner
/// token is made at every acquisition, and `format!` costs several times this.
fn push_hex(out: &mut String, value: u128, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits).rev() {
        let nibble = (value >> (4 * i)) & 0xf;
        out.push(char::from(HEX[nibble as usize]));
    }
}

/// A fresh owner token for a default-lock hold of the manager whose hand-off
/// route (8 hex digits, see `Core::handoff_route`) is `route`: 96 random bits
/// in 24 hex digits, then the route. A waiter that queues for the lock while
/// it is held this way tells the holder's manager on its hand-off channel
/// (`acquire.lua`), so that the holder's release hands the lock over in one
/// round trip. Any other route (never one of `Core`'s) gives a plain token.
pub(crate) fn owner_token_routed(route: &str) -> String {
    if route.len() == 8 && route.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut token = String::with_capacity(32);
        push_hex(&mut token, rand::random::<u128>(), 24);
        token.push_str(route);
        token
    } else {
        owner_token()
    }
}

/// An owner token for one key of the multi-key acquisition whose id (the
/// first [`ACQUISITION_ID_LEN`](crate::info::ACQUISITION_ID_LEN) hex digits) is `acquisition`: still unique
/// per key (32 more random bits, then the manager's `route` as in
/// [`owner_token_routed`], so that a waiter's notice reaches the holder's
/// manager; 64 random bits when `route` is empty), so that each key's
/// hand-off and release name its own hold, while an operator can tell the
/// keys of one acquisition apart from the rest.
pub(crate) fn owner_token_of(acquisition: &str, route: &str) -> String {
    if route.len() == 8 && route.bytes().all(|b| b.is_ascii_hexdigit()) {
        format!("{acquisition}{:08x}{route}", rand::random::<u32>())
    } else {
        format!("{acquisition}{:016x}", rand::random::<u64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routed_owner_token_ends_with_its_route() {
        let token = owner_token_routed("0badf00d");
        assert_eq!(token.len(), 32);
        assert!(token.ends_with("0badf00d"));
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(token, owner_token_routed("0badf00d"));
        // Not a manager's route: a plain 32-digit token.
        assert_eq!(owner_token_routed("0").len(), 32);
        assert_eq!(owner_token_routed("").len(), 32);
    }

    #[test]
    fn a_multi_key_owner_token_opens_with_its_acquisition_and_ends_with_its_route() {
        let acquisition = "0123456789abcdef";
        let token = owner_token_of(acquisition, "0badf00d");
        assert_eq!(token.len(), 32);
        assert!(token.starts_with(acquisition) && token.ends_with("0badf00d"));
        assert_ne!(token, owner_token_of(acquisition, "0badf00d"));
        let unrouted = owner_token_of(acquisition, "");
        assert!(unrouted.len() == 32 && unrouted.starts_with(acquisition));
    }

    #[test]
    fn a_backoff_grows_by_its_factor_up_to_its_cap() {
        let ms = Duration::from_millis;
        let tripling = Backoff::new(ms(10), ms(100)).with_factor(3.0);
        let mut value = tripling.first();
        let mut series = vec![value];
        for _ in 0..4 {
            value = tripling.grow(value);
            series.push(value);
        }
        assert_eq!(series, [ms(10), ms(30), ms(90), ms(100), ms(100)]);
        // 1.0: a fixed interval; the default doubles.
        let fixed = Backoff::new(ms(10), ms(100)).with_factor(1.0);
        assert_eq!(fixed.grow(ms(10)), ms(10));
        assert_eq!(Backoff::new(ms(10), ms(100)).grow(ms(10)), ms(20));
        // Past what a Duration holds: the cap.
        let huge = Backoff::new(ms(10), MAX_DURATION).with_factor(16.0);
        assert_eq!(huge.grow(Duration::MAX), MAX_DURATION);
        for bad in [0.5, 0.0, -2.0, 17.0, f64::NAN, f64::INFINITY] {
            let err = Backoff::new(ms(10), ms(100))
                .with_factor(bad)
                .validate("the request's backoff")
                .unwrap_err();
            assert!(
                matches!(&err, LockError::InvalidConfig(m) if m.contains("growth factor")),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn hex_digits_are_zero_padded_and_lowercase() {
        let mut s = String::new();
        push_hex(&mut s, 0xAB, 4);
        assert_eq!(s, "00ab");
        push_hex(&mut s, u128::MAX, 32);
        assert_eq!(&s[4..], "f".repeat(32));
        let token = owner_token();
        assert_eq!(token.len(), 32);
        assert!(token
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    }

    #[test]
    fn urls_lose_their_password_in_messages() {
        assert_eq!(
            redact("redis://:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis+unix:///tmp/r.sock?db=1&pass=hunter2"),
            "redis+unix:///tmp/r.sock?db=1&pass=***"
        );
        assert_eq!(
            redact("postgres://h/db?user=u&Password=s3cret&sslmode=require"),
            "postgres://h/db?user=u&Password=***&sslmode=require"
        );
        // libpq's key/value form, given where a URL was expected.
        assert_eq!(
            redact("host=db user=app password=s3cret dbname=x"),
            "host=db user=app password=*** dbname=x"
        );
        assert_eq!(
            redact("host=db password='a b\\'c' dbname=x"),
            "host=db password=*** dbname=x"
        );
        assert_eq!(redact("password=s3cret"), "password=***");
        assert_eq!(
            redact("host=db password=ab?cd dbname=x"),
            "host=db password=*** dbname=x"
        );
        assert_eq!(
            redact("host=db password = s3cret dbname=x"),
            "host=db password = *** dbname=x"
        );
        // Whitespace of more than one byte before a keyword.
        assert_eq!(
            redact("a\u{a0}password=s3cret b=c"),
            "a\u{a0}password=*** b=c"
        );
    }

    #[test]
    fn durations_are_range_checked() {
        assert!(validate_lease(Duration::ZERO, "lease").is_err());
        assert!(validate_lease(Duration::from_millis(2), "lease").is_err());
        assert!(validate_lease(MIN_LEASE, "lease").is_ok());
        assert!(validate_lease(MAX_DURATION + Duration::from_secs(1), "lease").is_err());
        assert!(validate_wait(Duration::ZERO, "wait").is_ok());
        assert!(validate_wait(Duration::from_secs(u64::MAX), "wait").is_err());
    }
}
