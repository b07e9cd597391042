//! `uncontended-postgres`: one task, acquire + release of one key, each
//! implementation on its own connection; 20,000 cycles each in interleaved blocks
//! of 1,000, the bench and the server's processes on one CPU (see `pin.rs`):
//! the runner of [`super::interleaved`].

use sqlx::postgres::PgAdvisoryLock;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use super::interleaved::{self, Cycle, Pass, Plan, Unit, WarmUp};
use super::lease::LeaseSql;
use super::{call_one, connect, server_note, sqlx_connect, PgEnv, LEASE_SECS};
use crate::error::{bail, Result};
use crate::report::{Better, Check, ScenarioResult, Target};

pub const ADVISORY_FLOOR: &str = "advisory floor (pg_try_advisory_lock + unlock)";
pub const LEASE_FLOOR: &str = "lease-row floor (upsert + free, by hand)";
pub const SAME_SQL: &str = "distlock's SQL by hand (prepared)";
pub const SAME_SQL_UNNAMED: &str = "distlock's SQL by hand (unnamed statements)";
pub const SQLX: &str = "sqlx 0.8 PgAdvisoryLock";
pub const DISTLOCK: &str = "distlock (LockManager::builder(\"postgres://...\"))";
pub const DISTLOCK_PREPARED: &str = "distlock, postgres_prepared_statements(true)";
const KEY: &str = "bench:uncontended";
/// An owner token of distlock's length (the function stores it, never reads it).
const SAME_SQL_OWNER: &str = "0123456789abcdef0123456789abcdef";

/// One implementation's cycle on its own connection, and the backend serving it
/// (for its CPU time).
pub enum PgCycler {
    Advisory {
        client: Client,
        lock: Statement,
        unlock: Statement,
        key: i64,
    },
    Lease {
        client: Client,
        sql: LeaseSql,
        key: String,
        owner: String,
    },
    /// distlock's own statements (`acquire` and `release` of its schema, with
    /// the parameters it sends for an uncontended cycle) on one connection:
    /// prepared once, as a hand-written client would, or unnamed (parsed with
    /// each call), as distlock sends them so that transaction-mode poolers work.
    SameSql {
        client: Client,
        prepared: Option<(Statement, Statement)>,
        owner: String,
    },
    Sqlx {
        conn: sqlx::PgConnection,
        lock: PgAdvisoryLock,
    },
    Distlock {
        manager: distlock::LockManager,
    },
}

impl PgCycler {
    pub async fn advisory(url: &str, key: i64) -> Result<(PgCycler, u32)> {
        let client = connect(url, "lock-bench-advisory").await?;
        let lock = client.prepare("SELECT pg_try_advisory_lock($1)").await?;
        let unlock = client.prepare("SELECT pg_advisory_unlock($1)").await?;
        let pid = backend_pid(&client).await?;
        Ok((
            PgCycler::Advisory {
                client,
                lock,
                unlock,
                key,
            },
            pid,
        ))
    }

    pub async fn lease(url: &str, key: &str, owner: &str) -> Result<(PgCycler, u32)> {
        let client = connect(url, "lock-bench-lease").await?;
        let sql = LeaseSql::prepare(&client).await?;
        let pid = backend_pid(&client).await?;
        Ok((
            PgCycler::Lease {
                client,
                sql,
                key: key.to_owned(),
                owner: owner.to_owned(),
            },
            pid,
        ))
    }

    pub async fn same_sql(url: &str, prepared: bool, owner: &str) -> Result<(PgCycler, u32)> {
        let (client, prepared, pid) = super::same_sql_client(
            url,
            "lock-bench-same-sql",
            prepared,
            (SAME_SQL_ACQUIRE, SAME_SQL_RELEASE),
        )
        .await?;
        Ok((
            PgCycler::SameSql {
                client,
                prepared,
                owner: owner.to_owned(),
            },
            pid,
        ))
    }

    pub async fn sqlx(url: &str, key: &str) -> Result<(PgCycler, u32)> {
        let mut conn = sqlx_connect(url, "lock-bench-sqlx").await?;
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await?;
        Ok((
            PgCycler::Sqlx {
                conn,
                lock: PgAdvisoryLock::new(key),
            },
            u32::try_from(pid)?,
        ))
    }

