//! distlock never changes a value it did not write: a value of another
//! program (any shape, any type) under one of a lock's Redis names is left
//! byte for byte, and the caller gets `LockError::ForeignValue` naming the key
//! at once, not a wait until its timeout (issue: waiters used to write their
//! mark `+` into byte 33 of any value, `other1` becoming `other1++++++++++`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::{LockError, LockManager};
use redis::aio::MultiplexedConnection;

/// The foreign values: short, long and binary strings, and other types.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Short,
    Long,
    Binary,
    List,
    Hash,
    Set,
}

const SHAPES: [Shape; 6] = [
    Shape::Short,
    Shape::Long,
    Shape::Binary,
    Shape::List,
    Shape::Hash,
    Shape::Set,
];

async fn write_foreign(conn: &mut MultiplexedConnection, name: &str, shape: Shape) {
    del(conn, name).await;
    let cmd = match shape {
        Shape::Short => {
            let mut c = redis::cmd("SET");
            c.arg(name).arg("other1");
            c
        }
        Shape::Long => {
            let mut c = redis::cmd("SET");
            c.arg(name).arg("x".repeat(300));
            c
        }
        Shape::Binary => {
            let mut c = redis::cmd("SET");
            c.arg(name).arg((0..=255u8).collect::<Vec<u8>>());
            c
        }
        Shape::List => {
            let mut c = redis::cmd("RPUSH");
            c.arg(name).arg("a").arg("b");
            c
        }
        Shape::Hash => {
            let mut c = redis::cmd("HSET");
            c.arg(name)
                .arg("0123456789abcdef0123456789abcdef")
                .arg("17");
            c
        }
        Shape::Set => {
            let mut c = redis::cmd("SADD");
            c.arg(name).arg("m");
            c
        }
    };
    let _: () = cmd.query_async(conn).await.unwrap();
}

/// The value as `DUMP` serialises it (type and content) and its TTL.
async fn snapshot(conn: &mut MultiplexedConnection, name: &str) -> (Vec<u8>, i64) {
    let dump: Vec<u8> = redis::cmd("DUMP")
        .arg(name)
        .query_async(conn)
        .await
        .unwrap();
    (dump, pttl(conn, name).await)
}

/// The name of kind `kind` (`lock`, `rw`, `rwr`, `rwrd`, `sem`, `semp`, `semd`) of `key`.
fn name_of_kind(m: &LockManager, key: &str, kind: &str) -> String {
    m.redis_names(key)
        .lock
        .replacen(":lock:", &format!(":{kind}:"), 1)
}

/// One primitive's attempts on `key`: each must fail with `ForeignValue`
/// naming `key`, well within their wait.
async fn attempts(m: &LockManager, kind: &str, key: &str) -> Vec<Result<(), LockError>> {
    let wait = Duration::from_secs(3);
    let mut out = Vec::new();
    match kind {
        "lock" => {
            out.push(m.lock(key).try_acquire().await.map(drop));
            out.push(m.lock(key).wait(wait).acquire().await.map(drop));
            out.push(
                m.lock(key)
                    .eager_fencing(true)
                    .wait(wait)
                    .acquire()
                    .await
                    .map(drop),
            );
            out.push(
                m.lock_all([key, "other-key"])
                    .wait(wait)
                    .acquire()
                    .await
                    .map(drop),
            );
        }
        "rw" | "rwr" | "rwrd" => {
            out.push(m.write_lock(key).wait(wait).acquire().await.map(drop));
            out.push(m.read_lock(key).wait(wait).acquire().await.map(drop));
        }
        "sem" | "semp" | "semd" => {
            out.push(m.semaphore(key, 2).wait(wait).acquire().await.map(drop));
            out.push(m.semaphore(key, 2).try_acquire().await.map(drop));
        }
        _ => unreachable!(),
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_left_unchanged_and_reported() {
    let redis = server();
    let m = manager(&redis).await;
    let mut conn = raw(&redis).await;
    for kind in ["lock", "rw", "rwr", "rwrd", "sem", "semp", "semd"] {
        for shape in SHAPES {
            // A string in a sorted set's place, a zset in a string's, ...:
            // every shape under every name.
            let key = format!("foreign:{kind}:{shape:?}");
            let name = name_of_kind(&m, &key, kind);
            write_foreign(&mut conn, &name, shape).await;
            let before = snapshot(&mut conn, &name).await;
            let started = Instant::now();
            for (i, result) in attempts(&m, kind, &key).await.into_iter().enumerate() {
                match result {
                    Err(LockError::ForeignValue { key: named }) => {
                        assert_eq!(named, key, "{kind} {shape:?} attempt {i}")
                    }
                    other => panic!("{kind} {shape:?} attempt {i}: {other:?}"),
                }
            }
            // Every attempt answered at once (each is one round trip, and
            // the waiting ones were willing to wait 3 s each).
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{kind} {shape:?}: {:?}",
                started.elapsed()
            );
            assert_eq!(
                snapshot(&mut conn, &name).await,
                before,
                "{kind} {shape:?}: the foreign value was changed"
            );
            del(&mut conn, &name).await;
        }
    }
    // Nothing of distlock's was left beside them.
    assert_eq!(all_keys(&mut conn).await, Vec::<String>::new());
}

/// An operator's force-unlock leaves a foreign value under the default
/// lock's name as it is and says so, as every other call does (issue: it
/// deleted it, whatever its type or content, and answered "it was held").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_leaves_a_foreign_value_and_reports_it() {
    let redis = server();
    let m = manager(&redis).await;
    let mut conn = raw(&redis).await;
    for shape in SHAPES {
        let key = format!("foreign:unlock:{shape:?}");
        let name = m.redis_names(&key).lock;
        write_foreign(&mut conn, &name, shape).await;
        let before = snapshot(&mut conn, &name).await;
        for result in [
            m.force_unlock(&key).await.map(u64::from),
            m.force_unlock_all(&key).await,
        ] {
            match result {
                Err(LockError::ForeignValue { key: named }) => assert_eq!(named, key),
                other => panic!("{shape:?}: {other:?}"),
            }
        }
        assert_eq!(
            snapshot(&mut conn, &name).await,
            before,
            "{shape:?}: the foreign value was changed"
        );
        del(&mut conn, &name).await;
    }
    // A lock of distlock's own is still freed.
    let guard = m.lock("foreign:unlock:own").acquire().await.unwrap();
    assert!(m.force_unlock("foreign:unlock:own").await.unwrap());
    drop(guard);
}

