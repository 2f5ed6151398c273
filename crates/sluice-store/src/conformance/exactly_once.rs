//! Checks of the per-clock log: a tagged update is applied once however often it is sent,
//! `ForgetClock` ends that, a tagged read (a replayed packet's) reads as of its clock without
//! joining the log, and recorded non-deterministic values repeat for a packet's replays.

use super::raw::Raw;
use super::support::{clk, ensure, fresh_base, meta, open_client, skey, tag, ts_has};
use crate::backend::Backend;
use crate::client::{ClientConfig, Mode, StoreClient};
use crate::wire::{OpTag, Request, StoreOp};
use sluice_packet::{Clock, InstanceId, Meta, MetaFlags};
use sluice_state::{AccessPattern, LocalState, Scope, StateDecl, StateError, StateHandle, StateKey, StateOp, Value};
use std::sync::Arc;

/// A retransmitted tagged update is applied once: the same `Incr` and tag sent again (another
/// batch) is answered from the log with the first result and `replayed = true`; the same for a
/// retransmitted batch without `reply`; and from another instance of the same vertex (a clone
/// replaying the packet). The same tag at another vertex is a different update (tags are
/// per vertex), and a new tag applies normally.
pub fn retransmit_applied_once(b: &dyn Backend) -> Result<(), String> {
    let v = 1006;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let t = tag(clk(base, 1), 0);
    let r1 = a.call(k, StoreOp::State(StateOp::Incr(5)), t)?;
    ensure(r1.result == Ok(Some(Value::Int(5))) && !r1.replayed, || format!("first tagged Incr(5): {r1:?}"))?;
    let r2 = a.call(k, StoreOp::State(StateOp::Incr(5)), t)?;
    ensure(r2.result == Ok(Some(Value::Int(5))) && r2.replayed, || {
        format!("retransmitted Incr(5) should return the logged Int(5) with replayed=true, got {r2:?}")
    })?;
    let now = a.get(k)?;
    ensure(now == Some(Value::Int(5)), || format!("after a retransmitted Incr(5): {now:?}, want 5"))?;

    // Retransmission of a whole non-reply batch (the client's case).
    let t2 = tag(clk(base, 2), 0);
    let t3 = tag(clk(base, 2), 1);
    let batch: Arc<[Request]> = vec![
        a.req(k, StoreOp::State(StateOp::Incr(7)), t2, false),
        a.req(k, StoreOp::State(StateOp::Incr(100)), t3, false),
    ]
    .into();
    for _ in 0..3 {
        let bn = a.send_arc(batch.clone())?;
        a.wait_ack(bn)?;
    }
    let now = a.get(k)?;
    ensure(now == Some(Value::Int(112)), || format!("a batch of Incr(7), Incr(100) sent 3 times: {now:?}, want 112"))?;

    // IncrMany: each increment is applied once, whichever requests carry it.
    let m = skey(v, 1, StateKey::Id(base));
    let (u1, u2, u3) = (
        OpTag { clock: clk(base, 4), seq: 0 },
        OpTag { clock: clk(base, 4), seq: 1 },
        OpTag { clock: clk(base, 5), seq: 0 },
    );
    a.apply_nb(m, StoreOp::IncrMany(vec![(u1, 1), (u2, 2)]), None)?;
    a.apply_nb(m, StoreOp::IncrMany(vec![(u1, 1), (u2, 2)]), None)?;
    a.apply_nb(m, StoreOp::IncrMany(vec![(u2, 2), (u3, 4)]), None)?;
    let now = a.get(m)?;
    ensure(now == Some(Value::Int(7)), || {
        format!("IncrMany [u1+1,u2+2] twice then [u2+2,u3+4]: {now:?}, want 7 (each tag applied once)")
    })?;
    let r = a.call(m, StoreOp::State(StateOp::Incr(4)), Some(u3))?;
    ensure(r.replayed && a.get(m)? == Some(Value::Int(7)), || {
        format!("an Incr with a tag applied by IncrMany should be a replay: {r:?}")
    })?;

    // A clone (another instance of the vertex) replaying the same packet clock and seq.
    let mut clone = Raw::open(b, InstanceId::new(v, 1))?;
    let r3 = clone.call(k, StoreOp::State(StateOp::Incr(5)), t)?;
    ensure(r3.result == Ok(Some(Value::Int(5))) && r3.replayed, || {
        format!("a clone replaying the tag should get the logged Int(5), replayed=true: {r3:?}")
    })?;
    clone.apply_nb(k, StoreOp::State(StateOp::Incr(7)), t2)?;
    let now = clone.get(k)?;
    ensure(now == Some(Value::Int(112)), || format!("after a clone replayed two updates: {now:?}, want 112"))?;

    // The same tag at another vertex (the next NF processing the same packet) is applied.
    let other = skey(v + 100, 0, StateKey::Id(base));
    let mut o = Raw::open(b, InstanceId::new(v + 100, 0))?;
    let r4 = o.call(other, StoreOp::State(StateOp::Incr(5)), t)?;
    ensure(r4.result == Ok(Some(Value::Int(5))) && !r4.replayed, || {
        format!("the same clock/seq at another vertex must be applied, got {r4:?}")
    })?;
    // A new tag applies normally.
    let r5 = clone.call(k, StoreOp::State(StateOp::Incr(1)), tag(clk(base, 3), 0))?;
    ensure(r5.result == Ok(Some(Value::Int(113))) && !r5.replayed, || format!("new tag: {r5:?}"))?;

    // The log tells which clocks a vertex updated (what a failed node's instances did).
    let mine = b.clocks_updated_by(v).map_err(|e| e.to_string())?;
    let theirs = b.clocks_updated_by(v + 100).map_err(|e| e.to_string())?;
    ensure((1..=3).all(|i| mine.contains(&clk(base, i))), || format!("clocks updated by {v}: {mine:?}"))?;
    ensure(theirs.contains(&clk(base, 1)) && !theirs.contains(&clk(base, 2)), || {
        format!("clocks updated by {}: {theirs:?} (only clock 1)", v + 100)
    })
}

