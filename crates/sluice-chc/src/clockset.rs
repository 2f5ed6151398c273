//! A set of clocks as bits: one per sequence number, in words spanning about the clocks still
//! of interest, one ring of words per root. What the egress remembers of the clocks that left,
//! and what an instance remembers of the clocks it processed: both see clocks in about clock
//! order and forget them as the root deletes its log entries, so a few words cover them and a
//! lookup is a subtraction and a mask.

use sluice_packet::{Clock, SeqRing};

/// One root's sequence numbers, a bit each, in words of 64 indexed by `seq / 64`. Zero words at
/// either end of the window are dropped, and words outside it are zero: a clear bit and a word
/// not kept mean the same (not in the set).
#[derive(Debug, Clone, Default)]
struct Bits {
    words: SeqRing<u64>,
}

impl Bits {
    fn word(seq: u64) -> (u64, u64) {
        (seq / 64, 1u64 << (seq % 64))
    }

    #[inline]
    fn insert(&mut self, seq: u64) -> bool {
        let (w, bit) = Self::word(seq);
        let Some(word) = self.words.cover(w) else { return true };
        let new = *word & bit == 0;
        *word |= bit;
        new
    }

    fn contains(&self, seq: u64) -> bool {
        let (w, bit) = Self::word(seq);
        self.words.get(w).is_some_and(|word| word & bit != 0)
    }

    fn trim(&mut self) {
        while self.words.front() == Some(&0) {
            self.words.pop_front();
        }
        while self.words.back() == Some(&0) {
            self.words.pop_back();
        }
    }

    fn remove(&mut self, seq: u64) {
        let (w, bit) = Self::word(seq);
        let Some(word) = self.words.get_mut(w) else { return };
        *word &= !bit;
        self.trim();
    }

    fn remove_below(&mut self, seq: u64) {
        let (w, bit) = Self::word(seq);
        while self.words.span() > 0 && self.words.base() < w {
            // Zeroed as it leaves the window: words outside it are zero.
            if let Some(word) = self.words.pop_front() {
                *word = 0;
            }
        }
        if let Some(word) = self.words.get_mut(w) {
            *word &= !(bit - 1);
        }
        self.trim();
    }

    /// (word index, word) over the window, zero words included.
    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.words.iter().map(|(w, word)| (w, *word))
    }
}

/// A set of clocks.
#[derive(Debug, Clone, Default)]
pub struct ClockSet {
    /// By root id.
    roots: Vec<Bits>,
}

impl ClockSet {
    /// Adds `clock`; whether it was not in the set.
    #[inline]
    pub fn insert(&mut self, clock: Clock) -> bool {
        let r = usize::from(clock.root());
        if self.roots.len() <= r {
            self.roots.resize_with(r + 1, Bits::default);
        }
        self.roots.get_mut(r).is_none_or(|b| b.insert(clock.seq()))
    }

    /// Whether `clock` is in the set.
    pub fn contains(&self, clock: Clock) -> bool {
        self.roots.get(usize::from(clock.root())).is_some_and(|b| b.contains(clock.seq()))
    }

    /// Removes `clock`.
    pub fn remove(&mut self, clock: Clock) {
        if let Some(b) = self.roots.get_mut(usize::from(clock.root())) {
            b.remove(clock.seq());
        }
    }

    /// Adds every clock of `other`.
    pub fn union_with(&mut self, other: &ClockSet) {
        for (r, b) in other.roots.iter().enumerate() {
            for (w, word) in b.iter() {
                for bit in 0..64 {
                    if word & (1u64 << bit) != 0 {
                        self.insert(Clock::new(r as u8, w * 64 + bit));
                    }
                }
            }
        }
    }

    /// Removes every clock of `clock`'s root older than it.
    pub fn remove_below(&mut self, clock: Clock) {
        if let Some(b) = self.roots.get_mut(usize::from(clock.root())) {
            b.remove_below(clock.seq());
        }
    }

