//! `LockRequest`: one acquisition, from the first attempt to the guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::backend::{AcquireReply, AcquireSpec, Backend, ExpectedWaiters};
use crate::config::{self, owner_token, Backoff};
use crate::context::LockContext;
use crate::core::{Core, ManagerInner};
use crate::error::{KeyPreview, LockError};
use crate::guard::LockGuard;
use crate::keys::{self, LockKind, RedisNames};
use crate::lease::{Lease, NewLease};
use crate::options::{Hold, HoldOptions, Patience};
use crate::release::{give_back_in_background, release_in_background, ReleaseOnDrop};
use crate::telemetry;
use crate::waiting::{BackoffTimer, Wake};

/// How long a queued waiter's entry lasts unless its next attempt refreshes
/// it: a waiter that dies holds up the queue at most this long (and a lock
/// handed to it, whose TTL is at most this, as long).
pub(crate) const QUEUE_LEASE: Duration = Duration::from_secs(3);

/// A queued waiter attempts (refreshing its queue entry) after a random sleep
/// between this and twice this: well within its queue lease.
const QUEUE_REFRESH: Duration = Duration::from_millis(400);

/// A queued waiter attempts this long (and up to twice this) after the lease
/// its last attempt saw runs out: Redis expires a key within a millisecond of
/// its TTL on access, so the attempt finds it gone.
const EXPIRY_MARGIN: Duration = Duration::from_millis(2);

/// How many attempts a queued waiter remembers the send time of: more than
/// fit in a queue lease (3 s at one per 0.4 s), so a hand-off answering an
/// attempt whose entry could still be live finds its time.
const RECENT_ATTEMPTS: usize = 16;

/// A lock about to be acquired; from [`LockManager::lock`](crate::LockManager::lock).
///
/// ```no_run
/// use std::time::Duration;
/// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// let guard = manager
///     .lock("order:42")
///     .lease(Duration::from_secs(5))  // TTL in Redis, renewed every lease/3
///     .wait(Duration::from_secs(1))   // then Err(LockError::Timeout)
///     .acquire()
///     .await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until .acquire().await or .try_acquire().await"]
pub struct LockRequest {
    manager: Arc<ManagerInner>,
    key: String,
    options: HoldOptions,
    kind: LockKind,
    resize_permits: bool,
    weight: u32,
    /// Set for one key of a multi-key acquisition: its id, which opens the
    /// owner token (see `config::owner_token_of`).
    acquisition: Option<String>,
}

impl LockRequest {
    pub(crate) fn new(manager: Arc<ManagerInner>, key: String) -> Self {
        Self::of_kind(manager, key, LockKind::Exclusive)
    }

    pub(crate) fn of_kind(manager: Arc<ManagerInner>, key: String, kind: LockKind) -> Self {
        LockRequest {
            kind,
            resize_permits: false,
            manager,
            key,
            options: HoldOptions::default(),
            weight: 1,
            acquisition: None,
        }
    }

    /// This request as one key of the multi-key acquisition `acquisition`.
    pub(crate) fn in_acquisition(mut self, acquisition: &str) -> Self {
        self.acquisition = Some(acquisition.to_owned());
        self
    }

    /// This request with `options` (a multi-key request's, per key).
    pub(crate) fn with_options(mut self, options: HoldOptions) -> Self {
        self.options = options;
        self
    }

    /// For a semaphore: how many of its permits this hold takes, together
    /// (default 1), e.g. 3 of 10 connection slots. The permits are taken in
    /// one acquisition or not at all, share one lease and one guard, and are
    /// given back by one release. From 1 to the semaphore's permit count;
    /// other kinds of lock take only 1 ([`LockError::InvalidConfig`]
    /// otherwise). A heavy hold waits while lighter ones take the free
    /// permits: under a steady stream of light holds it may wait long.
    pub fn weight(mut self, permits: u32) -> Self {
        self.weight = permits;
        self
    }

