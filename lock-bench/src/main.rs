//! `lock-bench`: distlock against two floors (its own scripts by hand with
//! redis-rs, and a minimal `SET NX PX` lock) and a peer (rslock), on a private
//! redis-server, or (`--backend cluster`) on a private 3-master Redis Cluster,
//! or (`--backend redlock`) distlock on a Redlock of 5 private redis-servers
//! beside distlock on one of them, or (`--backend postgres`) floors by hand and
//! sqlx's `PgAdvisoryLock` on a private PostgreSQL (`src/postgres/`).
//!
//! ```text
//! cargo run --release -p lock-bench -- [--quick] [--backend single|cluster|redlock|postgres] [--scenario NAME]...
//!                                      [--runs N] [--locks N] [--json [--results-dir DIR]] [--svg DIR]
//! ```
//!
//! `--json` writes one results file per scenario (`src/results.rs`), which
//! the `bench-history` binary reads back (`src/history.rs`).

mod alloc_count;
mod charts;
mod error;
mod floor;
#[cfg(test)]
mod history;
mod link;
mod pin;
mod postgres;
mod proxy;
mod redis_stats;
mod report;
mod results;
mod scenarios;

use std::path::PathBuf;
use std::time::Instant;

use distlock_testing::{RedisCluster, RedisServer};

use crate::error::{bail, context, Result};
use crate::report::ScenarioResult;
use crate::scenarios::common::{Env, Target};

/// Counts live heap bytes, for the `memory` scenario.
#[global_allocator]
static ALLOC: alloc_count::Counting = alloc_count::Counting;

const USAGE: &str = "\
usage: lock-bench [--quick] [--backend single|cluster|redlock|postgres] [--scenario NAME]... [--runs N] [--locks N]
                  [--link-delay DURATION] [--direct-lane on|off] [--no-pin] [--processes N [--tasks T]] [--tls]
                  [--json [--results-dir DIR]] [--svg DIR]

  --quick          a few seconds in all (CI); targets are printed, never enforced
  --backend B      single (default): one private redis-server; cluster: a private
                   3-master Redis Cluster, distlock built with cluster_builder against
                   the cluster floor (its scripts by EVALSHA over one connection
                   per master, routed by a slot map read once); runs uncontended, many-keys and handoff only;
                   redlock: 5 private redis-servers, distlock built with
                   redlock_builder beside distlock (builder) on one of them, interleaved;
                   no floor, no rslock; runs uncontended and handoff only;
                   postgres: a private PostgreSQL (fsync on), the advisory, lease-row
                   and NOTIFY hand-off floors by hand and sqlx's PgAdvisoryLock;
                   runs uncontended, many-keys, handoff, renewal, lock-all, shared and leader only
  --scenario NAME  run only NAME (repeatable, or comma-separated):
                   uncontended, many-keys, handoff, fresh-handoff, parked-handoff, renewal,
                   memory, macro; lock-all, shared, leader (--backend postgres only)
  --link-delay D   every client (distlock, rslock, the floors) reaches the server through
                   a delay line holding each chunk D in each direction (e.g. 100us, 1ms;
                   0 = the relay alone); nothing is pinned to a CPU, and
                   each scenario's p50s are also given in round trips (p50 / the p50 of
                   PING through the same link, measured after the scenario); single only
  --direct-lane on|off
                   whether distlock's managers may take the direct lane (default on), for
                   the lane's A/B
  --processes N    handoff and many-keys with N OS processes (the bench re-executed as workers),
                   each its own manager, on one key and on 1,000 keys, distlock and rslock
                   (results files handoff-procsN, many-keys-procsN); parked-handoff with its
                   waiters in N workers, round by round (parked-handoff-procsN); the others
                   are skipped; single only
  --tasks T        tasks per process of --processes (default 8)
  --tls            a private TLS redis-server (its own CA, which every client trusts):
                   distlock over rediss://, rslock over rustls, the floors' redis-rs
                   clients over TLS; runs uncontended and many-keys only; single only
  --no-pin         run the latency scenarios on every CPU (they are confined to one by
                   default; through --link-delay they never are)
  --runs N         run everything N times and print the medians too (default 1)
  --locks N        locks held by renewal and memory (default 100000; 1000 with --quick;
                   postgres: 10000)
  --json           write each scenario's figures to lock-bench/results/<commit>-<scenario>.json
                   (<commit>-<scenario>-quick.json with --quick; git ignores those): the medians,
                   every run's rows, the targets, the command, commit, date, nproc, server version
  --results-dir D  write the --json files to D instead of lock-bench/results
  --svg DIR        write latency-distribution charts (DIR/<scenario>.svg)
  --profile IMPL[:TASKS[:SECONDS]]
                   measure nothing: cycle IMPL (floor, minimal, distlock,
                   distlock-norenew, macro, rslock)
                   on TASKS distinct keys (1) for SECONDS (10), for perf record";

