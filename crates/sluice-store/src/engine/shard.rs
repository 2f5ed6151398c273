//! One shard of the embedded store: its values with their owners, subscribers and timers,
//! the per-clock log of tagged updates and the TS vector, and what each operation does to
//! them. The shard's thread, its queues and the backend around it are in `engine/mod.rs`.

use super::{ClientQueues, Map};
use crate::clock_log::{AsOf, ClockLog, Kept, LastApplied, Was};
use crate::wire::{Notification, OpTag, Request, Response, StoreKey, StoreOp, TsVector};
use sluice_packet::InstanceId;
use sluice_state::{ops::apply, CustomOp, StateOp, Value};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

/// One value and its metadata.
#[derive(Default)]
pub(super) struct Entry {
    pub(super) value: Option<Value>,
    pub(super) owner: Option<InstanceId>,
    pub(super) claimant: Option<InstanceId>,
    pub(super) subscribers: Vec<InstanceId>,
    pub(super) timer: Option<(u64, InstanceId)>,
    /// The deadline this key waits under in the shard's timer heap, if it does: a timer
    /// re-armed later keeps that place and moves to its deadline when it surfaces (an idle
    /// timer is re-armed by every packet of its flow; one heap entry each would grow the
    /// heap by a packet's worth for every packet).
    pub(super) queued: Option<u64>,
}

/// The shard's timer heap: (deadline, key), earliest first.
pub(super) type TimerHeap = BinaryHeap<Reverse<(u64, StoreKey)>>;

impl Entry {
    /// Gives key `key`'s timer, now due at `deadline`, a place in `heap` unless it has one as
    /// early already (where it waits and then moves on to `deadline`).
    pub(super) fn wait_in(&mut self, heap: &mut TimerHeap, key: StoreKey, deadline: u64) {
        if self.queued.is_none_or(|q| deadline < q) {
            self.queued = Some(deadline);
            heap.push(Reverse((deadline, key)));
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.value.is_none()
            && self.owner.is_none()
            && self.claimant.is_none()
            && self.subscribers.is_empty()
            && self.timer.is_none()
    }
}

/// The shard's entries, one table per vertex: a replacement's take-over reads its vertex's
/// entries alone ([`Entries::of_vertex`]), where one table made it walk every other vertex's
/// too (two in three in the example chain; docs/benchmarks.md, "The store's entries kept by
/// vertex").
#[derive(Default)]
pub(super) struct Entries {
    /// By vertex id; a vertex's table is made at its first entry.
    by_vertex: Vec<Map<StoreKey, Entry>>,
}

impl Entries {
    pub(super) fn get(&self, key: &StoreKey) -> Option<&Entry> {
        self.by_vertex.get(usize::from(key.vertex))?.get(key)
    }

    pub(super) fn get_mut(&mut self, key: &StoreKey) -> Option<&mut Entry> {
        self.by_vertex.get_mut(usize::from(key.vertex))?.get_mut(key)
    }

    /// `key`'s entry, made empty if it has none.
    pub(super) fn entry(&mut self, key: StoreKey) -> &mut Entry {
        let v = usize::from(key.vertex);
        if self.by_vertex.len() <= v {
            self.by_vertex.resize_with(v + 1, Map::default);
        }
        // Just made long enough: the index is in range.
        self.by_vertex[v].entry(key).or_default()
    }

    pub(super) fn remove(&mut self, key: &StoreKey) -> Option<Entry> {
        self.by_vertex.get_mut(usize::from(key.vertex))?.remove(key)
    }

    /// Every entry, vertex by vertex.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&StoreKey, &Entry)> + '_ {
        self.by_vertex.iter().flatten()
    }

    /// The entries of `vertex` alone.
    pub(super) fn of_vertex(&self, vertex: u16) -> impl Iterator<Item = (&StoreKey, &Entry)> + '_ {
        self.by_vertex.get(usize::from(vertex)).into_iter().flatten()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_vertex.iter().map(Map::len).sum()
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.by_vertex.iter().all(Map::is_empty)
    }

    pub(super) fn clear(&mut self) {
        self.by_vertex.clear();
    }
}

/// A connection's next batch number to apply, and the batches that arrived before it.
pub(super) type Sequence = (u64, BTreeMap<u64, Arc<[Request]>>);