/// The contract of `ForgetClock(c)`: once `c` is above every clock logged before (the root is
/// done with all those packets), the store forgets their per-clock log, so a tag of such a clock
/// sent again is applied again; tags of later clocks are still recognised. Uses clocks of root
/// 255 (above every other root's): run it alone on a shared store, see [`EXCLUSIVE`](super::EXCLUSIVE).
pub fn forget_clock_reapplies(b: &dyn Backend) -> Result<(), String> {
    let v = 1007;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let old = tag(Clock::new(255, base + 1), 0);
    let young = tag(Clock::new(255, base + 10), 0);
    a.state(k, StateOp::Incr(1), old)?;
    a.state(k, StateOp::Incr(10), young)?;
    let r = a.call(k, StoreOp::State(StateOp::Incr(1)), old)?;
    ensure(r.replayed && r.result == Ok(Some(Value::Int(1))), || format!("before ForgetClock: {r:?}"))?;
    a.apply_nb(k, StoreOp::ForgetClock(Clock::new(255, base + 5)), None)?;
    let r = a.call(k, StoreOp::State(StateOp::Incr(1)), old)?;
    ensure(!r.replayed && r.result == Ok(Some(Value::Int(12))), || {
        format!("after ForgetClock(c ≥ its clock) a tag applies again (12, not replayed), got {r:?}")
    })?;
    let r = a.call(k, StoreOp::State(StateOp::Incr(10)), young)?;
    ensure(r.replayed && r.result == Ok(Some(Value::Int(11))), || {
        format!("ForgetClock(c) must keep the log of clocks > c: replaying the younger tag gave {r:?}")
    })?;
    let now = a.get(k)?;
    ensure(now == Some(Value::Int(12)), || format!("final value {now:?}, want 12"))
}

