//! Read-write locks: readers share, a writer excludes everyone, waiting writers
//! keep new readers out (no starvation), each reader's hold has its own lease,
//! re-entry rules, fencing; every test on one server, on a Redis Cluster and
//! on PostgreSQL (the names a hold leaves are checked on Redis only).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use distlock::LockError;

crate::on_stores!(
    readers_share_and_a_writer_excludes_everyone,
    a_writer_is_not_starved_by_a_stream_of_readers,
    a_crashed_readers_share_expires_within_its_lease,
    a_writer_that_gives_up_lets_readers_in_again,
    the_last_reader_out_wakes_a_waiting_writer,
    reentry_shares_reads_downgrades_and_refuses_upgrades,
    writers_fencing_tokens_strictly_increase,
    a_reader_learns_that_its_hold_is_gone,
    readers_waiting_for_a_crashed_writer_all_get_in_as_its_lease_ends,
    a_writer_behind_one_that_gave_up_gets_in_as_the_lease_ends,
);

async fn readers_share_and_a_writer_excludes_everyone(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let mut raw = d.redis_raw_for(&a, "doc").await;

    let r1 = a.read_lock("doc").acquire().await.unwrap();
    let r2 = b
        .read_lock("doc")
        .try_acquire()
        .await
        .unwrap()
        .expect("readers share");
    assert!(b.write_lock("doc").try_acquire().await.unwrap().is_none());
    // The readers' set, and their details for operators.
    if let Some(raw) = raw.as_mut() {
        assert_eq!(kinds_of(raw, "doc").await, ["rwfence", "rwr", "rwrd"]);
    }
    // A read-write lock is a lock of its own: the exclusive lock is free.
    let plain = b
        .lock("doc")
        .try_acquire()
        .await
        .unwrap()
        .expect("other kind");
    plain.release().await.unwrap();

    r1.release().await.unwrap();
    assert!(b.write_lock("doc").try_acquire().await.unwrap().is_none());
    r2.release().await.unwrap();
    // (The exclusive hold took no fencing token, so it left no counter.)
    if let Some(raw) = raw.as_mut() {
        assert_eq!(
            kinds_of(raw, "doc").await,
            ["rwfence"],
            "the readers' set goes with the last reader"
        );
    }

    let w = a
        .write_lock("doc")
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(b.read_lock("doc").try_acquire().await.unwrap().is_none());
    assert!(b.write_lock("doc").try_acquire().await.unwrap().is_none());
    w.release().await.unwrap();
    if let Some(raw) = raw.as_mut() {
        assert_eq!(kinds_of(raw, "doc").await, ["rwfence"]);
    }
    assert!(a.inspect_all("doc").await.unwrap().holds.is_empty());
    let r = b
        .read_lock("doc")
        .try_acquire()
        .await
        .unwrap()
        .expect("free again");
    r.release().await.unwrap();
}

/// Eight readers take turns so that some reader always holds the lock; a
/// writer still gets it, because while it waits no new reader enters.
async fn a_writer_is_not_starved_by_a_stream_of_readers(d: Deployment) {
    let readers_m = d.manager().await;
    let writer_m = d.manager().await;
    let stop = Arc::new(AtomicBool::new(false));
    let reading = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let m = readers_m.clone();
        let stop = stop.clone();
        let reading = reading.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(i * 13)).await;
            let mut cycles = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let g = m
                    .read_lock("stream")
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                reading.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                reading.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
                cycles += 1;
            }
            cycles
        }));
    }
    // Let the readers overlap, so the lock is never free of readers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..3 {
        let start = Instant::now();
        let w = writer_m
            .write_lock("stream")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .expect("the writer gets its turn");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "writer waited {:?}",
            start.elapsed()
        );
        assert_eq!(
            reading.load(Ordering::SeqCst),
            0,
            "no reader while the writer holds it"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(reading.load(Ordering::SeqCst), 0);
        w.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        assert!(t.await.unwrap() > 0, "every reader made progress");
    }
}

/// A reader that crashed (stopped renewing, never released) frees its share
/// within its lease.
async fn a_crashed_readers_share_expires_within_its_lease(d: Deployment) {
    let crashed = d.manager().await;
    let writer = d.manager().await;
    // 1 s: the grant's reply must come within the lease, or the acquire
    // answers `Lost` (`guard::grant`), and on PostgreSQL it commits to disk
    // first; a 400 ms lease leaves a loaded machine too little room.
    const LEASE: Duration = Duration::from_millis(1000);
    let g = crashed
        .read_lock("report")
        .lease(LEASE)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    // Neither released nor renewed: as if the process had died.
    std::mem::forget(g);
    let start = Instant::now();
    let w = writer
        .write_lock("report")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    // The share's lease ends at most LEASE after `start`; the writer's
    // backoff is capped by the lease it was told remains, so it tries again
    // as it ends. 1.1 s covers that attempt's round trips on a loaded
    // machine (the margin of the former 400 ms lease and its 1.5 s bound).
    let waited = start.elapsed();
    assert!(
        waited < LEASE + Duration::from_millis(1100),
        "waited {waited:?}"
    );
    w.release().await.unwrap();
}