pub(super) struct Shard {
    pub(super) entries: Entries,
    /// Results of tagged updates of packets still in flight: CHC's store-side log.
    pub(super) log: ClockLog,
    pub(super) ts: LastApplied,
    pub(super) ts_cache: Option<TsVector>,
    pub(super) timers: TimerHeap,
    pub(super) now_ns: u64,
    pub(super) custom: Map<u16, Vec<CustomOp>>,
    pub(super) clients: Map<InstanceId, Arc<ClientQueues>>,
    /// Clients to wake after the current batch.
    pub(super) touched: Vec<Arc<ClientQueues>>,
    /// Per connection: the next batch number to apply, and batches that arrived early.
    pub(super) sequences: Map<u64, Sequence>,
}

impl Shard {
    pub(super) fn new() -> Shard {
        Shard {
            entries: Entries::default(),
            log: ClockLog::default(),
            ts: LastApplied::default(),
            ts_cache: None,
            timers: BinaryHeap::new(),
            now_ns: 0,
            custom: Map::default(),
            clients: Map::default(),
            touched: Vec::new(),
            sequences: Map::default(),
        }
    }

    fn notify(&mut self, to: InstanceId, n: Notification) {
        if let Some(c) = self.clients.get(&to) {
            c.notifications.push(n);
            self.touched.push(c.clone());
        }
    }

    fn ts_vector(&mut self) -> TsVector {
        if let Some(t) = &self.ts_cache {
            return t.clone();
        }
        let mut v: Vec<_> = self.ts.iter().collect();
        v.sort();
        let t: TsVector = v.into();
        self.ts_cache = Some(t.clone());
        t
    }

    pub(super) fn handle(&mut self, req: &Request) -> Response {
        let id = req.id;
        let client = req.client;
        match req.op {
            StoreOp::AdvanceTime(t) => {
                self.advance(t);
                return Response { id, result: Ok(None), replayed: false, ts: None };
            }
            StoreOp::ForgetClock(c) => {
                self.log.forget(c);
                return Response { id, result: Ok(None), replayed: false, ts: None };
            }
            _ => {}
        }
        let read = matches!(req.op, StoreOp::State(StateOp::Get));
        if let (Some(tag), true) = (req.tag, read) {
            // A replayed packet's read: the value as that packet's first run found it.
            if let AsOf::Was(v) = self.log.as_of(tag.clock, tag.seq, &req.key) {
                return Response { id, result: Ok(v), replayed: false, ts: None };
            }
        }
        // Exactly once: a tagged update already applied returns its logged result.
        if let Some(tag) = req.tag.filter(|_| !read) {
            if let Some(r) = self.log.get(tag.clock, req.key.vertex, tag.seq) {
                return Response { id, result: Ok(r.value()), replayed: true, ts: None };
            }
        }
        if req.op == StoreOp::Logged {
            // Not logged (a logged one was answered above): nothing to apply.
            return Response { id, result: Ok(None), replayed: false, ts: None };
        }
        let key = req.key;
        if let StoreOp::IncrMany(incrs) = &req.op {
            // Untagged itself (its increments carry the tags): nothing to log for the request.
            return match self.incr_many(client, key, incrs) {
                Ok(()) => Response { id, result: Ok(None), replayed: false, ts: None },
                Err(e) => Response { id, result: Err(e), replayed: false, ts: None },
            };
        }
        let mut was = Was::Unknown;
        let result = self.execute(client, key, req.op.clone(), req.tag.map(|_| &mut was));
        // A tagged read (a replayed packet reading state) changes nothing: logging it would make
        // a later update with the same tag look like a duplicate, and moving the TS vector would
        // claim an update was executed.
        if let (Some(tag), Ok(r), false) = (req.tag, &result, read) {
            self.log_applied(client, key.vertex, tag, r.0.clone(), was);
        }
        match result {
            Ok((value, ts)) => Response { id, result: Ok(value), replayed: false, ts },
            Err(e) => Response { id, result: Err(e), replayed: false, ts: None },
        }
    }

