//! Every primitive answers and can be steered: `inspect_all` and `list` see
//! read-write locks (the writer, each reader, a waiting writer), semaphores
//! (each holder with its permits and lease), the default lock's queue (its
//! waiters in order) and multi-key holds (one hold id across their keys);
//! `LockRequest::is_locked` answers per kind; `force_unlock_hold` frees one
//! holder and `force_unlock_all` a whole key, telling the waiters. On one
//! server, a cluster and PostgreSQL; the default lock on a Redlock.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use distlock::testing::RedisServer;
use distlock::{HoldKind, LockError, LockManager, LockManagerBuilder};

const LEASE: Duration = Duration::from_secs(6);

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

async fn named(d: &Deployment, holder: &str) -> LockManager {
    builder(d)
        .holder(holder)
        .default_lease(LEASE)
        .build()
        .await
        .expect("build")
}

on_stores!(
    every_kind_is_seen_with_its_holders,
    one_holder_or_the_whole_key_is_freed,
);

on_stores!(multi_key_holds_are_listed_beside_every_kind);

async fn every_kind_is_seen_with_its_holders(d: Deployment) {
    let a = named(&d, "host-a").await;
    let b = named(&d, "host-b").await;
    let c = named(&d, "host-c").await;
    let operator = d.manager().await;

    // Two readers, each with its holder, token and lease.
    let before = SystemTime::now();
    let ra = a.read_lock("ek:doc").acquire().await.unwrap();
    let rb = b.read_lock("ek:doc").acquire().await.unwrap();
    let state = operator.inspect_all("ek:doc").await.unwrap();
    assert_eq!(state.key, "ek:doc");
    let mut readers: Vec<_> = state.holds_of(HoldKind::Read).collect();
    readers.sort_by_key(|r| r.holder.clone());
    assert_eq!(readers.len(), 2, "{state:?}");
    assert_eq!(state.holds.len(), 2, "only the readers: {state:?}");
    for (reader, guard, holder) in [(readers[0], &ra, "host-a"), (readers[1], &rb, "host-b")] {
        assert_eq!(reader.holder, holder);
        assert_eq!(reader.fencing_token, guard.fencing_token().await.unwrap());
        let ttl = reader.ttl.expect("a lease");
        assert!(ttl > LEASE / 2 && ttl <= LEASE, "{ttl:?}");
        assert!(reader.held_since + Duration::from_millis(1) >= before);
    }
    assert_ne!(readers[0].hold_id, readers[1].hold_id);
    assert!(!state.writer_waiting);
    assert!(a.read_lock("ek:doc").is_locked().await.unwrap());
    assert!(
        a.write_lock("ek:doc").is_locked().await.unwrap(),
        "same lock"
    );
    assert!(!a.lock("ek:doc").is_locked().await.unwrap(), "another kind");
    assert!(!a.semaphore("ek:doc", 2).is_locked().await.unwrap());

    // A writer that waits is seen; once the readers leave it holds.
    let writer = tokio::spawn({
        let c = c.clone();
        async move {
            c.write_lock("ek:doc")
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap()
        }
    });
    let waiting = eventually(Duration::from_secs(10), async || {
        operator.inspect_all("ek:doc").await.unwrap().writer_waiting
    })
    .await;
    assert!(waiting.is_some(), "the waiting writer is seen");
    ra.release().await.unwrap();
    rb.release().await.unwrap();
    let w = writer.await.unwrap();
    // A writer takes its token on demand (readers and permits at once).
    let token = w.fencing_token().await.unwrap();
    let state = operator.inspect_all("ek:doc").await.unwrap();
    assert_eq!(state.holds.len(), 1, "{state:?}");
    assert_eq!(state.holds[0].kind, HoldKind::Write);
    assert_eq!(state.holds[0].holder, "host-c");
    assert_eq!(state.holds[0].fencing_token, token);
    assert!(!state.writer_waiting);
    w.release().await.unwrap();
    assert!(!a.read_lock("ek:doc").is_locked().await.unwrap());

    // A semaphore's holders with their permits, and its count.
    let one = a.semaphore("ek:pool", 3).acquire().await.unwrap();
    let two = b.semaphore("ek:pool", 3).weight(2).acquire().await.unwrap();
    let state = operator.inspect_all("ek:pool").await.unwrap();
    let mut kinds: Vec<_> = state
        .holds
        .iter()
        .map(|h| (h.kind, h.holder.as_str()))
        .collect();
    kinds.sort_by_key(|(_, holder)| *holder);
    assert_eq!(
        kinds,
        [
            (HoldKind::Permits(1), "host-a"),
            (HoldKind::Permits(2), "host-b")
        ]
    );
    assert_eq!(state.permits, Some(3));
    assert_eq!(state.holds_of(HoldKind::Permits(1)).count(), 2);
    assert!(c.semaphore("ek:pool", 3).is_locked().await.unwrap());
    one.release().await.unwrap();
    two.release().await.unwrap();
    let state = operator.inspect_all("ek:pool").await.unwrap();
    assert!(!state.is_held() && state.permits.is_none(), "{state:?}");

    // The default lock's queue, in arrival order.
    let held = a.lock("ek:job").acquire().await.unwrap();
    let mut waiters = Vec::new();
    for (n, m) in [&b, &c].into_iter().enumerate() {
        let m = m.clone();
        waiters.push(tokio::spawn(async move {
            m.lock("ek:job")
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        }));
        let queued = eventually(Duration::from_secs(10), async || {
            operator.inspect_all("ek:job").await.unwrap().waiters.len() == n + 1
        })
        .await;
        assert!(queued.is_some(), "waiter {n} queued");
    }
    let state = operator.inspect_all("ek:job").await.unwrap();
    assert_eq!(state.holds.len(), 1);
    assert_eq!(state.holds[0].kind, HoldKind::Lock);
    assert!(state.holds[0].waited_for);
    let queue: Vec<_> = state.waiters.iter().map(|w| w.holder.as_str()).collect();
    assert_eq!(queue, ["host-b", "host-c"]);
    for waiter in &state.waiters {
        // A waiter refreshes its entry every 0.4-0.8 s; its queue lease is a
        // few seconds (never above the queue lease of 3 s).
        assert!(
            waiter.queue_lease_left > Duration::ZERO
                && waiter.queue_lease_left <= Duration::from_secs(3),
            "{waiter:?}"
        );
    }
    held.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert!(operator
        .inspect_all("ek:job")
        .await
        .unwrap()
        .waiters
        .is_empty());

    // `list` sees every kind.
    let lock = a.lock("ek:l").acquire().await.unwrap();
    let reader = b.read_lock("ek:r").acquire().await.unwrap();
    let writer = a.write_lock("ek:w").acquire().await.unwrap();
    let permit = c.semaphore("ek:s", 2).acquire().await.unwrap();
    let listed = operator.list("ek:*").await.unwrap();
    let seen: Vec<_> = listed
        .iter()
        .map(|h| (h.key.as_str(), h.kind, h.holder.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("ek:l", HoldKind::Lock, "host-a"),
            ("ek:r", HoldKind::Read, "host-b"),
            ("ek:s", HoldKind::Permits(1), "host-c"),
            ("ek:w", HoldKind::Write, "host-a"),
        ]
    );
    for guard in [lock, reader, writer, permit] {
        guard.release().await.unwrap();
    }
    assert_eq!(operator.list("ek:*").await.unwrap(), []);
}

