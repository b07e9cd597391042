//! Ownership beyond one guard: a hold handed to another process by a ticket
//! (resumed, renewed, released, lost), and what "held" means where users of
//! other libraries expect otherwise: the current call chain, a force-unlock
//! of a queued lock, one side of a read-write lock, a semaphore shrunk below
//! its holders. Every test on one server, on a Redis Cluster and (but the
//! first) on PostgreSQL.

mod common;

use std::time::Duration;

use common::*;
use distlock::{Backoff, HoldKind, HoldTicket, LockError, MAX_SPLIT_PERMITS};

// Redis only: chosen when its lease was 300 ms, which leaves PostgreSQL's
// renewal commits (fsync on, a shared machine) too little room.
crate::on_both!(a_hold_handed_over_by_ticket_is_renewed_and_released_by_its_new_guard);

crate::on_stores!(
    a_weighted_permit_and_a_reader_move_by_ticket,
    a_ticket_nobody_resumes_ends_with_its_lease_and_releases_once,
    a_resumed_guard_learns_when_its_hold_is_taken,
    a_guard_shared_by_reentrant_holds_is_not_exported,
    part_of_a_weighted_hold_is_given_back_and_the_rest_kept,
    a_shrink_below_the_held_count_shows_as_overcommitted,
    force_unlock_hands_a_queued_lock_to_the_head_of_its_queue,
    a_read_locks_is_locked_answers_for_both_sides,
    the_current_chain_is_the_guards_scope_not_the_task,
    giving_back_any_number_of_permits_is_one_message,
    a_weighted_hold_split_into_single_permits_is_acted_on_by_permit,
);

