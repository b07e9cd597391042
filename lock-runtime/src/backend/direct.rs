//! The direct lane: a second connection to one server, on which the calling
//! task writes its command and reads the reply itself.
//!
//! redis-rs's multiplexed connection hands every command to a connection task
//! over a channel and the reply back over another, and parses it with a
//! general parser: on a free lock's acquire and release (two round trips of
//! a few microseconds of Redis work each) that hand-over costs the client more
//! than everything distlock does around it. The direct lane skips it for
//! whichever call finds it idle while the multiplexed connection has nothing
//! in flight (`Single::call_within` decides), most of all for the one task of
//! a service that takes locks one at a time; other calls take the
//! multiplexed connection, so that concurrent callers still share one
//! pipelined connection. Both lanes carry the same commands,
//! and a call is only sent after the reply to the call before it (of the same
//! hold) arrived, so which lane carries a call changes nothing in what Redis
//! sees.
//!
//! A call owns the lane's connection while it runs. Dropped with every reply
//! read, the connection goes back to the lane. Dropped with a reply still
//! owed because the call was cancelled after sending, a task on the
//! manager's runtime reads that reply first, and calls wait for it: none
//! overtakes the request already sent, so a cancelled acquisition's clean-up
//! reaches Redis after the acquisition, as on one connection. A connection
//! that failed, whose call timed out, or whose owed reply does not come
//! within the command timeout, is closed (a late reply reaches nobody; a
//! timed-out call's clean-up may then reach Redis first, as after a timeout
//! on the multiplexed connection, which is retired), and the next call opens
//! another in the background (after a failed opening, no sooner than
//! [`RECONNECT_AFTER`]). Plain TCP, and TLS (`rediss://`) with the `tls`
//! feature: a TLS session of the lane's own, its server's certificate
//! verified as redis verifies the multiplexed connection's (the builder's CA
//! or the system's roots, the host's name); an `#insecure` URL or a Unix
//! socket has no direct lane (every call takes the multiplexed connection).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, ProtocolVersion, RedisError,
    RedisFuture, RedisResult, Value,
};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::{Mutex, OwnedMutexGuard};

/// How a lane to a `rediss://` server opens its TLS session: the client
/// configuration (see `backend::rustls_config`); `None`, or without the
/// `tls` feature: no lane to a TLS server.
#[cfg(feature = "tls")]
pub(crate) type LaneTls = Option<Arc<rustls::ClientConfig>>;
/// See the `tls` feature's definition.
#[cfg(not(feature = "tls"))]
pub(crate) type LaneTls = Option<Arc<std::convert::Infallible>>;

/// How long after a failed opening the lane tries again.
pub(crate) const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// An idle connection older than this is read from before a call uses it
/// (one system call, so a busy lane skips it): unasked-for bytes, or a close
/// the runtime has not seen yet, would otherwise fail the call. Closes the
/// runtime has seen are checked on every call (see
/// `DirectConnection::usable`).
const CHECK_IDLE_AFTER: Duration = Duration::from_secs(5);

/// Nesting a reply may have (arrays in arrays); distlock's deepest is 2.
const MAX_DEPTH: usize = 8;

/// The direct lane of one server.
///
/// Its slot is locked by whoever uses the connection: a call, the task that
/// opens it, or the task that reads the replies a cancelled call left
/// unread. A call that finds it locked by another call takes the multiplexed
/// connection; one that finds it draining waits for the drain, so that it
/// never overtakes a request already sent (a cancelled acquisition's
/// clean-up must reach Redis after the acquisition).
pub(crate) struct DirectLane {
    slot: Arc<Mutex<Slot>>,
    /// Set while a task reads the replies a cancelled call left unread.
    draining: AtomicBool,
    /// Where and how to connect; `None`: this server has no direct lane.
    info: Option<ConnectionInfo>,
    /// The TLS session's configuration, for a `rediss://` server.
    tls: LaneTls,
    /// The runtime the manager was built on: the connection is opened there
    /// (its socket belongs to that runtime's I/O driver, which lives as long
    /// as the manager, whichever runtime a call comes from), and so are the
    /// tasks that open and drain it.
    runtime: Option<Handle>,
    connect_timeout: Duration,
}

