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
use std::time::{Duration, Instant};

#[path = "support/cluster.rs"]
mod cluster;

use cluster::{cli, Cluster};

const PORTS: [u16; 6] = [7420, 7421, 7422, 7423, 7424, 7425];

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

#[test]
fn a_primary_killed_mid_run_loses_no_replicated_write() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = Cluster::start(dir.path(), PORTS);
    let url = format!("redis+cluster://{}?prefix=failover&buckets=16&replicas=1", cluster.seeds());
    let backend = RedisBackend::connect(&url).expect("connect to the test cluster");
    let mut raw =
        Raw { conn: backend.connect(InstanceId(1)).expect("connection"), next: 1, replies: Replies::default() };
    // A second process's view of the same store that only takes checkpoints (a root's node with
    // no instance of its own): nothing but its admin connection learns of the failover.
    let watcher = RedisBackend::connect(&url).expect("connect the checkpointing backend");

    const KEYS: u64 = 64;
    for i in 0..KEYS {
        incr(&mut raw, i, i + 1);
    }
    assert_eq!(watcher.checkpoint().expect("a checkpoint before the kill").values.len(), KEYS as usize);
    // The first primary dies for good, as a machine does.
    let victim = cluster.a_primary();
    cluster.kill(victim);
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
    cluster.wait_promoted(victim, Duration::from_secs(30));
    eprintln!("failover: a replica took over {:.1} s after the kill", killed.elapsed().as_secs_f64());
    // The checkpointing backend still maps the dead primary's slots to it: it reads the slot
    // map again and checkpoints from the promoted replica.
    let cp = watcher.checkpoint().expect("a checkpoint once a replica took over");
    assert_eq!(cp.values.len(), KEYS as usize, "every key is in a checkpoint taken after the failover");
    cluster.restart(victim);
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
