//! `many-keys-postgres`: [`TASKS`] tasks, each cycle on a key drawn uniformly from
//! [`KEYS`]: throughput. Implementations alternate in 4 time slices of 0.75 s each,
//! rotating the order (`--quick`: one of 0.25 s).
//!
//! A session's advisory lock is re-entrant within the session, so the advisory
//! floor and sqlx need a connection per task (two tasks on one connection would
//! both "hold" a key). A lease row is owned by its owner string, not by the
//! connection, so the lease-row floor runs twice: a connection per task, and all
//! tasks pipelined on one connection (as one distlock manager would), where one
//! backend runs, and flushes, every commit in turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sqlx::postgres::PgAdvisoryLock;
use tokio_postgres::{Client, Statement};

use super::lease::LeaseSql;
use super::{connect, server_note, sqlx_connect, PgEnv, LEASE_SECS};
use crate::error::{bail, BoxError, Result};
use crate::report::{new_histogram, us, Better, Row, ScenarioResult};
use crate::scenarios::common::nanos;

const TASKS: usize = 16;
const KEYS: usize = 1_000;

const ADVISORY: &str = "advisory floor (a connection per task)";
const LEASE_EACH: &str = "lease-row floor (a connection per task)";
const LEASE_ONE: &str = "lease-row floor (one connection, pipelined)";
const SQLX: &str = "sqlx 0.8 PgAdvisoryLock (a connection per task)";
const DISTLOCK: &str = "distlock (one manager)";

/// One task's means of taking any of the keys.
enum Worker {
    Advisory {
        client: Client,
        lock: Statement,
        unlock: Statement,
    },
    Lease {
        client: Arc<Client>,
        sql: LeaseSql,
        owner: String,
        keys: Arc<Vec<String>>,
    },
    Sqlx {
        conn: sqlx::PgConnection,
        locks: Arc<Vec<PgAdvisoryLock>>,
    },
    Distlock {
        manager: distlock::LockManager,
        keys: Arc<Vec<String>>,
    },
}

impl Worker {
    /// Acquire + release of key `k`; `false` when a try found it held.
    async fn cycle(&mut self, k: usize) -> Result<bool> {
        match self {
            Worker::Advisory {
                client,
                lock,
                unlock,
            } => {
                // Keys 1,000,000 + k: apart from the other scenarios' advisory keys.
                let key = 1_000_000 + k as i64;
                let got: bool = client.query_one(&*lock, &[&key]).await?.get(0);
                if got {
                    client.query_one(&*unlock, &[&key]).await?;
                }
                Ok(got)
            }
            Worker::Lease {
                client,
                sql,
                owner,
                keys,
            } => {
                let key = &keys[k];
                match sql.acquire(client, key, owner, LEASE_SECS).await? {
                    Some(token) => {
                        if !sql.release(client, key, owner, token).await? {
                            bail!("the lease-row floor lost a hold it had just taken");
                        }
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
            Worker::Sqlx { conn, locks } => {
                let guard = locks[k].acquire(&mut *conn).await?;
                guard.release_now().await?;
                Ok(true)
            }
            Worker::Distlock { manager, keys } => {
                manager
                    .lock(keys[k].as_str())
                    .acquire()
                    .await?
                    .release()
                    .await?;
                Ok(true)
            }
        }
    }
}

async fn workers(env: &PgEnv, label: &str) -> Result<Vec<Worker>> {
    let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|k| format!("bench:mk:{k}")).collect());
    let mut out = Vec::new();
    match label {
        ADVISORY => {
            for _ in 0..TASKS {
                let client = connect(&env.url, "lock-bench-mk-advisory").await?;
                let lock = client.prepare("SELECT pg_try_advisory_lock($1)").await?;
                let unlock = client.prepare("SELECT pg_advisory_unlock($1)").await?;
                out.push(Worker::Advisory {
                    client,
                    lock,
                    unlock,
                });
            }
        }
        LEASE_EACH | LEASE_ONE => {
            let mut shared = None;
            for t in 0..TASKS {
                let (client, sql) = match (&shared, label) {
                    (Some(s), LEASE_ONE) => Clone::clone(s),
                    _ => {
                        let client = Arc::new(connect(&env.url, "lock-bench-mk-lease").await?);
                        let sql = LeaseSql::prepare(&client).await?;
                        shared = Some((client.clone(), sql.clone()));
                        (client, sql)
                    }
                };
                out.push(Worker::Lease {
                    client,
                    sql,
                    owner: format!("mk-owner-{t}"),
                    keys: keys.clone(),
                });
            }
        }
        SQLX => {
            let locks = Arc::new(keys.iter().map(PgAdvisoryLock::new).collect::<Vec<_>>());
            for _ in 0..TASKS {
                out.push(Worker::Sqlx {
                    conn: sqlx_connect(&env.url, "lock-bench-mk-sqlx").await?,
                    locks: locks.clone(),
                });
            }
        }
        DISTLOCK => {
            let manager = super::distlock_manager(&env.url).await?;
            for _ in 0..TASKS {
                out.push(Worker::Distlock {
                    manager: manager.clone(),
                    keys: keys.clone(),
                });
            }
        }
        other => bail!("many-keys-postgres: no implementation {other:?}"),
    }
    Ok(out)
}

/// One task's figures over one slice.
struct Slice {
    hist: Histogram<u64>,
    ops: u64,
    busy: u64,
}

/// Every worker cycles random keys until `length` has passed.
async fn slice(
    workers: Vec<Worker>,
    length: Duration,
    seed: u64,
) -> Result<(Vec<Worker>, Vec<Slice>)> {
    let deadline = Instant::now() + length;
    let mut tasks = Vec::new();
    for (t, mut w) in workers.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed * 1_000 + t as u64);
            let mut s = Slice {
                hist: new_histogram()?,
                ops: 0,
                busy: 0,
            };
            while Instant::now() < deadline {
                let t0 = Instant::now();
                if w.cycle(rng.usize(..KEYS)).await? {
                    s.hist.saturating_record(nanos(t0.elapsed()));
                    s.ops += 1;
                } else {
                    s.busy += 1;
                }
            }
            Ok::<_, BoxError>((w, s))
        }));
    }
    let mut back = Vec::new();
    let mut slices = Vec::new();
    for t in tasks {
        let (w, s) = t.await??;
        back.push(w);
        slices.push(s);
    }
    Ok((back, slices))
}

