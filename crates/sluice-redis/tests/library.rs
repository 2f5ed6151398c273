//! A Redis node that lacks Sluice's function library — restarted without its data, added to
//! the cluster after the backend connected, or flushed by an operator — gets it again from the
//! backend at the first call that finds it missing: the call is made again and goes through,
//! on the data path and on the admin path (checkpoints), in a cluster and on a single server.
//!
//! The tests start their own servers on loopback ports 7460-7466 (flushing the library of the
//! suite's shared servers would break the tests running beside them); they need
//! `redis-server` and `redis-cli` (scripts/test-all.sh installs them).

use sluice_packet::{Clock, InstanceId};
use sluice_redis::RedisBackend;
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, Connection, OpTag, Replies, Request, StoreKey, StoreOp};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/cluster.rs"]
mod cluster;

use cluster::{cli, is_primary, wait_until, Cluster};

const CLUSTER_PORTS: [u16; 6] = [7460, 7461, 7462, 7463, 7464, 7465];
const SINGLE_PORT: u16 = 7466;

/// Keys spread over every bucket (and so every primary) of a 16-bucket store.
const KEYS: u64 = 64;

fn key(i: u64) -> StoreKey {
    StoreKey { vertex: 5, object: 0, key: StateKey::Id(i) }
}

/// Increments every key once in one batch (tagged with `clock`); the time it took.
fn increment_all(conn: &mut dyn Connection, batch: u64, clock: u64) -> Duration {
    let started = Instant::now();
    let reqs: Vec<Request> = (0..KEYS)
        .map(|i| Request {
            id: batch * 1_000 + i,
            client: InstanceId(1),
            tag: Some(OpTag { clock: Clock::new(0, clock), seq: i as u32 }),
            key: key(i),
            op: StoreOp::State(StateOp::Incr(1)),
            reply: true,
        })
        .collect();
    conn.send(batch, reqs.into()).expect("the batch is taken");
    let mut replies = Replies::default();
    while replies.responses.len() < KEYS as usize {
        assert!(started.elapsed() < Duration::from_secs(60), "only {} answers", replies.responses.len());
        conn.wait(&mut replies, Duration::from_millis(20)).expect("wait");
    }
    for r in &replies.responses {
        assert!(r.result.is_ok(), "an increment failed: {r:?}");
    }
    started.elapsed()
}

/// The value of every key, read by one checkpoint (an admin call).
fn values(backend: &RedisBackend) -> Vec<Option<Value>> {
    let cp = backend.checkpoint().expect("a checkpoint");
    (0..KEYS).map(|i| cp.values.iter().find(|(k, _)| *k == key(i)).map(|(_, v)| v.clone())).collect()
}

/// Drops the library on the node at `port` as an operator (or an empty restart) would.
fn flush_library(port: u16) {
    assert!(cli(port, &["function", "flush"]).contains("OK"), "FUNCTION FLUSH on {port}");
    assert!(cli(port, &["function", "list"]).trim().is_empty(), "{port} still lists functions");
}

#[test]
fn a_cluster_primary_without_the_library_gets_it_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = Cluster::start(dir.path(), CLUSTER_PORTS);
    let url = format!("redis+cluster://{}?prefix=library&buckets=16", cluster.seeds());
    let backend = RedisBackend::connect(&url).expect("connect to the test cluster");
    let mut conn = backend.connect(InstanceId(1)).expect("connection");
    increment_all(conn.as_mut(), 1, 1);

    // One primary loses the library: the next batch reaches it, finds it missing, loads it
    // and goes through (without it, the calls were retried for 30 s and failed).
    let victim = cluster.a_primary();
    flush_library(victim);
    let took = increment_all(conn.as_mut(), 2, 2);
    assert!(took < Duration::from_secs(10), "the batch waited {took:?}");
    assert!(cli(victim, &["function", "list"]).contains("sluice"), "the library is back on {victim}");

    // Every primary loses it: an admin call (a checkpoint) loads it again too.
    for p in CLUSTER_PORTS.into_iter().filter(|p| is_primary(*p)) {
        flush_library(p);
    }
    for (i, v) in values(&backend).into_iter().enumerate() {
        assert_eq!(v, Some(Value::Int(2)), "key {i}: both increments, once each");
    }
    let _ = backend.clear();
}

/// A single server started by the test, killed when it ends.
struct Single(Child);

impl Drop for Single {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_single_server_without_the_library_gets_it_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &SINGLE_PORT.to_string(), "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (install redis-server)");
    let _server = Single(child);
    wait_until("the server to answer", Duration::from_secs(10), || cli(SINGLE_PORT, &["ping"]).contains("PONG"));
    let url = format!("redis://127.0.0.1:{SINGLE_PORT}?prefix=library&buckets=4");
    let backend = RedisBackend::connect(&url).expect("connect to the test server");
    let mut conn = backend.connect(InstanceId(1)).expect("connection");
    increment_all(conn.as_mut(), 1, 1);
    flush_library(SINGLE_PORT);
    increment_all(conn.as_mut(), 2, 2);
    flush_library(SINGLE_PORT);
    for (i, v) in values(&backend).into_iter().enumerate() {
        assert_eq!(v, Some(Value::Int(2)), "key {i}: both increments, once each");
    }
}