    /// Executes `op` on `key` for `client`. For a tagged update, `was` learns the value it
    /// changed as it was before (for the per-clock log).
    #[allow(clippy::type_complexity)]
    fn execute(
        &mut self,
        client: InstanceId,
        key: StoreKey,
        op: StoreOp,
        was: Option<&mut Was>,
    ) -> Result<(Option<Value>, Option<TsVector>), String> {
        if let StoreOp::State(StateOp::Get) = op {
            // A read leaves no entry behind for a value that does not exist.
            let (v, shared) = self.entries.get(&key).map_or((None, true), |e| (e.value.clone(), e.owner.is_none()));
            let ts = if shared { Some(self.ts_vector()) } else { None };
            return Ok((v, ts));
        }
        let entry = self.entries.entry(key);
        // Done once the entry is let go of (they need the whole shard).
        let mut tell_subscribers = false;
        let mut handover = None;
        let out = match op {
            StoreOp::State(op) => {
                if let Some(owner) = entry.owner {
                    if owner != client {
                        return Err(format!("{key:?} is owned by instance {}", owner.0));
                    }
                }
                if let Some(w) = was {
                    *w = Was::of(key, &entry.value);
                }
                let custom = self.custom.get(&key.vertex).map(Vec::as_slice).unwrap_or(&[]);
                let r = apply(&mut entry.value, op, custom).map_err(|e| e.to_string())?;
                tell_subscribers = !entry.subscribers.is_empty();
                r
            }
            StoreOp::Write { value, result } => {
                if let Some(owner) = entry.owner {
                    if owner != client {
                        return Err(format!("{key:?} is owned by instance {}", owner.0));
                    }
                }
                if let Some(w) = was {
                    *w = Was::of(key, &entry.value);
                }
                entry.value = value;
                tell_subscribers = !entry.subscribers.is_empty();
                result
            }
            StoreOp::Subscribe => {
                if !entry.subscribers.contains(&client) {
                    entry.subscribers.push(client);
                }
                let v = entry.value.clone();
                return Ok((v, Some(self.ts_vector())));
            }
            StoreOp::Unsubscribe => {
                entry.subscribers.retain(|s| *s != client);
                None
            }
            StoreOp::SetTimer { deadline_ns } => {
                entry.timer = Some((deadline_ns, client));
                entry.wait_in(&mut self.timers, key, deadline_ns);
                None
            }
            StoreOp::CancelTimer => {
                entry.timer = None;
                None
            }
            StoreOp::ExpireTimer { deadline_ns } => match entry.timer {
                Some((d, _)) if d == deadline_ns => {
                    entry.timer = None;
                    Some(Value::Int(1))
                }
                _ => Some(Value::Int(0)),
            },
            StoreOp::Claim => match entry.owner {
                None => {
                    entry.owner = Some(client);
                    Some(Value::Int(1))
                }
                Some(o) if o == client => Some(Value::Int(1)),
                Some(_) => {
                    entry.claimant = Some(client);
                    Some(Value::Int(0))
                }
            },
            StoreOp::Release => {
                if entry.owner == Some(client) {
                    entry.owner = entry.claimant.take();
                    handover = entry.owner;
                }
                None
            }
            StoreOp::ForgetClock(_) | StoreOp::AdvanceTime(_) | StoreOp::IncrMany(_) | StoreOp::Logged => None,
        };
        // One lookup for the common case: the entry is still there, and kept.
        if entry.is_empty() {
            self.entries.remove(&key);
        }
        if tell_subscribers {
            self.tell_subscribers(key, client);
        }
        if let Some(next) = handover {
            self.notify(next, Notification::Handover { key });
        }
        Ok((out, None))
    }

    /// Several tagged increments of one value: each applied unless its tag is logged already.
    /// Tags repeated within the request are each applied (as the Redis store does).
    fn incr_many(&mut self, client: InstanceId, key: StoreKey, incrs: &[(OpTag, i64)]) -> Result<(), String> {
        let entry = self.entries.entry(key);
        if let Some(owner) = entry.owner {
            if owner != client {
                return Err(format!("{key:?} is owned by instance {}", owner.0));
            }
        }
        // The client's form (one counter's increments of a batch, in packet order): tags
        // that grow cannot repeat within the request, so each is looked up once and logged at
        // once, and an integer is added to in place. Fault tolerance pays this per increment.
        let growing = incrs.windows(2).all(|w| matches!(w, [a, b] if a.0 < b.0));
        let int_now = match entry.value {
            None => Some(None),
            Some(Value::Int(i)) => Some(Some(i)),
            Some(_) => None,
        };
        if let (true, Some(mut now)) = (growing, int_now) {
            let mut last = None;
            for (tag, d) in incrs {
                let v = now.map_or(*d, |i: i64| i.wrapping_add(*d));
                // Logged only if new (one lookup): a logged tag's increment was applied before.
                if self.log.insert_result(tag.clock, key.vertex, tag.seq, Kept::Int(v)) {
                    now = Some(v);
                    last = Some(tag.clock);
                }
            }
            if let Some(v) = now {
                entry.value = Some(Value::Int(v));
            }
            if let Some(clock) = last {
                self.ts.set(client, clock);
                self.ts_cache = None;
            }
        } else {
            let mut applied = Vec::with_capacity(incrs.len());
            for (tag, d) in incrs {
                if self.log.contains(tag.clock, key.vertex, tag.seq) {
                    continue;
                }
                let r = apply(&mut entry.value, StateOp::Incr(*d), &[]).map_err(|e| e.to_string())?;
                applied.push((*tag, r));
            }
            for (tag, r) in applied {
                self.log_applied(client, key.vertex, tag, r, Was::Unknown);
            }
        }
        self.tell_subscribers(key, client);
        Ok(())
    }

