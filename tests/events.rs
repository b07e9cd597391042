//! Lock events (`LockManager::events`): an observer sees the acquisitions,
//! releases, hand-overs, force-unlocks, losses and expiries of the locks whose
//! key matches its pattern, and only those, in the order they happened; with
//! keyspace notifications off, a subscription that wants expiry is refused
//! with the command that turns them on; a stream its reader stopped reading
//! holds at most its capacity and then says how many events it dropped. On
//! one server, on the cluster and on PostgreSQL (`::postgres`: one events
//! channel per schema, expiries told by the sweep; the PostgreSQL-only
//! cases at the end).

mod common;

use std::time::Duration;

use common::{Deployment, RENEWED_LEASE};
use distlock::{EventsSkipped, LockError, LockEvent, LockEventKind, LockEvents, LockManager};
use futures_util::StreamExt;

/// How often a PostgreSQL publisher sweeps, telling of expiries.
#[cfg(feature = "postgres")]
const SWEEP: Duration = Duration::from_millis(200);

async fn publisher(d: &Deployment, holder: &str) -> LockManager {
    let builder = d.builder().holder(holder).lock_events(true);
    #[cfg(feature = "postgres")]
    let builder = builder.postgres_sweep_interval(SWEEP);
    builder
        .build()
        .await
        .expect("connect to the test deployment")
}

/// The deployment's name in keys, so that tests sharing a server keep apart.
fn store_name(d: &Deployment) -> &'static str {
    match d {
        Deployment::Single(_) => "single",
        Deployment::Cluster(_) => "cluster",
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => "pg",
    }
}

/// Turns on the keyspace notifications of expired keys on every server
/// (PostgreSQL's sweep needs nothing).
async fn notify_expiry(d: &Deployment) {
    let urls = match d {
        Deployment::Single(s) => vec![s.url()],
        Deployment::Cluster(c) => c.nodes().into_iter().map(|n| n.url).collect(),
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => return,
    };
    for url in urls {
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        common::expiry_notices_on(&mut conn).await;
    }
}

/// The next item, failing the test after 5 s (events follow their cause
/// within milliseconds on loopback; an expiry within its lease, and on
/// PostgreSQL the publishers' next sweep, `SWEEP`, after it).
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

/// The next item, which must be a skip notice: how many it skipped.
#[cfg(feature = "postgres")]
async fn skipped(events: &mut LockEvents) -> u64 {
    match next_item(events).await {
        Err(skipped) => skipped.count,
        Ok(event) => panic!("expected a skip notice, got {event:?}"),
    }
}

async fn kind_of(events: &mut LockEvents, key: &str) -> LockEventKind {
    let event = next(events).await;
    assert_eq!(event.key, key, "{event:?}");
    event.kind
}

