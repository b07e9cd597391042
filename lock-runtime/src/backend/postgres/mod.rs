//! PostgreSQL as the store of the default lock: a lease table, a FIFO queue
//! table and one fencing sequence (`schema.sql`), every operation one
//! statement (most of them one function call) on one pipelined connection,
//! and wake-ups and hand-offs by LISTEN/NOTIFY ([`listener`]).
//!
//! The protocol is the Redis one, kept so that the waiting layer above is the
//! same: a waiter queues up in its attempt, a release hands the lock to the
//! head of the queue and notifies `=<owner>:<token>:<attempt>` on the head's
//! manager's hand-off channel. Unlike on Redis, the first waiter of a hold
//! does not notify the holder's manager (`!<holder>`): the one release
//! function hands over whenever someone queued, so the notice would only
//! wake every listening session. Logical channel names are mapped to
//! PostgreSQL identifiers by [`channel_ident`], the one mapping that the SQL
//! call sites (which pass identifiers as parameters) and the listener share;
//! the identifier depends on the schema too, since a notification reaches
//! every session of the database.
//!
//! Expiry is the server's clock (`clock_timestamp()`), and distlock's
//! statements run on its own connections, never in a user's transaction.
//! Lock events go on one channel per schema ([`events_channel`]), each
//! payload naming its lock (`lock_event` in `schema.sql`); the sweep tells of
//! the expiries it finds.
//! The default lock (and `lock_all`, leader election) is served here,
//! read-write locks and semaphores by [`shared`], the counting semaphore by
//! [`counting`].

mod counting;
mod isolation;
pub(crate) mod listener;
mod replication;
mod shared;
#[cfg(feature = "tls")]
mod tls;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt as _};
use tokio_postgres::config::SslMode;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, NoTls, Row, Statement};

use super::{CallError, LeaseEnd, ManyReleased, Renewal};
use crate::backend::scripts::{
    handoff_base, AcquireAllReply, AcquireReply, AcquireSpec, HeldLock, KeyReading,
};
use crate::config::{Config, TlsSettings};
use crate::error::{BackendError, BackendErrorKind, LockError};
use crate::keys::{LockKind, RedisNames};
use crate::lease::Lease;

/// The schema's version this library writes and reads.
pub const SCHEMA_VERSION: i32 = 6;

/// The store's name in errors.
pub(crate) const STORE: &str = "PostgreSQL";

const SCHEMA_SQL: &str = include_str!("schema.sql");

/// How many times a multi-key acquisition that PostgreSQL rolled back as a
/// deadlock or a serialization failure is sent again: each such abort needs
/// a cycle of waits with another transaction, which the retry no longer
/// meets, so a second failure is already rare and a ninth is not expected.
const ACQUIRE_ALL_ATTEMPTS: u32 = 8;

/// Most rows of each table one sweep deletes (see `sweep` in `schema.sql`).
/// Each row a sweep deletes is taken under its key's transaction lock
/// (tried), held to the commit: at most twice this many advisory locks in
/// the server's shared lock table per sweep statement (about 12,000 entries
/// with the default settings, shared by every session).
const SWEEP_LIMIT: i32 = 200;

/// How long a listening connection found deaf lives before it is made again
/// and probed afresh (see `Listener::go_deaf`): ten command timeouts (the
/// probe waits at most one), 20 s by default, so that behind a pooler the
/// probes cost a connection and three statements that often, and a
/// listener wrongly found deaf hears again within that.
fn deaf_recheck_after(command_timeout: Duration) -> Duration {
    command_timeout.saturating_mul(10)
}

/// The application name of the data connection, for operators (and tests)
/// that look for distlock's sessions in `pg_stat_activity`.
pub(crate) const DATA_APPLICATION: &str = "distlock";
/// The application name of the listening connection.
pub(crate) const LISTEN_APPLICATION: &str = "distlock-listen";
/// The application name of the short-lived connection that asks what a
/// silent data connection's session does (see `Inner::timed_out`).
const CHECK_APPLICATION: &str = "distlock-check";

/// The SQL that creates distlock's schema `schema` (tables, sequences,
/// functions, version row): what `build()` runs when the schema is missing
/// or of an older version (it migrates one: tables are created if missing,
/// functions replaced, the version raised), for a DBA to run by hand where
/// distlock's role may not create it.
///
/// # Errors
/// [`LockError::InvalidConfig`] when `schema` is not a plain lower-case
/// identifier.
pub fn schema_sql(schema: &str) -> Result<String, LockError> {
    validate_schema(schema)?;
    Ok(SCHEMA_SQL.replace("__SCHEMA__", schema))
}

/// Words that cannot name a schema unquoted in distlock's SQL, in order:
/// PostgreSQL's keywords of categories R (reserved) and T (reserved but for
/// function and type names) of `pg_get_keywords()` on PostgreSQL 15 to 17,
/// and PL/pgSQL's reserved words (the functions' bodies name the schema:
/// `loop.waiters%ROWTYPE` does not parse).
const RESERVED_KEYWORDS: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "begin",
    "binary",
    "both",
    "by",
    "case",
    "cast",
    "check",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "declare",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "execute",
    "false",
    "fetch",
    "for",
    "foreach",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "if",
    "ilike",
    "in",
    "initially",
    "inner",
    "intersect",
    "into",
    "is",
    "isnull",
    "join",
    "lateral",
    "leading",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "loop",
    "natural",
    "not",
    "notnull",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "overlaps",
    "placing",
    "primary",
    "references",
    "returning",
    "right",
    "select",
    "session_user",
    "similar",
    "some",
    "strict",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "verbose",
    "when",
    "where",
    "while",
    "window",
    "with",
];

/// A schema name goes into SQL text unquoted, so it must be a plain
/// identifier: lower-case letters, digits and `_`, not starting with a
/// digit, at most 63 bytes, and not a reserved keyword (`user`, `order`).
pub(crate) fn validate_schema(schema: &str) -> Result<(), LockError> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.as_bytes()[0].is_ascii_digit();
    if !ok {
        return Err(LockError::InvalidConfig(format!(
            "PostgreSQL schema name {schema:?}: use lower-case letters, digits and _ \
             (not first), at most 63 bytes"
        )));
    }
    if RESERVED_KEYWORDS.binary_search(&schema).is_ok() {
        return Err(LockError::InvalidConfig(format!(
            "PostgreSQL schema name {schema:?} is a reserved keyword of PostgreSQL's: \
             choose another name (distlock_{schema}, say)"
        )));
    }
    Ok(())
}

/// The PostgreSQL channel identifier of the logical channel `logical` of
/// distlock's schema `schema`. Channel names are identifiers of at most 63
/// bytes (longer ones are cut silently) and LISTEN takes no patterns, so each
/// logical name (which may be long and hold any byte) maps to `distlock_`
/// and 32 hex digits of a fixed hash: the same in every process, since
/// managers of different processes must agree (a change of it, as when the
/// schema was added, is a CHANGELOG entry). Two FNV-1a 64-bit
/// hashes with different bases; a collision would only deliver a message to
/// a second logical channel too, whose readers check the owner token it
/// names. The schema is hashed too (a `/`, which no schema name holds, ends
/// it): a notification reaches every listening session of the database,
/// and managers of another schema with the same key prefix must not hear
/// it. A leader watch would take the other schema's terms for its own, and
/// then ignore its own as older (their epochs come from another sequence).
pub(crate) fn channel_ident(schema: &str, logical: &str) -> String {
    fn fnv1a(basis: u64, parts: [&[u8]; 3]) -> u64 {
        parts
            .iter()
            .flat_map(|part| part.iter())
            .fold(basis, |hash, &b| {
                (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            })
    }
    let parts = [schema.as_bytes(), b"/", logical.as_bytes()];
    let a = fnv1a(0xcbf2_9ce4_8422_2325, parts);
    let b = fnv1a(0x6c62_272e_07bb_0142, parts);
    format!("distlock_{a:016x}{b:016x}")
}

/// The logical channel every lock event of schema `schema` goes on (see
/// `lock_event` in `schema.sql`): one per schema rather than one per lock,
/// since LISTEN takes no patterns, and per schema rather than per prefix,
/// since the sweep that tells of expiries removes rows of every prefix. A
/// `/` is in no prefix-derived name distlock listens on.
pub(crate) fn events_channel(schema: &str) -> String {
    format!("{schema}/events")
}

/// Translates a Redis glob pattern (`*`, `?`, `[..]` with `^`/`!` and
/// ranges, `\` escapes) into an anchored PostgreSQL regular expression.
/// A regular expression rather than LIKE: LIKE has no character classes.
pub(crate) fn glob_to_regex(glob: &str) -> String {
    let mut out = String::with_capacity(glob.len() * 2 + 2);
    out.push('^');
    let mut chars = glob.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '\\' => match chars.next() {
                Some(escaped) => push_literal(&mut out, escaped),
                None => push_literal(&mut out, '\\'),
            },
            '[' => {
                let mut class = String::from("[");
                if matches!(chars.peek(), Some('^') | Some('!')) {
                    chars.next();
                    class.push('^');
                }
                // The class's characters, `None` for a `-` that may make a
                // range; an escaped character (true) starts none, as in
                // Redis.
                let mut items: Vec<Option<(char, bool)>> = Vec::new();
                let mut closed = false;
                while let Some(k) = chars.next() {
                    match k {
                        ']' => {
                            closed = true;
                            break;
                        }
                        '\\' => {
                            if let Some(escaped) = chars.next() {
                                items.push(Some((escaped, true)));
                            }
                        }
                        '-' => items.push(None),
                        other => items.push(Some((other, false))),
                    }
                }
                let mut i = 0;
                while i < items.len() {
                    match (items[i], items.get(i + 1), items.get(i + 2)) {
                        // A range; Redis takes `[z-a]` as `[a-z]`, where
                        // PostgreSQL refuses it.
                        (Some((from, false)), Some(None), Some(Some((to, _)))) => {
                            push_class_literal(&mut class, from.min(*to));
                            class.push('-');
                            push_class_literal(&mut class, from.max(*to));
                            i += 3;
                        }
                        (Some((c, _)), _, _) => {
                            push_class_literal(&mut class, c);
                            i += 1;
                        }
                        (None, _, _) => {
                            push_class_literal(&mut class, '-');
                            i += 1;
                        }
                    }
                }
                if closed && class.len() > 1 && class != "[^" {
                    class.push(']');
                    out.push_str(&class);
                } else {
                    // An unclosed or empty class matches nothing in Redis;
                    // here it matches nothing either.
                    out.push_str("[^\\s\\S]");
                }
            }
            other => push_literal(&mut out, other),
        }
    }
    out.push('$');
    out
}

