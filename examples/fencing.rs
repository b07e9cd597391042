//! Why fencing tokens matter: a holder paused past its lease.
//!
//! Client A takes the lock on `report.pdf`, then freezes (a long GC pause, a
//! stopped VM: here a blocking sleep that stops its whole runtime, renewal
//! included) for three times its lease. Its lease runs out in Redis; client B
//! takes the lock and writes. When A wakes up, nothing about the lock can stop
//! the write it was about to make: it finds out about the loss only when it
//! next looks. (The default `on_lost = "abort"` drops the body at its next
//! `.await`, but the first poll of that `.await` has already sent the write;
//! this example uses `on_lost = "ignore"` to show the write plainly.) The
//! storage stops it, because A's fencing token is lower than the one B wrote
//! with.
//!
//! ```sh
//! cargo run --example fencing
//! ```

mod support;

use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager};

/// Storage that remembers the highest fencing token it has seen and rejects
/// writes that carry a lower one: one Lua script, so check and write are atomic.
#[derive(Clone)]
struct FencedStore {
    redis: redis::aio::MultiplexedConnection,
    key: String,
}

const FENCED_WRITE: &str = r"
-- KEYS[1] the store (hash); ARGV[1] fencing token; ARGV[2] field; ARGV[3] value
-- Returns 1 when written, 0 when rejected as stale.
local highest = tonumber(redis.call('HGET', KEYS[1], '__highest_token') or '0')
if tonumber(ARGV[1]) < highest then
  return 0
end
redis.call('HSET', KEYS[1], '__highest_token', ARGV[1], ARGV[2], ARGV[3])
return 1
";

impl FencedStore {
    async fn write(&self, token: u64, field: &str, value: &str) -> Result<bool, StoreError> {
        let accepted: i64 = redis::Script::new(FENCED_WRITE)
            .key(&self.key)
            .arg(token)
            .arg(field)
            .arg(value)
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(accepted == 1)
    }

    async fn read(&self, field: &str) -> Result<Option<String>, StoreError> {
        Ok(redis::cmd("HGET")
            .arg(&self.key)
            .arg(field)
            .query_async(&mut self.redis.clone())
            .await?)
    }
}

#[derive(Debug, thiserror::Error)]
enum StoreError {
    #[error("lock: {0}")]
    Lock(#[from] LockError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

fn log(start: Instant, who: &str, what: &str) {
    println!("{:>6} ms  {who}: {what}", start.elapsed().as_millis());
}

/// Writes the report under the lock; `pause` freezes the whole thread first.
#[distributed_lock(
    key = "file:report.pdf",
    lease = "300ms",
    guard = lock,
    manager = locks,
    on_lost = "ignore"
)]
async fn write_report(
    locks: &LockManager,
    store: &FencedStore,
    who: &str,
    pause: Duration,
    start: Instant,
) -> Result<bool, StoreError> {
    log(
        start,
        who,
        &format!(
            "holds the lock, fencing token {}",
            lock.fencing_token().await?
        ),
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
    let accepted = store
        .write(lock.fencing_token().await?, "content", who)
        .await?;
    log(
        start,
        who,
        if accepted {
            "write ACCEPTED"
        } else {
            "write REJECTED by the store: stale token"
        },
    );
    Ok(accepted)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url();
    let start = Instant::now();
    let store_key = format!("{}fencing:store", support::PREFIX);

    // Client A: its own thread and single-threaded runtime, so its freeze stops
    // everything it runs, as a process-wide pause would.
    let (a_url, a_key) = (url.clone(), store_key.clone());
    let (holding_tx, holding_rx) = std::sync::mpsc::channel();
    let client_a = std::thread::spawn(move || -> Result<String, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let (locks, store) = connect(&a_url, &a_key).await.map_err(|e| e.to_string())?;
            let _ = redis::cmd("DEL")
                .arg(&a_key)
                .query_async::<()>(&mut store.redis.clone())
                .await;
            let _ = holding_tx.send(());
            let outcome = write_report(
                &locks,
                &store,
                "client A",
                Duration::from_millis(900),
                start,
            )
            .await;
            Ok(match outcome {
                Ok(true) => "finished, write accepted".to_owned(),
                Ok(false) => "finished, write rejected".to_owned(),
                Err(StoreError::Lock(e)) => format!("returned Err({e})"),
                Err(e) => format!("failed: {e}"),
            })
        })
    });

    let rt = tokio::runtime::Runtime::new()?;
    let b_accepted = rt.block_on(async {
        let (locks, store) = connect(&url, &store_key).await?;
        holding_rx.recv().map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(20)).await; // let A take the lock first
        log(start, "client B", "waits for the lock");
        let accepted = write_report(&locks, &store, "client B", Duration::ZERO, start).await;
        let accepted = accepted?;
        Ok::<_, Box<dyn std::error::Error>>((accepted, store))
    })?;
    let a_outcome = client_a.join().map_err(|_| "client A panicked")??;
    log(start, "client A", &a_outcome);

    let (b_ok, store) = b_accepted;
    let content = rt.block_on(store.read("content"))?;
    println!(
        "\nThe store holds the content written by: {}",
        content.as_deref().unwrap_or("nobody")
    );
    if b_ok && content.as_deref() == Some("client B") {
        println!("The stale holder's write was fenced off.");
        Ok(())
    } else {
        Err("the stale write got through".into())
    }
}

async fn connect(
    url: &str,
    store_key: &str,
) -> Result<(LockManager, FencedStore), Box<dyn std::error::Error>> {
    let locks = LockManager::builder(url)
        .key_prefix(format!("{}locks:", support::PREFIX))
        .build()
        .await?;
    let redis = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    Ok((
        locks,
        FencedStore {
            redis,
            key: store_key.to_owned(),
        },
    ))
}
