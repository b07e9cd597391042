//! Failover on PostgreSQL: a primary with a streaming standby, crashed
//! (`pg_ctl stop -m immediate`) and replaced by the promoted standby.
//!
//! With `postgres_synchronous_standby` and a synchronous standby, no fencing
//! token is issued twice and no lock gets a second holder while its first
//! still trusts it; a grant waits for the standby rather than being made
//! without it. With an asynchronous standby a grant can be lost (the
//! documented limit), which one test shows deterministically.
//!
//! Every server is private to its test (temporary directory, free loopback
//! port). Test names contain `postgres`, so that `--skip postgres` leaves them
//! out.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::{LockError, LockManager};
use distlock_testing::{PostgresServer, Replication};

/// Short enough that a test waits little for a lease to run out.
const LEASE: Duration = Duration::from_secs(1);
/// How long a statement may take before the manager gives up on it.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(1500);
/// A server-side `statement_timeout` below the command timeout. Were it to
/// cancel a commit's wait for the standby, the commit would become visible
/// unconfirmed and the grant return before the manager gives up; PostgreSQL
/// stops the statement's timer before it commits, which this guards.
const STATEMENT_TIMEOUT: &str = "1s";

fn blocking<T>(f: impl FnOnce() -> Result<T, distlock_testing::TestingError>) -> T {
    tokio::task::block_in_place(f).unwrap_or_else(|e| panic!("{e}"))
}

/// A primary whose own sessions commit without waiting for any standby
/// (`synchronous_commit = local`), so that only distlock's per-session
/// setting can make a grant wait; and its standby.
fn primary_and_standby(replication: Replication) -> (PostgresServer, PostgresServer) {
    blocking(|| {
        let primary = PostgresServer::builder()
            .setting("synchronous_commit", "local")
            .start()?;
        let standby = primary.start_standby(replication)?;
        Ok((primary, standby))
    })
}

async fn build(url: &str, synchronous: bool) -> Result<LockManager, LockError> {
    LockManager::builder(url)
        .postgres_synchronous_standby(synchronous)
        .command_timeout(COMMAND_TIMEOUT)
        .default_lease(LEASE)
        .eager_fencing(true)
        .build()
        .await
}

