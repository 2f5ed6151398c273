//! A vertex's splitter: which instance serves a flow.
//!
//! Flows go to `members[hash % members]` unless **pinned** elsewhere: moved flows, and every
//! existing flow when the vertex scales out (so that scaling out moves nothing). A straggler's
//! **clone** receives a copy of the straggler's live traffic and every replay copy aimed at the
//! straggler's flows. The splitter also knows which vertices lead to which, so a replay copy
//! travels only towards its target.

use crate::NodeId;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Where a packet of a flow goes at a vertex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The instance that serves the flow (a replay copy: the straggler's clone if it has one).
    pub node: NodeId,
    /// A live packet of a straggler's flow: a copy also goes to the clone.
    pub copy_to: Option<NodeId>,
}

/// Where a removed instance's flows go: per remaining instance, the flows it takes.
pub type Handover = (NodeId, Vec<(NodeId, Vec<u64>)>);

/// One vertex's flow allocation.
#[derive(Debug, Clone, Default)]
pub struct Splitter {
    /// Active instances in slot order (the hash spreads over these).
    members: Vec<NodeId>,
    /// Flows assigned elsewhere than the hash says. Looked up for every packet routed to a
    /// scaled vertex and for every value and timer a move's giver holds: hashed with ahash, not
    /// std's SipHash (the keys are hashes already).
    pins: HashMap<u64, NodeId, ahash::RandomState>,
    /// Straggler -> its clone on trial.
    clones: Vec<(NodeId, NodeId)>,
}

impl Splitter {
    /// A splitter over `members`.
    pub fn new(members: Vec<NodeId>) -> Splitter {
        Splitter { members, ..Splitter::default() }
    }

    /// The active instances, in slot order.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// The instance serving flow `key`, given the hash's choice among `n` slots
    /// (`hash_slot(n)`); `None` without members.
    pub fn slot_of(&self, key: u64, hash_slot: impl FnOnce(usize) -> usize) -> Option<NodeId> {
        match self.pins.get(&key) {
            Some(&n) => Some(n),
            None => self.members.get(hash_slot(self.members.len())).copied(),
        }
    }

    /// Where a packet of flow `key` goes (see [`Splitter::slot_of`]); `replayed`: a replay copy
    /// on its way to its target.
    pub fn place(&self, key: u64, replayed: bool, hash_slot: impl FnOnce(usize) -> usize) -> Option<Placement> {
        let slot = self.slot_of(key, hash_slot)?;
        let clone = self.clone_of(slot);
        Some(match (replayed, clone) {
            (true, Some(c)) => Placement { node: c, copy_to: None },
            (false, c) => Placement { node: slot, copy_to: c },
            (true, None) => Placement { node: slot, copy_to: None },
        })
    }

    /// Where a replay copy of flow `key` aimed at an instance of this vertex goes: to the
    /// target only — the flow's slot instance or its clone, whichever `is_target` names —, or,
    /// if neither is, to the instance `moving_away` returns (the target is the old instance of
    /// a move of the flow still in progress, or that instance's clone, and what was sent to it
    /// before the move is still its to redo). `None`: the copy has nothing to do here, nor anywhere after.
    pub fn place_replay_at_target(
        &self,
        key: u64,
        hash_slot: impl FnOnce(usize) -> usize,
        is_target: impl Fn(NodeId) -> bool,
        moving_away: impl FnOnce() -> Option<NodeId>,
    ) -> Option<NodeId> {
        let slot = self.slot_of(key, hash_slot);
        let clone = slot.and_then(|s| self.clone_of(s));
        slot.filter(|n| is_target(*n)).or(clone.filter(|n| is_target(*n))).or_else(moving_away)
    }

    /// The clone on trial beside `straggler`.
    pub fn clone_of(&self, straggler: NodeId) -> Option<NodeId> {
        self.clones.iter().find(|(s, _)| *s == straggler).map(|(_, c)| *c)
    }

    /// The straggler `clone` is a clone of.
    pub fn straggler_of(&self, clone: NodeId) -> Option<NodeId> {
        self.clones.iter().find(|(_, c)| *c == clone).map(|(s, _)| *s)
    }

