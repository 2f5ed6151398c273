//! Chain files: the YAML an operator writes, and its validation with errors that name the
//! file, line and field.
//!
//! ```yaml
//! name: example
//! traffic: "ip"                  # optional traffic class; other packets bypass the chain
//! vertices:
//!   nat:       { type: nat, instances: 1, config: { external_ip: 198.51.100.1 } }
//!   portscan:  { type: portscan }
//!   lb:        { type: lb }
//!   trojan:    { type: trojan }
//! state: { mode: async, store: embedded }   # optional; --mode/--store override it
//! edges:
//!   - { from: input, to: nat }
//!   - { from: nat, to: portscan }
//!   - { from: nat, to: trojan, mirror: true }   # off-path: gets a copy of the NAT's output
//!   - { from: portscan, to: lb, filter: "tcp" }
//!   - { from: lb, to: output }
//! ```

use crate::filter::Filter;
use sluice_packet::HeaderField;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The entry pseudo-vertex name.
pub const INPUT: &str = "input";
/// The exit pseudo-vertex name.
pub const OUTPUT: &str = "output";

/// A chain as written in a chain file.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChainSpec {
    /// Chain name, for reports.
    #[serde(default = "default_name")]
    pub name: String,
    /// Traffic class: a filter selecting the packets the chain applies to. Packets outside it
    /// go straight to the output, untouched.
    #[serde(default)]
    pub traffic: Option<String>,
    /// NF vertices by name, in file order.
    pub vertices: serde_yaml::Mapping,
    /// Edges between vertices, `input` and `output`.
    pub edges: Vec<EdgeSpec>,
    /// Edges for traffic entering on the second interface of a bridge (in port 1), when it
    /// must cross the NFs in another order (e.g. firewall before NAT on the way in). Without
    /// them, traffic from both sides follows `edges`.
    #[serde(default)]
    pub reverse_edges: Option<Vec<EdgeSpec>>,
    /// Where NF state lives, unless the command line says otherwise.
    #[serde(default)]
    pub state: Option<StateSpec>,
}

/// The `state:` section of a chain file.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    /// `local`, `external`, `cached` or `async`.
    #[serde(default)]
    pub mode: Option<String>,
    /// `embedded`, `redis://host:port` or `redis+cluster://host:port,...`.
    #[serde(default)]
    pub store: Option<String>,
}

fn default_name() -> String {
    "chain".to_string()
}

/// One NF vertex.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct VertexSpec {
    /// NF type (`nat`, `lb`, `firewall`, `portscan`, `trojan`, `ids`, `passthrough`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Number of instances.
    #[serde(default = "one")]
    pub instances: u16,
    /// Header fields to partition this vertex's traffic on, overriding the scope-derived
    /// choice (e.g. `[src_ip]`).
    #[serde(default)]
    pub split: Option<Vec<HeaderField>>,
    /// NF-specific configuration.
    #[serde(default)]
    pub config: serde_yaml::Value,
}

fn one() -> u16 {
    1
}

/// One edge.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSpec {
    /// Upstream vertex, or `input`.
    pub from: String,
    /// Downstream vertex, or `output`.
    pub to: String,
    /// Which named output of `from` this edge leaves from (default output when absent).
    #[serde(default)]
    pub output: Option<String>,
    /// Only packets matching this filter take the edge.
    #[serde(default)]
    pub filter: Option<String>,
    /// Off-path: `to` receives a copy, the packet itself goes on along `from`'s other edges.
    #[serde(default)]
    pub mirror: bool,
}

/// A validation error located in the chain file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    /// The file (or `<string>`).
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// Dotted path of the field (`vertices.nat.config.port_range`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// A chain file, parsed and checked: vertices in file order, edges, compiled filters.
#[derive(Debug, Clone)]
pub struct Chain {
    /// Chain name.
    pub name: String,
    /// The traffic class filter.
    pub traffic: Option<Filter>,
    /// Vertices in file order.
    pub vertices: Vec<(String, VertexSpec)>,
    /// Edges with compiled filters.
    pub edges: Vec<Edge>,
    /// Edges for traffic entering on in port 1, if the chain has a separate reverse path.
    pub reverse_edges: Option<Vec<Edge>>,
    /// Where NF state lives, as the chain file asks (the command line may override it).
    pub state: StateSpec,
    /// Where it came from.
    pub source: PathBuf,
}

