//! The embedded store's per-clock log: the result of every tagged update of a packet still in
//! flight, by (clock, vertex, index in the packet), so that the same update arriving again (a
//! replay, a retransmitted batch) is answered from the log instead of applied twice (CHC's
//! exactly-once updates).
//!
//! Every tagged update is logged and looked up once, and the root tells the store when a
//! root's clocks up to some point are done ([`ClockLog::forget`]). Clocks of one root are
//! sequence numbers that arrive nearly in order, so the log is one ring per root indexed by
//! sequence number, each slot holding that clock's few updates in place (more spill to the
//! heap): a lookup is a subtraction and a scan of a handful of entries, forgetting pops slots
//! off the front — no hashing, no allocation once running, and the clocks being logged and
//! forgotten lie next to each other in memory.

use crate::wire::{Found, StoreKey};
use sluice_packet::{Clock, InstanceId, SeqRing};
use sluice_state::Value;
use smallvec::SmallVec;
use std::collections::{HashMap, VecDeque};

/// A logged result, in 16 bytes: what most updates leave (nothing, an integer) in place, any
/// other value boxed. Entries stay small, so a clock's slot holds them without a pointer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kept {
    /// No value (an absent one, or an update whose result is none).
    Nothing,
    /// An integer (a counter after an increment).
    Int(i64),
    /// Any other value.
    Other(Box<Value>),
}

impl Kept {
    /// The result as the update gave it.
    pub(crate) fn value(&self) -> Option<Value> {
        match self {
            Kept::Nothing => None,
            Kept::Int(i) => Some(Value::Int(*i)),
            Kept::Other(v) => Some(Value::clone(v)),
        }
    }
}

impl From<Option<Value>> for Kept {
    fn from(v: Option<Value>) -> Kept {
        match v {
            None => Kept::Nothing,
            Some(Value::Int(i)) => Kept::Int(i),
            Some(v) => Kept::Other(Box::new(v)),
        }
    }
}

/// What the log knows of the value an update changed, as it was before the update: what a
/// replayed packet reads ([`ClockLog::as_of`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Was {
    /// Not known: which value the update changed (a log restored from a checkpoint; a
    /// counter's increments, which no replayed packet reads as of a clock).
    Unknown,
    /// The value the update changed, but not what it held before (a large value, whose copy
    /// per update would cost more than it is worth; an increment among many).
    Untracked(StoreKey),
    /// The value the update changed and what it held before.
    Before(StoreKey, Earlier),
}

/// A small value as it was, kept without an allocation (a record of integers in place).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Earlier {
    /// Absent, or a value that holds nothing on the heap.
    Plain(Option<Value>),
    /// A short record of integers.
    Ints(SmallVec<[i64; SMALL_RECORD]>),
}

impl Earlier {
    fn value(&self) -> Option<Value> {
        match self {
            Earlier::Plain(v) => v.clone(),
            Earlier::Ints(v) => Some(Value::Ints(v.to_vec())),
        }
    }
}

impl Was {
    /// The value an update of `key` changed, kept as it was if it is small (a number, an
    /// address, a tuple, a short record: what per-flow state holds). A global object's value
    /// (key `Unit`) is never a flow's: no replayed packet reads it as of a clock.
    pub(crate) fn of(key: StoreKey, before: &Option<Value>) -> Was {
        if key.key == sluice_state::StateKey::Unit {
            return Was::Unknown;
        }
        let earlier = match before {
            None => Earlier::Plain(None),
            Some(v @ (Value::Int(_) | Value::Float(_) | Value::Endpoint(..) | Value::Tuple(_))) => {
                Earlier::Plain(Some(v.clone()))
            }
            Some(Value::Ints(v)) if v.len() <= SMALL_RECORD => Earlier::Ints(SmallVec::from_slice(v)),
            Some(Value::Ints(_) | Value::List(_) | Value::Bytes(_)) => return Was::Untracked(key),
        };
        Was::Before(key, earlier)
    }