#[derive(Default)]
struct Slot {
    /// The idle connection.
    idle: Option<DirectConnection>,
    /// When opening it last failed.
    failed_at: Option<Instant>,
}

impl DirectLane {
    /// A lane for the server of `info`, opened by its first call. Without a
    /// lane (every call takes the multiplexed connection): a server reached
    /// by a Unix socket, by TLS without `tls` (a configuration) or with
    /// `#insecure`, or a manager built outside a tokio runtime.
    ///
    /// `runtime`: the manager's (see [`DirectLane::runtime`]).
    pub(crate) fn new(
        info: &ConnectionInfo,
        tls: LaneTls,
        connect_timeout: Duration,
        runtime: Option<Handle>,
    ) -> Arc<DirectLane> {
        let reachable = match info.addr() {
            ConnectionAddr::Tcp(..) => true,
            ConnectionAddr::TcpTls {
                insecure: false, ..
            } => tls.is_some(),
            _ => false,
        };
        Arc::new(DirectLane {
            slot: Arc::default(),
            draining: AtomicBool::new(false),
            info: reachable.then(|| info.clone()),
            tls,
            runtime,
            connect_timeout,
        })
    }

    /// Whether a task is reading the replies a cancelled call left unread:
    /// a call then waits for the lane whatever else it would have taken.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The idle connection, for one call; `None` when another call holds it
    /// or there is none (then it is opened in the background, unless an
    /// opening failed less than [`RECONNECT_AFTER`] ago). Waits while the
    /// replies of a cancelled call are read.
    ///
    /// `timeout`: the call's own; it waits for a drain at most half of it
    /// (then takes the multiplexed connection: a reply that slow means a
    /// server in trouble, and the call must still have time to run), and a
    /// drain of its own replies gets all of it. `gave_up`: set by the
    /// caller's timeout before it drops the call.
    pub(crate) async fn take<'a>(
        self: &'a Arc<Self>,
        timeout: Duration,
        gave_up: &'a AtomicBool,
    ) -> Option<DirectCall<'a>> {
        let (Some(info), Some(runtime)) = (&self.info, &self.runtime) else {
            return None;
        };
        let mut slot = match self.slot.clone().try_lock_owned() {
            Ok(slot) => slot,
            Err(_) if self.is_draining() => {
                let waiting = self.slot.clone().lock_owned();
                tokio::time::timeout(timeout / 2, waiting).await.ok()?
            }
            Err(_) => return None,
        };
        if let Some(conn) = slot.idle.take().and_then(DirectConnection::if_usable) {
            return Some(DirectCall {
                conn: Some(conn),
                slot: Some(slot),
                lane: self,
                timeout,
                gave_up,
            });
        }
        if slot
            .failed_at
            .is_none_or(|at| at.elapsed() >= RECONNECT_AFTER)
        {
            let (info, tls, connect_timeout) =
                (info.clone(), self.tls.clone(), self.connect_timeout);
            // The slot stays locked while the connection opens: calls take
            // the multiplexed connection meanwhile.
            drop(runtime.spawn(async move {
                let connecting = DirectConnection::connect(&info, &tls);
                match tokio::time::timeout(connect_timeout, connecting).await {
                    Ok(Ok(conn)) => slot.idle = Some(conn),
                    Ok(Err(e)) => {
                        tracing::debug!(target: "distlock::connection", error = %e,
                            "the direct connection could not be opened");
                        slot.failed_at = Some(Instant::now());
                    }
                    Err(_) => slot.failed_at = Some(Instant::now()),
                }
            }));
        }
        None
    }
}