/// A tagged Get never answers with an update's logged result and is itself neither logged nor
/// counted in the TS vector: a later update with the same tag applies, and the reader's TS entry
/// stays at its last update.
pub fn tagged_reads_not_logged(b: &dyn Backend) -> Result<(), String> {
    let v = 1020;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let ia = InstanceId::new(v, 0);
    let mut a = Raw::open(b, ia)?;
    let mut r = Raw::open(b, InstanceId::new(v, 1))?;
    let (t1, t2, t3) = (tag(clk(base, 1), 0), tag(clk(base, 5), 0), tag(clk(base, 9), 0));
    a.state(k, StateOp::Incr(1), t1)?;
    let got = a.call(k, StoreOp::State(StateOp::Get), t2)?;
    ensure(!got.replayed && got.result == Ok(Some(Value::Int(1))), || format!("a tagged Get of a new tag: {got:?}"))?;
    let plain = r.call(k, StoreOp::State(StateOp::Get), None)?;
    let ts = plain.ts.ok_or_else(|| format!("a Get of a shared value returned no TS vector: {:?}", plain.result))?;
    ensure(ts_has(&ts, ia, clk(base, 1)), || {
        format!("a tagged Get moved the TS vector: want (a, {}), got {ts:?}", clk(base, 1))
    })?;
    let upd = a.call(k, StoreOp::State(StateOp::Incr(10)), t2)?;
    ensure(!upd.replayed && upd.result == Ok(Some(Value::Int(11))), || {
        format!("an update with the tag of an earlier Get must apply (11, not replayed): {upd:?}")
    })?;
    // A replayed packet's read: never an update's logged result; the value before the
    // packet's clock where the store keeps earlier values, else the value now.
    let again = a.call(k, StoreOp::State(StateOp::Get), t1)?;
    let want = if b.reads_as_of() { None } else { Some(Value::Int(11)) };
    ensure(!again.replayed && again.result == Ok(want.clone()), || {
        format!("a tagged Get of the clock of the first update must read {want:?}, not replayed: {again:?}")
    })?;
    let fresh = a.call(k, StoreOp::State(StateOp::Get), t3)?;
    ensure(!fresh.replayed && fresh.result == Ok(Some(Value::Int(11))), || {
        format!("a tagged Get of an unlogged tag must read the value (11): {fresh:?}")
    })?;
    let upd = a.call(k, StoreOp::State(StateOp::Incr(100)), t3)?;
    ensure(!upd.replayed && upd.result == Ok(Some(Value::Int(111))), || {
        format!("the Get's tag must not be logged: a later update with it gave {upd:?}")
    })
}

/// A packet processed again without changing state (emulated) asks for its first processing's
/// results: a `Logged` request with an update's tag gets what the update answered (a store
/// operation's result, and a client-applied update's, written as its outcome) as a replay,
/// and changes nothing; with a tag no update had, or none, it gets nothing, not as a replay.
pub fn logged_results_told(b: &dyn Backend) -> Result<(), String> {
    let v = 1033;
    let base = fresh_base();
    let (k, w) = (skey(v, 0, StateKey::Id(base)), skey(v, 0, StateKey::Id(base + 1)));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let (t1, t2, t3) = (tag(clk(base, 1), 0), tag(clk(base, 1), 1), tag(clk(base, 2), 0));
    a.state(k, StateOp::Incr(5), t1)?;
    let outcome = StoreOp::Write { value: Some(Value::Int(7)), result: Some(Value::Int(1024)) };
    a.ok(w, outcome, t2)?;
    for (key, t, want) in [(k, t1, Value::Int(5)), (w, t2, Value::Int(1024))] {
        let got = a.call(key, StoreOp::Logged, t)?;
        ensure(got.replayed && got.result == Ok(Some(want.clone())), || {
            format!("the logged result of {t:?} must be told, {want:?} as a replay: {got:?}")
        })?;
    }
    for (key, t) in [(k, t3), (w, t3), (k, None)] {
        let got = a.call(key, StoreOp::Logged, t)?;
        ensure(!got.replayed && got.result == Ok(None), || format!("no update logged under {t:?}: {got:?}"))?;
    }
    let values = (a.get(k)?, a.get(w)?);
    ensure(values == (Some(Value::Int(5)), Some(Value::Int(7))), || format!("Logged changed the values: {values:?}"))?;
    // Nor did it join the log: an update with a tag it asked about applies.
    let upd = a.call(k, StoreOp::State(StateOp::Incr(10)), t3)?;
    ensure(!upd.replayed && upd.result == Ok(Some(Value::Int(15))), || {
        format!("an update with a tag only asked about must apply (15, not replayed): {upd:?}")
    })
}

