//! Regressions found in review: each of these failed before its fix.

// Spawning from inside a scope returns a JoinHandle on purpose: the spawn is what
// captures the scope's held locks.
#![allow(clippy::async_yields_async)]

mod common;

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::*;
use distlock::LockError;

/// Polls `fut` exactly once, then drops it (a cancellation at its first
/// `Pending`, as `select!`/`timeout`/`abort` do).
async fn poll_once_then_drop<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| {
        Poll::Ready(match fut.as_mut().poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

// ---------------------------------------------------------------------------
// F1: a cancelled `release()` leaks the lock for the whole lease.
// ---------------------------------------------------------------------------

/// `release()` marks the lease released and stops its renewal before sending
/// the script; if the future is dropped at that first `Pending` the redis
/// pipeline skips the queued command (its reply receiver is gone), and `Drop`
/// sees `released == true`, so nobody ever releases: the lock stays for the
/// whole lease.
#[tokio::test]
async fn a_cancelled_release_still_releases() {
    let redis = server();
    let a = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let lock_key = a.redis_names("k").lock;
    let g = a
        .lock("k")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    assert!(poll_once_then_drop(g.release()).await.is_none());
    let freed = eventually(Duration::from_secs(2), async || {
        !exists(&mut raw, &lock_key).await
    })
    .await;
    assert!(
        freed.is_some(),
        "cancelled release left the lock held, pttl {} ms, held_count {}",
        pttl(&mut raw, &lock_key).await,
        a.held_count()
    );
}

/// The same through an ordinary `tokio::time::timeout` around `release()`
/// while Redis is briefly slow to answer the first EVALSHA (NOSCRIPT after a
/// script flush / restart-with-data / failover): the EVALSHA runs, the
/// SCRIPT LOAD + retry is cancelled.
#[tokio::test]
async fn a_release_cancelled_during_a_script_reload_still_releases() {
    let redis = server();
    let a = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let lock_key = a.redis_names("k").lock;
    let g = a
        .lock("k")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Cancel right after the first reply (NOSCRIPT) arrives.
    struct CancelAfterPolls<F> {
        inner: Pin<Box<F>>,
        polls: usize,
        limit: usize,
    }
    impl<F: Future> Future for CancelAfterPolls<F> {
        type Output = Option<F::Output>;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            self.polls += 1;
            match self.inner.as_mut().poll(cx) {
                Poll::Ready(v) => Poll::Ready(Some(v)),
                Poll::Pending if self.polls >= self.limit => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        }
    }
    let r = CancelAfterPolls {
        inner: Box::pin(g.release()),
        polls: 0,
        limit: 2,
    }
    .await;
    assert!(r.is_none(), "release finished in two polls: {r:?}");
    let freed = eventually(Duration::from_secs(2), async || {
        !exists(&mut raw, &lock_key).await
    })
    .await;
    assert!(
        freed.is_some(),
        "cancelled release left the lock held, pttl {} ms",
        pttl(&mut raw, &lock_key).await
    );
}

// ---------------------------------------------------------------------------
// F2: a wake-up consumed by a waiter that then leaves is not forwarded.
// ---------------------------------------------------------------------------

/// Wraps a waiter; once `armed`, the first wrapper polled after a wake-up that
/// takes `token` is cancelled at its next `Pending` (it is the waiter that just
/// consumed the release's wake-up and sent its acquire).
struct CancelWhenArmed<F> {
    inner: Pin<Box<F>>,
    armed: Arc<AtomicBool>,
    token: Arc<AtomicBool>,
}

impl<F: Future> Future for CancelWhenArmed<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.inner.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            Poll::Pending => {
                if self.armed.load(Ordering::SeqCst) && self.token.swap(false, Ordering::SeqCst) {
                    Poll::Ready(None) // dropped: cancelled
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

#[tokio::test]
async fn a_wake_up_taken_by_a_cancelled_waiter_is_passed_on() {
    let redis = server();
    let holder_m = manager(&redis).await;
    let waiters_m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let channel = holder_m.redis_names("k").channel().to_owned();
    let mut handoffs = Vec::new();
    for round in 0..3 {
        let holder = holder_m
            .lock("k")
            .lease(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        // F2_CONTROL=1: nobody is cancelled (the control: hand-off ~1 ms).
        let token = Arc::new(AtomicBool::new(std::env::var("F2_CONTROL").is_err()));
        let mut tasks = Vec::new();
        for _ in 0..2 {
            let m = waiters_m.clone();
            let fut = async move {
                let g = m.lock("k").wait(Duration::from_secs(20)).acquire().await;
                let at = Instant::now();
                g.unwrap().release().await.unwrap();
                at
            };
            tasks.push(tokio::spawn(CancelWhenArmed {
                inner: Box::pin(fut),
                armed: armed.clone(),
                token: token.clone(),
            }));
        }
        eventually(Duration::from_secs(5), async || {
            numsub(&mut raw, &channel).await == 1
        })
        .await
        .expect("subscribed");
        // Let the backoff caps grow to 1 s, so the fallback is slow.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        armed.store(true, Ordering::SeqCst);
        let released_at = Instant::now();
        holder.release().await.unwrap();
        let mut first = None::<Duration>;
        for t in tasks {
            if let Some(at) = t.await.unwrap() {
                let h = at - released_at;
                first = Some(first.map_or(h, |f| f.min(h)));
            }
        }
        let handoff = first.expect("one waiter survives");
        eprintln!("round {round}: hand-off to the first surviving waiter took {handoff:?}");
        handoffs.push(handoff);
    }
    // A forwarded wake-up hands off in about a millisecond, and more only on
    // a loaded machine; a lost one leaves the survivor to its next attempt.
    // A queued waiter attempts every 0.4-0.8 s, so that wait is under X ms
    // with probability X / 600 at most (X up to 400), and longer still if
    // the lock stayed with the cancelled waiter. 150 ms leaves a late
    // wake-up 150 ms, and three lost ones would all come under it with
    // probability (150 / 600)^3, about 1.6% (under 100 ms: 0.5%; each round
    // more costs 2.5 s).
    assert!(
        handoffs.iter().all(|h| *h < Duration::from_millis(150)),
        "hand-offs {handoffs:?}"
    );
}

// ---------------------------------------------------------------------------
// F3: re-entry racing the last release returned NotHeld instead of acquiring
// (a variant since removed: any error fails the test).
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_racing_the_last_release_acquires_afresh() {
    let redis = server();
    let m = manager(&redis).await;
    for _ in 0..3000 {
        let outer = m.lock("k").acquire().await.unwrap();
        let token = outer.fencing_token().await.unwrap();
        let m2 = m.clone();
        let child = outer
            .scope(async move {
                distlock::spawn_with_locks(async move {
                    // Re-enter until the parent's hold is gone and we take the
                    // lock afresh (a new fencing token).
                    loop {
                        match m2.lock("k").wait(Duration::from_secs(5)).acquire().await {
                            Ok(g) if g.fencing_token().await.unwrap() != token => {
                                g.release().await.unwrap();
                                return;
                            }
                            Ok(g) => drop(g),
                            Err(e) => panic!("acquire() failed instead of acquiring afresh: {e}"),
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .await;
        tokio::task::yield_now().await;
        let _ = outer.release().await;
        child.await.unwrap();
    }
}

// ---------------------------------------------------------------------------
// F4: leases of 3-5 ms were accepted, and with renewal they were always lost:
// the holder trusts a lease for `lease - 1% - 2 ms`, less than the time to the
// first renewal at `lease / 3`. The shortest lease is now 10 ms.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn leases_below_ten_milliseconds_are_rejected() {
    let redis = server();
    let m = manager(&redis).await;
    for ms in [3, 5, 9] {
        assert!(matches!(
            m.lock("k").lease(Duration::from_millis(ms)).acquire().await,
            Err(LockError::InvalidConfig(_))
        ));
    }
    assert_eq!(distlock::MIN_LEASE, Duration::from_millis(10));
    // Accepted: granted, or granted with a reply later than so short a
    // lease (a loaded machine), which is not handed out.
    match m.lock("k").lease(distlock::MIN_LEASE).acquire().await {
        Ok(g) => drop(g),
        Err(LockError::Lost { .. }) => {}
        Err(e) => panic!("{e}"),
    }
}

// ---------------------------------------------------------------------------
// F5: a SUBSCRIBE that times out while re-subscribing after a reconnect leaves
// the remaining channels unsubscribed for good.
// ---------------------------------------------------------------------------

// Semaphores, whose waiters listen on one channel per key (the default lock's
// queued waiters share one hand-off channel per manager).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_while_resubscribing_leaves_no_channel_behind() {
    const N: usize = 1500;
    let redis = server();
    let holders = manager(&redis).await;
    let waiters_m = manager(&redis).await; // command timeout 500 ms
    let mut raw = raw(&redis).await;
    let mut guards = Vec::new();
    for i in 0..N {
        guards.push(
            holders
                .semaphore(format!("k{i}"), 1)
                .lease(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap(),
        );
    }
    // Waiters still waiting (an attempt that meets the stall ends its waiter
    // with a Backend error, which is fine: its channel is then not wanted).
    let alive = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let mut waiters = Vec::new();
    for i in 0..N {
        let m = waiters_m.clone();
        let alive = alive.clone();
        alive.lock().unwrap().insert(i);
        waiters.push(tokio::spawn(async move {
            let g = m
                .semaphore(format!("k{i}"), 1)
                .wait(Duration::from_secs(60))
                .acquire()
                .await;
            alive.lock().unwrap().remove(&i);
            g.map(drop)
        }));
    }
    let channels = async |raw: &mut redis::aio::MultiplexedConnection| {
        let c = pubsub_channels(raw).await;
        c.into_iter().collect::<std::collections::HashSet<String>>()
    };
    eventually(Duration::from_secs(20), async || {
        channels(&mut raw).await.len() == N
    })
    .await
    .expect("all subscribed");
    // Break the subscriber's connection; while it re-subscribes channel by
    // channel, Redis stalls for longer than the command timeout.
    let _ = kill_subscribers(&mut raw).await;
    eventually(Duration::from_secs(5), async || {
        let n = channels(&mut raw).await.len();
        n > 0 && n < N / 2
    })
    .await
    .expect("re-subscribing");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(800)
        .arg("ALL")
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await; // our own connection is paused too
    let missing = async |raw: &mut redis::aio::MultiplexedConnection| {
        let subscribed = channels(raw).await;
        let alive: Vec<usize> = alive.lock().unwrap().iter().copied().collect();
        let missing = alive
            .iter()
            .filter(|i| {
                // The lock's channel, or its hand-off channel `<channel>:<route>`.
                let channel = waiters_m.redis_names(&format!("k{i}")).channel().replacen(
                    ":wake:",
                    ":semwake:",
                    1,
                );
                let handoff = format!("{channel}:");
                !subscribed
                    .iter()
                    .any(|c| *c == channel || c.starts_with(&handoff))
            })
            .count();
        (missing, alive.len())
    };
    eventually(Duration::from_secs(10), async || {
        missing(&mut raw).await.0 == 0
    })
    .await;
    let (missing, waiting) = missing(&mut raw).await;
    drop(guards);
    for w in waiters {
        let _ = w.await;
    }
    assert_eq!(
        missing, 0,
        "{missing} of the {waiting} channels that still have waiters are not subscribed, 10 s after the stall"
    );
}

// ---------------------------------------------------------------------------
// F6: a guard dropped as `#[tokio::main]` returns keeps the lock for the whole
// lease: the background release is spawned but the runtime shuts down first.
// ---------------------------------------------------------------------------

#[test]
fn a_guard_dropped_as_main_returns_is_released_at_runtime_shutdown() {
    let redis = server();
    // What `#[tokio::main] async fn main() -> Result<..> { let _g = ..?; work()?; Ok(()) }`
    // expands to, with `work()` failing.
    let lock_key = lock_held_as_runtime_ends(|| manager(&redis));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut raw = raw(&redis).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ttl = pttl(&mut raw, &lock_key).await;
        assert!(
            ttl < 0,
            "the lock outlived its process's runtime: {ttl} ms of lease left"
        );
    });
}

/// The same for a guard held by a task the program spawned, which the
/// runtime drops as it shuts down (the task never ends on its own): its
/// release is refused by the closing runtime, so the guard releases over a
/// blocking connection instead. On both runtime flavours: a current-thread
/// runtime drops its tasks on the thread that drops it, a multi-thread one
/// on its workers.
#[test]
fn a_guard_of_a_spawned_task_is_released_when_its_runtime_shuts_down() {
    let redis = server();
    for multi_thread in [false, true] {
        let mut builder = if multi_thread {
            tokio::runtime::Builder::new_multi_thread()
        } else {
            tokio::runtime::Builder::new_current_thread()
        };
        let rt = builder.enable_all().build().unwrap();
        let key = format!("spawned-job-{multi_thread}");
        let lock_key = rt.block_on(async {
            let m = manager(&redis).await;
            hold_until_the_runtime_ends(&m, key.clone()).await;
            m.redis_names(&key).lock
        });
        drop(rt);
        let check = tokio::runtime::Runtime::new().unwrap();
        check.block_on(async {
            let mut raw = raw(&redis).await;
            let ttl = pttl(&mut raw, &lock_key).await;
            assert!(
                ttl < 0,
                "multi-thread {multi_thread}: the spawned task's lock outlived its runtime: {ttl} ms of lease left"
            );
        });
    }
}

/// The same with the store unreachable as the runtime shuts down (every
/// byte to it discarded): the first blocking release waits out the command
/// timeout (300 ms) and fails; the manager's other guards are then left to
/// their leases rather than each waiting in turn, so that the shutdown takes
/// about one command timeout, not one per guard (six here: 1.8 s).
#[test]
fn a_shutdown_with_the_store_unreachable_waits_for_one_release_not_one_per_guard() {
    let redis = server();
    // The proxy runs on a runtime of its own, which outlives the manager's.
    let proxy_rt = tokio::runtime::Runtime::new().unwrap();
    let proxy = proxy_rt
        .block_on(distlock::testing::FaultProxy::start(redis.addr()))
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = distlock::LockManager::builder(&proxy.url())
            .command_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300))
            .build()
            .await
            .unwrap();
        for i in 0..6 {
            hold_until_the_runtime_ends(&m, format!("unreachable-{i}")).await;
        }
        proxy.set_mode(distlock::testing::FaultMode::BlackHole);
    });
    let started = Instant::now();
    drop(rt);
    let took = started.elapsed();
    proxy_rt.block_on(async move { drop(proxy) });
    // One command timeout (300 ms) for the first release, with the connect
    // before it (the proxy accepts at once) and 300 ms of slack for a
    // loaded machine: 900 ms, half of six command timeouts.
    assert!(
        took < Duration::from_millis(900),
        "the shutdown took {took:?}: one blocking release per guard"
    );
}

// ---------------------------------------------------------------------------
// Checked and correct (kept as regression tests).
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_manager_dropped_while_guards_and_waiters_exist_still_hands_off() {
    let redis = server();
    let a = manager(&redis).await;
    let b = manager(&redis).await;
    let g = a.lock("k").acquire().await.unwrap();
    let waiter = {
        let req = b.lock("k").wait(Duration::from_secs(5));
        drop(b);
        tokio::spawn(req.acquire())
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(a);
    let start = Instant::now();
    drop(g); // last reference to manager `a`
    let g2 = waiter.await.unwrap().unwrap();
    assert!(start.elapsed() < Duration::from_millis(300));
    g2.release().await.unwrap();
}

#[tokio::test]
async fn extreme_durations_are_rejected_not_panics() {
    let redis = server();
    let m = manager(&redis).await;
    for lease in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        assert!(matches!(
            m.lock("k").lease(lease).acquire().await,
            Err(LockError::InvalidConfig(_))
        ));
    }
    assert!(matches!(
        m.lock("k").wait(Duration::MAX).acquire().await,
        Err(LockError::InvalidConfig(_))
    ));
    assert!(matches!(
        m.lock("").acquire().await,
        Err(LockError::InvalidKey { .. })
    ));
    for d in [Duration::ZERO, Duration::MAX] {
        assert!(matches!(
            distlock::LockManager::builder(&redis.url())
                .command_timeout(d)
                .build()
                .await,
            Err(LockError::InvalidConfig(_))
        ));
    }
    // The longest accepted lease and wait work.
    let g = m
        .lock("k")
        .lease(distlock::MAX_DURATION)
        .wait(distlock::MAX_DURATION)
        .acquire()
        .await
        .unwrap();
    assert!(g.remaining_lease() > Duration::from_secs(29 * 24 * 3600));
    let other = manager(&redis).await;
    let r = other
        .lock("k")
        .wait(Duration::from_nanos(1))
        .acquire()
        .await;
    assert!(matches!(r, Err(LockError::Timeout { .. })));
    g.release().await.unwrap();
}

/// A builder's and a manager's `Debug` never show a password: of the URL, of
/// the seeds, of PostgreSQL's listening URL, nor one given as a query
/// parameter (redis-rs reads `pass=` in `redis+unix://` URLs).
#[tokio::test]
async fn debug_output_shows_no_password() {
    let secret = "s3cret";
    let shown = [
        format!(
            "{:?}",
            distlock::LockManager::builder(&format!("redis://:{secret}@127.0.0.1:1"))
        ),
        format!(
            "{:?}",
            distlock::LockManager::cluster_builder([
                format!("redis://u:{secret}@127.0.0.1:1"),
                format!("redis://u:{secret}@127.0.0.1:2"),
            ])
        ),
        format!(
            "{:?}",
            distlock::LockManager::builder(&format!("redis+unix:///tmp/r.sock?pass={secret}"))
        ),
    ];
    for text in &shown {
        assert!(!text.contains(secret), "{text}");
    }
    #[cfg(feature = "postgres")]
    {
        let text = format!(
            "{:?}",
            distlock::LockManager::builder(&format!("postgres://app:{secret}@127.0.0.1:1/db"))
                .postgres_listen_url(format!("postgres://app:{secret}@127.0.0.1:2/db"))
        );
        assert!(!text.contains(secret), "{text}");
    }
    let redis = server();
    let m = distlock::LockManager::builder(
        &redis
            .url()
            .replace("redis://", &format!("redis://default:{secret}@")),
    )
    .build()
    .await;
    // The private server has no password; what matters is that neither the
    // manager nor its error shows it.
    match m {
        Ok(m) => assert!(!format!("{m:?}").contains(secret)),
        Err(e) => assert!(!format!("{e:?} {e}").contains(secret)),
    }
}
