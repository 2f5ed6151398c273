//! What one run of a chain produced, in a form two runs can be compared by: the output packets,
//! the NFs' decisions and the final state, each tied to the input packet that caused it.
//!
//! Runs are matched by *input index* (the position of a packet in the input trace, from 0), not
//! by logical clock: a root that fails and resumes its clock at `persisted + n` stamps different
//! clocks than the reference run does for the same input packets.

use sluice_state::{StateKey, Value};

/// One packet that left the chain.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OutputRecord {
    /// Index of the input packet it descends from.
    pub input: u64,
    /// The logical clock it carried (for reports).
    pub clock: u64,
    /// The port its input arrived on. Outputs of inputs from different ports (the two sides
    /// of a bridge) travel different paths to different wires: their order relative to each
    /// other is not one the chain keeps, even with equal headers.
    pub in_port: u16,
    /// The frame as written to the output.
    #[serde(skip)]
    pub bytes: Vec<u8>,
}

/// One decision an NF took: a drop (with its reason) or an emitted event (alert, block, ...).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Decision {
    /// Index of the input packet that caused it.
    pub input: u64,
    /// The vertex (NF name in the chain) that took it.
    pub vertex: String,
    /// `drop:<reason>` for drops, else the event kind (`alert`, `trojan`, ...).
    pub kind: String,
    /// What it is about (host, flow, rule); empty for drops.
    pub subject: String,
    /// Event detail; empty for drops.
    pub detail: String,
}

/// One value of the chain's state at the end of a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StateEntry {
    /// The vertex whose NF declared the object.
    pub vertex: String,
    /// The object's index among the NF's declared objects.
    pub object: u16,
    /// The object's name as declared, for reports.
    pub object_name: String,
    /// The object records allocation choices: compared by number of values only.
    pub allocation: bool,
    /// The key.
    #[serde(serialize_with = "ser_debug")]
    pub key: StateKey,
    /// The value.
    #[serde(serialize_with = "ser_debug")]
    pub value: Value,
}

fn ser_debug<T: std::fmt::Debug, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:?}"))
}

/// Everything one run produced.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Observed {
    /// Input packets offered to the chain.
    pub inputs: u64,
    /// Output packets in the order the chain emitted them.
    pub outputs: Vec<OutputRecord>,
    /// Decisions, sorted by input index, vertex, kind, subject.
    pub decisions: Vec<Decision>,
    /// Final state, sorted by vertex, object, key.
    pub state: Vec<StateEntry>,
    /// Input packets the root dropped and reported (full log, lost in a root crash), sorted.
    /// Nothing caused by these may be expected in the output.
    pub root_dropped: Vec<u64>,
}
