//! [`FaultProxy`]: a TCP proxy that passes, delays, black-holes or resets traffic, or drops
//! single replies.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// What a [`FaultProxy`] does with the traffic it forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultMode {
    /// Forward bytes both ways unchanged.
    Pass,
    /// Hold each chunk of bytes this long before forwarding it (in both directions).
    Delay(Duration),
    /// Hold each chunk from the server (the replies) this long before forwarding it; requests
    /// pass at once. A request's effect is on the server before its reply reaches the client,
    /// a whole delay later, and a large request (a script's source, a pipeline) costs no more
    /// than a small one, as its chunks are not each held.
    DelayReplies(Duration),
    /// Keep connections open and accept new ones, but silently discard all bytes in both
    /// directions, like a network partition: clients see neither a reply nor a reset. Bytes
    /// discarded stay lost when the mode changes back.
    BlackHole,
    /// Reset (TCP RST) all open connections at once, and new ones as soon as they are accepted.
    Reset,
}

/// A TCP proxy for fault injection between clients and a Redis server.
///
/// Clients connect to [`url`](Self::url); each connection is forwarded to the upstream
/// address according to the current [`FaultMode`]. Dropping the proxy closes its listener and
/// all connections.
pub struct FaultProxy {
    local_addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<FaultMode>,
    replies: Arc<ReplyFaults>,
    /// Owns the connection tasks (in a `JoinSet`), so aborting it ends them too.
    accept_task: JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("local_addr", &self.local_addr)
            .field("upstream", &self.upstream)
            .field("mode", &self.mode())
            .field("drop_replies", &self.replies.drop.load(Ordering::Relaxed))
            .field("reset_replies", &self.replies.reset.load(Ordering::Relaxed))
            .finish()
    }
}

