//! `renewal-postgres`: `--locks N` lease rows (10,000 by default; 1,000 with
//! `--quick`) held by one owner, all renewed in one statement per batch: one round
//! trip (Bind, Execute, Sync of a prepared statement) and one commit per batch,
//! whatever N. Measured: the time per batch over 30 batches (5 with `--quick`),
//! and holds that were not renewed; round trips per batch over 3 more batches
//! through the counting proxy, on a connection of their own.
//!
//! distlock's row: the same N locks held by one manager (taken with `lock_all`,
//! 128 keys a call, so that they are taken within a quarter of a renewal
//! interval and its renewal task renews them together), renewed by that task
//! in batches of up to 512 leases, one statement (`renew` of its schema) each.
//! The time of each batch is read from the manager
//! (`LockManager::take_renewal_batches`, distlock's `testing` feature): the
//! task's call to the store and its outcomes applied to the leases. Round
//! trips per batch: a second manager holding N locks through the counting
//! proxy, over one whole renewal tick.

use std::time::{Duration, Instant};

use distlock::{LockManager, MultiLockGuard, MAX_LOCK_ALL_KEYS};
use hdrhistogram::Histogram;

use super::lease::LeaseSql;
use super::{connect, server_note, PgEnv};
use crate::error::{bail, context, Result};
use crate::report::{new_histogram, us, Better, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::nanos;

const FLOOR: &str = "lease-row floor (one UPDATE per batch, by hand)";
const DISTLOCK: &str = "distlock (its renewal task, batches of up to 512)";
/// Long enough that no hold ends between two batches, however loaded the machine.
const LEASE_SECS: f64 = 600.0;
/// The longest a `lock_all` call of 128 keys is allowed in the choice of
/// distlock's lease (one commit's WAL flush, a few ms, on a busy disk).
const LOCK_ALL_CALL: Duration = Duration::from_millis(10);

/// A distlock manager holding `keys` (`lock_all` calls of 128 keys, in
/// sequence) with a lease of `lease`; its sweep is put off by an hour, so
/// that the round trips counted in a tick are its renewal's alone.
async fn distlock_holding(
    url: &str,
    keys: &[String],
    lease: Duration,
) -> Result<(LockManager, Vec<MultiLockGuard>)> {
    let manager = LockManager::builder(url)
        .default_lease(lease)
        .postgres_sweep_interval(Duration::from_secs(3600))
        .build()
        .await
        .map_err(context(&format!("building a distlock manager on {url}")))?;
    let mut guards = Vec::with_capacity(keys.len().div_ceil(MAX_LOCK_ALL_KEYS));
    for chunk in keys.chunks(MAX_LOCK_ALL_KEYS) {
        match manager.lock_all(chunk).try_acquire().await? {
            Some(guard) => guards.push(guard),
            None => bail!("renewal-postgres: distlock found one of its fresh keys busy"),
        }
    }
    if manager.held_count() != keys.len() {
        bail!(
            "renewal-postgres: distlock holds {} locks, expected {}",
            manager.held_count(),
            keys.len()
        );
    }
    Ok((manager, guards))
}

/// The batches of the manager's renewal task until `locks` leases were
/// renewed (one whole tick: every lease is due once per interval), polled
/// every 5 ms; an error after `deadline`.
async fn one_tick(
    manager: &LockManager,
    locks: usize,
    deadline: Duration,
) -> Result<Vec<(usize, Duration)>> {
    let started = Instant::now();
    let mut batches = Vec::new();
    let mut renewed = 0;
    while renewed < locks {
        if started.elapsed() > deadline {
            bail!(
                "renewal-postgres: distlock renewed {renewed} of {locks} leases in {:.1} s",
                deadline.as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        for batch in manager.take_renewal_batches() {
            renewed += batch.0;
            batches.push(batch);
        }
    }
    Ok(batches)
}

/// Frees the holds, and counts those lost (their release says so too).
async fn release(guards: Vec<MultiLockGuard>) -> u64 {
    let mut lost = 0;
    for guard in guards {
        let keys = guard.keys().len() as u64;
        if guard.is_lost() {
            lost += keys;
        }
        // A lost hold's release fails; it is counted above.
        let _ = guard.release().await;
    }
    lost
}

/// distlock's row: its renewal task's batches over `ticks` ticks, and the
/// round trips of one more tick through the counting proxy.
async fn distlock_row(env: &PgEnv, keys: &[String], ticks: usize) -> Result<(Row, String)> {
    let locks = keys.len();
    // A lease whose quarter interval (the span `due` gathers into one tick)
    // outlasts taking every key, so that one tick renews them all.
    let calls = locks.div_ceil(MAX_LOCK_ALL_KEYS) as u32;
    let interval = (LOCK_ALL_CALL * calls * 4).max(Duration::from_secs(1));
    let lease = interval * 3;
    // A tick is late only by the batches before it and the machine's load.
    let deadline = interval * 3;
    let (manager, guards) = distlock_holding(&env.url, keys, lease).await?;
    manager.take_renewal_batches();
    // The first tick after taking them, which may find them in groups.
    one_tick(&manager, locks, deadline).await?;
    let mut batches = Vec::new();
    for _ in 0..ticks {
        batches.extend(one_tick(&manager, locks, deadline).await?);
    }
    let mut lost = release(guards).await;
    drop(manager);
    let mut hist: Histogram<u64> = new_histogram()?;
    let mut busy = Duration::ZERO;
    for (_, took) in &batches {
        hist.saturating_record(nanos(*took));
        busy += *took;
    }
    let leases: usize = batches.iter().map(|b| b.0).sum();
    let per_batch = leases as f64 / batches.len().max(1) as f64;
    // Round trips of one tick, through the proxy, on a manager of their own.
    let (proxy, proxied) = super::counting_proxy(env).await?;
    let rt_keys: Vec<String> = keys.iter().map(|k| format!("{k}:rt")).collect();
    let (counted, counted_guards) = distlock_holding(&proxied, &rt_keys, lease).await?;
    one_tick(&counted, locks, deadline).await?;
    let before = proxy.round_trips();
    let rt_batches = one_tick(&counted, locks, deadline).await?.len();
    let rt_per_batch = (proxy.round_trips() - before) as f64 / rt_batches.max(1) as f64;
    lost += release(counted_guards).await;
    let p50 = us(hist.value_at_quantile(0.50));
    let mut row = Row::new(DISTLOCK);
    row.push("locks", locks as f64, Better::Neutral)
        .push("locks/batch", per_batch, Better::Neutral)
        .push("batch p50 ms", p50 / 1e3, Better::Lower)
        .push("batch max ms", us(hist.max()) / 1e3, Better::Lower)
        .push("us/lock", p50 / per_batch, Better::Lower)
        .push(
            "batches/s",
            batches.len() as f64 / busy.as_secs_f64(),
            Better::Higher,
        )
        .push("rt/batch", rt_per_batch, Better::Neutral)
        .push("lost", lost as f64, Better::Lower);
    let note = format!(
        "distlock: one manager holds the {locks} locks (lock_all, 128 keys a call) with a {:.1} s lease, renewed by its task every {:.1} s in batches of up to 512, one renew statement each (unnamed); {} batches over {ticks} ticks after a first one, each timed inside the task (its store call and the outcomes applied; LockManager::take_renewal_batches, the testing feature); batches/s = batches / their summed time (the task waits between ticks); rt/batch: a second manager through the counting proxy over one more tick, its sweep put off (an hour) so that nothing else runs in it",
        lease.as_secs_f64(),
        interval.as_secs_f64(),
        batches.len(),
    );
    Ok((row, note))
}

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
        .push("locks/batch", locks as f64, Better::Neutral)
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
    let ticks = if env.quick { 2 } else { 3 };
    let (distlock, distlock_note) = distlock_row(env, &keys, ticks).await?;
    let rows = vec![row, distlock];
    Ok(ScenarioResult {
        name: "renewal-postgres",
        title: format!("{locks} lease rows held by one owner: the floor renews them {batches} times, all in one statement per batch; distlock's renewal task in batches of up to 512"),
        notes: vec![
            server_note(env),
            "a batch is one UPDATE ... FROM unnest(keys, tokens): one round trip and one commit's WAL flush; its time grows with the rows it writes".to_owned(),
            "rt/batch: counted by a protocol-parsing proxy on a connection of its own, over 3 more batches (also counted in lost)".to_owned(),
            "lost: holds a batch did not renew (anything but 0 voids the row)".to_owned(),
            distlock_note,
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
