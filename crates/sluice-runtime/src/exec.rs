//! Running a compiled chain.
//!
//! Threads: the calling thread is the **root** (reads the source, drops malformed input,
//! stamps logical clocks, applies the in-flight window, splits packets to the entry vertex) and
//! the **sink** (writes output, measures latency). `workers` threads run the NF instances to
//! completion over batches; each instance is owned by one worker and fed by one lock-free
//! queue. A splitter after every instance partitions its output over the downstream vertex's
//! instances on that vertex's scope.
//!
//! Memory is bounded by the window: the root admits a packet only while fewer than `window`
//! packets are in flight (replays after a failover add at most a log's worth each). No thread
//! ever waits for room in a queue: what does not fit stays with the sender, in order, and goes
//! when there is room (`Outgoing::retry`). Waiting would deadlock once replays add to the window:
//! a root pushing a replay into a full queue stops draining the notes queue that the workers
//! wait to push into (seen with batches of one packet).

use crate::clocks::ClockTracker;
use crate::live::Live;
use crate::plan::{Plan, Target, VertexPlan};
use crate::ports::{Fill, Sink, Source};
use crate::record::Recording;
use crate::report::{RunReport, StoreCrashReport};
use config::Checked;
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use ft::{Note, RootLog};
use outgoing::Outgoing;
use roots::{RootState, Split};
use sink::{drain_sink, Latencies};
use sluice_chc::egress::Egress;
use sluice_packet::{Batch, Clock, InstanceId, PacketPool, ParseStatus};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use worker::{worker_loop, Slot};

mod alloc;
mod config;
mod failover;
mod finish;
mod flow_timers;
mod ft;
mod idle;
mod input;
mod outgoing;
mod passing;
mod reconfig;
mod roots;
mod sink;
mod spread;
mod store_crash;
mod waiting;
mod wake;
mod worker;

pub use config::{Overflow, Planned, RunConfig, RunError, RunHooks, Slowdown, MAX_ROOTS};
pub use failover::Crash;
pub use reconfig::{Change, Reconfig};
pub use sluice_chc::manager::ManagerPolicy;

/// How many instances a vertex can have had over a run that scales (an instance's index is
/// never reused; queues and statistics exist only for those used).
pub const MAX_INSTANCES_PER_VERTEX: u16 = 64;

struct Shared {
    /// Per instance (global index), made when first used: spares kept for scaling cost
    /// nothing until then.
    queues: Vec<OnceLock<ArrayQueue<Batch>>>,
    queue_cap: usize,
    clocks: Arc<ClockTracker>,
    /// Roots stamping clocks (`RunConfig::roots`).
    roots: u8,
    /// Per root (0 unused: the calling thread's own share): the batches the calling thread
    /// split off for it.
    root_inputs: Vec<ArrayQueue<Batch>>,
    /// Packets put on `root_inputs` and not yet admitted or dropped by their root.
    handed: CachePadded<AtomicUsize>,
    /// Per root: entries in its log, as it last said (root 0's unused).
    root_logged: Vec<CachePadded<AtomicUsize>>,
    /// Where copies leave the chain with a log: a clock leaves once (one for all roots).
    egress: Mutex<Egress>,
    /// Crashes of roots other than 0, asked and done.
    root_crashes: roots::RootCrashes,
    /// How far each root has admitted, for order-sensitive instances and, with several roots,
    /// for settling a change of flow allocation.
    admissions: crate::order::Admissions,
    /// Someone reads `admissions` (the roots then publish it): a vertex takes its input in
    /// entry order, or the run has several roots and may scale.
    publish_admissions: bool,
    /// With several roots: every packet that entered up to this time is admitted by root 0
    /// or on its root's queue (`roots::Split::push`).
    entered: CachePadded<AtomicU64>,
    sink: ArrayQueue<Batch>,
    spare: ArrayQueue<Batch>,
    in_flight: CachePadded<AtomicUsize>,
    input_done: AtomicBool,
    /// The run failed: workers stop at once.
    aborted: AtomicBool,
    /// Raised by the root when nothing has finished for a while: each worker then says what
    /// its instances hold (once per raise).
    describe_asked: AtomicU64,
    vertices: Vec<VertexPlan>,
    pool: PacketPool,
    batch: usize,
    /// Record every drop by clock (`RunConfig::record`); with a journal, write drops and
    /// events to it as they happen ([`RunHooks::journal`]).
    record: bool,
    journal: Option<Arc<dyn crate::record::RecordJournal>>,
    /// Live statistics, if someone reads them.
    live: Option<Arc<Live>>,
    /// With `RunConfig::fault_tolerance`: notes for each root's log, and emptied note buffers.
    notes: Option<Vec<ArrayQueue<Vec<Note>>>>,
    note_spare: ArrayQueue<Vec<Note>>,
    /// With `RunConfig::crashes`: what the root and the workers share for failovers.
    failover: Option<failover::Failover>,
    /// `reaches[v][w]`: vertex `v`'s routes lead to vertex `w` (itself included).
    reaches: Vec<Vec<bool>>,
    /// Per vertex: its instances take their input in entry order.
    ordered: Vec<bool>,
    /// On a node of a spread chain without the root, hosting order-sensitive instances: the
    /// root's progress as the root's node tells it (`spread/progress.rs`).
    from_root: Option<crate::order::FromRoot>,
    /// With `RunConfig::reconfigs`: the flow allocation and what scaling shares.
    scaling: Option<reconfig::Scaling>,
    /// With store crashes planned: what the root and the workers share for them.
    store_crash: Option<store_crash::StoreCrash>,
    /// A chain over several nodes, on the root's node: per instance, whether it runs on
    /// another node (its slot here waits, dormant, to take over should that node fail).
    elsewhere: Vec<AtomicBool>,
    /// Instances of nodes that failed, for the root to replace (`spread.rs`).
    failed_elsewhere: Mutex<Vec<(usize, Instant)>>,
    /// A node that should have answered has not: the root admits nothing meanwhile, so that
    /// a node that died does not take a whole window of copies with it (`spread.rs`).
    hold_admission: AtomicBool,
    /// Who to wake when a batch is queued for a sleeping worker's instance.
    wake: wake::Wake,
    /// A node that may fail: a batch's packets leave an instance only once its updates are
    /// sent ([`Outgoing`]'s `hold`), so a copy seen out of a failed node had its updates sent.
    send_updates_first: bool,
}

