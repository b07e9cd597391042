//! TLS (`rediss://`) and passwords: every connection distlock opens works through
//! them (the multiplexed connection, the pub/sub subscriber, the blocking release
//! at runtime shutdown), and what is wrong fails `build()` with a clear error in
//! bounded time. ACL users: `tests/server_checks.rs`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use distlock::testing::RedisServer;
use distlock::{LockError, LockManager};

fn tls_server() -> RedisServer {
    RedisServer::builder().tls(true).spawn().unwrap()
}

async fn tls_manager(redis: &RedisServer) -> LockManager {
    LockManager::builder(&redis.url())
        .tls_ca_pem(redis.ca_cert_pem().unwrap())
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_wait_renew_and_release_over_tls() {
    let redis = tls_server();
    assert!(redis.url().starts_with("rediss://"));
    let a = tls_manager(&redis).await;
    let b = tls_manager(&redis).await;
    // Renewal over TLS: held past its lease. 900 ms, renewed every 300 ms:
    // a 150 ms lease is lost by a renewal 100 ms late on a loaded machine,
    // 900 ms by one 600 ms late. 1.2 s outlasts it, so a renewal that failed
    // shows.
    let g = a.lock("k").lease(RENEWED_LEASE).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!g.is_lost(), "renewal over TLS kept the lease");
    g.release().await.unwrap();

    // Waiting over TLS: b's subscriber is a TLS pub/sub connection.
    let g = a
        .lock("k")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let channel = a.redis_names("k").channel().to_owned();
    let waiter =
        tokio::spawn(async move { b.lock("k").wait(Duration::from_secs(10)).acquire().await });
    let mut raw = raw(&redis).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while numsub(&mut raw, &channel).await == 0 {
        assert!(Instant::now() < deadline, "the waiter never subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    g.release().await.unwrap();
    let g2 = waiter.await.unwrap().unwrap();
    assert!(g2.fencing_token().await.unwrap() > 0);
    g2.release().await.unwrap();
    assert!(!exists(&mut raw, &a.redis_names("k").lock).await);
}

#[test]
fn a_guard_dropped_at_runtime_shutdown_is_released_over_tls() {
    let redis = tls_server();
    // The runtime ends: the release goes over a blocking TLS connection.
    let lock_key = lock_held_as_runtime_ends(|| tls_manager(&redis));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut raw = raw(&redis).await;
        assert!(
            pttl(&mut raw, &lock_key).await < 0,
            "the lock outlived the runtime"
        );
    });
}

#[tokio::test]
async fn an_untrusted_certificate_fails_build_with_connect_naming_the_url() {
    let redis = RedisServer::builder()
        .tls(true)
        .password("s3cret")
        .spawn()
        .unwrap();
    let started = Instant::now();
    // No CA given: the system's roots do not know the test CA.
    let built = LockManager::builder(&redis.url())
        .connect_timeout(Duration::from_secs(1))
        .build()
        .await;
    let took = started.elapsed();
    match built {
        Err(e @ LockError::Connect { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&format!("127.0.0.1:{}", redis.port())),
                "{text}"
            );
            assert!(text.contains("rediss://"), "{text}");
            assert!(!text.contains("s3cret"), "the password is redacted: {text}");
        }
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test]
async fn the_insecure_url_form_skips_the_certificate_check() {
    let redis = tls_server();
    let url = format!("{}/#insecure", redis.url());
    let m = LockManager::connect(&url).await.unwrap();
    m.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn passwords_work_and_a_missing_or_wrong_one_fails_build() {
    let redis = RedisServer::builder().password("s3cret").spawn().unwrap();
    // redis://:pw@host
    let m = LockManager::connect(&redis.url()).await.unwrap();
    m.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // redis://user:pw@host, for the default user
    let with_user = redis.url().replace("://:", "://default:");
    let m = LockManager::connect(&with_user).await.unwrap();
    m.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    for url in [
        redis.url_without_password(),
        redis.url().replace("s3cret", "wrong"),
    ] {
        let started = Instant::now();
        match LockManager::connect(&url).await {
            Err(e @ LockError::Connect { .. }) => {
                let text = e.to_string();
                assert!(
                    text.to_lowercase().contains("auth") || text.contains("WRONGPASS"),
                    "{text}"
                );
                assert!(!text.contains("wrong@"), "{text}");
            }
            other => panic!("{url}: {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}

/// `(cmd, flags)` of each command connection (not pub/sub, not MONITOR) but
/// the caller's, from `CLIENT LIST`: `cmd=NULL` for one that never ran a
/// command.
async fn command_clients(raw: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(raw)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    let field = |line: &str, name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_default()
            .to_owned()
    };
    list.lines()
        .filter(|line| field(line, "id") != me.to_string())
        .filter(|line| field(line, "sub") == "0" && field(line, "psub") == "0")
        .filter(|line| !field(line, "flags").contains('O'))
        .map(|line| field(line, "cmd"))
        .collect()
}

/// Over verified TLS the direct lane opens its own TLS session (trusting
/// the builder's CA) and carries calls: the manager's second command
/// connection runs lock scripts. With `#insecure` (which the lane does not
/// speak) there is no second connection.
#[tokio::test]
async fn the_direct_lane_opens_over_tls_and_carries_calls() {
    let redis = tls_server();
    let mut raw = raw(&redis).await;
    let m = tls_manager(&redis).await;
    let opened = eventually(Duration::from_secs(5), async || {
        open_every_connection(&m).await;
        // The listening connection counts as a command client until it has
        // subscribed: the count is read once it has.
        !pubsub_channels(&mut raw).await.is_empty() && command_clients(&mut raw).await.len() == 2
    })
    .await;
    assert!(
        opened.is_some(),
        "the direct lane never opened over TLS: {:?}",
        command_clients(&mut raw).await
    );
    // One task, one call at a time: each finds the lane idle and takes it.
    for i in 0..20 {
        let g = m.lock(format!("k:{i}")).acquire().await.unwrap();
        g.release().await.unwrap();
    }
    let clients = command_clients(&mut raw).await;
    assert_eq!(clients.len(), 2, "{clients:?}");
    assert!(
        clients.iter().all(|cmd| cmd != "NULL" && !cmd.is_empty()),
        "a command connection never ran a command: {clients:?}"
    );
    assert_eq!(all_keys(&mut raw).await, Vec::<String>::new());
    drop(m);

    let insecure = LockManager::connect(&format!("{}/#insecure", redis.url()))
        .await
        .unwrap();
    for i in 0..5 {
        let g = insecure.lock(format!("k:{i}")).acquire().await.unwrap();
        g.release().await.unwrap();
    }
    // Its listening connection counts as a command client until it has
    // subscribed: wait for that too.
    let g = insecure.lock("k:listen").acquire().await.unwrap();
    await_holder_listening(&mut raw, &insecure, "k:listen").await;
    g.release().await.unwrap();
    // The first manager's connections close in the background: wait for
    // them, then only the insecure manager's one command connection is left.
    let one = eventually(Duration::from_secs(5), async || {
        command_clients(&mut raw).await.len() == 1
    })
    .await;
    assert!(
        one.is_some(),
        "an #insecure URL opened a direct lane: {:?}",
        command_clients(&mut raw).await
    );
    for i in 0..5 {
        let g = insecure.lock(format!("k:{i}")).acquire().await.unwrap();
        g.release().await.unwrap();
    }
    assert_eq!(command_clients(&mut raw).await.len(), 1);
}
