//! A store crash in a threaded run (`Planned::CrashStore`, CHC R6): the state store loses
//! everything and is rebuilt while the chain holds still.
//!
//! The root asks every worker to pause at the top of its loop (between batches: no NF is in
//! the middle of a packet, every blocking call has its answer). Each worker hands over, per
//! instance, what the rebuild needs — its write-ahead log and reads since the checkpoint, its
//! copies of per-flow state, its armed timers, its NF's custom operations and declarations —
//! and waits. The root wipes the store, plans the rebuild with the core
//! ([`sluice_chc::recovery::rebuild_plan`]: the last checkpoint, the logs' updates past it,
//! the instances' per-flow copies), applies it, marks the updates still in flight so that
//! their retransmissions are recognised, and lets the workers go on: each reconnects its
//! instances, which send their unacknowledged requests again.
//!
//! With several roots, the other roots hold still first (between two of their batches), say
//! which clocks they still log — the rebuild asks of every root's log — and reconnect once the
//! store is rebuilt ([`root_holds_if_asked`]).
//!
//! Each log knows where the checkpoint cut it because, in a run that may lose its store,
//! checkpoints are taken in the same kind of hold: the instances flush, the store is read,
//! and each instance notes it ([`Checkpoints`]).

use super::roots::RootState;
use super::worker::Slot;
use super::{RunError, Shared};
use sluice_chc::recovery::{entry_times, plan_store_rebuild};
use sluice_packet::Clock;
use sluice_state::{CustomOp, StateDecl};
use sluice_store::recovery::ForRebuild;
use sluice_store::{Backend, Checkpoint};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What one instance hands over for the rebuild.
struct Handed {
    given: ForRebuild,
    vertex: u16,
    ops: Vec<CustomOp>,
    decls: Vec<StateDecl>,
}

/// Why the root holds the chain still.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// A checkpoint: every instance flushes first, so that the checkpoint and each instance's
    /// write-ahead log agree on what it holds (the engine does the same).
    Checkpoint = 1,
    /// A store crash: every instance hands over what the rebuild needs.
    Crash = 2,
}

/// What the root and the workers share for store crashes.
pub(super) struct StoreCrash {
    backend: Arc<dyn Backend>,
    /// The hold asked for (a count: 0 none yet), and why.
    asked: AtomicU64,
    why: AtomicU8,
    /// Workers holding still for it.
    paused: AtomicUsize,
    /// The root's part is done (the count of the hold it finished).
    done: AtomicU64,
    /// The rebuild failed: workers go on without reconnecting (the run ends with the error).
    failed: AtomicBool,
    /// Grows as the workers' instances get through packets (at the end of each batch, and
    /// every [`PROGRESS_EVERY`] packets within one): the root waits for a hold as long as it
    /// does (a worker getting through a straggler's batches, or through a replacement's
    /// replay taken in as one batch, is busy, not stuck).
    progress: AtomicU64,
    handed: Mutex<Vec<Handed>>,
    /// An instance's write-ahead log is half full of updates since the checkpoint: the next
    /// checkpoint should not wait (a rebuild past the log's capacity would miss updates).
    pub(super) wal_filling: AtomicBool,
    /// With several roots: the roots other than 0 hold still through a rebuild.
    roots: RootsHold,
}

/// The roots other than 0 through a store crash: each holds still between two of its batches,
/// says which clocks it still logs (the rebuild asks), and once the store is rebuilt reconnects
/// to it (and, with its log in the store, writes back what the checkpoint lacked).
#[derive(Default)]
struct RootsHold {
    /// The hold asked for (a count: 0 none yet).
    asked: AtomicU64,
    /// Roots holding still for it.
    paused: AtomicUsize,
    /// The rebuild is over (the count of the hold it finished).
    done: AtomicU64,
    /// The clocks the holding roots still log.
    logged: Mutex<BTreeSet<Clock>>,
}

impl StoreCrash {
    pub(super) fn new(backend: Arc<dyn Backend>) -> StoreCrash {
        StoreCrash {
            backend,
            asked: AtomicU64::new(0),
            why: AtomicU8::new(0),
            paused: AtomicUsize::new(0),
            done: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            progress: AtomicU64::new(0),
            handed: Mutex::new(Vec::new()),
            wal_filling: AtomicBool::new(false),
            roots: RootsHold::default(),
        }
    }
}

