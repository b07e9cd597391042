//! The default lock on PostgreSQL behind a transaction-mode pooler (a private
//! PgBouncer, `pool_mode = transaction`, in front of a private server): locking
//! works unchanged, LISTEN does not carry notifications there, so waiters are
//! served by their timers in their queue turn (and a leader watch by its
//! reads); with `postgres_listen_url` pointing at the server itself, wake-ups
//! and hand-offs are pushed again. Read-write locks, semaphores and counting
//! semaphores likewise (their waiters always retry on their backoff timers).
//!
//! Run with `cargo test -p distlock --features postgres --test postgres_pooler`
//! (needs the `pgbouncer` binary; its service need not run).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{queued, sql_client};
use distlock::LockManager;
use distlock_testing::{PgBouncer, PostgresServer};

/// Whether `f` holds within `limit` (polled as `common::eventually` does).
async fn eventually(limit: Duration, f: impl AsyncFnMut() -> bool) -> bool {
    common::eventually(limit, f).await.is_some()
}

async fn manager(url: &str, listen_url: Option<&str>) -> LockManager {
    let mut builder = LockManager::builder(url);
    if let Some(listen_url) = listen_url {
        builder = builder.postgres_listen_url(listen_url);
    }
    builder.build().await.expect("a manager on PostgreSQL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_acquire_release_and_try_through_a_transaction_mode_pooler() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let m = manager(&pooler.url(), None).await;
    let other = manager(&pooler.url(), None).await;
    let guard = m.lock("job").acquire().await.unwrap();
    assert!(m.is_locked("job").await.unwrap());
    assert!(other.lock("job").try_acquire().await.unwrap().is_none());
    let token = guard.fencing_token().await.unwrap();
    guard.release().await.unwrap();
    let taken = other.lock("job").try_acquire().await.unwrap().unwrap();
    assert!(taken.fencing_token().await.unwrap() > token);
}

/// Six waiters of three managers, all through the pooler: none hears a
/// notification (the pooler drops them), yet each is served, in arrival order,
/// by the attempts its timer makes: the release hands the lock to the queue's
/// head in the database, and only the head's attempt finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waiters_are_served_by_their_timers_in_queue_order_through_the_pooler() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let url = pooler.url();
    let managers = [
        manager(&url, None).await,
        manager(&url, None).await,
        manager(&url, None).await,
    ];
    let db = sql_client(&pg.url()).await;
    let holder = managers[0].lock("fifo").acquire().await.unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6usize {
        let m = managers[i % 3].clone();
        let served = served.clone();
        tasks.push(tokio::spawn(async move {
            let guard = m
                .lock("fifo")
                .wait(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap();
            served.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        let want = i as i64 + 1;
        assert!(
            eventually(Duration::from_secs(10), async || queued(&db).await == want).await,
            "waiter {i} never queued"
        );
    }
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    let delivered: u64 = managers.iter().map(|m| m.wake_ups_delivered()).sum();
    assert_eq!(
        delivered, 0,
        "no notification passes a transaction-mode pooler: every grant came by a timer"
    );
    // Each manager's listener found out by its probe (and subscribed nothing).
    // The probe of the last listener to connect may still be waiting for
    // its notification: up to the command timeout (2 s).
    for m in &managers {
        assert!(
            eventually(Duration::from_secs(5), async || m.deaf_listeners() >= 1).await,
            "a listener through the pooler passed its probe"
        );
    }
    assert_eq!(queued(&db).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiter_behind_the_pooler_is_served_within_its_timer_bound() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let m = manager(&pooler.url(), None).await;
    let other = manager(&pooler.url(), None).await;
    let db = sql_client(&pg.url()).await;
    // Three rounds, so that a lucky short nap cannot pass alone.
    for round in 0..3 {
        let key = format!("bound-{round}");
        let holder = m.lock(&key).acquire().await.unwrap();
        let waiter = {
            let other = other.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let guard = other
                    .lock(&key)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                let at = Instant::now();
                guard.release().await.unwrap();
                at
            })
        };
        assert!(eventually(Duration::from_secs(10), async || queued(&db).await == 1).await);
        let released = Instant::now();
        holder.release().await.unwrap();
        let served = waiter.await.unwrap();
        // A queued waiter that hears nothing attempts again after a nap of
        // 0.4 s plus up to 0.4 s of jitter (QUEUE_REFRESH in request.rs),
        // shorter when the holder's remaining lease (30 s here) is; the
        // release handed the lock to it in the database, so that attempt
        // takes it: 0.8 s, plus the release's and the attempt's round trips
        // through the pooler, for which 1 s is ample on a loaded machine.
        let bound = Duration::from_millis(800) + Duration::from_secs(1);
        let took = served.duration_since(released);
        assert!(
            took <= bound,
            "round {round}: served {took:?} after the release"
        );
    }
    assert_eq!(other.wake_ups_delivered(), 0);
}

/// A holder that never releases (as if its process died): the waiter behind
/// the pooler hears nothing, and its timer, capped by the holder's remaining
/// lease, brings it back as the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_waiter_behind_the_pooler_takes_a_dead_holders_lock_as_its_lease_ends() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let m = manager(&pooler.url(), None).await;
    let other = manager(&pooler.url(), None).await;
    let db = sql_client(&pg.url()).await;
    let lease = Duration::from_secs(3);
    let sent = Instant::now();
    let holder = m
        .lock("dead")
        .lease(lease)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let granted = Instant::now();
    // Neither released nor renewed: the lease runs out at the server.
    std::mem::forget(holder);
    let waiter = tokio::spawn(async move {
        let guard = other
            .lock("dead")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        (at, other.wake_ups_delivered())
    });
    assert!(eventually(Duration::from_secs(10), async || queued(&db).await == 1).await);
    let (served, delivered) = waiter.await.unwrap();
    assert_eq!(delivered, 0, "nothing is pushed through the pooler");
    // The server set the expiry to its clock + 3 s after `sent` and before
    // `granted`, so the lock cannot be the waiter's before `sent` + 3 s.
    assert!(
        served.duration_since(sent) >= lease,
        "served before the lease ran out"
    );
    // After its last attempt saw the lease running, the waiter naps at most
    // the remaining lease + 2-4 ms (EXPIRY_MARGIN), and never more than 0.8 s
    // (QUEUE_REFRESH and its jitter); its next attempt finds the lease gone
    // and the lock handed to the queue's head, itself: the lease + 0.8 s, and
    // 1 s for the round trips through the pooler on a loaded machine.
    let bound = lease + Duration::from_millis(800) + Duration::from_secs(1);
    let took = served.duration_since(granted);
    assert!(took <= bound, "served {took:?} after the grant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_uncontended_cycle_through_the_pooler_is_two_statements() {
    let pg = PostgresServer::builder()
        .setting("log_statement", "all")
        .start()
        .unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    // No sweep statement may fall between the two counts.
    let m = LockManager::builder(&pooler.url())
        .postgres_sweep_interval(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    // Warm up: the schema check, the listener's connection and its probe.
    m.lock("warm")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let statements = || common::distlock_statements_logged(&pg, "");
    let before = statements();
    let guard = m.lock("cycle").acquire().await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(
        statements() - before,
        2,
        "statements of one acquire + release cycle"
    );
}

/// Data through the pooler, the listening connection straight to the server:
/// the release's hand-off is pushed to the waiter's manager again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_direct_listen_url_brings_pushed_hand_offs_back() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let direct = pg.url();
    let managers = [
        manager(&pooler.url(), Some(&direct)).await,
        manager(&pooler.url(), Some(&direct)).await,
    ];
    let db = sql_client(&direct).await;
    // A queued waiter also refreshes its entry every 0.4-0.8 s; a refresh in
    // flight when the lock is handed to it finds the lock its own and takes
    // it, and the hand-off message heard after that names a waiter that has
    // gone, so it is not counted (a round has a few percent chance of that).
    // So a round may fall one short, but with push broken every round has 0:
    // up to three rounds, one of which must hear every hand-off.
    let mut heard = Vec::new();
    for round in 0..3 {
        let key = format!("pushed:{round}");
        let delivered = hand_off_chain(&managers, &db, &key).await;
        heard.push(delivered);
        if delivered >= 4 {
            break;
        }
    }
    for m in &managers {
        assert_eq!(m.deaf_listeners(), 0, "the direct listener heard its probe");
    }
    assert!(
        heard.iter().any(|&delivered| delivered >= 4),
        "hand-offs heard for 4 grants, per round: {heard:?}"
    );
}

/// A holder of `managers[0]` and four waiters queued in turn on both
/// managers, served in queue order after its release: how many hand-off
/// messages the managers heard meanwhile.
async fn hand_off_chain(
    managers: &[LockManager; 2],
    db: &tokio_postgres::Client,
    key: &str,
) -> u64 {
    let holder = managers[0].lock(key).acquire().await.unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4usize {
        let m = managers[i % 2].clone();
        let served = served.clone();
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            let guard = m
                .lock(key)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            served.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        let want = i as i64 + 1;
        assert!(
            eventually(Duration::from_secs(10), async || queued(db).await == want).await,
            "waiter {i} never queued"
        );
    }
    let before: u64 = managers.iter().map(|m| m.wake_ups_delivered()).sum();
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), vec![0, 1, 2, 3]);
    let delivered: u64 = managers.iter().map(|m| m.wake_ups_delivered()).sum();
    delivered - before
}

/// The default backoff's longest nap (`Backoff::default()`: capped at 1 s):
/// a waiter of a read-write lock or a semaphore that hears nothing comes
/// back at most this long after a release, and its attempt then takes it.
const BACKOFF_CAP: Duration = Duration::from_secs(1);

/// How late a waiter that hears nothing may be served after the release
/// that freed what it waits for: its longest nap, and 1 s for the release's
/// and the attempt's round trips through the pooler on a loaded machine.
const TIMER_BOUND: Duration = Duration::from_secs(2);

/// Spawns a wait of `m` for `key`'s write lock (`write`) or read lock that
/// returns when it got it (and releases it).
fn spawn_rw_waiter(
    m: &LockManager,
    key: &'static str,
    write: bool,
) -> tokio::task::JoinHandle<Instant> {
    let m = m.clone();
    tokio::spawn(async move {
        let request = if write {
            m.write_lock(key)
        } else {
            m.read_lock(key)
        };
        let guard = request
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    })
}

/// A read-write lock through the pooler: readers share, a waiting writer
/// (its intent recorded in the database) keeps a new reader out, the last
/// reader's release lets it in, and a reader waiting for it gets in after
/// its release; every waiter served by its timer, since no notification
/// passes the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_read_write_lock_is_handed_over_through_the_pooler() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let a = manager(&pooler.url(), None).await;
    let b = manager(&pooler.url(), None).await;
    let first = a.read_lock("doc").acquire().await.unwrap();
    let second = b.read_lock("doc").try_acquire().await.unwrap();
    let second = second.expect("readers share");
    assert!(b.write_lock("doc").try_acquire().await.unwrap().is_none());

    let writer = spawn_rw_waiter(&b, "doc", true);
    assert!(
        eventually(Duration::from_secs(10), async || a
            .inspect_all("doc")
            .await
            .unwrap()
            .writer_waiting)
        .await,
        "the waiting writer's intent is never seen"
    );
    assert!(
        a.read_lock("doc").try_acquire().await.unwrap().is_none(),
        "a waiting writer keeps new readers out"
    );
    second.release().await.unwrap();
    let released = Instant::now();
    first.release().await.unwrap();
    let written = writer.await.unwrap();
    let took = written.duration_since(released);
    assert!(
        took <= TIMER_BOUND,
        "the writer came {took:?} after the last reader left ({BACKOFF_CAP:?} naps)"
    );

    let holding = a.write_lock("doc").acquire().await.unwrap();
    let token = holding.fencing_token().await.unwrap();
    let reader = spawn_rw_waiter(&b, "doc", false);
    // The reader's attempts find the writer (and mark its hold as waited
    // for): seen as busy by a try of another reader meanwhile.
    assert!(b.read_lock("doc").try_acquire().await.unwrap().is_none());
    let released = Instant::now();
    holding.release().await.unwrap();
    let read = reader.await.unwrap();
    assert!(read.duration_since(released) <= TIMER_BOUND);
    let next = a.write_lock("doc").acquire().await.unwrap();
    assert!(next.fencing_token().await.unwrap() > token);
    next.release().await.unwrap();
    assert!(a.inspect_all("doc").await.unwrap().holds.is_empty());
    assert_eq!(a.wake_ups_delivered() + b.wake_ups_delivered(), 0);
}

