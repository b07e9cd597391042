//! Leader election (`LockManager::leader`): one leader at a time, epochs that
//! grow with every term, a resignation handed over within one message, a
//! killed or paused leader replaced within its lease, and a watch that sees
//! every term once and in order, also after its subscription was cut, and
//! that gives a watcher who stopped reading the current term, not a backlog.
//! Each test runs on one server, on the process-wide cluster and (with the
//! `postgres` feature) on PostgreSQL (`on_stores!`), but for the few that
//! reach into Redis itself; PostgreSQL's listening connection, terminated,
//! has a test of its own.
//!
//! The crash and pause tests run the leader in a worker process: this test
//! binary itself, started again with `DISTLOCK_LEADER_WORKER` set, running
//! only `leader_worker`.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use common::{Deployment, RENEWED_LEASE};
use distlock::testing::{FaultMode, FaultProxy, RedisServer};
use distlock::{Backoff, LeaderInfo, LockError, LockManager};
use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Managers with a holder name each, to tell the leaders apart.
async fn candidate(d: &Deployment, holder: &str) -> LockManager {
    d.builder()
        .holder(holder)
        .command_timeout(command_timeout(d))
        .connect_timeout(connect_timeout(d))
        .build()
        .await
        .expect("connect to the test deployment")
}

/// The candidates' bound on one round trip (a call, with its reconnect), on
/// Redis.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// The candidates' bound on connecting (and on a watch's subscribing), on
/// Redis.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// The candidates' bound on one round trip on `d`: on PostgreSQL the
/// deployment's (a statement commits, with a WAL flush, on a machine the
/// parallel tests share), on Redis [`COMMAND_TIMEOUT`].
fn command_timeout(d: &Deployment) -> Duration {
    if d.is_postgres() {
        Duration::from_secs(2)
    } else {
        COMMAND_TIMEOUT
    }
}

/// The candidates' bound on connecting on `d` (see [`command_timeout`]).
fn connect_timeout(d: &Deployment) -> Duration {
    if d.is_postgres() {
        Duration::from_secs(2)
    } else {
        CONNECT_TIMEOUT
    }
}

/// An election name of this test's own (the cluster is shared by the tests).
fn election(test: &str, d: &Deployment) -> String {
    let on = match d {
        Deployment::Single(_) => "single",
        Deployment::Cluster(_) => "cluster",
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => "postgres",
    };
    format!("{test}-{on}")
}

/// The terms' lease: 900 ms, renewed every 300 ms, so that a term is lost
/// only by a renewal 600 ms late (600 ms, renewed every 200 ms, is lost by
/// one 400 ms late; on PostgreSQL each renewal commits to disk).
const LEASE: Duration = RENEWED_LEASE;

async fn one_leader_and_a_handover_within_one_message(d: Deployment) {
    let name = election("handover", &d);
    let a = candidate(&d, "a").await;
    let b = candidate(&d, "b").await;
    // `b` waits in the lock's queue: the release hands it over with one
    // message, which reaches `b`'s waiter (a count, not a time: under a
    // loaded CI a time bound measures the machine). `b`'s queue entry is
    // also refreshed on a timer; a refresh in flight when the lock is handed
    // to it finds the lock its own and takes it, and the message heard after
    // that names a waiter that has gone, so it is not counted (as in
    // `tests/fair.rs`'s arrival order). So a round may count none, but never
    // two; with hand-offs not pushed every round counts none: up to three
    // rounds, one of which must count one.
    let mut counted = Vec::new();
    let (first_epoch, second) = loop {
        let first = a.leader(&name).lease(LEASE).campaign().await.unwrap();
        assert_eq!(first.info().holder, "a");

        let b_election = b.leader(&name).lease(LEASE);
        let mut second = tokio::spawn(async move { b_election.campaign().await });
        // While `a` renews, `b` waits: two leases, each of which would have
        // let `b` in had `a`'s renewal failed.
        assert!(
            tokio::time::timeout(LEASE * 2, &mut second).await.is_err(),
            "b led while a did"
        );
        assert!(!first.is_lost());
        let current = a.leader(&name).current().await.unwrap().unwrap();
        assert_eq!(
            (current.holder.as_str(), current.epoch),
            ("a", first.epoch())
        );

        let pushed_before = b.wake_ups_delivered();
        let first_epoch = first.epoch();
        first.resign().await.unwrap();
        let second = second.await.unwrap().unwrap();
        let delivered = b.wake_ups_delivered() - pushed_before;
        assert!(
            delivered <= 1,
            "one hand-over reached b by {delivered} messages"
        );
        counted.push(delivered);
        if delivered == 1 || counted.len() == 3 {
            break (first_epoch, second);
        }
        second.resign().await.unwrap();
    };
    assert!(
        counted.contains(&1),
        "the hand-over reached b by one message in no round: {counted:?}"
    );
    assert!(second.epoch() > first_epoch, "epochs grow with each term");
    assert_eq!(second.info().holder, "b");
    let current = a.leader(&name).current().await.unwrap().unwrap();
    assert_eq!(
        (current.holder.as_str(), current.epoch),
        ("b", second.epoch())
    );

    // A dropped term resigns too (in the background).
    drop(second);
    let third = a.leader(&name).lease(LEASE).campaign().await.unwrap();
    assert!(third.epoch() > first_epoch);
    third.resign().await.unwrap();
    assert_eq!(a.leader(&name).current().await.unwrap(), None);
}

