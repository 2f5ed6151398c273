//! The fault-tolerant executor: a physical chain whose instances keep their state in a store,
//! driven through a fault schedule, with CHC's protocols keeping its output equivalent to the
//! logical chain's.
//!
//! # Model
//! The engine is a discrete-event simulation in *virtual time* over the real parts: real NF
//! instances, the real store client (write-through per-flow state, tagged updates, XOR vectors,
//! write-ahead log) and a real store (embedded or Redis). Packets arrive at the root every
//! `arrival_ns`; an instance serves a batch from its queue in `service_ns` per packet plus any
//! delay a `slow` event gave it; outputs reach the next queue `link_ns` later. Events run in
//! virtual-time order on one thread, so a fault lands at an exact point of the input and a
//! failing schedule can be replayed. Wall-clock time is measured separately for the recovery
//! procedures (how long the framework's own work takes).
//!
//! # Protocols (CHC §5; the state machines are in `sluice-chc`, see docs/correctness.md)
//! * **Root**: stamps clocks (root id in the high bits), keeps every packet in its log until
//!   every copy of it has left the chain *and* every update made for it is committed (its XOR
//!   vector folds to zero with the commits the instances report); drops input past the log
//!   bound; persists the clock every `clock_persist_every` packets.
//! * **Replay**: after an instance crash or when a clone starts, the root replays its log in
//!   clock order. Replayed packets are marked; every instance processes them with blocking,
//!   tagged updates, which the store applies at most once (the per-clock log answers
//!   duplicates with the logged result, so replay repeats allocations). A recovering instance
//!   holds live packets until the replay has drained.
//! * **Duplicate suppression**: a clock already delivered to a vertex (or to the output) is
//!   dropped at the queue; replayed packets pass until their target instance clears the mark.
//! * **Flow moves**: the splitter pins the moved flows to the new instance and puts a barrier
//!   (the *last* mark) in the old instance's queue; the new instance holds the moved flows'
//!   packets until the old one has processed the barrier and flushed its updates; the first
//!   packet it then processes per flow carries the *first* mark.
//! * **Scaling** pins existing flows to their instances before adding one (nothing moves) and
//!   moves only the flows of an instance being removed.

//!
//! # Driver and core
//! The protocol decisions (clocks, the log, XOR/delete, replay selection, holding and duplicate
//! suppression, splitting and pins, moves, vertex managers, store-recovery planning) are made by
//! `sluice-chc`'s state machines. This module is the virtual-time *driver*: it owns the queues,
//! the NF instances, the store handles and the event loop, feeds the core what happens and
//! carries out what it returns.

mod config;
mod faults;
mod finish;
mod flow;
mod queue;
mod scaling;

pub use config::{EngineConfig, EngineError, EngineReport, EngineStats, Episode, LogPlace, Switches};

use crate::root_log::StoreLog;
use crate::schedule::{FaultEvent, Policy};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sluice_chc::gate::{Decided, Gate};
use sluice_chc::manager::Trials;
use sluice_chc::moves::{MoveId, Moves};
use sluice_chc::order::Pending;
use sluice_chc::root::{Root, RootConfig};
use sluice_chc::splitter::{reachability, Splitter};
use sluice_chc::NodeId;
use sluice_nf::{Instance, LabelTable, NfRegistry};
use sluice_packet::Packet;
use sluice_runtime::plan::{Routes, VertexPlan};
use sluice_runtime::{compile_with, Chain, StateConfig};
use sluice_store::{Backend, ClientConfig, Mode, StoreClient};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// Most events a run may serve per input packet before it is stopped as a livelock
/// ([`EngineError::DoesNotEnd`]).
const EVENTS_PER_PACKET_BUDGET: u64 = 2_000;

