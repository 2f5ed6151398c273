//! Differential tests: random request sequences (every `StoreOp`, several clients, tagged and
//! replayed updates, ownership, subscriptions, timers) sent to the embedded store with one shard
//! and to Redis with one bucket must give identical responses — results, error texts, `replayed`
//! flags, TS vectors — and identical notifications. Plus the cases that run in the client
//! (custom operations under contention, float increments, wrapping `i64` increments, IncrMany
//! overflow, compare-and-set on floats). Needs `SLUICE_REDIS_URL` / `SLUICE_REDIS_CLUSTER_URL`.

mod common;

use common::{fresh, Target};
use sluice_packet::{Clock, InstanceId};
use sluice_state::{CustomOp, StateError, StateKey, StateOp, Value};
use sluice_store::conformance::Rng;
use sluice_store::{
    Backend, Connection, EmbeddedStore, Notification, OpTag, Replies, Request, Response, StoreKey, StoreOp,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

const V: u16 = 7;

fn add_to_all(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let by = arg.as_int().ok_or(StateError::Custom("argument must be an int"))?;
    match slot {
        Some(Value::Ints(xs)) => {
            for x in xs.iter_mut() {
                *x = x.wrapping_add(by);
            }
            Ok(Some(Value::Int(xs.len() as i64)))
        }
        None => {
            *slot = Some(Value::Ints(vec![by]));
            Ok(None)
        }
        Some(_) => Err(StateError::Custom("not a record")),
    }
}

fn clobber_then_fail(slot: &mut Option<Value>, _: &Value) -> Result<Option<Value>, StateError> {
    *slot = Some(Value::Int(-1));
    Err(StateError::Custom("refused"))
}

const OPS: [CustomOp; 2] =
    [CustomOp { name: "add_to_all", apply: add_to_all }, CustomOp { name: "clobber", apply: clobber_then_fail }];

fn value(rng: &mut Rng) -> Value {
    match rng.below(9) {
        0..=2 => Value::Int(rng.range(-3, 3)),
        3 => Value::Int(if rng.chance(50) { i64::MAX - rng.range(0, 2) } else { i64::MIN + rng.range(0, 2) }),
        4 => Value::Float(rng.range(-4, 4) as f64 / 2.0),
        // Records longer than 8 integers keep no earlier value for replayed reads.
        5 => {
            let n = if rng.chance(20) { rng.range(8, 11) } else { rng.range(0, 3) };
            Value::Ints((0..n).map(|_| rng.range(0, 3)).collect())
        }
        6 => Value::List((0..rng.range(0, 3)).map(|_| Value::Int(rng.range(0, 5))).collect()),
        7 => Value::Bytes((0..rng.range(0, 3)).map(|_| rng.below(256) as u8).collect()),
        _ => Value::Endpoint("10.0.0.1".parse().unwrap_or(std::net::IpAddr::from([10, 0, 0, 1])), rng.below(3) as u16),
    }
}

fn state_op(rng: &mut Rng) -> StateOp {
    match rng.below(100) {
        0..=11 => StateOp::Get,
        12..=23 => StateOp::Set(value(rng)),
        24..=29 => StateOp::Delete,
        30..=44 => StateOp::Incr(match rng.below(6) {
            0 => i64::MAX,
            1 => i64::MIN,
            _ => rng.range(-3, 4),
        }),
        45..=56 => StateOp::Push(value(rng)),
        57..=63 => StateOp::Pop,
        64..=68 => StateOp::PopN(rng.below(4) as u32),
        69..=82 => {
            let expect = if rng.chance(25) { None } else { Some(value(rng)) };
            StateOp::CompareAndSet { expect, new: value(rng) }
        }
        83..=95 => StateOp::Custom { op: 0, arg: Value::Int(rng.range(-1, 2)) },
        96..=97 => StateOp::Custom { op: 1, arg: Value::Int(0) },
        _ => StateOp::Custom { op: 9, arg: Value::Int(0) },
    }
}

struct Side {
    conns: Vec<Box<dyn Connection>>,
    numbers: Vec<u64>,
    replies: Vec<Replies>,
}

impl Side {
    fn new(b: &dyn Backend, clients: usize) -> Side {
        b.register_custom_ops(V, &OPS).expect("register");
        Side {
            conns: (0..clients).map(|i| b.connect(InstanceId::new(V, i as u16)).expect("connect")).collect(),
            numbers: vec![0; clients],
            replies: (0..clients).map(|_| Replies::default()).collect(),
        }
    }

    /// Sends a batch from client `c` and waits for its ack; returns the responses, by id.
    fn send(&mut self, c: usize, batch: Vec<Request>) -> Vec<Response> {
        self.numbers[c] += 1;
        let b = self.numbers[c];
        self.conns[c].send(b, batch.into()).expect("send");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            self.conns[c].poll(&mut self.replies[c]).expect("poll");
            if self.replies[c].acked.contains(&b) {
                break;
            }
            assert!(Instant::now() < deadline, "batch not acknowledged");
            self.conns[c].wait(&mut self.replies[c], Duration::from_millis(5)).expect("wait");
        }
        self.replies[c].acked.clear();
        let mut r = std::mem::take(&mut self.replies[c].responses);
        r.sort_by_key(|x| x.id);
        r
    }

    fn notes(&mut self, c: usize) -> Vec<Notification> {
        // Both stores deliver notifications asynchronously (the embedded store from its shard
        // thread, Redis's connection from its I/O thread once asked): ask, give them a moment,
        // and ask again until a round brings nothing new.
        let mut out = Vec::new();
        loop {
            let before = out.len();
            std::thread::sleep(Duration::from_millis(3));
            self.conns[c].notifications(&mut out).expect("notifications");
            std::thread::sleep(Duration::from_millis(3));
            self.conns[c].notifications(&mut out).expect("notifications");
            if out.len() == before {
                return out;
            }
        }
    }
}

