//! The conformance suite (`sluice_store::conformance`) against the embedded store with one and
//! with three shard threads, one test per check; property tests of the randomised checks; and
//! the client's retransmission over a lossy connection.

use proptest::prelude::*;
use sluice_packet::{Clock, InstanceId, Meta};
use sluice_state::{AccessPattern, ObjectId, Scope, StateDecl, StateHandle, StateKey, StateOp, Value};
use sluice_store::conformance::{self, fresh_base};
use sluice_store::{
    Backend, ClientConfig, Connection, EmbeddedStore, Mode, Notification, Replies, Request, StoreClient, StoreError,
    StoreKey, StoreOp,
};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn run(threads: usize, name: &str) {
    let store = EmbeddedStore::start(threads).expect("start store");
    conformance::run_check(&store, name);
}

sluice_store::conformance_tests!(one_shard => |name| super::run(1, name), three_shards => |name| super::run(3, name));

/// The whole suite, sequentially, on one store (as a Redis backend would run it).
#[test]
fn whole_suite_on_one_store() {
    let store = EmbeddedStore::start(2).expect("start store");
    for (name, check) in conformance::all() {
        if let Err(e) = check(&store) {
            panic!("{name}: {e}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn prop_concurrent_pops(seed in any::<u64>(), four in any::<bool>(), ports in 1u16..200, shards in 1usize..4) {
        let store = EmbeddedStore::start(shards).expect("start store");
        let clients = if four { 4 } else { 2 };
        let r = conformance::concurrent_pops(&store, 1003, seed, clients, ports);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn prop_concurrent_incr(seed in any::<u64>(), threads in 1u16..6, per in 1u32..200) {
        let store = EmbeddedStore::start(3).expect("start store");
        let r = conformance::concurrent_incr(&store, 1004, seed, threads, per);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn prop_client_modes_agree(seed in any::<u64>(), steps in 1usize..400, shards in 1usize..4) {
        let store = EmbeddedStore::start(shards).expect("start store");
        let r = conformance::client_modes_agree_seed(&store, 1014, seed, steps);
        prop_assert!(r.is_ok(), "{:?}", r);
    }
}

// ---------------------------------------------------------------------------------------------
// Retransmission over a lossy connection
// ---------------------------------------------------------------------------------------------

/// What the lossy wrapper loses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Loss {
    /// The first copy of every `n`-th batch never reaches the store.
    Requests(u64),
    /// Every `n`-th batch reaches the store but its acknowledgement is lost (first copy only).
    Acks(u64),
}

/// A connection that loses the first copy of some batches: either the batch never reaches the
/// store, or it does and its acknowledgement is lost. The client sends the batch again under the
/// same number after its timeout.
struct Lossy {
    inner: Box<dyn Connection>,
    loss: Loss,
    /// Batch numbers seen before: a second copy is a retransmission and always goes through.
    seen: HashSet<u64>,
    /// Batches whose first acknowledgement is to be swallowed.
    swallow: HashSet<u64>,
    dropped: Arc<AtomicU64>,
}

impl Connection for Lossy {
    fn send(&mut self, number: u64, batch: Arc<[Request]>) -> Result<(), StoreError> {
        let first = self.seen.insert(number);
        // Blocking requests are not lost here: their callers would wait for the timeout.
        let droppable = first && batch.iter().all(|r| !r.reply);
        match self.loss {
            Loss::Requests(n) if droppable && number.is_multiple_of(n) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Loss::Acks(n) if droppable && number.is_multiple_of(n) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.swallow.insert(number);
                self.inner.send(number, batch)
            }
            _ => self.inner.send(number, batch),
        }
    }

    fn poll(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        let mut r = Replies::default();
        self.inner.poll(&mut r)?;
        self.translate(r, out);
        Ok(())
    }

    fn wait(&mut self, out: &mut Replies, timeout: Duration) -> Result<(), StoreError> {
        let mut r = Replies::default();
        self.inner.wait(&mut r, timeout)?;
        self.translate(r, out);
        Ok(())
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), StoreError> {
        self.inner.notifications(out)
    }
}

impl Lossy {
    fn translate(&mut self, r: Replies, out: &mut Replies) {
        out.responses.extend(r.responses);
        let swallow = &mut self.swallow;
        out.acked.extend(r.acked.into_iter().filter(|b| !swallow.remove(b)));
    }
}

fn lossy_client(store: &EmbeddedStore, v: u16, loss: Loss, decls: &[StateDecl]) -> (StoreClient, Arc<AtomicU64>) {
    let id = InstanceId::new(v, 0);
    let dropped = Arc::new(AtomicU64::new(0));
    let conn = Lossy {
        inner: store.connect(id).expect("connect"),
        loss,
        seen: HashSet::new(),
        swallow: HashSet::new(),
        dropped: dropped.clone(),
    };
    let cfg =
        ClientConfig { mode: Mode::Async, retransmit_after: Duration::from_millis(20), ..ClientConfig::default() };
    (StoreClient::new(Box::new(conn), id, v, decls, &[], cfg), dropped)
}

fn read(store: &EmbeddedStore, key: StoreKey) -> Option<Value> {
    let mut c = store.connect(InstanceId::new(key.vertex, 99)).expect("connect");
    let req = Request {
        id: 1,
        client: InstanceId::new(key.vertex, 99),
        tag: None,
        key,
        op: StoreOp::State(StateOp::Get),
        reply: true,
    };
    c.send(1, vec![req].into()).expect("send");
    let mut r = Replies::default();
    for _ in 0..500 {
        c.wait(&mut r, Duration::from_millis(10)).expect("wait");
        if let Some(resp) = r.responses.iter().find(|x| x.id == 1) {
            return resp.result.clone().expect("get");
        }
    }
    panic!("no answer to a Get");
}

/// Non-blocking counter updates over a connection that loses requests or acks: `flush()`
/// succeeds, the client retransmitted, and every update was applied exactly once.
fn lossy_counters(loss: Loss) {
    let store = EmbeddedStore::start(2).expect("start store");
    let v = 1200;
    let decls = [StateDecl::new("counters", Scope::global(), AccessPattern::WriteMostly)];
    let (mut c, dropped) = lossy_client(&store, v, loss, &decls);
    let base = fresh_base();
    let keys: Vec<StateKey> = (0..5).map(|k| StateKey::Id(base + k)).collect();
    let mut want = vec![0i64; keys.len()];
    let mut clock = 0;
    for batch in 0..40 {
        c.begin_batch();
        for p in 0..8u64 {
            clock += 1;
            c.begin_packet(&Meta { clock: Clock::new(1, base + clock), ..Meta::default() });
            let k = ((batch + p) % 5) as usize;
            c.incr_nb(ObjectId(0), &keys[k], (p + 1) as i64).expect("incr_nb");
            want[k] += (p + 1) as i64;
            let mut m = Meta::default();
            c.end_packet(&mut m);
        }
        c.end_batch();
    }
    c.flush().expect("flush over a lossy connection");
    assert!(dropped.load(Ordering::Relaxed) > 0, "the wrapper lost nothing");
    assert!(c.stats().retransmits > 0, "no retransmission: {:?}", c.stats());
    assert_eq!(c.unacknowledged(), 0);
    for (k, w) in keys.iter().zip(&want) {
        let got = read(&store, StoreKey { vertex: v, object: 0, key: *k });
        assert_eq!(got, Some(Value::Int(*w)), "counter {k:?} ({loss:?}; {:?})", c.stats());
    }
}

#[test]
fn retransmits_lost_requests() {
    lossy_counters(Loss::Requests(3));
}

#[test]
fn retransmits_lost_acks_applied_once() {
    lossy_counters(Loss::Acks(2));
}

/// A blocking read after lost non-blocking updates still sees them (the client retransmits
/// before... or the read waits): after `flush()` the client's own reads are exact.
#[test]
fn lossy_then_read_through_client() {
    let store = EmbeddedStore::start(1).expect("start store");
    let decls = [StateDecl::new("counters", Scope::global(), AccessPattern::WriteMostly)];
    let (mut c, _) = lossy_client(&store, 1201, Loss::Requests(2), &decls);
    let base = fresh_base();
    let k = StateKey::Id(base);
    for i in 0..20u64 {
        c.begin_batch();
        c.begin_packet(&Meta { clock: Clock::new(1, base + i + 1), ..Meta::default() });
        c.incr_nb(ObjectId(0), &k, 1).expect("incr_nb");
        c.end_batch();
    }
    c.flush().expect("flush");
    assert_eq!(c.get(ObjectId(0), &k).expect("get"), Some(Value::Int(20)));
}

/// Per-flow values cached by an async client and flushed over a connection that loses
/// requests: after `flush()` the store holds the last value written, not an older one.
/// Fails today: flushes are untagged and a lost batch is retransmitted after younger ones were
/// applied, so an older `Set` lands last.
#[test]
fn lossy_flush_keeps_last_value() {
    let store = EmbeddedStore::start(1).expect("start store");
    let v = 1202;
    let decls = [StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften)];
    let id = InstanceId::new(v, 0);
    let dropped = Arc::new(AtomicU64::new(0));
    let conn = Lossy {
        inner: store.connect(id).expect("connect"),
        loss: Loss::Requests(3),
        seen: HashSet::new(),
        swallow: HashSet::new(),
        dropped: dropped.clone(),
    };
    let cfg = ClientConfig {
        mode: Mode::Async,
        retransmit_after: Duration::from_millis(20),
        flush_every: 1,
        ..ClientConfig::default()
    };
    let mut c = StoreClient::new(Box::new(conn), id, v, &decls, &[], cfg);
    let base = fresh_base();
    let k = StateKey::Id(base);
    for i in 0..10i64 {
        c.begin_batch();
        c.begin_packet(&Meta { clock: Clock::new(1, base + i as u64 + 1), ..Meta::default() });
        c.set(ObjectId(0), &k, Value::Int(i)).expect("set");
        c.end_batch();
    }
    c.flush().expect("flush");
    assert!(dropped.load(Ordering::Relaxed) > 0);
    let got = read(&store, StoreKey { vertex: v, object: 0, key: k });
    assert_eq!(got, Some(Value::Int(9)), "stale value after retransmission ({:?})", c.stats());
}

/// A per-flow list cached by an async client, flushed as deltas over a connection that loses
/// acknowledgements (the store applied the batch; the client retransmits it): each pushed
/// element is in the store once. Fails today: flushed deltas are untagged, so a retransmitted
/// `Push` is applied again. The same happens without any loss whenever acks take longer than
/// `retransmit_after`.
#[test]
fn lossy_acks_flush_list_deltas_once() {
    let store = EmbeddedStore::start(1).expect("start store");
    let v = 1203;
    let decls = [StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften)];
    let id = InstanceId::new(v, 0);
    let conn = Lossy {
        inner: store.connect(id).expect("connect"),
        loss: Loss::Acks(2),
        seen: HashSet::new(),
        swallow: HashSet::new(),
        dropped: Arc::new(AtomicU64::new(0)),
    };
    let cfg = ClientConfig {
        mode: Mode::Async,
        retransmit_after: Duration::from_millis(20),
        flush_every: 1,
        ..ClientConfig::default()
    };
    let mut c = StoreClient::new(Box::new(conn), id, v, &decls, &[], cfg);
    let base = fresh_base();
    let k = StateKey::Id(base);
    for i in 0..10i64 {
        c.begin_batch();
        c.begin_packet(&Meta { clock: Clock::new(1, base + i as u64 + 1), ..Meta::default() });
        c.exec(ObjectId(0), &k, StateOp::Push(Value::Int(i))).expect("push");
        c.end_batch();
    }
    c.flush().expect("flush");
    let want = c.get(ObjectId(0), &k).expect("get");
    let got = read(&store, StoreKey { vertex: v, object: 0, key: k });
    assert_eq!(got, want, "store and client disagree after retransmitted flushes ({:?})", c.stats());
}

