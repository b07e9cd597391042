//! Runs as data: one JSON file per scenario run,
//! `<results dir>/<commit>-<scenario>.json`, written when `TORTURE_RESULTS`
//! asks for it, and read back by `torture-history`.
//!
//! A scenario's figures are the `key=value` fields of its `TORTURE` line, in
//! the line's order; per-round lines (`TORTURE <scenario> round <r>: ...`)
//! go into the same file under `rounds`. The file adds what the figures
//! depend on: the commit, date, machine (nproc), server, build profile and
//! soak factor. Only figures of one file compare like with like; different
//! files are runs on whatever machine and load each had.
//!
//! The format is lock-bench's (`lock-bench/src/results.rs`): the same commit
//! naming (`-dirty`), date format and file naming.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

/// The environment variable that asks for results files: `1` for the
/// committed directory, `lock-torture/results`; any other value but `0` or
/// empty is the directory to write to (relative to `lock-torture/`, the
/// directory cargo runs the tests in).
pub const RESULTS_ENV: &str = "TORTURE_RESULTS";

/// The version of the files' layout.
pub const FORMAT: u64 = 1;

/// The committed results directory, `lock-torture/results`, wherever the
/// tests are started from.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("results")
}

/// Where `TORTURE_RESULTS` asks results files to go; `None` when it does not.
pub fn dir_from_env() -> Option<PathBuf> {
    dir_from_value(std::env::var_os(RESULTS_ENV)?.to_str()?)
}

fn dir_from_value(value: &str) -> Option<PathBuf> {
    match value {
        "" | "0" => None,
        "1" => Some(default_dir()),
        dir => Some(PathBuf::from(dir)),
    }
}

/// One figure's value: a number when the field reads as one, else its text.
fn value_of(text: &str) -> Value {
    if let Ok(n) = text.parse::<i64>() {
        return json!(n);
    }
    // `{:+.1}` prints a sign that Rust's float parser does not take.
    match text.strip_prefix('+').unwrap_or(text).parse::<f64>() {
        Ok(x) if x.is_finite() => json!(x),
        _ => json!(text),
    }
}

/// The `key=value` fields of a `TORTURE` line's figures, in order. A word
/// without `=` continues the value before it (a value printed with spaces,
/// such as a map's `{0: 12, 1: 13}`); words before the first field are kept
/// under `text`.
pub fn parse_figures(figures: &str) -> Vec<(String, Value)> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for word in figures.split_whitespace() {
        match word.split_once('=') {
            Some((name, value)) if !name.is_empty() && !name.contains(['{', '(', '[']) => {
                fields.push((name.to_owned(), value.to_owned()));
            }
            _ => match fields.last_mut() {
                Some((_, value)) => {
                    value.push(' ');
                    value.push_str(word);
                }
                None => fields.push(("text".to_owned(), word.to_owned())),
            },
        }
    }
    fields
        .into_iter()
        .map(|(name, value)| {
            let value = value_of(&value);
            (name, value)
        })
        .collect()
}

fn figures_json(figures: &str) -> Value {
    Value::Array(
        parse_figures(figures)
            .into_iter()
            .map(|(name, value)| json!({ "name": name, "value": value }))
            .collect(),
    )
}

/// What a run's figures depend on besides the code: one per test process.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// [`current_commit`].
    pub commit: String,
    /// UTC, RFC 3339 ([`lock_results::utc_date`]).
    pub date: String,
    /// The test binary (its name without cargo's hash) and its arguments.
    pub command: String,
    pub nproc: usize,
    /// `Redis 7.0.15`, `Valkey 8.0.1`: the `redis-server --version` of the
    /// binary the fixtures start (`REDIS_SERVER_BIN`, else `redis-server`).
    pub server_version: String,
    /// `debug` or `release`.
    pub profile: &'static str,
    /// [`crate::soak_factor`]: 20 under `DISTLOCK_SOAK=1`, else 1.
    pub soak_factor: u64,
}

impl RunInfo {
    /// The run of this process, now.
    pub fn current() -> RunInfo {
        RunInfo {
            commit: current_commit(),
            date: utc_now(),
            command: test_command(std::env::args()),
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            server_version: server_version(),
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            soak_factor: crate::soak_factor(),
        }
    }
}

/// `single-0123abcd s0 --nocapture` as `single s0 --nocapture`: the test
/// binary's name without the hash cargo appends, and its arguments.
fn test_command(mut args: impl Iterator<Item = String>) -> String {
    let binary = args.next().unwrap_or_default();
    let name = Path::new(&binary)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let name = match name.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            stem
        }
        _ => name,
    };
    std::iter::once(name.to_owned())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The server the fixtures start, from its `--version` (`Redis server
/// v=7.0.15 sha=...` reads `Redis 7.0.15`); `unknown` when it does not run.
pub fn server_version() -> String {
    let binary = std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into());
    let Some(out) = Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| out.status.success())
    else {
        return "unknown".to_owned();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let product = text.split_whitespace().next().unwrap_or("");
    match text.split_whitespace().find_map(|w| w.strip_prefix("v=")) {
        Some(version) => format!("{product} {version}"),
        None => text.trim().to_owned(),
    }
}

