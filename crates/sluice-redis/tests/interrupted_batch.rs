//! A client dies between the calls of a batch that spans Redis Cluster nodes: the nodes it
//! reached applied their part, the others did not. Its replacement, taking over
//! (`Backend::takeover`, which calls `Backend::finish_interrupted_batch` first), finishes the
//! batch from the intent the first call stored, before it reads anything; the updates applied
//! before are not applied twice.
//!
//! To stop the client exactly between two calls, the test pauses writes on one node
//! (`CLIENT PAUSE WRITE`) that does not keep the intent, runs the client in a child process (this
//! test binary run again), waits until the intent is stored and kills the child. The test uses
//! the development cluster (`SLUICE_REDIS_CLUSTER_URL`) and is the only test of its binary, so
//! the pause disturbs no other test.

mod common;

use common::{fresh, url, Target};
use sluice_packet::{Clock, InstanceId};
use sluice_redis::codec::{bucket_hash, encode_key};
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, Connection, OpTag, Replies, Request, StoreKey, StoreOp};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SLUICE_INTERRUPTED_BATCH_CHILD";
const READY: &str = "child: connected";
const CLIENT: InstanceId = InstanceId(7);
const KEYS: u64 = 24;
const BUCKETS: u64 = 16;

fn key(i: u64) -> StoreKey {
    StoreKey { vertex: 3, object: 0, key: StateKey::Id(i) }
}

/// Deadline of the timer the batch arms on key `i`.
fn timer_deadline(i: u64) -> u64 {
    1_000_000 + i
}

/// The batch: one tagged increment of every key (one packet's updates), then a timer armed on
/// every key, untagged, as a client mirrors the timers its packets armed at the end of a batch.
fn batch() -> Vec<Request> {
    let updates = (0..KEYS).map(|i| Request {
        id: i,
        client: CLIENT,
        tag: Some(OpTag { clock: Clock::new(0, 1), seq: i as u32 }),
        key: key(i),
        op: StoreOp::State(StateOp::Incr(1)),
        reply: false,
    });
    let timers = (0..KEYS).map(|i| Request {
        id: KEYS + i,
        client: CLIENT,
        tag: None,
        key: key(i),
        op: StoreOp::SetTimer { deadline_ns: timer_deadline(i) },
        reply: false,
    });
    updates.chain(timers).collect()
}

/// The timers the store holds for the test's client, by key index, sorted.
fn timers(backend: &dyn Backend) -> Vec<(u64, u64)> {
    let cp = backend.checkpoint().expect("a checkpoint");
    let mut mine: Vec<(u64, u64)> = cp
        .timers
        .into_iter()
        .filter(|(k, _, owner)| *owner == CLIENT && k.vertex == 3)
        .filter_map(|(k, d, _)| match k.key {
            StateKey::Id(i) => Some((i, d)),
            _ => None,
        })
        .collect();
    mine.sort_unstable();
    mine
}

/// The `host:port` of every node of the development cluster.
fn nodes() -> Vec<String> {
    let u = url(Target::Cluster);
    let list = u.trim_start_matches("redis+cluster://");
    let list = list.split('?').next().unwrap_or_default();
    list.split(',').map(str::to_string).collect()
}

fn connection(node: &str) -> redis::Connection {
    redis::Client::open(format!("redis://{node}"))
        .and_then(|c| c.get_connection())
        .unwrap_or_else(|e| panic!("connect to {node}: {e}"))
}

/// The node serving the slot of `key` (waiting, up to 20 s, for a cluster that has just
/// started to agree on its slots).
fn node_of(nodes: &[String], key: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut errors = Vec::new();
        for n in nodes {
            match redis::cmd("EXISTS").arg(key).query::<i64>(&mut connection(n)) {
                Ok(_) => return n.clone(),
                Err(e) => errors.push(format!("{n}: {e}")),
            }
        }
        assert!(Instant::now() < deadline, "no node serves {key}: {errors:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Un-pauses the node however the test ends, and kills the child.
struct Paused {
    node: String,
    child: Option<Child>,
}

impl Drop for Paused {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        // No panic here: this may run while the test unwinds.
        if let Ok(mut c) = redis::Client::open(format!("redis://{}", self.node)).and_then(|c| c.get_connection()) {
            let _: redis::RedisResult<()> = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut c);
        }
    }
}

