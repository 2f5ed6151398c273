//! An instance's part in scaling and moves: packets of a flow whose instance changed wait
//! until the change settles; when the root asks, the instance settles it (flushes, drops what
//! it gave up, hands timers over); once settled it takes over timers and waiting packets.

use super::super::alloc::entry_order;
use super::super::worker::{take_in, Slot};
use super::super::{Outgoing, Shared};
use super::Scaling;
use crate::plan::split_key_of_state;
use sluice_packet::{Clock, Packet};
use sluice_state::{ObjectId, StateKey};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

/// Per slot, with scaling possible: what waits for a change to settle, and what it has seen.
#[derive(Default)]
pub(in crate::exec) struct Moving {
    /// Packets of flows whose instance changed, waiting for the change to settle, with their
    /// flow keys.
    pub(in crate::exec) waiting: Vec<(u64, Packet)>,
    /// The flows with packets waiting, each with its earliest packet waiting (in entry order,
    /// [`entry_order`]): a later packet of one waits behind it, whatever this thread knows of
    /// the allocation by then (an earlier one does not: packets of a flow can arrive out of
    /// order, from several instances in front, and it was never the changed instance's to wait
    /// for).
    waiting_flows: HashMap<u64, (u64, Clock)>,
    /// The clocks of the packets waiting.
    waiting_clocks: HashSet<Clock>,
    /// The allocation version it last released waiting packets by.
    version_seen: u64,
    /// Flows it took packets of in the batch in progress (published once per batch).
    keys: Vec<u64>,
}

impl Moving {
    /// The waiting packets were taken away (lost with a crashed instance).
    pub(in crate::exec) fn forget_waiting(&mut self) {
        self.waiting_flows.clear();
        self.waiting_clocks.clear();
    }

    /// For a person: how many packets wait, of how many flows, from which clock.
    pub(in crate::exec) fn describe(&self) -> String {
        let first = self.waiting_clocks.iter().min().map_or("-".into(), |c| format!("{c:?}"));
        format!("{} packets of {} flows (first {first})", self.waiting.len(), self.waiting_flows.len())
    }

    /// Whether a packet of flow `key`, at `order` ([`entry_order`]), is behind one of its flow
    /// waiting here.
    fn behind(&self, key: u64, order: (u64, Clock)) -> bool {
        self.waiting_flows.get(&key).is_some_and(|first| *first < order)
    }

    fn wait(&mut self, key: u64, pkt: Packet, several_roots: bool) {
        let order = entry_order(&pkt.meta, several_roots);
        let first = self.waiting_flows.entry(key).or_insert(order);
        *first = (*first).min(order);
        self.waiting_clocks.insert(pkt.meta.clock);
        self.waiting.push((key, pkt));
    }
}

/// Whether the packet of `clock` waits at `slot` for a change to settle.
pub(in crate::exec) fn is_waiting(slot: &Slot, clock: Clock) -> bool {
    slot.moving.as_ref().is_some_and(|m| m.waiting_clocks.contains(&clock))
}

/// `pkt` back if `slot` processes it now (its flow is noted as received); otherwise it waits
/// for a change to settle, and the count of copies that ended here because of it.
///
/// A replay copy passing through towards a replacement further down, of a clock whose packet
/// waits here, ends: that packet never went past this instance, so the replacement did not
/// lose it and gets it when it goes. Waiting for it instead would tie the replacement's
/// recovery to the change settling, which waits for every earlier clock, some of them held by
/// that recovering replacement.
pub(in crate::exec) fn waits(
    shared: &Shared,
    slot: &mut Slot,
    out: &mut Outgoing,
    pkt: Packet,
) -> Result<Packet, usize> {
    let (Some(sc), Some(m), Some(vp)) = (&shared.scaling, slot.moving.as_mut(), shared.vertices.get(slot.vertex))
    else {
        return Ok(pkt);
    };
    let (waits, key) = out.alloc.waits(&sc.alloc, slot.vertex, vp, &pkt);
    let several = shared.roots > 1;
    if !waits && !m.behind(key, entry_order(&pkt.meta, several)) {
        m.keys.push(key);
        return Ok(pkt);
    }
    let clock = pkt.meta.clock;
    m.wait(key, pkt, several);
    Err(super::super::passing::end_awaiting(shared, slot, clock, out))
}

/// At the end of a batch: the flows `slot` received go where the root can see them.
pub(in crate::exec) fn publish_flows(shared: &Shared, slot: &mut Slot) {
    let (Some(sc), Some(m)) = (&shared.scaling, slot.moving.as_mut()) else { return };
    if m.keys.is_empty() {
        return;
    }
    if let Some(mut f) = sc.flows.get(slot.global).and_then(|f| f.lock().ok()) {
        f.extend(m.keys.drain(..));
    }
    m.keys.clear();
}