/// The commit of this checkout, `-dirty` when it has changes outside
/// `lock-torture/results` (see [`lock_results::current_commit`]).
pub fn current_commit() -> String {
    lock_results::current_commit(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        "lock-torture/results",
    )
}

pub use lock_results::utc_now;

/// The file name of one scenario's results.
pub fn file_name(commit: &str, scenario: &str) -> String {
    format!("{commit}-{scenario}.json")
}

/// One scenario run as the file's text: `figures` is its `TORTURE` line after
/// the `:`, `rounds` its per-round lines' (round number, figures).
pub fn to_json(
    info: &RunInfo,
    scenario: &str,
    figures: &str,
    rounds: &[(usize, String)],
) -> String {
    let doc = json!({
        "format": FORMAT,
        "commit": info.commit,
        "date": info.date,
        "command": info.command,
        "nproc": info.nproc,
        "server_version": info.server_version,
        "profile": info.profile,
        "soak_factor": info.soak_factor,
        "scenario": scenario,
        "line": figures,
        "figures": figures_json(figures),
        "rounds": rounds
            .iter()
            .map(|(round, line)| json!({
                "round": round,
                "line": line,
                "figures": figures_json(line),
            }))
            .collect::<Vec<_>>(),
    });
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

/// Writes one scenario's file into `dir` (created if missing), replacing an
/// earlier run's of the same commit and scenario; returns its path.
pub fn write(
    dir: &Path,
    info: &RunInfo,
    scenario: &str,
    figures: &str,
    rounds: &[(usize, String)],
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file_name(&info.commit, scenario));
    std::fs::write(&path, to_json(info, scenario, figures, rounds))?;
    Ok(path)
}

/// One results file, as far as the history needs it.
#[derive(Debug, Clone)]
pub struct Record {
    pub commit: String,
    pub date: String,
    pub nproc: u64,
    pub server_version: String,
    pub profile: String,
    pub soak_factor: u64,
    pub scenario: String,
    /// The figures by name, in the line's order.
    pub figures: Vec<(String, Value)>,
}

impl Record {
    /// Parses one file's text; `path` is for messages.
    pub fn parse(path: &Path, text: &str) -> Result<Record, String> {
        let bad = |what: &str| format!("{}: {what}", path.display());
        let doc: Value = serde_json::from_str(text).map_err(|e| bad(&format!("not JSON: {e}")))?;
        let string = |field: &str| {
            doc.get(field)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| bad(&format!("no string field {field:?}")))
        };
        let number = |field: &str| {
            doc.get(field)
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(&format!("no number field {field:?}")))
        };
        let mut figures = Vec::new();
        for figure in doc
            .get("figures")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no array field \"figures\""))?
        {
            let name = figure
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a figure without a name"))?;
            let value = figure
                .get("value")
                .ok_or_else(|| bad(&format!("figure {name:?} has no value")))?;
            figures.push((name.to_owned(), value.clone()));
        }
        Ok(Record {
            commit: string("commit")?,
            date: string("date")?,
            nproc: number("nproc")?,
            server_version: string("server_version")?,
            profile: string("profile")?,
            soak_factor: number("soak_factor")?,
            scenario: string("scenario")?,
            figures,
        })
    }

    /// A figure's value as printed in the `TORTURE` line.
    pub fn figure(&self, name: &str) -> Option<String> {
        self.figures
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
    }
}

/// Every `*.json` file of `dir`, parsed, in the order of their names. A
/// directory that does not exist has no results.
pub fn load_dir(dir: &Path) -> Result<Vec<Record>, String> {
    lock_results::json_files(dir)?
        .iter()
        .map(|(path, text)| Record::parse(path, text))
        .collect()
}

