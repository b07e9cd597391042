//! Fencing against a real database: a private PostgreSQL instance rejects the
//! write of a holder that was paused past its lease, once a newer holder wrote.
//!
//! Needs the PostgreSQL server binaries (initdb, pg_ctl; `.ci/run` installs
//! them); the instance lives in a temporary directory on a free loopback port.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::*;
use distlock_testing::PostgresServer;
use tokio_postgres::{Client, NoTls};

/// Holder A's lease, which runs out while A is frozen. 1 s, not 300 ms:
/// A's grant and its token must come back within it on a loaded machine.
const LEASE: Duration = Duration::from_millis(1000);

async fn connect_db(conninfo: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls)
        .await
        .expect("connect to the private PostgreSQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The fenced write: rows updated, 1 or 0 (a newer holder wrote). `<=` rather
/// than `<`, so that a holder can write the same row twice.
async fn fenced_write(db: &Client, id: i32, balance: i64, token: u64) -> u64 {
    let token = i64::try_from(token).expect("token fits a bigint");
    db.execute(
        "UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2",
        &[&balance, &token, &id],
    )
    .await
    .expect("UPDATE")
}

async fn read(db: &Client, id: i32) -> (i64, i64) {
    let row = db
        .query_one("SELECT balance, fence FROM accounts WHERE id = $1", &[&id])
        .await
        .expect("SELECT");
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holders_stale_write_is_rejected_by_postgres() {
    let pg = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let redis = server();
    let db = connect_db(&pg.url()).await;
    db.batch_execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, \
         fence bigint NOT NULL DEFAULT 0);
         INSERT INTO accounts (id, balance) VALUES (1, 100);",
    )
    .await
    .expect("schema");

    // Holder A on its own thread and single-threaded runtime: blocking that
    // thread freezes A and its renewal together, as a process pause would
    // (the approach of examples/fencing.rs). Renewal stays on, as in real use.
    let (holding_tx, holding_rx) = tokio::sync::oneshot::channel::<u64>();
    let (b_wrote_tx, b_wrote_rx) = mpsc::channel::<()>();
    let (url, conninfo) = (redis.url(), pg.url());
    let holder_a = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let locks = manager_at(&url).await;
            let db = connect_db(&conninfo).await;
            let guard = locks
                .lock("account:1")
                .lease(LEASE)
                .acquire()
                .await
                .expect("A acquires");
            let token = guard.fencing_token().await.unwrap();
            let (balance, _) = read(&db, 1).await;
            holding_tx.send(token).expect("B listens");
            // Frozen (no await, so no renewal) until B has written: longer than
            // A's lease, since B can only take the lock once that ran out.
            b_wrote_rx
                .recv_timeout(Duration::from_secs(20))
                .expect("B writes while A is frozen");
            let rows = fenced_write(&db, 1, balance + 50, token).await;
            let _ = guard.release().await; // lost by now: nothing to release
            (token, rows)
        })
    });

    // Holder B: waits for A's lease to run out, then writes with its token.
    let a_token_seen = holding_rx.await.expect("A holds the lock");
    let locks = manager(&redis).await;
    // B keeps the default lease: it must hold through a read and two
    // committed writes, and only A's lease is meant to run out.
    let guard = locks
        .lock("account:1")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("B acquires once A's lease ran out");
    let b_token = guard.fencing_token().await.unwrap();
    let (balance, _) = read(&db, 1).await;
    let b_rows = fenced_write(&db, 1, balance - 30, b_token).await;
    // `fence <= token`: the same holder may write the row again.
    assert_eq!(fenced_write(&db, 1, balance - 30, b_token).await, 1);
    guard.release().await.expect("B releases");
    b_wrote_tx.send(()).expect("A waits for B");

    let (a_token, a_rows) = tokio::task::spawn_blocking(move || holder_a.join())
        .await
        .expect("join")
        .expect("holder A panicked");
    assert_eq!(a_token, a_token_seen);
    assert!(b_token > a_token, "B's token {b_token} > A's {a_token}");
    assert_eq!(b_rows, 1, "B's write is accepted");
    assert_eq!(a_rows, 0, "A's stale write is rejected by the database");
    let (balance, fence) = read(&db, 1).await;
    assert_eq!(
        balance, 70,
        "the balance is B's (100 - 30), A's +50 never landed"
    );
    assert_eq!(
        fence,
        i64::try_from(b_token).unwrap(),
        "the fence is B's token"
    );
}
