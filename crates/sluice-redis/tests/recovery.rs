//! Store-instance failover (`sluice_store::recovery`) on Redis: a one-bucket store (one bucket
//! is one store instance, see docs/decisions.md) is wiped and rebuilt from a checkpoint, the
//! instances' write-ahead logs and a logged read. Needs `SLUICE_REDIS_URL`.

mod common;

use common::{fresh, Target};
use sluice_packet::{Clock, InstanceId};
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::client::WalEntry;
use sluice_store::recovery::{apply, plan, ReadRecord, RecoveryLog};
use sluice_store::{Backend, Connection, Notification, OpTag, Replies, Request, Response, StoreKey, StoreOp};
use std::time::{Duration, Instant};

struct Raw {
    conn: Box<dyn Connection>,
    who: InstanceId,
    next: u64,
    replies: Replies,
}

impl Raw {
    fn open(b: &dyn Backend, who: InstanceId) -> Raw {
        Raw { conn: b.connect(who).expect("connect"), who, next: 1, replies: Replies::default() }
    }

    fn call(&mut self, key: StoreKey, op: StoreOp, tag: Option<OpTag>) -> Response {
        let n = self.next;
        self.next += 1;
        let req = Request { id: n, client: self.who, tag, key, op, reply: true };
        self.conn.send(n, vec![req].into()).expect("send");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(p) = self.replies.responses.iter().position(|r| r.id == n) {
                return self.replies.responses.remove(p);
            }
            self.conn.wait(&mut self.replies, Duration::from_millis(20)).expect("wait");
        }
        panic!("no response to request {n}");
    }

    fn update(&mut self, wal: &mut Vec<WalEntry>, key: StoreKey, clock: u64, d: i64) {
        let e = WalEntry { tag: OpTag { clock: Clock::new(1, clock), seq: 0 }, key, op: StateOp::Incr(d), entry_ns: 0 };
        let r = self.call(key, StoreOp::State(e.op.clone()), Some(e.tag));
        assert!(r.result.is_ok(), "{r:?}");
        wal.push(e);
    }

    fn read(&mut self, key: StoreKey) -> ReadRecord {
        let r = self.call(key, StoreOp::State(StateOp::Get), None);
        ReadRecord { key, value: r.result.expect("get"), ts: r.ts.expect("a shared read returns a TS vector") }
    }
}

