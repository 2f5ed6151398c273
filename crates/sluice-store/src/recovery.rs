//! Store-instance failover for shared state (CHC §4.4 "store instance failure"): rebuilding a
//! crashed store instance's shared values from its last checkpoint, the reads the NF instances
//! logged since (each with the TS vector the store returned) and the NF instances' write-ahead
//! logs of shared-state updates.
//!
//! The store does not log what it executed; the NFs do. A read's TS vector says, per instance,
//! the clock of the latest tagged operation the store had executed for it when it served the
//! read. So a read's value plus "each instance's WAL entries after its clock in that TS" is the
//! value the crashed store would hold had it executed everything the NFs issued. Per key:
//!
//! 1. No read of the key since the checkpoint: start from the checkpoint's value and TS vector.
//! 2. Reads: pick one with [`select_ts`] and start from its value and TS vector.
//!
//! then re-execute, per instance, its WAL entries on the key positioned after its entry in the
//! starting TS vector ([`plan`]), and load the result into a fresh store ([`apply`]).
//!
//! Assumptions, see docs/decisions.md ("Store-instance failover"): the TS vector is kept per
//! shard (embedded shard thread, Redis bucket), so one recovered store instance must be one
//! shard — `EmbeddedStore::start(1)` or a Redis URL with `?buckets=1`; an instance's WAL is in
//! issue order and its clocks grow along it; and a store instance failing together with an NF
//! instance whose WAL it needs cannot be recovered (that WAL is gone).

use crate::backend::{Backend, Connection, StoreError};
use crate::client::WalEntry;
use crate::wire::{Checkpoint, LoggedResult, Replies, Request, StoreKey, StoreOp, TsVector};
use sluice_packet::{Clock, InstanceId};
use sluice_state::Value;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Re-executed operations per batch sent to the rebuilt store.
const REPLAY_BATCH: usize = 512;
/// How long [`apply`] waits for the rebuilt store to acknowledge a batch.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// A read an NF instance logged: the key, the value it got and the store's TS vector with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRecord {
    /// The key read.
    pub key: StoreKey,
    /// The value read (`None`: absent).
    pub value: Option<Value>,
    /// The store's TS vector at the read: per instance, the clock of the latest tagged operation
    /// the store had executed for it.
    pub ts: TsVector,
}

impl From<&crate::client::LastRead> for ReadRecord {
    fn from(r: &crate::client::LastRead) -> ReadRecord {
        ReadRecord { key: r.key, value: r.value.clone(), ts: r.ts.clone() }
    }
}

/// What one NF instance contributes to a rebuild.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveryLog {
    /// The instance.
    pub instance: InstanceId,
    /// Its write-ahead log of shared-state updates, in issue order.
    pub wal: Vec<WalEntry>,
    /// Its reads of shared values since the checkpoint, in the order it made them.
    pub reads: Vec<ReadRecord>,
    /// Where in `wal` the updates made after the checkpoint start, when the caller knows
    /// (it flushed before the checkpoint, so everything before was in it). `None`: found from
    /// the checkpoint's TS vector, which assumes each clock appears once in the log.
    pub after_checkpoint: Option<usize>,
}

/// What to load into the replacement store.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RebuildPlan {
    /// The starting value of every key, sorted by key (shared values from a selected read or
    /// the checkpoint, plus the per-flow values given to [`plan`]).
    pub values: Vec<(StoreKey, Value)>,
    /// The updates to re-execute, each with the instance that issued it, ordered by clock, then
    /// instance, then WAL position (deterministic; one instance's entries stay in issue order).
    pub replay: Vec<(InstanceId, WalEntry)>,
    /// The TS vector to restore with the values, sorted: per instance the highest clock of the
    /// checkpoint and of every starting TS vector. Re-executing the replay raises it further.
    /// Without it, an instance whose updates are all reflected in the starting values (none
    /// replayed) would be missing from the rebuilt store's TS vector, and a second failover
    /// would re-execute its whole WAL.
    pub ts: Vec<(InstanceId, Clock)>,
    /// The checkpoint's per-clock log, restored with the values (callers drop the entries of
    /// packets no longer in flight).
    pub log: Vec<LoggedResult>,
}

/// What [`apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct RebuildStats {
    /// Values restored.
    pub values: u64,
    /// Updates re-executed.
    pub reexecuted: u64,
    /// Of those, how many the store rejected (an update that failed when first executed fails
    /// the same way when re-executed on the same value, so this is not an error).
    pub failed: u64,
    /// Wall time of the restore and the re-execution, microseconds.
    pub elapsed_us: f64,
}

/// `who`'s clock in a TS vector.
fn clock_of(ts: &[(InstanceId, Clock)], who: InstanceId) -> Option<Clock> {
    ts.iter().find(|(i, _)| *i == who).map(|(_, c)| *c)
}

