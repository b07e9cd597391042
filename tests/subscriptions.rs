//! One owner of a manager's subscriptions: its waiters, a lock events stream
//! and a leader watch share the manager's one listening connection per
//! source (one server, or each master of the cluster); when that connection
//! is killed, the waiter is still served, the events stream says it missed
//! events and then sees the later ones, and the watch reads the current
//! leader again; dropping the stream and the watch unsubscribes their
//! patterns and channel while the waiter's subscription stays. On one server
//! and on the cluster.

mod common;

use std::time::Duration;

use common::{eventually, Deployment};
use distlock::testing::ClusterNodeRole;
use distlock::{LockEventKind, LockEvents, LockManager};
use futures_util::{FutureExt, StreamExt};
use redis::aio::MultiplexedConnection;

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Every server (masters first), and how many of them are masters (the
/// manager's message sources).
fn servers(d: &Deployment) -> (Vec<String>, usize) {
    match d {
        Deployment::Single(s) => (vec![s.url()], 1),
        Deployment::Cluster(c) => {
            let nodes = c.nodes();
            let masters = nodes
                .iter()
                .filter(|n| n.role == ClusterNodeRole::Master)
                .count();
            (nodes.into_iter().map(|n| n.url).collect(), masters)
        }
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    }
}

async fn publisher(d: &Deployment) -> LockManager {
    let builder = match d {
        Deployment::Single(s) => LockManager::builder(&s.url()),
        Deployment::Cluster(c) => LockManager::cluster_builder(c.urls()),
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    };
    builder
        .holder("sub-test")
        .lock_events(true)
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect to the test deployment")
}

/// The pub/sub connections `conn`'s server serves.
async fn pubsub_clients(conn: &mut MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

async fn numpat(conn: &mut MultiplexedConnection) -> i64 {
    redis::cmd("PUBSUB")
        .arg("NUMPAT")
        .query_async(conn)
        .await
        .expect("PUBSUB NUMPAT")
}

async fn subscribers_of(conn: &mut MultiplexedConnection, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .expect("PUBSUB NUMSUB");
    n
}

/// The next event of `key` (events of other keys and skip notices passed
/// over), within 5 s: events follow their cause within milliseconds on
/// loopback.
async fn next_of(events: &mut LockEvents, key: &str) -> LockEventKind {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.next().await.expect("the stream goes on") {
                Ok(event) if event.key == key => return event.kind,
                _ => continue,
            }
        }
    })
    .await
    .expect("an event within 5 s")
}

