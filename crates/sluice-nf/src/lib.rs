//! The contract between Sluice and a network function.
//!
//! An NF is a type implementing [`NetworkFunction`]. Its packet method takes `&self`: the NF
//! object holds only immutable configuration, and every piece of state it keeps goes through the
//! [`StateHandle`] in its [`NfContext`], against objects it declared with a scope and an access
//! pattern. That is what allows the runtime to keep the state in the instance, in a store, or
//! both, without the NF knowing.

mod context;
mod emulate;
mod event;
mod instance;
mod registry;

pub use context::NfContext;
pub use event::Event;
pub use instance::{FiredFor, Instance, TimerFilter, TIMERS_PER_PACKET};
pub use registry::{BuildCtx, LabelTable, NfBuilder, NfError, NfRegistry};
pub use sluice_state::{
    AccessPattern, CustomOp, ObjectId, Scope, StateDecl, StateError, StateHandle, StateKey, StateOp, TimerFired, Value,
};

use sluice_packet::Packet;

/// What happens to a packet after an NF has processed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it on along the vertex's default edges.
    Forward,
    /// Drop it; the reason is counted in the run report.
    Drop(&'static str),
    /// Send it on along the edges of the named output with this index in
    /// [`NetworkFunction::outputs`].
    Output(u8),
}

impl Verdict {
    /// The packet `pkt` hit a state error: it is dropped and counted under `reason`, and the
    /// error is said in the log (target `sluice::nf`) — the reason alone cannot tell a store
    /// that failed from a value that surprised the NF. A store that fails every call would
    /// fill the log: the first 16 errors of a process are said, then the 32nd, 64th, ...
    pub fn state_error(pkt: &Packet, reason: &'static str, error: &StateError) -> Verdict {
        static SAID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SAID.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n <= 16 || n.is_power_of_two() {
            tracing::warn!(
                target: "sluice::nf",
                reason,
                clock = %pkt.meta.clock,
                replayed = pkt.meta.flags.contains(sluice_packet::MetaFlags::REPLAYED),
                error = %error,
                errors_so_far = n,
                "a packet dropped on a state error"
            );
        }
        Verdict::Drop(reason)
    }
}

/// A network function. Instances are built by an [`NfBuilder`] from the chain file's config;
/// one object per physical instance, shared by nothing but read-only configuration.
pub trait NetworkFunction: Send + Sync {
    /// The NF type name, as written in chain files (e.g. `nat`).
    fn kind(&self) -> &'static str;

    /// The state objects this NF uses; [`ObjectId`]`(i)` names the i-th.
    fn state_objects(&self) -> &[StateDecl];

    /// Custom operations this NF offloads to where its state lives; `StateOp::Custom { op: i }`
    /// names the i-th.
    fn custom_ops(&self) -> &[CustomOp] {
        &[]
    }

    /// Names of extra outputs besides the default one, for [`Verdict::Output`].
    fn outputs(&self) -> &[&'static str] {
        &[]
    }

    /// The order this NF needs its packets in across flows. Most NFs keep per-flow state, or
    /// shared state whose final value does not depend on the order of updates (counters,
    /// allocations), and take packets as they arrive. An NF whose decisions depend on the order
    /// of packets of *different* flows (the portscan detector's walk over a host's connection
    /// outcomes) asks for [`InputOrder::Clock`]: the framework then hands it packets in
    /// chain-entry order (logical clocks), whatever reordered flows in front of it. An NF whose
    /// per-connection state depends on the order of the connection's two directions asks for
    /// [`InputOrder::Connection`].
    fn input_order(&self) -> InputOrder {
        InputOrder::Arrival
    }

    /// Processes one packet. Called only for parsed IP packets, in per-flow arrival order.
    fn process(&self, pkt: &mut Packet, ctx: &mut NfContext<'_>) -> Verdict;

    /// A timer this NF armed has expired ("now" is the packet time that passed its deadline).
    fn on_timer(&self, _fired: TimerFired, _ctx: &mut NfContext<'_>) {}
}

/// The order an NF needs its input in (see [`NetworkFunction::input_order`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputOrder {
    /// Arrival order; only each flow's packets keep their order.
    #[default]
    Arrival,
    /// Chain-entry order between the two directions of a connection: an NF whose per-connection
    /// state follows both sides (FINs from each, a timer set by the packet that closed it).
    /// Where the two directions reach the vertex by different ways (a chain with
    /// `reverse_edges` whose reverse path meets the vertex elsewhere, a vertex fed from several
    /// places), the framework hands it packets in chain-entry order; elsewhere arrival order is
    /// that order already.
    Connection,
    /// Chain-entry order across flows (logical clocks; with several roots, entry time).
    Clock,
}

/// Builds a single instance of `kind` with local state, for tests and tools that drive one NF
/// without a chain.
pub fn local_instance(registry: &NfRegistry, kind: &str, config: &serde_yaml::Value) -> Result<Instance, NfError> {
    let mut labels = LabelTable::default();
    let mut bctx = BuildCtx { vertex: kind, instance: 0, instances: 1, labels: &mut labels, shared_state: false };
    let nf = registry.build(kind, config, &mut bctx)?;
    let state = sluice_state::LocalState::new(nf.state_objects(), nf.custom_ops());
    Ok(Instance::new(
        nf,
        Box::new(state),
        kind.into(),
        sluice_packet::InstanceId::new(0, 0),
        std::sync::Arc::new(labels),
    ))
}
