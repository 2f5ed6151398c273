//! Verifying a run of the threaded runtime (`sluice run --record DIR`, then `sluice verify
//! --recorded DIR`): the run's record says which clock the root stamped on every input packet,
//! which clock every output packet carried, what the NFs dropped and decided, and the final
//! state. Turned into an [`Observed`] keyed by input packet, it is compared with the logical
//! chain's run over the same input, exactly as the virtual-time engine's runs are.
//!
//! A record directory holds `chain.yaml` (the chain that ran), `input.pcap` (every packet the
//! root read, in order, nanosecond timestamps), `output.pcap` (the chain's output, in order)
//! and `record.json` (a [`RunRecord`]). Reading and writing the files is the caller's; this
//! module owns the format and the comparison.

use crate::compare::{compare, CompareOptions, Comparison};
use crate::observed::{Decision, Observed, OutputRecord, StateEntry};
use crate::reference::{drop_decision, run_reference_admitted, run_reference_closed_loop};
use sluice_nf::{Event, NfRegistry};
use sluice_packet::{Clock, Packet};
use sluice_runtime::record::Recording;
use sluice_runtime::{compile, Chain, PlanError};
use sluice_state::{StateKey, Value};
use std::collections::HashMap;

/// The version of [`RunRecord`] this build writes and reads.
pub const RECORD_VERSION: u32 = 1;

/// What a recorded run keeps besides its frames (`record.json`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// The chain's name.
    pub chain: String,
    /// Per packet of `input.pcap`, in order: the clock the root stamped, or `null` where the
    /// root dropped it (malformed, truncated, window full).
    pub admitted: Vec<Option<u64>>,
    /// Per packet of `input.pcap`: the port it arrived on (a bridge's second interface is 1).
    /// Empty when every packet arrived on port 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_ports: Vec<u16>,
    /// The input came from hosts that answered what the chain sent (a live bridge): its
    /// replies carry the physical chain's choices, which `verify` translates to the logical
    /// chain's ([`crate::reference::run_reference_closed_loop`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closed_loop: bool,
    /// Per packet of `output.pcap`, in order: its clock.
    pub outputs: Vec<u64>,
    /// Packets dropped inside the chain.
    pub drops: Vec<RecordedDrop>,
    /// The NFs' events (alerts, blocks, detections).
    pub events: Vec<RecordedEvent>,
    /// The last clock the root stamped (timers fired at the end of the run carry it).
    pub end_clock: u64,
    /// The final state.
    pub state: Vec<RecordedState>,
    /// On a node without the root of a chain spread over several (`sluice run --spread
    /// --node N --record DIR`): the node's name. Such a record holds that node's part — its
    /// instances' drops and events, its vertices' final state — and no input, admissions or
    /// output; `verify` folds it into the root's node's record ([`RunRecord::merge_part`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
}

/// A packet dropped inside the chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RecordedDrop {
    /// Its clock.
    pub clock: u64,
    /// The vertex (`input`: no route from the root).
    pub vertex: String,
    /// Why.
    pub reason: String,
}

/// An NF's event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RecordedEvent {
    /// The clock of the packet that caused it.
    pub clock: u64,
    /// The vertex.
    pub vertex: String,
    /// The kind (`alert`, `trojan`, ...).
    pub kind: String,
    /// What it is about.
    pub subject: String,
    /// Detail.
    pub detail: String,
}

/// One line of a node's journal (`journal.jsonl` in its record directory): what a node of a
/// recorded spread run wrote as it went, one JSON object a line, so that a node killed during
/// the run leaves its drops and events behind ([`RunRecord::merge_journal`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JournalLine {
    /// The first line: which chain and node wrote it.
    Node {
        /// The chain's name.
        chain: String,
        /// The node's name in the spread file.
        node: String,
    },
    /// A copy dropped.
    Drop(RecordedDrop),
    /// A decision.
    Event(RecordedEvent),
}

impl From<&Event> for RecordedEvent {
    fn from(e: &Event) -> RecordedEvent {
        RecordedEvent {
            clock: e.clock.0,
            vertex: e.nf.clone(),
            kind: e.kind.to_string(),
            subject: e.subject.clone(),
            detail: e.detail.clone(),
        }
    }
}

/// One value of the final state.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RecordedState {
    /// The vertex's index in the chain.
    pub vertex: usize,
    /// The object's index among the NF's objects.
    pub object: u16,
    /// The key.
    pub key: StateKey,
    /// The value.
    pub value: Value,
}