impl Shared {
    /// Instance `i`'s queue (the sink's past the last instance: `None`).
    fn queue(&self, i: usize) -> Option<&ArrayQueue<Batch>> {
        self.queues.get(i).map(|q| q.get_or_init(|| ArrayQueue::new(self.queue_cap)))
    }
    /// Whether some instance has a batch waiting in its queue: the instances are behind.
    fn backlog(&self) -> bool {
        self.queues.iter().any(|q| q.get().is_some_and(|q| !q.is_empty()))
    }
    /// Whether instance `i` runs on another node.
    fn is_elsewhere(&self, i: usize) -> bool {
        self.elsewhere.get(i).is_some_and(|e| e.load(Ordering::Acquire))
    }
    /// A batch from instance `i`'s queue.
    fn pop(&self, i: usize) -> Option<Batch> {
        let b = self.queue(i)?.pop()?;
        if let Some(sc) = &self.scaling {
            sc.queued(i, -(b.len() as isize));
        }
        Some(b)
    }
    /// Whether every copy of `clock` in flight is held by recovering replacements past vertex
    /// `v` ([`failover::Failover::past`]): for what waits at `v`, it has gone by.
    fn past_recovering(&self, v: usize, clock: Clock) -> bool {
        self.failover.as_ref().is_some_and(|fo| fo.past(self, v, clock))
    }
    /// The global index of the instance at `position` among `vertex`'s instances now (fault
    /// schedules name instances so).
    fn member(&self, vertex: usize, position: u16) -> Result<usize, String> {
        let v = self.vertices.get(vertex).ok_or_else(|| format!("no vertex with index {vertex}"))?;
        let found = match &self.scaling {
            Some(sc) => sc.alloc.current(vertex).and_then(|e| e.members().nth(usize::from(position))),
            None => v.instances.get(usize::from(position)).copied(),
        };
        let n = self.scaling.as_ref().map_or(v.instances.len(), |sc| sc.members(vertex));
        found.ok_or_else(|| format!("`{}` has {n} instance(s) at this point, not an instance {position}", v.name))
    }
    /// The position among `vertex`'s instances now of the one with index `index`.
    fn position(&self, vertex: usize, index: u16) -> Option<u16> {
        let g = self.vertices.get(vertex)?.global(index)?;
        let sc = self.scaling.as_ref()?;
        let p = sc.alloc.current(vertex)?.members().position(|m| m == g)?;
        u16::try_from(p).ok()
    }
    /// The index of instance `global` in `vertex`.
    fn index_of(&self, vertex: usize, global: usize) -> u16 {
        let v = self.vertices.get(vertex);
        let all = v.into_iter().flat_map(|v| v.instances.iter().chain(&v.spares));
        all.enumerate().find(|(_, g)| **g == global).map_or(0, |(i, _)| i as u16)
    }
    /// The global index of instance `index` of `vertex`, if it serves flows now.
    fn serving(&self, vertex: usize, index: u16) -> Option<usize> {
        let v = self.vertices.get(vertex)?;
        match &self.scaling {
            Some(sc) => v.global(index).filter(|g| sc.serving(*g)),
            None => v.instances.get(usize::from(index)).copied(),
        }
    }
    fn empty_batch(&self) -> Batch {
        self.spare.pop().unwrap_or_else(|| Vec::with_capacity(self.batch))
    }
    fn give_back(&self, mut b: Batch) {
        b.clear();
        let _ = self.spare.push(b);
    }
    /// Whether the root keeps a log (workers then report copies and commits).
    fn logging(&self) -> bool {
        self.notes.is_some()
    }
    /// Whether a replay copy aimed at `target` goes to `to` (queue `dest`): the target itself,
    /// or a vertex in front of it; elsewhere it has nothing to do.
    fn leads_to(&self, to: Target, dest: usize, target: InstanceId) -> bool {
        let Target::Vertex(w) = to else { return false };
        let tv = usize::from(target.vertex());
        if w == tv {
            return self.vertices.get(w).and_then(|v| v.global(target.index())) == Some(dest);
        }
        self.reaches.get(w).and_then(|r| r.get(tv)).copied().unwrap_or(false)
    }
}