fn push_literal(out: &mut String, c: char) {
    if c.is_ascii_punctuation() {
        out.push('\\');
    }
    out.push(c);
}

fn push_class_literal(out: &mut String, c: char) {
    if matches!(c, ']' | '\\' | '^' | '-' | '[') {
        out.push('\\');
    }
    out.push(c);
}

/// The statements, with the schema's name in them.
struct Sql {
    acquire: String,
    acquire_all: String,
    release: String,
    renew: String,
    issue_token: String,
    force_unlock: String,
    inspect: String,
    scan: String,
    sweep: String,
    lock_event: String,
    version: String,
}

impl Sql {
    fn new(schema: &str) -> Sql {
        Sql {
            acquire: format!(
                "SELECT o_status, o_token, o_remaining_ms FROM {schema}.acquire(\
                 $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
            ),
            acquire_all: format!(
                "SELECT o_status, o_index, o_remaining_ms, o_tokens FROM {schema}.acquire_all(\
                 $1, $2, $3, $4, $5, $6, $7, $8)"
            ),
            release: format!("SELECT {schema}.release($1, $2, $3, $4, $5)"),
            renew: format!("SELECT i, renewed FROM {schema}.renew($1, $2, $3, $4)"),
            issue_token: format!("SELECT {schema}.issue_token($1, $2)"),
            force_unlock: format!("SELECT {schema}.force_unlock($1, $2, $3, $4, $5)"),
            inspect: format!(
                "SELECT value, pttl, queue_owners, queue_entries, now_ms FROM {schema}.inspect($1)"
            ),
            scan: format!("SELECT {schema}.scan($1)"),
            sweep: format!("SELECT {schema}.sweep($1, $2)"),
            lock_event: format!("SELECT {schema}.lock_event($1, $2, $3)"),
            version: format!("SELECT version FROM {schema}.version"),
        }
    }
}

/// What a connection's driver yields: notifications and notices until it
/// closes (with an error, or `None`).
pub(crate) type Messages =
    Pin<Box<dyn Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Send>>;

/// How a manager opens its connections: without TLS, or over rustls.
#[derive(Clone, Debug)]
pub(crate) enum Connector {
    Plain,
    #[cfg(feature = "tls")]
    Tls(tls::MakeRustls),
}

impl Connector {
    /// Chooses from the URL's `sslmode` and the builder's certificates. TLS
    /// is used when the URL requires it or certificates were given; with
    /// `sslmode=prefer` (the default) and none given, a connection stays
    /// plain as before, since libpq's `prefer` does not verify the server
    /// and distlock only speaks TLS verified: a server with a self-signed
    /// certificate (Debian's default) keeps working.
    fn choose(pg: &tokio_postgres::Config, tls: &TlsSettings) -> Result<Connector, LockError> {
        let certificates = tls.ca_pem.is_some() || tls.client_identity.is_some();
        match pg.get_ssl_mode() {
            SslMode::Disable if certificates => Err(LockError::InvalidConfig(
                "TLS certificates were given to the builder, but the PostgreSQL URL says \
                 sslmode=disable"
                    .to_owned(),
            )),
            SslMode::Disable => Ok(Connector::Plain),
            SslMode::Prefer if !certificates => Ok(Connector::Plain),
            _ => Connector::tls(tls),
        }
    }

    #[cfg(feature = "tls")]
    fn tls(tls: &TlsSettings) -> Result<Connector, LockError> {
        Ok(Connector::Tls(tls::MakeRustls::new(tls)?))
    }

    #[cfg(not(feature = "tls"))]
    fn tls(_: &TlsSettings) -> Result<Connector, LockError> {
        Err(LockError::InvalidConfig(
            "TLS to PostgreSQL (sslmode=require, or certificates given to the builder) needs \
             distlock's `tls` feature (on by default; turned off here)"
                .to_owned(),
        ))
    }

    /// Opens a connection with `pg`; its driver is the returned stream,
    /// which whoever holds it must poll for the client to make progress.
    pub(crate) async fn connect(
        &self,
        pg: &tokio_postgres::Config,
    ) -> Result<(Client, Messages), tokio_postgres::Error> {
        match self {
            Connector::Plain => {
                let (client, mut connection) = pg.connect(NoTls).await?;
                let messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                Ok((client, Box::pin(messages)))
            }
            #[cfg(feature = "tls")]
            Connector::Tls(make) => {
                let (client, mut connection) = pg.connect(make.clone()).await?;
                let messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                Ok((client, Box::pin(messages)))
            }
        }
    }
}

/// A connection to `url` made as a manager makes its own: `sslmode` read
/// as the manager reads it, TLS through rustls verifying the server against
/// `ca_pem` or the system's roots; named `application_name` unless the URL
/// names one. Its notifications arrive on the receiver. For `distlock
/// check`, which reads a server with plain statements: the outer error is
/// the URL's or the TLS settings', the inner one the connection's.
pub async fn connect_as_a_manager_would(
    url: &str,
    ca_pem: Option<Vec<u8>>,
    application_name: &str,
    connect_timeout: Duration,
) -> Result<
    Result<
        (
            Client,
            tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
        ),
        tokio_postgres::Error,
    >,
    LockError,
> {
    let mut pg = parse_url(url)?;
    if pg.get_application_name().is_none() {
        pg.application_name(application_name);
    }
    pg.connect_timeout(connect_timeout);
    let tls = TlsSettings {
        ca_pem,
        client_identity: None,
    };
    let connector = Connector::choose(&pg, &tls)?;
    let (client, mut messages) = match connector.connect(&pg).await {
        Ok(pair) => pair,
        Err(e) => return Ok(Err(e)),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    // The receiver is gone once its reader is done.
                    let _ = tx.send(n);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    Ok(Ok((client, rx)))
}

/// Drives a data connection until it closes, dropping its notices (a data
/// connection listens on nothing).
async fn drive(mut messages: Messages) {
    while let Some(message) = messages.next().await {
        if let Err(e) = message {
            tracing::debug!(target: "distlock::postgres", error = %pg_message(&e),
                "data connection closed");
            return;
        }
    }
}

/// The session a new data connection opened on the server (see
/// [`Inner::timed_out`]), in one round trip bounded by `timeout`; `None`
/// when it could not be told.
async fn identify(client: &Client, timeout: Duration) -> Option<Session> {
    let asked = client.simple_query(
        "SELECT pid, (extract(epoch FROM backend_start) * 1000000)::bigint \
         FROM pg_stat_activity WHERE pid = pg_backend_pid()",
    );
    let messages = tokio::time::timeout(timeout, asked).await.ok()?.ok()?;
    messages.iter().find_map(|message| match message {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some(Session {
            pid: row.get(0)?.parse().ok()?,
            started_us: row.get(1)?.parse().ok()?,
        }),
        _ => None,
    })
}

/// Judges a data connection silent for two command timeouts (see
/// [`Inner::timed_out`]): looks at its session every two command timeouts
/// while it waits for the standby. Holds the backend weakly between looks,
/// so that a manager dropped meanwhile ends it (and with it the connection).
async fn judge(judging: Judging, session: Session, judged_at: Instant, silent_for: Duration) {
    loop {
        let Some(inner) = judging.inner.upgrade() else {
            return;
        };
        if !inner
            .judge_once(&judging, session, judged_at, silent_for)
            .await
        {
            return;
        }
        let pause = inner.command_timeout * 2;
        drop(inner);
        tokio::time::sleep(pause).await;
    }
}

/// `url` parsed, with libpq's `sslmode=verify-ca` and `verify-full` read as
/// `require` (which tokio-postgres knows): distlock verifies the server's
/// certificate and name under all three.
fn parse_url(url: &str) -> Result<tokio_postgres::Config, LockError> {
    let mut text = url.to_owned();
    for mode in ["sslmode=verify-full", "sslmode=verify-ca"] {
        text = text.replace(mode, "sslmode=require");
    }
    text.parse()
        .map_err(|e| LockError::InvalidConfig(format!("PostgreSQL URL {}: {e}", shown(url))))
}

/// What the backend and its sweeper task share.
struct Inner {
    /// Itself, for the task that judges a silent data connection (see
    /// [`Inner::timed_out`]).
    me: Weak<Inner>,
    /// Whether `postgres_listen_url` was given: the data URL is then a
    /// transaction-mode pooler's, whose server sessions change from one
    /// statement to the next, so a silent connection's session cannot be
    /// told (see [`Inner::timed_out`]).
    pooled: bool,
    pg: tokio_postgres::Config,
    connector: Connector,
    /// The listening connection's (its URL may differ: `postgres_listen_url`).
    listen_connector: Connector,
    shown_url: String,
    prefix: String,
    /// distlock's schema: its statements' and its channels' (see
    /// [`channel_ident`]).
    schema: String,
    sql: Sql,
    /// The schema's events channel ([`events_channel`]) and its identifier.
    events: String,
    events_ident: String,
    /// The statements of read-write locks and semaphores.
    shared: shared::SharedSql,
    /// The statements of counting semaphores.
    counters: counting::CounterSql,
    command_timeout: Duration,
    connect_timeout: Duration,
    /// The data connection; `None` or closed: the next call connects.
    client: Mutex<Option<Arc<Client>>>,
    /// When the data connection last answered, and how many calls timed out
    /// on it since.
    heard: Mutex<Heard>,
    /// With `postgres_prepared_statements`: the statements prepared on the
    /// data connection, by SQL text, and that connection (a new one
    /// prepares them again).
    prepared: Option<Mutex<Prepared>>,
    /// The listening connection's settings: the main URL's, or
    /// `postgres_listen_url`'s.
    listen_pg: tokio_postgres::Config,
    /// How many listening connections were found deaf (see
    /// [`listener`](Postgres::listener)): the warning is given at the first,
    /// not at every reconnection.
    deaf_listeners: AtomicU64,
    /// Whether the listening connection made last did not hear its probe.
    listener_deaf: AtomicBool,
    /// One reconnection at a time; the last one that failed, numbered by
    /// `connects_ended` as it ended.
    connecting: tokio::sync::Mutex<Option<(u64, BackendError)>>,
    /// Reconnections ended, failed or not (see [`Inner::client`]).
    connects_ended: AtomicU64,
    renewal_round_trips: AtomicU64,
}

/// How many calls may time out unanswered on a data connection kept for a
/// session at work in the server before the next are refused unsent (see
/// [`Inner::timed_out`]): what waits on the client, to run late when the
/// wait ends, stays bounded (a statement and its parameters each).
const KEPT_BACKLOG: u32 = 1024;

/// What the data connection was last heard say (see [`Inner::timed_out`]).
struct Heard {
    /// The connection it is about (compared by address, never used).
    client: Weak<Client>,
    /// The task that drives it: aborted when it is retired for its silence,
    /// which closes it and fails the calls still waiting on it.
    driver: Option<tokio::task::AbortHandle>,
    /// Its last reply, or its opening.
    at: Instant,
    /// Calls sent after `at` that timed out, and when the first of them was
    /// sent.
    timeouts: u32,
    unanswered_since: Option<Instant>,
    /// Its session on the server, when it could be told at the opening.
    session: Option<Session>,
    /// The judgement of its silence under way, if any (see
    /// [`Inner::timed_out`]), by number: a judgement ends, or is cut short,
    /// only while it is still the current one.
    judging: Option<u64>,
    /// Whether it is kept for a session at work in the server since its
    /// last reply (see [`Inner::timed_out`]).
    kept: bool,
}

/// A session on the server: its process id and its start (microseconds
/// since the Unix epoch), which together name it even after the process id
/// is reused.
#[derive(Debug, Clone, Copy)]
struct Session {
    pid: i32,
    started_us: i64,
}

/// How many judgements of silent data connections were started, to number
/// them (see [`Heard::judging`]).
static JUDGEMENTS: AtomicU64 = AtomicU64::new(0);

/// Ends judgement `number` of its connection when dropped, if it is still
/// the current one: at the end of the judgement, or when its task is cut
/// short (its runtime shut down), which leaves the connection as it was
/// before it: not kept, and judged again at the next silence.
struct Judging {
    inner: Weak<Inner>,
    client: Arc<Client>,
    number: u64,
}

impl Drop for Judging {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            let mut heard = inner.heard.lock().unwrap_or_else(|e| e.into_inner());
            if heard.is_about(&self.client) && heard.judging == Some(self.number) {
                heard.judging = None;
                heard.kept = false;
            }
        }
    }
}

