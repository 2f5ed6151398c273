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
    pub(super) hist: hdrhistogram::Histogram<u64>,
    pub(super) timeline: Option<Vec<(u64, u64)>>,
}

impl Latencies {
    /// None yet; with each packet's too if `timeline`.
    pub(super) fn new(timeline: bool) -> Result<Latencies, RunError> {
        let hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
            .map_err(|e| RunError::Config(e.to_string()))?;
        Ok(Latencies { hist, timeline: timeline.then(Vec::new) })
    }

    /// Into `report`: the percentiles, and the latency per window of `width` if given.
    pub(super) fn into_report(self, report: &mut RunReport, width: Option<Duration>) {
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
            let _ = latencies.hist.record(latency);
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
