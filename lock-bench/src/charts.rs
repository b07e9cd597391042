//! Latency-distribution charts (SVG) for the README: one per scenario, one
//! line per implementation, latency against percentile on log-log axes.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

use crate::error::Result;
use crate::report::ScenarioResult;

const COLORS: [RGBColor; 4] = [
    RGBColor(90, 90, 90),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
];

/// Highest x drawn: 99.99th percentile.
const MAX_NINES: f64 = 4.0;

/// `x` nines of percentile: 0 -> 0%, 1 -> 90%, 2 -> 99%, 3 -> 99.9%.
fn quantile(x: f64) -> f64 {
    1.0 - 10f64.powf(-x)
}

fn percentile_label(x: &f64) -> String {
    let p = 100.0 * quantile(*x);
    let decimals = (x.round() as i64 - 2).clamp(0, 4) as usize;
    format!("{p:.decimals$}%")
}

/// The curve of one histogram, up to the percentile its sample count supports.
fn curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let top = (h.len().max(1) as f64).log10().min(MAX_NINES);
    let steps = 80;
    (0..=steps)
        .map(|i| top * f64::from(i) / f64::from(steps))
        .map(|x| {
            (
                x,
                (h.value_at_quantile(quantile(x)) as f64 / 1000.0).max(1.0),
            )
        })
        .collect()
}

/// Writes `DIR/<scenario>.svg` for every scenario with latency histograms.
pub fn write_all(dir: &Path, results: &[ScenarioResult]) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for s in results {
        let series: Vec<(String, Vec<(f64, f64)>)> = s
            .rows
            .iter()
            .filter_map(|r| r.histogram.as_ref().map(|h| (r.label.clone(), curve(h))))
            .filter(|(_, c)| !c.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let path = dir.join(format!("{}.svg", s.name));
        draw(&path, s, &series)?;
        written.push(path.display().to_string());
    }
    Ok(written)
}

fn draw(path: &Path, s: &ScenarioResult, series: &[(String, Vec<(f64, f64)>)]) -> Result<()> {
    let points = series.iter().flat_map(|(_, c)| c.iter());
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_min = points.clone().map(|p| p.1).fold(f64::MAX, f64::min);
    let y_max = points.map(|p| p.1).fold(1.0, f64::max);
    let (y_lo, y_hi) = (y_min * 0.8, y_max * 1.25);

    let root = SVGBackend::new(path, (720, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let what = match s.name {
        "handoff" | "handoff-cluster" => "hand-off latency",
        "many-keys" | "many-keys-zipf" | "many-keys-cluster" | "many-keys-zipf-cluster" => {
            "acquire+release cycle latency (64 tasks)"
        }
        _ => "acquire+release cycle latency",
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{}: {what}", s.name), ("sans-serif", 18))
        .margin(12)
        .margin_right(36)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (us)")
        .x_labels(x_max.ceil() as usize + 1)
        .x_label_formatter(&percentile_label)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE)
        .draw()?;
    for (i, (label, curve)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                curve.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
