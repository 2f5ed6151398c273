//! Planning a store rebuild (CHC R6): what the new store gets from the last checkpoint, from
//! the instances' write-ahead logs (TS selection, in `sluice_store::recovery`) and from the
//! instances' own copies of per-flow state, and which in-flight updates it must recognise.
//! Pure planning: the driver wipes the store, applies the plan, and reconnects the clients.

use sluice_packet::Clock;
use sluice_state::{StateDecl, StateKey, StateOp, Value};
use sluice_store::client::WalEntry;
use sluice_store::recovery::{plan_in_order, RebuildPlan, RecoveryLog};
use sluice_store::{Checkpoint, Request, StoreKey, StoreOp, NONDET_OBJECT};
use std::collections::{HashMap, HashSet};

/// The object index of the scratch value in-flight marks update (beyond any NF's objects, so it
/// is never part of the chain's state).
pub const SCRATCH_OBJECT: u16 = u16::MAX;

/// Whether `key` belongs to a per-flow object its instance keeps write-through (so the
/// instance's copy, not the log, is the truth), given each vertex's declared objects.
pub fn is_per_flow(decls: &[Vec<StateDecl>], key: &StoreKey) -> bool {
    decls
        .get(usize::from(key.vertex))
        .and_then(|d| d.get(usize::from(key.object)))
        .is_some_and(StateDecl::held_by_its_flows_instance)
}

/// When each clock's packet entered the chain, as the instances' write-ahead logs say (every
/// entry carries its packet's entry time): the `entry_time` [`rebuild_plan`] orders several
/// instances' updates by, for a driver that keeps no entry times of finished packets (a
/// threaded run). A clock no entry names entered at 0.
pub fn entry_times(logs: &[RecoveryLog]) -> impl Fn(Clock) -> u64 {
    let times: HashMap<Clock, u64> =
        logs.iter().flat_map(|l| l.wal.iter().map(|e| (e.tag.clock, e.entry_ns))).collect();
    move |c| times.get(&c).copied().unwrap_or(0)
}

/// The rebuild plan: shared state from the checkpoint and the write-ahead logs (TS selection);
/// per-flow state from the instances' copies (`per_flow`: every per-flow key an instance holds,
/// `None` where it knows the value was deleted since the checkpoint), none of it re-executed.
/// Re-executed updates keep each instance's log order; across instances they go in chain-entry
/// order (`entry_time` of a clock, then the clock), the order order-sensitive NFs applied them.
pub fn rebuild_plan(
    checkpoint: &Checkpoint,
    logs: &mut [RecoveryLog],
    per_flow: Vec<(StoreKey, Option<Value>)>,
    decls: &[Vec<StateDecl>],
    entry_time: &dyn Fn(Clock) -> u64,
) -> RebuildPlan {
    without_baseline_duplicates(logs, checkpoint);
    let cached: HashSet<StoreKey> = per_flow.iter().map(|(k, _)| *k).collect();
    let present: Vec<_> = per_flow.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
    let alive: HashSet<StoreKey> = present.iter().map(|(k, _)| *k).collect();
    let rank = |e: &WalEntry| (entry_time(e.tag.clock), e.tag.clock);
    let mut p = plan_in_order(checkpoint, logs, present, &rank);
    // A per-flow value an instance knows to be gone stays gone; one no instance holds a copy of
    // (its flow moved away from the instance that wrote it) comes from the checkpoint and the
    // write-ahead logs like shared state.
    p.values.retain(|(k, _)| !is_per_flow(decls, k) || !cached.contains(k) || alive.contains(k));
    p.replay.retain(|(_, e)| !is_per_flow(decls, &e.key) || !cached.contains(&e.key));
    p
}

/// Drops from the write-ahead logs the updates after an instance's checkpoint position whose
/// tag another instance of the vertex had already applied before the checkpoint: a clone
/// repeats its straggler's updates (the store applied them once) and re-executing them would
/// apply them twice. Positions are the logs' `after_checkpoint` (or found from the checkpoint's
/// TS vector where a log does not say).
pub fn without_baseline_duplicates(logs: &mut [RecoveryLog], cp: &Checkpoint) {
    let position = |l: &RecoveryLog| -> usize {
        l.after_checkpoint.unwrap_or_else(|| {
            let ts = cp.ts.iter().find(|(i, _)| *i == l.instance).map(|(_, c)| *c);
            ts.and_then(|ts| l.wal.iter().rposition(|e| e.tag.clock == ts)).map_or(0, |p| p + 1)
        })
    };
    let mut baseline = HashSet::new();
    for l in logs.iter() {
        let p = position(l).min(l.wal.len());
        baseline.extend(l.wal[..p].iter().map(|e| (e.key.vertex, e.tag)));
    }
    for l in logs.iter_mut() {
        let start = position(l);
        let mut i = 0;
        l.wal.retain(|e| {
            let keep = i < start || !baseline.contains(&(e.key.vertex, e.tag));
            i += 1;
            keep
        });
    }
}

/// A store rebuild as the core plans it: what the new store starts from and re-executes, and
/// the marks of the updates whose packets are still in flight ([`in_flight_marks`]). The
/// driver carries it out with `sluice_store::recovery::rebuild`.
pub struct StoreRebuild {
    /// Values, TS vector and updates to re-execute; its per-clock log only for packets still
    /// in flight.
    pub plan: RebuildPlan,
    /// The in-flight updates' tags, for the rebuilt store's per-clock log.
    pub marks: Vec<Request>,
}

/// Plans the rebuild of a crashed store from `checkpoint`, the instances' `logs` and
/// `per_flow` copies ([`rebuild_plan`]), keeping only what packets still in the root's log
/// (`in_log`) need of the per-clock log.
pub fn plan_store_rebuild(
    checkpoint: &Checkpoint,
    logs: &mut [RecoveryLog],
    per_flow: Vec<(StoreKey, Option<Value>)>,
    decls: &[Vec<StateDecl>],
    entry_time: &dyn Fn(Clock) -> u64,
    in_log: &dyn Fn(Clock) -> bool,
) -> StoreRebuild {
    let mut plan = rebuild_plan(checkpoint, logs, per_flow, decls, entry_time);
    plan.log.retain(|l| in_log(l.clock));
    let marks = in_flight_marks(logs, in_log);
    StoreRebuild { plan, marks }
}

/// The requests that tell a rebuilt store which updates of packets still in the root's log
/// (`in_log`) it holds: their tags go into its per-clock log (as no-op updates of a scratch
/// value), so a later replay of those packets is recognised as a duplicate rather than applied
/// twice. Recorded non-deterministic values are logged again with their value, so a replay
/// still draws it.
pub fn in_flight_marks(logs: &[RecoveryLog], in_log: impl Fn(Clock) -> bool) -> Vec<Request> {
    let mut reqs = Vec::new();
    for l in logs {
        for e in l.wal.iter().filter(|e| in_log(e.tag.clock)) {
            let (object, op) = match &e.op {
                StateOp::Record(v) => (NONDET_OBJECT, StateOp::Record(v.clone())),
                _ => (SCRATCH_OBJECT, StateOp::Incr(0)),
            };
            let key = StoreKey { vertex: e.key.vertex, object, key: StateKey::Unit };
            reqs.push(Request {
                id: 0,
                client: l.instance,
                tag: Some(e.tag),
                key,
                op: StoreOp::State(op),
                reply: false,
            });
        }
    }
    reqs
}

#[cfg(test)]
mod tests;
