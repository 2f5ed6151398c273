//! The client as the state handle NF instances use: operations, timers, batches and packets.

use super::*;

impl StateHandle for StoreClient {
    fn record(&mut self, fresh: Value) -> Result<Value, StateError> {
        if !self.cfg.record_nondeterminism {
            return Ok(fresh);
        }
        // Blocking: whoever asks first (the original, or a clone racing it) fixes the value.
        let key = StoreKey { vertex: self.vertex, object: NONDET_OBJECT, key: StateKey::Unit };
        let op = StateOp::Record(fresh.clone());
        let tag = self.next_tag();
        let resp = self.call(key, StoreOp::State(op.clone()), Some(tag))?;
        if !resp.replayed {
            // In the write-ahead log, so a rebuilt store can learn the value again.
            self.log_update(tag, key, &op);
        }
        Ok(resp.result.map_err(StateError::Backend)?.unwrap_or(fresh))
    }

    /// Asks the store's per-clock log (one round trip) for the update this packet's first
    /// processing made at this place, under the tag the update had: every update is numbered
    /// in its packet, emulated or not, so the numbers line up.
    fn emulated_update(
        &mut self,
        obj: ObjectId,
        key: &StateKey,
        answer: bool,
    ) -> Result<Option<Option<Value>>, StateError> {
        if !self.cfg.dedupe || !self.replaying {
            return Ok(None);
        }
        let tag = self.number_update();
        if !answer {
            return Ok(None);
        }
        let resp = self.call(self.key(obj, key), StoreOp::Logged, Some(tag))?;
        let result = resp.result.map_err(StateError::Backend)?;
        Ok(resp.replayed.then_some(result))
    }

    fn exec(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let idx = usize::from(obj.0);
        let Some(&s) = self.strategies.get(idx) else { return Err(StateError::UnknownObject(obj)) };
        if s == Strategy::WriteThrough || (s == Strategy::SharedWriteThrough && self.caches_now(obj)) {
            return self.write_through(obj, key, op);
        }
        if self.caches_now(obj) {
            return self.local(obj, key, op);
        }
        if s == Strategy::Callbacks {
            if op == StateOp::Get {
                if let Some(e) = self.caches.get(idx).and_then(|c| c.get(key)) {
                    self.stats.cache_hits += 1;
                    return Ok(e.value.clone());
                }
                let skey = self.key(obj, key);
                let resp = self.call(skey, StoreOp::Subscribe, None)?;
                let value = resp.result.clone().map_err(StateError::Backend)?;
                if let Some(ts) = resp.ts {
                    self.last_read = Some(LastRead { key: skey, value: value.clone(), ts });
                }
                if let Some(c) = self.caches.get_mut(idx) {
                    c.insert(*key, Cached::new(value.clone()));
                }
                return Ok(value);
            }
            // Our own update is not called back to us: forget the cached copy.
            if let Some(c) = self.caches.get_mut(idx) {
                c.remove(key);
            }
        }
        self.remote(obj, key, op)
    }

    /// A read. Of a per-flow value cached here, outside a replay (a NAT's or an LB's look at a
    /// connection, every packet): a copy at once, without an operation to build, match and drop.
    #[inline]
    fn get(&mut self, obj: ObjectId, key: &StateKey) -> Result<Option<Value>, StateError> {
        let idx = usize::from(obj.0);
        let strategy = self.strategies.get(idx).copied();
        if !self.replaying && matches!(strategy, Some(Strategy::Owned | Strategy::WriteThrough)) {
            if let Some(e) = self.caches.get(idx).and_then(|c| c.get(key)) {
                self.stats.cache_hits += 1;
                return Ok(e.read());
            }
            if strategy == Some(Strategy::Owned) && self.cfg.fresh && !self.moved_in {
                // A flow owned here from its first packet: absent here is absent (as `local`
                // answers it, without an entry).
                return Ok(None);
            }
        }
        self.exec(obj, key, StateOp::Get)
    }

