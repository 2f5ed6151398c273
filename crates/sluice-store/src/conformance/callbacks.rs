//! Checks of callbacks: subscribers hear of every new value, through raw connections and through
//! caching [`StoreClient`]s, and an instance that connects again is notified on its new
//! connection.

use super::raw::Raw;
use super::support::{changed, clk, ensure, fresh_base, meta, open_client, packet_time_base, skey, tag, timer_fired};
use super::TIMEOUT;
use crate::backend::Backend;
use crate::client::{ClientConfig, Mode, StoreClient};
use crate::wire::{Notification, StoreKey, StoreOp};
use sluice_packet::InstanceId;
use sluice_state::{AccessPattern, ObjectId, Scope, StateDecl, StateError, StateHandle, StateKey, StateOp, Value};
use std::time::{Duration, Instant};

/// Subscribers are called back with each new value (including deletion, and updates sent
/// without `reply`); the updater is not called back for its own update; after `Unsubscribe` no
/// callback comes until subscribing again (which returns the current value), also once every
/// subscriber has gone.
pub fn callbacks_raw(b: &dyn Backend) -> Result<(), String> {
    let v = 1008;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let mut bb = Raw::open(b, InstanceId::new(v, 1))?;
    let r = a.ok(k, StoreOp::Subscribe, None)?;
    ensure(r.is_none(), || format!("Subscribe to an absent value returned {r:?}"))?;
    bb.ok(k, StoreOp::Subscribe, None)?;
    bb.state(k, StateOp::Set(Value::Int(1)), None)?;
    a.wait_note("Changed(1) after B's Set", |n| *n == changed(k, Some(Value::Int(1))))?;
    a.state(k, StateOp::Set(Value::Int(2)), None)?;
    bb.wait_note("Changed(2) after A's Set", |n| *n == changed(k, Some(Value::Int(2))))?;
    let got = bb.notes_about(k);
    ensure(got == vec![changed(k, Some(Value::Int(2)))], || {
        format!("B must not be called back for its own update: B received {got:?}")
    })?;
    bb.state(k, StateOp::Incr(3), None)?;
    a.wait_note("Changed(5) after B's Incr", |n| *n == changed(k, Some(Value::Int(5))))?;
    let got = a.notes_about(k);
    ensure(got == vec![changed(k, Some(Value::Int(1))), changed(k, Some(Value::Int(5)))], || {
        format!("A should have received Changed(1), Changed(5) (not its own Set(2)): {got:?}")
    })?;
    bb.apply_nb(k, StoreOp::State(StateOp::Incr(1)), tag(clk(base, 1), 0))?;
    a.wait_note("Changed(6) after a non-reply Incr", |n| *n == changed(k, Some(Value::Int(6))))?;
    bb.state(k, StateOp::Delete, None)?;
    a.wait_note("Changed(None) after Delete", |n| *n == changed(k, None))?;
    a.ok(k, StoreOp::Unsubscribe, None)?;
    bb.state(k, StateOp::Set(Value::Int(7)), None)?;
    subscribe_again(&mut a, &mut bb, k, (7, 8), "A was unsubscribed during Set(7)")?;
    // The last subscriber gone and the value deleted, the entry holds nothing; a subscriber
    // that comes back is called back again.
    a.ok(k, StoreOp::Unsubscribe, None)?;
    a.state(k, StateOp::Set(Value::Int(85)), None)?;
    bb.wait_note("Changed(85) after A left and wrote", |n| *n == changed(k, Some(Value::Int(85))))?;
    bb.ok(k, StoreOp::Unsubscribe, None)?;
    bb.state(k, StateOp::Delete, None)?;
    bb.state(k, StateOp::Set(Value::Int(9)), None)?;
    subscribe_again(&mut a, &mut bb, k, (9, 10), "nobody was subscribed during Delete and Set(9)")
}

/// `a` subscribes to `k` again, which holds `now` (the answer it must get); `writer` then sets
/// `next`, and that is the only callback about `k` that `a` may get (`why`).
fn subscribe_again(
    a: &mut Raw,
    writer: &mut Raw,
    k: StoreKey,
    (now, next): (i64, i64),
    why: &str,
) -> Result<(), String> {
    a.notes.clear();
    let r = a.ok(k, StoreOp::Subscribe, None)?;
    ensure(r == Some(Value::Int(now)), || format!("Subscribe should return the current value {now}, got {r:?}"))?;
    writer.state(k, StateOp::Set(Value::Int(next)), None)?;
    a.wait_note(&format!("Changed({next}) after subscribing again"), |n| *n == changed(k, Some(Value::Int(next))))?;
    let got = a.notes_about(k);
    ensure(got == vec![changed(k, Some(Value::Int(next)))], || {
        format!("{why}: only Changed({next}) should arrive, got {got:?}")
    })
}

