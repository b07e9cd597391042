//! The counting semaphore (`LockManager::counting_semaphore`): permits as a
//! counter any caller may change, as Redisson's `RSemaphore` counts them:
//! `try_set_permits` sets only the first count, releases need no hold and
//! have no ceiling, `add_permits` may take the count below zero, `drain`
//! takes what is available; waiters are woken by a push published only when
//! someone waits; counts are exact over the whole 64-bit range; bad counts
//! are errors; a crashed taker's permits stay taken; `inspect_all` reads
//! it. Every test on one server and on a Redis Cluster, and on PostgreSQL
//! but those that read Redis's names or messages.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use distlock::testing::RedisServer;
use distlock::{Backoff, CountingSemaphore, LockError, LockManager, LockManagerBuilder};

crate::on_stores!(
    try_set_permits_sets_only_the_first_count,
    releases_need_no_hold_and_have_no_ceiling,
    a_shrink_takes_the_count_below_zero_until_releases_lift_it,
    drain_takes_what_is_available,
    zero_permits_admit_nobody_until_a_release,
    counts_are_exact_over_the_whole_64_bit_range,
    bad_counts_are_refused_and_change_nothing,
    a_release_wakes_a_waiter_by_push_not_by_its_timer,
    a_small_waiter_is_served_while_a_large_one_waits,
    a_waiter_gives_up_after_its_wait,
    concurrent_takers_never_exceed_the_permits,
    a_crashed_takers_permits_stay_taken,
    inspect_all_reads_the_counter_and_its_waiters,
    shutdown_wakes_a_waiter,
);

crate::on_both!(
    a_change_publishes_only_when_someone_waits,
    a_foreign_value_is_left_alone,
);

fn builder(d: &Deployment) -> LockManagerBuilder {
    match d {
        Deployment::Single(s) => LockManager::builder(&s.url()),
        Deployment::Cluster(c) => LockManager::cluster_builder(c.urls())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(500)),
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => d.builder(),
    }
}

async fn try_set_permits_sets_only_the_first_count(d: Deployment) {
    let m = d.manager().await;
    let s = m.counting_semaphore("cs:first");
    assert_eq!(s.key(), "cs:first");
    let before = s.counts().await.unwrap();
    assert_eq!((before.available, before.exists), (0, false));
    assert!(s.try_set_permits(5).await.unwrap());
    assert!(!s.try_set_permits(7).await.unwrap(), "already set");
    assert_eq!(s.available_permits().await.unwrap(), 5);
    // Another manager's handle acts on the same counter.
    let other = d.manager().await.counting_semaphore("cs:first");
    assert!(!other.try_set_permits(1).await.unwrap());
    assert!(other.try_acquire(2).await.unwrap());
    assert_eq!(s.available_permits().await.unwrap(), 3);
    // Once deleted, the next count stands.
    assert!(s.delete().await.unwrap());
    assert!(!s.delete().await.unwrap());
    assert!(!s.counts().await.unwrap().exists);
    assert!(s.try_set_permits(9).await.unwrap());
    s.set_permits(2).await.unwrap();
    assert_eq!(
        s.available_permits().await.unwrap(),
        2,
        "set whatever it was"
    );
}

async fn releases_need_no_hold_and_have_no_ceiling(d: Deployment) {
    let m = d.manager().await;
    let s = m.counting_semaphore("cs:release");
    // A release on a counter that does not exist creates it.
    assert_eq!(s.release(1).await.unwrap(), 1);
    assert!(s.counts().await.unwrap().exists);
    assert!(!s.try_set_permits(10).await.unwrap());
    assert!(s.try_acquire(1).await.unwrap());
    assert!(!s.try_acquire(1).await.unwrap());
    // Releasing more than was ever taken raises the count past any start.
    assert_eq!(s.release(3).await.unwrap(), 3);
    assert_eq!(s.release(2).await.unwrap(), 5);
    assert!(s.try_acquire(5).await.unwrap());
    assert_eq!(s.available_permits().await.unwrap(), 0);
}

