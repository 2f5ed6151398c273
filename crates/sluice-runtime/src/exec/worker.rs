//! The worker threads: each runs its instances to completion over batches from their queues.

use super::failover::{self, Admit, Recovery};
use super::flow_timers;
use super::outgoing::single_destination;
use super::passing::{self, Passing};
use super::reconfig::{self, Moving};
use super::{Note, Outgoing, Shared};
use crate::live::{BatchCounts, Live};
use crate::order::InOrder;
use crate::plan::direction;
use crossbeam_queue::ArrayQueue;
use sluice_chc::clockset::ClockSet;
use sluice_nf::{Event, Instance, Verdict};
use sluice_packet::{Batch, Clock, MetaFlags, Packet};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(Default)]
pub(super) struct InstanceStats {
    pub(super) packets_in: u64,
    pub(super) forwarded: u64,
    pub(super) consumed: u64,
    pub(super) dropped: BTreeMap<&'static str, u64>,
    pub(super) busy: Duration,
    /// With `RunConfig::record`: every drop, by clock.
    pub(super) drops: Vec<(Clock, &'static str)>,
    /// With live statistics: the reasons of the drops in the batch in progress.
    pub(super) batch_drops: Vec<&'static str>,
    /// With live statistics: batches published so far.
    pub(super) batches: u64,
    /// Copies dropped as duplicates (after a failover).
    pub(super) duplicates: u64,
    /// Replay copies passed on as this instance's first processing left them.
    pub(super) replays_passed: u64,
    /// Decisions of instances that failed here, and of a replacement while it recovered
    /// (and, with a journal, every decision as it is written there).
    pub(super) events: Vec<Event>,
    /// The instance's vertex.
    vertex: usize,
}

impl InstanceStats {
    fn drop(&mut self, shared: &Shared, clock: Clock, reason: &'static str) {
        *self.dropped.entry(reason).or_default() += 1;
        if shared.record {
            self.drops.push((clock, reason));
            if let Some(j) = &shared.journal {
                j.dropped(clock, shared.vertices.get(self.vertex).map_or("?", |v| &*v.name), reason);
            }
        }
        if shared.live.is_some() {
            self.batch_drops.push(reason);
        }
    }

    /// Tells `live` what the batch that started at `before` did.
    fn publish(&mut self, live: &Live, global: usize, before: (u64, u64, u64), busy: Duration, queued: usize) {
        let mut reasons: Vec<(&'static str, u64)> = Vec::new();
        for r in self.batch_drops.drain(..) {
            match reasons.iter_mut().find(|(x, _)| *x == r) {
                Some((_, n)) => *n += 1,
                None => reasons.push((r, 1)),
            }
        }
        let counts = BatchCounts {
            packets_in: self.packets_in - before.0,
            forwarded: self.forwarded - before.1,
            consumed: self.consumed - before.2,
            dropped: reasons.iter().map(|(_, n)| n).sum(),
            busy_ns: busy.as_nanos() as u64,
        };
        live.batch(global, counts, &reasons, queued);
    }
}

pub(super) struct Slot {
    pub(super) global: usize,
    pub(super) vertex: usize,
    pub(super) inst: Instance,
    pub(super) stats: InstanceStats,
    /// An order-sensitive instance whose input can arrive out of entry order holds it here.
    pub(super) order: Option<InOrder>,
    /// With crashes planned: the clocks this instance processed (a second copy is a duplicate).
    pub(super) seen: Option<ClockSet>,
    /// A replacement waiting for the root's replay.
    pub(super) recovery: Option<Recovery>,
    /// A replacement's read of what the store had of its predecessor (timers, values), taken
    /// once its replay has drained (`Rebuilder::replacement_reading`).
    pub(super) reading: Option<crate::plan::RecoveryReading>,
    /// With crashes possible, at a vertex that leads to others: what it emitted per clock, for
    /// replays passing through towards a replacement further down.
    pub(super) passing: Option<Passing>,
    /// With scaling possible: packets waiting for a change to settle, flows received.
    pub(super) moving: Option<Moving>,
    /// What went wrong building a replacement.
    pub(super) errors: Vec<String>,
    /// Failed instances, freed once their replacement serves (not during its recovery).
    pub(super) failed: Vec<sluice_nf::Instance>,
    /// Crashed on this node, a node without the root: the root's node runs its replacement
    /// (`failover/handover.rs`); the slot keeps what it did before, for the report.
    pub(super) handed_over: bool,
    /// An order-sensitive vertex's table of every timer, per-flow ones too, which its
    /// instances fire in turn (`flow_timers.rs`).
    pub(super) flow_timers: Option<sluice_store::VertexTimers>,
}

impl Slot {
    /// Whether this node reports the instance (its drops, events and counters): one that runs
    /// here, or ran here until it crashed and was handed over; not a dormant slot of another
    /// node's instance.
    pub(super) fn ran_here(&self, shared: &Shared) -> bool {
        !shared.is_elsewhere(self.global) || self.handed_over
    }

