//! Where the controller puts a chain's roots and NF instances (E2's placement, simplest form):
//! a pure function of the chain's shape, the live nodes and the previous placement, so it is
//! tested without etcd and every controller computes the same answer.
//!
//! The policy, in order:
//! 1. what is placed on a live node that can host it stays there (moving an instance means a
//!    flow move or a replay: never without a reason);
//! 2. everything else — new instances, and those of a node that left — goes, one at a time in
//!    vertex and index order, to the node with the fewest things placed on it among those with
//!    the role (`root` for roots, `nf` for instances), ties to the lower node id;
//! 3. instances beyond the wanted count (a scale-in) are dropped from the highest index down.

use crate::membership::NodeInfo;
use std::collections::BTreeMap;

/// What a chain needs placed: its roots, and each vertex's instance count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    /// Number of roots.
    pub roots: u16,
    /// Each vertex (by name, in chain order) and how many instances it runs.
    pub vertices: Vec<(String, u16)>,
}

/// Something placed on a node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Root `n`.
    Root(u16),
    /// Instance `index` of the named vertex.
    Instance {
        /// The vertex.
        vertex: String,
        /// The instance's index.
        index: u16,
    },
}

impl Unit {
    fn role(&self) -> &'static str {
        match self {
            Unit::Root(_) => "root",
            Unit::Instance { .. } => "nf",
        }
    }
}

/// Which node hosts each unit.
pub type Placement = BTreeMap<Unit, String>;

/// Why nothing could be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No live node has the role a unit needs.
    #[error("no live node with role `{role}` to host {unit:?}")]
    NoNode {
        /// The role.
        role: &'static str,
        /// The first unit without a node.
        unit: Unit,
    },
}

