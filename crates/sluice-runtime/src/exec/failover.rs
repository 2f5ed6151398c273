//! Instance failover in a threaded run (`RunConfig::crashes`, with the root's log): CHC's
//! recovery of a failed NF instance, as docs/decisions.md ("Instance failover in threads")
//! plans it.
//!
//! The root thread asks for a crash by raising the instance's flag. The worker that owns the
//! instance, at its next turn, takes everything out of the instance's queue (and what an
//! order-sensitive instance holds), drops the instance — its cached state and the updates it
//! had not sent yet are lost for real — puts a replacement with the same id in its place (the
//! store gives it the predecessor's per-flow state and timers), and tells the root which copies
//! were lost ([`Failure`]). The replacement *recovers*: it holds live packets and processes only
//! the root's replay. The root counts the lost copies as lost, replays its log towards the
//! replacement (the copies of the flows the replacement serves), and only then counts the lost
//! copies out of the in-flight ring, so that no lost clock looks finished to an
//! order-sensitive instance downstream before its replay copy is on its way. Once every copy of
//! the replay has reached the replacement, the root raises its `recovered` flag and the
//! replacement takes the packets it held, as duplicates where the replay carried them.
//!
//! Duplicates: with crashes planned, every instance remembers the clocks it processed (a
//! [`ClockSet`], trimmed below the oldest clock still logged, which the root publishes) and
//! drops a second copy of one; a replay copy at its target whose clock the failed instance
//! processed, with every update committed (`MetaFlags::COMMITTED`), is skipped rather than run
//! again against state later packets changed.

