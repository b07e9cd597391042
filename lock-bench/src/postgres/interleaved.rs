//! The runner of the pass's one-task latency scenarios (`uncontended`,
//! `lock-all`, `shared`): each implementation (row) on its own connection
//! (manager), cycled in blocks that alternate between the rows, the order
//! rotated every round, so that a change of machine load (a WAL flush slowed
//! by another build's disk traffic) hits every row alike; the bench and the
//! server's processes on one CPU meanwhile (see `pin.rs`). Round trips are
//! counted afterwards, in a pass of their own through [`super::proxy`]: the
//! proxy adds its own hops, which must stay out of the timed cycles.
//!
//! The scenarios differ only in their rows (their [`Cycle`]s), sizes, columns'
//! units and notes; one runner keeps their A/B timing the same.

use std::future::Future;
use std::time::Instant;

use hdrhistogram::Histogram;

use super::PgEnv;
use crate::error::{bail, BoxError, Result};
use crate::report::{new_histogram, us, Better, Row};
use crate::scenarios::common::nanos;

/// One row's cycle on its own connection (manager).
pub trait Cycle: Send + 'static {
    /// One acquire + release; `false` when a try found the lock held (a
    /// floor's try: the row counts it as busy).
    fn cycle(&mut self) -> impl Future<Output = Result<bool>> + Send;
}

/// Which pass a row's cycler is made for: the round-trip pass makes new
/// cyclers on the proxy's URL, to which a scenario may give keys or owners
/// of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The timed cycles, on the server's own port.
    Timed,
    /// The round-trip count, through the counting proxy.
    RoundTrips,
}

/// When the timed pass's warm-up cycles run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmUp {
    /// Each row's right after it is made, before anything is pinned.
    AsMade,
    /// Every row's once all are made and pinned to the one CPU.
    Pinned,
}

/// A scenario's sizes.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Uncounted cycles per row before the timed ones.
    pub warmup: u64,
    /// When they run.
    pub warm_up: WarmUp,
    /// Timed cycles per row.
    pub cycles: u64,
    /// Timed cycles of one row in a row, before the next row's turn.
    pub block: u64,
    /// Uncounted cycles per row through the counting proxy.
    pub rt_warmup: u64,
    /// Then counted ones.
    pub rt_cycles: u64,
}

impl Plan {
    /// `(warmup, cycles, block)` at `--quick` size or full size; each row
    /// warmed up as it is made; round trips over 10 cycles (100 at full
    /// size) after 5.
    pub fn new(quick: bool, quick_sizes: (u64, u64, u64), full: (u64, u64, u64)) -> Plan {
        let (warmup, cycles, block) = if quick { quick_sizes } else { full };
        Plan {
            warmup,
            warm_up: WarmUp::AsMade,
            cycles,
            block,
            rt_warmup: 5,
            rt_cycles: if quick { 10 } else { 100 },
        }
    }
}

/// What the runner measured, per row (in the order of the rows).
pub struct Measured {
    /// Latency of each timed cycle.
    pub hist: Vec<Histogram<u64>>,
    /// Time in the timed blocks.
    pub seconds: Vec<f64>,
    /// CPU seconds of the row's backend process (NaN where unmeasured: pid 0).
    pub server_cpu: Vec<f64>,
    /// Timed cycles.
    pub ops: Vec<u64>,
    /// Cycles whose try found the lock held.
    pub busy: Vec<u64>,
    /// Round trips per cycle, through the counting proxy.
    pub round_trips: Vec<f64>,
    /// Where the timed cycles ran (one CPU, or why not).
    pub cpu_note: String,
}

/// What a row's columns count: a cycle (of several locks) or an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// `cycles/s`, `rt/cycle`, `backend cpu us/cycle`.
    Cycle,
    /// `ops/s`, `rt/op`, `backend cpu us/op`.
    Op,
}

impl Measured {
    /// Row `i`'s throughput and latency percentiles, and its histogram (for
    /// the charts); a scenario pushes its own columns after them, then
    /// [`Measured::push_costs`].
    pub fn row(&self, i: usize, label: &str, unit: Unit) -> Row {
        let h = &self.hist[i];
        let throughput = match unit {
            Unit::Cycle => "cycles/s",
            Unit::Op => "ops/s",
        };
        let mut row = Row::new(label);
        row.push(
            throughput,
            self.ops[i] as f64 / self.seconds[i],
            Better::Higher,
        )
        .push("p50 us", us(h.value_at_quantile(0.50)), Better::Lower)
        .push("p99 us", us(h.value_at_quantile(0.99)), Better::Lower)
        .push("p999 us", us(h.value_at_quantile(0.999)), Better::Lower);
        row.histogram = Some(h.clone());
        row
    }

