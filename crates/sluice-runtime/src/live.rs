//! Live statistics of a running chain, for a control endpoint or a metrics exporter to read
//! while traffic flows ([`crate::RunHooks::live`]). Workers add to plain atomic counters once
//! per batch (never per packet) and the root once per input batch; readers take a
//! [`LiveSnapshot`] at any time. Counters only grow; gauges (queue depth, packets in flight)
//! are the latest value written.

use crate::exec::Change;
use crate::plan::Plan;
use crate::report::FaultToleranceReport;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

mod asks;
pub(crate) use asks::{Asks, Reply};
pub use asks::{Done, PATIENCE};

/// A global index kept for an instance scaling may add (not shown).
const SPARE: u8 = 0;
/// An instance serving flows.
const SERVING: u8 = 1;
/// An instance removed by scaling in (shown with what it did).
const RETIRED: u8 = 2;
/// An instance of a chain spread over nodes that runs on another node (its statistics are
/// that node's).
const ELSEWHERE: u8 = 3;

/// Live counters of one instance.
#[derive(Debug, Default)]
struct InstanceLive {
    vertex: usize,
    index: u16,
    /// [`SPARE`], [`SERVING`], [`RETIRED`] or [`ELSEWHERE`].
    status: AtomicU8,
    packets_in: AtomicU64,
    forwarded: AtomicU64,
    consumed: AtomicU64,
    dropped: AtomicU64,
    busy_ns: AtomicU64,
    queued_batches: AtomicU64,
    /// Extra time per packet, nanoseconds, drawn between the two (a `slow` control action:
    /// a straggler on purpose). 0: none.
    slow_min_ns: AtomicU64,
    slow_max_ns: AtomicU64,
    /// Drops by reason; touched only by batches that dropped something.
    reasons: Mutex<BTreeMap<&'static str, u64>>,
    /// The state backend's counters (requests, round trips, cache hits, ...) as last published.
    state: Mutex<Vec<(&'static str, u64)>>,
}

/// Why a run started without `--fault-tolerance` takes no root crash.
pub(crate) const NO_ROOT_LOG: &str = "the run keeps no root log and clock to recover: start it with --fault-tolerance";

/// The live statistics of one run. Create it from the plan before the run starts.
#[derive(Debug)]
pub struct Live {
    started: Instant,
    chain: String,
    vertices: Vec<(String, String)>,
    instances: Vec<InstanceLive>,
    packets_in: AtomicU64,
    packets_out: AtomicU64,
    root_dropped: AtomicU64,
    in_flight: AtomicU64,
    /// The root's packet log, once the run keeps one (`RunConfig::fault_tolerance`).
    root_log: Mutex<Option<FaultToleranceReport>>,
    /// Crashes asked for ([`Live::request_crash`]) the root has not taken yet: (vertex, index).
    crashes: Asks<(usize, u16)>,
    /// Why this run cannot crash instances; `None` once it says it can.
    no_failover: Mutex<Option<String>>,
    /// A root crash asked for ([`Live::request_root_crash`]) the root has not taken yet.
    root_crashes: Asks<()>,
    /// Why the root of this run cannot fail here (it keeps no log and clock to recover, or it
    /// runs on another node); `None` once it says it can.
    no_root_crash: Mutex<Option<String>>,
    /// A store crash asked for ([`Live::request_store_crash`]) the root has not taken yet.
    store_crashes: Asks<()>,
    /// Why this run cannot lose its store; `None` once it says it can.
    no_store_crash: Mutex<Option<String>>,
    /// Scaling and moves asked for ([`Live::request_change`]) the root has not taken yet:
    /// (vertex, change; a move names instances by index).
    changes: Asks<(usize, Change)>,
    /// Why this run cannot scale or move flows; `None` once it says it can.
    no_scaling: Mutex<Option<String>>,
    /// Per vertex, why this run cannot change it though it scales others (a chain spread
    /// over nodes); empty: none is held.
    fixed: Mutex<Vec<Option<String>>>,
}

/// What one batch of an instance did.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BatchCounts {
    pub packets_in: u64,
    pub forwarded: u64,
    pub consumed: u64,
    pub dropped: u64,
    pub busy_ns: u64,
}

