//! Which locks the current call chain holds, for re-entry.
//!
//! Identity travels with the call chain in a `tokio::task_local!`, not with the task
//! id: task ids are reused, absent inside `block_on`, and shared by futures joined
//! in one task. Each locked scope runs its body under a *new* context (the parent's
//! holds plus its own), so two joined futures that each lock `k` from outside any
//! hold see different contexts and exclude each other, while a nested call inside
//! one of them sees its parent's hold and re-enters.

use std::future::Future;
use std::sync::{Arc, Weak};

use crate::lease::Lease;

tokio::task_local! {
    static HELD_LOCKS: LockContext;
}

/// An immutable list of the leases held by the enclosing scopes. Weak, so a context
/// captured by a spawned task does not keep a released lock alive.
#[derive(Clone, Default)]
pub(crate) struct LockContext {
    holds: Arc<Vec<Weak<Lease>>>,
}

impl LockContext {
    pub(crate) fn current() -> LockContext {
        HELD_LOCKS.try_with(Clone::clone).unwrap_or_default()
    }

    /// The live lease of `key` on manager `manager_id` held by this call chain,
    /// among the locks of `family` (see `LockKind::family`).
    pub(crate) fn find(
        manager_id: u64,
        key: &str,
        family: crate::keys::LockFamily,
    ) -> Option<Arc<Lease>> {
        HELD_LOCKS
            .try_with(|ctx| {
                ctx.holds.iter().rev().filter_map(Weak::upgrade).find(|l| {
                    l.manager_id == manager_id
                        && l.key == key
                        && l.keys.kind.family() == family
                        && !l.is_released()
                })
            })
            .ok()
            .flatten()
    }

    fn with(&self, lease: &Arc<Lease>) -> LockContext {
        self.with_all(std::slice::from_ref(lease))
    }

    fn with_all(&self, leases: &[Arc<Lease>]) -> LockContext {
        let mut holds: Vec<Weak<Lease>> = self
            .holds
            .iter()
            .filter(|w| w.strong_count() > 0)
            .cloned()
            .collect();
        holds.extend(leases.iter().map(Arc::downgrade));
        LockContext {
            holds: Arc::new(holds),
        }
    }

    pub(crate) fn scope<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        HELD_LOCKS.scope(self, fut)
    }
}

/// Runs `fut` in a context that adds `lease` to the current call chain's holds.
pub(crate) fn scope_with<F: Future>(lease: &Arc<Lease>, fut: F) -> impl Future<Output = F::Output> {
    LockContext::current().with(lease).scope(fut)
}

/// Runs `fut` in a context that adds every lease of `leases` (a multi-key
/// hold) to the current call chain's holds.
pub(crate) fn scope_with_all<F: Future>(
    leases: &[Arc<Lease>],
    fut: F,
) -> impl Future<Output = F::Output> {
    LockContext::current().with_all(leases).scope(fut)
}
