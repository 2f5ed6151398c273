//! Loss between nodes: every datagram on a link carries the sender's sequence number; the
//! sender keeps its last [`HELD`] datagrams to each node, and a receiver takes datagrams in
//! sequence order only, holding those that arrive past a gap and asking for the gap again
//! (a `Resend` note) until it is filled. Notes keep their place before the batches they
//! precede, nothing is taken twice, and a gap the sender no longer holds ends the run after
//! the spread's `silence_ms` with an error that says so.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Datagrams a sender keeps per node for resending (each at most one packet and its
/// encapsulation, or one datagram of notes).
pub(super) const HELD: usize = 8192;

/// Datagrams a receiver holds past a gap before it gives the link up.
const HELD_PAST_GAP: usize = 65_536;

/// How often a receiver asks again for a gap that is still open.
pub(super) const ASK_EVERY: Duration = Duration::from_millis(2);

/// What one node sent another, newest last, for resending.
#[derive(Default)]
pub(super) struct Sent {
    held: VecDeque<(u64, Vec<u8>)>,
}

impl Sent {
    /// Keeps datagram `seq` (numbers only grow); gives back the buffer of the one it no
    /// longer holds, for reuse.
    pub(super) fn keep(&mut self, seq: u64, d: Vec<u8>) -> Option<Vec<u8>> {
        let old = if self.held.len() >= HELD { self.held.pop_front().map(|(_, b)| b) } else { None };
        self.held.push_back((seq, d));
        old
    }

    /// Datagram `seq`, if still held.
    pub(super) fn get(&self, seq: u64) -> Option<&[u8]> {
        let first = self.held.front()?.0;
        let at = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.held.get(at).filter(|(s, _)| *s == seq).map(|(_, d)| d.as_slice())
    }
}

/// Where a datagram from one node stands in its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// The next one expected: take it (then whatever was held behind it).
    Next,
    /// Past a gap: hold it until the gap is filled.
    Ahead,
    /// Taken already (a resend that crossed the original, or a duplicate): drop it.
    Taken,
}

/// The datagrams from one node, taken in sequence order.
#[derive(Default)]
pub(super) struct Received {
    /// The next sequence number to take (`None` before the first datagram: what the sender
    /// sent before this node was up is not missed).
    next: Option<u64>,
    held: BTreeMap<u64, Vec<u8>>,
    /// When the oldest open gap was seen, and when it was last asked for.
    gap_since: Option<Instant>,
    asked: Option<Instant>,
}

impl Received {
    /// Where datagram `seq` stands; a `Next` one counts as taken.
    pub(super) fn place(&mut self, seq: u64) -> Place {
        match self.next {
            None => {
                self.next = Some(seq + 1);
                Place::Next
            }
            Some(n) if seq == n => {
                self.next = Some(n + 1);
                Place::Next
            }
            Some(n) if seq < n || self.held.contains_key(&seq) => Place::Taken,
            Some(_) => Place::Ahead,
        }
    }

    /// Holds datagram `seq` (placed `Ahead`); `false` if too many are held already.
    pub(super) fn hold(&mut self, seq: u64, d: &[u8]) -> bool {
        if self.held.len() >= HELD_PAST_GAP {
            return false;
        }
        self.gap_since.get_or_insert_with(Instant::now);
        self.held.insert(seq, d.to_vec());
        true
    }

    /// The held datagram that is next now, taken.
    pub(super) fn take_held(&mut self) -> Option<Vec<u8>> {
        let n = self.next?;
        let d = self.held.remove(&n)?;
        self.next = Some(n + 1);
        if self.held.is_empty() {
            (self.gap_since, self.asked) = (None, None);
        } else if self.held.first_key_value().is_some_and(|(k, _)| *k != n + 1) {
            // The next gap is a new one.
            (self.gap_since, self.asked) = (Some(Instant::now()), None);
        }
        Some(d)
    }

    /// The missing range to ask for now (first, count, and whether it is asked for the
    /// first time), if a gap is open and was not asked for in the last [`ASK_EVERY`].
    pub(super) fn gap_to_ask(&mut self, now: Instant) -> Option<(u64, u64, bool)> {
        let next = self.next?;
        let (first_held, _) = self.held.first_key_value()?;
        if self.asked.is_some_and(|t| now.duration_since(t) < ASK_EVERY) {
            return None;
        }
        let new = self.asked.replace(now).is_none();
        Some((next, first_held - next, new))
    }

    /// How long the oldest open gap has been open.
    pub(super) fn gap_open(&self, now: Instant) -> Option<Duration> {
        self.gap_since.map(|t| now.duration_since(t))
    }

    /// This node was not running for `gap` (see `Link::absence`): that time does not count
    /// towards how long a gap has been open.
    pub(super) fn excuse(&mut self, gap: Duration, now: Instant) {
        if let Some(t) = self.gap_since.as_mut() {
            *t = (*t + gap).min(now);
        }
    }

    /// Datagrams held past gaps.
    pub(super) fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_keeps_its_last_datagrams() {
        let mut s = Sent::default();
        for seq in 10..10 + HELD as u64 {
            assert_eq!(s.keep(seq, vec![seq as u8]), None);
        }
        assert_eq!(s.keep(10 + HELD as u64, vec![1]), Some(vec![10]), "the oldest goes");
        assert_eq!(s.get(10), None);
        assert_eq!(s.get(11), Some(&[11u8][..]));
        assert_eq!(s.get(10 + HELD as u64), Some(&[1u8][..]));
        assert_eq!(s.get(11 + HELD as u64), None);
    }

    #[test]
    fn datagrams_are_taken_in_order_once() {
        let mut r = Received::default();
        assert_eq!(r.place(5), Place::Next, "the first one heard starts the sequence");
        assert_eq!(r.place(6), Place::Next);
        // 7 and 8 lost, 9 and 10 arrive.
        for seq in [9, 10] {
            assert_eq!(r.place(seq), Place::Ahead);
            assert!(r.hold(seq, &[seq as u8]));
        }
        assert_eq!(r.place(10), Place::Taken, "held already");
        let now = Instant::now();
        assert_eq!(r.gap_to_ask(now), Some((7, 2, true)));
        assert_eq!(r.gap_to_ask(now), None, "asked a moment ago");
        assert_eq!(r.gap_to_ask(now + ASK_EVERY), Some((7, 2, false)), "asked again");
        assert!(r.gap_open(now).is_some());
        assert_eq!(r.take_held(), None, "7 is still missing");
        assert_eq!(r.place(7), Place::Next);
        assert_eq!(r.take_held(), None);
        assert_eq!(r.place(8), Place::Next);
        assert_eq!(r.take_held(), Some(vec![9]));
        assert_eq!(r.take_held(), Some(vec![10]));
        assert_eq!(r.take_held(), None);
        assert_eq!((r.held(), r.gap_open(now)), (0, None));
        assert_eq!(r.place(8), Place::Taken, "a resend that crossed the original");
        assert_eq!(r.place(11), Place::Next);
    }

    #[test]
    fn a_second_gap_is_asked_for_once_the_first_is_filled() {
        let mut r = Received::default();
        r.place(0);
        for seq in [2, 5] {
            assert_eq!(r.place(seq), Place::Ahead);
            r.hold(seq, &[]);
        }
        let now = Instant::now();
        assert_eq!(r.gap_to_ask(now), Some((1, 1, true)));
        assert_eq!(r.place(1), Place::Next);
        assert!(r.take_held().is_some());
        assert_eq!(r.gap_to_ask(now), Some((3, 2, true)), "the next gap, asked at once");
    }
}
