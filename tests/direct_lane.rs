//! The one-server backend's direct lane: a second connection on which the
//! calling task reads its own reply (lock-runtime/src/backend/direct.rs). It
//! opens with the URL's user, password and database; a call that gives up on
//! a reply (timeout, cancellation) drops it, so no later call reads that
//! reply; concurrent calls share the multiplexed connection, so a manager
//! never has more than the two.

mod common;

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use common::*;
use distlock::testing::{FaultMode, FaultProxy};
use distlock::LockManager;
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;

/// The manager's command connections (not pub/sub, not MONITOR), seen from the server:
/// `(user, db)` of each, the caller's own connection left out.
async fn command_clients(raw: &mut MultiplexedConnection) -> Vec<(String, String)> {
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(raw)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    let field = |line: &str, name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_default()
            .to_owned()
    };
    list.lines()
        .filter(|line| field(line, "id") != me.to_string())
        .filter(|line| field(line, "sub") == "0" && field(line, "psub") == "0")
        // Not a MONITOR connection.
        .filter(|line| !field(line, "flags").contains('O'))
        .map(|line| (field(line, "user"), field(line, "db")))
        .collect()
}

/// One acquire and release, so that the direct lane is opened (in the
/// background, by the first call), then waits for both connections. The
/// first acquisition also has the manager listen on its hand-off channel, on
/// a connection of its own that counts as a command client until it has
/// subscribed: so the count is read once something is subscribed.
async fn open_both_lanes(m: &LockManager, raw: &mut MultiplexedConnection) {
    let both = eventually(Duration::from_secs(5), async || {
        open_every_connection(m).await;
        !pubsub_channels(raw).await.is_empty() && command_clients(raw).await.len() == 2
    })
    .await;
    assert!(
        both.is_some(),
        "the direct lane never opened: {:?}",
        command_clients(raw).await
    );
}

#[tokio::test]
async fn the_direct_lane_opens_as_the_urls_user_in_its_database() {
    let redis = server();
    let mut raw = raw(&redis).await;
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    let url = format!("redis://locker:pw@{}/3", redis.addr());
    let m = manager_at(&url).await;
    open_both_lanes(&m, &mut raw).await;
    assert_eq!(
        command_clients(&mut raw).await,
        vec![
            ("locker".to_owned(), "3".to_owned()),
            ("locker".to_owned(), "3".to_owned())
        ]
    );
    // Whichever lane carries them, the locks are in database 3.
    let g = m.lock("k").acquire().await.unwrap();
    let name = m.redis_names("k").lock;
    assert!(!exists(&mut raw, &name).await, "the lock is in database 0");
    redis::cmd("SELECT")
        .arg(3)
        .query_async::<()>(&mut raw)
        .await
        .unwrap();
    assert!(
        exists(&mut raw, &name).await,
        "the lock is not in database 3"
    );
    g.release().await.unwrap();
    assert!(!exists(&mut raw, &name).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_the_multiplexed_connection() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let m = manager(&redis).await;
    open_both_lanes(&m, &mut raw).await;
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let m = m.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    let g = m.lock(format!("k:{t}:{i}")).acquire().await.unwrap();
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(command_clients(&mut raw).await.len(), 2);
    assert_eq!(all_keys(&mut raw).await, Vec::<String>::new());
}

/// Each acquisition is cancelled after one more poll than the last, so that
/// some are dropped with their request written and the reply unread on the
/// direct lane. The next cycle, on another key, must read its own replies:
/// a reply left over would give it the wrong answer (or an out-of-sync error).
#[tokio::test]
async fn a_call_cancelled_mid_reply_leaves_nothing_for_the_next() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let m = manager(&redis).await;
    open_both_lanes(&m, &mut raw).await;
    let mut completed_within = None;
    // Each round polls once more; a round trip takes tens of polls or more
    // on a loaded machine, so the bound is generous.
    for polls in 0..2_000usize {
        let mut acquire = Box::pin(
            m.lock(format!("cancelled:{polls}"))
                .lease(Duration::from_millis(300))
                .acquire(),
        );
        let mut done = false;
        for _ in 0..polls {
            let ready =
                std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx).is_ready())).await;
            if ready {
                done = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(acquire);
        // A different key each time: the check must not depend on what the
        // cancelled acquisition left behind.
        let g = m
            .lock(format!("check:{polls}"))
            .wait(Duration::ZERO)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{polls} polls: the next acquisition failed: {e}"));
        assert!(exists(&mut raw, &m.redis_names(&format!("check:{polls}")).lock).await);
        g.release()
            .await
            .unwrap_or_else(|e| panic!("{polls} polls: the next release failed: {e}"));
        if done {
            completed_within = Some(polls);
            break;
        }
    }
    assert!(
        completed_within.is_some(),
        "the acquisition never completed within 2,000 polls: not every await point was reached"
    );
}

