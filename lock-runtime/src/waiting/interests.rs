//! Interests: what the manager's lock events streams and leader watches want
//! to hear on the subscriber's connections (a channel or a pattern, on the
//! first source or on every source), each with the sink its messages go to.
//!
//! The subscriber keeps its subscriptions equal to the union of these topics
//! and the waiters' channels, so that a topic several interests share is
//! subscribed once and unsubscribed when the last of them is dropped. Each
//! interest learns when its topic is subscribed on a source, and whether
//! messages may have been lost since it last was (the connection broke).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{broadcast, Notify};

use crate::backend::Message;
use crate::error::BackendError;

/// What a listening connection subscribes to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Topic {
    /// An exact channel name.
    Channel(String),
    /// A glob over channel names (only where the store takes patterns).
    Pattern(String),
}

/// Where an interest's messages go. Both calls are made by the subscriber's
/// task while it routes, so they must not wait: push into a bounded buffer.
pub(crate) trait Sink: Send + Sync + 'static {
    /// A message published on the interest's topic.
    fn heard(&self, message: &Message);

    /// The topic was subscribed on one source. `after_loss`: it had been
    /// before, and the connection broke since, so messages may have been
    /// missed. A sink registered for several topics that one broken
    /// connection carried is told after the last of them is back, once.
    fn subscribed(&self, after_loss: bool);

    /// The topic, subscribed on one source before its connection broke, was
    /// refused there when subscribed again (an ACL changed meanwhile):
    /// messages are being missed. It is tried again at the connection's
    /// next check, and [`subscribed`](Self::subscribed) once it is back. A
    /// sink is told once per break, however many of its topics are refused.
    fn refused_again(&self) {}
}

/// One break of one source's listening connection: every topic it carried
/// was lost at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loss(u64);

/// The interests of one manager.
pub(crate) struct Interests {
    entries: Mutex<Vec<Entry>>,
    /// The manager shut down: no interest is kept any more (see `close`).
    closed: AtomicBool,
    /// Told when an entry is confirmed on a source, for
    /// [`Interest::subscribed`].
    confirmed: Notify,
    /// The subscriber's change feed (shared with the waiter queues).
    changes: broadcast::Sender<Topic>,
    /// Numbers the breaks of listening connections, for [`Loss`].
    losses: AtomicU64,
}

struct Entry {
    id: u64,
    topic: Topic,
    sink: Arc<dyn Sink>,
    /// Per source: whether this interest listens there.
    wanted: Vec<bool>,
    /// Per source: subscribed there since the current connection opened.
    confirmed: Vec<bool>,
    /// Per source: was confirmed on a connection that broke since (which
    /// break).
    lost: Vec<Option<Loss>>,
    /// Per source: its sink was told that the topic, lost there, was
    /// refused when subscribed again (told once per loss).
    refusal_told: Vec<bool>,
    /// Why the topic could not be subscribed on some source since it was
    /// last confirmed, for [`Interest::subscribed`].
    failure: Option<BackendError>,
}

impl Interests {
    pub(super) fn new(changes: broadcast::Sender<Topic>) -> Arc<Self> {
        Arc::new(Interests {
            entries: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            confirmed: Notify::new(),
            changes,
            losses: AtomicU64::new(0),
        })
    }

    fn entries(&self) -> MutexGuard<'_, Vec<Entry>> {
        // Every step leaves the entries consistent.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `topic` on the sources `wanted` says (one flag per source),
    /// its messages going to `sink`, until the returned interest is dropped.
    pub(super) fn register(
        self: &Arc<Self>,
        topic: Topic,
        wanted: Vec<bool>,
        sink: Arc<dyn Sink>,
    ) -> Interest {
        let id = crate::config::next_id();
        let sources = wanted.len();
        let mut entries = self.entries();
        if self.closed.load(Ordering::Acquire) {
            // Shut down: the sink goes at once, and its reader ends.
            return Interest {
                interests: self.clone(),
                id,
            };
        }
        entries.push(Entry {
            id,
            topic: topic.clone(),
            sink,
            wanted,
            confirmed: vec![false; sources],
            lost: vec![None; sources],
            refusal_told: vec![false; sources],
            failure: None,
        });
        drop(entries);
        // The task may be gone (manager shutting down): the interest then
        // never confirms.
        let _ = self.changes.send(topic);
        Interest {
            interests: self.clone(),
            id,
        }
    }

    /// The manager shut down: every interest's sink is dropped, so that each
    /// lock events stream and leader watch ends once its reader has taken
    /// what was buffered, and none is kept from now on. Waiting for a
    /// subscription fails.
    pub(super) fn close(&self) {
        let entries = {
            let mut entries = self.entries();
            self.closed.store(true, Ordering::Release);
            std::mem::take(&mut *entries)
        };
        // Dropped outside the lock: a sink's drop may wake its reader.
        drop(entries);
        self.confirmed.notify_waiters();
    }

    /// Whether some interest wants `topic` on `source`.
    pub(super) fn wants(&self, topic: &Topic, source: usize) -> bool {
        self.entries()
            .iter()
            .any(|e| e.topic == *topic && e.wanted.get(source) == Some(&true))
    }

    /// Whether some interest wants anything on `source`.
    pub(super) fn wants_any(&self, source: usize) -> bool {
        self.entries()
            .iter()
            .any(|e| e.wanted.get(source) == Some(&true))
    }

    /// The topics some interest wants on `source`.
    pub(super) fn topics(&self, source: usize) -> Vec<Topic> {
        self.entries()
            .iter()
            .filter(|e| e.wanted.get(source) == Some(&true))
            .map(|e| e.topic.clone())
            .collect()
    }

