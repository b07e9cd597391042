//! What a manager's clones, its guards and its background tasks share: the
//! settings, the backend, the lease map and the waiting queues.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::backend::Backend;
use crate::config::Config;
use crate::keys::{LockKind, RedisNames};
use crate::lease::Lease;
use crate::renewal::Renewals;
use crate::waiting::Subscriber;

/// Everything but the task handles, so that the background tasks and background
/// releases do not keep the manager alive.
pub(crate) struct Core {
    pub(crate) id: u64,
    pub(crate) config: Config,
    pub(crate) backend: Backend,
    pub(crate) renewals: Renewals,
    pub(crate) subscriber: Subscriber,
    /// This manager's hand-off route: locks are handed to its queued waiters
    /// on `<prefix>handoff:<route>` ([`Core::handoff_channel`]), which no other
    /// manager listens to (random, so managers of different processes differ;
    /// two that drew the same route would each hear the other's hand-offs,
    /// and ignore them: a hand-off names its waiter's owner token).
    pub(crate) handoff_route: String,
    /// `<prefix>handoff:<route>`: one channel for the hand-offs of all this
    /// manager's locks, so that a first wait on a key subscribes to nothing.
    pub(crate) handoff_channel: String,
    /// Set once the subscriber was asked to keep [`Core::handoff_channel`]
    /// (see [`Core::listen_for_waiters`]), so that later acquisitions pay
    /// one load, not a lock of the waiter queues.
    handoff_kept: AtomicBool,
    pub(crate) runtime: tokio::runtime::Handle,
    /// Origin of the lease clocks (`Instant`s stored as nanoseconds after it).
    pub(crate) epoch: Instant,
    /// Set by [`ManagerInner::stop`].
    shut_down: AtomicBool,
    /// Background work that gives something back to the store (a release,
    /// a counting semaphore's permits) spawned and not yet finished (or
    /// dropped), counted by [`BackgroundWork`]: the shutdown waits for it,
    /// and a test can tell a release still on its way from one that ran.
    pub(crate) background_releases: AtomicUsize,
    /// Told when [`Core::background_releases`] comes down to 0.
    pub(crate) background_releases_done: tokio::sync::Notify,
    /// Set once a shutdown has done its work (or its caller gave up on
    /// it): a second call waits for it.
    shutdown_done: tokio::sync::watch::Sender<bool>,
    /// The last check, after a resubscription, that the servers still send
    /// expiry notices (for lock events streams that want expiries): when it
    /// began, and the `CONFIG SET` to run when a server does not. Held
    /// while a check runs, so that the streams of one reconnect share one
    /// check rather than each make their own.
    pub(crate) expiry_recheck: tokio::sync::Mutex<Option<(Instant, Option<String>)>>,
}

impl Core {
    pub(crate) fn new(config: Config, backend: Backend, runtime: tokio::runtime::Handle) -> Self {
        let handoff_route = format!("{:08x}", rand::random::<u32>());
        Core {
            id: crate::config::next_id(),
            subscriber: Subscriber::new(config.connect_timeout, config.command_timeout),
            handoff_channel: format!(
                "{}:{handoff_route}",
                crate::backend::scripts::handoff_base(&config.key_prefix)
            ),
            handoff_route,
            handoff_kept: AtomicBool::new(false),
            config,
            backend,
            renewals: Renewals::default(),
            runtime,
            epoch: Instant::now(),
            shut_down: AtomicBool::new(false),
            background_releases: AtomicUsize::new(0),
            background_releases_done: tokio::sync::Notify::new(),
            shutdown_done: tokio::sync::watch::Sender::new(false),
            expiry_recheck: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Counts one piece of background work that gives something back to
    /// the store, until the returned token is dropped (see
    /// [`Core::background_releases`]).
    pub(crate) fn background_work(self: &Arc<Self>) -> BackgroundWork {
        self.background_releases.fetch_add(1, Ordering::AcqRel);
        BackgroundWork(self.clone())
    }

    /// Has the subscriber keep this manager's hand-off channel subscribed
    /// from now on, subscribing in its own task: nothing here waits for it.
    /// Called by every acquisition of the default lock (the first one asks,
    /// the others find it asked), so that a holder whose manager never waited
    /// still hears the `!<owner>` notice of the first waiter that queues for
    /// its hold, and releases it by the full release at once (one round trip,
    /// see `release::expected_waiters`) instead of trying the one-key release
    /// first. A notice published before the subscription is live is not
    /// heard: that release takes the two steps, as before.
    pub(crate) fn listen_for_waiters(&self) {
        if !self.handoff_kept.load(Ordering::Relaxed)
            && !self.handoff_kept.swap(true, Ordering::Relaxed)
        {
            self.subscriber.keep(&self.handoff_channel);
        }
    }

    pub(crate) fn keys(&self, key: &str) -> RedisNames {
        self.keys_of(key, LockKind::Exclusive)
    }

    pub(crate) fn keys_of(&self, key: &str, kind: LockKind) -> RedisNames {
        let prefix = &self.config.key_prefix;
        let keys = RedisNames::of(prefix, key, kind);
        if self.config.lock_events {
            keys.with_events(prefix, key)
        } else {
            keys
        }
    }
}

/// One piece of background work the shutdown waits for (see
/// [`Core::background_work`]).
pub(crate) struct BackgroundWork(Arc<Core>);

impl Drop for BackgroundWork {
    fn drop(&mut self) {
        if self.0.background_releases.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.background_releases_done.notify_waiters();
        }
    }
}

/// Marks the shutdown done when dropped: at its end, or when its caller
/// gave up on it (a second call must not wait for ever).
pub(crate) struct ShutdownDone<'a>(&'a tokio::sync::watch::Sender<bool>);

