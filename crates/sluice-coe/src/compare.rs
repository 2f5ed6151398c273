//! The comparison `sluice verify` makes between the reference run (the logical chain: one
//! instance per NF, no faults, packets in entry order) and the physical run (the chain as
//! deployed, under a fault schedule), deciding chain output equivalence.
//!
//! What is compared, and what is allowed to differ:
//!
//! * **Outputs**, grouped by input index. Every reference output must appear in the physical run
//!   as often as in the reference ([`DiffKind::Lost`], [`DiffKind::Duplicated`]), except those of
//!   inputs the physical root reported as dropped (`root_dropped`), which are *excused*. The k-th
//!   output of an input in one run is matched with the k-th output of the same input in the other.
//! * **Order** within each direction of a connection (the reference packet's 5-tuple): the
//!   physical run must emit its outputs in the reference order ([`DiffKind::Reordered`], reported once per
//!   flow). Outputs of different flows may interleave differently.
//! * **Headers**, up to one consistent renaming of allocation choices (NAT ports, load-balancer
//!   backends): matched frames that differ must agree byte for byte everywhere except the source
//!   and destination addresses and ports and the checksums ([`DiffKind::HeaderMismatch`]); every
//!   pair of endpoints (reference endpoint, physical endpoint), identical ones included, joins one
//!   run-wide one-to-one renaming, and a pair contradicting it is a
//!   [`DiffKind::RenamingConflict`]. Each checksum of the physical frame (IPv4 header, TCP, UDP,
//!   ICMP) must be valid wherever the reference frame's is.
//! * **Decisions** as multisets of (input, vertex, kind, subject, detail), with subjects that are
//!   exactly an address or `address:port` renamed; end-of-run events (input index at or past the
//!   number of inputs) are compared without their input index; decisions caused by root-dropped
//!   inputs are excused.
//! * **Final state**, entry by entry, with endpoint-bearing keys and values renamed. It is not
//!   compared at all when the physical root dropped inputs: the state then legitimately lacks
//!   their updates and there is no reference to hold it against ([`CompareStats::state_compared`]).

use crate::observed::{Decision, Observed, OutputRecord, StateEntry};
use sluice_packet::{FiveTuple, FlowKey, Headers, Proto, L3, L4};
use sluice_state::{StateKey, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};

/// How strict the comparison is and how much it reports.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Differences kept in [`Comparison::differences`]; later ones are only counted.
    pub max_differences: usize,
    /// Relative tolerance for `Float` state values.
    pub float_tolerance: f64,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions { max_differences: 1000, float_tolerance: 1e-9 }
    }
}

/// The kind of one difference between the two runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffKind {
    /// A reference output is missing from the physical run.
    Lost,
    /// The physical run emitted an output more often than the reference, or one with no
    /// reference counterpart at all.
    Duplicated,
    /// Two outputs of one flow left the physical run in the opposite order.
    Reordered,
    /// Matched outputs differ beyond endpoints and checksums, or carry a bad checksum.
    HeaderMismatch,
    /// An endpoint pair contradicts the run-wide one-to-one renaming.
    RenamingConflict,
    /// A reference decision is missing from the physical run.
    DecisionMissing,
    /// The physical run took a decision the reference did not.
    DecisionExtra,
    /// A reference state entry is missing from the physical run.
    StateMissing,
    /// The physical run holds a state entry the reference does not.
    StateExtra,
    /// A state entry has a different value.
    StateMismatch,
}

impl DiffKind {
    /// Every kind, in report order.
    pub const ALL: [DiffKind; 10] = [
        DiffKind::Lost,
        DiffKind::Duplicated,
        DiffKind::Reordered,
        DiffKind::HeaderMismatch,
        DiffKind::RenamingConflict,
        DiffKind::DecisionMissing,
        DiffKind::DecisionExtra,
        DiffKind::StateMissing,
        DiffKind::StateExtra,
        DiffKind::StateMismatch,
    ];

    /// The snake_case name, as serialised.
    pub fn name(self) -> &'static str {
        match self {
            DiffKind::Lost => "lost",
            DiffKind::Duplicated => "duplicated",
            DiffKind::Reordered => "reordered",
            DiffKind::HeaderMismatch => "header_mismatch",
            DiffKind::RenamingConflict => "renaming_conflict",
            DiffKind::DecisionMissing => "decision_missing",
            DiffKind::DecisionExtra => "decision_extra",
            DiffKind::StateMissing => "state_missing",
            DiffKind::StateExtra => "state_extra",
            DiffKind::StateMismatch => "state_mismatch",
        }
    }
}

impl fmt::Display for DiffKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One difference between the reference and the physical run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Difference {
    /// What differs.
    pub kind: DiffKind,
    /// The input packet concerned, if any.
    pub input: Option<u64>,
    /// The logical clock of the output concerned (the physical one where there is one).
    pub clock: Option<u64>,
    /// The vertex concerned (decisions and state).
    pub vertex: Option<String>,
    /// The flow concerned, as 5-tuple text.
    pub flow: Option<String>,
    /// Human-readable explanation.
    pub detail: String,
}

impl Difference {
    fn new(kind: DiffKind, detail: String) -> Self {
        Difference { kind, input: None, clock: None, vertex: None, flow: None, detail }
    }
    fn input(mut self, input: u64) -> Self {
        self.input = Some(input);
        self
    }
    fn clock(mut self, clock: u64) -> Self {
        self.clock = Some(clock);
        self
    }
    fn vertex(mut self, vertex: &str) -> Self {
        self.vertex = Some(vertex.to_string());
        self
    }
    fn flow(mut self, flow: Option<String>) -> Self {
        self.flow = flow;
        self
    }
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.kind)?;
        if let Some(i) = self.input {
            write!(f, " input {i}")?;
        }
        if let Some(c) = self.clock {
            write!(f, " clock {c}")?;
        }
        if let Some(v) = &self.vertex {
            write!(f, " at {v}")?;
        }
        if let Some(fl) = &self.flow {
            write!(f, " ({fl})")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// What the comparison looked at, and how many differences of each kind it found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CompareStats {
    /// Outputs of the reference run.
    pub outputs_reference: u64,
    /// Outputs of the physical run.
    pub outputs_physical: u64,
    /// Matched output pairs whose headers were compared.
    pub outputs_compared: u64,
    /// Reference outputs missing from the physical run but excused (their input was dropped by
    /// the root).
    pub outputs_excused: u64,
    /// Endpoints the physical run renamed (pairs of the renaming that are not the identity).
    pub renamed_endpoints: u64,
    /// Reference decisions compared (excused ones not included).
    pub decisions_compared: u64,
    /// Decisions (of either run) excused because the root dropped their input.
    pub decisions_excused: u64,
    /// Reference state entries compared.
    pub state_entries_compared: u64,
    /// Whether final state was compared (not when the physical root dropped inputs).
    pub state_compared: bool,
    /// All differences found, including those beyond `max_differences`.
    pub total_differences: u64,
    /// Differences found per kind, including those beyond `max_differences`.
    pub differences_by_kind: BTreeMap<DiffKind, u64>,
}

