//! What the client keeps for recovery and reconfiguration: its write-ahead log and reads, its
//! copies of per-flow state and its timers, and what a flow move, a clone trial, a checkpoint,
//! a store rebuild or a new connection do with them.

use super::*;
use crate::recovery::{ForRebuild, ReadRecord, RecoveryLog};

impl StoreClient {
    /// Starts (or stops) collecting the per-flow keys this instance writes through, for a
    /// twin that serves the same flows to forget its copies of ([`StoreClient::forget_cached`]).
    pub fn track_written(&mut self, on: bool) {
        self.written = if on { Some(self.written.take().unwrap_or_default()) } else { None };
        self.twin_timer_changes = if on { Some(self.twin_timer_changes.take().unwrap_or_default()) } else { None };
    }

    /// The per-flow keys written through since the last call (while tracking).
    pub fn take_written(&mut self) -> Vec<(ObjectId, StateKey)> {
        self.written.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The timer changes of the batches ended since the last call (while tracking): armed
    /// with `Some(deadline_ns)`, cancelled or fired with `None`.
    pub fn take_timer_changes(&mut self) -> Vec<(ObjectId, StateKey, Option<u64>)> {
        self.twin_timer_changes.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Applies a twin's timer changes here, without telling the store (the twin did): both
    /// serve the same flows, so either must fire a timer the other armed, and neither one the
    /// other cancelled or already fired.
    pub fn mirror_timers(&mut self, changes: &[(ObjectId, StateKey, Option<u64>)]) {
        for (obj, key, change) in changes {
            match change {
                Some(deadline_ns) => self.timers_of_object(*obj, |t| t.set(*obj, key, *deadline_ns)),
                None => {
                    self.timers_of_object(*obj, |t| t.cancel(*obj, key));
                }
            }
        }
    }

    /// Drops the local copies of these per-flow keys: another instance changed them, and the
    /// next access reads them from the store.
    pub fn forget_cached(&mut self, keys: &[(ObjectId, StateKey)]) {
        for (obj, key) in keys {
            if let Some(c) = self.caches.get_mut(usize::from(obj.0)) {
                c.remove(key);
            }
        }
    }

    /// Flows this instance served were handed to another instance (`moved` says which keys):
    /// its copies of their per-flow values are dropped, so a stale copy can never come back (a
    /// store rebuild takes per-flow state from the instances' copies), and their timers are
    /// returned for the new instance, cancelled here without telling the store (the new
    /// instance re-arms them, in the order returned: the order they would have fired here,
    /// [`Timers::take_where`](sluice_state::Timers::take_where)). Call it after a flush.
    pub fn hand_over(&mut self, moved: impl Fn(&StateKey) -> bool) -> Vec<(ObjectId, StateKey, u64)> {
        for (o, cache) in self.caches.iter_mut().enumerate() {
            if matches!(self.strategies.get(o), Some(Strategy::Owned | Strategy::WriteThrough)) {
                cache.retain(|k, e| e.dirty || !moved(k));
            }
        }
        let timers = self.timers.take_where(&moved);
        for (o, k, _) in &timers {
            self.timer_changes.remove(&(*o, *k));
        }
        timers
    }

    /// Flows left this instance: drops its copies of the per-flow values `foreign` selects —
    /// values of no flow it still serves, such as those an NF keys by another flow than the
    /// packet's (a load balancer's backend-side mapping of a connection), which
    /// [`StoreClient::hand_over`] cannot attribute to the moved flows. The instance that now
    /// serves the connection may change or delete them, and a store rebuild takes per-flow
    /// state from the instances' copies: a stale one must not come back. From now on a
    /// per-flow value this instance holds no copy of is looked up, not taken to be absent.
    /// Call it after a flush.
    pub fn forget_foreign(&mut self, foreign: impl Fn(&StateKey) -> bool) {
        for (o, cache) in self.caches.iter_mut().enumerate() {
            if matches!(self.strategies.get(o), Some(Strategy::Owned | Strategy::WriteThrough)) {
                cache.retain(|k, e| e.dirty || !foreign(k));
            }
        }
        self.look_up_missing_values();
    }

    /// Whether a value this instance holds no copy of is looked up in the store (rather than
    /// taken to be absent).
    pub fn looks_up_missing(&self) -> bool {
        !self.cfg.fresh
    }

    /// From now on a per-flow value this instance holds no copy of is looked up in the store,
    /// not taken to be absent: flows may have moved here with their values.
    pub fn look_up_missing_values(&mut self) {
        self.cfg.fresh = false;
    }

    /// The objects whose missing copies [`StoreClient::load_flows`] makes absent rather than
    /// looked up: those written through (per flow, and shared while this instance is their only
    /// user) and those cached per flow. It loads all of them.
    pub fn loaded_objects(&self) -> Vec<u16> {
        (0..self.strategies.len()).filter(|o| self.strategies.get(*o).is_some_and(loads)).map(|o| o as u16).collect()
    }

    /// A replacement of its vertex's only instance starts with every value the store has for
    /// the vertex's [`StoreClient::loaded_objects`] (`values`, from `Backend::values_of` after
    /// the predecessor's answers settled): copies of what it would read on each flow's first
    /// packet, one store round trip at a time, while the packets queued during the failure
    /// wait. With all of them here, a value it has no copy of is absent, as for an instance
    /// that served every flow from its first packet.
    pub fn load_flows(&mut self, values: Vec<(StoreKey, Value)>) {
        self.insert_loaded(values);
        self.cfg.fresh = true;
    }

    /// Copies of `values` (of the objects it loads) as its own, where it has none yet.
    fn insert_loaded(&mut self, values: Vec<(StoreKey, Value)>) {
        // Room for all of them first: growing the maps value by value rehashes them many
        // times, in the middle of a recovery.
        let mut per_object = vec![0usize; self.caches.len()];
        for (k, _) in &values {
            if let Some(n) = per_object.get_mut(usize::from(k.object)) {
                *n += 1;
            }
        }
        for (c, n) in self.caches.iter_mut().zip(per_object) {
            c.reserve(n);
        }
        for (k, v) in values {
            let o = usize::from(k.object);
            if k.vertex != self.vertex || !self.strategies.get(o).is_some_and(loads) {
                continue;
            }
            if let Some(c) = self.caches.get_mut(o) {
                c.entry(k.key).or_insert_with(|| Cached::new(Some(v)));
            }
        }
    }

    /// Takes over timers another instance armed (flows moved here, an instance retired): armed
    /// here, and the store told at the end of the next batch that this instance arms them.
    pub fn take_over_timers(&mut self, timers: &[(ObjectId, StateKey, u64)]) {
        for (o, k, d) in timers {
            self.timers_of_object(*o, |t| t.set(*o, k, *d));
            self.note_timer_change(*o, k, Some(*d));
        }
    }

    /// The instance this client serves.
    pub fn id(&self) -> InstanceId {
        self.id
    }

    /// The epoch it connects in ([`ClientConfig::epoch`]): a connection to a rebuilt store is
    /// opened in it again.
    pub fn epoch(&self) -> u32 {
        self.cfg.epoch
    }

    /// What the client did so far.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// The write-ahead log of shared-state updates, oldest first.
    pub fn wal(&self) -> &VecDeque<WalEntry> {
        &self.wal
    }

    /// The last value read from the store, with its TS vector.
    pub fn last_read(&self) -> Option<&LastRead> {
        self.last_read.as_ref()
    }

    /// Reads of shared values (with TS vectors) since the last checkpoint, oldest first.
    pub fn reads(&self) -> &VecDeque<LastRead> {
        &self.reads
    }

    /// The store took a checkpoint: reads before it are no longer needed for recovery.
    pub fn checkpointed(&mut self) {
        self.reads.clear();
        self.wal_since_checkpoint = 0;
    }

    /// Updates logged since the last checkpoint (more than the log holds if some were pushed
    /// out of it).
    pub fn wal_since_checkpoint(&self) -> usize {
        self.wal_since_checkpoint
    }

    /// Keeps no write-ahead log from now on (a run whose store is never rebuilt: nothing
    /// would read it, and every update would be copied into it).
    pub fn drop_write_ahead_log(&mut self) {
        self.cfg.wal_capacity = 0;
        self.numbers = super::updates::numbers_updates(&self.cfg);
        self.wal = VecDeque::new();
        self.wal_since_checkpoint = 0;
    }

    /// Whether the write-ahead log holds less than half of its capacity of updates made since
    /// the last checkpoint. A store rebuild needs all of them: past the capacity the oldest
    /// are gone, so the owner of the store should checkpoint before (the COE engine does).
    pub fn wal_has_room(&self) -> bool {
        self.wal_since_checkpoint < self.cfg.wal_capacity / 2
    }

    /// The per-flow values this instance holds (write-through copies and cached values), as
    /// the store should have them — `None` for a value it knows to be absent (deleted): what a
    /// rebuilt store instance takes per-flow state from.
    pub fn per_flow_values(&self) -> Vec<(StoreKey, Option<Value>)> {
        let mut out = Vec::new();
        for (o, cache) in self.caches.iter().enumerate() {
            if !matches!(self.strategies.get(o), Some(Strategy::Owned | Strategy::WriteThrough)) {
                continue;
            }
            for (k, e) in cache {
                out.push((StoreKey { vertex: self.vertex, object: o as u16, key: *k }, e.value.clone()));
            }
        }
        out.sort_by_key(|(k, _)| *k);
        out
    }

    /// The timers armed at this instance, as `(object, key, deadline_ns)`.
    pub fn armed_timers(&self) -> Vec<(ObjectId, StateKey, u64)> {
        let mut armed = self.timers.armed();
        if let Some(t) = &self.vertex_timers {
            armed.extend(t.with(|t| t.armed()));
        }
        armed
    }

    /// A replacement takes over (a part of) what its failed predecessor left in the store
    /// ([`crate::Backend::takeover`]): re-arms its timers, copies the values if they were
    /// read. Once every part is in, [`StoreClient::took_over_every_value`] says the values
    /// were all of them.
    pub fn take_over(&mut self, part: crate::Takeover) {
        self.timers.reserve(part.timers.len());
        for (key, deadline) in &part.timers {
            self.adopt_timer(ObjectId(key.object), &key.key, *deadline);
        }
        if let Some(values) = part.values {
            self.insert_loaded(values);
        }
        self.replay_history.add(part.history);
    }

    /// Every value of the objects it loads came in [`StoreClient::take_over`]: a value it has
    /// no copy of is absent, as for an instance that served every flow from its first packet
    /// ([`StoreClient::load_flows`]).
    pub fn took_over_every_value(&mut self) {
        self.cfg.fresh = true;
        self.replay_history.complete();
    }

    /// Re-arms a timer a predecessor armed (recovery), without telling the store again.
    pub fn adopt_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
        if self.in_vertex_table(obj) {
            // The vertex's table outlived the predecessor: its shared timers are still there
            // (or fired already, which re-arming would undo).
            return;
        }
        self.timers.set(obj, key, deadline_ns);
    }

    /// Stops the connection before the store is wiped and rebuilt (a store crash): once this
    /// returns, nothing more this client sent is applied, and what the connection had applied
    /// is acknowledged. Batches it had not applied stay unacknowledged, and
    /// [`StoreClient::reconnect`] sends them again.
    pub fn suspend(&mut self) -> Result<(), StateError> {
        self.conn.halt(&mut self.replies).map_err(backend)?;
        self.settle_responses();
        Ok(())
    }

    /// What a store rebuild needs of this instance, once its connection is stopped
    /// ([`StoreClient::suspend`]): its write-ahead log and reads since the checkpoint, its
    /// per-flow copies, and the timers it has armed (the rebuilt store's copy comes from them,
    /// not from the checkpoint, which misses every timer armed since). The suspension's error,
    /// if it failed, comes beside it (a driver may rebuild all the same, or give up).
    pub fn hand_over_for_rebuild(&mut self) -> (ForRebuild, Result<(), StateError>) {
        // A connection that applies batches on a thread of its own (Redis) stops first: a
        // batch still on its way would otherwise land in the rebuilt store besides being
        // re-executed from the log.
        let stopped = self.suspend();
        let reads = self.reads.iter().map(|r| ReadRecord { key: r.key, value: r.value.clone(), ts: r.ts.clone() });
        let wal: Vec<_> = self.wal.iter().cloned().collect();
        // Every instance flushed before the checkpoint: what it logged before is in it.
        let after_checkpoint = Some(wal.len().saturating_sub(self.wal_since_checkpoint));
        let log = RecoveryLog { instance: self.id, wal, reads: reads.collect(), after_checkpoint };
        let (id, vertex) = (self.id, self.id.vertex());
        let timers = self
            .armed_timers()
            .into_iter()
            .map(|(o, key, deadline)| (StoreKey { vertex, object: o.0, key }, deadline, id))
            .collect();
        (ForRebuild { log, per_flow: self.per_flow_values(), timers }, stopped)
    }

    /// Continues over a new connection (the store instance was replaced): batches not yet
    /// acknowledged are sent again, renumbered from 1 as the new connection expects; their
    /// tags make them apply once even if the rebuilt store re-executed them already.
    pub fn reconnect(&mut self, conn: Box<dyn Connection>) -> Result<(), StateError> {
        self.conn = conn;
        self.conn.allow_lazy_batches(super::lazy_batches(&self.cfg));
        self.replies = Replies::default();
        let old: Vec<_> = self.inflight.drain(..).collect();
        let mut renumber = Map::default();
        self.next_batch = 1;
        for (b, batch, _) in old {
            let n = self.next_batch;
            self.next_batch += 1;
            renumber.insert(b, n);
            self.conn.send(n, batch.clone()).map_err(backend)?;
            self.inflight.push_back((n, batch, Instant::now()));
        }
        for (b, _) in self.uncommitted.iter_mut() {
            // Entries attached to batches already acknowledged stay below the new numbers.
            *b = renumber.get(b).copied().unwrap_or(0);
        }
        Ok(())
    }

    /// The instance fails (a drill: `sluice run --faults`), between two batches: what its
    /// batches had built is sent, as at the end of a batch that did not wait for the next
    /// ([`ClientConfig::defer_batches`]), so the drill fails it at the same point with or
    /// without deferred batches: every packet it processed has its updates in the store, which
    /// its replacement relies on to skip them. What was sent, the store applies anyway. Waits
    /// for the store's answers to those requests and moves the commits they carry into
    /// `commits`: what the framework learns by asking the store which of the failed instance's
    /// tagged updates it applied, so that the root's log knows which of its packets are done
    /// and a replay does not redo them against later state.
    pub fn fail(&mut self, commits: &mut Vec<(Clock, u64)>) -> Result<(), StateError> {
        self.queue_timer_changes();
        self.queue_processed_marks();
        self.send_batches(std::time::Instant::now());
        self.wait_for_acks(0)?;
        self.absorb()?;
        commits.append(&mut self.committed);
        Ok(())
    }

    /// Requests in batches not yet acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.inflight.iter().map(|(_, b, _)| b.len()).sum()
    }
}

/// Whether [`StoreClient::load_flows`] loads objects of strategy `s`: every strategy whose
/// misses `fresh` turns into absent values.
fn loads(s: &Strategy) -> bool {
    matches!(s, Strategy::Owned | Strategy::WriteThrough | Strategy::SharedWriteThrough)
}