async fn a_shrink_takes_the_count_below_zero_until_releases_lift_it(d: Deployment) {
    let m = d.manager().await;
    let s = m.counting_semaphore("cs:shrink");
    assert!(s.try_set_permits(2).await.unwrap());
    assert!(s.try_acquire(2).await.unwrap());
    assert_eq!(s.add_permits(-3).await.unwrap(), -3);
    assert_eq!(s.available_permits().await.unwrap(), -3);
    assert!(!s.try_acquire(1).await.unwrap());
    assert_eq!(s.drain_permits().await.unwrap(), 0, "nothing to drain");
    assert_eq!(s.available_permits().await.unwrap(), -3, "left as it was");
    assert_eq!(s.release(2).await.unwrap(), -1);
    assert!(!s.try_acquire(1).await.unwrap());
    assert_eq!(s.release(2).await.unwrap(), 1);
    assert!(s.try_acquire(1).await.unwrap());
    // A shrink of a counter that does not exist starts from 0.
    let fresh = m.counting_semaphore("cs:shrink:fresh");
    assert_eq!(fresh.add_permits(-2).await.unwrap(), -2);
    assert!(!fresh.try_set_permits(5).await.unwrap(), "it exists now");
}

async fn drain_takes_what_is_available(d: Deployment) {
    let m = d.manager().await;
    let s = m.counting_semaphore("cs:drain");
    assert_eq!(s.drain_permits().await.unwrap(), 0, "no counter");
    assert!(!s.counts().await.unwrap().exists, "a drain creates nothing");
    assert!(s.try_set_permits(5).await.unwrap());
    assert!(s.try_acquire(1).await.unwrap());
    assert_eq!(s.drain_permits().await.unwrap(), 4);
    assert_eq!(s.available_permits().await.unwrap(), 0);
    assert_eq!(s.drain_permits().await.unwrap(), 0);
    assert_eq!(s.release(5).await.unwrap(), 5, "the drained and the taken");
}

async fn zero_permits_admit_nobody_until_a_release(d: Deployment) {
    let m = d.manager().await;
    let s = m.counting_semaphore("cs:zero");
    assert!(s.try_set_permits(0).await.unwrap());
    let counts = s.counts().await.unwrap();
    assert_eq!((counts.available, counts.exists), (0, true));
    assert!(!s.try_set_permits(3).await.unwrap(), "zero is a count");
    assert!(!s.try_acquire(1).await.unwrap());
    assert!(!s
        .try_acquire_within(1, Duration::from_millis(200))
        .await
        .unwrap());
    s.release(1).await.unwrap();
    assert!(s.try_acquire(1).await.unwrap());
}

async fn counts_are_exact_over_the_whole_64_bit_range(d: Deployment) {
    let m = d.manager().await;
    let s = m.counting_semaphore("cs:exact");
    // 2^53 + 3 is no double: as one it rounds to 2^53 + 4, which a
    // comparison of Lua numbers would find enough for 2^53 + 4 permits.
    let count: i64 = (1 << 53) + 3;
    s.set_permits(count).await.unwrap();
    assert!(!s.try_acquire(count as u64 + 1).await.unwrap());
    assert_eq!(s.available_permits().await.unwrap(), count);
    assert!(s.try_acquire(count as u64).await.unwrap());
    assert_eq!(s.available_permits().await.unwrap(), 0);
    s.set_permits(i64::MAX).await.unwrap();
    assert!(s.try_acquire(i64::MAX as u64).await.unwrap());
    assert_eq!(s.release(i64::MAX as u64).await.unwrap(), i64::MAX);
    assert_eq!(s.add_permits(i64::MIN).await.unwrap(), -1);
    assert_eq!(s.available_permits().await.unwrap(), -1);
}

