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

mod cached;
mod config;
mod exchange;
mod handle;
mod recovery;
mod replay_history;
mod updates;
mod vertex_timers;
use cached::Cached;
use config::PROCESSED_MARK_SEQ;
pub use config::{ClientConfig, Mode, NONDET_OBJECT, PROCESSED_OBJECT};
pub use vertex_timers::{Answer, Ask, VertexTimerTable};

use crate::backend::{Connection, StoreError};
use crate::wire::{Notification, OpTag, Replies, Request, Response, StoreKey, StoreOp, TsVector};
use sluice_packet::{Clock, InstanceId, Meta};
use sluice_state::{
    ops::apply, AccessPattern, CustomOp, DueTimers, ObjectId, StateDecl, StateError, StateHandle, StateKey, StateOp,
    TimerFired, Timers, Value,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Map<K, V> = hashbrown::HashMap<K, V, ahash::RandomState>;

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
    /// Blocking calls that got no answer (the NF saw a state error and went on without the
    /// operation: whatever it did then is not what it would have done).
    pub failed_calls: u64,
    /// Change callbacks received.
    pub callbacks: u64,
    /// Dirty values flushed.
    pub flushed: u64,
    /// Updates the NF issued (any strategy).
    pub updates: u64,
    /// Commit values made: per packet, the XOR of the objects its non-blocking updates touched.
    pub commits_made: u64,
    /// Commit values the driver took ([`sluice_state::StateHandle::take_commits`]); the rest
    /// wait for the store's acknowledgement or for the driver.
    pub commits_taken: u64,
}

/// The timers on a vertex's shared keys, one table for all its instances in a process
/// ([`StoreClient::share_vertex_timers`]).
pub type VertexTimers = Arc<VertexTimerTable>;

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

/// The most room a counter's list of increments gets up front, however many one had before.
const MAX_INCREMENT_ROOM: usize = 4096;

/// A write-ahead log entry: a shared-state update as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct WalEntry {
    /// Its tag.
    pub tag: OpTag,
    /// The value it updates.
    pub key: StoreKey,
    /// The operation.
    pub op: StateOp,
    /// When its packet entered the chain (`Meta::ingress_ns`, unique and in input order): a
    /// store rebuild re-executes the updates of several instances in this order, which with
    /// several roots (independent clocks) is not the clocks' order.
    pub entry_ns: u64,
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

