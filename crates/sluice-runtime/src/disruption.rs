//! Latency around a disruption (a crash, a node's failure, a move): from each packet's
//! root-to-sink latency in egress order (`RunConfig::latency_timeline`), the time until latency
//! is back to normal.
//!
//! Normal: five windows in a row (each as wide as the run's latency window) whose 99th
//! percentile is within twice the median per-window p99 before the disruption and at most
//! 20 µs above it (the first tenth of the run before it left out as warm-up). The five
//! windows may start anywhere after the disruption — at the disruption itself or just after
//! any packet that left — not only on the run's grid of windows: a grid anchored at the run's
//! start put the disruption anywhere in its window and so reported up to a whole window late
//! (a 1.3 ms recovery read as "3 ms", docs/decisions.md, "Latency back to normal, measured
//! from where it is"). A window with no packet in it is not normal: nothing left the chain.

use crate::report::LatencyWindow;
use std::time::Duration;

/// Windows in a row that must be normal again.
const NORMAL_WINDOWS: u64 = 5;

/// Each packet's root-to-sink latency, in egress order: (egress time, latency), ns, egress
/// time counted from the run's start.
pub type LatencySamples = [(u64, u64)];

/// Latency around a disruption in one run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Around {
    /// Disruption → latency back to normal, ms (`None`: not within the run).
    pub back_to_normal_ms: Option<f64>,
    /// Disruption → the first window normal again after one that was not (0 if none was
    /// over the bound), ms: when the disruption's own effect ended, whatever noise comes later
    /// (`None`: not within the run).
    pub first_normal_ms: Option<f64>,
    /// Median of the per-window p99 before it, µs.
    pub baseline_p99_us: f64,
    /// Highest per-window p99 after it (windows of the run's grid), µs.
    pub peak_p99_us: f64,
    /// Of the stretches of five windows wholly before it (after the warm-up, one starting at
    /// each window of the run's grid), the share the same rule calls normal: below 1, latency
    /// "back to normal" also waits out the run's own noise, at about that rate (`None`: no
    /// stretch fits before it).
    pub baseline_normal_share: Option<f64>,
}

/// Latency per window of `width` on the run's grid, from (egress time, latency) pairs in ns,
/// in egress order. Windows without packets are left out.
pub fn latency_windows(samples: &LatencySamples, width: Duration) -> Vec<LatencyWindow> {
    let width = width_ns(width);
    let mut out = Vec::new();
    let mut rest = samples;
    let mut lat = Vec::new();
    while let Some(&(first, _)) = rest.first() {
        let start = first / width * width;
        let n = rest.iter().take_while(|(t, _)| *t < start + width).count();
        let (window, tail) = rest.split_at(n);
        rest = tail;
        lat.clear();
        lat.extend(window.iter().map(|(_, l)| *l));
        lat.sort_unstable();
        let at = |q: f64| lat.get(quantile_index(lat.len(), q)).copied().unwrap_or(0);
        out.push(LatencyWindow {
            start_ms: start as f64 / 1e6,
            packets: lat.len() as u64,
            p50_us: at(0.5) as f64 / 1e3,
            p99_us: at(0.99) as f64 / 1e3,
        });
    }
    out
}

/// From each packet's latency (in egress order), the run's window width and the time of a
/// disruption (ms since the run started): the baseline p99 before it, the time from it until
/// latency is back to normal, and the peak p99 after it.
pub fn back_to_normal(samples: &LatencySamples, width: Duration, at_ms: f64) -> Around {
    let grid = latency_windows(samples, width);
    let width_ms = width_ns(width) as f64 / 1e6;
    // Windows that ended before the disruption (the run's first tenth left out as warm-up).
    let mut before: Vec<f64> = grid
        .iter()
        .filter(|w| w.start_ms >= at_ms / 10.0 && w.start_ms + width_ms <= at_ms)
        .map(|w| w.p99_us)
        .collect();
    before.sort_by(f64::total_cmp);
    let baseline = median(&before);
    let limit_ns = ((2.0 * baseline).min(baseline + 20.0) * 1e3) as u64;
    let peak = grid.iter().filter(|w| w.start_ms + width_ms > at_ms).map(|w| w.p99_us).fold(0.0, f64::max);

    let at_ns = (at_ms.max(0.0) * 1e6) as u64;
    let windows = Windows::new(samples, width_ns(width), limit_ns);
    // Where a window may start: at the disruption, or just after a packet that left after it.
    let first_after = samples.partition_point(|(t, _)| *t < at_ns);
    // Only windows that end within the run are judged: past its last packet nothing leaves.
    let end_ns = samples.last().map_or(0, |(t, _)| t + 1);
    let starts = || {
        std::iter::once(at_ns)
            .chain(samples[first_after..].iter().map(|(t, _)| t + 1))
            .take_while(move |s| s + windows.width <= end_ns)
    };
    let ms_after = |start: u64| start.saturating_sub(at_ns) as f64 / 1e6;
    let stretch_normal = |s: u64| (0..NORMAL_WINDOWS).all(|k| windows.normal(s + k * windows.width));
    let back = starts().find(|&s| stretch_normal(s)).map(ms_after);
    let span = NORMAL_WINDOWS * windows.width;
    let warm_ns = (at_ns / 10).div_ceil(windows.width) * windows.width;
    let before_starts = (0..).map(|k| warm_ns + k * windows.width).take_while(|s| s + span <= at_ns);
    let (judged, normal) = before_starts.fold((0u32, 0u32), |(j, n), s| (j + 1, n + u32::from(stretch_normal(s))));
    let baseline_normal_share = (judged > 0).then(|| f64::from(normal) / f64::from(judged));
    let first = match starts().position(|s| !windows.normal(s)) {
        None => Some(0.0),
        Some(over) => starts().skip(over + 1).find(|&s| windows.normal(s)).map(ms_after),
    };
    Around {
        back_to_normal_ms: back,
        first_normal_ms: first,
        baseline_p99_us: baseline,
        peak_p99_us: peak,
        baseline_normal_share,
    }
}

