//! A node busy for a while (another client's script running past the busy threshold) makes
//! `RedisBackend::connect` wait, not fail. The test starts its own `redis-server` on a free
//! loopback port with a busy threshold of 100 ms, so that blocking it disturbs no other test.

use sluice_redis::RedisBackend;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server process, killed when the test ends however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (install redis-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A script that keeps the server to itself for `ms` milliseconds.
fn busy_script(ms: u64) -> String {
    format!(
        "local t = redis.call('TIME') local start = t[1] * 1000 + t[2] / 1000 \
         repeat t = redis.call('TIME') until t[1] * 1000 + t[2] / 1000 - start >= {ms} return 'done'"
    )
}

#[test]
fn connect_waits_for_a_node_busy_with_another_clients_script() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let dir = std::env::temp_dir().join(format!("sluice-redis-busy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .args(["--busy-reply-threshold", "100", "--dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/test-all.sh installs it)");
    let _server = Server(child);
    wait_until("the server to answer", Duration::from_secs(10), || cli(port, &["ping"]).contains("PONG"));

    let script = std::thread::spawn(move || cli(port, &["eval", &busy_script(1_500), "0"]));
    wait_until("the server to say it is busy", Duration::from_secs(5), || cli(port, &["ping"]).contains("BUSY"));
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