/// A reply slower than the command timeout: the call fails, and the reply,
/// when it comes, is read by nobody (its connection was dropped). Every later
/// call gets its own reply.
#[tokio::test]
async fn a_reply_after_the_command_timeout_reaches_no_later_call() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let m = manager_at(&proxy.url()).await; // command timeout 500 ms
    open_both_lanes(&m, &mut raw).await;
    // The request reaches Redis at once; its reply is held 1.2 s, and comes
    // 700 ms after the call gave up.
    proxy.set_mode(FaultMode::DelayReplies(Duration::from_millis(1200)));
    let late = m.lock("late").acquire().await;
    assert!(late.is_err(), "{late:?}");
    proxy.set_mode(FaultMode::Pass);
    // The timed-out call closed its connection rather than leave it to a
    // drain: a drain would hold the next call until the late reply, 1.2 s
    // after the request, 700 ms after the call gave up. The next cycle has
    // its two round trips only (a millisecond or so on loopback). 350 ms
    // lies halfway: it leaves a loaded machine 350 ms, and a drain would
    // exceed it by as much.
    let start = std::time::Instant::now();
    let g = m.lock("first-after").acquire().await.unwrap();
    g.release().await.unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(350),
        "the first call after the timeout waited {:?}",
        start.elapsed()
    );
    for i in 0..20 {
        let key = format!("after:{i}");
        let g = m
            .lock(key.as_str())
            .wait(Duration::ZERO)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        assert!(exists(&mut raw, &m.redis_names(key.as_str()).lock).await);
        g.release()
            .await
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        // Give a late reply time to arrive between cycles.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// MONITOR lines: `<time> [<db> <client address>] "COMMAND" ...`.
fn client_of(line: &str) -> Option<String> {
    line.split(['[', ']']).nth(1).map(str::to_owned)
}

/// Waits for the lock `name` to be taken (its request was on its way when
/// its acquisition was given up) and then freed by the clean-up, and asserts
/// that, as MONITOR saw them, the clean-up's release came after the `SET` and
/// from the same client.
async fn assert_cleaned_up_after_on_the_same_connection(
    raw: &mut MultiplexedConnection,
    lines: &mut (impl futures_util::Stream<Item = String> + Unpin),
    name: &str,
) {
    let taken = eventually(Duration::from_secs(5), async || exists(raw, name).await).await;
    assert!(
        taken.is_some(),
        "the given-up acquisition never reached Redis"
    );
    // Freed well within its 30 s lease: by the clean-up, not by expiry.
    let freed = eventually(Duration::from_secs(5), async || !exists(raw, name).await).await;
    assert!(freed.is_some(), "the lock was not released by its clean-up");
    let mut set_from = None;
    loop {
        let line = tokio::time::timeout(Duration::from_secs(5), lines.next())
            .await
            .expect("MONITOR went quiet")
            .expect("MONITOR ended");
        if line.contains("\"SET\"") && line.contains(name) {
            set_from = client_of(&line);
        } else if line.contains("\"EVALSHA\"") && line.contains(name) {
            let release_from = client_of(&line);
            assert!(
                set_from.is_some(),
                "the clean-up ran before the acquisition"
            );
            assert_eq!(
                release_from, set_from,
                "the clean-up took another connection"
            );
            return;
        }
    }
}

/// A cancelled acquisition's clean-up (a release by its owner token) waits
/// for the reply the acquisition left unread on the direct lane, and then
/// goes on the same connection: Redis runs it after the acquisition, as on
/// one connection (on another connection it could overtake the request still
/// on its way, find nothing to release, and leave the lock taken for its
/// whole lease). It waits even while another call is in flight on the
/// multiplexed connection, which would otherwise send it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisitions_clean_up_follows_it_on_the_direct_lane() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let m = manager_at(&proxy.url()).await; // command timeout 500 ms
    open_both_lanes(&m, &mut raw).await;
    let mut lines = monitor(&redis).await;
    // Every request takes 100 ms to reach Redis and its reply 100 ms more.
    proxy.set_mode(FaultMode::Delay(Duration::from_millis(100)));
    let on_direct = m.lock("k").lease(Duration::from_secs(30)).acquire();
    let mut on_direct = Box::pin(on_direct);
    // Polled once: its request is on its way on the direct lane.
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut on_direct)
            .await
            .is_err()
    );
    // Another acquisition meanwhile goes on the multiplexed connection.
    let other = m.clone();
    let shared = tokio::spawn(async move { other.lock("other").acquire().await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(on_direct);
    let name = m.redis_names("k").lock;
    assert_cleaned_up_after_on_the_same_connection(&mut raw, &mut lines, &name).await;
    proxy.set_mode(FaultMode::Pass);
    shared.await.unwrap().unwrap().release().await.unwrap();
}

/// The same on the multiplexed connection: an acquisition given up there
/// (here the first call of a manager, before its direct lane opened) leaves
/// its request in redis-rs's buffers or on its way; until a later call is
/// answered there, calls stay on that connection, so the clean-up does not
/// take the direct lane meanwhile opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisitions_clean_up_follows_it_on_the_multiplexed_connection() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let m = manager_at(&proxy.url()).await;
    // A listening connection counts as a command client until it has
    // subscribed (see `open_both_lanes`): awaited, as one in that window
    // made this count 2 once; a direct lane opened early keeps it there.
    assert!(
        eventually(Duration::from_secs(5), async || command_clients(&mut raw)
            .await
            .len()
            == 1)
        .await
        .is_some(),
        "the direct lane opened early: {:?}",
        command_clients(&mut raw).await
    );
    let mut lines = monitor(&redis).await;
    proxy.set_mode(FaultMode::Delay(Duration::from_millis(100)));
    let given_up = tokio::time::timeout(
        Duration::from_millis(30),
        m.lock("k").lease(Duration::from_secs(30)).acquire(),
    )
    .await;
    assert!(given_up.is_err(), "the acquisition was not cut short");
    let name = m.redis_names("k").lock;
    assert_cleaned_up_after_on_the_same_connection(&mut raw, &mut lines, &name).await;
    proxy.set_mode(FaultMode::Pass);
    // The first acquisition also had the manager listen on its hand-off
    // channel, on a connection of its own that counts as a command client
    // until it has subscribed.
    let listening = eventually(Duration::from_secs(5), async || {
        !pubsub_channels(&mut raw).await.is_empty()
    })
    .await;
    assert!(listening.is_some(), "the hand-off channel never subscribed");
    assert_eq!(
        command_clients(&mut raw).await.len(),
        2,
        "the direct lane never opened"
    );
}

