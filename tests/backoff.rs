//! A waiter's backoff: a request's own, or the manager's, paces the attempts
//! of a waiter that no message brings the lock (here a semaphore's, whose
//! holder neither releases nor renews while the waiter waits).

mod common;

use std::time::Duration;

use common::*;
use distlock::testing::RedisServer;
use distlock::{Backoff, LockError, LockManager};

const WAIT: Duration = Duration::from_secs(2);

/// The acquire scripts a waiter sent while waiting `WAIT` for a permit that
/// `holder` keeps, with `backoff` on the request (or the manager's if `None`).
async fn attempts_while_waiting(
    server: &RedisServer,
    waiter: &LockManager,
    key: &str,
    backoff: Option<Backoff>,
) -> u64 {
    let holder = manager(server).await;
    let held = holder
        .semaphore(key, 1)
        .lease(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let mut raw = raw(server).await;
    reset_stats(&mut raw).await;
    let mut request = waiter.semaphore(key, 1).wait(WAIT);
    if let Some(backoff) = backoff {
        request = request.backoff(backoff);
    }
    let err = request.acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let attempts = calls_of(&mut raw, "evalsha").await;
    held.release().await.unwrap();
    attempts
}

#[tokio::test]
async fn a_requests_backoff_paces_its_attempts() {
    let server = server();
    let waiter = manager(&server).await;
    let ms = Duration::from_millis;

    // Besides its timer, a waiter attempts on up to two wake-ups that come
    // without a release: when the manager's pub/sub connection comes up and
    // when its subscription is confirmed (a release may have been published
    // before either). So: the first attempt, up to 2 wake-ups, one attempt
    // after each nap, and one at the deadline.
    //
    // 100 ms between attempts, no jitter: at most WAIT / 100 ms = 20 naps fit
    // (each is 100 ms or more), so at most 1 + 2 + 20 + 1 = 24 attempts. A
    // loaded machine stretches naps and round trips, so fewer may come: 6 or
    // more is still above the 4 that a slow backoff allows.
    let fast = Backoff::new(ms(100), ms(100)).with_jitter(0.0);
    let attempts = attempts_while_waiting(&server, &waiter, "fast", Some(fast)).await;
    assert!((6..=24).contains(&attempts), "{attempts} attempts");

    // A backoff that starts above WAIT, without jitter: one nap up to the
    // deadline, so the first attempt, up to 2 wake-ups and the attempt at the
    // deadline. (With jitter, a nap is random in [0, 5 s]: two in five end
    // before the deadline, each adding an attempt.)
    let slow = Backoff::new(ms(5_000), ms(5_000)).with_jitter(0.0);
    let attempts = attempts_while_waiting(&server, &waiter, "slow", Some(slow)).await;
    assert!((2..=4).contains(&attempts), "{attempts} attempts");
}

#[tokio::test]
async fn a_backoffs_growth_factor_sets_how_fast_its_sleeps_grow() {
    let server = server();
    let waiter = manager(&server).await;
    let ms = Duration::from_millis;

    // The same start (50 ms, no jitter) and a cap far above WAIT, so that the
    // factor alone decides how many naps fit in WAIT (2 s). Attempts as in
    // `a_requests_backoff_paces_its_attempts`: the first, up to 2 wake-ups,
    // one after each nap, and one at the deadline.
    //
    // Factor 1: every nap is 50 ms, at most 2000 / 50 = 40 naps, so at most
    // 1 + 2 + 40 + 1 = 44 attempts; a loaded machine stretches naps, so 10 or
    // more is asked, still above what factor 10 allows.
    let fixed = Backoff::new(ms(50), ms(10_000))
        .with_jitter(0.0)
        .with_factor(1.0);
    let attempts = attempts_while_waiting(&server, &waiter, "fixed", Some(fixed)).await;
    assert!((10..=44).contains(&attempts), "{attempts} attempts");

    // Factor 10: naps of 50 ms, 500 ms, then 5 s cut to the deadline, so at
    // most 3 naps: 1 + 2 + 3 + 1 = 7 attempts. (Doubling would fit 5 naps:
    // 50 + 100 + 200 + 400 + 800 = 1550 ms, the sixth cut at the deadline.)
    let steep = Backoff::new(ms(50), ms(10_000))
        .with_jitter(0.0)
        .with_factor(10.0);
    let attempts = attempts_while_waiting(&server, &waiter, "steep", Some(steep)).await;
    assert!((2..=7).contains(&attempts), "{attempts} attempts");
}

#[tokio::test]
async fn the_managers_backoff_is_the_default_and_a_request_overrides_it() {
    let server = server();
    let ms = Duration::from_millis;
    let slow = LockManager::builder(&server.url())
        .backoff(Backoff::new(ms(5_000), ms(10_000)).with_jitter(0.0))
        .build()
        .await
        .unwrap();
    // Bounds as in the test above: 2-4 attempts for a backoff above WAIT
    // without jitter.
    let attempts = attempts_while_waiting(&server, &slow, "by-manager", None).await;
    assert!((2..=4).contains(&attempts), "{attempts} attempts");
    let fast = Backoff::new(ms(100), ms(100)).with_jitter(0.0);
    let attempts = attempts_while_waiting(&server, &slow, "by-request", Some(fast)).await;
    assert!(attempts >= 6, "{attempts} attempts");
}

#[tokio::test]
async fn a_bad_backoff_is_refused_before_any_attempt() {
    let server = server();
    let ms = Duration::from_millis;
    let err = LockManager::builder(&server.url())
        .backoff(Backoff::new(ms(50), ms(10)))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::InvalidConfig(m) if m.contains("manager's backoff")),
        "{err:?}"
    );

    let m = manager(&server).await;
    let mut raw = raw(&server).await;
    reset_stats(&mut raw).await;
    for bad in [
        Backoff::new(ms(10), ms(20)).with_jitter(-0.1),
        Backoff::new(Duration::ZERO, ms(20)),
        Backoff::new(ms(10), ms(20)).with_factor(0.5),
    ] {
        let err = m.lock("k").backoff(bad).acquire().await.unwrap_err();
        assert!(
            matches!(&err, LockError::InvalidConfig(msg) if msg.contains("request's backoff")),
            "{err:?}"
        );
        let err = m
            .lock_all(["a", "b"])
            .backoff(bad)
            .acquire()
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
    }
    assert!(
        command_calls(&mut raw).await.is_empty(),
        "no command was sent"
    );
}

