//! Outputs: matched by input index, checked for per-flow order, compared frame by frame (see
//! [`super::frames`]), and the unmatched ones reported as lost or duplicated.

use super::frames::compare_frames;
use super::renaming::{Ep, Renaming};
use super::{DiffKind, Difference, Sink};
use crate::observed::{Observed, OutputRecord};
use sluice_packet::{FiveTuple, Headers};
use std::collections::{BTreeMap, HashMap, HashSet};

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

/// Compares the outputs of both runs, input by input: the k-th output of an input in one run
/// against the k-th in the other, then the outputs only one run has.
pub(super) fn compare_outputs(
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
    let mut matcher = Matcher { reference, physical, order: HashMap::new(), conflicts: HashSet::new() };
    let empty = Vec::new();

    for input in inputs {
        let r = rg.get(&input).unwrap_or(&empty);
        let p = pg.get(&input).unwrap_or(&empty);
        for (k, (&ri, &pi)) in r.iter().zip(p.iter()).enumerate() {
            matcher.compare_pair(input, k, ri, pi, renaming, sink);
        }
        report_unmatched(reference, physical, input, r, p, dropped.contains(&input), sink);
    }
}

/// What matching output pairs carries from one pair to the next.
struct Matcher<'a> {
    reference: &'a Observed,
    physical: &'a Observed,
    /// The two directions of a connection are independent streams (a network may reorder one
    /// against the other), and so are packets with equal headers arriving on different ports;
    /// each keeps its order.
    order: HashMap<(u16, Option<FiveTuple>), FlowOrder>,
    /// Endpoint pairs already reported as conflicting with the renaming (each is reported once).
    conflicts: HashSet<Vec<(Ep, Ep)>>,
}

impl Matcher<'_> {
    /// Compares output `k` of `input`: reference output `ri` against physical output `pi`.
    fn compare_pair(&mut self, input: u64, k: usize, ri: usize, pi: usize, renaming: &mut Renaming, sink: &mut Sink) {
        let (ro, po) = (&self.reference.outputs[ri], &self.physical.outputs[pi]);
        let rh = Headers::parse(&ro.bytes);
        let ph = Headers::parse(&po.bytes);
        sink.stats.outputs_compared += 1;
        let diff = |kind, detail| Difference::new(kind, detail).input(input).clock(po.clock).flow(flow_text(&rh));

        // Per-flow order, in reference (input) order.
        let key = (ro.in_port, rh.tuple);
        match self.order.get_mut(&key) {
            None => {
                self.order.insert(key, FlowOrder { max_pos: pi, max_input: input, reported: false });
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
                    if self.conflicts.insert(pairs.clone()) {
                        sink.push(diff(DiffKind::RenamingConflict, why));
                    }
                }
            }
        }
    }
}

/// Reports the outputs of `input` that only one run has (`r` and `p` index the outputs of the
/// input in each run): reference ones as lost, unless the root dropped the input, physical ones
/// as duplicated.
fn report_unmatched(
    reference: &Observed,
    physical: &Observed,
    input: u64,
    r: &[usize],
    p: &[usize],
    root_dropped: bool,
    sink: &mut Sink,
) {
    let counts = || format!("input produced {} output(s) in the reference, {} in the physical run", r.len(), p.len());
    if r.len() > p.len() {
        for &ri in &r[p.len()..] {
            if root_dropped {
                sink.stats.outputs_excused += 1;
                continue;
            }
            let ro = &reference.outputs[ri];
            let rh = Headers::parse(&ro.bytes);
            let detail =
                if p.is_empty() { "reference output missing from the physical run".to_string() } else { counts() };
            sink.push(Difference::new(DiffKind::Lost, detail).input(input).clock(ro.clock).flow(flow_text(&rh)));
        }
    } else if p.len() > r.len() {
        for &pi in &p[r.len()..] {
            let po = &physical.outputs[pi];
            let ph = Headers::parse(&po.bytes);
            let detail = if r.is_empty() {
                "extra output: the input produced no output in the reference".to_string()
            } else {
                counts()
            };
            sink.push(Difference::new(DiffKind::Duplicated, detail).input(input).clock(po.clock).flow(flow_text(&ph)));
        }
    }
}
