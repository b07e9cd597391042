//! `--processes N`: the `handoff` and `many-keys` scenarios with N OS
//! processes, as a service's replicas share a lock.
//!
//! The bench re-executes itself as N workers (`lock-bench --worker ...`, a
//! mode absent from the usage), each with its own tokio runtime and its own
//! `LockManager` (or rslock manager), running [`TASKS`] tasks (`--tasks`).
//! A worker builds its manager, says `ready` on stdout, waits for `go` on
//! stdin (so that every process starts at once, after every connection is
//! made), loops acquire / empty body / release for the round's time, then
//! prints every acquisition it made: key, task, wait start, holding, release
//! start. The times are `CLOCK_MONOTONIC`, one clock for every process of the
//! machine, so the parent can merge the processes' acquisitions of a key in
//! holding order and tell the hand-offs and re-grabs.
//!
//! * `handoff` (`handoff-procsN` in the results files): every task on one key.
//! * `many-keys` (`many-keys-procsN`): every task on a key drawn uniformly
//!   from [`KEYS`].
//!
//! Per row: throughput, hand-off p50 (release start -> another task, waiting
//! at the release, holds the same key), wait p50 / max / max over mean, re-grabs (a task takes the key
//! again right after its own release while a task of any process was waiting
//! for it) and the fewest acquisitions of a process over the mean. A hand-off
//! is two consecutive holders of a key that are different tasks, the second
//! waiting when the first released; `cross-proc %` is the share of them
//! between processes.
//!
//! distlock and rslock alternate in rounds of 2 s (3 each, after a 0.3 s
//! warm-up each; `--quick`: one round of 0.3 s). There is no floor row: a
//! by-hand floor across processes is not written, and the in-process
//! `handoff` scenario has the true hand-off floor.

use std::io::{BufRead, Write};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::error::{bail, context, BoxError, Result};
use crate::report::{new_histogram, us, Better, Check, Row, ScenarioResult, Target};
use crate::scenarios::common::{manager, Env, LEASE};

/// Tasks per process unless `--tasks` says otherwise.
pub const TASKS: usize = 8;
/// Keys of `many-keys-procs`.
pub const KEYS: usize = 1_000;
const HANDOFF_KEY: &str = "bench:procs:handoff";

/// One acquisition, as a worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub key: u32,
    pub process: u32,
    pub task: u32,
    /// Nanoseconds of `CLOCK_MONOTONIC`: the acquire call starts.
    pub wait_start: u64,
    /// The acquire call returned (the lock is held).
    pub held: u64,
    /// The release call starts (the body is empty).
    pub release: u64,
}

/// `CLOCK_MONOTONIC` in nanoseconds: the same clock in every process.
pub fn now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Which library a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    Distlock,
    Rslock,
}

impl Library {
    fn arg(self) -> &'static str {
        match self {
            Library::Distlock => "distlock",
            Library::Rslock => "rslock",
        }
    }

    fn parse(s: &str) -> Option<Library> {
        match s {
            "distlock" => Some(Library::Distlock),
            "rslock" => Some(Library::Rslock),
            _ => None,
        }
    }
}

/// The arguments of a worker: `--worker LIBRARY URL KEYS TASKS MILLIS PROCESS DIRECT_LANE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerArgs {
    pub library: Library,
    pub url: String,
    pub keys: usize,
    pub tasks: usize,
    pub millis: u64,
    pub process: u32,
    pub direct_lane: bool,
}

impl WorkerArgs {
    fn to_args(&self) -> Vec<String> {
        vec![
            "--worker".to_owned(),
            self.library.arg().to_owned(),
            self.url.clone(),
            self.keys.to_string(),
            self.tasks.to_string(),
            self.millis.to_string(),
            self.process.to_string(),
            if self.direct_lane { "on" } else { "off" }.to_owned(),
        ]
    }

    /// The arguments after `--worker`.
    pub fn parse(rest: &[String]) -> Option<WorkerArgs> {
        let [library, url, keys, tasks, millis, process, lane] = rest else {
            return None;
        };
        Some(WorkerArgs {
            library: Library::parse(library)?,
            url: url.clone(),
            keys: keys.parse().ok().filter(|&k| k > 0)?,
            tasks: tasks.parse().ok().filter(|&t| t > 0)?,
            millis: millis.parse().ok()?,
            process: process.parse().ok()?,
            direct_lane: match lane.as_str() {
                "on" => true,
                "off" => false,
                _ => return None,
            },
        })
    }
}