impl Live {
    /// Live statistics for a run of `plan` (its vertices and instances, by global index).
    pub fn new(plan: &Plan) -> Live {
        Live {
            started: Instant::now(),
            chain: plan.name.clone(),
            vertices: plan.vertices.iter().map(|v| (v.name.to_string(), v.kind.clone())).collect(),
            instances: plan
                .slots()
                .into_iter()
                .enumerate()
                .map(|(g, (vertex, index))| {
                    let status = AtomicU8::new(if g < plan.instances.len() { SERVING } else { SPARE });
                    InstanceLive { vertex, index, status, ..InstanceLive::default() }
                })
                .collect(),
            packets_in: AtomicU64::new(0),
            packets_out: AtomicU64::new(0),
            root_dropped: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            root_log: Mutex::new(None),
            crashes: Asks::default(),
            no_failover: Mutex::new(Some("the run has not started".into())),
            root_crashes: Asks::default(),
            no_root_crash: Mutex::new(Some("the run has not started".into())),
            store_crashes: Asks::default(),
            no_store_crash: Mutex::new(Some("the run has not started".into())),
            changes: Asks::default(),
            no_scaling: Mutex::new(Some("the run has not started".into())),
            fixed: Mutex::new(Vec::new()),
        }
    }

    /// Crashes instance `index` of `vertex` (it is replaced and the root replays to it), as a
    /// `crash` fault does; returns once the run has asked the instance to fail (or refused).
    pub fn request_crash(&self, vertex: &str, index: u16) -> Result<Done, LiveError> {
        let v =
            self.vertices.iter().position(|(n, _)| n == vertex).ok_or_else(|| LiveError::NoVertex(vertex.into()))?;
        if !self.known(v, index) {
            return Err(LiveError::NoInstance { vertex: vertex.into(), index });
        }
        if self.elsewhere(v, index) {
            return Err(LiveError::Refused(format!(
                "{vertex}/{index} runs on another node: ask that node's endpoint (or the controller, `sluice ctl crash {vertex}:{index}`)"
            )));
        }
        if let Some(why) = self.no_failover.lock().ok().and_then(|w| w.clone()) {
            return Err(LiveError::Refused(why));
        }
        self.crashes.ask((v, index))
    }

    /// Crashes root `root` (a threaded run has one, root 0): a new root takes over, as a
    /// `crash_root` fault does; returns once the root has failed (or the run refused).
    pub fn request_root_crash(&self, root: u8) -> Result<Done, LiveError> {
        if root != 0 {
            return Err(LiveError::NoRoot(root));
        }
        let why_not = self.no_root_crash.lock().map(|w| w.clone()).unwrap_or_else(|_| Some("unknown".into()));
        if let Some(why) = why_not {
            return Err(LiveError::Refused(why));
        }
        self.root_crashes.ask(())
    }

    /// Makes the state store fail: it loses everything and is rebuilt from its last checkpoint
    /// and the instances' write-ahead logs while the chain holds still, as a `crash_store`
    /// fault does; returns once the run has taken the crash (or refused).
    pub fn request_store_crash(&self) -> Result<Done, LiveError> {
        let why_not = self.no_store_crash.lock().map(|w| w.clone()).unwrap_or_else(|_| Some("unknown".into()));
        if let Some(why) = why_not {
            return Err(LiveError::Refused(why));
        }
        self.store_crashes.ask(())
    }

