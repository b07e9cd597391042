//! What each part of the default lock's protocol costs the server, without the
//! client in the way: `SET ... NX PX` + release pairs sent in pipelines of 200
//! by 4 tasks to a private redis-server (`REDIS_SERVER_BIN` picks the binary),
//! so that system calls are shared by many commands and the commands' own work
//! shows. Redis CPU per cycle is `INFO cpu` (`used_cpu_sys + used_cpu_user`)
//! over the cycles; variants run interleaved, 9 rounds, medians printed.
//!
//! ```sh
//! cargo run --release -p lock-bench --example server_cost
//! ```
//!
//! Variants (each a free lock taken and released, never contended):
//! * `minimal`: `SET name owner NX PX` (20-byte value) and a compare-and-delete
//!   script, on a name as long as distlock's (the minimal floor of lock-bench).
//! * `distlock`: the runtime's commands for a hold that did not wait:
//!   `SET name value NX PX GET` (the lock's value: owner, mark, token, time,
//!   holder) and `release_free.lua` (the lock's key alone, the owner token
//!   followed by `-`, a string reply).
//! * `distlock, full release`: the same with `release.lua` as sent for a hold
//!   that waited (four keys: the lock, its fencing counter, its queue and the
//!   queue's entries), as every release was before `release_free.lua`.
//! * `distlock before a2c6fad`: the release as it was (the wake-up channel,
//!   `keep_ms`, the hand-off base and the events channel sent as arguments, an
//!   `{1, owner}` reply, `string.sub` tests).
//! * `fast path, 4 keys` and `fast path, 1 key`: release.lua's fast path alone,
//!   with its four keys declared or only the lock's: what the three keys a
//!   hand-off needs declared cost every release.

use std::time::Instant;

use distlock_testing::RedisServer;
use redis::aio::MultiplexedConnection;
use redis::Value;

const TASKS: usize = 4;
const BATCH: usize = 200;
const BATCHES: usize = 60;
const ROUNDS: usize = 9;

/// release.lua as the runtime sends it (fast path first, then the helpers).
const RELEASE: &str = concat!(
    include_str!("../../lock-runtime/src/scripts/release.lua"),
    include_str!("../../lock-runtime/src/scripts/shared_prelude.lua"),
    include_str!("../../lock-runtime/src/scripts/queue_prelude.lua"),
    include_str!("../../lock-runtime/src/scripts/release_queue.lua")
);

const RELEASE_FREE: &str = include_str!("../../lock-runtime/src/scripts/release_free.lua");

/// The fast path of release.lua before a2c6fad, followed by today's helpers
/// (never reached here: the fast path returns first).
const RELEASE_BEFORE: &str = concat!(
    "local owner = ARGV[1]
local owner_len = string.len(owner)
local events = ARGV[5] or ''
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' then
  held = false
end
local ours = held and string.sub(held, 1, owner_len) == owner
if ours and string.sub(held, owner_len + 1, owner_len + 1) ~= '+' and (tonumber(ARGV[3]) or 0) <= 0 then
  redis.call('DEL', KEYS[1])
  if events ~= '' then
    redis.call('PUBLISH', events, 'released')
  end
  return {1, owner}
end
",
    include_str!("../../lock-runtime/src/scripts/shared_prelude.lua"),
    "return {0, owner}"
);

/// release.lua's fast path alone.
const FAST_PATH: &str = "local owner = ARGV[1]
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'string' and string.find(held, owner, 1, true) == 1
    and string.byte(held, #owner + 1) ~= 43 and not ARGV[2] then
  redis.call('DEL', KEYS[1])
  return owner
end
return {0, owner}";

const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

#[derive(Clone, Copy, Debug)]
enum Variant {
    Minimal,
    Distlock,
    DistlockFullRelease,
    DistlockBefore,
    FastPathFourKeys,
    FastPathOneKey,
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::Minimal,
        Variant::Distlock,
        Variant::DistlockFullRelease,
        Variant::DistlockBefore,
        Variant::FastPathFourKeys,
        Variant::FastPathOneKey,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::Minimal => "minimal (SET NX PX + compare-and-delete)",
            Variant::Distlock => "distlock (SET NX PX GET + release_free.lua)",
            Variant::DistlockFullRelease => "distlock, full release (release.lua)",
            Variant::DistlockBefore => "distlock before a2c6fad",
            Variant::FastPathFourKeys => "fast path, 4 keys declared",
            Variant::FastPathOneKey => "fast path, 1 key declared",
        }
    }
}

/// A lock's name as distlock builds it (`<prefix>lock:{<tag>}:<key>`), and
/// one of its sibling names.
fn name(kind: &str, i: usize) -> String {
    let tag = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("distlock:{kind}:{{{tag:016x}}}:order:{i}")
}

async fn server_cpu_seconds(conn: &mut MultiplexedConnection) -> redis::RedisResult<f64> {
    let text: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    Ok(text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum())
}