async fn every_kind_of_event_in_order(d: Deployment) {
    let on = store_name(&d);
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
    // 300 ms of a 900 ms lease) then finds it gone. 900 ms, not 300: the
    // hold must last until the force-unlock (a loss before it would come
    // first), and on PostgreSQL a grant's reply or renewal 200 ms late lost
    // a 300 ms lease; 900 ms takes 600 ms.
    let held = a
        .lock(&key)
        .eager_fencing(true)
        .lease(RENEWED_LEASE)
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

    // A lease that runs out (no renewal) expires. 1 s: the grant's reply
    // must come within the lease, or the acquire answers `Lost`, and on
    // PostgreSQL it commits to disk first.
    let held = a
        .lock(&key)
        .renew(false)
        .lease(Duration::from_millis(1000))
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

on_stores!(every_kind_of_event_in_order);

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
    let on = store_name(&d);
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

on_stores!(a_reader_that_stops_reading_gets_at_most_the_capacity_then_the_count_skipped);

/// A manager built without lock events publishes none of its own locks'
/// events (on PostgreSQL its functions skip the notification), but its
/// force-unlocks are told, as an operator's manager seldom publishes.
async fn a_manager_without_lock_events_publishes_only_force_unlocks(d: Deployment) {
    let on = store_name(&d);
    let quiet = d.manager().await;
    let observer = d.manager().await;
    let mut events = observer
        .events(format!("quiet-{on}:*"))
        .expiry(false)
        .await
        .unwrap();
    let first = format!("quiet-{on}:1");
    let second = format!("quiet-{on}:2");
    quiet
        .lock(&first)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = quiet.lock(&second).acquire().await.unwrap();
    assert!(quiet.force_unlock(&second).await.unwrap());
    // The events of one store arrive in the order they were made: had the
    // first lock's acquisition or release been told, it would come first.
    assert_eq!(
        kind_of(&mut events, &second).await,
        LockEventKind::ForceUnlocked {
            fencing_token: None
        }
    );
    drop(held);
}

on_stores!(a_manager_without_lock_events_publishes_only_force_unlocks);

/// A stream whose manager the program dropped (a temporary, as in
/// `LockManager::connect(url).await?.events(..).await?`) keeps the manager's
/// listening alive and goes on delivering: the stream keeps its manager.
async fn a_stream_outlives_the_manager_that_made_it(d: Deployment) {
    let on = store_name(&d);
    let publisher = publisher(&d, "publisher").await;
    let mut events = d
        .manager()
        .await
        .events(format!("orphan-{on}:*"))
        .expiry(false)
        .await
        .unwrap();
    let key = format!("orphan-{on}:1");
    publisher
        .lock(&key)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(matches!(
        kind_of(&mut events, &key).await,
        LockEventKind::Acquired { .. }
    ));
    assert!(matches!(
        kind_of(&mut events, &key).await,
        LockEventKind::Released { .. }
    ));
}

on_stores!(a_stream_outlives_the_manager_that_made_it);

/// `shutdown()` ends the manager's streams: a reader awaiting its next event
/// gets `None` (it used to wait for ever), and a stream asked for afterwards
/// is refused.
async fn a_stream_ends_when_its_manager_shuts_down(d: Deployment) {
    let on = store_name(&d);
    let m = d.manager().await;
    let mut events = m
        .events(format!("ending-{on}:*"))
        .expiry(false)
        .await
        .unwrap();
    let reader = tokio::spawn(async move { events.next().await });
    m.shutdown().await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the stream ended within 5 s of the shutdown")
        .unwrap();
    assert!(end.is_none(), "{end:?}");
    let refused = m.events(format!("ending-{on}:*")).expiry(false).await;
    assert!(
        matches!(refused, Err(LockError::ShutDown { .. })),
        "{:?}",
        refused.map(drop)
    );
}

on_stores!(a_stream_ends_when_its_manager_shuts_down);

/// A listening connection that goes silent with no reset (a partition, a
/// load balancer dropping an idle connection) is pinged and made again: the
/// stream says it may have missed events, and later events arrive on the new
/// connection. Before, the silent connection was kept: when the path came
/// back, events flowed again on it with no word of those lost meanwhile. With
/// a command timeout of 100 ms the observer pings after 5 s of silence (ten
/// command timeouts, at least 5 s) and gives up 2.5 s later (half that): the
/// test waits until the server sees the observer's pattern subscription go,
/// 15 s at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_listening_connection_is_noticed_and_made_again() {
    use distlock::testing::{FaultMode, FaultProxy, RedisServer};
    let server = RedisServer::spawn().unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let observer = LockManager::builder(&proxy.url())
        .command_timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let publisher = LockManager::builder(&server.url())
        .lock_events(true)
        .build()
        .await
        .unwrap();
    let mut events = observer.events("silent:*").expiry(false).await.unwrap();
    let cycle = async |key: &str| {
        publisher
            .lock(key)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    };
    // The observer's events stream is the server's one pattern subscriber.
    let mut admin = redis::Client::open(server.url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let pattern_subscribers = async |admin: &mut redis::aio::MultiplexedConnection| {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(admin)
            .await
            .unwrap();
        clients.lines().filter(|l| !l.contains(" psub=0 ")).count()
    };
    assert_eq!(pattern_subscribers(&mut admin).await, 1);
    proxy.set_mode(FaultMode::BlackHole);
    cycle("silent:lost").await;
    let dropped = common::eventually(Duration::from_secs(15), async || {
        pattern_subscribers(&mut admin).await == 0
    })
    .await;
    assert!(dropped.is_some(), "the silent connection was kept");
    proxy.set_mode(FaultMode::Pass);
    let notice = next_item(&mut events).await;
    assert!(
        matches!(notice, Err(EventsSkipped { count: 0, .. })),
        "the loss is told: {notice:?}"
    );
    cycle("silent:after").await;
    assert!(matches!(
        kind_of(&mut events, "silent:after").await,
        LockEventKind::Acquired { .. }
    ));
}

/// A stream with expiries listens to two patterns on one connection (the
/// published events and the expiry notices): when that connection breaks
/// and is made again, its reader hears of the loss once, then the next
/// event. Before, each pattern pushed its own notice: two
/// `EventsSkipped { count: 0 }` for one break. A private server: killing
/// every pub/sub client of the shared one would cut other tests'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_connection_is_told_once_to_a_stream_of_two_patterns() {
    let server = common::server();
    let mut admin = redis::Client::open(server.url().as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    common::expiry_notices_on(&mut admin).await;
    let observer = common::manager(&server).await;
    let publisher = LockManager::builder(&server.url())
        .lock_events(true)
        .build()
        .await
        .unwrap();
    let mut events = observer.events("twice:*").await.unwrap();
    let () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    let notice = next_item(&mut events).await;
    assert!(
        matches!(notice, Err(EventsSkipped { count: 0, .. })),
        "the loss is told: {notice:?}"
    );
    // Both patterns subscribed again (the notice now comes once the last is
    // back; before, the first pushed it): then any second notice is queued
    // ahead of this cycle's event.
    let both_back = common::eventually(Duration::from_secs(5), async || {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut admin)
            .await
            .unwrap();
        clients.lines().any(|l| l.contains(" psub=2 "))
    })
    .await;
    assert!(
        both_back.is_some(),
        "the two patterns were not subscribed again"
    );
    publisher
        .lock("twice:1")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let after = next_item(&mut events).await;
    assert!(
        matches!(
            &after,
            Ok(LockEvent {
                kind: LockEventKind::Acquired { .. },
                ..
            })
        ),
        "the event after the notice, not a second notice: {after:?}"
    );
}

