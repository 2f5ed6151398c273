//! A node busy for a while (another client's script running past the busy threshold) makes
//! `RedisBackend::connect` and an instance's calls wait, not fail. Each test starts its own
//! `redis-server` on a free loopback port with a busy threshold of 100 ms, so that blocking it
//! disturbs no other test.

use sluice_packet::InstanceId;
use sluice_redis::RedisBackend;
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, OpTag, Replies, Request, StoreKey, StoreOp};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/cluster.rs"]
mod cluster;

use cluster::{cli, wait_until};

/// The server process, killed when the test ends however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A script that keeps the server to itself for `ms` milliseconds.
fn busy_script(ms: u64) -> String {
    format!(
        "local t = redis.call('TIME') local start = t[1] * 1000 + t[2] / 1000 \
         repeat t = redis.call('TIME') until t[1] * 1000 + t[2] / 1000 - start >= {ms} return 'done'"
    )
}

/// A server of the test's own on a free port, busy (answering `BUSY`) 100 ms into a script.
fn start_server(tag: &str) -> (Server, u16, PathBuf) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let dir = std::env::temp_dir().join(format!("sluice-redis-busy-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .args(["--busy-reply-threshold", "100", "--dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/test-all.sh installs it)");
    let server = Server(child);
    wait_until("the server to answer", Duration::from_secs(10), || cli(port, &["ping"]).contains("PONG"));
    (server, port, dir)
}

/// Runs a 1.5 s script on the server from another client and returns once the server says
/// it is busy; the handle gives the script's reply.
fn keep_busy(port: u16) -> std::thread::JoinHandle<String> {
    let script = std::thread::spawn(move || cli(port, &["eval", &busy_script(1_500), "0"]));
    wait_until("the server to say it is busy", Duration::from_secs(5), || cli(port, &["ping"]).contains("BUSY"));
    script
}

#[test]
fn connect_waits_for_a_node_busy_with_another_clients_script() {
    let (_server, port, dir) = start_server("connect");
    let script = keep_busy(port);
    let asked = Instant::now();
    let backend = RedisBackend::connect(&format!("redis://127.0.0.1:{port}?prefix=busy"));
    let waited = asked.elapsed();
    let script_reply = script.join().expect("the script's client");

    assert!(script_reply.contains("done"), "the long script ran to its end: {script_reply:?}");
    let backend = backend.unwrap_or_else(|e| panic!("connect to a node busy for a while must wait, not fail: {e}"));
    assert!(waited >= Duration::from_millis(200), "connect went through while the node was busy ({waited:?})");
    backend.clear().expect("the store works once connected");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_update_sent_while_the_node_is_busy_applies_once_when_it_is_free_again() {
    let (_server, port, dir) = start_server("call");
    let backend = RedisBackend::connect(&format!("redis://127.0.0.1:{port}?prefix=busy")).expect("connect");
    let mut conn = backend.connect(InstanceId(1)).expect("an instance's connection");
    let key = StoreKey { vertex: 1, object: 0, key: StateKey::Id(7) };
    let mut call = |id: u64, op: StateOp, tag: Option<OpTag>| {
        let req = Request { id, client: InstanceId(1), tag, key, op: StoreOp::State(op), reply: true };
        conn.send(id, vec![req].into()).expect("the batch is taken");
        let mut replies = Replies::default();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(r) = replies.responses.iter().find(|r| r.id == id) {
                return r.result.clone();
            }
            assert!(Instant::now() < deadline, "no answer to request {id}");
            conn.wait(&mut replies, Duration::from_millis(20)).unwrap_or_else(|e| panic!("request {id}: {e}"));
        }
    };
    // Untagged: sent twice, it would count twice.
    assert_eq!(call(1, StateOp::Incr(1), None), Ok(Some(Value::Int(1))));
    let script = keep_busy(port);
    let asked = Instant::now();
    let during = call(2, StateOp::Incr(1), None);
    let waited = asked.elapsed();
    let script_reply = script.join().expect("the script's client");

    assert!(script_reply.contains("done"), "the long script ran to its end: {script_reply:?}");
    assert_eq!(during, Ok(Some(Value::Int(2))), "an update sent to a busy node applies once it is free");
    assert!(waited >= Duration::from_millis(200), "the update went through while the node was busy ({waited:?})");
    assert_eq!(call(3, StateOp::Get, None), Ok(Some(Value::Int(2))), "and only once");
    let _ = std::fs::remove_dir_all(&dir);
}
