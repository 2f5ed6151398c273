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
//! # Protocols (CHC §5; see docs/correctness.md)
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

use crate::observed::{Decision, Observed, OutputRecord, StateEntry};
use crate::reference::drop_decision;
use crate::root_log::StoreLog;
use crate::schedule::{Action, FaultEvent, Policy, ScaleTo};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sluice_nf::{Instance, LabelTable, NfRegistry, Verdict};
use sluice_packet::{Clock, InstanceId, MetaFlags, Packet, ParseStatus};
use sluice_runtime::plan::{build_instance, direction, split_key, Routes, Target, VertexPlan};
use sluice_runtime::{compile_with, Chain, PlanError, StateConfig};
use sluice_store::{Backend, ClientConfig, Mode, StoreClient};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

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

/// Where the root keeps its packet log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogPlace {
    /// In the root's memory: fast, lost with the root.
    Root,
    /// In the state store ([`crate::root_log`]): every packet is written, and acknowledged,
    /// before it enters the chain; survives a root crash.
    Store,
}

/// Engine parameters.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Virtual time between input packets.
    pub arrival_ns: u64,
    /// Virtual service time of one packet at one instance.
    pub service_ns: u64,
    /// Virtual time from one queue to the next.
    pub link_ns: u64,
    /// Most packets an instance takes from its queue at once.
    pub batch: usize,
    /// Most packets in the root's log; input past it is dropped and reported.
    pub log_capacity: usize,
    /// Where the log lives.
    pub log_place: LogPlace,
    /// The root persists its clock every this many packets.
    pub clock_persist_every: u64,
    /// Roots over statically partitioned input (by source address, so a host's packets all
    /// enter at one root and keep their order in its clocks), each with its own clock (root id
    /// in the high bits) and log entries.
    pub roots: u8,
    /// A store checkpoint is taken every this many input packets (0: never), and also after
    /// failovers and whenever an instance's write-ahead log is half full of updates made since
    /// the last one.
    pub checkpoint_every: u64,
    /// Entries each instance keeps in its write-ahead log.
    pub wal_capacity: usize,
    /// The root hears that a packet is done `link_ns` after the last NF emitted it (CHC's
    /// asynchronous delete, which saves the last NF a round trip) rather than before: a crash
    /// in between replays the packet, and the receiver gets it twice.
    pub async_delete: bool,
    /// Vertex managers evaluate policies every this many input packets.
    pub manager_every: u64,
    /// A clone and its straggler both run this many input packets after the replay before
    /// the slower one is retired.
    pub clone_trial: u64,
    /// Mechanism switches.
    pub switches: Switches,
    /// Seed of the random delays.
    pub seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            arrival_ns: 2_000,
            service_ns: 1_000,
            link_ns: 100,
            batch: 32,
            log_capacity: 1 << 20,
            log_place: LogPlace::Root,
            clock_persist_every: 100,
            roots: 1,
            checkpoint_every: 10_000,
            wal_capacity: ClientConfig::default().wal_capacity,
            async_delete: false,
            manager_every: 1_000,
            clone_trial: 2_000,
            switches: Switches::default(),
            seed: 0,
        }
    }
}

/// Why the engine failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The chain could not be built.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A state operation failed beyond what the protocols handle.
    #[error("state store: {0}")]
    Store(String),
    /// A fault names something that does not exist at that point of the run.
    #[error("fault at packet {at}: {msg}")]
    Fault {
        /// The packet count.
        at: u64,
        /// What is wrong.
        msg: String,
    },
}

/// One recovery or reconfiguration the engine carried out.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Episode {
    /// `crash`, `crash_root`, `crash_store`, `move`, `scale`, `clone`, `retire`.
    pub kind: String,
    /// The input packet count at which it started.
    pub at_packet: u64,
    /// The vertex concerned, if any.
    pub vertex: Option<String>,
    /// Wall-clock time of the framework's own procedure (building instances, flushing,
    /// rebuilding the store), microseconds.
    pub wall_us: f64,
    /// Virtual time until the episode completed (replay drained, barrier passed), µs.
    pub virtual_us: f64,
    /// Packets replayed from the root's log.
    pub replayed: u64,
    /// Flows moved.
    pub flows: u64,
    /// Detail.
    pub detail: String,
    /// Virtual time until the output latency was back to normal (median of the 500
    /// outputs after it within 1.5x of the 500 before), µs; `None` if it never was.
    pub back_to_normal_us: Option<f64>,
}

/// Counters of the mechanisms at work.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EngineStats {
    /// Input packets admitted.
    pub admitted: u64,
    /// Input packets dropped by the root (log full), malformed frames included separately.
    pub root_dropped: u64,
    /// Malformed or truncated frames dropped at the root.
    pub malformed: u64,
    /// Copies replayed from the root's log.
    pub replayed: u64,
    /// Duplicate packets dropped at queues (including the output).
    pub duplicates_suppressed: u64,
    /// Duplicate packets that reached a vertex's NF (suppression off), by vertex.
    pub duplicate_packets: BTreeMap<String, u64>,
    /// Updates issued while processing duplicate packets, by vertex.
    pub duplicate_updates: BTreeMap<String, u64>,
    /// Duplicate packets that reached the output.
    pub duplicate_outputs: u64,
    /// Updates the store recognised as duplicates (answered from its per-clock log).
    pub store_duplicates: u64,
    /// Per vertex, over all its instances: operations that waited for the store, and
    /// operations served by an instance's local copy.
    pub round_trips: BTreeMap<String, u64>,
    /// See `round_trips`.
    pub cache_hits: BTreeMap<String, u64>,
    /// Packets still in the root's log at the end (0 when everything committed).
    pub log_left: u64,
    /// With the log in the store: packets written to it (each acknowledged before it entered
    /// the chain) and the mean wall time of a write, µs.
    pub log_store_writes: u64,
    /// See `log_store_writes`.
    pub log_store_write_us: f64,
    /// Most packets in the log at once.
    pub log_peak: u64,
    /// Clocks persisted by the root.
    pub clock_persists: u64,
    /// Checkpoints taken.
    pub checkpoints: u64,
    /// Median output latency over the run, virtual µs.
    pub latency_p50_us: f64,
    /// 99th percentile output latency, virtual µs.
    pub latency_p99_us: f64,
}

/// What a run of the engine produced.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EngineReport {
    /// The observable result, for `verify`.
    pub observed: Observed,
    /// Mechanism counters.
    pub stats: EngineStats,
    /// Recoveries and reconfigurations.
    pub episodes: Vec<Episode>,
}

/// Something in a queue: a packet, or the barrier that ends a flow move at the old instance.
enum Item {
    Packet(Packet),
    Barrier(usize),
}

struct Queued {
    at: u64,
    item: Item,
}

/// One physical NF instance.
struct Node {
    vertex: usize,
    index: u16,
    inst: Instance,
    queue: VecDeque<Queued>,
    busy_until: u64,
    alive: bool,
    slow: Option<(u64, u64)>,
    /// Live packets held while a replay drains (replacement or clone).
    recovering: bool,
    held: Vec<Packet>,
    /// Per moved flow: its packets held until the old instance's barrier passes.
    move_held: HashMap<u64, Vec<Packet>>,
    /// Flows (split keys) this instance has received: what it reports to a recovering root,
    /// and which flows move when it is removed.
    flows: HashSet<u64>,
    processed: u64,
    busy_ns: u64,
    /// Duplicated from this node for a clone trial: (clone node, trial ends at packet count).
    clone_of: Option<usize>,
    /// Clocks that arrived here (duplicate suppression).
    seen: HashSet<Clock>,
    /// Per moved flow: when its held packets were released. The old instance's barrier is
    /// passed at the end of a batch that is still being served in virtual time; later packets
    /// of the flow queue behind the released ones.
    released: HashMap<u64, u64>,
}

/// A vertex of the physical chain.
struct Vertex {
    plan: VertexPlan,
    /// Active nodes, in slot order (the splitter hashes over these).
    members: Vec<usize>,
    /// Flows assigned elsewhere than the hash says (moved flows, flows kept in place by a
    /// scale-out).
    pins: HashMap<u64, usize>,
    /// Clocks this vertex's NF has decided on (drops, events): later processing of the same
    /// clock is a duplicate.
    decided: HashSet<Clock>,
    /// Packets of flows moved into `node` and held there, by flow.
    next_index: u16,
    /// Arrival counter, the vertex's own order (clocks switched off).
    arrivals: u64,
    /// The NF's state objects.
    decls: Vec<sluice_state::StateDecl>,
    /// Vertices reachable from this one (itself included): a replay copy aimed at an instance
    /// of vertex `t` only travels through vertices that reach `t`.
    reaches: Vec<bool>,
    /// During a clone trial: per flow, when the last of its packets processed here leaves.
    flow_out: HashMap<u64, u64>,
}

/// A root's logical clock: the last sequence number it stamped and the last it persisted.
#[derive(Debug, Clone, Copy, Default)]
struct RootClock {
    seq: u64,
    persisted: u64,
}

/// A packet leaving the chain.
struct Leaving {
    at: u64,
    order: u64,
    ingress: u64,
    clock: Clock,
    bytes: Vec<u8>,
    /// A replay of a packet the root knew had left already.
    emitted: bool,
}

struct LogEntry {
    input: u64,
    pkt: Packet,
    refs: u32,
    xor: u32,
    replayed: bool,
    /// The root has heard that a copy left the chain.
    left: bool,
}

