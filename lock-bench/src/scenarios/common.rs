//! What the scenarios share: the environment, the per-implementation cycle, and
//! the interleaved block runner.
//!
//! A cycle is timed in nanoseconds into an hdrhistogram of 3 significant
//! digits, in a task spawned on the multi-thread runtime, as application code
//! runs. Why interleaved: on a shared VM the load changes under a run, so the
//! implementations of a scenario run in alternating blocks of cycles (or time
//! slices), rotating the order, and a change of load hits all of them; only
//! ratios within one run compare. Even so some ratios move with the hour more
//! than with a change of code: the Zipf ratio to rslock (2.5x one day,
//! 1.65x-1.77x the next, on the same build), the per-run uncontended p50 ratio
//! (0.92x-1.05x), the max-wait tail (one stall of the host sets it). What
//! bounds each scenario on this project's 2-vCPU machine:
//!
//! * `uncontended`, on one CPU (`pin.rs`): the client's CPU plus the server's
//!   plus the thread hand-offs between them (about 30-45 µs a cycle), so 0.5 µs
//!   of server work is 1-2% of it; with no network in the cycle this is
//!   stricter than a deployment.
//! * `many-keys`: 64 tasks on 2 cores shared with Redis: the server's CPU per
//!   command, then the client's.
//! * `renewal`: Redis CPU, one `renew.lua` per lock per tick.
//! * Redlock: its rounds (acquire on 5, release on 5) on shared cores; under
//!   contention split votes make acquisitions retry. The members share the
//!   client's cores; in a deployment their rounds run in parallel.
//!
//! Counts that do not drift with the load (commands, round trips, allocations,
//! instructions) say more than times; instructions come from valgrind
//! (callgrind, cachegrind) because this VM exposes no hardware counters.
//!
//! With `--tls` ([`set_tls_ca`]) the server speaks TLS only, with a certificate
//! authority made at spawn time (`RedisServer::builder().tls(true)`), and every
//! client trusts that CA and nothing else: distlock over `rediss://` with
//! `LockManagerBuilder::tls_ca_pem`, rslock over rustls (its `tokio-comp`
//! feature is redis-rs's `tokio-rustls-comp`) through `LockManager::from_clients`
//! on a client made with `Client::build_with_tls`, and the floors' redis-rs
//! clients (scripts and pub/sub) the same way. The raw-socket floor speaks
//! plain RESP and is left out, and `rt/op` is not counted (the counting proxy
//! cannot read encrypted replies).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use distlock::{distributed_lock, LockError, LockManager};
use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;

use crate::error::{bail, context, Result};
use crate::floor::{Attempt, Floor, Minimal, Names, RawMinimal};
use crate::proxy::CountingProxy;
use crate::redis_stats::{Delta, Snapshot};
use crate::report::new_histogram;

/// Lease of every lock that is not a renewal test: long enough never to end
/// during a cycle, as in the floor.
pub const LEASE: Duration = Duration::from_secs(30);
pub const LEASE_MS: u64 = 30_000;

pub use crate::floor::Target;

pub struct Env {
    pub target: Target,
    /// The single server, or the first cluster node: where pub/sub connections
    /// go (a classic `PUBLISH` on any cluster node reaches every node's
    /// subscribers, as the runtime relies on) and what the log line shows.
    pub url: String,
    pub addr: SocketAddr,
    /// For `INFO` only, so that it never queues behind measured traffic: one
    /// connection per server (every master of a cluster; figures are summed).
    pub stats: Vec<MultiplexedConnection>,
    pub quick: bool,
    /// `--locks N`: locks held by `renewal` and `memory` (their default when unset).
    pub locks: Option<usize>,
    /// `--backend redlock`: every member's address (the first is `addr`, where
    /// the single-node rows run); empty otherwise.
    pub members: Vec<SocketAddr>,
    /// `--link-delay`: every client reaches the server through a proxy that
    /// holds each chunk this long in each direction (`url`, `addr` and
    /// `target` are the proxy's); `None` on plain loopback.
    pub link_delay: Option<Duration>,
    /// `--no-pin`: the latency scenarios run on every CPU, as a service does.
    pub no_pin: bool,
    /// `--processes N`: handoff and many-keys run with N worker processes.
    pub processes: Option<usize>,
    /// `--tasks`: tasks per worker process.
    pub tasks: usize,
    /// `--tls`: the server speaks TLS only; every client trusts its CA.
    pub tls: bool,
}

impl Env {
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    pub fn is_redlock(&self) -> bool {
        matches!(self.target, Target::Redlock(_))
    }

