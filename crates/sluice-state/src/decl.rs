//! Declarations: what state an NF has, how it is scoped and how it is accessed.

use crate::handle::StateError;
use crate::value::Value;
use sluice_packet::HeaderField;

/// How an NF uses a state object; with the scope this picks the externalisation strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessPattern {
    /// Updated on most packets, read rarely (counters): non-blocking updates, never cached.
    WriteMostly,
    /// Read on most packets, written rarely (mappings): cached, with callbacks when shared.
    ReadHeavy,
    /// Read and written often (pools, per-host scores): cached only while one instance uses it.
    ReadWriteOften,
}

/// The header-field sets that key a state object, finest first. The last set is the coarsest;
/// partitioning a vertex's traffic on it means no two instances share the object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Scope(pub Vec<Vec<HeaderField>>);

impl Scope {
    /// A per-connection object: keyed by the 5-tuple.
    pub fn per_flow() -> Scope {
        Scope(vec![HeaderField::FIVE_TUPLE.to_vec()])
    }
    /// An object keyed by the given fields.
    pub fn fields(fields: &[HeaderField]) -> Scope {
        Scope(vec![fields.to_vec()])
    }
    /// An object shared by all traffic of the vertex (no header field keys it).
    pub fn global() -> Scope {
        Scope(vec![Vec::new()])
    }
    /// Whether the object is per-flow: its coarsest scope is the full 5-tuple.
    pub fn is_per_flow(&self) -> bool {
        self.coarsest().len() == HeaderField::FIVE_TUPLE.len()
    }
    /// The coarsest field set (empty for a global object).
    pub fn coarsest(&self) -> &[HeaderField] {
        self.0.last().map(Vec::as_slice).unwrap_or(&[])
    }
}

/// One declared state object of an NF.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StateDecl {
    /// Name, unique within the NF (e.g. `port_pool`).
    pub name: &'static str,
    /// The header fields that key it, finest to coarsest.
    pub scope: Scope,
    /// How it is accessed.
    pub pattern: AccessPattern,
    /// It records *allocation choices* (which port, which backend): two correct runs may
    /// choose differently, so comparisons of final state check how many values it holds, not
    /// which (see docs/correctness.md).
    pub allocation: bool,
    /// How much later than its armed deadline a timer of this object may be re-armed and keep
    /// the deadline it has (0: every re-arm counts). See [`StateDecl::idle_timers`].
    pub timer_slack_ns: u64,
}

/// The most slack [`StateDecl::idle_timers`] gives: a second, as Linux's connection tracking
/// ignores a refresh that moves a timeout by less than a second.
pub const MAX_TIMER_SLACK_NS: u64 = 1_000_000_000;

impl StateDecl {
    /// A declaration.
    pub fn new(name: &'static str, scope: Scope, pattern: AccessPattern) -> StateDecl {
        StateDecl { name, scope, pattern, allocation: false, timer_slack_ns: 0 }
    }

    /// Marks the object's timers as idle timeouts, the shortest of which is `shortest_ns`:
    /// a packet that would push its timer back by less than a sixteenth of that (at most
    /// [`MAX_TIMER_SLACK_NS`]) leaves the timer as it is, so an idle flow expires up to that
    /// much before a full timeout after its last packet. What it buys: a timer pushed back
    /// by every packet changes once a slack instead, and only a change is copied to the
    /// store with fault tolerance (docs/decisions.md, "Idle timers with slack").
    pub fn idle_timers(mut self, shortest_ns: u64) -> StateDecl {
        self.timer_slack_ns = (shortest_ns / 16).min(MAX_TIMER_SLACK_NS);
        self
    }

    /// Marks the object as recording allocation choices.
    pub fn allocation(mut self) -> StateDecl {
        self.allocation = true;
        self
    }

    /// Per-flow and not write-mostly: the instance that has the flow keeps the value (cached,
    /// written through with fault tolerance), so after a store crash its copy, not the store's
    /// log, is the truth.
    pub fn held_by_its_flows_instance(&self) -> bool {
        self.scope.is_per_flow() && self.pattern != AccessPattern::WriteMostly
    }

    /// Shared across flows and not write-mostly: cached by its vertex's instance while that is
    /// the vertex's only one (CHC Table 1: "cache while no other instance uses it").
    pub fn cached_while_alone(&self) -> bool {
        !self.scope.is_per_flow() && self.pattern != AccessPattern::WriteMostly
    }
}

/// The objects of `decls` that [`StateDecl::cached_while_alone`].
pub fn cached_while_alone(decls: &[StateDecl]) -> impl Iterator<Item = ObjectId> + '_ {
    decls.iter().enumerate().filter(|(_, d)| d.cached_while_alone()).map(|(o, _)| ObjectId(o as u16))
}

/// Index of a state object in its NF's declaration list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ObjectId(pub u16);

/// A custom operation's code: given the object's current value (`None` if absent) and the
/// argument, update the value in place and return the operation's result. It runs where the
/// state lives (in the instance, or inside the store), atomically with respect to all other
/// operations on the object.
pub type CustomOpFn = fn(&mut Option<Value>, &Value) -> Result<Option<Value>, StateError>;

/// A custom operation an NF registers (e.g. "pick the least-loaded backend and increment it").
#[derive(Debug, Clone, Copy)]
pub struct CustomOp {
    /// Name, unique within the NF.
    pub name: &'static str,
    /// The code.
    pub apply: CustomOpFn,
}