use super::worker::Slot;
use super::{Outgoing, Shared};
use crate::filter::CompiledFilter;
use crate::plan::{direction, Rebuilder, Routes, Target};
use crate::report::FailoverReport;
use sluice_chc::clockset::ClockSet;
use sluice_packet::{Clock, InstanceId, Meta, MetaFlags, Packet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A crash of an NF instance in a threaded run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crash {
    /// Asked once the root has admitted this many packets.
    pub after: u64,
    /// The vertex (its index in the chain).
    pub vertex: usize,
    /// The instance of it.
    pub index: u16,
}

/// What a worker tells the root about an instance it crashed.
pub(super) struct Failure {
    global: usize,
    id: InstanceId,
    lost: Vec<Meta>,
}

/// A replacement waiting for the root's replay.
pub(super) struct Recovery {
    /// Live packets that arrived meanwhile, in arrival order.
    held: Vec<Packet>,
    /// The clocks the failed instance processed.
    predecessor: ClockSet,
}

/// What the root thread and the workers share for failovers.
pub(super) struct Failover {
    /// Per instance (global index): the root asks for a crash.
    crash: Vec<AtomicBool>,
    /// Per instance: the replay towards the replacement has drained.
    recovered: Vec<AtomicBool>,
    /// Crashed instances the root has not replayed to yet.
    failures: Mutex<Vec<Failure>>,
    /// The oldest sequence number still logged: no copy of an older clock can come again.
    oldest_logged: AtomicU64,
    rebuilder: Rebuilder,
    /// Instances per vertex.
    instances: Vec<u16>,
}

impl Failover {
    pub(super) fn new(instances: usize, per_vertex: Vec<u16>, rebuilder: Rebuilder) -> Failover {
        Failover {
            crash: (0..instances).map(|_| AtomicBool::new(false)).collect(),
            recovered: (0..instances).map(|_| AtomicBool::new(false)).collect(),
            failures: Mutex::new(Vec::new()),
            oldest_logged: AtomicU64::new(1),
            rebuilder,
            instances: per_vertex,
        }
    }

    /// The root publishes the oldest clock still logged.
    pub(super) fn set_oldest_logged(&self, seq: u64) {
        self.oldest_logged.store(seq, Ordering::Release);
    }
}

/// Why a crash cannot be run by the threaded runtime (yet).
pub(super) fn check(crash: &Crash, shared: &Shared, entry: &[Routes]) -> Result<(), String> {
    let Some(v) = shared.vertices.get(crash.vertex) else {
        return Err(format!("no vertex with index {}", crash.vertex));
    };
    if usize::from(crash.index) >= v.instances.len() {
        return Err(format!("`{}` has {} instance(s), not an instance {}", v.name, v.instances.len(), crash.index));
    }
    let fed_by_root = entry.iter().any(|r| r.main.iter().any(|e| e.to == Target::Vertex(crash.vertex)));
    if !fed_by_root {
        return Err(format!(
            "a crash of `{}`: the threaded runtime replays only to instances the root feeds directly so far (`sluice verify` runs the others)",
            v.name
        ));
    }
    Ok(())
}

/// At the start of `slot`'s turn: crashes it if the root asked, ends its recovery if the root
/// says its replay is done. Whether anything happened.
pub(super) fn turn(shared: &Shared, slot: &mut Slot, out: &mut Outgoing) -> bool {
    let Some(fo) = &shared.failover else { return false };
    let mut did = false;
    if fo.crash.get(slot.global).is_some_and(|f| f.swap(false, Ordering::AcqRel)) {
        crash(shared, fo, slot);
        did = true;
    }
    let recovered = || fo.recovered.get(slot.global).is_some_and(|f| f.swap(false, Ordering::AcqRel));
    if slot.recovery.is_some() && recovered() {
        if let Some(r) = slot.recovery.take() {
            let mut batch = shared.empty_batch();
            batch.extend(r.held);
            super::worker::take_in(shared, slot, batch, out);
        }
        did = true;
    }
    if let Some(seen) = slot.seen.as_mut() {
        seen.remove_below(Clock::new(0, fo.oldest_logged.load(Ordering::Acquire)));
    }
    did
}

/// Crashes `slot`'s instance and puts its replacement in its place.
fn crash(shared: &Shared, fo: &Failover, slot: &mut Slot) {
    let (vertex, id) = (slot.vertex, slot.inst.id());
    let instances = fo.instances.get(vertex).copied().unwrap_or(1);
    let replacement = match fo.rebuilder.replacement(vertex, id.index(), instances) {
        Ok(r) => r,
        Err(e) => {
            slot.errors.push(format!("building the replacement of {}:{}: {e}", slot.inst.vertex(), id.index()));
            return;
        }
    };
    let mut lost = Vec::new();
    let mut lose = |p: Packet| {
        lost.push(p.meta);
        shared.pool.recycle(p);
    };
    if let Some(q) = shared.queues.get(slot.global) {
        while let Some(mut b) = q.pop() {
            b.drain(..).for_each(&mut lose);
            shared.give_back(b);
        }
    }
    if let Some(o) = slot.order.as_mut() {
        o.take_held().into_iter().for_each(&mut lose);
    }
    if let Some(r) = slot.recovery.take() {
        r.held.into_iter().for_each(&mut lose);
    }
    let mut failed = std::mem::replace(&mut slot.inst, replacement);
    // What it decided before failing is part of the run.
    slot.stats.events.extend(failed.take_events());
    drop(failed);
    let predecessor = slot.seen.replace(ClockSet::default()).unwrap_or_default();
    slot.recovery = Some(Recovery { held: Vec::new(), predecessor });
    // A flag the root raised for the failed instance's own recovery is not this one's.
    if let Some(r) = fo.recovered.get(slot.global) {
        r.store(false, Ordering::Release);
    }
    if let Ok(mut f) = fo.failures.lock() {
        f.push(Failure { global: slot.global, id, lost });
    }
}

/// What an instance with crashes planned does with a packet before its NF sees it.
pub(super) enum Admit {
    /// Process it.
    Process,
    /// A live packet at a recovering replacement: held until the replay is done.
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
        if !at_target {
            return Admit::Hold;
        }
        if pkt.meta.flags.contains(MetaFlags::COMMITTED) && r.predecessor.contains(pkt.meta.clock) {
            return Admit::Duplicate;
        }
    }
    let first = slot.seen.as_mut().is_none_or(|seen| seen.insert(pkt.meta.clock));
    if first {
        Admit::Process
    } else {
        Admit::Duplicate
    }
}

/// Holds `pkt` at a recovering replacement.
pub(super) fn hold(slot: &mut Slot, pkt: Packet) {
    if let Some(r) = slot.recovery.as_mut() {
        r.held.push(pkt);
    }
}

