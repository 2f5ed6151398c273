//! Checks of timers: each fires once, at its (last) deadline, to the owner or the armer.

use super::raw::Raw;
use super::support::{
    changed, ensure, fired_count, fresh_base, note_key, open_client, packet_time_base, skey, timer_fired,
};
use crate::backend::Backend;
use crate::client::{ClientConfig, StoreClient};
use crate::wire::{Notification, StoreKey, StoreOp};
use sluice_packet::InstanceId;
use sluice_state::{AccessPattern, ObjectId, Scope, StateDecl, StateHandle, StateKey, StateOp, Value};

/// A timer fires once, to the instance that armed it (to the owner if the key is claimed): not
/// before its deadline, once past it, not again; a re-armed timer fires at its new deadline
/// only; a cancelled timer never fires. Packet times are far above any the store has seen (and
/// unique per run), so the check works on a store that keeps its time.
pub fn timers_fire_once(b: &dyn Backend) -> Result<(), String> {
    let v = 1011;
    let base = fresh_base();
    let t0 = packet_time_base(base);
    let (k1, k2, k3) =
        (skey(v, 0, StateKey::Id(base)), skey(v, 0, StateKey::Id(base + 1)), skey(v, 0, StateKey::Id(base + 2)));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let mut bb = Raw::open(b, InstanceId::new(v, 1))?;
    let fired = |k: StoreKey| move |n: &Notification| *n == timer_fired(k);
    // "Nothing more was delivered" is checked after a sentinel: a value change on the same key
    // that the watcher is called back for; anything the timer sent earlier arrived before it.
    let mut sentinel = 0i64;
    let mut sync = |watcher: &mut Raw, writer: &mut Raw, k: StoreKey| -> Result<(), String> {
        sentinel += 1;
        writer.state(k, StateOp::Set(Value::Int(sentinel)), None)?;
        let want = changed(k, Some(Value::Int(sentinel)));
        watcher.wait_note("the sentinel callback", |n| *n == want)
    };
    for k in [k1, k2, k3] {
        a.ok(k, StoreOp::Subscribe, None)?;
    }
    bb.ok(k3, StoreOp::Subscribe, None)?;

    // Not before the deadline; once past it; not again.
    a.ok(k1, StoreOp::SetTimer { deadline_ns: t0 + 100 }, None)?;
    a.advance(k1, t0 + 50)?;
    sync(&mut a, &mut bb, k1)?;
    ensure(fired_count(&a, k1) == 0, || format!("a timer fired before its deadline: {:?}", a.notes_about(k1)))?;
    a.advance(k1, t0 + 150)?;
    a.wait_note("TimerFired(k1) past its deadline", fired(k1))?;
    a.advance(k1, t0 + 300)?;
    sync(&mut a, &mut bb, k1)?;
    ensure(fired_count(&a, k1) == 1, || format!("a timer fired more than once: {:?}", a.notes_about(k1)))?;
    // Re-armed twice: fires at the last deadline only.
    a.ok(k1, StoreOp::SetTimer { deadline_ns: t0 + 500 }, None)?;
    a.ok(k1, StoreOp::SetTimer { deadline_ns: t0 + 700 }, None)?;
    a.advance(k1, t0 + 600)?;
    sync(&mut a, &mut bb, k1)?;
    ensure(fired_count(&a, k1) == 1, || {
        format!("a re-armed timer fired at its old deadline: {:?}", a.notes_about(k1))
    })?;
    a.advance(k1, t0 + 800)?;
    a.wait_until("a second TimerFired(k1) at the re-armed deadline", |notes| {
        notes.iter().filter(|n| **n == timer_fired(k1)).count() >= 2
    })?;
    sync(&mut a, &mut bb, k1)?;
    ensure(fired_count(&a, k1) == 2, || format!("the re-armed timer fired more than once: {:?}", a.notes_about(k1)))?;
    // Re-armed earlier: fires at the earlier deadline, not again at the first one. Re-armed
    // later with both deadlines passed in one step: fires once.
    let rearmed =
        [(900, 850, 870, 950, "re-armed earlier"), (960, 980, 990, 995, "re-armed later, both passed at once")];
    for (n, (first, then, past, later, what)) in rearmed.into_iter().enumerate() {
        let want = 3 + n;
        a.ok(k1, StoreOp::SetTimer { deadline_ns: t0 + first }, None)?;
        a.ok(k1, StoreOp::SetTimer { deadline_ns: t0 + then }, None)?;
        a.advance(k1, t0 + past)?;
        a.wait_until(&format!("TimerFired(k1), {what}"), |notes| {
            notes.iter().filter(|n| **n == timer_fired(k1)).count() >= want
        })?;
        a.advance(k1, t0 + later)?;
        sync(&mut a, &mut bb, k1)?;
        ensure(fired_count(&a, k1) == want, || {
            format!("a timer {what} fired {} times: {:?}", fired_count(&a, k1) + 1 - want, a.notes_about(k1))
        })?;
    }

    // Cancelled: never fires.
    a.ok(k2, StoreOp::SetTimer { deadline_ns: t0 + 1000 }, None)?;
    a.ok(k2, StoreOp::CancelTimer, None)?;
    a.advance(k2, t0 + 1100)?;
    sync(&mut a, &mut bb, k2)?;
    ensure(fired_count(&a, k2) == 0, || format!("a cancelled timer fired: {:?}", a.notes_about(k2)))?;

    // The owner of a claimed key is told, not the instance that armed the timer.
    let r = a.ok(k3, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(1)), || format!("Claim: {r:?}"))?;
    bb.ok(k3, StoreOp::SetTimer { deadline_ns: t0 + 1500 }, None)?;
    a.advance(k3, t0 + 1600)?;
    a.wait_note("TimerFired(k3) at the owner", fired(k3))?;
    sync(&mut bb, &mut a, k3)?;
    ensure(fired_count(&bb, k3) == 0, || {
        format!("the armer was told of a timer on a key it does not own: {:?}", bb.notes)
    })?;
    a.ok(k3, StoreOp::Release, None)?;
    bb.ok(k3, StoreOp::SetTimer { deadline_ns: t0 + 1700 }, None)?;
    a.advance(k3, t0 + 1800)?;
    bb.wait_note("TimerFired(k3) at the armer once the key is unowned", fired(k3))?;
    sync(&mut a, &mut bb, k3)?;
    ensure(fired_count(&a, k3) == 1, || format!("the former owner was told of B's timer: {:?}", a.notes_about(k3)))?;
    let stray: Vec<_> = bb.notes.iter().filter(|n| note_key(n) != k3).collect();
    ensure(stray.is_empty(), || format!("B received notifications for A's timers: {stray:?}"))
}