/// A blocking call whose batch takes the client past `max_inflight` gets its answer. The
/// client waits for acknowledgements before it waits for the answer, and the answer arrives in
/// that wait; it used to be dropped there as the answer to a request nobody waited for, so the
/// call failed after `call_timeout` and the NF lost the update (a store falling behind under
/// load did this to the COE engine: fuzz seeds 837, 1153).
#[test]
fn call_past_max_inflight_gets_its_answer() {
    let store = EmbeddedStore::start(1).expect("start store");
    let v = 1204;
    let decls = [StateDecl::new("counters", Scope::global(), AccessPattern::WriteMostly)];
    let id = InstanceId::new(v, 0);
    let cfg = ClientConfig {
        mode: Mode::Async,
        max_inflight: 0,
        call_timeout: Duration::from_millis(500),
        ..ClientConfig::default()
    };
    let mut c = StoreClient::new(store.connect(id).expect("connect"), id, v, &decls, &[], cfg);
    let base = fresh_base();
    let k = StateKey::Id(base);
    for i in 0..5u64 {
        c.begin_batch();
        c.begin_packet(&Meta { clock: Clock::new(1, base + i + 1), ..Meta::default() });
        c.incr_nb(ObjectId(0), &k, 2).expect("incr_nb");
        let got = c.incr(ObjectId(0), &k, 1).expect("a blocking call past max_inflight is answered");
        assert_eq!(got, 3 * (i as i64 + 1));
        c.end_batch();
    }
    c.flush().expect("flush");
    assert_eq!(read(&store, StoreKey { vertex: v, object: 0, key: k }), Some(Value::Int(15)));
}

