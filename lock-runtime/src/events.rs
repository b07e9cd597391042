//! Lock events for observers: what happens to the locks whose key matches a
//! pattern, from the messages the scripts publish as they change a lock
//! (managers built with `lock_events(true)`), and from Redis's keyspace
//! notifications for expiry.
//!
//! A script that grants, releases, hands over or force-unlocks a default lock
//! publishes on `<prefix>events:<key>` in the same atomic step, so the events
//! of one key arrive in the order Redis applied them. A holder whose renewal
//! finds the lock gone publishes `lost` afterwards. An expiry is Redis's own
//! `expired` keyspace notification of the lock's name, which needs
//! `notify-keyspace-events` to include `K` and `x` (or `A`).
//!
//! PostgreSQL's LISTEN takes no patterns: its functions notify every event of
//! a schema on one channel, each message naming its lock, and a stream keeps
//! those of its prefix and pattern. An expiry there is told by whoever
//! removes the row whose lease ran out: any manager's periodic sweep, or the
//! acquisition or hand-off that takes the lock over (`expired` then the new
//! grant).
//!
//! Each stream buffers at most its capacity of events for its reader; when the
//! reader falls behind, the newer events are dropped and counted, so the
//! subscription's task never waits on the reader and the buffer never grows.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::sync::{Arc, Weak};

use crate::backend::messages::{named_event, NamedEvent};
use crate::backend::{Backend, KeyNotice, Message};
use crate::buffer::{self, Popped};
use crate::core::Core;
use crate::error::{BackendError, BackendErrorKind, KeyPreview, LockError};
use crate::keys;
use crate::waiting::{Interest, Sink, Topic};
use crate::LockManager;

impl LockManager {
    /// Subscribes to the events of the locks whose key matches the glob
    /// `pattern` (as [`list`](Self::list) takes it: `*`, `?`, `[abc]`, `\`
    /// escapes): acquired, released, handed over, force-unlocked, expired and
    /// lost. Await the request (or call
    /// [`subscribe`](LockEventsRequest::subscribe)) to get the stream.
    ///
    /// The stream buffers up to [`DEFAULT_EVENTS_CAPACITY`] events (see
    /// [`capacity`](LockEventsRequest::capacity)) for a reader that is
    /// behind. Once that is full, newer events are dropped rather than
    /// queued, and the reader, having read the buffered ones, gets one
    /// `Err(`[`EventsSkipped`]`)` telling how many it missed there before the
    /// events that came after (as tokio's `broadcast` reports lag). A reader
    /// that needs the state after a skip reads it ([`inspect`](Self::inspect),
    /// [`list`](Self::list)).
    ///
    /// Events are published by the managers that take the locks when built
    /// with [`lock_events(true)`](crate::LockManagerBuilder::lock_events)
    /// (force-unlocks by any manager); they cover the default lock
    /// ([`lock`](Self::lock), [`lock_all`](Self::lock_all), leader
    /// elections), not read-write locks or semaphores. Expiry needs Redis's keyspace notifications (see
    /// [`expiry`](LockEventsRequest::expiry)). Not available on Redlock.
    ///
    /// On PostgreSQL, an expiry is reported when a manager's periodic sweep
    /// removes the lock's row (within the builder's `postgres_sweep_interval`
    /// of the lease's end, whichever manager of the schema sweeps first), or
    /// when an acquisition or hand-off of a manager that publishes lock
    /// events takes the lock over first (`Expired` then its `Acquired` or
    /// `HandedOver`). A manager built without `lock_events(true)` that takes
    /// an expired lock over tells nothing, the expiry included (the row it
    /// replaces is then gone before any sweep): turn lock events on in every
    /// process that takes the locks watched, as for the other events. A notification reaches only the
    /// listening connections open when its transaction commits: after the
    /// manager's listening connection broke and was made again, the stream
    /// says `Err(EventsSkipped { count: 0 })`, as on Redis. An event of a
    /// lock whose stored name is too long for a notification (PostgreSQL's
    /// 8000-byte payload limit: a key of several kilobytes) cannot name its
    /// lock: every stream of the schema gets `Err(EventsSkipped { count: 1 })`
    /// for it instead.
    ///
    /// ```no_run
    /// # async fn demo(manager: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// use futures_util::StreamExt;
    /// let mut events = manager.events("order:*").await?;
    /// while let Some(event) = events.next().await {
    ///     match event {
    ///         Ok(event) => println!("{}: {:?}", event.key, event.kind),
    ///         Err(skipped) => println!("fell behind: {} events missed", skipped.count),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn events(&self, pattern: impl Into<String>) -> LockEventsRequest {
        LockEventsRequest {
            manager: self.clone(),
            pattern: pattern.into(),
            expiry: true,
            capacity: DEFAULT_EVENTS_CAPACITY,
        }
    }
}

