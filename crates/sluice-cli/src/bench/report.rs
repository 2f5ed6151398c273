//! `sluice bench`'s report: the table on the terminal and the SVG.

use super::{AimResult, BenchResult, CaseResult};
use crate::bench::common::{drawing_error, log_axis};
use anyhow::Result;
use plotters::prelude::*;
use std::path::Path;

/// The human-readable report.
pub(super) fn print_table(results: &[CaseResult], aims: &[AimResult], nproc: usize) {
    println!(
        "{:<24} {:>8} {:>17} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "case", "Mpps", "(min..max)", "Mpps/core", "busy Mpps", "p5 µs", "p50 µs", "p95 µs", "p99 µs"
    );
    for r in results {
        let s = &r.summary;
        println!(
            "{:<24} {:>8.3} {:>17} {:>9.3} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            r.name,
            s.mpps.median,
            format!("({:.3}..{:.3})", s.mpps.min, s.mpps.max),
            s.per_core_mpps.median,
            s.busy_mpps.median,
            s.p5_us.median,
            s.p50_us.median,
            s.p95_us.median,
            s.p99_us.median,
        );
    }
    println!(
        "Mpps: input packets / wall time of the run (median of the repeats). Mpps/core: Mpps / busy cores \
         (workers + root, at most {nproc}). busy Mpps: input packets / time inside the NF instances."
    );
    if aims.is_empty() {
        return;
    }
    println!("aims (64-byte packets held in memory):");
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    for a in aims {
        println!(
            "  {:<24} aim {:>5.1} Mpps/core: wall-clock per core {:>7.3} -> {:<8} NF busy time {:>7.3} -> {}",
            a.case,
            a.aim_mpps_per_core,
            a.per_core_mpps,
            verdict(a.met_per_core),
            a.busy_mpps,
            verdict(a.met_busy)
        );
    }
}

/// Colour of a case's bar by packet set.
fn size_colour(size: &str) -> RGBColor {
    match size {
        "64B" => RGBColor(31, 119, 180),
        "mix" => RGBColor(255, 127, 14),
        "trace" => RGBColor(44, 160, 44),
        _ => RGBColor(148, 103, 189),
    }
}

/// Draws the SVG: throughput bars (median, whiskers min..max) on the left, latency percentiles
/// on a log scale on the right (line p5..p99, box p25..p75, dot p50, tick p95), one row per case.
pub(super) fn plot(path: &Path, bench: &BenchResult) -> Result<()> {
    let cases = &bench.cases;
    let n = cases.len().max(1);
    let row = 20u32;
    let height = 140 + row * n as u32;
    let base = SVGBackend::new(path, (1400, height)).into_drawing_area();
    base.fill(&WHITE).map_err(drawing_error)?;
    let title = format!(
        "sluice bench: {} packets in memory, median of {} ({}; {} cores). Blue 64 B, orange mix, green trace; \
         pale: 2+ workers",
        bench.packets, bench.repeat, bench.machine.cpu_model, bench.machine.nproc
    );
    let root = base.titled(&title, ("sans-serif", 18)).map_err(drawing_error)?;
    let (left, right) = root.split_horizontally(760);
    let y_range = 0f64..n as f64;

    // Throughput.
    let max_mpps = cases.iter().map(|c| c.summary.mpps.max.max(c.summary.busy_mpps.median)).fold(0.0f64, f64::max);
    let x_max = if max_mpps > 0.0 { max_mpps * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(&left)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(190)
        .caption("throughput, Mpps (bar: wall clock; line: min..max; cross: NF busy-time rate)", ("sans-serif", 13))
        .build_cartesian_2d(0f64..x_max, y_range.clone())
        .map_err(drawing_error)?;
    chart.configure_mesh().disable_y_mesh().y_labels(0).x_desc("Mpps").draw().map_err(drawing_error)?;
    for (i, c) in cases.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let s = &c.summary;
        let colour = size_colour(&c.size);
        let style = if c.workers > 1 { colour.mix(0.55).filled() } else { colour.filled() };
        chart
            .draw_series(std::iter::once(Rectangle::new([(0.0, y + 0.15), (s.mpps.median, y + 0.85)], style)))
            .map_err(drawing_error)?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(s.mpps.min, y + 0.5), (s.mpps.max, y + 0.5)],
                BLACK.stroke_width(1),
            )))
            .map_err(drawing_error)?;
        let busy = s.busy_mpps.median.min(x_max);
        chart
            .draw_series(std::iter::once(Cross::new((busy, y + 0.5), 4, RED.stroke_width(2))))
            .map_err(drawing_error)?;
        // Backend coordinates are absolute, so the label goes on the whole (untitled) area.
        let (px, py) = chart.backend_coord(&(0.0, y + 0.5));
        let label = Text::new(c.name.clone(), (px - 185, py - 6), ("monospace", 12).into_font());
        base.draw(&label).map_err(drawing_error)?;
    }

    // Latency.
    let (lo, hi) =
        log_axis(cases.iter().map(|c| c.summary.p5_us.median), cases.iter().map(|c| c.summary.p99_us.median), 1.5);
    let mut lat = ChartBuilder::on(&right)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(10)
        .caption("latency µs, log scale (line p5..p99, box p25..p75, dot p50, tick p95)", ("sans-serif", 13))
        .build_cartesian_2d((lo..hi).log_scale(), y_range)
        .map_err(drawing_error)?;
    lat.configure_mesh().disable_y_mesh().y_labels(0).x_desc("µs (root to sink)").draw().map_err(drawing_error)?;
    for (i, c) in cases.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let s = &c.summary;
        let clamp = |v: f64| v.clamp(lo, hi);
        let colour = size_colour(&c.size);
        lat.draw_series(std::iter::once(PathElement::new(
            vec![(clamp(s.p5_us.median), y + 0.5), (clamp(s.p99_us.median), y + 0.5)],
            colour.stroke_width(1),
        )))
        .map_err(drawing_error)?;
        lat.draw_series(std::iter::once(Rectangle::new(
            [(clamp(s.p25_us.median), y + 0.25), (clamp(s.p75_us.median), y + 0.75)],
            colour.mix(0.5).filled(),
        )))
        .map_err(drawing_error)?;
        lat.draw_series(std::iter::once(PathElement::new(
            vec![(clamp(s.p95_us.median), y + 0.2), (clamp(s.p95_us.median), y + 0.8)],
            BLACK.stroke_width(1),
        )))
        .map_err(drawing_error)?;
        lat.draw_series(std::iter::once(Circle::new((clamp(s.p50_us.median), y + 0.5), 3, BLACK.filled())))
            .map_err(drawing_error)?;
    }
    root.present().map_err(drawing_error)?;
    Ok(())
}
