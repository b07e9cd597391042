//! Redlock over five private `redis-server`s: a lock is held while a majority
//! holds it, survives a minority's failures and restarts, gives partial grants
//! back, keeps fencing tokens increasing across majorities, and wakes one waiter
//! per release however many members publish it.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use distlock::testing::{FaultMode, FaultProxy, RedisServer};
use distlock::{distributed_lock, LockError, LockManager};

fn five() -> Vec<RedisServer> {
    (0..5).map(|_| server()).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

async fn redlock(urls: Vec<String>) -> LockManager {
    redlock_with_prefix(urls, "distlock:").await
}

/// A Redlock manager whose calls may take `command_timeout` (connections:
/// 500 ms), for tests on a loaded machine or a member slow to answer.
async fn redlock_with_timeout(urls: Vec<String>, command_timeout: Duration) -> LockManager {
    LockManager::redlock_builder(urls)
        .command_timeout(command_timeout)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("a Redlock manager")
}

async fn redlock_with_prefix(urls: Vec<String>, prefix: &str) -> LockManager {
    LockManager::redlock_builder(urls)
        .key_prefix(prefix)
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("a Redlock manager")
}

/// On how many of `servers` the lock of `key` exists (running servers only).
async fn holders(servers: &[RedisServer], m: &LockManager, key: &str) -> usize {
    let name = m.redis_names(key).lock;
    let mut n = 0;
    for s in servers.iter().filter(|s| s.is_running()) {
        if exists(&mut raw(s).await, &name).await {
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn fewer_than_three_members_are_refused() {
    let servers: Vec<_> = (0..2).map(|_| server()).collect();
    let refused = LockManager::redlock_builder(urls(&servers))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LockError::InvalidConfig(_)),
        "{refused:?}"
    );
}

#[tokio::test]
async fn all_up_exclusion_and_hand_off() {
    let servers = five();
    let a = redlock(urls(&servers)).await;
    let b = redlock(urls(&servers)).await;
    let inside = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let m = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (inside, entered) = (inside.clone(), entered.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let g = m
                    .lock("shared")
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                tokio::time::sleep(Duration::from_millis(1)).await;
                inside.store(false, Ordering::SeqCst);
                entered.fetch_add(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(entered.load(Ordering::SeqCst), 80);
    assert_eq!(holders(&servers, &a, "shared").await, 0);
}

#[tokio::test]
async fn one_release_wakes_one_waiter_per_manager_though_five_members_publish_it() {
    one_release_wakes_one_waiter_per_manager("distlock:").await;
}

/// release.lua derives the wake-up channel from the lock's names (the
/// prefix ends where the lock's and its queue's names first differ): a
/// prefix that contains "lock:" and "lockq:" itself must not confuse it.
#[tokio::test]
async fn the_wake_up_reaches_waiters_under_any_prefix() {
    one_release_wakes_one_waiter_per_manager("lock:lockq:").await;
}

async fn one_release_wakes_one_waiter_per_manager(prefix: &str) {
    let servers = five();
    let a = redlock_with_prefix(urls(&servers), prefix).await;
    let b = redlock_with_prefix(urls(&servers), prefix).await;
    let g = a.lock("wake").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = b
            .lock("wake")
            .backoff(slow_backoff())
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        (b, g)
    });
    // Until the waiter listens on every member.
    let channel = a.redis_names("wake").channel().to_owned();
    for s in &servers {
        let mut conn = raw(s).await;
        let listening = eventually(Duration::from_secs(5), async || {
            numsub(&mut conn, &channel).await == 1
        })
        .await;
        assert!(
            listening.is_some(),
            "the waiter never subscribed on a member"
        );
    }
    let released_at = Instant::now();
    g.release().await.unwrap();
    let (b, g2) = waiter.await.unwrap();
    // Woken by the release, not by its backoff: a fixed 10 s backoff (and a
    // 30 s lease for the holder) cannot get the waiter in within 5 s, and
    // with the default backoff (capped at 1 s) an attempt could take the
    // lock before the first copy of the message arrived, which then counted
    // no wake-up.
    assert!(released_at.elapsed() < Duration::from_secs(5));
    // Let the other members' copies of the message arrive: one wake-up.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.wake_ups_delivered(), 1);
    g2.release().await.unwrap();
}

/// A Redlock attempt short of a majority gives its grants back under the
/// owner token its request keeps, and that give-back wakes the lock's
/// waiters as a release would. Every member publishes each release, so
/// managers drop copies by payload: when a give-back's wake-up was the plain
/// owner token, the same owner's real release later was dropped as a copy
/// of it, and another manager's waiter it would have woken waited for its
/// backoff instead. A give-back's wake-up is now `<owner>~`.
///
/// Here another owner holds three members of five for 1.5 s (written by
/// hand), so the waiting acquisition is granted on the other two and gives
/// them back, until that lease ends and it takes the lock. What the first of
/// the free members publishes on the wake-up channel: the give-backs, then
/// the release.
#[tokio::test]
async fn a_give_back_wakes_waiters_with_a_payload_its_owners_release_does_not_repeat() {
    use futures_util::StreamExt;
    let servers = five();
    let m = redlock(urls(&servers)).await;
    let names = m.redis_names("given");
    for s in &servers[1..4] {
        let () = redis::cmd("SET")
            .arg(&names.lock)
            .arg("0123456789abcdef0123456789abcdef-0:1700000000000:by-hand")
            .arg("PX")
            .arg(1500)
            .query_async(&mut raw(s).await)
            .await
            .unwrap();
    }
    let mut heard = redis::Client::open(servers[0].url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    heard.subscribe(names.channel()).await.unwrap();
    // The hand-written lease ends within 1.5 s, and the waiter's backoff is
    // capped by it: 10 s leave room for a loaded machine.
    m.lock("given")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut payloads = Vec::new();
    let mut messages = heard.on_message();
    // Up to the first unmarked payload, a release's or (before the mark) the
    // first give-back's. The release's message left before its reply: it is
    // here, or on its way (10 s for a loaded machine).
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(message) = messages.next().await {
            let payload = message.get_payload::<String>().unwrap();
            let unmarked = !payload.ends_with('~');
            payloads.push(payload);
            if unmarked {
                break;
            }
        }
    })
    .await;
    assert!(
        payloads.len() >= 2,
        "a give-back and a release: {payloads:?}"
    );
    let (release, give_backs) = payloads.split_last().unwrap();
    for give_back in give_backs {
        assert_eq!(
            *give_back,
            format!("{release}~"),
            "each give-back's wake-up is the releasing owner's, marked: {payloads:?}"
        );
    }
}

/// Under contention the lock goes to either manager's waiters, not for long
/// stretches to the releasing manager's: a wake-up heard while a waiter's
/// winning attempt was in flight, once passed on to the next waiter of its
/// manager, sent that one to attempt while the lock was still held, right
/// behind the holder's release on the same connections (about 2 in 100
/// hand-offs then changed manager).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_contention_the_lock_changes_manager() {
    let servers = five();
    let managers = [redlock(urls(&servers)).await, redlock(urls(&servers)).await];
    // The manager of the last acquisition, hand-offs, and those between managers.
    let seen = Arc::new(std::sync::Mutex::new((None::<usize>, 0u32, 0u32)));
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (m, seen) = (managers[i % 2].clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let g = m
                    .lock("contended")
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                {
                    let mut seen = seen.lock().unwrap();
                    if let Some(last) = seen.0 {
                        seen.1 += 1;
                        if last != i % 2 {
                            seen.2 += 1;
                        }
                    }
                    seen.0 = Some(i % 2);
                }
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, handoffs, across) = *seen.lock().unwrap();
    assert!(handoffs >= 100, "only {handoffs} hand-offs");
    assert!(
        across * 100 >= handoffs * 6,
        "{across} of {handoffs} hand-offs changed manager"
    );
}

