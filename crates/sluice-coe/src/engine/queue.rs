//! An instance's queue in virtual time, indexed by entry order.
//!
//! The queue keeps arrival order (what a plain instance serves next), while an order-sensitive
//! instance takes the queued packet first in entry order, wherever it sits: after a failure
//! upstream the replay's copies queue behind thousands of live packets of a slow instance, and
//! are taken first. Scanning the queue for the least key on every take made serving quadratic
//! (one regression schedule took five minutes). Here every item has an ordinal that grows along
//! the queue, and an ordered index of the packets' keys finds the least in O(log n).

use super::{Item, Queued};
use sluice_chc::order::OrderKey;
use std::collections::{BTreeMap, BTreeSet};

/// Room between the ordinals of items added at either end, so that an insertion between two
/// items usually finds a free ordinal; when it does not, the queue is numbered afresh.
const SPACING: u64 = 1 << 16;

/// Where an item sits in a [`NodeQueue`]; valid until the item leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Slot(u64);

/// Queued packets, barriers and clone marks, in arrival order, with the packets' entry-order keys.
pub(super) struct NodeQueue {
    items: BTreeMap<u64, Queued>,
    /// (key, ordinal) of every queued packet (not of barriers and marks).
    keys: BTreeSet<(OrderKey, u64)>,
    /// How many roots stamp clocks (what an [`OrderKey`] holds).
    roots: usize,
}

impl NodeQueue {
    pub(super) fn new(roots: usize) -> NodeQueue {
        NodeQueue { items: BTreeMap::new(), keys: BTreeSet::new(), roots }
    }

    fn key(&self, item: &Item) -> Option<OrderKey> {
        match item {
            Item::Packet(p) => Some(OrderKey::of(&p.meta, self.roots)),
            Item::Barrier(_) | Item::CloneStart(_) => None,
        }
    }

    fn put(&mut self, ordinal: u64, q: Queued) {
        if let Some(k) = self.key(&q.item) {
            self.keys.insert((k, ordinal));
        }
        self.items.insert(ordinal, q);
    }

    fn take(&mut self, ordinal: u64) -> Option<Queued> {
        let q = self.items.remove(&ordinal)?;
        if let Some(k) = self.key(&q.item) {
            self.keys.remove(&(k, ordinal));
        }
        Some(q)
    }

