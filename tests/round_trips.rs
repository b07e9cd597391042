//! Counts that do not drift: one round trip to acquire, one to release.

mod common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;

/// Collects the client commands (not those a script runs) MONITOR shows until
/// the marker `end` arrives, without the `CLIENT SETINFO` that redis-rs sends
/// when it opens a connection to a server that knows the command (Redis 7.2
/// and later, every Valkey): here, the test's own connection that sends the
/// marker.
async fn client_commands_until(
    lines: &mut (impl futures_util::Stream<Item = String> + Unpin),
    end: &str,
) -> Vec<String> {
    let mut commands = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(5), lines.next())
        .await
        .expect("monitor output")
    {
        if line.contains(end) {
            break;
        }
        if !line.contains(" lua]") && !line.contains("\"CLIENT\" \"SETINFO\"") {
            commands.push(line);
        }
    }
    commands
}

/// MONITOR shows every command a client sends, and the commands a script runs
/// tagged `lua`; only the former are round trips.
#[tokio::test]
async fn an_uncontended_cycle_is_two_round_trips() {
    let redis = server();
    let m = manager(&redis).await;
    // Warm-up: the first use loads the scripts (NOSCRIPT, SCRIPT LOAD).
    m.lock("warm-up")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let client = redis::Client::open(redis.url()).unwrap();
    let monitor = client.get_async_monitor().await.unwrap();
    let mut lines = monitor.into_on_message::<String>();
    for i in 0..100 {
        let g = m
            .lock(format!("fresh:{i}"))
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let mut raw = raw(&redis).await;
    let _: String = redis::cmd("ECHO")
        .arg("end-of-cycles")
        .query_async(&mut raw)
        .await
        .unwrap();

    // Per cycle: the plain `SET NX PX GET` that takes the lock, then the
    // release script.
    let round_trips = client_commands_until(&mut lines, "end-of-cycles").await;
    assert_eq!(round_trips.len(), 200, "{round_trips:#?}");
    for cycle in round_trips.chunks(2) {
        assert!(cycle[0].contains("\"SET\""), "{cycle:#?}");
        assert!(cycle[1].contains("\"EVALSHA\""), "{cycle:#?}");
    }
}

/// Re-entry is decided from the call chain's context: no round trip at all.
#[tokio::test]
async fn reentry_costs_no_round_trip() {
    let redis = server();
    let m = manager(&redis).await;
    let outer = m.lock("k").acquire().await.unwrap();

    let client = redis::Client::open(redis.url()).unwrap();
    let mut lines = client
        .get_async_monitor()
        .await
        .unwrap()
        .into_on_message::<String>();
    outer
        .scope(async {
            for _ in 0..10 {
                let inner = m.lock("k").acquire().await.unwrap();
                inner.release().await.unwrap();
            }
        })
        .await;
    let mut raw = raw(&redis).await;
    let _: String = redis::cmd("ECHO")
        .arg("end-of-reentry")
        .query_async(&mut raw)
        .await
        .unwrap();
    let commands = client_commands_until(&mut lines, "end-of-reentry").await;
    assert!(commands.is_empty(), "{commands:#?}");
    outer.release().await.unwrap();
}

/// Redis commands per uncontended cycle of one key, scripts' own included:
/// `SET NX PX GET` to take it, and the release script (EVALSHA, GET, DEL): 4,
/// rslock's count. Nobody waited, so the release publishes nothing and reads
/// no queue; no token was asked for, so no fencing counter is read or written.
#[tokio::test]
async fn an_uncontended_cycle_is_four_redis_commands() {
    let redis = server();
    let m = manager(&redis).await;
    m.lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut raw = raw(&redis).await;
    reset_stats(&mut raw).await;
    for _ in 0..100 {
        let g = m
            .lock("k")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        g.release().await.unwrap();
    }
    let calls = command_calls(&mut raw).await;
    assert_eq!(calls.values().sum::<u64>(), 400, "{calls:#?}");
    assert_eq!(calls.get("set"), Some(&100), "{calls:#?}");
    assert_eq!(calls.get("evalsha"), Some(&100), "{calls:#?}");
    assert_eq!(calls.get("publish"), None, "{calls:#?}");
    assert_eq!(calls.get("time"), None, "{calls:#?}");
}
