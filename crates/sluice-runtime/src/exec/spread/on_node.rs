//! On the root's node of a spread chain: where the copies of each clock are, per other node,
//! so that the copies a failed node held are known exactly (`super::Link::node_failed`).

use sluice_packet::{Clock, Meta};

/// On the root's node: the copies of each clock on one other node (sent there, or made there
/// as its notes said, and not back or ended yet), in a ring like the in-flight clocks'. A
/// clock's slot is not reused while a copy of it is in flight anywhere, so one slot per clock
/// is enough.
pub(super) struct OnNode {
    slots: Vec<(Meta, u32)>,
    mask: u64,
}

impl OnNode {
    /// A ring of `span` clocks (0: nothing is counted).
    pub(super) fn new(span: u64) -> OnNode {
        let n = if span == 0 { 0 } else { span.next_power_of_two() };
        OnNode { slots: vec![(Meta::default(), 0); n as usize], mask: n.saturating_sub(1) }
    }
    fn slot(&mut self, clock: Clock) -> Option<&mut (Meta, u32)> {
        let i = (clock.seq() & self.mask) as usize;
        self.slots.get_mut(i)
    }
    /// A copy of `meta`'s clock is on the node now.
    pub(super) fn arrived(&mut self, meta: &Meta) {
        if let Some((m, n)) = self.slot(meta.clock) {
            if *n == 0 || m.clock != meta.clock {
                *m = Meta { clock: meta.clock, flags: meta.flags, target: meta.target, xor: 0, ..Meta::default() };
                *n = 0;
            }
            *n += 1;
        }
    }
    /// A copy of `clock` left the node (came back, or ended there).
    pub(super) fn left(&mut self, clock: Clock) {
        if let Some((m, n)) = self.slot(clock) {
            if m.clock == clock {
                *n = n.saturating_sub(1);
            }
        }
    }
    /// The copies on the node, as lost copies (one entry per copy), forgotten here.
    pub(super) fn take_all(&mut self) -> Vec<Meta> {
        let mut lost = Vec::new();
        for (m, n) in &mut self.slots {
            lost.extend(std::iter::repeat_n(*m, *n as usize));
            *n = 0;
        }
        lost.sort_by_key(|m| m.clock);
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(seq: u64) -> Meta {
        Meta { clock: Clock::new(0, seq), ..Meta::default() }
    }

    #[test]
    fn copies_on_a_node_are_what_arrived_and_did_not_leave() {
        let mut on = OnNode::new(8);
        on.arrived(&meta(1));
        on.arrived(&meta(1));
        on.arrived(&meta(2));
        on.left(Clock::new(0, 2));
        on.arrived(&meta(3));
        on.left(Clock::new(0, 3));
        // A stale note for a clock whose slot a newer clock took changes nothing.
        on.left(Clock::new(0, 1 + 8));
        let lost: Vec<u64> = on.take_all().iter().map(|m| m.clock.seq()).collect();
        assert_eq!(lost, [1, 1]);
        assert!(on.take_all().is_empty(), "taken once");
    }

    #[test]
    fn a_ring_of_zero_counts_nothing() {
        let mut on = OnNode::new(0);
        on.arrived(&meta(1));
        assert!(on.take_all().is_empty());
    }
}