/// A connection opened at one clock and closed at later ones by an instance whose node then
/// failed, before the copies carrying those packets' outputs left it: its replacement
/// (fault-tolerant client, every value taken over) processes the opening packet again and must
/// read the connection as the first run did — absent — not as the closing packets left it, or
/// it takes another path (a balancer "reopening" it) whose updates no longer line up with the
/// logged ones. Failed before: the replayed read returned the closed entry. The replacement
/// asks the store for each such read here (values loaded without the store's history).
#[test]
fn a_replacement_reads_a_flow_as_the_first_run_did() {
    replacement_reads_a_flow_as_the_first_run_did(false);
}

/// The same with the values and the store's history of earlier values taken over
/// (`Backend::takeover`): the replacement answers its replayed reads itself, alike, without a
/// round trip each.
#[test]
fn a_replacement_answers_its_replayed_reads_from_what_it_took_over() {
    replacement_reads_a_flow_as_the_first_run_did(true);
}

fn replacement_reads_a_flow_as_the_first_run_did(take_over: bool) {
    let t = ReplayReads::new(1205, StateDecl::new("conns", Scope::per_flow(), AccessPattern::ReadHeavy), false);
    let (k, meta) = (t.key(), |i, replayed| t.meta(i, replayed));
    let mut c = t.client(0);
    for (i, value) in [(1, 10), (2, 11), (3, 12)] {
        c.begin_batch();
        c.begin_packet(&meta(i, false));
        assert_eq!(c.get(ObjectId(0), &k).expect("get"), (i > 1).then(|| Value::Int(value - 1)));
        c.set(ObjectId(0), &k, Value::Int(value)).expect("set");
        c.end_batch();
    }
    c.flush().expect("flush");
    drop(c);

    let mut r = t.replacement(take_over);
    for (i, read) in [(1, None), (2, Some(Value::Int(10))), (3, Some(Value::Int(11)))] {
        r.begin_batch();
        r.begin_packet(&meta(i, true));
        let trips = r.stats().round_trips;
        assert_eq!(r.get(ObjectId(0), &k).expect("get"), read, "replayed clock {i}");
        r.set(ObjectId(0), &k, Value::Int(9 + i as i64)).expect("set");
        let trips_of_set = r.stats().round_trips;
        // Its own update counts: read after it, as the first run read after it.
        assert_eq!(r.get(ObjectId(0), &k).expect("get"), Some(Value::Int(9 + i as i64)), "clock {i} after its set");
        let (asked, asked_after) = (trips_of_set - trips - 1, r.stats().round_trips - trips_of_set);
        let want = if take_over { 0 } else { 1 };
        assert_eq!((asked, asked_after), (want, want), "store round trips for the two reads of clock {i}");
        r.end_batch();
    }
    // Live again: its own copy, which holds the latest value.
    r.begin_batch();
    r.begin_packet(&meta(4, false));
    assert_eq!(r.get(ObjectId(0), &k).expect("get"), Some(Value::Int(12)));
    r.end_batch();
    assert_eq!(r.stats().duplicates, 3, "the replayed sets were answered from the log");
}

