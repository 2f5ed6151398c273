//! The chain's egress: the last place a packet passes before the receiver. A clock reaches it
//! more than once when a replay re-emits a packet whose first copy already left — after a
//! failure of the last NF between its output and the root's delete (the asynchronous delete
//! widens that window), or when the root replays an entry only to redo uncommitted updates.
//! The egress passes the first copy of each clock and drops later ones. A clock the root has
//! deleted is never replayed again, so the egress forgets it then; its memory is bounded by the
//! root's log.

use sluice_packet::Clock;
use std::collections::VecDeque;

/// One root's clocks that left, a bit per sequence number, from word `base` on. Zero words at
/// either end are dropped: a clock whose bit is clear and one outside the words are alike (it
/// has not left, or it was forgotten), so the words span about the root's log.
#[derive(Debug, Clone, Default)]
struct LeftBits {
    base: u64,
    words: VecDeque<u64>,
}

impl LeftBits {
    /// Sets `seq`'s bit; whether it was clear.
    fn set(&mut self, seq: u64) -> bool {
        let (w, bit) = (seq / 64, 1u64 << (seq % 64));
        if self.words.is_empty() {
            self.base = w;
        }
        while w < self.base {
            self.words.push_front(0);
            self.base -= 1;
        }
        let i = (w - self.base) as usize;
        if i >= self.words.len() {
            self.words.resize(i + 1, 0);
        }
        let Some(word) = self.words.get_mut(i) else { return true };
        let first = *word & bit == 0;
        *word |= bit;
        first
    }

    /// Clears `seq`'s bit.
    fn clear(&mut self, seq: u64) {
        let (w, bit) = (seq / 64, 1u64 << (seq % 64));
        let Some(word) = w.checked_sub(self.base).and_then(|i| self.words.get_mut(i as usize)) else { return };
        *word &= !bit;
        while self.words.front() == Some(&0) {
            self.words.pop_front();
            self.base += 1;
        }
        while self.words.back() == Some(&0) {
            self.words.pop_back();
        }
    }
}

/// Duplicate suppression at the chain's exit.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    /// By root id.
    left: Vec<LeftBits>,
    dropped: u64,
}

impl Egress {
    /// A copy of `clock` reaches the egress: whether it goes on to the receiver.
    pub fn pass(&mut self, clock: Clock) -> bool {
        let r = usize::from(clock.root());
        if self.left.len() <= r {
            self.left.resize_with(r + 1, LeftBits::default);
        }
        let first = self.left.get_mut(r).is_none_or(|b| b.set(clock.seq()));
        if !first {
            self.dropped += 1;
        }
        first
    }

    /// The root deleted `clock`: no copy of it can come again.
    pub fn forget(&mut self, clock: Clock) {
        if let Some(b) = self.left.get_mut(usize::from(clock.root())) {
            b.clear(clock.seq());
        }
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
    fn clocks_of_any_order_roots_and_distance_are_told_apart() {
        let mut e = Egress::default();
        let clocks = [Clock::new(2, 1_000), Clock::new(0, 5), Clock::new(2, 3), Clock::new(0, 64), Clock::new(0, 63)];
        for c in clocks {
            assert!(e.pass(c), "{c:?} is new");
        }
        for c in clocks {
            assert!(!e.pass(c), "{c:?} left already");
        }
        assert!(e.pass(Clock::new(1, 5)), "another root's clock 5");
        assert!(e.pass(Clock::new(2, 999)) && e.pass(Clock::new(0, 65)));
        // Forgetting everything of root 0 but 64 keeps 64 alone.
        for seq in [5, 63, 65] {
            e.forget(Clock::new(0, seq));
        }
        assert!(!e.pass(Clock::new(0, 64)));
        assert!(e.pass(Clock::new(0, 5)) && e.pass(Clock::new(0, 63)));
        // Forgetting a clock never seen, or of a root never seen, changes nothing.
        e.forget(Clock::new(0, 1 << 40));
        e.forget(Clock::new(9, 1));
        assert!(!e.pass(Clock::new(0, 64)) && !e.pass(Clock::new(2, 1_000)));
        assert_eq!(e.dropped(), 8);
    }
}