/// On root `state.id`'s thread (not 0), between two batches: if the calling thread asked the
/// roots to hold still for a store crash this root has not taken part in (`seen`: the last
/// one), says which clocks it logs, waits for the rebuild, and reconnects.
pub(super) fn root_holds_if_asked(shared: &Shared, state: &mut RootState, seen: &mut u64) -> Result<(), RunError> {
    let Some(sc) = &shared.store_crash else { return Ok(()) };
    let asked = sc.roots.asked.load(Ordering::Acquire);
    if asked == *seen {
        return Ok(());
    }
    *seen = asked;
    if let Some(log) = &state.log {
        let mut logged = sc.roots.logged.lock().unwrap_or_else(PoisonError::into_inner);
        logged.extend(log.logged_clocks());
    }
    sc.roots.paused.fetch_add(1, Ordering::AcqRel);
    while sc.roots.done.load(Ordering::Acquire) < asked && !shared.aborted.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_micros(20));
    }
    if sc.failed.load(Ordering::Acquire) || shared.aborted.load(Ordering::Acquire) {
        return Ok(());
    }
    state.reconnect(&sc.backend)?;
    if let Some(log) = state.log.as_mut() {
        log.store_rebuilt().map_err(|e| RunError::Worker(format!("root {}: {e}", state.id)))?;
    }
    Ok(())
}

