//! Scaling out and in, and flow moves, in a threaded run (`RunConfig::reconfigs`), as
//! docs/decisions.md ("Scaling and flow moves in threads") plans them.
//!
//! The root thread changes a vertex's allocation (the core's splitter: scale-out pins the
//! flows the instances have received, so nothing moves; scale-in and moves pin flows to their
//! new instance) from a [`Cut`] — the clock it has admitted up to, or with several roots the
//! entry time of the last packet read ([`super::alloc`]); an instance added goes to a
//! worker's inbox first. Packets of a flow whose instance changed wait at the new
//! instance. Once every clock up to the change has finished, the root asks the vertex's
//! instances to **settle** it: each flushes its updates to the store, drops its copies of the
//! flows it gave up and hands their timers to the flows' new instances. When all have, the
//! root forgets the allocation before the change; the waiting packets go, in entry order, after
//! the new instances took the timers; an instance no longer a member is retired.

use super::alloc::{Allocation, Cut};
use super::worker::Slot;
use super::Shared;
use crate::live::Done;
use crate::plan::Rebuilder;
use crate::report::ReconfigReport;
pub(super) use instance::{is_waiting, publish_flows, take_settled, turn, waits, Moving};
use sluice_chc::manager::{evaluate, Decision, InstanceLoad, ManagerPolicy};
use sluice_chc::NodeId;
use sluice_packet::Clock;
use sluice_state::{ObjectId, StateKey};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use trial::{ns_per_packet, Trial};

mod instance;
mod trial;

/// A change to a vertex's instances or flows while the chain runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconfig {
    /// Applied once the root has admitted this many packets.
    pub after: u64,
    /// The vertex (its index in the chain).
    pub vertex: usize,
    /// What changes.
    pub change: Change,
}

/// What a [`Reconfig`] changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Scale to this many instances (at least one).
    ScaleTo(u16),
    /// Scale by this many instances (negative: in).
    ScaleBy(i32),
    /// Move flows of instance `from` to instance `to`: at most `flows`, or all.
    Move {
        /// The instance the flows leave.
        from: u16,
        /// The instance that takes them.
        to: u16,
        /// How many flows at most; `None`: all.
        flows: Option<u64>,
    },
    /// Clone instance `instance` (a straggler) and keep the faster of the two
    /// (docs/decisions.md, "Clones in threads").
    Clone {
        /// The straggler.
        instance: u16,
    },
}

/// A timer handed from an instance that gave a flow up: (object, key, deadline).
pub(super) type Timer = (ObjectId, StateKey, u64);

/// What the root and the workers share for scaling and moves.
pub(super) struct Scaling {
    /// Shared with the timer filters of order-sensitive instances (`flow_timers.rs`).
    pub(super) alloc: Arc<Allocation>,
    /// Per slot (global index): the change (its number) whose settling the root asked of it
    /// (0: none yet), and the last it settled.
    asked: Vec<AtomicU64>,
    done: Vec<AtomicU64>,
    /// Per slot: timers handed to it, not taken over yet.
    timers: Vec<Mutex<Vec<Timer>>>,
    /// Per slot: the flows (split keys) it has received and not given up.
    flows: Vec<Mutex<HashSet<u64>>>,
    /// Per worker: instances added for it to run.
    inbox: Vec<Mutex<Vec<Slot>>>,
    inbox_len: AtomicUsize,
    /// Per slot: it serves flows (an instance it started with, or one added and not retired).
    serving: Vec<AtomicBool>,
    /// Per slot: packets in its queue (vertex managers scale on them).
    queue_packets: Vec<AtomicIsize>,
    rebuilder: Rebuilder,
    /// Per root: its oldest clock not finished or still logged, as it last said.
    lows: Vec<AtomicU64>,
}