#[tokio::test]
async fn two_members_down_still_grant_and_exclude_three_down_fail_with_quorum_failed() {
    let mut servers = five();
    let m = redlock(urls(&servers)).await;
    let other = redlock(urls(&servers)).await;
    servers[0].kill().unwrap();
    servers[1].kill().unwrap();
    let g = m.lock("two-down").acquire().await.unwrap();
    assert!(other
        .lock("two-down")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert_eq!(holders(&servers, &m, "two-down").await, 3);
    g.release().await.unwrap();

    servers[2].kill().unwrap();
    let started = Instant::now();
    let refused = m
        .lock("three-down")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            LockError::QuorumFailed {
                granted: 2,
                needed: 3,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    // The two grants it did get were given back.
    assert_eq!(holders(&servers, &m, "three-down").await, 0);
}

#[tokio::test]
async fn members_delayed_past_the_lease_give_no_grant_and_partial_grants_are_released() {
    let servers = five();
    let mut proxies = Vec::new();
    for s in &servers[..3] {
        proxies.push(FaultProxy::start(s.addr()).await.unwrap());
    }
    let mut member_urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    member_urls.extend(servers[3..].iter().map(RedisServer::url));
    let m = redlock(member_urls).await;
    for p in &proxies {
        p.set_mode(FaultMode::Delay(Duration::from_millis(400)));
    }
    let refused = m
        .lock("slow")
        .lease(Duration::from_millis(300))
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LockError::QuorumFailed { granted: 2, .. }),
        "{refused:?}"
    );
    // Nothing stays held anywhere, once the delayed calls have landed too.
    let clean = eventually(Duration::from_secs(5), async || {
        holders(&servers, &m, "slow").await == 0
    })
    .await;
    assert!(clean.is_some(), "a partial grant stayed held");
}

