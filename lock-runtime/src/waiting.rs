//! Waiting for a busy lock: one shared pub/sub subscriber per manager, and the
//! jittered backoff that covers for a lost wake-up.
//!
//! Waiters register on the lock's channel; the first registration subscribes, the
//! last one leaving unsubscribes. Each wake-up message wakes one waiter of this
//! manager, the one waiting longest, which retries; the others sleep on, since
//! only one of them can win. A waiter keeps its place until it gets the lock or
//! leaves: one whose attempt loses to another manager's waiter is still the one
//! the next wake-up goes to. When the subscription is confirmed, or re-made
//! after a reconnect, every waiter of the channel retries once, because a release
//! may have been published while nobody listened. A wake-up whose payload starts
//! with `*` (a read-write lock's) wakes every waiter of the channel: several
//! readers may enter at once, and a writer must not be passed over.
//!
//! The default lock's release hands the lock to the head of its queue in Redis
//! and publishes `=<owner>:<fencing token>` on the one channel of the head's
//! manager (`<prefix>handoff:<route>`, see `Core::handoff_channel`): there the
//! message goes only to the waiter with that owner token (see
//! [`Subscriber::expect_handoff`]), which then holds the lock without another
//! round trip. Other waiters are not woken. The first waiter that queues for
//! a hold of the manager's also sends `!<owner>` there, so that the hold's
//! release hands the lock over at once (see `guard::free_first`). That channel, once a waiter of the
//! manager used it, stays subscribed ([`Subscriber::keep`]), so a wait on a
//! key the manager never waited for subscribes to nothing.

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{broadcast, Notify};

use crate::backend::Backend;

pub(crate) struct Subscriber {
    connect_timeout: Duration,
    command_timeout: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    /// Channels whose waiter count went from or to zero, for the task to
    /// subscribe or unsubscribe (on every server it listens to).
    changes: broadcast::Sender<String>,
    /// Set when wake-ups come from several servers (Redlock: every member
    /// publishes each release), so that a release wakes one waiter, not one per
    /// server.
    dedupe: AtomicBool,
    /// Wake-up messages that woke a waiter (after de-duplication), for tests.
    delivered: AtomicU64,
    /// Queued waiters of this manager expecting a hand-off, by owner token.
    handoffs: Mutex<HashMap<String, Arc<HandoffSlot>>>,
    /// How many acquisitions of this manager are queued for each lock (by its
    /// Redis name): a new one queues behind them without a first try.
    queued: Mutex<HashMap<String, usize>>,
    /// The `!<owner>` notices heard on the hand-off channel: which of this
    /// manager's holds a waiter queued for since they were taken.
    waited_for: Mutex<WaitedFor>,
    /// Distinct notices heard, for tests.
    waited_for_heard: AtomicU64,
}

/// Owner tokens of holds a waiter queued for, until their release asks
/// ([`Subscriber::take_waited_for`]). A notice for a hold released some other
/// way stays until `pending` is full, then it starts over: a lost entry costs
/// a release one round trip, no more.
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

/// Where a hand-off addressed to one queued waiter is left for it.
#[derive(Default)]
struct HandoffSlot {
    /// The hand-off, until the waiter takes it.
    heard: Mutex<Option<HandedOff>>,
    notify: Notify,
}

/// A hand-off as its message told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandedOff {
    /// The fencing token it issued (0: none).
    pub(crate) fencing_token: u64,
    /// The waiter's attempt whose queue entry it consumed: the lock's TTL
    /// runs from after that attempt was sent.
    pub(crate) attempt: u32,
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
    /// Subscribed even with no waiter (see [`Subscriber::keep`]).
    sticky: bool,
}

/// One registration's place in its channel's queue.
struct Waiter {
    id: u64,
    wake: Arc<WakeSlot>,
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
    pub(crate) recheck: bool,
}