/// What an update of `obj` by instance `id` folds into its packet's XOR vector. It names the
/// vertex too, and is never zero: the index and object alone made the NAT's and the portscan
/// detector's first instances cancel each other on objects with the same number, and made
/// object 0 of instance 0 invisible, so the root deleted log entries whose updates were still
/// on their way to the store (a store rebuilt meanwhile then counted them twice). Mixed over
/// 64 bits (the SplitMix64 finaliser), a set of different updates cancels out with a chance of
/// about 2^-64; in 32 bits it was 2^-32, which a long run can reach.
fn xor_id(id: InstanceId, obj: ObjectId) -> u64 {
    let raw = (u64::from(id.vertex()) << 32) | (u64::from(id.index()) << 16) | u64::from(obj.0);
    let mut z = raw.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).max(1)
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
    /// When the batch whose requests were last sent began ([`StoreClient::defers_batch`]).
    last_sent_at: Instant,
    /// When unacknowledged requests were last checked for retransmission.
    last_resend_check: Instant,
    timers: Timers,
    /// Per object, its timers' slack ([`StateDecl::timer_slack_ns`]).
    timer_slack: Vec<u64>,
    /// Per object: scoped wider than a flow (its keys may be shared by the vertex's instances).
    shared_objects: Vec<bool>,
    /// While a vertex may have several instances: the timers on its shared keys, one table for
    /// all of them ([`StoreClient::share_vertex_timers`]).
    vertex_timers: Option<VertexTimers>,
    /// Timer changes not yet mirrored to the store, coalesced per key (`None`: cancelled).
    timer_changes: Map<(ObjectId, StateKey), Option<u64>>,
    pending: Vec<Request>,
    /// Tagged increments of write-mostly values collected during the batch, sent as one
    /// request per value (in first-use order) before anything else touches the value.
    increments: Vec<(StoreKey, Vec<(OpTag, i64)>)>,
    /// The most increments one counter had in a batch so far: the room a counter's list gets
    /// at its first increment (lists travel with their requests, so each batch makes new ones).
    increment_room: usize,
    /// Without tags (`ClientConfig::dedupe` off): each counter's increments of the batch,
    /// summed, sent as one increment.
    sums: Vec<(StoreKey, i64)>,
    /// Sent batches not yet acknowledged, oldest first, with when they were (last) sent:
    /// retransmitted unchanged, under the same number, after a timeout; the store applies each
    /// number once and in order.
    inflight: VecDeque<(u64, Arc<[Request]>, Instant)>,
    /// The number of the next batch.
    next_batch: u64,
    replies: Replies,
    /// The request id of the blocking call in progress, and its answer once it arrived: the
    /// answer may arrive while the call still waits for acknowledgements (backpressure), and
    /// must be kept for it then.
    call: Option<(u64, Option<Response>)>,
    notes: Vec<Notification>,
    next_id: u64,
    clock: Clock,
    /// The current packet's entry time (its write-ahead log entries carry it).
    entry_ns: u64,
    /// The current packet starts a flow moved here: look its per-flow state up.
    moved_in: bool,
    /// [`StoreClient::numbers_updates`], kept as the configuration changes (asked per packet).
    numbers: bool,
    seq: u32,
    /// Whether the instance is firing timers now: updates are then numbered apart from the
    /// packet's own, by timer ([`crate::timer_update_seq`]), so the packet's own keep their
    /// tags whatever timers an instance finds due (a replacement processing the packet again
    /// may find others; with one count, its first own update took the tag of the predecessor's
    /// timer update, the store answered it from that update's log, and an LB's replayed new
    /// connection got no backend — a packet lost after a node failure).
    firing_timers: bool,
    /// The timer whose handler runs now (`StateHandle::timer_fires`), and how many updates it
    /// made so far.
    firing: (Option<(ObjectId, StateKey)>, u32),
    xor: u64,
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
    reads: VecDeque<LastRead>,
    /// Updates logged since the last checkpoint.
    wal_since_checkpoint: usize,
    /// The current packet is a replay from the root's log: updates wait for the store's
    /// verdict (applied now, or a duplicate answered from the per-clock log).
    replaying: bool,
    /// What a replacement took over of the store's earlier values, for its replayed reads.
    replay_history: replay_history::ReplayHistory,
    /// Per packet of the current batch: its clock and the XOR of the ids this instance folded
    /// into its vector.
    batch_xors: Vec<(Clock, u64)>,
    /// The clocks of the current batch's packets that updated nothing, to be marked processed
    /// ([`ClientConfig::mark_processed`]).
    unmarked: Vec<Clock>,
    /// Such entries waiting for the batch that carried their updates to be acknowledged.
    uncommitted: VecDeque<(u64, Vec<(Clock, u64)>)>,
    /// Emptied such lists, for the next batches (no allocation per batch).
    xor_spares: Vec<Vec<(Clock, u64)>>,
    /// Entries whose updates the store has acknowledged, for [`StateHandle::take_commits`].
    committed: Vec<(Clock, u64)>,
    /// Per-flow keys written through since the last [`StoreClient::take_written`], collected
    /// only while another instance serves the same flows (a straggler and its clone).
    written: Option<Vec<(ObjectId, StateKey)>>,
    /// Timers armed (`Some(deadline)`) or cancelled/fired (`None`) since the last
    /// [`StoreClient::take_timer_changes`], collected while tracking like `written`: the twin
    /// mirrors them, as both fire the shared flows' timers at whichever packet comes next.
    twin_timer_changes: Option<Vec<(ObjectId, StateKey, Option<u64>)>>,
    stats: ClientStats,
}

