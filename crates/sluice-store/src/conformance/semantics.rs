//! Checks of what single operations do: every operation has the semantics of
//! [`sluice_state::ops::apply`], and every value and key round-trips exactly.

use super::raw::Raw;
use super::support::{clk, ensure, fresh_base, random_op, same_result, skey, tag, Rng, CUSTOM_OPS};
use crate::backend::Backend;
use crate::wire::{OpTag, StoreKey, StoreOp};
use sluice_packet::{FiveTuple, FlowKey, InstanceId, Proto};
use sluice_state::{ops::apply, StateKey, StateOp, Value};
use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
    scripted_ops(&mut c, &key)?;
    nonreply_failure_reported(&mut c, &key)?;
    incr_many(&mut c, base, &key)?;
    for seed in 1..=3u64 {
        random_batches(&mut c, base, &key, seed)?;
    }
    Ok(())
}

/// A fixed script over keys 0–6 covering every operation and its edge cases, each result
/// compared with [`apply`] and with the result written in the script.
fn scripted_ops(c: &mut Raw, key: &dyn Fn(u64) -> StoreKey) -> Result<(), String> {
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
            ensure(same_result(&got, &e), || {
                format!("step {n}: {op:?} on key {k}: store returned {got:?}, expected {e:?}")
            })?;
        }
    }
    Ok(())
}

/// A failure of a request sent without `reply` is reported; the others in its batch apply
/// (key 1 holds the integer 5 the script left there).
fn nonreply_failure_reported(c: &mut Raw, key: &dyn Fn(u64) -> StoreKey) -> Result<(), String> {
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
    ensure(now == Some(Value::Int(6)), || format!("the Incr batched after a failing request: value {now:?}, want 6"))
}

/// IncrMany: several tagged increments of one value in one request (result: none), each
/// logged with the value it left; a tag repeated within the request is applied each time; on
/// a float it adds as `Incr` does; on a list it fails.
fn incr_many(c: &mut Raw, base: u64, key: &dyn Fn(u64) -> StoreKey) -> Result<(), String> {
    let (t1, t2) = (OpTag { clock: clk(base, 1), seq: 0 }, OpTag { clock: clk(base, 2), seq: 0 });
    let incrs = vec![(t1, 2), (t2, -7)];
    let r = c.ok(key(20), StoreOp::IncrMany(incrs.clone()), None)?;
    ensure(r.is_none(), || format!("IncrMany should answer no value, got {r:?}"))?;
    let now = c.get(key(20))?;
    ensure(now == Some(Value::Int(-5)), || format!("IncrMany [+2, -7] on an absent value: {now:?}, want -5"))?;
    for (tag, left) in [(t1, 2), (t2, -5)] {
        let r = c.call(key(20), StoreOp::State(StateOp::Incr(100)), Some(tag))?;
        ensure(r.replayed && r.result == Ok(Some(Value::Int(left))), || {
            format!("an Incr repeating an IncrMany's tag should get the value it left, {left}: {r:?}")
        })?;
    }
    let t3 = OpTag { clock: clk(base, 4), seq: 0 };
    c.ok(key(22), StoreOp::IncrMany(vec![(t3, 1), (t3, 10)]), None)?;
    let now = c.get(key(22))?;
    ensure(now == Some(Value::Int(11)), || format!("IncrMany [t+1, t+10] (one tag twice): {now:?}, want 11"))?;
    c.state(key(23), StateOp::Set(Value::Float(0.5)), None)?;
    let incrs = vec![(OpTag { clock: clk(base, 5), seq: 0 }, 1), (OpTag { clock: clk(base, 6), seq: 0 }, 2)];
    c.ok(key(23), StoreOp::IncrMany(incrs), None)?;
    let now = c.get(key(23))?;
    ensure(now == Some(Value::Float(3.5)), || format!("IncrMany [+1, +2] on Float(0.5): {now:?}, want 3.5"))?;
    c.state(key(21), StateOp::Push(Value::Int(1)), None)?;
    let incrs = vec![(OpTag { clock: clk(base, 3), seq: 0 }, 1)];
    let r = c.call(key(21), StoreOp::IncrMany(incrs), None)?;
    ensure(r.result.is_err(), || format!("IncrMany on a list should fail, got {r:?}"))
}

/// A random sequence for `seed` in mixed batches (tagged and untagged, with and without
/// `reply`) against the model, then the final values.
fn random_batches(c: &mut Raw, base: u64, key: &dyn Fn(u64) -> StoreKey, seed: u64) -> Result<(), String> {
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
