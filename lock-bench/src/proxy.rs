//! A loopback TCP proxy that counts round trips.
//!
//! `INFO commandstats` cannot tell a round trip from a command (a pipeline of 512
//! `EVALSHA`s is one round trip, 512 calls and 512 x the script's commands), so
//! clients whose round trips we count connect through this proxy. It parses the
//! RESP streams in both directions and counts a round trip each time a client
//! sends a command while none of its earlier commands is still unanswered. For a
//! client that waits for its replies before sending more (one task, or a
//! renewal task sending pipeline after pipeline) that is exactly its round
//! trips; for many tasks sharing one multiplexed connection it would undercount
//! (their requests overlap), so the bench does not report it there.
//!
//! The relay and the counting are the same for every protocol ([`RoundTripProxy`]);
//! a protocol says only how it reads requests and answers ([`Protocol`]): RESP here,
//! PostgreSQL's in `postgres/proxy.rs`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::error::Result;

/// How a counting proxy reads one protocol: the requests each piece of the
/// client's bytes completes (each answered once), and the answers each piece
/// of the server's bytes completes. One reader per direction, made per
/// connection by [`Protocol::readers`].
pub trait Protocol: Send + Sync + 'static {
    /// Reads the client's bytes.
    type Requests: Requests;
    /// Reads the server's bytes.
    type Answers: Answers;

    /// The two readers of a new connection.
    fn readers(&self) -> (Self::Requests, Self::Answers);
}

/// The client's direction of a [`Protocol`].
pub trait Requests: Send + 'static {
    /// Nothing of a request is half read, and requests can be counted: bytes
    /// sent now while nothing is outstanding start a round trip.
    fn at_boundary(&self) -> bool;
    /// Feeds client bytes; how many requests they completed.
    fn requests(&mut self, bytes: &[u8]) -> i64;
}

/// The server's direction of a [`Protocol`].
pub trait Answers: Send + 'static {
    /// Feeds server bytes; how many answers they completed.
    fn answers(&mut self, bytes: &[u8]) -> i64;
}

/// A loopback proxy of `upstream` that counts its clients' round trips as
/// `protocol` reads them.
pub struct RoundTripProxy {
    addr: SocketAddr,
    round_trips: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl RoundTripProxy {
    pub async fn start<P: Protocol>(upstream: SocketAddr, protocol: P) -> Result<RoundTripProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let round_trips = Arc::new(AtomicU64::new(0));
        let counter = round_trips.clone();
        let protocol = Arc::new(protocol);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (counter, readers) = (counter.clone(), protocol.readers());
                tokio::spawn(async move {
                    // A connection that fails ends on its own; the client sees the error.
                    let _ = relay(client, upstream, counter, readers).await;
                });
            }
        });
        Ok(RoundTripProxy {
            addr,
            round_trips,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }
}

impl Drop for RoundTripProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The RESP proxy: a round trip of a Redis client.
pub struct CountingProxy(RoundTripProxy);

impl CountingProxy {
    pub async fn start(upstream: SocketAddr) -> Result<CountingProxy> {
        Ok(CountingProxy(RoundTripProxy::start(upstream, Resp).await?))
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.0.addr())
    }

    pub fn round_trips(&self) -> u64 {
        self.0.round_trips()
    }
}

/// RESP both ways: every top-level value the client sends is a command, and
/// every one the server sends an answer.
struct Resp;

impl Protocol for Resp {
    type Requests = RespCounter;
    type Answers = RespCounter;

    fn readers(&self) -> (RespCounter, RespCounter) {
        (RespCounter::default(), RespCounter::default())
    }
}

impl Requests for RespCounter {
    fn at_boundary(&self) -> bool {
        RespCounter::at_boundary(self)
    }

    fn requests(&mut self, bytes: &[u8]) -> i64 {
        i64::try_from(self.feed(bytes)).unwrap_or(i64::MAX)
    }
}

impl Answers for RespCounter {
    fn answers(&mut self, bytes: &[u8]) -> i64 {
        i64::try_from(self.feed(bytes)).unwrap_or(i64::MAX)
    }
}