/// CHC's test case 11: a straggler and its clone (two instances of one vertex) drawing a
/// non-deterministic value for the same packet get the value drawn first; another packet, or
/// the next draw for the same packet, gets its own; a replay of the packet at a third instance
/// gets the first values again.
pub fn recorded_values_repeat(b: &dyn Backend) -> Result<(), String> {
    let v = 1021;
    let base = fresh_base();
    let decls = [StateDecl::new("x", Scope::global(), AccessPattern::ReadHeavy)];
    let cfg =
        ClientConfig { mode: Mode::Async, write_through: true, record_nondeterminism: true, ..Default::default() };
    let mk = |i: u16| open_client(b, InstanceId::new(v, i), &decls, &[], cfg.clone());
    let (mut straggler, mut clone, mut replacement) = (mk(0)?, mk(1)?, mk(2)?);
    // Draws `fresh` values (in order) while processing the packet of `m`; returns what the
    // store says.
    let draw = |c: &mut StoreClient, mut m: Meta, fresh: &[Value]| -> Result<Vec<Value>, String> {
        c.begin_batch();
        c.begin_packet(&m);
        let got: Result<Vec<Value>, StateError> = fresh.iter().map(|f| c.record(f.clone())).collect();
        c.end_packet(&mut m);
        c.end_batch();
        got.map_err(|e| e.to_string())
    };
    let packet = |n: u64| meta(clk(base, n));
    let replay_of_first = || {
        let mut m = meta(clk(base, 1));
        m.flags.insert(MetaFlags::REPLAYED);
        m
    };
    let wall = Value::Int(1_700_000_000_123_456_789);
    let first = draw(&mut straggler, packet(1), &[Value::Int(7), wall.clone()])?;
    ensure(first == vec![Value::Int(7), wall.clone()], || format!("first draws come back as drawn: {first:?}"))?;
    let twin = draw(&mut clone, packet(1), &[Value::Int(8), Value::Int(99)])?;
    ensure(twin == first, || format!("the clone's draws for the same packet: {twin:?}, want {first:?}"))?;
    let other = draw(&mut clone, packet(2), &[Value::Int(9)])?;
    ensure(other == vec![Value::Int(9)], || format!("another packet draws its own value: {other:?}"))?;
    // The same clock again, as a replay at a third instance.
    let again = draw(&mut replacement, replay_of_first(), &[Value::Int(10), Value::Int(11)])?;
    ensure(again == first, || format!("a replay draws the first values: {again:?}, want {first:?}"))?;
    // With recording off (the switch `sluice verify --off nondet` turns), a replay draws anew:
    // what the recording prevents.
    let unrecorded_cfg = ClientConfig { record_nondeterminism: false, ..cfg.clone() };
    let mut unrecorded = open_client(b, InstanceId::new(v, 3), &decls, &[], unrecorded_cfg)?;
    let fresh = draw(&mut unrecorded, replay_of_first(), &[Value::Int(12)])?;
    ensure(fresh == vec![Value::Int(12)], || format!("without recording the draw is fresh: {fresh:?}"))?;
    // The local backend never replays: every draw is fresh.
    let mut local = LocalState::new(&decls, &[]);
    let fresh = local.record(Value::Int(5)).map_err(|e| e.to_string())?;
    ensure(fresh == Value::Int(5), || format!("local state returns the draw: {fresh:?}"))?;
    Ok(())
}

