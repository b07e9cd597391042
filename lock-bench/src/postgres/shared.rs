//! `shared-postgres`: read-write locks and semaphores, one task, uncontended:
//! a read lock's acquire + release, a write lock's, and a semaphore's (4
//! permits, a hold of weight 2). Each implementation on its own connection
//! (manager); cycles in interleaved blocks, the bench and the server's
//! processes on one CPU (see `pin.rs`), as `uncontended.rs`: the runner of
//! [`super::interleaved`].
//!
//! * **distlock's SQL by hand**: its schema's `read_acquire`, `write_acquire`
//!   and `permit_acquire` functions, then `shared_release`, with the parameters
//!   distlock sends for an uncontended cycle (`lock-runtime/src/backend/postgres/
//!   shared.rs`): prepared once, and again as unnamed statements (parsed with
//!   each call, as distlock sends them by default). The floors of the targets.
//! * **distlock**: `read_lock(k)`, `write_lock(k)`, `semaphore(k, 4).weight(2)`,
//!   `acquire()` then the guard's `release()`; by default (unnamed statements)
//!   and with `postgres_prepared_statements(true)`, each against its like.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use super::interleaved::{self, Cycle, Plan, Unit};
use super::{call_one, server_note, PgEnv, DISTLOCK_SCHEMA, LEASE_SECS};
use crate::error::{bail, Result};
use crate::report::{us, Better, Check, ScenarioResult, Target};

/// The semaphore's permits, and the weight of each hold.
const PERMITS: u32 = 4;
const WEIGHT: u32 = 2;

/// What one cycle takes and frees.
#[derive(Clone, Copy, PartialEq)]
enum Hold {
    Read,
    Write,
    Permit,
}

impl Hold {
    fn name(self) -> &'static str {
        match self {
            Hold::Read => "read lock",
            Hold::Write => "write lock",
            Hold::Permit => "semaphore (weight 2 of 4)",
        }
    }

    /// The statement distlock's `SharedSql::new` writes, in its default schema.
    fn acquire_sql(self) -> &'static str {
        match self {
            Hold::Read => {
                "SELECT o_status, o_token, o_remaining_ms FROM distlock.read_acquire($1, $2, $3, $4, $5, $6, $7)"
            }
            Hold::Write => {
                "SELECT o_status, o_token, o_remaining_ms FROM distlock.write_acquire($1, $2, $3, $4, $5, $6, $7)"
            }
            Hold::Permit => {
                "SELECT o_status, o_token, o_remaining_ms FROM distlock.permit_acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
            }
        }
    }

    /// distlock's key names: the family's rows are under the writer's name
    /// (`rw`) for both sides of a read-write lock, the semaphore's (`sem`);
    /// its wake-up channel is the kind's `wake` name.
    fn kinds(self) -> (&'static str, &'static str) {
        match self {
            Hold::Read | Hold::Write => ("rw", "rwwake"),
            Hold::Permit => ("sem", "semwake"),
        }
    }

    /// The `kind` column of the hold (`kind_code`).
    fn code(self) -> &'static str {
        match self {
            Hold::Read => "r",
            Hold::Write => "w",
            Hold::Permit => "p",
        }
    }

    /// distlock takes a token at once for a read or permit hold (eager
    /// fencing), a writer's only when asked.
    fn fence(self) -> bool {
        self != Hold::Write
    }
}

const SHARED_RELEASE: &str = "SELECT distlock.shared_release($1, $2, $3, $4, $5)";

/// FNV-1a, 64 bits, from `basis`: distlock's hash tag and channel identifiers.
fn fnv1a(basis: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(basis, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `distlock:<kind>:{<tag>}:<key>`, as distlock names a key's rows and channels.
fn tagged(kind: &str, key: &str) -> String {
    let tag = fnv1a(0xcbf2_9ce4_8422_2325, key.as_bytes());
    format!("distlock:{kind}:{{{tag:016x}}}:{key}")
}

/// The PostgreSQL channel a logical channel of distlock's default schema is
/// notified on (`channel_ident`: the schema, `/`, the logical name, hashed).
fn channel_ident(logical: &str) -> String {
    let scoped = format!("{DISTLOCK_SCHEMA}/{logical}");
    let a = fnv1a(0xcbf2_9ce4_8422_2325, scoped.as_bytes());
    let b = fnv1a(0x6c62_272e_07bb_0142, scoped.as_bytes());
    format!("distlock_{a:016x}{b:016x}")
}

/// The holder description distlock writes by default (`default_holder`).
fn holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{} pid {} lock-bench", host.trim(), std::process::id())
}

/// A fresh owner token of distlock's shape: 32 hex digits, and a permit
/// hold's weight after a colon (`weight_of` reads it).
fn owner(hold: Hold) -> String {
    let token = format!("{:032x}", fastrand::u128(..));
    match hold {
        Hold::Permit => format!("{token}:{WEIGHT}"),
        _ => token,
    }
}

fn key(hold: Hold, by_hand: bool) -> String {
    let side = match hold {
        Hold::Read => "read",
        Hold::Write => "write",
        Hold::Permit => "permit",
    };
    let who = if by_hand { "sql" } else { "distlock" };
    format!("bench:shared:{who}:{side}")
}

/// One implementation's cycle on its own connection (manager).
// Twelve of them, each moved once per block: the size of a variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Cycler {
    SameSql {
        hold: Hold,
        client: Client,
        prepared: Option<(Statement, Statement)>,
        name: String,
        wake: String,
        holder: String,
    },
    Distlock {
        hold: Hold,
        manager: distlock::LockManager,
        key: String,
    },
}

