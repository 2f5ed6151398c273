//! What a node's control endpoint shows, and refuses, of a chain spread over nodes
//! (docs/decisions.md, "A node's live view of a spread chain").

use crate::live::Live;
use crate::spread::Layout;

/// Why a node's endpoint takes no live change: each would need the nodes to agree on it.
const NO_CHANGES: &str = "a chain spread over nodes takes no live store crash, scaling or move yet \
(docs/decisions.md, \"A node's live view of a spread chain\"); to drill a failure, crash a node \
(`sluice ctl crash-node`) or an instance of the root's node";

/// Why a node without the root crashes none of its instances alone.
const NO_CRASH_HERE: &str = "only the root's node crashes one of its instances alone: the root's \
node would not know which copies went with an instance of this node (docs/decisions.md, \"A \
node's live view of a spread chain\"); crash this node (`sluice ctl crash-node`)";

/// Sets up `live` for this node's part of a spread chain: the instances on other nodes shown
/// as such (their figures are their nodes'), and every live change refused with the reason,
/// but two. Slowing an instance of this node is taken: it changes nothing but that
/// instance's pace (a straggler on purpose). Crashing an instance of the root's node is taken
/// there, when the run can fail over: the root's node keeps the log, replays it, and knows
/// what the instance held, as in one process.
pub(in crate::exec) fn live_view(live: &Live, layout: &Layout, slots: usize) {
    if !layout.has_root() {
        live.set_failover(Some(NO_CRASH_HERE.into()));
    }
    live.set_store_crash(Some(NO_CHANGES.into()));
    live.set_scaling(Some(NO_CHANGES.into()));
    live.set_root_can_fail(false);
    for g in (0..slots).filter(|g| !layout.here(*g)) {
        live.set_elsewhere(g, true);
    }
}
