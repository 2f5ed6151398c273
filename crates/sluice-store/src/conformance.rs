//! One conformance suite for every store backend (embedded, Redis, Redis Cluster).
//!
//! Each check takes a [`Backend`], talks to it only through the public API (raw
//! [`Connection`]s, or a [`StoreClient`] where client behaviour is the subject) and returns a
//! description of the first violation it finds. [`all`] lists them by name so a test harness
//! can generate one test per check.
//!
//! # Sharing one store
//! Every check uses its own vertex ids (1001–1020, plus 1102 and 1106 as second vertices), so
//! checks never address each other's values. Keys and packet clocks are further made unique per
//! run (derived from the wall clock and a process-wide counter, see [`fresh_base`]), so the suite
//! can be run repeatedly against a store that is never emptied (a Redis server), without a
//! previous run's values or per-clock log entries getting in the way. Two caveats:
//! - [`checkpoint_restore`] and [`checkpoint_timers`] replace the whole store's contents and
//!   [`wipe_empties_store`] empties it: run the checks listed in [`EXCLUSIVE`] alone, not
//!   concurrently with other checks on the same store.
//! - `ForgetClock(c)` lets the store forget the log of clocks `≤ c` — of every root, and the
//!   embedded store forgets in arrival order (an entry goes once every entry logged before it has
//!   a clock `≤ c`). [`forget_clock_reapplies`] therefore sends a `c` of root 255, above every
//!   clock logged before it; it too must run alone. Every other check tags with root 1.
//!
//! # Contracts the suite relies on (beyond the trait docs)
//! - Notifications about one key reach a client in the order the store generated them; "nothing
//!   was delivered" is checked by a later notification on the same key that must arrive, then
//!   counting (no timing assumptions).
//! - A failure of a request sent without `reply` arrives no later than its batch's ack.
//! - Every wait is bounded by [`TIMEOUT`].

use crate::backend::{Backend, Connection};
use crate::client::{ClientConfig, Mode, StoreClient};
use crate::wire::{Notification, OpTag, Replies, Request, Response, StoreKey, StoreOp};
use sluice_packet::{Clock, FiveTuple, FlowKey, InstanceId, Meta, Proto};
use sluice_state::{
    ops::apply, AccessPattern, CustomOp, LocalState, ObjectId, Scope, StateDecl, StateError, StateHandle, StateKey,
    StateOp, Value,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The longest any check waits for something the store should deliver.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A conformance check: `Ok` if the backend behaves, else what went wrong.
pub type Check = fn(&dyn Backend) -> Result<(), String>;

/// Checks that replace the whole store's contents: run them alone on a shared store.
pub const EXCLUSIVE: &[&str] =
    &["checkpoint_restore", "forget_clock_reapplies", "checkpoint_timers", "wipe_empties_store"];

/// Every check, by name.
pub fn all() -> Vec<(&'static str, Check)> {
    vec![
        ("ops_semantics", ops_semantics as Check),
        ("value_and_key_fidelity", value_and_key_fidelity),
        ("concurrent_pops_unique", concurrent_pops_unique),
        ("concurrent_incr_sums", concurrent_incr_sums),
        ("nonblocking_in_issue_order", nonblocking_in_issue_order),
        ("retransmit_applied_once", retransmit_applied_once),
        ("forget_clock_reapplies", forget_clock_reapplies),
        ("callbacks_raw", callbacks_raw),
        ("callbacks_client", callbacks_client),
        ("ownership_handover", ownership_handover),
        ("timers_fire_once", timers_fire_once),
        ("checkpoint_restore", checkpoint_restore),
        ("ts_vector_on_reads", ts_vector_on_reads),
        ("client_modes_agree", client_modes_agree),
        ("reconnected_instance_notified", reconnected_instance_notified),
        ("checkpoint_timers", checkpoint_timers),
        ("wipe_empties_store", wipe_empties_store),
        ("tagged_reads_not_logged", tagged_reads_not_logged),
        ("recorded_values_repeat", recorded_values_repeat),
    ]
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Offsets a check may add to its [`fresh_base`] (keys, clocks, times) without reaching the next.
pub const BASE_STRIDE: u64 = 1 << 16;

/// A number no earlier call in this process returned and, across processes, larger than any
/// returned more than a fraction of a second ago: the wall clock in units of 64 ns (fits a
/// [`Clock`] sequence number), advanced by at least [`BASE_STRIDE`] per call. Checks derive
/// their keys and packet clocks from it.
pub fn fresh_base() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| (d.as_nanos() / 64) as u64).unwrap_or(0);
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(prev.saturating_add(BASE_STRIDE));
        match LAST.compare_exchange(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(p) => prev = p,
        }
    }
}

/// A small seeded generator (xorshift64*), so that randomised checks are reproducible by seed
/// without a dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D | 1)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        let span = hi.saturating_sub(lo).saturating_add(1).max(1) as u64;
        lo.saturating_add(self.below(span) as i64)
    }
    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// The custom operation the suite registers: "pick the least-loaded backend and add `arg` to
/// its load" over a [`Value::Ints`] record. Result: the chosen index. Fails on an absent or
/// empty record, a non-record value, or a non-integer argument.
pub fn least_loaded_incr(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let by = arg.as_int().ok_or(StateError::Custom("argument must be an int"))?;
    match slot {
        Some(Value::Ints(loads)) => {
            let (i, _) = loads.iter().enumerate().min_by_key(|(_, l)| **l).ok_or(StateError::Custom("no backends"))?;
            if let Some(l) = loads.get_mut(i) {
                *l = l.wrapping_add(by);
            }
            Ok(Some(Value::Int(i as i64)))
        }
        Some(_) => Err(StateError::Custom("not a load record")),
        None => Err(StateError::Custom("no backends")),
    }
}

/// The custom operations the suite registers for each of its vertices.
pub const CUSTOM_OPS: [CustomOp; 1] = [CustomOp { name: "least_loaded_incr", apply: least_loaded_incr }];

fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

fn skey(vertex: u16, object: u16, key: StateKey) -> StoreKey {
    StoreKey { vertex, object, key }
}

fn tag(clock: Clock, seq: u16) -> Option<OpTag> {
    Some(OpTag { clock, seq })
}

/// A clock of root 1 (every check but [`forget_clock_reapplies`]).
fn clk(base: u64, n: u64) -> Clock {
    Clock::new(1, base + n)
}

fn meta(clock: Clock) -> Meta {
    Meta { clock, ..Meta::default() }
}

/// One instance's raw connection, with the bookkeeping to wait for answers, acks and
/// notifications.
struct Raw {
    conn: Box<dyn Connection>,
    client: InstanceId,
    next_id: u64,
    next_batch: u64,
    replies: Replies,
    notes: Vec<Notification>,
}

impl Raw {
    fn open(b: &dyn Backend, client: InstanceId) -> Result<Raw, String> {
        let conn = b.connect(client).map_err(|e| format!("connect({client:?}): {e}"))?;
        Ok(Raw { conn, client, next_id: 1, next_batch: 1, replies: Replies::default(), notes: Vec::new() })
    }

    fn who(&self) -> String {
        format!("instance {}.{}", self.client.vertex(), self.client.index())
    }

    fn req(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>, reply: bool) -> Request {
        let id = self.next_id;
        self.next_id += 1;
        Request { id, client: self.client, tag, key, op, reply }
    }

    fn send(&mut self, reqs: Vec<Request>) -> Result<u64, String> {
        self.send_arc(reqs.into())
    }

    fn send_arc(&mut self, reqs: Arc<[Request]>) -> Result<u64, String> {
        let who = self.who();
        let n = self.next_batch;
        self.next_batch += 1;
        self.conn.send(n, reqs).map_err(|e| format!("{who}: send failed: {e}"))?;
        Ok(n)
    }

