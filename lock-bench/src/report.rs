//! Results: rows of metrics, ratios to the floor, targets, medians over runs,
//! the printed tables and the JSON file.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

use crate::error::Result;
use crate::redis_stats::Delta;

/// A latency histogram in nanoseconds (1 ns to 100 s, 3 significant digits).
pub fn new_histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 100_000_000_000, 3)?)
}

/// Which way a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Lower,
    Higher,
    /// Neither: a count to compare with the design (commands per op).
    Neutral,
}

#[derive(Debug, Clone)]
pub struct Metric {
    pub name: &'static str,
    pub value: f64,
    pub better: Better,
}

/// One implementation's figures in one scenario.
#[derive(Debug, Clone)]
pub struct Row {
    pub label: String,
    pub metrics: Vec<Metric>,
    /// For the charts; not in the JSON.
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
        row.push(
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
    Equals(f64),
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
        let v = find(&self.row, self.metric)?;
        match &self.over_row {
            None => Some(v),
            Some(other) => {
                let o = find(other, self.over_metric.unwrap_or(self.metric))?;
                Some(if self.inverted { o / v } else { v / o })
            }
        }
    }

    pub fn met(&self, value: f64) -> bool {
        match self.check {
            Check::AtMost(l) => value <= l,
            Check::AtLeast(l) => value >= l,
            Check::Equals(l) => (value - l).abs() < 0.005,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ScenarioResult {
    pub name: &'static str,
    pub title: String,
    /// Lines printed under the table: what the rows mean, caveats.
    pub notes: Vec<String>,
    /// The first row is the floor: ratios are to it.
    pub rows: Vec<Row>,
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

fn fmt_ratio(v: f64, floor: f64) -> String {
    if floor == 0.0 || v.is_nan() || floor.is_nan() {
        String::new()
    } else {
        format!(" ({:.2}x)", v / floor)
    }
}

impl ScenarioResult {
    fn render_columns(&self, columns: &[&'static str]) -> String {
        let floor = self.rows.first();
        let mut cells: Vec<Vec<String>> = vec![std::iter::once("impl".to_owned())
            .chain(columns.iter().map(|c| (*c).to_owned()))
            .collect()];
        for (i, row) in self.rows.iter().enumerate() {
            let mut line = vec![row.label.clone()];
            for c in columns {
                let cell = match row.get(c) {
                    None => "-".to_owned(),
                    Some(v) => {
                        let ratio = match floor.and_then(|f| f.get(c)) {
                            Some(f) if i > 0 => fmt_ratio(v, f),
                            _ => String::new(),
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

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".to_owned()
    }
}

/// The JSON document: every run's scenarios, and the medians when there are
/// several runs.
pub fn to_json(
    meta: &[(&str, String)],
    runs: &[Vec<ScenarioResult>],
    medians: &[(ScenarioResult, Vec<Option<f64>>)],
) -> String {
    let scenario_json = |s: &ScenarioResult, targets: Vec<Option<f64>>| {
        let rows: Vec<String> = s
            .rows
            .iter()
            .map(|r| {
                let metrics: Vec<String> = r
                    .metrics
                    .iter()
                    .map(|m| {
                        let better = match m.better {
                            Better::Lower => "lower",
                            Better::Higher => "higher",
                            Better::Neutral => "neither",
                        };
                        format!(
                            "{}: {{\"value\": {}, \"better\": \"{better}\"}}",
                            json_str(m.name),
                            json_num(m.value)
                        )
                    })
                    .collect();
                format!(
                    "{{\"impl\": {}, \"metrics\": {{{}}}}}",
                    json_str(&r.label),
                    metrics.join(", ")
                )
            })
            .collect();
        let targets: Vec<String> = s
            .targets
            .iter()
            .zip(targets)
            .map(|(t, v)| {
                format!(
                    "{{\"target\": {}, \"value\": {}, \"met\": {}}}",
                    json_str(&t.text),
                    v.map_or("null".to_owned(), json_num),
                    v.map_or("null".to_owned(), |v| t.met(v).to_string())
                )
            })
            .collect();
        let notes: Vec<String> = s.notes.iter().map(|n| json_str(n)).collect();
        format!(
            "{{\"scenario\": {}, \"title\": {}, \"rows\": [{}], \"targets\": [{}], \"notes\": [{}]}}",
            json_str(s.name),
            json_str(&s.title),
            rows.join(", "),
            targets.join(", "),
            notes.join(", ")
        )
    };
    let meta: Vec<String> = meta
        .iter()
        .map(|(k, v)| format!("{}: {}", json_str(k), json_str(v)))
        .collect();
    let runs_json: Vec<String> = runs
        .iter()
        .map(|run| {
            let s: Vec<String> = run
                .iter()
                .map(|s| scenario_json(s, s.targets.iter().map(|t| t.value(&s.rows)).collect()))
                .collect();
            format!("[{}]", s.join(", "))
        })
        .collect();
    let medians_json: Vec<String> = medians
        .iter()
        .map(|(s, t)| scenario_json(s, t.clone()))
        .collect();
    format!(
        "{{\"meta\": {{{}}}, \"runs\": [{}], \"median\": [{}]}}\n",
        meta.join(", "),
        runs_json.join(", "),
        medians_json.join(", ")
    )
}