impl Wake {
    fn is_empty(self) -> bool {
        self.releases == 0 && !self.recheck
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

impl Subscriber {
    pub(crate) fn new(connect_timeout: Duration, command_timeout: Duration) -> Self {
        // A subscriber task that falls this far behind resynchronises all channels.
        let (changes, _) = broadcast::channel(4096);
        Subscriber {
            connect_timeout,
            command_timeout,
            channels: Mutex::new(HashMap::new()),
            changes,
            dedupe: AtomicBool::new(false),
            delivered: AtomicU64::new(0),
            handoffs: Mutex::new(HashMap::new()),
            queued: Mutex::new(HashMap::new()),
            waited_for: Mutex::new(WaitedFor::default()),
            waited_for_heard: AtomicU64::new(0),
        }
    }

    fn waited_for(&self) -> MutexGuard<'_, WaitedFor> {
        self.waited_for.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A waiter queued for the hold with owner token `owner` (the payload of
    /// a `!` notice): its release will hand the lock over at once. Copies of
    /// one notice (one per server listened to) count once.
    fn heard_waited_for(&self, owner: &[u8]) {
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
    /// owner token `owner`; forgets it.
    pub(crate) fn take_waited_for(&self, owner: &str) -> bool {
        let mut heard = self.waited_for();
        if heard.pending.is_empty() || !heard.pending.remove(owner) {
            return false;
        }
        if self.dedupe.load(Ordering::Relaxed) {
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
    pub(crate) fn waited_for_heard(&self) -> u64 {
        self.waited_for_heard.load(Ordering::Relaxed)
    }

    /// Keeps `channel` subscribed from now on, with or without waiters: for
    /// the manager's hand-off channel, which serves every lock, so that a
    /// manager pays its subscription once, not once per wait.
    pub(crate) fn keep(&self, channel: &str) {
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
                let _ = self.changes.send(channel.to_owned());
            }
        }
    }

    fn queued(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an acquisition of this manager as queued for `lock` until the
    /// returned guard is dropped.
    pub(crate) fn queue_here(&self, lock: &str) -> QueuedHere<'_> {
        *self.queued().entry(lock.to_owned()).or_insert(0) += 1;
        QueuedHere {
            subscriber: self,
            lock: lock.to_owned(),
        }
    }

    /// Whether some acquisition of this manager is queued for `lock`.
    pub(crate) fn has_queued(&self, lock: &str) -> bool {
        self.queued().contains_key(lock)
    }

    fn handoffs(&self) -> MutexGuard<'_, HashMap<String, Arc<HandoffSlot>>> {
        self.handoffs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes hand-offs to `owner` (a fair waiter's owner token) reach the
    /// returned [`Handoff`] until it is dropped. The waiter must also be
    /// [registered](Self::register) on the lock's channel, which subscribes.
    pub(crate) fn expect_handoff(&self, owner: &str) -> Handoff<'_> {
        let slot = Arc::new(HandoffSlot::default());
        self.handoffs().insert(owner.to_owned(), slot.clone());
        Handoff {
            subscriber: self,
            owner: owner.to_owned(),
            slot,
        }
    }

    /// Routes a hand-off message (`<owner>:<token>:<attempt>`, after its `=`)
    /// to the waiter with that owner token, if it is one of ours.
    fn hand_off(&self, message: &[u8]) {
        let Some(handed) = std::str::from_utf8(message).ok().and_then(parse_handoff) else {
            return;
        };
        let (owner, handed) = handed;
        let slot = self.handoffs().get(owner).cloned();
        if let Some(slot) = slot {
            *slot.heard.lock().unwrap_or_else(|e| e.into_inner()) = Some(handed);
            self.delivered.fetch_add(1, Ordering::Relaxed);
            slot.notify.notify_one();
        }
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register(&self, channel: &str) -> Registration<'_> {
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
        entry.queue.push_back(Waiter {
            id,
            wake: wake.clone(),
        });
        if entry.queue.len() == 1 {
            // The task may be gone (manager shutting down): waiting then falls
            // back to the backoff alone.
            let _ = self.changes.send(channel.to_owned());
        }
        Registration {
            subscriber: self,
            channel: channel.to_owned(),
            id,
            wake,
            unresolved_releases: AtomicU32::new(0),
        }
    }

    /// Whether some acquisition of this manager already waits on `channel`.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    /// Wakes the longest waiter of `channel` for a release announced with
    /// `payload` (skipped when another server already announced the same one).
    fn wake_one(&self, channel: &str, payload: &[u8]) {
        let dedupe = self.dedupe.load(Ordering::Relaxed);
        if let Some(c) = self.channels().get_mut(channel) {
            if dedupe {
                if c.last_release == payload {
                    return;
                }
                c.last_release = payload.to_vec();
            }
            self.delivered.fetch_add(1, Ordering::Relaxed);
            c.wake_front(1);
        }
    }

    fn wake_all(&self, channel: &str) {
        if let Some(c) = self.channels().get(channel) {
            c.wake_all();
        }
    }

    /// Wakes every waiter for good: the manager is shutting down (waiters check
    /// `Core::is_shut_down` after every wake-up).
    pub(crate) fn wake_everyone(&self) {
        for channel in self.channels().values() {
            channel.wake_all();
        }
    }

    /// How many wake-up messages woke a waiter so far.
    #[cfg(feature = "testing")]
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    fn is_wanted(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    fn wanted(&self) -> Vec<String> {
        self.channels().keys().cloned().collect()
    }
}

/// A waiter's interest in one lock's wake-ups; ends when dropped.
pub(crate) struct Registration<'a> {
    subscriber: &'a Subscriber,
    channel: String,
    id: u64,
    wake: Arc<WakeSlot>,
    /// Release wake-ups this waiter took whose attempt has not resolved, or
    /// which its successful attempt did not need; if it leaves now, they go to
    /// the next waiter.
    unresolved_releases: AtomicU32,
}

impl Registration<'_> {
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
        self.subscriber
            .channels()
            .get(&self.channel)
            .is_some_and(|c| c.queue.front().is_some_and(|w| w.id == self.id))
    }
}

/// An acquisition counted as queued for a lock ([`Subscriber::queue_here`]).
pub(crate) struct QueuedHere<'a> {
    subscriber: &'a Subscriber,
    lock: String,
}

impl Drop for QueuedHere<'_> {
    fn drop(&mut self) {
        let mut queued = self.subscriber.queued();
        if let Some(n) = queued.get_mut(&self.lock) {
            *n -= 1;
            if *n == 0 {
                queued.remove(&self.lock);
            }
        }
    }
}

