//! The root's reading of its source: a partial batch topped up while the instances are behind;
//! which runs may go to completion on the root thread.

use super::{RunConfig, RunError};
use crate::ports::{Fill, Source};
use sluice_packet::{Batch, PacketPool};
use std::time::{Duration, Instant};

/// How long the root waits for a partial batch to fill while the chain is busy.
const BATCH_WAIT: Duration = Duration::from_micros(20);

/// Tops up a partial batch from a source that trickles (a paced trace, a live interface, a
/// link) for up to [`BATCH_WAIT`]. Only called while some instance has a batch queued: the
/// instances are behind, so a packet that waits here for company would have waited in a queue
/// anyway, and a batch of a few packets costs a whole batch's overheads at every hop (queue
/// hand-offs, the store client's flush). Without it, at a steady half of the saturated rate,
/// batches of a few packets built a backlog of milliseconds that full batches never had (the
/// example chain: p50 8.3 ms at 50 % load, `bench-store --parts open-loop`). A chain that
/// keeps up gets its packets at once. Returns `Done` if the source ended meanwhile.
pub(super) fn fill_batch(
    source: &mut dyn Source,
    pool: &PacketPool,
    inbuf: &mut Batch,
    batch: usize,
) -> Result<Fill, RunError> {
    let until = Instant::now() + BATCH_WAIT;
    while inbuf.len() < batch && Instant::now() < until {
        match source.fill(pool, inbuf, batch - inbuf.len())? {
            Fill::Done => return Ok(Fill::Done),
            Fill::Data => {}
            Fill::Idle => std::hint::spin_loop(),
        }
    }
    Ok(Fill::Data)
}

/// Why a run cannot go to completion on the root thread (`RunConfig::workers` 0), if it cannot.
/// Run to completion is for plain runs: whatever makes the root wait for workers to do
/// something (a failover's replay, a change settling, a checkpoint holding the chain still) or
/// several threads feed them (several roots) needs worker threads.
pub(super) fn run_to_completion_allowed(cfg: &RunConfig, live: bool) -> Result<(), String> {
    let refused = [
        (cfg.roots > 1, "several roots"),
        (cfg.fault_tolerance, "fault tolerance"),
        (!cfg.planned.is_empty(), "planned faults or changes"),
        (!cfg.policies.is_empty(), "vertex managers"),
        (cfg.scalable, "scaling"),
        (live, "a control endpoint"),
    ];
    match refused.iter().filter(|(on, _)| *on).map(|(_, what)| *what).collect::<Vec<_>>().as_slice() {
        [] => Ok(()),
        what => Err(format!(
            "0 workers (run to completion on the root thread) is for plain runs, not with {}: give it worker threads",
            what.join(", ")
        )),
    }
}
