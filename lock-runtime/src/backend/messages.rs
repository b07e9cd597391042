//! The message source: the one way the layers above the backend hear what
//! the store pushes (wake-ups, hand-offs, lock events, leader announcements).
//!
//! A [`MessageConnection`] is one listening connection to one source (see
//! [`Backend::message_sources`](super::Backend::message_sources)): it
//! subscribes to exact channel names and, where the store can, to patterns,
//! and yields [`Message`]s. It says nothing of Redis or of any other store:
//! each store is one variant here, and the subscriber that owns the
//! connections (`waiting/subscriber.rs`) never sees which. A connection that
//! breaks ends its stream (`next` gives `None`); whoever owns it opens another
//! and subscribes again, and must assume that messages were lost meanwhile.

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};

use crate::error::BackendError;

/// One message heard on a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    /// The channel it was published on.
    pub(crate) channel: String,
    /// The pattern subscription that matched it, if it came through one.
    pub(crate) pattern: Option<String>,
    /// What was published.
    pub(crate) payload: Vec<u8>,
}

impl Message {
    /// What the store itself tells of a key here, when this is such a notice
    /// rather than a message distlock published: on Redis, a keyspace
    /// notification (see [`Backend::expiry_pattern`](super::Backend::expiry_pattern)).
    pub(crate) fn key_notice(&self) -> Option<KeyNotice<'_>> {
        let name = self
            .channel
            .strip_prefix("__keyspace@")
            .and_then(|rest| rest.split_once("__:"))
            .map(|(_, name)| name)?;
        Some(if self.payload == b"expired" {
            KeyNotice::Expired(name)
        } else {
            KeyNotice::Other
        })
    }
}

/// A message of a store's one lock events channel (see
/// [`Backend::lock_events_channel`](super::Backend::lock_events_channel)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NamedEvent<'a> {
    /// `event` (the text Redis publishes on a lock's events channel, or
    /// `expired`) happened to the lock whose stored name is `name`.
    Of { name: &'a str, event: &'a str },
    /// An event whose lock's name was too long to carry (the payload limit):
    /// which lock it was, nobody can tell.
    Unnamed,
}

/// Reads a message of a store's one lock events channel: `<n> <name>
/// <event>`, `n` the number of characters of `name` (so that a name may hold
/// spaces), or `- <event word>` for an event whose name did not fit (see
/// `lock_event` in the PostgreSQL schema). `None` for anything else. A
/// database in `SQL_ASCII` counts a name's characters in bytes: the count is
/// read in characters, or in bytes when only that split leaves an event of a
/// known kind after the name.
pub(crate) fn named_event(payload: &[u8]) -> Option<NamedEvent<'_>> {
    let text = std::str::from_utf8(payload).ok()?;
    let (count, rest) = text.split_once(' ')?;
    if count == "-" {
        return Some(NamedEvent::Unnamed);
    }
    let count: usize = count.parse().ok()?;
    // The byte where the name's `count` characters end.
    let in_chars = match rest.char_indices().nth(count) {
        Some((end, _)) => Some(end),
        None if rest.chars().count() == count => Some(rest.len()),
        None => None,
    };
    let split = |end: usize| {
        let name = rest.get(..end)?;
        let event = rest.get(end..)?.strip_prefix(' ')?;
        Some(NamedEvent::Of { name, event })
    };
    let known = |split: &Option<NamedEvent<'_>>| {
        matches!(split, Some(NamedEvent::Of { event, .. })
            if EVENT_WORDS.contains(&event.split(' ').next().unwrap_or("")))
    };
    let (chars, bytes) = (in_chars.and_then(split), split(count));
    if !known(&chars) && known(&bytes) {
        return bytes;
    }
    chars.or(bytes)
}

/// The first words of the events a lock's events channel carries (see
/// `events.rs`).
const EVENT_WORDS: [&str; 6] = [
    "acquired",
    "handed-over",
    "released",
    "force-unlocked",
    "lost",
    "expired",
];

/// A store's own notice of something that happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyNotice<'a> {
    /// The key (its full stored name) expired.
    Expired(&'a str),
    /// Anything else done to a key, which distlock does not report.
    Other,
}

/// One listening connection to one message source.
pub(crate) enum MessageConnection {
    /// A Redis pub/sub connection: its command half and its message half, so
    /// that waiting for a message never holds up a subscription change.
    Redis {
        sink: PubSubSink,
        stream: PubSubStream,
    },
    /// A PostgreSQL LISTEN connection (exact channel names only).
    #[cfg(feature = "postgres")]
    Postgres(Box<super::postgres::listener::Listener>),
}

impl MessageConnection {
    /// Wraps a Redis pub/sub connection.
    pub(crate) fn redis(pubsub: redis::aio::PubSub) -> Self {
        let (sink, stream) = pubsub.split();
        MessageConnection::Redis { sink, stream }
    }