impl Drop for ShutdownDone<'_> {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// Owned by the manager's clones, its requests and its guards; stops the
/// background tasks when the last of them goes.
pub(crate) struct ManagerInner {
    pub(crate) core: Arc<Core>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for ManagerInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("id", &self.core.id)
            .field("config", &self.core.config)
            .finish_non_exhaustive()
    }
}

impl Drop for ManagerInner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl ManagerInner {
    /// Starts the renewal and subscriber tasks of `core` on its runtime.
    pub(crate) fn start(core: Core) -> ManagerInner {
        let core = Arc::new(core);
        let renewal = {
            let core = core.clone();
            async move { crate::renewal::run(&core.renewals, &core.backend, core.epoch).await }
        };
        let subscriber = {
            let core = core.clone();
            async move { crate::waiting::run_subscriber(&core.subscriber, &core.backend).await }
        };
        let tasks = vec![
            core.runtime.spawn(renewal).abort_handle(),
            core.runtime.spawn(subscriber).abort_handle(),
        ];
        ManagerInner { core, tasks }
    }

    /// Whether the background tasks still run.
    pub(crate) fn is_running(&self) -> bool {
        !self.core.is_shut_down() && self.tasks.iter().all(|t| !t.is_finished())
    }

    /// The local part of [`LockManager::shutdown`](crate::LockManager::shutdown)
    /// (`release::shut_down` sends the releases): marks the manager shut
    /// down, takes every lease out of the renewal task and ends it, wakes
    /// every waiting acquisition and stops the background tasks. `None`
    /// when another call shuts the manager down, once that one is done (so
    /// that a program that exits when this returns does not cut it short);
    /// otherwise the leases to release, and what tells a second call that
    /// this one is done when it is dropped.
    pub(crate) async fn stop(&self) -> Option<(Vec<Arc<Lease>>, ShutdownDone<'_>)> {
        let core = &self.core;
        if core.shut_down.swap(true, Ordering::AcqRel) {
            let mut done = core.shutdown_done.subscribe();
            let _ = done.wait_for(|done| *done).await;
            return None;
        }
        let done = ShutdownDone(&core.shutdown_done);
        let leases = core.renewals.close();
        for lease in &leases {
            lease.end_by_shutdown();
            crate::telemetry::released(lease.metrics_label, || lease.granted_at.elapsed());
        }
        core.subscriber.wake_everyone();
        for task in &self.tasks {
            task.abort();
        }
        Some((leases, done))
    }
}

impl Core {
    /// Waits, up to a command timeout, until the background work that gives
    /// something back (see [`Core::background_releases`]) is done: the
    /// shutdown's last step, which a program that exits once the shutdown
    /// returns would otherwise cut short, leaving locks to their leases (a
    /// task that cannot reach the store retries on after that, until its
    /// lease is over).
    pub(crate) async fn background_releases_finished(&self) {
        let deadline = tokio::time::Instant::now() + self.config.command_timeout;
        loop {
            let done = self.background_releases_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.background_releases.load(Ordering::Acquire) == 0
                || tokio::time::timeout_at(deadline, done).await.is_err()
            {
                break;
            }
        }
    }
}
