//! Feature `metrics`: a debugging recorder sees the right counts for a scripted
//! scenario (a grant, a busy attempt, a timeout, a loss, a force-unlock, releases) and the
//! histograms and gauge move with them; a `#[distributed_lock]` function's
//! metrics carry its key template as the `lock` label. Run with
//! `cargo test -p distlock --features metrics --test metrics`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use distlock::{distributed_lock, LockError, LockManager};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[test]
fn a_scripted_scenario_is_counted() {
    let redis = server();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A local recorder sees what this thread records: a current-thread runtime
    // runs every task of the managers on it.
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let a = manager(&redis).await;
            let b = manager(&redis).await;
            // Granted, then a busy attempt and a timed-out wait by another manager.
            let held = a.lock("m:1").acquire().await.unwrap();
            assert!(b.lock("m:1").try_acquire().await.unwrap().is_none());
            let timed_out = b
                .lock("m:1")
                .wait(Duration::from_millis(50))
                .acquire()
                .await;
            assert!(matches!(timed_out, Err(LockError::Timeout { .. })));
            held.release().await.unwrap();
            // Granted after a wait: a waiter woken by a release.
            let held = a.lock("m:2").acquire().await.unwrap();
            let waiter = tokio::spawn({
                let b = b.clone();
                async move { b.lock("m:2").wait(Duration::from_secs(5)).acquire().await }
            });
            tokio::time::sleep(Duration::from_millis(30)).await;
            held.release().await.unwrap();
            drop(waiter.await.unwrap().unwrap());
            // A loss: the lock deleted under its holder.
            let doomed = a
                .lock("m:3")
                .lease(Duration::from_millis(300))
                .acquire()
                .await
                .unwrap();
            del(&mut raw(&redis).await, &a.redis_names("m:3").lock).await;
            tokio::time::timeout(Duration::from_secs(2), doomed.lost())
                .await
                .unwrap();
            assert!(matches!(
                doomed.release().await,
                Err(LockError::Lost { .. })
            ));
            // A force-unlock: the holder learns it at its next renewal.
            let forced = a
                .lock("m:4")
                .lease(Duration::from_millis(300))
                .acquire()
                .await
                .unwrap();
            assert!(b.force_unlock("m:4").await.unwrap());
            tokio::time::timeout(Duration::from_secs(2), forced.lost())
                .await
                .unwrap();
            assert!(matches!(
                forced.release().await,
                Err(LockError::Lost { .. })
            ));
            // Let the background release of the dropped guard run.
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
    });

    let mut counters = HashMap::new();
    let mut histograms = HashMap::new();
    let mut gauges = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        match value {
            DebugValue::Counter(n) => {
                counters.insert(name, n);
            }
            DebugValue::Histogram(values) => {
                histograms.insert(name, values.len());
            }
            DebugValue::Gauge(v) => {
                gauges.insert(name, v.into_inner());
            }
        }
    }
    assert_eq!(
        counters.get("distlock_acquired_total"),
        Some(&5),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("distlock_force_unlocked_total"),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("distlock_busy_total"),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("distlock_timeouts_total"),
        Some(&1),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("distlock_lost_total"),
        Some(&2),
        "{counters:?}"
    );
    assert_eq!(
        counters.get("distlock_released_total"),
        Some(&5),
        "{counters:?}"
    );
    assert_eq!(
        histograms.get("distlock_wait_seconds"),
        Some(&5),
        "{histograms:?}"
    );
    assert_eq!(
        histograms.get("distlock_hold_seconds"),
        Some(&5),
        "{histograms:?}"
    );
    assert!(histograms
        .get("distlock_round_trip_seconds")
        .is_some_and(|n| *n >= 5));
    // Every hold ended: the gauge is back at zero.
    assert_eq!(gauges.get("distlock_held_locks"), Some(&0.0), "{gauges:?}");
}