/// A replayed packet reads a value shared across flows (a portscan detector's walk of a host),
/// kept by one instance alone, as its first run read it, not as later packets left it: rerun
/// against the later value, a detector's replacement blocked a scanner's packet its first run
/// had let through (a spread run's replay, docs/correctness.md R4).
#[test]
fn a_replacement_reads_a_value_it_had_alone_as_the_first_run_did() {
    replacement_reads_a_shared_value_as_the_first_run_did(false);
}

/// The same with the store's history taken over: answered without a round trip each.
#[test]
fn a_replacement_answers_replayed_reads_of_a_value_it_had_alone_from_what_it_took_over() {
    replacement_reads_a_shared_value_as_the_first_run_did(true);
}

fn replacement_reads_a_shared_value_as_the_first_run_did(take_over: bool) {
    let hosts = Scope::fields(&[sluice_packet::HeaderField::SrcIp]);
    let t = ReplayReads::new(1206, StateDecl::new("hosts", hosts, AccessPattern::ReadWriteOften), true);
    let (k, meta) = (t.key(), |i, replayed| t.meta(i, replayed));
    let mut c = t.client(0);
    for (i, value) in [(1, 10), (2, 11), (3, 12)] {
        c.begin_batch();
        c.begin_packet(&meta(i, false));
        c.set(ObjectId(0), &k, Value::Int(value)).expect("set");
        c.end_batch();
    }
    c.flush().expect("flush");
    drop(c);

    let mut r = t.replacement(take_over);
    for (i, read) in [(1, None), (2, Some(Value::Int(10))), (3, Some(Value::Int(11)))] {
        r.begin_batch();
        r.begin_packet(&meta(i, true));
        let trips = r.stats().round_trips;
        assert_eq!(r.get(ObjectId(0), &k).expect("get"), read, "replayed clock {i}");
        let asked = r.stats().round_trips - trips;
        assert_eq!(asked, u64::from(!take_over), "store round trips for the read of clock {i}");
        r.end_batch();
    }
    r.begin_batch();
    r.begin_packet(&meta(4, false));
    assert_eq!(r.get(ObjectId(0), &k).expect("get"), Some(Value::Int(12)), "live again: the latest value");
    r.end_batch();
}