async fn run_leads_stops_the_term_when_lost_and_campaigns_again(d: Deployment) {
    let name = election("run", &d);
    let a = candidate(&d, "a").await;
    let operator = candidate(&d, "operator").await;
    let (terms, mut started) = tokio::sync::mpsc::unbounded_channel();
    let (stops, mut stopped) = tokio::sync::mpsc::unbounded_channel();
    let election = a.leader(&name).lease(LEASE);
    let running = tokio::spawn(async move {
        election
            .run(|term| {
                let terms = terms.clone();
                let stops = stops.clone();
                async move {
                    // Tells when the body is dropped (stopped at its `.await`).
                    struct Stopped(tokio::sync::mpsc::UnboundedSender<u64>, u64);
                    impl Drop for Stopped {
                        fn drop(&mut self) {
                            let _ = self.0.send(self.1);
                        }
                    }
                    let _stopped = Stopped(stops, term.epoch());
                    terms.send(term.epoch()).unwrap();
                    std::future::pending::<()>().await;
                }
            })
            .await
    });
    let limit = Duration::from_secs(5);
    let first = tokio::time::timeout(limit, started.recv())
        .await
        .unwrap()
        .unwrap();
    // The term is taken away: the body stops, and `run` campaigns again.
    assert!(operator
        .force_unlock(&format!("{}{name}", distlock::LEADER_KEY_PREFIX))
        .await
        .unwrap());
    let stopped_epoch = tokio::time::timeout(limit, stopped.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stopped_epoch, first);
    let second = tokio::time::timeout(limit, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(second > first);
    // Dropping `run`'s future ends the term: the lock is released (in the
    // background), not left to expire, so the next campaign wins in a few
    // round trips. Left to expire, the lock would last what the last
    // renewal (every LEASE / 3) left of the lease, at least two thirds of
    // it (600 ms): the bound, which leaves a loaded machine as much.
    running.abort();
    let _ = running.await;
    let dropped = Instant::now();
    let next_term = operator
        .leader(&name)
        .lease(LEASE)
        .campaign()
        .await
        .unwrap();
    assert!(dropped.elapsed() < LEASE * 2 / 3, "{:?}", dropped.elapsed());
    assert!(next_term.epoch() > second);
    next_term.resign().await.unwrap();
}

async fn watch_sees_every_term_once_and_in_order(d: Deployment) {
    let name = election("watch", &d);
    let a = candidate(&d, "a").await;
    let b = candidate(&d, "b").await;
    let observer = candidate(&d, "observer").await;
    let mut watch = observer.leader(&name).watch();
    // The first report is the state when the watch is listening.
    assert_eq!(next(&mut watch).await, None);

    let mut epochs = Vec::new();
    for term in 0..20 {
        let candidate = if term % 2 == 0 { &a } else { &b };
        let leadership = candidate
            .leader(&name)
            .lease(LEASE)
            .campaign()
            .await
            .unwrap();
        epochs.push(leadership.epoch());
        leadership.resign().await.unwrap();
    }
    // Each term is reported when it starts and, as it resigned, ended.
    for (term, epoch) in epochs.iter().enumerate() {
        let reported = next(&mut watch).await.expect("a new term");
        assert_eq!(reported.epoch, *epoch, "term {term} out of order");
        assert_eq!(reported.holder, if term % 2 == 0 { "a" } else { "b" });
        assert_eq!(next(&mut watch).await, None, "term {term} resigned");
    }
    assert!(epochs.windows(2).all(|w| w[0] < w[1]));

    // The watch's subscription is cut, and a term begins while it is down: it
    // reads the leader when it is back. (PostgreSQL's listening connections
    // are cut in a test with a server of its own: the process-wide one
    // serves other tests' listeners, which have the same application name.)
    if d.is_postgres() {
        return;
    }
    kill_subscribers(&d).await;
    let leading = a.leader(&name).lease(LEASE).campaign().await.unwrap();
    let reported = next(&mut watch)
        .await
        .expect("the leader after the reconnect");
    assert_eq!(reported.epoch, leading.epoch());

    leading.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None);
}

/// The next report of `watch`, failing the test after 5 s (a report follows
/// a message or a read within milliseconds on loopback; 5 s also covers a
/// cluster's bus and a reconnect's backoff).
async fn next(watch: &mut distlock::LeaderWatch) -> Option<LeaderInfo> {
    tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("a report within 5 s")
        .expect("the watch goes on")
}

async fn kill_subscribers(d: &Deployment) {
    match d {
        Deployment::Single(s) => {
            let mut raw = common::raw(s).await;
            common::kill_subscribers(&mut raw).await;
        }
        Deployment::Cluster(c) => {
            for node in c.nodes() {
                let mut raw = redis::Client::open(node.url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                common::kill_subscribers(&mut raw).await;
            }
        }
        #[cfg(feature = "postgres")]
        Deployment::Postgres { .. } => unreachable!("a Redis-only test"),
    }
}

/// `run`'s pause after a term whose body returned: the backoff's first delay.
const RUN_FIRST: Duration = Duration::from_millis(500);
/// `run`'s backoff cap: far above any pause after a won term, so that a pause
/// that grew with each term (as it does between failed campaigns) or slept
/// the cap would break the bound below.
const RUN_CAP: Duration = Duration::from_secs(10);

async fn run_campaigns_again_after_each_return_after_the_first_backoff_delay(d: Deployment) {
    let name = election("run-returns", &d);
    let a = candidate(&d, "a").await;
    // Per term: its epoch, when its body started and when it returned.
    let (terms, mut ran) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant, Instant)>();
    let election = a
        .leader(&name)
        .lease(LEASE)
        .backoff(Backoff::new(RUN_FIRST, RUN_CAP));
    let running = tokio::spawn(async move {
        election
            .run(|term| {
                let terms = terms.clone();
                async move {
                    let started = Instant::now();
                    let epoch = term.epoch();
                    // The body returns at once; its term drops with it, which
                    // releases the lock in the background.
                    drop(term);
                    let _ = terms.send((epoch, started, Instant::now()));
                }
            })
            .await
    });
    // The first term: a campaign on a free lock, well under 5 s.
    let mut last = tokio::time::timeout(Duration::from_secs(5), ran.recv())
        .await
        .expect("a first term within 5 s")
        .expect("run goes on");
    // The pause between a return and the next term's start. After the body
    // returns, `run` sleeps `backoff.first()` (reset to `first` after every
    // won term; it doubles towards the cap only after failed campaigns),
    // then campaigns. The returned term's release was spawned at the return
    // and takes one round trip (<= the command timeout), so the campaign
    // meets a free lock (or, on PostgreSQL where the timeout is longer than
    // RUN_FIRST, queues and is handed it by that release): the acquisition
    // (with its eager token), the `inspect` that reads the hold back and the
    // announcement's PUBLISH (NOTIFY), one round trip each, each within the
    // command timeout. Hence
    //   RUN_FIRST <= pause <= RUN_FIRST + 3 * command timeout,
    // 2 s on Redis and 6.5 s on PostgreSQL, while a pause doubled per term
    // would be 8 s by the fifth pause, and one of the cap 10 s.
    let most = RUN_FIRST + command_timeout(&d) * 3;
    for pause_no in 1..=5 {
        let next = tokio::time::timeout(most + Duration::from_secs(1), ran.recv())
            .await
            .unwrap_or_else(|_| panic!("no term {pause_no} after the return"))
            .expect("run goes on");
        let (epoch, started, _) = next;
        let pause = started - last.2;
        assert!(
            pause >= RUN_FIRST,
            "term {pause_no} began {pause:?} after the return, before the first delay"
        );
        assert!(
            pause <= most,
            "term {pause_no} began {pause:?} after the return, over {most:?}"
        );
        assert!(epoch > last.0, "epoch {epoch} after {}", last.0);
        last = next;
    }
    running.abort();
    let _ = running.await;
}