    /// `key`'s value changed by `client`'s update: its other subscribers are called back.
    fn tell_subscribers(&mut self, key: StoreKey, client: InstanceId) {
        let Some(e) = self.entries.get(&key) else { return };
        if e.subscribers.is_empty() {
            return;
        }
        let value = e.value.clone();
        let subs: Vec<InstanceId> = e.subscribers.iter().copied().filter(|s| *s != client).collect();
        for s in subs {
            self.notify(s, Notification::Changed { key, value: value.clone() });
        }
    }

    fn log_applied(&mut self, client: InstanceId, vertex: u16, tag: OpTag, result: Option<Value>, was: Was) {
        if self.log.insert_was(tag.clock, vertex, tag.seq, result.into(), was) {
            // The instance's last update applied, in the order applied: not the greatest clock,
            // since clocks need not grow along an instance's log (several roots; a root that
            // restarted past its persisted clock while older packets were in flight; replays).
            // A duplicate changes nothing, so it does not move the vector either.
            self.ts.set(client, tag.clock);
            self.ts_cache = None;
        }
    }

    pub(super) fn advance(&mut self, t: u64) {
        if t <= self.now_ns {
            return;
        }
        self.now_ns = t;
        while let Some(Reverse((deadline, key))) = self.timers.peek().copied() {
            if deadline > t {
                break;
            }
            self.timers.pop();
            let Some(e) = self.entries.get_mut(&key) else { continue };
            // Not the key's place in the heap (it was re-armed earlier since): stale.
            if e.queued != Some(deadline) {
                continue;
            }
            e.queued = None;
            // A timer that fired stays armed until its owner cancels it, which it does in the
            // same batch as the updates its expiry made: an owner that fails before that batch
            // arrives leaves the timer for its replacement to adopt and fire again.
            match e.timer {
                // (Never earlier: arming earlier takes an earlier place.)
                Some((d, owner)) if d <= deadline => {
                    let to = e.owner.unwrap_or(owner);
                    self.notify(to, Notification::TimerFired { key });
                }
                // Re-armed later: its place moves to its deadline (still due now or not).
                Some((d, _)) if d > deadline => {
                    e.wait_in(&mut self.timers, key, d);
                }
                // Cancelled (or expired by its owner).
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_packet::Clock;
    use sluice_state::StateKey;
    use std::collections::VecDeque;

    fn call(shard: &mut Shard, op: StateOp, tag: Option<(u64, u32)>) -> Response {
        let key = StoreKey { vertex: 2, object: 1, key: StateKey::Id(7) };
        let tag = tag.map(|(clock, seq)| OpTag { clock: Clock::new(0, clock), seq });
        let req = Request { id: 1, client: InstanceId::new(2, 0), tag, key, op: StoreOp::State(op), reply: true };
        shard.handle(&req)
    }

    fn read_at(shard: &mut Shard, clock: u64, seq: u32) -> Result<Option<Value>, String> {
        let r = call(shard, StateOp::Get, Some((clock, seq)));
        assert!(!r.replayed, "a read is never answered from the per-clock log: {r:?}");
        r.result
    }

    /// Reads and updates that leave a value absent leave no entry behind (a detector reads
    /// and deletes absent values on most packets; each used to leave or make one).
    #[test]
    fn what_leaves_a_value_absent_leaves_no_entry() {
        let mut shard = Shard::new();
        assert_eq!(call(&mut shard, StateOp::Get, None).result, Ok(None));
        assert_eq!(call(&mut shard, StateOp::Delete, None).result, Ok(None));
        assert!(shard.entries.is_empty(), "a read or a delete of nothing made an entry");
        call(&mut shard, StateOp::Set(Value::Int(3)), None);
        assert_eq!(call(&mut shard, StateOp::Get, None).result, Ok(Some(Value::Int(3))));
        assert_eq!(shard.entries.len(), 1);
        assert_eq!(call(&mut shard, StateOp::Delete, None).result, Ok(Some(Value::Int(3))));
        assert!(shard.entries.is_empty(), "the deleted value's entry went with it");
    }

    /// Entries live in their vertex's table: a vertex's pass sees its own alone, a key is found
    /// and removed in its vertex's table only, and a walk over all sees every vertex's.
    #[test]
    fn entries_are_kept_by_vertex() {
        let mut entries = Entries::default();
        let key = |vertex: u16, n: u64| StoreKey { vertex, object: 0, key: StateKey::Id(n) };
        for (v, n) in [(3, 1), (0, 1), (3, 2), (5, 1)] {
            entries.entry(key(v, n)).value = Some(Value::Int(i64::from(v) * 10 + n as i64));
        }
        let mut of_3: Vec<_> = entries.of_vertex(3).map(|(k, _)| *k).collect();
        of_3.sort_by_key(|k| format!("{k:?}"));
        assert_eq!(of_3, vec![key(3, 1), key(3, 2)]);
        assert_eq!(entries.of_vertex(1).count() + entries.of_vertex(9).count(), 0, "no table, no entries");
        assert_eq!(entries.get(&key(0, 1)).and_then(|e| e.value.clone()), Some(Value::Int(1)));
        assert!(entries.get(&key(0, 2)).is_none() && entries.get(&key(7, 1)).is_none());
        assert!(entries.remove(&key(5, 2)).is_none() && entries.remove(&key(9, 1)).is_none());
        assert_eq!(entries.remove(&key(5, 1)).and_then(|e| e.value), Some(Value::Int(51)));
        assert_eq!(entries.len(), 3);
        assert_eq!(entries.iter().count(), 3);
        entries.clear();
        assert!(entries.is_empty());
    }

    /// A balancer's connection opened by clock 10, changed by clock 12 and closed by 15, all
    /// applied before the copies carrying their outputs were lost: replayed, each reads the
    /// value its first run read, not the one the later clocks left.
    #[test]
    fn a_replayed_read_sees_the_value_before_its_clock() {
        let mut shard = Shard::new();
        call(&mut shard, StateOp::Set(Value::Int(1)), Some((10, 0)));
        call(&mut shard, StateOp::Set(Value::Int(2)), Some((12, 1)));
        call(&mut shard, StateOp::Delete, Some((15, 0)));
        assert_eq!(read_at(&mut shard, 10, 0), Ok(None));
        assert_eq!(read_at(&mut shard, 11, 0), Ok(Some(Value::Int(1))));
        // The same tag as clock 12's update: still a read, before it; after it, its value.
        assert_eq!(read_at(&mut shard, 12, 1), Ok(Some(Value::Int(1))));
        assert_eq!(read_at(&mut shard, 12, 0), Ok(Some(Value::Int(1))));
        assert_eq!(read_at(&mut shard, 12, 2), Ok(Some(Value::Int(2))), "a packet reads its own update");
        assert_eq!(read_at(&mut shard, 13, 0), Ok(Some(Value::Int(2))));
        assert_eq!(read_at(&mut shard, 15, 0), Ok(Some(Value::Int(2))));
        assert_eq!(read_at(&mut shard, 16, 0), Ok(None), "no later update: the value now");
        assert_eq!(call(&mut shard, StateOp::Get, None).result, Ok(None));

        // A large value's earlier contents are not kept: its readers get the value now.
        let list = Value::List(VecDeque::from(vec![Value::Int(1); 4]));
        call(&mut shard, StateOp::Set(list), Some((20, 0)));
        call(&mut shard, StateOp::Set(Value::Int(5)), Some((21, 0)));
        assert_eq!(read_at(&mut shard, 20, 0), Ok(None));
        assert_eq!(read_at(&mut shard, 21, 0), Ok(Some(Value::Int(5))));

        // Once the clocks are done, nothing of them is kept.
        shard.log.forget(Clock::new(0, 25));
        assert_eq!(read_at(&mut shard, 20, 0), Ok(Some(Value::Int(5))));
    }
}