/// An attempt found the lock busy (another owner on four members of five)
/// and was granted on the fifth, whose reply was lost; the clean-up round
/// could not reach that member either. The attempt counts as busy (a
/// `try_acquire` returns `None`), and the acquisition, leaving without the
/// lock, gives that grant back by its owner token in the background once the
/// member answers again. Before, nothing did: the fifth member kept the key
/// for the whole lease (30 s), one member short of a majority for everyone.
///
/// Bounds: the member timeout is the command timeout (500 ms) for each of
/// the two rounds; the background release is retried until it lands, within
/// 10 s once the proxy passes again (its first tries meet the black hole and
/// time out, 500 ms each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_left_on_a_member_that_missed_the_clean_up_is_given_back() {
    let servers = five();
    let proxy = FaultProxy::start(servers[4].addr()).await.unwrap();
    let holder = redlock(urls(&servers)).await;
    let mut through_proxy = urls(&servers[..4]);
    through_proxy.push(proxy.url());
    let other = redlock(through_proxy).await;
    let held = holder
        .lock("orphan")
        .lease(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let name = holder.redis_names("orphan").lock;
    let mut fifth = raw(&servers[4]).await;
    let () = redis::cmd("DEL")
        .arg(&name)
        .query_async(&mut fifth)
        .await
        .unwrap();
    // Every connection of the other manager open (and its scripts loaded)
    // before the fault: the next reply through the proxy is the attempt's.
    open_every_connection(&other).await;
    proxy.drop_next_replies(1);
    let attempt = tokio::spawn({
        let other = other.clone();
        async move {
            other
                .lock("orphan")
                .lease(Duration::from_secs(30))
                .try_acquire()
                .await
        }
    });
    // The attempt's reply is dropped at once; its clean-up round comes a
    // member timeout (500 ms) later, into the black hole.
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_mode(FaultMode::BlackHole);
    assert!(
        attempt.await.unwrap().unwrap().is_none(),
        "the lock was busy on four members"
    );
    assert!(
        exists(&mut fifth, &name).await,
        "the fifth member granted it"
    );
    proxy.set_mode(FaultMode::Pass);
    let given_back = eventually(Duration::from_secs(10), async || {
        !exists(&mut fifth, &name).await
    })
    .await;
    assert!(
        given_back.is_some(),
        "the grant left on the fifth member stayed"
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_release_that_reached_fewer_than_a_majority_is_retried() {
    let servers = five();
    let mut proxies = Vec::new();
    for s in &servers[1..] {
        proxies.push(FaultProxy::start(s.addr()).await.unwrap());
    }
    let mut member_urls = vec![servers[0].url()];
    member_urls.extend(proxies.iter().map(FaultProxy::url));
    let m = redlock(member_urls).await;
    let guard = m
        .lock("partial")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert_eq!(holders(&servers, &m, "partial").await, 5);
    // Four members of five stop answering: the release reaches one.
    for p in &proxies {
        p.set_mode(FaultMode::BlackHole);
    }
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Backend { .. })),
        "a release one member of five answered counted as done: {released:?}"
    );
    for p in &proxies {
        p.set_mode(FaultMode::Pass);
    }
    // Retried in the background, it reaches the four once they answer
    // again, long before the 30 s lease would have freed them.
    let freed = eventually(Duration::from_secs(10), async || {
        holders(&servers, &m, "partial").await == 0
    })
    .await;
    assert!(freed.is_some(), "four members of five kept the lock");
}