/// What the replay-read tests share: a store, vertex `v` with one object `decl` in
/// fault-tolerant async clients (`exclusive`: its instance has the object alone), and a fresh
/// key in it.
struct ReplayReads {
    store: EmbeddedStore,
    v: u16,
    decls: [StateDecl; 1],
    exclusive: bool,
    base: u64,
}

impl ReplayReads {
    fn new(v: u16, decl: StateDecl, exclusive: bool) -> ReplayReads {
        let store = EmbeddedStore::start(2).expect("start store");
        ReplayReads { store, v, decls: [decl], exclusive, base: fresh_base() }
    }

    fn key(&self) -> StateKey {
        StateKey::Id(self.base)
    }

    /// Packet `i`'s metadata, a replay's copy or not.
    fn meta(&self, i: u64, replayed: bool) -> Meta {
        let flags = if replayed { sluice_packet::MetaFlags::REPLAYED } else { sluice_packet::MetaFlags::default() };
        Meta { clock: Clock::new(1, self.base + i), flags, ..Meta::default() }
    }

    /// Instance `index`'s client.
    fn client(&self, index: u16) -> StoreClient {
        let id = InstanceId::new(self.v, index);
        let cfg = ClientConfig { mode: Mode::Async, write_through: true, ..ClientConfig::default() };
        let mut c = StoreClient::new(self.store.connect(id).expect("connect"), id, self.v, &self.decls, &[], cfg);
        if self.exclusive {
            c.set_exclusive(ObjectId(0), true);
        }
        c
    }

    /// Instance 0's replacement (instance 1), with its predecessor's values: with the store's
    /// history (`take_over`) or without.
    fn replacement(&self, take_over: bool) -> StoreClient {
        let mut r = self.client(1);
        take_over_or_load(&self.store, &mut r, (InstanceId::new(self.v, 0), self.v), take_over);
        r
    }
}

