//! Multi-key locks: `LockManager::lock_all`, `MultiLockRequest`, `MultiLockGuard`.
//!
//! A multi-key lock is one ordinary exclusive lease per key (the same Redis
//! value, lease, renewal and fencing counter as `LockManager::lock`), taken all
//! or nothing, in one global order (the keys sorted by bytes), so that two
//! multi-key locks over overlapping keys never deadlock.
//!
//! On one server (`Single`, `Sentinel`) an uncontended acquisition is one
//! script call (`acquire_all.lua`), which takes every lock or, when one is
//! busy, none. A free lock whose queue has a live waiter (its holder's lease
//! ran out) counts as busy and is handed to that waiter, as a single lock's
//! waiting acquisition does, so that one call never takes a key past its
//! queue (the ordered path below starts each key with a single lock's
//! attempt, which has the documented window after an expiry). When one is busy and the caller may wait, the locks are taken
//! one by one in the global order with the ordinary acquisition (its waiting,
//! wake-ups and fairness included), holding the earlier ones while waiting for
//! the next: ordered locking cannot deadlock. In a cluster (locks in distinct
//! slots) and under Redlock the locks are always taken that way, one round
//! trip per key when uncontended.
//!
//! On PostgreSQL the one call is a function call (`acquire_all` in
//! `schema.sql`), one transaction that takes every lock or none, its keys'
//! transaction locks taken in one global order; a deadlock abort of that
//! call is sent again by the backend, never surfaced. Busy locks are waited
//! for on the ordered path, as on one Redis server.
//!
//! A multi-key lock takes at most [`MAX_LOCK_ALL_KEYS`] keys: the one-script
//! path runs inside Redis, which serves no one else meanwhile, for a time that
//! grows with the number of keys, so that number is capped here rather than
//! left to the caller.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::backend::{AcquireAllReply, AcquireSpec};
use crate::config::{self, Backoff};
use crate::context::LockContext;
use crate::core::{Core, ManagerInner};
use crate::error::{KeyPreview, LockError};
use crate::guard::grant;
use crate::keys::{self, LockKind, RedisNames};
use crate::lease::{Lease, NewLease};
use crate::options::{Hold, HoldOptions, Patience};
use crate::release::{drop_holds, release_holds, release_in_background, ReleaseOnDrop};
use crate::request::{reenter, LockRequest};
use crate::telemetry;

/// The most distinct keys one [`LockManager::lock_all`](crate::LockManager::lock_all)
/// may lock; a request for more fails with [`LockError::InvalidConfig`] before
/// any Redis call.
///
/// On one server every key is taken by a single script, and Redis runs nothing
/// else until it returns: the cap keeps that script to about a millisecond or
/// two on an ordinary server. Lock more keys by grouping them under fewer lock
/// names (one lock per account rather than per row, say).
pub const MAX_LOCK_ALL_KEYS: usize = 128;

/// Several locks about to be acquired together, all or nothing; from
/// [`LockManager::lock_all`](crate::LockManager::lock_all).
///
/// The keys are de-duplicated and sorted by their bytes: every multi-key
/// acquisition takes its locks in that one global order, so `lock_all([a, b])`
/// and `lock_all([b, a])` never deadlock. Each key gets an ordinary exclusive
/// lease (the one [`LockManager::lock`](crate::LockManager::lock) takes), so a
/// single-key lock and a multi-key lock over the same key exclude each other.
///
/// The order holds among the locks one `lock_all` takes, not with those its
/// call chain already holds: a chain that holds `b` (re-entered here) and
/// waits for `a`, against another `lock_all([a, b])` that took `a` and waits
/// for `b`, is the ordinary lock-ordering deadlock, ended only by `wait`.
/// Take a chain's locks in one `lock_all`, or in the same order everywhere.
///
/// The options are those of [`LockRequest`] and apply to every key.
#[derive(Debug, Clone)]
#[must_use = "a lock request does nothing until .acquire().await or .try_acquire().await"]
pub struct MultiLockRequest {
    manager: Arc<ManagerInner>,
    /// De-duplicated, sorted.
    keys: Vec<String>,
    /// Every key's lease is taken with them.
    options: HoldOptions,
}