fn differential(seed: u64, steps: usize) {
    let clients = 3;
    let embedded = EmbeddedStore::start(1).expect("embedded");
    let redis = fresh(Target::Single, "buckets=1");
    let mut a = Side::new(&embedded, clients);
    let mut b = Side::new(&redis.backend, clients);
    let mut rng = Rng::new(seed);
    // Four per-flow keys and a global one (whose earlier values no store keeps).
    let mut keys: Vec<StoreKey> =
        (0..4).map(|i| StoreKey { vertex: V, object: (i % 2) as u16, key: StateKey::Id(i) }).collect();
    keys.push(StoreKey { vertex: V, object: 2, key: StateKey::Unit });
    let mut clock = 100u64;
    let mut used_tags: Vec<OpTag> = Vec::new();
    let mut next_id = 1;
    let mut now = 1_000u64;
    for step in 0..steps {
        let c = rng.below(clients as u64) as usize;
        let n = 1 + rng.below(4) as usize;
        let mut batch = Vec::new();
        for _ in 0..n {
            let key = keys[rng.below(keys.len() as u64) as usize];
            let op = match rng.below(100) {
                0..=59 => StoreOp::State(state_op(&mut rng)),
                60..=64 => StoreOp::IncrMany(
                    (0..rng.range(1, 3))
                        .map(|_| {
                            clock += 1;
                            let t = if rng.chance(30) && !used_tags.is_empty() {
                                used_tags[rng.below(used_tags.len() as u64) as usize]
                            } else {
                                OpTag { clock: Clock(clock), seq: 0 }
                            };
                            used_tags.push(t);
                            (t, if rng.chance(10) { i64::MAX } else { rng.range(-2, 3) })
                        })
                        .collect(),
                ),
                65..=69 => StoreOp::Subscribe,
                70..=72 => StoreOp::Unsubscribe,
                73..=77 => StoreOp::SetTimer { deadline_ns: now + rng.below(3_000) },
                78..=79 => StoreOp::CancelTimer,
                80..=85 => StoreOp::Claim,
                86..=90 => StoreOp::Release,
                91..=96 => {
                    now += rng.below(2_000);
                    StoreOp::AdvanceTime(now)
                }
                _ => StoreOp::ForgetClock(Clock(clock)),
            };
            // A tagged read is a replayed packet's, answered as of its clock: mostly the
            // clock of an update logged before, sometimes a clock after every update.
            let read = matches!(op, StoreOp::State(StateOp::Get));
            let tag = if matches!(op, StoreOp::IncrMany(_)) || rng.chance(40) {
                None
            } else if read && !used_tags.is_empty() && rng.chance(80) {
                Some(used_tags[rng.below(used_tags.len() as u64) as usize])
            } else if read {
                Some(OpTag { clock: Clock(clock + 1), seq: 0 })
            } else if rng.chance(25) && !used_tags.is_empty() {
                Some(used_tags[rng.below(used_tags.len() as u64) as usize])
            } else {
                clock += 1;
                let t = OpTag { clock: Clock(clock), seq: rng.below(3) as u32 };
                used_tags.push(t);
                Some(t)
            };
            batch.push(Request {
                id: next_id,
                client: InstanceId::new(V, c as u16),
                tag,
                key,
                op,
                reply: rng.chance(80),
            });
            next_id += 1;
        }
        let ra = a.send(c, batch.clone());
        let rb = b.send(c, batch.clone());
        assert_eq!(ra, rb, "seed {seed} step {step}: responses differ for {batch:#?}");
        for x in 0..clients {
            // Each side's notifications come from another thread: on a loaded machine one side's
            // may come later than a round of asking waits. A difference that lasts is a bug.
            let (mut na, mut nb) = (a.notes(x), b.notes(x));
            let deadline = Instant::now() + Duration::from_secs(2);
            while na != nb && Instant::now() < deadline {
                na.extend(a.notes(x));
                nb.extend(b.notes(x));
            }
            assert_eq!(na, nb, "seed {seed} step {step}: notifications to client {x} differ after {batch:#?}");
        }
    }
    let ca = embedded.checkpoint().expect("checkpoint");
    let cb = redis.backend.checkpoint().expect("checkpoint");
    assert_eq!(ca, cb, "seed {seed}: checkpoints differ");
}