/// Something in a queue: a packet, or the barrier that ends a flow move at the old instance.
enum Item {
    Packet(Packet),
    Barrier(MoveId),
    /// Behind the packets a straggler held when its clone started that the root's replay to
    /// the clone does not carry (the root lost its log): the clone ends its recovery only
    /// once the straggler has emitted them, so per-flow order holds.
    CloneStart(NodeId),
}

struct Queued {
    at: u64,
    item: Item,
}

/// One physical NF instance: the NF, its queue in virtual time, and its gate (the core's
/// holding and duplicate logic).
struct Node {
    vertex: usize,
    index: u16,
    inst: Instance,
    queue: queue::NodeQueue,
    busy_until: u64,
    alive: bool,
    slow: Option<(u64, u64)>,
    gate: Gate,
    processed: u64,
    busy_ns: u64,
    /// Per moved flow: when its held packets were released. The old instance's barrier is
    /// passed at the end of a batch that is still being served in virtual time; later packets
    /// of the flow queue behind the released ones.
    released: HashMap<u64, u64>,
    /// Entry-order keys of the packets queued or held here (what an order-sensitive vertex
    /// downstream, or this one, waits for).
    pending: Pending,
    /// An order-sensitive instance whose next packet must wait for an earlier one elsewhere:
    /// not served until something else happens.
    blocked: bool,
}

impl Node {
    fn new(vertex: usize, index: u16, inst: Instance, recovering: bool, roots: usize) -> Node {
        Node {
            vertex,
            index,
            inst,
            queue: queue::NodeQueue::new(roots),
            busy_until: 0,
            alive: true,
            slow: None,
            gate: Gate::new(recovering),
            processed: 0,
            busy_ns: 0,
            released: HashMap::new(),
            pending: Pending::default(),
            blocked: false,
        }
    }

    /// Queues what the gate returns when the recovery ends: the held live packets, then the
    /// deferred barriers.
    fn queue_recovery_end(&mut self, at: u64, end: sluice_chc::gate::RecoveryEnd) {
        let packets = end.held.into_iter().map(Item::Packet);
        let barriers = end.barriers.into_iter().map(Item::Barrier);
        for item in packets.chain(barriers) {
            self.queue.push_back(Queued { at, item });
        }
    }

