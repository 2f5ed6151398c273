//! Reconfiguration in the driver: flow moves, scaling, clone trials, vertex managers, cache
//! transitions and checkpoints. The core's splitter, moves and manager decide; the driver
//! builds and retires instances and flushes their clients.

use super::{client, store_err, Engine, EngineError, Episode, Item, Node, Queued};
use sluice_chc::manager::{evaluate, keep_clone, Decision, InstanceLoad, Trial};
use sluice_chc::moves::{Completed, Move, MoveId, MoveRepair, MoveStart};
use sluice_chc::NodeId;
use sluice_packet::InstanceId;
use sluice_runtime::plan::split_key_of_state;
use std::collections::{HashMap, HashSet};
use std::time::Instant;

impl Engine<'_> {
    /// Checkpoints, vertex managers and clone trials, evaluated as input arrives.
    pub(super) fn periodic(&mut self, count: u64) -> Result<(), EngineError> {
        // A write-ahead log half full of updates since the last checkpoint: a rebuild would
        // soon miss some. (Looked at every 64 packets: far fewer than half a log fills.)
        let wal_full = count.is_multiple_of(64)
            && self
                .nodes
                .iter_mut()
                .filter(|n| n.alive)
                .any(|n| client(&mut n.inst).is_some_and(|c| !c.wal_has_room()));
        // After a failover, once its replay has drained. A full log does not wait for that: a
        // straggler can keep a replay travelling for the rest of the run, and past the log's
        // capacity a rebuild would miss the oldest updates (checkpoints are safe while replays
        // travel, as the periodic ones are).
        let after_replay = self.checkpoint_due && self.root.replay_drained();
        if after_replay {
            self.checkpoint_due = false;
        }
        let periodic = self.cfg.checkpoint_every > 0 && count.is_multiple_of(self.cfg.checkpoint_every);
        if after_replay || wal_full || periodic {
            self.take_checkpoint()?;
        }
        if self.cfg.manager_every > 0 && count.is_multiple_of(self.cfg.manager_every) && !self.policies.is_empty() {
            self.manage(count)?;
        }
        self.check_replay_done();
        for t in self.trials.due(count) {
            self.end_trial(count, t)?;
        }
        Ok(())
    }

    pub(super) fn take_checkpoint(&mut self) -> Result<(), EngineError> {
        // Flush so the checkpoint and the clients' logs agree on what it contains.
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            n.inst.state().flush().map_err(store_err)?;
        }
        let cp = self.backend.checkpoint().map_err(store_err)?;
        for n in self.nodes.iter_mut().filter(|n| n.alive) {
            if let Some(c) = client(&mut n.inst) {
                c.checkpointed();
            }
        }
        self.checkpoint = Some(cp);
        self.report.stats.checkpoints += 1;
        Ok(())
    }

    pub(super) fn start_move(
        &mut self,
        count: u64,
        from: NodeId,
        to: NodeId,
        keys: Vec<u64>,
        retire_from: bool,
    ) -> Result<(), EngineError> {
        let v = self.node(from).map_or(usize::MAX, |n| n.vertex);
        if let Some(vx) = self.vertices.get_mut(v) {
            vx.splitter.pin(&keys, to);
        }
        self.report.episodes.push(Episode {
            kind: if retire_from { "scale_in".into() } else { "move".into() },
            at_packet: count,
            vertex: self.vertex_name(v),
            flows: keys.len() as u64,
            ..Episode::default()
        });
        let tag = self.report.episodes.len() - 1;
        if self.cfg.switches.move_protocol && self.vertices.get(v).is_some_and(|x| x.ordered) {
            return self.hand_over(tag, from, to, &keys, retire_from);
        }
        let m = Move { from, to, keys, retire_from, tag };
        let start = self.moves.start(m.clone(), self.cfg.switches.move_protocol);
        match start {
            MoveStart::Switched => {
                if let Some(n) = self.node_mut(to) {
                    n.gate.add_flows(&m.keys);
                }
                if retire_from {
                    self.retire(from)?;
                }
            }
            MoveStart::Barrier { id } | MoveStart::AfterMovesIn { id } => {
                if let Some(n) = self.node_mut(to) {
                    n.gate.hold_flows(&m.keys);
                }
                if matches!(start, MoveStart::Barrier { .. }) {
                    self.queue_barrier(from, id);
                }
                self.move_started.insert(id, (Instant::now(), self.now));
            }
        }
        Ok(())
    }

    /// Moves from or to `old` continue with `new` (its replacement, or its clone kept after a
    /// trial): a barrier `old` had queued goes at the end of `new`'s queue (once a recovering
    /// `new` has redone what the replay brings), and `new` holds the flows moving into `old`.
    pub(super) fn continue_moves(&mut self, old: NodeId, new: NodeId) {
        for repair in self.moves.replace(old, new) {
            match repair {
                MoveRepair::Barrier(id) => self.queue_barrier(new, id),
                MoveRepair::Hold(id) => {
                    let keys = self.moves.get(id).map(|m| m.keys.clone()).unwrap_or_default();
                    if let Some(n) = self.node_mut(new) {
                        n.gate.hold_flows(&keys);
                    }
                }
            }
        }
    }

    /// Puts the barrier of move `id` at the end of `from`'s queue: behind everything sent to it
    /// so far. While the root replays towards `from` (a replacement after a failure), the
    /// replay may still bring packets of the moved flows: the barrier then goes in once the
    /// replay, and the live packets held for it, are queued.
    fn queue_barrier(&mut self, from: NodeId, id: MoveId) {
        let now = self.now;
        let Some(n) = self.node_mut(from) else { return };
        if let Some(id) = n.gate.place_barrier(id) {
            n.queue.push_back(Queued { at: now, item: Item::Barrier(id) });
        }
    }

    /// A flow move at an order-sensitive vertex: the old instance hands the moved flows'
    /// packets it has not processed yet to the new one, flushes, and the new one serves them
    /// (the first of each flow marked `FIRST`) after the old one's last output of the flow.
    /// Waiting for a barrier behind packets of other flows could deadlock with the entry order
    /// (an earlier packet of a moved flow held at the new instance, the barrier behind a later
    /// one at the old). Same guarantees as the barrier: nothing lost, per-flow order kept.
    fn hand_over(
        &mut self,
        tag: usize,
        from: NodeId,
        to: NodeId,
        keys: &[u64],
        retire: bool,
    ) -> Result<(), EngineError> {
        let wall = Instant::now();
        let roots = self.root.roots();
        let Some(split) = self.node(from).and_then(|n| self.vertices.get(n.vertex)).map(|v| v.plan.split.clone())
        else {
            return Ok(());
        };
        let moved: std::collections::HashSet<u64> = keys.iter().copied().collect();
        let is_moved = |p: &sluice_packet::Packet| moved.contains(&sluice_runtime::plan::split_key(p, &split));
        let now = self.now;
        let Some(n) = self.nodes.get_mut(from.0) else { return Ok(()) };
        let mut stolen = Vec::new();
        for q in n.queue.take_all() {
            match q.item {
                Item::Packet(p) if is_moved(&p) => stolen.push(p),
                item => n.queue.push_back(Queued { at: q.at, item }),
            }
        }
        stolen.extend(n.gate.take_held(is_moved));
        for p in &stolen {
            n.pending.remove(sluice_chc::order::OrderKey::of(&p.meta, roots));
        }
        // Steps 5-6: the old instance's updates are at the store before anyone reads them.
        n.inst.state().flush().map_err(store_err)?;
        n.gate.forget_flows(keys);
        let after = now.max(self.flows_out_at(from, keys));
        self.hand_over_state(from, to, keys)?;
        self.collect_commits();
        // Replay copies aimed at `from` for these flows are `to`'s to process now: the ones
        // queued here, and (recorded) those still on their way.
        let (from_id, to_id) = (self.node(from).map(|n| n.inst.id()), self.node(to).map(|n| n.inst.id()));
        if let (Some(f), Some(t)) = (from_id, to_id) {
            if !self.root.replay_drained_to(f) {
                if let Some(vx) = self.node(from).map(|n| n.vertex).and_then(|v| self.vertices.get_mut(v)) {
                    vx.handed_over.push((f, moved.clone(), to));
                }
            }
            for p in stolen.iter_mut().filter(|p| p.meta.replay_target() == Some(f)) {
                self.root.retarget(p, t);
            }
        }
        let mut first = std::collections::HashSet::new();
        for mut p in stolen {
            let key = sluice_runtime::plan::split_key(&p, &split);
            if first.insert(key) {
                p.meta.flags.insert(sluice_packet::MetaFlags::FIRST);
            }
            if let Some(n) = self.node_mut(to) {
                n.released.insert(key, after);
            }
            self.enqueue(to, p, after, key);
        }
        if let Some(n) = self.node_mut(to) {
            n.gate.add_flows(keys);
            for k in keys {
                n.released.insert(*k, after);
            }
        }
        if let Some(ep) = self.report.episodes.get_mut(tag) {
            ep.wall_us = wall.elapsed().as_secs_f64() * 1e6;
            ep.detail = "handed over with their queued packets (order-sensitive NF)".into();
        }
        if retire {
            self.retire(from)?;
        }
        Ok(())
    }

    /// When the last packet of `keys` that `from` (or its clone, while they take turns on a
    /// flow) has processed leaves it: a moved flow's next packet starts after that. The
    /// barrier alone does not tell: the straggler skips packets its clone has decided, and the
    /// clone's outputs of a flow are timed after the straggler's previous one.
    fn flows_out_at(&self, from: NodeId, keys: &[u64]) -> u64 {
        let busy = self.node(from).map_or(0, |n| n.busy_until);
        let Some(vx) = self.node(from).and_then(|n| self.vertices.get(n.vertex)) else { return busy };
        keys.iter().filter_map(|k| vx.flow_out.get(k)).fold(busy, |t, f| t.max(*f))
    }

    /// After a move: the old instance drops its copies of the moved flows' per-flow state (a
    /// stale copy must not come back in a store rebuild) and the new one takes over their
    /// timers (the old one would fire them for flows it no longer serves, or never, if it goes).
    fn hand_over_state(&mut self, from: NodeId, to: NodeId, keys: &[u64]) -> Result<(), EngineError> {
        let Some(split) = self.node(from).and_then(|n| self.vertices.get(n.vertex)).map(|v| v.plan.split.clone())
        else {
            return Ok(());
        };
        let moved: std::collections::HashSet<u64> = keys.iter().copied().collect();
        let is_moved = |k: &sluice_state::StateKey| split_key_of_state(k, &split).is_some_and(|sk| moved.contains(&sk));
        let Some(n) = self.node_mut(from) else { return Ok(()) };
        // Copies keyed by a flow the old instance does not serve (an LB's backend-side mapping
        // of a moved connection) go too: the new instance may delete the value.
        let served = n.gate.flows().clone();
        let foreign =
            |k: &sluice_state::StateKey| split_key_of_state(k, &split).is_some_and(|sk| !served.contains(&sk));
        let timers = client(&mut n.inst).map(|c| {
            c.forget_foreign(foreign);
            c.hand_over(is_moved)
        });
        self.take_over_timers(to, timers.unwrap_or_default())
    }

    /// `node` arms `timers` from now on (and tells the store).
    fn take_over_timers(
        &mut self,
        node: NodeId,
        timers: Vec<(sluice_state::ObjectId, sluice_state::StateKey, u64)>,
    ) -> Result<(), EngineError> {
        if timers.is_empty() {
            return Ok(());
        }
        let Some(n) = self.node_mut(node) else { return Ok(()) };
        if let Some(c) = client(&mut n.inst) {
            c.take_over_timers(&timers);
        }
        // The store hears of them with the next batch: send it now.
        n.inst.begin_batch();
        n.inst.end_batch();
        n.inst.state().flush().map_err(store_err)
    }

    /// The old instance processed everything sent before the move: it flushes, and the new
    /// instance takes the flows over.
    pub(super) fn barrier_passed(&mut self, id: MoveId) -> Result<(), EngineError> {
        let Some(Completed { moved: m, barriers_due }) = self.moves.complete(id) else { return Ok(()) };
        if let Some(n) = self.node_mut(m.from) {
            // Steps 5-6: the old instance's updates are at the store before anyone reads them.
            n.inst.state().flush().map_err(store_err)?;
            n.gate.forget_flows(&m.keys);
        }
        self.hand_over_state(m.from, m.to, &m.keys)?;
        self.collect_commits();
        let now = self.now.max(self.flows_out_at(m.from, &m.keys));
        let twin = self.node(m.to).and_then(|n| self.vertices.get(n.vertex)).and_then(|v| v.splitter.clone_of(m.to));
        let roots = self.root.roots();
        for to in std::iter::once(m.to).chain(twin) {
            let Some(n) = self.node_mut(to) else { continue };
            // Step 7: the held packets go first, the first of each flow marked as such.
            let mut held = Vec::new();
            for k in &m.keys {
                // Packets of the flow that reach the new instance later still start after the
                // old instance's last one left, held here or not.
                n.released.insert(*k, now);
                held.extend(n.gate.release_flow(*k));
            }
            // At the front of the queue, in entry order: they were sent to this instance before
            // what it queued while they were held (a barrier of a later move from it included),
            // and the flows' timers it took over must not fire on the later packets' time first.
            held.sort_by_key(|p| sluice_chc::order::OrderKey::of(&p.meta, roots));
            for p in held.into_iter().rev() {
                n.queue.push_front(Queued { at: now, item: Item::Packet(p) });
            }
        }
        if let (Some(ep), Some((sw, sv))) = (self.report.episodes.get_mut(m.tag), self.move_started.remove(&id)) {
            ep.wall_us = sw.elapsed().as_secs_f64() * 1e6;
            ep.virtual_us = now.saturating_sub(sv) as f64 / 1e3;
        }
        if m.retire_from {
            self.retire(m.from)?;
        }
        // Moves away from the new instance that waited for this one can put their barrier in:
        // the packets released above are ahead of it.
        for (from, due) in barriers_due {
            self.queue_barrier(from, due);
        }
        Ok(())
    }

    /// CHC's cache transitions for cross-flow objects: an instance caches its vertex's shared
    /// objects (write-through) only while it is the vertex's only live instance. When a second
    /// one appears (scale-out, clone) the first stops caching and flushes before anyone else
    /// reads; when one is left it caches again, from what the store holds.
    pub(super) fn refresh_sharing(&mut self, v: usize) -> Result<(), EngineError> {
        let Some(vx) = self.vertices.get(v) else { return Ok(()) };
        let shared: Vec<sluice_state::ObjectId> = sluice_state::cached_while_alone(&vx.decls).collect();
        if shared.is_empty() {
            return Ok(());
        }
        let users = self.nodes.iter().filter(|n| n.alive && n.vertex == v).count();
        let exclusive = users == 1;
        for n in self.nodes.iter_mut().filter(|n| n.alive && n.vertex == v) {
            for &o in &shared {
                n.inst.state().set_exclusive(o, exclusive);
            }
            if !exclusive {
                n.inst.state().flush().map_err(store_err)?;
            }
        }
        Ok(())
    }

    /// Takes a node out of service cleanly (its updates flushed, what it still queued done).
    pub(super) fn retire(&mut self, node: NodeId) -> Result<(), EngineError> {
        let Some(n) = self.nodes.get_mut(node.0) else { return Ok(()) };
        n.inst.state().flush().map_err(store_err)?;
        // Timers it still arms (cross-flow ones, or a trial's loser's) go to an instance that
        // stays.
        let timers = client(&mut n.inst).map(|c| c.hand_over(|_| true)).unwrap_or_default();
        let v = n.vertex;
        let heir = self.vertices.get(v).and_then(|x| x.splitter.members().iter().copied().find(|m| *m != node));
        if let Some(h) = heir.filter(|h| self.alive(*h)) {
            self.take_over_timers(h, timers)?;
        }
        let Some(n) = self.nodes.get_mut(node.0) else { return Ok(()) };
        // Its acknowledged updates count for the XOR check before it goes.
        n.inst.state().take_commits(&mut self.commits);
        n.alive = false;
        let marks = n.clone_marks();
        let id = n.inst.id();
        let leftover = n.drain();
        let v = n.vertex;
        if let Some(vx) = self.vertices.get_mut(v) {
            vx.splitter.end_trial(node);
        }
        self.collect_commits();
        let now = self.now;
        for p in sluice_chc::failover::instance_retired(&mut self.root, id, leftover) {
            self.deliver(sluice_runtime::plan::Target::Vertex(v), p, now);
        }
        for c in marks {
            self.straggler_caught_up(c);
        }
        // Its write-ahead log goes with it: checkpoint now, so a store rebuild never needs it.
        self.take_checkpoint()?;
        self.refresh_sharing(v)
    }

    pub(super) fn scale(&mut self, count: u64, v: usize, target: usize) -> Result<(), EngineError> {
        let current = self.vertices.get(v).map_or(0, |x| x.splitter.members().len());
        if target > current {
            self.scale_out(count, v, current, target)
        } else if target < current {
            self.scale_in(count, v, target)
        } else {
            Ok(())
        }
    }

    fn scale_out(&mut self, count: u64, v: usize, current: usize, target: usize) -> Result<(), EngineError> {
        let wall = Instant::now();
        let mut added = Vec::new();
        for _ in current..target {
            let index = self.vertices.get(v).map_or(0, |x| x.next_index);
            let inst = self.build(v, index, target as u16)?;
            let mut n = Node::new(v, index, inst, false, self.root.roots());
            n.busy_until = self.now;
            added.push(self.add_node(n));
            if let Some(x) = self.vertices.get_mut(v) {
                x.next_index += 1;
            }
        }
        // Existing flows stay where they are: the splitter pins each to its instance.
        if let Some(x) = self.vertices.get_mut(v) {
            let nodes = &self.nodes;
            x.splitter.scale_out(&added, |m| nodes.get(m.0).map(|n| n.gate.flows()));
        }
        self.refresh_sharing(v)?;
        self.report.episodes.push(Episode {
            kind: "scale_out".into(),
            at_packet: count,
            vertex: self.vertex_name(v),
            wall_us: wall.elapsed().as_secs_f64() * 1e6,
            detail: format!("{current} -> {target} instances; no flow moved"),
            ..Episode::default()
        });
        Ok(())
    }

    /// Removes the last instances; only their flows move.
    fn scale_in(&mut self, count: u64, v: usize, target: usize) -> Result<(), EngineError> {
        let Some(x) = self.vertices.get_mut(v) else { return Ok(()) };
        let clones: Vec<NodeId> = x.splitter.members()[target.min(x.splitter.members().len())..]
            .iter()
            .filter_map(|m| x.splitter.clone_of(*m))
            .collect();
        let removed = x.splitter.members().get(target..).unwrap_or_default().to_vec();
        let flows: HashMap<NodeId, HashSet<u64>> = removed
            .iter()
            .filter_map(|r| Some((*r, self.moves.flows_to_hand_over(*r, self.nodes.get(r.0)?.gate.flows()))))
            .collect();
        let plan = x.splitter.scale_in(target, |m| flows.get(&m));
        // Clones of a removed instance go with it.
        for c in clones {
            self.retire(c)?;
        }
        for (removed, groups) in plan {
            // Without flows of its own it goes now, or, with flows still on their way out,
            // once their barriers passed.
            if groups.is_empty() && !self.moves.retire_when_moved_out(removed) {
                self.retire(removed)?;
            }
            let last = groups.len().saturating_sub(1);
            for (i, (to, keys)) in groups.into_iter().enumerate() {
                self.start_move(count, removed, to, keys, i == last)?;
            }
            self.refresh_sharing(v)?;
        }
        Ok(())
    }

    pub(super) fn clone_instance(&mut self, count: u64, node: NodeId) -> Result<(), EngineError> {
        let Some((vertex, flows, straggler_index, busy)) =
            self.node(node).map(|n| (n.vertex, n.gate.flows().clone(), n.index, n.busy_until))
        else {
            return Ok(());
        };
        if self.vertices.get(vertex).is_some_and(|x| x.splitter.clone_of(node).is_some()) {
            return Ok(());
        }
        let wall = Instant::now();
        let index = self.vertices.get(vertex).map_or(0, |x| x.next_index);
        if let Some(x) = self.vertices.get_mut(vertex) {
            x.next_index += 1;
        }
        let instances = self.vertices.get(vertex).map_or(1, |x| x.splitter.members().len()) as u16 + 1;
        // The clone starts from the store: everything the straggler did is there first. From
        // now on both serve the same flows, and each forgets its copies of what the other writes.
        if let Some(c) = self.node_mut(node).and_then(|n| client(&mut n.inst)) {
            sluice_state::StateHandle::flush(c).map_err(store_err)?;
            c.track_written(true);
        }
        let mut inst = self.build(vertex, index, instances)?;
        if let Some(c) = client(&mut inst) {
            c.track_written(true);
        }
        // The clone takes over the straggler's timers too (from the store's copy).
        sluice_runtime::plan::adopt_timers(
            self.backend.as_ref(),
            &mut inst,
            InstanceId::new(vertex as u16, straggler_index),
        )?;
        let id = inst.id();
        let mut c = Node::new(vertex, index, inst, true, self.root.roots());
        c.gate.inherit_flows(flows);
        // Flows moving into the straggler are held at the clone too, until the old instance's
        // barrier passes: the twins share the straggler's flows.
        c.gate.hold_flows(&self.moves.moving_into(node));
        // After the straggler's batch in progress, whose packets are still leaving.
        c.busy_until = self.now.max(busy);
        let clone = self.add_node(c);
        if let Some(x) = self.vertices.get_mut(vertex) {
            x.splitter.add_clone(node, clone);
        }
        self.refresh_sharing(vertex)?;
        self.replay_episode("clone", count, vertex, id, wall, String::new());
        self.mark_clone_start(node, clone);
        self.trials.start(Trial { straggler: node, clone, until: count + self.cfg.clone_trial });
        self.check_replay_done();
        Ok(())
    }

    /// When the straggler holds packets the replay to its clone does not carry (the root or the
    /// store lost their log entries), the clone would overtake them on their flows, with live
    /// packets or with the newer packets its replay brings: it serves nothing, and stays
    /// recovering, until the straggler has processed them.
    fn mark_clone_start(&mut self, straggler: NodeId, clone: NodeId) {
        let Some(c) = self.node(clone) else { return };
        let Some(s) = self.node(straggler) else { return };
        let decided = self.vertices.get(s.vertex).map(|v| &v.decided);
        let uncovered = |p: &sluice_packet::Packet| {
            !c.gate.covers(p.meta.clock) && !decided.is_some_and(|d| d.contains(p.meta.clock))
        };
        let queued = s.queue.iter().any(|q| matches!(&q.item, Item::Packet(p) if uncovered(p)));
        if !queued && !s.gate.held_any(uncovered) {
            return;
        }
        let now = self.now;
        if let Some(s) = self.node_mut(straggler) {
            s.queue.push_back(Queued { at: now, item: Item::CloneStart(clone) });
        }
        if let Some(c) = self.node_mut(clone) {
            c.gate.wait_for_straggler();
        }
    }

    /// The straggler passed its clone's start mark (or is gone): the clone serves from now on
    /// (after the straggler's last output), and its recovery may end.
    pub(super) fn straggler_caught_up(&mut self, clone: NodeId) {
        let after =
            self.node(clone).and_then(|c| self.vertices.get(c.vertex)).and_then(|v| v.splitter.straggler_of(clone));
        let after = after.and_then(|s| self.node(s)).map_or(self.now, |s| s.busy_until.max(self.now));
        if let Some(c) = self.node_mut(clone) {
            c.gate.straggler_passed();
            c.busy_until = c.busy_until.max(after);
        }
        self.check_replay_done();
    }

    fn load(&self, node: NodeId) -> InstanceLoad {
        let n = self.node(node);
        InstanceLoad {
            node,
            backlog: n.map_or(u64::MAX, Node::backlog),
            ns_per_packet: n.map_or(f64::MAX, |n| n.busy_ns as f64 / n.processed.max(1) as f64),
            cloning: n.and_then(|n| self.vertices.get(n.vertex)).is_some_and(|v| v.splitter.clone_of(node).is_some()),
        }
    }

    /// Keeps the faster of a straggler and its clone.
    fn end_trial(&mut self, count: u64, t: Trial) -> Result<(), EngineError> {
        if !self.alive(t.clone) {
            return Ok(());
        }
        if !self.alive(t.straggler) {
            // The straggler is gone: the clone is just a clone of nothing.
            return self.retire(t.clone);
        }
        if self.node(t.clone).is_some_and(|c| c.gate.waits_for_straggler()) {
            // The straggler still holds packets only it has: the trial goes on.
            self.trials.start(Trial { until: count + 1, ..t });
            return Ok(());
        }
        let (s, c) = (self.load(t.straggler), self.load(t.clone));
        let kept_clone = keep_clone(&s, &c);
        let (keep, drop) = if kept_clone { (t.clone, t.straggler) } else { (t.straggler, t.clone) };
        let v = self.node(keep).map_or(usize::MAX, |n| n.vertex);
        if let Some(vx) = self.vertices.get_mut(v) {
            vx.flow_out.clear();
            vx.splitter.end_trial(t.straggler);
            if kept_clone {
                vx.splitter.replace(t.straggler, t.clone);
            }
        }
        if let Some(c) = self.node_mut(keep).and_then(|n| client(&mut n.inst)) {
            c.track_written(false);
        }
        if kept_clone {
            // Moves from or to the straggler continue with the clone, which has the same flows
            // queued: the barrier goes behind what it holds.
            self.continue_moves(t.straggler, t.clone);
        }
        // The twins took turns on flows until now: the one kept emits a flow's next packet only
        // after the retired one's last.
        let drop_busy = self.node(drop).map_or(0, |n| n.busy_until);
        if let Some(n) = self.node_mut(keep) {
            n.busy_until = n.busy_until.max(drop_busy);
        }
        self.retire(drop)?;
        let (kept, other) = if kept_clone { (("clone", c), ("original", s)) } else { (("original", s), ("clone", c)) };
        self.report.episodes.push(Episode {
            kind: "retire".into(),
            at_packet: count,
            vertex: self.vertex_name(v),
            detail: format!(
                "kept the {} ({:.0} ns/packet) over the {} ({:.0} ns/packet)",
                kept.0, kept.1.ns_per_packet, other.0, other.1.ns_per_packet
            ),
            ..Episode::default()
        });
        Ok(())
    }

    /// Vertex managers: aggregate per-instance statistics and apply the operator's policies.
    fn manage(&mut self, count: u64) -> Result<(), EngineError> {
        for p in self.policies.clone() {
            let Ok(v) = self.vertex_index(count, &p.vertex) else { continue };
            let members = self.vertices.get(v).map(|x| x.splitter.members().to_vec()).unwrap_or_default();
            let loads: Vec<InstanceLoad> = members
                .iter()
                .map(|&m| InstanceLoad { backlog: self.node(m).map_or(0, |n| n.queue.len() as u64), ..self.load(m) })
                .collect();
            for d in evaluate(&p.manager(), &loads, self.moves.busy()) {
                match d {
                    Decision::ScaleTo(n) => self.scale(count, v, n)?,
                    Decision::Clone(m) => self.clone_instance(count, m)?,
                }
            }
        }
        Ok(())
    }
}