/// The server closes the idle direct connection (as a restart, Redis's
/// `timeout` or a load balancer does): the next call, however soon, finds it
/// closed before sending and takes the other connection. (A release that
/// failed so would leave the lock to its lease: a Redlock member restarted
/// in the torture suite did.)
#[tokio::test]
async fn a_connection_closed_while_idle_fails_no_call() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let m = manager(&redis).await;
    open_both_lanes(&m, &mut raw).await;
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut raw)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Client ids grow: the direct connection, opened by the first call, is
    // younger than the multiplexed one, opened by `build()`.
    let direct = list
        .lines()
        .filter_map(|l| {
            l.strip_prefix("id=")?
                .split(' ')
                .next()?
                .parse::<i64>()
                .ok()
        })
        .filter(|id| *id != me)
        .max()
        .unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(direct)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    // Redis closed the connection before it wrote the reply just read, so
    // the close came first; a yield lets the runtime's I/O driver run
    // (tokio wakes a yielded task after polling it), which records it.
    tokio::task::yield_now().await;
    // Well inside the 5 s after which an idle connection is also read from.
    let g = m.lock("after-kill").acquire().await.unwrap();
    g.release().await.unwrap();
    // The lane opens again.
    open_both_lanes(&m, &mut raw).await;
}

/// `direct_lane(false)`: every call goes through the multiplexed connection,
/// and the second connection is never opened. The lane opens on the first
/// call that takes it (in the background), and with the option off no call
/// takes it, so nothing can open it later either; the same cycles with the
/// option on open it (the control).
#[tokio::test]
async fn with_the_direct_lane_off_no_second_connection_is_opened() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let off = LockManager::builder(&redis.url())
        .direct_lane(false)
        .build()
        .await
        .unwrap();
    for i in 0..50 {
        let g = off.lock(format!("k{i}")).acquire().await.unwrap();
        assert!(off.lock(format!("k{i}")).is_locked().await.unwrap());
        g.release().await.unwrap();
    }
    // Its listening connection counts as a command client until it has
    // subscribed (see `open_both_lanes`).
    let listening = eventually(Duration::from_secs(5), async || {
        !pubsub_channels(&mut raw).await.is_empty()
    })
    .await;
    assert!(listening.is_some(), "the hand-off channel never subscribed");
    assert_eq!(command_clients(&mut raw).await.len(), 1);
    drop(off);
    // Its listening connection too, so that `open_both_lanes` below reads
    // the count once the new manager's own has subscribed.
    let gone = eventually(Duration::from_secs(5), async || {
        command_clients(&mut raw).await.is_empty() && pubsub_channels(&mut raw).await.is_empty()
    })
    .await;
    assert!(gone.is_some(), "the manager's connection outlived it");

    let on = manager(&redis).await;
    open_both_lanes(&on, &mut raw).await;
}

