//! Latency around a disruption (a crash, a node's failure, a move): from a run's latency
//! timeline (`RunConfig::latency_timeline`), the time until root-to-sink latency is back to
//! normal. Normal: five windows in a row whose 99th percentile is within twice the median of
//! the windows before the disruption (and at most 20 µs above it), the first tenth of the run
//! before it left out as warm-up.

use crate::report::LatencyWindow;

/// Windows in a row that must be normal again.
const NORMAL_WINDOWS: usize = 5;

/// Latency around a disruption in one run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Around {
    /// Disruption → latency back to normal, ms (`None`: not within the run).
    pub back_to_normal_ms: Option<f64>,
    /// Disruption → the first window back within the bound after one over it (0 if none was
    /// over it), ms: when the disruption's own effect ended, whatever noise comes later
    /// (`None`: not within the run).
    pub first_normal_ms: Option<f64>,
    /// Median of the per-window p99 before it, µs.
    pub baseline_p99_us: f64,
    /// Highest per-window p99 after it, µs.
    pub peak_p99_us: f64,
}

/// From a latency timeline and the time of a disruption (ms since the run started): the
/// baseline p99 before it, the time from it until latency is back to normal, and the peak p99
/// after it.
pub fn back_to_normal(timeline: &[LatencyWindow], at_ms: f64) -> Around {
    let mut before: Vec<f64> =
        timeline.iter().filter(|w| w.start_ms >= at_ms / 10.0 && w.start_ms + 1.0 <= at_ms).map(|w| w.p99_us).collect();
    before.sort_by(f64::total_cmp);
    let baseline = median(&before);
    let limit = (2.0 * baseline).min(baseline + 20.0);
    let after: Vec<&LatencyWindow> = timeline.iter().filter(|w| w.start_ms + 1.0 > at_ms).collect();
    let peak = after.iter().map(|w| w.p99_us).fold(0.0, f64::max);
    let back = (0..after.len()).find_map(|i| {
        let run = after.get(i..i + NORMAL_WINDOWS)?;
        run.iter().all(|w| w.p99_us <= limit).then(|| (run[0].start_ms - at_ms).max(0.0))
    });
    let first = match after.iter().position(|w| w.p99_us > limit) {
        None => Some(0.0),
        Some(over) => after.iter().skip(over).find(|w| w.p99_us <= limit).map(|w| (w.start_ms - at_ms).max(0.0)),
    };
    Around { back_to_normal_ms: back, first_normal_ms: first, baseline_p99_us: baseline, peak_p99_us: peak }
}

/// The median of sorted `v` (0 for none).
fn median(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start_ms: f64, p99_us: f64) -> LatencyWindow {
        LatencyWindow { start_ms, packets: 10, p50_us: p99_us / 2.0, p99_us }
    }

    #[test]
    fn latency_is_normal_again_after_five_normal_windows() {
        let mut t: Vec<LatencyWindow> = (0..20).map(|i| w(f64::from(i), 10.0)).collect();
        // The crash at 20 ms: 4 slow windows, one normal, one slow, then normal for good.
        t.extend([w(20.0, 500.0), w(21.0, 400.0), w(22.0, 300.0), w(23.0, 200.0), w(24.0, 12.0), w(25.0, 90.0)]);
        t.extend((26..40).map(|i| w(f64::from(i), 11.0)));
        let a = back_to_normal(&t, 20.0);
        assert_eq!(a.baseline_p99_us, 10.0);
        assert_eq!(a.back_to_normal_ms, Some(6.0));
        assert_eq!(a.first_normal_ms, Some(4.0), "the first window back within the bound");
        assert_eq!(a.peak_p99_us, 500.0);
        // Never normal again within the run.
        assert_eq!(back_to_normal(&t[..26], 20.0).back_to_normal_ms, None);
        assert_eq!(back_to_normal(&t[..24], 20.0).first_normal_ms, None);
        // No window over the bound: nothing to come back from.
        let quiet: Vec<LatencyWindow> = (0..40).map(|i| w(f64::from(i), 10.0)).collect();
        assert_eq!(back_to_normal(&quiet, 20.0).first_normal_ms, Some(0.0));
    }

    #[test]
    fn the_baseline_is_the_median_before_the_disruption() {
        let t = [w(0.0, 1.0), w(2.0, 30.0), w(3.0, 10.0), w(4.0, 20.0), w(5.0, 40.0), w(9.0, 99.0)];
        assert_eq!(back_to_normal(&t, 6.0).baseline_p99_us, 25.0, "windows 2..5: 10, 20, 30, 40");
    }
}