    fn pump(&mut self, deadline: Instant) -> Result<(), String> {
        let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(50));
        let who = self.who();
        self.conn.wait(&mut self.replies, left).map_err(|e| format!("{who}: wait failed: {e}"))
    }

    /// Waits for the response to request `id`.
    fn response(&mut self, id: u64) -> Result<Response, String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(p) = self.replies.responses.iter().position(|r| r.id == id) {
                return Ok(self.replies.responses.remove(p));
            }
            if Instant::now() >= deadline {
                return Err(format!("{}: no response to request {id} within {TIMEOUT:?}", self.who()));
            }
            self.pump(deadline)?;
        }
    }

    /// Waits for batch `b` to be acknowledged.
    fn wait_ack(&mut self, b: u64) -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(p) = self.replies.acked.iter().position(|x| *x == b) {
                self.replies.acked.remove(p);
                let who = self.who();
                return self.conn.poll(&mut self.replies).map_err(|e| format!("{who}: poll failed: {e}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("{}: batch {b} not acknowledged within {TIMEOUT:?}", self.who()));
            }
            self.pump(deadline)?;
        }
    }

    /// Removes and returns the responses (failures, for requests sent without `reply`) to `ids`.
    fn take_responses(&mut self, ids: &[u64]) -> Vec<Response> {
        let (mine, rest) = std::mem::take(&mut self.replies.responses).into_iter().partition(|r| ids.contains(&r.id));
        self.replies.responses = rest;
        mine
    }

    /// Sends `op` alone in a batch and waits for its response.
    fn call(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Result<Response, String> {
        let r = self.req(key, op, tag, true);
        let id = r.id;
        self.send(vec![r])?;
        self.response(id)
    }

    /// Like [`Raw::call`], requiring success.
    fn ok(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Result<Option<Value>, String> {
        let what = format!("{op:?} on {key:?}");
        let r = self.call(key, op, tag)?;
        r.result.map_err(|e| format!("{}: {what} failed: {e}", self.who()))
    }

    /// A state operation that must succeed.
    fn state(&mut self, key: StoreKey, op: StateOp, tag: Option<OpTag>) -> Result<Option<Value>, String> {
        self.ok(key, StoreOp::State(op), tag)
    }

    /// Reads a value.
    fn get(&mut self, key: StoreKey) -> Result<Option<Value>, String> {
        self.state(key, StateOp::Get, None)
    }

    /// Sends one request without `reply` and waits for its ack; fails if it failed.
    fn apply_nb(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Result<(), String> {
        let what = format!("{op:?} on {key:?}");
        let r = self.req(key, op, tag, false);
        let id = r.id;
        let b = self.send(vec![r])?;
        self.wait_ack(b)?;
        match self.take_responses(&[id]).into_iter().next() {
            Some(Response { result: Err(e), .. }) => Err(format!("{}: {what} failed: {e}", self.who())),
            _ => Ok(()),
        }
    }

    /// Advances the store's packet time and waits until every shard has it.
    fn advance(&mut self, key: StoreKey, t: u64) -> Result<(), String> {
        self.apply_nb(key, StoreOp::AdvanceTime(t), None)
    }

    fn poll_notes(&mut self) -> Result<(), String> {
        let who = self.who();
        self.conn.poll(&mut self.replies).map_err(|e| format!("{who}: poll failed: {e}"))?;
        self.conn.notifications(&mut self.notes).map_err(|e| format!("{who}: notifications failed: {e}"))
    }

    /// Waits until a notification matching `pred` has arrived (it stays in `notes`).
    fn wait_note(&mut self, what: &str, pred: impl Fn(&Notification) -> bool) -> Result<(), String> {
        self.wait_until(what, |notes| notes.iter().any(&pred))
    }

    /// Waits until the notifications received so far satisfy `done`.
    fn wait_until(&mut self, what: &str, done: impl Fn(&[Notification]) -> bool) -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            self.poll_notes()?;
            if done(&self.notes) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{}: no {what} within {TIMEOUT:?}; notifications received: {:?}",
                    self.who(),
                    self.notes
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The notifications received so far about `key`.
    fn notes_about(&self, key: StoreKey) -> Vec<Notification> {
        self.notes.iter().filter(|n| note_key(n) == key).cloned().collect()
    }
}

fn note_key(n: &Notification) -> StoreKey {
    match n {
        Notification::Changed { key, .. } | Notification::TimerFired { key } | Notification::Handover { key } => *key,
    }
}

fn changed(key: StoreKey, value: Option<Value>) -> Notification {
    Notification::Changed { key, value }
}

/// Compares a store's result with the model's (`ops::apply`): equal values, or both failures.
fn same_result(store: &Result<Option<Value>, String>, model: &Result<Option<Value>, StateError>) -> bool {
    match (store, model) {
        (Ok(a), Ok(b)) => a == b,
        (Err(_), Err(_)) => true,
        _ => false,
    }
}

fn small_value(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0..=2 => Value::Int(rng.range(-2, 3)),
        3 => Value::Float(rng.range(-4, 4) as f64 / 2.0),
        4 => Value::Ints((0..rng.range(0, 3)).map(|_| rng.range(0, 3)).collect()),
        5 => Value::List((0..rng.range(0, 3)).map(|_| Value::Int(rng.range(0, 9))).collect()),
        6 => Value::Bytes((0..rng.range(0, 4)).map(|_| rng.below(256) as u8).collect()),
        _ => Value::Endpoint(IpAddr::V4(Ipv4Addr::new(10, 0, 0, rng.below(3) as u8)), rng.below(3) as u16),
    }
}

/// A random state operation over values of every type (type errors included).
fn random_op(rng: &mut Rng) -> StateOp {
    match rng.below(100) {
        0..=14 => StateOp::Get,
        15..=26 => StateOp::Set(small_value(rng)),
        27..=33 => StateOp::Delete,
        34..=48 => StateOp::Incr(rng.range(-3, 5)),
        49..=60 => StateOp::Push(Value::Int(rng.range(0, 20))),
        61..=68 => StateOp::Pop,
        69..=74 => StateOp::PopN(rng.below(4) as u32),
        75..=85 => {
            let expect = if rng.chance(30) { None } else { Some(Value::Int(rng.range(-2, 3))) };
            StateOp::CompareAndSet { expect, new: Value::Int(rng.range(-2, 3)) }
        }
        86..=97 => StateOp::Custom { op: 0, arg: Value::Int(rng.range(1, 2)) },
        _ => StateOp::Custom { op: 1, arg: Value::Int(1) }, // not registered: always fails
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Operation semantics
// ---------------------------------------------------------------------------------------------

/// Every operation, through the store, has the semantics of [`sluice_state::ops::apply`]:
/// get/set/delete, incr (absent = 0, wrong type → error), push/pop/pop_n (absent = empty),
/// compare-and-set (both outcomes), the registered custom op (and an unregistered one fails);
/// a failed update leaves the value unchanged; a failure of a request sent without `reply` is
/// reported. Then three seeded random sequences in mixed batches (tagged and untagged, with and
/// without `reply`) against the same model.
pub fn ops_semantics(b: &dyn Backend) -> Result<(), String> {
    let v = 1001;
    let base = fresh_base();
    b.register_custom_ops(v, &CUSTOM_OPS).map_err(|e| format!("register_custom_ops: {e}"))?;
    let mut c = Raw::open(b, InstanceId::new(v, 0))?;
    let key = |i: u64| skey(v, 0, StateKey::Id(base + i));
    let ints = |v: &[i64]| Value::Ints(v.to_vec());
    let list = |v: &[i64]| Value::List(v.iter().map(|x| Value::Int(*x)).collect());
    // (key, op, expected result: Some(Ok(..)) / Some(Err(())) / None = only compare with model)
    type Expect = Option<Result<Option<Value>, ()>>;
    let script: Vec<(u64, StateOp, Expect)> = vec![
        (0, StateOp::Get, Some(Ok(None))),
        (0, StateOp::Set(Value::Int(7)), Some(Ok(None))),
        (0, StateOp::Get, Some(Ok(Some(Value::Int(7))))),
        (0, StateOp::Incr(3), Some(Ok(Some(Value::Int(10))))),
        (0, StateOp::Incr(-11), Some(Ok(Some(Value::Int(-1))))),
        (0, StateOp::Delete, Some(Ok(Some(Value::Int(-1))))),
        (0, StateOp::Delete, Some(Ok(None))),
        (0, StateOp::Get, Some(Ok(None))),
        (1, StateOp::Incr(5), Some(Ok(Some(Value::Int(5))))), // absent counts as 0
        (1, StateOp::Push(Value::Int(1)), Some(Err(()))),     // wrong type
        (1, StateOp::Pop, Some(Err(()))),
        (1, StateOp::PopN(2), Some(Err(()))),
        (1, StateOp::Get, Some(Ok(Some(Value::Int(5))))), // unchanged by the failures
        (2, StateOp::Pop, Some(Ok(None))),                // absent = empty
        (2, StateOp::PopN(3), Some(Ok(Some(list(&[]))))),
        (2, StateOp::Push(Value::Int(10)), Some(Ok(Some(Value::Int(1))))),
        (2, StateOp::Push(Value::Int(11)), Some(Ok(Some(Value::Int(2))))),
        (2, StateOp::Push(Value::Int(12)), Some(Ok(Some(Value::Int(3))))),
        (2, StateOp::Incr(1), Some(Err(()))),
        (2, StateOp::Pop, Some(Ok(Some(Value::Int(10))))),
        (2, StateOp::Push(Value::Int(13)), Some(Ok(Some(Value::Int(3))))),
        (2, StateOp::PopN(2), Some(Ok(Some(list(&[11, 12]))))),
        (2, StateOp::PopN(5), Some(Ok(Some(list(&[13]))))),
        (2, StateOp::Pop, Some(Ok(None))),
        (2, StateOp::PopN(0), Some(Ok(Some(list(&[]))))),
        (2, StateOp::Get, Some(Ok(Some(list(&[]))))), // an emptied list is an empty list
        (3, StateOp::Set(Value::Float(1.5)), Some(Ok(None))),
        (3, StateOp::Incr(2), Some(Ok(Some(Value::Float(3.5))))),
        (4, StateOp::CompareAndSet { expect: None, new: Value::Int(1) }, Some(Ok(Some(Value::Int(1))))),
        (4, StateOp::CompareAndSet { expect: None, new: Value::Int(2) }, Some(Ok(Some(Value::Int(1))))),
        (4, StateOp::CompareAndSet { expect: Some(Value::Int(3)), new: Value::Int(4) }, Some(Ok(Some(Value::Int(1))))),
        (4, StateOp::Get, Some(Ok(Some(Value::Int(1))))),
        (4, StateOp::CompareAndSet { expect: Some(Value::Int(1)), new: Value::Int(9) }, Some(Ok(Some(Value::Int(1))))),
        (4, StateOp::Get, Some(Ok(Some(Value::Int(9))))),
        (5, StateOp::Custom { op: 0, arg: Value::Int(1) }, Some(Err(()))), // absent record
        (5, StateOp::Set(ints(&[3, 1, 2])), Some(Ok(None))),
        (5, StateOp::Custom { op: 0, arg: Value::Int(1) }, Some(Ok(Some(Value::Int(1))))),
        (5, StateOp::Custom { op: 0, arg: Value::Int(1) }, Some(Ok(Some(Value::Int(1))))),
        (5, StateOp::Custom { op: 0, arg: Value::Int(5) }, Some(Ok(Some(Value::Int(2))))),
        (5, StateOp::Get, Some(Ok(Some(ints(&[3, 3, 7]))))),
        (5, StateOp::Custom { op: 0, arg: Value::Float(1.0) }, Some(Err(()))),
        (5, StateOp::Custom { op: 7, arg: Value::Int(1) }, Some(Err(()))), // not registered
        (5, StateOp::Get, Some(Ok(Some(ints(&[3, 3, 7]))))),
        (6, StateOp::Set(ints(&[])), Some(Ok(None))),
        (6, StateOp::Custom { op: 0, arg: Value::Int(1) }, Some(Err(()))), // empty record
        (6, StateOp::Get, Some(Ok(Some(ints(&[]))))),
    ];
    let mut model: BTreeMap<u64, Option<Value>> = BTreeMap::new();
    for (n, (k, op, expect)) in script.into_iter().enumerate() {
        let slot = model.entry(k).or_default();
        let want = apply(slot, op.clone(), &CUSTOM_OPS);
        let got = c.call(key(k), StoreOp::State(op.clone()), None)?.result;
        if !same_result(&got, &want) {
            return Err(format!("step {n}: {op:?} on key {k}: store returned {got:?}, ops::apply gives {want:?}"));
        }
        if let Some(e) = expect {
            let ok = match (&got, &e) {
                (Ok(a), Ok(b)) => a == b,
                (Err(_), Err(())) => true,
                _ => false,
            };
            ensure(ok, || format!("step {n}: {op:?} on key {k}: store returned {got:?}, expected {e:?}"))?;
        }
    }

    // A failure of a request sent without `reply` is reported; the others in its batch apply.
    let bad = c.req(key(1), StoreOp::State(StateOp::Push(Value::Int(0))), None, false);
    let good = c.req(key(1), StoreOp::State(StateOp::Incr(1)), None, false);
    let (bad_id, good_id) = (bad.id, good.id);
    let batch = c.send(vec![bad, good])?;
    c.wait_ack(batch)?;
    let answers = c.take_responses(&[bad_id, good_id]);
    ensure(answers.len() == 1 && answers.iter().all(|r| r.id == bad_id && r.result.is_err()), || {
        format!("a failing Push sent without reply should be answered by exactly one error, got {answers:?}")
    })?;
    let now = c.get(key(1))?;
    ensure(now == Some(Value::Int(6)), || format!("the Incr batched after a failing request: value {now:?}, want 6"))?;

    // IncrMany: several tagged increments of one value in one request (result: none).
    let incrs = vec![(OpTag { clock: clk(base, 1), seq: 0 }, 2), (OpTag { clock: clk(base, 2), seq: 0 }, -7)];
    let r = c.ok(key(20), StoreOp::IncrMany(incrs.clone()), None)?;
    ensure(r.is_none(), || format!("IncrMany should answer no value, got {r:?}"))?;
    let now = c.get(key(20))?;
    ensure(now == Some(Value::Int(-5)), || format!("IncrMany [+2, -7] on an absent value: {now:?}, want -5"))?;
    c.state(key(21), StateOp::Push(Value::Int(1)), None)?;
    let incrs = vec![(OpTag { clock: clk(base, 3), seq: 0 }, 1)];
    let r = c.call(key(21), StoreOp::IncrMany(incrs), None)?;
    ensure(r.result.is_err(), || format!("IncrMany on a list should fail, got {r:?}"))?;

    // Random sequences in mixed batches against the model.
    for seed in 1..=3u64 {
        let mut rng = Rng::new(seed);
        let first = 100 + seed * 10;
        let keys: Vec<u64> = (first..first + 4).collect();
        let mut model: BTreeMap<u64, Option<Value>> = BTreeMap::new();
        let mut clock = seed * 10_000;
        for round in 0..60 {
            let n = rng.range(1, 6) as usize;
            let mut batch = Vec::new();
            let mut expect = Vec::new();
            for _ in 0..n {
                let k = keys[rng.below(keys.len() as u64) as usize];
                let op = random_op(&mut rng);
                let reply = rng.chance(60);
                let t = if op.is_update() && rng.chance(50) {
                    clock += 1;
                    tag(clk(base, clock), 0)
                } else {
                    None
                };
                let want = apply(model.entry(k).or_default(), op.clone(), &CUSTOM_OPS);
                let r = c.req(key(k), StoreOp::State(op.clone()), t, reply);
                expect.push((r.id, k, op, reply, want));
                batch.push(r);
            }
            let ids: Vec<u64> = batch.iter().map(|r| r.id).collect();
            let bn = c.send(batch)?;
            for (id, k, op, reply, want) in &expect {
                if *reply {
                    let got = c.response(*id)?.result;
                    ensure(same_result(&got, want), || {
                        format!("seed {seed} round {round}: {op:?} on key {k}: store {got:?}, ops::apply {want:?}")
                    })?;
                }
            }
            c.wait_ack(bn)?;
            let failures = c.take_responses(&ids);
            for (id, k, op, reply, want) in &expect {
                if !*reply {
                    let failed = failures.iter().any(|r| r.id == *id && r.result.is_err());
                    ensure(failed == want.is_err(), || {
                        format!(
                            "seed {seed} round {round}: {op:?} on key {k} sent without reply: store failed={failed}, \
                             ops::apply gives {want:?}"
                        )
                    })?;
                }
            }
        }
        for k in &keys {
            let got = c.get(key(*k))?;
            let want = model.get(k).cloned().flatten();
            ensure(got == want, || format!("seed {seed}: final value of key {k}: store {got:?}, model {want:?}"))?;
        }
    }
    Ok(())
}

/// Every value type round-trips exactly (extreme integers, floats, v4/v6 endpoints, tuples,
/// empty and nested lists, bytes with NUL/CR/LF/quotes), under every key type; keys differing
/// only in object, vertex or key variant are distinct values.
pub fn value_and_key_fidelity(b: &dyn Backend) -> Result<(), String> {
    let v = 1002;
    let base = fresh_base();
    let mut c = Raw::open(b, InstanceId::new(v, 0))?;
    let v6 = |n: u64| IpAddr::V6(Ipv6Addr::from((u128::from(base) << 32) | u128::from(n)));
    let v4 = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    let tuple = FiveTuple { src: v6(1), dst: v4, sport: 1234, dport: 80, proto: Proto::TCP };
    let values = vec![
        Value::Int(i64::MIN),
        Value::Int(i64::MAX),
        Value::Int(0),
        Value::Float(-2.5),
        Value::Float(1e300),
        Value::Endpoint(v4, 0),
        Value::Endpoint(IpAddr::V6(Ipv6Addr::LOCALHOST), 65535),
        Value::Tuple(tuple),
        Value::Ints(vec![]),
        Value::Ints(vec![i64::MIN, -1, 0, i64::MAX]),
        Value::List(VecDeque::new()),
        Value::List(VecDeque::from([
            Value::Int(1),
            Value::Bytes(b"a\0b".to_vec()),
            Value::List(VecDeque::from([Value::Float(0.5), Value::Tuple(tuple.reversed())])),
        ])),
        Value::Bytes(vec![]),
        Value::Bytes(vec![0, 255, b'\n', b'\r', b'"', b'\\', b' ', 0]),
    ];
    let keys = vec![
        skey(v, 0, StateKey::Id(base)),
        skey(v, 1, StateKey::Id(base)),
        skey(v + 100, 0, StateKey::Id(base)),
        skey(v, 0, StateKey::Addr(v6(7))),
        skey(v, 0, StateKey::Endpoint(v6(7), 53, 17)),
        skey(v, 0, StateKey::Endpoint(v6(7), 53, 6)),
        skey(v, 0, StateKey::Flow(FlowKey::from(FiveTuple { src: v6(8), ..tuple }))),
        skey(v, 0, StateKey::Flow(FlowKey::from(FiveTuple { src: v6(8), proto: Proto::UDP, ..tuple }))),
        skey(v, 9, StateKey::Unit),
    ];
    for (i, k) in keys.iter().enumerate() {
        for val in &values {
            c.state(*k, StateOp::Set(val.clone()), None)?;
            let got = c.get(*k)?;
            ensure(got.as_ref() == Some(val), || format!("key {k:?}: wrote {val:?}, read back {got:?}"))?;
        }
        c.state(*k, StateOp::Set(Value::Int(i as i64)), None)?;
    }
    for (i, k) in keys.iter().enumerate() {
        let got = c.get(*k)?;
        ensure(got == Some(Value::Int(i as i64)), || {
            format!("key {k:?} should hold its own value {i}, read {got:?} (keys collide?)")
        })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. Serialisation of concurrent operations
// ---------------------------------------------------------------------------------------------

/// `clients` NAT-like instances of `vertex`, each on its own thread and connection, pop ports
/// concurrently from one shared pool (a list of `ports` ports) with `Pop` and `PopN`, tagged or
/// not, until it is empty: no port is handed out twice and every port is handed out once.
pub fn concurrent_pops(b: &dyn Backend, vertex: u16, seed: u64, clients: u16, ports: u16) -> Result<(), String> {
    let base = fresh_base();
    let pool = skey(vertex, 0, StateKey::Id(base));
    let mut setup = Raw::open(b, InstanceId::new(vertex, 0))?;
    let reqs: Vec<Request> = (0..ports)
        .map(|p| setup.req(pool, StoreOp::State(StateOp::Push(Value::Int(1024 + i64::from(p)))), None, false))
        .collect();
    let bn = setup.send(reqs)?;
    setup.wait_ack(bn)?;
    let len = setup.get(pool)?.and_then(|v| if let Value::List(l) = v { Some(l.len()) } else { None });
    ensure(len == Some(usize::from(ports)), || format!("pool holds {len:?} ports after pushing {ports}"))?;
    let results: Vec<Result<Vec<i64>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|i| {
                s.spawn(move || -> Result<Vec<i64>, String> {
                    let mut c = Raw::open(b, InstanceId::new(vertex, i + 1))?;
                    let mut rng = Rng::new(seed.wrapping_mul(31).wrapping_add(u64::from(i)));
                    let mut got = Vec::new();
                    for n in 0u64.. {
                        // Distinct packets: clocks never repeat across clients.
                        let clock = clk(base, 1 + u64::from(i) + n * u64::from(clients));
                        let t = if rng.chance(50) { tag(clock, 0) } else { None };
                        let op = if rng.chance(70) { StateOp::Pop } else { StateOp::PopN(rng.range(1, 4) as u32) };
                        let r = c.state(pool, op, t)?;
                        let before = got.len();
                        match r {
                            None => {}
                            Some(Value::Int(p)) => got.push(p),
                            Some(Value::List(l)) => {
                                for x in l {
                                    match x {
                                        Value::Int(p) => got.push(p),
                                        other => return Err(format!("pop returned a non-port {other:?}")),
                                    }
                                }
                            }
                            Some(other) => return Err(format!("pop returned {other:?}")),
                        }
                        if got.len() == before {
                            break; // the pool is empty, and nobody refills it
                        }
                    }
                    Ok(got)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("client thread panicked".into()))).collect()
    });
    let mut owner: HashMap<i64, u16> = HashMap::new();
    for (i, r) in results.into_iter().enumerate() {
        for p in r.map_err(|e| format!("client {i}: {e}"))? {
            if let Some(j) = owner.insert(p, i as u16) {
                return Err(format!(
                    "port {p} handed to both client {j} and client {i} (seed {seed}, {clients} clients)"
                ));
            }
        }
    }
    let missing: Vec<i64> = (0..ports).map(|p| 1024 + i64::from(p)).filter(|p| !owner.contains_key(p)).collect();
    ensure(missing.is_empty() && owner.len() == usize::from(ports), || {
        format!("{} ports handed out of {ports}; never handed out: {missing:?} (seed {seed})", owner.len())
    })
}

/// [`concurrent_pops`] with 2 and 4 clients, three seeds each, pool sizes chosen by the seed.
pub fn concurrent_pops_unique(b: &dyn Backend) -> Result<(), String> {
    for seed in 1..=3u64 {
        for clients in [2, 4] {
            let ports = 50 + Rng::new(seed).below(150) as u16;
            concurrent_pops(b, 1003, seed, clients, ports)?;
        }
    }
    Ok(())
}

/// `threads` instances of `vertex` each add `per_thread` random deltas to one counter in
/// batches of random size, with and without `reply`, tagged or not: the total is exact.
pub fn concurrent_incr(b: &dyn Backend, vertex: u16, seed: u64, threads: u16, per_thread: u32) -> Result<(), String> {
    let base = fresh_base();
    let counter = skey(vertex, 0, StateKey::Id(base));
    let sums: Vec<Result<i64, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                s.spawn(move || -> Result<i64, String> {
                    let mut c = Raw::open(b, InstanceId::new(vertex, i + 1))?;
                    let mut rng = Rng::new(seed.wrapping_mul(131).wrapping_add(u64::from(i)));
                    let mut sum = 0i64;
                    let mut sent = 0u32;
                    let mut batches = Vec::new();
                    let mut ids = Vec::new();
                    while sent < per_thread {
                        let n = (rng.range(1, 8) as u32).min(per_thread - sent);
                        let mut reqs = Vec::new();
                        for _ in 0..n {
                            let d = rng.range(-5, 10);
                            sum += d;
                            let clock = clk(base, 1 + u64::from(i) + u64::from(sent) * u64::from(threads));
                            let t = if rng.chance(50) { tag(clock, 0) } else { None };
                            let r = c.req(counter, StoreOp::State(StateOp::Incr(d)), t, rng.chance(30));
                            ids.push(r.id);
                            reqs.push(r);
                            sent += 1;
                        }
                        batches.push(c.send(reqs)?);
                    }
                    for bn in batches {
                        c.wait_ack(bn)?;
                    }
                    if let Some(e) = c.take_responses(&ids).into_iter().find(|r| r.result.is_err()) {
                        return Err(format!("an Incr failed: {e:?}"));
                    }
                    Ok(sum)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("incr thread panicked".into()))).collect()
    });
    let mut total = 0i64;
    for (i, r) in sums.into_iter().enumerate() {
        total += r.map_err(|e| format!("thread {i}: {e}"))?;
    }
    let mut c = Raw::open(b, InstanceId::new(vertex, 0))?;
    let got = c.get(counter)?;
    let want = if threads == 0 || per_thread == 0 { None } else { Some(Value::Int(total)) };
    ensure(got == want, || {
        format!("{threads} threads × {per_thread} incr (seed {seed}): counter {got:?}, want {want:?}")
    })
}

/// [`concurrent_incr`] with 2, 4 and 8 threads.
pub fn concurrent_incr_sums(b: &dyn Backend) -> Result<(), String> {
    for (seed, threads) in [(1, 2), (2, 4), (3, 8)] {
        concurrent_incr(b, 1004, seed, threads, 300)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. Non-blocking operations in issue order
// ---------------------------------------------------------------------------------------------

/// Non-blocking updates are applied in issue order before a later read: through a raw
/// connection (many non-`reply` batches of pushes, not waited for, then a Get: the exact list),
/// and through a [`StoreClient`] in [`Mode::Async`] (`incr_nb`/`push_nb` on write-mostly objects
/// over many packets and batches, then `get` sees all of them, the list in exact order, with
/// only the reads as round trips).
pub fn nonblocking_in_issue_order(b: &dyn Backend) -> Result<(), String> {
    let v = 1005;
    let base = fresh_base();
    // Raw: per connection, requests on one value apply in the order sent.
    let mut c = Raw::open(b, InstanceId::new(v, 9))?;
    let list = skey(v, 5, StateKey::Id(base));
    let mut n = 0i64;
    for _ in 0..20 {
        let reqs: Vec<Request> = (0..10)
            .map(|_| {
                n += 1;
                c.req(list, StoreOp::State(StateOp::Push(Value::Int(n))), None, false)
            })
            .collect();
        c.send(reqs)?;
    }
    let got = c.get(list)?;
    let want = Value::List((1..=n).map(Value::Int).collect());
    ensure(got.as_ref() == Some(&want), || format!("raw: 200 pushes then Get: {got:?}"))?;

    let decls = [
        StateDecl::new("count", Scope::global(), AccessPattern::WriteMostly),
        StateDecl::new("log", Scope::global(), AccessPattern::WriteMostly),
    ];
    let id = InstanceId::new(v, 0);
    let conn = b.connect(id).map_err(|e| format!("connect: {e}"))?;
    let mut cl = StoreClient::new(conn, id, v, &decls, &[], ClientConfig { mode: Mode::Async, ..Default::default() });
    let (count, log) = (ObjectId(0), ObjectId(1));
    let (ck, lk) = (StateKey::Id(base + 1), StateKey::Id(base + 2));
    let mut sum = 0i64;
    let mut pushed = Vec::new();
    let mut packet = 0u64;
    let mut reads = 0u64;
    cl.begin_batch();
    for round in 0..4 {
        for i in 0..250i64 {
            packet += 1;
            cl.begin_packet(&meta(clk(base, packet)));
            let d = i % 7 + 1;
            sum += d;
            cl.incr_nb(count, &ck, d).map_err(|e| format!("incr_nb: {e}"))?;
            let x = Value::Int(round * 1000 + i);
            cl.push_nb(log, &lk, x.clone()).map_err(|e| format!("push_nb: {e}"))?;
            pushed.push(x);
            let mut m = meta(clk(base, packet));
            cl.end_packet(&mut m);
            if i % 16 == 15 {
                cl.end_batch();
                cl.begin_batch();
            }
        }
        // Read mid-batch (some updates still queued in the client) and after a batch end.
        let got = cl.get(count, &ck).map_err(|e| format!("get: {e}"))?;
        reads += 1;
        ensure(got == Some(Value::Int(sum)), || format!("round {round}: counter {got:?} after incr_nb summing {sum}"))?;
        let got = cl.get(log, &lk).map_err(|e| format!("get: {e}"))?;
        reads += 1;
        let want = Value::List(pushed.iter().cloned().collect());
        ensure(got.as_ref() == Some(&want), || {
            format!("round {round}: list after {} push_nb is not them in issue order: {got:?}", pushed.len())
        })?;
    }
    cl.end_batch();
    cl.flush().map_err(|e| format!("flush: {e}"))?;
    let s = cl.stats();
    ensure(s.round_trips == reads, || {
        format!("non-blocking updates were waited for: {} round trips for {reads} reads", s.round_trips)
    })?;
    ensure(s.async_errors == 0, || format!("{} non-blocking updates failed", s.async_errors))
}

// ---------------------------------------------------------------------------------------------
// 4. Exactly-once application of tagged updates
// ---------------------------------------------------------------------------------------------

/// A retransmitted tagged update is applied once: the same `Incr` and tag sent again (another
/// batch) is answered from the log with the first result and `replayed = true`; the same for a
/// retransmitted batch without `reply`; and from another instance of the same vertex (a clone
/// replaying the packet). The same tag at another vertex is a different update (tags are
/// per vertex), and a new tag applies normally.
pub fn retransmit_applied_once(b: &dyn Backend) -> Result<(), String> {
    let v = 1006;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let t = tag(clk(base, 1), 0);
    let r1 = a.call(k, StoreOp::State(StateOp::Incr(5)), t)?;
    ensure(r1.result == Ok(Some(Value::Int(5))) && !r1.replayed, || format!("first tagged Incr(5): {r1:?}"))?;
    let r2 = a.call(k, StoreOp::State(StateOp::Incr(5)), t)?;
    ensure(r2.result == Ok(Some(Value::Int(5))) && r2.replayed, || {
        format!("retransmitted Incr(5) should return the logged Int(5) with replayed=true, got {r2:?}")
    })?;
    let now = a.get(k)?;
    ensure(now == Some(Value::Int(5)), || format!("after a retransmitted Incr(5): {now:?}, want 5"))?;

    // Retransmission of a whole non-reply batch (the client's case).
    let t2 = tag(clk(base, 2), 0);
    let t3 = tag(clk(base, 2), 1);
    let batch: Arc<[Request]> = vec![
        a.req(k, StoreOp::State(StateOp::Incr(7)), t2, false),
        a.req(k, StoreOp::State(StateOp::Incr(100)), t3, false),
    ]
    .into();
    for _ in 0..3 {
        let bn = a.send_arc(batch.clone())?;
        a.wait_ack(bn)?;
    }
    let now = a.get(k)?;
    ensure(now == Some(Value::Int(112)), || format!("a batch of Incr(7), Incr(100) sent 3 times: {now:?}, want 112"))?;

    // IncrMany: each increment is applied once, whichever requests carry it.
    let m = skey(v, 1, StateKey::Id(base));
    let (u1, u2, u3) = (
        OpTag { clock: clk(base, 4), seq: 0 },
        OpTag { clock: clk(base, 4), seq: 1 },
        OpTag { clock: clk(base, 5), seq: 0 },
    );
    a.apply_nb(m, StoreOp::IncrMany(vec![(u1, 1), (u2, 2)]), None)?;
    a.apply_nb(m, StoreOp::IncrMany(vec![(u1, 1), (u2, 2)]), None)?;
    a.apply_nb(m, StoreOp::IncrMany(vec![(u2, 2), (u3, 4)]), None)?;
    let now = a.get(m)?;
    ensure(now == Some(Value::Int(7)), || {
        format!("IncrMany [u1+1,u2+2] twice then [u2+2,u3+4]: {now:?}, want 7 (each tag applied once)")
    })?;
    let r = a.call(m, StoreOp::State(StateOp::Incr(4)), Some(u3))?;
    ensure(r.replayed && a.get(m)? == Some(Value::Int(7)), || {
        format!("an Incr with a tag applied by IncrMany should be a replay: {r:?}")
    })?;

    // A clone (another instance of the vertex) replaying the same packet clock and seq.
    let mut clone = Raw::open(b, InstanceId::new(v, 1))?;
    let r3 = clone.call(k, StoreOp::State(StateOp::Incr(5)), t)?;
    ensure(r3.result == Ok(Some(Value::Int(5))) && r3.replayed, || {
        format!("a clone replaying the tag should get the logged Int(5), replayed=true: {r3:?}")
    })?;
    clone.apply_nb(k, StoreOp::State(StateOp::Incr(7)), t2)?;
    let now = clone.get(k)?;
    ensure(now == Some(Value::Int(112)), || format!("after a clone replayed two updates: {now:?}, want 112"))?;

    // The same tag at another vertex (the next NF processing the same packet) is applied.
    let other = skey(v + 100, 0, StateKey::Id(base));
    let mut o = Raw::open(b, InstanceId::new(v + 100, 0))?;
    let r4 = o.call(other, StoreOp::State(StateOp::Incr(5)), t)?;
    ensure(r4.result == Ok(Some(Value::Int(5))) && !r4.replayed, || {
        format!("the same clock/seq at another vertex must be applied, got {r4:?}")
    })?;
    // A new tag applies normally.
    let r5 = clone.call(k, StoreOp::State(StateOp::Incr(1)), tag(clk(base, 3), 0))?;
    ensure(r5.result == Ok(Some(Value::Int(113))) && !r5.replayed, || format!("new tag: {r5:?}"))
}

/// The contract of `ForgetClock(c)`: once `c` is above every clock logged before (the root is
/// done with all those packets), the store forgets their per-clock log, so a tag of such a clock
/// sent again is applied again; tags of later clocks are still recognised. Uses clocks of root
/// 255 (above every other root's): run it alone on a shared store, see [`EXCLUSIVE`].
pub fn forget_clock_reapplies(b: &dyn Backend) -> Result<(), String> {
    let v = 1007;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let old = tag(Clock::new(255, base + 1), 0);
    let young = tag(Clock::new(255, base + 10), 0);
    a.state(k, StateOp::Incr(1), old)?;
    a.state(k, StateOp::Incr(10), young)?;
    let r = a.call(k, StoreOp::State(StateOp::Incr(1)), old)?;
    ensure(r.replayed && r.result == Ok(Some(Value::Int(1))), || format!("before ForgetClock: {r:?}"))?;
    a.apply_nb(k, StoreOp::ForgetClock(Clock::new(255, base + 5)), None)?;
    let r = a.call(k, StoreOp::State(StateOp::Incr(1)), old)?;
    ensure(!r.replayed && r.result == Ok(Some(Value::Int(12))), || {
        format!("after ForgetClock(c ≥ its clock) a tag applies again (12, not replayed), got {r:?}")
    })?;
    let r = a.call(k, StoreOp::State(StateOp::Incr(10)), young)?;
    ensure(r.replayed && r.result == Ok(Some(Value::Int(11))), || {
        format!("ForgetClock(c) must keep the log of clocks > c: replaying the younger tag gave {r:?}")
    })?;
    let now = a.get(k)?;
    ensure(now == Some(Value::Int(12)), || format!("final value {now:?}, want 12"))
}

// ---------------------------------------------------------------------------------------------
// 5. Callbacks
// ---------------------------------------------------------------------------------------------

/// Subscribers are called back with each new value (including deletion, and updates sent
/// without `reply`); the updater is not called back for its own update; after `Unsubscribe` no
/// callback comes until subscribing again (which returns the current value).
pub fn callbacks_raw(b: &dyn Backend) -> Result<(), String> {
    let v = 1008;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let mut bb = Raw::open(b, InstanceId::new(v, 1))?;
    let r = a.ok(k, StoreOp::Subscribe, None)?;
    ensure(r.is_none(), || format!("Subscribe to an absent value returned {r:?}"))?;
    bb.ok(k, StoreOp::Subscribe, None)?;
    bb.state(k, StateOp::Set(Value::Int(1)), None)?;
    a.wait_note("Changed(1) after B's Set", |n| *n == changed(k, Some(Value::Int(1))))?;
    a.state(k, StateOp::Set(Value::Int(2)), None)?;
    bb.wait_note("Changed(2) after A's Set", |n| *n == changed(k, Some(Value::Int(2))))?;
    let got = bb.notes_about(k);
    ensure(got == vec![changed(k, Some(Value::Int(2)))], || {
        format!("B must not be called back for its own update: B received {got:?}")
    })?;
    bb.state(k, StateOp::Incr(3), None)?;
    a.wait_note("Changed(5) after B's Incr", |n| *n == changed(k, Some(Value::Int(5))))?;
    let got = a.notes_about(k);
    ensure(got == vec![changed(k, Some(Value::Int(1))), changed(k, Some(Value::Int(5)))], || {
        format!("A should have received Changed(1), Changed(5) (not its own Set(2)): {got:?}")
    })?;
    bb.apply_nb(k, StoreOp::State(StateOp::Incr(1)), tag(clk(base, 1), 0))?;
    a.wait_note("Changed(6) after a non-reply Incr", |n| *n == changed(k, Some(Value::Int(6))))?;
    bb.state(k, StateOp::Delete, None)?;
    a.wait_note("Changed(None) after Delete", |n| *n == changed(k, None))?;
    a.ok(k, StoreOp::Unsubscribe, None)?;
    a.notes.clear();
    bb.state(k, StateOp::Set(Value::Int(7)), None)?;
    let r = a.ok(k, StoreOp::Subscribe, None)?;
    ensure(r == Some(Value::Int(7)), || format!("Subscribe should return the current value 7, got {r:?}"))?;
    bb.state(k, StateOp::Set(Value::Int(8)), None)?;
    a.wait_note("Changed(8) after re-subscribing", |n| *n == changed(k, Some(Value::Int(8))))?;
    let got = a.notes_about(k);
    ensure(got == vec![changed(k, Some(Value::Int(8)))], || {
        format!("A was unsubscribed during Set(7), so only Changed(8) should arrive: {got:?}")
    })
}

/// Through [`StoreClient`]s in Cached and Async mode, a read-heavy cross-flow object shared by
/// two instances (`set_exclusive(obj, false)`): A's reads are served from its cache, B's
/// updates (blocking, non-blocking, delete) reach A by callback, absorbed at `begin_batch`.
pub fn callbacks_client(b: &dyn Backend) -> Result<(), String> {
    let v = 1009;
    let decls = [StateDecl::new("map", Scope::global(), AccessPattern::ReadHeavy)];
    let obj = ObjectId(0);
    for (m, mode) in [Mode::Cached, Mode::Async].into_iter().enumerate() {
        let base = fresh_base();
        let k = StateKey::Id(base);
        let mk = |i: u16| -> Result<StoreClient, String> {
            let id = InstanceId::new(v, i);
            let conn = b.connect(id).map_err(|e| format!("connect: {e}"))?;
            Ok(StoreClient::new(conn, id, v, &decls, &[], ClientConfig { mode, ..Default::default() }))
        };
        let (mut a, mut bb) = (mk(2 * m as u16)?, mk(2 * m as u16 + 1)?);
        a.set_exclusive(obj, false);
        bb.set_exclusive(obj, false);
        let mut packet = 0u64;
        let mut step = |c: &mut StoreClient, f: &mut dyn FnMut(&mut StoreClient) -> Result<(), StateError>| {
            packet += 1;
            c.begin_batch();
            c.begin_packet(&meta(clk(base, packet)));
            let r = f(c);
            let mut m = meta(clk(base, packet));
            c.end_packet(&mut m);
            c.end_batch();
            r.and_then(|_| c.flush()).map_err(|e| format!("{mode:?}: {e}"))
        };
        step(&mut bb, &mut |c| c.set(obj, &k, Value::Int(10)))?;
        let mut first = None;
        step(&mut a, &mut |c| {
            first = c.get(obj, &k)?;
            Ok(())
        })?;
        ensure(first == Some(Value::Int(10)), || format!("{mode:?}: A's first read {first:?}, want 10"))?;
        let trips = a.stats().round_trips;
        let hits = a.stats().cache_hits;
        let again = a.get(obj, &k).map_err(|e| format!("{e}"))?;
        ensure(
            again == Some(Value::Int(10)) && a.stats().cache_hits == hits + 1 && a.stats().round_trips == trips,
            || format!("{mode:?}: A's second read should be a cache hit of 10: {again:?}, {:?}", a.stats()),
        )?;
        let updates: [(&str, Option<Value>); 3] =
            [("set", Some(Value::Int(11))), ("incr_nb", Some(Value::Int(16))), ("delete", None)];
        for (what, want) in updates {
            step(&mut bb, &mut |c| match what {
                "set" => c.set(obj, &k, Value::Int(11)),
                "incr_nb" => c.incr_nb(obj, &k, 5),
                _ => c.delete(obj, &k).map(|_| ()),
            })?;
            let deadline = Instant::now() + TIMEOUT;
            loop {
                a.begin_batch();
                let got = a.get(obj, &k).map_err(|e| format!("{mode:?}: {e}"))?;
                a.end_batch();
                if got == want {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "{mode:?}: after B's {what}, A still reads {got:?} (want {want:?}) after {TIMEOUT:?}; {:?}",
                        a.stats()
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let s = a.stats();
        ensure(s.callbacks >= 3 && s.round_trips == trips, || {
            format!("{mode:?}: A should have been kept fresh by 3 callbacks without new round trips: {s:?}")
        })?;
    }
    Ok(())
}

/// An instance that connects again (a restarted or replacement instance with the same id) is
/// notified on its new connection: callbacks, handovers and timers.
pub fn reconnected_instance_notified(b: &dyn Backend) -> Result<(), String> {
    let v = 1017;
    let base = fresh_base();
    let t0 = base.saturating_mul(64);
    let (k, owned, timed) =
        (skey(v, 0, StateKey::Id(base)), skey(v, 0, StateKey::Id(base + 1)), skey(v, 0, StateKey::Id(base + 2)));
    let mut bb = Raw::open(b, InstanceId::new(v, 1))?;
    {
        let mut old = Raw::open(b, InstanceId::new(v, 0))?;
        old.ok(k, StoreOp::Subscribe, None)?;
        bb.state(k, StateOp::Set(Value::Int(1)), None)?;
        old.wait_note("Changed(1) on the first connection", |n| *n == changed(k, Some(Value::Int(1))))?;
    }
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    a.ok(k, StoreOp::Subscribe, None)?;
    bb.state(k, StateOp::Set(Value::Int(2)), None)?;
    a.wait_note("Changed(2) on the new connection", |n| *n == changed(k, Some(Value::Int(2))))?;
    bb.ok(owned, StoreOp::Claim, None)?;
    a.ok(owned, StoreOp::Claim, None)?;
    bb.ok(owned, StoreOp::Release, None)?;
    a.wait_note("Handover on the new connection", |n| *n == Notification::Handover { key: owned })?;
    a.ok(timed, StoreOp::SetTimer { deadline_ns: t0 + 10 }, None)?;
    a.advance(timed, t0 + 20)?;
    a.wait_note("TimerFired on the new connection", |n| *n == Notification::TimerFired { key: timed })
}

// ---------------------------------------------------------------------------------------------
// 6. Ownership
// ---------------------------------------------------------------------------------------------

/// Ownership of a per-flow value hands over: A claims (1), claims again (1), B's claim gets 0;
/// only the owner may update (reads are open); a release by a non-owner changes nothing; A's
/// release hands the value to B (told by `Handover`), which may now update it and A may not.
pub fn ownership_handover(b: &dyn Backend) -> Result<(), String> {
    let v = 1010;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let mut bb = Raw::open(b, InstanceId::new(v, 1))?;
    let r = a.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(1)), || format!("A's Claim of an unowned value: {r:?}, want Int(1)"))?;
    let r = a.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(1)), || format!("the owner's second Claim: {r:?}, want Int(1)"))?;
    a.state(k, StateOp::Set(Value::Int(5)), tag(clk(base, 1), 0))?;
    let r = bb.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(0)), || format!("B's Claim of A's value: {r:?}, want Int(0)"))?;
    for op in [StateOp::Set(Value::Int(9)), StateOp::Incr(1), StateOp::Delete] {
        let r = bb.call(k, StoreOp::State(op.clone()), tag(clk(base, 2), 0))?;
        ensure(r.result.is_err(), || format!("B's {op:?} of a value A owns should fail, got {r:?}"))?;
    }
    let r = bb.get(k)?;
    ensure(r == Some(Value::Int(5)), || format!("B reads A's value: {r:?}, want 5 (reads are open)"))?;
    bb.ok(k, StoreOp::Release, None)?; // not the owner: no effect
    let r = bb.call(k, StoreOp::State(StateOp::Incr(1)), None)?;
    ensure(r.result.is_err(), || format!("a Release by a non-owner must not hand over: B's Incr gave {r:?}"))?;
    a.state(k, StateOp::Incr(1), tag(clk(base, 3), 0))?;
    a.ok(k, StoreOp::Release, None)?;
    bb.wait_note("Handover after A's Release", |n| *n == Notification::Handover { key: k })?;
    let r = bb.state(k, StateOp::Incr(1), tag(clk(base, 4), 0))?;
    ensure(r == Some(Value::Int(7)), || format!("B's Incr after the handover: {r:?}, want 7"))?;
    let r = a.call(k, StoreOp::State(StateOp::Incr(1)), tag(clk(base, 5), 0))?;
    ensure(r.result.is_err(), || format!("A's update after handing over should fail, got {r:?}"))?;
    let r = a.ok(k, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(0)), || format!("A's Claim of B's value: {r:?}, want Int(0)"))?;
    bb.ok(k, StoreOp::Release, None)?;
    a.wait_note("Handover back to A", |n| *n == Notification::Handover { key: k })?;
    a.state(k, StateOp::Incr(1), tag(clk(base, 6), 0))?;
    a.ok(k, StoreOp::Release, None)?;
    let r = bb.state(k, StateOp::Incr(1), tag(clk(base, 7), 0))?;
    ensure(r == Some(Value::Int(9)), || format!("after the last Release the value is unowned: B's Incr gave {r:?}"))
}