    /// Numbers the items afresh, SPACING apart, around the middle of the range.
    fn renumber(&mut self) {
        let items = std::mem::take(&mut self.items);
        self.keys.clear();
        let start = (u64::MAX / 2).saturating_sub(SPACING.saturating_mul(items.len() as u64) / 2);
        for (i, (_, q)) in items.into_iter().enumerate() {
            self.put(start + SPACING * i as u64, q);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub(super) fn front(&self) -> Option<&Queued> {
        self.items.values().next()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.items.values()
    }

    pub(super) fn get(&self, slot: Slot) -> Option<&Queued> {
        self.items.get(&slot.0)
    }

    pub(super) fn pop_front(&mut self) -> Option<Queued> {
        let (&first, _) = self.items.first_key_value()?;
        self.take(first)
    }

    pub(super) fn remove(&mut self, slot: Slot) -> Option<Queued> {
        self.take(slot.0)
    }

    pub(super) fn push_back(&mut self, q: Queued) {
        match self.items.last_key_value().map(|(&o, _)| o.checked_add(SPACING)) {
            None => self.put(u64::MAX / 2, q),
            Some(Some(o)) => self.put(o, q),
            Some(None) => {
                self.renumber();
                self.push_back(q);
            }
        }
    }

    pub(super) fn push_front(&mut self, q: Queued) {
        match self.items.first_key_value().map(|(&o, _)| o.checked_sub(SPACING)) {
            None => self.put(u64::MAX / 2, q),
            Some(Some(o)) => self.put(o, q),
            Some(None) => {
                self.renumber();
                self.push_front(q);
            }
        }
    }

    /// Inserts at `at`, after everything that arrived at or before it (arrival order).
    pub(super) fn insert_by_time(&mut self, at: u64, item: Item) {
        let q = Queued { at, item };
        // Usually at the back: walk from there.
        let mut next = None;
        let mut before = None;
        for (&o, x) in self.items.iter().rev() {
            if x.at <= at {
                before = Some(o);
                break;
            }
            next = Some(o);
        }
        match (before, next) {
            (_, None) => self.push_back(q),
            (None, Some(_)) => self.push_front(q),
            (Some(b), Some(n)) if n - b > 1 => self.put(b + (n - b) / 2, q),
            (Some(_), Some(_)) => {
                self.renumber();
                self.insert_by_time(q.at, q.item);
            }
        }
    }

    /// Empties the queue, returning what it held in order.
    pub(super) fn take_all(&mut self) -> Vec<Queued> {
        self.keys.clear();
        std::mem::take(&mut self.items).into_values().collect()
    }

    /// The queued packet first in entry order (of equal keys, the one nearest the front): its
    /// key and where it sits.
    pub(super) fn least_packet(&self) -> Option<(OrderKey, Slot)> {
        self.keys.first().map(|&(k, o)| (k, Slot(o)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_chc::moves::MoveId;
    use sluice_chc::NodeId;
    use sluice_packet::{Clock, Meta, Packet};

    fn packet(seq: u64) -> Item {
        let meta = Meta { clock: Clock::new(0, seq), ..Default::default() };
        Item::Packet(Packet::new(vec![0u8; 64], meta))
    }

    fn clock_of(q: &Queued) -> Option<u64> {
        match &q.item {
            Item::Packet(p) => Some(p.meta.clock.seq()),
            _ => None,
        }
    }

    /// The brute-force answer: the first packet in queue order with the least key.
    fn scan(q: &NodeQueue) -> Option<(OrderKey, usize)> {
        q.iter()
            .enumerate()
            .filter_map(|(i, x)| match &x.item {
                Item::Packet(p) => Some((OrderKey::of(&p.meta, 1), i)),
                _ => None,
            })
            .min()
    }

    fn position(q: &NodeQueue, slot: Slot) -> Option<usize> {
        q.items.keys().position(|&o| o == slot.0)
    }

    fn order(q: &NodeQueue) -> Vec<Option<u64>> {
        q.iter().map(clock_of).collect()
    }

    #[test]
    fn the_least_key_is_found_anywhere_and_the_first_of_equal_keys_wins() {
        let mut q = NodeQueue::new(1);
        assert_eq!(q.least_packet(), None);
        for seq in 50..56 {
            q.push_back(Queued { at: seq, item: packet(seq) });
        }
        q.push_back(Queued { at: 60, item: Item::Barrier(MoveId(1)) });
        // Replay copies behind the live packets are found there.
        for seq in 7..10 {
            q.push_back(Queued { at: 61, item: packet(seq) });
        }
        let (k, s) = q.least_packet().expect("packets");
        assert_eq!(scan(&q), Some((k, 7)));
        assert_eq!(position(&q, s), Some(7));
        // A copy with the same key nearer the front comes first.
        q.insert_by_time(52, packet(7));
        assert_eq!(order(&q)[3], Some(7), "after everything that arrived at or before 52");
        let (k, s) = q.least_packet().expect("packets");
        assert_eq!(scan(&q), Some((k, 3)));
        assert_eq!(position(&q, s), Some(3));
        q.push_front(Queued { at: 0, item: Item::CloneStart(NodeId(2)) });
        assert_eq!(order(&q)[0], None);
        // Taken in entry order until only the barrier and the mark are left.
        let mut taken = Vec::new();
        while let Some((k, s)) = q.least_packet() {
            assert_eq!(Some((k, position(&q, s).unwrap_or(usize::MAX))), scan(&q));
            taken.extend(q.remove(s).as_ref().and_then(clock_of));
        }
        assert_eq!(taken, vec![7, 7, 8, 9, 50, 51, 52, 53, 54, 55]);
        assert_eq!(q.len(), 2);
        assert!(q.pop_front().is_some_and(|x| matches!(x.item, Item::CloneStart(_))));
        assert_eq!(q.take_all().len(), 1);
        assert!(q.is_empty() && q.least_packet().is_none());
    }

    #[test]
    fn insertions_at_one_place_past_the_spacing_keep_arrival_order() {
        let mut q = NodeQueue::new(1);
        q.push_back(Queued { at: 0, item: packet(100) });
        q.push_back(Queued { at: 1_000, item: packet(101) });
        // Each lands between the last one and the packet at 1,000: halving the gap each time
        // until it is gone, and then the queue is numbered afresh.
        for i in 1..40u64 {
            q.insert_by_time(i, packet(i));
        }
        let mut want = vec![Some(100)];
        want.extend((1..40).map(Some));
        want.push(Some(101));
        assert_eq!(order(&q), want);
        let (k, s) = q.least_packet().expect("packets");
        assert_eq!(scan(&q).map(|(k, i)| (k, Some(i))), Some((k, position(&q, s))));
        assert_eq!(q.pop_front().as_ref().and_then(clock_of), Some(100));
    }
}