/// A checked edge.
#[derive(Debug, Clone)]
pub struct Edge {
    /// Upstream: `None` for `input`, else the vertex index.
    pub from: Option<usize>,
    /// Downstream: `None` for `output`, else the vertex index.
    pub to: Option<usize>,
    /// Named output of the upstream NF.
    pub output: Option<String>,
    /// Filter.
    pub filter: Option<Filter>,
    /// Mirror edge.
    pub mirror: bool,
}

impl Chain {
    /// Reads and checks a chain file.
    pub fn load(path: &Path) -> Result<Chain, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|e| SpecError {
            file: path.to_path_buf(),
            line: None,
            field: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Chain::parse(&text, path)
    }

    /// Parses and checks chain-file text; `file` names it in errors.
    pub fn parse(text: &str, file: &Path) -> Result<Chain, SpecError> {
        let err = |path: &[&str], message: String| SpecError {
            file: file.to_path_buf(),
            line: locate(text, path),
            field: path.join("."),
            message,
        };
        let spec: ChainSpec = serde_yaml::from_str(text).map_err(|e| SpecError {
            file: file.to_path_buf(),
            line: e.location().map(|l| l.line()),
            field: String::new(),
            message: e.to_string(),
        })?;
        let registry = sluice_nfs::registry();
        let mut vertices = Vec::new();
        for (k, v) in &spec.vertices {
            let name = match k.as_str() {
                Some(n) => n.to_string(),
                None => return Err(err(&["vertices"], "vertex names must be strings".into())),
            };
            if name == INPUT || name == OUTPUT {
                return Err(err(&["vertices", &name], format!("`{name}` is reserved for the chain's entry/exit")));
            }
            let vs: VertexSpec =
                serde_yaml::from_value(v.clone()).map_err(|e| err(&["vertices", &name], e.to_string()))?;
            if !registry.contains(&vs.kind) {
                let known: Vec<_> = registry.types().map(|(n, _)| n).collect();
                return Err(err(
                    &["vertices", &name, "type"],
                    format!("unknown NF type `{}` (known: {})", vs.kind, known.join(", ")),
                ));
            }
            if vs.instances == 0 {
                return Err(err(&["vertices", &name, "instances"], "must be at least 1".into()));
            }
            vertices.push((name, vs));
        }
        if vertices.is_empty() {
            return Err(err(&["vertices"], "a chain needs at least one vertex".into()));
        }
        let index = |n: &str| vertices.iter().position(|(v, _)| v == n);
        let traffic = match &spec.traffic {
            Some(t) => Some(Filter::parse(t).map_err(|e| err(&["traffic"], e.to_string()))?),
            None => None,
        };
        let edges = check_edges(&spec.edges, "edges", &index, &err)?;
        let reverse_edges = match &spec.reverse_edges {
            Some(r) => Some(check_edges(r, "reverse_edges", &index, &err)?),
            None => None,
        };
        let state = spec.state.unwrap_or_default();
        if let Some(m) = &state.mode {
            if !["local", "external", "cached", "async"].contains(&m.as_str()) {
                return Err(err(&["state", "mode"], format!("mode `{m}` is not local, external, cached or async")));
            }
        }
        if let Some(st) = &state.store {
            let known = ["redis://", "redis+cluster://", "sluice://"];
            if st != "embedded" && !known.iter().any(|k| st.starts_with(k)) {
                return Err(err(
                    &["state", "store"],
                    format!("store `{st}` is not embedded, redis://host:port, redis+cluster://host:port,... or sluice://host:port"),
                ));
            }
        }
        let chain =
            Chain { name: spec.name, traffic, vertices, edges, reverse_edges, state, source: file.to_path_buf() };
        chain.check_graph(text, &chain.edges, "edges", true)?;
        if let Some(r) = &chain.reverse_edges {
            chain.check_graph(text, r, "reverse_edges", false)?;
        }
        Ok(chain)
    }

