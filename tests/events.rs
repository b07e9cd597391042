//! Lock events (`LockManager::events`): an observer sees the acquisitions,
//! releases, hand-overs, force-unlocks, losses and expiries of the locks whose
//! key matches its pattern, and only those, in the order they happened; with
//! keyspace notifications off, a subscription that wants expiry is refused
//! with the command that turns them on; a stream its reader stopped reading
//! holds at most its capacity and then says how many events it dropped. On
//! one server and on the cluster.

mod common;

use std::time::Duration;

use common::Deployment;
use distlock::{EventsSkipped, LockError, LockEvent, LockEventKind, LockEvents, LockManager};
use futures_util::StreamExt;

async fn publisher(d: &Deployment, holder: &str) -> LockManager {
    let builder = match d {
        Deployment::Single(s) => LockManager::builder(&s.url()),
        Deployment::Cluster(c) => LockManager::cluster_builder(c.urls()),
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    };
    builder
        .holder(holder)
        .lock_events(true)
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect to the test deployment")
}

/// Turns on the keyspace notifications of expired keys on every server.
async fn notify_expiry(d: &Deployment) {
    let urls = match d {
        Deployment::Single(s) => vec![s.url()],
        Deployment::Cluster(c) => c.nodes().into_iter().map(|n| n.url).collect(),
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    };
    for url in urls {
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg("Kx")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// The next item, failing the test after 5 s (events follow their cause
/// within milliseconds on loopback; an expiry within its lease).
async fn next_item(events: &mut LockEvents) -> Result<LockEvent, EventsSkipped> {
    tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event within 5 s")
        .expect("the stream goes on")
}

/// The next event, which must not be a skip notice.
async fn next(events: &mut LockEvents) -> LockEvent {
    next_item(events).await.expect("no events skipped")
}

async fn kind_of(events: &mut LockEvents, key: &str) -> LockEventKind {
    let event = next(events).await;
    assert_eq!(event.key, key, "{event:?}");
    event.kind
}

async fn every_kind_of_event_in_order(d: Deployment) {
    let on = match d {
        Deployment::Single(_) => "single",
        Deployment::Cluster(_) => "cluster",
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    };
    notify_expiry(&d).await;
    let a = publisher(&d, "a").await;
    let b = publisher(&d, "b").await;
    // The observer publishes nothing itself.
    let observer = d.manager().await;
    let mut events = observer.events(format!("ev-{on}:*")).await.unwrap();
    let key = format!("ev-{on}:1");

    // Taken while free, without a token.
    let held = a.lock(&key).acquire().await.unwrap();
    match kind_of(&mut events, &key).await {
        LockEventKind::Acquired {
            holder,
            fencing_token: None,
            ..
        } => assert_eq!(holder, "a"),
        other => panic!("{other:?}"),
    }
    // A lock outside the pattern is not reported (the next event is key's).
    a.lock(format!("other-{on}:1"))
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // Released to a queued waiter: one hand-over.
    let waiter = tokio::spawn({
        let b = b.clone();
        let key = key.clone();
        async move { b.lock(&key).wait(Duration::from_secs(5)).acquire().await }
    });
    common::await_waiter(&observer, &key).await;
    held.release().await.unwrap();
    match kind_of(&mut events, &key).await {
        LockEventKind::HandedOver { holder, .. } => assert_eq!(holder, "b"),
        other => panic!("{other:?}"),
    }
    let held = waiter.await.unwrap().unwrap();
    held.release().await.unwrap();
    assert_eq!(
        kind_of(&mut events, &key).await,
        LockEventKind::Released {
            fencing_token: None
        }
    );

    // Taken while free, its token asked for afterwards: the release of a
    // hold nobody waited for (release_free.lua, one key) reports it.
    let held = a.lock(&key).acquire().await.unwrap();
    match kind_of(&mut events, &key).await {
        LockEventKind::Acquired {
            fencing_token: None,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    let token = held.fencing_token().await.unwrap();
    held.release().await.unwrap();
    assert_eq!(
        kind_of(&mut events, &key).await,
        LockEventKind::Released {
            fencing_token: Some(token)
        }
    );

    // With a token; forced open by an operator; the holder's renewal (every
    // 100 ms of a 300 ms lease) then finds it gone.
    let held = a
        .lock(&key)
        .eager_fencing(true)
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let token = held.issued_fencing_token();
    assert!(token.is_some());
    match kind_of(&mut events, &key).await {
        LockEventKind::Acquired { fencing_token, .. } => assert_eq!(fencing_token, token),
        other => panic!("{other:?}"),
    }
    assert!(observer.force_unlock(&key).await.unwrap());
    assert_eq!(
        kind_of(&mut events, &key).await,
        LockEventKind::ForceUnlocked {
            fencing_token: token
        }
    );
    assert_eq!(
        kind_of(&mut events, &key).await,
        LockEventKind::Lost {
            fencing_token: token
        }
    );
    assert!(matches!(held.release().await, Err(LockError::Lost { .. })));

    // A lease that runs out (no renewal) expires.
    let held = a
        .lock(&key)
        .renew(false)
        .lease(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    assert!(matches!(
        kind_of(&mut events, &key).await,
        LockEventKind::Acquired { .. }
    ));
    assert_eq!(kind_of(&mut events, &key).await, LockEventKind::Expired);
    drop(held);

    // Several keys at once: one acquisition event per key.
    let keys = [format!("ev-{on}:2"), format!("ev-{on}:3")];
    let both = a.lock_all(keys.iter().cloned()).acquire().await.unwrap();
    let mut seen = [next(&mut events).await, next(&mut events).await];
    seen.sort_by(|x, y| x.key.cmp(&y.key));
    for (event, key) in seen.iter().zip(&keys) {
        assert_eq!(&event.key, key);
        assert!(
            matches!(event.kind, LockEventKind::Acquired { .. }),
            "{event:?}"
        );
    }
    both.release().await.unwrap();
}

on_both!(every_kind_of_event_in_order);

#[tokio::test]
async fn expiry_without_keyspace_notifications_is_refused_with_the_fix() {
    let redis = common::server();
    let observer = common::manager(&redis).await;
    let refused = observer.events("x:*").await;
    let Err(LockError::ExpiryNotifications { config_set, .. }) = refused else {
        panic!("expected ExpiryNotifications, got {refused:?}");
    };
    assert_eq!(config_set, "CONFIG SET notify-keyspace-events Kx");
    // Without expiry, nothing is needed.
    assert!(observer.events("x:*").expiry(false).await.is_ok());
    // The command it names is the fix.
    let mut raw = common::raw(&redis).await;
    let mut words = config_set.split(' ');
    let mut fix = redis::cmd(words.next().unwrap());
    for word in words {
        fix.arg(word);
    }
    let () = fix.query_async(&mut raw).await.unwrap();
    assert!(observer.events("x:*").await.is_ok());
}

/// Runs the command of `words` (such as the fix an error names, split at its
/// spaces) on the server at `url`.
async fn run_command<'a>(url: &str, words: impl IntoIterator<Item = &'a str>) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut words = words.into_iter();
    let mut fix = redis::cmd(words.next().unwrap());
    for word in words {
        fix.arg(word);
    }
    let () = fix.query_async(&mut conn).await.unwrap();
}

/// On a cluster every master must notify expired keys (each tells only of its
/// own keys): a private cluster, since the process-wide one has them on.
#[tokio::test]
async fn expiry_without_keyspace_notifications_on_every_master_is_refused_on_a_cluster() {
    let cluster = distlock::testing::RedisCluster::builder()
        .masters(3)
        .spawn()
        .expect("redis-server must be installed to run the tests");
    let observer = LockManager::cluster_builder(cluster.urls())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let masters: Vec<String> = cluster
        .nodes()
        .into_iter()
        .filter(|n| n.role == distlock::testing::ClusterNodeRole::Master)
        .map(|n| n.url)
        .collect();
    assert_eq!(masters.len(), 3);

    let refused = observer.events("x:*").await;
    let Err(LockError::ExpiryNotifications { config_set, .. }) = refused else {
        panic!("expected ExpiryNotifications, got {refused:?}");
    };
    assert_eq!(config_set, "CONFIG SET notify-keyspace-events Kx");
    // Without expiry, nothing is needed.
    assert!(observer.events("x:*").expiry(false).await.is_ok());

    // On two masters of three, whichever is left out: still refused, naming
    // the same fix and the setting of the master left out.
    for left_out in 0..masters.len() {
        for (i, master) in masters.iter().enumerate() {
            if i == left_out {
                // Off, as a server starts.
                run_command(master, ["CONFIG", "SET", "notify-keyspace-events", ""]).await;
            } else {
                run_command(master, config_set.split(' ')).await;
            }
        }
        let refused = observer.events("x:*").await;
        let Err(LockError::ExpiryNotifications {
            config_set: again,
            setting,
            ..
        }) = refused
        else {
            panic!("expected ExpiryNotifications without master {left_out}, got {refused:?}");
        };
        assert_eq!(again, config_set);
        assert_eq!(setting, "", "the setting of master {left_out}");
    }

    // On every master: the subscription is made.
    for master in &masters {
        run_command(master, config_set.split(' ')).await;
    }
    assert!(observer.events("x:*").await.is_ok());
}

#[tokio::test]
async fn lock_events_are_refused_on_redlock() {
    let servers: Vec<_> = (0..3).map(|_| common::server()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let refused = LockManager::redlock_builder(urls)
        .lock_events(true)
        .build()
        .await;
    assert!(matches!(refused, Err(LockError::InvalidConfig(_))));
}

/// The slow reader's buffer in `a_reader_that_stops_reading_gets_at_most_the_capacity_then_the_count_skipped`.
const SLOW_CAPACITY: usize = 8;

async fn a_reader_that_stops_reading_gets_at_most_the_capacity_then_the_count_skipped(
    d: Deployment,
) {
    let on = match d {
        Deployment::Single(_) => "single",
        Deployment::Cluster(_) => "cluster",
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    };
    let a = publisher(&d, "a").await;
    let observer = d.manager().await;
    let pattern = format!("slow-{on}:*");
    let mut slow = observer
        .events(&pattern)
        .expiry(false)
        .capacity(SLOW_CAPACITY)
        .await
        .unwrap();
    // Read as they come: tells when the events have been published and heard.
    let mut keeping_up = observer.events(&pattern).expiry(false).await.unwrap();

    // Each round is one acquisition and one release nobody waits for: two
    // events, far more in all than the slow stream's capacity.
    const ROUNDS: usize = 100;
    const EVENTS: u64 = 2 * ROUNDS as u64;
    let key = format!("slow-{on}:1");
    for _ in 0..ROUNDS {
        a.lock(&key)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    for _ in 0..EVENTS {
        next(&mut keeping_up).await;
    }

    // The slow reader comes back: the buffered events first (never more than
    // the capacity), then how many were dropped; events and counts add up to
    // every event published.
    let mut read = Vec::new();
    let mut accounted = 0;
    while accounted < EVENTS {
        let item = next_item(&mut slow).await;
        accounted += match &item {
            Ok(_) => 1,
            Err(skipped) => skipped.count,
        };
        read.push(item);
    }
    assert_eq!(accounted, EVENTS, "{read:?}");
    let first_skip = read
        .iter()
        .position(Result::is_err)
        .expect("the reader is told it skipped events");
    assert!(
        first_skip <= SLOW_CAPACITY,
        "{first_skip} events were buffered for a capacity of {SLOW_CAPACITY}"
    );
    // The events kept are the oldest, in order: acquired, released, ...
    for (n, event) in read[..first_skip].iter().enumerate() {
        let event = event.as_ref().unwrap();
        assert_eq!(event.key, key);
        match (n % 2, &event.kind) {
            (0, LockEventKind::Acquired { .. }) | (1, LockEventKind::Released { .. }) => {}
            _ => panic!("event {n}: {event:?}"),
        }
    }

    // The stream goes on as before once its reader keeps up.
    a.lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(matches!(
        next(&mut slow).await.kind,
        LockEventKind::Acquired { .. }
    ));
    assert!(matches!(
        next(&mut slow).await.kind,
        LockEventKind::Released { .. }
    ));
}

on_both!(a_reader_that_stops_reading_gets_at_most_the_capacity_then_the_count_skipped);
