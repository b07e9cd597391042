//! Scenario `renewal`: `--locks N` locks (100,000 by default) held at once by
//! one client with a 10 s lease (renewed every 3.3 s): round trips per renewal
//! tick, Redis CPU per second while nothing but renewal happens, and what
//! bounds it. A window of two whole renewal intervals is measured.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock::{LockGuard, LockManager};

use crate::error::{bail, Result};
use crate::floor::{Attempt, Floor, Names};
use crate::proxy::CountingProxy;
use crate::redis_stats::Delta;
use crate::report::{Better, Row, ScenarioResult};
use crate::scenarios::common::{owner_token, Env, Kind, Target};

const TASKS: usize = 64;

struct Params {
    locks: usize,
    lease: Duration,
    hold: Duration,
    idle: Duration,
}

struct Window {
    round_trips: u64,
    redis: Delta,
    seconds: f64,
}

/// Starts half a renewal interval after the locks were taken, so that a window
/// of whole intervals holds one renewal of every lock, not a fraction.
async fn measure_window(env: &Env, proxy: &CountingProxy, p: &Params) -> Result<Window> {
    tokio::time::sleep(p.lease / 6).await;
    let hold = p.hold;
    let rt = proxy.round_trips();
    let before = env.snapshot().await?;
    let started = Instant::now();
    tokio::time::sleep(hold).await;
    let seconds = started.elapsed().as_secs_f64();
    let redis = before.delta(&env.snapshot().await?);
    Ok(Window {
        round_trips: proxy.round_trips() - rt,
        redis,
        seconds,
    })
}

fn row(label: &str, p: &Params, w: &Window, lost: usize) -> Row {
    let interval = p.lease / 3;
    let ticks = w.seconds / interval.as_secs_f64();
    let per_tick = w.round_trips as f64 / ticks;
    let lock_ticks = p.locks as f64 * ticks;
    let mut row = Row::new(label);
    row.push("locks", p.locks as f64, Better::Neutral)
        .push("rt/tick", per_tick, Better::Lower)
        .push(
            "rt/tick per 100 locks",
            per_tick / (p.locks as f64 / 100.0),
            Better::Lower,
        )
        .push(
            "evalsha/lock/tick",
            w.redis.scripts as f64 / lock_ticks,
            Better::Lower,
        )
        .push(
            "cmds/lock/tick",
            w.redis.commands as f64 / lock_ticks,
            Better::Lower,
        )
        .push(
            "redis cpu %",
            100.0 * w.redis.cpu_seconds / w.seconds,
            Better::Lower,
        )
        .push(
            "client cpu %",
            100.0 * w.redis.client_cpu_seconds / w.seconds,
            Better::Lower,
        )
        .push(
            "redis cpu us/renewal",
            w.redis.cpu_seconds * 1e6 / w.redis.scripts.max(1) as f64,
            Better::Lower,
        )
        .push("lost", lost as f64, Better::Lower);
    row
}

async fn floor_row(env: &Env, p: &Params) -> Result<Row> {
    let proxy = CountingProxy::start(env.addr).await?;
    let floor = Floor::connect(&Target::Single(proxy.url())).await?;
    floor.load_renew().await?;
    let lease_ms = u64::try_from(p.lease.as_millis())?;
    // Take the locks, 64 requests in flight.
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let floor = floor.clone();
        let n = p.locks;
        handles.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(t as u64);
            let mut held = Vec::new();
            for i in (t..n).step_by(TASKS) {
                let names = Names::new("floor:", &format!("renew:{i}"));
                let owner = owner_token(&mut rng);
                match floor.try_acquire(&names, &owner, lease_ms, false).await? {
                    Attempt::Acquired => held.push((names, owner)),
                    Attempt::Busy(_) => bail!("floor: renew:{i} was busy"),
                }
            }
            Ok(held)
        }));
    }
    let mut locks = Vec::new();
    for h in handles {
        locks.extend(h.await??);
    }
    let locks = Arc::new(locks);
    // Renew them all every lease/3, in pipelines of 512.
    let lost = Arc::new(AtomicUsize::new(0));
    let renewer = {
        let (floor, locks, lost) = (floor.clone(), locks.clone(), lost.clone());
        let interval = p.lease / 3;
        tokio::spawn(async move {
            // First renewal at once: taking 100,000 locks can last a good part
            // of a lease, and the first ones taken must not run out meanwhile.
            let mut tick = tokio::time::interval(interval);
            loop {
                tick.tick().await;
                let n = floor.renew_all(&locks, lease_ms).await?;
                // Locks found gone in one tick (a lost lock is lost in every later tick too).
                lost.fetch_max(n, Ordering::Relaxed);
            }
            #[allow(unreachable_code)]
            Ok::<(), crate::error::BoxError>(())
        })
    };
    let window = measure_window(env, &proxy, p).await?;
    renewer.abort();
    if let Ok(Err(e)) = renewer.await {
        return Err(e);
    }
    let lost = lost.load(Ordering::Relaxed);
    release_floor(&floor, &locks).await?;
    Ok(row(Kind::Floor.label(), p, &window, lost))
}