    /// Scales a vertex, moves flows between two of its instances or clones one (instances named
    /// by index), as a `scale`, `move` or `clone` fault does; the root applies it from the next
    /// packet it admits, and this returns then with what it did (or why it could not).
    pub fn request_change(&self, vertex: &str, change: Change) -> Result<Done, LiveError> {
        let v =
            self.vertices.iter().position(|(n, _)| n == vertex).ok_or_else(|| LiveError::NoVertex(vertex.into()))?;
        match change {
            Change::ScaleTo(0) => return Err(LiveError::BadChange("a vertex keeps at least one instance".into())),
            Change::Move { from, to, .. } => {
                for i in [from, to] {
                    if !self.known(v, i) {
                        return Err(LiveError::NoInstance { vertex: vertex.into(), index: i });
                    }
                }
                if from == to {
                    return Err(LiveError::BadChange(format!("a move needs two instances, not {from} twice")));
                }
            }
            Change::Clone { instance } if !self.known(v, instance) => {
                return Err(LiveError::NoInstance { vertex: vertex.into(), index: instance });
            }
            _ => {}
        }
        if let Some(why) = self.no_scaling.lock().ok().and_then(|w| w.clone()) {
            return Err(LiveError::Refused(why));
        }
        if let Some(why) = self.fixed.lock().ok().and_then(|f| f.get(v).cloned().flatten()) {
            return Err(LiveError::Refused(why));
        }
        self.changes.ask((v, change))
    }

    /// The run's input has ended: the root takes no more changes or crashes, so those asked
    /// from now on are refused rather than accepted and never carried out.
    pub(crate) fn input_ended(&self) {
        let why = "the run's input has ended: it takes no more changes";
        for m in [&self.no_failover, &self.no_root_crash, &self.no_store_crash, &self.no_scaling] {
            if let Ok(mut w) = m.lock() {
                *w = Some(why.into());
            }
        }
        // Asked before and not taken: refused now, not left unanswered.
        self.crashes.close(why);
        self.root_crashes.close(why);
        self.store_crashes.close(why);
        self.changes.close(why);
    }

    /// The run says whether it can scale and move flows (`None`) or why not.
    pub(crate) fn set_scaling(&self, why_not: Option<String>) {
        if let Ok(mut w) = self.no_scaling.lock() {
            *w = why_not;
        }
    }

    /// The run scales, and says per vertex why it cannot change it (`None`: it can).
    pub(crate) fn set_fixed(&self, why: Vec<Option<String>>) {
        self.set_scaling(None);
        if let Ok(mut f) = self.fixed.lock() {
            *f = why;
        }
    }

    /// Changes asked for since the last call, each to be answered.
    pub(crate) fn take_changes(&self) -> Vec<((usize, Change), Reply)> {
        self.changes.take()
    }

    /// The instances that serve flows in this process now, as (vertex, index): those it
    /// started with or scaling added, less those retired, failed over elsewhere or running on
    /// another node.
    pub fn serving_here(&self) -> Vec<(&str, u16)> {
        self.instances
            .iter()
            .filter(|i| i.status.load(Ordering::Relaxed) == SERVING)
            .filter_map(|i| Some((self.vertices.get(i.vertex)?.0.as_str(), i.index)))
            .collect()
    }

    /// Whether instance `index` of vertex `v` serves flows now, here or (a chain spread over
    /// nodes) on another node: what a change may name.
    fn known(&self, v: usize, index: u16) -> bool {
        self.has_status(v, index, |s| s == SERVING || s == ELSEWHERE)
    }

    /// Whether instance `index` of vertex `v` has a status `of` accepts.
    fn has_status(&self, v: usize, index: u16, of: impl Fn(u8) -> bool) -> bool {
        self.instances.iter().any(|i| i.vertex == v && i.index == index && of(i.status.load(Ordering::Relaxed)))
    }

    /// Whether instance `index` of vertex `v` serves flows now.
    fn serves(&self, v: usize, index: u16) -> bool {
        self.has_status(v, index, |s| s == SERVING)
    }

    /// Whether instance `index` of vertex `v` runs on another node.
    fn elsewhere(&self, v: usize, index: u16) -> bool {
        self.has_status(v, index, |s| s == ELSEWHERE)
    }

    /// Instance `global` serves flows from now on (`true`: added by scaling out) or no longer
    /// (`false`: retired by scaling in).
    pub(crate) fn set_serving(&self, global: usize, serving: bool) {
        if let Some(i) = self.instances.get(global) {
            i.status.store(if serving { SERVING } else { RETIRED }, Ordering::Relaxed);
        }
    }

