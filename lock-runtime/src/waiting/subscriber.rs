//! The subscriber: the manager's one pub/sub listener. It keeps its
//! subscriptions equal to the channels that have waiters, and hands each
//! message to the part it is for: a wake-up to the [waiter queues](super::queues),
//! a hand-off to [its waiter](super::handoff), a `!` notice to the
//! [waited-for notices](super::waited_for). It also keeps the manager's
//! [queued counts](super::queued).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::broadcast;

use super::handoff::{Handoff, Handoffs};
use super::queued::{QueuedCounts, QueuedHere};
use super::queues::{Registration, WaiterQueues};
use super::waited_for::WaitedForNotices;
use crate::backend::{Backend, MessageConnection};

/// What a manager's waiters share: the parts of waiting, and the task's
/// settings.
pub(crate) struct Subscriber {
    connect_timeout: Duration,
    command_timeout: Duration,
    /// This manager's waiters on each channel.
    queues: WaiterQueues,
    /// Set when wake-ups come from several servers (Redlock: every member
    /// publishes each release), so that a release wakes one waiter, not one per
    /// server.
    dedupe: AtomicBool,
    /// Wake-up messages that woke a waiter (after de-duplication), for tests.
    delivered: AtomicU64,
    /// Queued waiters of this manager expecting a hand-off, by owner token.
    handoffs: Handoffs,
    /// How many acquisitions of this manager are queued for each lock (by its
    /// Redis name): a new one queues behind them without a first try.
    queued: QueuedCounts,
    /// The `!<owner>` notices heard on the hand-off channel: which of this
    /// manager's holds a waiter queued for since they were taken.
    waited_for: WaitedForNotices,
}

impl Subscriber {
    pub(crate) fn new(connect_timeout: Duration, command_timeout: Duration) -> Self {
        Subscriber {
            connect_timeout,
            command_timeout,
            queues: WaiterQueues::new(),
            dedupe: AtomicBool::new(false),
            delivered: AtomicU64::new(0),
            handoffs: Handoffs::default(),
            queued: QueuedCounts::default(),
            waited_for: WaitedForNotices::default(),
        }
    }

    /// Whether a waiter told this manager that it queued for the hold with
    /// owner token `owner`; forgets it.
    pub(crate) fn take_waited_for(&self, owner: &str) -> bool {
        self.waited_for
            .take_waited_for(owner, self.dedupe.load(Ordering::Relaxed))
    }

    /// How many `!` notices (a waiter queued for one of this manager's holds)
    /// the manager has heard.
    #[cfg(feature = "testing")]
    pub(crate) fn waited_for_heard(&self) -> u64 {
        self.waited_for.waited_for_heard()
    }

    /// Keeps `channel` subscribed from now on, with or without waiters: for
    /// the manager's hand-off channel, which serves every lock, so that a
    /// manager pays its subscription once, not once per wait.
    pub(crate) fn keep(&self, channel: &str) {
        self.queues.keep(channel);
    }

    /// Counts an acquisition of this manager as queued for `lock` until the
    /// returned guard is dropped.
    pub(crate) fn queue_here(&self, lock: &str) -> QueuedHere<'_> {
        self.queued.queue_here(lock)
    }

    /// Whether some acquisition of this manager is queued for `lock`.
    pub(crate) fn has_queued(&self, lock: &str) -> bool {
        self.queued.has_queued(lock)
    }

    /// Makes hand-offs to `owner` (a fair waiter's owner token) reach the
    /// returned [`Handoff`] until it is dropped. The waiter must also be
    /// [registered](Self::register) on the lock's channel, which subscribes.
    pub(crate) fn expect_handoff(&self, owner: &str) -> Handoff<'_> {
        self.handoffs.expect_handoff(owner)
    }

    /// Places a waiter for `weight` permits (1 but for a weighted semaphore
    /// waiter) at the back of `channel`'s queue until the returned
    /// registration is dropped; the first waiter of a channel subscribes.
    pub(crate) fn register(&self, channel: &str, weight: u32) -> Registration<'_> {
        self.queues.register(channel, weight)
    }

    /// The most permits a waiter of this manager on `channel` waits for (1
    /// with none). A semaphore attempt records it in Redis, so that a release
    /// wakes the manager when that many may be free, even for a waiter that
    /// has not attempted yet (it waits behind others; see `permit_acquire.lua`).
    pub(crate) fn largest_waiting_weight(&self, channel: &str) -> u32 {
        self.queues.largest_weight(channel)
    }

    /// Whether some acquisition of this manager already waits on `channel`.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        self.queues.has_waiters(channel)
    }

    /// Wakes every waiter for good: the manager is shutting down (waiters check
    /// `Core::is_shut_down` after every wake-up).
    pub(crate) fn wake_everyone(&self) {
        self.queues.wake_everyone();
    }

    /// How many wake-up messages woke a waiter so far.
    #[cfg(feature = "testing")]
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
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
    let sources = backend.message_sources();
    sub.dedupe.store(sources > 1, Ordering::Relaxed);
    futures_util::future::join_all((0..sources).map(|source| run_source(sub, backend, source)))
        .await;
}

