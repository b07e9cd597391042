//! Scenario `fresh-handoff`: a hand-off on a key nobody waited for before, as
//! when a request for a new order id arrives while another replica holds it.
//!
//! Each round takes a new key. Client A takes it; client B (another
//! connection, or another `LockManager`) starts waiting for it; [`AHEAD`]
//! later A releases it. Hand-off latency runs from the moment A starts its
//! release to the moment B holds the lock.
//!
//! * **floor**: B's pub/sub connection is subscribed before the measurement
//!   (to a pattern covering every key's wake-up channel); B tries `SET NX`,
//!   marks the lock with distlock's acquire script, and takes it with
//!   `SET NX` once the release's wake-up message arrives: release, message,
//!   one acquire round trip.
//! * **distlock**: two managers, each used before (so its one hand-off
//!   channel is subscribed); B queues on the fresh key and is handed the lock
//!   by the release's message (no acquire round trip).
//!
//! The two alternate round by round, so that a change of machine load hits
//! both alike.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::error::{bail, Result};
use crate::floor::{Attempt, Floor, Names};
use crate::report::{new_histogram, us, Better, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::{manager, owner_token, Env, LEASE, LEASE_MS};

/// How long before A's release B starts to wait.
const AHEAD: Duration = Duration::from_millis(3);
/// Longest a waiter may take; a round that takes longer is an error.
const ROUND_LIMIT: Duration = Duration::from_secs(5);

const FLOOR_LABEL: &str = "floor (release + subscribed waiter's SET NX)";
const DISTLOCK_LABEL: &str = "distlock (2 managers, a fresh key per hand-off)";

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    let (rounds, warmup) = if env.quick { (40, 5) } else { (2_000, 50) };

    let holder = Floor::connect(&env.target).await?;
    let waiter = Floor::connect(&env.target).await?;
    let _subscription = waiter
        .subscribe(&env.url, &[], Some("floor:wake:*"))
        .await?;
    let managers = [manager(&env.target).await?, manager(&env.target).await?];
    // Each manager waits once before the measurement: its hand-off channel,
    // subscribed in the background of its first acquisition and kept, is
    // then surely in place, as in a service that has run for a while.
    distlock_round(&managers[0], &managers[1], "bench:fresh:warm-a", AHEAD).await?;
    distlock_round(&managers[1], &managers[0], "bench:fresh:warm-b", AHEAD).await?;

    let mut floor = new_histogram()?;
    let mut distlock = new_histogram()?;
    let mut rng = fastrand::Rng::with_seed(7);
    let started = Instant::now();
    for round in 0..warmup + rounds {
        let key = format!("bench:fresh:{round}");
        let f = floor_round(&holder, &waiter, &key, AHEAD, &mut rng).await?;
        // Alternate which manager holds, so each one's hand-off channel serves.
        let (a, b) = (&managers[round % 2], &managers[(round + 1) % 2]);
        let d = distlock_round(a, b, &key, AHEAD).await?;
        if round >= warmup {
            record(&mut floor, f)?;
            record(&mut distlock, d)?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    env.flush().await?;

    Ok(ScenarioResult {
        name: "fresh-handoff",
        title: format!(
            "a hand-off on a new key each round: B starts waiting {} ms before A releases; {rounds} rounds each (after {warmup} warm-up), floor and distlock alternating, {seconds:.1} s",
            AHEAD.as_millis()
        ),
        notes: vec![
            "hand-off: from the start of A's release to B holding the lock".to_owned(),
            "floor: B subscribed in advance (a pattern over every key's wake-up channel), SET NX busy, marks the lock with distlock's acquire script, and takes it with SET NX when the release's message arrives".to_owned(),
            "distlock: B's manager has waited before (its hand-off channel is subscribed and kept); B queues on the new key and the release hands it the lock with one message".to_owned(),
        ],
        rows: vec![row(FLOOR_LABEL, &floor), row(DISTLOCK_LABEL, &distlock)],
        references: 1,
        targets: vec![Target::ratio(
            "distlock fresh-key hand-off p50 <= 1.2x floor",
            DISTLOCK_LABEL,
            "handoff p50 us",
            FLOOR_LABEL,
            Check::AtMost(1.2),
        )],
    })
}

/// A row of hand-off latencies: p50, p99 and their count.
pub(super) fn row(label: &str, h: &Histogram<u64>) -> Row {
    let mut row = Row::new(label);
    row.push(
        "handoff p50 us",
        us(h.value_at_quantile(0.5)),
        Better::Lower,
    )
    .push(
        "handoff p99 us",
        us(h.value_at_quantile(0.99)),
        Better::Lower,
    )
    .push("handoffs", h.len() as f64, Better::Neutral);
    row.histogram = Some(h.clone());
    row
}

/// Records `d` in `h` (nanoseconds, at least 1).
pub(super) fn record(h: &mut Histogram<u64>, d: Duration) -> Result<()> {
    h.record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1))?;
    Ok(())
}

/// One floor round on the new key `key`: `holder` takes it, `waiter` (its
/// own task, subscribed in advance) marks it and waits, and `ahead` later
/// `holder` releases; the hand-off latency.
pub(super) async fn floor_round(
    holder: &Floor,
    waiter: &Floor,
    key: &str,
    ahead: Duration,
    rng: &mut fastrand::Rng,
) -> Result<Duration> {
    let names = Names::new("floor:", key);
    let (a, b) = (owner_token(rng), owner_token(rng));
    if !matches!(
        holder.try_acquire(&names, &a, LEASE_MS, false).await?,
        Attempt::Acquired
    ) {
        bail!("hand-off floor: the new key {key} was busy");
    }
    let waiting = {
        let (waiter, names) = (waiter.clone(), names.clone());
        tokio::spawn(async move {
            waiter.acquire_by_set_nx(&names, &b, LEASE_MS).await?;
            let held = Instant::now();
            waiter.release(&names, &b).await?;
            Ok::<_, crate::error::BoxError>(held)
        })
    };
    tokio::time::sleep(ahead).await;
    let released = Instant::now();
    if !holder.release(&names, &a).await? {
        bail!("hand-off floor: the holder's release of {key} found it gone");
    }
    let held = tokio::time::timeout(ROUND_LIMIT, waiting).await???;
    Ok(held.saturating_duration_since(released))
}

/// One distlock round on `key`: `holder` holds, `waiter` waits in a task of
/// its own, and `ahead` later `holder` releases; the hand-off latency.
pub(super) async fn distlock_round(
    holder: &distlock::LockManager,
    waiter: &distlock::LockManager,
    key: &str,
    ahead: Duration,
) -> Result<Duration> {
    let guard = holder.lock(key).lease(LEASE).acquire().await?;
    let waiting = {
        let (m, key) = (waiter.clone(), key.to_owned());
        tokio::spawn(async move {
            let g = m.lock(key).lease(LEASE).acquire().await?;
            let held = Instant::now();
            g.release().await?;
            Ok::<_, crate::error::BoxError>(held)
        })
    };
    tokio::time::sleep(ahead).await;
    let released = Instant::now();
    guard.release().await?;
    let held = tokio::time::timeout(ROUND_LIMIT, waiting).await???;
    Ok(held.saturating_duration_since(released))
}
