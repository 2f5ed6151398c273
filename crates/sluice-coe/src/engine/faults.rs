//! Faults and their recovery in the driver: instance, root and store crashes, and the replay
//! episodes that follow. The core decides (what the root replays, what the store rebuild
//! contains, where moves continue); the driver builds instances and talks to the store.

use super::{client, store_err, Engine, EngineError, Episode, LogPlace, Node};
use crate::schedule::{Action, ScaleTo};
use sluice_chc::failover::{instance_failed, Loss};
use sluice_chc::gate::Decided;
use sluice_chc::recovery::plan_store_rebuild;
use sluice_chc::NodeId;
use sluice_nf::Instance;
use sluice_packet::InstanceId;
use sluice_runtime::plan::{build_instance, Target};
use std::collections::HashSet;
use std::time::Instant;

impl Engine<'_> {
    /// Applies the faults of one point, in schedule order, except that failures at one point
    /// happen together: the instances crashing with the store are gone before it is rebuilt
    /// (their failover cannot checkpoint, the rebuild lacks their write-ahead logs), whatever
    /// the order they are written in, and the roots crashing with it do not write back the
    /// log entries it lost.
    pub(super) fn apply_together(&mut self, count: u64, actions: &[&Action]) -> Result<(), EngineError> {
        let store = actions.iter().any(|a| matches!(a, Action::CrashStore));
        if store {
            // Roots failing with the store cannot write back the log entries it loses.
            self.roots_failing = actions
                .iter()
                .filter_map(|a| match a {
                    Action::CrashRoot { root } => Some(*root),
                    _ => None,
                })
                .collect();
        }
        let applied = self.apply_nf_crashes_first(count, actions);
        self.roots_failing.clear();
        applied
    }

    /// The actions of one point, the NF crashes before a store crash among them.
    fn apply_nf_crashes_first(&mut self, count: u64, actions: &[&Action]) -> Result<(), EngineError> {
        let is_crash = |a: &&Action| matches!(a, Action::Crash { .. });
        let store = actions.iter().position(|a| matches!(a, Action::CrashStore));
        let last_crash = actions.iter().rposition(is_crash);
        let Some((store, last_crash)) = store.zip(last_crash) else {
            return actions.iter().try_for_each(|a| self.apply(count, a));
        };
        let split = last_crash.max(store) + 1;
        let (first, rest) = actions.split_at(split.min(actions.len()));
        for a in first.iter().filter(|a| !matches!(a, Action::CrashStore)) {
            self.store_failing = is_crash(a);
            let applied = self.apply(count, a);
            self.store_failing = false;
            applied?;
        }
        self.apply(count, &Action::CrashStore)?;
        rest.iter().try_for_each(|a| self.apply(count, a))
    }

    /// Applies one fault-schedule action.
    pub(super) fn apply(&mut self, count: u64, action: &Action) -> Result<(), EngineError> {
        match action {
            Action::Crash { vertex, instance } => {
                let node = self.find(count, vertex, *instance)?;
                self.crash(count, node)
            }
            Action::CrashRoot { root } => self.crash_root(count, *root),
            Action::CrashStore => self.crash_store(count),
            Action::Scale { vertex, to } => {
                let v = self.vertex_index(count, vertex)?;
                let now = self.vertices.get(v).map_or(0, |x| x.splitter.members().len()) as i64;
                let target = match to {
                    ScaleTo::Exactly(n) => i64::from(*n),
                    ScaleTo::By(d) => now + i64::from(*d),
                };
                self.scale(count, v, target.clamp(1, 64) as usize)
            }
            Action::Move { vertex, from, to, flows } => {
                let a = self.find(count, vertex, *from)?;
                let b = self.find(count, vertex, *to)?;
                let mut keys: Vec<u64> =
                    self.node(a).map(|n| n.gate.flows().iter().copied().collect()).unwrap_or_default();
                keys.sort_unstable();
                keys.truncate(flows.map_or(usize::MAX, |f| f as usize));
                self.start_move(count, a, b, keys, false)
            }
            Action::Slow { vertex, instance, delay_us } => {
                let node = self.find(count, vertex, *instance)?;
                if let Some(n) = self.node_mut(node) {
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

    pub(super) fn vertex_index(&self, count: u64, name: &str) -> Result<usize, EngineError> {
        self.vertices
            .iter()
            .position(|v| &*v.plan.name == name)
            .ok_or_else(|| EngineError::Fault { at: count, msg: format!("no vertex `{name}`") })
    }

    /// The live node holding slot `instance` of `vertex`.
    fn find(&self, count: u64, vertex: &str, instance: u16) -> Result<NodeId, EngineError> {
        let v = self.vertex_index(count, vertex)?;
        let members = self.vertices.get(v).map_or(&[][..], |x| x.splitter.members());
        members.get(usize::from(instance)).copied().ok_or_else(|| EngineError::Fault {
            at: count,
            msg: format!("vertex `{vertex}` has {} instance(s) at this point, no instance {instance}", members.len()),
        })
    }

    pub(super) fn build(&mut self, vertex: usize, index: u16, instances: u16) -> Result<Instance, EngineError> {
        Ok(build_instance(self.chain, self.registry, &self.labels, vertex, index, instances, &self.state)?)
    }

    /// A new node; its id in the core.
    pub(super) fn add_node(&mut self, mut n: Node) -> NodeId {
        if self.vertices.get(n.vertex).is_some_and(|v| v.ordered) {
            n.gate.take_in_entry_order();
        }
        self.nodes.push(n);
        NodeId(self.nodes.len() - 1)
    }

    fn crash(&mut self, count: u64, node: NodeId) -> Result<(), EngineError> {
        let wall = Instant::now();
        let Some(n) = self.node_mut(node) else { return Ok(()) };
        n.alive = false;
        // Clones waiting for what it held: that is lost now, and replayed only if logged.
        let marks = n.clone_marks();
        let lost = n.drain();
        let unlogged = client(&mut n.inst).map_or(0, |c| c.wal_since_checkpoint());
        let (vertex, index, flows, busy_until) = (n.vertex, n.index, n.gate.flows().clone(), n.busy_until);
        let no_clocks = Decided::default();
        let decided = self.vertices.get(vertex).map_or(&no_clocks, |v| &v.decided);
        let failed = InstanceId::new(vertex as u16, index);
        let Loss { beyond_replay, resend } = instance_failed(&mut self.root, decided, failed, &lost);
        if beyond_replay > 0 {
            self.report.stats.unrecoverable.push(format!(
                "packet {count}: instance {index} of `{}` failed with {beyond_replay} packet(s) whose log entries were lost in a root or store crash (an NF failing with the holder of the log)",
                self.vertex_name(vertex).unwrap_or_default()
            ));
        }
        if self.store_failing {
            // The store fails with it: no checkpoint now, and the rebuild needs the updates
            // this instance logged since the last one, which are gone with it.
            if unlogged > 0 {
                self.report.stats.unrecoverable.push(format!(
                    "packet {count}: the store and instance {index} of `{}` failed together; the store's rebuild lacks the {unlogged} update(s) it logged since the last checkpoint",
                    self.vertex_name(vertex).unwrap_or_default()
                ));
            }
        } else {
            // The failed instance's write-ahead log is gone: checkpoint now, so a store rebuild
            // never needs it (what it had sent is in the store; what it had not, the replay
            // redoes and the replacement logs).
            self.take_checkpoint()?;
        }
        // The replacement takes the failed instance's id: the store attaches its per-flow
        // state and timers to it.
        let instances = self.vertices.get(vertex).map_or(1, |v| v.splitter.members().len()) as u16;
        let mut inst = self.build(vertex, index, instances)?;
        let id = inst.id();
        sluice_runtime::plan::adopt_timers(self.backend.as_ref(), &mut inst, id)?;
        let mut fresh = Node::new(vertex, index, inst, true, self.root.roots());
        fresh.gate.inherit_flows(flows);
        // The engine serves a batch at once and schedules its outputs while the batch runs in
        // virtual time: the failure is after that batch, and the replacement starts then.
        fresh.busy_until = self.now.max(busy_until);
        let new = self.add_node(fresh);
        if let Some(vx) = self.vertices.get_mut(vertex) {
            vx.splitter.replace(node, new);
        }
        self.trials.replace(node, new);
        // A straggler's clone may still be running beside the replacement (or the straggler
        // beside its clone's): the twin must hear of what the replacement writes and arms.
        if self.twin_of(new).is_some() {
            if let Some(c) = self.node_mut(new).and_then(|n| client(&mut n.inst)) {
                c.track_written(true);
            }
        }
        self.refresh_sharing(vertex)?;
        // Moves from or to the failed instance continue with its replacement; a barrier lost
        // with its queue goes in once the replacement has redone the moved flows' lost packets.
        self.continue_moves(node, new);
        let detail = format!("instance {index} failed with {} queued packet(s)", lost.len());
        self.replay_episode("crash", count, vertex, id, wall, detail);
        // Copies of another replay lost on their way to their target (two failures at once).
        self.report.stats.replayed += resend.len() as u64;
        for (input, p) in resend {
            self.enter(input, p);
        }
        for c in marks {
            if let Some(c) = self.node_mut(c) {
                c.gate.straggler_passed();
            }
        }
        self.check_replay_done();
        Ok(())
    }

    /// Replays the log towards `target` and records the episode, whose virtual time runs until
    /// the replay has drained.
    pub(super) fn replay_episode(
        &mut self,
        kind: &str,
        count: u64,
        vertex: usize,
        target: InstanceId,
        wall: Instant,
        detail: String,
    ) {
        let copies = self.root.replay_to(target);
        let replayed = copies.len() as u64;
        let roots = self.root.roots();
        let node = self.nodes.iter_mut().rev().find(|n| n.alive && n.inst.id() == target);
        if let Some(n) = node {
            n.gate.cover(copies.iter().map(|(_, p)| p), roots);
        }
        for (input, pkt) in copies {
            self.enter(input, pkt);
        }
        self.report.stats.replayed += replayed;
        self.report.episodes.push(Episode {
            kind: kind.into(),
            at_packet: count,
            vertex: self.vertex_name(vertex),
            wall_us: wall.elapsed().as_secs_f64() * 1e6,
            replayed,
            detail,
            ..Episode::default()
        });
        self.replay_episodes.push((self.report.episodes.len() - 1, self.now, target));
    }

    /// Releases a recovering node once no copy of the replay aimed at it is travelling.
    pub(super) fn check_replay_done(&mut self) {
        let now = self.now;
        for n in self.nodes.iter_mut().filter(|n| n.alive && n.gate.recovering()) {
            let drained = self.root.replay_drained_to(n.inst.id());
            if let Some(end) = n.gate.replay_drained(drained) {
                n.queue_recovery_end(now, end);
            }
        }
        let root = &self.root;
        let (done, waiting): (Vec<_>, Vec<_>) =
            self.replay_episodes.drain(..).partition(|(_, _, target)| root.replay_drained_to(*target));
        self.replay_episodes = waiting;
        if !done.is_empty() {
            self.checkpoint_due = true;
        }
        for (e, started, _) in done {
            if let Some(ep) = self.report.episodes.get_mut(e) {
                ep.virtual_us = now.saturating_sub(started) as f64 / 1e3;
            }
        }
    }

    fn crash_root(&mut self, count: u64, root: u8) -> Result<(), EngineError> {
        let wall = Instant::now();
        let lost_log = self.cfg.log_place == LogPlace::Root;
        let crash =
            self.root.crash(root, lost_log).map_err(|e| EngineError::Fault { at: count, msg: e.to_string() })?;
        let read_back = if lost_log { String::new() } else { self.reload_log("the new root")? };
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
            let Some(vx) = self.vertices.get_mut(v) else { continue };
            let nodes = &self.nodes;
            restored += vx.splitter.relearn(|m| nodes.get(m.0).map(|n| n.gate.flows()));
        }
        let roots = self.root.roots();
        self.report.episodes.push(Episode {
            kind: "crash_root".into(),
            at_packet: count,
            wall_us: wall.elapsed().as_secs_f64() * 1e6,
            flows: restored,
            detail: format!(
                "{}clock resumes at {}; {}",
                if roots > 1 { format!("root {root}: ") } else { String::new() },
                crash.resumed,
                if lost_log {
                    format!("{} logged packet(s) lost with the root's log", crash.logged)
                } else {
                    read_back
                }
            ),
            ..Episode::default()
        });
        Ok(())
    }

    /// Replaces the root's log by what the store holds (`LogPlace::Store`): after a root crash
    /// the new root has nothing else; after a store crash the store has only what its
    /// checkpoint kept.
    fn reload_log(&mut self, who: &str) -> Result<String, EngineError> {
        self.sync_deletes();
        let Some(sl) = &mut self.store_log else { return Ok(String::new()) };
        let r = sl.read_back(&self.backend, &mut self.root, |_| true).map_err(store_err)?;
        Ok(format!(
            "{who} read {} logged packet(s) back from the store ({} lost, {} already done)",
            r.kept,
            r.lost,
            r.stale.len()
        ))
    }

    fn crash_store(&mut self, count: u64) -> Result<(), EngineError> {
        let wall = Instant::now();
        let mut logs = Vec::new();
        let mut per_flow = Vec::new();
        let mut timers = Vec::new();
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            if let Some(c) = client(&mut n.inst) {
                let (given, stopped) = c.hand_over_for_rebuild();
                stopped.map_err(store_err)?;
                logs.push(given.log);
                per_flow.extend(given.per_flow);
                timers.extend(given.timers);
            }
        }
        let checkpoint = self.checkpoint.clone().unwrap_or_default();
        let decls: Vec<_> = self.vertices.iter().map(|v| v.decls.clone()).collect();
        let multi_root = self.root.roots() > 1;
        let root = &self.root;
        let entry_time = |c| if multi_root { root.entry_time(c) } else { 0 };
        let rebuild = plan_store_rebuild(&checkpoint, &mut logs, per_flow, &decls, &entry_time, &|c| root.is_logged(c));
        // Each vertex's custom operations, once.
        let mut seen = HashSet::new();
        let ops =
            self.nodes.iter().filter(|n| seen.insert(n.vertex)).map(|n| (n.vertex as u16, n.inst.nf().custom_ops()));
        let stats = sluice_store::recovery::rebuild(self.backend.as_ref(), &rebuild.plan, &timers, ops, rebuild.marks)
            .map_err(store_err)?;
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            let conn = self.backend.connect(n.inst.id()).map_err(store_err)?;
            if let Some(c) = client(&mut n.inst) {
                c.reconnect(conn).map_err(store_err)?;
            }
        }
        let mut detail = format!("{stats:?}");
        if let Some(sl) = &mut self.store_log {
            sl.reconnect(&self.backend).map_err(store_err)?;
            let written = self.write_log_back()?;
            detail = format!(
                "{detail}; the root's log: {written} entry(ies) written back, {}",
                self.reload_log("the root")?
            );
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

    /// After a store crash (`LogPlace::Store`): the rebuilt store holds the root's log only as
    /// far as its checkpoint, but every root that did not fail with it still has its entries:
    /// it writes back what the store lost, so a later root crash reads a whole log back and a
    /// later instance failure can still be replayed. Returns how many entries were written.
    fn write_log_back(&mut self) -> Result<u64, EngineError> {
        let Some(sl) = &mut self.store_log else { return Ok(0) };
        let failing = &self.roots_failing;
        sl.write_back(&self.backend, &self.root, |c| !failing.contains(&c.root())).map_err(store_err)
    }
}