    /// Checks one edge list: `input` has an edge, vertices are reachable (all of them when
    /// `all_vertices`), on-path vertices lead on, off-path ones do not, and there is no cycle.
    fn check_graph(&self, text: &str, edges: &[Edge], list: &str, all_vertices: bool) -> Result<(), SpecError> {
        let err = |path: &[&str], message: String| SpecError {
            file: self.source.clone(),
            line: locate(text, path),
            field: path.join("."),
            message,
        };
        if !edges.iter().any(|e| e.from.is_none() && !e.mirror) {
            return Err(err(&[list], "no edge leaves `input`".into()));
        }
        // Every vertex must be reachable; vertices fed only by mirror edges are off-path sinks.
        for (vi, (name, _)) in self.vertices.iter().enumerate() {
            let inbound: Vec<&Edge> = edges.iter().filter(|e| e.to == Some(vi)).collect();
            if inbound.is_empty() {
                if !all_vertices {
                    continue;
                }
                return Err(err(&["vertices", name], format!("vertex `{name}` has no incoming edge")));
            }
            let on_path = inbound.iter().any(|e| !e.mirror);
            let outbound = edges.iter().any(|e| e.from == Some(vi) && !e.mirror);
            if on_path && !outbound {
                return Err(err(&["vertices", name], format!("on-path vertex `{name}` has no outgoing edge")));
            }
            if !on_path && outbound {
                return Err(err(
                    &["vertices", name],
                    format!("`{name}` is fed only by mirror edges, so it is off-path and cannot have outgoing edges"),
                ));
            }
        }
        // No cycles (a chain is a DAG).
        let n = self.vertices.len();
        let mut state = vec![0u8; n];
        fn visit(v: usize, edges: &[Edge], state: &mut [u8]) -> bool {
            match state.get(v) {
                Some(1) => return false,
                Some(2) | None => return true,
                _ => {}
            }
            state[v] = 1;
            for e in edges.iter().filter(|e| e.from == Some(v)) {
                if let Some(t) = e.to {
                    if !visit(t, edges, state) {
                        return false;
                    }
                }
            }
            state[v] = 2;
            true
        }
        for v in 0..n {
            if !visit(v, edges, &mut state) {
                return Err(err(&[list], "the edges form a cycle; a chain must be a DAG".into()));
            }
        }
        Ok(())
    }

    /// Vertex names with their indices.
    pub fn vertex_names(&self) -> BTreeMap<&str, usize> {
        self.vertices.iter().enumerate().map(|(i, (n, _))| (n.as_str(), i)).collect()
    }
}

/// Resolves and checks the edges of one list.
fn check_edges(
    specs: &[EdgeSpec],
    list: &str,
    index: &dyn Fn(&str) -> Option<usize>,
    err: &dyn Fn(&[&str], String) -> SpecError,
) -> Result<Vec<Edge>, SpecError> {
    let mut edges = Vec::new();
    for (i, e) in specs.iter().enumerate() {
        let is = i.to_string();
        let at = |field: &str| [list, is.as_str(), field].map(str::to_string);
        let fail = |field: &str, msg: String| {
            let p = at(field);
            err(&[p[0].as_str(), p[1].as_str(), p[2].as_str()], msg)
        };
        let from = match e.from.as_str() {
            INPUT => None,
            OUTPUT => return Err(fail("from", "`output` cannot be an edge's source".into())),
            n => Some(index(n).ok_or_else(|| fail("from", format!("no vertex named `{n}`")))?),
        };
        let to = match e.to.as_str() {
            OUTPUT => None,
            INPUT => return Err(fail("to", "`input` cannot be an edge's target".into())),
            n => Some(index(n).ok_or_else(|| fail("to", format!("no vertex named `{n}`")))?),
        };
        if from.is_some() && from == to {
            return Err(fail("to", "an edge cannot loop on its vertex".into()));
        }
        if e.mirror && to.is_none() {
            return Err(fail("mirror", "a mirror edge must lead to a vertex".into()));
        }
        if e.output.is_some() && from.is_none() {
            return Err(fail("output", "`input` has no named outputs".into()));
        }
        let filter = match &e.filter {
            Some(f) => Some(Filter::parse(f).map_err(|x| fail("filter", x.to_string()))?),
            None => None,
        };
        edges.push(Edge { from, to, output: e.output.clone(), filter, mirror: e.mirror });
    }
    Ok(edges)
}

