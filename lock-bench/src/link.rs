//! `--link-delay`: a real round trip between every client and the server.
//!
//! The link is `distlock-testing`'s fault proxy in its delay mode: each
//! chunk read from either side is held for the delay, then written to the
//! other. A connection carries one chunk at a time (while one is held,
//! neither direction of that connection reads), which is a link's latency
//! for a client that waits for each reply before it sends more (every
//! latency scenario: one request in flight per connection), and less than a
//! link's throughput for pipelined or multiplexed traffic (many tasks on
//! one connection): throughput figures through it are not a network's.
//!
//! The figures that matter through a link are in round trips: each
//! scenario's p50s divided by the p50 of `PING` through the same link,
//! measured right after the scenario, so that a tokio timer's rounding of
//! the delay (about 1 ms more per direction at 1 ms) and the machine's load
//! divide out.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use distlock_testing::{FaultMode, FaultProxy};

use crate::error::{context, Result};
use crate::report::{new_histogram, us, Better, Check, ScenarioResult, Target};
use crate::scenarios::common::Env;

/// Starts the link to `upstream`, holding each chunk `delay` (none: the
/// proxy alone, for its own cost).
pub async fn start(upstream: SocketAddr, delay: Duration) -> Result<FaultProxy> {
    let proxy = FaultProxy::start(upstream)
        .await
        .map_err(context("starting the link's proxy"))?;
    if !delay.is_zero() {
        proxy.set_mode(FaultMode::Delay(delay));
    }
    Ok(proxy)
}

/// The p50 of `PING` through the link, in µs: one connection, one ping at a
/// time (50 with `--quick`, 200 otherwise, after 5 to warm up).
pub async fn ping_p50(env: &Env) -> Result<f64> {
    let mut conn = redis::Client::open(env.url.as_str())?
        .get_multiplexed_async_connection()
        .await
        .map_err(context("connecting through the link"))?;
    let pings = if env.quick { 50 } else { 200 };
    let mut h = new_histogram()?;
    for i in 0..pings + 5 {
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
pub fn in_round_trips(result: &mut ScenarioResult, delay: Duration, rtt_us: f64) {
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
        for (name, value) in added {
            row.push(name, value, Better::Lower);
        }
        row.push("link RTT us", rtt_us, Better::Neutral);
    }
    result.notes.push(format!(
        "through a link of {delay:?} each way (distlock-testing's fault proxy, one chunk at a time per connection), nothing pinned; RTT = p50 of PING through it after the scenario: {rtt_us:.0} us"
    ));
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
