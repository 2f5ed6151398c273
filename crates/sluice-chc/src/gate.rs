//! What an instance does with the packets that reach it, and what a vertex remembers of the
//! clocks it processed.
//!
//! A packet arriving at an instance is queued, or **held**: while the instance recovers (a
//! replacement or a clone waiting for the root's replay to drain, so per-flow order holds) live
//! packets wait; while a flow moves in, that flow's packets wait for the old instance's barrier.
//! When a packet is taken from the queue, a **duplicate** is suppressed: a clock this instance
//! received before, or one another instance of the vertex processed (a straggler and its clone
//! both receive live traffic). A replay copy on its way to its target passes; the target itself
//! drops a clock it has processed already (two failures at once replay some packets twice).

use crate::moves::MoveId;
use crate::order::OrderKey;
use sluice_packet::{Clock, InstanceId, MetaFlags, Packet};
use std::collections::{HashMap, HashSet};

/// What happens to a packet that reaches an instance.
#[derive(Debug, Clone)]
pub enum Arrival {
    /// Queue it.
    Queue(Packet),
    /// Held (for a replay or a flow move); nothing to do now.
    Held,
    /// A live copy of a packet the root's replay towards this instance also carries: the replay
    /// copy does its work, so this copy is done now (holding it would hold up order-sensitive
    /// vertices behind a packet that will never be processed).
    Covered(Packet),
}

/// What happens to a packet taken from an instance's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dequeue {
    /// Process it. `duplicate`: this instance received the clock before and suppression is
    /// off, so the NF sees it again (counted).
    Process {
        /// A duplicate that reached the NF.
        duplicate: bool,
    },
    /// Drop it as a duplicate; the copy is done.
    Suppress,
}

/// What the instance does with a packet taken from its queue, every rule applied
/// ([`Gate::take`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Process it (`duplicate`: a live packet the NF sees again, suppression being off).
    Process {
        /// A duplicate that reaches the NF.
        duplicate: bool,
    },
    /// Drop it as a duplicate; the copy is done.
    Suppress,
    /// A replay copy passing through before the vertex processed its clock: it waits for
    /// that processing ([`passes_too_early`]).
    WaitForClock,
    /// A replay copy passing through whose clock the vertex has processed: it leaves as that
    /// processing left, without running the NF ([`passes_through`]).
    PassThrough,
}

/// What [`Gate::take`] needs to know besides the packet.
#[derive(Debug, Clone, Copy)]
pub struct TakeContext<'a> {
    /// The instance taking the packet.
    pub id: InstanceId,
    /// A replay copy aimed at this instance whose clock the vertex processed is skipped (see
    /// [`Gate::dequeue`]): a straggler's clone, or the root knows the clock's updates are
    /// committed.
    pub skip_done: bool,
    /// The clocks the vertex has processed.
    pub decided: &'a Decided,
    /// Duplicate suppression is on.
    pub suppress: bool,
    /// The driver has a record of what the vertex emitted for the packet's clock.
    pub emitted: bool,
}

/// Per-instance arrival and dequeue logic.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    /// Clocks that arrived here.
    seen: HashSet<Clock>,
    /// Live packets are held while a replay drains.
    recovering: bool,
    held: Vec<Packet>,
    /// The clocks of `held`.
    held_clocks: HashSet<Clock>,
    /// Per flow moving in: its packets, held until the old instance's barrier passes.
    move_held: HashMap<u64, Vec<Packet>>,
    /// Flows (split keys) this instance has received: what it reports to a recovering root,
    /// and which flows move when it is removed.
    flows: HashSet<u64>,
    /// Clocks the root replayed towards this instance.
    covered: HashSet<Clock>,
    /// The earliest of them in chain-entry order.
    least_covered: Option<OrderKey>,
    /// Roots stamping clocks (how entry order compares packets).
    roots: usize,
    /// The instance takes its packets in chain-entry order (an order-sensitive NF): see
    /// [`Gate::take_in_entry_order`].
    entry_ordered: bool,
    /// Barriers of moves away from this instance that go in when its recovery ends (see
    /// [`Gate::place_barrier`]).
    barriers_after_recovery: Vec<MoveId>,
    /// A straggler's clone whose straggler still holds packets the clone's replay does not
    /// carry: it serves nothing, and does not end its recovery, until the straggler has
    /// processed them (see [`Gate::wait_for_straggler`]).
    waits_for_straggler: bool,
}

