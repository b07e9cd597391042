//! `lock-all-postgres`: one task takes 4 keys and frees them, each implementation
//! on its own connection (manager); cycles in interleaved blocks, the bench and
//! the server's processes on one CPU (see `pin.rs`), as `uncontended.rs`: the
//! runner of [`super::interleaved`].
//!
//! * **distlock's SQL by hand**: its schema's `acquire_all` function with the
//!   parameters `lock_all` sends (one call takes the 4 locks, all or none), then
//!   the 4 `release` calls pipelined on the connection, each its own transaction,
//!   as `release_many` sends them; prepared once, and again as unnamed statements
//!   (parsed with each call, as distlock sends them). The floor of the target.
//! * **distlock `lock_all`**: `manager.lock_all(keys).acquire()`, then the
//!   guard's `release()`.
//! * **distlock, 4 single locks**: `manager.lock(k).acquire()` for each key in
//!   sequence, then their releases in sequence: what `lock_all` saves.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use super::interleaved::{self, Cycle, Plan, Unit};
use super::{call_one, server_note, PgEnv, LEASE_SECS};
use crate::error::{bail, BoxError, Result};
use crate::report::{Check, ScenarioResult, Target};

const SAME_SQL: &str = "distlock's SQL by hand (acquire_all + 4 releases, prepared)";
const SAME_SQL_UNNAMED: &str =
    "distlock's SQL by hand (acquire_all + 4 releases, unnamed statements)";
const DISTLOCK_ALL: &str = "distlock lock_all (4 keys)";
const DISTLOCK_SINGLES: &str = "distlock, 4 single locks in sequence";

/// Keys per cycle.
const KEYS: usize = 4;

/// The schema distlock's managers use by default, and its statements as
/// `lock-runtime/src/backend/postgres/mod.rs` (`Sql::new`) writes them.
const ACQUIRE_ALL: &str = "SELECT o_status, o_index, o_remaining_ms, o_tokens \
     FROM distlock.acquire_all($1, $2, $3, $4, $5, $6, $7, $8)";
const RELEASE: &str = "SELECT distlock.release($1, $2, $3, $4, $5)";
/// One owner token for the 4 holds (the locks of one call share it), of
/// distlock's length; a holder description, the holder's manager's LISTEN
/// channel and a wake-up channel of `channel_ident`'s form (placeholders:
/// nothing listens on them).
const OWNER: &str = "0123456789abcdef0123456789abcdef";
const HOLDER: &str = "lock-bench lock-all floor";
const HANDOFF_CHANNEL: &str = "distlock_00000000000000000000000000000000";
const WAKE_CHANNEL: &str = "distlock_11111111111111111111111111111111";

/// The keys of one implementation, sorted (as `lock_all` sorts them).
fn keys(tag: &str) -> Vec<String> {
    (0..KEYS)
        .map(|i| format!("bench:lock-all:{tag}:{i}"))
        .collect()
}

/// One implementation's cycle on its own connection (manager).
enum Cycler {
    /// The full lock names, as distlock writes them in its `locks` table.
    SameSql {
        client: Client,
        prepared: Option<(Statement, Statement)>,
        names: Vec<String>,
    },
    All {
        manager: distlock::LockManager,
        keys: Vec<String>,
    },
    Singles {
        manager: distlock::LockManager,
        keys: Vec<String>,
    },
}

impl Cycler {
    async fn same_sql(url: &str, prepared: bool) -> Result<(Cycler, u32)> {
        let (client, prepared, pid) = super::same_sql_client(
            url,
            "lock-bench-lock-all-sql",
            prepared,
            (ACQUIRE_ALL, RELEASE),
        )
        .await?;
        let tag = if prepared.is_some() {
            "sql"
        } else {
            "sql-unnamed"
        };
        let names = keys(tag)
            .into_iter()
            .map(|k| format!("distlock:lock:{{{k}}}:{k}"))
            .collect();
        Ok((
            Cycler::SameSql {
                client,
                prepared,
                names,
            },
            pid,
        ))
    }

    /// distlock has no connection of its own to name: its backend's CPU is not
    /// measured (pid 0 reads as unmeasured).
    async fn all(url: &str) -> Result<(Cycler, u32)> {
        Ok((
            Cycler::All {
                manager: super::distlock_manager(url).await?,
                keys: keys("all"),
            },
            0,
        ))
    }

    async fn singles(url: &str) -> Result<(Cycler, u32)> {
        Ok((
            Cycler::Singles {
                manager: super::distlock_manager(url).await?,
                keys: keys("singles"),
            },
            0,
        ))
    }
}

