//! Chain-entry order for NFs that need it (CHC R4, for NFs whose cross-flow decisions depend on
//! order, such as the portscan detector): such a vertex processes a packet only when no packet
//! that entered the chain before it can still reach the vertex.
//!
//! The order is the logical clock; with several roots, whose clocks are independent, it is the
//! entry time first (the roots' ingress timestamps) and the clock second. A driver keeps, for
//! every place a packet can wait (a queue, a hold), a [`Pending`] multiset of the keys there;
//! a vertex's packet is [`ready`] when its key is the least of its own vertex's pending keys
//! and of every vertex upstream of it.

use sluice_packet::{Clock, Meta};
use std::collections::BTreeMap;

/// The position of a packet in chain-entry order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OrderKey {
    /// Entry time with several roots; 0 with one (the clock alone orders it).
    pub time: u64,
    /// The logical clock.
    pub clock: Clock,
}

impl OrderKey {
    /// The key of a packet, given how many roots stamp clocks.
    pub fn of(meta: &Meta, roots: usize) -> OrderKey {
        OrderKey { time: if roots > 1 { meta.ts_ns } else { 0 }, clock: meta.clock }
    }
}

/// A multiset of the keys of packets waiting somewhere.
#[derive(Debug, Clone, Default)]
pub struct Pending {
    keys: BTreeMap<OrderKey, u32>,
}

impl Pending {
    /// A packet with `key` arrived.
    pub fn add(&mut self, key: OrderKey) {
        *self.keys.entry(key).or_default() += 1;
    }

    /// How many packets with `key` are pending.
    pub fn count(&self, key: OrderKey) -> u32 {
        self.keys.get(&key).copied().unwrap_or(0)
    }

    /// A packet with `key` left (taken, dropped, lost). Removing a key not there does nothing.
    pub fn remove(&mut self, key: OrderKey) {
        if let Some(n) = self.keys.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.keys.remove(&key);
            }
        }
    }

    /// The least key waiting here.
    pub fn least(&self) -> Option<OrderKey> {
        self.keys.keys().next().copied()
    }

    /// The least key waiting here that `counts` (e.g. not a clock the vertex processed already,
    /// whose copy will be dropped as a duplicate rather than processed).
    pub fn least_where(&self, mut counts: impl FnMut(OrderKey) -> bool) -> Option<OrderKey> {
        self.keys.keys().copied().find(|k| counts(*k))
    }

    /// Nothing waits here.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Empties it.
    pub fn clear(&mut self) {
        self.keys.clear();
    }
}

/// Whether a packet with `key`, itself pending at its vertex, may be processed now: no pending
/// key anywhere it could be overtaken by (`least`: the least pending key of each place that
/// reaches the vertex, the vertex's own queues and holds included) is smaller.
pub fn ready(key: OrderKey, least: impl IntoIterator<Item = Option<OrderKey>>) -> bool {
    least.into_iter().flatten().all(|l| key <= l)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(seq: u64) -> OrderKey {
        OrderKey { time: 0, clock: Clock::new(0, seq) }
    }

    #[test]
    fn one_root_orders_by_clock_several_by_entry_time() {
        let mut a = Meta { clock: Clock::new(1, 1), ts_ns: 10, ..Meta::default() };
        let b = Meta { clock: Clock::new(0, 9), ts_ns: 20, ..Meta::default() };
        assert!(OrderKey::of(&a, 1) > OrderKey::of(&b, 1), "root id in the high bits");
        assert!(OrderKey::of(&a, 2) < OrderKey::of(&b, 2), "entered first");
        a.ts_ns = 20;
        assert!(OrderKey::of(&a, 2) > OrderKey::of(&b, 2), "same time: the clock decides");
    }

    #[test]
    fn pending_is_a_multiset() {
        let mut p = Pending::default();
        p.add(k(5));
        p.add(k(3));
        p.add(k(3));
        assert_eq!(p.least(), Some(k(3)));
        assert_eq!(p.least_where(|x| x != k(3)), Some(k(5)));
        assert_eq!((p.count(k(3)), p.count(k(5)), p.count(k(4))), (2, 1, 0));
        p.remove(k(3));
        assert_eq!(p.least(), Some(k(3)));
        p.remove(k(3));
        assert_eq!(p.least(), Some(k(5)));
        p.remove(k(9));
        p.remove(k(5));
        assert!(p.is_empty());
    }

    #[test]
    fn a_packet_waits_for_anything_earlier_that_can_still_reach_it() {
        assert!(ready(k(4), [Some(k(4)), None, Some(k(7))]));
        assert!(!ready(k(4), [Some(k(4)), Some(k(2))]));
        assert!(ready(k(4), []));
    }
}
