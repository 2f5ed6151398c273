//! The timers on a vertex's shared keys while the vertex has, or may get, several instances
//! in one process: one table for all of them (docs/decisions.md "Timers on shared keys in
//! threads"), and which of an instance's timers live there. For an order-sensitive vertex the
//! table holds its per-flow timers too, each fired by the instance serving its flow when its
//! turn comes (docs/correctness.md, "Per-flow timers of an order-sensitive vertex").

use super::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// One vertex's table of timers on shared keys, and the earliest deadline in it, readable
/// without the lock: every packet of every instance asks whether a timer is due, and almost
/// always none is.
#[derive(Default)]
pub struct VertexTimerTable {
    timers: Mutex<Timers>,
    /// No timer in the table is due before this packet time (0 until first looked at).
    earliest: AtomicU64,
    /// Per-flow timers live here too, not only those on shared keys.
    flows_too: bool,
    /// Whether `ask` holds a packet's question (read on every turn of every instance).
    asking: AtomicBool,
    ask: Mutex<Option<Ask>>,
}

/// An instance of an order-sensitive vertex is about to process a packet before which timers
/// of flows other instances serve are due: in the logical NF they fire first, in deadline
/// order, so their instances fire them, each in turn, on the packet's behalf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// The packet, as far as its timers need it: its time (the handlers see it as theirs), its
    /// clock (the firings' updates are tagged with it) and its entry time (their write-ahead
    /// log entries carry it).
    pub packet: Meta,
    /// How many more timers may fire before the packet (one instance fires at most a fixed
    /// number before a packet; the instances together fire no more).
    pub budget: usize,
    /// The XOR of the ids of what the firings updated: the packet carries it to the root,
    /// which hears of the commits from the instances that fired.
    pub xor: u64,
    /// The asking instance (its global index), woken when another has fired.
    pub asker: usize,
    /// How many instances are firing on the packet's behalf right now: the timers they took
    /// from the table are no longer there, but the packet waits until they have fired.
    pub firing: u32,
}

/// Where the question about a packet stands ([`VertexTimerTable::answer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Nobody asked about it.
    NotAsked,
    /// An instance is firing on its behalf: the packet waits.
    Firing,
    /// Answered and withdrawn: what was fired on the packet's behalf.
    Answered(Ask),
}

impl VertexTimerTable {
    /// A table that holds every timer of the vertex, per-flow ones too (an order-sensitive
    /// vertex: every due timer fires before the first packet past its deadline, in deadline
    /// order, whichever instance serves the packet or the timer's flow).
    pub fn with_flow_timers() -> VertexTimerTable {
        VertexTimerTable { flows_too: true, ..VertexTimerTable::default() }
    }

    /// Whether per-flow timers live here too.
    pub fn holds_flow_timers(&self) -> bool {
        self.flows_too
    }

