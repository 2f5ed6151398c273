//! The root's packet log as a slab of entries under an ordered index of clocks. Entries hold a
//! whole packet (a few hundred bytes); an ordered map of them moves whole entries whenever the
//! oldest is deleted (every packet, in a long run), while the index here moves 16-byte pairs
//! and the slab reuses its slots, so a running log allocates nothing per packet for itself.

use std::collections::BTreeMap;

use sluice_packet::Clock;

/// Entries by clock, iterated in clock order.
#[derive(Debug, Clone)]
pub(super) struct PacketLog<E> {
    index: BTreeMap<Clock, u32>,
    slots: Vec<Option<E>>,
    free: Vec<u32>,
}

impl<E> Default for PacketLog<E> {
    fn default() -> Self {
        PacketLog { index: BTreeMap::new(), slots: Vec::new(), free: Vec::new() }
    }
}

impl<E> PacketLog<E> {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// Logs `entry` under `clock`, replacing an entry already there.
    pub(super) fn insert(&mut self, clock: Clock, entry: E) {
        if let Some(&s) = self.index.get(&clock) {
            if let Some(slot) = self.slots.get_mut(s as usize) {
                *slot = Some(entry);
                return;
            }
        }
        let s = match self.free.pop() {
            Some(s) => {
                if let Some(slot) = self.slots.get_mut(s as usize) {
                    *slot = Some(entry);
                }
                s
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(clock, s);
    }

    pub(super) fn get(&self, clock: &Clock) -> Option<&E> {
        let s = *self.index.get(clock)?;
        self.slots.get(s as usize)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, clock: &Clock) -> Option<&mut E> {
        let s = *self.index.get(clock)?;
        self.slots.get_mut(s as usize)?.as_mut()
    }

    pub(super) fn contains_key(&self, clock: &Clock) -> bool {
        self.index.contains_key(clock)
    }

    pub(super) fn remove(&mut self, clock: &Clock) -> Option<E> {
        let s = self.index.remove(clock)?;
        self.free.push(s);
        self.slots.get_mut(s as usize)?.take()
    }

    /// (clock, entry) in clock order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&Clock, &E)> + '_ {
        self.index.iter().filter_map(|(c, s)| Some((c, self.slots.get(*s as usize)?.as_ref()?)))
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &Clock> + '_ {
        self.index.keys()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &E> + '_ {
        self.iter().map(|(_, e)| e)
    }

    /// Keeps the entries for which `keep` holds.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Clock, &E) -> bool) {
        let gone: Vec<Clock> = self.iter().filter(|(c, e)| !keep(c, e)).map(|(c, _)| *c).collect();
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
        assert_eq!(log.slots.len(), 3, "the freed slot was reused");
        if let Some(e) = log.get_mut(&Clock::new(0, 2)) {
            *e += 1;
        }
        log.insert(Clock::new(0, 3), 31);
        assert_eq!(log.iter().map(|(c, e)| (c.seq(), *e)).collect::<Vec<_>>(), vec![(2, 21), (3, 31), (4, 40)]);
        log.retain(|c, _| c.seq() != 3);
        assert_eq!(log.keys().map(|c| c.seq()).collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(log.len(), 2);
        assert!(log.contains_key(&Clock::new(0, 4)) && log.get(&Clock::new(0, 3)).is_none());
    }
}