/// Takes the write lock `key` for `lease` and neither releases nor renews
/// it: as if the process had died holding it.
async fn crashed_writer(m: &distlock::LockManager, key: &str, lease: Duration) {
    let w = m
        .write_lock(key)
        .lease(lease)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(w);
}

/// Readers of one manager waiting for a writer that died (its lease runs
/// out unreleased: nobody publishes) all get in as its lease ends (issue:
/// only the first waiter in line retried then; the others slept their
/// backoff, up to 1 s by default).
async fn readers_waiting_for_a_crashed_writer_all_get_in_as_its_lease_ends(d: Deployment) {
    let crashed = d.manager().await;
    let b = d.manager().await;
    const LEASE: Duration = Duration::from_secs(1);
    crashed_writer(&crashed, "orphaned-writer", LEASE).await;
    let taken = Instant::now();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move {
                let r = b
                    .read_lock("orphaned-writer")
                    // A timer that cannot bring a reader in within 10 s.
                    .backoff(slow_backoff())
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                (r, Instant::now())
            })
        })
        .collect();
    await_parked(&b, 3).await;
    let mut holds = Vec::new();
    for reader in readers {
        let (r, acquired) = reader.await.unwrap();
        // The writer's lease ends LEASE after `taken` at the latest; the
        // first reader in line retries then (its timer is capped by the
        // lease), and each reader that gets in has the next one look. A
        // reader's own timer would take 10 s; 5 s leaves a loaded machine room.
        assert!(
            acquired.duration_since(taken) < Duration::from_secs(5),
            "a reader got in {:?} after the writer (lease {LEASE:?})",
            acquired.duration_since(taken)
        );
        holds.push(r);
    }
    for r in holds {
        r.release().await.unwrap();
    }
}

/// A writer whose manager's first waiter in line gave up takes over its watch
/// of the holder's lease, and gets in as that lease runs out unreleased
/// (issue: it slept on the backoff it had drawn while second in line).
async fn a_writer_behind_one_that_gave_up_gets_in_as_the_lease_ends(d: Deployment) {
    let crashed = d.manager().await;
    let b = d.manager().await;
    let key = "orphaned-again";
    const LEASE: Duration = Duration::from_secs(3);
    crashed_writer(&crashed, key, LEASE).await;
    let taken = Instant::now();
    let impatient = {
        let b = b.clone();
        tokio::spawn(async move {
            // It gives up well within the crashed hold's lease, and long
            // after the patient waiter below has queued behind it (which
            // takes no round trip: the manager already waits for the lock).
            b.write_lock(key)
                .wait(Duration::from_secs(1))
                .acquire()
                .await
        })
    };
    await_parked(&b, 1).await;
    let patient = {
        let b = b.clone();
        tokio::spawn(async move {
            let w = b
                .write_lock(key)
                // A timer that cannot bring it in within 10 s.
                .backoff(slow_backoff())
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            (w, Instant::now())
        })
    };
    await_parked(&b, 2).await;
    assert!(
        !impatient.is_finished(),
        "the first waiter left before the second queued behind it"
    );
    let gave_up = impatient.await.unwrap().unwrap_err();
    assert!(matches!(gave_up, LockError::Timeout { .. }), "{gave_up}");
    let (w, acquired) = patient.await.unwrap();
    // The crashed hold ends LEASE (3 s) after `taken` at the latest; the
    // waiter left first in line retries then (its timer is capped by the
    // lease, which its attempt on taking over read). Its own backoff would
    // take 10 s; 7 s leaves a loaded machine room.
    assert!(
        acquired.duration_since(taken) < Duration::from_secs(7),
        "the writer got in {:?} after the crashed hold began (lease {LEASE:?})",
        acquired.duration_since(taken)
    );
    w.release().await.unwrap();
}

/// A writer that gives up waiting takes its intent back, so readers are not
/// kept out for the rest of its lease.
async fn a_writer_that_gives_up_lets_readers_in_again(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let r = a.read_lock("cfg").acquire().await.unwrap();
    let err = b
        .write_lock("cfg")
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let withdrawn = eventually(Duration::from_secs(2), async || {
        !a.inspect_all("cfg").await.unwrap().writer_waiting
    })
    .await;
    assert!(withdrawn.is_some(), "the intent is withdrawn");
    let r2 = b
        .read_lock("cfg")
        .try_acquire()
        .await
        .unwrap()
        .expect("readers enter again");
    r2.release().await.unwrap();
    r.release().await.unwrap();
}