impl Cycle for Cycler {
    /// Takes the 4 keys and frees them (never busy: the keys are the row's own).
    async fn cycle(&mut self) -> Result<bool> {
        match self {
            Cycler::SameSql {
                client,
                prepared,
                names,
            } => {
                let since = super::epoch_ms()?;
                let lease_ms = (LEASE_SECS * 1000.0) as i64;
                let (fence, zero, events) = (false, 0i64, "");
                let acquire: [(&(dyn ToSql + Sync), Type); 8] = [
                    (&*names, Type::TEXT_ARRAY),
                    (&OWNER, Type::TEXT),
                    (&lease_ms, Type::INT8),
                    (&fence, Type::BOOL),
                    (&since, Type::INT8),
                    (&HOLDER, Type::TEXT),
                    (&HANDOFF_CHANNEL, Type::TEXT),
                    (&events, Type::TEXT),
                ];
                let statement = prepared.as_ref().map(|(acquire, _)| acquire);
                let row = call_one(client, statement, ACQUIRE_ALL, &acquire).await?;
                if row.get::<_, i32>(0) != 1 {
                    bail!("distlock's acquire_all by hand found a lock of its own keys busy");
                }
                // Pipelined: every call is sent before the first answer is read.
                let releases = names.iter().map(|name| {
                    let (client, prepared) = (&*client, &*prepared);
                    async move {
                        let params: [(&(dyn ToSql + Sync), Type); 5] = [
                            (name, Type::TEXT),
                            (&OWNER, Type::TEXT),
                            (&zero, Type::INT8),
                            (&WAKE_CHANNEL, Type::TEXT),
                            (&events, Type::TEXT),
                        ];
                        let statement = prepared.as_ref().map(|(_, release)| release);
                        let row = call_one(client, statement, RELEASE, &params).await?;
                        Ok::<bool, BoxError>(row.get::<_, bool>(0))
                    }
                });
                for freed in futures_util::future::join_all(releases).await {
                    if !freed? {
                        bail!("distlock's SQL by hand lost a hold it had just taken");
                    }
                }
                Ok(true)
            }
            Cycler::All { manager, keys } => {
                manager
                    .lock_all(keys.iter())
                    .acquire()
                    .await?
                    .release()
                    .await?;
                Ok(true)
            }
            Cycler::Singles { manager, keys } => {
                let mut guards = Vec::with_capacity(keys.len());
                for key in keys.iter() {
                    guards.push(manager.lock(key.as_str()).acquire().await?);
                }
                for guard in guards {
                    guard.release().await?;
                }
                Ok(true)
            }
        }
    }
}

async fn cycler(i: usize, url: &str) -> Result<(Cycler, u32)> {
    match i {
        0 => Cycler::same_sql(url, true).await,
        1 => Cycler::same_sql(url, false).await,
        2 => Cycler::all(url).await,
        _ => Cycler::singles(url).await,
    }
}

pub async fn run(env: &PgEnv) -> Result<ScenarioResult> {
    // --quick: a cycle is 5 to 8 commits, each a WAL flush of several ms on a busy
    // disk (a distlock row's p50 reached 18 ms with other builds on the machine),
    // and CI wants the pass under 10 s.
    let plan = Plan::new(env.quick, (5, 60, 30), (200, 5_000, 500));
    let (cycles, block) = (plan.cycles, plan.block);
    let labels = [SAME_SQL, SAME_SQL_UNNAMED, DISTLOCK_ALL, DISTLOCK_SINGLES];
    let m = interleaved::run(env, labels.len(), plan, |i, url, _| async move {
        cycler(i, &url).await
    })
    .await?;
    let rows = labels
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let mut row = m.row(i, label, Unit::Cycle);
            m.push_costs(&mut row, i, Unit::Cycle);
            row
        })
        .collect();
    Ok(ScenarioResult {
        name: "lock-all-postgres",
        title: format!(
            "one task takes {KEYS} keys and frees them, {cycles} cycles per implementation in interleaved blocks of {block}"
        ),
        notes: vec![
            server_note(env),
            m.cpu_note,
            "distlock's SQL by hand: its schema's acquire_all function with the parameters lock_all sends (one call, one commit, takes the 4 locks or none), then the 4 release calls pipelined on the connection, each its own transaction and commit, as distlock's release_many sends them; prepared once, or unnamed (parsed with each call, as distlock sends them)".to_owned(),
            "4 single locks: 4 acquire calls then 4 release calls, in sequence: 8 round trips and 8 commits, against lock_all's 1 + 4 pipelined".to_owned(),
            "backend cpu: utime + stime of the connection's backend process (clock ticks: coarse at --quick sizes); distlock's not measured (its connections are its own)".to_owned(),
        ],
        rows,
        references: 2,
        // Against its SQL sent as distlock sends it by default (unnamed
        // statements, which transaction-mode poolers take).
        targets: vec![Target::ratio(
            "distlock lock_all p50 <= 1.10x its own SQL by hand (unnamed statements)",
            DISTLOCK_ALL,
            "p50 us",
            SAME_SQL_UNNAMED,
            Check::AtMost(1.10),
        )],
    })
}