/// A hold whose Redis name another program replaced with a value of another
/// type (a hash over the lock, a string over a semaphore's holders) is lost
/// at its next renewal, not at its deadline. Issue: the renewal scripts read
/// it with `redis.call`, whose type error failed the renewal instead; it was
/// retried (each retry reported as trouble) until the lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_replaced_by_another_type_is_lost_at_its_next_renewal() {
    let redis = server();
    let m = manager(&redis).await;
    let mut conn = raw(&redis).await;
    let lease = Duration::from_secs(3);
    let lock = m
        .lock("replaced:lock")
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let permit = m
        .semaphore("replaced:sem", 2)
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let replaced = Instant::now();
    write_foreign(&mut conn, &m.redis_names("replaced:lock").lock, Shape::Hash).await;
    write_foreign(
        &mut conn,
        &name_of_kind(&m, "replaced:sem", "sem"),
        Shape::Short,
    )
    .await;
    // The first renewal is due a third of the lease (1 s) after the grant,
    // and answered within the command timeout (0.5 s): lost by 1.5 s, well
    // before the deadline at 3 s.
    for (what, guard) in [("lock", &lock), ("semaphore", &permit)] {
        tokio::time::timeout(Duration::from_millis(2000), guard.lost())
            .await
            .unwrap_or_else(|_| panic!("the {what} was not lost at its renewal"));
    }
    assert!(replaced.elapsed() < Duration::from_millis(2500));
    drop((lock, permit));
}

/// A waiter of the default lock that finds the holder's value replaced by a
/// foreign one (an operator's `SET` over it) stops at its next attempt with
/// the typed error, and leaves the value alone.
#[tokio::test]
async fn a_value_replaced_while_a_waiter_waits_is_reported_to_it() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut conn = raw(&redis).await;
    let held = a
        .lock("swapped")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let name = a.redis_names("swapped").lock;
    let waiter = tokio::spawn(async move {
        b.lock("swapped")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .map(drop)
    });
    // Once the waiter has queued (it marked the holder's value), the value is
    // overwritten with a foreign one without a TTL.
    let marked = eventually(Duration::from_secs(5), async || {
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        v.is_some_and(|v| v.get(32) == Some(&b'+'))
    })
    .await;
    assert!(marked.is_some(), "the waiter never queued");
    let _: () = redis::cmd("SET")
        .arg(&name)
        .arg("other1")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The waiter attempts again when the 600 ms lease it saw runs out (or at
    // its next refresh, within 0.8 s), and stops there.
    let result = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter kept waiting")
        .unwrap();
    assert!(
        matches!(result, Err(LockError::ForeignValue { ref key }) if key == "swapped"),
        "{result:?}"
    );
    let v: Option<String> = redis::cmd("GET")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("other1"));
    drop(held);
}

