//! Giving locks back: the one release of a guard's leases (a `LockGuard`'s one,
//! a `MultiLockGuard`'s several) and of a shutting-down manager's, at once or
//! from a background task.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{CallError, ExpectedWaiters};
use crate::core::{Core, ManagerInner};
use crate::error::{KeyPreview, LockError};
use crate::keys::RedisNames;
use crate::lease::Lease;

/// Gives back one hold of each of `leases` (a guard's) and releases in Redis
/// the locks whose last hold this was: one round trip, `release.lua` for one
/// lock (after `release_free.lua` when [`expected_waiters`] says so), a pipeline of release
/// scripts per server for several. Re-entrant holds only give back their
/// count.
///
/// `Err(LockError::Lost)` names the first key whose lease had been lost or
/// was found no longer ours (the others are released all the same);
/// `Err(LockError::Backend)` names the first lock to release when Redis
/// failed, and the releases go on in the background until the leases end.
pub(crate) async fn release_holds(
    core: &Arc<Core>,
    leases: &[Arc<Lease>],
) -> Result<(), LockError> {
    let Ended {
        last,
        mut lost,
        shut_down,
    } = end_holds(core, leases);
    // A lease the shutdown took released its lock already (or its lease
    // will): it counts as lost to this guard, as after the shutdown.
    if let Some(key) = shut_down {
        lost.get_or_insert(key);
    }
    let Some(first) = last.first() else {
        return lost.map_or(Ok(()), |key| Err(LockError::Lost { key }));
    };
    let first_key = first.lease.key.clone();
    // From here on nobody else will release: if this future is dropped before
    // the reply, the queued scripts may never be sent (or a NOSCRIPT retry may
    // be cut short), so hand the releases to the background.
    let mut pending = ReleaseOnDrop::new(|| release_each_in_background(core, &last));
    let started = Instant::now();
    let mut judge = |hold: &LastHold, ours: bool| {
        if ours {
            return;
        }
        if !hold.was_lost {
            tracing::warn!(target: "distlock::release",
                key = %KeyPreview(&hold.lease.key),
                fencing_token = hold.lease.fencing_token(),
                "lease lost: at release the lock was no longer ours"
            );
        }
        lost.get_or_insert_with(|| hold.lease.key.clone());
    };
    // The failure, if any, and the holds whose release it leaves unknown;
    // the others judged. One lock: no collection built unless it fails.
    let failed: Option<(CallError, Vec<&LastHold>)> = match last.as_slice() {
        [hold] => {
            let lease = &hold.lease;
            let reply = core
                .backend
                .release(
                    &lease.key,
                    &lease.keys,
                    &lease.owner,
                    lease.keep_ms(),
                    expected_waiters(core, lease),
                )
                .await;
            pending.disarm();
            match reply {
                Ok(ours) => {
                    judge(hold, ours);
                    None
                }
                Err(e) => Some((e, vec![hold])),
            }
        }
        _ => {
            let locks: Vec<(&RedisNames, &str, u64)> = last
                .iter()
                .map(|hold| {
                    (
                        &hold.lease.keys,
                        hold.lease.owner.as_str(),
                        hold.lease.keep_ms(),
                    )
                })
                .collect();
            let released = core.backend.release_many(&locks).await;
            pending.disarm();
            let mut unknown = Vec::new();
            for (hold, ours) in last.iter().zip(&released.ours) {
                match ours {
                    Some(ours) => judge(hold, *ours),
                    None => unknown.push(hold),
                }
            }
            released.error.map(|e| (e, unknown))
        }
    };
    let Some((e, unknown)) = failed else {
        tracing::debug!(target: "distlock::release",
            key = %KeyPreview(&first_key),
            locks = last.len(),
            lost = lost.is_some(),
            took_us = started.elapsed().as_micros() as u64,
            "released"
        );
        return lost.map_or(Ok(()), |key| Err(LockError::Lost { key }));
    };
    // The releases not confirmed are retried.
    let first_unknown = unknown
        .first()
        .map_or(first_key, |hold| hold.lease.key.clone());
    tracing::warn!(target: "distlock::release",
        key = %KeyPreview(&first_unknown),
        locks = last.len(),
        unknown = unknown.len(),
        error = %e.error,
        "release failed; retrying in the background"
    );
    for hold in unknown {
        release_lease_in_background(core, &hold.lease, hold.lease.min_hold_until());
    }
    // A lease lost before this release is what the caller must hear (its
    // work was unprotected); the failed call is retried.
    if let Some(key) = lost {
        return Err(LockError::Lost { key });
    }
    Err(match e.error {
        LockError::Backend { source, .. } => LockError::Backend {
            key: first_unknown,
            source,
        },
        other => other,
    })
}

