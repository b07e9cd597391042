//! Scenario `uncontended`: one task, acquire+release of one key.

use crate::error::Result;
use crate::report::{Check, Row, ScenarioResult, Target};
use crate::scenarios::common::{
    redlock_round_trips_per_cycle, round_trips_per_cycle, run_interleaved, Cycler, Env, Kind,
};

/// The single-node row of `--backend redlock` (distlock on one of the members).
pub const SINGLE_NODE_LABEL: &str = "distlock single-node (builder, member 1)";
/// The Redlock row of `--backend redlock`.
pub const REDLOCK_LABEL: &str = "distlock Redlock (redlock_builder, 5 members)";

/// Cycles of the round-trip count's pass: a count that does not drift needs
/// few; through a link under --quick, fewer (see `run`).
fn rt_cycles(env: &Env) -> u64 {
    match (env.quick, env.link_delay.is_some()) {
        (true, true) => 10,
        (true, false) => 50,
        (false, _) => 500,
    }
}

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    // --quick through a link: a tenth of the cycles, which each cost two of
    // its round trips (about 8.5 ms through `--link-delay 1ms`: 600 cycles
    // of six rows took 23 s, where a --quick pass should take under 20 s).
    let (cycles, block, warmup) = match (env.quick, env.link_delay.is_some()) {
        (true, true) => (60, 20, 10),
        (true, false) => (600, 200, 100),
        (false, _) => (20_000, 1_000, 500),
    };
    let key = "bench:uncontended";
    if env.is_redlock() {
        return redlock(env, key, cycles, block, warmup).await;
    }
    let cluster = env.is_cluster();
    // rslock has no Redis Cluster support.
    let kinds: &[Kind] = if cluster {
        &[
            Kind::Floor,
            Kind::Minimal,
            Kind::Distlock,
            Kind::DistlockEager,
        ]
    } else if env.tls {
        // The raw-socket floor writes plain RESP on a TcpStream.
        &[
            Kind::Floor,
            Kind::Minimal,
            Kind::Distlock,
            Kind::DistlockEager,
            Kind::Rslock,
        ]
    } else {
        &[
            Kind::Floor,
            Kind::Minimal,
            Kind::Distlock,
            Kind::DistlockEager,
            Kind::Rslock,
            Kind::RawMinimal,
        ]
    };
    let mut cyclers = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        cyclers.push(Cycler::connect(*kind, &env.target, key, i as u64).await?);
    }
    let m = run_interleaved(env, cyclers, warmup, cycles, block, true).await?;
    let mut rows = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let rt = round_trips_per_cycle(env, *kind, key, rt_cycles(env)).await?;
        rows.push(Row::standard(
            env.label(*kind),
            m.ops[i],
            m.seconds[i],
            m.hist[i].clone(),
            m.redis[i],
            rt,
        ));
    }
    let d = Kind::Distlock.label();
    let f = env.label(Kind::Floor);
    let p = Kind::Rslock.label();
    let title = format!("one task, acquire+release of one key, {cycles} cycles each, interleaved in blocks of {block}");
    if cluster {
        return Ok(ScenarioResult {
            name: "uncontended-cluster",
            title: format!("{title}; on a 3-master Redis Cluster"),
            notes: vec![
                "cluster floor: distlock's own Lua scripts called by hand with EVALSHA over one connection per master, routed by a slot map read once (as distlock routes): what the library costs on top of its protocol on a cluster".to_owned(),
                "minimal floor: SET key owner NX PX + compare-and-delete script over the same connections".to_owned(),
                "cmds/op, evalsha/op and redis cpu are summed over the 3 masters; rt/op is not reported: the cluster client learns node addresses from CLUSTER SLOTS and would go around a counting proxy".to_owned(),
                "no rslock row: rslock has no Redis Cluster support".to_owned(),
                m.cpu_note(),
            ],
            rows,
            references: 2,
            targets: vec![Target::ratio(
                "distlock p50 <= 1.1x cluster floor",
                d,
                "p50 us",
                f,
                Check::AtMost(1.1),
            )],
        });
    }
    let mut notes = vec![
            "same-scripts floor: distlock's own Lua scripts called by hand (redis-rs, one multiplexed connection): what the library costs on top of its protocol".to_owned(),
            "minimal floor: SET key owner NX PX + compare-and-delete script: the least a lock can do (no fencing token, no re-entry, no wake-up)".to_owned(),
            "cmds/op counts script-internal commands (INFO commandstats); rt/op is counted through a RESP-parsing proxy in a separate pass".to_owned(),
            "distlock: the default (a token only on demand; none asked for here): a plain SET NX PX GET, then the release script (GET, DEL)".to_owned(),
            "distlock eager_fencing: the token issued inside the acquisition (a script that reads and writes the fencing counter)".to_owned(),
            "raw-socket floor: the minimal floor's two commands written as RESP on one TcpStream and read in the calling task, without redis-rs: what the multiplexed connection (a channel to its connection task, the reply parser) costs every row above".to_owned(),
            m.cpu_note(),
        ];
    if env.tls {
        // No raw-socket row and no round-trip count over TLS.
        notes.retain(|n| !n.starts_with("raw-socket") && !n.starts_with("cmds/op"));
        notes.push("--tls: every client over rustls, trusting the private server's CA; rt/op not counted (the counting proxy cannot read encrypted replies); no raw-socket floor (plain RESP)".to_owned());
    }
    Ok(ScenarioResult {
        name: "uncontended",
        title,
        notes,
        rows,
        references: 2,
        targets: vec![
            Target::ratio(
                "distlock p50 <= 1.05x same-scripts floor",
                d,
                "p50 us",
                f,
                Check::AtMost(1.05),
            ),
            Target::ratio(
                "distlock p50 <= 1.00x rslock p50",
                d,
                "p50 us",
                p,
                Check::AtMost(1.0),
            ),
            Target::ratio(
                "distlock client CPU/cycle <= 1.10x rslock's",
                d,
                "client cpu us/op",
                p,
                Check::AtMost(1.10),
            ),
            Target::ratio(
                "distlock Redis commands/cycle <= rslock's (no token)",
                d,
                "cmds/op",
                p,
                Check::AtMost(1.0),
            ),
        ],
    })
}