async fn multi_key_holds_are_listed_beside_every_kind(d: Deployment) {
    let a = named(&d, "host-a").await;
    let b = named(&d, "host-b").await;
    let c = named(&d, "host-c").await;
    let operator = d.manager().await;

    // A multi-key hold: its keys share one hold id; `list` sees every kind.
    let multi = a.lock_all(["mk:m1", "mk:m2"]).acquire().await.unwrap();
    let reader = b.read_lock("mk:r").acquire().await.unwrap();
    let permit = c.semaphore("mk:s", 2).acquire().await.unwrap();
    let listed = operator.list("mk:*").await.unwrap();
    let seen: Vec<_> = listed
        .iter()
        .map(|h| (h.key.as_str(), h.kind, h.holder.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("mk:m1", HoldKind::Lock, "host-a"),
            ("mk:m2", HoldKind::Lock, "host-a"),
            ("mk:r", HoldKind::Read, "host-b"),
            ("mk:s", HoldKind::Permits(1), "host-c"),
        ]
    );
    assert_eq!(
        listed[0].acquisition_id, listed[1].acquisition_id,
        "one multi-key hold"
    );
    assert_ne!(listed[0].acquisition_id, listed[2].acquisition_id);
    assert_ne!(listed[2].acquisition_id, listed[3].acquisition_id);
    multi.release().await.unwrap();
    reader.release().await.unwrap();
    permit.release().await.unwrap();
    assert_eq!(operator.list("mk:*").await.unwrap(), []);

    // Keys taken one by one (the second was busy, so no one script could
    // take both): tokens of their own, one acquisition id.
    let busy = b.lock("mk:w2").acquire().await.unwrap();
    let multi = tokio::spawn({
        let a = a.clone();
        async move {
            a.lock_all(["mk:w1", "mk:w2"])
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap()
        }
    });
    let first_taken = eventually(Duration::from_secs(10), async || {
        operator.inspect_all("mk:w1").await.unwrap().is_held()
    })
    .await;
    assert!(first_taken.is_some());
    busy.release().await.unwrap();
    let multi = multi.await.unwrap();
    let listed = operator.list("mk:w*").await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0].acquisition_id, listed[1].acquisition_id);
    assert_ne!(listed[0].hold_id, listed[1].hold_id);
    multi.release().await.unwrap();
}