/// How many events a [`LockEvents`] stream buffers for its reader unless
/// [`LockEventsRequest::capacity`] says otherwise. A buffered event takes
/// about a hundred bytes plus its key and holder: with those some tens of
/// bytes long, a full buffer is a few hundred kilobytes.
pub const DEFAULT_EVENTS_CAPACITY: usize = 1024;

/// A subscription to lock events, from [`LockManager::events`]; await it.
#[derive(Debug, Clone)]
#[must_use = "a request does nothing until it is awaited"]
pub struct LockEventsRequest {
    manager: LockManager,
    pattern: String,
    expiry: bool,
    capacity: usize,
}

impl LockEventsRequest {
    /// Whether to report expired locks (default true). Redis tells of an
    /// expiry only by keyspace notifications, which are off by default:
    /// subscribing checks that `notify-keyspace-events` includes `K` and `x`
    /// (or `A`) on every server that holds locks, and fails with
    /// [`LockError::ExpiryNotifications`] (naming the `CONFIG SET` that turns
    /// them on) if not. A replica that a failover promotes later (Sentinel,
    /// Cluster) notifies only if its own setting says so: set it on the
    /// replicas too, in their configuration file. The check is made again
    /// after each resubscription, and a server found without the setting is
    /// told to the reader as `Err(EventsSkipped { expiry_off: true, .. })`
    /// (see [`EventsSkipped::expiry_off`]). Off, the stream has
    /// every other event and needs no server setting. On PostgreSQL nothing needs turning on (the sweep
    /// tells of expiries, see [`LockManager::events`]); off, the stream drops
    /// them.
    pub fn expiry(mut self, include: bool) -> Self {
        self.expiry = include;
        self
    }

    /// How many events the stream holds for a reader that is behind (default
    /// [`DEFAULT_EVENTS_CAPACITY`]; 0 is taken as 1). Past it, events are
    /// dropped and the reader is told how many ([`EventsSkipped`]).
    pub fn capacity(mut self, events: usize) -> Self {
        self.capacity = events;
        self
    }

