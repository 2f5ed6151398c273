//! The flow-move protocol (CHC R2): loss-free and order-preserving.
//!
//! 1. The splitter pins the moved flows to the new instance.
//! 2. The old instance gets a **barrier** at the end of its queue: everything sent to it
//!    before the move is ahead of it.
//! 3. The new instance **holds** the moved flows' packets.
//! 4. When the old instance reaches the barrier, it **flushes** (the store acknowledges every
//!    update it made), forgets the flows, and the new instance **releases** the held packets,
//!    the first of each flow marked `FIRST`; a scale-in then **retires** the old instance.
//!
//! Because the new instance starts after the old one's last packet of a flow was processed,
//! downstream sees the old instance's last packet before the new instance's first.
//!
//! A move away from an instance that still waits to take some of the same flows over (a
//! scale-in of a move's new instance before that move completed) puts its barrier in only
//! once those moves into it have completed: the packets they release there were sent to it
//! before the later move, so they must be ahead of its barrier.

use crate::NodeId;
use std::collections::HashSet;

/// Identifies a move in progress; a barrier carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MoveId(pub usize);

/// A flow move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The old instance.
    pub from: NodeId,
    /// The new instance.
    pub to: NodeId,
    /// The flows (split keys) moved.
    pub keys: Vec<u64>,
    /// Remove `from` once the barrier passes (scale-in).
    pub retire_from: bool,
    /// The driver's tag for the move (e.g. the episode it reports on).
    pub tag: usize,
}

/// What the driver does to start a move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveStart {
    /// Protocol on: pin the keys to `to` (done), hold them at `to`, put a barrier carrying `id`
    /// at the end of `from`'s queue.
    Barrier {
        /// The barrier's move.
        id: MoveId,
    },
    /// Protocol on, but `from` still waits to take some of the flows over itself: hold them
    /// at `to` as for a barrier, and put the barrier in once [`Completed::barriers_due`]
    /// names `id` (after the moves into `from` have completed).
    AfterMovesIn {
        /// The barrier's move.
        id: MoveId,
    },
    /// Protocol off: the splitter just switched; `to` serves the flows at once (and `from` is
    /// retired now if the move was a scale-in).
    Switched,
}

/// A move whose barrier passed: what the driver does, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The move. The old instance flushes (the store acknowledges its updates before anyone
    /// reads them) and forgets the keys; the new one (and its clone, during a clone trial)
    /// releases the held packets, ahead of what it queued since; then, if `retire_from`, the
    /// old instance is retired (it goes with the last move away from it).
    pub moved: Move,
    /// Deferred barriers now due (moves away from the new instance that waited for this one,
    /// [`MoveStart::AfterMovesIn`]): (old instance, move), each to put at the end of that
    /// instance's queue, behind the released packets.
    pub barriers_due: Vec<(NodeId, MoveId)>,
}

/// After a crash, what a move that involved the failed instance needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveRepair {
    /// The old instance failed: its barrier was lost with its queue, and so were the moved
    /// flows' packets sent to it before the move. The root's replay towards the replacement
    /// redoes them (they reach it although the flows are pinned elsewhere, see
    /// [`Moves::moving_out`]); once that replay has drained, put a barrier for `id` at the end
    /// of the replacement's queue, behind them.
    Barrier(MoveId),
    /// The new instance failed: the replacement holds the move's flows again.
    Hold(MoveId),
}

/// The moves in progress.
#[derive(Debug, Clone, Default)]
pub struct Moves {
    moves: Vec<Option<Move>>,
    /// Moves whose barrier waits for the moves into their old instance (see
    /// [`MoveStart::AfterMovesIn`]).
    deferred: Vec<MoveId>,
    /// Instances scaled in with flows still moving away from them: retired with the last of
    /// those moves.
    retiring: Vec<NodeId>,
}

impl Moves {
    /// Starts a move (the caller has pinned the keys). With the protocol off nothing waits.
    pub fn start(&mut self, m: Move, protocol: bool) -> MoveStart {
        if !protocol {
            return MoveStart::Switched;
        }
        let id = MoveId(self.moves.len());
        let waits = self.takes_over(&m);
        self.moves.push(Some(m));
        if waits {
            self.deferred.push(id);
            MoveStart::AfterMovesIn { id }
        } else {
            MoveStart::Barrier { id }
        }
    }

    /// Whether a move in progress brings some of `m`'s flows into `m`'s old instance.
    fn takes_over(&self, m: &Move) -> bool {
        let keys: HashSet<u64> = m.keys.iter().copied().collect();
        self.moves.iter().flatten().any(|x| x.to == m.from && x.keys.iter().any(|k| keys.contains(k)))
    }