    /// The first member of a Redlock, or the single server: where the
    /// single-node rows of `--backend redlock` run.
    pub fn single_target(&self) -> Target {
        Target::Single(self.url.clone())
    }

    /// A scenario's name: `NAME`, or `NAME-cluster` on a cluster.
    pub fn name(&self, single: &'static str, cluster: &'static str) -> &'static str {
        if self.is_cluster() {
            cluster
        } else {
            single
        }
    }

    /// A row's label; on a cluster the same-scripts floor is the cluster floor.
    pub fn label(&self, kind: Kind) -> &'static str {
        match kind {
            Kind::Floor if self.is_cluster() => CLUSTER_FLOOR_LABEL,
            other => other.label(),
        }
    }

    pub async fn snapshot(&self) -> Result<Snapshot> {
        let mut conns = self.stats.clone();
        Snapshot::take_all(&mut conns).await
    }

    /// The process id of every server (`INFO server`), for `pin::OneCpu`.
    pub async fn server_pids(&self) -> Result<Vec<u32>> {
        let mut pids = Vec::new();
        for conn in &self.stats {
            let mut conn = conn.clone();
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(&mut conn)
                .await
                .map_err(context("INFO server"))?;
            let pid = info
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or("INFO server has no process_id")?;
            pids.push(pid);
        }
        Ok(pids)
    }

    /// Between scenarios: no locks, counters or channels left from before (on
    /// every server).
    pub async fn flush(&self) -> Result<()> {
        for conn in &self.stats {
            let mut conn = conn.clone();
            redis::cmd("FLUSHALL")
                .query_async::<()>(&mut conn)
                .await
                .map_err(context("FLUSHALL"))?;
        }
        Ok(())
    }
}

/// The same-scripts floor's label on a cluster.
pub const CLUSTER_FLOOR_LABEL: &str = "cluster floor (same scripts)";

/// Which implementation a cycle runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The same-scripts floor: distlock's Lua scripts called by hand.
    Floor,
    /// The minimal floor: `SET NX PX` and a compare-and-delete script.
    Minimal,
    /// The minimal floor's commands as RESP on a raw socket, without redis-rs.
    RawMinimal,
    Distlock,
    /// distlock built with `.fencing(false)`: no fencing counter, a plain
    /// `SET NX PX` for a free lock.
    DistlockEager,
    /// distlock with `.renew(false)`: for `--profile` only, to show what the
    /// renewal task's wake-up on every acquisition costs.
    DistlockNoRenew,
    /// A function under `#[distributed_lock]` (see `macro_cycle`).
    Macro,
    Rslock,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Floor => "same-scripts floor",
            Kind::Minimal => "minimal floor (SET NX PX + CAD)",
            Kind::RawMinimal => "raw-socket floor (no redis-rs)",
            Kind::Distlock => "distlock",
            Kind::DistlockEager => "distlock eager_fencing",
            Kind::DistlockNoRenew => "distlock renew(false)",
            Kind::Macro => "#[distributed_lock]",
            Kind::Rslock => "rslock 0.10 (peer)",
        }
    }
}

/// One implementation, connected, able to run one acquire+release cycle on the
/// key it was made for.
pub enum Cycler {
    Floor {
        floor: Floor,
        names: Names,
        rng: fastrand::Rng,
    },
    Minimal {
        floor: Minimal,
        key: String,
        rng: fastrand::Rng,
    },
    RawMinimal {
        floor: RawMinimal,
        key: String,
        rng: fastrand::Rng,
    },
    Distlock {
        manager: LockManager,
        key: String,
        renew: bool,
    },
    Macro {
        manager: LockManager,
        i: u64,
    },
    Rslock {
        manager: rslock::LockManager,
        key: String,
    },
}

impl Cycler {
    /// `key` is the user key; the attributed function formats its own (`bench:{i}`).
    pub async fn connect(kind: Kind, target: &Target, key: &str, seed: u64) -> Result<Cycler> {
        Ok(match kind {
            Kind::Floor => Cycler::Floor {
                floor: Floor::connect(target).await?,
                names: Names::new("floor:", key),
                rng: fastrand::Rng::with_seed(seed),
            },
            Kind::Minimal => Cycler::Minimal {
                floor: Minimal::connect(target).await?,
                key: Names::new("minimal:", key).lock,
                rng: fastrand::Rng::with_seed(seed),
            },
            Kind::RawMinimal => Cycler::RawMinimal {
                floor: RawMinimal::connect(target).await?,
                key: Names::new("raw:", key).lock,
                rng: fastrand::Rng::with_seed(seed),
            },
            Kind::Distlock | Kind::DistlockNoRenew | Kind::DistlockEager => Cycler::Distlock {
                manager: manager_with(target, kind == Kind::DistlockEager).await?,
                key: key.to_owned(),
                renew: kind != Kind::DistlockNoRenew,
            },
            Kind::Macro => Cycler::Macro {
                manager: manager(target).await?,
                i: seed,
            },
            Kind::Rslock => Cycler::Rslock {
                manager: match target {
                    Target::Single(url) => rslock_manager(url)?,
                    Target::Cluster(_) => bail!("rslock has no Redis Cluster support"),
                    Target::Redlock(_) => bail!("the bench runs only distlock on a Redlock"),
                },
                key: key.to_owned(),
            },
        })
    }

