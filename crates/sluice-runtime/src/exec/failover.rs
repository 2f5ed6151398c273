//! Instance failover in a threaded run (`RunConfig::crashes`, with the root's log): CHC's
//! recovery of a failed NF instance, as docs/decisions.md ("Instance failover in threads")
//! plans it.
//!
//! The root thread asks for a crash by raising the instance's flag. The worker that owns the
//! instance, at its next turn, takes everything out of the instance's queue (and what an
//! order-sensitive instance holds), drops the instance — its cached state and the updates it
//! had not sent yet are lost for real — puts a replacement with the same id in its place (the
//! store gives it the predecessor's per-flow state and timers), and tells the root which copies
//! were lost ([`Failure`]). The replacement *recovers*: it holds what arrives, its replay's
//! copies apart from live packets. The root counts the lost copies as lost, replays its log
//! towards the replacement (through the vertices in front of it, `passing.rs`), and only then
//! counts the lost copies out of the in-flight ring, so that no lost clock looks finished to an
//! order-sensitive instance downstream before its replay copy is on its way. The root
//! publishes the earliest copy of the replay still on its way to the replacement
//! ([`Frontier`]); the replacement processes what it holds from before it — the replay and the
//! live packets it held, together in clock order — as it comes (copies of an earlier replay
//! towards a predecessor that failed in turn may arrive among them; a live packet the replay
//! carried too goes after its replay copy, as a duplicate). Once every copy has reached it,
//! the root raises its `drained` epoch and the replacement goes through the rest and serves.
//!
//! With several roots every root hears of the failure, with the lost copies of its own clocks,
//! and replays its own log ([`Replays`]); the replacement recovers once all of those replays
//! have drained (a crash epoch per instance) and goes through them in entry order.
//!
//! Duplicates: with crashes planned, every instance remembers the clocks it processed (a
//! [`ClockSet`], trimmed below the oldest clock still logged, which the root publishes) and
//! drops a second copy of one. A replay copy at its target whose clock a failed predecessor
//! processed is skipped rather than run again against state later packets changed: the worker
//! waited for the store's answers to everything the failed instance sent (`StoreClient::fail`),
//! so every update of a clock it processed is applied, and the root heard of those commits
//! before it heard of the failure.

