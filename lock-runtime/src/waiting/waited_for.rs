//! Waited-for notices: the `!<owner>` messages by which the first waiter that
//! queues for one of this manager's holds tells the manager, so that the
//! hold's release hands the lock over at once (see `release::expected_waiters`).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The notices heard on the hand-off channel: which of this manager's holds a
/// waiter queued for since they were taken.
#[derive(Default)]
pub(crate) struct WaitedForNotices {
    waited_for: Mutex<WaitedFor>,
    /// Distinct notices heard, for tests.
    waited_for_heard: AtomicU64,
}

/// Owner tokens of holds a waiter queued for, until their release asks
/// ([`WaitedForNotices::take_waited_for`]). A notice for a hold released some
/// other way stays until `pending` is full, then it starts over: a lost entry
/// costs a release one round trip, no more.
#[derive(Default)]
struct WaitedFor {
    pending: HashSet<String>,
    /// The last notices taken, while the manager listens to several servers
    /// (a cluster's masters each relay every message): a copy that arrives
    /// after its release took the first is recognised, not kept.
    recently_taken: VecDeque<String>,
}

/// Entries `WaitedFor::pending` keeps at most.
const WAITED_FOR_CAPACITY: usize = 4096;
/// Entries `WaitedFor::recently_taken` keeps.
const RECENTLY_TAKEN: usize = 64;

impl WaitedForNotices {
    fn waited_for(&self) -> MutexGuard<'_, WaitedFor> {
        self.waited_for.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A waiter queued for the hold with owner token `owner` (the payload of
    /// a `!` notice): its release will hand the lock over at once. Copies of
    /// one notice (one per server listened to) count once.
    pub(super) fn heard_waited_for(&self, owner: &[u8]) {
        let Ok(owner) = std::str::from_utf8(owner) else {
            return;
        };
        let mut heard = self.waited_for();
        if heard.recently_taken.iter().any(|taken| taken == owner) {
            return;
        }
        if heard.pending.len() >= WAITED_FOR_CAPACITY {
            heard.pending.clear();
        }
        if heard.pending.insert(owner.to_owned()) {
            self.waited_for_heard.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether a waiter told this manager that it queued for the hold with
    /// owner token `owner`; forgets it. `dedupe`: the manager listens to
    /// several servers, whose late copies of the notice are to be recognised.
    pub(super) fn take_waited_for(&self, owner: &str, dedupe: bool) -> bool {
        let mut heard = self.waited_for();
        if heard.pending.is_empty() || !heard.pending.remove(owner) {
            return false;
        }
        if dedupe {
            if heard.recently_taken.len() == RECENTLY_TAKEN {
                heard.recently_taken.pop_front();
            }
            heard.recently_taken.push_back(owner.to_owned());
        }
        true
    }

    /// How many `!` notices (a waiter queued for one of this manager's holds)
    /// the manager has heard.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn waited_for_heard(&self) -> u64 {
        self.waited_for_heard.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_heard_from_several_servers_counts_once_and_a_late_copy_is_not_kept() {
        let notices = WaitedForNotices::default();
        let dedupe = true;
        let owner = "00000000000000000000000a0badf00d";
        notices.heard_waited_for(owner.as_bytes());
        notices.heard_waited_for(owner.as_bytes());
        assert_eq!(notices.waited_for_heard(), 1);
        assert!(!notices.take_waited_for("some other owner", dedupe));
        assert!(notices.take_waited_for(owner, dedupe));
        // A third master's copy, after the release took the notice.
        notices.heard_waited_for(owner.as_bytes());
        assert_eq!(notices.waited_for_heard(), 1);
        assert!(!notices.take_waited_for(owner, dedupe));
        // A full set starts over rather than growing.
        for i in 0..WAITED_FOR_CAPACITY + 1 {
            notices.heard_waited_for(format!("{i:032x}").as_bytes());
        }
        assert!(notices.waited_for().pending.len() <= WAITED_FOR_CAPACITY);
    }
}
