//! The timers of an order-sensitive vertex with several instances in a threaded run
//! (docs/correctness.md, "Per-flow timers of an order-sensitive vertex").
//!
//! The logical NF fires every due timer before the first packet, of any flow, past its
//! deadline, in deadline order, at most [`TIMERS_PER_PACKET`] before one packet. A per-flow
//! timer's handler reads the flow's values, which the instance serving the flow caches, and
//! may write values other flows share (the portscan detector counts a failed attempt against
//! its host). So all of the vertex's timers live in one table ([`VertexTimers`]); before a
//! packet, the instance about to process it looks at the timers due by then: when they are all
//! its own or on shared keys it fires them as it processes the packet; when one of them is a
//! flow another instance serves, the packet waits. Each instance, in turn, fires the timers at
//! the head of the table that are its own (or on shared keys) on the packet's behalf, tagged
//! with its clock, and waits for the store to have their updates; the packet carries the XOR
//! of what they updated, the instances report the commits. The vertex's instances process
//! packets in entry order, so there is one such packet at a time.

use super::worker::{report_commits, Slot};
use super::{Outgoing, Shared};
use crate::plan::split_key_of_state;
use sluice_nf::{TimerFilter, TIMERS_PER_PACKET};
use sluice_packet::{Clock, Meta, Packet};
use sluice_state::StateKey;
use sluice_store::{Answer, Ask, VertexTimers};

/// What the packet about to be processed does.
pub(super) enum Before {
    /// Goes on: every timer due before it that is not the instance's own has fired.
    Go,
    /// Waits: a timer due before it is another instance's to fire first.
    Wait,
}

/// The filter that says which of the table's per-flow timers `slot`'s instance fires: those
/// of the flows it serves at the clock of the packet they fire before — and, while a change
/// moving the flow has not settled, nobody's yet (its old instance's updates may still be on
/// their way to the store).
fn owner_filter(shared: &Shared, slot: &Slot) -> Option<TimerFilter> {
    let vp = shared.vertices.get(slot.vertex)?;
    let (v, me, split) = (slot.vertex, slot.global, vp.split.clone());
    let clocks = shared.clocks.clone();
    Some(match &shared.scaling {
        Some(sc) => {
            let alloc = sc.alloc.clone();
            Box::new(move |_, key: &StateKey, clock: Clock| {
                let Some(sk) = split_key_of_state(key, &split) else { return true };
                // A clock no longer in flight (the run's end) is after every change made.
                let entry = match clocks.entry(clock) {
                    0 => u64::MAX,
                    e => e,
                };
                let at = (clock, entry);
                alloc.current(v).is_some_and(|e| e.pick(sk, at) == Some(me) && !e.waits(sk, at))
            })
        }
        None => {
            let instances = vp.instances.clone();
            Box::new(move |_, key: &StateKey, _| {
                let Some(sk) = split_key_of_state(key, &split) else { return true };
                let n = instances.len().max(1) as u64;
                instances.get((sk % n) as usize) == Some(&me)
            })
        }
    })
}

/// Sets `slot`'s owner filter if its instance has none (a replacement starts without one).
pub(super) fn set_owner_filter(shared: &Shared, slot: &mut Slot) {
    if slot.flow_timers.is_some() {
        let filter = owner_filter(shared, slot);
        slot.inst.set_timer_filter(filter);
    }
}

fn table_and_filter(shared: &Shared, slot: &mut Slot) -> Option<VertexTimers> {
    let table = slot.flow_timers.clone()?;
    if !slot.inst.has_timer_filter() {
        set_owner_filter(shared, slot);
    }
    Some(table)
}

/// Before `slot`'s instance processes `pkt`: fires, on the packet's behalf, the timers due
/// that come first and are its own, and says whether the packet waits for another instance
/// to fire one of its flows'. When it goes on, it carries what the others' firings updated.
#[inline]
pub(super) fn before_packet(shared: &Shared, slot: &mut Slot, pkt: &mut Packet, out: &mut Outgoing) -> Before {
    // Most instances keep no such table: a test in line, the rest out of it.
    if slot.flow_timers.is_none() {
        return Before::Go;
    }
    before_packet_with_table(shared, slot, pkt, out)
}