/// The lease of the `lost()` test: longer than LEASE, so that a test thread
/// starved of CPU for a few hundred ms (nice 19 on a loaded 2-core machine)
/// does not lose the term before the force_unlock.
const LOST_LEASE: Duration = Duration::from_millis(1500);

async fn lost_completes_within_a_renewal_of_a_force_unlock_and_since_is_the_campaign(
    d: Deployment,
) {
    let name = election("lost", &d);
    let a = candidate(&d, "a").await;
    let operator = candidate(&d, "operator").await;
    let before = SystemTime::now();
    let term = a.leader(&name).lease(LOST_LEASE).campaign().await.unwrap();
    let after = SystemTime::now();

    // `since` is when the hold began, as stored with the lock in whole
    // milliseconds (so up to 1 ms before `before`); 5 ms covers that and the
    // clock's granularity.
    let current = operator.leader(&name).current().await.unwrap().unwrap();
    assert_eq!(
        (current.holder.as_str(), current.epoch),
        ("a", term.epoch())
    );
    let slack = Duration::from_millis(5);
    assert!(
        current.since + slack >= before && current.since <= after + slack,
        "since {:?} not within {before:?} ..= {after:?}",
        current.since
    );
    assert_eq!(
        term.info().since,
        current.since,
        "the term and current agree"
    );

    // While the term holds, `lost` does not complete: for a lease and a half
    // renewal interval (three renewals, at LOST_LEASE / 3 each), which also puts
    // the force_unlock below between two renewals rather than just before one.
    assert!(
        tokio::time::timeout(LOST_LEASE + LOST_LEASE / 6, term.lost())
            .await
            .is_err(),
        "lost completed while the term held"
    );
    assert!(!term.is_lost());

    assert!(operator
        .force_unlock(&a.leader(&name).lock_key())
        .await
        .unwrap());
    let forced = Instant::now();
    // The loss is reported by the next renewal, which finds the lock gone: a
    // lease is due at most LOST_LEASE / 3 after its last renewal (earlier when
    // batched), and that renewal answers within COMMAND_TIMEOUT (500 ms, two
    // orders of magnitude over a loopback round trip, which is this test's
    // allowance for a loaded machine; 2 s on PostgreSQL). Hence
    //   lost() completes <= LOST_LEASE / 3 + command timeout
    // after it: 1 s on Redis, 2.5 s on PostgreSQL.
    let bound = LOST_LEASE / 3 + command_timeout(&d);
    tokio::time::timeout(bound, term.lost())
        .await
        .unwrap_or_else(|_| panic!("lost() had not completed {bound:?} after the force_unlock"));
    let took = forced.elapsed();
    assert!(term.is_lost());
    assert!(took <= bound, "{took:?}");
    assert!(matches!(term.resign().await, Err(LockError::Lost { .. })));
    assert_eq!(operator.leader(&name).current().await.unwrap(), None);
}

on_stores!(
    one_leader_and_a_handover_within_one_message,
    run_leads_stops_the_term_when_lost_and_campaigns_again,
    watch_sees_every_term_once_and_in_order,
    run_campaigns_again_after_each_return_after_the_first_backoff_delay,
    lost_completes_within_a_renewal_of_a_force_unlock_and_since_is_the_campaign,
    a_killed_leader_is_replaced_within_its_lease,
    a_paused_leader_learns_its_term_ended_and_its_epoch_is_refused,
    a_watcher_that_stopped_reading_gets_the_current_term_not_the_backlog,
    a_dropped_term_is_reported_as_a_vacancy,
    a_watch_ends_when_its_manager_shuts_down,
);

/// `shutdown()` ends the manager's leader watches (a reader awaiting the next
/// change used to wait for ever).
async fn a_watch_ends_when_its_manager_shuts_down(d: Deployment) {
    let name = election("shutdown-watch", &d);
    let observer = candidate(&d, "observer").await;
    let mut watch = observer.leader(&name).watch();
    assert_eq!(next(&mut watch).await, None, "nobody leads");
    observer.shutdown().await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("the watch ended within 5 s of the shutdown");
    assert!(end.is_none(), "{end:?}");
}