    /// What a checkpoint keeps of it.
    pub(crate) fn found(&self) -> Option<Found> {
        match self {
            Was::Unknown => None,
            Was::Untracked(key) => Some(Found::NotKept { key: *key }),
            Was::Before(key, earlier) => Some(Found::Kept { key: *key, value: earlier.value() }),
        }
    }

    /// Back from a checkpoint.
    pub(crate) fn from_found(found: Option<&Found>) -> Was {
        match found {
            None => Was::Unknown,
            Some(Found::NotKept { key }) => Was::Untracked(*key),
            Some(Found::Kept { key, value }) => Was::of(*key, value),
        }
    }

    fn key(&self) -> Option<&StoreKey> {
        match self {
            Was::Unknown => None,
            Was::Untracked(k) | Was::Before(k, _) => Some(k),
        }
    }
}

/// The longest integer record whose earlier values the log keeps.
const SMALL_RECORD: usize = 8;

/// What a replayed packet reads of a value ([`ClockLog::as_of`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AsOf {
    /// The value as it was before the packet's clock.
    Was(Option<Value>),
    /// No update of the value at or after the clock is logged: it is as it is now.
    Now,
    /// An update at or after the clock changed it, but what it held before is not known: the
    /// value now is the best answer there is.
    Unknown,
}

/// The store's rule for a replayed packet's read at (`clock`, `seq`), written once for the
/// embedded store's log and a replacement's take-over history: among logged updates of one
/// key as (clock, number in the packet, what it found), the first at that place or later, of
/// the clock's root. (Redis's script, `sluice.lua`, states the same rule in Lua.)
pub(crate) fn first_logged_from<T>(
    updates: impl IntoIterator<Item = (Clock, u32, T)>,
    clock: Clock,
    seq: u32,
) -> Option<T> {
    updates
        .into_iter()
        .filter(|(c, s, _)| c.root() == clock.root() && (c.seq(), *s) >= (clock.seq(), seq))
        .min_by_key(|(c, s, _)| (c.seq(), *s))
        .map(|(_, _, found)| found)
}

/// One logged update of a clock: its vertex, its index in the packet, its result, and where
/// its ring keeps the value it changed as it was before ([`NO_WAS`]: nowhere). 32 bytes: the
/// `Was` lives in the ring's own queue, kept only for updates that have one (a counter's
/// increments do not), without an allocation each.
#[derive(Debug, Clone, PartialEq)]
struct Logged {
    vertex: u16,
    seq: u32,
    result: Kept,
    was: u64,
}

/// A [`Logged`] update with no `Was`.
const NO_WAS: u64 = u64::MAX;

/// One clock's updates: two in place (a NAT's two counters), more on the heap.
type Slot = SmallVec<[Logged; 2]>;

/// One root's clocks: the updates of each sequence number in its slot. A slot the window
/// leaves is emptied in place, for the clock that takes it next.
#[derive(Default)]
struct Ring {
    slots: SeqRing<Slot>,
    /// Every clock of this root up to here is done: nothing of it can come again.
    forgotten: u64,
    /// The `Was` of logged updates that have one, with their clocks, in the order logged:
    /// number `n` (in [`Logged::was`]) is at `n - was_gone`. Popped as their clocks are
    /// forgotten (one logged out of clock order waits for those logged before it).
    was: VecDeque<(u64, Was)>,
    was_gone: u64,
    /// Beside each `Was`, the number of the one before it of the same key (a chain per key,
    /// newest first; [`NO_WAS`] ends it), and per key the number of its newest: a replayed read
    /// walks its key's updates instead of every clock after its own (thousands in a replay).
    was_prev: VecDeque<(u32, u64)>,
    newest: hashbrown::HashMap<StoreKey, u64, ahash::RandomState>,
}

impl Ring {
    /// Keeps `was` (of update `seq` of sequence number `at`) if it says anything, chained to
    /// its key's newest: its number for [`Logged::was`], or [`NO_WAS`].
    fn keep_was(&mut self, at: u64, seq: u32, was: Was) -> u64 {
        if let Was::Unknown = was {
            return NO_WAS;
        }
        let n = self.was_gone + self.was.len() as u64;
        let prev = was.key().and_then(|k| self.newest.insert(*k, n)).unwrap_or(NO_WAS);
        self.was.push_back((at, was));
        self.was_prev.push_back((seq, prev));
        n
    }