/// A queued waiter's expectation of a hand-off; ends when dropped.
pub(crate) struct Handoff<'a> {
    subscriber: &'a Subscriber,
    owner: String,
    slot: Arc<HandoffSlot>,
}

impl Handoff<'_> {
    /// The hand-off to this waiter, once one is heard. Cancel-safe: a
    /// hand-off heard while nobody polls is kept for the next call.
    pub(crate) async fn handed_off(&self) -> HandedOff {
        loop {
            let notified = self.slot.notify.notified();
            if let Some(handed) = self
                .slot
                .heard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                return handed;
            }
            notified.await;
        }
    }
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        let mut handoffs = self.subscriber.handoffs();
        if handoffs
            .get(&self.owner)
            .is_some_and(|slot| Arc::ptr_eq(slot, &self.slot))
        {
            handoffs.remove(&self.owner);
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut channels = self.subscriber.channels();
        if let Some(entry) = channels.get_mut(&self.channel) {
            entry.queue.retain(|w| w.id != self.id);
            if entry.queue.is_empty() {
                if !entry.sticky {
                    channels.remove(&self.channel);
                    let _ = self.subscriber.changes.send(self.channel.clone());
                }
            } else {
                // Releases announced to this waiter that no attempt of it
                // answered are the next waiter's chance.
                let releases = self
                    .unresolved_releases
                    .load(Ordering::Relaxed)
                    .saturating_add(self.wake.pending().releases);
                if releases > 0 {
                    entry.wake_front(releases);
                }
            }
        }
    }
}

/// The subscriber task: keeps the subscriptions equal to the channels that have
/// waiters, and turns messages into wake-ups. Connects on first need, and
/// reconnects (re-subscribing channel by channel) after the connection breaks.
/// The backend says where to listen: one server; every master of a cluster
/// (release publishes with classic PUBLISH, which the cluster bus carries to
/// every node, but later than the master that published it delivers it); every
/// Redlock member, each publishing every release. Where several connections
/// hear one release, it wakes one waiter (de-duplicated by its payload).
pub(crate) async fn run_subscriber(sub: &Subscriber, backend: &Backend) {
    let sources = backend.pubsub_sources();
    sub.dedupe.store(sources > 1, Ordering::Relaxed);
    futures_util::future::join_all((0..sources).map(|source| run_source(sub, backend, source)))
        .await;
}