impl MultiLockRequest {
    pub(crate) fn new(manager: Arc<ManagerInner>, mut keys: Vec<String>) -> Self {
        keys.sort_unstable();
        keys.dedup();
        MultiLockRequest {
            manager,
            keys,
            options: HoldOptions::default(),
        }
    }

    /// Whether keys that the current call chain already holds are re-entered
    /// (default: true); off, such a request fails at once with
    /// [`LockError::AlreadyHeld`] naming the first of them. See
    /// [`LockRequest::reentrant`].
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.options.reentrant = reentrant;
        self
    }

    /// How the ordered path paces its attempts on a busy lock (default: the
    /// manager's); see [`LockRequest::backoff`].
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.options.backoff = Some(backoff);
        self
    }

    /// Whether each key's fencing token is issued inside the acquisition
    /// (default: the manager's); see [`LockRequest::eager_fencing`].
    pub fn eager_fencing(mut self, eager: bool) -> Self {
        self.options.eager_fencing = Some(eager);
        self
    }

    /// The lease of every lock (see [`LockRequest::lease`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options.lease = Some(lease);
        self
    }

    /// How long [`acquire`](Self::acquire) may wait, in all, for the locks
    /// that are busy before it returns [`LockError::Timeout`] (default: the
    /// manager's); see [`LockRequest::wait`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.options.wait = Some(wait);
        self
    }

    /// Whether the leases are renewed while the guard lives (default true);
    /// see [`LockRequest::renew`].
    pub fn renew(mut self, renew: bool) -> Self {
        self.options.renew = renew;
        self
    }

    /// The longest each lock may be held, counted from its own grant (see
    /// [`LockRequest::max_hold`]); once one lease reaches it, the guard
    /// reports a loss.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.options.max_hold = Some(max_hold);
        self
    }

    /// The shortest each lock is held, counted from its own grant (see
    /// [`LockRequest::min_hold`]).
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.options.min_hold = Some(min_hold);
        self
    }

    /// Labels the metrics of these locks (see [`LockRequest::metrics_label`]);
    /// each key counts as one lock in them.
    pub fn metrics_label(mut self, label: &'static str) -> Self {
        self.options.metrics_label = Some(label);
        self
    }

    /// The keys this request locks: de-duplicated, in lock order (sorted by bytes).
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Takes every lock, waiting up to `wait` in all while some are busy; all
    /// or nothing: on an error, a timeout or when the future is dropped, no
    /// lock of this acquisition stays held (a lock whose reply was lost is
    /// released by owner token in the background).
    ///
    /// Keys that this call chain already holds (inside
    /// [`MultiLockGuard::scope`], [`LockGuard::scope`](crate::LockGuard::scope)
    /// or a locked function) are re-entered, sharing the outer lease and
    /// fencing token; the others are acquired. An empty key set gives an empty
    /// guard at once, without a Redis call.
    ///
    /// Cost when no lock is busy: one round trip on one server (a script that
    /// takes them all) and on PostgreSQL (a function call); one per key in a
    /// Redis Cluster or under Redlock. When one is busy, the locks are taken
    /// one by one in lock order, the earlier ones held while waiting for the
    /// next.
    ///
    /// # Errors
    /// [`LockError::Timeout`] (naming the key waited for) once `wait` has
    /// passed, [`LockError::InvalidKey`] / [`LockError::InvalidConfig`] for bad
    /// input (`InvalidConfig` for more than [`MAX_LOCK_ALL_KEYS`] distinct
    /// keys, before any Redis call), [`LockError::Lost`] when re-entering a hold whose lease was lost,
    /// when a grant's reply came after its lease's deadline,
    /// or when a lock taken first was lost while the others were waited for
    /// (a lease shorter than the wait with `renew(false)`; everything taken
    /// is given back), [`LockError::Backend`] when Redis fails or does not
    /// answer in time.
    pub async fn acquire(self) -> Result<MultiLockGuard, LockError> {
        let key = self.keys.first().cloned().unwrap_or_default();
        match self.run(Patience::Wait).await? {
            Some(guard) => Ok(guard),
            // Waiting turns a busy lock into `Timeout` itself.
            None => Err(LockError::Timeout {
                key,
                waited: Duration::ZERO,
            }),
        }
    }

    /// Makes one attempt: `Ok(None)` when another owner holds any of the
    /// locks, and then none of them is held.
    pub async fn try_acquire(self) -> Result<Option<MultiLockGuard>, LockError> {
        self.run(Patience::Once).await
    }

    async fn run(self, patience: Patience) -> Result<Option<MultiLockGuard>, LockError> {
        let MultiLockRequest {
            manager,
            keys,
            options,
        } = self;
        check_key_count(&keys)?;
        for key in &keys {
            keys::validate_key(key)?;
        }
        let core = manager.core.clone();
        let options = options.resolve(&core.config, patience)?;
        let (lease, wait, reentrant, metrics_label) = (
            options.lease,
            options.wait,
            options.reentrant,
            options.metrics_label,
        );
        let mut taken = MultiLockGuard::new(manager.clone());
        taken.acquiring_since = Some(Instant::now());
        let Some(first) = keys.first() else {
            return Ok(Some(taken));
        };
        if core.is_shut_down() {
            return Err(LockError::ShutDown { key: first.clone() });
        }
        let span = tracing::debug_span!(target: "distlock::acquire",
            "distlock.acquire_all",
            keys = keys.len(),
            first_key = %KeyPreview(first),
            lease_ms = lease.as_millis() as u64,
            wait_ms = wait.as_millis() as u64,
        );
        let started = Instant::now();
        let acquired = async {
            // Re-entry first: no round trip, and the holds it takes are given
            // back by `taken` if the rest cannot be had.
            let mut to_take = Vec::with_capacity(keys.len());
            if !reentrant {
                if let Some(key) = keys.iter().find(|key| {
                    LockContext::find(core.id, key, LockKind::Exclusive.family()).is_some()
                }) {
                    return Err(LockError::AlreadyHeld { key: key.clone() });
                }
            }
            for key in &keys {
                match LockContext::find(core.id, key, LockKind::Exclusive.family())
                    .map(|held| reenter(&manager, held))
                {
                    Some(Ok(Some(guard))) => taken.push(guard.into_lease()),
                    Some(Err(e)) => return Err(e),
                    // Not held, or its last hold went since the lookup.
                    None | Some(Ok(None)) => to_take.push(key.as_str()),
                }
            }
            if to_take.is_empty() {
                return Ok(Some(taken));
            }
            // One owner token for every key taken in one script; keys taken
            // one by one get tokens of their own that open with the same
            // acquisition id (operators see which keys go together). Both
            // end with the manager's route, which listens from now on: a
            // waiter that queues tells it, as for one lock.
            // (Redlock's waiters do not queue: nobody would tell it.)
            if !matches!(core.backend, crate::backend::Backend::Redlock(_)) {
                core.listen_for_waiters();
            }
            let owner = config::owner_token_routed(&core.handoff_route);
            match one_script(&core, &to_take, &owner, options, started, &mut taken).await {
                OneScript::Done(result) => return result.map(|()| Some(taken)),
                OneScript::Busy(_) if patience == Patience::Once => {
                    telemetry::busy(metrics_label);
                    return Ok(None);
                }
                OneScript::Busy(key) if wait.is_zero() => {
                    // One attempt, and it found a lock busy: nothing to wait for.
                    telemetry::timed_out(metrics_label);
                    return Err(LockError::Timeout {
                        key,
                        waited: started.elapsed(),
                    });
                }
                OneScript::Busy(_) | OneScript::Unsupported => {}
            }
            let deadline = started + wait;
            let outcome = ordered(
                &manager,
                &owner[..crate::info::ACQUISITION_ID_LEN],
                &to_take,
                options,
                (patience == Patience::Wait).then_some(deadline),
                &mut taken,
            )
            .await;
            match outcome {
                // A lock taken early may have been lost while the later ones
                // were waited for (its lease ran out unrenewed, or a renewal
                // found it taken): handed out, the guard would claim a lock
                // another may hold.
                Ok(true) => match taken.leases.iter().find(|l| l.is_lost()) {
                    None => Ok(Some(taken)),
                    Some(lost) => {
                        let key = lost.key.clone();
                        taken.give_back().await;
                        tracing::debug!(target: "distlock::acquire",
                            key = %KeyPreview(&key),
                            "a lock taken first was lost while the others were waited for"
                        );
                        Err(LockError::Lost { key })
                    }
                },
                Ok(false) => {
                    // All or nothing: give back what was taken before returning.
                    taken.give_back().await;
                    Ok(None)
                }
                Err(LockError::Timeout { key, .. }) => {
                    taken.give_back().await;
                    let waited = started.elapsed();
                    tracing::debug!(target: "distlock::acquire",
                        waited_ms = waited.as_millis() as u64,
                        key = %KeyPreview(&key),
                        "timed out"
                    );
                    Err(LockError::Timeout { key, waited })
                }
                Err(e) => {
                    taken.give_back().await;
                    Err(e)
                }
            }
        }
        .instrument(span)
        .await;
        Ok(acquired?.map(|mut guard| {
            guard.finish();
            tracing::debug!(target: "distlock::acquire",
                keys = guard.keys.len(),
                waited_ms = started.elapsed().as_millis() as u64,
                "acquired all"
            );
            guard
        }))
    }
}

