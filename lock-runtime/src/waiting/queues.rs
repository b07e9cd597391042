//! Waiter queues: this manager's waiters on each lock's wake-up channel, in
//! arrival order, and the wake-ups addressed to them. A wake-up for one
//! release goes to the longest waiter; a recheck goes to every waiter of the
//! channel. A waiter keeps its place until it gets the lock or leaves, and
//! hands on, when it leaves, the release wake-ups it did not use.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, Notify};

use super::interests::Topic;

/// Every channel this manager's waiters wait on, with its queue.
pub(crate) struct WaiterQueues {
    channels: Mutex<HashMap<String, Channel>>,
    /// Channels whose waiter count went from or to zero, for the task to
    /// subscribe or unsubscribe (on every server it listens to).
    changes: broadcast::Sender<Topic>,
    /// Set (under the `channels` lock) by [`WaiterQueues::wake_everyone`]: a
    /// waiter registered afterwards starts woken, so that a shutdown between
    /// a waiter's last look and its registration is not slept through.
    closed: AtomicBool,
}

struct Channel {
    /// This manager's waiters on the channel, in arrival order. Wake-ups go to
    /// the front: one shared `Notify` would serve waiters in the order they
    /// last started listening, and a waiter that listens again after a lost
    /// attempt would go behind later arrivals.
    queue: VecDeque<Waiter>,
    /// The payload (the releasing owner token) of the last wake-up taken, when
    /// wake-ups are de-duplicated.
    last_release: Vec<u8>,
    /// Subscribed even with no waiter (see [`WaiterQueues::keep`]).
    sticky: bool,
}

/// One registration's place in its channel's queue.
struct Waiter {
    id: u64,
    wake: Arc<WakeSlot>,
    /// The permits it waits for (1 but for a weighted semaphore waiter).
    weight: u32,
}

/// Wake-ups addressed to one waiter, kept until it takes them, so that one
/// arriving while the waiter is busy with an attempt (not listening) is not lost.
#[derive(Default)]
struct WakeSlot {
    pending: Mutex<Wake>,
    notify: Notify,
}

/// What woke a waiter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Wake {
    /// Releases announced to this waiter alone, each a chance for one waiter of
    /// this manager to get the lock (a semaphore's release frees one permit).
    pub(crate) releases: u32,
    /// Every waiter was asked to look again (a read-write lock's release, a
    /// subscription confirmed, shutdown): nothing to pass on if it leaves.
    /// Only the first in line attempts on it, and every reader (see
    /// `Acquisition::wait_for_release`).
    pub(crate) recheck: bool,
    /// This waiter became first in line because the one before it got the
    /// lock, for a lease of at most this long: it sets its timer by it
    /// rather than attempt (see [`Registration::watching_expiry`]).
    pub(crate) recap: Option<Duration>,
}

impl Wake {
    fn is_empty(self) -> bool {
        self.releases == 0 && !self.recheck && self.recap.is_none()
    }
}

impl WakeSlot {
    fn pending(&self) -> MutexGuard<'_, Wake> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add_releases(&self, releases: u32) {
        let mut pending = self.pending();
        pending.releases = pending.releases.saturating_add(releases);
        drop(pending);
        self.notify.notify_waiters();
    }

    fn recheck(&self) {
        self.pending().recheck = true;
        self.notify.notify_waiters();
    }

    fn recap(&self, lease: Duration) {
        let mut pending = self.pending();
        pending.recap = Some(pending.recap.map_or(lease, |recap| recap.min(lease)));
        drop(pending);
        self.notify.notify_waiters();
    }
}

impl Channel {
    /// Gives `releases` wake-ups to the longest waiter.
    fn wake_front(&self, releases: u32) {
        if let Some(front) = self.queue.front() {
            front.wake.add_releases(releases);
        }
    }

    fn wake_all(&self) {
        for waiter in &self.queue {
            waiter.wake.recheck();
        }
    }
}

impl WaiterQueues {
    /// Queues that tell `changes` (the subscriber's feed) of the channels
    /// whose waiter count went from or to zero.
    pub(super) fn new(changes: broadcast::Sender<Topic>) -> Self {
        WaiterQueues {
            channels: Mutex::new(HashMap::new()),
            changes,
            closed: AtomicBool::new(false),
        }
    }

