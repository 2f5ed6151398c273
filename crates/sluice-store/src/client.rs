//! The client library in each NF instance: the ordinary [`StateHandle`] API on top of a store
//! connection, with the strategy of CHC's Table 1 chosen per declared object.
//!
//! | object | `external` | `cached` | `async` |
//! |---|---|---|---|
//! | write-mostly (any scope) | blocking op | blocking op | non-blocking op, not waited for |
//! | per-flow | blocking op | cached; dirty values flushed every `flush_every` batches | same, flush not waited for |
//! | cross-flow, read-heavy | blocking op | reads from a cache kept fresh by callbacks; updates at the store (cached like per-flow while this instance is the object's only user) | same |
//! | cross-flow, read/write often | blocking op | cached while this instance is its only user, else at the store | same, updates not waited for |
//!
//! "Only user" is what the runtime says through `set_exclusive` (today: the vertex has one
//! instance); when that changes, the client flushes its copy and switches strategy.
//!
//! Updates sent to the store carry an [`OpTag`] (packet clock, index within the packet) so a
//! retransmitted or replayed update is applied once. Requests of one batch of packets travel
//! together; a blocking call sends everything queued before it first, so operations reach the
//! store in issue order.

use crate::backend::{Connection, StoreError};
use crate::wire::{Notification, OpTag, Replies, Request, Response, StoreKey, StoreOp, TsVector};
use sluice_packet::{Clock, InstanceId, Meta};
use sluice_state::{
    ops::apply, AccessPattern, CustomOp, ObjectId, StateDecl, StateError, StateHandle, StateKey, StateOp, TimerFired,
    Timers, Value,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Map<K, V> = hashbrown::HashMap<K, V, ahash::RandomState>;

/// How much of CHC's machinery a client uses (the paper's models, for comparison).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every operation goes to the store and is waited for.
    External,
    /// Plus caching by scope and access pattern.
    Cached,
    /// Plus non-blocking updates that are not waited for (the default).
    Async,
}

/// Client parameters.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The mode.
    pub mode: Mode,
    /// Dirty cached values are flushed to the store every this many batches.
    pub flush_every: u32,
    /// An unacknowledged non-blocking update is sent again after this long.
    pub retransmit_after: Duration,
    /// A blocking call fails after this long without an answer.
    pub call_timeout: Duration,
    /// Entries kept in the write-ahead log of shared-state updates.
    pub wal_capacity: usize,
    /// Most batches sent and not yet acknowledged; past it the client waits (backpressure
    /// from a store that falls behind).
    pub max_inflight: usize,
    /// The store holds no state of this instance's flows yet (a chain starting on an empty
    /// store): a per-flow value missing from the cache is absent, no need to ask. Packets marked
    /// `FIRST` (a flow moved here) are always looked up. Off for replacement instances.
    pub fresh: bool,
    /// Fault-tolerant operation (the COE executor): per-flow values, and shared ones while this
    /// instance is their only user (`set_exclusive`), are written through to the store as
    /// tagged non-blocking updates (the local copy only serves reads), and every update is
    /// tagged, so a packet replayed from the root's log is
    /// applied at most once and a crashed instance loses only unacknowledged updates, which its
    /// packets' XOR vectors keep replayable.
    pub write_through: bool,
    /// Updates carry exactly-once tags (the default). Off only to show what duplicate
    /// suppression prevents: the store then applies every copy of a duplicated update.
    pub dedupe: bool,
    /// Non-deterministic values an NF draws ([`StateHandle::record`]: random numbers, the
    /// wall clock) are recorded in the store under the packet's clock, so that a replay or a
    /// clone draws the same ones. Costs a round trip per draw; only the fault-tolerant
    /// executor, which replays, turns it on.
    pub record_nondeterminism: bool,
}

/// The object index under which [`StateHandle::record`] records values (no NF declares that
/// many objects; the value itself is never written, only the per-clock log entry).
pub const NONDET_OBJECT: u16 = u16::MAX - 1;

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            mode: Mode::Async,
            flush_every: 8,
            retransmit_after: Duration::from_secs(1),
            call_timeout: Duration::from_secs(5),
            wal_capacity: 65_536,
            max_inflight: 256,
            fresh: true,
            write_through: false,
            dedupe: true,
            record_nondeterminism: false,
        }
    }
}