#[tokio::test]
async fn renewal_survives_two_deaths_and_reports_the_loss_at_the_third() {
    let mut servers = five();
    let m = redlock(urls(&servers)).await;
    let lease = Duration::from_millis(600);
    let g = m.lock("renewed").lease(lease).acquire().await.unwrap();
    servers[0].kill().unwrap();
    servers[1].kill().unwrap();
    // Several leases long: renewals keep the majority.
    tokio::time::sleep(lease * 3).await;
    assert!(!g.is_lost());
    assert_eq!(holders(&servers, &m, "renewed").await, 3);
    servers[2].kill().unwrap();
    let killed = Instant::now();
    tokio::time::timeout(lease * 2, g.lost())
        .await
        .expect("the loss is reported");
    // Reported by the local deadline: within one lease of the last renewal.
    assert!(killed.elapsed() <= lease, "{:?}", killed.elapsed());
}

/// A member restarted empty forgets the lock, but the holder still has the
/// other four: an intruder can get at most that one member, far from a
/// majority. The holder's next renewal puts the lock back on it.
#[tokio::test]
async fn a_member_restarted_empty_lets_nobody_in_and_gets_the_lock_back() {
    let mut servers = five();
    let m = redlock(urls(&servers)).await;
    let intruder = redlock(urls(&servers)).await;
    let lease = Duration::from_millis(900);
    let g = m.lock("restart").lease(lease).acquire().await.unwrap();
    servers[0].restart().unwrap();
    assert!(intruder
        .lock("restart")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    let name = m.redis_names("restart").lock;
    let mut conn = raw(&servers[0]).await;
    // Renewal rounds come every lease / 3 (300 ms); the first ones after the
    // restart may find the member's connection still broken (the client
    // reconnects on the next call) or the server not yet listening. Nine
    // rounds leave room for a loaded machine; the holder keeps its majority
    // meanwhile (four members), which `is_lost` below checks.
    let back = eventually(lease * 3, async || exists(&mut conn, &name).await).await;
    assert!(
        back.is_some(),
        "the restarted member never got the lock back"
    );
    assert!(!g.is_lost());
    g.release().await.unwrap();
}

/// A fenced lock put back on a member restarted empty keeps the hold's
/// token there: `inspect` (and a leader's epoch, which reads it) says the
/// token the holder has. The member, whose counter was gone too, issued one
/// of its own (from its clock: larger), which the lock's value kept, and
/// `inspect`, taking the largest among the owner's majority, reported a
/// token the holder never had. Bounds as in
/// `a_member_restarted_empty_lets_nobody_in_and_gets_the_lock_back`.
#[tokio::test]
async fn a_fenced_lock_put_back_on_a_restarted_member_keeps_its_token() {
    let mut servers = five();
    let m = redlock(urls(&servers)).await;
    let lease = Duration::from_millis(900);
    let g = m
        .lock("restart-fenced")
        .lease(lease)
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap();
    let token = g.fencing_token().await.unwrap();
    servers[0].restart().unwrap();
    let name = m.redis_names("restart-fenced").lock;
    let mut conn = raw(&servers[0]).await;
    let back = eventually(lease * 3, async || exists(&mut conn, &name).await).await;
    assert!(
        back.is_some(),
        "the restarted member never got the lock back"
    );
    let reported = eventually(lease * 3, async || {
        m.inspect("restart-fenced")
            .await
            .unwrap()
            .map(|i| i.fencing_token)
            == Some(token)
    })
    .await;
    assert!(
        reported.is_some(),
        "inspect reports {:?}, the holder has {token}",
        m.inspect("restart-fenced")
            .await
            .unwrap()
            .map(|i| i.fencing_token)
    );
    assert!(!g.is_lost());
    g.release().await.unwrap();
}

/// With one member restarted empty and another cut off, every lease renewed
/// is re-created on the first, each re-creation waiting for the second until
/// the member timeout: all at once, so that the renewal task is back in time.
#[tokio::test]
async fn re_creating_many_locks_on_a_restarted_member_loses_none() {
    let mut servers = five();
    let proxy = FaultProxy::start(servers[4].addr()).await.unwrap();
    let mut member_urls = urls(&servers[..4]);
    member_urls.push(proxy.url());
    let m = redlock(member_urls).await;
    let lease = Duration::from_secs(3);
    let mut guards = Vec::new();
    for i in 0..12 {
        guards.push(
            m.lock(format!("many:{i}"))
                .lease(lease)
                .acquire()
                .await
                .unwrap(),
        );
    }
    servers[0].restart().unwrap();
    proxy.set_mode(FaultMode::BlackHole);
    // Renewals come every lease / 3 (1 s); a member that does not answer
    // holds a round up for the member timeout, lease / 10 (0.3 s). The first
    // round after the restart finds the 12 locks gone from the restarted
    // member and re-creates them, each call to the cut-off member waiting
    // 0.3 s: 3.6 s one after another, past the 3 s leases; 0.3 s at once.
    let lost = tokio::time::timeout(
        lease * 2,
        futures_util::future::select_all(guards.iter().map(|g| Box::pin(g.lost()))),
    )
    .await
    .is_ok();
    assert!(!lost, "a lease was lost while a majority held it");
    proxy.set_mode(FaultMode::Pass);
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A member whose counter is far ahead is in the first holder's majority and
/// out of the second's: the write-back round still makes the second token larger.
#[tokio::test]
async fn tokens_increase_across_majorities_with_and_without_a_member_ahead() {
    let servers = five();
    let m = redlock(urls(&servers)).await;
    let fence = m.redis_names("fenced").fencing_counter().to_owned();
    let ahead: u64 = 9_000_000_000_000_000;
    redis::cmd("SET")
        .arg(&fence)
        .arg(ahead)
        .query_async::<()>(&mut raw(&servers[0]).await)
        .await
        .unwrap();
    let first = m.lock("fenced").acquire().await.unwrap();
    let t1 = first.fencing_token().await.unwrap();
    assert!(t1 > ahead);
    first.release().await.unwrap();
    servers[0].pause().unwrap();
    let second = m.lock("fenced").acquire().await.unwrap();
    let t2 = second.fencing_token().await.unwrap();
    second.release().await.unwrap();
    servers[0].resume().unwrap();
    let third = m.lock("fenced").acquire().await.unwrap();
    let t3 = third.fencing_token().await.unwrap();
    third.release().await.unwrap();
    assert!(t1 < t2 && t2 < t3, "{t1} {t2} {t3}");
}

#[distributed_lock(key = "job:{id}", lease = "2s", wait = "5s", manager = manager)]
async fn locked_job(manager: &LockManager, id: u32, runs: &AtomicU32) -> Result<u32, LockError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + id)
}