    /// Subscribes: once this returns, every event published afterwards is
    /// delivered (until the stream is dropped).
    ///
    /// # Errors
    /// [`LockError::ExpiryNotifications`] as above; [`LockError::InvalidConfig`]
    /// on a Redlock manager, and on PostgreSQL when the manager's listening
    /// connection did not hear its probe notification as it connected
    /// (through a transaction-mode pooler, without `postgres_listen_url`; or
    /// a probe that came too late, which that connection keeps until it is
    /// made again);
    /// [`LockError::ShutDown`] once the manager shut
    /// down; [`LockError::Backend`] when the store fails or
    /// refuses the subscription, or when the manager's listening connection
    /// cannot be made and subscribed within its connect timeout plus its
    /// command timeout.
    pub async fn subscribe(self) -> Result<LockEvents, LockError> {
        let core = self.manager.inner.core.clone();
        if core.is_shut_down() {
            return Err(LockError::ShutDown { key: self.pattern });
        }
        if matches!(core.backend, Backend::Redlock(_)) {
            return Err(LockError::InvalidConfig(
                "lock events are not available on a Redlock manager".to_owned(),
            ));
        }
        let prefix = core.config.key_prefix.clone();
        let sources = core.backend.message_sources();
        let (events, receiver) = buffer::bounded(self.capacity);
        let interests = match core.backend.lock_events_channel() {
            // One channel for every lock of the store: this stream keeps the
            // events of its own prefix and pattern, expiries among them.
            Some(channel) => {
                let sink: Arc<dyn Sink> = Arc::new(EventSink {
                    prefix,
                    filter: Some(Filter {
                        pattern: self.pattern.clone(),
                        expiry: self.expiry,
                    }),
                    events,
                    // Expiries come with the other events: nothing to check.
                    expiry_check: None,
                });
                vec![core.subscriber.listen(
                    Topic::Channel(channel.to_owned()),
                    sources,
                    true,
                    sink,
                )]
            }
            None => {
                let published = format!(
                    "{}{}{}",
                    keys::escape_glob(&prefix),
                    keys::EVENTS_INFIX,
                    self.pattern
                );
                let expiry = if self.expiry {
                    core.backend.ensure_expiry_notices(&self.pattern).await?;
                    core.backend
                        .expiry_pattern(&keys::lock_scan_pattern(&prefix, &self.pattern))
                } else {
                    None
                };
                let sink: Arc<dyn Sink> = Arc::new(EventSink {
                    prefix,
                    filter: None,
                    events,
                    expiry_check: expiry.is_some().then(|| ExpiryCheck {
                        core: Arc::downgrade(&core),
                        pattern: self.pattern.clone(),
                    }),
                });
                // Published events: classic PUBLISH reaches every node of a
                // cluster, so the first source hears them all. Expiry notices
                // stay on the server that holds the key: every source.
                let mut interests = vec![core.subscriber.listen(
                    Topic::Pattern(published),
                    sources,
                    true,
                    sink.clone(),
                )];
                if let Some(expiry) = expiry {
                    interests.push(core.subscriber.listen(
                        Topic::Pattern(expiry),
                        sources,
                        false,
                        sink,
                    ));
                }
                interests
            }
        };
        let limit = core.config.connect_timeout + core.config.command_timeout;
        // The manager's subscriber connects (or reconnects) within its
        // connect timeout and subscribes within its command timeout.
        let subscribed =
            futures_util::future::try_join_all(interests.iter().map(|i| i.subscribed()));
        let failure = match tokio::time::timeout(limit, subscribed).await {
            Ok(Ok(_)) => None,
            Ok(Err(failure)) => Some(failure),
            Err(_) => Some(BackendError::new(
                BackendErrorKind::Timeout,
                format!("subscribing to lock events took longer than {limit:?}"),
            )),
        };
        if let Some(source) = failure {
            if core.is_shut_down() {
                return Err(LockError::ShutDown { key: self.pattern });
            }
            return Err(LockError::Backend {
                key: self.pattern.clone(),
                source,
            });
        }
        // Subscribed, but on a connection found deaf as it connected: the
        // stream would stay silent until that connection is made again and
        // probed (ten command timeouts later).
        if !core.backend.hears_messages() {
            return Err(LockError::InvalidConfig(format!(
                "lock events of {:?} cannot be heard: this manager's listening connection did \
                 not hear its probe notification, as through a transaction-mode pooler (or the \
                 probe came too late); give it a connection of its own to the server with \
                 postgres_listen_url",
                self.pattern
            )));
        }
        Ok(LockEvents {
            events: receiver,
            _interests: interests,
            _manager: self.manager,
        })
    }
}

/// What a lock events stream's buffer holds.
enum Heard {
    Event(LockEvent),
    /// The subscription broke and was made again: events may have been
    /// missed meanwhile.
    Resubscribed,
    /// An event whose lock could not be named (its name too long for the
    /// store's message): one event this stream may have wanted.
    Unnamed,
    /// Made again on a server that sends no expiry notices.
    ExpiryOff,
}

/// Turns the messages the subscriber routes to a stream into its events.
struct EventSink {
    prefix: String,
    /// On a store with one events channel for every lock: what this stream
    /// keeps of it.
    filter: Option<Filter>,
    events: buffer::Sender<Heard>,
    /// Where expiries are the servers' keyspace notices: the check, made
    /// again after each resubscription, that they still send them.
    expiry_check: Option<ExpiryCheck>,
}

