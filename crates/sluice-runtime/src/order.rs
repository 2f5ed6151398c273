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
use crate::plan::{Plan, Routes};
use sluice_chc::order::OrderKey;
use sluice_packet::{Clock, Meta, Packet};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// How far the roots have got, as order-sensitive instances read it (per root).
pub(crate) struct Admissions {
    /// The last sequence number each root admitted (published after its clock, and entry
    /// time, are in the tracker).
    pub(crate) admitted: Vec<AtomicU64>,
    /// With several roots: an entry time up to which each root has admitted every packet
    /// handed to it (published after `admitted`).
    pub(crate) passed: Vec<AtomicU64>,
}

impl Admissions {
    pub(crate) fn new(roots: u8) -> Admissions {
        let n = usize::from(roots.max(1));
        Admissions {
            admitted: (0..n).map(|_| AtomicU64::new(0)).collect(),
            passed: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }
    fn admitted(&self, r: usize) -> u64 {
        self.admitted.get(r).map_or(0, |a| a.load(Ordering::Acquire))
    }
    fn passed(&self, r: usize) -> u64 {
        self.passed.get(r).map_or(0, |a| a.load(Ordering::Acquire))
    }
}

/// The packets an order-sensitive instance holds, and how far it has got.
#[derive(Debug)]
pub(crate) struct InOrder {
    /// By entry order: the clock alone with one root, (entry time, clock) with several.
    held: BTreeMap<OrderKey, Packet>,
    /// Per root: the next sequence number this instance has not processed and does not know
    /// finished.
    next: Vec<u64>,
}

impl InOrder {
    /// An instance that starts before the roots' first clocks (sequence number 1).
    pub(crate) fn new(roots: u8) -> InOrder {
        InOrder { held: BTreeMap::new(), next: vec![1; usize::from(roots.max(1))] }
    }

    /// A packet's place in entry order: with several roots, whose clocks are independent,
    /// the entry time the reading thread stamped first (unique and in input order), then the
    /// clock.
    fn key(&self, meta: &Meta) -> OrderKey {
        OrderKey { time: if self.next.len() > 1 { meta.ingress_ns } else { 0 }, clock: meta.clock }
    }

    /// Holds `pkt` until its turn. A second copy of a clock held already (a replay's copy
    /// after a failover upstream) is handed back: the caller ends it as a duplicate.
    pub(crate) fn hold(&mut self, pkt: Packet) -> Option<Packet> {
        match self.held.entry(self.key(&pkt.meta)) {
            std::collections::btree_map::Entry::Occupied(_) => Some(pkt),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(pkt);
                None
            }
        }
    }

    /// Whether it holds a live packet of `meta`'s clock (not a replay's copy): one that never
    /// went past this vertex, so that every instance after it processes it as new when it goes.
    /// A replay's copy held here goes on after it as a copy the instances after it that
    /// processed its clock drop as a duplicate.
    pub(crate) fn holds_live(&self, meta: &Meta) -> bool {
        self.held.get(&self.key(meta)).is_some_and(|p| !p.meta.flags.contains(sluice_packet::MetaFlags::REPLAYED))
    }

    /// Whether it holds a packet that comes before `meta`'s clock in entry order.
    pub(crate) fn holds_before(&self, meta: &Meta) -> bool {
        self.held.first_key_value().is_some_and(|(k, _)| *k < self.key(meta))
    }

    /// Takes every packet held (the instance failed with them).
    pub(crate) fn take_held(&mut self) -> Vec<Packet> {
        std::mem::take(&mut self.held).into_values().collect()
    }

    /// How many packets wait for their turn.
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// For a person: how many it holds, the first, and the clocks it waits for.
    pub(crate) fn describe(&self) -> String {
        let first = self.held.keys().next().map_or("-".into(), |k| format!("{:?}", k.clock));
        format!("{} held (first {first}), next {:?}", self.held.len(), self.next)
    }

    /// Moves the packets whose turn has come, in entry order, into `out`, `max` at most. A
    /// held packet's turn has come when, at every root, each clock before it in entry order is
    /// admitted and either finished, processed here, or gone past this vertex for good
    /// (`gone_by`: its copies held by a recovering replacement further down, which may wait
    /// for what this instance holds).
    pub(crate) fn take_ready(
        &mut self,
        clocks: &ClockTracker,
        roots: &Admissions,
        gone_by: impl Fn(Clock) -> bool,
        out: &mut Vec<Packet>,
        max: usize,
    ) {
        self.take_ready_by(&Here { clocks, roots, gone_by }, out, max);
    }