    /// Instance `global` runs on another node (`true`), or on this one again (`false`: a
    /// failed node's instance replaced here).
    pub(crate) fn set_elsewhere(&self, global: usize, elsewhere: bool) {
        // Spare slots (not shown) stay spare.
        let (from, to) = if elsewhere { (SERVING, ELSEWHERE) } else { (ELSEWHERE, SERVING) };
        if let Some(i) = self.instances.get(global) {
            let _ = i.status.compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// The run says whether it can crash instances (`None`) or why not.
    pub(crate) fn set_failover(&self, why_not: Option<String>) {
        if let Ok(mut w) = self.no_failover.lock() {
            *w = why_not;
        }
    }

    /// The run says whether its root can fail here (`None`: it keeps the log and the clock,
    /// and runs in this process) or why not.
    pub(crate) fn set_root_crash(&self, why_not: Option<String>) {
        if let Ok(mut w) = self.no_root_crash.lock() {
            *w = why_not;
        }
    }

    /// The run says whether its store can fail (`None`) or why not.
    pub(crate) fn set_store_crash(&self, why_not: Option<String>) {
        if let Ok(mut w) = self.no_store_crash.lock() {
            *w = why_not;
        }
    }

    /// Crashes asked for since the last call: (vertex, index), each to be answered.
    pub(crate) fn take_crashes(&self) -> Vec<((usize, u16), Reply)> {
        self.crashes.take()
    }

    /// Instance `global`'s packets taken in and time spent on them, ns, so far.
    pub(crate) fn work(&self, global: usize) -> (u64, u64) {
        let Some(i) = self.instances.get(global) else { return (0, 0) };
        (i.packets_in.load(Ordering::Relaxed), i.busy_ns.load(Ordering::Relaxed))
    }

    pub(crate) fn batch(&self, global: usize, c: BatchCounts, reasons: &[(&'static str, u64)], queued: usize) {
        let Some(i) = self.instances.get(global) else { return };
        i.packets_in.fetch_add(c.packets_in, Ordering::Relaxed);
        i.forwarded.fetch_add(c.forwarded, Ordering::Relaxed);
        i.consumed.fetch_add(c.consumed, Ordering::Relaxed);
        i.dropped.fetch_add(c.dropped, Ordering::Relaxed);
        i.busy_ns.fetch_add(c.busy_ns, Ordering::Relaxed);
        i.queued_batches.store(queued as u64, Ordering::Relaxed);
        if !reasons.is_empty() {
            if let Ok(mut m) = i.reasons.lock() {
                for (r, n) in reasons {
                    *m.entry(*r).or_default() += n;
                }
            }
        }
    }

    /// Makes instance `index` of `vertex` slower by `min_us`..=`max_us` per packet (both 0:
    /// back to normal), as a `slow` fault does.
    pub fn set_slow(&self, vertex: &str, index: u16, min_us: u64, max_us: u64) -> Result<(), LiveError> {
        if min_us > max_us {
            return Err(LiveError::BadDelay { min_us, max_us });
        }
        let v =
            self.vertices.iter().position(|(n, _)| n == vertex).ok_or_else(|| LiveError::NoVertex(vertex.into()))?;
        let global = self.instances.iter().position(|i| i.vertex == v && i.index == index);
        if self.elsewhere(v, index) {
            return Err(LiveError::Refused(format!(
                "{vertex}/{index} runs on another node: ask the control endpoint of its node"
            )));
        }
        let Some(global) = global.filter(|_| self.serves(v, index)) else {
            return Err(LiveError::NoInstance { vertex: vertex.into(), index });
        };
        self.set_slow_of(global, (min_us, max_us));
        Ok(())
    }

    /// [`Live::set_slow`] by global index, for a run's own `slow` faults.
    pub(crate) fn set_slow_of(&self, global: usize, (min_us, max_us): (u64, u64)) {
        let Some(i) = self.instances.get(global) else { return };
        i.slow_max_ns.store(0, Ordering::Relaxed);
        i.slow_min_ns.store(min_us.min(max_us).saturating_mul(1000), Ordering::Relaxed);
        i.slow_max_ns.store(max_us.saturating_mul(1000), Ordering::Relaxed);
    }

    /// The extra time per packet of instance `global`, if it is slowed: (min, max) ns.
    pub(crate) fn slow(&self, global: usize) -> Option<(u64, u64)> {
        let i = self.instances.get(global)?;
        let max = i.slow_max_ns.load(Ordering::Relaxed);
        (max > 0).then(|| (i.slow_min_ns.load(Ordering::Relaxed).min(max), max))
    }

    /// The state backend's counters of instance `global` now (they only grow).
    pub(crate) fn state_counters(&self, global: usize, counters: &[(&'static str, u64)]) {
        if let Some(mut m) = self.instances.get(global).and_then(|i| i.state.lock().ok()) {
            m.clear();
            m.extend_from_slice(counters);
        }
    }

    pub(crate) fn root(&self, read: u64, dropped: u64, in_flight: usize) {
        self.packets_in.fetch_add(read, Ordering::Relaxed);
        self.root_dropped.fetch_add(dropped, Ordering::Relaxed);
        self.in_flight.store(in_flight as u64, Ordering::Relaxed);
    }

    /// The root's log as it stands (published once per input batch).
    pub(crate) fn root_log(&self, now: FaultToleranceReport) {
        if let Ok(mut l) = self.root_log.lock() {
            *l = Some(now);
        }
    }

    pub(crate) fn output(&self, n: u64, in_flight: usize) {
        self.packets_out.fetch_add(n, Ordering::Relaxed);
        self.in_flight.store(in_flight as u64, Ordering::Relaxed);
    }

    /// The statistics now.
    pub fn snapshot(&self) -> LiveSnapshot {
        let mut vertices: Vec<LiveVertex> = self
            .vertices
            .iter()
            .map(|(name, kind)| LiveVertex { name: name.clone(), kind: kind.clone(), instances: Vec::new() })
            .collect();
        for i in &self.instances {
            let status = i.status.load(Ordering::Relaxed);
            let Some(v) = vertices.get_mut(i.vertex).filter(|_| status != SPARE) else { continue };
            v.instances.push(LiveInstance {
                index: i.index,
                retired: status == RETIRED,
                elsewhere: status == ELSEWHERE,
                packets_in: i.packets_in.load(Ordering::Relaxed),
                forwarded: i.forwarded.load(Ordering::Relaxed),
                consumed: i.consumed.load(Ordering::Relaxed),
                dropped: i.dropped.load(Ordering::Relaxed),
                dropped_by_reason: i
                    .reasons
                    .lock()
                    .map(|m| m.iter().map(|(k, v)| (k.to_string(), *v)).collect())
                    .unwrap_or_default(),
                busy_s: i.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
                queued_batches: i.queued_batches.load(Ordering::Relaxed),
                slow_us: {
                    let max = i.slow_max_ns.load(Ordering::Relaxed);
                    (max > 0).then(|| (i.slow_min_ns.load(Ordering::Relaxed) / 1000, max / 1000))
                },
                state: i.state.lock().map(|m| m.iter().map(|(k, v)| (k.to_string(), *v)).collect()).unwrap_or_default(),
            });
        }
        LiveSnapshot {
            chain: self.chain.clone(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            packets_in: self.packets_in.load(Ordering::Relaxed),
            packets_out: self.packets_out.load(Ordering::Relaxed),
            root_dropped: self.root_dropped.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            root_log: self.root_log.lock().ok().and_then(|l| l.clone()),
            vertices,
        }
    }
}

/// The statistics of a running chain at one moment.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LiveSnapshot {
    /// The chain's name.
    pub chain: String,
    /// Seconds since the run started.
    pub uptime_s: f64,
    /// Packets the root read.
    pub packets_in: u64,
    /// Packets that left the chain.
    pub packets_out: u64,
    /// Packets the root dropped (malformed, truncated, window full, no route).
    pub root_dropped: u64,
    /// Packets in the chain now.
    pub in_flight: u64,
    /// The root's packet log (`left_in_log`: entries now), if the run keeps one.
    pub root_log: Option<FaultToleranceReport>,
    /// Per vertex.
    pub vertices: Vec<LiveVertex>,
}

/// One vertex.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LiveVertex {
    /// Its name in the chain.
    pub name: String,
    /// Its NF type.
    pub kind: String,
    /// Its instances.
    pub instances: Vec<LiveInstance>,
}

/// One instance.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LiveInstance {
    /// Its index in the vertex.
    pub index: u16,
    /// Removed by scaling in: it serves no flows any more.
    pub retired: bool,
    /// A chain spread over nodes: it runs on another node, whose endpoint has its figures
    /// (here they stay zero).
    pub elsewhere: bool,
    /// Packets it took in.
    pub packets_in: u64,
    /// Packets it passed on.
    pub forwarded: u64,
    /// Packets it consumed (off-path).
    pub consumed: u64,
    /// Packets it dropped.
    pub dropped: u64,
    /// Drops by reason.
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// Seconds spent processing.
    pub busy_s: f64,
    /// Batches waiting in its queue (as of its last batch).
    pub queued_batches: u64,
    /// Extra time per packet it was given (`slow`), µs: (min, max).
    pub slow_us: Option<(u64, u64)>,
    /// How its state backend served it: requests, round trips to the store, cache hits, ...
    /// (empty with local state).
    pub state: BTreeMap<String, u64>,
}

/// Root and store crashes asked through a control endpoint, held by the root until carried
/// out, then answered.
#[derive(Debug, Default)]
pub(crate) struct HeldCrashes {
    root: Vec<Reply>,
    store: Vec<Reply>,
}

impl HeldCrashes {
    /// Takes what `live` was asked since the last look: whether a root crash and whether a
    /// store crash were asked.
    pub(crate) fn take(&mut self, live: Option<&Live>) -> (bool, bool) {
        let Some(live) = live else { return (false, false) };
        let (root, store) = (live.root_crashes.take(), live.store_crashes.take());
        let asked = (!root.is_empty(), !store.is_empty());
        self.root.extend(root.into_iter().map(|((), r)| r));
        self.store.extend(store.into_iter().map(|((), r)| r));
        asked
    }

    /// The root failed at packet `at`.
    pub(crate) fn root_done(&mut self, at: u64) {
        for r in self.root.drain(..) {
            r.done(Done { at_packet: Some(at), change: None });
        }
    }

    /// The store failed (asked at packet `at`) and was rebuilt.
    pub(crate) fn store_done(&mut self, at: u64) {
        for r in self.store.drain(..) {
            r.done(Done { at_packet: Some(at), change: None });
        }
    }
}

/// Why a control action on a running chain was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveError {
    /// No vertex of that name.
    #[error("no vertex `{0}`")]
    NoVertex(String),
    /// The vertex has no such instance.
    #[error("vertex `{vertex}` has no instance {index}")]
    NoInstance {
        /// The vertex.
        vertex: String,
        /// The instance asked for.
        index: u16,
    },
    /// The run cannot do that (why).
    #[error("{0}")]
    Refused(String),
    /// No root with that number.
    #[error("no root {0}: a threaded run has one root, root 0")]
    NoRoot(u8),
    /// A change that cannot be made (why).
    #[error("{0}")]
    BadChange(String),
    /// The run did not take the request in this many seconds; it was withdrawn, nothing done.
    #[error("the run did not take it in {0} s (busy or stalled); withdrawn, nothing was done")]
    NotTaken(u64),
    /// A delay range upside down.
    #[error("delay {min_us}-{max_us} µs: the first must not exceed the second")]
    BadDelay {
        /// Least delay.
        min_us: u64,
        /// Most delay.
        max_us: u64,
    },
}