    /// The set as words of 64 clocks: the first clock of each word that holds any (its
    /// sequence number a multiple of 64) and the word, bit `i` for clock `first + i`.
    pub fn words(&self) -> impl Iterator<Item = (Clock, u64)> + '_ {
        self.roots.iter().enumerate().flat_map(|(r, b)| {
            b.iter().filter(|(_, word)| *word != 0).map(move |(w, word)| (Clock::new(r as u8, w * 64), word))
        })
    }

    /// Adds the clocks `first + i` for each bit `i` set in `bits` (a word of [`ClockSet::words`]).
    pub fn insert_word(&mut self, first: Clock, bits: u64) {
        let mut b = bits;
        while b != 0 {
            let i = u64::from(b.trailing_zeros());
            b &= b - 1;
            self.insert(Clock::new(first.root(), first.seq() + i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_sent_as_words_is_the_same_set_received() {
        let mut s = ClockSet::default();
        for c in [Clock::new(0, 5), Clock::new(0, 64), Clock::new(0, 700), Clock::new(1, 3), Clock::new(1, 130)] {
            s.insert(c);
        }
        s.remove_below(Clock::new(0, 6));
        let words: Vec<(Clock, u64)> = s.words().collect();
        assert!(words.iter().all(|(c, w)| c.seq() % 64 == 0 && *w != 0), "{words:?}");
        let mut back = ClockSet::default();
        for (first, bits) in words {
            back.insert_word(first, bits);
        }
        for c in [Clock::new(0, 64), Clock::new(0, 700), Clock::new(1, 3), Clock::new(1, 130)] {
            assert!(back.contains(c), "{c:?}");
        }
        for c in [Clock::new(0, 5), Clock::new(0, 65), Clock::new(1, 4), Clock::new(2, 3)] {
            assert!(!back.contains(c), "{c:?}");
        }
    }

    #[test]
    fn clocks_of_any_order_roots_and_distance_are_told_apart() {
        let mut s = ClockSet::default();
        let clocks = [Clock::new(2, 1_000), Clock::new(0, 5), Clock::new(2, 3), Clock::new(0, 64), Clock::new(0, 63)];
        for c in clocks {
            assert!(s.insert(c), "{c:?} is new");
        }
        for c in clocks {
            assert!(!s.insert(c) && s.contains(c), "{c:?} is in");
        }
        assert!(!s.contains(Clock::new(1, 5)) && !s.contains(Clock::new(0, 6)) && !s.contains(Clock::new(2, 999)));
        for seq in [5, 63] {
            s.remove(Clock::new(0, seq));
        }
        assert!(s.contains(Clock::new(0, 64)) && !s.contains(Clock::new(0, 5)) && !s.contains(Clock::new(0, 63)));
        // Removing what is not there, or of a root never seen, changes nothing.
        s.remove(Clock::new(0, 1 << 40));
        s.remove(Clock::new(9, 1));
        assert!(s.contains(Clock::new(0, 64)) && s.contains(Clock::new(2, 1_000)) && s.contains(Clock::new(2, 3)));
    }

    #[test]
    fn a_union_holds_the_clocks_of_both_sets() {
        let mut a = ClockSet::default();
        let mut b = ClockSet::default();
        for c in [Clock::new(0, 3), Clock::new(0, 200)] {
            a.insert(c);
        }
        for c in [Clock::new(0, 1), Clock::new(0, 200), Clock::new(1, 70)] {
            b.insert(c);
        }
        a.union_with(&b);
        for seq in [1, 3, 200] {
            assert!(a.contains(Clock::new(0, seq)), "{seq}");
        }
        assert!(a.contains(Clock::new(1, 70)));
        assert!(!a.contains(Clock::new(0, 2)) && !a.contains(Clock::new(1, 1)) && !a.contains(Clock::new(0, 64)));
        assert!(b.contains(Clock::new(0, 1)) && !b.contains(Clock::new(0, 3)), "the other set is unchanged");
    }

    #[test]
    fn remove_below_keeps_the_clock_itself_and_later_ones() {
        let mut s = ClockSet::default();
        for seq in [1, 2, 63, 64, 65, 127, 128, 300] {
            s.insert(Clock::new(0, seq));
        }
        s.insert(Clock::new(1, 2));
        s.remove_below(Clock::new(0, 65));
        for seq in [1, 2, 63, 64] {
            assert!(!s.contains(Clock::new(0, seq)), "{seq} is gone");
        }
        for seq in [65, 127, 128, 300] {
            assert!(s.contains(Clock::new(0, seq)), "{seq} stays");
        }
        assert!(s.contains(Clock::new(1, 2)), "another root's clocks stay");
        s.remove_below(Clock::new(0, 1_000));
        assert!(!s.contains(Clock::new(0, 300)));
        assert!(s.insert(Clock::new(0, 7)), "an old clock can come in again");
    }
}
