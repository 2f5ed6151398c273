//! `sluice bench-store`'s report: the tables on the terminal and the SVG (CHC's Figure 8).

use super::failover::AROUND_HEADER;
use super::modes::{Load, ModeKind, ModeResult, StoreKind};
use super::BenchStoreResult;
use crate::bench::common::{drawing_error, log_axis};
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Prints the tables.
pub(super) fn print_tables(r: &BenchStoreResult) {
    for n in &r.not_run {
        println!("{n}");
    }
    super::open_loop::print_table(&r.open_loop, r.repeat);
    if !r.failover.is_empty() {
        println!("\nfailover (the NAT instance crashes halfway; open loop; medians of {}):", r.repeat);
        println!("{:<18} {:>10} {:>22} {AROUND_HEADER}", "case", "pkt/s", "recovery ms (min..max)");
        for f in &r.failover {
            let s = &f.recovery_ms;
            let recovery = format!("{:.2} ({:.2}..{:.2})", s.median, s.min, s.max);
            println!("{:<18} {:>10.0} {recovery:>22} {}", f.case, f.rate_pps, f.latency.columns());
        }
    }
    if !r.moves.is_empty() {
        println!("\nflow move (NAT scaled to 2, then 4,000 flows moved halfway; open loop; medians of {}):", r.repeat);
        println!(
            "{:<18} {:>10} {:>8} {:>22} {:>10} {AROUND_HEADER}",
            "case", "pkt/s", "flows", "pause ms (min..max)", "drain ms"
        );
        for m in &r.moves {
            let s = &m.pause_ms;
            let pause = format!("{:.3} ({:.3}..{:.3})", s.median, s.min, s.max);
            println!(
                "{:<18} {:>10.0} {:>8.0} {pause:>22} {:>10.3} {}",
                m.case,
                m.rate_pps,
                m.flows_moved.median,
                m.drain_ms.median,
                m.latency.columns()
            );
        }
    }
    if !r.modes.is_empty() {
        println!(
            "\nmodes ({} packets, {}; batch {}, {} worker(s), {} root(s); sat = window {}, paced = window {}; medians of {}):",
            r.packets, r.workload, r.batch, r.workers, r.roots, r.window, r.paced_window, r.repeat
        );
        println!(
            "{:<32} {:>8} {:>17} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "case", "Mpps", "(min..max)", "ratio", "p5 µs", "p25 µs", "p50 µs", "p75 µs", "p95 µs", "+p50/NF", "+ns/NF"
        );
        for m in &r.modes {
            let s = &m.summary;
            let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
            println!(
                "{:<32} {:>8.3} {:>17} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9} {:>9}",
                m.name,
                s.mpps.median,
                format!("({:.3}..{:.3})", s.mpps.min, s.mpps.max),
                opt(m.mpps_ratio_to_local, 2),
                s.p5_us.median,
                s.p25_us.median,
                s.p50_us.median,
                s.p75_us.median,
                s.p95_us.median,
                opt(m.added_p50_us_per_nf, 2),
                opt(m.added_busy_ns_per_nf, 0),
            );
        }
        println!(
            "ratio: Mpps / Mpps of local (same NF, same window). +p50/NF: (p50 - p50 of local) / on-path NFs, µs. \
             +ns/NF: added NF busy time per packet per on-path NF, ns."
        );
    }
    for c in &r.contention {
        println!("\noffloaded operations vs lock-read-modify-write, {} store, 2 threads:", c.store);
        println!(
            "  offload  {:>10.0} ops/s ({:.0}..{:.0})  p50 {:>7.1} µs  p95 {:>7.1} µs",
            c.offload_ops_per_s.median,
            c.offload_ops_per_s.min,
            c.offload_ops_per_s.max,
            c.offload_p50_us.median,
            c.offload_p95_us.median
        );
        println!(
            "  lock-RMW {:>10.0} ops/s ({:.0}..{:.0})  p50 {:>7.1} µs  p95 {:>7.1} µs",
            c.lock_rmw_ops_per_s.median,
            c.lock_rmw_ops_per_s.min,
            c.lock_rmw_ops_per_s.max,
            c.lock_rmw_p50_us.median,
            c.lock_rmw_p95_us.median
        );
        println!(
            "  offload / lock-RMW: throughput x{:.2}, lock-RMW p50 / offload p50 x{:.2}",
            c.throughput_ratio, c.latency_ratio
        );
    }
    if !r.ops.is_empty() {
        println!("\nstore operations per second (median, min..max):");
        println!("{:<16} {:<5} {:>6} {:>8} {:>12} {:>25}", "store", "op", "batch", "clients", "ops/s", "(min..max)");
        for o in &r.ops {
            println!(
                "{:<16} {:<5} {:>6} {:>8} {:>12.0} {:>25}",
                o.store,
                o.op,
                o.batch,
                o.clients,
                o.ops_per_s.median,
                format!("({:.0}..{:.0})", o.ops_per_s.min, o.ops_per_s.max)
            );
        }
        println!("batch: requests per batch (sluice) or pipeline depth -P (redis-benchmark).");
    }
    if !r.aims.is_empty() {
        println!("\naims:");
        for a in &r.aims {
            println!(
                "  {:<70} {:<26} {:>8.3} (target {}) -> {}",
                a.aim,
                a.case,
                a.value,
                a.target,
                if a.met { "met" } else { "NOT met" }
            );
        }
    }
}

/// Colour of a mode.
fn mode_colour(m: ModeKind) -> RGBColor {
    match m {
        ModeKind::Local => RGBColor(0, 0, 0),
        ModeKind::External => RGBColor(214, 39, 40),
        ModeKind::Cached => RGBColor(31, 119, 180),
        ModeKind::Async => RGBColor(44, 160, 44),
        ModeKind::AsyncFt => RGBColor(148, 103, 189),
    }
}