async fn run_source(sub: &Subscriber, backend: &Backend, source: usize) {
    let mut changes = sub.queues.changes();
    let mut reconnect_delay = Duration::from_millis(50);
    loop {
        // Wait until some channel has waiters.
        if sub.queues.wanted().is_empty()
            && matches!(
                changes.recv().await,
                Err(broadcast::error::RecvError::Closed)
            )
        {
            return;
        }
        let Some(mut conn) = connect(sub, backend, source).await else {
            tokio::time::sleep(reconnect_delay).await;
            reconnect_delay = (reconnect_delay * 2).min(Duration::from_secs(2));
            continue;
        };
        reconnect_delay = Duration::from_millis(50);
        let mut subscribed = HashSet::new();
        // On failure, reconnect and subscribe everything again rather than go on
        // with channels left out.
        if !sync_all(sub, &mut conn, &mut subscribed).await {
            continue;
        }
        loop {
            tokio::select! {
                change = changes.recv() => {
                    let synced = match change {
                        Ok(channel) => sync_channel(sub, &mut conn, &mut subscribed, channel).await,
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            sync_all(sub, &mut conn, &mut subscribed).await
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    };
                    if !synced {
                        break;
                    }
                }
                msg = conn.next() => {
                    let Some(msg) = msg else {
                        tracing::debug!(target: "distlock::waiting", source, "pub/sub connection closed; reconnecting");
                        break;
                    };
                    match msg.payload.as_slice() {
                        // A read-write lock's release: every waiter retries.
                        [b'*', ..] => {
                            sub.delivered.fetch_add(1, Ordering::Relaxed);
                            sub.queues.wake_all(&msg.channel);
                        }
                        // A hand-off: only its new holder hears it.
                        [b'=', handoff @ ..] => sub.handoffs.hand_off(handoff, &sub.delivered),
                        // A waiter queued for one of our holds.
                        [b'!', owner @ ..] => sub.waited_for.heard_waited_for(owner),
                        // A semaphore's release of several permits.
                        [b'#', counted @ ..] => sub.queues.wake_front(
                            &msg.channel,
                            counted,
                            released_permits(counted),
                            sub.dedupe.load(Ordering::Relaxed),
                            &sub.delivered,
                        ),
                        payload => sub.queues.wake_front(
                            &msg.channel,
                            payload,
                            1,
                            sub.dedupe.load(Ordering::Relaxed),
                            &sub.delivered,
                        ),
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
    conn: &mut MessageConnection,
    subscribed: &mut HashSet<String>,
) -> bool {
    let mut channels = sub.queues.wanted();
    channels.extend(subscribed.iter().cloned());
    channels.sort();
    channels.dedup();
    for channel in channels {
        if !sync_channel(sub, conn, subscribed, channel).await {
            return false;
        }
    }
    true
}

async fn connect(sub: &Subscriber, backend: &Backend, source: usize) -> Option<MessageConnection> {
    match tokio::time::timeout(sub.connect_timeout, backend.messages(source)).await {
        Ok(Ok(conn)) => Some(conn),
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
    conn: &mut MessageConnection,
    subscribed: &mut HashSet<String>,
    channel: String,
) -> bool {
    let wanted = sub.queues.is_wanted(&channel);
    if wanted == subscribed.contains(&channel) {
        return true;
    }
    let result = if wanted {
        tokio::time::timeout(sub.command_timeout, conn.subscribe(&channel)).await
    } else {
        tokio::time::timeout(sub.command_timeout, conn.unsubscribe(&channel)).await
    };
    match result {
        Ok(Ok(())) => {
            if wanted {
                subscribed.insert(channel.clone());
                // A release may have been published before we listened.
                sub.queues.wake_all(&channel);
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

/// The permits a `#<n>:<owner>` wake-up (after its `#`) freed: at least 1, at
/// most `u32::MAX`, whatever the payload says.
fn released_permits(counted: &[u8]) -> u32 {
    let digits = counted.split(|b| *b == b':').next().unwrap_or_default();
    std::str::from_utf8(digits)
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX).max(1))
}

#[cfg(test)]
mod tests {
    use super::released_permits;

    #[test]
    fn a_weighted_release_is_read_as_its_permits_and_never_as_none() {
        assert_eq!(released_permits(b"7:0a1b:7"), 7);
        assert_eq!(released_permits(b"4294967295:0a1b"), u32::MAX);
        assert_eq!(released_permits(b"99999999999:0a1b"), u32::MAX);
        assert_eq!(released_permits(b"0:0a1b"), 1);
        assert_eq!(released_permits(b"x:0a1b"), 1);
        assert_eq!(released_permits(b""), 1);
    }
}