/// What a recovering instance queues when its recovery ends, in this order.
#[derive(Debug, Clone, Default)]
pub struct RecoveryEnd {
    /// The live packets held for the replay, in arrival order.
    pub held: Vec<Packet>,
    /// Then the barriers of moves away from the instance deferred until now (behind the
    /// replay, which redoes the moved flows' lost packets, and behind the held live packets,
    /// which arrived before those moves and are the instance's own).
    pub barriers: Vec<MoveId>,
}

impl Gate {
    /// A gate for a new instance. A `recovering` one (a replacement, a clone) holds live packets
    /// until [`Gate::end_recovery`].
    pub fn new(recovering: bool) -> Gate {
        Gate { recovering, ..Gate::default() }
    }

    /// `pkt` of flow `key` reaches the instance.
    pub fn arrive(&mut self, key: u64, pkt: Packet) -> Arrival {
        self.flows.insert(key);
        // A replay copy past its target (an upstream instance's replay) travels on as a packet
        // like any other: it waits behind this instance's replay as live ones do, or a later
        // packet of a flow would overtake the earlier ones the replay carries.
        let live = pkt.meta.replay_target().is_none();
        if let Some(h) = self.move_held.get_mut(&key) {
            h.push(pkt);
            return Arrival::Held;
        }
        if self.recovering && live {
            if self.covered.contains(&pkt.meta.clock) {
                return Arrival::Covered(pkt);
            }
            if self.entry_ordered || self.before_replay(&pkt) {
                // Older than every packet the replay brings (in flight, but no longer in the
                // root's log, which a store crash cut back): nothing of its flow can come in the
                // replay before it, and an order-sensitive vertex must take it first.
                return Arrival::Queue(pkt);
            }
            self.held_clocks.insert(pkt.meta.clock);
            self.held.push(pkt);
            return Arrival::Held;
        }
        Arrival::Queue(pkt)
    }

    /// Whether `pkt` entered the chain before every packet the replay towards this instance
    /// brings (chain-entry order: [`OrderKey`], entry time first with several roots).
    fn before_replay(&self, pkt: &Packet) -> bool {
        self.least_covered.is_some_and(|least| OrderKey::of(&pkt.meta, self.roots) < least)
    }

    /// This instance takes its packets in chain-entry order (its driver processes a packet only
    /// once no earlier one is queued or held here or upstream, `crate::order`). Then a recovery
    /// holds no live packet: every replayed packet is pending upstream or here until processed,
    /// so entry order already puts a flow's replayed packets before its later live ones, and a
    /// live packet that entered before some replayed ones must go first, not wait for the
    /// replay to drain (it would wait for them while they wait for it).
    pub fn take_in_entry_order(&mut self) {
        self.entry_ordered = true;
    }