/// A term that ends by dropping its `Leadership` (a leader's task returned
/// or was cancelled, its process shutting down) is told to watchers as a
/// vacancy at once, as `resign` tells it. With a 30 s lease, a watch that
/// waited for the lease's end, or for an expiry notice (a released lock
/// sends none), would not report it within the 5 s of `next`.
async fn a_dropped_term_is_reported_as_a_vacancy(d: Deployment) {
    let name = election("dropped", &d);
    let a = candidate(&d, "a").await;
    let observer = candidate(&d, "observer").await;
    let mut watch = observer.leader(&name).watch();
    assert_eq!(next(&mut watch).await, None);
    let leadership = a
        .leader(&name)
        .lease(Duration::from_secs(30))
        .campaign()
        .await
        .unwrap();
    assert_eq!(
        next(&mut watch).await.map(|l| l.epoch),
        Some(leadership.epoch())
    );
    drop(leadership);
    assert_eq!(next(&mut watch).await, None, "the dropped term's end");
}

async fn a_watcher_that_stopped_reading_gets_the_current_term_not_the_backlog(d: Deployment) {
    let name = election("slow-watch", &d);
    let a = candidate(&d, "a").await;
    let observer = candidate(&d, "observer").await;
    let mut slow = observer.leader(&name).watch();
    // Read as it comes: tells when the last change has been announced.
    let mut keeping_up = observer.leader(&name).watch();
    assert_eq!(next(&mut slow).await, None);
    assert_eq!(next(&mut keeping_up).await, None);

    // More changes (a term and its resignation each) than the watch holds for
    // its reader, by a count that is not a multiple of it (a buffer that only
    // restarted at each overflow would still hold a backlog), then a term
    // that goes on.
    let terms = distlock::LEADER_WATCH_CAPACITY + distlock::LEADER_WATCH_CAPACITY / 4;
    let mut first_epoch = None;
    for _ in 0..terms {
        let leadership = a.leader(&name).lease(LEASE).campaign().await.unwrap();
        first_epoch.get_or_insert(leadership.epoch());
        leadership.resign().await.unwrap();
    }
    let current = a.leader(&name).lease(LEASE).campaign().await.unwrap();
    loop {
        let change = next(&mut keeping_up).await;
        if change.is_some_and(|info| info.epoch == current.epoch()) {
            break;
        }
    }

    // The slow watcher reads again: the current term comes at once. The watch
    // hears the announcements on its own subscription, a moment apart from
    // the watcher above; at most the two announced last (the last resignation
    // and the current term) may still be on their way, so the current term
    // is at most the third report, after the newest state the watch held.
    let mut reports = Vec::new();
    loop {
        let change = next(&mut slow).await;
        reports.push(change.clone());
        if change.is_some_and(|info| info.epoch == current.epoch()) {
            break;
        }
    }
    assert!(reports.len() <= 3, "a backlog: {reports:?}");
    assert_ne!(
        reports[0].as_ref().map(|info| info.epoch),
        first_epoch,
        "the oldest missed term"
    );
    assert_eq!(reports.last().unwrap().as_ref().unwrap().holder, "a");

    // It reports each change again once its reader keeps up.
    current.resign().await.unwrap();
    assert_eq!(next(&mut slow).await, None);
}

/// The watch's subscription is down (its connections reset by a proxy, so it
/// cannot come back) while a new term starts and is announced to nobody; once
/// the way is open again, the watch re-subscribes, reads the lock and reports
/// the term, and not before.
#[tokio::test]
async fn watch_reports_a_term_begun_while_its_subscription_was_down_after_reconnecting() {
    let redis = common::server();
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let direct = |holder: &'static str| {
        LockManager::builder(&redis.url())
            .holder(holder)
            .command_timeout(COMMAND_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
    };
    let a = direct("a").await.unwrap();
    let observer = LockManager::builder(&proxy.url())
        .holder("observer")
        .command_timeout(COMMAND_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .await
        .unwrap();
    let mut raw = common::raw(&redis).await;
    let name = "down";
    let channel = format!("distlock:{}{name}", distlock::LEADER_KEY_PREFIX);
    let subscribers = async |raw: &mut redis::aio::MultiplexedConnection, n: i64| {
        common::eventually(Duration::from_secs(5), async || {
            common::numsub(raw, &channel).await == n
        })
        .await
        .is_some()
    };

    let mut watch = observer.leader(name).watch();
    assert_eq!(next(&mut watch).await, None, "nobody leads yet");
    assert!(subscribers(&mut raw, 1).await, "the watch never subscribed");

    // Cut: the watch's subscription (and every reconnection) is reset.
    proxy.set_mode(FaultMode::Reset);
    assert!(
        subscribers(&mut raw, 0).await,
        "the subscription outlived the reset"
    );
    let term = a.leader(name).lease(LEASE).campaign().await.unwrap();
    // Its announcement reached no subscriber, and for a second (in which the
    // watch's listener, retrying after 50, 100, 200, 400 ms, tried four times
    // or more) the watch reports nothing: it cannot have heard of the term.
    assert_eq!(common::numsub(&mut raw, &channel).await, 0);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), watch.next())
            .await
            .is_err(),
        "the watch reported something while cut off"
    );
    assert_eq!(common::numsub(&mut raw, &channel).await, 0);
    assert!(
        !term.is_lost(),
        "a renews directly, unaffected by the proxy"
    );

    proxy.set_mode(FaultMode::Pass);
    let reopened = Instant::now();
    // How soon the watch reports after the way is open again. Its listener
    // retries a failed subscription after a delay that doubles from 50 ms up
    // to 2 s (`listen` in leader.rs), so it is asleep for at most 2 s; its
    // next attempt connects and subscribes within CONNECT_TIMEOUT. Then the
    // watch reads the lock on the observer's command connection, which the
    // reset broke too: the first read may fail (within COMMAND_TIMEOUT) on
    // the broken connection while it reconnects, and the watch reads again
    // 200 ms later (within COMMAND_TIMEOUT). Hence
    //   report <= 2 s + CONNECT_TIMEOUT + 2 * COMMAND_TIMEOUT + 200 ms = 3.7 s
    // after the proxy passes traffic again.
    let bound =
        Duration::from_secs(2) + CONNECT_TIMEOUT + COMMAND_TIMEOUT * 2 + Duration::from_millis(200);
    let reported = tokio::time::timeout(bound, watch.next())
        .await
        .unwrap_or_else(|_| panic!("no report within {bound:?} of the reconnect"))
        .expect("the watch goes on")
        .expect("the leader, not a vacancy");
    let took = reopened.elapsed();
    assert!(took <= bound, "{took:?}");
    assert_eq!(
        (reported.holder.as_str(), reported.epoch, reported.since),
        ("a", term.epoch(), term.info().since)
    );
    assert_eq!(common::numsub(&mut raw, &channel).await, 1);
    assert_eq!(
        observer.leader(name).current().await.unwrap(),
        Some(reported)
    );

    // Back to normal: the resignation is heard as it happens.
    term.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None);
    assert_eq!(observer.leader(name).current().await.unwrap(), None);
}