/// What the client did, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClientStats {
    /// Requests sent (retransmissions included).
    pub requests: u64,
    /// Blocking round trips.
    pub round_trips: u64,
    /// Operations answered from the cache.
    pub cache_hits: u64,
    /// Non-blocking updates sent again after a timeout.
    pub retransmits: u64,
    /// Updates the store recognised as duplicates (answered from its per-clock log).
    pub duplicates: u64,
    /// Non-blocking updates the store refused.
    pub async_errors: u64,
    /// Change callbacks received.
    pub callbacks: u64,
    /// Dirty values flushed.
    pub flushed: u64,
    /// Updates the NF issued (any strategy).
    pub updates: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    /// No caching: every operation at the store.
    Remote,
    /// Cached here, flushed periodically (per-flow; shared while exclusive).
    Owned,
    /// Cached reads, kept fresh by callbacks; updates at the store.
    Callbacks,
    /// Shared and read/written often: `Owned` while exclusive, else `Remote`.
    SharedOften,
    /// Per-flow, fault-tolerant: reads from a local copy, every update applied to the copy and
    /// sent to the store as a tagged non-blocking update.
    WriteThrough,
    /// Shared, fault-tolerant: `WriteThrough` while this instance is the object's only user
    /// (`set_exclusive`), else `Remote`.
    SharedWriteThrough,
}

#[derive(Debug, Clone)]
struct Cached {
    value: Option<Value>,
    dirty: bool,
    /// For lists: the pushes and pops since the last flush, so a flush sends those rather than
    /// the whole list (a port pool holds tens of thousands of entries). `None` while dirty
    /// means the whole value must be written.
    list_ops: Option<Vec<StateOp>>,
}

impl Cached {
    fn new(value: Option<Value>) -> Cached {
        Cached { value, dirty: false, list_ops: None }
    }

    /// Records an update for the next flush.
    fn record(&mut self, op: &StateOp) -> bool {
        let was_dirty = self.dirty;
        let list_op = matches!(op, StateOp::Pop | StateOp::PopN(_) | StateOp::Push(_));
        let is_list = matches!(self.value, Some(Value::List(_)));
        if list_op && is_list && (!was_dirty || self.list_ops.is_some()) {
            let ops = self.list_ops.get_or_insert_with(Vec::new);
            match (ops.last_mut(), op) {
                // Consecutive pops travel as one pop-n.
                (Some(StateOp::PopN(n)), StateOp::Pop) => *n = n.saturating_add(1),
                (_, StateOp::Pop) => ops.push(StateOp::PopN(1)),
                (_, op) => ops.push(op.clone()),
            }
        } else {
            self.list_ops = None;
        }
        self.dirty = true;
        !was_dirty
    }
}

/// A write-ahead log entry: a shared-state update as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct WalEntry {
    /// Its tag.
    pub tag: OpTag,
    /// The value it updates.
    pub key: StoreKey,
    /// The operation.
    pub op: StateOp,
}

/// The last value read from the store with the TS vector it came with.
#[derive(Debug, Clone, PartialEq)]
pub struct LastRead {
    /// The key read.
    pub key: StoreKey,
    /// The value.
    pub value: Option<Value>,
    /// The store's TS vector at the read.
    pub ts: TsVector,
}