/// A replacement `r` of instance `first` of vertex `v` takes its predecessor's values (object
/// 0), as one alone at its vertex does: with the store's history (`take_over`) or without.
fn take_over_or_load(store: &EmbeddedStore, r: &mut StoreClient, (first, v): (InstanceId, u16), take_over: bool) {
    if take_over {
        let (tx, rx) = std::sync::mpsc::channel();
        let readers = store.takeover(first, Some(&[0]), &tx).expect("takeover");
        let mut ended = 0;
        while ended < readers {
            match rx.recv_timeout(Duration::from_secs(5)).expect("a take-over part") {
                Some(part) => r.take_over(part),
                None => ended += 1,
            }
        }
        r.took_over_every_value();
    } else {
        let values = store.values_of(v, &[0]).expect("values").expect("the embedded store lists them");
        r.load_flows(values);
    }
}

/// An async client flushes what changed, not what was only tested: deleting or popping an
/// absent value and a compare-and-set that fails leave nothing to write, while real changes
/// (a delete of a present value included) still reach the store.
/// A fresh store, a client of vertex `v` (async, `cfg`'s other settings) with one per-flow
/// object, and a base for keys and clocks no other test uses.
fn per_flow_client(v: u16, cfg: ClientConfig) -> (EmbeddedStore, StoreClient, u64) {
    let store = EmbeddedStore::start(1).expect("start store");
    let decls = [StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften)];
    let id = InstanceId::new(v, 0);
    let cfg = ClientConfig { mode: Mode::Async, ..cfg };
    let c = StoreClient::new(store.connect(id).expect("connect"), id, v, &decls, &[], cfg);
    (store, c, fresh_base())
}

#[test]
fn updates_that_change_nothing_are_not_flushed() {
    let v = 1203;
    let (store, mut c, base) = per_flow_client(v, ClientConfig { flush_every: 1, ..ClientConfig::default() });
    let key = |i: u64| StateKey::Id(base + i);
    let obj = ObjectId(0);
    c.begin_batch();
    c.begin_packet(&Meta { clock: Clock::new(1, base + 1), ..Meta::default() });
    for i in 0..50 {
        assert_eq!(c.delete(obj, &key(i)).expect("delete"), None);
        assert_eq!(c.exec(obj, &key(i), StateOp::Pop).expect("pop"), None);
    }
    c.set(obj, &key(100), Value::Int(7)).expect("set");
    c.end_batch();
    c.flush().expect("flush");
    assert_eq!(c.stats().flushed, 1, "only the set was written ({:?})", c.stats());
    assert_eq!(read(&store, StoreKey { vertex: v, object: 0, key: key(100) }), Some(Value::Int(7)));

    c.begin_batch();
    c.begin_packet(&Meta { clock: Clock::new(1, base + 2), ..Meta::default() });
    let cas = StateOp::CompareAndSet { expect: None, new: Value::Int(8) };
    assert_eq!(c.exec(obj, &key(100), cas).expect("cas"), Some(Value::Int(7)), "found another value");
    c.end_batch();
    c.flush().expect("flush");
    assert_eq!(c.stats().flushed, 1, "a failed compare-and-set writes nothing ({:?})", c.stats());

    c.begin_batch();
    c.begin_packet(&Meta { clock: Clock::new(1, base + 3), ..Meta::default() });
    assert_eq!(c.delete(obj, &key(100)).expect("delete"), Some(Value::Int(7)));
    assert_eq!(c.delete(obj, &key(100)).expect("delete again"), None);
    c.end_batch();
    c.flush().expect("flush");
    assert_eq!(c.stats().flushed, 2, "the delete of a present value is written ({:?})", c.stats());
    assert_eq!(read(&store, StoreKey { vertex: v, object: 0, key: key(100) }), None);
}

