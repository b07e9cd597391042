//! Results: rows of metrics, ratios to the floor(s), targets, medians over
//! runs, the printed tables and the results files (JSON, serde).

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::error::Result;
use crate::redis_stats::Delta;

/// A latency histogram in nanoseconds (1 ns to 100 s, 3 significant digits).
pub fn new_histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 100_000_000_000, 3)?)
}

/// Which way a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Lower,
    Higher,
    /// Neither: a count to compare with the design (commands per op).
    Neutral,
}

#[derive(Debug, Clone, Serialize)]
pub struct Metric {
    pub name: &'static str,
    pub value: f64,
    pub better: Better,
}

/// One implementation's figures in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(rename = "impl")]
    pub label: String,
    pub metrics: Vec<Metric>,
    /// For the charts; not in the JSON.
    #[serde(skip)]
    pub histogram: Option<Histogram<u64>>,
}

impl Row {
    pub fn new(label: impl Into<String>) -> Row {
        Row {
            label: label.into(),
            metrics: Vec::new(),
            histogram: None,
        }
    }

    pub fn push(&mut self, name: &'static str, value: f64, better: Better) -> &mut Row {
        self.metrics.push(Metric {
            name,
            value,
            better,
        });
        self
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.metrics
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    /// The usual figures of an operation-per-cycle scenario: throughput,
    /// latency percentiles, and what the server did per operation.
    pub fn standard(
        label: impl Into<String>,
        ops: u64,
        seconds: f64,
        hist: Histogram<u64>,
        redis: Delta,
        round_trips_per_op: Option<f64>,
    ) -> Row {
        let mut row = Row::new(label);
        let per_op = |x: f64| if ops == 0 { f64::NAN } else { x / ops as f64 };
        row.push("ops/s", ops as f64 / seconds, Better::Higher)
            .push("p50 us", us(hist.value_at_quantile(0.50)), Better::Lower)
            .push("p99 us", us(hist.value_at_quantile(0.99)), Better::Lower)
            .push("p999 us", us(hist.value_at_quantile(0.999)), Better::Lower)
            .push("cmds/op", per_op(redis.commands as f64), Better::Neutral)
            .push("evalsha/op", per_op(redis.scripts as f64), Better::Neutral);
        if let Some(rt) = round_trips_per_op {
            row.push("rt/op", rt, Better::Neutral);
        }
        row.push("reads/op", per_op(redis.reads as f64), Better::Neutral)
            .push(
                "redis cpu us/op",
                per_op(redis.cpu_seconds * 1e6),
                Better::Lower,
            )
            .push(
                "client cpu us/op",
                per_op(redis.client_cpu_seconds * 1e6),
                Better::Lower,
            );
        row.histogram = Some(hist);
        row
    }
}

pub fn us(nanos: u64) -> f64 {
    nanos as f64 / 1000.0
}

/// A goal from the issue, checked in every run.
#[derive(Debug, Clone)]
pub struct Target {
    pub text: String,
    /// The row and metric measured.
    pub row: String,
    pub metric: &'static str,
    /// When set, the value is `row / over_row` (same metric, or `over_metric`).
    pub over_row: Option<String>,
    pub over_metric: Option<&'static str>,
    /// Inverted ratio: `over_row / row` (for "N x better than" goals).
    pub inverted: bool,
    pub check: Check,
}

#[derive(Debug, Clone, Copy)]
pub enum Check {
    AtMost(f64),
    AtLeast(f64),
    /// Strictly below.
    Below(f64),
}

impl Target {
    /// `row / over` of one metric.
    pub fn ratio(text: &str, row: &str, metric: &'static str, over: &str, check: Check) -> Target {
        Target {
            text: text.to_owned(),
            row: row.to_owned(),
            metric,
            over_row: Some(over.to_owned()),
            over_metric: None,
            inverted: false,
            check,
        }
    }

    /// `other / row` of one metric: how many times better `row` is when lower is better.
    pub fn times_better(
        text: &str,
        row: &str,
        metric: &'static str,
        other: &str,
        check: Check,
    ) -> Target {
        Target {
            inverted: true,
            ..Target::ratio(text, row, metric, other, check)
        }
    }