    /// Whether this request re-enters a hold of its key that the current call
    /// chain already has (default: true; see [`acquire`](Self::acquire)).
    /// Off, such a request fails at once with [`LockError::AlreadyHeld`]
    /// instead: for code where taking the same lock twice is a bug to report,
    /// not a nesting to allow. It never waits for its own chain's hold.
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.options.reentrant = reentrant;
        self
    }

    /// Whether anyone holds this request's kind of lock on its key right now:
    /// for [`lock`](crate::LockManager::lock) the default lock, for
    /// [`read_lock`](crate::LockManager::read_lock) and
    /// [`write_lock`](crate::LockManager::write_lock) the whole read-write
    /// lock, either side (`read_lock(k).is_locked()` is true while only a
    /// writer holds it), for a [`semaphore`](crate::LockManager::semaphore)
    /// any permit. One round trip (a `PTTL` for the default lock, else the script of
    /// [`inspect_all`](crate::LockManager::inspect_all)). A snapshot: take
    /// the lock to act on it.
    ///
    /// Per side, read [`inspect_all`](crate::LockManager::inspect_all)
    /// (one round trip), and free one side's holds with
    /// [`force_unlock_hold`](crate::LockManager::force_unlock_hold):
    ///
    /// ```no_run
    /// use distlock_runtime::HoldKind;
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let state = manager.inspect_all("catalog").await?;
    /// let writer = state.holds_of(HoldKind::Write).next();
    /// let readers = state.holds_of(HoldKind::Read).count();
    /// if let Some(stuck) = writer {
    ///     manager.force_unlock_hold(stuck).await?; // the writer only; readers keep theirs
    /// }
    /// # let _ = readers;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::ForeignValue`]
    /// when the key's names hold values distlock did not write,
    /// [`LockError::Backend`] when Redis fails.
    pub async fn is_locked(&self) -> Result<bool, LockError> {
        keys::validate_key(&self.key)?;
        let core = &self.manager.core;
        if self.kind.family() == keys::LockFamily::Lock {
            // One PTTL, rather than the script that reads every kind.
            return core
                .backend
                .is_locked(&self.key, &core.keys(&self.key))
                .await
                .map_err(|e| e.error);
        }
        let names = keys::KeyNames::of(&core.config.key_prefix, &self.key);
        let read = core
            .backend
            .inspect_key(&self.key, &names)
            .await
            .map_err(|e| e.error)?
            .ok_or_else(|| LockError::ForeignValue {
                key: self.key.clone(),
            })?;
        Ok(match self.kind.family() {
            keys::LockFamily::Lock => read.lock.is_some(),
            keys::LockFamily::ReadWrite => read.writer.is_some() || !read.readers.is_empty(),
            keys::LockFamily::Semaphore => !read.permit_holders.is_empty(),
        })
    }

    /// A semaphore request's permits: held now, the count in force, and how
    /// many are free, in one round trip (a script that first removes holders
    /// whose lease ran out, as an acquisition does). For other kinds of request:
    /// [`LockError::InvalidConfig`].
    ///
    /// # Errors
    /// [`LockError::ForeignValue`] when the semaphore's names hold values
    /// distlock did not write; [`LockError::Backend`] when Redis fails.
    pub async fn permit_counts(&self) -> Result<crate::PermitCounts, LockError> {
        let LockKind::Permit { permits } = self.kind else {
            return Err(LockError::InvalidConfig(format!(
                "permit_counts is for semaphores; {} is a {}",
                KeyPreview(&self.key),
                self.kind.family()
            )));
        };
        keys::validate_key(&self.key)?;
        let core = &self.manager.core;
        let keys = core.keys_of(&self.key, self.kind);
        match core
            .backend
            .permit_counts(&self.key, &keys)
            .await
            .map_err(|e| e.error)?
        {
            crate::backend::PermitReply::Foreign => Err(LockError::ForeignValue {
                key: self.key.clone(),
            }),
            crate::backend::PermitReply::Counts { held, stored } => {
                let configured = stored.unwrap_or(permits);
                Ok(crate::PermitCounts {
                    configured,
                    held,
                    available: configured.saturating_sub(held),
                    overcommitted: held.saturating_sub(configured),
                })
            }
        }
    }

    /// Whether the current call chain holds this request's key on this
    /// manager (for a read or write lock: either side of it), as re-entry
    /// sees it. Local: no round trip.
    ///
    /// The *call chain* is not the task (nor, as in Redisson, the thread):
    /// it is the future running inside the guard's
    /// [`scope`](LockGuard::scope) or
    /// [`scope_until_lost`](LockGuard::scope_until_lost), the body of a
    /// `#[distributed_lock]` function, and tasks started there with
    /// [`spawn_with_locks`](crate::spawn_with_locks). So right after
    /// `acquire()` the answer is `false`, in the same task, until the work
    /// runs inside `guard.scope(..)`; two futures `join!`ed in one task are
    /// two chains, and a plain `tokio::spawn`ed task is another chain. This
    /// is the scope in which a second `acquire()` re-enters instead of
    /// waiting; a task-wide count would let two joined futures both think
    /// they hold the lock. To ask whether a guard you have still holds its
    /// lease, use [`LockGuard::is_lost`].
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let guard = manager.lock("order:42").acquire().await?;
    /// assert!(!manager.lock("order:42").is_held_by_current_chain()); // not in scope yet
    /// guard
    ///     .scope(async {
    ///         assert!(manager.lock("order:42").is_held_by_current_chain());
    ///         assert_eq!(manager.lock("order:42").hold_count(), 1);
    ///     })
    ///     .await;
    /// guard.release().await
    /// # }
    /// ```
    pub fn is_held_by_current_chain(&self) -> bool {
        self.hold_count() > 0
    }

    /// How many holds share the current call chain's hold of this key: 1 for
    /// the acquisition, one more for each re-entrant guard still alive
    /// (those of `spawn_with_locks` subtasks included); 0 when the chain does
    /// not hold it, which includes right after `acquire()` outside the
    /// guard's [`scope`](LockGuard::scope) (the call chain is defined at
    /// [`is_held_by_current_chain`](Self::is_held_by_current_chain)). Local:
    /// no round trip.
    pub fn hold_count(&self) -> usize {
        LockContext::find(self.manager.core.id, &self.key, self.kind.family())
            .map_or(0, |lease| lease.hold_count())
    }

    /// How this acquisition paces its attempts while it waits and no message
    /// brings it the lock (default: the manager's,
    /// [`LockManagerBuilder::backoff`](crate::LockManagerBuilder::backoff)).
    /// See [`Backoff`] for which waiters it paces; the default lock's queued
    /// waiters are handed the lock by a message instead.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.options.backoff = Some(backoff);
        self
    }

    /// Whether the fencing token is issued inside the acquisition (default:
    /// the manager's, [`LockManagerBuilder::eager_fencing`], off). Off, a hold
    /// pays nothing for fencing until it calls
    /// [`LockGuard::fencing_token`], which issues the token in one round trip;
    /// on, the acquisition issues it (a script instead of a plain `SET NX`,
    /// no extra round trip), for holders that always use their token.
    ///
    /// [`LockManagerBuilder::eager_fencing`]: crate::LockManagerBuilder::eager_fencing
    pub fn eager_fencing(mut self, eager: bool) -> Self {
        self.options.eager_fencing = Some(eager);
        self
    }

    /// The lease: the lock's TTL in Redis (10 ms to 30 days, whole milliseconds;
    /// default: the manager's). With renewal on, it is reset every `lease / 3`
    /// while the guard lives, and a crashed holder frees the lock within `lease`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options.lease = Some(lease);
        self
    }

    /// How long [`acquire`](Self::acquire) may wait for a busy lock before it
    /// returns [`LockError::Timeout`] (default: the manager's). Zero means one attempt.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// Whether the lease is renewed while the guard lives (default true). Without
    /// renewal the lock ends at `lease`, whether the holder is done or not.
    pub fn renew(mut self, renew: bool) -> Self {
        self.options.renew = renew;
        self
    }

    /// The longest the lock may be held (default: no limit). Once that long has
    /// passed since the grant, renewal stops and the guard reports its lease
    /// lost (`lost()`, `is_lost()`, and a locked function is stopped), so a stuck
    /// body cannot keep a lock for ever; the lock in Redis then expires within
    /// one lease.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.options.max_hold = Some(max_hold);
        self
    }

    /// The shortest the lock is held (default: none), ShedLock's
    /// `lockAtLeastFor`: the lock stays taken until at least `min_hold` after
    /// it was acquired, even when the holder is done sooner. For scheduled
    /// jobs: replicas that each run a job on a schedule, whose clocks or
    /// timers differ by less than `min_hold`, then run a fast job once per
    /// period rather than once per replica (the late replica finds the lock
    /// still taken).
    ///
    /// A release before `min_hold` has passed does not delete the lock: the
    /// same round trip sets its TTL to what is left of `min_hold` (a
    /// `PEXPIRE` instead of a `DEL`; no extra round trip). Waiters are not
    /// woken early: no wake-up is published, and they take the lock once it
    /// has expired, when their backoff (capped by the remaining lease they
    /// read) runs out. A release after `min_hold` deletes the lock as usual.
    ///
    /// `min_hold` may exceed the lease: the lock is renewed while it is held,
    /// and at the release kept for the rest. The releases at
    /// [`LockManager::shutdown`](crate::LockManager::shutdown) keep it too.
    ///
    /// Must be above zero, at most 30 days and, with a
    /// [`max_hold`](Self::max_hold), at most that: otherwise acquiring fails
    /// with [`LockError::InvalidConfig`]. Ignored when the acquisition re-enters a
    /// hold of the same call chain (the outer request's options apply).
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.options.min_hold = Some(min_hold);
        self
    }

    /// Labels the metrics of this lock (feature `metrics`) with `lock = label`:
    /// its acquisitions, busy attempts, timeouts, losses and releases, its wait
    /// and hold times and the held-locks gauge (not the renewal-lag and
    /// round-trip histograms, which describe the connection). Without it those
    /// metrics carry no label.
    ///
    /// The label must come from a small, fixed set, such as the key's template
    /// (`"order:{order_id}"`, which `#[distributed_lock]` passes for you) or
    /// the name of a job: never the key itself, or anything else that varies
    /// per call, since each distinct label is a separate series in the metrics
    /// backend. Without the `metrics` feature it costs nothing.
    pub fn metrics_label(mut self, label: &'static str) -> Self {
        self.options.metrics_label = Some(label);
        self
    }

    /// For a [semaphore](crate::LockManager::semaphore): make this request's
    /// permit count the semaphore's, whatever count its current holders use.
    ///
    /// Without it, a request whose count differs from the holders' fails with
    /// [`LockError::PermitsDiffer`], so that two versions of a service that
    /// disagree on the count do not silently run with the larger one. The
    /// resize takes effect at this request's first attempt, whether or not it
    /// gets a permit then; current holders keep theirs (with fewer permits than
    /// holders, nobody new enters until enough have left). Once nobody holds
    /// the semaphore, the next request's count stands anyway. No effect on
    /// other kinds of lock.
    pub fn resize_permits(mut self) -> Self {
        self.resize_permits = true;
        self
    }

    /// The key this request locks.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Takes the lock, waiting up to `wait` while someone else holds it.
    ///
    /// Waiting sleeps until the holder's release publishes a wake-up, with
    /// jittered retries capped by the holder's remaining lease as a fallback for
    /// a lost message. If this call chain already holds the key (inside
    /// [`LockGuard::scope`] or a locked function), it re-enters at once, sharing
    /// the outer lease and fencing token; the options of this request are then
    /// ignored. A semaphore re-enters only with its permit count and at most
    /// the outer hold's [`weight`](Self::weight).
    ///
    /// # Errors
    /// [`LockError::Timeout`] once `wait` has passed (never earlier),
    /// [`LockError::InvalidKey`] / [`LockError::InvalidConfig`] for bad input
    /// (a re-entry asking a semaphore for more permits than its outer hold
    /// took), [`LockError::PermitsDiffer`] re-entering a semaphore with
    /// another permit count,
    /// [`LockError::Lost`] when re-entering a hold whose lease was lost, or
    /// when the grant's reply came after its lease's deadline (a round trip
    /// longer than the lease; the lock is given back),
    /// [`LockError::Backend`] when Redis fails or does not answer in time.
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let key = self.key.clone();
        match self.run(Patience::Wait).await? {
            Some(guard) => Ok(guard),
            // `Patience::Wait` turns a busy lock into `Timeout` itself.
            None => Err(LockError::Timeout {
                key,
                waited: Duration::ZERO,
            }),
        }
    }

    /// Makes one attempt: `Ok(None)` when someone else holds the lock.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), but never [`LockError::Timeout`].
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, LockError> {
        self.run(Patience::Once).await
    }

    async fn run(self, patience: Patience) -> Result<Option<LockGuard>, LockError> {
        let LockRequest {
            manager,
            key,
            options,
            kind,
            resize_permits,
            weight,
            acquisition,
        } = self;
        if let LockKind::Permit { permits: 0 } = kind {
            return Err(LockError::InvalidConfig(format!(
                "semaphore {} has 0 permits; it needs at least 1",
                KeyPreview(&key)
            )));
        }
        match kind {
            LockKind::Permit { permits } if (1..=permits).contains(&weight) => {}
            LockKind::Permit { permits } => {
                return Err(LockError::InvalidConfig(format!(
                    "a hold of {weight} permits of semaphore {} (of {permits}); it takes 1 to {permits}",
                    KeyPreview(&key)
                )))
            }
            _ if weight != 1 => {
                return Err(LockError::InvalidConfig(format!(
                    "a {} takes no weight (lock {}); weight is for semaphores",
                    kind.family(),
                    KeyPreview(&key)
                )))
            }
            _ => {}
        }
        let redlock = matches!(manager.core.backend, Backend::Redlock(_));
        if kind != LockKind::Exclusive && redlock {
            return Err(LockError::InvalidConfig(format!(
                "a {} is not available on a Redlock manager (key {}): use one server, \
                 Sentinel or a cluster",
                kind.family(),
                KeyPreview(&key)
            )));
        }
        keys::validate_key(&key)?;
        let core = manager.core.clone();
        let mut hold = options.resolve(&core.config, patience)?;

        if core.is_shut_down() {
            return Err(LockError::ShutDown { key });
        }
        if let Some(held) = LockContext::find(core.id, &key, kind.family()) {
            if !hold.reentrant {
                return Err(LockError::AlreadyHeld { key });
            }
            if kind == LockKind::Write && held.keys.kind == LockKind::Read {
                return Err(LockError::UpgradeRefused { key });
            }
            // A semaphore hold re-entered stands for the permits it took: a
            // request for more would run its body on fewer than it asked
            // for, while other holders take the rest.
            if let (LockKind::Permit { permits }, LockKind::Permit { permits: held_with }) =
                (kind, held.keys.kind)
            {
                if permits != held_with {
                    return Err(LockError::PermitsDiffer {
                        key,
                        held_with,
                        requested: permits,
                    });
                }
                let held_weight = crate::info::permits_of(&held.owner);
                if weight > held_weight {
                    return Err(LockError::InvalidConfig(format!(
                        "semaphore {} is held by this call chain with {held_weight} permit(s); \
                         re-entering it cannot take {weight}: release the outer hold first",
                        KeyPreview(&key)
                    )));
                }
            }
            match reenter(&manager, held) {
                Ok(Some(guard)) => return Ok(Some(guard)),
                // The last hold went between the lookup and now: acquire afresh.
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }

        let span = tracing::debug_span!(target: "distlock::acquire",
            "distlock.acquire",
            key = %KeyPreview(&key),
            lease_ms = hold.lease.as_millis() as u64,
            wait_ms = hold.wait.as_millis() as u64,
        );
        // A shared hold (reader, permit) lives in a sorted set, which has no
        // place to record a token issued later: it takes its token at once.
        hold.eager_fencing |= matches!(kind, LockKind::Read | LockKind::Permit { .. });
        let started = Instant::now();
        let acquired = Acquisition {
            core: &core,
            keys: core.keys_of(&key, kind),
            resize_permits,
            weight,
            queue: kind == LockKind::Exclusive && !redlock,
            // A weighted hold's token says how many permits it stands for
            // (see `weight_of` in shared_prelude.lua).
            owner: match (acquisition, weight) {
                (Some(acquisition), _) => config::owner_token_of(&acquisition, &core.handoff_route),
                // The default lock's holds carry their manager's route, for
                // the waiters that queue behind them (`owner_token_routed`).
                (None, 1) if kind == LockKind::Exclusive && !redlock => {
                    config::owner_token_routed(&core.handoff_route)
                }
                (None, 1) => owner_token(),
                (None, weight) => format!("{}:{weight}", owner_token()),
            },
            key,
            hold,
            started,
            attempts: 0,
            waiting: false,
            last_sent: started,
            recent_attempts: std::collections::VecDeque::new(),
            left_behind: None,
        }
        .run(manager.clone(), patience)
        .instrument(span)
        .await;
        Ok(acquired?.map(|mut guard| {
            // From grant to release, beside (not inside) the wait's span, so a
            // trace shows the wait and then the hold.
            guard.set_hold_span(tracing::debug_span!(target: "distlock::lease",
                "distlock.hold",
                key = %KeyPreview(guard.key()),
                fencing_token = guard.issued_fencing_token(),
            ));
            guard
        }))
    }
}