    /// Keeps `channel` subscribed from now on, with or without waiters: for
    /// the manager's hand-off channel, which serves every lock, so that a
    /// manager pays its subscription once, not once per wait.
    pub(super) fn keep(&self, channel: &str) {
        let mut channels = self.channels();
        match channels.get_mut(channel) {
            Some(entry) => entry.sticky = true,
            None => {
                channels.insert(
                    channel.to_owned(),
                    Channel {
                        queue: VecDeque::new(),
                        last_release: Vec::new(),
                        sticky: true,
                    },
                );
                // The task may be gone (manager shutting down).
                let _ = self.changes.send(Topic::Channel(channel.to_owned()));
            }
        }
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn register(&self, channel: &str, weight: u32) -> Registration<'_> {
        let mut channels = self.channels();
        let entry = channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                queue: VecDeque::new(),
                last_release: Vec::new(),
                sticky: false,
            });
        let id = crate::config::next_id();
        let wake = Arc::new(WakeSlot::default());
        // Read under the lock `wake_everyone` sets it under: either that call
        // saw this waiter in its queue, or this waiter sees the flag.
        if self.closed.load(Ordering::Relaxed) {
            wake.recheck();
        }
        entry.queue.push_back(Waiter {
            id,
            wake: wake.clone(),
            weight,
        });
        if entry.queue.len() == 1 {
            // The task may be gone (manager shutting down): waiting then falls
            // back to the backoff alone.
            let _ = self.changes.send(Topic::Channel(channel.to_owned()));
        }
        Registration {
            queues: self,
            channel: channel.to_owned(),
            id,
            wake,
            unresolved_releases: AtomicU32::new(0),
            watches_expiry: false,
            granted: AtomicBool::new(false),
            granted_lease_ms: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        }
    }

    /// The most permits any waiter of this manager on `channel` waits for
    /// (1 with none).
    pub(super) fn largest_weight(&self, channel: &str) -> u32 {
        self.channels()
            .get(channel)
            .and_then(|c| c.queue.iter().map(|w| w.weight).max())
            .unwrap_or(1)
    }

    /// Whether some acquisition of this manager already waits on `channel`.
    pub(super) fn has_waiters(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    /// Whether some acquisition of this manager waits on `channel` for at
    /// most `weight` permits: one that could use what a new acquisition of
    /// `weight` would take.
    pub(super) fn has_waiters_for(&self, channel: &str, weight: u32) -> bool {
        self.channels()
            .get(channel)
            .is_some_and(|c| c.queue.iter().any(|w| w.weight <= weight))
    }

    /// Gives the longest waiter of `channel` `releases` wake-ups for a
    /// release announced with `payload` (skipped when another server already
    /// announced the same one). `dedupe`: several servers announce each
    /// release. Counts the wake-up in `delivered`. False when no waiter of
    /// this manager is on `channel`.
    pub(super) fn wake_front(
        &self,
        channel: &str,
        payload: &[u8],
        releases: u32,
        dedupe: bool,
        delivered: &AtomicU64,
    ) -> bool {
        let mut channels = self.channels();
        let Some(c) = channels.get_mut(channel) else {
            return false;
        };
        if dedupe {
            if c.last_release == payload {
                return true;
            }
            c.last_release = payload.to_vec();
        }
        delivered.fetch_add(1, Ordering::Relaxed);
        c.wake_front(releases);
        true
    }

    /// Wakes every waiter of `channel`; false when it has none here.
    pub(super) fn wake_all(&self, channel: &str) -> bool {
        match self.channels().get(channel) {
            Some(c) => {
                c.wake_all();
                true
            }
            None => false,
        }
    }

    /// Wakes every waiter for good, and every waiter registered from now on
    /// at once: the manager is shutting down (waiters check
    /// `Core::is_shut_down` after every wake-up).
    pub(super) fn wake_everyone(&self) {
        let channels = self.channels();
        self.closed.store(true, Ordering::Relaxed);
        for channel in channels.values() {
            channel.wake_all();
        }
    }

    /// How many waiters every channel has, together.
    #[cfg(feature = "testing")]
    pub(super) fn waiter_count(&self) -> usize {
        self.channels().values().map(|c| c.queue.len()).sum()
    }

    pub(super) fn is_wanted(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    /// Whether any channel has waiters (or is kept).
    pub(super) fn any_wanted(&self) -> bool {
        !self.channels().is_empty()
    }

    pub(super) fn wanted(&self) -> Vec<String> {
        self.channels().keys().cloned().collect()
    }
}

/// A waiter's interest in one lock's wake-ups; ends when dropped.
pub(crate) struct Registration<'a> {
    queues: &'a WaiterQueues,
    channel: String,
    id: u64,
    wake: Arc<WakeSlot>,
    /// Release wake-ups this waiter took whose attempt has not resolved, or
    /// which its successful attempt did not need; if it leaves now, they go to
    /// the next waiter (unless that attempt failed, see
    /// [`Registration::failed`]).
    unresolved_releases: AtomicU32,
    /// Whether the first in line retries on a timer of its own (see
    /// [`Registration::watching_expiry`]).
    watches_expiry: bool,
    /// Set when this waiter got the lock (see [`Registration::got_it`]).
    granted: AtomicBool,
    /// The lease it got the lock for, in milliseconds.
    granted_lease_ms: AtomicU64,
    /// Set when this waiter's attempt failed (see [`Registration::failed`]).
    failed: AtomicBool,
}