/// A server's `OOM` error reply.
fn assert_oom(err: &distlock::LockError) {
    match err {
        distlock::LockError::Backend { source, .. } => {
            assert_eq!(source.code(), Some("OOM"), "{err:?}")
        }
        other => panic!("{other:?}"),
    }
}

/// A call refused with an error code that redis-rs has no name for (`OOM`
/// here, as `BUSY`, `MISCONF`, `NOREPLICAS`, `WRONGTYPE` and the scripts' own
/// errors) was answered: both lanes stay open and in step, and nothing is
/// given back, since the refused write was not made. Issue: such a reply
/// counted as one that may have been lost, so each refused attempt closed
/// the lane or retired the multiplexed connection (a new connection to a
/// server already in trouble) and sent a release script after it.
#[tokio::test]
async fn a_refusal_with_a_code_redis_rs_does_not_name_keeps_the_connections() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    open_both_lanes(&m, &mut raw).await;
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async::<()>(&mut raw)
            .await
            .unwrap();
    }
    reset_stats(&mut raw).await;
    let connections = connections_received(&mut raw).await;
    // One at a time (each on the direct lane), then together (the others on
    // the multiplexed connection).
    for i in 0..10 {
        let err = m.lock(format!("oom:{i}")).try_acquire().await.unwrap_err();
        assert_oom(&err);
    }
    let together = futures_util::future::join_all((10..20).map(|i| {
        let m = &m;
        async move { m.lock(format!("oom:{i}")).try_acquire().await }
    }))
    .await;
    for result in together {
        let err = result.unwrap_err();
        assert_oom(&err);
    }
    // A give-back is counted from the moment its attempt returns.
    eventually(Duration::from_secs(5), async || {
        m.background_releases_running() == 0
    })
    .await
    .expect("no give-back runs on");
    // The refused SETs are the only commands (INFO counts them among
    // `rejected_calls`, not `calls`): no release script followed.
    let calls = command_calls(&mut raw).await;
    assert_eq!(calls.keys().collect::<Vec<_>>(), ["set"], "{calls:?}");
    assert_eq!(connections_received(&mut raw).await, connections);
    assert_eq!(command_clients(&mut raw).await.len(), 2);
}
