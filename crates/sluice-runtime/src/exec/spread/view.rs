//! What a node's control endpoint shows, and refuses, of a chain spread over nodes
//! (docs/decisions.md, "A node's live view of a spread chain").

use crate::live::Live;
use crate::spread::Layout;

/// Why a node's endpoint takes no live change: each would need the nodes to agree on it.
const NO_CHANGES: &str = "a chain spread over nodes takes no live store crash, scaling or move yet \
(docs/decisions.md, \"A node's live view of a spread chain\"); to drill a failure, crash a node \
(`sluice ctl crash-node`), one of its instances or the root";

/// Sets up `live` for this node's part of a spread chain: the instances on other nodes shown
/// as such (their figures are their nodes'), and every live change refused with the reason,
/// but three. Slowing an instance of this node is taken: it changes nothing but that
/// instance's pace (a straggler on purpose). Crashing an instance of this node is taken, when
/// the run can fail over: on the root's node as in one process; on another node the node
/// carries the crash out and the root's node, which keeps the log, replaces the instance
/// (`crashed.rs`). Crashing the root is taken on the root's node, as in one process: the
/// other nodes' notes go on arriving, into the new root's log (docs/decisions.md, "A root
/// crash on the root's node").
pub(in crate::exec) fn live_view(live: &Live, layout: &Layout, slots: usize) {
    live.set_store_crash(Some(NO_CHANGES.into()));
    live.set_scaling(Some(NO_CHANGES.into()));
    if !layout.has_root() {
        let root = layout.names.get(layout.root).map_or("?", String::as_str);
        live.set_root_crash(Some(format!("the root runs on node `{root}`: ask that node's endpoint")));
    }
    for g in (0..slots).filter(|g| !layout.here(*g)) {
        live.set_elsewhere(g, true);
    }
}