impl Heard {
    fn new(
        client: &Arc<Client>,
        driver: tokio::task::AbortHandle,
        session: Option<Session>,
    ) -> Heard {
        Heard {
            client: Arc::downgrade(client),
            driver: Some(driver),
            at: Instant::now(),
            timeouts: 0,
            unanswered_since: None,
            session,
            judging: None,
            kept: false,
        }
    }

    fn is_about(&self, client: &Arc<Client>) -> bool {
        std::ptr::eq(self.client.as_ptr(), Arc::as_ptr(client))
    }

    /// Whether judgement `number` of `client`'s silence since `silent_since`
    /// is still the one under way: the connection was not replaced, did not
    /// answer meanwhile, and no other judgement took over.
    fn still_judging(&self, client: &Arc<Client>, silent_since: Instant, number: u64) -> bool {
        self.is_about(client) && self.at == silent_since && self.judging == Some(number)
    }
}

/// The statements prepared on one data connection.
#[derive(Default)]
struct Prepared {
    /// The connection they belong to (compared by address, never used).
    client: Option<Weak<Client>>,
    statements: std::collections::HashMap<String, Statement>,
}

impl Prepared {
    /// `sql`'s statement on `client`, if prepared there.
    fn get(&mut self, client: &Arc<Client>, sql: &str) -> Option<Statement> {
        if !self
            .client
            .as_ref()
            .is_some_and(|c| std::ptr::eq(c.as_ptr(), Arc::as_ptr(client)))
        {
            self.client = Some(Arc::downgrade(client));
            self.statements.clear();
        }
        self.statements.get(sql).cloned()
    }
}

/// The PostgreSQL backend: one pipelined data connection, reconnected after
/// it breaks, and a periodic bounded sweep of dead rows.
pub(crate) struct Postgres {
    inner: Arc<Inner>,
    sweeper: tokio::task::JoinHandle<()>,
    /// A blocking release failed (see [`Postgres::release_blocking`]).
    blocking_release_failed: AtomicBool,
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

/// A statement's parameter with its type (sent with `query_typed`).
type Param<'a> = (&'a (dyn ToSql + Sync), Type);

fn param(value: &(dyn ToSql + Sync), ty: Type) -> (&(dyn ToSql + Sync), Type) {
    (value, ty)
}

fn ms(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Whether `e` ended the session: SQLSTATE class 08 (a connection
/// exception: PgBouncer's `query_timeout`, `server conn crashed?`) or 57P01
/// to 57P03 (the backend terminated, the server shutting down), as
/// PostgreSQL and poolers send them with a FATAL before closing.
fn ended_the_connection(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        let code = db.code().code();
        code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
    })
}

/// A database error: the statement ran and failed, or never ran, and its
/// transaction rolled back.
fn db_error(e: &tokio_postgres::Error) -> Option<BackendError> {
    let db = e.as_db_error()?;
    // 42501: a missing privilege; class 28: a refused login or password.
    let kind = if db.code() == &tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE
        || db.code().code().starts_with("28")
    {
        BackendErrorKind::Auth
    } else {
        BackendErrorKind::Server
    };
    Some(
        BackendError::new(kind, format!("{}: {}", db.code().code(), db.message()))
            .with_code(db.code().code()),
    )
}

impl Postgres {
    /// Connects to `url`, checks (and unless told not to, creates) the
    /// schema, and starts the sweeper.
    pub(crate) async fn connect(
        url: &str,
        config: &Config,
        tls: &TlsSettings,
    ) -> Result<Postgres, LockError> {
        let schema = &config.postgres.schema;
        validate_schema(schema)?;
        // PostgreSQL's text holds no NUL byte: every call would fail with a
        // server error (Redis takes any byte).
        for (what, value) in [
            ("key prefix", &config.key_prefix),
            ("holder description", &config.holder),
        ] {
            if value.contains('\0') {
                return Err(LockError::InvalidConfig(format!(
                    "the {what} {value:?} holds a NUL byte, which PostgreSQL's text cannot"
                )));
            }
        }
        let mut pg = parse_url(url)?;
        let connector = Connector::choose(&pg, tls)?;
        if pg.get_application_name().is_none() {
            pg.application_name(DATA_APPLICATION);
        }
        pg.connect_timeout(config.connect_timeout);
        // The listening connection may go elsewhere (`postgres_listen_url`:
        // past a transaction-mode pooler), with TLS or not as its own URL says.
        let (mut listen_pg, listen_connector) = match &config.postgres.listen_url {
            None => (pg.clone(), connector.clone()),
            Some(listen_url) => {
                let mut listen_pg = parse_url(listen_url)
                    .map_err(|e| LockError::InvalidConfig(format!("postgres_listen_url: {e}")))?;
                let listen_connector = Connector::choose(&listen_pg, tls)?;
                listen_pg.connect_timeout(config.connect_timeout);
                (listen_pg, listen_connector)
            }
        };
        listen_pg.application_name(LISTEN_APPLICATION);
        let make_inner = |pg: tokio_postgres::Config| {
            Arc::new_cyclic(|me| Inner {
                me: me.clone(),
                pooled: config.postgres.listen_url.is_some(),
                shown_url: shown(url),
                pg,
                connector: connector.clone(),
                listen_connector: listen_connector.clone(),
                prefix: config.key_prefix.clone(),
                schema: schema.clone(),
                sql: Sql::new(schema),
                events: events_channel(schema),
                events_ident: channel_ident(schema, &events_channel(schema)),
                shared: shared::SharedSql::new(schema),
                counters: counting::CounterSql::new(schema),
                command_timeout: config.command_timeout,
                connect_timeout: config.connect_timeout,
                client: Mutex::new(None),
                heard: Mutex::new(Heard {
                    client: Weak::new(),
                    driver: None,
                    at: Instant::now(),
                    timeouts: 0,
                    unanswered_since: None,
                    session: None,
                    judging: None,
                    kept: false,
                }),
                prepared: config
                    .postgres
                    .prepared_statements
                    .then(|| Mutex::new(Prepared::default())),
                listen_pg: listen_pg.clone(),
                deaf_listeners: AtomicU64::new(0),
                listener_deaf: AtomicBool::new(false),
                connecting: tokio::sync::Mutex::new(None),
                connects_ended: AtomicU64::new(0),
                renewal_round_trips: AtomicU64::new(0),
            })
        };
        let mut inner = make_inner(pg.clone());
        let mut client = inner.first_client().await?;
        // Before the schema: a standby named by mistake is refused as such,
        // not for the schema it cannot create.
        if config.postgres.synchronous_standby {
            let found = replication::read(&client, &inner).await?;
            let options = found.session_options();
            if !options.is_empty() {
                // This session's commits would not wait for the standby (or
                // a timeout could cut the wait short): reconnect with the
                // settings as startup options, for distlock's data
                // connections only.
                replication::set_in_session(&mut pg, &options);
                inner = make_inner(pg.clone());
                client = inner.first_client().await?;
            }
            replication::require_synchronous_standby(&client, &inner).await?;
        }
        // A database or role whose default isolation is not READ COMMITTED:
        // distlock's data sessions set it for themselves (see `isolation`).
        if let Some(level) = isolation::other_level(&client, &inner).await? {
            replication::set_in_session(&mut pg, &[isolation::OPTION]);
            let set = make_inner(pg);
            client = match set.first_client().await {
                Ok(client) => client,
                Err(e) => return Err(isolation::refusal(&set, &level, Some(&e))),
            };
            inner = set;
            if let Some(level) = isolation::other_level(&client, &inner).await? {
                return Err(isolation::refusal(&inner, &level, None));
            }
        }
        inner
            .check_schema(&client, schema, config.postgres.create_schema)
            .await?;
        let sweeper = tokio::spawn(sweep_periodically(
            Arc::downgrade(&inner),
            config.postgres.sweep_interval,
        ));
        Ok(Postgres {
            inner,
            sweeper,
            blocking_release_failed: AtomicBool::new(false),
        })
    }