/// `--backend`: what the bench runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Single,
    Cluster,
    Redlock,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Single => "single",
            Backend::Cluster => "cluster",
            Backend::Redlock => "redlock",
            Backend::Postgres => "postgres",
        }
    }
}

/// The scenarios `--backend cluster` runs; the others are skipped with a note.
const CLUSTER_SCENARIOS: &[&str] = &["uncontended", "many-keys", "handoff"];

/// The scenarios `--backend redlock` runs; the others are skipped with a note.
const REDLOCK_SCENARIOS: &[&str] = &["uncontended", "handoff"];

/// The scenarios only the PostgreSQL pass has (`src/postgres/`); the Redis
/// passes skip them with a note.
const POSTGRES_ONLY_SCENARIOS: &[&str] = &["lock-all", "shared", "leader"];

/// The scenarios `--tls` runs; the others are skipped with a note.
const TLS_SCENARIOS: &[&str] = &["uncontended", "many-keys"];

/// Members of the `--backend redlock` Redlock.
const REDLOCK_MEMBERS: usize = 5;

#[derive(Debug)]
struct Args {
    quick: bool,
    backend: Backend,
    scenarios: Vec<String>,
    runs: usize,
    locks: Option<usize>,
    json: bool,
    results_dir: Option<PathBuf>,
    svg: Option<PathBuf>,
    profile: Option<(scenarios::common::Kind, usize, f64)>,
    /// `--link-delay`: each direction's delay through the proxy.
    link_delay: Option<std::time::Duration>,
    /// `--direct-lane`.
    direct_lane: bool,
    /// `--no-pin`.
    no_pin: bool,
    /// `--processes`: the multi-process pass instead of the in-process one.
    processes: Option<usize>,
    /// `--tasks`: tasks per process of `--processes`.
    tasks: usize,
    /// `--tls`: the server speaks TLS only.
    tls: bool,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<Args>> {
    let mut args = Args {
        quick: false,
        backend: Backend::Single,
        scenarios: Vec::new(),
        runs: 1,
        locks: None,
        json: false,
        results_dir: None,
        svg: None,
        profile: None,
        link_delay: None,
        direct_lane: true,
        no_pin: false,
        processes: None,
        tasks: scenarios::processes::TASKS,
        tls: false,
    };
    while let Some(arg) = it.next() {
        let mut value = |name: &str| match it.next() {
            Some(v) => Ok(v),
            None => Err(error::BenchError(format!("{name} needs a value\n{USAGE}"))),
        };
        match arg.as_str() {
            "--quick" => args.quick = true,
            "--backend" => {
                args.backend = match value("--backend")?.as_str() {
                    "single" => Backend::Single,
                    "cluster" => Backend::Cluster,
                    "redlock" => Backend::Redlock,
                    "postgres" => Backend::Postgres,
                    other => {
                        bail!("--backend takes single, cluster, redlock or postgres, not {other:?}")
                    }
                }
            }
            "--scenario" => {
                for name in value("--scenario")?.split(',').filter(|s| !s.is_empty()) {
                    if !scenarios::ALL.contains(&name) {
                        bail!(
                            "unknown scenario {name:?}; the scenarios are {}",
                            scenarios::ALL.join(", ")
                        );
                    }
                    args.scenarios.push(name.to_owned());
                }
            }
            "--runs" => {
                let v = value("--runs")?;
                args.runs = match v.parse() {
                    Ok(n) if n > 0 => n,
                    _ => bail!("--runs takes a positive number, not {v:?}"),
                };
            }
            "--locks" => {
                let v = value("--locks")?;
                args.locks = match v.parse() {
                    Ok(n) if n > 0 => Some(n),
                    _ => bail!("--locks takes a positive number, not {v:?}"),
                };
            }
            "--json" => args.json = true,
            "--results-dir" => args.results_dir = Some(value("--results-dir")?.into()),
            "--svg" => args.svg = Some(value("--svg")?.into()),
            "--profile" => {
                let v = value("--profile")?;
                let mut parts = v.split(':');
                let kind = parts.next().and_then(scenarios::common::Kind::parse);
                let tasks = parts.next().map_or(Ok(1), str::parse::<usize>);
                let secs = parts.next().map_or(Ok(10.0), str::parse::<f64>);
                match (kind, tasks, secs) {
                    (Some(k), Ok(t), Ok(s)) if t > 0 && s > 0.0 => args.profile = Some((k, t, s)),
                    _ => bail!("--profile takes IMPL[:TASKS[:SECONDS]], not {v:?}"),
                }
            }
            "--link-delay" => {
                let v = value("--link-delay")?;
                args.link_delay = match parse_duration(&v) {
                    Some(d) => Some(d),
                    None => {
                        bail!("--link-delay takes a duration such as 100us, 1ms or 0, not {v:?}")
                    }
                };
            }
            "--direct-lane" => {
                args.direct_lane = match value("--direct-lane")?.as_str() {
                    "on" => true,
                    "off" => false,
                    other => bail!("--direct-lane takes on or off, not {other:?}"),
                }
            }
            "--no-pin" => args.no_pin = true,
            "--processes" => {
                let v = value("--processes")?;
                args.processes = match v.parse() {
                    Ok(n) if n > 0 => Some(n),
                    _ => bail!("--processes takes a positive number, not {v:?}"),
                };
            }
            "--tls" => args.tls = true,
            "--tasks" => {
                let v = value("--tasks")?;
                args.tasks = match v.parse() {
                    Ok(n) if n > 0 => n,
                    _ => bail!("--tasks takes a positive number, not {v:?}"),
                };
            }
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if args.link_delay.is_some() && args.backend != Backend::Single {
        bail!("--link-delay runs on --backend single only (a cluster's nodes announce their own addresses, past any proxy)");
    }
    if args.processes.is_some() && args.backend != Backend::Single {
        bail!("--processes runs on --backend single only");
    }
    if args.tls
        && (args.backend != Backend::Single
            || args.processes.is_some()
            || args.link_delay.is_some())
    {
        bail!("--tls runs on --backend single only, without --processes or --link-delay");
    }
    if args.results_dir.is_some() && !args.json {
        bail!("--results-dir is where --json writes; give --json too");
    }
    if args.scenarios.is_empty() {
        args.scenarios = scenarios::ALL.iter().map(|s| (*s).to_owned()).collect();
    }
    Ok(Some(args))
}

/// The results files' variant of a run (see `RunInfo::variant`): the link's
/// delay (`link-100us`, `link-1ms`), the direct lane off (`lane-off`), the
/// latency scenarios not pinned (`unpinned`), N processes (`procsN`), TLS
/// (`tls`).
fn variant(
    link_delay: Option<std::time::Duration>,
    direct_lane: bool,
    no_pin: bool,
    processes: Option<usize>,
    tls: bool,
) -> Option<String> {
    let mut parts = Vec::new();
    if tls {
        parts.push("tls".to_owned());
    }
    if let Some(n) = processes {
        parts.push(format!("procs{n}"));
    }
    if let Some(delay) = link_delay {
        parts.push(
            format!("link-{delay:?}")
                .replace('µ', "u")
                .replace('.', "_"),
        );
    }
    if !direct_lane {
        parts.push("lane-off".to_owned());
    }
    // Through a link nothing is pinned anyway.
    if no_pin && link_delay.is_none() {
        parts.push("unpinned".to_owned());
    }
    (!parts.is_empty()).then(|| parts.join("-"))
}

/// `100us`, `250µs`, `1ms`, `1.5ms`, `2s`, or `0`.
fn parse_duration(text: &str) -> Option<std::time::Duration> {
    if text == "0" {
        return Some(std::time::Duration::ZERO);
    }
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "us" | "µs" => number / 1e6,
        "ms" => number / 1e3,
        "s" => number,
        _ => return None,
    };
    (0.0..10.0)
        .contains(&seconds)
        .then(|| std::time::Duration::from_secs_f64(seconds))
}

/// The load averages, as `/proc/loadavg` gives them.
/// See [`report::RunInfo::machine`].
fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().chars().take(8).collect::<String>())
        .unwrap_or_else(|| "unknown".to_owned());
    format!("{model}, boot {boot}")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            let v: Vec<&str> = s.split_whitespace().take(3).collect();
            (v.len() == 3).then(|| v.join(" "))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

async fn run_once(env: &Env, names: &[String]) -> Result<Vec<ScenarioResult>> {
    let mut results = Vec::new();
    for name in scenarios::ALL {
        if !names.iter().any(|n| n == name) {
            continue;
        }
        if POSTGRES_ONLY_SCENARIOS.contains(name) {
            println!("== {name}: skipped (--backend postgres only)\n");
            continue;
        }
        if env.is_cluster() && !CLUSTER_SCENARIOS.contains(name) {
            println!(
                "== {name}: skipped under --backend cluster (the cluster pass runs only {})\n",
                CLUSTER_SCENARIOS.join(", ")
            );
            continue;
        }
        if env.is_redlock() && !REDLOCK_SCENARIOS.contains(name) {
            println!(
                "== {name}: skipped under --backend redlock (the Redlock pass runs only {})\n",
                REDLOCK_SCENARIOS.join(", ")
            );
            continue;
        }
        if env.tls && !TLS_SCENARIOS.contains(name) {
            println!(
                "== {name}: skipped under --tls (the TLS pass runs only {})\n",
                TLS_SCENARIOS.join(", ")
            );
            continue;
        }
        if env.processes.is_some() && !["handoff", "many-keys", "parked-handoff"].contains(name) {
            println!("== {name}: skipped under --processes (only handoff, many-keys and parked-handoff have a many-process form)\n");
            continue;
        }
        let started = Instant::now();
        let mut got = if let Some(processes) = env.processes {
            vec![match *name {
                "handoff" => scenarios::processes::run(env, false, processes, env.tasks).await?,
                "many-keys" => scenarios::processes::run(env, true, processes, env.tasks).await?,
                "parked-handoff" => scenarios::parked_procs::run(env, processes).await?,
                other => bail!("{other} has no many-process form"),
            }]
        } else {
            match *name {
                "uncontended" => vec![scenarios::uncontended::run(env).await?],
                "many-keys" => scenarios::many_keys::run(env).await?,
                "handoff" => vec![scenarios::handoff::run(env).await?],
                "fresh-handoff" => vec![scenarios::fresh_handoff::run(env).await?],
                "parked-handoff" => vec![scenarios::parked_handoff::run(env).await?],
                "renewal" => vec![scenarios::renewal::run(env).await?],
                "memory" => vec![scenarios::memory::run(env).await?],
                "macro" => vec![scenarios::macro_cycle::run(env).await?],
                other => bail!("unknown scenario {other:?}"),
            }
        };
        if let Some(delay) = env.link_delay {
            let rtt = link::ping_p50(env, std::time::Duration::ZERO).await?;
            // A parked hand-off starts from a quiet spell: its RTT from one too.
            let idle_rtt = if *name == "parked-handoff" {
                Some(link::ping_p50(env, scenarios::parked_handoff::ahead(env)).await?)
            } else {
                None
            };
            for r in &mut got {
                link::in_round_trips(r, delay, rtt, idle_rtt);
            }
        }
        for r in &got {
            println!("{}", r.render());
        }
        println!(
            "  ({name}{} took {:.1} s; load average now {})\n",
            match env.processes {
                Some(n) => format!(" with {n} processes"),
                None => String::new(),
            },
            started.elapsed().as_secs_f64(),
            load_average()
        );
        results.append(&mut got);
    }
    Ok(results)
}

/// The private server(s) of a run; dropping it stops them.
enum Servers {
    Single(Box<RedisServer>),
    Cluster(RedisCluster),
    Redlock(Vec<RedisServer>),
}

impl Servers {
    fn describe(&self) -> String {
        match self {
            Servers::Single(redis) => format!("at {} (private)", redis.url()),
            Servers::Cluster(cluster) => format!(
                "Redis Cluster of {} masters (private), seeds {}",
                cluster.nodes().len(),
                cluster.urls().join(" ")
            ),
            Servers::Redlock(members) => format!(
                "Redlock of {} redis-servers (private) at {}; single-node rows on the first",
                members.len(),
                members
                    .iter()
                    .map(RedisServer::url)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        }
    }
}

async fn connect(url: &str) -> Result<redis::aio::MultiplexedConnection> {
    scenarios::common::redis_client(url)?
        .get_multiplexed_async_connection()
        .await
        .map_err(context(&format!("connecting to {url}")))
}

async fn bench(args: Args, command: String) -> Result<()> {
    if args.backend == Backend::Postgres {
        return bench_postgres(args, command).await;
    }
    // The tree as it is when the run starts: what the figures were measured on.
    let commit = args.json.then(results::current_commit);
    let mut members = Vec::new();
    let (servers, env_target, url, addr, mut stats) = match args.backend {
        Backend::Single => {
            let redis = RedisServer::builder()
                .tls(args.tls)
                .spawn()
                .map_err(context("starting a private redis-server"))?;
            if let Some(ca) = redis.ca_cert_pem() {
                scenarios::common::set_tls_ca(ca.to_vec());
            }
            let stats = vec![redis.client().await?];
            let (url, addr) = (redis.url(), redis.addr());
            (
                Servers::Single(Box::new(redis)),
                Target::Single(url.clone()),
                url,
                addr,
                stats,
            )
        }
        Backend::Cluster => {
            let cluster = RedisCluster::spawn()
                .map_err(context("starting a private 3-master Redis Cluster"))?;
            let nodes = cluster.nodes();
            let mut stats = Vec::new();
            for node in &nodes {
                stats.push(connect(&node.url).await?);
            }
            let first = nodes.first().ok_or("the cluster has no node")?;
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], first.port));
            (
                Servers::Cluster(cluster),
                Target::Cluster(nodes.iter().map(|n| n.url.clone()).collect()),
                first.url.clone(),
                addr,
                stats,
            )
        }
        Backend::Postgres => bail!("the PostgreSQL pass runs in bench_postgres"),
        Backend::Redlock => {
            let mut servers = Vec::new();
            let mut stats = Vec::new();
            for _ in 0..REDLOCK_MEMBERS {
                let redis =
                    RedisServer::spawn().map_err(context("starting a private redis-server"))?;
                stats.push(redis.client().await?);
                members.push(redis.addr());
                servers.push(redis);
            }
            let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
            let (url, addr) = (servers[0].url(), servers[0].addr());
            (
                Servers::Redlock(servers),
                Target::Redlock(urls),
                url,
                addr,
                stats,
            )
        }
    };
    // `--link-delay`: every client goes through the proxy; `stats` stays
    // direct (INFO only, never measured).
    let link = match args.link_delay {
        Some(delay) => Some(link::start(addr, delay).await?),
        None => None,
    };
    let (env_target, url, addr) = match &link {
        Some(proxy) => (Target::Single(proxy.url()), proxy.url(), proxy.local_addr()),
        None => (env_target, url, addr),
    };
    scenarios::common::set_direct_lane(args.direct_lane);
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query_async::<String>(&mut stats[0])
        .await?
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:").map(str::to_owned))
        .unwrap_or_default();
    let env = Env {
        target: env_target,
        url,
        addr,
        stats,
        quick: args.quick,
        locks: args.locks,
        members,
        link_delay: args.link_delay,
        no_pin: args.no_pin,
        processes: args.processes,
        tasks: args.tasks,
        tls: args.tls,
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load_start = load_average();
    let at = servers.describe();
    println!(
        "lock-bench: redis {version} {at}, {cpus} CPUs, load average {load_start}{}{}{}{}{}",
        if args.quick { ", --quick" } else { "" },
        match args.link_delay {
            Some(d) => format!(", through a link of {d:?} each way (a delay line), unpinned"),
            None => String::new(),
        },
        if args.direct_lane {
            ""
        } else {
            ", direct lane off"
        },
        if args.no_pin { ", unpinned" } else { "" },
        if args.tls {
            ", TLS (private CA; every client over rustls)"
        } else {
            ""
        },
    );
    println!(
        "ratios in parentheses are to the floor row(s) named under each title, of the same run; lower is better for latencies\n"
    );
    if let Some((kind, tasks, seconds)) = args.profile {
        if env.is_cluster() && kind == scenarios::common::Kind::Rslock {
            bail!("rslock has no Redis Cluster support");
        }
        let allocations = alloc_count::allocations();
        let (n, d) = scenarios::common::profile_loop(&env, kind, tasks, seconds).await?;
        let allocations = alloc_count::allocations() - allocations;
        let per = |x: f64| x * 1e6 / n.max(1) as f64;
        println!(
            "profile: {} x {tasks} tasks: {n} cycles in {seconds} s ({:.0}/s); per cycle: client cpu {:.1} us, redis cpu {:.1} us, {:.2} commands, {:.1} allocations",
            kind.label(),
            n as f64 / seconds,
            per(d.client_cpu_seconds),
            per(d.cpu_seconds),
            d.commands as f64 / n.max(1) as f64,
            allocations as f64 / n.max(1) as f64,
        );
        return Ok(());
    }
    let mut runs = Vec::new();
    for run in 0..args.runs {
        if args.runs > 1 {
            println!("######## run {} of {}\n", run + 1, args.runs);
        }
        runs.push(run_once(&env, &args.scenarios).await?);
    }
    let server = ServerInfo {
        version,
        settings: None,
    };
    finish(&args, command, commit, server, load_start, &runs)?;
    drop(env);
    drop(servers);
    Ok(())
}

