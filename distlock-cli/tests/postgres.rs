//! The `distlock` binary against private PostgreSQL servers, with locks held
//! by a `LockManager` in the test: `list`, `inspect`, `unlock`, `watch`,
//! `schema` and `check` on a `postgres://` URL.
#![cfg(feature = "postgres")]

use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use distlock::{LockError, LockGuard, LockManager};
use distlock_testing::{PgBouncer, PostgresServer, Replication};
use predicates::prelude::*;
use serde_json::Value;

/// The binary, with no URL from the environment.
fn distlock() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_distlock"));
    for name in ["DISTLOCK_URL", "DISTLOCK_REDIS_URL", "REDIS_URL"] {
        cmd.env_remove(name);
    }
    cmd
}

/// Runs the binary off the runtime's threads, so that the test's manager keeps
/// renewing meanwhile.
async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("run distlock"))
        .await
        .unwrap()
}

/// `distlock ARGS` against `url`.
async fn cli(url: &str, args: &[&str]) -> Output {
    let mut cmd = distlock();
    cmd.args(["--url", url]).args(args);
    run(cmd).await
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(output)))
}

/// The server's URL for another role (the server trusts every local role).
fn url_as(pg: &PostgresServer, role: &str) -> String {
    pg.url().replacen("postgres@", &format!("{role}@"), 1)
}

/// Runs `sql` as a DBA would, `psql -f` on a file (here its standard input),
/// in `database`, stopping at the first error; panics with psql's output if
/// anything fails.
fn psql_file(pg: &PostgresServer, database: &str, sql: &str) {
    use std::io::Write as _;
    let mut child = std::process::Command::new(psql_binary())
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
        ])
        .args(["-p", &pg.port().to_string(), "-d", database, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run psql");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "psql failed: {stderr}");
    // psql reports a failed statement on stderr (and ON_ERROR_STOP stops
    // there); notices of objects that already exist are not errors.
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

/// `psql`, where `PostgresServer` finds the server's binaries: `pg_config
/// --bindir`, else the newest `/usr/lib/postgresql/*/bin` (Debian's), else
/// `PATH`.
fn psql_binary() -> std::path::PathBuf {
    let from_pg_config = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|dirs| {
            dirs.filter_map(|d| d.ok())
                .filter_map(|d| d.file_name().to_str()?.parse::<u32>().ok())
                .max()
                .map(|v| std::path::PathBuf::from(format!("/usr/lib/postgresql/{v}/bin")))
        });
    from_pg_config
        .or(debian)
        .map(|bin| bin.join("psql"))
        .filter(|psql| psql.exists())
        .unwrap_or_else(|| "psql".into())
}

/// The `{check, status, detail}` of `check` named `name` in `check --json`'s output.
fn check_of<'a>(checks: &'a Value, name: &str) -> &'a Value {
    checks
        .as_array()
        .expect("an array of checks")
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {checks}"))
}