async fn load(conn: &mut MultiplexedConnection, source: &str) -> redis::RedisResult<String> {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query_async(conn)
        .await
}

/// Redis CPU per cycle, in microseconds.
async fn measure(
    conn: &MultiplexedConnection,
    shas: &[String; 5],
    variant: Variant,
) -> redis::RedisResult<f64> {
    let mut control = conn.clone();
    let before = server_cpu_seconds(&mut control).await?;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let mut conn = conn.clone();
        let shas = shas.clone();
        tasks.push(tokio::spawn(async move {
            let owner = format!("{:032x}", (task as u128 + 1) * 0x1234_5678_9abc_def1);
            let value = format!("{owner}-0:1764000000000:bench-host pid 12345 lock-bench");
            let claim = format!("{owner}-");
            for _ in 0..BATCHES {
                let mut take = redis::pipe();
                let mut give = redis::pipe();
                for b in 0..BATCH {
                    let i = task * BATCH + b;
                    let lock = name("lock", i);
                    let all_keys = [
                        lock.clone(),
                        name("fence", i),
                        name("lockq", i),
                        name("lockqe", i),
                    ];
                    let release = give.cmd("EVALSHA");
                    match variant {
                        Variant::Minimal => {
                            take.cmd("SET")
                                .arg(&lock)
                                .arg(&owner[..20])
                                .arg("NX")
                                .arg("PX")
                                .arg(30_000);
                            release.arg(&shas[0]).arg(1).arg(&lock).arg(&owner[..20]);
                            continue;
                        }
                        _ => {
                            take.cmd("SET")
                                .arg(&lock)
                                .arg(&value)
                                .arg("NX")
                                .arg("PX")
                                .arg(30_000)
                                .arg("GET");
                        }
                    }
                    match variant {
                        Variant::Minimal => {}
                        Variant::Distlock => {
                            // The claim: the owner token and the unmarked byte.
                            release.arg(&shas[4]).arg(1).arg(&lock).arg(&claim);
                        }
                        Variant::DistlockFullRelease => {
                            release.arg(&shas[1]).arg(4).arg(&all_keys).arg(&owner);
                        }
                        Variant::DistlockBefore => {
                            release
                                .arg(&shas[2])
                                .arg(4)
                                .arg(&all_keys)
                                .arg(&owner)
                                .arg(name("wake", i))
                                .arg(0)
                                .arg("distlock:handoff")
                                .arg("");
                        }
                        Variant::FastPathFourKeys => {
                            release.arg(&shas[3]).arg(4).arg(&all_keys).arg(&owner);
                        }
                        Variant::FastPathOneKey => {
                            release.arg(&shas[3]).arg(1).arg(&lock).arg(&owner);
                        }
                    }
                }
                let _: Vec<Value> = take.query_async(&mut conn).await?;
                let replies: Vec<Value> = give.query_async(&mut conn).await?;
                let released = |v: &Value| match v {
                    Value::Int(1) | Value::BulkString(_) => true,
                    Value::Array(a) => a.first() == Some(&Value::Int(1)),
                    _ => false,
                };
                if !replies.iter().all(released) {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "a release did not release",
                    )));
                }
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Client, "task", e.to_string()))
        })??;
    }
    let after = server_cpu_seconds(&mut control).await?;
    Ok((after - before) / (TASKS * BATCH * BATCHES) as f64 * 1e6)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = RedisServer::spawn()?;
    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let shas = [
        load(&mut conn, COMPARE_AND_DELETE).await?,
        load(&mut conn, RELEASE).await?,
        load(&mut conn, RELEASE_BEFORE).await?,
        load(&mut conn, FAST_PATH).await?,
        load(&mut conn, RELEASE_FREE).await?,
    ];
    let mut per_variant = vec![Vec::new(); Variant::ALL.len()];
    let started = Instant::now();
    for _ in 0..ROUNDS {
        for (i, variant) in Variant::ALL.iter().enumerate() {
            per_variant[i].push(measure(&conn, &shas, *variant).await?);
        }
    }
    println!(
        "server_cost: {} cycles per variant and round, {ROUNDS} rounds interleaved, {:.0} s; Redis CPU us per cycle, median (min-max)",
        TASKS * BATCH * BATCHES,
        started.elapsed().as_secs_f64()
    );
    let medians: Vec<f64> = per_variant
        .iter_mut()
        .map(|runs| {
            runs.sort_by(f64::total_cmp);
            runs[runs.len() / 2]
        })
        .collect();
    for (i, variant) in Variant::ALL.iter().enumerate() {
        let runs = &per_variant[i];
        println!(
            "{:<42} {:>6.2} ({:.2}-{:.2})  {:.2}x minimal",
            variant.name(),
            medians[i],
            runs[0],
            runs[runs.len() - 1],
            medians[i] / medians[0]
        );
    }
    Ok(())
}