/// What the results files say of the server measured on.
struct ServerInfo {
    version: String,
    /// Settings that bound the figures (PostgreSQL: `synchronous_commit`, `fsync`).
    settings: Option<String>,
}

/// `--backend postgres`: a private PostgreSQL, the pass of `src/postgres/`.
async fn bench_postgres(args: Args, command: String) -> Result<()> {
    let commit = args.json.then(results::current_commit);
    if args.profile.is_some() {
        bail!("--profile measures the Redis implementations only");
    }
    let (server, env) = postgres::start(args.quick, args.locks).await?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load_start = load_average();
    println!(
        "lock-bench: PostgreSQL {} at {} (private), {}, {cpus} CPUs, load average {load_start}{}",
        env.version,
        server.url(),
        env.settings,
        if args.quick { ", --quick" } else { "" }
    );
    println!(
        "ratios in parentheses are to the floor row(s) named under each title, of the same run; lower is better for latencies\n"
    );
    let mut runs = Vec::new();
    for run in 0..args.runs {
        if args.runs > 1 {
            println!("######## run {} of {}\n", run + 1, args.runs);
        }
        runs.push(postgres::run_once(&env, &args.scenarios).await?);
    }
    let info = ServerInfo {
        version: env.version.clone(),
        settings: Some(env.settings.clone()),
    };
    finish(&args, command, commit, info, load_start, &runs)?;
    drop(env);
    drop(server);
    Ok(())
}

