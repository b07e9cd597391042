//! `parked-handoff` under `--processes N` (`parked-handoff-procsN` in the
//! results files): the hand-off to a parked waiter of `parked_handoff.rs`,
//! with the waiter in another OS process, as between two replicas of a
//! service.
//!
//! The bench re-executes itself as N workers (`lock-bench --parked-worker
//! ...`, a mode absent from the usage). Each worker has its own tokio runtime,
//! its own `LockManager` (B, which acquired once before it says `ready`) and
//! its own floor client, subscribed in advance as the in-process floor's
//! waiter is. Round r's waiters are worker r mod N's: the parent holds the
//! round's key, writes `floor KEY` or `distlock KEY` on the worker's stdin;
//! the worker starts the acquisition in a task of its own (parked, as in
//! `parked-handoff`), says `waiting`, and once the task holds (and has
//! released) says `held T`, T the moment the acquisition returned. The
//! parent releases [`parked_handoff::ahead`] after `waiting`. Rows, round
//! counts, warm-up, key names and targets are `parked-handoff`'s; the holders (the
//! floor's, distlock's A whose manager never waited, and C whose manager
//! waited once) stay in the bench's process, and the three rows alternate
//! round by round.
//!
//! The hand-off's two ends are read from one clock: `CLOCK_MONOTONIC`
//! through `clock_gettime` ([`processes::now`]), which Linux keeps one for
//! the whole machine, so a time read in the worker and one read in the
//! parent subtract exactly (`Instant` is that clock too, but keeps its value
//! private, so it cannot cross a pipe). The other way, the worker's report
//! timed on arrival minus the pipe's one-way latency, is not sound: a pipe
//! has no one-way latency of its own to measure without a shared clock
//! (only a round trip, halved on the guess that both ways cost the same),
//! and the arrival adds the parent's wake-up, whose spread under load (tens
//! of µs) is the size of the loopback hand-off itself; subtracting a
//! median leaves that spread in every round.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::error::{bail, context, BenchError, BoxError, Result};
use crate::floor::{Attempt, Floor, Names, Target};
use crate::report::ScenarioResult;
use crate::scenarios::common::{manager, owner_token, Env, LEASE, LEASE_MS};
use crate::scenarios::parked_handoff::{ahead, measure, result, rounds, wait_once};
use crate::scenarios::processes::{now, spawn_self};

/// Longest a waiter may take; a round that takes longer is an error.
const ROUND_LIMIT: Duration = Duration::from_secs(5);
/// Longest a worker may take to connect, subscribe and acquire once.
const START_LIMIT: Duration = Duration::from_secs(30);

/// The arguments of a worker: `--parked-worker URL PROCESS DIRECT_LANE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerArgs {
    pub url: String,
    pub process: u32,
    pub direct_lane: bool,
}

impl WorkerArgs {
    fn to_args(&self) -> Vec<String> {
        vec![
            "--parked-worker".to_owned(),
            self.url.clone(),
            self.process.to_string(),
            if self.direct_lane { "on" } else { "off" }.to_owned(),
        ]
    }

    /// The arguments after `--parked-worker`.
    pub fn parse(rest: &[String]) -> Option<WorkerArgs> {
        let [url, process, lane] = rest else {
            return None;
        };
        Some(WorkerArgs {
            url: url.clone(),
            process: process.parse().ok()?,
            direct_lane: match lane.as_str() {
                "on" => true,
                "off" => false,
                _ => return None,
            },
        })
    }
}