/// Windows of the samples starting anywhere, each judged in O(log n): a window's p99 is
/// within the limit exactly when fewer of its packets are over it than rank above the p99.
struct Windows<'a> {
    samples: &'a LatencySamples,
    width: u64,
    /// `over[i]`: how many of the first `i` samples are over the limit.
    over: Vec<u32>,
}

impl<'a> Windows<'a> {
    fn new(samples: &'a LatencySamples, width: u64, limit_ns: u64) -> Self {
        let mut over = Vec::with_capacity(samples.len() + 1);
        let mut count = 0u32;
        over.push(0);
        for (_, lat) in samples {
            count += u32::from(*lat > limit_ns);
            over.push(count);
        }
        Windows { samples, width, over }
    }

    /// Whether the packets that left in `[start, start + width)` have their p99 within the
    /// limit (none left: not normal).
    fn normal(&self, start: u64) -> bool {
        let lo = self.samples.partition_point(|(t, _)| *t < start);
        let hi = self.samples.partition_point(|(t, _)| *t < start + self.width);
        let n = hi.saturating_sub(lo);
        let over = (self.over[hi] - self.over[lo]) as usize;
        // Sorted, the p99 is the sample at `quantile_index`: within the limit if more samples
        // than that index are.
        n > 0 && n - over > quantile_index(n, 0.99)
    }
}

/// The index of quantile `q` among `n` sorted samples.
fn quantile_index(n: usize, q: f64) -> usize {
    ((n as f64 * q) as usize).min(n.saturating_sub(1))
}