/// An HTTP handler takes a lock of each kind and hands it, as a secret
/// string, to a worker of another manager, which resumes it: the same hold
/// (same fencing token), renewed by the worker, released by the worker.
async fn a_hold_handed_over_by_ticket_is_renewed_and_released_by_its_new_guard(d: Deployment) {
    let handler = d.manager().await;
    let worker = d.manager().await;
    // 900 ms, renewed every 300 ms: the hold must last from the grant to the
    // resume (nobody renews it in between) and then through the worker's
    // renewals; a 300 ms lease is lost by a reply or renewal 200 ms late on
    // a loaded machine, 900 ms by one 600 ms late.
    let lease = RENEWED_LEASE;

    let guard = handler
        .lock("job:1")
        .lease(lease)
        .eager_fencing(true)
        .acquire()
        .await
        .unwrap();
    let token = guard.issued_fencing_token().unwrap();
    let secret = guard.into_ticket().unwrap().to_secret_string();
    assert_eq!(handler.held_count(), 0, "the handler renews it no more");
    let ticket = HoldTicket::from_secret_string(&secret).unwrap();
    assert_eq!(ticket.key(), "job:1");
    assert!(
        format!("{ticket:?}").contains("<redacted>"),
        "Debug hides the owner"
    );
    let resumed = worker.resume(&ticket).await.unwrap();
    assert_eq!(resumed.issued_fencing_token(), Some(token));
    assert_eq!(resumed.lease(), lease);
    // A lease and a half: without the worker's renewal (every lease / 3)
    // the lock would have expired after one (nobody else renews it since
    // `into_ticket`), and the guard's local deadline (lease - 1% - 2 ms after
    // its last renewal) would have passed.
    tokio::time::sleep(lease * 3 / 2).await;
    assert!(!resumed.is_lost());
    assert!(handler.lock("job:1").try_acquire().await.unwrap().is_none());
    resumed.release().await.unwrap();
    assert!(!handler.is_locked("job:1").await.unwrap());

    // A weighted semaphore hold moves with its permits.
    let permits = handler
        .semaphore("pool", 5)
        .weight(2)
        .acquire()
        .await
        .unwrap();
    let ticket = permits.into_ticket().unwrap();
    let resumed = worker.resume(&ticket).await.unwrap();
    let counts = worker.semaphore("pool", 5).permit_counts().await.unwrap();
    assert_eq!((counts.held, counts.available), (2, 3));
    resumed.release().await.unwrap();
    let counts = worker.semaphore("pool", 5).permit_counts().await.unwrap();
    assert_eq!(counts.held, 0);

    // So does a reader, who keeps the writer out until the worker releases.
    let reading = handler.read_lock("doc").acquire().await.unwrap();
    let resumed = worker
        .resume(&reading.into_ticket().unwrap())
        .await
        .unwrap();
    assert!(handler
        .write_lock("doc")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    resumed.release().await.unwrap();
    let writing = handler.write_lock("doc").try_acquire().await.unwrap();
    assert!(writing.is_some());
}

/// The shared kinds' part of the test above, with the default lease (on
/// every store): a weighted semaphore hold moves with its permits, a reader
/// keeps the writer out until the worker releases.
async fn a_weighted_permit_and_a_reader_move_by_ticket(d: Deployment) {
    let handler = d.manager().await;
    let worker = d.manager().await;
    let permits = handler
        .semaphore("moved:pool", 5)
        .weight(2)
        .acquire()
        .await
        .unwrap();
    let token = permits.fencing_token().await.unwrap();
    let ticket = permits.into_ticket().unwrap();
    let resumed = worker.resume(&ticket).await.unwrap();
    assert_eq!(resumed.fencing_token().await.unwrap(), token);
    let counts = worker
        .semaphore("moved:pool", 5)
        .permit_counts()
        .await
        .unwrap();
    assert_eq!((counts.held, counts.available), (2, 3));
    resumed.release().await.unwrap();
    let counts = worker
        .semaphore("moved:pool", 5)
        .permit_counts()
        .await
        .unwrap();
    assert_eq!(counts.held, 0);

    let reading = handler.read_lock("moved:doc").acquire().await.unwrap();
    let resumed = worker
        .resume(&reading.into_ticket().unwrap())
        .await
        .unwrap();
    assert!(handler
        .write_lock("moved:doc")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    resumed.release().await.unwrap();
    let writing = handler.write_lock("moved:doc").try_acquire().await.unwrap();
    writing
        .expect("free once the worker released")
        .release()
        .await
        .unwrap();
}

/// Nobody renews a hold between `into_ticket` and `resume`: it ends with its
/// lease, and resuming it then is a loss. `release_ticket` releases a hold
/// without a guard, in one round trip, once.
async fn a_ticket_nobody_resumes_ends_with_its_lease_and_releases_once(d: Deployment) {
    let handler = d.manager().await;
    let worker = d.manager().await;
    // 1 s, though it is meant to run out: the grant's reply must come
    // within the lease, or the acquire answers `Lost`, and on PostgreSQL it
    // commits to disk first; a 200 ms lease leaves a loaded machine too little
    // room.
    let lease = Duration::from_millis(1000);
    let guard = handler.lock("job:2").lease(lease).acquire().await.unwrap();
    let ticket = guard.into_ticket().unwrap();
    // Gone within the lease plus Redis's expiry on access; 2 s more for a
    // loaded machine.
    let expired = eventually(lease + Duration::from_secs(2), async || {
        !worker.is_locked("job:2").await.unwrap()
    })
    .await;
    assert!(expired.is_some(), "the handler still renews it");
    let err = worker.resume(&ticket).await.unwrap_err();
    assert!(
        matches!(&err, LockError::Lost { key } if key == "job:2"),
        "{err:?}"
    );
    assert!(!worker.release_ticket(&ticket).await.unwrap());

    let guard = handler.lock("job:2").acquire().await.unwrap();
    let ticket = guard.into_ticket().unwrap();
    assert!(worker.is_locked("job:2").await.unwrap());
    assert!(worker.release_ticket(&ticket).await.unwrap());
    assert!(!worker.is_locked("job:2").await.unwrap());
    assert!(!worker.release_ticket(&ticket).await.unwrap(), "once");
}

/// The resumed guard has its own lost signal: a force-unlock is found by its
/// next renewal.
async fn a_resumed_guard_learns_when_its_hold_is_taken(d: Deployment) {
    let handler = d.manager().await;
    let worker = d.manager().await;
    let lease = Duration::from_millis(600);
    let guard = handler.lock("job:3").lease(lease).acquire().await.unwrap();
    let resumed = worker.resume(&guard.into_ticket().unwrap()).await.unwrap();
    assert!(handler.force_unlock("job:3").await.unwrap());
    // The next renewal, due a third of the lease after the last, finds the
    // lock gone; at the latest the local deadline (under one lease) passes.
    tokio::time::timeout(lease * 2, resumed.lost())
        .await
        .expect("the resumed guard learns the loss within its lease");
    let err = resumed.release().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err:?}");
}

/// A guard whose hold re-entrant guards share is given back unchanged, and
/// exported once they are released.
async fn a_guard_shared_by_reentrant_holds_is_not_exported(d: Deployment) {
    let m = d.manager().await;
    let guard = m.lock("job:4").acquire().await.unwrap();
    let inner = guard
        .scope(async { m.lock("job:4").acquire().await.unwrap() })
        .await;
    let guard = guard.into_ticket().unwrap_err();
    assert!(!guard.is_lost());
    assert_eq!(m.held_count(), 1, "still held and renewed here");
    inner.release().await.unwrap();
    assert!(m.is_locked("job:4").await.unwrap());
    let ticket = guard.into_ticket().unwrap();
    assert!(m.release_ticket(&ticket).await.unwrap());
}

/// `release_permits` gives back part of a weighted hold at once (another
/// holder takes them) and keeps the rest in the guard: same fencing token,
/// still renewed, released with the guard.
async fn part_of_a_weighted_hold_is_given_back_and_the_rest_kept(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    // Short, so that three leases pass quickly; on PostgreSQL, whose
    // renewals commit (a WAL flush on a shared machine), longer.
    let lease = short_lease(&d);
    let mut slots = m
        .semaphore("gpu", 4)
        .weight(4)
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let token = slots.fencing_token().await.unwrap();
    assert!(other
        .semaphore("gpu", 4)
        .weight(3)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    // A waiter for 3. Its timer attempts 10 s apart, or when the lease it
    // last read (300 ms, renewed) would end: the give-back's message, not
    // the timing, tells that it published (without the script's PUBLISH
    // this test fails there). The message is heard beside the managers (a
    // subscription on the key's server, a LISTEN of the test's own): the
    // waiter's manager counts a wake-up only while the waiter waits, and its
    // timer may take the permits first (once in CI).
    let waiting = {
        let other = other.clone();
        let ten_seconds = Duration::from_secs(10);
        tokio::spawn(async move {
            other
                .semaphore("gpu", 4)
                .weight(3)
                .backoff(Backoff::new(ten_seconds, ten_seconds).with_jitter(0.0))
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    let channel = m
        .redis_names("gpu")
        .channel()
        .replacen("wake:", "semwake:", 1);
    // On PostgreSQL, whose listeners cannot be counted from outside: the
    // waiter's weight, which its first attempt after subscribing records.
    let mut raw = d.redis_raw_for(&m, "gpu").await;
    let listening = eventually(Duration::from_secs(10), async || match raw.as_mut() {
        Some(raw) => numsub(raw, &channel).await >= 1,
        None => d.recorded_waiting_weight(&m, "gpu") == Some(3),
    })
    .await;
    assert!(listening.is_some(), "the waiter never subscribed");
    let mut heard = d.listen_for(&m, "gpu", &channel).await;

    slots.release_permits(3).await.unwrap();
    let taken = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter gets the permits given back")
        .unwrap()
        .unwrap();
    // On both stores `#<permits freed>:<owner>`. (LISTEN channels are the
    // database's, shared by the tests' schemas: the payload also tells this
    // test's message from another's.)
    let published = heard
        .next(Duration::from_secs(5))
        .await
        .expect("the give-back publishes a wake-up");
    assert!(published.starts_with(b"#3:"), "{published:?}");
    assert_eq!(slots.fencing_token().await.unwrap(), token);
    // Three leases: the kept permit would have expired after one without
    // renewal under its new name (every lease / 3), and the guard's local
    // deadline (lease - 1% - 2 ms after its last renewal) would have passed.
    tokio::time::sleep(lease * 3).await;
    assert!(!slots.is_lost());
    let counts = m.semaphore("gpu", 4).permit_counts().await.unwrap();
    assert_eq!(counts.held, 4);

    // Nothing left to give back but the last permit: that is release().
    for bad in [0, 1, 5] {
        let err = slots.release_permits(bad).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidConfig(_)), "{bad}: {err:?}");
    }
    assert!(!slots.is_lost(), "refused calls change nothing");
    let mut lock = m.lock("gpu").acquire().await.unwrap();
    let err = lock.release_permits(1).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
    lock.release().await.unwrap();

    slots.release().await.unwrap();
    let counts = m.semaphore("gpu", 4).permit_counts().await.unwrap();
    assert_eq!(counts.held, 3, "the other holder's");
    taken.release().await.unwrap();
}

/// A resize below the permits held: `available` stays 0 and `overcommitted`
/// says by how many the holders exceed the count.
async fn a_shrink_below_the_held_count_shows_as_overcommitted(d: Deployment) {
    let m = d.manager().await;
    let held = m.semaphore("shrink", 3).weight(3).acquire().await.unwrap();
    let counts = m.semaphore("shrink", 3).permit_counts().await.unwrap();
    assert_eq!((counts.available, counts.overcommitted), (0, 0));
    // Down to 1: the resize takes effect at this attempt, which gets nothing.
    let resized = m
        .semaphore("shrink", 1)
        .resize_permits()
        .try_acquire()
        .await
        .unwrap();
    assert!(resized.is_none());
    let counts = m.semaphore("shrink", 1).permit_counts().await.unwrap();
    assert_eq!(
        (
            counts.configured,
            counts.held,
            counts.available,
            counts.overcommitted
        ),
        (1, 3, 0, 2)
    );
    assert_eq!(counts.balance(), -2);
    held.release().await.unwrap();
    let counts = m.semaphore("shrink", 1).permit_counts().await.unwrap();
    assert_eq!((counts.available, counts.overcommitted), (1, 0));
    assert_eq!(counts.balance(), 1);
}

/// `force_unlock` of a lock with a queued waiter does not leave it free: the
/// same script hands it to the head of the queue, so a newcomer finds it
/// taken and the waiter gets it long before the forced-out holder's lease.
async fn force_unlock_hands_a_queued_lock_to_the_head_of_its_queue(d: Deployment) {
    let holder = d.manager().await;
    let waiter = d.manager().await;
    let newcomer = d.manager().await;
    let held = holder
        .lock("stuck")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiting = spawn_waiter(&waiter, "stuck");
    await_waiter(&holder, "stuck").await;
    assert!(holder.force_unlock("stuck").await.unwrap());
    assert!(
        newcomer
            .lock("stuck")
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "handed over, not freed"
    );
    // The holder's lease is 30 s; the hand-off comes at once (2 s for a
    // loaded machine).
    let got = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("the head of the queue is handed the lock")
        .unwrap()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), held.lost())
        .await
        .expect("the forced-out holder learns it");
    got.release().await.unwrap();
    assert!(!holder.is_locked("stuck").await.unwrap());
}

/// `read_lock(k).is_locked()` answers for the whole read-write lock; one side
/// is read, and freed, through `inspect_all` and `force_unlock_hold`.
async fn a_read_locks_is_locked_answers_for_both_sides(d: Deployment) {
    let m = d.manager().await;
    let writing = m.write_lock("rw").acquire().await.unwrap();
    assert!(
        m.read_lock("rw").is_locked().await.unwrap(),
        "a writer only"
    );
    let state = m.inspect_all("rw").await.unwrap();
    assert_eq!(state.holds_of(HoldKind::Read).count(), 0);
    let writer = state.holds_of(HoldKind::Write).next().unwrap().clone();
    assert!(m.force_unlock_hold(&writer).await.unwrap());
    assert!(!m.read_lock("rw").is_locked().await.unwrap());
    let reading = m.read_lock("rw").acquire().await.unwrap();
    let state = m.inspect_all("rw").await.unwrap();
    assert_eq!(
        (
            state.holds_of(HoldKind::Read).count(),
            state.holds_of(HoldKind::Write).count()
        ),
        (1, 0)
    );
    reading.release().await.unwrap();
    drop(writing);
}

/// The call chain is the guard's scope: right after `acquire()`, in the same
/// task, the chain does not hold the lock; inside `scope` it does, and a
/// nested acquisition counts one more hold; a plain spawned task is another
/// chain.
async fn the_current_chain_is_the_guards_scope_not_the_task(d: Deployment) {
    let m = d.manager().await;
    let guard = m.lock("chain").acquire().await.unwrap();
    assert!(!m.lock("chain").is_held_by_current_chain());
    assert_eq!(m.lock("chain").hold_count(), 0);
    guard
        .scope(async {
            assert!(m.is_held_by_current_chain("chain"));
            assert_eq!(m.lock("chain").hold_count(), 1);
            let again = m.lock("chain").acquire().await.unwrap();
            assert_eq!(m.lock("chain").hold_count(), 2);
            again.release().await.unwrap();
            let other = m.clone();
            let spawned = tokio::spawn(async move { other.is_held_by_current_chain("chain") });
            assert!(!spawned.await.unwrap());
        })
        .await;
    assert_eq!(m.lock("chain").hold_count(), 0);
    guard.release().await.unwrap();
}

/// Giving back any number of permits publishes one message (issue: the
/// give-back script published once per permit given back, a loop as long as
/// the caller's number inside Redis; `u32::MAX - 1` of them would have stalled
/// the server for hours).
async fn giving_back_any_number_of_permits_is_one_message(d: Deployment) {
    let m = d.manager().await;
    let mut all = m
        .semaphore("vast", u32::MAX)
        .weight(u32::MAX)
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    all.release_permits(u32::MAX - 1)
        .await
        .expect("given back within the command timeout");
    let counts = m.semaphore("vast", u32::MAX).permit_counts().await.unwrap();
    assert_eq!(counts.held, 1);
    all.release().await.unwrap();
}

/// `split_permits` turns a hold of 3 permits into 3 holds of 1, each with an
/// id of its own (as `inspect_all` shows), the hold's fencing token, its own
/// renewal and release: one given back lets another holder in while the
/// other two stay, one handed over by ticket is released by its new guard.
async fn a_weighted_hold_split_into_single_permits_is_acted_on_by_permit(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    let key = "split";
    // Short, so that three leases pass quickly; on PostgreSQL, whose
    // renewals commit (a WAL flush on a shared machine), longer.
    let lease = short_lease(&d);
    let mut first = m
        .semaphore(key, 4)
        .weight(3)
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let token = first.fencing_token().await.unwrap();
    let mut rest = first.split_permits().await.unwrap();
    assert_eq!(rest.len(), 2);
    let state = m.inspect_all(key).await.unwrap();
    let mut ids: Vec<&str> = state.holds.iter().map(|h| h.hold_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{state:#?}");
    assert!(
        state.holds.iter().all(|h| h.fencing_token == token),
        "{state:#?}"
    );
    assert_eq!(m.semaphore(key, 4).permit_counts().await.unwrap().held, 3);
    for g in std::iter::once(&first).chain(&rest) {
        assert_eq!(g.fencing_token().await.unwrap(), token);
    }

    // Each is renewed on its own: three leases would have ended the permits
    // of a hold nobody renewed (every lease / 3), and each guard's local
    // deadline (lease - 1% - 2 ms after its last renewal) would have passed.
    tokio::time::sleep(lease * 3).await;
    assert!(!first.is_lost() && rest.iter().all(|g| !g.is_lost()));
    assert_eq!(m.semaphore(key, 4).permit_counts().await.unwrap().held, 3);

    // One permit's lease, by its guard: lengthened alone.
    rest[0].extend(Duration::from_secs(30)).await.unwrap();
    let state = m.inspect_all(key).await.unwrap();
    let long = |h: &&distlock::LockInfo| h.ttl.is_some_and(|t| t > lease * 2);
    assert_eq!(state.holds.iter().filter(long).count(), 1, "{state:#?}");

    // One permit, by its guard: given back, and another holder gets it.
    assert!(other
        .semaphore(key, 4)
        .weight(2)
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    rest.pop().unwrap().release().await.unwrap();
    let two = other
        .semaphore(key, 4)
        .weight(2)
        .try_acquire()
        .await
        .unwrap()
        .expect("the permit given back and the free one");
    assert_eq!(m.semaphore(key, 4).permit_counts().await.unwrap().held, 4);

    // Another, handed to the other manager by ticket and released there.
    let ticket = rest.pop().unwrap().into_ticket().unwrap();
    let resumed = other.resume(&ticket).await.unwrap();
    assert_eq!(resumed.fencing_token().await.unwrap(), token);
    resumed.release().await.unwrap();
    assert_eq!(m.semaphore(key, 4).permit_counts().await.unwrap().held, 3);

    // A single permit, or more than the limit, is not split.
    let err = first.split_permits().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
    assert!(!first.is_lost(), "a refused split changes nothing");
    first.release().await.unwrap();
    let mut many = m
        .semaphore("split:many", MAX_SPLIT_PERMITS + 1)
        .weight(MAX_SPLIT_PERMITS + 1)
        .acquire()
        .await
        .unwrap();
    let err = many.split_permits().await.unwrap_err();
    assert!(matches!(err, LockError::InvalidConfig(_)), "{err:?}");
    let most = MAX_SPLIT_PERMITS.to_string();
    assert!(err.to_string().contains(&most), "{err}");
    many.release().await.unwrap();
    two.release().await.unwrap();
    assert_eq!(m.semaphore(key, 4).permit_counts().await.unwrap().held, 0);
}

/// A lease short enough that a test can wait out three of them: 300 ms, and
/// 1.5 s on PostgreSQL, where a renewal is a commit that a loaded machine
/// can delay past a third of 300 ms.
fn short_lease(d: &Deployment) -> Duration {
    if d.is_postgres() {
        Duration::from_millis(1500)
    } else {
        Duration::from_millis(300)
    }
}

/// A hold turned into a ticket while its renewal is in flight, by a guard
/// with a `min_hold`: the renewal's reply used to be taken for one that ran
/// after the guard's own release, and a release "keeping min_hold" was sent
/// under the owner token that the ticket (and the worker who resumed it) now
/// held: the lock was freed under the worker. The handler reaches Redis
/// through a proxy that holds each chunk 500 ms, so that the renewal (due a
/// third of the 3 s lease after the acquisition was sent, that is as its
/// 1 s reply arrives) is in flight for 1 s after the acquisition returns; the
/// ticket is made in the middle of that second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_made_while_a_renewal_is_in_flight_keeps_its_hold() {
    use distlock::testing::{FaultMode, FaultProxy, RedisServer};
    let server = RedisServer::spawn().unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let slow = distlock::LockManager::builder(&proxy.url())
        .command_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let worker = distlock::LockManager::connect(&server.url()).await.unwrap();
    proxy.set_mode(FaultMode::Delay(Duration::from_millis(500)));
    let guard = slow
        .lock("ticket:in-flight")
        .lease(Duration::from_secs(3))
        .min_hold(Duration::from_millis(1))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resumed = worker.resume(&guard.into_ticket().unwrap()).await.unwrap();
    // The in-flight renewal's reply comes back at about 1 s after the
    // acquisition returned; a release it would send reaches Redis 0.5 s
    // later. 2.5 s covers both with 1 s to spare, within the 3 s lease that
    // the worker renews.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!resumed.is_lost(), "the worker's hold was freed under it");
    assert!(worker
        .lock("ticket:in-flight")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    resumed.release().await.unwrap();
}

/// The hold `release_permits` keeps has a token of its own (its acquisition
/// id kept), not the old token with the kept weight. A call that fails after
/// its script may have run gives the name it asked for back in the
/// background, retried until a lease has passed; under the old naming, a
/// retry of the same call asked for that same name, and the late background
/// release freed the retry's hold while its guard still trusted it, and
/// others took the permits. Each call now asks for a name nobody else does,
/// as `split_permits` always has.
async fn each_release_permits_keeps_the_rest_under_a_new_token(d: Deployment) {
    let m = d.manager().await;
    let key = "renamed-weighted";
    let hold = async || {
        let state = m.inspect_all(key).await.unwrap();
        assert_eq!(state.holds.len(), 1, "{state:?}");
        let hold = state.holds.into_iter().next().unwrap();
        (hold.hold_id, hold.acquisition_id)
    };
    let mut guard = m.semaphore(key, 8).weight(6).acquire().await.unwrap();
    let (first_id, acquisition) = hold().await;
    let token = |id: &str| id.split(':').next().unwrap().to_owned();
    let mut seen = vec![token(&first_id)];
    for (give_back, kept) in [(2, 4), (3, 1)] {
        guard.release_permits(give_back).await.unwrap();
        let (id, same_acquisition) = hold().await;
        assert_eq!(same_acquisition, acquisition);
        assert!(
            !seen.contains(&token(&id)),
            "{id} reuses a token of {seen:?}"
        );
        seen.push(token(&id));
        assert_eq!(
            m.semaphore(key, 8).permit_counts().await.unwrap().held,
            kept
        );
    }
    guard.release().await.unwrap();
}

on_stores!(each_release_permits_keeps_the_rest_under_a_new_token);

/// A re-entrant acquisition made while `release_permits` renames the hold (a
/// subtask of the hold's call chain, during the rename's round trip) does
/// not join the hold being renamed: it takes a permit of its own. Before, it
/// joined the old hold, which the rename then handed over under a new name:
/// its guard was renewed by nothing, its lost signal could never fire, and
/// the permit it trusted was not held in Redis. The manager reaches Redis
/// through a proxy that holds each chunk 300 ms, so that the rename is in
/// flight when the subtask re-enters, 100 ms after it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_while_release_permits_renames_the_hold_takes_a_permit_of_its_own() {
    use distlock::testing::{FaultMode, FaultProxy, RedisServer};
    let server = RedisServer::spawn().unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let m = distlock::LockManager::builder(&proxy.url())
        .command_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let observer = distlock::LockManager::connect(&server.url()).await.unwrap();
    let key = "reentry-while-renaming";
    let mut guard = m.semaphore(key, 8).weight(4).acquire().await.unwrap();
    let (go, went) = tokio::sync::oneshot::channel::<()>();
    let m2 = m.clone();
    // The scope's future yields the subtask's handle (to await outside it).
    #[allow(clippy::async_yields_async)]
    let inner = guard
        .scope(async move {
            distlock::spawn_with_locks(async move {
                went.await.unwrap();
                m2.semaphore(key, 8).acquire().await
            })
        })
        .await;
    proxy.set_mode(FaultMode::Delay(Duration::from_millis(300)));
    let (renamed, inner) = tokio::join!(guard.release_permits(3), async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        go.send(()).unwrap();
        inner.await.unwrap()
    });
    renamed.unwrap();
    let inner = inner.unwrap();
    proxy.set_mode(FaultMode::Pass);
    assert!(
        inner.remaining_lease() > Duration::ZERO,
        "the subtask's guard is on no lease"
    );
    let holds = observer.inspect_all(key).await.unwrap().holds;
    assert_eq!(
        holds.len(),
        2,
        "the kept permit and the subtask's: {holds:?}"
    );
    inner.release().await.unwrap();
    guard.release().await.unwrap();
}

/// A guard whose manager shut down (which released its hold) is no ticket's:
/// `into_ticket` gives it back, lost, rather than a ticket of a hold that
/// is gone.
#[tokio::test]
async fn no_ticket_is_made_of_a_hold_a_shutdown_released() {
    let server = distlock::testing::RedisServer::spawn().unwrap();
    let m = distlock::LockManager::connect(&server.url()).await.unwrap();
    let guard = m.lock("ticket:after-shutdown").acquire().await.unwrap();
    m.shutdown().await.unwrap();
    let guard = guard
        .into_ticket()
        .expect_err("a ticket of a released hold");
    assert!(guard.is_lost());
}

/// A `resume` whose manager shut down while its renewal was out returns
/// `ShutDown` and leaves the ticket's hold as it was, for the next `resume`
/// (a job queue delivers the ticket again): it gave the hold back by the
/// ticket's owner token, freeing the lock while the job was still to run.
/// A grant that comes after its lease gives nothing back either, for the
/// same reason.
///
/// Bounds: the worker's replies are held 1 s, and its shutdown starts
/// 100 ms into the resume's renewal (the request itself is on the server at
/// once), so the shutdown comes first unless the machine stalls for 0.9 s.
/// A give-back would be a background release, spawned as the reply came:
/// once the worker has none running, the lock must still be there.
#[tokio::test]
async fn a_resume_cut_short_by_a_shutdown_leaves_the_tickets_hold() {
    use distlock::testing::{FaultMode, FaultProxy};
    let redis = server();
    let handler = manager(&redis).await;
    let proxy = FaultProxy::start(redis.addr()).await.unwrap();
    let worker = manager_with_timeout(&proxy.url(), Duration::from_secs(2)).await;
    open_every_connection(&worker).await;
    let ticket = handler
        .lock("ticket:shutdown")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap()
        .into_ticket()
        .unwrap();
    proxy.set_mode(FaultMode::DelayReplies(Duration::from_secs(1)));
    let shutdown = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        worker.shutdown().await
    };
    let (resumed, _) = tokio::join!(worker.resume(&ticket), shutdown);
    assert!(
        matches!(resumed, Err(LockError::ShutDown { ref key }) if key == "ticket:shutdown"),
        "{resumed:?}"
    );
    let settled = eventually(Duration::from_secs(5), async || {
        worker.background_releases_running() == 0
    })
    .await;
    assert!(settled.is_some(), "a background release never ended");
    let name = handler.redis_names("ticket:shutdown").lock;
    assert!(
        exists(&mut raw(&redis).await, &name).await,
        "the ticket's hold was given back"
    );
    // Another worker resumes it.
    let other = manager(&redis).await;
    other
        .resume(&ticket)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A hold handed over by a queue has only the hand-off's TTL in the store
/// (the 3 s queue lease at most) until its first renewal, about a second
/// after the grant. A ticket made before that lasted those 3 s, not what is
/// left of its 30 s lease, and a job delivered later found its hold gone.
/// `into_ticket` now sends that renewal (in the background: it makes no
/// round trip itself).
///
/// Bounds: the renewal is one round trip on loopback; 2 s leave room for a
/// loaded machine, and are still under the hand-off's 3 s. (The holder's
/// own first renewal is due at least 750 ms after the waiter queued, just
/// before the release: a machine that stalls that long lets it come first,
/// and the test then passes without exercising `into_ticket`'s renewal.)
#[tokio::test]
async fn a_ticket_of_a_hold_just_handed_over_lasts_its_lease() {
    let redis = server();
    let holder = manager(&redis).await;
    let worker = manager(&redis).await;
    let g = holder.lock("ticket:handed").acquire().await.unwrap();
    let waiting = {
        let worker = worker.clone();
        tokio::spawn(async move {
            worker
                .lock("ticket:handed")
                .lease(Duration::from_secs(30))
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap()
        })
    };
    await_parked(&worker, 1).await;
    g.release().await.unwrap();
    let handed = waiting.await.unwrap();
    let ticket = handed.into_ticket().unwrap();
    let name = worker.redis_names("ticket:handed").lock;
    let mut conn = raw(&redis).await;
    let renewed = eventually(Duration::from_secs(2), async || {
        pttl(&mut conn, &name).await > 3_000
    })
    .await;
    assert!(
        renewed.is_some(),
        "the ticket's hold kept the hand-off's TTL: {} ms",
        pttl(&mut conn, &name).await
    );
    worker
        .resume(&ticket)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
