//! Checks of what store-instance failover relies on: checkpoints (values, TS vectors, timers),
//! `restore`, `wipe`, and the TS vector returned by reads.

use super::raw::Raw;
use super::support::{
    changed, clk, ensure, fired_count, fresh_base, packet_time_base, skey, tag, timer_fired, ts_has, CUSTOM_OPS,
};
use crate::backend::Backend;
use crate::wire::{StoreKey, StoreOp};
use sluice_packet::{Clock, InstanceId};
use sluice_state::{StateKey, StateOp, Value};
use std::collections::VecDeque;

/// Checkpoint and restore round-trip: values written by two instances with tagged updates are
/// in the checkpoint; so is the TS vector (per instance, the clock of its last tagged update).
/// After changing, deleting and adding values, `restore` brings back exactly the checkpoint's
/// values, and a Get of a shared value returns a TS vector holding the checkpoint's clocks. The
/// per-clock log comes back too: an update replayed with its tag after the restore is answered
/// from it, not applied again.
/// Replaces the whole store: see [`EXCLUSIVE`](super::EXCLUSIVE).
pub fn checkpoint_restore(b: &dyn Backend) -> Result<(), String> {
    let v = 1012;
    let base = fresh_base();
    let k = |n: u64| skey(v, 0, StateKey::Id(base + n));
    let (i1, i2) = (InstanceId::new(v, 1), InstanceId::new(v, 2));
    let mut c1 = Raw::open(b, i1)?;
    let mut c2 = Raw::open(b, i2)?;
    c1.state(k(1), StateOp::Set(Value::Int(1)), tag(clk(base, 1), 0))?;
    c1.state(k(2), StateOp::Incr(5), tag(clk(base, 2), 0))?;
    c2.state(k(3), StateOp::Push(Value::Int(7)), tag(clk(base, 3), 0))?;
    c2.state(k(4), StateOp::Set(Value::Ints(vec![1, 2])), tag(clk(base, 4), 0))?;
    c1.state(k(1), StateOp::Set(Value::Int(2)), tag(clk(base, 5), 0))?;
    let want: Vec<(StoreKey, Option<Value>)> = vec![
        (k(1), Some(Value::Int(2))),
        (k(2), Some(Value::Int(5))),
        (k(3), Some(Value::List(VecDeque::from([Value::Int(7)])))),
        (k(4), Some(Value::Ints(vec![1, 2]))),
        (k(5), None),
    ];
    let cp = b.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
    for (key, val) in &want {
        let got = cp.values.iter().find(|(x, _)| x == key).map(|(_, v)| v.clone());
        ensure(got == *val, || format!("checkpoint holds {got:?} for {key:?}, want {val:?}"))?;
    }
    ensure(ts_has(&cp.ts, i1, clk(base, 5)) && ts_has(&cp.ts, i2, clk(base, 4)), || {
        let mine: Vec<_> = cp.ts.iter().filter(|(i, _)| *i == i1 || *i == i2).collect();
        format!("checkpoint TS should hold (i1, {}), (i2, {}); has {mine:?}", clk(base, 5), clk(base, 4))
    })?;
    c1.state(k(1), StateOp::Set(Value::Int(100)), tag(clk(base, 6), 0))?;
    c2.state(k(2), StateOp::Delete, tag(clk(base, 7), 0))?;
    c1.state(k(3), StateOp::Push(Value::Int(8)), None)?;
    c2.state(k(5), StateOp::Set(Value::Int(3)), None)?;
    b.restore(&cp).map_err(|e| format!("restore: {e}"))?;
    let mut r = Raw::open(b, InstanceId::new(v, 3))?;
    for (key, val) in &want {
        let got = r.get(*key)?;
        ensure(got == *val, || format!("after restore {key:?} holds {got:?}, want {val:?} (the checkpoint's)"))?;
    }
    ensure(cp.log.iter().any(|l| l.clock == clk(base, 2) && l.vertex == v), || {
        format!("the checkpoint's per-clock log lacks the update at {}", clk(base, 2))
    })?;
    let mut again = Raw::open(b, i1)?;
    again.state(k(2), StateOp::Incr(5), tag(clk(base, 2), 0))?;
    let got = r.get(k(2))?;
    ensure(got == Some(Value::Int(5)), || {
        format!("a replayed update of the checkpoint was applied again after restore: {got:?}, want Some(Int(5))")
    })?;
    let resp = r.call(k(1), StoreOp::State(StateOp::Get), None)?;
    let ts =
        resp.ts.clone().ok_or_else(|| format!("a Get of a shared value after restore returned no TS: {resp:?}"))?;
    ensure(ts_has(&ts, i1, clk(base, 5)) && ts_has(&ts, i2, clk(base, 4)), || {
        let mine: Vec<_> = ts.iter().filter(|(i, _)| *i == i1 || *i == i2).collect();
        format!(
            "TS after restore should be the checkpoint's (i1, {}), (i2, {}); has {mine:?}",
            clk(base, 5),
            clk(base, 4)
        )
    })
}

