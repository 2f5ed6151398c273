//! With `replicas=1`, the store's own writes — a fence, a rebuilt store, a wipe — count once a
//! replica holds them, as every instance's writes do: a primary that dies just after a fence
//! must not hand its slots to a replica that lets the fenced instance (slow, not dead) write
//! again. Shown with every replica stopped (SIGSTOP): none of those calls returns until the
//! replicas run again; then each does, and the fence refuses the old epoch.
//!
//! The test starts its own cluster — three primaries with one replica each, on loopback ports
//! 7470-7475 — so that stopping its nodes disturbs no other test; it needs `redis-server` and
//! `redis-cli` (scripts/test-all.sh installs them).

use sluice_packet::{Clock, InstanceId};
use sluice_redis::RedisBackend;
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, Checkpoint, Replies, Request, StoreError, StoreKey, StoreOp};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "support/cluster.rs"]
mod cluster;

use cluster::{is_primary, pid_of, Cluster};

const PORTS: [u16; 6] = [7470, 7471, 7472, 7473, 7474, 7475];

/// How long the replicas stay stopped while a call waits for them: longer than one `WAIT`
/// (2 s), so a call that waited once and gave up would show.
const STOPPED: Duration = Duration::from_millis(2_500);

/// Sends `signal` (`-STOP`, `-CONT`) to the processes `pids` (asked for before: a stopped
/// server answers nothing).
fn signal(pids: &[u32], signal: &str) {
    for pid in pids {
        let ok = Command::new("kill").arg(signal).arg(pid.to_string()).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {signal} {pid}");
    }
}

/// Runs `call` with every replica stopped: it must not have returned after [`STOPPED`]; with
/// the replicas running again it must return, and its result is given back.
fn with_replicas_stopped<T: Send + 'static>(
    replicas: &[u32],
    what: &str,
    call: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> T {
    signal(replicas, "-STOP");
    let (tx, rx) = mpsc::channel();
    let stopped = Instant::now();
    let caller = std::thread::spawn(move || {
        let _ = tx.send(call());
    });
    let early = rx.recv_timeout(STOPPED);
    // Running again before any assertion, so a failure leaves no stopped server behind.
    signal(replicas, "-CONT");
    assert!(
        early.is_err(),
        "{what} returned {:.1} s after every replica stopped: it did not wait for one to hold it",
        stopped.elapsed().as_secs_f64()
    );
    let result = rx.recv_timeout(Duration::from_secs(40)).unwrap_or_else(|_| panic!("{what} never returned"));
    caller.join().expect("the calling thread");
    result.unwrap_or_else(|e| panic!("{what}, once the replicas ran again: {e}"))
}

fn key(i: u64) -> StoreKey {
    StoreKey { vertex: 4, object: 0, key: StateKey::Id(i) }
}

#[test]
fn admin_writes_count_once_a_replica_holds_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster = Cluster::start(dir.path(), PORTS);
    let url = format!("redis+cluster://{}?prefix=admin&buckets=16&replicas=1", cluster.seeds());
    let backend = std::sync::Arc::new(RedisBackend::connect(&url).expect("connect to the test cluster"));
    let replicas: Vec<u32> =
        PORTS.iter().copied().filter(|p| !is_primary(*p)).map(|p| pid_of(p).expect("a replica's pid")).collect();
    assert_eq!(replicas.len(), 3, "three replicas");

    // A fence of instance 1 below epoch 2.
    let b = backend.clone();
    with_replicas_stopped(&replicas, "the fence", move || b.fence(InstanceId(1), 2));
    let mut old = backend.connect_at(InstanceId(1), 1).expect("a connection of the fenced epoch");
    let req = Request {
        id: 1,
        client: InstanceId(1),
        tag: Some(sluice_store::OpTag { clock: Clock::new(0, 1), seq: 0 }),
        key: key(1),
        op: StoreOp::State(StateOp::Set(Value::Int(1))),
        reply: true,
    };
    let sent = old.send(1, vec![req].into());
    let mut replies = Replies::default();
    let answered = sent.and_then(|_| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while replies.responses.is_empty() && Instant::now() < deadline {
            old.wait(&mut replies, Duration::from_millis(50))?;
        }
        Ok(())
    });
    assert!(
        matches!(&answered, Err(StoreError::Fenced { .. })),
        "a write of the fenced epoch is refused: {answered:?}, {:?}",
        replies.responses
    );

    // A store rebuilt from a checkpoint, then wiped.
    let cp = Checkpoint { values: (0..8).map(|i| (key(i), Value::Int(i as i64))).collect(), ..Checkpoint::default() };
    let b = backend.clone();
    with_replicas_stopped(&replicas, "the restore", move || b.restore(&cp));
    assert_eq!(backend.checkpoint().expect("a checkpoint").values.len(), 8, "the restored values are there");
    let b = backend.clone();
    with_replicas_stopped(&replicas, "the wipe", move || b.wipe());
    assert!(backend.checkpoint().expect("a checkpoint").values.is_empty(), "the wipe left nothing");
}