/// Orders TS vectors for the tie rule: the sum of their clocks. TS vectors of one store
/// instance only grow, so any two are comparable entry by entry, and then the greater has the
/// greater sum (an absent entry counts as 0, below every clock).
fn ts_weight(ts: &[(InstanceId, Clock)]) -> u128 {
    ts.iter().map(|(_, c)| u128::from(c.0)).sum()
}

/// CHC's TS selection among `reads` (all of one key, or all of one store instance): every
/// read's TS vector is a candidate. For each instance of `wals`, walk its WAL backwards to the
/// latest update whose clock appears as that instance's entry in some candidate TS, and drop
/// every candidate whose entry for the instance differs (or is missing). An instance none of
/// whose updates appear in any candidate drops nothing. Candidates are only dropped by a clock
/// some surviving candidate holds, so one always survives; the result is the index in `reads`
/// of the survivor, `None` only if `reads` is empty.
///
/// Tie rule (several survivors): the latest read, i.e. the survivor whose TS vector is greatest
/// — TS vectors of one store instance only grow, so that is the read the store served last; for
/// vectors that are not comparable (not from one store instance) the greater sum of clocks; for
/// equal vectors the later in `reads`.
pub fn select_ts(reads: &[&ReadRecord], wals: &[(InstanceId, &[WalEntry])]) -> Option<usize> {
    if reads.is_empty() {
        // Nothing to choose from: no need to look through every log (once per key).
        return None;
    }
    let mut alive: Vec<bool> = vec![true; reads.len()];
    for (who, wal) in wals {
        let holds = |r: &ReadRecord, c: Clock| clock_of(&r.ts, *who) == Some(c);
        let found =
            wal.iter().rev().map(|e| e.tag.clock).find(|c| reads.iter().zip(&alive).any(|(r, a)| *a && holds(r, *c)));
        if let Some(c) = found {
            for (r, a) in reads.iter().zip(alive.iter_mut()) {
                if !holds(r, c) {
                    *a = false;
                }
            }
        }
    }
    reads
        .iter()
        .enumerate()
        .filter(|(i, _)| alive.get(*i).copied().unwrap_or(false))
        .max_by_key(|(i, r)| (ts_weight(&r.ts), *i))
        .map(|(i, _)| i)
}

/// Where in `who`'s WAL the entries not yet reflected by a state with TS vector `ts` start:
/// after `who`'s last entry with the clock `ts` holds for it; all of them if `ts` holds none.
/// When the WAL has no entry with that clock (it was an update the caller left out, such as a
/// per-flow one, or the WAL was trimmed), after every entry with a clock up to it — clocks grow
/// along a WAL.
pub fn cut(wal: &[WalEntry], who: InstanceId, ts: &[(InstanceId, Clock)]) -> usize {
    let Some(c) = clock_of(ts, who) else { return 0 };
    match wal.iter().rposition(|e| e.tag.clock == c) {
        Some(p) => p + 1,
        None => wal.iter().position(|e| e.tag.clock > c).unwrap_or(wal.len()),
    }
}

/// Plans the rebuild of a store instance from its last `checkpoint` and the NF instances'
/// `logs` (reads since the checkpoint, WALs of shared-state updates). Per shared key K:
/// - if some instance read K since the checkpoint, [`select_ts`] picks one of those reads
///   (selecting with every instance's whole WAL, since TS clocks refer to updates of any key);
///   K starts from its value and TS vector;
/// - otherwise K starts from the checkpoint's value and TS vector;
///
/// and each instance's WAL entries on K after its entry in that TS vector are re-executed.
/// Keys only in the checkpoint are kept as they are. `per_flow` values (the latest copies
/// cached by their owners) are taken as they are, and their keys are never re-executed even
/// if a WAL mentions them.
pub fn plan(checkpoint: &Checkpoint, logs: &[RecoveryLog], per_flow: Vec<(StoreKey, Value)>) -> RebuildPlan {
    plan_in_order(checkpoint, logs, per_flow, &|e| (0, e.tag.clock))
}