// ---------------------------------------------------------------------------------------------
// 7. Timers
// ---------------------------------------------------------------------------------------------

/// A timer fires once, to the instance that armed it (to the owner if the key is claimed): not
/// before its deadline, once past it, not again; a re-armed timer fires at its new deadline
/// only; a cancelled timer never fires. Packet times are far above any the store has seen (and
/// unique per run), so the check works on a store that keeps its time.
pub fn timers_fire_once(b: &dyn Backend) -> Result<(), String> {
    let v = 1011;
    let base = fresh_base();
    let t0 = base.saturating_mul(64); // about now, in ns; offsets stay below BASE_STRIDE * 64
    let (k1, k2, k3) =
        (skey(v, 0, StateKey::Id(base)), skey(v, 0, StateKey::Id(base + 1)), skey(v, 0, StateKey::Id(base + 2)));
    let mut a = Raw::open(b, InstanceId::new(v, 0))?;
    let mut bb = Raw::open(b, InstanceId::new(v, 1))?;
    let fired = |k: StoreKey| move |n: &Notification| *n == Notification::TimerFired { key: k };
    let count = |c: &Raw, k: StoreKey| c.notes.iter().filter(|n| **n == Notification::TimerFired { key: k }).count();
    // "Nothing more was delivered" is checked after a sentinel: a value change on the same key
    // that the watcher is called back for; anything the timer sent earlier arrived before it.
    let mut sentinel = 0i64;
    let mut sync = |watcher: &mut Raw, writer: &mut Raw, k: StoreKey| -> Result<(), String> {
        sentinel += 1;
        writer.state(k, StateOp::Set(Value::Int(sentinel)), None)?;
        let want = changed(k, Some(Value::Int(sentinel)));
        watcher.wait_note("the sentinel callback", |n| *n == want)
    };
    for k in [k1, k2, k3] {
        a.ok(k, StoreOp::Subscribe, None)?;
    }
    bb.ok(k3, StoreOp::Subscribe, None)?;

    // Not before the deadline; once past it; not again.
    a.ok(k1, StoreOp::SetTimer { deadline_ns: t0 + 100 }, None)?;
    a.advance(k1, t0 + 50)?;
    sync(&mut a, &mut bb, k1)?;
    ensure(count(&a, k1) == 0, || format!("a timer fired before its deadline: {:?}", a.notes_about(k1)))?;
    a.advance(k1, t0 + 150)?;
    a.wait_note("TimerFired(k1) past its deadline", fired(k1))?;
    a.advance(k1, t0 + 300)?;
    sync(&mut a, &mut bb, k1)?;
    ensure(count(&a, k1) == 1, || format!("a timer fired more than once: {:?}", a.notes_about(k1)))?;
    // Re-armed twice: fires at the last deadline only.
    a.ok(k1, StoreOp::SetTimer { deadline_ns: t0 + 500 }, None)?;
    a.ok(k1, StoreOp::SetTimer { deadline_ns: t0 + 700 }, None)?;
    a.advance(k1, t0 + 600)?;
    sync(&mut a, &mut bb, k1)?;
    ensure(count(&a, k1) == 1, || format!("a re-armed timer fired at its old deadline: {:?}", a.notes_about(k1)))?;
    a.advance(k1, t0 + 800)?;
    a.wait_until("a second TimerFired(k1) at the re-armed deadline", |notes| {
        notes.iter().filter(|n| **n == Notification::TimerFired { key: k1 }).count() >= 2
    })?;
    sync(&mut a, &mut bb, k1)?;
    ensure(count(&a, k1) == 2, || format!("the re-armed timer fired more than once: {:?}", a.notes_about(k1)))?;

    // Cancelled: never fires.
    a.ok(k2, StoreOp::SetTimer { deadline_ns: t0 + 1000 }, None)?;
    a.ok(k2, StoreOp::CancelTimer, None)?;
    a.advance(k2, t0 + 1100)?;
    sync(&mut a, &mut bb, k2)?;
    ensure(count(&a, k2) == 0, || format!("a cancelled timer fired: {:?}", a.notes_about(k2)))?;

    // The owner of a claimed key is told, not the instance that armed the timer.
    let r = a.ok(k3, StoreOp::Claim, None)?;
    ensure(r == Some(Value::Int(1)), || format!("Claim: {r:?}"))?;
    bb.ok(k3, StoreOp::SetTimer { deadline_ns: t0 + 1500 }, None)?;
    a.advance(k3, t0 + 1600)?;
    a.wait_note("TimerFired(k3) at the owner", fired(k3))?;
    sync(&mut bb, &mut a, k3)?;
    ensure(count(&bb, k3) == 0, || format!("the armer was told of a timer on a key it does not own: {:?}", bb.notes))?;
    a.ok(k3, StoreOp::Release, None)?;
    bb.ok(k3, StoreOp::SetTimer { deadline_ns: t0 + 1700 }, None)?;
    a.advance(k3, t0 + 1800)?;
    bb.wait_note("TimerFired(k3) at the armer once the key is unowned", fired(k3))?;
    sync(&mut a, &mut bb, k3)?;
    ensure(count(&a, k3) == 1, || format!("the former owner was told of B's timer: {:?}", a.notes_about(k3)))?;
    let stray: Vec<_> = bb.notes.iter().filter(|n| note_key(n) != k3).collect();
    ensure(stray.is_empty(), || format!("B received notifications for A's timers: {stray:?}"))
}

