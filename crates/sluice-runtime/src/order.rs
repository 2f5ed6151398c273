//! Entry order for order-sensitive instances in a threaded run (CHC R4).
//!
//! An NF whose cross-flow decisions depend on the order of packets (`InputOrder::Clock`, e.g.
//! the portscan detector) must see them in chain-entry order, as one instance fed in entry
//! order would. With several instances of it, or of anything in front of it, packets overtake
//! each other on the way. Such an instance therefore holds what arrives and processes a clock
//! only once every earlier clock is *finished* (dropped, consumed or out of the chain: the
//! [`ClockTracker`]), processed here, or gone past this vertex for good. The earliest
//! unfinished clock never waits here, so holding cannot deadlock by itself; it costs latency,
//! not correctness, when an earlier packet is on a branch that never reaches this vertex.
//! After a failover, though, the earliest unfinished clock may be held by a recovering
//! replacement further down until its replay has drained — and the replay's copies pass
//! through this vertex, waiting for the clocks this instance holds. Such a clock has gone by
//! (it was processed here or at a sibling instance before the crash); waiting for it would
//! close the circle.

use crate::clocks::ClockTracker;
use crate::plan::{Plan, Target};
use sluice_packet::Packet;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// The packets an order-sensitive instance holds, and how far it has got.
#[derive(Debug)]
pub(crate) struct InOrder {
    held: BTreeMap<u64, Packet>,
    /// The next sequence number this instance has not processed and does not know finished.
    next: u64,
}

impl InOrder {
    /// An instance that starts before the root's first clock (sequence number 1).
    pub(crate) fn new() -> InOrder {
        InOrder { held: BTreeMap::new(), next: 1 }
    }

    /// Holds `pkt` until its turn. A second copy of a clock held already (a replay's copy
    /// after a failover upstream) is handed back: the caller ends it as a duplicate.
    pub(crate) fn hold(&mut self, pkt: Packet) -> Option<Packet> {
        match self.held.entry(pkt.meta.clock.seq()) {
            std::collections::btree_map::Entry::Occupied(_) => Some(pkt),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(pkt);
                None
            }
        }
    }

    /// Whether it holds a packet of clock `seq`, waiting for its turn.
    pub(crate) fn holds(&self, seq: u64) -> bool {
        self.held.contains_key(&seq)
    }

    /// Takes every packet held (the instance failed with them).
    pub(crate) fn take_held(&mut self) -> Vec<Packet> {
        std::mem::take(&mut self.held).into_values().collect()
    }

    /// How many packets wait for their turn.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// For a person: how many it holds, the first, and the clock it waits for.
    pub(crate) fn describe(&self) -> String {
        let first = self.held.keys().next().map_or("-".into(), u64::to_string);
        format!("{} held (first {first}), next {}", self.held.len(), self.next)
    }

    /// Moves the packets whose turn has come, in entry order, into `out`. `admitted` is the
    /// root's last admitted sequence number (published after the clock is marked in flight);
    /// `gone_by(seq)` says that clock `seq`, unfinished, has gone past this vertex for good
    /// (its copies held by a recovering replacement further down, which may wait for what
    /// this instance holds).
    pub(crate) fn take_ready(
        &mut self,
        clocks: &ClockTracker,
        admitted: &AtomicU64,
        gone_by: impl Fn(u64) -> bool,
        out: &mut Vec<Packet>,
    ) {
        let mut last = admitted.load(Ordering::Acquire);
        loop {
            if let Some(entry) = self.held.first_entry() {
                if *entry.key() <= self.next {
                    let seq = *entry.key();
                    out.push(entry.remove());
                    self.next = self.next.max(seq + 1);
                    continue;
                }
            }
            if self.next > last {
                // Not admitted as far as we know: look again before waiting.
                let now = admitted.load(Ordering::Acquire);
                if now == last {
                    return;
                }
                last = now;
                continue;
            }
            // Admitted: finished, or its slot reused by a clock a ring later (which the root
            // admits only once this one finished).
            if self.next + clocks.span() <= last || clocks.finished(self.next) || gone_by(self.next) {
                self.next += 1;
                continue;
            }
            return;
        }
    }
}