    /// The slot of instance `inst` of vertex `vertex`, global index `global`, in `shared`'s run.
    pub(super) fn new(shared: &Shared, global: usize, vertex: usize, mut inst: sluice_nf::Instance) -> Slot {
        let order = shared.ordered.get(vertex).copied().unwrap_or(false).then(|| InOrder::new(shared.roots));
        let seen = shared.failover.is_some().then(ClockSet::default);
        // Only a vertex that leads to others sees replays pass through.
        let leads_on = shared.vertices.get(vertex).is_some_and(|v| !v.successors().is_empty());
        let passing = (seen.is_some() && leads_on).then(Passing::default);
        let moving = shared.scaling.is_some().then(Moving::default);
        let stats = InstanceStats { vertex, ..InstanceStats::default() };
        let flow_timers = crate::plan::store_client(&mut inst)
            .and_then(|c| c.vertex_timer_table().filter(|t| t.holds_flow_timers()).cloned());
        Slot {
            global,
            vertex,
            inst,
            stats,
            order,
            seen,
            recovery: None,
            reading: None,
            passing,
            moving,
            errors: Vec::new(),
            failed: Vec::new(),
            handed_over: false,
            flow_timers,
        }
    }
}

pub(super) struct WorkerResult {
    pub(super) slots: Vec<Slot>,
    pub(super) mirrored: u64,
    pub(super) flush_errors: Vec<String>,
}

pub(super) fn worker_loop(shared: &Shared, worker: usize, slots: Vec<Slot>) -> WorkerResult {
    shared.wake.register(worker);
    let mut w = Turns::new(shared, worker, slots);
    let mut idle = super::idle::Idle::default();
    loop {
        if shared.aborted.load(Ordering::Relaxed) {
            break;
        }
        if w.turn(shared) {
            idle.busy();
            continue;
        }
        if shared.input_done.load(Ordering::Acquire) && shared.in_flight.load(Ordering::Acquire) == 0 {
            break;
        }
        let turns = idle.turn();
        if turns < 32 {
            std::hint::spin_loop();
        } else if turns < 256 {
            std::thread::yield_now();
        } else {
            let short = Duration::from_micros(20);
            match idle.wait(short) {
                wait if wait > short => shared.wake.sleep(worker, wait, || w.has_queued(shared)),
                wait => std::thread::sleep(wait),
            }
        }
    }
    w.finish(shared)
}

/// One worker's instances and what it keeps between turns: a worker thread turns them in a
/// loop ([`worker_loop`]); a run to completion turns them on the root thread between batches.
pub(super) struct Turns {
    worker: usize,
    slots: Vec<Slot>,
    out: Outgoing,
    described: u64,
    held_seen: u64,
}

impl Turns {
    pub(super) fn new(shared: &Shared, worker: usize, slots: Vec<Slot>) -> Turns {
        for s in &slots {
            shared.wake.serves(worker, s.global);
        }
        Turns { worker, slots, out: Outgoing::new(shared), described: 0, held_seen: 0 }
    }

    /// Whether a batch waits in the queue of one of this worker's instances.
    fn has_queued(&self, shared: &Shared) -> bool {
        self.slots.iter().any(|s| shared.queue(s.global).is_some_and(|q| !q.is_empty()))
    }

