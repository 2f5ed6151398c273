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
//!   compared at all when the physical root dropped inputs the reference processed: the state
//!   then legitimately lacks their updates and there is no reference to hold it against
//!   ([`CompareStats::state_compared`]). A recorded run's reference leaves out what its root
//!   dropped (`reference::run_reference_admitted`), so its state is always compared.

mod decisions;
mod frames;
mod outputs;
mod renaming;
mod state;
#[cfg(test)]
mod tests;

use crate::observed::Observed;
use decisions::compare_decisions;
use outputs::compare_outputs;
use renaming::Renaming;
use state::compare_state;
use std::collections::{BTreeMap, HashSet};
use std::fmt::{self, Write as _};

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
    // Inputs the physical root dropped changed its state nowhere: comparable only with a
    // reference that left them out too (a recorded run's; the engine's reference runs first).
    let skipped: HashSet<u64> = reference.root_dropped.iter().copied().collect();
    if physical.root_dropped.iter().all(|i| skipped.contains(i)) {
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