/// Why a record cannot be verified.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Another version of the format.
    #[error("record version {found}, this build reads version {RECORD_VERSION}")]
    Version {
        /// The record's version.
        found: u32,
    },
    /// The record and its frames disagree.
    #[error("the record does not match its frames: {0}")]
    Mismatch(String),
    /// The chain does not compile.
    #[error("chain: {0}")]
    Chain(#[from] PlanError),
}

impl RunRecord {
    /// Folds in the journal (`journal.jsonl`, [`JournalLine`]s) of a node of the same spread
    /// run that was killed before it wrote its part: its drops and events that this record
    /// does not hold already (the failed node's replacement redid what the root's log still
    /// held, deciding the same again). Its vertices' state is the replacement's, in this
    /// record. Returns the node's name. A last line cut short (the node killed while writing
    /// it) is left out; any other bad line is an error.
    pub fn merge_journal(&mut self, text: &str) -> Result<String, RecordError> {
        let mut lines = text.split_inclusive('\n').enumerate().peekable();
        let node = match lines.next().map(|(_, l)| serde_json::from_str::<JournalLine>(l)) {
            Some(Ok(JournalLine::Node { chain, node })) if chain == self.chain => node,
            Some(Ok(JournalLine::Node { chain, node })) => {
                return Err(RecordError::Mismatch(format!(
                    "node `{node}`'s journal is of chain `{chain}`, the root's record of `{}`",
                    self.chain
                )))
            }
            _ => return Err(RecordError::Mismatch("a journal starts with the line naming its chain and node".into())),
        };
        let mut drops: std::collections::HashSet<RecordedDrop> = self.drops.iter().cloned().collect();
        let mut events: std::collections::HashSet<RecordedEvent> = self.events.iter().cloned().collect();
        while let Some((i, line)) = lines.next() {
            let cut = lines.peek().is_none() && !line.ends_with('\n');
            match serde_json::from_str::<JournalLine>(line) {
                Ok(JournalLine::Drop(d)) => {
                    if drops.insert(d.clone()) {
                        self.drops.push(d);
                    }
                }
                Ok(JournalLine::Event(e)) => {
                    if events.insert(e.clone()) {
                        self.events.push(e);
                    }
                }
                Err(_) if cut => {}
                _ => {
                    return Err(RecordError::Mismatch(format!(
                        "node `{node}`'s journal, line {}: not a drop or an event",
                        i + 1
                    )))
                }
            }
        }
        Ok(node)
    }

    /// Folds the record `part` of another node of the same spread run into this one (the root's
    /// node's): its drops, events and state. Refused when it is not a part, is of another chain
    /// or run (another end clock), or holds state this record holds too.
    pub fn merge_part(&mut self, part: RunRecord) -> Result<(), RecordError> {
        if part.version != RECORD_VERSION {
            return Err(RecordError::Version { found: part.version });
        }
        let Some(node) = part.part else {
            return Err(RecordError::Mismatch(
                "a second record of a root's node: give one root's record and its nodes' parts".into(),
            ));
        };
        if self.part.is_some() {
            return Err(RecordError::Mismatch("the first record must be the root's node's".into()));
        }
        if part.chain != self.chain || part.end_clock != self.end_clock {
            return Err(RecordError::Mismatch(format!(
                "node `{node}`'s part is of chain `{}` ending at clock {}, the root's record of `{}` ending at {}: not the same run",
                part.chain, part.end_clock, self.chain, self.end_clock
            )));
        }
        let held: std::collections::HashSet<(usize, u16, StateKey)> =
            self.state.iter().map(|s| (s.vertex, s.object, s.key)).collect();
        if let Some(s) = part.state.iter().find(|s| held.contains(&(s.vertex, s.object, s.key))) {
            return Err(RecordError::Mismatch(format!(
                "node `{node}`'s part holds state of vertex {} the root's record holds too (key {:?})",
                s.vertex, s.key
            )));
        }
        self.drops.extend(part.drops);
        self.events.extend(part.events);
        self.state.extend(part.state);
        Ok(())
    }

