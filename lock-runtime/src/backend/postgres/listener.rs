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
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, Notification};

use super::channel_ident;
use crate::backend::messages::Message;
use crate::error::{BackendError, BackendErrorKind};

/// One LISTEN connection.
pub(crate) struct Listener {
    client: Client,
    notifications: mpsc::UnboundedReceiver<Notification>,
    /// Identifier -> the logical channels subscribed under it (one, unless
    /// two names share a hash).
    names: HashMap<String, Vec<String>>,
    /// Messages of a notification heard under several logical names, not yet
    /// handed out.
    pending: VecDeque<Message>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

fn broken(e: tokio_postgres::Error) -> BackendError {
    BackendError::new(BackendErrorKind::Connection, super::pg_message(&e))
}

impl Listener {
    /// Connects with `pg` through `connector` within `timeout` and starts
    /// the task that drives the connection.
    pub(crate) async fn connect(
        connector: &super::Connector,
        pg: tokio_postgres::Config,
        timeout: Duration,
    ) -> Result<Listener, BackendError> {
        let (client, mut messages) = tokio::time::timeout(timeout, connector.connect(&pg))
            .await
            .map_err(|_| {
                BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("no listening connection within {timeout:?}"),
                )
            })?
            .map_err(broken)?;
        let (tx, notifications) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        if tx.send(n).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(target: "distlock::postgres", error = %e,
                            "listening connection closed");
                        return;
                    }
                }
            }
        });
        Ok(Listener {
            client,
            notifications,
            names: HashMap::new(),
            pending: VecDeque::new(),
            driver,
        })
    }

    /// Listens on `channel` (a logical name); every notification on it after
    /// this returns reaches [`next`](Self::next).
    pub(crate) async fn subscribe(&mut self, channel: &str) -> Result<(), BackendError> {
        let ident = channel_ident(channel);
        let names = self.names.entry(ident.clone()).or_default();
        if names.iter().any(|n| n == channel) {
            return Ok(());
        }
        if names.is_empty() {
            // The identifier is `distlock_` and hex digits: nothing to quote.
            if let Err(e) = self.client.batch_execute(&format!("LISTEN {ident}")).await {
                self.names.remove(&ident);
                return Err(broken(e));
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
        let ident = channel_ident(channel);
        let Some(names) = self.names.get_mut(&ident) else {
            return Ok(());
        };
        names.retain(|n| n != channel);
        if names.is_empty() {
            self.names.remove(&ident);
            self.client
                .batch_execute(&format!("UNLISTEN {ident}"))
                .await
                .map_err(broken)?;
        }
        Ok(())
    }

    /// The next message; `None` once the connection has closed. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Option<Message> {
        loop {
            if let Some(message) = self.pending.pop_front() {
                return Some(message);
            }
            let n = self.notifications.recv().await?;
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
