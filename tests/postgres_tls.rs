//! TLS to PostgreSQL (`sslmode=require`; the `postgres` and `tls` features)
//! on a private server that admits TCP clients over TLS only
//! (`PostgresServer::builder().tls(true)`: `ssl = on`, `hostssl` lines only),
//! so that a manager that works there spoke TLS on every connection.
//!
//! Run with `cargo test -p distlock --features postgres,tls --test postgres_tls`.

use std::time::{Duration, Instant};

use distlock::{BackendErrorKind, LockError, LockManager};
use distlock_testing::PostgresServer;

fn tls_server() -> PostgresServer {
    PostgresServer::builder()
        .tls(true)
        .start()
        .expect("a private PostgreSQL with TLS (initdb, pg_ctl)")
}

fn require(pg: &PostgresServer) -> String {
    format!("{}&sslmode=require", pg.url())
}

fn ca(pg: &PostgresServer) -> Vec<u8> {
    pg.ca_cert_pem().expect("a TLS server's CA").to_vec()
}

async fn manager(pg: &PostgresServer) -> LockManager {
    LockManager::builder(&require(pg))
        .tls_ca_pem(ca(pg))
        .build()
        .await
        .expect("a manager over TLS")
}

/// `psql` of the fixture, off the runtime's worker (it blocks).
fn psql(pg: &PostgresServer, sql: &str) -> String {
    tokio::task::block_in_place(|| pg.psql(sql)).expect(sql)
}