/// After a failover, the servers that hold the locks are others than those
/// checked when subscribing: a promoted replica sends expiry notices only if
/// its own `notify-keyspace-events` says so, and otherwise expiries would
/// stop with nothing to tell the reader.
struct ExpiryCheck {
    /// Weak: the manager's subscriber holds this sink.
    core: Weak<Core>,
    /// The stream's key pattern, for the error's message.
    pattern: String,
}

impl ExpiryCheck {
    /// Reads the servers' settings in a task of its own (the subscriber,
    /// which calls this, never waits on a round trip), and tells the
    /// stream when one no longer sends expiry notices.
    fn spawn(&self, events: buffer::Sender<Heard>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (core, pattern) = (self.core.clone(), self.pattern.clone());
        let resubscribed_at = Instant::now();
        runtime.spawn(async move {
            let Some(core) = core.upgrade() else {
                return;
            };
            if core.is_shut_down() {
                return;
            }
            // One check for every stream of the manager that one reconnect
            // (of one source or several) resubscribed: a check begun after
            // this resubscription read the servers as they are now.
            let off = {
                let mut last = core.expiry_recheck.lock().await;
                match &*last {
                    Some((checked_at, off)) if *checked_at >= resubscribed_at => off.clone(),
                    _ => {
                        let checked_at = Instant::now();
                        let off = expiry_notices_off(&core, &pattern).await;
                        *last = Some((checked_at, off.clone()));
                        off
                    }
                }
            };
            if off.is_some() {
                let _ = events.push_keeping(Heard::ExpiryOff);
            }
        });
    }
}

/// The `CONFIG SET` to run when a server that holds locks sends no expiry
/// notices (logged as a warning); `None` when all do, or when a setting
/// could not be read (a server still starting, a timeout: it was read when
/// subscribing, so nothing is known to be wrong).
async fn expiry_notices_off(core: &Core, pattern: &str) -> Option<String> {
    match core.backend.ensure_expiry_notices(pattern).await {
        Err(LockError::ExpiryNotifications {
            setting,
            config_set,
            ..
        }) if setting != "?" => {
            tracing::warn!(target: "distlock::events",
                pattern = %pattern,
                setting = %setting,
                fix = %config_set,
                "lock events: a server that holds locks now (after a failover) sends no \
                 expiry notices, so expiries are not reported; run the command shown on \
                 it, and set the same in the configuration file of every replica");
            Some(config_set)
        }
        Err(e) => {
            tracing::debug!(target: "distlock::events", error = %e,
                "could not read notify-keyspace-events after a resubscription");
            None
        }
        Ok(()) => None,
    }
}

/// What a stream keeps of a store's one events channel.
struct Filter {
    /// The glob its keys match.
    pattern: String,
    /// Whether it wants expiries.
    expiry: bool,
}

impl Sink for EventSink {
    fn heard(&self, message: &Message) {
        let heard = match &self.filter {
            None => parse(&self.prefix, message).map(Heard::Event),
            Some(filter) => parse_named(&self.prefix, filter, message),
        };
        if let Some(heard) = heard {
            // Never waits: a full buffer drops the event and counts it. A
            // reader that is gone unregisters when its stream drops.
            let _ = self.events.push_or_skip(heard);
        }
    }

    fn subscribed(&self, after_loss: bool) {
        if after_loss {
            // Kept even in a full buffer: counted as one more skipped event,
            // the reader would think it knew how many it missed.
            let _ = self.events.push_keeping(Heard::Resubscribed);
            if let Some(check) = &self.expiry_check {
                check.spawn(self.events.clone());
            }
        }
    }

    fn refused_again(&self) {
        // The reader's stream would otherwise go silent with no sign.
        let _ = self.events.push_keeping(Heard::Resubscribed);
    }
}

impl IntoFuture for LockEventsRequest {
    type Output = Result<LockEvents, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.subscribe())
    }
}

/// What happened to a lock, from [`LockEvents`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockEvent {
    /// The lock key, as the program named it.
    pub key: String,
    /// What happened.
    pub kind: LockEventKind,
}