/// A call's hold on the direct lane's connection. Dropped, it gives the
/// connection back if every reply was read; if a reply is still owed because
/// the call was cancelled after sending, a task reads it first (the lane is
/// draining meanwhile); a connection that failed, or whose call timed out,
/// is closed.
pub(crate) struct DirectCall<'a> {
    conn: Option<DirectConnection>,
    slot: Option<OwnedMutexGuard<Slot>>,
    lane: &'a Arc<DirectLane>,
    /// The call's timeout: how long a drain of its replies may take.
    timeout: Duration,
    gave_up: &'a AtomicBool,
}

impl DirectCall<'_> {
    /// Closes the connection when the call is done: its replies were not
    /// what the caller expected, so they may not be its own.
    pub(crate) fn out_of_step(&mut self) {
        if let Some(conn) = &mut self.conn {
            conn.broken = true;
        }
    }
}

impl ConnectionLike for DirectCall<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.conn {
            Some(conn) => conn.req_packed_command(cmd),
            None => Box::pin(async { Err(closed()) }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.conn {
            Some(conn) => conn.req_packed_commands(pipeline, offset, count),
            None => Box::pin(async { Err(closed()) }),
        }
    }

    fn get_db(&self) -> i64 {
        self.conn.as_ref().map_or(0, |conn| conn.db)
    }
}

/// The TLS session of a lane to `host` over `tcp`.
#[cfg(feature = "tls")]
async fn open_tls(host: &str, tcp: TcpStream, tls: &LaneTls) -> RedisResult<LaneStream> {
    let Some(config) = tls else {
        return Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "no TLS configuration for the direct lane",
        )));
    };
    // An IP address parses too, and is then matched against the
    // certificate's IP address names, as redis does.
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
        RedisError::from((
            ErrorKind::InvalidClientConfig,
            "the direct lane's TLS server name",
            e.to_string(),
        ))
    })?;
    let session = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await?;
    Ok(LaneStream::Tls(Box::new(session)))
}

/// Without the `tls` feature, no lane opens to a TLS server.
#[cfg(not(feature = "tls"))]
async fn open_tls(_: &str, _: TcpStream, _: &LaneTls) -> RedisResult<LaneStream> {
    Err(RedisError::from((
        ErrorKind::InvalidClientConfig,
        "the direct lane needs the `tls` feature for TLS",
    )))
}

fn closed() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::NotConnected))
}

impl Drop for DirectCall<'_> {
    fn drop(&mut self) {
        let (Some(conn), Some(mut slot)) = (self.conn.take(), self.slot.take()) else {
            return;
        };
        let timed_out = conn.owed > 0 && self.gave_up.load(Ordering::Relaxed);
        // A byte read past the last reply is one nobody asked for.
        let unasked = conn.owed == 0 && !conn.input.is_empty();
        if conn.broken || timed_out || unasked {
            return; // closed; the next call opens another
        }
        if conn.owed == 0 {
            slot.idle = Some(DirectConnection {
                idle_since: Instant::now(),
                ..conn
            });
            return;
        }
        let Some(runtime) = &self.lane.runtime else {
            return;
        };
        self.lane.draining.store(true, Ordering::Release);
        // Made before the task: a task the runtime refuses (it is shutting
        // down) is dropped unrun, and this still ends the drain; the
        // connection is closed with it.
        let draining = Draining(self.lane.clone());
        let timeout = self.timeout;
        drop(runtime.spawn(async move {
            let _draining = draining;
            let mut conn = conn;
            let drained = tokio::time::timeout(timeout, conn.read_owed()).await;
            if matches!(drained, Ok(Ok(()))) && conn.input.is_empty() {
                conn.idle_since = Instant::now();
                slot.idle = Some(conn);
            }
        }));
    }
}

/// Ends a drain however its task ends.
struct Draining(Arc<DirectLane>);

impl Drop for Draining {
    fn drop(&mut self) {
        self.0.draining.store(false, Ordering::Release);
    }
}