/// Which vertices of `plan` must take their input in entry order: those of an NF that needs it
/// (`InputOrder::Clock`) when packets can overtake each other on the way to it — some vertex
/// has several instances (or may have, `scalable`), or it is fed by more than one vertex (or
/// the root and a vertex). Otherwise arrival order is entry order already and holding would
/// only wait.
pub(crate) fn needs_entry_order(plan: &Plan, scalable: bool) -> Vec<bool> {
    let scaled = scalable || plan.vertices.iter().any(|v| v.instances.len() > 1);
    let mut feeders: Vec<usize> = vec![0; plan.vertices.len()];
    let vertices = plan.vertices.iter().map(|v| v.routes.iter().flatten().collect::<Vec<_>>());
    for routes in vertices.chain(std::iter::once(plan.entry.iter().collect())) {
        let mut to: Vec<usize> = routes
            .iter()
            .flat_map(|r| r.main.iter().chain(&r.mirrors))
            .filter_map(|r| match r.to {
                Target::Vertex(w) => Some(w),
                Target::Output => None,
            })
            .collect();
        to.sort_unstable();
        to.dedup();
        for w in to {
            if let Some(n) = feeders.get_mut(w) {
                *n += 1;
            }
        }
    }
    let mut ordered = vec![false; plan.vertices.len()];
    for (v, inst) in &plan.instances {
        if let Some(o) = ordered.get_mut(*v) {
            *o = inst.nf().input_order() == sluice_nf::InputOrder::Clock
                && (scaled || feeders.get(*v).is_some_and(|n| *n > 1));
        }
    }
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_packet::{Clock, Meta};

    fn pkt(seq: u64) -> Packet {
        Packet::from_slice(&[0; 14], Meta { clock: Clock::new(0, seq), ..Meta::default() })
    }

    fn seqs(v: &[Packet]) -> Vec<u64> {
        v.iter().map(|p| p.meta.clock.seq()).collect()
    }

    #[test]
    fn a_later_clock_waits_for_an_earlier_one_in_flight_elsewhere() {
        let clocks = ClockTracker::new(16);
        let admitted = AtomicU64::new(0);
        for s in 1..=3 {
            clocks.admit(Clock::new(0, s));
            admitted.store(s, Ordering::Release);
        }
        let mut o = InOrder::new();
        let mut out = Vec::new();
        o.hold(pkt(2));
        o.take_ready(&clocks, &admitted, |_| false, &mut out);
        assert!(out.is_empty(), "clock 1 is still in flight");
        // Clock 1 finishes elsewhere (dropped upstream, say): 2 goes; 3 is still in flight.
        clocks.done(Clock::new(0, 1));
        o.take_ready(&clocks, &admitted, |_| false, &mut out);
        assert_eq!(seqs(&out), vec![2]);
        o.hold(pkt(3));
        o.take_ready(&clocks, &admitted, |_| false, &mut out);
        assert_eq!(seqs(&out), vec![2, 3]);
        assert_eq!(o.held(), 0);
    }

    #[test]
    fn held_packets_leave_in_entry_order_and_unadmitted_clocks_are_waited_for() {
        let clocks = ClockTracker::new(16);
        let admitted = AtomicU64::new(0);
        let mut o = InOrder::new();
        let mut out = Vec::new();
        for s in [3, 1, 2] {
            clocks.admit(Clock::new(0, s));
            o.hold(pkt(s));
        }
        // Nothing is admitted as far as the root has said: the held ones are still in order.
        o.take_ready(&clocks, &admitted, |_| false, &mut out);
        assert_eq!(seqs(&out), vec![1, 2, 3]);
        // Clock 4 is not admitted yet: a finished-looking empty slot is not skipped.
        o.hold(pkt(5));
        clocks.admit(Clock::new(0, 5));
        admitted.store(3, Ordering::Release);
        o.take_ready(&clocks, &admitted, |_| false, &mut out);
        assert_eq!(seqs(&out), vec![1, 2, 3]);
        clocks.admit(Clock::new(0, 4));
        admitted.store(5, Ordering::Release);
        o.take_ready(&clocks, &admitted, |_| false, &mut out);
        assert_eq!(seqs(&out), vec![1, 2, 3], "4 is in flight");
        clocks.done(Clock::new(0, 4));
        o.take_ready(&clocks, &admitted, |_| false, &mut out);
        assert_eq!(seqs(&out), vec![1, 2, 3, 5]);
    }
}