    /// The other instance of the clone trial `node` is part of.
    pub fn twin_of(&self, node: NodeId) -> Option<NodeId> {
        self.clone_of(node).or_else(|| self.straggler_of(node))
    }

    /// `clone` starts beside `straggler`.
    pub fn add_clone(&mut self, straggler: NodeId, clone: NodeId) {
        self.clones.push((straggler, clone));
    }

    /// The trial `node` is part of ends (either twin retired, or the straggler removed).
    pub fn end_trial(&mut self, node: NodeId) {
        self.clones.retain(|(s, c)| *s != node && *c != node);
    }

    /// Adds an instance (scale-out): every flow the current members serve is pinned to where it
    /// is first, so nothing moves. `flows_of` gives the flows each member has received.
    pub fn scale_out<'a>(&mut self, added: &[NodeId], flows_of: impl Fn(NodeId) -> Option<&'a HashSet<u64>>) {
        for &m in &self.members {
            for k in flows_of(m).into_iter().flatten() {
                self.pins.entry(*k).or_insert(m);
            }
        }
        self.members.extend_from_slice(added);
    }

    /// Keeps the first `n` members (scale-in) and says where each removed instance's flows go:
    /// per removed instance, its flows grouped by the remaining instance that takes them. The
    /// removed instances' clones go with them.
    pub fn scale_in<'a>(&mut self, n: usize, flows_of: impl Fn(NodeId) -> Option<&'a HashSet<u64>>) -> Vec<Handover> {
        let removed: Vec<NodeId> = self.members.split_off(n.min(self.members.len()));
        let mut out = Vec::new();
        for r in removed {
            let mut by_target: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
            for &k in flows_of(r).into_iter().flatten() {
                let t = self.members.get((k % self.members.len().max(1) as u64) as usize).copied().unwrap_or(r);
                by_target.entry(t).or_default().push(k);
            }
            self.pins.retain(|_, p| *p != r);
            self.end_trial(r);
            let groups = by_target
                .into_iter()
                .map(|(t, mut keys)| {
                    keys.sort_unstable();
                    (t, keys)
                })
                .collect();
            out.push((r, groups));
        }
        out
    }

    /// Pins flows `keys` to `node` (a move).
    pub fn pin(&mut self, keys: &[u64], node: NodeId) {
        for k in keys {
            self.pins.insert(*k, node);
        }
    }

    /// `new` takes `old`'s place (a replacement after a crash, a clone kept after its trial):
    /// in the membership, in pins, and in clone relations.
    pub fn replace(&mut self, old: NodeId, new: NodeId) {
        for m in &mut self.members {
            if *m == old {
                *m = new;
            }
        }
        for p in self.pins.values_mut() {
            if *p == old {
                *p = new;
            }
        }
        for (s, c) in &mut self.clones {
            if *s == old {
                *s = new;
            }
            if *c == old {
                *c = new;
            }
        }
    }

    /// A new root learns the flow allocation from the instances: every flow an instance has
    /// received is pinned to it. Returns how many flows were learnt.
    pub fn relearn<'a>(&mut self, flows_of: impl Fn(NodeId) -> Option<&'a HashSet<u64>>) -> u64 {
        let mut pins = HashMap::default();
        for &m in &self.members {
            for k in flows_of(m).into_iter().flatten() {
                pins.insert(*k, m);
            }
        }
        let learnt = pins.len() as u64;
        self.pins = pins;
        learnt
    }
}

/// For every vertex, which vertices its routes reach (itself included), given each vertex's
/// successors: a replay copy aimed at an instance of vertex `t` only travels through vertices
/// that reach `t`.
pub fn reachability(next: &[Vec<usize>]) -> Vec<Vec<bool>> {
    let n = next.len();
    (0..n)
        .map(|start| {
            let mut seen = vec![false; n];
            let mut stack = vec![start];
            while let Some(v) = stack.pop() {
                if let Some(s) = seen.get_mut(v) {
                    if !*s {
                        *s = true;
                        stack.extend(next.get(v).into_iter().flatten().copied());
                    }
                }
            }
            seen
        })
        .collect()
}

#[cfg(test)]
mod tests;
