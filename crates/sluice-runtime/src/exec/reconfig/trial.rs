//! Clone trials in a threaded run (docs/decisions.md, "Clones in threads"): a straggler's
//! clone takes its place from a clock on; once the clone has processed a trial's worth of
//! packets, the faster of the two keeps the flows.

use super::{At, RootSide, Shared};
use crate::report::{ReconfigReport, TrialReport};
use sluice_chc::manager::{keep_clone, InstanceLoad};
use sluice_chc::NodeId;
use std::sync::atomic::Ordering;

/// A straggler's clone on trial: it serves the straggler's flows from change `change` on; once it
/// has processed [`TRIAL_PACKETS`], the faster of the two keeps them.
pub(super) struct Trial {
    pub(super) vertex: usize,
    pub(super) straggler: usize,
    pub(super) clone: usize,
    /// The change that put the clone in the straggler's place (its number).
    pub(super) change: u64,
    /// The straggler's time per packet before the clone took over, ns.
    pub(super) before: f64,
    /// The clone's (packets, busy ns) once it had warmed up ([`TRIAL_WARM_UP`] packets).
    pub(super) clone_from: Option<(u64, u64)>,
    /// Its report entry.
    pub(super) report: usize,
}

/// How many packets a clone processes before its trial ends (the engine's default trial).
const TRIAL_PACKETS: u64 = 2_000;

/// The packets of a trial not measured: a clone starts with no copies of its flows' values and
/// reads each on the flow's first packet, which its straggler did long ago.
const TRIAL_WARM_UP: u64 = 500;

/// Instance `g`'s time per packet, ns, since its counters read `from` (packets, busy ns); 0
/// without live statistics or packets.
pub(super) fn ns_per_packet(shared: &Shared, g: usize, from: (u64, u64)) -> f64 {
    let Some((packets, busy)) = shared.live.as_ref().map(|l| l.work(g)) else { return 0.0 };
    let n = packets.saturating_sub(from.0);
    if n == 0 {
        return 0.0;
    }
    busy.saturating_sub(from.1) as f64 / n as f64
}

impl RootSide {
    /// Ends the trials whose clone has processed enough, `at` now: the faster instance keeps
    /// the straggler's flows. A clone slower than its straggler was hands them back.
    pub(in crate::exec) fn judge_trials(&mut self, shared: &Shared, at: At, reports: &mut Vec<ReconfigReport>) {
        let Some(sc) = &shared.scaling else { return };
        let Some(live) = &shared.live else { return };
        let mut i = 0;
        while let Some(t) = self.trials.get_mut(i) {
            let settled = !self.pending.iter().any(|p| p.vertex == t.vertex && p.change <= t.change);
            if settled && !sc.alloc.current(t.vertex).is_some_and(|e| e.members().any(|m| m == t.clone)) {
                // The clone itself was replaced (cloned in turn, scaled in): nothing to judge.
                self.trials.remove(i);
                continue;
            }
            let work = live.work(t.clone);
            if t.clone_from.is_none() && work.0 >= TRIAL_WARM_UP {
                t.clone_from = Some(work);
            }
            let measured = t.clone_from.map_or(0, |f| work.0.saturating_sub(f.0));
            if !settled || measured < TRIAL_PACKETS - TRIAL_WARM_UP {
                i += 1;
                continue;
            }
            let t = self.trials.remove(i);
            let during = ns_per_packet(shared, t.clone, t.clone_from.unwrap_or_default());
            // The core's verdict, as the engine's: the lower time per packet, then the smaller
            // backlog (the straggler's now is what it left queued when the clone took over).
            let load = |g: usize, ns_per_packet: f64| InstanceLoad {
                node: NodeId(g),
                backlog: sc.queue_packets.get(g).map_or(0, |q| q.load(Ordering::Relaxed).max(0) as u64),
                ns_per_packet,
                cloning: true,
            };
            let clone_kept = keep_clone(&load(t.straggler, t.before), &load(t.clone, during));
            if let Some(r) = reports.get_mut(t.report) {
                r.trial = Some(TrialReport { straggler_ns: t.before, clone_ns: during, clone_kept });
            }
            if clone_kept {
                continue;
            }
            // The straggler takes its flows back, as a change like any other.
            let Some(current) = sc.alloc.current(t.vertex) else { continue };
            let mut splitter = current.splitter.clone();
            splitter.replace(NodeId(t.clone), NodeId(t.straggler));
            self.set_serving(shared, t.straggler, true);
            let n = splitter.members().len();
            let name = shared.vertices.get(t.vertex).map(|v| v.name.to_string()).unwrap_or_default();
            reports.push(ReconfigReport {
                kind: "clone_back".into(),
                vertex: name,
                at_packet: at.packet,
                at_ms: at.ms,
                instances: (n, n),
                flows: 0,
                settle_ms: 0.0,
                drain_ms: 0.0,
                trial: None,
            });
            let back = (Some(vec![t.clone]), reports.len() - 1);
            // The members before the change settle it too: the clone gives every flow up, so it
            // flushes its updates, hands its timers over and retires before the straggler
            // takes a packet (or loads the vertex's values, left alone again).
            let before: Vec<usize> = current.members().collect();
            if let Err(e) = self.changed(shared, (t.vertex, at.cut(shared)), splitter, back.0, back.1, &before) {
                tracing::warn!(vertex = t.vertex, error = %e, "the straggler could not take its flows back");
            }
        }
    }
}