    /// Runs `f` on the table, under its lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut Timers) -> R) -> R {
        // A poisoned lock only means another worker panicked; the table itself is whole.
        let mut t = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        let r = f(&mut t);
        self.earliest.store(t.next_deadline().unwrap_or(u64::MAX), Ordering::Release);
        r
    }

    /// Whether a timer of the table may be due at packet time `now_ns`. A timer another
    /// instance arms meanwhile is seen at the next look, as it would be had that instance
    /// taken the lock a moment later.
    pub fn may_be_due(&self, now_ns: u64) -> bool {
        self.earliest.load(Ordering::Acquire) <= now_ns
    }

    fn asked_mut<R>(&self, f: impl FnOnce(&mut Option<Ask>) -> R) -> R {
        let mut a = self.ask.lock().unwrap_or_else(PoisonError::into_inner);
        let r = f(&mut a);
        self.asking.store(a.is_some(), Ordering::Release);
        r
    }

    /// The packet asked about, if any (one at a time: the vertex's instances take packets in
    /// entry order, and only the earliest not finished is processed).
    pub fn asked(&self) -> Option<Ask> {
        if !self.asking.load(Ordering::Acquire) {
            return None;
        }
        self.asked_mut(|a| *a)
    }

    /// What is known of the question about clock `clock`: the one asked, or a fresh one.
    pub fn ask_about(&self, meta: &Meta, budget: usize, asker: usize) -> Ask {
        let packet = Meta { clock: meta.clock, ts_ns: meta.ts_ns, ingress_ns: meta.ingress_ns, ..Meta::default() };
        let fresh = Ask { packet, budget, xor: 0, asker, firing: 0 };
        self.asked().filter(|a| a.packet.clock == meta.clock).unwrap_or(fresh)
    }

    /// Asks for the timers due before the packet of `ask` (again: a question about the
    /// same clock stays as it is).
    pub fn ask(&self, ask: Ask) {
        self.asked_mut(|a| {
            if a.is_none_or(|a| a.packet.clock != ask.packet.clock) {
                *a = Some(ask);
            }
        });
    }

    /// An instance starts firing on behalf of the packet of `clock` (before it takes any
    /// timer from the table); whether that packet is the one asked about.
    pub fn begin_firing(&self, clock: Clock) -> bool {
        self.asked_mut(|a| match a.as_mut().filter(|a| a.packet.clock == clock) {
            Some(a) => {
                a.firing += 1;
                true
            }
            None => false,
        })
    }

    /// An instance that began firing on behalf of the packet of `clock` fired `fired` timers,
    /// their updates' ids XORed into `xor`.
    pub fn fired_for(&self, clock: Clock, fired: usize, xor: u64) {
        self.asked_mut(|a| {
            if let Some(a) = a.as_mut().filter(|a| a.packet.clock == clock) {
                a.budget = a.budget.saturating_sub(fired);
                a.xor ^= xor;
                a.firing = a.firing.saturating_sub(1);
            }
        });
    }

    /// The packet of `clock` would go on (no timer due before it is another instance's any
    /// more): its question is answered and withdrawn, unless an instance is still firing on
    /// its behalf.
    pub fn answer(&self, clock: Clock) -> Answer {
        if !self.asking.load(Ordering::Acquire) {
            return Answer::NotAsked;
        }
        self.asked_mut(|a| match *a {
            Some(x) if x.packet.clock == clock && x.firing > 0 => Answer::Firing,
            Some(x) if x.packet.clock == clock => {
                *a = None;
                Answer::Answered(x)
            }
            _ => Answer::NotAsked,
        })
    }
}

impl StoreClient {
    /// From now on the timers on this instance's shared keys live in `table`, one table for
    /// every instance of the vertex (those it armed so far move there). A timer on a key
    /// several instances share must fire before the first packet past its deadline, whichever
    /// instance that packet reaches — the logical NF fires it there — not when the instance
    /// that armed it next sees such a packet; whoever gets there first takes it from the table
    /// and fires it, once.
    pub fn share_vertex_timers(&mut self, table: VertexTimers) {
        let every = table.holds_flow_timers();
        for (o, k, d) in self.timers.armed() {
            if every || self.is_shared_object(o) {
                self.timers.cancel(o, &k);
                table.with(|t| t.set(o, &k, d));
            }
        }
        self.vertex_timers = Some(table);
    }

    /// Adds the due timers of the vertex's table that `fire` lets fire here to `fired` (this
    /// instance's own due timers: timer, deadline, `false`), marked `true`, keeping the
    /// earliest `max` of both in deadline order (as one wheel would fire them) and putting the
    /// others back where they came from.
    pub(super) fn take_vertex_timers(
        &mut self,
        now_ns: u64,
        max: usize,
        fired: &mut Vec<(TimerFired, u64, bool)>,
        fire: &dyn Fn(ObjectId, &StateKey) -> bool,
    ) {
        let Some(table) = self.vertex_timers.clone().filter(|t| t.may_be_due(now_ns)) else { return };
        let own = &mut self.timers;
        let shared_objects = &self.shared_objects;
        // With per-flow timers in the table, `fire` says which flows' timers are this
        // instance's; the first that is not ends the firing here (the timers after it fire
        // after it, once its instance has fired it). Anyone fires a shared key's.
        let stopped = std::cell::Cell::new(false);
        let in_turn = |o: ObjectId, k: &StateKey| {
            if !table.holds_flow_timers() {
                return fire(o, k);
            }
            if stopped.get() {
                return false;
            }
            let fires = shared_objects.get(usize::from(o.0)).copied().unwrap_or(false) || fire(o, k);
            stopped.set(!fires);
            fires
        };
        table.with(|t| {
            let (mut shared, mut deadlines) = (Vec::new(), Vec::new());
            t.expired_where(now_ns, max, &mut shared, &mut deadlines, &in_turn);
            if shared.is_empty() {
                return;
            }
            fired.extend(shared.into_iter().zip(deadlines).map(|(f, d)| (f, d, true)));
            // Stable: on equal deadlines the instance's own go first.
            fired.sort_by_key(|(_, d, _)| *d);
            for (f, d, from_table) in fired.drain(max.min(fired.len())..) {
                if from_table {
                    t.set(f.object, &f.key, d);
                } else {
                    own.set(f.object, &f.key, d);
                }
            }
        });
    }