    /// [`InOrder::take_ready`] with what the roots have done read from `progress` (this
    /// process's own, or what the root's node says when the root runs elsewhere).
    pub(crate) fn take_ready_by(&mut self, progress: &impl EntryProgress, out: &mut Vec<Packet>, max: usize) {
        let max = out.len().saturating_add(max);
        while let Some(key) = self.held.first_key_value().map(|(k, _)| *k).filter(|_| out.len() < max) {
            for (r, next) in self.next.iter_mut().enumerate() {
                if !earlier_done((r as u8, next), key, progress) {
                    return;
                }
            }
            if let Some((_, p)) = self.held.pop_first() {
                out.push(p);
            }
            if let Some(n) = self.next.get_mut(usize::from(key.clock.root())) {
                *n = (*n).max(key.clock.seq() + 1);
            }
        }
    }
}

/// How far the roots have got, as an order-sensitive instance needs to know it.
pub(crate) trait EntryProgress {
    /// The last sequence number root `r` admitted.
    fn admitted(&self, r: usize) -> u64;
    /// With several roots: an entry time up to which root `r` has admitted every packet
    /// handed to it.
    fn passed(&self, r: usize) -> u64;
    /// Whether admitted clock `c` is done with as far as this instance is concerned: finished
    /// (dropped, consumed or out of the chain), or gone past its vertex for good. `last` is
    /// the root's last admitted sequence number as read.
    fn done(&self, c: Clock, last: u64) -> bool;
    /// The entry time of clock `c`, in flight (0 with one root).
    fn entry(&self, c: Clock) -> u64;
}

/// The roots' progress in this process: the in-flight clocks and the roots' admissions.
struct Here<'a, F> {
    clocks: &'a ClockTracker,
    roots: &'a Admissions,
    gone_by: F,
}

impl<F: Fn(Clock) -> bool> EntryProgress for Here<'_, F> {
    fn admitted(&self, r: usize) -> u64 {
        self.roots.admitted(r)
    }
    fn passed(&self, r: usize) -> u64 {
        self.roots.passed(r)
    }
    fn done(&self, c: Clock, last: u64) -> bool {
        self.clocks.finished_by(c, last) || (self.gone_by)(c)
    }
    fn entry(&self, c: Clock) -> u64 {
        self.clocks.entry(c)
    }
}

/// Whether every clock of root `id` before `key` in entry order is admitted and done with as far
/// as the instance is concerned, moving the root's cursor `next` past what is.
fn earlier_done((id, next): (u8, &mut u64), key: OrderKey, progress: &impl EntryProgress) -> bool {
    let r = usize::from(id);
    let mut last = progress.admitted(r);
    loop {
        if id == key.clock.root() && key.clock.seq() <= *next {
            // Everything of the packet's own root before it is done.
            return true;
        }
        if *next > last {
            if id == key.clock.root() {
                // Not admitted as far as we know (the packet itself is): look again.
                let now = progress.admitted(r);
                if now == last {
                    return false;
                }
                last = now;
                continue;
            }
            // Another root: done if it has admitted everything entered before the packet.
            if progress.passed(r) < key.time {
                return false;
            }
            let now = progress.admitted(r);
            if now == last {
                return true;
            }
            last = now;
            continue;
        }
        let c = Clock::new(id, *next);
        if progress.done(c, last) {
            *next += 1;
            continue;
        }
        // In flight elsewhere: in the way only if it entered before the packet.
        return key.time > 0 && progress.entry(c) > key.time;
    }
}

/// What the root's node last said about its root's progress, on a node that hosts
/// order-sensitive instances but not the root (a chain spread over nodes, one root): the last
/// clock admitted, a sequence number below which every clock is finished, and, per vertex, the
/// clocks after it known to be done with as far as that vertex is concerned (finished, or gone
/// past it for good). Each is a fact once true, so what arrives late or twice does no harm.
pub(crate) struct FromRoot {
    admitted: AtomicU64,
    below: AtomicU64,
    /// Per vertex of the chain (empty for a vertex not ordered here): a ring of sequence
    /// numbers, each slot holding the last one said to be done that falls in it.
    done: Vec<Box<[AtomicU64]>>,
}

/// Clocks per vertex ring of [`FromRoot`]: more than the root's node says in one report.
pub(crate) const FROM_ROOT_RING: usize = 4096;