/// The (application name, ssl) of every distlock session, from the server's
/// own view: `pg_stat_ssl` joined with `pg_stat_activity`.
fn sessions(pg: &PostgresServer) -> Vec<String> {
    psql(
        pg,
        "SELECT a.application_name || '|' || s.ssl FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE 'distlock%' \
         AND a.application_name <> 'distlock-testing' ORDER BY 1",
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

/// The build error of a manager on `url` trusting `ca` (the system's roots
/// when `None`).
async fn build_error(url: &str, ca: Option<Vec<u8>>) -> LockError {
    let mut builder = LockManager::builder(url);
    if let Some(ca) = ca {
        builder = builder.tls_ca_pem(ca);
    }
    match builder.build().await {
        Ok(_) => panic!("a manager was built on {url}"),
        Err(e) => e,
    }
}

/// `m` holds "job" while a waiter of `other` queues for it, then lets go:
/// the waiter's guard, and whether `other` counted a hand-off message.
async fn hand_off(
    pg: &PostgresServer,
    m: &LockManager,
    other: &LockManager,
) -> (distlock::LockGuard, bool) {
    let holder = m.lock("job").acquire().await.unwrap();
    assert!(other.lock("job").try_acquire().await.unwrap().is_none());
    let waiting = other.clone();
    let waiter = tokio::spawn(async move {
        waiting
            .lock("job")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    // The waiter is queued before the holder lets go, so that its grant is a
    // hand-off, not a retry.
    let start = Instant::now();
    while psql(pg, "SELECT count(*) FROM distlock.waiters") != "1" {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let heard_before = other.wake_ups_delivered();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter is served")
        .unwrap()
        .unwrap();
    (guard, other.wake_ups_delivered() > heard_before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_manager_over_tls_acquires_hands_off_and_releases() {
    let pg = tls_server();
    let m = manager(&pg).await;
    let other = manager(&pg).await;

    // A hand-off is heard by `other`'s listening connection only once it
    // listens on its hand-off channel, which a fresh manager starts in the
    // background of its first acquisition (a hand-off before that comes in
    // on the wake that follows the subscription, uncounted); and a queued
    // waiter's entry refresh (every 0.4-0.8 s) in flight at the hand-off may
    // take the lock before the message is heard, which then counts nothing.
    // Up to three rounds, one of which must count the hand-off.
    let mut counted = None;
    for _ in 0..3 {
        let (guard, heard) = hand_off(&pg, &m, &other).await;
        if heard {
            counted = Some(guard);
            break;
        }
        guard.release().await.unwrap();
    }
    let guard = counted.expect("the grant came as a hand-off message in no round");

    // Both managers' data and listening connections, seen by the server, are
    // TLS sessions.
    let seen = sessions(&pg);
    assert!(
        seen.iter().any(|s| s == "distlock|true")
            && seen.iter().any(|s| s == "distlock-listen|true"),
        "{seen:?}"
    );
    assert!(seen.iter().all(|s| s.ends_with("|true")), "{seen:?}");

    guard.release().await.unwrap();
    assert!(!m.is_locked("job").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_server_certificate_the_manager_does_not_trust_is_refused() {
    let pg = tls_server();
    let stranger = tls_server();
    // Signed by another CA, and by none of the system's roots.
    for trusted in [Some(ca(&stranger)), None] {
        match build_error(&require(&pg), trusted.clone()).await {
            LockError::Connect { source, .. } => {
                let message = source.to_string();
                assert!(message.contains("TLS"), "{message}");
                // UnknownIssuer under the system's roots; BadSignature under
                // the other CA, whose name is the same as the signer's.
                assert!(message.contains("invalid peer certificate"), "{message}");
            }
            other => panic!("expected Connect, got {other:?}"),
        }
    }
    // The right CA, but a name the certificate is not for (it is for
    // localhost and 127.0.0.1): `hostaddr` reaches the same server.
    let url = format!(
        "postgresql://postgres@db.invalid:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full",
        pg.port()
    );
    match build_error(&url, Some(ca(&pg))).await {
        LockError::Connect { source, .. } => {
            let message = source.to_string();
            assert!(message.contains("TLS"), "{message}");
            assert!(message.contains("not valid for name"), "{message}");
        }
        other => panic!("expected Connect, got {other:?}"),
    }
    // `localhost`, a name on the certificate, is accepted.
    let url = format!(
        "postgresql://postgres@localhost:{}/postgres?sslmode=verify-full",
        pg.port()
    );
    let m = LockManager::builder(&url)
        .tls_ca_pem(ca(&pg))
        .build()
        .await
        .expect("localhost is on the certificate");
    assert!(m.lock("named").try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_plain_connection_to_a_tls_only_server_is_refused() {
    let pg = tls_server();
    // Without certificates, the default (prefer) stays plain, as does disable.
    for url in [pg.url(), format!("{}&sslmode=disable", pg.url())] {
        match build_error(&url, None).await {
            LockError::Connect { source, .. } => {
                let message = source.to_string();
                assert!(message.contains("no encryption"), "{url}: {message}");
                assert_eq!(source.kind(), BackendErrorKind::Auth, "{url}: {message}");
            }
            other => panic!("{url}: expected Connect, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_prefer_with_a_ca_falls_back_to_plain_on_a_server_without_tls() {
    let plain = PostgresServer::start().expect("a private PostgreSQL");
    let tls = tls_server();
    // Certificates make the default `prefer` try TLS; a server without it
    // answers so, and the session goes on plain, as libpq's would.
    let m = LockManager::builder(&plain.url())
        .tls_ca_pem(ca(&tls))
        .build()
        .await
        .expect("a manager on a server without TLS");
    let guard = m.lock("job").acquire().await.unwrap();
    let seen = sessions(&plain);
    assert!(seen.contains(&"distlock|false".to_owned()), "{seen:?}");
    assert!(seen.iter().all(|s| s.ends_with("|false")), "{seen:?}");
    guard.release().await.unwrap();
    // sslmode=require there is refused, naming TLS.
    match build_error(&format!("{}&sslmode=require", plain.url()), Some(ca(&tls))).await {
        LockError::Connect { source, .. } => {
            assert!(source.to_string().contains("TLS"), "{source}")
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

/// A guard dropped as its runtime ends is released over a TLS connection of
/// its own: the server admits no other, and the lease (30 s) would otherwise
/// still hold the lock.
#[test]
fn a_hold_dropped_as_the_runtime_ends_is_released_over_tls() {
    let pg = tls_server();
    let (url, ca) = (require(&pg), ca(&pg));
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let rt = runtime();
    rt.block_on(async {
        let m = LockManager::builder(&url)
            .tls_ca_pem(ca.clone())
            .build()
            .await
            .unwrap();
        let _g = m
            .lock("job")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
    });
    drop(rt);
    runtime().block_on(async {
        let m = LockManager::builder(&url)
            .tls_ca_pem(ca)
            .build()
            .await
            .unwrap();
        assert!(!m.is_locked("job").await.unwrap());
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_server_that_asks_for_a_client_certificate_gets_the_builders() {
    let pg = PostgresServer::builder()
        .tls_client_certificates(true)
        .start()
        .expect("a private PostgreSQL with TLS and client certificates");
    let (cert, key) = pg.client_identity().expect("a client certificate");
    let m = LockManager::builder(&require(&pg))
        .tls_ca_pem(ca(&pg))
        .tls_client_identity(cert.to_vec(), key.to_vec())
        .build()
        .await
        .expect("a manager presenting the client certificate");
    let guard = m.lock("job").acquire().await.unwrap();
    let seen = sessions(&pg);
    assert!(seen.contains(&"distlock|true".to_owned()), "{seen:?}");
    guard.release().await.unwrap();
    // Without one, the server refuses the session.
    match build_error(&require(&pg), Some(ca(&pg))).await {
        LockError::Connect { source, .. } => {
            let message = source.to_string();
            assert!(message.contains("certificate"), "{message}");
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}
