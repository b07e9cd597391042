//! What the benchmark (`lock-bench`) and the torture suite (`lock-torture`)
//! share about their results files, one JSON file per run of a scenario: the
//! commit a run was made at, its date, and reading a folder of such files.
//! Each tool keeps its own record format and history table.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The commit of the checkout that holds `repo`: `git rev-parse --short
/// HEAD`, with `-dirty` when the work tree has changes other than in
/// `results_dir` (a path from the checkout's top; the files of an earlier run
/// would otherwise mark every later run dirty); `unknown` when git cannot
/// tell.
pub fn current_commit(repo: &Path, results_dir: &str) -> String {
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
    let exclude = format!(":(top,exclude){results_dir}");
    match git(&["status", "--porcelain", "--", ":/", &exclude]) {
        Some(changes) if changes.is_empty() => commit,
        _ => format!("{commit}-dirty"),
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a time in seconds since the Unix epoch (UTC,
/// RFC 3339).
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

/// Every `*.json` file of `dir` with its text, in the order of their names.
/// A directory that does not exist has none.
pub fn json_files(dir: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("reading {}: {e}", dir.display())),
    };
    let mut paths = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .path();
        if path.extension().and_then(|e| e.to_str()) == Some("json") {
            paths.push(path);
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            Ok((path, text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_date(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_date(951_827_696), "2000-02-29T12:34:56Z");
        assert_eq!(utc_date(951_868_799 + 1), "2000-03-01T00:00:00Z");
        assert_eq!(utc_date(1_798_761_599), "2026-12-31T23:59:59Z");
    }

    #[test]
    fn json_files_are_read_in_name_order_and_a_missing_folder_has_none() {
        let dir = std::env::temp_dir().join(format!("lock-results-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b.json"), "2").unwrap();
        std::fs::write(dir.join("a.json"), "1").unwrap();
        std::fs::write(dir.join("notes.txt"), "not a result").unwrap();
        let files = json_files(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|(p, t)| {
                (
                    p.file_name().unwrap().to_str().unwrap().to_owned(),
                    t.clone(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("a.json".to_owned(), "1".to_owned()),
                ("b.json".to_owned(), "2".to_owned())
            ]
        );
        assert!(json_files(&dir).unwrap().is_empty());
    }
}