/// A client that marks what it processed (`ClientConfig::mark_processed`, an instance a
/// replacement on another node may take over) leaves every packet that updated nothing in the
/// per-clock log, so `clocks_updated_by` lists it with those that did; the mark is applied once
/// however often the packet is processed, writes no value (the store's state is the NF's alone)
/// and goes with `ForgetClock` like an update. Without the switch such a packet leaves nothing.
pub fn packets_without_updates_are_marked_processed(b: &dyn Backend) -> Result<(), String> {
    let v = 1026;
    let base = fresh_base();
    let decls = [StateDecl::new("x", Scope::per_flow(), AccessPattern::ReadHeavy)];
    let x = sluice_state::ObjectId(0);
    let cfg = ClientConfig { mode: Mode::Async, write_through: true, mark_processed: true, ..Default::default() };
    let mut c = open_client(b, InstanceId::new(v, 0), &decls, &[], cfg.clone())?;
    // Packet 1 writes; packets 2 and 3 only read; packet 2 comes again (a replay).
    let process = |c: &mut StoreClient, n: u64, write: bool| -> Result<(), String> {
        let mut m = meta(clk(base, n));
        c.begin_batch();
        c.begin_packet(&m);
        let key = StateKey::Id(base);
        if write {
            c.set(x, &key, Value::Int(1)).map_err(|e| e.to_string())?;
        } else {
            c.get(x, &key).map_err(|e| e.to_string())?;
        }
        c.end_packet(&mut m);
        c.end_batch();
        c.flush().map_err(|e| e.to_string())
    };
    process(&mut c, 1, true)?;
    process(&mut c, 2, false)?;
    process(&mut c, 3, false)?;
    process(&mut c, 2, false)?;
    let listed = b.clocks_updated_by(v).map_err(|e| e.to_string())?;
    let want: Vec<Clock> = (1..=3).map(|n| clk(base, n)).collect();
    ensure(want.iter().all(|c| listed.contains(c)), || format!("clocks processed at {v}: {listed:?}, want {want:?}"))?;
    let marks = b
        .checkpoint()
        .map_err(|e| e.to_string())?
        .log
        .iter()
        .filter(|l| l.vertex == v && l.clock == clk(base, 2))
        .count();
    ensure(marks == 1, || format!("packet 2, processed twice, is marked once: {marks} log entries"))?;
    let values = b.checkpoint().map_err(|e| e.to_string())?.values;
    let stray: Vec<_> = values.iter().filter(|(k, _)| k.vertex == v && k.object == crate::PROCESSED_OBJECT).collect();
    ensure(stray.is_empty(), || format!("a mark writes no value: {stray:?}"))?;
    // Without the switch, a packet that only reads leaves nothing in the log.
    let plain = ClientConfig { mark_processed: false, ..cfg };
    let mut p = open_client(b, InstanceId::new(v + 1, 0), &decls, &[], plain)?;
    process(&mut p, 4, false)?;
    let listed = b.clocks_updated_by(v + 1).map_err(|e| e.to_string())?;
    ensure(listed.is_empty(), || format!("unmarked reads at {}: {listed:?}, want none", v + 1))
}