/// A client that owns its flows from their first packet knows a value it has not written is
/// absent without asking: reads, deletes and pops of such values leave no entry in its cache
/// (a detector tests a flow it does not track on every packet; entries for all of them
/// filled the cache and slowed every lookup), and what it has written is still there.
#[test]
fn a_fresh_client_keeps_no_entries_for_values_it_only_finds_absent() {
    let v = 1204;
    let (_store, mut c, base) = per_flow_client(v, ClientConfig::default());
    let key = |i: u64| StateKey::Id(base + i);
    let obj = ObjectId(0);
    c.begin_batch();
    c.begin_packet(&Meta { clock: Clock::new(1, base + 1), ..Meta::default() });
    for i in 0..50 {
        assert_eq!(c.get(obj, &key(i)).expect("get"), None);
        assert_eq!(c.delete(obj, &key(i)).expect("delete"), None);
        assert_eq!(c.exec(obj, &key(i), StateOp::Pop).expect("pop"), None);
    }
    c.set(obj, &key(100), Value::Int(7)).expect("set");
    assert_eq!(c.exec(obj, &key(100), StateOp::Incr(1)).expect("incr"), Some(Value::Int(8)));
    c.end_batch();
    let held = c.per_flow_values();
    let want = vec![(StoreKey { vertex: v, object: 0, key: key(100) }, Some(Value::Int(8)))];
    assert_eq!(held, want, "only the value written");
    assert_eq!(c.stats().round_trips, 0, "nothing was asked of the store");
    // Deleted once held, it stays known absent: a rebuilt store must learn of the delete.
    c.begin_batch();
    c.begin_packet(&Meta { clock: Clock::new(1, base + 2), ..Meta::default() });
    assert_eq!(c.delete(obj, &key(100)).expect("delete"), Some(Value::Int(8)));
    c.end_batch();
    assert_eq!(c.per_flow_values(), vec![(StoreKey { vertex: v, object: 0, key: key(100) }, None)]);
}

/// The store keeps copies of an instance's timers for a replacement to adopt, so only when
/// writing through (fault tolerance): every batch's changes then. Writing back, it gets none,
/// flush or no flush — an idle timer re-armed by every packet of a flow cost a request a packet.
#[test]
fn timer_copies_only_where_a_replacement_may_adopt_them() {
    let store = EmbeddedStore::start(1).expect("start store");
    let decls = [StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften)];
    for (v, write_through) in [(1204, false), (1205, true)] {
        let id = InstanceId::new(v, 0);
        let cfg = ClientConfig { mode: Mode::Async, flush_every: 2, write_through, ..ClientConfig::default() };
        let mut c = StoreClient::new(store.connect(id).expect("connect"), id, v, &decls, &[], cfg);
        let base = fresh_base();
        let key = StateKey::Id(base);
        for batch in 1..=3u64 {
            c.begin_batch();
            c.begin_packet(&Meta { clock: Clock::new(1, base + batch), ts_ns: batch, ..Meta::default() });
            c.set_timer(ObjectId(0), &key, 1_000 + batch);
            c.end_batch();
            if batch == 3 {
                c.flush().expect("flush");
            }
            // The store's shard takes the scan after the batch just sent.
            let got: Vec<u64> = store.timers_of(id).expect("timers_of").iter().map(|(_, d)| *d).collect();
            let want = if write_through { vec![1_000 + batch] } else { Vec::new() };
            assert_eq!(got, want, "batch {batch}, writing {}", if write_through { "through" } else { "back" });
        }
    }
}