/// A fenced store: a write carries its epoch and is refused when a higher one
/// was written already. Returns whether the write was accepted.
async fn fenced_write(store: &mut redis::aio::MultiplexedConnection, epoch: u64) -> bool {
    let accepted: i64 = redis::Script::new(
        "local last = tonumber(redis.call('GET', KEYS[1]) or '0') \
         if tonumber(ARGV[1]) < last then return 0 end \
         redis.call('SET', KEYS[1], ARGV[1]) return 1",
    )
    .key("fence")
    .arg(epoch)
    .invoke_async(store)
    .await
    .expect("the fenced store answers");
    accepted == 1
}

/// Where the worker finds the locks.
fn urls(d: &Deployment) -> (String, &'static str) {
    match d {
        Deployment::Single(s) => (s.url(), "single"),
        Deployment::Cluster(c) => (c.urls().join(","), "cluster"),
        #[cfg(feature = "postgres")]
        Deployment::Postgres { server, .. } => (server.url(), "postgres"),
    }
}

/// The PostgreSQL schema of `d` (empty on Redis), for the worker.
fn schema(d: &Deployment) -> String {
    match d {
        #[cfg(feature = "postgres")]
        Deployment::Postgres { schema, .. } => schema.clone(),
        _ => String::new(),
    }
}

/// A leader in a process of its own (see `leader_worker`), and its lines.
struct Worker {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Worker {
    fn start(d: &Deployment, name: &str, holder: &str, store: &RedisServer) -> Worker {
        let (urls, deployment) = urls(d);
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "leader_worker",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DISTLOCK_LEADER_WORKER", deployment)
            .env("WORKER_URLS", urls)
            .env("WORKER_ELECTION", name)
            .env("WORKER_HOLDER", holder)
            .env("WORKER_LEASE_MS", LEASE.as_millis().to_string())
            .env("WORKER_STORE", store.url())
            .env("WORKER_SCHEMA", schema(d))
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the worker");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Worker { child, lines }
    }

    /// The worker's next line of its own (libtest's are skipped); fails the
    /// test after `limit`.
    async fn line(&mut self, limit: Duration) -> String {
        let next = async {
            loop {
                let line = self
                    .lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the worker's output ended");
                // libtest's "test leader_worker ... " may open the line.
                if let Some(at) = line.find("WORKER ") {
                    return line[at + "WORKER ".len()..].to_owned();
                }
            }
        };
        tokio::time::timeout(limit, next)
            .await
            .expect("a line from the worker in time")
    }

