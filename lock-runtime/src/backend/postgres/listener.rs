//! The listening connection of a PostgreSQL manager: LISTEN on a connection
//! of its own, whose notifications a task forwards, mapped back to the
//! logical channel names the waiting layer uses (see [`channel_ident`]).
//!
//! A notification sent while this connection is down is lost (PostgreSQL
//! keeps none for a session that is not listening): as with Redis pub/sub,
//! whoever owns the listener reconnects, subscribes again and assumes that
//! messages were lost meanwhile (waiters attempt again, and a queued waiter's
//! attempt finds a lock already handed to it).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::{AsyncMessage, Client, Notification};

use super::{channel_ident, Messages};
use crate::backend::messages::Message;
use crate::error::{BackendError, BackendErrorKind};

/// A channel identifier for one probe: `distlock_probe_` and 16 random hex
/// digits, so that two managers' probes never answer each other.
pub(crate) fn probe_channel() -> String {
    format!("distlock_probe_{:016x}", rand::random::<u64>())
}

/// One LISTEN connection, driven by whoever calls its methods (the
/// subscriber's task), not by a task of its own: a notification goes from
/// the socket to the subscriber with no task between them, one wake-up
/// fewer on every hand-off. Between calls nothing reads the socket, and
/// notifications wait in it (and in the server's queue).
pub(crate) struct Listener {
    client: Client,
    /// distlock's schema, whose channels this connection listens on (see
    /// [`channel_ident`]).
    schema: String,
    /// The connection's messages: reading them is what drives the
    /// connection, also for the commands `client` sends.
    messages: Messages,
    /// The connection closed (or failed): no more messages.
    closed: bool,
    /// Notifications read while a command was waited for, not yet handed
    /// out.
    read: VecDeque<Notification>,
    /// Identifier -> the logical channels subscribed under it (one, unless
    /// two names share a hash).
    names: HashMap<String, Vec<String>>,
    /// Messages of a notification heard under several logical names, not yet
    /// handed out.
    pending: VecDeque<Message>,
    /// Set when the probe was not heard (see `Postgres::listener`): LISTEN
    /// through this connection would only leave listening sessions in a
    /// pooler's pool, so nothing is subscribed.
    deaf: bool,
    /// When a deaf listener ends itself (see [`Listener::go_deaf`]).
    recheck_at: Option<tokio::time::Instant>,
}

/// Reads one message of `messages` into `read` (a notification) or `closed`
/// (the end, or an error). Cancel-safe: a message is taken off the stream
/// only when it is ready, and then kept.
async fn read_one(messages: &mut Messages, read: &mut VecDeque<Notification>, closed: &mut bool) {
    match messages.next().await {
        Some(Ok(AsyncMessage::Notification(n))) => read.push_back(n),
        Some(Ok(_)) => {}
        Some(Err(e)) => {
            tracing::debug!(target: "distlock::postgres", error = %e,
                "listening connection closed");
            *closed = true;
        }
        None => *closed = true,
    }
}

/// Runs `command` (a call on the listener's client) while reading the
/// connection's messages, which carries the command to the server and its
/// reply back; the notifications read meanwhile are kept in `read`. `None`
/// when the connection closed first: tokio-postgres then keeps the reply's
/// sender of a command in flight in the connection, which nobody polls any
/// more, so the command would wait for ever.
async fn driven<T>(
    messages: &mut Messages,
    read: &mut VecDeque<Notification>,
    closed: &mut bool,
    command: impl Future<Output = T>,
) -> Option<T> {
    let mut command = std::pin::pin!(command);
    loop {
        tokio::select! {
            biased;
            done = &mut command => return Some(done),
            () = read_one(messages, read, closed), if !*closed => {}
            () = std::future::ready(()), if *closed => return None,
        }
    }
}

fn broken(e: tokio_postgres::Error) -> BackendError {
    BackendError::new(BackendErrorKind::Connection, super::pg_message(&e))
}

fn closed_under_a_command() -> BackendError {
    BackendError::new(
        BackendErrorKind::Connection,
        "the listening connection closed before the command's reply",
    )
}