/// A weighted semaphore through the pooler: counts, a waiter for two permits
/// served when part of a hold is given back, a split, and the permits all
/// free again at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_semaphore_is_handed_over_through_the_pooler() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let a = manager(&pooler.url(), None).await;
    let b = manager(&pooler.url(), None).await;
    let db = sql_client(&pg.url()).await;
    let mut all = a.semaphore("pool", 4).weight(4).acquire().await.unwrap();
    let counts = b.semaphore("pool", 4).permit_counts().await.unwrap();
    assert_eq!((counts.held, counts.available), (4, 0));
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let guard = b
                .semaphore("pool", 4)
                .weight(2)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            (guard, Instant::now())
        })
    };
    // A refused waiter's attempt records the weight it waits for.
    let waiting_weight = async || {
        db.query_opt("SELECT waiting_weight FROM distlock.shared_keys", &[])
            .await
            .unwrap()
            .map(|row| row.get::<_, i64>(0))
    };
    assert!(
        eventually(Duration::from_secs(10), async || waiting_weight().await
            == Some(2))
        .await,
        "the waiter never attempted"
    );
    assert!(!waiter.is_finished(), "no permit is free");
    let released = Instant::now();
    all.release_permits(2).await.unwrap();
    let (two, at) = waiter.await.unwrap();
    assert!(
        at.duration_since(released) <= TIMER_BOUND,
        "served {:?} after the give-back ({BACKOFF_CAP:?} naps)",
        at.duration_since(released)
    );
    let counts = a.semaphore("pool", 4).permit_counts().await.unwrap();
    assert_eq!((counts.held, counts.available), (4, 0));
    let singles = all.split_permits().await.unwrap();
    assert_eq!(singles.len(), 1, "the rest of the hold: 2 single permits");
    let state = a.inspect_all("pool").await.unwrap();
    assert_eq!(state.holds.len(), 3, "{:?}", state.holds);
    assert_eq!(state.permits, Some(4));
    all.release().await.unwrap();
    for g in singles {
        g.release().await.unwrap();
    }
    two.release().await.unwrap();
    let counts = a.semaphore("pool", 4).permit_counts().await.unwrap();
    assert_eq!((counts.held, counts.available), (0, 4));
}

