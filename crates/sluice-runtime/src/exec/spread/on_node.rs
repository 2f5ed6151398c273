//! On the root's node of a spread chain: where the copies of each clock are, per other node,
//! so that the copies a failed node held are known exactly (`super::Link::node_failed`).

use sluice_packet::{Clock, Meta};

/// On the root's node: the copies of each clock on one other node (sent there, or made there
/// as its notes said, and not back or ended yet), in a ring like the in-flight clocks'. A
/// clock's slot is not reused while a copy of it is in flight anywhere, so one slot per clock
/// is enough. Within a slot, copies are told apart by where they are on their way to: a live
/// copy and a replay copy of the same clock bound for a recovering replacement can be on the
/// node together, and if the node fails the root must resend the replay copy to its target
/// (keeping only the first copy's marks lost that, and the replacement waited for ever); and
/// by whether they are mirror copies (`MetaFlags::MIRROR`): a mirror copy lost at an off-path
/// instance says nothing about the main path's instances on the node (the failover's
/// `processed_elsewhere`).
pub(super) struct OnNode {
    /// Per clock: the clock, then per replay target (`None`: not a replay on its way) and
    /// kind (mirror copy or not) the marks of its first copy and how many copies are there.
    slots: Vec<(Clock, Vec<(Meta, u32)>)>,
    mask: u64,
}

impl OnNode {
    /// A ring of `span` clocks (0: nothing is counted).
    pub(super) fn new(span: u64) -> OnNode {
        let n = if span == 0 { 0 } else { span.next_power_of_two() };
        OnNode { slots: (0..n).map(|_| (Clock::default(), Vec::new())).collect(), mask: n.saturating_sub(1) }
    }
    fn slot(&mut self, clock: Clock) -> Option<&mut (Clock, Vec<(Meta, u32)>)> {
        let i = (clock.seq() & self.mask) as usize;
        self.slots.get_mut(i)
    }
    /// A copy of `meta`'s clock is on the node now.
    pub(super) fn arrived(&mut self, meta: &Meta) {
        let Some((clock, copies)) = self.slot(meta.clock) else { return };
        if *clock != meta.clock {
            // The slot's clock is done with (or never came): its buffer is reused.
            *clock = meta.clock;
            copies.clear();
        }
        let k = key(meta);
        match copies.iter_mut().find(|(m, _)| key(m) == k) {
            Some((m, n)) => {
                if *n == 0 {
                    *m = marks(meta);
                }
                *n += 1;
            }
            None => copies.push((marks(meta), 1)),
        }
    }
    /// A copy of `meta`'s clock left the node (came back, or ended there): one bound where it
    /// is, else any.
    pub(super) fn left(&mut self, meta: &Meta) {
        let Some((clock, copies)) = self.slot(meta.clock) else { return };
        if *clock != meta.clock {
            return;
        }
        let k = key(meta);
        let same = copies.iter().position(|(m, n)| *n > 0 && key(m) == k);
        if let Some(i) = same.or_else(|| copies.iter().position(|(_, n)| *n > 0)) {
            if let Some((_, n)) = copies.get_mut(i) {
                *n -= 1;
            }
        }
    }
    /// The copies on the node, as lost copies (one entry per copy), forgotten here.
    pub(super) fn take_all(&mut self) -> Vec<Meta> {
        let mut lost = Vec::new();
        for (_, copies) in &mut self.slots {
            for (m, n) in copies.drain(..) {
                lost.extend(std::iter::repeat_n(m, n as usize));
            }
        }
        lost.sort_by_key(|m| m.clock);
        lost
    }
}

/// What tells a clock's copies on a node apart: their replay target, and whether they are
/// mirror copies.
fn key(meta: &Meta) -> (Option<sluice_packet::InstanceId>, bool) {
    (meta.replay_target(), meta.flags.contains(sluice_packet::MetaFlags::MIRROR))
}

/// What a lost copy's report needs of a copy's metadata (its replay, too).
pub(super) fn marks(meta: &Meta) -> Meta {
    Meta { clock: meta.clock, flags: meta.flags, target: meta.target, xor: 0, ..Meta::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_packet::{InstanceId, MetaFlags};

    fn meta(seq: u64) -> Meta {
        Meta { clock: Clock::new(0, seq), ..Meta::default() }
    }

    #[test]
    fn copies_on_a_node_are_what_arrived_and_did_not_leave() {
        let mut on = OnNode::new(8);
        on.arrived(&meta(1));
        on.arrived(&meta(1));
        on.arrived(&meta(2));
        on.left(&meta(2));
        on.arrived(&meta(3));
        on.left(&meta(3));
        // A stale note for a clock whose slot a newer clock took changes nothing.
        on.left(&meta(1 + 8));
        let lost: Vec<u64> = on.take_all().iter().map(|m| m.clock.seq()).collect();
        assert_eq!(lost, [1, 1]);
        assert!(on.take_all().is_empty(), "taken once");
    }

    #[test]
    fn a_replay_copy_on_the_node_beside_a_live_one_is_lost_as_a_replay() {
        let mut on = OnNode::new(8);
        let live = meta(5);
        let mut replay = meta(5);
        replay.flags.insert(MetaFlags::REPLAYED);
        replay.target = Some(InstanceId::new(3, 0));
        on.arrived(&live);
        on.arrived(&replay);
        // The live copy comes back; the replay copy is still on the node when it fails.
        on.left(&live);
        let lost = on.take_all();
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].replay_target(), Some(InstanceId::new(3, 0)), "{lost:?}");
        // The other way round: the replay copy went on, the live one was lost.
        on.arrived(&live);
        on.arrived(&replay);
        on.left(&replay);
        assert_eq!(on.take_all().iter().map(Meta::replay_target).collect::<Vec<_>>(), [None]);
    }

    #[test]
    fn a_mirror_copy_is_told_apart_from_the_live_copy_of_its_clock() {
        let mut on = OnNode::new(8);
        let live = meta(6);
        let mut mirror = meta(6);
        mirror.flags.insert(MetaFlags::MIRROR);
        on.arrived(&live);
        on.arrived(&mirror);
        // The live copy comes back; the mirror copy is still at its off-path instance.
        on.left(&live);
        let lost = on.take_all();
        assert_eq!(lost.len(), 1);
        assert!(lost[0].flags.contains(MetaFlags::MIRROR), "{lost:?}");
    }

    #[test]
    fn a_ring_of_zero_counts_nothing() {
        let mut on = OnNode::new(0);
        on.arrived(&meta(1));
        assert!(on.take_all().is_empty());
    }
}