/// A Get of a shared value returns the TS vector: after tagged updates of the value by
/// instances 1 and 2 at clocks 5 and 9 (relative to the run's base), it holds (i1, 5) and
/// (i2, 9); an untagged update changes nothing, a later tagged one advances its instance.
pub fn ts_vector_on_reads(b: &dyn Backend) -> Result<(), String> {
    let v = 1013;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let (i1, i2) = (InstanceId::new(v, 1), InstanceId::new(v, 2));
    let mut c1 = Raw::open(b, i1)?;
    let mut c2 = Raw::open(b, i2)?;
    let mut r = Raw::open(b, InstanceId::new(v, 3))?;
    let read = |r: &mut Raw| -> Result<Vec<(InstanceId, Clock)>, String> {
        let resp = r.call(k, StoreOp::State(StateOp::Get), None)?;
        resp.ts
            .as_ref()
            .map(|t| t.to_vec())
            .ok_or_else(|| format!("a Get of a shared value returned no TS vector: {resp:?}"))
    };
    c1.state(k, StateOp::Incr(1), tag(clk(base, 5), 0))?;
    c2.state(k, StateOp::Incr(1), tag(clk(base, 9), 0))?;
    let ts = read(&mut r)?;
    ensure(ts_has(&ts, i1, clk(base, 5)) && ts_has(&ts, i2, clk(base, 9)), || {
        format!("TS should hold (i1, {}), (i2, {}); got {ts:?}", clk(base, 5), clk(base, 9))
    })?;
    c1.state(k, StateOp::Incr(1), None)?;
    let ts = read(&mut r)?;
    ensure(ts_has(&ts, i1, clk(base, 5)), || format!("an untagged update changed i1's TS entry: {ts:?}"))?;
    c1.state(k, StateOp::Incr(1), tag(clk(base, 12), 0))?;
    let ts = read(&mut r)?;
    ensure(ts_has(&ts, i1, clk(base, 12)) && ts_has(&ts, i2, clk(base, 9)), || {
        format!("after i1's update at {}, TS should hold it and (i2, {}): {ts:?}", clk(base, 12), clk(base, 9))
    })
}

