//! `min_hold` (ShedLock's lockAtLeastFor): a lock released before `min_hold`
//! has passed stays taken until then (its TTL set to the rest, no wake-up), one
//! released later is deleted at once; two replicas whose schedules differ by
//! less than `min_hold` run a fast job once per period, by hand and through
//! `#[distributed_lock]`. On one server, a cluster and a Redlock; by
//! `release()`, a dropped guard, the blocking release as the runtime ends and
//! the shutdown's.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use distlock::testing::{RedisCluster, RedisServer};
use distlock::{distributed_lock, LockError, LockManager};

const MIN_HOLD: Duration = Duration::from_millis(400);

/// Released 50 ms after the grant: the lock stays taken (another manager's
/// `try_acquire` is `None`, a waiter is not woken) until about the grant +
/// `MIN_HOLD`, then it is free.
async fn kept_until_min_hold(holder: &LockManager, other: &LockManager, key: &str) {
    let before = Instant::now();
    let g = holder
        .lock(key)
        .lease(Duration::from_secs(5))
        .min_hold(MIN_HOLD)
        .acquire()
        .await
        .unwrap();
    let granted = Instant::now();
    let waiter = {
        let other = other.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            let g = other
                .lock(&key)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    g.release()
        .await
        .expect("the release of a lock still ours is Ok");
    assert_eq!(holder.held_count(), 0, "the holder no longer holds it");

    assert!(
        other.lock(key).try_acquire().await.unwrap().is_none(),
        "kept after the release"
    );
    let info = other
        .inspect(key)
        .await
        .unwrap()
        .expect("kept after the release");
    let ttl = info.ttl.expect("a kept lock has a TTL");
    assert!(ttl <= MIN_HOLD, "the TTL is the rest of min_hold: {ttl:?}");
    // A kept lock publishes no wake-up: 100 ms after the release (still well
    // within min_hold) the waiter has not been woken, and waits on.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(other.wake_ups_delivered(), 0, "the release woke the waiter");
    assert!(!waiter.is_finished(), "the waiter got the kept lock");

    let acquired_at = waiter.await.unwrap();
    assert!(
        acquired_at >= granted + MIN_HOLD - Duration::from_millis(15),
        "freed {:?} after the grant, before min_hold",
        acquired_at - granted
    );
    assert!(
        acquired_at < before + MIN_HOLD + Duration::from_millis(500),
        "freed {:?} after the acquire began: not about at min_hold",
        acquired_at - before
    );
    // Free again once the waiter released it (no min_hold on its request).
    assert!(other.lock(key).try_acquire().await.unwrap().is_some());
}

#[tokio::test]
async fn released_before_min_hold_is_kept_until_then() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    kept_until_min_hold(&a, &b, "job:early").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster() {
    let cluster = RedisCluster::process_wide().unwrap();
    let m = || async {
        LockManager::cluster_builder(cluster.urls())
            .build()
            .await
            .unwrap()
    };
    kept_until_min_hold(&m().await, &m().await, "min-hold:cluster").await;
}

#[tokio::test]
async fn on_a_redlock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let m = || async {
        LockManager::redlock_builder(urls.clone())
            .build()
            .await
            .unwrap()
    };
    kept_until_min_hold(&m().await, &m().await, "min-hold:redlock").await;
}

#[tokio::test]
async fn a_dropped_guard_keeps_the_rest_too() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let g = a
        .lock("job:dropped")
        .min_hold(MIN_HOLD)
        .acquire()
        .await
        .unwrap();
    drop(g); // released in the background
    eventually(Duration::from_secs(2), async || {
        a.held_count() == 0
            && b.inspect("job:dropped")
                .await
                .unwrap()
                .and_then(|info| info.ttl)
                .is_some_and(|ttl| ttl <= MIN_HOLD)
    })
    .await
    .expect("the background release sets the TTL to the rest of min_hold");
    assert!(b.lock("job:dropped").try_acquire().await.unwrap().is_none());
}