/// The kinds of [`LockEvent`]. A fencing token is `None` for a hold that had
/// not taken one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEventKind {
    /// The lock was taken while free.
    Acquired {
        /// The new holder's description.
        holder: String,
        /// Its fencing token, when the acquisition took one.
        fencing_token: Option<u64>,
        /// When the hold began, by the holder's clock.
        since: SystemTime,
    },
    /// The holder released it, and nobody was queued for it.
    Released {
        /// The released hold's fencing token.
        fencing_token: Option<u64>,
    },
    /// A release (or a force-unlock, or an expiry found by a waiter) handed
    /// the lock to the first waiter of its queue.
    HandedOver {
        /// The new holder's description.
        holder: String,
        /// The new hold's fencing token.
        fencing_token: Option<u64>,
        /// When the new hold began (the hand-off, by the server's clock).
        since: SystemTime,
    },
    /// An operator freed it ([`LockManager::force_unlock`]).
    ForceUnlocked {
        /// The freed hold's fencing token.
        fencing_token: Option<u64>,
    },
    /// Its lease ran out without a release (the holder crashed, stalled or was
    /// cut off, or a `min_hold` release let it run out).
    Expired,
    /// A holder's renewal found the lock gone or taken over: that holder has
    /// stopped. Published by the holder after the fact, so it may follow the
    /// events of the next holder.
    Lost {
        /// The lost hold's fencing token.
        fencing_token: Option<u64>,
    },
}

/// A [`LockEvents`] stream missed events here. Either its reader fell
/// behind: its buffer was full, and `count` events that followed the ones
/// read before were dropped, the events after it being those heard once
/// there was room again. Or (`count` 0) the manager's listening connection
/// broke and was made again: events published meanwhile were missed, how
/// many is unknown. Or (`count` 1, PostgreSQL) an event came whose lock's
/// name was too long for a notification to carry, so that its lock is
/// unknown (see [`LockManager::events`]). Or ([`expiry_off`](Self::expiry_off))
/// expiries are being missed from here on. A reader that needs the state
/// after a skip reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", skipped_message(self))]
#[non_exhaustive]
pub struct EventsSkipped {
    /// How many events were dropped (on PostgreSQL also an event whose
    /// lock name was too long to send, counted 1); 0 when unknown (the subscription was
    /// made again after its connection broke, or was refused when made
    /// again: the server lost the permission meanwhile; a second one with 0
    /// follows once it is back).
    pub count: u64,
    /// True when, after the subscription was made again (a failover, on
    /// Sentinel or Cluster), a server that holds locks now sends no expiry
    /// notices: its `notify-keyspace-events` lacks `K` or `x`, as a promoted
    /// replica's does unless its own configuration sets them. Expiries are
    /// not reported until that server's setting is changed (the
    /// subscription stays in place, so they arrive once it is); the log
    /// names the `CONFIG SET` to run (warning, target `distlock::events`).
    /// Checked after each resubscription of a stream that wants expiries;
    /// it follows the `count: 0` of that resubscription. Never on
    /// PostgreSQL, whose expiries need no setting.
    pub expiry_off: bool,
}

impl EventsSkipped {
    /// `count` events dropped.
    fn counted(count: u64) -> Self {
        EventsSkipped {
            count,
            expiry_off: false,
        }
    }

    /// Events missed while the subscription was down, how many unknown.
    fn unknown() -> Self {
        EventsSkipped::counted(0)
    }
}

fn skipped_message(skipped: &EventsSkipped) -> String {
    if skipped.expiry_off {
        "the lock events stream misses expiries from here on: a server that holds locks now \
         (after a failover) sends no expiry notices (notify-keyspace-events lacks K or x); \
         the log names the CONFIG SET to run there"
            .to_owned()
    } else if skipped.count == 0 {
        "the lock events stream missed events while its subscription was down (or refused)"
            .to_owned()
    } else {
        format!(
            "the lock events stream dropped {} events: its reader fell behind (or, on \
             PostgreSQL, an event's lock name was too long to send)",
            skipped.count
        )
    }
}