/// At the start of `slot`'s turn: settles a change if the root asked, takes timers handed to
/// it and releases what no longer waits once a change settled. Whether anything happened.
pub(in crate::exec) fn turn(shared: &Shared, slot: &mut Slot, out: &mut Outgoing) -> bool {
    let Some(sc) = &shared.scaling else { return false };
    let mut did = false;
    let asked = sc.asked.get(slot.global).map_or(0, |a| a.load(Ordering::Acquire));
    if asked > sc.done.get(slot.global).map_or(0, |d| d.load(Ordering::Relaxed)) {
        settle(shared, sc, slot, asked);
        if let Some(d) = sc.done.get(slot.global) {
            d.store(asked, Ordering::Release);
        }
        did = true;
    }
    did | take_settled(shared, slot, out)
}

/// Once the allocation changed (since `slot` last looked; a change settled, say): takes the
/// timers handed to it, then the packets that no longer wait, in clock order. Whether anything
/// happened.
pub(in crate::exec) fn take_settled(shared: &Shared, slot: &mut Slot, out: &mut Outgoing) -> bool {
    let Some(sc) = &shared.scaling else { return false };
    // The settling instances handed their timers over before the root published the change.
    let version = sc.alloc.version();
    match slot.moving.as_mut() {
        Some(m) if m.version_seen != version => m.version_seen = version,
        _ => return false,
    }
    set_timer_filter(shared, sc, slot);
    let alone = sc.alloc.current(slot.vertex).filter(|e| !e.changing()).is_some_and(|e| e.members().eq([slot.global]));
    if alone {
        // Scaled back in to this instance, settled: every other one flushed its updates and
        // has gone, so its shared objects are its own to cache again (the cache is empty:
        // they were not cached while shared).
        for o in cacheable_shared_objects(slot) {
            slot.inst.state().set_exclusive(o, true);
        }
        // Every value of the vertex is its own now: it takes them in one request and stops
        // reading each flow's on its next packet (an instance added by scaling, or a clone
        // that took its straggler's place, would otherwise pay a store round trip per flow
        // for the rest of the run).
        let client = crate::plan::store_client(&mut slot.inst);
        if client.is_some_and(|c| c.looks_up_missing()) {
            if let Err(e) = sc.rebuilder.load_flows(&mut slot.inst) {
                let name = shared.vertices.get(slot.vertex).map_or("?", |v| &*v.name);
                slot.errors.push(format!("{name}:{} loading its flows: {e}", slot.inst.id().index()));
            }
        }
    }
    let Some(m) = slot.moving.as_mut() else { return false };
    let timers = sc.timers.get(slot.global).and_then(|t| t.lock().ok()).map(|mut t| std::mem::take(&mut *t));
    let timers = timers.unwrap_or_default();
    if !timers.is_empty() {
        if let Some(c) = crate::plan::store_client(&mut slot.inst) {
            c.take_over_timers(&timers);
        }
    }
    let waiting = std::mem::take(&mut m.waiting);
    m.forget_waiting();
    if waiting.is_empty() {
        return !timers.is_empty();
    }
    let mut go = shared.empty_batch();
    let vp = shared.vertices.get(slot.vertex);
    let several = shared.roots > 1;
    for (key, p) in waiting {
        let Some(m) = slot.moving.as_mut() else { break };
        // In arrival order: behind a packet of its flow that still waits, it waits too.
        let still = m.behind(key, entry_order(&p.meta, several))
            || vp.is_some_and(|vp| out.alloc.waits(&sc.alloc, slot.vertex, vp, &p).0);
        if still {
            m.wait(key, p, several);
        } else {
            go.push(p);
        }
    }
    if go.is_empty() {
        shared.give_back(go);
        return true;
    }
    go.sort_by_key(|p| entry_order(&p.meta, several));
    take_in(shared, slot, go, out);
    true
}

/// While flows are moving away from `slot` (a change of its vertex not settled), its due
/// timers fire only for flows that are its own at the clock of the packet they fire before:
/// a moved flow's timer is the new instance's to fire from the move on, once handed over.
/// Otherwise every due timer fires.
fn set_timer_filter(shared: &Shared, sc: &Scaling, slot: &mut Slot) {
    if slot.flow_timers.is_some() {
        // Its timers are in the vertex's table, fired by the flows' instances in turn; the
        // filter reads the allocation as it is at each firing.
        super::super::flow_timers::set_owner_filter(shared, slot);
        return;
    }
    let epoch = sc.alloc.current(slot.vertex).filter(|e| e.changing());
    let split = shared.vertices.get(slot.vertex).map(|v| v.split.clone()).unwrap_or_default();
    let me = slot.global;
    // With several roots the cut is an entry time: the clock's, kept while it is in flight.
    let clocks = shared.clocks.clone();
    let filter = epoch.map(|epoch| -> sluice_nf::TimerFilter {
        Box::new(move |_, key: &StateKey, clock: Clock| {
            let entry = clocks.entry(clock);
            split_key_of_state(key, &split).is_none_or(|sk| epoch.pick(sk, (clock, entry)) == Some(me))
        })
    });
    slot.inst.set_timer_filter(filter);
}

