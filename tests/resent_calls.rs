//! A call whose reply is lost with its connection, and sent again: Redis
//! Cluster backend does that (it sends a request once more on a new
//! connection when the old one drops before the reply), as does the Sentinel
//! backend after a failover. The first run took effect; the second must
//! neither report the opposite (a plain acquisition finding its own value
//! "busy") nor do it twice (permits added or taken twice).
//!
//! Each master of a private cluster is reached through a fault proxy: the
//! node announces the proxy's port, so the clients that read the slot map
//! connect through it, and `reset_next_replies` drops the reply of the next
//! request with its connection.

use std::net::SocketAddr;
use std::time::Duration;

mod common;

use common::eventually;
use distlock::testing::{key_slot, FaultProxy, RedisCluster};
use distlock::LockManager;

/// A cluster whose masters announce a fault proxy's port each, and a manager
/// seeded with the proxies.
struct ProxiedCluster {
    cluster: RedisCluster,
    /// The proxy in front of each master, with the master's own port.
    proxies: Vec<(u16, FaultProxy)>,
    manager: LockManager,
}

impl ProxiedCluster {
    async fn start() -> Self {
        let cluster = RedisCluster::spawn().expect("spawn a cluster");
        let masters: Vec<_> = cluster
            .nodes()
            .into_iter()
            .filter(|n| matches!(n.role, distlock::testing::ClusterNodeRole::Master))
            .collect();
        let mut proxies = Vec::new();
        for node in &masters {
            let upstream = SocketAddr::from(([127, 0, 0, 1], node.port));
            let proxy = FaultProxy::start(upstream).await.unwrap();
            let mut conn = cluster.blocking_client(node.index).unwrap();
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-announce-port")
                .arg(proxy.local_addr().port())
                .query(&mut conn)
                .unwrap();
            proxies.push((node.port, proxy));
        }
        // Every node's slot map names the proxies (gossip carries a node's
        // announced port to the others within a second or two).
        let proxy_ports: Vec<u16> = proxies.iter().map(|(_, p)| p.local_addr().port()).collect();
        let announced = eventually(Duration::from_secs(20), async || {
            cluster.nodes().iter().all(|node| {
                let mut conn = cluster.blocking_client(node.index).unwrap();
                let slots: Vec<redis::Value> =
                    redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).unwrap();
                slots.len() == masters.len()
                    && slots.iter().all(|range| {
                        let redis::Value::Array(parts) = range else {
                            return false;
                        };
                        matches!(parts.get(2), Some(redis::Value::Array(master))
                            if matches!(master.get(1), Some(redis::Value::Int(port))
                                if proxy_ports.contains(&(*port as u16))))
                    })
            })
        })
        .await;
        assert!(announced.is_some(), "the nodes never announced the proxies");
        let manager = LockManager::cluster_builder(proxies.iter().map(|(_, p)| p.url()))
            .command_timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("connect through the proxies");
        ProxiedCluster {
            cluster,
            proxies,
            manager,
        }
    }

    /// The proxy in front of the master that holds `key`'s names (every
    /// kind of a key shares its hash tag, so its slot), by the slot map,
    /// which names the proxies.
    fn proxy_of(&self, key: &str) -> &FaultProxy {
        let slot = i64::from(key_slot(self.manager.redis_names(key).lock.as_bytes()));
        let mut conn = self.cluster.blocking_client(0).unwrap();
        // Each range: first slot, last slot, then its master as (ip, port, id, ..).
        let ranges: Vec<(i64, i64, Vec<redis::Value>)> =
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn).unwrap();
        let (_, _, master) = ranges
            .into_iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .expect("every slot is served");
        let Some(redis::Value::Int(port)) = master.get(1) else {
            panic!("a master's port: {master:?}");
        };
        let port = *port;
        self.proxies
            .iter()
            .map(|(_, proxy)| proxy)
            .find(|proxy| i64::from(proxy.local_addr().port()) == port)
            .expect("the slot map names a proxy")
    }

    /// Runs `call` with the reply of the next request through `key`'s proxy
    /// dropped with its connection, and checks that the reset happened.
    async fn with_reply_lost<T>(&self, key: &str, call: impl std::future::Future<Output = T>) -> T {
        let proxy = self.proxy_of(key);
        proxy.reset_next_replies(1);
        let out = call.await;
        assert_eq!(proxy.replies_to_reset(), 0, "no reply was lost");
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_sent_again_after_a_lost_reply_take_effect_once() {
    let c = ProxiedCluster::start().await;
    let m = &c.manager;

    // The plain acquisition (`SET NX GET`: no token, no wait): sent again, it
    // finds the value its first run wrote. The lock is ours, not "busy".
    let key = "resent:plain";
    // A cycle first, so that the lost reply is the acquisition's, not that of
    // a connection the manager makes on its first call.
    let warm = m.lock(key).try_acquire().await.unwrap().expect("free");
    warm.release().await.unwrap();
    let acquired = c
        .with_reply_lost(
            key,
            m.lock(key).lease(Duration::from_secs(30)).try_acquire(),
        )
        .await
        .unwrap();
    let guard = acquired.expect("the lock was free: its first run took it for us");
    assert!(m.is_locked(key).await.unwrap());
    guard.release().await.unwrap();
    assert!(!m.is_locked(key).await.unwrap(), "released: nothing held");

    // The counting semaphore's changes and acquisition: each once.
    let key = "resent:permits";
    let s = m.counting_semaphore(key);
    assert!(s.try_set_permits(5).await.unwrap());
    // Both scripts once first (see the test below).
    assert!(s.try_acquire(1).await.unwrap());
    assert_eq!(s.release(1).await.unwrap(), 5);
    let added = c.with_reply_lost(key, s.add_permits(1)).await.unwrap();
    assert_eq!(added, 6, "the reply of the first run");
    assert_eq!(s.available_permits().await.unwrap(), 6, "added once");
    let taken = c.with_reply_lost(key, s.try_acquire(2)).await.unwrap();
    assert!(taken);
    assert_eq!(s.available_permits().await.unwrap(), 4, "taken once");
    let drained = c.with_reply_lost(key, s.drain_permits()).await.unwrap();
    assert_eq!(drained, 4, "what the first run took");
    assert_eq!(s.available_permits().await.unwrap(), 0);
    let released = c.with_reply_lost(key, s.release(3)).await.unwrap();
    assert_eq!(released, 3);
    assert_eq!(s.available_permits().await.unwrap(), 3, "given back once");
    let deleted = c.with_reply_lost(key, s.delete()).await.unwrap();
    assert!(deleted, "the first run deleted it");
    assert!(!s.counts().await.unwrap().exists);
}

/// A weighted semaphore hold renamed by a give-back or a split: sent again,
/// the rename finds its new name already there. It used to answer "not ours",
/// mark the guard lost and leave the renamed permits held for their lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_rename_sent_again_keeps_the_hold() {
    let c = ProxiedCluster::start().await;
    let m = &c.manager;
    let key = "resent:weighted";
    let held = async || m.semaphore(key, 4).permit_counts().await.unwrap().held;
    // A hold of 3 of the semaphore's 4 permits, for 30 s.
    let take_three = async || {
        m.semaphore(key, 4)
            .weight(3)
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap()
    };
    // Each script once first, so that the lost reply is the script's own and
    // not the NOSCRIPT of its first call.
    let mut warm = take_three().await;
    warm.release_permits(1).await.unwrap();
    for single in warm
        .split_permits()
        .await
        .unwrap()
        .into_iter()
        .chain([warm])
    {
        single.release().await.unwrap();
    }

    let mut guard = take_three().await;
    c.with_reply_lost(key, guard.release_permits(2))
        .await
        .unwrap();
    assert!(!guard.is_lost());
    assert_eq!(held().await, 1, "two given back, one kept");
    guard.release().await.unwrap();
    assert_eq!(held().await, 0, "the kept permit released by its guard");

    let mut guard = take_three().await;
    let singles = c.with_reply_lost(key, guard.split_permits()).await.unwrap();
    // The guard keeps one permit; the other two come back as new guards.
    assert_eq!(singles.len(), 2);
    assert_eq!(held().await, 3);
    for single in singles.into_iter().chain([guard]) {
        assert!(!single.is_lost());
        single.release().await.unwrap();
    }
    assert_eq!(held().await, 0, "each single permit released by its guard");
}

