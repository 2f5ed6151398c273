//! Replay copies passing through on their way to a replacement further down the chain (CHC R5
//! in a threaded run).
//!
//! A replay towards a replacement at vertex `t` enters at the root and travels the chain's path
//! through the vertices in front of `t`. Those vertices have processed the clock already (or
//! will, when its live copy's turn comes): running their NF again would apply its updates twice
//! and decide against state later packets changed. They emit instead what their first
//! processing of the clock emitted. So, with crashes possible, every instance of a vertex that
//! leads to another keeps, per clock still logged, the packet its NF emitted and its verdict
//! ([`Passing`]); a replay copy passing through leaves as that packet, with its own replay marks,
//! and goes on only towards its target (`Outgoing::route`). A copy of a clock the instance has
//! not processed yet (its live copy waits its turn at an order-sensitive instance) waits for it.
//!
//! The record belongs to the worker, not the NF instance: like the root's log it survives the
//! instance's crash (CHC keeps it in the framework), while copies waiting for their clock are
//! lost with the instance's queue and sent again by the root.

use super::worker::{end_copy, hand_on, Ended, Slot};
use super::{Outgoing, Shared};
use sluice_nf::Verdict;
use sluice_packet::{Clock, Meta, Packet, PacketPool};
use std::collections::BTreeMap;

/// What an instance emitted per clock, and the replay copies waiting for a clock.
#[derive(Default)]
pub(super) struct Passing {
    /// By clock: the emitted packet (none if the NF dropped it) and the verdict.
    emitted: BTreeMap<Clock, (Option<Packet>, Verdict)>,
    /// By clock: replay copies waiting until the instance processed the clock.
    awaiting: BTreeMap<Clock, Vec<Packet>>,
    /// Replay copies to emulate ([`emulate`]) once the packets this order-sensitive instance
    /// holds before them in entry order have gone, in arrival order.
    behind: Vec<Packet>,
}

impl Passing {
    /// Records what the first processing of `pkt`'s clock emitted (later ones change nothing).
    pub(super) fn record(&mut self, pool: &PacketPool, pkt: &Packet, verdict: Verdict) {
        self.emitted.entry(pkt.meta.clock).or_insert_with(|| {
            let kept = (!matches!(verdict, Verdict::Drop(_))).then(|| pool.copy_of(pkt));
            (kept, verdict)
        });
    }

    /// For a person: the replay copies waiting for their clock, from which clock.
    pub(super) fn describe(&self) -> String {
        let n: usize = self.awaiting.values().map(Vec::len).sum();
        let first = self.awaiting.keys().next().map_or("-".into(), Clock::to_string);
        let behind = self.behind.len();
        format!(
            "{n} copies waiting (first {first}), {behind} behind held packets, {} clocks recorded",
            self.emitted.len()
        )
    }

    /// The replay copies that waited for `clock`.
    pub(super) fn take_awaiting(&mut self, clock: Clock) -> Vec<Packet> {
        self.awaiting.remove(&clock).unwrap_or_default()
    }

    /// Every copy waiting (lost with a crashed instance).
    pub(super) fn take_all_awaiting(&mut self) -> impl Iterator<Item = Packet> {
        let behind = std::mem::take(&mut self.behind);
        std::mem::take(&mut self.awaiting).into_values().flatten().chain(behind)
    }

    /// Forgets the clocks of `oldest`'s root below it: no longer logged, so never replayed
    /// again.
    pub(super) fn trim_below(&mut self, oldest: Clock, pool: &PacketPool) {
        let first = Clock::new(oldest.root(), 0);
        while let Some(c) = self.emitted.range(first..oldest).next().map(|(c, _)| *c) {
            if let Some((Some(p), _)) = self.emitted.remove(&c) {
                pool.recycle(p);
            }
        }
    }
}

/// Whether `pkt` is a replay copy passing through `slot` towards a later vertex.
pub(super) fn passes(slot: &Slot, pkt: &Packet) -> bool {
    pkt.meta.replay_target().is_some_and(|t| usize::from(t.vertex()) != slot.vertex)
}

/// Sends replay copy `pkt` on as `slot`'s first processing of its clock left it, or keeps it
/// until that processing. Whether the copy ended here (the caller counts it out of the packets
/// in flight).
pub(super) fn pass_on(shared: &Shared, slot: &mut Slot, pkt: Packet, out: &mut Outgoing) -> bool {
    // Its packet waits here, for a change to settle or for its turn in entry order: it never
    // went past this instance, so the replacement further down did not lose it and gets it
    // when it goes. Waiting for it instead would tie the recovery to what the packet waits
    // for — an earlier clock the recovering replacement holds, say (a NAT recovering on a
    // bridge whose reverse path crosses an order-sensitive detector before it). Not where
    // the copy waiting here is a replay's (this instance's own replacement replay): after
    // it, instances that processed the clock drop it as a duplicate, and the replacement
    // further down would never get the clock (a balancer and a NAT on a node that died,
    // the balancer holding its replay in entry order): such a copy waits for its processing.
    // Processed here or by a predecessor on a node that failed, whose record died with it.
    let gone_by = super::failover::processed_before(slot, pkt.meta.clock);
    // A packet of a clock gone by that waits here ends as a duplicate when its turn comes: it
    // carries nothing on, so the copy may not end on its account.
    let waiting_here = !gone_by
        && (super::reconfig::is_waiting(slot, pkt.meta.clock)
            || slot.order.as_ref().is_some_and(|o| o.holds_live(&pkt.meta)));
    let Some(passing) = slot.passing.as_mut() else {
        // A vertex that leads nowhere: no replay passes through it (`Outgoing::route`).
        end_copy(shared, &mut slot.stats, out, pkt, Ended::Decided);
        return true;
    };
    let Some((emitted, verdict)) = passing.emitted.get(&pkt.meta.clock) else {
        if waiting_here {
            end_copy(shared, &mut slot.stats, out, pkt, Ended::Decided);
            return true;
        }
        if gone_by {
            if slot.order.as_ref().is_some_and(|o| o.holds_before(&pkt.meta)) {
                // Not past an earlier packet this instance holds: see `emulate_due`.
                passing.behind.push(pkt);
                return false;
            }
            return emulate(shared, slot, pkt, out);
        }
        passing.awaiting.entry(pkt.meta.clock).or_default().push(pkt);
        return false;
    };
    slot.stats.replays_passed += 1;
    let verdict = *verdict;
    let Some(emitted) = emitted else {
        end_copy(shared, &mut slot.stats, out, pkt, Ended::Decided);
        return true;
    };
    let copy = shared.pool.copy_of(emitted);
    let marks = pkt.meta;
    shared.pool.recycle(pkt);
    send_on(shared, slot, (copy, marks), verdict, out)
}