async fn bad_counts_are_refused_and_change_nothing(d: Deployment) {
    let m = d.manager().await;
    let s = m.counting_semaphore("cs:bad");
    assert!(s.try_set_permits(3).await.unwrap());
    let invalid = |e: LockError| {
        matches!(e, LockError::InvalidPermits { ref key, .. } if key == "cs:bad")
            .then_some(())
            .ok_or(e)
    };
    invalid(s.try_acquire(0).await.unwrap_err()).unwrap();
    invalid(s.acquire(0).await.unwrap_err()).unwrap();
    invalid(s.release(0).await.unwrap_err()).unwrap();
    invalid(s.try_acquire(i64::MAX as u64 + 1).await.unwrap_err()).unwrap();
    invalid(s.release(u64::MAX).await.unwrap_err()).unwrap();
    let too_long = s.try_acquire_within(1, distlock::MAX_DURATION + Duration::from_secs(1));
    assert!(matches!(too_long.await, Err(LockError::InvalidConfig(ref m)) if m.contains("cs:bad")));
    assert_eq!(s.available_permits().await.unwrap(), 3);
    // Past the top or the bottom of the range: refused, count unchanged.
    s.set_permits(i64::MAX - 1).await.unwrap();
    let err = s.release(2).await.unwrap_err();
    assert!(err.to_string().contains("cs:bad"), "{err}");
    invalid(err).unwrap();
    s.set_permits(-2).await.unwrap();
    invalid(s.add_permits(i64::MIN).await.unwrap_err()).unwrap();
    assert_eq!(s.available_permits().await.unwrap(), -2);
    // A bad key is refused before Redis.
    let empty = m.counting_semaphore("");
    assert!(matches!(
        empty.try_acquire(1).await,
        Err(LockError::InvalidKey { .. })
    ));
    assert!(matches!(
        empty.available_permits().await,
        Err(LockError::InvalidKey { .. })
    ));
}

/// A manager whose waiters' timers would bring them back only after 5 s (a
/// backoff from 10 s with half of it jitter naps 5 to 10 s, capped at 5 s
/// by the registration's renewal, half of its 10 s): a waiter served sooner
/// was woken by the push.
async fn slow_timer_manager(d: &Deployment) -> LockManager {
    builder(d)
        .backoff(Backoff::new(Duration::from_secs(10), Duration::from_secs(10)).with_jitter(0.5))
        .build()
        .await
        .unwrap()
}

/// Waits until `n` acquisitions are registered as waiting on `s`.
async fn await_waiters(s: &distlock::CountingSemaphore, n: u64) {
    let seen = eventually(Duration::from_secs(10), async || {
        s.counts().await.unwrap().waiters == n
    })
    .await;
    assert!(seen.is_some(), "{n} waiters never registered");
}

async fn a_release_wakes_a_waiter_by_push_not_by_its_timer(d: Deployment) {
    let m = d.manager().await;
    let waiting = slow_timer_manager(&d).await;
    let key = "cs:wake";
    let s = m.counting_semaphore(key);
    assert!(s.try_set_permits(0).await.unwrap());
    let waiter = tokio::spawn({
        let s = waiting.counting_semaphore(key);
        async move {
            let took = s.try_acquire_within(2, Duration::from_secs(30)).await;
            (took, Instant::now())
        }
    });
    await_waiters(&s, 1).await;
    // A change that does not make enough permits available does not serve
    // it; the one that does, does.
    s.release(1).await.unwrap();
    let released = Instant::now();
    s.release(1).await.unwrap();
    let (took, at) = waiter.await.unwrap();
    assert!(took.unwrap());
    // Its timer's first nap is 5 s (see slow_timer_manager); the push comes
    // within round trips. 2 s leaves room for a loaded machine.
    let after = at.saturating_duration_since(released);
    assert!(after < Duration::from_secs(2), "woken after {after:?}");
    let counts = s.counts().await.unwrap();
    assert_eq!((counts.available, counts.waiters), (0, 0), "its entry left");
}

/// The wake-up messages of counting semaphore `key`, heard on the server
/// that publishes them (in the order it published them).
async fn wake_ups(d: &Deployment, m: &LockManager, key: &str) -> redis::aio::PubSub {
    let mut raw = d.raw_for(m, key).await;
    let counter = name_of(&mut raw, "csem", key).await.expect("the counter");
    let channel = counter.replacen("csem:", "csemwake:", 1);
    d.redis_subscriber_for(m, key, &channel)
        .await
        .expect("a Redis-only test")
}

