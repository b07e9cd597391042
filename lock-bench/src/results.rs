//! `--json`: one results file per scenario run,
//! `<results dir>/<commit>-<scenario>.json` (`-quick` before `.json` for a
//! `--quick` run, which `.gitignore` keeps out of the repository: toy sizes,
//! figures that mean nothing). The files are the bench's record of its
//! figures; `bench-history` reads them back (`src/history.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{context, Result};
use crate::report::{self, RunInfo, ScenarioResult};

/// The committed results directory, `lock-bench/results`, wherever the bench
/// is started from.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("results")
}

/// The commit the bench runs at: `git rev-parse --short HEAD`, with `-dirty`
/// when the work tree has changes other than in `lock-bench/results` (the
/// files of an earlier run would otherwise mark every later run dirty);
/// `unknown` when git cannot tell.
pub fn current_commit() -> String {
    let repo = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let Some(commit) = git(&["rev-parse", "--short", "HEAD"]).filter(|c| !c.is_empty()) else {
        return "unknown".to_owned();
    };
    match git(&[
        "status",
        "--porcelain",
        "--",
        ":/",
        ":(top,exclude)lock-bench/results",
    ]) {
        Some(changes) if changes.is_empty() => commit,
        _ => format!("{commit}-dirty"),
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a time in seconds since the Unix epoch (UTC,
/// RFC 3339 by `humantime`).
pub fn utc_date(unix_seconds: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix_seconds)).to_string()
}

/// Now, as [`utc_date`].
pub fn utc_now() -> String {
    utc_date(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    )
}

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
        let path = dir.join(file_name(&info.commit, median.name, info.quick));
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
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_date(0), "1970-01-01T00:00:00Z");
        // 2000-02-29 (a leap day of a century year divisible by 400) 12:34:56.
        assert_eq!(utc_date(951_827_696), "2000-02-29T12:34:56Z");
        assert_eq!(utc_date(951_868_799 + 1), "2000-03-01T00:00:00Z");
        // The last second of 2026-12-31.
        assert_eq!(utc_date(1_798_761_599), "2026-12-31T23:59:59Z");
    }

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