/// The blocking release, made as the runtime shuts down with a guard still
/// waiting for its background release, keeps the lock too.
#[test]
fn dropped_as_the_runtime_ends_keeps_the_rest() {
    let redis = server();
    let url = redis.url();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let rt = runtime();
    let lock_key = rt.block_on(async {
        let m = manager_at(&url).await;
        let _g = m
            .lock("job:runtime-ends")
            .lease(Duration::from_secs(30))
            .min_hold(Duration::from_secs(3))
            .acquire()
            .await
            .unwrap();
        m.redis_names("job:runtime-ends").lock
        // `_g` dropped here: its background release never runs on this runtime.
    });
    drop(rt);
    runtime().block_on(async {
        let mut conn = raw(&redis).await;
        let ttl = pttl(&mut conn, &lock_key).await;
        assert!(
            ttl > 0 && ttl <= 3000,
            "kept for the rest of min_hold (not deleted, not left at the 30 s lease): {ttl}"
        );
    });
}

#[tokio::test]
async fn released_after_min_hold_is_deleted_at_once() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let g = a
        .lock("job:late")
        .min_hold(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    g.release().await.unwrap();
    assert!(
        a.inspect("job:late").await.unwrap().is_none(),
        "deleted by the release"
    );
    assert!(
        b.lock("job:late").try_acquire().await.unwrap().is_some(),
        "free for another manager at once"
    );
}

/// Bounds: a 1 s lease renewed every third of it, so a renewal late by up
/// to about 600 ms still keeps it; the release at about 2.2 s keeps the lock
/// to 3 s after the grant (600 ms left when it is tried at about 2.4 s);
/// freed then, found within 500 ms on a loaded machine.
#[tokio::test]
async fn min_hold_above_the_lease_renews_then_keeps() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let min_hold = Duration::from_secs(3);
    let granted = Instant::now();
    let g = a
        .lock("job:long")
        .lease(Duration::from_secs(1))
        .min_hold(min_hold)
        .acquire()
        .await
        .unwrap();
    // Held past two leases: renewed.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert!(!g.is_lost());
    g.release().await.unwrap();
    // Kept past its lease, for the rest of min_hold.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(b.lock("job:long").try_acquire().await.unwrap().is_none());
    eventually(Duration::from_secs(5), async || {
        b.lock("job:long").try_acquire().await.unwrap().is_some()
    })
    .await
    .expect("freed after min_hold");
    let at = granted.elapsed();
    assert!(
        at >= min_hold && at < min_hold + Duration::from_millis(500),
        "freed {at:?} after the grant, not at about min_hold"
    );
}

#[tokio::test]
async fn shutdown_keeps_the_rest_too() {
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let _g = a
        .lock("job:shutdown")
        .min_hold(MIN_HOLD)
        .acquire()
        .await
        .unwrap();
    a.shutdown().await.unwrap();
    assert!(
        b.lock("job:shutdown")
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "the shutdown's release keeps it for the rest of min_hold"
    );
    eventually(Duration::from_secs(2), async || {
        b.lock("job:shutdown")
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    })
    .await
    .expect("freed after min_hold");
}

