//! `#[distributed_lock]` against a real Redis: what the generated code does at
//! run time (the compile-time checks are in lock-ui/tests/ui).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use distlock::{distributed_lock, LockError, LockGuard, LockManager};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Body,
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

#[distributed_lock(key = "order:{order_id}", lease = "300ms", guard = lock, manager = m)]
async fn ship(m: &LockManager, order_id: u64, ran: &AtomicUsize) -> Result<u64, AppError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(lock.fencing_token().await.unwrap())
}

#[tokio::test]
async fn the_body_runs_under_the_lock_and_releases_it() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let ran = AtomicUsize::new(0);
    let token = ship(&m, 42, &ran).await.unwrap();
    assert!(token > 0);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert!(
        !exists(&mut raw, &m.redis_names("order:42").lock).await,
        "released"
    );
    assert!(
        exists(&mut raw, m.redis_names("order:42").fencing_counter()).await,
        "key formatted"
    );
    let next = ship(&m, 42, &ran).await.unwrap();
    assert!(next > token);
}

#[distributed_lock(key = "busy", wait = "0s", manager = m)]
async fn busy_job(m: &LockManager, ran: &AtomicUsize) -> Result<(), AppError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn a_failed_acquisition_returns_the_error_without_running_the_body() {
    let redis = server();
    let m = manager(&redis).await;
    let other = manager(&redis).await;
    let ran = AtomicUsize::new(0);
    let held = other.lock("busy").acquire().await.unwrap();
    let start = Instant::now();
    let r = busy_job(&m, &ran).await;
    assert!(
        matches!(r, Err(AppError::Lock(LockError::Timeout { .. }))),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_millis(300),
        "wait = 0s is one attempt"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    held.release().await.unwrap();
    busy_job(&m, &ran).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[distributed_lock(key = "account:{id}", manager = m, guard = outer)]
async fn transfer(m: &LockManager, id: u32) -> Result<(u64, u64), AppError> {
    // A nested locked function on the same key re-enters instead of waiting
    // for itself, and sees the same fencing token.
    let inner = audit(m, id).await?;
    Ok((outer.fencing_token().await.unwrap(), inner))
}

#[distributed_lock(key = "account:{id}", wait = "0s", manager = m, guard = g)]
async fn audit(m: &LockManager, id: u32) -> Result<u64, AppError> {
    Ok(g.fencing_token().await.unwrap())
}

#[tokio::test]
async fn a_nested_locked_function_reenters() {
    let redis = server();
    let m = manager(&redis).await;
    let (outer, inner) = transfer(&m, 7).await.unwrap();
    assert_eq!(outer, inner);
    let mut raw = raw(&redis).await;
    assert!(!exists(&mut raw, &m.redis_names("account:7").lock).await);
}

#[distributed_lock(key = "shared", wait = "10s", manager = m)]
async fn critical(
    m: &LockManager,
    inside: &AtomicUsize,
    max: &AtomicUsize,
) -> Result<(), AppError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    max.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(3)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn joined_locked_calls_in_one_task_exclude_each_other() {
    let redis = server();
    let m = manager(&redis).await;
    let (inside, max) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let run = || async {
        for _ in 0..10 {
            critical(&m, &inside, &max).await.unwrap();
        }
    };
    tokio::join!(run(), run(), run());
    assert_eq!(max.load(Ordering::SeqCst), 1);
}

#[distributed_lock(key = "long", lease = "300ms", manager = m)]
async fn long_job(m: &LockManager, steps: &AtomicUsize) -> Result<(), AppError> {
    loop {
        steps.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[distributed_lock(key = "long", lease = "300ms", manager = m, on_lost = "ignore", guard = g)]
async fn stubborn_job(m: &LockManager, lost_seen: &AtomicUsize) -> Result<&'static str, AppError> {
    g.lost().await;
    lost_seen.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok("finished anyway")
}

#[tokio::test]
async fn on_lost_abort_stops_the_body_and_ignore_lets_it_run() {
    let redis = server();
    let m = manager(&redis).await;
    let lock_key = m.redis_names("long").lock;

    let steps = AtomicUsize::new(0);
    let mut raw1 = raw(&redis).await;
    let (r, ()) = tokio::join!(long_job(&m, &steps), async {
        eventually(Duration::from_secs(2), async || {
            steps.load(Ordering::SeqCst) >= 3
        })
        .await
        .unwrap();
        del(&mut raw1, &lock_key).await;
    });
    assert!(
        matches!(r, Err(AppError::Lock(LockError::Lost { .. }))),
        "{r:?}"
    );
    let at_loss = steps.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(steps.load(Ordering::SeqCst), at_loss, "the body stopped");

    let lost_seen = AtomicUsize::new(0);
    let mut raw2 = raw(&redis).await;
    let (r, ()) = tokio::join!(stubborn_job(&m, &lost_seen), async {
        eventually(Duration::from_secs(2), async || {
            exists(&mut raw2, &lock_key).await
        })
        .await
        .unwrap();
        del(&mut raw2, &lock_key).await;
    });
    assert_eq!(r.unwrap(), "finished anyway");
    assert_eq!(lost_seen.load(Ordering::SeqCst), 1);
}

#[distributed_lock(key = "fragile", lease = "30s", manager = m)]
async fn fragile(
    m: &LockManager,
    fail: bool,
    held: tokio::sync::oneshot::Sender<()>,
) -> Result<(), AppError> {
    let _ = held.send(());
    if fail {
        return Err(AppError::Body);
    }
    std::future::pending::<()>().await;
    Ok(())
}

#[distributed_lock(key = "fragile", lease = "30s", manager = m)]
async fn panicking(m: &LockManager) -> Result<(), AppError> {
    panic!("the body panicked")
}

/// The lock is released on every exit: early return, panic, and the caller
/// dropping the future; another manager gets it well within the 30 s lease.
#[tokio::test]
async fn every_exit_releases() {
    let redis = server();
    let m = manager(&redis).await;
    let other = manager(&redis).await;
    let free_soon = || async {
        other
            .lock("fragile")
            .wait(Duration::from_secs(1))
            .acquire()
            .await
            .expect("freed within 1 s")
            .release()
            .await
            .unwrap();
    };

    let (tx, _rx) = tokio::sync::oneshot::channel();
    assert!(matches!(fragile(&m, true, tx).await, Err(AppError::Body)));
    free_soon().await;

    let m2 = m.clone();
    let r = tokio::spawn(async move { panicking(&m2).await }).await;
    assert!(r.unwrap_err().is_panic());
    free_soon().await;

    let (tx, rx) = tokio::sync::oneshot::channel();
    let m3 = m.clone();
    let task = tokio::spawn(async move { fragile(&m3, false, tx).await });
    rx.await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    free_soon().await;
}

struct Billing {
    locks: LockManager,
    tenant: String,
    closed: Arc<AtomicUsize>,
}

struct Invoice {
    id: u32,
}

impl Billing {
    #[distributed_lock(key = "invoice:{self.tenant}:{inv.id}", wait = "0s", guard = lock, manager = self.locks)]
    async fn close(&self, inv: &Invoice) -> Result<String, AppError> {
        self.closed.fetch_add(1, Ordering::SeqCst);
        Ok(format!(
            "{} {}",
            lock.key(),
            lock.fencing_token().await.unwrap() > 0
        ))
    }

    #[distributed_lock(key = "tenant:{self.tenant}", manager = self.locks)]
    async fn rename(&mut self, name: String) -> Result<(), AppError> {
        self.tenant = name;
        Ok(())
    }

    #[distributed_lock(key = "tenant:{self.tenant}", manager = self.locks.clone())]
    async fn into_tenant(self) -> Result<String, AppError> {
        Ok(self.tenant)
    }
}

#[tokio::test]
async fn methods_with_self_in_the_key() {
    let redis = server();
    let mut billing = Billing {
        locks: manager(&redis).await,
        tenant: "acme".into(),
        closed: Arc::default(),
    };
    let out = billing.close(&Invoice { id: 9 }).await.unwrap();
    assert_eq!(out, "invoice:acme:9 true");
    billing.rename("globex".into()).await.unwrap();
    assert_eq!(billing.tenant, "globex");
    assert_eq!(billing.into_tenant().await.unwrap(), "globex");
}

#[distributed_lock(key = "guard-type", manager = m, guard = g)]
async fn guard_is_a_reference(m: &LockManager) -> Result<bool, AppError> {
    let g: &LockGuard = g;
    Ok(!g.is_lost())
}

#[tokio::test]
async fn the_guard_binding_is_a_lock_guard_reference() {
    let redis = server();
    let m = manager(&redis).await;
    assert!(guard_is_a_reference(&m).await.unwrap());
}

#[async_trait::async_trait]
trait Shipper {
    async fn ship_one(&self, order_id: u64) -> Result<u64, AppError>;
}

struct Warehouse {
    locks: LockManager,
}

// `#[async_trait]` goes on the impl; `#[distributed_lock]` on the method.
#[async_trait::async_trait]
impl Shipper for Warehouse {
    #[distributed_lock(key = "order:{order_id}", wait = "0s", guard = g, manager = self.locks)]
    async fn ship_one(&self, order_id: u64) -> Result<u64, AppError> {
        Ok(g.fencing_token().await.unwrap())
    }
}

#[tokio::test]
async fn works_with_async_trait() {
    let redis = server();
    let w = Warehouse {
        locks: manager(&redis).await,
    };
    let dynamic: &dyn Shipper = &w;
    assert!(dynamic.ship_one(5).await.unwrap() > 0);
    // Held while it runs: a busy key makes the method fail without running.
    let other = manager(&redis).await;
    let held = other.lock("order:5").acquire().await.unwrap();
    assert!(matches!(
        dynamic.ship_one(5).await,
        Err(AppError::Lock(LockError::Timeout { .. }))
    ));
    held.release().await.unwrap();
}

#[distributed_lock(key = "vanishing", manager = m)]
async fn loses_it_at_the_end(
    m: &LockManager,
    raw: &mut redis::aio::MultiplexedConnection,
) -> Result<&'static str, AppError> {
    del(raw, &m.redis_names("vanishing").lock).await;
    Ok("done")
}

#[distributed_lock(key = "vanishing", manager = m, on_lost = "ignore")]
async fn loses_it_at_the_end_and_ignores(
    m: &LockManager,
    raw: &mut redis::aio::MultiplexedConnection,
) -> Result<&'static str, AppError> {
    del(raw, &m.redis_names("vanishing").lock).await;
    Ok("done")
}

/// A loss that only the release finds (the body finished before renewal could
/// notice) is still reported with `abort`; `ignore` keeps the body's result.
#[tokio::test]
async fn a_loss_found_at_release_is_reported_with_abort() {
    let redis = server();
    let m = manager(&redis).await;
    let mut raw = raw(&redis).await;
    let r = loses_it_at_the_end(&m, &mut raw).await;
    assert!(
        matches!(r, Err(AppError::Lock(LockError::Lost { .. }))),
        "{r:?}"
    );
    assert_eq!(
        loses_it_at_the_end_and_ignores(&m, &mut raw).await.unwrap(),
        "done"
    );
}

#[distributed_lock(key = "eager:{id}", eager_fencing = true, guard = lock, manager = m)]
async fn eager_job(m: &LockManager, id: u64) -> Result<Option<u64>, LockError> {
    Ok(lock.issued_fencing_token())
}

#[distributed_lock(key = "lazy:{id}", guard = lock, manager = m)]
async fn lazy_job(m: &LockManager, id: u64) -> Result<Option<u64>, LockError> {
    Ok(lock.issued_fencing_token())
}

/// `eager_fencing = true` issues the token inside the acquisition; without
/// it, a locked function has no token until it asks for one.
#[tokio::test]
async fn eager_fencing_takes_the_token_with_the_lock() {
    let redis = server();
    let m = manager(&redis).await;
    assert!(eager_job(&m, 1).await.unwrap().is_some());
    assert_eq!(lazy_job(&m, 1).await.unwrap(), None);
}

/// The macro with `manager = ...` on every store: the body runs under the
/// lock and releases it, a busy lock with `wait = "0s"` is one attempt that
/// runs nothing, a nested locked function re-enters with the same token, and
/// joined calls in one task exclude each other.
async fn the_macro_on_every_store(d: Deployment) {
    let m = d.manager().await;
    let other = d.manager().await;
    let ran = AtomicUsize::new(0);
    let token = ship(&m, 4242, &ran).await.unwrap();
    assert!(token > 0);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert!(!other.is_locked("order:4242").await.unwrap(), "released");
    assert!(ship(&m, 4242, &ran).await.unwrap() > token);

    let ran = AtomicUsize::new(0);
    let held = other.lock("busy").acquire().await.unwrap();
    let start = Instant::now();
    let r = busy_job(&m, &ran).await;
    assert!(
        matches!(r, Err(AppError::Lock(LockError::Timeout { .. }))),
        "{r:?}"
    );
    assert!(
        start.elapsed() < Duration::from_millis(300),
        "wait = 0s is one attempt"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    held.release().await.unwrap();
    busy_job(&m, &ran).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    let (outer, inner) = transfer(&m, 4243).await.unwrap();
    assert_eq!(outer, inner);
    assert!(!other.is_locked("account:4243").await.unwrap());

    let (inside, max) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let run = || async {
        for _ in 0..10 {
            critical(&m, &inside, &max).await.unwrap();
        }
    };
    tokio::join!(run(), run(), run());
    assert_eq!(max.load(Ordering::SeqCst), 1);
}

on_stores!(the_macro_on_every_store);