/// The updates timers make before a packet do not shift the packet's own tags: a replacement
/// processing the packet again may find other timers due (here none, where the first instance
/// fired one), and its own update must still be answered from its own log entry. With one
/// count for both, the replacement's increment took the tag of the first instance's timer
/// update and got that update's logged result.
pub fn timer_updates_leave_a_packets_tags(b: &dyn Backend) -> Result<(), String> {
    let v = 1023;
    let base = fresh_base();
    let decls = [
        StateDecl::new("conns", Scope::per_flow(), AccessPattern::ReadHeavy),
        StateDecl::new("active", Scope::global(), AccessPattern::ReadWriteOften),
    ];
    let (conns, active) = (sluice_state::ObjectId(0), sluice_state::ObjectId(1));
    let (flow, unit) = (StateKey::Id(base), StateKey::Id(base + 1));
    let cfg = ClientConfig { mode: Mode::Async, write_through: true, ..Default::default() };
    let mut first = open_client(b, InstanceId::new(v, 0), &decls, &[], cfg.clone())?;
    let mut replacement = open_client(b, InstanceId::new(v, 1), &decls, &[], cfg)?;
    let clock = clk(base, 1);
    // The first instance: a timer due before the packet removes a flow, then the packet counts.
    first.begin_batch();
    first.begin_packet(&meta(clock));
    first.timers(true);
    first.delete(conns, &flow).map_err(|e| e.to_string())?;
    first.timers(false);
    let counted = first.incr(active, &unit, 5).map_err(|e| e.to_string())?;
    let mut m = meta(clock);
    first.end_packet(&mut m);
    first.end_batch();
    first.flush().map_err(|e| e.to_string())?;
    ensure(counted == 5, || format!("the first count: {counted}, want 5"))?;
    // The replacement processes the packet again (a replay), no timer due.
    let mut replayed = meta(clock);
    replayed.flags.insert(MetaFlags::REPLAYED);
    replacement.begin_batch();
    replacement.begin_packet(&replayed);
    let again = replacement.incr(active, &unit, 5).map_err(|e| e.to_string())?;
    replacement.end_packet(&mut replayed);
    replacement.end_batch();
    replacement.flush().map_err(|e| e.to_string())?;
    ensure(again == 5, || format!("the replayed count is answered from its own log entry: {again}, want 5"))?;
    let mut reader = open_client(b, InstanceId::new(v, 2), &decls, &[], ClientConfig::default())?;
    let now = reader.get(active, &unit).map_err(|e| e.to_string())?;
    ensure(now == Some(Value::Int(5)), || format!("applied once: {now:?}, want 5"))?;
    Ok(())
}

/// Each timer's updates keep their own tags, whatever other timers fire at the clock: the
/// first instance fires the timer of flow 1 before the packet (which counts and removes the
/// flow); the replacement, processing the packet again, finds the timer of flow 2 due as well
/// and fires it first. Flow 2's count is new and must be applied; flow 1's was applied and
/// must be answered from the log. With one count for all timers, flow 2's increment took the
/// tag of flow 1's and got its answer: applied never.
pub fn timers_keep_their_own_tags(b: &dyn Backend) -> Result<(), String> {
    use sluice_state::TimerFired;
    let v = 1022;
    let base = fresh_base();
    let decls = [
        StateDecl::new("conns", Scope::per_flow(), AccessPattern::ReadHeavy),
        StateDecl::new("active", Scope::global(), AccessPattern::ReadWriteOften),
    ];
    let (conns, active) = (sluice_state::ObjectId(0), sluice_state::ObjectId(1));
    let (flow1, flow2, unit) = (StateKey::Id(base), StateKey::Id(base + 1), StateKey::Id(base + 2));
    let timer = |key| TimerFired { object: conns, key };
    let cfg = ClientConfig { mode: Mode::Async, write_through: true, ..Default::default() };
    let mut first = open_client(b, InstanceId::new(v, 0), &decls, &[], cfg.clone())?;
    let mut replacement = open_client(b, InstanceId::new(v, 1), &decls, &[], cfg)?;
    let clock = clk(base, 1);
    let expire = |c: &mut StoreClient, key: StateKey, by: i64| -> Result<i64, String> {
        c.timer_fires(&timer(key));
        let n = c.incr(active, &unit, by).map_err(|e| e.to_string())?;
        c.delete(conns, &key).map_err(|e| e.to_string())?;
        Ok(n)
    };
    first.begin_batch();
    first.begin_packet(&meta(clock));
    first.timers(true);
    let one = expire(&mut first, flow1, 1)?;
    first.timers(false);
    let mut m = meta(clock);
    first.end_packet(&mut m);
    first.end_batch();
    first.flush().map_err(|e| e.to_string())?;
    ensure(one == 1, || format!("flow 1's count: {one}, want 1"))?;
    let mut replayed = meta(clock);
    replayed.flags.insert(MetaFlags::REPLAYED);
    replacement.begin_batch();
    replacement.begin_packet(&replayed);
    replacement.timers(true);
    let two = expire(&mut replacement, flow2, 10)?;
    let one_again = expire(&mut replacement, flow1, 1)?;
    replacement.timers(false);
    replacement.end_packet(&mut replayed);
    replacement.end_batch();
    replacement.flush().map_err(|e| e.to_string())?;
    ensure(two == 11, || format!("flow 2's count is applied: {two}, want 11"))?;
    ensure(one_again == 1, || format!("flow 1's count is answered from its log entry: {one_again}, want 1"))?;
    let mut reader = open_client(b, InstanceId::new(v, 2), &decls, &[], ClientConfig::default())?;
    let now = reader.get(active, &unit).map_err(|e| e.to_string())?;
    ensure(now == Some(Value::Int(11)), || format!("each applied once: {now:?}, want 11"))?;
    Ok(())
}