// PostgreSQL only: how an expiry is noticed (the sweep, or a takeover), a
// listening connection cut, a lock name too long for a notification.

/// A manager of `d` that never sweeps within a test (its first sweep is an
/// hour away), so that only the managers a test means to sweep do.
#[cfg(feature = "postgres")]
async fn without_sweep(d: &Deployment, holder: &str, lock_events: bool) -> LockManager {
    d.builder()
        .holder(holder)
        .lock_events(lock_events)
        .postgres_sweep_interval(Duration::from_secs(3600))
        .build()
        .await
        .expect("connect to the test deployment")
}

/// A lease that runs out unrenewed is reported expired by the publishers'
/// periodic sweep: not before the lease ends, and within the sweep interval
/// (plus the statements' time) after it.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_expiry_is_reported_within_the_sweep_interval() {
    let d = Deployment::postgres();
    let sweeper = publisher(&d, "a").await;
    let observer = without_sweep(&d, "observer", false).await;
    let mut events = observer.events("exp:*").await.unwrap();
    // 1 s: the grant's reply must come within the lease, or the acquire
    // answers `Lost`, and it commits to disk first (a 300 ms lease leaves a
    // loaded machine too little room).
    const LEASE: Duration = Duration::from_millis(1000);
    let started = std::time::Instant::now();
    let held = sweeper
        .lock("exp:1")
        .renew(false)
        .lease(LEASE)
        .acquire()
        .await
        .unwrap();
    assert!(matches!(
        kind_of(&mut events, "exp:1").await,
        LockEventKind::Acquired { .. }
    ));
    assert_eq!(kind_of(&mut events, "exp:1").await, LockEventKind::Expired);
    let reported = started.elapsed();
    // The lease began after `started`, so it ends no earlier than LEASE
    // after it: an expiry told sooner would be wrong. 20 ms under it: the
    // server's clock and ours tick apart.
    assert!(
        reported >= LEASE - Duration::from_millis(20),
        "expired after {reported:?}"
    );
    // The sweeper sleeps SWEEP between runs, so a run starts within SWEEP
    // plus one run's duration after the lease ends, and that run deletes the
    // row and notifies. Each run is one statement, bounded by the command
    // timeout (2 s for this deployment): the run before the expiry and the
    // one that finds it, 4 s, cover a slow shared machine; delivery on
    // loopback is milliseconds.
    let bound = LEASE + SWEEP + 2 * Duration::from_secs(2);
    assert!(
        reported <= bound,
        "expired reported after {reported:?}, bound {bound:?}"
    );
    drop(held);
}

