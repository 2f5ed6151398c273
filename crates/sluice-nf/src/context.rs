//! What an NF sees while it processes a packet.

use crate::event::Event;
use crate::registry::LabelTable;
use sluice_packet::{Clock, InstanceId, LabelId};
use sluice_state::{StateError, StateHandle, Value};
use std::fmt::Display;
use std::time::{SystemTime, UNIX_EPOCH};

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

    /// A random 64-bit number for the packet being processed. Drawn fresh the first time;
    /// every later processing of the same packet (a replay after a failure, a clone beside a
    /// straggler) gets the same number back, so its decisions repeat
    /// ([`StateHandle::record`]). Fails only if the state store does.
    pub fn random_u64(&mut self) -> Result<u64, StateError> {
        let fresh = Value::Int(rand::random::<u64>() as i64);
        Ok(self.state.record(fresh)?.as_int().map_or(0, |v| v as u64))
    }

    /// Wall-clock time, nanoseconds since the Unix epoch, as it was when this packet was first
    /// processed; later processings of the packet get the same value, like
    /// [`Self::random_u64`]. For timeouts use packet time ([`Self::now_ns`]), which a replay
    /// repeats by itself.
    pub fn wall_clock_ns(&mut self) -> Result<u64, StateError> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Ok(self.state.record(Value::Int(now as i64))?.as_int().map_or(now, |v| v as u64))
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