/// The lane's socket: plain TCP, or a TLS session over it.
enum LaneStream {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl LaneStream {
    /// The TCP socket, for its readiness.
    fn tcp(&self) -> &TcpStream {
        match self {
            LaneStream::Plain(tcp) => tcp,
            #[cfg(feature = "tls")]
            LaneStream::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl AsyncRead for LaneStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            LaneStream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            LaneStream::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LaneStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            LaneStream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            LaneStream::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            LaneStream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            #[cfg(feature = "tls")]
            LaneStream::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            LaneStream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            LaneStream::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }
}

/// One connection of the direct lane: the calling task writes the command
/// and reads the reply.
pub(crate) struct DirectConnection {
    stream: LaneStream,
    /// The command being sent.
    out: Vec<u8>,
    /// Bytes read and not yet parsed.
    input: Vec<u8>,
    db: i64,
    /// Replies owed for commands sent.
    owed: usize,
    /// Out of step (a command half sent, a read failed, a reply of an
    /// unknown shape): closed when its call ends.
    broken: bool,
    /// When it last went back to the lane.
    idle_since: Instant,
}

impl DirectConnection {
    /// Connects (with `tls` for a `rediss://` server), authenticates and
    /// selects the database as redis-rs would (`HELLO 3` first when the URL
    /// asks for RESP3).
    async fn connect(info: &ConnectionInfo, tls: &LaneTls) -> RedisResult<DirectConnection> {
        let (host, port, secure) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host, *port, false),
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                ..
            } => (host, *port, true),
            _ => {
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "the direct lane speaks TCP and verified TLS only",
                )))
            }
        };
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        tcp.set_nodelay(true)?;
        let stream = if secure {
            open_tls(host, tcp, tls).await?
        } else {
            LaneStream::Plain(tcp)
        };
        let settings = info.redis_settings();
        let mut conn = DirectConnection {
            stream,
            out: Vec::with_capacity(256),
            input: Vec::with_capacity(1024),
            db: settings.db(),
            owed: 0,
            broken: false,
            idle_since: Instant::now(),
        };
        let password = settings.password();
        if settings.protocol() == ProtocolVersion::RESP3 {
            let mut hello = redis::cmd("HELLO");
            hello.arg(3);
            if let Some(password) = password {
                hello
                    .arg("AUTH")
                    .arg(settings.username().unwrap_or("default"))
                    .arg(password);
            }
            hello.query_async::<Value>(&mut conn).await?;
        } else if let Some(password) = password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password).query_async::<()>(&mut conn).await?;
        }
        if settings.db() != 0 {
            redis::cmd("SELECT")
                .arg(settings.db())
                .query_async::<()>(&mut conn)
                .await?;
        }
        Ok(conn)
    }

    /// The connection, if [usable](Self::usable).
    fn if_usable(mut self) -> Option<DirectConnection> {
        self.usable().then_some(self)
    }

    /// Whether an idle connection may carry a call: not closed by the server,
    /// nothing unasked-for on it.
    ///
    /// A close the runtime has seen (the peer's FIN or reset, which its I/O
    /// driver records and never clears) is checked on every call, without a
    /// system call: after a server restart, the first call to find the
    /// connection would otherwise fail, and a release that fails leaves the
    /// lock to its lease. A read that finds nothing (one system call) also
    /// catches unasked-for bytes; a busy lane skips it, an idle one older
    /// than [`CHECK_IDLE_AFTER`] makes it. Over TLS that read goes through
    /// the session (a raw read would take its records), which reads the
    /// socket only once the runtime saw it readable, and takes in what is
    /// not application data (session tickets) without a reply.
    fn usable(&mut self) -> bool {
        use futures_util::FutureExt;
        // Ready at once only with readiness already recorded; pending (no
        // event since the last read found nothing) means nothing came.
        if let Some(ready) = self.stream.tcp().ready(Interest::READABLE).now_or_never() {
            match ready {
                Ok(ready) if !ready.is_read_closed() && !ready.is_error() => {}
                _ => return false,
            }
        }
        if self.idle_since.elapsed() < CHECK_IDLE_AFTER {
            return true;
        }
        let mut probe = [0u8; 1];
        match &mut self.stream {
            LaneStream::Plain(tcp) => {
                matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
            #[cfg(feature = "tls")]
            tls @ LaneStream::Tls(_) => tls.read(&mut probe).now_or_never().is_none(),
        }
    }

    /// Sends `self.out`, which asks for `replies` replies.
    async fn send(&mut self, replies: usize) -> RedisResult<()> {
        // Broken until the whole command is written: a command cut short
        // would make the server wait for its end.
        self.broken = true;
        self.stream.write_all(&self.out).await?;
        // Writes out what a TLS session still buffers; nothing on TCP.
        self.stream.flush().await?;
        self.broken = false;
        self.owed += replies;
        Ok(())
    }

    /// Reads the replies owed, discarding them.
    async fn read_owed(&mut self) -> RedisResult<()> {
        while self.owed > 0 {
            self.read_reply().await?;
        }
        Ok(())
    }

    /// The next whole reply, read from the socket as needed. Cancelled, it
    /// leaves what it read in `input` (reading is cancel-safe), for the drain.
    async fn read_reply(&mut self) -> RedisResult<Value> {
        let reply = self.read_next().await;
        if reply.is_err() {
            self.broken = true;
        }
        reply
    }

    async fn read_next(&mut self) -> RedisResult<Value> {
        loop {
            if let Some(end) = reply_end(&self.input, 0, 0)? {
                let reply = &self.input[..end];
                let value = match simple_reply(reply) {
                    Some(value) => value,
                    None => redis::parse_redis_value(reply)?,
                };
                if end == self.input.len() {
                    self.input.clear();
                } else {
                    self.input.drain(..end);
                }
                self.owed = self.owed.saturating_sub(1);
                return Ok(value);
            }
            self.input.reserve(1024);
            if self.stream.read_buf(&mut self.input).await? == 0 {
                return Err(RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::UnexpectedEof,
                )));
            }
        }
    }
}

