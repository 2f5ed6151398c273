//! The end of a recorded run.

use super::worker::Slot;
use super::RunError;
use crate::plan::VertexPlan;
use crate::record::{DropRecord, Recording, StateRecord};
use std::sync::Arc;

/// The end of a recorded run: the timers due by the last packet's time fire (as they do at the
/// end of the logical chain's run), then the drops and the final state are collected.
pub(super) fn record_end(
    rec: &mut Recording,
    slots: &mut [(usize, Slot)],
    vertices: &[VertexPlan],
    store: Option<&Arc<dyn sluice_store::Backend>>,
    last_ts: u64,
) -> Result<(), RunError> {
    let name = |v: usize| vertices.get(v).map_or_else(|| "?".to_string(), |vp| vp.name.to_string());
    for (_, s) in slots.iter_mut() {
        s.inst.begin_batch();
        s.inst.advance_time(last_ts, rec.end);
        s.inst.end_batch();
        s.inst.state().flush().map_err(|e| RunError::Worker(format!("flushing state: {e}")))?;
        // The run's log is closed: the end's timers are not packets it waits for.
        let mut commits = Vec::new();
        s.inst.state().take_commits(&mut commits);
        let vertex = name(s.vertex);
        rec.drops.extend(s.stats.drops.drain(..).map(|(clock, reason)| DropRecord {
            clock,
            vertex: vertex.clone(),
            reason,
        }));
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
    if let Some(b) = store {
        let cp = b.checkpoint().map_err(|e| RunError::Worker(format!("reading the final state: {e}")))?;
        // Not the chain's: the root's log (its own vertex) and the scratch value a store rebuild
        // marks in-flight updates with.
        let owned = cp.values.into_iter().filter(|(k, _)| {
            usize::from(k.vertex) < vertices.len() && k.object != sluice_chc::recovery::SCRATCH_OBJECT
        });
        rec.state.extend(owned.map(|(k, value)| StateRecord {
            vertex: usize::from(k.vertex),
            object: k.object,
            key: k.key,
            value,
        }));
    }
    Ok(())
}