async fn a_change_publishes_only_when_someone_waits(d: Deployment) {
    use futures_util::StreamExt;
    let m = d.manager().await;
    let key = "cs:publish";
    let s = m.counting_semaphore(key);
    assert!(s.try_set_permits(0).await.unwrap());
    let mut heard = wake_ups(&d, &m, key).await;
    // Nobody waits: no change publishes.
    s.release(1).await.unwrap();
    s.add_permits(2).await.unwrap();
    s.set_permits(1).await.unwrap();
    assert!(s.try_acquire(1).await.unwrap());
    assert!(!s.try_acquire(1).await.unwrap());

    let waiter = tokio::spawn({
        let s = d.manager().await.counting_semaphore(key);
        async move { s.try_acquire_within(1, Duration::from_secs(30)).await }
    });
    await_waiters(&s, 1).await;
    // Taking permits away makes none available: no wake-up either.
    s.add_permits(-1).await.unwrap();
    s.release(2).await.unwrap();
    assert!(waiter.await.unwrap().unwrap());
    // One server publishes in order: a wake-up from the changes before the
    // release would have come first. The release's is the only one.
    let mut messages = heard.on_message();
    let first = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .expect("the release's wake-up")
        .unwrap();
    assert!(first.get_payload_bytes().starts_with(b"*"));
    let more = tokio::time::timeout(Duration::from_millis(300), messages.next()).await;
    assert!(more.is_err(), "one wake-up only: {more:?}");
}

async fn a_small_waiter_is_served_while_a_large_one_waits(d: Deployment) {
    let m = d.manager().await;
    let key = "cs:sizes";
    let s = m.counting_semaphore(key);
    assert!(s.try_set_permits(0).await.unwrap());
    let spawn_waiter = |permits: u64| {
        let s = s.clone();
        tokio::spawn(async move { s.try_acquire_within(permits, Duration::from_secs(30)).await })
    };
    let large = spawn_waiter(3);
    await_waiters(&s, 1).await;
    let small = spawn_waiter(1);
    await_waiters(&s, 2).await;
    s.release(1).await.unwrap();
    assert!(small.await.unwrap().unwrap());
    assert!(!large.is_finished());
    await_waiters(&s, 1).await;
    s.release(3).await.unwrap();
    assert!(large.await.unwrap().unwrap());
    assert_eq!(s.available_permits().await.unwrap(), 0);
}

async fn a_waiter_gives_up_after_its_wait(d: Deployment) {
    let m = builder(&d)
        .default_wait(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let s = m.counting_semaphore("cs:timeout");
    assert!(s.try_set_permits(1).await.unwrap());
    let start = Instant::now();
    assert!(!s
        .try_acquire_within(2, Duration::from_millis(300))
        .await
        .unwrap());
    let waited = start.elapsed();
    // It returns at its deadline: not before, and within its last attempt's
    // round trip after (a generous second on a loaded machine).
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1300),
        "{waited:?}"
    );
    let err = s.acquire(2).await.unwrap_err();
    assert!(
        matches!(err, LockError::Timeout { ref key, waited } if key == "cs:timeout" && waited == Duration::from_millis(300)),
        "{err:?}"
    );
    assert_eq!(s.available_permits().await.unwrap(), 1, "nothing taken");
}