// ---------------------------------------------------------------------------------------------
// 8–9. Checkpoints and TS vectors
// ---------------------------------------------------------------------------------------------

fn ts_has(ts: &[(InstanceId, Clock)], who: InstanceId, clock: Clock) -> bool {
    ts.iter().any(|(i, c)| *i == who && *c == clock)
}

/// Checkpoint and restore round-trip: values written by two instances with tagged updates are
/// in the checkpoint; so is the TS vector (per instance, the clock of its last tagged update).
/// After changing, deleting and adding values, `restore` brings back exactly the checkpoint's
/// values, and a Get of a shared value returns a TS vector holding the checkpoint's clocks.
/// Replaces the whole store: see [`EXCLUSIVE`].
pub fn checkpoint_restore(b: &dyn Backend) -> Result<(), String> {
    let v = 1012;
    let base = fresh_base();
    let k = |n: u64| skey(v, 0, StateKey::Id(base + n));
    let (i1, i2) = (InstanceId::new(v, 1), InstanceId::new(v, 2));
    let mut c1 = Raw::open(b, i1)?;
    let mut c2 = Raw::open(b, i2)?;
    c1.state(k(1), StateOp::Set(Value::Int(1)), tag(clk(base, 1), 0))?;
    c1.state(k(2), StateOp::Incr(5), tag(clk(base, 2), 0))?;
    c2.state(k(3), StateOp::Push(Value::Int(7)), tag(clk(base, 3), 0))?;
    c2.state(k(4), StateOp::Set(Value::Ints(vec![1, 2])), tag(clk(base, 4), 0))?;
    c1.state(k(1), StateOp::Set(Value::Int(2)), tag(clk(base, 5), 0))?;
    let want: Vec<(StoreKey, Option<Value>)> = vec![
        (k(1), Some(Value::Int(2))),
        (k(2), Some(Value::Int(5))),
        (k(3), Some(Value::List(VecDeque::from([Value::Int(7)])))),
        (k(4), Some(Value::Ints(vec![1, 2]))),
        (k(5), None),
    ];
    let cp = b.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
    for (key, val) in &want {
        let got = cp.values.iter().find(|(x, _)| x == key).map(|(_, v)| v.clone());
        ensure(got == *val, || format!("checkpoint holds {got:?} for {key:?}, want {val:?}"))?;
    }
    ensure(ts_has(&cp.ts, i1, clk(base, 5)) && ts_has(&cp.ts, i2, clk(base, 4)), || {
        let mine: Vec<_> = cp.ts.iter().filter(|(i, _)| *i == i1 || *i == i2).collect();
        format!("checkpoint TS should hold (i1, {}), (i2, {}); has {mine:?}", clk(base, 5), clk(base, 4))
    })?;
    c1.state(k(1), StateOp::Set(Value::Int(100)), tag(clk(base, 6), 0))?;
    c2.state(k(2), StateOp::Delete, tag(clk(base, 7), 0))?;
    c1.state(k(3), StateOp::Push(Value::Int(8)), None)?;
    c2.state(k(5), StateOp::Set(Value::Int(3)), None)?;
    b.restore(&cp).map_err(|e| format!("restore: {e}"))?;
    let mut r = Raw::open(b, InstanceId::new(v, 3))?;
    for (key, val) in &want {
        let got = r.get(*key)?;
        ensure(got == *val, || format!("after restore {key:?} holds {got:?}, want {val:?} (the checkpoint's)"))?;
    }
    let resp = r.call(k(1), StoreOp::State(StateOp::Get), None)?;
    let ts =
        resp.ts.clone().ok_or_else(|| format!("a Get of a shared value after restore returned no TS: {resp:?}"))?;
    ensure(ts_has(&ts, i1, clk(base, 5)) && ts_has(&ts, i2, clk(base, 4)), || {
        let mine: Vec<_> = ts.iter().filter(|(i, _)| *i == i1 || *i == i2).collect();
        format!(
            "TS after restore should be the checkpoint's (i1, {}), (i2, {}); has {mine:?}",
            clk(base, 5),
            clk(base, 4)
        )
    })
}