/// A flow move in progress.
struct Move {
    from: usize,
    to: usize,
    keys: Vec<u64>,
    started_wall: Instant,
    started_virtual: u64,
    episode: usize,
    /// Remove `from` when the barrier passes (scale-in).
    retire_from: bool,
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
    log: BTreeMap<Clock, LogEntry>,
    clock_input: HashMap<Clock, u64>,
    /// The roots' clocks.
    roots: Vec<RootClock>,
    /// The clock of the last packet admitted.
    last_clock: Clock,
    /// Packets leaving the chain: (virtual time, order, ingress time, clock, frame, whether
    /// the root had marked it as already emitted).
    leaving: Vec<Leaving>,
    /// With asynchronous deletes: packets that left, whose "done" reaches the root at a time.
    late_deletes: VecDeque<(u64, Packet)>,
    /// Replay copies still travelling.
    replays_in_flight: HashMap<Clock, u32>,
    moves: Vec<Move>,
    commits: Vec<(Clock, u32)>,
    now: u64,
    rng: ChaCha8Rng,
    report: EngineReport,
    latencies: Vec<(u64, u64)>,
    policies: Vec<Policy>,
    /// Clone trials: (straggler, clone, decide at packet count).
    trials: Vec<(usize, usize, u64)>,
    /// Episodes waiting for the replay to drain.
    replay_episodes: Vec<(usize, u64)>,
    checkpoint: Option<sluice_store::Checkpoint>,
    /// An instance's write-ahead log was lost with it (failover, retirement): checkpoint at
    /// the next opportunity so store recovery never needs it.
    checkpoint_due: bool,
    /// Latest packet time admitted: timers due by then fire before the final state is read.
    last_ts: u64,
    /// The log's copy in the store (`LogPlace::Store`).
    store_log: Option<StoreLog>,
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
        let (cfg_log_place, backend_for_log) = (cfg.log_place, backend.clone());
        let roots = vec![RootClock::default(); usize::from(cfg.roots.max(1))];
        let plan = compile_with(chain, registry, &[], &state)?;
        let mut vertices: Vec<Vertex> = plan
            .vertices
            .iter()
            .map(|vp| Vertex {
                plan: vp.clone(),
                members: Vec::new(),
                pins: HashMap::new(),
                decided: HashSet::new(),
                next_index: vp.instances.len() as u16,
                arrivals: 0,
                decls: Vec::new(),
                reaches: Vec::new(),
                flow_out: HashMap::new(),
            })
            .collect();
        let reach = reachability(&plan.vertices);
        for (v, r) in vertices.iter_mut().zip(reach) {
            v.reaches = r;
        }
        let mut nodes = Vec::new();
        for (vi, mut inst) in plan.instances {
            if let Some(v) = vertices.get_mut(vi) {
                v.members.push(nodes.len());
                if v.decls.is_empty() {
                    v.decls = inst.nf().state_objects().to_vec();
                }
            }
            let index = inst.id().index();
            let _ = inst.state();
            nodes.push(new_node(vi, index, inst));
        }
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
            log: BTreeMap::new(),
            clock_input: HashMap::new(),
            roots,
            last_clock: Clock::default(),
            leaving: Vec::new(),
            late_deletes: VecDeque::new(),
            replays_in_flight: HashMap::new(),
            moves: Vec::new(),
            commits: Vec::new(),
            now: 0,
            report: EngineReport::default(),
            latencies: Vec::new(),
            policies,
            trials: Vec::new(),
            replay_episodes: Vec::new(),
            checkpoint: None,
            checkpoint_due: false,
            last_ts: 0,
            store_log: match cfg_log_place {
                LogPlace::Store => Some(StoreLog::connect(&backend_for_log).map_err(store_err)?),
                LogPlace::Root => None,
            },
        })
    }

    /// Runs `packets` through the physical chain with `faults` (absolute packet counts, sorted).
    pub fn run(mut self, packets: &[Packet], faults: &[(u64, FaultEvent)]) -> Result<EngineReport, EngineError> {
        self.report.observed.inputs = packets.len() as u64;
        let mut next_input = 0usize;
        let mut next_fault = 0usize;
        let mut events = 0u64;
        loop {
            let t_in = if next_input < packets.len() { next_input as u64 * self.cfg.arrival_ns } else { u64::MAX };
            let (t_node, node) = self.next_node();
            if let Some(&(t_del, _)) = self.late_deletes.front() {
                if t_del <= t_in.min(t_node) {
                    self.now = self.now.max(t_del);
                    if let Some((_, p)) = self.late_deletes.pop_front() {
                        self.left_chain(&p);
                    }
                    continue;
                }
            }
            if t_in == u64::MAX && t_node == u64::MAX {
                if self.settle_end()? {
                    break;
                }
                continue;
            }
            if t_in <= t_node {
                self.now = self.now.max(t_in);
                let Some(pkt) = packets.get(next_input) else { break };
                self.admit(next_input as u64, pkt)?;
                next_input += 1;
                let count = next_input as u64;
                while let Some((at, ev)) = faults.get(next_fault) {
                    if *at > count {
                        break;
                    }
                    next_fault += 1;
                    self.apply(count, &ev.action)?;
                }
                self.periodic(count)?;
            } else {
                self.now = self.now.max(t_node);
                self.serve(node)?;
            }
            events += 1;
            if events.is_multiple_of(64) {
                self.collect_commits();
            }
        }
        self.finish()
    }

    /// The node that can start next and when.
    fn next_node(&self) -> (u64, usize) {
        let mut best = (u64::MAX, usize::MAX);
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.alive {
                continue;
            }
            if let Some(q) = n.queue.front() {
                let t = n.busy_until.max(q.at);
                if t < best.0 {
                    best = (t, i);
                }
            }
        }
        best
    }

    /// Input is over and every queue is empty: wait for what is still held to be released.
    /// Returns whether the run is complete.
    fn settle_end(&mut self) -> Result<bool, EngineError> {
        self.collect_commits();
        self.check_replay_done();
        // The replay's end may have just released held packets into queues: serve them.
        if self.nodes.iter().any(|n| n.alive && !n.queue.is_empty()) {
            return Ok(false);
        }
        let held: usize = self
            .nodes
            .iter()
            .filter(|n| n.alive)
            .map(|n| n.held.len() + n.move_held.values().map(Vec::len).sum::<usize>())
            .sum();
        if held == 0 && self.moves.is_empty() {
            return Ok(true);
        }
        // Something is held with nothing left to release it: release it rather than lose it.
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.recovering = false;
            let now = self.now;
            for p in n.held.drain(..) {
                n.queue.push_back(Queued { at: now, item: Item::Packet(p) });
            }
        }
        if held > 0 && self.moves.is_empty() {
            return Ok(false);
        }
        Err(EngineError::Store("a flow move never completed: its barrier was lost".into()))
    }

    fn admit(&mut self, input: u64, original: &Packet) -> Result<(), EngineError> {
        if matches!(original.hdr().status, ParseStatus::Truncated | ParseStatus::Malformed) {
            self.report.stats.malformed += 1;
            self.report.observed.root_dropped.push(input);
            return Ok(());
        }
        if self.log.len() >= self.cfg.log_capacity {
            self.report.stats.root_dropped += 1;
            self.report.observed.root_dropped.push(input);
            return Ok(());
        }
        let root = self.root_of(original);
        let persist_every = self.cfg.clock_persist_every;
        let Some(rc) = self.roots.get_mut(usize::from(root)) else { return Ok(()) };
        rc.seq += 1;
        if rc.seq >= rc.persisted + persist_every {
            rc.persisted = rc.seq;
            self.report.stats.clock_persists += 1;
        }
        let mut pkt = original.clone();
        pkt.meta.clock = Clock::new(root, rc.seq);
        self.last_clock = pkt.meta.clock;
        pkt.meta.ingress_ns = self.now;
        pkt.meta.xor = 0;
        self.last_ts = self.last_ts.max(pkt.meta.ts_ns);
        let clock = pkt.meta.clock;
        self.clock_input.insert(clock, input);
        self.report.stats.admitted += 1;
        if let Some(sl) = &mut self.store_log {
            // Durable before it enters the chain.
            sl.write(input, &pkt).map_err(store_err)?;
        }
        self.log.insert(clock, LogEntry { input, pkt: pkt.clone(), refs: 1, xor: 0, replayed: false, left: false });
        self.report.stats.log_peak = self.report.stats.log_peak.max(self.log.len() as u64);
        if self.traffic.as_ref().is_some_and(|f| !f.matches(&pkt)) {
            self.deliver(Target::Output, pkt, self.now);
            return Ok(());
        }
        let routes = self.entry[direction(&pkt, self.entry.len())].clone();
        self.route(&routes, pkt, self.now, "input", input);
        Ok(())
    }

    /// The root whose share of the input `pkt` is: a static partition by source address.
    fn root_of(&self, pkt: &Packet) -> u8 {
        let n = self.roots.len() as u64;
        if n <= 1 {
            return 0;
        }
        let h = match pkt.tuple().map(|t| t.src) {
            Some(std::net::IpAddr::V4(a)) => u64::from(u32::from(a)),
            Some(std::net::IpAddr::V6(a)) => {
                let b = a.octets();
                b.iter().fold(0u64, |h, x| h.rotate_left(8) ^ u64::from(*x))
            }
            None => 0,
        };
        // Multiplicative hashing spreads neighbouring addresses over the roots.
        ((h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % n) as u8
    }

    /// Sends `pkt` along `routes` at time `at`.
    fn route(&mut self, routes: &Routes, pkt: Packet, at: u64, from: &str, input: u64) {
        for t in routes.mirror_targets(&pkt).collect::<Vec<_>>() {
            let mut copy = pkt.clone();
            // The original carries the vector of the updates so far; a copy starts empty so
            // that the root folds each update in once.
            copy.meta.xor = 0;
            self.add_ref(&copy);
            self.deliver(t, copy, at + self.cfg.link_ns);
        }
        match routes.main_target(&pkt) {
            Some(t) => self.deliver(t, pkt, at + self.cfg.link_ns),
            None => {
                self.decide(None, &pkt, drop_decision(input, from, "no-route"));
                self.finished(&pkt);
            }
        }
    }

    fn add_ref(&mut self, pkt: &Packet) {
        if let Some(e) = self.log.get_mut(&pkt.meta.clock) {
            e.refs += 1;
        }
        if pkt.meta.flags.contains(MetaFlags::REPLAYED) {
            *self.replays_in_flight.entry(pkt.meta.clock).or_default() += 1;
        }
    }

    /// A copy of a packet is done (left the chain, dropped, consumed, suppressed).
    fn finished(&mut self, pkt: &Packet) {
        let clock = pkt.meta.clock;
        if pkt.meta.flags.contains(MetaFlags::REPLAYED) {
            if let Some(n) = self.replays_in_flight.get_mut(&clock) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.replays_in_flight.remove(&clock);
                    // Replay applied every update along the path with blocking, tagged
                    // operations: whatever the lost copy left uncommitted is committed now.
                    if let Some(e) = self.log.get_mut(&clock) {
                        e.replayed = true;
                    }
                }
            }
        }
        if let Some(e) = self.log.get_mut(&clock) {
            e.refs = e.refs.saturating_sub(1);
            e.xor ^= pkt.meta.xor;
        }
        self.maybe_delete(clock);
    }

    /// A copy left the chain and the root heard of it.
    fn left_chain(&mut self, pkt: &Packet) {
        if let Some(e) = self.log.get_mut(&pkt.meta.clock) {
            e.left = true;
        }
        self.finished(pkt);
    }

    fn maybe_delete(&mut self, clock: Clock) {
        let xor_check = self.cfg.switches.xor_check;
        if let Some(e) = self.log.get(&clock) {
            if e.refs == 0 && (!xor_check || e.xor == 0 || e.replayed) {
                self.log.remove(&clock);
                if let Some(sl) = &mut self.store_log {
                    sl.delete(clock);
                }
            }
        }
    }

    fn collect_commits(&mut self) {
        let mut out = std::mem::take(&mut self.commits);
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.inst.state().take_commits(&mut out);
        }
        for (clock, x) in out.drain(..) {
            if let Some(e) = self.log.get_mut(&clock) {
                e.xor ^= x;
            }
            self.maybe_delete(clock);
        }
        self.commits = out;
    }

    /// Records a decision unless the vertex already decided on this clock.
    fn decide(&mut self, vertex: Option<usize>, pkt: &Packet, d: Decision) {
        if let Some(v) = vertex.and_then(|v| self.vertices.get_mut(v)) {
            if self.cfg.switches.duplicate_suppression && !v.decided.insert(pkt.meta.clock) {
                return;
            }
        }
        self.report.observed.decisions.push(d);
    }

    /// Puts `pkt` in the queue of the instance of `target` that serves it.
    fn deliver(&mut self, target: Target, pkt: Packet, at: u64) {
        let v = match target {
            Target::Output if pkt.meta.flags.contains(MetaFlags::REPLAYED) && pkt.meta.target.is_some() => {
                // A replay copy that never met its target has nothing to deliver.
                self.finished(&pkt);
                return;
            }
            Target::Output => {
                let order = self.leaving.len() as u64;
                self.leaving.push(Leaving {
                    at,
                    order,
                    ingress: pkt.meta.ingress_ns,
                    clock: pkt.meta.clock,
                    bytes: pkt.data().to_vec(),
                    emitted: pkt.meta.flags.contains(MetaFlags::EMITTED),
                });
                if self.cfg.async_delete {
                    // The root hears of it after it left: a crash before then replays it.
                    self.late_deletes.push_back((at + self.cfg.link_ns, pkt));
                } else {
                    // The root hears the packet is done before it leaves (synchronous
                    // delete): a crash after this point cannot replay it into a duplicate.
                    self.left_chain(&pkt);
                }
                return;
            }
            Target::Vertex(v) => v,
        };
        let replayed = pkt.meta.flags.contains(MetaFlags::REPLAYED) && pkt.meta.target.is_some();
        if let Some(t) = pkt.meta.target.filter(|_| replayed) {
            // Duplicate upstream processing is limited to the path towards the replay's
            // target: elsewhere the copy would make NFs that already processed this clock
            // run again against later state (a replayed SYN of a connection closed since,
            // say), for no output anyone needs.
            let toward = self.vertices.get(v).is_some_and(|x| x.reaches.get(usize::from(t.vertex())) == Some(&true));
            if !toward {
                self.finished(&pkt);
                return;
            }
        }
        let Some(vx) = self.vertices.get_mut(v) else { return };
        let key = split_key(&pkt, &vx.plan.split);
        let slot = match vx.pins.get(&key) {
            Some(&n) => n,
            None => {
                let i = sluice_runtime::plan::split_index(&pkt, &vx.plan.split, vx.members.len(), &split_hasher());
                vx.members.get(i).copied().unwrap_or(usize::MAX)
            }
        };
        // A replayed packet aimed at a clone goes to the clone, not to the straggler.
        let node = if replayed {
            self.nodes.iter().position(|n| n.alive && n.clone_of == Some(slot)).unwrap_or(slot)
        } else {
            slot
        };
        let clone = self.nodes.iter().position(|n| n.alive && n.clone_of == Some(slot));
        if !replayed {
            if let Some(c) = clone {
                // Live traffic of a straggler goes to its clone as well; like a mirror copy it
                // starts with an empty XOR vector so the root folds upstream updates in once.
                let mut copy = pkt.clone();
                copy.meta.xor = 0;
                self.add_ref(&copy);
                self.enqueue(c, copy, at, key);
            }
        }
        self.enqueue(node, pkt, at, key);
    }

    fn enqueue(&mut self, node: usize, pkt: Packet, at: u64, key: u64) {
        let Some(n) = self.nodes.get_mut(node) else {
            self.finished(&pkt);
            return;
        };
        if !n.alive {
            self.finished(&pkt);
            return;
        }
        n.flows.insert(key);
        let replayed = pkt.meta.flags.contains(MetaFlags::REPLAYED);
        if let Some(h) = n.move_held.get_mut(&key) {
            h.push(pkt);
            return;
        }
        if n.recovering && !replayed {
            n.held.push(pkt);
            return;
        }
        let at = n.released.get(&key).map_or(at, |r| at.max(*r));
        // Keep the queue in arrival order.
        let pos = n.queue.iter().rposition(|q| q.at <= at).map_or(0, |p| p + 1);
        n.queue.insert(pos, Queued { at, item: Item::Packet(pkt) });
    }

    /// Serves one batch at `node`.
    fn serve(&mut self, node: usize) -> Result<(), EngineError> {
        let start = {
            let Some(n) = self.nodes.get(node) else { return Ok(()) };
            let Some(q) = n.queue.front() else { return Ok(()) };
            n.busy_until.max(q.at)
        };
        let mut batch: Vec<Packet> = Vec::new();
        let mut barrier = None;
        let mut suppressed = Vec::new();
        let suppress = self.cfg.switches.duplicate_suppression;
        if let Some(n) = self.nodes.get_mut(node) {
            let decided = self.vertices.get(n.vertex).map(|v| &v.decided);
            let is_clone = n.clone_of.is_some();
            let id = n.inst.id();
            while batch.len() < self.cfg.batch {
                match n.queue.front() {
                    Some(q) if q.at <= start => {}
                    _ => break,
                }
                let Some(q) = n.queue.pop_front() else { break };
                match q.item {
                    Item::Packet(p) => {
                        // Duplicates are dropped where they arrive, in arrival order; a replay
                        // copy on its way to its target passes.
                        let to_target = p.meta.flags.contains(MetaFlags::REPLAYED) && p.meta.target.is_some();
                        let first_here = n.seen.insert(p.meta.clock);
                        // Processed by another instance of the vertex already (a straggler
                        // and its clone both receive live traffic): its effects are in the
                        // store, and processing it again would read later state.
                        let elsewhere = decided.is_some_and(|d| d.contains(&p.meta.clock));
                        // A clone's replay need not redo what its straggler did: the store
                        // has it (the straggler flushed when the clone started). And the target
                        // of a replay drops a clock it has processed already (two failures at
                        // once replay some packets twice); upstream of it the copy passes.
                        let at_target = to_target && p.meta.target == Some(id);
                        if suppress
                            && ((elsewhere && (!to_target || is_clone)) || (!first_here && (!to_target || at_target)))
                        {
                            suppressed.push(p);
                            continue;
                        }
                        if !first_here && !to_target {
                            let name = self.vertices.get(n.vertex).map(|v| v.plan.name.to_string()).unwrap_or_default();
                            *self.report.stats.duplicate_packets.entry(name).or_default() += 1;
                        }
                        batch.push(p)
                    }
                    Item::Barrier(m) => {
                        barrier = Some(m);
                        break;
                    }
                }
            }
        }
        self.report.stats.duplicates_suppressed += suppressed.len() as u64;
        for p in &suppressed {
            self.finished(p);
        }
        let mut t = start;
        if !batch.is_empty() {
            let twin = self.twin_of(node);
            if let Some(tw) = twin.and_then(|tw| self.nodes.get_mut(tw)) {
                // The twin's updates reach the store before this instance reads what they touched.
                tw.inst.state().flush().map_err(store_err)?;
            }
            t = self.process_batch(node, batch, start)?;
            if let Some(tw) = twin {
                let written = self.nodes.get_mut(node).and_then(|n| client(&mut n.inst)).map(|c| c.take_written());
                if let (Some(keys), Some(c)) = (written, self.nodes.get_mut(tw).and_then(|n| client(&mut n.inst))) {
                    c.forget_cached(&keys);
                }
            }
        }
        if let Some(n) = self.nodes.get_mut(node) {
            n.busy_until = t;
        }
        if let Some(m) = barrier {
            self.barrier_passed(m)?;
        }
        Ok(())
    }

    /// The other instance of a clone trial `node` is part of, while both run.
    fn twin_of(&self, node: usize) -> Option<usize> {
        let alive = |n: usize| self.nodes.get(n).is_some_and(|x| x.alive);
        self.trials.iter().find_map(|&(s, c, _)| match node {
            _ if !alive(s) || !alive(c) => None,
            n if n == s => Some(c),
            n if n == c => Some(s),
            _ => None,
        })
    }

    fn process_batch(&mut self, node: usize, batch: Vec<Packet>, start: u64) -> Result<u64, EngineError> {
        let twinned = self.twin_of(node).is_some();
        let mut t = start;
        let Some(n) = self.nodes.get_mut(node) else { return Ok(t) };
        let v = n.vertex;
        let Some(vx) = self.vertices.get_mut(v) else { return Ok(t) };
        let vp = vx.plan.clone();
        n.inst.begin_batch();
        let mut outs: Vec<(Packet, Verdict, u64, bool)> = Vec::with_capacity(batch.len());
        for mut pkt in batch {
            let mut service = self.cfg.service_ns;
            if let Some((lo, hi)) = n.slow {
                service += self.rng.gen_range(lo..=hi) * 1_000;
            }
            t += service;
            n.busy_ns += service;
            n.processed += 1;
            if twinned {
                // A straggler and its clone take turns on a flow's packets: neither may emit
                // one before the other has emitted the flow's previous one.
                let key = split_key(&pkt, &vx.plan.split);
                t = t.max(vx.flow_out.get(&key).map_or(0, |f| f + 1));
                vx.flow_out.insert(key, t);
            }
            let real = pkt.meta.clock;
            let replayed = pkt.meta.flags.contains(MetaFlags::REPLAYED);
            // The first processing of a clock at this vertex decides; later ones (replays,
            // duplicates) repeat decisions that were already taken.
            let first = vx.decided.insert(real);
            let record = first || !self.cfg.switches.duplicate_suppression;
            let duplicate = !first && !replayed;
            let before = if duplicate { updates_of(&mut n.inst) } else { 0 };
            if !self.cfg.switches.clocks {
                vx.arrivals += 1;
                pkt.meta.clock = Clock::new(0, vx.arrivals);
            }
            let verdict = n.inst.process(&mut pkt);
            pkt.meta.clock = real;
            if duplicate {
                let name = vp.name.to_string();
                *self.report.stats.duplicate_updates.entry(name).or_default() += updates_of(&mut n.inst) - before;
            }
            for mut e in n.inst.take_events() {
                if !self.cfg.switches.clocks {
                    // Events carry the clock the NF saw; the record keeps the real one.
                    e.clock = real;
                }
                if record {
                    let input = self.clock_input.get(&e.clock).copied().unwrap_or(u64::MAX);
                    self.report.observed.decisions.push(Decision {
                        input,
                        vertex: e.nf.clone(),
                        kind: e.kind.to_string(),
                        subject: e.subject,
                        detail: e.detail,
                    });
                }
            }
            // The target of a replay clears its mark: downstream the copy is subject to
            // duplicate suppression like any packet (it stays a replay copy for the root).
            if pkt.meta.target == Some(n.inst.id()) {
                pkt.meta.target = None;
            }
            outs.push((pkt, verdict, t, record));
        }
        n.inst.end_batch();
        for (pkt, verdict, at, first) in outs {
            let input = self.clock_input.get(&pkt.meta.clock).copied().unwrap_or(u64::MAX);
            let out = match verdict {
                Verdict::Forward => 0,
                Verdict::Output(i) => usize::from(i) + 1,
                Verdict::Drop(reason) => {
                    if first {
                        self.report.observed.decisions.push(drop_decision(input, &vp.name, reason));
                    }
                    self.finished(&pkt);
                    continue;
                }
            };
            if vp.off_path {
                self.finished(&pkt);
                continue;
            }
            match vp.routes.get(direction(&pkt, vp.routes.len())).and_then(|r| r.get(out)).cloned() {
                Some(routes) => self.route(&routes, pkt, at, &vp.name, input),
                None => {
                    if first {
                        self.report.observed.decisions.push(drop_decision(input, &vp.name, "no-route"));
                    }
                    self.finished(&pkt);
                }
            }
        }
        Ok(t)
    }

    /// Checkpoints, vertex managers and clone trials, evaluated as input arrives.
    fn periodic(&mut self, count: u64) -> Result<(), EngineError> {
        // A write-ahead log half full of updates since the last checkpoint: a rebuild would
        // soon miss some. (Looked at every 64 packets: far fewer than half a log fills.)
        let wal_full = count.is_multiple_of(64)
            && self
                .nodes
                .iter_mut()
                .filter(|n| n.alive)
                .any(|n| client(&mut n.inst).is_some_and(|c| !c.wal_has_room()));
        let due = (self.checkpoint_due || wal_full) && self.replays_in_flight.is_empty();
        if due {
            self.checkpoint_due = false;
        }
        if due || (self.cfg.checkpoint_every > 0 && count.is_multiple_of(self.cfg.checkpoint_every)) {
            self.take_checkpoint()?;
        }
        if self.cfg.manager_every > 0 && count.is_multiple_of(self.cfg.manager_every) && !self.policies.is_empty() {
            self.manage(count)?;
        }
        self.check_replay_done();
        let due: Vec<_> = self.trials.iter().copied().filter(|(_, _, at)| *at <= count).collect();
        if !due.is_empty() {
            self.trials.retain(|(_, _, at)| *at > count);
            for (straggler, clone, _) in due {
                self.end_trial(count, straggler, clone)?;
            }
        }
        Ok(())
    }

    fn take_checkpoint(&mut self) -> Result<(), EngineError> {
        // Flush so the checkpoint and the clients' logs agree on what it contains.
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.inst.state().flush().map_err(store_err)?;
        }
        let cp = self.backend.checkpoint().map_err(store_err)?;
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            if let Some(c) = client(&mut n.inst) {
                c.checkpointed();
            }
        }
        self.checkpoint = Some(cp);
        self.report.stats.checkpoints += 1;
        Ok(())
    }

    /// Applies one fault-schedule action.
    fn apply(&mut self, count: u64, action: &Action) -> Result<(), EngineError> {
        match action {
            Action::Crash { vertex, instance } => {
                let node = self.find(count, vertex, *instance)?;
                self.crash(count, node)
            }
            Action::CrashRoot { root } => self.crash_root(count, *root),
            Action::CrashStore => self.crash_store(count),
            Action::Scale { vertex, to } => {
                let v = self.vertex_index(count, vertex)?;
                let now = self.vertices.get(v).map_or(0, |x| x.members.len()) as i64;
                let target = match to {
                    ScaleTo::Exactly(n) => i64::from(*n),
                    ScaleTo::By(d) => now + i64::from(*d),
                };
                self.scale(count, v, target.clamp(1, 64) as usize)
            }
            Action::Move { vertex, from, to, flows } => {
                let a = self.find(count, vertex, *from)?;
                let b = self.find(count, vertex, *to)?;
                let keys: Vec<u64> = {
                    let Some(n) = self.nodes.get(a) else { return Ok(()) };
                    let mut k: Vec<u64> = n.flows.iter().copied().collect();
                    k.sort_unstable();
                    k.truncate(flows.map_or(usize::MAX, |f| f as usize));
                    k
                };
                self.start_move(count, a, b, keys, false)
            }
            Action::Slow { vertex, instance, delay_us } => {
                let node = self.find(count, vertex, *instance)?;
                if let Some(n) = self.nodes.get_mut(node) {
                    n.slow = if delay_us.1 == 0 { None } else { Some(*delay_us) };
                }
                Ok(())
            }
            Action::Clone { vertex, instance } => {
                let node = self.find(count, vertex, *instance)?;
                self.clone_instance(count, node)
            }
        }
    }

    fn vertex_index(&self, count: u64, name: &str) -> Result<usize, EngineError> {
        self.vertices
            .iter()
            .position(|v| &*v.plan.name == name)
            .ok_or_else(|| EngineError::Fault { at: count, msg: format!("no vertex `{name}`") })
    }

    /// The live node holding slot `instance` of `vertex`.
    fn find(&self, count: u64, vertex: &str, instance: u16) -> Result<usize, EngineError> {
        let v = self.vertex_index(count, vertex)?;
        self.vertices.get(v).and_then(|x| x.members.get(usize::from(instance))).copied().ok_or_else(|| {
            EngineError::Fault {
                at: count,
                msg: format!(
                    "vertex `{vertex}` has {} instance(s) at this point, no instance {instance}",
                    self.vertices.get(v).map_or(0, |x| x.members.len())
                ),
            }
        })
    }

    fn build(&mut self, vertex: usize, index: u16, instances: u16) -> Result<Instance, EngineError> {
        Ok(build_instance(self.chain, self.registry, &self.labels, vertex, index, instances, &self.state)?)
    }

    /// Replays every logged packet (in clock order), aimed at `target`.
    fn replay(&mut self, target: InstanceId) -> u64 {
        // An entry whose copy the root knows has left is kept only for its uncommitted
        // updates: the replay must not emit it again.
        let entries: Vec<(Packet, bool)> = self.log.values().map(|e| (e.pkt.clone(), e.left)).collect();
        let mut n = 0;
        let len = entries.len();
        for (i, (mut pkt, emitted)) in entries.into_iter().enumerate() {
            pkt.meta.flags.insert(MetaFlags::REPLAYED);
            if emitted {
                pkt.meta.flags.insert(MetaFlags::EMITTED);
            }
            if i + 1 == len {
                pkt.meta.flags.insert(MetaFlags::LAST);
            }
            pkt.meta.target = Some(target);
            pkt.meta.xor = 0;
            let input = self.log.get(&pkt.meta.clock).map_or(u64::MAX, |e| e.input);
            self.add_ref(&pkt);
            if self.traffic.as_ref().is_some_and(|f| !f.matches(&pkt)) {
                self.deliver(Target::Output, pkt, self.now);
            } else {
                let routes = self.entry[direction(&pkt, self.entry.len())].clone();
                self.route(&routes, pkt, self.now, "input", input);
            }
            n += 1;
        }
        self.report.stats.replayed += n;
        n
    }

    fn crash(&mut self, count: u64, node: usize) -> Result<(), EngineError> {
        let wall = Instant::now();
        let (vertex, index, lost) = {
            let Some(n) = self.nodes.get_mut(node) else { return Ok(()) };
            n.alive = false;
            let lost: Vec<Packet> = n
                .queue
                .drain(..)
                .filter_map(|q| match q.item {
                    Item::Packet(p) => Some(p),
                    Item::Barrier(_) => None,
                })
                .chain(n.held.drain(..))
                .chain(n.move_held.drain().flat_map(|(_, v)| v))
                .collect();
            (n.vertex, n.index, lost)
        };
        for p in &lost {
            // The copy is gone; its updates are re-done by the replay.
            if let Some(e) = self.log.get_mut(&p.meta.clock) {
                e.refs = e.refs.saturating_sub(1);
            }
            if p.meta.flags.contains(MetaFlags::REPLAYED) {
                if let Some(c) = self.replays_in_flight.get_mut(&p.meta.clock) {
                    *c = c.saturating_sub(1);
                    if *c == 0 {
                        self.replays_in_flight.remove(&p.meta.clock);
                    }
                }
            }
        }
        // The replacement takes the failed instance's id: the store attaches its per-flow
        // state and timers to it.
        let instances = self.vertices.get(vertex).map_or(1, |v| v.members.len()) as u16;
        let mut inst = self.build(vertex, index, instances)?;
        let id = inst.id();
        self.adopt_timers(&mut inst, id)?;
        let mut fresh = new_node(vertex, index, inst);
        fresh.recovering = true;
        fresh.flows = self.nodes.get(node).map(|n| n.flows.clone()).unwrap_or_default();
        fresh.busy_until = self.now;
        let new = self.nodes.len();
        self.nodes.push(fresh);
        self.replace_everywhere(node, new);
        // A straggler's clone may still be running beside the replacement.
        self.refresh_sharing(vertex)?;
        // Moves from or to the failed instance continue with its replacement.
        for m in &mut self.moves {
            if m.from == node {
                m.from = new;
                // Its barrier was lost with its queue: the replacement passes it at once.
                if let Some(n) = self.nodes.get_mut(new) {
                    n.queue.push_front(Queued { at: self.now, item: Item::Barrier(usize::MAX) });
                }
            }
            if m.to == node {
                m.to = new;
                if let Some(n) = self.nodes.get_mut(new) {
                    for k in &m.keys {
                        n.move_held.entry(*k).or_default();
                    }
                }
            }
        }
        self.fix_lost_barriers();
        let id = InstanceId::new(vertex as u16, index);
        let detail = format!("instance {index} failed with {} queued packet(s)", lost.len());
        self.replay_episode("crash", count, vertex, id, wall, detail);
        self.check_replay_done();
        Ok(())
    }

    /// Replays the log towards `target` and records the episode, whose virtual time runs until
    /// the replay has drained.
    fn replay_episode(
        &mut self,
        kind: &str,
        count: u64,
        vertex: usize,
        target: InstanceId,
        wall: Instant,
        detail: String,
    ) {
        let replayed = self.replay(target);
        let name = self.vertices.get(vertex).map(|v| v.plan.name.to_string());
        self.report.episodes.push(Episode {
            kind: kind.into(),
            at_packet: count,
            vertex: name,
            wall_us: wall.elapsed().as_secs_f64() * 1e6,
            replayed,
            detail,
            ..Episode::default()
        });
        self.replay_episodes.push((self.report.episodes.len() - 1, self.now));
    }

    /// A barrier for a move from a node that crashed: the move's `from` now points at the
    /// replacement, which gets a barrier of its own so the move completes.
    fn fix_lost_barriers(&mut self) {
        let pending: Vec<(usize, usize)> = self.moves.iter().enumerate().map(|(i, m)| (i, m.from)).collect();
        for (i, from) in pending {
            if let Some(n) = self.nodes.get_mut(from) {
                for q in n.queue.iter_mut() {
                    if let Item::Barrier(b) = &mut q.item {
                        if *b == usize::MAX {
                            *b = i;
                        }
                    }
                }
            }
        }
    }

    /// Makes `new` take `old`'s place in membership, pins and clone relations.
    fn replace_everywhere(&mut self, old: usize, new: usize) {
        for v in &mut self.vertices {
            for m in &mut v.members {
                if *m == old {
                    *m = new;
                }
            }
            for p in v.pins.values_mut() {
                if *p == old {
                    *p = new;
                }
            }
        }
        for n in &mut self.nodes {
            if n.clone_of == Some(old) {
                n.clone_of = Some(new);
            }
        }
        for t in &mut self.trials {
            if t.0 == old {
                t.0 = new;
            }
        }
    }

    /// Re-arms, in a replacement, the timers its predecessor had armed (from the store's copy).
    fn adopt_timers(&self, inst: &mut Instance, id: InstanceId) -> Result<(), EngineError> {
        let cp = self.backend.checkpoint().map_err(store_err)?;
        if let Some(c) = client(inst) {
            for (key, deadline, owner) in &cp.timers {
                if *owner == id && key.vertex == id.vertex() {
                    c.adopt_timer(sluice_state::ObjectId(key.object), &key.key, *deadline);
                }
            }
        }
        Ok(())
    }

    /// Releases recovering nodes once no replayed copy is travelling.
    fn check_replay_done(&mut self) {
        if !self.replays_in_flight.is_empty() {
            return;
        }
        let now = self.now;
        for n in self.nodes.iter_mut().filter(|n| n.alive && n.recovering) {
            n.recovering = false;
            for p in n.held.drain(..) {
                let pos = n.queue.len();
                n.queue.insert(pos, Queued { at: now, item: Item::Packet(p) });
            }
        }
        if !self.replay_episodes.is_empty() {
            self.checkpoint_due = true;
        }
        for (e, started) in self.replay_episodes.drain(..) {
            if let Some(ep) = self.report.episodes.get_mut(e) {
                ep.virtual_us = now.saturating_sub(started) as f64 / 1e3;
            }
        }
    }

    fn crash_root(&mut self, count: u64, root: u8) -> Result<(), EngineError> {
        let wall = Instant::now();
        let roots = self.roots.len();
        if usize::from(root) >= roots {
            return Err(EngineError::Fault {
                at: count,
                msg: format!("no root {root}: the chain has {roots} root(s)"),
            });
        }
        let lost_log = self.cfg.log_place == LogPlace::Root;
        let logged = self.log.keys().filter(|c| c.root() == root).count();
        let mut read_back = String::new();
        if lost_log {
            // In-flight packets finish without a log entry; none can be replayed any more.
            self.log.retain(|c, _| c.root() != root);
        } else {
            read_back = self.reload_log("the new root")?;
        }
        // The new root resumes past any clock the old one may have used.
        let persist_every = self.cfg.clock_persist_every;
        let Some(rc) = self.roots.get_mut(usize::from(root)) else { return Ok(()) };
        rc.seq = rc.persisted + persist_every;
        rc.persisted = rc.seq;
        let resumed = rc.seq;
        // The root's splitter learns the flow allocation from the instances of the vertices
        // it feeds.
        let entry_vertices: HashSet<usize> = self
            .entry
            .iter()
            .flat_map(|r| r.main.iter().chain(r.mirrors.iter()))
            .filter_map(|r| match r.to {
                Target::Vertex(v) => Some(v),
                Target::Output => None,
            })
            .collect();
        let mut restored = 0u64;
        for v in entry_vertices {
            let Some(vx) = self.vertices.get(v) else { continue };
            let members = vx.members.clone();
            let mut pins = HashMap::new();
            for (slot, &m) in members.iter().enumerate() {
                if let Some(n) = self.nodes.get(m) {
                    for k in &n.flows {
                        // Only flows placed against the hash need a pin.
                        if (*k % members.len().max(1) as u64) as usize != slot || vx.pins.contains_key(k) {
                            pins.insert(*k, m);
                        }
                    }
                }
            }
            restored += members.iter().filter_map(|m| self.nodes.get(*m)).map(|n| n.flows.len() as u64).sum::<u64>();
            if let Some(vx) = self.vertices.get_mut(v) {
                vx.pins = pins;
            }
        }
        self.report.episodes.push(Episode {
            kind: "crash_root".into(),
            at_packet: count,
            wall_us: wall.elapsed().as_secs_f64() * 1e6,
            flows: restored,
            detail: format!(
                "{}clock resumes at {resumed}; {}",
                if roots > 1 { format!("root {root}: ") } else { String::new() },
                if lost_log { format!("{logged} logged packet(s) lost with the root's log") } else { read_back }
            ),
            ..Episode::default()
        });
        Ok(())
    }

    /// Replaces the in-memory log by what the store holds (`LogPlace::Store`): after a root
    /// crash the new root has nothing else; after a store crash the store has only what its
    /// checkpoint kept. Entries the store lost cannot be replayed any more; entries the old
    /// root had deleted (its delete had not reached the store) are deleted again. The copies
    /// in flight and the XOR vectors of the entries are kept with the log.
    fn reload_log(&mut self, who: &str) -> Result<String, EngineError> {
        let Some(sl) = &mut self.store_log else { return Ok(String::new()) };
        let stored = StoreLog::read(&self.backend).map_err(store_err)?;
        let old = std::mem::take(&mut self.log);
        let (mut kept, mut stale) = (0u64, 0u64);
        for (clock, logged) in stored {
            match old.get(&clock) {
                Some(e) => {
                    kept += 1;
                    let entry = LogEntry { input: logged.input, pkt: logged.packet, ..*e };
                    self.log.insert(clock, entry);
                }
                None => {
                    stale += 1;
                    sl.delete(clock);
                }
            }
        }
        sl.sync().map_err(store_err)?;
        let lost = old.len() as u64 - kept;
        Ok(format!("{who} read {kept} logged packet(s) back from the store ({lost} lost, {stale} already done)"))
    }

    fn crash_store(&mut self, count: u64) -> Result<(), EngineError> {
        let wall = Instant::now();
        let mut logs = Vec::new();
        let mut per_flow = Vec::new();
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            if let Some(c) = client(&mut n.inst) {
                logs.push(sluice_store::recovery::RecoveryLog {
                    instance: c.id(),
                    wal: c.wal().iter().cloned().collect(),
                    reads: c
                        .reads()
                        .iter()
                        .map(|r| sluice_store::recovery::ReadRecord {
                            key: r.key,
                            value: r.value.clone(),
                            ts: r.ts.clone(),
                        })
                        .collect(),
                });
                per_flow.extend(c.per_flow_values());
            }
        }
        let checkpoint = self.checkpoint.clone().unwrap_or_default();
        without_baseline_duplicates(&mut logs, &checkpoint);
        self.backend.wipe().map_err(store_err)?;
        // Custom operations first: re-executed updates may use them.
        self.reregister_custom_ops()?;
        // Per-flow state comes from the instances' copies, which also know what was deleted
        // since the checkpoint; none of it is re-executed from the logs.
        let cached: HashSet<sluice_store::StoreKey> = per_flow.iter().map(|(k, _)| *k).collect();
        let present: Vec<_> = per_flow.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
        let alive: HashSet<sluice_store::StoreKey> = present.iter().map(|(k, _)| *k).collect();
        let mut plan = sluice_store::recovery::plan(&checkpoint, &logs, present);
        // A per-flow value an instance knows to be gone stays gone.
        plan.values.retain(|(k, _)| !self.is_per_flow(k) || !cached.contains(k) || alive.contains(k));
        plan.replay.retain(|(_, e)| !self.is_per_flow(&e.key));
        let stats =
            sluice_store::recovery::apply(self.backend.as_ref(), &plan, &checkpoint.timers).map_err(store_err)?;
        self.mark_in_flight(&logs)?;
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            let id = n.inst.id();
            let conn = self.backend.connect(id).map_err(store_err)?;
            if let Some(c) = client(&mut n.inst) {
                c.reconnect(conn).map_err(store_err)?;
            }
        }
        let mut detail = format!("{stats:?}");
        if let Some(sl) = &mut self.store_log {
            sl.reconnect(&self.backend).map_err(store_err)?;
            detail = format!("{detail}; the root's log: {}", self.reload_log("the root")?);
        }
        self.report.episodes.push(Episode {
            kind: "crash_store".into(),
            at_packet: count,
            wall_us: wall.elapsed().as_secs_f64() * 1e6,
            detail,
            ..Episode::default()
        });
        Ok(())
    }

    /// Tells a rebuilt store which updates of packets still in the root's log it holds: their
    /// tags go into its per-clock log (as no-op updates of a scratch value), so a later replay
    /// of those packets is recognised as a duplicate rather than applied twice. Recorded
    /// non-deterministic values are logged again with their value, so a replay still draws it.
    fn mark_in_flight(&self, logs: &[sluice_store::recovery::RecoveryLog]) -> Result<(), EngineError> {
        let mut reqs = Vec::new();
        for l in logs {
            for e in l.wal.iter().filter(|e| self.log.contains_key(&e.tag.clock)) {
                let (object, op) = match &e.op {
                    sluice_state::StateOp::Record(v) => {
                        (sluice_store::NONDET_OBJECT, sluice_state::StateOp::Record(v.clone()))
                    }
                    _ => (SCRATCH_OBJECT, sluice_state::StateOp::Incr(0)),
                };
                let key = sluice_store::StoreKey { vertex: e.key.vertex, object, key: sluice_state::StateKey::Unit };
                let op = sluice_store::StoreOp::State(op);
                reqs.push(sluice_store::Request { id: 0, client: l.instance, tag: Some(e.tag), key, op, reply: false });
            }
        }
        if reqs.is_empty() {
            return Ok(());
        }
        let mut conn = self.backend.connect(InstanceId(u32::MAX - 1)).map_err(store_err)?;
        conn.send(1, reqs.into()).map_err(store_err)?;
        let mut replies = sluice_store::Replies::default();
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while !replies.acked.contains(&1) {
            if Instant::now() >= deadline {
                return Err(EngineError::Store("rebuilt store did not acknowledge the in-flight marks".into()));
            }
            conn.wait(&mut replies, std::time::Duration::from_millis(100)).map_err(store_err)?;
        }
        Ok(())
    }

    /// Whether `key` belongs to a per-flow object kept write-through by its instance.
    fn is_per_flow(&self, key: &sluice_store::StoreKey) -> bool {
        self.vertices
            .get(usize::from(key.vertex))
            .and_then(|v| v.decls.get(usize::from(key.object)))
            .is_some_and(|d| d.scope.is_per_flow() && d.pattern != sluice_state::AccessPattern::WriteMostly)
    }

    fn reregister_custom_ops(&mut self) -> Result<(), EngineError> {
        let mut done = HashSet::new();
        for n in &self.nodes {
            if done.insert(n.vertex) {
                self.backend.register_custom_ops(n.vertex as u16, n.inst.nf().custom_ops()).map_err(store_err)?;
            }
        }
        Ok(())
    }

    fn start_move(
        &mut self,
        count: u64,
        from: usize,
        to: usize,
        keys: Vec<u64>,
        retire_from: bool,
    ) -> Result<(), EngineError> {
        let v = self.nodes.get(from).map_or(usize::MAX, |n| n.vertex);
        let name = self.vertices.get(v).map(|x| x.plan.name.to_string());
        let flows = keys.len() as u64;
        if let Some(vx) = self.vertices.get_mut(v) {
            for k in &keys {
                vx.pins.insert(*k, to);
            }
        }
        self.report.episodes.push(Episode {
            kind: if retire_from { "scale_in".into() } else { "move".into() },
            at_packet: count,
            vertex: name,
            flows,
            ..Episode::default()
        });
        let episode = self.report.episodes.len() - 1;
        if !self.cfg.switches.move_protocol {
            // Without the protocol the splitter just switches.
            if let Some(n) = self.nodes.get_mut(to) {
                n.flows.extend(keys.iter().copied());
            }
            if retire_from {
                self.retire(from)?;
            }
            return Ok(());
        }
        if let Some(n) = self.nodes.get_mut(to) {
            for k in &keys {
                n.move_held.entry(*k).or_default();
            }
        }
        let id = self.moves.len();
        let now = self.now;
        if let Some(n) = self.nodes.get_mut(from) {
            n.queue.push_back(Queued { at: now, item: Item::Barrier(id) });
        }
        self.moves.push(Move {
            from,
            to,
            keys,
            started_wall: Instant::now(),
            started_virtual: now,
            episode,
            retire_from,
        });
        Ok(())
    }

    /// The old instance processed everything sent before the move: it flushes, and the new
    /// instance takes the flows over.
    fn barrier_passed(&mut self, id: usize) -> Result<(), EngineError> {
        let Some(m) = self.moves.get(id) else { return Ok(()) };
        let (from, to, retire_from, episode) = (m.from, m.to, m.retire_from, m.episode);
        let keys = m.keys.clone();
        let (sw, sv) = (m.started_wall, m.started_virtual);
        if let Some(n) = self.nodes.get_mut(from) {
            // Steps 5-6: the old instance's updates are at the store before anyone reads them.
            n.inst.state().flush().map_err(store_err)?;
            for k in &keys {
                n.flows.remove(k);
            }
        }
        self.collect_commits();
        let now = self.now.max(self.nodes.get(from).map_or(0, |n| n.busy_until));
        if let Some(n) = self.nodes.get_mut(to) {
            // Step 7: the held packets go first, the first of each flow marked as such.
            for k in &keys {
                let held = n.move_held.remove(k).unwrap_or_default();
                for (i, mut p) in held.into_iter().enumerate() {
                    if i == 0 {
                        p.meta.flags.insert(MetaFlags::FIRST);
                    }
                    n.flows.insert(*k);
                    n.released.insert(*k, now);
                    let pos = n.queue.iter().rposition(|q| q.at <= now).map_or(0, |p| p + 1);
                    n.queue.insert(pos, Queued { at: now, item: Item::Packet(p) });
                }
            }
        }
        if let Some(ep) = self.report.episodes.get_mut(episode) {
            ep.wall_us = sw.elapsed().as_secs_f64() * 1e6;
            ep.virtual_us = now.saturating_sub(sv) as f64 / 1e3;
        }
        // Mark the move done (ids stay stable: barriers name moves by index).
        if let Some(m) = self.moves.get_mut(id) {
            m.keys.clear();
            m.from = usize::MAX;
            m.to = usize::MAX;
        }
        if self.moves.iter().all(|m| m.from == usize::MAX) {
            self.moves.clear();
        }
        if retire_from {
            self.retire(from)?;
        }
        Ok(())
    }

    /// CHC's cache transitions for cross-flow objects: an instance caches its vertex's shared
    /// objects (write-through: a local copy serves reads, every update still goes to the store
    /// tagged) only while it is the vertex's only live instance. When a second one appears
    /// (scale-out, clone) the first stops caching and flushes before anyone else reads; when
    /// one is left it caches again, from what the store holds.
    fn refresh_sharing(&mut self, v: usize) -> Result<(), EngineError> {
        let Some(vx) = self.vertices.get(v) else { return Ok(()) };
        let shared: Vec<sluice_state::ObjectId> = vx
            .decls
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.scope.is_per_flow() && d.pattern != sluice_state::AccessPattern::WriteMostly)
            .map(|(o, _)| sluice_state::ObjectId(o as u16))
            .collect();
        if shared.is_empty() {
            return Ok(());
        }
        let users: Vec<usize> =
            (0..self.nodes.len()).filter(|&i| self.nodes[i].alive && self.nodes[i].vertex == v).collect();
        let exclusive = users.len() == 1;
        for u in users {
            let Some(n) = self.nodes.get_mut(u) else { continue };
            for &o in &shared {
                n.inst.state().set_exclusive(o, exclusive);
            }
            if !exclusive {
                n.inst.state().flush().map_err(store_err)?;
            }
        }
        Ok(())
    }

    /// Takes a node out of service cleanly (its updates flushed, its queue already drained).
    fn retire(&mut self, node: usize) -> Result<(), EngineError> {
        let leftover: Vec<Packet> = match self.nodes.get_mut(node) {
            Some(n) => {
                n.inst.state().flush().map_err(store_err)?;
                // Its acknowledged updates count for the XOR check before it goes.
                n.inst.state().take_commits(&mut self.commits);
                n.alive = false;
                n.queue
                    .drain(..)
                    .filter_map(|q| match q.item {
                        Item::Packet(p) => Some(p),
                        Item::Barrier(_) => None,
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        self.collect_commits();
        for p in leftover {
            self.finished(&p);
        }
        self.checkpoint_due = true;
        if let Some(v) = self.nodes.get(node).map(|n| n.vertex) {
            self.refresh_sharing(v)?;
        }
        Ok(())
    }

    fn scale(&mut self, count: u64, v: usize, target: usize) -> Result<(), EngineError> {
        let wall = Instant::now();
        let current = self.vertices.get(v).map_or(0, |x| x.members.len());
        if target > current {
            // Existing flows stay where they are: pin each to its instance, then add.
            let members = self.vertices.get(v).map(|x| x.members.clone()).unwrap_or_default();
            let mut pins = Vec::new();
            for &m in &members {
                if let Some(n) = self.nodes.get(m) {
                    pins.extend(n.flows.iter().map(|k| (*k, m)));
                }
            }
            let mut added = Vec::new();
            for _ in current..target {
                let index = self.vertices.get(v).map_or(0, |x| x.next_index);
                let inst = self.build(v, index, target as u16)?;
                let node = self.nodes.len();
                let mut n = new_node(v, index, inst);
                n.busy_until = self.now;
                self.nodes.push(n);
                added.push(node);
                if let Some(x) = self.vertices.get_mut(v) {
                    x.next_index += 1;
                }
            }
            if let Some(x) = self.vertices.get_mut(v) {
                for (k, m) in pins {
                    x.pins.entry(k).or_insert(m);
                }
                x.members.extend(added);
            }
            self.refresh_sharing(v)?;
            let name = self.vertices.get(v).map(|x| x.plan.name.to_string());
            self.report.episodes.push(Episode {
                kind: "scale_out".into(),
                at_packet: count,
                vertex: name,
                wall_us: wall.elapsed().as_secs_f64() * 1e6,
                detail: format!("{current} -> {target} instances; no flow moved"),
                ..Episode::default()
            });
        } else if target < current {
            // Remove the last instances; only their flows move.
            let removed: Vec<usize> = self.vertices.get(v).map(|x| x.members[target..].to_vec()).unwrap_or_default();
            if let Some(x) = self.vertices.get_mut(v) {
                x.members.truncate(target);
            }
            let remaining = self.vertices.get(v).map(|x| x.members.clone()).unwrap_or_default();
            for r in removed {
                let keys: Vec<u64> = self.nodes.get(r).map(|n| n.flows.iter().copied().collect()).unwrap_or_default();
                let mut by_target: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
                for k in keys {
                    let t = remaining.get((k % remaining.len().max(1) as u64) as usize).copied().unwrap_or(r);
                    by_target.entry(t).or_default().push(k);
                }
                if let Some(x) = self.vertices.get_mut(v) {
                    // Clones of a removed instance go with it.
                    x.pins.retain(|_, n| *n != r);
                }
                let groups: Vec<_> = by_target.into_iter().collect();
                if groups.is_empty() {
                    self.retire(r)?;
                }
                let last = groups.len().saturating_sub(1);
                for (i, (t, mut keys)) in groups.into_iter().enumerate() {
                    keys.sort_unstable();
                    self.start_move(count, r, t, keys, i == last)?;
                }
                for c in self.nodes.iter_mut().filter(|c| c.alive && c.clone_of == Some(r)) {
                    c.alive = false;
                }
                self.refresh_sharing(v)?;
            }
        }
        Ok(())
    }

    fn clone_instance(&mut self, count: u64, node: usize) -> Result<(), EngineError> {
        if self.nodes.iter().any(|n| n.alive && n.clone_of == Some(node)) {
            return Ok(());
        }
        let wall = Instant::now();
        let Some((vertex, flows)) = self.nodes.get(node).map(|n| (n.vertex, n.flows.clone())) else { return Ok(()) };
        let index = self.vertices.get(vertex).map_or(0, |x| x.next_index);
        if let Some(x) = self.vertices.get_mut(vertex) {
            x.next_index += 1;
        }
        let instances = self.vertices.get(vertex).map_or(1, |x| x.members.len()) as u16 + 1;
        // The clone starts from the store: everything the straggler did is there first. From
        // now on both serve the same flows, and each forgets its copies of what the other writes.
        if let Some(c) = self.nodes.get_mut(node).and_then(|n| client(&mut n.inst)) {
            sluice_state::StateHandle::flush(c).map_err(store_err)?;
            c.track_written(true);
        }
        let mut inst = self.build(vertex, index, instances)?;
        if let Some(c) = client(&mut inst) {
            c.track_written(true);
        }
        // The clone takes over the straggler's timers too (from the store's copy).
        let straggler = InstanceId::new(vertex as u16, self.nodes.get(node).map_or(0, |n| n.index));
        self.adopt_timers(&mut inst, straggler)?;
        let id = inst.id();
        let mut c = new_node(vertex, index, inst);
        c.recovering = true;
        c.clone_of = Some(node);
        c.flows = flows;
        // After the straggler's batch in progress, whose packets are still leaving.
        c.busy_until = self.now.max(self.nodes.get(node).map_or(0, |n| n.busy_until));
        let clone = self.nodes.len();
        self.nodes.push(c);
        self.refresh_sharing(vertex)?;
        self.replay_episode("clone", count, vertex, id, wall, String::new());
        self.trials.push((node, clone, count + self.cfg.clone_trial));
        self.check_replay_done();
        Ok(())
    }

    /// Keeps the faster of a straggler and its clone.
    fn end_trial(&mut self, count: u64, straggler: usize, clone: usize) -> Result<(), EngineError> {
        let backlog = |n: Option<&Node>| n.map_or(u64::MAX, |n| n.queue.len() as u64 + n.held.len() as u64);
        let alive = |n: Option<&Node>| n.is_some_and(|n| n.alive);
        if !alive(self.nodes.get(clone)) {
            return Ok(());
        }
        if !alive(self.nodes.get(straggler)) {
            // The straggler is gone (crashed and replaced): the clone is just a clone of nothing.
            self.retire(clone)?;
            return Ok(());
        }
        let per_packet = |n: Option<&Node>| n.map_or(f64::MAX, |n| n.busy_ns as f64 / n.processed.max(1) as f64);
        let s = (backlog(self.nodes.get(straggler)), per_packet(self.nodes.get(straggler)));
        let c = (backlog(self.nodes.get(clone)), per_packet(self.nodes.get(clone)));
        let keep_clone = c.1 < s.1 || (c.1 == s.1 && c.0 < s.0);
        let (keep, drop) = if keep_clone { (clone, straggler) } else { (straggler, clone) };
        if let Some(v) = self.nodes.get(keep).and_then(|n| self.vertices.get_mut(n.vertex)) {
            v.flow_out.clear();
        }
        if let Some(n) = self.nodes.get_mut(keep) {
            n.clone_of = None;
            if let Some(c) = client(&mut n.inst) {
                c.track_written(false);
            }
        }
        if keep_clone {
            self.replace_everywhere(straggler, clone);
            if let Some(n) = self.nodes.get_mut(clone) {
                n.clone_of = None;
            }
        }
        self.retire(drop)?;
        let name = self.nodes.get(keep).and_then(|n| self.vertices.get(n.vertex)).map(|v| v.plan.name.to_string());
        self.report.episodes.push(Episode {
            kind: "retire".into(),
            at_packet: count,
            vertex: name,
            detail: format!(
                "kept the {} ({:.0} ns/packet) over the {} ({:.0} ns/packet)",
                if keep_clone { "clone" } else { "original" },
                if keep_clone { c.1 } else { s.1 },
                if keep_clone { "original" } else { "clone" },
                if keep_clone { s.1 } else { c.1 }
            ),
            ..Episode::default()
        });
        Ok(())
    }

    /// Vertex managers: aggregate per-instance statistics and apply the operator's policies.
    fn manage(&mut self, count: u64) -> Result<(), EngineError> {
        let policies = self.policies.clone();
        for p in policies {
            let Ok(v) = self.vertex_index(count, &p.vertex) else { continue };
            let members = self.vertices.get(v).map(|x| x.members.clone()).unwrap_or_default();
            let queue: u64 = members.iter().filter_map(|m| self.nodes.get(*m)).map(|n| n.queue.len() as u64).sum();
            let n = members.len();
            let max = usize::from(p.max_instances.unwrap_or(8));
            let min = usize::from(p.min_instances.unwrap_or(1)).max(1);
            let over = p.scale_out_above.as_ref().and_then(|t| t.queue).is_some_and(|q| queue > q);
            let under = p.scale_in_below.as_ref().and_then(|t| t.queue).is_some_and(|q| queue < q);
            let busy = self.moves.iter().any(|m| m.from != usize::MAX);
            if over && n < max && !busy {
                self.scale(count, v, n + 1)?;
            } else if under && n > min && !busy {
                self.scale(count, v, n - 1)?;
            }
            if let Some(theta) = p.straggler_slower_by_percent {
                let rates: Vec<(usize, f64)> = members
                    .iter()
                    .filter_map(|m| self.nodes.get(*m).map(|n| (*m, n.busy_ns as f64 / n.processed.max(1) as f64)))
                    .collect();
                if rates.len() >= 2 {
                    for &(m, r) in &rates {
                        // Compared with the median of its peers.
                        let mut peers: Vec<f64> = rates.iter().filter(|x| x.0 != m).map(|x| x.1).collect();
                        peers.sort_by(f64::total_cmp);
                        let median = peers.get(peers.len() / 2).copied().unwrap_or(r);
                        let cloning = self.nodes.iter().any(|c| c.alive && c.clone_of == Some(m));
                        if r > median * (1.0 + theta / 100.0) && !cloning {
                            self.clone_instance(count, m)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Ends the run: flushes instances, fires due timers, reads the final state.
    fn finish(mut self) -> Result<EngineReport, EngineError> {
        let last_ts = self.last_ts;
        let end = self.last_clock;
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.inst.begin_batch();
            n.inst.advance_time(last_ts, end);
            n.inst.end_batch();
        }
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.inst.state().flush().map_err(store_err)?;
        }
        self.collect_commits();
        for n in self.nodes.iter_mut() {
            let events = n.inst.take_events();
            for e in events {
                let input = self.clock_input.get(&e.clock).copied().unwrap_or(self.report.observed.inputs);
                // Timer events at the end of the run belong to no packet; the reference
                // attributes them the same way.
                let input = if e.clock == end { self.report.observed.inputs } else { input };
                self.report.observed.decisions.push(Decision {
                    input,
                    vertex: e.nf.clone(),
                    kind: e.kind.to_string(),
                    subject: e.subject,
                    detail: e.detail,
                });
            }
            if let Some(c) = client(&mut n.inst) {
                let s = c.stats();
                self.report.stats.store_duplicates += s.duplicates;
                let name = self.vertices.get(n.vertex).map(|v| v.plan.name.to_string()).unwrap_or_default();
                *self.report.stats.round_trips.entry(name.clone()).or_default() += s.round_trips;
                *self.report.stats.cache_hits.entry(name).or_default() += s.cache_hits;
            }
        }
        // The receiver, in arrival order. The chain's egress drops only replays of packets the
        // root knew had left; anything else the last NF emits twice reaches the receiver twice.
        let mut leaving = std::mem::take(&mut self.leaving);
        leaving.sort_by_key(|l| (l.at, l.order));
        let mut out_seen = HashSet::new();
        for Leaving { at, ingress, clock, bytes, emitted, .. } in leaving {
            if emitted && self.cfg.switches.duplicate_suppression {
                self.report.stats.duplicates_suppressed += 1;
                continue;
            }
            if !out_seen.insert(clock) {
                self.report.stats.duplicate_outputs += 1;
            }
            let input = self.clock_input.get(&clock).copied().unwrap_or(u64::MAX);
            self.latencies.push((at, at.saturating_sub(ingress)));
            self.report.observed.outputs.push(OutputRecord { input, clock: clock.0, bytes });
        }
        let cp = self.backend.checkpoint().map_err(store_err)?;
        for (k, value) in cp.values {
            let Some(vx) = self.vertices.get(usize::from(k.vertex)) else { continue };
            let Some(decl) = vx.decls.get(usize::from(k.object)) else { continue };
            self.report.observed.state.push(StateEntry {
                vertex: vx.plan.name.to_string(),
                object: k.object,
                object_name: decl.name.to_string(),
                allocation: decl.allocation,
                key: k.key,
                value,
            });
        }
        self.report.observed.decisions.sort();
        self.report.observed.root_dropped.sort_unstable();
        self.report.observed.state.sort_by(|a, b| (&a.vertex, a.object, a.key).cmp(&(&b.vertex, b.object, b.key)));
        self.report.stats.log_left = self.log.len() as u64;
        if let Some(sl) = &mut self.store_log {
            sl.sync().map_err(store_err)?;
            self.report.stats.log_store_writes = sl.writes;
            self.report.stats.log_store_write_us = sl.wall.as_secs_f64() * 1e6 / sl.writes.max(1) as f64;
        }
        let mut lat: Vec<u64> = self.latencies.iter().map(|l| l.1).collect();
        lat.sort_unstable();
        let pct = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |v| *v as f64 / 1e3);
        self.report.stats.latency_p50_us = pct(0.5);
        self.report.stats.latency_p99_us = pct(0.99);
        let latencies = std::mem::take(&mut self.latencies);
        for ep in &mut self.report.episodes {
            ep.back_to_normal_us = back_to_normal(&latencies, ep.at_packet * self.cfg.arrival_ns);
        }
        Ok(self.report)
    }
}

/// The object index of the scratch value in-flight marks update (beyond any NF's objects, so it
/// is never part of the chain's state).
const SCRATCH_OBJECT: u16 = u16::MAX;

/// Drops from the write-ahead logs the updates after an instance's checkpoint position whose
/// tag another instance of the vertex had already applied before the checkpoint: a clone
/// repeats its straggler's updates (the store applied them once) and re-executing them would
/// apply them twice.
fn without_baseline_duplicates(logs: &mut [sluice_store::recovery::RecoveryLog], cp: &sluice_store::Checkpoint) {
    let position = |l: &sluice_store::recovery::RecoveryLog| -> Option<usize> {
        let ts = cp.ts.iter().find(|(i, _)| *i == l.instance).map(|(_, c)| *c)?;
        l.wal.iter().rposition(|e| e.tag.clock == ts)
    };
    let mut baseline = HashSet::new();
    for l in logs.iter() {
        if let Some(p) = position(l) {
            baseline.extend(l.wal[..=p].iter().map(|e| (e.key.vertex, e.tag)));
        }
    }
    for l in logs.iter_mut() {
        let start = position(l).map_or(0, |p| p + 1);
        let mut i = 0;
        l.wal.retain(|e| {
            let keep = i < start || !baseline.contains(&(e.key.vertex, e.tag));
            i += 1;
            keep
        });
    }
}

/// For every vertex, which vertices its routes reach (itself included).
fn reachability(plan: &[VertexPlan]) -> Vec<Vec<bool>> {
    let n = plan.len();
    let next: Vec<Vec<usize>> = plan
        .iter()
        .map(|vp| {
            vp.routes
                .iter()
                .flatten()
                .flat_map(|r| r.main.iter().chain(r.mirrors.iter()))
                .filter_map(|r| match r.to {
                    Target::Vertex(w) => Some(w),
                    Target::Output => None,
                })
                .collect()
        })
        .collect();
    (0..n)
        .map(|start| {
            let mut seen = vec![false; n];
            let mut stack = vec![start];
            while let Some(v) = stack.pop() {
                if let Some(s) = seen.get_mut(v) {
                    if !*s {
                        *s = true;
                        stack.extend(next.get(v).into_iter().flatten().copied());
                    }
                }
            }
            seen
        })
        .collect()
}

fn new_node(vertex: usize, index: u16, inst: Instance) -> Node {
    Node {
        vertex,
        index,
        inst,
        queue: VecDeque::new(),
        busy_until: 0,
        alive: true,
        slow: None,
        recovering: false,
        held: Vec::new(),
        move_held: HashMap::new(),
        flows: HashSet::new(),
        processed: 0,
        busy_ns: 0,
        clone_of: None,
        seen: HashSet::new(),
        released: HashMap::new(),
    }
}

fn client(inst: &mut Instance) -> Option<&mut StoreClient> {
    inst.state().as_any_mut().and_then(|a| a.downcast_mut::<StoreClient>())
}

fn updates_of(inst: &mut Instance) -> u64 {
    client(inst).map_or(0, |c| c.stats().updates)
}

fn split_hasher() -> ahash::RandomState {
    sluice_runtime::plan::split_hasher()
}

/// Virtual µs from `at` until output latency is back to normal: the median of 500 outputs is
/// within 1.5x of the median of the 500 before `at`.
fn back_to_normal(lat: &[(u64, u64)], at: u64) -> Option<f64> {
    let split = lat.partition_point(|l| l.0 < at);
    let before: Vec<u64> = lat[split.saturating_sub(500)..split].iter().map(|l| l.1).collect();
    if before.is_empty() {
        return None;
    }
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let normal = median(&mut before.clone()) as f64 * 1.5;
    let mut i = split;
    while i < lat.len() {
        let end = (i + 500).min(lat.len());
        let mut w: Vec<u64> = lat[i..end].iter().map(|l| l.1).collect();
        if median(&mut w) as f64 <= normal {
            return Some(lat[i].0.saturating_sub(at) as f64 / 1e3);
        }
        i += 50;
    }
    None
}
