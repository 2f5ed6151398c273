//! Checks of ownership: claims, owner-only updates and handovers.

use super::raw::Raw;
use super::support::{clk, ensure, fresh_base, skey, tag};
use crate::backend::Backend;
use crate::wire::{Notification, StoreOp};
use sluice_packet::InstanceId;
use sluice_state::{StateKey, StateOp, Value};

/// Ownership of a per-flow value hands over: A claims (1), claims again (1), B's claim gets 0;
/// only the owner may update (reads are open); a release by a non-owner changes nothing; A's
/// release hands the value to B (told by `Handover`), which may now update it and A may not.
pub fn ownership_handover(b: &dyn Backend) -> Result<(), String> {
    let v = 1010;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let mut bb = Raw::open(b, InstanceId::new(v, 1))?;
    let r = a.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(1)), || format!("A's Claim of an unowned value: {r:?}, want Int(1)"))?;
    let r = a.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(1)), || format!("the owner's second Claim: {r:?}, want Int(1)"))?;
    a.state(k, StateOp::Set(Value::Int(5)), tag(clk(base, 1), 0))?;
    let r = bb.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(0)), || format!("B's Claim of A's value: {r:?}, want Int(0)"))?;
    for op in [StateOp::Set(Value::Int(9)), StateOp::Incr(1), StateOp::Delete] {
        let r = bb.call(k, StoreOp::State(op.clone()), tag(clk(base, 2), 0))?;
        ensure(r.result.is_err(), || format!("B's {op:?} of a value A owns should fail, got {r:?}"))?;
    }
    let r = bb.get(k)?;
    ensure(r == Some(Value::Int(5)), || format!("B reads A's value: {r:?}, want 5 (reads are open)"))?;
    bb.ok(k, StoreOp::Release, None)?; // not the owner: no effect
    let r = bb.call(k, StoreOp::State(StateOp::Incr(1)), None)?;
    ensure(r.result.is_err(), || format!("a Release by a non-owner must not hand over: B's Incr gave {r:?}"))?;
    a.state(k, StateOp::Incr(1), tag(clk(base, 3), 0))?;
    a.ok(k, StoreOp::Release, None)?;
    bb.wait_note("Handover after A's Release", |n| *n == Notification::Handover { key: k })?;
    let r = bb.state(k, StateOp::Incr(1), tag(clk(base, 4), 0))?;
    ensure(r == Some(Value::Int(7)), || format!("B's Incr after the handover: {r:?}, want 7"))?;
    let r = a.call(k, StoreOp::State(StateOp::Incr(1)), tag(clk(base, 5), 0))?;
    ensure(r.result.is_err(), || format!("A's update after handing over should fail, got {r:?}"))?;
    let r = a.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(0)), || format!("A's Claim of B's value: {r:?}, want Int(0)"))?;
    bb.ok(k, StoreOp::Release, None)?;
    a.wait_note("Handover back to A", |n| *n == Notification::Handover { key: k })?;
    a.state(k, StateOp::Incr(1), tag(clk(base, 6), 0))?;
    a.ok(k, StoreOp::Release, None)?;
    let r = bb.state(k, StateOp::Incr(1), tag(clk(base, 7), 0))?;
    ensure(r == Some(Value::Int(9)), || format!("after the last Release the value is unowned: B's Incr gave {r:?}"))
}