/// Draws CHC's Figure 8 per NF and load (x: percentile, y: µs on a log scale, one line per mode
/// and store; embedded solid with dots, Redis pale with triangles), then throughput ratios to
/// `local` as bars.
pub(super) fn plot(path: &Path, r: &BenchStoreResult) -> Result<()> {
    let base = SVGBackend::new(path, (1500, 1150)).into_drawing_area();
    base.fill(&WHITE).map_err(drawing_error)?;
    let title = format!(
        "sluice bench-store: {} ({} packets), medians of {} ({}; {} cores)",
        r.workload, r.packets, r.repeat, r.machine.base.cpu_model, r.machine.base.nproc
    );
    let root = base.titled(&title, ("sans-serif", 18)).map_err(drawing_error)?;
    let (lat_area, bar_area) = root.split_vertically(760);
    let nfs = ["nat", "lb", "example"];
    for (pi, panel) in lat_area.split_evenly((2, 3)).iter().enumerate() {
        let load = if pi < 3 { Load::Saturated } else { Load::Paced };
        latency_panel(panel, r, nfs[pi % 3], load)?;
    }
    ratio_bars(&bar_area, &base, r)?;
    root.present().map_err(drawing_error)?;
    Ok(())
}

/// One NF's latency percentiles under one load, a line per mode and store.
fn latency_panel(panel: &DrawingArea<SVGBackend, Shift>, r: &BenchStoreResult, nf: &str, load: Load) -> Result<()> {
    let pcts = [5.0, 25.0, 50.0, 75.0, 95.0];
    let cases: Vec<&ModeResult> = r.modes.iter().filter(|m| m.nf == nf && m.load == load).collect();
    let vals = |m: &ModeResult| {
        let s = &m.summary;
        [s.p5_us.median, s.p25_us.median, s.p50_us.median, s.p75_us.median, s.p95_us.median]
    };
    let (lo, hi) = log_axis(cases.iter().flat_map(|m| vals(m)), cases.iter().flat_map(|m| vals(m)), 1.3);
    let caption = match load {
        Load::Saturated => format!("{nf}: latency at saturation (window {})", r.window),
        Load::Paced => format!("{nf}: latency paced (window {})", r.paced_window),
    };
    let mut chart = ChartBuilder::on(panel)
        .margin(8)
        .x_label_area_size(30)
        .y_label_area_size(55)
        .caption(caption, ("sans-serif", 14))
        .build_cartesian_2d(0f64..100f64, (lo..hi).log_scale())
        .map_err(drawing_error)?;
    chart.configure_mesh().x_desc("percentile").y_desc("µs").draw().map_err(drawing_error)?;
    for m in &cases {
        let colour = mode_colour(m.mode);
        let pts: Vec<(f64, f64)> = pcts.iter().zip(vals(m)).map(|(p, v)| (*p, v.clamp(lo, hi))).collect();
        let label = if m.store == StoreKind::None {
            m.mode.name().to_string()
        } else {
            format!("{} {}", m.mode.name(), m.store.name())
        };
        let redis = m.store == StoreKind::Redis;
        let line = if redis { colour.mix(0.5).stroke_width(2) } else { colour.stroke_width(2) };
        chart
            .draw_series(LineSeries::new(pts.clone(), line))
            .map_err(drawing_error)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], line));
        if redis {
            chart
                .draw_series(pts.iter().map(|p| TriangleMarker::new(*p, 4, colour.mix(0.5).filled())))
                .map_err(drawing_error)?;
        } else {
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, colour.filled()))).map_err(drawing_error)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 10))
        .draw()
        .map_err(drawing_error)?;
    Ok(())
}

/// Throughput ratios to local, saturated and paced, a bar per case; the case names go on
/// `base` (the whole, untitled area: backend coordinates are absolute).
fn ratio_bars(
    area: &DrawingArea<SVGBackend, Shift>,
    base: &DrawingArea<SVGBackend, Shift>,
    r: &BenchStoreResult,
) -> Result<()> {
    let bars: Vec<&ModeResult> = r.modes.iter().filter(|m| m.mode != ModeKind::Local).collect();
    let n = bars.len().max(1);
    let ymax = bars.iter().filter_map(|m| m.mpps_ratio_to_local).fold(1.1f64, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(150)
        .y_label_area_size(55)
        .caption(
            "throughput / throughput of local (bars: median; green async, blue cached, red external; pale: Redis; \
             black line at 1, grey lines at 0.95 and 0.5)",
            ("sans-serif", 14),
        )
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax)
        .map_err(drawing_error)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).y_desc("ratio to local").draw().map_err(drawing_error)?;
    for (i, m) in bars.iter().enumerate() {
        let v = m.mpps_ratio_to_local.unwrap_or(0.0);
        let colour = mode_colour(m.mode);
        let style = if m.store == StoreKind::Redis { colour.mix(0.45).filled() } else { colour.filled() };
        chart
            .draw_series(std::iter::once(Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, v)], style)))
            .map_err(drawing_error)?;
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        let style = TextStyle::from(("sans-serif", 10).into_font()).transform(FontTransform::Rotate270);
        base.draw(&Text::new(m.name.clone(), (px - 5, py + 140), style)).map_err(drawing_error)?;
    }
    for (level, colour) in [(1.0, BLACK), (0.95, RGBColor(120, 120, 120)), (0.5, RGBColor(120, 120, 120))] {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, level), (n as f64, level)],
                colour.stroke_width(1),
            )))
            .map_err(drawing_error)?;
    }
    Ok(())
}
