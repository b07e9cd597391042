//! `replica_ack(n, timeout)`: an acquisition counts only once `n` replicas
//! confirm it (`WAIT`, pipelined after the acquire on the same connection).
//! The replica replicates through a `FaultProxy`, so a test can cut it off.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::testing::{FaultMode, FaultProxy, RedisServer};
use distlock::{distributed_lock, LockError, LockManager};

/// A master, a proxy in front of it, and a replica that replicates through the
/// proxy, linked up.
async fn master_and_replica() -> (RedisServer, FaultProxy, RedisServer) {
    let master = RedisServer::spawn_with_args(&["--repl-diskless-sync-delay", "0"]).unwrap();
    let proxy = FaultProxy::start(master.addr()).await.unwrap();
    let port = proxy.local_addr().port().to_string();
    let replica = RedisServer::spawn_with_args(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let mut conn = raw(&replica).await;
    let linked = eventually(Duration::from_secs(10), async || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .unwrap();
        info.contains("master_link_status:up")
    })
    .await;
    assert!(linked.is_some(), "the replica never linked up");
    (master, proxy, replica)
}

async fn acked_manager(master: &RedisServer, timeout: Duration) -> LockManager {
    LockManager::builder(&master.url())
        .command_timeout(Duration::from_millis(500))
        .replica_ack(1, timeout)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_confirmed_acquisition_is_on_the_replica() {
    let (master, _proxy, replica) = master_and_replica().await;
    let m = acked_manager(&master, Duration::from_secs(2)).await;
    let guard = m.lock("acked").acquire().await.unwrap();
    // WAIT returned 1, so the replica has the lock already: no polling.
    let mut on_replica = raw(&replica).await;
    assert!(exists(&mut on_replica, &m.redis_names("acked").lock).await);
    guard.release().await.unwrap();
}

/// Also the regression test for `WAIT` sent on a connection of its own: such a
/// `WAIT` has no writes to wait for and answers at once with every connected
/// replica, so the acquisition would succeed here.
#[tokio::test]
async fn a_cut_off_replica_fails_the_acquisition_after_the_timeout_and_nothing_stays_held() {
    let (master, proxy, _replica) = master_and_replica().await;
    let m = acked_manager(&master, Duration::from_millis(300)).await;
    proxy.set_mode(FaultMode::BlackHole);
    let started = Instant::now();
    let refused = m
        .lock("cut-off")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            refused,
            LockError::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{refused:?}"
    );
    // About the replica timeout: not at once, and not the whole wait.
    assert!(took >= Duration::from_millis(290), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let mut on_master = raw(&master).await;
    assert!(!exists(&mut on_master, &m.redis_names("cut-off").lock).await);
    assert!(refused.is_transient());
}

/// A release hands the lock to the head of its queue without waiting for a
/// replica: with `replica_ack`, the waiter confirms the hand-off by an
/// acknowledged attempt rather than take it as it comes, so a cut-off replica
/// fails it (and the lock goes back) instead of granting a hold a failover
/// could forget. Before the fix the waiter was granted here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_handed_to_a_waiter_is_acknowledged_too() {
    let (master, proxy, _replica) = master_and_replica().await;
    // The holder's first WAIT may meet a replica that just linked up: give
    // it time. The waiter's short timeout is what is under test.
    let holder = acked_manager(&master, Duration::from_secs(2)).await;
    let waiter = acked_manager(&master, Duration::from_millis(300)).await;
    let held = holder.lock("handed").acquire().await.unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            waiter
                .lock("handed")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        }
    });
    let queued = eventually(Duration::from_secs(5), async || {
        !holder
            .inspect_all("handed")
            .await
            .unwrap()
            .waiters
            .is_empty()
    })
    .await;
    assert!(queued.is_some(), "the waiter queued");
    // Its manager listens for hand-offs (before that, a hand-off is made up
    // for by the attempt the subscription's confirmation triggers). The
    // holder's manager listens on a hand-off channel of its own too: the
    // waiter's is the one its owner token's route names.
    let waiter_id = holder.inspect_all("handed").await.unwrap().waiters[0]
        .hold_id
        .clone();
    let waiter_channel = format!("distlock:handoff:{}", &waiter_id[waiter_id.len() - 8..]);
    let mut on_master = raw(&master).await;
    let listening = eventually(Duration::from_secs(5), async || {
        pubsub_channels(&mut on_master)
            .await
            .contains(&waiter_channel)
    })
    .await;
    assert!(
        listening.is_some(),
        "the waiter's hand-off channel is subscribed"
    );
    proxy.set_mode(FaultMode::BlackHole);
    // Release right after the waiter refreshed its queue entry (a fresh entry
    // has nearly its whole 3 s queue lease left), so that the hand-off answers
    // a recent attempt, one the waiter would take as its grant were it not
    // for the replicas (an answer to an attempt older than a third of the
    // hand-off TTL is confirmed anyway).
    let fresh = eventually(Duration::from_secs(5), async || {
        holder
            .inspect_all("handed")
            .await
            .unwrap()
            .waiters
            .first()
            .is_some_and(|w| w.queue_lease_left > Duration::from_millis(2_800))
    })
    .await;
    assert!(fresh.is_some(), "the waiter refreshed its entry");
    held.release().await.unwrap();
    let refused = waiting.await.unwrap().unwrap_err();
    assert!(
        matches!(refused, LockError::NotReplicated { acked: 0, .. }),
        "{refused:?}"
    );
    assert!(!exists(&mut on_master, &holder.redis_names("handed").lock).await);
}