async fn run_source(sub: &Subscriber, backend: &Backend, source: usize) {
    let mut changes = sub.changes.subscribe();
    let mut reconnect_delay = Duration::from_millis(50);
    loop {
        // Wait until some channel has waiters.
        if sub.wanted().is_empty()
            && matches!(
                changes.recv().await,
                Err(broadcast::error::RecvError::Closed)
            )
        {
            return;
        }
        let Some((mut sink, mut stream)) = connect(sub, backend, source).await else {
            tokio::time::sleep(reconnect_delay).await;
            reconnect_delay = (reconnect_delay * 2).min(Duration::from_secs(2));
            continue;
        };
        reconnect_delay = Duration::from_millis(50);
        let mut subscribed = HashSet::new();
        // On failure, reconnect and subscribe everything again rather than go on
        // with channels left out.
        if !sync_all(sub, &mut sink, &mut subscribed).await {
            continue;
        }
        loop {
            tokio::select! {
                change = changes.recv() => {
                    let synced = match change {
                        Ok(channel) => sync_channel(sub, &mut sink, &mut subscribed, channel).await,
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            sync_all(sub, &mut sink, &mut subscribed).await
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    };
                    if !synced {
                        break;
                    }
                }
                msg = stream.next() => {
                    let Some(msg) = msg else {
                        tracing::debug!(target: "distlock::waiting", source, "pub/sub connection closed; reconnecting");
                        break;
                    };
                    match msg.get_payload_bytes() {
                        // A read-write lock's release: every waiter retries.
                        [b'*', ..] => {
                            sub.delivered.fetch_add(1, Ordering::Relaxed);
                            sub.wake_all(msg.get_channel_name());
                        }
                        // A hand-off: only its new holder hears it.
                        [b'=', handoff @ ..] => sub.hand_off(handoff),
                        // A waiter queued for one of our holds.
                        [b'!', owner @ ..] => sub.heard_waited_for(owner),
                        payload => sub.wake_one(msg.get_channel_name(), payload),
                    }
                }
            }
        }
        // Waiters fall back to their backoff until the subscriptions are back.
    }
}

/// Subscribes to every channel with waiters and unsubscribes from the others.
async fn sync_all(
    sub: &Subscriber,
    sink: &mut PubSubSink,
    subscribed: &mut HashSet<String>,
) -> bool {
    let mut channels = sub.wanted();
    channels.extend(subscribed.iter().cloned());
    channels.sort();
    channels.dedup();
    for channel in channels {
        if !sync_channel(sub, sink, subscribed, channel).await {
            return false;
        }
    }
    true
}

async fn connect(
    sub: &Subscriber,
    backend: &Backend,
    source: usize,
) -> Option<(PubSubSink, PubSubStream)> {
    match tokio::time::timeout(sub.connect_timeout, backend.pubsub(source)).await {
        Ok(Ok(pubsub)) => Some(pubsub.split()),
        Ok(Err(e)) => {
            tracing::debug!(target: "distlock::waiting", error = %e, "pub/sub connection failed");
            None
        }
        Err(_) => {
            tracing::debug!(target: "distlock::waiting", "pub/sub connection timed out");
            None
        }
    }
}

/// Subscribes to or unsubscribes from `channel` to match whether it has waiters.
/// Returns false when the connection failed.
async fn sync_channel(
    sub: &Subscriber,
    sink: &mut PubSubSink,
    subscribed: &mut HashSet<String>,
    channel: String,
) -> bool {
    let wanted = sub.is_wanted(&channel);
    if wanted == subscribed.contains(&channel) {
        return true;
    }
    let result = if wanted {
        tokio::time::timeout(sub.command_timeout, sink.subscribe(&channel)).await
    } else {
        tokio::time::timeout(sub.command_timeout, sink.unsubscribe(&channel)).await
    };
    match result {
        Ok(Ok(())) => {
            if wanted {
                subscribed.insert(channel.clone());
                // A release may have been published before we listened.
                sub.wake_all(&channel);
            } else {
                subscribed.remove(&channel);
            }
            true
        }
        Ok(Err(e)) => {
            tracing::debug!(target: "distlock::waiting", error = %e, "pub/sub command failed; reconnecting");
            false
        }
        Err(_) => {
            tracing::debug!(target: "distlock::waiting", "pub/sub command timed out; reconnecting");
            false
        }
    }
}

/// `<owner>:<token>:<attempt>` (a hand-off message after its `=`).
fn parse_handoff(message: &str) -> Option<(&str, HandedOff)> {
    let mut parts = message.rsplitn(3, ':');
    let attempt = parts.next()?.parse().ok()?;
    let fencing_token = parts.next()?.parse().ok()?;
    let owner = parts.next()?;
    Some((
        owner,
        HandedOff {
            fencing_token,
            attempt,
        },
    ))
}

/// A waiter's sleeps, drawn from its [`Backoff`](crate::Backoff): the series
/// value doubles from `first` to `cap` and never exceeds the holder's
/// remaining lease (a lock whose holder died without releasing is retried as
/// it expires).
#[derive(Debug)]
pub(crate) struct BackoffTimer {
    policy: crate::Backoff,
    next_value: Duration,
}

impl Default for BackoffTimer {
    fn default() -> Self {
        BackoffTimer::new(crate::Backoff::default())
    }
}

impl BackoffTimer {
    pub(crate) fn new(policy: crate::Backoff) -> Self {
        BackoffTimer {
            policy,
            next_value: policy.first(),
        }
    }

    /// A random sleep in `[0, max]`.
    pub(crate) fn jitter(max: Duration) -> Duration {
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(random_u64() % nanos.saturating_add(1))
    }

