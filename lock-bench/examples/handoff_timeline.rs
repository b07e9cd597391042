//! Where a parked hand-off's time goes: the `parked-handoff` scenario's
//! distlock row, round by round, with each round's moments on the clock that
//! `perf` stamps its events with (`CLOCK_MONOTONIC`), so that the scheduler's
//! events of a round (which thread woke which, and when it ran) can be read
//! between them.
//!
//! ```sh
//! cargo build --release -p lock-bench --example handoff_timeline
//! perf record -k CLOCK_MONOTONIC -e sched:sched_waking,sched:sched_switch -a \
//!     -o /tmp/timeline.data -- target/release/examples/handoff_timeline > /tmp/rounds.txt
//! perf script -i /tmp/timeline.data --ns -F pid,tid,cpu,time,event,trace > /tmp/timeline.txt
//! python3 lock-bench/examples/handoff_timeline.py /tmp/rounds.txt /tmp/timeline.txt
//! ```
//!
//! Holder A (its manager never waited) and waiter B (another manager of the
//! same process, as in the bench) on a private redis-server; B starts to wait
//! 5 ms before A releases, so that its task and threads are parked, as in the
//! bench. Each line of stdout is a round: `handoff round t0 released t1
//! holder_tid waiter_tid`, times in ns: `t0` just before A's release,
//! `released` when it returned, `t1` when B's `acquire` returned, and the
//! threads that ran A's release and B's return. Each hand-off round is
//! followed by a `ping round t0 answered t1 tid tid` round: after the same
//! 5 ms asleep, a `PING` on a redis-rs connection of its own (`t1` =
//! `answered`), the least a call costs after the same quiet spell. A line
//! `redis <pid> bench <pid>` first names the server's process and this one.

use std::time::Duration;

use distlock::LockManager;
use distlock_testing::RedisServer;

const ROUNDS: usize = 300;
const WARM_UP: usize = 20;
const AHEAD: Duration = Duration::from_millis(5);

/// `CLOCK_MONOTONIC` in ns, the clock of `perf record -k CLOCK_MONOTONIC`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// The calling thread's id, as `perf script` prints it.
fn thread_id() -> i64 {
    // SAFETY: gettid has no preconditions.
    i64::from(unsafe { libc::gettid() })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = RedisServer::spawn()?;
    println!(
        "redis {} bench {}",
        server.pid().unwrap_or(0),
        std::process::id()
    );
    let holder = LockManager::builder(&server.url()).build().await?;
    let waiter = LockManager::builder(&server.url()).build().await?;
    let mut pinging = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    for round in 0..WARM_UP + ROUNDS {
        let held = holder.lock("timeline").acquire().await?;
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let guard = waiter.lock("timeline").acquire().await?;
                let at = (monotonic_ns(), thread_id());
                Ok::<_, distlock::LockError>((guard, at))
            })
        };
        tokio::time::sleep(AHEAD).await;
        let (t0, holder_tid) = (monotonic_ns(), thread_id());
        held.release().await?;
        let released = monotonic_ns();
        let (guard, (t1, waiter_tid)) = waiting.await??;
        guard.release().await?;
        tokio::time::sleep(AHEAD).await;
        let (p0, ping_tid) = (monotonic_ns(), thread_id());
        redis::cmd("PING")
            .query_async::<String>(&mut pinging)
            .await?;
        let answered = monotonic_ns();
        if round >= WARM_UP {
            let n = round - WARM_UP;
            println!("handoff {n} {t0} {released} {t1} {holder_tid} {waiter_tid}");
            println!("ping {n} {p0} {answered} {answered} {ping_tid} {ping_tid}");
        }
    }
    Ok(())
}
