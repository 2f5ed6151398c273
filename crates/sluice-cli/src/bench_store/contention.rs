//! Part 2: offloaded operations vs lock–read–modify–write. Two NAT-like threads allocate ports
//! from one shared pool and count them in one shared counter: offloaded (`Pop` on the pool,
//! `Incr` on the counter) or under a lock (`CompareAndSet` lock, read both, modify, write both,
//! `Delete` lock), the StatelessNF/OpenNF way.

use super::store::{clear_redis, Env, RawClient};
use crate::bench::common::{ratio, repeat_interleaved, Stat};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use sluice_packet::InstanceId;
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, StoreKey};
use std::collections::VecDeque;
use std::time::Instant;

/// Ports in the shared pool of the offload/lock comparison (refilled when empty).
const POOL: i64 = 64;

/// Statistics of one side of the offload/lock comparison.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ContentionSample {
    /// Operations (port allocations) by both threads.
    ops: u64,
    wall_s: f64,
    pub(super) ops_per_s: f64,
    pub(super) p50_us: f64,
    p95_us: f64,
    p99_us: f64,
    /// Store requests per operation (lock retries included).
    requests_per_op: f64,
    /// Failed lock attempts per operation.
    lock_retries_per_op: f64,
}

/// One backend's offload/lock comparison.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ContentionResult {
    pub(super) store: String,
    offload: Vec<ContentionSample>,
    lock_rmw: Vec<ContentionSample>,
    pub(super) offload_ops_per_s: Stat,
    pub(super) lock_rmw_ops_per_s: Stat,
    pub(super) offload_p50_us: Stat,
    pub(super) offload_p95_us: Stat,
    pub(super) lock_rmw_p50_us: Stat,
    pub(super) lock_rmw_p95_us: Stat,
    /// Median offload ops/s / median lock-RMW ops/s.
    pub(super) throughput_ratio: f64,
    /// Median lock-RMW p50 / median offload p50.
    pub(super) latency_ratio: f64,
}

/// Both sides, `ops` allocations per thread, on the embedded store and (if it runs) Redis,
/// `repeat` times interleaved.
pub(super) fn run_contention(env: &Env, repeat: usize, ops: usize) -> Result<Vec<ContentionResult>> {
    let mut stores: Vec<&str> = vec!["embedded"];
    if env.redis.is_some() {
        stores.push("redis");
    }
    let measure = |s: &&str| -> Result<(ContentionSample, ContentionSample)> {
        let o = contend(env, s, ops, false).with_context(|| format!("offload, {s}"))?;
        let l = contend(env, s, ops, true).with_context(|| format!("lock-RMW, {s}"))?;
        Ok((o, l))
    };
    let samples = repeat_interleaved(&stores, repeat, false, measure, |r, s, (o, l)| {
        eprintln!(
            "[contention {}/{}] {:<9} offload {:>9.0} ops/s p50 {:>6.1} µs | lock-RMW {:>9.0} ops/s p50 {:>6.1} µs",
            r, repeat, s, o.ops_per_s, o.p50_us, l.ops_per_s, l.p50_us
        )
    })?;
    let mut results = Vec::new();
    for (s, pairs) in stores.iter().zip(samples) {
        let (o, l): (Vec<ContentionSample>, Vec<ContentionSample>) = pairs.into_iter().unzip();
        let st = |v: &[ContentionSample], f: fn(&ContentionSample) -> f64| Stat::of(v.iter().map(f));
        let (oo, lo) = (st(&o, |x| x.ops_per_s), st(&l, |x| x.ops_per_s));
        let (op50, lp50) = (st(&o, |x| x.p50_us), st(&l, |x| x.p50_us));
        results.push(ContentionResult {
            store: s.to_string(),
            offload_ops_per_s: oo,
            lock_rmw_ops_per_s: lo,
            offload_p50_us: op50,
            offload_p95_us: st(&o, |x| x.p95_us),
            lock_rmw_p50_us: lp50,
            lock_rmw_p95_us: st(&l, |x| x.p95_us),
            throughput_ratio: ratio(oo.median, lo.median),
            latency_ratio: ratio(lp50.median, op50.median),
            offload: o,
            lock_rmw: l,
        });
    }
    Ok(results)
}

/// The keys both threads share (vertex 7).
#[derive(Clone, Copy)]
struct SharedKeys {
    /// The free ports, a list.
    pool: StoreKey,
    /// Ports handed out so far.
    counter: StoreKey,
    /// The lock of the lock-RMW side: absent when free, else the holder.
    lock: StoreKey,
}

impl SharedKeys {
    fn new() -> SharedKeys {
        let key = |object: u16| StoreKey { vertex: 7, object, key: StateKey::Unit };
        SharedKeys { pool: key(0), counter: key(1), lock: key(2) }
    }
}

/// A full pool of ports.
fn full_pool() -> VecDeque<Value> {
    (1..=POOL).map(|p| Value::Int(1024 + p)).collect()
}

/// What one thread did: the latency of each allocation (ns), the store requests it sent and
/// its failed lock attempts.
#[derive(Default)]
struct ThreadLog {
    latencies_ns: Vec<u64>,
    requests: u64,
    retries: u64,
}