/// Two instances armed a timer on one shared key, the second re-arming it: when the first
/// one's copy fires, `ExpireTimer` with its deadline expires nothing (`Int(0)`); the second's
/// expires it once (`Int(1)`, then `Int(0)`), and it is gone from checkpoints. A timer that
/// fired stays in checkpoints until its owner expires or cancels it.
pub fn only_the_current_timer_expires(b: &dyn Backend) -> Result<(), String> {
    let v = 1013;
    let base = fresh_base();
    let t0 = packet_time_base(base);
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let mut c = Raw::open(b, InstanceId::new(v, 1))?;
    a.ok(k, StoreOp::SetTimer { deadline_ns: t0 + 100 }, None)?;
    c.ok(k, StoreOp::SetTimer { deadline_ns: t0 + 200 }, None)?;
    c.advance(k, t0 + 300)?;
    let armed = |b: &dyn Backend| -> Result<bool, String> {
        Ok(b.checkpoint().map_err(|e| e.to_string())?.timers.iter().any(|(key, _, _)| *key == k))
    };
    ensure(armed(b)?, || "a timer that fired left checkpoints before its owner expired it".into())?;
    let stale = a.ok(k, StoreOp::ExpireTimer { deadline_ns: t0 + 100 }, None)?;
    ensure(stale == Some(Value::Int(0)), || format!("a stale copy expired the timer: {stale:?}"))?;
    let current = c.ok(k, StoreOp::ExpireTimer { deadline_ns: t0 + 200 }, None)?;
    ensure(current == Some(Value::Int(1)), || format!("the current copy did not expire it: {current:?}"))?;
    let again = c.ok(k, StoreOp::ExpireTimer { deadline_ns: t0 + 200 }, None)?;
    ensure(again == Some(Value::Int(0)), || format!("a timer expired twice: {again:?}"))?;
    ensure(!armed(b)?, || "an expired timer is still in checkpoints".into())
}

