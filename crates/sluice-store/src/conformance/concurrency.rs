//! Checks of ordering: concurrent operations on one value are serialised (no port popped twice,
//! no increment lost), and non-blocking updates apply in issue order before a later read.

use super::raw::Raw;
use super::support::{clk, ensure, fresh_base, meta, open_client, skey, tag, Rng};
use crate::backend::Backend;
use crate::client::{ClientConfig, Mode};
use crate::wire::{Request, StoreOp};
use sluice_packet::InstanceId;
use sluice_state::{AccessPattern, ObjectId, Scope, StateDecl, StateHandle, StateKey, StateOp, Value};
use std::collections::HashMap;

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

/// Non-blocking updates are applied in issue order before a later read: through a raw
/// connection (many non-`reply` batches of pushes, not waited for, then a Get: the exact list),
/// and through a [`StoreClient`] in [`Mode::Async`] (`incr_nb`/`push_nb` on write-mostly objects
/// over many packets and batches, then `get` sees all of them, the list in exact order, with
/// only the reads as round trips).
///
/// [`StoreClient`]: crate::client::StoreClient
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
    let config = ClientConfig { mode: Mode::Async, ..Default::default() };
    let mut cl = open_client(b, InstanceId::new(v, 0), &decls, &[], config)?;
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
    ensure(s.async_errors == 0, || format!("{} non-blocking updates failed", s.async_errors))?;
    untagged_increments_summed(b, v, base + 3)
}

/// Without exactly-once tags (`ClientConfig::dedupe` off, a run in which nothing is processed
/// twice) a counter's increments of a batch travel as one: same values, one request per
/// counter per batch, reads mid-batch included.
fn untagged_increments_summed(b: &dyn Backend, v: u16, key: u64) -> Result<(), String> {
    let decls = [StateDecl::new("count", Scope::global(), AccessPattern::WriteMostly)];
    let config = ClientConfig { mode: Mode::Async, dedupe: false, ..Default::default() };
    let mut cl = open_client(b, InstanceId::new(v, 1), &decls, &[], config)?;
    let (count, ck) = (ObjectId(0), StateKey::Id(key));
    let (mut sum, mut packet) = (0i64, 0u64);
    for batch in 0..20i64 {
        cl.begin_batch();
        for i in 0..32i64 {
            packet += 1;
            cl.begin_packet(&meta(clk(key, packet)));
            let d = if i == 7 { i64::MAX } else { i - 3 };
            sum = sum.wrapping_add(d);
            cl.incr_nb(count, &ck, d).map_err(|e| format!("incr_nb: {e}"))?;
            let mut m = meta(clk(key, packet));
            cl.end_packet(&mut m);
        }
        if batch == 10 {
            let got = cl.get(count, &ck).map_err(|e| format!("get: {e}"))?;
            ensure(got == Some(Value::Int(sum)), || format!("mid-batch read: {got:?}, want {sum}"))?;
        }
        cl.end_batch();
    }
    cl.flush().map_err(|e| format!("flush: {e}"))?;
    let got = cl.get(count, &ck).map_err(|e| format!("get: {e}"))?;
    ensure(got == Some(Value::Int(sum)), || format!("untagged counter {got:?} after 640 increments summing {sum}"))?;
    let s = cl.stats();
    // 20 batches (one of them split by the read) and the reads themselves.
    ensure(s.requests <= 24, || format!("{} requests for 640 untagged increments in 20 batches", s.requests))?;
    ensure(s.async_errors == 0, || format!("{} non-blocking updates failed", s.async_errors))
}