/// A lock whose lease ran out, taken over before any sweep: "expired", then
/// the new holder's "acquired", in that order (one transaction).
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_takeover_of_an_expired_lock_reports_expired_then_acquired() {
    let d = Deployment::postgres();
    let a = without_sweep(&d, "a", true).await;
    let b = without_sweep(&d, "b", true).await;
    let observer = without_sweep(&d, "observer", false).await;
    let mut events = observer.events("take:*").await.unwrap();
    // 1 s: the grant's reply must come within the lease, or the acquire
    // answers `Lost`, and it commits to disk first.
    let held = a
        .lock("take:1")
        .renew(false)
        .lease(Duration::from_millis(1000))
        .acquire()
        .await
        .unwrap();
    assert!(matches!(
        kind_of(&mut events, "take:1").await,
        LockEventKind::Acquired { .. }
    ));
    // Nobody sweeps: the row outlives the lease, and only the takeover can
    // tell of the expiry.
    let ran_out = common::eventually(Duration::from_secs(5), async || {
        observer.inspect("take:1").await.unwrap().is_none()
    })
    .await;
    assert!(ran_out.is_some(), "the lease never ran out");
    let taken = b.lock("take:1").acquire().await.unwrap();
    assert_eq!(kind_of(&mut events, "take:1").await, LockEventKind::Expired);
    match kind_of(&mut events, "take:1").await {
        LockEventKind::Acquired { holder, .. } => assert_eq!(holder, "b"),
        other => panic!("{other:?}"),
    }
    taken.release().await.unwrap();
    assert!(matches!(
        kind_of(&mut events, "take:1").await,
        LockEventKind::Released { .. }
    ));
    drop(held);
}

/// The observer's listening connection terminated by the server: the stream
/// says it missed events (count unknown, 0) once it listens again, and
/// the events after that arrive. A private server: terminating every
/// `distlock-listen` session of the shared one would cut other tests'.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_terminated_listener_yields_a_skip_notice_and_later_events_arrive() {
    let pg = distlock_testing::PostgresServer::start().expect("a private PostgreSQL");
    let build = |lock_events: bool| {
        LockManager::builder(&pg.url())
            .holder("a")
            .lock_events(lock_events)
            .command_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(2))
            .build()
    };
    let a = build(true).await.unwrap();
    let observer = build(false).await.unwrap();
    let mut events = observer.events("cut:*").await.unwrap();
    let held = a.lock("cut:1").acquire().await.unwrap();
    assert!(matches!(
        kind_of(&mut events, "cut:1").await,
        LockEventKind::Acquired { .. }
    ));
    let cut = pg.kill_backends_named("distlock-listen").unwrap();
    assert!(cut >= 1, "no listening connection to terminate");
    // The subscriber reconnects (with its backoff, within a few hundred ms
    // here) and listens again: then the notice.
    assert_eq!(skipped(&mut events).await, 0);
    held.release().await.unwrap();
    assert!(matches!(
        kind_of(&mut events, "cut:1").await,
        LockEventKind::Released { .. }
    ));
}

/// An event whose notification would pass PostgreSQL's 8000-byte payload
/// limit (a lock name of 9000 bytes) does not fail the lock's statement: it
/// is told as one skipped event, naming no lock, and the events of other
/// locks go on.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_event_of_a_name_too_long_to_notify_is_a_skipped_event() {
    let d = Deployment::postgres();
    let a = without_sweep(&d, "a", true).await;
    let observer = without_sweep(&d, "observer", false).await;
    let mut events = observer.events("*").await.unwrap();
    let long = format!("long:{}", "x".repeat(9000));
    let held = a.lock(&long).acquire().await.unwrap();
    assert_eq!(skipped(&mut events).await, 1);
    held.release().await.unwrap();
    assert_eq!(skipped(&mut events).await, 1);
    let short = a.lock("short").acquire().await.unwrap();
    assert!(matches!(
        kind_of(&mut events, "short").await,
        LockEventKind::Acquired { .. }
    ));
    short.release().await.unwrap();
}

/// `lock_event` sends a payload whole up to the last byte PostgreSQL takes
/// (7999 on a stock build: the limit is 8192 - NAMEDATALEN 64 - 128, and a
/// payload must be shorter) and one byte more as the short "- <word>"
/// notice, never failing the statement. A payload here is "<n> <name>
/// expired": 5 bytes of count and space and 8 of " expired" around a name of
/// 7986 or 7987 bytes.
#[cfg(feature = "postgres")]
#[test]
fn postgres_lock_event_meets_the_payload_limit_at_its_boundary() {
    let d = Deployment::postgres();
    let Deployment::Postgres { server, schema } = &d else {
        unreachable!()
    };
    let send = |name_bytes: usize| {
        server
            .psql(&format!(
                "SELECT {schema}.lock_event('distlock_limit_test', repeat('x', {name_bytes}), \
                 'expired')"
            ))
            .expect("lock_event never fails")
    };
    // The limit is the server's: a plain NOTIFY of 7999 bytes passes, of
    // 8000 fails.
    let notify = |bytes: usize| {
        server.psql(&format!(
            "SELECT pg_notify('distlock_limit_test', repeat('x', {bytes}))"
        ))
    };
    assert!(notify(7999).is_ok());
    assert!(notify(8000).is_err());
    assert_eq!(send(7986), "t", "a 7999-byte payload is sent whole");
    assert_eq!(
        send(7987),
        "f",
        "an 8000-byte payload is sent as the short notice"
    );
    assert_eq!(send(1 << 20), "f", "a name of 1 MiB too");
}