impl Cycler {
    async fn same_sql(url: &str, hold: Hold, prepared: bool) -> Result<(Cycler, u32)> {
        let (client, prepared, pid) = super::same_sql_client(
            url,
            "lock-bench-shared-sql",
            prepared,
            (hold.acquire_sql(), SHARED_RELEASE),
        )
        .await?;
        let key = key(hold, true);
        let (rows, wake) = hold.kinds();
        Ok((
            Cycler::SameSql {
                hold,
                client,
                prepared,
                name: tagged(rows, &key),
                wake: channel_ident(&tagged(wake, &key)),
                holder: holder(),
            },
            pid,
        ))
    }

    /// distlock has no connection of its own to name: its backend's CPU is not
    /// measured (pid 0 reads as unmeasured).
    async fn distlock(url: &str, hold: Hold, prepared: bool) -> Result<(Cycler, u32)> {
        Ok((
            Cycler::Distlock {
                hold,
                manager: super::distlock_manager_with(url, prepared).await?,
                key: key(hold, false),
            },
            0,
        ))
    }
}

impl Cycle for Cycler {
    /// Takes the hold and frees it (never busy: the key is the row's own).
    async fn cycle(&mut self) -> Result<bool> {
        match self {
            Cycler::SameSql {
                hold,
                client,
                prepared,
                name,
                wake,
                holder,
            } => {
                // A fresh owner per acquisition, as distlock makes one.
                let owner = owner(*hold);
                let since = super::epoch_ms()?;
                let lease_ms = (LEASE_SECS * 1000.0) as i64;
                let (fence, waiting, resize) = (hold.fence(), false, false);
                let (permits, waiting_weight, keep) = (i64::from(PERMITS), 1i64, 0i64);
                let mut acquire: Vec<(&(dyn ToSql + Sync), Type)> = vec![
                    (&*name, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&lease_ms, Type::INT8),
                    (&fence, Type::BOOL),
                    (&waiting, Type::BOOL),
                ];
                if *hold == Hold::Permit {
                    acquire.extend([
                        (&permits as &(dyn ToSql + Sync), Type::INT8),
                        (&resize, Type::BOOL),
                        (&since, Type::INT8),
                        (&*holder, Type::TEXT),
                        (&waiting_weight, Type::INT8),
                    ]);
                } else {
                    acquire.extend([
                        (&since as &(dyn ToSql + Sync), Type::INT8),
                        (&*holder, Type::TEXT),
                    ]);
                }
                let statement = prepared.as_ref().map(|(acquire, _)| acquire);
                let row = call_one(client, statement, hold.acquire_sql(), &acquire).await?;
                if row.get::<_, i32>(0) != 1 {
                    bail!("distlock's SQL by hand found its {} busy", hold.name());
                }
                let code = hold.code();
                let release: [(&(dyn ToSql + Sync), Type); 5] = [
                    (&*name, Type::TEXT),
                    (&code, Type::TEXT),
                    (&owner, Type::TEXT),
                    (&keep, Type::INT8),
                    (&*wake, Type::TEXT),
                ];
                let statement = prepared.as_ref().map(|(_, release)| release);
                let row = call_one(client, statement, SHARED_RELEASE, &release).await?;
                if !row.get::<_, bool>(0) {
                    bail!("distlock's SQL by hand lost a hold it had just taken");
                }
                Ok(true)
            }
            Cycler::Distlock { hold, manager, key } => {
                let request = match hold {
                    Hold::Read => manager.read_lock(key.as_str()),
                    Hold::Write => manager.write_lock(key.as_str()),
                    Hold::Permit => manager.semaphore(key.as_str(), PERMITS).weight(WEIGHT),
                };
                request.acquire().await?.release().await?;
                Ok(true)
            }
        }
    }
}