impl Scaling {
    /// For `slots` global indices (the first `initial` serving) run by `workers` threads, fed
    /// by `roots` roots.
    pub(super) fn new(
        vertices: &[crate::plan::VertexPlan],
        (slots, initial): (usize, usize),
        (workers, roots): (usize, u8),
        rebuilder: Rebuilder,
    ) -> Scaling {
        Scaling {
            alloc: Arc::new(Allocation::new(vertices)),
            asked: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            done: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            timers: (0..slots).map(|_| Mutex::new(Vec::new())).collect(),
            flows: (0..slots).map(|_| Mutex::new(HashSet::new())).collect(),
            inbox: (0..workers.max(1)).map(|_| Mutex::new(Vec::new())).collect(),
            inbox_len: AtomicUsize::new(0),
            serving: (0..slots).map(|g| AtomicBool::new(g < initial)).collect(),
            queue_packets: (0..slots).map(|_| AtomicIsize::new(0)).collect(),
            rebuilder,
            lows: (0..roots.max(1)).map(|_| AtomicU64::new(1)).collect(),
        }
    }

    /// Whether global index `g` serves flows now.
    pub(super) fn serving(&self, g: usize) -> bool {
        self.serving.get(g).is_some_and(|s| s.load(Ordering::Acquire))
    }

    /// The instances vertex `v` has now.
    pub(super) fn members(&self, v: usize) -> usize {
        self.alloc.current(v).map_or(1, |e| e.members().count())
    }

    /// `n` packets went into (or, negative, out of) slot `g`'s queue.
    pub(super) fn queued(&self, g: usize, n: isize) {
        if let Some(q) = self.queue_packets.get(g) {
            q.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Root `id`'s oldest clock not finished or still logged is `low`.
    pub(super) fn set_low(&self, id: u8, low: u64) {
        if let Some(l) = self.lows.get(usize::from(id)) {
            l.store(low, Ordering::Release);
        }
    }

    /// Root `r`'s oldest clock not finished or still logged, as it last said.
    fn low(&self, r: usize) -> u64 {
        self.lows.get(r).map_or(u64::MAX, |l| l.load(Ordering::Acquire))
    }

    /// Instances added for worker `w` since it last looked.
    pub(super) fn take_inbox(&self, w: usize) -> Vec<Slot> {
        if self.inbox_len.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let taken = self.inbox.get(w).and_then(|b| b.lock().ok()).map(|mut b| std::mem::take(&mut *b));
        let taken = taken.unwrap_or_default();
        self.inbox_len.fetch_sub(taken.len(), Ordering::AcqRel);
        taken
    }
}

/// When the root makes a change: after `packet` packets entered (what fault schedules count),
/// with root 0 at sequence number `root0` and the last packet read stamped `entry`, `ms` into
/// the run.
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub(super) packet: u64,
    pub(super) root0: u64,
    pub(super) entry: u64,
    pub(super) ms: f64,
}

impl At {
    /// Now, for a run that began at `t0`: (`packet`, `root0`, `entry`).
    pub(super) fn now(counts: (u64, u64, u64), t0: Instant) -> At {
        At::with_ms(counts, t0.elapsed().as_secs_f64() * 1e3)
    }

    /// [`At::now`] with the time already read: `ms` into the run.
    pub(super) fn with_ms((packet, root0, entry): (u64, u64, u64), ms: f64) -> At {
        At { packet, root0, entry, ms }
    }