/// Runs `plan` over `source` into `sink`.
pub fn run(
    plan: Plan,
    cfg: &RunConfig,
    source: &mut dyn Source,
    sink: &mut dyn Sink,
    hooks: RunHooks<'_>,
) -> Result<RunReport, RunError> {
    let Checked { inline, scalable, crashes_planned, can_fail_over, store_crashes } =
        config::check(cfg, &plan, hooks.live.is_some())?;
    let roots = cfg.roots;
    let mut plan = plan;
    if scalable && plan.vertices.iter().all(|v| v.spares.is_empty()) {
        plan.reserve_spares(MAX_INSTANCES_PER_VERTEX);
    }
    // Packets of different roots overtake each other everywhere in the chain.
    let ordered = crate::order::needs_entry_order(&plan, scalable, roots);
    // Read only by order-sensitive instances and by settling with several roots (`past_cut`).
    let publish_admissions = ordered.iter().any(|o| *o) || (roots > 1 && scalable);
    // A slowdown is applied through the live record workers read once per batch; a clone's
    // trial compares the instances' busy times there.
    let slows = cfg.planned.iter().any(|p| matches!(p, Planned::Slow(_)));
    let clones =
        cfg.planned.iter().any(|p| matches!(p, Planned::Change(Reconfig { change: Change::Clone { .. }, .. })))
            || cfg.policies.iter().any(|(_, p)| p.straggler_slower_by_percent.is_some());
    let live = hooks.live.clone().or_else(|| (slows || clones).then(|| Arc::new(Live::new(&plan))));
    // A control endpoint may ask for a store crash at any time: the run then takes the
    // checkpoints a rebuild starts from (the workers hold still and flush for each).
    let why_no_store_crash = match (can_fail_over, cfg.checkpoint_every) {
        (false, _) => Some("losing the store needs the instances' write-ahead logs and the root's log: start the run with --fault-tolerance and a store (not local state)".to_string()),
        (true, None) => Some("the run takes no checkpoints (--checkpoint-ms 0): a rebuilt store starts from the last one".to_string()),
        (true, Some(_)) => None,
    };
    let live_store_crash = hooks.live.is_some() && why_no_store_crash.is_none();
    let slot_count = plan.slot_count();
    let layout = cfg.part.as_ref().map(|p| spread::layout(p, &plan, slot_count)).transpose()?;
    let Plan { name, vertices, entry, traffic, mut instances, store, state, mut rebuilder, .. } = plan;
    if !(store_crashes || live_store_crash) {
        // Only a store rebuild reads the instances' write-ahead logs.
        rebuilder.without_write_ahead_log();
        for (_, inst) in &mut instances {
            if let Some(c) = crate::plan::store_client(inst) {
                c.drop_write_ahead_log();
            }
        }
    }
    if scalable || vertices.iter().any(|v| v.instances.len() > 1) {
        // A timer on a shared key fires wherever the first packet past its deadline goes; at
        // an order-sensitive vertex every timer does (`flow_timers.rs`; not across processes).
        rebuilder.share_vertex_timers(&ordered.iter().map(|o| *o && layout.is_none()).collect::<Vec<_>>());
        for (_, inst) in &mut instances {
            rebuilder.attach_vertex_timers(inst);
        }
    }
    let per_vertex: Vec<u16> = vertices.iter().map(|v| v.instances.len() as u16).collect();
    let successors: Vec<Vec<usize>> = vertices.iter().map(VertexPlan::successors).collect();
    let reaches = sluice_chc::splitter::reachability(&successors);
    let concerns = failover::lost_concerns(&vertices, &entry, &reaches);
    let mirrors: usize =
        vertices.iter().flat_map(|v| v.routes.iter().flatten()).map(|r| r.mirrors.len()).sum::<usize>()
            + entry.iter().map(|r| r.mirrors.len()).sum::<usize>();
    // Every packet in the window (originals and mirror copies) fits in any one queue; replays
    // after a failover may not, and wait with their sender.
    let cap = cfg.window * (1 + mirrors) + 1024;
    let pool = PacketPool::new(cfg.window * (1 + mirrors).min(4), 2048);
    let workers = cfg.workers.max(1).min(instances.len().max(1));
    let scaling = scalable
        .then(|| reconfig::Scaling::new(&vertices, (slot_count, instances.len()), (workers, roots), rebuilder.clone()));
    let from_root = layout.as_ref().and_then(|l| spread::from_root(l, &vertices, &ordered));
    let hands = layout.as_ref().is_some_and(|l| !l.has_root());
    let shared = Arc::new(Shared {
        queues: (0..slot_count).map(|_| OnceLock::new()).collect(),
        queue_cap: cap,
        clocks: Arc::new(ClockTracker::new(cfg.window, roots).changed_by_one_thread(inline)),
        roots,
        root_inputs: (0..roots).map(|r| ArrayQueue::new(if r == 0 { 1 } else { ROOT_INPUT_BATCHES })).collect(),
        handed: CachePadded::new(AtomicUsize::new(0)),
        root_logged: (0..roots).map(|_| CachePadded::new(AtomicUsize::new(0))).collect(),
        root_crashes: roots::RootCrashes::new(roots),
        egress: Mutex::new(Egress::default()),
        admissions: crate::order::Admissions::new(roots),
        publish_admissions,
        entered: CachePadded::new(AtomicU64::new(0)),
        sink: ArrayQueue::new(cap),
        spare: ArrayQueue::new(cap.min(1 << 16)),
        in_flight: CachePadded::new(AtomicUsize::new(0)),
        input_done: AtomicBool::new(false),
        aborted: AtomicBool::new(false),
        describe_asked: AtomicU64::new(0),
        vertices,
        pool: pool.clone(),
        batch: cfg.batch,
        record: cfg.record,
        journal: hooks.journal.clone().filter(|_| cfg.record),
        live: live.clone(),
        // A node without the root sends its notes there: they keep its window and its log.
        notes: (cfg.fault_tolerance || layout.as_ref().is_some_and(|l| !l.has_root()))
            .then(|| (0..roots).map(|_| ArrayQueue::new(NOTE_BUFFERS)).collect()),
        note_spare: ArrayQueue::new(NOTE_BUFFERS * usize::from(roots)),
        // Armed for the crashes planned, or for those a control endpoint or a failed node
        // may ask for.
        failover: (crashes_planned
            || (can_fail_over && (hooks.live.is_some() || spread::may_fail_over(layout.as_ref()))))
        .then(|| failover::Failover::new((slot_count, per_vertex, concerns), rebuilder, (cfg.window, roots, hands))),
        reaches,
        ordered,
        from_root,
        scaling,
        store_crash: store.clone().filter(|_| store_crashes || live_store_crash).map(store_crash::StoreCrash::new),
        elsewhere: (0..slot_count).map(|g| AtomicBool::new(layout.as_ref().is_some_and(|l| !l.here(g)))).collect(),
        failed_elsewhere: Mutex::new(Vec::new()),
        hold_admission: AtomicBool::new(false),
        wake: wake::Wake::new(slot_count, workers),
        send_updates_first: can_fail_over && spread::may_fail_over(layout.as_ref()),
    });
    let mut planned = config::planned_in_order(&shared, cfg, scalable, layout.as_ref())?.into_iter().peekable();
    // The configuration is good: the store is this run's from here on.
    if let (Some(mark), Some(backend)) = (&cfg.claim, &store) {
        crate::store_claim::claim_store(backend, mark, false)?;
    }
    // A run that may lose its store rebuilds it from its last checkpoint: the first is the
    // store as the run starts (its claim with it), not nothing.
    let first_checkpoint = match (&shared.store_crash, &store) {
        (Some(_), Some(backend)) => {
            backend.checkpoint().map_err(|e| RunError::Store(format!("the run's first checkpoint: {e}")))?
        }
        _ => sluice_store::Checkpoint::default(),
    };
    // The admission count of the next planned event: one comparison per packet until then.
    let mut next_fault = planned.peek().map_or(u64::MAX, Planned::after);
    let mut scaling_side = reconfig::RootSide::default();
    let mut reconfigurations = Vec::new();
    let managed = !cfg.policies.is_empty();
    if let Some(live) = &shared.live {
        config::tell_live(live, cfg, (can_fail_over, scalable, why_no_store_crash));
        if let Some(l) = &layout {
            spread::live_view(live, l, (&shared.vertices, slot_count), scalable);
        }
    }
    let mut failover_side = failover::RootSide::default();
    let mut failovers = Vec::new();
    let new_log = |id: u8| -> Result<Option<RootLog>, RunError> {
        let Some(log) = cfg.fault_tolerance.then(|| RootLog::new(cfg.window, id, roots)) else { return Ok(None) };
        match (cfg.log_in_store, &store) {
            (true, Some(b)) => log.in_store(b.clone()).map(Some).map_err(|e| RunError::Config(e.to_string())),
            _ => Ok(Some(log)),
        }
    };
    let mut r0 = RootState::new(0, (new_log(0)?, cfg.record), store.as_ref())?;
    let mut others = Vec::new();
    for id in 1..roots {
        others.push(RootState::new(id, (new_log(id)?, cfg.record), store.as_ref())?);
    }

    // With other nodes: they answer before anything runs (the same chain and placement).
    let (link_thread, mut part_link) = match &layout {
        Some(l) => spread::connect(&shared, l, cfg.fault_tolerance, hooks.stop.as_deref())?,
        None => (None, None),
    };
    // Instances go round-robin to workers (those added later too, by global index); with
    // other nodes, only this node's.
    let mut per_worker: Vec<Vec<Slot>> = (0..workers).map(|_| Vec::new()).collect();
    let mut here = 0usize;
    for (global, (vertex, inst)) in instances.into_iter().enumerate() {
        // The root's node keeps the others' slots, dormant, for their failover.
        if layout.as_ref().is_some_and(|l| !l.here(global) && !l.has_root()) {
            continue;
        }
        let k = if layout.as_ref().is_some_and(|l| !l.has_root()) { here } else { global };
        here += 1;
        if let Some(w) = per_worker.get_mut(k % workers) {
            w.push(Slot::new(&shared, global, vertex, inst));
        }
    }
    let cores = if cfg.pin { core_affinity::get_core_ids().unwrap_or_default() } else { Vec::new() };
    let mut handles = Vec::new();
    let mut inline_turns = inline.then(|| worker::Turns::new(&shared, 0, per_worker.pop().unwrap_or_default()));
    for (w, slots) in per_worker.into_iter().enumerate() {
        let shared = shared.clone();
        let core = cores.get(w % cores.len().max(1)).copied();
        let h = std::thread::Builder::new()
            .name(format!("sluice-worker-{w}"))
            .spawn(move || {
                if let Some(c) = core {
                    core_affinity::set_for_current(c);
                }
                worker_loop(&shared, w, slots)
            })
            .map_err(|e| RunError::Worker(e.to_string()))?;
        handles.push(h);
    }

    let t0 = Instant::now();
    let mut root_handles = Vec::new();
    for state in others {
        let shared = shared.clone();
        let (entry, traffic) = (entry.clone(), traffic.clone());
        let pace = (cfg.window, cfg.overflow);
        let h = std::thread::Builder::new()
            .name(format!("sluice-root-{}", state.id))
            .spawn(move || {
                let end = roots::other_root(&shared, state, (&entry, traffic.as_ref()), pace);
                if end.is_err() {
                    // The run cannot end well: everyone stops.
                    shared.aborted.store(true, Ordering::Release);
                }
                end
            })
            .map_err(|e| RunError::Worker(e.to_string()))?;
        root_handles.push(h);
    }
    let mut split = Split::new(roots, cfg.record);

    let workers = if inline { 0 } else { workers };
    let mut report =
        RunReport { chain: name, state, workers, roots, batch: cfg.batch, window: cfg.window, ..RunReport::default() };
    let mut latencies = Latencies::new(cfg.latency_timeline.is_some())?;
    let mut root = Outgoing::new(&shared);
    let mut inbuf: Batch = Vec::with_capacity(cfg.batch);
    // Admitted and stamped, not yet in the chain.
    let mut stamped: Batch = Vec::with_capacity(cfg.batch);
    // Root 0's crash, asked at this many packets admitted.
    let mut root_crash_due: Option<u64> = None;
    let mut held_crashes = crate::live::HeldCrashes::default();
    // The packet count the last store crash was asked at.
    let mut store_crash_at = 0u64;
    let mut checkpoints = store_crash::Checkpoints::new(cfg.checkpoint_every, first_checkpoint);
    let mut source_done = false;
    let mut last_progress = Instant::now();
    // The oldest unfinished clock as last seen, and since when it has not moved.
    let (mut low_seen, mut quiet_since) = (0u64, Instant::now());
    // Dropped before any root: malformed or truncated.
    let mut root_drops: BTreeMap<&'static str, u64> = BTreeMap::new();
    let recording = cfg.record.then(Recording::default);
    // With a log: when the last copy finished, and so the wait for the last commits began.
    let mut settling: Option<Instant> = None;
    let mut idle_turns = 0u32;
    let result: Result<(), RunError> = (|| loop {
        if let Some(link) = part_link.as_mut() {
            // A node without the root serves its links until the root's node ends the run;
            // its own counts of what is in flight mean nothing (the root's node counts).
            let served = spread::serve_part(&shared, link, hooks.stop.as_deref());
            shared.in_flight.store(0, Ordering::Release);
            return served;
        }
        if shared.aborted.load(Ordering::Acquire) {
            return Err(RunError::Worker("a root thread failed".into()));
        }
        if let Some(t) = inline_turns.as_mut() {
            // Run to completion: everything the chain holds goes through before more is read.
            while t.turn(&shared) {}
        }
        drain_sink(&shared, sink, &mut report, &mut latencies, t0, (r0.log.as_mut(), &mut root))?;
        let oldest_logged = r0.take_notes(&shared);
        let seq = r0.seq;
        if let (Some(fo), Some(l)) = (&shared.failover, r0.log.as_mut()) {
            fo.set_oldest_logged(0, oldest_logged.map_or(seq + 1, |c| c.seq()));
            let now_ms = t0.elapsed().as_secs_f64() * 1e3;
            failover_side.serve(&shared, (&entry, traffic.as_ref()), (l, &mut root), &mut failovers, now_ms);
        }
        // What found a queue full goes first; meanwhile no new input is admitted.
        let stalled = root.retry(&shared) || split.push(&shared);
        let (root_crash_asked, store_crash_asked) = held_crashes.take(shared.live.as_deref());
        if root_crash_asked {
            root_crash_due = Some(seq);
        }
        if store_crash_asked {
            (checkpoints.crash_due, store_crash_at) = (true, seq);
        }
        if let Some(at) = root_crash_due.filter(|_| !stalled) {
            // Between two batches, everything admitted in the chain: the root fails.
            root_crash_due = None;
            if let Some(l) = r0.log.as_mut() {
                let c = l
                    .crash((at, t0.elapsed().as_secs_f64() * 1e3))
                    .map_err(|e| RunError::Worker(format!("the new root: {e}")))?;
                // The clocks skipped count against the window at once: admitting past the
                // in-flight ring's span would put two clocks on one slot.
                r0.seq = c.resumed_at;
                report.root_crashes.push(c);
                held_crashes.root_done(at);
            }
        }
        let (seq, now) = (r0.seq, Instant::now()); // one clock read (~20 ns) for the turn
        let now_ms = now.duration_since(t0).as_secs_f64() * 1e3;
        if root_crash_due.is_none() {
            failover_side.ask_held(&shared, now_ms, &mut failovers);
        }
        failover_side.take_live(&shared, (seq, now_ms), &mut failovers);
        failover_side.take_elsewhere(&shared, (seq, now_ms), &mut failovers);
        let at = reconfig::At::with_ms((if roots > 1 { split.entered() } else { seq }, seq, split.last_entry), now_ms);
        scaling_side.take_live(&shared, at, &mut reconfigurations);
        scaling_side.judge_trials(&shared, at, &mut reconfigurations);
        r0.advance_low(&shared);
        let low = r0.low;
        scaling_side.serve(&shared, low, &mut reconfigurations);
        if low != low_seen || (shared.in_flight.load(Ordering::Acquire) == 0 && !source_done) {
            (low_seen, quiet_since) = (low, now);
        } else if now.saturating_duration_since(quiet_since) >= waiting::NOTICE_AFTER {
            // Nothing finished for a while: say what the run waits for (a run that never ends
            // is a bug; this is where to start looking), and ask the workers what they hold.
            quiet_since = now;
            let what = if source_done {
                "the input is done; the run waits for these"
            } else {
                "nothing has finished for a while; the run waits for these"
            };
            waiting::warn(&shared, (low, seq, r0.log.as_ref()), (&failover_side, &scaling_side), what);
        }
        if let Some(b) = &store {
            let crashed = checkpoints
                .turn(&shared, workers, &failover_side, &mut report, &|c| {
                    r0.log.as_ref().is_some_and(|l| l.is_logged(c))
                })
                .map_err(RunError::Worker)?;
            if let Some(r) = crashed {
                // The root's own connections go to the rebuilt store too.
                r0.reconnect(b)?;
                let written = r0
                    .log
                    .as_mut()
                    .map_or(Ok(0), RootLog::store_rebuilt)
                    .map_err(|e| RunError::Worker(e.to_string()))?;
                let detail = format!("{}; {written} log entries written back", r.detail);
                let at_packet = store_crash_at;
                tracing::info!(at_packet, paused_ms = r.paused_ms, %detail, "the store failed and was rebuilt");
                let at_ms = t0.elapsed().as_secs_f64() * 1e3;
                report.store_crashes.push(StoreCrashReport { at_packet, at_ms, paused_ms: r.paused_ms, detail });
                held_crashes.store_done(at_packet);
            }
        }
        if source_done {
            // Nothing handed to another root and not admitted (read first: a root counts a
            // packet in flight, and its log, before it stops counting it as handed).
            let handed = shared.handed.load(Ordering::Acquire);
            if handed == 0
                && !stalled
                && shared.in_flight.load(Ordering::Acquire) == 0
                && !failover_side.busy()
                && !scaling_side.busy()
                && !shared.root_crashes.pending()
            {
                // The last updates' acknowledgements are still on their way to the logs; a
                // store that stopped answering leaves entries behind (reported), not a hang.
                let others_logged: usize = shared.root_logged.iter().skip(1).map(|n| n.load(Ordering::Acquire)).sum();
                let settled = r0.logged() == 0 && others_logged == 0;
                let since = *settling.get_or_insert_with(Instant::now);
                if settled || since.elapsed() >= SETTLE_LIMIT {
                    return Ok(());
                }
            }
            // Only the sink is left to serve: leave the CPU to the workers in between.
            if !inline {
                std::thread::sleep(Duration::from_micros(20));
            }
            continue;
        }
        if hooks.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            source_done = true;
            continue;
        }
        r0.forget_old(oldest_logged)?;
        let room = r0.room(&shared, cfg.window);
        if stalled || (room < cfg.batch && cfg.overflow == Overflow::Wait) {
            // The chain is full: give the workers the CPU rather than spin on it.
            if !inline {
                std::thread::sleep(Duration::from_micros(20));
            }
            continue;
        }
        inbuf.clear();
        let mut filled = source.fill(&pool, &mut inbuf, cfg.batch)?;
        if filled == Fill::Data && inbuf.len() < cfg.batch && !inline && shared.backlog() {
            filled = input::fill_batch(source, &pool, &mut inbuf, cfg.batch)?;
        }
        match filled {
            Fill::Done => source_done = true,
            Fill::Idle => {
                // Nothing to read yet (a paced trace, a quiet interface): after a few turns,
                // sleep rather than yield, which keeps a core busy that the workers and the
                // store's threads need (on two cores, milliseconds of latency every so often).
                idle_turns += 1;
                if idle_turns < IDLE_TURNS_BEFORE_SLEEP {
                    std::thread::yield_now()
                } else {
                    std::thread::sleep(Duration::from_micros(10))
                }
            }
            Fill::Data => idle_turns = 0,
        }
        if inbuf.is_empty() {
            continue;
        }
        let now_ns = t0.elapsed().as_nanos() as u64;
        let read = inbuf.len() as u64;
        let dropped_before: u64 = root_drops.values().sum::<u64>() + r0.dropped();
        let mut admitted = 0usize;
        let room = r0.room(&shared, cfg.window);
        for mut pkt in inbuf.drain(..) {
            report.packets_in += 1;
            report.bytes_in += pkt.len() as u64;
            let malformed = match pkt.hdr().status {
                ParseStatus::Truncated => Some("truncated"),
                ParseStatus::Malformed => Some("malformed"),
                _ => None,
            };
            if let Some(r) = malformed {
                split.routed(None);
                *root_drops.entry(r).or_default() += 1;
                pool.recycle(pkt);
                continue;
            }
            split.stamp(&mut pkt, now_ns);
            let to = if roots > 1 { sluice_chc::root::partition(&pkt, usize::from(roots)) } else { 0 };
            split.routed(Some(to));
            let pkt = if to != 0 {
                split.hand(&shared, to, pkt);
                None
            } else {
                // With `wait`, room was checked before reading: what was read is admitted.
                let over = admitted >= room && cfg.overflow == Overflow::Drop;
                let Some(pkt) = r0.admit(&shared, pkt, over) else { continue };
                admitted += 1;
                Some(pkt)
            };
            // Faults are planned by packets admitted: root 0's clock, or with several roots
            // the packets that went to any root (each admits all it is handed).
            let seq = if roots > 1 { split.entered() } else { r0.seq };
            if seq >= next_fault {
                while let Some(p) = planned.next_if(|p| p.after() <= seq) {
                    match p {
                        Planned::Slow(s) => {
                            let g = shared.member(s.vertex, s.index).map_err(RunError::Config)?;
                            if let Some(l) = &live {
                                l.set_slow_of(g, s.delay_us);
                            }
                        }
                        Planned::Crash(c) => {
                            let g = shared.member(c.vertex, c.index).map_err(RunError::Config)?;
                            failover_side.hold(Crash { index: shared.index_of(c.vertex, g), ..c }, g);
                        }
                        // A change takes effect for the packets admitted after this one.
                        Planned::Change(r) => {
                            let at = reconfig::At::now((seq, r0.seq, split.last_entry), t0);
                            scaling_side
                                .apply(&shared, &r, at, &mut reconfigurations)
                                .map_err(|e| RunError::Config(format!("scaling while the chain runs: {e}")))?
                        }
                        // The root fails between batches, once this one is in the chain.
                        Planned::CrashRoot(after, 0) => root_crash_due = Some(after),
                        // Another root fails between two of its batches.
                        Planned::CrashRoot(after, r) => shared.root_crashes.ask(r, after),
                        Planned::CrashStore(after) => (checkpoints.crash_due, store_crash_at) = (true, after),
                    }
                }
                next_fault = planned.peek().map_or(u64::MAX, Planned::after);
            }
            if managed && seq.is_multiple_of(MANAGE_EVERY) {
                let at = reconfig::At::now((seq, r0.seq, split.last_entry), t0);
                scaling_side
                    .manage(&shared, &cfg.policies, at, &mut reconfigurations)
                    .map_err(|e| RunError::Config(format!("a vertex manager's scaling: {e}")))?;
            }
            stamped.extend(pkt);
        }
        // Root 0 has admitted its share of everything read.
        r0.passed(&shared, split.last_entry);
        split.push(&shared);
        r0.enter(&shared, &mut root, (&entry, traffic.as_ref()), &mut stamped)?;
        if let Some(live) = &shared.live {
            let dropped = root_drops.values().sum::<u64>() + r0.dropped() - dropped_before;
            live.root(read, dropped, shared.in_flight.load(Ordering::Relaxed));
            if let Some(l) = &r0.log {
                live.root_log(l.report());
            }
        }
        if let Some(p) = hooks.progress {
            if last_progress.elapsed() >= Duration::from_millis(100) {
                last_progress = Instant::now();
                p(report.packets_in);
            }
        }
    })();
    shared.input_done.store(true, Ordering::Release);
    if let Some(live) = &shared.live {
        live.input_ended();
    }
    if result.is_err() {
        // The workers stop where they are: what is in flight may wait for something that will
        // not happen now (a replay, a change settling), and the output is discarded anyway.
        shared.aborted.store(true, Ordering::Release);
    }
    let (mut slots, workers_mirrored) = finish::join_workers(&shared, handles, inline_turns.take())?;
    let mirrored = root.mirrored + workers_mirrored;
    let r0_seq = r0.seq;
    let mut all_roots = vec![r0];
    for h in root_handles {
        all_roots.push(h.join().map_err(|_| RunError::Worker("a root thread panicked".into()))??);
    }
    // Where the run ended (last clock, last capture time): the root's node tells the others.
    // The link's own failure (a lost datagram, a node that runs another chain) says more than
    // the root's "stopped".
    let mut end_at = (Clock::new(0, r0_seq), all_roots.iter().map(|r| r.last_ts).max().unwrap_or(0));
    let mut owned = finish::Owned::all(shared.vertices.len());
    match (link_thread, part_link.as_ref()) {
        (Some(t), _) => {
            let end = t.finish(end_at, cfg.record && result.is_ok())?;
            (owned, report.link) = (end.owned, Some(end.report));
        }
        (None, Some(l)) => {
            // The run's own failure says more than the missing end it causes.
            end_at = if cfg.record && result.is_ok() { l.ended_at()? } else { end_at };
            owned.records_state = l.records_state(&shared.vertices);
        }
        (None, None) => {}
    }
    result?;
    report.root_crashes.extend(shared.root_crashes.take_done());
    report.root_crashes.sort_by_key(|c| c.at_packet);
    if let Some(live) = &shared.live {
        live.output(0, shared.in_flight.load(Ordering::Acquire));
    }
    sink.finish()?;
    report.elapsed_s = t0.elapsed().as_secs_f64();
    report.mpps = if report.elapsed_s > 0.0 { report.packets_in as f64 / report.elapsed_s / 1e6 } else { 0.0 };
    report.mirrored = mirrored + all_roots.iter().skip(1).map(|r| r.mirrored).sum::<u64>();
    // A node without the root keeps no log: the root's node reports it.
    report.fault_tolerance =
        layout.as_ref().is_none_or(|l| l.has_root()).then(|| roots::log_report(&all_roots, &shared.egress)).flatten();
    report.failovers = failovers;
    report.reconfigurations = reconfigurations;
    if let (Some(live), Some(ft)) = (&shared.live, &report.fault_tolerance) {
        live.root_log(ft.clone());
    }
    roots::drops_into(&mut report, &mut all_roots, root_drops);
    slots.sort_by_key(|(_, s)| s.global);
    if let Some(mut rec) = recording {
        // What timers fired at the end carry: the last clock stamped (with several roots, the
        // last input packet's).
        rec.end = end_at.0;
        if layout.as_ref().is_none_or(|l| l.has_root()) {
            rec.admitted = roots::merge_recorded(split.routed.take().unwrap_or_default(), &mut all_roots);
            rec.drops.extend(all_roots.iter_mut().flat_map(|r| std::mem::take(&mut r.no_route)));
            if all_roots.len() > 1 {
                rec.end = rec.admitted.iter().rev().find_map(|c| *c).unwrap_or_default();
            }
        }
        let (link, failed_over) = (part_link.as_mut(), !report.failovers.is_empty());
        finish::record_end(&mut rec, &mut slots, &shared, store.as_ref(), link, &owned, (end_at.1, failed_over))?;
        report.recording = Some(rec);
    } else if let Some(l) = part_link.as_mut() {
        l.tell_flushed(true);
    }
    if let Some(l) = part_link {
        report.link = Some(l.report);
    }
    finish::instances_into(&mut report, &shared, slots);
    latencies.into_report(&mut report, cfg.latency_timeline);
    Ok(report)
}

/// Batches the calling thread may have split off for another root and not yet taken.
const ROOT_INPUT_BATCHES: usize = 64;

/// Turns of the root loop with nothing to read before it sleeps between turns.
const IDLE_TURNS_BEFORE_SLEEP: u32 = 16;

/// Vertex managers look at their vertices every this many admitted packets (as in the
/// virtual-time engine).
pub const MANAGE_EVERY: u64 = 1_000;

/// Note buffers in flight between the workers and the root.
const NOTE_BUFFERS: usize = 4096;

/// How long the root waits, once every copy is done, for the store to acknowledge the last
/// updates before it ends the run with entries left in its log.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);