    /// The root replays `copies` towards this instance, with `roots` roots stamping clocks.
    pub fn cover<'p>(&mut self, copies: impl IntoIterator<Item = &'p Packet>, roots: usize) {
        self.roots = roots;
        for p in copies {
            let key = OrderKey::of(&p.meta, roots);
            self.least_covered = Some(self.least_covered.map_or(key, |l| l.min(key)));
            self.covered.insert(p.meta.clock);
        }
    }

    /// Whether the root's replay towards this instance carries `clock`.
    pub fn covers(&self, clock: Clock) -> bool {
        self.covered.contains(&clock)
    }

    /// `pkt` is taken from the queue of instance `id` of a vertex that has already processed
    /// the clocks in `decided`. `skip_done`: a replay copy aimed at this instance whose clock the
    /// vertex processed already is skipped, its effects being in the store — for a straggler's
    /// clone (the straggler flushed when the clone started) and for a replacement when the
    /// root knows the clock's updates are committed. Re-running the NF on such a packet would
    /// read state later packets have changed since (a connection closed and expired since, say)
    /// and could act on it again.
    pub fn dequeue(
        &mut self,
        pkt: &Packet,
        id: InstanceId,
        skip_done: bool,
        decided: &Decided,
        suppress: bool,
    ) -> Dequeue {
        let d = self.peek(pkt, id, skip_done, decided, suppress);
        // A replay copy passing through on its way to another instance is not this instance's
        // copy of the packet: the live copy may still come, and must not be taken for a
        // duplicate of it.
        if pkt.meta.replay_target().is_none_or(|t| t == id) {
            self.seen.insert(pkt.meta.clock);
        }
        d
    }

    /// `pkt` is taken from the queue: duplicate suppression ([`Gate::dequeue`]), then the
    /// rules for replay copies passing through on their way to another instance.
    pub fn take(&mut self, pkt: &Packet, cx: &TakeContext<'_>) -> Take {
        let d = self.dequeue(pkt, cx.id, cx.skip_done, cx.decided, cx.suppress);
        Self::pass_rules(d, pkt, cx)
    }

    /// What [`Gate::take`] would decide for `pkt`, without taking it.
    pub fn peek_take(&self, pkt: &Packet, cx: &TakeContext<'_>) -> Take {
        let d = self.peek(pkt, cx.id, cx.skip_done, cx.decided, cx.suppress);
        Self::pass_rules(d, pkt, cx)
    }

    fn pass_rules(d: Dequeue, pkt: &Packet, cx: &TakeContext<'_>) -> Take {
        match d {
            Dequeue::Suppress => Take::Suppress,
            Dequeue::Process { .. } if cx.suppress && passes_too_early(pkt, cx.id, cx.decided) => Take::WaitForClock,
            Dequeue::Process { .. } if cx.suppress && cx.emitted && passes_through(pkt, cx.id) => Take::PassThrough,
            Dequeue::Process { duplicate } => Take::Process { duplicate },
        }
    }

    /// What [`Gate::dequeue`] would decide for `pkt`, without taking it.
    pub fn peek(&self, pkt: &Packet, id: InstanceId, skip_done: bool, decided: &Decided, suppress: bool) -> Dequeue {
        let clock = pkt.meta.clock;
        let to_target = pkt.meta.replay_target().is_some();
        let first_here = !self.seen.contains(&clock);
        // Processed by another instance of the vertex already: its effects are in the store,
        // and processing it again would read later state.
        let elsewhere = decided.contains(clock);
        // A replay need not redo what the vertex did whose effects are in the store, and the
        // target of a replay drops a clock it processed already; upstream of it the copy passes.
        let at_target = pkt.meta.replay_target() == Some(id);
        if suppress
            && ((elsewhere && (!to_target || (at_target && skip_done))) || (!first_here && (!to_target || at_target)))
        {
            return Dequeue::Suppress;
        }
        Dequeue::Process { duplicate: !first_here && !to_target }
    }

    /// Whether live packets are held for a replay.
    pub fn recovering(&self) -> bool {
        self.recovering
    }

    /// The root reports whether its replay towards this instance has drained: if it has, and
    /// the instance is recovering and waits for no straggler, the recovery ends now and the
    /// driver queues what it returns.
    pub fn replay_drained(&mut self, drained: bool) -> Option<RecoveryEnd> {
        (drained && self.recovering && !self.waits_for_straggler).then(|| self.end_recovery())
    }

    /// Ends the recovery whatever the replay's state (a run that is over and still holds
    /// packets: queue them rather than lose them).
    pub fn end_recovery(&mut self) -> RecoveryEnd {
        self.recovering = false;
        self.covered.clear();
        self.least_covered = None;
        self.held_clocks.clear();
        RecoveryEnd {
            held: std::mem::take(&mut self.held),
            barriers: std::mem::take(&mut self.barriers_after_recovery),
        }
    }

    /// The barrier of move `id` away from this instance: `Some(id)` to put at the end of the
    /// queue now; `None` while the instance recovers, when the root's replay towards it may
    /// still bring packets of the moved flows (a replacement redoing what its predecessor
    /// lost): the barrier then comes with [`RecoveryEnd::barriers`].
    pub fn place_barrier(&mut self, id: MoveId) -> Option<MoveId> {
        if self.recovering {
            self.barriers_after_recovery.push(id);
            None
        } else {
            Some(id)
        }
    }

    /// This instance is a clone whose straggler holds packets the clone's replay does not
    /// carry (the root or the store lost their log entries): it serves nothing until
    /// [`Gate::straggler_passed`], or it would overtake them on their flows.
    pub fn wait_for_straggler(&mut self) {
        self.waits_for_straggler = true;
    }

    /// The straggler has processed what only it held (or is gone).
    pub fn straggler_passed(&mut self) {
        self.waits_for_straggler = false;
    }

    /// Whether this instance waits for its straggler (see [`Gate::wait_for_straggler`]).
    pub fn waits_for_straggler(&self) -> bool {
        self.waits_for_straggler
    }

    /// Flows `keys` are moving in: hold their packets.
    pub fn hold_flows(&mut self, keys: &[u64]) {
        for k in keys {
            self.move_held.entry(*k).or_default();
        }
    }

    /// The old instance passed the barrier: flow `key`'s held packets, in arrival order, the
    /// first marked `FIRST` (so the instance looks its state up).
    pub fn release_flow(&mut self, key: u64) -> Vec<Packet> {
        let mut held = self.move_held.remove(&key).unwrap_or_default();
        if let Some(p) = held.first_mut() {
            p.meta.flags.insert(MetaFlags::FIRST);
        }
        if !held.is_empty() {
            self.flows.insert(key);
        }
        held
    }

    /// Takes the packets held for a replay that `moved` selects (flows handed to another
    /// instance with their queued packets), in arrival order.
    pub fn take_held(&mut self, mut moved: impl FnMut(&Packet) -> bool) -> Vec<Packet> {
        let (out, keep): (Vec<Packet>, Vec<Packet>) =
            std::mem::take(&mut self.held).into_iter().partition(|p| moved(p));
        self.held_clocks = keep.iter().map(|p| p.meta.clock).collect();
        self.held = keep;
        out
    }

    /// The instance failed: every packet it held (its queue is the driver's).
    pub fn drain_held(&mut self) -> Vec<Packet> {
        self.held_clocks.clear();
        let mut lost = std::mem::take(&mut self.held);
        lost.extend(self.move_held.drain().flat_map(|(_, v)| v));
        lost
    }

    /// Whether a live copy of `clock` is held here until a replay drains.
    pub fn holds_for_replay(&self, clock: Clock) -> bool {
        self.held_clocks.contains(&clock)
    }

    /// Packets held, for a replay or a move.
    pub fn held(&self) -> usize {
        self.held.len() + self.move_held.values().map(Vec::len).sum::<usize>()
    }

    /// Whether any packet held here (for a replay or a move) satisfies `f`.
    pub fn held_any(&self, mut f: impl FnMut(&Packet) -> bool) -> bool {
        self.held.iter().chain(self.move_held.values().flatten()).any(&mut f)
    }

    /// The flows this instance has received.
    pub fn flows(&self) -> &HashSet<u64> {
        &self.flows
    }

    /// Takes over the flows a failed predecessor had received.
    pub fn inherit_flows(&mut self, flows: HashSet<u64>) {
        self.flows = flows;
    }

    /// Flows moved away.
    pub fn forget_flows(&mut self, keys: &[u64]) {
        for k in keys {
            self.flows.remove(k);
        }
    }

    /// Flows moved in without the move protocol.
    pub fn add_flows(&mut self, keys: &[u64]) {
        self.flows.extend(keys.iter().copied());
    }
}