    fn was(&self, n: u64) -> Option<&Was> {
        let i = usize::try_from(n.checked_sub(self.was_gone)?).ok()?;
        self.was.get(i).map(|(_, w)| w)
    }
}

/// The per-clock log of one shard.
#[derive(Default)]
pub(crate) struct ClockLog {
    /// By root id.
    rings: Vec<Ring>,
    /// Updates of clocks the rings do not cover: already forgotten (a clock's updates can be
    /// logged again after it was forgotten, as in the Redis store), or too far from the ring's
    /// clocks to stretch it that far. Empty in a running chain.
    stray: HashMap<(Clock, u16, u32), (Kept, Was)>,
}

/// Where an update goes in the log ([`ClockLog::place_in_ring`]).
enum Place {
    /// It is logged already.
    Logged,
    /// Ring `.0`, sequence number `.1`: a slot it holds, or the next after its last.
    Ring(usize, u64),
    /// Not the usual case: the general path decides.
    Elsewhere,
}

/// How far a ring stretches to take a clock before or after the ones it holds; beyond, the
/// update goes to the strays (a ring slot costs 72 bytes even when empty).
const MAX_STRETCH: u64 = 1 << 20;

impl ClockLog {
    fn slot(&self, clock: Clock) -> Option<&Slot> {
        self.rings.get(usize::from(clock.root()))?.slots.get(clock.seq())
    }

    /// The result logged for update `seq` of `clock` at `vertex`, if it was applied.
    pub(crate) fn get(&self, clock: Clock, vertex: u16, seq: u32) -> Option<&Kept> {
        let found = self.slot(clock).and_then(|s| s.iter().find(|l| l.vertex == vertex && l.seq == seq));
        match found {
            Some(l) => Some(&l.result),
            None if self.stray.is_empty() => None,
            None => self.stray.get(&(clock, vertex, seq)).map(|(k, _)| k),
        }
    }

    /// Whether update `seq` of `clock` at `vertex` was applied (and is still remembered).
    pub(crate) fn contains(&self, clock: Clock, vertex: u16, seq: u32) -> bool {
        self.get(clock, vertex, seq).is_some()
    }

    /// Logs the result of update `seq` of `clock` at `vertex`; whether it is new (a second
    /// result for the same update keeps the first).
    #[cfg(test)]
    pub(crate) fn insert(&mut self, clock: Clock, vertex: u16, seq: u32, result: Kept) -> bool {
        self.insert_was(clock, vertex, seq, result, Was::Unknown)
    }

    /// [`ClockLog::insert`], with what the update changed.
    pub(crate) fn insert_was(&mut self, clock: Clock, vertex: u16, seq: u32, result: Kept, was: Was) -> bool {
        match self.place_in_ring(clock, vertex, seq) {
            Place::Logged => false,
            Place::Ring(r, i) => {
                self.push_in_ring((r, i), |ring| ring.keep_was(clock.seq(), seq, was), (vertex, seq, result));
                true
            }
            Place::Elsewhere => self.insert_elsewhere(clock, vertex, seq, result, was),
        }
    }

    /// [`ClockLog::insert_was`] for an update whose earlier value no replay reads (a counter's
    /// increment): whether it is new. Fault tolerance pays this per increment.
    pub(crate) fn insert_result(&mut self, clock: Clock, vertex: u16, seq: u32, result: Kept) -> bool {
        match self.place_in_ring(clock, vertex, seq) {
            Place::Logged => false,
            Place::Ring(r, i) => {
                self.push_in_ring((r, i), |_| NO_WAS, (vertex, seq, result));
                true
            }
            Place::Elsewhere => self.insert_elsewhere(clock, vertex, seq, result, Was::Unknown),
        }
    }

    /// The general path of [`ClockLog::insert_was`], where [`ClockLog::place_in_ring`] could
    /// not place the update: whether it is new.
    fn insert_elsewhere(&mut self, clock: Clock, vertex: u16, seq: u32, result: Kept, was: Was) -> bool {
        if self.contains(clock, vertex, seq) {
            return false;
        }
        self.insert_absent(clock, vertex, seq, result, was);
        true
    }

