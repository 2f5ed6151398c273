//! What a run is given: its parameters, the faults and changes planned at points of its input,
//! the hooks of its caller, and how it fails.

use super::failover::Crash;
use super::reconfig::Reconfig;
use crate::live::Live;
use crate::plan::Plan;
use crate::spread::Part;
use sluice_chc::manager::ManagerPolicy;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// What to do with input when the in-flight window is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// Drop it and count it (live traffic: never build a backlog).
    Drop,
    /// Stop reading until there is room (files: nothing is lost).
    Wait,
}

impl Overflow {
    /// The in-flight window a run gets unless told: a few thousand packets when input waits
    /// for room (more only queues in front of the instances: memory, cache misses and latency,
    /// measured 5–20 % slower at 65,536, docs/benchmarks.md), a deep one when live input is
    /// dropped past it (it absorbs bursts and pauses such as a failover's recovery).
    pub fn default_window(self) -> usize {
        match self {
            Overflow::Wait => 4_096,
            Overflow::Drop => 65_536,
        }
    }
}

/// Run parameters.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Worker threads. 0: none, the root thread turns the instances itself between batches
    /// (run to completion; only for runs without fault tolerance, planned faults or changes,
    /// vertex managers, scaling, several roots or a control endpoint).
    pub workers: usize,
    /// Pin workers to cores.
    pub pin: bool,
    /// Packets per batch.
    pub batch: usize,
    /// Roots, each on its own thread with its own clocks and log (CHC's several roots); the
    /// input is split over them by source address. `1` keeps everything on the calling thread.
    /// More than one does not yet combine with planned faults, scaling, vertex managers, a
    /// control endpoint, a log in the store or order-sensitive NFs ([`MAX_ROOTS`] at most).
    pub roots: u8,
    /// Most packets in flight at once.
    pub window: usize,
    /// Policy when the window is full.
    pub overflow: Overflow,
    /// Keep CHC's packet log at the root: every packet stays logged until its copies are done
    /// and the store acknowledged its updates (the XOR check), and copies of a clock that
    /// already left are dropped at the egress. What replay after a failure needs; off by
    /// default until the threaded runtime replays (docs/decisions.md).
    pub fault_tolerance: bool,
    /// With `fault_tolerance` and a state store: keep the root's packet log in the store too
    /// (`--log store`): every admitted packet is written there, and acknowledged, before it
    /// enters the chain, so a root crash loses no entry (the new root reads the log back).
    /// Otherwise the log lives at the root and dies with it.
    pub log_in_store: bool,
    /// With a state store: take a checkpoint of its contents (with the TS vector) this often.
    pub checkpoint_every: Option<Duration>,
    /// Keep what `sluice verify --recorded` needs ([`crate::record::Recording`]): the clock of
    /// every input packet, every drop by clock, and the final state after the timers due by
    /// the last packet's time fired.
    pub record: bool,
    /// Faults and changes planned at points of the input (a fault schedule's events): NF
    /// instances crash (needs `fault_tolerance` and a state store) or slow down, vertices scale
    /// and flows move (needs a state store). Events at the same point apply in this order.
    pub planned: Vec<Planned>,
    /// Vertex managers' policies (vertex index, policy): every [`MANAGE_EVERY`](super::MANAGE_EVERY) admitted
    /// packets each vertex is scaled on its instances' queues (needs a state store; straggler
    /// clones are not made in threads yet).
    pub policies: Vec<(usize, ManagerPolicy)>,
    /// Keep scaling and moves possible though none is planned (for a control endpoint); the
    /// run then tracks which flows each instance received and routes by the clock's
    /// allocation (needs a state store).
    pub scalable: bool,
    /// Report latency per window of this width as well ([`RunReport::latency_timeline`](crate::report::RunReport::latency_timeline)): how
    /// it moves around a failover.
    pub latency_timeline: Option<Duration>,
    /// One chain over several nodes: this process's part ([`crate::spread`]). Its instances
    /// run here, the others' queues go to their nodes; on the root's node the run reads the
    /// input and writes the output, elsewhere it serves until the root's node ends it.
    pub part: Option<Part>,
    /// Claim the store for this run, with this mark, once its configuration is found good and
    /// before anything runs ([`crate::store_claim`]; a store another run claimed is refused).
    /// `None`: no claim (a node without the root, or a caller that sees to it).
    pub claim: Option<String>,
}

/// Something planned at a point of a run's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planned {
    /// An NF instance crashes.
    Crash(Crash),
    /// An NF instance slows down or back.
    Slow(Slowdown),
    /// A vertex scales or flows move.
    Change(Reconfig),
    /// Root `.1` fails once this many packets were admitted (`.0`) and a new one takes over
    /// (needs `fault_tolerance`).
    CrashRoot(u64, u8),
    /// The state store loses everything once the root has admitted this many packets and is
    /// rebuilt from its last checkpoint and the instances (needs `fault_tolerance` and a
    /// store).
    CrashStore(u64),
}