enum OneScript {
    /// The backend cannot take them in one script.
    Unsupported,
    /// The lock of this key was busy; none was taken.
    Busy(String),
    /// All taken (into `taken`), or an error (nothing taken).
    Done(Result<(), LockError>),
}

/// The one-round-trip path: the acquire-all script.
async fn one_script(
    core: &Arc<Core>,
    to_take: &[&str],
    owner: &str,
    options: Hold,
    started: Instant,
    taken: &mut MultiLockGuard,
) -> OneScript {
    let names: Vec<RedisNames> = to_take.iter().map(|key| core.keys(key)).collect();
    let refs: Vec<&RedisNames> = names.iter().collect();
    let owner = owner.to_owned();
    let lease_ms = u64::try_from(options.lease.as_millis()).unwrap_or(u64::MAX);
    let retention_ms = u64::try_from(core.config.fence_retention.as_millis()).unwrap_or(u64::MAX);
    let spec = AcquireSpec::without_waiting(
        &core.config.holder,
        options
            .eager_fencing
            .then(|| lease_ms.saturating_add(retention_ms)),
    );
    let first = to_take.first().copied().unwrap_or_default();
    // If this future is dropped while the script is in flight, the server may
    // still run it and take the locks in our name: release them by token.
    let mut in_flight = ReleaseOnDrop::new(|| {
        tracing::debug!(target: "distlock::acquire",
            keys = to_take.len(),
            "acquire-all reply lost; releasing by owner token in the background"
        );
        for (key, names) in to_take.iter().zip(&names) {
            release_in_background(
                core,
                (*key).to_owned(),
                names.clone(),
                owner.clone(),
                options.lease,
                None,
            );
        }
    });
    let sent_at = Instant::now();
    let reply = core
        .backend
        .acquire_all(first, &refs, &owner, lease_ms, &spec)
        .await;
    let reply = match reply {
        None => {
            in_flight.disarm();
            return OneScript::Unsupported;
        }
        Some(reply) => reply,
    };
    telemetry::round_trip(|| sent_at.elapsed());
    match reply {
        Ok(AcquireAllReply::Foreign { index }) => {
            in_flight.disarm();
            OneScript::Done(Err(LockError::ForeignValue {
                key: to_take.get(index).copied().unwrap_or(first).to_owned(),
            }))
        }
        Ok(AcquireAllReply::Busy { index, remaining }) => {
            in_flight.disarm();
            tracing::debug!(target: "distlock::acquire",
                busy_key = %KeyPreview(to_take.get(index).copied().unwrap_or_default()),
                remaining_ms = remaining.map(|r| r.as_millis() as u64),
                "one of the locks is busy; none taken"
            );
            OneScript::Busy(to_take.get(index).copied().unwrap_or(first).to_owned())
        }
        Ok(AcquireAllReply::Acquired { fencing_tokens }) => {
            in_flight.disarm();
            drop(in_flight);
            let acquired_at = Instant::now();
            let granted = to_take.iter().zip(names).zip(fencing_tokens);
            let mut granted = granted.peekable();
            while let Some(((key, keys), fencing_token)) = granted.next() {
                let new = NewLease {
                    id: config::next_id(),
                    manager_id: core.id,
                    key: (*key).to_owned(),
                    keys,
                    owner: owner.clone(),
                    fencing_token,
                    hold: options,
                    epoch: core.epoch,
                    sent_at,
                    acquired_at,
                    // Released with the whole set, by the script that hands
                    // each lock over (release_many).
                    waited: true,
                };
                match grant(core, new, started, None, false) {
                    Ok(lease) => taken.leases.push(lease),
                    Err(e) => {
                        // The manager was shut down while the script was in
                        // flight, or its reply came after the leases' end:
                        // `grant` gave this lock back; the rest go too (those
                        // already granted go with `taken`, or went with the
                        // shutdown's releases).
                        for ((key, keys), _) in granted {
                            let key = (*key).to_owned();
                            release_in_background(
                                core,
                                key,
                                keys,
                                owner.clone(),
                                options.lease,
                                None,
                            );
                        }
                        return OneScript::Done(Err(e));
                    }
                }
            }
            OneScript::Done(Ok(()))
        }
        Err(e) => {
            if !e.maybe_executed {
                in_flight.disarm();
            }
            OneScript::Done(Err(e.error))
        }
    }
}