/// [`plan`], with the re-executed updates in an order the caller ranks: each instance's updates
/// keep their log order (the order the store applied them), and the instances' logs are merged
/// by `rank` (e.g. chain-entry time and clock: with several roots clocks alone do not say which
/// packet entered first).
pub fn plan_in_order(
    checkpoint: &Checkpoint,
    logs: &[RecoveryLog],
    per_flow: Vec<(StoreKey, Value)>,
    rank: &dyn Fn(&WalEntry) -> (u64, Clock),
) -> RebuildPlan {
    let per_flow_keys: BTreeSet<StoreKey> = per_flow.iter().map(|(k, _)| *k).collect();
    let wals: Vec<(InstanceId, &[WalEntry])> = logs.iter().map(|l| (l.instance, l.wal.as_slice())).collect();
    let at_checkpoint: BTreeMap<StoreKey, &Value> = checkpoint.values.iter().map(|(k, v)| (*k, v)).collect();
    let mut keys: BTreeSet<StoreKey> = at_checkpoint.keys().copied().collect();
    for l in logs {
        keys.extend(l.wal.iter().map(|e| e.key));
        keys.extend(l.reads.iter().map(|r| r.key));
    }
    let mut ts: BTreeMap<InstanceId, Clock> = checkpoint.ts.iter().copied().collect();
    let mut values: BTreeMap<StoreKey, Value> = BTreeMap::new();
    let mut replay: Vec<(usize, usize, WalEntry)> = Vec::new();
    // Each log's entries and reads by key, and where each log starts after the checkpoint:
    // one pass over the logs instead of one per key.
    let mut entries_of: HashMap<StoreKey, Vec<(usize, usize)>> = HashMap::new();
    let mut reads_of: HashMap<StoreKey, Vec<&ReadRecord>> = HashMap::new();
    for (li, l) in logs.iter().enumerate() {
        for (pos, e) in l.wal.iter().enumerate() {
            entries_of.entry(e.key).or_default().push((li, pos));
        }
        for r in &l.reads {
            reads_of.entry(r.key).or_default().push(r);
        }
    }
    let after_checkpoint: Vec<usize> =
        logs.iter().map(|l| l.after_checkpoint.unwrap_or_else(|| cut(&l.wal, l.instance, &checkpoint.ts))).collect();
    for key in keys.iter().filter(|k| !per_flow_keys.contains(k)) {
        let reads: &[&ReadRecord] = reads_of.get(key).map_or(&[], Vec::as_slice);
        let chosen = select_ts(reads, &wals).and_then(|i| reads.get(i).copied());
        let (start, start_ts): (Option<Value>, &[(InstanceId, Clock)]) = match chosen {
            Some(r) => (r.value.clone(), &r.ts),
            None => (at_checkpoint.get(key).map(|v| (*v).clone()), &checkpoint.ts),
        };
        for (who, c) in start_ts {
            let e = ts.entry(*who).or_insert(*c);
            *e = (*e).max(*c);
        }
        if let Some(v) = start {
            values.insert(*key, v);
        }
        let from: Cow<'_, [usize]> = match chosen {
            Some(_) => Cow::Owned(logs.iter().map(|l| cut(&l.wal, l.instance, start_ts)).collect()),
            None => Cow::Borrowed(&after_checkpoint),
        };
        for &(li, pos) in entries_of.get(key).map_or(&[][..], Vec::as_slice) {
            let (Some(l), Some(&f)) = (logs.get(li), from.get(li)) else { continue };
            if let (true, Some(e)) = (pos >= f, l.wal.get(pos)) {
                replay.push((li, pos, e.clone()));
            }
        }
    }
    values.extend(per_flow);
    RebuildPlan {
        values: values.into_iter().collect(),
        replay: merge(logs, replay, rank),
        ts: ts.into_iter().collect(),
        log: checkpoint.log.clone(),
    }
}

/// Orders the updates to re-execute (log index, position, entry): each log's in log order,
/// the logs merged by `rank` of their next update (ties: the lower log index).
fn merge(
    logs: &[RecoveryLog],
    mut picked: Vec<(usize, usize, WalEntry)>,
    rank: &dyn Fn(&WalEntry) -> (u64, Clock),
) -> Vec<(InstanceId, WalEntry)> {
    picked.sort_by_key(|(li, pos, _)| (*li, *pos));
    let mut streams: Vec<std::collections::VecDeque<WalEntry>> = vec![Default::default(); logs.len()];
    for (li, _, e) in picked {
        if let Some(s) = streams.get_mut(li) {
            s.push_back(e);
        }
    }
    let mut out = Vec::new();
    loop {
        let next = streams.iter().enumerate().filter_map(|(li, s)| s.front().map(|e| (rank(e), li))).min();
        let Some((_, li)) = next else { break };
        let (Some(e), Some(l)) = (streams.get_mut(li).and_then(|s| s.pop_front()), logs.get(li)) else { break };
        out.push((l.instance, e));
    }
    out
}

/// What one NF instance hands over for a store rebuild
/// ([`crate::StoreClient::hand_over_for_rebuild`]).
#[derive(Debug, Clone)]
pub struct ForRebuild {
    /// Its write-ahead log and reads since the checkpoint.
    pub log: RecoveryLog,
    /// Its per-flow copies (`None`: known deleted).
    pub per_flow: Vec<(StoreKey, Option<Value>)>,
    /// The timers it has armed: key, deadline, and the instance itself.
    pub timers: Vec<(StoreKey, u64, InstanceId)>,
}

