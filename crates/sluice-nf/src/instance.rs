//! One running NF instance: the NF, its state handle and what it emitted. The runtime's workers
//! and NF unit tests drive NFs through this one type, so both see the same semantics.

use crate::{Event, LabelTable, NetworkFunction, NfContext, Verdict};
use sluice_packet::{Clock, InstanceId, Meta, Packet};
use sluice_state::{DueTimers, ObjectId, StateError, StateHandle, StateKey, TimerFired};
use std::sync::Arc;

/// How many timers may fire before one packet; the rest fire before the next ones, so a burst
/// of expiries cannot stall the data path.
pub const TIMERS_PER_PACKET: usize = 64;

/// What [`Instance::fire_for`] did.
#[derive(Debug)]
pub struct FiredFor {
    /// How many timers fired.
    pub fired: usize,
    /// The XOR of the ids of what they updated, for the packet to carry (the commits are the
    /// firing instance's to report).
    pub xor: u64,
    /// Whether the store has their updates.
    pub stored: Result<(), StateError>,
}

/// An NF instance with its state.
pub struct Instance {
    nf: Box<dyn NetworkFunction>,
    state: Box<dyn StateHandle>,
    vertex: Arc<str>,
    id: InstanceId,
    labels: Arc<LabelTable>,
    events: Vec<Event>,
    fired: Vec<TimerFired>,
    now_ns: u64,
    timer_filter: Option<TimerFilter>,
    /// How many timers may fire before the next packet ([`TIMERS_PER_PACKET`] unless other
    /// instances fired some of them on its behalf, [`Instance::limit_timers`]).
    budget: usize,
    /// The state handle's [`StateHandle::brackets_packets`], asked once.
    brackets: bool,
    /// The state handle's [`StateHandle::ends_packets`] where it brackets packets, asked once.
    ends: bool,
}

/// Which of an instance's due timers fire before a packet with this clock (the others stay
/// armed): while flows move away from it, the timers of flows that are another instance's at
/// that clock wait to be handed over; with one table of timers for every instance of an
/// order-sensitive vertex, a flow's timers are its serving instance's.
pub type TimerFilter = Box<dyn Fn(ObjectId, &StateKey, Clock) -> bool + Send>;

impl Instance {
    /// An instance of `nf` named `vertex`, with state behind `state`.
    pub fn new(
        nf: Box<dyn NetworkFunction>,
        state: Box<dyn StateHandle>,
        vertex: Arc<str>,
        id: InstanceId,
        labels: Arc<LabelTable>,
    ) -> Instance {
        Instance {
            nf,
            brackets: state.brackets_packets(),
            ends: state.brackets_packets() && state.ends_packets(),
            state,
            vertex,
            id,
            labels,
            events: Vec::new(),
            fired: Vec::new(),
            now_ns: 0,
            timer_filter: None,
            budget: TIMERS_PER_PACKET,
        }
    }

    /// Sets which due timers fire from now on ([`TimerFilter`]; `None`: all).
    pub fn set_timer_filter(&mut self, filter: Option<TimerFilter>) {
        self.timer_filter = filter;
    }

    /// Whether a [`TimerFilter`] is set.
    pub fn has_timer_filter(&self) -> bool {
        self.timer_filter.is_some()
    }

    /// Before the next packet at most `max` timers fire here (others fired the rest of the
    /// packet's [`TIMERS_PER_PACKET`] on its behalf).
    pub fn limit_timers(&mut self, max: usize) {
        self.budget = max.min(TIMERS_PER_PACKET);
    }

    /// Of the first `max` timers due before the packet of `clock` at time `now_ns`: whether
    /// the first is this instance's to fire, and whether one is another instance's
    /// ([`StateHandle::due_where`], by the [`TimerFilter`]).
    pub fn due_timers(&mut self, now_ns: u64, clock: Clock, max: usize) -> DueTimers {
        match &self.timer_filter {
            Some(f) => self.state.due_where(now_ns, max, &|o, k| f(o, k, clock)),
            None => self.state.due_where(now_ns, max, &|_, _| true),
        }
    }

    /// Fires, on behalf of the packet `packet` describes (its clock, time and entry time) that
    /// another instance (or this one) is about to process, at most `max` of the timers due by
    /// then — those that come, in firing order, before the first that is not this instance's —
    /// and waits until the store has their updates, so that the packet can go on as if they
    /// had fired here before it.
    pub fn fire_for(&mut self, packet: &Meta, max: usize) -> FiredFor {
        let (now_ns, clock) = (packet.ts_ns, packet.clock);
        let mut meta = Meta { clock, ts_ns: now_ns, ingress_ns: packet.ingress_ns, ..Meta::default() };
        self.state.begin_batch();
        self.state.begin_packet(&meta);
        if now_ns > self.now_ns {
            self.now_ns = now_ns;
        }
        self.budget = max.min(TIMERS_PER_PACKET);
        let fired = if self.state.may_fire(now_ns) { self.fire_due(now_ns, clock) } else { 0 };
        self.budget = TIMERS_PER_PACKET;
        self.state.end_packet(&mut meta);
        self.state.end_batch();
        let stored = self.state.flush();
        FiredFor { fired, xor: meta.xor, stored }
    }

