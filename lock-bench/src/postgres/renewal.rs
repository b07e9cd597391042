//! `renewal-postgres`: `--locks N` lease rows (10,000 by default; 1,000 with
//! `--quick`) held by one owner, all renewed in one statement per batch: one round
//! trip (Bind, Execute, Sync of a prepared statement) and one commit per batch,
//! whatever N. Measured: the time per batch over 30 batches (5 with `--quick`),
//! and holds that were not renewed; round trips per batch over 3 more batches
//! through the counting proxy, on a connection of their own.

use std::time::Instant;

use super::lease::LeaseSql;
use super::{connect, server_note, slot_row, PgEnv, SLOT_NOTE};
use crate::error::{bail, Result};
use crate::report::{new_histogram, us, Better, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::nanos;

const FLOOR: &str = "lease-row floor (one UPDATE per batch, by hand)";
const DISTLOCK: &str = "distlock (slot: not measured yet)";
/// Long enough that no hold ends between two batches, however loaded the machine.
const LEASE_SECS: f64 = 600.0;

pub async fn run(env: &PgEnv) -> Result<ScenarioResult> {
    let locks = env.locks.unwrap_or(if env.quick { 1_000 } else { 10_000 });
    let batches = if env.quick { 5 } else { 30 };
    let client = connect(&env.url, "lock-bench-renewal").await?;
    let sql = LeaseSql::prepare(&client).await?;
    // Fresh keys each run, so that `--runs N` never meets the last run's rows.
    let run = fastrand::u64(..);
    let owner = format!("renewal-{run:016x}");
    let keys: Vec<String> = (0..locks)
        .map(|i| format!("bench:renew:{run:016x}:{i}"))
        .collect();
    let tokens = sql.hold_many(&client, &keys, &owner, LEASE_SECS).await?;
    // SLOT(distlock): distlock's row holds the same N locks through one
    // LockManager::builder(&env.url) manager and measures its renewal ticks.
    let mut hist = new_histogram()?;
    let mut lost = 0u64;
    let started = Instant::now();
    for _ in 0..batches {
        let t = Instant::now();
        let renewed = sql
            .renew(&client, &keys, &tokens, &owner, LEASE_SECS)
            .await?;
        hist.saturating_record(nanos(t.elapsed()));
        lost += (locks as u64).saturating_sub(renewed);
    }
    let seconds = started.elapsed().as_secs_f64();
    // Round trips per batch, through a counting proxy on a connection of its own
    // (the proxy's hops stay out of the timed batches).
    let (proxy, proxied) = super::counting_proxy(env).await?;
    let counted = connect(&proxied, "lock-bench-renewal-rt").await?;
    let counted_sql = LeaseSql::prepare(&counted).await?;
    let rt_batches = 3;
    let before = proxy.round_trips();
    for _ in 0..rt_batches {
        let renewed = counted_sql
            .renew(&counted, &keys, &tokens, &owner, LEASE_SECS)
            .await?;
        lost += (locks as u64).saturating_sub(renewed);
    }
    let rt_per_batch = (proxy.round_trips() - before) as f64 / rt_batches as f64;
    let freed = sql.free_owner(&client, &owner).await?;
    if freed != locks as u64 {
        bail!("renewal-postgres: {freed} of {locks} rows were still held at the end");
    }
    let mut row = Row::new(FLOOR);
    row.push("locks", locks as f64, Better::Neutral)
        .push(
            "batch p50 ms",
            us(hist.value_at_quantile(0.50)) / 1e3,
            Better::Lower,
        )
        .push("batch max ms", us(hist.max()) / 1e3, Better::Lower)
        .push(
            "us/lock",
            us(hist.value_at_quantile(0.50)) / locks as f64,
            Better::Lower,
        )
        .push("batches/s", batches as f64 / seconds, Better::Higher)
        .push("rt/batch", rt_per_batch, Better::Neutral)
        .push("lost", lost as f64, Better::Lower);
    let rows = vec![row.clone(), slot_row(DISTLOCK, &row)];
    Ok(ScenarioResult {
        name: "renewal-postgres",
        title: format!("{locks} lease rows held by one owner, renewed {batches} times, all in one statement per batch"),
        notes: vec![
            server_note(env),
            "a batch is one UPDATE ... FROM unnest(keys, tokens): one round trip and one commit's WAL flush; its time grows with the rows it writes".to_owned(),
            "rt/batch: counted by a protocol-parsing proxy on a connection of its own, over 3 more batches (also counted in lost)".to_owned(),
            "lost: holds a batch did not renew (anything but 0 voids the row)".to_owned(),
            SLOT_NOTE.to_owned(),
        ],
        rows,
        references: 1,
        targets: vec![
            Target::absolute(
                "distlock renews in one round trip per batch",
                DISTLOCK,
                "rt/batch",
                Check::AtMost(1.0),
            ),
            Target::absolute("distlock loses no hold", DISTLOCK, "lost", Check::AtMost(0.0)),
        ],
    })
}