fn width_ns(width: Duration) -> u64 {
    u64::try_from(width.as_nanos()).unwrap_or(u64::MAX).max(1)
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

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    /// Ten packets a ms from `from_ms` to `to_ms`, each `lat_us` late.
    fn steady(from_ms: u64, to_ms: u64, lat_us: u64) -> Vec<(u64, u64)> {
        (from_ms * 10..to_ms * 10).map(|i| (i * MS / 10, lat_us * US)).collect()
    }

    fn around(samples: &[(u64, u64)], at_ms: f64) -> Around {
        back_to_normal(samples, Duration::from_millis(1), at_ms)
    }

    #[test]
    fn latency_is_normal_again_once_the_last_late_packet_has_left() {
        // 10 µs before the crash at 20.5 ms; nothing leaves for 1.2 ms; the waiting packets
        // leave late until 21.9 ms; normal from then on.
        let mut s = steady(0, 20, 10);
        s.extend((0..5).map(|i| (20 * MS + i * MS / 10, 10 * US)));
        s.extend((0..4).map(|i| (21 * MS + 700 * US + i * 50 * US, (900 - i * 200) * US)));
        s.extend(steady(22, 40, 11));
        let a = around(&s, 20.5);
        assert_eq!(a.baseline_p99_us, 10.0);
        let back = a.back_to_normal_ms.unwrap_or(f64::NAN);
        // Just after the last late packet (21.85 ms), 1.35 ms after the crash: not 1.5 ms,
        // where the run's grid of windows would put the next one.
        assert!((back - 1.35).abs() < 1e-3, "back to normal after {back} ms");
        assert_eq!(a.first_normal_ms, a.back_to_normal_ms);
        assert_eq!(a.peak_p99_us, 900.0);
    }

    #[test]
    fn a_window_with_one_late_packet_in_fifty_is_late_and_in_two_hundred_is_not() {
        let limit = 20 * US;
        let one_in = |n: u64| -> Vec<(u64, u64)> {
            (0..n).map(|i| (i * MS / n, if i == n / 2 { 500 * US } else { 5 * US })).collect()
        };
        let fifty = one_in(50);
        assert!(!Windows::new(&fifty, MS, limit).normal(0), "the p99 of 50 is their maximum");
        let two_hundred = one_in(200);
        assert!(Windows::new(&two_hundred, MS, limit).normal(0));
        assert!(!Windows::new(&two_hundred, MS, limit).normal(MS), "no packet left: not normal");
    }

    #[test]
    fn noise_later_delays_back_to_normal_but_not_the_first_normal_window() {
        // Late packets until 21.0 ms after a crash at 20 ms; a lone late one at 23 ms.
        let mut s = steady(0, 20, 10);
        s.extend((0..10).map(|i| (20 * MS + i * MS / 10, 600 * US)));
        s.extend(steady(21, 40, 10));
        if let Some(p) = s.iter_mut().find(|(t, _)| *t == 23 * MS) {
            p.1 = 300 * US;
        }
        let a = around(&s, 20.0);
        let first = a.first_normal_ms.unwrap_or(f64::NAN);
        assert!((first - 0.9).abs() < 1e-3, "first normal {first} ms: just after the last of the burst");
        let back = a.back_to_normal_ms.unwrap_or(f64::NAN);
        assert!((back - 3.0).abs() < 1e-3, "back to normal {back} ms: five windows after the lone one");
        // Never normal again within the run: the run ends before five windows pass.
        assert_eq!(around(&s[..240], 20.0).back_to_normal_ms, None);
        // No late packet at all: nothing to come back from.
        assert_eq!(around(&steady(0, 40, 10), 20.0).first_normal_ms, Some(0.0));
    }

    #[test]
    fn noise_before_the_disruption_is_measured_by_the_same_rule() {
        // Quiet before the crash at 40 ms: every stretch of five windows is normal.
        assert_eq!(around(&steady(0, 60, 10), 40.0).baseline_normal_share, Some(1.0));
        // A lone late packet at 20.5 ms spoils the five stretches that hold its window, of
        // the 32 that start at 4..=35 ms (the first tenth left out, each ending by 40 ms).
        let mut s = steady(0, 60, 10);
        if let Some(p) = s.iter_mut().find(|(t, _)| *t == 20 * MS + MS / 2) {
            p.1 = 300 * US;
        }
        let share = around(&s, 40.0).baseline_normal_share.unwrap_or(f64::NAN);
        assert!((share - 27.0 / 32.0).abs() < 1e-9, "share {share}");
        // Nothing fits before a disruption 3 ms in.
        assert_eq!(around(&steady(0, 20, 10), 3.0).baseline_normal_share, None);
    }

    #[test]
    fn the_baseline_is_the_median_of_the_windows_before_the_disruption() {
        let s: Vec<(u64, u64)> = [(0, 1), (2, 30), (3, 10), (4, 20), (5, 40), (9, 99)]
            .iter()
            .map(|&(ms, us)| (ms * MS + 1, us * US))
            .collect();
        assert_eq!(around(&s, 6.0).baseline_p99_us, 25.0, "windows 2..5: 10, 20, 30, 40");
    }

    #[test]
    fn the_baseline_leaves_out_a_wide_window_the_disruption_falls_in() {
        // 10 ms windows; the disruption at 25 ms falls in the window [20, 30), whose late
        // packets must not count as "before".
        let mut s = steady(0, 25, 10);
        s.extend(steady(25, 30, 900));
        let a = back_to_normal(&s, Duration::from_millis(10), 25.0);
        assert_eq!(a.baseline_p99_us, 10.0, "window [10, 20) only");
        assert_eq!(a.peak_p99_us, 900.0, "the window the disruption fell in is after it");
    }

    #[test]
    fn windows_on_the_grid_hold_the_packets_that_left_in_them() {
        let s = [(100, 5 * US), (MS - 1, 7 * US), (3 * MS, 9 * US)];
        let w = latency_windows(&s, Duration::from_millis(1));
        assert_eq!(w.len(), 2, "the empty windows are left out");
        assert_eq!((w[0].start_ms, w[0].packets, w[0].p99_us), (0.0, 2, 7.0));
        assert_eq!((w[1].start_ms, w[1].packets, w[1].p50_us), (3.0, 1, 9.0));
    }
}