impl Planned {
    /// Applied once the root has admitted this many packets.
    pub fn after(&self) -> u64 {
        match self {
            Planned::Crash(c) => c.after,
            Planned::Slow(s) => s.after,
            Planned::Change(r) => r.after,
            Planned::CrashRoot(after, _) | Planned::CrashStore(after) => *after,
        }
    }
}

/// An NF instance becomes slower (a `slow` fault): it spends `delay_us` more per packet, busy,
/// as a straggler on a slower core would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slowdown {
    /// Applied once the root has admitted this many packets.
    pub after: u64,
    /// The vertex (its index in the chain).
    pub vertex: usize,
    /// The instance of it: its position among the vertex's instances at that point, as fault
    /// schedules name instances.
    pub index: u16,
    /// Extra time per packet, µs, drawn between the two; `(0, 0)` back to normal.
    pub delay_us: (u64, u64),
}

/// The most roots a threaded run can have.
pub const MAX_ROOTS: u8 = 8;

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pin: true,
            batch: 32,
            roots: 1,
            window: Overflow::Wait.default_window(),
            overflow: Overflow::Wait,
            fault_tolerance: false,
            log_in_store: false,
            checkpoint_every: Some(Duration::from_millis(150)),
            record: false,
            planned: Vec::new(),
            policies: Vec::new(),
            scalable: false,
            latency_timeline: None,
            part: None,
            claim: None,
        }
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The source failed.
    #[error("input: {0}")]
    Source(String),
    /// The sink failed.
    #[error("output: {0}")]
    Sink(String),
    /// A worker thread died.
    #[error("worker thread failed: {0}")]
    Worker(String),
    /// Bad run parameters.
    #[error("run configuration: {0}")]
    Config(String),
    /// The state store failed before the run began (its first checkpoint).
    #[error("state store: {0}")]
    Store(String),
    /// The store could not be claimed for the run (another run's state is in it).
    #[error(transparent)]
    Claim(#[from] crate::store_claim::ClaimError),
}

/// Hooks the caller can give a run.
#[derive(Default)]
pub struct RunHooks<'a> {
    /// Called about ten times a second with the number of packets read so far.
    pub progress: Option<&'a dyn Fn(u64)>,
    /// Set to end the run early (input is treated as finished).
    pub stop: Option<Arc<AtomicBool>>,
    /// Live statistics to keep up to date while the run goes ([`Live::new`] of the plan).
    pub live: Option<Arc<Live>>,
    /// With `RunConfig::record`: where drops and events go as they happen (a node of a spread
    /// run, whose part of the record must outlive it).
    pub journal: Option<Arc<dyn crate::record::RecordJournal>>,
}

/// What [`check`] found out about a run's configuration.
pub(super) struct Checked {
    /// No worker threads: the root thread runs the instances itself between batches.
    pub(super) inline: bool,
    /// Instances may be added and flows moved.
    pub(super) scalable: bool,
    /// Instance crashes are planned.
    pub(super) crashes_planned: bool,
    /// Failed instances can be replaced (a root log and a store).
    pub(super) can_fail_over: bool,
    /// Store crashes are planned.
    pub(super) store_crashes: bool,
}

/// Refuses configurations a run cannot honour, saying why; `live`: a control endpoint.
pub(super) fn check(cfg: &RunConfig, plan: &Plan, live: bool) -> Result<Checked, RunError> {
    if cfg.batch == 0 || cfg.window < cfg.batch {
        return Err(RunError::Config(format!(
            "batch ({}) must be positive and window ({}) at least one batch",
            cfg.batch, cfg.window
        )));
    }
    // No worker threads: the root thread runs the instances itself between batches.
    let inline = cfg.workers == 0;
    if inline {
        super::input::run_to_completion_allowed(cfg, live).map_err(RunError::Config)?;
    }
    // A spread that says so is scalable on every node alike (places for added instances, entry
    // order for order-sensitive NFs), whichever node takes the changes.
    let spread_scalable = cfg.part.as_ref().is_some_and(|p| p.spread.scalable);
    let scalable = cfg.scalable
        || spread_scalable
        || !cfg.policies.is_empty()
        || cfg.planned.iter().any(|p| matches!(p, Planned::Change(_)));
    for (v, _) in &cfg.policies {
        if *v >= plan.vertices.len() {
            return Err(RunError::Config(format!("a policy for vertex {v}, which the chain does not have")));
        }
    }
    let crashes_planned = cfg.planned.iter().any(|p| matches!(p, Planned::Crash(_)));
    let roots = cfg.roots;
    if !(1..=MAX_ROOTS).contains(&roots) {
        return Err(RunError::Config(format!("{roots} roots: a run has 1 to {MAX_ROOTS}")));
    }
    if cfg.window < usize::from(roots) * cfg.batch {
        return Err(RunError::Config(format!(
            "window ({}) must hold a batch ({}) for each of the {roots} roots: each root has its share of it",
            cfg.window, cfg.batch
        )));
    }
    let can_fail_over = cfg.fault_tolerance && plan.rebuilder.has_store();
    if scalable && !plan.rebuilder.has_store() {
        return Err(RunError::Config(
            "scaling and moving flows needs the state in a store (not `local`): flows take their state along through it".into(),
        ));
    }
    if crashes_planned && !can_fail_over {
        return Err(RunError::Config(
            "crashing instances needs the root's log (fault tolerance) and state in a store (not `local`)".into(),
        ));
    }
    let root_crashes = cfg.planned.iter().any(|p| matches!(p, Planned::CrashRoot(..)));
    if let Some(r) = cfg.planned.iter().find_map(|p| match p {
        Planned::CrashRoot(_, r) if *r >= roots => Some(*r),
        _ => None,
    }) {
        return Err(RunError::Config(format!("a crash of root {r}: the run has {roots} root(s), 0 to {}", roots - 1)));
    }
    if root_crashes && !cfg.fault_tolerance {
        return Err(RunError::Config("crashing the root needs its log and clock (fault tolerance)".into()));
    }
    let store_crashes = cfg.planned.iter().any(|p| matches!(p, Planned::CrashStore(_)));
    if store_crashes && !can_fail_over {
        return Err(RunError::Config(
            "crashing the store needs the instances' write-ahead logs (fault tolerance) and state in a store (not `local`)".into(),
        ));
    }
    if cfg.log_in_store && !can_fail_over {
        return Err(RunError::Config(
            "keeping the root's log in the store needs fault tolerance and state in a store (not `local`)".into(),
        ));
    }
    if cfg.part.is_some() {
        spread_allowed(cfg, scalable && !spread_scalable).map_err(RunError::Config)?;
    }
    Ok(Checked { inline, scalable, crashes_planned, can_fail_over, store_crashes })
}