/// A straggler and its clone (two clients tracking for their twin) serve the same flows:
/// a timer one arms fires at the other once mirrored, and one the first fired or cancelled does
/// not fire at the other. (A clone that never learnt of its twin's timers skipped an expiry the
/// reference made, and the per-clock log then paired the replay's operations wrongly.)
pub fn twins_share_timers(b: &dyn Backend) -> Result<(), String> {
    let v = 1031;
    let base = fresh_base();
    let t0 = packet_time_base(base);
    let decls = [StateDecl::new("conns", Scope::per_flow(), AccessPattern::ReadHeavy)];
    let obj = ObjectId(0);
    let (k1, k2) = (StateKey::Id(base), StateKey::Id(base + 1));
    let mut straggler = open_client(b, InstanceId::new(v, 0), &decls, &[], ClientConfig::default())?;
    let mut clone = open_client(b, InstanceId::new(v, 1), &decls, &[], ClientConfig::default())?;
    straggler.track_written(true);
    clone.track_written(true);
    let fire = |c: &mut StoreClient, at: u64| -> Vec<StateKey> {
        c.begin_batch();
        let mut out = Vec::new();
        c.expired(at, 16, &mut out);
        c.end_batch();
        out.into_iter().map(|f| f.key).collect()
    };
    straggler.begin_batch();
    straggler.set_timer(obj, &k1, t0 + 100);
    straggler.set_timer(obj, &k2, t0 + 200);
    straggler.end_batch();
    let armed = straggler.take_timer_changes();
    ensure(armed.len() == 2, || format!("two timers armed, {} changes to mirror: {armed:?}", armed.len()))?;
    clone.mirror_timers(&armed);
    ensure(straggler.take_timer_changes().is_empty(), || "changes handed over twice".into())?;
    // The straggler cancels k2; the clone fires k1 at its deadline.
    straggler.begin_batch();
    straggler.cancel_timer(obj, &k2);
    straggler.end_batch();
    clone.mirror_timers(&straggler.take_timer_changes());
    let fired = fire(&mut clone, t0 + 300);
    ensure(fired == vec![k1], || format!("the clone fired {fired:?}, not the mirrored k1 alone"))?;
    // Which the straggler then must not fire again.
    straggler.mirror_timers(&clone.take_timer_changes());
    let fired = fire(&mut straggler, t0 + 400);
    ensure(fired.is_empty(), || format!("the straggler fired {fired:?} its twin had fired"))?;
    // Without tracking nothing is collected.
    straggler.track_written(false);
    straggler.begin_batch();
    straggler.set_timer(obj, &k1, t0 + 500);
    straggler.end_batch();
    let left = straggler.take_timer_changes();
    ensure(left.is_empty(), || format!("changes collected while not tracking: {left:?}"))
}

/// A write-through client (a fault-tolerant run) arms a timer on a key shared with other
/// instances and the timer is due before the batch ends: it fires, once. The store is told of
/// armed timers once per batch, and expiring a shared key asks the store whether this copy is
/// still the current one, so the arming must reach the store first. (A trace with a gap longer
/// than a timeout inside one batch lost the expiry: a scaled portscan detector kept its
/// `first_contacts` entries forever.)
pub fn a_shared_timer_due_in_its_batch_fires(b: &dyn Backend) -> Result<(), String> {
    let v = 1032;
    let base = fresh_base();
    let t0 = packet_time_base(base);
    let decls = [StateDecl::new("contacts", Scope::global(), AccessPattern::ReadHeavy)];
    let obj = ObjectId(0);
    let k = StateKey::Id(base);
    let cfg = ClientConfig { write_through: true, ..ClientConfig::default() };
    let mut c = open_client(b, InstanceId::new(v, 0), &decls, &[], cfg)?;
    // Another instance of the vertex uses the object: its keys are shared.
    c.set_exclusive(obj, false);
    let meta = |seq: u64| sluice_packet::Meta { clock: sluice_packet::Clock::new(0, base + seq), ..Default::default() };
    c.begin_batch();
    c.begin_packet(&meta(1));
    c.set_timer(obj, &k, t0 + 100);
    let mut fired = Vec::new();
    c.expired(t0 + 200, 16, &mut fired);
    c.end_batch();
    let keys: Vec<StateKey> = fired.iter().map(|f| f.key).collect();
    ensure(keys == vec![k], || format!("a timer due in the batch that armed it fired {keys:?}, not once"))?;
    c.begin_batch();
    c.begin_packet(&meta(2));
    fired.clear();
    c.expired(t0 + 300, 16, &mut fired);
    c.end_batch();
    ensure(fired.is_empty(), || format!("the timer fired again: {fired:?}"))
}

/// The shared (per source host) object of [`two_instances_sharing_a_table`]'s vertex.
const HOSTS: ObjectId = ObjectId(0);
/// Its per-flow object.
const FLOWS: ObjectId = ObjectId(1);

