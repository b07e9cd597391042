//! Fencing against a real database: PostgreSQL rejects a paused holder's stale write.
//!
//! The rows carry the fencing token of their last writer, and every write is a
//! conditional UPDATE that only the same or a larger token passes (`<=`, not
//! `<`: a holder may write the same row more than once; every acquisition gets a
//! new, larger token, so an older holder's never passes):
//!
//! ```sql
//! UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2
//! ```
//!
//! Client A takes the lock on `account:1` (lease 300 ms), reads the balance to
//! add a deposit to it, then freezes (here a blocking sleep that stops its whole
//! runtime, renewal included, as in `examples/fencing.rs`) past its lease.
//! Client B takes the lock once A's lease has run out, reads the same balance,
//! withdraws and writes with its larger token. When A wakes up it writes the
//! balance it computed before B's withdrawal, unaware: PostgreSQL updates 0
//! rows, because the row's fence is already B's token. Without the fence, B's
//! withdrawal would be silently lost.
//!
//! The database is a private PostgreSQL instance (`distlock_testing::PostgresServer`:
//! initdb + pg_ctl in a temporary directory, on a free loopback port), never one
//! that is already running; Redis is REDIS_URL or a private redis-server, as in
//! the other examples.
//!
//! ```sh
//! cargo run --example postgres_fencing
//! ```

mod support;

use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager};
use distlock_testing::PostgresServer;
use tokio_postgres::{Client, NoTls};

const ACCOUNT: i32 = 1;
const OPENING_BALANCE: i64 = 100;
const DEPOSIT: i64 = 50; // client A's change
const WITHDRAWAL: i64 = 30; // client B's change

/// Sets the balance unless a holder with a larger token has written the row;
/// returns the number of rows updated: 1, or 0 when a newer holder wrote.
async fn fenced_write(db: &Client, token: u64, balance: i64) -> Result<u64, AppError> {
    let token = i64::try_from(token).map_err(|_| AppError::Token(token))?;
    Ok(db
        .execute(
            "UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2",
            &[&balance, &token, &ACCOUNT],
        )
        .await?)
}

async fn read(db: &Client) -> Result<(i64, i64), AppError> {
    let row = db
        .query_one(
            "SELECT balance, fence FROM accounts WHERE id = $1",
            &[&ACCOUNT],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("lock: {0}")]
    Lock(#[from] LockError),
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("fencing token {0} does not fit a bigint")]
    Token(u64),
}

fn log(start: Instant, who: &str, what: &str) {
    println!("{:>6} ms  {who}: {what}", start.elapsed().as_millis());
}

/// Reads the balance, adds `change`, writes it back under the lock with the
/// fencing token; `pause` freezes the whole thread between read and write.
/// Returns (token, rows updated).
#[distributed_lock(
    key = "account:1",
    lease = "300ms",
    guard = lock,
    manager = locks,
    on_lost = "ignore"
)]
async fn update_balance(
    locks: &LockManager,
    db: &Client,
    who: &str,
    change: i64,
    pause: Duration,
    start: Instant,
) -> Result<(u64, u64), AppError> {
    let token = lock.fencing_token().await?;
    let (balance, _) = read(db).await?;
    log(
        start,
        who,
        &format!("holds the lock, fencing token {token}; reads balance {balance}"),
    );
    if !pause.is_zero() {
        log(
            start,
            who,
            &format!("freezes for {} ms (lease is 300 ms)", pause.as_millis()),
        );
        std::thread::sleep(pause); // stops this runtime: no renewal either
        log(start, who, "wakes up and writes, unaware");
    }
    let new_balance = balance + change;
    let rows = fenced_write(db, token, new_balance).await?;
    log(
        start,
        who,
        &if rows == 1 {
            format!("UPDATE balance = {new_balance}: 1 row, ACCEPTED")
        } else {
            format!("UPDATE balance = {new_balance}: {rows} rows, REJECTED (a newer holder wrote)")
        },
    );
    Ok((token, rows))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _redis) = support::redis_url();
    let pg = match PostgresServer::start() {
        Ok(pg) => pg,
        Err(e) => {
            eprintln!("This example needs the PostgreSQL server binaries: {e}");
            std::process::exit(2);
        }
    };
    let conninfo = pg.url();
    println!(
        "private PostgreSQL on 127.0.0.1:{}, Redis at {url}\n",
        pg.port()
    );

    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let db = connect_db(&conninfo).await?;
        db.batch_execute(
            "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, \
             fence bigint NOT NULL DEFAULT 0)",
        )
        .await?;
        db.execute(
            "INSERT INTO accounts (id, balance) VALUES ($1, $2)",
            &[&ACCOUNT, &OPENING_BALANCE],
        )
        .await?;
        Ok::<_, AppError>(())
    })?;
    let start = Instant::now();

    // Client A: its own thread and single-threaded runtime, so its freeze stops
    // everything it runs, as a process-wide pause would.
    let (a_url, a_conninfo) = (url.clone(), conninfo.clone());
    let (holding_tx, holding_rx) = std::sync::mpsc::channel();
    let client_a = std::thread::spawn(move || -> Result<String, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let locks = connect_locks(&a_url).await.map_err(|e| e.to_string())?;
            let db = connect_db(&a_conninfo).await.map_err(|e| e.to_string())?;
            let _ = holding_tx.send(());
            let outcome = update_balance(
                &locks,
                &db,
                "client A",
                DEPOSIT,
                Duration::from_millis(900),
                start,
            )
            .await;
            Ok(match outcome {
                Ok((_, 1)) => "finished, write accepted".to_owned(),
                Ok((_, _)) => "finished, write rejected".to_owned(),
                Err(AppError::Lock(e)) => format!("returned Err({e})"),
                Err(e) => format!("failed: {e}"),
            })
        })
    });

    let (b_token, b_rows, db) = rt.block_on(async {
        let locks = connect_locks(&url).await?;
        let db = connect_db(&conninfo).await?;
        holding_rx.recv().map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(50)).await; // let A take the lock first
        log(start, "client B", "waits for the lock");
        let (token, rows) =
            update_balance(&locks, &db, "client B", -WITHDRAWAL, Duration::ZERO, start).await?;
        Ok::<_, Box<dyn std::error::Error>>((token, rows, db))
    })?;
    let a_outcome = client_a.join().map_err(|_| "client A panicked")??;
    log(start, "client A", &a_outcome);

    let (balance, fence) = rt.block_on(read(&db))?;
    let expected = OPENING_BALANCE - WITHDRAWAL;
    println!("\nThe row holds balance {balance}, fence {fence} (client B's token: {b_token}).");
    if b_rows == 1 && balance == expected && u64::try_from(fence).ok() == Some(b_token) {
        println!("The stale holder's write was rejected by PostgreSQL; B's withdrawal stands.");
        Ok(())
    } else {
        Err(format!("the stale write got through: balance {balance}, expected {expected}").into())
    }
}

async fn connect_locks(url: &str) -> Result<LockManager, LockError> {
    LockManager::builder(url)
        .key_prefix(format!("{}locks:", support::PREFIX))
        .build()
        .await
}

/// A connection whose driver task runs on the current runtime.
async fn connect_db(conninfo: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conninfo, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection: {e}");
        }
    });
    Ok(client)
}