    /// Where update `seq` of `clock` at `vertex` goes, with one look at the clock's slot in the
    /// usual case: a clock the ring holds, or the next one after it, with no strays.
    #[inline]
    fn place_in_ring(&self, clock: Clock, vertex: u16, seq: u32) -> Place {
        let at = clock.seq();
        let r = usize::from(clock.root());
        let Some(ring) = self.rings.get(r) else { return Place::Elsewhere };
        if !self.stray.is_empty() || at <= ring.forgotten || ring.slots.span() == 0 {
            return Place::Elsewhere;
        }
        match ring.slots.get(at) {
            Some(slot) if slot.iter().any(|l| l.vertex == vertex && l.seq == seq) => Place::Logged,
            Some(_) => Place::Ring(r, at),
            None if at == ring.slots.end() => Place::Ring(r, at),
            None => Place::Elsewhere,
        }
    }

    /// Logs an update at ring `r`'s sequence number `at` ([`ClockLog::place_in_ring`]); `was`
    /// keeps what it changed and says where.
    #[inline]
    fn push_in_ring(
        &mut self,
        (r, at): (usize, u64),
        was: impl FnOnce(&mut Ring) -> u64,
        (vertex, seq, result): (u16, u32, Kept),
    ) {
        let Some(ring) = self.rings.get_mut(r) else { return };
        let was = was(ring);
        if let Some(slot) = ring.slots.cover(at) {
            slot.push(Logged { vertex, seq, result, was });
        }
    }

    /// Logs the result of update `seq` of `clock` at `vertex`, which the caller knows is not
    /// logged (it just looked).
    fn insert_absent(&mut self, clock: Clock, vertex: u16, seq: u32, result: Kept, was: Was) {
        let r = usize::from(clock.root());
        if self.rings.len() <= r {
            self.rings.resize_with(r + 1, Ring::default);
        }
        let Some(ring) = self.rings.get_mut(r) else { return };
        let at = clock.seq();
        let (base, end) = match ring.slots.span() {
            0 => (at, at),
            _ => (ring.slots.base(), ring.slots.end()),
        };
        if at <= ring.forgotten || at.saturating_add(MAX_STRETCH) < base || at > end.saturating_add(MAX_STRETCH) {
            self.stray.insert((clock, vertex, seq), (result, was));
            return;
        }
        let was = ring.keep_was(at, seq, was);
        // The window stretches to cover `at`: at the back (the usual case) or the front (an
        // older clock's update arriving after a younger one's).
        if let Some(slot) = ring.slots.cover(at) {
            slot.push(Logged { vertex, seq, result, was });
        }
    }

    /// Value `key` as a replayed packet of `clock` reads it at position `seq` among its updates
    /// at the key's vertex (the number its next update would get): as it was before the first
    /// logged update of it at (`clock`, `seq`) or later — the packet's own earlier updates count
    /// as done, its later ones and later clocks' do not (in clock order; updates of one value by
    /// one instance arrive in that order). The packet's first run may have been followed by later packets
    /// whose updates the store applied before the copy that would have carried its output was
    /// lost: run again against the value now, an NF may take another path than the first time
    /// (a balancer finding the connection the first run opened, and closed since, reopened) and
    /// its updates no longer match the logged ones. Clocks of other roots are not comparable:
    /// only `clock`'s root's updates count.
    pub(crate) fn as_of(&self, clock: Clock, seq: u32, key: &StoreKey) -> AsOf {
        let root = clock.root();
        // The key's updates still remembered, newest first: the first at (clock, number) or
        // later (updates are logged in about clock order, not exactly: all are looked at).
        let in_ring = self.rings.get(usize::from(root)).and_then(|ring| {
            let mut best: Option<(u64, u32, u64)> = None;
            let mut n = ring.newest.get(key).copied().unwrap_or(NO_WAS);
            while n != NO_WAS && n >= ring.was_gone {
                let i = usize::try_from(n - ring.was_gone).ok()?;
                let (&(at, _), &(s, prev)) = (ring.was.get(i)?, ring.was_prev.get(i)?);
                if (at, s) >= (clock.seq(), seq) && best.is_none_or(|(a, b, _)| (at, s) < (a, b)) {
                    best = Some((at, s, n));
                }
                n = prev;
            }
            let (at, s, n) = best?;
            Some((Clock::new(root, at), s, ring.was(n)?))
        });
        // Strays (none in a running chain) count where their clock comes first.
        let strays =
            self.stray.iter().filter(|(_, (_, w))| w.key() == Some(key)).map(|((c, _, s), (_, w))| (*c, *s, w));
        let first = first_logged_from(in_ring.into_iter().chain(strays), clock, seq);
        match first {
            Some(Was::Before(_, v)) => AsOf::Was(v.value()),
            Some(_) => AsOf::Unknown,
            None => AsOf::Now,
        }
    }

