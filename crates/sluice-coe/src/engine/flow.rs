//! How a packet travels in the driver: admitted by the root, routed, placed by a splitter,
//! queued or held by an instance's gate, served in batches, and handed on or out.

use super::{client, store_err, Engine, EngineError, Item, Leaving, Node, Queued};
use crate::observed::Decision;
use crate::reference::drop_decision;
use sluice_chc::gate::{Arrival, Take, TakeContext};
use sluice_chc::order::OrderKey;
use sluice_chc::root::Admission;
use sluice_chc::NodeId;
use sluice_nf::{Instance, Verdict};
use sluice_packet::{Clock, MetaFlags, Packet, ParseStatus};
use sluice_runtime::plan::{direction, split_key, Routes, Target};

impl Engine<'_> {
    /// Input packet `input` reaches the root.
    pub(super) fn admit(&mut self, input: u64, original: &Packet) -> Result<(), EngineError> {
        if matches!(original.hdr().status, ParseStatus::Truncated | ParseStatus::Malformed) {
            self.report.stats.malformed += 1;
            self.report.observed.root_dropped.push(input);
            return Ok(());
        }
        let mut pkt = original.clone();
        if self.root.admit(input, &mut pkt, self.now) == Admission::LogFull {
            self.report.observed.root_dropped.push(input);
            return Ok(());
        }
        self.last_ts = self.last_ts.max(pkt.meta.ts_ns);
        self.sync_deletes();
        if let Some(sl) = &mut self.store_log {
            // Durable before it enters the chain.
            sl.write(input, &pkt).map_err(store_err)?;
        }
        self.enter(input, pkt);
        Ok(())
    }

    /// Sends a packet (or a replay copy) the root logged into the chain.
    pub(super) fn enter(&mut self, input: u64, pkt: Packet) {
        if self.traffic.as_ref().is_some_and(|f| !f.matches(&pkt)) {
            self.deliver(Target::Output, pkt, self.now);
            return;
        }
        let routes = self.entry[direction(&pkt, self.entry.len())].clone();
        self.route(&routes, pkt, self.now, "input", input);
    }

    /// Sends `pkt` along `routes` at time `at`.
    fn route(&mut self, routes: &Routes, pkt: Packet, at: u64, from: &str, input: u64) {
        for t in routes.mirror_targets(&pkt).collect::<Vec<_>>() {
            let mut copy = pkt.clone();
            // The original carries the vector of the updates so far; a copy starts empty so
            // that the root folds each update in once.
            copy.meta.xor = 0;
            self.root.copy_sent(&copy);
            self.deliver(t, copy, at + self.cfg.link_ns);
        }
        match routes.main_target(&pkt) {
            Some(t) => self.deliver(t, pkt, at + self.cfg.link_ns),
            None => {
                self.report.observed.decisions.push(drop_decision(input, from, "no-route"));
                self.root.copy_finished(&pkt);
            }
        }
    }

    /// A packet leaves the chain at `at`.
    fn leave(&mut self, pkt: Packet, at: u64) {
        if pkt.meta.replay_target().is_some() {
            // A replay copy that never met its target has nothing to deliver.
            self.root.copy_finished(&pkt);
            return;
        }
        let order = self.leaving.len() as u64;
        self.leaving.push(Leaving {
            at,
            order,
            ingress: pkt.meta.ingress_ns,
            clock: pkt.meta.clock,
            bytes: pkt.data().to_vec(),
            emitted: pkt.meta.flags.contains(MetaFlags::EMITTED),
        });
        if self.cfg.async_delete {
            // The root hears of it after it left: a crash before then replays it.
            self.late_deletes.push_back((at + self.cfg.link_ns, pkt));
        } else {
            // The root hears the packet is done before it leaves (synchronous delete): a
            // crash after this point cannot replay it into a duplicate.
            self.root.copy_left(&pkt);
        }
    }

    /// Puts `pkt` in the queue of the instance of `target` that serves it.
    pub(super) fn deliver(&mut self, target: Target, mut pkt: Packet, at: u64) {
        let v = match target {
            Target::Output => return self.leave(pkt, at),
            Target::Vertex(v) => v,
        };
        let replayed = pkt.meta.replay_target().is_some();
        if let Some(t) = pkt.meta.replay_target() {
            // Duplicate upstream processing is limited to the path towards the replay's
            // target: elsewhere the copy would make NFs that already processed this clock
            // run again against later state, for no output anyone needs.
            let toward = self.vertices.get(v).is_some_and(|x| x.reaches.get(usize::from(t.vertex())) == Some(&true));
            if !toward {
                self.root.copy_finished(&pkt);
                return;
            }
        }
        let Some(vx) = self.vertices.get(v) else { return };
        let key = split_key(&pkt, &vx.plan.split);
        if let Some(t) = pkt.meta.replay_target().filter(|t| usize::from(t.vertex()) == v) {
            // Its target handed the flow over while the replay travelled: the new owner takes it.
            let heir = vx.handed_over.iter().rev().find(|(from, keys, _)| *from == t && keys.contains(&key));
            if let Some(to) = heir.map(|(_, _, to)| *to).filter(|to| self.alive(*to)) {
                if let Some(to_id) = self.node(to).map(|n| n.inst.id()) {
                    self.root.retarget(&mut pkt, to_id);
                    return self.enqueue(to, pkt, at, key);
                }
            }
        }
        let hasher = sluice_runtime::plan::split_hasher();
        let place =
            vx.splitter.place(key, replayed, |n| sluice_runtime::plan::split_index(&pkt, &vx.plan.split, n, &hasher));
        let Some(place) = place else {
            self.root.copy_finished(&pkt);
            return;
        };
        let mut place = place;
        if let Some(t) = pkt.meta.replay_target().filter(|t| usize::from(t.vertex()) == v) {
            // At the target's own vertex a replay copy goes to the target (the slot's instance
            // or its clone, whichever it is) and nowhere else: a copy of another instance's flow
            // has nothing to do there, nor anywhere after.
            let is_t = |x: NodeId| self.node(x).is_some_and(|n| n.alive && n.inst.id() == t);
            // The target may be the old instance of a move of the flow still in progress, or
            // the clone of that instance: what was sent there before the move is still theirs
            // to redo (the clone mirrors its straggler, which the flow has not left yet). The
            // clone redoes only what its straggler still has: packets of the flow sent after the
            // move wait at the new instance, which must process them after the straggler's last.
            let order = OrderKey::of(&pkt.meta, self.root.roots());
            let leaving = || {
                let node = self.nodes.iter().rposition(|n| n.alive && n.vertex == v && n.inst.id() == t).map(NodeId)?;
                if self.moves.moving_out(node, key) {
                    return Some(node);
                }
                let straggler = vx.splitter.straggler_of(node).and_then(|s| self.node(s).map(|n| (s, n)));
                straggler
                    .is_some_and(|(s, n)| self.moves.moving_out(s, key) && n.pending.count(order) > 0)
                    .then_some(node)
            };
            let slot_index = |n| sluice_runtime::plan::split_index(&pkt, &vx.plan.split, n, &hasher);
            match vx.splitter.place_replay_at_target(key, slot_index, is_t, leaving) {
                Some(node) => place.node = node,
                None => {
                    self.root.copy_finished(&pkt);
                    return;
                }
            }
        }
        if let Some(c) = place.copy_to {
            // Live traffic of a straggler goes to its clone as well; like a mirror copy it
            // starts with an empty XOR vector so the root folds upstream updates in once.
            let mut copy = pkt.clone();
            copy.meta.xor = 0;
            self.root.copy_sent(&copy);
            self.enqueue(c, copy, at, key);
        }
        self.enqueue(place.node, pkt, at, key);
    }

    pub(super) fn enqueue(&mut self, node: NodeId, pkt: Packet, at: u64, key: u64) {
        let Some(n) = self.nodes.get_mut(node.0).filter(|n| n.alive) else {
            self.root.copy_finished(&pkt);
            return;
        };
        let order = OrderKey::of(&pkt.meta, self.root.roots());
        match n.gate.arrive(key, pkt) {
            Arrival::Queue(pkt) => {
                n.pending.add(order);
                let at = n.released.get(&key).map_or(at, |r| at.max(*r));
                n.queue.insert_by_time(at, Item::Packet(pkt));
            }
            Arrival::Held => n.pending.add(order),
            Arrival::Covered(pkt) => {
                self.report.stats.duplicates_suppressed += 1;
                self.root.copy_finished(&pkt);
            }
        }
    }

    /// Serves one batch at `node`; whether anything happened (an order-sensitive instance
    /// whose next packet must wait does nothing).
    pub(super) fn serve(&mut self, node: NodeId) -> Result<bool, EngineError> {
        let Some(n) = self.node(node) else { return Ok(false) };
        if n.gate.waits_for_straggler() {
            // Not even its replay: the straggler still holds older packets of the same flows.
            return Ok(false);
        }
        let Some(front) = n.queue.front().map(|q| n.busy_until.max(q.at)) else { return Ok(false) };
        let ordered = self.vertices.get(n.vertex).is_some_and(|v| v.ordered);
        let (batch, mark, suppressed, start) = if ordered {
            let (batch, suppressed, at) = self.take_in_order(node);
            // Packets are taken in entry order, not queue order: a mark passes once nothing
            // queued before it is left.
            let mark = self.nodes.get_mut(node.0).and_then(|n| match n.queue.front().map(|q| &q.item) {
                Some(Item::Barrier(_) | Item::CloneStart(_)) => n.queue.pop_front().map(|q| q.item),
                _ => None,
            });
            (batch, mark, suppressed, front.max(at).max(self.now))
        } else {
            let (batch, mark, suppressed) = self.take_batch(node, front);
            (batch, mark, suppressed, front)
        };
        let progress = suppressed || !batch.is_empty() || mark.is_some();
        let mut t = start;
        if !batch.is_empty() {
            if ordered {
                self.advance_siblings(node, &batch)?;
            }
            let twin = self.twin_of(node);
            if let Some(tw) = twin.and_then(|tw| self.nodes.get_mut(tw.0)) {
                // The twin's updates reach the store before this instance reads what they touched.
                tw.inst.state().flush().map_err(store_err)?;
            }
            t = self.process_batch(node, batch, start)?;
            if let Some(tw) = twin {
                self.share_with_twin(node, tw);
            }
        }
        if let Some(n) = self.node_mut(node) {
            n.busy_until = n.busy_until.max(t);
        }
        match mark {
            Some(Item::Barrier(m)) => self.barrier_passed(m)?,
            Some(Item::CloneStart(c)) => self.straggler_caught_up(c),
            _ => {}
        }
        Ok(progress)
    }

    /// After a batch of `node`, its twin (a straggler's clone, or the straggler) forgets its
    /// copies of the per-flow values `node` wrote and mirrors the timers `node` armed,
    /// cancelled or fired: the next packet of their shared flows may go to either.
    fn share_with_twin(&mut self, node: NodeId, twin: NodeId) {
        let Some(c) = self.node_mut(node).and_then(|n| client(&mut n.inst)) else { return };
        let (written, timers) = (c.take_written(), c.take_timer_changes());
        if let Some(c) = self.node_mut(twin).and_then(|n| client(&mut n.inst)) {
            c.forget_cached(&written);
            c.mirror_timers(&timers);
        }
    }

    /// Takes the packets ready at `start` from `node`'s queue, up to a batch or a barrier;
    /// duplicates are suppressed where they arrive, in arrival order. Returns the batch, the
    /// barrier reached, and whether any packet was suppressed.
    fn take_batch(&mut self, node: NodeId, start: u64) -> (Vec<Packet>, Option<Item>, bool) {
        let suppress = self.cfg.switches.duplicate_suppression;
        let roots = self.root.roots();
        let (mut batch, mut barrier, mut suppressed, mut deferred) = (Vec::new(), None, Vec::new(), Vec::new());
        let mut through = Vec::new();
        let Some(n) = self.nodes.get_mut(node.0) else { return (batch, barrier, false) };
        let Some(vx) = self.vertices.get(n.vertex) else { return (batch, barrier, false) };
        let is_clone = vx.splitter.straggler_of(node).is_some();
        let id = n.inst.id();
        while batch.len() < self.cfg.batch && n.queue.front().is_some_and(|q| q.at <= start) {
            let Some(q) = n.queue.pop_front() else { break };
            match q.item {
                Item::Packet(p) => {
                    n.pending.remove(OrderKey::of(&p.meta, roots));
                    let cx = take_context(vx, id, is_clone, &self.root, suppress, &p);
                    match n.gate.take(&p, &cx) {
                        Take::Suppress => suppressed.push(p),
                        Take::WaitForClock => deferred.push(p),
                        Take::PassThrough => through.push(p),
                        Take::Process { duplicate } => {
                            if duplicate {
                                *self.report.stats.duplicate_packets.entry(vx.plan.name.to_string()).or_default() += 1;
                            }
                            batch.push(p);
                        }
                    }
                }
                mark => {
                    barrier = Some(mark);
                    break;
                }
            }
        }
        self.report.stats.duplicates_suppressed += suppressed.len() as u64;
        for p in &suppressed {
            self.root.copy_finished(p);
        }
        let waited = !deferred.is_empty() || !through.is_empty();
        self.defer(node, deferred);
        for p in through {
            self.pass_through(node, p, start);
        }
        (batch, barrier, !suppressed.is_empty() || waited)
    }

    /// An order-sensitive instance takes its packets in entry order: duplicates are dropped
    /// first, and the next packet only once nothing earlier can still reach the vertex (queued
    /// or held at it or at any vertex leading to it). Returns a batch of at most one packet,
    /// whether any was suppressed, and when the packet taken arrived.
    fn take_in_order(&mut self, node: NodeId) -> (Vec<Packet>, bool, u64) {
        let suppress = self.cfg.switches.duplicate_suppression;
        let Some(v) = self.node(node).map(|n| n.vertex) else { return (Vec::new(), false, 0) };
        let mut suppressed = false;
        loop {
            let least = self.least_pending(v);
            let Some(n) = self.nodes.get_mut(node.0) else { break };
            let Some(vx) = self.vertices.get(v) else { break };
            let Some((key, slot)) = n.queue.least_packet() else { break };
            let is_clone = vx.splitter.straggler_of(node).is_some();
            let id = n.inst.id();
            let Some(Item::Packet(p)) = n.queue.get(slot).map(|q| &q.item) else { break };
            let cx = take_context(vx, id, is_clone, &self.root, suppress, p);
            // Only a packet to process waits for an earlier one elsewhere.
            if matches!(n.gate.peek_take(p, &cx), Take::Process { .. }) && least.is_some_and(|l| l < key) {
                break;
            }
            let Some(Queued { at, item: Item::Packet(p) }) = n.queue.remove(slot) else { break };
            n.pending.remove(key);
            match n.gate.take(&p, &cx) {
                Take::Suppress => {
                    suppressed = true;
                    self.report.stats.duplicates_suppressed += 1;
                    self.root.copy_finished(&p);
                }
                Take::WaitForClock => {
                    suppressed = true;
                    self.defer(node, vec![p]);
                }
                Take::PassThrough => {
                    suppressed = true;
                    let now = self.now;
                    self.pass_through(node, p, now.max(at));
                }
                Take::Process { duplicate } => {
                    if duplicate {
                        *self.report.stats.duplicate_packets.entry(vx.plan.name.to_string()).or_default() += 1;
                    }
                    return (vec![p], suppressed, at);
                }
            }
        }
        (Vec::new(), suppressed, 0)
    }

    /// A replay copy passing through on its way downstream leaves `node`'s vertex as the NF's
    /// first processing of its clock left it (recorded), carrying the replay's marks: the NF
    /// does not run again.
    fn pass_through(&mut self, node: NodeId, pkt: Packet, at: u64) {
        let Some(v) = self.node(node).map(|n| n.vertex) else { return };
        let Some((logged, verdict)) = self.vertices.get(v).and_then(|x| x.emitted.get(&pkt.meta.clock)).cloned() else {
            return self.root.copy_finished(&pkt);
        };
        let mut out = logged;
        out.meta.flags = pkt.meta.flags;
        out.meta.target = pkt.meta.target;
        out.meta.xor = pkt.meta.xor;
        out.meta.ingress_ns = pkt.meta.ingress_ns;
        self.hand_on(v, out, verdict, at + self.cfg.service_ns, false);
    }

    /// Replay copies passing through `node` wait until its vertex has processed their clock.
    /// They stay pending at `node`: an order-sensitive vertex downstream must not take a later
    /// packet before them (a replacement there would emit a flow's packets out of order).
    fn defer(&mut self, node: NodeId, copies: Vec<Packet>) {
        let roots = self.root.roots();
        let Some(n) = self.nodes.get_mut(node.0) else { return };
        let Some(vx) = self.vertices.get_mut(n.vertex) else { return };
        for p in copies {
            n.pending.add(OrderKey::of(&p.meta, roots));
            vx.awaiting.entry(p.meta.clock).or_default().push((node, p));
        }
    }

    /// The least entry-order key queued or held at vertex `v` or at any vertex leading to it.
    /// At `v` itself, copies of clocks it has processed already do not count: they will be
    /// dropped as duplicates (a replacement or a clone holding a live copy its twin processed).
    fn least_pending(&self, v: usize) -> Option<OrderKey> {
        let vx = self.vertices.get(v)?;
        let own = self.nodes.iter().filter(|n| n.alive && n.vertex == v);
        let own = own.filter_map(|n| n.pending.least_where(|k| !vx.decided.contains(k.clock))).min();
        // Upstream too: a live copy held for a replay at a vertex that has processed its clock
        // already (a straggler's clone holding a clock the straggler processed) is dropped there,
        // and what that processing emitted is already further down — unless a replay copy of the
        // clock is pending there as well, on its way here.
        let up = self.nodes.iter().filter(|n| n.alive && vx.upstream.contains(&n.vertex));
        let up = up.filter_map(|n| {
            let decided = &self.vertices.get(n.vertex)?.decided;
            n.pending.least_where(|k| {
                !(decided.contains(k.clock) && n.gate.holds_for_replay(k.clock) && n.pending.count(k) <= 1)
            })
        });
        own.into_iter().chain(up).min()
    }

    /// Before an order-sensitive vertex processes a packet, every instance of it reaches the
    /// packet's time, so the timers due by then fire first, as in the logical NF.
    fn advance_siblings(&mut self, node: NodeId, batch: &[Packet]) -> Result<(), EngineError> {
        let Some(last) = batch.last() else { return Ok(()) };
        let (ts, clock) = (last.meta.ts_ns, last.meta.clock);
        let Some(v) = self.node(node).map(|n| n.vertex) else { return Ok(()) };
        // Not the twin of `node`: it shares `node`'s timers, which `node` fires itself when it
        // takes the batch, under the packet's clock and before the packet's own operations, as
        // the logical NF does. Fired at the twin, they would take the first places of a clock
        // whose operations the per-clock log pairs by order.
        let twin = self.twin_of(node).map(|t| t.0);
        let mut advanced = Vec::new();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if i == node.0 || Some(i) == twin || !n.alive || n.vertex != v {
                continue;
            }
            advanced.push(NodeId(i));
            n.inst.begin_batch();
            n.inst.advance_time(ts, clock);
            n.inst.end_batch();
            for e in n.inst.take_events() {
                let input = self.root.input_of(e.clock).unwrap_or(u64::MAX);
                let (vertex, kind, subject, detail) = (e.nf.clone(), e.kind.to_string(), e.subject, e.detail);
                self.report.observed.decisions.push(Decision { input, vertex, kind, subject, detail });
            }
        }
        for sibling in advanced {
            if let Some(twin) = self.twin_of(sibling) {
                self.share_with_twin(sibling, twin);
            }
        }
        Ok(())
    }

    /// The other instance of a clone trial `node` is part of, while both run.
    pub(super) fn twin_of(&self, node: NodeId) -> Option<NodeId> {
        let v = self.node(node)?.vertex;
        let twin = self.vertices.get(v)?.splitter.twin_of(node)?;
        (self.alive(node) && self.alive(twin)).then_some(twin)
    }

    fn process_batch(&mut self, node: NodeId, batch: Vec<Packet>, start: u64) -> Result<u64, EngineError> {
        let twinned = self.twin_of(node).is_some();
        let suppress = self.cfg.switches.duplicate_suppression;
        let clocks = self.cfg.switches.clocks;
        let mut t = start;
        let Some(n) = self.nodes.get_mut(node.0) else { return Ok(t) };
        let Some(vx) = self.vertices.get_mut(n.vertex) else { return Ok(t) };
        let name = vx.plan.name.clone();
        n.inst.begin_batch();
        let mut outs: Vec<(Packet, Verdict, u64, bool)> = Vec::with_capacity(batch.len());
        let mut released = Vec::new();
        for mut pkt in batch {
            let mut service = self.cfg.service_ns;
            if let Some((lo, hi)) = n.slow {
                service += rand::Rng::gen_range(&mut self.rng, lo..=hi) * 1_000;
            }
            t += service;
            n.busy_ns += service;
            n.processed += 1;
            if twinned {
                // A straggler and its clone take turns on a flow's packets: neither may emit
                // one before the other has emitted the flow's previous one.
                let key = split_key(&pkt, &vx.plan.split);
                t = t.max(vx.flow_out.get(&key).map_or(0, |f| f + 1));
                vx.flow_out.insert(key, t);
            }
            let real = pkt.meta.clock;
            let replayed = pkt.meta.flags.contains(MetaFlags::REPLAYED);
            let p = vx.decided.process(real, replayed, suppress);
            if let Some(w) = vx.awaiting.remove(&real) {
                // The clock is processed: replay copies waiting for it pass through behind it.
                released.extend(w);
            }
            let before = if p.duplicate { updates_of(&mut n.inst) } else { 0 };
            if !clocks {
                vx.arrivals += 1;
                pkt.meta.clock = Clock::new(0, vx.arrivals);
            }
            let verdict = n.inst.process(&mut pkt);
            pkt.meta.clock = real;
            if p.duplicate {
                let added = updates_of(&mut n.inst) - before;
                *self.report.stats.duplicate_updates.entry(name.to_string()).or_default() += added;
            }
            for mut e in n.inst.take_events() {
                if !clocks {
                    // Events carry the clock the NF saw; the record keeps the real one.
                    e.clock = real;
                }
                if p.record {
                    let input = self.root.input_of(e.clock).unwrap_or(u64::MAX);
                    let (vertex, kind, subject, detail) = (e.nf.clone(), e.kind.to_string(), e.subject, e.detail);
                    self.report.observed.decisions.push(Decision { input, vertex, kind, subject, detail });
                }
            }
            // The target of a replay clears its mark: downstream the copy is subject to
            // duplicate suppression like any packet (it stays a replay copy for the root).
            if pkt.meta.replay_target() == Some(n.inst.id()) {
                pkt.meta.flags.insert(MetaFlags::REACHED);
                self.root.replay_reached(&pkt);
            }
            if p.record && suppress {
                vx.emitted.entry(real).or_insert_with(|| (pkt.clone(), verdict));
            }
            outs.push((pkt, verdict, t, p.record));
        }
        n.inst.end_batch();
        let v = n.vertex;
        let split = vx.plan.split.clone();
        for (pkt, verdict, at, record) in outs {
            self.hand_on(v, pkt, verdict, at, record);
        }
        for (waited_at, p) in released {
            // Each passes through where it waited, in that queue's order: the copies of one
            // replay stay in clock order even when a straggler and its clone took turns on
            // their clocks (a recovering target downstream processes them as they come).
            let at_node = if self.alive(waited_at) { waited_at } else { node };
            let roots = self.root.roots();
            if let Some(w) = self.nodes.get_mut(waited_at.0) {
                w.pending.remove(OrderKey::of(&p.meta, roots));
            }
            let key = split_key(&p, &split);
            self.enqueue(at_node, p, t, key);
        }
        Ok(t)
    }

    /// What vertex `v` does with a packet its NF processed: drop it, consume it (off-path), or
    /// route it by the NF's output.
    fn hand_on(&mut self, v: usize, pkt: Packet, verdict: Verdict, at: u64, record: bool) {
        let Some(vp) = self.vertices.get(v).map(|x| &x.plan) else { return };
        let name = vp.name.clone();
        let input = self.root.input_of(pkt.meta.clock).unwrap_or(u64::MAX);
        let out = match verdict {
            Verdict::Forward => 0,
            Verdict::Output(i) => usize::from(i) + 1,
            Verdict::Drop(reason) => {
                if record {
                    self.report.observed.decisions.push(drop_decision(input, &name, reason));
                }
                self.root.copy_finished(&pkt);
                return;
            }
        };
        if vp.off_path {
            self.root.copy_finished(&pkt);
            return;
        }
        match vp.routes.get(direction(&pkt, vp.routes.len())).and_then(|r| r.get(out)).cloned() {
            Some(routes) => self.route(&routes, pkt, at, &name, input),
            None => {
                if record {
                    self.report.observed.decisions.push(drop_decision(input, &name, "no-route"));
                }
                self.root.copy_finished(&pkt);
            }
        }
    }
}

fn updates_of(inst: &mut Instance) -> u64 {
    client(inst).map_or(0, |c| c.stats().updates)
}

impl Node {
    /// Backlog: queued and held packets.
    pub(super) fn backlog(&self) -> u64 {
        self.queue.len() as u64 + self.gate.held() as u64
    }
}

/// What the gate of instance `id` of `vx` needs to decide on `pkt` taken from its queue.
fn take_context<'v>(
    vx: &'v super::Vertex,
    id: sluice_packet::InstanceId,
    is_clone: bool,
    root: &sluice_chc::root::Root,
    suppress: bool,
    pkt: &Packet,
) -> TakeContext<'v> {
    TakeContext {
        id,
        // A clone's straggler flushed before it started; otherwise the root knows.
        skip_done: is_clone || root.committed(pkt.meta.clock),
        decided: &vx.decided,
        suppress,
        emitted: vx.emitted.contains_key(&pkt.meta.clock),
    }
}