/// A replayed packet's read (a tagged `Get`) where the store keeps earlier values
/// ([`Backend::reads_as_of`]): the value before the first logged update of the key at the
/// read's tag (clock, and the number of the packet's next update) or later, of the same root —
/// so a packet's own earlier updates count; the value now when no such update is logged, when
/// that update found a value too large to keep (a record of more than 8 integers), for a global
/// object's value (key `Unit`) and once `ForgetClock` forgot the updates; the same after the
/// store is restored from a checkpoint. Uses clocks of root 254 and restores the store: run it
/// alone on a shared store, see [`EXCLUSIVE`](super::EXCLUSIVE).
pub fn replayed_reads_as_of_their_clock(b: &dyn Backend) -> Result<(), String> {
    if !b.reads_as_of() {
        return Ok(());
    }
    let v = 1022;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let global = skey(v, 1, StateKey::Unit);
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let c = |n: u64| Clock::new(254, base + n);
    let ep = Value::Endpoint(std::net::IpAddr::from([10, 0, 0, 7]), 4242);
    let long = Value::Ints((0..9).collect());
    a.state(k, StateOp::Set(ep.clone()), tag(c(10), 0))?;
    a.state(k, StateOp::Set(Value::Int(5)), tag(c(30), 0))?;
    a.state(k, StateOp::Incr(2), tag(c(30), 1))?;
    a.state(k, StateOp::Delete, tag(c(50), 0))?;
    a.state(k, StateOp::Set(long), tag(c(70), 0))?;
    a.state(k, StateOp::Set(Value::Int(9)), tag(c(90), 0))?;
    a.state(global, StateOp::Set(Value::Int(1)), tag(c(10), 2))?;
    a.state(global, StateOp::Set(Value::Int(2)), tag(c(30), 2))?;
    let read = |a: &mut Raw, key, (clock, seq): (Clock, u32)| -> Result<Option<Value>, String> {
        let r = a.call(key, StoreOp::State(StateOp::Get), tag(clock, seq))?;
        ensure(!r.replayed, || format!("a tagged Get at {clock}/{seq} answered as a replay: {r:?}"))?;
        r.result.map_err(|e| format!("a tagged Get at {clock}/{seq}: {e}"))
    };
    let other_root = Clock::new(253, base + 20);
    let expect = [
        (k, (c(5), 0), None, "before every update"),
        (k, (c(10), 0), None, "at the first update's clock"),
        (k, (c(20), 0), Some(ep.clone()), "between the first and second packets"),
        (k, (c(30), 0), Some(ep), "at a packet with two updates: before its first"),
        (k, (c(30), 1), Some(Value::Int(5)), "at a packet with two updates: after its first"),
        (k, (c(30), 2), Some(Value::Int(7)), "at a packet with two updates: after both"),
        (k, (c(40), 0), Some(Value::Int(7)), "before the delete"),
        (k, (c(60), 0), None, "after the delete"),
        (k, (c(80), 0), Some(Value::Int(9)), "before an update that found a long record: now"),
        (k, (c(95), 0), Some(Value::Int(9)), "after every update: now"),
        (k, (other_root, 0), Some(Value::Int(9)), "another root's clock: now"),
        (global, (c(5), 0), Some(Value::Int(2)), "a global value: now"),
    ];
    for (key, (clock, seq), want, what) in &expect {
        let got = read(&mut a, *key, (*clock, *seq))?;
        ensure(got == *want, || format!("{what}: a tagged Get at {clock}/{seq} read {got:?}, want {want:?}"))?;
    }
    // A store restored from a checkpoint answers them alike (a store crash's rebuild).
    let cp = b.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
    b.restore(&cp).map_err(|e| format!("restore: {e}"))?;
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    for (key, (clock, seq), want, what) in &expect {
        let got = read(&mut a, *key, (*clock, *seq))?;
        ensure(got == *want, || {
            format!("after a restore, {what}: a tagged Get at {clock}/{seq} read {got:?}, want {want:?}")
        })?;
    }
    a.apply_nb(k, StoreOp::ForgetClock(c(50)), None)?;
    let got = read(&mut a, k, (c(20), 0))?;
    ensure(got.is_none(), || {
        format!(
            "after ForgetClock({}) the first kept update is the long record's set (it found nothing): read {got:?}",
            c(50)
        )
    })?;
    a.apply_nb(k, StoreOp::ForgetClock(c(90)), None)?;
    let got = read(&mut a, k, (c(20), 0))?;
    ensure(got == Some(Value::Int(9)), || format!("after every clock is forgotten a tagged Get reads now (9): {got:?}"))
}

