//! Compiling a checked chain into its physical graph: NF instances, the splitter choice of each
//! vertex, and the routes out of the root and out of every vertex.

use crate::filter::CompiledFilter;
use crate::spec::Chain;
use sluice_nf::{BuildCtx, Instance, LabelTable, NetworkFunction, NfError, NfRegistry};
use sluice_packet::{Clock, HeaderField, InstanceId, Packet};
use sluice_state::{LocalState, ObjectId, StateDecl, StateHandle};
use sluice_store::{Backend, ClientConfig, Mode, StoreClient};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

mod reading;
pub use reading::RecoveryReading;

/// Where a route leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The chain's exit.
    Output,
    /// A vertex, by index.
    Vertex(usize),
}

/// One edge as the data path uses it.
#[derive(Debug, Clone)]
pub struct Route {
    /// Only matching packets take it.
    pub filter: Option<CompiledFilter>,
    /// Where it leads.
    pub to: Target,
}

impl Route {
    fn takes(&self, pkt: &Packet) -> bool {
        self.filter.as_ref().is_none_or(|f| f.matches(pkt))
    }
}

/// The edges leaving one output of a vertex (or the root).
#[derive(Debug, Clone, Default)]
pub struct Routes {
    /// On-path edges: the first whose filter matches takes the packet.
    pub main: Vec<Route>,
    /// Mirror edges: every matching one gets a copy.
    pub mirrors: Vec<Route>,
}

impl Routes {
    /// The on-path target for `pkt`, if any edge takes it.
    pub fn main_target(&self, pkt: &Packet) -> Option<Target> {
        self.main.iter().find(|r| r.takes(pkt)).map(|r| r.to)
    }
    /// Mirror targets that take `pkt`.
    pub fn mirror_targets<'a>(&'a self, pkt: &'a Packet) -> impl Iterator<Item = Target> + 'a {
        self.mirrors.iter().filter(move |r| r.takes(pkt)).map(|r| r.to)
    }
    /// The vertices its edges (main and mirror) lead to.
    pub fn vertices(&self) -> impl Iterator<Item = usize> + '_ {
        self.main.iter().chain(&self.mirrors).filter_map(|r| match r.to {
            Target::Vertex(w) => Some(w),
            Target::Output => None,
        })
    }
}

/// A vertex of the physical graph.
#[derive(Debug, Clone)]
pub struct VertexPlan {
    /// Name in the chain file.
    pub name: Arc<str>,
    /// NF type.
    pub kind: String,
    /// Global indices of its instances at the start (instance `i` is `instances[i]`).
    pub instances: Vec<usize>,
    /// Global indices kept for instances added while the chain runs (scaling out): instance
    /// `instances.len() + j` is `spares[j]` ([`Plan::reserve_spares`]).
    pub spares: Vec<usize>,
    /// Header fields the upstream splitters partition on (hashed symmetrically, so both
    /// directions of a connection reach the same instance).
    pub split: Vec<HeaderField>,
    /// Routes by direction (0: `edges`, 1: `reverse_edges`), then by output: index 0 is the
    /// default output, i + 1 the NF's i-th named output.
    pub routes: Vec<Vec<Routes>>,
    /// Fed only by mirror edges: what it forwards is consumed, not sent on.
    pub off_path: bool,
}

impl VertexPlan {
    /// The global index of instance `index` (one it starts with or a spare).
    pub fn global(&self, index: u16) -> Option<usize> {
        let i = usize::from(index);
        self.instances.get(i).or_else(|| self.spares.get(i.checked_sub(self.instances.len())?)).copied()
    }

    /// The vertices its routes lead to (main and mirror edges, both directions, every output).
    pub fn successors(&self) -> Vec<usize> {
        let mut next: Vec<usize> = self.routes.iter().flatten().flat_map(Routes::vertices).collect();
        next.sort_unstable();
        next.dedup();
        next
    }
}