    /// Empties the queue and the holds: every packet still here (barriers dropped).
    /// The clones waiting for a mark in this node's queue.
    fn clone_marks(&self) -> Vec<NodeId> {
        self.queue
            .iter()
            .filter_map(|q| match q.item {
                Item::CloneStart(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    fn drain(&mut self) -> Vec<Packet> {
        let mut out: Vec<Packet> = self
            .queue
            .take_all()
            .into_iter()
            .filter_map(|q| match q.item {
                Item::Packet(p) => Some(p),
                Item::Barrier(_) | Item::CloneStart(_) => None,
            })
            .collect();
        out.extend(self.gate.drain_held());
        self.pending.clear();
        out
    }
}

/// A vertex of the physical chain.
struct Vertex {
    plan: VertexPlan,
    /// The core's splitter: members, pins, clones.
    splitter: Splitter,
    /// The clocks this vertex has processed.
    decided: Decided,
    next_index: u16,
    /// Arrival counter, the vertex's own order (clocks switched off).
    arrivals: u64,
    /// The NF's state objects.
    decls: Vec<sluice_state::StateDecl>,
    /// Vertices reachable from this one (itself included).
    reaches: Vec<bool>,
    /// During a clone trial: per flow, when the last of its packets processed here leaves.
    flow_out: HashMap<u64, u64>,
    /// The vertex takes its input in chain-entry order (`InputOrder::Clock`, or
    /// `InputOrder::Connection` where a connection's two directions meet).
    ordered: bool,
    /// The vertices that lead to this one (itself excluded).
    upstream: Vec<usize>,
    /// Replay copies passing through that wait for the vertex to process their clock
    /// (`sluice_chc::gate::passes_too_early`), with the instance they wait at.
    awaiting: HashMap<sluice_packet::Clock, Vec<(NodeId, Packet)>>,
    /// Immediate moves (order-sensitive vertex) away from an instance whose replay was still
    /// travelling: (that instance, the flows, where they went). Replay copies of those flows
    /// aimed at it go to the new owner instead.
    handed_over: Vec<(sluice_packet::InstanceId, std::collections::HashSet<u64>, NodeId)>,
    /// What the NF emitted for each clock still in the root's log, so a replay copy passing
    /// through on its way to an instance downstream takes the same output without the NF
    /// running again on state later packets have changed (which could repeat its updates
    /// under other tags, or re-create what has expired since).
    emitted: HashMap<sluice_packet::Clock, (Packet, sluice_nf::Verdict)>,
}

/// A packet leaving the chain.
struct Leaving {
    at: u64,
    order: u64,
    ingress: u64,
    clock: sluice_packet::Clock,
    bytes: Vec<u8>,
    /// A replay of a packet the root knew had left already.
    emitted: bool,
}

/// The engine.
pub struct Engine<'a> {
    chain: &'a Chain,
    registry: &'a NfRegistry,
    cfg: EngineConfig,
    backend: Arc<dyn Backend>,
    state: StateConfig,
    labels: Arc<LabelTable>,
    entry: Vec<Routes>,
    traffic: Option<sluice_runtime::filter::CompiledFilter>,
    vertices: Vec<Vertex>,
    nodes: Vec<Node>,
    /// The core's root: clocks, log, XOR check, replay selection.
    root: Root,
    leaving: Vec<Leaving>,
    /// With asynchronous deletes: packets that left, whose "done" reaches the root at a time.
    late_deletes: VecDeque<(u64, Packet)>,
    /// How many waiting replay copies the end of the run last released, and how many packets
    /// had been processed then (see `settle_end`).
    awaiting_released: Option<(usize, u64)>,
    /// The core's moves in progress, and when each started (wall, virtual).
    moves: Moves,
    move_started: HashMap<MoveId, (Instant, u64)>,
    commits: Vec<(sluice_packet::Clock, u64)>,
    now: u64,
    rng: ChaCha8Rng,
    report: EngineReport,
    latencies: Vec<(u64, u64)>,
    policies: Vec<Policy>,
    trials: Trials,
    /// Episodes waiting for their replay to drain: (episode, start, replay target).
    replay_episodes: Vec<(usize, u64, sluice_packet::InstanceId)>,
    checkpoint: Option<sluice_store::Checkpoint>,
    /// An instance's write-ahead log was lost with it (failover, retirement): checkpoint at
    /// the next opportunity so store recovery never needs it.
    checkpoint_due: bool,
    /// Latest packet time admitted: timers due by then fire before the final state is read.
    last_ts: u64,
    /// The log's copy in the store (`LogPlace::Store`).
    store_log: Option<StoreLog>,
    /// The store fails at the same point as the instance crashes being applied: their failover
    /// cannot checkpoint, and the store's rebuild lacks their write-ahead logs.
    store_failing: bool,
    /// The roots failing at the same point as the store being rebuilt (`LogPlace::Store`):
    /// their log entries written since the store's checkpoint are lost with both.
    roots_failing: Vec<u8>,
}

fn store_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Store(e.to_string())
}

impl<'a> Engine<'a> {
    /// Builds the physical chain of `chain` over `backend` (which must be empty).
    pub fn new(
        chain: &'a Chain,
        registry: &'a NfRegistry,
        backend: Arc<dyn Backend>,
        cfg: EngineConfig,
        policies: Vec<Policy>,
    ) -> Result<Engine<'a>, EngineError> {
        let client = ClientConfig {
            mode: Mode::Async,
            write_through: true,
            // Any instance may receive moved flows or replace another: always look up.
            fresh: false,
            dedupe: cfg.switches.duplicate_suppression,
            record_nondeterminism: cfg.switches.record_nondeterminism,
            wal_capacity: cfg.wal_capacity.max(2),
            flush_every: 1,
            ..ClientConfig::default()
        };
        let state = StateConfig::Store { backend: backend.clone(), client };
        let plan = compile_with(chain, registry, &[], &state)?;
        let next: Vec<Vec<usize>> = plan.vertices.iter().map(VertexPlan::successors).collect();
        let mut vertices: Vec<Vertex> = plan
            .vertices
            .iter()
            .zip(reachability(&next))
            .map(|(vp, reaches)| Vertex {
                plan: vp.clone(),
                splitter: Splitter::default(),
                decided: Decided::default(),
                next_index: vp.instances.len() as u16,
                arrivals: 0,
                decls: Vec::new(),
                reaches,
                flow_out: HashMap::new(),
                ordered: false,
                upstream: Vec::new(),
                awaiting: HashMap::new(),
                handed_over: Vec::new(),
                emitted: HashMap::new(),
            })
            .collect();
        let reach: Vec<Vec<bool>> = vertices.iter().map(|v| v.reaches.clone()).collect();
        for (v, vx) in vertices.iter_mut().enumerate() {
            vx.upstream = (0..reach.len()).filter(|&u| u != v && reach[u].get(v) == Some(&true)).collect();
        }
        let merged = plan.merged_on_the_way();
        let mut nodes = Vec::new();
        let mut members: Vec<Vec<NodeId>> = vec![Vec::new(); vertices.len()];
        for (vi, mut inst) in plan.instances {
            if let Some(v) = vertices.get_mut(vi) {
                if v.decls.is_empty() {
                    v.decls = inst.nf().state_objects().to_vec();
                }
                // Every vertex may scale here: an NF that needs entry order across flows always
                // holds; one that needs it between a connection's directions where they meet.
                v.ordered = match inst.nf().input_order() {
                    sluice_nf::InputOrder::Clock => true,
                    sluice_nf::InputOrder::Connection => merged.get(vi).copied().unwrap_or(true),
                    sluice_nf::InputOrder::Arrival => false,
                };
            }
            if let Some(m) = members.get_mut(vi) {
                m.push(NodeId(nodes.len()));
            }
            let index = inst.id().index();
            let _ = inst.state();
            nodes.push(Node::new(vi, index, inst, false, usize::from(cfg.roots.max(1))));
        }
        for (v, m) in vertices.iter_mut().zip(members) {
            v.splitter = Splitter::new(m);
        }
        let root = Root::new(RootConfig {
            log_capacity: cfg.log_capacity,
            clock_persist_every: cfg.clock_persist_every,
            roots: cfg.roots,
            xor_check: cfg.switches.xor_check,
            remember_inputs: true,
        });
        let store_log = match cfg.log_place {
            LogPlace::Store => Some(StoreLog::connect(&backend).map_err(store_err)?),
            LogPlace::Root => None,
        };
        Ok(Engine {
            chain,
            registry,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            backend,
            state,
            labels: plan.labels,
            entry: plan.entry,
            traffic: plan.traffic,
            vertices,
            nodes,
            root,
            leaving: Vec::new(),
            late_deletes: VecDeque::new(),
            awaiting_released: None,
            moves: Moves::default(),
            move_started: HashMap::new(),
            commits: Vec::new(),
            now: 0,
            report: EngineReport::default(),
            latencies: Vec::new(),
            policies,
            trials: Trials::default(),
            replay_episodes: Vec::new(),
            checkpoint: None,
            checkpoint_due: false,
            last_ts: 0,
            store_log,
            store_failing: false,
            roots_failing: Vec::new(),
        })
    }

    /// Runs `packets` through the physical chain with `faults` (absolute packet counts, sorted).
    pub fn run(mut self, packets: &[Packet], faults: &[(u64, FaultEvent)]) -> Result<EngineReport, EngineError> {
        self.report.observed.inputs = packets.len() as u64;
        // A store crash rebuilds from the last checkpoint: the first is the store as the run
        // starts (with the claim of whoever runs it), not nothing.
        if self.checkpoint.is_none()
            && faults.iter().any(|(_, f)| matches!(f.action, crate::schedule::Action::CrashStore))
        {
            self.checkpoint = Some(self.backend.checkpoint().map_err(store_err)?);
        }
        let mut next_input = 0usize;
        let mut next_fault = 0usize;
        let mut events = 0u64;
        let mut stalls = 0u32;
        // Far above what any schedule causes (each packet visits every vertex once per copy and
        // replay), so only a run that never ends reaches it.
        let event_budget = EVENTS_PER_PACKET_BUDGET.saturating_mul(packets.len() as u64 + 64);
        loop {
            let t_in = if next_input < packets.len() { next_input as u64 * self.cfg.arrival_ns } else { u64::MAX };
            let (t_node, node) = self.next_node();
            if let Some(&(t_del, _)) = self.late_deletes.front() {
                if t_del <= t_in.min(t_node) {
                    self.now = self.now.max(t_del);
                    if let Some((_, p)) = self.late_deletes.pop_front() {
                        self.root.copy_left(&p);
                    }
                    self.unblock();
                    continue;
                }
            }
            if t_in == u64::MAX && t_node == u64::MAX {
                if self.settle_end(&mut stalls)? {
                    break;
                }
                continue;
            }
            if t_in <= t_node {
                stalls = 0;
                self.now = self.now.max(t_in);
                let Some(pkt) = packets.get(next_input) else { break };
                self.admit(next_input as u64, pkt)?;
                next_input += 1;
                let count = next_input as u64;
                let due = faults.get(next_fault..).unwrap_or_default().iter().take_while(|(at, _)| *at <= count);
                let actions: Vec<&crate::schedule::Action> = due.map(|(_, ev)| &ev.action).collect();
                next_fault += actions.len();
                self.apply_together(count, &actions)?;
                self.periodic(count)?;
                self.unblock();
            } else {
                self.now = self.now.max(t_node);
                if self.serve(node)? {
                    stalls = 0;
                    self.unblock();
                } else if let Some(n) = self.node_mut(node) {
                    n.blocked = true;
                }
            }
            events += 1;
            if events.is_multiple_of(64) {
                self.collect_commits();
                if events > event_budget {
                    self.log_waiting();
                    return Err(EngineError::DoesNotEnd { events, packets: packets.len() as u64 });
                }
            }
        }
        self.finish()
    }

    /// The node that can start next and when.
    fn next_node(&self) -> (u64, NodeId) {
        let mut best = (u64::MAX, NodeId(usize::MAX));
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.alive || n.blocked {
                continue;
            }
            if let Some(q) = n.queue.front() {
                let t = n.busy_until.max(q.at);
                if t < best.0 {
                    best = (t, NodeId(i));
                }
            }
        }
        best
    }

