//! A Redis Cluster primary dies (SIGKILL) while a client writes: its replica takes over, the
//! client regroups its batches on the new slot map and goes on, and with `replicas=1` (every
//! call's writes acknowledged by a replica through `WAIT`) no acknowledged write is lost and no
//! update applies twice.
//!
//! The test starts its own cluster — three primaries with one replica each, on loopback ports
//! 7420-7425 — so that killing a node disturbs no other test; it needs `redis-server` and
//! `redis-cli` (scripts/test-all.sh installs them).

use sluice_packet::{Clock, InstanceId};
use sluice_redis::RedisBackend;
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, Connection, OpTag, Replies, Request, Response, StoreKey, StoreOp};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PORTS: [u16; 6] = [7420, 7421, 7422, 7423, 7424, 7425];

/// The cluster's server processes, killed when the test ends however it ends.
struct Cluster {
    nodes: Vec<(u16, Child)>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
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
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts (or restarts, with its cluster configuration) the node on `port`.
fn spawn_node(dir: &Path, port: u16) -> Child {
    let d = dir.join(port.to_string());
    std::fs::create_dir_all(&d).expect("node dir");
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
        .arg("--cluster-config-file")
        .arg(d.join("nodes.conf"))
        .arg("--dir")
        .arg(&d)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (install redis-server)")
}

fn start_cluster(dir: &Path) -> Cluster {
    let mut cluster = Cluster { nodes: Vec::new() };
    for p in PORTS {
        cluster.nodes.push((p, spawn_node(dir, p)));
    }
    for p in PORTS {
        wait_until(&format!("node {p} to answer"), Duration::from_secs(10), || cli(p, &["ping"]).contains("PONG"));
    }
    let addrs: Vec<String> = PORTS.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let out = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster create");
    assert!(out.status.success(), "cluster create: {}", String::from_utf8_lossy(&out.stdout));
    for p in PORTS {
        wait_until(&format!("node {p} to see the cluster ok"), Duration::from_secs(20), || {
            cli(p, &["cluster", "info"]).contains("cluster_state:ok")
        });
    }
    for p in PORTS {
        let role = cli(p, &["info", "replication"]);
        if role.contains("role:master") {
            wait_until(&format!("primary {p}'s replica to be in sync"), Duration::from_secs(20), || {
                let r = cli(p, &["info", "replication"]);
                r.contains("connected_slaves:1") && r.contains("state=online")
            });
        }
    }
    cluster
}

/// One instance's connection to the store, one request per batch.
struct Raw {
    conn: Box<dyn Connection>,
    next: u64,
    replies: Replies,
}

impl Raw {
    fn call(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Response {
        let n = self.next;
        self.next += 1;
        let req = Request { id: n, client: InstanceId(1), tag, key, op, reply: true };
        // A batch the store could not take is sent again, as the store client does.
        let deadline = Instant::now() + Duration::from_secs(60);
        while let Err(e) = self.conn.send(n, vec![req.clone()].into()) {
            assert!(Instant::now() < deadline, "request {n} never went through: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
        loop {
            if let Some(p) = self.replies.responses.iter().position(|r| r.id == n) {
                return self.replies.responses.remove(p);
            }
            assert!(Instant::now() < deadline, "no response to request {n}");
            self.conn.wait(&mut self.replies, Duration::from_millis(20)).expect("wait");
        }
    }
}

fn key(i: u64) -> StoreKey {
    StoreKey { vertex: 3, object: 0, key: StateKey::Id(i) }
}

fn incr(raw: &mut Raw, i: u64, clock: u64) {
    let tag = OpTag { clock: Clock::new(0, clock), seq: 0 };
    let r = raw.call(key(i), StoreOp::State(StateOp::Incr(1)), Some(tag));
    assert!(r.result.is_ok(), "increment of key {i}: {r:?}");
}

fn pid_of(port: u16) -> Option<u32> {
    let info = cli(port, &["info", "server"]);
    info.lines().find_map(|l| l.strip_prefix("process_id:")).and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_primary_killed_mid_run_loses_no_replicated_write() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = start_cluster(dir.path());
    let seeds: Vec<String> = PORTS.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let url = format!("redis+cluster://{}?prefix=failover&buckets=16&replicas=1", seeds.join(","));
    let backend = RedisBackend::connect(&url).expect("connect to the test cluster");
    let mut raw =
        Raw { conn: backend.connect(InstanceId(1)).expect("connection"), next: 1, replies: Replies::default() };

    const KEYS: u64 = 64;
    for i in 0..KEYS {
        incr(&mut raw, i, i + 1);
    }
    // The first primary dies for good, as a machine does.
    let victim = *PORTS.iter().find(|p| cli(**p, &["info", "replication"]).contains("role:master")).expect("a primary");
    let pid = pid_of(victim).expect("the primary's pid");
    let node = cluster.nodes.iter_mut().find(|(p, _)| *p == victim).expect("its process");
    assert_eq!(node.1.id(), pid, "the process answering on {victim} is the one started");
    node.1.kill().expect("SIGKILL the primary");
    let _ = node.1.wait();
    let killed = Instant::now();

    // Every key once more, while the cluster fails over: the calls for the dead primary's
    // slots wait for its replica to take over, and then (replicas=1) for the new primary to
    // have a replica of its own, which it gets when the dead machine comes back.
    let writer = std::thread::spawn(move || {
        for i in 0..KEYS {
            incr(&mut raw, i, KEYS + i + 1);
        }
        raw
    });
    let survivors: Vec<u16> = PORTS.iter().copied().filter(|p| *p != victim).collect();
    let promoted = || {
        survivors.iter().any(|p| {
            let r = cli(*p, &["info", "replication"]);
            r.contains("role:master") && r.contains("connected_slaves:0")
        })
    };
    wait_until("a replica to be promoted", Duration::from_secs(30), promoted);
    eprintln!("failover: a replica took over {:.1} s after the kill", killed.elapsed().as_secs_f64());
    node.1 = spawn_node(dir.path(), victim);
    let mut raw = writer.join().expect("the writer");
    eprintln!("failover: the writes were through {:.1} s after the kill", killed.elapsed().as_secs_f64());
    assert!(cli(victim, &["info", "replication"]).contains("role:slave"), "the restarted node rejoined as a replica");
    for i in 0..KEYS {
        let r = raw.call(key(i), StoreOp::State(StateOp::Get), None);
        assert_eq!(r.result, Ok(Some(Value::Int(2))), "key {i}: acknowledged writes survive, and apply once");
    }
    // An update sent again after the failover (its first answer lost) applies once.
    let again = OpTag { clock: Clock::new(0, KEYS + 1), seq: 0 };
    let r = raw.call(key(0), StoreOp::State(StateOp::Incr(1)), Some(again));
    assert!(r.replayed, "a duplicate is answered from the per-clock log: {r:?}");
    let r = raw.call(key(0), StoreOp::State(StateOp::Get), None);
    assert_eq!(r.result, Ok(Some(Value::Int(2))));
    let _ = backend.clear();
}