    /// Where a change made now takes effect.
    fn cut(&self, shared: &Shared) -> Cut {
        if shared.roots > 1 {
            Cut::Entry(self.entry)
        } else {
            Cut::Clock(self.root0)
        }
    }
}

/// A change waiting to settle.
struct Pending {
    vertex: usize,
    /// Its number ([`Allocation::change`]).
    change: u64,
    since: Cut,
    /// The instances that settle it: the members before and after.
    slots: Vec<usize>,
    asked: Option<Instant>,
    /// Per root: every clock of it before this one that the cut covers has gone through the
    /// vertex (at some point: a replay may count copies of one again, which the instances that
    /// processed it drop as duplicates).
    past_to: Vec<u64>,
    started: Instant,
    /// Its report entries.
    reports: Vec<usize>,
}

/// The root thread's side: changes applied and not settled yet.
#[derive(Default)]
pub(super) struct RootSide {
    pending: VecDeque<Pending>,
    /// Settled changes whose allocation before them is still kept for routing: (vertex,
    /// change, per root the first clock past its cut).
    kept: VecDeque<(usize, u64, Vec<u64>)>,
    /// Per vertex: the index the next added instance gets.
    next_index: Vec<u16>,
    /// Clones on trial.
    trials: Vec<Trial>,
}

impl RootSide {
    /// Adds an instance to vertex `v` (one of `instances` then): built from the store, handed to
    /// a worker, serving. Its global index.
    fn add_instance(&mut self, shared: &Shared, v: usize, instances: u16) -> Result<usize, String> {
        let (Some(sc), Some(vp)) = (&shared.scaling, shared.vertices.get(v)) else {
            return Err("the run cannot scale".into());
        };
        let index = self.next_index.get(v).copied().unwrap_or(0);
        let g = vp
            .global(index)
            .ok_or_else(|| format!("`{}` has used all {} instance indices kept for scaling", vp.name, index))?;
        let inst = sc.rebuilder.added(v, index, instances).map_err(|e| e.to_string())?;
        let slot = Slot::new(shared, g, v, inst);
        if let Some(mut b) = sc.inbox.get(g % sc.inbox.len().max(1)).and_then(|b| b.lock().ok()) {
            b.push(slot);
            sc.inbox_len.fetch_add(1, Ordering::AcqRel);
        }
        self.set_serving(shared, g, true);
        if let Some(i) = self.next_index.get_mut(v) {
            *i += 1;
        }
        Ok(g)
    }

    /// Marks instance `g` serving flows or not.
    fn set_serving(&self, shared: &Shared, g: usize, serving: bool) {
        if let Some(s) = shared.scaling.as_ref().and_then(|sc| sc.serving.get(g)) {
            s.store(serving, Ordering::Release);
        }
        if let Some(live) = &shared.live {
            live.set_serving(g, serving);
        }
    }