/// The stream from [`LockManager::events`]: `Ok` for each event, and
/// `Err(`[`EventsSkipped`]`)` where events were dropped because the reader
/// had fallen a full buffer behind (see [`LockManager::events`]). The
/// stream shares the manager's listening connection (one per server it
/// listens to) with its waiters and leader watches; when that connection
/// breaks it is made again (with a bounded backoff), and the stream then
/// says `Err(EventsSkipped { count: 0 })`: events published meanwhile were
/// missed, how many is unknown. Dropping the stream unsubscribes. The
/// stream keeps its manager (a clone): made from a manager the program then
/// drops, it goes on. After the manager's
/// [`shutdown`](crate::LockManager::shutdown) it delivers what it had
/// buffered, then ends (`None`).
pub struct LockEvents {
    events: buffer::Receiver<Heard>,
    /// Unregistered (and unsubscribed, unless shared) when dropped.
    _interests: Vec<Interest>,
    /// The manager whose subscriber task feeds this stream: its last clone
    /// dropped would stop that task and leave the stream silent, so the
    /// stream keeps one (as a leader watch keeps its manager).
    _manager: crate::LockManager,
}

impl std::fmt::Debug for LockEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockEvents")
            .field("subscriptions", &self._interests.len())
            .finish_non_exhaustive()
    }
}

impl futures_util::Stream for LockEvents {
    type Item = Result<LockEvent, EventsSkipped>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_pop(cx).map(|popped| {
            popped.map(|popped| match popped {
                Popped::Item(Heard::Event(event)) => Ok(event),
                Popped::Item(Heard::Resubscribed) => Err(EventsSkipped::unknown()),
                Popped::Item(Heard::Unnamed) => Err(EventsSkipped::counted(1)),
                Popped::Item(Heard::ExpiryOff) => Err(EventsSkipped {
                    count: 0,
                    expiry_off: true,
                }),
                Popped::Skipped(count) => Err(EventsSkipped::counted(count)),
            })
        })
    }
}

/// The event `message` tells, if it is one.
fn parse(prefix: &str, message: &Message) -> Option<LockEvent> {
    match message.key_notice() {
        Some(KeyNotice::Expired(name)) => {
            return Some(LockEvent {
                key: keys::user_key_of(prefix, name)?.to_owned(),
                kind: LockEventKind::Expired,
            });
        }
        Some(KeyNotice::Other) => return None,
        None => {}
    }
    let payload = std::str::from_utf8(&message.payload).ok()?;
    let key = message
        .channel
        .strip_prefix(prefix)?
        .strip_prefix(keys::EVENTS_INFIX)?;
    parse_event(key, payload)
}

/// What a message of a store's one events channel tells this stream, if it
/// is for it (see [`named_event`]).
fn parse_named(prefix: &str, filter: &Filter, message: &Message) -> Option<Heard> {
    let (name, event) = match named_event(&message.payload)? {
        NamedEvent::Unnamed => return Some(Heard::Unnamed),
        NamedEvent::Of { name, event } => (name, event),
    };
    let key = keys::user_key_of(prefix, name)?;
    if !keys::glob_matches(&filter.pattern, key) {
        return None;
    }
    if event == "expired" {
        return filter.expiry.then(|| {
            Heard::Event(LockEvent {
                key: key.to_owned(),
                kind: LockEventKind::Expired,
            })
        });
    }
    parse_event(key, event).map(Heard::Event)
}