/// Two instances of vertex `v` (objects [`HOSTS`], [`FLOWS`]) whose timers live in `table`,
/// each knowing the other uses the hosts.
fn two_instances_sharing_a_table(
    b: &dyn Backend,
    v: u16,
    table: crate::VertexTimers,
) -> Result<(StoreClient, StoreClient), String> {
    let decls = [
        StateDecl::new("hosts", Scope::fields(&[sluice_packet::HeaderField::SrcIp]), AccessPattern::ReadWriteOften),
        StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften),
    ];
    let cfg = ClientConfig { write_through: true, ..ClientConfig::default() };
    let mut x = open_client(b, InstanceId::new(v, 0), &decls, &[], cfg.clone())?;
    let mut y = open_client(b, InstanceId::new(v, 1), &decls, &[], cfg)?;
    x.share_vertex_timers(table.clone());
    y.share_vertex_timers(table);
    for c in [&mut x, &mut y] {
        c.set_exclusive(HOSTS, false);
    }
    Ok((x, y))
}

/// Arms `timers` (object, key, deadline) at `c`, in a batch of their own.
fn arm(c: &mut StoreClient, timers: &[(ObjectId, StateKey, u64)]) {
    c.begin_batch();
    for (o, k, d) in timers {
        c.set_timer(*o, k, *d);
    }
    c.end_batch();
}

/// The timers due at `at` that `mine` lets `c` fire, fired in a batch of their own.
fn fire_due(c: &mut StoreClient, at: u64, mine: &dyn Fn(ObjectId, &StateKey) -> bool) -> Vec<(ObjectId, StateKey)> {
    c.begin_batch();
    let mut out = Vec::new();
    c.expired_where(at, 16, &mut out, mine);
    c.end_batch();
    out.into_iter().map(|f| (f.object, f.key)).collect()
}

/// Two instances of a vertex share its keys' timers through one table
/// (`share_vertex_timers`): a timer one arms on a shared key fires at the other, before its
/// next packet past the deadline, once, in deadline order with that instance's own timers; a
/// per-flow timer stays with the instance that armed it. (An instance that armed a host's
/// expiry fired it only on its own next packet past the deadline, so a sibling that got the
/// first such packet found the record the logical NF had deleted.)
pub fn shared_key_timers_fire_at_any_instance_of_the_vertex(b: &dyn Backend) -> Result<(), String> {
    let base = fresh_base();
    let t0 = packet_time_base(base);
    let (hosts, flows) = (HOSTS, FLOWS);
    let (host, flow) = (StateKey::Id(base), StateKey::Id(base + 1));
    let (mut x, mut y) = two_instances_sharing_a_table(b, 1033, crate::VertexTimers::default())?;
    arm(&mut x, &[(hosts, host, t0 + 100), (flows, flow, t0 + 100)]);
    arm(&mut y, &[(flows, flow, t0 + 150)]);
    let at_y = fire_due(&mut y, t0 + 200, &|_, _| true);
    ensure(at_y == vec![(hosts, host), (flows, flow)], || {
        format!("the sibling fired {at_y:?}, not the shared timer and then its own, in deadline order")
    })?;
    let at_x = fire_due(&mut x, t0 + 300, &|_, _| true);
    ensure(at_x == vec![(flows, flow)], || format!("the arming instance fired {at_x:?}, not its per-flow timer alone"))
}

