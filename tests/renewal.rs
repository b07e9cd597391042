//! The watchdog: renewal keeps a lock past its lease, stops at release, survives
//! a short outage, and one task serves every lock of a manager.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::LockError;

/// Renewal retries a failed attempt on a later tick instead of giving up: Redis
/// pauses all clients for longer than the command timeout, then answers again.
#[tokio::test]
async fn a_failed_renewal_is_retried() {
    let redis = server();
    let a = distlock::LockManager::builder(&redis.url())
        .command_timeout(Duration::from_millis(80))
        .build()
        .await
        .unwrap();
    let mut raw = raw(&redis).await;
    let g = a.lock("k").lease(RENEWED_LEASE).acquire().await.unwrap();
    // Renewals are due every 300 ms; pausing 350 ms makes at least one time out.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(350)
        .arg("ALL")
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!g.is_lost(), "a retried renewal keeps the lease");
    let ttl = pttl(&mut raw, &a.redis_names("k").lock).await;
    assert!(ttl > 300, "renewed recently: ttl {ttl}");
    g.release().await.unwrap();
}

/// Release racing the renewal tick: after release no renewal touches the key,
/// neither extending it nor the next holder's.
#[tokio::test]
async fn no_renewal_after_release() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let lock_key = a.redis_names("k").lock;
    for i in 0..60u64 {
        // Renewal every 300 ms (a third of the lease); release lands at
        // varying points of the tick (0 to 295 ms after the acquire). A
        // lease of 900 ms, not 300: a renewal later than the lease less one
        // interval loses the hold, which release then reports, and a CI run
        // on two loaded cores lost a 300 ms lease so (a tick over 200 ms
        // late); now that takes a tick 600 ms late.
        let g = a.lock("k").lease(RENEWED_LEASE).acquire().await.unwrap();
        tokio::time::sleep(Duration::from_micros(i * 5000)).await;
        g.release().await.unwrap();
        assert_eq!(a.held_count(), 0);
        let next = b
            .lock("k")
            .lease(Duration::from_millis(5000))
            .renew(false)
            .try_acquire()
            .await
            .unwrap()
            .expect("free after release");
        tokio::time::sleep(Duration::from_millis(15)).await;
        // A stale renewal would have reset the TTL to 900 ms.
        let ttl = pttl(&mut raw, &lock_key).await;
        assert!(ttl > 4000, "round {i}: next holder's ttl {ttl}");
        next.release().await.unwrap();
    }
}