#[tokio::test]
async fn replica_ack_needs_a_replica_and_a_timeout() {
    let redis = server();
    for (replicas, timeout) in [(0, Duration::from_secs(1)), (1, Duration::ZERO)] {
        let refused = LockManager::builder(&redis.url())
            .replica_ack(replicas, timeout)
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(refused, LockError::InvalidConfig(_)),
            "{refused:?}"
        );
    }
}

/// On a cluster, `WAIT` rides in the acquire's pipeline to the lock's master
/// and counts that master's replicas. A paused replica sends no
/// acknowledgements, so the acquisition fails and is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_locks_own_master_must_get_the_acknowledgements() {
    use distlock::testing::{ClusterNodeRole, RedisCluster};
    let cluster = RedisCluster::builder()
        .masters(3)
        .replicas_per_master(1)
        .spawn()
        .unwrap();
    let m = LockManager::cluster_builder(cluster.urls())
        .command_timeout(Duration::from_millis(500))
        .replica_ack(1, Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let key_on = |stem: &str, master: usize| {
        (0..)
            .map(|i| format!("{stem}:{i}"))
            .find(|k| cluster.master_of_key(&m.redis_names(k).lock).unwrap() == master)
            .unwrap()
    };
    let replica_of = |master: usize| {
        cluster
            .nodes()
            .iter()
            .find(|n| n.role == ClusterNodeRole::Replica { of: master })
            .unwrap()
            .index
    };
    let confirmed = key_on("acked", 0);
    let g = m.lock(&confirmed).acquire().await.unwrap();
    tokio::task::block_in_place(|| {
        let mut conn = cluster.blocking_client(replica_of(0)).unwrap();
        redis::cmd("READONLY").exec(&mut conn).unwrap();
        let n: i64 = redis::cmd("EXISTS")
            .arg(m.redis_names(&confirmed).lock)
            .query(&mut conn)
            .unwrap();
        assert_eq!(n, 1, "WAIT returned before the replica had the lock");
    });
    g.release().await.unwrap();

    let unconfirmed = key_on("unacked", 0);
    cluster.pause(replica_of(0)).unwrap();
    let started = Instant::now();
    let refused = m.lock(&unconfirmed).acquire().await.unwrap_err();
    let took = started.elapsed();
    cluster.resume(replica_of(0)).unwrap();
    assert!(
        matches!(
            refused,
            LockError::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(took >= Duration::from_millis(290), "{took:?}");
    let mut conn = cluster.cluster_connection().await.unwrap();
    assert!(!exists_cluster(&mut conn, &m.redis_names(&unconfirmed).lock).await);
    // A lock on another master, whose replica answers, is granted at once,
    // though that master has lost its scripts (as one that never ran them:
    // the start-up probe loads them on one master only): the reload goes to
    // the masters. It used to go to every node, through redis-rs's own
    // routing of SCRIPT LOAD, and wait for the paused replica, so this call
    // timed out whenever master 1 had not loaded the script before.
    let elsewhere = key_on("elsewhere", 1);
    tokio::task::block_in_place(|| {
        let mut conn = cluster.blocking_client(1).unwrap();
        redis::cmd("SCRIPT").arg("FLUSH").exec(&mut conn).unwrap();
    });
    cluster.pause(replica_of(0)).unwrap();
    let g = m.lock(&elsewhere).acquire().await;
    cluster.resume(replica_of(0)).unwrap();
    g.unwrap().release().await.unwrap();
}

async fn exists_cluster(conn: &mut redis::cluster_async::ClusterConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .unwrap()
        == 1
}

#[distributed_lock(key = "invoice:{id}", manager = manager)]
async fn issue_invoice(manager: &LockManager, id: u64) -> Result<u64, LockError> {
    Ok(id * 2)
}

#[tokio::test]
async fn a_locked_function_runs_unchanged_with_acknowledged_replicas() {
    let (master, proxy, _replica) = master_and_replica().await;
    // Generous: on a loaded machine (CI with parallel builds) the first WAIT
    // after the link came up has taken over 300 ms.
    let m = acked_manager(&master, Duration::from_millis(1500)).await;
    assert_eq!(issue_invoice(&m, 21).await.unwrap(), 42);
    proxy.set_mode(FaultMode::BlackHole);
    let refused = issue_invoice(&m, 22).await.unwrap_err();
    assert!(
        matches!(refused, LockError::NotReplicated { .. }),
        "{refused:?}"
    );
}

/// A fencing token issued on demand is confirmed by the replicas as the
/// acquisition was: a failover to a replica without it could issue the same
/// token to the next holder. Cut off, the call fails after the replicas'
/// timeout and the lock stays held. Before the fix the token came back at
/// once, unconfirmed.
#[tokio::test]
async fn a_token_issued_on_demand_is_acknowledged_too() {
    let (master, proxy, replica) = master_and_replica().await;
    // Generous, as above: the first WAIT after the link came up can be slow.
    let timeout = Duration::from_millis(1500);
    let m = acked_manager(&master, timeout).await;
    let guard = m.lock("token-acked").acquire().await.unwrap();
    let token = guard.fencing_token().await.unwrap();
    // WAIT returned 1: the replica has the counter at the token already.
    let mut on_replica = raw(&replica).await;
    let counter: u64 = redis::cmd("GET")
        .arg(m.redis_names("token-acked").fencing_counter())
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert_eq!(counter, token);
    guard.release().await.unwrap();

    let guard = m.lock("token-cut-off").acquire().await.unwrap();
    proxy.set_mode(FaultMode::BlackHole);
    let started = Instant::now();
    let refused = guard.fencing_token().await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            refused,
            LockError::TokenNotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(refused.is_transient());
    // The replicas' timeout, not at once: WAIT ran.
    assert!(took >= timeout - Duration::from_millis(10), "{took:?}");
    assert!(!guard.is_lost(), "the lock is kept");
    assert!(m.is_locked("token-cut-off").await.unwrap());
    // Asked again on a new connection (the manager's were killed), still cut
    // off: the token issued is read back, and confirmed no more than before.
    // A connection that wrote nothing yet would have WAIT count the replica
    // at once: the script writes the lock's value again so that it does not.
    let mut admin = raw(&master).await;
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(&mut admin)
        .await
        .unwrap();
    // The first call after the kill may meet the dead connection.
    let mut refused = guard.fencing_token().await.unwrap_err();
    for _ in 0..3 {
        if !matches!(refused, LockError::Backend { .. }) {
            break;
        }
        refused = guard.fencing_token().await.unwrap_err();
    }
    assert!(
        matches!(refused, LockError::TokenNotReplicated { acked: 0, .. }),
        "{refused:?}"
    );
    guard.release().await.unwrap();
}