    /// Serves every instance once; whether any had something to do.
    pub(super) fn turn(&mut self, shared: &Shared) -> bool {
        let Turns { worker, slots, out, described, held_seen } = self;
        let asked = shared.describe_asked.load(Ordering::Relaxed);
        if asked != *described {
            *described = asked;
            for slot in slots.iter() {
                describe(shared, slot);
            }
        }
        let mut did = false;
        if let Some(sc) = &shared.scaling {
            let taken = sc.take_inbox(*worker);
            for s in &taken {
                shared.wake.serves(*worker, s.global);
            }
            slots.extend(taken);
        }
        super::store_crash::hold_if_asked(shared, slots, held_seen);
        for slot in slots.iter_mut() {
            // Read before the crash flag: a slot woken after its node failed has its crash
            // asked already (`RootSide::take_elsewhere`).
            let dormant = shared.is_elsewhere(slot.global);
            did |= failover::turn(shared, slot, out);
            // Nor one that crashed here just now, its replacement on the root's node: what
            // arrived since its queue was taken is relayed there, not run by the failed one.
            if dormant || slot.handed_over {
                continue;
            }
            did |= reconfig::turn(shared, slot, out);
            did |= flow_timers::fire_asked(shared, slot, out);
            let served = serve(shared, slot, out);
            if !served && shared.logging() {
                // Acknowledgements keep coming after an instance's last batch, and its last
                // updates may wait to go with a next batch (`ClientConfig::defer_batches`): the
                // root's log waits for their commits, busy as the other instances may be.
                report_commits(shared, slot, out);
            }
            did |= served;
            if super::store_crash::hold_pending(shared) {
                // The chain is asked to hold still: straight back to the top of the loop, the
                // other instances' turns after the hold.
                did = true;
                break;
            }
        }
        out.flush(shared);
        if !did && shared.logging() {
            for slot in slots.iter_mut() {
                report_commits(shared, slot, out);
            }
            out.flush_notes(shared);
        }
        did
    }

