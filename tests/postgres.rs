//! The default lock on PostgreSQL (`postgres://` URLs, the `postgres`
//! feature): the same contract as on Redis, on a private server per test
//! (`distlock_testing::PostgresServer`, a free loopback port).
//!
//! Run with `cargo test -p distlock --features postgres --test postgres`.

mod common;

use std::time::{Duration, Instant};

use common::{a_session_waits, count, eventually, queued, sql_client};

use distlock::{LockError, LockManager};
use distlock_testing::{FaultMode, FaultProxy, PostgresServer};
use tokio_postgres::Client;

fn server() -> PostgresServer {
    PostgresServer::start().expect("a private PostgreSQL (initdb, pg_ctl)")
}

async fn manager(pg: &PostgresServer) -> LockManager {
    LockManager::builder(&pg.url())
        .build()
        .await
        .expect("a manager on PostgreSQL")
}

/// Waits (up to 10 s) until `n` acquisitions are queued.
async fn await_queued(db: &Client, n: i64) {
    assert!(
        eventually(Duration::from_secs(10), async || queued(db).await == n)
            .await
            .is_some(),
        "{n} acquisitions never queued"
    );
}

/// A task of `m` that waits (up to 30 s) for `key` and gives its hold back.
fn spawn_waiter(
    m: &LockManager,
    key: &'static str,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let m = m.clone();
    tokio::spawn(async move {
        m.lock(key)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .map(drop)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fencing_tokens_grow_across_deletion_and_restart() {
    let mut pg = server();
    let m = manager(&pg).await;
    let mut last = 0;
    for _ in 0..3 {
        let guard = m.lock("fenced").acquire().await.unwrap();
        let token = guard.fencing_token().await.unwrap();
        assert!(token > last, "token {token} after {last}");
        // Asking again reads the same token.
        assert_eq!(guard.fencing_token().await.unwrap(), token);
        last = token;
        guard.release().await.unwrap();
    }
    // Eager fencing: the token comes with the grant.
    let guard = m
        .lock("fenced")
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap();
    let eager = guard.issued_fencing_token().expect("an eager token");
    assert!(eager > last);
    last = eager;
    guard.release().await.unwrap();
    drop(m);

    pg.restart_immediate().expect("restart -m immediate");
    let m = manager(&pg).await;
    let guard = m.lock("fenced").acquire().await.unwrap();
    let token = guard.fencing_token().await.unwrap();
    assert!(
        token > last,
        "after a crash restart, token {token} after {last}"
    );
}

/// A manager on `url` with no sweep for an hour (so that no sweep statement
/// falls between a test's counts, nor commits while a test holds commits
/// up), `command_timeout` if given, after one warm-up cycle (its first
/// statements, the schema check, the listener and its probe).
async fn quiet_manager(url: &str, command_timeout: Option<Duration>) -> LockManager {
    let mut builder = LockManager::builder(url).postgres_sweep_interval(Duration::from_secs(3600));
    if let Some(timeout) = command_timeout {
        builder = builder.command_timeout(timeout);
    }
    let m = builder.build().await.unwrap();
    m.lock("warm")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_uncontended_cycle_is_two_statements() {
    let pg = PostgresServer::builder()
        .setting("log_statement", "all")
        .start()
        .unwrap();
    let m = quiet_manager(&pg.url(), None).await;
    let statements = || common::distlock_statements_logged(&pg, "");
    let before = statements();
    let guard = m.lock("cycle").acquire().await.unwrap();
    guard.release().await.unwrap();
    // The log is written by the server process before it answers, so both
    // statements are in it once release() returned.
    let after = statements();
    assert_eq!(
        after - before,
        2,
        "statements of one acquire + release cycle"
    );
}

/// With `postgres_prepared_statements`, each statement is prepared once per
/// data connection and executed by name after that (no unnamed statement,
/// parsed and planned with each call); a new connection prepares them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_prepared_statements_are_prepared_once_per_connection() {
    let pg = PostgresServer::builder()
        .setting("log_statement", "all")
        .start()
        .unwrap();
    let m = LockManager::builder(&pg.url())
        .postgres_sweep_interval(Duration::from_secs(3600))
        .postgres_prepared_statements(true)
        .build()
        .await
        .unwrap();
    let cycle = |key: &'static str| {
        let m = m.clone();
        async move {
            let guard = m.lock(key).acquire().await.unwrap();
            assert!(guard.fencing_token().await.unwrap() > 0);
            guard.release().await.unwrap();
        }
    };
    cycle("warm").await;
    // The server logs each execution before it answers: "execute s<n>: ..."
    // for a named statement, "execute <unnamed>: ..." for an unnamed one.
    let executions = |named: bool| {
        let marker = if named {
            "execute s"
        } else {
            "execute <unnamed>"
        };
        std::fs::read_to_string(pg.log_path())
            .unwrap()
            .lines()
            .filter(|l| l.contains(marker) && l.contains("distlock."))
            .count()
    };
    let (named, unnamed) = (executions(true), executions(false));
    for _ in 0..3 {
        cycle("prepared").await;
    }
    // acquire, issue_token and release, three times, all by name.
    assert_eq!(executions(true) - named, 9);
    assert_eq!(
        executions(false),
        unnamed,
        "no unnamed statement of distlock's"
    );

    // A new data connection has none of them: it prepares them again.
    assert!(pg.kill_backends_named("distlock").unwrap() >= 1);
    let again = eventually(Duration::from_secs(10), async || {
        m.lock("after-kill")
            .try_acquire()
            .await
            .is_ok_and(|g| g.is_some())
    })
    .await;
    assert!(
        again.is_some(),
        "the manager reconnected and prepared again"
    );
    cycle("after-reconnect").await;
    assert_eq!(
        executions(false),
        unnamed,
        "no unnamed statement of distlock's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_renewing_many_leases_is_one_statement_per_batch() {
    let pg = server();
    let m = LockManager::builder(&pg.url())
        .default_lease(Duration::from_millis(600))
        .build()
        .await
        .unwrap();
    let acquires = (0..50).map(|i| {
        let m = m.clone();
        async move { m.lock(format!("many:{i}")).acquire().await.unwrap() }
    });
    let guards = futures_util::future::join_all(acquires).await;
    let trips_before = m.renewal_round_trips();
    let ticks_before = m.renewal_task_wakeups();
    m.take_renewal_batches();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        assert!(guards.iter().all(|g| !g.is_lost()), "a lease was lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let trips = m.renewal_round_trips() - trips_before;
    let ticks = m.renewal_task_wakeups() - ticks_before;
    let batches = m.take_renewal_batches();
    // The bench's view of the same batches: one entry per statement, each of
    // the leases it renewed (all 50 or a part of them when they fell due in
    // groups). A batch's round trip is counted when it is sent and its time
    // recorded when it is done, so one batch may sit astride each end of
    // the window: +-1.
    assert!(
        batches.len().abs_diff(usize::try_from(trips).unwrap()) <= 1,
        "{} batches timed for {trips} renewal round trips",
        batches.len()
    );
    assert!(
        batches.iter().all(|(leases, _)| (1..=50).contains(leases)),
        "batch sizes {batches:?}"
    );
    // A tick every lease / 3 = 200 ms: about 10 in 2 s. Each tick renews
    // every lease due in one statement, so round trips never exceed ticks;
    // one statement per lease would be about 50 per tick. (+1: a tick in
    // flight at the window's start counts its wake-up before the window and
    // its round trip inside it.)
    assert!(trips >= 4, "{trips} renewal round trips in 2 s");
    assert!(trips <= ticks + 1, "{trips} round trips in {ticks} ticks");
    for g in &guards {
        assert!(!g.is_lost(), "a renewed lease was lost");
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A renewal batch finds each lease by its key (an index probe), never by
/// scanning the table, even when the table's statistics are stale. Here they
/// say a few rows over hundreds of pages, what autovacuum leaves when it
/// analyzes a table most locks have left, before thousands come: the former
/// renewal, one `UPDATE` joined with the batch, then scanned the whole table
/// once per lease (0.8 s for 512 leases among 10,000 locks, which lost
/// leases in the benchmark). For both tables: `renew` (the default lock's)
/// and `shared_renew` (read-write locks' and semaphores'). The scans are
/// counted in the transaction's own statistics, which do not drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_renewal_batch_reads_its_leases_by_key_whatever_the_statistics() {
    let pg = server();
    // Creates the schema; nothing is held, so its sweep deletes nothing here.
    let m = manager(&pg).await;
    let mut db = sql_client(&pg.url()).await;
    for (table, renew, columns, values) in [
        (
            "locks",
            "renew",
            "name, owner, token, expires_at, since_ms, holder, handoff",
            "0, clock_timestamp() + interval '1 hour', 0, 'h', ''",
        ),
        (
            "shared_holds",
            "shared_renew",
            "name, owner, kind, token, expires_at, since_ms, holder",
            "'r', 0, clock_timestamp() + interval '1 hour', 0, 'h'",
        ),
    ] {
        // 20,000 rows, then all but every 1000th deleted, analyzed: the
        // statistics say 20 rows, and the table keeps its pages.
        db.batch_execute(&format!(
            "INSERT INTO distlock.{table} ({columns}) \
               SELECT 'gone:' || g, 'x', {values} FROM generate_series(1, 20000) g; \
             DELETE FROM distlock.{table} WHERE substr(name, 6)::int % 1000 <> 0"
        ))
        .await
        .unwrap();
        db.batch_execute(&format!("VACUUM ANALYZE distlock.{table}"))
            .await
            .unwrap();
        let stats = db
            .query_one(
                "SELECT relpages::bigint, reltuples::float8 FROM pg_class \
                 WHERE oid = $1::text::regclass",
                &[&format!("distlock.{table}")],
            )
            .await
            .unwrap();
        let (pages, tuples): (i64, f64) = (stats.get(0), stats.get(1));
        assert!(
            pages >= 100 && tuples <= 100.0,
            "{table}: statistics of {tuples} rows in {pages} pages"
        );
        // 5,000 holds the statistics do not know of; a batch renews 512.
        db.batch_execute(&format!(
            "INSERT INTO distlock.{table} ({columns}) \
               SELECT 'held:' || g, 'owner', {values} FROM generate_series(1, 5000) g"
        ))
        .await
        .unwrap();
        let names: Vec<String> = (1..=512).map(|g| format!("held:{g}")).collect();
        let owners = vec!["owner".to_owned(); names.len()];
        let leases = vec![60_000_i64; names.len()];
        let tx = db.transaction().await.unwrap();
        // The counts not yet flushed (the setup's) are shown with the
        // transaction's, and nothing is flushed inside it: the difference.
        let scans_sql = "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables \
                         WHERE relid = $1::text::regclass";
        let relation = format!("distlock.{table}");
        let before = tx.query_one(scans_sql, &[&relation]).await.unwrap();
        // Past the five plans PL/pgSQL makes for the first calls, into the
        // generic one it keeps for the session.
        for call in 0..8 {
            let rows = tx
                .query(
                    &format!("SELECT i, renewed FROM distlock.{renew}($1, $2, $3)"),
                    &[&names, &owners, &leases],
                )
                .await
                .unwrap();
            let renewed: Vec<(i64, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            let expected: Vec<(i64, bool)> = (1..=512).map(|i| (i, true)).collect();
            assert_eq!(
                renewed, expected,
                "{renew}, call {call}: one row per lease, in order"
            );
        }
        let after = tx.query_one(scans_sql, &[&relation]).await.unwrap();
        let seq_scans = after.get::<_, i64>(0) - before.get::<_, i64>(0);
        let index_scans = after.get::<_, i64>(1) - before.get::<_, i64>(1);
        assert_eq!(
            seq_scans, 0,
            "{renew} scanned {table} ({index_scans} index scans)"
        );
        assert_eq!(index_scans, 8 * 512, "{renew}: one index probe per lease");
        tx.rollback().await.unwrap();
        // A lease another owner holds, or that is gone, is not renewed.
        let rows = db
            .query(
                &format!("SELECT i, renewed FROM distlock.{renew}($1, $2, $3)"),
                &[
                    &vec!["held:1", "held:2", "nowhere"],
                    &vec!["owner", "someone else", "owner"],
                    &vec![60_000_i64; 3],
                ],
            )
            .await
            .unwrap();
        let renewed: Vec<(i64, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(renewed, vec![(1, true), (2, false), (3, false)], "{renew}");
    }
    drop(m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_lease_taken_over_after_expiry_fires_the_lost_signal() {
    let pg = server();
    let m = manager(&pg).await;
    let db = sql_client(&pg.url()).await;
    let guard = m.lock("stolen").acquire().await.unwrap();
    // Another owner takes the row, as if our lease had run out unrenewed.
    db.execute(
        "UPDATE distlock.locks SET owner = 'someone-else' WHERE name LIKE '%:stolen'",
        &[],
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(30), guard.lost())
        .await
        .expect("the lost signal within a renewal period");
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_terminating_the_data_connection_while_holding_keeps_the_lease() {
    let pg = server();
    let m = LockManager::builder(&pg.url())
        .default_lease(Duration::from_millis(900))
        .build()
        .await
        .unwrap();
    let guard = m.lock("kept").acquire().await.unwrap();
    let before = m.renewal_round_trips();
    let pids = pg.backend_pids("distlock").unwrap();
    assert!(!pids.is_empty());
    for pid in pids {
        pg.kill_backend(pid).unwrap();
    }
    // Renewals every 300 ms go on over a new connection: wait for 4 of them
    // after the kill (the first may fail on the dead connection).
    assert!(eventually(Duration::from_secs(10), async || {
        m.renewal_round_trips() >= before + 4
    })
    .await
    .is_some());
    assert!(!guard.is_lost(), "the lease survived a terminated backend");
    assert!(m.is_locked("kept").await.unwrap());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_terminating_the_listening_connection_still_serves_the_waiter() {
    let pg = server();
    let m = manager(&pg).await;
    let other = manager(&pg).await;
    let db = sql_client(&pg.url()).await;
    let holder = m.lock("served").acquire().await.unwrap();
    let waiter = spawn_waiter(&other, "served");
    await_queued(&db, 1).await;
    for pid in pg.backend_pids("distlock-listen").unwrap() {
        pg.kill_backend(pid).unwrap();
    }
    holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter is served after the listener died")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_users_open_transaction_changes_no_grant() {
    let pg = server();
    let m = manager(&pg).await;
    let other = manager(&pg).await;
    let user = sql_client(&pg.url()).await;
    user.batch_execute(
        "CREATE TABLE accounts (id int PRIMARY KEY); INSERT INTO accounts VALUES (1)",
    )
    .await
    .unwrap();
    user.batch_execute("BEGIN; SELECT * FROM accounts WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    let guard = m.lock("tx").acquire().await.unwrap();
    assert!(other.lock("tx").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    assert!(other.lock("tx").try_acquire().await.unwrap().is_some());
    user.batch_execute("ROLLBACK").await.unwrap();
}

/// On a server whose default isolation is REPEATABLE READ, distlock's
/// sessions run at READ COMMITTED, which its functions are written for: a
/// release that waits for the key behind a session that updates the lock's
/// row (as a waiter's acquire does) succeeds once that commits. Before, the
/// release's snapshot, taken before the wait, predated the update, and it
/// failed with a serialization error (40001) in the holder's hands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sessions_run_at_read_committed_whatever_the_servers_default() {
    let pg = PostgresServer::builder()
        .setting("default_transaction_isolation", "repeatable read")
        .start()
        .unwrap();
    let m = manager(&pg).await;
    let guard = m.lock("iso").acquire().await.unwrap();
    let db = sql_client(&pg.url()).await;
    db.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await
        .unwrap();
    let name: String = db
        .query_one(
            "SELECT name FROM distlock.locks WHERE name LIKE '%:iso'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // The key's advisory lock and an update of its row, as an acquire of a
    // waiter takes and makes them, left uncommitted.
    db.execute(
        "SELECT pg_advisory_xact_lock(1684826880, hashtext($1))",
        &[&name],
    )
    .await
    .unwrap();
    db.execute(
        "UPDATE distlock.locks SET queued = true WHERE name = $1",
        &[&name],
    )
    .await
    .unwrap();
    let release = tokio::spawn(guard.release());
    let other = sql_client(&pg.url()).await;
    assert!(
        a_session_waits(&other, "distlock").await,
        "the release did not wait for the key"
    );
    db.batch_execute("COMMIT").await.unwrap();
    release.await.unwrap().unwrap();
    assert!(!m.is_locked("iso").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_sweep_keeps_the_tables_bounded() {
    let pg = server();
    let m = LockManager::builder(&pg.url())
        .postgres_sweep_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let db = sql_client(&pg.url()).await;
    // 1500 queue entries of waiters that died (their queue lease ran out):
    // more than one sweep statement deletes, so the sweep goes on at once.
    db.batch_execute(
        "INSERT INTO distlock.waiters SELECT 'dead:' || g, 'owner', g, \
         clock_timestamp() - interval '1 second', 1000, false, '', '', 1, '' \
         FROM generate_series(1, 1500) g",
    )
    .await
    .unwrap();
    // 200 locks whose holders never release them (their leases run out)
    // and 200 released ones.
    for i in 0..200 {
        match m
            .lock(format!("expired:{i}"))
            .lease(Duration::from_millis(50))
            .renew(false)
            .acquire()
            .await
        {
            Ok(g) => std::mem::forget(g),
            // Answered after its 50 ms (a loaded machine): not handed out,
            // and given back.
            Err(LockError::Lost { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        m.lock(format!("cycled:{i}"))
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let rows = async || {
        count(&db, "SELECT count(*) FROM distlock.locks").await
            + count(&db, "SELECT count(*) FROM distlock.waiters").await
    };
    assert!(
        eventually(Duration::from_secs(10), async || rows().await == 0)
            .await
            .is_some(),
        "rows left: {}",
        rows().await
    );
}

/// A sweep tries the transaction locks of the rows it chose (at most its
/// limit per table) and no others, whatever plan the server picks: with
/// 5,000 expired locks and queue entries, one sweep of 200 holds at most
/// 400 advisory locks, with nested loops allowed and without. Before, the
/// try was a condition on the deleted table, evaluated on every row its
/// scan read: 5,000 locks (enough such rows would fill the server's lock
/// table, and the sweep would fail every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_sweep_tries_only_the_locks_of_the_rows_it_chose() {
    let pg = server();
    // Its own sweeps an hour away: only the test's sweep runs.
    let _schema = quiet_manager(&pg.url(), None).await;
    let db = sql_client(&pg.url()).await;
    db.batch_execute(
        "INSERT INTO distlock.locks (name, owner, expires_at, since_ms, holder, handoff) \
         SELECT 'dead:' || g, 'owner', clock_timestamp() - interval '1 minute', 0, '', '' \
         FROM generate_series(1, 5000) g; \
         INSERT INTO distlock.waiters \
         SELECT 'gone:' || g, 'owner', g, clock_timestamp() - interval '1 minute', 1000, \
         false, '', '', 1, '' FROM generate_series(1, 5000) g; \
         ANALYZE distlock.locks; ANALYZE distlock.waiters",
    )
    .await
    .unwrap();
    for nested_loops in ["on", "off"] {
        db.batch_execute(&format!(
            "BEGIN; SET LOCAL enable_nestloop = {nested_loops}; \
             SELECT distlock.sweep(200, '')"
        ))
        .await
        .unwrap();
        let held = count(
            &db,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
        )
        .await;
        db.batch_execute("ROLLBACK").await.unwrap();
        assert!(
            (1..=400).contains(&held),
            "{held} advisory locks with enable_nestloop = {nested_loops}"
        );
    }
}

/// A semaphore's family row (its stored count) stays while any hold of it
/// is left, expired or not: here a hold that one sweep's limit leaves (200
/// expired holds of other families come first), which a renewal in flight
/// may be extending, uncommitted. Before, the family went as soon as no hold
/// looked live, and the next acquisition found holders but no count to
/// check its permits against.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_sweep_keeps_a_family_while_it_has_a_hold() {
    let pg = server();
    // Its own sweeps an hour away: only the test's sweep runs.
    let _schema = quiet_manager(&pg.url(), None).await;
    let db = sql_client(&pg.url()).await;
    db.batch_execute(
        "INSERT INTO distlock.shared_holds (name, owner, kind, expires_at, since_ms, holder) \
         SELECT 'other:' || g, 'owner', 'p', clock_timestamp() - interval '1 minute', 0, '' \
         FROM generate_series(1, 200) g; \
         INSERT INTO distlock.shared_holds (name, owner, kind, expires_at, since_ms, holder) \
         VALUES ('family', 'holder', 'p', clock_timestamp() - interval '1 minute', 0, ''); \
         INSERT INTO distlock.shared_keys (name, permits) VALUES ('family', 5)",
    )
    .await
    .unwrap();
    let first_hold_left: i64 = db
        .query_one("SELECT distlock.sweep_shared(200)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(first_hold_left, 200, "the other families' holds went first");
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM distlock.shared_keys WHERE name = 'family'"
        )
        .await,
        1,
        "the family went while a hold of it was left"
    );
    // Its hold goes at the next sweep, and the family with it.
    db.query_one("SELECT distlock.sweep_shared(200)", &[])
        .await
        .unwrap();
    assert_eq!(
        count(&db, "SELECT count(*) FROM distlock.shared_keys").await,
        0
    );
}

/// A hold of a semaphore committed while a sweep waits for another family's
/// row: the sweep must see it before it deletes its family (the stored
/// count). Before, the check for holds ran on the deleting statement's
/// snapshot, taken before the hold committed, and the family went from
/// under it; the next acquisition with another count was then not refused.
/// The sweep is made to wait deterministically: a session holds the row of
/// a family that comes first (`aaa`) with `FOR UPDATE`, and joins that walk
/// the families one by one (nested loops) are forced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_sweep_sees_a_hold_committed_while_it_waited() {
    let pg = server();
    // Its own sweeps an hour away: only the test's sweep runs.
    let m = quiet_manager(&pg.url(), None).await;
    let db = sql_client(&pg.url()).await;
    // The family's stored name, as distlock writes it.
    let g = m.semaphore("family", 5).acquire().await.unwrap();
    let family: String = db
        .query_one("SELECT name FROM distlock.shared_keys", &[])
        .await
        .unwrap()
        .get(0);
    g.release().await.unwrap();
    // Two families with no hold, `aaa` first in the table.
    db.batch_execute(&format!(
        "DELETE FROM distlock.shared_keys; DELETE FROM distlock.shared_holds; \
         INSERT INTO distlock.shared_keys (name, permits) VALUES ('aaa', 1); \
         INSERT INTO distlock.shared_keys (name, permits) VALUES ('{family}', 5)"
    ))
    .await
    .unwrap();
    let blocker = sql_client(&pg.url()).await;
    blocker
        .batch_execute("BEGIN; SELECT 1 FROM distlock.shared_keys WHERE name = 'aaa' FOR UPDATE")
        .await
        .unwrap();
    let sweeper = sql_client(&format!("{}&application_name=test-sweeper", pg.url())).await;
    let sweep = tokio::spawn(async move {
        sweeper
            .batch_execute(
                "BEGIN; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; \
                 SELECT distlock.sweep_shared(200); COMMIT",
            )
            .await
    });
    assert!(
        common::a_session_waits(&db, "test-sweeper").await,
        "the sweep waits for `aaa`'s row"
    );
    // A hold of the family, while the sweep waits: committed at once, or
    // (the sweep holding the family's lock already) once the sweep ends.
    let holder = m.clone();
    let hold = tokio::spawn(async move { holder.semaphore("family", 5).try_acquire().await });
    let manager_waits = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
                         WHERE NOT l.granted AND a.application_name = 'distlock'";
    let committed_or_waiting = async || hold.is_finished() || count(&db, manager_waits).await > 0;
    assert!(eventually(Duration::from_secs(5), committed_or_waiting)
        .await
        .is_some());
    blocker.batch_execute("COMMIT").await.unwrap();
    sweep.await.unwrap().unwrap();
    let guard = hold
        .await
        .unwrap()
        .unwrap()
        .expect("the semaphore was free");
    assert_eq!(
        count(
            &db,
            &format!("SELECT count(*) FROM distlock.shared_keys WHERE name = '{family}'")
        )
        .await,
        1,
        "the family went while a hold of it was committed"
    );
    // So a request with another count is refused, as for any held family.
    let other = m.semaphore("family", 3).try_acquire().await;
    assert!(
        matches!(other, Err(distlock::LockError::PermitsDiffer { .. })),
        "{other:?}"
    );
    guard.release().await.unwrap();
}

/// The shared holds' and counters' tables too: expired read, write and
/// permit holds, the family rows they leave (a semaphore's count, a dead
/// writer's intent) and ended registrations of counting semaphore waiters
/// go with the sweep, more than one sweep's limit of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_sweep_keeps_the_shared_tables_bounded() {
    let pg = server();
    let m = LockManager::builder(&pg.url())
        .postgres_sweep_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let db = sql_client(&pg.url()).await;
    // 1500 holds of readers that died (their leases ran out), the intents
    // of 1500 writers that died waiting, and 1500 registrations of counting
    // semaphore waiters that died.
    db.batch_execute(
        "INSERT INTO distlock.shared_holds (name, owner, kind, expires_at, since_ms, holder) \
         SELECT 'dead:' || g, 'owner', 'r', clock_timestamp() - interval '1 second', 0, '' \
         FROM generate_series(1, 1500) g; \
         INSERT INTO distlock.shared_keys (name, intent_owner, intent_expires_at) \
         SELECT 'dead:' || g, 'owner', clock_timestamp() - interval '1 second' \
         FROM generate_series(1, 1500) g; \
         INSERT INTO distlock.counter_waiters (name, owner, expires_at) \
         SELECT 'dead:' || g, 'owner', clock_timestamp() - interval '1 second' \
         FROM generate_series(1, 1500) g",
    )
    .await
    .unwrap();
    // Holds of every kind whose holders never release them, and released ones.
    let short = Duration::from_millis(50);
    for i in 0..50 {
        let expiring = [
            m.read_lock(format!("r:{i}")).lease(short),
            m.write_lock(format!("w:{i}")).lease(short),
            m.semaphore(format!("s:{i}"), 3).weight(2).lease(short),
        ];
        for request in expiring {
            match request.renew(false).acquire().await {
                Ok(g) => std::mem::forget(g),
                // Answered after its 50 ms (a loaded machine): not handed
                // out, and given back.
                Err(LockError::Lost { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        m.semaphore(format!("cycled:{i}"), 2)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let rows = async || {
        count(&db, "SELECT count(*) FROM distlock.shared_holds").await
            + count(&db, "SELECT count(*) FROM distlock.shared_keys").await
            + count(&db, "SELECT count(*) FROM distlock.counter_waiters").await
    };
    assert!(
        eventually(Duration::from_secs(10), async || rows().await == 0)
            .await
            .is_some(),
        "rows left: {}",
        rows().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_schema_is_versioned_and_its_creation_optional() {
    let pg = server();
    // Not created, and told not to create it: a typed error naming the fix.
    let refused = LockManager::builder(&pg.url())
        .create_postgres_schema(false)
        .build()
        .await;
    match refused {
        Err(LockError::ServerCheck { reason, .. }) => {
            assert!(reason.contains("distlock schema"), "{reason}")
        }
        other => panic!("expected ServerCheck, got {:?}", other.map(drop)),
    }
    // Created by a DBA with the public SQL, in a schema of another name.
    pg.psql(&distlock::postgres_schema_sql("locks_here").unwrap())
        .unwrap();
    let m = LockManager::builder(&pg.url())
        .postgres_schema("locks_here")
        .create_postgres_schema(false)
        .build()
        .await
        .unwrap();
    m.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // An older schema: refused when the builder may not migrate it, and
    // migrated (its functions replaced, the version raised) when it may.
    pg.psql("UPDATE locks_here.version SET version = 1")
        .unwrap();
    let version = async || {
        count(
            &sql_client(&pg.url()).await,
            "SELECT version::bigint FROM locks_here.version",
        )
        .await
    };
    match LockManager::builder(&pg.url())
        .postgres_schema("locks_here")
        .create_postgres_schema(false)
        .build()
        .await
    {
        Err(LockError::ServerCheck { reason, .. }) => {
            assert!(reason.contains("older"), "{reason}")
        }
        other => panic!("expected ServerCheck, got {:?}", other.map(drop)),
    }
    assert_eq!(version().await, 1);
    LockManager::builder(&pg.url())
        .postgres_schema("locks_here")
        .build()
        .await
        .unwrap();
    assert_eq!(
        version().await,
        i64::from(distlock::POSTGRES_SCHEMA_VERSION)
    );
    // A newer schema than the library knows is refused.
    pg.psql("UPDATE locks_here.version SET version = 99")
        .unwrap();
    let newer = LockManager::builder(&pg.url())
        .postgres_schema("locks_here")
        .build()
        .await;
    assert!(matches!(newer, Err(LockError::ServerCheck { .. })));
    // A role without CREATE: the error says what is missing.
    pg.psql("CREATE ROLE weak LOGIN; REVOKE CREATE ON DATABASE postgres FROM PUBLIC; REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        .unwrap();
    let weak_url = pg.url().replace("postgres@", "weak@");
    match LockManager::builder(&weak_url).build().await {
        Err(LockError::ServerCheck { reason, .. }) => {
            assert!(reason.contains("may not create"), "{reason}")
        }
        other => panic!("expected ServerCheck, got {:?}", other.map(drop)),
    }
}

/// `sslmode=require` against a server without TLS: refused, naming TLS (the
/// TLS cases are in `postgres_tls.rs`); without the `tls` feature, refused
/// before connecting, naming the feature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sslmode_require_on_a_server_without_tls_is_refused() {
    let pg = server();
    let url = format!("{}&sslmode=require", pg.url());
    match LockManager::builder(&url).build().await {
        #[cfg(feature = "tls")]
        Err(LockError::Connect { source, .. }) => {
            assert!(source.to_string().contains("TLS"), "{source}")
        }
        #[cfg(not(feature = "tls"))]
        Err(LockError::InvalidConfig(message)) => {
            assert!(message.contains("`tls` feature"), "{message}")
        }
        other => panic!("expected a refusal, got {:?}", other.map(drop)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cancelled_waiter_leaves_the_queue_and_the_next_is_served() {
    let pg = server();
    let m = manager(&pg).await;
    let other = manager(&pg).await;
    let db = sql_client(&pg.url()).await;
    let holder = m.lock("cancel").acquire().await.unwrap();
    let first = spawn_waiter(&other, "cancel");
    await_queued(&db, 1).await;
    let second = spawn_waiter(&other, "cancel");
    await_queued(&db, 2).await;
    // The head gives up: its entry goes, so the release hands to the second.
    first.abort();
    await_queued(&db, 1).await;
    holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second waiter is served")
        .unwrap()
        .unwrap();
}

/// A fault proxy in front of `pg`.
async fn proxy_to(pg: &PostgresServer) -> FaultProxy {
    FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], pg.port())))
        .await
        .unwrap()
}

/// `pg`'s URL with its port replaced by `proxy`'s.
fn through(pg: &PostgresServer, proxy: &FaultProxy) -> String {
    pg.url().replace(
        &format!(":{}/", pg.port()),
        &format!(":{}/", proxy.local_addr().port()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_holder_cut_off_past_its_lease_is_told_before_the_next_grant() {
    let pg = server();
    let proxy = proxy_to(&pg).await;
    let m = LockManager::builder(&through(&pg, &proxy))
        .default_lease(Duration::from_millis(1000))
        .command_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let other = manager(&pg).await;
    let guard = m.lock("cut-off").acquire().await.unwrap();
    let token = guard.fencing_token().await.unwrap();
    // Its connections and any new one answer nothing: it can renew no more.
    proxy.set_mode(FaultMode::BlackHole);
    let next = other
        .lock("cut-off")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    // The row expires on the server's clock at least a lease after the
    // holder's last renewal was sent, and the holder's local deadline is a
    // lease after it sent that renewal: so once another manager is granted
    // the lock, the holder's lease is already lost locally.
    assert!(guard.is_lost(), "a grant overlapped a hold not yet lost");
    assert!(next.fencing_token().await.unwrap() > token);
    proxy.set_mode(FaultMode::Pass);
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_data_connection_that_goes_silent_is_replaced_and_the_hold_kept() {
    let pg = server();
    let proxy = proxy_to(&pg).await;
    let lease = Duration::from_millis(6000);
    let command_timeout = Duration::from_millis(300);
    let m = LockManager::builder(&through(&pg, &proxy))
        .default_lease(lease)
        .command_timeout(command_timeout)
        .build()
        .await
        .unwrap();
    let guard = m.lock("stranded").acquire().await.unwrap();
    let token = guard.fencing_token().await.unwrap();
    // Its data connection goes silent for good, without a reset, as when the
    // host behind it died and a new one took its address; new connections
    // pass.
    proxy.strand_open_connections();
    // Renewals are due every lease / 3 (2 s) and, after a failure, every
    // lease / 9 (0.67 s). On the silent connection the first is sent 2 s
    // after its last answer and times out 0.3 s later; the next, sent 0.67 s
    // after that, times out 1.27 s after the first was sent: two timeouts
    // and calls unanswered for over 0.6 s (two command timeouts), so the
    // connection is replaced about 3.3 s after its last answer, and the
    // retry 0.67 s later renews on a new one, about 2 s before the 6 s lease
    // ends. Kept, the silent connection would fail every renewal and the
    // hold would be lost within one lease: two leases without the lost
    // signal show it was replaced.
    let lost = tokio::time::timeout(lease * 2, guard.lost()).await;
    assert!(
        lost.is_err(),
        "the hold was lost: the silent connection was kept"
    );
    let db = sql_client(&pg.url()).await;
    let row = db
        .query_one(
            "SELECT token, expires_at > clock_timestamp() AS live FROM distlock.locks \
             WHERE name LIKE '%:stranded'",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>("live"), "renewed on the new connection");
    assert_eq!(row.get::<_, i64>("token"), i64::try_from(token).unwrap());
    guard.release().await.unwrap();
    assert!(!m.is_locked("stranded").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_calls_queued_behind_a_reconnection_that_fails_share_its_failure() {
    let pg = server();
    let proxy = proxy_to(&pg).await;
    let connect_timeout = Duration::from_millis(400);
    let m = LockManager::builder(&through(&pg, &proxy))
        .connect_timeout(connect_timeout)
        .command_timeout(Duration::from_millis(400))
        .postgres_sweep_interval(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    assert!(!m.is_locked("warm").await.unwrap());
    // The data connection is reset (and a new one refused) until a call
    // finds it gone; then new connections are accepted and answer nothing,
    // so that each attempt lasts the connect timeout.
    proxy.set_mode(FaultMode::Reset);
    assert!(eventually(Duration::from_secs(10), async || m
        .is_locked("warm")
        .await
        .is_err())
    .await
    .is_some());
    proxy.set_mode(FaultMode::BlackHole);
    let started = Instant::now();
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let m = m.clone();
            tokio::spawn(async move {
                let answer = m.is_locked(&format!("k{i}")).await;
                (answer.is_err(), started.elapsed())
            })
        })
        .collect();
    // All eight arrive while the first attempt is under way and get its
    // failure when it ends, a connect timeout after it began; a call that
    // came just after it ended would make one attempt of its own: at most
    // two connect timeouts (0.8 s), with 0.4 s of slack. Each making its own
    // attempt in turn, the last would end after eight (3.2 s).
    for call in calls {
        let (failed, after) = call.await.unwrap();
        assert!(failed, "a call answered through a black hole");
        assert!(
            after < connect_timeout * 3,
            "a call ended {after:?} after it began: it waited for others' attempts"
        );
    }
    proxy.set_mode(FaultMode::Pass);
    assert!(eventually(Duration::from_secs(10), async || m
        .is_locked("warm")
        .await
        .is_ok())
    .await
    .is_some());
}

/// A guard dropped as its runtime ends is released over a connection of its
/// own (a thread with its own runtime), not left to its lease.
#[test]
fn a_hold_dropped_as_the_runtime_ends_is_released() {
    let pg = server();
    let url = pg.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = LockManager::connect(&url).await.unwrap();
        let _g = m
            .lock("job")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        // `_g` dropped here, inside the runtime: Drop spawns the release,
        // which never runs there; the runtime's end releases it instead.
    });
    drop(rt);
    let check = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    check.block_on(async {
        let m = LockManager::connect(&url).await.unwrap();
        assert!(
            !m.is_locked("job").await.unwrap(),
            "a lease of 30 s would still hold the lock"
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_managers_starting_together_create_the_schema_once() {
    let pg = server();
    let url = pg.url();
    let builds = (0..4).map(|_| LockManager::builder(&url).build());
    for built in futures_util::future::join_all(builds).await {
        built.expect("every manager starts");
    }
    assert_eq!(
        pg.psql("SELECT version FROM distlock.version").unwrap(),
        distlock::POSTGRES_SCHEMA_VERSION.to_string()
    );
}

/// A hold moves to another manager by ticket: the resumed guard renews and
/// releases it, as on Redis (the ticket names the row's owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_hold_ticket_is_resumed_by_another_manager() {
    let pg = server();
    let m = manager(&pg).await;
    let other = manager(&pg).await;
    let guard = m.lock("ticketed").acquire().await.unwrap();
    let token = guard.fencing_token().await.unwrap();
    let secret = guard.into_ticket().ok().unwrap().to_secret_string();
    let ticket = distlock::HoldTicket::from_secret_string(&secret).unwrap();
    let resumed = other.resume(&ticket).await.unwrap();
    assert_eq!(resumed.fencing_token().await.unwrap(), token);
    assert!(m.lock("ticketed").try_acquire().await.unwrap().is_none());
    resumed.release().await.unwrap();
    assert!(!m.is_locked("ticketed").await.unwrap());
}

/// A lock held across `pg_ctl restart -m immediate` with a lease longer than
/// the restart is still its holder's: the committed row survives crash
/// recovery, and the first renewal after the restart renews it (no lost
/// signal), also after both its connections were cut once. (A hold granted
/// by a hand-off has only the hand-off TTL, at most the queue lease of 3 s,
/// until its first renewal: a restart longer than that right after a
/// hand-off loses it, by design, as the torture suite's scenario p1 saw.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_hold_across_an_immediate_restart_is_kept() {
    let mut pg = server();
    let m = manager(&pg).await;
    // Both connections of the manager cut once before, as in p1.
    m.lock("warm")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    pg.kill_backends_named("distlock").unwrap();
    pg.kill_backends_named("distlock-listen").unwrap();
    let guard = m
        .lock("across")
        .lease(Duration::from_secs(15))
        .acquire()
        .await
        .unwrap();
    pg.restart_immediate().expect("restart -m immediate");
    let db = sql_client(&pg.url()).await;
    let rows = count(
        &db,
        "SELECT count(*) FROM distlock.locks WHERE expires_at > clock_timestamp()",
    )
    .await;
    assert_eq!(rows, 1, "the lock's row did not survive the restart");
    let before = guard.remaining_lease();
    // A renewal is due within a third of the lease (5 s) after the restart;
    // 12 s allows it and a retry.
    let renewed = eventually(Duration::from_secs(12), async || {
        guard.is_lost() || guard.remaining_lease() > before
    })
    .await;
    assert!(renewed.is_some(), "no renewal after the restart");
    assert!(
        !guard.is_lost(),
        "the hold was reported lost after the restart"
    );
    guard
        .release()
        .await
        .expect("the release after the restart");
}

/// Holds of the shared kinds whose guards are dropped as their runtime ends
/// (the release spawned there never runs) are released by the blocking
/// release on a connection of its own, each by its kind's function: nothing
/// stays held for the rest of its 30 s lease.
#[test]
fn postgres_shared_holds_dropped_as_their_runtime_ends_are_released() {
    let pg = server();
    let lease = Duration::from_secs(30);
    let ending = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    ending.block_on(async {
        let m = manager(&pg).await;
        let _reader = m.read_lock("ends:r").lease(lease).acquire().await.unwrap();
        let _writer = m.write_lock("ends:w").lease(lease).acquire().await.unwrap();
        let _permits = m
            .semaphore("ends:s", 3)
            .weight(2)
            .lease(lease)
            .acquire()
            .await
            .unwrap();
        // Dropped here, inside the runtime: each Drop spawns its release.
    });
    drop(ending);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let m = manager(&pg).await;
        for key in ["ends:r", "ends:w", "ends:s"] {
            let state = m.inspect_all(key).await.unwrap();
            assert!(!state.is_held(), "{key} still held: {state:?}");
        }
    });
}

/// The `acquire` calls in the server's log after the first `skip` of them
/// (the statements [`common::distlock_statements_logged`] counts): for each,
/// whether it queues its caller (`p_waiting`, `$5`) and the attempt it is
/// (`p_attempt`, `$12`), read from the parameters logged under the statement.
fn acquire_calls_logged(pg: &PostgresServer, skip: usize) -> Vec<(bool, u64)> {
    let log = std::fs::read_to_string(pg.log_path()).expect("the server's log");
    let lines: Vec<&str> = log.lines().collect();
    let param = |detail: &str, n: u32| -> Option<String> {
        let (_, value) = detail.split_once(&format!("${n} = '"))?;
        Some(value.split('\'').next()?.to_owned())
    };
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| common::logs_distlock_statement(l, "acquire"))
        .skip(skip)
        .map(|(i, l)| {
            let detail = lines[i + 1..]
                .iter()
                .take(3)
                .find(|d| d.to_ascii_lowercase().contains("parameters: "))
                .unwrap_or_else(|| panic!("no parameters logged under {l:?}"));
            let waiting = param(detail, 5).expect("$5 logged") == "t";
            let attempt = param(detail, 12)
                .and_then(|a| a.parse().ok())
                .expect("$12 logged");
            (waiting, attempt)
        })
        .collect()
}

/// A waiting acquisition of a busy default lock queues up with its first
/// statement (on PostgreSQL a try and a queued attempt are the same function
/// call), and the hand-off makes it the holder with no statement of its own:
/// from its start to holding, one `acquire` of its own in all. A try first,
/// then the queueing, would be two, and would leave a gap in which the holder
/// could release to nobody and take the lock again ahead of it. Each call is
/// told apart by its logged attempt number: the queue refreshes a waiter
/// sends on its timer (every 0.4-0.8 s, so any number of them on a slow
/// machine) are attempts 2 and on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiter_queues_with_its_first_statement() {
    let pg = PostgresServer::builder()
        .setting("log_statement", "all")
        .start()
        .unwrap();
    let a = quiet_manager(&pg.url(), None).await;
    let b = quiet_manager(&pg.url(), None).await;
    let holder = a.lock("busy").acquire().await.unwrap();
    let before = common::distlock_statements_logged(&pg, "acquire");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let guard = b
                .lock("busy")
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            guard.release().await.unwrap();
        }
    });
    let in_queue = eventually(Duration::from_secs(10), async || {
        a.inspect("busy")
            .await
            .unwrap()
            .is_some_and(|i| i.waited_for)
    })
    .await;
    assert!(in_queue.is_some(), "the waiter never queued");
    let calls = acquire_calls_logged(&pg, before);
    assert_eq!(
        calls.first(),
        Some(&(true, 1)),
        "the waiter's first statement queues it: {calls:?}"
    );
    holder.release().await.unwrap();
    waiter.await.unwrap();
    let calls = acquire_calls_logged(&pg, before);
    assert_eq!(
        calls.iter().filter(|&&(_, attempt)| attempt == 1).count(),
        1,
        "one acquire of the waiter's own for the hand-off: {calls:?}"
    );
    assert!(
        calls.iter().all(|&(waiting, _)| waiting),
        "every later call only refreshes the queue entry: {calls:?}"
    );
}

/// A waiting acquisition's attempt that finds the lock held and only queues
/// the waiter commits without waiting for its flush, so it does not hold the
/// key's advisory lock (and the holder's release) through one. Shown with a
/// synchronous standby that never answers: a commit that waits for its flush
/// waits for that standby too, and stays invisible meanwhile; the queue
/// entry is visible at once, and the waiter is still waiting (no command
/// timeout), while a grant would hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_attempt_that_only_queues_does_not_wait_for_its_flush() {
    let pg = PostgresServer::start().unwrap();
    let two_s = Some(Duration::from_secs(2));
    let managers = [
        quiet_manager(&pg.url(), two_s).await,
        quiet_manager(&pg.url(), two_s).await,
    ];
    let holder = managers[0].lock("held").acquire().await.unwrap();
    let db = sql_client(&pg.url()).await;
    let hang_commits = async |names: &str| {
        db.batch_execute(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        ))
        .await
        .unwrap();
        db.batch_execute("SELECT pg_reload_conf()").await.unwrap();
        // In effect once a new session sees it.
        let seen = eventually(Duration::from_secs(5), async || {
            let fresh = sql_client(&pg.url()).await;
            let now: String = fresh
                .query_one("SHOW synchronous_standby_names", &[])
                .await
                .unwrap()
                .get(0);
            now == names
        })
        .await;
        assert!(
            seen.is_some(),
            "synchronous_standby_names never became {names:?}"
        );
    };
    hang_commits("nobody").await;
    let waiter = tokio::spawn({
        let m = managers[1].clone();
        async move {
            m.lock("held")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .map(|g| g.issued_fencing_token())
        }
    });
    // Within the 2 s command timeout: a commit waiting for the standby would
    // neither be visible nor return before it.
    let entry = eventually(Duration::from_millis(1500), async || queued(&db).await == 1).await;
    assert!(entry.is_some(), "the queue entry is not visible");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!waiter.is_finished(), "{:?}", waiter.await);
    hang_commits("").await;
    holder.release().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the hand-off")
        .unwrap();
    assert!(handed.is_ok(), "{handed:?}");
}

/// An uncontended cycle of each shared kind (a read hold, a write hold with
/// its token on demand, a weighted permit hold, a counting semaphore's
/// acquire and release) costs one statement per operation, as on Redis one
/// script call each: 2, 3, 2 and 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_cycle_of_each_shared_kind_is_one_statement_per_step() {
    let pg = PostgresServer::builder()
        .setting("log_statement", "all")
        .start()
        .unwrap();
    let m = quiet_manager(&pg.url(), None).await;
    let statements = || common::distlock_statements_logged(&pg, "");
    let mut before = statements();
    let mut spent = || {
        let now = statements();
        let spent = now - before;
        before = now;
        spent
    };
    let read = m.read_lock("cycle").acquire().await.unwrap();
    read.release().await.unwrap();
    assert_eq!(spent(), 2, "a read hold's acquire + release");
    let write = m.write_lock("cycle").acquire().await.unwrap();
    assert!(write.fencing_token().await.unwrap() > 0);
    write.release().await.unwrap();
    assert_eq!(spent(), 3, "a write hold's acquire + token + release");
    let permits = m.semaphore("cycle", 4).weight(3).acquire().await.unwrap();
    permits.release().await.unwrap();
    assert_eq!(spent(), 2, "a permit hold's acquire + release");
    let counter = m.counting_semaphore("cycle");
    assert!(counter.try_set_permits(1).await.unwrap());
    spent();
    assert!(counter.try_acquire(1).await.unwrap());
    counter.release(1).await.unwrap();
    assert_eq!(spent(), 2, "a counting semaphore's acquire + release");
}

/// Permit counts and weights up to `u32::MAX` (beyond PostgreSQL's integer)
/// are stored, summed, given back and freed exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_semaphore_of_u32_max_permits_counts_exactly() {
    let pg = server();
    let m = manager(&pg).await;
    let all = u32::MAX;
    let mut hold = m
        .semaphore("huge", all)
        .weight(all)
        .acquire()
        .await
        .unwrap();
    let counts = m.semaphore("huge", all).permit_counts().await.unwrap();
    assert_eq!(
        (counts.configured, counts.held, counts.available),
        (all, all, 0)
    );
    assert!(m
        .semaphore("huge", all)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    hold.release_permits(all - 1).await.unwrap();
    let counts = m.semaphore("huge", all).permit_counts().await.unwrap();
    assert_eq!((counts.held, counts.available), (1, all - 1));
    let most = m
        .semaphore("huge", all)
        .weight(all - 1)
        .try_acquire()
        .await
        .unwrap()
        .expect("the permits given back");
    let state = m.inspect_all("huge").await.unwrap();
    let mut weights: Vec<u32> = state
        .holds
        .iter()
        .map(|h| match h.kind {
            distlock::HoldKind::Permits(n) => n,
            other => panic!("a {other} hold on a semaphore"),
        })
        .collect();
    weights.sort_unstable();
    assert_eq!(weights, [1, all - 1]);
    assert_eq!(m.force_unlock_all("huge").await.unwrap(), 2);
    let counts = m.semaphore("huge", all).permit_counts().await.unwrap();
    assert_eq!((counts.held, counts.available), (0, all));
    drop((hold, most));
}

/// A renewal of a lease sent just before the lease ends and committed just
/// after (a late renewal of a batch whose statement is still running, or
/// waiting for a synchronous standby) keeps the lock its holder's: every
/// acquisition that comes between waits for the commit and finds the lock
/// held. Emulated by hand: the renewal function called in a transaction of
/// our own, left open across the lease's end, then committed while the
/// acquisition waits. For the writer of a read-write lock (against a writer
/// and a reader) and for `lock_all` over a default lock; the single-key
/// acquisition of the default lock is the control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_renewal_committed_across_the_leases_end_keeps_the_lock_its_holders() {
    let pg = server();
    let holder = manager(&pg).await;
    // Named, so that the wait below is this manager's and no other session's.
    let other = LockManager::builder(&format!("{}&application_name=late-attempt", pg.url()))
        .build()
        .await
        .unwrap();
    let db = sql_client(&pg.url()).await;
    // Long enough for the renewal below to start before the lease's end
    // (after the acquisition's round trip), short enough for a quick test.
    let lease = Duration::from_millis(1_000);

    for case in ["write", "read", "lock_all", "lock"] {
        let key = format!("late-renewal-{case}");
        let shared = matches!(case, "write" | "read");
        let request = if shared {
            holder.write_lock(key.as_str())
        } else {
            holder.lock(key.as_str())
        };
        // Connected before the clock starts: the renewal must begin within
        // the lease.
        let renewal = sql_client(&pg.url()).await;
        let started = Instant::now();
        let guard = request.lease(lease).renew(false).acquire().await.unwrap();
        let (table, renew) = if shared {
            ("shared_holds", "shared_renew")
        } else {
            ("locks", "renew")
        };
        let row = db
            .query_one(
                &format!("SELECT name, owner FROM distlock.{table} WHERE name LIKE '%' || $1"),
                &[&key],
            )
            .await
            .unwrap();
        let (name, owner): (String, String) = (row.get(0), row.get(1));
        // The renewal, in a transaction of its own, before the lease's end.
        renewal.batch_execute("BEGIN").await.unwrap();
        let renewed: bool = renewal
            .query_one(
                &format!("SELECT renewed FROM distlock.{renew}($1, $2, $3)"),
                &[&vec![name.clone()], &vec![owner.clone()], &vec![60_000i64]],
            )
            .await
            .unwrap()
            .get(0);
        assert!(renewed, "{case}: renewed before the lease's end");
        assert!(started.elapsed() < lease, "{case}: too slow to test");
        // Past the lease's end by the database's clock, as the committed row
        // (the renewal's is not visible yet) says.
        let ended = format!(
            "SELECT count(*) FROM distlock.{table} WHERE name = '{name}' AND expires_at < clock_timestamp()"
        );
        assert!(
            eventually(lease * 3, async || count(&db, &ended).await == 1)
                .await
                .is_some(),
            "{case}: the lease never ended by the database's clock"
        );
        let attempt = {
            let (other, key) = (other.clone(), key.clone());
            tokio::spawn(async move {
                match case {
                    "write" => other
                        .write_lock(key)
                        .try_acquire()
                        .await
                        .map(|g| g.is_some()),
                    "read" => other
                        .read_lock(key)
                        .try_acquire()
                        .await
                        .map(|g| g.is_some()),
                    "lock_all" => other
                        .lock_all([key, format!("{case}-second")])
                        .try_acquire()
                        .await
                        .map(|g| g.is_some()),
                    _ => other.lock(key).try_acquire().await.map(|g| g.is_some()),
                }
            })
        };
        // The attempt waits for the renewal's row lock (a lock not granted).
        assert!(
            a_session_waits(&db, "late-attempt").await,
            "{case}: the attempt never waited for the renewal's commit"
        );
        renewal.batch_execute("COMMIT").await.unwrap();
        let taken = attempt.await.unwrap().unwrap();
        assert!(
            !taken,
            "{case}: granted a lock whose holder had just renewed it"
        );
        let owners: Vec<String> = db
            .query(
                &format!(
                    "SELECT owner FROM distlock.{table} WHERE name = $1 AND expires_at > clock_timestamp()"
                ),
                &[&name],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            owners,
            vec![owner],
            "{case}: the live holds after the attempt"
        );
        drop(guard);
    }
}

/// A semaphore holder's release or split while a renewal of its hold is in
/// flight across the lease's end by the database's clock: each waits for the
/// renewal's commit and acts on the renewed hold (schema version 3). Before,
/// each read the hold expired, reported it lost and left the renewed row
/// held for its new lease. The row's end is moved 1 s ahead by hand, as a
/// renewal committed across it leaves the database's view behind the
/// holder's (whose 30 s lease and 10 s command timeout cover the waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_release_give_back_or_split_waits_for_a_renewal_in_flight() {
    let pg = server();
    // Named, so that the wait below is this manager's.
    let holder = LockManager::builder(&format!("{}&application_name=late-holder", pg.url()))
        .command_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let db = sql_client(&pg.url()).await;
    for case in ["release", "give back", "split"] {
        let key = format!("late-{case}");
        let mut guard = holder
            .semaphore(key.as_str(), 4)
            .weight(2)
            .lease(Duration::from_secs(30))
            .renew(false)
            .acquire()
            .await
            .unwrap();
        let row = db
            .query_one(
                "SELECT name, owner FROM distlock.shared_holds WHERE name LIKE '%' || $1",
                &[&key],
            )
            .await
            .unwrap();
        let (name, owner): (String, String) = (row.get(0), row.get(1));
        // The renewal's session open and in its transaction first: it must
        // begin within the second the row has left.
        let renewal = sql_client(&pg.url()).await;
        renewal.batch_execute("BEGIN").await.unwrap();
        db.execute(
            "UPDATE distlock.shared_holds \
             SET expires_at = clock_timestamp() + interval '1 second' \
             WHERE name = $1 AND owner = $2",
            &[&name, &owner],
        )
        .await
        .unwrap();
        let renewed: bool = renewal
            .query_one(
                "SELECT renewed FROM distlock.shared_renew($1, $2, $3)",
                &[&vec![name.clone()], &vec![owner.clone()], &vec![60_000i64]],
            )
            .await
            .unwrap()
            .get(0);
        assert!(renewed, "{case}: renewed before the lease's end");
        let ended = format!(
            "SELECT count(*) FROM distlock.shared_holds WHERE name = '{name}' \
             AND expires_at < clock_timestamp()"
        );
        assert!(
            eventually(Duration::from_secs(3), async || count(&db, &ended).await
                == 1)
            .await
            .is_some(),
            "{case}: the lease never ended by the database's clock"
        );
        // The guards the act leaves (the split's), kept until the rows are
        // read: dropped, they would release in the background.
        let act = tokio::spawn(async move {
            match case {
                "release" => guard.release().await.map(|()| Vec::new()),
                "give back" => guard.release_permits(1).await.map(|()| vec![guard]),
                _ => {
                    let mut guards = guard.split_permits().await?;
                    guards.push(guard);
                    Ok(guards)
                }
            }
        });
        assert!(
            a_session_waits(&db, "late-holder").await,
            "{case}: the holder never waited for the renewal's commit"
        );
        renewal.batch_execute("COMMIT").await.unwrap();
        let done = act.await.unwrap();
        match case {
            "release" => {
                assert!(done.is_ok(), "{case}: {done:?}");
                let left =
                    format!("SELECT count(*) FROM distlock.shared_holds WHERE name = '{name}'");
                assert_eq!(count(&db, &left).await, 0, "released, nothing held");
            }
            _ => {
                let guards = done.unwrap();
                let expected = if case == "split" { 2 } else { 1 };
                assert_eq!(guards.len(), expected, "{case}: the guards left");
                let renewed_end = format!(
                    "SELECT count(*) FROM distlock.shared_holds WHERE name = '{name}' \
                     AND expires_at > clock_timestamp() + interval '30 seconds'"
                );
                assert_eq!(
                    count(&db, &renewed_end).await,
                    expected as i64,
                    "{case}: the holds keep the renewed lease end"
                );
                for guard in guards {
                    guard.release().await.unwrap();
                }
            }
        }
    }
}

/// Keys PostgreSQL cannot store are refused with `InvalidKey` naming the
/// key, not a server error: a name too long for the tables' index (an entry
/// holds at most about 2,700 bytes after compression: random text of 4,000
/// bytes does not compress below it; Redis takes such keys), named also
/// when it is not the first of a `lock_all`, and a NUL in any key of a
/// `lock_all`, not only the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keys_it_cannot_store_are_invalid_keys() {
    let pg = server();
    let m = manager(&pg).await;
    // Digits and letters in an order that repeats nowhere (a linear
    // congruential sequence), so that compression gains little.
    let mut state: u64 = 42;
    let long: String = (0..4_000)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(state >> 33) as usize % 36])
        })
        .collect();
    match m.lock(long.as_str()).acquire().await {
        Err(LockError::InvalidKey { key, reason }) => {
            assert_eq!(key, long);
            assert!(reason.contains("too long"), "{reason}");
        }
        other => panic!("expected InvalidKey, got {:?}", other.map(drop)),
    }
    // In a lock_all the error names the long key, not the call's first.
    match m.lock_all(["0", long.as_str()]).acquire().await {
        Err(LockError::InvalidKey { key, reason }) => {
            assert_eq!(key, long);
            assert!(reason.contains("too long"), "{reason}");
        }
        other => panic!("expected InvalidKey, got {:?}", other.map(drop)),
    }
    match m.lock_all(["a", "a\0b"]).acquire().await {
        Err(LockError::InvalidKey { key, .. }) => assert_eq!(key, "a\0b"),
        other => panic!("expected InvalidKey, got {:?}", other.map(drop)),
    }
    // Nothing was left behind, and a key of the same length that compresses
    // well is fine.
    let held = m.lock("x".repeat(4_000)).acquire().await.unwrap();
    held.release().await.unwrap();
    // A NUL byte in the key prefix or the holder description is refused by
    // build(), not by every call.
    for builder in [
        LockManager::builder(&pg.url()).key_prefix("app\0:"),
        LockManager::builder(&pg.url()).holder("worker\0"),
    ] {
        match builder.build().await {
            Err(LockError::InvalidConfig(reason)) => assert!(reason.contains("NUL"), "{reason}"),
            other => panic!("expected InvalidConfig, got {:?}", other.map(drop)),
        }
    }
}

/// A schema name goes into the SQL unquoted: every keyword the server
/// reserves (categories R and T of `pg_get_keywords()`) is refused as one,
/// with `InvalidConfig`, rather than failing `build()` with a syntax error;
/// and an unreserved one is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_reserved_keyword_is_refused_as_a_schema_name() {
    let pg = server();
    let db = sql_client(&pg.url()).await;
    let reserved: Vec<String> = db
        .query(
            "SELECT word FROM pg_get_keywords() WHERE catcode IN ('R', 'T') ORDER BY word",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(reserved.len() > 90, "{reserved:?}");
    // PL/pgSQL's reserved words too: the functions' bodies name the schema.
    let plpgsql = [
        "begin", "by", "declare", "execute", "foreach", "if", "loop", "strict", "while",
    ];
    for word in reserved.iter().map(String::as_str).chain(plpgsql) {
        assert!(
            matches!(
                distlock::postgres_schema_sql(word),
                Err(LockError::InvalidConfig(_))
            ),
            "{word} accepted as a schema name"
        );
    }
    match LockManager::builder(&pg.url())
        .postgres_schema("user")
        .build()
        .await
    {
        Err(LockError::InvalidConfig(reason)) => assert!(reason.contains("reserved"), "{reason}"),
        other => panic!("expected InvalidConfig, got {:?}", other.map(drop)),
    }
    // An unreserved keyword names a schema as any word does.
    let m = LockManager::builder(&pg.url())
        .postgres_schema("schema")
        .build()
        .await
        .unwrap();
    m.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A listening connection whose probe came too late (its notification after
/// the probe's timeout) is found deaf, and is made again and probed afresh
/// ten command timeouts later: the manager hears again (lock events are
/// served) instead of staying deaf for as long as that connection lives.
/// The data connection goes through a proxy that holds each chunk 500 ms,
/// so the probe's NOTIFY reaches the server 500 ms after the listener's
/// LISTEN; the listening backend is paused in between (found by polling
/// `pg_stat_activity` on a connection of the test's own), for 4 s: longer
/// than the probe waits for its notification and its `UNLISTEN` (1.5 s
/// each, its command timeout, after the NOTIFY's 1 s round trip), shorter
/// than the subscriber waits before it pings a quiet connection (15 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_listener_found_deaf_by_a_late_probe_is_probed_again() {
    let pg = std::sync::Arc::new(server());
    let proxy = proxy_to(&pg).await;
    let m = LockManager::builder(&through(&pg, &proxy))
        .postgres_listen_url(pg.url())
        .command_timeout(Duration::from_millis(1500))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    m.lock("deaf-probe")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), async || !pg
            .backend_pids("distlock-listen")
            .unwrap()
            .is_empty())
        .await
        .is_some(),
        "no listening connection"
    );
    let db = sql_client(&pg.url()).await;
    proxy.set_mode(FaultMode::Delay(Duration::from_millis(500)));
    let pauser = {
        let pg = pg.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                let rows = db
                    .query(
                        "SELECT pid FROM pg_stat_activity WHERE application_name = \
                         'distlock-listen' AND state = 'idle' \
                         AND query LIKE 'LISTEN distlock_probe%'",
                        &[],
                    )
                    .await
                    .unwrap();
                if let Some(pid) = rows.first().map(|row| row.get::<_, i32>(0)) {
                    let pid = u32::try_from(pid).unwrap();
                    tokio::task::block_in_place(|| pg.pause_backend(pid)).unwrap();
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    tokio::task::block_in_place(|| pg.resume_backend(pid)).unwrap();
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            false
        })
    };
    // A new listening connection, probed.
    pg.kill_backends_named("distlock-listen").unwrap();
    assert!(pauser.await.unwrap(), "never saw the probe's LISTEN");
    proxy.set_mode(FaultMode::Pass);
    assert!(
        eventually(Duration::from_secs(5), async || m.deaf_listeners() >= 1)
            .await
            .is_some(),
        "the late probe did not find the listener deaf"
    );
    let refused = m.events("deaf-probe").subscribe().await;
    assert!(
        matches!(refused, Err(LockError::InvalidConfig(_))),
        "events while deaf: {:?}",
        refused.map(drop)
    );
    // Made again and probed within ten command timeouts (15 s) of the deaf
    // verdict, plus a reconnect.
    let heard = eventually(Duration::from_secs(30), async || {
        m.events("deaf-probe").subscribe().await.is_ok()
    })
    .await;
    assert!(heard.is_some(), "the listener stayed deaf");
}
