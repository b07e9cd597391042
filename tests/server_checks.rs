//! What `build()` checks before it hands out a manager: the eviction policy, and
//! that the ACL user may do everything a lock needs (least privilege works, a
//! missing permission is named). Passwords and TLS: `tests/auth.rs`.

mod common;

use common::*;
use distlock::testing::{RedisCluster, RedisServer};
use distlock::{LockError, LockManager};

fn server_with_policy(policy: &str) -> RedisServer {
    RedisServer::spawn_with_args(&["--maxmemory-policy", policy]).unwrap()
}

#[test]
fn noeviction_builds_quietly() {
    let redis = server_with_policy("noeviction");
    let log = logged(|| async {
        let m = LockManager::builder(&redis.url())
            .reject_evicting_policy(true)
            .build()
            .await
            .unwrap();
        m.lock("k")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        // The operations need nothing more than the locks themselves.
        let held = m.lock("ops").acquire().await.unwrap();
        assert!(m.is_locked("ops").await.unwrap());
        assert!(m.force_unlock("ops").await.unwrap());
        assert!(!m.is_locked("ops").await.unwrap());
        drop(held);
    });
    assert!(
        !log.contains("WARN") || log.contains("lock freed by force_unlock"),
        "{log}"
    );
    assert!(!log.contains("maxmemory-policy"), "{log}");
}

#[test]
fn evicting_policies_warn_or_fail_on_request() {
    // One of each class: allkeys-* may evict any key, volatile-* every key with a
    // TTL, which is every held lock.
    for policy in [
        "allkeys-lru",
        "allkeys-random",
        "volatile-lru",
        "volatile-ttl",
    ] {
        let redis = server_with_policy(policy);
        let log = logged(|| async {
            LockManager::connect(&redis.url()).await.unwrap();
        });
        let warning = log
            .lines()
            .find(|l| l.contains("WARN"))
            .unwrap_or_else(|| panic!("{policy}: no warning in\n{log}"));
        assert!(
            warning.contains(policy) && warning.contains("maxmemory-policy noeviction"),
            "{policy}: {warning}"
        );

        let refused = tokio::runtime::Runtime::new().unwrap().block_on(async {
            LockManager::builder(&redis.url())
                .reject_evicting_policy(true)
                .build()
                .await
        });
        match refused {
            Err(e @ LockError::ServerCheck { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains(policy) && text.contains("noeviction"),
                    "{text}"
                );
            }
            other => panic!("{policy}: {other:?}"),
        }
    }
}

/// A user that may not run CONFIG: the policy cannot be read, which is said at
/// debug level, and the manager builds.
#[test]
fn a_forbidden_config_is_noted_at_debug_and_ignored() {
    let redis = server_with_policy("allkeys-lru");
    let log = logged(|| async {
        let mut raw = raw(&redis).await;
        let rules = least_privilege(&mut raw).await;
        acl_user(&mut raw, "locker", &rules).await;
        let m = LockManager::builder(&user_url(&redis, "locker"))
            .reject_evicting_policy(true)
            .build()
            .await
            .unwrap();
        m.lock("k")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        // The operations need nothing more than the locks themselves.
        let held = m.lock("ops").acquire().await.unwrap();
        assert!(m.is_locked("ops").await.unwrap());
        assert!(m.force_unlock("ops").await.unwrap());
        assert!(!m.is_locked("ops").await.unwrap());
        drop(held);
    });
    assert!(
        !log.contains("WARN") || log.contains("lock freed by force_unlock"),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("DEBUG") && l.contains("maxmemory-policy")),
        "{log}"
    );
}

/// The least-privilege ACL of docs/deploying.md, verbatim ("The least-privilege ACL"),
/// for a server without `CLIENT SETINFO` (Redis before 7.2).
const LEAST_PRIVILEGE_BEFORE_7_2: &str =
    "~distlock:* &distlock:* +ping +evalsha +script|load +time +get \
     +set +pexpire +pttl +del +publish +subscribe +unsubscribe \
     +zadd +zrange +zrem +zcard +hset +hget +hdel";

/// What docs/deploying.md adds on Redis 7.2 and later and on every Valkey: redis-rs
/// sends `CLIENT SETINFO` on each new connection to a server that knows it.
const SETINFO: &str = "+client|setinfo";

/// The least-privilege ACL of docs/deploying.md for the server under test (Redis 7.0 refuses
/// a rule that names a subcommand it does not know).
async fn least_privilege(raw: &mut redis::aio::MultiplexedConnection) -> String {
    let known: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("client|setinfo")
        .query_async(raw)
        .await
        .unwrap();
    if known.iter().any(|v| !matches!(v, redis::Value::Nil)) {
        format!("{LEAST_PRIVILEGE_BEFORE_7_2} {SETINFO}")
    } else {
        LEAST_PRIVILEGE_BEFORE_7_2.to_owned()
    }
}

