//! Reading the results files back (`bench-history`): one figure of one row of
//! one scenario across commits, with its ratios to other rows of the same
//! run. Only ratios within one file compare like with like; the values of
//! different files are runs on whatever machine and load each had.
//!
//! Shared by `src/bin/bench-history.rs` and the bench's tests (which write
//! files with `src/results.rs` and read them here), so it depends on nothing
//! else of the crate.

use std::path::Path;

use serde_json::Value;

/// One row's figures by name, in the file's order; `None` for a figure the
/// run could not measure (`null`).
pub type Figures = Vec<(String, Option<f64>)>;

/// One results file, as far as the history needs it.
#[derive(Debug, Clone)]
pub struct Record {
    pub commit: String,
    pub date: String,
    pub quick: bool,
    pub scenario: String,
    pub references: Vec<String>,
    /// Each row's label and figures, in the file's order.
    pub rows: Vec<(String, Figures)>,
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
        let mut rows = Vec::new();
        for row in doc
            .get("rows")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no array field \"rows\""))?
        {
            let label = row
                .get("impl")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a row without \"impl\""))?;
            let mut figures = Vec::new();
            for metric in row
                .get("metrics")
                .and_then(Value::as_array)
                .ok_or_else(|| bad(&format!("row {label:?} without \"metrics\"")))?
            {
                let name = metric
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(&format!("a figure of row {label:?} without a name")))?;
                let value = match metric.get("value") {
                    Some(Value::Null) => None,
                    Some(v) => Some(v.as_f64().ok_or_else(|| {
                        bad(&format!("{name:?} of row {label:?} is not a number"))
                    })?),
                    None => return Err(bad(&format!("{name:?} of row {label:?} has no value"))),
                };
                figures.push((name.to_owned(), value));
            }
            rows.push((label.to_owned(), figures));
        }
        let references = doc
            .get("references")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no array field \"references\""))?
            .iter()
            .map(|r| r.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("a reference that is not a string"))?;
        Ok(Record {
            commit: string("commit")?,
            date: string("date")?,
            quick: doc
                .get("quick")
                .and_then(Value::as_bool)
                .ok_or_else(|| bad("no boolean field \"quick\""))?,
            scenario: string("scenario")?,
            references,
            rows,
        })
    }

    /// A row (label and figures) by its exact label, else the one row whose
    /// label contains `name`.
    pub fn row(&self, name: &str) -> Option<&(String, Figures)> {
        if let Some(row) = self.rows.iter().find(|(label, _)| label == name) {
            return Some(row);
        }
        let mut matching = self.rows.iter().filter(|(label, _)| label.contains(name));
        match (matching.next(), matching.next()) {
            (Some(row), None) => Some(row),
            _ => None,
        }
    }

    /// The first row after the references: the implementation the scenario
    /// measures (distlock, or the Redlock row on `--backend redlock`).
    pub fn measured_row(&self) -> Option<&str> {
        self.rows
            .get(self.references.len())
            .or_else(|| self.rows.first())
            .map(|(label, _)| label.as_str())
    }

    fn figure(&self, row: &str, figure: &str) -> Option<f64> {
        self.row(row)?
            .1
            .iter()
            .find(|(name, _)| name == figure)
            .and_then(|(_, value)| *value)
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

/// What to print the history of.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub scenario: String,
    /// A metric name as the bench prints it (`p50 us`, `ops/s`, ...).
    pub figure: String,
    /// The row; by default each file's [`Record::measured_row`].
    pub row: Option<String>,
    /// Rows to print the ratio to besides the file's references.
    pub to: Vec<String>,
    /// Read `--quick` files instead of the others.
    pub quick: bool,
}

/// One line of the history: one file.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub commit: String,
    pub date: String,
    pub row: String,
    pub value: Option<f64>,
    /// `value / that row's value of the same figure`, per ratio column.
    pub ratios: Vec<Option<f64>>,
}

/// The history: the ratio columns' row names, and one line per matching
/// file, sorted by date (then commit).
pub fn history(records: &[Record], query: &Query) -> (Vec<String>, Vec<Line>) {
    let mut matching: Vec<&Record> = records
        .iter()
        .filter(|r| r.scenario == query.scenario && r.quick == query.quick)
        .collect();
    matching.sort_by(|a, b| (&a.date, &a.commit).cmp(&(&b.date, &b.commit)));
    let mut columns: Vec<String> = Vec::new();
    for record in &matching {
        for reference in record.references.iter().chain(&query.to) {
            if !columns.contains(reference) {
                columns.push(reference.clone());
            }
        }
    }
    let lines = matching
        .iter()
        .map(|record| {
            let wanted = query
                .row
                .clone()
                .or_else(|| record.measured_row().map(str::to_owned))
                .unwrap_or_default();
            // The row's own label when `--row` named a part of it.
            let row = record
                .row(&wanted)
                .map_or(wanted, |(label, _)| label.clone());
            let value = record.figure(&row, &query.figure);
            let ratios = columns
                .iter()
                .map(|other| match (value, record.figure(other, &query.figure)) {
                    (Some(v), Some(o)) if o != 0.0 => Some(v / o),
                    _ => None,
                })
                .collect();
            Line {
                commit: record.commit.clone(),
                date: record.date.clone(),
                row,
                value,
                ratios,
            }
        })
        .collect();
    (columns, lines)
}