    /// Every clock of `upto`'s root up to and including `upto` is done there: their entries
    /// go. Other roots' clocks are not comparable and stay.
    pub(crate) fn forget(&mut self, upto: Clock) {
        let Some(ring) = self.rings.get_mut(usize::from(upto.root())) else { return };
        ring.forgotten = ring.forgotten.max(upto.seq());
        while ring.slots.span() > 0 && ring.slots.base() <= ring.forgotten {
            // Emptied in place: the slot's room is the next clock's.
            if let Some(slot) = ring.slots.pop_front() {
                slot.clear();
            }
        }
        while ring.was.front().is_some_and(|(c, _)| *c <= ring.forgotten) {
            let gone = ring.was_gone;
            if let Some(k) = ring.was.pop_front().and_then(|(_, w)| w.key().copied()) {
                // The key's newest update goes: so does the key (an older one went before it).
                if ring.newest.get(&k) == Some(&gone) {
                    ring.newest.remove(&k);
                }
            }
            ring.was_prev.pop_front();
            ring.was_gone += 1;
        }
        if !self.stray.is_empty() {
            self.stray.retain(|(c, _, _), _| c.root() != upto.root() || c.seq() > upto.seq());
        }
    }

    /// Forgets everything, forgotten marks included (a store restored from a checkpoint).
    pub(crate) fn clear(&mut self) {
        self.rings.clear();
        self.stray.clear();
    }

    /// Every logged update as (clock, vertex, index in the packet, result, what it found):
    /// the rings' by root and then clock, then the strays in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Clock, u16, u32, &Kept, &Was)> + '_ {
        let ringed = self.rings.iter().enumerate().flat_map(|(r, ring)| {
            let root = u8::try_from(r).unwrap_or(u8::MAX);
            ring.slots.iter().flat_map(move |(at, slot)| {
                let clock = Clock::new(root, at);
                slot.iter().map(move |l| (clock, l.vertex, l.seq, &l.result, ring.was(l.was).unwrap_or(&Was::Unknown)))
            })
        });
        ringed.chain(self.stray.iter().map(|(&(c, v, s), (res, was))| (c, v, s, res, was)))
    }
}

/// Per instance, the clock of its last update applied (CHC's TS vector, in no order). A shard
/// hears from few instances, a batch at a time, so a short list with a hint at the last one
/// used answers most updates with one comparison.
#[derive(Default)]
pub(crate) struct LastApplied {
    last: Vec<(InstanceId, Clock)>,
    hint: usize,
}

impl LastApplied {
    /// `who`'s last update applied is now one of `clock`.
    pub(crate) fn set(&mut self, who: InstanceId, clock: Clock) {
        if let Some(e) = self.last.get_mut(self.hint).filter(|e| e.0 == who) {
            e.1 = clock;
            return;
        }
        match self.last.iter().position(|e| e.0 == who) {
            Some(i) => {
                self.hint = i;
                if let Some(e) = self.last.get_mut(i) {
                    e.1 = clock;
                }
            }
            None => {
                self.hint = self.last.len();
                self.last.push((who, clock));
            }
        }
    }