/// Data through the pooler, listening straight at the server: the last
/// reader's release wakes the waiting writer by a notification again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_direct_listen_url_brings_read_write_wake_ups_back() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let direct = pg.url();
    let a = manager(&pooler.url(), Some(&direct)).await;
    let b = manager(&pooler.url(), Some(&direct)).await;
    // The writer's first attempt announces it (`writer_waiting`) before its
    // manager's LISTEN on the lock's channel has run, so a release in
    // between is heard by no one (the writer then comes in on the wake that
    // follows its subscription, or on its timer);
    // and a writer served by its timer may be done before the notification
    // reaches its manager. So the count is awaited, and a round may hear
    // none: up to three rounds, one of which must hear the release (with
    // the listener deaf, none does).
    let mut heard = false;
    for key in ["doc:0", "doc:1", "doc:2"] {
        let before = b.wake_ups_delivered();
        let reading = a.read_lock(key).acquire().await.unwrap();
        let writer = spawn_rw_waiter(&b, key, true);
        assert!(
            eventually(Duration::from_secs(10), async || a
                .inspect_all(key)
                .await
                .unwrap()
                .writer_waiting)
            .await
        );
        reading.release().await.unwrap();
        writer.await.unwrap();
        heard = eventually(Duration::from_secs(5), async || {
            b.wake_ups_delivered() > before
        })
        .await;
        if heard {
            break;
        }
    }
    assert_eq!(b.deaf_listeners(), 0, "the direct listener heard its probe");
    assert!(heard, "woken by the release's notification in no round");
}