#[tokio::test]
async fn a_locked_function_runs_unchanged_on_redlock() {
    let servers = five();
    let m = redlock(urls(&servers)).await;
    let runs = AtomicU32::new(0);
    assert_eq!(locked_job(&m, 7, &runs).await.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(holders(&servers, &m, "job:7").await, 0);
}

#[tokio::test]
async fn a_manager_starts_with_a_minority_down_and_uses_it_once_it_is_back() {
    let mut servers = five();
    servers[0].kill().unwrap();
    servers[1].kill().unwrap();
    // The members back are used once their start-up check passes, which
    // their first call waits for within the command timeout: 2 s, for a
    // loaded machine.
    let m = redlock_with_timeout(urls(&servers), Duration::from_secs(2)).await;
    let g = m.lock("late").acquire().await.unwrap();
    assert_eq!(holders(&servers, &m, "late").await, 3);
    g.release().await.unwrap();
    servers[0].start().unwrap();
    servers[1].start().unwrap();
    let g = m.lock("late").acquire().await.unwrap();
    assert_eq!(holders(&servers, &m, "late").await, 5);
    g.release().await.unwrap();

    servers[2].kill().unwrap();
    servers[3].kill().unwrap();
    servers[4].kill().unwrap();
    let refused = LockManager::redlock_builder(urls(&servers))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(refused, LockError::Connect { .. }), "{refused:?}");
}