fn key_name(keys: usize, k: u32) -> String {
    if keys == 1 {
        HANDOFF_KEY.to_owned()
    } else {
        format!("bench:procs:{k}")
    }
}

/// The worker process: see the module's documentation.
pub async fn worker(args: WorkerArgs) -> Result<()> {
    crate::scenarios::common::set_direct_lane(args.direct_lane);
    let target = crate::floor::Target::Single(args.url.clone());
    #[derive(Clone)]
    enum Imp {
        Distlock(distlock::LockManager),
        Rslock(rslock::LockManager),
    }
    let imp = match args.library {
        Library::Distlock => Imp::Distlock(manager(&target).await?),
        Library::Rslock => Imp::Rslock(crate::scenarios::common::rslock_manager(&args.url)?),
    };
    let keys: std::sync::Arc<Vec<String>> = std::sync::Arc::new(
        (0..args.keys as u32)
            .map(|k| key_name(args.keys, k))
            .collect(),
    );
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready")?;
        out.flush()?;
    }
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    if line.trim() != "go" {
        bail!("worker: expected go, got {line:?}");
    }
    let deadline = now() + args.millis * 1_000_000;
    let mut handles = Vec::new();
    for task in 0..args.tasks as u32 {
        let (imp, keys, process) = (imp.clone(), keys.clone(), args.process);
        handles.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(u64::from(process) << 32 | u64::from(task));
            let mut events = Vec::new();
            while now() < deadline {
                let k = rng.u32(..keys.len() as u32);
                let key = &keys[k as usize];
                let wait_start = now();
                let release = match &imp {
                    Imp::Distlock(m) => {
                        let guard = m.lock(key).lease(LEASE).acquire().await?;
                        let held = now();
                        guard.release().await?;
                        held
                    }
                    Imp::Rslock(m) => {
                        let lock = m.acquire_no_guard(key.as_str(), LEASE).await?;
                        let held = now();
                        m.unlock(&lock).await;
                        held
                    }
                };
                // The body is empty: the release started when the lock was held.
                events.push(Event {
                    key: k,
                    process,
                    task,
                    wait_start,
                    held: release,
                    release,
                });
            }
            Ok::<_, BoxError>(events)
        }));
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for h in handles {
        for e in h.await?? {
            writeln!(
                out,
                "{} {} {} {} {}",
                e.key, e.task, e.wait_start, e.held, e.release
            )?;
        }
    }
    writeln!(out, "done")?;
    out.flush()?;
    Ok(())
}

/// One round: `processes` workers of `library` for `duration`; every
/// acquisition they made.
async fn round(
    env: &Env,
    library: Library,
    processes: usize,
    tasks: usize,
    keys: usize,
    duration: Duration,
) -> Result<Vec<Event>> {
    let mut children = Vec::new();
    for p in 0..processes {
        let args = WorkerArgs {
            library,
            url: env.url.clone(),
            keys,
            tasks,
            millis: duration.as_millis() as u64,
            process: p as u32,
            direct_lane: crate::scenarios::common::direct_lane(),
        };
        let (child, stdin, mut lines) = spawn_self(&args.to_args(), "a worker process")?;
        children.push((child, stdin, lines_ready(&mut lines).await.map(|()| lines)?));
    }
    // Every worker is connected and waiting: start them together.
    for (_, stdin, _) in &mut children {
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
    }
    let mut events = Vec::new();
    for (p, (mut child, _stdin, mut lines)) in children.into_iter().enumerate() {
        let mut done = false;
        while let Some(line) = lines.next_line().await? {
            if line == "done" {
                done = true;
                break;
            }
            events.push(parse_event(&line, p as u32).ok_or_else(|| {
                crate::error::BenchError(format!("worker {p}: bad line {line:?}"))
            })?);
        }
        let status = child.wait().await?;
        if !done || !status.success() {
            bail!("worker {p} failed ({status}); its error is on stderr above");
        }
    }
    env.flush().await?;
    Ok(events)
}