async fn one_holder_or_the_whole_key_is_freed(d: Deployment) {
    let a = named(&d, "host-a").await;
    let b = named(&d, "host-b").await;
    let c = named(&d, "host-c").await;
    let operator = d.manager().await;
    let mut raw = d.redis_raw_for(&operator, "fk:doc").await;

    // One reader of two.
    let ra = a.read_lock("fk:doc").acquire().await.unwrap();
    let rb = b.read_lock("fk:doc").acquire().await.unwrap();
    let state = operator.inspect_all("fk:doc").await.unwrap();
    let victim = state
        .holds
        .iter()
        .find(|h| h.holder == "host-a")
        .expect("a's read hold")
        .clone();
    assert!(operator.force_unlock_hold(&victim).await.unwrap());
    assert!(!operator.force_unlock_hold(&victim).await.unwrap(), "gone");
    let state = operator.inspect_all("fk:doc").await.unwrap();
    let left: Vec<_> = state.holds.iter().map(|h| h.holder.as_str()).collect();
    assert_eq!(left, ["host-b"]);
    // The freed reader learns it at its next renewal: within a third of the
    // lease, plus the command timeout; LEASE bounds it with room to spare.
    let told = eventually(LEASE, async || ra.is_lost()).await;
    assert!(told.is_some(), "the freed reader is told");
    assert!(!rb.is_lost());

    // One semaphore holder: the waiter it kept out is woken, not left to its
    // backoff (the holder renews, so its lease never runs out).
    let one = a.semaphore("fk:pool", 3).acquire().await.unwrap();
    let two = b.semaphore("fk:pool", 3).weight(2).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let c = c.clone();
        async move {
            c.semaphore("fk:pool", 3)
                .weight(2)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap()
        }
    });
    let state = operator.inspect_all("fk:pool").await.unwrap();
    let weighted = state
        .holds_of(HoldKind::Permits(2))
        .find(|h| h.kind == HoldKind::Permits(2))
        .expect("the weighted hold")
        .clone();
    assert!(operator.force_unlock_hold(&weighted).await.unwrap());
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is woken by the force-unlock")
        .unwrap();
    let mut holders: Vec<_> = operator
        .inspect_all("fk:pool")
        .await
        .unwrap()
        .holds
        .iter()
        .map(|h| (h.holder.clone(), h.kind))
        .collect();
    holders.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        holders,
        [
            ("host-a".to_owned(), HoldKind::Permits(1)),
            ("host-c".to_owned(), HoldKind::Permits(2))
        ]
    );
    assert!(eventually(LEASE, async || two.is_lost()).await.is_some());

    // The whole key, every kind at once: the default lock, the read-write
    // lock's remaining reader and a waiting writer's intent.
    let lock = c.lock("fk:doc").acquire().await.unwrap();
    let writer = tokio::spawn({
        let c = c.clone();
        async move {
            c.write_lock("fk:doc")
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        }
    });
    let waiting = eventually(Duration::from_secs(10), async || {
        operator.inspect_all("fk:doc").await.unwrap().writer_waiting
    })
    .await;
    assert!(waiting.is_some());
    assert_eq!(operator.force_unlock_all("fk:doc").await.unwrap(), 2);
    // The waiting writer is woken and takes the lock at once.
    let w = tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer is woken by the force-unlock")
        .unwrap()
        .unwrap();
    assert!(eventually(LEASE, async || lock.is_lost()).await.is_some());
    assert!(eventually(LEASE, async || rb.is_lost()).await.is_some());
    w.release().await.unwrap();
    assert_eq!(operator.force_unlock_all("fk:doc").await.unwrap(), 0);
    one.release().await.unwrap();
    got.release().await.unwrap();
    drop((ra, rb, two, lock));
    assert!(!operator.inspect_all("fk:doc").await.unwrap().is_held());
    if let Some(raw) = raw.as_mut() {
        let left = eventually(Duration::from_secs(10), async || {
            kinds_of(raw, "fk:doc")
                .await
                .iter()
                .all(|k| k.ends_with("fence"))
        })
        .await;
        assert!(
            left.is_some(),
            "nothing but fencing counters: {:?}",
            kinds_of(raw, "fk:doc").await
        );
    }
}