impl ConnectionLike for DirectConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.out.clear();
            cmd.write_packed_command(&mut self.out);
            self.send(1).await?;
            self.read_reply().await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.out = pipeline.get_packed_pipeline();
            self.send(offset + count).await?;
            // Every reply is read before any error is returned, so that the
            // connection stays in step.
            let mut skipped_error = None;
            let mut values = Vec::with_capacity(count);
            for i in 0..offset + count {
                let value = self.read_reply().await?;
                if i < offset {
                    if let Err(e) = value.extract_error() {
                        skipped_error.get_or_insert(e);
                    }
                } else {
                    values.push(value);
                }
            }
            match skipped_error {
                Some(e) => Err(e),
                None => Ok(values),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

/// Where the reply starting at `start` ends, if `buf` holds all of it.
fn reply_end(buf: &[u8], start: usize, depth: usize) -> RedisResult<Option<usize>> {
    let Some(&kind) = buf.get(start) else {
        return Ok(None);
    };
    let Some(line_end) = buf
        .get(start + 1..)
        .and_then(|rest| rest.windows(2).position(|w| w == b"\r\n"))
        .map(|at| start + 1 + at)
    else {
        return Ok(None);
    };
    let after_line = line_end + 2;
    let length = || -> RedisResult<i64> {
        std::str::from_utf8(&buf[start + 1..line_end])
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| protocol_error("a length that is not a number"))
    };
    let elements = |n: i64, per: u64| -> RedisResult<Option<usize>> {
        if depth >= MAX_DEPTH {
            return Err(protocol_error("a reply nested too deep"));
        }
        let mut at = after_line;
        for _ in 0..u64::try_from(n).unwrap_or(0).saturating_mul(per) {
            match reply_end(buf, at, depth + 1)? {
                Some(end) => at = end,
                None => return Ok(None),
            }
        }
        Ok(Some(at))
    };
    match kind {
        // Simple string, error, integer; RESP3 null, boolean, double, big number.
        b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => Ok(Some(after_line)),
        // Bulk string; RESP3 bulk error and verbatim string.
        b'$' | b'!' | b'=' => {
            let Ok(len) = usize::try_from(length()?) else {
                return Ok(Some(after_line)); // $-1: nil
            };
            let end = after_line
                .checked_add(len)
                .and_then(|end| end.checked_add(2))
                .ok_or_else(|| protocol_error("a bulk string too long"))?;
            Ok((buf.len() >= end).then_some(end))
        }
        // Array; RESP3 set and push.
        b'*' | b'~' | b'>' => elements(length()?, 1),
        // RESP3 map: key and value per entry.
        b'%' => elements(length()?, 2),
        _ => Err(protocol_error("a reply of an unknown type")),
    }
}