impl StoreClient {
    /// A client for instance `id` of `vertex`, whose NF declared `decls` and `custom` ops.
    pub fn new(
        mut conn: Box<dyn Connection>,
        id: InstanceId,
        vertex: u16,
        decls: &[StateDecl],
        custom: &[CustomOp],
        cfg: ClientConfig,
    ) -> StoreClient {
        let strategies: Vec<Strategy> = decls.iter().map(|d| strategy(d, &cfg)).collect();
        conn.allow_lazy_batches(lazy_batches(&cfg));
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
            last_sent_at: Instant::now(),
            last_resend_check: Instant::now(),
            strategies,
            numbers: updates::numbers_updates(&cfg),
            cfg,
            timers: Timers::default(),
            timer_slack: decls.iter().map(|d| d.timer_slack_ns).collect(),
            shared_objects: decls.iter().map(|d| !d.scope.is_per_flow()).collect(),
            vertex_timers: None,
            timer_changes: Map::default(),
            pending: Vec::new(),
            increments: Vec::new(),
            increment_room: 16,
            sums: Vec::new(),
            inflight: VecDeque::new(),
            next_batch: 1,
            replies: Replies::default(),
            call: None,
            notes: Vec::new(),
            next_id: 1,
            clock: Clock::default(),
            entry_ns: 0,
            moved_in: false,
            seq: 0,
            firing_timers: false,
            firing: (None, 0),
            xor: 0,
            touched: 0,
            now_ns: 0,
            reported_ns: 0,
            batches: 0,
            wal: VecDeque::new(),
            last_read: None,
            reads: VecDeque::new(),
            wal_since_checkpoint: 0,
            replaying: false,
            replay_history: replay_history::ReplayHistory::default(),
            batch_xors: Vec::new(),
            unmarked: Vec::new(),
            uncommitted: VecDeque::new(),
            xor_spares: Vec::new(),
            committed: Vec::new(),
            written: None,
            twin_timer_changes: None,
            stats: ClientStats::default(),
        }
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
    #[inline]
    fn note_update(&mut self, obj: ObjectId) {
        if !self.cfg.commits {
            return;
        }
        if obj.0 < 64 {
            let bit = 1u64 << obj.0;
            if self.touched & bit != 0 {
                return;
            }
            self.touched |= bit;
        }
        self.xor ^= xor_id(self.id, obj);
    }

    /// The number [`StoreClient::next_tag`] gives the next update.
    fn next_seq(&self) -> u32 {
        if self.firing_timers {
            let (timer, n) = &self.firing;
            crate::timer_update_seq(timer.as_ref().map(|(o, k)| (o.0, k)), *n)
        } else {
            self.seq
        }
    }

    #[inline]
    fn next_tag(&mut self) -> OpTag {
        self.stats.updates += 1;
        self.number_update()
    }

    /// The next update's tag, without counting an update (an emulated one applies nothing).
    #[inline]
    fn number_update(&mut self) -> OpTag {
        let seq = if self.firing_timers {
            let (timer, n) = &mut self.firing;
            let seq = crate::timer_update_seq(timer.as_ref().map(|(o, k)| (o.0, k)), *n);
            *n = n.wrapping_add(1);
            seq
        } else {
            let seq = self.seq;
            // The packet's own stay below the timers' bit.
            self.seq = (seq + 1) & !crate::TIMER_UPDATE;
            seq
        };
        OpTag { clock: self.clock, seq }
    }

    fn request(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>, reply: bool) -> Request {
        let tag = if self.cfg.dedupe { tag } else { None };
        let id = self.next_id;
        self.next_id += 1;
        Request { id, client: self.id, tag, key, op, reply }
    }

    /// Keeps a copy of a tagged update for a store rebuild (only runs that may lose their store
    /// keep a write-ahead log: out of line, off the others' per-update path).
    #[inline(never)]
    fn log_update(&mut self, tag: OpTag, key: StoreKey, op: &StateOp) {
        if self.cfg.wal_capacity == 0 {
            return;
        }
        if self.wal.len() >= self.cfg.wal_capacity {
            self.wal.pop_front();
        }
        self.wal.push_back(WalEntry { tag, key, op: op.clone(), entry_ns: self.entry_ns });
        self.wal_since_checkpoint += 1;
    }

