//! Instances replaced on the root's node: those of a node that failed, and one that crashed
//! alone on a node without the root (docs/decisions.md, "One instance of another node crashing
//! alone").
//!
//! A node without the root carries out the crash of one of its instances itself (the worker,
//! `failover/handover.rs`); its link then tells the root's node, in the node's ordered stream
//! behind every note the instance sent: one `Lost` note per copy the instance held, then
//! `Crashed`. From then on the instance is the root's node's on both sides: this node relays
//! what still comes for it, after the note. The root's node takes those copies out of what it
//! counts on the node and replaces the instance in its dormant slot exactly as it replaces a
//! failed node's instances, with these lost copies.

use super::on_node::marks;
use super::Link;
use crate::exec::failover::{Failover, HandedOver, LostClocks, LostElsewhere};
use crate::exec::{RunError, Shared};
use sluice_chc::clockset::ClockSet;
use sluice_packet::{Clock, Meta, MetaFlags};
use sluice_wire::notes::{NoteKind, WireNote};
use std::sync::Arc;
use std::time::Instant;

impl Link {
    /// On a node without the root: the crashes its control endpoint asked for, each carried
    /// out by the worker that runs the instance.
    pub(super) fn take_crashes_asked(&mut self, shared: &Shared) {
        let (Some(live), Some(fo)) = (&shared.live, &shared.failover) else { return };
        if self.layout.has_root() {
            return;
        }
        for ((vertex, index), reply) in live.take_crashes() {
            match shared.serving(vertex, index).filter(|g| self.layout.here(*g)) {
                Some(g) => {
                    fo.ask_crash(g);
                    shared.wake.queued(g);
                    reply.done(crate::live::Done::default());
                }
                None => reply.refused(format!("this node no longer runs instance {index}: nothing crashed")),
            }
        }
    }

    /// On a node without the root: the instances crashed here, told the root's node after the
    /// notes queued so far (`notes`, which the caller took after `handed`), and the root's
    /// node's from now on.
    pub(super) fn hand_over(&mut self, handed: Vec<HandedOver>) {
        let root = self.layout.root;
        for h in handed {
            let lost = h.lost.iter().map(|m| WireNote { kind: NoteKind::Lost, meta: marks(m) });
            self.notes.extend(lost);
            let processed = h.processed.words().map(|(clock, xor)| WireNote {
                kind: NoteKind::Processed,
                meta: Meta { clock, xor, ..Meta::default() },
            });
            self.notes.extend(processed);
            let meta = Meta { target: Some(h.id), xor: h.global as u64, ..Meta::default() };
            self.notes.push(WireNote { kind: NoteKind::Crashed, meta });
            if let Some(n) = self.layout.node_of.get_mut(h.global) {
                *n = root;
            }
            self.remote.push(h.global);
            self.relayed.push(h.global);
            self.report.crashed_instances += 1;
        }
    }

    /// On the root's node: what node `n` said crashed (`Crashed`, with the `Lost` notes
    /// before it) is replaced here. A note naming an instance that is not that node's is
    /// counted malformed and changes nothing.
    pub(super) fn take_over_crashed(&mut self, shared: &Shared, n: usize, crashed: Meta) -> Result<(), RunError> {
        let lost = self.lost_heard.get_mut(n).map(std::mem::take).unwrap_or_default();
        let processed = self.processed_heard.get_mut(n).map(std::mem::take).unwrap_or_default();
        let g = usize::try_from(crashed.xor).unwrap_or(usize::MAX);
        let theirs = self.layout.node_of.get(g) == Some(&n) && self.remote.contains(&g);
        let Some(fo) = shared.failover.as_ref().filter(|_| theirs && self.layout.has_root()) else {
            self.report.malformed += 1;
            self.report.last_error =
                Some(format!("node `{}` said instance {g} crashed: not one of its own", self.name(n)));
            return Ok(());
        };
        if let Some(on) = self.on_node.get_mut(n) {
            for m in &lost {
                on.left(m);
            }
        }
        let instance = crashed.target.map_or_else(|| format!("#{g}"), |t| format!("{t:?}"));
        tracing::warn!(node = %self.name(n), %instance, lost_copies = lost.len(), "an instance of another node crashed: replaced on the root's node, which replays its log to it");
        self.report.crashed_instances += 1;
        self.take_over(shared, fo, (vec![g], lost, Some(processed)), Instant::now());
        Ok(())
    }

    /// On the root's node: instances `globals` of another node are this node's from now on,
    /// replaced in their dormant slots here (the root asks their crashes, `asking.rs`), with
    /// the copies `lost` with them and, when their node said, the clocks they `processed`;
    /// `heard`: when they were last known to run.
    pub(super) fn take_over(
        &mut self,
        shared: &Shared,
        fo: &Failover,
        (globals, lost, processed): (Vec<usize>, Vec<Meta>, Option<ClockSet>),
        heard: Instant,
    ) {
        let me = self.layout.me;
        self.remote.retain(|g| !globals.contains(g));
        for g in &globals {
            shared.wake.link_drains(*g, false);
            if let Some(live) = &shared.live {
                live.set_elsewhere(*g, false);
            }
            if let Some(x) = self.layout.node_of.get_mut(*g) {
                *x = me;
            }
        }
        // Every instance taken over learns which clocks had a copy with it; the last to crash
        // reports the copies.
        let clocks = |mirror: bool| {
            let mut c: Vec<Clock> =
                lost.iter().filter(|m| m.flags.contains(MetaFlags::MIRROR) == mirror).map(|m| m.clock).collect();
            c.dedup();
            c
        };
        let on_node = Arc::new(LostClocks { main: clocks(false), mirror: clocks(true) });
        fo.lost_elsewhere(LostElsewhere { globals: globals.clone(), lost, on_node, processed });
        if let Ok(mut f) = shared.failed_elsewhere.lock() {
            f.extend(globals.into_iter().map(|g| (g, heard)));
        }
    }
}