/// [`LockManager::shutdown`](crate::LockManager::shutdown): stops the
/// manager ([`ManagerInner::stop`]) and releases every lock it held, in
/// pipelined batches. The releases of a batch that the store did not
/// confirm, and every batch not sent or not answered when this future is
/// dropped (a caller's timeout), go on in the background, one release per
/// lock, retried for up to a lease: a shutdown cut short leaves no lock to
/// its lease that a retry can free (while the runtime lives). Then waits
/// for the background releases (see [`Core::background_releases_finished`]).
pub(crate) async fn shut_down(inner: &ManagerInner) -> Result<(), LockError> {
    let core = &inner.core;
    let Some((leases, _done)) = inner.stop().await else {
        // Another call shuts the manager down and is done (or was dropped,
        // and what it had not confirmed went to the background): wait for
        // the background releases too, as that call would have.
        core.background_releases_finished().await;
        return Ok(());
    };
    const BATCH: usize = 512;
    // The first lease whose batch has no answer yet.
    let unanswered = AtomicUsize::new(0);
    // Not `release_lease_in_background`: when the runtime refuses the task
    // (this future is dropped as its runtime shuts down), that would block
    // on each lease in turn (a manager may hold thousands); these are left
    // to their leases then. (A task the runtime took and drops unfinished
    // releases over a blocking connection, as every background release
    // does, until one such release fails.)
    let mut cut_short = ReleaseOnDrop::new(|| {
        let from = unanswered.load(Ordering::Relaxed);
        for lease in leases.get(from..).unwrap_or_default() {
            release_in_background(
                core,
                lease.key.clone(),
                lease.keys.clone(),
                lease.owner.clone(),
                lease.duration(),
                lease.min_hold_until(),
            );
        }
    });
    let mut outcome = Ok(());
    for (i, batch) in leases.chunks(BATCH).enumerate() {
        let locks: Vec<_> = batch
            .iter()
            .map(|lease| (&lease.keys, lease.owner.as_str(), lease.keep_ms()))
            .collect();
        let released = core.backend.release_many(&locks).await;
        unanswered.store((i + 1) * BATCH, Ordering::Relaxed);
        let Some(e) = released.error else {
            tracing::debug!(
                target: "distlock::release",
                locks = locks.len(),
                released = released.ours.iter().filter(|r| **r == Some(true)).count(),
                "released at shutdown"
            );
            continue;
        };
        let unknown: Vec<&Arc<Lease>> = batch
            .iter()
            .zip(&released.ours)
            .filter_map(|(lease, ours)| ours.is_none().then_some(lease))
            .collect();
        tracing::warn!(
            target: "distlock::release",
            locks = locks.len(),
            unknown = unknown.len(),
            error = %e.error,
            "could not release at shutdown; retrying in the background"
        );
        let first_unknown = unknown.first().map(|lease| lease.key.clone());
        for lease in unknown {
            release_lease_in_background(core, lease, lease.min_hold_until());
        }
        // The first failure is the one returned. A batch's call names no
        // key: the first lock of the batch not released is the one named.
        if outcome.is_ok() {
            outcome = Err(match (e.error, first_unknown) {
                (LockError::Backend { key, source }, Some(first)) if key.is_empty() => {
                    LockError::Backend { key: first, source }
                }
                (error, _) => error,
            });
        }
    }
    cut_short.disarm();
    // The guards dropped before the shutdown are released by tasks of their
    // own (and a counting semaphore's permits taken by a call cut short are
    // given back by one), as are the releases that failed above.
    core.background_releases_finished().await;
    outcome
}