/// The client the in-flight marks of a [`rebuild`] are sent as (no NF instance's).
const MARKS_CLIENT: InstanceId = InstanceId(u32::MAX - 1);

/// A crashed store rebuilt in place, the one way every driver does it: `backend` is emptied,
/// each vertex's custom operations registered again (re-executed updates may use them),
/// `plan` applied with `timers` ([`apply`]), and `marks` — the updates of packets still in
/// flight, as the core plans them — executed and acknowledged before this returns, so a replay
/// of those packets is recognised as one.
pub fn rebuild<'a>(
    backend: &dyn Backend,
    plan: &RebuildPlan,
    timers: &[(StoreKey, u64, InstanceId)],
    custom_ops: impl IntoIterator<Item = (u16, &'a [sluice_state::CustomOp])>,
    marks: Vec<Request>,
) -> Result<RebuildStats, StoreError> {
    backend.wipe()?;
    for (vertex, ops) in custom_ops {
        backend.register_custom_ops(vertex, ops)?;
    }
    let stats = apply(backend, plan, timers)?;
    if !marks.is_empty() {
        let mut r = Replayer { conn: backend.connect(MARKS_CLIENT)?, next_batch: 1, replies: Replies::default() };
        r.conn.send(1, marks.into())?;
        r.wait_acks(&[1])?;
    }
    Ok(stats)
}

/// One instance's connection to the rebuilt store.
struct Replayer {
    conn: Box<dyn Connection>,
    next_batch: u64,
    replies: Replies,
}

impl Replayer {
    /// Waits until every batch in `numbers` is acknowledged; returns how many requests failed.
    fn wait_acks(&mut self, numbers: &[u64]) -> Result<u64, StoreError> {
        let deadline = Instant::now() + ACK_TIMEOUT;
        loop {
            if numbers.iter().all(|n| self.replies.acked.contains(n)) {
                // Failures arrive no later than their batch's acknowledgement.
                self.conn.poll(&mut self.replies)?;
                self.replies.acked.retain(|n| !numbers.contains(n));
                let failed = self.replies.responses.iter().filter(|r| r.result.is_err()).count() as u64;
                self.replies.responses.clear();
                return Ok(failed);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Timeout(ACK_TIMEOUT));
            }
            self.conn.wait(&mut self.replies, (deadline - now).min(Duration::from_millis(50)))?;
        }
    }
}