/// The calling thread has the other roots hold still (`roots` in all); the clocks they log.
fn hold_roots(shared: &Shared, sc: &StoreCrash, roots: u8) -> Result<BTreeSet<Clock>, String> {
    let started = Instant::now();
    sc.roots.paused.store(0, Ordering::Release);
    sc.roots.logged.lock().unwrap_or_else(PoisonError::into_inner).clear();
    let count = sc.roots.asked.fetch_add(1, Ordering::AcqRel) + 1;
    while sc.roots.paused.load(Ordering::Acquire) < usize::from(roots) - 1 {
        if started.elapsed() >= PAUSE_LIMIT || shared.aborted.load(Ordering::Acquire) {
            sc.roots.done.store(count, Ordering::Release);
            return Err(format!("the other roots did not hold still within {PAUSE_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    Ok(std::mem::take(&mut *sc.roots.logged.lock().unwrap_or_else(PoisonError::into_inner)))
}

/// Whether the root has asked the workers to hold still and is waiting for them: a worker
/// that sees it stops taking batches and goes to the top of its loop, where it holds.
pub(super) fn hold_pending(shared: &Shared) -> bool {
    shared.store_crash.as_ref().is_some_and(|sc| sc.asked.load(Ordering::Acquire) != sc.done.load(Ordering::Acquire))
}

/// A worker got on: finished a batch, or another [`PROGRESS_EVERY`] packets of one (see
/// [`StoreCrash::progress`]).
pub(super) fn progressed(shared: &Shared) {
    if let Some(sc) = &shared.store_crash {
        sc.progress.fetch_add(1, Ordering::Relaxed);
    }
}

/// Packets an instance processes between two signs of progress within a batch.
pub(super) const PROGRESS_EVERY: u64 = 32;

fn client(slot: &mut Slot) -> Option<&mut sluice_store::StoreClient> {
    crate::plan::store_client(&mut slot.inst)
}

/// At the top of a worker's loop: if the root asked for a hold this worker has not taken part
/// in (`seen`: the last one), does its part before and after the root's. For a checkpoint, its
/// instances flush, and note the checkpoint once taken; for a crash, they hand over what the
/// rebuild needs and reconnect to the rebuilt store.
pub(super) fn hold_if_asked(shared: &Shared, slots: &mut [Slot], seen: &mut u64) {
    let Some(sc) = &shared.store_crash else { return };
    let asked = sc.asked.load(Ordering::Acquire);
    if asked == *seen {
        if slots.iter_mut().any(|s| client(s).is_some_and(|c| !c.wal_has_room())) {
            sc.wal_filling.store(true, Ordering::Release);
        }
        return;
    }
    *seen = asked;
    let crash = sc.why.load(Ordering::Acquire) == Hold::Crash as u8;
    if crash {
        hand_over(sc, slots);
    } else {
        for slot in slots.iter_mut() {
            if let Err(e) = slot.inst.state().flush() {
                slot.errors.push(format!("flushing for a checkpoint: {e}"));
            }
        }
    }
    sc.paused.fetch_add(1, Ordering::AcqRel);
    while sc.done.load(Ordering::Acquire) < asked && !shared.aborted.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_micros(20));
    }
    if sc.failed.load(Ordering::Acquire) {
        return;
    }
    for slot in slots.iter_mut() {
        let id = slot.inst.id();
        let Some(c) = client(slot) else { continue };
        if !crash {
            c.checkpointed();
            continue;
        }
        let reconnected = sc
            .backend
            .connect_at(id, c.epoch())
            .map_err(|e| e.to_string())
            .and_then(|conn| c.reconnect(conn).map_err(|e| e.to_string()));
        if let Err(e) = reconnected {
            slot.errors.push(format!("reconnecting to the rebuilt store: {e}"));
        }
    }
}

/// A worker's instances hand over what a rebuild needs.
fn hand_over(sc: &StoreCrash, slots: &mut [Slot]) {
    let mut handed = Vec::with_capacity(slots.len());
    for slot in slots.iter_mut() {
        let vertex = slot.inst.id().vertex();
        let ops = slot.inst.nf().custom_ops().to_vec();
        let decls = slot.inst.nf().state_objects().to_vec();
        let Some(c) = client(slot) else { continue };
        let (given, stopped) = c.hand_over_for_rebuild();
        handed.push(Handed { given, vertex, ops, decls });
        if let Err(e) = stopped {
            slot.errors.push(format!("stopping the store connection for the rebuild: {e}"));
        }
    }
    if let Ok(mut h) = sc.handed.lock() {
        h.extend(handed);
    }
}

/// The root's side of a hold: asks the `workers` to hold still, waits until they all do, and
/// runs `part` meanwhile. An error if `part` fails, or if they do not hold still and none
/// gets on with its packets for [`PAUSE_LIMIT`] (a worker that is stuck, not one that is busy).
fn hold<T>(
    shared: &Shared,
    workers: usize,
    why: Hold,
    part: impl FnOnce(&StoreCrash) -> Result<T, String>,
) -> Result<T, String> {
    let Some(sc) = &shared.store_crash else { return Err("the run has no store to crash".into()) };
    let count = sc.asked.load(Ordering::Acquire) + 1;
    sc.paused.store(0, Ordering::Release);
    sc.why.store(why as u8, Ordering::Release);
    sc.asked.store(count, Ordering::Release);
    let mut progress = (sc.progress.load(Ordering::Relaxed), Instant::now());
    while sc.paused.load(Ordering::Acquire) < workers {
        let now = sc.progress.load(Ordering::Relaxed);
        if now != progress.0 {
            progress = (now, Instant::now());
        }
        let aborted = shared.aborted.load(Ordering::Acquire);
        if progress.1.elapsed() >= PAUSE_LIMIT || aborted {
            sc.failed.store(true, Ordering::Release);
            sc.done.store(count, Ordering::Release);
            return Err(match aborted {
                // Whatever stopped the run says why; this only says what it interrupted.
                true => "the run was stopped while the chain was to hold still".into(),
                false => format!("the workers did not hold still, and processed no packet for {PAUSE_LIMIT:?}"),
            });
        }
        std::thread::sleep(Duration::from_micros(20));
    }
    let result = part(sc);
    sc.failed.store(result.is_err(), Ordering::Release);
    sc.done.store(count, Ordering::Release);
    result
}

/// A checkpoint of the store consistent with every instance's write-ahead log: the workers
/// hold still and flush, the store is read, and the instances note it.
pub(super) fn checkpoint(shared: &Shared, workers: usize) -> Result<Checkpoint, String> {
    hold(shared, workers, Hold::Checkpoint, |sc| {
        sc.wal_filling.store(false, Ordering::Release);
        sc.backend.checkpoint().map_err(|e| e.to_string())
    })
}

/// Whether a checkpoint should be taken now, before its time: an instance's log is filling.
pub(super) fn checkpoint_due(shared: &Shared) -> bool {
    shared.store_crash.as_ref().is_some_and(|sc| sc.wal_filling.load(Ordering::Acquire))
}

/// Counts a checkpoint taken (values, instances in its TS vector, seconds) in `report`.
fn counted(report: &mut crate::report::RunReport, (values, ts, took_s): (u64, u64, f64)) {
    let c = &mut report.checkpoints;
    c.taken += 1;
    c.last_values = values;
    c.last_ts = ts;
    c.total_s += took_s;
}

/// A periodic checkpoint failed: the run goes on and tries again an interval later (a store
/// that is failing over, a Redis primary whose replica is taking over, answers again soon).
fn not_taken(report: &mut crate::report::RunReport, error: &str) {
    report.checkpoints.failed += 1;
    tracing::warn!(error, "a periodic checkpoint of the state store failed; trying again an interval later");
}

/// The root's checkpoints and store crashes.
pub(super) struct Checkpoints {
    every: Option<Duration>,
    last: Instant,
    /// The store's last checkpoint, which a rebuild starts from.
    last_taken: Checkpoint,
    /// Failed instances (their logs lost) the root had taken in at the last look.
    logs_lost_seen: u64,
    /// A store crash is planned from now on.
    pub(super) crash_due: bool,
    /// How long the last checkpoint that held the chain still took.
    held: Duration,
}

/// Periodic checkpoints take at most about one part in this many of a run's time. On Redis a
/// checkpoint of a few thousand values takes longer than `--checkpoint-ms` (and its dump
/// script blocks the server meanwhile); measured from its start, the next one was due at once,
/// so a run that may lose its store held the chain still nearly all the time (40 s for 1,500
/// packets) and others kept Redis busy dumping. A write-ahead log filling up or an instance's
/// log lost still calls for a checkpoint at once.
const HELD_AT_MOST_ONE_IN: u32 = 10;

impl Checkpoints {
    /// Checkpoints every `every` (none: only those a rebuild needs, [`Checkpoints::turn`]), the
    /// last so far `first`.
    pub(super) fn new(every: Option<Duration>, first: Checkpoint) -> Checkpoints {
        let (last, last_taken) = (Instant::now(), first);
        Checkpoints { every, last, last_taken, logs_lost_seen: 0, crash_due: false, held: Duration::ZERO }
    }

    /// Takes a checkpoint of the store if one is due, then makes the store fail if that is due:
    /// what the rebuild did, if it did. `workers` hold still for either; `is_logged` is the
    /// root's log. A run that cannot lose its store takes none.
    pub(super) fn turn(
        &mut self,
        shared: &Shared,
        workers: usize,
        failover: &super::failover::RootSide,
        report: &mut crate::report::RunReport,
        is_logged: &dyn Fn(Clock) -> bool,
    ) -> Result<Option<Rebuilt>, String> {
        // A failed instance's write-ahead log died with it: a checkpoint at once makes a store
        // rebuild independent of it (what it committed is in the store now; what it had not,
        // its clocks still logged, the replay redoes), as the engine does when it fails an
        // instance over.
        let lost = std::mem::replace(&mut self.logs_lost_seen, failover.logs_lost) != failover.logs_lost;
        if shared.store_crash.is_none() {
            // Nobody rebuilds this run's store from a checkpoint: taking one would only copy
            // the store (its per-clock logs included) for nothing.
            return Ok(None);
        }
        // Periodic checkpoints may be off; the two a rebuild cannot do without are not: after a
        // write-ahead log died with its instance, and before one overflows.
        let periodic = self.every.is_some_and(|every| self.last.elapsed() >= self.interval(every));
        if lost || checkpoint_due(shared) || periodic {
            let started = Instant::now();
            // A run that may lose its store takes checkpoints its instances' logs agree
            // with: they hold still and flush.
            match checkpoint(shared, workers) {
                Ok(cp) => {
                    self.held = started.elapsed();
                    counted(report, (cp.values.len() as u64, cp.ts.len() as u64, self.held.as_secs_f64()));
                    self.last_taken = cp;
                }
                // The instances' logs still hold everything since the last one taken.
                Err(e) => not_taken(report, &e),
            }
            // The interval runs from the end of one checkpoint to the start of the next.
            self.last = Instant::now();
        }
        // After the checkpoint a failure just taken in calls for, and not while a crash asked
        // for is still to be taken in: a store failing with an NF instance, before anyone
        // noticed the instance, is beyond CHC's recovery (the instance's log died with it).
        if !self.crash_due || failover.failing() {
            return Ok(None);
        }
        self.crash_due = false;
        crash(shared, workers, &self.last_taken, is_logged).map(Some)
    }

    /// The time from the end of one periodic checkpoint to the start of the next: `every`, or
    /// longer when checkpoints take long (see [`HELD_AT_MOST_ONE_IN`]).
    fn interval(&self, every: Duration) -> Duration {
        every.max(self.held * HELD_AT_MOST_ONE_IN)
    }
}

/// What a store crash did, for a person.
pub(super) struct Rebuilt {
    /// How long the chain held still, ms.
    pub(super) paused_ms: f64,
    /// What the rebuild loaded.
    pub(super) detail: String,
}

/// The root's side: the `workers` hold still and hand over, the store is rebuilt from
/// `checkpoint` and what they handed over (`is_logged`: the root's log, for the updates still
/// in flight), and they go on.
pub(super) fn crash(
    shared: &Shared,
    workers: usize,
    checkpoint: &Checkpoint,
    is_logged: &dyn Fn(Clock) -> bool,
) -> Result<Rebuilt, String> {
    let started = Instant::now();
    let Some(sc) = &shared.store_crash else { return Err("the run has no store to crash".into()) };
    // With several roots the others hold still first (a root's store connections must not
    // reach the store while it is wiped), and the rebuild asks all roots' logs.
    let others = if shared.roots > 1 { hold_roots(shared, sc, shared.roots)? } else { BTreeSet::new() };
    let any_logged = |c: Clock| if c.root() == 0 { is_logged(c) } else { others.contains(&c) };
    let detail = hold(shared, workers, Hold::Crash, |sc| rebuild(sc, checkpoint, &any_logged));
    // The other roots go on (after `hold` has said whether the rebuild failed).
    sc.roots.done.store(sc.roots.asked.load(Ordering::Acquire), Ordering::Release);
    Ok(Rebuilt { paused_ms: started.elapsed().as_secs_f64() * 1e3, detail: detail? })
}

/// How long the root waits for every worker to hold still while none gets on with its packets.
const PAUSE_LIMIT: Duration = Duration::from_secs(10);

fn rebuild(sc: &StoreCrash, checkpoint: &Checkpoint, is_logged: &dyn Fn(Clock) -> bool) -> Result<String, String> {
    let handed = sc.handed.lock().map(|mut h| std::mem::take(&mut *h)).map_err(|e| e.to_string())?;
    let mut logs = Vec::with_capacity(handed.len());
    let mut per_flow = Vec::new();
    let mut timers = Vec::new();
    let mut vertices: BTreeMap<u16, (Vec<CustomOp>, Vec<StateDecl>)> = BTreeMap::new();
    for h in handed {
        logs.push(h.given.log);
        per_flow.extend(h.given.per_flow);
        timers.extend(h.given.timers);
        vertices.entry(h.vertex).or_insert((h.ops, h.decls));
    }
    let last = vertices.keys().next_back().map_or(0, |v| usize::from(*v) + 1);
    let decls: Vec<Vec<StateDecl>> =
        (0..last).map(|v| vertices.get(&(v as u16)).map(|(_, d)| d.clone()).unwrap_or_default()).collect();
    // Across instances, updates are re-executed in the order their packets entered the chain
    // (with several roots, not the clocks' order), which the write-ahead logs' entries carry.
    let entry_time = entry_times(&logs);
    let planned = plan_store_rebuild(checkpoint, &mut logs, per_flow, &decls, &entry_time, is_logged);
    let ops = vertices.iter().map(|(v, (ops, _))| (*v, ops.as_slice()));
    let stats = sluice_store::recovery::rebuild(sc.backend.as_ref(), &planned.plan, &timers, ops, planned.marks)
        .map_err(|e| e.to_string())?;
    Ok(format!("{stats:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_checkpoints_take_at_most_a_tenth_of_the_time() {
        let every = Duration::from_millis(150);
        let mut c = Checkpoints::new(Some(every), Checkpoint::default());
        assert_eq!(c.interval(every), every, "short checkpoints keep the period asked for");
        c.held = Duration::from_millis(10);
        assert_eq!(c.interval(every), every);
        // A checkpoint that took 170 ms (a few thousand values on Redis) leaves 1.7 s before
        // the next one, not none.
        c.held = Duration::from_millis(170);
        assert_eq!(c.interval(every), Duration::from_millis(1_700));
    }
}
