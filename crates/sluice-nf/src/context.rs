//! What an NF sees while it processes a packet.

use crate::event::Event;
use crate::registry::LabelTable;
use sluice_packet::{Clock, InstanceId, LabelId};
use sluice_state::StateHandle;
use std::fmt::Display;

/// The processing context of one NF instance, valid for one packet or timer.
pub struct NfContext<'a> {
    /// The instance's state.
    pub state: &'a mut dyn StateHandle,
    /// The clock of the packet being processed (of the packet that advanced time, for timers).
    pub clock: Clock,
    /// Packet time in nanoseconds since the Unix epoch: the NF's notion of "now".
    pub now_ns: u64,
    /// This instance.
    pub instance: InstanceId,
    vertex: &'a str,
    labels: &'a LabelTable,
    events: &'a mut Vec<Event>,
}

impl<'a> NfContext<'a> {
    /// A context; built by the runtime (and by tests driving an NF directly).
    pub fn new(
        state: &'a mut dyn StateHandle,
        vertex: &'a str,
        instance: InstanceId,
        labels: &'a LabelTable,
        events: &'a mut Vec<Event>,
    ) -> NfContext<'a> {
        NfContext { state, clock: Clock::default(), now_ns: 0, instance, vertex, labels, events }
    }

    /// The vertex name of this instance.
    pub fn vertex(&self) -> &str {
        self.vertex
    }

    /// The id of a label name used in the chain, if any edge or NF uses it.
    pub fn label(&self, name: &str) -> Option<LabelId> {
        self.labels.get(name)
    }

    /// Emits a decision.
    pub fn emit(&mut self, kind: &'static str, subject: impl Display, detail: impl Into<String>) {
        self.events.push(Event {
            nf: self.vertex.to_string(),
            instance: self.instance,
            kind,
            subject: subject.to_string(),
            detail: detail.into(),
            clock: self.clock,
            ts_ns: self.now_ns,
        });
    }
}