/// The physical graph plus the instances to run.
pub struct Plan {
    /// Chain name.
    pub name: String,
    /// Vertices.
    pub vertices: Vec<VertexPlan>,
    /// Routes out of the root, by direction.
    pub entry: Vec<Routes>,
    /// Traffic class.
    pub traffic: Option<CompiledFilter>,
    /// Interned labels.
    pub labels: Arc<LabelTable>,
    /// Instances, by global index, with their vertex index.
    pub instances: Vec<(usize, Instance)>,
    /// The store holding the instances' state, if not local.
    pub store: Option<Arc<dyn Backend>>,
    /// Where state lives, for reports (`local`, `async (embedded ...)`).
    pub state: String,
    /// Builds instances while the chain runs (replacements after a crash).
    pub rebuilder: Rebuilder,
}

impl Plan {
    /// Per vertex: whether its packets may reach it by more than one way — it, or a vertex in
    /// front of it, is fed from several places (the root and a vertex, as where a chain's
    /// `reverse_edges` meet its `edges`; two vertices). Packets entered in one order may then
    /// arrive in another: a connection's reply overtakes the packet before it, which crosses
    /// a slower vertex first.
    pub fn merged_on_the_way(&self) -> Vec<bool> {
        let n = self.vertices.len();
        let mut fed_by: Vec<Vec<Option<usize>>> = vec![Vec::new(); n];
        let from_root = self.entry.iter().flat_map(Routes::vertices).map(|w| (None, w));
        let from_vertices =
            self.vertices.iter().enumerate().flat_map(|(v, vp)| vp.successors().into_iter().map(move |w| (Some(v), w)));
        for (from, w) in from_root.chain(from_vertices) {
            if let Some(f) = fed_by.get_mut(w) {
                if !f.contains(&from) {
                    f.push(from);
                }
            }
        }
        let mut merged: Vec<bool> = fed_by.iter().map(|f| f.len() > 1).collect();
        // Past a merge every vertex is merged too: at most one pass per vertex to settle.
        for _ in 0..n {
            let next: Vec<bool> = (0..n)
                .map(|w| merged[w] || fed_by[w].iter().flatten().any(|&v| merged.get(v).copied().unwrap_or(false)))
                .collect();
            if next == merged {
                break;
            }
            merged = next;
        }
        merged
    }

    /// Keeps global indices for instances added while the chain runs, so that every vertex
    /// can have had `per_vertex` instances in all (indices are never reused: an instance
    /// removed by scaling in keeps its index). Queues and statistics of a spare exist only
    /// once it is used.
    pub fn reserve_spares(&mut self, per_vertex: u16) {
        let mut next = self.slot_count();
        for v in &mut self.vertices {
            while v.instances.len() + v.spares.len() < usize::from(per_vertex) {
                v.spares.push(next);
                next += 1;
            }
        }
    }

    /// Global indices in use or kept: the instances, then the spares.
    pub fn slot_count(&self) -> usize {
        self.instances.len() + self.vertices.iter().map(|v| v.spares.len()).sum::<usize>()
    }

    /// Every global index's (vertex, instance index).
    pub fn slots(&self) -> Vec<(usize, u16)> {
        let mut out = vec![(0, 0); self.slot_count()];
        for (vi, v) in self.vertices.iter().enumerate() {
            for (i, g) in v.instances.iter().chain(&v.spares).enumerate() {
                if let Some(s) = out.get_mut(*g) {
                    *s = (vi, i as u16);
                }
            }
        }
        out
    }
}

/// What building an instance of a compiled chain while it runs needs: the chain, the NF types,
/// the labels interned at compile time and where state lives.
#[derive(Clone)]
pub struct Rebuilder {
    chain: Arc<Chain>,
    registry: NfRegistry,
    labels: Arc<LabelTable>,
    state: StateConfig,
    /// Per vertex, the table of timers on shared keys its instances use
    /// ([`Rebuilder::share_vertex_timers`]).
    vertex_timers: Option<Arc<[sluice_store::VertexTimers]>>,
    /// The epoch of the next instance built ([`ClientConfig::epoch`]), shared by the clones:
    /// instances started with the run are in epoch 0, every one built later in an epoch of its
    /// own, so that a replacement's is above its predecessor's.
    next_epoch: Arc<std::sync::atomic::AtomicU32>,
}

