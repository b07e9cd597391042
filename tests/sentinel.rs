//! A manager built with `sentinel_builder` finds the master through the
//! sentinels and follows a failover: after `kill -9` of the master, each guard
//! keeps its lock on the promoted replica or reports the loss before anyone else
//! holds it; acquisitions, renewals and wake-ups move to the new master; tokens
//! keep growing. A graceful `SENTINEL FAILOVER` (the old master demoted, still
//! running) is followed too.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{connections_received, eventually, open_every_connection};
use distlock::testing::{FaultMode, FaultProxy, RedisSentinel, RedisServer};
use distlock::{distributed_lock, LockError, LockEventKind, LockManager};
use futures_util::StreamExt;

async fn sentinel_manager(fixture: &RedisSentinel) -> LockManager {
    LockManager::sentinel_builder(fixture.sentinel_urls(), fixture.master_name())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("a sentinel manager")
}

fn exists_on(fixture: &RedisSentinel, node: usize, key: &str) -> bool {
    let mut conn = fixture.blocking_client(node).unwrap();
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut conn)
        .unwrap()
        == 1
}

#[distributed_lock(key = "report:{day}", lease = "2s", wait = "5s", manager = manager)]
async fn daily_report(manager: &LockManager, day: u32, runs: &AtomicU32) -> Result<u32, LockError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + day)
}