    /// The metric itself.
    pub fn absolute(text: &str, row: &str, metric: &'static str, check: Check) -> Target {
        Target {
            text: text.to_owned(),
            row: row.to_owned(),
            metric,
            over_row: None,
            over_metric: None,
            inverted: false,
            check,
        }
    }

    pub fn value(&self, rows: &[Row]) -> Option<f64> {
        let find = |label: &str, metric: &str| {
            rows.iter()
                .find(|r| r.label == label)
                .and_then(|r| r.get(metric))
        };
        // An unmeasured figure (NaN: a slot, a count that could not be taken) is
        // no value: the target prints `n/a`, neither met nor missed.
        let v = find(&self.row, self.metric).filter(|v| !v.is_nan())?;
        match &self.over_row {
            None => Some(v),
            Some(other) => {
                let o =
                    find(other, self.over_metric.unwrap_or(self.metric)).filter(|o| !o.is_nan())?;
                Some(if self.inverted { o / v } else { v / o })
            }
        }
    }

    pub fn met(&self, value: f64) -> bool {
        match self.check {
            Check::AtMost(l) => value <= l,
            Check::AtLeast(l) => value >= l,
            Check::Below(l) => value < l,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ScenarioResult {
    pub name: &'static str,
    pub title: String,
    /// Lines printed under the table: what the rows mean, caveats.
    pub notes: Vec<String>,
    /// The first `references` rows are the floors: every other row's figures
    /// are followed by their ratios to each of them.
    pub rows: Vec<Row>,
    pub references: usize,
    pub targets: Vec<Target>,
}

fn fmt_value(v: f64) -> String {
    if v.is_nan() {
        "-".to_owned()
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// ` (0.95x)`, or ` (0.95x / 1.30x)` with two references; empty when no
/// reference has the figure.
fn fmt_ratios(v: f64, refs: &[Option<f64>]) -> String {
    let parts: Vec<String> = refs
        .iter()
        .map(|r| match r {
            Some(f) if *f != 0.0 && !v.is_nan() && !f.is_nan() => format!("{:.2}x", v / f),
            _ => "-".to_owned(),
        })
        .collect();
    if parts.iter().all(|p| p == "-") {
        String::new()
    } else {
        format!(" ({})", parts.join(" / "))
    }
}

impl ScenarioResult {
    fn render_columns(&self, columns: &[&'static str]) -> String {
        let refs = &self.rows[..self.references.min(self.rows.len())];
        let mut cells: Vec<Vec<String>> = vec![std::iter::once("impl".to_owned())
            .chain(columns.iter().map(|c| (*c).to_owned()))
            .collect()];
        for (i, row) in self.rows.iter().enumerate() {
            let mut line = vec![row.label.clone()];
            for c in columns {
                let cell = match row.get(c) {
                    None => "-".to_owned(),
                    Some(v) => {
                        let ratio = if i < refs.len() {
                            String::new()
                        } else {
                            let floors: Vec<Option<f64>> = refs.iter().map(|f| f.get(c)).collect();
                            fmt_ratios(v, &floors)
                        };
                        format!("{}{ratio}", fmt_value(v))
                    }
                };
                line.push(cell);
            }
            cells.push(line);
        }
        let widths: Vec<usize> = (0..=columns.len())
            .map(|c| {
                cells
                    .iter()
                    .map(|l| l[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for (n, line) in cells.iter().enumerate() {
            let mut text = String::new();
            for (c, cell) in line.iter().enumerate() {
                if c == 0 {
                    let _ = write!(text, "{cell:<w$}", w = widths[c]);
                } else {
                    let _ = write!(text, "  {cell:>w$}", w = widths[c]);
                }
            }
            let _ = writeln!(out, "{}", text.trim_end());
            if n == 0 {
                let _ = writeln!(out, "{}", "-".repeat(text.trim_end().len()));
            }
        }
        out
    }

    /// The table: one line per row, each figure followed by its ratio to the floor.
    pub fn render(&self) -> String {
        let mut columns: Vec<&'static str> = Vec::new();
        for row in &self.rows {
            for m in &row.metrics {
                if !columns.contains(&m.name) {
                    columns.push(m.name);
                }
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "== {}: {}", self.name, self.title);
        let refs: Vec<&str> = self
            .rows
            .iter()
            .take(self.references)
            .map(|r| r.label.as_str())
            .collect();
        if !refs.is_empty() {
            let _ = writeln!(out, "   (ratios in parentheses: to {})", refs.join(" / "));
        }
        // Wide scenarios are printed as several tables of at most 9 figures.
        let groups = columns.len().div_ceil(9).max(1);
        for group in columns.chunks(columns.len().div_ceil(groups).max(1)) {
            out.push_str(&self.render_columns(group));
        }
        for note in &self.notes {
            let _ = writeln!(out, "  note: {note}");
        }
        for t in &self.targets {
            let _ = match t.value(&self.rows) {
                Some(v) => writeln!(
                    out,
                    "  target: {:<62} {:>9}  {}",
                    t.text,
                    fmt_value(v),
                    if t.met(v) { "MET" } else { "MISSED" }
                ),
                None => writeln!(out, "  target: {:<62} {:>9}  n/a", t.text, "-"),
            };
        }
        out
    }
}

/// The median over runs of every metric, and of every target's value.
/// Ratios printed for the median table are ratios of medians; the target
/// values are medians of the per-run values.
pub fn median_of_runs(runs: &[Vec<ScenarioResult>]) -> Vec<(ScenarioResult, Vec<Option<f64>>)> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (s, scenario) in first.iter().enumerate() {
        let same: Vec<&ScenarioResult> = runs
            .iter()
            .filter_map(|r| r.get(s))
            .filter(|r| r.name == scenario.name)
            .collect();
        let mut merged = scenario.clone();
        for row in &mut merged.rows {
            row.histogram = None;
            for m in &mut row.metrics {
                let values: Vec<f64> = same
                    .iter()
                    .filter_map(|r| r.rows.iter().find(|x| x.label == row.label))
                    .filter_map(|x| x.get(m.name))
                    .collect();
                m.value = median(values);
            }
        }
        let target_values = scenario
            .targets
            .iter()
            .map(|t| {
                let values: Vec<f64> = same.iter().filter_map(|r| t.value(&r.rows)).collect();
                (!values.is_empty()).then(|| median(values))
            })
            .collect();
        out.push((merged, target_values));
    }
    out
}

pub fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Renders a median table, with the targets judged on the medians of their
/// per-run values.
pub fn render_median(
    result: &ScenarioResult,
    target_values: &[Option<f64>],
    runs: usize,
) -> String {
    let mut plain = result.clone();
    plain.targets.clear();
    plain.title = format!("{} [median of {runs} runs]", result.title);
    let mut out = plain.render();
    for (t, v) in result.targets.iter().zip(target_values) {
        let _ = match v {
            Some(v) => writeln!(
                out,
                "  target: {:<62} {:>9}  {}",
                t.text,
                fmt_value(*v),
                if t.met(*v) { "MET" } else { "MISSED" }
            ),
            None => writeln!(out, "  target: {:<62} {:>9}  n/a", t.text, "-"),
        };
    }
    out
}

#[derive(Serialize)]
struct JsonTarget<'a> {
    target: &'a str,
    value: Option<f64>,
    met: Option<bool>,
}

/// What a results file records about the invocation that wrote it.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    /// `git rev-parse --short HEAD` when the bench ran, `-dirty` appended when
    /// the work tree (the results directory aside) had changes; `unknown`
    /// outside a git checkout.
    pub commit: String,
    /// UTC, `YYYY-MM-DDTHH:MM:SSZ`, when the results were written.
    pub date: String,
    /// The invocation, as `lock-bench ARGS...`.
    pub command: String,
    pub backend: &'static str,
    /// CPUs the bench could use (`available_parallelism`).
    pub nproc: usize,
    /// The CPU model and the first 8 hex digits of this boot's id
    /// (`/proc/sys/kernel/random/boot_id`): files of one boot ran on one
    /// machine. Ratios against commit-bound or wake-up-bound floors move
    /// from one VM to the next (another disk, another host), so a figure is
    /// reproduced on the machine of its run, or the README says otherwise.
    pub machine: String,
    /// `redis_version` of the (first) private server; PostgreSQL's `server_version`.
    pub server_version: String,
    /// PostgreSQL: the settings that bound a commit (`synchronous_commit`, `fsync`,
    /// `wal_sync_method`, where the data directory is); absent for Redis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_settings: Option<String>,
    pub quick: bool,
    pub runs: usize,
    /// `--locks`, when given.
    pub locks: Option<usize>,
    pub load_average_start: String,
    pub load_average_end: String,
    /// What sets the run apart from a plain one (`link-1ms`, `lane-off`,
    /// joined by `-`), appended to each scenario's name in its file and its
    /// name there, so that the history never mixes it with plain runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl RunInfo {
    /// `scenario` as this run's files name it (with [`RunInfo::variant`]).
    pub fn scenario_name(&self, scenario: &str) -> String {
        match &self.variant {
            Some(variant) => format!("{scenario}-{variant}"),
            None => scenario.to_owned(),
        }
    }
}

/// One results file: one scenario of one invocation. `rows` and `targets`
/// are the medians over the runs (with one run, that run); `per_run` holds
/// every run's rows. Figures that could not be measured (NaN) are `null`.
#[derive(Serialize)]
struct ResultsFile<'a> {
    format: u32,
    #[serde(flatten)]
    info: &'a RunInfo,
    scenario: &'a str,
    title: &'a str,
    /// Labels of the reference rows (the floors), the first rows of `rows`.
    references: Vec<&'a str>,
    rows: &'a [Row],
    targets: Vec<JsonTarget<'a>>,
    notes: &'a [String],
    per_run: Vec<&'a [Row]>,
}

/// The version of the results files' layout, in each file as `format`.
pub const RESULTS_FORMAT: u32 = 1;

/// The results file of one scenario: `median` with its target values (from
/// [`median_of_runs`]), and the same scenario's result in every run.
pub fn results_json(
    info: &RunInfo,
    median: &ScenarioResult,
    target_values: &[Option<f64>],
    runs: &[Vec<ScenarioResult>],
) -> Result<String> {
    let scenario = info.scenario_name(median.name);
    let file = ResultsFile {
        format: RESULTS_FORMAT,
        info,
        scenario: &scenario,
        title: &median.title,
        references: median
            .rows
            .iter()
            .take(median.references)
            .map(|r| r.label.as_str())
            .collect(),
        rows: &median.rows,
        targets: median
            .targets
            .iter()
            .zip(target_values)
            .map(|(t, v)| JsonTarget {
                target: &t.text,
                value: *v,
                met: v.map(|v| t.met(v)),
            })
            .collect(),
        notes: &median.notes,
        per_run: runs
            .iter()
            .filter_map(|run| run.iter().find(|s| s.name == median.name))
            .map(|s| s.rows.as_slice())
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&file)?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot row (every figure NaN) gives its targets no value: printed `n/a`,
    /// neither met nor missed, and left out of the medians.
    #[test]
    fn unmeasured_figures_have_no_target_value() {
        let mut floor = Row::new("floor");
        floor.push("p50 us", 100.0, Better::Lower);
        let mut slot = Row::new("slot");
        slot.push("p50 us", f64::NAN, Better::Lower);
        let mut measured = Row::new("measured");
        measured.push("p50 us", 105.0, Better::Lower);
        let over = |row: &str| Target::ratio("t", row, "p50 us", "floor", Check::AtMost(1.1));
        let rows = [floor, slot, measured];
        assert_eq!(over("slot").value(&rows), None);
        assert_eq!(over("measured").value(&rows), Some(1.05));
        let result = ScenarioResult {
            name: "uncontended-postgres",
            title: "t".to_owned(),
            notes: Vec::new(),
            rows: rows.to_vec(),
            references: 1,
            targets: vec![over("slot")],
        };
        let text = result.render();
        assert!(text.contains("n/a"), "{text}");
        assert!(!text.contains("MISSED"), "{text}");
    }
}