/// After a slot migration changes the order of a cluster's masters by their
/// lowest slot, a listening connection made again listens to the master it
/// listened to before: each master's expiries are still heard, each once.
/// It went to the master now first in the map, which another connection
/// heard already: that master's expiries were reported twice, and those of
/// its own master by nobody, with no sign.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_made_again_after_a_slot_migration_keeps_its_master() {
    let cluster = distlock::testing::RedisCluster::builder()
        .masters(3)
        .args(["--notify-keyspace-events", "Kx"])
        .spawn()
        .expect("redis-server must be installed to run the tests");
    let m = LockManager::cluster_builder(cluster.urls())
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let mut events = m.events("mig:*").await.unwrap();
    // Slot 0 moves to the master whose first slot is the highest: it is
    // first in the map now, ahead of the one that held slot 0.
    let first = cluster.master_of_slot(0).unwrap();
    let last = cluster.master_of_slot(16383).unwrap();
    assert_ne!(first, last);
    tokio::task::block_in_place(|| cluster.migrate_slot(0, last).unwrap());
    // Only the listening connection to the master that held slot 0 breaks.
    let url = &cluster.nodes()[first].url;
    run_command(url, ["CLIENT", "KILL", "TYPE", "pubsub"]).await;
    // Made again and subscribed: the stream says it may have missed events.
    assert!(matches!(
        next_item(&mut events).await,
        Err(EventsSkipped { count: 0, .. })
    ));
    // A lease of 1 s, unrenewed, on a key of each master: the grant's reply
    // must come within it, or the acquire answers `Lost` (300 ms leaves a
    // loaded machine too little room).
    let mut keys = Vec::new();
    for master in 0..3 {
        let key = (0..)
            .map(|i| format!("mig:{i}"))
            .find(|key| cluster.master_of_key(&m.redis_names(key).lock).unwrap() == master)
            .unwrap();
        let guard = m
            .lock(key.as_str())
            .lease(Duration::from_millis(1000))
            .renew(false)
            .acquire()
            .await
            .unwrap();
        std::mem::forget(guard);
        keys.push(key);
    }
    // Redis expires a key within a second or so of its TTL (its active
    // expiry samples keys with a TTL ten times a second): 4 s, 3 s past the
    // leases, hear each expiry, and a second report of any.
    let mut expired = std::collections::BTreeMap::<String, usize>::new();
    let listening = tokio::time::sleep(Duration::from_secs(4));
    tokio::pin!(listening);
    loop {
        tokio::select! {
            () = &mut listening => break,
            item = events.next() => {
                if let Some(Ok(event)) = item {
                    if event.kind == LockEventKind::Expired {
                        *expired.entry(event.key).or_default() += 1;
                    }
                }
            }
        }
    }
    let expected: std::collections::BTreeMap<String, usize> =
        keys.iter().map(|k| (k.clone(), 1)).collect();
    assert_eq!(expired, expected, "each master's expiry heard once");
}

/// On a database in `SQL_ASCII` (what `initdb` makes under the C locale),
/// where PostgreSQL counts a name's characters in bytes, the events of a
/// key with non-ASCII characters arrive: before, their count was read as
/// characters, no name ended there, and the events were dropped unseen.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_events_of_non_ascii_keys_arrive_from_a_database_in_sql_ascii() {
    let pg = distlock_testing::PostgresServer::start().expect("a private PostgreSQL");
    pg.psql(
        "CREATE DATABASE ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' \
         TEMPLATE template0",
    )
    .unwrap();
    let url = pg.url().replace("/postgres?", "/ascii?");
    assert!(url.contains("/ascii?"), "{url}");
    let m = LockManager::builder(&url)
        .lock_events(true)
        .build()
        .await
        .unwrap();
    let mut events = m.events("été:*").await.unwrap();
    let held = m.lock("été:1").acquire().await.unwrap();
    assert!(matches!(
        kind_of(&mut events, "été:1").await,
        LockEventKind::Acquired { .. }
    ));
    held.release().await.unwrap();
}