/// The medians of `--runs N`, the results files and the charts: the same for
/// every backend.
fn finish(
    args: &Args,
    command: String,
    commit: Option<String>,
    server: ServerInfo,
    load_start: String,
    runs: &[Vec<ScenarioResult>],
) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let medians = report::median_of_runs(runs);
    if args.runs > 1 {
        println!("######## medians of {} runs\n", args.runs);
        for (m, targets) in &medians {
            println!("{}", report::render_median(m, targets, args.runs));
        }
    }
    let load_end = load_average();
    println!("load average at start {load_start}, at end {load_end}");
    if let Some(commit) = commit {
        let info = report::RunInfo {
            commit,
            date: results::utc_now(),
            command,
            backend: args.backend.name(),
            nproc: cpus,
            machine: machine(),
            server_version: server.version,
            server_settings: server.settings,
            quick: args.quick,
            runs: args.runs,
            locks: args.locks,
            load_average_start: load_start,
            load_average_end: load_end,
            variant: variant(
                args.link_delay,
                args.direct_lane,
                args.no_pin,
                args.processes,
                args.tls,
            ),
        };
        let dir = args
            .results_dir
            .clone()
            .unwrap_or_else(results::default_dir);
        for path in results::write_all(&dir, &info, &medians, runs)? {
            println!("wrote {}", path.display());
        }
    }
    if let (Some(dir), Some(last)) = (&args.svg, runs.last()) {
        for f in charts::write_all(dir, last)? {
            println!("wrote {f}");
        }
    }
    Ok(())
}

