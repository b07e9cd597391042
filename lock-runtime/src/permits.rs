//! Giving back part of a weighted semaphore hold (`LockGuard::release_permits`),
//! and splitting one into a hold per permit (`LockGuard::split_permits`).

use std::future::Future;
use std::sync::Arc;

use crate::backend::CallError;
use crate::core::Core;
use crate::error::{KeyPreview, LockError};
use crate::guard::LockGuard;
use crate::keys::LockKind;
use crate::lease::Lease;
use crate::release::{release_in_background, release_lease_in_background, ReleaseOnDrop};

/// The most permits a hold may have for [`LockGuard::split_permits`]: the
/// split is one script that writes two entries per permit, and Redis serves
/// no one else while it runs, so the number is capped here rather than left
/// to the hold's weight.
pub const MAX_SPLIT_PERMITS: u32 = 128;

impl LockGuard {
    /// For a semaphore hold of several permits
    /// ([`weight`](crate::LockRequest::weight)): gives back `permits` of
    /// them and keeps the rest in this guard, with the same lease end,
    /// fencing token and lost signal. One round trip (a script that
    /// renames the hold to its smaller weight, keeping its lease end, and
    /// wakes waiters for the permits that came free). The hold's id, as
    /// [`inspect_all`](crate::LockManager::inspect_all) shows it, changes
    /// at each call (its acquisition id stays). The permits given back are
    /// free at once, whatever the hold's
    /// [`min_hold`](crate::LockRequest::min_hold), which keeps only what the
    /// guard still holds when it is released.
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let mut slots = manager.semaphore("gpu", 8).weight(4).acquire().await?;
    /// // ... the parallel phase needs 4 ...
    /// slots.release_permits(3).await?; // ... the rest needs 1: 3 go back now
    /// slots.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when this is not a semaphore hold, when
    /// `permits` is not from 1 to one less than the hold's weight (give
    /// back all with [`release`](Self::release)), or when re-entrant
    /// guards share the hold; [`LockError::Lost`] when the lease was lost
    /// (or is found lost now); [`LockError::Backend`] when Redis fails;
    /// [`LockError::ShutDown`] when the manager was shut down meanwhile (the
    /// kept permits are then given back). But for the last, the guard still
    /// holds what it held, except when the call
    /// may have run without its reply arriving: then the guard reports its
    /// lease lost soon (its next renewal finds the old hold gone) and the
    /// kept permits are given back in the background.
    pub async fn release_permits(&mut self, permits: u32) -> Result<(), LockError> {
        let old = self.lease_handle();
        let (_, weight) = weighted_hold(&old, "release_permits")?;
        if permits == 0 || permits >= weight {
            return Err(LockError::InvalidConfig(format!(
                "release_permits({permits}) of a hold of {weight} permits of semaphore {}; \
                 it gives back 1 to {} (all of them: release())",
                KeyPreview(&old.key),
                weight.saturating_sub(1)
            )));
        }
        let mut sole = renamable(&old, "release_permits")?;
        let kept = weight - permits;
        // A token of its own, as `split_permits` gives each permit, rather
        // than the old one's with the kept weight: a call that failed after
        // it may have run leaves a background release of the name it asked
        // for, and a retry under the same name would rename the hold to
        // that name and then lose it to that release, permits and all, while
        // its guard still trusted it. With the acquisition id kept, so that
        // operators see which holds went together.
        let token = crate::config::owner_token_of(acquisition_id(&old), "");
        let rest_owner = if kept == 1 {
            token
        } else {
            format!("{token}:{kept}")
        };
        let core = self.core().clone();
        let rest = std::slice::from_ref(&rest_owner);
        rename_hold(
            &core,
            &old,
            rest,
            "release_permits found the hold gone (its lease had run out)",
            core.backend
                .permit_give_back(&old.key, &old.keys, &old.owner, &rest_owner),
        )
        .await?;
        sole.disarm();
        let kept_lease = Arc::new(old.renamed(crate::config::next_id(), rest_owner));
        old.mark_handed_over();
        if !core.renewals.insert(kept_lease.clone()) {
            // Shut down meanwhile: the shutdown released what it knew of,
            // and this, which it did not know of, goes now; lost to the
            // guard, as every hold is after a shutdown.
            kept_lease.end_by_shutdown();
            release_lease_in_background(&core, &kept_lease, kept_lease.min_hold_until());
            self.replace_lease(kept_lease);
            return Err(LockError::ShutDown {
                key: old.key.clone(),
            });
        }
        self.replace_lease(kept_lease);
        Ok(())
    }

