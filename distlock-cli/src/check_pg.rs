//! `distlock check` on a PostgreSQL URL: what the server, the schema and the
//! role must offer for distlock, read with plain tokio-postgres statements
//! (the SQL in `check_pg/`), without a `LockManager`, so that it also runs
//! where a manager would refuse to start (no schema, no privileges).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::{Client, Notification, Row};

use crate::output::{human_duration, redact, CheckResult, Status};

/// Connect and statement timeout of the checks, and how long the LISTEN
/// probe waits for its own notification: on a direct connection it arrives
/// within one round trip after the NOTIFY commits, so 2 s only runs out when
/// it is not coming.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The oldest server distlock's schema runs on: it uses `INSERT ... ON
/// CONFLICT` and `CREATE ... IF NOT EXISTS`, new in PostgreSQL 9.5.
const MIN_VERSION_NUM: i32 = 90_500;
/// The oldest server recommended: older ones are past their end of life,
/// and the library is tested on 15.
const RECOMMENDED_VERSION_NUM: i32 = 120_000;

/// How long a manager's data connection can sit idle while the manager
/// lives: its sweep runs every 10 s by default (`postgres_sweep_interval`),
/// and renewals come more often while anything is held. Its listening
/// connection is idle for as long as nobody notifies.
const DATA_IDLE: Duration = Duration::from_secs(10);

const SETTINGS_SQL: &str = include_str!("check_pg/settings.sql");
const OBJECTS_SQL: &str = include_str!("check_pg/objects.sql");
const MISSING_PRIVILEGES_SQL: &str = include_str!("check_pg/missing_privileges.sql");

/// The server, schema and settings read at the start of the checks.
struct Settings {
    version_num: i32,
    version: String,
    in_recovery: bool,
    role: String,
    database: String,
    synchronous_commit: String,
    synchronous_standby_names: String,
    replicas: i64,
    /// Standbys in `pg_stat_replication` with `sync_state` sync or quorum.
    in_sync: i64,
    /// Standbys whose `sync_state` this role may not read.
    hidden: i64,
    idle_session_timeout_ms: Option<i64>,
    idle_in_transaction_timeout_ms: Option<i64>,
    may_create: bool,
    /// `default_transaction_isolation` for this role and database.
    default_isolation: String,
    /// `default_transaction_read_only` for this role and database (`on`:
    /// every write distlock makes fails).
    default_read_only: String,
}

impl Settings {
    fn of(row: &Row) -> Result<Settings, tokio_postgres::Error> {
        Ok(Settings {
            version_num: row.try_get(0)?,
            version: row.try_get(1)?,
            in_recovery: row.try_get(2)?,
            role: row.try_get(3)?,
            database: row.try_get(4)?,
            synchronous_commit: row.try_get(5)?,
            synchronous_standby_names: row.try_get(6)?,
            replicas: row.try_get(7)?,
            in_sync: row.try_get(8)?,
            hidden: row.try_get(9)?,
            idle_session_timeout_ms: row.try_get(10)?,
            idle_in_transaction_timeout_ms: row.try_get(11)?,
            may_create: row.try_get(12)?,
            default_isolation: row.try_get(13)?,
            default_read_only: row.try_get(14)?,
        })
    }
}

/// Checks the server at `url` for distlock's schema `schema`, trusting
/// `tls_ca` (PEM) where the URL asks for TLS.
pub async fn run(url: &str, schema: &str, tls_ca: Option<Vec<u8>>) -> Vec<CheckResult> {
    let result = |check: &str, status, detail: String| CheckResult {
        check: check.to_owned(),
        status,
        detail,
    };
    let expected = match distlock::postgres_schema_sql(schema) {
        Ok(sql) => schema_objects(&sql, schema),
        Err(e) => return vec![result("schema", Status::Fail, e.to_string())],
    };
    let (client, mut notifications) = match connect(url, tls_ca.clone()).await {
        Ok(pair) => pair,
        Err(e) => {
            return vec![result(
                "connect",
                Status::Fail,
                format!("cannot connect to PostgreSQL at {}: {e}", shown(url)),
            )]
        }
    };
    let settings = match query(&client, SETTINGS_SQL, &[]).await.and_then(|rows| {
        rows.first()
            .ok_or_else(|| "no row".to_owned())
            .and_then(|row| Settings::of(row).map_err(|e| e.to_string()))
    }) {
        Ok(settings) => settings,
        Err(e) => return vec![result("settings", Status::Fail, e)],
    };
    let mut results = vec![
        version(&settings),
        role(&settings),
        schema_check(&client, schema, &expected, &settings).await,
    ];
    results.extend(privileges(&client, schema, &settings).await);
    results.push(synchronous_commit(&settings));
    results.push(standbys(&settings));
    results.push(idle_session_timeout(&settings));
    results.push(idle_in_transaction(&settings));
    results.push(isolation(&settings));
    results.push(read_only(&settings));
    // The NOTIFY goes out on a second session: through a transaction-mode
    // pooler, a session's notification to itself comes back before its
    // transaction ends, while the pooler still links the two, so a
    // self-addressed probe would pass where a manager hears nothing.
    results.push(match connect(url, tls_ca).await {
        Ok((notifier, _)) => listen(&client, &notifier, &mut notifications).await,
        Err(e) => (
            "listen",
            Status::Warn,
            format!("not checked: no second connection to send the NOTIFY from: {e}"),
        ),
    });
    results
        .into_iter()
        .map(|(check, status, detail)| result(check, status, detail))
        .collect()
}