/// `<target dir>/tmp`, from the bench's own path (`<target dir>/<profile>/lock-bench`).
fn target_tmp_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join("tmp"))
}

fn main() -> std::process::ExitCode {
    // distlock's own warnings (a lease lost and why, a renewal that failed or
    // came late) on stderr, when `RUST_LOG` asks for them: what explains a
    // `lost` count in a row.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // The bench re-executed by itself as a worker (modes absent from the usage).
    if argv.first().map(String::as_str) == Some("--worker") {
        // One process of `--processes` (`src/scenarios/processes.rs`).
        return worker_process(
            "worker",
            &argv[1..],
            scenarios::processes::WorkerArgs::parse,
            |a| a.process,
            scenarios::processes::worker,
        );
    }
    if argv.first().map(String::as_str) == Some("--parked-worker") {
        // A waiters' process of `parked-handoff` under `--processes`
        // (`src/scenarios/parked_procs.rs`).
        return worker_process(
            "parked worker",
            &argv[1..],
            scenarios::parked_procs::WorkerArgs::parse,
            |a| a.process,
            scenarios::parked_procs::worker,
        );
    }
    let command = results::command_line(&argv);
    let args = match parse_args(argv.into_iter()) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("lock-bench: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if args.backend == Backend::Postgres {
        // The server's data directory goes under TMPDIR: on the target directory's
        // disk, where commits' WAL flushes cost what they cost on a real disk (a
        // tmpfs /tmp would make them free). Set before any thread exists.
        if let Some(dir) = target_tmp_dir() {
            if std::fs::create_dir_all(&dir).is_ok() {
                std::env::set_var("TMPDIR", &dir);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lock-bench: cannot start tokio: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bench(args, command)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lock-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A worker process of either kind: `rest` parsed (exit code 2 if it does
/// not), then `work` on a tokio runtime of its own, its error on stderr under
/// `lock-bench {what} {process}` (the parent points at stderr when a worker
/// fails).
fn worker_process<A, F>(
    what: &str,
    rest: &[String],
    parse: fn(&[String]) -> Option<A>,
    process: fn(&A) -> u32,
    work: fn(A) -> F,
) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<()>>,
{
    let Some(args) = parse(rest) else {
        eprintln!("lock-bench {what}: bad arguments {rest:?}");
        return std::process::ExitCode::from(2);
    };
    let process = process(&args);
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(error::BoxError::from)
        .and_then(|rt| rt.block_on(work(args)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lock-bench {what} {process}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Args>> {
        parse_args(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn arguments() -> Result<()> {
        let Some(a) = parse(&[
            "--quick",
            "--scenario",
            "handoff,renewal",
            "--json",
            "--locks",
            "5000",
        ])?
        else {
            bail!("expected arguments");
        };
        assert!(a.quick);
        assert_eq!(a.scenarios, ["handoff", "renewal"]);
        assert_eq!(a.runs, 1);
        assert_eq!(a.locks, Some(5000));
        assert_eq!(a.backend, Backend::Single);
        let Some(c) = parse(&["--backend", "cluster"])? else {
            bail!("expected arguments");
        };
        assert_eq!(c.backend, Backend::Cluster);
        let Some(r) = parse(&["--backend", "redlock", "--quick"])? else {
            bail!("expected arguments");
        };
        assert_eq!(r.backend, Backend::Redlock);
        let Some(p) = parse(&["--backend", "postgres", "--quick"])? else {
            bail!("expected arguments");
        };
        assert_eq!(p.backend, Backend::Postgres);
        assert!(parse(&["--backend", "sentinel"]).is_err());
        assert!(parse(&["--locks", "0"]).is_err());
        assert!(parse(&["--scenario", "nope"]).is_err());
        assert!(parse(&["--runs", "0"]).is_err());
        assert!(a.json);
        assert_eq!(a.results_dir, None);
        let Some(d) = parse(&["--json", "--results-dir", "/tmp/r"])? else {
            bail!("expected arguments");
        };
        assert_eq!(d.results_dir, Some(PathBuf::from("/tmp/r")));
        assert!(parse(&["--results-dir", "/tmp/r"]).is_err());
        assert!(parse(&["--json", "--results-dir"]).is_err());
        assert!(parse(&["--help"])?.is_none());
        let Some(l) = parse(&["--link-delay", "100us", "--direct-lane", "off", "--no-pin"])? else {
            bail!("expected arguments");
        };
        assert_eq!(l.link_delay, Some(std::time::Duration::from_micros(100)));
        assert!(!l.direct_lane);
        assert!(a.direct_lane && a.link_delay.is_none());
        assert!(l.no_pin && !a.no_pin);
        assert_eq!(
            variant(l.link_delay, l.direct_lane, l.no_pin, None, false).as_deref(),
            Some("link-100us-lane-off")
        );
        assert_eq!(
            variant(
                Some(std::time::Duration::from_millis(1)),
                true,
                false,
                None,
                false
            )
            .as_deref(),
            Some("link-1ms")
        );
        assert_eq!(
            variant(None, false, true, None, false).as_deref(),
            Some("lane-off-unpinned")
        );
        assert_eq!(variant(None, true, false, None, false), None);
        assert_eq!(
            variant(None, true, false, Some(4), false).as_deref(),
            Some("procs4")
        );
        assert_eq!(
            variant(None, true, false, None, true).as_deref(),
            Some("tls")
        );
        let Some(t) = parse(&["--tls", "--quick"])? else {
            bail!("expected arguments");
        };
        assert!(t.tls && !a.tls);
        assert!(parse(&["--tls", "--backend", "cluster"]).is_err());
        assert!(parse(&["--tls", "--processes", "2"]).is_err());
        let Some(m) = parse(&["--processes", "4", "--tasks", "8"])? else {
            bail!("expected arguments");
        };
        assert_eq!((m.processes, m.tasks), (Some(4), 8));
        assert_eq!(a.processes, None);
        assert!(parse(&["--processes", "0"]).is_err());
        assert!(parse(&["--processes", "2", "--backend", "cluster"]).is_err());
        assert_eq!(
            parse_duration("1.5ms"),
            Some(std::time::Duration::from_micros(1500))
        );
        assert_eq!(parse_duration("0"), Some(std::time::Duration::ZERO));
        assert!(parse(&["--link-delay", "1 ms"]).is_err());
        assert!(parse(&["--link-delay", "1ms", "--backend", "cluster"]).is_err());
        assert!(parse(&["--direct-lane", "maybe"]).is_err());
        let Some(all) = parse(&[])? else {
            bail!("expected arguments");
        };
        assert_eq!(all.scenarios.len(), scenarios::ALL.len());
        Ok(())
    }

    /// What `--json` writes, `bench-history` reads: the medians' rows, the
    /// run information, one file per scenario, a --quick run under its own name.
    #[test]
    fn results_files_are_read_back_by_the_history() -> Result<()> {
        use report::{Better, Row, ScenarioResult};
        let scenario = |floor_p50: f64, distlock_p50: f64| ScenarioResult {
            name: "uncontended",
            title: "one task".to_owned(),
            notes: vec!["a note".to_owned()],
            rows: vec![
                {
                    let mut row = Row::new("same-scripts floor");
                    row.push("p50 us", floor_p50, Better::Lower);
                    row
                },
                {
                    let mut row = Row::new("distlock");
                    row.push("p50 us", distlock_p50, Better::Lower).push(
                        "rt/op",
                        f64::NAN,
                        Better::Neutral,
                    );
                    row
                },
            ],
            references: 1,
            targets: Vec::new(),
        };
        let runs = vec![vec![scenario(40.0, 42.0)], vec![scenario(40.0, 46.0)]];
        let medians = report::median_of_runs(&runs);
        let dir = std::env::temp_dir().join(format!(
            "lock-bench-results-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let info = report::RunInfo {
            commit: "c4d49e1-dirty".to_owned(),
            date: lock_results::utc_date(1_800_000_000),
            command: "lock-bench --runs 2 --json".to_owned(),
            backend: "single",
            nproc: 2,
            machine: "AMD EPYC, boot 0123abcd".to_owned(),
            server_version: "7.0.15".to_owned(),
            server_settings: None,
            quick: false,
            runs: 2,
            locks: None,
            load_average_start: "0.5 0.5 0.5".to_owned(),
            load_average_end: "0.6 0.5 0.5".to_owned(),
            variant: None,
        };
        let written = results::write_all(&dir, &info, &medians, &runs);
        let quick = report::RunInfo {
            quick: true,
            ..info.clone()
        };
        let written_quick = results::write_all(&dir, &quick, &medians, &runs);
        let read = history::load_dir(&dir);
        let text = std::fs::read_to_string(dir.join("c4d49e1-dirty-uncontended.json"));
        let _ = std::fs::remove_dir_all(&dir);

        assert_eq!(written?, [dir.join("c4d49e1-dirty-uncontended.json")]);
        assert_eq!(
            written_quick?,
            [dir.join("c4d49e1-dirty-uncontended-quick.json")]
        );
        let doc: serde_json::Value = serde_json::from_str(&text?)?;
        assert_eq!(doc["command"], "lock-bench --runs 2 --json");
        assert_eq!(doc["server_version"], "7.0.15");
        assert_eq!(doc["nproc"], 2);
        assert_eq!(doc["per_run"].as_array().map(Vec::len), Some(2));
        assert_eq!(doc["per_run"][1][1]["metrics"][0]["value"], 46.0);

        let query = history::Query {
            scenario: "uncontended".to_owned(),
            figure: "p50 us".to_owned(),
            ..history::Query::default()
        };
        let records = read?;
        let (columns, lines) = history::history(&records, &query);
        assert_eq!(columns, ["same-scripts floor"]);
        assert_eq!(lines.len(), 1, "the --quick file is not in the history");
        assert_eq!(lines[0].commit, "c4d49e1-dirty");
        assert_eq!(lines[0].date, "2027-01-15T08:00:00Z");
        // The median of 42 and 46, over the floor's 40.
        assert_eq!(lines[0].value, Some(44.0));
        assert_eq!(lines[0].ratios, [Some(1.1)]);
        let unmeasured = history::Query {
            figure: "rt/op".to_owned(),
            ..query
        };
        assert_eq!(history::history(&records, &unmeasured).1[0].value, None);
        Ok(())
    }
}