    /// distlock has no connection of its own to name: its backend's CPU is not
    /// measured (pid 0 reads as unmeasured).
    pub async fn distlock(url: &str, prepared: bool) -> Result<(PgCycler, u32)> {
        Ok((
            PgCycler::Distlock {
                manager: super::distlock_manager_with(url, prepared).await?,
            },
            0,
        ))
    }
}

impl Cycle for PgCycler {
    /// Acquire + release; `false` when the try found the lock held (the floors
    /// only: sqlx's `acquire` waits).
    async fn cycle(&mut self) -> Result<bool> {
        match self {
            PgCycler::Advisory {
                client,
                lock,
                unlock,
                key,
            } => {
                let got: bool = client.query_one(&*lock, &[&*key]).await?.get(0);
                if got {
                    let freed: bool = client.query_one(&*unlock, &[&*key]).await?.get(0);
                    if !freed {
                        bail!("pg_advisory_unlock found the lock not held");
                    }
                }
                Ok(got)
            }
            PgCycler::Lease {
                client,
                sql,
                key,
                owner,
            } => match sql.acquire(client, key, owner, LEASE_SECS).await? {
                Some(token) => {
                    if !sql.release(client, key, owner, token).await? {
                        bail!("the lease-row floor lost a hold it had just taken");
                    }
                    Ok(true)
                }
                None => Ok(false),
            },
            PgCycler::SameSql {
                client,
                prepared,
                owner,
            } => {
                let since = super::epoch_ms()?;
                let lease_ms = (LEASE_SECS * 1000.0) as i64;
                let (fence, waiting, zero) = (false, false, 0i64);
                let acquire: [(&(dyn ToSql + Sync), Type); 12] = [
                    (&SAME_SQL_NAME, Type::TEXT),
                    (&*owner, Type::TEXT),
                    (&lease_ms, Type::INT8),
                    (&fence, Type::BOOL),
                    (&waiting, Type::BOOL),
                    (&since, Type::INT8),
                    (&SAME_SQL_HOLDER, Type::TEXT),
                    (&zero, Type::INT8),
                    (&zero, Type::INT8),
                    (&SAME_SQL_ROUTE, Type::TEXT),
                    (&SAME_SQL_CHANNEL, Type::TEXT),
                    (&zero, Type::INT8),
                ];
                let statement = prepared.as_ref().map(|(acquire, _)| acquire);
                let row = call_one(client, statement, SAME_SQL_ACQUIRE, &acquire).await?;
                let status: i32 = row.get(0);
                if status != 1 {
                    return Ok(false);
                }
                let release: [(&(dyn ToSql + Sync), Type); 4] = [
                    (&SAME_SQL_NAME, Type::TEXT),
                    (&*owner, Type::TEXT),
                    (&zero, Type::INT8),
                    (&SAME_SQL_CHANNEL, Type::TEXT),
                ];
                let statement = prepared.as_ref().map(|(_, release)| release);
                let row = call_one(client, statement, SAME_SQL_RELEASE, &release).await?;
                if !row.get::<_, bool>(0) {
                    bail!("distlock's SQL by hand lost a hold it had just taken");
                }
                Ok(true)
            }
            PgCycler::Sqlx { conn, lock } => {
                let guard = lock.acquire(&mut *conn).await?;
                guard.release_now().await?;
                Ok(true)
            }
            PgCycler::Distlock { manager } => {
                manager.lock(KEY).acquire().await?.release().await?;
                Ok(true)
            }
        }
    }
}

/// distlock's statements as `lock-runtime/src/backend/postgres/mod.rs`
/// (`Sql::new`) writes them, in its default schema.
const SAME_SQL_ACQUIRE: &str = "SELECT o_status, o_token, o_remaining_ms FROM distlock.acquire(\
     $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";
const SAME_SQL_RELEASE: &str = "SELECT distlock.release($1, $2, $3, $4)";
/// What distlock sends for a lock nobody waits for: its full name, a holder
/// description, its manager's hand-off route and LISTEN channel.
const SAME_SQL_NAME: &str = "distlock:lock:{bench:same-sql}:bench:same-sql";
const SAME_SQL_HOLDER: &str = "lock-bench same-sql floor";
const SAME_SQL_ROUTE: &str = "0000000a";
const SAME_SQL_CHANNEL: &str = "distlock_00000000000000000000000000000000";

