//! The end of a run: what each vertex and instance did goes into the report; a recorded
//! run's instances also fire the timers due by its last packet and hand over their final state.

use super::spread::Link;
use super::worker::{Slot, Turns, WorkerResult};
use super::{RunError, Shared};
use crate::record::{DropRecord, Recording, StateRecord};
use crate::report::{InstanceReport, RunReport, VertexReport};
use std::sync::Arc;

/// Whose state a node's record holds.
pub(super) struct Owned {
    /// Per vertex, whether this node's record holds its state (every vertex in one process;
    /// spread over nodes, [`crate::spread::Layout::records_state`]).
    pub(super) records_state: Vec<bool>,
    /// On the root's node: the nodes sharing a split vertex that did not say their state is in
    /// the store.
    pub(super) unflushed: Vec<String>,
}

impl Owned {
    /// Every one of `vertices` vertices (one process).
    pub(super) fn all(vertices: usize) -> Owned {
        Owned { records_state: vec![true; vertices], unflushed: Vec::new() }
    }
}

/// The end of a recorded run: the instances here fire their end timers and flush
/// ([`end_instances`]); a node without the root (`link`) then tells the root's node so; the
/// state this node records is read from the store ([`record_store_state`]) — on the root's
/// node once every node sharing a split vertex has flushed.
pub(super) fn record_end(
    rec: &mut Recording,
    slots: &mut [(usize, Slot)],
    shared: &Shared,
    store: Option<&Arc<dyn sluice_store::Backend>>,
    link: Option<&mut Link>,
    owned: &Owned,
    end: (u64, bool),
) -> Result<(), RunError> {
    let ended = end_instances(rec, slots, shared, end);
    if let Some(l) = link {
        l.tell_flushed(ended.is_ok());
    }
    ended?;
    if !owned.unflushed.is_empty() {
        return Err(RunError::Worker(format!(
            "node(s) {} did not say they fired their end timers and flushed: the state of the vertices they share with others is not recorded (the output is complete)",
            owned.unflushed.join(", ")
        )));
    }
    match store {
        Some(b) => record_store_state(rec, b, &owned.records_state),
        None => Ok(()),
    }
}

/// The end of a recorded run, first part: the timers due by the last packet's time
/// (`last_ts`) fire (as they do at the end of the logical chain's run) and the state is
/// flushed, then the drops and the local state are collected — of the instances that run on
/// this node (a node of a chain spread over several records its own part). `failed_over`:
/// drops redone by replacements are recorded once.
fn end_instances(
    rec: &mut Recording,
    slots: &mut [(usize, Slot)],
    shared: &Shared,
    (last_ts, failed_over): (u64, bool),
) -> Result<(), RunError> {
    let vertices = &shared.vertices;
    let name = |v: usize| vertices.get(v).map_or_else(|| "?".to_string(), |vp| vp.name.to_string());
    // An order-sensitive vertex's instances fire their timers in turn (all of them live in
    // one table); the others each fire their own below.
    super::flow_timers::fire_at_end(shared, slots, (last_ts, rec.end));
    for (_, s) in slots.iter_mut().filter(|(_, s)| s.ran_here(shared)) {
        let vertex = name(s.vertex);
        rec.drops.extend(s.stats.drops.drain(..).map(|(clock, reason)| DropRecord {
            clock,
            vertex: vertex.clone(),
            reason,
        }));
        if s.handed_over {
            // Crashed here: its drops until then are this node's, its state its replacement's.
            continue;
        }
        if s.flow_timers.is_none() {
            s.inst.begin_batch();
            s.inst.advance_time(last_ts, rec.end);
            s.inst.end_batch();
        }
        s.inst.state().flush().map_err(|e| RunError::Worker(format!("flushing state: {e}")))?;
        // The run's log is closed: the end's timers are not packets it waits for.
        let mut commits = Vec::new();
        s.inst.state().take_commits(&mut commits);
        let local = s.inst.state().as_any_mut().and_then(|a| a.downcast_mut::<sluice_state::LocalState>());
        if let Some(local) = local {
            let v = s.vertex;
            rec.state.extend(local.snapshot().into_iter().map(|(o, key, value)| StateRecord {
                vertex: v,
                object: o.0,
                key,
                value,
            }));
        }
    }
    if failed_over {
        // A replacement redoing a clock its predecessor dropped drops it again.
        rec.drops.sort_by(|a, b| (a.clock, &a.vertex).cmp(&(b.clock, &b.vertex)));
        rec.drops.dedup_by(|a, b| a.clock == b.clock && a.vertex == b.vertex && a.reason == b.reason);
    }
    Ok(())
}