    /// Applies `r` to packets admitted from now on (`at`). An error says why it cannot be done.
    pub(super) fn apply(
        &mut self,
        shared: &Shared,
        r: &Reconfig,
        at: At,
        reports: &mut Vec<ReconfigReport>,
    ) -> Result<(), String> {
        let Some(sc) = &shared.scaling else { return Err("the run cannot scale".into()) };
        let v = r.vertex;
        let vp = shared.vertices.get(v).ok_or_else(|| format!("no vertex with index {v}"))?;
        let current = sc.alloc.current(v).ok_or_else(|| format!("no vertex with index {v}"))?;
        if self.next_index.len() < shared.vertices.len() {
            self.next_index = shared.vertices.iter().map(|x| x.instances.len() as u16).collect();
        }
        let members: Vec<NodeId> = current.splitter.members().to_vec();
        let flows: HashMap<NodeId, HashSet<u64>> = members
            .iter()
            .map(|m| (*m, sc.flows.get(m.0).and_then(|f| f.lock().ok()).map(|f| f.clone()).unwrap_or_default()))
            .collect();
        let mut splitter = current.splitter.clone();
        let n = members.len();
        let target = match r.change {
            Change::ScaleTo(t) => Some(usize::from(t)),
            Change::ScaleBy(d) => Some((n as i64 + i64::from(d)).max(0) as usize),
            Change::Move { .. } | Change::Clone { .. } => None,
        };
        let (kind, moved, givers) = match (target, r.change) {
            (Some(0), _) => return Err(format!("`{}` cannot scale to no instance", vp.name)),
            (Some(t), _) if t > n => {
                // All or nothing: instances added and then left without flows would serve none.
                let next = self.next_index.get(v).copied().unwrap_or(0);
                let kept = vp.instances.len() + vp.spares.len();
                if usize::from(next) + (t - n) > kept {
                    let left = kept.saturating_sub(usize::from(next));
                    return Err(format!(
                        "`{}` can add {left} more instances, not {} (at most {kept} indices are kept for scaling)",
                        vp.name,
                        t - n
                    ));
                }
                let mut added = Vec::new();
                for _ in n..t {
                    added.push(NodeId(self.add_instance(shared, v, t as u16)?));
                }
                splitter.scale_out(&added, |m| flows.get(&m));
                ("scale_out", 0, None)
            }
            (Some(t), _) if t < n => {
                let mut moved = 0;
                for (_, groups) in splitter.scale_in(t, |m| flows.get(&m)) {
                    for (to, keys) in groups {
                        moved += keys.len() as u64;
                        splitter.pin(&keys, to);
                    }
                }
                ("scale_in", moved, None)
            }
            (Some(_), _) => return Ok(()),
            (None, Change::Move { from, to, flows: most }) => {
                let (from_g, to_g) = (shared.member(v, from)?, shared.member(v, to)?);
                if from_g == to_g {
                    return Err(format!("a move of `{}`'s flows needs two instances, not {from} twice", vp.name));
                }
                let mut keys: Vec<u64> = flows
                    .get(&NodeId(from_g))
                    .into_iter()
                    .flatten()
                    .copied()
                    .filter(|k| current.owner(*k) == Some(from_g))
                    .collect();
                keys.sort_unstable();
                keys.truncate(most.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX)));
                splitter.pin(&keys, NodeId(to_g));
                ("move", keys.len() as u64, Some(vec![from_g]))
            }
            (None, Change::Clone { instance }) => {
                let straggler = shared.member(v, instance)?;
                let clone = self.add_instance(shared, v, n as u16)?;
                splitter.replace(NodeId(straggler), NodeId(clone));
                let before = ns_per_packet(shared, straggler, (0, 0));
                // Its change's number once made, below.
                self.trials.push(Trial {
                    vertex: v,
                    straggler,
                    clone,
                    change: u64::MAX,
                    before,
                    clone_from: None,
                    report: reports.len(),
                });
                let moved = flows.get(&NodeId(straggler)).map_or(0, |f| f.len() as u64);
                ("clone", moved, Some(vec![straggler]))
            }
            (None, _) => return Ok(()),
        };
        reports.push(ReconfigReport {
            kind: kind.into(),
            vertex: vp.name.to_string(),
            at_packet: at.packet,
            at_ms: at.ms,
            instances: (n, splitter.members().len()),
            flows: moved,
            settle_ms: 0.0,
            drain_ms: 0.0,
            trial: None,
        });
        let before: Vec<usize> = members.iter().map(|m| m.0).collect();
        let change = self.changed(shared, (v, at.cut(shared)), splitter, givers, reports.len() - 1, &before)?;
        if kind == "clone" {
            if let Some(t) = self.trials.last_mut() {
                t.change = change;
            }
        }
        Ok(())
    }

    /// Makes `splitter` vertex `v`'s allocation after cut `since` (report entry `report`;
    /// `givers` as [`Allocation::change`] takes them), to be settled by the members `before`
    /// and after it. The change's number.
    fn changed(
        &mut self,
        shared: &Shared,
        (v, since): (usize, Cut),
        splitter: sluice_chc::splitter::Splitter,
        givers: Option<Vec<usize>>,
        report: usize,
        before: &[usize],
    ) -> Result<u64, String> {
        let Some(sc) = &shared.scaling else { return Err("the run cannot scale".into()) };
        let after: Vec<usize> = splitter.members().iter().map(|m| m.0).collect();
        let change = sc.alloc.change(v, since, splitter, givers);
        let mut slots: Vec<usize> = before.iter().copied().chain(after).collect();
        slots.sort_unstable();
        slots.dedup();
        match self.pending.back_mut().filter(|p| p.vertex == v && p.change == change) {
            // Two changes at one cut are one (the allocation between them served no packet).
            Some(p) => {
                p.slots.extend(slots);
                p.slots.sort_unstable();
                p.slots.dedup();
                p.reports.push(report);
            }
            None => {
                let started = Instant::now();
                let reports = vec![report];
                let past_to = vec![0; usize::from(shared.roots.max(1))];
                let p = Pending { vertex: v, change, since, slots, asked: None, past_to, started, reports };
                self.pending.push_back(p);
            }
        }
        Ok(change)
    }

    /// Applies the changes asked through the control endpoint since the last look, from `at` on
    /// (the endpoint names instances by index, a change by position), and answers each.
    pub(super) fn take_live(&mut self, shared: &Shared, at: At, reports: &mut Vec<ReconfigReport>) {
        let Some(live) = shared.live.as_ref().filter(|_| shared.scaling.is_some()) else { return };
        for ((vertex, change), reply) in live.take_changes() {
            let by_position = |index: u16| {
                shared.position(vertex, index).ok_or_else(|| format!("instance {index} no longer serves flows"))
            };
            let change = match change {
                Change::Move { from, to, flows } => {
                    by_position(from).and_then(|from| Ok(Change::Move { from, to: by_position(to)?, flows }))
                }
                Change::Clone { instance } => by_position(instance).map(|instance| Change::Clone { instance }),
                c => Ok(c),
            };
            let made = reports.len();
            let r = change.map(|change| Reconfig { after: at.packet, vertex, change });
            match r.and_then(|r| self.apply(shared, &r, at, reports)) {
                Ok(()) => reply.done(Done { at_packet: Some(at.packet), change: reports.get(made).cloned() }),
                Err(e) => {
                    tracing::warn!(vertex, error = %e, "change asked through the control endpoint not made");
                    reply.refused(e);
                }
            }
        }
    }

    /// Applies the vertex managers' `policies` (vertex, policy) to the instances' queues and
    /// times per packet now, `at`: scale out or in, clone a straggler.
    pub(super) fn manage(
        &mut self,
        shared: &Shared,
        policies: &[(usize, ManagerPolicy)],
        at: At,
        reports: &mut Vec<ReconfigReport>,
    ) -> Result<(), String> {
        let Some(sc) = &shared.scaling else { return Ok(()) };
        for (v, policy) in policies {
            let Some(current) = sc.alloc.current(*v) else { continue };
            let loads: Vec<InstanceLoad> = current
                .members()
                .map(|g| InstanceLoad {
                    node: NodeId(g),
                    backlog: sc.queue_packets.get(g).map_or(0, |q| q.load(Ordering::Relaxed).max(0) as u64),
                    ns_per_packet: ns_per_packet(shared, g, (0, 0)),
                    cloning: self.trials.iter().any(|t| t.vertex == *v),
                })
                .collect();
            // One change of a vertex at a time, as the engine's managers wait for moves.
            let busy = self.pending.iter().any(|p| p.vertex == *v);
            for d in evaluate(policy, &loads, busy) {
                let change = match d {
                    Decision::ScaleTo(n) => Change::ScaleTo(n as u16),
                    Decision::Clone(node) => match current.members().position(|m| m == node.0) {
                        Some(instance) => Change::Clone { instance: instance as u16 },
                        None => continue,
                    },
                };
                self.apply(shared, &Reconfig { after: at.packet, vertex: *v, change }, at, reports)?;
            }
        }
        Ok(())
    }

    /// Settles what can be, and forgets allocations no packet follows any more: `low` is root
    /// 0's oldest clock not finished or still logged (the other roots say theirs).
    pub(super) fn serve(&mut self, shared: &Shared, low: u64, reports: &mut [ReconfigReport]) {
        let Some(sc) = &shared.scaling else { return };
        sc.set_low(0, low);
        let past = |firsts: &[u64]| firsts.iter().enumerate().all(|(r, first)| sc.low(r) >= *first);
        while let Some((v, change)) = self.kept.front().filter(|k| past(&k.2)).map(|k| (k.0, k.1)) {
            sc.alloc.forget(v, change);
            self.kept.pop_front();
        }
        if self.pending.is_empty() {
            return;
        }
        while let Some(p) = self.pending.front_mut() {
            if p.asked.is_none() {
                let mut past = true;
                for (r, past_to) in p.past_to.iter_mut().enumerate() {
                    past &= past_cut(shared, sc, (p.vertex, p.since), r, past_to);
                }
                if !past {
                    return;
                }
                for g in &p.slots {
                    if let Some(a) = sc.asked.get(*g) {
                        a.store(p.change, Ordering::Release);
                    }
                }
                p.asked = Some(Instant::now());
            }
            let done = |g: &usize| sc.done.get(*g).is_none_or(|d| d.load(Ordering::Acquire) >= p.change);
            if !p.slots.iter().all(done) {
                return;
            }
            sc.alloc.settled(p.vertex, p.change);
            self.kept.push_back((p.vertex, p.change, p.past_to.clone()));
            let members: Vec<usize> = sc.alloc.current(p.vertex).map(|e| e.members().collect()).unwrap_or_default();
            for g in p.slots.iter().filter(|g| !members.contains(g)) {
                if let Some(s) = sc.serving.get(*g) {
                    s.store(false, Ordering::Release);
                }
                if let Some(live) = &shared.live {
                    live.set_serving(*g, false);
                }
            }
            let ms = p.started.elapsed().as_secs_f64() * 1e3;
            let drain_ms = p.asked.map_or(0.0, |a| a.duration_since(p.started).as_secs_f64() * 1e3);
            for r in &p.reports {
                if let Some(r) = reports.get_mut(*r) {
                    r.settle_ms = ms;
                    r.drain_ms = drain_ms;
                }
            }
            self.pending.pop_front();
        }
    }

    /// The changes not settled yet, for a person: `vertex@clock (asked, n/m settled)`.
    pub(super) fn describe(&self, shared: &Shared) -> String {
        let Some(sc) = &shared.scaling else { return String::new() };
        let name = |v: usize| shared.vertices.get(v).map_or("?".to_string(), |x| x.name.to_string());
        let parts: Vec<String> = self
            .pending
            .iter()
            .map(|p| {
                let done =
                    p.slots.iter().filter(|g| sc.done.get(**g).is_some_and(|d| d.load(Ordering::Relaxed) >= p.change));
                let asked = if p.asked.is_some() { "asked" } else { "waiting for earlier clocks" };
                let n = (done.count(), p.slots.len());
                format!("{} change {} at {:?} ({asked}, {}/{} settled)", name(p.vertex), p.change, p.since, n.0, n.1)
            })
            .collect();
        parts.join(", ")
    }

    /// Whether a change has not settled yet (the run waits for it before ending).
    pub(super) fn busy(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// Whether every clock of root `r` that cut `since` covers has gone through vertex `v`
/// (finished, or held by recovering replacements past it), moving `past_to` (the first not
/// known to have) up. With several roots the cut is an entry time: a root's clocks are in
/// entry order, so its part ends at the first clock that entered later, once the root has
/// admitted everything that entered up to the cut.
fn past_cut(shared: &Shared, sc: &Scaling, (v, since): (usize, Cut), r: usize, past_to: &mut u64) -> bool {
    // Clocks still logged may have gone through: a change needs them past it, not deleted.
    *past_to = (*past_to).max(sc.low(r));
    let clock = |s: u64| Clock::new(r as u8, s);
    let gone = |s: u64| shared.clocks.finished(clock(s)) || shared.past_recovering(v, clock(s));
    match since {
        Cut::Clock(last) => {
            while *past_to <= last && gone(*past_to) {
                *past_to += 1;
            }
            *past_to > last
        }
        Cut::Entry(last) => {
            // Read in this order: a root publishes what it admitted before what it passed.
            let passed = shared.admissions.passed.get(r).map_or(0, |a| a.load(Ordering::Acquire));
            let admitted = shared.admissions.admitted.get(r).map_or(0, |a| a.load(Ordering::Acquire));
            loop {
                if *past_to > admitted || shared.clocks.entry(clock(*past_to)) > last {
                    return passed >= last;
                }
                if !gone(*past_to) {
                    return false;
                }
                *past_to += 1;
            }
        }
    }
}