async fn one_connection_for_waiters_events_and_the_watch(d: Deployment) {
    let on = match d {
        Deployment::Single(_) => "single",
        Deployment::Cluster(_) => "cluster",
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    };
    let (urls, masters) = servers(&d);
    let mut raws = Vec::new();
    for url in &urls {
        let mut raw = connect(url).await;
        // Expiry notices on: the stream and the watch then subscribe a
        // keyspace pattern on every source besides their own.
        common::expiry_notices_on(&mut raw).await;
        raws.push(raw);
    }
    // The only manager of this test: every pub/sub client is its.
    let m = publisher(&d).await;
    let key = format!("sub-{on}:waited");
    let election = m.leader(format!("sub-{on}"));

    // A waiter waiting (two, one served after the kill, one kept waiting
    // through the end), an events stream and a watch at once.
    let holder = m.lock(&key).acquire().await.unwrap();
    let waiters = vec![
        common::spawn_waiter(&m, &key),
        common::spawn_waiter(&m, &key),
    ];
    common::await_waiter(&m, &key).await;
    let mut events = m.events(format!("sub-{on}:*")).await.unwrap();
    let mut watch = election.watch();
    let first = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("the watch reports within 5 s");
    assert_eq!(first, Some(None), "nobody leads yet");

    // (a) One listening connection per source, whatever listens on it.
    for (i, raw) in raws.iter_mut().enumerate() {
        let expected = usize::from(i < masters);
        assert_eq!(
            pubsub_clients(raw).await,
            expected,
            "pub/sub connections on server {i} of {on}"
        );
    }

    // A term nobody announces (the lock taken directly): the watch can only
    // learn of it by reading the lock, which it does after a reconnect (with
    // expiry notices on, it sets no lease timer).
    let term = m
        .lock(election.lock_key())
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap();
    let epoch = term.issued_fencing_token().expect("eager token");
    assert!(watch.next().now_or_never().is_none(), "nothing announced");

    // (b) Kill the one connection per source.
    let mut killed = 0;
    for raw in &mut raws {
        killed += common::kill_subscribers(raw).await;
    }
    assert_eq!(killed as usize, masters, "one connection per source killed");

    // The watch reads the lock once subscribed again.
    let after = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("the watch re-reads within 5 s of the reconnect")
        .expect("the watch goes on")
        .expect("a leader");
    assert_eq!((after.epoch, after.holder.as_str()), (epoch, "sub-test"));

    // The stream says it missed events once per connection made again (its
    // own pattern and its expiry pattern on the first source, its expiry
    // pattern on each other): one notice per source.
    let mut notices = 0;
    tokio::time::timeout(Duration::from_secs(5), async {
        while notices < masters {
            if let Err(skipped) = events.next().await.expect("the stream goes on") {
                assert_eq!(skipped.count, 0, "{skipped}");
                notices += 1;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{notices} of {masters} skip notices"));
    // Every subscription is back: later events arrive.
    let later = format!("sub-{on}:later");
    m.lock(&later)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(matches!(
        next_of(&mut events, &later).await,
        LockEventKind::Acquired { .. }
    ));
    assert!(matches!(
        next_of(&mut events, &later).await,
        LockEventKind::Released { .. }
    ));

    // The waiter is served.
    holder.release().await.unwrap();
    let (served, _, mut waiting) = tokio::time::timeout(
        Duration::from_secs(5),
        futures_util::future::select_all(waiters),
    )
    .await
    .expect("a waiter served within 5 s of the release");
    let served = served.unwrap().unwrap();
    let waiting = waiting.pop().expect("the other waiter");
    // Still one connection per source after the reconnect.
    for (i, raw) in raws.iter_mut().enumerate() {
        assert_eq!(pubsub_clients(raw).await, usize::from(i < masters));
    }

    // (c) Dropping the stream and the watch unsubscribes their patterns and
    // channel; the waiter's channel stays subscribed.
    let channel = m.redis_names(&key).channel().to_owned();
    let leader_channel = format!("distlock:leader:sub-{on}");
    for raw in raws.iter_mut().take(masters) {
        assert!(numpat(raw).await > 0);
        assert_eq!(subscribers_of(raw, &leader_channel).await, 1);
    }
    // Where the waiter listens: its manager's hand-off channel, named by the
    // route in its queue entry (read on the master that holds the key; the
    // others answer MOVED).
    let entries_key = channel.replacen("wake:{", "lockqe:{", 1);
    let mut handoffs = Vec::new();
    for raw in raws.iter_mut().take(masters) {
        if let Ok(entries) = redis::cmd("HVALS")
            .arg(&entries_key)
            .query_async::<Vec<String>>(&mut *raw)
            .await
        {
            handoffs.extend(
                entries
                    .iter()
                    .filter_map(|entry| entry.split(':').nth(3))
                    .map(|route| format!("distlock:handoff:{route}")),
            );
        }
    }
    assert!(!handoffs.is_empty(), "the waiter's queue entry");
    drop(events);
    drop(watch);
    for raw in raws.iter_mut().take(masters) {
        eventually(Duration::from_secs(5), async || {
            numpat(raw).await == 0 && subscribers_of(raw, &leader_channel).await == 0
        })
        .await
        .expect("patterns and the leader channel unsubscribed");
        // The lock's channel or the manager's hand-off channel, where its
        // queued waiters listen.
        let mut listening = subscribers_of(raw, &channel).await;
        for handoff in &handoffs {
            listening += subscribers_of(raw, handoff).await;
        }
        assert_eq!(listening, 1, "the waiter's channel");
    }
    served.release().await.unwrap();
    let last = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the last waiter served")
        .unwrap()
        .unwrap();
    last.release().await.unwrap();
    term.release().await.unwrap();
}

on_both!(one_connection_for_waiters_events_and_the_watch);

async fn pubsub_client_ids(conn: &mut MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// A server that refuses an events stream's pattern (an ACL without
/// PSUBSCRIBE) fails that stream at once with the server's refusal, and
/// costs the waiters that share the connection nothing: the connection is
/// not re-made, and a waiter is still woken by its release.
#[tokio::test]
async fn a_refused_pattern_fails_its_stream_and_not_the_waiters_connection() {
    let redis = common::server();
    let mut raw = common::raw(&redis).await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nopattern")
        .arg("reset")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-psubscribe")
        .query_async(&mut raw)
        .await
        .unwrap();
    let m = LockManager::builder(&format!("redis://nopattern:pw@{}", redis.addr()))
        .lock_events(true)
        .build()
        .await
        .unwrap();
    let holder = m.lock("k").acquire().await.unwrap();
    let waiter = common::spawn_waiter(&m, "k");
    common::await_waiter(&m, "k").await;
    // The manager's one listening connection subscribes in the background.
    common::await_holder_listening(&mut raw, &m, "k").await;
    let before = pubsub_client_ids(&mut raw).await;
    assert_eq!(before.len(), 1, "{before:?}");

    let refused = m.events("k*").expiry(false).await.unwrap_err();
    match &refused {
        distlock::LockError::Backend { source, .. } => {
            assert_eq!(source.code(), Some("NOPERM"), "{refused}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        pubsub_client_ids(&mut raw).await,
        before,
        "the same connection"
    );
    holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter served within 5 s of the release")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A live events stream whose pattern is refused when its connection is
/// made again (its ACL lost PSUBSCRIBE meanwhile) tells its reader that it
/// misses events, rather than go silent for good, and is subscribed again
/// once the permission is back, at the connection's next check.
#[tokio::test]
async fn a_stream_refused_after_a_reconnect_says_so_and_comes_back() {
    let redis = common::server();
    let mut raw = common::raw(&redis).await;
    let acl = async |raw: &mut redis::aio::MultiplexedConnection, rule: &str| {
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("watcher")
            .arg(rule)
            .query_async(raw)
            .await
            .unwrap();
    };
    for rule in ["reset", "on", ">pw", "~*", "&*", "+@all"] {
        acl(&mut raw, rule).await;
    }
    // A 500 ms command timeout: the connection is checked every 5 s (ten
    // command timeouts, at least 5 s).
    let m = LockManager::builder(&format!("redis://watcher:pw@{}", redis.addr()))
        .lock_events(true)
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let mut events = m.events("k*").expiry(false).await.unwrap();
    acl(&mut raw, "-psubscribe").await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Made again at once (or within the reconnect backoff, under 2 s), and
    // refused: the reader hears it within 5 s.
    let item = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("the refusal is told within 5 s")
        .expect("the stream goes on");
    assert!(
        matches!(item, Err(distlock::EventsSkipped { count: 0, .. })),
        "{item:?}"
    );
    // Told once, not at each check (every 5 s) that is refused again.
    let again = tokio::time::timeout(Duration::from_secs(6), events.next()).await;
    assert!(again.is_err(), "told again: {again:?}");
    acl(&mut raw, "+psubscribe").await;
    // The next check (5 s) subscribes it again; each round trip below is a
    // lock the stream reports once it is back. 15 s cover two checks.
    let back = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            m.lock("k1")
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
            let next = tokio::time::timeout(Duration::from_millis(500), events.next()).await;
            if let Ok(Some(Ok(event))) = next {
                if event.key == "k1" {
                    return;
                }
            }
        }
    })
    .await;
    assert!(back.is_ok(), "the stream never heard an event again");
}