    /// The listening connection (see [`listener`]), checked to hear what
    /// the data connection notifies: a transaction-mode pooler accepts
    /// LISTEN but never delivers a notification (the server session that
    /// listened goes back to the pool), and some poolers refuse LISTEN. A
    /// listener that fails the check is returned deaf (it subscribes
    /// nothing and yields nothing until it closes): waiters are then served
    /// by their timers, whose sleeps the holder's remaining lease caps. The
    /// probe is sent on the data connection, not the listening one: through
    /// a pooler, a session's notification to itself comes back before its
    /// transaction ends, while the pooler still links the two, so it would
    /// pass where nothing else is heard.
    pub(crate) async fn listener(&self) -> Result<listener::Listener, BackendError> {
        let inner = &self.inner;
        let started = Instant::now();
        let mut listener = listener::Listener::connect(
            &inner.listen_connector,
            inner.listen_pg.clone(),
            inner.connect_timeout,
            &inner.schema,
        )
        .await?;
        // The subscriber gives the whole of this the connect timeout: the
        // probe waits at most the command timeout, and never past 3/4 of
        // what is left, so that a deaf listener is reported as such rather
        // than as a connection that timed out (and reconnected forever).
        let left = inner.connect_timeout.saturating_sub(started.elapsed());
        let probe_timeout = inner.command_timeout.min(left * 3 / 4);
        let notify = async {
            let client = inner.client().await.map_err(|e| match e.error {
                LockError::Backend { source, .. } => source,
                other => BackendError::new(BackendErrorKind::Other, other.to_string()),
            })?;
            let channel = listener::probe_channel();
            Ok::<_, BackendError>((client, channel))
        };
        let (client, channel) = notify.await?;
        let heard = listener
            .probe(&channel, probe_timeout, async {
                client
                    .batch_execute(&format!("NOTIFY {channel}, 'probe'"))
                    .await
                    .map_err(|e| {
                        db_error(&e).unwrap_or_else(|| {
                            BackendError::new(BackendErrorKind::Connection, pg_message(&e))
                        })
                    })
            })
            .await?;
        if !heard {
            if inner.deaf_listeners.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(target: "distlock::postgres",
                    timeout = ?probe_timeout,
                    "the listening connection did not hear a probe notification: a \
                     transaction-mode pooler (or one that refuses LISTEN) is in the way; \
                     waiters are served by their timers (slower hand-offs). Set \
                     `postgres_listen_url` to a direct connection to the server");
            }
            listener.go_deaf(deaf_recheck_after(inner.command_timeout));
        }
        inner.listener_deaf.store(!heard, Ordering::Relaxed);
        Ok(listener)
    }

    /// See `Backend::acquire`: one function call.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Result<AcquireReply, CallError> {
        if keys.kind != LockKind::Exclusive {
            return self.acquire_shared(key, keys, owner, lease_ms, spec).await;
        }
        let inner = &self.inner;
        let base = handoff_base(&inner.prefix);
        // The channel of the holder's manager: the route that ends its owner
        // token (see `config::owner_token_routed`).
        let holder_route = owner.get(24..32).unwrap_or(spec.handoff_route);
        let holder_channel = channel_ident(&inner.schema, &format!("{base}:{holder_route}"));
        let waiter_channel =
            channel_ident(&inner.schema, &format!("{base}:{}", spec.handoff_route));
        // Only the waiter's own channel goes into its queue entry; the
        // holder's is the lock row's, written when the grant is ours.
        let handoff = if spec.waiting {
            &waiter_channel
        } else {
            &holder_channel
        };
        let fence = spec.fence_ttl_ms.is_some();
        let (lease, since, queue_lease, handoff_ttl, attempt) = (
            ms(lease_ms),
            ms(spec.since_ms),
            ms(spec.queue_lease_ms),
            ms(spec.handoff_ttl_ms),
            i64::from(spec.attempt),
        );
        let row = inner
            .one(
                key,
                &inner.sql.acquire,
                &[
                    param(&keys.lock, Type::TEXT),
                    param(&owner, Type::TEXT),
                    param(&lease, Type::INT8),
                    param(&fence, Type::BOOL),
                    param(&spec.waiting, Type::BOOL),
                    param(&since, Type::INT8),
                    param(&spec.holder, Type::TEXT),
                    param(&queue_lease, Type::INT8),
                    param(&handoff_ttl, Type::INT8),
                    param(&spec.handoff_route, Type::TEXT),
                    param(handoff, Type::TEXT),
                    param(&attempt, Type::INT8),
                    param(&inner.events_of(keys), Type::TEXT),
                ],
            )
            .await?;
        let status: i32 = get(key, &row, 0)?;
        let token: i64 = get(key, &row, 1)?;
        let remaining: i64 = get(key, &row, 2)?;
        Ok(match status {
            1 => AcquireReply::Acquired {
                fencing_token: u64::try_from(token).unwrap_or(0),
                permits_left: 0,
            },
            _ => AcquireReply::Busy {
                remaining: Some(Duration::from_millis(u64::try_from(remaining).unwrap_or(0))),
            },
        })
    }

    /// See `Backend::acquire_all`: one function call, which takes every
    /// lock or none. A call rolled back as a deadlock (SQLSTATE 40P01) or a
    /// serialization failure (40001) took nothing and is sent again (see
    /// [`ACQUIRE_ALL_ATTEMPTS`]).
    pub(crate) async fn acquire_all(
        &self,
        key: &str,
        locks: &[&RedisNames],
        owner: &str,
        lease_ms: u64,
        spec: &AcquireSpec<'_>,
    ) -> Result<AcquireAllReply, CallError> {
        let inner = &self.inner;
        let base = handoff_base(&inner.prefix);
        let holder_route = owner.get(24..32).unwrap_or(spec.handoff_route);
        let holder_channel = channel_ident(&inner.schema, &format!("{base}:{holder_route}"));
        let names: Vec<&str> = locks.iter().map(|keys| keys.lock.as_str()).collect();
        // `query` refuses a NUL in `key` (the first); the others' too.
        if let Some(name) = names.iter().find(|name| name.contains('\0')) {
            return Err(CallError {
                error: LockError::InvalidKey {
                    key: crate::keys::user_key_of(&inner.prefix, name)
                        .unwrap_or(name)
                        .to_owned(),
                    reason: "PostgreSQL text cannot hold a NUL character".to_owned(),
                },
                maybe_executed: false,
            });
        }
        let fence = spec.fence_ttl_ms.is_some();
        let (lease, since) = (ms(lease_ms), ms(spec.since_ms));
        // The locks of one call share a manager, so lock events are on for
        // all of them or none.
        let events = locks.first().map_or("", |keys| inner.events_of(keys));
        let params = [
            param(&names, Type::TEXT_ARRAY),
            param(&owner, Type::TEXT),
            param(&lease, Type::INT8),
            param(&fence, Type::BOOL),
            param(&since, Type::INT8),
            param(&spec.holder, Type::TEXT),
            param(&holder_channel, Type::TEXT),
            param(&events, Type::TEXT),
        ];
        let mut attempt = 1;
        let row = loop {
            match inner.one(key, &inner.sql.acquire_all, &params).await {
                Err(e) if attempt < ACQUIRE_ALL_ATTEMPTS && rolled_back_by_conflict(&e) => {
                    tracing::debug!(target: "distlock::postgres", error = %e.error, attempt,
                        "lock_all rolled back by a conflict; sending it again");
                    attempt += 1;
                }
                outcome => break outcome.map_err(|e| self.name_the_longest(e, &names))?,
            }
        };
        let status: i32 = get(key, &row, 0)?;
        if status == 1 {
            let tokens: Vec<i64> = get(key, &row, 3)?;
            if tokens.len() != locks.len() {
                return Err(protocol(
                    key,
                    format!("{} fencing tokens for {} locks", tokens.len(), locks.len()),
                ));
            }
            return Ok(AcquireAllReply::Acquired {
                fencing_tokens: tokens
                    .into_iter()
                    .map(|t| u64::try_from(t).unwrap_or(0))
                    .collect(),
            });
        }
        let index: i32 = get(key, &row, 1)?;
        let remaining: i64 = get(key, &row, 2)?;
        match usize::try_from(index) {
            Ok(index) if (1..=locks.len()).contains(&index) => Ok(AcquireAllReply::Busy {
                index: index - 1,
                remaining: Some(Duration::from_millis(u64::try_from(remaining).unwrap_or(0))),
            }),
            _ => Err(protocol(key, format!("a busy reply for lock {index}"))),
        }
    }

    /// A name too long for the tables' index (`InvalidKey`, which `one`
    /// gives the call's key, the first of a `lock_all`) is the longest of
    /// `names` (the limit is on the compressed entry, so the longest is the
    /// one at fault but for text that compresses far better than another's).
    fn name_the_longest(&self, mut e: CallError, names: &[&str]) -> CallError {
        if let (LockError::InvalidKey { key, .. }, Some(longest)) =
            (&mut e.error, names.iter().max_by_key(|name| name.len()))
        {
            *key = crate::keys::user_key_of(&self.inner.prefix, longest)
                .unwrap_or(longest)
                .to_owned();
        }
        e
    }

    /// See `Backend::release`: one function call.
    pub(crate) async fn release(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> Result<bool, CallError> {
        if keys.kind != LockKind::Exclusive {
            return self.release_shared(key, keys, owner, keep_ms).await;
        }
        let inner = &self.inner;
        let wake = channel_ident(&self.inner.schema, keys.channel());
        let keep = ms(keep_ms);
        let row = inner
            .one(
                key,
                &inner.sql.release,
                &[
                    param(&keys.lock, Type::TEXT),
                    param(&owner, Type::TEXT),
                    param(&keep, Type::INT8),
                    param(&wake, Type::TEXT),
                    param(&inner.events_of(keys), Type::TEXT),
                ],
            )
            .await?;
        get(key, &row, 0)
    }

    /// See `Backend::issue_token`: one statement.
    pub(crate) async fn issue_token(
        &self,
        key: &str,
        keys: &RedisNames,
        owner: &str,
    ) -> Result<Option<u64>, CallError> {
        if keys.kind != LockKind::Exclusive {
            return self.issue_write_token(key, keys, owner).await;
        }
        let inner = &self.inner;
        let row = inner
            .one(
                key,
                &inner.sql.issue_token,
                &[param(&keys.lock, Type::TEXT), param(&owner, Type::TEXT)],
            )
            .await?;
        let token: Option<i64> = get(key, &row, 0)?;
        Ok(token.map(|t| u64::try_from(t).unwrap_or(0)))
    }

    /// See `Backend::force_unlock`: one function call.
    pub(crate) async fn force_unlock(
        &self,
        key: &str,
        keys: &RedisNames,
        token: &str,
        only: &str,
    ) -> Result<bool, CallError> {
        let inner = &self.inner;
        let wake = channel_ident(&self.inner.schema, keys.channel());
        let row = inner
            .one(
                key,
                &inner.sql.force_unlock,
                &[
                    param(&keys.lock, Type::TEXT),
                    param(&only, Type::TEXT),
                    param(&wake, Type::TEXT),
                    param(&token, Type::TEXT),
                    param(&inner.events_of(keys), Type::TEXT),
                ],
            )
            .await?;
        get(key, &row, 0)
    }

    async fn read(&self, key: &str, keys: &RedisNames) -> Result<KeyReading, CallError> {
        let inner = &self.inner;
        let row = inner
            .one(key, &inner.sql.inspect, &[param(&keys.lock, Type::TEXT)])
            .await?;
        key_reading(key, &row)
    }

    /// See `Backend::inspect`.
    pub(crate) async fn inspect(
        &self,
        key: &str,
        keys: &RedisNames,
    ) -> Result<Option<HeldLock>, CallError> {
        Ok(self.read(key, keys).await?.lock)
    }

    /// See `Backend::is_locked`.
    pub(crate) async fn is_locked(&self, key: &str, keys: &RedisNames) -> Result<bool, CallError> {
        Ok(self.read(key, keys).await?.lock.is_some())
    }

    /// See `Backend::publish`: `pg_notify` on the channel's identifier.
    pub(crate) async fn publish(
        &self,
        key: &str,
        channel: &str,
        payload: &str,
    ) -> Result<(), CallError> {
        let ident = channel_ident(&self.inner.schema, channel);
        self.inner
            .one(
                key,
                "SELECT pg_notify($1, $2)::text",
                &[param(&ident, Type::TEXT), param(&payload, Type::TEXT)],
            )
            .await
            .map(drop)
    }

    /// See `Backend::publish_lock_event`: `lock_event` in `schema.sql`, on
    /// the schema's events channel, naming the lock.
    pub(crate) async fn publish_lock_event(
        &self,
        key: &str,
        keys: &RedisNames,
        event: &str,
    ) -> Result<(), CallError> {
        let inner = &self.inner;
        inner
            .one(
                key,
                &inner.sql.lock_event,
                &[
                    param(&inner.events_ident, Type::TEXT),
                    param(&keys.lock, Type::TEXT),
                    param(&event, Type::TEXT),
                ],
            )
            .await
            .map(drop)
    }

    /// See `Backend::scan_locks`: the default locks' names, the shared
    /// kinds' family names (a read-write lock's writer name, a semaphore's)
    /// and the counters' names.
    pub(crate) async fn scan_locks(&self, pattern: &str) -> Result<Vec<String>, CallError> {
        let regex = glob_to_regex(pattern);
        let inner = &self.inner;
        let (locks, shared, counters) = futures_util::future::join3(
            inner.query("", &inner.sql.scan, &[param(&regex, Type::TEXT)]),
            inner.query("", &inner.shared.scan, &[param(&regex, Type::TEXT)]),
            inner.query("", &inner.counters.scan, &[param(&regex, Type::TEXT)]),
        )
        .await;
        let mut names: Vec<String> = locks?
            .iter()
            .chain(shared?.iter())
            .chain(counters?.iter())
            .map(|row| get("", row, 0))
            .collect::<Result<_, _>>()?;
        names.sort_unstable();
        Ok(names)
    }

    /// See `Backend::release_many`: the releases pipelined on the data
    /// connection, each its own transaction (so that two managers releasing
    /// the same locks in different orders cannot deadlock).
    pub(crate) async fn release_many(&self, locks: &[(&RedisNames, &str, u64)]) -> ManyReleased {
        let releases = locks.iter().map(|(keys, owner, keep_ms)| {
            let key = crate::keys::user_key_of(&self.inner.prefix, &keys.lock).unwrap_or("");
            self.release(key, keys, owner, *keep_ms)
        });
        ManyReleased::of_each(futures_util::future::join_all(releases).await)
    }

    /// See `Backend::release_blocking`: a connection of its own, on a thread
    /// of its own with its own runtime (the caller's runtime is shutting
    /// down), bounded by the connect and command timeouts. Once one failed
    /// (the server unreachable as the runtime shuts down), the later ones are
    /// left to their leases, so that a shutdown with many guards does not
    /// wait out each in turn.
    pub(crate) fn release_blocking(
        &self,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
    ) -> Result<bool, LockError> {
        let failed = |what: String| LockError::Backend {
            key: keys.lock.clone(),
            source: BackendError::new(BackendErrorKind::Other, what),
        };
        if self.blocking_release_failed.load(Ordering::Relaxed) {
            return Err(failed(
                "not sent: an earlier release at runtime shutdown failed on this server".to_owned(),
            ));
        }
        let released = self.release_blocking_once(keys, owner, keep_ms, failed);
        if released.is_err() {
            self.blocking_release_failed.store(true, Ordering::Relaxed);
        }
        released
    }

    /// One [`release_blocking`](Self::release_blocking), sent.
    fn release_blocking_once(
        &self,
        keys: &RedisNames,
        owner: &str,
        keep_ms: u64,
        failed: impl Fn(String) -> LockError,
    ) -> Result<bool, LockError> {
        let pg = self.inner.pg.clone();
        let connector = self.inner.connector.clone();
        // The default lock's release, or the shared kinds' (which also takes
        // the hold's kind).
        let (sql, kind) = match keys.kind {
            LockKind::Exclusive => (self.inner.sql.release.clone(), None),
            kind => (
                self.inner.shared.release.clone(),
                Some(shared::kind_code(kind)),
            ),
        };
        let bound = self.inner.connect_timeout + self.inner.command_timeout;
        let (name, owner) = (shared::family_name(keys).to_owned(), owner.to_owned());
        let wake = channel_ident(&self.inner.schema, keys.channel());
        let keep = ms(keep_ms);
        let events = self.inner.events_of(keys).to_owned();
        let thread = std::thread::Builder::new()
            .name("distlock-pg-release".to_owned())
            .spawn(move || -> Result<bool, String> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                runtime.block_on(async move {
                    let release = async {
                        let (client, messages) =
                            connector.connect(&pg).await.map_err(|e| pg_message(&e))?;
                        tokio::spawn(drive(messages));
                        let mut params = vec![param(&name, Type::TEXT)];
                        if let Some(kind) = &kind {
                            params.push(param(kind, Type::TEXT));
                        }
                        params.extend([
                            param(&owner, Type::TEXT),
                            param(&keep, Type::INT8),
                            param(&wake, Type::TEXT),
                        ]);
                        if kind.is_none() {
                            params.push(param(&events, Type::TEXT));
                        }
                        let row = client
                            .query_typed(&sql, &params)
                            .await
                            .map_err(|e| e.to_string())?;
                        row.first()
                            .and_then(|row| row.try_get::<_, bool>(0).ok())
                            .ok_or_else(|| "a release reply without a row".to_owned())
                    };
                    tokio::time::timeout(bound, release)
                        .await
                        .map_err(|_| format!("no reply within {bound:?}"))?
                })
            })
            .map_err(|e| failed(e.to_string()))?;
        thread
            .join()
            .map_err(|_| failed("the release thread failed".to_owned()))?
            .map_err(failed)
    }

    /// See `Backend::renew`: the whole batch in one statement, or two
    /// pipelined ones when it holds both default locks and shared holds
    /// (which live in a table of their own).
    pub(crate) async fn renew(&self, batch: &[Arc<Lease>], end: LeaseEnd) -> Vec<Renewal> {
        if batch.iter().all(|l| l.keys.kind == LockKind::Exclusive) {
            return self.renew_locks(batch, end, true).await;
        }
        self.inner
            .renewal_round_trips
            .fetch_add(1, Ordering::Relaxed);
        // Each lease with its place in the batch, where its outcome goes.
        type Placed<'a> = Vec<(usize, &'a Arc<Lease>)>;
        let (locks, shared): (Placed<'_>, Placed<'_>) = batch
            .iter()
            .enumerate()
            .partition(|(_, l)| l.keys.kind == LockKind::Exclusive);
        let lock_batch: Vec<Arc<Lease>> = locks.iter().map(|(_, l)| Arc::clone(l)).collect();
        let shared_batch: Vec<&Arc<Lease>> = shared.iter().map(|(_, l)| *l).collect();
        let (lock_renewals, shared_renewals) = futures_util::future::join(
            async {
                if lock_batch.is_empty() {
                    Vec::new()
                } else {
                    self.renew_locks(&lock_batch, end, false).await
                }
            },
            self.renew_shared(&shared_batch, end),
        )
        .await;
        let mut out: Vec<Option<Renewal>> = batch.iter().map(|_| None).collect();
        for ((i, _), renewal) in locks.iter().zip(lock_renewals) {
            out[*i] = Some(renewal);
        }
        for ((i, _), renewal) in shared.iter().zip(shared_renewals) {
            out[*i] = Some(renewal);
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Renewal::Failed("no renewal reply".to_owned())))
            .collect()
    }

    /// Renews default locks only: one statement, counted as a round trip
    /// when `count_round_trip` (not when it goes beside the shared holds'
    /// statement, pipelined).
    async fn renew_locks(
        &self,
        batch: &[Arc<Lease>],
        end: LeaseEnd,
        count_round_trip: bool,
    ) -> Vec<Renewal> {
        let inner = &self.inner;
        let names: Vec<&str> = batch.iter().map(|l| l.keys.lock.as_str()).collect();
        let owners: Vec<&str> = batch.iter().map(|l| l.owner.as_str()).collect();
        let leases: Vec<i64> = batch.iter().map(|l| ms(l.lease_ms())).collect();
        let sent_at = Instant::now();
        if count_round_trip {
            inner.renewal_round_trips.fetch_add(1, Ordering::Relaxed);
        }
        let rows = inner
            .query(
                "",
                &inner.sql.renew,
                &[
                    param(&names, Type::TEXT_ARRAY),
                    param(&owners, Type::TEXT_ARRAY),
                    param(&leases, Type::INT8_ARRAY),
                    param(&(end == LeaseEnd::ExactlyALease), Type::BOOL),
                ],
            )
            .await;
        renewals(batch.len(), rows, sent_at)
    }

    /// Whether the listening connection made last heard its probe (see
    /// [`listener`](Self::listener)); one found deaf is made again, and
    /// probed, after [`deaf_recheck_after`].
    pub(crate) fn hears_messages(&self) -> bool {
        !self.inner.listener_deaf.load(Ordering::Relaxed)
    }

    /// Round trips spent on renewals.
    #[cfg(feature = "testing")]
    pub(crate) fn renewal_round_trips(&self) -> u64 {
        self.inner.renewal_round_trips.load(Ordering::Relaxed)
    }

    /// The logical channel every lock event of this manager's schema is
    /// heard on (see [`events_channel`]).
    pub(crate) fn events_channel(&self) -> &str {
        &self.inner.events
    }

    /// Listening connections found deaf so far.
    #[cfg(feature = "testing")]
    pub(crate) fn deaf_listeners(&self) -> u64 {
        self.inner.deaf_listeners.load(Ordering::Relaxed)
    }
}

