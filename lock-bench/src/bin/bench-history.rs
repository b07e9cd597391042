//! `bench-history`: one figure of lock-bench across commits, from the results
//! files that `lock-bench --json` writes (`lock-bench/results/`).
//!
//! ```text
//! cargo run -p lock-bench --bin bench-history -- [--dir DIR] [--quick] [--row IMPL] [--to IMPL]... SCENARIO FIGURE
//! cargo run -p lock-bench --bin bench-history -- [--dir DIR] --check
//! ```

#[path = "../history.rs"]
mod history;

use std::path::PathBuf;
use std::process::ExitCode;

use history::Query;

const USAGE: &str = "\
usage: bench-history [--dir DIR] [--quick] [--row IMPL] [--to IMPL]... SCENARIO FIGURE
       bench-history [--dir DIR] --check

  SCENARIO     a scenario as the results files name it: uncontended, many-keys,
               many-keys-zipf, handoff, fresh-handoff, renewal, memory, macro,
               uncontended-cluster, handoff-redlock, ...
  FIGURE       a column as the bench prints it: 'p50 us', 'ops/s', 'max/mean wait', ...
  --dir DIR    the results directory (default: lock-bench/results)
  --row IMPL   the row (exact label, or a part of one label); default: each file's
               first row after the floors (distlock)
  --to IMPL    a ratio column to that row too, besides the floors (repeatable)
  --quick      read the files of --quick runs (toy sizes) instead of the others
  --check      parse every results file and print what they hold; exit 1 if one does not parse

Prints one line per results file, sorted by date: commit, date, row, the figure
and its ratios to the other rows of the same run (only those compare like with like).";

enum Mode {
    History(Query),
    Check,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<(PathBuf, Mode)>, String> {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results");
    let mut query = Query::default();
    let mut check = false;
    let mut positional = Vec::new();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--dir" => dir = value("--dir")?.into(),
            "--row" => query.row = Some(value("--row")?),
            "--to" => query.to.push(value("--to")?),
            "--quick" => query.quick = true,
            "--check" => check = true,
            "-h" | "--help" => return Ok(None),
            other if other.starts_with("--") => return Err(format!("unknown option {other:?}")),
            _ => positional.push(arg),
        }
    }
    let mode = match (check, positional.as_slice()) {
        (true, []) => Mode::Check,
        (false, [scenario, figure]) => {
            query.scenario = scenario.clone();
            query.figure = figure.clone();
            Mode::History(query)
        }
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
            eprintln!("bench-history: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let records = match history::load_dir(&dir) {
        Ok(records) => records,
        Err(e) => {
            eprintln!("bench-history: {e}");
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
                "{}: {} results files parse ({} of --quick runs; {} commits; scenarios: {})",
                dir.display(),
                records.len(),
                records.iter().filter(|r| r.quick).count(),
                commits.len(),
                if scenarios.is_empty() {
                    "none".to_owned()
                } else {
                    scenarios.join(", ")
                }
            );
            ExitCode::SUCCESS
        }
        Mode::History(query) => {
            let (columns, lines) = history::history(&records, &query);
            if lines.is_empty() {
                eprintln!(
                    "bench-history: no {}results of scenario {:?} in {}",
                    if query.quick { "--quick " } else { "" },
                    query.scenario,
                    dir.display()
                );
                return ExitCode::FAILURE;
            }
            print!("{}", history::render(&query, &columns, &lines));
            ExitCode::SUCCESS
        }
    }
}