/// Loads a [`RebuildPlan`] into `backend` (a fresh or wiped store): restores its values, TS
/// vector and `timers` (from the last checkpoint: the timers a recovering NF instance's
/// predecessor armed), then re-executes every planned update as a tagged request (the WAL
/// entry's tag, sent by the instance that issued it, on a new connection of that instance), so
/// the rebuilt store's per-clock log knows those tags and an NF retransmitting one is answered
/// as a duplicate. Consecutive updates of one instance travel together; before switching to
/// another instance, every batch is acknowledged, so the plan's order is the execution order.
/// Returns once the store has acknowledged everything.
pub fn apply(
    backend: &dyn Backend,
    plan: &RebuildPlan,
    timers: &[(StoreKey, u64, InstanceId)],
) -> Result<RebuildStats, StoreError> {
    let start = Instant::now();
    let mut timers = timers.to_vec();
    timers.sort();
    backend.restore(&Checkpoint { values: plan.values.clone(), ts: plan.ts.clone(), timers, log: plan.log.clone() })?;
    let mut conns: BTreeMap<InstanceId, Replayer> = BTreeMap::new();
    let mut next_id = 1u64;
    let mut failed = 0u64;
    for run in plan.replay.chunk_by(|a, b| a.0 == b.0) {
        let Some((who, _)) = run.first() else { continue };
        let r = match conns.entry(*who) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Replayer { conn: backend.connect(*who)?, next_batch: 1, replies: Replies::default() })
            }
        };
        let mut sent = Vec::new();
        for chunk in run.chunks(REPLAY_BATCH) {
            let batch: Arc<[Request]> = chunk
                .iter()
                .map(|(who, e)| {
                    next_id += 1;
                    Request {
                        id: next_id,
                        client: *who,
                        tag: Some(e.tag),
                        key: e.key,
                        op: StoreOp::State(e.op.clone()),
                        reply: false,
                    }
                })
                .collect();
            let n = r.next_batch;
            r.next_batch += 1;
            r.conn.send(n, batch)?;
            sent.push(n);
        }
        failed += r.wait_acks(&sent)?;
    }
    Ok(RebuildStats {
        values: plan.values.len() as u64,
        reexecuted: plan.replay.len() as u64,
        failed,
        elapsed_us: start.elapsed().as_secs_f64() * 1e6,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EmbeddedStore;
    use crate::wire::{Notification, OpTag};
    use sluice_state::{ops, StateKey, StateOp};

    fn c(n: u64) -> Clock {
        Clock::new(1, n)
    }

    fn key(n: u64) -> StoreKey {
        StoreKey { vertex: 7, object: 0, key: StateKey::Id(n) }
    }

    fn upd(clock: u64, k: StoreKey, d: i64) -> WalEntry {
        WalEntry { tag: OpTag { clock: c(clock), seq: 0 }, key: k, op: StateOp::Incr(d), entry_ns: 0 }
    }

    fn read(k: StoreKey, v: i64, ts: &[(InstanceId, u64)]) -> ReadRecord {
        let ts: Vec<(InstanceId, Clock)> = ts.iter().map(|(i, n)| (*i, c(*n))).collect();
        ReadRecord { key: k, value: Some(Value::Int(v)), ts: ts.into() }
    }

    /// The value of `k` after the plan: its starting value with the replay applied.
    fn rebuilt(p: &RebuildPlan, k: StoreKey) -> Option<Value> {
        let mut slot = p.values.iter().find(|(x, _)| *x == k).map(|(_, v)| v.clone());
        for (_, e) in p.replay.iter().filter(|(_, e)| e.key == k) {
            let _ = ops::apply(&mut slot, e.op.clone(), &[]);
        }
        slot
    }

    /// The instances of the worked example (CHC's figure): I2 only reads.
    fn instances() -> [InstanceId; 4] {
        [InstanceId::new(7, 1), InstanceId::new(7, 2), InstanceId::new(7, 3), InstanceId::new(7, 4)]
    }

    /// The worked example. One shared Int counter K; the checkpoint holds K = 100 with TS
    /// {I1: 10, I3: 8, I4: 9}. After it, in the store's order:
    /// - I4's per-flow update at clock 17, then I4 reads K (R19): 100, TS19 = {I1: 10, I3: 8, I4: 17};
    /// - I3's per-flow update at clock 16, then I2 reads K (R27): 100, TS27 = {I1: 10, I3: 16, I4: 17};
    /// - I1's non-blocking U15 (+1) arrives late, then I3 reads K (R18): 101,
    ///   TS18 = {I1: 15, I3: 16, I4: 17};
    /// - I1 issues U35 (+10), I3 U23 (+100), I4 U32 (+1000); the store crashes.
    ///
    /// The per-flow updates are not in the shared-state WALs handed to recovery. WALs: I1 [U15,
    /// U35], I3 [U23], I4 [U32]. Selection: walking I1's WAL back, U35's clock is in no TS, U15's
    /// is in TS18 only: TS19 and TS27 are dropped; U23 and U32 are in no TS. TS18 survives; the
    /// rebuild starts from R18's 101 and re-executes U23, U32 and U35 (I3 and I4 are cut after
    /// their clocks 16 and 17, which their shared WALs lack). Result 1211.
    #[test]
    fn worked_example_selects_ts18() {
        let [i1, i2, i3, i4] = instances();
        let k = key(1);
        let cp = Checkpoint {
            values: vec![(k, Value::Int(100))],
            ts: vec![(i1, c(10)), (i3, c(8)), (i4, c(9))],
            timers: Vec::new(),
            log: Vec::new(),
        };
        let r19 = read(k, 100, &[(i1, 10), (i3, 8), (i4, 17)]);
        let r27 = read(k, 100, &[(i1, 10), (i3, 16), (i4, 17)]);
        let r18 = read(k, 101, &[(i1, 15), (i3, 16), (i4, 17)]);
        let (u15, u35, u23, u32) = (upd(15, k, 1), upd(35, k, 10), upd(23, k, 100), upd(32, k, 1000));
        let w1 = vec![u15.clone(), u35.clone()];
        let w3 = vec![u23.clone()];
        let w4 = vec![u32.clone()];
        // Whatever the order of the reads and of the instances, TS18 is selected.
        let wals = [(i1, w1.as_slice()), (i3, w3.as_slice()), (i4, w4.as_slice()), (i2, &[][..])];
        let reversed: Vec<_> = wals.iter().rev().copied().collect();
        assert_eq!(select_ts(&[&r18, &r19, &r27], &wals), Some(0));
        assert_eq!(select_ts(&[&r19, &r27, &r18], &wals), Some(2));
        assert_eq!(select_ts(&[&r27, &r18, &r19], &reversed), Some(1));

        let logs = vec![
            RecoveryLog { instance: i1, wal: w1, reads: vec![], after_checkpoint: None },
            RecoveryLog { instance: i2, wal: vec![], reads: vec![r27], after_checkpoint: None },
            RecoveryLog { instance: i3, wal: w3, reads: vec![r18], after_checkpoint: None },
            RecoveryLog { instance: i4, wal: w4, reads: vec![r19], after_checkpoint: None },
        ];
        let p = plan(&cp, &logs, Vec::new());
        assert_eq!(p.values, vec![(k, Value::Int(101))], "starts from R18's value");
        assert_eq!(p.replay, vec![(i3, u23), (i4, u32), (i1, u35)], "re-executes U23, U32, U35 (by clock)");
        assert_eq!(p.ts, vec![(i1, c(15)), (i3, c(16)), (i4, c(17))]);
        assert_eq!(rebuilt(&p, k), Some(Value::Int(1211)));
    }

    /// Survivors that agree on every clock the WALs pin down: the latest (greatest TS) wins;
    /// equal vectors: the later read.
    #[test]
    fn tie_rule_latest_read() {
        let [i1, i2, ..] = instances();
        let k = key(1);
        let a = read(k, 1, &[(i1, 5)]);
        let b = read(k, 2, &[(i1, 5), (i2, 9)]);
        let b2 = read(k, 3, &[(i1, 5), (i2, 9)]);
        let w1 = vec![upd(5, k, 1)];
        let wals = [(i1, w1.as_slice())];
        assert_eq!(select_ts(&[&b, &a], &wals), Some(0));
        assert_eq!(select_ts(&[&a, &b, &b2], &wals), Some(2));
        assert_eq!(select_ts(&[], &wals), None);
        // No WAL pins anything: still one result.
        assert_eq!(select_ts(&[&a], &[]), Some(0));
    }

    /// Case 1: no reads since the checkpoint. Each key starts from the checkpoint; every WAL
    /// entry after the instance's checkpoint clock is re-executed (all of an instance the
    /// checkpoint TS does not know). Keys only in the checkpoint are kept, a key created after
    /// it is rebuilt from its WAL entries, and per-flow values are taken as given and never
    /// re-executed.
    #[test]
    fn no_reads_checkpoint_plus_wal() {
        let [i1, _, i3, i4] = instances();
        let (k, kept, born, flow) = (key(1), key(2), key(3), key(4));
        let cp = Checkpoint {
            values: vec![(k, Value::Int(100)), (kept, Value::Int(7)), (flow, Value::Int(1))],
            ts: vec![(i1, c(10)), (i3, c(8))],
            timers: Vec::new(),
            log: Vec::new(),
        };
        let logs = vec![
            RecoveryLog {
                instance: i1,
                wal: vec![upd(10, k, 1), upd(12, k, 2), upd(13, born, 5)],
                reads: vec![],
                after_checkpoint: None,
            },
            RecoveryLog {
                instance: i3,
                wal: vec![upd(8, k, 4), upd(14, k, 8), upd(15, flow, 9)],
                reads: vec![],
                after_checkpoint: None,
            },
            RecoveryLog { instance: i4, wal: vec![upd(11, k, 16)], reads: vec![], after_checkpoint: None },
        ];
        let p = plan(&cp, &logs, vec![(flow, Value::Int(42))]);
        assert_eq!(p.values, vec![(k, Value::Int(100)), (kept, Value::Int(7)), (flow, Value::Int(42))]);
        assert_eq!(
            p.replay,
            vec![(i4, upd(11, k, 16)), (i1, upd(12, k, 2)), (i1, upd(13, born, 5)), (i3, upd(14, k, 8))]
        );
        assert_eq!(rebuilt(&p, k), Some(Value::Int(126)));
        assert_eq!(rebuilt(&p, born), Some(Value::Int(5)));
        assert_eq!(rebuilt(&p, flow), Some(Value::Int(42)));
        assert_eq!(p.ts, vec![(i1, c(10)), (i3, c(8))]);
    }

    /// A raw connection for the end-to-end test.
    struct Raw {
        conn: Box<dyn Connection>,
        who: InstanceId,
        next: u64,
        replies: Replies,
    }

    impl Raw {
        fn open(b: &dyn Backend, who: InstanceId) -> Raw {
            Raw { conn: b.connect(who).expect("connect"), who, next: 1, replies: Replies::default() }
        }

        fn call(&mut self, k: StoreKey, op: StoreOp, tag: Option<OpTag>) -> crate::wire::Response {
            let n = self.next;
            self.next += 1;
            let req = Request { id: n, client: self.who, tag, key: k, op, reply: true };
            self.conn.send(n, vec![req].into()).expect("send");
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Some(p) = self.replies.responses.iter().position(|r| r.id == n) {
                    return self.replies.responses.remove(p);
                }
                self.conn.wait(&mut self.replies, Duration::from_millis(20)).expect("wait");
            }
            panic!("no response to {n}");
        }

        /// A tagged update, recorded in `wal` as the client would.
        fn update(&mut self, wal: &mut Vec<WalEntry>, k: StoreKey, clock: u64, d: i64) {
            let e = upd(clock, k, d);
            let r = self.call(k, StoreOp::State(e.op.clone()), Some(e.tag));
            assert!(r.result.is_ok(), "{r:?}");
            wal.push(e);
        }

        fn read(&mut self, k: StoreKey) -> ReadRecord {
            let r = self.call(k, StoreOp::State(StateOp::Get), None);
            ReadRecord { key: k, value: r.result.expect("get"), ts: r.ts.expect("ts with a shared read") }
        }
    }

    /// End to end on a one-shard embedded store: two instances update a shared counter, a
    /// checkpoint is taken, both keep updating and one reads; the store is wiped (crash and
    /// replacement) and rebuilt from the checkpoint and the logs. The counter is exact, a
    /// retransmitted update is recognised as a duplicate, and the timer in the checkpoint fires.
    #[test]
    fn wipe_and_rebuild_embedded() {
        let store = EmbeddedStore::start(1).expect("start");
        let (ia, ib) = (InstanceId::new(7, 1), InstanceId::new(7, 2));
        let (k, kt) = (key(1), key(2));
        let (mut wa, mut wb) = (Vec::new(), Vec::new());
        let mut a = Raw::open(&store, ia);
        let mut b = Raw::open(&store, ib);
        a.update(&mut wa, k, 1, 1);
        a.update(&mut wa, k, 2, 2);
        b.update(&mut wb, k, 3, 4);
        a.call(kt, StoreOp::SetTimer { deadline_ns: 1000 }, None);
        let cp = store.checkpoint().expect("checkpoint");
        assert_eq!(cp.timers, vec![(kt, 1000, ia)]);
        a.update(&mut wa, k, 4, 8);
        let r = b.read(k);
        assert_eq!(r.value, Some(Value::Int(15)));
        b.update(&mut wb, k, 5, 16);
        a.update(&mut wa, k, 6, 32);
        assert_eq!(a.read(k).value, Some(Value::Int(63)));

        store.wipe().expect("wipe");
        let logs = vec![
            RecoveryLog { instance: ia, wal: wa, reads: vec![], after_checkpoint: None },
            RecoveryLog { instance: ib, wal: wb, reads: vec![r], after_checkpoint: None },
        ];
        let p = plan(&cp, &logs, Vec::new());
        assert_eq!(p.replay.len(), 2, "B's read covers clocks 1-4: {:?}", p.replay);
        let stats = apply(&store, &p, &cp.timers).expect("apply");
        assert_eq!((stats.values, stats.reexecuted, stats.failed), (1, 2, 0));

        let mut a = Raw::open(&store, ia);
        assert_eq!(a.read(k).value, Some(Value::Int(63)));
        let dup = a.call(k, StoreOp::State(StateOp::Incr(32)), Some(OpTag { clock: c(6), seq: 0 }));
        assert!(dup.replayed, "a retransmitted re-executed update is a duplicate: {dup:?}");
        let ts = a.read(k).ts;
        assert!(ts.contains(&(ia, c(6))) && ts.contains(&(ib, c(5))), "TS after rebuild: {ts:?}");
        assert_eq!(a.read(k).value, Some(Value::Int(63)));
        a.call(kt, StoreOp::AdvanceTime(2000), None);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut notes = Vec::new();
        while !notes.contains(&Notification::TimerFired { key: kt }) {
            assert!(Instant::now() < deadline, "the restored timer did not fire: {notes:?}");
            a.conn.notifications(&mut notes).expect("notifications");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// One packet through a client, in a batch of its own: `f` runs between `begin_packet` (with
    /// the given clock) and `end_packet`, as an NF's `process` would.
    fn packet<T>(cl: &mut crate::StoreClient, clock: u64, f: impl FnOnce(&mut crate::StoreClient) -> T) -> T {
        use sluice_state::StateHandle;
        let mut meta = sluice_packet::Meta { clock: c(clock), ..sluice_packet::Meta::default() };
        cl.begin_batch();
        cl.begin_packet(&meta);
        let out = f(cl);
        cl.end_packet(&mut meta);
        cl.end_batch();
        out
    }

    /// End to end with the real client: two `StoreClient`s in async mode count into one shared
    /// write-mostly counter with non-blocking increments (sent as tagged `IncrMany` requests),
    /// under clocks set through `begin_packet`. Increments are powers of two, so a lost or
    /// doubled one shows in the sum:
    ///
    /// - before the checkpoint: A +1 (clock 1), A +2 (2), B +4 (3); both flushed, checkpoint;
    /// - after: A +8 (4), flushed; B +16 (5); B reads at clock 6 → 31 with TS {A: 4, B: 5};
    /// - then A +32 (7), B +64 (8), A +128 (9), all flushed: the store holds 255.
    ///
    /// The store is wiped and rebuilt from the checkpoint, the clients' own `wal()` (which still
    /// holds the entries from before the checkpoint: the cut must skip them) and B's read taken
    /// from the client's `last_read()`. The rebuild starts from 31 and re-executes clocks 7, 8
    /// and 9 only; the counter is 255 again. The clients then reconnect and keep counting.
    #[test]
    fn wipe_and_rebuild_with_store_clients() {
        use crate::client::{ClientConfig, Mode};
        use sluice_state::{AccessPattern, ObjectId, Scope, StateDecl, StateHandle};

        let store = EmbeddedStore::start(1).expect("start");
        let vertex = 9;
        let decls = [StateDecl::new("count", Scope::global(), AccessPattern::WriteMostly)];
        let (ia, ib) = (InstanceId::new(vertex, 0), InstanceId::new(vertex, 1));
        let client = |id: InstanceId| {
            let conn = store.connect(id).expect("connect");
            let cfg = ClientConfig { mode: Mode::Async, ..Default::default() };
            crate::StoreClient::new(conn, id, vertex, &decls, &[], cfg)
        };
        let (mut a, mut b) = (client(ia), client(ib));
        let (obj, sk) = (ObjectId(0), StateKey::Id(1));
        let k = StoreKey { vertex, object: 0, key: sk };
        let incr = |cl: &mut crate::StoreClient, clock: u64, d: i64| {
            packet(cl, clock, |cl| cl.incr_nb(obj, &sk, d)).expect("incr_nb");
        };

        incr(&mut a, 1, 1);
        incr(&mut a, 2, 2);
        incr(&mut b, 3, 4);
        a.flush().expect("flush");
        b.flush().expect("flush");
        let cp = store.checkpoint().expect("checkpoint");
        assert_eq!(cp.values, vec![(k, Value::Int(7))]);
        assert_eq!(cp.ts, vec![(ia, c(2)), (ib, c(3))]);
        a.checkpointed();
        b.checkpointed();

        incr(&mut a, 4, 8);
        a.flush().expect("flush");
        incr(&mut b, 5, 16);
        let seen = packet(&mut b, 6, |cl| cl.get(obj, &sk)).expect("get");
        assert_eq!(seen, Some(Value::Int(31)));
        let read_b = ReadRecord::from(b.last_read().expect("B's read was recorded"));
        assert_eq!(&read_b.ts[..], &[(ia, c(4)), (ib, c(5))]);
        incr(&mut a, 7, 32);
        incr(&mut b, 8, 64);
        incr(&mut a, 9, 128);
        a.flush().expect("flush");
        b.flush().expect("flush");
        let before = packet(&mut a, 10, |cl| cl.get(obj, &sk)).expect("get");
        assert_eq!(before, Some(Value::Int(255)));

        store.wipe().expect("wipe");
        let logs = vec![
            RecoveryLog { instance: ia, wal: a.wal().iter().cloned().collect(), reads: vec![], after_checkpoint: None },
            RecoveryLog {
                instance: ib,
                wal: b.wal().iter().cloned().collect(),
                reads: vec![read_b],
                after_checkpoint: None,
            },
        ];
        assert_eq!(logs.iter().map(|l| l.wal.len()).sum::<usize>(), 8, "every increment is in a WAL");
        let p = plan(&cp, &logs, Vec::new());
        assert_eq!(p.values, vec![(k, Value::Int(31))], "starts from B's read");
        let replayed: Vec<(InstanceId, Clock, StateOp)> =
            p.replay.iter().map(|(i, e)| (*i, e.tag.clock, e.op.clone())).collect();
        assert_eq!(
            replayed,
            vec![(ia, c(7), StateOp::Incr(32)), (ib, c(8), StateOp::Incr(64)), (ia, c(9), StateOp::Incr(128))]
        );
        let stats = apply(&store, &p, &cp.timers).expect("apply");
        assert_eq!((stats.values, stats.reexecuted, stats.failed), (1, 3, 0));

        a.reconnect(store.connect(ia).expect("connect")).expect("reconnect");
        b.reconnect(store.connect(ib).expect("connect")).expect("reconnect");
        let after = packet(&mut b, 11, |cl| cl.get(obj, &sk)).expect("get");
        assert_eq!(after, before, "the rebuilt counter equals the one before the crash");
        incr(&mut a, 12, 256);
        a.flush().expect("flush");
        let last = packet(&mut b, 13, |cl| cl.get(obj, &sk)).expect("get");
        assert_eq!(last, Some(Value::Int(511)), "the rebuilt store keeps counting");
    }
}