/// At an order-sensitive vertex every timer lives in one table
/// ([`crate::VertexTimerTable::with_flow_timers`]) and fires in deadline order: a flow's
/// timer by the instance serving the flow, a shared key's by anyone. An instance about to
/// process a packet sees when a timer due before it is another's (it waits); each instance
/// fires only the timers at the head that are its own, up to the first that is not. (Per-flow
/// timers in each instance's own wheel fired at that instance's next packet, after packets of
/// other flows past their deadline: the portscan detector counted a failed attempt late.)
pub fn flow_timers_fire_in_turn_at_an_order_sensitive_vertex(b: &dyn Backend) -> Result<(), String> {
    let base = fresh_base();
    let t0 = packet_time_base(base);
    let (hosts, flows) = (HOSTS, FLOWS);
    let (host, flow_x, flow_y) = (StateKey::Id(base), StateKey::Id(base + 1), StateKey::Id(base + 2));
    let table = std::sync::Arc::new(crate::VertexTimerTable::with_flow_timers());
    let (mut x, mut y) = two_instances_sharing_a_table(b, 1034, table.clone())?;
    // Flow x is x's, flow y is y's.
    let of_x = move |_: ObjectId, k: &StateKey| *k != flow_y;
    let of_y = move |_: ObjectId, k: &StateKey| *k == flow_y;
    arm(&mut x, &[(flows, flow_x, t0 + 100), (hosts, host, t0 + 120)]);
    arm(&mut y, &[(flows, flow_y, t0 + 150)]);
    // y's packet at t0 + 200: flow x's timer comes first, and is x's.
    let due = y.due_where(t0 + 200, 16, &of_y);
    ensure(!due.first_fireable && due.foreign, || format!("y saw {due:?} before its packet"))?;
    let at_y = fire_due(&mut y, t0 + 200, &of_y);
    ensure(at_y.is_empty(), || format!("y fired {at_y:?} ahead of x's flow's timer"))?;
    ensure(table.with(|t| t.len()) == 3, || "a timer was lost".to_string())?;
    // x fires its flow's timer and the host's, and stops at y's flow.
    let due = x.due_where(t0 + 200, 16, &of_x);
    ensure(due.first_fireable && due.foreign, || format!("x saw {due:?}"))?;
    let at_x = fire_due(&mut x, t0 + 200, &of_x);
    ensure(at_x == vec![(flows, flow_x), (hosts, host)], || format!("x fired {at_x:?}"))?;
    // Only y's own is left: y goes on and fires it.
    let due = y.due_where(t0 + 200, 16, &of_y);
    ensure(due.first_fireable && !due.foreign, || format!("y saw {due:?} once x had fired"))?;
    let at_y = fire_due(&mut y, t0 + 200, &of_y);
    ensure(at_y == vec![(flows, flow_y)], || format!("y fired {at_y:?}"))?;
    // A timer armed while x's (a per-flow one) lands in the table, not x's own wheel.
    arm(&mut x, &[(flows, flow_x, t0 + 500)]);
    ensure(table.with(|t| t.is_armed(flows, &flow_x)), || "a per-flow timer was not in the table".to_string())
}

/// An object's timers with slack ([`StateDecl::idle_timers`]): a re-arm later by less than the
/// slack leaves the timer as it was, at the instance and in the store's copy (what a
/// replacement adopts), so the copy goes to the store only when the deadline moves; a re-arm
/// past the slack, or earlier, moves both; the timer fires at the deadline it kept.
pub fn idle_timers_copied_when_they_move(b: &dyn Backend) -> Result<(), String> {
    let v = 1035;
    let base = fresh_base();
    let t0 = packet_time_base(base);
    // Shortest timeout 16 µs of packet time: a slack of 1 µs.
    let decls = [StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften).idle_timers(16_000)];
    let (obj, k) = (ObjectId(0), StateKey::Id(base));
    let id = InstanceId::new(v, 0);
    let cfg = ClientConfig { write_through: true, ..ClientConfig::default() };
    let mut c = open_client(b, id, &decls, &[], cfg)?;
    let copy = |c: &mut StoreClient| -> Result<Vec<u64>, String> {
        c.flush().map_err(|e| format!("flush: {e}"))?;
        let timers = b.timers_of(id).map_err(|e| format!("timers_of: {e}"))?;
        Ok(timers.into_iter().filter(|(key, _)| key.key == k).map(|(_, d)| d).collect())
    };
    arm(&mut c, &[(obj, k, t0 + 16_000)]);
    arm(&mut c, &[(obj, k, t0 + 16_400), (obj, k, t0 + 16_999)]);
    let kept = copy(&mut c)?;
    ensure(kept == vec![t0 + 16_000], || {
        format!("re-armed within the slack, the store's copy is {kept:?}, not the first deadline")
    })?;
    arm(&mut c, &[(obj, k, t0 + 17_000)]);
    let moved = copy(&mut c)?;
    ensure(moved == vec![t0 + 17_000], || format!("re-armed a whole slack later, the store's copy is {moved:?}"))?;
    arm(&mut c, &[(obj, k, t0 + 16_500)]);
    let earlier = copy(&mut c)?;
    ensure(earlier == vec![t0 + 16_500], || format!("re-armed earlier, the store's copy is {earlier:?}"))?;
    arm(&mut c, &[(obj, k, t0 + 17_400)]);
    let fired = fire_due(&mut c, t0 + 16_500, &|_, _| true);
    ensure(fired == vec![(obj, k)], || format!("at the deadline it kept, the timer fired {fired:?}"))?;
    let gone = copy(&mut c)?;
    ensure(gone.is_empty(), || format!("fired, the store still has a copy at {gone:?}"))
}
