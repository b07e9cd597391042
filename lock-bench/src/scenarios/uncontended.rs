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
    let kinds = [Kind::Floor, Kind::Distlock, Kind::Rslock];
    let mut cyclers = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        cyclers.push(Cycler::connect(*kind, &env.url, key, i as u64).await?);
    }
    let m = run_interleaved(env, cyclers, warmup, cycles, block).await?;
    let mut rows = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let rt = round_trips_per_cycle(env, *kind, key, if env.quick { 50 } else { 500 }).await?;
        rows.push(Row::standard(
            kind.label(),
            m.ops[i],
            m.seconds[i],
            m.hist[i].clone(),
            m.redis[i],
            Some(rt),
        ));
    }
    let d = Kind::Distlock.label().to_owned();
    let f = Kind::Floor.label().to_owned();
    Ok(ScenarioResult {
        name: "uncontended",
        title: format!("one task, acquire+release of one key, {cycles} cycles each, interleaved in blocks of {block}"),
        notes: vec![
            "cmds/op counts script-internal commands (INFO commandstats); rt/op is counted through a RESP-parsing proxy in a separate pass".to_owned(),
            "rslock takes the lock with SET NX PX (no script), so its cmds/op is lower by design".to_owned(),
        ],
        rows,
        targets: vec![
            Target::ratio("distlock p50 <= 1.1x floor", &d, "p50 us", &f, Check::AtMost(1.1)),
            Target::absolute(
                "distlock EVALSHA calls per cycle = 2",
                &d,
                "evalsha/op",
                Check::Equals(2.0),
            ),
            Target::absolute("distlock round trips per cycle = 2", &d, "rt/op", Check::Equals(2.0)),
        ],
    })
}
