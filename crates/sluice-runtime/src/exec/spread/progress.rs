//! The root's progress, told to the nodes that host order-sensitive instances (CHC R4 across
//! nodes; docs/decisions.md, "Order-sensitive vertices away from the root's node").
//!
//! Such an instance takes a held packet only when every clock before it is done with: finished
//! everywhere, processed by it, or gone past its vertex for good. On the root's node that is
//! read from the in-flight clocks, which hear every node's notes; another node does not have
//! them. So the root's node tells it, every [`TELL_EVERY`] while something changed, in one
//! datagram: the root's last admitted clock and the oldest unfinished one (`Admitted`), then,
//! per order-sensitive vertex on that node, which of the clocks after that are done with
//! (`Done`, 64 clocks a note). What lies past what one datagram holds is waited for, which
//! costs latency, not correctness. The receiver keeps it in a [`FromRoot`].

use super::Link;
use crate::clocks::ClockTracker;
use crate::exec::{RunError, Shared};
use crate::order::FromRoot;
use sluice_packet::{Clock, InstanceId, Meta};
use sluice_wire::notes::{NoteKind, WireNote, MAX_NOTES};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often, at most, the root's node tells a node its root's progress.
const TELL_EVERY: Duration = Duration::from_micros(50);

/// On the root's node: what it told the nodes that host order-sensitive instances.
#[derive(Debug)]
pub(super) struct Telling {
    /// Per node: the order-sensitive vertices with an instance there.
    vertices: Vec<Vec<usize>>,
    /// The oldest sequence number of the root not known finished.
    below: u64,
    /// Per node: the notes last sent (nothing new, nothing sent).
    told: Vec<Vec<WireNote>>,
    at: Instant,
    notes: Vec<WireNote>,
}

impl Telling {
    /// For the node of `layout`: on the root's node, the other nodes hosting instances of
    /// order-sensitive vertices; elsewhere nothing to tell.
    pub(super) fn new(shared: &Shared, layout: &crate::spread::Layout) -> Telling {
        let mut vertices: Vec<Vec<usize>> = vec![Vec::new(); layout.addrs.len()];
        if layout.has_root() {
            for (v, vp) in shared.vertices.iter().enumerate() {
                if !shared.ordered.get(v).copied().unwrap_or(false) {
                    continue;
                }
                for n in vp.instances.iter().filter_map(|g| layout.node_of.get(*g)) {
                    if let Some(list) = vertices.get_mut(*n).filter(|l| *n != layout.me && !l.contains(&v)) {
                        list.push(v);
                    }
                }
            }
        }
        let nodes = vertices.len();
        Telling { vertices, below: 1, told: vec![Vec::new(); nodes], at: Instant::now(), notes: Vec::new() }
    }

    /// Moves the oldest clock not known finished up past what finished, the root having
    /// admitted every clock up to `admitted`. Not read from the slots alone: after a jump of
    /// the oldest unfinished clock (the clocks a new root skips, a long replay ending) a later
    /// clock may have taken a finished one's slot by now.
    fn advance_below(&mut self, clocks: &ClockTracker, admitted: u64) {
        while self.below <= admitted && clocks.finished_by(Clock::new(0, self.below), admitted) {
            self.below += 1;
        }
    }

    /// Whether any other node hosts an order-sensitive instance.
    fn any(&self) -> bool {
        self.vertices.iter().any(|v| !v.is_empty())
    }

    /// What node `n` is to be told now, if it is news to it: the notes, taken from the
    /// reused buffer (given back after sending).
    fn news_for(&mut self, shared: &Shared, n: usize, admitted: u64) -> Option<Vec<WireNote>> {
        let vs = self.vertices.get(n).filter(|v| !v.is_empty())?;
        let mut notes = std::mem::take(&mut self.notes);
        notes.clear();
        let meta = Meta { clock: Clock::new(0, admitted), xor: self.below, ..Meta::default() };
        notes.push(WireNote { kind: NoteKind::Admitted, meta });
        // The room of one datagram, shared among the node's vertices.
        let per_vertex = (MAX_NOTES - 1) / vs.len();
        for v in vs {
            let target = Some(InstanceId::new(*v as u16, 0));
            let mut first = self.below;
            for _ in 0..per_vertex {
                if first > admitted {
                    break;
                }
                let mut bits = 0u64;
                for i in 0..64u64.min(admitted + 1 - first) {
                    let c = Clock::new(0, first + i);
                    if shared.clocks.finished_by(c, admitted) || shared.past_recovering(*v, c) {
                        bits |= 1 << i;
                    }
                }
                if bits != 0 {
                    let meta = Meta { clock: Clock::new(0, first), xor: bits, target, ..Meta::default() };
                    notes.push(WireNote { kind: NoteKind::Done, meta });
                }
                first += 64;
            }
        }
        match self.told.get_mut(n) {
            Some(told) if *told != notes => {
                told.clone_from(&notes);
                Some(notes)
            }
            _ => {
                self.notes = notes;
                None
            }
        }
    }
}

impl Link {
    /// On the root's node: tells each node hosting order-sensitive instances how far the root
    /// has got, when something changed since it last did and [`TELL_EVERY`] has passed.
    pub(super) fn tell_progress(&mut self, shared: &Shared) -> Result<(), RunError> {
        if !self.telling.any() || self.telling.at.elapsed() < TELL_EVERY {
            return Ok(());
        }
        self.telling.at = Instant::now();
        // Read before the clocks: every clock up to it is admitted, so a free slot is finished.
        let admitted = shared.admissions.admitted.first().map_or(0, |a| a.load(Ordering::Acquire));
        self.telling.advance_below(&shared.clocks, admitted);
        for n in 0..self.telling.vertices.len() {
            if self.dead.get(n).copied().unwrap_or(true) {
                continue;
            }
            let Some(notes) = self.telling.news_for(shared, n, admitted) else { continue };
            let sent = self.send_control(n, &notes);
            self.telling.notes = notes;
            sent?;
            self.report.progress += 1;
        }
        Ok(())
    }
}

/// On a node without the root: takes in what the root's node said about its progress.
pub(super) fn heard(from: Option<&FromRoot>, note: &WireNote) -> bool {
    let Some(from) = from else { return false };
    match note.kind {
        NoteKind::Admitted => {
            from.heard(note.meta.clock.seq(), note.meta.xor);
            true
        }
        NoteKind::Done => {
            let v = note.meta.target.map_or(usize::MAX, |t| usize::from(t.vertex()));
            from.heard_done(v, note.meta.clock.seq(), note.meta.xor);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_unfinished_clock_told_passes_slots_later_clocks_took() {
        // A ring of 4: clocks 1 to 4 finish, 5 (in clock 1's slot) and 6 are in flight, as
        // when the root admits a ring's worth at once after a replay or a new root's skip.
        let clocks = ClockTracker::new(4, 1);
        for seq in 1..=4 {
            clocks.admit(Clock::new(0, seq), 0);
            clocks.done(Clock::new(0, seq));
        }
        clocks.admit(Clock::new(0, 5), 0);
        clocks.admit(Clock::new(0, 6), 0);
        let mut t = Telling { vertices: Vec::new(), below: 1, told: Vec::new(), at: Instant::now(), notes: Vec::new() };
        t.advance_below(&clocks, 6);
        assert_eq!(t.below, 5, "every clock before 5 finished");
        clocks.done(Clock::new(0, 6));
        t.advance_below(&clocks, 6);
        assert_eq!(t.below, 5, "5 is still in flight");
        clocks.done(Clock::new(0, 5));
        t.advance_below(&clocks, 6);
        assert_eq!(t.below, 7);
    }
}