/// The pid of the backend serving `client`'s connection, for its CPU time.
pub async fn backend_pid(client: &Client) -> Result<u32> {
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    Ok(u32::try_from(pid)?)
}

pub async fn run(env: &PgEnv) -> Result<ScenarioResult> {
    // --quick: a lease-row cycle is two WAL flushes, several ms each on a busy
    // disk, and CI wants each pass under 10 s. Unlike the pass's other
    // one-task scenarios, its rows warm up on the one CPU, and its round trips
    // are counted over more cycles.
    let plan = Plan {
        warm_up: WarmUp::Pinned,
        rt_warmup: 20,
        rt_cycles: if env.quick { 20 } else { 200 },
        ..Plan::new(env.quick, (20, 300, 100), (1_000, 20_000, 1_000))
    };
    let (cycles, block) = (plan.cycles, plan.block);
    let labels = [
        ADVISORY_FLOOR,
        LEASE_FLOOR,
        SAME_SQL,
        SAME_SQL_UNNAMED,
        SQLX,
        DISTLOCK,
        DISTLOCK_PREPARED,
    ];
    let m = interleaved::run(env, labels.len(), plan, |i, url, pass| async move {
        // The round-trip pass's floors on an advisory key and a lease owner
        // apart from the timed pass's.
        let timed = pass == Pass::Timed;
        match i {
            0 => PgCycler::advisory(&url, if timed { 1 } else { 2 }).await,
            1 => {
                let owner = if timed {
                    "uncontended-owner"
                } else {
                    "uncontended-rt-owner"
                };
                PgCycler::lease(&url, KEY, owner).await
            }
            2 => PgCycler::same_sql(&url, true, SAME_SQL_OWNER).await,
            3 => PgCycler::same_sql(&url, false, SAME_SQL_OWNER).await,
            4 => PgCycler::sqlx(&url, KEY).await,
            5 => PgCycler::distlock(&url, false).await,
            _ => PgCycler::distlock(&url, true).await,
        }
    })
    .await?;
    let rows = labels
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let mut row = m.row(i, label, Unit::Op);
            m.push_costs(&mut row, i, Unit::Op);
            row.push(
                "busy %",
                m.busy[i] as f64 / m.ops[i].max(1) as f64 * 100.0,
                Better::Neutral,
            );
            row
        })
        .collect();
    Ok(ScenarioResult {
        name: "uncontended-postgres",
        title: format!(
            "one task, acquire + release of one key, {cycles} cycles per implementation in interleaved blocks of {block}"
        ),
        notes: vec![
            server_note(env),
            m.cpu_note,
            "backend cpu: utime + stime of the connection's backend process (clock ticks: coarse at --quick sizes); the WAL writer's and the kernel's flush work are not in it".to_owned(),
            "distlock's SQL by hand: its schema's acquire and release functions with the parameters it sends for an uncontended cycle, on one connection, prepared once (as a hand-written client would) or unnamed (parsed and planned with each call, as distlock sends them so that transaction-mode poolers work); the two rows' difference is what unnamed statements cost".to_owned(),
            "sqlx's acquire is a blocking pg_advisory_lock, its release pg_advisory_unlock: the advisory floor's two statements, unprepared by the caller but cached by sqlx; it is the last reference, so distlock's ratio to it is in its row".to_owned(),
            "distlock: backend cpu not measured (its connections are its own); its second row prepares its statements per connection (postgres_prepared_statements), for a direct connection or a session-mode pooler".to_owned(),
        ],
        rows,
        references: 5,
        // Each against its own SQL sent the same way: unnamed statements (the
        // default, which transaction-mode poolers take) and prepared ones.
        targets: vec![
            Target::ratio(
                "distlock p50 <= 1.10x its own SQL by hand (unnamed statements)",
                DISTLOCK,
                "p50 us",
                SAME_SQL_UNNAMED,
                Check::AtMost(1.10),
            ),
            Target::ratio(
                "distlock with prepared statements p50 <= 1.10x its own SQL by hand (prepared)",
                DISTLOCK_PREPARED,
                "p50 us",
                SAME_SQL,
                Check::AtMost(1.10),
            ),
        ],
    })
}