impl Rebuilder {
    /// Instances built from now on keep no write-ahead log (a run whose store is never
    /// rebuilt; [`sluice_store::StoreClient::drop_write_ahead_log`]).
    pub fn without_write_ahead_log(&mut self) {
        if let StateConfig::Store { client, .. } = &mut self.state {
            client.wal_capacity = 0;
        }
    }

    /// A builder for `chain`'s instances.
    pub fn new(chain: &Chain, registry: &NfRegistry, labels: Arc<LabelTable>, state: &StateConfig) -> Rebuilder {
        Rebuilder {
            chain: Arc::new(chain.clone()),
            registry: registry.clone(),
            labels,
            state: state.clone(),
            vertex_timers: None,
            next_epoch: Arc::new(std::sync::atomic::AtomicU32::new(1)),
        }
    }

    /// Instances built from now on (and those given to [`Rebuilder::attach_vertex_timers`])
    /// keep the timers on their shared keys in one table per vertex, so that a timer fires
    /// before the first packet past its deadline whichever instance of the vertex gets it
    /// ([`StoreClient::share_vertex_timers`]): for runs whose vertices have, or may get,
    /// several instances. A vertex whose `flows_too` is set keeps its per-flow timers there
    /// too ([`sluice_store::VertexTimerTable::with_flow_timers`]): an order-sensitive one.
    pub fn share_vertex_timers(&mut self, flows_too: &[bool]) {
        let table = |all: bool| {
            Arc::new(if all {
                sluice_store::VertexTimerTable::with_flow_timers()
            } else {
                sluice_store::VertexTimerTable::default()
            })
        };
        self.vertex_timers = Some(flows_too.iter().map(|all| table(*all)).collect());
    }

    /// Puts `inst`'s timers on shared keys into its vertex's table, if the run shares them.
    pub fn attach_vertex_timers(&self, inst: &mut Instance) {
        let vertex = usize::from(inst.id().vertex());
        let table = self.vertex_timers.as_ref().and_then(|t| t.get(vertex)).cloned();
        if let (Some(table), Some(c)) = (table, store_client(inst)) {
            c.share_vertex_timers(table);
        }
    }

    /// Whether instances keep their state in a store (a replacement can take it over).
    pub fn has_store(&self) -> bool {
        matches!(self.state, StateConfig::Store { .. })
    }

    /// What to ask the store for `inst`'s values: the store, the vertex, the objects whose
    /// values it loads ([`StoreClient::loaded_objects`]). `None` without a store client.
    fn flows_request(&self, inst: &mut Instance) -> Option<(Arc<dyn Backend>, u16, Vec<u16>)> {
        let StateConfig::Store { backend, .. } = &self.state else { return None };
        let vertex = inst.id().vertex();
        let client = store_client(inst)?;
        Some((backend.clone(), vertex, client.loaded_objects()))
    }

    /// The clocks whose updates of `vertex`'s state the store holds in its per-clock log
    /// ([`Backend::clocks_updated_by`]); none without a store.
    pub fn clocks_updated_by(&self, vertex: usize) -> Result<Vec<Clock>, PlanError> {
        let StateConfig::Store { backend, .. } = &self.state else { return Ok(Vec::new()) };
        let vertex = u16::try_from(vertex).map_err(|_| PlanError::Store(format!("vertex {vertex} out of range")))?;
        backend.clocks_updated_by(vertex).map_err(|e| PlanError::Store(e.to_string()))
    }

