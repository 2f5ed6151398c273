//! A ring of slots indexed by a root's clock sequence numbers: what the root's packet log and
//! the store's per-clock log keep per clock. Both see sequence numbers in about increasing
//! order and let them go from the oldest, so a window `base .. base + span` of slots covers
//! the clocks still of interest, a lookup is a subtraction and a mask, and a slot the window
//! leaves is kept in place for the clock that takes it next: once the ring has gone round,
//! nothing is allocated or dropped per clock.

/// Slots for the sequence numbers `base .. base + span`, slot `seq & (len - 1)` for `seq` (the
/// ring's length is a power of two). What a slot outside the window holds is the owner's
/// leftover (cleared, or kept dead for its buffers): the ring never reads it, and hands it back
/// when the window takes that slot again.
#[derive(Debug, Clone)]
pub struct SeqRing<T> {
    base: u64,
    span: usize,
    slots: Vec<T>,
}

impl<T> Default for SeqRing<T> {
    fn default() -> Self {
        SeqRing { base: 0, span: 0, slots: Vec::new() }
    }
}

impl<T: Default> SeqRing<T> {
    /// The first sequence number of the window.
    #[inline]
    pub fn base(&self) -> u64 {
        self.base
    }

    /// How many sequence numbers the window covers.
    #[inline]
    pub fn span(&self) -> usize {
        self.span
    }

    /// One past the window's last sequence number.
    #[inline]
    pub fn end(&self) -> u64 {
        self.base + self.span as u64
    }

    /// The ring's length (slots made so far).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn index(&self, seq: u64) -> usize {
        (seq as usize) & self.slots.len().wrapping_sub(1)
    }

    /// The slot of `seq`, if the window covers it.
    #[inline]
    pub fn get(&self, seq: u64) -> Option<&T> {
        if seq.wrapping_sub(self.base) >= self.span as u64 {
            return None;
        }
        self.slots.get(self.index(seq))
    }

    /// The slot of `seq`, if the window covers it.
    #[inline]
    pub fn get_mut(&mut self, seq: u64) -> Option<&mut T> {
        if seq.wrapping_sub(self.base) >= self.span as u64 {
            return None;
        }
        let i = self.index(seq);
        self.slots.get_mut(i)
    }

    /// The slot of `seq`, the window stretched to cover it (at the back, the usual case, or at
    /// the front); slots it newly covers hold what the owner left in them.
    #[inline]
    pub fn cover(&mut self, seq: u64) -> Option<&mut T> {
        let end = self.end();
        if seq == end && self.span != 0 && self.span < self.slots.len() {
            // The next sequence number, with room in the ring: once per clock.
            self.span += 1;
        } else {
            let (base, span) = if self.span == 0 {
                (seq, 1)
            } else if seq < self.base {
                (seq, self.span + (self.base - seq) as usize)
            } else if seq >= end {
                (self.base, (seq - self.base) as usize + 1)
            } else {
                (self.base, self.span)
            };
            if span > self.slots.len() {
                self.grow(span);
            }
            (self.base, self.span) = (base, span);
        }
        let i = self.index(seq);
        self.slots.get_mut(i)
    }

    /// A ring long enough for a window of `span`, every slot kept at its sequence number's
    /// place (the window's, and the leftovers outside it somewhere outside the new window).
    #[cold]
    fn grow(&mut self, span: usize) {
        let len = span.next_power_of_two().max(16);
        let mut slots: Vec<T> = Vec::with_capacity(len);
        slots.resize_with(len, T::default);
        let old = std::mem::take(&mut self.slots);
        let old_len = old.len() as u64;
        for (j, slot) in old.into_iter().enumerate() {
            // Old slot `j` holds the sequence number `base + k` with `k < old_len` that is `j`
            // modulo the old length: distinct sequence numbers, so distinct new slots.
            let k = (j as u64).wrapping_sub(self.base) & (old_len - 1);
            let seq = self.base.wrapping_add(k);
            if let Some(s) = slots.get_mut((seq as usize) & (len - 1)) {
                *s = slot;
            }
        }
        self.slots = slots;
    }

    /// The window's first slot leaves it (the window moves up one); the slot, for its owner to
    /// clear or keep.
    #[inline]
    pub fn pop_front(&mut self) -> Option<&mut T> {
        if self.span == 0 {
            return None;
        }
        let i = self.index(self.base);
        self.base += 1;
        self.span -= 1;
        self.slots.get_mut(i)
    }

    /// The window's last slot leaves it; the slot, for its owner to clear or keep.
    #[inline]
    pub fn pop_back(&mut self) -> Option<&mut T> {
        if self.span == 0 {
            return None;
        }
        self.span -= 1;
        let i = self.index(self.base + self.span as u64);
        self.slots.get_mut(i)
    }

    /// The window's first slot.
    #[inline]
    pub fn front(&self) -> Option<&T> {
        self.get(self.base)
    }

    /// The window's last slot.
    #[inline]
    pub fn back(&self) -> Option<&T> {
        self.span.checked_sub(1).and_then(|last| self.get(self.base + last as u64))
    }

    /// (sequence number, slot) over the window, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> + '_ {
        (self.base..self.end()).filter_map(move |seq| Some((seq, self.get(seq)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_its_clocks_and_slots_keep_their_place_when_the_ring_grows() {
        let mut r: SeqRing<u64> = SeqRing::default();
        for seq in 5..25u64 {
            if let Some(s) = r.cover(seq) {
                *s = seq;
            }
        }
        assert_eq!((r.base(), r.span(), r.capacity()), (5, 20, 32));
        assert_eq!(r.iter().map(|(s, v)| (s, *v)).collect::<Vec<_>>(), (5..25).map(|s| (s, s)).collect::<Vec<_>>());
        // The front leaves: its slots keep what they held until the window takes them again.
        for _ in 0..10 {
            r.pop_front();
        }
        assert_eq!((r.base(), r.span()), (15, 10));
        assert!(r.get(14).is_none() && r.get(25).is_none() && r.get(15) == Some(&15));
        // Round the ring: sequence number 37 takes slot 5, and finds what 5 left there.
        for seq in 25..=37u64 {
            let left = r.cover(seq).map(|s| *s);
            if seq == 37 {
                assert_eq!(left, Some(5));
            }
            if let Some(s) = r.cover(seq) {
                *s = seq;
            }
        }
        // A window of 40 doubles the ring; every slot in the window keeps its value.
        if let Some(s) = r.cover(54) {
            *s = 54;
        }
        assert_eq!(r.capacity(), 64);
        assert_eq!(r.get(37), Some(&37));
        assert_eq!(r.get(15), Some(&15));
        // An older clock in front of the window.
        r.cover(3);
        assert_eq!((r.base(), r.end()), (3, 55));
        assert_eq!(r.back(), Some(&54));
        assert_eq!(r.pop_back().map(|s| *s), Some(54));
        assert_eq!(r.end(), 54);
    }

    #[test]
    fn an_empty_window_starts_wherever_the_next_clock_is() {
        let mut r: SeqRing<u8> = SeqRing::default();
        assert!(r.pop_front().is_none() && r.front().is_none() && r.back().is_none());
        r.cover(1_000_000);
        assert_eq!((r.base(), r.span()), (1_000_000, 1));
        r.pop_front();
        r.cover(7);
        assert_eq!((r.base(), r.span(), r.capacity()), (7, 1, 16));
    }
}
