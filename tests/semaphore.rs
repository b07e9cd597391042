//! Semaphores: at most N holders, each permit with its own lease, renewal and
//! lost signal; permits of crashed holders come back; releases wake waiters;
//! permit counts change only on purpose; every test on one server and on a
//! Redis Cluster, most on PostgreSQL too (those that watch Redis's pub/sub
//! for the waiter's subscription stay on Redis).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use distlock::testing::RedisServer;
use distlock::{LockError, LockGuard, LockManager};
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;

crate::on_stores!(
    never_more_holders_than_permits,
    a_crashed_holders_permit_returns_within_its_lease,
    permit_counts_change_only_on_purpose,
    each_permit_is_renewed_and_learns_when_it_is_lost,
    reentry_keeps_one_permit,
    reentry_takes_no_more_permits_than_the_outer_hold,
    a_waiter_for_several_permits_is_woken_when_they_come_free,
    permits_that_run_out_unreleased_go_to_every_waiter,
    two_permits_released_at_once_go_to_two_waiters,
);

crate::on_both!(
    a_release_wakes_a_waiter,
    permits_a_lease_frees_reach_a_light_waiter_behind_a_heavy_one,
    a_light_waiter_is_not_held_up_by_a_heavy_one_of_its_manager,
    a_release_of_any_weight_is_one_message,
    one_weighted_release_wakes_a_waiter_per_permit,
    a_weighted_waiter_behind_another_is_woken_when_its_permits_come_free,
);

