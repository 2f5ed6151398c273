//! What the checks share: unique keys and clocks per run, a seeded generator, the custom
//! operation the suite registers, and small constructors and comparisons.

use super::raw::Raw;
use crate::backend::Backend;
use crate::client::{ClientConfig, StoreClient};
use crate::wire::{Notification, OpTag, StoreKey};
use sluice_packet::{Clock, InstanceId, Meta};
use sluice_state::{CustomOp, StateDecl, StateError, StateKey, StateOp, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// `Ok` if `cond` holds, else the error `msg` describes (built only then).
pub(super) fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// The store key of `key` in `object` of `vertex`.
pub(super) fn skey(vertex: u16, object: u16, key: StateKey) -> StoreKey {
    StoreKey { vertex, object, key }
}

/// The tag of update `seq` of the packet with `clock`.
pub(super) fn tag(clock: Clock, seq: u32) -> Option<OpTag> {
    Some(OpTag { clock, seq })
}

/// A clock of root 1 (every check but [`forget_clock_reapplies`](super::forget_clock_reapplies)).
pub(super) fn clk(base: u64, n: u64) -> Clock {
    Clock::new(1, base + n)
}

/// Packet metadata with `clock` and nothing else.
pub(super) fn meta(clock: Clock) -> Meta {
    Meta { clock, ..Meta::default() }
}

/// The key a notification is about.
pub(super) fn note_key(n: &Notification) -> StoreKey {
    match n {
        Notification::Changed { key, .. } | Notification::TimerFired { key } | Notification::Handover { key } => *key,
    }
}

/// The notification that `key` now holds `value`.
pub(super) fn changed(key: StoreKey, value: Option<Value>) -> Notification {
    Notification::Changed { key, value }
}

/// Whether two results of one operation agree (a store's and the model's, or two handles'):
/// equal values, or both failures, whatever the errors say.
pub(super) fn same_result<E, F>(a: &Result<Option<Value>, E>, b: &Result<Option<Value>, F>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(_), Err(_)) => true,
        _ => false,
    }
}

/// A random value of any type, small enough that random operations on it often collide.
pub(super) fn small_value(rng: &mut Rng) -> Value {
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
pub(super) fn random_op(rng: &mut Rng) -> StateOp {
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

pub(super) fn ts_has(ts: &[(InstanceId, Clock)], who: InstanceId, clock: Clock) -> bool {
    ts.iter().any(|(i, c)| *i == who && *c == clock)
}

/// The notification that the timer on `key` fired.
pub(super) fn timer_fired(key: StoreKey) -> Notification {
    Notification::TimerFired { key }
}

/// The `TimerFired` notifications `c` has received about `k`.
pub(super) fn fired_count(c: &Raw, k: StoreKey) -> usize {
    c.notes.iter().filter(|n| **n == timer_fired(k)).count()
}

/// A packet time (ns) for a check's timers: about now, unique per run and above any an earlier
/// check used, with room for offsets below `BASE_STRIDE * 64` (`base` is the check's
/// [`fresh_base`], in units of 64 ns).
pub(super) fn packet_time_base(base: u64) -> u64 {
    base.saturating_mul(64)
}

/// A [`StoreClient`] for instance `id` (of vertex `id.vertex()`) on a new connection.
pub(super) fn open_client(
    b: &dyn Backend,
    id: InstanceId,
    decls: &[StateDecl],
    custom: &[CustomOp],
    config: ClientConfig,
) -> Result<StoreClient, String> {
    let conn = b.connect(id).map_err(|e| format!("connect: {e}"))?;
    Ok(StoreClient::new(conn, id, id.vertex(), decls, custom, config))
}