/// A Get of a shared value returns the TS vector: after tagged updates of the value by
/// instances 1 and 2 at clocks 5 and 9 (relative to the run's base), it holds (i1, 5) and
/// (i2, 9); an untagged update changes nothing, a later tagged one advances its instance.
pub fn ts_vector_on_reads(b: &dyn Backend) -> Result<(), String> {
    let v = 1013;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let (i1, i2) = (InstanceId::new(v, 1), InstanceId::new(v, 2));
    let mut c1 = Raw::open(b, i1)?;
    let mut c2 = Raw::open(b, i2)?;
    let mut r = Raw::open(b, InstanceId::new(v, 3))?;
    let read = |r: &mut Raw| -> Result<Vec<(InstanceId, Clock)>, String> {
        let resp = r.call(k, StoreOp::State(StateOp::Get), None)?;
        resp.ts
            .as_ref()
            .map(|t| t.to_vec())
            .ok_or_else(|| format!("a Get of a shared value returned no TS vector: {resp:?}"))
    };
    c1.state(k, StateOp::Incr(1), tag(clk(base, 5), 0))?;
    c2.state(k, StateOp::Incr(1), tag(clk(base, 9), 0))?;
    let ts = read(&mut r)?;
    ensure(ts_has(&ts, i1, clk(base, 5)) && ts_has(&ts, i2, clk(base, 9)), || {
        format!("TS should hold (i1, {}), (i2, {}); got {ts:?}", clk(base, 5), clk(base, 9))
    })?;
    c1.state(k, StateOp::Incr(1), None)?;
    let ts = read(&mut r)?;
    ensure(ts_has(&ts, i1, clk(base, 5)), || format!("an untagged update changed i1's TS entry: {ts:?}"))?;
    c1.state(k, StateOp::Incr(1), tag(clk(base, 12), 0))?;
    let ts = read(&mut r)?;
    ensure(ts_has(&ts, i1, clk(base, 12)) && ts_has(&ts, i2, clk(base, 9)), || {
        format!("after i1's update at {}, TS should hold it and (i2, {}): {ts:?}", clk(base, 12), clk(base, 9))
    })
}