/// What a guard's `Drop` does: gives back one hold of each of `leases`, and
/// releases the locks whose last hold this was, each from a background task of
/// its own. Never blocks.
pub(crate) fn drop_holds(core: &Arc<Core>, leases: &[Arc<Lease>]) {
    let ended = end_holds(core, leases);
    release_each_in_background(core, &ended.last);
}

/// A lease whose last hold a guard gave back.
struct LastHold {
    lease: Arc<Lease>,
    /// It had been lost before (and said so then).
    was_lost: bool,
}

/// What giving back a guard's holds leaves to do.
struct Ended {
    /// The leases whose last hold went: released locally, their locks still
    /// held in Redis.
    last: Vec<LastHold>,
    /// The first key whose lease was found lost.
    lost: Option<String>,
    /// The first key whose lease the manager's shutdown took (and
    /// released) before this release could: not among `last`.
    shut_down: Option<String>,
}

/// The local part of a release, the same for `release()` and `Drop`: one hold
/// of each lease given back; a lease whose last hold this was is marked
/// released, leaves the renewal task and, unless the manager's shutdown took
/// it out first (and releases it), is in `last` and counts as released.
/// Which of the two takes a lease out is decided under the renewal map's
/// lock: a shutdown that starts after this release took it out does not see
/// it, and this release still sends it.
fn end_holds(core: &Core, leases: &[Arc<Lease>]) -> Ended {
    let mut ended = Ended {
        last: Vec::with_capacity(leases.len()),
        lost: None,
        shut_down: None,
    };
    for lease in leases {
        let was_lost = if lease.drop_hold() {
            let was_lost = lease.mark_released();
            if !core.renewals.remove(lease.id) && core.is_shut_down() {
                ended.shut_down.get_or_insert_with(|| lease.key.clone());
            } else {
                ended.last.push(LastHold {
                    lease: lease.clone(),
                    was_lost,
                });
            }
            was_lost
        } else {
            lease.is_lost()
        };
        if was_lost {
            ended.lost.get_or_insert_with(|| lease.key.clone());
        }
    }
    for LastHold { lease, .. } in &ended.last {
        crate::telemetry::released(lease.metrics_label, || lease.granted_at.elapsed());
    }
    ended
}

fn release_each_in_background(core: &Arc<Core>, last: &[LastHold]) {
    for LastHold { lease, .. } in last {
        release_lease_in_background(core, lease, lease.min_hold_until());
    }
}

/// Runs its release if dropped while armed: the one "release in the
/// background if this is dropped" of the crate (the pattern of sqlx's
/// `DecrementSizeGuard`). Every path that sends a command whose effect it may
/// not learn (an acquisition or a release in flight, whose future may be
/// dropped or whose reply may be lost; a queue entry to withdraw) holds one,
/// and disarms it once the outcome is known. The release is a closure, so
/// that an armed guard costs nothing until it fires.
#[must_use = "dropped at once, the guard releases at once"]
pub(crate) struct ReleaseOnDrop<F: FnOnce()> {
    release: Option<F>,
}

impl<F: FnOnce()> ReleaseOnDrop<F> {
    pub(crate) fn new(release: F) -> Self {
        ReleaseOnDrop {
            release: Some(release),
        }
    }

    /// The outcome is known: nothing to release on drop.
    pub(crate) fn disarm(&mut self) {
        self.release = None;
    }
}