    fn local(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let idx = usize::from(obj.0);
        // A hit (most operations): one lookup, and the key is not copied.
        if let Some(entry) = self.caches.get_mut(idx).and_then(|c| c.get_mut(key)) {
            self.stats.cache_hits += 1;
            if op == StateOp::Get {
                // The most frequent operation of all (a NAT's per-packet look at its
                // connection): a copy of the value, without the general update path.
                return Ok(entry.read());
            }
            let (r, dirtied) = apply_cached(entry, op, &self.custom)?;
            if dirtied {
                self.dirty.push((obj, *key));
            }
            return Ok(r);
        }
        let per_flow = self.strategies.get(idx) == Some(&Strategy::Owned);
        let sole_user = self.exclusive_from_start.get(idx).copied().unwrap_or(false);
        let value = if self.cfg.fresh && ((per_flow && !self.moved_in) || sole_user) {
            // A flow this instance has owned from its first packet, or an object nobody else
            // has used: the store has nothing this cache does not. An operation that leaves
            // the value absent needs no entry: knowing it is absent costs nothing here, and
            // entries for every key an NF only looks at (a detector's per-packet test of a
            // flow it does not track) would fill the cache, and every lookup's memory.
            if op == StateOp::Get || changes_nothing(&op, None) {
                let mut absent = None;
                return apply(&mut absent, op, &self.custom);
            }
            None
        } else {
            // First touch of this value here: its state may already exist (moved flow,
            // restarted instance), so read it once.
            let resp = self.call(self.key(obj, key), StoreOp::State(StateOp::Get), None)?;
            resp.result.map_err(StateError::Backend)?
        };
        let Some(cache) = self.caches.get_mut(idx) else { return Err(StateError::UnknownObject(obj)) };
        let entry = cache.entry(*key).or_insert_with(|| Cached::new(value));
        let (r, dirtied) = apply_cached(entry, op, &self.custom)?;
        if dirtied {
            self.dirty.push((obj, *key));
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
                    self.reads.pop_front();
                }
                self.reads.push_back(read.clone());
            }
            self.last_read = Some(read);
        }
        resp.result.map_err(StateError::Backend)
    }

    /// A per-flow operation in fault-tolerant mode (see [`ClientConfig::write_through`]).
    fn write_through(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<Option<Value>, StateError> {
        let idx = usize::from(obj.0);
        if self.replaying && op == StateOp::Get {
            // A replayed packet reads a value as its first run did: the copy here may hold
            // updates of later packets ([`crate::Backend`]'s reads as of a clock) — of the
            // flow's, or, for a value this instance has alone (shared across flows), of any
            // flow's: a detector's walk of a host. Tagged with the packet's clock and the
            // number its next update will get, so that its own updates before the read count;
            // the read takes no number itself. A replacement that took over the store's
            // earlier values answers it itself (the history has every logged key of the vertex).
            let skey = self.key(obj, key);
            let seq = self.next_seq();
            // Not while another instance serves the same flows (a straggler's clone): its
            // updates since reach the store's log, not this history.
            let alone = !self.moved_in && self.written.is_none();
            let known = if alone { self.replay_history.read_at(&skey, self.clock, seq) } else { None };
            match known {
                Some(replay_history::ReadAt::Was(v)) => return Ok(v),
                // The copy here, read below.
                Some(replay_history::ReadAt::Now) => {}
                None => {
                    let tag = OpTag { clock: self.clock, seq };
                    let resp = self.call(skey, StoreOp::State(StateOp::Get), Some(tag))?;
                    return resp.result.map_err(StateError::Backend);
                }
            }
        }
        if !op.is_update() {
            // A read of a cached value (most of them): one lookup, and the key is not copied.
            if let Some(entry) = self.caches.get_mut(idx).and_then(|c| c.get_mut(key)) {
                self.stats.cache_hits += 1;
                return apply(&mut entry.value, op, &self.custom);
            }
        }
        let skey = self.key(obj, key);
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
        // A custom operation is sent as its outcome: the store need not run it again, and
        // Redis, which cannot, would otherwise cost a second call.
        let outcome = matches!(op, StateOp::Custom { .. })
            .then(|| StoreOp::Write { value: entry.value.clone(), result: r.clone() });
        if let Some(w) = &mut self.written {
            w.push((obj, *key));
        }
        self.note_update(obj);
        self.log_update(tag, skey, &op);
        self.queue_nb(skey, outcome.unwrap_or(StoreOp::State(op)), Some(tag));
        Ok(r)
    }

    /// Whether the store keeps copies of this instance's timers: for a replacement to adopt
    /// (fault tolerance, which writes through) and for a straggler's clone to share. Nothing
    /// else reads them — flows moved between instances take their timers from the instance
    /// that gives them up — so a run writing back sends none: the idle timer an LB or a NAT
    /// re-arms with every packet cost a request a packet when flows interleave (half of what
    /// the example chain sent its store).
    #[inline]
    fn copies_timers(&self) -> bool {
        self.cfg.write_through || self.twin_timer_changes.is_some()
    }

    /// Whether this batch's requests wait for the next batch's: only where that holds nothing up
    /// for long ([`lazy_batches`]), and for at most [`DEFER_FOR`] since the last
    /// batch sent, so that several batches go as one (a counter's sums added up across them,
    /// one message and one acknowledgement for the shard) while a quiet input still sends at
    /// once. Every wait for the store (a call, a flush) sends what is pending first.
    fn defers_batch(&self) -> bool {
        lazy_batches(&self.cfg) && self.batch_start.saturating_duration_since(self.last_sent_at) < DEFER_FOR
    }

    /// Sends what the batches since the last send left (their requests, the client's time),
    /// and makes their packets' XOR vectors wait for its acknowledgement. `at`: when the send
    /// counts as made ([`StoreClient::defers_batch`] measures from it).
    pub(super) fn send_batches(&mut self, at: Instant) {
        if self.now_ns > self.reported_ns {
            self.reported_ns = self.now_ns;
            let key = StoreKey { vertex: self.vertex, object: 0, key: StateKey::Unit };
            let r = self.request(key, StoreOp::AdvanceTime(self.now_ns), None, false);
            self.pending.push(r);
        }
        self.last_sent_at = at;
        let _ = self.send_pending();
        if !self.batch_xors.is_empty() {
            // Every update of these batches' packets has been sent by now, at the latest in the
            // batch just sent.
            let last_sent = self.next_batch - 1;
            if self.inflight.iter().any(|(b, _, _)| *b == last_sent) {
                let fresh = self.xor_spares.pop().unwrap_or_default();
                let xors = std::mem::replace(&mut self.batch_xors, fresh);
                self.uncommitted.push_back((last_sent, xors));
            } else {
                self.committed.append(&mut self.batch_xors);
            }
        }
        if self.cfg.mode != Mode::Async {
            // Models without "no wait for ACK": the batch is done when the store has it all.
            let _ = self.drain_acks();
        }
    }

    /// Sends what deferred batches left once [`DEFER_FOR`] has passed since the last send:
    /// asked between batches and while the instance idles, so that packets whose commits wait
    /// for it are not held by a quiet input.
    pub(super) fn send_overdue(&mut self) {
        let waiting = !(self.pending.is_empty() && self.batch_xors.is_empty());
        if !waiting && self.timer_changes.is_empty() && self.unmarked.is_empty() {
            return;
        }
        let now = Instant::now();
        if now.saturating_duration_since(self.last_sent_at) >= DEFER_FOR {
            self.queue_timer_changes();
            self.queue_processed_marks();
            self.send_batches(now);
        }
    }

    /// Records a timer armed (`Some(deadline)`) or cancelled for the store's copy, sent with
    /// the batch, if the store keeps copies ([`StoreClient::copies_timers`]).
    #[inline]
    pub(super) fn note_timer_change(&mut self, obj: ObjectId, key: &StateKey, change: Option<u64>) {
        if self.copies_timers() {
            self.timer_changes.insert((obj, *key), change);
        }
    }

    /// Queues the timers armed and cancelled since the last call, one request per key.
    pub(super) fn queue_timer_changes(&mut self) {
        if self.timer_changes.is_empty() {
            // Always, where the store keeps no copies: not even an empty map made per batch.
            return;
        }
        // Taken out while its changes are queued, and put back with its room for the next batch.
        let mut changes = std::mem::take(&mut self.timer_changes);
        if let Some(twin) = &mut self.twin_timer_changes {
            twin.extend(changes.iter().map(|((obj, key), change)| (*obj, *key, *change)));
        }
        for ((obj, key), change) in changes.drain() {
            let skey = self.key(obj, &key);
            let op = match change {
                Some(deadline_ns) => StoreOp::SetTimer { deadline_ns },
                None => StoreOp::CancelTimer,
            };
            self.queue_nb(skey, op, None);
        }
        self.timer_changes = changes;
    }

    /// Queues a mark in the per-clock log for each packet of the batch that updated nothing
    /// ([`ClientConfig::mark_processed`]): a tagged record, applied once like any update.
    pub(super) fn queue_processed_marks(&mut self) {
        if self.unmarked.is_empty() {
            return;
        }
        let key = StoreKey { vertex: self.vertex, object: PROCESSED_OBJECT, key: StateKey::Unit };
        let mut unmarked = std::mem::take(&mut self.unmarked);
        for clock in unmarked.drain(..) {
            let tag = OpTag { clock, seq: PROCESSED_MARK_SEQ };
            self.queue_nb(key, StoreOp::State(StateOp::Record(Value::Int(0))), Some(tag));
        }
        // Its room is kept for the next batch.
        self.unmarked = unmarked;
    }

    fn flush_dirty(&mut self) {
        // The list's buffer is kept for the next batch: a flush allocates nothing for itself.
        let mut dirty = std::mem::take(&mut self.dirty);
        for (obj, k) in dirty.drain(..) {
            let Some(e) = self.caches.get_mut(usize::from(obj.0)).and_then(|c| c.get_mut(&k)) else { continue };
            if !e.dirty {
                continue;
            }
            e.dirty = false;
            let (list, single) = match (e.list_ops.take(), &e.value) {
                (Some(ops), _) => (*ops, None),
                (None, Some(v)) => (Vec::new(), Some(StateOp::Set(v.clone()))),
                (None, None) => (Vec::new(), Some(StateOp::Delete)),
            };
            let key = StoreKey { vertex: self.vertex, object: obj.0, key: k };
            for op in list.into_iter().chain(single) {
                self.queue_nb(key, StoreOp::State(op), None);
            }
            self.stats.flushed += 1;
        }
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
        for cache in &mut self.caches {
            // Knowing a value is absent saves a lookup, but flows come and go: past a bound, such
            // entries are dropped (and looked up again if needed).
            if cache.len() > ABSENT_LIMIT {
                cache.retain(|_, e| e.value.is_some() || e.dirty);
            }
        }
    }
}