/// A checkpoint lists every armed timer, sorted, with its deadline and the instance that would
/// be told (the owner of a claimed key, else the armer); cancelled timers are absent and a
/// re-armed one appears once, at its last deadline. `restore` re-arms exactly the checkpoint's
/// timers (a timer armed after the checkpoint is gone), and they fire to those instances.
/// Replaces the whole store: see [`EXCLUSIVE`](super::EXCLUSIVE).
pub fn checkpoint_timers(b: &dyn Backend) -> Result<(), String> {
    let v = 1018;
    let base = fresh_base();
    // Packet times about now in ns and unique per run, above any an earlier check used.
    let t0 = packet_time_base(base);
    let k = |n: u64| skey(v, 0, StateKey::Id(base + n));
    let (ia, ib) = (InstanceId::new(v, 0), InstanceId::new(v, 1));
    let mut a = Raw::open(b, ia)?;
    let mut bb = Raw::open(b, ib)?;
    a.ok(k(1), StoreOp::SetTimer { deadline_ns: t0 + 100 }, None)?;
    bb.state(k(2), StateOp::Set(Value::Int(5)), None)?;
    bb.ok(k(2), StoreOp::SetTimer { deadline_ns: t0 + 200 }, None)?;
    let claimed = a.ok(k(3), StoreOp::Claim, None)?;
    ensure(claimed == Some(Value::Int(1)), || format!("Claim: {claimed:?}"))?;
    bb.ok(k(3), StoreOp::SetTimer { deadline_ns: t0 + 300 }, None)?;
    a.ok(k(4), StoreOp::SetTimer { deadline_ns: t0 + 150 }, None)?;
    a.ok(k(4), StoreOp::CancelTimer, None)?;
    a.ok(k(5), StoreOp::SetTimer { deadline_ns: t0 + 50 }, None)?;
    a.ok(k(5), StoreOp::SetTimer { deadline_ns: t0 + 400 }, None)?;
    let want = vec![(k(1), t0 + 100, ia), (k(2), t0 + 200, ib), (k(3), t0 + 300, ia), (k(5), t0 + 400, ia)];
    let mine = |timers: &[(StoreKey, u64, InstanceId)]| -> Vec<(StoreKey, u64, InstanceId)> {
        timers.iter().filter(|t| t.0.vertex == v).copied().collect()
    };
    let cp = b.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
    ensure(cp.timers.windows(2).all(|w| w[0] <= w[1]), || format!("checkpoint timers not sorted: {:?}", cp.timers))?;
    ensure(mine(&cp.timers) == want, || format!("checkpoint timers {:?}, want {want:?}", mine(&cp.timers)))?;
    // What a replacement takes over: each instance's own timers, as the checkpoint has them.
    for who in [ia, ib] {
        let of = b.timers_of(who).map_err(|e| format!("timers_of: {e}"))?;
        let want_of: Vec<(StoreKey, u64)> = want.iter().filter(|t| t.2 == who).map(|t| (t.0, t.1)).collect();
        let got: Vec<(StoreKey, u64)> = of.into_iter().filter(|t| t.0.vertex == v).collect();
        ensure(got == want_of, || format!("timers_of({who:?}) {got:?}, want {want_of:?}"))?;
        // The same in one read, in parts, with the values of the vertex's object 0.
        let (tx, rx) = std::sync::mpsc::channel();
        let readers = b.takeover(who, Some(&[0]), &tx).map_err(|e| format!("takeover: {e}"))?;
        drop(tx);
        let (mut timers, mut values, mut ended, mut listed) = (Vec::new(), Vec::new(), 0, true);
        while ended < readers {
            match rx.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok(Some(part)) => {
                    timers.extend(part.timers.into_iter().filter(|t| t.0.vertex == v));
                    listed &= part.values.is_some();
                    values.extend(part.values.unwrap_or_default());
                }
                Ok(None) => ended += 1,
                Err(e) => return Err(format!("takeover({who:?}): {ended} of {readers} parts ended, then {e}")),
            }
        }
        timers.sort();
        ensure(timers == want_of, || format!("takeover({who:?}) timers {timers:?}, want {want_of:?}"))?;
        let want_values = b.values_of(v, &[0]).map_err(|e| format!("values_of: {e}"))?;
        values.sort_by_key(|(k, _)| *k);
        let got_values = listed.then_some(values);
        let want_values = want_values.map(|mut w| {
            w.sort_by_key(|(k, _)| *k);
            w
        });
        ensure(got_values == want_values, || {
            format!("takeover({who:?}) values {got_values:?}, values_of says {want_values:?}")
        })?;
    }
    let value = cp.values.iter().find(|(x, _)| *x == k(2)).map(|(_, v)| v.clone());
    ensure(value == Some(Value::Int(5)), || format!("checkpoint holds {value:?} for {:?}, want Int(5)", k(2)))?;

    // Change the timers, then restore: the checkpoint's come back, the later one is gone.
    a.ok(k(1), StoreOp::CancelTimer, None)?;
    a.ok(k(6), StoreOp::SetTimer { deadline_ns: t0 + 120 }, None)?;
    b.restore(&cp).map_err(|e| format!("restore: {e}"))?;
    let again = b.checkpoint().map_err(|e| format!("checkpoint after restore: {e}"))?;
    ensure(mine(&again.timers) == want, || {
        format!("after restore the store's timers are {:?}, want the checkpoint's {want:?}", mine(&again.timers))
    })?;
    a.advance(k(1), t0 + 1000)?;
    for key in [k(1), k(3), k(5)] {
        a.wait_note("TimerFired of a restored timer", |n| *n == timer_fired(key))?;
    }
    bb.wait_note("TimerFired of B's restored timer", |n| *n == timer_fired(k(2)))?;
    // The advance was acknowledged after every firing it caused was queued: anything else
    // would have arrived by now.
    a.poll_notes()?;
    bb.poll_notes()?;
    ensure(fired_count(&a, k(4)) + fired_count(&a, k(6)) == 0, || {
        format!("a cancelled timer or one armed after the checkpoint fired after restore: {:?}", a.notes)
    })?;
    ensure(fired_count(&bb, k(3)) == 0 && fired_count(&a, k(2)) == 0, || {
        format!("a restored timer went to the wrong instance: A {:?}, B {:?}", a.notes, bb.notes)
    })?;
    for key in [k(1), k(3), k(5)] {
        ensure(fired_count(&a, key) == 1, || format!("{key:?} fired {} times, want once", fired_count(&a, key)))?;
    }
    Ok(())
}