async fn concurrent_takers_never_exceed_the_permits(d: Deployment) {
    let key = "cs:crowd";
    let permits = 3;
    let first = d.manager().await;
    assert!(first
        .counting_semaphore(key)
        .try_set_permits(permits)
        .await
        .unwrap());
    let inside = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    // Each step commits on PostgreSQL (a WAL flush on a shared machine):
    // holds of 5 ms there rarely overlap three at a time, so they are longer.
    let hold = if d.is_postgres() {
        Duration::from_millis(40)
    } else {
        Duration::from_millis(5)
    };
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let m = d.manager().await;
        for _ in 0..6 {
            let (s, inside, most) = (m.counting_semaphore(key), inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..4 {
                    assert!(s
                        .try_acquire_within(1, Duration::from_secs(30))
                        .await
                        .unwrap());
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(hold).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    s.release(1).await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        permits,
        "never more, and all used"
    );
    let counts = first.counting_semaphore(key).counts().await.unwrap();
    assert_eq!((counts.available, counts.waiters), (permits, 0));
}

async fn a_crashed_takers_permits_stay_taken(d: Deployment) {
    let key = "cs:crash";
    let operator = d.manager().await;
    let s = operator.counting_semaphore(key);
    assert!(s.try_set_permits(3).await.unwrap());
    let crashed = d.manager().await;
    assert!(crashed
        .counting_semaphore(key)
        .try_acquire(2)
        .await
        .unwrap());
    // The taker goes away without releasing: no lease brings its permits back.
    crashed.shutdown().await.unwrap();
    drop(crashed);
    assert_eq!(s.available_permits().await.unwrap(), 1);
    if let Some(mut raw) = d.redis_raw_for(&operator, key).await {
        let counter = name_of(&mut raw, "csem", key).await.expect("the counter");
        assert_eq!(pttl(&mut raw, &counter).await, -1, "no TTL: kept for good");
    }
    // An operator gives them back.
    assert_eq!(s.add_permits(2).await.unwrap(), 3);
}

/// An acquisition dropped while its script is in flight (the caller's
/// timeout, a `select!`, an aborted task) takes nothing in the end: the
/// manager reads the script's reply and gives back the permits it took. On
/// Redis the fault proxy delays every chunk by 1 s each way: the script
/// runs about 1 s after the caller's 200 ms timeout dropped the call, and
/// its reply comes back a second later, within this manager's 5 s command
/// timeout: the window in which a dropped caller never learns what it took. The count is read by a manager of its own, straight to the
/// server.
#[tokio::test]
async fn an_acquisition_dropped_in_flight_takes_nothing() {
    let p = proxied("cs:dropped", 1, Duration::from_secs(5)).await;
    p.proxy
        .set_mode(distlock::testing::FaultMode::Delay(Duration::from_secs(1)));
    let dropped = tokio::time::timeout(Duration::from_millis(200), p.semaphore.acquire(1)).await;
    assert!(dropped.is_err(), "the acquisition was not held up");
    // The script has not run yet: the permit is still there.
    assert_eq!(p.observer.available_permits().await.unwrap(), 1);
    // Then it runs (taken: 0, for at least the second its reply is held),
    // and its reply gives the permit back: the script's request held 1 s,
    // its reply 1 s, the give-back's request 1 s; the proxy holds one chunk
    // of a connection at a time, so 10 s leaves room for others queued.
    await_permit_back(&p.observer, Duration::from_secs(10), true).await;
}

/// A drain dropped while its script is in flight gives back what it took,
/// as an acquisition does: set up as
/// `an_acquisition_dropped_in_flight_takes_nothing`, with the same bounds.
/// Before, the drain ran in the caller's future: dropped, nobody read its
/// reply, and the permit stayed taken, held by nobody.
#[tokio::test]
async fn a_drain_dropped_in_flight_takes_nothing() {
    // Several permits, so that only the amount drained comes back whole.
    let p = proxied("cs:drained", 3, Duration::from_secs(5)).await;
    p.proxy
        .set_mode(distlock::testing::FaultMode::Delay(Duration::from_secs(1)));
    let dropped =
        tokio::time::timeout(Duration::from_millis(200), p.semaphore.drain_permits()).await;
    assert!(dropped.is_err(), "the drain was not held up");
    assert_eq!(p.observer.available_permits().await.unwrap(), 3);
    await_permits_back(&p.observer, 3, Duration::from_secs(10), true).await;
}

/// `shutdown()` right after an acquisition was dropped in flight returns
/// once the permit it took is given back (set up as
/// `an_acquisition_dropped_in_flight_takes_nothing`): a program that exits
/// then does not cut the give-back short, which would leave the permit taken
/// for good (a count has no lease). It returned at once.
#[tokio::test]
async fn shutdown_waits_for_the_give_back_of_a_dropped_acquisition() {
    let p = proxied("cs:shutdown", 1, Duration::from_secs(10)).await;
    p.proxy
        .set_mode(distlock::testing::FaultMode::Delay(Duration::from_secs(1)));
    let dropped = tokio::time::timeout(Duration::from_millis(200), p.semaphore.acquire(1)).await;
    assert!(dropped.is_err(), "the acquisition was not held up");
    // The script runs about 1 s from now, its reply comes back a second
    // later and the give-back takes 2 s more (the proxy holds one chunk of a
    // connection at a time, so more under load): within the shutdown's wait
    // of one command timeout (10 s), which ends as soon as that is done.
    p.manager.shutdown().await.unwrap();
    // Done by then: the count never shows the permit taken afterwards (a
    // shutdown that returned at once would see it taken within 2 s, and back
    // within 4).
    let mut seen = Vec::new();
    let watched = std::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(4) {
        let available = p.observer.available_permits().await.unwrap();
        if seen.last() != Some(&available) {
            seen.push(available);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, [1], "counts seen after the shutdown");
}

/// A counting semaphore seen by a manager that reaches a private server
/// through a fault proxy (which passes bytes unchanged until told
/// otherwise), and by an observer's manager straight to the server; the
/// server and the proxy live as long as it.
struct Proxied {
    _redis: RedisServer,
    proxy: distlock::testing::FaultProxy,
    manager: LockManager,
    semaphore: CountingSemaphore,
    observer: CountingSemaphore,
}

/// [`Proxied`] for semaphore `key` with `permits` available, its manager's
/// command timeout `command_timeout`, and its scripts loaded: through a
/// delay, a NOSCRIPT reply and the load would take two more round trips
/// before the script runs.
async fn proxied(key: &str, permits: i64, command_timeout: Duration) -> Proxied {
    let redis = server();
    let proxy = distlock::testing::FaultProxy::start(redis.addr())
        .await
        .unwrap();
    let manager = LockManager::builder(&proxy.url())
        .command_timeout(command_timeout)
        .build()
        .await
        .unwrap();
    let observer = crate::manager(&redis).await.counting_semaphore(key);
    let semaphore = manager.counting_semaphore(key);
    // The acquisition's script, and the change script that drains.
    assert!(observer.try_set_permits(1).await.unwrap());
    assert!(semaphore.try_acquire(1).await.unwrap());
    semaphore.release(1).await.unwrap();
    semaphore.counts().await.unwrap();
    observer.set_permits(permits).await.unwrap();
    Proxied {
        _redis: redis,
        proxy,
        manager,
        semaphore,
        observer,
    }
}

/// Waits up to `limit` until `s` has one permit again (having had none in
/// between, when `taken_first`: the dropped attempt took it); fails the test
/// with the counts seen otherwise.
async fn await_permit_back(s: &CountingSemaphore, limit: Duration, taken_first: bool) {
    await_permits_back(s, 1, limit, taken_first).await
}

/// [`await_permit_back`] for `permits` permits.
async fn await_permits_back(
    s: &CountingSemaphore,
    permits: i64,
    limit: Duration,
    taken_first: bool,
) {
    let mut seen = Vec::new();
    let back = eventually(limit, async || {
        let available = s.available_permits().await.unwrap();
        if seen.last() != Some(&available) {
            seen.push(available);
        }
        available == permits && (!taken_first || seen.contains(&0))
    })
    .await;
    assert!(
        back.is_some(),
        "the dropped call kept the permits it took (counts seen: {seen:?})"
    );
}

/// The same on PostgreSQL: a transaction of the test's own holds the
/// counters' rows, so the acquisition's statement waits in the server until
/// it commits, after the caller's 200 ms timeout dropped the call.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_acquisition_dropped_in_flight_takes_nothing() {
    let d = Deployment::postgres();
    let Deployment::Postgres { server, schema } = &d else {
        unreachable!()
    };
    let m = d
        .builder()
        .command_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let s = m.counting_semaphore("cs:dropped");
    assert!(s.try_set_permits(1).await.unwrap());
    let db = sql_client(&server.url()).await;
    db.batch_execute(&format!(
        "BEGIN; SELECT 1 FROM {schema}.counters FOR UPDATE"
    ))
    .await
    .unwrap();
    let dropped = tokio::time::timeout(Duration::from_millis(200), s.acquire(1)).await;
    assert!(dropped.is_err(), "the acquisition was not held up");
    // Its statement is in the server, waiting for the rows: it will run and
    // take the permit once they are free.
    let waiting = format!(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE NOT l.granted AND a.query LIKE '%{schema}.counter_acquire%'"
    );
    assert!(
        eventually(Duration::from_secs(5), async || count(&db, &waiting).await
            == 1)
        .await
        .is_some(),
        "the attempt never waited in the server"
    );
    db.batch_execute("COMMIT").await.unwrap();
    // Taken at the commit and given back when its reply arrives, a round
    // trip later: too soon for the poll to be sure to see it taken. 5 s is
    // far more than the two statements take.
    await_permit_back(&s, Duration::from_secs(5), false).await;
}

async fn inspect_all_reads_the_counter_and_its_waiters(d: Deployment) {
    let m = d.manager().await;
    let key = "cs:inspect";
    let state = m.inspect_all(key).await.unwrap();
    assert_eq!((state.counting_permits, state.counting_waiters), (None, 0));
    let s = m.counting_semaphore(key);
    assert!(s.try_set_permits(1).await.unwrap());
    assert!(s.try_acquire(1).await.unwrap());
    let waiter = tokio::spawn({
        let s = s.clone();
        async move { s.try_acquire_within(1, Duration::from_secs(30)).await }
    });
    await_waiters(&s, 1).await;
    let state = m.inspect_all(key).await.unwrap();
    assert_eq!(state.counting_permits, Some(0));
    assert_eq!(state.counting_waiters, 1);
    assert!(
        !state.is_held() && state.holds.is_empty(),
        "no holders: {state:?}"
    );
    // The leased semaphore and the lock of the same key are other names.
    let permit = m.semaphore(key, 1).acquire().await.unwrap();
    let lock = m.lock(key).acquire().await.unwrap();
    assert_eq!(m.inspect_all(key).await.unwrap().holds.len(), 2);
    assert!(m.list("cs:inspect").await.unwrap().len() == 2, "holds only");
    assert_eq!(s.available_permits().await.unwrap(), 0);
    // Freeing every hold on the key leaves the counter alone.
    assert_eq!(m.force_unlock_all(key).await.unwrap(), 2);
    drop((permit, lock));
    assert_eq!(m.inspect_all(key).await.unwrap().counting_permits, Some(0));
    s.release(1).await.unwrap();
    assert!(waiter.await.unwrap().unwrap());
    let listed = m.list_counting_semaphores("cs:insp*").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, key);
    assert_eq!(listed[0].1.available, 0);
}

async fn shutdown_wakes_a_waiter(d: Deployment) {
    let m = slow_timer_manager(&d).await;
    let key = "cs:shutdown";
    let s = m.counting_semaphore(key);
    assert!(s.try_set_permits(0).await.unwrap());
    let waiter = tokio::spawn({
        let s = s.clone();
        async move { s.try_acquire_within(1, Duration::from_secs(30)).await }
    });
    await_waiters(&s, 1).await;
    let start = Instant::now();
    m.shutdown().await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert!(
        matches!(err, LockError::ShutDown { ref key } if key == "cs:shutdown"),
        "{err:?}"
    );
    // Woken, not left to its timer (5 s, see slow_timer_manager).
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(
        s.release(1).await,
        Err(LockError::ShutDown { .. })
    ));
}