/// A counting semaphore through the pooler: a waiter for permits that hears
/// nothing is served by its timer once a release makes them available.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_counting_semaphore_serves_its_waiter_through_the_pooler() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let a = manager(&pooler.url(), None).await;
    let b = manager(&pooler.url(), None).await;
    let uploads = a.counting_semaphore("uploads");
    assert!(uploads.try_set_permits(0).await.unwrap());
    let waiter = {
        let uploads = b.counting_semaphore("uploads");
        tokio::spawn(async move {
            let took = uploads
                .try_acquire_within(2, Duration::from_secs(30))
                .await
                .unwrap();
            (took, Instant::now())
        })
    };
    assert!(
        eventually(Duration::from_secs(10), async || uploads
            .counts()
            .await
            .unwrap()
            .waiters
            == 1)
        .await,
        "the waiter never registered"
    );
    uploads.release(1).await.unwrap();
    let released = Instant::now();
    uploads.release(1).await.unwrap();
    let (took, at) = waiter.await.unwrap();
    assert!(took);
    let after = at.saturating_duration_since(released);
    assert!(
        after <= TIMER_BOUND,
        "served {after:?} after the release ({BACKOFF_CAP:?} naps)"
    );
    let counts = uploads.counts().await.unwrap();
    assert_eq!((counts.available, counts.waiters), (0, 0));
    assert_eq!(b.wake_ups_delivered(), 0);
}