    /// Another cycler on the same connection (and manager) for another key.
    pub fn fork(&self, key: &str, seed: u64) -> Cycler {
        match self {
            Cycler::Floor { floor, .. } => Cycler::Floor {
                floor: floor.clone(),
                names: Names::new("floor:", key),
                rng: fastrand::Rng::with_seed(seed),
            },
            Cycler::Minimal { floor, .. } => Cycler::Minimal {
                floor: floor.clone(),
                key: Names::new("minimal:", key).lock,
                rng: fastrand::Rng::with_seed(seed),
            },
            Cycler::RawMinimal { floor, .. } => Cycler::RawMinimal {
                floor: floor.clone(),
                key: Names::new("raw:", key).lock,
                rng: fastrand::Rng::with_seed(seed),
            },
            Cycler::Distlock { manager, renew, .. } => Cycler::Distlock {
                manager: manager.clone(),
                key: key.to_owned(),
                renew: *renew,
            },
            Cycler::Macro { manager, .. } => Cycler::Macro {
                manager: manager.clone(),
                i: seed,
            },
            Cycler::Rslock { manager, .. } => Cycler::Rslock {
                manager: manager.clone(),
                key: key.to_owned(),
            },
        }
    }

    pub async fn cycle(&mut self) -> Result<()> {
        match self {
            Cycler::Minimal { floor, key, rng } => {
                let owner = owner_token(rng);
                if !floor.try_acquire(key, &owner, LEASE_MS).await? {
                    bail!("minimal floor: the uncontended key {key} was busy");
                }
                floor.release(key, &owner).await?;
            }
            Cycler::RawMinimal { floor, key, rng } => {
                let owner = owner_token(rng);
                if !floor.try_acquire(key, &owner, LEASE_MS).await? {
                    bail!("raw-socket floor: the uncontended key {key} was busy");
                }
                floor.release(key, &owner).await?;
            }
            Cycler::Floor { floor, names, rng } => {
                let owner = owner_token(rng);
                // No one else uses this key: one attempt, as a hand-written
                // client would make.
                match floor.try_acquire(names, &owner, LEASE_MS, false).await? {
                    Attempt::Acquired => {}
                    Attempt::Busy(_) => bail!("floor: the uncontended key {} was busy", names.lock),
                }
                // As the runtime releases a hold that did not wait.
                floor.release_unwaited(names, &owner).await?;
            }
            Cycler::Distlock {
                manager,
                key,
                renew,
            } => {
                let guard = manager
                    .lock(key.as_str())
                    .lease(LEASE)
                    .renew(*renew)
                    .acquire()
                    .await?;
                guard.release().await?;
            }
            Cycler::Macro { manager, i } => {
                locked_noop(manager, *i).await?;
            }
            Cycler::Rslock { manager, key } => {
                let lock = manager.lock(key.as_str(), LEASE).await?;
                // rslock's unlock is best effort and reports nothing.
                manager.unlock(&lock).await;
            }
        }
        Ok(())
    }
}

/// 32 lowercase hex digits, the length of a distlock owner token (the bench
/// needs spread, not secrecy: a seeded generator).
pub fn owner_token(rng: &mut fastrand::Rng) -> String {
    format!("{:016x}{:016x}", rng.u64(..), rng.u64(..))
}

/// `--direct-lane on|off`: whether the bench's managers may take the direct
/// lane (`LockManagerBuilder::direct_lane`); on by default, as in the library.
static DIRECT_LANE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Sets `--direct-lane` for every manager the bench builds from now on.
pub fn set_direct_lane(enabled: bool) {
    DIRECT_LANE.store(enabled, std::sync::atomic::Ordering::Relaxed);
}

/// `--direct-lane`: whether the bench's managers may take the direct lane.
pub fn direct_lane() -> bool {
    DIRECT_LANE.load(std::sync::atomic::Ordering::Relaxed)
}

