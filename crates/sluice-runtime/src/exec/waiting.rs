//! What a threaded run that makes no progress says it waits for (a run that never ends is a
//! bug; this is where to start looking).

use super::ft::RootLog;
use super::{failover, reconfig, Shared};
use sluice_packet::Clock;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often a run that makes no progress says what it waits for.
pub(super) const NOTICE_AFTER: Duration = Duration::from_secs(5);

/// Says what a run that makes no progress waits for.
pub(super) fn warn(
    shared: &Shared,
    (low, admitted, log): (u64, u64, Option<&RootLog>),
    (failover, scaling): (&failover::RootSide, &reconfig::RootSide),
    what: &str,
) {
    shared.describe_asked.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        in_flight = shared.in_flight.load(Ordering::Acquire),
        oldest_unfinished = low,
        its_copies_in_flight = shared.clocks.count(Clock::new(0, low)),
        admitted,
        logged = log.map_or(0, RootLog::logged),
        failover_pending = failover.busy(),
        failovers = %failover.describe(),
        changes_pending = %scaling.describe(shared),
        "{what}"
    );
}