impl Inner {
    /// The events channel a call on `keys` tells its lock events on: the
    /// schema's, or '' (none) when the manager does not publish them.
    fn events_of(&self, keys: &RedisNames) -> &str {
        if keys.events.is_empty() {
            ""
        } else {
            &self.events_ident
        }
    }

    /// The data connection opened by `build()`: a failure is a
    /// [`LockError::Connect`].
    async fn first_client(&self) -> Result<Arc<Client>, LockError> {
        self.client().await.map_err(|e| LockError::Connect {
            url: self.shown_url.clone(),
            source: match e.error {
                LockError::Backend { source, .. } => source,
                other => BackendError::new(BackendErrorKind::Other, other.to_string()),
            },
        })
    }

    /// The data connection, connecting it when there is none or it closed.
    /// Calls that queue behind a reconnection that fails get its failure,
    /// rather than each trying in turn: behind a connect that hangs (a host
    /// gone, dropped packets) the last of N calls would wait N connect
    /// timeouts, past any `wait` and the renewal's deadline.
    async fn client(&self) -> Result<Arc<Client>, CallError> {
        if let Some(client) = self.open_client() {
            return Ok(client);
        }
        let not_sent = |source: BackendError| CallError {
            error: LockError::Backend {
                key: String::new(),
                source,
            },
            maybe_executed: false,
        };
        let ended_before = self.connects_ended.load(Ordering::Acquire);
        let mut last_failure = self.connecting.lock().await;
        if let Some(client) = self.open_client() {
            return Ok(client);
        }
        if let Some((ended, failure)) = last_failure.as_ref() {
            if *ended > ended_before {
                return Err(not_sent(failure.summary()));
            }
        }
        let connect =
            tokio::time::timeout(self.connect_timeout, self.connector.connect(&self.pg)).await;
        let connected = match connect {
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(e)) => Err(db_error(&e).unwrap_or_else(|| {
                BackendError::new(BackendErrorKind::Connection, pg_message(&e))
            })),
            Err(_) => Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!("no connection within {:?}", self.connect_timeout),
            )),
        };
        let ended = self.connects_ended.fetch_add(1, Ordering::AcqRel) + 1;
        let (client, messages) = match connected {
            Ok(pair) => pair,
            Err(failure) => {
                *last_failure = Some((ended, failure.summary()));
                return Err(not_sent(failure));
            }
        };
        let driver = tokio::spawn(drive(messages)).abort_handle();
        let session = identify(&client, self.command_timeout).await;
        let client = Arc::new(client);
        *self.heard.lock().unwrap_or_else(|e| e.into_inner()) =
            Heard::new(&client, driver, session);
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.clone());
        Ok(client)
    }

    fn open_client(&self) -> Option<Arc<Client>> {
        let slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().filter(|c| !c.is_closed()).cloned()
    }

    /// Runs `sql` with `params`, bounded by the command timeout. A reply lost
    /// to a broken connection or the timeout may come after the server ran
    /// the statement: `maybe_executed`.
    async fn query(
        &self,
        key: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, CallError> {
        // PostgreSQL's text cannot hold NUL (the statement would fail with
        // SQLSTATE 22021 as a server error): a typed refusal instead, before
        // anything is sent. Redis keys may hold it, so the check is this
        // store's, not `validate_key`'s.
        if key.contains('\0') {
            return Err(CallError {
                error: LockError::InvalidKey {
                    key: key.to_owned(),
                    reason: "PostgreSQL text cannot hold a NUL character".to_owned(),
                },
                maybe_executed: false,
            });
        }
        let client = self.client().await.map_err(|mut e| {
            if let LockError::Backend { key: k, .. } = &mut e.error {
                key.clone_into(k);
            }
            e
        })?;
        if self.backlog_full(&client) {
            return Err(CallError {
                error: LockError::Backend {
                    key: key.to_owned(),
                    source: BackendError::new(
                        BackendErrorKind::Timeout,
                        format!(
                            "the data connection's session is at work in the server (a commit \
                             waiting for a synchronous standby, say), and {KEPT_BACKLOG} calls \
                             wait behind it: no more are sent until it answers"
                        ),
                    ),
                },
                maybe_executed: false,
            });
        }
        let sent_at = Instant::now();
        let outcome = tokio::time::timeout(self.command_timeout, async {
            let Some(prepared) = &self.prepared else {
                return client.query_typed(sql, params).await;
            };
            let known = prepared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&client, sql);
            let statement = match known {
                Some(statement) => statement,
                None => {
                    let types: Vec<Type> = params.iter().map(|(_, ty)| ty.clone()).collect();
                    let statement = client.prepare_typed(sql, &types).await?;
                    let mut prepared = prepared.lock().unwrap_or_else(|e| e.into_inner());
                    if prepared.get(&client, sql).is_none() {
                        prepared
                            .statements
                            .insert(sql.to_owned(), statement.clone());
                    }
                    statement
                }
            };
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            client.query(&statement, &values).await
        })
        .await;
        if matches!(&outcome, Ok(Ok(_)))
            || matches!(&outcome, Ok(Err(e)) if e.as_db_error().is_some())
        {
            self.answered(&client);
        }
        match outcome {
            Ok(Ok(rows)) => Ok(rows),
            // The connection ended with an error of its own (a pooler's
            // `query_timeout`, a terminated backend): the statement may
            // still commit on the server (one waiting for a lock runs on
            // when it gets it, its reply going nowhere), so it may have
            // run, like a call whose connection broke.
            Ok(Err(e)) if ended_the_connection(&e) => {
                self.retire(&client);
                let code = e.as_db_error().map(|db| db.code().code().to_owned());
                let mut source = BackendError::new(BackendErrorKind::Connection, pg_message(&e));
                if let Some(code) = code {
                    source = source.with_code(&code);
                }
                Err(CallError {
                    error: LockError::Backend {
                        key: key.to_owned(),
                        source,
                    },
                    maybe_executed: true,
                })
            }
            Ok(Err(e)) => {
                if let Some(db) = e.as_db_error() {
                    // A name longer than a B-tree entry may be (2,704 bytes
                    // after compression): the key's fault, not the server's.
                    // Told by the function that raised it, which is not
                    // translated (the message is, with `lc_messages`).
                    if db.code() == &tokio_postgres::error::SqlState::PROGRAM_LIMIT_EXCEEDED
                        && (db.routine() == Some("_bt_check_third_page")
                            || db.message().contains("index row size"))
                    {
                        return Err(CallError {
                            error: LockError::InvalidKey {
                                key: key.to_owned(),
                                reason: format!(
                                    "too long for PostgreSQL, whose index entries hold at most \
                                     2,704 bytes of a name after compression ({})",
                                    db.message()
                                ),
                            },
                            maybe_executed: false,
                        });
                    }
                }
                if let Some(source) = db_error(&e) {
                    // A statement the server no longer has, or whose plan
                    // went stale (the schema recreated): prepared anew at
                    // the next call.
                    if let Some(prepared) = &self.prepared {
                        prepared
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .statements
                            .clear();
                    }
                    return Err(CallError {
                        error: LockError::Backend {
                            key: key.to_owned(),
                            source,
                        },
                        maybe_executed: false,
                    });
                }
                // The connection broke: the next call connects again.
                self.retire(&client);
                Err(CallError {
                    error: LockError::Backend {
                        key: key.to_owned(),
                        source: BackendError::new(BackendErrorKind::Connection, pg_message(&e)),
                    },
                    maybe_executed: true,
                })
            }
            // The connection is kept while it may only be slow: the
            // statements queued on its session run in order, after this one,
            // when the server gets to them. Replaced at once, the clean-up of
            // this call (a background release of a lock it may have taken)
            // would go out on a new session and could run before the
            // statement it cleans up, which the old session still runs
            // later. A connection silent for longer is replaced
            // (`timed_out`).
            Err(_) => {
                self.timed_out(&client, sent_at);
                Err(CallError {
                    error: LockError::command_timeout(key, self.command_timeout),
                    maybe_executed: true,
                })
            }
        }
    }

    /// Notes that `client` answered a call.
    fn answered(&self, client: &Arc<Client>) {
        let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        if heard.is_about(client) {
            heard.at = Instant::now();
            heard.timeouts = 0;
            heard.unanswered_since = None;
            heard.kept = false;
            // A judgement under way ends at its next look (`heard.at`
            // moved); the next silence starts another.
            heard.judging = None;
        }
    }

    /// Notes that a call on `client`, sent at `sent_at`, timed out, and
    /// retires the connection when calls have waited on it unanswered for
    /// two command timeouts (from the first of them sent after its last
    /// reply; two calls that time out together count once, and an idle
    /// spell before them not at all): a peer that died without a reset (a host gone,
    /// a failover that moved the address, a middlebox that forgot the
    /// connection) answers no more, and the kernel would keep the
    /// connection for many minutes, failing every call and losing every
    /// hold. The next call connects again. A server only slow answers
    /// something within that time (a renewal's batch, a sweep); one silent
    /// that long still runs what reached it in order, and a statement run
    /// after the new session's clean-up of it judges the row as it finds it
    /// then (at worst a lock is taken by a call that gave up, held until
    /// its lease ends).
    ///
    /// Unless its session waits in the server for a synchronous standby
    /// that is away (or for a key's lock held by a session that does). A
    /// closed socket does not end that wait, and a new connection's first
    /// write would wait the same way, so each retirement would leave one
    /// more session on the server, up to `max_connections`. A task asks the
    /// server on a connection of its own (see
    /// [`session_at_work`](Self::session_at_work)); the connection is kept
    /// while its session waits so, asked about again every two command
    /// timeouts. Calls still go to it, and wait for the session as every
    /// call behind it does (the first to answer, once the wait ends, ends
    /// the keeping); past [`KEPT_BACKLOG`] of them timed out unanswered, the
    /// next are refused unsent, so that a long wait piles up no more than
    /// that on the client, to run late, in order, when it ends. When the
    /// session does anything else, or is gone, the connection itself is
    /// asked once more (an empty statement), and goes if it does not
    /// answer. Behind a transaction-mode pooler (`postgres_listen_url`) the
    /// session cannot be told, and the connection goes as before. The
    /// judgement delays a retirement by at most a connect and two command
    /// timeouts (and a moment to close its own connection).
    fn timed_out(&self, client: &Arc<Client>, sent_at: Instant) {
        let (silent_for, session, judged_at, number) = {
            let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
            // Sent before the last reply: the connection answered since.
            if !heard.is_about(client) || sent_at < heard.at {
                return;
            }
            heard.timeouts = heard.timeouts.saturating_add(1);
            let since = *heard.unanswered_since.get_or_insert(sent_at);
            let since = since.min(sent_at);
            heard.unanswered_since = Some(since);
            if heard.timeouts < 2
                || since.elapsed() < self.command_timeout * 2
                || heard.judging.is_some()
            {
                return;
            }
            let number = JUDGEMENTS.fetch_add(1, Ordering::Relaxed);
            heard.judging = Some(number);
            (since.elapsed(), heard.session, heard.at, number)
        };
        let judging = Judging {
            inner: self.me.clone(),
            client: client.clone(),
            number,
        };
        match session.filter(|_| !self.pooled) {
            Some(session) => {
                tokio::spawn(judge(judging, session, judged_at, silent_for));
            }
            None => {
                self.retire_silent(client, silent_for);
                drop(judging);
            }
        }
    }

    /// One look of [`judge`] at a connection silent since `judged_at` (its
    /// last reply then) whose session is `session`: whether to look again
    /// in two command timeouts (the session works), or the judgement is
    /// over (the connection answered, was replaced, or is retired here).
    async fn judge_once(
        &self,
        judging: &Judging,
        session: Session,
        judged_at: Instant,
        silent_for: Duration,
    ) -> bool {
        let client = &judging.client;
        let at_work = self.session_at_work(session).await;
        let first_kept = {
            let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
            // Replaced, answered meanwhile, or judged by another: over.
            if !heard.still_judging(client, judged_at, judging.number) {
                return false;
            }
            at_work.is_some() && !std::mem::replace(&mut heard.kept, true)
        };
        let Some(work) = at_work else {
            // Idle, gone, or not to be told: the connection itself is
            // asked. A reply (after whatever was queued on it, the wait
            // having ended) is its first since the silence; none, and it
            // goes.
            let asked = tokio::time::timeout(self.command_timeout, client.simple_query(""));
            if matches!(asked.await, Ok(Ok(_))) {
                self.answered(client);
            } else {
                // Unless it answered meanwhile (and may be judged anew).
                let current = self
                    .heard
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .still_judging(client, judged_at, judging.number);
                if current {
                    self.retire_silent(client, silent_for);
                }
            }
            return false;
        };
        if first_kept {
            tracing::warn!(target: "distlock::postgres",
                silent_ms = silent_for.as_millis() as u64, url = %self.shown_url,
                wait = %work,
                "the data connection has answered nothing for two command timeouts, but its \
                 session waits in the server for a synchronous standby: kept, since a new \
                 connection would leave it there and wait the same way");
        }
        true
    }

    /// Whether `client` is kept for a session at work in the server (see
    /// [`timed_out`](Self::timed_out)) with [`KEPT_BACKLOG`] calls timed
    /// out unanswered on it: no more are sent.
    fn backlog_full(&self, client: &Arc<Client>) -> bool {
        let heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
        heard.kept && heard.is_about(client) && heard.timeouts >= KEPT_BACKLOG
    }

    /// What `session` waits for, when it waits in the server for a
    /// synchronous standby, or for a lock held by a session that does (a
    /// key's transaction lock, say): waits that a new connection's first
    /// write would share. Asked on a connection of its own, opened and
    /// closed here, never about itself (through an undetected pooler it may
    /// land on the session it is asked about); `None` when the session does
    /// anything else (idle, waiting for its client, running, waiting for
    /// another lock: a new connection would serve the other keys) or is
    /// gone, or the server does not answer in time.
    async fn session_at_work(&self, session: Session) -> Option<String> {
        let mut pg = self.pg.clone();
        pg.application_name(CHECK_APPLICATION);
        let connect = tokio::time::timeout(self.connect_timeout, self.connector.connect(&pg));
        let (probe, messages) = connect.await.ok()?.ok()?;
        let driver = tokio::spawn(drive(messages));
        let params: [(&(dyn ToSql + Sync), Type); 2] = [
            (&session.pid, Type::INT4),
            (&session.started_us, Type::INT8),
        ];
        let asked = probe.query_typed(
            "SELECT a.wait_event_type || ' ' || a.wait_event FROM pg_stat_activity a \
             WHERE a.pid = $1 AND a.pid <> pg_backend_pid() \
             AND (extract(epoch FROM a.backend_start) * 1000000)::bigint = $2 \
             AND a.state = 'active' \
             AND (a.wait_event = 'SyncRep' OR (a.wait_event_type = 'Lock' AND EXISTS ( \
               SELECT 1 FROM pg_stat_activity b \
               WHERE b.pid = ANY (pg_blocking_pids(a.pid)) AND b.wait_event = 'SyncRep')))",
            &params,
        );
        let rows = tokio::time::timeout(self.command_timeout, asked).await;
        // Closed with a goodbye (a TLS server logs an abrupt end), within
        // a moment; then cut.
        drop(probe);
        let abort = driver.abort_handle();
        if tokio::time::timeout(Duration::from_millis(100), driver)
            .await
            .is_err()
        {
            abort.abort();
        }
        let rows = rows.ok()?.ok()?;
        rows.first()
            .and_then(|row| row.try_get::<_, String>(0).ok())
    }

    /// Retires `client`, silent for `silent_for`: closed, rather than left
    /// to the kernel with replies pending (the calls still waiting on it
    /// fail now, and its socket goes).
    fn retire_silent(&self, client: &Arc<Client>, silent_for: Duration) {
        let driver = {
            let mut heard = self.heard.lock().unwrap_or_else(|e| e.into_inner());
            if !heard.is_about(client) {
                return;
            }
            heard.judging = None;
            heard.kept = false;
            heard.driver.take()
        };
        if let Some(driver) = driver {
            driver.abort();
        }
        tracing::warn!(target: "distlock::postgres", silent_ms = silent_for.as_millis() as u64,
            url = %self.shown_url,
            "the data connection has answered nothing for two command timeouts; \
             opening a new one");
        self.retire(client);
    }

    /// Stops handing out `client`, which broke (unless another call already
    /// replaced it): the next call opens a fresh connection.
    fn retire(&self, client: &Arc<Client>) {
        let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *slot = None;
        }
    }

    /// [`query`](Self::query) for a statement that answers one row.
    async fn one(
        &self,
        key: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Row, CallError> {
        let mut rows = self.query(key, sql, params).await?;
        if rows.len() != 1 {
            return Err(protocol(
                key,
                format!("{} rows where one was expected", rows.len()),
            ));
        }
        Ok(rows.swap_remove(0))
    }

    /// Reads the schema's version; creates the schema when it is missing
    /// and `create` allows.
    async fn check_schema(
        &self,
        client: &Client,
        schema: &str,
        create: bool,
    ) -> Result<(), LockError> {
        let refused = |reason: String| LockError::ServerCheck {
            url: self.shown_url.clone(),
            reason,
        };
        let version = tokio::time::timeout(
            self.command_timeout,
            client.query_typed(&self.sql.version, &[]),
        )
        .await
        .map_err(|_| LockError::command_timeout("", self.command_timeout))?;
        let missing = match &version {
            Ok(rows) => rows.is_empty(),
            Err(e) => {
                let code = e.code();
                code == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
                    || code == Some(&tokio_postgres::error::SqlState::INVALID_SCHEMA_NAME)
            }
        };
        if !missing {
            let rows = version.map_err(|e| {
                refused(format!("cannot read {schema}.version: {}", pg_message(&e)))
            })?;
            let found: i32 = rows
                .first()
                .and_then(|row| row.try_get(0).ok())
                .unwrap_or_default();
            if found > SCHEMA_VERSION {
                return Err(refused(format!(
                    "schema {schema} is at version {found}, newer than this distlock's \
                     {SCHEMA_VERSION}: upgrade distlock"
                )));
            }
            if found == SCHEMA_VERSION {
                return Ok(());
            }
            if !create {
                return Err(refused(format!(
                    "schema {schema} is at version {found}, older than this distlock's \
                     {SCHEMA_VERSION}, and the builder was told not to migrate it: have a DBA \
                     run the SQL of `distlock schema`, which migrates it"
                )));
            }
        }
        if !create {
            return Err(refused(format!(
                "schema {schema} (version {SCHEMA_VERSION}) is missing and the builder was told \
                 not to create it: have a DBA run the SQL of `distlock schema`"
            )));
        }
        // One query string runs as one implicit transaction: under the
        // advisory lock, managers that start together create the schema
        // once (concurrent CREATE ... IF NOT EXISTS can fail on catalog
        // uniqueness), and a failure leaves nothing half made.
        let sql = format!(
            "SELECT pg_advisory_xact_lock(1684826880, 0);\n{}",
            schema_sql(schema)?
        );
        let created = tokio::time::timeout(
            self.command_timeout.max(Duration::from_secs(10)),
            client.batch_execute(&sql),
        )
        .await
        .map_err(|_| LockError::command_timeout("", self.command_timeout))?;
        created.map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE) {
                refused(format!(
                    "the role may not create distlock's schema {schema} ({}): have a DBA run \
                     the SQL of `distlock schema` once, or grant CREATE on the database",
                    pg_message(&e)
                ))
            } else {
                refused(format!(
                    "creating schema {schema} failed: {}",
                    pg_message(&e)
                ))
            }
        })
    }
}