    /// The NF.
    pub fn nf(&self) -> &dyn NetworkFunction {
        self.nf.as_ref()
    }

    /// This instance's id.
    pub fn id(&self) -> InstanceId {
        self.id
    }

    /// The vertex name.
    pub fn vertex(&self) -> &str {
        &self.vertex
    }

    /// The state handle (for inspection and tests).
    pub fn state(&mut self) -> &mut dyn StateHandle {
        self.state.as_mut()
    }

    /// Marks the start of a batch.
    pub fn begin_batch(&mut self) {
        self.state.begin_batch();
    }

    /// Marks the end of a batch.
    pub fn end_batch(&mut self) {
        self.state.end_batch();
    }

    /// Processes one packet: first fires timers that the packet's time has passed, then runs
    /// the NF. Packets that are not parsed IP packets are forwarded untouched.
    pub fn process(&mut self, pkt: &mut Packet) -> Verdict {
        // Timer work done on behalf of this packet belongs to its clock, so it is bracketed by
        // the packet's begin/end like the NF's own operations.
        if self.brackets {
            self.state.begin_packet(&pkt.meta);
        }
        self.advance_time(pkt.meta.ts_ns, pkt.meta.clock);
        self.budget = TIMERS_PER_PACKET;
        let v = if pkt.hdr().is_ip() {
            let mut ctx = NfContext::new(self.state.as_mut(), &self.vertex, self.id, &self.labels, &mut self.events);
            ctx.clock = pkt.meta.clock;
            ctx.now_ns = pkt.meta.ts_ns;
            self.nf.process(pkt, &mut ctx)
        } else {
            Verdict::Forward
        };
        if self.ends {
            self.state.end_packet(&mut pkt.meta);
        }
        v
    }

    /// Processes `pkt` again without changing state, for a replay passing through on its way to
    /// a replacement further down whose upstream record of this clock's output is gone (CHC's
    /// emulated updates): the NF decides against the state as it is now, its updates go to a
    /// scratch copy that is dropped, no timer fires or changes, and its events are dropped (the
    /// first processing raised them).
    pub fn process_emulated(&mut self, pkt: &mut Packet) -> Verdict {
        let mut emulating = crate::emulate::Emulating::new(self.state.as_mut(), self.nf.custom_ops());
        emulating.begin_packet(&pkt.meta);
        if !pkt.hdr().is_ip() {
            emulating.end_packet(&mut pkt.meta);
            return Verdict::Forward;
        }
        let mut dropped = Vec::new();
        let mut ctx = NfContext::new(&mut emulating, &self.vertex, self.id, &self.labels, &mut dropped);
        ctx.clock = pkt.meta.clock;
        ctx.now_ns = pkt.meta.ts_ns;
        let v = self.nf.process(pkt, &mut ctx);
        emulating.end_packet(&mut pkt.meta);
        v
    }

    /// Moves packet time forward to `now_ns` (never backward) and fires the timers due by
    /// `now_ns`: by the time of the packet about to be processed, not the latest this instance
    /// has seen. The two differ only for a packet that is behind (a moved flow's packets, held
    /// until the old instance finished with the flow, reach the new instance after later ones):
    /// such a packet must still find the state a timer removes only after its time, as in the
    /// logical NF.
    #[inline]
    pub fn advance_time(&mut self, now_ns: u64, clock: Clock) {
        if now_ns > self.now_ns {
            self.now_ns = now_ns;
        }
        if self.state.may_fire(now_ns) {
            self.fire_due(now_ns, clock);
        }
    }

    /// Fires the timers due by `now_ns`, at most the budget; how many (out of line: most
    /// packets find none due, and the per-packet path should not carry this frame).
    #[inline(never)]
    fn fire_due(&mut self, now_ns: u64, clock: Clock) -> usize {
        self.fired.clear();
        self.state.timers(true);
        let max = self.budget;
        match &self.timer_filter {
            Some(f) => self.state.expired_where(now_ns, max, &mut self.fired, &|o, k| f(o, k, clock)),
            None => self.state.expired(now_ns, max, &mut self.fired),
        }
        let fired = std::mem::take(&mut self.fired);
        for f in &fired {
            self.state.timer_fires(f);
            let mut ctx = NfContext::new(self.state.as_mut(), &self.vertex, self.id, &self.labels, &mut self.events);
            ctx.clock = clock;
            ctx.now_ns = now_ns;
            self.nf.on_timer(*f, &mut ctx);
        }
        let n = fired.len();
        self.fired = fired;
        self.state.timers(false);
        n
    }