/// After `wipe` the store is a fresh, empty one: a new connection's batches are numbered from
/// 1; values are absent and a Get's TS vector is empty; a tag applied before is applied again
/// (the per-clock log is gone); a claimed key can be claimed by another instance; subscribers
/// are not called back; timers do not fire; the packet time starts again from 0 (a timer at a
/// small deadline fires). Custom operations work once registered again. Empties the whole
/// store: see [`EXCLUSIVE`](super::EXCLUSIVE).
pub fn wipe_empties_store(b: &dyn Backend) -> Result<(), String> {
    let v = 1019;
    let base = fresh_base();
    let t0 = packet_time_base(base);
    let k = |n: u64| skey(v, 0, StateKey::Id(base + n));
    let (ia, ib, ic) = (InstanceId::new(v, 0), InstanceId::new(v, 1), InstanceId::new(v, 2));
    let t1 = tag(clk(base, 1), 0);
    {
        let mut a = Raw::open(b, ia)?;
        let mut bb = Raw::open(b, ib)?;
        b.register_custom_ops(v, &CUSTOM_OPS).map_err(|e| format!("register_custom_ops: {e}"))?;
        a.state(k(1), StateOp::Set(Value::Int(5)), t1)?;
        let claimed = a.ok(k(2), StoreOp::Claim, None)?;
        ensure(claimed == Some(Value::Int(1)), || format!("Claim: {claimed:?}"))?;
        bb.ok(k(3), StoreOp::Subscribe, None)?;
        a.ok(k(4), StoreOp::SetTimer { deadline_ns: t0 + 100 }, None)?;
        a.advance(k(4), t0 + 50)?;
        a.state(k(7), StateOp::Set(Value::Ints(vec![3, 1])), None)?;
    }
    b.wipe().map_err(|e| format!("wipe: {e}"))?;
    b.register_custom_ops(v, &CUSTOM_OPS).map_err(|e| format!("register_custom_ops after wipe: {e}"))?;

    // New connections: numbered from 1 (Raw starts there), acknowledged.
    let mut a = Raw::open(b, ia)?;
    let mut bb = Raw::open(b, ib)?;
    let mut c = Raw::open(b, ic)?;
    let r = a.req(k(1), StoreOp::State(StateOp::Get), None, true);
    let id = r.id;
    let first = a.send(vec![r])?;
    ensure(first == 1, || format!("the first batch of a new connection is {first}, want 1"))?;
    a.wait_ack(first)?;
    let resp = a.response(id)?;
    ensure(resp.result == Ok(None), || format!("after wipe {:?} holds {:?}, want nothing", k(1), resp.result))?;
    let ts = resp.ts.ok_or_else(|| "a Get of a shared value after wipe returned no TS vector".to_string())?;
    ensure(ts.is_empty(), || format!("after wipe the TS vector should be empty, got {ts:?}"))?;
    for key in [k(2), k(3), k(4), k(7)] {
        let got = a.get(key)?;
        ensure(got.is_none(), || format!("after wipe {key:?} holds {got:?}"))?;
    }
    let r = a.call(k(1), StoreOp::State(StateOp::Set(Value::Int(7))), t1)?;
    ensure(!r.replayed && r.result.is_ok(), || format!("a tag applied before the wipe was treated as logged: {r:?}"))?;
    let got = a.get(k(1))?;
    ensure(got == Some(Value::Int(7)), || format!("after re-applying the tag {:?} holds {got:?}, want 7", k(1)))?;
    let claimed = c.ok(k(2), StoreOp::Claim, None)?;
    ensure(claimed == Some(Value::Int(1)), || format!("after wipe another instance's Claim got {claimed:?}, want 1"))?;

    // Subscribers are gone: B hears about k5 (subscribed after the wipe), not about k3.
    bb.ok(k(5), StoreOp::Subscribe, None)?;
    c.state(k(3), StateOp::Set(Value::Int(1)), None)?;
    c.state(k(5), StateOp::Set(Value::Int(1)), None)?;
    bb.wait_note("the callback for a subscription made after the wipe", |n| *n == changed(k(5), Some(Value::Int(1))))?;
    ensure(bb.notes_about(k(3)).is_empty(), || {
        format!("a subscription from before the wipe survived: {:?}", bb.notes)
    })?;

    // Packet time restarted: a timer at a small deadline fires once time passes it.
    a.ok(k(6), StoreOp::SetTimer { deadline_ns: 100 }, None)?;
    a.advance(k(6), 150)?;
    a.wait_note("TimerFired at a small deadline (packet time reset by the wipe)", |n| *n == timer_fired(k(6)))?;
    // The timer armed before the wipe is gone.
    a.advance(k(6), t0 + 200)?;
    a.poll_notes()?;
    ensure(fired_count(&a, k(4)) == 0, || format!("a timer armed before the wipe fired: {:?}", a.notes))?;

    // Custom operations, registered again, work.
    a.state(k(8), StateOp::Set(Value::Ints(vec![3, 1])), None)?;
    let r = a.state(k(8), StateOp::Custom { op: 0, arg: Value::Int(5) }, None)?;
    ensure(r == Some(Value::Int(1)), || format!("least_loaded_incr after wipe: {r:?}, want index 1"))?;
    Ok(())
}