// ---------------------------------------------------------------------------------------------
// 10. Client modes agree
// ---------------------------------------------------------------------------------------------

/// One step of a script every state handle runs.
#[derive(Debug, Clone)]
enum Step {
    /// `end_batch` then `begin_batch`.
    Batch,
    /// `end_packet`, then `begin_packet` with the next clock.
    Packet,
    /// A blocking operation; its result is compared.
    Exec(u16, usize, StateOp),
    /// A non-blocking update.
    ExecNb(u16, usize, StateOp),
    /// `set_exclusive`.
    Exclusive(u16, bool),
}

const OBJECTS: u16 = 4;
const KEYS: usize = 4;

fn mode_decls() -> [StateDecl; OBJECTS as usize] {
    [
        StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften),
        StateDecl::new("map", Scope::global(), AccessPattern::ReadHeavy),
        StateDecl::new("pool", Scope::global(), AccessPattern::ReadWriteOften),
        StateDecl::new("counters", Scope::global(), AccessPattern::WriteMostly),
    ]
}

fn script(seed: u64, steps: usize) -> Vec<Step> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    if seed % 2 == 1 {
        // Exclusive from the start (the single-instance vertex).
        out.push(Step::Exclusive(1, true));
        out.push(Step::Exclusive(2, true));
    }
    out.push(Step::Packet);
    for _ in 0..steps {
        let r = rng.below(100);
        if r < 8 {
            out.push(Step::Batch);
            if rng.chance(25) {
                out.push(Step::Exclusive(1 + rng.below(2) as u16, rng.chance(50)));
            }
            out.push(Step::Packet);
            continue;
        }
        if r < 30 {
            out.push(Step::Packet);
        }
        let obj = rng.below(u64::from(OBJECTS)) as u16;
        let key = rng.below(KEYS as u64) as usize;
        if obj == 3 {
            // Write-mostly: counters at keys 0-1, lists at keys 2-3, so that non-blocking
            // updates never fail (a failure is reported by LocalState, not by an async client).
            let counter = key < 2;
            out.push(match (counter, rng.below(10)) {
                (true, 0..=6) => Step::ExecNb(obj, key, StateOp::Incr(rng.range(-2, 5))),
                (true, _) => Step::Exec(obj, key, StateOp::Get),
                (false, 0..=5) => Step::ExecNb(obj, key, StateOp::Push(Value::Int(rng.range(0, 99)))),
                (false, 6..=7) => Step::Exec(obj, key, StateOp::Pop),
                (false, _) => Step::Exec(obj, key, StateOp::Get),
            });
        } else if rng.chance(15) {
            let op = if rng.chance(75) { StateOp::Set(small_value(&mut rng)) } else { StateOp::Delete };
            out.push(Step::ExecNb(obj, key, op));
        } else {
            out.push(Step::Exec(obj, key, random_op(&mut rng)));
        }
    }
    out.push(Step::Batch);
    out
}