use super::worker::Slot;
use super::{Outgoing, Shared};
use crate::clocks::ClockTracker;
use crate::filter::CompiledFilter;
use crate::plan::{direction, Rebuilder, Routes, VertexPlan};
use crate::report::FailoverReport;
use sluice_chc::clockset::ClockSet;
use sluice_packet::{Clock, InstanceId, Meta, MetaFlags, Packet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod asking;
mod handover;
mod through;
pub(super) use handover::HandedOver;
use through::{go_through, go_through_reached, Frontier};

/// Sends replay copy `p` into the chain from the root, along the entry's routes but only
/// towards its target (`Outgoing::route`); a copy that goes nowhere is done at once. Whether it
/// was sent.
fn send_replay_copy(
    shared: &Shared,
    (entry, traffic): (&[Routes], Option<&CompiledFilter>),
    log: &mut super::ft::RootLog,
    out: &mut Outgoing,
    p: Packet,
) -> bool {
    let routes = entry.get(direction(&p, entry.len())).filter(|_| traffic.is_none_or(|t| t.matches(&p)));
    shared.in_flight.fetch_add(1, Ordering::AcqRel);
    shared.clocks.copy(p.meta.clock);
    let unsent = match routes {
        Some(routes) => out.route(shared, routes, p),
        // Traffic outside the chain's class never met an NF.
        None => Some(p),
    };
    let Some(p) = unsent else { return true };
    tracing::trace!(target: "sluice::copies", clock = %p.meta.clock, target = ?p.meta.target, "replay copy goes nowhere");
    log.note(&super::ft::Note::Finished(p.meta));
    shared.clocks.done(p.meta.clock);
    shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    shared.pool.recycle(p);
    false
}

/// The longest a replacement waits for what it takes over from the store (on Redis, its
/// predecessor's timers come from a whole checkpoint).
const RECOVERY_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A crash of an NF instance in a threaded run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crash {
    /// Asked once the root has admitted this many packets.
    pub after: u64,
    /// The vertex (its index in the chain).
    pub vertex: usize,
    /// The instance of it: its position among the vertex's instances at that point, as fault
    /// schedules name instances (its index while the vertex has not scaled).
    pub index: u16,
}

/// What a worker tells each root about an instance it crashed.
pub(super) struct Failure {
    global: usize,
    id: InstanceId,
    /// The lost copies of this root's clocks.
    lost: Vec<Meta>,
    /// The lost copies of every root's clocks.
    lost_in_all: usize,
    /// The instance's crash count: its replacement recovers once every root's replay of
    /// this crash (or a later one) drained.
    epoch: u64,
}

/// A replacement waiting for the root's replay.
pub(super) struct Recovery {
    /// The crash it recovers from (see [`Failure::epoch`]).
    epoch: u64,
    /// Its replay's copies, as they arrived; processed in entry order once every earlier copy
    /// of the replay has arrived ([`go_through_reached`]).
    /// Copies of a replay towards a predecessor that failed while they travelled arrive too,
    /// before or among the new replay's: processing in arrival order would let a later clock of
    /// a flow go before an earlier one.
    replay: Vec<Packet>,
    /// Live packets that arrived meanwhile, in arrival order. Some may be earlier than replay
    /// copies of their flow: those whose replay copy ended at an instance in front, where the
    /// packet waited for a change of the allocation (`reconfig::waits`).
    held: Vec<Packet>,
    /// The clocks the failed instance (and those it replaced) processed.
    predecessor: ClockSet,
}

impl Recovery {
    /// For a person: what the replacement holds while its replay drains.
    pub(super) fn describe(&self) -> String {
        let first = self.replay.iter().map(|p| p.meta.clock.seq()).min().map_or("-".into(), |s| s.to_string());
        format!("{} replayed (first {first}), {} live held", self.replay.len(), self.held.len())
    }
}

/// A node that failed: its instances (global indices) whose crashes have not been carried out
/// yet, the copies lost with it, and their clocks (sorted). The last of its instances to crash
/// reports the lost copies (see [`Failover::lost_elsewhere`]).
pub(super) struct LostElsewhere {
    pub(super) globals: Vec<usize>,
    pub(super) lost: Vec<Meta>,
    pub(super) on_node: Arc<LostClocks>,
    /// The clocks the instance processed, when its node could say (one instance crashed
    /// there alone); otherwise they are read from the store ([`processed_elsewhere`]).
    pub(super) processed: Option<ClockSet>,
}

/// The clocks of the copies lost with a failed node, by kind (each sorted).
pub(super) struct LostClocks {
    /// Of the copies on the main path.
    pub(super) main: Vec<Clock>,
    /// Of the mirror copies (`MetaFlags::MIRROR`).
    pub(super) mirror: Vec<Clock>,
}

/// Per vertex: which copies lost with a failed node may concern its instances — be on their
/// way to one, or be its output — (copies on the main path, mirror copies). A mirror copy
/// (`MetaFlags::MIRROR`) is on its way to an off-path vertex, which consumes it: it concerns
/// that vertex and every vertex that leads to it (the replay towards its replacement passes
/// through them), not the rest of the main path; copies on the main path do not concern an
/// off-path vertex. Where a mirror edge leads to a vertex on the main path, every copy concerns
/// every vertex.
pub(super) fn lost_concerns(vertices: &[VertexPlan], entry: &[Routes], reaches: &[Vec<bool>]) -> Vec<(bool, bool)> {
    let mut mirror_fed = vec![false; vertices.len()];
    for r in vertices.iter().flat_map(|v| v.routes.iter().flatten()).chain(entry).flat_map(|r| &r.mirrors) {
        if let crate::plan::Target::Vertex(v) = r.to {
            if let Some(f) = mirror_fed.get_mut(v) {
                *f = true;
            }
        }
    }
    let apart = mirror_fed.iter().zip(vertices).all(|(fed, vp)| !fed || vp.off_path);
    let reach = |a: usize, b: usize| reaches.get(a).and_then(|r| r.get(b)).copied().unwrap_or(true);
    (0..vertices.len())
        .map(|v| {
            let off_path = vertices.get(v).is_some_and(|vp| vp.off_path);
            let near_mirror = (0..vertices.len()).any(|m| mirror_fed[m] && (m == v || reach(v, m) || reach(m, v)));
            (!apart || !off_path, !apart || near_mirror)
        })
        .collect()
}

/// What the root thread and the workers share for failovers.
pub(super) struct Failover {
    /// Per instance (global index): the root asks for a crash.
    crash: Vec<AtomicBool>,
    /// Per instance: how many times it (and its replacements) crashed.
    epochs: Vec<AtomicU64>,
    /// Per instance, per root: the last crash whose replay from that root has drained.
    drained: Vec<Vec<AtomicU64>>,
    /// Per instance, per root: how far the root's replay after a crash has reached the
    /// replacement ([`Frontier`]).
    frontiers: Vec<Vec<Mutex<Frontier>>>,
    /// Per instance: the last crash its replacement has recovered from — it took over what
    /// the store had of its predecessor and went through its replay and what it held.
    served: Vec<AtomicU64>,
    /// Per instance: replay copies roots other than 0 sent (root 0 reports the failover).
    replayed_by_others: Vec<AtomicU64>,
    /// Per root: crashed instances the root has not replayed to yet.
    failures: Vec<Mutex<Vec<Failure>>>,
    /// Per root: the oldest sequence number still logged: no copy of an older clock of the
    /// root can come again.
    oldest_logged: Vec<AtomicU64>,
    rebuilder: Rebuilder,
    /// Instances per vertex.
    instances: Vec<u16>,
    /// Per vertex: which copies lost with a failed node concern it ([`lost_concerns`]).
    concerns: Vec<(bool, bool)>,
    /// Per node that failed: the copies lost with it (the link counted them, without knowing
    /// at which of its instances each was), for the last of its instances to crash.
    lost_elsewhere: Mutex<Vec<LostElsewhere>>,
    /// Per vertex, per clock: copies held by a recovering replacement there (its replay and
    /// what arrived meanwhile). Such copies have gone through every vertex in front; what
    /// waits there for the clock to go by (an order-sensitive instance's entry order, a
    /// change of the allocation) must not wait for the recovery, which may itself wait for
    /// copies of its replay held up there.
    held_in_recovery: Vec<ClockTracker>,
    /// On a node without the root (a chain spread over nodes): a crash is carried out here but
    /// the replacement is the root's node's ([`handover`]).
    hands_over: bool,
    /// The instances crashed here and not yet told the root's node ([`HandedOver`]).
    handed: Mutex<Vec<HandedOver>>,
}

impl Failover {
    /// For `instances` global indices and `per_vertex` instances per vertex, clocks of
    /// `roots` roots in a ring of `span` each; `hands_over` on a node without the root (it
    /// hands its instances' crashes to the root's node).
    pub(super) fn new(
        (instances, per_vertex, concerns): (usize, Vec<u16>, Vec<(bool, bool)>),
        rebuilder: Rebuilder,
        (span, roots, hands_over): (usize, u8, bool),
    ) -> Failover {
        let roots = usize::from(roots.max(1));
        let atomics = |n: usize, v: u64| (0..n).map(|_| AtomicU64::new(v)).collect::<Vec<_>>();
        Failover {
            crash: (0..instances).map(|_| AtomicBool::new(false)).collect(),
            epochs: atomics(instances, 0),
            drained: (0..instances).map(|_| atomics(roots, 0)).collect(),
            frontiers: (0..instances).map(|_| (0..roots).map(|_| Mutex::default()).collect()).collect(),
            served: atomics(instances, 0),
            replayed_by_others: atomics(instances, 0),
            failures: (0..roots).map(|_| Mutex::new(Vec::new())).collect(),
            oldest_logged: atomics(roots, 1),
            rebuilder,
            held_in_recovery: per_vertex.iter().map(|_| ClockTracker::new(span, roots as u8)).collect(),
            lost_elsewhere: Mutex::new(Vec::new()),
            instances: per_vertex,
            concerns,
            hands_over,
            handed: Mutex::new(Vec::new()),
        }
    }

    /// Whether every root's replay towards instance `global` after its crash `epoch` drained.
    fn drained_everywhere(&self, global: usize, epoch: u64) -> bool {
        self.drained.get(global).is_some_and(|d| d.iter().all(|e| e.load(Ordering::Acquire) >= epoch))
    }

    /// A recovering replacement at vertex `v` holds a copy of `clock` (`true`) or no longer
    /// (`false`).
    pub(super) fn held(&self, v: usize, clock: Clock, holds: bool) {
        if let Some(t) = self.held_in_recovery.get(v) {
            if holds {
                t.copy(clock);
            } else {
                t.done(clock);
            }
        }
    }

    /// Whether every copy of `clock` still in flight is held by recovering replacements at
    /// vertices that do not lead to vertex `v` (and so have gone through it).
    pub(super) fn past(&self, shared: &Shared, v: usize, clock: Clock) -> bool {
        let copies = shared.clocks.count(clock);
        let held: u32 = self
            .held_in_recovery
            .iter()
            .enumerate()
            .filter(|(w, _)| !shared.reaches.get(*w).and_then(|r| r.get(v)).copied().unwrap_or(true))
            .map(|(_, t)| t.count(clock))
            .sum();
        copies == held
    }

    /// A node failed: the copies lost with it, for the crashes of its instances. The last of
    /// them to crash reports the copies. Why the last: a lost copy counts in flight until its
    /// crash is reported, and so keeps its clock's log entry; reported with the first crash,
    /// the replay towards that instance could close entries whose copies were lost at another
    /// instance of the node, through which that replay does not pass (a replay copy ends at
    /// another instance of its target's vertex), before the replay towards that one was sent:
    /// their packets were lost for good (two NATs and the LB on one node, found by a test).
    pub(super) fn lost_elsewhere(&self, lost: LostElsewhere) {
        if let Ok(mut l) = self.lost_elsewhere.lock() {
            l.push(lost);
        }
    }

    /// The oldest sequence number root `root` still logs, as last published.
    pub(super) fn oldest_logged(&self, root: u8) -> u64 {
        self.oldest_logged.get(usize::from(root)).map_or(1, |o| o.load(Ordering::Acquire))
    }

    /// Root `root` publishes the oldest sequence number it still logs.
    pub(super) fn set_oldest_logged(&self, root: u8, seq: u64) {
        if let Some(o) = self.oldest_logged.get(usize::from(root)) {
            o.store(seq, Ordering::Release);
        }
    }
}

/// At the start of `slot`'s turn: crashes it if the root asked, ends its recovery if the root
/// says its replay is done. Whether anything happened.
pub(super) fn turn(shared: &Shared, slot: &mut Slot, out: &mut Outgoing) -> bool {
    let Some(fo) = &shared.failover else { return false };
    let mut did = false;
    if fo.crash.get(slot.global).is_some_and(|f| f.swap(false, Ordering::AcqRel)) {
        crash(shared, fo, slot, out);
        did = true;
    }
    // While the replay drains, the replacement takes in what it reads from the store.
    if let Some(reading) = slot.reading.as_mut().filter(|_| slot.recovery.is_some()) {
        match reading.poll(&mut slot.inst) {
            Ok(false) => {}
            Ok(true) => slot.reading = None,
            Err(e) => {
                let (name, index) = (slot.inst.vertex().to_string(), slot.inst.id().index());
                slot.errors.push(format!("{name}:{index} taking over from the store: {e}"));
                slot.reading = None;
            }
        }
    }
    if slot.recovery.as_ref().is_some_and(|r| fo.drained_everywhere(slot.global, r.epoch)) {
        if let Some(r) = slot.recovery.take() {
            // Nothing ran at the replacement yet: what the store had of its predecessor first.
            if let Some(mut reading) = slot.reading.take() {
                if let Err(e) = reading.finish(&mut slot.inst, RECOVERY_READ_LIMIT) {
                    let (name, index) = (slot.inst.vertex().to_string(), slot.inst.id().index());
                    slot.errors.push(format!("{name}:{index} taking over from the store: {e}"));
                }
            }
            let mut due = r.replay;
            due.extend(r.held);
            go_through(shared, fo, slot, (&r.predecessor, due), out);
            if let Some(s) = fo.served.get(slot.global) {
                s.fetch_max(r.epoch, Ordering::AcqRel);
            }
            free_failed(std::mem::take(&mut slot.failed));
        }
        did = true;
    } else if slot.reading.is_none() {
        // Once it has what the store had of its predecessor, the replacement goes through
        // the part of its replay every copy of which has come, as it comes.
        did |= go_through_reached(shared, fo, slot, out);
    }
    if let Some(ended) = super::passing::emulate_due(shared, slot, out) {
        out.flush(shared);
        shared.in_flight.fetch_sub(ended, Ordering::AcqRel);
        did = true;
    }
    for (root, oldest) in fo.oldest_logged.iter().enumerate() {
        let oldest = Clock::new(root as u8, oldest.load(Ordering::Acquire));
        if let Some(seen) = slot.seen.as_mut() {
            seen.remove_below(oldest);
        }
        if let Some(r) = slot.recovery.as_mut() {
            r.predecessor.remove_below(oldest);
        }
        if let Some(p) = slot.passing.as_mut() {
            p.trim_below(oldest, &shared.pool);
        }
    }
    did
}

/// How long after its replacement serves a failed instance is freed: freeing its caches and
/// log takes 1–4 ms of a core, which, on two cores, the packets queued during the recovery
/// waited for (the example chain's first normal latency window came ~0.4 ms later with the
/// instance freed at once; docs/benchmarks.md, "Latency back to normal, measured from where
/// it is").
const FREE_FAILED_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Frees failed instances on a thread of its own (their caches and logs may take
/// milliseconds), once the recovery's queue has had time to drain ([`FREE_FAILED_AFTER`]),
/// or here if no thread can be started.
fn free_failed(failed: Vec<sluice_nf::Instance>) {
    if failed.is_empty() {
        return;
    }
    let freeing = std::thread::Builder::new().name("sluice-free-failed".into()).spawn(move || {
        std::thread::sleep(FREE_FAILED_AFTER);
        drop(failed)
    });
    if let Err(e) = freeing {
        tracing::debug!(error = %e, "freeing failed instances on this thread");
    }
}

/// Crashes `slot`'s instance and puts its replacement in its place.
fn crash(shared: &Shared, fo: &Failover, slot: &mut Slot, out: &mut Outgoing) {
    let (vertex, id) = (slot.vertex, slot.inst.id());
    // Its unsent updates are lost; those it sent the store applies anyway, and the root hears
    // which (before it hears of the failure, so its replay does not redo them).
    let client = crate::plan::store_client(&mut slot.inst);
    if let Some(client) = client {
        if let Err(e) = client.fail(&mut out.commits) {
            slot.errors.push(format!("{}:{} failing: {e}", slot.inst.vertex(), id.index()));
        }
        for (clock, xor) in out.commits.drain(..).collect::<Vec<_>>() {
            out.note(shared, super::ft::Note::Commit(clock, xor));
        }
        out.flush_notes(shared);
        while out.retry(shared) {
            std::thread::yield_now();
        }
    }
    if fo.hands_over {
        // A node without the root: the root's node replaces the instance.
        handover::hand_over(shared, fo, slot, out);
        return;
    }
    let instances = match &shared.scaling {
        Some(sc) => sc.members(vertex) as u16,
        None => fo.instances.get(vertex).copied().unwrap_or(1),
    };
    // Every flow of the vertex is the replacement's when it is the vertex's only instance: it
    // takes their values in one go rather than one store round trip per flow on each flow's
    // next packet (docs/decisions.md, "Instance failover in threads" point 10). That read and
    // its predecessor's timers arrive while the root replays (point 13).
    let values = instances == 1 && shared.scaling.is_none();
    // Its predecessor ran on another node, which may only be paused or cut off and write on:
    // the store refuses it from now on (docs/decisions.md, "Fencing a failed node at the store").
    let elsewhere = fo.lost_elsewhere.lock().is_ok_and(|far| far.iter().any(|l| l.globals.contains(&slot.global)));
    let (replacement, reading) =
        match fo.rebuilder.replacement_reading(vertex, id.index(), instances, values, elsewhere) {
            Ok(r) => r,
            Err(e) => {
                slot.errors.push(format!("building the replacement of {}:{}: {e}", slot.inst.vertex(), id.index()));
                return;
            }
        };
    let (mut lost, mut predecessor) = take_lost(shared, fo, slot);
    // An instance whose node failed: what the predecessor processed is read from the store,
    // and the last of the node's instances to crash reports the copies lost with it.
    let mut on_node = None;
    if let Ok(mut far) = fo.lost_elsewhere.lock() {
        for l in far.iter_mut().filter(|l| l.globals.contains(&slot.global)) {
            l.globals.retain(|g| *g != slot.global);
            if l.globals.is_empty() {
                lost.append(&mut l.lost);
            }
            on_node = Some((l.on_node.clone(), l.processed.take()));
        }
        far.retain(|l| !l.globals.is_empty());
    }
    match on_node {
        Some((_, Some(processed))) => predecessor.union_with(&processed),
        Some((on_node, None)) => processed_elsewhere(fo, slot, &on_node, &mut predecessor),
        None => {}
    }
    let mut failed = std::mem::replace(&mut slot.inst, replacement);
    slot.reading = reading;
    // What it decided before failing is part of the run.
    slot.stats.events.extend(failed.take_events());
    // Freed once the replacement serves: its write-ahead log alone may hold 65,536 entries,
    // which took 1 to 4 ms of a core to free, in the middle of the recovery.
    slot.failed.push(failed);
    let epoch = fo.epochs.get(slot.global).map_or(0, |e| e.fetch_add(1, Ordering::AcqRel) + 1);
    slot.recovery = Some(Recovery { epoch, replay: Vec::new(), held: Vec::new(), predecessor });
    // Every root hears of it, with the lost copies of its own clocks: each replays its log.
    let lost_in_all = lost.len();
    if tracing::enabled!(target: "sluice::copies", tracing::Level::TRACE) {
        let clocks: Vec<String> = lost.iter().map(|m| format!("{}/{}", m.clock, m.flags.bits())).collect();
        tracing::trace!(target: "sluice::copies", instance = ?id, lost = ?clocks, "crashed");
    }
    for (root, failures) in fo.failures.iter().enumerate() {
        let lost = lost.iter().filter(|m| usize::from(m.clock.root()) == root).copied().collect();
        if let Ok(mut f) = failures.lock() {
            f.push(Failure { global: slot.global, id, lost, lost_in_all, epoch });
        }
    }
}

/// Takes what `slot`'s instance held out of its hands, as it fails: every copy in its queue or
/// held by it (lost with it), and the clocks it and those it replaced processed.
fn take_lost(shared: &Shared, fo: &Failover, slot: &mut Slot) -> (Vec<Meta>, ClockSet) {
    let vertex = slot.vertex;
    let mut lost = Vec::new();
    let mut lose = |p: Packet| {
        lost.push(p.meta);
        shared.pool.recycle(p);
    };
    while let Some(mut b) = shared.pop(slot.global) {
        b.drain(..).for_each(&mut lose);
        shared.give_back(b);
    }
    if let Some(o) = slot.order.as_mut() {
        o.take_held().into_iter().for_each(&mut lose);
    }
    // A replacement failing while it recovers: its predecessors' clocks stay processed.
    let mut predecessor = slot.seen.replace(ClockSet::default()).unwrap_or_default();
    if let Some(r) = slot.recovery.take() {
        for p in r.replay.iter().chain(&r.held) {
            fo.held(vertex, p.meta.clock, false);
        }
        r.replay.into_iter().chain(r.held).for_each(&mut lose);
        predecessor.union_with(&r.predecessor);
    }
    if let Some(p) = slot.passing.as_mut() {
        p.take_all_awaiting().for_each(&mut lose);
    }
    if let Some(m) = slot.moving.as_mut() {
        m.waiting.drain(..).map(|(_, p)| p).for_each(&mut lose);
        m.forget_waiting();
    }
    (lost, predecessor)
}

/// The clocks an instance that ran on a failed node processed, as far as its replacement must
/// not process them again: those whose updates of the vertex's state (or, for a packet that
/// updated nothing, its processed mark: `ClientConfig::mark_processed`) the store holds and of
/// which no copy was lost with the node. Its other clocks it processes again (CHC's replay),
/// the store answering updates it had applied from its per-clock log. Why both: a clock whose
/// updates are applied read state those updates changed if run again, and an NF may then take
/// another path (a balancer reopening the connection its first run opened); a clock of which
/// a copy was lost may not have gone past this instance, or its output may have been that copy.
/// A node sends a batch's updates before any packet of the batch leaves it (`Outgoing::hold`),
/// so a copy that left the node had its clock's updates sent (docs/decisions.md, "What a
/// replacement of another node's instance skips").
fn processed_elsewhere(fo: &Failover, slot: &Slot, on_node: &LostClocks, predecessor: &mut ClockSet) {
    let instance = format!("{}:{}", slot.inst.vertex(), slot.inst.id().index());
    // Only the copies that may concern this instance: a copy lost at an off-path instance of
    // the node says nothing about the main path's (found by random placements: a detector's
    // replacement ran again a clock whose mirror copy waited at the Trojan detector, against
    // state later clocks had changed, and dropped a packet the chain had let through).
    let (main, mirror) = fo.concerns.get(slot.vertex).copied().unwrap_or((true, true));
    let lost_here = |c: &Clock| {
        (main && on_node.main.binary_search(c).is_ok()) || (mirror && on_node.mirror.binary_search(c).is_ok())
    };
    match fo.rebuilder.clocks_updated_by(slot.vertex) {
        Ok(clocks) => {
            let updated = clocks.len();
            // The range says how far the predecessor's updates had reached the store: compared
            // with what the node's other instances had processed, it shows a lag of the
            // connection (docs/correctness.md, "Fixed (2026-12-07, thirteenth session)").
            let (first, last) = (clocks.first().map(ToString::to_string), clocks.last().map(ToString::to_string));
            let mut processed = 0usize;
            let mut again = Vec::new();
            for c in clocks {
                if lost_here(&c) {
                    again.push(c);
                } else {
                    processed += usize::from(predecessor.insert(c));
                }
            }
            tracing::trace!(target: "sluice::copies", %instance, again = ?again, "updated by its predecessor, but a copy was lost with the node: processed again");
            tracing::info!(%instance, updated, processed, ?first, ?last, "clocks its predecessor on the failed node processed");
        }
        // Without the list every replay copy is processed again: the output stays right, an
        // NF's decisions may not.
        Err(e) => {
            tracing::warn!(%instance, error = %e, "reading which clocks the failed node processed; its replacement processes every replayed clock again");
        }
    }
}

/// Whether the instance at `slot`, or one it replaced, processed `clock` (known while it
/// recovers and after).
pub(super) fn processed_before(slot: &Slot, clock: Clock) -> bool {
    slot.recovery.as_ref().is_some_and(|r| r.predecessor.contains(clock))
        || slot.seen.as_ref().is_some_and(|s| s.contains(clock))
}

/// What an instance with crashes planned does with a packet before its NF sees it.
pub(super) enum Admit {
    /// Process it.
    Process,
    /// At a recovering replacement: a copy of its replay, or a live packet; held until the
    /// replay is done.
    Hold,
    /// A second copy of a clock processed here, or a replay copy the target skips.
    Duplicate,
}

/// Decides what `slot` does with `pkt` (see [`Admit`]).
pub(super) fn admit(slot: &mut Slot, pkt: &Packet) -> Admit {
    let me = slot.inst.id();
    let target = pkt.meta.replay_target();
    if target.is_some_and(|t| t.vertex() == me.vertex() && t != me) {
        // Another instance's replay: nothing to do here.
        return Admit::Duplicate;
    }
    let at_target = target == Some(me);
    if let Some(r) = &slot.recovery {
        if at_target && r.predecessor.contains(pkt.meta.clock) {
            tracing::trace!(target: "sluice::copies", clock = %pkt.meta.clock, instance = ?me, "replay copy skipped: its predecessor processed the clock");
            return Admit::Duplicate;
        }
        if at_target {
            tracing::trace!(target: "sluice::copies", clock = %pkt.meta.clock, instance = ?me, "replay copy held, to be processed again");
        }
        return Admit::Hold;
    }
    let first = slot.seen.as_mut().is_none_or(|seen| seen.insert(pkt.meta.clock));
    if first {
        Admit::Process
    } else {
        tracing::trace!(target: "sluice::copies", clock = %pkt.meta.clock, instance = ?me, flags = pkt.meta.flags.bits(), "a second copy of a clock processed here");
        Admit::Duplicate
    }
}

/// Holds `pkt` at a recovering replacement. A copy of its replay has reached it: the root
/// hears so (the replay drains as its copies arrive), and downstream the copy will be a packet
/// like any other.
pub(super) fn hold(shared: &Shared, slot: &mut Slot, mut pkt: Packet, out: &mut Outgoing) {
    let (Some(r), Some(fo)) = (slot.recovery.as_mut(), &shared.failover) else { return };
    fo.held(slot.vertex, pkt.meta.clock, true);
    if pkt.meta.replay_target() == Some(slot.inst.id()) {
        pkt.meta.flags.insert(MetaFlags::REACHED);
        out.note(shared, super::ft::Note::Reached(pkt.meta));
        r.replay.push(pkt);
    } else {
        r.held.push(pkt);
    }
}

/// One root's part in every failover: it takes in the failures reported to it, replays its
/// log towards the replacements, and says when each replay has drained. With several roots
/// each root does so for its own clocks; a replacement recovers once all have.
#[derive(Default)]
pub(super) struct Replays {
    /// (global index, replacement, crash epoch) whose replay from this root is on its way.
    recovering: Vec<(usize, InstanceId, u64)>,
}

/// A failure a root took in.
pub(super) struct TakenIn {
    global: usize,
    epoch: u64,
    lost: usize,
    beyond_replay: usize,
    /// Replay copies this root sent towards the replacement.
    replayed: u64,
}

impl Replays {
    /// Root `root` takes in the failures reported to it since the last call, replaying `log`
    /// through `out` along the entry's routes, and publishes the replays that have drained.
    pub(super) fn serve(
        &mut self,
        shared: &Shared,
        root: u8,
        (entry, traffic): (&[Routes], Option<&CompiledFilter>),
        (log, out): (&mut super::ft::RootLog, &mut Outgoing),
    ) -> Vec<TakenIn> {
        let Some(fo) = &shared.failover else { return Vec::new() };
        let mine = fo.failures.get(usize::from(root));
        let failures = mine.and_then(|f| f.lock().ok().map(|mut f| std::mem::take(&mut *f))).unwrap_or_default();
        if !failures.is_empty() {
            // The commits a failed instance's store answers carried were queued before its
            // failure: the log has them before it decides what the replay marks committed.
            super::roots::drain_notes(shared, root, log);
        }
        let mut taken = Vec::with_capacity(failures.len());
        for f in failures {
            // Copies of other instances' replays the failed one was passing on go again.
            let (resend, beyond_replay) = log.instance_failed(f.id, &f.lost);
            if beyond_replay > 0 {
                tracing::warn!(
                    instance = ?f.id,
                    packets = beyond_replay,
                    "packets lost for good: their log entries died with the root (keep the log in the store: --log store)"
                );
            }
            let mut replayed = 0u64;
            for p in log.replay_to(f.id).into_iter().chain(resend) {
                let to_target = p.meta.target == Some(f.id);
                if send_replay_copy(shared, (entry, traffic), log, out, p) && to_target {
                    replayed += 1;
                }
            }
            out.flush(shared);
            // The replay is counted in flight: the lost copies can go.
            for m in &f.lost {
                shared.clocks.done(m.clock);
            }
            shared.in_flight.fetch_sub(f.lost.len(), Ordering::AcqRel);
            if root != 0 {
                if let Some(n) = fo.replayed_by_others.get(f.global) {
                    n.fetch_add(replayed, Ordering::AcqRel);
                }
            }
            self.recovering.push((f.global, f.id, f.epoch));
            taken.push(TakenIn { global: f.global, epoch: f.epoch, lost: f.lost_in_all, beyond_replay, replayed });
        }
        self.recovering.retain(|(global, id, epoch)| {
            let first = log.replay_frontier(*id);
            fo.publish_frontier(*global, root, *epoch, first);
            if first.is_some() {
                return true;
            }
            if let Some(d) = fo.drained.get(*global).and_then(|d| d.get(usize::from(root))) {
                d.fetch_max(*epoch, Ordering::AcqRel);
            }
            false
        });
        taken
    }
}

/// Root 0's side: its own replays, the crashes it asks for, and their reports.
#[derive(Default)]
pub(super) struct RootSide {
    replays: Replays,
    /// (global index, crash epoch, report index) not recovered everywhere yet.
    recovering: Vec<(usize, u64, usize)>,
    /// Crashes asked for, by global index: the report entry each fills in.
    asked: Vec<(usize, usize)>,
    /// Crashes of instances whose previous crash the worker has not carried out yet: asked
    /// once it has (two asks before the worker's turn would make one crash).
    deferred: Vec<(usize, usize)>,
    /// Failed instances whose write-ahead logs died with them, handled so far.
    pub(super) logs_lost: u64,
    /// Crashes planned with root 0's, asked once it has crashed (`asking.rs`).
    held: Vec<(Crash, usize)>,
}

impl RootSide {
    /// Replays towards the replacements of the instances that failed since the last call, and
    /// reports those every root's replay has reached. `out` is root 0's outgoing buffers;
    /// `now_ms` the time into the run.
    pub(super) fn serve(
        &mut self,
        shared: &Shared,
        (entry, traffic): (&[Routes], Option<&CompiledFilter>),
        (log, out): (&mut super::ft::RootLog, &mut Outgoing),
        failovers: &mut [FailoverReport],
        now_ms: f64,
    ) {
        let Some(fo) = &shared.failover else { return };
        for t in self.replays.serve(shared, 0, (entry, traffic), (log, out)) {
            self.logs_lost += 1;
            let report = self.asked.iter().position(|(g, _)| *g == t.global).map(|i| self.asked.remove(i).1);
            if let Some(r) = report.and_then(|i| failovers.get_mut(i)) {
                r.lost = t.lost as u64;
                r.beyond_replay = t.beyond_replay as u64;
                r.replayed = t.replayed;
            }
            self.recovering.push((t.global, t.epoch, report.unwrap_or(usize::MAX)));
            if let Some(i) = self.deferred.iter().position(|(g, _)| *g == t.global) {
                let next = self.deferred.remove(i);
                self.asked.push(next);
                if let Some(c) = fo.crash.get(t.global) {
                    c.store(true, Ordering::Release);
                }
            }
        }
        self.recovering.retain(|(global, epoch, report)| {
            let served = fo.served.get(*global).is_some_and(|s| s.load(Ordering::Acquire) >= *epoch);
            if !served || !fo.drained_everywhere(*global, *epoch) {
                return true;
            }
            if let Some(r) = failovers.get_mut(*report) {
                // From the ask to the replacement serving: the worker's part (settling with the
                // store, building the replacement, taking over what the store had, going
                // through the replay) counts.
                r.recovery_ms = now_ms - r.asked_ms;
                r.replayed += fo.replayed_by_others.get(*global).map_or(0, |n| n.swap(0, Ordering::AcqRel));
            }
            false
        });
    }

    /// Whether a crash asked for is not recovered yet (the run waits for it before ending).
    pub(super) fn busy(&self) -> bool {
        !self.recovering.is_empty() || !self.asked.is_empty() || !self.deferred.is_empty()
    }

    /// For a person: the instances (global indices) whose crashes are asked for, deferred, and
    /// recovering.
    pub(super) fn describe(&self) -> String {
        let g = |v: &[(usize, usize)]| v.iter().map(|(g, _)| *g).collect::<Vec<_>>();
        let recovering: Vec<usize> = self.recovering.iter().map(|(g, _, _)| *g).collect();
        format!("asked {:?}, deferred {:?}, recovering {recovering:?}", g(&self.asked), g(&self.deferred))
    }

    /// Whether a crash was asked for whose failure the root has not taken in yet (the
    /// instance may have failed already, its write-ahead log gone).
    pub(super) fn failing(&self) -> bool {
        !self.asked.is_empty() || !self.deferred.is_empty()
    }
}