impl FromRoot {
    /// For the vertices marked in `here` (ordered, with an instance on this node).
    pub(crate) fn new(here: &[bool]) -> FromRoot {
        let ring = || (0..FROM_ROOT_RING).map(|_| AtomicU64::new(0)).collect();
        FromRoot {
            admitted: AtomicU64::new(0),
            below: AtomicU64::new(1),
            done: here.iter().map(|h| if *h { ring() } else { Box::default() }).collect(),
        }
    }

    /// The root's node says: clocks up to `admitted` are admitted, every one before `below` finished.
    pub(crate) fn heard(&self, admitted: u64, below: u64) {
        self.admitted.fetch_max(admitted, Ordering::AcqRel);
        self.below.fetch_max(below, Ordering::AcqRel);
    }

    /// The root's node says: clocks `first + i` for each bit `i` set in `bits` are done with as
    /// far as vertex `v` is concerned.
    pub(crate) fn heard_done(&self, v: usize, first: u64, bits: u64) {
        let Some(ring) = self.done.get(v).filter(|r| !r.is_empty()) else { return };
        let mut b = bits;
        while b != 0 {
            let seq = first + u64::from(b.trailing_zeros());
            b &= b - 1;
            if let Some(slot) = ring.get(seq as usize % FROM_ROOT_RING) {
                slot.fetch_max(seq, Ordering::AcqRel);
            }
        }
    }

    /// For a person: what the root's node said last, and per vertex which of the 64 clocks
    /// from `below` on it said are done with.
    pub(crate) fn describe(&self) -> String {
        let below = self.below.load(Ordering::Acquire);
        let mut s = format!("admitted {}, all before {below} finished", self.admitted.load(Ordering::Acquire));
        for (v, ring) in self.done.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let done = (below..below + 64)
                .filter(|seq| {
                    ring.get(*seq as usize % FROM_ROOT_RING).is_some_and(|x| x.load(Ordering::Acquire) == *seq)
                })
                .count();
            s.push_str(&format!("; vertex {v}: {done} of the next 64 done"));
        }
        s
    }

    /// The view of vertex `v`'s instances.
    pub(crate) fn of(&self, v: usize) -> RootSays<'_> {
        RootSays { from: self, ring: self.done.get(v).map(|r| &r[..]).unwrap_or_default() }
    }
}

/// [`FromRoot`] as one vertex's instances read it.
pub(crate) struct RootSays<'a> {
    from: &'a FromRoot,
    ring: &'a [AtomicU64],
}

impl EntryProgress for RootSays<'_> {
    fn admitted(&self, _: usize) -> u64 {
        self.from.admitted.load(Ordering::Acquire)
    }
    fn passed(&self, _: usize) -> u64 {
        // One root across nodes: no other root to wait for.
        u64::MAX
    }
    fn done(&self, c: Clock, _: u64) -> bool {
        let seq = c.seq();
        seq < self.from.below.load(Ordering::Acquire)
            || self.ring.get(seq as usize % FROM_ROOT_RING).is_some_and(|s| s.load(Ordering::Acquire) == seq)
    }
    fn entry(&self, _: Clock) -> u64 {
        0
    }
}

