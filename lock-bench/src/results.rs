//! `--json`: one results file per scenario run,
//! `<results dir>/<commit>-<scenario>.json` (`-quick` before `.json` for a
//! `--quick` run, which `.gitignore` keeps out of the repository: toy sizes,
//! figures that mean nothing). The files are the bench's record of its
//! figures; `bench-history` reads them back (`src/history.rs`).

use std::path::{Path, PathBuf};

use crate::error::{context, Result};
use crate::report::{self, RunInfo, ScenarioResult};

/// The committed results directory, `lock-bench/results`, wherever the bench
/// is started from.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("results")
}

/// The commit of this checkout, `-dirty` when it has changes outside
/// `lock-bench/results` (see [`lock_results::current_commit`]).
pub fn current_commit() -> String {
    lock_results::current_commit(Path::new(env!("CARGO_MANIFEST_DIR")), "lock-bench/results")
}

pub use lock_results::utc_now;

/// The invocation as one line: `lock-bench` and the arguments, an argument
/// with a space or a quote in single quotes.
pub fn command_line(args: &[String]) -> String {
    std::iter::once("lock-bench".to_owned())
        .chain(args.iter().map(|a| {
            if a.is_empty() || a.contains([' ', '\'', '"']) {
                format!("'{}'", a.replace('\'', r"'\''"))
            } else {
                a.clone()
            }
        }))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The file name of one scenario's results.
pub fn file_name(commit: &str, scenario: &str, quick: bool) -> String {
    let quick = if quick { "-quick" } else { "" };
    format!("{commit}-{scenario}{quick}.json")
}

/// Writes one file per scenario into `dir` (created if missing), replacing
/// an earlier run's file of the same commit and scenario; returns the paths.
pub fn write_all(
    dir: &Path,
    info: &RunInfo,
    medians: &[(ScenarioResult, Vec<Option<f64>>)],
    runs: &[Vec<ScenarioResult>],
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(context(&format!("creating {}", dir.display())))?;
    let mut written = Vec::new();
    for (median, target_values) in medians {
        let path = dir.join(file_name(
            &info.commit,
            &info.scenario_name(median.name),
            info.quick,
        ));
        let text = report::results_json(info, median, target_values, runs)?;
        std::fs::write(&path, text).map_err(context(&format!("writing {}", path.display())))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let args = ["--scenario", "uncontended", "--results-dir", "a b"].map(str::to_owned);
        assert_eq!(
            command_line(&args),
            "lock-bench --scenario uncontended --results-dir 'a b'"
        );
    }

    #[test]
    fn quick_runs_get_their_own_file_names() {
        assert_eq!(
            file_name("c4d49e1", "handoff", false),
            "c4d49e1-handoff.json"
        );
        assert_eq!(
            file_name("c4d49e1-dirty", "many-keys-zipf", true),
            "c4d49e1-dirty-many-keys-zipf-quick.json"
        );
    }
}