/// The placement of `demand` on `nodes`, keeping what `previous` placed on nodes still live.
pub fn place(demand: &Demand, nodes: &[NodeInfo], previous: &Placement) -> Result<Placement, PlacementError> {
    let wanted: Vec<Unit> = (0..demand.roots)
        .map(Unit::Root)
        .chain(
            demand.vertices.iter().flat_map(|(v, n)| (0..*n).map(|index| Unit::Instance { vertex: v.clone(), index })),
        )
        .collect();
    let can_host = |id: &str, role: &str| nodes.iter().any(|n| n.id == id && n.roles.iter().any(|r| r == role));
    let mut placed: Placement = previous
        .iter()
        .filter(|(u, node)| wanted.contains(u) && can_host(node, u.role()))
        .map(|(u, n)| (u.clone(), n.clone()))
        .collect();
    let mut load: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.id.as_str(), 0)).collect();
    for node in placed.values() {
        if let Some(l) = load.get_mut(node.as_str()) {
            *l += 1;
        }
    }
    for unit in wanted {
        if placed.contains_key(&unit) {
            continue;
        }
        let role = unit.role();
        let best = nodes
            .iter()
            .filter(|n| n.roles.iter().any(|r| r == role))
            .min_by_key(|n| (load.get(n.id.as_str()).copied().unwrap_or(0), n.id.as_str()))
            .ok_or_else(|| PlacementError::NoNode { role, unit: unit.clone() })?;
        if let Some(l) = load.get_mut(best.id.as_str()) {
            *l += 1;
        }
        placed.insert(unit, best.id.clone());
    }
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, roles: &[&str]) -> NodeInfo {
        NodeInfo { id: id.into(), addr: format!("{id}:6081"), roles: roles.iter().map(|r| r.to_string()).collect() }
    }

    #[test]
    fn units_are_snake_case_json() {
        let units = vec![Unit::Root(1), Unit::Instance { vertex: "nat".into(), index: 2 }];
        let text = serde_json::to_string(&units).expect("json");
        assert_eq!(text, r#"[{"root":1},{"instance":{"vertex":"nat","index":2}}]"#);
        assert_eq!(serde_json::from_str::<Vec<Unit>>(&text).expect("back"), units);
    }

    fn demand(nat: u16, fw: u16) -> Demand {
        Demand { roots: 1, vertices: vec![("nat".into(), nat), ("fw".into(), fw)] }
    }

    fn inst(v: &str, i: u16) -> Unit {
        Unit::Instance { vertex: v.into(), index: i }
    }

    fn on<'a>(p: &'a Placement, u: &Unit) -> &'a str {
        p.get(u).map(String::as_str).unwrap_or("-")
    }

    #[test]
    fn spreads_over_nodes_by_role_and_load() {
        let nodes = [node("a", &["root", "nf"]), node("b", &["nf"]), node("c", &["nf"])];
        let p = place(&demand(2, 2), &nodes, &Placement::new()).expect("placed");
        assert_eq!(on(&p, &Unit::Root(0)), "a", "only a hosts roots");
        // The root counts as a's load: the four instances go b, c, a, b.
        assert_eq!(on(&p, &inst("nat", 0)), "b");
        assert_eq!(on(&p, &inst("nat", 1)), "c");
        assert_eq!(on(&p, &inst("fw", 0)), "a");
        assert_eq!(on(&p, &inst("fw", 1)), "b");
        assert_eq!(p.len(), 5);
    }

    #[test]
    fn nothing_moves_without_a_reason() {
        let nodes = [node("a", &["root", "nf"]), node("b", &["nf"]), node("c", &["nf"])];
        let p = place(&demand(2, 2), &nodes, &Placement::new()).expect("placed");
        assert_eq!(place(&demand(2, 2), &nodes, &p).expect("again"), p);
        // A new node changes nothing that is placed.
        let more = [node("a", &["root", "nf"]), node("b", &["nf"]), node("c", &["nf"]), node("d", &["nf"])];
        assert_eq!(place(&demand(2, 2), &more, &p).expect("with d"), p);
    }

    #[test]
    fn a_dead_node_s_units_go_to_the_least_loaded_survivors() {
        let nodes = [node("a", &["root", "nf"]), node("b", &["nf"]), node("c", &["nf"])];
        let p = place(&demand(2, 2), &nodes, &Placement::new()).expect("placed");
        let survivors = [node("a", &["root", "nf"]), node("c", &["nf"])];
        let q = place(&demand(2, 2), &survivors, &p).expect("replaced");
        // b hosted nat 0 and fw 1; the others stay.
        for (u, n) in &p {
            if n != "b" {
                assert_eq!(q.get(u), Some(n), "{u:?} stayed");
            }
        }
        assert_eq!(on(&q, &inst("nat", 0)), "c", "c had 1, a had 2");
        assert_eq!(on(&q, &inst("fw", 1)), "a", "then both had 2: the lower id");
        assert!(q.values().all(|n| n != "b"));
    }

    #[test]
    fn scaling_adds_to_the_least_loaded_and_removes_the_highest_indices() {
        let nodes = [node("a", &["root", "nf"]), node("b", &["nf"])];
        let p = place(&demand(1, 1), &nodes, &Placement::new()).expect("placed");
        let out = place(&demand(3, 1), &nodes, &p).expect("scaled out");
        assert_eq!(out.len(), 5);
        assert!(p.iter().all(|(u, n)| out.get(u) == Some(n)), "existing instances stay");
        let back = place(&demand(1, 1), &nodes, &out).expect("scaled in");
        assert_eq!(back, p, "scale-in drops nat 2 and nat 1");
    }

    #[test]
    fn a_role_no_live_node_has_is_an_error() {
        let nodes = [node("a", &["nf"])];
        let e = place(&demand(1, 1), &nodes, &Placement::new()).expect_err("no root node");
        assert_eq!(e, PlacementError::NoNode { role: "root", unit: Unit::Root(0) });
        assert!(e.to_string().contains("role `root`"));
    }
}