/// The verdict of [`compare`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Comparison {
    /// Whether the runs are equivalent (no difference at all).
    pub equivalent: bool,
    /// The first `max_differences` differences, in the order found: outputs (by input index),
    /// decisions, state.
    pub differences: Vec<Difference>,
    /// Whether differences were left out of `differences` (they are still counted in `stats`).
    pub truncated: bool,
    /// Counts.
    pub stats: CompareStats,
}

impl Comparison {
    /// A readable account: the verdict, what was compared, counts per kind and the first ten
    /// differences.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let mut out = String::new();
        let verdict = if self.equivalent { "EQUIVALENT" } else { "NOT EQUIVALENT" };
        let _ = writeln!(out, "chain output equivalence: {verdict}");
        let _ = writeln!(
            out,
            "outputs: {} reference, {} physical, {} compared, {} excused (root-dropped inputs), {} endpoints renamed",
            s.outputs_reference, s.outputs_physical, s.outputs_compared, s.outputs_excused, s.renamed_endpoints
        );
        let _ = writeln!(out, "decisions: {} compared, {} excused", s.decisions_compared, s.decisions_excused);
        if s.state_compared {
            let _ = writeln!(out, "state: {} entries compared", s.state_entries_compared);
        } else {
            let _ = writeln!(out, "state: not compared (the physical root dropped inputs)");
        }
        if s.total_differences == 0 {
            return out;
        }
        let _ = write!(out, "differences: {}", s.total_differences);
        let mut first = true;
        for kind in DiffKind::ALL {
            if let Some(n) = s.differences_by_kind.get(&kind).filter(|n| **n > 0) {
                let _ = write!(out, "{} {kind} {n}", if first { " —" } else { "," });
                first = false;
            }
        }
        out.push('\n');
        for d in self.differences.iter().take(10) {
            let _ = writeln!(out, "  {d}");
        }
        let shown = self.differences.len().min(10) as u64;
        if s.total_differences > shown {
            let _ = writeln!(out, "  ... and {} more", s.total_differences - shown);
        }
        out
    }
}

/// Compares a physical run against the reference run of the same input (see the module docs for
/// the rules).
pub fn compare(reference: &Observed, physical: &Observed, opts: &CompareOptions) -> Comparison {
    let mut sink =
        Sink { kept: Vec::new(), max: opts.max_differences, truncated: false, stats: CompareStats::default() };
    let dropped: HashSet<u64> = physical.root_dropped.iter().copied().collect();
    let mut renaming = Renaming::default();

    compare_outputs(reference, physical, &dropped, &mut renaming, &mut sink);
    let mapping = renaming.finish();
    sink.stats.renamed_endpoints = mapping.renamed;
    compare_decisions(reference, physical, &dropped, &mapping, &mut sink);
    if physical.root_dropped.is_empty() {
        sink.stats.state_compared = true;
        compare_state(&reference.state, &physical.state, &mapping, opts.float_tolerance, &mut sink);
    }

    let Sink { kept, truncated, stats, .. } = sink;
    Comparison { equivalent: stats.total_differences == 0, differences: kept, truncated, stats }
}

/// Collects differences up to the limit and counts all of them.
struct Sink {
    kept: Vec<Difference>,
    max: usize,
    truncated: bool,
    stats: CompareStats,
}