/// `slot`'s part in settling change `change` of its vertex's allocation: its updates go to the
/// store, it drops its copies of the flows it no longer serves and hands their timers to the
/// instances that do.
fn settle(shared: &Shared, sc: &Scaling, slot: &mut Slot, change: u64) {
    let Some(current) = sc.alloc.current(slot.vertex) else { return };
    let Some(after) = current.made_by(change) else { return };
    let Some(vp) = shared.vertices.get(slot.vertex) else { return };
    let me = slot.global;
    let member = after.members().any(|m| m == me);
    let first = after.members().next();
    // A move's target and bystanders keep every flow they had: no need to look through
    // their state and timers for flows given up (the cost of a settle grows with the state
    // an instance holds, and the moved flows' packets wait meanwhile).
    let gives_nothing = member && after.givers.as_ref().is_some_and(|g| !g.contains(&me));
    let gives_up =
        |k: &StateKey| !member || split_key_of_state(k, &vp.split).is_some_and(|sk| after.owner(sk) != Some(me));
    if let Err(e) = slot.inst.state().flush() {
        slot.errors.push(format!("{}:{} flushing for a move: {e}", vp.name, slot.inst.id().index()));
    }
    if after.members().count() > 1 || !member {
        // Another instance uses the vertex's shared objects from now on: no caching them here
        // (an instance that gave every flow up may serve again — a clone that lost its trial
        // hands the flows back — and must not find its old copies then).
        for o in cacheable_shared_objects(slot) {
            slot.inst.state().set_exclusive(o, false);
        }
    }
    let client = crate::plan::store_client(&mut slot.inst);
    let timers = client.map(|c| {
        if gives_nothing {
            // Flows may have come here: their values are in the store, not absent.
            c.look_up_missing_values();
            return Vec::new();
        }
        // One pass drops the copies of every flow given up (those keyed by another flow than
        // the packet's too: the predicate names no flow this instance keeps); what remains is
        // its own, so all that is left is to stop taking a missing value to be absent (a
        // second pass over the caches that removed nothing took 0.5 ms of a 4,000-flow move).
        let t = c.hand_over(gives_up);
        c.look_up_missing_values();
        t
    });
    // Grouped by the instance that takes them, in the order given (each list locked once).
    let mut to_each: Vec<(usize, Vec<super::Timer>)> = Vec::new();
    let timers = timers.unwrap_or_default();
    let given = timers.len();
    // With one other member, every timer given up is its own: no flow to look up again.
    let mut others = after.members().filter(|m| *m != me);
    let only = match (others.next(), others.next()) {
        (Some(other), None) => Some(other),
        _ => None,
    };
    for (o, k, deadline) in timers {
        let owner = || split_key_of_state(&k, &vp.split).and_then(|sk| after.owner(sk)).or(first);
        let Some(to) = only.or_else(owner) else { continue };
        match to_each.iter_mut().find(|(g, _)| *g == to) {
            Some((_, list)) => list.push((o, k, deadline)),
            None => {
                // Most moves give everything to one instance: room for it all at once.
                let mut list = Vec::with_capacity(given - to_each.iter().map(|(_, l)| l.len()).sum::<usize>());
                list.push((o, k, deadline));
                to_each.push((to, list));
            }
        }
    }
    for (to, list) in to_each {
        if let Some(mut t) = sc.timers.get(to).and_then(|t| t.lock().ok()) {
            if t.is_empty() {
                // The usual case (the taker had adopted what it was given before): no copy.
                *t = list;
            } else {
                t.extend(list);
            }
        }
    }
    if gives_nothing {
        return;
    }
    if let Some(mut f) = sc.flows.get(me).and_then(|f| f.lock().ok()) {
        f.retain(|k| member && after.owner(*k) == Some(me));
    }
}

/// The objects shared across flows that `slot`'s instance caches while it is its vertex's
/// only instance.
fn cacheable_shared_objects(slot: &mut Slot) -> Vec<ObjectId> {
    sluice_state::cached_while_alone(slot.inst.nf().state_objects()).collect()
}