    /// Waits for `LEADING <epoch>`.
    async fn leading(&mut self) -> u64 {
        // Process start and a campaign on a free lock: well under 10 s even on
        // a loaded CI machine.
        let line = self.line(Duration::from_secs(10)).await;
        line.strip_prefix("LEADING ")
            .and_then(|epoch| epoch.parse().ok())
            .unwrap_or_else(|| panic!("expected LEADING, got {line:?}"))
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the worker runs").to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }
}

/// The worker: campaigns, says `LEADING <epoch>`, then writes to the fenced
/// store with its epoch every 20 ms, saying `WRITE accepted|refused`, until it
/// sees its term lost: then it says `LOST`, writes once more and exits.
#[test]
fn leader_worker() {
    let Ok(deployment) = std::env::var("DISTLOCK_LEADER_WORKER") else {
        return; // a plain test run: nothing to do
    };
    let var = |name: &str| std::env::var(name).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let urls: Vec<String> = var("WORKER_URLS").split(',').map(str::to_owned).collect();
        let builder = match deployment.as_str() {
            "cluster" => LockManager::cluster_builder(urls),
            #[cfg(feature = "postgres")]
            "postgres" => LockManager::builder(&urls[0]).postgres_schema(var("WORKER_SCHEMA")),
            _ => LockManager::builder(&urls[0]),
        };
        let manager = builder.holder(var("WORKER_HOLDER")).build().await.unwrap();
        let lease = Duration::from_millis(var("WORKER_LEASE_MS").parse().unwrap());
        let term = manager
            .leader(var("WORKER_ELECTION"))
            .lease(lease)
            .campaign()
            .await
            .unwrap();
        println!("WORKER LEADING {}", term.epoch());
        // The test SIGSTOPs this process while a write may be in flight, and
        // a response timer keeps running through the pause: redis-rs's default
        // 500 ms would fail that write at SIGCONT. The bound is the pause (a
        // few leases of a few hundred ms) with room for a loaded machine.
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
        let mut store = redis::Client::open(var("WORKER_STORE"))
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        loop {
            let lost = term.is_lost();
            if lost {
                println!("WORKER LOST");
            }
            let accepted = fenced_write(&mut store, term.epoch()).await;
            println!(
                "WORKER WRITE {}",
                if accepted { "accepted" } else { "refused" }
            );
            if lost {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

async fn a_killed_leader_is_replaced_within_its_lease(d: Deployment) {
    let name = election("killed", &d);
    // On the cluster the watch learns a term ran out from the keyspace
    // notification of the lock's expiry; on one server (notifications off)
    // by reading the lock when the lease it saw ends.
    if let Deployment::Cluster(c) = &d {
        for node in c.nodes() {
            let mut conn = redis::Client::open(node.url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            common::expiry_notices_on(&mut conn).await;
        }
    }
    let store = common::server();
    let observer = candidate(&d, "observer").await;
    let mut watch = observer.leader(&name).watch();
    assert_eq!(next(&mut watch).await, None);

    let mut worker = Worker::start(&d, &name, "worker", &store);
    let worker_epoch = worker.leading().await;
    assert_eq!(next(&mut watch).await.map(|l| l.epoch), Some(worker_epoch));

    let b = candidate(&d, "b").await;
    let b_election = b.leader(&name).lease(LEASE);
    let successor = tokio::spawn(async move { b_election.campaign().await });
    worker.signal("-KILL");
    let killed = Instant::now();
    let term = successor.await.unwrap().unwrap();
    // The lock expires at most one lease after the worker's last renewal,
    // which was before the kill; the waiter retries by then (its backoff is
    // capped by the holder's remaining lease). One second covers the
    // scheduling of a loaded machine.
    let took = killed.elapsed();
    assert!(
        took < LEASE + Duration::from_secs(1),
        "took over after {took:?}"
    );
    assert!(term.epoch() > worker_epoch);
    // The watch may see the lead vacant between the worker's lease running out
    // and `b`'s announcement.
    let reported = match next(&mut watch).await {
        None => next(&mut watch).await.expect("the new leader"),
        Some(leader) => leader,
    };
    assert_eq!(
        (reported.holder.as_str(), reported.epoch),
        ("b", term.epoch())
    );
    term.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None);

    // A leader killed with no successor waiting: the watch reports the lead
    // vacant once the lease the watch last saw has run out (it reads the lock
    // a millisecond after that; `next` allows 5 s).
    let mut worker = Worker::start(&d, &name, "worker-2", &store);
    let epoch = worker.leading().await;
    assert_eq!(next(&mut watch).await.map(|l| l.epoch), Some(epoch));
    worker.signal("-KILL");
    let killed = Instant::now();
    assert_eq!(next(&mut watch).await, None);
    assert!(killed.elapsed() < LEASE + Duration::from_secs(1));
}

async fn a_paused_leader_learns_its_term_ended_and_its_epoch_is_refused(d: Deployment) {
    let name = election("paused", &d);
    let store = common::server();
    let mut store_conn = common::raw(&store).await;
    let mut worker = Worker::start(&d, &name, "worker", &store);
    let worker_epoch = worker.leading().await;
    assert_eq!(worker.line(Duration::from_secs(5)).await, "WRITE accepted");

    let b = candidate(&d, "b").await;
    let b_election = b.leader(&name).lease(LEASE);
    let successor = tokio::spawn(async move { b_election.campaign().await });
    worker.signal("-STOP");
    // Paused, the worker cannot renew: `b` leads within the lease (plus the
    // same second for a loaded machine as above).
    let term = tokio::time::timeout(LEASE + Duration::from_secs(1), successor)
        .await
        .expect("b leads within the lease")
        .unwrap()
        .unwrap();
    assert!(term.epoch() > worker_epoch);
    assert!(fenced_write(&mut store_conn, term.epoch()).await);
    worker.signal("-CONT");
    // Back, the worker finds its term lost at its next check, and every write
    // it makes from now on carries an epoch the store refuses.
    loop {
        let line = worker.line(Duration::from_secs(5)).await;
        match line.as_str() {
            // Lines written before the pause may still be in the pipe.
            "WRITE refused" | "WRITE accepted" => {}
            "LOST" => break,
            other => panic!("after the pause the worker said {other:?}"),
        }
    }
    assert_eq!(worker.line(Duration::from_secs(5)).await, "WRITE refused");
    // No write of the old epoch got in after the new leader's.
    let fence: u64 = redis::cmd("GET")
        .arg("fence")
        .query_async(&mut store_conn)
        .await
        .unwrap();
    assert_eq!(fence, term.epoch());
    term.resign().await.unwrap();
}

/// Campaign, hand-over, `current` and `watch` with managers `a`, `b` and an
/// observer on any backend.
async fn an_election_on(a: LockManager, b: LockManager, observer: LockManager) {
    let name = "elsewhere";
    let mut watch = observer.leader(name).watch();
    assert_eq!(next(&mut watch).await, None);
    let first = a.leader(name).lease(LEASE).campaign().await.unwrap();
    assert_eq!(next(&mut watch).await.map(|l| l.epoch), Some(first.epoch()));
    let b_election = b.leader(name).lease(LEASE);
    let mut second = tokio::spawn(async move { b_election.campaign().await });
    // As on one server: `b` waits while `a` renews, for two leases.
    assert!(tokio::time::timeout(LEASE * 2, &mut second).await.is_err());
    let current = observer.leader(name).current().await.unwrap().unwrap();
    assert_eq!(
        (current.holder.as_str(), current.epoch),
        ("a", first.epoch())
    );
    let first_epoch = first.epoch();
    let started = Instant::now();
    first.resign().await.unwrap();
    let second = second.await.unwrap().unwrap();
    // Redlock's hand-over is a wake-up and a new acquisition on every member,
    // Sentinel's the one server's: both a few round trips. 600 ms, the bound
    // from when the lease was 600 ms: a longer lease does not slow them.
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    assert!(second.epoch() > first_epoch);
    let reported = loop {
        // A vacancy between the resignation and the new term may be reported.
        if let Some(leader) = next(&mut watch).await {
            break leader;
        }
    };
    assert_eq!(
        (reported.holder.as_str(), reported.epoch),
        ("b", second.epoch())
    );
    second.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None);
    assert_eq!(observer.leader(name).current().await.unwrap(), None);
}

#[tokio::test]
async fn an_election_on_redlock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| common::server()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let manager = |holder: &'static str| {
        let urls = urls.clone();
        async move {
            LockManager::redlock_builder(urls)
                .holder(holder)
                .command_timeout(Duration::from_millis(500))
                .connect_timeout(Duration::from_millis(500))
                .build()
                .await
                .unwrap()
        }
    };
    an_election_on(
        manager("a").await,
        manager("b").await,
        manager("observer").await,
    )
    .await;
}

#[tokio::test]
async fn an_election_on_sentinel() {
    let fixture = distlock::testing::RedisSentinel::spawn().unwrap();
    let manager = |holder: &'static str| {
        let fixture = &fixture;
        async move {
            LockManager::sentinel_builder(fixture.sentinel_urls(), fixture.master_name())
                .holder(holder)
                .command_timeout(Duration::from_millis(500))
                .connect_timeout(Duration::from_millis(500))
                .build()
                .await
                .unwrap()
        }
    };
    an_election_on(
        manager("a").await,
        manager("b").await,
        manager("observer").await,
    )
    .await;
}

/// PostgreSQL: the observer's listening connection is terminated
/// (`pg_terminate_backend`, as an idle-session killer or an operator would)
/// and cannot come back (it logs in as a role of its own, which is refused
/// meanwhile), while a new term starts and is announced to nobody; once it
/// may log in again, it listens again, the watch reads the lock and reports
/// the term, and not before. A server of its own: the listening connections
/// of every manager on it are terminated.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_watch_reports_a_term_begun_while_its_listener_was_terminated() {
    let pg = distlock_testing::PostgresServer::start().expect("a private PostgreSQL");
    pg.psql("CREATE ROLE listener LOGIN").unwrap();
    let timeout = Duration::from_secs(2);
    let a = LockManager::builder(&pg.url())
        .holder("a")
        .command_timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .await
        .unwrap();
    let listen_url = pg.url().replace("postgres@", "listener@");
    let observer = LockManager::builder(&pg.url())
        .holder("observer")
        .postgres_listen_url(listen_url)
        .command_timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .await
        .unwrap();
    let name = "terminated";
    let mut watch = observer.leader(name).watch();
    assert_eq!(next(&mut watch).await, None, "nobody leads yet");
    let listening = async || {
        let sql = "SELECT count(*) FROM pg_stat_activity \
                   WHERE usename = 'listener' AND application_name = 'distlock-listen'";
        pg.psql(sql).unwrap() == "1"
    };
    assert!(common::eventually(Duration::from_secs(5), listening)
        .await
        .is_some());