    /// Input is over and no queue can be served: wait for what is still held to be released.
    /// Returns whether the run is complete. `stalls` counts calls without progress in between:
    /// order-sensitive instances that stay blocked with nothing else to do are a deadlock.
    fn settle_end(&mut self, stalls: &mut u32) -> Result<bool, EngineError> {
        self.collect_commits();
        self.check_replay_done();
        // The replay's end may have just released held packets into queues: serve them.
        if self.nodes.iter().any(|n| n.alive && !n.queue.is_empty()) {
            *stalls += 1;
            if *stalls > 3 {
                self.log_waiting();
                return Err(EngineError::Store("order-sensitive instances wait for each other (deadlock)".into()));
            }
            self.unblock();
            return Ok(false);
        }
        let held: usize = self.nodes.iter().filter(|n| n.alive).map(|n| n.gate.held()).sum();
        let awaiting: Vec<(NodeId, Packet)> =
            self.vertices.iter_mut().flat_map(|v| v.awaiting.drain().flat_map(|(_, w)| w)).collect();
        if !awaiting.is_empty() {
            // Their clock may still come from a copy released with them. If the last release
            // of the same copies led to no processing anywhere, it will not: a deadlock, not
            // a run to spin on forever.
            let processed: u64 = self.nodes.iter().map(|n| n.processed).sum();
            let round = (awaiting.len(), processed);
            if self.awaiting_released == Some(round) {
                self.log_waiting();
                return Err(EngineError::Store(format!(
                    "{} replay copies wait for a clock their vertex will never process (deadlock)",
                    awaiting.len()
                )));
            }
            self.awaiting_released = Some(round);
            for (node, p) in awaiting {
                if let Some(n) = self.nodes.get_mut(node.0).filter(|n| n.alive) {
                    // Still pending there since it was deferred.
                    n.queue.push_back(Queued { at: self.now, item: Item::Packet(p) });
                } else {
                    self.root.copy_finished(&p);
                }
            }
            return Ok(false);
        }
        if held == 0 && !self.moves.busy() {
            return Ok(true);
        }
        // Something is held with nothing left to release it: release it rather than lose it.
        let now = self.now;
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            let end = n.gate.end_recovery();
            n.queue_recovery_end(now, end);
        }
        if held > 0 && !self.moves.busy() {
            return Ok(false);
        }
        Err(EngineError::Store("a flow move never completed: its barrier was lost".into()))
    }

    /// What every instance still waits with, when a run cannot finish (at debug level).
    fn log_waiting(&self) {
        for (i, n) in self.nodes.iter().enumerate().filter(|(_, n)| n.alive) {
            let queued: Vec<String> = n
                .queue
                .iter()
                .take(8)
                .map(|q| match &q.item {
                    Item::Packet(p) => p.meta.clock.to_string(),
                    Item::Barrier(_) => "barrier".into(),
                    Item::CloneStart(_) => "clone start".into(),
                })
                .collect();
            tracing::debug!(
                node = i,
                vertex = n.vertex,
                recovering = n.gate.recovering(),
                held = n.gate.held(),
                least = ?n.pending.least(),
                ?queued,
                "waiting"
            );
        }
        tracing::debug!(travelling = ?self.root.replays_travelling().iter().take(8).collect::<Vec<_>>(), "replays");
    }

    /// Something happened: blocked instances look again.
    fn unblock(&mut self) {
        for n in &mut self.nodes {
            n.blocked = false;
        }
    }

    fn node(&self, n: NodeId) -> Option<&Node> {
        self.nodes.get(n.0)
    }

    fn node_mut(&mut self, n: NodeId) -> Option<&mut Node> {
        self.nodes.get_mut(n.0)
    }

    fn alive(&self, n: NodeId) -> bool {
        self.node(n).is_some_and(|x| x.alive)
    }

    /// Folds the commits the instances' clients report into the root's XOR vectors.
    fn collect_commits(&mut self) {
        let mut out = std::mem::take(&mut self.commits);
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.inst.state().take_commits(&mut out);
        }
        for (clock, x) in out.drain(..) {
            self.root.commit(clock, x);
        }
        self.commits = out;
        self.sync_deletes();
    }

    /// Passes the root's deletes to the log's copy in the store and to the vertices' records
    /// of what they emitted.
    fn sync_deletes(&mut self) {
        let deleted = self.root.take_deleted();
        for v in &mut self.vertices {
            if !v.emitted.is_empty() {
                for c in &deleted {
                    v.emitted.remove(c);
                }
            }
        }
        if let Some(sl) = &mut self.store_log {
            for c in deleted {
                sl.delete(c);
            }
        }
    }

    fn vertex_name(&self, v: usize) -> Option<String> {
        self.vertices.get(v).map(|x| x.plan.name.to_string())
    }
}

/// `inst`'s store client.
fn client(inst: &mut Instance) -> Option<&mut StoreClient> {
    sluice_runtime::plan::store_client(inst)
}
