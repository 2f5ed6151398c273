//! What the store's per-clock log kept of earlier values, taken over by a failed instance's
//! replacement with those values, so that it answers its replayed packets' reads as of their
//! clocks itself instead of asking the store once per read (docs/decisions.md, "A replayed
//! packet reads what its first run read").

use super::Map;
use crate::clock_log::first_logged_from;
use crate::wire::{Found, StoreKey};
use sluice_packet::Clock;
use sluice_state::Value;
use smallvec::SmallVec;

/// One logged update of a key: its clock and number, and what it found (`None`: not kept).
type Entry = (Clock, u32, Option<Option<Value>>);

/// A replayed packet's read, answered here.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ReadAt {
    /// The value as it was then.
    Was(Option<Value>),
    /// As it is now: the copy here (no later update of it logged, or its earlier value was
    /// not kept).
    Now,
}

/// The log's earlier values of the keys taken over, usable once every part came with them
/// and the values ([`ReplayHistory::complete`]), until the first live packet.
#[derive(Default)]
pub(super) struct ReplayHistory {
    by_key: Map<StoreKey, SmallVec<[Entry; 2]>>,
    /// A part came without them (the backend does not list them).
    gap: bool,
    /// A live packet was processed: a history completed later would lack what it changed.
    ended: bool,
    active: bool,
}

impl ReplayHistory {
    /// Takes in a take-over part's history (`None`: the backend has none to give).
    pub(super) fn add(&mut self, part: Option<Vec<(Clock, u32, Found)>>) {
        let Some(entries) = part.filter(|_| !self.ended) else {
            self.gap = true;
            return;
        };
        for (clock, seq, found) in entries {
            let (key, earlier) = match found {
                Found::Kept { key, value } => (key, Some(value)),
                Found::NotKept { key } => (key, None),
            };
            self.by_key.entry(key).or_default().push((clock, seq, earlier));
        }
    }

    /// Every part is in, with every value: the history answers from now on, if it is whole.
    pub(super) fn complete(&mut self) {
        self.active = !self.gap && !self.ended;
        if !self.active {
            self.by_key = Map::default();
        }
    }

    /// The replay is over (a live packet): what comes later is read from the store, for good.
    #[inline]
    pub(super) fn end(&mut self) {
        if !self.ended {
            self.end_now();
        }
    }

    /// [`ReplayHistory::end`]'s work, done once: out of line, so that the call made before
    /// every live packet is a test of one flag.
    #[cold]
    #[inline(never)]
    fn end_now(&mut self) {
        *self = ReplayHistory { ended: true, ..ReplayHistory::default() };
    }

    /// `key` as the store would answer a replayed packet's read at (`clock`, `seq`): before
    /// the first logged update of it at that place or later, of the clock's root
    /// (`ClockLog::as_of`'s rule). `None` when this history cannot tell: ask the store.
    pub(super) fn read_at(&self, key: &StoreKey, clock: Clock, seq: u32) -> Option<ReadAt> {
        if !self.active {
            return None;
        }
        let entries = self.by_key.get(key).into_iter().flatten();
        let first = first_logged_from(entries.map(|(c, s, earlier)| (*c, *s, earlier)), clock, seq);
        Some(match first {
            Some(Some(v)) => ReadAt::Was(v.clone()),
            _ => ReadAt::Now,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_state::StateKey;

    #[test]
    fn answers_as_the_store_would_once_complete() {
        let key = StoreKey { vertex: 1, object: 0, key: StateKey::Id(7) };
        let mut h = ReplayHistory::default();
        h.add(Some(vec![
            (Clock::new(0, 9), 0, Found::Kept { key, value: Some(Value::Int(90)) }),
            (Clock::new(0, 5), 1, Found::Kept { key, value: None }),
            (Clock::new(0, 12), 0, Found::NotKept { key }),
        ]));
        assert_eq!(h.read_at(&key, Clock::new(0, 5), 0), None, "not before every part is in");
        h.complete();
        assert_eq!(h.read_at(&key, Clock::new(0, 5), 0), Some(ReadAt::Was(None)));
        assert_eq!(
            h.read_at(&key, Clock::new(0, 5), 2),
            Some(ReadAt::Was(Some(Value::Int(90)))),
            "its own update done"
        );
        assert_eq!(h.read_at(&key, Clock::new(0, 10), 0), Some(ReadAt::Now), "a value not kept");
        assert_eq!(h.read_at(&key, Clock::new(0, 13), 0), Some(ReadAt::Now), "nothing later");
        assert_eq!(h.read_at(&key, Clock::new(1, 1), 0), Some(ReadAt::Now), "another root's");
        h.end();
        assert_eq!(h.read_at(&key, Clock::new(0, 5), 0), None, "a live packet ends it");
        h.add(Some(vec![(Clock::new(0, 20), 0, Found::Kept { key, value: None })]));
        h.complete();
        assert_eq!(h.read_at(&key, Clock::new(0, 19), 0), None, "and no history taken in after it counts");
        let mut gap = ReplayHistory::default();
        gap.add(Some(Vec::new()));
        gap.add(None);
        gap.complete();
        assert_eq!(gap.read_at(&key, Clock::new(0, 5), 0), None, "a part without history: ask the store");
    }
}