    pub(crate) fn next(&mut self, holder_remaining: Option<Duration>) -> Duration {
        let value = self
            .next_value
            .min(holder_remaining.unwrap_or(Duration::MAX))
            .max(Duration::from_millis(1));
        self.next_value = self.next_value.saturating_mul(2).min(self.policy.cap());
        // `jitter` is checked to be within [0, 1] before a timer is made.
        let random_part = value.mul_f64(self.policy.jitter());
        (value - random_part) + Self::jitter(random_part)
    }
}

/// xorshift64*, seeded per thread from the thread's random generator: jitter
/// needs spread, not secrecy.
fn random_u64() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(rand::random::<u64>() | 1);
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_heard_from_several_servers_counts_once_and_a_late_copy_is_not_kept() {
        let sub = Subscriber::new(Duration::from_secs(1), Duration::from_secs(1));
        sub.dedupe.store(true, Ordering::Relaxed);
        let owner = "00000000000000000000000a0badf00d";
        sub.heard_waited_for(owner.as_bytes());
        sub.heard_waited_for(owner.as_bytes());
        assert_eq!(sub.waited_for_heard(), 1);
        assert!(!sub.take_waited_for("some other owner"));
        assert!(sub.take_waited_for(owner));
        // A third master's copy, after the release took the notice.
        sub.heard_waited_for(owner.as_bytes());
        assert_eq!(sub.waited_for_heard(), 1);
        assert!(!sub.take_waited_for(owner));
        // A full set starts over rather than growing.
        for i in 0..WAITED_FOR_CAPACITY + 1 {
            sub.heard_waited_for(format!("{i:032x}").as_bytes());
        }
        assert!(sub.waited_for().pending.len() <= WAITED_FOR_CAPACITY);
    }

    #[test]
    fn hand_off_messages_are_read_whole_or_not_at_all() {
        assert_eq!(
            parse_handoff("0a1b:17:3"),
            Some((
                "0a1b",
                HandedOff {
                    fencing_token: 17,
                    attempt: 3
                }
            ))
        );
        assert_eq!(parse_handoff("0a1b:17"), None);
        assert_eq!(parse_handoff("0a1b:x:3"), None);
    }

    #[test]
    fn backoff_is_capped_by_the_holders_remaining_lease() {
        let mut b = BackoffTimer::default();
        for _ in 0..50 {
            assert!(b.next(Some(Duration::from_millis(3))) <= Duration::from_millis(3));
        }
        let mut b = BackoffTimer::default();
        let naps: Vec<_> = (0..20).map(|_| b.next(None)).collect();
        let default = crate::Backoff::default();
        assert!(naps.iter().all(|n| *n <= default.cap()));
        assert!(naps[0] <= default.first());
        // Jitter: not all the same.
        assert!(naps.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn a_backoff_without_jitter_doubles_up_to_its_cap() {
        let ms = Duration::from_millis;
        let mut b = BackoffTimer::new(crate::Backoff::new(ms(10), ms(50)).with_jitter(0.0));
        let naps: Vec<_> = (0..5).map(|_| b.next(None)).collect();
        assert_eq!(naps, [ms(10), ms(20), ms(40), ms(50), ms(50)]);
        // The holder's remaining lease still caps a sleep.
        assert_eq!(b.next(Some(ms(7))), ms(7));
    }

    #[test]
    fn a_partial_jitter_keeps_the_fixed_part_of_each_sleep() {
        let ms = Duration::from_millis;
        let mut b = BackoffTimer::new(crate::Backoff::new(ms(100), ms(100)).with_jitter(0.25));
        let naps: Vec<_> = (0..200).map(|_| b.next(None)).collect();
        assert!(
            naps.iter().all(|n| (ms(75)..=ms(100)).contains(n)),
            "{naps:?}"
        );
        assert!(naps.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn bad_backoffs_are_refused_with_what_is_wrong() {
        let ms = Duration::from_millis;
        for (backoff, says) in [
            (crate::Backoff::new(ms(0), ms(10)), "start at 1 ms"),
            (
                crate::Backoff::new(ms(20), ms(10)),
                "no less than its start",
            ),
            (
                crate::Backoff::new(ms(10), ms(20)).with_jitter(1.5),
                "jitter of 1.5",
            ),
            (
                crate::Backoff::new(ms(10), ms(20)).with_jitter(f64::NAN),
                "jitter of NaN",
            ),
        ] {
            let err = backoff.validate("the request's backoff").unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        assert!(crate::Backoff::default().validate("default").is_ok());
    }
}