    /// The record of a run: the runtime's `recording`, its `events`, the clock of every
    /// output packet in order, and the input ports (empty if all were 0).
    pub fn new(chain: &str, rec: &Recording, events: &[Event], outputs: Vec<u64>, in_ports: Vec<u16>) -> RunRecord {
        RunRecord {
            version: RECORD_VERSION,
            chain: chain.to_string(),
            admitted: rec.admitted.iter().map(|c| c.map(|c| c.0)).collect(),
            in_ports,
            closed_loop: false,
            outputs,
            drops: rec
                .drops
                .iter()
                .map(|d| RecordedDrop { clock: d.clock.0, vertex: d.vertex.clone(), reason: d.reason.to_string() })
                .collect(),
            events: events.iter().map(RecordedEvent::from).collect(),
            end_clock: rec.end.0,
            part: None,
            state: rec
                .state
                .iter()
                .map(|s| RecordedState { vertex: s.vertex, object: s.object, key: s.key, value: s.value.clone() })
                .collect(),
        }
    }

    /// What the run produced, keyed by input packet, for `chain` (which names the vertices and
    /// their objects). `outputs` are the frames of `output.pcap`, in order.
    pub fn observed(
        &self,
        chain: &Chain,
        registry: &NfRegistry,
        outputs: Vec<Vec<u8>>,
    ) -> Result<Observed, RecordError> {
        if self.version != RECORD_VERSION {
            return Err(RecordError::Version { found: self.version });
        }
        if outputs.len() != self.outputs.len() {
            return Err(RecordError::Mismatch(format!(
                "{} output frames, {} output clocks",
                outputs.len(),
                self.outputs.len()
            )));
        }
        let inputs = self.admitted.len() as u64;
        let input_of: HashMap<u64, u64> =
            self.admitted.iter().enumerate().filter_map(|(i, c)| c.map(|c| (c, i as u64))).collect();
        // Timer events at the end of the run belong to no packet (the reference does the same).
        let input =
            |clock: u64| if clock == self.end_clock { inputs } else { input_of.get(&clock).copied().unwrap_or(inputs) };
        let mut obs = Observed { inputs, ..Observed::default() };
        obs.root_dropped =
            self.admitted.iter().enumerate().filter(|(_, c)| c.is_none()).map(|(i, _)| i as u64).collect();
        for (clock, bytes) in self.outputs.iter().zip(outputs) {
            let Some(&i) = input_of.get(clock) else {
                return Err(RecordError::Mismatch(format!(
                    "an output packet carries clock {clock}, which no input had"
                )));
            };
            let in_port = usize::try_from(i).ok().and_then(|i| self.in_ports.get(i)).copied().unwrap_or(0);
            obs.outputs.push(OutputRecord { input: i, clock: *clock, in_port, bytes });
        }
        // A drop is always a packet's (the last one's too).
        let packet = |clock: u64| input_of.get(&clock).copied().unwrap_or(inputs);
        obs.decisions.extend(self.drops.iter().map(|d| drop_decision(packet(d.clock), &d.vertex, &d.reason)));
        obs.decisions.extend(self.events.iter().map(|e| Decision {
            input: input(e.clock),
            vertex: e.vertex.clone(),
            kind: e.kind.clone(),
            subject: e.subject.clone(),
            detail: e.detail.clone(),
        }));
        obs.decisions.sort();
        let plan = compile(chain, registry, &[])?;
        let mut decls: HashMap<usize, Vec<sluice_state::StateDecl>> = HashMap::new();
        for (v, inst) in &plan.instances {
            decls.entry(*v).or_insert_with(|| inst.nf().state_objects().to_vec());
        }
        for s in &self.state {
            let Some(vp) = plan.vertices.get(s.vertex) else {
                return Err(RecordError::Mismatch(format!(
                    "state of vertex {}, which the chain does not have",
                    s.vertex
                )));
            };
            let decl = decls.get(&s.vertex).and_then(|d| d.get(usize::from(s.object)));
            obs.state.push(StateEntry {
                vertex: vp.name.to_string(),
                object: s.object,
                object_name: decl.map_or("?", |d| d.name).to_string(),
                allocation: decl.is_some_and(|d| d.allocation),
                key: s.key,
                value: s.value.clone(),
            });
        }
        obs.state.sort_by(|a, b| (&a.vertex, a.object, a.key).cmp(&(&b.vertex, b.object, b.key)));
        Ok(obs)
    }

