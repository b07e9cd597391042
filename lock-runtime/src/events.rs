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
//! Each stream buffers at most its capacity of events for its reader; when the
//! reader falls behind, the newer events are dropped and counted, so the
//! subscription's task never waits on the reader and the buffer never grows.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::{Backend, MessageConnection};
use crate::buffer::{self, Popped};
use crate::error::{BackendError, BackendErrorKind, KeyPreview, LockError};
use crate::keys;
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
    /// them on) if not. Off, the stream has every other event and needs no
    /// server setting.
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
    /// on a Redlock manager; [`LockError::Connect`] / [`LockError::Backend`]
    /// when Redis cannot be reached or fails.
    pub async fn subscribe(self) -> Result<LockEvents, LockError> {
        let core = self.manager.inner.core.clone();
        core.backend
            .refuse_unless_redis(&self.pattern, "lock events")?;
        if matches!(core.backend, Backend::Redlock(_)) {
            return Err(LockError::InvalidConfig(
                "lock events are not available on a Redlock manager".to_owned(),
            ));
        }
        let prefix = core.config.key_prefix.clone();
        let published = format!(
            "{}{}{}",
            keys::escape_glob(&prefix),
            keys::EVENTS_INFIX,
            self.pattern
        );
        let expiry = if self.expiry {
            check_expiry_notifications(&core.backend, &self.pattern).await?;
            // The lock's name on any database (the URL chooses it; a cluster
            // has only 0).
            Some(format!(
                "__keyspace@*__:{}",
                keys::lock_scan_pattern(&prefix, &self.pattern)
            ))
        } else {
            None
        };
        let (sender, receiver) = buffer::bounded(self.capacity);
        let mut listeners = Vec::new();
        // Published events: classic PUBLISH reaches every node of a cluster,
        // so one subscription hears them all. Expiry notifications stay on the
        // node that holds the key: one subscription per server.
        for source in 0..core.backend.message_sources() {
            let patterns: Vec<String> = (source == 0)
                .then(|| published.clone())
                .into_iter()
                .chain(expiry.clone())
                .collect();
            if patterns.is_empty() {
                continue;
            }
            let conn = connect(&self.manager, source, &patterns)
                .await
                .map_err(|source| LockError::Backend {
                    key: self.pattern.clone(),
                    source,
                })?;
            listeners.push(tokio::spawn(listen(
                self.manager.clone(),
                source,
                patterns,
                conn,
                sender.clone(),
            )));
        }
        Ok(LockEvents {
            events: receiver,
            listeners,
        })
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

/// The reader of a [`LockEvents`] stream fell behind: its buffer was full,
/// and this many events that followed the ones read before were dropped.
/// The events after it are those heard once there was room again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lock events stream dropped {count} events: its reader fell behind")]
#[non_exhaustive]
pub struct EventsSkipped {
    /// How many events were dropped.
    pub count: u64,
}

/// The stream from [`LockManager::events`]: `Ok` for each event, and
/// `Err(`[`EventsSkipped`]`)` where events were dropped because the reader
/// had fallen a full buffer behind (see [`LockManager::events`]). A
/// subscription that breaks is made again (with a bounded backoff); events
/// published meanwhile are missed, unannounced. Dropping the stream
/// unsubscribes.
pub struct LockEvents {
    events: buffer::Receiver<LockEvent>,
    listeners: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for LockEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockEvents")
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
}

impl futures_util::Stream for LockEvents {
    type Item = Result<LockEvent, EventsSkipped>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_pop(cx).map(|popped| {
            popped.map(|popped| match popped {
                Popped::Item(event) => Ok(event),
                Popped::Skipped(count) => Err(EventsSkipped { count }),
            })
        })
    }
}

impl Drop for LockEvents {
    fn drop(&mut self) {
        for listener in &self.listeners {
            listener.abort();
        }
    }
}

/// Fails unless every server notifies expired keys (`K` and `x`, or `A` for
/// `x`, in `notify-keyspace-events`).
async fn check_expiry_notifications(backend: &Backend, pattern: &str) -> Result<(), LockError> {
    let settings = match backend.config_get("notify-keyspace-events").await {
        Ok(settings) => settings,
        Err(e) => {
            tracing::debug!(target: "distlock::events", error = %e.error,
                "could not read notify-keyspace-events");
            vec![None]
        }
    };
    for setting in settings {
        let flags = setting.clone().unwrap_or_default();
        let keyspace = flags.contains('K');
        let expired = flags.contains('x') || flags.contains('A');
        if !(keyspace && expired) {
            let mut wanted = flags.clone();
            for flag in ['K', 'x'] {
                // `A` stands for every event class, `x` included.
                let set = wanted.contains(flag) || (flag == 'x' && wanted.contains('A'));
                if !set {
                    wanted.push(flag);
                }
            }
            return Err(LockError::ExpiryNotifications {
                pattern: pattern.to_owned(),
                setting: setting.unwrap_or_else(|| "?".to_owned()),
                config_set: format!("CONFIG SET notify-keyspace-events {wanted}"),
            });
        }
    }
    Ok(())
}