    /// Events emitted so far.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Takes the events emitted so far.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_state::{AccessPattern, LocalState, ObjectId, Scope, StateDecl, StateKey};

    /// Reports every timer that fires, with the time it fired at.
    struct Expiring(Vec<StateDecl>);

    impl NetworkFunction for Expiring {
        fn kind(&self) -> &'static str {
            "expiring"
        }
        fn state_objects(&self) -> &[StateDecl] {
            &self.0
        }
        fn process(&self, _: &mut Packet, _: &mut crate::NfContext<'_>) -> crate::Verdict {
            crate::Verdict::Forward
        }
        fn on_timer(&self, _: TimerFired, ctx: &mut crate::NfContext<'_>) {
            let now = ctx.now_ns;
            ctx.emit("expired", now, "");
        }
    }

    /// Local state that marks every packet it saw out in its XOR vector, as a store client
    /// records its updates there (`brackets_packets` left at its default), and says whether
    /// packets need ending (`ends_packets`).
    struct Marking(LocalState, bool);

    impl StateHandle for Marking {
        fn exec(
            &mut self,
            obj: ObjectId,
            key: &StateKey,
            op: sluice_state::StateOp,
        ) -> Result<Option<sluice_state::Value>, StateError> {
            self.0.exec(obj, key, op)
        }
        fn set_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
            self.0.set_timer(obj, key, deadline_ns);
        }
        fn cancel_timer(&mut self, obj: ObjectId, key: &StateKey) {
            self.0.cancel_timer(obj, key);
        }
        fn expired(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>) {
            self.0.expired(now_ns, max, out);
        }
        fn ends_packets(&self) -> bool {
            self.1
        }
        fn end_packet(&mut self, meta: &mut sluice_packet::Meta) {
            meta.xor ^= 1;
        }
    }

    #[test]
    fn a_packet_is_bracketed_unless_its_state_needs_no_brackets() {
        let instance = |state: Box<dyn StateHandle>| {
            let nf = Box::new(Expiring(Vec::new()));
            Instance::new(nf, state, "v".into(), InstanceId::new(0, 0), Arc::default())
        };
        let mut pkt = Packet::new(vec![0; 60], sluice_packet::Meta::default());
        let mut marking = instance(Box::new(Marking(LocalState::new(&[], &[]), true)));
        assert_eq!(marking.process(&mut pkt), crate::Verdict::Forward);
        assert_eq!(pkt.meta.xor, 1, "a handle that keeps the default brackets every packet");
        assert!(!LocalState::new(&[], &[]).brackets_packets(), "local state needs none");
        let mut local = instance(Box::new(LocalState::new(&[], &[])));
        assert_eq!(local.process(&mut pkt), crate::Verdict::Forward);
        assert_eq!(pkt.meta.xor, 1);
    }

    #[test]
    fn a_packet_is_not_ended_where_its_state_carries_nothing_out() {
        let nf = Box::new(Expiring(Vec::new()));
        let state = Box::new(Marking(LocalState::new(&[], &[]), false));
        let mut inst = Instance::new(nf, state, "v".into(), InstanceId::new(0, 0), Arc::default());
        let mut pkt = Packet::new(vec![0; 60], sluice_packet::Meta::default());
        assert_eq!(inst.process(&mut pkt), crate::Verdict::Forward);
        assert_eq!(pkt.meta.xor, 0, "end_packet was called");
    }

    #[test]
    fn timers_fire_by_the_time_of_the_packet_not_the_latest_seen() {
        let decls = vec![StateDecl::new("x", Scope::per_flow(), AccessPattern::ReadHeavy)];
        let state = Box::new(LocalState::new(&decls, &[]));
        let nf = Box::new(Expiring(decls));
        let mut inst = Instance::new(nf, state, "v".into(), InstanceId::new(0, 0), Arc::default());
        inst.advance_time(1_000, Default::default());
        // The instance has seen time 1,000 when a timer for time 500 is armed (a moved flow's
        // timer taken over) and a packet of that flow at time 400 comes: it still finds the state.
        inst.state().set_timer(ObjectId(0), &StateKey::Id(1), 500);
        inst.advance_time(400, Default::default());
        assert!(inst.events().is_empty());
        // The next packet past the deadline fires it, at that packet's time.
        inst.advance_time(1_001, Default::default());
        assert_eq!(inst.events().len(), 1);
        assert_eq!(inst.events()[0].subject, "1001");
    }
}
