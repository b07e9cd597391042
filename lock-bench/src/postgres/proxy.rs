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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::Result;
use crate::proxy::{Answers, Protocol, Requests, RoundTripProxy};

/// `SSLRequest` and `GSSENCRequest` codes: untyped requests the server answers with
/// one unframed byte.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

pub struct PgCountingProxy(RoundTripProxy);

impl PgCountingProxy {
    pub async fn start(upstream: SocketAddr) -> Result<PgCountingProxy> {
        Ok(PgCountingProxy(RoundTripProxy::start(upstream, Pg).await?))
    }

    /// `url` (the private server's) with the proxy's port instead of the server's.
    pub fn url(&self, url: &str, server_port: u16) -> String {
        url.replacen(
            &format!("127.0.0.1:{server_port}"),
            &format!("127.0.0.1:{}", self.0.addr().port()),
            1,
        )
    }

    pub fn round_trips(&self) -> u64 {
        self.0.round_trips()
    }
}

/// The PostgreSQL protocol: every client message the server answers with a
/// `ReadyForQuery` is a request, every `Z` an answer. The two directions
/// share what encryption negotiation decided.
struct Pg;

#[derive(Default)]
struct Negotiation {
    /// The client asked for TLS or GSS encryption: the server's next byte is
    /// its unframed answer.
    negotiating: AtomicBool,
    /// Encrypted from here on: nothing more can be parsed or counted.
    opaque: AtomicBool,
}

struct PgRequests {
    framer: Framer,
    messages: Vec<Message>,
    negotiation: Arc<Negotiation>,
}

struct PgAnswers {
    framer: Framer,
    messages: Vec<Message>,
    negotiation: Arc<Negotiation>,
}

impl Protocol for Pg {
    type Requests = PgRequests;
    type Answers = PgAnswers;

    fn readers(&self) -> (PgRequests, PgAnswers) {
        let negotiation = Arc::new(Negotiation::default());
        (
            PgRequests {
                framer: Framer::default(),
                messages: Vec::new(),
                negotiation: negotiation.clone(),
            },
            PgAnswers {
                framer: Framer {
                    typed: true,
                    ..Framer::default()
                },
                messages: Vec::new(),
                negotiation,
            },
        )
    }
}

impl Requests for PgRequests {
    fn at_boundary(&self) -> bool {
        // The startup message is answered but starts no round trip of the
        // client's work.
        self.framer.at_boundary()
            && self.framer.typed
            && !self.negotiation.opaque.load(Ordering::Acquire)
    }

    fn requests(&mut self, bytes: &[u8]) -> i64 {
        if self.negotiation.opaque.load(Ordering::Acquire) {
            return 0;
        }
        self.messages.clear();
        self.framer.feed(bytes, &mut self.messages);
        let mut requests = 0;
        for m in &self.messages {
            match m {
                Message::Untyped(SSL_REQUEST | GSSENC_REQUEST) => {
                    self.negotiation.negotiating.store(true, Ordering::Release);
                }
                // The startup message: answered, after authentication, by the
                // first ReadyForQuery.
                Message::Untyped(_) => requests += 1,
                Message::Typed(b'S' | b'Q') => requests += 1,
                Message::Typed(_) => {}
            }
        }
        requests
    }
}

impl Answers for PgAnswers {
    fn answers(&mut self, mut bytes: &[u8]) -> i64 {
        if self.negotiation.negotiating.swap(false, Ordering::AcqRel) && !bytes.is_empty() {
            if bytes[0] != b'N' {
                self.negotiation.opaque.store(true, Ordering::Release);
            }
            bytes = &bytes[1..];
        }
        if self.negotiation.opaque.load(Ordering::Acquire) {
            return 0;
        }
        self.messages.clear();
        self.framer.feed(bytes, &mut self.messages);
        self.messages
            .iter()
            .filter(|m| matches!(m, Message::Typed(b'Z')))
            .count() as i64
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