async fn relay<Q: Requests, A: Answers>(
    client: TcpStream,
    upstream: SocketAddr,
    round_trips: Arc<AtomicU64>,
    (mut requests, mut answers): (Q, A),
) -> Result<()> {
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    // Requests sent and not answered yet (pub/sub pushes can make answers
    // outnumber requests; the count never goes below zero).
    let outstanding = Arc::new(AtomicI64::new(0));

    let out = outstanding.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = match client_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let starts_fresh = requests.at_boundary() && out.load(Ordering::Acquire) == 0;
            let done = requests.requests(&buf[..n]);
            if starts_fresh {
                round_trips.fetch_add(1, Ordering::Relaxed);
            }
            // Counted before forwarding, so an answer can never be seen first.
            out.fetch_add(done, Ordering::AcqRel);
            if server_w.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match server_r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let answered = answers.answers(&buf[..n]);
        if answered > 0 {
            let _ = outstanding.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                Some((o - answered).max(0))
            });
        }
        if client_w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
    Ok(())
}

/// Counts complete top-level RESP2/RESP3 values in a byte stream fed in pieces.
#[derive(Default)]
struct RespCounter {
    /// Elements still expected by each open aggregate, innermost last.
    stack: Vec<u64>,
    /// Bytes of a bulk string (and its CRLF) still to skip.
    bulk_left: usize,
    /// A header line read so far.
    line: Vec<u8>,
}

impl RespCounter {
    fn at_boundary(&self) -> bool {
        self.stack.is_empty() && self.bulk_left == 0 && self.line.is_empty()
    }

    /// Feeds bytes; returns how many top-level values they completed.
    fn feed(&mut self, mut data: &[u8]) -> u64 {
        let mut done = 0;
        while !data.is_empty() {
            if self.bulk_left > 0 {
                let n = self.bulk_left.min(data.len());
                self.bulk_left -= n;
                data = &data[n..];
                if self.bulk_left == 0 {
                    done += self.complete();
                }
                continue;
            }
            match data.iter().position(|&b| b == b'\n') {
                None => {
                    self.line.extend_from_slice(data);
                    data = &[];
                }
                Some(i) => {
                    self.line.extend_from_slice(&data[..=i]);
                    data = &data[i + 1..];
                    let line = std::mem::take(&mut self.line);
                    done += self.header(&line);
                }
            }
        }
        done
    }

    fn header(&mut self, line: &[u8]) -> u64 {
        let Some((&kind, rest)) = line.split_first() else {
            return 0;
        };
        let num = std::str::from_utf8(rest)
            .ok()
            .and_then(|s| s.trim_end().parse::<i64>().ok());
        match kind {
            b'$' | b'!' | b'=' => match num {
                Some(n) if n >= 0 => {
                    self.bulk_left = usize::try_from(n).unwrap_or(0) + 2;
                    0
                }
                _ => self.complete(),
            },
            b'*' | b'~' | b'>' | b'%' => match num {
                Some(n) if n > 0 => {
                    let n = u64::try_from(n).unwrap_or(0);
                    self.stack.push(if kind == b'%' { 2 * n } else { n });
                    0
                }
                _ => self.complete(),
            },
            // An attribute annotates the value that follows: not a value itself.
            b'|' => match num {
                Some(n) if n > 0 => {
                    // Its 2n elements are read and dropped as one "value" of a
                    // private aggregate; modelled by expecting 2n + 1 elements.
                    let n = u64::try_from(n).unwrap_or(0);
                    self.stack.push(2 * n + 1);
                    0
                }
                _ => 0,
            },
            _ => self.complete(),
        }
    }

    /// One value ended: close every aggregate it completes.
    fn complete(&mut self) -> u64 {
        loop {
            match self.stack.last_mut() {
                None => return 1,
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        return 0;
                    }
                    self.stack.pop();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_split_anywhere() {
        let stream =
            b"*3\r\n$7\r\nEVALSHA\r\n$-1\r\n*2\r\n:1\r\n+OK\r\n+PONG\r\n$5\r\nhel\nl\r\n*0\r\n";
        // Top-level values: the 3-array, +PONG, the bulk, the empty array.
        for split in 0..stream.len() {
            let mut p = RespCounter::default();
            let n = p.feed(&stream[..split]) + p.feed(&stream[split..]);
            assert_eq!(n, 4, "split at {split}");
            assert!(p.at_boundary());
        }
        let mut p = RespCounter::default();
        assert_eq!(stream.iter().map(|b| p.feed(&[*b])).sum::<u64>(), 4);
    }
}