pub(crate) fn reenter(
    manager: &Arc<ManagerInner>,
    held: Arc<Lease>,
) -> Result<Option<LockGuard>, LockError> {
    if held.is_lost() {
        return Err(LockError::Lost {
            key: held.key.clone(),
        });
    }
    if !held.add_hold() {
        // The last hold was released between the lookup and now, or is
        // being renamed or made a ticket (`Lease::take_sole_hold`).
        return Ok(None);
    }
    tracing::trace!(target: "distlock::acquire", key = %KeyPreview(&held.key), "re-entered");
    Ok(Some(LockGuard::new(manager.clone(), held)))
}

struct Acquisition<'a> {
    core: &'a Arc<Core>,
    keys: RedisNames,
    resize_permits: bool,
    /// The permits it takes (1 but for a weighted semaphore hold).
    weight: u32,
    /// Waiters queue in Redis and are handed the lock (the default lock, but
    /// on Redlock).
    queue: bool,
    /// One owner token for all attempts of this acquisition: a retried attempt
    /// whose earlier reply was lost finds the lock already ours.
    owner: String,
    key: String,
    /// The request's options, checked and completed (for a shared hold, with
    /// eager fencing).
    hold: Hold,
    started: Instant,
    attempts: u32,
    /// Listening for this lock's wake-ups: attempts mark the lock as waited for
    /// (the default lock's: they queue up).
    waiting: bool,
    /// When the last attempt was sent.
    last_sent: Instant,
    /// The numbers and send times of the last attempts of a queued
    /// acquisition, for a hand-off that names the attempt it answers.
    recent_attempts: std::collections::VecDeque<(u32, Instant)>,
    /// Armed once an attempt may have left a grant in this acquisition's
    /// name (`AcquireReply::LeftBehind`): leaving without the lock, it gives
    /// that back by owner token in the background; no later attempt can be
    /// undone by it then.
    left_behind: Option<ReleaseOnDrop<Box<dyn FnOnce() + Send + Sync>>>,
}

