//! `guard.extend(lease)` replaces the lock's TTL (never adds to it) and later
//! renewals keep the new length (and never shorten what the store keeps);
//! `max_hold` ends a hold that lasts too long.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use distlock::{distributed_lock, LockError, LockManager};

#[tokio::test]
async fn extend_replaces_the_ttl_and_renewals_keep_the_new_length() {
    let redis = server();
    let m = manager(&redis).await;
    let mut conn = raw(&redis).await;
    let name = m.redis_names("ext").lock;
    // Without renewal, so that only extend moves the TTL. 1 s: the extend
    // must land within the lease, 200 ms in; a 500 ms lease leaves a loaded
    // machine 300 ms.
    let g = m
        .lock("ext")
        .lease(Duration::from_millis(1000))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.extend(Duration::from_secs(3)).await.unwrap();
    let ttl = pttl(&mut conn, &name).await;
    // Replaced: about 3 s from now, not 3 s plus the 800 ms that were left.
    assert!((2_800..=3_000).contains(&ttl), "{ttl}");
    assert_eq!(g.lease(), Duration::from_secs(3));
    // The holder's own deadline follows: still valid past the first lease.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!g.is_lost());
    // Shorter replaces too, and the deadline comes down with it.
    g.extend(Duration::from_millis(100)).await.unwrap();
    assert!(pttl(&mut conn, &name).await <= 100);
    // The new deadline is under 100 ms away; 1 s more for a late timer. A
    // deadline left at the old 3 s would fail it.
    tokio::time::timeout(Duration::from_millis(1100), g.lost())
        .await
        .expect("the shortened lease ends");
    assert!(matches!(
        g.extend(Duration::from_secs(1)).await,
        Err(LockError::Lost { .. })
    ));

    // With renewal on, renewals keep the extended length. 900 ms, not 300:
    // the lease must hold until the extend lands, and a 300 ms one is lost
    // by a renewal or reply 200 ms late. A renewal at the old pace (300 ms
    // after the acquire) and length would fall within the 500 ms below and
    // leave at most 900 ms.
    let g = m.lock("ext2").lease(RENEWED_LEASE).acquire().await.unwrap();
    g.extend(Duration::from_secs(5)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ttl = pttl(&mut conn, &m.redis_names("ext2").lock).await;
    assert!(ttl > 4_000, "{ttl}");
    assert!(matches!(
        g.extend(Duration::from_millis(1)).await,
        Err(LockError::InvalidConfig(_))
    ));
    g.release().await.unwrap();
}

/// An extend answered after the holder was told its lease was lost (its
/// local deadline passed while the call was out) returned `Ok(())`, and the
/// guard stayed lost for good: no renewal, `release` and `fencing_token`
/// said `Lost`. The loss stands and `extend` reports it; the release deletes
/// the lock the extend kept in the store.
///
/// Bounds: the 900 ms lease without renewal ends the holder's trust at most
/// 900 ms after the acquisition was sent; the extend's reply is held 2.1 s
/// (within the manager's 4 s command timeout), so `lost()` completes first
/// unless the machine stalls for 1.2 s. 900 ms, not 300: the acquire's reply
/// must come within the lease, or it answers `Lost`.
#[tokio::test]
async fn an_extend_answered_after_the_loss_was_told_reports_the_loss() {
    use distlock::testing::{FaultMode, FaultProxy};
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let m = manager_with_timeout(&proxy.url(), Duration::from_secs(4)).await;
    open_every_connection(&m).await;
    let g = m
        .lock("told-lost")
        .lease(Duration::from_millis(900))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    proxy.set_mode(FaultMode::DelayReplies(Duration::from_millis(2100)));
    let told = async {
        g.lost().await;
        Instant::now()
    };
    let extend = async {
        let outcome = g.extend(Duration::from_secs(10)).await;
        (outcome, Instant::now())
    };
    let (told_at, (extended, answered_at)) = tokio::join!(told, extend);
    assert!(told_at < answered_at, "the loss was told before the reply");
    assert!(
        matches!(extended, Err(LockError::Lost { ref key }) if key == "told-lost"),
        "{extended:?}"
    );
    assert!(g.is_lost());
    proxy.set_mode(FaultMode::Pass);
    // The extend kept the lock in the store for 10 s; the release, which
    // reports the loss, deletes it.
    let name = m.redis_names("told-lost").lock;
    let mut conn = raw(&redis).await;
    assert!(exists(&mut conn, &name).await);
    assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
    assert!(!exists(&mut conn, &name).await, "the release left the lock");
}

#[tokio::test]
async fn extend_after_the_lock_was_taken_over_reports_the_loss() {
    let redis = server();
    let m = manager(&redis).await;
    let g = m
        .lock("gone")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    del(&mut raw(&redis).await, &m.redis_names("gone").lock).await;
    assert!(matches!(
        g.extend(Duration::from_secs(5)).await,
        Err(LockError::Lost { .. })
    ));
    assert!(g.is_lost());
}

/// Renewed past its 900 ms lease, but never past 1.2 s from the grant. 900
/// ms, not 300: a renewal 200 ms late loses a 300 ms lease, which this test
/// would take for an early stop; 900 ms takes one 600 ms late.
#[distributed_lock(key = "capped:{id}", lease = "900ms", max_hold = "1200ms", manager = m)]
async fn stuck_body(m: &LockManager, id: u32, finished: &AtomicBool) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn max_hold_from_the_attribute_stops_a_stuck_body() {
    let redis = server();
    let m = manager(&redis).await;
    let other = manager(&redis).await;
    let finished = AtomicBool::new(false);
    let started = Instant::now();
    let outcome = stuck_body(&m, 1, &finished).await;
    let stopped_after = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::Lost { ref key }) if key == "capped:1"),
        "{outcome:?}"
    );
    assert!(!finished.load(Ordering::SeqCst), "the body was stopped");
    // Renewed beyond the first lease (whose local deadline is 891 ms),
    // ended at max_hold (1.2 s, counted from the acquire's sending, after
    // `started`); 1 s more for a late timer. Without max_hold the body would
    // finish at 3 s.
    assert!(
        stopped_after >= Duration::from_millis(1_150)
            && stopped_after < Duration::from_millis(1_200 + 1_000),
        "{stopped_after:?}"
    );
    // The lock is free again within a lease of that (the release may even
    // have deleted it already), plus 1 s for the waiter's attempts on a
    // loaded machine.
    let next = other
        .lock("capped:1")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(1_200 + 900 + 1_000));
    next.release().await.unwrap();
}