/// A leader watch behind the pooler, whose listening connection hears no
/// announcement: it still reports a term begun while the lead was vacant,
/// by reading the lock every second while the lead is vacant,
/// and the term's end by the lease it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_leader_watch_behind_the_pooler_sees_terms_by_reading() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let leader = LockManager::builder(&pg.url())
        .holder("leader")
        .build()
        .await
        .unwrap();
    let observer = manager(&pooler.url(), None).await;
    let mut watch = observer.leader("pooled").watch();
    let next = async |watch: &mut distlock::LeaderWatch, limit: Duration| {
        use futures_util::StreamExt as _;
        tokio::time::timeout(limit, watch.next())
            .await
            .expect("a report in time")
            .expect("the watch goes on")
    };
    assert_eq!(next(&mut watch, Duration::from_secs(10)).await, None);
    assert!(
        eventually(Duration::from_secs(5), async || observer.deaf_listeners()
            >= 1)
        .await,
        "the observer's listener was not found deaf"
    );
    let lease = Duration::from_millis(900);
    let term = leader
        .leader("pooled")
        .lease(lease)
        .campaign()
        .await
        .unwrap();
    // While the lead is vacant, a deaf watch reads the lock every second:
    // the term is seen within that, plus a read (a statement through the
    // pooler, well under a second on loopback).
    let reported = next(&mut watch, Duration::from_secs(2))
        .await
        .expect("the term, read while vacant");
    assert_eq!(
        (reported.holder.as_str(), reported.epoch),
        ("leader", term.epoch())
    );
    // The resignation is not heard either: the watch reads the lock when
    // the lease it last saw runs out (renewed every lease / 3, so at most a
    // lease after the resignation), plus a read.
    term.resign().await.unwrap();
    assert_eq!(next(&mut watch, lease + Duration::from_secs(1)).await, None);
}