/// The end of a recorded run, second part: the final state in `store` of the vertices whose
/// state this node records (`records_state`, by vertex; in one process every vertex, spread
/// over nodes [`crate::spread::Layout::records_state`]). Called once every instance whose
/// state it reads has fired its end timers and flushed.
fn record_store_state(
    rec: &mut Recording,
    store: &Arc<dyn sluice_store::Backend>,
    records_state: &[bool],
) -> Result<(), RunError> {
    let cp = store.checkpoint().map_err(|e| RunError::Worker(format!("reading the final state: {e}")))?;
    // Not the chain's: the root's log (its own vertex) and the scratch value a store rebuild
    // marks in-flight updates with.
    let owned = cp.values.into_iter().filter(|(k, _)| {
        records_state.get(usize::from(k.vertex)).copied().unwrap_or(false)
            && k.object != sluice_chc::recovery::SCRATCH_OBJECT
    });
    rec.state.extend(owned.map(|(k, value)| StateRecord {
        vertex: usize::from(k.vertex),
        object: k.object,
        key: k.key,
        value,
    }));
    Ok(())
}

/// Fills `report`'s vertices, instances, drops by place and events from the workers' `slots`
/// (worker, slot). Instances that ran on another node (and did not fail over here) are that
/// node's report; one that crashed here is in both, up to its crash here.
pub(super) fn instances_into(report: &mut RunReport, shared: &Shared, mut slots: Vec<(usize, Slot)>) {
    slots.retain(|(_, s)| s.ran_here(shared));
    report.vertices = shared
        .vertices
        .iter()
        .map(|v| VertexReport {
            name: v.name.to_string(),
            kind: v.kind.clone(),
            split: v.split.iter().map(|f| format!("{f:?}")).collect(),
            off_path: v.off_path,
            instances: Vec::new(),
        })
        .collect();
    let mut events = Vec::new();
    for (w, mut s) in slots {
        events.append(&mut s.stats.events);
        events.extend(s.inst.take_events());
        let Some(vr) = report.vertices.get_mut(s.vertex) else { continue };
        // Off-path vertices only ever drop mirror copies, which are not input packets.
        if !vr.off_path {
            for (r, n) in &s.stats.dropped {
                *report.dropped.entry(format!("{}: {r}", vr.name)).or_default() += n;
            }
        }
        let busy = s.stats.busy.as_secs_f64();
        vr.instances.push(InstanceReport {
            index: s.inst.id().index(),
            handed_over: s.handed_over,
            retired: shared.scaling.as_ref().is_some_and(|sc| !sc.serving(s.global)),
            worker: w,
            packets_in: s.stats.packets_in,
            forwarded: s.stats.forwarded,
            dropped: s.stats.dropped.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            consumed: s.stats.consumed,
            duplicates: s.stats.duplicates,
            replays_passed: s.stats.replays_passed,
            busy_s: busy,
            busy_mpps: if busy > 0.0 { s.stats.packets_in as f64 / busy / 1e6 } else { 0.0 },
            state: s.inst.state().counters().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        });
        if let Some(live) = &shared.live {
            live.state_counters(s.global, &s.inst.state().counters());
        }
    }
    report.dropped_total = report.dropped.values().sum();
    events.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()).then_with(|| a.detail.cmp(&b.detail)));
    if !report.failovers.is_empty() {
        // A replacement redoing a clock its predecessor processed decides the same again.
        events.dedup_by(|a, b| a.sort_key() == b.sort_key() && a.detail == b.detail);
    }
    for e in &events {
        *report.event_counts.entry(format!("{}/{}", e.nf, e.kind)).or_default() += 1;
    }
    report.events = events;
}

/// Waits for the worker threads (and takes the root thread's turns' result in a run to
/// completion): every slot with its worker, and the mirror copies the workers made; the first
/// error an instance met, if any.
pub(super) fn join_workers(
    shared: &Shared,
    handles: Vec<std::thread::JoinHandle<WorkerResult>>,
    inline: Option<Turns>,
) -> Result<(Vec<(usize, Slot)>, u64), RunError> {
    let mut results = Vec::new();
    for (w, h) in handles.into_iter().enumerate() {
        results.push((w, h.join().map_err(|_| RunError::Worker(format!("worker {w} panicked")))?));
    }
    if let Some(t) = inline {
        results.push((0, t.finish(shared)));
    }
    let (mut slots, mut mirrored) = (Vec::new(), 0);
    for (w, r) in results {
        mirrored += r.mirrored;
        if let Some(e) = r.flush_errors.first() {
            return Err(RunError::Worker(format!("flushing state: {e}")));
        }
        if let Some(e) = r.slots.iter().flat_map(|s| &s.errors).next() {
            return Err(RunError::Worker(e.clone()));
        }
        slots.extend(r.slots.into_iter().map(|s| (w, s)));
    }
    Ok((slots, mirrored))
}