    /// The replacement of failed instance `index` of `vertex` (one of `instances`), with the
    /// same id, built at once; and the read of what it takes over from the store
    /// ([`Backend::takeover`]: its predecessor's timers and, with `values` — it is its
    /// vertex's only instance — every value of the objects it caches), started on a thread of
    /// its own. Call it once the predecessor's store answers have settled. The replacement must
    /// not process a packet before [`RecoveryReading::finish`] gave it what was read; meanwhile the
    /// root replays towards it (docs/decisions.md, "Instance failover in threads" point 13).
    /// No reading without a store. With `fence` (the predecessor ran in another process, which
    /// may only be paused or cut off), the store is first told to refuse the predecessor's
    /// connections ([`Backend::fence`]), before anything of what it did is read.
    pub fn replacement_reading(
        &self,
        vertex: usize,
        index: u16,
        instances: u16,
        values: bool,
        fence: bool,
    ) -> Result<(Instance, Option<RecoveryReading>), PlanError> {
        let mut inst = self.added(vertex, index, instances)?;
        let epoch = store_client(&mut inst).map(|c| c.epoch());
        let Some((backend, _, objects)) = self.flows_request(&mut inst) else { return Ok((inst, None)) };
        let owner = inst.id();
        if let (true, Some(epoch)) = (fence, epoch) {
            backend.fence(owner, epoch).map_err(|e| PlanError::Store(format!("fencing the failed instance: {e}")))?;
        }
        let (parts, parts_rx) = std::sync::mpsc::channel();
        let (outcome, outcome_rx) = std::sync::mpsc::channel();
        let at_once = backend.takeover_returns_at_once();
        let read = move || {
            let objects = values.then_some(objects.as_slice());
            let _ = outcome.send(backend.takeover(owner, objects, &parts).map_err(|e| e.to_string()));
        };
        if at_once {
            // The embedded store's shards send their parts straight to the replacement: no
            // thread to start (on a busy machine, hundreds of microseconds of the recovery).
            read();
        } else {
            // On a thread: a backend that cannot answer without blocking (Redis reads a whole
            // checkpoint) reads there.
            std::thread::Builder::new()
                .name("sluice-takeover".into())
                .spawn(read)
                .map_err(|e| PlanError::Store(format!("starting the replacement's read: {e}")))?;
        }
        let reading = RecoveryReading { parts: parts_rx, outcome: outcome_rx, ends: (0, None), every_value: true };
        Ok((inst, Some(reading)))
    }

    /// Gives `inst`, now its vertex's only instance with nobody else writing the vertex's
    /// values (an instance left alone by a scale-in, or a clone that took its straggler's
    /// place), every value the store has for the objects it caches, at once
    /// ([`StoreClient::load_flows`]), when the store can list them cheaply. Whether it did.
    pub fn load_flows(&self, inst: &mut Instance) -> Result<bool, PlanError> {
        let Some((backend, vertex, objects)) = self.flows_request(inst) else { return Ok(false) };
        let Some(values) = backend.values_of(vertex, &objects).map_err(|e| PlanError::Store(e.to_string()))? else {
            return Ok(false);
        };
        let client = store_client(inst);
        Ok(client.map(|c| c.load_flows(values)).is_some())
    }

    /// A new instance `index` of `vertex` (one of `instances`) added while the chain runs
    /// (scaling out; a replacement starts as one). Flows reach it from other instances, whose
    /// state the store has: a value it has no copy of is looked up. It arms no timers yet.
    pub fn added(&self, vertex: usize, index: u16, instances: u16) -> Result<Instance, PlanError> {
        let state = match &self.state {
            StateConfig::Store { backend, client } => {
                let epoch = self.next_epoch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let client = ClientConfig { fresh: false, epoch, ..client.clone() };
                StateConfig::Store { backend: backend.clone(), client }
            }
            StateConfig::Local => StateConfig::Local,
        };
        let mut inst = build_instance(&self.chain, &self.registry, &self.labels, vertex, index, instances, &state)?;
        self.attach_vertex_timers(&mut inst);
        Ok(inst)
    }
}

/// `inst`'s store client, if its state lives in a store.
pub fn store_client(inst: &mut Instance) -> Option<&mut StoreClient> {
    inst.state().as_any_mut().and_then(|a| a.downcast_mut::<StoreClient>())
}