impl FaultProxy {
    /// Listens on a free port of `127.0.0.1` and forwards each accepted connection to
    /// `upstream`, starting in [`FaultMode::Pass`].
    ///
    /// Must be called inside a tokio runtime (with I/O and timers enabled); the proxy's tasks
    /// run on it.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        // Report a missing runtime as an error rather than letting tokio::spawn panic.
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let local_addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(FaultMode::Pass);
        let replies = Arc::new(ReplyFaults::default());
        let accept_task = runtime.spawn(accept_loop(
            listener,
            upstream,
            mode_rx,
            Arc::clone(&replies),
        ));
        Ok(FaultProxy {
            local_addr,
            upstream,
            mode,
            replies,
            accept_task,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The connection URL of the proxy, `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.local_addr.port())
    }

    /// Switches the mode; it applies at once to open and new connections.
    pub fn set_mode(&self, mode: FaultMode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> FaultMode {
        *self.mode.borrow()
    }

    /// Discards the next `n` chunks read from the server (on any connection) instead of
    /// forwarding them, while requests still pass: the server executes commands whose replies
    /// the client never sees. Replaces any count still pending; `0` cancels it.
    ///
    /// A chunk is what one read returns, normally the replies to one request or pipeline.
    /// Chunks discarded by [`FaultMode::BlackHole`] do not count.
    pub fn drop_next_replies(&self, n: usize) {
        self.replies.drop.store(n, Ordering::SeqCst);
    }

    /// Resets the connection of each of the next `n` chunks read from the server (on any
    /// connection) instead of forwarding the chunk: the server executed the request, and
    /// the client sees its connection reset without the reply, the one loss a client may
    /// answer by sending the request again on a new connection. Other connections and new
    /// ones pass. Replaces any count still pending; `0` cancels it.
    pub fn reset_next_replies(&self, n: usize) {
        self.replies.reset.store(n, Ordering::SeqCst);
    }

    /// How many of the replies [`reset_next_replies`](Self::reset_next_replies) asked
    /// for are still to come: `0` once each has been dropped with its connection.
    pub fn replies_to_reset(&self) -> usize {
        self.replies.reset.load(Ordering::SeqCst)
    }

    /// Strands the connections open now: from now on each discards every byte
    /// both ways, and neither end is told (no reset, no close), as when the
    /// host behind them died and another took over its address. Connections
    /// accepted later pass according to the mode. Unlike
    /// [`FaultMode::BlackHole`], this cannot be undone.
    pub fn strand_open_connections(&self) {
        let accepted = self.replies.accepted.load(Ordering::SeqCst);
        self.replies
            .stranded_below
            .fetch_max(accepted, Ordering::SeqCst);
    }
}

/// The replies still to be discarded, or discarded with their connection,
/// and the connections stranded for good.
#[derive(Default)]
struct ReplyFaults {
    drop: AtomicUsize,
    reset: AtomicUsize,
    /// Connections are numbered from 0 as they are accepted; those below this
    /// number discard every byte (see [`FaultProxy::strand_open_connections`]).
    stranded_below: AtomicU64,
    accepted: AtomicU64,
}

impl ReplyFaults {
    /// Takes one from `count` if it is above zero.
    fn take(count: &AtomicUsize) -> bool {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<FaultMode>,
    replies: Arc<ReplyFaults>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    if *mode.borrow() == FaultMode::Reset {
                        reset(client);
                        continue;
                    }
                    let number = replies.accepted.fetch_add(1, Ordering::SeqCst);
                    connections.spawn(forward_connection(
                        client,
                        upstream,
                        mode.clone(),
                        Arc::clone(&replies),
                        number,
                    ));
                }
                Err(err) => {
                    tracing::debug!(error = %err, "fault proxy accept failed");
                    // Errors like EMFILE persist for a while; don't spin on them.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            // Reap finished connections so the set does not grow with every connection.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

enum Forwarded {
    Done,
    Reset,
    Failed(io::Error),
}

async fn forward_connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<FaultMode>,
    replies: Arc<ReplyFaults>,
    number: u64,
) {
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(err) => {
            tracing::debug!(%upstream, error = %err, "fault proxy could not reach upstream");
            // The client sees roughly what a direct connection to a dead server would show.
            reset(client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut client_buf = vec![0u8; 16 * 1024];
    let mut server_buf = vec![0u8; 16 * 1024];
    let mut client_eof = false;
    let mut server_eof = false;
    loop {
        if *mode.borrow_and_update() == FaultMode::Reset {
            reset(client);
            reset(server);
            return;
        }
        let (direction, read) = tokio::select! {
            read = client.read(&mut client_buf), if !client_eof => (Direction::ToServer, read),
            read = server.read(&mut server_buf), if !server_eof => (Direction::ToClient, read),
            changed = mode.changed() => {
                if changed.is_err() {
                    // The proxy is gone.
                    return;
                }
                continue;
            }
        };
        let (data, dst) = match direction {
            Direction::ToServer => (&client_buf[..], &mut server),
            Direction::ToClient => (&server_buf[..], &mut client),
        };
        let outcome = match read {
            Ok(0) => {
                // Pass the half-close on; the other direction may still carry data.
                let _ = dst.shutdown().await;
                match direction {
                    Direction::ToServer => client_eof = true,
                    Direction::ToClient => server_eof = true,
                }
                if client_eof && server_eof {
                    return;
                }
                Forwarded::Done
            }
            Ok(_) if number < replies.stranded_below.load(Ordering::SeqCst) => Forwarded::Done,
            Ok(n) => forward_chunk(&data[..n], dst, direction, &mut mode, &replies).await,
            Err(err) => Forwarded::Failed(err),
        };
        match outcome {
            Forwarded::Done => {}
            Forwarded::Reset => {
                reset(client);
                reset(server);
                return;
            }
            Forwarded::Failed(err) => {
                tracing::debug!(error = %err, "fault proxy connection failed");
                // Mirror the failure of one side to the other, as a broken path would.
                reset(client);
                reset(server);
                return;
            }
        }
    }
}

async fn forward_chunk(
    data: &[u8],
    dst: &mut TcpStream,
    direction: Direction,
    mode: &mut watch::Receiver<FaultMode>,
    replies: &ReplyFaults,
) -> Forwarded {
    let delay = match *mode.borrow() {
        FaultMode::Pass => None,
        FaultMode::Delay(delay) => Some(delay),
        FaultMode::DelayReplies(delay) => (direction == Direction::ToClient).then_some(delay),
        FaultMode::BlackHole => return Forwarded::Done,
        FaultMode::Reset => return Forwarded::Reset,
    };
    if direction == Direction::ToClient {
        if ReplyFaults::take(&replies.reset) {
            return Forwarded::Reset;
        }
        if ReplyFaults::take(&replies.drop) {
            return Forwarded::Done;
        }
    }
    if let Some(delay) = delay {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = reset_requested(mode) => return Forwarded::Reset,
        }
        // A partition that began while the chunk was held swallows it too.
        if *mode.borrow() == FaultMode::BlackHole {
            return Forwarded::Done;
        }
    }
    // A peer that stops reading must not keep a reset from taking effect.
    tokio::select! {
        written = dst.write_all(data) => match written {
            Ok(()) => Forwarded::Done,
            Err(err) => Forwarded::Failed(err),
        },
        () = reset_requested(mode) => Forwarded::Reset,
    }
}

/// Completes when the mode is (or becomes) [`FaultMode::Reset`].
async fn reset_requested(mode: &mut watch::Receiver<FaultMode>) {
    loop {
        if *mode.borrow_and_update() == FaultMode::Reset {
            return;
        }
        if mode.changed().await.is_err() {
            // The proxy is gone and is aborting this task; nothing will change any more.
            std::future::pending::<()>().await;
        }
    }
}

/// Closes `stream` with an RST instead of a FIN.
#[allow(deprecated)] // set_linger: a zero linger never blocks; set_zero_linger needs tokio 1.50.
fn reset(stream: TcpStream) {
    if let Err(err) = stream.set_linger(Some(Duration::ZERO)) {
        tracing::debug!(error = %err, "could not set SO_LINGER; closing without RST");
    }
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{patient_client, ping, TestResult};
    use crate::RedisServer;
    use std::time::Instant;
    use tokio::time::timeout;

    #[tokio::test]
    async fn proxy_passes_traffic() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        assert_eq!(proxy.mode(), FaultMode::Pass);
        assert_eq!(proxy.url(), format!("redis://{}", proxy.local_addr()));
        assert_ne!(proxy.local_addr().port(), server.port());
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn black_hole_swallows_requests_until_pass() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        proxy.set_mode(FaultMode::BlackHole);
        assert_eq!(proxy.mode(), FaultMode::BlackHole);
        assert!(timeout(Duration::from_millis(300), ping(&mut conn))
            .await
            .is_err());
        proxy.set_mode(FaultMode::Pass);
        let mut fresh = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut fresh).await?, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn stranded_connections_stay_silent_while_new_ones_pass() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        proxy.strand_open_connections();
        let mut fresh = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut fresh).await?, "PONG");
        assert!(timeout(Duration::from_millis(300), ping(&mut conn))
            .await
            .is_err());
        // The mode does not bring a stranded connection back.
        proxy.set_mode(FaultMode::Pass);
        assert!(timeout(Duration::from_millis(300), ping(&mut conn))
            .await
            .is_err());
        assert_eq!(ping(&mut fresh).await?, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn reset_breaks_open_connections_quickly() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        proxy.set_mode(FaultMode::Reset);
        let started = Instant::now();
        let result = timeout(Duration::from_secs(2), ping(&mut conn)).await?;
        assert!(result.is_err(), "PING through a reset connection answered");
        assert!(started.elapsed() < Duration::from_secs(1));
        // New connections are reset too, until the mode changes.
        assert!(patient_client(proxy.url()).await.is_err());
        proxy.set_mode(FaultMode::Pass);
        let mut fresh = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut fresh).await?, "PONG");
        Ok(())
    }

    #[tokio::test]
    async fn delay_holds_each_chunk() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        proxy.set_mode(FaultMode::Delay(Duration::from_millis(200)));
        let started = Instant::now();
        assert_eq!(ping(&mut conn).await?, "PONG");
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        Ok(())
    }

    #[tokio::test]
    async fn delay_replies_holds_the_reply_and_not_the_request() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        let mut direct = patient_client(server.url()).await?;
        proxy.set_mode(FaultMode::DelayReplies(Duration::from_secs(1)));
        let started = Instant::now();
        let set = tokio::spawn(async move {
            redis::cmd("SET")
                .arg("early")
                .arg("effect")
                .query_async::<()>(&mut conn)
                .await
        });
        // On the server well before its reply is forwarded.
        let mut seen = None;
        while started.elapsed() < Duration::from_millis(900) {
            seen = redis::cmd("GET")
                .arg("early")
                .query_async::<Option<String>>(&mut direct)
                .await?;
            if seen.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(seen.as_deref(), Some("effect"));
        assert!(!set.is_finished(), "the reply was not held");
        set.await.expect("the SET task")?;
        assert!(started.elapsed() >= Duration::from_secs(1));
        Ok(())
    }

    #[tokio::test]
    async fn dropped_reply_times_out_and_the_next_connection_works() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let mut conn = patient_client(proxy.url()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        proxy.drop_next_replies(1);
        // The request still reaches the server: the SET happens, its reply is lost.
        let mut set = redis::cmd("SET");
        set.arg("lost").arg("reply");
        let lost = timeout(Duration::from_millis(300), set.query_async::<()>(&mut conn)).await;
        assert!(lost.is_err(), "the reply was not dropped: {lost:?}");
        let mut fresh = patient_client(proxy.url()).await?;
        let value: Option<String> = redis::cmd("GET")
            .arg("lost")
            .query_async(&mut fresh)
            .await?;
        assert_eq!(value.as_deref(), Some("reply"));
        Ok(())
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_everything() -> TestResult {
        let server = RedisServer::spawn()?;
        let proxy = FaultProxy::start(server.addr()).await?;
        let url = proxy.url();
        let mut conn = patient_client(url.clone()).await?;
        assert_eq!(ping(&mut conn).await?, "PONG");
        drop(proxy);
        let result = timeout(Duration::from_secs(2), ping(&mut conn)).await?;
        assert!(result.is_err(), "PING through a dropped proxy answered");
        assert!(patient_client(url).await.is_err());
        Ok(())
    }
}