/// `url` without its password, wherever the URL carries it (the user part or
/// a `password=` parameter).
fn shown(url: &str) -> String {
    let url = redact(url);
    let Some((head, query)) = url.split_once('?') else {
        return url;
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{head}?{}", query.join("&"))
}

/// A connection whose notifications a task forwards to the receiver, made
/// as a manager makes its own (TLS as `sslmode` asks, trusting `tls_ca` or
/// the system's roots).
async fn connect(
    url: &str,
    tls_ca: Option<Vec<u8>>,
) -> Result<(Client, mpsc::UnboundedReceiver<Notification>), String> {
    let connect =
        distlock::__private::connect_as_a_manager_would(url, tls_ca, "distlock-check", TIMEOUT);
    tokio::time::timeout(TIMEOUT, connect)
        .await
        .map_err(|_| format!("no connection within {}", human_duration(TIMEOUT)))?
        .map_err(|e| e.to_string())?
        .map_err(|e| message(&e))
}

/// A database error's message and code, or the error with its causes
/// (tokio-postgres's own text, "error connecting to server", leaves out
/// why).
fn message(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// Runs `sql` within the timeout.
async fn query(
    client: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Row>, String> {
    tokio::time::timeout(TIMEOUT, client.query(sql, params))
        .await
        .map_err(|_| format!("no reply within {}", human_duration(TIMEOUT)))?
        .map_err(|e| message(&e))
}

/// The `(kind, name)` of every table, sequence and function that the schema
/// SQL creates, read from its `CREATE` statements, so that the check follows
/// the schema of the library it is built with.
fn schema_objects(sql: &str, schema: &str) -> BTreeSet<(&'static str, String)> {
    let mut objects = BTreeSet::new();
    for line in sql.lines() {
        for (statement, kind) in [
            ("CREATE TABLE IF NOT EXISTS ", "table"),
            ("CREATE SEQUENCE IF NOT EXISTS ", "sequence"),
            ("CREATE OR REPLACE FUNCTION ", "function"),
        ] {
            let Some(rest) = line.trim_start().strip_prefix(statement) else {
                continue;
            };
            let Some(name) = rest.strip_prefix(schema).and_then(|r| r.strip_prefix('.')) else {
                continue;
            };
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            objects.insert((kind, name));
        }
    }
    objects
}

/// The server version, and that it is a primary.
fn version(s: &Settings) -> (&'static str, Status, String) {
    let name = format!("PostgreSQL {}", s.version);
    let (status, detail) = if s.version_num < MIN_VERSION_NUM {
        (
            Status::Fail,
            format!("{name}: distlock needs 9.5 or newer (INSERT ... ON CONFLICT)"),
        )
    } else if s.in_recovery {
        (
            Status::Fail,
            format!("{name}, a standby (read-only): give distlock the primary"),
        )
    } else if s.version_num < RECOMMENDED_VERSION_NUM {
        (
            Status::Warn,
            format!("{name}: works, but 12 or newer is recommended (distlock is tested on 15)"),
        )
    } else {
        (Status::Ok, format!("{name}, primary"))
    };
    ("version", status, detail)
}

/// Who the checks ran as: the privileges below are this role's.
fn role(s: &Settings) -> (&'static str, Status, String) {
    (
        "role",
        Status::Ok,
        format!("{} on database {}", s.role, s.database),
    )
}

/// The schema: present with this library's version and every object, or
/// missing and creatable by this role.
async fn schema_check(
    client: &Client,
    schema: &str,
    expected: &BTreeSet<(&'static str, String)>,
    s: &Settings,
) -> (&'static str, Status, String) {
    const CHECK: &str = "schema";
    let library = distlock::POSTGRES_SCHEMA_VERSION;
    let present = match query(client, OBJECTS_SQL, &[&schema]).await {
        Ok(rows) => rows
            .iter()
            .filter_map(|row| {
                let kind: String = row.try_get(0).ok()?;
                let name: String = row.try_get(1).ok()?;
                Some((kind, name))
            })
            .collect::<BTreeSet<_>>(),
        Err(e) => {
            return (
                CHECK,
                Status::Fail,
                format!("cannot read the catalogs: {e}"),
            )
        }
    };
    let exists = match query(
        client,
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1::text)",
        &[&schema],
    )
    .await
    {
        Ok(rows) => rows
            .first()
            .and_then(|r| r.try_get(0).ok())
            .unwrap_or(false),
        Err(e) => {
            return (
                CHECK,
                Status::Fail,
                format!("cannot read the catalogs: {e}"),
            )
        }
    };
    if !exists {
        return if s.may_create {
            (
                CHECK,
                Status::Warn,
                format!(
                    "{schema} is missing: a manager's build() creates it (role {} may create \
                     schemas in {}); the CLI's other commands need it first",
                    s.role, s.database
                ),
            )
        } else {
            (
                CHECK,
                Status::Fail,
                format!(
                    "{schema} is missing and role {} may not create it (no CREATE on database \
                     {}): have a DBA run the SQL of `distlock schema`, or grant CREATE",
                    s.role, s.database
                ),
            )
        };
    }
    let missing: Vec<String> = expected
        .iter()
        .filter(|(kind, name)| !present.contains(&((*kind).to_owned(), name.clone())))
        .map(|(kind, name)| format!("{kind} {schema}.{name}"))
        .collect();
    let found = query(
        client,
        &format!("SELECT version FROM {schema}.version"),
        &[],
    )
    .await
    .and_then(|rows| {
        rows.first()
            .map(|row| row.try_get::<_, i32>(0).map_err(|e| e.to_string()))
            .transpose()
    });
    let found = match found {
        Ok(Some(found)) => found,
        Ok(None) => {
            return (
                CHECK,
                Status::Fail,
                format!(
                "{schema}.version has no row: the schema is half made; run `distlock schema`'s SQL"
            ),
            )
        }
        Err(e) => {
            return (
                CHECK,
                Status::Fail,
                format!("{schema} exists, but its version cannot be read: {e}"),
            )
        }
    };
    if found > library {
        return (
            CHECK,
            Status::Fail,
            format!("{schema} is at version {found}, newer than this distlock's {library}: upgrade distlock"),
        );
    }
    if found < library {
        return (
            CHECK,
            Status::Fail,
            format!("{schema} is at version {found}, older than this distlock's {library}"),
        );
    }
    if !missing.is_empty() {
        return (
            CHECK,
            Status::Fail,
            format!(
                "{schema} (version {found}) lacks {}: run `distlock schema`'s SQL again",
                missing.join(", ")
            ),
        );
    }
    (
        CHECK,
        Status::Ok,
        format!("{schema}, version {found} (this distlock's)"),
    )
}

/// The role's privileges on the schema, or to create it.
async fn privileges(
    client: &Client,
    schema: &str,
    s: &Settings,
) -> Option<(&'static str, Status, String)> {
    const CHECK: &str = "privileges";
    let exists = query(
        client,
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1::text)",
        &[&schema],
    )
    .await
    .ok()?
    .first()
    .and_then(|r| r.try_get(0).ok())
    .unwrap_or(false);
    if !exists {
        // The schema check said whether the role may create it.
        return None;
    }
    let rows = match query(client, MISSING_PRIVILEGES_SQL, &[&schema]).await {
        Ok(rows) => rows,
        Err(e) => return Some((CHECK, Status::Fail, format!("cannot read them: {e}"))),
    };
    if rows.is_empty() {
        return Some((
            CHECK,
            Status::Ok,
            format!(
                "{} has usage on {schema}, select/insert/update/delete on its tables, usage on \
                 its sequences, execute on its functions",
                s.role
            ),
        ));
    }
    // One entry per object, its privileges in the order the rows name them.
    let mut by_object: Vec<(String, Vec<String>)> = Vec::new();
    for row in &rows {
        let (Ok(privilege), Ok(object)) =
            (row.try_get::<_, String>(0), row.try_get::<_, String>(1))
        else {
            continue;
        };
        match by_object.iter_mut().find(|(o, _)| *o == object) {
            Some((_, privileges)) => privileges.push(privilege),
            None => by_object.push((object, vec![privilege])),
        }
    }
    let lacking: Vec<String> = by_object
        .iter()
        .map(|(object, privileges)| format!("{} on {object}", privileges.join(", ")))
        .collect();
    let role = &s.role;
    Some((
        CHECK,
        Status::Fail,
        format!(
            "{role} lacks {}; grant them: GRANT USAGE ON SCHEMA {schema} TO {role}; GRANT \
             SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}; GRANT \
             USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}; GRANT EXECUTE ON ALL \
             FUNCTIONS IN SCHEMA {schema} TO {role}",
            lacking.join(", ")
        ),
    ))
}

/// `synchronous_commit`: off, a crash of the server loses the last commits
/// that clients were already told of.
fn synchronous_commit(s: &Settings) -> (&'static str, Status, String) {
    let value = &s.synchronous_commit;
    let (status, detail) = if value == "off" {
        (
            Status::Warn,
            "off: a server crash can lose grants and releases that clients were already told \
             of (the last few hundred ms), so a lock can go to two holders and a fencing token \
             be issued twice; use on (the default) for distlock's role \
             (ALTER ROLE ... SET synchronous_commit = on)"
                .to_owned(),
        )
    } else {
        (Status::Ok, value.clone())
    };
    ("synchronous_commit", status, detail)
}

/// Standbys: a failover to an asynchronous standby loses the locks granted
/// just before it.
fn standbys(s: &Settings) -> (&'static str, Status, String) {
    let names = s.synchronous_standby_names.trim();
    let replicas = s.replicas;
    let (status, detail) = match (names.is_empty(), replicas) {
        (true, 0) => (
            Status::Ok,
            "no synchronous standbys and no streaming replicas: nothing to fail over to".to_owned(),
        ),
        (true, n) => (
            Status::Warn,
            format!(
                "{n} asynchronous standby(s): a failover to one can lose locks granted just \
                 before it (a lock can go to two holders) and issue fencing tokens again; set \
                 synchronous_standby_names, with synchronous_commit on or remote_apply"
            ),
        ),
        (false, n) => {
            let commit = &s.synchronous_commit;
            if !matches!(commit.as_str(), "on" | "remote_apply" | "remote_write") {
                (
                    Status::Warn,
                    format!(
                        "{names:?}, but synchronous_commit is {commit}: commits do not wait \
                         for the standby, so a failover can lose the last grants \
                         (postgres_synchronous_standby sets on for distlock's sessions)"
                    ),
                )
            } else if s.in_sync > 0 {
                (
                    Status::Ok,
                    format!(
                        "{names:?}, {} of {n} streaming standby(s) in sync now: every grant \
                         waits for one, so a failover to it keeps every grant a client was \
                         told of (postgres_synchronous_standby makes build() require this)",
                        s.in_sync
                    ),
                )
            } else if s.hidden > 0 {
                (
                    Status::Warn,
                    format!(
                        "{names:?}, {n} streaming standby(s), but this role cannot read their \
                         sync_state in pg_stat_replication: grant it pg_monitor to check, and \
                         for postgres_synchronous_standby"
                    ),
                )
            } else {
                (
                    Status::Fail,
                    format!(
                        "{names:?}, but no standby is in sync now ({n} streaming): every \
                         commit waits until one is, so locks cannot be taken or released \
                         (calls fail with a command timeout)"
                    ),
                )
            }
        }
    };
    ("synchronous standbys", status, detail)
}

/// `idle_session_timeout`: cuts the manager's listening connection, idle
/// between notifications, and the data connection if shorter than its sweep.
fn idle_session_timeout(s: &Settings) -> (&'static str, Status, String) {
    const CHECK: &str = "idle_session_timeout";
    let Some(ms) = s.idle_session_timeout_ms else {
        return (CHECK, Status::Ok, "not in this server version".to_owned());
    };
    if ms <= 0 {
        return (CHECK, Status::Ok, "0 (off)".to_owned());
    }
    let timeout = Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let data = if timeout < DATA_IDLE {
        format!(
            " and its data connection, idle up to the sweep interval ({} by default),",
            human_duration(DATA_IDLE)
        )
    } else {
        String::new()
    };
    (
        CHECK,
        Status::Warn,
        format!(
            "{}: cuts a manager's listening connection, idle between notifications,{data} \
             every {}; it reconnects, but wake-ups sent meanwhile are missed and waiters wait \
             for their next retry; set it to 0 for distlock's role \
             (ALTER ROLE ... SET idle_session_timeout = 0)",
            human_duration(timeout),
            human_duration(timeout)
        ),
    )
}

/// `idle_in_transaction_session_timeout`: never reached by distlock, whose
/// every call is one autocommitted statement.
fn idle_in_transaction(s: &Settings) -> (&'static str, Status, String) {
    let detail = match s.idle_in_transaction_timeout_ms {
        None | Some(0) => "0 (off)".to_owned(),
        Some(ms) => format!(
            "{}: harmless to distlock, whose statements are single autocommitted calls, never \
             idle inside a transaction",
            human_duration(Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
        ),
    };
    ("idle_in_transaction_session_timeout", Status::Ok, detail)
}

/// `default_transaction_isolation`: distlock's functions need READ
/// COMMITTED, which its data sessions set for themselves as a startup
/// option when the role or database defaults to another level; a pooler
/// that drops startup options then makes `build()` fail.
fn isolation(s: &Settings) -> (&'static str, Status, String) {
    const CHECK: &str = "default_transaction_isolation";
    let level = &s.default_isolation;
    if level == "read committed" {
        return (CHECK, Status::Ok, level.clone());
    }
    (
        CHECK,
        Status::Warn,
        format!(
            "{level}: distlock's sessions set read committed for themselves (its functions \
             need it: under {level} contention fails with serialization errors) as a startup \
             option, which a pooler may drop, and then build() fails; set it for distlock's \
             role (ALTER ROLE ... SET default_transaction_isolation = 'read committed')"
        ),
    )
}

/// `default_transaction_read_only`: on (set by an operator, or by a managed
/// service whose storage is nearly full), every lock call fails with
/// "cannot execute ... in a read-only transaction". distlock does not
/// override it (it may be there to protect the server).
fn read_only(s: &Settings) -> (&'static str, Status, String) {
    const CHECK: &str = "default_transaction_read_only";
    if s.default_read_only == "off" {
        return (CHECK, Status::Ok, "off".to_owned());
    }
    (
        CHECK,
        Status::Fail,
        format!(
            "{}: every write distlock makes (each lock call) fails with \"cannot execute ... in \
             a read-only transaction\"; find who set it (ALTER DATABASE/ROLE ... SET, the \
             server's configuration, a managed service protecting a full disk)",
            s.default_read_only
        ),
    )
}

/// LISTEN through the URL: listens on a fresh channel, notifies it from
/// `notifier` (another connection to the same URL), and waits for the
/// notification. Behind a transaction-mode pooler the session that listened
/// goes back to the pool, and the notification never arrives.
async fn listen(
    client: &Client,
    notifier: &Client,
    notifications: &mut mpsc::UnboundedReceiver<Notification>,
) -> (&'static str, Status, String) {
    const CHECK: &str = "listen";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let channel = format!("distlock_check_{}_{nanos}", std::process::id());
    let payload = "distlock check";
    let sent = async {
        tokio::time::timeout(TIMEOUT, client.batch_execute(&format!("LISTEN {channel}")))
            .await
            .map_err(|_| "LISTEN timed out".to_owned())?
            .map_err(|e| format!("LISTEN failed: {}", message(&e)))?;
        query(
            notifier,
            "SELECT pg_notify($1::text, $2::text)::text",
            &[&channel, &payload],
        )
        .await
        .map_err(|e| format!("NOTIFY failed: {e}"))
    }
    .await;
    if let Err(e) = sent {
        return (CHECK, Status::Warn, pooled_advice(&e));
    }
    let heard = tokio::time::timeout(TIMEOUT, async {
        while let Some(n) = notifications.recv().await {
            if n.channel() == channel && n.payload() == payload {
                return true;
            }
        }
        false
    })
    .await;
    let _ = query(client, &format!("UNLISTEN {channel}"), &[]).await;
    match heard {
        Ok(true) => (
            CHECK,
            Status::Ok,
            "works: a notification came back through this URL".to_owned(),
        ),
        Ok(false) => (
            CHECK,
            Status::Warn,
            pooled_advice("the connection closed before the notification came"),
        ),
        Err(_) => (
            CHECK,
            Status::Warn,
            pooled_advice(&format!(
                "no notification within {} of a NOTIFY from another session",
                human_duration(TIMEOUT)
            )),
        ),
    }
}

fn pooled_advice(what: &str) -> String {
    format!(
        "{what}: LISTEN does not work through this URL (a transaction-mode pooler such as \
         PgBouncer's?); waiters then learn of releases only at their retries, later than a \
         hand-off would tell them: give managers a direct connection to the server"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            version_num: 150_008,
            version: "15.8".to_owned(),
            in_recovery: false,
            role: "app".to_owned(),
            database: "db".to_owned(),
            synchronous_commit: "on".to_owned(),
            synchronous_standby_names: String::new(),
            replicas: 0,
            in_sync: 0,
            hidden: 0,
            idle_session_timeout_ms: Some(0),
            idle_in_transaction_timeout_ms: Some(0),
            may_create: false,
            default_isolation: "read committed".to_owned(),
            default_read_only: "off".to_owned(),
        }
    }

    #[test]
    fn versions_and_standbys_are_graded() {
        let status = |num, recovery| {
            version(&Settings {
                version_num: num,
                in_recovery: recovery,
                ..settings()
            })
            .1
        };
        assert_eq!(status(90_424, false), Status::Fail);
        assert_eq!(status(100_023, false), Status::Warn);
        assert_eq!(status(110_022, false), Status::Warn);
        assert_eq!(status(150_008, false), Status::Ok);
        assert_eq!(status(150_008, true), Status::Fail);
    }

    #[test]
    fn durability_settings_are_graded() {
        let commit = |value: &str| {
            synchronous_commit(&Settings {
                synchronous_commit: value.to_owned(),
                ..settings()
            })
            .1
        };
        assert_eq!(commit("off"), Status::Warn);
        assert_eq!(commit("on"), Status::Ok);
        let standby = |names: &str, replicas, commit: &str| {
            standbys(&Settings {
                synchronous_standby_names: names.to_owned(),
                replicas,
                synchronous_commit: commit.to_owned(),
                ..settings()
            })
            .1
        };
        assert_eq!(standby("", 0, "on"), Status::Ok);
        assert_eq!(standby("", 2, "on"), Status::Warn);
        assert_eq!(standby("FIRST 1 (s1, s2)", 2, "local"), Status::Warn);
        let in_sync = |in_sync, hidden| {
            standbys(&Settings {
                synchronous_standby_names: "FIRST 1 (s1, s2)".to_owned(),
                replicas: 2,
                in_sync,
                hidden,
                ..settings()
            })
            .1
        };
        assert_eq!(in_sync(1, 0), Status::Ok);
        // Named, streaming, none in sync: every commit would wait.
        assert_eq!(in_sync(0, 0), Status::Fail);
        // A role without pg_monitor cannot tell.
        assert_eq!(in_sync(0, 2), Status::Warn);
    }

    #[test]
    fn an_idle_session_timeout_warns_and_names_the_data_connection_when_short() {
        let idle = |ms| {
            idle_session_timeout(&Settings {
                idle_session_timeout_ms: ms,
                ..settings()
            })
        };
        assert_eq!(idle(None).1, Status::Ok);
        assert_eq!(idle(Some(0)).1, Status::Ok);
        let (_, status, detail) = idle(Some(60_000));
        assert_eq!(status, Status::Warn);
        assert!(!detail.contains("data connection"), "{detail}");
        let (_, status, detail) = idle(Some(5_000));
        assert_eq!(status, Status::Warn);
        assert!(detail.contains("data connection"), "{detail}");
    }

    #[test]
    fn the_expected_objects_are_read_from_the_schema_sql() {
        let sql = distlock::postgres_schema_sql("locks_x").unwrap();
        let objects = schema_objects(&sql, "locks_x");
        for object in [
            ("table", "locks"),
            ("table", "waiters"),
            ("table", "version"),
            ("sequence", "fencing"),
            ("function", "acquire"),
            ("function", "release"),
        ] {
            assert!(
                objects.contains(&(object.0, object.1.to_owned())),
                "{object:?} not in {objects:?}"
            );
        }
    }

    #[test]
    fn passwords_in_postgres_urls_are_hidden() {
        assert_eq!(
            shown("postgres://u:pw@h:5/db?password=pw2&sslmode=disable"),
            "postgres://***@h:5/db?password=***&sslmode=disable"
        );
    }
}