/// Tasks of several managers hammer a semaphore; the number inside never
/// exceeds the permits, and reaches them.
async fn never_more_than_the_permits(managers: &[LockManager], key: &str, permits: u32) {
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for m in managers {
        for _ in 0..8 {
            let (m, inside, most, key) = (m.clone(), inside.clone(), most.clone(), key.to_owned());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let g = m
                        .semaphore(key.as_str(), permits)
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .await
                        .unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert_eq!(
        most, permits as usize,
        "at most (and at some point exactly) {permits} inside"
    );
}

async fn never_more_holders_than_permits(d: Deployment) {
    let managers = vec![d.manager().await, d.manager().await, d.manager().await];
    let mut raw = d.redis_raw_for(&managers[0], "pool").await;
    never_more_than_the_permits(&managers, "pool", 3).await;
    if let Some(raw) = raw.as_mut() {
        assert_eq!(
            kinds_of(raw, "pool").await,
            ["semfence"],
            "no holder left behind"
        );
    }
    let state = managers[0].inspect_all("pool").await.unwrap();
    assert!(state.holds.is_empty(), "no holder left behind");
    assert_eq!(state.permits, None, "the count goes with the holders");
}

async fn a_crashed_holders_permit_returns_within_its_lease(d: Deployment) {
    let crashed = d.manager().await;
    let other = d.manager().await;
    // 1 s: the grant's reply must come within the lease, or the acquire
    // answers `Lost` (`guard::grant`); on PostgreSQL, with this file's other
    // tests committing beside it on two loaded cores, a 400 ms lease once ran
    // out before its reply came.
    const LEASE: Duration = Duration::from_millis(1000);
    let g = expiring_hold(&crashed, "conn", 1, 1, LEASE).await;
    // Neither released nor renewed: as if the process had died.
    std::mem::forget(g);
    assert!(other
        .semaphore("conn", 1)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let start = Instant::now();
    let g = other
        .semaphore("conn", 1)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    // The hold's lease ends at most LEASE after `start`; the waiter's
    // backoff is capped by the lease it was told remains, so it tries again
    // as it ends and is served by that attempt. 1.1 s covers that attempt's
    // round trips on a loaded machine (the same margin as with the former
    // 400 ms lease and its 1.5 s bound). A waiter left to its 5 s wait would
    // fail it.
    assert!(
        start.elapsed() < LEASE + Duration::from_millis(1100),
        "{:?}",
        start.elapsed()
    );
    g.release().await.unwrap();
}

/// The permits of a holder that died (leases that run out unreleased: nobody
/// publishes) go to every waiter of a manager as they run out (issue: only
/// the first waiter in line retried as the leases ended; the others slept
/// their backoff, up to 1 s by default, so a semaphore whose holder was killed
/// filled up again slowly: the torture suite's s10 saw at most 2 of 3
/// permits in use for a second after the killed holder's leases had ended).
async fn permits_that_run_out_unreleased_go_to_every_waiter(d: Deployment) {
    let crashed = d.manager().await;
    let b = d.manager().await;
    let key = "orphaned";
    // Leases that end one after another: the first waiter in line gets in
    // while the other two holds still run.
    const LEASES: [Duration; 3] = [
        Duration::from_millis(1000),
        Duration::from_millis(1300),
        Duration::from_millis(1600),
    ];
    for lease in LEASES {
        let g = expiring_hold(&crashed, key, 3, 1, lease).await;
        // Neither released nor renewed: as if the process had died.
        std::mem::forget(g);
    }
    let taken = Instant::now();
    let waiters: Vec<_> = (0..3).map(|_| spawn_permit_waiter(&b, key, 3, 1)).collect();
    await_parked(&b, 3).await;
    let mut guards = Vec::new();
    for waiter in waiters {
        // Kept until every waiter is in: a release now would wake the next.
        let (g, acquired) = waiter.await.unwrap();
        // The holds end by 1.6 s after `taken`. The first waiter in line
        // retries as each ends (its timer is capped by the first to end);
        // each that gets in on its timer has the next one look, which so
        // learns when the next hold ends. Their own timers would take 10 s
        // (see `slow_backoff`); 5 s leaves a loaded machine room.
        assert!(
            acquired.duration_since(taken) < Duration::from_secs(5),
            "a waiter got its permit {:?} after the holds began (leases {LEASES:?})",
            acquired.duration_since(taken)
        );
        guards.push(g);
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Two permits released at once go to two waiters of one manager. The first
/// release publishes; the second finds the semaphore no longer full and
/// publishes nothing, so the waiter that gets the first permit, told that
/// another is free, has the next waiter look (issue: that one slept its
/// backoff).
async fn two_permits_released_at_once_go_to_two_waiters(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let key = "pair";
    let mut holds = Vec::new();
    for _ in 0..2 {
        holds.push(
            a.semaphore(key, 2)
                .lease(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let waiters: Vec<_> = (0..2).map(|_| spawn_permit_waiter(&b, key, 2, 1)).collect();
    await_parked(&b, 2).await;
    let (second, first) = (holds.pop().unwrap(), holds.pop().unwrap());
    let released = Instant::now();
    let (one, two) = tokio::join!(first.release(), second.release());
    one.unwrap();
    two.unwrap();
    let mut guards = Vec::new();
    for waiter in waiters {
        let (g, acquired) = waiter.await.unwrap();
        // Only a wake-up gets a waiter in within 10 s (see `slow_backoff`).
        assert!(
            acquired.duration_since(released) < Duration::from_secs(5),
            "a waiter got its permit {:?} after the releases",
            acquired.duration_since(released)
        );
        guards.push(g);
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

async fn a_release_wakes_a_waiter(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let held = a.semaphore("wake", 2).acquire().await.unwrap();
    let held2 = a.semaphore("wake", 2).acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        // Its timer never brings it back within the test (a fixed 10 s nap):
        // only a wake-up message can hand it the permit in time. With the
        // default backoff, a timed retry could take it a moment before the
        // message came (a CI run under load did), and hear nothing.
        let g = b
            .semaphore("wake", 2)
            .wait(Duration::from_secs(20))
            .backoff(slow_backoff())
            .acquire()
            .await
            .unwrap();
        let at = Instant::now();
        g.release().await.unwrap();
        (at, b.wake_ups_delivered())
    });
    // The waiter listens (its subscription can take a while on a loaded
    // machine: a CI run released before it was confirmed), then parks on its
    // timer well before the release.
    let channel = a
        .redis_names("wake")
        .channel()
        .replacen("wake:", "semwake:", 1);
    let mut raw = d.raw_for(&a, "wake").await;
    let listening = eventually(Duration::from_secs(10), async || {
        numsub(&mut raw, &channel).await >= 1
    })
    .await;
    assert!(
        listening.is_some(),
        "the waiter never subscribed to {channel}"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, woken) = waiter.await.unwrap();
    assert!(
        acquired.duration_since(released) < Duration::from_millis(500),
        "took {:?}",
        acquired.duration_since(released)
    );
    assert!(woken >= 1, "woken by a wake-up message");
    held2.release().await.unwrap();
}

async fn permit_counts_change_only_on_purpose(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let mut raw = d.redis_raw_for(&a, "jobs").await;
    let one = a.semaphore("jobs", 2).acquire().await.unwrap();
    let err = b.semaphore("jobs", 3).try_acquire().await.unwrap_err();
    assert!(
        matches!(err, LockError::PermitsDiffer { ref key, held_with: 2, requested: 3 } if key == "jobs"),
        "{err}"
    );
    assert!(err.to_string().contains("resize_permits"), "{err}");

    // An explicit resize: current holders keep theirs, the new count stands.
    let two = b
        .semaphore("jobs", 3)
        .resize_permits()
        .acquire()
        .await
        .unwrap();
    let three = b.semaphore("jobs", 3).acquire().await.unwrap();
    assert!(b
        .semaphore("jobs", 3)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let err = a.semaphore("jobs", 2).try_acquire().await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::PermitsDiffer {
                held_with: 3,
                requested: 2,
                ..
            }
        ),
        "{err}"
    );

    // Down to 1 with three holders: nobody new enters until two have left.
    let resized = a
        .semaphore("jobs", 1)
        .resize_permits()
        .try_acquire()
        .await
        .unwrap();
    assert!(resized.is_none());
    one.release().await.unwrap();
    two.release().await.unwrap();
    assert!(a
        .semaphore("jobs", 1)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    three.release().await.unwrap();
    if let Some(raw) = raw.as_mut() {
        assert_eq!(kinds_of(raw, "jobs").await, ["semfence"]);
    }

    // Nobody holds it: the next request's count stands.
    let five = b.semaphore("jobs", 5).acquire().await.unwrap();
    five.release().await.unwrap();

    let err = a.semaphore("jobs", 0).try_acquire().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err}");
}

async fn each_permit_is_renewed_and_learns_when_it_is_lost(d: Deployment) {
    let m = d.manager().await;
    let mut raw = d.redis_raw_for(&m, "lease").await;
    // Short, so that three leases pass quickly; on PostgreSQL, whose
    // renewals commit (a WAL flush on a shared machine), long enough that a
    // slow commit does not lose the hold the test keeps.
    let lease = if d.is_postgres() {
        Duration::from_millis(1500)
    } else {
        Duration::from_millis(300)
    };
    let dropped = m
        .semaphore("lease", 2)
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    // The only holder yet (its owner token, before renewals reorder the set).
    let dropped_hold = m.inspect_all("lease").await.unwrap().holds.remove(0);
    let kept = m
        .semaphore("lease", 2)
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    assert!(dropped.fencing_token().await.unwrap() < kept.fencing_token().await.unwrap());
    // Take one holder out in the store (on Redis from its set, on PostgreSQL
    // by an operator's force-unlock); the other lives on through renewals.
    if let Some(raw) = raw.as_mut() {
        let set = name_of(raw, "sem", "lease")
            .await
            .expect("the holders' set");
        let _: i64 = redis::cmd("ZREM")
            .arg(&set)
            .arg(&dropped_hold.hold_id)
            .query_async(raw)
            .await
            .unwrap();
    } else {
        assert!(m.force_unlock_hold(&dropped_hold).await.unwrap());
    }
    // Told at its next renewal, a third of a lease (at most 0.5 s) on.
    tokio::time::timeout(Duration::from_secs(3), dropped.lost())
        .await
        .expect("lost() completes");
    tokio::time::sleep(lease * 3).await;
    assert!(!kept.is_lost(), "renewed past three leases");
    assert!(matches!(
        dropped.release().await,
        Err(LockError::Lost { .. })
    ));
    kept.release().await.unwrap();
    if let Some(raw) = raw.as_mut() {
        assert_eq!(kinds_of(raw, "lease").await, ["semfence"]);
    }
}

async fn reentry_keeps_one_permit(d: Deployment) {
    let m = d.manager().await;
    let g = m.semaphore("nested", 1).acquire().await.unwrap();
    g.scope(async {
        let again = m.semaphore("nested", 1).acquire().await.unwrap();
        assert_eq!(
            again.fencing_token().await.unwrap(),
            g.fencing_token().await.unwrap()
        );
        again.release().await.unwrap();
    })
    .await;
    g.release().await.unwrap();
}

/// A re-entry stands for the permits its outer hold took: asking for more
/// (a heavier weight) or for another permit count is refused, where it used
/// to re-enter and run a body meant for 3 permits on 1 while other holders
/// took the rest.
async fn reentry_takes_no_more_permits_than_the_outer_hold(d: Deployment) {
    let m = d.manager().await;
    let outer = m
        .semaphore("nested-weight", 4)
        .weight(2)
        .acquire()
        .await
        .unwrap();
    outer
        .scope(async {
            let heavier = m.semaphore("nested-weight", 4).weight(3).acquire().await;
            assert!(
                matches!(&heavier, Err(LockError::InvalidConfig(msg)) if msg.contains("2 permit(s)")),
                "{heavier:?}"
            );
            let other_count = m.semaphore("nested-weight", 5).acquire().await;
            assert!(
                matches!(
                    other_count,
                    Err(LockError::PermitsDiffer {
                        held_with: 4,
                        requested: 5,
                        ..
                    })
                ),
                "{other_count:?}"
            );
            // As heavy or lighter: re-entered, sharing the outer hold.
            for weight in [1, 2] {
                let again = m
                    .semaphore("nested-weight", 4)
                    .weight(weight)
                    .acquire()
                    .await
                    .unwrap();
                assert_eq!(
                    again.fencing_token().await.unwrap(),
                    outer.fencing_token().await.unwrap()
                );
                again.release().await.unwrap();
            }
        })
        .await;
    // The refusals took nothing: the other two permits are free.
    let rest = m
        .semaphore("nested-weight", 4)
        .weight(2)
        .try_acquire()
        .await
        .unwrap();
    assert!(
        rest.is_some(),
        "the outer hold's refused re-entries took permits"
    );
    drop(rest);
    outer.release().await.unwrap();
}

#[tokio::test]
async fn redlock_managers_refuse_semaphores_and_read_write_locks() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let m = LockManager::redlock_builder(servers.iter().map(|s| s.url()))
        .build()
        .await
        .unwrap();
    for err in [
        m.semaphore("k", 2).try_acquire().await.unwrap_err(),
        m.read_lock("k").try_acquire().await.unwrap_err(),
        m.write_lock("k").try_acquire().await.unwrap_err(),
    ] {
        assert!(
            matches!(err, LockError::InvalidConfig(ref why) if why.contains("Redlock")),
            "{err}"
        );
    }
}

/// Permit counts as users count them: held, configured and available, with
/// expired holders not counted, on one server.
#[tokio::test]
async fn permit_counts_follow_the_holders() {
    let redis = server();
    let m = manager(&redis).await;
    let request = || m.semaphore("pool", 5);
    let counts = request().permit_counts().await.unwrap();
    assert_eq!(
        (counts.configured, counts.held, counts.available),
        (5, 0, 5)
    );
    let a = request().acquire().await.unwrap();
    let b = request().acquire().await.unwrap();
    // 1 s: the hold must still be there for the counts below (two round
    // trips), and the grant's reply must come within the lease; 100 ms leaves
    // a loaded machine too little room.
    const SHORT: Duration = Duration::from_millis(1000);
    let short = request().lease(SHORT).renew(false).acquire().await.unwrap();
    let counts = request().permit_counts().await.unwrap();
    assert_eq!(
        (counts.configured, counts.held, counts.available),
        (5, 3, 2)
    );
    // A request with another count reads the count in force, the holders'.
    let other = m.semaphore("pool", 9).permit_counts().await.unwrap();
    assert_eq!((other.configured, other.available), (5, 2));
    // The short lease runs out (not renewed): it is not counted. The lease
    // plus 2 s for a loaded machine.
    let expired = eventually(SHORT + Duration::from_secs(2), async || {
        request().permit_counts().await.unwrap().held == 2
    })
    .await;
    assert!(expired.is_some());
    drop(short);
    a.release().await.unwrap();
    b.release().await.unwrap();
    let counts = request().permit_counts().await.unwrap();
    assert_eq!((counts.held, counts.available), (0, 5));
    // Not a semaphore: a typed error, no round trip needed.
    assert!(matches!(
        m.lock("pool").permit_counts().await,
        Err(distlock::LockError::InvalidConfig(_))
    ));
}

/// Weighted holds: 3 of 10 permits per hold, taken and given back together,
/// never more than 10 in use across managers; a heavy waiter is admitted once
/// enough permits are free; the counts add the weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_holds_never_exceed_the_permits() {
    let redis = server();
    let managers = [manager(&redis).await, manager(&redis).await];
    let in_use = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let m = managers[i % 2].clone();
        let (in_use, most) = (in_use.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let g = m
                    .semaphore("slots", 10)
                    .weight(3)
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                let now = in_use.fetch_add(3, Ordering::SeqCst) + 3;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                in_use.fetch_sub(3, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 3 holds of 3 fit in 10, a fourth does not.
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 9, "{most} permits in use at once");
    assert!(most >= 6, "holds never overlapped: {most}");

    let m = &managers[0];
    let big = m.semaphore("slots", 10).weight(8).acquire().await.unwrap();
    let counts = m.semaphore("slots", 10).permit_counts().await.unwrap();
    assert_eq!((counts.held, counts.available), (8, 2));
    assert!(m
        .semaphore("slots", 10)
        .weight(3)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let two = m.semaphore("slots", 10).weight(2).acquire().await.unwrap();
    // A waiter for 9 is admitted once both holds are released.
    let m2 = managers[1].clone();
    let heavy = tokio::spawn(async move {
        m2.semaphore("slots", 10)
            .weight(9)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!heavy.is_finished(), "9 permits are not free yet");
    big.release().await.unwrap();
    two.release().await.unwrap();
    let heavy = heavy.await.unwrap().unwrap();
    assert_eq!(
        m.semaphore("slots", 10).permit_counts().await.unwrap().held,
        9
    );
    heavy.release().await.unwrap();

    // Out of range, or on another kind of lock: a typed error.
    for bad in [0, 11] {
        assert!(matches!(
            m.semaphore("slots", 10).weight(bad).acquire().await,
            Err(LockError::InvalidConfig(_))
        ));
    }
    assert!(matches!(
        m.lock("slots").weight(2).acquire().await,
        Err(LockError::InvalidConfig(_))
    ));
}

/// A hold of `weight` of `key`'s `permits` taken without renewal: forgotten,
/// it ends when `lease` runs out, as a crashed holder's does, and nobody
/// publishes when it goes.
async fn expiring_hold(
    m: &LockManager,
    key: &str,
    permits: u32,
    weight: u32,
    lease: Duration,
) -> LockGuard {
    m.semaphore(key, permits)
        .weight(weight)
        .lease(lease)
        .renew(false)
        .acquire()
        .await
        .unwrap()
}

/// Spawns a wait of `m` for `weight` of `permits` permits of `key`, on the
/// slow backoff, that returns its guard and when it got it.
fn spawn_permit_waiter(
    m: &LockManager,
    key: &str,
    permits: u32,
    weight: u32,
) -> tokio::task::JoinHandle<(distlock::LockGuard, Instant)> {
    let (m, key) = (m.clone(), key.to_owned());
    tokio::spawn(async move {
        let g = m
            .semaphore(key, permits)
            .weight(weight)
            .backoff(slow_backoff())
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap();
        (g, Instant::now())
    })
}

/// The semaphore wake-up channel of `key`.
fn semaphore_channel(m: &LockManager, key: &str) -> String {
    m.redis_names(key)
        .channel()
        .replacen("wake:", "semwake:", 1)
}

/// Waits (up to 10 s) until someone listens on `channel`.
async fn await_listener(raw: &mut MultiplexedConnection, channel: &str) {
    let listening = eventually(Duration::from_secs(10), async || {
        numsub(raw, channel).await >= 1
    })
    .await;
    assert!(listening.is_some(), "nobody ever subscribed to {channel}");
}

/// A hold of every permit, however many, is released (and force-unlocked)
/// at once and wakes its waiter: the release publishes one message, not one
/// per permit (issue: a loop as long as the weight ran inside Redis; 10
/// million permits took 2.4 s there, so the release failed with `Backend`
/// and stalled the server; `u32::MAX`, minutes).
async fn a_release_of_any_weight_is_one_message(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let mut raw = d.raw_for(&a, "huge").await;
    for permits in [10_000_000, u32::MAX] {
        let all = a
            .semaphore("huge", permits)
            .weight(permits)
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let waiter = spawn_permit_waiter(&b, "huge", permits, 1);
        await_listener(&mut raw, &semaphore_channel(&a, "huge")).await;
        let released = Instant::now();
        all.release().await.expect("a release of every permit");
        let (one, acquired) = waiter.await.unwrap();
        // The waiter's timer cannot bring it in within 10 s (see
        // `slow_backoff`): 5 s leaves a loaded machine room for the wake-up.
        assert!(
            acquired.duration_since(released) < Duration::from_secs(5),
            "woken {:?} after the release of {permits} permits",
            acquired.duration_since(released)
        );
        one.release().await.unwrap();

        // An operator's force-unlock of such a hold: one message too.
        let all = a
            .semaphore("huge", permits)
            .weight(permits)
            .acquire()
            .await
            .unwrap();
        assert_eq!(b.force_unlock_all("huge").await.unwrap(), 1);
        // Freed: its holder learns it at its next renewal; nothing to release.
        drop(all);
    }
}

/// A release of 3 permits wakes three waiters of one manager with one
/// message: the first to get a permit passes the other wake-ups on.
async fn one_weighted_release_wakes_a_waiter_per_permit(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let key = "three";
    let mut raw = d.raw_for(&a, key).await;
    let channel = semaphore_channel(&a, key);
    let all = a
        .semaphore(key, 3)
        .weight(3)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiters: Vec<_> = (0..3).map(|_| spawn_permit_waiter(&b, key, 3, 1)).collect();
    await_listener(&mut raw, &channel).await;
    // What the release publishes, in order, up to a marker published after it
    // on the same server (one connection's messages on a channel keep their
    // order).
    let mut listen = d
        .redis_subscriber_for(&a, key, &channel)
        .await
        .expect("a Redis-only test");
    let released = Instant::now();
    all.release().await.unwrap();
    let mut guards = Vec::new();
    for waiter in waiters {
        let (g, acquired) = waiter.await.unwrap();
        // As in `a_release_of_any_weight_is_one_message`: only a wake-up
        // gets a waiter in within 10 s.
        assert!(
            acquired.duration_since(released) < Duration::from_secs(5),
            "a waiter got its permit {:?} after the release",
            acquired.duration_since(released)
        );
        guards.push(g);
    }
    let _: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg("marker")
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut messages = listen.on_message();
    let mut published = Vec::new();
    loop {
        let payload: String = messages.next().await.unwrap().get_payload().unwrap();
        if payload == "marker" {
            break;
        }
        published.push(payload);
    }
    assert_eq!(published.len(), 1, "{published:?}");
    assert!(published[0].starts_with("#3:"), "{published:?}");
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A waiter for 4 of 5 permits, kept out by three holders of one permit
/// each, is woken by the release that frees its fourth permit (issue: no
/// wake-up was published, since the semaphore had not been full and no hold
/// was weighted, so the waiter got its permits on its backoff timer; the
/// Redisson suite expects them within about 0.2 s of that release).
async fn a_waiter_for_several_permits_is_woken_when_they_come_free(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let key = "four";
    let mut raw = d.redis_raw_for(&a, key).await;
    let mut holds = Vec::new();
    for _ in 0..3 {
        holds.push(
            a.semaphore(key, 5)
                .lease(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let waiter = spawn_permit_waiter(&b, key, 5, 4);
    // The waiter's weight is recorded by its first attempt as a waiter (after
    // its subscription is confirmed): from then on a release knows of it.
    // (On Redis in the holders' details, field '?'; on PostgreSQL in the
    // semaphore's row of `shared_keys`.)
    let details = a.redis_names(key).lock.replacen(":lock:", ":semd:", 1);
    let recorded = eventually(Duration::from_secs(10), async || match raw.as_mut() {
        Some(raw) => {
            let weight: Option<String> = redis::cmd("HGET")
                .arg(&details)
                .arg("?")
                .query_async(raw)
                .await
                .unwrap();
            weight.as_deref() == Some("4")
        }
        None => d.recorded_waiting_weight(&a, key) == Some(4),
    })
    .await;
    assert!(recorded.is_some(), "the waiter's weight was never recorded");
    holds.pop().unwrap().release().await.unwrap();
    assert!(!waiter.is_finished(), "3 permits free are not 4");
    let released = Instant::now();
    holds.pop().unwrap().release().await.unwrap();
    let (four, acquired) = waiter.await.unwrap();
    // Its timer cannot bring it in within 10 s (see `slow_backoff`); 2 s
    // leaves a loaded machine room for the wake-up and one attempt.
    assert!(
        acquired.duration_since(released) < Duration::from_secs(2),
        "got its 4 permits {:?} after the release that freed them",
        acquired.duration_since(released)
    );
    four.release().await.unwrap();
    holds.pop().unwrap().release().await.unwrap();
}

/// A waiter for 3 of 5 permits queued behind a waiter for 1 of the same
/// manager makes no attempt of its own until it is first in line, so its
/// weight reaches Redis with the attempts of the waiter ahead: once that one
/// gets in, the single-permit releases that free the other's permits wake it
/// (issue: nothing recorded its weight, and with every hold of one permit and
/// the semaphore not full no release published, so it got in on its backoff
/// timer).
async fn a_weighted_waiter_behind_another_is_woken_when_its_permits_come_free(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let key = "behind";
    let mut raw = d.raw_for(&a, key).await;
    // A hold of 2 permits that ends on its own (a crashed holder): nobody
    // publishes when it goes.
    const EXPIRING: Duration = Duration::from_secs(3);
    let expiring = expiring_hold(&a, key, 5, 2, EXPIRING).await;
    let mut holds = Vec::new();
    for _ in 0..3 {
        holds.push(
            a.semaphore(key, 5)
                .lease(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Full. The waiter for 1 is refused and queues first; the waiter for 3,
    // of the same manager, queues behind it without an attempt (it makes no
    // round trip before it registers).
    let one = spawn_permit_waiter(&b, key, 5, 1);
    await_listener(&mut raw, &semaphore_channel(&a, key)).await;
    let registered = Instant::now();
    let three = spawn_permit_waiter(&b, key, 5, 3);
    // The first in line retries when the first lease ends: it finds the 2
    // permits free, takes 1 and leaves 1 free, with no hold of more than one
    // permit left.
    let (one, _) = one.await.unwrap();
    drop(expiring);
    assert!(!three.is_finished(), "1 permit free is not 3");
    holds.pop().unwrap().release().await.unwrap();
    let released = Instant::now();
    holds.pop().unwrap().release().await.unwrap();
    let (three, acquired) = three.await.unwrap();
    // Its timer (see `slow_backoff`: 10 s, no jitter) first fires 10 s after
    // it registered; the releases come about `EXPIRING` (3 s) after that, so
    // a grant within 2 s of the release that freed the third permit (room for
    // a loaded machine's wake-up and one attempt) is a wake-up's doing.
    assert!(
        released.duration_since(registered) + Duration::from_secs(2) < Duration::from_secs(10),
        "the releases came too late to tell a wake-up from the timer"
    );
    assert!(
        acquired.duration_since(released) < Duration::from_secs(2),
        "got its 3 permits {:?} after the release that freed them",
        acquired.duration_since(released)
    );
    three.release().await.unwrap();
    one.release().await.unwrap();
    holds.pop().unwrap().release().await.unwrap();
}

/// A light waiter of the same manager as a heavy one that waits is not held
/// up by it: arriving while permits it fits are free, it takes them at once
/// (rather than queueing behind the heavy one without an attempt), and
/// waiting behind it, it gets the permits a release frees that the heavy one
/// cannot use (the heavy one, woken and refused, wakes it).
async fn a_light_waiter_is_not_held_up_by_a_heavy_one_of_its_manager(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let key = "light-behind-heavy";
    let mut raw = d.raw_for(&a, key).await;
    let first = a.semaphore(key, 8).weight(4).acquire().await.unwrap();
    // The heavy waiter (6) queues with 4 permits free, on a timer of 10 s
    // (`slow_backoff`), as every waiter here: only an attempt or a wake-up
    // serves one within the bounds below.
    let heavy = spawn_permit_waiter(&b, key, 8, 6);
    await_listener(&mut raw, &semaphore_channel(&a, key)).await;
    await_parked(&b, 1).await;
    // A light acquisition of its manager that arrives meanwhile takes 2 of
    // the 4 free permits at once, rather than queueing behind the heavy one.
    let arrived = b
        .semaphore(key, 8)
        .weight(2)
        .backoff(slow_backoff())
        .wait(Duration::from_secs(5))
        .acquire();
    let arrived = tokio::time::timeout(Duration::from_secs(3), arrived)
        .await
        .expect("a light acquisition waited behind the heavy waiter")
        .unwrap();
    // A light waiter (3) queues behind the heavy one, 2 permits being free.
    let light = spawn_permit_waiter(&b, key, 8, 3);
    await_parked(&b, 2).await;
    // 4 permits free: too few for the heavy one, enough for the light one,
    // which the heavy one, woken and refused, wakes.
    let released = Instant::now();
    arrived.release().await.unwrap();
    let (light_guard, acquired) = tokio::time::timeout(Duration::from_secs(5), light)
        .await
        .expect("the light waiter was left waiting with 4 permits free")
        .unwrap();
    assert!(acquired.duration_since(released) < Duration::from_secs(5));
    assert!(!heavy.is_finished(), "1 permit free is not 6");
    light_guard.release().await.unwrap();
    first.release().await.unwrap();
    let (heavy, _) = heavy.await.unwrap();
    heavy.release().await.unwrap();
}

/// Permits that come free when a lease runs out (nobody publishes) reach a
/// light waiter behind a heavy one: the heavy one, first in line, attempts at
/// the lease's end on its own timer, is refused, and wakes the light one.
async fn permits_a_lease_frees_reach_a_light_waiter_behind_a_heavy_one(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let key = "expired-behind-heavy";
    let mut raw = d.raw_for(&a, key).await;
    const EXPIRING: Duration = Duration::from_secs(2);
    let expiring = expiring_hold(&a, key, 8, 2, EXPIRING).await;
    let kept = a
        .semaphore(key, 8)
        .weight(5)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // 1 permit free: the heavy waiter (6) and then the light one (3) queue,
    // both on timers of 10 s (`slow_backoff`).
    let heavy = spawn_permit_waiter(&b, key, 8, 6);
    await_listener(&mut raw, &semaphore_channel(&a, key)).await;
    let light = spawn_permit_waiter(&b, key, 8, 3);
    await_parked(&b, 2).await;
    let parked = Instant::now();
    // The 2 permits' lease ends about 2 s after it began, with nobody
    // publishing: 3 permits free, too few for the heavy waiter, enough for
    // the light one. Within 5 s of the parking, long before the light
    // waiter's own 10 s timer, it is served.
    std::mem::forget(expiring);
    let (light_guard, acquired) = tokio::time::timeout(Duration::from_secs(5), light)
        .await
        .expect("the light waiter was left waiting with 3 permits free")
        .unwrap();
    assert!(acquired.duration_since(parked) < Duration::from_secs(5));
    assert!(!heavy.is_finished(), "0 permits free are not 6");
    light_guard.release().await.unwrap();
    kept.release().await.unwrap();
    let (heavy, _) = heavy.await.unwrap();
    heavy.release().await.unwrap();
}

/// Two tasks of one manager hand a one-permit semaphore back and forth, each
/// waiting with a 10 s backoff, so that only a wake-up serves it in time. A
/// task that registers as a waiter just after the other left (the channel
/// still subscribed, its unsubscription not yet run) used to miss a release
/// heard in between, with nobody registered, and slept its whole backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_registers_as_the_last_one_leaves_hears_the_release() {
    let redis = distlock::testing::RedisServer::spawn().unwrap();
    let m = LockManager::connect(&redis.url()).await.unwrap();
    let key = "ping-pong";
    let round = |m: LockManager| async move {
        let mut slowest = Duration::ZERO;
        for _ in 0..100 {
            let started = std::time::Instant::now();
            let g = m
                .semaphore(key, 1)
                .backoff(slow_backoff())
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            slowest = slowest.max(started.elapsed());
            tokio::task::yield_now().await;
            g.release().await.unwrap();
        }
        slowest
    };
    let (a, b) = tokio::join!(
        tokio::spawn(round(m.clone())),
        tokio::spawn(round(m.clone()))
    );
    let slowest = a.unwrap().max(b.unwrap());
    // A wait served by its 10 s backoff instead of the release's message.
    assert!(
        slowest < Duration::from_secs(5),
        "slowest acquisition: {slowest:?}"
    );
}

/// Waiters of one manager take a permit in the order they came, also when
/// the confirmation of their channel's subscription wakes them all to look
/// again (for a release published before the manager listened): the first
/// in line answers it, not whichever of them the store serves first. The
/// confirmation comes late here (every reply to the waiters' manager is
/// 100 ms late), and the holder releases before it; each later waiter
/// used to attempt beside the first and could take the permit from it (a
/// CI run's `backoff` test: the second waiter held for good, and the first
/// timed out after 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriptions_confirmation_does_not_let_a_later_waiter_overtake() {
    let redis = RedisServer::spawn().unwrap();
    let proxy = distlock::testing::FaultProxy::start(redis.addr())
        .await
        .unwrap();
    let holder = LockManager::connect(&redis.url()).await.unwrap();
    let waiters = LockManager::connect(&proxy.url()).await.unwrap();
    open_every_connection(&waiters).await;
    for round in 0..10 {
        let key = format!("line-{round}");
        let held = holder.semaphore(&key, 1).acquire().await.unwrap();
        proxy.set_mode(distlock::testing::FaultMode::DelayReplies(
            Duration::from_millis(100),
        ));
        let order = Arc::new(AtomicUsize::new(0));
        let spawn_waiter = || {
            let (m, key, order) = (waiters.clone(), key.clone(), order.clone());
            tokio::spawn(async move {
                let g = m
                    .semaphore(key, 1)
                    .backoff(slow_backoff())
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                let place = order.fetch_add(1, Ordering::SeqCst);
                g.release().await.unwrap();
                place
            })
        };
        let first = spawn_waiter();
        assert!(eventually(Duration::from_secs(5), async || waiters
            .waiting_acquisitions()
            == 1)
        .await
        .is_some());
        let second = spawn_waiter();
        assert!(eventually(Duration::from_secs(5), async || waiters
            .waiting_acquisitions()
            == 2)
        .await
        .is_some());
        held.release().await.unwrap();
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        proxy.set_mode(distlock::testing::FaultMode::Pass);
        assert_eq!(
            (first, second),
            (0, 1),
            "round {round}: the second waiter took the permit first"
        );
    }
}
