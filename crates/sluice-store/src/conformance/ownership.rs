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
