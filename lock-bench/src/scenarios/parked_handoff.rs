//! Scenario `parked-handoff`: a hand-off as a service meets it. The holder's
//! manager only ever holds (a request handler, a scheduler replica: it has
//! never waited); the waiter is another manager's acquisition, parked in a
//! task of its own for [`ahead`] before the release; nothing is pinned to a
//! CPU, so the message and the wake-ups cross cores as they do in production.
//! Hand-off latency runs from the moment the holder starts its release to the
//! moment the waiter holds the lock.
//!
//! * **floor**: the least a waiter that listens can do, also parked in a
//!   task of its own: subscribed in advance (a pattern over every key's
//!   wake-up channel), `SET NX` busy, marks the lock with distlock's acquire
//!   script, and takes it with `SET NX` once the release's message arrives.
//!   Release script with `PUBLISH`, the message, one acquire round trip.
//! * **distlock**: holder A (its manager never waited), waiter B (another
//!   manager); B queues and the release hands it the lock by its message: no
//!   acquire round trip, so it should be below the floor by about one.
//! * **distlock, holder's manager waited before**: the same with a holder
//!   whose manager waited once before the measurement: the two rows should
//!   match (each holder's manager hears its waiter's notice and releases in
//!   one round trip).
//!
//! The three alternate round by round, so that a change of machine load hits
//! them alike. Through `--link-delay`, [`ahead`] grows with the link, so
//! that the waiter has queued (two round trips) and its notice has reached
//! the holder before the release. 1,000 rounds after 50 of warm-up (300
//! after 20 through a link of 0.5 ms or more, whose rounds are long; `--quick`:
//! 40 after 5).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::error::Result;
use crate::floor::Floor;
use crate::report::{new_histogram, Check, ScenarioResult, Target};
use crate::scenarios::common::{manager, Env, LEASE};
use crate::scenarios::fresh_handoff::{distlock_round, floor_round, record, row};

/// Longest a waiter may take; a round that takes longer is an error.
const ROUND_LIMIT: Duration = Duration::from_secs(5);

pub const FLOOR_LABEL: &str = "floor (release + parked waiter's SET NX)";
pub const DISTLOCK_LABEL: &str = "distlock (holder's manager never waited)";
pub const WAITED_LABEL: &str = "distlock (holder's manager waited before)";

/// How long before the release the waiter starts to wait: 5 ms on loopback
/// (parked: its task sleeps, its thread may too), plus 40 one-way delays of
/// the link, so that through a link the waiter's two round trips (its first
/// try and its queueing) and its notice's way to the holder are over.
pub fn ahead(env: &Env) -> Duration {
    Duration::from_millis(5) + env.link_delay.unwrap_or_default() * 40
}

/// Measured rounds and warm-up rounds: see the module's documentation.
pub fn rounds(env: &Env) -> (usize, usize) {
    if env.quick {
        (40, 5)
    } else if env
        .link_delay
        .is_some_and(|d| d >= Duration::from_micros(500))
    {
        (300, 20)
    } else {
        (1_000, 50)
    }
}

/// The targets: distlock's never-waited holder against the floor (0.90x on
/// loopback, 0.60x through a link, where the floor's extra round trip
/// weighs more), and the two distlock holders within 10% of each other.
pub fn targets(env: &Env) -> Vec<Target> {
    let (text, bound) = if env.link_delay.is_some() {
        (
            "distlock parked hand-off p50 <= 0.60x floor (through the link)",
            0.60,
        )
    } else {
        (
            "distlock parked hand-off p50 <= 0.90x floor (loopback)",
            0.90,
        )
    };
    vec![
        Target::ratio(
            text,
            DISTLOCK_LABEL,
            "handoff p50 us",
            FLOOR_LABEL,
            Check::AtMost(bound),
        ),
        Target::ratio(
            "never waited vs waited before: p50 within 10%",
            DISTLOCK_LABEL,
            "handoff p50 us",
            WAITED_LABEL,
            Check::AtMost(1.10),
        ),
    ]
}

