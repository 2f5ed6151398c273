//! The CHC protocol core of Sluice, written *sans-IO*: every mechanism that keeps a chain's
//! output equivalent to the logical chain's is a plain state machine here. A driver feeds it
//! inputs (a packet admitted at the root, a copy finished, a store acknowledgement, a fault or
//! control command) and carries out the actions it returns (enqueue, hold, release, replay,
//! flush, retire, delete a log entry, persist a clock). The core owns no thread, no clock source,
//! no queue and no store handle, so each transition is unit-tested without I/O and the same
//! logic runs under `sluice-coe`'s virtual-time driver and under the threaded runtime.
//!
//! * [`root`]: logical clocks, the packet log with reference counts and XOR vectors, delete,
//!   clock persistence, replay selection, root recovery;
//! * [`clockset`]: sets of clocks as bits (what left the chain, what an instance processed);
//! * [`egress`]: duplicate suppression where packets leave the chain;
//! * [`failover`]: what the root makes of the packets a failed or retired instance still had;
//! * [`gate`]: what an instance does with a packet that reaches it (queue, hold while a replay
//!   drains or a flow move completes, suppress a duplicate) and the vertex-wide record of the
//!   clocks already processed;
//! * [`splitter`]: which instance of a vertex serves a flow: members, pins, clones, and the flow
//!   allocation scaling and root recovery rebuild;
//! * [`moves`]: the flow-move protocol (barrier, hold, flush, release, retire);
//! * [`order`]: chain-entry order for NFs whose cross-flow decisions depend on it;
//! * [`manager`]: vertex managers (policies on queue depth, straggler detection) and clone trials;
//! * [`recovery`]: planning a store rebuild from a checkpoint and the instances' logs.
//!
//! The design follows CHC (NSDI'19); docs/ARCHITECTURE.md shows the core between its drivers.

pub mod clockset;
pub mod egress;
pub mod failover;
pub mod gate;
pub mod manager;
pub mod moves;
pub mod order;
pub mod recovery;
pub mod root;
pub mod splitter;

#[cfg(test)]
mod test_support;

/// The core's name for one physical NF instance. Drivers allocate them (the virtual-time driver
/// uses its node index); a replacement gets a new one and takes the failed one's place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
pub struct NodeId(pub usize);

/// Mechanisms that can be switched off, to show what each one prevents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Switches {
    /// NFs see chain-entry clocks. Off: each vertex sees its own arrival order instead (what an
    /// NF sees without a framework-wide clock).
    pub clocks: bool,
    /// Duplicate packets are dropped at queues and duplicate updates answered from the store's
    /// per-clock log. Off: both get through.
    pub duplicate_suppression: bool,
    /// Flow moves follow the eight-step protocol. Off: the splitter just switches, the new
    /// instance starts at once from whatever the store holds.
    pub move_protocol: bool,
    /// The root keeps a packet until its updates are committed. Off: until its copies are done.
    pub xor_check: bool,
    /// Non-deterministic values NFs draw (random numbers, wall-clock time) are recorded in the
    /// store by clock, so a replay or a clone draws the same. Off: every draw is fresh.
    pub record_nondeterminism: bool,
}

impl Default for Switches {
    fn default() -> Self {
        Switches {
            clocks: true,
            duplicate_suppression: true,
            move_protocol: true,
            xor_check: true,
            record_nondeterminism: true,
        }
    }
}