/// A [`StateHandle`] backed by a store.
pub struct StoreClient {
    conn: Box<dyn Connection>,
    id: InstanceId,
    vertex: u16,
    cfg: ClientConfig,
    strategies: Vec<Strategy>,
    exclusive: Vec<bool>,
    /// Objects this instance has been the only user of since before its first packet: with a
    /// fresh store, a value missing from the cache is absent.
    exclusive_from_start: Vec<bool>,
    custom: Vec<CustomOp>,
    caches: Vec<Map<StateKey, Cached>>,
    /// Cached values changed since the last flush.
    dirty: Vec<(ObjectId, StateKey)>,
    /// When the current batch started (one clock read per batch, not per request).
    batch_start: Instant,
    /// When unacknowledged requests were last checked for retransmission.
    last_resend_check: Instant,
    timers: Timers,
    /// Timer changes not yet mirrored to the store, coalesced per key (`None`: cancelled).
    timer_changes: Map<(ObjectId, StateKey), Option<u64>>,
    pending: Vec<Request>,
    /// Tagged increments of write-mostly values collected during the batch, sent as one
    /// request per value (in first-use order) before anything else touches the value.
    increments: Vec<(StoreKey, Vec<(OpTag, i64)>)>,
    /// Sent batches not yet acknowledged, oldest first, with when they were (last) sent:
    /// retransmitted unchanged, under the same number, after a timeout; the store applies each
    /// number once and in order.
    inflight: VecDeque<(u64, Arc<[Request]>, Instant)>,
    /// The number of the next batch.
    next_batch: u64,
    replies: Replies,
    notes: Vec<Notification>,
    next_id: u64,
    clock: Clock,
    /// The current packet starts a flow moved here: look its per-flow state up.
    moved_in: bool,
    seq: u16,
    xor: u32,
    /// Objects (below 64) the current packet updated: each is folded into its XOR vector once,
    /// so two updates of one object cannot cancel out.
    touched: u64,
    now_ns: u64,
    reported_ns: u64,
    batches: u32,
    wal: VecDeque<WalEntry>,
    last_read: Option<LastRead>,
    /// Reads of shared values since the last [`StoreClient::checkpointed`], with their TS
    /// vectors: what store-instance recovery selects a starting point from.
    reads: Vec<LastRead>,
    /// Updates logged since the last checkpoint.
    wal_since_checkpoint: usize,
    /// The current packet is a replay from the root's log: updates wait for the store's
    /// verdict (applied now, or a duplicate answered from the per-clock log).
    replaying: bool,
    /// Per packet of the current batch: its clock and the XOR of the ids this instance folded
    /// into its vector.
    batch_xors: Vec<(Clock, u32)>,
    /// Such entries waiting for the batch that carried their updates to be acknowledged.
    uncommitted: VecDeque<(u64, Vec<(Clock, u32)>)>,
    /// Entries whose updates the store has acknowledged, for [`StateHandle::take_commits`].
    committed: Vec<(Clock, u32)>,
    /// Per-flow keys written through since the last [`StoreClient::take_written`], collected
    /// only while another instance serves the same flows (a straggler and its clone).
    written: Option<Vec<(ObjectId, StateKey)>>,
    stats: ClientStats,
}

impl StoreClient {
    /// A client for instance `id` of `vertex`, whose NF declared `decls` and `custom` ops.
    pub fn new(
        conn: Box<dyn Connection>,
        id: InstanceId,
        vertex: u16,
        decls: &[StateDecl],
        custom: &[CustomOp],
        cfg: ClientConfig,
    ) -> StoreClient {
        let strategies: Vec<Strategy> = decls.iter().map(|d| strategy(d, &cfg)).collect();
        StoreClient {
            conn,
            id,
            vertex,
            exclusive: vec![false; decls.len()],
            exclusive_from_start: vec![false; decls.len()],
            custom: custom.to_vec(),
            caches: decls.iter().map(|_| Map::default()).collect(),
            dirty: Vec::new(),
            batch_start: Instant::now(),
            last_resend_check: Instant::now(),
            strategies,
            cfg,
            timers: Timers::default(),
            timer_changes: Map::default(),
            pending: Vec::new(),
            increments: Vec::new(),
            inflight: VecDeque::new(),
            next_batch: 1,
            replies: Replies::default(),
            notes: Vec::new(),
            next_id: 1,
            clock: Clock::default(),
            moved_in: false,
            seq: 0,
            xor: 0,
            touched: 0,
            now_ns: 0,
            reported_ns: 0,
            batches: 0,
            wal: VecDeque::new(),
            last_read: None,
            reads: Vec::new(),
            wal_since_checkpoint: 0,
            replaying: false,
            batch_xors: Vec::new(),
            uncommitted: VecDeque::new(),
            committed: Vec::new(),
            written: None,
            stats: ClientStats::default(),
        }
    }

    /// Starts (or stops) collecting the per-flow keys this instance writes through, for a
    /// twin that serves the same flows to forget its copies of ([`StoreClient::forget_cached`]).
    pub fn track_written(&mut self, on: bool) {
        self.written = if on { Some(self.written.take().unwrap_or_default()) } else { None };
    }