impl Acquisition<'_> {
    async fn run(
        mut self,
        manager: Arc<ManagerInner>,
        patience: Patience,
    ) -> Result<Option<LockGuard>, LockError> {
        let wait = self.hold.wait;
        if self.queue {
            // The default lock. Inline here rather than in a function of its
            // own: each async fn taking `self` by value keeps a copy of it in
            // its future, which every acquisition moves.
            self.core.listen_for_waiters();
            let deadline = self.started + wait;
            if patience == Patience::Once || wait.is_zero() {
                // Without waiting: nothing is queued.
                return match self.attempt().await? {
                    Attempt::Acquired {
                        fencing_token,
                        sent_at,
                        ..
                    } => self.grant(manager, fencing_token, sent_at, None).map(Some),
                    Attempt::Busy(_) if patience == Patience::Once => {
                        telemetry::busy(self.hold.metrics_label);
                        Ok(None)
                    }
                    Attempt::Busy(_) => Err(self.timeout()),
                };
            }
            // First one attempt that does not queue, where the store makes that
            // cheaper (see `Backend::queues_at_first_attempt`): a free lock is
            // taken by a plain `SET NX`. It cannot overtake a queued waiter: the
            // script serves the queue's head first. A busy lock costs this one
            // attempt more, so it is skipped when another acquisition of this
            // manager already waits for the lock: the lock is almost surely busy
            // (under contention, one script per acquisition fewer).
            if !self.core.backend.queues_at_first_attempt()
                && !self.core.subscriber.has_queued(&self.keys.lock)
            {
                if let Attempt::Acquired {
                    fencing_token,
                    sent_at,
                    ..
                } = self.attempt().await?
                {
                    return self.grant(manager, fencing_token, sent_at, None).map(Some);
                }
            }
            // The queueing, a future several times the size of the attempt above,
            // is boxed: a free acquisition moves and polls only the attempt's.
            return Box::pin(self.wait_in_queue(manager, deadline)).await;
        }
        let deadline = self.started + wait;
        let willing_to_wait = patience == Patience::Wait && !wait.is_zero();
        // Fairness: when acquisitions of this manager already wait for this lock,
        // a new one (often the task that just released it) queues behind them
        // instead of trying first and taking the lock from under the waiter that
        // the release woke. Not behind semaphore waiters that all want more
        // permits than this one: the free permits may be enough for it and
        // not for them, and nothing would wake it while they wait.
        let mut remaining = None;
        if !(willing_to_wait
            && self
                .core
                .subscriber
                .has_waiters_for(self.keys.channel(), self.weight))
        {
            remaining = match self.attempt().await? {
                Attempt::Acquired {
                    fencing_token,
                    sent_at,
                    ..
                } => return self.grant(manager, fencing_token, sent_at, None).map(Some),
                Attempt::Busy(remaining) => remaining,
            };
            if patience == Patience::Once {
                telemetry::busy(self.hold.metrics_label);
                return Ok(None);
            }
            if wait.is_zero() {
                return Err(self.timeout());
            }
        }

        // The waiting, a future several times the size of the attempt above,
        // is boxed: a free acquisition moves and polls only the attempt's.
        Box::pin(self.wait_for_release(manager, deadline, remaining)).await
    }

    /// Waits for a release broadcast on the lock's channel (the locks that do
    /// not queue in Redis), attempting again when woken or on its timer.
    async fn wait_for_release(
        mut self,
        manager: Arc<ManagerInner>,
        deadline: Instant,
        mut remaining: Option<Duration>,
    ) -> Result<Option<LockGuard>, LockError> {
        let core = self.core.clone();
        let registration = core
            .subscriber
            .register(self.keys.channel(), self.weight)
            .watching_expiry();
        let _counted = telemetry::waiting(self.hold.metrics_label);
        self.waiting = true;
        // A waiting writer announces itself to keep new readers out; if it
        // leaves without the lock, it takes the announcement back.
        let mut withdraw = (self.keys.kind == LockKind::Write).then(|| self.withdraw_on_drop());
        let mut backoff = BackoffTimer::new(self.hold.backoff);
        // Registered from here on: a release from now on wakes this waiter or
        // another of this manager (who then holds the lock), and a new
        // subscription wakes every waiter once it is confirmed, for a release
        // published before it was. Wake-ups are kept for the waiter while it
        // sleeps on its timer or is busy with an attempt.
        loop {
            // Only the first waiter in line retries on its timer (see
            // `Registration::is_first_in_line`); the others' timers only bring
            // them back to look, and their backoff ignores the holder's lease
            // (which they last read who knows when).
            let first_in_line = registration.is_first_in_line();
            let nap = backoff
                .next(if first_in_line { remaining } else { None })
                .min(deadline.saturating_duration_since(Instant::now()));
            let wake = tokio::select! {
                wake = registration.woken() => Some(wake),
                _ = tokio::time::sleep(nap) => None,
            };
            if core.is_shut_down() {
                return Err(LockError::ShutDown {
                    key: self.key.clone(),
                });
            }
            let releases = wake.map_or(0, |w| w.releases);
            if let Some(Wake {
                releases: 0,
                recheck: false,
                recap: Some(lease),
            }) = wake
            {
                // First in line now, behind a waiter of this manager that
                // got the lock for `lease`: no release to answer, only a
                // timer to set by the new holder's lease (or by what the
                // last attempt read, if sooner).
                remaining = Some(remaining.map_or(lease, |r| r.min(lease)));
                if Instant::now() >= deadline {
                    return Err(self.timeout());
                }
                continue;
            }
            if releases == 0
                && wake.is_some()
                && self.keys.kind != LockKind::Read
                && !registration.is_first_in_line()
            {
                // A recheck (every waiter asked to look again: their
                // channel's subscription confirmed, a reconnect) is the
                // first in line's to answer; a waiter behind it that
                // attempted too could take the lock from it. The ones
                // behind look when it passes a release on (it got the
                // lock with room left, found too few permits for its
                // weight, or left). Readers all look: they share.
                if Instant::now() >= deadline {
                    return Err(self.timeout());
                }
                continue;
            }
            if wake.is_some() {
                // If this waiter leaves before its attempt resolves, the
                // releases it was told of go on to the next waiter (see
                // `Registration`).
                registration.set_unresolved_releases(releases);
            } else if !registration.is_first_in_line() {
                if Instant::now() >= deadline {
                    return Err(self.timeout());
                }
                continue;
            }
            let attempt = self.attempt().await;
            if attempt.is_err() {
                registration.failed();
            }
            remaining = match attempt? {
                Attempt::Acquired {
                    fencing_token,
                    sent_at,
                    permits_left,
                } => {
                    registration.got_it(self.hold.lease);
                    if self.keys.kind == LockKind::Exclusive {
                        registration.forget_releases();
                    } else {
                        // One release was this one's; any more (a semaphore's
                        // other permits) are the next waiter's.
                        let mut passed_on = releases.saturating_sub(1);
                        // The next waiter of this manager also looks when
                        // the store wakes nobody for it: a semaphore with
                        // permits left free (a release from one that was not
                        // full publishes nothing), or one whose permit came
                        // on this waiter's timer (a lease ran out unreleased
                        // and others may be about to, which only the first in
                        // line watches for); a read hold, since readers share
                        // (also after a wake-everyone recheck, which a reader
                        // that registered since never heard).
                        let room_left = match self.keys.kind {
                            LockKind::Permit { .. } => permits_left > 0 || wake.is_none(),
                            LockKind::Read => true,
                            LockKind::Exclusive | LockKind::Write => false,
                        };
                        if room_left {
                            passed_on = passed_on.max(1);
                        }
                        registration.set_unresolved_releases(passed_on);
                    }
                    if let Some(mut withdraw) = withdraw.take() {
                        withdraw.disarm();
                    }
                    return self.grant(manager, fencing_token, sent_at, None).map(Some);
                }
                Attempt::Busy(remaining) => remaining,
            };
            // Busy: whoever holds it now will publish again. Permits freed
            // too few for this waiter may be enough for a lighter one.
            registration.set_unresolved_releases(0);
            // Also after an attempt on the first in line's own timer (a
            // lease ran out, which nobody publishes): lighter waiters behind
            // it attempt only when woken.
            if matches!(self.keys.kind, LockKind::Permit { .. }) {
                registration.pass_on_to_a_lighter_waiter(self.weight);
            }
            if Instant::now() >= deadline {
                return Err(self.timeout());
            }
        }
    }

    /// The default lock's waiting (after `run`'s first attempt): every attempt
    /// queues it up in Redis (or refreshes its queue entry), from the first;
    /// the lock comes by a hand-off message naming this waiter's owner token,
    /// or, when that message is lost, by the next attempt, which finds the
    /// lock already ours. Each waiter attempts on its own timer (not only the
    /// first in line of this manager), since each must refresh its entry.
    async fn wait_in_queue(
        mut self,
        manager: Arc<ManagerInner>,
        deadline: Instant,
    ) -> Result<Option<LockGuard>, LockError> {
        let core = self.core.clone();
        // Listening before the first attempt queues us up: the manager's one
        // hand-off channel, which `run` asked the subscriber to keep. A
        // hand-off published before the subscription is confirmed is made up
        // for by the attempt every waiter makes once it is (it finds the lock
        // already ours).
        let channel = &core.handoff_channel;
        let registration = core.subscriber.register(channel, 1);
        // Counted as waiting from the first busy attempt: the first attempt
        // may be the acquisition's first (see `run`), and find the lock free.
        let mut counted = None;
        let _queued = core.subscriber.queue_here(&self.keys.lock);
        let handoff = core.subscriber.expect_handoff(&self.owner);
        self.waiting = true;
        // Leaving without the lock withdraws our queue entry (and gives back a
        // lock handed to us meanwhile) in the background.
        let mut withdraw = self.withdraw_on_drop();
        loop {
            let remaining = match self.attempt().await? {
                Attempt::Acquired {
                    fencing_token,
                    sent_at,
                    ..
                } => {
                    withdraw.disarm();
                    return self.grant(manager, fencing_token, sent_at, None).map(Some);
                }
                Attempt::Busy(remaining) => remaining,
            };
            counted.get_or_insert_with(|| telemetry::waiting(self.hold.metrics_label));
            let now = Instant::now();
            if now >= deadline {
                // Out of the queue before the caller hears of the timeout, so that
                // a release right after does not hand the lock to a waiter that has
                // left (its withdrawal would hand it on, a round trip later).
                // One release script by our owner token removes our queue
                // entry (and gives back a lock handed to us meanwhile); if it
                // fails, the guard retries in the background.
                if core
                    .backend
                    .release(
                        &self.key,
                        &self.keys,
                        &self.owner,
                        0,
                        ExpectedWaiters::Unknown,
                    )
                    .await
                    .is_ok()
                {
                    withdraw.disarm();
                }
                drop(withdraw);
                return Err(self.timeout());
            }
            // The next attempt refreshes the queue entry, and comes at once
            // after the holder's lease runs out if no release hands the lock
            // over first (a holder that crashed or lost it): then any queued
            // attempt hands the lock to the head, which bounds the window in
            // which a newcomer's `SET NX` can overtake the queue.
            let mut nap = QUEUE_REFRESH + BackoffTimer::jitter(QUEUE_REFRESH);
            if let Some(remaining) = remaining {
                nap = nap.min(remaining + EXPIRY_MARGIN + BackoffTimer::jitter(EXPIRY_MARGIN));
            }
            let nap = nap.min(deadline - now);
            tokio::select! {
                handed = handoff.handed_off() => {
                    // The hand-off consumed the queue entry that attempt
                    // `handed.attempt` refreshed, so the lock's TTL runs from
                    // after that attempt was sent: the lease is counted from
                    // there, never from a later attempt (a hand-off heard
                    // late, after this waiter queued again, may have expired
                    // and gone to someone else meanwhile). Long after that
                    // attempt (waiters refresh every 0.4-0.8 s, longer than a
                    // short lease), or for an attempt no longer remembered,
                    // the count would leave little lease or none: then the
                    // next attempt confirms the hand-off instead (it finds
                    // the lock ours and resets its TTL to the whole lease).
                    let fencing_token = handed.fencing_token;
                    let ttl = self.handoff_ttl();
                    let sent_at = if handed.attempt == 1 {
                        Some(self.started)
                    } else {
                        self.recent_attempts
                            .iter()
                            .find(|(n, _)| *n == handed.attempt)
                            .map(|(_, at)| *at)
                    };
                    let take_as_it_comes = self.takes_handoff_as_it_comes();
                    if let Some(sent_at) =
                        sent_at.filter(|at| take_as_it_comes && at.elapsed() < ttl / 3)
                    {
                        withdraw.disarm();
                        tracing::trace!(target: "distlock::acquire", fencing_token, "handed off");
                        return self.grant(manager, fencing_token, sent_at, Some(ttl)).map(Some);
                    }
                    tracing::trace!(target: "distlock::acquire", fencing_token, "handed off long after the attempt it answers, or replicas must acknowledge it, or the hold does not renew; confirming");
                }
                // The subscription is (re-)confirmed, or the manager is
                // shutting down: look again at once.
                _ = registration.woken() => {}
                _ = tokio::time::sleep(nap) => {}
            }
            if core.is_shut_down() {
                return Err(LockError::ShutDown {
                    key: self.key.clone(),
                });
            }
        }
    }

    /// The TTL a release gives the lock when it hands it to this queued
    /// waiter: at most the queue lease, so that a waiter that died holds
    /// the lock no longer. A holder that renews brings it up to the lease
    /// with its first renewal; one that does not confirms a longer lease
    /// with one more attempt (see [`takes_handoff_as_it_comes`]).
    ///
    /// [`takes_handoff_as_it_comes`]: Self::takes_handoff_as_it_comes
    fn handoff_ttl(&self) -> Duration {
        self.hold.lease.min(QUEUE_LEASE)
    }

    /// Whether a hand-off heard in time makes this waiter the holder as it
    /// comes. Not with `replica_ack`: the release that made it waited for
    /// no replica, so a failover could forget the lock and its token. Not
    /// for a hold that does not renew with a lease longer than the
    /// hand-off's TTL: no renewal would bring the TTL up to the lease. The
    /// next attempt confirms it then (it finds the lock ours and sets its
    /// TTL to the whole lease, waiting for the replicas if asked): one
    /// round trip more.
    fn takes_handoff_as_it_comes(&self) -> bool {
        self.core.config.replica_ack.is_none()
            && (self.hold.renew || self.hold.lease <= self.handoff_ttl())
    }

    /// One acquire script.
    async fn attempt(&mut self) -> Result<Attempt, LockError> {
        self.attempts += 1;
        let sent_at = Instant::now();
        self.last_sent = sent_at;
        // Attempt 1 is not recorded: `started`, a little earlier than its
        // send, stands for it (an earlier send time only shortens the lease
        // the holder trusts), so a lock taken at once allocates nothing here.
        if self.queue && self.attempts > 1 {
            if self.recent_attempts.len() == RECENT_ATTEMPTS {
                self.recent_attempts.pop_front();
            }
            self.recent_attempts.push_back((self.attempts, sent_at));
        }
        let lease_ms = u64::try_from(self.hold.lease.as_millis()).unwrap_or(u64::MAX);
        let retention_ms =
            u64::try_from(self.core.config.fence_retention.as_millis()).unwrap_or(u64::MAX);
        // If this future is dropped while the script is in flight, the server
        // may still run it and take the lock in our name: release it by token.
        // The acquisition ends with it (an error, or the caller gone), so it
        // is given back as a left-behind grant is: on every Redlock member.
        let mut in_flight = ReleaseOnDrop::new(|| {
            tracing::debug!(target: "distlock::acquire",
                key = %KeyPreview(&self.key),
                "acquire reply lost; releasing by owner token in the background"
            );
            give_back_in_background(
                self.core,
                self.key.clone(),
                self.keys.clone(),
                self.owner.clone(),
                self.hold.lease,
            );
        });
        let reply = self
            .core
            .backend
            .acquire(
                &self.key,
                &self.keys,
                &self.owner,
                lease_ms,
                &AcquireSpec {
                    fence_ttl_ms: self
                        .hold
                        .eager_fencing
                        .then(|| lease_ms.saturating_add(retention_ms)),
                    waiting: self.waiting,
                    queue: self.queue,
                    since_ms: crate::info::now_ms(),
                    holder: &self.core.config.holder,
                    resize_permits: self.resize_permits,
                    largest_waiting_weight: if self.waiting {
                        self.core
                            .subscriber
                            .largest_waiting_weight(self.keys.channel())
                    } else {
                        1
                    },
                    queue_lease_ms: u64::try_from(QUEUE_LEASE.as_millis()).unwrap_or(u64::MAX),
                    handoff_ttl_ms: u64::try_from(self.handoff_ttl().as_millis())
                        .unwrap_or(u64::MAX),
                    handoff_route: &self.core.handoff_route,
                    attempt: self.attempts,
                },
            )
            .await;
        telemetry::round_trip(|| sent_at.elapsed());
        let (reply, left_behind) = match reply {
            Ok(AcquireReply::LeftBehind { foreign: true, .. }) => (Ok(AcquireReply::Foreign), true),
            Ok(AcquireReply::LeftBehind { remaining, .. }) => {
                (Ok(AcquireReply::Busy { remaining }), true)
            }
            other => (other, false),
        };
        match reply {
            Ok(AcquireReply::Acquired {
                fencing_token,
                permits_left,
            }) => {
                in_flight.disarm();
                Ok(Attempt::Acquired {
                    fencing_token,
                    sent_at,
                    permits_left,
                })
            }
            Ok(AcquireReply::Busy { remaining }) => {
                in_flight.disarm();
                drop(in_flight);
                self.left_behind_or_not(left_behind);
                Ok(Attempt::Busy(remaining))
            }
            Ok(AcquireReply::Foreign | AcquireReply::LeftBehind { .. }) => {
                in_flight.disarm();
                drop(in_flight);
                self.left_behind_or_not(left_behind);
                Err(LockError::ForeignValue {
                    key: self.key.clone(),
                })
            }
            Ok(AcquireReply::PermitsDiffer { held_with }) => {
                in_flight.disarm();
                let requested = match self.keys.kind {
                    LockKind::Permit { permits } => permits,
                    _ => 0,
                };
                Err(LockError::PermitsDiffer {
                    key: self.key.clone(),
                    held_with,
                    requested,
                })
            }
            Err(e) => {
                if !e.maybe_executed {
                    in_flight.disarm();
                }
                Err(e.error)
            }
        }
    }

    /// While armed, a waiter leaving without the lock withdraws in the
    /// background: its queue entry (the default lock), or its writer intent
    /// (a write lock), with one release script by its owner token, which also
    /// gives back a lock handed to it meanwhile. Otherwise new readers stay
    /// shut out for the rest of its lease, or the queue is held up for the
    /// rest of the entry's queue lease.
    fn withdraw_on_drop(&self) -> ReleaseOnDrop<impl FnOnce()> {
        let (core, key, keys, owner, lease) = (
            self.core.clone(),
            self.key.clone(),
            self.keys.clone(),
            self.owner.clone(),
            self.hold.lease,
        );
        ReleaseOnDrop::new(move || release_in_background(&core, key, keys, owner, lease, None))
    }

    /// After an attempt that did not take the lock: arms
    /// [`Acquisition::left_behind`] when it may have left a grant (once).
    /// A later clean attempt does not disarm it: a member that held the
    /// earlier grant may have answered that one with an error that says
    /// nothing of it (still loading its data, say), and the give-back costs
    /// nothing where nothing is left.
    fn left_behind_or_not(&mut self, left_behind: bool) {
        if !left_behind || self.left_behind.is_some() {
            return;
        }
        let (core, key, keys, owner, lease) = (
            self.core.clone(),
            self.key.clone(),
            self.keys.clone(),
            self.owner.clone(),
            self.hold.lease,
        );
        self.left_behind = Some(ReleaseOnDrop::new(Box::new(move || {
            give_back_in_background(&core, key, keys, owner, lease);
        })));
    }

    /// Hands the lock to a guard. The acquisition is done with its names and
    /// owner token, so the lease takes them over rather than copies them.
    /// `handed_off`: the lock came by a queue's hand-off, which set this
    /// TTL some time after `sent_at` (see `Lease::handed_off`).
    fn grant(
        mut self,
        manager: Arc<ManagerInner>,
        fencing_token: u64,
        sent_at: Instant,
        handed_off: Option<Duration>,
    ) -> Result<LockGuard, LockError> {
        // Whatever an attempt left behind is part of this hold now.
        if let Some(mut left_behind) = self.left_behind.take() {
            left_behind.disarm();
        }
        let Acquisition {
            core,
            keys,
            owner,
            key,
            hold,
            started,
            attempts,
            waiting,
            ..
        } = self;
        let new = NewLease {
            id: config::next_id(),
            manager_id: core.id,
            key,
            keys,
            owner,
            fencing_token,
            hold,
            epoch: core.epoch,
            sent_at,
            acquired_at: Instant::now(),
            waited: waiting || handed_off.is_some(),
        };
        let lease = crate::guard::grant(core, new, started, handed_off, false)?;
        tracing::debug!(target: "distlock::acquire",
            waited_ms = started.elapsed().as_millis() as u64,
            attempts,
            fencing_token = lease.fencing_token(),
            "acquired"
        );
        Ok(LockGuard::new(manager, lease))
    }

    fn timeout(&self) -> LockError {
        let waited = self.started.elapsed();
        telemetry::timed_out(self.hold.metrics_label);
        tracing::debug!(target: "distlock::acquire",
            waited_ms = waited.as_millis() as u64,
            attempts = self.attempts,
            "timed out"
        );
        LockError::Timeout {
            key: self.key.clone(),
            waited,
        }
    }
}

enum Attempt {
    /// Ours, with this fencing token, by the attempt sent at `sent_at`; a
    /// semaphore has `permits_left` permits still free (0 for other kinds).
    Acquired {
        fencing_token: u64,
        sent_at: Instant,
        permits_left: u32,
    },
    Busy(Option<Duration>),
}