/// A waiting writer is woken by the last reader's release, not by its timer.
async fn the_last_reader_out_wakes_a_waiting_writer(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let r = a.read_lock("wake").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let w = b
            .write_lock("wake")
            .backoff(slow_backoff())
            .wait(Duration::from_secs(20))
            .acquire()
            .await
            .unwrap();
        let at = Instant::now();
        w.release().await.unwrap();
        (at, b.wake_ups_delivered())
    });
    // Long enough for the writer's manager, a fresh one, to listen on the
    // lock's channel (its first subscription). The writer's fixed 10 s
    // backoff (and the reader's 30 s lease) keeps its timer out meanwhile
    // and until about 7.5 s after the release: with the default backoff
    // (capped at 1 s) an
    // attempt could take the lock before the release's message arrived, and
    // on PostgreSQL the message is then dropped with the channel.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let released = Instant::now();
    r.release().await.unwrap();
    let (acquired, woken) = waiter.await.unwrap();
    assert!(
        acquired.duration_since(released) < Duration::from_secs(5),
        "took {:?}",
        acquired.duration_since(released)
    );
    assert!(woken >= 1, "woken by a wake-up message");
}

async fn reentry_shares_reads_downgrades_and_refuses_upgrades(d: Deployment) {
    let m = d.manager().await;

    let r = m.read_lock("tree").acquire().await.unwrap();
    r.scope(async {
        let again = m.read_lock("tree").acquire().await.unwrap();
        assert_eq!(
            again.fencing_token().await.unwrap(),
            r.fencing_token().await.unwrap()
        );
        again.release().await.unwrap();
        let err = m.write_lock("tree").acquire().await.unwrap_err();
        assert!(
            matches!(err, LockError::UpgradeRefused { ref key } if key == "tree"),
            "{err}"
        );
        assert!(!err.is_transient());
    })
    .await;
    r.release().await.unwrap();

    let w = m.write_lock("tree").acquire().await.unwrap();
    w.scope(async {
        let read = m.read_lock("tree").acquire().await.unwrap();
        assert_eq!(
            read.fencing_token().await.unwrap(),
            w.fencing_token().await.unwrap(),
            "a read inside a write re-enters it"
        );
        let write = m.write_lock("tree").acquire().await.unwrap();
        assert_eq!(
            write.fencing_token().await.unwrap(),
            w.fencing_token().await.unwrap()
        );
        write.release().await.unwrap();
        read.release().await.unwrap();
    })
    .await;
    w.release().await.unwrap();
}

async fn writers_fencing_tokens_strictly_increase(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let mut last = 0;
    for i in 0..6 {
        let m = if i % 2 == 0 { &a } else { &b };
        let r = m.read_lock("ledger").acquire().await.unwrap();
        assert!(r.fencing_token().await.unwrap() > last);
        last = r.fencing_token().await.unwrap();
        r.release().await.unwrap();
        let w = m.write_lock("ledger").acquire().await.unwrap();
        assert!(
            w.fencing_token().await.unwrap() > last,
            "{} after {last}",
            w.fencing_token().await.unwrap()
        );
        last = w.fencing_token().await.unwrap();
        w.release().await.unwrap();
    }
}

/// A reader whose hold was removed in the store (on Redis its set deleted,
/// on PostgreSQL its row freed by an operator) learns it at its next renewal.
async fn a_reader_learns_that_its_hold_is_gone(d: Deployment) {
    let m = d.manager().await;
    // A lease that outlives a late renewal on a loaded machine (each renewal
    // on PostgreSQL is a commit): the hold must still be there to be removed.
    // Its renewals come every third of it (0.67 s), so `lost()` completes
    // within 0.67 s plus a renewal's round trip after the removal; 5 s below
    // allows a loaded machine several times that.
    let r = m
        .read_lock("gone")
        .lease(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    if let Some(mut raw) = d.redis_raw_for(&m, "gone").await {
        let set = name_of(&mut raw, "rwr", "gone")
            .await
            .expect("the readers' set");
        del(&mut raw, &set).await;
    } else {
        let state = m.inspect_all("gone").await.unwrap();
        let [hold] = &state.holds[..] else {
            panic!("one reader: {:?}", state.holds)
        };
        assert!(m.force_unlock_hold(hold).await.unwrap());
    }
    tokio::time::timeout(Duration::from_secs(5), r.lost())
        .await
        .expect("lost() completes");
    assert!(matches!(r.release().await, Err(LockError::Lost { .. })));
}

/// Each acquire and release of a read or write hold, and of a permit, is one
/// script call: 100 cycles of each are 200 EVALSHA per kind.
#[tokio::test]
async fn a_cycle_of_each_shared_kind_is_two_script_calls() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    // Once each first: the first call of a script loads it (NOSCRIPT, then
    // SCRIPT LOAD and the call again).
    m.read_lock("rt")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    m.write_lock("rt")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    m.semaphore("rt", 3)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    reset_stats(&mut raw).await;
    for _ in 0..100 {
        m.read_lock("rt")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(calls_of(&mut raw, "evalsha").await, 200);
    for _ in 0..100 {
        m.write_lock("rt")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(calls_of(&mut raw, "evalsha").await, 400);
    for _ in 0..100 {
        m.semaphore("rt", 3)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let calls = command_calls(&mut raw).await;
    assert_eq!(calls.get("evalsha"), Some(&600), "{calls:#?}");
    // Nobody waited: no wake-up was published.
    assert_eq!(calls.get("publish"), None, "{calls:#?}");
}