/// The bench's own executable started as a worker (`args`, its mode first),
/// its stdin and stdout piped, killed if dropped; `what` names it in errors.
pub(super) fn spawn_self(
    args: &[String],
    what: &str,
) -> Result<(Child, ChildStdin, Lines<BufReader<ChildStdout>>)> {
    let exe = std::env::current_exe().map_err(context("finding the bench's own executable"))?;
    let mut child = tokio::process::Command::new(&exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(context(&format!("starting {what}")))?;
    let stdin = child.stdin.take().ok_or("a worker without stdin")?;
    let stdout = child.stdout.take().ok_or("a worker without stdout")?;
    Ok((child, stdin, BufReader::new(stdout).lines()))
}

async fn lines_ready(lines: &mut Lines<BufReader<ChildStdout>>) -> Result<()> {
    match lines.next_line().await? {
        Some(l) if l == "ready" => Ok(()),
        other => bail!("a worker did not start (said {other:?}); its error is on stderr above"),
    }
}

fn parse_event(line: &str, process: u32) -> Option<Event> {
    let mut it = line.split(' ').map(str::parse::<u64>);
    let mut next = || it.next()?.ok();
    Some(Event {
        key: u32::try_from(next()?).ok()?,
        process,
        task: u32::try_from(next()?).ok()?,
        wait_start: next()?,
        held: next()?,
        release: next()?,
    })
}

/// What the acquisitions of one round (or several) say.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Figures {
    pub acquisitions: u64,
    /// Consecutive holders of a key that are different tasks, the second
    /// waiting when the first released: the hand-off latencies (release start
    /// -> held), in nanoseconds.
    pub handoffs: Vec<u64>,
    /// Of those, between tasks of different processes.
    pub cross_process: u64,
    pub regrabs: u64,
    pub waits: Vec<u64>,
    /// Acquisitions per process.
    pub per_process: Vec<u64>,
}

/// Merges the processes' acquisitions key by key in holding order.
pub fn analyse(mut events: Vec<Event>, processes: usize) -> Figures {
    let mut f = Figures {
        acquisitions: events.len() as u64,
        per_process: vec![0; processes],
        ..Figures::default()
    };
    for e in &events {
        if let Some(n) = f.per_process.get_mut(e.process as usize) {
            *n += 1;
        }
        f.waits.push(e.held.saturating_sub(e.wait_start));
    }
    events.sort_by_key(|e| (e.key, e.held));
    for chunk in events.chunk_by(|a, b| a.key == b.key) {
        // From the end: the earliest wait start among the later acquisitions,
        // and the earliest among those of another task than that one's, so
        // that "another task was waiting at the release" is one comparison.
        let mut later: Vec<[(u64, u64); 2]> = vec![[(u64::MAX, u64::MAX); 2]; chunk.len() + 1];
        for i in (0..chunk.len()).rev() {
            let mut best = later[i + 1];
            let who = task_id(&chunk[i]);
            let here = (chunk[i].wait_start, who);
            if here.0 < best[0].0 {
                if best[0].1 != who {
                    best[1] = best[0];
                }
                best[0] = here;
            } else if here.0 < best[1].0 && best[0].1 != who {
                best[1] = here;
            }
            later[i] = best;
        }
        for i in 1..chunk.len() {
            let (a, b) = (&chunk[i - 1], &chunk[i]);
            if task_id(a) == task_id(b) {
                // Another task waited at the release if one of the later
                // acquisitions (after b) of another task started waiting before it.
                let [first, second] = later[i + 1];
                let other = if first.1 != task_id(a) { first } else { second };
                if other.0 < a.release {
                    f.regrabs += 1;
                }
            } else if b.wait_start <= a.release {
                // b was waiting when a released: a hand-off. Otherwise the
                // key lay free in between (many keys), which measures nothing.
                f.handoffs.push(b.held.saturating_sub(a.release));
                if a.process != b.process {
                    f.cross_process += 1;
                }
            }
        }
    }
    f
}

fn task_id(e: &Event) -> u64 {
    u64::from(e.process) << 32 | u64::from(e.task)
}