/// Re-arms in `inst` the timers the store says instance `owner` had armed: a replacement
/// takes over its failed predecessor's (same id), a clone its straggler's.
pub fn adopt_timers(backend: &dyn Backend, inst: &mut Instance, owner: InstanceId) -> Result<(), PlanError> {
    let timers = backend.timers_of(owner).map_err(|e| PlanError::Store(e.to_string()))?;
    let client = store_client(inst);
    if let Some(c) = client {
        for (key, deadline) in &timers {
            c.adopt_timer(ObjectId(key.object), &key.key, *deadline);
        }
    }
    Ok(())
}

/// Where NF instances keep their state.
#[derive(Clone, Default)]
pub enum StateConfig {
    /// In each instance's own memory (the traditional NF; `--mode local`).
    #[default]
    Local,
    /// In a store, through a client with the given mode.
    Store {
        /// The store.
        backend: Arc<dyn Backend>,
        /// Client parameters (mode, flush period, ...).
        client: ClientConfig,
    },
}

impl StateConfig {
    /// The same, for a run with the root's log (fault tolerance): every update of per-flow
    /// state (and of shared state an instance caches) is written through to the store as a
    /// tagged, XOR-accounted update, so a packet stays logged until its effects are in the store,
    /// and non-deterministic draws are recorded so that a replay draws the same. Batches of
    /// updates may go together (`ClientConfig::defer_batches`): the worker asks its instances
    /// for commits between batches and while idle, which sends what waits in time.
    pub fn fault_tolerant(self) -> StateConfig {
        match self {
            StateConfig::Store { backend, client } => StateConfig::Store {
                backend,
                client: ClientConfig {
                    write_through: true,
                    record_nondeterminism: true,
                    dedupe: true,
                    defer_batches: true,
                    ..client
                },
            },
            StateConfig::Local => StateConfig::Local,
        }
    }

    /// The same, for the instances of a chain spread over nodes (with fault tolerance): a
    /// packet an instance processes without updating anything is marked processed in the store
    /// (`ClientConfig::mark_processed`), since a replacement on another node learns what its
    /// predecessor did from the store alone. Batches are not deferred there
    /// (`ClientConfig::defer_batches`): a node sends a batch's updates before its packets leave
    /// (docs/decisions.md, "What a replacement of another node's instance skips").
    pub fn across_nodes(self) -> StateConfig {
        match self {
            StateConfig::Store { backend, client } => StateConfig::Store {
                backend,
                client: ClientConfig { mark_processed: true, defer_batches: false, ..client },
            },
            StateConfig::Local => StateConfig::Local,
        }
    }

    /// The same, for a run in which no packet is processed twice — no root's log to replay
    /// from, no clone beside a straggler, no live control that could make one: updates travel
    /// without exactly-once tags, so the store keeps no per-clock log of them, and a counter's
    /// increments of one batch travel as one (`ClientConfig::dedupe`); no XOR vectors or
    /// commits are made for a log that does not exist (`ClientConfig::commits`). The NAT
    /// alone went at 0.62 of local state instead of 0.34 (docs/benchmarks.md).
    pub fn without_duplicates(self) -> StateConfig {
        match self {
            StateConfig::Store { backend, client } => {
                StateConfig::Store { backend, client: ClientConfig { dedupe: false, commits: false, ..client } }
            }
            StateConfig::Local => StateConfig::Local,
        }
    }

    /// A short description for reports: `local`, or the mode and the store.
    pub fn describe(&self) -> String {
        match self {
            StateConfig::Local => "local".to_string(),
            StateConfig::Store { backend, client } => {
                let mode = match client.mode {
                    Mode::External => "external",
                    Mode::Cached => "cached",
                    Mode::Async => "async",
                };
                format!("{mode} ({})", backend.name())
            }
        }
    }
}

/// Why a chain could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// An NF refused its configuration.
    #[error("vertex `{vertex}`: {source}")]
    Nf {
        /// The vertex.
        vertex: String,
        /// The NF's error.
        source: NfError,
    },
    /// The state store could not be used.
    #[error("state store: {0}")]
    Store(String),
    /// A route names an output the NF does not have.
    #[error("vertex `{vertex}` has no output named `{output}` (it has: {known})")]
    UnknownOutput {
        /// The vertex.
        vertex: String,
        /// The output named.
        output: String,
        /// Outputs it has.
        known: String,
    },
}