/// [`before_packet`] at an instance whose vertex keeps its flows' timers in a table.
#[inline(never)]
fn before_packet_with_table(shared: &Shared, slot: &mut Slot, pkt: &mut Packet, out: &mut Outgoing) -> Before {
    let Some(table) = slot.flow_timers.as_ref() else { return Before::Go };
    let (now, clock) = (pkt.meta.ts_ns, pkt.meta.clock);
    if !table.may_be_due(now) && table.asked().is_none() {
        return Before::Go;
    }
    let Some(table) = table_and_filter(shared, slot) else { return Before::Go };
    loop {
        let ask = table.ask_about(&pkt.meta, TIMERS_PER_PACKET, slot.global);
        let due = slot.inst.due_timers(now, clock, ask.budget);
        if !due.foreign {
            break;
        }
        table.ask(ask);
        if !due.first_fireable {
            wake_siblings(shared, slot);
            return Before::Wait;
        }
        if fire_on_behalf(shared, slot, &table, &ask, out) == 0 {
            return Before::Wait;
        }
    }
    match table.answer(clock) {
        Answer::Firing => return Before::Wait,
        Answer::Answered(ask) => {
            pkt.meta.xor ^= ask.xor;
            slot.inst.limit_timers(ask.budget);
        }
        Answer::NotAsked => {}
    }
    Before::Go
}

/// At `slot`'s turn: if an instance of its vertex asked for the timers due before a packet
/// and the first of them is this instance's, fires those that are, on the packet's behalf.
/// Whether it fired any.
pub(super) fn fire_asked(shared: &Shared, slot: &mut Slot, out: &mut Outgoing) -> bool {
    let Some(ask) = slot.flow_timers.as_ref().and_then(|t| t.asked()) else { return false };
    if ask.asker == slot.global {
        return false;
    }
    let Some(table) = table_and_filter(shared, slot) else { return false };
    if !slot.inst.due_timers(ask.packet.ts_ns, ask.packet.clock, ask.budget).first_fireable {
        return false;
    }
    let fired = fire_on_behalf(shared, slot, &table, &ask, out);
    shared.wake.queued(ask.asker);
    fired > 0
}

/// Fires `slot`'s part of the timers due before the packet `ask` is about; how many fired.
fn fire_on_behalf(shared: &Shared, slot: &mut Slot, table: &VertexTimers, ask: &Ask, out: &mut Outgoing) -> usize {
    let clock = ask.packet.clock;
    if !table.begin_firing(clock) {
        return 0;
    }
    let done = slot.inst.fire_for(&ask.packet, ask.budget);
    // Fired, whatever the store said: the packet carries what they updated.
    table.fired_for(clock, done.fired, done.xor);
    report_commits(shared, slot, out);
    if let Err(e) = done.stored {
        let name = shared.vertices.get(slot.vertex).map_or("?", |v| &*v.name);
        let index = slot.inst.id().index();
        tracing::warn!(instance = %format_args!("{name}:{index}"), error = %e, "timers fired for a packet of another instance; their updates did not all reach the store");
    }
    done.fired
}

/// Wakes the worker of every instance of `slot`'s vertex (one of them serves the flow whose
/// timer is due).
fn wake_siblings(shared: &Shared, slot: &Slot) {
    let Some(vp) = shared.vertices.get(slot.vertex) else { return };
    for g in vp.instances.iter().chain(&vp.spares).filter(|g| **g != slot.global) {
        shared.wake.queued(*g);
    }
}

/// The end of a recorded run: the timers due by the last packet's time `now` fire, as before
/// one more packet of clock `clock` (at most [`TIMERS_PER_PACKET`] of a vertex's, each by the
/// instance whose turn it is), at the instances that run here and have not failed.
pub(super) fn fire_at_end(shared: &Shared, slots: &mut [(usize, Slot)], (now, clock): (u64, Clock)) {
    let mut vertices: Vec<usize> =
        slots.iter().filter(|(_, s)| s.flow_timers.is_some()).map(|(_, s)| s.vertex).collect();
    vertices.sort_unstable();
    vertices.dedup();
    for v in vertices {
        let mut budget = TIMERS_PER_PACKET;
        let mut fired_any = true;
        while fired_any && budget > 0 {
            fired_any = false;
            for (_, slot) in slots.iter_mut() {
                if slot.vertex != v || slot.handed_over || !slot.ran_here(shared) {
                    continue;
                }
                if table_and_filter(shared, slot).is_none() || !slot.inst.due_timers(now, clock, budget).first_fireable
                {
                    continue;
                }
                let end = Meta { clock, ts_ns: now, ..Meta::default() };
                let fired = slot.inst.fire_for(&end, budget).fired;
                budget = budget.saturating_sub(fired);
                fired_any |= fired > 0;
            }
        }
    }
}