    /// (instance, clock of its last update applied), in no order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (InstanceId, Clock)> + '_ {
        self.last.iter().copied()
    }
}

impl FromIterator<(InstanceId, Clock)> for LastApplied {
    fn from_iter<I: IntoIterator<Item = (InstanceId, Clock)>>(iter: I) -> Self {
        let mut t = LastApplied::default();
        for (who, clock) in iter {
            t.set(who, clock);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(n: i64) -> Kept {
        Kept::Int(n)
    }

    #[test]
    fn results_are_kept_as_given() {
        for v in [None, Some(Value::Int(-3)), Some(Value::Float(0.5)), Some(Value::Ints(vec![1, 2]))] {
            assert_eq!(Kept::from(v.clone()).value(), v);
        }
        assert!(std::mem::size_of::<Kept>() <= 16, "a result fits in two words");
    }

    #[test]
    fn updates_are_found_by_clock_vertex_and_index_and_kept_once() {
        let mut log = ClockLog::default();
        let c = Clock::new(0, 7);
        assert!(log.insert(c, 1, 0, int(10)));
        assert!(log.insert(c, 1, 1, int(11)));
        assert!(log.insert(c, 2, 0, Kept::Nothing));
        assert!(!log.insert(c, 1, 0, int(99)), "the same update again keeps the first result");
        assert_eq!(log.get(c, 1, 0), Some(&int(10)));
        assert_eq!(log.get(c, 2, 0), Some(&Kept::Nothing));
        assert!(!log.contains(c, 2, 1) && !log.contains(Clock::new(0, 8), 1, 0));
        assert!(!log.contains(Clock::new(1, 7), 1, 0), "another root's clock 7 is another clock");
        // The next clock goes at the ring's end, one further away leaves holes, an older one
        // goes in front; each is found once and kept once.
        for (seq, v) in [(8u64, 80), (11, 110), (5, 50)] {
            let c = Clock::new(0, seq);
            assert!(log.insert(c, 1, 0, int(v)) && !log.insert(c, 1, 0, int(0)));
            assert_eq!(log.get(c, 1, 0), Some(&int(v)));
        }
        assert!(!log.contains(Clock::new(0, 9), 1, 0) && !log.contains(Clock::new(0, 6), 1, 0));
    }

    #[test]
    fn forgetting_goes_by_root_up_to_a_clock_and_older_clocks_fit_in_front() {
        let mut log = ClockLog::default();
        for (root, seq) in [(0u8, 5u64), (0, 9), (1, 2), (0, 3)] {
            log.insert(Clock::new(root, seq), 0, 0, int(seq as i64));
        }
        let all: Vec<(Clock, u16, u32)> = log.iter().map(|(c, v, s, ..)| (c, v, s)).collect();
        assert_eq!(
            all,
            vec![
                (Clock::new(0, 3), 0, 0),
                (Clock::new(0, 5), 0, 0),
                (Clock::new(0, 9), 0, 0),
                (Clock::new(1, 2), 0, 0)
            ]
        );
        log.forget(Clock::new(0, 5));
        assert!(!log.contains(Clock::new(0, 3), 0, 0) && !log.contains(Clock::new(0, 5), 0, 0));
        assert!(log.contains(Clock::new(0, 9), 0, 0) && log.contains(Clock::new(1, 2), 0, 0));
        // An update of a forgotten clock is logged again (until the next forget), as is a
        // clock far from the ring's.
        assert!(log.insert(Clock::new(0, 4), 0, 0, int(4)));
        assert!(!log.insert(Clock::new(0, 4), 0, 0, int(5)));
        assert_eq!(log.get(Clock::new(0, 4), 0, 0), Some(&int(4)));
        let far = Clock::new(0, 9 + 2 * MAX_STRETCH);
        assert!(log.insert(far, 0, 0, Kept::Nothing) && log.contains(far, 0, 0));
        assert!(log.insert(Clock::new(0, 6), 0, 1, int(6)));
        assert!(log.contains(Clock::new(0, 6), 0, 1));
        assert_eq!(log.rings[0].slots.span(), 4, "the ring holds 6 to 9 only");
        assert_eq!(log.iter().count(), 5);
        log.forget(Clock::new(0, 100));
        assert!(!log.contains(Clock::new(0, 4), 0, 0) && log.contains(far, 0, 0));
        log.forget(far);
        assert_eq!(log.iter().count(), 1, "root 1's clock stays");
        log.clear();
        assert_eq!(log.iter().count(), 0);
        assert!(log.insert(Clock::new(0, 2), 0, 0, Kept::Nothing), "a cleared log forgets its marks too");
        assert!(log.contains(Clock::new(0, 2), 0, 0));
    }

    #[test]
    fn earlier_values_are_found_by_clock_and_forgotten_with_it() {
        let mut log = ClockLog::default();
        let key = |n: u64| StoreKey { vertex: 1, object: 0, key: sluice_state::StateKey::Id(n) };
        let was = |n: u64, v: i64| Was::of(key(n), &Some(Value::Int(v)));
        // Clock 7 logged after clock 9 (the ring grows at its front), a counter's increment
        // between them with nothing kept.
        log.insert_was(Clock::new(0, 9), 1, 0, Kept::Nothing, was(1, 90));
        log.insert_was(Clock::new(0, 8), 1, 0, int(3), Was::Unknown);
        log.insert_was(Clock::new(0, 7), 1, 0, Kept::Nothing, was(1, 70));
        log.insert_was(Clock::new(0, 9), 1, 1, Kept::Nothing, was(2, 5));
        assert_eq!(log.as_of(Clock::new(0, 6), 0, &key(1)), AsOf::Was(Some(Value::Int(70))));
        assert_eq!(log.as_of(Clock::new(0, 8), 0, &key(1)), AsOf::Was(Some(Value::Int(90))));
        assert_eq!(log.as_of(Clock::new(0, 7), 1, &key(1)), AsOf::Was(Some(Value::Int(90))), "after its own update");
        assert_eq!(log.as_of(Clock::new(0, 10), 0, &key(1)), AsOf::Now);
        assert_eq!(log.as_of(Clock::new(1, 1), 0, &key(1)), AsOf::Now, "another root's clocks count for nothing");
        let big = Was::of(key(3), &Some(Value::Bytes(vec![0; 64])));
        log.insert_was(Clock::new(0, 9), 1, 2, Kept::Nothing, big);
        assert_eq!(log.as_of(Clock::new(0, 9), 0, &key(3)), AsOf::Unknown);
        log.forget(Clock::new(0, 8));
        assert_eq!(log.as_of(Clock::new(0, 9), 0, &key(1)), AsOf::Was(Some(Value::Int(90))));
        assert_eq!(log.as_of(Clock::new(0, 9), 0, &key(2)), AsOf::Was(Some(Value::Int(5))));
        assert_eq!(log.as_of(Clock::new(0, 9), 2, &key(2)), AsOf::Now, "after the clock's update of it");
        log.forget(Clock::new(0, 9));
        assert_eq!(log.as_of(Clock::new(0, 9), 0, &key(1)), AsOf::Now);
        assert!(log.rings.iter().all(|r| r.newest.is_empty()), "the keys' chains go with the clocks");
        assert!(log.rings.iter().all(|r| r.was.is_empty()), "every earlier value went with its clock");
    }

    #[test]
    fn the_last_applied_clock_is_kept_per_instance() {
        let mut t = LastApplied::default();
        t.set(InstanceId(1), Clock::new(0, 5));
        t.set(InstanceId(2), Clock::new(0, 3));
        t.set(InstanceId(1), Clock::new(0, 4));
        let mut v: Vec<_> = t.iter().collect();
        v.sort();
        assert_eq!(v, vec![(InstanceId(1), Clock::new(0, 4)), (InstanceId(2), Clock::new(0, 3))]);
        let again: LastApplied = v.iter().copied().chain([(InstanceId(2), Clock::new(1, 1))]).collect();
        assert_eq!(again.iter().count(), 2);
        assert!(again.iter().any(|e| e == (InstanceId(2), Clock::new(1, 1))));
    }
}
