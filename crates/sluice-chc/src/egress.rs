//! The chain's egress: the last place a packet passes before the receiver. A clock reaches it
//! more than once when a replay re-emits a packet whose first copy already left — after a
//! failure of the last NF between its output and the root's delete (the asynchronous delete
//! widens that window), or when the root replays an entry only to redo uncommitted updates.
//! The egress passes the first copy of each clock and drops later ones. A clock the root has
//! deleted is never replayed again, so the egress forgets it then; its memory is bounded by the
//! root's log.

use crate::clockset::ClockSet;
use sluice_packet::Clock;

/// Duplicate suppression at the chain's exit.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    left: ClockSet,
    dropped: u64,
}

impl Egress {
    /// A copy of `clock` reaches the egress: whether it goes on to the receiver.
    pub fn pass(&mut self, clock: Clock) -> bool {
        let first = self.left.insert(clock);
        if !first {
            self.dropped += 1;
        }
        first
    }

    /// The root deleted `clock`: no copy of it can come again.
    pub fn forget(&mut self, clock: Clock) {
        self.left.remove(clock);
    }

    /// The root of `clock` has deleted every clock of its own before `clock` (the oldest it
    /// still logs, or the one after its last): none of them can come again. One call where
    /// a driver would otherwise [`Egress::forget`] every deleted clock.
    pub fn forget_below(&mut self, clock: Clock) {
        self.left.remove_below(clock);
    }

    /// Copies dropped as duplicates.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_copy_of_a_clock_passes_and_later_ones_do_not() {
        let mut e = Egress::default();
        let c = Clock::new(0, 7);
        assert!(e.pass(c));
        assert!(!e.pass(c));
        assert!(e.pass(Clock::new(0, 8)));
        assert_eq!(e.dropped(), 1);
        e.forget(c);
        assert!(e.pass(c), "forgotten once the root deleted it");
    }

    #[test]
    fn forgetting_below_a_clock_forgets_its_roots_older_clocks_only() {
        let mut e = Egress::default();
        for c in [Clock::new(0, 5), Clock::new(0, 70), Clock::new(0, 71), Clock::new(1, 3)] {
            assert!(e.pass(c));
        }
        e.forget_below(Clock::new(0, 71));
        assert!(e.pass(Clock::new(0, 5)) && e.pass(Clock::new(0, 70)), "older clocks forgotten");
        assert!(!e.pass(Clock::new(0, 71)), "the clock itself is still remembered");
        assert!(!e.pass(Clock::new(1, 3)), "another root's clocks are not comparable");
    }
}