/// A member down at `build()` is connected on first use, and used only once
/// it passes the start-up check `build()` would have run on it. Before, it
/// was used unchecked: here a member back with an evicting
/// `maxmemory-policy`, which this manager refuses
/// (`reject_evicting_policy(true)`), took part in every majority. Now its
/// calls are refused (it holds nothing) while the check fails; the member
/// that comes back well configured takes part from its first use on (the
/// call waits for its check within the member's timeout); and a failed check
/// runs again 5 s later, so the first member, once mended, takes part too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_at_build_is_used_only_once_it_passes_the_start_up_check() {
    let mut servers = five();
    servers[0].kill().unwrap();
    servers[1].kill().unwrap();
    // A member's call may wait for its check within the member's timeout
    // (the command timeout here): 2 s, for a loaded machine.
    let m = LockManager::redlock_builder(urls(&servers))
        .reject_evicting_policy(true)
        .command_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("a Redlock manager on a majority");
    servers[0].start().unwrap();
    servers[1].start().unwrap();
    let set_policy = async |server: &RedisServer, policy: &str| {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query_async(&mut raw(server).await)
            .await
            .unwrap();
    };
    set_policy(&servers[0], "allkeys-lru").await;
    let name = m.redis_names("checked").lock;
    let on = async |server: &RedisServer| exists(&mut raw(server).await, &name).await;

    for _ in 0..3 {
        let g = m.lock("checked").acquire().await.unwrap();
        assert!(
            !on(&servers[0]).await,
            "a member that fails the check was used"
        );
        assert!(
            on(&servers[1]).await,
            "a member that passes the check was not used"
        );
        assert_eq!(holders(&servers, &m, "checked").await, 4);
        g.release().await.unwrap();
    }

    // Renewals do not ask the member that failed (it would answer "not
    // ours" and set off a reclaim of every lease at every tick): a lock
    // renewed every 200 ms, four times, sends it no script. The check
    // failed at the first acquisition above, less than a second ago, and
    // runs again only 5 s after that, so no script of its own runs there
    // either.
    let mut member_0 = raw(&servers[0]).await;
    reset_stats(&mut member_0).await;
    let g = m
        .lock("renewed")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let renewals = m.renewal_round_trips();
    eventually(Duration::from_secs(3), async || {
        // Four rounds on the four members asked.
        m.renewal_round_trips() >= renewals + 16
    })
    .await
    .expect("the lock is renewed");
    assert!(!g.is_lost());
    g.release().await.unwrap();
    let scripts = calls_of(&mut member_0, "evalsha").await + calls_of(&mut member_0, "eval").await;
    assert_eq!(
        scripts, 0,
        "scripts sent to the member that failed its check"
    );

    // Mended: the check runs again at the first use 5 s (RECHECK_AFTER)
    // after it failed; allow 5 s more for a loaded machine.
    set_policy(&servers[0], "noeviction").await;
    let mended = eventually(Duration::from_secs(10), async || {
        let g = m.lock("checked").acquire().await.unwrap();
        let used = on(&servers[0]).await;
        g.release().await.unwrap();
        used
    })
    .await;
    assert!(mended.is_some(), "the mended member was never used");
    let g = m.lock("checked").acquire().await.unwrap();
    assert_eq!(holders(&servers, &m, "checked").await, 5);
    g.release().await.unwrap();
}