/// Which vertices of `plan` must take their input in entry order: those of an NF that needs it
/// across flows (`InputOrder::Clock`) when packets can overtake each other on the way to it —
/// some vertex has several instances (or may have, `scalable`), or packets reach it by more
/// than one way ([`Plan::merged_on_the_way`]) — and those of an NF that needs it between a
/// connection's two directions (`InputOrder::Connection`) when they may reach it by different
/// ways. Otherwise arrival order is entry order already and holding would only wait. With
/// several `roots`, which split the input by source address, the two directions of a
/// connection enter at different roots and would overtake each other at the first vertex:
/// every vertex the roots feed merges them in entry order, whatever its NF; past it, a flow's
/// packets keep that order.
pub(crate) fn needs_entry_order(plan: &Plan, scalable: bool, roots: u8) -> Vec<bool> {
    let scaled = scalable || roots > 1 || plan.vertices.iter().any(|v| v.instances.len() > 1);
    let merged = plan.merged_on_the_way();
    let mut ordered = vec![false; plan.vertices.len()];
    for (v, inst) in &plan.instances {
        let merged = merged.get(*v).copied().unwrap_or(true);
        if let Some(o) = ordered.get_mut(*v) {
            *o = match inst.nf().input_order() {
                sluice_nf::InputOrder::Clock => scaled || merged,
                sluice_nf::InputOrder::Connection => merged,
                sluice_nf::InputOrder::Arrival => false,
            };
        }
    }
    if roots > 1 {
        for w in plan.entry.iter().flat_map(Routes::vertices) {
            if let Some(o) = ordered.get_mut(w) {
                *o = true;
            }
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

    /// The bridge's chain: the client's packets cross the NAT first, the server's the balancer.
    const BOTH_WAYS: &str = "name: both-ways
vertices:
  nat: { type: nat, config: { external_ip: 198.51.100.1, internal: [\"10.0.0.0/8\"] } }
  portscan: { type: portscan }
  lb: { type: lb }
edges:
  - { from: input, to: nat }
  - { from: nat, to: portscan }
  - { from: portscan, to: lb }
  - { from: lb, to: output }
reverse_edges:
  - { from: input, to: lb }
  - { from: lb, to: portscan }
  - { from: portscan, to: nat }
  - { from: nat, to: output }
";

    fn plan(text: &str) -> Plan {
        let chain = crate::Chain::parse(text, std::path::Path::new("t.yaml")).unwrap_or_else(|e| panic!("{e}"));
        crate::compile(&chain, &sluice_nfs::registry(), &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ordered(text: &str, scalable: bool) -> Vec<bool> {
        needs_entry_order(&plan(text), scalable, 1)
    }

    fn plan_merges(text: &str) -> Vec<bool> {
        plan(text).merged_on_the_way()
    }

    #[test]
    fn connection_ordered_nfs_hold_where_the_two_directions_meet() {
        assert_eq!(plan_merges(BOTH_WAYS), vec![true, true, true]);
        // NAT and balancer follow both sides of a connection, the detector orders across flows.
        assert_eq!(ordered(BOTH_WAYS, false), vec![true, true, true]);
        // One way through: arrival order is entry order for all but a detector that may scale.
        let one_way = BOTH_WAYS.split("reverse_edges").next().unwrap_or_default();
        assert_eq!(plan_merges(one_way), vec![false, false, false]);
        assert_eq!(ordered(one_way, false), vec![false, false, false]);
        assert_eq!(ordered(one_way, true), vec![false, true, false]);
    }

    #[test]
    fn only_a_live_packet_held_carries_its_clock_on() {
        let mut o = InOrder::new(1);
        o.hold(pkt(2));
        let mut replayed = pkt(3);
        replayed.meta.flags.insert(sluice_packet::MetaFlags::REPLAYED);
        o.hold(replayed);
        assert!(o.holds_live(&pkt(2).meta));
        assert!(!o.holds_live(&pkt(3).meta), "a replay's copy is dropped after here where its clock went by");
        assert!(!o.holds_live(&pkt(4).meta), "nothing of clock 4 is held");
    }

    #[test]
    fn a_later_clock_waits_for_an_earlier_one_in_flight_elsewhere() {
        let clocks = ClockTracker::new(16, 1);
        let roots = Admissions::new(1);
        for s in 1..=3 {
            clocks.admit(Clock::new(0, s), 0);
            roots.admitted[0].store(s, Ordering::Release);
        }
        let mut o = InOrder::new(1);
        let mut out = Vec::new();
        o.hold(pkt(2));
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert!(out.is_empty(), "clock 1 is still in flight");
        // Clock 1 finishes elsewhere (dropped upstream, say): 2 goes; 3 is still in flight.
        clocks.done(Clock::new(0, 1));
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(seqs(&out), vec![2]);
        o.hold(pkt(3));
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(seqs(&out), vec![2, 3]);
        assert_eq!(o.held(), 0);
    }

    #[test]
    fn packets_whose_turn_has_come_leave_a_batch_at_a_time() {
        let clocks = ClockTracker::new(16, 1);
        let roots = Admissions::new(1);
        let mut o = InOrder::new(1);
        for s in [4, 1, 3, 2, 5] {
            clocks.admit(Clock::new(0, s), 0);
            o.hold(pkt(s));
        }
        roots.admitted[0].store(5, Ordering::Release);
        let mut out = Vec::new();
        o.take_ready(&clocks, &roots, |_| false, &mut out, 2);
        assert_eq!(seqs(&out), vec![1, 2]);
        // `max` counts what this call adds, not what `out` held before.
        o.take_ready(&clocks, &roots, |_| false, &mut out, 2);
        assert_eq!(seqs(&out), vec![1, 2, 3, 4]);
        out.clear();
        o.take_ready(&clocks, &roots, |_| false, &mut out, 2);
        assert_eq!(seqs(&out), vec![5]);
        assert_eq!(o.held(), 0);
    }

    #[test]
    fn held_packets_leave_in_entry_order_and_unadmitted_clocks_are_waited_for() {
        let clocks = ClockTracker::new(16, 1);
        let roots = Admissions::new(1);
        let mut o = InOrder::new(1);
        let mut out = Vec::new();
        for s in [3, 1, 2] {
            clocks.admit(Clock::new(0, s), 0);
            o.hold(pkt(s));
        }
        // Nothing is admitted as far as the root has said: the held ones are still in order.
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(seqs(&out), vec![1, 2, 3]);
        // Clock 4 is not admitted yet: a finished-looking empty slot is not skipped.
        o.hold(pkt(5));
        clocks.admit(Clock::new(0, 5), 0);
        roots.admitted[0].store(3, Ordering::Release);
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(seqs(&out), vec![1, 2, 3]);
        clocks.admit(Clock::new(0, 4), 0);
        roots.admitted[0].store(5, Ordering::Release);
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(seqs(&out), vec![1, 2, 3], "4 is in flight");
        clocks.done(Clock::new(0, 4));
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(seqs(&out), vec![1, 2, 3, 5]);
    }

    fn entered(root: u8, seq: u64, entry: u64) -> Packet {
        Packet::from_slice(&[0; 14], Meta { clock: Clock::new(root, seq), ingress_ns: entry, ..Meta::default() })
    }

    fn clocks_of(v: &[Packet]) -> Vec<(u8, u64)> {
        v.iter().map(|p| (p.meta.clock.root(), p.meta.clock.seq())).collect()
    }

    #[test]
    fn with_two_roots_packets_go_in_entry_order_across_them() {
        let clocks = ClockTracker::new(16, 2);
        let roots = Admissions::new(2);
        let mut o = InOrder::new(2);
        let mut out = Vec::new();
        // Input order: (0,1)@10, (1,1)@20, (0,2)@30, (1,2)@40.
        for (r, s, t) in [(0, 1, 10), (1, 1, 20), (0, 2, 30), (1, 2, 40)] {
            clocks.admit(Clock::new(r, s), t);
        }
        roots.admitted[0].store(2, Ordering::Release);
        roots.admitted[1].store(2, Ordering::Release);
        // Root 1's packets arrive first: root 0's clock 1 entered before them, in flight.
        o.hold(entered(1, 2, 40));
        o.hold(entered(1, 1, 20));
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert!(out.is_empty(), "(0,1) entered first and is on its way");
        o.hold(entered(0, 1, 10));
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(clocks_of(&out), vec![(0, 1), (1, 1)], "(0,2) entered before (1,2)");
        // (0,2) finishes elsewhere (dropped upstream); root 0 may still admit something that
        // entered before (1,2), until it says it has everything up to 40.
        clocks.done(Clock::new(0, 2));
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(out.len(), 2);
        roots.passed[0].store(40, Ordering::Release);
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(clocks_of(&out), vec![(0, 1), (1, 1), (1, 2)]);
    }

    #[test]
    fn with_two_roots_a_root_that_has_not_admitted_what_entered_before_is_waited_for() {
        let clocks = ClockTracker::new(16, 2);
        let roots = Admissions::new(2);
        let mut o = InOrder::new(2);
        let mut out = Vec::new();
        clocks.admit(Clock::new(1, 1), 50);
        roots.admitted[1].store(1, Ordering::Release);
        o.hold(entered(1, 1, 50));
        // Root 0 has admitted nothing, and has not said it has everything before 50.
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert!(out.is_empty(), "root 0 may still admit a packet that entered before 50");
        roots.passed[0].store(40, Ordering::Release);
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert!(out.is_empty(), "root 0 has everything up to 40 only");
        roots.passed[0].store(60, Ordering::Release);
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(clocks_of(&out), vec![(1, 1)]);
        // Root 0 then admits a packet that entered later: it does not wait for root 1.
        clocks.admit(Clock::new(0, 1), 70);
        roots.admitted[0].store(1, Ordering::Release);
        o.hold(entered(0, 1, 70));
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(clocks_of(&out), vec![(1, 1)], "root 1 has not said it has everything before 70");
        roots.passed[1].store(70, Ordering::Release);
        o.take_ready(&clocks, &roots, |_| false, &mut out, usize::MAX);
        assert_eq!(clocks_of(&out), vec![(1, 1), (0, 1)]);
    }
}