async fn acl_user(raw: &mut redis::aio::MultiplexedConnection, name: &str, rules: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(">pw");
    for rule in rules.split_whitespace() {
        cmd.arg(rule);
    }
    cmd.query_async::<()>(raw).await.unwrap();
}

fn user_url(redis: &RedisServer, user: &str) -> String {
    format!("redis://{user}:pw@{}", redis.addr())
}

#[tokio::test]
async fn the_least_privilege_acl_is_enough_for_everything() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let rules = least_privilege(&mut raw).await;
    acl_user(&mut raw, "locker", &rules).await;
    let a = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let b = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    // Acquire, renew, wait by push, hand-off, release. 900 ms, renewed every
    // 300 ms: a 150 ms lease is lost by a renewal 100 ms late on a loaded
    // machine, 900 ms by one 600 ms late; the 1.2 s held outlast it, so a
    // renewal the ACL refused shows.
    let g = a.lock("k").lease(RENEWED_LEASE).acquire().await.unwrap();
    let waiter = tokio::spawn(async move { b.lock("k").acquire().await });
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert!(!g.is_lost());
    g.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    // `inspect` and `inspect_all` read a held lock (docs/operating.md: they
    // need nothing beyond this ACL); inspect_key.lua once counted a
    // counting semaphore's waiters with ZCOUNT, refused here, and every key
    // then read as foreign.
    let held = a.lock("k").acquire().await.unwrap();
    assert!(a.inspect("k").await.unwrap().is_some());
    let state = a.inspect_all("k").await.unwrap();
    assert_eq!(state.holds.len(), 1, "{state:?}");
    held.release().await.unwrap();
    assert_eq!(refused_commands(&mut raw).await, Vec::<String>::new());
}

/// What read-write locks and semaphores add to the least-privilege ACL
/// (docs/deploying.md and `distlock::lock_family` list it): every path of their
/// scripts runs without a refusal.
const SHARED_KINDS: &str = "+zadd +zscore +zrange +zrem +zremrangebyscore +zcard +pexpireat";

#[tokio::test]
async fn read_write_locks_and_semaphores_need_the_listed_sorted_set_commands() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let rules = format!("{} {SHARED_KINDS}", least_privilege(&mut raw).await);
    acl_user(&mut raw, "locker", &rules).await;
    let a = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let b = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let short = std::time::Duration::from_millis(150);
    let r = a.read_lock("k").lease(short).acquire().await.unwrap();
    let writer = tokio::spawn(async move {
        let w = b.write_lock("k").acquire().await.unwrap();
        let p = b.semaphore("s", 1).lease(short).acquire().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        p.release().await.unwrap();
        w.release().await.unwrap();
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!r.is_lost(), "renewed");
    r.release().await.unwrap();
    writer.await.unwrap();
    let p = a.semaphore("s", 1).acquire().await.unwrap();
    assert_eq!(a.semaphore("s", 1).permit_counts().await.unwrap().held, 1);
    p.release().await.unwrap();
    // A weighted acquisition that waits records its weight where releases
    // read it (permit_acquire.lua's record_waiting, on its second attempt):
    // it once asked EXISTS, refused here, after its writes had run.
    let held = a.semaphore("w", 3).weight(2).acquire().await.unwrap();
    let waiting = {
        let a = a.clone();
        tokio::spawn(async move {
            a.semaphore("w", 3)
                .weight(2)
                .wait(std::time::Duration::from_secs(5))
                .acquire()
                .await
        })
    };
    common::await_parked(&a, 1).await;
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
    assert_eq!(refused_commands(&mut raw).await, Vec::<String>::new());
}

/// What counting semaphores add to the least-privilege ACL
/// (`distlock::lock_family` lists it): every path of their scripts runs
/// without a refusal.
const COUNTING_SEMAPHORES: &str = "+incrby +decrby +zcount +zremrangebyscore";

#[tokio::test]
async fn counting_semaphores_need_the_listed_commands() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let rules = format!("{} {COUNTING_SEMAPHORES}", least_privilege(&mut raw).await);
    acl_user(&mut raw, "locker", &rules).await;
    let a = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let b = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let s = a.counting_semaphore("c");
    assert!(s.try_set_permits(0).await.unwrap());
    let waiter = tokio::spawn(async move {
        let s = b.counting_semaphore("c");
        s.try_acquire_within(1, std::time::Duration::from_secs(10))
            .await
            .unwrap()
    });
    let registered = eventually(std::time::Duration::from_secs(5), async || {
        s.counts().await.unwrap().waiters == 1
    })
    .await;
    assert!(registered.is_some(), "the waiter registered");
    s.release(2).await.unwrap();
    assert!(waiter.await.unwrap());
    s.add_permits(-1).await.unwrap();
    s.set_permits(2).await.unwrap();
    assert_eq!(s.drain_permits().await.unwrap(), 2);
    assert!(s.delete().await.unwrap());
    assert_eq!(refused_commands(&mut raw).await, Vec::<String>::new());
}