/// `extend` replaces the lease (never adds to it), seen through `inspect`;
/// renewals keep the new length; after a takeover it reports the loss; and
/// `max_hold` ends a renewed hold: on every store.
async fn extend_and_max_hold_on_every_store(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    let ttl_of = async |key: &str| other.inspect(key).await.unwrap().unwrap().ttl.unwrap();
    // 1 s: the grant's reply and then the extend, 200 ms in, must land
    // within the lease, and on PostgreSQL each commits to disk; a 500 ms
    // lease leaves a loaded machine 300 ms.
    let g = m
        .lock("ext")
        .lease(Duration::from_millis(1000))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.extend(Duration::from_secs(3)).await.unwrap();
    // Replaced: about 3 s from now, not 3 s plus the 800 ms that were left
    // (200 ms below leaves room for the inspect's round trip on a slow machine).
    let ttl = ttl_of("ext").await;
    assert!(
        ttl >= Duration::from_millis(2_800) && ttl <= Duration::from_secs(3),
        "{ttl:?}"
    );
    assert_eq!(g.lease(), Duration::from_secs(3));
    g.extend(Duration::from_millis(100)).await.unwrap();
    assert!(ttl_of("ext").await <= Duration::from_millis(100));
    // The new deadline is under 100 ms away; 1 s more for a late timer. A
    // deadline left at the old 3 s would fail it.
    tokio::time::timeout(Duration::from_millis(1100), g.lost())
        .await
        .expect("the shortened lease ends");
    assert!(matches!(
        g.extend(Duration::from_secs(1)).await,
        Err(LockError::Lost { .. })
    ));

    // With renewal on, renewals keep the extended length. 900 ms, not 300:
    // the lease must hold until the extend lands, and on PostgreSQL a 300 ms
    // one is lost by a grant's reply or renewal 200 ms late. A renewal at
    // the old pace (300 ms after the acquire) and length would fall within
    // the 500 ms below and leave at most 900 ms.
    let g = m.lock("ext2").lease(RENEWED_LEASE).acquire().await.unwrap();
    g.extend(Duration::from_secs(5)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ttl = ttl_of("ext2").await;
    assert!(ttl > Duration::from_secs(4), "{ttl:?}");
    assert!(matches!(
        g.extend(Duration::from_millis(1)).await,
        Err(LockError::InvalidConfig(_))
    ));
    g.release().await.unwrap();

    // Taken over: extend reports the loss.
    let g = m
        .lock("gone")
        .lease(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(other.force_unlock("gone").await.unwrap());
    assert!(matches!(
        g.extend(Duration::from_secs(5)).await,
        Err(LockError::Lost { .. })
    ));
    assert!(g.is_lost());

    // max_hold: renewed as usual, then lost at about 1.2 s. A 900 ms lease
    // (renewed every 300 ms), not 300: on PostgreSQL a renewal 200 ms late
    // loses the 300 ms one early; 900 ms takes one 600 ms late.
    let started = Instant::now();
    let g = m
        .lock("stuck-body")
        .lease(RENEWED_LEASE)
        .max_hold(Duration::from_millis(1200))
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("max_hold ends the hold");
    // max_hold counts from the acquire's sending, after `started`: not
    // before 1.2 s (less 50 ms), past the first lease's local deadline (891
    // ms), so a hold that was not renewed fails this too; 1 s more for a
    // late timer (without max_hold the timeout above fails).
    let lost_after = started.elapsed();
    assert!(
        lost_after >= Duration::from_millis(1_150)
            && lost_after < Duration::from_millis(1_200 + 1_000),
        "{lost_after:?}"
    );
    // The store's lease runs out within one lease (900 ms) of that, plus
    // 1 s for the waiter's attempts on a slow machine.
    let freed = other
        .lock("stuck-body")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_millis(1_200 + 900 + 1_000));
    freed.release().await.unwrap();
    assert!(matches!(g.release().await, Err(LockError::Lost { .. })));
}

on_stores!(extend_and_max_hold_on_every_store);

/// A lease shortened by `extend` while renewal is on is renewed at the new
/// length's pace (a third of it), not at the old one's; and a `lost()`
/// already waiting when `extend` shortens a lease without renewal wakes at
/// the new deadline, not at the old one: on every store.
async fn a_shortened_lease_keeps_pace_and_wakes_lost_waiters(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    let g = m
        .lock("shortened")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // 900 ms, not 600: renewed every 300 ms, it is lost only by a renewal
    // 600 ms late (on PostgreSQL each commits to disk).
    g.extend(Duration::from_millis(900)).await.unwrap();
    // A new lease and two thirds: renewed every 300 ms, the lock is still
    // ours; renewed on the old pace (first at 10 s), it ran out at 900 ms
    // and `other` took it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!g.is_lost(), "the shortened lease was not renewed in time");
    assert!(other
        .lock("shortened")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    g.release().await.unwrap();

    // Without renewal: a `lost()` that waits from before the extend. Its
    // old deadline is 30 s away; the new one 300 ms, so 5 s (the bound
    // below) is passed only by a waiter that kept the old one.
    let g = std::sync::Arc::new(
        m.lock("shortened-lost")
            .lease(Duration::from_secs(30))
            .renew(false)
            .acquire()
            .await
            .unwrap(),
    );
    let waiting = tokio::spawn({
        let g = g.clone();
        async move { g.lost().await }
    });
    // Let the waiter start waiting on the 30 s deadline first.
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished());
    g.extend(Duration::from_millis(300)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("lost() woke at the shortened deadline")
        .unwrap();
}

on_stores!(a_shortened_lease_keeps_pace_and_wakes_lost_waiters);

/// Sets the end of `user_key`'s holds in the store (the default lock's, or a
/// read-write lock's readers') to `from_now` from now, by hand: where an
/// `extend` to a longer lease leaves it when a renewal sent before it runs
/// after it (stranded on a connection replaced for silence, whose session
/// was in fact alive).
async fn set_lease_end(d: &Deployment, m: &LockManager, user_key: &str, from_now: Duration) {
    let ms = u64::try_from(from_now.as_millis()).unwrap();
    #[cfg(feature = "postgres")]
    if let Deployment::Postgres { server, schema } = d {
        // The schema is this deployment's own: every row is the test's.
        server
            .psql(&format!(
                "UPDATE {schema}.locks SET expires_at = clock_timestamp() + interval '{ms} ms'; \
                 UPDATE {schema}.shared_holds SET expires_at = clock_timestamp() + interval '{ms} ms'"
            ))
            .expect("set the lease's end");
        return;
    }
    let mut raw = d.raw_for(m, user_key).await;
    let lock = m.redis_names(user_key).lock;
    if exists(&mut raw, &lock).await {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(&lock)
            .arg(ms)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    if let Some(readers) = name_of(&mut raw, "rwr", user_key).await {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
        let end = secs * 1_000 + micros / 1_000 + ms;
        let owners: Vec<String> = redis::cmd("ZRANGE")
            .arg(&readers)
            .arg(0)
            .arg(-1)
            .query_async(&mut raw)
            .await
            .unwrap();
        for owner in owners {
            let _: i64 = redis::cmd("ZADD")
                .arg(&readers)
                .arg("XX")
                .arg(end)
                .arg(owner)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        let details = name_of(&mut raw, "rwrd", user_key).await;
        for name in std::iter::once(readers).chain(details) {
            let _: i64 = redis::cmd("PEXPIREAT")
                .arg(name)
                .arg(end)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    }
}

/// A renewal never shortens the lease the store keeps: a default lock and a
/// read hold whose ends were set a minute away by hand keep them through the
/// renewals that follow, on every store. Before, each renewal set the end
/// back to one lease from its own time, so a renewal that ran after an
/// `extend` to a longer lease ended the lock before the deadline its holder
/// trusted: another holder could take it while the first still held.
async fn a_renewal_never_shortens_the_stores_lease(d: Deployment) {
    let m = d.manager().await;
    // Long enough that a renewal task held up a few hundred ms on a loaded
    // machine does not lose the holds below.
    let lease = Duration::from_millis(1_500);
    let lock = m.lock("kept-long").lease(lease).acquire().await.unwrap();
    let read = m
        .read_lock("kept-long-r")
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    set_lease_end(&d, &m, "kept-long", Duration::from_secs(60)).await;
    set_lease_end(&d, &m, "kept-long-r", Duration::from_secs(60)).await;
    // Two leases: renewed every lease / 3 = 500 ms, each hold has been
    // renewed since its end was set, and renewed successfully, or its holder's
    // deadline (one lease after the last renewal that succeeded) has passed.
    tokio::time::sleep(2 * lease).await;
    assert!(!lock.is_lost() && !read.is_lost());
    let lock_ttl = m.inspect("kept-long").await.unwrap().unwrap().ttl.unwrap();
    let read_ttl = m.inspect_all("kept-long-r").await.unwrap().holds[0]
        .ttl
        .unwrap();
    // A minute less the few seconds above; a renewal that shortened left at
    // most one lease, 1.5 s.
    for ttl in [lock_ttl, read_ttl] {
        assert!(ttl > Duration::from_secs(50), "{ttl:?}");
    }
    assert!(!lock.is_lost() && !read.is_lost());
    // `extend` still sets the lease it is given, shorter too.
    lock.extend(Duration::from_secs(2)).await.unwrap();
    read.extend(Duration::from_secs(2)).await.unwrap();
    let lock_ttl = m.inspect("kept-long").await.unwrap().unwrap().ttl.unwrap();
    let read_ttl = m.inspect_all("kept-long-r").await.unwrap().holds[0]
        .ttl
        .unwrap();
    for ttl in [lock_ttl, read_ttl] {
        assert!(ttl <= Duration::from_secs(2), "{ttl:?}");
    }
    lock.release().await.unwrap();
    read.release().await.unwrap();
}

on_stores!(a_renewal_never_shortens_the_stores_lease);

/// Two extends of one hold at once (re-entrant guards in joined futures) end
/// with the holder trusting no more than the store keeps: whichever the store
/// ran last sets the TTL, and the holder's deadline must not be the other
/// one's. Each round extends to 1 s and to 60 s together, then compares the
/// holder's remaining lease with the lock's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_extends_leave_the_holder_trusting_no_more_than_the_store_keeps() {
    let redis = server();
    let m = manager(&redis).await;
    let mut conn = raw(&redis).await;
    let g = m
        .lock("extend:concurrent")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let name = m.redis_names("extend:concurrent").lock;
    for round in 0..200 {
        let (short, long) = tokio::join!(
            g.extend(Duration::from_secs(1)),
            g.extend(Duration::from_secs(60))
        );
        short.unwrap();
        long.unwrap();
        // The TTL first: the holder's remaining lease read after it can
        // only be smaller, so a pause between the two reads fails nothing.
        let kept = pttl(&mut conn, &name).await;
        let trusted = g.remaining_lease();
        assert!(
            trusted.as_millis() <= u128::try_from(kept).unwrap() + 5,
            "round {round}: the holder trusts {trusted:?}, the store keeps {kept} ms"
        );
    }
    g.release().await.unwrap();
}