/// Emptied per-batch XOR lists a client keeps for reuse.
const XOR_SPARES: usize = 64;

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

/// Applies `op` to a cached value; its result, and whether the value became dirty (an update
/// recorded for the next flush that was not pending already).
fn apply_cached(entry: &mut Cached, op: StateOp, custom: &[CustomOp]) -> Result<(Option<Value>, bool), StateError> {
    if changes_nothing(&op, entry.value.as_ref()) {
        // Nothing for the next flush to write (and an entry not dirty says what the store has).
        return apply(&mut entry.value, op, custom).map(|r| (r, false));
    }
    let update = op.is_update();
    // Only a push or a pop is kept for the flush (a list's flush sends them, not the list);
    // any other update is sent as the value, so it is not copied (a copy of a record of
    // integers is an allocation).
    let list_op = matches!(op, StateOp::Pop | StateOp::PopN(_) | StateOp::Push(_)).then(|| op.clone());
    let r = apply(&mut entry.value, op, custom)?;
    let dirtied = update && entry.record(list_op);
    Ok((r, dirtied))
}

/// How long a client whose batches may wait keeps their requests before sending them
/// ([`StoreClient::defers_batch`], [`StoreClient::send_overdue`]).
const DEFER_FOR: Duration = Duration::from_micros(400);

