//! The root's packet log: one ring of slots per root, indexed by sequence number. Every
//! packet is logged, looked up as its copies finish and its commits arrive, and deleted — a
//! handful of lookups per packet, which the ring answers with a mask (no hashing, no tree walk,
//! no second indirection; [`SeqRing`]). A root stamps sequence numbers in order and entries
//! mostly go in order, so the window of slots stays about as long as the log; a hole (an
//! entry deleted before older ones) costs an empty slot until the older ones go, and a window
//! longer than the ring doubles it. The packets' buffers are the root's, not the slots': a
//! deleted entry's buffer is the next entry's copy (see `Root::admit`).

use sluice_packet::{Clock, SeqRing};

/// One root's entries by sequence number (a slot without one is a hole). Neither end of the
/// window is a hole; no slot outside it holds an entry.
type Ring<E> = SeqRing<Option<E>>;

fn live<E>(slot: Option<&Option<E>>) -> bool {
    slot.is_some_and(Option::is_some)
}

/// Moves the window's front past dead slots.
#[inline]
fn trim_front<E>(ring: &mut Ring<E>) {
    while ring.span() > 0 && !live(ring.front()) {
        ring.pop_front();
    }
}

/// Moves the window's back past dead slots.
fn trim_back<E>(ring: &mut Ring<E>) {
    while ring.span() > 0 && !live(ring.back()) {
        ring.pop_back();
    }
}

/// Entries by clock; iterated in clock order.
#[derive(Debug, Clone)]
pub(super) struct PacketLog<E> {
    /// By root id.
    rings: Vec<Ring<E>>,
    len: usize,
}

impl<E> Default for PacketLog<E> {
    fn default() -> Self {
        PacketLog { rings: Vec::new(), len: 0 }
    }
}

impl<E> PacketLog<E> {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Logs `entry` under `clock`, replacing an entry already there.
    #[inline]
    pub(super) fn insert(&mut self, clock: Clock, entry: E) {
        let r = usize::from(clock.root());
        if self.rings.len() <= r {
            self.rings.resize_with(r + 1, Ring::default);
        }
        let Some(slot) = self.rings.get_mut(r).and_then(|ring| ring.cover(clock.seq())) else { return };
        if slot.replace(entry).is_none() {
            self.len += 1;
        }
    }

    #[inline]
    pub(super) fn get(&self, clock: &Clock) -> Option<&E> {
        self.rings.get(usize::from(clock.root()))?.get(clock.seq())?.as_ref()
    }

    #[inline]
    pub(super) fn get_mut(&mut self, clock: &Clock) -> Option<&mut E> {
        self.rings.get_mut(usize::from(clock.root()))?.get_mut(clock.seq())?.as_mut()
    }

    pub(super) fn contains_key(&self, clock: &Clock) -> bool {
        self.get(clock).is_some()
    }

    /// Takes the entry under `clock` out of the log.
    #[inline]
    pub(super) fn remove(&mut self, clock: &Clock) -> Option<E> {
        let ring = self.rings.get_mut(usize::from(clock.root()))?;
        let seq = clock.seq();
        let entry = ring.get_mut(seq)?.take()?;
        self.len -= 1;
        // An end moves past the dead slots there (entries mostly go in order: the front).
        if seq == ring.base() {
            trim_front(ring);
        } else if seq + 1 == ring.end() {
            trim_back(ring);
        }
        Some(entry)
    }