    /// Row `i`'s round trips and its backend's CPU time, per `unit`.
    pub fn push_costs(&self, row: &mut Row, i: usize, unit: Unit) {
        let (rt, cpu) = match unit {
            Unit::Cycle => ("rt/cycle", "backend cpu us/cycle"),
            Unit::Op => ("rt/op", "backend cpu us/op"),
        };
        row.push(rt, self.round_trips[i], Better::Neutral).push(
            cpu,
            self.server_cpu[i] * 1e6 / self.ops[i].max(1) as f64,
            Better::Lower,
        );
    }
}

/// Runs `n` rows: `make(i, url, pass)` makes row `i`'s cycler on `url` and
/// says the pid of its backend (0: unmeasured, as distlock's, whose
/// connections are its own).
pub async fn run<C, F, Fut>(env: &PgEnv, n: usize, plan: Plan, make: F) -> Result<Measured>
where
    C: Cycle,
    F: Fn(usize, String, Pass) -> Fut,
    Fut: Future<Output = Result<(C, u32)>>,
{
    let mut slots = Vec::with_capacity(n);
    for i in 0..n {
        let (mut c, pid) = make(i, env.url.clone(), Pass::Timed).await?;
        if plan.warm_up == WarmUp::AsMade {
            for _ in 0..plan.warmup {
                c.cycle().await?;
            }
        }
        slots.push(Some((c, pid)));
    }
    let pinned = crate::pin::OneCpu::pin(&super::server_pids(env.postmaster));
    if plan.warm_up == WarmUp::Pinned {
        for (c, _) in slots.iter_mut().flatten() {
            for _ in 0..plan.warmup {
                c.cycle().await?;
            }
        }
    }
    let mut hist: Vec<Histogram<u64>> = (0..n).map(|_| new_histogram()).collect::<Result<_>>()?;
    let mut seconds = vec![0.0; n];
    let mut server_cpu = vec![0.0; n];
    let mut ops = vec![0u64; n];
    let mut busy = vec![0u64; n];
    let (cycles, block) = (plan.cycles, plan.block);
    let rounds = cycles.div_ceil(block);
    for round in 0..rounds {
        let this_block = block.min(cycles - round * block);
        for k in 0..n {
            let i = (k + round as usize) % n;
            let Some((mut c, pid)) = slots[i].take() else {
                bail!("a cycler was lost by an earlier failure");
            };
            let cpu_before = process_cpu_seconds(pid);
            // In a task of its own, as application code runs.
            let task = tokio::spawn(async move {
                let mut h = new_histogram()?;
                let mut busy = 0u64;
                let started = Instant::now();
                for _ in 0..this_block {
                    let t = Instant::now();
                    if !c.cycle().await? {
                        busy += 1;
                    }
                    h.saturating_record(nanos(t.elapsed()));
                }
                Ok::<_, BoxError>((c, h, busy, started.elapsed().as_secs_f64()))
            });
            let (c, h, b, s) = task.await??;
            server_cpu[i] += process_cpu_seconds(pid) - cpu_before;
            hist[i].add(h)?;
            seconds[i] += s;
            ops[i] += this_block;
            busy[i] += b;
            slots[i] = Some((c, pid));
        }
    }
    let cpu_note = match &pinned {
        Ok(p) => format!("measured with the bench's threads and every PostgreSQL process on CPU {} alone (see lock-bench/README.md, \"One CPU for the latency scenarios\")", p.cpu),
        Err(e) => format!("NOT confined to one CPU ({e}): on a VM the latencies may be bimodal"),
    };
    drop(pinned);
    drop(slots);
    let (proxy, proxied) = super::counting_proxy(env).await?;
    let mut round_trips = Vec::with_capacity(n);
    for i in 0..n {
        let (mut c, _) = make(i, proxied.clone(), Pass::RoundTrips).await?;
        for _ in 0..plan.rt_warmup {
            c.cycle().await?;
        }
        let before = proxy.round_trips();
        for _ in 0..plan.rt_cycles {
            c.cycle().await?;
        }
        round_trips.push((proxy.round_trips() - before) as f64 / plan.rt_cycles as f64);
    }
    Ok(Measured {
        hist,
        seconds,
        server_cpu,
        ops,
        busy,
        round_trips,
        cpu_note,
    })
}

/// CPU seconds (user + system) the process `pid` has used: a backend's own work.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return f64::NAN;
    };
    // After the name: state is field 3 of the line; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) if hz > 0.0 => (u + s) / hz,
        _ => f64::NAN,
    }
}
