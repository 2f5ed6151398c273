//! Which instance serves a flow, while the chain scales and moves flows (docs/decisions.md,
//! "Scaling and flow moves in threads").
//!
//! A vertex's flow allocation is the core's [`Splitter`] (members, pinned flows). A change
//! (scale out or in, a move) takes effect from a [`Cut`]: packets after it are allocated by the
//! new splitter, those up to it by the old one, wherever and whenever a thread routes them. Every sender therefore agrees without a barrier in any queue, a replay
//! copy goes where its clock's first copy went, and a flow's packets before the change all go
//! to its old instance. A packet of a flow whose instance changed waits at the new instance
//! until the change **settles**: every clock up to it has finished, the old instances have
//! flushed their updates to the store and handed the flows' timers over. Then the new instance
//! takes it, after everything the old one did for the flow.

use crate::plan::{Splitter as Hasher, VertexPlan};
use sluice_chc::splitter::Splitter;
use sluice_chc::NodeId;
use sluice_packet::{Clock, Meta, Packet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Where a change takes effect: the last packet allocated the old way.
///
/// With one root, its clock. With several, an **entry time** (stamped by the reading thread on
/// every packet, unique and increasing), not a clock per root: every vertex the roots feed
/// takes its packets in entry order, and a packet before a cut by clocks could have entered
/// after one past it — it would wait in entry order for that packet, which waits for the
/// change to settle, which waits for it (docs/decisions.md, "Several roots in threads").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cut {
    /// Root 0's sequence numbers up to this one.
    Clock(u64),
    /// Entry times up to this one.
    Entry(u64),
}

impl Cut {
    /// Whether the packet of clock `c`, entered at `entry`, is allocated the old way.
    pub(super) fn covers(&self, c: Clock, entry: u64) -> bool {
        match self {
            Cut::Clock(seq) => c.seq() <= *seq,
            Cut::Entry(e) => entry <= *e,
        }
    }
}

/// The order packets of one flow entered the chain in, whichever root admitted them: entry
/// time (unique, stamped by the reading thread) with several roots, the clock with one (where
/// the two agree, except that a replayed packet keeps both).
pub(super) fn entry_order(meta: &Meta, several_roots: bool) -> (u64, Clock) {
    (if several_roots { meta.ingress_ns } else { 0 }, meta.clock)
}

/// One vertex's allocation from a cut on, with the allocations before it that have not
/// settled yet.
#[derive(Debug, Clone)]
pub(super) struct Epoch {
    /// The change that made it: numbered from 1 in the order the root made them (0: the
    /// allocation the run started with).
    pub(super) change: u64,
    /// Packets after this cut are allocated here (the start's: all of them).
    pub(super) since: Cut,
    /// Members and pinned flows; a node is a global instance index.
    pub(super) splitter: Splitter,
    /// The allocation before `since`, while packets before the change may still be routed.
    pub(super) previous: Option<Arc<Epoch>>,
    /// The change has settled: nothing waits for it any more.
    pub(super) settled: bool,
    /// The only instances that may give flows up at the change (a move's source);
    /// `None`: any (scaling re-spreads the flows no instance had received yet).
    pub(super) givers: Option<Vec<usize>>,
}

impl Epoch {
    /// The allocation the packet of clock `c`, entered at `entry`, follows.
    fn at(&self, c: Clock, entry: u64) -> &Epoch {
        let mut e = self;
        while e.change > 0 && e.since.covers(c, entry) {
            match &e.previous {
                Some(p) => e = p,
                None => break,
            }
        }
        e
    }

    /// The instance serving flow `key` in this allocation.
    pub(super) fn owner(&self, key: u64) -> Option<usize> {
        self.splitter.slot_of(key, |n| (key % n.max(1) as u64) as usize).map(|n| n.0)
    }

    /// The instance the packet of flow `key`, clock `c` and entry time `entry` goes to.
    pub(super) fn pick(&self, key: u64, (c, entry): (Clock, u64)) -> Option<usize> {
        self.at(c, entry).owner(key)
    }