/// A client whose batches may go together ([`ClientConfig::defer_batches`]) reports a packet's
/// commit only once the store has its updates, and sends what waits even when no batch follows:
/// asked for commits between batches (as a worker asks while idle), it reports every packet of
/// its last batches within [`TIMEOUT`](super::TIMEOUT).
pub fn deferred_batches_commit_once_sent(b: &dyn Backend) -> Result<(), String> {
    let v = 1036;
    let base = fresh_base();
    let decls = [StateDecl::new("x", Scope::per_flow(), AccessPattern::ReadHeavy)];
    let x = sluice_state::ObjectId(0);
    let key = StateKey::Id(base);
    let cfg = ClientConfig { mode: Mode::Async, write_through: true, defer_batches: true, ..Default::default() };
    let mut c = open_client(b, InstanceId::new(v, 0), &decls, &[], cfg)?;
    let mut reader = Raw::open(b, InstanceId::new(v, 1))?;
    // Three packets, a batch each, back to back: the later ones wait for the first's send.
    for n in 1..=3u64 {
        let mut m = meta(clk(base, n));
        c.begin_batch();
        c.begin_packet(&m);
        c.set(x, &key, Value::Int(n as i64)).map_err(|e| e.to_string())?;
        c.end_packet(&mut m);
        c.end_batch();
    }
    let want: Vec<Clock> = (1..=3).map(|n| clk(base, n)).collect();
    let start = std::time::Instant::now();
    let mut committed: Vec<Clock> = Vec::new();
    while committed.len() < want.len() {
        ensure(start.elapsed() < super::TIMEOUT, || format!("no batch followed: commits {committed:?} of 3"))?;
        let mut out = Vec::new();
        c.take_commits(&mut out);
        if out.is_empty() {
            std::thread::sleep(std::time::Duration::from_micros(100));
            continue;
        }
        committed.extend(out.iter().map(|(clock, _)| *clock));
        // Packet n wrote n: the newest packet committed so far has its write in the store.
        let newest = want.iter().rposition(|w| committed.contains(w)).map_or(0, |i| i as i64 + 1);
        let r = reader.call(skey(v, 0, key), StoreOp::State(StateOp::Get), None)?;
        let stored = r.result.clone().ok().flatten().and_then(|v| v.as_int()).unwrap_or(0);
        ensure(stored >= newest, || format!("packet {newest} committed while the store has {r:?}"))?;
    }
    committed.sort();
    ensure(committed == want, || format!("commits {committed:?}, want each of {want:?} once"))
}
