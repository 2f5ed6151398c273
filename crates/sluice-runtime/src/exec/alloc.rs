//! Which instance serves a flow, while the chain scales and moves flows (docs/decisions.md,
//! "Scaling and flow moves in threads").
//!
//! A vertex's flow allocation is the core's [`Splitter`] (members, pinned flows). A change
//! (scale out or in, a move) takes effect from a **clock**: packets admitted after it are
//! allocated by the new splitter, those admitted before by the old one, wherever and whenever
//! a thread routes them. Every sender therefore agrees without a barrier in any queue, a replay
//! copy goes where its clock's first copy went, and a flow's packets before the change all go
//! to its old instance. A packet of a flow whose instance changed waits at the new instance
//! until the change **settles**: every clock up to it has finished, the old instances have
//! flushed their updates to the store and handed the flows' timers over. Then the new instance
//! takes it, after everything the old one did for the flow.

use crate::plan::{Splitter as Hasher, VertexPlan};
use sluice_chc::splitter::Splitter;
use sluice_chc::NodeId;
use sluice_packet::Packet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// One vertex's allocation from a clock on, with the allocations before it that have not
/// settled yet.
#[derive(Debug, Clone)]
pub(super) struct Epoch {
    /// Packets admitted after this sequence number are allocated here (0: from the start).
    pub(super) since: u64,
    /// Members and pinned flows; a node is a global instance index.
    pub(super) splitter: Splitter,
    /// The allocation before `since`, while packets before the change may still be routed.
    pub(super) previous: Option<Arc<Epoch>>,
    /// The change at `since` has settled: nothing waits for it any more.
    pub(super) settled: bool,
    /// The only instances that may give flows up at the change at `since` (a move's source);
    /// `None`: any (scaling re-spreads the flows no instance had received yet).
    pub(super) givers: Option<Vec<usize>>,
}

