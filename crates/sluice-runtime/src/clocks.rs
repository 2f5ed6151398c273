//! Which clocks are still in flight in a threaded run (the in-flight window's ring).

use sluice_packet::Clock;
use std::sync::atomic::{AtomicU32, Ordering};

/// Which clocks are still in flight. One counter per clock in a ring (the packet plus its mirror
/// copies); the root admits a clock only while the oldest unfinished one is less than a ring's
/// length behind, so a slot is never reused while its clock is in flight. The oldest unfinished
/// clock is the watermark below which per-clock logs can be forgotten.
pub(crate) struct ClockTracker {
    slots: Vec<AtomicU32>,
    mask: u64,
}

impl ClockTracker {
    pub(crate) fn new(span: usize) -> ClockTracker {
        let n = span.next_power_of_two().max(2);
        ClockTracker { slots: (0..n).map(|_| AtomicU32::new(0)).collect(), mask: n as u64 - 1 }
    }
    pub(crate) fn span(&self) -> u64 {
        self.mask + 1
    }
    fn slot(&self, c: Clock) -> Option<&AtomicU32> {
        self.slots.get((c.seq() & self.mask) as usize)
    }
    pub(crate) fn admit(&self, c: Clock) {
        if let Some(s) = self.slot(c) {
            s.store(1, Ordering::Release);
        }
    }
    pub(crate) fn copy(&self, c: Clock) {
        if let Some(s) = self.slot(c) {
            s.fetch_add(1, Ordering::AcqRel);
        }
    }
    pub(crate) fn done(&self, c: Clock) {
        if let Some(s) = self.slot(c) {
            s.fetch_sub(1, Ordering::AcqRel);
        }
    }
    /// Copies of clock `seq` in flight (or held, for a count of held copies).
    pub(crate) fn count(&self, seq: u64) -> u32 {
        self.slots.get((seq & self.mask) as usize).map_or(0, |s| s.load(Ordering::Acquire))
    }
    pub(crate) fn finished(&self, seq: u64) -> bool {
        self.slots.get((seq & self.mask) as usize).is_none_or(|s| s.load(Ordering::Acquire) == 0)
    }
}
