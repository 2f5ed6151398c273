//! The root's packet log: one ring of entries per root, indexed by sequence number. Every
//! packet is logged, looked up as its copies finish and its commits arrive, and deleted — a
//! handful of lookups per packet, which the ring answers with a subtraction (no hashing, no
//! tree walk, no second indirection). A root stamps sequence numbers in order and entries
//! mostly go in order, so the ring stays about as long as the log; a hole (an entry deleted
//! before older ones) costs an empty entry until the older ones go. The rings keep their
//! memory as entries come and go, so a running log allocates nothing per packet for itself.

use sluice_packet::Clock;
use std::collections::VecDeque;

/// One root's entries, by sequence number, starting at `base`. Neither end is a hole.
#[derive(Debug, Clone)]
struct Ring<E> {
    base: u64,
    slots: VecDeque<Option<E>>,
}

impl<E> Default for Ring<E> {
    fn default() -> Self {
        Ring { base: 0, slots: VecDeque::new() }
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

    /// The ring position of `clock`, if the ring covers it.
    #[inline]
    fn position(&self, clock: &Clock) -> Option<(usize, usize)> {
        let r = usize::from(clock.root());
        let ring = self.rings.get(r)?;
        let i = usize::try_from(clock.seq().checked_sub(ring.base)?).ok()?;
        (i < ring.slots.len()).then_some((r, i))
    }

    /// Logs `entry` under `clock`, replacing an entry already there.
    #[inline]
    pub(super) fn insert(&mut self, clock: Clock, entry: E) {
        let r = usize::from(clock.root());
        if self.rings.len() <= r {
            self.rings.resize_with(r + 1, Ring::default);
        }
        let Some(ring) = self.rings.get_mut(r) else { return };
        let seq = clock.seq();
        if ring.slots.is_empty() {
            ring.base = seq;
        }
        // Grow the ring to cover `seq`: at the back (the usual case, once per packet: the
        // root's next clock) or the front.
        if Some(seq) == ring.base.checked_add(ring.slots.len() as u64) {
            ring.slots.push_back(Some(entry));
            self.len += 1;
            return;
        }
        while seq < ring.base {
            ring.slots.push_front(None);
            ring.base -= 1;
        }
        let i = (seq - ring.base) as usize;
        if i >= ring.slots.len() {
            ring.slots.resize_with(i + 1, || None);
        }
        if let Some(slot) = ring.slots.get_mut(i) {
            if slot.replace(entry).is_none() {
                self.len += 1;
            }
        }
    }

    #[inline]
    pub(super) fn get(&self, clock: &Clock) -> Option<&E> {
        let (r, i) = self.position(clock)?;
        self.rings.get(r)?.slots.get(i)?.as_ref()
    }

    #[inline]
    pub(super) fn get_mut(&mut self, clock: &Clock) -> Option<&mut E> {
        let (r, i) = self.position(clock)?;
        self.rings.get_mut(r)?.slots.get_mut(i)?.as_mut()
    }

    pub(super) fn contains_key(&self, clock: &Clock) -> bool {
        self.get(clock).is_some()
    }

    #[inline]
    pub(super) fn remove(&mut self, clock: &Clock) -> Option<E> {
        let (r, i) = self.position(clock)?;
        let ring = self.rings.get_mut(r)?;
        let entry = ring.slots.get_mut(i)?.take()?;
        self.len -= 1;
        // An end moves past the holes the removal leaves there (entries mostly go in order:
        // the front).
        if i == 0 {
            while ring.slots.front().is_some_and(Option::is_none) {
                ring.slots.pop_front();
                ring.base += 1;
            }
        }
        if i + 1 >= ring.slots.len() {
            while ring.slots.back().is_some_and(Option::is_none) {
                ring.slots.pop_back();
            }
        }
        Some(entry)
    }

    /// (clock, entry) in clock order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Clock, &E)> + '_ {
        self.rings.iter().enumerate().flat_map(move |(r, ring)| {
            ring.slots.iter().enumerate().filter_map(move |(i, e)| {
                let clock = Clock::new(u8::try_from(r).ok()?, ring.base + i as u64);
                Some((clock, e.as_ref()?))
            })
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
        assert_eq!((log.rings[0].base, log.rings[0].slots.len()), (2, 3), "the ring moved past the deleted front");
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
        assert_eq!(log.rings[0].slots.len(), 3);
        log.remove(&Clock::new(0, 7));
        assert_eq!((log.rings[0].base, log.rings[0].slots.len()), (9, 1));
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
        assert_eq!(log.rings[0].slots.len(), 5, "a hole in the middle stays");
        log.remove(&Clock::new(0, 5));
        assert_eq!((log.rings[0].base, log.rings[0].slots.len()), (1, 3), "the back closes past the hole");
        // The root's next clock is 6: past the ring's end, with a gap the ring fills with a hole.
        log.insert(Clock::new(0, 6), 6);
        log.insert(Clock::new(0, 7), 7);
        assert_eq!(log.values().copied().collect::<Vec<_>>(), vec![1, 2, 3, 6, 7]);
        assert!(log.get(&Clock::new(0, 5)).is_none() && log.get(&Clock::new(0, 4)).is_none());
        for seq in [1u64, 2, 3, 6, 7] {
            assert_eq!(log.remove(&Clock::new(0, seq)), Some(seq));
        }
        assert_eq!((log.len(), log.rings[0].slots.len()), (0, 0));
    }
}