    /// Whether the packet of flow `key`, clock `c` and entry time `entry` waits: its flow
    /// changed instance at a change, at or before it, that has not settled.
    pub(super) fn waits(&self, key: u64, (c, entry): (Clock, u64)) -> bool {
        let mut e = self.at(c, entry);
        while let Some(p) = &e.previous {
            if !e.settled && e.owner(key) != p.owner(key) {
                return true;
            }
            e = p;
        }
        false
    }

    /// Whether a change has not settled.
    pub(super) fn changing(&self) -> bool {
        let mut e = self;
        while let Some(p) = &e.previous {
            if !e.settled {
                return true;
            }
            e = p;
        }
        false
    }

    /// The newest allocation's members (global indices).
    pub(super) fn members(&self) -> impl Iterator<Item = usize> + '_ {
        self.splitter.members().iter().map(|n| n.0)
    }

    /// This chain without the oldest change (no packet before it is routed again): the
    /// allocation after it no longer has a `previous`.
    fn without_oldest(&self) -> Epoch {
        match &self.previous {
            Some(p) if p.previous.is_some() => Epoch { previous: Some(Arc::new(p.without_oldest())), ..self.clone() },
            _ => Epoch { previous: None, ..self.clone() },
        }
    }

    /// This chain with change `change` settled.
    fn with_settled(&self, change: u64) -> Epoch {
        if self.change == change {
            return Epoch { settled: true, ..self.clone() };
        }
        match &self.previous {
            Some(p) => Epoch { previous: Some(Arc::new(p.with_settled(change))), ..self.clone() },
            None => self.clone(),
        }
    }

    /// The oldest change still kept (its allocation before it too).
    fn oldest_change(&self) -> Option<u64> {
        let mut e = self;
        let mut oldest = None;
        while let Some(p) = &e.previous {
            oldest = Some(e.change);
            e = p;
        }
        oldest
    }

    /// The epoch change `change` made, if it is in this chain.
    pub(super) fn made_by(&self, change: u64) -> Option<&Epoch> {
        let mut e = self;
        loop {
            if e.change == change {
                return Some(e);
            }
            e = e.previous.as_deref()?;
        }
    }
}

/// Every vertex's allocation, shared by the threads that route packets.
pub(super) struct Allocation {
    /// Bumped after every change: a thread reloads what it cached when it differs.
    version: AtomicU64,
    /// Changes made so far (the last one's number).
    changes: AtomicU64,
    per_vertex: Vec<RwLock<Arc<Epoch>>>,
}

impl Allocation {
    /// The allocation the chain starts with: each vertex's instances, nothing pinned.
    pub(super) fn new(vertices: &[VertexPlan]) -> Allocation {
        let per_vertex = vertices
            .iter()
            .map(|v| {
                let members = v.instances.iter().map(|g| NodeId(*g)).collect();
                let splitter = Splitter::new(members);
                let start =
                    Epoch { change: 0, since: Cut::Clock(0), splitter, previous: None, settled: true, givers: None };
                RwLock::new(Arc::new(start))
            })
            .collect();
        Allocation { version: AtomicU64::new(1), changes: AtomicU64::new(0), per_vertex }
    }

    /// The version now (Acquire: whoever sees it sees the epochs published before it).
    pub(super) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Vertex `v`'s allocation now.
    pub(super) fn current(&self, v: usize) -> Option<Arc<Epoch>> {
        self.per_vertex.get(v).and_then(|e| e.read().ok()).map(|e| e.clone())
    }