    /// Deferred barriers whose moves into the old instance have all completed (asked after
    /// every completed move).
    fn barriers_due(&mut self) -> Vec<MoveId> {
        let deferred = std::mem::take(&mut self.deferred);
        let (waiting, due): (Vec<MoveId>, Vec<MoveId>) =
            deferred.into_iter().partition(|id| self.get(*id).is_some_and(|m| self.takes_over(m)));
        self.deferred = waiting;
        due.into_iter().filter(|id| self.get(*id).is_some()).collect()
    }

    /// The old instance reached the barrier of `id`: the move completes (see [`Completed`]).
    pub fn complete(&mut self, id: MoveId) -> Option<Completed> {
        let moved = self.barrier_passed(id)?;
        let barriers_due = self.barriers_due().into_iter().filter_map(|d| Some((self.get(d)?.from, d))).collect();
        Some(Completed { moved, barriers_due })
    }

    /// The move `id`, if in progress.
    pub fn get(&self, id: MoveId) -> Option<&Move> {
        self.moves.get(id.0).and_then(Option::as_ref)
    }

    /// The old instance reached the barrier of `id`: the move is over; `retire_from` says
    /// whether this was the last move away from an instance being scaled in.
    fn barrier_passed(&mut self, id: MoveId) -> Option<Move> {
        let mut m = self.moves.get_mut(id.0).and_then(Option::take);
        self.deferred.retain(|d| *d != id);
        if let Some(m) = &mut m {
            // The old instance goes with the last move away from it, whichever that is.
            let last = !self.moves_out(m.from);
            if m.retire_from && !last {
                m.retire_from = false;
                self.retire_when_moved_out(m.from);
            } else if last && self.retiring.contains(&m.from) {
                self.retiring.retain(|r| *r != m.from);
                m.retire_from = true;
            }
        }
        if self.moves.iter().all(Option::is_none) {
            // Ids stay stable while any move is in progress; none is.
            self.moves.clear();
        }
        m
    }

    /// Instance `old` failed and `new` replaces it: moves from or to it continue with `new`.
    pub fn replace(&mut self, old: NodeId, new: NodeId) -> Vec<MoveRepair> {
        let mut repairs = Vec::new();
        for r in &mut self.retiring {
            if *r == old {
                *r = new;
            }
        }
        for (i, m) in self.moves.iter_mut().enumerate() {
            let Some(m) = m else { continue };
            if m.from == old {
                m.from = new;
                // A deferred barrier was never queued, so nothing of it was lost: it still
                // comes from `barriers_due`.
                if !self.deferred.contains(&MoveId(i)) {
                    repairs.push(MoveRepair::Barrier(MoveId(i)));
                }
            }
            if m.to == old {
                m.to = new;
                repairs.push(MoveRepair::Hold(MoveId(i)));
            }
        }
        repairs
    }

    /// `node` is scaled in with nothing left to move itself: if flows are still moving away
    /// from it, the last of those moves retires it (returns true); otherwise the driver retires
    /// it now (false).
    pub fn retire_when_moved_out(&mut self, node: NodeId) -> bool {
        // Any move away from it counts, one of no flows too: its barrier is in `node`'s queue.
        if !self.moves_out(node) {
            return false;
        }
        if !self.retiring.contains(&node) {
            self.retiring.push(node);
        }
        true
    }

    /// Whether flow `key` is moving away from `node` (its barrier not passed yet): packets
    /// of it sent before the move, replayed to `node`, are still `node`'s to process.
    pub fn moving_out(&self, node: NodeId, key: u64) -> bool {
        self.moves.iter().flatten().any(|m| m.from == node && m.keys.contains(&key))
    }

    /// The flows moving into `node` (a clone of it must hold them too).
    pub fn moving_into(&self, node: NodeId) -> Vec<u64> {
        self.moves.iter().flatten().filter(|m| m.to == node).flat_map(|m| m.keys.iter().copied()).collect()
    }

    /// What a scale-in hands over from `node`, which has `received` these flows: those, and
    /// the flows still moving into it (held there until their move completes), but not those
    /// already moving away from it.
    pub fn flows_to_hand_over(&self, node: NodeId, received: &HashSet<u64>) -> HashSet<u64> {
        let out: HashSet<u64> = self.moving_out_of(node).into_iter().collect();
        received.iter().copied().chain(self.moving_into(node)).filter(|k| !out.contains(k)).collect()
    }

    /// Whether any move away from `node` is in progress (even one of no flows).
    fn moves_out(&self, node: NodeId) -> bool {
        self.moves.iter().flatten().any(|m| m.from == node)
    }

    /// The flows moving away from `node` (their barrier not passed yet).
    pub fn moving_out_of(&self, node: NodeId) -> Vec<u64> {
        self.moves.iter().flatten().filter(|m| m.from == node).flat_map(|m| m.keys.iter().copied()).collect()
    }

    /// Whether any move is in progress (vertex managers wait for it).
    pub fn busy(&self) -> bool {
        self.moves.iter().any(Option::is_some)
    }
}

#[cfg(test)]
mod tests;