    /// Puts each input packet's port back (a pcap file does not keep it).
    pub fn restore_ports(&self, inputs: &mut [Packet]) {
        for (p, port) in inputs.iter_mut().zip(&self.in_ports) {
            p.meta.in_port = *port;
        }
    }
}

/// The verdict on a recorded run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecordedVerdict {
    /// The chain.
    pub chain: String,
    /// Input packets.
    pub inputs: u64,
    /// Output packets of the logical chain.
    pub reference_outputs: u64,
    /// Output packets of the recorded run.
    pub recorded_outputs: u64,
    /// Whether the recorded run is equivalent to the logical chain's.
    pub equivalent: bool,
    /// Every difference found.
    pub comparison: Comparison,
}

impl RecordedVerdict {
    /// A readable report.
    pub fn render(&self) -> String {
        format!(
            "verify --recorded {}: {} input packets\n  reference: {} packets out; recorded run: {} packets out\n{}\n{}\n",
            self.chain,
            self.inputs,
            self.reference_outputs,
            self.recorded_outputs,
            self.comparison.summary(),
            if self.equivalent { "EQUIVALENT" } else { "NOT EQUIVALENT" }
        )
    }
}

/// Compares a recorded run (`record`, its input packets with their ports restored, its output
/// frames) with the logical chain's run over the same input.
pub fn verify_recorded(
    chain: &Chain,
    registry: &NfRegistry,
    record: &RunRecord,
    inputs: &[Packet],
    outputs: Vec<Vec<u8>>,
    opts: &CompareOptions,
) -> Result<RecordedVerdict, RecordError> {
    if inputs.len() != record.admitted.len() {
        return Err(RecordError::Mismatch(format!(
            "{} input packets, {} input clocks",
            inputs.len(),
            record.admitted.len()
        )));
    }
    let recorded = record.observed(chain, registry, outputs)?;
    let reference = if record.closed_loop {
        run_reference_closed_loop(chain, registry, inputs, &recorded)?
    } else {
        run_reference_admitted(chain, registry, inputs, &recorded.root_dropped)?
    };
    let comparison = compare(&reference, &recorded, opts);
    Ok(RecordedVerdict {
        chain: chain.name.clone(),
        inputs: inputs.len() as u64,
        reference_outputs: reference.outputs.len() as u64,
        recorded_outputs: recorded.outputs.len() as u64,
        equivalent: comparison.equivalent,
        comparison,
    })
}

