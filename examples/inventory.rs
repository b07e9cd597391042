//! The classic stock race, across real OS processes.
//!
//! 100 units in stock; 4 processes x 50 tasks each try to buy one with
//! GET stock, check it, then SET stock - 1. The run happens twice: without a
//! lock, where buyers read the same count and the shop oversells, and with
//! `#[distributed_lock]`, where exactly the stock is sold.
//!
//! ```sh
//! cargo run --example inventory                                  # 4 x 50 buyers, 100 units
//! cargo run --example inventory -- --processes 2 --tasks 10 --stock 5
//! ```
//!
//! The example re-executes itself as the worker processes.

// The expansion of #[distributed_lock] must not trip any lint in user code.
#![deny(warnings, clippy::all)]

mod support;

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

const WORKER_ENV: &str = "DISTLOCK_INVENTORY_WORKER";

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error("lock: {0}")]
    Lock(#[from] LockError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

fn stock_key(item: &str) -> String {
    format!("{}stock:{item}", support::PREFIX)
}

fn sold_key(item: &str) -> String {
    format!("{}sold:{item}", support::PREFIX)
}

/// Check-then-act: correct in one process, wrong across many.
async fn buy(item: &str, redis: &mut MultiplexedConnection) -> Result<bool, ShopError> {
    let stock: i64 = redis.get(stock_key(item)).await?;
    if stock <= 0 {
        return Ok(false);
    }
    // The work between the check and the write (payment, reservation...).
    tokio::time::sleep(Duration::from_millis(1)).await;
    let () = redis.set(stock_key(item), stock - 1).await?;
    let _: i64 = redis.incr(sold_key(item), 1).await?;
    Ok(true)
}

/// The same purchase, one buyer per item at a time across every process.
#[distributed_lock(key = "stock:{item}", lease = "5s", wait = "60s")]
async fn buy_locked(item: &str, redis: &mut MultiplexedConnection) -> Result<bool, ShopError> {
    buy(item, redis).await
}

struct Settings {
    processes: usize,
    tasks: usize,
    stock: i64,
}

fn settings() -> Result<Settings, String> {
    let mut s = Settings {
        processes: 4,
        tasks: 50,
        stock: 100,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = |name: &str| -> Result<i64, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .filter(|v| *v > 0)
                .ok_or_else(|| format!("{name} needs a positive number"))
        };
        match flag.as_str() {
            "--processes" => s.processes = value("--processes")? as usize,
            "--tasks" => s.tasks = value("--tasks")? as usize,
            "--stock" => s.stock = value("--stock")?,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; use --processes N --tasks N --stock N"
                ))
            }
        }
    }
    Ok(s)
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match std::env::var(WORKER_ENV) {
        Ok(mode) => worker(&mode).await,
        Err(_) => coordinator().await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("inventory: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One worker process: `tasks` buyers, with or without the lock.
async fn worker(mode: &str) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL")?;
    let tasks: usize = std::env::var("DISTLOCK_INVENTORY_TASKS")?.parse()?;
    let manager = LockManager::builder(&url)
        .key_prefix(format!("{}locks:", support::PREFIX))
        .build()
        .await?;
    // Locked functions without `manager = ...` use the global manager.
    distlock::set_global(manager)?;
    let client = redis::Client::open(url.as_str())?;
    let mut buyers = Vec::new();
    for _ in 0..tasks {
        let mut redis = client.get_multiplexed_async_connection().await?;
        let locked = mode == "locked";
        buyers.push(tokio::spawn(async move {
            if locked {
                buy_locked("widget", &mut redis).await
            } else {
                buy("widget", &mut redis).await
            }
        }));
    }
    for buyer in buyers {
        buyer.await??;
    }
    Ok(ExitCode::SUCCESS)
}

struct Outcome {
    sold: i64,
    left: i64,
    took: Duration,
}

async fn coordinator() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let settings = settings()?;
    let (url, _server) = support::redis_url();
    let client = redis::Client::open(url.as_str())?;
    let mut redis = client.get_multiplexed_async_connection().await?;

    println!(
        "{} units in stock; {} processes x {} buyers each try to buy one.\n",
        settings.stock, settings.processes, settings.tasks
    );
    let mut outcomes = Vec::new();
    for mode in ["unlocked", "locked"] {
        let () = redis.set(stock_key("widget"), settings.stock).await?;
        let () = redis.set(sold_key("widget"), 0).await?;
        let started = Instant::now();
        let exe = std::env::current_exe()?;
        let mut workers = Vec::new();
        for _ in 0..settings.processes {
            workers.push(
                Command::new(&exe)
                    .env(WORKER_ENV, mode)
                    .env("REDIS_URL", &url)
                    .env("DISTLOCK_INVENTORY_TASKS", settings.tasks.to_string())
                    .spawn()?,
            );
        }
        for mut w in workers {
            let status = tokio::task::spawn_blocking(move || w.wait()).await??;
            if !status.success() {
                return Err(format!("a {mode} worker failed: {status}").into());
            }
        }
        outcomes.push(Outcome {
            sold: redis.get(sold_key("widget")).await?,
            left: redis.get(stock_key("widget")).await?,
            took: started.elapsed(),
        });
    }
    let _: () = redis
        .del(&[stock_key("widget"), sold_key("widget")])
        .await?;

    println!(
        "{:<22}{:>6}{:>10}{:>12}{:>10}",
        "run", "sold", "oversold", "stock left", "time"
    );
    for (name, o) in ["without a lock", "#[distributed_lock]"]
        .iter()
        .zip(&outcomes)
    {
        println!(
            "{:<22}{:>6}{:>10}{:>12}{:>9.2}s",
            name,
            o.sold,
            (o.sold - settings.stock).max(0),
            o.left,
            o.took.as_secs_f64()
        );
    }
    let expected = settings
        .stock
        .min((settings.processes * settings.tasks) as i64);
    let locked = &outcomes[1];
    if locked.sold == expected && locked.left == settings.stock - expected {
        println!("\nWith the lock: exactly {expected} sold, 0 oversold.");
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "\nWith the lock: {} sold where {expected} were expected!",
            locked.sold
        );
        Ok(ExitCode::FAILURE)
    }
}