/// Sends `pkt`, what this vertex emitted for a replay copy, on towards the copy's target
/// with the copy's own replay marks and XOR bits (`marks`). Whether it ended here.
fn send_on(
    shared: &Shared,
    slot: &mut Slot,
    (mut pkt, marks): (Packet, Meta),
    verdict: Verdict,
    out: &mut Outgoing,
) -> bool {
    pkt.meta.flags = marks.flags;
    pkt.meta.target = marks.target;
    pkt.meta.xor = marks.xor;
    pkt.meta.ingress_ns = marks.ingress_ns;
    match hand_on(shared, slot.vertex, pkt, verdict, out) {
        None => false,
        Some((p, _)) => {
            // Its own drop, or a way that does not lead to the target: it ends, silently.
            end_copy(shared, &mut slot.stats, out, p, Ended::Decided);
            true
        }
    }
}

/// Sends replay copy `pkt` on as `slot`'s NF decides on it now, its updates emulated
/// ([`sluice_nf::Instance::process_emulated`]): the clock was processed here or by a
/// predecessor whose record of it died with its node, and a replacement further down may
/// still need it — the one the copy is bound for, recovering while this vertex's node failed
/// too (CHC recovers two NFs failing together; its intermediate NFs always emulate). An NF
/// whose decision on the clock depends on state changed since may decide otherwise than the
/// first time. Whether the copy ended here.
fn emulate(shared: &Shared, slot: &mut Slot, mut pkt: Packet, out: &mut Outgoing) -> bool {
    let marks = pkt.meta;
    let verdict = slot.inst.process_emulated(&mut pkt);
    slot.stats.replays_passed += 1;
    send_on(shared, slot, (pkt, marks), verdict, out)
}

/// At an order-sensitive instance's turn: emulates the replay copies that waited behind the
/// packets it held before them in entry order, once those have gone: how many went (`None`:
/// none), and how many of those ended here.
///
/// Such a copy's clock was processed by a predecessor whose record of it died with its node,
/// so it goes on emulated; were it to go at once, it would overtake an earlier packet of its
/// flow held here in entry order, whose own replay copy ends here (its packet goes on later),
/// and the replacement it is bound for would go through the later clock first and output the
/// earlier one after it. Found with two nodes failing one after the other (`spread.rs`): the
/// detector's replacement runs again the clocks its predecessor processed without a state
/// update (the store cannot say it processed them) and holds them in entry order, while the
/// store says the later clocks of those flows were processed. Waiting here is waiting for
/// what the entry order waits for anyway, which never includes what a recovery further down
/// holds.
pub(super) fn emulate_due(shared: &Shared, slot: &mut Slot, out: &mut Outgoing) -> Option<usize> {
    let passing = slot.passing.as_mut().filter(|p| !p.behind.is_empty())?;
    let copies = std::mem::take(&mut passing.behind);
    let waiting = copies.len();
    let mut ended = 0;
    for pkt in copies {
        if slot.order.as_ref().is_some_and(|o| o.holds_before(&pkt.meta)) {
            if let Some(p) = slot.passing.as_mut() {
                p.behind.push(pkt);
            }
            continue;
        }
        ended += usize::from(emulate(shared, slot, pkt, out));
    }
    let still = slot.passing.as_ref().map_or(0, |p| p.behind.len());
    (still < waiting).then_some(ended)
}

/// `clock`'s packet now waits at `slot` (for a change to settle, or for its turn in entry
/// order): the replay copies that waited here for it end, as [`pass_on`] ends those arriving
/// after. How many.
pub(super) fn end_awaiting(shared: &Shared, slot: &mut Slot, clock: Clock, out: &mut Outgoing) -> usize {
    let waiting = slot.passing.as_mut().map(|p| p.take_awaiting(clock)).unwrap_or_default();
    let ended = waiting.len();
    for p in waiting {
        end_copy(shared, &mut slot.stats, out, p, Ended::Decided);
    }
    ended
}

/// After `slot` processed `clock`: the replay copies that waited for it go on. How many
/// ended here.
pub(super) fn release(shared: &Shared, slot: &mut Slot, clock: Clock, out: &mut Outgoing) -> usize {
    let waiting = slot.passing.as_mut().map(|p| p.take_awaiting(clock)).unwrap_or_default();
    waiting.into_iter().map(|p| usize::from(pass_on(shared, slot, p, out))).sum()
}