impl Figures {
    fn add(&mut self, other: Figures) {
        self.acquisitions += other.acquisitions;
        self.handoffs.extend(other.handoffs);
        self.cross_process += other.cross_process;
        self.regrabs += other.regrabs;
        self.waits.extend(other.waits);
        if self.per_process.len() < other.per_process.len() {
            self.per_process.resize(other.per_process.len(), 0);
        }
        for (a, b) in self.per_process.iter_mut().zip(other.per_process) {
            *a += b;
        }
    }

    fn row(&self, label: &str, seconds: f64) -> Result<Row> {
        let mut waits = new_histogram()?;
        for &w in &self.waits {
            waits.saturating_record(w);
        }
        let mut handoffs = new_histogram()?;
        for &h in &self.handoffs {
            handoffs.saturating_record(h);
        }
        let mean_per_process =
            self.per_process.iter().sum::<u64>() as f64 / self.per_process.len().max(1) as f64;
        let fewest = self.per_process.iter().copied().min().unwrap_or(0) as f64;
        let nan_if_empty = |h: &hdrhistogram::Histogram<u64>, q: f64| {
            if h.is_empty() {
                f64::NAN
            } else {
                us(h.value_at_quantile(q))
            }
        };
        let mut row = Row::new(label);
        row.push(
            "acq/s",
            self.acquisitions as f64 / seconds.max(1e-9),
            Better::Higher,
        )
        .push(
            "handoff p50 us",
            nan_if_empty(&handoffs, 0.5),
            Better::Lower,
        )
        .push(
            "handoff p99 us",
            nan_if_empty(&handoffs, 0.99),
            Better::Lower,
        )
        .push(
            "cross-proc %",
            100.0 * self.cross_process as f64 / self.handoffs.len().max(1) as f64,
            Better::Neutral,
        )
        .push("regrabs", self.regrabs as f64, Better::Lower)
        .push("wait p50 us", nan_if_empty(&waits, 0.5), Better::Lower)
        .push("wait max us", us(waits.max()), Better::Lower)
        .push(
            "max/mean wait",
            waits.max() as f64 / waits.mean().max(1.0),
            Better::Lower,
        )
        .push(
            "acq/proc min/mean",
            fewest / mean_per_process.max(1.0),
            Better::Higher,
        );
        row.histogram = Some(handoffs);
        Ok(row)
    }
}