/// Deterministic hashing for splitters: the same packet goes to the same instance in every run.
pub fn split_hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(0x5155_1ce0, 0x0dd_ba11, 0xc0ff_ee00, 0x1234_5678)
}

/// Which of `n` instances gets `pkt` when partitioning on `fields`. Symmetric: a packet and its
/// reply pick the same instance. Non-IP packets go to instance 0.
pub fn split_index(pkt: &Packet, fields: &[HeaderField], n: usize, hasher: &ahash::RandomState) -> usize {
    if n <= 1 {
        return 0;
    }
    split_hash(pkt, fields, hasher).map_or(0, |h| (h % n as u64) as usize)
}

/// The symmetric hash of `pkt`'s `fields` (the same for a packet and its reply); `None` for
/// packets without a 5-tuple.
fn split_hash(pkt: &Packet, fields: &[HeaderField], hasher: &ahash::RandomState) -> Option<u64> {
    Some(tuple_hash(&pkt.tuple()?, fields, hasher))
}

/// The symmetric hash of a 5-tuple's `fields`.
fn tuple_hash(t: &sluice_packet::FiveTuple, fields: &[HeaderField], hasher: &ahash::RandomState) -> u64 {
    let mut a = hasher.build_hasher();
    t.hash_fields(fields, &mut a);
    let mut b = hasher.build_hasher();
    t.reversed().hash_fields(fields, &mut b);
    a.finish().min(b.finish())
}

/// The split key of the connection a per-flow state key names (what [`split_key`] gives its
/// packets); `None` for keys that are not a connection.
pub fn split_key_of_state(key: &sluice_state::StateKey, fields: &[HeaderField]) -> Option<u64> {
    let sluice_state::StateKey::Flow(fk) = key else { return None };
    let ((src, sport), (dst, dport), proto) = (fk.a(), fk.b(), fk.proto);
    Some(tuple_hash(&sluice_packet::FiveTuple { src, sport, dst, dport, proto }, fields, &split_hasher()))
}

/// What a splitter partitioning on `fields` keys `pkt` by: packets with equal keys always go to
/// the same instance (flows moved between instances are named by it). Packets without a
/// 5-tuple all share key 0.
pub fn split_key(pkt: &Packet, fields: &[HeaderField]) -> u64 {
    split_hash(pkt, fields, &split_hasher()).unwrap_or(0)
}

/// A splitter bound to one downstream vertex.
#[derive(Debug, Clone)]
pub struct Splitter {
    hasher: ahash::RandomState,
}

impl Default for Splitter {
    fn default() -> Self {
        Splitter { hasher: split_hasher() }
    }
}

impl Splitter {
    /// The key `pkt`'s flow has at vertex `v` ([`split_key`]).
    pub fn key(&self, v: &VertexPlan, pkt: &Packet) -> u64 {
        split_hash(pkt, &v.split, &self.hasher).unwrap_or(0)
    }

    /// The global instance index for `pkt` at vertex `v`.
    pub fn pick(&self, v: &VertexPlan, pkt: &Packet) -> usize {
        let i = split_index(pkt, &v.split, v.instances.len(), &self.hasher);
        v.instances.get(i).copied().unwrap_or(v.instances[0])
    }
}

/// The field sets a vertex can be partitioned on, coarsest first: the coarsest scope of each
/// keyed state object, ending with the 5-tuple. Global objects (no key) cannot be partitioned
/// away and are left out.
pub fn split_candidates(decls: &[StateDecl]) -> Vec<Vec<HeaderField>> {
    let mut sets: Vec<Vec<HeaderField>> =
        decls.iter().map(|d| d.scope.coarsest().to_vec()).filter(|s| !s.is_empty()).collect();
    sets.push(HeaderField::FIVE_TUPLE.to_vec());
    for s in &mut sets {
        s.sort();
    }
    sets.sort_by_key(|s| s.len());
    sets.dedup();
    sets
}