/// Every row: for each hold, its SQL by hand prepared and unnamed, then
/// distlock by default (unnamed) and prepared.
const HOLDS: [Hold; 3] = [Hold::Read, Hold::Write, Hold::Permit];
const PER_HOLD: usize = 4;

fn label(i: usize) -> String {
    let hold = HOLDS[i / PER_HOLD].name();
    match i % PER_HOLD {
        0 => format!("{hold}: distlock's SQL by hand (prepared)"),
        1 => format!("{hold}: distlock's SQL by hand (unnamed)"),
        2 => format!("{hold}: distlock"),
        _ => format!("{hold}: distlock, prepared statements"),
    }
}

/// The row a row is compared against: distlock's to its SQL sent the same way.
fn like(i: usize) -> Option<usize> {
    let first = i / PER_HOLD * PER_HOLD;
    match i % PER_HOLD {
        2 => Some(first + 1),
        3 => Some(first),
        _ => None,
    }
}

async fn cycler(i: usize, url: &str) -> Result<(Cycler, u32)> {
    let hold = HOLDS[i / PER_HOLD];
    match i % PER_HOLD {
        0 => Cycler::same_sql(url, hold, true).await,
        1 => Cycler::same_sql(url, hold, false).await,
        2 => Cycler::distlock(url, hold, false).await,
        _ => Cycler::distlock(url, hold, true).await,
    }
}

pub async fn run(env: &PgEnv) -> Result<ScenarioResult> {
    // --quick: 12 implementations of two commits a cycle, each a WAL flush of
    // several ms on a busy disk, and CI wants the pass under 10 s.
    let plan = Plan::new(env.quick, (5, 100, 50), (200, 5_000, 500));
    let (cycles, block) = (plan.cycles, plan.block);
    let n = HOLDS.len() * PER_HOLD;
    let m = interleaved::run(
        env,
        n,
        plan,
        |i, url, _| async move { cycler(i, &url).await },
    )
    .await?;
    let p50s: Vec<f64> = m
        .hist
        .iter()
        .map(|h| us(h.value_at_quantile(0.50)))
        .collect();
    let labels: Vec<String> = (0..n).map(label).collect();
    let mut rows = Vec::new();
    for i in 0..n {
        let mut row = m.row(i, &labels[i], Unit::Cycle);
        row.push(
            "p50 / its SQL",
            like(i).map_or(f64::NAN, |j| p50s[i] / p50s[j]),
            Better::Lower,
        );
        m.push_costs(&mut row, i, Unit::Cycle);
        rows.push(row);
    }
    let targets = (0..n)
        .filter_map(|i| {
            let j = like(i)?;
            let how = if i % PER_HOLD == 2 {
                "unnamed statements"
            } else {
                "prepared"
            };
            let what = if i % PER_HOLD == 2 {
                "distlock"
            } else {
                "distlock prepared"
            };
            Some(Target::ratio(
                &format!(
                    "{} {what} p50 <= 1.10x its own SQL by hand ({how})",
                    HOLDS[i / PER_HOLD].name()
                ),
                &labels[i],
                "p50 us",
                &labels[j],
                Check::AtMost(1.10),
            ))
        })
        .collect();
    Ok(ScenarioResult {
        name: "shared-postgres",
        title: format!(
            "one task, acquire + release of a read lock, a write lock and a semaphore hold (weight {WEIGHT} of {PERMITS}), {cycles} cycles per implementation in interleaved blocks of {block}"
        ),
        notes: vec![
            server_note(env),
            m.cpu_note,
            "distlock's SQL by hand: its schema's read_acquire / write_acquire / permit_acquire, then shared_release, with the parameters distlock sends for an uncontended cycle (its key names and wake-up channel, a fresh owner token per hold, a token taken at once for a read or permit hold), each call its own transaction and commit; prepared once, or unnamed (parsed with each call, as distlock sends them by default)".to_owned(),
            "p50 / its SQL: distlock's p50 over its SQL by hand sent the same way (unnamed with unnamed, prepared with prepared)".to_owned(),
            "backend cpu: utime + stime of the connection's backend process (clock ticks: coarse at --quick sizes); distlock's not measured (its connections are its own)".to_owned(),
        ],
        rows,
        references: 0,
        targets,
    })
}