fn server_check_reason(result: Result<LockManager, LockError>) -> String {
    match result {
        Err(LockError::ServerCheck { reason, .. }) => reason,
        Err(other) => panic!("not a server check: {other}"),
        Ok(_) => panic!("built without a synchronous standby"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_synchronous_standby_option_names_what_is_missing() {
    let alone = blocking(PostgresServer::start);
    let reason = server_check_reason(build(&alone.url(), true).await);
    assert!(
        reason.contains("synchronous_standby_names is empty"),
        "{reason}"
    );
    // Without the option nothing is checked.
    build(&alone.url(), false).await.expect("builds without it");

    let (primary, standby) = primary_and_standby(Replication::Synchronous);
    // A standby is read-only: not a place for locks.
    let reason = server_check_reason(build(&standby.url(), true).await);
    assert!(reason.contains("is a standby"), "{reason}");
    build(&primary.url(), true)
        .await
        .expect("builds with a standby in sync");
    // A role that may not read the standbys' sync_state cannot tell.
    blocking(|| primary.psql("CREATE ROLE plain LOGIN"));
    let plain = primary.url().replacen("postgres@", "plain@", 1);
    let reason = server_check_reason(build(&plain, true).await);
    assert!(reason.contains("pg_monitor"), "{reason}");
    // Named but gone: no standby is in sync.
    blocking(|| standby.stop_immediate());
    let reason = server_check_reason(build(&primary.url(), true).await);
    assert!(reason.contains("no standby is in sync"), "{reason}");
}

/// The primary's default is `synchronous_commit = local` and its
/// `statement_timeout` is shorter than the command timeout: the option's
/// startup setting is what makes a grant wait, and nothing cuts the wait. With the synchronous standby
/// stopped, a grant made under the option does not return; it fails with the
/// command timeout, and nobody is granted the lock meanwhile, not even a
/// queued waiter it was handed to. A manager without the option is granted
/// at once, unconfirmed (the contrast).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_grants_wait_for_the_synchronous_standby_and_fail_without_it() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous);
    let unconfirmed = build(&primary.url(), false).await.expect("build");
    blocking(|| {
        primary.psql(&format!(
            "ALTER SYSTEM SET statement_timeout = '{STATEMENT_TIMEOUT}'"
        ))?;
        primary.psql("SELECT pg_reload_conf()")
    });
    let confirmed = build(&primary.url(), true).await.expect("build");
    let held = confirmed.lock("handed").acquire().await.expect("A holds");
    let waiter = {
        let m = confirmed.clone();
        tokio::spawn(async move {
            m.lock("handed")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        })
    };
    await_waiter(&confirmed, "handed").await;

    blocking(|| standby.stop_immediate());
    let started = Instant::now();
    let grant = confirmed.lock("fresh").acquire().await;
    assert!(grant.is_err(), "granted without the standby: {grant:?}");
    // It waited for the standby until the command timeout, no less.
    assert!(
        started.elapsed() >= COMMAND_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    // The hand-off to the waiter is committed on the primary but not
    // confirmed: the release does not return in time.
    let release = held.release().await;
    assert!(release.is_err(), "released without the standby");
    // Two command timeouts: time for the waiter's timer and queue refreshes
    // (every 0.4-0.8 s) to try the lock too. Each of them blocks as well, so
    // the waiter ends with an error or still waits; it is never granted.
    tokio::time::sleep(COMMAND_TIMEOUT * 2).await;
    if waiter.is_finished() {
        let outcome = waiter.await.unwrap();
        assert!(outcome.is_err(), "the waiter was granted unconfirmed");
    } else {
        waiter.abort();
    }
    // Without the option the same primary grants at once.
    let quick = unconfirmed.lock("elsewhere").acquire().await;
    assert!(quick.is_ok(), "{quick:?}");

    // The standby comes back: grants are confirmed again.
    blocking(|| {
        standby.start_again()?;
        primary.wait_for_standby(&standby, Replication::Synchronous)
    });
    let again = confirmed
        .lock("fresh")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("granted once the standby confirms");
    again.release().await.unwrap();
}

/// What the hand-off relies on, shown with plain SQL: a NOTIFY sent in a
/// transaction whose commit waits for the synchronous standby reaches a
/// listener only after the standby confirmed the commit, although the
/// commit is already in the primary's WAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_notify_is_delivered_only_after_the_synchronous_standby_confirmed() {
    use futures_util::StreamExt as _;
    let (primary, standby) = primary_and_standby(Replication::Synchronous);
    let (listener, mut connection) = tokio_postgres::connect(&primary.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = heard_tx.send(n.payload().to_owned());
            }
        }
    });
    listener.batch_execute("LISTEN handoff").await.unwrap();
    let (notifier, connection) = tokio_postgres::connect(&primary.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    notifier
        .batch_execute("SET synchronous_commit = on; CREATE TABLE grants (v int)")
        .await
        .unwrap();

    blocking(|| standby.stop_immediate());
    let notify = tokio::spawn(async move {
        // With a write, as a hand-off has: a transaction that writes
        // nothing but its NOTIFY does not wait for the standby at all.
        notifier
            .batch_execute(
                "BEGIN; INSERT INTO grants VALUES (1); NOTIFY handoff, 'granted'; COMMIT",
            )
            .await
    });
    // The commit waits for the standby for as long as it is down; a second
    // is far longer than a delivery takes on loopback.
    let early = tokio::time::timeout(Duration::from_secs(1), heard.recv()).await;
    assert!(
        early.is_err(),
        "heard before the standby confirmed: {early:?}"
    );
    assert!(!notify.is_finished(), "the commit returned unconfirmed");

    blocking(|| {
        standby.start_again()?;
        primary.wait_for_standby(&standby, Replication::Synchronous)
    });
    let late = tokio::time::timeout(Duration::from_secs(10), heard.recv()).await;
    assert_eq!(late.ok().flatten().as_deref(), Some("granted"));
    notify.await.unwrap().unwrap();
}