/// The clock of a packet as the record keeps it.
pub fn clock_of(p: &Packet) -> u64 {
    let Clock(c) = p.meta.clock;
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn chain() -> Chain {
        let yaml = "name: t\nvertices:\n  nat:\n    type: nat\n    config: { external_ip: 198.51.100.1, internal: [\"10.0.0.0/8\"] }\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: output }\n";
        Chain::parse(yaml, Path::new("t.yaml")).unwrap_or_else(|e| panic!("{e}"))
    }

    fn record() -> RunRecord {
        RunRecord {
            version: RECORD_VERSION,
            chain: "t".into(),
            admitted: vec![Some(1), None, Some(2), Some(3)],
            outputs: vec![3, 1],
            drops: vec![
                RecordedDrop { clock: 2, vertex: "nat".into(), reason: "nat-no-mapping".into() },
                RecordedDrop { clock: 3, vertex: "nat".into(), reason: "last".into() },
            ],
            events: vec![RecordedEvent {
                clock: 3,
                vertex: "nat".into(),
                kind: "k".into(),
                subject: "s".into(),
                detail: String::new(),
            }],
            end_clock: 3,
            state: vec![RecordedState { vertex: 0, object: 0, key: StateKey::Id(7), value: Value::Int(1) }],
            ..RunRecord::default()
        }
    }

    #[test]
    fn clocks_map_back_to_input_packets() {
        let registry = sluice_nfs::registry();
        let obs = record().observed(&chain(), &registry, vec![vec![3], vec![1]]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(obs.inputs, 4);
        assert_eq!(obs.root_dropped, vec![1], "the packet the root dropped");
        let outs: Vec<(u64, u64)> = obs.outputs.iter().map(|o| (o.input, o.clock)).collect();
        assert_eq!(outs, vec![(3, 3), (0, 1)], "output order kept, clocks mapped to inputs");
        let drop = obs.decisions.iter().find(|d| d.kind == "drop:nat-no-mapping").map(|d| d.input);
        assert_eq!(drop, Some(2));
        let last = obs.decisions.iter().find(|d| d.kind == "drop:last").map(|d| d.input);
        assert_eq!(last, Some(3), "a drop of the last packet is that packet's");
        let event = obs.decisions.iter().find(|d| d.kind == "k").map(|d| d.input);
        assert_eq!(event, Some(4), "an event carrying the end clock belongs to no packet");
        assert_eq!(obs.state.len(), 1);
        assert_eq!(obs.state[0].vertex, "nat");
    }

    #[test]
    fn records_that_disagree_with_their_frames_are_refused() {
        let registry = sluice_nfs::registry();
        let r = record();
        assert!(matches!(r.observed(&chain(), &registry, vec![vec![3]]), Err(RecordError::Mismatch(_))));
        let mut bad = r.clone();
        bad.outputs[0] = 99;
        assert!(matches!(bad.observed(&chain(), &registry, vec![vec![3], vec![1]]), Err(RecordError::Mismatch(_))));
        let mut bad = r.clone();
        bad.state[0].vertex = 5;
        assert!(matches!(bad.observed(&chain(), &registry, vec![vec![3], vec![1]]), Err(RecordError::Mismatch(_))));
        let bad = RunRecord { version: 2, ..r.clone() };
        assert!(matches!(bad.observed(&chain(), &registry, vec![]), Err(RecordError::Version { found: 2 })));
        let text = serde_json::to_string(&r).unwrap_or_default();
        let back: RunRecord = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, r, "the record survives JSON");
    }

    #[test]
    fn a_nodes_part_folds_into_the_roots_record_only_when_it_is_of_the_same_run() {
        let mut root = record();
        root.events.clear();
        let part = RunRecord {
            version: RECORD_VERSION,
            chain: "t".into(),
            drops: vec![RecordedDrop { clock: 1, vertex: "nat".into(), reason: "x".into() }],
            events: record().events,
            end_clock: 3,
            state: vec![RecordedState { vertex: 0, object: 1, key: StateKey::Id(7), value: Value::Int(2) }],
            part: Some("b".into()),
            ..RunRecord::default()
        };
        let mut other_run = part.clone();
        other_run.end_clock = 4;
        assert!(matches!(root.clone().merge_part(other_run), Err(RecordError::Mismatch(_))));
        let mut overlapping = part.clone();
        overlapping.state[0].object = 0;
        assert!(matches!(root.clone().merge_part(overlapping), Err(RecordError::Mismatch(_))));
        assert!(matches!(root.clone().merge_part(record()), Err(RecordError::Mismatch(_))), "two roots' records");
        root.merge_part(part).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((root.drops.len(), root.events.len(), root.state.len()), (3, 1, 2));
        let registry = sluice_nfs::registry();
        let obs = root.observed(&chain(), &registry, vec![vec![3], vec![1]]).unwrap_or_else(|e| panic!("{e}"));
        assert!(obs.decisions.iter().any(|d| d.kind == "drop:x" && d.input == 0), "the part's drop, by input packet");
    }

    #[test]
    fn a_killed_nodes_journal_adds_what_the_record_lacks_once() {
        let mut root = record();
        let line = |l: &JournalLine| serde_json::to_string(l).unwrap_or_default() + "\n";
        let head = line(&JournalLine::Node { chain: "t".into(), node: "b".into() });
        let again = line(&JournalLine::Drop(root.drops[0].clone()));
        let new = RecordedDrop { clock: 1, vertex: "nat".into(), reason: "y".into() };
        let text = head.clone() + &again + &line(&JournalLine::Drop(new.clone())) + &line(&JournalLine::Drop(new));
        let cut = text.clone() + "{\"drop\":{\"clo";
        assert_eq!(root.merge_journal(&cut).unwrap_or_else(|e| panic!("{e}")), "b");
        assert_eq!(root.drops.len(), 3, "the redone drop and the repeated one counted once, the cut line left out");
        let mut other = record();
        assert!(matches!(other.merge_journal(&(text.clone() + "oops\n")), Err(RecordError::Mismatch(_))));
        let foreign = line(&JournalLine::Node { chain: "u".into(), node: "b".into() });
        assert!(matches!(other.merge_journal(&foreign), Err(RecordError::Mismatch(_))));
        assert!(matches!(other.merge_journal(&again), Err(RecordError::Mismatch(_))), "no header");
    }
}