/// A member still loading its data after a restart (it answers `LOADING` to
/// everything, the start-up check included) is a member not ready yet, as
/// one that is down: a Redlock manager builds on the others and locks with
/// them. Before, the check's `LOADING` was a `ServerCheck` refusal and
/// failed the whole build. A single-server manager built on that member
/// fails with `Connect`, naming the cause.
///
/// The member loads 4,000 keys with a 1 ms delay each (`key-load-delay`,
/// answering clients every KB read, about every 50 keys): about 4 s of
/// `LOADING`, far longer than the two builds below (each bounded by the
/// 500 ms timeouts), and well within the 10 s its restart may take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_starts_with_a_member_still_loading_its_data() {
    let loading = RedisServer::builder()
        .args([
            "--key-load-delay",
            "1000",
            "--loading-process-events-interval-bytes",
            "1024",
        ])
        .spawn()
        .unwrap();
    let mut servers = vec![loading, server(), server()];
    {
        let mut conn = raw(&servers[0]).await;
        for chunk in 0..4 {
            let mut mset = redis::cmd("MSET");
            for i in 0..1_000 {
                mset.arg(format!("filler:{chunk}:{i}")).arg("x");
            }
            let () = mset.query_async(&mut conn).await.unwrap();
        }
        let () = redis::cmd("SAVE").query_async(&mut conn).await.unwrap();
    }
    let mut member = servers.remove(0);
    let url = member.url();
    let restarting = std::thread::spawn(move || {
        member.restart().unwrap();
        member
    });
    // Loading once a PING gets LOADING back (before, the server is down or
    // its socket not yet open).
    let client = redis::Client::open(url.as_str()).unwrap();
    let is_loading = async || match client.get_multiplexed_async_connection().await {
        Ok(mut conn) => redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_err_and(|e| e.code() == Some("LOADING")),
        Err(e) => e.code() == Some("LOADING"),
    };
    eventually(Duration::from_secs(10), is_loading)
        .await
        .expect("the restarted member loads its data");

    let mut urls = vec![url.clone()];
    urls.extend(servers.iter().map(RedisServer::url));
    let m = redlock(urls).await;
    let g = m.lock("loading").acquire().await.unwrap();
    assert_eq!(holders(&servers, &m, "loading").await, 2);
    g.release().await.unwrap();

    let single = LockManager::builder(&url)
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await;
    match single {
        Err(e @ LockError::Connect { .. }) => {
            assert!(e.to_string().to_lowercase().contains("loading"), "{e}")
        }
        other => panic!("expected Connect, got {:?}", other.map(drop)),
    }
    let member = tokio::task::spawn_blocking(move || restarting.join().unwrap())
        .await
        .unwrap();
    assert!(member.is_running());
}

/// A member that is down (its port refuses connections) cannot have run an
/// attempt: a busy attempt leaves nothing there to give back, and a
/// give-back owed there (the first attempt after the kill met the broken
/// old connection: its call may have run) is done once the member refuses
/// connections, since what it held died with it. Before, a call to the
/// dead member waited for the client's reconnection retries past its
/// timeout, which counted as a reply lost after the call was sent: each
/// busy `try_acquire` left a give-back in the background that waited for
/// the dead member, retrying for a whole lease (a busy lock polled by many
/// callers piled up one such task per attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_attempt_leaves_no_give_back_waiting_for_a_member_that_is_down() {
    let mut servers: Vec<_> = (0..3).map(|_| server()).collect();
    let holder = redlock(urls(&servers)).await;
    let polling = redlock(urls(&servers)).await;
    let _held = holder.lock("busy-down").acquire().await.unwrap();
    servers[2].kill().unwrap();
    // The first call to the dead member finds its old connection broken (a
    // reply that may be lost): its give-back is done once the member
    // refuses connections.
    let attempt = polling.lock("busy-down").try_acquire().await.unwrap();
    assert!(attempt.is_none());
    eventually(Duration::from_secs(2), async || {
        polling.background_releases_running() == 0
    })
    .await
    .expect("the give-back of the first attempt ends");
    // Each later call finds the port closed: nothing to give back, also with
    // a 1 s lease, whose calls to a member may take 100 ms (a tenth of it),
    // within which the refusal must come (the client's reconnection retries
    // took 300-600 ms before).
    for lease in [Duration::from_secs(10), Duration::from_secs(1)] {
        for _ in 0..5 {
            let attempt = polling
                .lock("busy-down")
                .lease(lease)
                .try_acquire()
                .await
                .unwrap();
            assert!(attempt.is_none());
            assert_eq!(
                polling.background_releases_running(),
                0,
                "a busy attempt with a {lease:?} lease left a give-back"
            );
        }
    }
}