/// The outcomes of a renewal statement's rows `(i, renewed)` for a batch
/// of `leases` sent at `sent_at`.
fn renewals(leases: usize, rows: Result<Vec<Row>, CallError>, sent_at: Instant) -> Vec<Renewal> {
    let failed = |why: String| (0..leases).map(|_| Renewal::Failed(why.clone())).collect();
    let rows = match rows {
        Ok(rows) if rows.len() == leases => rows,
        Ok(rows) => {
            return failed(format!(
                "{} renewal replies for {leases} leases",
                rows.len()
            ))
        }
        Err(e) => return failed(e.error.to_string()),
    };
    rows.iter()
        .map(|row| match row.try_get::<_, bool>(1) {
            Ok(true) => Renewal::Renewed { sent_at },
            Ok(false) => Renewal::NotOurs,
            Err(e) => Renewal::Failed(e.to_string()),
        })
        .collect()
}

/// The default lock's part of a key's reading, from the first five columns
/// of an `inspect` row: its holder, its queue, the server clock.
fn key_reading(key: &str, row: &Row) -> Result<KeyReading, CallError> {
    let value: Option<String> = get(key, row, 0)?;
    let pttl: Option<i64> = get(key, row, 1)?;
    let owners: Vec<String> = get(key, row, 2)?;
    let entries: Vec<String> = get(key, row, 3)?;
    let now_ms: i64 = get(key, row, 4)?;
    Ok(KeyReading {
        lock: value.map(|value| HeldLock {
            value,
            pttl: pttl.unwrap_or(-1).max(1),
        }),
        queue: owners
            .into_iter()
            .zip(entries.into_iter().map(Some))
            .collect(),
        now_ms,
        ..KeyReading::default()
    })
}