/// The history of `figure` of `scenario`: one line per file, sorted by date
/// (then commit): commit, date, the conditions of the run and the value (`-`
/// where the file has no such figure). Empty when no file is of `scenario`.
pub fn history(records: &[Record], scenario: &str, figure: &str) -> String {
    let mut matching: Vec<&Record> = records.iter().filter(|r| r.scenario == scenario).collect();
    if matching.is_empty() {
        return String::new();
    }
    matching.sort_by(|a, b| (&a.date, &a.commit).cmp(&(&b.date, &b.commit)));
    let mut cells = vec![["commit", "date", "nproc", "server", "build", figure].map(str::to_owned)];
    for r in matching {
        let build = if r.soak_factor == 1 {
            r.profile.clone()
        } else {
            format!("{} soak x{}", r.profile, r.soak_factor)
        };
        cells.push([
            r.commit.clone(),
            r.date.clone(),
            r.nproc.to_string(),
            r.server_version.clone(),
            build,
            r.figure(figure).unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| {
            cells
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &cells {
        let text: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<w$}", w = widths[c]))
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn info(commit: &str, date: &str, soak_factor: u64) -> RunInfo {
        RunInfo {
            commit: commit.to_owned(),
            date: date.to_owned(),
            command: "single s1 --nocapture".to_owned(),
            nproc: 2,
            server_version: "Redis 7.0.15".to_owned(),
            profile: "release",
            soak_factor,
        }
    }

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!(
                "lock-torture-{name}-{}-{:?}",
                std::process::id(),
                SystemTime::now()
            ));
            std::fs::create_dir_all(&dir).expect("creating a temporary directory");
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_torture_line_becomes_named_figures_in_its_order() {
        let figures = parse_figures(
            "sections=200 faults=1xkill-9+3cancel+2panic loss_vs_deadline_ms=+1.5 \
             writes_ok_by_worker={0: 12, 1: 13} secs=3.0",
        );
        assert_eq!(
            figures,
            [
                ("sections".to_owned(), json!(200)),
                ("faults".to_owned(), json!("1xkill-9+3cancel+2panic")),
                ("loss_vs_deadline_ms".to_owned(), json!(1.5)),
                ("writes_ok_by_worker".to_owned(), json!("{0: 12, 1: 13}")),
                ("secs".to_owned(), json!(3.0)),
            ]
        );
        assert_eq!(
            parse_figures("recovered fast=1")[0],
            ("text".to_owned(), json!("recovered"))
        );
    }

    #[test]
    fn results_files_are_written_read_back_and_sorted_by_date() {
        let dir = TempDir::new("history");
        // Their names sort against their dates: the history sorts by date.
        let newer = write(
            &dir.0,
            &info("aaaaaaa", "2026-11-27T10:00:00Z", 20),
            "s1_baseline",
            "sections=100000 overlaps=0 secs=162.8",
            &[],
        )
        .expect("writing a results file");
        assert_eq!(
            newer.file_name().and_then(|n| n.to_str()),
            Some("aaaaaaa-s1_baseline.json")
        );
        write(
            &dir.0,
            &info("bbbbbbb-dirty", "2026-11-26T10:00:00Z", 1),
            "s1_baseline",
            "sections=5000 secs=8.1",
            &[(0, "recovered_after_heal_ms=3.5".to_owned())],
        )
        .expect("writing a results file");
        write(
            &dir.0,
            &info("ccccccc", "2026-11-28T10:00:00Z", 1),
            "s0_control",
            "sections=200 overlaps=236",
            &[],
        )
        .expect("writing a results file");
        std::fs::write(dir.0.join("README.md"), "not a results file").expect("writing");

        let records = load_dir(&dir.0).expect("the files parse");
        assert_eq!(records.len(), 3);
        let table = history(&records, "s1_baseline", "overlaps");
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            [
                vec!["commit", "date", "nproc", "server", "build", "overlaps"],
                vec![
                    "bbbbbbb-dirty",
                    "2026-11-26T10:00:00Z",
                    "2",
                    "Redis",
                    "7.0.15",
                    "release",
                    "-"
                ],
                vec![
                    "aaaaaaa",
                    "2026-11-27T10:00:00Z",
                    "2",
                    "Redis",
                    "7.0.15",
                    "release",
                    "soak",
                    "x20",
                    "0"
                ],
            ],
            "{table}"
        );
        let secs = history(&records, "s1_baseline", "secs");
        assert_eq!(
            secs.lines()
                .last()
                .and_then(|l| l.split_whitespace().last()),
            Some("162.8"),
            "{secs}"
        );
        assert!(history(&records, "s9r_paused_member", "secs").is_empty());

        // The rounds are kept beside the figures.
        let text = std::fs::read_to_string(dir.0.join("bbbbbbb-dirty-s1_baseline.json"))
            .expect("reading back");
        let doc: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(doc["rounds"][0]["figures"][0]["value"], json!(3.5));
        assert_eq!(doc["command"], "single s1 --nocapture");
    }

    #[test]
    fn a_damaged_file_is_named_in_the_error() {
        let dir = TempDir::new("history-bad");
        std::fs::write(
            dir.0.join("x-s1_baseline.json"),
            r#"{"commit": "x", "figures": []}"#,
        )
        .expect("writing a sample file");
        let err = load_dir(&dir.0).expect_err("a file without a date must not parse");
        assert!(err.contains("x-s1_baseline.json"), "{err}");
        assert!(err.contains("\"date\""), "{err}");
        assert!(load_dir(&dir.0.join("missing"))
            .expect("no directory, no results")
            .is_empty());
    }

    #[test]
    fn the_variable_names_a_directory_or_the_committed_one() {
        assert_eq!(dir_from_value(""), None);
        assert_eq!(dir_from_value("0"), None);
        assert_eq!(dir_from_value("1"), Some(default_dir()));
        assert_eq!(dir_from_value("/tmp/t"), Some(PathBuf::from("/tmp/t")));
        assert!(default_dir().ends_with("lock-torture/results"));
    }

    #[test]
    fn the_command_names_the_test_binary_without_its_hash() {
        let args = [
            "/w/target/debug/deps/single-0123456789abcdef",
            "s0",
            "--nocapture",
        ]
        .map(str::to_owned);
        assert_eq!(test_command(args.into_iter()), "single s0 --nocapture");
        assert_eq!(
            test_command(["/x/redlock-tests"].map(str::to_owned).into_iter()),
            "redlock-tests"
        );
    }
}