impl Epoch {
    /// The allocation packet `seq` follows.
    fn at(&self, seq: u64) -> &Epoch {
        let mut e = self;
        while e.since >= seq {
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

    /// The instance packet `seq` of flow `key` goes to.
    pub(super) fn pick(&self, key: u64, seq: u64) -> Option<usize> {
        self.at(seq).owner(key)
    }

    /// Whether packet `seq` of flow `key` waits: its flow changed instance at a change, at or
    /// before it, that has not settled.
    pub(super) fn waits(&self, key: u64, seq: u64) -> bool {
        let mut e = self.at(seq);
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

    /// This chain with the change at `since` settled.
    fn with_settled(&self, since: u64) -> Epoch {
        if self.since == since {
            return Epoch { settled: true, ..self.clone() };
        }
        match &self.previous {
            Some(p) => Epoch { previous: Some(Arc::new(p.with_settled(since))), ..self.clone() },
            None => self.clone(),
        }
    }

    /// The clock of the oldest change not settled.
    fn oldest_change(&self) -> Option<u64> {
        let mut e = self;
        let mut oldest = None;
        while let Some(p) = &e.previous {
            oldest = Some(e.since);
            e = p;
        }
        oldest
    }

    /// The epoch whose change happened at `since`, if it is in this chain.
    pub(super) fn change_at(&self, since: u64) -> Option<&Epoch> {
        let mut e = self;
        loop {
            if e.since == since {
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
                RwLock::new(Arc::new(Epoch { since: 0, splitter, previous: None, settled: true, givers: None }))
            })
            .collect();
        Allocation { version: AtomicU64::new(1), per_vertex }
    }

    /// The version now (Acquire: whoever sees it sees the epochs published before it).
    pub(super) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Vertex `v`'s allocation now.
    pub(super) fn current(&self, v: usize) -> Option<Arc<Epoch>> {
        self.per_vertex.get(v).and_then(|e| e.read().ok()).map(|e| e.clone())
    }

    /// Makes `splitter` vertex `v`'s allocation for packets admitted after `since`. The root
    /// calls it before it admits any such packet. A second change at the same clock replaces
    /// the first (no packet followed that one). `givers`: the only instances that may give
    /// flows up ([`Epoch::givers`]).
    pub(super) fn change(&self, v: usize, since: u64, splitter: Splitter, givers: Option<Vec<usize>>) {
        let Some(cell) = self.per_vertex.get(v) else { return };
        if let Ok(mut e) = cell.write() {
            // Two changes at one clock are one: either's givers may give flows up.
            let (previous, givers) = if e.since == since {
                let both = e.givers.clone().zip(givers).map(|(a, b)| a.into_iter().chain(b).collect());
                (e.previous.clone(), both)
            } else {
                (Some(e.clone()), givers)
            };
            *e = Arc::new(Epoch { since, splitter, previous, settled: false, givers });
        }
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Vertex `v`'s change at `since` settled: its packets stop waiting.
    pub(super) fn settled(&self, v: usize, since: u64) {
        let Some(cell) = self.per_vertex.get(v) else { return };
        if let Ok(mut e) = cell.write() {
            *e = Arc::new(e.with_settled(since));
        }
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// No packet admitted before vertex `v`'s settled change at `since` (its oldest) is routed
    /// again: the allocation before it is forgotten.
    pub(super) fn forget(&self, v: usize, since: u64) {
        let Some(cell) = self.per_vertex.get(v) else { return };
        if let Ok(mut e) = cell.write() {
            if e.oldest_change() == Some(since) {
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
        self.epoch(alloc, v)?.pick(key, pkt.meta.clock.seq())
    }

    /// Whether `pkt`, at an instance of vertex `vp` (index `v`), waits for a change to settle;
    /// also its flow key there.
    pub(super) fn waits(&mut self, alloc: &Allocation, v: usize, vp: &VertexPlan, pkt: &Packet) -> (bool, u64) {
        let key = self.hasher.key(vp, pkt);
        let waits = self.epoch(alloc, v).is_some_and(|e| e.changing() && e.waits(key, pkt.meta.clock.seq()));
        (waits, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(since: u64, members: &[usize], previous: Option<Epoch>) -> Epoch {
        Epoch {
            since,
            splitter: Splitter::new(members.iter().map(|m| NodeId(*m)).collect()),
            settled: previous.is_none(),
            previous: previous.map(Arc::new),
            givers: None,
        }
    }

    #[test]
    fn packets_before_a_change_keep_their_instance_and_changed_flows_wait() {
        // One instance (0) until clock 10, then two (0, 1): keys hash over both.
        let e = epoch(10, &[0, 1], Some(epoch(0, &[0], None)));
        for key in 0..8u64 {
            assert_eq!(e.pick(key, 10), Some(0), "admitted before the change");
            assert_eq!(e.pick(key, 11), Some((key % 2) as usize));
            // A flow that stays at instance 0 never waits; one that went to 1 waits after 10.
            assert_eq!(e.waits(key, 11), key % 2 == 1);
            assert!(!e.waits(key, 10));
        }
        let settled = e.with_settled(10);
        assert!(!settled.changing());
        assert!(!settled.waits(1, 11), "nothing waits once the change settled");
        assert_eq!(settled.pick(1, 5), Some(0), "older clocks still go where they went");
        let forgotten = settled.without_oldest();
        assert_eq!(forgotten.pick(1, 5), Some(1), "once forgotten, every clock follows the new allocation");
    }

    #[test]
    fn a_flow_moved_twice_waits_for_both_changes_and_settling_drops_the_oldest() {
        let mut s1 = Splitter::new(vec![NodeId(0), NodeId(1)]);
        s1.pin(&[4], NodeId(1));
        let mut s2 = s1.clone();
        s2.pin(&[4], NodeId(0));
        let e = Epoch {
            since: 20,
            splitter: s2,
            settled: false,
            givers: None,
            previous: Some(Arc::new(Epoch {
                since: 10,
                splitter: s1,
                settled: false,
                givers: None,
                previous: Some(Arc::new(epoch(0, &[0, 1], None))),
            })),
        };
        assert_eq!((e.pick(4, 5), e.pick(4, 15), e.pick(4, 25)), (Some(0), Some(1), Some(0)));
        assert!(e.waits(4, 15) && e.waits(4, 25));
        let once = e.with_settled(10);
        assert!(!once.waits(4, 15), "the move to 1 settled");
        assert!(once.waits(4, 25), "the move back has not");
        assert_eq!(once.oldest_change(), Some(10));
        let forgotten = once.without_oldest();
        assert_eq!(forgotten.oldest_change(), Some(20));
        assert_eq!(forgotten.pick(4, 5), Some(1), "clocks before the first change follow the oldest kept");
    }

    #[test]
    fn two_changes_at_one_clock_let_either_changes_givers_give_flows_up() {
        let one = |givers| {
            let a = Allocation {
                version: AtomicU64::new(0),
                per_vertex: vec![RwLock::new(Arc::new(epoch(0, &[0, 1, 2], None)))],
            };
            let s = Splitter::new(vec![NodeId(0), NodeId(1), NodeId(2)]);
            a.change(0, 10, s.clone(), Some(vec![0]));
            a.change(0, 10, s, givers);
            a.current(0).and_then(|e| e.givers.clone())
        };
        assert_eq!(one(Some(vec![1])), Some(vec![0, 1]), "two moves: both sources");
        assert_eq!(one(None), None, "a move and a scaling: anyone");
    }
}
