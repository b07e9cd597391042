//! `--link-delay`: a real round trip between every client and the server.
//!
//! The link is a delay line: each chunk read from either side is written to
//! the other once the delay has passed since it was read, while the next
//! chunks are already being read (a network's latency, without its
//! bandwidth limit). `distlock-testing`'s fault proxy has a delay mode too,
//! but it holds each chunk on tokio's timer, whose millisecond ticks made a
//! 100 µs delay about 1.2 ms each way, and a connection carries one chunk at
//! a time there (neither direction reads while one is held), so pipelined
//! traffic queues behind itself. Here each direction of each connection has
//! a reader thread and a writer thread, and the writer sleeps with the
//! operating system's timer until the chunk's time. Its timer slack is 1 ns
//! (Linux's default of 50 µs let each sleep end up to 50 µs late on top of
//! the wake-up, about 90 µs past the chunk's time through a 100 µs link
//! measured on a loaded 2-core machine, a fifth of the round trip; with it,
//! about 20 µs): every chunk, a reply or a pushed message alike, leaves the
//! configured delay after it was read, plus the wake-up alone.
//!
//! The figures that matter through a link are in round trips: each
//! scenario's p50s divided by the p50 of `PING` through the same link,
//! measured right after the scenario, so that the timer's excess and the
//! machine's load divide out.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::{context, Result};
use crate::report::{new_histogram, us, Better, Check, ScenarioResult, Target};
use crate::scenarios::common::Env;

/// The link's listening end; clients connect to [`DelayLine::url`]. Its
/// threads live as long as the process (the bench ends with it).
pub struct DelayLine {
    addr: SocketAddr,
}

impl DelayLine {
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Starts the link to `upstream`, each chunk held `delay` in each direction
/// (zero: the relay alone, for its own cost).
pub async fn start(upstream: SocketAddr, delay: Duration) -> Result<DelayLine> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(context("binding the link's listener"))?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("link-accept".to_owned())
        .spawn(move || {
            for client in listener.incoming().flatten() {
                // A connection that fails ends on its own; its client sees it.
                let _ = connect(client, upstream, delay);
            }
        })?;
    Ok(DelayLine { addr })
}

fn connect(client: TcpStream, upstream: SocketAddr, delay: Duration) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    direction(client.try_clone()?, server.try_clone()?, delay)?;
    direction(server, client, delay)
}

/// One direction of one connection: a reader that stamps each chunk with
/// its time to go, a writer that sends it then.
fn direction(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::Builder::new()
        .name("link-read".to_owned())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            // Dropping `tx` tells the writer; it passes the close on.
        })?;
    std::thread::Builder::new()
        .name("link-write".to_owned())
        .spawn(move || {
            precise_sleeps();
            while let Ok((due, chunk)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

/// Makes this thread's sleeps end when asked, not up to the default timer
/// slack (50 µs) later. Elsewhere than Linux, sleeps stay as they are.
fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer and touches nothing but
    // the calling thread's timer slack; a failure leaves the default.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// The p50 of `PING` through the link, in µs: one connection, one ping at a
/// time (50 with `--quick`, 200 otherwise, after 5 to warm up), each sent
/// `idle` after the last reply: back to back with zero, or after as long a
/// quiet spell as a scenario's round has (a server and client that slept
/// that long pay their wake-ups, which a warm `PING` does not).
pub async fn ping_p50(env: &Env, idle: Duration) -> Result<f64> {
    let mut conn = crate::scenarios::common::redis_client(&env.url)?
        .get_multiplexed_async_connection()
        .await
        .map_err(context("connecting through the link"))?;
    let pings = if env.quick { 50 } else { 200 };
    let mut h = new_histogram()?;
    for i in 0..pings + 5 {
        if !idle.is_zero() {
            tokio::time::sleep(idle).await;
        }
        let sent = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        if i >= 5 {
            h.record(
                u64::try_from(sent.elapsed().as_nanos())
                    .unwrap_or(u64::MAX)
                    .max(1),
            )?;
        }
    }
    Ok(us(h.value_at_quantile(0.5)))
}

/// The p50 metrics given in round trips too: each becomes a metric of the
/// same name with `RTT` for `us`.
const IN_ROUND_TRIPS: &[(&str, &str)] = &[
    ("p50 us", "p50 RTT"),
    ("handoff p50 us", "handoff p50 RTT"),
    ("wait p50 us", "wait p50 RTT"),
];

/// Adds to every row of `result` its p50s in round trips (p50 / `rtt_us`),
/// the RTT itself, a note on the link, and the targets in round trips: an
/// uncontended cycle is two round trips (+5%), a hand-off to a parked
/// waiter the release's request and the message, one round trip (+5%).
/// `idle_rtt_us`: the RTT of a `PING` sent after a round's quiet spell, for
/// scenarios whose rounds start from idle (`parked-handoff`): its hand-off
/// p50 over it too, beside the target, which stays on the warm RTT.
pub fn in_round_trips(
    result: &mut ScenarioResult,
    delay: Duration,
    rtt_us: f64,
    idle_rtt_us: Option<f64>,
) {
    for row in &mut result.rows {
        let mut added = Vec::new();
        for metric in &row.metrics {
            if let Some((_, rtt_name)) = IN_ROUND_TRIPS.iter().find(|(n, _)| *n == metric.name) {
                added.push((*rtt_name, metric.value / rtt_us));
            }
        }
        if added.is_empty() {
            continue;
        }
        if let (Some(idle), Some((_, p50))) = (idle_rtt_us, added.first()) {
            let handoff_us = p50 * rtt_us;
            row.push("p50 idle-RTT", handoff_us / idle, Better::Lower);
        }
        for (name, value) in added {
            row.push(name, value, Better::Lower);
        }
        row.push("link RTT us", rtt_us, Better::Neutral);
        if let Some(idle) = idle_rtt_us {
            row.push("idle RTT us", idle, Better::Neutral);
        }
    }
    result.notes.push(format!(
        "through a link of {delay:?} each way (a delay line: each chunk written that long after it was read, the OS timer's excess included), nothing pinned; RTT = p50 of PING through it after the scenario: {rtt_us:.0} us"
    ));
    if let Some(idle) = idle_rtt_us {
        result.notes.push(format!(
            "idle RTT = p50 of PING sent after the same quiet spell as a round's release: {idle:.0} us (server and client wake from idle, as in a round); p50 idle-RTT: the hand-off over it"
        ));
    }
    let distlock_row = |label: &str| result.rows.iter().any(|r| r.label == label);
    match result.name {
        "uncontended" if distlock_row("distlock") => result.targets.push(Target::absolute(
            "distlock uncontended p50 <= 2 RTT + 5%",
            "distlock",
            "p50 RTT",
            Check::AtMost(2.1),
        )),
        "parked-handoff" => result.targets.push(Target::absolute(
            "distlock parked hand-off p50 <= 1 RTT + 5% (the release's way there and the message's back)",
            crate::scenarios::parked_handoff::DISTLOCK_LABEL,
            "handoff p50 RTT",
            Check::AtMost(1.05),
        )),
        _ => {}
    }
}