impl Registration<'_> {
    /// Marks this as a registration whose first in line alone retries on its
    /// timer, capped by the holder's lease (see [`Self::is_first_in_line`]):
    /// when it leaves the front without the lock (a timeout, a cancelled
    /// call, a shutdown; not a failed attempt, see [`Self::failed`]), the new
    /// front is woken to attempt once (after a shutdown it returns instead),
    /// which tells it the lease to set its timer by; when it leaves with the
    /// lock, the new front is told that lease ([`Wake::recap`]) without an
    /// attempt. Otherwise that waiter would sleep on a backoff drawn while it
    /// was not first, and a lease that ran out unreleased (the new holder's
    /// `renew(false)`, or a holder cut off) would wait for that backoff.
    pub(crate) fn watching_expiry(mut self) -> Self {
        self.watches_expiry = true;
        self
    }

    /// Records that this waiter got the lock, for a lease of `lease`:
    /// leaving then, it passes on only the wake-ups
    /// [`Self::set_unresolved_releases`] left it, and, first in line of a
    /// queue that watches the lease, that lease to the next.
    pub(crate) fn got_it(&self, lease: Duration) {
        self.granted.store(true, Ordering::Relaxed);
        self.granted_lease_ms.store(
            u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Records that this waiter leaves because its attempt failed (the store
    /// did not answer, or refused): leaving then, it passes on neither its
    /// watch of the holder's lease nor the release wake-ups its attempt took,
    /// so that one failure does not send every waiter of the manager at the
    /// store in turn, each failing as fast as the store fails. (Releases
    /// announced after that attempt began still go on: the store published
    /// them.) The new front attempts on its own timer (within its backoff),
    /// and from then on watches the lease.
    pub(crate) fn failed(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// Waits for wake-ups addressed to this waiter and takes them. Cancel-safe:
    /// wake-ups that come while nobody waits are kept for the next call.
    pub(crate) async fn woken(&self) -> Wake {
        loop {
            let notified = self.wake.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Listening before looking: a wake-up stored after the look
            // notifies this listener.
            notified.as_mut().enable();
            let wake = std::mem::take(&mut *self.wake.pending());
            if !wake.is_empty() {
                return wake;
            }
            notified.await;
        }
    }

    /// After this waiter's attempt, woken by a release, found too few
    /// permits free for its weight: wakes the first waiter behind it that
    /// waits for fewer, which the permits freed may fit. Without it, a
    /// lighter waiter behind a heavy one would wait for the heavy one's
    /// grant while permits it could take stay free.
    pub(crate) fn pass_on_to_a_lighter_waiter(&self, weight: u32) {
        let channels = self.queues.channels();
        if let Some(lighter) = channels.get(&self.channel).and_then(|c| {
            c.queue
                .iter()
                .skip_while(|w| w.id != self.id)
                .find(|w| w.weight < weight)
        }) {
            lighter.wake.add_releases(1);
        }
    }

    /// Records how many release wake-ups are to go to the next waiter if this
    /// one leaves before it sets this again.
    pub(crate) fn set_unresolved_releases(&self, releases: u32) {
        self.unresolved_releases.store(releases, Ordering::Relaxed);
    }

    /// Drops the release wake-ups this waiter holds, taken or heard since,
    /// once it holds an exclusive lock: every release heard so far came
    /// before its grant (nobody else can release a lock it holds), so none
    /// frees the lock for another waiter; its own release will publish. Passed
    /// on, they would send the next waiter of this manager to attempt while
    /// the lock is still held: that attempt goes out on the same connections
    /// as the holder's release, and reaches every member right behind it,
    /// ahead of other managers' waiters, which hear of the release only from
    /// its PUBLISH.
    pub(crate) fn forget_releases(&self) {
        self.unresolved_releases.store(0, Ordering::Relaxed);
        self.wake.pending().releases = 0;
    }

    /// Whether this is the longest-waiting acquisition of this manager for the
    /// lock. Only it retries on a timer: when a lease runs out without a release
    /// (a crashed holder, `renew(false)`, a lost lease) nobody publishes, and the
    /// lock then goes to waiters in arrival order instead of to whichever timer
    /// fires first.
    pub(crate) fn is_first_in_line(&self) -> bool {
        self.queues
            .channels()
            .get(&self.channel)
            .is_some_and(|c| c.queue.front().is_some_and(|w| w.id == self.id))
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut channels = self.queues.channels();
        if let Some(entry) = channels.get_mut(&self.channel) {
            let was_front = entry.queue.front().is_some_and(|w| w.id == self.id);
            entry.queue.retain(|w| w.id != self.id);
            if entry.queue.is_empty() {
                if !entry.sticky {
                    channels.remove(&self.channel);
                    let _ = self
                        .queues
                        .changes
                        .send(Topic::Channel(self.channel.clone()));
                }
            } else {
                // Releases announced to this waiter that no attempt of it
                // answered are the next waiter's chance; not those its
                // failed attempt took (see `failed`). Those announced since
                // still go on: each is a release the store did publish.
                let failed = self.failed.load(Ordering::Relaxed);
                let taken = if failed {
                    0
                } else {
                    self.unresolved_releases.load(Ordering::Relaxed)
                };
                let pending = *self.wake.pending();
                let mut releases = taken.saturating_add(pending.releases);
                // A recheck the front did not answer (it came during its
                // last attempt) is the next waiter's, also after a failed
                // attempt: the waiters behind the front leave rechecks to it
                // (see `Acquisition::wait_for_release`), and a release
                // published while the manager did not listen may have freed
                // the lock.
                if was_front && pending.recheck {
                    releases = releases.max(1);
                }
                // The front leaving without the lock hands its watch of the
                // holder's lease on (see `watching_expiry`).
                if releases == 0
                    && was_front
                    && self.watches_expiry
                    && !self.granted.load(Ordering::Relaxed)
                    && !failed
                {
                    releases = 1;
                }
                if releases > 0 {
                    entry.wake_front(releases);
                } else if was_front && self.watches_expiry && self.granted.load(Ordering::Relaxed) {
                    let lease = self.granted_lease_ms.load(Ordering::Relaxed);
                    if let Some(front) = entry.queue.front() {
                        front.wake.recap(Duration::from_millis(lease));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    fn queues() -> WaiterQueues {
        WaiterQueues::new(broadcast::channel(16).0)
    }

    /// A waiter that registers after the shutdown's wake-up, having looked at
    /// the shutdown flag before it was set, is woken at once: it must not
    /// sleep its whole nap.
    #[test]
    fn a_waiter_registered_after_wake_everyone_starts_woken() {
        let queues = queues();
        let before = queues.register("a", 1);
        queues.wake_everyone();
        let after = queues.register("b", 1);
        for registration in [&before, &after] {
            let wake = registration.woken().now_or_never();
            assert_eq!(
                wake,
                Some(Wake {
                    releases: 0,
                    recheck: true,
                    recap: None,
                })
            );
        }
    }

    /// Without a shutdown, a new waiter has nothing to take.
    #[test]
    fn a_new_waiter_starts_unwoken() {
        let queues = queues();
        let registration = queues.register("a", 1);
        assert_eq!(registration.woken().now_or_never(), None);
    }

    /// The front of a queue that watches the holder's lease hands that watch
    /// to the next waiter: when it leaves without the lock (a timeout, a
    /// cancelled call) by a wake-up to attempt, when it got the lock by the
    /// lease it got it for (the next sets its timer by it), and not when its
    /// attempt failed.
    #[test]
    fn the_front_hands_its_watch_on_unless_its_attempt_failed() {
        let attempt = Some(Wake {
            releases: 1,
            recheck: false,
            recap: None,
        });
        let lease = Duration::from_millis(300);
        let recap = Some(Wake {
            releases: 0,
            recheck: false,
            recap: Some(lease),
        });
        for (how, expected) in [("gave up", attempt), ("got it", recap), ("failed", None)] {
            let queues = queues();
            let front = queues.register("a", 1).watching_expiry();
            let next = queues.register("a", 1).watching_expiry();
            match how {
                "got it" => front.got_it(lease),
                "failed" => front.failed(),
                _ => {}
            }
            drop(front);
            assert_eq!(next.woken().now_or_never(), expected, "{how}");
        }
        // A queue that does not watch the lease (every waiter attempts on its
        // own timer) hands nothing on.
        let queues = queues();
        let front = queues.register("a", 1);
        let next = queues.register("a", 1);
        drop(front);
        assert_eq!(next.woken().now_or_never(), None);
    }

    /// A recheck the front did not answer (it came while the front's attempt
    /// was under way, and the waiters behind it leave rechecks to the front)
    /// goes on to the next waiter as one release, however the front left:
    /// it gave up, got the lock, or failed its attempt.
    #[test]
    fn a_recheck_the_front_did_not_answer_goes_to_the_next_waiter() {
        for how in ["gave up", "got it", "failed"] {
            let queues = queues();
            let front = queues.register("a", 1).watching_expiry();
            let next = queues.register("a", 1).watching_expiry();
            assert!(queues.wake_all("a"));
            // The next waiter takes its own recheck and, not first in
            // line, leaves it to the front.
            assert!(next.woken().now_or_never().is_some_and(|w| w.recheck));
            match how {
                "got it" => front.got_it(Duration::from_millis(300)),
                "failed" => front.failed(),
                _ => {}
            }
            drop(front);
            assert_eq!(
                next.woken().now_or_never().map(|w| w.releases),
                Some(1),
                "{how}"
            );
        }
    }

    /// Release wake-ups a waiter took go to the next one when it leaves
    /// without having answered them, but not when its attempt failed: the
    /// next one's attempt would meet the same store.
    #[test]
    fn a_failed_waiter_does_not_pass_on_the_releases_it_took() {
        for (failed, expected) in [
            (
                false,
                Some(Wake {
                    releases: 1,
                    recheck: false,
                    recap: None,
                }),
            ),
            (true, None),
        ] {
            let queues = queues();
            let front = queues.register("a", 1);
            let next = queues.register("a", 1);
            front.set_unresolved_releases(1);
            if failed {
                front.failed();
            }
            drop(front);
            assert_eq!(next.woken().now_or_never(), expected, "failed: {failed}");
        }
        // A release announced after the failed attempt took its wake-up still
        // goes on: the store published it.
        let queues = queues();
        let front = queues.register("a", 1);
        let next = queues.register("a", 1);
        front.set_unresolved_releases(1);
        front.failed();
        queues.wake_front("a", b"r", 1, false, &AtomicU64::new(0));
        drop(front);
        assert_eq!(
            next.woken().now_or_never(),
            Some(Wake {
                releases: 1,
                recheck: false,
                recap: None,
            })
        );
    }
}