/// A force-unlock sent again after its reply was lost answers what its first
/// run did: it freed the lock (or the semaphore hold). The second run used to
/// find nothing and report "was not held"; where a waiter was queued, it
/// would have freed the lock the first run had just handed to that waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_unlock_sent_again_answers_what_it_did() {
    let c = ProxiedCluster::start().await;
    let m = &c.manager;
    let lease = Duration::from_secs(30);

    let key = "resent:unlock";
    // Each script once first (the lost reply must be the script's own, not
    // the NOSCRIPT of its first call), on the key's own node.
    assert!(!m.force_unlock(key).await.unwrap());
    let held = m.lock(key).lease(lease).acquire().await.unwrap();
    let freed = c.with_reply_lost(key, m.force_unlock(key)).await.unwrap();
    assert!(freed, "the first run freed it");
    assert!(!m.is_locked(key).await.unwrap());
    drop(held);

    let key = "resent:unlock-permit";
    assert_eq!(m.force_unlock_all(key).await.unwrap(), 0);
    let held = m.semaphore(key, 4).lease(lease).acquire().await.unwrap();
    let hold = m.inspect_all(key).await.unwrap().holds.remove(0);
    let freed = c
        .with_reply_lost(key, m.force_unlock_hold(&hold))
        .await
        .unwrap();
    assert!(freed, "the first run freed the hold");
    assert_eq!(m.semaphore(key, 4).permit_counts().await.unwrap().held, 0);
    drop(held);
}