impl Sink {
    fn push(&mut self, d: Difference) {
        *self.stats.differences_by_kind.entry(d.kind).or_insert(0) += 1;
        self.stats.total_differences += 1;
        if self.kept.len() < self.max {
            self.kept.push(d);
        } else {
            self.truncated = true;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Renaming

/// An endpoint: address, port (0 where the protocol has none; the identifier for ICMP echo) and
/// IP protocol number.
type Ep = (IpAddr, u16, u8);

fn ep_text((ip, port, proto): Ep) -> String {
    format!("{} {}", Proto(proto), SocketAddr::new(ip, port))
}

/// The run-wide one-to-one renaming of reference *connections* to physical ones, being built:
/// a NAT may give a connection another port and an LB another backend, but every packet of one
/// reference connection must belong to one physical connection, and no two reference
/// connections to the same one. Each pair remembers the input that first established it.
/// Endpoints are renamed (for state keys and subjects) only where that is unambiguous.
#[derive(Default)]
struct Renaming {
    fwd: HashMap<(Ep, Ep), ((Ep, Ep), u64)>,
    back: HashMap<(Ep, Ep), ((Ep, Ep), u64)>,
    endpoints: HashMap<Ep, Option<Ep>>,
}

fn conn_text((a, b): (Ep, Ep)) -> String {
    format!("{} <> {}", ep_text(a), ep_text(b))
}

impl Renaming {
    /// Adds the endpoint pairs of one matched packet, or explains why its connection
    /// contradicts the pairs so far.
    fn bind(&mut self, pairs: &[(Ep, Ep)], input: u64) -> Result<(), String> {
        for (r, p) in pairs {
            merge(&mut self.endpoints, *r, *p);
        }
        let [(r1, p1), (r2, p2)] = pairs else { return Ok(()) };
        let (r, p) = if r1 <= r2 { ((*r1, *r2), (*p1, *p2)) } else { ((*r2, *r1), (*p2, *p1)) };
        if let Some(&(q, at)) = self.fwd.get(&r) {
            if q != p {
                return Err(format!(
                    "reference connection {} appears as {} here but as {} at input {at}",
                    conn_text(r),
                    conn_text(p),
                    conn_text(q)
                ));
            }
        }
        if let Some(&(s, at)) = self.back.get(&p) {
            if s != r {
                return Err(format!(
                    "physical connection {} stands for reference connection {} here but for {} at input {at}",
                    conn_text(p),
                    conn_text(r),
                    conn_text(s)
                ));
            }
        }
        self.fwd.entry(r).or_insert((p, input));
        self.back.entry(p).or_insert((r, input));
        Ok(())
    }

    fn finish(self) -> Mapping {
        let mut m = Mapping::default();
        for (r, p) in self.endpoints {
            let Some(p) = p else {
                m.ports_renamed = true;
                continue;
            };
            if r != p {
                m.renamed += 1;
            }
            if r.1 != p.1 {
                m.ports_renamed = true;
            }
            merge(&mut m.by_addr_port, (r.0, r.1), (p.0, p.1));
            merge(&mut m.by_ip, r.0, p.0);
            m.exact.insert(r, p);
        }
        m
    }
}

/// Records `k → v`, or marks `k` ambiguous (`None`) when it already maps elsewhere.
fn merge<K: std::hash::Hash + Eq, V: PartialEq>(map: &mut HashMap<K, Option<V>>, k: K, v: V) {
    match map.get_mut(&k) {
        None => {
            map.insert(k, Some(v));
        }
        Some(slot) => {
            if slot.as_ref() != Some(&v) {
                *slot = None;
            }
        }
    }
}

/// The finished renaming, with views for keys and values that lack the protocol or the port.
/// Anything not (unambiguously) in it maps to itself.
#[derive(Default)]
struct Mapping {
    exact: HashMap<Ep, Ep>,
    /// Address and port, over all protocols; `None` if they disagree.
    by_addr_port: HashMap<(IpAddr, u16), Option<(IpAddr, u16)>>,
    /// Address, over all its endpoints; `None` if they do not all map to one address.
    by_ip: HashMap<IpAddr, Option<IpAddr>>,
    renamed: u64,
    ports_renamed: bool,
}

impl Mapping {
    fn endpoint(&self, e: Ep) -> Ep {
        self.exact.get(&e).copied().unwrap_or(e)
    }
    fn addr_port(&self, ip: IpAddr, port: u16) -> (IpAddr, u16) {
        match self.by_addr_port.get(&(ip, port)) {
            Some(Some(x)) => *x,
            _ => (ip, port),
        }
    }
    fn ip(&self, ip: IpAddr) -> IpAddr {
        match self.by_ip.get(&ip) {
            Some(Some(x)) => *x,
            _ => ip,
        }
    }
    fn tuple(&self, t: &FiveTuple) -> FiveTuple {
        let (src, sport, _) = self.endpoint((t.src, t.sport, t.proto.0));
        let (dst, dport, _) = self.endpoint((t.dst, t.dport, t.proto.0));
        FiveTuple { src, dst, sport, dport, proto: t.proto }
    }
    fn flow(&self, k: &FlowKey) -> FlowKey {
        let (src, sport, _) = self.endpoint((k.a.0, k.a.1, k.proto.0));
        let (dst, dport, _) = self.endpoint((k.b.0, k.b.1, k.proto.0));
        if (src, sport, dst, dport) == (k.a.0, k.a.1, k.b.0, k.b.1) {
            // Unchanged: keep the key exactly as the NF built it.
            return *k;
        }
        FlowKey::from(FiveTuple { src, dst, sport, dport, proto: k.proto })
    }
    fn key(&self, k: &StateKey) -> StateKey {
        match k {
            StateKey::Endpoint(ip, port, proto) => {
                let (ip, port, proto) = self.endpoint((*ip, *port, *proto));
                StateKey::Endpoint(ip, port, proto)
            }
            StateKey::Flow(f) => StateKey::Flow(self.flow(f)),
            StateKey::Addr(ip) => StateKey::Addr(self.ip(*ip)),
            StateKey::Unit | StateKey::Id(_) => *k,
        }
    }
    /// A reference value in the physical run's names.
    fn value(&self, v: &Value) -> Value {
        match v {
            Value::Endpoint(ip, port) => {
                let (ip, port) = self.addr_port(*ip, *port);
                Value::Endpoint(ip, port)
            }
            Value::Tuple(t) => Value::Tuple(self.tuple(t)),
            Value::List(l) => Value::List(l.iter().map(|x| self.value(x)).collect()),
            other => other.clone(),
        }
    }
    /// A decision subject in the physical run's names, if it is exactly an address or an
    /// `address:port`.
    fn subject(&self, s: &str) -> String {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return self.ip(ip).to_string();
        }
        if let Ok(sa) = s.parse::<SocketAddr>() {
            let (ip, port) = self.addr_port(sa.ip(), sa.port());
            return SocketAddr::new(ip, port).to_string();
        }
        s.to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Outputs

fn group(outputs: &[OutputRecord]) -> BTreeMap<u64, Vec<usize>> {
    let mut g: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, o) in outputs.iter().enumerate() {
        g.entry(o.input).or_default().push(i);
    }
    g
}

fn flow_text(h: &Headers) -> Option<String> {
    h.tuple.map(|t| t.to_string())
}

/// Per-flow order tracking: the latest physical position seen so far and its input.
struct FlowOrder {
    max_pos: usize,
    max_input: u64,
    reported: bool,
}

fn compare_outputs(
    reference: &Observed,
    physical: &Observed,
    dropped: &HashSet<u64>,
    renaming: &mut Renaming,
    sink: &mut Sink,
) {
    sink.stats.outputs_reference = reference.outputs.len() as u64;
    sink.stats.outputs_physical = physical.outputs.len() as u64;
    let rg = group(&reference.outputs);
    let pg = group(&physical.outputs);
    let mut inputs: Vec<u64> = rg.keys().chain(pg.keys()).copied().collect();
    inputs.sort_unstable();
    inputs.dedup();
    // The two directions of a connection are independent streams (a network may reorder one
    // against the other); each keeps its order.
    let mut order: HashMap<Option<FiveTuple>, FlowOrder> = HashMap::new();
    let mut conflicts: HashSet<Vec<(Ep, Ep)>> = HashSet::new();
    let empty = Vec::new();

    for input in inputs {
        let r = rg.get(&input).unwrap_or(&empty);
        let p = pg.get(&input).unwrap_or(&empty);
        for (k, (&ri, &pi)) in r.iter().zip(p.iter()).enumerate() {
            let (ro, po) = (&reference.outputs[ri], &physical.outputs[pi]);
            let rh = Headers::parse(&ro.bytes);
            let ph = Headers::parse(&po.bytes);
            sink.stats.outputs_compared += 1;
            let diff = |kind, detail| Difference::new(kind, detail).input(input).clock(po.clock).flow(flow_text(&rh));

            // Per-flow order, in reference (input) order.
            let key = rh.tuple;
            match order.get_mut(&key) {
                None => {
                    order.insert(key, FlowOrder { max_pos: pi, max_input: input, reported: false });
                }
                Some(o) if pi < o.max_pos => {
                    if !o.reported {
                        o.reported = true;
                        sink.push(diff(
                            DiffKind::Reordered,
                            format!(
                                "output {k} of input {input} left the physical chain before input {}'s, after it in the reference",
                                o.max_input
                            ),
                        ));
                    }
                }
                Some(o) => {
                    o.max_pos = pi;
                    o.max_input = input;
                }
            }

            match compare_frames(&ro.bytes, &rh, &po.bytes, &ph) {
                Err(why) => sink.push(diff(DiffKind::HeaderMismatch, format!("output {k}: {why}"))),
                Ok(pairs) => {
                    if let Err(why) = renaming.bind(&pairs, input) {
                        if conflicts.insert(pairs.clone()) {
                            sink.push(diff(DiffKind::RenamingConflict, why));
                        }
                    }
                }
            }
        }

        if r.len() > p.len() {
            for &ri in &r[p.len()..] {
                if dropped.contains(&input) {
                    sink.stats.outputs_excused += 1;
                    continue;
                }
                let ro = &reference.outputs[ri];
                let rh = Headers::parse(&ro.bytes);
                let detail = if p.is_empty() {
                    "reference output missing from the physical run".to_string()
                } else {
                    format!("input produced {} output(s) in the reference, {} in the physical run", r.len(), p.len())
                };
                sink.push(Difference::new(DiffKind::Lost, detail).input(input).clock(ro.clock).flow(flow_text(&rh)));
            }
        } else if p.len() > r.len() {
            for &pi in &p[r.len()..] {
                let po = &physical.outputs[pi];
                let ph = Headers::parse(&po.bytes);
                let detail = if r.is_empty() {
                    "extra output: the input produced no output in the reference".to_string()
                } else {
                    format!("input produced {} output(s) in the reference, {} in the physical run", r.len(), p.len())
                };
                sink.push(
                    Difference::new(DiffKind::Duplicated, detail).input(input).clock(po.clock).flow(flow_text(&ph)),
                );
            }
        }
    }
}

/// The endpoint pairs of two frames whose headers agree up to endpoints and checksums.
fn endpoint_pairs(rh: &Headers, ph: &Headers) -> Vec<(Ep, Ep)> {
    match (rh.tuple, ph.tuple) {
        (Some(r), Some(p)) if rh.is_ip() && ph.is_ip() => vec![
            ((r.src, r.sport, r.proto.0), (p.src, p.sport, p.proto.0)),
            ((r.dst, r.dport, r.proto.0), (p.dst, p.dport, p.proto.0)),
        ],
        _ => Vec::new(),
    }
}

/// Compares two matched frames; on success, returns the endpoint pairs they establish.
fn compare_frames(r: &[u8], rh: &Headers, p: &[u8], ph: &Headers) -> Result<Vec<(Ep, Ep)>, String> {
    if r == p {
        return Ok(endpoint_pairs(rh, ph));
    }
    if !rh.is_ip() || !ph.is_ip() {
        return Err(format!(
            "frames differ and are not both parsable IP packets (reference {:?}, physical {:?})",
            rh.status, ph.status
        ));
    }
    if r.len() != p.len() {
        return Err(format!("frame length {} in the physical run, {} in the reference", p.len(), r.len()));
    }
    let layout = |h: &Headers| (h.l3, h.l4, h.l3_off, h.l4_off, h.payload_off, h.fragmented);
    if layout(rh) != layout(ph) {
        return Err(format!(
            "header layout differs: physical {:?}/{:?}, reference {:?}/{:?}",
            ph.l3, ph.l4, rh.l3, rh.l4
        ));
    }
    let ignored = ignored_ranges(rh, r);
    let first_diff = r
        .iter()
        .zip(p.iter())
        .enumerate()
        .find(|(i, (a, b))| a != b && !ignored.iter().any(|(s, e)| (*s..*e).contains(i)));
    if let Some((off, (a, b))) = first_diff {
        return Err(format!(
            "byte {off} ({}) is {b:#04x} in the physical run, {a:#04x} in the reference",
            region(off, rh)
        ));
    }
    let rc = checksums(r, rh);
    let pc = checksums(p, ph);
    for ((name, rv), (_, pv)) in rc.iter().zip(pc.iter()) {
        if *rv == Some(true) && *pv != Some(true) {
            return Err(format!("invalid {name} checksum in the physical run"));
        }
    }
    Ok(endpoint_pairs(rh, ph))
}

/// Byte ranges that may differ between renamed frames: addresses, ports and checksums.
fn ignored_ranges(h: &Headers, frame: &[u8]) -> Vec<(usize, usize)> {
    let l3 = usize::from(h.l3_off);
    let l4 = usize::from(h.l4_off);
    let mut v = Vec::with_capacity(4);
    match h.l3 {
        L3::V4 => {
            v.push((l3 + 10, l3 + 12)); // header checksum
            v.push((l3 + 12, l3 + 20)); // source and destination
        }
        L3::V6 => v.push((l3 + 8, l3 + 40)),
        L3::None => {}
    }
    if h.fragmented {
        return v;
    }
    let icmp_type = frame.get(l4).copied().unwrap_or(0);
    match h.l4 {
        L4::Tcp => {
            v.push((l4, l4 + 4));
            v.push((l4 + 16, l4 + 18));
        }
        L4::Udp => {
            v.push((l4, l4 + 4));
            v.push((l4 + 6, l4 + 8));
        }
        L4::Icmp if matches!(icmp_type, 0 | 8) => v.push((l4 + 2, l4 + 6)), // checksum, identifier
        L4::Icmpv6 if matches!(icmp_type, 128 | 129) => v.push((l4 + 2, l4 + 6)),
        L4::Icmpv6 => v.push((l4 + 2, l4 + 4)), // the pseudo-header covers the addresses
        L4::Icmp | L4::None | L4::Other => {}
    }
    v
}

fn region(off: usize, h: &Headers) -> &'static str {
    let l3 = usize::from(h.l3_off);
    let l4 = usize::from(h.l4_off);
    let pay = usize::from(h.payload_off);
    let end = pay + usize::from(h.payload_len);
    let has_l4 = !h.fragmented && !matches!(h.l4, L4::None | L4::Other);
    if off < l3 {
        "ethernet header"
    } else if off < if has_l4 { l4 } else { pay } {
        "IP header"
    } else if has_l4 && off < pay {
        "transport header"
    } else if off < end {
        "payload"
    } else {
        "trailer"
    }
}

fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Whether each checksum of a frame is valid: `[IPv4 header, transport]`, `None` where there is
/// none (or it cannot be checked).
fn checksums(frame: &[u8], h: &Headers) -> [(&'static str, Option<bool>); 2] {
    let l3 = usize::from(h.l3_off);
    let ip = match h.l3 {
        L3::V4 => frame.get(l3).and_then(|b| {
            let ihl = usize::from(b & 0x0f) * 4;
            frame.get(l3..l3 + ihl).map(|hdr| fold(ones_sum(hdr, 0)) == 0xffff)
        }),
        _ => None,
    };
    let name = match h.l4 {
        L4::Tcp => "TCP",
        L4::Udp => "UDP",
        L4::Icmp => "ICMP",
        L4::Icmpv6 => "ICMPv6",
        L4::None | L4::Other => "transport",
    };
    [("IPv4 header", ip), (name, transport_checksum(frame, h))]
}

fn transport_checksum(frame: &[u8], h: &Headers) -> Option<bool> {
    if h.fragmented || matches!(h.l4, L4::None | L4::Other) {
        return None;
    }
    let t = h.tuple?;
    let l4 = usize::from(h.l4_off);
    let end = usize::from(h.payload_off) + usize::from(h.payload_len);
    let seg = frame.get(l4..end)?;
    if h.l4 == L4::Udp && h.l3 == L3::V4 && seg.get(6..8) == Some(&[0, 0][..]) {
        return Some(true); // no checksum
    }
    let len = seg.len() as u64;
    let mut acc = 0u64;
    if h.l4 != L4::Icmp {
        acc = match (t.src, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => ones_sum(&d.octets(), ones_sum(&s.octets(), 0)),
            (IpAddr::V6(s), IpAddr::V6(d)) => ones_sum(&d.octets(), ones_sum(&s.octets(), 0)),
            _ => return None,
        };
        acc += (len >> 16) + (len & 0xffff) + u64::from(t.proto.0);
    }
    Some(fold(ones_sum(seg, acc)) == 0xffff)
}

// ---------------------------------------------------------------------------------------------
// Decisions

type DecisionKey = (Option<u64>, String, String, String, String);

fn compare_decisions(
    reference: &Observed,
    physical: &Observed,
    dropped: &HashSet<u64>,
    mapping: &Mapping,
    sink: &mut Sink,
) {
    let mut counts: BTreeMap<DecisionKey, (u64, u64)> = BTreeMap::new();
    let key = |d: &Decision, inputs: u64, subject: String| -> DecisionKey {
        // Drops belong to their packet. An alert belongs to what it says: an NF deciding on
        // clocks raises it when the last piece of evidence *arrives*, which under delays may be
        // another packet than in the reference (docs/correctness.md, R4).
        let input = if d.input >= inputs || !d.kind.starts_with("drop:") { None } else { Some(d.input) };
        (input, d.vertex.clone(), d.kind.clone(), subject, d.detail.clone())
    };
    for d in &reference.decisions {
        if dropped.contains(&d.input) {
            sink.stats.decisions_excused += 1;
            continue;
        }
        sink.stats.decisions_compared += 1;
        counts.entry(key(d, reference.inputs, mapping.subject(&d.subject))).or_default().0 += 1;
    }
    for d in &physical.decisions {
        if dropped.contains(&d.input) {
            sink.stats.decisions_excused += 1;
            continue;
        }
        counts.entry(key(d, physical.inputs, d.subject.clone())).or_default().1 += 1;
    }
    for ((input, vertex, kind, subject, detail), (r, p)) in counts {
        if r == p {
            continue;
        }
        let what = if subject.is_empty() && detail.is_empty() {
            kind.clone()
        } else {
            format!("{kind} subject {subject:?} detail {detail:?}")
        };
        let when = if input.is_none() && kind.starts_with("drop:") { " (end of run)" } else { "" };
        let (dk, detail) = if r > p {
            (DiffKind::DecisionMissing, format!("{what}{when}: {r} in the reference, {p} in the physical run"))
        } else {
            (DiffKind::DecisionExtra, format!("{what}{when}: {p} in the physical run, {r} in the reference"))
        };
        let mut d = Difference::new(dk, detail).vertex(&vertex);
        d.input = input;
        sink.push(d);
    }
}

// ---------------------------------------------------------------------------------------------
// State

fn key_text(k: &StateKey) -> String {
    match k {
        StateKey::Unit => "unit".to_string(),
        StateKey::Flow(f) => f.to_string(),
        StateKey::Addr(ip) => ip.to_string(),
        StateKey::Endpoint(ip, port, proto) => ep_text((*ip, *port, *proto)),
        StateKey::Id(n) => format!("#{n}"),
    }
}

fn value_text(v: &Value) -> String {
    let mut s = format!("{v:?}");
    if s.len() > 160 {
        let mut cut = 160;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}

fn floats_close(a: f64, b: f64, tol: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * a.abs().max(b.abs())
}

/// Whether a reference value matches a physical one under the renaming.
fn values_match(r: &Value, p: &Value, m: &Mapping, tol: f64) -> bool {
    match (r, p) {
        (Value::Int(a), Value::Int(b)) => a == b,
        (Value::Float(a), Value::Float(b)) => floats_close(*a, *b, tol),
        (Value::Endpoint(..), Value::Endpoint(..)) | (Value::Tuple(_), Value::Tuple(_)) => m.value(r) == *p,
        (Value::Ints(a), Value::Ints(b)) => a == b,
        (Value::Bytes(a), Value::Bytes(b)) => a == b,
        (Value::List(a), Value::List(b)) => {
            if a.len() != b.len() {
                return false;
            }
            let all_ints = |l: &std::collections::VecDeque<Value>| l.iter().all(|v| matches!(v, Value::Int(_)));
            if m.ports_renamed && all_ints(a) && all_ints(b) {
                return true; // allocation pools: which ports are free depends on the choices made
            }
            let mut ra: Vec<String> = a.iter().map(|v| format!("{:?}", m.value(v))).collect();
            let mut pb: Vec<String> = b.iter().map(|v| format!("{v:?}")).collect();
            ra.sort_unstable();
            pb.sort_unstable();
            ra == pb
        }
        _ => false,
    }
}

fn compare_state(reference: &[StateEntry], physical: &[StateEntry], m: &Mapping, tol: f64, sink: &mut Sink) {
    // Objects recording allocation choices: equivalent when they hold as many values.
    let count = |entries: &[StateEntry]| {
        let mut c: std::collections::BTreeMap<(String, u16), (String, u64)> = std::collections::BTreeMap::new();
        for e in entries.iter().filter(|e| e.allocation) {
            c.entry((e.vertex.clone(), e.object)).or_insert_with(|| (e.object_name.clone(), 0)).1 += 1;
        }
        c
    };
    let (rc, pc) = (count(reference), count(physical));
    for ((vertex, object), (name, n)) in &rc {
        let got = pc.get(&(vertex.clone(), *object)).map_or(0, |v| v.1);
        sink.stats.state_entries_compared += 1;
        if got != *n {
            sink.push(
                Difference::new(
                    DiffKind::StateMismatch,
                    format!("{name} (allocations) holds {got} value(s) in the physical run, {n} in the reference"),
                )
                .vertex(vertex),
            );
        }
    }
    for ((vertex, object), (name, n)) in &pc {
        if !rc.contains_key(&(vertex.clone(), *object)) {
            sink.push(
                Difference::new(
                    DiffKind::StateExtra,
                    format!("{name} (allocations) holds {n} value(s) only in the physical run"),
                )
                .vertex(vertex),
            );
        }
    }
    let reference: Vec<StateEntry> = reference.iter().filter(|e| !e.allocation).cloned().collect();
    let physical: Vec<StateEntry> = physical.iter().filter(|e| !e.allocation).cloned().collect();
    let (reference, physical) = (reference.as_slice(), physical.as_slice());
    let mut phys: HashMap<(&str, u16, StateKey), &StateEntry> =
        physical.iter().map(|e| ((e.vertex.as_str(), e.object, e.key), e)).collect();
    for r in reference {
        sink.stats.state_entries_compared += 1;
        let key = m.key(&r.key);
        let renamed = if key != r.key { format!(" (renamed {})", key_text(&key)) } else { String::new() };
        let what = format!("{}[{}]{renamed}", r.object_name, key_text(&r.key));
        match phys.remove(&(r.vertex.as_str(), r.object, key)) {
            None => sink.push(
                Difference::new(DiffKind::StateMissing, format!("{what} = {} missing", value_text(&r.value)))
                    .vertex(&r.vertex),
            ),
            Some(p) if !values_match(&r.value, &p.value, m, tol) => sink.push(
                Difference::new(
                    DiffKind::StateMismatch,
                    format!(
                        "{what} is {} in the physical run, {} in the reference",
                        value_text(&p.value),
                        value_text(&r.value)
                    ),
                )
                .vertex(&r.vertex),
            ),
            Some(_) => {}
        }
    }
    let mut extra: Vec<&StateEntry> = phys.into_values().collect();
    extra.sort_by(|a, b| (&a.vertex, a.object, a.key).cmp(&(&b.vertex, b.object, b.key)));
    for p in extra {
        sink.push(
            Difference::new(
                DiffKind::StateExtra,
                format!("{}[{}] = {} not in the reference", p.object_name, key_text(&p.key), value_text(&p.value)),
            )
            .vertex(&p.vertex),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;
    use std::collections::VecDeque;

    const CLIENT: [u8; 4] = [10, 0, 0, 1];
    const SERVER: [u8; 4] = [192, 0, 2, 80];

    /// An Ethernet/IPv4/TCP frame with correct checksums.
    fn tcp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(src, dst, 64)
            .tcp(sport, dport, 1000, 65535);
        let mut v = Vec::with_capacity(b.size(payload.len()));
        b.write(&mut v, payload).expect("frame builds");
        v
    }

    fn run(outputs: Vec<(u64, Vec<u8>)>, inputs: u64) -> Observed {
        Observed {
            inputs,
            outputs: outputs
                .into_iter()
                .map(|(input, bytes)| OutputRecord { input, clock: input + 1, bytes })
                .collect(),
            ..Observed::default()
        }
    }

    fn decision(input: u64, kind: &str, subject: &str) -> Decision {
        Decision { input, vertex: "ids".into(), kind: kind.into(), subject: subject.into(), detail: String::new() }
    }

    fn entry(object: u16, key: StateKey, value: Value) -> StateEntry {
        StateEntry { vertex: "nat".into(), object, object_name: format!("obj{object}"), allocation: false, key, value }
    }

    fn kinds(c: &Comparison) -> Vec<DiffKind> {
        c.differences.iter().map(|d| d.kind).collect()
    }

    fn cmp(r: &Observed, p: &Observed) -> Comparison {
        compare(r, p, &CompareOptions::default())
    }

    /// Two flows: A (client port 1111) on inputs 0 and 2, B (port 2222) on inputs 1 and 3.
    fn two_flows() -> Observed {
        run(
            vec![
                (0, tcp(CLIENT, 1111, SERVER, 80, b"a0")),
                (1, tcp(CLIENT, 2222, SERVER, 80, b"b1")),
                (2, tcp(CLIENT, 1111, SERVER, 80, b"a2")),
                (3, tcp(CLIENT, 2222, SERVER, 80, b"b3")),
            ],
            4,
        )
    }

    fn reorder(o: &Observed, order: &[usize]) -> Observed {
        Observed { outputs: order.iter().map(|&i| o.outputs[i].clone()).collect(), ..o.clone() }
    }

    #[test]
    fn identical_runs_are_equivalent() {
        let mut r = two_flows();
        r.decisions = vec![decision(1, "alert", "10.0.0.1"), decision(4, "timeout", "x")];
        r.state = vec![
            entry(0, StateKey::Unit, Value::Int(4)),
            entry(1, StateKey::Unit, Value::List((5000..5003).map(Value::Int).collect())),
            entry(2, StateKey::Endpoint(CLIENT.into(), 1111, 6), Value::Endpoint(SERVER.into(), 80)),
            entry(3, StateKey::Addr(CLIENT.into()), Value::Float(0.25)),
        ];
        let c = cmp(&r, &r);
        assert!(c.equivalent, "{}", c.summary());
        assert_eq!(c.stats.outputs_compared, 4);
        assert_eq!(c.stats.decisions_compared, 2);
        assert_eq!(c.stats.state_entries_compared, 4);
        assert!(c.stats.state_compared);
        assert_eq!(c.stats.renamed_endpoints, 0);
        assert!(c.summary().contains("EQUIVALENT"));
    }

    #[test]
    fn lost_output_is_reported() {
        let r = two_flows();
        let p = reorder(&r, &[0, 1, 3]);
        let c = cmp(&r, &p);
        assert!(!c.equivalent);
        assert_eq!(kinds(&c), vec![DiffKind::Lost]);
        assert_eq!(c.differences[0].input, Some(2));
        assert!(c.summary().contains("lost 1"), "{}", c.summary());
    }

    #[test]
    fn duplicate_and_extra_outputs_are_reported() {
        let r = two_flows();
        let mut p = reorder(&r, &[0, 1, 1, 2, 3]);
        p.outputs.push(OutputRecord { input: 7, clock: 8, bytes: tcp(CLIENT, 3333, SERVER, 80, b"x") });
        let c = cmp(&r, &p);
        assert_eq!(kinds(&c), vec![DiffKind::Duplicated, DiffKind::Duplicated]);
        assert_eq!(c.differences[0].input, Some(1));
        assert!(c.differences[1].detail.contains("extra"));
    }

    #[test]
    fn per_flow_reorder_detected_cross_flow_interleaving_accepted() {
        let r = two_flows();
        // Flow B before flow A, but each flow in order.
        let c = cmp(&r, &reorder(&r, &[1, 3, 0, 2]));
        assert!(c.equivalent, "{}", c.summary());
        // Input 2 before input 0: flow A inverted.
        let c = cmp(&r, &reorder(&r, &[2, 1, 0, 3]));
        assert_eq!(kinds(&c), vec![DiffKind::Reordered]);
        assert_eq!(c.differences[0].input, Some(2));
        assert!(c.differences[0].flow.as_deref().is_some_and(|f| f.contains("1111")));
    }

    #[test]
    fn consistent_nat_renaming_is_accepted() {
        let r = run(
            vec![
                (0, tcp(CLIENT, 5000, SERVER, 80, b"hello")),
                (1, tcp(SERVER, 80, CLIENT, 5000, b"reply")),
                (2, tcp(CLIENT, 5000, SERVER, 80, b"again")),
            ],
            3,
        );
        let p = run(
            vec![
                (0, tcp(CLIENT, 6000, SERVER, 80, b"hello")),
                (1, tcp(SERVER, 80, CLIENT, 6000, b"reply")),
                (2, tcp(CLIENT, 6000, SERVER, 80, b"again")),
            ],
            3,
        );
        let c = cmp(&r, &p);
        assert!(c.equivalent, "{}", c.summary());
        assert_eq!(c.stats.renamed_endpoints, 1);
    }

    #[test]
    fn inconsistent_renaming_is_a_conflict() {
        let r = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"a")), (1, tcp(CLIENT, 5000, SERVER, 80, b"b"))], 2);
        // One reference endpoint, two physical ones.
        let p = run(vec![(0, tcp(CLIENT, 6000, SERVER, 80, b"a")), (1, tcp(CLIENT, 6001, SERVER, 80, b"b"))], 2);
        let c = cmp(&r, &p);
        assert_eq!(kinds(&c), vec![DiffKind::RenamingConflict]);
        assert_eq!(c.differences[0].input, Some(1));
        // Two reference endpoints, one physical one.
        let r = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"a")), (1, tcp(CLIENT, 5001, SERVER, 80, b"b"))], 2);
        let p = run(vec![(0, tcp(CLIENT, 6000, SERVER, 80, b"a")), (1, tcp(CLIENT, 6000, SERVER, 80, b"b"))], 2);
        let c = cmp(&r, &p);
        assert_eq!(kinds(&c), vec![DiffKind::RenamingConflict]);
    }

    #[test]
    fn payload_difference_is_a_header_mismatch() {
        let r = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"hello"))], 1);
        let p = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"hellO"))], 1);
        let c = cmp(&r, &p);
        assert_eq!(kinds(&c), vec![DiffKind::HeaderMismatch]);
        assert!(c.differences[0].detail.contains("payload"), "{}", c.differences[0].detail);
    }

    #[test]
    fn bad_checksum_is_detected() {
        let frame = tcp(CLIENT, 5000, SERVER, 80, b"hello");
        let r = run(vec![(0, frame.clone())], 1);
        // Rename the source port without fixing the TCP checksum.
        let mut bad = frame;
        bad[34..36].copy_from_slice(&6000u16.to_be_bytes());
        let c = cmp(&r, &run(vec![(0, bad.clone())], 1));
        assert_eq!(kinds(&c), vec![DiffKind::HeaderMismatch]);
        assert!(c.differences[0].detail.contains("TCP checksum"), "{}", c.differences[0].detail);
        // Corrupt the IPv4 header checksum instead (the ports renamed properly).
        let mut bad = tcp(CLIENT, 6000, SERVER, 80, b"hello");
        bad[24] ^= 0xff;
        let c = cmp(&r, &run(vec![(0, bad)], 1));
        assert_eq!(kinds(&c), vec![DiffKind::HeaderMismatch]);
        assert!(c.differences[0].detail.contains("IPv4 header checksum"), "{}", c.differences[0].detail);
    }

    #[test]
    fn root_dropped_inputs_are_excused() {
        let mut r = two_flows();
        r.decisions = vec![decision(1, "alert", "10.0.0.1")];
        r.state = vec![entry(0, StateKey::Unit, Value::Int(4))];
        let mut p = reorder(&r, &[0, 2, 3]);
        p.decisions.clear();
        p.state = vec![entry(0, StateKey::Unit, Value::Int(3))];
        p.root_dropped = vec![1];
        let c = cmp(&r, &p);
        assert!(c.equivalent, "{}", c.summary());
        assert_eq!(c.stats.outputs_excused, 1);
        assert_eq!(c.stats.decisions_excused, 1);
        assert!(!c.stats.state_compared);
        assert!(c.summary().contains("not compared"));
    }

    #[test]
    fn decisions_missing_and_extra() {
        let mut r = two_flows();
        r.decisions = vec![decision(0, "alert", "10.0.0.1"), decision(2, "drop:blocked", "")];
        let mut p = r.clone();
        p.decisions = vec![decision(0, "alert", "10.0.0.2"), decision(2, "drop:blocked", "")];
        let c = cmp(&r, &p);
        assert_eq!(kinds(&c), vec![DiffKind::DecisionMissing, DiffKind::DecisionExtra]);
        assert_eq!(c.differences[0].vertex.as_deref(), Some("ids"));
    }

    #[test]
    fn decision_subjects_are_renamed_and_end_of_run_events_ignore_input() {
        let ext = [198, 51, 100, 1];
        let mut r = run(vec![(0, tcp(ext, 5000, SERVER, 80, b"a"))], 1);
        let mut p = run(vec![(0, tcp(ext, 6000, SERVER, 80, b"a"))], 1);
        r.decisions = vec![decision(0, "alert", "198.51.100.1:5000"), decision(1, "expire", "x")];
        p.decisions = vec![decision(0, "alert", "198.51.100.1:6000"), decision(5, "expire", "x")];
        let c = cmp(&r, &p);
        assert!(c.equivalent, "{}", c.summary());
    }

    #[test]
    fn state_counter_mismatch_missing_extra() {
        let mut r = two_flows();
        r.state = vec![entry(0, StateKey::Unit, Value::Int(4)), entry(1, StateKey::Id(1), Value::Int(1))];
        let mut p = r.clone();
        p.state = vec![entry(0, StateKey::Unit, Value::Int(3)), entry(1, StateKey::Id(2), Value::Int(1))];
        let c = cmp(&r, &p);
        assert_eq!(kinds(&c), vec![DiffKind::StateMismatch, DiffKind::StateMissing, DiffKind::StateExtra]);
    }

    #[test]
    fn state_keys_and_values_are_renamed() {
        let ext = [198, 51, 100, 1];
        let mut r = run(vec![(0, tcp(ext, 5000, SERVER, 80, b"a"))], 1);
        let mut p = run(vec![(0, tcp(ext, 6000, SERVER, 80, b"a"))], 1);
        let flow = |port| FiveTuple { src: ext.into(), dst: SERVER.into(), sport: port, dport: 80, proto: Proto::TCP };
        r.state = vec![
            entry(0, StateKey::Endpoint(ext.into(), 5000, 6), Value::Endpoint(CLIENT.into(), 1234)),
            entry(1, StateKey::Flow(flow(5000).flow_key()), Value::Tuple(flow(5000))),
            entry(2, StateKey::Id(0), Value::Endpoint(ext.into(), 5000)),
        ];
        p.state = vec![
            entry(0, StateKey::Endpoint(ext.into(), 6000, 6), Value::Endpoint(CLIENT.into(), 1234)),
            entry(1, StateKey::Flow(flow(6000).flow_key()), Value::Tuple(flow(6000))),
            entry(2, StateKey::Id(0), Value::Endpoint(ext.into(), 6000)),
        ];
        let c = cmp(&r, &p);
        assert!(c.equivalent, "{}", c.summary());
        p.state[2].value = Value::Endpoint(ext.into(), 5000);
        assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::StateMismatch]);
    }

    #[test]
    fn port_pool_compared_by_length_when_ports_renamed() {
        let pool = |ports: &[i64]| Value::List(ports.iter().map(|&p| Value::Int(p)).collect::<VecDeque<_>>());
        let mut r = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"a"))], 1);
        let mut p = run(vec![(0, tcp(CLIENT, 5001, SERVER, 80, b"a"))], 1);
        r.state = vec![entry(0, StateKey::Unit, pool(&[5001, 5002]))];
        p.state = vec![entry(0, StateKey::Unit, pool(&[5002, 5000]))];
        assert!(cmp(&r, &p).equivalent);
        p.state = vec![entry(0, StateKey::Unit, pool(&[5002]))];
        assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::StateMismatch]);
        // Without renamed ports the pool's contents must agree (as a multiset).
        let mut p = r.clone();
        p.state = vec![entry(0, StateKey::Unit, pool(&[5002, 5001]))];
        assert!(cmp(&r, &p).equivalent);
        p.state = vec![entry(0, StateKey::Unit, pool(&[5002, 5003]))];
        assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::StateMismatch]);
    }

    #[test]
    fn floats_within_tolerance() {
        let mut r = two_flows();
        r.state = vec![entry(0, StateKey::Unit, Value::Float(0.3))];
        let mut p = r.clone();
        p.state = vec![entry(0, StateKey::Unit, Value::Float(0.1 + 0.2))];
        assert!(cmp(&r, &p).equivalent);
        p.state = vec![entry(0, StateKey::Unit, Value::Float(0.3001))];
        assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::StateMismatch]);
    }

    #[test]
    fn differences_beyond_the_limit_are_counted() {
        let r = two_flows();
        let p = run(Vec::new(), 4);
        let c = compare(&r, &p, &CompareOptions { max_differences: 1, ..CompareOptions::default() });
        assert!(c.truncated);
        assert_eq!(c.differences.len(), 1);
        assert_eq!(c.stats.total_differences, 4);
        assert_eq!(c.stats.differences_by_kind.get(&DiffKind::Lost), Some(&4));
        assert!(c.summary().contains("lost 4"));
        let json = serde_json::to_string(&c).expect("serialises");
        assert!(json.contains("\"lost\""), "{json}");
    }

    #[test]
    fn ipv6_udp_and_icmp_echo_renaming_accepted() {
        let eth = || PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let (a, b) = (
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        );
        let udp6 = |sport: u16| {
            let bld = eth().ipv6(a, b, 64).udp(sport, 53);
            let mut v = Vec::new();
            bld.write(&mut v, b"query").expect("frame builds");
            v
        };
        let echo = |id: u16| {
            let bld = eth().ipv4(CLIENT, SERVER, 64).icmpv4_echo_request(id, 1);
            let mut v = Vec::new();
            bld.write(&mut v, b"ping").expect("frame builds");
            v
        };
        let r = run(vec![(0, udp6(4000)), (1, echo(7))], 2);
        let p = run(vec![(0, udp6(4001)), (1, echo(8))], 2);
        let c = cmp(&r, &p);
        assert!(c.equivalent, "{}", c.summary());
        // UDP source, and the echo identifier on both sides (it stands for both ports).
        assert_eq!(c.stats.renamed_endpoints, 3);
        let mut bad = udp6(4001);
        let n = bad.len();
        bad[n - 1] ^= 1;
        let c = cmp(&run(vec![(0, udp6(4000))], 1), &run(vec![(0, bad)], 1));
        assert_eq!(kinds(&c), vec![DiffKind::HeaderMismatch]);
    }

    #[test]
    fn garbage_frames_do_not_panic() {
        let r = run(vec![(0, vec![1, 2, 3]), (1, vec![0; 20])], 2);
        let p = run(vec![(0, vec![1, 2, 4]), (1, vec![0; 20])], 2);
        assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::HeaderMismatch]);
    }
}
