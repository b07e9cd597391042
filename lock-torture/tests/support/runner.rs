//! The scenario runner: the phases every scenario goes through, whatever it
//! injects between them. Start the workers and await their `READY`; await
//! their progress; stop them (or let them finish their sections) and collect
//! their `DRAINED` figures; judge the history (the checker), the fenced store
//! and what is left in the lock target; print the figures ([`torture_line`],
//! which also keeps them as data when `TORTURE_RESULTS` asks for it).

use std::sync::Mutex;
use std::time::Duration;

use lock_torture::checker::{check_sections, Faults, Report, StoreReport};
use lock_torture::clock::mono_ns;
use lock_torture::history::{History, Outcome};
use lock_torture::process::Worker;
use lock_torture::results::{self, RunInfo};

use super::{finish, history, leaked_locks, progress, ready, store_report, Setup};

/// Starts `workers` (already spawned) and waits until each is ready.
pub async fn ready_all(mut workers: Vec<Worker>) -> Vec<Worker> {
    ready(&mut workers.iter_mut().collect::<Vec<_>>()).await;
    workers
}

/// Waits for `n` more progress marks from every worker, each within `limit`.
pub async fn progress_all(workers: &mut [Worker], n: usize, limit: Duration) {
    for w in workers {
        progress(w, n, limit).await;
    }
}

/// Tells every worker to stop, then waits for each to exit cleanly; their
/// `DRAINED` figures (ms, tasks left).
pub async fn stop_all(workers: &mut [Worker], limit: Duration) -> Vec<(u64, u64)> {
    for w in workers.iter_mut() {
        w.send("stop");
    }
    finish_all(workers, limit).await
}

/// Waits for every worker to end its sections and exit cleanly; their
/// `DRAINED` figures (ms, tasks left).
pub async fn finish_all(workers: &mut [Worker], limit: Duration) -> Vec<(u64, u64)> {
    let mut drains = Vec::new();
    for w in workers {
        drains.push(finish(w, limit).await);
    }
    drains
}

/// The merged logs of `workers`.
pub fn history_of(workers: &[Worker]) -> History {
    history(&workers.iter().collect::<Vec<_>>())
}

/// Judges a run's history against `faults`: the checker's report on its
/// sections, the fenced store's report (already checked against the clients:
/// no disagreement, no stale write accepted), and the locks left in the lock
/// target.
pub async fn judge(
    setup: &Setup,
    h: &History,
    keys: &[String],
    faults: &Faults,
) -> (Report, StoreReport, Vec<String>) {
    (
        check_sections(&h.sections, faults),
        store_report(setup, h, keys).await,
        leaked_locks(setup, keys).await,
    )
}

/// The exact counter: every completed section added one, nothing else did
/// (no write rejected, no update lost).
pub fn assert_exact_counter(report: &Report, stored: &StoreReport) {
    let ok = report.count(Outcome::Ok) as u64;
    assert_eq!(
        stored.value, ok,
        "the protected counters sum to the completed sections"
    );
    assert_eq!(stored.accepted as u64, ok);
    assert_eq!((stored.rejected, stored.lost_updates), (0, 0));
}

/// Every worker exited with no background task left.
pub fn assert_drained(workers: &[Worker], drains: &[(u64, u64)]) {
    for (w, (_, left)) in workers.iter().zip(drains) {
        assert_eq!(
            *left, 0,
            "worker {} exited with background tasks left",
            w.id
        );
    }
}

/// The longest drain of `drains`, in ms.
pub fn longest_drain(drains: &[(u64, u64)]) -> u64 {
    drains.iter().map(|d| d.0).max().unwrap_or(0)
}

/// How many sections of `key` were granted after `t` (monotonic ns).
pub fn granted_after(h: &History, key: &str, t: u64) -> usize {
    h.sections
        .iter()
        .filter(|s| s.key == key && s.acquired > t)
        .count()
}