type Outcome = Result<Option<Value>, String>;

fn run_script(h: &mut dyn StateHandle, script: &[Step], keys: &[StateKey], base: u64) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut packet = 0u64;
    let mut m = meta(clk(base, 0));
    h.begin_batch();
    for s in script {
        match s {
            Step::Batch => {
                h.end_batch();
                h.begin_batch();
            }
            Step::Packet => {
                h.end_packet(&mut m);
                packet += 1;
                m = meta(clk(base, packet));
                h.begin_packet(&m);
            }
            Step::Exec(o, k, op) => {
                let key = keys.get(*k).copied().unwrap_or(StateKey::Unit);
                out.push(h.exec(ObjectId(*o), &key, op.clone()).map_err(|e| e.to_string()));
            }
            Step::ExecNb(o, k, op) => {
                let key = keys.get(*k).copied().unwrap_or(StateKey::Unit);
                out.push(h.exec_nb(ObjectId(*o), &key, op.clone()).map(|_| None).map_err(|e| e.to_string()));
            }
            Step::Exclusive(o, e) => h.set_exclusive(ObjectId(*o), *e),
        }
    }
    h.end_packet(&mut m);
    h.end_batch();
    out
}

/// The same seeded script of operations (blocking and non-blocking, on a per-flow, a read-heavy
/// shared, a read/write-often shared and a write-mostly object, with exclusivity switched on and
/// off) through [`StoreClient`]s in External, Cached and Async mode (vertices `vertex`,
/// `vertex + 1`, `vertex + 2`) and through [`LocalState`]: every operation's result agrees
/// (equal values, or all fail), and after `flush()` the values read back through each handle,
/// and straight from the store, agree.
pub fn client_modes_agree_seed(b: &dyn Backend, vertex: u16, seed: u64, steps: usize) -> Result<(), String> {
    let base = fresh_base();
    let decls = mode_decls();
    let keys: Vec<StateKey> = (0..KEYS as u64).map(|k| StateKey::Id(base + k)).collect();
    let s = script(seed, steps);
    let mut local = LocalState::new(&decls, &CUSTOM_OPS);
    let want = run_script(&mut local, &s, &keys, base);
    let modes = [Mode::External, Mode::Cached, Mode::Async];
    let mut clients = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        let v = vertex + i as u16;
        b.register_custom_ops(v, &CUSTOM_OPS).map_err(|e| format!("register_custom_ops: {e}"))?;
        let id = InstanceId::new(v, 0);
        let conn = b.connect(id).map_err(|e| format!("connect: {e}"))?;
        let mut c = StoreClient::new(conn, id, v, &decls, &CUSTOM_OPS, ClientConfig { mode, ..Default::default() });
        let got = run_script(&mut c, &s, &keys, base);
        let ops: Vec<&Step> = s.iter().filter(|x| matches!(x, Step::Exec(..) | Step::ExecNb(..))).collect();
        for (n, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = match (g, w) {
                (Ok(a), Ok(b)) => a == b,
                (Err(_), Err(_)) => true,
                _ => false,
            };
            ensure(same, || {
                format!(
                    "seed {seed}: operation {n} ({:?}): {mode:?} client returned {g:?}, LocalState {w:?}",
                    ops.get(n)
                )
            })?;
        }
        ensure(got.len() == want.len(), || format!("{mode:?}: {} results, LocalState {}", got.len(), want.len()))?;
        c.flush().map_err(|e| format!("seed {seed}: {mode:?}: flush: {e}"))?;
        clients.push((mode, v, c));
    }
    let mut reader = Raw::open(b, InstanceId::new(vertex, 99))?;
    for o in 0..OBJECTS {
        for k in &keys {
            let w = local.get(ObjectId(o), k).map_err(|e| e.to_string())?;
            for (mode, v, c) in &mut clients {
                let g = c.get(ObjectId(o), k).map_err(|e| format!("{mode:?}: final get: {e}"))?;
                ensure(g == w, || {
                    format!("seed {seed}: object {o} key {k:?}: {mode:?} client reads {g:?}, LocalState {w:?}")
                })?;
                let st = reader.get(skey(*v, o, *k))?;
                ensure(st == w, || {
                    format!("seed {seed}: object {o} key {k:?}: after flush the store holds {st:?} for the {mode:?} client, LocalState {w:?}")
                })?;
            }
        }
    }
    Ok(())
}