    /// (clock, entry) in clock order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Clock, &E)> + '_ {
        self.rings.iter().enumerate().flat_map(move |(r, ring)| {
            let root = u8::try_from(r).ok();
            ring.iter().filter_map(move |(seq, slot)| Some((Clock::new(root?, seq), slot.as_ref()?)))
        })
    }

    /// The clocks, in clock order.
    pub(super) fn keys(&self) -> impl Iterator<Item = Clock> + '_ {
        self.iter().map(|(c, _)| c)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &E> + '_ {
        self.iter().map(|(_, e)| e)
    }

    /// Keeps the entries for which `keep` holds.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Clock, &E) -> bool) {
        let gone: Vec<Clock> = self.iter().filter(|(c, e)| !keep(c, e)).map(|(c, _)| c).collect();
        for c in gone {
            self.remove(&c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_back_in_clock_order_and_the_ring_follows_them() {
        let mut log = PacketLog::default();
        for seq in [3u64, 1, 2] {
            log.insert(Clock::new(0, seq), seq * 10);
        }
        assert_eq!(log.values().copied().collect::<Vec<_>>(), vec![10, 20, 30]);
        assert_eq!(log.remove(&Clock::new(0, 1)), Some(10));
        assert_eq!(log.remove(&Clock::new(0, 1)), None);
        log.insert(Clock::new(0, 4), 40);
        assert_eq!((log.rings[0].base(), log.rings[0].span()), (2, 3), "the ring moved past the deleted front");
        if let Some(e) = log.get_mut(&Clock::new(0, 2)) {
            *e += 1;
        }
        log.insert(Clock::new(0, 3), 31);
        assert_eq!(log.iter().map(|(c, e)| (c.seq(), *e)).collect::<Vec<_>>(), vec![(2, 21), (3, 31), (4, 40)]);
        log.retain(|c, _| c.seq() != 3);
        assert_eq!(log.iter().map(|(c, _)| c.seq()).collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(log.len(), 2);
        assert!(log.contains_key(&Clock::new(0, 4)) && log.get(&Clock::new(0, 3)).is_none());
    }

    #[test]
    fn several_roots_iterate_by_root_then_sequence_and_holes_close() {
        let mut log = PacketLog::default();
        for (root, seq) in [(1u8, 5u64), (0, 9), (1, 6), (0, 7), (0, 8)] {
            log.insert(Clock::new(root, seq), (root, seq));
        }
        let order: Vec<(u8, u64)> = log.values().copied().collect();
        assert_eq!(order, vec![(0, 7), (0, 8), (0, 9), (1, 5), (1, 6)]);
        // A hole in the middle, then the front goes: the ring shrinks past both.
        log.remove(&Clock::new(0, 8));
        assert_eq!(log.rings[0].span(), 3);
        log.remove(&Clock::new(0, 7));
        assert_eq!((log.rings[0].base(), log.rings[0].span()), (9, 1));
        // An older clock logged again (a log read back) extends the ring at the front.
        log.insert(Clock::new(0, 2), (0, 2));
        assert_eq!(log.keys().filter(|c| c.root() == 0).map(|c| c.seq()).collect::<Vec<_>>(), vec![2, 9]);
        assert_eq!(log.len(), 4);
        log.retain(|c, _| c.root() == 1);
        assert_eq!(log.keys().collect::<Vec<_>>(), vec![Clock::new(1, 5), Clock::new(1, 6)]);
        assert!(log.get(&Clock::new(0, 9)).is_none() && log.get(&Clock::new(7, 1)).is_none());
    }

    #[test]
    fn the_back_closes_past_holes_and_the_next_clock_after_a_gap_still_goes_in_its_place() {
        let mut log = PacketLog::default();
        for seq in 1..=5u64 {
            log.insert(Clock::new(0, seq), seq);
        }
        log.remove(&Clock::new(0, 4));
        assert_eq!(log.rings[0].span(), 5, "a hole in the middle stays");
        log.remove(&Clock::new(0, 5));
        assert_eq!((log.rings[0].base(), log.rings[0].span()), (1, 3), "the back closes past the hole");
        // The root's next clock is 6: past the ring's end, with a gap the ring fills with a hole.
        log.insert(Clock::new(0, 6), 6);
        log.insert(Clock::new(0, 7), 7);
        assert_eq!(log.values().copied().collect::<Vec<_>>(), vec![1, 2, 3, 6, 7]);
        assert!(log.get(&Clock::new(0, 5)).is_none() && log.get(&Clock::new(0, 4)).is_none());
        for seq in [1u64, 2, 3, 6, 7] {
            assert_eq!(log.remove(&Clock::new(0, seq)), Some(seq));
        }
        assert_eq!((log.len(), log.rings[0].span()), (0, 0));
    }

    #[test]
    fn a_window_longer_than_the_ring_doubles_it_and_every_entry_keeps_its_place() {
        let mut log = PacketLog::default();
        // One old entry held while 40 newer ones come and most go: the window outgrows the
        // first ring (16 slots) twice.
        log.insert(Clock::new(0, 1), 1u64);
        for seq in 2..=41u64 {
            log.insert(Clock::new(0, seq), seq);
            if seq % 3 != 0 {
                log.remove(&Clock::new(0, seq));
            }
        }
        let expected: Vec<u64> = std::iter::once(1).chain((2..=41).filter(|s| s % 3 == 0)).collect();
        assert_eq!(log.values().copied().collect::<Vec<_>>(), expected);
        assert_eq!(log.len(), expected.len());
        assert!(log.rings[0].capacity() >= 64 && log.rings[0].capacity().is_power_of_two());
        // An older clock in front of the window (a log read back) grows it at the front.
        log.insert(Clock::new(0, 0), 0);
        assert_eq!(log.keys().next(), Some(Clock::new(0, 0)));
        for c in log.keys().collect::<Vec<_>>() {
            assert!(log.remove(&c).is_some());
        }
        assert_eq!((log.len(), log.rings[0].span()), (0, 0));
    }
}
