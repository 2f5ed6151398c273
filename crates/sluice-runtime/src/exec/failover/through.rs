//! A recovering replacement goes through its replay as it arrives: up to the earliest copy a
//! root still has on its way to it (docs/decisions.md, "A replacement goes through its replay
//! as it arrives").

use super::{Failover, Slot};
use crate::exec::{Outgoing, Shared};
use sluice_chc::clockset::ClockSet;
use sluice_packet::{Clock, Meta, Packet};

impl Failover {
    /// Root `root` says how far its replay towards instance `global` after crash `epoch` has
    /// reached it.
    pub(super) fn publish_frontier(&self, global: usize, root: u8, epoch: u64, first: Option<(Clock, u64)>) {
        let slot = self.frontiers.get(global).and_then(|f| f.get(usize::from(root)));
        if let Some(mut f) = slot.and_then(|f| f.lock().ok()) {
            *f = Frontier { epoch, first };
        }
    }

    /// The earliest copy (clock, entry time) of each root's replay towards instance `global`
    /// still on its way to it after its crash `epoch` (roots whose replay has drained left
    /// out); `None` while a root has not replayed after that crash yet.
    pub(super) fn frontier(&self, global: usize, epoch: u64) -> Option<Vec<(Clock, u64)>> {
        let mut firsts = Vec::new();
        for f in self.frontiers.get(global)? {
            let f = *f.lock().ok()?;
            if f.epoch < epoch {
                return None;
            }
            firsts.extend(f.first);
        }
        Some(firsts)
    }
}

/// How far a root's replay after a crash has reached the replacement: the crash, and the
/// earliest copy (clock, entry time) still on its way (`None`: every copy reached it or ended).
#[derive(Clone, Copy, Default)]
pub(super) struct Frontier {
    epoch: u64,
    first: Option<(Clock, u64)>,
}

/// A recovering replacement goes through the copies it holds that come, in entry order, before
/// every copy of its replay still on its way: those can no longer be overtaken. Why not wait
/// for the whole replay: a replay towards another replacement may pass through this one and
/// need what it emits for a clock it has not processed yet, while this one's replay passes
/// through the other the same way (the NAT and the LB of a chain with reverse edges failing
/// together). Each waits only for earlier clocks, so neither waits for good. Whether any went.
pub(super) fn go_through_reached(shared: &Shared, fo: &Failover, slot: &mut Slot, out: &mut Outgoing) -> bool {
    let Some(r) = slot.recovery.as_mut() else { return false };
    let Some(firsts) = fo.frontier(slot.global, r.epoch) else { return false };
    let several = fo.oldest_logged.len() > 1;
    let before =
        |m: &Meta| firsts.iter().all(|(c, t)| if several { (m.ingress_ns, m.clock) < (*t, *c) } else { m.clock < *c });
    let mut due: Vec<Packet> = r.replay.extract_if(.., |p| before(&p.meta)).collect();
    due.extend(r.held.extract_if(.., |p| before(&p.meta)));
    if due.is_empty() {
        return false;
    }
    let predecessor = std::mem::take(&mut r.predecessor);
    go_through(shared, fo, slot, (&predecessor, due), out);
    if let Some(r) = slot.recovery.as_mut() {
        r.predecessor = predecessor;
    }
    true
}

/// A recovering replacement goes through `due` (copies of its replay and live packets it held)
/// in entry order, as an instance that is not recovering: what its predecessors processed
/// (`predecessor`) counts as processed here first, so a copy of such a clock ends as a
/// duplicate (and, should it fail too, its replacement skips it).
pub(super) fn go_through(
    shared: &Shared,
    fo: &Failover,
    slot: &mut Slot,
    (predecessor, mut due): (&ClockSet, Vec<Packet>),
    out: &mut Outgoing,
) {
    if let Some(seen) = slot.seen.as_mut() {
        seen.union_with(predecessor);
    }
    for p in &due {
        fo.held(slot.vertex, p.meta.clock, false);
    }
    // One clock order over both: an instance in front that waited for a change to settle
    // ends the replay copies of the packets waiting there and sends those packets live; when
    // the change settles while the replay passes, a flow's earlier packets come live and its
    // later ones in the replay (random schedules: a scaled NAT in front of a failing Trojan
    // detector), and replay-then-live would reorder them. Stable: a replay copy goes before
    // the live copy of its clock, a duplicate then. With several roots, entry order is entry
    // time first (`InOrder`'s order).
    let several = fo.oldest_logged.len() > 1;
    due.sort_by_key(|p| (if several { p.meta.ingress_ns } else { 0 }, p.meta.clock));
    let mut batch = shared.empty_batch();
    batch.extend(due);
    // Taken in as if it had come from the queue: not held again while the rest still comes.
    let recovering = slot.recovery.take();
    crate::exec::worker::take_in(shared, slot, batch, out);
    slot.recovery = recovering;
}