/// The event `payload` (the text a script publishes) tells of `key`.
fn parse_event(key: &str, payload: &str) -> Option<LockEvent> {
    let mut parts = payload.splitn(4, ' ');
    let what = parts.next()?;
    let token = parts
        .next()
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t != 0);
    let taken = |parts: &mut std::str::SplitN<'_, char>| -> Option<(SystemTime, String)> {
        let since: u64 = parts.next()?.parse().ok()?;
        let holder = parts.next().unwrap_or("").to_owned();
        // Checked: a time past what the platform's SystemTime holds (another
        // program's message) is not an event, rather than a panic in the
        // subscriber's task.
        Some((
            UNIX_EPOCH.checked_add(Duration::from_millis(since))?,
            holder,
        ))
    };
    let kind = match what {
        "acquired" => {
            let (since, holder) = taken(&mut parts)?;
            LockEventKind::Acquired {
                holder,
                fencing_token: token,
                since,
            }
        }
        "handed-over" => {
            let (since, holder) = taken(&mut parts)?;
            LockEventKind::HandedOver {
                holder,
                fencing_token: token,
                since,
            }
        }
        "released" => LockEventKind::Released {
            fencing_token: token,
        },
        "force-unlocked" => LockEventKind::ForceUnlocked {
            fencing_token: token,
        },
        "lost" => LockEventKind::Lost {
            fencing_token: token,
        },
        other => {
            tracing::debug!(target: "distlock::events", key = %KeyPreview(key), event = other,
                "unknown lock event");
            return None;
        }
    };
    Some(LockEvent {
        key: key.to_owned(),
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(channel: &str, payload: &str) -> Message {
        Message {
            channel: channel.to_owned(),
            pattern: None,
            payload: payload.as_bytes().to_vec(),
        }
    }

    #[test]
    fn messages_are_read_as_events() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(
            parse(
                "p:",
                &message(
                    "p:events:order:1",
                    "acquired 7 1700000000123 web-1 pid 7 api"
                )
            ),
            Some(LockEvent {
                key: "order:1".into(),
                kind: LockEventKind::Acquired {
                    holder: "web-1 pid 7 api".into(),
                    fencing_token: Some(7),
                    since: at,
                },
            })
        );
        assert_eq!(
            parse("p:", &message("p:events:a b", "released 0")).map(|e| (e.key, e.kind)),
            Some((
                "a b".into(),
                LockEventKind::Released {
                    fencing_token: None
                }
            ))
        );
        let name = keys::RedisNames::new("p:", "order:1").lock;
        assert_eq!(
            parse("p:", &message(&format!("__keyspace@0__:{name}"), "expired")).map(|e| e.kind),
            Some(LockEventKind::Expired)
        );
        assert_eq!(
            parse("p:", &message(&format!("__keyspace@0__:{name}"), "set")),
            None
        );
        assert_eq!(parse("p:", &message("p:events:k", "nonsense 1")), None);
        assert_eq!(parse("p:", &message("other:events:k", "released 1")), None);
    }

    /// A message of a store's one events channel about `key` under `prefix`.
    fn named(prefix: &str, key: &str, event: &str) -> Message {
        let name = keys::RedisNames::new(prefix, key).lock;
        message(
            "s/events",
            &format!("{} {name} {event}", name.chars().count()),
        )
    }

    fn heard(filter: &Filter, message: &Message) -> Option<Result<LockEvent, ()>> {
        parse_named("p:", filter, message).map(|heard| match heard {
            Heard::Event(event) => Ok(event),
            _ => Err(()),
        })
    }

    #[test]
    fn named_messages_are_kept_by_prefix_pattern_and_expiry() {
        let orders = Filter {
            pattern: "order:*".into(),
            expiry: true,
        };
        assert_eq!(
            heard(&orders, &named("p:", "order:1", "released 3")),
            Some(Ok(LockEvent {
                key: "order:1".into(),
                kind: LockEventKind::Released {
                    fencing_token: Some(3)
                },
            }))
        );
        assert_eq!(
            heard(&orders, &named("p:", "order 1", "expired")),
            None,
            "outside the pattern"
        );
        assert_eq!(
            heard(&orders, &named("q:", "order:1", "released 3")),
            None,
            "another prefix's lock"
        );
        assert_eq!(
            heard(&orders, &named("p:", "order:1", "expired")).map(|e| e.map(|e| e.kind)),
            Some(Ok(LockEventKind::Expired))
        );
        let without_expiry = Filter {
            pattern: "*".into(),
            expiry: false,
        };
        assert_eq!(
            heard(&without_expiry, &named("p:", "order:1", "expired")),
            None
        );
        // An event whose name did not fit: every stream counts it skipped.
        assert_eq!(
            heard(&without_expiry, &message("s/events", "- acquired")),
            Some(Err(()))
        );
    }

    #[test]
    fn globs_in_the_prefix_are_escaped() {
        assert_eq!(keys::escape_glob("app*1:[x]"), "app\\*1:\\[x\\]");
    }
}