    fn exec_nb(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<(), StateError> {
        if let StateOp::Incr(d) = op {
            return self.incr_nb(obj, key, d);
        }
        self.exec_nb_other(obj, key, op)
    }

    /// A counter's increment (a NAT counts every packet twice): collected for the batch in a
    /// short path of its own, without an operation to build and drop; anything it cannot
    /// collect goes the general way.
    #[inline]
    fn incr_nb(&mut self, obj: ObjectId, key: &StateKey, delta: i64) -> Result<(), StateError> {
        if !self.collects_increments(obj) {
            return self.incr_nb_other(obj, key, delta);
        }
        let tag = self.tag_update(obj, key, || StateOp::Incr(delta));
        self.collect_increment(obj, key, (tag, delta));
        Ok(())
    }

    fn set_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
        // Fired here, at the same packet as with local state; with fault tolerance the store
        // keeps a copy (sent once per batch) so that a replacement is told if this one is gone.
        // A re-arm within the object's slack changes nothing, here or there.
        let slack = self.timer_slack.get(usize::from(obj.0)).copied().unwrap_or(0);
        if self.timers_of_object(obj, |t| t.set_with_slack(obj, key, deadline_ns, slack)) {
            self.note_timer_change(obj, key, Some(deadline_ns));
        }
    }

    fn cancel_timer(&mut self, obj: ObjectId, key: &StateKey) {
        if self.timers_of_object(obj, |t| t.cancel(obj, key)) {
            self.note_timer_change(obj, key, None);
        }
    }

    fn may_fire(&self, now_ns: u64) -> bool {
        // `expired_where` would also move this client's time forward: asked past the packet's
        // own time (the run's last look at its timers), it is asked.
        now_ns > self.now_ns
            || self.timers.may_fire(now_ns)
            || self.vertex_timers.as_ref().is_some_and(|t| t.may_be_due(now_ns))
    }

    fn expired(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>) {
        self.expired_where(now_ns, max, out, &|_, _| true);
    }

    fn expired_where(
        &mut self,
        now_ns: u64,
        max: usize,
        out: &mut Vec<TimerFired>,
        fire: &dyn Fn(ObjectId, &StateKey) -> bool,
    ) {
        self.now_ns = self.now_ns.max(now_ns);
        let start = out.len();
        let mut deadlines = Vec::new();
        self.timers.expired_where(now_ns, max, out, &mut deadlines, fire);
        if out.len() == start && self.vertex_timers.as_ref().is_none_or(|t| !t.may_be_due(now_ns)) {
            // Nothing due here nor in the vertex's table (most packets).
            return;
        }
        let mut fired: Vec<(TimerFired, u64, bool)> =
            out.drain(start..).zip(deadlines).map(|(f, d)| (f, d, false)).collect();
        self.take_vertex_timers(now_ns, max, &mut fired, fire);
        for (f, deadline_ns, from_table) in fired {
            if from_table {
                // Taken from the vertex's table, so fired once in this process; the store's
                // copy is cancelled with the batch (a replacement must not adopt it again).
                self.note_timer_change(f.object, &f.key, None);
                out.push(f);
                continue;
            }
            let shared = !matches!(self.strategies.get(usize::from(f.object.0)), Some(Strategy::WriteThrough));
            if self.cfg.write_through && shared {
                // Several instances may arm timers on a shared key: only a copy the store still
                // holds expires it (one round trip per expiry of a shared key).
                let key = self.key(f.object, &f.key);
                if let Some(Some(armed)) = self.timer_changes.remove(&(f.object, f.key)) {
                    // Armed in this batch: the store hears of it first (ahead of the expiry
                    // on the same connection), or it would not know this copy.
                    self.queue_nb(key, StoreOp::SetTimer { deadline_ns: armed }, None);
                }
                let op = StoreOp::ExpireTimer { deadline_ns };
                // Otherwise stale (re-armed or cancelled elsewhere), or the store is
                // unreachable: a replacement adopts it and fires it again.
                if let Ok(Ok(Some(Value::Int(1)))) = self.call(key, op, None).map(|r| r.result) {
                    out.push(f);
                }
                continue;
            }
            self.note_timer_change(f.object, &f.key, None);
            out.push(f);
        }
    }