/// `--backend redlock`: distlock on one member (the reference row) and on the
/// Redlock of all five, interleaved.
async fn redlock(
    env: &Env,
    key: &str,
    cycles: u64,
    block: u64,
    warmup: u64,
) -> Result<ScenarioResult> {
    let cyclers = vec![
        Cycler::connect(Kind::Distlock, &env.single_target(), key, 0).await?,
        Cycler::connect(Kind::Distlock, &env.target, key, 1).await?,
    ];
    let m = run_interleaved(env, cyclers, warmup, cycles, block, false).await?;
    let rts = [
        round_trips_per_cycle(env, Kind::Distlock, key, rt_cycles(env)).await?,
        Some(redlock_round_trips_per_cycle(env, key, rt_cycles(env)).await?),
    ];
    let rows = [SINGLE_NODE_LABEL, REDLOCK_LABEL]
        .iter()
        .zip(rts)
        .enumerate()
        .map(|(i, (label, rt))| {
            Row::standard(
                *label,
                m.ops[i],
                m.seconds[i],
                m.hist[i].clone(),
                m.redis[i],
                rt,
            )
        })
        .collect();
    Ok(ScenarioResult {
        name: "uncontended-redlock",
        title: format!(
            "one task, acquire+release of one key, {cycles} cycles each, interleaved in blocks of {block}; Redlock of 5 private redis-servers against distlock on one of them"
        ),
        notes: vec![
            "reference row: distlock built with LockManager::builder on member 1 of the Redlock, in the same run; the Redlock row's ratios are to it".to_owned(),
            "no floor for Redlock (a by-hand Redlock floor is not written): the single-node row is the reference".to_owned(),
            "cmds/op, evalsha/op and redis cpu are summed over the 5 members; rt/op of the Redlock row is summed over them too (a counting proxy in front of every member, in a separate pass): acquire on 5, fence write-back on the granting majority, release on 5".to_owned(),
            "the members are independent processes on the same machine: they share its cores with the client".to_owned(),
        ],
        rows,
        references: 1,
        targets: Vec::new(),
    })
}