/// Without a command the scripts need, the refusal is reported as such,
/// not taken for a value distlock did not write.
#[tokio::test]
async fn a_refused_counting_semaphore_command_is_a_backend_error() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let rules = format!("{} +incrby +decrby", least_privilege(&mut raw).await);
    acl_user(&mut raw, "locker", &rules).await;
    let m = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let err = m.counting_semaphore("c").try_acquire(1).await.unwrap_err();
    assert!(
        matches!(&err, LockError::Backend { key, .. } if key == "c"),
        "{err:?}"
    );
}

/// The default lock's queue needs nothing beyond the least-privilege ACL: a
/// queued waiter, its refresh and the hand-off run without a refusal.
#[tokio::test]
async fn queued_waiters_need_nothing_more() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let rules = least_privilege(&mut raw).await;
    acl_user(&mut raw, "locker", &rules).await;
    let a = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let b = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let held = a.lock("f").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = b.lock("f").acquire().await.unwrap();
        g.release().await.unwrap();
    });
    // Past one refresh of the waiter's queue entry.
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    held.release().await.unwrap();
    waiter.await.unwrap();
    assert_eq!(refused_commands(&mut raw).await, Vec::<String>::new());
}

/// The commands Redis refused (its ACL LOG), other than `config|get`, which
/// docs/deploying.md lists as optional: without it the eviction policy is not checked.
async fn refused_commands(raw: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let log: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("ACL").arg("LOG").query_async(raw).await.unwrap();
    log.iter()
        .filter_map(|entry| match entry.get("object") {
            Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
        .filter(|object| object != "config|get")
        .collect()
}

#[tokio::test]
async fn a_missing_permission_is_named_at_build() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let all = least_privilege(&mut raw).await;
    for (missing, instead, named) in [
        ("+evalsha", "", "evalsha"),
        ("+publish", "", "publish"),
        ("+subscribe", "", "subscribe"),
        ("+pexpire", "", "pexpire"),
        ("&distlock:*", "", "channel"),
        // Only the wake-up and events channels: each manager keeps a
        // hand-off channel on the listening connection it shares with
        // waiters and events, which a refusal there would break at each
        // reconnect. Refused at build: the probe's queued acquisition
        // publishes its notice on a hand-off channel.
        (
            "&distlock:*",
            "&distlock:wake:* &distlock:events:*",
            "publish",
        ),
        ("~distlock:*", "", "key"),
    ] {
        let rules = all.replace(missing, instead);
        acl_user(&mut raw, "partial", &rules).await;
        let started = std::time::Instant::now();
        let built = LockManager::builder(&user_url(&redis, "partial"))
            .connect_timeout(std::time::Duration::from_secs(1))
            .command_timeout(std::time::Duration::from_secs(1))
            .build()
            .await;
        match built {
            Err(e @ LockError::ServerCheck { .. }) => {
                println!("without {missing}: {e}");
                let text = e.to_string().to_lowercase();
                assert!(text.contains(named), "without {missing}: {text}");
                // The hint names every command of docs/deploying.md's ACL.
                let (_, commands) = LEAST_PRIVILEGE_BEFORE_7_2
                    .split_once("&distlock:* ")
                    .unwrap();
                assert!(text.contains(commands), "without {missing}: {text}");
                assert!(!text.contains(":pw@"), "the password is redacted: {text}");
            }
            other => panic!("without {missing}: {other:?}"),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(3));
    }
}

/// `build()` names the server it found, and its version, in its debug output,
/// read with `HELLO` (which needs no permission: the least-privilege user's
/// build leaves nothing in the ACL LOG).
#[test]
fn build_names_the_server_and_its_version_at_debug_level() {
    let redis = server();
    let (expected, log) = {
        let mut expected = (String::new(), String::new());
        let log = logged(|| async {
            let mut raw = raw(&redis).await;
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut raw)
                .await
                .unwrap();
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}:")))
                    .map(|v| v.trim().to_owned())
            };
            expected = match field("valkey_version") {
                Some(v) => ("valkey".to_owned(), v),
                None => ("redis".to_owned(), field("redis_version").unwrap()),
            };
            let rules = least_privilege(&mut raw).await;
            acl_user(&mut raw, "locker", &rules).await;
            LockManager::builder(&user_url(&redis, "locker"))
                .build()
                .await
                .unwrap();
            assert_eq!(refused_commands(&mut raw).await, Vec::<String>::new());
        });
        (expected, log)
    };
    let (name, version) = expected;
    assert!(
        log.lines().any(|l| l.contains("DEBUG")
            && l.contains(&format!("server=\"{name}\""))
            && l.contains(&format!("version=\"{version}\""))),
        "{name} {version} not named in:\n{log}"
    );
}