/// Locks held and handed over with fencing tokens, then the primary crashes
/// and its synchronous standby is promoted: a manager of the new primary
/// issues tokens above every token a holder saw, and is granted a held lock
/// only after its holder was told it lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_failover_to_a_synchronous_standby_reissues_no_token_and_no_held_lock() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous);
    let old = build(&primary.url(), true).await.expect("build");
    let mut seen = Vec::new();
    // Free grants, then hand-offs through a queue.
    let mut held = Vec::new();
    for i in 0..3 {
        let guard = old.lock(format!("held:{i}")).acquire().await.unwrap();
        seen.push(guard.fencing_token().await.unwrap());
        held.push(guard);
    }
    for round in 0..3 {
        let holder = old.lock("handed").acquire().await.unwrap();
        seen.push(holder.fencing_token().await.unwrap());
        let waiter = spawn_waiter(&old, "handed");
        await_waiter(&old, "handed").await;
        holder.release().await.unwrap();
        let next = waiter.await.unwrap().unwrap();
        seen.push(next.fencing_token().await.unwrap());
        if round < 2 {
            next.release().await.unwrap();
        } else {
            held.push(next);
        }
    }
    let highest = *seen.iter().max().unwrap();

    blocking(|| {
        primary.stop_immediate()?;
        standby.promote()
    });
    // The promoted server has no standby of its own: no option here.
    let new = build(&standby.url(), false)
        .await
        .expect("build on the new primary");
    let fresh = new.lock("fresh").acquire().await.unwrap();
    let token = fresh.fencing_token().await.unwrap();
    assert!(
        token > highest,
        "token {token} after failover, {highest} seen before"
    );

    // Every lock held at the crash is granted anew only once its holder
    // knows it lost it (its renewals fail against the dead primary).
    for (guard, name) in held.iter().zip(["held:0", "held:1", "held:2", "handed"]) {
        let taken = new
            .lock(name)
            .wait(LEASE * 10)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(guard.is_lost(), "{name} granted while its holder trusts it");
        let token = taken.fencing_token().await.unwrap();
        assert!(
            token > highest,
            "{name}: token {token}, {highest} seen before"
        );
        assert!(!seen.contains(&token));
        seen.push(token);
    }
}

/// Split brain: the standby is promoted while the old primary still runs
/// (cut off, say, rather than dead). Under the option the old primary can
/// confirm nothing any more (its synchronous standby left it), so its
/// managers are granted nothing and their holders lose their leases, before
/// the new primary grants those locks to anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_standby_promoted_beside_a_running_primary_leaves_it_unable_to_grant() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous);
    let old = build(&primary.url(), true).await.expect("build");
    let held = old.lock("split").acquire().await.unwrap();
    let token = held.fencing_token().await.unwrap();

    blocking(|| standby.promote());
    // The old primary still answers, but its commits wait for a standby
    // that no longer follows it: no grant, no renewal.
    let grant = old.lock("other").acquire().await;
    assert!(grant.is_err(), "the old primary granted alone: {grant:?}");
    let new = build(&standby.url(), false)
        .await
        .expect("build on the new primary");
    let taken = new
        .lock("split")
        .wait(LEASE * 10)
        .acquire()
        .await
        .expect("granted once the old lease ran out");
    assert!(held.is_lost(), "granted while the old holder trusts it");
    assert!(taken.fencing_token().await.unwrap() > token);
}

/// The documented limit: with an asynchronous standby (and no option), a
/// grant the client saw can be missing from the promoted standby, which then
/// grants the lock again while its holder trusts it, with the same fencing
/// token. Made deterministic by stopping the standby before the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_failover_to_an_asynchronous_standby_can_lose_a_grant() {
    let (primary, standby) = primary_and_standby(Replication::Asynchronous);
    let old = build(&primary.url(), false).await.expect("build");
    // The schema (and nothing issued from the sequence) reached the standby.
    blocking(|| {
        primary.wait_for_replay(&standby)?;
        standby.stop_immediate()
    });
    let first = old.lock("lost").lease(LEASE * 30).acquire().await.unwrap();
    let first_token = first.fencing_token().await.unwrap();

    blocking(|| {
        primary.stop_immediate()?;
        standby.start_again()?;
        standby.promote()
    });
    let new = build(&standby.url(), false)
        .await
        .expect("build on the new primary");
    let second = new
        .lock("lost")
        .acquire()
        .await
        .expect("the promoted standby never saw the first grant");
    assert!(!first.is_lost(), "the first holder still trusts its lease");
    let second_token = second.fencing_token().await.unwrap();
    assert!(
        second_token <= first_token,
        "a token was issued again: {second_token} after {first_token}"
    );
}