    /// Runs `f` on the timers `obj`'s timers live in: the vertex's table for a shared object
    /// (any object, if the table holds per-flow timers too) while one is attached, else this
    /// instance's own.
    pub(super) fn timers_of_object<R>(&mut self, obj: ObjectId, f: impl FnOnce(&mut Timers) -> R) -> R {
        let in_table = self.in_vertex_table(obj);
        match self.vertex_timers.as_ref().filter(|_| in_table) {
            Some(t) => t.with(f),
            None => f(&mut self.timers),
        }
    }

    /// Whether `obj`'s timers are in the vertex's table.
    pub(super) fn in_vertex_table(&self, obj: ObjectId) -> bool {
        self.vertex_timers.as_ref().is_some_and(|t| t.holds_flow_timers() || self.is_shared_object(obj))
    }

    /// The vertex's table of timers, if this instance's timers (some or all) live in one.
    pub fn vertex_timer_table(&self) -> Option<&VertexTimers> {
        self.vertex_timers.as_ref()
    }

    /// [`StateHandle::due_where`] on the vertex's table, when it holds per-flow timers (this
    /// instance's own wheel holds none then).
    pub(super) fn due_in_table(
        &mut self,
        now_ns: u64,
        max: usize,
        fire: &dyn Fn(ObjectId, &StateKey) -> bool,
    ) -> DueTimers {
        let Some(table) = self.vertex_timers.as_ref().filter(|t| t.holds_flow_timers() && t.may_be_due(now_ns)) else {
            return DueTimers::default();
        };
        let due = table.with(|t| t.due(now_ns, max));
        let fires = |(o, k): &(ObjectId, StateKey)| self.is_shared_object(*o) || fire(*o, k);
        DueTimers { first_fireable: due.first().is_some_and(fires), foreign: due.iter().any(|d| !fires(d)) }
    }

    /// Whether `obj` is scoped wider than a flow.
    pub(super) fn is_shared_object(&self, obj: ObjectId) -> bool {
        self.shared_objects.get(usize::from(obj.0)).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_question_at_a_time_counts_the_firings_for_its_packet() {
        let t = VertexTimerTable::with_flow_timers();
        let c = |seq| Clock::new(0, seq);
        assert!(t.asked().is_none() && t.holds_flow_timers());
        let meta = |seq| Meta { clock: c(seq), ts_ns: 500, ..Meta::default() };
        let a = t.ask_about(&meta(7), 64, 3);
        assert_eq!((a.budget, a.xor), (64, 0));
        assert!(!t.begin_firing(c(7)), "not asked yet");
        t.ask(a);
        assert!(t.begin_firing(c(7)) && !t.begin_firing(c(8)));
        assert_eq!(t.answer(c(7)), Answer::Firing, "the packet waits while an instance fires for it");
        t.fired_for(c(7), 2, 0b01);
        t.fired_for(c(8), 5, 0b10);
        // Asked again about the same packet: the question stays as it was.
        t.ask(t.ask_about(&meta(7), 64, 3));
        assert_eq!(t.asked().map(|a| (a.budget, a.xor, a.asker, a.firing)), Some((62, 0b01, 3, 0)));
        assert!(t.begin_firing(c(7)));
        t.fired_for(c(7), 1, 0b11);
        assert_eq!(t.answer(c(8)), Answer::NotAsked, "another packet's answer");
        assert!(matches!(t.answer(c(7)), Answer::Answered(a) if (a.budget, a.xor) == (61, 0b10)));
        assert!(t.asked().is_none(), "answered and withdrawn");
    }

    #[test]
    fn the_table_tells_without_its_lock_whether_a_timer_may_be_due() {
        let t = VertexTimerTable::default();
        assert!(t.may_be_due(0), "never looked at: maybe");
        t.with(|_| ());
        assert!(!t.may_be_due(u64::MAX - 1), "empty");
        t.with(|x| x.set(ObjectId(0), &StateKey::Id(1), 500));
        assert!(!t.may_be_due(499) && t.may_be_due(500));
        t.with(|x| x.set(ObjectId(0), &StateKey::Id(2), 300));
        assert!(t.may_be_due(300), "an earlier timer armed by another instance is seen");
        let mut fired = Vec::new();
        t.with(|x| x.expired(400, 8, &mut fired));
        assert_eq!(fired.len(), 1);
        assert!(!t.may_be_due(499) && t.may_be_due(500), "the next deadline after one fired");
    }
}
