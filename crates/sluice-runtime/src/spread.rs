//! One chain over several nodes (processes or machines): which node hosts which instance, read
//! from a YAML file every node is given, and its resolution against the compiled chain.
//!
//! Every node compiles the same chain; each instance lives on one node, the root (input, log,
//! window, egress and output) on one. Packets for an instance elsewhere, and output leaving
//! on a node without the root, cross in Geneve datagrams; the nodes without the root send
//! the root's node their notes (copies made, copies ended, commits), which keep its log and its
//! window as a worker thread's notes do in one process (docs/decisions.md, "One chain across
//! nodes").
//!
//! ```yaml
//! nodes:
//!   a: 127.0.0.1:7001
//!   b: 127.0.0.1:7002
//! root: a
//! scalable: true     # optional: the root's node may scale its own vertices live
//! place:
//!   firewall: b      # every instance of the firewall
//!   nat/1: b         # instance 1 of the NAT (instances not named stay with the root)
//! ```

use crate::plan::VertexPlan;
use sluice_packet::InstanceId;
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Where a chain's instances run, as the file says (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    /// The nodes by name, each with the UDP address it receives packets and notes on.
    pub nodes: BTreeMap<String, SocketAddr>,
    /// The node with the root: it reads the input, keeps the log and writes the output.
    pub root: String,
    /// Instances placed elsewhere than the root's node: `VERTEX` (all of its instances) or
    /// `VERTEX/INDEX` (one; it wins over its vertex's line) to a node's name.
    #[serde(default)]
    pub place: BTreeMap<String, String>,
    /// The Geneve VNI of the chain's datagrams between its nodes.
    #[serde(default = "default_vni")]
    pub vni: u32,
    /// A node not heard from for this many milliseconds has failed (nodes say hello every
    /// 50 ms when they have nothing else to send). With fault tolerance and a store, the root's
    /// node then replaces that node's instances and replays its log to them; otherwise the
    /// run ends with an error.
    #[serde(default = "default_silence_ms")]
    pub silence_ms: u64,
    /// The root's node may scale vertices out and in, move flows between instances and clone
    /// stragglers while the chain runs (`scale`, `move` and `clone` faults, its control
    /// endpoint): those vertices whose instances, and whose feeders' instances, all run on the
    /// root's node; instances added run there too. Every node is given the same file, so every
    /// node keeps places for added instances and takes order-sensitive NFs' input in entry
    /// order, as a scaled chain needs (docs/decisions.md, "Changes on the root's node").
    #[serde(default)]
    pub scalable: bool,
}

fn default_vni() -> u32 {
    1
}

fn default_silence_ms() -> u64 {
    1_000
}

/// This process's part of a spread chain: the spread every node is given, and which node it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The chain's spread.
    pub spread: Spread,
    /// This node's name in it.
    pub node: String,
}

/// What is wrong with a spread file or with a node's place in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpreadError {
    /// The file is not valid YAML for a spread.
    #[error("spread file: {0}")]
    Parse(String),
    /// A node name that the file does not list.
    #[error("no node `{name}` in the spread file (nodes: {known})")]
    UnknownNode {
        /// The name given.
        name: String,
        /// The nodes listed.
        known: String,
    },
    /// A place for a vertex the chain does not have.
    #[error("the spread places `{0}`, but the chain has no vertex of that name")]
    UnknownVertex(String),
    /// A place for an instance the vertex does not have.
    #[error("the spread places `{vertex}/{index}`, but `{vertex}` has {count} instance(s)")]
    UnknownInstance {
        /// The vertex.
        vertex: String,
        /// The index given.
        index: String,
        /// Its instances.
        count: usize,
    },
    /// Two nodes with one address.
    #[error("nodes `{0}` and `{1}` have the same address")]
    SharedAddress(String, String),
    /// A silence limit outside 100 ms to 10 minutes.
    #[error("silence_ms {0}: give 100 to 600000 (a node says hello every 50 ms)")]
    Silence(u64),
    /// A VNI that does not fit Geneve's 24 bits.
    #[error("vni {0} does not fit Geneve's 24 bits")]
    Vni(u32),
}