impl<F: FnOnce()> Drop for ReleaseOnDrop<F> {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// What the manager knows of the waiters of `lease`'s lock, which picks how
/// its release alone is sent (see `Backend::release`). Likely when a waiter
/// of another manager told this one that it queued (its notice on the
/// hand-off channel, see `acquire.lua`) or another acquisition of this
/// manager is queued for it: the full release hands the lock over in one
/// round trip. Unknown when the hold waited for the lock (others may still
/// queue). Otherwise unlikely: the script that declares the lock's key alone
/// goes first. (A release in the background sends the full release.)
fn expected_waiters(core: &Core, lease: &Lease) -> ExpectedWaiters {
    // Asked first, so that the notice is forgotten whatever the answer.
    let told = core.subscriber.take_waited_for(&lease.owner);
    if told || core.subscriber.has_queued(&lease.keys.lock) {
        ExpectedWaiters::Likely
    } else if lease.waited {
        ExpectedWaiters::Unknown
    } else {
        ExpectedWaiters::Unlikely
    }
}

/// [`release_in_background`] of a granted lease, keeping the lock until
/// `keep_until` (its `min_hold`, if the holder had it). Held: when the
/// manager's own runtime refuses the task because it is shutting down (a
/// guard of a task it drops), the release blocks instead (see
/// [`spawn_release`]).
pub(crate) fn release_lease_in_background(
    core: &Arc<Core>,
    lease: &Lease,
    keep_until: Option<Instant>,
) {
    spawn_release(
        core,
        lease.key.clone(),
        lease.keys.clone(),
        lease.owner.clone(),
        lease.duration(),
        keep_until,
        Origin::Held,
    );
}

/// Deletes the lock if `owner` still holds it, from a task of its own, retrying
/// until it succeeds or the lease has run out anyway. Never blocks. Until
/// `keep_until` (a `min_hold`), it keeps the lock until then instead.
///
/// If the runtime shuts down before the task has finished (a guard dropped as
/// `#[tokio::main]` returns), the task is dropped unfinished and releases over a
/// blocking connection instead, bounded by the connect and command timeouts,
/// so that the next run of the program does not wait out the lease; so does
/// a release the shutting-down runtime refuses to spawn (a guard of a task
/// it drops). When the runtime is already gone, `spawn` drops the task at
/// once: then nothing blocks and the lease frees the lock.
pub(crate) fn release_in_background(
    core: &Arc<Core>,
    key: String,
    keys: RedisNames,
    owner: String,
    lease: Duration,
    keep_until: Option<Instant>,
) {
    spawn_release(core, key, keys, owner, lease, keep_until, Origin::CleanUp);
}

/// [`release_in_background`] of what an acquisition that leaves without the
/// lock may have left in its name on some Redlock member
/// (`AcquireReply::LeftBehind`): done only once every member answered (or
/// refused connections: down), where another release is done once a majority did (see
/// `Backend::release_everywhere`).
pub(crate) fn give_back_in_background(
    core: &Arc<Core>,
    key: String,
    keys: RedisNames,
    owner: String,
    lease: Duration,
) {
    spawn_release(core, key, keys, owner, lease, None, Origin::LeftBehind);
}

/// What a background release gives back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A lock its caller held.
    Held,
    /// An acquisition's clean-up: a queue entry, or a lock an attempt in
    /// flight may have taken.
    CleanUp,
    /// A grant an acquisition left on a Redlock member it could not reach.
    LeftBehind,
}

/// [`release_in_background`]; for a lock its caller held (`Origin::Held`),
/// not an acquisition's clean-up, a spawn refused while this thread runs inside
/// the manager's own runtime blocks on the release: that runtime is shutting
/// down and dropping its tasks (a task that held the guard, say), and the
/// lock would otherwise stay taken for its lease. A queue entry or an
/// acquisition in flight is not worth blocking a shutdown for (an entry ends
/// with its queue lease, seconds): those, and every spawn refused from
/// anywhere else (the runtime is gone), never block.
fn spawn_release(
    core: &Arc<Core>,
    key: String,
    keys: RedisNames,
    owner: String,
    lease: Duration,
    keep_until: Option<Instant>,
    origin: Origin,
) {
    let release = BackgroundRelease {
        core: core.clone(),
        key,
        keys,
        owner,
        lease,
        keep_until,
        everywhere: origin == Origin::LeftBehind,
        unfinished: true,
        _counted: core.background_work(),
    };
    let block_if_refused = origin == Origin::Held
        && tokio::runtime::Handle::try_current()
            .is_ok_and(|current| current.id() == core.runtime.id());
    SPAWNING_OUTSIDE.with(|s| s.set(!block_if_refused));
    drop(core.runtime.spawn(release.run()));
    SPAWNING_OUTSIDE.with(|s| s.set(false));
}