    /// Makes `splitter` vertex `v`'s allocation for packets after cut `since`; the change's
    /// number. The reading thread calls it before any such packet enters. A second change
    /// at the same cut replaces the first (no packet followed that one) and keeps its number.
    /// `givers`: the only instances that may give flows up ([`Epoch::givers`]).
    pub(super) fn change(&self, v: usize, since: Cut, splitter: Splitter, givers: Option<Vec<usize>>) -> u64 {
        let Some(cell) = self.per_vertex.get(v) else { return 0 };
        let mut number = 0;
        if let Ok(mut e) = cell.write() {
            // Two changes at one cut are one: either's givers may give flows up.
            let (previous, givers, change) = if e.change > 0 && e.since == since {
                let both = e.givers.clone().zip(givers).map(|(a, b)| a.into_iter().chain(b).collect());
                (e.previous.clone(), both, e.change)
            } else {
                (Some(e.clone()), givers, self.changes.fetch_add(1, Ordering::AcqRel) + 1)
            };
            number = change;
            *e = Arc::new(Epoch { change, since, splitter, previous, settled: false, givers });
        }
        self.version.fetch_add(1, Ordering::AcqRel);
        number
    }

    /// Vertex `v`'s change `change` settled: its packets stop waiting.
    pub(super) fn settled(&self, v: usize, change: u64) {
        let Some(cell) = self.per_vertex.get(v) else { return };
        if let Ok(mut e) = cell.write() {
            *e = Arc::new(e.with_settled(change));
        }
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// No packet admitted before vertex `v`'s settled change `change` (its oldest) is routed
    /// again: the allocation before it is forgotten.
    pub(super) fn forget(&self, v: usize, change: u64) {
        let Some(cell) = self.per_vertex.get(v) else { return };
        if let Ok(mut e) = cell.write() {
            if e.oldest_change() == Some(change) {
                *e = Arc::new(e.without_oldest());
            }
        }
        self.version.fetch_add(1, Ordering::AcqRel);
    }
}

/// What one thread cached of the allocation: reloaded when its version changed.
#[derive(Default)]
pub(super) struct Cached {
    version: u64,
    per_vertex: Vec<Option<Arc<Epoch>>>,
    hasher: Hasher,
}

impl Cached {
    /// Vertex `v`'s allocation as of now.
    pub(super) fn epoch(&mut self, alloc: &Allocation, v: usize) -> Option<&Arc<Epoch>> {
        let now = alloc.version();
        if now != self.version {
            self.version = now;
            self.per_vertex = (0..alloc.per_vertex.len()).map(|w| alloc.current(w)).collect();
        }
        self.per_vertex.get(v).and_then(Option::as_ref)
    }

    /// The instance (global index) `pkt` goes to at vertex `vp` (index `v`).
    pub(super) fn pick(&mut self, alloc: &Allocation, v: usize, vp: &VertexPlan, pkt: &Packet) -> Option<usize> {
        let key = self.hasher.key(vp, pkt);
        self.epoch(alloc, v)?.pick(key, (pkt.meta.clock, pkt.meta.ingress_ns))
    }