/// Finds the 1-based line of a field path in YAML text, following indentation: each path
/// element is a mapping key (`key:` / `- key:`) or a sequence index. Inside flow-style values
/// (`{ ... }`) the line holding them is the answer. Returns the deepest line found.
pub fn locate(text: &str, path: &[&str]) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let significant = |l: &str| !l.trim().is_empty() && !l.trim_start().starts_with('#');
    // Indentation of a line's key and the text from the key on ("- a: 1" has its key at +2).
    fn key_of(l: &str) -> (usize, &str) {
        let indent = l.len() - l.trim_start().len();
        let t = l.trim_start();
        match t.strip_prefix("- ") {
            Some(rest) => (indent + 2 + (rest.len() - rest.trim_start().len()), rest.trim_start()),
            None => (indent, t),
        }
    }
    // End of the block that starts at line `h` (exclusive).
    let block_end = |h: usize| {
        let base = indent(lines[h]);
        (h + 1..lines.len()).find(|&j| significant(lines[j]) && indent(lines[j]) <= base).unwrap_or(lines.len())
    };
    let (mut lo, mut hi) = (0usize, lines.len());
    let mut child: Option<usize> = None;
    let mut found: Option<usize> = None;
    for part in path {
        if let Some(f) = found {
            if lines[f].contains('{') || lines[f].contains('[') {
                return Some(f + 1);
            }
        }
        let ci = match child {
            Some(c) => c,
            None => (lo..hi).find(|&j| significant(lines[j])).map(|j| key_of(lines[j]).0)?,
        };
        let hit = if let Ok(idx) = part.parse::<usize>() {
            let item_indent = (lo..hi).find(|&j| significant(lines[j])).map(|j| indent(lines[j]))?;
            (lo..hi)
                .filter(|&j| {
                    let t = lines[j].trim_start();
                    (t.starts_with("- ") || t == "-") && indent(lines[j]) == item_indent
                })
                .nth(idx)
        } else {
            let keys = [format!("{part}:"), format!("\"{part}\":")];
            (lo..hi).find(|&j| {
                let (ki, rest) = key_of(lines[j]);
                ki == ci && keys.iter().any(|k| rest.starts_with(k.as_str()))
            })
        };
        let h = hit?;
        found = Some(h);
        let is_item = lines[h].trim_start().starts_with('-') && part.parse::<usize>().is_ok();
        if is_item {
            lo = h;
            hi = block_end(h);
            child = Some(indent(lines[h]) + 2);
        } else {
            lo = h + 1;
            hi = block_end(h);
            child = None;
        }
    }
    found.map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EX: &str = "name: t\nvertices:\n  nat:\n    type: nat\n    instances: 2\n  fw: { type: firewall }\nedges:\n  - from: input\n    to: nat\n  - { from: nat, to: fw }\n  - from: fw\n    to: output\n    filter: \"tcp\"\n";

    #[test]
    fn locate_finds_nested_fields() {
        assert_eq!(locate(EX, &["vertices", "nat", "instances"]), Some(5));
        assert_eq!(locate(EX, &["vertices", "fw", "type"]), Some(6));
        assert_eq!(locate(EX, &["edges", "1", "to"]), Some(10));
        assert_eq!(locate(EX, &["edges", "2", "filter"]), Some(13));
    }

    #[test]
    fn parses_and_reports_errors_with_lines() {
        let c = Chain::parse(EX, Path::new("x.yaml"));
        assert!(c.is_ok(), "{c:?}");
        let bad = EX.replace("type: firewall", "type: firewal");
        let e = Chain::parse(&bad, Path::new("x.yaml")).err();
        let e = e.as_ref().map(|e| (e.line, e.field.as_str()));
        assert_eq!(e, Some((Some(6), "vertices.fw.type")));
        let bad = EX.replace("to: fw }", "to: fx }");
        let e = Chain::parse(&bad, Path::new("x.yaml")).err().map(|e| (e.line, e.field));
        assert_eq!(e, Some((Some(10), "edges.1.to".to_string())));
        let bad = EX.replace("filter: \"tcp\"", "filter: \"tcp and\"");
        let e = Chain::parse(&bad, Path::new("x.yaml")).err().map(|e| e.line);
        assert_eq!(e, Some(Some(13)));
        let bad = EX.replace("instances: 2", "instances: two");
        let e = Chain::parse(&bad, Path::new("x.yaml")).err();
        assert!(e.is_some_and(|e| e.field == "vertices.nat" && e.line == Some(3)));
    }
}