/// Two NAT-like threads allocating ports from one shared pool: offloaded (`Pop` + `Incr`) or
/// under a lock (`CompareAndSet` lock, read, modify, write, `Delete` lock).
fn contend(env: &Env, store: &str, ops: usize, lock: bool) -> Result<ContentionSample> {
    let store = env.store(store.starts_with("redis"), 1)?;
    let backend = store.backend.as_ref();
    let keys = SharedKeys::new();
    RawClient::open(backend, InstanceId::new(7, 99))?
        .call(vec![(keys.pool, StateOp::Set(Value::List(full_pool()))), (keys.counter, StateOp::Set(Value::Int(0)))])?;
    let threads = 2u16;
    let t0 = Instant::now();
    let results: Vec<Result<ThreadLog>> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..threads).map(|t| s.spawn(move || allocate_ports(backend, t, keys, ops, lock))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a thread panicked")))).collect()
    });
    let wall_s = t0.elapsed().as_secs_f64();
    // Check that no allocation was lost: the counter equals the operations.
    let count = RawClient::open(backend, InstanceId::new(7, 98))?.call(vec![(keys.counter, StateOp::Get)])?;
    clear_redis(store.redis.as_deref())?;
    let counted = count.first().cloned().flatten().and_then(|v| v.as_int()).unwrap_or(-1);
    contention_sample(results, counted, wall_s)
}

/// Thread `t`'s `ops` allocations, each timed.
fn allocate_ports(backend: &dyn Backend, t: u16, keys: SharedKeys, ops: usize, lock: bool) -> Result<ThreadLog> {
    let mut client = RawClient::open(backend, InstanceId::new(7, t))?;
    let mut log = ThreadLog { latencies_ns: Vec::with_capacity(ops), ..ThreadLog::default() };
    let owner = Value::Int(100 + i64::from(t));
    for _ in 0..ops {
        let start = Instant::now();
        if lock {
            allocate_under_lock(&mut client, keys, &owner, &mut log)?;
        } else {
            allocate_offloaded(&mut client, keys, &mut log)?;
        }
        log.latencies_ns.push(start.elapsed().as_nanos() as u64);
    }
    Ok(log)
}

/// One allocation the lock-RMW way: spin on the lock, read pool and counter, take a port and
/// count it locally, write both back, release the lock.
fn allocate_under_lock(client: &mut RawClient, keys: SharedKeys, owner: &Value, log: &mut ThreadLog) -> Result<()> {
    loop {
        let cas = StateOp::CompareAndSet { expect: None, new: owner.clone() };
        log.requests += 1;
        let r = client.call(vec![(keys.lock, cas)])?;
        if r.first().cloned().flatten() == Some(Value::Int(1)) {
            break;
        }
        log.retries += 1;
        std::hint::spin_loop();
    }
    let r = client.call(vec![(keys.pool, StateOp::Get), (keys.counter, StateOp::Get)])?;
    log.requests += 2;
    let mut pool = match r.first().cloned().flatten() {
        Some(Value::List(l)) if !l.is_empty() => l,
        _ => full_pool(),
    };
    let _port = pool.pop_front();
    let count = r.get(1).cloned().flatten().and_then(|v| v.as_int()).unwrap_or(0) + 1;
    client.call(vec![(keys.pool, StateOp::Set(Value::List(pool))), (keys.counter, StateOp::Set(Value::Int(count)))])?;
    log.requests += 2;
    client.call(vec![(keys.lock, StateOp::Delete)])?;
    log.requests += 1;
    Ok(())
}

/// One allocation the offloaded way: `Pop` a port (refilling an empty pool), `Incr` the counter.
fn allocate_offloaded(client: &mut RawClient, keys: SharedKeys, log: &mut ThreadLog) -> Result<()> {
    let r = client.call(vec![(keys.pool, StateOp::Pop)])?;
    log.requests += 1;
    if r.first().cloned().flatten().is_none() {
        // Empty pool: refill it (one request of POOL pushes).
        let refill = (1..=POOL).map(|p| (keys.pool, StateOp::Push(Value::Int(1024 + p))));
        client.call(refill.collect())?;
        log.requests += POOL as u64;
        client.call(vec![(keys.pool, StateOp::Pop)])?;
        log.requests += 1;
    }
    client.call(vec![(keys.counter, StateOp::Incr(1))])?;
    log.requests += 1;
    Ok(())
}

/// The sample of one measurement, once the shared counter (`counted`, -1 if unreadable) is
/// checked against the allocations the threads made.
fn contention_sample(results: Vec<Result<ThreadLog>>, counted: i64, wall_s: f64) -> Result<ContentionSample> {
    let mut lat = Vec::new();
    let (mut requests, mut retries) = (0u64, 0u64);
    for r in results {
        let log = r?;
        lat.extend(log.latencies_ns);
        requests += log.requests;
        retries += log.retries;
    }
    let total = lat.len() as u64;
    if counted != total as i64 {
        bail!("the shared counter is {counted} after {total} allocations: updates were lost");
    }
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |n| *n as f64 / 1e3);
    Ok(ContentionSample {
        ops: total,
        wall_s,
        ops_per_s: ratio(total as f64, wall_s),
        p50_us: pct(0.5),
        p95_us: pct(0.95),
        p99_us: pct(0.99),
        requests_per_op: ratio(requests as f64, total as f64),
        lock_retries_per_op: ratio(retries as f64, total as f64),
    })
}