/// One line to the parent. Blocking, but a few bytes into a pipe the parent
/// reads at once, and never between a release and its hand-off.
fn say(line: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// The worker process: see the module's documentation. Ends when its stdin
/// does.
pub async fn worker(args: WorkerArgs) -> Result<()> {
    crate::scenarios::common::set_direct_lane(args.direct_lane);
    let target = Target::Single(args.url.clone());
    let waiter = Floor::connect(&target).await?;
    let _subscription = waiter
        .subscribe(&args.url, &[], Some("floor:wake:*"))
        .await?;
    let b = manager(&target).await?;
    // B's first acquisition before any round, as `parked-handoff`'s B holds
    // the warm-up lock before its rounds: its hand-off channel is then
    // subscribed and kept.
    b.lock(format!("bench:parked:warm-b{}", args.process))
        .lease(LEASE)
        .acquire()
        .await?
        .release()
        .await?;
    let mut rng = fastrand::Rng::with_seed(u64::from(args.process) << 32 | 13);
    say("ready")?;
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = commands.next_line().await? {
        let Some((kind, key)) = line.split_once(' ') else {
            bail!("parked worker: bad command {line:?}");
        };
        let waiting: tokio::task::JoinHandle<Result<u64>> = match kind {
            "floor" => {
                let (waiter, names, owner) = (
                    waiter.clone(),
                    Names::new("floor:", key),
                    owner_token(&mut rng),
                );
                tokio::spawn(async move {
                    waiter.acquire_by_set_nx(&names, &owner, LEASE_MS).await?;
                    let held = now();
                    waiter.release(&names, &owner).await?;
                    Ok(held)
                })
            }
            "distlock" => {
                let (b, key) = (b.clone(), key.to_owned());
                tokio::spawn(async move {
                    let guard = b.lock(key).lease(LEASE).acquire().await?;
                    let held = now();
                    guard.release().await?;
                    Ok(held)
                })
            }
            _ => bail!("parked worker: bad command {line:?}"),
        };
        say("waiting")?;
        let held = waiting.await??;
        say(&format!("held {held}"))?;
    }
    Ok(())
}

/// The parent's end of one worker.
struct Worker {
    process: usize,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    /// Starts worker `process` and waits for its `ready`.
    async fn spawn(env: &Env, process: usize) -> Result<Worker> {
        let args = WorkerArgs {
            url: env.url.clone(),
            process: process as u32,
            direct_lane: crate::scenarios::common::direct_lane(),
        };
        let (child, stdin, lines) = spawn_self(&args.to_args(), "a parked worker process")?;
        let mut worker = Worker {
            process,
            child,
            stdin,
            lines,
        };
        let line = worker.next_line(START_LIMIT).await?;
        if line != "ready" {
            bail!("parked worker {process} did not start (said {line:?})");
        }
        Ok(worker)
    }

    /// The worker's next line, within `limit`.
    async fn next_line(&mut self, limit: Duration) -> Result<String> {
        let p = self.process;
        match tokio::time::timeout(limit, self.lines.next_line()).await {
            Err(_) => bail!("parked worker {p}: nothing said in {limit:?}"),
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => bail!("parked worker {p} ended; its error is on stderr above"),
            Ok(Err(e)) => Err(context(&format!("reading parked worker {p}"))(e)),
        }
    }

    /// Has the worker start waiting for `key` (`kind`: `floor` or
    /// `distlock`); returns once its waiter's task is spawned.
    async fn start(&mut self, kind: &str, key: &str) -> Result<()> {
        self.stdin
            .write_all(format!("{kind} {key}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let line = self.next_line(ROUND_LIMIT).await?;
        if line != "waiting" {
            bail!(
                "parked worker {}: expected waiting, got {line:?}",
                self.process
            );
        }
        Ok(())
    }

    /// When the worker's waiter held the lock (`CLOCK_MONOTONIC`, ns).
    async fn held(&mut self) -> Result<u64> {
        let line = self.next_line(ROUND_LIMIT).await?;
        line.strip_prefix("held ")
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| {
                BoxError::from(BenchError(format!(
                    "parked worker {}: expected held, got {line:?}",
                    self.process
                )))
            })
    }

    /// Closes its stdin (its end) and waits for its exit.
    async fn finish(self) -> Result<()> {
        let Worker {
            process,
            mut child,
            stdin,
            ..
        } = self;
        drop(stdin);
        let status = tokio::time::timeout(ROUND_LIMIT, child.wait())
            .await
            .map_err(context(&format!("parked worker {process} did not exit")))??;
        if !status.success() {
            bail!("parked worker {process} failed ({status}); its error is on stderr above");
        }
        Ok(())
    }
}

/// One floor round on `key`: `holder` takes it, `worker`'s floor waiter
/// waits, `ahead` later `holder` releases; the hand-off latency.
async fn floor_round(
    holder: &Floor,
    worker: &mut Worker,
    key: &str,
    ahead: Duration,
    rng: &mut fastrand::Rng,
) -> Result<Duration> {
    let names = Names::new("floor:", key);
    let owner = owner_token(rng);
    if !matches!(
        holder.try_acquire(&names, &owner, LEASE_MS, false).await?,
        Attempt::Acquired
    ) {
        bail!("parked hand-off floor: the new key {key} was busy");
    }
    worker.start("floor", key).await?;
    tokio::time::sleep(ahead).await;
    let released = now();
    if !holder.release(&names, &owner).await? {
        bail!("parked hand-off floor: the holder's release of {key} found it gone");
    }
    let held = worker.held().await?;
    Ok(Duration::from_nanos(held.saturating_sub(released)))
}

/// One distlock round on `key`: `holder` holds, `worker`'s manager B waits,
/// `ahead` later `holder` releases; the hand-off latency.
async fn distlock_round(
    holder: &distlock::LockManager,
    worker: &mut Worker,
    key: &str,
    ahead: Duration,
) -> Result<Duration> {
    let guard = holder.lock(key).lease(LEASE).acquire().await?;
    worker.start("distlock", key).await?;
    tokio::time::sleep(ahead).await;
    let released = now();
    guard.release().await?;
    let held = worker.held().await?;
    Ok(Duration::from_nanos(held.saturating_sub(released)))
}

/// `parked-handoff` with its waiters in `processes` worker processes.
pub async fn run(env: &Env, processes: usize) -> Result<ScenarioResult> {
    env.flush().await?;
    let (rounds, warmup) = rounds(env);
    let ahead = ahead(env);
    let mut workers = Vec::with_capacity(processes);
    for p in 0..processes {
        workers.push(Worker::spawn(env, p).await?);
    }

    let holder = Floor::connect(&env.target).await?;
    // A only ever holds; C waits once (for A) before the measurement, then
    // only holds.
    let a = manager(&env.target).await?;
    let c = manager(&env.target).await?;
    wait_once(&a, &c, ahead).await?;

    let mut rng = fastrand::Rng::with_seed(11);
    let (latencies, seconds) = measure(warmup, rounds, async |round| {
        let worker = &mut workers[round % processes];
        let f = floor_round(
            &holder,
            worker,
            &format!("bench:parked:f{round}"),
            ahead,
            &mut rng,
        )
        .await?;
        let n = distlock_round(&a, worker, &format!("bench:parked:a{round}"), ahead).await?;
        let w = distlock_round(&c, worker, &format!("bench:parked:c{round}"), ahead).await?;
        Ok([f, n, w])
    })
    .await?;
    for worker in workers {
        worker.finish().await?;
    }
    env.flush().await?;

    Ok(result(
        env,
        format!(
            "a hand-off to a parked waiter in another OS process ({processes} worker process{}, each the bench re-executed with its own manager and floor client; round r's waiters in worker r mod {processes}), unpinned: the waiter starts {} ms before the release; {rounds} rounds each (after {warmup} warm-up), the three rows alternating, {seconds:.1} s",
            if processes == 1 { "" } else { "es" },
            ahead.as_secs_f64() * 1e3
        ),
        vec![
            "hand-off: from the start of the holder's release (in the bench's process) to the waiter holding the lock (in a worker's); both ends read CLOCK_MONOTONIC, one clock across the processes; nothing pinned to a CPU".to_owned(),
            "floor: the worker's waiter in a task of its own, subscribed in advance (a pattern over every key's wake-up channel), SET NX busy, marks the lock with distlock's acquire script, and takes it with SET NX when the release's message arrives".to_owned(),
            "distlock: the holder's manager never waited (or, last row, waited once before); the waiter, the worker's manager (it acquired once before the rounds), queues and is handed the lock by the release's message".to_owned(),
        ],
        &latencies,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_arguments_round_trip() {
        let a = WorkerArgs {
            url: "redis://127.0.0.1:7000".to_owned(),
            process: 2,
            direct_lane: false,
        };
        let args = a.to_args();
        assert_eq!(args[0], "--parked-worker");
        assert_eq!(WorkerArgs::parse(&args[1..]), Some(a));
        assert_eq!(WorkerArgs::parse(&args[2..]), None);
        assert_eq!(
            WorkerArgs::parse(&["u".to_owned(), "1".to_owned(), "maybe".to_owned()]),
            None
        );
    }
}