#[test]
fn wipe_and_rebuild_one_bucket() {
    let f = fresh(Target::Single, "buckets=1");
    let b = &f.backend;
    let (ia, ib) = (InstanceId::new(7, 1), InstanceId::new(7, 2));
    let k = StoreKey { vertex: 7, object: 0, key: StateKey::Id(1) };
    let kt = StoreKey { vertex: 7, object: 0, key: StateKey::Id(2) };
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let mut a = Raw::open(b, ia);
    let mut c = Raw::open(b, ib);
    a.update(&mut wa, k, 1, 1);
    c.update(&mut wb, k, 3, 4);
    a.call(kt, StoreOp::SetTimer { deadline_ns: 1000 }, None);
    let cp = b.checkpoint().expect("checkpoint");
    assert_eq!(cp.timers, vec![(kt, 1000, ia)]);
    a.update(&mut wa, k, 4, 8);
    let r = c.read(k);
    assert_eq!(r.value, Some(Value::Int(13)));
    c.update(&mut wb, k, 5, 16);
    a.update(&mut wa, k, 6, 32);

    b.wipe().expect("wipe");
    let logs = vec![
        RecoveryLog { instance: ia, wal: wa, reads: vec![], after_checkpoint: None },
        RecoveryLog { instance: ib, wal: wb, reads: vec![r], after_checkpoint: None },
    ];
    let p = plan(&cp, &logs, Vec::new());
    let stats = apply(b, &p, &cp.timers).expect("apply");
    assert_eq!((stats.values, stats.reexecuted, stats.failed), (1, 2, 0));

    let mut a = Raw::open(b, ia);
    assert_eq!(a.read(k).value, Some(Value::Int(61)));
    let dup = a.call(k, StoreOp::State(StateOp::Incr(32)), Some(OpTag { clock: Clock::new(1, 6), seq: 0 }));
    assert!(dup.replayed, "a retransmitted re-executed update is a duplicate: {dup:?}");
    assert_eq!(a.read(k).value, Some(Value::Int(61)));
    a.call(kt, StoreOp::AdvanceTime(2000), None);
    // Notifications arrive asynchronously (the connection drains them on its I/O thread).
    let mut notes = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !notes.contains(&Notification::TimerFired { key: kt }) && std::time::Instant::now() < deadline {
        a.conn.notifications(&mut notes).expect("notifications");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(notes.contains(&Notification::TimerFired { key: kt }), "restored timer did not fire: {notes:?}");
}

/// Pauses writes on the server for a while (`CLIENT PAUSE ... WRITE`), however the test ends
/// it is lifted.
struct WritesPaused(redis::Connection);

impl WritesPaused {
    fn for_ms(ms: u64) -> WritesPaused {
        let url = common::url(Target::Single);
        let mut c = redis::Client::open(url.as_str()).and_then(|c| c.get_connection()).expect("admin connection");
        redis::cmd("CLIENT").arg("PAUSE").arg(ms).arg("WRITE").query::<()>(&mut c).expect("CLIENT PAUSE");
        WritesPaused(c)
    }
}

impl Drop for WritesPaused {
    fn drop(&mut self) {
        let _ = redis::cmd("CLIENT").arg("UNPAUSE").query::<()>(&mut self.0);
    }
}

/// A store crash stops every instance's connection before the store is wiped
/// (`Connection::halt`): a batch being applied is finished and acknowledged, the batches queued
/// behind it are never applied by that connection, and the client sends them again over a new
/// one. (A connection whose thread went on applying queued batches during the wipe broke the
/// rebuild of a Redis store, docs/decisions.md "Redis round trips off the packet path".)
#[test]
fn a_halted_connection_applies_nothing_queued_and_its_batches_are_sent_again() {
    let f = fresh(Target::Single, "buckets=1");
    let b = &f.backend;
    let who = InstanceId::new(9, 1);
    let k = StoreKey { vertex: 9, object: 0, key: StateKey::Id(1) };
    let batch = |clock: u64| -> std::sync::Arc<[Request]> {
        let tag = Some(OpTag { clock: Clock::new(1, clock), seq: 0 });
        vec![Request { id: clock, client: who, tag, key: k, op: StoreOp::State(StateOp::Incr(1)), reply: false }].into()
    };
    const BATCHES: u64 = 20;
    let mut conn = b.connect(who).expect("connect");
    let mut replies = Replies::default();
    {
        let _paused = WritesPaused::for_ms(400);
        // The first batch's call waits for the pause; the others queue behind it.
        conn.send(1, batch(1)).expect("send");
        std::thread::sleep(Duration::from_millis(100));
        for n in 2..=BATCHES {
            conn.send(n, batch(n)).expect("send");
        }
        conn.halt(&mut replies).expect("halt");
    }
    let acked: Vec<u64> = replies.acked.clone();
    assert!(acked.contains(&1), "the call in progress is finished and acknowledged: {acked:?}");
    assert!((acked.len() as u64) < BATCHES, "the queued batches were applied after the halt: {acked:?}");
    let mut reader = Raw::open(b, InstanceId::new(9, 2));
    let applied = |r: &mut Raw| match r.read(k).value {
        Some(Value::Int(n)) => n as usize,
        None => 0,
        other => panic!("unexpected value {other:?}"),
    };
    assert_eq!(applied(&mut reader), acked.len(), "every batch applied is acknowledged, and only those");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(applied(&mut reader), acked.len(), "the halted connection applied something later");
    drop(conn);

    // The client continues over a new connection: the unacknowledged batches again, renumbered.
    let mut again = b.connect(who).expect("reconnect");
    let unacked: Vec<u64> = (1..=BATCHES).filter(|n| !acked.contains(n)).collect();
    for (i, n) in unacked.iter().enumerate() {
        again.send(i as u64 + 1, batch(*n)).expect("send again");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut replies = Replies::default();
    while replies.acked.len() < unacked.len() && Instant::now() < deadline {
        again.wait(&mut replies, Duration::from_millis(20)).expect("wait");
    }
    assert_eq!(replies.acked.len(), unacked.len(), "the batches sent again are acknowledged");
    assert_eq!(applied(&mut reader), BATCHES as usize, "each batch applied exactly once");
}
