//! Scenario `macro`: the uncontended cycle through `#[distributed_lock]`,
//! against the same cycle written by hand with the guard.

use crate::error::Result;
use crate::report::Row;
use crate::report::{Check, ScenarioResult, Target};
use crate::scenarios::common::{round_trips_per_cycle, run_interleaved, Cycler, Env, Kind};

pub async fn run(env: &Env) -> Result<ScenarioResult> {
    env.flush().await?;
    let (cycles, block, warmup) = if env.quick {
        (600, 200, 100)
    } else {
        (20_000, 1_000, 500)
    };
    // The attribute locks "bench:{i}" with i = 0: the manual guard uses that key.
    let key = "bench:0";
    let kinds = [Kind::Floor, Kind::Distlock, Kind::Macro];
    let mut cyclers = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        cyclers.push(
            Cycler::connect(
                *kind,
                &env.target,
                key,
                if *kind == Kind::Macro { 0 } else { i as u64 },
            )
            .await?,
        );
    }
    let m = run_interleaved(env, cyclers, warmup, cycles, block, true).await?;
    let mut rows = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let rt = round_trips_per_cycle(env, *kind, key, if env.quick { 50 } else { 500 }).await?;
        let label = match kind {
            Kind::Distlock => "distlock manual guard",
            k => k.label(),
        };
        rows.push(Row::standard(
            label,
            m.ops[i],
            m.seconds[i],
            m.hist[i].clone(),
            m.redis[i],
            rt,
        ));
    }
    let exp = Kind::Macro.label().to_owned();
    let manual = "distlock manual guard".to_owned();
    Ok(ScenarioResult {
        name: "macro",
        title: format!(
            "one task, acquire+release of one key through the macro's code, {cycles} cycles each"
        ),
        notes: vec![
            "the manual guard is `manager.lock(\"bench:0\").lease(30s).acquire()` + `release()`; the attribute also formats the key and runs the body under `scope_until_lost`".to_owned(),
            m.cpu_note(),
        ],
        rows,
        references: 1,
        targets: vec![
            Target::ratio(
                "#[distributed_lock] p50 <= 1.03x the manual guard",
                &exp,
                "p50 us",
                &manual,
                Check::AtMost(1.03),
            ),
            // Cycle time is 1 / (ops/s): the manual guard's ops/s over the macro's.
            Target::times_better(
                "#[distributed_lock] mean cycle time <= 1.03x the manual guard",
                &exp,
                "ops/s",
                &manual,
                Check::AtMost(1.03),
            ),
        ],
    })
}