    // Cut: the listener is terminated, and its reconnections refused.
    pg.psql("ALTER ROLE listener NOLOGIN").unwrap();
    assert!(pg.kill_backends_named("distlock-listen").unwrap() >= 1);
    let term = a.leader(name).lease(LEASE).campaign().await.unwrap();
    // Its announcement reached no listener of the observer, and for a second
    // (in which the watch's listener, retrying after 50, 100, 200, 400 ms,
    // tried four times or more) the watch reports nothing: it cannot have
    // heard of the term.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), watch.next())
            .await
            .is_err(),
        "the watch reported something while its listener was refused"
    );
    assert!(!term.is_lost(), "a renews on its own connections");

    pg.psql("ALTER ROLE listener LOGIN").unwrap();
    let reopened = Instant::now();
    // How soon the watch reports once the listener may log in again: the
    // listener retries after a delay that doubles up to 2 s, so it is asleep
    // for at most 2 s; its next attempt connects, is probed and listens
    // within the connect timeout; then the watch reads the lock on the
    // observer's data connection, which was never cut, within the command
    // timeout. Hence
    //   report <= 2 s + connect timeout + command timeout = 6 s
    // after the role may log in again.
    let bound = Duration::from_secs(2) + timeout + timeout;
    let reported = tokio::time::timeout(bound, watch.next())
        .await
        .unwrap_or_else(|_| panic!("no report within {bound:?} of the reconnect"))
        .expect("the watch goes on")
        .expect("the leader, not a vacancy");
    assert!(reopened.elapsed() <= bound, "{:?}", reopened.elapsed());
    assert_eq!(
        (reported.holder.as_str(), reported.epoch, reported.since),
        ("a", term.epoch(), term.info().since)
    );
    assert!(common::eventually(Duration::from_secs(5), listening)
        .await
        .is_some());

    // Back to normal: the resignation is heard as it happens, and the next
    // term too.
    term.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None);
    let again = a.leader(name).lease(LEASE).campaign().await.unwrap();
    assert_eq!(next(&mut watch).await.map(|l| l.epoch), Some(again.epoch()));
    again.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None);
}

/// With keyspace notifications on, a term that ends without a message (an
/// operator's force-unlock deletes the lock: no expiry notice, and the term,
/// still alive, announces no resignation) is reported as a vacancy when the
/// lease the watch last saw ends.
#[tokio::test]
async fn a_term_ended_without_any_message_is_reported_vacant_at_its_leases_end() {
    let redis = RedisServer::spawn().unwrap();
    let mut raw = common::raw(&redis).await;
    common::expiry_notices_on(&mut raw).await;
    let d = Deployment::Single(Box::new(redis));
    let name = "silent-end";
    let a = candidate(&d, "a").await;
    let observer = candidate(&d, "observer").await;
    let term = a.leader(name).lease(LEASE).campaign().await.unwrap();
    let mut watch = observer.leader(name).watch();
    assert_eq!(next(&mut watch).await.map(|l| l.epoch), Some(term.epoch()));
    assert!(observer
        .force_unlock(&a.leader(name).lock_key())
        .await
        .unwrap());
    // The watch reads the lock at the end of the lease it saw (900 ms), well
    // within `next`'s 5 s; it heard nothing that would end the term before.
    assert_eq!(next(&mut watch).await, None);
    drop(term);
}