#[tokio::test]
async fn locks_and_locked_functions_work_through_the_sentinels() {
    let fixture = RedisSentinel::spawn().unwrap();
    let m = sentinel_manager(&fixture).await;
    let g = m.lock("plain").acquire().await.unwrap();
    assert!(exists_on(&fixture, 0, &m.redis_names("plain").lock));
    g.release().await.unwrap();
    let runs = AtomicU32::new(0);
    assert_eq!(daily_report(&m, 3, &runs).await.unwrap(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_killed_master_is_followed_and_no_lock_has_two_holders() {
    let mut fixture = RedisSentinel::spawn().unwrap();
    let m = sentinel_manager(&fixture).await;
    let other = sentinel_manager(&fixture).await;
    // Leases shorter and longer than the failover (about 2-3 s here).
    let mut guards = Vec::new();
    for (i, lease) in [800u64, 1_500, 6_000, 6_000].into_iter().enumerate() {
        let key = format!("held:{i}");
        guards.push((
            key.clone(),
            m.lock(&key)
                .lease(Duration::from_millis(lease))
                .acquire()
                .await
                .unwrap(),
        ));
    }
    let mut tokens_before: Vec<u64> = Vec::new();
    for (_, g) in &guards {
        tokens_before.push(g.fencing_token().await.unwrap());
    }
    // The replica has them (the fixture links it before returning).
    let replicated = std::time::Instant::now();
    while !guards
        .iter()
        .all(|(k, _)| exists_on(&fixture, 1, &m.redis_names(k).lock))
    {
        assert!(replicated.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(10));
    }
    let old = fixture.kill_master().unwrap();
    // Another holder tries every key until the failover is over.
    let started = Instant::now();
    let mut taken = vec![None; guards.len()];
    while started.elapsed() < Duration::from_secs(15) && taken.iter().any(Option::is_none) {
        for (i, (key, guard)) in guards.iter().enumerate() {
            if taken[i].is_some() {
                continue;
            }
            if let Ok(Some(g)) = other
                .lock(key)
                .wait(Duration::ZERO)
                .lease(Duration::from_secs(10))
                .try_acquire()
                .await
            {
                // Exclusion: the first holder knew of its loss already.
                assert!(guard.is_lost(), "{key}: two holders after the failover");
                taken[i] = Some(g.fencing_token().await.unwrap());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        if started.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    fixture
        .wait_for_new_master(old, Duration::from_secs(10))
        .unwrap();
    for (i, (key, guard)) in guards.iter().enumerate() {
        match taken[i] {
            // Taken over after the loss: with a larger token.
            Some(token) => assert!(token > tokens_before[i], "{key}: {token}"),
            // Kept: the long leases survive the failover on the promoted replica.
            None => assert!(!guard.is_lost(), "{key}: neither kept nor taken over"),
        }
    }
    // The short leases could not outlive a failover of 2 s or more.
    assert!(guards[0].1.is_lost());
    // The long ones were renewed on the new master.
    assert!(!guards[3].1.is_lost());
    let new_master_name = m.redis_names("held:3").lock;
    assert!(exists_on(&fixture, 1, &new_master_name));
    // New acquisitions work, and their tokens are larger than before.
    let fresh = m.lock("held:2").wait(Duration::from_secs(10));
    drop(guards);
    let g = fresh.acquire().await.unwrap();
    assert!(g.fencing_token().await.unwrap() > tokens_before[2]);
}

#[tokio::test]
async fn a_waiter_is_woken_through_the_new_master_after_a_failover() {
    let mut fixture = RedisSentinel::spawn().unwrap();
    let holder = sentinel_manager(&fixture).await;
    let waiter_manager = sentinel_manager(&fixture).await;
    let g = holder
        .lock("wake")
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let g = waiter_manager
            .lock("wake")
            .wait(Duration::from_secs(30))
            .acquire()
            .await?;
        g.fencing_token().await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let old = fixture.kill_master().unwrap();
    fixture
        .wait_for_new_master(old, Duration::from_secs(10))
        .unwrap();
    // The holder's renewals moved to the new master (the replica had the lock).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!g.is_lost());
    let token = g.fencing_token().await.unwrap();
    let released = Instant::now();
    g.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
    assert!(next > token);
    // By the release's message on the new master, not by its 20 s lease.
    assert!(released.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_demoted_master_is_left_for_the_promoted_one() {
    let fixture = RedisSentinel::spawn().unwrap();
    let m = sentinel_manager(&fixture).await;
    let g = m
        .lock("demoted")
        .lease(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    fixture.failover().unwrap();
    // Node 0 now refuses writes; the next acquisition and the release go to node 1.
    let next = m.lock("after").acquire().await.unwrap();
    assert!(exists_on(&fixture, 1, &m.redis_names("after").lock));
    next.release().await.unwrap();
    assert!(!g.is_lost());
    g.release().await.unwrap();
    assert!(!exists_on(&fixture, 1, &m.redis_names("demoted").lock));
}

/// A planned failover (`SENTINEL FAILOVER`) fails no call on the old
/// master: the sentinels promote a replica within about a second but demote
/// the old master only 8 to 18 s later, and until then it takes writes. A
/// holder that renewed there saw nothing wrong while its lock, never renewed
/// on the new master, expired there, and another manager took it: two
/// holders, no lost signal. The holder asks the sentinels alongside its
/// renewals and renews on the master they name.
// Multi-threaded: the fixture's failover blocks a thread for 10 to 20 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_follows_a_planned_failover_while_the_old_master_takes_writes() {
    const LEASE: Duration = Duration::from_secs(3);
    let fixture = std::sync::Arc::new(RedisSentinel::spawn().unwrap());
    let holder = sentinel_manager(&fixture).await;
    let guard = holder.lock("planned").lease(LEASE).acquire().await.unwrap();
    let name = holder.redis_names("planned").lock;
    let old_master = fixture.master_url().unwrap();
    let failover = tokio::task::spawn_blocking({
        let fixture = fixture.clone();
        move || fixture.failover()
    });
    let switched = eventually(Duration::from_secs(30), async || {
        fixture.master_url().is_ok_and(|url| url != old_master)
    })
    .await;
    assert!(
        switched.is_some(),
        "the sentinels never named another master"
    );
    // The copy of the lock the new master holds came from the old master's
    // last renewal before the switch: it ends within a lease of the switch
    // unless the holder renews it on the new master. One lease and a second
    // later, another manager (which asks the sentinels as it is built) finds
    // it held there, and the holder still holds it.
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let roles: Vec<_> = fixture.data_nodes().into_iter().map(|n| n.role).collect();
    assert_eq!(
        roles[0],
        Some(distlock::testing::DataNodeRole::Master),
        "the old master was demoted already ({roles:?}): this test sees no window"
    );
    let other = sentinel_manager(&fixture).await;
    let taken = other.lock("planned").try_acquire().await.unwrap();
    assert!(
        taken.is_none() || guard.is_lost(),
        "two holders: the holder kept renewing on the old master"
    );
    assert!(!guard.is_lost(), "the lock was lost across the failover");
    assert!(exists_on(&fixture, 1, &name));
    failover.await.unwrap().unwrap();
    guard.release().await.unwrap();
}

/// The check above asks the sentinels every 500 ms while calls run; it
/// keeps its connection to the sentinel that answered, where a connection
/// per question had the sentinels accept two a second from each manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_check_keeps_its_connection_to_a_sentinel() {
    let fixture = RedisSentinel::spawn().unwrap();
    let first = redis::Client::open(fixture.sentinel_urls()[0].as_str()).unwrap();
    let mut sentinel = first.get_multiplexed_async_connection().await.unwrap();
    let holder = sentinel_manager(&fixture).await;
    let guard = holder
        .lock("kept")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    // The first question (500 ms after the build at the latest) opens the
    // connection it keeps; the waiting subscriber, started by the first
    // acquisition, asks for itself as it connects.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = connections_received(&mut sentinel).await;
    // Renewed every 200 ms (a third of the lease) for 3 s: the renewal
    // rounds ask about six times.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!guard.is_lost());
    let opened = connections_received(&mut sentinel).await - before;
    assert_eq!(
        opened, 0,
        "{opened} connections to the sentinel for the checks of 3 s"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn bad_sentinel_settings_are_typed_errors_in_bounded_time() {
    let fixture = RedisSentinel::spawn().unwrap();
    let empty: [&str; 0] = [];
    let refused = LockManager::sentinel_builder(empty, "distlock")
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LockError::InvalidConfig(_)),
        "{refused:?}"
    );

    // Two addresses where no server listens (servers started and stopped),
    // made before the clock starts.
    let (down_url, other_down_url) = {
        let (down, other) = (RedisServer::spawn().unwrap(), RedisServer::spawn().unwrap());
        (down.url(), other.url())
    };
    let address = |url: &str| url.trim_start_matches("redis://").to_owned();

    let started = Instant::now();
    let refused = LockManager::sentinel_builder(fixture.sentinel_urls(), "no-such-master")
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LockError::ServerCheck { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("no-such-master"), "{refused}");

    let refused = LockManager::sentinel_builder([down_url.clone()], "distlock")
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(refused, LockError::Connect { .. }), "{refused:?}");

    // Every sentinel's failure is told, not only the last one's (the URLs
    // are in every such error: what each did is read from the reason or the
    // source). A sentinel that does not know the master, then one that is
    // down: the last failure alone made this a connection error.
    let live = fixture.sentinel_urls().remove(0);
    let refused = LockManager::sentinel_builder([live.clone(), down_url.clone()], "no-such-master")
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    let LockError::ServerCheck { reason, .. } = &refused else {
        panic!("a sentinel answered, so the name is what is wrong: {refused:?}");
    };
    assert!(
        reason.contains(&format!(
            "{}: does not know this master name",
            address(&live)
        )),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("{}: ", address(&down_url))) && reason.contains("refused"),
        "{reason}"
    );
    // Two sentinels down: a connection failure that tells of both.
    let refused =
        LockManager::sentinel_builder([down_url.clone(), other_down_url.clone()], "distlock")
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap_err();
    let LockError::Connect { source, .. } = &refused else {
        panic!("no sentinel answered: {refused:?}");
    };
    let told = source.to_string();
    assert_eq!(
        source.kind(),
        distlock::BackendErrorKind::Connection,
        "{told}"
    );
    assert!(
        told.contains(&address(&down_url)) && told.contains(&address(&other_down_url)),
        "{told}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A proxy in front of the fixture's first sentinel, in `mode`.
async fn proxied_first_sentinel(fixture: &RedisSentinel, mode: FaultMode) -> FaultProxy {
    let first = fixture.sentinel_urls().remove(0);
    let first: std::net::SocketAddr = first
        .trim_start_matches("redis://")
        .parse()
        .expect("a sentinel URL of the form redis://ip:port");
    let proxy = FaultProxy::start(first).await.expect("a proxy");
    proxy.set_mode(mode);
    proxy
}

/// A sentinel that takes connections and never answers (cut off without a
/// reset) does not hold the others up: the manager is built through the
/// next one. Asked one after another, each sentinel was waited for the
/// connect and command timeouts (2 s + 2 s by default) before the next.
#[tokio::test]
async fn a_silent_sentinel_does_not_hold_up_the_next() {
    let fixture = RedisSentinel::spawn().unwrap();
    let silent = proxied_first_sentinel(&fixture, FaultMode::BlackHole).await;
    let mut urls = vec![silent.url()];
    urls.extend(fixture.sentinel_urls());
    // Timeouts longer than redis-rs's defaults: a query that waited for
    // each sentinel in turn would wait them out.
    let started = Instant::now();
    let m = LockManager::sentinel_builder(urls, "distlock")
        .connect_timeout(Duration::from_secs(5))
        .command_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let took = started.elapsed();
    // The next sentinel is asked 250 ms after the silent one and answers
    // in a round trip; the master's connection and start-up check take a
    // few more. Asked one after another, the silent one cost redis-rs's
    // connection timeout (1 s) before the next was asked, or with these
    // timeouts 10 s; 900 ms leaves 600 ms for a loaded machine.
    assert!(took < Duration::from_millis(900), "built in {took:?}");
    // The master it named takes locks.
    open_every_connection(&m).await;
}

/// A sentinel slower to answer than redis-rs's default timeouts (1 s to
/// connect, its handshake included; 0.5 s for a reply), within the
/// manager's own, is waited for: its connections took redis-rs's defaults,
/// so the build failed ("timed out").
#[tokio::test]
async fn a_slow_sentinel_is_waited_for_within_the_managers_timeouts() {
    let fixture = RedisSentinel::spawn().unwrap();
    // Each reply 1.2 s late: the connection's handshake (one pipeline, its
    // replies in one or two chunks) takes 1.2 to 2.4 s, the question 1.2 s
    // more; within 5 s each.
    let slow = proxied_first_sentinel(
        &fixture,
        FaultMode::DelayReplies(Duration::from_millis(1200)),
    )
    .await;
    let m = LockManager::sentinel_builder([slow.url()], "distlock")
        .connect_timeout(Duration::from_secs(5))
        .command_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("the slow sentinel named the master");
    // The master it named takes locks.
    open_every_connection(&m).await;
}

/// A manager that only listens (it makes no call that could fail on the
/// demoted master) follows a graceful failover that leaves the old master
/// up: its events stream goes on reporting expiries, which only a master
/// tells of (a replica relays what is published, but not the master's
/// keyspace notices of expired keys). The sentinels end the demoted
/// master's client connections as they reconfigure it (`CLIENT KILL`), and
/// the subscriber reconnects through them to the promoted master, with no
/// watch of `+switch-master` of its own.
// Multi-threaded: the fixture's failover blocks this thread for seconds, while
// the manager's tasks run on the other and live through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listening_manager_follows_a_failover_that_leaves_the_old_master_up() {
    let fixture = RedisSentinel::builder()
        .args(["--notify-keyspace-events", "Kx"])
        .spawn()
        .unwrap();
    let observer = sentinel_manager(&fixture).await;
    let mut events = observer.events("exp:*").await.unwrap();
    let old_master = fixture.master_url().unwrap();
    fixture.failover().unwrap();
    let new_master = fixture.master_url().unwrap();
    assert_ne!(old_master, new_master);
    // The observer makes no call after the failover: only the announcement
    // can move it. Its stream listens through patterns (the keyspace
    // notices' among them), so the new master counts them once it is there.
    let mut raw = redis::Client::open(new_master)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let listening = eventually(Duration::from_secs(10), async || {
        redis::cmd("PUBSUB")
            .arg("NUMPAT")
            .query_async::<i64>(&mut raw)
            .await
            .unwrap()
            > 0
    })
    .await;
    assert!(
        listening.is_some(),
        "the observer never listened on the promoted master"
    );
    let holder = sentinel_manager(&fixture).await;
    let expiring = holder
        .lock("exp:1")
        .lease(Duration::from_millis(500))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(expiring);
    // The lease ends 500 ms after it began; 5 s leave room for a loaded
    // machine. Skip notices (the reconnection) and the acquisition come first.
    let expired = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(item) = events.next().await {
            match item {
                Ok(event) if event.key == "exp:1" && event.kind == LockEventKind::Expired => {
                    return true;
                }
                // Every node has the setting: the check after the
                // resubscription finds nothing to tell.
                Err(skipped) => assert!(!skipped.expiry_off, "{skipped:?}"),
                Ok(_) => {}
            }
        }
        false
    })
    .await;
    assert_eq!(
        expired,
        Ok(true),
        "the expiry on the promoted master went unreported"
    );
}

/// A stream that wants expiries checks the setting again after a failover:
/// the promoted replica, whose `notify-keyspace-events` is empty, sends no
/// expiry notices, and the stream says so (`expiry_off`) after the
/// resubscription's `count: 0`. It said nothing more before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_told_when_the_promoted_master_sends_no_expiries() {
    let fixture = RedisSentinel::spawn().unwrap();
    let old_master = fixture.master_url().unwrap();
    // Only on the master: its replica keeps the default (no notices).
    let mut raw = redis::Client::open(old_master.clone())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    common::expiry_notices_on(&mut raw).await;
    let observer = sentinel_manager(&fixture).await;
    let mut events = observer.events("exp:*").await.unwrap();
    fixture.failover().unwrap();
    assert_ne!(fixture.master_url().unwrap(), old_master);
    // The failover's resubscription comes within the sentinels' announcement
    // and a reconnect (well under a second here), and the check is one
    // round trip after it: 10 s leave room for a loaded machine.
    let mut seen = Vec::new();
    let told = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(item) = events.next().await {
            seen.push(item.clone());
            if let Err(skipped) = item {
                if skipped.expiry_off {
                    return true;
                }
            }
        }
        false
    })
    .await;
    assert_eq!(
        told,
        Ok(true),
        "the stream was not told that expiries stopped; it saw {seen:?}"
    );
    assert!(
        matches!(
            seen.first(),
            Some(Err(distlock::EventsSkipped {
                count: 0,
                expiry_off: false,
                ..
            }))
        ),
        "the resubscription's notice comes first: {seen:?}"
    );
}

/// Calls that fail together on a master that died share one query of the
/// sentinels: each waited for the one before it, then asked again, so 20
/// calls failing at once asked 20 times, one after another (each opening a
/// connection to a sentinel), while the sentinels had not yet noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_failing_together_share_one_query_of_the_sentinels() {
    let mut fixture = RedisSentinel::spawn().unwrap();
    let m = sentinel_manager(&fixture).await;
    let first = redis::Client::open(fixture.sentinel_urls()[0].as_str()).unwrap();
    let mut sentinel = first.get_multiplexed_async_connection().await.unwrap();
    m.lock("warm")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Each query of the sentinels opens a connection to the first.
    let before = connections_received(&mut sentinel).await;
    fixture.kill_master().unwrap();
    // Well within the sentinels' 1 s down-after: they still name the dead
    // master, so every query answers the same.
    let calls = (0..20).map(|i| {
        let m = m.clone();
        async move { m.lock(format!("k:{i}")).try_acquire().await }
    });
    let results = futures_util::future::join_all(calls).await;
    assert!(results.iter().all(Result::is_err), "{results:?}");
    let queries = connections_received(&mut sentinel).await - before;
    // The calls fail in a few waves (those written into the dead connection,
    // those refused on reconnecting, the clean-ups of calls that may have
    // run, in the background), each sharing a query: 7 here, where they
    // asked 40 times or more before.
    assert!(
        (1..=10).contains(&queries),
        "{queries} queries of the sentinels for 20 calls failing together"
    );
}