    /// The per-flow keys written through since the last call (while tracking).
    pub fn take_written(&mut self) -> Vec<(ObjectId, StateKey)> {
        self.written.as_mut().map(std::mem::take).unwrap_or_default()
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
    /// instance re-arms them). Call it after a flush.
    pub fn hand_over(&mut self, moved: impl Fn(&StateKey) -> bool) -> Vec<(ObjectId, StateKey, u64)> {
        for (o, cache) in self.caches.iter_mut().enumerate() {
            if matches!(self.strategies.get(o), Some(Strategy::Owned | Strategy::WriteThrough)) {
                cache.retain(|k, e| e.dirty || !moved(k));
            }
        }
        let timers: Vec<_> = self.timers.armed().into_iter().filter(|(_, k, _)| moved(k)).collect();
        for (o, k, _) in &timers {
            self.timers.cancel(*o, k);
            self.timer_changes.remove(&(*o, *k));
        }
        timers
    }

    /// Takes over timers another instance armed (flows moved here, an instance retired): armed
    /// here, and the store told at the end of the next batch that this instance arms them.
    pub fn take_over_timers(&mut self, timers: &[(ObjectId, StateKey, u64)]) {
        for (o, k, d) in timers {
            self.timers.set(*o, k, *d);
            self.timer_changes.insert((*o, *k), Some(*d));
        }
    }

    /// The instance this client serves.
    pub fn id(&self) -> InstanceId {
        self.id
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
    pub fn reads(&self) -> &[LastRead] {
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
        self.timers.armed()
    }

    /// Re-arms a timer a predecessor armed (recovery), without telling the store again.
    pub fn adopt_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
        self.timers.set(obj, key, deadline_ns);
    }

    /// Continues over a new connection (the store instance was replaced): batches not yet
    /// acknowledged are sent again, renumbered from 1 as the new connection expects; their
    /// tags make them apply once even if the rebuilt store re-executed them already.
    pub fn reconnect(&mut self, conn: Box<dyn Connection>) -> Result<(), StateError> {
        self.conn = conn;
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

    /// Requests in batches not yet acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.inflight.iter().map(|(_, b, _)| b.len()).sum()
    }

    fn key(&self, obj: ObjectId, key: &StateKey) -> StoreKey {
        StoreKey { vertex: self.vertex, object: obj.0, key: *key }
    }

    fn caches_now(&self, obj: ObjectId) -> bool {
        match self.strategies.get(usize::from(obj.0)) {
            Some(Strategy::Owned) => true,
            // Without other users, a shared object needs neither callbacks nor remote updates.
            Some(Strategy::SharedOften | Strategy::Callbacks | Strategy::SharedWriteThrough) => {
                self.exclusive.get(usize::from(obj.0)).copied().unwrap_or(false)
            }
            _ => false,
        }
    }

    /// Folds `(this instance, obj)` into the current packet's XOR vector, once per object.
    fn note_update(&mut self, obj: ObjectId) {
        let id = (u32::from(self.id.index()) << 16) | u32::from(obj.0);
        if obj.0 < 64 {
            let bit = 1u64 << obj.0;
            if self.touched & bit != 0 {
                return;
            }
            self.touched |= bit;
        }
        self.xor ^= id;
    }

    fn next_tag(&mut self) -> OpTag {
        self.stats.updates += 1;
        let tag = OpTag { clock: self.clock, seq: self.seq };
        self.seq = self.seq.wrapping_add(1);
        tag
    }

    fn request(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>, reply: bool) -> Request {
        let tag = if self.cfg.dedupe { tag } else { None };
        let id = self.next_id;
        self.next_id += 1;
        Request { id, client: self.id, tag, key, op, reply }
    }

    /// Turns collected increments into requests (for one value, or all).
    fn emit_increments(&mut self, only: Option<&StoreKey>) {
        if self.increments.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.increments.len() {
            if only.is_some_and(|k| self.increments[i].0 != *k) {
                i += 1;
                continue;
            }
            let (key, incrs) = self.increments.remove(i);
            let r = self.request(key, StoreOp::IncrMany(incrs), None, false);
            self.pending.push(r);
        }
    }

    fn send_pending(&mut self) -> Result<(), StateError> {
        self.emit_increments(None);
        if self.pending.is_empty() {
            return Ok(());
        }
        self.stats.requests += self.pending.len() as u64;
        let batch: Arc<[Request]> = Arc::from(std::mem::take(&mut self.pending));
        let b = self.next_batch;
        self.next_batch += 1;
        self.conn.send(b, batch.clone()).map_err(backend)?;
        self.inflight.push_back((b, batch, Instant::now()));
        if self.inflight.len() > self.cfg.max_inflight {
            self.wait_for_acks(self.cfg.max_inflight / 2)?;
        }
        Ok(())
    }

    /// Waits until at most `left` batches are unacknowledged. Fails only if the store makes
    /// no progress for `call_timeout`.
    fn wait_for_acks(&mut self, left: usize) -> Result<(), StateError> {
        let mut last_progress = Instant::now();
        while self.inflight.len() > left {
            let before = self.inflight.len();
            self.absorb()?;
            if self.inflight.len() <= left {
                break;
            }
            if self.inflight.len() < before {
                last_progress = Instant::now();
            }
            let idle = last_progress.elapsed();
            if idle >= self.cfg.call_timeout {
                return Err(StateError::Backend(format!(
                    "{} request(s) unacknowledged; the store made no progress for {:?}",
                    self.unacknowledged(),
                    self.cfg.call_timeout
                )));
            }
            let wait = (self.cfg.call_timeout - idle).min(self.cfg.retransmit_after);
            self.conn.wait(&mut self.replies, wait).map_err(backend)?;
            self.settle_responses(None);
        }
        Ok(())
    }

    /// Queues a non-blocking request; it is sent with the batch and retransmitted until acked.
    fn queue_nb(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) {
        self.emit_increments(Some(&key));
        let r = self.request(key, op, tag, false);
        self.pending.push(r);
    }

    /// Sends `op` (after everything queued) and waits for its answer.
    fn call(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Result<Response, StateError> {
        self.emit_increments(None);
        let r = self.request(key, op, tag, true);
        let id = r.id;
        self.pending.push(r);
        self.send_pending()?;
        self.stats.round_trips += 1;
        let deadline = Instant::now() + self.cfg.call_timeout;
        loop {
            if let Some(resp) = self.settle_responses(Some(id)) {
                if resp.replayed {
                    self.stats.duplicates += 1;
                }
                return Ok(resp);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StateError::Backend(format!("no answer within {:?}", self.cfg.call_timeout)));
            }
            self.conn.wait(&mut self.replies, deadline - now).map_err(backend)?;
        }
    }

    /// Consumes the received responses: acknowledgements of non-blocking requests are settled,
    /// the answer to `awaiting` (the blocking call in progress) is returned, the rest (answers
    /// to fire-and-forget requests) are dropped.
    fn settle_responses(&mut self, awaiting: Option<u64>) -> Option<Response> {
        let mut answer = None;
        for r in self.replies.responses.drain(..) {
            if Some(r.id) == awaiting {
                answer = Some(r);
            } else if r.result.is_err() {
                // Only failures of requests nobody waits for arrive here.
                self.stats.async_errors += 1;
            }
        }
        let acked = !self.replies.acked.is_empty();
        for b in self.replies.acked.drain(..) {
            if let Some(pos) = self.inflight.iter().position(|(x, _, _)| *x == b) {
                self.inflight.remove(pos);
            }
        }
        if acked {
            // A store applies a connection's batches in order, so everything sent before the
            // oldest unacknowledged batch is applied.
            let floor = self.inflight.front().map_or(u64::MAX, |(b, _, _)| *b);
            while self.uncommitted.front().is_some_and(|(b, _)| *b < floor) {
                if let Some((_, v)) = self.uncommitted.pop_front() {
                    self.committed.extend(v);
                }
            }
        }
        answer
    }

    fn absorb(&mut self) -> Result<(), StateError> {
        self.conn.poll(&mut self.replies).map_err(backend)?;
        self.settle_responses(None);
        self.conn.notifications(&mut self.notes).map_err(backend)?;
        for n in std::mem::take(&mut self.notes) {
            if let Notification::Changed { key, value } = n {
                self.stats.callbacks += 1;
                if let Some(c) = self.caches.get_mut(usize::from(key.object)) {
                    if let Some(e) = c.get_mut(&key.key) {
                        e.value = value;
                    }
                }
            }
            // Timer notifications concern timers this client also fires itself at the right
            // packet; handovers are acted on by the flow-move protocol.
        }
        // Retransmit what has not been acknowledged in time (applied once, by tag). Checked a
        // few times per timeout, not per batch.
        let now = Instant::now();
        if self.inflight.is_empty() || now.duration_since(self.last_resend_check) < self.cfg.retransmit_after / 4 {
            return Ok(());
        }
        self.last_resend_check = now;
        for (b, batch, sent) in self.inflight.iter_mut() {
            if now.duration_since(*sent) < self.cfg.retransmit_after {
                continue;
            }
            *sent = now;
            self.stats.retransmits += batch.len() as u64;
            self.stats.requests += batch.len() as u64;
            self.conn.send(*b, batch.clone()).map_err(backend)?;
        }
        Ok(())
    }

    fn log_update(&mut self, tag: OpTag, key: StoreKey, op: &StateOp) {
        if self.wal.len() >= self.cfg.wal_capacity {
            self.wal.pop_front();
        }
        self.wal.push_back(WalEntry { tag, key, op: op.clone() });
        self.wal_since_checkpoint += 1;
    }

    fn local(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let skey = self.key(obj, key);
        let idx = usize::from(obj.0);
        let present = self.caches.get(idx).is_some_and(|c| c.contains_key(key));
        let per_flow = self.strategies.get(idx) == Some(&Strategy::Owned);
        let sole_user = self.exclusive_from_start.get(idx).copied().unwrap_or(false);
        if present {
            self.stats.cache_hits += 1;
        } else if self.cfg.fresh && ((per_flow && !self.moved_in) || sole_user) {
            // A flow this instance has owned from its first packet, or an object nobody else
            // has used: the store has nothing this cache does not.
            if let Some(c) = self.caches.get_mut(idx) {
                c.insert(*key, Cached::new(None));
            }
        } else {
            // First touch of this value here: its state may already exist (moved flow,
            // restarted instance), so read it once.
            let resp = self.call(skey, StoreOp::State(StateOp::Get), None)?;
            let value = resp.result.map_err(StateError::Backend)?;
            if let Some(c) = self.caches.get_mut(idx) {
                c.insert(*key, Cached::new(value));
            }
        }
        let update = op.is_update();
        let Some(entry) = self.caches.get_mut(idx).and_then(|c| c.get_mut(key)) else {
            return Err(StateError::UnknownObject(obj));
        };
        let recorded = if update { Some(op.clone()) } else { None };
        let r = apply(&mut entry.value, op, &self.custom)?;
        if let Some(op) = recorded {
            if entry.record(&op) {
                self.dirty.push((obj, *key));
            }
        }
        Ok(r)
    }

    fn remote(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let skey = self.key(obj, key);
        let tag = if op.is_update() { Some(self.next_tag()) } else { None };
        let logged = tag.map(|t| (t, op.clone()));
        let resp = self.call(skey, StoreOp::State(op), tag)?;
        // An update the store recognised as a duplicate (a replay) is not logged again: a
        // rebuilt store must not re-execute it.
        if let (Some((t, op)), false) = (logged, resp.replayed) {
            self.log_update(t, skey, &op);
        }
        if let (Some(ts), Ok(v)) = (&resp.ts, &resp.result) {
            let read = LastRead { key: skey, value: v.clone(), ts: ts.clone() };
            if self.cfg.write_through {
                if self.reads.len() >= self.cfg.wal_capacity {
                    self.reads.remove(0);
                }
                self.reads.push(read.clone());
            }
            self.last_read = Some(read);
        }
        resp.result.map_err(StateError::Backend)
    }

    /// A per-flow operation in fault-tolerant mode (see [`ClientConfig::write_through`]).
    fn write_through(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let skey = self.key(obj, key);
        let idx = usize::from(obj.0);
        let present = self.caches.get(idx).is_some_and(|c| c.contains_key(key));
        if present {
            self.stats.cache_hits += 1;
        } else {
            let value = if self.cfg.fresh && !self.moved_in && !self.replaying {
                None
            } else {
                let resp = self.call(skey, StoreOp::State(StateOp::Get), None)?;
                resp.result.map_err(StateError::Backend)?
            };
            if let Some(c) = self.caches.get_mut(idx) {
                c.insert(*key, Cached::new(value));
            }
        }
        if !op.is_update() {
            let Some(entry) = self.caches.get_mut(idx).and_then(|c| c.get_mut(key)) else {
                return Err(StateError::UnknownObject(obj));
            };
            return apply(&mut entry.value, op, &self.custom);
        }
        let tag = self.next_tag();
        if self.replaying {
            // The store decides: a duplicate is answered from its per-clock log and is already
            // part of the value this copy was read from.
            let resp = self.call(skey, StoreOp::State(op.clone()), Some(tag))?;
            if resp.replayed {
                return resp.result.map_err(StateError::Backend);
            }
            // Logged like shared updates: a rebuilt store finds its TS clocks among them.
            self.log_update(tag, skey, &op);
            if let Some(w) = &mut self.written {
                w.push((obj, *key));
            }
            let Some(entry) = self.caches.get_mut(idx).and_then(|c| c.get_mut(key)) else {
                return Err(StateError::UnknownObject(obj));
            };
            let _ = apply(&mut entry.value, op, &self.custom)?;
            return resp.result.map_err(StateError::Backend);
        }
        let Some(entry) = self.caches.get_mut(idx).and_then(|c| c.get_mut(key)) else {
            return Err(StateError::UnknownObject(obj));
        };
        let r = apply(&mut entry.value, op.clone(), &self.custom)?;
        if let Some(w) = &mut self.written {
            w.push((obj, *key));
        }
        self.note_update(obj);
        self.log_update(tag, skey, &op);
        self.queue_nb(skey, StoreOp::State(op), Some(tag));
        Ok(r)
    }

    fn flush_dirty(&mut self) {
        for (obj, k) in std::mem::take(&mut self.dirty) {
            let Some(e) = self.caches.get_mut(usize::from(obj.0)).and_then(|c| c.get_mut(&k)) else { continue };
            if !e.dirty {
                continue;
            }
            e.dirty = false;
            let ops = match (e.list_ops.take(), &e.value) {
                (Some(ops), _) => ops,
                (None, Some(v)) => vec![StateOp::Set(v.clone())],
                (None, None) => vec![StateOp::Delete],
            };
            let key = StoreKey { vertex: self.vertex, object: obj.0, key: k };
            for op in ops {
                self.queue_nb(key, StoreOp::State(op), None);
            }
            self.stats.flushed += 1;
        }
        for cache in &mut self.caches {
            // Knowing a value is absent saves a lookup, but flows come and go: past a bound, such
            // entries are dropped (and looked up again if needed).
            if cache.len() > ABSENT_LIMIT {
                cache.retain(|_, e| e.value.is_some() || e.dirty);
            }
        }
    }

    /// Waits until every request sent has been acknowledged.
    fn drain_acks(&mut self) -> Result<(), StateError> {
        self.send_pending()?;
        self.wait_for_acks(0)
    }
}

/// Cached entries per object above which known-absent values are forgotten at a flush.
const ABSENT_LIMIT: usize = 1 << 16;

fn backend(e: StoreError) -> StateError {
    StateError::Backend(e.to_string())
}

fn strategy(d: &StateDecl, cfg: &ClientConfig) -> Strategy {
    if cfg.mode == Mode::External {
        return Strategy::Remote;
    }
    if cfg.write_through {
        return match (d.scope.is_per_flow(), d.pattern) {
            (_, AccessPattern::WriteMostly) => Strategy::Remote,
            (false, _) => Strategy::SharedWriteThrough,
            (true, _) => Strategy::WriteThrough,
        };
    }
    match (d.scope.is_per_flow(), d.pattern) {
        (_, AccessPattern::WriteMostly) => Strategy::Remote,
        (true, _) => Strategy::Owned,
        (false, AccessPattern::ReadHeavy) => Strategy::Callbacks,
        (false, AccessPattern::ReadWriteOften) => Strategy::SharedOften,
    }
}

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