    /// For a semaphore hold of several permits
    /// ([`weight`](crate::LockRequest::weight)): splits it into one hold per
    /// permit, each with an id (owner token) of its own, its own lease
    /// (renewed on its own from the hold's lease end), lost
    /// signal and release, and the hold's fencing token. This guard keeps one
    /// permit; the others come back as new guards. Acting on one permit by id
    /// is then acting on its guard: [`release`](Self::release) gives back that
    /// permit alone (and wakes a waiter), [`extend`](Self::extend) lengthens
    /// its lease alone, [`into_ticket`](Self::into_ticket) hands it to another
    /// process. One round trip (a script that replaces the hold with a hold
    /// per permit; nobody is woken, as the permits held stay the same).
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let mut first = manager.semaphore("gpu", 8).weight(3).acquire().await?;
    /// let others = first.split_permits().await?; // 3 guards of 1 permit in all
    /// for permit in others {
    ///     // ... each hands its permit to a worker, which releases it when done ...
    ///     permit.release().await?;
    /// }
    /// first.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when this is not a semaphore hold, when it
    /// is of one permit or of more than [`MAX_SPLIT_PERMITS`], or when
    /// re-entrant guards share the hold; [`LockError::Lost`] when the lease
    /// was lost (or is found lost now); [`LockError::Backend`] when Redis
    /// fails; [`LockError::ShutDown`] when the manager was shut down
    /// meanwhile (the permits are then given back). But for the last, the
    /// guard still holds what it held, except when the call may have run
    /// without its reply arriving: then the guard reports its lease lost
    /// soon (its next renewal finds the old hold gone) and the single
    /// permits are given back in the background.
    pub async fn split_permits(&mut self) -> Result<Vec<LockGuard>, LockError> {
        let old = self.lease_handle();
        let (_, weight) = weighted_hold(&old, "split_permits")?;
        if !(2..=MAX_SPLIT_PERMITS).contains(&weight) {
            return Err(LockError::InvalidConfig(format!(
                "split_permits of a hold of {weight} permits of semaphore {}; \
                 it splits holds of 2 to {MAX_SPLIT_PERMITS}",
                KeyPreview(&old.key)
            )));
        }
        let mut sole = renamable(&old, "split_permits")?;
        // The permits' tokens open with the hold's acquisition id, so that
        // operators see which holds went together.
        let permit_owners: Vec<String> = (0..weight)
            .map(|_| crate::config::owner_token_of(acquisition_id(&old), ""))
            .collect();
        let core = self.core().clone();
        rename_hold(
            &core,
            &old,
            &permit_owners,
            "split_permits found the hold gone (its lease had run out)",
            core.backend
                .permit_split(&old.key, &old.keys, &old.owner, &permit_owners),
        )
        .await?;
        sole.disarm();
        let leases: Vec<Arc<Lease>> = permit_owners
            .iter()
            .map(|owner| Arc::new(old.renamed(crate::config::next_id(), owner.clone())))
            .collect();
        old.mark_handed_over();
        let mut shut_down = false;
        for lease in &leases {
            if !core.renewals.insert(lease.clone()) {
                // Shut down meanwhile: as in `release_permits`.
                lease.end_by_shutdown();
                release_lease_in_background(&core, lease, lease.min_hold_until());
                shut_down = true;
            }
        }
        let mut leases = leases.into_iter();
        if let Some(kept) = leases.next() {
            self.replace_lease(kept);
        }
        if shut_down {
            return Err(LockError::ShutDown {
                key: old.key.clone(),
            });
        }
        let manager = self.manager().clone();
        Ok(leases
            .map(|lease| LockGuard::new(manager.clone(), lease))
            .collect())
    }
}