fn get(conn: &mut dyn Connection, n: u64, k: StoreKey) -> Option<Value> {
    let req = Request {
        id: 1000 + n,
        client: InstanceId(99),
        tag: None,
        key: k,
        op: StoreOp::State(StateOp::Get),
        reply: true,
    };
    conn.send(n, vec![req].into()).expect("read");
    let mut replies = Replies::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        conn.poll(&mut replies).expect("poll");
        if let Some(r) = replies.responses.iter().find(|r| r.id == 1000 + n) {
            return r.result.clone().expect("a read succeeds");
        }
        assert!(Instant::now() < deadline, "no answer to a read");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_batch_left_half_applied_is_finished_by_the_replacement() {
    if let Ok(full) = std::env::var(CHILD_ENV) {
        // The child: the client that dies in the middle of its batch.
        let backend = sluice_redis::RedisBackend::connect(&full).expect("child: connect");
        let mut conn = backend.connect(CLIENT).expect("child: connection");
        // Connecting loads the function library on every node: before the pause.
        println!("{READY}");
        let mut go = String::new();
        let _ = std::io::stdin().read_line(&mut go);
        let _ = conn.send(1, batch().into());
        // The connection applies it on its own thread: wait for it to be applied (the parent
        // kills this process while one node is paused, half-way).
        let mut replies = Replies::default();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !replies.acked.contains(&1) && Instant::now() < deadline {
            let _ = conn.wait(&mut replies, Duration::from_millis(100));
        }
        // Only reached if the pause ended before the kill: the parent then fails.
        std::process::exit(3);
    }
    let store = fresh(Target::Cluster, &format!("buckets={BUCKETS}"));
    let prefix = store.backend.prefix().to_string();
    let nodes = nodes();
    let tag = |b: u64| format!("{{{prefix}:{b}}}");
    let intent_key = format!("{}I", tag(bucket_hash(CLIENT.0.to_string().as_bytes()) % BUCKETS));
    let intent_node = node_of(&nodes, &intent_key);
    let node_of_key = |i: u64| node_of(&nodes, &tag(bucket_hash(&encode_key(&key(i))) % BUCKETS));
    let placed: Vec<String> = (0..KEYS).map(node_of_key).collect();
    let stopped = placed.iter().find(|n| **n != intent_node).expect("a key on another node than the intent's").clone();
    assert!(placed.contains(&intent_node), "a key on the intent's node too");

    let full =
        format!("{}?prefix={prefix}&buckets={BUCKETS}", url(Target::Cluster).split('?').next().unwrap_or_default());
    let exe = std::env::current_exe().expect("this test binary");
    let mut child = Command::new(exe)
        .args(["a_batch_left_half_applied_is_finished_by_the_replacement", "--exact", "--nocapture"])
        .env(CHILD_ENV, &full)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the child");
    let mut stdin = child.stdin.take().expect("the child's stdin");
    let stdout = child.stdout.take().expect("the child's stdout");
    let mut paused = Paused { node: stopped.clone(), child: Some(child) };
    let ready = BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l.trim() == READY);
    assert!(ready, "the child connected");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(30_000)
        .arg("WRITE")
        .query(&mut connection(&stopped))
        .expect("pause writes on one node");
    writeln!(stdin, "go").expect("tell the child to send");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stored: bool = redis::cmd("HEXISTS")
            .arg(&intent_key)
            .arg(CLIENT.0.to_string())
            .query(&mut connection(&intent_node))
            .expect("read the intent");
        if stored {
            break;
        }
        assert!(Instant::now() < deadline, "the child never stored its intent");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let the child reach the paused node, then kill it there.
    std::thread::sleep(Duration::from_millis(300));
    if let Some(c) = &mut paused.child {
        c.kill().expect("kill the child");
        let _ = c.wait();
    }
    paused.child = None;
    drop(paused);
    std::thread::sleep(Duration::from_millis(200));

    let mut reader = store.backend.connect(InstanceId(99)).expect("reader");
    let mut n = 0;
    let mut read = |k| {
        n += 1;
        get(reader.as_mut(), n, k)
    };
    let before: Vec<Option<Value>> = (0..KEYS).map(|i| read(key(i))).collect();
    let armed_before = timers(&store.backend);
    for (i, v) in before.iter().enumerate() {
        let armed = armed_before.iter().any(|(k, _)| *k == i as u64);
        if placed[i] == intent_node {
            assert_eq!(*v, Some(Value::Int(1)), "key {i}, on the intent's node, was applied with the intent");
        } else if placed[i] == stopped {
            assert_eq!(*v, None, "key {i}, on the paused node, was not applied: the batch is half applied");
            assert!(!armed, "key {i}'s timer, on the paused node, was not armed");
        }
    }

    let finished = store.backend.finish_interrupted_batch(CLIENT).expect("finish the batch");
    assert_eq!(finished, 2 * KEYS as usize, "the intent held the batch's updates and timers");
    for i in 0..KEYS {
        assert_eq!(read(key(i)), Some(Value::Int(1)), "key {i}: applied once");
    }
    // The timers too: the packets whose updates were applied count as processed, and their
    // replacement would never arm them again (docs/decisions.md, "A batch that spans Redis
    // nodes").
    let every: Vec<(u64, u64)> = (0..KEYS).map(|i| (i, timer_deadline(i))).collect();
    assert_eq!(timers(&store.backend), every, "every timer of the batch is armed");
    assert_eq!(store.backend.finish_interrupted_batch(CLIENT).expect("look again"), 0, "the intent is cleared");
    // The replacement running the packet again: every update is answered from the log.
    let mut again = store.backend.connect(CLIENT).expect("the replacement's connection");
    again.send(1, batch().into()).expect("the batch again");
    for i in 0..KEYS {
        assert_eq!(read(key(i)), Some(Value::Int(1)), "key {i}: still applied once");
    }
    assert_eq!(timers(&store.backend), every, "the timers as the batch left them");
}