    /// Whether `pkt`, at an instance of vertex `vp` (index `v`), waits for a change to settle;
    /// also its flow key there.
    pub(super) fn waits(&mut self, alloc: &Allocation, v: usize, vp: &VertexPlan, pkt: &Packet) -> (bool, u64) {
        let key = self.hasher.key(vp, pkt);
        let waits =
            self.epoch(alloc, v).is_some_and(|e| e.changing() && e.waits(key, (pkt.meta.clock, pkt.meta.ingress_ns)));
        (waits, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root 0's clock `seq` (entry time unused with one root).
    fn c(seq: u64) -> (Clock, u64) {
        (Clock::new(0, seq), 0)
    }

    /// Change `change` at root 0's clock `since` (0: the start).
    fn epoch(change: u64, since: u64, members: &[usize], previous: Option<Epoch>) -> Epoch {
        Epoch {
            change,
            since: Cut::Clock(since),
            splitter: Splitter::new(members.iter().map(|m| NodeId(*m)).collect()),
            settled: previous.is_none(),
            previous: previous.map(Arc::new),
            givers: None,
        }
    }

    #[test]
    fn packets_before_a_change_keep_their_instance_and_changed_flows_wait() {
        // One instance (0) until clock 10, then two (0, 1): keys hash over both.
        let e = epoch(1, 10, &[0, 1], Some(epoch(0, 0, &[0], None)));
        for key in 0..8u64 {
            assert_eq!(e.pick(key, c(10)), Some(0), "admitted before the change");
            assert_eq!(e.pick(key, c(11)), Some((key % 2) as usize));
            // A flow that stays at instance 0 never waits; one that went to 1 waits after 10.
            assert_eq!(e.waits(key, c(11)), key % 2 == 1);
            assert!(!e.waits(key, c(10)));
        }
        let settled = e.with_settled(1);
        assert!(!settled.changing());
        assert!(!settled.waits(1, c(11)), "nothing waits once the change settled");
        assert_eq!(settled.pick(1, c(5)), Some(0), "older clocks still go where they went");
        let forgotten = settled.without_oldest();
        assert_eq!(forgotten.pick(1, c(5)), Some(1), "once forgotten, every clock follows the new allocation");
    }

    #[test]
    fn with_several_roots_the_cut_is_an_entry_time_whatever_the_root() {
        let mut e = epoch(1, 0, &[0, 1], Some(epoch(0, 0, &[0], None)));
        e.since = Cut::Entry(500);
        let key = 1; // goes to instance 1 after the change
        assert_eq!(e.pick(key, (Clock::new(0, 90), 500)), Some(0), "entered at the cut: the old way");
        assert_eq!(e.pick(key, (Clock::new(1, 3), 501)), Some(1), "entered after it, at any root");
        assert_eq!(e.pick(key, (Clock::new(2, 7), 20)), Some(0));
        assert!(e.waits(key, (Clock::new(3, 1), 900)) && !e.waits(key, (Clock::new(0, 95), 499)));
    }

    #[test]
    fn a_flow_moved_twice_waits_for_both_changes_and_settling_drops_the_oldest() {
        let mut s1 = Splitter::new(vec![NodeId(0), NodeId(1)]);
        s1.pin(&[4], NodeId(1));
        let mut s2 = s1.clone();
        s2.pin(&[4], NodeId(0));
        let e = Epoch {
            change: 2,
            since: Cut::Clock(20),
            splitter: s2,
            settled: false,
            givers: None,
            previous: Some(Arc::new(Epoch {
                change: 1,
                since: Cut::Clock(10),
                splitter: s1,
                settled: false,
                givers: None,
                previous: Some(Arc::new(epoch(0, 0, &[0, 1], None))),
            })),
        };
        assert_eq!((e.pick(4, c(5)), e.pick(4, c(15)), e.pick(4, c(25))), (Some(0), Some(1), Some(0)));
        assert!(e.waits(4, c(15)) && e.waits(4, c(25)));
        let once = e.with_settled(1);
        assert!(!once.waits(4, c(15)), "the move to 1 settled");
        assert!(once.waits(4, c(25)), "the move back has not");
        assert_eq!(once.oldest_change(), Some(1));
        let forgotten = once.without_oldest();
        assert_eq!(forgotten.oldest_change(), Some(2));
        assert_eq!(forgotten.pick(4, c(5)), Some(1), "clocks before the first change follow the oldest kept");
    }

    #[test]
    fn two_changes_at_one_cut_are_one_and_let_either_changes_givers_give_flows_up() {
        let one = |givers| {
            let a = Allocation {
                version: AtomicU64::new(0),
                changes: AtomicU64::new(0),
                per_vertex: vec![RwLock::new(Arc::new(epoch(0, 0, &[0, 1, 2], None)))],
            };
            let s = Splitter::new(vec![NodeId(0), NodeId(1), NodeId(2)]);
            let first = a.change(0, Cut::Entry(10), s.clone(), Some(vec![0]));
            let second = a.change(0, Cut::Entry(10), s.clone(), givers);
            assert_eq!(first, second, "one change");
            assert_eq!(a.change(0, Cut::Entry(11), s, None), first + 1, "another cut: another change");
            a.current(0).and_then(|e| e.previous.as_ref().and_then(|p| p.givers.clone()))
        };
        assert_eq!(one(Some(vec![1])), Some(vec![0, 1]), "two moves: both sources");
        assert_eq!(one(None), None, "a move and a scaling: anyone");
    }
}
