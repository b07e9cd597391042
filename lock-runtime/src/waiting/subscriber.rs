//! The subscriber: the manager's one listener, the single owner of its
//! listening connections (one per message source). It keeps its
//! subscriptions equal to the channels that have waiters and the topics of
//! the [interests](super::interests) (lock events streams, leader watches),
//! subscribing a topic when the first waiter or interest wants it and
//! unsubscribing it when the last one goes, and hands each message to the
//! part it is for: a wake-up to the [waiter queues](super::queues), a
//! hand-off to [its waiter](super::handoff), a `!` notice to the
//! [waited-for notices](super::waited_for), a message on an interest's topic
//! to each interest in it (a pattern's message to interests alone, so a
//! wake-up pays no lock for them). After a reconnect it subscribes
//! everything again, wakes every waiter to retry, and tells each interest
//! that messages may have been lost. It also keeps the manager's
//! [queued counts](super::queued).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::handoff::{Handoff, Handoffs};
use super::interests::{Interest, Interests, Sink, Topic};
use super::queued::{QueuedCounts, QueuedHere};
use super::queues::{Registration, WaiterQueues};
use super::waited_for::WaitedForNotices;
use crate::backend::{Backend, MessageConnection};
use crate::error::{BackendError, BackendErrorKind};

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
    /// What the lock events streams and leader watches listen to.
    interests: Arc<Interests>,
    /// Topics that may need a subscription change, for the task of every
    /// source.
    changes: broadcast::Sender<Topic>,
}

