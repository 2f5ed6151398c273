//! What a node's control endpoint shows, and refuses, of a chain spread over nodes
//! (docs/decisions.md, "A node's live view of a spread chain"), and which vertices the root's
//! node may change while the chain runs (docs/decisions.md, "Changes on the root's node").

use crate::live::Live;
use crate::plan::VertexPlan;
use crate::spread::Layout;

/// Why a node's endpoint takes no live store crash: the nodes would have to agree on it.
const NO_STORE_CRASH: &str = "a chain spread over nodes takes no live store crash yet \
(docs/decisions.md, \"A node's live view of a spread chain\"); to drill a failure, crash a node \
(`sluice ctl crash-node`), one of its instances or the root";

/// Sets up `live` for this node's part of a spread chain: the instances on other nodes shown
/// as such (their figures are their nodes'), and every live change refused with the reason,
/// but these. Slowing an instance of this node is taken: it changes nothing but that
/// instance's pace (a straggler on purpose). Crashing an instance of this node is taken, when
/// the run can fail over: on the root's node as in one process; on another node the node
/// carries the crash out and the root's node, which keeps the log, replaces the instance
/// (`crashed.rs`). Crashing the root is taken on the root's node, as in one process: the
/// other nodes' notes go on arriving, into the new root's log (docs/decisions.md, "A root
/// crash on the root's node"). Scaling, moves and clones are taken on the root's node of a
/// `scalable` spread, of the vertices [`fixed_vertices`] leaves free.
pub(in crate::exec) fn live_view(
    live: &Live,
    layout: &Layout,
    (vertices, slots): (&[VertexPlan], usize),
    scalable: bool,
) {
    live.set_store_crash(Some(NO_STORE_CRASH.into()));
    let root = layout.names.get(layout.root).map_or("?", String::as_str);
    if !layout.has_root() {
        live.set_root_crash(Some(format!("the root runs on node `{root}`: ask that node's endpoint")));
        live.set_scaling(Some(format!(
            "the root's node (`{root}`) changes a chain spread over nodes: ask its endpoint"
        )));
    } else if !scalable {
        live.set_scaling(Some(
            "the chain's spread file does not say `scalable: true` (in a hosted run: `sluice node --scalable` on every node): every node must keep places for the instances added"
                .into(),
        ));
    } else {
        live.set_fixed(fixed_vertices(layout, vertices));
    }
    for g in (0..slots).filter(|g| !layout.here(*g)) {
        live.set_elsewhere(g, true);
    }
}

/// Per vertex, why the root's node cannot change it while the chain runs (`None`: it can).
/// A vertex's allocation is applied where packets are sent to it and settled by its
/// instances: both must happen on the root's node, so every instance of the vertex and of
/// every vertex that sends to it must run there (the root itself sends to the entry's).
pub(in crate::exec) fn fixed_vertices(layout: &Layout, vertices: &[VertexPlan]) -> Vec<Option<String>> {
    vertices
        .iter()
        .enumerate()
        .map(|(v, vp)| {
            if let Some(node) = away(layout, vp) {
                return Some(format!("`{}` has instances on node `{node}`: only vertices all on the root's node change live in a chain spread over nodes", vp.name));
            }
            vertices.iter().filter(|u| u.successors().contains(&v)).find_map(|u| {
                away(layout, u).map(|node| {
                    format!(
                        "`{}`, which sends packets to `{}`, has instances on node `{node}`: the split to `{}` would change on two nodes",
                        u.name, vp.name, vp.name
                    )
                })
            })
        })
        .collect()
}

/// A node other than the root's that hosts an instance of `vp`, by name.
fn away(layout: &Layout, vp: &VertexPlan) -> Option<String> {
    vp.instances
        .iter()
        .filter_map(|g| layout.node_of.get(*g))
        .find(|n| **n != layout.root)
        .map(|n| layout.names.get(*n).map_or("?", String::as_str).to_string())
}

/// Refuses what the root's node of a spread cannot do to a vertex it does not have whole,
/// saying why: a planned change (`scale`, `move`, `clone` faults), a planned `slow` (applied
/// by this node's workers) and a vertex manager's policy.
pub(in crate::exec) fn check_planned_changes(
    layout: &Layout,
    vertices: &[VertexPlan],
    (planned, policies): (&[super::super::Planned], &[(usize, sluice_chc::manager::ManagerPolicy)]),
) -> Result<(), super::RunError> {
    use super::super::Planned;
    let fixed = fixed_vertices(layout, vertices);
    let refuse = |v: usize, what: String| match fixed.get(v).cloned().flatten() {
        Some(why) => Err(super::RunError::Config(format!("{what}: {why}"))),
        None => Ok(()),
    };
    for p in planned {
        match p {
            Planned::Change(r) => refuse(r.vertex, format!("a planned change at packet {}", r.after))?,
            Planned::Slow(s) => {
                // Applied by this node's workers: its instances must be here.
                if let Some(node) = vertices.get(s.vertex).and_then(|vp| away(layout, vp)) {
                    let name = vertices.get(s.vertex).map_or("?", |vp| &*vp.name);
                    return Err(super::RunError::Config(format!(
                        "a planned slowdown at packet {}: `{name}` has instances on node `{node}`, whose workers this node's schedule does not reach",
                        s.after
                    )));
                }
            }
            _ => {}
        }
    }
    for (v, _) in policies {
        refuse(*v, "a vertex manager's policy".into())?;
    }
    Ok(())
}