/// Picks the coarsest candidate that spreads `sample` evenly over `n` instances (busiest
/// instance at most `1.5 ×` the mean); the finest when none does.
pub fn choose_split(candidates: &[Vec<HeaderField>], sample: &[Packet], n: usize) -> Vec<HeaderField> {
    let finest = candidates.last().cloned().unwrap_or_else(|| HeaderField::FIVE_TUPLE.to_vec());
    if n <= 1 || sample.is_empty() {
        return candidates.first().cloned().unwrap_or(finest);
    }
    let hasher = split_hasher();
    for c in candidates {
        let mut load = vec![0usize; n];
        for p in sample {
            if let Some(slot) = load.get_mut(split_index(p, c, n, &hasher)) {
                *slot += 1;
            }
        }
        let max = load.iter().copied().max().unwrap_or(0) as f64;
        let mean = sample.len() as f64 / n as f64;
        if max <= 1.5 * mean {
            return c.clone();
        }
    }
    finest
}

/// Compiles `chain`: builds every instance (with local state) and the routes. `sample` is a
/// prefix of the input, when known, used to check that a split spreads the load.
pub fn compile(chain: &Chain, registry: &NfRegistry, sample: &[Packet]) -> Result<Plan, PlanError> {
    compile_with(chain, registry, sample, &StateConfig::Local)
}

/// [`compile`] with the instances' state where `state` says.
pub fn compile_with(
    chain: &Chain,
    registry: &NfRegistry,
    sample: &[Packet],
    state: &StateConfig,
) -> Result<Plan, PlanError> {
    let mut labels = LabelTable::default();
    let traffic = chain.traffic.as_ref().map(|f| f.compile(&mut labels));
    let mut vertices = Vec::new();
    let mut instances = Vec::new();
    let directions = if chain.reverse_edges.is_some() { 2 } else { 1 };
    let mut outputs_of = Vec::new();
    for (vi, (name, spec)) in chain.vertices.iter().enumerate() {
        let vname: Arc<str> = name.as_str().into();
        let mut ids = Vec::new();
        let mut decls = Vec::new();
        let mut outputs: Vec<String> = Vec::new();
        for i in 0..spec.instances {
            let mut bctx = BuildCtx {
                vertex: name,
                instance: i,
                instances: spec.instances,
                labels: &mut labels,
                shared_state: matches!(state, StateConfig::Store { .. }),
            };
            let nf = registry
                .build(&spec.kind, &spec.config, &mut bctx)
                .map_err(|source| PlanError::Nf { vertex: name.clone(), source })?;
            decls = nf.state_objects().to_vec();
            outputs = nf.outputs().iter().map(|s| s.to_string()).collect();
            let id = InstanceId::new(vi as u16, i);
            if i == 0 {
                if let StateConfig::Store { backend, .. } = state {
                    backend
                        .register_custom_ops(vi as u16, nf.custom_ops())
                        .map_err(|e| PlanError::Store(e.to_string()))?;
                }
            }
            let handle = state_handle(nf.as_ref(), id, spec.instances, state)?;
            ids.push(instances.len());
            instances.push((vi, (nf, handle, id)));
        }
        let split = match &spec.split {
            Some(fields) => fields.clone(),
            None => choose_split(&split_candidates(&decls), sample, usize::from(spec.instances)),
        };
        let all_edges = chain.edges.iter().chain(chain.reverse_edges.iter().flatten());
        let off_path = !all_edges.clone().any(|e| e.to == Some(vi) && !e.mirror);
        outputs_of.push(outputs.clone());
        vertices.push(VertexPlan {
            name: vname,
            kind: spec.kind.clone(),
            instances: ids,
            spares: Vec::new(),
            split,
            routes: vec![vec![Routes::default(); outputs.len() + 1]; directions],
            off_path,
        });
    }
    let mut entry = vec![Routes::default(); directions];
    let lists = std::iter::once(&chain.edges).chain(chain.reverse_edges.iter());
    for (dir, e) in lists.enumerate().flat_map(|(d, l)| l.iter().map(move |e| (d, e))) {
        let route = Route {
            filter: e.filter.as_ref().map(|f| f.compile(&mut labels)),
            to: e.to.map_or(Target::Output, Target::Vertex),
        };
        let routes = match e.from {
            None => &mut entry[dir],
            Some(v) => {
                let out = match &e.output {
                    None => 0,
                    Some(o) => {
                        let known = &outputs_of[v];
                        match known.iter().position(|k| k == o) {
                            Some(i) => i + 1,
                            None => {
                                return Err(PlanError::UnknownOutput {
                                    vertex: chain.vertices[v].0.clone(),
                                    output: o.clone(),
                                    known: if known.is_empty() { "none".into() } else { known.join(", ") },
                                })
                            }
                        }
                    }
                };
                &mut vertices[v].routes[dir][out]
            }
        };
        if e.mirror {
            routes.mirrors.push(route);
        } else {
            routes.main.push(route);
        }
    }
    let labels = Arc::new(labels);
    let instances = instances
        .into_iter()
        .map(|(vi, (nf, state, id))| {
            let name = vertices[vi].name.clone();
            (vi, Instance::new(nf, state, name, id, labels.clone()))
        })
        .collect();
    let store = match state {
        StateConfig::Local => None,
        StateConfig::Store { backend, .. } => Some(backend.clone()),
    };
    let rebuilder = Rebuilder::new(chain, registry, labels.clone(), state);
    Ok(Plan {
        name: chain.name.clone(),
        vertices,
        entry,
        traffic,
        labels,
        instances,
        store,
        state: state.describe(),
        rebuilder,
    })
}