    /// `topic` is subscribed on `source`: tells each interest in it that was
    /// not told yet since the connection opened.
    pub(super) fn confirm(&self, topic: &Topic, source: usize) {
        let mut told = false;
        let mut entries = self.entries();
        for at in 0..entries.len() {
            let entry = &mut entries[at];
            if entry.topic != *topic
                || entry.wanted.get(source) != Some(&true)
                || entry.confirmed.get(source) != Some(&false)
            {
                continue;
            }
            entry.confirmed[source] = true;
            entry.failure = None;
            entry.refusal_told[source] = false;
            let loss = entry.lost[source].take();
            // One notice per break for a sink with several topics (a lock
            // events stream's published events and expiries): told by the
            // last of them back, so that the notice follows every gap.
            let others_back_later = loss.is_some_and(|loss| {
                lost_by_the_same_sink(&entries, at, source, loss).any(|_| true)
            });
            if !others_back_later {
                entries[at].sink.subscribed(loss.is_some());
            }
            told = true;
        }
        drop(entries);
        if told {
            self.confirmed.notify_waiters();
        }
    }

    /// The connection to `source` broke (or never subscribed everything):
    /// each interest confirmed there will hear it may have lost messages.
    pub(super) fn disconnected(&self, source: usize) {
        let loss = Loss(self.losses.fetch_add(1, Ordering::Relaxed));
        for entry in self.entries().iter_mut() {
            if let Some(confirmed @ true) = entry.confirmed.get_mut(source) {
                *confirmed = false;
                entry.lost[source] = Some(loss);
            }
        }
    }

    /// `source` could not be reached (`topic: None`), or refused `topic`
    /// (an ACL without the subscription's permission): each interest in it
    /// that is not subscribed there yet learns why.
    pub(super) fn failed(&self, topic: Option<&Topic>, source: usize, error: &BackendError) {
        let mut told = false;
        let mut entries = self.entries();
        for at in 0..entries.len() {
            let entry = &mut entries[at];
            let concerned = topic.is_none_or(|t| entry.topic == *t)
                && entry.wanted.get(source) == Some(&true)
                && entry.confirmed.get(source) == Some(&false);
            if !concerned {
                continue;
            }
            entry.failure = Some(error.summary());
            if let (Some(_), Some(Some(loss)), Some(false)) = (
                topic,
                entry.lost.get(source).copied(),
                entry.refusal_told.get(source).copied(),
            ) {
                entry.refusal_told[source] = true;
                // Once per break for a sink with several topics refused.
                let told_already = lost_by_the_same_sink(&entries, at, source, loss)
                    .any(|other| other.refusal_told.get(source) == Some(&true));
                if !told_already {
                    entries[at].sink.refused_again();
                }
            }
            told = true;
        }
        drop(entries);
        if told {
            self.confirmed.notify_waiters();
        }
    }

    /// Hands `message`, heard on `source` through the channel or pattern
    /// subscription `name`, to every interest in it.
    pub(super) fn route(&self, pattern: bool, name: &str, source: usize, message: &Message) {
        for entry in self.entries().iter() {
            let matches = match &entry.topic {
                Topic::Pattern(p) => pattern && p == name,
                Topic::Channel(c) => !pattern && c == name,
            };
            if matches && entry.wanted.get(source) == Some(&true) {
                entry.sink.heard(message);
            }
        }
    }
}

/// The other entries whose sink is `entries[at]`'s and whose topic was lost
/// on `source` in the same break, and is not back yet.
fn lost_by_the_same_sink(
    entries: &[Entry],
    at: usize,
    source: usize,
    loss: Loss,
) -> impl Iterator<Item = &Entry> {
    let sink = &entries[at].sink;
    entries.iter().enumerate().filter_map(move |(i, other)| {
        (i != at && Arc::ptr_eq(&other.sink, sink) && other.lost.get(source) == Some(&Some(loss)))
            .then_some(other)
    })
}

/// One registered interest; dropping it unregisters (the subscriber then
/// unsubscribes its topic unless another interest or a waiter wants it).
pub(crate) struct Interest {
    interests: Arc<Interests>,
    id: u64,
}

impl Interest {
    /// Completes once the topic is subscribed on every source the interest
    /// wants: from then on, every message published there reaches its sink.
    /// Fails with the first reason the subscriber gives why it could not
    /// subscribe it (it goes on trying while the interest lives), or once
    /// the manager has shut down.
    pub(crate) async fn subscribed(&self) -> Result<(), BackendError> {
        loop {
            let notified = self.interests.confirmed.notified();
            let mut notified = std::pin::pin!(notified);
            // Listening before looking: a confirmation after the look
            // notifies this listener.
            notified.as_mut().enable();
            if let Some(entry) = self
                .interests
                .entries()
                .iter_mut()
                .find(|e| e.id == self.id)
            {
                if let Some(failure) = entry.failure.take() {
                    return Err(failure);
                }
                let done = entry
                    .wanted
                    .iter()
                    .zip(&entry.confirmed)
                    .all(|(wanted, confirmed)| !wanted || *confirmed);
                if done {
                    return Ok(());
                }
            } else if self.interests.closed.load(Ordering::Acquire) {
                return Err(BackendError::new(
                    crate::error::BackendErrorKind::Other,
                    "the lock manager shut down".to_owned(),
                ));
            }
            notified.await;
        }
    }
}

impl std::fmt::Debug for Interest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interest").field("id", &self.id).finish()
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut entries = self.interests.entries();
        if let Some(at) = entries.iter().position(|e| e.id == self.id) {
            let entry = entries.swap_remove(at);
            drop(entries);
            let _ = self.interests.changes.send(entry.topic);
        }
    }
}
