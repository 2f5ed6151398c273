//! The root's packet log: a slab of entries under one ring of slot numbers per root, indexed by
//! sequence number. Every packet is logged, looked up as its copies finish and its commits
//! arrive, and deleted — a handful of lookups per packet, which the ring answers with a
//! subtraction (no hashing, no tree walk). A root stamps sequence numbers in order and entries
//! mostly go in order, so the ring stays about as long as the log; a hole (an entry deleted
//! before older ones) costs four bytes until the older ones go. The slab reuses its slots, so a
//! running log allocates nothing per packet for itself, and entries never move.

use sluice_packet::Clock;
use std::collections::VecDeque;

/// No entry in this ring position.
const HOLE: u32 = u32::MAX;

/// One root's clocks: slot numbers by sequence number, starting at `base`.
#[derive(Debug, Clone, Default)]
struct Ring {
    base: u64,
    slots: VecDeque<u32>,
}

/// Entries by clock; iterated in clock order.
#[derive(Debug, Clone)]
pub(super) struct PacketLog<E> {
    /// By root id.
    rings: Vec<Ring>,
    entries: Vec<Option<E>>,
    free: Vec<u32>,
    len: usize,
}

impl<E> Default for PacketLog<E> {
    fn default() -> Self {
        PacketLog { rings: Vec::new(), entries: Vec::new(), free: Vec::new(), len: 0 }
    }
}

impl<E> PacketLog<E> {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The ring position of `clock`, if the ring covers it.
    fn position(&self, clock: &Clock) -> Option<(usize, usize)> {
        let r = usize::from(clock.root());
        let ring = self.rings.get(r)?;
        let i = usize::try_from(clock.seq().checked_sub(ring.base)?).ok()?;
        (i < ring.slots.len()).then_some((r, i))
    }

    fn slot(&self, clock: &Clock) -> Option<u32> {
        let (r, i) = self.position(clock)?;
        self.rings.get(r)?.slots.get(i).copied().filter(|s| *s != HOLE)
    }

    /// Logs `entry` under `clock`, replacing an entry already there.
    pub(super) fn insert(&mut self, clock: Clock, entry: E) {
        if let Some(s) = self.slot(&clock) {
            if let Some(e) = self.entries.get_mut(s as usize) {
                *e = Some(entry);
            }
            return;
        }
        let s = match self.free.pop() {
            Some(s) => {
                if let Some(e) = self.entries.get_mut(s as usize) {
                    *e = Some(entry);
                }
                s
            }
            None => {
                self.entries.push(Some(entry));
                (self.entries.len() - 1) as u32
            }
        };
        let r = usize::from(clock.root());
        if self.rings.len() <= r {
            self.rings.resize_with(r + 1, Ring::default);
        }
        let Some(ring) = self.rings.get_mut(r) else { return };
        let seq = clock.seq();
        if ring.slots.is_empty() {
            ring.base = seq;
        }
        // Grow the ring to cover `seq`, at the back (the usual case) or the front.
        while seq < ring.base {
            ring.slots.push_front(HOLE);
            ring.base -= 1;
        }
        let i = (seq - ring.base) as usize;
        if i == ring.slots.len() {
            // The next clock of the root: the usual case.
            ring.slots.push_back(s);
        } else {
            if i > ring.slots.len() {
                ring.slots.resize(i + 1, HOLE);
            }
            if let Some(x) = ring.slots.get_mut(i) {
                *x = s;
            }
        }
        self.len += 1;
    }

    pub(super) fn get(&self, clock: &Clock) -> Option<&E> {
        let s = self.slot(clock)?;
        self.entries.get(s as usize)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, clock: &Clock) -> Option<&mut E> {
        let s = self.slot(clock)?;
        self.entries.get_mut(s as usize)?.as_mut()
    }

    pub(super) fn contains_key(&self, clock: &Clock) -> bool {
        self.slot(clock).is_some()
    }

    pub(super) fn remove(&mut self, clock: &Clock) -> Option<E> {
        let (r, i) = self.position(clock)?;
        let ring = self.rings.get_mut(r)?;
        let s = std::mem::replace(ring.slots.get_mut(i)?, HOLE);
        if s == HOLE {
            return None;
        }
        // The front moves past the holes the removal leaves there.
        while ring.slots.front() == Some(&HOLE) {
            ring.slots.pop_front();
            ring.base += 1;
        }
        while ring.slots.back() == Some(&HOLE) {
            ring.slots.pop_back();
        }
        self.len -= 1;
        self.free.push(s);
        self.entries.get_mut(s as usize)?.take()
    }

    /// (clock, entry) in clock order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (Clock, &E)> + '_ {
        self.rings.iter().enumerate().flat_map(move |(r, ring)| {
            ring.slots.iter().enumerate().filter(|(_, s)| **s != HOLE).filter_map(move |(i, s)| {
                let clock = Clock::new(u8::try_from(r).ok()?, ring.base + i as u64);
                Some((clock, self.entries.get(*s as usize)?.as_ref()?))
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
    fn entries_come_back_in_clock_order_and_slots_are_reused() {
        let mut log = PacketLog::default();
        for seq in [3u64, 1, 2] {
            log.insert(Clock::new(0, seq), seq * 10);
        }
        assert_eq!(log.values().copied().collect::<Vec<_>>(), vec![10, 20, 30]);
        assert_eq!(log.remove(&Clock::new(0, 1)), Some(10));
        assert_eq!(log.remove(&Clock::new(0, 1)), None);
        log.insert(Clock::new(0, 4), 40);
        assert_eq!(log.entries.len(), 3, "the freed slot was reused");
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
}