/// A value of another type (a hash) put under a lock's name while waiters
/// queue for it is left alone by every release that meets it: the holder's
/// (which reports the lock lost) and each waiter's withdrawal once it finds
/// the value. Before, `release.lua` read the type error as a free lock and
/// handed it to the head of the queue, overwriting the hash, and that waiter
/// returned a guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_of_another_type_is_not_handed_to_a_waiter() {
    let redis = server();
    let a = manager(&redis).await;
    let mut conn = raw(&redis).await;
    let key = "swapped-type";
    let held = a.lock(key).acquire().await.unwrap();
    let name = a.redis_names(key).lock;
    let queue = name.replacen("lock:{", "lockq:{", 1);
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let m = manager(&redis).await;
        waiters.push(tokio::spawn(async move {
            m.lock(key)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .map(drop)
        }));
    }
    let queued = eventually(Duration::from_secs(5), async || {
        let n: u64 = redis::cmd("ZCARD")
            .arg(&queue)
            .query_async(&mut conn)
            .await
            .unwrap();
        n == 2
    })
    .await;
    assert!(queued.is_some(), "the waiters never queued ({queue})");
    write_foreign(&mut conn, &name, Shape::Hash).await;
    let released = held.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "{released:?}"
    );
    // Each waiter attempts again within its queue entry's refresh (0.8 s)
    // and stops there.
    for waiter in waiters {
        let result = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("a waiter kept waiting")
            .unwrap();
        assert!(
            matches!(result, Err(LockError::ForeignValue { key: ref k }) if k == key),
            "{result:?}"
        );
    }
    let kind: String = redis::cmd("TYPE")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "hash");
}

/// Every Redlock member still holds the foreign string written under `name`.
async fn every_member_keeps_its_value(conns: &mut [MultiplexedConnection], name: &str) {
    for conn in conns.iter_mut() {
        let v: Option<String> = redis::cmd("GET").arg(name).query_async(conn).await.unwrap();
        assert_eq!(v.as_deref(), Some("other1"));
    }
}

/// Under Redlock every member leaves its foreign value alone; with foreign
/// values on all of them, the caller gets the typed error at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redlock_member_leaves_a_foreign_value_alone() {
    let servers: Vec<_> = (0..3).map(|_| server()).collect();
    let m = LockManager::redlock_builder(servers.iter().map(|s| s.url()))
        .build()
        .await
        .unwrap();
    let name = m.redis_names("foreign:r").lock;
    let mut conns = Vec::new();
    for s in &servers {
        let mut conn = raw(s).await;
        write_foreign(&mut conn, &name, Shape::Short).await;
        conns.push(conn);
    }
    let started = Instant::now();
    for _ in 0..10 {
        let result = m
            .lock("foreign:r")
            .wait(Duration::from_secs(3))
            .acquire()
            .await
            .map(drop);
        assert!(
            matches!(result, Err(LockError::ForeignValue { ref key }) if key == "foreign:r"),
            "{result:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    every_member_keeps_its_value(&mut conns, &name).await;
    // An operator's force-unlock leaves them too, and says why.
    let result = m.force_unlock("foreign:r").await;
    assert!(
        matches!(result, Err(LockError::ForeignValue { ref key }) if key == "foreign:r"),
        "{result:?}"
    );
    every_member_keeps_its_value(&mut conns, &name).await;
}

/// Under Redlock a foreign value on a minority of members is one busy member
/// more, not a failure: a contended acquisition gets the lock when its
/// holder leaves. On a majority, no wait can grant it: the typed error at
/// once. Either way the foreign values stay as they were (issue: one foreign
/// member failed every contended acquisition with `ForeignValue`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_on_a_redlock_minority_only_delays_a_contended_acquisition() {
    let servers: Vec<_> = (0..3).map(|_| server()).collect();
    let redlock = async || {
        LockManager::redlock_builder(servers.iter().map(|s| s.url()))
            .build()
            .await
            .unwrap()
    };
    let (holder, waiter) = (redlock().await, redlock().await);
    let name = holder.redis_names("foreign:minority").lock;
    let mut conns = Vec::new();
    for s in &servers {
        conns.push(raw(s).await);
    }
    write_foreign(&mut conns[0], &name, Shape::Short).await;
    // Members 1 and 2 make the holder's majority.
    let held = holder.lock("foreign:minority").acquire().await.unwrap();
    let release_after = Duration::from_millis(300);
    // The time the holder starts to release: until then it holds the lock.
    // (Not when its release returns: the members answer one by one, and the
    // waiter may hold a majority before the last answer reaches the holder.)
    let released = tokio::spawn(async move {
        tokio::time::sleep(release_after).await;
        let releasing = Instant::now();
        held.release().await.unwrap();
        releasing
    });
    let got = waiter
        .lock("foreign:minority")
        .wait(Duration::from_secs(3))
        .acquire()
        .await;
    let got_at = Instant::now();
    let releasing_at = released.await.unwrap();
    let guard = got.expect("a foreign value on one member of three must not fail the acquisition");
    assert!(got_at >= releasing_at, "granted while the holder held it");
    guard.release().await.unwrap();

    // A second foreign member leaves no majority to grant: the typed error
    // at once, not at the end of the 3 s wait.
    write_foreign(&mut conns[1], &name, Shape::Short).await;
    let started = Instant::now();
    let result = waiter
        .lock("foreign:minority")
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .map(drop);
    assert!(
        matches!(result, Err(LockError::ForeignValue { ref key }) if key == "foreign:minority"),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    for conn in conns.iter_mut().take(2) {
        let v: Option<String> = redis::cmd("GET")
            .arg(&name)
            .query_async(conn)
            .await
            .unwrap();
        assert_eq!(v.as_deref(), Some("other1"), "a foreign value was changed");
    }
}