/// A URL that asks for RESP3 (redis-rs's `?protocol=resp3`) gets a manager
/// whose connections all stay on RESP3: the check that `build()` runs on the
/// manager's own connection reads the server's name with `HELLO`, which
/// switches a connection to the protocol it names (`HELLO 2` turned this one
/// to RESP2 under redis-rs). Locks work on it, a wake-up included.
#[tokio::test]
async fn a_resp3_url_keeps_its_connections_on_resp3() {
    let redis = server();
    let url = format!("{}/?protocol=resp3", redis.url());
    let m = LockManager::connect(&url).await.unwrap();
    // The hand-off channel is subscribed in the background of the manager's
    // first acquisition: a hand-off before it is confirmed would be taken
    // uncounted, so the count starts once one was heard.
    await_listening(&m, &m, "resp3:warm-up").await;
    let held = m.lock("resp3").acquire().await.unwrap();
    assert!(held.fencing_token().await.unwrap() > 0);
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move {
            let g = m
                .lock("resp3")
                .wait(std::time::Duration::from_secs(5))
                .acquire()
                .await
                .unwrap();
            g.release().await.unwrap();
        })
    };
    await_waiter(&m, "resp3").await;
    held.release().await.unwrap();
    waiter.await.unwrap();
    assert!(m.wake_ups_delivered() > 0, "the waiter was woken");

    let mut conn = raw(&redis).await;
    assert_clients_on_resp3(&mut conn).await;
}

/// Every client of the server but the caller's own (and, in a cluster, the
/// nodes' links to each other) speaks RESP3.
async fn assert_clients_on_resp3(conn: &mut redis::aio::MultiplexedConnection) {
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(conn)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    let field = |line: &str, name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let clients: Vec<&str> = list
        .lines()
        .filter(|line| {
            let id: i64 = field(line, "id").parse().unwrap_or(0);
            let flags = field(line, "flags");
            id != me && !flags.contains('S') && !flags.contains('M')
        })
        .collect();
    assert!(!clients.is_empty(), "the manager's connections: {list}");
    for client in clients {
        assert_eq!(
            field(client, "resp"),
            "3",
            "a connection of the manager is not on RESP3: {client}"
        );
    }
}

/// The same on a cluster: its check runs on the cluster connection, which
/// speaks the first seed's protocol to every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp3_cluster_url_keeps_its_connections_on_resp3() {
    let cluster = RedisCluster::spawn().unwrap();
    let seeds: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| format!("{url}/?protocol=resp3"))
        .collect();
    let m = LockManager::cluster_builder(seeds).build().await.unwrap();
    let g = m.lock("resp3-cluster").acquire().await.unwrap();
    assert!(g.fencing_token().await.unwrap() > 0);
    g.release().await.unwrap();
    // The check's HELLO went to one node; look at every one.
    for node in cluster.nodes() {
        let mut conn = redis::Client::open(node.url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        assert_clients_on_resp3(&mut conn).await;
    }
}

/// A listening connection whose subscriptions the server now refuses (its
/// user lost the channel permission: Redis closes the subscribed connection,
/// and refuses every SUBSCRIBE after) is made again after a growing delay.
/// Before, each failed resubscription reconnected at once: hundreds of
/// connections a second for as long as the manager lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_resubscription_is_retried_with_a_growing_delay() {
    let redis = server();
    let mut raw = raw(&redis).await;
    let rules = least_privilege(&mut raw).await;
    acl_user(&mut raw, "locker", &rules).await;
    let holder = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    let waiting = LockManager::connect(&user_url(&redis, "locker"))
        .await
        .unwrap();
    // A wait by push: the waiting manager's listening connection subscribes.
    let held = holder.lock("k").acquire().await.unwrap();
    let waiter =
        tokio::spawn(async move { waiting.lock("k").acquire().await.map(|g| (g, waiting)) });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let (guard, waiting) = waiter.await.unwrap().unwrap();
    guard.release().await.unwrap();
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "locker", "resetchannels"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let before = connections_received(&mut raw).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let made = connections_received(&mut raw).await - before;
    // Delays of 50, 100, 200, 400, 800 ms: about six attempts in 2 s for
    // each of the two managers (both listen); hundreds without the delay.
    assert!(made <= 20, "{made} connections in 2 s");
    drop(waiting);
}