/// What a client error says, with its causes: tokio-postgres's own message
/// ("error connecting to server") names no reason, its source does.
pub(crate) fn pg_message(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.code().code(), db.message());
    }
    let mut message = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(inner) = cause {
        message.push_str(": ");
        message.push_str(&inner.to_string());
        cause = inner.source();
    }
    message
}

/// Whether the statement was rolled back, having done nothing, because it
/// met another transaction: a deadlock (40P01) or a serialization failure
/// (40001).
fn rolled_back_by_conflict(e: &CallError) -> bool {
    match &e.error {
        LockError::Backend { source, .. } => {
            matches!(source.code(), Some("40P01" | "40001"))
        }
        _ => false,
    }
}

fn protocol(key: &str, message: String) -> CallError {
    CallError {
        error: LockError::Backend {
            key: key.to_owned(),
            source: BackendError::new(BackendErrorKind::Protocol, message),
        },
        maybe_executed: false,
    }
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    key: &str,
    row: &'a Row,
    column: usize,
) -> Result<T, CallError> {
    row.try_get(column)
        .map_err(|e| protocol(key, format!("column {column}: {e}")))
}

/// `url` without its password. The credentials end where tokio-postgres
/// ends them, at the first `@`: a password with a `/` or `?` in it, which
/// tokio-postgres takes as it is, is hidden too.
fn shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (user, rest) = match rest.split_once('@') {
        Some((credentials, rest)) => {
            let user = credentials.split(':').next().unwrap_or("");
            (format!("{user}:***@"), rest)
        }
        None => (String::new(), rest),
    };
    let (host, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let path = hide_password_parameter(path);
    format!("{scheme}://{user}{host}{path}")
}