async fn a_foreign_value_is_left_alone(d: Deployment) {
    let m = d.manager().await;
    let key = "cs:foreign";
    let s = m.counting_semaphore(key);
    assert!(s.try_set_permits(1).await.unwrap());
    let mut raw = d.raw_for(&m, key).await;
    let counter = name_of(&mut raw, "csem", key).await.expect("the counter");
    for foreign in ["12abc", "007", " 1"] {
        let () = redis::cmd("SET")
            .arg(&counter)
            .arg(foreign)
            .query_async(&mut raw)
            .await
            .unwrap();
        for result in [
            s.try_acquire(1).await.map(drop),
            s.release(1).await.map(drop),
            s.available_permits().await.map(drop),
            m.inspect_all(key).await.map(drop),
        ] {
            assert!(
                matches!(result, Err(LockError::ForeignValue { ref key }) if key == "cs:foreign"),
                "{foreign:?}: {result:?}"
            );
        }
        let kept: String = redis::cmd("GET")
            .arg(&counter)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(kept, foreign);
    }
    // Another type, in the counter's name or the waiters'.
    del(&mut raw, &counter).await;
    let () = redis::cmd("HSET")
        .arg(&counter)
        .arg("f")
        .arg("1")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = s.try_acquire_within(1, Duration::from_secs(1)).await;
    assert!(
        matches!(err, Err(LockError::ForeignValue { .. })),
        "{err:?}"
    );
    del(&mut raw, &counter).await;
    let waiters = counter.replacen("csem:", "csemw:", 1);
    let () = redis::cmd("SET")
        .arg(&waiters)
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = s.release(1).await;
    assert!(
        matches!(err, Err(LockError::ForeignValue { .. })),
        "{err:?}"
    );
    assert!(!exists(&mut raw, &counter).await, "nothing written");
}