/// The owner token's base and the weight of `old`, a semaphore hold (owner
/// tokens of weighted holds end in `:<weight>`); `method` names the caller in
/// the error for any other kind of lock.
fn weighted_hold<'a>(old: &'a Lease, method: &str) -> Result<(&'a str, u32), LockError> {
    let LockKind::Permit { .. } = old.keys.kind else {
        return Err(LockError::InvalidConfig(format!(
            "{method} is for semaphores; {} is a {}",
            KeyPreview(&old.key),
            old.keys.kind.family()
        )));
    };
    Ok(match old.owner.rsplit_once(':') {
        Some((base, weight)) => (base, weight.parse::<u32>().unwrap_or(1)),
        None => (old.owner.as_str(), 1),
    })
}

/// The acquisition id that opens `old`'s owner token, with which the tokens
/// of the holds it is renamed to open too.
fn acquisition_id(old: &Lease) -> &str {
    old.owner
        .get(..crate::info::ACQUISITION_ID_LEN)
        .unwrap_or(&old.owner)
}

/// Checks that `old` may be renamed in the store (one guard holds it:
/// re-entrant guards sharing it would be left with a name that is gone; and
/// it is not lost), and takes its only hold away until the
/// rename is done (see `Lease::take_sole_hold`): put back when the returned
/// guard drops armed (the rename failed, or its future was dropped), so that
/// the guard keeps its lease.
fn renamable<'a>(
    old: &'a Arc<Lease>,
    method: &str,
) -> Result<ReleaseOnDrop<impl FnOnce() + 'a>, LockError> {
    if old.is_lost() {
        return Err(LockError::Lost {
            key: old.key.clone(),
        });
    }
    if !old.take_sole_hold() {
        return Err(LockError::InvalidConfig(format!(
            "{method} on semaphore {}, whose hold re-entrant guards share: \
             release them first",
            KeyPreview(&old.key)
        )));
    }
    Ok(ReleaseOnDrop::new(move || old.restore_sole_hold()))
}

/// Runs `rename`, the one script that replaces the hold `old` in Redis by
/// holds named `new_owners` (same lease end), with `old` out of the renewal
/// task meanwhile: a renewal of the old name after the rename would report
/// the hold lost. `Ok(())`: the old name is gone and the caller makes leases
/// of the new ones. A reply that the hold was gone marks `old` lost
/// (`gone`, the reason). A call that fails before it could run renews `old`
/// again; one dropped or failed after it may have run renews `old` again
/// too (if the rename ran, that renewal finds it gone and the guard reports
/// the loss) and gives the new names back in the background.
async fn rename_hold(
    core: &Arc<Core>,
    old: &Arc<Lease>,
    new_owners: &[String],
    gone: &str,
    rename: impl Future<Output = Result<bool, CallError>>,
) -> Result<(), LockError> {
    core.renewals.remove(old.id);
    // Back into the renewal map; refused (the manager shut down meanwhile,
    // and its shutdown did not see the lease to release it), released here.
    let put_back = || {
        if !core.renewals.insert(old.clone()) {
            old.end_by_shutdown();
            release_lease_in_background(core, old, old.min_hold_until());
        }
    };
    let mut in_flight = ReleaseOnDrop::new(|| {
        put_back();
        for owner in new_owners {
            release_in_background(
                core,
                old.key.clone(),
                old.keys.clone(),
                owner.clone(),
                old.duration(),
                None,
            );
        }
    });
    match rename.await {
        Ok(true) => {
            in_flight.disarm();
            Ok(())
        }
        Ok(false) => {
            in_flight.disarm();
            put_back();
            old.mark_lost(gone);
            Err(LockError::Lost {
                key: old.key.clone(),
            })
        }
        Err(e) => {
            if !e.maybe_executed {
                in_flight.disarm();
                put_back();
            }
            Err(e.error)
        }
    }
}