/// `path` (what follows a URL's host) with the value of a `password`
/// parameter of its query replaced by `***`.
fn hide_password_parameter(path: &str) -> String {
    let Some((before, query)) = path.split_once('?') else {
        return path.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{before}?{}", query.join("&"))
}

/// Deletes dead rows every `interval` while the backend lives, a bounded
/// number per run (see `sweep` in `schema.sql`); runs again at once while a
/// run deletes its limit.
async fn sweep_periodically(inner: Weak<Inner>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        loop {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let limit = SWEEP_LIMIT;
            // The default lock's tables, the shared holds' and the
            // counters' (each bounded): the sweep runs again while any
            // deleted its limit. Expiries of the default lock are told
            // whether or not this manager publishes lock events, as Redis's
            // keyspace notifications are: the sweep is where a lease that
            // nobody else came across is seen to end.
            let events = &inner.events_ident;
            let statements: [(&str, &[Param<'_>]); 3] = [
                (
                    &inner.sql.sweep,
                    &[param(&limit, Type::INT4), param(events, Type::TEXT)],
                ),
                (&inner.shared.sweep, &[param(&limit, Type::INT4)]),
                (&inner.counters.sweep, &[param(&limit, Type::INT4)]),
            ];
            let mut swept = Ok(0);
            for (sql, params) in statements {
                let deleted = inner
                    .one("", sql, params)
                    .await
                    .and_then(|row| get::<i64>("", &row, 0));
                swept = match (swept, deleted) {
                    (Ok(most), Ok(n)) => Ok(most.max(n)),
                    (_, Err(e)) | (Err(e), _) => Err(e),
                };
                if swept.is_err() {
                    break;
                }
            }
            match swept {
                Ok(n) if n >= i64::from(SWEEP_LIMIT) => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(target: "distlock::postgres", error = %e.error, "sweep failed");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_idents_are_short_stable_identifiers() {
        let ident = channel_ident("distlock", "distlock:handoff:0123abcd");
        assert_eq!(ident.len(), "distlock_".len() + 32);
        assert!(ident
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        assert_eq!(
            ident,
            channel_ident("distlock", "distlock:handoff:0123abcd")
        );
        assert_ne!(
            ident,
            channel_ident("distlock", "distlock:handoff:0123abce")
        );
        // Another schema's channel of the same name is another channel.
        assert_ne!(
            ident,
            channel_ident("distlock_b", "distlock:handoff:0123abcd")
        );
        assert!(channel_ident("distlock", &"x".repeat(10_000)).len() <= 63);
    }

    #[test]
    fn globs_become_anchored_regexes() {
        assert_eq!(glob_to_regex("a*b?"), "^a.*b.$");
        assert_eq!(glob_to_regex("a.b"), "^a\\.b$");
        assert_eq!(glob_to_regex("\\*x"), "^\\*x$");
        assert_eq!(glob_to_regex("[^ab]"), "^[^ab]$");
        assert_eq!(glob_to_regex("[a-c]"), "^[a-c]$");
        // A reversed range is Redis's range the other way round.
        assert_eq!(glob_to_regex("[c-a]x"), "^[a-c]x$");
        // A `-` that makes no range is a character; an escaped character
        // starts no range (as in Redis).
        assert_eq!(glob_to_regex("[-a]"), "^[\\-a]$");
        assert_eq!(glob_to_regex("[\\a-z]"), "^[a\\-z]$");
    }

    #[test]
    fn urls_and_schema_names() {
        assert_eq!(
            shown("postgres://u:secret@h:1/db"),
            "postgres://u:***@h:1/db"
        );
        assert_eq!(
            shown("postgres://h:1/db?user=u&password=secret&sslmode=disable"),
            "postgres://h:1/db?user=u&password=***&sslmode=disable"
        );
        assert_eq!(
            shown("postgres://h/db?PASSWORD=x"),
            "postgres://h/db?PASSWORD=***"
        );
        // tokio-postgres reads the credentials up to the first `@`, so these
        // passwords are "pa/ss" and "pa?ss" (they were shown as they are).
        assert_eq!(
            shown("postgres://app:pa/ss@db/locks"),
            "postgres://app:***@db/locks"
        );
        assert_eq!(
            shown("postgresql://app:pa?ss@db:5433/locks?sslmode=require"),
            "postgresql://app:***@db:5433/locks?sslmode=require"
        );
        assert!(validate_schema("distlock").is_ok());
        assert!(validate_schema("Distlock").is_err());
        assert!(validate_schema("a;drop").is_err());
        assert!(validate_schema("1a").is_err());
        assert!(validate_schema("user").is_err());
        assert!(validate_schema("users").is_ok());
        assert!(RESERVED_KEYWORDS.windows(2).all(|w| w[0] < w[1]), "sorted");
    }

    fn chosen(url: &str, tls: &TlsSettings) -> Result<Connector, LockError> {
        Connector::choose(&parse_url(url)?, tls)
    }

    #[test]
    fn tls_is_used_when_required_or_certificates_are_given() -> Result<(), LockError> {
        let none = TlsSettings::default();
        let ca = TlsSettings {
            ca_pem: Some(b"not a certificate".to_vec()),
            client_identity: None,
        };
        // The default (prefer) and disable stay plain without certificates.
        assert!(matches!(
            chosen("postgres://u@h/db", &none)?,
            Connector::Plain
        ));
        assert!(matches!(
            chosen("postgres://u@h/db?sslmode=disable", &none)?,
            Connector::Plain
        ));
        // Certificates contradict sslmode=disable.
        assert!(matches!(
            chosen("postgres://u@h/db?sslmode=disable", &ca),
            Err(LockError::InvalidConfig(m)) if m.contains("sslmode=disable")
        ));
        for mode in ["require", "verify-ca", "verify-full"] {
            let url = format!("postgres://u@h/db?sslmode={mode}");
            assert_eq!(parse_url(&url)?.get_ssl_mode(), SslMode::Require, "{mode}");
            let made = chosen(&url, &none);
            #[cfg(feature = "tls")]
            assert!(matches!(made, Ok(Connector::Tls(_))), "{mode}: {made:?}");
            #[cfg(not(feature = "tls"))]
            assert!(
                matches!(&made, Err(LockError::InvalidConfig(m)) if m.contains("`tls` feature")),
                "{mode}: {made:?}"
            );
        }
        // A CA that holds no certificate is refused when it is read, not at
        // the first handshake (or, without `tls`, for the missing feature).
        let made = chosen("postgres://u@h/db", &ca);
        assert!(
            matches!(&made, Err(LockError::InvalidConfig(m))
                if m.contains(if cfg!(feature = "tls") { "tls_ca_pem" } else { "`tls` feature" })),
            "{made:?}"
        );
        Ok(())
    }
}