/// A whole reply of the kinds a free lock's calls get (status, integer, bulk
/// string), read as redis-rs's parser reads them; `None` for any other
/// (errors, arrays, RESP3), left to that parser.
fn simple_reply(reply: &[u8]) -> Option<Value> {
    let header_end = reply.windows(2).position(|w| w == b"\r\n")?;
    let header = std::str::from_utf8(reply.get(1..header_end)?).ok()?;
    match reply.first()? {
        b'+' if header == "OK" => Some(Value::Okay),
        b'+' => Some(Value::SimpleString(header.to_owned())),
        b':' => Some(Value::Int(header.trim().parse().ok()?)),
        b'$' => {
            let len: i64 = header.parse().ok()?;
            if len < 0 {
                return Some(Value::Nil);
            }
            let body = reply.get(header_end + 2..reply.len().checked_sub(2)?)?;
            Some(Value::BulkString(body.to_vec()))
        }
        _ => None,
    }
}

fn protocol_error(what: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "the direct connection read",
        what.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(buf: &[u8]) -> Option<usize> {
        reply_end(buf, 0, 0).unwrap()
    }

    #[test]
    fn a_reply_is_whole_only_when_every_byte_of_it_arrived() {
        for whole in [
            &b"+OK\r\n"[..],
            b"-NOSCRIPT No matching script\r\n",
            b":1\r\n",
            b"$-1\r\n",
            b"$5\r\nab\r\nc\r\n",
            b"*2\r\n:0\r\n$3\r\nabc\r\n",
            b"*2\r\n*1\r\n:1\r\n$-1\r\n",
            b"_\r\n",
            b"%1\r\n+a\r\n:1\r\n",
            b"*0\r\n",
            b"*-1\r\n",
        ] {
            assert_eq!(
                end(whole),
                Some(whole.len()),
                "{:?}",
                String::from_utf8_lossy(whole)
            );
            for cut in 0..whole.len() {
                assert_eq!(
                    end(&whole[..cut]),
                    None,
                    "{:?} cut at {cut}",
                    String::from_utf8_lossy(whole)
                );
            }
            let mut two = whole.to_vec();
            two.extend_from_slice(b":7\r\n");
            assert_eq!(end(&two), Some(whole.len()));
        }
    }

    #[test]
    fn simple_replies_read_as_redis_rs_reads_them() {
        for reply in [
            &b"+OK\r\n"[..],
            b"+QUEUED\r\n",
            b":-12\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$7\r\nab\r\ncd-\r\n",
        ] {
            assert_eq!(
                simple_reply(reply),
                Some(redis::parse_redis_value(reply).unwrap()),
                "{:?}",
                String::from_utf8_lossy(reply)
            );
        }
        for other in [&b"-ERR no\r\n"[..], b"*1\r\n:1\r\n", b"_\r\n"] {
            assert_eq!(simple_reply(other), None);
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(reply_end(b"?\r\n", 0, 0).is_err());
        assert!(reply_end(b"$x\r\n", 0, 0).is_err());
        assert!(reply_end(b"$99999999999999999999999\r\n", 0, 0).is_err());
        assert!(reply_end(&b"*1\r\n".repeat(20), 0, 0).is_err());
        assert!(reply_end(b"$18446744073709551615\r\n", 0, 0).is_err());
    }
}