#[test]
fn renewals_report_their_lag() {
    let redis = server();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let m = manager(&redis).await;
            // 900 ms, renewed every 300 ms: a 150 ms lease is lost by a
            // renewal 100 ms late on a loaded machine, 900 ms by one 600 ms
            // late.
            let g = m.lock("lag").lease(RENEWED_LEASE).acquire().await.unwrap();
            tokio::time::sleep(Duration::from_millis(1300)).await;
            assert!(!g.is_lost());
            g.release().await.unwrap();
        });
    });
    let lags: Vec<f64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "distlock_renewal_lag_seconds")
        .flat_map(|(.., value)| match value {
            DebugValue::Histogram(values) => values.into_iter().map(|v| v.into_inner()).collect(),
            _ => Vec::new(),
        })
        .collect();
    // Renewed every 300 ms for 1.3 s: four renewals, three if one came
    // late. Each lag is in seconds and under the 300 ms interval (a renewal
    // that late still keeps the lease); a lag counted in milliseconds would
    // exceed it for any renewal 0.3 ms late.
    assert!(lags.len() >= 3, "{lags:?}");
    assert!(lags.iter().all(|lag| *lag < 0.3), "{lags:?}");
}

#[distributed_lock(key = "order:{order_id}", wait = "0s", manager = m)]
async fn ship(m: &LockManager, order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock(key = "capped", lease = "100ms", max_hold = "150ms", manager = m)]
async fn stuck(m: &LockManager) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

#[test]
fn a_locked_function_labels_its_metrics_with_the_key_template() {
    let redis = server();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let m = manager(&redis).await;
            // Two keys of one template: one series.
            ship(&m, 1).await.unwrap();
            ship(&m, 2).await.unwrap();
            // Held by a manual request (unlabelled): the function times out.
            let held = m.lock("order:9").acquire().await.unwrap();
            assert!(matches!(ship(&m, 9).await, Err(LockError::Timeout { .. })));
            held.release().await.unwrap();
            // A manual request with a label of its own.
            m.lock("nightly:2026-11-23")
                .metrics_label("nightly")
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
            // A hold ended by max_hold is lost under its template.
            assert!(matches!(stuck(&m).await, Err(LockError::Lost { .. })));
        });
    });

    // (name, lock label) -> counter value, number of histogram samples, or gauge value.
    let mut seen: HashMap<(String, Option<String>), f64> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<_> = key.labels().collect();
        assert!(
            labels.iter().all(|l| l.key() == "lock"),
            "only the lock label: {key:?}"
        );
        let lock = labels.first().map(|l| l.value().to_owned());
        if let Some(lock) = &lock {
            // Templates and fixed names, never a formatted key.
            assert!(
                ["order:{order_id}", "capped", "nightly"].contains(&lock.as_str()),
                "{key:?}"
            );
        }
        let v = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Histogram(values) => values.len() as f64,
            DebugValue::Gauge(v) => v.into_inner(),
        };
        seen.insert((key.name().to_owned(), lock), v);
    }
    let get = |name: &str, lock: Option<&str>| {
        seen.get(&(name.to_owned(), lock.map(str::to_owned)))
            .copied()
    };
    let order = Some("order:{order_id}");
    assert_eq!(get("distlock_acquired_total", order), Some(2.0), "{seen:?}");
    assert_eq!(get("distlock_released_total", order), Some(2.0), "{seen:?}");
    assert_eq!(get("distlock_wait_seconds", order), Some(2.0), "{seen:?}");
    assert_eq!(get("distlock_hold_seconds", order), Some(2.0), "{seen:?}");
    assert_eq!(get("distlock_held_locks", order), Some(0.0), "{seen:?}");
    assert_eq!(get("distlock_timeouts_total", order), Some(1.0), "{seen:?}");
    // The manual request without a label: the same metrics, unlabelled.
    assert_eq!(get("distlock_acquired_total", None), Some(1.0), "{seen:?}");
    assert_eq!(get("distlock_released_total", None), Some(1.0), "{seen:?}");
    assert_eq!(get("distlock_held_locks", None), Some(0.0), "{seen:?}");
    assert_eq!(get("distlock_timeouts_total", None), None, "{seen:?}");
    // A label set by hand.
    assert_eq!(get("distlock_acquired_total", Some("nightly")), Some(1.0));
    assert_eq!(get("distlock_released_total", Some("nightly")), Some(1.0));
    // Lost by max_hold, then released (the release reports the loss).
    assert_eq!(
        get("distlock_lost_total", Some("capped")),
        Some(1.0),
        "{seen:?}"
    );
    assert_eq!(get("distlock_released_total", Some("capped")), Some(1.0));
    assert_eq!(get("distlock_held_locks", Some("capped")), Some(0.0));
    assert_eq!(get("distlock_lost_total", None), None, "{seen:?}");
    // The connection's histograms stay unlabelled.
    assert!(get("distlock_round_trip_seconds", None).is_some_and(|n| n >= 6.0));
    assert!(seen
        .keys()
        .filter(|(name, _)| name == "distlock_round_trip_seconds"
            || name == "distlock_renewal_lag_seconds")
        .all(|(_, lock)| lock.is_none()));
}