impl Spread {
    /// Reads a spread from YAML text.
    pub fn from_yaml(text: &str) -> Result<Spread, SpreadError> {
        let s: Spread = serde_yaml::from_str(text).map_err(|e| SpreadError::Parse(e.to_string()))?;
        s.node_index(&s.root)?;
        for node in s.place.values() {
            s.node_index(node)?;
        }
        if s.vni > (1 << 24) - 1 {
            return Err(SpreadError::Vni(s.vni));
        }
        if !(100..=600_000).contains(&s.silence_ms) {
            return Err(SpreadError::Silence(s.silence_ms));
        }
        let mut by_addr: BTreeMap<SocketAddr, &String> = BTreeMap::new();
        for (name, addr) in &s.nodes {
            if let Some(other) = by_addr.insert(*addr, name) {
                return Err(SpreadError::SharedAddress(other.clone(), name.clone()));
            }
        }
        Ok(s)
    }

    /// The index of node `name` (nodes in name order).
    pub fn node_index(&self, name: &str) -> Result<usize, SpreadError> {
        self.nodes.keys().position(|n| n == name).ok_or_else(|| SpreadError::UnknownNode {
            name: name.to_string(),
            known: self.nodes.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    /// Where each of the chain's instances runs, for node `me`.
    pub(crate) fn layout(&self, me: &str, vertices: &[VertexPlan], slots: usize) -> Result<Layout, SpreadError> {
        let me = self.node_index(me)?;
        let root = self.node_index(&self.root)?;
        let mut node_of = vec![root; slots];
        let mut ids = vec![None; slots];
        for (v, vp) in vertices.iter().enumerate() {
            for (i, g) in vp.instances.iter().chain(&vp.spares).enumerate() {
                if let Some(id) = ids.get_mut(*g) {
                    *id = Some(InstanceId::new(v as u16, i as u16));
                }
            }
        }
        // Whole vertices first, then single instances, which win.
        let mut places: Vec<(&String, &String)> = self.place.iter().collect();
        places.sort_by_key(|(what, _)| what.contains('/'));
        for (what, node) in places {
            let n = self.node_index(node)?;
            let (name, index) = match what.split_once('/') {
                Some((name, index)) => (name, Some(index)),
                None => (what.as_str(), None),
            };
            let vp = vertices
                .iter()
                .find(|vp| &*vp.name == name)
                .ok_or_else(|| SpreadError::UnknownVertex(name.to_string()))?;
            let chosen: Vec<usize> = match index {
                None => vp.instances.clone(),
                Some(i) => {
                    let unknown = || SpreadError::UnknownInstance {
                        vertex: name.to_string(),
                        index: i.to_string(),
                        count: vp.instances.len(),
                    };
                    let i: usize = i.parse().map_err(|_| unknown())?;
                    vec![*vp.instances.get(i).ok_or_else(unknown)?]
                }
            };
            for g in chosen {
                if let Some(slot) = node_of.get_mut(g) {
                    *slot = n;
                }
            }
        }
        Ok(Layout {
            me,
            root,
            names: self.nodes.keys().cloned().collect(),
            addrs: self.nodes.values().copied().collect(),
            node_of,
            ids,
            vni: self.vni,
            silence: std::time::Duration::from_millis(self.silence_ms),
        })
    }
}

/// A spread resolved against the compiled chain, for one node.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// This node.
    pub(crate) me: usize,
    /// The root's node.
    pub(crate) root: usize,
    /// Node names, by index.
    pub(crate) names: Vec<String>,
    /// Node addresses, by index.
    pub(crate) addrs: Vec<SocketAddr>,
    /// By global instance index: its node.
    pub(crate) node_of: Vec<usize>,
    /// By global instance index: its id (vertex, index), as datagrams name it.
    pub(crate) ids: Vec<Option<InstanceId>>,
    /// The chain's VNI.
    pub(crate) vni: u32,
    /// A node silent this long has failed.
    pub(crate) silence: std::time::Duration,
}

impl Layout {
    /// Whether instance `global` runs on this node.
    pub(crate) fn here(&self, global: usize) -> bool {
        self.node_of.get(global).is_none_or(|n| *n == self.me)
    }
    /// Whether this node has the root.
    pub(crate) fn has_root(&self) -> bool {
        self.me == self.root
    }

    /// Whether `vp`'s instances sit on several nodes (and so share its state through a store
    /// they all reach).
    pub(crate) fn is_split(&self, vp: &VertexPlan) -> bool {
        let mut nodes = vp.instances.iter().filter_map(|g| self.node_of.get(*g));
        nodes.next().is_some_and(|first| nodes.any(|n| n != first))
    }

    /// Per vertex, whether this node's record holds its state: the root's node records every
    /// vertex with an instance on it and every split vertex (after the nodes sharing it have
    /// fired their end timers); another node records the vertices that are all its own.
    /// A record's parts then never hold the same state twice (docs/decisions.md).
    pub(crate) fn records_state(&self, vertices: &[VertexPlan]) -> Vec<bool> {
        vertices
            .iter()
            .map(|vp| {
                let here = vp.instances.iter().any(|g| self.here(*g));
                let split = self.is_split(vp);
                if self.has_root() {
                    here || split
                } else {
                    here && !split
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn vertex(name: &str, instances: Vec<usize>) -> VertexPlan {
        VertexPlan {
            name: Arc::from(name),
            kind: "nat".into(),
            instances,
            spares: Vec::new(),
            split: Vec::new(),
            routes: Vec::new(),
            off_path: false,
        }
    }

    const FILE: &str =
        "nodes:\n  a: 127.0.0.1:7001\n  b: 127.0.0.1:7002\nroot: a\nplace:\n  fw: b\n  nat/1: b\n  fw/0: a\n";

    #[test]
    fn instances_go_where_placed_and_stay_with_the_root_otherwise() {
        let s = Spread::from_yaml(FILE).unwrap();
        let vertices = [vertex("nat", vec![0, 1]), vertex("fw", vec![2, 3])];
        let l = s.layout("b", &vertices, 4).unwrap();
        assert_eq!((l.me, l.root, l.vni), (1, 0, 1));
        // nat/0 with the root, nat/1 on b, fw on b except fw/0 (its own line wins).
        assert_eq!(l.node_of, vec![0, 1, 0, 1]);
        assert_eq!(l.ids[3], Some(InstanceId::new(1, 1)));
        assert!(l.here(1) && !l.here(0) && !l.has_root());
    }

    #[test]
    fn bad_spreads_say_what_is_wrong() {
        let vertices = [vertex("nat", vec![0])];
        let s = Spread::from_yaml(FILE).unwrap();
        assert!(matches!(s.layout("c", &vertices, 1), Err(SpreadError::UnknownNode { .. })));
        assert_eq!(s.layout("a", &vertices, 1).unwrap_err(), SpreadError::UnknownVertex("fw".into()));
        let two = [vertex("nat", vec![0]), vertex("fw", vec![1])];
        assert!(matches!(s.layout("a", &two, 2), Err(SpreadError::UnknownInstance { count: 1, .. })));
        let bad = [
            "nodes: {a: 127.0.0.1:1}\nroot: b\n",
            "nodes: {a: 127.0.0.1:1}\nroot: a\nplace: {x: c}\n",
            "nodes: {a: 127.0.0.1:1, b: 127.0.0.1:1}\nroot: a\n",
            "nodes: {a: 127.0.0.1:1}\nroot: a\nvni: 99999999\n",
            "nodes: {a: nowhere}\nroot: a\n",
            "nodes: {a: 127.0.0.1:1}\nroot: a\nextra: 1\n",
            "nodes: {a: 127.0.0.1:1}\nroot: a\nsilence_ms: 5\n",
        ];
        for text in bad {
            assert!(Spread::from_yaml(text).is_err(), "{text}");
        }
    }
}