/// The state handle of instance `id` (one of `instances` of its vertex) of `nf`.
fn state_handle(
    nf: &dyn NetworkFunction,
    id: InstanceId,
    instances: u16,
    state: &StateConfig,
) -> Result<Box<dyn StateHandle>, PlanError> {
    Ok(match state {
        StateConfig::Local => Box::new(LocalState::new(nf.state_objects(), nf.custom_ops())),
        StateConfig::Store { backend, client } => {
            let conn = backend.connect_at(id, client.epoch).map_err(|e| PlanError::Store(e.to_string()))?;
            let mut c = StoreClient::new(conn, id, id.vertex(), nf.state_objects(), nf.custom_ops(), client.clone());
            // A single instance is the only user of its vertex's shared objects, so it may
            // cache them (CHC Table 1: "cache while no other instance uses it").
            for o in sluice_state::cached_while_alone(nf.state_objects()) {
                c.set_exclusive(o, instances == 1);
            }
            Box::new(c)
        }
    })
}

/// Builds one more instance of vertex `vertex` of a compiled chain while it runs (a
/// replacement, a clone, an instance added by scaling): instance `index`, one of `instances`.
pub fn build_instance(
    chain: &Chain,
    registry: &NfRegistry,
    labels: &Arc<LabelTable>,
    vertex: usize,
    index: u16,
    instances: u16,
    state: &StateConfig,
) -> Result<Instance, PlanError> {
    let Some((name, spec)) = chain.vertices.get(vertex) else {
        return Err(PlanError::Store(format!("no vertex with index {vertex}")));
    };
    // Labels were interned when the chain was compiled; a rebuilt NF finds them there.
    let mut table = LabelTable::clone(labels);
    let mut bctx = BuildCtx {
        vertex: name,
        instance: index,
        instances,
        labels: &mut table,
        shared_state: matches!(state, StateConfig::Store { .. }),
    };
    let nf = registry
        .build(&spec.kind, &spec.config, &mut bctx)
        .map_err(|source| PlanError::Nf { vertex: name.clone(), source })?;
    let id = InstanceId::new(vertex as u16, index);
    let handle = state_handle(nf.as_ref(), id, instances, state)?;
    Ok(Instance::new(nf, handle, name.as_str().into(), id, labels.clone()))
}

/// The direction a packet travels: 1 for packets that entered on in port 1 of a chain with
/// reverse edges, else 0.
pub fn direction(pkt: &Packet, directions: usize) -> usize {
    usize::from(directions > 1 && pkt.meta.in_port == 1)
}