/// What a chain over several nodes does not do yet (docs/decisions.md, "One chain across
/// nodes": several roots and changes across nodes are the next steps); `unannounced`: changes
/// asked for in a spread that does not say `scalable: true`. Which vertices the root's node
/// may change, slow and manage is checked once the layout is known
/// (`spread::check_planned_changes`).
fn spread_allowed(cfg: &RunConfig, unannounced: bool) -> Result<(), String> {
    let not_yet = |what: &str| Err(format!("a chain over several nodes does not yet take {what}"));
    if cfg.planned.iter().any(|p| !matches!(p, Planned::Change(_) | Planned::Slow(_))) {
        return not_yet("planned faults (--faults) other than `scale`, `move`, `clone` and `slow`");
    }
    if unannounced {
        return Err("scaling, moves and clones in a chain over several nodes need `scalable: true` in the spread file (in a hosted run: `sluice node --scalable` on every node), so that every node keeps places for the instances added".into());
    }
    if cfg.roots > 1 {
        return not_yet("several roots");
    }
    if cfg.workers == 0 {
        return not_yet("--workers 0 (the link to the other nodes runs beside the workers)");
    }
    Ok(())
}

/// Tells `live` what the run can be asked to do (`None`) or why not: crash instances (it can
/// fail over), crash the root, lose the store (`why_no_store_crash`), scale.
pub(super) fn tell_live(
    live: &crate::live::Live,
    cfg: &RunConfig,
    (can_fail_over, scalable, why_no_store_crash): (bool, bool, Option<String>),
) {
    live.set_failover(match (cfg.fault_tolerance, can_fail_over) {
        (_, true) => None,
        (false, _) => Some("the run keeps no root log to replay: start it with --fault-tolerance".into()),
        (true, false) => Some("the run keeps its state in the instances (local): a replacement needs a store".into()),
    });
    live.set_root_crash((!cfg.fault_tolerance).then(|| crate::live::NO_ROOT_LOG.into()));
    live.set_store_crash(why_no_store_crash);
    live.set_scaling((!scalable).then(|| {
        "the run was not started to scale: give it a store (not local state) and a control endpoint, or `scale`/`move` faults".into()
    }));
}

/// `cfg.planned` in the order they apply (stable: events at one point keep their order), each
/// checked against the chain (and, on a spread's root's node, with its policies, against what
/// that node may change: `layout`).
pub(super) fn planned_in_order(
    shared: &super::Shared,
    cfg: &RunConfig,
    scalable: bool,
    layout: Option<&crate::spread::Layout>,
) -> Result<Vec<Planned>, RunError> {
    if let Some(l) = layout.filter(|l| l.has_root()) {
        super::spread::check_planned_changes(l, &shared.vertices, (&cfg.planned, &cfg.policies))?;
    }
    let mut planned = cfg.planned.to_vec();
    planned.sort_by_key(Planned::after);
    for p in &planned {
        match p {
            // With scaling, which instances a vertex has depends on the point: checked then.
            Planned::Crash(Crash { vertex, index, .. }) | Planned::Slow(Slowdown { vertex, index, .. })
                if !scalable =>
            {
                shared.member(*vertex, *index).map_err(RunError::Config)?;
            }
            Planned::Change(r) if r.vertex >= shared.vertices.len() => {
                return Err(RunError::Config(format!("no vertex with index {}", r.vertex)));
            }
            _ => {}
        }
    }
    Ok(planned)
}
