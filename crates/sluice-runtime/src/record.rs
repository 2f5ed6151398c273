//! What a recorded run keeps besides its report (`RunConfig::record`): enough to compare the
//! run with the logical chain (`sluice verify --recorded`). The input and output frames are the
//! caller's to keep (it owns the source and the sink); this is what only the runtime sees.

use sluice_nf::Event;
use sluice_packet::Clock;
use sluice_state::{StateKey, Value};

/// A run's record, filled by [`crate::run`] when `RunConfig::record` is set.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    /// Every packet the root read, in input order: the clock it stamped, or `None` for a
    /// packet it dropped (malformed, truncated, or past a full window with `overflow: drop`).
    pub admitted: Vec<Option<Clock>>,
    /// Packets dropped inside the chain, by clock: the vertex (`input` for the root's routes)
    /// and the reason.
    pub drops: Vec<DropRecord>,
    /// The chain's state at the end, after the timers due by the last packet's time fired.
    pub state: Vec<StateRecord>,
    /// The last clock the root stamped: what timers fired at the end of the run carry.
    pub end: Clock,
}

/// One packet dropped inside the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropRecord {
    /// The packet's clock.
    pub clock: Clock,
    /// The vertex that dropped it (`input`: no route from the root).
    pub vertex: String,
    /// Why.
    pub reason: &'static str,
}

/// One value of the final state.
#[derive(Debug, Clone, PartialEq)]
pub struct StateRecord {
    /// The vertex (index in the plan) whose NF declared the object.
    pub vertex: usize,
    /// The object's index among the NF's objects.
    pub object: u16,
    /// The key.
    pub key: StateKey,
    /// The value.
    pub value: Value,
}

/// Where a node of a recorded spread run writes its drops and events as they happen
/// ([`crate::RunHooks::journal`]), so that a node killed during the run leaves them behind: a
/// write the process made survives it. Called from the worker threads, before the copy a
/// drop ends is reported anywhere and before the packet an event is about goes on.
pub trait RecordJournal: Send + Sync {
    /// An instance of `vertex` dropped the copy of `clock` for `reason`.
    fn dropped(&self, clock: Clock, vertex: &str, reason: &'static str);
    /// An instance decided `event`.
    fn decided(&self, event: &Event);
}