/// Each Redlock member would keep its own count: refused, naming the key.
#[tokio::test]
async fn a_redlock_manager_refuses_counting_semaphores() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let m = LockManager::redlock_builder(urls).build().await.unwrap();
    let s = m.counting_semaphore("cs:redlock");
    for result in [
        s.try_set_permits(1).await.map(drop),
        s.try_acquire(1).await.map(drop),
        s.available_permits().await.map(drop),
    ] {
        assert!(
            matches!(result, Err(LockError::InvalidConfig(ref m)) if m.contains("cs:redlock")),
            "{result:?}"
        );
    }
}

/// Each operation is one script call, one round trip (on a private server,
/// whose command counts are this test's alone).
#[tokio::test]
async fn each_operation_is_one_script_call() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let s = m.counting_semaphore("cs:round-trips");
    // Loads both scripts (a first call meets NOSCRIPT and loads its script).
    s.try_set_permits(4).await.unwrap();
    s.try_acquire(1).await.unwrap();
    let calls = [
        "try_set_permits",
        "try_acquire",
        "try_acquire_within",
        "release",
        "add_permits",
        "set_permits",
        "drain_permits",
        "available_permits",
        "counts",
        "delete",
    ];
    for call in calls {
        reset_stats(&mut raw).await;
        match call {
            "try_set_permits" => drop(s.try_set_permits(1).await.unwrap()),
            "try_acquire" => drop(s.try_acquire(1).await.unwrap()),
            // Available: taken at the first attempt, without waiting.
            "try_acquire_within" => {
                assert!(s
                    .try_acquire_within(1, Duration::from_secs(5))
                    .await
                    .unwrap())
            }
            "release" => drop(s.release(1).await.unwrap()),
            "add_permits" => drop(s.add_permits(-1).await.unwrap()),
            "set_permits" => s.set_permits(3).await.unwrap(),
            "drain_permits" => drop(s.drain_permits().await.unwrap()),
            "available_permits" => drop(s.available_permits().await.unwrap()),
            "counts" => drop(s.counts().await.unwrap()),
            "delete" => drop(s.delete().await.unwrap()),
            _ => unreachable!(),
        }
        let sent = command_calls(&mut raw).await;
        assert_eq!(sent.get("evalsha"), Some(&1), "{call}: {sent:?}");
        assert_eq!(sent.get("script|load"), None, "{call}: {sent:?}");
    }
}