async fn connect(
    manager: &LockManager,
    source: usize,
    patterns: &[String],
) -> Result<MessageConnection, BackendError> {
    let core = &manager.inner.core;
    let subscribe = async {
        let mut conn = core.backend.messages(source).await?;
        for pattern in patterns {
            conn.psubscribe(pattern).await?;
        }
        Ok(conn)
    };
    match tokio::time::timeout(core.config.connect_timeout, subscribe).await {
        Ok(result) => result,
        Err(_) => Err(BackendError::new(
            BackendErrorKind::Timeout,
            "subscribing to lock events timed out",
        )),
    }
}

/// Forwards the events heard on one subscription, re-made when it breaks.
async fn listen(
    manager: LockManager,
    source: usize,
    patterns: Vec<String>,
    mut conn: MessageConnection,
    events: buffer::Sender<LockEvent>,
) {
    let prefix = manager.inner.core.config.key_prefix.clone();
    let mut delay = Duration::from_millis(50);
    loop {
        {
            while let Some(message) = conn.next().await {
                let Ok(payload) = std::str::from_utf8(&message.payload) else {
                    continue;
                };
                if let Some(event) = parse(&prefix, &message.channel, payload) {
                    // Never waits: a full buffer drops the event and counts it.
                    if events.push_or_skip(event).is_err() {
                        return;
                    }
                }
            }
        }
        tracing::debug!(target: "distlock::events", source, "events subscription closed; reconnecting");
        conn = loop {
            if events.is_closed() {
                return;
            }
            tokio::time::sleep(delay).await;
            match connect(&manager, source, &patterns).await {
                Ok(conn) => break conn,
                Err(e) => {
                    tracing::debug!(target: "distlock::events", source, error = %e,
                        "could not subscribe to lock events");
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
            }
        };
        delay = Duration::from_millis(50);
    }
}

/// The event a message on `channel` tells, if it is one.
fn parse(prefix: &str, channel: &str, payload: &str) -> Option<LockEvent> {
    if let Some(name) = channel
        .strip_prefix("__keyspace@")
        .and_then(|rest| rest.split_once("__:"))
        .map(|(_, name)| name)
    {
        let key = keys::user_key_of(prefix, name)?;
        return (payload == "expired").then(|| LockEvent {
            key: key.to_owned(),
            kind: LockEventKind::Expired,
        });
    }
    let key = channel
        .strip_prefix(prefix)?
        .strip_prefix(keys::EVENTS_INFIX)?;
    let mut parts = payload.splitn(4, ' ');
    let what = parts.next()?;
    let token = parts
        .next()
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t != 0);
    let taken = |parts: &mut std::str::SplitN<'_, char>| -> Option<(SystemTime, String)> {
        let since: u64 = parts.next()?.parse().ok()?;
        let holder = parts.next().unwrap_or("").to_owned();
        Some((UNIX_EPOCH + Duration::from_millis(since), holder))
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

    #[test]
    fn messages_are_read_as_events() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(
            parse(
                "p:",
                "p:events:order:1",
                "acquired 7 1700000000123 web-1 pid 7 api"
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
            parse("p:", "p:events:a b", "released 0").map(|e| (e.key, e.kind)),
            Some((
                "a b".into(),
                LockEventKind::Released {
                    fencing_token: None
                }
            ))
        );
        let name = keys::RedisNames::new("p:", "order:1").lock;
        assert_eq!(
            parse("p:", &format!("__keyspace@0__:{name}"), "expired").map(|e| e.kind),
            Some(LockEventKind::Expired)
        );
        assert_eq!(parse("p:", &format!("__keyspace@0__:{name}"), "set"), None);
        assert_eq!(parse("p:", "p:events:k", "nonsense 1"), None);
        assert_eq!(parse("p:", "other:events:k", "released 1"), None);
    }

    #[test]
    fn globs_in_the_prefix_are_escaped() {
        assert_eq!(keys::escape_glob("app*1:[x]"), "app\\*1:\\[x\\]");
    }
}