/// The history as a table: commit, date, value, then `/ <row>` ratio columns.
pub fn render(query: &Query, columns: &[String], lines: &[Line]) -> String {
    let mut cells = vec![["commit", "date", "row", query.figure.as_str()]
        .into_iter()
        .map(str::to_owned)
        .chain(columns.iter().map(|c| format!("/ {c}")))
        .collect::<Vec<_>>()];
    for line in lines {
        let mut cell_line = vec![
            line.commit.clone(),
            line.date.clone(),
            line.row.clone(),
            line.value
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.2}")),
        ];
        cell_line.extend(
            line.ratios
                .iter()
                .map(|r| r.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}x"))),
        );
        cells.push(cell_line);
    }
    let widths: Vec<usize> = (0..cells[0].len())
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
            .map(|(c, cell)| {
                if c < 3 {
                    format!("{cell:<w$}", w = widths[c])
                } else {
                    format!("{cell:>w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A results file as the bench writes it, cut to what the history reads
    /// plus a few fields it must ignore.
    fn sample(commit: &str, date: &str, quick: bool, distlock_p50: &str, floor_p50: f64) -> String {
        format!(
            r#"{{
  "format": 1, "commit": "{commit}", "date": "{date}", "command": "lock-bench --json",
  "backend": "single", "nproc": 2, "server_version": "7.0.15", "quick": {quick}, "runs": 1,
  "locks": null, "load_average_start": "0.1 0.1 0.1", "load_average_end": "0.2 0.1 0.1",
  "scenario": "uncontended", "title": "t", "references": ["same-scripts floor"],
  "rows": [
    {{"impl": "same-scripts floor", "metrics": [{{"name": "p50 us", "value": {floor_p50}, "better": "lower"}}]}},
    {{"impl": "distlock", "metrics": [{{"name": "p50 us", "value": {distlock_p50}, "better": "lower"}}]}},
    {{"impl": "rslock 0.10 (peer)", "metrics": [{{"name": "p50 us", "value": 50.0, "better": "lower"}}]}}
  ],
  "targets": [], "notes": [], "per_run": []
}}
"#
        )
    }

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!(
                "lock-bench-{name}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
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
    fn one_line_per_commit_sorted_by_date_with_ratios_of_the_same_file() {
        let dir = TempDir::new("history");
        let write = |name: &str, text: String| {
            std::fs::write(dir.0.join(name), text).expect("writing a sample file")
        };
        // Their names sort against their dates: the history sorts by date.
        write(
            "aaaaaaa-uncontended.json",
            sample("aaaaaaa", "2026-11-27T10:00:00Z", false, "44.0", 40.0),
        );
        write(
            "bbbbbbb-uncontended.json",
            sample("bbbbbbb", "2026-11-26T10:00:00Z", false, "null", 40.0),
        );
        // Neither a --quick file nor a file that is not JSON is read.
        write(
            "ccccccc-uncontended-quick.json",
            sample("ccccccc", "2026-11-28T10:00:00Z", true, "1.0", 1.0),
        );
        write("README.md", "not a results file".to_owned());

        let records = load_dir(&dir.0).expect("the sample files parse");
        assert_eq!(records.len(), 3);
        let query = Query {
            scenario: "uncontended".to_owned(),
            figure: "p50 us".to_owned(),
            to: vec!["rslock".to_owned()],
            ..Query::default()
        };
        let (columns, lines) = history(&records, &query);
        assert_eq!(columns, ["same-scripts floor", "rslock"]);
        let commits: Vec<&str> = lines.iter().map(|l| l.commit.as_str()).collect();
        assert_eq!(commits, ["bbbbbbb", "aaaaaaa"]);
        // An unmeasured figure has no value and no ratio.
        assert_eq!(lines[0].value, None);
        assert_eq!(lines[0].ratios, [None, None]);
        assert_eq!(lines[1].row, "distlock");
        assert_eq!(lines[1].value, Some(44.0));
        assert_eq!(lines[1].ratios, [Some(44.0 / 40.0), Some(44.0 / 50.0)]);

        let table = render(&query, &columns, &lines);
        let last = table.lines().last().expect("a line per commit");
        assert_eq!(
            last.split_whitespace().collect::<Vec<_>>(),
            [
                "aaaaaaa",
                "2026-11-27T10:00:00Z",
                "distlock",
                "44.00",
                "1.10x",
                "0.88x"
            ],
            "{table}"
        );

        let by_part = history(
            &records,
            &Query {
                row: Some("peer".to_owned()),
                ..query.clone()
            },
        );
        assert_eq!(by_part.1[1].row, "rslock 0.10 (peer)");
        assert_eq!(by_part.1[1].value, Some(50.0));

        let quick = history(
            &records,
            &Query {
                quick: true,
                ..query.clone()
            },
        );
        assert_eq!(quick.1.len(), 1);
        assert_eq!(quick.1[0].commit, "ccccccc");
    }

    #[test]
    fn a_damaged_file_is_named_in_the_error() {
        let dir = TempDir::new("history-bad");
        std::fs::write(
            dir.0.join("x-uncontended.json"),
            r#"{"commit": "x", "references": [], "rows": []}"#,
        )
        .expect("writing a sample file");
        let err = load_dir(&dir.0).expect_err("a file without a date must not parse");
        assert!(err.contains("x-uncontended.json"), "{err}");
        assert!(err.contains("\"date\""), "{err}");
        assert!(load_dir(&dir.0.join("missing"))
            .expect("no directory, no results")
            .is_empty());
    }
}