    fn due_where(&mut self, now_ns: u64, max: usize, fire: &dyn Fn(ObjectId, &StateKey) -> bool) -> DueTimers {
        self.due_in_table(now_ns, max, fire)
    }

    fn begin_batch(&mut self) {
        self.batch_start = Instant::now();
        let _ = self.absorb_at(self.batch_start);
    }

    fn end_batch(&mut self) {
        self.batches = self.batches.wrapping_add(1);
        if self.cfg.flush_every > 0 && self.batches.is_multiple_of(self.cfg.flush_every) {
            self.flush_dirty();
        }
        self.queue_timer_changes();
        self.queue_processed_marks();
        if self.defers_batch() {
            return;
        }
        self.send_batches(self.batch_start);
    }

    fn begin_packet(&mut self, meta: &Meta) {
        self.moved_in = meta.flags.contains(sluice_packet::MetaFlags::FIRST);
        self.replaying = meta.flags.contains(sluice_packet::MetaFlags::REPLAYED);
        self.now_ns = self.now_ns.max(meta.ts_ns);
        if self.numbers_updates() {
            self.clock = meta.clock;
            self.entry_ns = meta.ingress_ns;
            if !self.replaying {
                self.replay_history.end();
            }
            self.seq = 0;
            self.firing = (None, 0);
            self.xor = 0;
            self.touched = 0;
        }
    }

    fn timers(&mut self, firing: bool) {
        self.firing_timers = firing;
        self.firing = (None, 0);
    }

    fn timer_fires(&mut self, timer: &TimerFired) {
        self.firing = (Some((timer.object, timer.key)), 0);
    }

    /// Only a client that reports commits carries anything into a packet's metadata (its XOR).
    fn ends_packets(&self) -> bool {
        self.cfg.commits
    }

    fn end_packet(&mut self, meta: &mut Meta) {
        meta.xor ^= self.xor;
        if self.xor != 0 {
            self.stats.commits_made += 1;
            self.batch_xors.push((self.clock, self.xor));
        } else if self.cfg.mark_processed {
            self.unmarked.push(self.clock);
        }
    }

    fn take_commits(&mut self, out: &mut Vec<(Clock, u64)>) {
        if !self.cfg.commits {
            // None are made: nothing to take in for them (the batch's start takes in the rest).
            return;
        }
        self.send_overdue();
        let _ = self.absorb();
        self.stats.commits_taken += self.committed.len() as u64;
        out.append(&mut self.committed);
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn set_exclusive(&mut self, obj: ObjectId, exclusive: bool) {
        let idx = usize::from(obj.0);
        let was = self.exclusive.get(idx).copied().unwrap_or(false);
        if was == exclusive {
            return;
        }
        if let Some(e) = self.exclusive.get_mut(idx) {
            *e = exclusive;
        }
        if let Some(f) = self.exclusive_from_start.get_mut(idx) {
            *f = exclusive && self.batches == 0 && (*f || !was);
        }
        if was && !exclusive {
            // Another instance starts using the object: hand our copy to the store first.
            self.flush_dirty();
            if let Some(c) = self.caches.get_mut(idx) {
                c.clear();
            }
            let _ = self.send_pending();
        }
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats;
        vec![
            ("requests", s.requests),
            ("round_trips", s.round_trips),
            ("cache_hits", s.cache_hits),
            ("retransmits", s.retransmits),
            ("duplicates", s.duplicates),
            ("async_errors", s.async_errors),
            ("callbacks", s.callbacks),
            ("flushed", s.flushed),
            ("commits_made", s.commits_made),
            ("commits_taken", s.commits_taken),
        ]
    }

    fn flush(&mut self) -> Result<(), StateError> {
        self.flush_dirty();
        self.send_pending()?;
        self.drain_acks()
    }
}