/// `lock_all` through the pooler: one function call, whose transaction locks
/// end with its transaction, so the pooler may hand its server session to
/// anyone next. All or none, as on the server itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lock_all_through_a_transaction_mode_pooler() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let m = manager(&pooler.url(), None).await;
    let other = manager(&pooler.url(), None).await;
    let guard = m
        .lock_all(["set:1", "set:2", "set:3"])
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap();
    let tokens = guard.fencing_tokens().await.unwrap();
    assert!(tokens.iter().all(|t| *t > 0), "{tokens:?}");
    assert!(other.lock("set:2").try_acquire().await.unwrap().is_none());
    // Overlapping with a held key: none of the others is taken.
    assert!(other
        .lock_all(["set:0", "set:3"])
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    assert!(!other.is_locked("set:0").await.unwrap());
    guard.release().await.unwrap();
    other
        .lock_all(["set:0", "set:3"])
        .try_acquire()
        .await
        .unwrap()
        .expect("free once released")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_acquire_cut_by_the_poolers_query_timeout_is_released_once_it_commits() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start_with(&pg, &[("query_timeout", "1")]).unwrap();
    let m = LockManager::builder(&pooler.url())
        .command_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    // The lock's name, which the acquire's advisory lock hashes.
    let guard = m.lock("job").acquire().await.unwrap();
    let db = sql_client(&pg.url()).await;
    let name: String = db
        .query_one(
            "SELECT name FROM distlock.locks WHERE name LIKE '%:job'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    guard.release().await.unwrap();
    // A session of the test's holds the key's advisory lock: the next
    // acquire waits for it on the server, past the pooler's 1 s
    // query_timeout, which ends the client's connection with a FATAL of its
    // own (08P01) and leaves the statement to run on.
    db.execute(
        "SELECT pg_advisory_lock(1684826880, hashtext($1))",
        &[&name],
    )
    .await
    .unwrap();
    let cut = m
        .lock("job")
        .lease(Duration::from_secs(30))
        .try_acquire()
        .await;
    let Err(distlock::LockError::Backend { source, .. }) = cut else {
        panic!("not cut by the pooler: {cut:?}");
    };
    // The pooler's cut (a connection error) is the case this test is for. A
    // CI run on two loaded cores once got a timeout instead (its message
    // was not kept; the call's own command timeout is 5 s): the call's
    // outcome is unknown either way, and what follows must hold for both.
    assert!(
        matches!(
            source.kind(),
            distlock::BackendErrorKind::Connection | distlock::BackendErrorKind::Timeout
        ),
        "the acquire cut by the pooler: {source:?}"
    );
    db.execute(
        "SELECT pg_advisory_unlock(1684826880, hashtext($1))",
        &[&name],
    )
    .await
    .unwrap();
    // The acquire commits now, for an owner whose caller was told it failed.
    // Read as "may have run", its clean-up releases it after it (in the
    // advisory lock's queue behind it); read as "never ran", the lock would
    // stay held for the 30 s lease.
    assert!(
        eventually(Duration::from_secs(10), async || !m
            .is_locked("job")
            .await
            .unwrap())
        .await,
        "the lock taken after the pooler cut the acquire was left held"
    );
}

/// A lock events stream through the pooler, where the listening connection
/// gets no notifications, is refused, naming `postgres_listen_url`, rather
/// than returned to stay silent for good; with a direct listening URL it is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lock_events_through_the_pooler_need_a_direct_listen_url() {
    let pg = PostgresServer::start().unwrap();
    let pooler = PgBouncer::start(&pg).unwrap();
    let deaf = manager(&pooler.url(), None).await;
    match deaf.events("job:*").await {
        Err(distlock::LockError::InvalidConfig(reason)) => {
            assert!(reason.contains("postgres_listen_url"), "{reason}")
        }
        other => panic!("expected InvalidConfig, got {:?}", other.map(drop)),
    }
    let direct = LockManager::builder(&pooler.url())
        .postgres_listen_url(pg.url())
        .lock_events(true)
        .build()
        .await
        .unwrap();
    let mut events = direct.events("job:*").await.unwrap();
    let guard = direct.lock("job:1").acquire().await.unwrap();
    use futures_util::StreamExt;
    let event = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event within 5 s")
        .expect("the stream goes on")
        .expect("no events skipped");
    assert_eq!(event.key, "job:1");
    guard.release().await.unwrap();
}
