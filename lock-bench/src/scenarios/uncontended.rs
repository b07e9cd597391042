//! Scenario `uncontended`: one task, acquire+release of one key.

use crate::error::Result;
use crate::report::{Check, Row, ScenarioResult, Target};
use crate::scenarios::common::{round_trips_per_cycle, run_interleaved, Cycler, Env, Kind};

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    let (cycles, block, warmup) = if env.quick {
        (600, 200, 100)
    } else {
        (20_000, 1_000, 500)
    };
    let key = "bench:uncontended";
    let cluster = env.is_cluster();
    // rslock has no Redis Cluster support.
    let kinds: &[Kind] = if cluster {
        &[Kind::Floor, Kind::Minimal, Kind::Distlock]
    } else {
        &[Kind::Floor, Kind::Minimal, Kind::Distlock, Kind::Rslock]
    };
    let mut cyclers = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        cyclers.push(Cycler::connect(*kind, &env.target, key, i as u64).await?);
    }
    let m = run_interleaved(env, cyclers, warmup, cycles, block).await?;
    let mut rows = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let rt = round_trips_per_cycle(env, *kind, key, if env.quick { 50 } else { 500 }).await?;
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
                "cluster floor: distlock's own Lua scripts called by hand with EVALSHA through redis-rs's async ClusterConnection: what the library costs on top of its protocol on a cluster".to_owned(),
                "minimal floor: SET key owner NX PX + compare-and-delete script through the same ClusterConnection".to_owned(),
                "cmds/op, evalsha/op and redis cpu are summed over the 3 masters; rt/op is not reported: the cluster client learns node addresses from CLUSTER SLOTS and would go around a counting proxy".to_owned(),
                "no rslock row: rslock has no Redis Cluster support".to_owned(),
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
    Ok(ScenarioResult {
        name: "uncontended",
        title,
        notes: vec![
            "same-scripts floor: distlock's own Lua scripts called by hand (redis-rs, one multiplexed connection): what the library costs on top of its protocol".to_owned(),
            "minimal floor: SET key owner NX PX + compare-and-delete script: the least a lock can do (no fencing token, no re-entry, no wake-up)".to_owned(),
            "cmds/op counts script-internal commands (INFO commandstats); rt/op is counted through a RESP-parsing proxy in a separate pass".to_owned(),
            "rslock takes the lock with SET NX PX (no script), so its cmds/op is lower by design".to_owned(),
        ],
        rows,
        references: 2,
        targets: vec![
            Target::ratio("distlock p50 <= 1.05x same-scripts floor", d, "p50 us", f, Check::AtMost(1.05)),
            Target::ratio("distlock p50 <= 1.0x rslock p50", d, "p50 us", p, Check::AtMost(1.0)),
            Target::ratio(
                "distlock client CPU/cycle <= 1.15x same-scripts floor",
                d,
                "client cpu us/op",
                f,
                Check::AtMost(1.15),
            ),
        ],
    })
}