/// A waiter that becomes first in line because the one before it (of the
/// same manager) got the lock sets its timer by that holder's lease, not by
/// the backoff it drew while it was not first: when the new hold ends
/// without a release (here `renew(false)`, 1 s), it attempts then. Before,
/// it slept out its backoff (20 s here), the semaphore free meanwhile.
///
/// Bounds: the first waiter holds from the release on; its lease ends 1 s
/// later and the second attempts then (its timer is that lease); 5 s leaves
/// room for a loaded machine and stays far below the 20 s backoff. The lease
/// is 1 s, not 300 ms: the first waiter's grant must be answered within it,
/// or its acquire answers `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_first_in_line_behind_a_grant_sets_its_timer_by_that_lease() {
    let server = server();
    let holder = manager(&server).await;
    let waiters = manager(&server).await;
    let held = holder.semaphore("recap", 1).acquire().await.unwrap();
    let first = {
        let request = waiters
            .semaphore("recap", 1)
            .lease(Duration::from_millis(1000))
            .renew(false)
            .wait(Duration::from_secs(30));
        tokio::spawn(async move {
            // Held until its lease runs out, never released.
            std::mem::forget(request.acquire().await.unwrap());
        })
    };
    assert!(
        eventually(Duration::from_secs(5), async || waiters
            .waiting_acquisitions()
            == 1)
        .await
        .is_some(),
        "the first waiter did not wait"
    );
    let slow = Backoff::new(Duration::from_secs(20), Duration::from_secs(20)).with_jitter(0.0);
    let second = {
        let request = waiters
            .semaphore("recap", 1)
            .backoff(slow)
            .wait(Duration::from_secs(30));
        tokio::spawn(async move { request.acquire().await })
    };
    assert!(
        eventually(Duration::from_secs(5), async || waiters
            .waiting_acquisitions()
            == 2)
        .await
        .is_some(),
        "the second waiter did not wait"
    );
    held.release().await.unwrap();
    first.await.unwrap();
    let started = std::time::Instant::now();
    let got = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second waiter acquires within 5 s of the first's grant")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    got.release().await.unwrap();
}