/// [`client_modes_agree_seed`] for three seeds.
pub fn client_modes_agree(b: &dyn Backend) -> Result<(), String> {
    for seed in 1..=3 {
        client_modes_agree_seed(b, 1014, seed, 300)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 11. Timers in checkpoints, wiping, tagged reads (store-instance failover)
// ---------------------------------------------------------------------------------------------

/// The `TimerFired` notifications `c` has received about `k`.
fn fired_count(c: &Raw, k: StoreKey) -> usize {
    c.notes.iter().filter(|n| **n == Notification::TimerFired { key: k }).count()
}

/// A checkpoint lists every armed timer, sorted, with its deadline and the instance that would
/// be told (the owner of a claimed key, else the armer); cancelled timers are absent and a
/// re-armed one appears once, at its last deadline. `restore` re-arms exactly the checkpoint's
/// timers (a timer armed after the checkpoint is gone), and they fire to those instances.
/// Replaces the whole store: see [`EXCLUSIVE`].
pub fn checkpoint_timers(b: &dyn Backend) -> Result<(), String> {
    let v = 1018;
    let base = fresh_base();
    // Packet times about now in ns and unique per run, above any an earlier check used.
    let t0 = base.saturating_mul(64);
    let k = |n: u64| skey(v, 0, StateKey::Id(base + n));
    let (ia, ib) = (InstanceId::new(v, 0), InstanceId::new(v, 1));
    let mut a = Raw::open(b, ia)?;
    let mut bb = Raw::open(b, ib)?;
    a.ok(k(1), StoreOp::SetTimer { deadline_ns: t0 + 100 }, None)?;
    bb.state(k(2), StateOp::Set(Value::Int(5)), None)?;
    bb.ok(k(2), StoreOp::SetTimer { deadline_ns: t0 + 200 }, None)?;
    let claimed = a.ok(k(3), StoreOp::Claim, None)?;
    ensure(claimed == Some(Value::Int(1)), || format!("Claim: {claimed:?}"))?;
    bb.ok(k(3), StoreOp::SetTimer { deadline_ns: t0 + 300 }, None)?;
    a.ok(k(4), StoreOp::SetTimer { deadline_ns: t0 + 150 }, None)?;
    a.ok(k(4), StoreOp::CancelTimer, None)?;
    a.ok(k(5), StoreOp::SetTimer { deadline_ns: t0 + 50 }, None)?;
    a.ok(k(5), StoreOp::SetTimer { deadline_ns: t0 + 400 }, None)?;
    let want = vec![(k(1), t0 + 100, ia), (k(2), t0 + 200, ib), (k(3), t0 + 300, ia), (k(5), t0 + 400, ia)];
    let mine = |timers: &[(StoreKey, u64, InstanceId)]| -> Vec<(StoreKey, u64, InstanceId)> {
        timers.iter().filter(|t| t.0.vertex == v).copied().collect()
    };
    let cp = b.checkpoint().map_err(|e| format!("checkpoint: {e}"))?;
    ensure(cp.timers.windows(2).all(|w| w[0] <= w[1]), || format!("checkpoint timers not sorted: {:?}", cp.timers))?;
    ensure(mine(&cp.timers) == want, || format!("checkpoint timers {:?}, want {want:?}", mine(&cp.timers)))?;
    let value = cp.values.iter().find(|(x, _)| *x == k(2)).map(|(_, v)| v.clone());
    ensure(value == Some(Value::Int(5)), || format!("checkpoint holds {value:?} for {:?}, want Int(5)", k(2)))?;

    // Change the timers, then restore: the checkpoint's come back, the later one is gone.
    a.ok(k(1), StoreOp::CancelTimer, None)?;
    a.ok(k(6), StoreOp::SetTimer { deadline_ns: t0 + 120 }, None)?;
    b.restore(&cp).map_err(|e| format!("restore: {e}"))?;
    let again = b.checkpoint().map_err(|e| format!("checkpoint after restore: {e}"))?;
    ensure(mine(&again.timers) == want, || {
        format!("after restore the store's timers are {:?}, want the checkpoint's {want:?}", mine(&again.timers))
    })?;
    a.advance(k(1), t0 + 1000)?;
    for key in [k(1), k(3), k(5)] {
        a.wait_note("TimerFired of a restored timer", |n| *n == Notification::TimerFired { key })?;
    }
    bb.wait_note("TimerFired of B's restored timer", |n| *n == Notification::TimerFired { key: k(2) })?;
    // The advance was acknowledged after every firing it caused was queued: anything else
    // would have arrived by now.
    a.poll_notes()?;
    bb.poll_notes()?;
    ensure(fired_count(&a, k(4)) + fired_count(&a, k(6)) == 0, || {
        format!("a cancelled timer or one armed after the checkpoint fired after restore: {:?}", a.notes)
    })?;
    ensure(fired_count(&bb, k(3)) == 0 && fired_count(&a, k(2)) == 0, || {
        format!("a restored timer went to the wrong instance: A {:?}, B {:?}", a.notes, bb.notes)
    })?;
    for key in [k(1), k(3), k(5)] {
        ensure(fired_count(&a, key) == 1, || format!("{key:?} fired {} times, want once", fired_count(&a, key)))?;
    }
    Ok(())
}

/// After `wipe` the store is a fresh, empty one: a new connection's batches are numbered from
/// 1; values are absent and a Get's TS vector is empty; a tag applied before is applied again
/// (the per-clock log is gone); a claimed key can be claimed by another instance; subscribers
/// are not called back; timers do not fire; the packet time starts again from 0 (a timer at a
/// small deadline fires). Custom operations work once registered again. Empties the whole
/// store: see [`EXCLUSIVE`].
pub fn wipe_empties_store(b: &dyn Backend) -> Result<(), String> {
    let v = 1019;
    let base = fresh_base();
    let t0 = base.saturating_mul(64);
    let k = |n: u64| skey(v, 0, StateKey::Id(base + n));
    let (ia, ib, ic) = (InstanceId::new(v, 0), InstanceId::new(v, 1), InstanceId::new(v, 2));
    let t1 = tag(clk(base, 1), 0);
    {
        let mut a = Raw::open(b, ia)?;
        let mut bb = Raw::open(b, ib)?;
        b.register_custom_ops(v, &CUSTOM_OPS).map_err(|e| format!("register_custom_ops: {e}"))?;
        a.state(k(1), StateOp::Set(Value::Int(5)), t1)?;
        let claimed = a.ok(k(2), StoreOp::Claim, None)?;
        ensure(claimed == Some(Value::Int(1)), || format!("Claim: {claimed:?}"))?;
        bb.ok(k(3), StoreOp::Subscribe, None)?;
        a.ok(k(4), StoreOp::SetTimer { deadline_ns: t0 + 100 }, None)?;
        a.advance(k(4), t0 + 50)?;
        a.state(k(7), StateOp::Set(Value::Ints(vec![3, 1])), None)?;
    }
    b.wipe().map_err(|e| format!("wipe: {e}"))?;
    b.register_custom_ops(v, &CUSTOM_OPS).map_err(|e| format!("register_custom_ops after wipe: {e}"))?;

    // New connections: numbered from 1 (Raw starts there), acknowledged.
    let mut a = Raw::open(b, ia)?;
    let mut bb = Raw::open(b, ib)?;
    let mut c = Raw::open(b, ic)?;
    let r = a.req(k(1), StoreOp::State(StateOp::Get), None, true);
    let id = r.id;
    let first = a.send(vec![r])?;
    ensure(first == 1, || format!("the first batch of a new connection is {first}, want 1"))?;
    a.wait_ack(first)?;
    let resp = a.response(id)?;
    ensure(resp.result == Ok(None), || format!("after wipe {:?} holds {:?}, want nothing", k(1), resp.result))?;
    let ts = resp.ts.ok_or_else(|| "a Get of a shared value after wipe returned no TS vector".to_string())?;
    ensure(ts.is_empty(), || format!("after wipe the TS vector should be empty, got {ts:?}"))?;
    for key in [k(2), k(3), k(4), k(7)] {
        let got = a.get(key)?;
        ensure(got.is_none(), || format!("after wipe {key:?} holds {got:?}"))?;
    }
    let r = a.call(k(1), StoreOp::State(StateOp::Set(Value::Int(7))), t1)?;
    ensure(!r.replayed && r.result.is_ok(), || format!("a tag applied before the wipe was treated as logged: {r:?}"))?;
    let got = a.get(k(1))?;
    ensure(got == Some(Value::Int(7)), || format!("after re-applying the tag {:?} holds {got:?}, want 7", k(1)))?;
    let claimed = c.ok(k(2), StoreOp::Claim, None)?;
    ensure(claimed == Some(Value::Int(1)), || format!("after wipe another instance's Claim got {claimed:?}, want 1"))?;

    // Subscribers are gone: B hears about k5 (subscribed after the wipe), not about k3.
    bb.ok(k(5), StoreOp::Subscribe, None)?;
    c.state(k(3), StateOp::Set(Value::Int(1)), None)?;
    c.state(k(5), StateOp::Set(Value::Int(1)), None)?;
    bb.wait_note("the callback for a subscription made after the wipe", |n| *n == changed(k(5), Some(Value::Int(1))))?;
    ensure(bb.notes_about(k(3)).is_empty(), || {
        format!("a subscription from before the wipe survived: {:?}", bb.notes)
    })?;

    // Packet time restarted: a timer at a small deadline fires once time passes it.
    a.ok(k(6), StoreOp::SetTimer { deadline_ns: 100 }, None)?;
    a.advance(k(6), 150)?;
    a.wait_note("TimerFired at a small deadline (packet time reset by the wipe)", |n| {
        *n == Notification::TimerFired { key: k(6) }
    })?;
    // The timer armed before the wipe is gone.
    a.advance(k(6), t0 + 200)?;
    a.poll_notes()?;
    ensure(fired_count(&a, k(4)) == 0, || format!("a timer armed before the wipe fired: {:?}", a.notes))?;

    // Custom operations, registered again, work.
    a.state(k(8), StateOp::Set(Value::Ints(vec![3, 1])), None)?;
    let r = a.state(k(8), StateOp::Custom { op: 0, arg: Value::Int(5) }, None)?;
    ensure(r == Some(Value::Int(1)), || format!("least_loaded_incr after wipe: {r:?}, want index 1"))?;
    Ok(())
}

/// A tagged Get consults the per-clock log (a tag logged by an update returns its logged
/// result, marked replayed) but is itself neither logged nor counted in the TS vector: a later
/// update with the same tag applies, and the reader's TS entry stays at its last update.
pub fn tagged_reads_not_logged(b: &dyn Backend) -> Result<(), String> {
    let v = 1020;
    let base = fresh_base();
    let k = skey(v, 0, StateKey::Id(base));
    let ia = InstanceId::new(v, 0);
    let mut a = Raw::open(b, ia)?;
    let mut r = Raw::open(b, InstanceId::new(v, 1))?;
    let (t1, t2, t3) = (tag(clk(base, 1), 0), tag(clk(base, 5), 0), tag(clk(base, 9), 0));
    a.state(k, StateOp::Incr(1), t1)?;
    let got = a.call(k, StoreOp::State(StateOp::Get), t2)?;
    ensure(!got.replayed && got.result == Ok(Some(Value::Int(1))), || format!("a tagged Get of a new tag: {got:?}"))?;
    let plain = r.call(k, StoreOp::State(StateOp::Get), None)?;
    let ts = plain.ts.ok_or_else(|| format!("a Get of a shared value returned no TS vector: {:?}", plain.result))?;
    ensure(ts_has(&ts, ia, clk(base, 1)), || {
        format!("a tagged Get moved the TS vector: want (a, {}), got {ts:?}", clk(base, 1))
    })?;
    let upd = a.call(k, StoreOp::State(StateOp::Incr(10)), t2)?;
    ensure(!upd.replayed && upd.result == Ok(Some(Value::Int(11))), || {
        format!("an update with the tag of an earlier Get must apply (11, not replayed): {upd:?}")
    })?;
    let again = a.call(k, StoreOp::State(StateOp::Get), t1)?;
    ensure(again.replayed && again.result == Ok(Some(Value::Int(1))), || {
        format!("a tagged Get of a logged tag must return the logged result (1, replayed): {again:?}")
    })?;
    let fresh = a.call(k, StoreOp::State(StateOp::Get), t3)?;
    ensure(!fresh.replayed && fresh.result == Ok(Some(Value::Int(11))), || {
        format!("a tagged Get of an unlogged tag must read the value (11): {fresh:?}")
    })?;
    let upd = a.call(k, StoreOp::State(StateOp::Incr(100)), t3)?;
    ensure(!upd.replayed && upd.result == Ok(Some(Value::Int(111))), || {
        format!("the Get's tag must not be logged: a later update with it gave {upd:?}")
    })
}

/// CHC's test case 11: a straggler and its clone (two instances of one vertex) drawing a
/// non-deterministic value for the same packet get the value drawn first; another packet, or
/// the next draw for the same packet, gets its own; a replay of the packet at a third instance
/// gets the first values again.
pub fn recorded_values_repeat(b: &dyn Backend) -> Result<(), String> {
    let v = 1021;
    let base = fresh_base();
    let decls = [StateDecl::new("x", Scope::global(), AccessPattern::ReadHeavy)];
    let cfg =
        ClientConfig { mode: Mode::Async, write_through: true, record_nondeterminism: true, ..Default::default() };
    let mk = |i: u16| -> Result<StoreClient, String> {
        let id = InstanceId::new(v, i);
        let conn = b.connect(id).map_err(|e| format!("connect: {e}"))?;
        Ok(StoreClient::new(conn, id, v, &decls, &[], cfg.clone()))
    };
    let (mut straggler, mut clone, mut replacement) = (mk(0)?, mk(1)?, mk(2)?);
    // Draws `fresh` values (in order) while processing packet `n`; returns what the store says.
    let draw = |c: &mut StoreClient, n: u64, fresh: &[Value]| -> Result<Vec<Value>, String> {
        c.begin_batch();
        let mut m = meta(clk(base, n));
        c.begin_packet(&m);
        let got: Result<Vec<Value>, StateError> = fresh.iter().map(|f| c.record(f.clone())).collect();
        c.end_packet(&mut m);
        c.end_batch();
        got.map_err(|e| e.to_string())
    };
    let wall = Value::Int(1_700_000_000_123_456_789);
    let first = draw(&mut straggler, 1, &[Value::Int(7), wall.clone()])?;
    ensure(first == vec![Value::Int(7), wall.clone()], || format!("first draws come back as drawn: {first:?}"))?;
    let twin = draw(&mut clone, 1, &[Value::Int(8), Value::Int(99)])?;
    ensure(twin == first, || format!("the clone's draws for the same packet: {twin:?}, want {first:?}"))?;
    let other = draw(&mut clone, 2, &[Value::Int(9)])?;
    ensure(other == vec![Value::Int(9)], || format!("another packet draws its own value: {other:?}"))?;
    // The same clock again, as a replay at a third instance.
    let mut m = meta(clk(base, 1));
    m.flags.insert(sluice_packet::MetaFlags::REPLAYED);
    replacement.begin_batch();
    replacement.begin_packet(&m);
    let again: Result<Vec<Value>, StateError> =
        [Value::Int(10), Value::Int(11)].into_iter().map(|f| replacement.record(f)).collect();
    replacement.end_packet(&mut m);
    replacement.end_batch();
    let again = again.map_err(|e| e.to_string())?;
    ensure(again == first, || format!("a replay draws the first values: {again:?}, want {first:?}"))?;
    // With recording off (the switch `sluice verify --off nondet` turns), a replay draws anew:
    // what the recording prevents.
    let id = InstanceId::new(v, 3);
    let conn = b.connect(id).map_err(|e| format!("connect: {e}"))?;
    let mut unrecorded =
        StoreClient::new(conn, id, v, &decls, &[], ClientConfig { record_nondeterminism: false, ..cfg.clone() });
    let mut m = meta(clk(base, 1));
    m.flags.insert(sluice_packet::MetaFlags::REPLAYED);
    unrecorded.begin_batch();
    unrecorded.begin_packet(&m);
    let fresh = unrecorded.record(Value::Int(12)).map_err(|e| e.to_string())?;
    unrecorded.end_packet(&mut m);
    unrecorded.end_batch();
    ensure(fresh == Value::Int(12), || format!("without recording the draw is fresh: {fresh:?}"))?;
    // The local backend never replays: every draw is fresh.
    let mut local = LocalState::new(&decls, &[]);
    let fresh = local.record(Value::Int(5)).map_err(|e| e.to_string())?;
    ensure(fresh == Value::Int(5), || format!("local state returns the draw: {fresh:?}"))?;
    Ok(())
}
