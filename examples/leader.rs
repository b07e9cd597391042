//! Leader election across real OS processes.
//!
//! Three candidate processes campaign for `scheduler`; the one that leads
//! ticks with its epoch. This process watches the election: when a leader
//! shows up, it lets it tick a few times and kills it with `kill -9`. Another
//! candidate takes over once the dead leader's lease runs out (one second
//! here), with a larger epoch; it is killed in turn, and the last one takes
//! over. Exits non-zero if a takeover is late, an epoch does not grow, or the
//! watch misses a term.
//!
//! ```sh
//! cargo run --example leader
//! ```
//!
//! The example re-executes itself as the candidate processes.

mod support;

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use distlock::{LeaderInfo, LockManager};
use futures_util::StreamExt;

const LEASE: Duration = Duration::from_secs(1);
const CANDIDATES: [&str; 3] = ["candidate-a", "candidate-b", "candidate-c"];

/// A candidate: leads whenever it can, ticking with its epoch.
async fn candidate(url: &str, name: &str) -> Result<(), distlock::LockError> {
    let manager = LockManager::builder(url)
        .key_prefix(support::PREFIX)
        .holder(name)
        .build()
        .await?;
    let election = manager.leader("scheduler").lease(LEASE);
    election
        .run(|term| async move {
            for tick in 1.. {
                println!("  {name}: leading, epoch {}, tick {tick}", term.epoch());
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        })
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, url, name] = args.as_slice() {
        if flag == "--candidate" {
            return match candidate(url, name).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{name}: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    }
    match watch_and_kill().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("FAILED: {problem}");
            ExitCode::FAILURE
        }
    }
}

async fn watch_and_kill() -> Result<(), String> {
    let (url, _server) = support::redis_url();
    let manager = LockManager::builder(&url)
        .key_prefix(support::PREFIX)
        .holder("watcher")
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let mut watch = manager.leader("scheduler").watch();
    if let Some(leader) = next(&mut watch).await? {
        return Err(format!(
            "{} leads before any candidate started",
            leader.holder
        ));
    }

    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children: Vec<(&str, Child)> = Vec::new();
    for name in CANDIDATES {
        let child = Command::new(&exe)
            .args(["--candidate", &url, name])
            .spawn()
            .map_err(|e| format!("start {name}: {e}"))?;
        children.push((name, child));
    }
    println!("3 candidates campaign for `scheduler` (lease {LEASE:?}); killing each leader in turn with kill -9.");

    let mut last_epoch = 0;
    let mut killed_at: Option<Instant> = None;
    let mut result = Ok(());
    for _ in CANDIDATES {
        let leader = loop {
            // A vacancy (the dead leader's lease ran out before the next
            // candidate's announcement) may come first.
            if let Some(leader) = next(&mut watch).await? {
                break leader;
            }
            println!("watch: nobody leads");
        };
        let took = killed_at.map(|at| at.elapsed());
        println!(
            "watch: {} leads, epoch {}{}",
            leader.holder,
            leader.epoch,
            took.map(|t| format!(", {} ms after the kill", t.as_millis()))
                .unwrap_or_default()
        );
        if leader.epoch <= last_epoch {
            result = Err(format!("epoch {} after {last_epoch}", leader.epoch));
            break;
        }
        // The dead leader's lease ends at most one lease after its last
        // renewal, which came before the kill; the next candidate retries by
        // then (its waits are capped by the holder's remaining lease). A
        // second more covers a loaded machine.
        if let Some(took) = took {
            if took > LEASE + Duration::from_secs(1) {
                result = Err(format!("the takeover took {took:?}"));
                break;
            }
        }
        last_epoch = leader.epoch;
        tokio::time::sleep(Duration::from_millis(400)).await; // a few ticks
        let Some(index) = children.iter().position(|(name, _)| *name == leader.holder) else {
            result = Err(format!("{} is not a candidate", leader.holder));
            break;
        };
        let (name, mut child) = children.swap_remove(index);
        child.kill().map_err(|e| format!("kill {name}: {e}"))?;
        let _ = child.wait();
        killed_at = Some(Instant::now());
        println!("watch: killed {name} (kill -9)");
    }
    for (_, mut child) in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    if result.is_ok() {
        println!("Every takeover within the lease, every epoch larger than the last.");
    }
    result
}

/// The watch's next report, or an error after 10 s (a takeover takes about a
/// lease; a report follows within milliseconds).
async fn next(watch: &mut distlock::LeaderWatch) -> Result<Option<LeaderInfo>, String> {
    match tokio::time::timeout(Duration::from_secs(10), watch.next()).await {
        Ok(Some(report)) => Ok(report),
        Ok(None) => Err("the watch ended".into()),
        Err(_) => Err("no leader change within 10 s".into()),
    }
}
