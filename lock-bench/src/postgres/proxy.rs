//! A loopback TCP proxy that counts PostgreSQL round trips, as `src/proxy.rs` does
//! for RESP.
//!
//! Statements are not round trips: a client may pipeline several (Parse, Bind,
//! Execute ... then one Sync), so the proxy parses the protocol both ways. Every
//! client message that the server answers with a `ReadyForQuery` (`Sync`, a simple
//! `Query`, the startup message) is one request outstanding until that `Z` comes
//! back; a round trip is counted each time the client sends while nothing is
//! outstanding. For one client that waits for its replies (one task, or a renewal
//! task sending batch after batch) that is exactly its round trips; for tasks
//! sharing one pipelined connection it undercounts, so the bench does not use it
//! there. Plain connections only: after an accepted `SSLRequest` the stream is TLS
//! and counting stops (the bench's connections decline TLS).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::error::Result;

/// `SSLRequest` and `GSSENCRequest` codes: untyped requests the server answers with
/// one unframed byte.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

pub struct PgCountingProxy {
    port: u16,
    round_trips: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl PgCountingProxy {
    pub async fn start(upstream: SocketAddr) -> Result<PgCountingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let round_trips = Arc::new(AtomicU64::new(0));
        let counter = round_trips.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    // A connection that fails ends on its own; the client sees the error.
                    let _ = relay(client, upstream, counter).await;
                });
            }
        });
        Ok(PgCountingProxy {
            port,
            round_trips,
            accept,
        })
    }

    /// `url` (the private server's) with the proxy's port instead of the server's.
    pub fn url(&self, url: &str, server_port: u16) -> String {
        url.replacen(
            &format!("127.0.0.1:{server_port}"),
            &format!("127.0.0.1:{}", self.port),
            1,
        )
    }

    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }
}

impl Drop for PgCountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Splits one direction's bytes into messages: `typed` once the startup message
/// has passed (a type byte, then a length that counts itself), untyped before (a
/// length, then a code: the startup message, or a request for encryption before
/// it). Appends the type bytes (or, untyped, the codes) of the messages completed.
#[derive(Default)]
struct Framer {
    typed: bool,
    header: Vec<u8>,
    /// Bytes of the current message's body still to skip.
    remaining: usize,
}

enum Message {
    Typed(u8),
    Untyped(u32),
}

impl Framer {
    fn at_boundary(&self) -> bool {
        self.header.is_empty() && self.remaining == 0
    }

    fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<Message>) {
        while !bytes.is_empty() {
            let header_len = if self.typed { 5 } else { 8 };
            if self.remaining > 0 {
                let skip = self.remaining.min(bytes.len());
                self.remaining -= skip;
                bytes = &bytes[skip..];
                continue;
            }
            let take = (header_len - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.header.len() < header_len {
                return;
            }
            let h = &self.header;
            let (message, length) = if self.typed {
                let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
                (Message::Typed(h[0]), len.saturating_sub(4))
            } else {
                let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
                let code = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
                // Anything but a request for encryption is the startup message,
                // after which every message is typed.
                self.typed = !matches!(code, SSL_REQUEST | GSSENC_REQUEST);
                (Message::Untyped(code), len.saturating_sub(8))
            };
            self.remaining = length;
            self.header.clear();
            out.push(message);
        }
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, round_trips: Arc<AtomicU64>) -> Result<()> {
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    // Requests sent and not answered by a ReadyForQuery yet.
    let outstanding = Arc::new(AtomicI64::new(0));
    // The client asked for TLS or GSS encryption: the server's next byte is its
    // unframed answer.
    let negotiating = Arc::new(AtomicBool::new(false));
    // Encrypted from here on: nothing more can be parsed or counted.
    let opaque = Arc::new(AtomicBool::new(false));

    let (out, neg, opq) = (outstanding.clone(), negotiating.clone(), opaque.clone());
    let up = tokio::spawn(async move {
        let mut framer = Framer::default();
        let mut messages = Vec::new();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = match client_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !opq.load(Ordering::Acquire) {
                if framer.at_boundary() && framer.typed && out.load(Ordering::Acquire) == 0 {
                    round_trips.fetch_add(1, Ordering::Relaxed);
                }
                messages.clear();
                framer.feed(&buf[..n], &mut messages);
                let mut requests = 0;
                for m in &messages {
                    match m {
                        Message::Untyped(SSL_REQUEST | GSSENC_REQUEST) => {
                            neg.store(true, Ordering::Release);
                        }
                        // The startup message: answered, after authentication, by
                        // the first ReadyForQuery.
                        Message::Untyped(_) => requests += 1,
                        Message::Typed(b'S' | b'Q') => requests += 1,
                        Message::Typed(_) => {}
                    }
                }
                // Counted before forwarding, so an answer can never be seen first.
                out.fetch_add(requests, Ordering::AcqRel);
            }
            if server_w.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut framer = Framer {
        typed: true,
        ..Framer::default()
    };
    let mut messages = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match server_r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut bytes = &buf[..n];
        if negotiating.swap(false, Ordering::AcqRel) && !bytes.is_empty() {
            if bytes[0] != b'N' {
                opaque.store(true, Ordering::Release);
            }
            bytes = &bytes[1..];
        }
        if !opaque.load(Ordering::Acquire) {
            messages.clear();
            framer.feed(bytes, &mut messages);
            let ready = messages
                .iter()
                .filter(|m| matches!(m, Message::Typed(b'Z')))
                .count() as i64;
            if ready > 0 {
                let _ = outstanding.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                    Some((o - ready).max(0))
                });
            }
        }
        if client_w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages split anywhere (inside the type byte, the length, the body) are
    /// framed the same as whole ones.
    #[test]
    fn frames_messages_split_anywhere() {
        let mut stream = Vec::new();
        // An SSLRequest (declined: the server's answer is the other direction's),
        // then the startup message: length 8 + a parameter byte, protocol 3.0.
        stream.extend_from_slice(&8u32.to_be_bytes());
        stream.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        stream.extend_from_slice(&9u32.to_be_bytes());
        stream.extend_from_slice(&196_608u32.to_be_bytes());
        stream.push(0);
        // Bind with a 3-byte body, Execute with none, Sync.
        for (t, body) in [(b'B', &b"abc"[..]), (b'E', &b""[..]), (b'S', &b""[..])] {
            stream.push(t);
            stream.extend_from_slice(&(4 + body.len() as u32).to_be_bytes());
            stream.extend_from_slice(body);
        }
        for chunk in 1..stream.len() {
            let mut framer = Framer::default();
            let mut got = Vec::new();
            let mut rest = &stream[..];
            while !rest.is_empty() {
                let (now, later) = rest.split_at(chunk.min(rest.len()));
                framer.feed(now, &mut got);
                rest = later;
            }
            let types: Vec<String> = got
                .iter()
                .map(|m| match m {
                    Message::Typed(t) => (*t as char).to_string(),
                    Message::Untyped(code) => code.to_string(),
                })
                .collect();
            assert_eq!(
                types,
                [SSL_REQUEST.to_string().as_str(), "196608", "B", "E", "S"],
                "chunks of {chunk}"
            );
            assert!(framer.at_boundary());
        }
    }

    /// Against a real server: sequential queries are a round trip each; two
    /// queries sent before either is answered are one.
    #[test]
    fn counts_round_trips_not_statements() -> Result<()> {
        // One thread: the joined queries are both queued before the connection's
        // driver runs, so they are both sent before the first answer can come.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let pg = distlock_testing::PostgresServer::start()?;
            let proxy =
                PgCountingProxy::start(SocketAddr::from(([127, 0, 0, 1], pg.port()))).await?;
            let client = super::super::connect(&proxy.url(&pg.url(), pg.port()), "rt-test").await?;
            let select = client.prepare("SELECT $1::int4").await?;

            let before = proxy.round_trips();
            for i in 0..5i32 {
                client.query_one(&select, &[&i]).await?;
            }
            assert_eq!(proxy.round_trips() - before, 5);

            let before = proxy.round_trips();
            let (a, b) = tokio::join!(
                client.query_one(&select, &[&1i32]),
                client.query_one(&select, &[&2i32])
            );
            assert_eq!((a?.get::<_, i32>(0), b?.get::<_, i32>(0)), (1, 2));
            assert_eq!(proxy.round_trips() - before, 1);
            Ok(())
        })
    }
}