/// A hold with its fencing token taken at acquisition, so the CLI shows it.
async fn hold(manager: &LockManager, key: &str, lease: Duration) -> LockGuard {
    manager
        .lock(key)
        .lease(lease)
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_held_lock_is_listed_inspected_and_force_unlocked() {
    let pg = PostgresServer::start().unwrap();
    let url = pg.url();
    // Its build creates the schema the CLI reads.
    let manager = LockManager::builder(&url)
        .holder("test-holder")
        .build()
        .await
        .unwrap();

    let empty = cli(&url, &["list"]).await;
    assert!(empty.status.success(), "{}", stderr(&empty));
    assert_eq!(stdout(&empty), "no locks held under prefix distlock:\n");

    let lease = Duration::from_secs(3);
    let guard = hold(&manager, "order:42", lease).await;
    let token = guard.issued_fencing_token().expect("eager fencing");

    let table = cli(&url, &["list"]).await;
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    let row = text
        .lines()
        .find(|line| line.starts_with("order:42 "))
        .unwrap_or_else(|| panic!("no row for order:42 in {text}"));
    assert!(row.contains("test-holder"), "{row}");
    assert!(row.contains(&format!(" {token} ")), "{row}");

    let listed = json(&cli(&url, &["--json", "list", "order:*"]).await);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["key"], "order:42");
    assert_eq!(listed[0]["fencing_token"], token);
    let none = json(&cli(&url, &["--json", "list", "report:*"]).await);
    assert_eq!(none, serde_json::json!([]));

    let inspected = cli(&url, &["inspect", "order:42"]).await;
    assert!(inspected.status.success(), "{}", stderr(&inspected));
    assert!(
        stdout(&inspected).contains("test-holder"),
        "{}",
        stdout(&inspected)
    );
    distlock()
        .args(["--url", &url, "inspect", "order:43"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("order:43 is not locked"));

    let watched = cli(&url, &["watch", "--once"]).await;
    assert!(watched.status.success(), "{}", stderr(&watched));
    assert!(
        stdout(&watched).contains("order:42"),
        "{}",
        stdout(&watched)
    );

    // Without --yes: refused (2), and the lock is still held.
    let refused = cli(&url, &["unlock", "order:42"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("--yes"), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("test-holder"),
        "{}",
        stderr(&refused)
    );
    assert!(manager.is_locked("order:42").await.unwrap());
    assert!(!guard.is_lost());

    let freed = cli(&url, &["unlock", "order:42", "--yes"]).await;
    assert!(freed.status.success(), "{}", stderr(&freed));
    assert!(
        stdout(&freed).contains("force-unlocked order:42"),
        "{}",
        stdout(&freed)
    );
    assert!(!manager.is_locked("order:42").await.unwrap());
    // The holder learns it at its next renewal, a third of its lease after
    // the last one: within the lease.
    tokio::time::timeout(lease, guard.lost())
        .await
        .expect("the guard reports its lease lost");

    // The next holder's token is larger: the force-unlock did not reset it.
    let next = hold(&manager, "order:42", lease).await;
    assert!(next.issued_fencing_token().unwrap() > token);
    next.release().await.unwrap();

    let again = json(&cli(&url, &["--json", "unlock", "order:42", "--yes"]).await);
    assert_eq!(
        again,
        serde_json::json!({"key": "order:42", "was_held": false, "freed": 0})
    );
}

/// Read-write locks and semaphores on PostgreSQL: `list` shows each reader
/// and a weighted semaphore hold, `inspect` a waiting writer, `unlock --hold`
/// frees one reader, `unlock` a whole key (its semaphore holder; the waiting
/// writer then takes the read-write lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_read_write_locks_and_semaphores_are_listed_inspected_and_freed() {
    let pg = PostgresServer::start().unwrap();
    let url = pg.url();
    let manager = LockManager::builder(&url)
        .holder("test-holder")
        .build()
        .await
        .unwrap();
    let reader_a = manager.read_lock("doc").acquire().await.unwrap();
    let reader_b = manager.read_lock("doc").acquire().await.unwrap();
    let permits = manager
        .semaphore("pool", 4)
        .weight(3)
        .acquire()
        .await
        .unwrap();

    let table = cli(&url, &["list"]).await;
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    let rows: Vec<(&str, &str)> = text
        .lines()
        .skip(1)
        .map(|line| {
            let mut cells = line.split_whitespace();
            (cells.next().unwrap(), cells.next().unwrap())
        })
        .collect();
    assert_eq!(
        rows,
        [("doc", "read"), ("doc", "read"), ("pool", "3")],
        "{text}"
    );

    // A writer waits for the readers: `inspect` shows it.
    let writer = tokio::spawn({
        let manager = manager.clone();
        async move {
            manager
                .write_lock("doc")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap()
        }
    });
    let mut waiting = false;
    for _ in 0..400 {
        if manager.inspect_all("doc").await.unwrap().writer_waiting {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(waiting, "the writer waits");
    let state = json(&cli(&url, &["--json", "inspect", "doc"]).await);
    assert_eq!(state["writer_waiting"], true, "{state}");
    assert_eq!(state["holds"].as_array().map(Vec::len), Some(2), "{state}");

    // One reader of two, by its hold id.
    let first = state["holds"][0]["hold_id"].as_str().unwrap().to_owned();
    let refused = cli(&url, &["unlock", "doc", "--hold", &first]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("read by test-holder"),
        "{}",
        stderr(&refused)
    );
    let freed = json(
        &cli(
            &url,
            &["--json", "unlock", "doc", "--hold", &first, "--yes"],
        )
        .await,
    );
    assert_eq!(
        freed,
        serde_json::json!({"key": "doc", "was_held": true, "freed": 1})
    );
    let left = manager.inspect_all("doc").await.unwrap();
    assert_eq!(left.holds.len(), 1);
    assert_ne!(left.holds[0].hold_id, first);

    // The whole key of the semaphore.
    let out = cli(&url, &["unlock", "pool", "--yes"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("force-unlocked pool (3 permits by test-holder"),
        "{}",
        stdout(&out)
    );
    assert!(!manager.semaphore("pool", 4).is_locked().await.unwrap());

    // The other reader's key: freed, the waiting writer takes the lock.
    let out = cli(&url, &["unlock", "doc", "--yes"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let w = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer gets the lock")
        .unwrap();
    let state = json(&cli(&url, &["--json", "inspect", "doc"]).await);
    assert_eq!(state["holds"][0]["kind"], "write", "{state}");
    w.release().await.unwrap();
    drop((reader_a, reader_b, permits));
}

/// A leader's term is an ordinary lock (`leader:<name>`, its fencing token
/// the epoch): `list`, `inspect` and `watch --once` show it like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_leaders_lock_is_listed_inspected_and_watched() {
    let pg = PostgresServer::start().unwrap();
    let url = pg.url();
    let manager = LockManager::builder(&url)
        .holder("scheduler-1")
        .build()
        .await
        .unwrap();
    let term = manager.leader("scheduler").campaign().await.unwrap();
    let epoch = term.epoch();

    let listed = json(&cli(&url, &["--json", "list", "leader:*"]).await);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["key"], "leader:scheduler");
    assert_eq!(listed[0]["fencing_token"], epoch);

    let inspected = cli(&url, &["inspect", "leader:scheduler"]).await;
    assert!(inspected.status.success(), "{}", stderr(&inspected));
    let text = stdout(&inspected);
    assert!(text.contains("scheduler-1"), "{text}");
    assert!(text.contains(&epoch.to_string()), "{text}");

    let watched = cli(&url, &["watch", "--once"]).await;
    assert!(watched.status.success(), "{}", stderr(&watched));
    assert!(
        stdout(&watched).contains("leader:scheduler"),
        "{}",
        stdout(&watched)
    );

    term.resign().await.unwrap();
    let gone = json(&cli(&url, &["--json", "list", "leader:*"]).await);
    assert_eq!(gone, serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_url_comes_from_distlock_url_before_redis_url() {
    let pg = PostgresServer::start().unwrap();
    let manager = LockManager::builder(&pg.url()).build().await.unwrap();
    let _guard = hold(&manager, "env:key", Duration::from_secs(30)).await;

    let mut cmd = distlock();
    cmd.env("DISTLOCK_URL", pg.url())
        // Nothing listens there: used, it would fail.
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .args(["list"]);
    let out = run(cmd).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("env:key"), "{}", stdout(&out));
}

/// The counting semaphore on PostgreSQL: `permits` reads and changes it,
/// `inspect` and `list` show it; `--cluster` is a usage error there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_counting_semaphores_are_shown_and_changed_and_cluster_is_a_usage_error() {
    let pg = PostgresServer::start().unwrap();
    let url = pg.url();
    let manager = LockManager::builder(&url).build().await.unwrap();
    let uploads = manager.counting_semaphore("uploads");

    let missing = cli(&url, &["permits", "uploads"]).await;
    assert_eq!(missing.status.code(), Some(1), "{}", stdout(&missing));
    assert!(stderr(&missing).contains("not a counting semaphore"));

    // Three permits, two of them taken by a process that then crashed.
    assert!(uploads.try_set_permits(3).await.unwrap());
    assert!(uploads.try_acquire(2).await.unwrap());
    let read = cli(&url, &["permits", "uploads"]).await;
    assert!(read.status.success(), "{}", stderr(&read));
    assert_eq!(
        stdout(&read),
        "counting semaphore uploads: 1 available, 0 waiting\n"
    );
    let inspected = json(&cli(&url, &["--json", "inspect", "uploads"]).await);
    assert_eq!(inspected["counting_permits"], 1);
    assert_eq!(inspected["holds"], serde_json::json!([]));
    let listed = stdout(&cli(&url, &["list"]).await);
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["uploads", "1", "0"]),
        "{listed}"
    );
    let added = cli(&url, &["permits", "uploads", "--add", "2", "--yes"]).await;
    assert!(added.status.success(), "{}", stderr(&added));
    assert_eq!(uploads.available_permits().await.unwrap(), 3);

    let cluster = cli(&url, &["--cluster", "list"]).await;
    assert_eq!(cluster.status.code(), Some(2));
    assert!(
        stderr(&cluster).contains("--cluster"),
        "{}",
        stderr(&cluster)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_cli_does_not_create_the_schema_and_names_the_way_to() {
    let pg = PostgresServer::start().unwrap();
    let out = cli(&pg.url(), &["list"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("distlock schema"), "{}", stderr(&out));
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'distlock'")
            .unwrap(),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_schema_prints_sql_that_psql_applies_and_a_non_creating_manager_accepts() {
    // Offline: no URL, no server.
    let printed = distlock()
        .args([
            "--url",
            "postgres://nobody@127.0.0.1:1/none",
            "schema",
            "--schema",
            "app_locks",
        ])
        .output()
        .unwrap();
    assert!(printed.status.success(), "{}", stderr(&printed));
    let sql = stdout(&printed);
    assert!(
        sql.contains("CREATE SCHEMA IF NOT EXISTS app_locks;"),
        "{sql}"
    );
    distlock()
        .args(["schema", "--schema", "App-Locks"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("schema name"));

    let pg = PostgresServer::start().unwrap();
    pg.psql("CREATE DATABASE fresh").unwrap();
    let url = pg.url().replacen("/postgres?", "/fresh?", 1);
    let builder = || {
        LockManager::builder(&url)
            .postgres_schema("app_locks")
            .create_postgres_schema(false)
    };
    // Before the DBA runs it, such a manager refuses to start.
    match builder().build().await {
        Err(LockError::ServerCheck { reason, .. }) => {
            assert!(reason.contains("distlock schema"), "{reason}")
        }
        other => panic!("expected a ServerCheck error, got {:?}", other.map(drop)),
    }
    psql_file(&pg, "fresh", &sql);
    // Run twice, as a DBA might: it is idempotent.
    psql_file(&pg, "fresh", &sql);
    assert_eq!(
        pg.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'app_locks'")
            .unwrap(),
        "0",
        "applied to the fresh database, not to postgres"
    );

    let manager = builder().build().await.unwrap();
    let guard = hold(&manager, "dba:made", Duration::from_secs(30)).await;
    let listed = json(&cli(&url, &["--schema", "app_locks", "--json", "list"]).await);
    assert_eq!(listed[0]["key"], "dba:made", "{listed}");
    guard.release().await.unwrap();

    let checked = cli(&url, &["--schema", "app_locks", "--json", "check"]).await;
    assert!(checked.status.success(), "{}", stdout(&checked));
    assert_eq!(check_of(&json(&checked), "schema")["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_check_connects_over_tls_as_a_manager_does() {
    // `ssl = on` and `hostssl` lines only: a connection without TLS is refused.
    let pg = PostgresServer::builder().tls(true).start().unwrap();
    let url = format!("{}&sslmode=require", pg.url());
    let ca = pg.ca_cert_path().expect("a TLS server's CA").to_owned();
    let _manager = LockManager::builder(&url)
        .tls_ca_pem(pg.ca_cert_pem().unwrap().to_vec())
        .build()
        .await
        .unwrap();
    let out = cli(&url, &["--tls-ca", ca.to_str().unwrap(), "check"]).await;
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    for line in ["ok    schema: distlock, version 6", "ok    listen: works"] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    // Without the CA, the private CA's certificate is not trusted (the
    // server's certificate is verified, as a manager verifies it).
    let out = cli(&url, &["check"]).await;
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).contains("cannot connect"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_check_passes_on_a_good_server_and_fails_for_a_role_without_privileges() {
    let pg = PostgresServer::start().unwrap();
    let url = pg.url();
    let _manager = LockManager::builder(&url).build().await.unwrap();

    let out = cli(&url, &["check"]).await;
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    for line in [
        "ok    version: PostgreSQL ",
        "ok    schema: distlock, version 6",
        "ok    privileges: postgres has usage on distlock",
        "ok    synchronous_commit: on",
        "ok    default_transaction_isolation: read committed",
        "ok    default_transaction_read_only: off",
        "ok    listen: works",
    ] {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    let checks = json(&cli(&url, &["--json", "check"]).await);
    assert!(
        checks
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["status"] != "fail"),
        "{checks}"
    );
    assert_eq!(check_of(&checks, "listen")["status"], "ok");

    pg.psql("CREATE ROLE app LOGIN").unwrap();
    let app = url_as(&pg, "app");
    let out = cli(&app, &["check"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("fail  privileges: app lacks USAGE on schema distlock"),
        "{text}"
    );
    assert!(
        text.contains("SELECT, INSERT, UPDATE, DELETE on table distlock.locks"),
        "{text}"
    );
    assert!(
        text.contains("USAGE on sequence distlock.fencing"),
        "{text}"
    );

    // A missing schema the role may not create is a failure too.
    let out = cli(&app, &["--schema", "elsewhere", "--json", "check"]).await;
    assert_eq!(out.status.code(), Some(1));
    let schema = check_of(&json(&out), "schema").clone();
    assert_eq!(schema["status"], "fail", "{schema}");
    assert!(
        schema["detail"]
            .as_str()
            .unwrap()
            .contains("distlock schema"),
        "{schema}"
    );

    // The grants the failure names are enough: check passes, and so does a
    // manager as that role.
    pg.psql(
        "GRANT USAGE ON SCHEMA distlock TO app; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA distlock TO app; \
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA distlock TO app; \
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA distlock TO app",
    )
    .unwrap();
    let out = cli(&app, &["check"]).await;
    assert!(out.status.success(), "{}", stdout(&out));
    let manager = LockManager::builder(&app)
        .create_postgres_schema(false)
        .build()
        .await
        .unwrap();
    hold(&manager, "granted", Duration::from_secs(30))
        .await
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_check_warns_about_durability_idle_timeouts_and_isolation() {
    let pg = PostgresServer::start().unwrap();
    let url = pg.url();
    let _manager = LockManager::builder(&url).build().await.unwrap();
    pg.psql(
        "CREATE ROLE loose LOGIN SUPERUSER; \
         ALTER ROLE loose SET synchronous_commit = off; \
         ALTER ROLE loose SET idle_session_timeout = '5s'; \
         ALTER ROLE loose SET default_transaction_isolation = 'serializable'",
    )
    .unwrap();
    let out = cli(&url_as(&pg, "loose"), &["--json", "check"]).await;
    // Warnings, not failures.
    assert!(out.status.success(), "{}", stdout(&out));
    let checks = json(&out);
    let commit = check_of(&checks, "synchronous_commit");
    assert_eq!(commit["status"], "warn", "{commit}");
    let idle = check_of(&checks, "idle_session_timeout");
    assert_eq!(idle["status"], "warn", "{idle}");
    assert!(
        idle["detail"]
            .as_str()
            .unwrap()
            .contains("listening connection"),
        "{idle}"
    );
    let isolation = check_of(&checks, "default_transaction_isolation");
    assert_eq!(isolation["status"], "warn", "{isolation}");
    assert!(
        isolation["detail"]
            .as_str()
            .unwrap()
            .starts_with("serializable: distlock's sessions set read committed for themselves (its functions need it"),
        "{isolation}"
    );
}

/// A database whose transactions are read-only by default (an operator's
/// `ALTER DATABASE`, a managed service protecting a full disk) fails the
/// check: every lock call would fail there. Before, the check passed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_check_fails_a_database_that_is_read_only_by_default() {
    let pg = PostgresServer::start().unwrap();
    let url = pg.url();
    let _manager = LockManager::builder(&url).build().await.unwrap();
    pg.psql("CREATE ROLE frozen LOGIN SUPERUSER; ALTER ROLE frozen SET default_transaction_read_only = on")
        .unwrap();
    let out = cli(&url_as(&pg, "frozen"), &["--json", "check"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let checks = json(&out);
    let read_only = check_of(&checks, "default_transaction_read_only");
    assert_eq!(read_only["status"], "fail", "{read_only}");
    assert!(
        read_only["detail"].as_str().unwrap().starts_with("on: "),
        "{read_only}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_check_reports_standbys_in_sync_and_asynchronous_ones() {
    let primary = PostgresServer::start().unwrap();
    let synchronous = primary.start_standby(Replication::Synchronous).unwrap();
    let _manager = LockManager::builder(&primary.url()).build().await.unwrap();
    let status_of = async |url: &str| {
        let out = cli(url, &["--json", "check"]).await;
        let check = check_of(&json(&out), "synchronous standbys").clone();
        (out.status.success(), check)
    };
    let (passed, check) = status_of(&primary.url()).await;
    assert!(passed, "{check}");
    assert_eq!(check["status"], "ok", "{check}");
    assert!(
        check["detail"].as_str().unwrap().contains("1 of 1"),
        "{check}"
    );

    // The named standby is gone: every commit would wait, a failure.
    synchronous.stop_immediate().unwrap();
    let (passed, check) = status_of(&primary.url()).await;
    assert!(!passed, "{check}");
    assert_eq!(check["status"], "fail", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains("no standby is in sync"),
        "{check}"
    );

    // An asynchronous standby only: a failover can lose grants, a warning.
    let other = PostgresServer::start().unwrap();
    let _asynchronous = other.start_standby(Replication::Asynchronous).unwrap();
    let _manager = LockManager::builder(&other.url()).build().await.unwrap();
    let (passed, check) = status_of(&other.url()).await;
    assert!(passed, "{check}");
    assert_eq!(check["status"], "warn", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains("asynchronous standby"),
        "{check}"
    );
}

#[test]
fn an_unreachable_postgres_url_fails_fast_without_the_password() {
    // Nothing listens on port 1: refused at once. The bound is the CLI's
    // 2 s connect timeout plus start-up, with room for a loaded machine.
    let url = "postgresql://app:secret@127.0.0.1:1/app";
    for args in [&["list"][..], &["check"][..]] {
        let started = std::time::Instant::now();
        let out = distlock().args(["--url", url]).args(args).output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let said = format!("{}{}", stdout(&out), stderr(&out));
        assert!(!said.contains("secret"), "{said}");
        assert!(said.contains("127.0.0.1:1"), "{said}");
    }
    let check = distlock().args(["--url", url, "check"]).output().unwrap();
    assert!(
        stdout(&check).starts_with("fail  connect: cannot connect to PostgreSQL at"),
        "{}",
        stdout(&check)
    );
}

/// Through a transaction-mode pooler, LISTEN is accepted and even a session's
/// notification to itself comes back (before its transaction ends), but
/// nothing another session notifies does: `check` must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_check_warns_that_listen_does_not_pass_a_transaction_mode_pooler() {
    let pg = PostgresServer::start().unwrap();
    let _manager = LockManager::builder(&pg.url()).build().await.unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let checks = json(&cli(&pooler.url(), &["--json", "check"]).await);
    assert_eq!(check_of(&checks, "listen")["status"], "warn", "{checks}");
    let checks = json(&cli(&pg.url(), &["--json", "check"]).await);
    assert_eq!(check_of(&checks, "listen")["status"], "ok", "{checks}");
}