/// `--tls`: the private server's certificate authority (PEM), which every
/// client of the run trusts; unset on plain TCP.
static TLS_CA: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

/// Sets `--tls`'s certificate authority for every client built from now on.
pub fn set_tls_ca(pem: Vec<u8>) {
    let _ = TLS_CA.set(pem);
}

/// A redis-rs client of `url`, trusting `--tls`'s authority when set: the
/// floors' and the bench's own connections.
pub fn redis_client(url: &str) -> Result<redis::Client> {
    Ok(match TLS_CA.get() {
        Some(ca) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            },
        )?,
        None => redis::Client::open(url)?,
    })
}

/// An rslock manager on one server, over rustls with `--tls`'s authority when set.
pub fn rslock_manager(url: &str) -> Result<rslock::LockManager> {
    Ok(rslock::LockManager::from_clients(vec![redis_client(url)?]))
}

pub async fn manager(target: &Target) -> Result<LockManager> {
    manager_with(target, false).await
}

/// A manager that issues fencing tokens at acquisition (eager) or on demand.
pub async fn manager_with(target: &Target, eager: bool) -> Result<LockManager> {
    let builder = match target {
        Target::Single(url) => LockManager::builder(url),
        Target::Cluster(urls) => LockManager::cluster_builder(urls.iter().cloned()),
        Target::Redlock(urls) => LockManager::redlock_builder(urls.iter().cloned()),
    };
    let builder = match TLS_CA.get() {
        Some(ca) => builder.tls_ca_pem(ca.clone()),
        None => builder,
    };
    Ok(builder
        .default_lease(LEASE)
        .eager_fencing(eager)
        .direct_lane(direct_lane())
        .build()
        .await?)
}

/// Sequential cycles of several implementations, measured in alternating
/// blocks so that a change of machine load hits all of them alike.
pub struct Interleaved {
    pub hist: Vec<Histogram<u64>>,
    pub ops: Vec<u64>,
    pub seconds: Vec<f64>,
    pub redis: Vec<Delta>,
    /// The CPU the blocks ran on with the servers (see `pin.rs`), or why
    /// they could not be confined to one; `None` when not asked to.
    pub one_cpu: Option<std::result::Result<usize, String>>,
}

impl Interleaved {
    /// The note that says where the blocks ran.
    pub fn cpu_note(&self) -> String {
        match &self.one_cpu {
            None => "not confined to one CPU: the bench and the servers ran on every CPU".to_owned(),
            Some(Ok(cpu)) => format!("measured with the bench's threads and every server's on CPU {cpu} alone (see lock-bench/README.md, \"One CPU for the latency scenarios\")"),
            Some(Err(e)) => format!("NOT confined to one CPU ({e}): on a VM the latencies may be bimodal (see lock-bench/README.md, \"One CPU for the latency scenarios\")"),
        }
    }
}

/// Runs `cycles` cycles of each cycler in blocks of `block`, rotating the
/// order every round, after `warmup` cycles each. With `one_cpu` (and neither
/// `--link-delay` nor `--no-pin`), the bench and the servers run on one CPU meanwhile (see
/// `pin.rs`); Redlock's five members
/// are left on every CPU, as its rows have always been measured.
pub async fn run_interleaved(
    env: &Env,
    cyclers: Vec<Cycler>,
    warmup: u64,
    cycles: u64,
    block: u64,
    one_cpu: bool,
) -> Result<Interleaved> {
    let n = cyclers.len();
    let mut slots: Vec<Option<Cycler>> = cyclers.into_iter().map(Some).collect();
    // Through `--link-delay` nothing is pinned: the link's proxy runs in
    // this process, and a link is the cross-core, cross-host case itself.
    let pinned = if one_cpu && env.link_delay.is_none() && !env.no_pin {
        Some(crate::pin::OneCpu::pin(&env.server_pids().await?))
    } else {
        None
    };
    let mut out = Interleaved {
        hist: (0..n).map(|_| new_histogram()).collect::<Result<_>>()?,
        ops: vec![0; n],
        seconds: vec![0.0; n],
        redis: vec![Delta::default(); n],
        one_cpu: pinned
            .as_ref()
            .map(|p| p.as_ref().map(|p| p.cpu).map_err(|e| e.to_string())),
    };
    for slot in &mut slots {
        let (c, ..) = block_in_task(slot, warmup).await?;
        *slot = Some(c);
    }
    let rounds = cycles.div_ceil(block);
    for round in 0..rounds {
        let this_block = block.min(cycles - round * block);
        for k in 0..n {
            let i = (k + round as usize) % n;
            let before = env.snapshot().await?;
            let (c, hist, seconds) = block_in_task(&mut slots[i], this_block).await?;
            slots[i] = Some(c);
            out.redis[i] += before.delta(&env.snapshot().await?);
            out.hist[i].add(hist)?;
            out.seconds[i] += seconds;
            out.ops[i] += this_block;
        }
    }
    Ok(out)
}