/// The root thread's side: the failures it has been told of, and the replacements recovering.
#[derive(Default)]
pub(super) struct RootSide {
    /// (global index, replacement, report index, when the root heard of the crash).
    recovering: Vec<(usize, InstanceId, usize, Instant)>,
    /// Crashes asked for, by global index: the report entry each fills in.
    asked: Vec<(usize, usize)>,
    /// Crashes of instances whose previous crash the worker has not carried out yet: asked
    /// once it has (two asks before the worker's turn would make one crash).
    deferred: Vec<(usize, usize)>,
}

impl RootSide {
    /// The root asks for crash `c` (of instance `global`) and opens its report entry.
    pub(super) fn ask(&mut self, shared: &Shared, c: &Crash, global: usize, failovers: &mut Vec<FailoverReport>) {
        let Some(fo) = &shared.failover else { return };
        let vertex = shared.vertices.get(c.vertex).map(|v| v.name.to_string()).unwrap_or_default();
        failovers.push(FailoverReport { vertex, instance: c.index, at_packet: c.after, ..FailoverReport::default() });
        let ask = (global, failovers.len() - 1);
        if self.asked.iter().any(|(g, _)| *g == global) {
            self.deferred.push(ask);
            return;
        }
        self.asked.push(ask);
        if let Some(f) = fo.crash.get(global) {
            f.store(true, Ordering::Release);
        }
    }

    /// Replays towards the replacements of the instances that failed since the last call, and
    /// tells those whose replay has drained. `out` is the root's outgoing buffers.
    pub(super) fn serve(
        &mut self,
        shared: &Shared,
        (entry, traffic): (&[Routes], Option<&CompiledFilter>),
        log: &mut super::ft::RootLog,
        out: &mut Outgoing,
        failovers: &mut [FailoverReport],
    ) {
        let Some(fo) = &shared.failover else { return };
        let failures = fo.failures.lock().map(|mut f| std::mem::take(&mut *f)).unwrap_or_default();
        for f in failures {
            let report = self.asked.iter().position(|(g, _)| *g == f.global).map(|i| self.asked.remove(i).1);
            for m in &f.lost {
                log.lost(m);
            }
            let v = usize::from(f.id.vertex());
            let vp = shared.vertices.get(v);
            // Only the copies of packets the root sent that way, of the flows the replacement
            // serves, go to it.
            let goes_there = |out: &Outgoing, p: &Packet| {
                traffic.is_none_or(|t| t.matches(p))
                    && entry.get(direction(p, entry.len())).and_then(|r| r.main_target(p)) == Some(Target::Vertex(v))
                    && vp.is_some_and(|vp| out.splitter.pick(vp, p) == f.global)
            };
            let mut replayed = 0u64;
            for p in log.replay_to(f.id) {
                if goes_there(out, &p) {
                    shared.in_flight.fetch_add(1, Ordering::AcqRel);
                    shared.clocks.copy(p.meta.clock);
                    out.push(shared, f.global, p);
                    replayed += 1;
                } else {
                    log.note(&super::ft::Note::Finished(p.meta));
                    shared.pool.recycle(p);
                }
            }
            out.flush(shared);
            // The replay is counted in flight: the lost copies can go.
            for m in &f.lost {
                shared.clocks.done(m.clock);
            }
            shared.in_flight.fetch_sub(f.lost.len(), Ordering::AcqRel);
            if let Some(r) = report.and_then(|i| failovers.get_mut(i)) {
                r.lost = f.lost.len() as u64;
                r.replayed = replayed;
            }
            self.recovering.push((f.global, f.id, report.unwrap_or(usize::MAX), Instant::now()));
            if let Some(i) = self.deferred.iter().position(|(g, _)| *g == f.global) {
                let next = self.deferred.remove(i);
                self.asked.push(next);
                if let Some(c) = fo.crash.get(f.global) {
                    c.store(true, Ordering::Release);
                }
            }
        }
        self.recovering.retain(|(global, id, report, since)| {
            if !log.replay_drained_to(*id) {
                return true;
            }
            if let Some(r) = fo.recovered.get(*global) {
                r.store(true, Ordering::Release);
            }
            if let Some(r) = failovers.get_mut(*report) {
                r.recovery_ms = since.elapsed().as_secs_f64() * 1e3;
            }
            false
        });
    }

    /// Whether a crash asked for is not recovered yet (the run waits for it before ending).
    pub(super) fn busy(&self) -> bool {
        !self.recovering.is_empty() || !self.asked.is_empty() || !self.deferred.is_empty()
    }
}