async fn release_floor(floor: &Floor, locks: &Arc<Vec<(Names, String)>>) -> Result<()> {
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let (floor, locks) = (floor.clone(), locks.clone());
        handles.push(tokio::spawn(async move {
            for (names, owner) in locks.iter().skip(t).step_by(TASKS) {
                floor.release(names, owner).await?;
            }
            Ok::<(), crate::error::BoxError>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(())
}

async fn distlock_row(env: &Env, p: &Params) -> Result<Row> {
    let proxy = CountingProxy::start(env.addr).await?;
    let manager = LockManager::builder(&proxy.url())
        .direct_lane(crate::scenarios::common::direct_lane())
        .default_lease(p.lease)
        .build()
        .await?;
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let m = manager.clone();
        let n = p.locks;
        handles.push(tokio::spawn(async move {
            let mut held: Vec<LockGuard> = Vec::new();
            for i in (t..n).step_by(TASKS) {
                match m.lock(format!("renew:{i}")).try_acquire().await? {
                    Some(g) => held.push(g),
                    None => bail!("distlock: renew:{i} was busy"),
                }
            }
            Ok(held)
        }));
    }
    let mut guards = Vec::new();
    for h in handles {
        guards.extend(h.await??);
    }
    if manager.held_count() != p.locks {
        bail!(
            "distlock holds {} locks, expected {}",
            manager.held_count(),
            p.locks
        );
    }
    let window = measure_window(env, &proxy, p).await?;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    // Release, 64 at a time; a lost lease reports Lost there, counted above.
    super::memory::release_all(guards).await?;
    Ok(row(Kind::Distlock.label(), p, &window, lost))
}

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    let p = if env.quick {
        Params {
            locks: env.locks.unwrap_or(1_000),
            lease: Duration::from_millis(300),
            hold: Duration::from_millis(600),
            idle: Duration::from_millis(200),
        }
    } else {
        Params {
            locks: env.locks.unwrap_or(100_000),
            // 100,000 locks take seconds to acquire on a loaded 2-core machine:
            // the lease must outlast that (distlock renews while acquiring).
            lease: Duration::from_secs(10),
            hold: Duration::from_secs(20) / 3,
            idle: Duration::from_secs(2),
        }
    };
    // Redis with no client traffic at all: its own background work (serverCron).
    let before = env.snapshot().await?;
    let started = Instant::now();
    tokio::time::sleep(p.idle).await;
    let idle = before.delta(&env.snapshot().await?);
    let idle_pct = 100.0 * idle.cpu_seconds / started.elapsed().as_secs_f64();

    let floor = floor_row(env, &p).await?;
    env.flush().await?;
    let distlock = distlock_row(env, &p).await?;
    env.flush().await?;
    let bound = bound_note(&p, &distlock, idle_pct);
    Ok(ScenarioResult {
        name: "renewal",
        title: format!(
            "{} locks held by one client, lease {:.2} s renewed every {:.2} s, measured over {:.2} s",
            p.locks,
            p.lease.as_secs_f64(),
            (p.lease / 3).as_secs_f64(),
            p.hold.as_secs_f64()
        ),
        notes: vec![
            format!("Redis CPU with no clients at all: {idle_pct:.2}% of one core"),
            "the floor renews every lock once per tick with renew.lua in pipelines of 512; round trips are counted through a RESP-parsing proxy".to_owned(),
            bound,
            "lost: floor, most locks found gone in one tick; distlock, guards lost; anything but 0 voids the row (acquiring took longer than a lease, or renewal fell behind)".to_owned(),
        ],
        rows: vec![floor, distlock],
        references: 1,
        targets: Vec::new(),
    })
}

/// What bounds renewal at this size, from distlock's own figures.
fn bound_note(p: &Params, row: &Row, idle_pct: f64) -> String {
    let interval = (p.lease / 3).as_secs_f64();
    let renewals_per_s = p.locks as f64 / interval;
    let cpu_us = row.get("redis cpu us/renewal").unwrap_or(f64::NAN);
    let cpu_pct = row.get("redis cpu %").unwrap_or(f64::NAN);
    let rt = row.get("rt/tick").unwrap_or(f64::NAN);
    let ceiling = 1e6 / cpu_us * interval;
    format!(
        "bound: Redis CPU, one renew.lua per lock per tick: {renewals_per_s:.0} renewals/s x {cpu_us:.1} us = {cpu_pct:.1}% of one core (idle {idle_pct:.1}%); \
         at that cost one Redis core saturates near {ceiling:.0} locks at this lease; round trips: {rt:.1} per tick (pipelines of up to 512 renewals)"
    )
}