/// The owner's write of an update it applied itself (`StoreOp::Write`, what a fault-tolerant
/// instance sends for a custom operation): the value is written exactly (a float and a list
/// included), the given result answered and logged under the tag, so that the same tag again
/// is answered from the log and changes nothing; another instance may not write a value the
/// first owns; a write of no value deletes it.
pub fn owner_writes_logged(b: &dyn Backend) -> Result<(), String> {
    let v = 1022;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let mut other = Raw::open(b, InstanceId::new(v, 1))?;
    let r = a.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(1)), || format!("A's Claim: {r:?}, want Int(1)"))?;
    let value = Value::List([Value::Float(0.1), Value::Int(-3), Value::Bytes(vec![0, 255])].into_iter().collect());
    let write = |value: Option<Value>, result: Option<Value>| StoreOp::Write { value, result };
    let t = tag(clk(base, 1), 0);
    let r = a.call(k, write(Some(value.clone()), Some(Value::Int(3))), t)?;
    ensure(r.result == Ok(Some(Value::Int(3))) && !r.replayed, || format!("the first write: {r:?}, want Int(3)"))?;
    let now = a.get(k)?;
    ensure(now.as_ref() == Some(&value), || format!("after the write: {now:?}, want {value:?}"))?;
    let r = a.call(k, write(Some(Value::Int(0)), Some(Value::Int(4))), t)?;
    ensure(r.result == Ok(Some(Value::Int(3))) && r.replayed, || {
        format!("the same tag again should be answered from the log (Int(3), replayed), got {r:?}")
    })?;
    let now = a.get(k)?;
    ensure(now.as_ref() == Some(&value), || format!("a repeated write changed the value: {now:?}"))?;
    let r = other.call(k, write(Some(Value::Int(9)), None), tag(clk(base, 2), 0))?;
    ensure(r.result.is_err(), || format!("another instance's write of A's value should fail, got {r:?}"))?;
    let r = a.call(k, write(None, Some(Value::Int(7))), tag(clk(base, 3), 0))?;
    ensure(r.result == Ok(Some(Value::Int(7))), || format!("a write of no value: {r:?}, want Int(7)"))?;
    let now = a.get(k)?;
    ensure(now.is_none(), || format!("a write of no value should delete it: {now:?}"))?;
    a.ok(k, StoreOp::Release, None)?;
    Ok(())
}

/// A failed instance's connection is fenced by its replacement (`Backend::fence`): a batch it
/// sends afterwards is refused (an error naming the fence) and none of it applied, on any of
/// the keys it spans; it cannot connect again in its epoch; the replacement's epoch writes, a
/// lower fence changes nothing, and a connection acting for the instance (no epoch) is not
/// fenced. Epochs and the instance's index come from the wall clock, so the fences of earlier
/// runs on a store never emptied are below this run's.
pub fn fenced_instances_refused(b: &dyn Backend) -> Result<(), String> {
    let v = 1034;
    let base = fresh_base();
    let id = InstanceId::new(v, ((base >> 16) & 0x3FF) as u16);
    let old_epoch = (((base >> 20) % (1 << 28)) * 8) as u32;
    let keys: Vec<_> = (0..8).map(|i| skey(v, 0, StateKey::Id(base + i))).collect();
    let mut old = Raw::open_at(b, id, old_epoch)?;
    for k in &keys {
        old.state(*k, StateOp::Set(Value::Int(1)), None)?;
    }
    b.fence(id, old_epoch + 1).map_err(|e| format!("fence: {e}"))?;
    let fenced = |what: &str, r: Result<(), String>| {
        ensure(r.as_ref().is_err_and(|e| e.contains("fenced")), || {
            format!("{what} of a fenced connection must fail naming the fence, got {r:?}")
        })
    };
    // A batch over every key, answered: refused whole.
    let batch: Vec<_> =
        keys.iter().map(|k| old.req(*k, StoreOp::State(StateOp::Set(Value::Int(2))), None, true)).collect();
    let last = batch.last().map_or(0, |r| r.id);
    let sent = old.send(batch).and_then(|_| old.response(last).and_then(|r| r.result.map(|_| ())));
    fenced("a batch", sent)?;
    let mut admin = Raw::open(b, id)?;
    for k in &keys {
        let now = admin.get(*k)?;
        ensure(now == Some(Value::Int(1)), || format!("a fenced batch was applied in part: {k:?} holds {now:?}"))?;
    }
    // Its epoch cannot connect again (refused at once, or at its first call).
    let again = Raw::open_at(b, id, old_epoch).and_then(|mut c| c.get(keys[0]).map(|_| ()));
    fenced("a new connection in the fenced epoch", again)?;
    // The replacement's epoch writes; a lower fence does not undo it.
    let mut new = Raw::open_at(b, id, old_epoch + 1)?;
    new.state(keys[0], StateOp::Set(Value::Int(3)), None)?;
    b.fence(id, old_epoch).map_err(|e| format!("a lower fence: {e}"))?;
    new.state(keys[1], StateOp::Set(Value::Int(3)), None)?;
    admin.state(keys[2], StateOp::Set(Value::Int(4)), None)?;
    let now: Vec<_> = keys[..3].iter().map(|k| new.get(*k)).collect::<Result<_, _>>()?;
    let want = [Some(Value::Int(3)), Some(Value::Int(3)), Some(Value::Int(4))];
    ensure(now == want, || format!("the replacement's and the unfenced writes: {now:?}, want {want:?}"))
}