    /// The run is over: what is still to send goes, cached state goes to the store.
    pub(super) fn finish(self, shared: &Shared) -> WorkerResult {
        let Turns { worker, mut slots, mut out, .. } = self;
        if let Some(sc) = &shared.scaling {
            // An instance added at the very end has nothing to do, but is part of the run.
            slots.extend(sc.take_inbox(worker));
        }
        // Notes that found the root's queue full still go (the root waits for the last commits).
        while out.retry(shared) && !shared.aborted.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        // State cached in instances goes to the store before the run ends (not that of an
        // instance that failed here: what it had not sent is lost).
        let mut flush_errors = Vec::new();
        for slot in slots.iter_mut().filter(|s| !shared.is_elsewhere(s.global)) {
            if let Err(e) = slot.inst.state().flush() {
                flush_errors.push(format!("{} instance {}: {e}", slot.inst.vertex(), slot.inst.id().index()));
            }
            // The root has settled its log by now: what the flush committed has no entry left.
            slot.inst.state().take_commits(&mut out.commits);
            out.commits.clear();
        }
        WorkerResult { slots, mirrored: out.mirrored, flush_errors }
    }
}

/// Says what `slot` holds and why (the root asks when nothing has finished for a while).
fn describe(shared: &Shared, slot: &Slot) {
    let name = shared.vertices.get(slot.vertex).map_or("?", |v| &*v.name);
    let serving = shared.scaling.as_ref().is_none_or(|sc| sc.serving(slot.global));
    let queued = shared.queue(slot.global).map_or(0, ArrayQueue::len);
    tracing::warn!(
        instance = %format_args!("{name}:{}", shared.index_of(slot.vertex, slot.global)),
        serving,
        queued_batches = queued,
        in_entry_order = %slot.order.as_ref().map(InOrder::describe).unwrap_or_default(),
        waiting_for_a_change = %slot.moving.as_ref().map(Moving::describe).unwrap_or_default(),
        recovering = %slot.recovery.as_ref().map(Recovery::describe).unwrap_or_default(),
        replays_passing = %slot.passing.as_ref().map(Passing::describe).unwrap_or_default(),
        "what this instance holds"
    );
}

/// Passes the commits `slot`'s store client has heard of to the root's log, or, without a log,
/// lets them go (they would pile up in the client).
pub(super) fn report_commits(shared: &Shared, slot: &mut Slot, out: &mut Outgoing) {
    let mut scratch = std::mem::take(&mut out.commits);
    slot.inst.state().take_commits(&mut scratch);
    for (clock, xor) in scratch.drain(..) {
        out.note(shared, Note::Commit(clock, xor));
    }
    out.commits = scratch;
}

/// Serves one instance: a few batches from its queue (keeping instances fair), or, for an
/// order-sensitive one, whatever it holds whose turn has come. Whether anything happened.
fn serve(shared: &Shared, slot: &mut Slot, out: &mut Outgoing) -> bool {
    let mut did = false;
    if slot.order.is_none() {
        for _ in 0..TURN_BATCHES {
            if super::store_crash::hold_pending(shared) {
                break;
            }
            let Some(batch) = shared.pop(slot.global) else { break };
            did = true;
            process_batch(shared, slot, batch, out);
        }
        return did;
    }
    while let Some(batch) = shared.pop(slot.global) {
        did = true;
        hold_in_order(shared, slot, batch, out);
    }
    let vertex = slot.vertex;
    // What it holds goes in batches of the run's size, as a queue's would: a batch is the
    // unit a hold of the chain waits for (`store_crash::hold_pending`).
    for _ in 0..TURN_BATCHES {
        let Some(order) = slot.order.as_mut() else { break };
        if order.held() == 0 || super::store_crash::hold_pending(shared) {
            break;
        }
        let mut ready = shared.empty_batch();
        match &shared.from_root {
            // The root runs on another node, which says how far it has got.
            Some(from_root) => order.take_ready_by(&from_root.of(vertex), &mut ready, shared.batch),
            None => {
                let gone_by = |c: Clock| shared.past_recovering(vertex, c);
                order.take_ready(&shared.clocks, &shared.admissions, gone_by, &mut ready, shared.batch);
            }
        }
        if ready.is_empty() {
            shared.give_back(ready);
            break;
        }
        process_batch(shared, slot, ready, out);
        did = true;
    }
    did
}

/// Batches an instance is given in one turn of its worker, at most: the worker's other
/// instances get theirs in between.
const TURN_BATCHES: usize = 4;

/// An order-sensitive instance holds what arrives until its turn; a second copy of a clock it
/// holds already ends as a duplicate.
fn hold_in_order(shared: &Shared, slot: &mut Slot, mut batch: Batch, out: &mut Outgoing) {
    let mut ended = 0;
    reconfig::take_settled(shared, slot, out);
    for p in batch.drain(..) {
        if slot.seen.is_some() && passing::passes(slot, &p) {
            ended += usize::from(passing::pass_on(shared, slot, p, out));
            continue;
        }
        if slot.recovery.is_some() {
            // A recovering replacement holds its replay apart from the entry-order hold and
            // before any wait for a change of the allocation: a replay copy must count as
            // arrived at once (the replay drains so), not wait behind a clock the recovery
            // itself holds. Both come back through here once the replay is done.
            match failover::admit(slot, &p) {
                Admit::Duplicate => {
                    end_copy(shared, &mut slot.stats, out, p, Ended::Duplicate);
                    ended += 1;
                }
                Admit::Hold | Admit::Process => failover::hold(shared, slot, p, out),
            }
            continue;
        }
        let p = match reconfig::waits(shared, slot, out, p) {
            Ok(p) => p,
            Err(n) => {
                ended += n;
                continue;
            }
        };
        let meta = p.meta;
        let Some(order) = slot.order.as_mut() else { continue };
        if let Some(dup) = order.hold(p) {
            end_copy(shared, &mut slot.stats, out, dup, Ended::Duplicate);
            ended += 1;
        }
        // Replay copies passing through end where the clock's live packet waits (it carries
        // their clock on); where a replay's own copy waits, they wait for its processing.
        if order.holds_live(&meta) {
            ended += passing::end_awaiting(shared, slot, meta.clock, out);
        }
    }
    shared.give_back(batch);
    reconfig::publish_flows(shared, slot);
    if ended > 0 {
        out.flush(shared);
        shared.in_flight.fetch_sub(ended, Ordering::AcqRel);
    }
}

/// Takes `batch` in as if it had come from the instance's queue (a recovering replacement's
/// held packets, once its replay is done).
pub(super) fn take_in(shared: &Shared, slot: &mut Slot, batch: Batch, out: &mut Outgoing) {
    if slot.order.is_some() {
        hold_in_order(shared, slot, batch, out);
    } else {
        process_batch(shared, slot, batch, out);
    }
}

fn process_batch(shared: &Shared, slot: &mut Slot, mut batch: Batch, out: &mut Outgoing) {
    if slot.order.is_none() {
        // Timers handed over with flows are armed before any packet of those flows runs.
        reconfig::take_settled(shared, slot, out);
    }
    // What an order-sensitive instance releases came past its recovery (`hold_in_order` holds
    // a recovering replacement's copies apart, and lets through only what it went through,
    // `failover::go_through`): processed, not held again.
    let recovery = if slot.order.is_some() { slot.recovery.take() } else { None };
    let start = Instant::now();
    let before = (slot.stats.packets_in, slot.stats.forwarded, slot.stats.consumed);
    let mut finished = 0usize;
    out.hold = shared.send_updates_first;
    slot.inst.begin_batch();
    let slow = shared.live.as_ref().and_then(|l| l.slow(slot.global));
    let only_to = forward_to(shared, slot);
    // The root wrote these bodies on another core: fetch them all at once.
    sluice_packet::warm(&batch);
    let mut packets = batch.drain(..);
    while let Some(mut pkt) = packets.next() {
        if slot.seen.is_some() && passing::passes(slot, &pkt) {
            finished += usize::from(passing::pass_on(shared, slot, pkt, out));
            continue;
        }
        if let flow_timers::Before::Wait = flow_timers::before_packet(shared, slot, &mut pkt, out) {
            // Another instance fires a timer due before it first: it and what came after it
            // wait, in entry order, for their turn again.
            for p in std::iter::once(pkt).chain(packets.by_ref()) {
                if let Some(dup) = slot.order.as_mut().and_then(|o| o.hold(p)) {
                    end_copy(shared, &mut slot.stats, out, dup, Ended::Duplicate);
                    finished += 1;
                }
            }
            break;
        }
        // A recovering replacement holds everything first, a copy of its replay counted as
        // arrived: were the copy to wait for a change of the allocation here, the change would
        // wait for earlier clocks that the recovery holds. What it held comes back through here
        // once the replay is done.
        let recovering = slot.recovery.is_some();
        // (Only a run that can scale or move flows has anything to wait for: the look is
        // skipped, call and all, in every other.)
        if slot.order.is_none() && !recovering && shared.scaling.is_some() {
            match reconfig::waits(shared, slot, out, pkt) {
                Ok(p) => pkt = p,
                Err(n) => {
                    finished += n;
                    continue;
                }
            }
        }
        if slot.seen.is_some() {
            match failover::admit(slot, &pkt) {
                Admit::Process => {}
                Admit::Hold => {
                    failover::hold(shared, slot, pkt, out);
                    continue;
                }
                Admit::Duplicate => {
                    end_copy(shared, &mut slot.stats, out, pkt, Ended::Duplicate);
                    finished += 1;
                    continue;
                }
            }
        }
        slot.stats.packets_in += 1;
        if slot.stats.packets_in.is_multiple_of(super::store_crash::PROGRESS_EVERY) {
            // A batch can be long: a replacement takes its whole replay in as one.
            super::store_crash::progressed(shared);
        }
        if let Some(range) = slow {
            straggle(range, pkt.meta.clock);
        }
        let verdict = slot.inst.process(&mut pkt);
        if let Some(j) = &shared.journal {
            // Written before the packet goes on: a node killed later leaves the decision behind.
            let decided = slot.inst.take_events();
            decided.iter().for_each(|e| j.decided(e));
            slot.stats.events.extend(decided);
        }
        if pkt.meta.replay_target() == Some(slot.inst.id()) {
            // The replay's copy reached its target: downstream it is a packet like any other.
            pkt.meta.flags.insert(MetaFlags::REACHED);
            out.note(shared, Note::Reached(pkt.meta));
        }
        if let (Some(d), Verdict::Forward, None) = (only_to, &verdict, pkt.meta.replay_target()) {
            // Where `hand_on` would send it, without asking again per packet.
            out.push_in_run(shared, d, pkt);
            slot.stats.forwarded += 1;
            continue;
        }
        let clock = pkt.meta.clock;
        if let Some(p) = slot.passing.as_mut() {
            p.record(&shared.pool, &pkt, verdict);
        }
        match hand_on(shared, slot.vertex, pkt, verdict, out) {
            None => slot.stats.forwarded += 1,
            Some((pkt, how)) => {
                end_copy(shared, &mut slot.stats, out, pkt, how);
                finished += 1;
            }
        }
        if slot.passing.is_some() {
            finished += passing::release(shared, slot, clock, out);
        }
    }
    drop(packets);
    slot.inst.end_batch();
    out.hold = false;
    if slot.recovery.is_some() {
        // Decisions the replacement makes again for clocks its predecessor processed are the
        // same ones (dropped as such when the run is recorded); kept apart meanwhile.
        slot.stats.events.extend(slot.inst.take_events());
    }
    shared.give_back(batch);
    reconfig::publish_flows(shared, slot);
    report_commits(shared, slot, out);
    out.flush(shared);
    if finished > 0 {
        shared.in_flight.fetch_sub(finished, Ordering::AcqRel);
    }
    let busy = start.elapsed();
    slot.stats.busy += busy;
    if let Some(live) = &shared.live {
        let queued = shared.queue(slot.global).map_or(0, ArrayQueue::len);
        slot.stats.publish(live, slot.global, before, busy, queued);
        // The state backend's counters (round trips, cache hits, ...) are a small list built
        // on demand: every few batches is live enough for a scrape.
        if slot.stats.batches.is_multiple_of(STATE_COUNTERS_EVERY) {
            live.state_counters(slot.global, &slot.inst.state().counters());
        }
        slot.stats.batches += 1;
    }
    if recovery.is_some() {
        slot.recovery = recovery;
    }
    super::store_crash::progressed(shared);
}

/// Sends a packet `vertex`'s NF processed on by its verdict: the packet back, with how it ends,
/// if it ends here (dropped, consumed off-path, no route).
pub(super) fn hand_on(
    shared: &Shared,
    vertex: usize,
    pkt: Packet,
    verdict: Verdict,
    out: &mut Outgoing,
) -> Option<(Packet, Ended)> {
    let output = match verdict {
        Verdict::Forward => 0,
        Verdict::Output(i) => usize::from(i) + 1,
        Verdict::Drop(reason) => return Some((pkt, Ended::Dropped(reason))),
    };
    let Some(vp) = shared.vertices.get(vertex) else { return Some((pkt, Ended::Dropped("no-route"))) };
    if vp.off_path {
        return Some((pkt, Ended::Consumed));
    }
    let routes = vp.routes.get(direction(&pkt, vp.routes.len())).and_then(|r| r.get(output));
    let unrouted = match routes {
        Some(routes) => out.route(shared, routes, pkt),
        None => Some(pkt),
    };
    unrouted.map(|p| (p, Ended::Dropped("no-route")))
}

/// Where every packet `slot`'s NF forwards on its default output goes, when that is one place
/// whatever the packet ([`single_destination`]), in a run that keeps no record of what passes
/// (`passing`).
fn forward_to(shared: &Shared, slot: &Slot) -> Option<usize> {
    let vp = shared.vertices.get(slot.vertex)?;
    let [by_output] = vp.routes.as_slice() else { return None };
    if slot.passing.is_some() || vp.off_path {
        return None;
    }
    single_destination(shared, by_output.first()?)
}

/// How a copy ends at an instance.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ended {
    /// The NF dropped it (or it had no route), for this reason.
    Dropped(&'static str),
    /// An off-path vertex consumed it.
    Consumed,
    /// A duplicate of a clock processed here (after a failover).
    Duplicate,
    /// A replay copy passing through, of a clock this vertex decided on already, that goes no
    /// further (counted as passed).
    Decided,
}

/// A copy ends at this instance. The root hears it is done; its buffer goes back to the pool.
/// The caller counts it out of the packets in flight.
#[track_caller]
pub(super) fn end_copy(shared: &Shared, stats: &mut InstanceStats, out: &mut Outgoing, pkt: Packet, how: Ended) {
    match how {
        Ended::Dropped(reason) => stats.drop(shared, pkt.meta.clock, reason),
        Ended::Consumed => stats.consumed += 1,
        Ended::Duplicate | Ended::Decided => {
            // Where a copy ends without going on, for tracing a packet missing after a
            // failover (RUST_LOG=sluice::copies=trace).
            let at = std::panic::Location::caller();
            let m = &pkt.meta;
            tracing::trace!(target: "sluice::copies", clock = %m.clock, ?how, flags = m.flags.bits(), target = ?m.target, site = %at, "copy ends");
        }
    }
    if let Ended::Duplicate = how {
        stats.duplicates += 1;
    }
    out.note(shared, Note::Finished(pkt.meta));
    shared.clocks.done(pkt.meta.clock);
    shared.pool.recycle(pkt);
}

/// How often (in batches) a worker publishes an instance's state counters live.
const STATE_COUNTERS_EVERY: u64 = 16;

/// A slowed instance (`Live::set_slow`) spends between `min` and `max` ns more on a packet,
/// busy, as a straggler's slower core would; the draw is a hash of the packet's clock.
fn straggle((min, max): (u64, u64), clock: Clock) {
    let spread = max - min + 1;
    let h = clock.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17;
    let until = Instant::now() + Duration::from_nanos(min + h % spread);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
