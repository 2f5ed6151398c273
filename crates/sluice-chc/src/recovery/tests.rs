use super::*;
use sluice_packet::InstanceId;
use sluice_state::{AccessPattern, Scope};
use sluice_store::client::WalEntry;
use sluice_store::OpTag;

fn key(object: u16, k: u64) -> StoreKey {
    StoreKey { vertex: 0, object, key: StateKey::Id(k) }
}

fn entry(object: u16, clock: u64) -> WalEntry {
    WalEntry {
        tag: OpTag { clock: Clock::new(0, clock), seq: 0 },
        key: key(object, 1),
        op: StateOp::Incr(1),
        entry_ns: 0,
    }
}

fn log(instance: u32, wal: Vec<WalEntry>) -> RecoveryLog {
    RecoveryLog { instance: InstanceId(instance), wal, reads: Vec::new(), after_checkpoint: None }
}

#[test]
fn a_clones_repeats_of_updates_in_the_checkpoint_are_not_reexecuted() {
    // The straggler (1) applied clocks 1-2 before the checkpoint; its clone (2) repeated 2 after
    // its own checkpoint position and did 3.
    let mut logs = vec![log(1, vec![entry(0, 1), entry(0, 2)]), log(2, vec![entry(0, 1), entry(0, 2), entry(0, 3)])];
    let cp = Checkpoint {
        ts: vec![(InstanceId(1), Clock::new(0, 2)), (InstanceId(2), Clock::new(0, 1))],
        ..Checkpoint::default()
    };
    without_baseline_duplicates(&mut logs, &cp);
    let clocks: Vec<u64> = logs[1].wal.iter().map(|e| e.tag.clock.seq()).collect();
    assert_eq!(clocks, vec![1, 3]);
    assert_eq!(logs[0].wal.len(), 2);
}

#[test]
fn in_flight_marks_cover_only_logged_clocks_and_repeat_recorded_values() {
    let mut rec = entry(0, 2);
    rec.op = StateOp::Record(Value::Int(77));
    let logs = vec![log(1, vec![entry(0, 1), rec, entry(0, 3)])];
    let reqs = in_flight_marks(&logs, |c| c.seq() >= 2);
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].key.object, NONDET_OBJECT);
    assert!(matches!(&reqs[0].op, StoreOp::State(StateOp::Record(Value::Int(77)))));
    assert_eq!(reqs[1].key.object, SCRATCH_OBJECT);
    assert!(reqs.iter().all(|r| r.tag.is_some() && !r.reply));
}

#[test]
fn per_flow_values_come_from_instances_and_deleted_ones_stay_gone() {
    let decls = vec![vec![
        StateDecl::new("shared", Scope::global(), AccessPattern::ReadWriteOften),
        StateDecl::new("flow", Scope::per_flow(), AccessPattern::ReadWriteOften),
    ]];
    assert!(!is_per_flow(&decls, &key(0, 1)) && is_per_flow(&decls, &key(1, 1)));
    let cp = Checkpoint {
        values: vec![(key(0, 1), Value::Int(5)), (key(1, 1), Value::Int(1)), (key(1, 2), Value::Int(2))],
        ..Checkpoint::default()
    };
    let mut logs = vec![log(1, vec![WalEntry { key: key(1, 1), ..entry(1, 4) }])];
    // The instance holds flow 1 at 9 and knows flow 2 was deleted.
    let per_flow = vec![(key(1, 1), Some(Value::Int(9))), (key(1, 2), None)];
    let p = rebuild_plan(&cp, &mut logs, per_flow, &decls, &|_| 0);
    assert!(p.replay.is_empty(), "per-flow updates are not re-executed");
    assert!(p.values.contains(&(key(1, 1), Value::Int(9))));
    assert!(p.values.contains(&(key(0, 1), Value::Int(5))));
    assert!(!p.values.iter().any(|(k, _)| *k == key(1, 2)));
}

#[test]
fn per_flow_updates_no_instance_holds_a_copy_of_are_reexecuted() {
    let decls = vec![vec![StateDecl::new("flow", Scope::per_flow(), AccessPattern::ReadWriteOften)]];
    let mut logs = vec![log(1, vec![WalEntry { key: key(0, 7), ..entry(0, 3) }])];
    let p = rebuild_plan(&Checkpoint::default(), &mut logs, Vec::new(), &decls, &|_| 0);
    assert_eq!(p.replay.len(), 1, "the flow moved away from its writer: its log rebuilds it");
}

#[test]
fn several_instances_updates_are_reexecuted_in_the_order_their_packets_entered() {
    // Two roots: root 1's clock 1 entered before root 0's clock 5, which the clocks' own
    // order (root by root) would put first. Two instances set one shared value without
    // waiting (non-blocking `set`s do not commute).
    let set = |root: u8, seq: u64, entry_ns: u64, v: i64| WalEntry {
        tag: OpTag { clock: Clock::new(root, seq), seq: 0 },
        key: key(0, 1),
        op: StateOp::Set(Value::Int(v)),
        entry_ns,
    };
    let decls = vec![vec![StateDecl::new("shared", Scope::global(), AccessPattern::WriteMostly)]];
    let mut logs = vec![log(1, vec![set(0, 5, 200, 50)]), log(2, vec![set(1, 1, 100, 11)])];
    let by_entry = entry_times(&logs);
    assert_eq!((by_entry(Clock::new(0, 5)), by_entry(Clock::new(1, 1)), by_entry(Clock::new(0, 9))), (200, 100, 0));
    let p = rebuild_plan(&Checkpoint::default(), &mut logs, Vec::new(), &decls, &by_entry);
    let order: Vec<Clock> = p.replay.iter().map(|(_, e)| e.tag.clock).collect();
    assert_eq!(order, vec![Clock::new(1, 1), Clock::new(0, 5)], "the last set to enter is the last applied");
    let by_clock = rebuild_plan(&Checkpoint::default(), &mut logs, Vec::new(), &decls, &|_| 0);
    let order: Vec<Clock> = by_clock.replay.iter().map(|(_, e)| e.tag.clock).collect();
    assert_eq!(order, vec![Clock::new(0, 5), Clock::new(1, 1)], "without entry times, root by root");
}