    /// Subscribes to the exact channel `channel`; once this returns, every
    /// message published on it reaches [`next`](Self::next).
    pub(crate) async fn subscribe(&mut self, channel: &str) -> Result<(), BackendError> {
        match self {
            MessageConnection::Redis { sink, .. } => sink
                .subscribe(channel)
                .await
                .map_err(BackendError::from_redis),
            #[cfg(feature = "postgres")]
            MessageConnection::Postgres(listener) => listener.subscribe(channel).await,
        }
    }

    /// Stops hearing `channel`.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> Result<(), BackendError> {
        match self {
            MessageConnection::Redis { sink, .. } => sink
                .unsubscribe(channel)
                .await
                .map_err(BackendError::from_redis),
            #[cfg(feature = "postgres")]
            MessageConnection::Postgres(listener) => listener.unsubscribe(channel).await,
        }
    }

    /// Whether this connection takes patterns
    /// ([`psubscribe`](Self::psubscribe)); where it does not, a pattern is
    /// never subscribed and whoever wants one never hears it confirmed.
    pub(crate) fn takes_patterns(&self) -> bool {
        match self {
            MessageConnection::Redis { .. } => true,
            #[cfg(feature = "postgres")]
            MessageConnection::Postgres(_) => false,
        }
    }

    /// Subscribes to every channel matching the glob `pattern`.
    pub(crate) async fn psubscribe(&mut self, pattern: &str) -> Result<(), BackendError> {
        match self {
            MessageConnection::Redis { sink, .. } => sink
                .psubscribe(pattern)
                .await
                .map_err(BackendError::from_redis),
            // LISTEN takes exact names only.
            #[cfg(feature = "postgres")]
            MessageConnection::Postgres(_) => Err(BackendError::new(
                crate::error::BackendErrorKind::Other,
                format!("PostgreSQL's LISTEN takes no patterns (asked for {pattern:?})"),
            )),
        }
    }

    /// Stops hearing the channels matching `pattern`.
    pub(crate) async fn punsubscribe(&mut self, pattern: &str) -> Result<(), BackendError> {
        match self {
            MessageConnection::Redis { sink, .. } => sink
                .punsubscribe(pattern)
                .await
                .map_err(BackendError::from_redis),
            // Never subscribed (see `takes_patterns`): nothing to stop.
            #[cfg(feature = "postgres")]
            MessageConnection::Postgres(_) => Ok(()),
        }
    }

    /// A round trip on the connection (`PING distlock:idle`, named so that
    /// an operator's `MONITOR` tells it apart; PostgreSQL: `SELECT 1`), so
    /// that one that went silent (a partition, a load balancer that dropped
    /// it while idle, with no reset) is noticed. Messages that arrive
    /// meanwhile wait for [`next`](Self::next).
    pub(crate) async fn ping(&mut self) -> Result<(), BackendError> {
        match self {
            MessageConnection::Redis { sink, .. } => sink
                .ping_message::<redis::Value>("distlock:idle")
                .await
                .map(drop)
                .map_err(BackendError::from_redis),
            #[cfg(feature = "postgres")]
            MessageConnection::Postgres(listener) => listener.ping().await,
        }
    }

    /// The next message; `None` once the connection has closed. Cancel-safe:
    /// a message is never lost by dropping this future.
    pub(crate) async fn next(&mut self) -> Option<Message> {
        match self {
            MessageConnection::Redis { stream, .. } => {
                let msg = stream.next().await?;
                Some(Message {
                    channel: msg.get_channel_name().to_owned(),
                    pattern: if msg.from_pattern() {
                        msg.get_pattern::<String>().ok()
                    } else {
                        None
                    },
                    payload: msg.get_payload_bytes().to_vec(),
                })
            }
            #[cfg(feature = "postgres")]
            MessageConnection::Postgres(listener) => listener.next().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_events_are_split_by_the_names_length_in_characters() {
        assert_eq!(
            named_event(b"10 p:lock:a b acquired 7 1700000000123 web 1"),
            Some(NamedEvent::Of {
                name: "p:lock:a b",
                event: "acquired 7 1700000000123 web 1"
            })
        );
        // Characters, not bytes: what PostgreSQL counts whatever its
        // encoding.
        assert_eq!(
            named_event("3 été expired".as_bytes()),
            Some(NamedEvent::Of {
                name: "été",
                event: "expired"
            })
        );
        // A database in SQL_ASCII counts bytes, also where the count in
        // characters would end the name at a space inside the event.
        assert_eq!(
            named_event("18 ééééééééé acquired 7 1 h".as_bytes()),
            Some(NamedEvent::Of {
                name: "ééééééééé",
                event: "acquired 7 1 h"
            })
        );
        assert_eq!(
            named_event("5 été expired".as_bytes()),
            Some(NamedEvent::Of {
                name: "été",
                event: "expired"
            })
        );
        assert_eq!(named_event(b"- acquired"), Some(NamedEvent::Unnamed));
        // A count that does not end at a space, or runs past the payload.
        assert_eq!(named_event(b"2 abc expired"), None);
        assert_eq!(named_event(b"40 abc expired"), None);
        assert_eq!(named_event(b"3 abc"), None);
        assert_eq!(named_event(b"x abc expired"), None);
    }
}
