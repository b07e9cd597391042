//! Fencing tokens grow with every fresh acquisition, also across a Redis restart.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn a_thousand_acquisitions_strictly_increase() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let mut last = 0;
    for i in 0..1000 {
        let m = if i % 2 == 0 { &a } else { &b };
        let g = m.lock("k").acquire().await.unwrap();
        assert!(
            g.fencing_token().await.unwrap() > last,
            "{} after {last}",
            g.fencing_token().await.unwrap()
        );
        last = g.fencing_token().await.unwrap();
        g.release().await.unwrap();
    }
}

#[tokio::test]
async fn tokens_keep_increasing_after_redis_restarts_empty() {
    let mut redis = server();
    let a = manager(&redis).await;
    let mut highest = 0;
    for _ in 0..200 {
        let g = a.lock("k").acquire().await.unwrap();
        highest = highest.max(g.fencing_token().await.unwrap());
        g.release().await.unwrap();
    }
    // Push the counter ahead as far as it can get, then lose it.
    redis.stop().unwrap();
    redis.start().unwrap();
    let mut raw = raw(&redis).await;
    assert!(all_keys(&mut raw).await.is_empty(), "restarted empty");
    let g = eventually(Duration::from_secs(5), async || {
        a.lock("k").try_acquire().await.is_ok()
    })
    .await
    .map(|_| ());
    assert!(g.is_some(), "manager reconnects");
    let g = a.lock("k").acquire().await.unwrap();
    assert!(
        g.fencing_token().await.unwrap() > highest,
        "{} <= {highest}",
        g.fencing_token().await.unwrap()
    );
    g.release().await.unwrap();
}

#[tokio::test]
async fn reentry_shares_the_token_and_new_holders_get_new_ones() {
    let redis = server();
    let a = manager(&redis).await;
    let g = a.lock("k").acquire().await.unwrap();
    let t = g.fencing_token().await.unwrap();
    let inner = g
        .scope(async {
            a.lock("k")
                .acquire()
                .await
                .unwrap()
                .fencing_token()
                .await
                .unwrap()
        })
        .await;
    assert_eq!(inner, t);
    g.release().await.unwrap();
    let g2 = a.lock("k").acquire().await.unwrap();
    assert!(g2.fencing_token().await.unwrap() > t);
    // Keys have independent counters but all are time-based, so all are large.
    let other = a.lock("other").acquire().await.unwrap();
    assert!(other.fencing_token().await.unwrap() > 1_600_000_000_000_000);
}

/// Tokens strictly grow across holders of two managers, re-entry shares the
/// hold's token, and keys are independent locks, on every store.
async fn tokens_grow_and_reentry_shares_them(d: Deployment) {
    let a = d.manager().await;
    let b = d.manager().await;
    let mut last = 0;
    for i in 0..100 {
        let m = if i % 2 == 0 { &a } else { &b };
        let g = m.lock("grow").acquire().await.unwrap();
        let token = g.fencing_token().await.unwrap();
        assert!(token > last, "{token} after {last}");
        // Asked again, the same hold's token.
        assert_eq!(g.fencing_token().await.unwrap(), token);
        last = token;
        g.release().await.unwrap();
    }
    let g = a.lock("grow").acquire().await.unwrap();
    let t = g.fencing_token().await.unwrap();
    let inner = g
        .scope(async {
            let inner = a.lock("grow").acquire().await.unwrap();
            inner.fencing_token().await.unwrap()
        })
        .await;
    assert_eq!(inner, t);
    assert_eq!(b.inspect("grow").await.unwrap().unwrap().fencing_token, t);
    g.release().await.unwrap();
    let g2 = b.lock("grow").acquire().await.unwrap();
    assert!(g2.fencing_token().await.unwrap() > t);
    g2.release().await.unwrap();
}

on_stores!(tokens_grow_and_reentry_shares_them);
