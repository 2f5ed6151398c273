//! The sink side of the root thread: what leaves the chain (the egress drops second copies of a
//! clock when the root keeps a log), written out, with its root-to-sink latency.

use super::ft::{at_egress, Note, RootLog};
use super::outgoing::Outgoing;
use super::{RunError, Shared};
use crate::ports::Sink;
use crate::report::RunReport;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// Root-to-sink latencies of a run: all of them in a histogram, and with
/// `RunConfig::latency_timeline` each packet's (egress time, latency), ns.
pub(super) struct Latencies {
    hist: hdrhistogram::Histogram<u64>,
    /// Latencies recorded but not in `hist` yet: `.2` of them, all in the histogram's bucket
    /// `.0..=.1`. Packets of one batch left together and entered a nanosecond apart, so they
    /// mostly share a bucket: one histogram record for the run, exactly as if each were
    /// recorded (a bucket counts its values, not which they were).
    run: (u64, u64, u64),
    pub(super) timeline: Option<Vec<(u64, u64)>>,
}

impl Latencies {
    /// None yet; with each packet's too if `timeline`. Two significant digits (within 1 %):
    /// a report's percentiles need no more, and at three the latencies of a batch, entered a
    /// nanosecond apart, fell in buckets of their own below 2 µs (one histogram record each).
    pub(super) fn new(timeline: bool) -> Result<Latencies, RunError> {
        let hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 2)
            .map_err(|e| RunError::Config(e.to_string()))?;
        Ok(Latencies { hist, run: (1, 0, 0), timeline: timeline.then(Vec::new) })
    }

    /// Records one packet's `latency`, ns (values past the histogram's 60 s are left out).
    #[inline]
    pub(super) fn record(&mut self, latency: u64) {
        let (low, high, count) = &mut self.run;
        if (*low..=*high).contains(&latency) {
            *count += 1;
            return;
        }
        self.end_run();
        self.run = (self.hist.lowest_equivalent(latency), self.hist.highest_equivalent(latency), 1);
    }

    fn end_run(&mut self) {
        let (low, _, count) = self.run;
        if count > 0 {
            let _ = self.hist.record_n(low, count);
        }
        self.run.2 = 0;
    }

    /// Into `report`: the percentiles, and the latency per window of `width` if given.
    pub(super) fn into_report(mut self, report: &mut RunReport, width: Option<Duration>) {
        self.end_run();
        if let (Some(t), Some(width)) = (self.timeline, width) {
            report.set_latency_samples(t, width);
        }
        report.latency_us = crate::report::Latency::of_ns(&self.hist);
    }
}

pub(super) fn drain_sink(
    shared: &Shared,
    sink: &mut dyn Sink,
    report: &mut RunReport,
    latencies: &mut Latencies,
    t0: Instant,
    (mut log, out): (Option<&mut RootLog>, &mut Outgoing),
) -> Result<(), RunError> {
    while let Some(mut b) = shared.sink.pop() {
        let now = t0.elapsed().as_nanos() as u64;
        let n = b.len();
        if shared.logging() {
            // The egress: a clock leaves once; later copies (replays) are dropped here. The
            // root that stamped the clock hears which: root 0 (this thread's) at once, the
            // others through their notes.
            let mut tell = |note: Note| match log.as_deref_mut() {
                Some(l) if note.clock().root() == 0 => l.note(&note),
                _ => out.note(shared, note),
            };
            let mut egress = shared.egress.lock().unwrap_or_else(PoisonError::into_inner);
            for dup in b.extract_if(.., |p| {
                let note = at_egress(&mut egress, &p.meta);
                let duplicate = matches!(note, Note::Finished(_));
                tell(note);
                duplicate
            }) {
                tracing::trace!(target: "sluice::copies", clock = %dup.meta.clock, flags = dup.meta.flags.bits(), "copy ends at the egress: a duplicate");
                shared.clocks.done(dup.meta.clock);
                shared.pool.recycle(dup);
            }
        }
        for p in &b {
            report.packets_out += 1;
            report.bytes_out += p.len() as u64;
            shared.clocks.done(p.meta.clock);
            let latency = now.saturating_sub(p.meta.ingress_ns).max(1);
            latencies.record(latency);
            if let Some(t) = latencies.timeline.as_mut() {
                t.push((now, latency));
            }
        }
        let written = b.len() as u64;
        let r = sink.write(&b);
        shared.pool.recycle_batch(&mut b);
        shared.give_back(b);
        // Every copy taken from the sink queue is done, duplicates included; only those
        // written count as output.
        let left = shared.in_flight.fetch_sub(n, Ordering::AcqRel).saturating_sub(n);
        if let Some(live) = &shared.live {
            live.output(written, left);
        }
        r?;
    }
    out.flush_notes(shared);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Latencies;

    #[test]
    fn latencies_recorded_in_runs_make_the_histogram_of_each_recorded_alone() {
        // Runs of nearby values (a batch), jumps, values at bucket edges, one past the range.
        let mut values: Vec<u64> = (0..40).map(|i| 20_000 + i).collect();
        values.extend([1, 2, 2047, 2048, 2049, 4095, 4096, 20_000, 19_999, 70_000_000_000, 5]);
        values.extend((0..100u64).map(|i| (i * 7_919) % 300_000 + 1));
        let mut runs = Latencies::new(false).expect("bounds are valid");
        let mut each = Latencies::new(false).expect("bounds are valid");
        for &v in &values {
            runs.record(v);
            let _ = each.hist.record(v);
        }
        runs.end_run();
        assert_eq!(runs.hist.len(), each.hist.len());
        assert_eq!(runs.hist.len(), values.len() as u64 - 1, "the value past 60 s is left out");
        assert_eq!((runs.hist.min(), runs.hist.max()), (each.hist.min(), each.hist.max()));
        for q in [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(runs.hist.value_at_quantile(q), each.hist.value_at_quantile(q), "quantile {q}");
        }
        let buckets = |l: &Latencies| {
            l.hist.iter_recorded().map(|v| (v.value_iterated_to(), v.count_at_value())).collect::<Vec<_>>()
        };
        assert_eq!(buckets(&runs), buckets(&each));
    }
}