/// A busy attempt that met a member that does not answer gives back (what
/// that member may hold in its name) within the attempt's own member
/// timeout, a tenth of the lease: it waited the whole command timeout for
/// the silent member a second time, so each busy attempt took a member
/// timeout and a command timeout (here 100 ms and 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_attempt_waits_for_a_silent_member_no_longer_than_its_calls_do() {
    let servers: Vec<_> = (0..3).map(|_| server()).collect();
    let proxy = FaultProxy::start(servers[2].addr()).await.unwrap();
    let holder = redlock(urls(&servers)).await;
    let mut through_proxy = urls(&servers[..2]);
    through_proxy.push(proxy.url());
    let polling = redlock_with_timeout(through_proxy, Duration::from_secs(2)).await;
    let _held = holder.lock("silent").acquire().await.unwrap();
    // Every connection of the polling manager open before the fault.
    open_every_connection(&polling).await;
    proxy.set_mode(FaultMode::BlackHole);
    let started = Instant::now();
    let attempt = polling
        .lock("silent")
        .lease(Duration::from_secs(1))
        .try_acquire()
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(attempt.is_none());
    // The attempt and its give-back each wait a member timeout (100 ms, a
    // tenth of the 1 s lease) for the silent member: 200 ms, where the
    // give-back alone took the 2 s command timeout. 1.5 s leaves room for a
    // loaded machine and stays under that.
    assert!(
        took < Duration::from_millis(1_500),
        "a busy attempt took {took:?}"
    );
}

/// Guards dropped as the runtime ends are released over blocking
/// connections, one member after another. With a member cut off, each such
/// release waited for it (its command timeout) and then succeeded on the
/// majority, so the manager never stopped trying it: ten guards took ten
/// timeouts to let the process end. A member whose blocking release failed
/// is now skipped by the later ones; the others still release.
///
/// Bounds: the cut-off member costs its first release at most the connect
/// and command timeouts (300 ms each, 600 ms); each later release costs
/// two round trips on loopback. 1.5 s is half of what ten command timeouts
/// alone took.
#[test]
fn guards_dropped_as_the_runtime_ends_wait_for_a_cut_off_member_once() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    // The proxy runs on a runtime of its own, which outlives the manager's.
    let proxy_rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = proxy_rt
        .block_on(FaultProxy::start(servers[2].addr()))
        .unwrap();
    let member_urls = vec![servers[0].url(), servers[1].url(), proxy.url()];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let names: Vec<String> = rt.block_on(async {
        let m = LockManager::redlock_builder(member_urls)
            .command_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300))
            .build()
            .await
            .unwrap();
        let mut names = Vec::new();
        for i in 0..10 {
            hold_until_the_runtime_ends(&m, format!("cut-off-{i}")).await;
            names.push(m.redis_names(&format!("cut-off-{i}")).lock);
        }
        proxy.set_mode(FaultMode::BlackHole);
        names
    });
    let started = Instant::now();
    drop(rt);
    let took = started.elapsed();
    proxy_rt.block_on(async move { drop(proxy) });
    assert!(
        took < Duration::from_millis(1500),
        "the runtime's end took {took:?}: each release waited for the cut-off member"
    );
    let check = tokio::runtime::Runtime::new().unwrap();
    check.block_on(async {
        for s in &servers[..2] {
            let mut conn = raw(s).await;
            for name in &names {
                assert!(!exists(&mut conn, name).await, "{name} left on a member");
            }
        }
    });
}
