//! A crash on a node without the root, in a chain spread over nodes (docs/decisions.md, "One
//! instance of another node crashing alone").
//!
//! The node carries the crash out as one process does — the instance's store client settles
//! what it sent, so the store's per-clock log holds every update it made and the root hears of
//! those commits first; its queue and whatever it held become its lost copies — but builds no
//! replacement: the root's log, the replay and the dormant slot that takes a failed node's
//! instances over are on the root's node. The worker hands the crash to the node's link
//! ([`HandedOver`]), which tells the root's node the lost copies and the crash, in order behind
//! every note the instance sent, and from then on relays what still comes for the instance
//! there. The root's node replaces it as it replaces a failed node's instances, with exactly
//! these lost copies.

use super::{take_lost, Failover};
use crate::exec::passing::Passing;
use crate::exec::worker::Slot;
use crate::exec::{Outgoing, Shared};
use sluice_chc::clockset::ClockSet;
use sluice_packet::{InstanceId, Meta};
use std::sync::atomic::Ordering;

/// An instance this node crashed, for its link to tell the root's node.
pub(in crate::exec) struct HandedOver {
    /// Its global index.
    pub(in crate::exec) global: usize,
    /// Its id.
    pub(in crate::exec) id: InstanceId,
    /// The copies it held (lost with it).
    pub(in crate::exec) lost: Vec<Meta>,
    /// The clocks it processed (still logged, as far as it knew): its replacement skips their
    /// replay copies, as a replacement in one process does.
    pub(in crate::exec) processed: ClockSet,
}

impl Failover {
    /// Asks for the crash of instance `global`: its worker carries it out at its next turn.
    pub(in crate::exec) fn ask_crash(&self, global: usize) {
        if let Some(f) = self.crash.get(global) {
            f.store(true, Ordering::Release);
        }
    }

    /// The crashes carried out on this node since the last look, oldest first.
    pub(in crate::exec) fn take_handed_over(&self) -> Vec<HandedOver> {
        self.handed.lock().map(|mut h| std::mem::take(&mut *h)).unwrap_or_default()
    }
}

/// `slot`'s instance failed on a node without the root (its store client settled already):
/// what it held becomes its lost copies, its decisions so far stay this node's, and the
/// instance is the root's node's from now on — dormant here, its queue drained by the link.
pub(super) fn hand_over(shared: &Shared, fo: &Failover, slot: &mut Slot, out: &mut Outgoing) {
    let (lost, processed) = take_lost(shared, fo, slot);
    slot.stats.events.extend(slot.inst.take_events());
    // What it emitted for replays passing through dies with it, as on a node that failed.
    if let Some(p) = slot.passing.as_mut() {
        for root in 0..shared.roots {
            p.trim_below(sluice_packet::Clock::new(root, u64::MAX), &shared.pool);
        }
        *p = Passing::default();
    }
    slot.handed_over = true;
    // Every note it sent is queued before the crash is: the root's node hears of them first.
    out.flush_notes(shared);
    while out.retry(shared) {
        std::thread::yield_now();
    }
    let g = slot.global;
    if let Some(e) = shared.elsewhere.get(g) {
        e.store(true, Ordering::Release);
    }
    shared.wake.link_drains(g, true);
    if let Some(live) = &shared.live {
        live.set_elsewhere(g, true);
    }
    let id = slot.inst.id();
    tracing::warn!(instance = %format_args!("{}:{}", slot.inst.vertex(), id.index()), lost_copies = lost.len(), "instance crashed: the root's node replaces it and replays what it held");
    if let Ok(mut h) = fo.handed.lock() {
        h.push(HandedOver { global: g, id, lost, processed });
    }
    shared.wake.notes_queued();
}
