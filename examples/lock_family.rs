//! The lock family in one service: a semaphore caps calls to a partner API, a
//! read-write lock lets reports read a catalog while restocks write it, and a
//! multi-key lock moves stock between two bins all or nothing.
//!
//! Several "replicas" (managers, each with its own connections) run at once;
//! the example checks each guarantee as it goes and exits non-zero if one
//! fails.
//!
//! ```sh
//! cargo run --example lock_family
//! ```

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{distributed_lock, LockError, LockManager};

/// At most this many calls to the partner API at once, across all replicas.
const PARTNER_CALLS: u32 = 2;

#[derive(Default)]
struct Observed {
    partner_calls: AtomicUsize,
    most_partner_calls: AtomicUsize,
    readers: AtomicUsize,
    most_readers: AtomicUsize,
    writer_saw_readers: AtomicUsize,
}

fn note_max(now: usize, most: &AtomicUsize) {
    most.fetch_max(now, Ordering::SeqCst);
}

/// One permit of the `partner-api` semaphore per call.
#[distributed_lock(key = "partner-api", permits = 2, manager = manager, lease = "5s")]
async fn call_partner(manager: &LockManager, seen: &Observed) -> Result<(), LockError> {
    let now = seen.partner_calls.fetch_add(1, Ordering::SeqCst) + 1;
    note_max(now, &seen.most_partner_calls);
    tokio::time::sleep(Duration::from_millis(20)).await;
    seen.partner_calls.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Reports read the catalog together.
#[distributed_lock(key = "catalog", mode = "read", manager = manager)]
async fn report(manager: &LockManager, seen: &Observed) -> Result<(), LockError> {
    let now = seen.readers.fetch_add(1, Ordering::SeqCst) + 1;
    note_max(now, &seen.most_readers);
    tokio::time::sleep(Duration::from_millis(15)).await;
    seen.readers.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// A restock writes the catalog alone.
#[distributed_lock(key = "catalog", mode = "write", manager = manager)]
async fn restock(manager: &LockManager, seen: &Observed) -> Result<(), LockError> {
    if seen.readers.load(Ordering::SeqCst) > 0 {
        seen.writer_saw_readers.fetch_add(1, Ordering::SeqCst);
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

/// Moves one unit from bin `from` to bin `to`: both bins locked, in one global
/// order whatever the argument order, so opposite transfers cannot deadlock.
#[distributed_lock(key = ["bin:{from}", "bin:{to}"], manager = manager)]
async fn transfer(
    manager: &LockManager,
    redis: &mut redis::aio::MultiplexedConnection,
    from: &str,
    to: &str,
) -> Result<(), LockError> {
    // A read-modify-write of two counters: safe only because both are locked.
    let a: i64 = get(redis, from).await;
    let b: i64 = get(redis, to).await;
    tokio::task::yield_now().await;
    set(redis, from, a - 1).await;
    set(redis, to, b + 1).await;
    Ok(())
}

async fn get(redis: &mut redis::aio::MultiplexedConnection, bin: &str) -> i64 {
    let value: Option<i64> = redis::cmd("GET")
        .arg(format!("{}stock:{bin}", support::PREFIX))
        .query_async(redis)
        .await
        .expect("GET");
    value.unwrap_or(0)
}

async fn set(redis: &mut redis::aio::MultiplexedConnection, bin: &str, value: i64) {
    redis::cmd("SET")
        .arg(format!("{}stock:{bin}", support::PREFIX))
        .arg(value)
        .query_async::<()>(redis)
        .await
        .expect("SET");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url();
    let seen = Arc::new(Observed::default());
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(
            LockManager::builder(&url)
                .key_prefix(support::PREFIX)
                .build()
                .await?,
        );
    }
    let client = redis::Client::open(url.as_str())?;
    let mut tasks = Vec::new();
    for (r, manager) in replicas.iter().enumerate() {
        for t in 0..4 {
            let (manager, seen) = (manager.clone(), seen.clone());
            let mut redis = client.get_multiplexed_async_connection().await?;
            tasks.push(tokio::spawn(async move {
                for i in 0..10 {
                    call_partner(&manager, &seen).await?;
                    report(&manager, &seen).await?;
                    if (r + t + i) % 5 == 0 {
                        restock(&manager, &seen).await?;
                    }
                    // Half the tasks move stock one way, half the other.
                    let (from, to) = if (r + t) % 2 == 0 {
                        ("a", "b")
                    } else {
                        ("b", "a")
                    };
                    transfer(&manager, &mut redis, from, to).await?;
                }
                Ok::<_, LockError>(())
            }));
        }
    }
    for task in tasks {
        task.await??;
    }
    let mut redis = client.get_multiplexed_async_connection().await?;
    let total = get(&mut redis, "a").await + get(&mut redis, "b").await;
    let most_calls = seen.most_partner_calls.load(Ordering::SeqCst);
    println!(
        "partner API: at most {most_calls} calls at once (limit {PARTNER_CALLS}); \
         reports: up to {} at once; restocks that saw a reader: {}; \
         stock a + b = {total} (started at 0)",
        seen.most_readers.load(Ordering::SeqCst),
        seen.writer_saw_readers.load(Ordering::SeqCst),
    );
    let ok = most_calls <= PARTNER_CALLS as usize
        && seen.writer_saw_readers.load(Ordering::SeqCst) == 0
        && total == 0;
    for key in ["a", "b"] {
        redis::cmd("DEL")
            .arg(format!("{}stock:{key}", support::PREFIX))
            .query_async::<()>(&mut redis)
            .await?;
    }
    for manager in &replicas {
        manager.shutdown().await?;
    }
    if !ok {
        eprintln!("a guarantee was broken");
        std::process::exit(1);
    }
    Ok(())
}