/// Runs `cycles` cycles in a task of their own, as application code runs (on a
/// worker thread, not on the thread blocked in `block_on`).
async fn block_in_task(
    slot: &mut Option<Cycler>,
    cycles: u64,
) -> Result<(Cycler, Histogram<u64>, f64)> {
    let Some(mut c) = slot.take() else {
        bail!("a cycler was lost by an earlier failure");
    };
    let mut hist = new_histogram()?;
    let task = tokio::spawn(async move {
        let started = Instant::now();
        for _ in 0..cycles {
            let t = Instant::now();
            c.cycle().await?;
            hist.saturating_record(nanos(t.elapsed()));
        }
        Ok::<_, crate::error::BoxError>((c, hist, started.elapsed().as_secs_f64()))
    });
    task.await?
}

/// Round trips per cycle of `kind`, counted through a proxy with a connection
/// of its own, after a warm-up that loads the scripts and opens connections.
///
/// `None` on a cluster: the cluster client learns the nodes' own addresses from
/// `CLUSTER SLOTS` and would go around a proxy in front of one of them. `None`
/// under `--tls`: the proxy cannot read encrypted replies.
pub async fn round_trips_per_cycle(
    env: &Env,
    kind: Kind,
    key: &str,
    cycles: u64,
) -> Result<Option<f64>> {
    if env.is_cluster() || env.tls {
        return Ok(None);
    }
    let proxy = CountingProxy::start(env.addr).await?;
    let mut cycler = Cycler::connect(kind, &Target::Single(proxy.url()), key, 99).await?;
    for _ in 0..20 {
        cycler.cycle().await?;
    }
    // Let background work of the warm-up (a renewal, a late release) settle.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = proxy.round_trips();
    for _ in 0..cycles {
        cycler.cycle().await?;
    }
    Ok(Some((proxy.round_trips() - before) as f64 / cycles as f64))
}

/// Round trips per distlock cycle on the Redlock, summed over its members:
/// a Redlock manager built over a counting proxy in front of every member.
pub async fn redlock_round_trips_per_cycle(env: &Env, key: &str, cycles: u64) -> Result<f64> {
    let mut proxies = Vec::new();
    for addr in &env.members {
        proxies.push(CountingProxy::start(*addr).await?);
    }
    let urls = proxies.iter().map(CountingProxy::url).collect();
    let mut cycler = Cycler::connect(Kind::Distlock, &Target::Redlock(urls), key, 99).await?;
    for _ in 0..20 {
        cycler.cycle().await?;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let count = |p: &[CountingProxy]| p.iter().map(CountingProxy::round_trips).sum::<u64>();
    let before = count(&proxies);
    for _ in 0..cycles {
        cycler.cycle().await?;
    }
    Ok((count(&proxies) - before) as f64 / cycles as f64)
}

pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Kind {
    pub fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "floor" => Kind::Floor,
            "minimal" => Kind::Minimal,
            "raw" => Kind::RawMinimal,
            "distlock" => Kind::Distlock,
            "distlock-norenew" => Kind::DistlockNoRenew,
            "macro" => Kind::Macro,
            "rslock" => Kind::Rslock,
            _ => return None,
        })
    }
}

/// `--profile`: `tasks` tasks of one implementation cycle on distinct keys for
/// `seconds`, with nothing else running, for `perf record`. Returns the cycles.
pub async fn profile_loop(
    env: &Env,
    kind: Kind,
    tasks: usize,
    seconds: f64,
) -> Result<(u64, Delta)> {
    let base = Cycler::connect(kind, &env.target, "profile:base", 0).await?;
    let before = env.snapshot().await?;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mut c = base.fork(&format!("profile:{t}"), t as u64);
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                c.cycle().await?;
                n += 1;
            }
            Ok::<u64, crate::error::BoxError>(n)
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await??;
    }
    Ok((total, before.delta(&env.snapshot().await?)))
}

/// An empty body under the attribute, locking `bench:{i}` with the scenario's
/// lease on the given manager (its default wait): the `macro` scenario's cycle,
/// here beside the other cycles so that the scenarios depend on this module only.
#[distributed_lock(key = "bench:{i}", lease = "30s", manager = manager)]
pub async fn locked_noop(manager: &LockManager, i: u64) -> std::result::Result<(), LockError> {
    Ok(())
}