impl Subscriber {
    pub(crate) fn new(connect_timeout: Duration, command_timeout: Duration) -> Self {
        // A task that falls this far behind resynchronises every topic.
        let (changes, _) = broadcast::channel(4096);
        Subscriber {
            connect_timeout,
            command_timeout,
            queues: WaiterQueues::new(changes.clone()),
            interests: Interests::new(changes.clone()),
            changes,
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

    /// Whether some acquisition of this manager waits on `channel` for at
    /// most `weight` permits (see `WaiterQueues::has_waiters_for`).
    pub(crate) fn has_waiters_for(&self, channel: &str, weight: u32) -> bool {
        self.queues.has_waiters_for(channel, weight)
    }

    /// Wakes every waiter for good, and every one registered afterwards at
    /// once, and ends every lock events stream and leader watch: the manager
    /// is shutting down (waiters check `Core::is_shut_down` after every
    /// wake-up).
    pub(crate) fn wake_everyone(&self) {
        self.queues.wake_everyone();
        self.interests.close();
    }

    /// Makes the messages on `topic` reach `sink` until the returned interest
    /// is dropped: on the first source alone, or on each of `sources` (the
    /// backend's [`message_sources`](Backend::message_sources)). The
    /// subscriber subscribes the topic if nothing else wants it yet; await
    /// [`Interest::subscribed`] before relying on hearing it.
    pub(crate) fn listen(
        &self,
        topic: Topic,
        sources: usize,
        first_only: bool,
        sink: Arc<dyn Sink>,
    ) -> Interest {
        let wanted = (0..sources.max(1))
            .map(|source| !first_only || source == 0)
            .collect();
        self.interests.register(topic, wanted, sink)
    }

    /// Whether a waiter or an interest wants anything on `source`.
    fn wants_any(&self, source: usize) -> bool {
        self.queues.any_wanted() || self.interests.wants_any(source)
    }

    /// How many wake-up messages woke a waiter so far.
    #[cfg(feature = "testing")]
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// How many acquisitions wait in this manager's queues now.
    #[cfg(feature = "testing")]
    pub(crate) fn waiter_count(&self) -> usize {
        self.queues.waiter_count()
    }
}

/// The subscriber task: keeps the subscriptions equal to the channels that have
/// waiters and the topics of the interests, and turns messages into wake-ups
/// and into what each interest hears. Connects on first need, and reconnects
/// (re-subscribing topic by topic, and telling each interest that messages
/// may have been lost) after the connection breaks.
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

/// What one connection is subscribed to.
#[derive(Default)]
struct Subscribed {
    topics: HashSet<Topic>,
    /// The subscribed channels some interest wants (besides waiters, maybe):
    /// a message on one of these is routed to the interests. Looked up by the
    /// task alone, so a wake-up pays no lock for it.
    interest_channels: HashSet<String>,
    /// Subscribed channels whose last wake-up found no waiter of this manager
    /// (see `sync_topic`).
    unheard: HashSet<String>,
}

async fn run_source(sub: &Subscriber, backend: &Backend, source: usize) {
    let mut changes = sub.changes.subscribe();
    let mut reconnect_delay = Duration::from_millis(50);
    loop {
        // Wait until something is wanted on this source.
        while !sub.wants_any(source) {
            if matches!(
                changes.recv().await,
                Err(broadcast::error::RecvError::Closed)
            ) {
                return;
            }
        }
        let Some(mut conn) = connect(sub, backend, source).await else {
            tokio::time::sleep(reconnect_delay).await;
            reconnect_delay = (reconnect_delay * 2).min(Duration::from_secs(2));
            continue;
        };
        let connected_at = tokio::time::Instant::now();
        let mut subscribed = Subscribed::default();
        // On failure, reconnect and subscribe everything again rather than go on
        // with topics left out.
        if sync_all(sub, &mut conn, &mut subscribed, source).await
            && serve(sub, &mut conn, &mut subscribed, &mut changes, source).await
        {
            return;
        }
        // Waiters fall back to their backoff until the subscriptions are back;
        // interests hear, once subscribed again, that they may have lost
        // messages.
        sub.interests.disconnected(source);
        // A connection that served a while is made again at once. One that
        // failed soon after it opened (a subscription the server refuses, a
        // server at its client limit) is made again after a growing delay,
        // not in a loop of connections.
        if connected_at.elapsed() >= Duration::from_secs(1) {
            reconnect_delay = Duration::from_millis(50);
        } else {
            tokio::time::sleep(reconnect_delay).await;
            reconnect_delay = (reconnect_delay * 2).min(Duration::from_secs(2));
        }
    }
}

/// How long a listening connection may stay silent before it is pinged: ten
/// command timeouts, from 5 s to 30 s. No answer within half that (or the
/// command timeout, if longer: a server busy with a long script is not a
/// broken connection), and it is taken for broken (a partition, or a load
/// balancer or NAT that dropped it while idle sends no reset: messages
/// would stop without a sign). The ping also keeps such a middlebox from
/// dropping it.
fn quiet_limit(command_timeout: Duration) -> Duration {
    (command_timeout * 10).clamp(Duration::from_secs(5), Duration::from_secs(30))
}

/// Serves one connection until it breaks (false) or the manager is gone
/// (true).
async fn serve(
    sub: &Subscriber,
    conn: &mut MessageConnection,
    subscribed: &mut Subscribed,
    changes: &mut broadcast::Receiver<Topic>,
    source: usize,
) -> bool {
    let quiet_limit = quiet_limit(sub.command_timeout);
    let ping_timeout = sub.command_timeout.max(quiet_limit / 2);
    // Checked once per `quiet_limit` rather than re-armed per message: a
    // message only sets `heard`.
    let check = tokio::time::sleep(quiet_limit);
    tokio::pin!(check);
    let mut heard = false;
    loop {
        tokio::select! {
            () = &mut check => {
                if !heard {
                    let answered = tokio::time::timeout(ping_timeout, conn.ping()).await;
                    if !matches!(answered, Ok(Ok(()))) {
                        tracing::debug!(target: "distlock::waiting", source,
                            "listening connection silent and unanswered; reconnecting");
                        return false;
                    }
                }
                // A topic the server refused (an ACL without the
                // permission) is asked for again: it may be allowed now.
                if !sync_all(sub, conn, subscribed, source).await {
                    return false;
                }
                heard = false;
                check.as_mut().reset(tokio::time::Instant::now() + quiet_limit);
            }
            change = changes.recv() => {
                let synced = match change {
                    Ok(topic) => sync_topic(sub, conn, subscribed, topic, source).await,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        sync_all(sub, conn, subscribed, source).await
                    }
                    Err(broadcast::error::RecvError::Closed) => return true,
                };
                if !synced {
                    return false;
                }
            }
            msg = conn.next() => {
                let Some(msg) = msg else {
                    tracing::debug!(target: "distlock::waiting", source, "listening connection closed; reconnecting");
                    return false;
                };
                heard = true;
                // Waiters subscribe exact channels only: a pattern's message
                // is an interest's alone.
                if let Some(pattern) = &msg.pattern {
                    sub.interests.route(true, pattern, source, &msg);
                    continue;
                }
                if !subscribed.interest_channels.is_empty()
                    && subscribed.interest_channels.contains(msg.channel.as_str())
                {
                    sub.interests.route(false, &msg.channel, source, &msg);
                }
                let woke = match msg.payload.as_slice() {
                    // A read-write lock's release: every waiter retries.
                    [b'*', ..] => {
                        sub.delivered.fetch_add(1, Ordering::Relaxed);
                        sub.queues.wake_all(&msg.channel)
                    }
                    // A hand-off: only its new holder hears it.
                    [b'=', handoff @ ..] => {
                        sub.handoffs.hand_off(handoff, &sub.delivered);
                        true
                    }
                    // A waiter queued for one of our holds.
                    [b'!', owner @ ..] => {
                        sub.waited_for.heard_waited_for(owner);
                        true
                    }
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
                };
                // Only while subscribed: a message sent before an
                // unsubscription ran arrives after it, and would stay here
                // for good.
                if !woke {
                    let topic = Topic::Channel(msg.channel);
                    if subscribed.topics.contains(&topic) {
                        if let Topic::Channel(channel) = topic {
                            subscribed.unheard.insert(channel);
                        }
                    }
                }
            }
        }
    }
}

/// Subscribes to every wanted topic and unsubscribes from the others.
async fn sync_all(
    sub: &Subscriber,
    conn: &mut MessageConnection,
    subscribed: &mut Subscribed,
    source: usize,
) -> bool {
    let mut topics: Vec<Topic> = sub
        .queues
        .wanted()
        .into_iter()
        .map(Topic::Channel)
        .collect();
    topics.extend(sub.interests.topics(source));
    topics.extend(subscribed.topics.iter().cloned());
    topics.sort();
    topics.dedup();
    for topic in topics {
        if !sync_topic(sub, conn, subscribed, topic, source).await {
            return false;
        }
    }
    true
}

async fn connect(sub: &Subscriber, backend: &Backend, source: usize) -> Option<MessageConnection> {
    let error = match tokio::time::timeout(sub.connect_timeout, backend.messages(source)).await {
        Ok(Ok(conn)) => return Some(conn),
        Ok(Err(e)) => e,
        Err(_) => BackendError::new(
            BackendErrorKind::Timeout,
            format!(
                "no listening connection within the connect timeout of {:?}",
                sub.connect_timeout
            ),
        ),
    };
    tracing::debug!(target: "distlock::waiting", source, error = %error, "listening connection failed");
    sub.interests.failed(None, source, &error);
    None
}

/// Subscribes to or unsubscribes from `topic` to match whether a waiter or an
/// interest wants it on `source`, and confirms it to the interests that wait
/// for it. Returns false when the connection failed.
async fn sync_topic(
    sub: &Subscriber,
    conn: &mut MessageConnection,
    subscribed: &mut Subscribed,
    topic: Topic,
    source: usize,
) -> bool {
    if matches!(topic, Topic::Pattern(_)) && !conn.takes_patterns() {
        // A store without patterns: the interest stays unconfirmed (its
        // subscription fails in time) rather than the connection failing
        // over and over, which would also cost the waiters their wake-ups.
        return true;
    }
    let for_interests = sub.interests.wants(&topic, source);
    let wanted =
        for_interests || matches!(&topic, Topic::Channel(channel) if sub.queues.is_wanted(channel));
    if wanted != subscribed.topics.contains(&topic) {
        let timeout = sub.command_timeout;
        let result = match (&topic, wanted) {
            (Topic::Channel(c), true) => tokio::time::timeout(timeout, conn.subscribe(c)).await,
            (Topic::Channel(c), false) => tokio::time::timeout(timeout, conn.unsubscribe(c)).await,
            (Topic::Pattern(p), true) => tokio::time::timeout(timeout, conn.psubscribe(p)).await,
            (Topic::Pattern(p), false) => tokio::time::timeout(timeout, conn.punsubscribe(p)).await,
        };
        match result {
            Ok(Ok(())) => {}
            // The server refused an interest's topic (an ACL without the
            // permission) and the connection is fine: the interest learns
            // why, and the waiters keep their connection.
            Ok(Err(e))
                if wanted
                    && for_interests
                    && matches!(e.kind(), BackendErrorKind::Auth | BackendErrorKind::Server) =>
            {
                tracing::debug!(target: "distlock::waiting", error = %e, "subscription refused");
                sub.interests.failed(Some(&topic), source, &e);
                return true;
            }
            Ok(Err(e)) => {
                tracing::debug!(target: "distlock::waiting", error = %e, "subscription change failed; reconnecting");
                return false;
            }
            Err(_) => {
                tracing::debug!(target: "distlock::waiting", "subscription change timed out; reconnecting");
                return false;
            }
        }
        if wanted {
            subscribed.topics.insert(topic.clone());
            if let Topic::Channel(channel) = &topic {
                // A release may have been published before we listened.
                sub.queues.wake_all(channel);
            }
        } else {
            subscribed.topics.remove(&topic);
        }
    } else if let (Topic::Channel(channel), true) = (&topic, wanted) {
        // Still subscribed: the last waiter left and a new one came before
        // the unsubscription ran. A release heard in between, with no waiter
        // here, woke nobody, and the new one may have attempted before it:
        // it attempts again, as after a fresh subscription.
        if subscribed.unheard.remove(channel.as_str()) {
            sub.queues.wake_all(channel);
        }
    }
    if let Topic::Channel(channel) = &topic {
        if !wanted {
            subscribed.unheard.remove(channel.as_str());
        }
    }
    if let Topic::Channel(channel) = &topic {
        if for_interests {
            subscribed.interest_channels.insert(channel.clone());
        } else {
            subscribed.interest_channels.remove(channel);
        }
    }
    if for_interests {
        sub.interests.confirm(&topic, source);
    }
    true
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