thread_local! {
    /// Set while `spawn_release` calls `spawn` for a release that must not
    /// block if refused (see there): a task dropped then was refused, inside
    /// a guard's `Drop` or an acquisition's clean-up.
    static SPAWNING_OUTSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

struct BackgroundRelease {
    core: Arc<Core>,
    key: String,
    keys: RedisNames,
    owner: String,
    lease: Duration,
    keep_until: Option<Instant>,
    /// On every Redlock member (see [`give_back_in_background`]).
    everywhere: bool,
    unfinished: bool,
    /// Counted until the task ends or is dropped, after `drop`'s blocking
    /// release (a field is dropped after its struct's `drop`).
    _counted: crate::core::BackgroundWork,
}

impl BackgroundRelease {
    async fn run(mut self) {
        let give_up = Instant::now() + self.lease;
        let retry_cap = (self.lease / 3).max(Duration::from_millis(5));
        let mut delay = Duration::from_millis(5);
        loop {
            // The full release at once: a background release follows a drop
            // or a release cancelled half way (whose one-key attempt may have
            // run), so it is one script whatever it finds.
            let keep_ms = crate::lease::keep_ms(self.keep_until);
            let result = if self.everywhere {
                self.core
                    .backend
                    .release_everywhere(&self.key, &self.keys, &self.owner, keep_ms)
                    .await
            } else {
                self.core
                    .backend
                    .release(
                        &self.key,
                        &self.keys,
                        &self.owner,
                        keep_ms,
                        ExpectedWaiters::Unknown,
                    )
                    .await
            };
            match result {
                Ok(deleted) => {
                    tracing::debug!(target: "distlock::release", key = %KeyPreview(&self.key), deleted, "released in the background");
                    break;
                }
                Err(e) if Instant::now() + delay < give_up => {
                    tracing::debug!(target: "distlock::release", key = %KeyPreview(&self.key), error = %e.error, "background release failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(retry_cap);
                }
                // A give-back on every member, after a lease: whatever a
                // member that never answered may hold has run out by now
                // (its TTL was at most that lease), and the others answered
                // long ago (a member down for a while: no warning each time).
                Err(e) if self.everywhere => {
                    tracing::debug!(target: "distlock::release",
                        key = %KeyPreview(&self.key),
                        error = %e.error,
                        "a member did not answer the give-back for a lease; what it held has expired"
                    );
                    break;
                }
                Err(e) => {
                    tracing::warn!(target: "distlock::release",
                        key = %KeyPreview(&self.key),
                        error = %e.error,
                        "could not release; the lease will free the lock"
                    );
                    break;
                }
            }
        }
        self.unfinished = false;
    }

    fn release_blocking(&self) {
        // Each blocking release waits up to the connect and command
        // timeouts: the backend skips a server on which one failed already
        // (the store unreachable as the runtime shuts down), so that a
        // shutdown with many guards does not wait out each in turn.
        let result = self.core.backend.release_blocking(
            &self.keys,
            &self.owner,
            crate::lease::keep_ms(self.keep_until),
        );
        tracing::debug!(target: "distlock::release", key = %KeyPreview(&self.key), ok = result.is_ok(), "released at runtime shutdown");
    }
}

impl Drop for BackgroundRelease {
    fn drop(&mut self) {
        if self.unfinished && !SPAWNING_OUTSIDE.with(|s| s.get()) {
            self.release_blocking();
        }
    }
}