/// Batches allowed to wait for a napping shard (a run without the root's log) are all applied
/// and acknowledged without any wait to hurry them: sent while the shard is busy, napping and
/// asleep; and a wait for them wakes it.
#[test]
fn lazy_batches_are_applied_without_a_wakeup() {
    let store = EmbeddedStore::start(2).expect("start store");
    let v = 1206;
    let id = InstanceId::new(v, 0);
    let mut c = store.connect(id).expect("connect");
    c.allow_lazy_batches(true);
    let base = fresh_base();
    let key = StoreKey { vertex: v, object: 0, key: StateKey::Id(base) };
    let mut r = Replies::default();
    for n in 1..=60u64 {
        let req = Request { id: n, client: id, tag: None, key, op: StoreOp::State(StateOp::Incr(1)), reply: false };
        c.send(n, vec![req].into()).expect("send");
        // Busy (back to back), napping (idle under 2 ms) and asleep (idle longer).
        std::thread::sleep(Duration::from_micros([0, 300, 3_000][n as usize % 3]));
        if n % 20 == 0 {
            // Polls only: nothing here wakes a shard.
            let start = std::time::Instant::now();
            while r.acked.len() < n as usize && start.elapsed() < Duration::from_secs(5) {
                c.poll(&mut r).expect("poll");
                std::thread::yield_now();
            }
            assert_eq!(r.acked.len(), n as usize, "acknowledged by batch {n}");
        }
    }
    assert_eq!(read(&store, key), Some(Value::Int(60)));
    let req = Request { id: 61, client: id, tag: None, key, op: StoreOp::State(StateOp::Incr(1)), reply: false };
    c.send(61, vec![req].into()).expect("send");
    let start = std::time::Instant::now();
    while !r.acked.contains(&61) {
        c.wait(&mut r, Duration::from_secs(1)).expect("wait");
        assert!(start.elapsed() < Duration::from_secs(5), "a wait gets the acknowledgement");
    }
}

/// The client says "nothing to fire" only when asking would find nothing: no timer due, its
/// time not moved (an instance then skips the asking, once a packet); and a timer due, or a
/// time past its own, is asked for.
#[test]
fn the_client_asks_for_timers_only_when_one_may_fire() {
    let store = EmbeddedStore::start(1).expect("start store");
    let decls = [StateDecl::new("flows", Scope::per_flow(), AccessPattern::ReadWriteOften)];
    let id = InstanceId::new(3, 0);
    let conn = store.connect(id).expect("connect");
    let mut c =
        StoreClient::new(conn, id, 3, &decls, &[], ClientConfig { mode: Mode::Async, ..ClientConfig::default() });
    let key = StateKey::Unit;
    let at = |ts_ns: u64| Meta { clock: Clock::new(0, ts_ns), ts_ns, ..Meta::default() };
    c.begin_batch();
    c.begin_packet(&at(100));
    assert!(!c.may_fire(100), "nothing armed, time not moved");
    assert!(c.may_fire(101), "a time past the client's own moves it");
    c.set_timer(ObjectId(0), &key, 150);
    assert!(!c.may_fire(100), "armed, not due");
    c.begin_packet(&at(150));
    assert!(c.may_fire(150), "due");
    let mut fired = Vec::new();
    c.expired(150, 8, &mut fired);
    assert_eq!(fired.len(), 1);
    assert!(!c.may_fire(150), "fired: nothing left");
    c.end_batch();
}

/// Where nothing waits for the store (no fault tolerance), a batch's requests may wait for
/// the next batch's (a counter's sums added up across them): nothing is lost — the next batch
/// after a pause sends them, and so does a flush.
#[test]
fn batches_nobody_waits_for_go_together_and_none_is_lost() {
    let store = EmbeddedStore::start(1).expect("start store");
    let decls = [StateDecl::new("packets", Scope::global(), AccessPattern::WriteMostly)];
    let (obj, key) = (ObjectId(0), StateKey::Unit);
    let client = |index| {
        let id = InstanceId::new(3, index);
        let conn = store.connect(id).expect("connect");
        let mode = if index == 0 { Mode::Async } else { Mode::External };
        StoreClient::new(conn, id, 3, &decls, &[], ClientConfig { mode, ..ClientConfig::default() })
    };
    let (mut counting, mut reading) = (client(0), client(1));
    let batch = |c: &mut StoreClient, n: i64| {
        c.begin_batch();
        for _ in 0..n {
            c.incr_nb(obj, &key, 1).expect("incr_nb");
        }
        c.end_batch();
    };
    batch(&mut counting, 3);
    batch(&mut counting, 4);
    // Long past any wait: the next batch sends everything before it, with its own.
    std::thread::sleep(Duration::from_millis(5));
    batch(&mut counting, 2);
    // One shard takes its clients' messages in the order they came: the read follows them.
    assert_eq!(reading.get(obj, &key).expect("get"), Some(Value::Int(9)));
    batch(&mut counting, 5);
    counting.flush().expect("flush");
    assert_eq!(reading.get(obj, &key).expect("get"), Some(Value::Int(14)), "a flush sends what waits");
}