#[test]
fn same_as_embedded_random() {
    for seed in 1..=6 {
        differential(seed, 300);
    }
}

/// Sends `req` alone as batch number `req.id` (ids here count from 1 per connection).
fn one(conn: &mut dyn Connection, req: Request) -> Response {
    let id = req.id;
    conn.send(id, vec![req].into()).expect("send");
    // The answer comes from the connection's thread: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut r = Replies::default();
    loop {
        conn.wait(&mut r, std::time::Duration::from_millis(100)).expect("wait");
        if let Some(found) = r.responses.iter().position(|x| x.id == id) {
            return r.responses.swap_remove(found);
        }
        assert!(std::time::Instant::now() < deadline, "no answer to request {id}");
    }
}

/// A custom operation from many threads at once, on a single server and on the cluster: the
/// optimistic read–apply–conditional-write loses no update, and a retransmitted tagged one is
/// applied once.
#[test]
fn custom_ops_under_contention() {
    for t in [Target::Single, Target::Cluster] {
        let f = fresh(t, "");
        f.backend.register_custom_ops(V, &OPS).expect("register");
        let key = StoreKey { vertex: V, object: 0, key: StateKey::Unit };
        let threads = 4u16;
        let per = 100u64;
        let backend = Arc::new(f.backend.clone());
        {
            let mut c = backend.connect(InstanceId::new(V, 99)).expect("connect");
            let set = Request {
                id: 1,
                client: InstanceId::new(V, 99),
                tag: None,
                key,
                op: StoreOp::State(StateOp::Set(Value::Ints(vec![0, 0]))),
                reply: true,
            };
            assert_eq!(one(c.as_mut(), set).result, Ok(None));
        }
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let b = backend.clone();
                std::thread::spawn(move || {
                    let me = InstanceId::new(V, i);
                    let mut c = b.connect(me).expect("connect");
                    for n in 0..per {
                        let tag = Some(OpTag { clock: Clock(u64::from(i) * 1_000_000 + n), seq: 0 });
                        let op = StoreOp::State(StateOp::Custom { op: 0, arg: Value::Int(1) });
                        // Every update twice: the second is a duplicate.
                        for dup in 0..2 {
                            let r = one(
                                c.as_mut(),
                                Request { id: n * 2 + dup + 1, client: me, tag, key, op: op.clone(), reply: true },
                            );
                            assert_eq!(r.result, Ok(Some(Value::Int(2))));
                            assert_eq!(r.replayed, dup == 1);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("thread");
        }
        let mut c = backend.connect(InstanceId::new(V, 99)).expect("connect");
        let get = Request {
            id: 1,
            client: InstanceId::new(V, 99),
            tag: None,
            key,
            op: StoreOp::State(StateOp::Get),
            reply: true,
        };
        let total = i64::from(threads) * per as i64;
        assert_eq!(one(c.as_mut(), get).result, Ok(Some(Value::Ints(vec![total, total]))), "{t:?}");
    }
}

/// Exact arithmetic where Lua cannot do it: wrapping i64, floats, IncrMany overflow.
#[test]
fn exact_arithmetic_in_the_client() {
    for t in [Target::Single, Target::Cluster] {
        let f = fresh(t, "");
        let me = InstanceId::new(V, 0);
        let mut c = f.backend.connect(me).expect("connect");
        let key = |i| StoreKey { vertex: V, object: 0, key: StateKey::Id(i) };
        let mut id = 0;
        let mut run = |k: StoreKey, op: StoreOp, tag: Option<OpTag>| {
            id += 1;
            one(c.as_mut(), Request { id, client: me, tag, key: k, op, reply: true }).result
        };
        assert_eq!(run(key(1), StoreOp::State(StateOp::Set(Value::Int(i64::MAX))), None), Ok(None));
        assert_eq!(run(key(1), StoreOp::State(StateOp::Incr(2)), None), Ok(Some(Value::Int(i64::MIN + 1))));
        assert_eq!(run(key(2), StoreOp::State(StateOp::Set(Value::Float(0.5))), None), Ok(None));
        assert_eq!(run(key(2), StoreOp::State(StateOp::Incr(3)), None), Ok(Some(Value::Float(3.5))));
        let nan = StoreOp::State(StateOp::Set(Value::Float(f64::NAN)));
        assert_eq!(run(key(3), nan, None), Ok(None));
        let cas = StoreOp::State(StateOp::CompareAndSet { expect: Some(Value::Float(f64::NAN)), new: Value::Int(1) });
        // NaN != NaN: not set, the current value is returned (compare bits, as NaN != NaN).
        match run(key(3), cas, None) {
            Ok(Some(Value::Float(x))) => assert!(x.is_nan()),
            other => panic!("{other:?}"),
        }
        assert_eq!(run(key(4), StoreOp::State(StateOp::Set(Value::Float(-0.0))), None), Ok(None));
        let cas = StoreOp::State(StateOp::CompareAndSet { expect: Some(Value::Float(0.0)), new: Value::Int(1) });
        assert_eq!(run(key(4), cas, None), Ok(Some(Value::Int(1))));
        // IncrMany: the second increment overflows; the third is a duplicate of the first.
        let t1 = OpTag { clock: Clock(10), seq: 0 };
        let t2 = OpTag { clock: Clock(11), seq: 0 };
        assert_eq!(run(key(5), StoreOp::State(StateOp::Set(Value::Int(i64::MAX - 5))), None), Ok(None));
        let many = StoreOp::IncrMany(vec![(t1, 3), (t2, 10), (t1, 3)]);
        assert_eq!(run(key(5), many.clone(), None), Ok(None));
        let want = (i64::MAX - 5).wrapping_add(3).wrapping_add(10).wrapping_add(3);
        assert_eq!(run(key(5), StoreOp::State(StateOp::Get), None), Ok(Some(Value::Int(want))));
        assert_eq!(run(key(5), many, None), Ok(None));
        assert_eq!(run(key(5), StoreOp::State(StateOp::Get), None), Ok(Some(Value::Int(want))), "applied twice");
        // A tagged custom op that fails leaves the value and is not logged.
        f.backend.register_custom_ops(V, &OPS).expect("register");
        let bad = StoreOp::State(StateOp::Custom { op: 1, arg: Value::Int(0) });
        let t3 = Some(OpTag { clock: Clock(12), seq: 0 });
        assert!(run(key(5), bad.clone(), t3).is_err());
        assert!(run(key(5), bad, t3).is_err());
        assert_eq!(run(key(5), StoreOp::State(StateOp::Get), None), Ok(Some(Value::Int(want))));
        // An emptied list stays an (empty) list.
        assert_eq!(run(key(6), StoreOp::State(StateOp::Push(Value::Int(1))), None), Ok(Some(Value::Int(1))));
        assert_eq!(run(key(6), StoreOp::State(StateOp::Pop), None), Ok(Some(Value::Int(1))));
        assert_eq!(run(key(6), StoreOp::State(StateOp::Get), None), Ok(Some(Value::List(VecDeque::new()))));
    }
}