/// The gauge's value for `name` with `lock = label` in `snapshotter`'s view.
fn gauge_value(
    snapshotter: &metrics_util::debugging::Snapshotter,
    name: &str,
    label: &str,
) -> Option<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| {
            let key = key.key();
            let labelled = key
                .labels()
                .any(|l| l.key() == "lock" && l.value() == label);
            match value {
                DebugValue::Gauge(v) if key.name() == name && labelled => Some(v.into_inner()),
                _ => None,
            }
        })
}

#[test]
fn waiting_acquisitions_are_gauged_per_label() {
    let redis = server();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let seen = std::cell::Cell::new(0.0);
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let a = manager(&redis).await;
            let b = manager(&redis).await;
            let held = a
                .lock("w:1")
                .metrics_label("w:{id}")
                .acquire()
                .await
                .unwrap();
            let mut waiters = Vec::new();
            for _ in 0..2 {
                let b = b.clone();
                waiters.push(tokio::spawn(async move {
                    b.lock("w:1")
                        .metrics_label("w:{id}")
                        .wait(Duration::from_secs(5))
                        .acquire()
                        .await
                        .unwrap()
                        .release()
                        .await
                        .unwrap()
                }));
            }
            // Both waiters are counted once they wait. (A snapshot hands over
            // what a gauge moved since the last one, so the readings add up.)
            let counted = eventually(Duration::from_secs(5), async || {
                let now = gauge_value(&snapshotter, "distlock_waiting_acquisitions", "w:{id}");
                seen.set(seen.get() + now.unwrap_or(0.0));
                seen.get() == 2.0
            })
            .await;
            assert!(counted.is_some(), "gauge at {}", seen.get());
            held.release().await.unwrap();
            for waiter in waiters {
                waiter.await.unwrap();
            }
        });
    });
    // Every waiter was granted: the gauge is back at zero.
    let rest = gauge_value(&snapshotter, "distlock_waiting_acquisitions", "w:{id}");
    assert_eq!(seen.get() + rest.unwrap_or(0.0), 0.0);
}

#[test]
fn distinct_labels_are_capped() {
    // The cap counts every label the process reported, so this test runs in a
    // process of its own (this binary again, running only this test), where it
    // cannot push the other tests' labels over the cap.
    if std::env::var_os("DISTLOCK_LABEL_CAP_CHILD").is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["distinct_labels_are_capped", "--exact", "--test-threads=1"])
            .env("DISTLOCK_LABEL_CAP_CHILD", "1")
            .status()
            .unwrap();
        assert!(
            status.success(),
            "the label cap test failed in its own process"
        );
        return;
    }
    let redis = server();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let a = manager(&redis).await;
            // Labels made at run time, more than the cap (the cap counts every
            // label this process reported, other tests' included).
            for i in 0..distlock::MAX_METRIC_LABELS + 20 {
                let label: &'static str = Box::leak(format!("made:{i}").into_boxed_str());
                a.lock(format!("c:{i}"))
                    .metrics_label(label)
                    .acquire()
                    .await
                    .unwrap()
                    .release()
                    .await
                    .unwrap();
            }
        });
    });
    let labels: std::collections::HashSet<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "distlock_acquired_total")
        .flat_map(|(key, ..)| {
            key.key()
                .labels()
                .filter(|l| l.key() == "lock")
                .map(|l| l.value().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        labels.len() <= distlock::MAX_METRIC_LABELS + 1,
        "{}",
        labels.len()
    );
    assert!(labels.contains("other"));
}