/// `handoff` (`keys` 1) or `many-keys` (`keys` [`KEYS`]) with `processes`
/// processes of `tasks` tasks each, distlock and rslock in alternating rounds.
pub async fn run(
    env: &Env,
    many_keys: bool,
    processes: usize,
    tasks: usize,
) -> Result<ScenarioResult> {
    env.flush().await?;
    let keys = if many_keys { KEYS } else { 1 };
    let (rounds, slice, warm) = if env.quick {
        (1, Duration::from_millis(300), Duration::from_millis(100))
    } else {
        (3, Duration::from_secs(2), Duration::from_millis(300))
    };
    let shape = format!("{processes} processes x {tasks} tasks");
    let labels = [
        format!("distlock ({shape}, a manager each)"),
        format!("rslock 0.10 ({shape}, a manager each)"),
    ];
    let libraries = [Library::Distlock, Library::Rslock];
    let mut totals = vec![Figures::default(), Figures::default()];
    let mut seconds = [0.0f64; 2];
    for &library in &libraries {
        round(env, library, processes, tasks, keys, warm).await?;
    }
    for r in 0..rounds {
        for k in 0..libraries.len() {
            let i = (k + r) % libraries.len();
            let events = round(env, libraries[i], processes, tasks, keys, slice).await?;
            totals[i].add(analyse(events, processes));
            seconds[i] += slice.as_secs_f64();
        }
    }
    let rows = labels
        .iter()
        .zip(&totals)
        .zip(seconds)
        .map(|((l, t), s)| t.row(l, s))
        .collect::<Result<Vec<_>>>()?;
    let d = &labels[0];
    let mut targets = vec![
        Target::absolute(
            &format!("{d}: 0 re-grabs"),
            d,
            "regrabs",
            Check::AtMost(0.0),
        ),
        Target::absolute(
            &format!("{d}: max wait <= 5x the mean wait"),
            d,
            "max/mean wait",
            Check::AtMost(5.0),
        ),
        Target::absolute(
            &format!("{d}: every process within 0.9x of the mean acquisitions"),
            d,
            "acq/proc min/mean",
            Check::AtLeast(0.9),
        ),
    ];
    if !many_keys {
        targets.push(Target::ratio(
            &format!("{d}: max wait below rslock's"),
            d,
            "wait max us",
            &labels[1],
            Check::Below(1.0),
        ));
    }
    let what = if many_keys {
        format!("a key drawn uniformly from {KEYS}")
    } else {
        "one key".to_owned()
    };
    Ok(ScenarioResult {
        // The run's variant (`procsN`) follows in the results file's name.
        name: if many_keys { "many-keys" } else { "handoff" },
        title: format!(
            "{what}; {shape} (each process the bench re-executed as a worker, its own manager) loop acquire / empty body / release; hand-off = release start -> another task, waiting at the release, holds the key"
        ),
        notes: vec![
            "times are CLOCK_MONOTONIC, one clock across the processes; every worker connects before any starts".to_owned(),
            "re-grab: a task holds the key again right after its own release while a task of any process waited for it".to_owned(),
            "acq/s: acquisitions of every process over the rounds' time; acq/proc min/mean: the fewest acquisitions of a process over the mean".to_owned(),
            "rslock waits by retrying SET NX after a random 0-200 ms sleep (its defaults)".to_owned(),
            "no floor row: the rows are compared with each other (the floor's hand-off lives in the in-process `handoff` scenario)".to_owned(),
        ],
        rows,
        references: 0,
        targets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(key: u32, process: u32, task: u32, wait_start: u64, held: u64) -> Event {
        Event {
            key,
            process,
            task,
            wait_start,
            held,
            release: held,
        }
    }

    #[test]
    fn hand_offs_regrabs_and_fairness() {
        let events = vec![
            // Key 0: p0t0 holds at 10, p1t0 (waiting since 5) holds at 14:
            // a cross-process hand-off of 4.
            ev(0, 0, 0, 0, 10),
            ev(0, 1, 0, 5, 14),
            // p1t0 again at 20 while p0t1 waits since 12: a re-grab.
            ev(0, 1, 0, 15, 20),
            ev(0, 0, 1, 12, 30),
            // p0t1 again at 40, nobody else waiting (p1t0 starts at 45): no re-grab.
            ev(0, 0, 1, 31, 40),
            ev(0, 1, 0, 45, 50),
            // Key 1: the second holder came after the release: no hand-off.
            ev(1, 0, 0, 0, 3),
            ev(1, 1, 2, 7, 8),
        ];
        let f = analyse(events, 2);
        assert_eq!(f.acquisitions, 8);
        assert_eq!(f.regrabs, 1);
        // 10 -> 14 and 20 -> 30, both across processes; 40 -> 50 is none
        // (p1t0 started waiting at 45, after the release).
        assert_eq!(f.handoffs, [4, 10]);
        assert_eq!(f.cross_process, 2);
        assert_eq!(f.per_process, [4, 4]);
        let row = f.row("x", 1.0).expect("a row");
        assert_eq!(row.get("regrabs"), Some(1.0));
        assert_eq!(row.get("acq/proc min/mean"), Some(1.0));
        let lopsided = analyse(
            vec![ev(0, 0, 0, 0, 1), ev(0, 0, 0, 2, 3), ev(0, 1, 0, 4, 5)],
            2,
        );
        assert_eq!(lopsided.per_process, [2, 1]);
        let row = lopsided.row("y", 1.0).expect("a row");
        assert_eq!(row.get("acq/proc min/mean"), Some(1.0 / 1.5));
    }

    #[test]
    fn worker_arguments_round_trip() {
        let a = WorkerArgs {
            library: Library::Rslock,
            url: "redis://127.0.0.1:7000".to_owned(),
            keys: 1000,
            tasks: 8,
            millis: 300,
            process: 3,
            direct_lane: false,
        };
        let args = a.to_args();
        assert_eq!(args[0], "--worker");
        assert_eq!(WorkerArgs::parse(&args[1..]), Some(a));
        assert_eq!(WorkerArgs::parse(&args[2..]), None);
        assert_eq!(
            parse_event("7 2 1 5 9", 4),
            Some(ev(7, 4, 2, 1, 5)).map(|e| Event { release: 9, ..e })
        );
        assert_eq!(parse_event("7 2 x 5 9", 4), None);
    }
}