    fn exec_nb(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<(), StateError> {
        // (A shared write-through object while exclusive is covered by `caches_now`.)
        let write_through = self.strategies.get(usize::from(obj.0)) == Some(&Strategy::WriteThrough);
        if self.caches_now(obj) || self.cfg.mode != Mode::Async || write_through || self.replaying {
            return self.exec(obj, key, op).map(|_| ());
        }
        let idx = usize::from(obj.0);
        if self.strategies.get(idx) == Some(&Strategy::Callbacks) {
            if let Some(c) = self.caches.get_mut(idx) {
                c.remove(key);
            }
        }
        let skey = self.key(obj, key);
        let tag = self.next_tag();
        self.log_update(tag, skey, &op);
        self.note_update(obj);
        if let (StateOp::Incr(d), true) = (&op, self.cfg.dedupe) {
            let d = *d;
            // Counters: one request per value per batch, each increment still tagged.
            match self.increments.iter_mut().find(|(k, _)| *k == skey) {
                Some((_, v)) => v.push((tag, d)),
                None => self.increments.push((skey, vec![(tag, d)])),
            }
            return Ok(());
        }
        self.queue_nb(skey, StoreOp::State(op), Some(tag));
        Ok(())
    }

    fn set_timer(&mut self, obj: ObjectId, key: &StateKey, deadline_ns: u64) {
        // Fired here, at the same packet as with local state; the store keeps a copy (sent once
        // per batch) so that a replacement instance is told if this one is gone.
        self.timers.set(obj, key, deadline_ns);
        self.timer_changes.insert((obj, *key), Some(deadline_ns));
    }

    fn cancel_timer(&mut self, obj: ObjectId, key: &StateKey) {
        if self.timers.cancel(obj, key) {
            self.timer_changes.insert((obj, *key), None);
        }
    }

    fn expired(&mut self, now_ns: u64, max: usize, out: &mut Vec<TimerFired>) {
        self.now_ns = self.now_ns.max(now_ns);
        let start = out.len();
        let mut deadlines = Vec::new();
        self.timers.expired_at(now_ns, max, out, &mut deadlines);
        if out.len() == start {
            return;
        }
        let fired: Vec<TimerFired> = out.drain(start..).collect();
        for (f, deadline_ns) in fired.into_iter().zip(deadlines) {
            let shared = !matches!(self.strategies.get(usize::from(f.object.0)), Some(Strategy::WriteThrough));
            if self.cfg.write_through && shared {
                // Several instances may arm timers on a shared key: only a copy the store still
                // holds expires it (one round trip per expiry of a shared key).
                let key = self.key(f.object, &f.key);
                let op = StoreOp::ExpireTimer { deadline_ns };
                // Otherwise stale (re-armed or cancelled elsewhere), or the store is
                // unreachable: a replacement adopts it and fires it again.
                if let Ok(Ok(Some(Value::Int(1)))) = self.call(key, op, None).map(|r| r.result) {
                    out.push(f);
                }
                continue;
            }
            self.timer_changes.insert((f.object, f.key), None);
            out.push(f);
        }
    }

    fn begin_batch(&mut self) {
        self.batch_start = Instant::now();
        let _ = self.absorb();
    }

    fn end_batch(&mut self) {
        self.batches = self.batches.wrapping_add(1);
        if self.cfg.flush_every > 0 && self.batches.is_multiple_of(self.cfg.flush_every) {
            self.flush_dirty();
        }
        let changes: Vec<_> = self.timer_changes.drain().collect();
        for ((obj, key), change) in changes {
            let skey = self.key(obj, &key);
            let op = match change {
                Some(deadline_ns) => StoreOp::SetTimer { deadline_ns },
                None => StoreOp::CancelTimer,
            };
            self.queue_nb(skey, op, None);
        }
        if self.now_ns > self.reported_ns {
            self.reported_ns = self.now_ns;
            let key = StoreKey { vertex: self.vertex, object: 0, key: StateKey::Unit };
            let r = self.request(key, StoreOp::AdvanceTime(self.now_ns), None, false);
            self.pending.push(r);
        }
        let _ = self.send_pending();
        if !self.batch_xors.is_empty() {
            // Every update of this batch's packets has been sent by now, at the latest in the
            // batch just sent.
            let last_sent = self.next_batch - 1;
            let xors = std::mem::take(&mut self.batch_xors);
            if self.inflight.iter().any(|(b, _, _)| *b == last_sent) {
                self.uncommitted.push_back((last_sent, xors));
            } else {
                self.committed.extend(xors);
            }
        }
        if self.cfg.mode != Mode::Async {
            // Models without "no wait for ACK": the batch is done when the store has it all.
            let _ = self.drain_acks();
        }
    }

    fn begin_packet(&mut self, meta: &Meta) {
        self.clock = meta.clock;
        self.moved_in = meta.flags.contains(sluice_packet::MetaFlags::FIRST);
        self.replaying = meta.flags.contains(sluice_packet::MetaFlags::REPLAYED);
        self.seq = 0;
        self.xor = 0;
        self.touched = 0;
        self.now_ns = self.now_ns.max(meta.ts_ns);
    }

    fn end_packet(&mut self, meta: &mut Meta) {
        meta.xor ^= self.xor;
        if self.xor != 0 {
            self.batch_xors.push((self.clock, self.xor));
        }
    }

    fn take_commits(&mut self, out: &mut Vec<(Clock, u32)>) {
        let _ = self.absorb();
        out.append(&mut self.committed);
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn set_exclusive(&mut self, obj: ObjectId, exclusive: bool) {
        let idx = usize::from(obj.0);
        let was = self.exclusive.get(idx).copied().unwrap_or(false);
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
        ]
    }

    fn flush(&mut self) -> Result<(), StateError> {
        self.flush_dirty();
        self.send_pending()?;
        self.drain_acks()
    }
}
