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
        let e = WalEntry { tag: OpTag { clock: Clock::new(1, clock), seq: 0 }, key, op: StateOp::Incr(d) };
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
    let mut notes = Vec::new();
    a.conn.notifications(&mut notes).expect("notifications");
    assert!(notes.contains(&Notification::TimerFired { key: kt }), "restored timer did not fire: {notes:?}");
}