/// A campaign for the same election inside `run`'s body is refused at once
/// (`AlreadyHeld`), as the guide says, rather than queued behind the term that
/// runs it.
#[tokio::test]
async fn a_campaign_nested_in_runs_body_is_refused() {
    let redis = RedisServer::spawn().unwrap();
    let d = Deployment::Single(Box::new(redis));
    let m = candidate(&d, "a").await;
    let election = m.leader("nested").lease(LEASE);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let running = {
        let election = election.clone();
        tokio::spawn(async move {
            let _ = election
                .run(|term| {
                    let inner = election.clone();
                    let tx = tx.clone();
                    async move {
                        // The term lives as long as the body.
                        let _term = term;
                        let nested = tokio::time::timeout(Duration::from_secs(5), inner.campaign())
                            .await
                            .map(|r| r.map(|_| ()));
                        let _ = tx.send(nested);
                        std::future::pending::<()>().await;
                    }
                })
                .await;
        })
    };
    let nested = rx.recv().await.unwrap();
    assert!(
        matches!(nested, Ok(Err(LockError::AlreadyHeld { .. }))),
        "{nested:?}"
    );
    running.abort();
}

/// A watch made outside any runtime (sync code holding a manager) runs on
/// the manager's runtime: before, `watch()` spawned on the caller's and
/// panicked there ("there is no reactor running").
#[test]
fn a_watch_made_outside_a_runtime_runs_on_the_managers() {
    let server = RedisServer::spawn().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = rt.block_on(LockManager::connect(&server.url())).unwrap();
    let election = m.leader("outside-a-runtime");
    let mut watch = election.watch();
    rt.block_on(async {
        assert_eq!(next(&mut watch).await, None, "nobody leads yet");
        let term = election.campaign().await.unwrap();
        let led = next(&mut watch).await.expect("the new term");
        assert_eq!(led.epoch, term.epoch());
        term.resign().await.unwrap();
    });
}

/// A campaign dropped while its announcement is on its way (a timeout around
/// `campaign()`) gives the term up, and watchers that heard the term begin
/// hear it end, at once: before, nobody told them, and they reported a
/// leader whose `campaign` never returned until its lease ran out (30 s
/// here). The candidate reaches Redis through a proxy that holds each chunk
/// 1 s, so the announcement reaches the watcher 1 s before its reply
/// reaches the candidate; the campaign is dropped in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_dropped_during_its_announcement_tells_watchers_the_term_ended() {
    let server = RedisServer::spawn().unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let candidate = LockManager::builder(&proxy.url())
        .command_timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let observer = LockManager::connect(&server.url()).await.unwrap();
    let name = "dropped-campaign";
    let mut watch = observer.leader(name).watch();
    assert_eq!(next(&mut watch).await, None, "nobody leads yet");
    proxy.set_mode(FaultMode::Delay(Duration::from_secs(1)));
    let election = candidate.leader(name).lease(Duration::from_secs(30));
    // Boxed, so that dropping it drops the future (a pinned local would
    // live to the end of the test).
    let mut campaign = Box::pin(election.campaign());
    let heard = tokio::select! {
        term = &mut campaign => panic!(
            "the campaign returned before its announcement was heard: {:?}",
            term.map(|t| t.epoch())
        ),
        heard = tokio::time::timeout(Duration::from_secs(30), watch.next()) => {
            heard.expect("the term's announcement within 30 s").expect("the watch goes on")
        }
    };
    assert!(heard.is_some(), "the term's announcement");
    drop(campaign);
    assert_eq!(next(&mut watch).await, None, "the term's end");
    proxy.set_mode(FaultMode::Pass);
}

/// Two schemas of one database, the same key prefix and election name: a
/// notification reaches every session of the database, so each schema's
/// channels must be its own. Schema `right`'s fencing sequence is ahead, so
/// a watch of schema `left` that heard `right`'s term would report it and
/// then ignore its own terms as older (their epochs are lower). The watch
/// must report `left`'s term, and only it.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_watches_hear_only_their_own_schemas_terms() {
    let pg = distlock_testing::PostgresServer::start().expect("a private PostgreSQL");
    let timeout = Duration::from_secs(2);
    let in_schema = async |schema: &str, holder: &str| {
        LockManager::builder(&pg.url())
            .postgres_schema(schema)
            .holder(holder)
            .command_timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .await
            .unwrap()
    };
    let left = in_schema("left_locks", "left").await;
    let right = in_schema("right_locks", "right").await;
    // `right`'s sequence ahead of `left`'s: its next term's epoch is above
    // any `left` will issue in this test.
    for _ in 0..5 {
        let g = right
            .lock("ahead")
            .eager_fencing(true)
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let name = "same";
    let mut watch = left.leader(name).watch();
    assert_eq!(next(&mut watch).await, None, "nobody leads in `left`");

    let other = right.leader(name).lease(LEASE).campaign().await.unwrap();
    let own = left.leader(name).lease(LEASE).campaign().await.unwrap();
    assert!(
        other.epoch() > own.epoch(),
        "{} {}",
        other.epoch(),
        own.epoch()
    );
    let reported = next(&mut watch).await.expect("`left`'s term");
    assert_eq!(
        (reported.holder.as_str(), reported.epoch),
        ("left", own.epoch()),
        "the first term reported is `left`'s own"
    );
    // `right`'s resignation is not `left`'s vacancy: the next report is
    // `left`'s own resignation.
    other.resign().await.unwrap();
    own.resign().await.unwrap();
    assert_eq!(next(&mut watch).await, None, "`left`'s term ended");
    let again = left.leader(name).lease(LEASE).campaign().await.unwrap();
    assert_eq!(next(&mut watch).await.map(|l| l.epoch), Some(again.epoch()));
    again.resign().await.unwrap();
}
