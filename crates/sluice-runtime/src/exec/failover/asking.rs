//! How root 0 asks for crashes: from the schedule, from the control endpoint, and for the
//! instances of a node that failed.
//!
//! Crashes planned at the same point as root 0's own crash fail with it: they are asked once
//! the root has crashed, so the old root cannot replay their lost copies in between (which
//! copies survive then depends on where the log is, not on which thread ran first;
//! docs/decisions.md, "Root crashes in threads").

use super::{Crash, RootSide};
use crate::exec::Shared;
use crate::live::Done;
use crate::report::FailoverReport;
use std::sync::atomic::Ordering;

impl RootSide {
    /// Asks for the crashes asked through the control endpoint since the last look, at packet
    /// `at.0` (`at.1` ms into the run); the endpoint names instances by index.
    pub(in crate::exec) fn take_live(&mut self, shared: &Shared, at: (u64, f64), reports: &mut Vec<FailoverReport>) {
        let Some(live) = shared.live.as_ref().filter(|_| shared.failover.is_some()) else { return };
        for ((vertex, index), reply) in live.take_crashes() {
            let c = Crash { after: at.0, vertex, index };
            match shared.serving(vertex, index) {
                Some(g) => {
                    self.ask(shared, (&c, g, at.1), reports);
                    reply.done(Done { at_packet: Some(at.0), change: None });
                }
                None => reply.refused(format!("instance {index} no longer serves flows")),
            }
        }
    }

    /// Asks for the crashes of the instances whose node failed (`spread.rs` found it silent),
    /// at packet `at.0`, `at.1` ms into the run: each is replaced on this node and the root
    /// replays its log to it, as for an instance that failed here.
    pub(in crate::exec) fn take_elsewhere(
        &mut self,
        shared: &Shared,
        at: (u64, f64),
        reports: &mut Vec<FailoverReport>,
    ) {
        let failed = match shared.failed_elsewhere.lock() {
            Ok(mut f) if !f.is_empty() => std::mem::take(&mut *f),
            _ => return,
        };
        for (g, heard) in failed {
            let Some(vertex) = shared.vertices.iter().position(|v| v.instances.contains(&g)) else { continue };
            let c = Crash { after: at.0, vertex, index: shared.index_of(vertex, g) };
            self.ask(shared, (&c, g, at.1), reports);
            if let Some(r) = reports.last_mut() {
                r.failed_ms = (at.1 - heard.elapsed().as_secs_f64() * 1e3).max(0.0);
            }
            // After the ask: the worker that wakes the slot finds the crash asked.
            if let Some(e) = shared.elsewhere.get(g) {
                e.store(false, Ordering::Release);
            }
        }
    }

    /// The root asks for crash `c` (of instance `global`), `asked_ms` into the run, and opens
    /// its report entry.
    pub(in crate::exec) fn ask(
        &mut self,
        shared: &Shared,
        (c, global, asked_ms): (&Crash, usize, f64),
        failovers: &mut Vec<FailoverReport>,
    ) {
        let Some(fo) = &shared.failover else { return };
        let vertex = shared.vertices.get(c.vertex).map(|v| v.name.to_string()).unwrap_or_default();
        let (instance, at_packet) = (c.index, c.after);
        failovers.push(FailoverReport {
            vertex,
            instance,
            at_packet,
            asked_ms,
            failed_ms: asked_ms,
            ..FailoverReport::default()
        });
        let ask = (global, failovers.len() - 1);
        if self.asked.iter().any(|(g, _)| *g == global) {
            self.deferred.push(ask);
            return;
        }
        self.asked.push(ask);
        if let Some(f) = fo.crash.get(global) {
            f.store(true, Ordering::Release);
        }
    }

    /// Holds planned crash `c` of instance `global`: the root asks it between two batches
    /// ([`RootSide::ask_held`]), after its own crash if one is due.
    pub(in crate::exec) fn hold(&mut self, c: Crash, global: usize) {
        self.held.push((c, global));
    }

    /// Asks the crashes held, `now_ms` into the run.
    pub(in crate::exec) fn ask_held(&mut self, shared: &Shared, now_ms: f64, failovers: &mut Vec<FailoverReport>) {
        for (c, global) in std::mem::take(&mut self.held) {
            self.ask(shared, (&c, global, now_ms), failovers);
        }
    }
}