/// A primary whose synchronous standby is away keeps each write waiting in
/// its session (a closed socket does not end the wait). A manager whose
/// data connection answered nothing for two command timeouts opens a new
/// one; were it to do so for a session that waits for the standby, each
/// retirement would leave one more waiting session on the server (and the
/// calls on the same keys behind them, waiting for their locks). With a
/// service's calls every 100 ms and a command timeout of 300 ms, 6 s are
/// room for many retirements (one per two command timeouts of silence and
/// a connect): before, 9 or 10 sessions were left, 3 waiting for the
/// standby and the others for their keys' locks. The manager must keep its
/// data connection, whose session waits; two more stranded sessions are
/// allowed for judgements that failed under load (each question is bounded
/// by the 300 ms). Calls still go to the kept connection until 1,024 have
/// timed out on it; the next is refused at once. Once the standby is back,
/// the manager serves again, and only its data connection is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_stalled_primary_does_not_pile_up_sessions() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous);
    let m = LockManager::builder(&primary.url())
        .postgres_synchronous_standby(true)
        .command_timeout(Duration::from_millis(300))
        .postgres_sweep_interval(Duration::from_secs(3600))
        .build()
        .await
        .expect("build");
    let held = m.lock("held").acquire().await.expect("held");
    blocking(|| standby.stop_immediate());
    // A service's calls meanwhile: an attempt every 100 ms, and a release.
    let busy = {
        let m = m.clone();
        tokio::spawn(async move {
            for i in 0.. {
                let _ = m.lock(format!("busy:{i}")).try_acquire().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let _ = held.release().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    busy.abort();
    let stranded = blocking(|| {
        primary.psql(
            "SELECT count(*) || ': ' || coalesce(string_agg(pid || ' ' || wait_event, ', '), '') \
             FROM pg_stat_activity WHERE application_name = 'distlock' \
             AND (wait_event = 'SyncRep' OR wait_event_type = 'Lock')",
        )
    });
    let count: i64 = stranded.split(':').next().unwrap().parse().unwrap();
    assert!(
        (1..=3).contains(&count),
        "sessions of one manager waiting in the server: {stranded}"
    );

    // A flood of calls, each timing out behind the wait: past 1,024 of
    // them, the next is refused unsent, at once.
    let flood = (0..1100).map(|i| {
        let m = m.clone();
        async move { m.lock(format!("flood:{i}")).try_acquire().await }
    });
    let flooded = futures_util::future::join_all(flood).await;
    assert!(flooded.iter().all(Result::is_err));
    let is_refused = |r: &Result<Option<distlock::LockGuard>, LockError>| {
        matches!(r, Err(LockError::Backend { source, .. })
            if source.to_string().contains("no more are sent"))
    };
    // The flood may have gone to a connection not yet kept (one that
    // replaced a connection whose judgement failed under load): its own
    // judgement then comes two command timeouts later, and calls go on
    // timing out until it does. Within 3 s the calls are refused.
    let refusing = async || is_refused(&m.lock("refused").try_acquire().await);
    assert!(eventually(Duration::from_secs(3), refusing).await.is_some());
    let started = Instant::now();
    let refused = m.lock("refused").try_acquire().await;
    assert!(is_refused(&refused), "{refused:?}");
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "refused at once"
    );

    blocking(|| {
        standby.start_again()?;
        primary.wait_for_standby(&standby, Replication::Synchronous)
    });
    // Once the wait ends, the next look (within two command timeouts) asks
    // the connection itself; behind the flood's statements it may not answer
    // in time, and is then replaced (its session ends once it has worked
    // through them). Until then a call, the release of a lock just granted
    // too, may time out (a CI run saw that release time out): each try
    // takes a key of its own, so that a release that timed out leaves no
    // lock in the next try's way, and a try counts once its lock is granted
    // and released.
    let mut tries = 0;
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            tries += 1;
            let key = format!("after-{tries}");
            if let Ok(Some(guard)) = m.lock(&key).try_acquire().await {
                match guard.release().await {
                    Ok(()) => return,
                    Err(LockError::Backend { source, .. })
                        if source.kind() == distlock::BackendErrorKind::Timeout => {}
                    Err(e) => panic!("the release of {key}: {e:?}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("granted and released once the standby confirms");
    // Nothing is left waiting: the manager's sessions come down to its one
    // data connection (the kept one, or, if it was still working through
    // the flood's statements when next looked at, a new one) as the old
    // sessions finish what was queued on them.
    let one_left = async || {
        let sessions = blocking(|| {
            primary
                .psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'distlock'")
        });
        sessions == "1"
    };
    assert!(eventually(Duration::from_secs(10), one_left)
        .await
        .is_some());
}