/// A release cancelled at any of its await points (its future polled `n`
/// times, then dropped: the caller gave up) still ends the hold: the guard's
/// background release frees the lock, and no renewal runs for the hold after
/// that (redisson#7272: a watchdog that kept renewing after an interrupted
/// unlock). The renewal interval is lease / 3 = 100 ms, so three intervals of
/// silence (300 ms) would have shown at least two renewals of a hold that the
/// renewal task still kept. The short lease is what makes that window
/// short; a renewal tick late enough to lose it (200 ms) fails nothing here,
/// as no release's answer is looked at and a lost hold is no longer renewed.
#[tokio::test]
async fn no_renewal_after_a_release_cancelled_at_any_await_point() {
    use std::future::Future;
    use std::task::Poll;
    let redis = server();
    let a = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let lock_key = a.redis_names("c").lock;
    let mut completed_within = None;
    for polls in 0..64usize {
        let g = a
            .lock("c")
            .lease(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
        let mut release = Box::pin(g.release());
        let mut done = false;
        for _ in 0..polls {
            let ready =
                std::future::poll_fn(|cx| Poll::Ready(release.as_mut().poll(cx).is_ready())).await;
            if ready {
                done = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(release);
        // The background release (or the completed one) ends the hold; the
        // command timeout (2 s) bounds it. The lock can be gone while the
        // background release is still on its way (the cancelled release's
        // script ran), so the counters start once that one has finished too.
        let freed = eventually(Duration::from_secs(3), async || {
            a.held_count() == 0
                && a.background_releases_running() == 0
                && !exists(&mut raw, &lock_key).await
        })
        .await;
        assert!(freed.is_some(), "{polls} polls: the lock was not freed");
        reset_stats(&mut raw).await;
        let renewals_before = a.renewal_round_trips();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            a.renewal_round_trips(),
            renewals_before,
            "{polls} polls: the renewal task renewed after the release"
        );
        let calls = command_calls(&mut raw).await;
        assert_eq!(
            calls.get("evalsha"),
            None,
            "{polls} polls: a renewal (or anything) ran after the release: {calls:#?}"
        );
        assert!(!exists(&mut raw, &lock_key).await);
        if done {
            completed_within = Some(polls);
            break;
        }
    }
    assert!(
        completed_within.is_some(),
        "the release never completed within 64 polls: every await point was not reached"
    );
}

/// The renewal task sleeps until the earliest due lease and is woken only by a
/// lease due sooner: a short lease taken while a long one is held is renewed in
/// time.
#[tokio::test]
async fn a_shorter_lease_taken_later_is_renewed_in_time() {
    let redis = server();
    let a = manager(&redis).await;
    let long = a
        .lock("long")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await; // the task now sleeps ~10 s

    // 900 ms, renewed every 300 ms: losing it takes a renewal 600 ms late
    // (a 300 ms lease is lost by one 200 ms late). Unrenewed, its local
    // deadline (891 ms) passes before the check at 1 s or later.
    let short = a
        .lock("short")
        .lease(RENEWED_LEASE)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!short.is_lost(), "the short lease was not renewed");
    short.release().await.unwrap();
    long.release().await.unwrap();
}

/// An uncontended acquire/release cycle does not wake the renewal task: the
/// release removes the lease long before it is due, so waking the task for it
/// is a wasted cross-thread wake-up (and a scan) per acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_cycles_do_not_wake_the_renewal_task() {
    let redis = server();
    let m = manager(&redis).await;
    let cycle = async |key: String| {
        m.lock(key)
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    };
    // Warm-up: the first lease of an idle manager wakes the task once.
    for i in 0..5 {
        cycle(format!("warm-up:{i}")).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = m.renewal_task_wakeups();
    for i in 0..200 {
        cycle(format!("k:{i}")).await;
    }
    // Any wake-up the cycles caused has happened by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let woken = m.renewal_task_wakeups() - before;
    assert_eq!(woken, 0, "renewal task woke {woken} times in 200 cycles");
}

#[tokio::test]
async fn a_failing_renewal_is_reported_before_the_lease_is_lost() {
    use distlock::testing::{FaultMode, FaultProxy};
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    // Command timeout 500 ms (common::manager_at); lease 3 s, renewed every 1 s.
    let a = manager_at(&proxy.url()).await;
    let guard = a
        .lock("trouble")
        .lease(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let trouble = guard.renewal_trouble();
    proxy.set_mode(FaultMode::BlackHole);
    // The first renewal is due 1 s after the grant and times out 0.5 s later,
    // 1.5 s before the lease ends: reported then, with the lease still held.
    let reported = tokio::time::timeout(Duration::from_secs(3), trouble)
        .await
        .expect("a trouble report before the lease could end");
    assert!(!guard.is_lost());
    match reported {
        distlock::RenewalTrouble::Failed { remaining, .. } => {
            assert!(remaining > Duration::ZERO && remaining < Duration::from_secs(3));
        }
        other => panic!("expected a failed renewal, got {other:?}"),
    }
    // Redis is back before the lease ends: the retried renewal keeps it.
    proxy.set_mode(FaultMode::Pass);
    guard.release().await.unwrap();
}

/// A renewal that fails near the end of the lease is tried again within
/// what is left of it: a store back before the lease ends keeps the lease.
/// Issue: a failed renewal was retried a third of the interval later (a
/// ninth of the lease) whatever was left, so a store back in the last ninth
/// never saw the retry and the holder lost a lease Redis still kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_failing_near_the_end_is_retried_within_what_is_left() {
    use distlock::testing::{FaultMode, FaultProxy};
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let a = manager_at(&proxy.url()).await;
    // Lease 3 s: renewed every 1 s, a failed renewal retried 333 ms later at
    // most (a third of the interval).
    let lease = Duration::from_secs(3);
    let guard = a.lock("near-end").lease(lease).acquire().await.unwrap();
    // Every connection reset: each renewal fails at once, and is reported
    // with what is left of the lease.
    proxy.set_mode(FaultMode::Reset);
    let left = loop {
        match tokio::time::timeout(lease, guard.renewal_trouble())
            .await
            .expect("failed renewals are reported before the lease ends")
        {
            distlock::RenewalTrouble::Failed { remaining, .. }
                if remaining < Duration::from_millis(333) =>
            {
                break remaining;
            }
            _ => {}
        }
    };
    assert!(!guard.is_lost());
    // Back with less left than a third of the interval: Redis still keeps
    // the lock (its TTL, set by the last renewal that reached it, ends after
    // the holder's deadline), so a retry within `left` renews it, and what
    // is left grows back to about a whole lease.
    proxy.set_mode(FaultMode::Pass);
    let renewed = eventually(left, async || guard.remaining_lease() > lease / 2).await;
    assert!(
        renewed.is_some() && !guard.is_lost(),
        "not renewed within the {left:?} left (lost: {})",
        guard.is_lost()
    );
    guard.release().await.unwrap();
}

/// A renewal whose reply is lost on a connection that stays open (a stalled
/// peer, a dropped segment) is given up after a third of the lease (half of
/// what is left when it went out), not after the command timeout, and
/// retried on a new connection: a
/// 900 ms lease with the default 2 s command timeout was lost at its first
/// renewal whose reply went missing, though Redis kept the lock.
#[tokio::test]
async fn a_renewal_whose_reply_is_lost_is_retried_before_a_short_lease_ends() {
    use distlock::testing::FaultProxy;
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let a = distlock::LockManager::builder(&proxy.url())
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    // Every connection open (the wake-up subscriber's too) before the fault.
    open_every_connection(&a).await;
    let lease = Duration::from_millis(900);
    let guard = a.lock("dropped").lease(lease).acquire().await.unwrap();
    // Nothing else goes through the proxy now: the next reply is the first
    // renewal's (300 ms in; given up a third of the lease later, 300 ms
    // before the deadline).
    proxy.drop_next_replies(1);
    let trouble = tokio::time::timeout(lease, guard.renewal_trouble())
        .await
        .expect("the renewal is given up and reported before the lease ends");
    assert!(
        matches!(trouble, distlock::RenewalTrouble::Failed { .. }),
        "{trouble:?}"
    );
    // Retried within what is left (300 ms) on a new connection.
    let renewed = eventually(lease, async || guard.remaining_lease() > lease / 2).await;
    assert!(
        renewed.is_some() && !guard.is_lost(),
        "not renewed before the lease ended (lost: {})",
        guard.is_lost()
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_late_renewal_is_reported() {
    let redis = server();
    let a = manager(&redis).await;
    // Lease 600 ms: renewal due every 200 ms; "late" is over 60 ms (a tenth).
    let guard = a
        .lock("late")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let reported = {
        let mut trouble = std::pin::pin!(guard.renewal_trouble());
        // Polled once, so it watches from now on.
        assert!(tokio::time::timeout(Duration::ZERO, &mut trouble)
            .await
            .is_err());
        // This test's runtime has one thread: blocking it for 320 ms holds
        // back the renewal due at 200 ms by at least 120 ms, and leaves 280 ms
        // of lease.
        std::thread::sleep(Duration::from_millis(320));
        tokio::time::timeout(Duration::from_secs(5), &mut trouble)
            .await
            .expect("a trouble report")
    };
    match reported {
        distlock::RenewalTrouble::Late { late_by, .. } => {
            assert!(late_by >= Duration::from_millis(100), "{late_by:?}");
        }
        other => panic!("expected a late renewal, got {other:?}"),
    }
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
}

// Renewal on every store (`on_stores!`).

/// A 900 ms lease renewed for 1.1 s keeps others out; without renewal the
/// lock ends at its lease and the holder knew first; 300 renewing locks are
/// all renewed by one task, with no task per lock.
///
/// The renewed leases are 900 ms (renewed every 300 ms), not 300: on
/// PostgreSQL a grant's reply and each renewal commit to disk, and a 300 ms
/// lease is lost by a reply or renewal 200 ms late on a loaded machine; 900
/// ms takes 600 ms. Each wait below outlasts a lease, so a hold that was not
/// renewed is seen lost.
async fn renewal_on_every_store(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let g = a
        .lock("renewed")
        .lease(RENEWED_LEASE)
        .acquire()
        .await
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1100) {
        assert!(b.lock("renewed").try_acquire().await.unwrap().is_none());
        assert!(!g.is_lost());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    g.release().await.unwrap();

    // 1 s, though it is meant to run out: the grant's reply must come
    // within the lease, or the acquire answers `Lost`, and on PostgreSQL it
    // commits to disk first.
    let lease = Duration::from_millis(1000);
    // Taken before the acquire: the store's lease starts after this, however
    // late the reply comes.
    let start = Instant::now();
    let g = a
        .lock("unrenewed")
        .lease(lease)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    // The lease plus 2 s for the last try's round trips on a loaded machine.
    let free_after = eventually(lease + Duration::from_secs(2), async || {
        b.lock("unrenewed").try_acquire().await.unwrap().is_some()
    })
    .await
    .expect("expires");
    // 20 ms under the lease: the store's clock and ours tick apart.
    assert!(
        start.elapsed() >= lease - Duration::from_millis(20),
        "{free_after:?}"
    );
    assert!(g.is_lost(), "the holder knew before the store did");
    assert!(matches!(g.release().await, Err(LockError::Lost { .. })));

    let metrics = tokio::runtime::Handle::current().metrics();
    let tasks_before = metrics.num_alive_tasks();
    let mut guards = Vec::new();
    for i in 0..300 {
        guards.push(
            a.lock(format!("many:{i}"))
                .lease(RENEWED_LEASE)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Past every lock's local deadline (891 ms after its acquire was sent).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(guards.iter().all(|g| !g.is_lost()), "all renewed");
    let tasks_during = metrics.num_alive_tasks();
    assert!(
        tasks_during <= tasks_before + 2,
        "{tasks_before} -> {tasks_during} tasks"
    );
    for g in guards {
        g.release().await.unwrap();
    }
}

on_stores!(renewal_on_every_store);
