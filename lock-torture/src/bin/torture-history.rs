//! `torture-history`: one figure of one torture scenario across commits, from
//! the results files the scenarios write under `TORTURE_RESULTS`
//! (`lock-torture/results/`).
//!
//! ```text
//! cargo run -p lock-torture --bin torture-history -- [--dir DIR] SCENARIO FIGURE
//! cargo run -p lock-torture --bin torture-history -- [--dir DIR] --check
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use lock_torture::results;

const USAGE: &str = "\
usage: torture-history [--dir DIR] SCENARIO FIGURE
       torture-history [--dir DIR] --check

  SCENARIO     a scenario as its TORTURE line names it: s0_control, s1_baseline,
               s7_kill9_cluster, s10_semaphore, ...
  FIGURE       a field of that line: sections, overlaps, stale_writes_accepted,
               leaked_locks, lost, secs, ...
  --dir DIR    the results directory (default: lock-torture/results)
  --check      parse every results file and print what they hold; exit 1 if one does not parse

Prints one line per results file, sorted by date: commit, date, nproc, server,
build (profile, soak factor) and the figure.";

enum Mode {
    History { scenario: String, figure: String },
    Check,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<(PathBuf, Mode)>, String> {
    let mut dir = results::default_dir();
    let mut check = false;
    let mut positional = Vec::new();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--dir" => dir = it.next().ok_or("--dir needs a value")?.into(),
            "--check" => check = true,
            "-h" | "--help" => return Ok(None),
            other if other.starts_with("--") => return Err(format!("unknown option {other:?}")),
            _ => positional.push(arg),
        }
    }
    let mode = match (check, positional.as_slice()) {
        (true, []) => Mode::Check,
        (false, [scenario, figure]) => Mode::History {
            scenario: scenario.clone(),
            figure: figure.clone(),
        },
        (true, _) => return Err("--check takes no SCENARIO or FIGURE".to_owned()),
        (false, _) => return Err("expected SCENARIO and FIGURE".to_owned()),
    };
    Ok(Some((dir, mode)))
}

fn main() -> ExitCode {
    let (dir, mode) = match parse_args(std::env::args().skip(1)) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("torture-history: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let records = match results::load_dir(&dir) {
        Ok(records) => records,
        Err(e) => {
            eprintln!("torture-history: {e}");
            return ExitCode::FAILURE;
        }
    };
    match mode {
        Mode::Check => {
            let mut commits: Vec<&str> = records.iter().map(|r| r.commit.as_str()).collect();
            commits.sort_unstable();
            commits.dedup();
            let mut scenarios: Vec<&str> = records.iter().map(|r| r.scenario.as_str()).collect();
            scenarios.sort_unstable();
            scenarios.dedup();
            println!(
                "{}: {} results files parse ({} commits; scenarios: {})",
                dir.display(),
                records.len(),
                commits.len(),
                if scenarios.is_empty() {
                    "none".to_owned()
                } else {
                    scenarios.join(", ")
                }
            );
            ExitCode::SUCCESS
        }
        Mode::History { scenario, figure } => {
            let table = results::history(&records, &scenario, &figure);
            if table.is_empty() {
                eprintln!(
                    "torture-history: no results of scenario {scenario:?} in {}",
                    dir.display()
                );
                return ExitCode::FAILURE;
            }
            print!("{table}");
            ExitCode::SUCCESS
        }
    }
}