/// Through [`StoreClient`]s in Cached and Async mode, a read-heavy cross-flow object shared by
/// two instances (`set_exclusive(obj, false)`): A's reads are served from its cache, B's
/// updates (blocking, non-blocking, delete) reach A by callback, absorbed at `begin_batch`.
pub fn callbacks_client(b: &dyn Backend) -> Result<(), String> {
    let v = 1009;
    let decls = [StateDecl::new("map", Scope::global(), AccessPattern::ReadHeavy)];
    let obj = ObjectId(0);
    for (m, mode) in [Mode::Cached, Mode::Async].into_iter().enumerate() {
        let base = fresh_base();
        let k = StateKey::Id(base);
        let mk = |i: u16| -> Result<StoreClient, String> {
            open_client(b, InstanceId::new(v, i), &decls, &[], ClientConfig { mode, ..Default::default() })
        };
        let (mut a, mut bb) = (mk(2 * m as u16)?, mk(2 * m as u16 + 1)?);
        a.set_exclusive(obj, false);
        bb.set_exclusive(obj, false);
        let mut packet = 0u64;
        let mut step = |c: &mut StoreClient, f: &mut dyn FnMut(&mut StoreClient) -> Result<(), StateError>| {
            packet += 1;
            c.begin_batch();
            c.begin_packet(&meta(clk(base, packet)));
            let r = f(c);
            let mut m = meta(clk(base, packet));
            c.end_packet(&mut m);
            c.end_batch();
            r.and_then(|_| c.flush()).map_err(|e| format!("{mode:?}: {e}"))
        };
        step(&mut bb, &mut |c| c.set(obj, &k, Value::Int(10)))?;
        let mut first = None;
        step(&mut a, &mut |c| {
            first = c.get(obj, &k)?;
            Ok(())
        })?;
        ensure(first == Some(Value::Int(10)), || format!("{mode:?}: A's first read {first:?}, want 10"))?;
        let trips = a.stats().round_trips;
        let hits = a.stats().cache_hits;
        let again = a.get(obj, &k).map_err(|e| format!("{e}"))?;
        ensure(
            again == Some(Value::Int(10)) && a.stats().cache_hits == hits + 1 && a.stats().round_trips == trips,
            || format!("{mode:?}: A's second read should be a cache hit of 10: {again:?}, {:?}", a.stats()),
        )?;
        let updates: [(&str, Option<Value>); 3] =
            [("set", Some(Value::Int(11))), ("incr_nb", Some(Value::Int(16))), ("delete", None)];
        for (what, want) in updates {
            step(&mut bb, &mut |c| match what {
                "set" => c.set(obj, &k, Value::Int(11)),
                "incr_nb" => c.incr_nb(obj, &k, 5),
                _ => c.delete(obj, &k).map(|_| ()),
            })?;
            let deadline = Instant::now() + TIMEOUT;
            loop {
                a.begin_batch();
                let got = a.get(obj, &k).map_err(|e| format!("{mode:?}: {e}"))?;
                a.end_batch();
                if got == want {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "{mode:?}: after B's {what}, A still reads {got:?} (want {want:?}) after {TIMEOUT:?}; {:?}",
                        a.stats()
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let s = a.stats();
        ensure(s.callbacks >= 3 && s.round_trips == trips, || {
            format!("{mode:?}: A should have been kept fresh by 3 callbacks without new round trips: {s:?}")
        })?;
    }
    Ok(())
}

/// An instance that connects again (a restarted or replacement instance with the same id) is
/// notified on its new connection: callbacks, handovers and timers.
pub fn reconnected_instance_notified(b: &dyn Backend) -> Result<(), String> {
    let v = 1017;
    let base = fresh_base();
    let t0 = packet_time_base(base);
    let (k, owned, timed) =
        (skey(v, 0, StateKey::Id(base)), skey(v, 0, StateKey::Id(base + 1)), skey(v, 0, StateKey::Id(base + 2)));
    let mut bb = Raw::open(b, InstanceId::new(v, 1))?;
    {
        let mut old = Raw::open(b, InstanceId::new(v, 0))?;
        old.ok(k, StoreOp::Subscribe, None)?;
        bb.state(k, StateOp::Set(Value::Int(1)), None)?;
        old.wait_note("Changed(1) on the first connection", |n| *n == changed(k, Some(Value::Int(1))))?;
    }
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    a.ok(k, StoreOp::Subscribe, None)?;
    bb.state(k, StateOp::Set(Value::Int(2)), None)?;
    a.wait_note("Changed(2) on the new connection", |n| *n == changed(k, Some(Value::Int(2))))?;
    bb.ok(owned, StoreOp::Claim, None)?;
    a.ok(owned, StoreOp::Claim, None)?;
    bb.ok(owned, StoreOp::Release, None)?;
    a.wait_note("Handover on the new connection", |n| *n == Notification::Handover { key: owned })?;
    a.ok(timed, StoreOp::SetTimer { deadline_ns: t0 + 10 }, None)?;
    a.advance(timed, t0 + 20)?;
    a.wait_note("TimerFired on the new connection", |n| *n == timer_fired(timed))
}