#[tokio::test]
async fn min_hold_is_validated() {
    let redis = server();
    let a = manager(&redis).await;
    for bad in [Duration::ZERO, Duration::from_secs(31 * 24 * 3600)] {
        let e = a.lock("job:bad").min_hold(bad).acquire().await.unwrap_err();
        assert!(
            matches!(&e, LockError::InvalidConfig(m) if m.contains("min_hold")),
            "{e}"
        );
    }
    // Up to 30 days is fine.
    let g = a
        .lock("job:bad")
        .min_hold(Duration::from_secs(30 * 24 * 3600))
        .acquire()
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// ShedLock refuses `lockAtLeastFor` above `lockAtMostFor`: the hold would be
/// cut off (reported lost) at `max_hold`, before `min_hold` has passed. Both
/// the single-key and the multi-key request refuse it before any round trip,
/// and take the two equal.
#[tokio::test]
async fn min_hold_above_max_hold_is_refused() {
    let redis = server();
    let a = manager(&redis).await;
    let (min_hold, max_hold) = (Duration::from_secs(2), Duration::from_secs(1));
    let refused = |e: &LockError| {
        matches!(e, LockError::InvalidConfig(m)
            if m.contains("min_hold is 2s") && m.contains("max_hold 1s"))
    };
    // Each order of the two options, one attempt or a wait, one key or several.
    let errors = [
        a.lock("job:hold-order")
            .min_hold(min_hold)
            .max_hold(max_hold)
            .acquire()
            .await
            .map(drop),
        a.lock("job:hold-order")
            .max_hold(max_hold)
            .min_hold(min_hold)
            .try_acquire()
            .await
            .map(drop),
        a.lock_all(["job:hold-order:a", "job:hold-order:b"])
            .min_hold(min_hold)
            .max_hold(max_hold)
            .acquire()
            .await
            .map(drop),
    ];
    for e in errors {
        let e = e.unwrap_err();
        assert!(refused(&e), "{e}");
    }
    // Nothing was taken.
    assert!(!a.is_locked("job:hold-order").await.unwrap());
    assert!(!a.is_locked("job:hold-order:a").await.unwrap());

    let g = a
        .lock("job:hold-order")
        .min_hold(max_hold)
        .max_hold(max_hold)
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    g.release().await.unwrap();
}

const PERIOD: Duration = Duration::from_millis(600);
const OFFSET: Duration = Duration::from_millis(150);
const PERIODS: u32 = 5;

/// Runs in which period, by replica.
type Runs = Arc<Mutex<Vec<(u32, &'static str)>>>;

/// Two replicas tick every `PERIOD`, B `OFFSET` after A, and run `job` on
/// each tick; returns how many runs each period saw.
async fn two_replicas<F, Fut>(a: LockManager, b: LockManager, job: F) -> Vec<usize>
where
    F: Fn(LockManager, u32, &'static str, Runs) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let runs = Runs::default();
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let replicas = [(a, "a", Duration::ZERO), (b, "b", OFFSET)].map(|(m, name, offset)| {
        let (job, runs) = (job.clone(), runs.clone());
        tokio::spawn(async move {
            for period in 0..PERIODS {
                tokio::time::sleep_until(start + PERIOD * period + offset).await;
                job(m.clone(), period, name, runs.clone()).await;
            }
        })
    });
    for r in replicas {
        r.await.unwrap();
    }
    let runs = runs.lock().unwrap();
    (0..PERIODS)
        .map(|p| runs.iter().filter(|(q, _)| *q == p).count())
        .collect()
}

/// One tick by hand: `try_acquire`, a 10 ms body, release.
async fn tick(
    m: LockManager,
    key: &'static str,
    min_hold: Option<Duration>,
    period: u32,
    name: &'static str,
    runs: Runs,
) {
    let mut request = m.lock(key);
    if let Some(min_hold) = min_hold {
        request = request.min_hold(min_hold);
    }
    if let Some(g) = request.try_acquire().await.unwrap() {
        runs.lock().unwrap().push((period, name));
        tokio::time::sleep(Duration::from_millis(10)).await;
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn two_replicas_run_a_fast_job_once_per_period() {
    let redis = server();
    let per_period = two_replicas(
        manager(&redis).await,
        manager(&redis).await,
        |m, p, n, r| tick(m, "job:replicas", Some(MIN_HOLD), p, n, r),
    )
    .await;
    assert_eq!(per_period, vec![1; PERIODS as usize], "runs per period");

    // The same without min_hold: B, 150 ms late, finds the 10 ms job done and
    // runs it again.
    let per_period = two_replicas(
        manager(&redis).await,
        manager(&redis).await,
        |m, p, n, r| tick(m, "job:replicas-unkept", None, p, n, r),
    )
    .await;
    assert_eq!(
        per_period,
        vec![2; PERIODS as usize],
        "runs per period without min_hold"
    );
}

#[distributed_lock(key = "job:macro", min_hold = "400ms", wait = "0s", manager = m)]
async fn scheduled(
    m: &LockManager,
    period: u32,
    name: &'static str,
    runs: &Runs,
) -> Result<(), LockError> {
    runs.lock().unwrap().push((period, name));
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

#[tokio::test]
async fn two_replicas_through_the_attribute() {
    let redis = server();
    let per_period = two_replicas(
        manager(&redis).await,
        manager(&redis).await,
        |m, p, n, r| async move {
            match scheduled(&m, p, n, &r).await {
                Ok(()) | Err(LockError::Timeout { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
    assert_eq!(per_period, vec![1; PERIODS as usize], "runs per period");
}

/// A renewal in flight as the lock is released may run after the release's
/// `PEXPIRE` and set the TTL to a whole lease (renewals never shorten it, so
/// this matters where the lease is longer than the rest of the `min_hold`):
/// the renewal task then releases again. Many
/// short leases (renewed every 10 ms) released at scattered moments, none
/// freed before `min_hold`.
///
/// Which keys are checked follows from what the library promises: a release
/// that finds the lock still ours in Redis keeps it until `min_hold`, whatever
/// it returns; one that finds it expired keeps nothing. A 30 ms lease is often
/// lost on a loaded machine (a renewal delayed past it: CI saw 55 of 100), and
/// the release then returns `Lost`, though Redis may still have had the lock,
/// and kept it. So a key is checked when it still exists right after its
/// release, whatever the release returned: the release found it ours (nothing
/// else writes these keys, a renewal only extends a lock that exists, and an
/// expired key does not come back). A crossed renewal leaves the key in place
/// for another 30 ms, so the keys the bug frees are among those checked.
///
/// How many keys a run checks depends on the machine's load, not on the
/// library, so rounds of `KEYS` keys run until `MIN_CHECKED` keys were checked
/// (one round on an idle machine): when the fix was made, 3 to 7 of 100 keys
/// were freed without it, so 100 checked keys miss the bug with a probability
/// of 5% at worst. Crossings have since become rare (a renewal batch is now
/// sent microseconds after it is chosen): without the fix, 0 of 11 runs here
/// failed; with that gap widened by a 2 ms sleep, 5 of 5 failed (24 to 29 keys
/// freed) and, with the fix, 5 of 5 passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_crossing_the_release_does_not_shorten_min_hold() {
    const KEYS: usize = 100;
    const MIN_CHECKED: usize = 100;
    const MAX_ROUNDS: usize = 10;
    let redis = server();
    let (a, b) = (manager(&redis).await, manager(&redis).await);
    let conn = raw(&redis).await;
    let min_hold = Duration::from_secs(3);
    let (mut checked, mut released_ok, mut rounds) = (0, 0, 0);
    while checked < MIN_CHECKED {
        assert!(
            rounds < MAX_ROUNDS,
            "only {checked} keys were still ours at their release in {rounds} rounds of {KEYS} \
             ({released_ok} released Ok): too loaded a machine to test, rerun on a less loaded one"
        );
        let started = Instant::now();
        let holds = (0..KEYS).map(|i| {
            let (a, mut conn) = (a.clone(), conn.clone());
            let key = format!("job:crossed:{rounds}:{i}");
            tokio::spawn(async move {
                let g = match a
                    .lock(&key)
                    .lease(Duration::from_millis(30))
                    .min_hold(min_hold)
                    .acquire()
                    .await
                {
                    Ok(g) => g,
                    // Granted, but answered after its 30 ms had passed: not
                    // held, so nothing to check.
                    Err(LockError::Lost { .. }) => return (key, false, false),
                    Err(e) => panic!("{key}: {e}"),
                };
                tokio::time::sleep(Duration::from_micros(50 + 997 * (i as u64 % 40))).await;
                let ok = match g.release().await {
                    Ok(()) => true,
                    Err(LockError::Lost { .. }) => false,
                    Err(e) => panic!("{key}: {e}"),
                };
                let kept = exists(&mut conn, &a.redis_names(&key).lock).await;
                (key, ok, kept)
            })
        });
        let mut kept = Vec::new();
        for h in holds.collect::<Vec<_>>() {
            let (key, ok, still_there) = h.await.unwrap();
            released_ok += usize::from(ok);
            if still_there {
                kept.push(key);
            }
        }
        // Past the 30 ms lease a crossed renewal would have set.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut freed = Vec::new();
        for key in &kept {
            if b.lock(key).try_acquire().await.unwrap().is_some() {
                freed.push(key);
            }
        }
        let checked_after = started.elapsed();
        assert!(
            checked_after < min_hold,
            "the check ended past min_hold ({checked_after:?}): rerun on a less loaded machine"
        );
        assert!(
            freed.is_empty(),
            "freed before min_hold ({} of the {} kept at their release): {freed:?}",
            freed.len(),
            kept.len()
        );
        checked += kept.len();
        rounds += 1;
    }
    // Shown with --nocapture: how much a run tested.
    eprintln!("{checked} keys checked in {rounds} round(s) of {KEYS}; {released_ok} released Ok");
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    let d = Deployment::postgres();
    let (a, b) = (d.manager().await, d.manager().await);
    kept_until_min_hold(&a, &b, "min-hold:postgres").await;
}