/// Whether `pkt`, taken from the queue of instance `id`, is a replay copy on its way to another
/// instance. Once the vertex has processed its clock, such a copy leaves as that processing
/// left (the driver keeps what the NF emitted per clock while the root logs it): running the NF
/// again would act on state later packets have changed.
pub fn passes_through(pkt: &Packet, id: InstanceId) -> bool {
    pkt.meta.replay_target().is_some_and(|t| t != id)
}

/// Whether `pkt`, taken from the queue of instance `id` to be processed, is a replay copy passing
/// through on its way to another instance while the vertex has not processed its clock yet:
/// then the live copy (or the copy the replay towards this vertex's own instance carries) is
/// still to come, and the replay copy waits for it, to pass through as a duplicate whose updates
/// the store answers from its per-clock log. Processed first, it would apply the packet's updates
/// to this instance's local copies once, and the live copy a second time.
pub fn passes_too_early(pkt: &Packet, id: InstanceId, decided: &Decided) -> bool {
    pkt.meta.replay_target().is_some_and(|t| t != id) && !decided.contains(pkt.meta.clock)
}

/// The clocks a vertex has processed (at any of its instances): the first processing of a clock
/// decides (its drops and events are recorded); later ones are duplicates or replays.
#[derive(Debug, Clone, Default)]
pub struct Decided {
    clocks: HashSet<Clock>,
}

/// What the vertex makes of a processing of a clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Processing {
    /// Record the decisions of this processing.
    pub record: bool,
    /// A duplicate processing of a live packet (not a replay): its updates are counted.
    pub duplicate: bool,
}

impl Decided {
    /// Whether the vertex has processed `clock`.
    pub fn contains(&self, clock: Clock) -> bool {
        self.clocks.contains(&clock)
    }

    /// The vertex processes `clock` (a replay copy if `replayed`).
    pub fn process(&mut self, clock: Clock, replayed: bool, suppress: bool) -> Processing {
        let first = self.clocks.insert(clock);
        Processing { record: first || !suppress, duplicate: !first && !replayed }
    }
}

#[cfg(test)]
mod tests;
