//! Which clocks are still in flight in a threaded run (the in-flight window's ring).

use sluice_packet::Clock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Which clocks are still in flight. One counter per clock in a ring per root (the packet plus
/// its mirror copies); a root admits a clock only while its oldest unfinished one is less than a
/// ring's length behind, so a slot is never reused while its clock is in flight. A root's oldest
/// unfinished clock is the watermark below which its per-clock logs can be forgotten.
pub(crate) struct ClockTracker {
    /// The roots' rings one after the other.
    slots: Vec<AtomicU32>,
    /// With several roots, beside each slot: its clock's entry time (what orders clocks of
    /// different roots for order-sensitive instances).
    entries: Vec<AtomicU64>,
    mask: u64,
    /// Only one thread changes the counts ([`ClockTracker::changed_by_one_thread`]).
    one_writer: bool,
}

impl ClockTracker {
    /// Rings of at least `span` clocks for `roots` roots.
    pub(crate) fn new(span: usize, roots: u8) -> ClockTracker {
        let n = span.next_power_of_two().max(2);
        let total = n * usize::from(roots.max(1));
        let entries = if roots > 1 { (0..total).map(|_| AtomicU64::new(0)).collect() } else { Vec::new() };
        let slots = (0..total).map(|_| AtomicU32::new(0)).collect();
        ClockTracker { slots, entries, mask: n as u64 - 1, one_writer: false }
    }

    /// Says that one thread alone admits, copies and finishes clocks (a run to completion: the
    /// root thread runs the instances and the sink): counts then change by a load and a store,
    /// not by a locked read-modify-write a copy. Other threads may still read them.
    pub(crate) fn changed_by_one_thread(mut self, one: bool) -> ClockTracker {
        self.one_writer = one;
        self
    }
    fn index(&self, c: Clock) -> usize {
        (u64::from(c.root()) * self.span() + (c.seq() & self.mask)) as usize
    }
    /// Clocks per root's ring.
    pub(crate) fn span(&self) -> u64 {
        self.mask + 1
    }
    fn slot(&self, c: Clock) -> Option<&AtomicU32> {
        self.slots.get(self.index(c))
    }
    /// Clock `c` is admitted, having entered at `entry` (kept with several roots).
    pub(crate) fn admit(&self, c: Clock, entry: u64) {
        if let Some(e) = self.entries.get(self.index(c)) {
            e.store(entry, Ordering::Release);
        }
        if let Some(s) = self.slot(c) {
            s.store(1, Ordering::Release);
        }
    }
    /// The entry time of clock `c`, in flight (0 with one root).
    pub(crate) fn entry(&self, c: Clock) -> u64 {
        self.entries.get(self.index(c)).map_or(0, |e| e.load(Ordering::Acquire))
    }
    pub(crate) fn copy(&self, c: Clock) {
        self.add(c, 1);
    }
    pub(crate) fn done(&self, c: Clock) {
        self.add(c, u32::MAX);
    }
    /// Adds `by` to clock `c`'s count, wrapping (`u32::MAX` takes one away).
    #[inline]
    fn add(&self, c: Clock, by: u32) {
        let Some(s) = self.slot(c) else { return };
        if self.one_writer {
            s.store(s.load(Ordering::Relaxed).wrapping_add(by), Ordering::Release);
        } else {
            s.fetch_add(by, Ordering::AcqRel);
        }
    }
    /// Copies of clock `c` in flight (or held, for a count of held copies).
    pub(crate) fn count(&self, c: Clock) -> u32 {
        self.slot(c).map_or(0, |s| s.load(Ordering::Acquire))
    }
    pub(crate) fn finished(&self, c: Clock) -> bool {
        self.slot(c).is_none_or(|s| s.load(Ordering::Acquire) == 0)
    }
    /// Whether admitted clock `c` is finished, read by one who knows its root admitted every
    /// clock up to `last`: a clock a ring or more behind `last` is (the root admitted the one
    /// that took its slot only after it finished), whatever its slot, which another clock may
    /// use by now, says.
    pub(crate) fn finished_by(&self, c: Clock, last: u64) -> bool {
        c.seq() + self.span() <= last || self.finished(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_root_has_its_own_ring() {
        let t = ClockTracker::new(4, 2);
        t.admit(Clock::new(1, 3), 9);
        assert_eq!(t.entry(Clock::new(1, 3)), 9);
        assert!(!t.finished(Clock::new(1, 3)));
        assert!(t.finished(Clock::new(0, 3)), "root 0's clock 3 shares no slot with root 1's");
        t.copy(Clock::new(1, 3));
        assert_eq!(t.count(Clock::new(1, 3)), 2);
        t.done(Clock::new(1, 3));
        t.done(Clock::new(1, 3));
        assert!(t.finished(Clock::new(1, 3)));
        assert!(t.finished(Clock::new(7, 1)), "a root the tracker does not have holds nothing");
    }

    #[test]
    fn one_thread_changing_the_counts_counts_as_many_do() {
        let (many, one) = (ClockTracker::new(8, 1), ClockTracker::new(8, 1).changed_by_one_thread(true));
        let steps: [(u64, i8); 9] = [(1, 0), (2, 0), (1, 1), (1, 1), (2, -1), (1, -1), (3, 0), (1, -1), (1, -1)];
        for (seq, step) in steps {
            for t in [&many, &one] {
                let c = Clock::new(0, seq);
                match step {
                    0 => t.admit(c, 0),
                    1 => t.copy(c),
                    _ => t.done(c),
                }
            }
            for seq in 1..=3 {
                let c = Clock::new(0, seq);
                assert_eq!((one.count(c), one.finished(c)), (many.count(c), many.finished(c)), "clock {seq}");
            }
        }
        assert!(one.finished(Clock::new(0, 1)) && one.finished(Clock::new(0, 2)) && !one.finished(Clock::new(0, 3)));
    }

    #[test]
    fn a_clock_whose_slot_a_later_one_took_is_finished() {
        let t = ClockTracker::new(4, 1);
        let (c, later) = (Clock::new(0, 3), Clock::new(0, 7));
        t.admit(c, 0);
        assert!(!t.finished_by(c, 3) && !t.finished_by(c, 6), "in flight, its slot its own");
        t.done(c);
        t.admit(later, 0);
        assert!(!t.finished(c), "the slot says what clock 7 does");
        assert!(t.finished_by(c, 7), "a ring behind the last admitted: finished");
        assert!(!t.finished_by(later, 7));
        t.done(later);
        assert!(t.finished_by(later, 7));
    }
}