/// A worker of a load with timeouts: `keys` (comma-separated), `lease`,
/// `wait`, `timeout` to connect and for each command, 20 ms between retries,
/// seeded by the worker's id; `more` gives the scenario's tasks, bodies and
/// progress interval.
pub fn timed_load(
    id: u32,
    keys: &str,
    (lease, wait, timeout): (Duration, Duration, Duration),
    more: &[(&'static str, &dyn ToString)],
) -> Vec<(&'static str, String)> {
    let mut all = super::args(&[
        ("keys", &keys),
        ("lease-ms", &lease.as_millis()),
        ("wait-ms", &wait.as_millis()),
        ("cmd-timeout-ms", &timeout.as_millis()),
        ("connect-timeout-ms", &timeout.as_millis()),
        ("retry-ms", &20),
        ("seed", &(id + 1)),
    ]);
    all.extend(super::args(more));
    all
}

/// Starts `workers` and `others` (already spawned) and waits until every one
/// of them is ready.
pub async fn ready_all_beside(mut workers: Vec<Worker>, others: &mut [&mut Worker]) -> Vec<Worker> {
    let mut all: Vec<&mut Worker> = workers.iter_mut().collect();
    all.extend(others.iter_mut().map(|w| &mut **w));
    ready(&mut all).await;
    workers
}

/// Every key of `keys` was granted at least `at_least` times after `t` (the
/// end of a fault, named by `fault` in the message).
pub fn assert_every_key_granted_after(
    h: &History,
    keys: &[String],
    t: u64,
    at_least: usize,
    fault: &str,
) {
    for key in keys {
        let n = granted_after(h, key, t);
        assert!(n >= at_least, "{key}: only {n} sections after the {fault}");
    }
}

/// Updates were lost only where a fault forgot a lock (at most one per
/// overlap it excused), `across` it (named in the message).
pub fn assert_lost_updates_within_amnesia(report: &Report, stored: &StoreReport, across: &str) {
    assert!(
        stored.lost_updates <= report.amnesia_overlaps.len(),
        "{} lost updates, {} overlaps across {across}",
        stored.lost_updates,
        report.amnesia_overlaps.len()
    );
}

/// Sleeps until the monotonic clock reads `t` (ns); at once if it has.
pub async fn sleep_until(t: u64) {
    tokio::time::sleep(Duration::from_nanos(t.saturating_sub(mono_ns()))).await;
}

/// `<n>cancel+<n>panic`: the faults the workers injected into their own
/// bodies, for the `TORTURE` line.
pub fn cancels_and_panics(report: &Report) -> String {
    format!(
        "{}cancel+{}panic",
        report.count(Outcome::Cancelled),
        report.count(Outcome::Panicked)
    )
}

/// One scenario at a time: they measure time, and the machine has 2 cores.
/// Its guard ([`Scenario`]) also writes the results files of the scenario it
/// guarded, once the scenario has ended without a panic.
pub struct Serial(tokio::sync::Mutex<()>);

impl Serial {
    pub const fn new() -> Serial {
        Serial(tokio::sync::Mutex::const_new(()))
    }

    /// Waits for the scenario before to end.
    pub async fn lock(&'static self) -> Scenario {
        Scenario {
            _serial: self.0.lock().await,
        }
    }

    /// [`Serial::lock`] outside a runtime (a plain `#[test]`).
    pub fn blocking_lock(&'static self) -> Scenario {
        Scenario {
            _serial: self.0.blocking_lock(),
        }
    }
}

/// A running scenario: when it is dropped at the end of the scenario's test,
/// the figures it printed ([`torture_line`]) are written as results files if
/// `TORTURE_RESULTS` asks for them and the test did not panic (a failed
/// scenario's figures are no run to keep).
pub struct Scenario {
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let printed = std::mem::take(&mut *PRINTED.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(dir) = results::dir_from_env() else {
            return;
        };
        if std::thread::panicking() {
            for p in &printed {
                println!(
                    "torture: no results file for {}: the scenario failed",
                    p.scenario
                );
            }
            return;
        }
        let info = RunInfo::current();
        for p in printed.iter().filter(|p| p.figures.is_some()) {
            let figures = p.figures.as_deref().unwrap_or_default();
            match results::write(&dir, &info, &p.scenario, figures, &p.rounds) {
                Ok(path) => println!("torture: results written to {}", path.display()),
                // A test that asked for its results and cannot have them fails.
                Err(e) => panic!(
                    "writing the results of {} into {}: {e}",
                    p.scenario,
                    dir.display()
                ),
            }
        }
    }
}

/// What one scenario printed so far: its rounds' lines and its own.
struct Printed {
    scenario: String,
    rounds: Vec<(usize, String)>,
    figures: Option<String>,
}

/// The figures printed since the running [`Scenario`] began.
static PRINTED: Mutex<Vec<Printed>> = Mutex::new(Vec::new());

/// Prints a scenario's figures as its `TORTURE` line: `TORTURE <scenario>:
/// <figures>`, or `TORTURE <scenario> round <r>: <figures>` for one round of
/// it (`figures` are `key=value` fields), and keeps them for the results file
/// the [`Scenario`] guard writes at the end (`lock_torture::results`).
pub fn torture_line(scenario: &str, round: Option<usize>, figures: &str) {
    match round {
        Some(r) => println!("TORTURE {scenario} round {r}: {figures}"),
        None => println!("TORTURE {scenario}: {figures}"),
    }
    let mut printed = PRINTED.lock().unwrap_or_else(|e| e.into_inner());
    let index = match printed.iter().position(|p| p.scenario == scenario) {
        Some(index) => index,
        None => {
            printed.push(Printed {
                scenario: scenario.to_owned(),
                rounds: Vec::new(),
                figures: None,
            });
            printed.len() - 1
        }
    };
    match round {
        Some(r) => printed[index].rounds.push((r, figures.to_owned())),
        None => printed[index].figures = Some(figures.to_owned()),
    }
}
