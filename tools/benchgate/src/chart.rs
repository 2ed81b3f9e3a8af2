//! The history's chart: each case's count in the last runs, as percent of today's baseline, with
//! the threshold drawn; the SVG a reviewer opens (benches/baselines/history.svg).

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::gate::{read_history, Baseline};

/// Runs shown: enough to see a drift, few enough to read each commit under its point.
const LAST_RUNS: usize = 30;

pub fn draw(history: &Path, baseline: &Baseline, out: &Path) -> anyhow::Result<()> {
    let entries = read_history(history)?;
    let entries = &entries[entries.len().saturating_sub(LAST_RUNS)..];
    let cases: Vec<(&String, u64)> = baseline
        .run
        .cases
        .iter()
        .filter_map(|(k, c)| Some((k, c.evalsha?)))
        .collect();
    let series: Vec<Vec<(usize, f64)>> = cases
        .iter()
        .map(|(case, base)| {
            entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| {
                    let v = *e.evalsha.get(*case)?;
                    Some((i, (v as f64 / *base as f64 - 1.0) * 100.0))
                })
                .collect()
        })
        .collect();
    let threshold = baseline.threshold_pct;
    let extreme = series
        .iter()
        .flatten()
        .map(|(_, y)| y.abs())
        .fold(threshold * 2.0, f64::max);
    let y_range = -extreme * 1.1..extreme * 1.1;
    let x_max = entries.len().max(2) - 1;

    let root = SVGBackend::new(out, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let caption = format!(
        "claim.lua: instructions per claim in EVALSHA, % of the baseline ({}), last {} runs",
        baseline.commit,
        entries.len()
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(0..x_max, y_range)
        .map_err(plot_err)?;
    let commits: Vec<String> = entries.iter().map(|e| e.commit.clone()).collect();
    chart
        .configure_mesh()
        .x_desc("run (commit)")
        .y_desc("change from the baseline, %")
        .x_labels(entries.len().clamp(2, 15))
        .x_label_formatter(&|i| commits.get(*i).cloned().unwrap_or_default())
        .y_label_formatter(&|v| format!("{v:+.1}"))
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(LineSeries::new(
            [(0, threshold), (x_max, threshold)],
            RED.stroke_width(2),
        ))
        .map_err(plot_err)?
        .label(format!("threshold +{threshold} %: CI fails above"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED.stroke_width(2)));
    for (i, ((case, _), points)) in cases.iter().zip(&series).enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(case.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], colour.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, colour.filled())))
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerLeft)
        .draw()
        .map_err(plot_err)?;
    root.present()
        .with_context(|| format!("write the chart {}", out.display()))?;
    Ok(())
}

fn plot_err<E: std::error::Error + Send + Sync + 'static>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}