/// `c` waits once before the measurement, for `holder`'s hold of a warm-up
/// key: its manager has then heard a hand-off's notice and been handed a
/// lock, as the "waited before" row's holder must have.
pub async fn wait_once(
    holder: &distlock::LockManager,
    c: &distlock::LockManager,
    ahead: Duration,
) -> Result<()> {
    let warm = holder
        .lock("bench:parked:warm")
        .lease(LEASE)
        .acquire()
        .await?;
    let c_waits = {
        let c = c.clone();
        tokio::spawn(async move {
            c.lock("bench:parked:warm")
                .lease(LEASE)
                .acquire()
                .await?
                .release()
                .await?;
            Ok::<_, crate::error::BoxError>(())
        })
    };
    tokio::time::sleep(ahead).await;
    warm.release().await?;
    tokio::time::timeout(ROUND_LIMIT, c_waits).await???;
    Ok(())
}

/// The three rows' hand-off latencies: the floor's, distlock's with a holder
/// whose manager never waited, and with one whose manager waited before.
pub struct Latencies {
    floor: Histogram<u64>,
    never: Histogram<u64>,
    waited: Histogram<u64>,
}

/// Runs `warmup + rounds` rounds of `round`, which runs round r's floor,
/// never-waited and waited hand-offs, in that order, and returns their
/// latencies; those past the warm-up, and the seconds the rounds took.
pub async fn measure(
    warmup: usize,
    rounds: usize,
    mut round: impl AsyncFnMut(usize) -> Result<[Duration; 3]>,
) -> Result<(Latencies, f64)> {
    let mut l = Latencies {
        floor: new_histogram()?,
        never: new_histogram()?,
        waited: new_histogram()?,
    };
    let started = Instant::now();
    for r in 0..warmup + rounds {
        let [f, n, w] = round(r).await?;
        if r >= warmup {
            record(&mut l.floor, f)?;
            record(&mut l.never, n)?;
            record(&mut l.waited, w)?;
        }
    }
    Ok((l, started.elapsed().as_secs_f64()))
}

/// The scenario's result: its rows and targets, under `title` and `notes`
/// (which say where the waiters ran).
pub fn result(env: &Env, title: String, notes: Vec<String>, l: &Latencies) -> ScenarioResult {
    ScenarioResult {
        // Under --processes, the run's variant (`procsN`) follows in the
        // results file's name.
        name: "parked-handoff",
        title,
        notes,
        rows: vec![
            row(FLOOR_LABEL, &l.floor),
            row(DISTLOCK_LABEL, &l.never),
            row(WAITED_LABEL, &l.waited),
        ],
        references: 1,
        targets: targets(env),
    }
}

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    let (rounds, warmup) = rounds(env);
    let ahead = ahead(env);

    let holder = Floor::connect(&env.target).await?;
    let waiter = Floor::connect(&env.target).await?;
    let _subscription = waiter
        .subscribe(&env.url, &[], Some("floor:wake:*"))
        .await?;
    // A only ever holds; B only ever waits; C waits once (for B) before the
    // measurement, then only holds.
    let a = manager(&env.target).await?;
    let b = manager(&env.target).await?;
    let c = manager(&env.target).await?;
    wait_once(&b, &c, ahead).await?;

    let mut rng = fastrand::Rng::with_seed(11);
    let (latencies, seconds) = measure(warmup, rounds, async |round| {
        let f = floor_round(
            &holder,
            &waiter,
            &format!("bench:parked:f{round}"),
            ahead,
            &mut rng,
        )
        .await?;
        let n = distlock_round(&a, &b, &format!("bench:parked:a{round}"), ahead).await?;
        let w = distlock_round(&c, &b, &format!("bench:parked:c{round}"), ahead).await?;
        Ok([f, n, w])
    })
    .await?;
    env.flush().await?;

    Ok(result(
        env,
        format!(
            "a hand-off to a parked waiter of another manager, unpinned: the waiter starts {} ms before the release; {rounds} rounds each (after {warmup} warm-up), the three rows alternating, {seconds:.1} s",
            ahead.as_secs_f64() * 1e3
        ),
        vec![
            "hand-off: from the start of the holder's release to the waiter holding the lock; nothing pinned to a CPU".to_owned(),
            "floor: the waiter in a task of its own, subscribed in advance (a pattern over every key's wake-up channel), SET NX busy, marks the lock with distlock's acquire script, and takes it with SET NX when the release's message arrives".to_owned(),
            "distlock: the holder's manager never waited (it hears its waiter's notice on the hand-off channel it listens on since its first acquisition); the waiter, another manager's, queues and is handed the lock by the release's message".to_owned(),
        ],
        &latencies,
    ))
}