impl Listener {
    /// Connects with `pg` through `connector` within `timeout`, to listen on
    /// the channels of distlock's schema `schema`.
    pub(crate) async fn connect(
        connector: &super::Connector,
        pg: tokio_postgres::Config,
        timeout: Duration,
        schema: &str,
    ) -> Result<Listener, BackendError> {
        let (client, messages) = tokio::time::timeout(timeout, connector.connect(&pg))
            .await
            .map_err(|_| {
                BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("no listening connection within {timeout:?}"),
                )
            })?
            .map_err(broken)?;
        Ok(Listener {
            client,
            messages,
            schema: schema.to_owned(),
            closed: false,
            read: VecDeque::new(),
            names: HashMap::new(),
            pending: VecDeque::new(),
            deaf: false,
            recheck_at: None,
        })
    }

    /// Runs `sql` on this listener's client, driving the connection
    /// meanwhile (see [`driven`]): the outer error when the connection
    /// closed before the reply, the inner one the statement's.
    async fn execute(
        &mut self,
        sql: &str,
    ) -> Result<Result<(), tokio_postgres::Error>, BackendError> {
        let Listener {
            client,
            messages,
            read,
            closed,
            ..
        } = self;
        driven(messages, read, closed, client.batch_execute(sql))
            .await
            .ok_or_else(closed_under_a_command)
    }

    /// One statement that needs the server (`SELECT 1`): an answer says the
    /// connection still carries notifications. Notifications that arrive
    /// meanwhile wait for [`next`](Self::next).
    pub(crate) async fn ping(&mut self) -> Result<(), BackendError> {
        self.execute("SELECT 1").await?.map_err(broken)
    }

    /// Listens on the probe channel `channel` (an identifier from
    /// [`probe_channel`]), runs `notify` (which must notify it from another
    /// session) and tells whether the notification arrived within `timeout`.
    /// A LISTEN the server (or a pooler) refuses is not heard; a broken or
    /// silent connection is an error, as for any other command.
    pub(crate) async fn probe(
        &mut self,
        channel: &str,
        timeout: Duration,
        notify: impl std::future::Future<Output = Result<(), BackendError>>,
    ) -> Result<bool, BackendError> {
        let timed_out = |what: &str| {
            BackendError::new(
                BackendErrorKind::Timeout,
                format!("{what} took longer than {timeout:?}"),
            )
        };
        let listen_sql = format!("LISTEN {channel}");
        match tokio::time::timeout(timeout, self.execute(&listen_sql)).await {
            Err(_) => return Err(timed_out("LISTEN")),
            Ok(Err(closed)) => return Err(closed),
            // Refused, unless the error ended the session (a terminated
            // backend): that connection is broken, not deaf.
            Ok(Ok(Err(e))) if e.as_db_error().is_some() && !super::ended_the_connection(&e) => {
                tracing::debug!(target: "distlock::postgres", error = %e, "LISTEN refused");
                return Ok(false);
            }
            Ok(Ok(Err(e))) => return Err(broken(e)),
            Ok(Ok(Ok(()))) => {}
        }
        let notified = tokio::time::timeout(timeout, notify);
        driven(
            &mut self.messages,
            &mut self.read,
            &mut self.closed,
            notified,
        )
        .await
        .ok_or_else(closed_under_a_command)?
        .map_err(|_| timed_out("the probe's NOTIFY"))??;
        // A connection that closes before the notification is broken, not
        // deaf: reconnected, rather than counted as behind a pooler.
        let arrived = tokio::time::timeout(timeout, async {
            loop {
                if let Some(at) = self.read.iter().position(|n| n.channel() == channel) {
                    self.read.remove(at);
                    return Ok(true);
                }
                if self.closed {
                    return Err(closed_under_a_command());
                }
                read_one(&mut self.messages, &mut self.read, &mut self.closed).await;
            }
        })
        .await
        .unwrap_or(Ok(false))?;
        if !arrived {
            // Best effort, not checked: through a transaction-mode pooler
            // this runs on whichever server session is free, most often the
            // one that just listened (pools hand out the last one back).
            let _ = tokio::time::timeout(timeout, self.execute("UNLISTEN *")).await;
        } else {
            let unlisten = format!("UNLISTEN {channel}");
            tokio::time::timeout(timeout, self.execute(&unlisten))
                .await
                .map_err(|_| timed_out("UNLISTEN"))??
                .map_err(broken)?;
        }
        Ok(arrived)
    }

    /// Makes this listener subscribe nothing from now on (see the `deaf`
    /// field), and end itself after `recheck_after` ([`next`](Self::next)
    /// returns `None`), so that the subscriber makes another, probed
    /// afresh: a probe can miss on a connection that does hear (its
    /// notification later than the probe's timeout, after a slow connect),
    /// and a pooler can be taken out of the way; either would otherwise
    /// last as long as this connection.
    pub(crate) fn go_deaf(&mut self, recheck_after: Duration) {
        self.deaf = true;
        self.recheck_at = Some(tokio::time::Instant::now() + recheck_after);
    }

    /// Listens on `channel` (a logical name); every notification on it after
    /// this returns reaches [`next`](Self::next). A deaf listener accepts the
    /// subscription and never hears it.
    pub(crate) async fn subscribe(&mut self, channel: &str) -> Result<(), BackendError> {
        if self.deaf {
            return Ok(());
        }
        let ident = channel_ident(&self.schema, channel);
        let names = self.names.entry(ident.clone()).or_default();
        if names.iter().any(|n| n == channel) {
            return Ok(());
        }
        if names.is_empty() {
            // The identifier is `distlock_` and hex digits: nothing to quote.
            let listen = format!("LISTEN {ident}");
            if let Err(e) = self.execute(&listen).await.and_then(|r| r.map_err(broken)) {
                self.names.remove(&ident);
                return Err(e);
            }
        }
        self.names
            .entry(ident)
            .or_default()
            .push(channel.to_owned());
        Ok(())
    }

    /// Stops hearing `channel`.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> Result<(), BackendError> {
        let ident = channel_ident(&self.schema, channel);
        let Some(names) = self.names.get_mut(&ident) else {
            return Ok(());
        };
        names.retain(|n| n != channel);
        if names.is_empty() {
            self.names.remove(&ident);
            let unlisten = format!("UNLISTEN {ident}");
            self.execute(&unlisten).await?.map_err(broken)?;
        }
        Ok(())
    }

    /// The next message; `None` once the connection has closed. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Option<Message> {
        loop {
            if let Some(message) = self.pending.pop_front() {
                return Some(message);
            }
            let Some(n) = self.read.pop_front() else {
                if self.closed {
                    return None;
                }
                match self.recheck_at {
                    Some(at) => {
                        tokio::select! {
                            () = read_one(&mut self.messages, &mut self.read, &mut self.closed) => {}
                            () = tokio::time::sleep_until(at) => {
                                tracing::debug!(target: "distlock::postgres",
                                    "a deaf listening connection ends, to be probed again");
                                self.closed = true;
                            }
                        }
                    }
                    None => read_one(&mut self.messages, &mut self.read, &mut self.closed).await,
                }
                continue;
            };
            if let Some(names) = self.names.get(n.channel()) {
                for name in names {
                    self.pending.push_back(Message {
                        channel: name.clone(),
                        pattern: None,
                        payload: n.payload().as_bytes().to_vec(),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_command_in_flight_when_the_connection_closes_ends_at_once() {
        // The connection's messages end (as when the server closes it) while
        // the command's reply, which only they could carry, never comes.
        let mut messages: Messages = Box::pin(futures_util::stream::empty());
        let mut read = VecDeque::new();
        let mut closed = false;
        let ended = tokio::time::timeout(
            Duration::from_secs(5),
            driven(
                &mut messages,
                &mut read,
                &mut closed,
                std::future::pending::<()>(),
            ),
        )
        .await
        .expect("a command on a closed connection waited for ever");
        assert!(ended.is_none());
        assert!(closed);
        // A command whose reply came before the end still answers.
        let answered = driven(&mut messages, &mut read, &mut closed, async { 7 }).await;
        assert_eq!(answered, Some(7));
    }
}