/// Refuses more than [`MAX_LOCK_ALL_KEYS`] distinct keys.
fn check_key_count(keys: &[String]) -> Result<(), LockError> {
    if keys.len() <= MAX_LOCK_ALL_KEYS {
        return Ok(());
    }
    Err(LockError::InvalidConfig(format!(
        "lock_all of {} distinct keys (the first {}): at most {MAX_LOCK_ALL_KEYS} per call",
        keys.len(),
        KeyPreview(&keys[0]),
    )))
}

/// The ordered path: each lock with the ordinary acquisition, in lock order.
/// `deadline`: wait for busy locks until then; `None`: one attempt per lock.
/// `Ok(false)` when a lock was busy and `deadline` is `None`.
async fn ordered(
    manager: &Arc<ManagerInner>,
    acquisition: &str,
    to_take: &[&str],
    options: Hold,
    deadline: Option<Instant>,
    taken: &mut MultiLockGuard,
) -> Result<bool, LockError> {
    for key in to_take {
        let request = LockRequest::new(manager.clone(), (*key).to_owned())
            .with_options(options.as_options())
            .in_acquisition(acquisition);
        let guard = match deadline {
            None => match request.try_acquire().await? {
                Some(guard) => guard,
                None => return Ok(false),
            },
            Some(deadline) => {
                request
                    .wait(deadline.saturating_duration_since(Instant::now()))
                    .acquire()
                    .await?
            }
        };
        taken.push(guard.into_lease());
    }
    Ok(true)
}

