//! The end of a run: timers due by the last packet time fire, instances flush, and what the
//! run produced (outputs as the receiver saw them, decisions, final state) is collected.

use super::{client, store_err, Engine, EngineError, EngineReport, Leaving};
use crate::observed::{Decision, OutputRecord, StateEntry};
use sluice_chc::egress::Egress;
use std::collections::HashSet;

impl Engine<'_> {
    /// Ends the run: flushes instances, fires due timers, reads the final state.
    pub(super) fn finish(mut self) -> Result<EngineReport, EngineError> {
        let last_ts = self.last_ts;
        let end = self.root.last_clock();
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.inst.begin_batch();
            n.inst.advance_time(last_ts, end);
            n.inst.end_batch();
        }
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.inst.state().flush().map_err(store_err)?;
        }
        self.collect_commits();
        for n in self.nodes.iter_mut() {
            let events = n.inst.take_events();
            for e in events {
                let input = self.root.input_of(e.clock).unwrap_or(self.report.observed.inputs);
                // Timer events at the end of the run belong to no packet; the reference
                // attributes them the same way.
                let input = if e.clock == end { self.report.observed.inputs } else { input };
                self.report.observed.decisions.push(Decision {
                    input,
                    vertex: e.nf.clone(),
                    kind: e.kind.to_string(),
                    subject: e.subject,
                    detail: e.detail,
                });
            }
            if let Some(c) = client(&mut n.inst) {
                let s = c.stats();
                if s.failed_calls > 0 {
                    // Store failures are events of the schedule, never a call left unanswered:
                    // an NF that went on without its answer did something no reference does.
                    return Err(EngineError::Store(format!(
                        "{} store call(s) of an instance of {} got no answer in time; the run says nothing",
                        s.failed_calls,
                        self.vertices.get(n.vertex).map_or("?", |v| &*v.plan.name)
                    )));
                }
                self.report.stats.store_duplicates += s.duplicates;
                let name = self.vertices.get(n.vertex).map(|v| v.plan.name.to_string()).unwrap_or_default();
                *self.report.stats.round_trips.entry(name.clone()).or_default() += s.round_trips;
                *self.report.stats.cache_hits.entry(name).or_default() += s.cache_hits;
            }
        }
        // The receiver, in arrival order. The chain's egress drops replays of packets the root
        // knew had left, and any later copy of a clock (a failure of the last NF before the
        // root's delete, asynchronous or not, re-emits it). Clocks are never reused, so the
        // run-long record here drops exactly what the core's egress, forgetting deleted clocks,
        // would.
        let mut leaving = std::mem::take(&mut self.leaving);
        leaving.sort_by_key(|l| (l.at, l.order));
        let mut egress = Egress::default();
        let mut out_seen = HashSet::new();
        for Leaving { at, ingress, clock, bytes, emitted, .. } in leaving {
            if self.cfg.switches.duplicate_suppression && (emitted || !egress.pass(clock)) {
                self.report.stats.duplicates_suppressed += 1;
                continue;
            }
            if !out_seen.insert(clock) {
                self.report.stats.duplicate_outputs += 1;
            }
            let input = self.root.input_of(clock).unwrap_or(u64::MAX);
            self.latencies.push((at, at.saturating_sub(ingress)));
            self.report.observed.outputs.push(OutputRecord { input, clock: clock.0, in_port: 0, bytes });
        }
        let cp = self.backend.checkpoint().map_err(store_err)?;
        for (k, value) in cp.values {
            let Some(vx) = self.vertices.get(usize::from(k.vertex)) else { continue };
            let Some(decl) = vx.decls.get(usize::from(k.object)) else { continue };
            self.report.observed.state.push(StateEntry {
                vertex: vx.plan.name.to_string(),
                object: k.object,
                object_name: decl.name.to_string(),
                allocation: decl.allocation,
                key: k.key,
                value,
            });
        }
        self.report.observed.decisions.sort();
        self.report.observed.root_dropped.sort_unstable();
        self.report.observed.state.sort_by(|a, b| (&a.vertex, a.object, a.key).cmp(&(&b.vertex, b.object, b.key)));
        self.report.stats.egress_duplicates = egress.dropped();
        let rs = self.root.stats();
        self.report.stats.admitted = rs.admitted;
        self.report.stats.root_dropped = rs.log_full;
        self.report.stats.clock_persists = rs.clock_persists;
        self.report.stats.log_peak = rs.log_peak;
        self.report.stats.log_left = self.root.logged() as u64;
        self.sync_deletes();
        if let Some(sl) = &mut self.store_log {
            sl.sync().map_err(store_err)?;
            self.report.stats.log_store_writes = sl.writes;
            self.report.stats.log_store_write_us = sl.wall.as_secs_f64() * 1e6 / sl.writes.max(1) as f64;
        }
        let mut lat: Vec<u64> = self.latencies.iter().map(|l| l.1).collect();
        lat.sort_unstable();
        let pct = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |v| *v as f64 / 1e3);
        self.report.stats.latency_p50_us = pct(0.5);
        self.report.stats.latency_p99_us = pct(0.99);
        let latencies = std::mem::take(&mut self.latencies);
        for ep in &mut self.report.episodes {
            ep.back_to_normal_us = back_to_normal(&latencies, ep.at_packet * self.cfg.arrival_ns);
        }
        Ok(self.report)
    }
}

/// Virtual µs from `at` until output latency is back to normal: the median of 500 outputs is
/// within 1.5x of the median of the 500 before `at`.
fn back_to_normal(lat: &[(u64, u64)], at: u64) -> Option<f64> {
    let split = lat.partition_point(|l| l.0 < at);
    let before: Vec<u64> = lat[split.saturating_sub(500)..split].iter().map(|l| l.1).collect();
    if before.is_empty() {
        return None;
    }
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let normal = median(&mut before.clone()) as f64 * 1.5;
    let mut i = split;
    while i < lat.len() {
        let end = (i + 500).min(lat.len());
        let mut w: Vec<u64> = lat[i..end].iter().map(|l| l.1).collect();
        if median(&mut w) as f64 <= normal {
            return Some(lat[i].0.saturating_sub(at) as f64 / 1e3);
        }
        i += 50;
    }
    None
}
