//! Queued counts: how many acquisitions of this manager are queued in Redis
//! for each lock, so that a new one queues behind them without a first try
//! and a release knows whether one of them may be waiting.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// How many acquisitions of this manager are queued for each lock (by its
/// Redis name).
#[derive(Default)]
pub(crate) struct QueuedCounts {
    counts: Mutex<HashMap<String, usize>>,
}

impl QueuedCounts {
    fn queued(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an acquisition of this manager as queued for `lock` until the
    /// returned guard is dropped.
    pub(crate) fn queue_here(&self, lock: &str) -> QueuedHere<'_> {
        *self.queued().entry(lock.to_owned()).or_insert(0) += 1;
        QueuedHere {
            counts: self,
            lock: lock.to_owned(),
        }
    }

    /// Whether some acquisition of this manager is queued for `lock`.
    pub(crate) fn has_queued(&self, lock: &str) -> bool {
        self.queued().contains_key(lock)
    }
}

/// An acquisition counted as queued for a lock ([`QueuedCounts::queue_here`]).
pub(crate) struct QueuedHere<'a> {
    counts: &'a QueuedCounts,
    lock: String,
}

impl Drop for QueuedHere<'_> {
    fn drop(&mut self) {
        let mut queued = self.counts.queued();
        if let Some(n) = queued.get_mut(&self.lock) {
            *n -= 1;
            if *n == 0 {
                queued.remove(&self.lock);
            }
        }
    }
}