/// Several held locks, from [`MultiLockRequest::acquire`]. Dropping it
/// releases them all in the background; [`release`](Self::release) releases
/// them and reports how that went.
///
/// Each lock has its own lease (renewed in the background like a
/// [`LockGuard`](crate::LockGuard)'s) and its own fencing token. The guard
/// counts as lost as soon as any one lease is lost: [`is_lost`](Self::is_lost)
/// turns true and [`lost`](Self::lost) completes.
#[must_use = "dropping the guard at once releases the locks at once"]
pub struct MultiLockGuard {
    /// Keeps the manager's background tasks (renewal above all) running.
    manager: Arc<ManagerInner>,
    /// The keys, sorted; `leases[i]` is the lease of `keys[i]`.
    keys: Vec<String>,
    /// One hold of each lease.
    leases: Vec<Arc<Lease>>,
    /// Set by `release`, so that `Drop` has nothing left to do.
    released: bool,
    /// While the acquisition runs, when it began: a lock it took itself was
    /// granted after that (a re-entered one before), and is given back
    /// without its `min_hold` if the acquisition fails (see `give_back`).
    acquiring_since: Option<Instant>,
    /// The `distlock.hold_all` span, from the grant to the release.
    hold_span: tracing::Span,
}

impl std::fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("keys", &self.keys)
            .field(
                "fencing_tokens",
                &self
                    .leases
                    .iter()
                    .map(|l| l.fencing_token())
                    .collect::<Vec<_>>(),
            )
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl MultiLockGuard {
    fn new(manager: Arc<ManagerInner>) -> Self {
        MultiLockGuard {
            manager,
            keys: Vec::new(),
            leases: Vec::new(),
            released: false,
            acquiring_since: None,
            hold_span: tracing::Span::none(),
        }
    }

    /// An acquisition that failed (or was dropped) gives back the locks it
    /// took itself at once: its caller never held them, so no `min_hold`
    /// keeps them. Re-entered holds keep their outer hold's.
    fn forgo_min_holds_of_taken(&self) {
        if let Some(since) = self.acquiring_since {
            for lease in self.leases.iter().filter(|l| l.granted_at >= since) {
                lease.forgo_min_hold();
            }
        }
    }

    /// Takes over one hold of `lease` (while the acquisition runs).
    fn push(&mut self, lease: Arc<Lease>) {
        self.leases.push(lease);
    }

    /// Puts the leases in key order once all are held.
    fn finish(&mut self) {
        self.acquiring_since = None;
        self.leases.sort_by(|a, b| a.key.cmp(&b.key));
        self.keys = self.leases.iter().map(|l| l.key.clone()).collect();
        if let Some(first) = self.keys.first() {
            self.hold_span = tracing::debug_span!(target: "distlock::lease",
                "distlock.hold_all",
                keys = self.keys.len(),
                first_key = %KeyPreview(first),
            );
        }
    }

    /// Gives back what a failed acquisition had taken, and waits for it.
    async fn give_back(&mut self) {
        self.forgo_min_holds_of_taken();
        let taken = std::mem::replace(self, MultiLockGuard::new(self.manager.clone()));
        if let Err(e) = taken.release().await {
            tracing::debug!(target: "distlock::acquire", error = %e, "giving back the locks taken");
        }
    }

    /// The keys held, de-duplicated, in lock order (sorted by bytes).
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The fencing token of each key, in [`keys`](Self::keys) order, issued
    /// now for the keys that have none (one round trip per key without one;
    /// see [`LockGuard::fencing_token`](crate::LockGuard::fencing_token)).
    ///
    /// # Errors
    /// [`LockError::Lost`] for the first key whose lease is lost,
    /// [`LockError::Backend`] when Redis fails,
    /// [`LockError::TokenNotReplicated`] with too few replicas confirming a
    /// token issued now (`replica_ack`).
    pub async fn fencing_tokens(&self) -> Result<Vec<u64>, LockError> {
        let mut tokens = Vec::with_capacity(self.leases.len());
        for lease in &self.leases {
            tokens.push(crate::guard::fencing_token_of(&self.manager.core, lease).await?);
        }
        Ok(tokens)
    }

    /// The fencing token of `key` (issued now if it has none), or `None` when
    /// this guard does not hold `key`.
    ///
    /// # Errors
    /// As [`fencing_tokens`](Self::fencing_tokens).
    pub async fn fencing_token(&self, key: &str) -> Result<Option<u64>, LockError> {
        let Ok(i) = self.keys.binary_search_by(|k| k.as_str().cmp(key)) else {
            return Ok(None);
        };
        match self.leases.get(i) {
            Some(lease) => crate::guard::fencing_token_of(&self.manager.core, lease)
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    /// True once any of the leases is lost (never for an empty guard).
    pub fn is_lost(&self) -> bool {
        self.lost_key().is_some()
    }

    /// The first key (in lock order) whose lease is lost.
    fn lost_key(&self) -> Option<&str> {
        self.leases
            .iter()
            .find(|l| l.is_lost())
            .map(|l| l.key.as_str())
    }

    /// Completes when any of the leases is lost (at once if one already is);
    /// never completes while they all hold, nor for an empty guard.
    pub async fn lost(&self) {
        let mut all: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = self
            .leases
            .iter()
            .map(|l| Box::pin(l.lost()) as Pin<Box<dyn Future<Output = ()> + Send + '_>>)
            .collect();
        poll_fn(|cx| {
            for lost in &mut all {
                if lost.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            Poll::Pending
        })
        .await
    }

    /// The least time any of the leases may still be trusted without another
    /// renewal (zero once one is lost; `Duration::MAX` for an empty guard).
    pub fn remaining_lease(&self) -> Duration {
        self.leases
            .iter()
            .map(|l| l.remaining())
            .min()
            .unwrap_or(Duration::MAX)
    }

    /// Runs `fut` with all these holds in the call chain's lock context: inside
    /// it, [`LockManager::lock`](crate::LockManager::lock) of one of the keys,
    /// or [`LockManager::lock_all`](crate::LockManager::lock_all) of some of
    /// them, on the same manager re-enters at once (same leases, same fencing
    /// tokens) instead of waiting for ourselves.
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        crate::context::scope_with_all(&self.leases, fut).await
    }

    /// Like [`scope`](Self::scope), but stops `fut` when any lease is lost:
    /// `fut` is dropped at its next poll and the result is
    /// `Err(LockError::Lost)` naming the key whose lease was lost.
    pub async fn scope_until_lost<F: Future>(&self, fut: F) -> Result<F::Output, LockError> {
        let mut body = pin!(self.scope(fut));
        let mut lost = pin!(self.lost());
        poll_fn(|cx| {
            if let Some(key) = self.lost_key() {
                return Poll::Ready(Err(LockError::Lost {
                    key: key.to_owned(),
                }));
            }
            if let Poll::Ready(out) = body.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            match lost.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(LockError::Lost {
                    key: self
                        .lost_key()
                        .or(self.keys.first().map(String::as_str))
                        .unwrap_or_default()
                        .to_owned(),
                })),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }

    /// Releases every lock: one round trip per server (a pipeline of release
    /// scripts; with one lock left to release, the release of a
    /// [`LockGuard`](crate::LockGuard::release)), each lock deleted if it is still ours and its waiters woken
    /// (or kept until its `min_hold` has passed). Re-entrant holds only give
    /// back their count; a lock goes when the last hold of the call chain is
    /// released.
    ///
    /// # Errors
    /// [`LockError::Lost`] naming the first key whose lease had been lost (the
    /// others are released all the same), also when the call fails;
    /// [`LockError::Backend`] when Redis fails, in which case the releases
    /// are retried in the background until the leases end.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        release_holds(&self.manager.core, &self.leases).await
    }
}

impl Drop for MultiLockGuard {
    /// Releases every lock whose last hold this was, each from a background
    /// task of its own (as a [`LockGuard`](crate::LockGuard)'s drop does);
    /// never blocks.
    fn drop(&mut self) {
        if !self.released {
            self.forgo_min_holds_of_taken();
            drop_holds(&self.manager.core, &self.leases);
        }
    }
}