/// Whether a client's batches without a call may wait a little for the store
/// ([`Connection::allow_lazy_batches`]): without the root's log (no tags, no commits, nothing
/// written through) nothing waits for their acknowledgement but the client's own waits, which
/// wake the store; with it (non-blocking mode), the root's log waits for their commits, and
/// [`StoreClient::send_overdue`] sends what waits once [`DEFER_FOR`] has passed even when no
/// batch follows ([`ClientConfig::defer_batches`]).
fn lazy_batches(cfg: &ClientConfig) -> bool {
    let plain = !cfg.write_through && !cfg.dedupe && !cfg.commits;
    plain || (cfg.defer_batches && cfg.commits && cfg.mode == Mode::Async)
}

/// Whether `op` leaves a value that is `value` as it is, whatever it returns: a delete or pop of
/// an absent value, a compare-and-set that finds another. NFs use these to test state on every
/// packet (the portscan detector deletes a flow's pending attempt on each non-SYN packet); as
/// updates, each made its key dirty and cost a write to the store at the next flush.
fn changes_nothing(op: &StateOp, value: Option<&Value>) -> bool {
    match op {
        StateOp::Delete | StateOp::Pop | StateOp::PopN(_) => value.is_none(),
        StateOp::CompareAndSet { expect, .. } => value != expect.as_ref(),
        _ => false,
    }
}

#[cfg(test)]
mod xor_tests {
    use super::*;

    #[test]
    fn xor_ids_tell_vertices_apart_and_are_never_zero() {
        let obj = ObjectId(4);
        let (nat, portscan) = (InstanceId::new(0, 0), InstanceId::new(1, 0));
        assert_ne!(xor_id(nat, obj), xor_id(portscan, obj), "same object number in two vertices");
        assert_ne!(xor_id(nat, ObjectId(0)), 0, "object 0 of instance 0 must count");
        assert_ne!(xor_id(nat, obj), xor_id(InstanceId::new(0, 1), obj));
    }
}
