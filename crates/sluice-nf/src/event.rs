//! Decisions NFs report (alerts, blocks, detections).

use sluice_packet::{Clock, InstanceId};

/// A structured decision emitted by an NF. Events carry the clock of the packet that caused
/// them, so that runs can be compared decision by decision.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Event {
    /// The vertex (NF name in the chain) that emitted it.
    pub nf: String,
    /// The instance that emitted it.
    #[serde(serialize_with = "ser_instance")]
    pub instance: InstanceId,
    /// What kind of decision (`alert`, `block`, `trojan`, ...).
    pub kind: &'static str,
    /// What it is about: a host, a flow, a rule.
    pub subject: String,
    /// Free-form detail (rule id, score, ...).
    pub detail: String,
    /// Logical clock of the packet that caused it.
    pub clock: sluice_packet::Clock,
    /// Packet time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
}

fn ser_instance<S: serde::Serializer>(i: &InstanceId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u16(i.index())
}

impl Event {
    /// Orders events by clock, then by emitter, for reports and comparison.
    pub fn sort_key(&self) -> (Clock, &str, &'static str, &str) {
        (self.clock, &self.nf, self.kind, &self.subject)
    }
}