/// An expired reader's or permit holder's details go with it: the next
/// acquisition removes both, so the hash never outgrows the holders.
#[tokio::test]
async fn expired_holders_leave_no_details_behind() {
    let server = server();
    let m = manager(&server).await;
    let mut raw = raw(&server).await;
    let short = distlock::MIN_LEASE;
    for (kind, details) in [("read", "rwrd"), ("permit", "semd")] {
        let key = format!("exp-{kind}");
        let request = |m: &LockManager| match kind {
            "read" => m.read_lock(key.as_str()),
            _ => m.semaphore(key.as_str(), 3),
        };
        // A grant answered after so short a lease (a loaded machine) is not
        // handed out (`Lost`, and given back): ask again.
        let gone = loop {
            match request(&m).lease(short).renew(false).acquire().await {
                Ok(gone) => break gone,
                Err(LockError::Lost { .. }) => continue,
                Err(e) => panic!("{key}: {e}"),
            }
        };
        // Without renewal the hold ends a lease after it began, by the
        // server's clock (which inspect_all reads); 100 leases is slack.
        let expired = eventually(short * 100, async || {
            !m.inspect_all(&key).await.unwrap().is_held()
        })
        .await;
        assert!(expired.is_some());
        let live = request(&m).acquire().await.unwrap();
        let name = m
            .redis_names(&key)
            .lock
            .replacen(":lock:", &format!(":{details}:"), 1);
        let mut fields: Vec<String> = redis::cmd("HKEYS")
            .arg(&name)
            .query_async(&mut raw)
            .await
            .unwrap();
        fields.sort();
        let mut expected = vec!["!".to_owned(), live_hold_id(&m, &key).await];
        expected.sort();
        assert_eq!(
            fields, expected,
            "{kind}: only the live holder is described"
        );
        live.release().await.unwrap();
        drop(gone);
        assert!(
            !exists(&mut raw, &name).await,
            "{kind}: gone with the last holder"
        );
    }
}

async fn live_hold_id(m: &LockManager, key: &str) -> String {
    let state = m.inspect_all(key).await.unwrap();
    assert_eq!(state.holds.len(), 1, "{state:?}");
    state.holds[0].hold_id.clone()
}

#[tokio::test]
async fn a_foreign_value_on_any_name_is_reported() {
    let server = server();
    let m = manager(&server).await;
    let mut raw = raw(&server).await;
    let details = m.redis_names("fv").lock.replacen(":lock:", ":semd:", 1);
    let _: () = redis::cmd("HSET")
        .arg(&details)
        .arg("field")
        .arg("theirs")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = m.inspect_all("fv").await.unwrap_err();
    assert!(
        matches!(&err, LockError::ForeignValue { key } if key == "fv"),
        "{err:?}"
    );
    let err = m.semaphore("fv", 2).is_locked().await.unwrap_err();
    assert!(matches!(&err, LockError::ForeignValue { .. }), "{err:?}");
    // Not changed: no TTL was set, the field is still there.
    assert_eq!(pttl(&mut raw, &details).await, -1);
}

#[tokio::test]
async fn on_a_redlock_the_default_lock_is_seen_and_freed() {
    let servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let holder = LockManager::redlock_builder(urls.clone())
        .holder("host-r")
        .build()
        .await
        .unwrap();
    let operator = LockManager::redlock_builder(urls).build().await.unwrap();
    let g = holder.lock("rk").acquire().await.unwrap();
    let state = operator.inspect_all("rk").await.unwrap();
    assert_eq!(state.holds.len(), 1);
    assert_eq!(state.holds[0].holder, "host-r");
    assert!(holder.lock("rk").is_locked().await.unwrap());
    assert_eq!(operator.force_unlock_all("rk").await.unwrap(), 1);
    assert!(!operator.inspect_all("rk").await.unwrap().is_held());
    drop(g);
}