pub async fn run(env: &PgEnv) -> Result<ScenarioResult> {
    let (slices, length) = if env.quick {
        (1, Duration::from_millis(250))
    } else {
        (4, Duration::from_millis(750))
    };
    // The first three are the references: distlock's row shows its ratio to each.
    let labels = [ADVISORY, LEASE_EACH, SQLX, LEASE_ONE, DISTLOCK];
    let mut pools: Vec<Option<Vec<Worker>>> = Vec::new();
    for label in labels {
        pools.push(Some(workers(env, label).await?));
    }
    let n = labels.len();
    let mut hist: Vec<Histogram<u64>> = (0..n).map(|_| new_histogram()).collect::<Result<_>>()?;
    let mut ops = vec![0u64; n];
    let mut busy = vec![0u64; n];
    let mut seconds = vec![0.0; n];
    for round in 0..slices {
        for k in 0..n {
            let i = (k + round) % n;
            let Some(w) = pools[i].take() else {
                bail!("workers lost by an earlier failure");
            };
            let started = Instant::now();
            let (w, got) = slice(w, length, (round * n + i) as u64).await?;
            seconds[i] += started.elapsed().as_secs_f64();
            for s in got {
                hist[i].add(s.hist)?;
                ops[i] += s.ops;
                busy[i] += s.busy;
            }
            pools[i] = Some(w);
        }
    }
    let mut rows = Vec::new();
    for i in 0..n {
        let mut row = Row::new(labels[i]);
        row.push("cycles/s", ops[i] as f64 / seconds[i], Better::Higher)
            .push("p50 us", us(hist[i].value_at_quantile(0.50)), Better::Lower)
            .push("p99 us", us(hist[i].value_at_quantile(0.99)), Better::Lower)
            .push(
                "busy %",
                busy[i] as f64 * 100.0 / (ops[i] + busy[i]).max(1) as f64,
                Better::Neutral,
            );
        row.histogram = Some(hist[i].clone());
        rows.push(row);
    }
    Ok(ScenarioResult {
        name: "many-keys-postgres",
        title: format!(
            "{TASKS} tasks, each cycle on a random key of {KEYS}; {slices} interleaved slice(s) of {:.2} s per implementation",
            length.as_secs_f64()
        ),
        notes: vec![
            server_note(env),
            "busy %: tries that found the key held (the floors then draw another key); sqlx's and distlock's acquire wait instead".to_owned(),
            "not confined to one CPU: throughput needs both".to_owned(),
            "distlock: the 16 tasks on one manager (its one data connection, pipelined), as a service's process would run them".to_owned(),
        ],
        rows,
        references: 3,
        targets: Vec::new(),
    })
}
