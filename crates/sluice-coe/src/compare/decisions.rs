//! Decisions, compared as multisets with subjects renamed.

use super::renaming::Mapping;
use super::{DiffKind, Difference, Sink};
use crate::observed::{Decision, Observed};
use std::collections::{BTreeMap, HashSet};

type DecisionKey = (Option<u64>, String, String, String, String);

pub(super) fn compare_decisions(
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