/// A request of one kind on `key` (a semaphore's, a read lock's, ...).
type RequestOf = fn(&LockManager, &'static str) -> distlock::LockRequest;

/// A release sent again after its reply was lost reports what its first run
/// did: the hold was ours and is released (or handed over). The second run
/// found the hold gone and answered "not ours", so the release reported
/// `Lost` and `#[distributed_lock(on_lost = "abort")]` turned the body's
/// success into an error. Each kind's release leaves a receipt on Cluster
/// that the second run finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_reports_the_release() {
    let c = ProxiedCluster::start().await;
    let m = &c.manager;
    let lease = Duration::from_secs(30);

    // The default lock, nobody waiting: the one-key release, then the full
    // one when the second run of the first declines.
    let key = "resent:release";
    // Each script once first (the lost reply must be the script's own, not
    // the NOSCRIPT of its first call), on the key's own node.
    m.lock(key)
        .lease(lease)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let guard = m.lock(key).lease(lease).acquire().await.unwrap();
    let released = c.with_reply_lost(key, guard.release()).await;
    assert!(released.is_ok(), "{released:?}");
    assert!(!m.is_locked(key).await.unwrap());

    // The default lock handed to a waiter of this manager: the second run
    // finds the waiter holding it.
    let key = "resent:handoff";
    let guard = m.lock(key).lease(lease).acquire().await.unwrap();
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.lock(key).lease(lease).acquire().await.unwrap() })
    };
    common::await_parked(m, 1).await;
    let released = c.with_reply_lost(key, guard.release()).await;
    assert!(released.is_ok(), "{released:?}");
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the lock")
        .unwrap();
    next.release().await.unwrap();

    // A semaphore's permit, a read hold and a write hold.
    let kinds: [(&str, RequestOf); 3] = [
        ("resent:permit", |m, k| m.semaphore(k, 2)),
        ("resent:read", |m, k| m.read_lock(k)),
        ("resent:write", |m, k| m.write_lock(k)),
    ];
    for (key, request) in kinds {
        request(m, key)
            .lease(lease)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let guard = request(m, key).lease(lease).acquire().await.unwrap();
        let released = c.with_reply_lost(key, guard.release()).await;
        assert!(released.is_ok(), "{key}: {released:?}");
        assert!(
            request(m, key).try_acquire().await.unwrap().is_some(),
            "{key}: released once"
        );
    }
}
