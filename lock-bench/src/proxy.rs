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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::error::Result;

pub struct CountingProxy {
    addr: SocketAddr,
    counters: Arc<Counters>,
    accept: JoinHandle<()>,
}

#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
}

impl CountingProxy {
    pub async fn start(upstream: SocketAddr) -> Result<CountingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    // A connection that fails ends on its own; the client sees the error.
                    let _ = relay(client, upstream, c).await;
                });
            }
        });
        Ok(CountingProxy {
            addr,
            counters,
            accept,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn round_trips(&self) -> u64 {
        self.counters.round_trips.load(Ordering::Relaxed)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, counters: Arc<Counters>) -> Result<()> {
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    // Commands sent and not answered yet (pub/sub pushes can make replies
    // outnumber commands; the count never goes below zero).
    let outstanding = Arc::new(AtomicI64::new(0));

    let out = outstanding.clone();
    let up = tokio::spawn(async move {
        let mut parser = RespCounter::default();
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = match client_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let starts_fresh = parser.at_boundary() && out.load(Ordering::Acquire) == 0;
            let done = parser.feed(&buf[..n]);
            if starts_fresh {
                counters.round_trips.fetch_add(1, Ordering::Relaxed);
            }
            // Counted before forwarding, so a reply can never be seen first.
            out.fetch_add(i64::try_from(done).unwrap_or(i64::MAX), Ordering::AcqRel);
            if server_w.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut parser = RespCounter::default();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match server_r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let replies = i64::try_from(parser.feed(&buf[..n])).unwrap_or(i64::MAX);
        if replies > 0 {
            // Saturating at zero: pushes are replies nobody asked for.
            let _ = outstanding.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                Some((o - replies).max(0))
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
