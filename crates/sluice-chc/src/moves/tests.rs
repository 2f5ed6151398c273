use super::*;
use std::collections::HashSet;

fn mv(from: usize, to: usize, retire: bool) -> Move {
    Move { from: NodeId(from), to: NodeId(to), keys: vec![1, 2], retire_from: retire, tag: 0 }
}

#[test]
fn a_move_waits_for_its_barrier() {
    let mut m = Moves::default();
    let MoveStart::Barrier { id } = m.start(mv(0, 1, false), true) else { panic!("protocol on") };
    assert!(m.busy());
    assert_eq!(m.get(id).map(|x| x.keys.clone()), Some(vec![1, 2]));
    let done = m.barrier_passed(id).unwrap();
    assert_eq!((done.from, done.to), (NodeId(0), NodeId(1)));
    assert!(!m.busy());
    assert!(m.barrier_passed(id).is_none(), "a barrier passes once");
}

#[test]
fn without_the_protocol_the_splitter_just_switches() {
    let mut m = Moves::default();
    assert_eq!(m.start(mv(0, 1, true), false), MoveStart::Switched);
    assert!(!m.busy());
}

#[test]
fn ids_stay_stable_while_moves_overlap() {
    let mut m = Moves::default();
    let MoveStart::Barrier { id: a } = m.start(mv(0, 1, false), true) else { panic!() };
    let MoveStart::Barrier { id: b } = m.start(mv(2, 1, true), true) else { panic!() };
    assert!(m.barrier_passed(a).is_some());
    assert!(m.busy());
    assert!(m.barrier_passed(b).unwrap().retire_from);
}

#[test]
fn a_crash_on_either_side_is_repaired_on_the_replacement() {
    let mut m = Moves::default();
    let MoveStart::Barrier { id: a } = m.start(mv(0, 1, false), true) else { panic!() };
    let MoveStart::Barrier { id: b } = m.start(mv(2, 0, false), true) else { panic!() };
    let repairs = m.replace(NodeId(0), NodeId(9));
    assert_eq!(repairs, vec![MoveRepair::Barrier(a), MoveRepair::Hold(b)]);
    assert_eq!(m.get(a).map(|x| x.from), Some(NodeId(9)));
    assert_eq!(m.get(b).map(|x| x.to), Some(NodeId(9)));
}

#[test]
fn flows_moving_out_stay_the_old_instances_until_the_barrier() {
    let mut m = Moves::default();
    let MoveStart::Barrier { id } = m.start(mv(0, 1, false), true) else { panic!() };
    assert!(m.moving_out(NodeId(0), 1) && m.moving_out(NodeId(0), 2));
    assert!(!m.moving_out(NodeId(0), 3), "not a moved flow");
    assert!(!m.moving_out(NodeId(1), 1), "moving in, not out");
    // The old instance fails: its replacement is where the flows' replayed packets go.
    assert_eq!(m.replace(NodeId(0), NodeId(7)), vec![MoveRepair::Barrier(id)]);
    assert!(m.moving_out(NodeId(7), 1) && !m.moving_out(NodeId(0), 1));
    assert!(m.barrier_passed(id).is_some());
    assert!(!m.moving_out(NodeId(7), 1), "the barrier passed: the flows are the new instance's");
}

#[test]
fn a_move_away_from_a_moves_new_instance_waits_for_that_move() {
    let mut m = Moves::default();
    let MoveStart::Barrier { id: into } = m.start(mv(0, 1, false), true) else { panic!() };
    // Instance 1 is scaled in before it took flows 1 and 2 over: its barrier must come after
    // the packets the first move releases there.
    let MoveStart::AfterMovesIn { id: away } = m.start(mv(1, 2, true), true) else { panic!("deferred") };
    assert!(m.barriers_due().is_empty(), "the move into 1 is still in progress");
    // A crash of instance 1 meanwhile: the deferred barrier was never queued, nothing to redo.
    assert_eq!(m.replace(NodeId(1), NodeId(7)), vec![MoveRepair::Hold(into)]);
    let done = m.complete(into).unwrap();
    assert_eq!(done.moved.to, NodeId(7));
    assert_eq!(done.barriers_due, vec![(NodeId(7), away)], "at the replacement, behind the released packets");
    assert!(m.barriers_due().is_empty(), "due once");
    assert_eq!(m.get(away).map(|x| x.from), Some(NodeId(7)));
    assert_eq!(m.moving_out_of(NodeId(7)), vec![1, 2]);
}

#[test]
fn a_move_of_other_flows_does_not_wait() {
    let mut m = Moves::default();
    let MoveStart::Barrier { .. } = m.start(mv(0, 1, false), true) else { panic!() };
    let other = Move { keys: vec![3], ..mv(1, 2, false) };
    assert!(matches!(m.start(other, true), MoveStart::Barrier { .. }));
}

#[test]
fn an_instance_whose_flows_are_all_moving_out_goes_with_the_last_move() {
    let mut m = Moves::default();
    assert!(!m.retire_when_moved_out(NodeId(0)), "nothing moving out: retire now");
    let MoveStart::Barrier { id: a } = m.start(mv(0, 1, false), true) else { panic!() };
    let MoveStart::Barrier { id: b } = m.start(Move { keys: vec![3], ..mv(0, 2, false) }, true) else { panic!() };
    assert!(m.retire_when_moved_out(NodeId(0)));
    assert!(m.replace(NodeId(0), NodeId(5)).len() == 2);
    assert!(!m.barrier_passed(a).unwrap().retire_from, "a move out of it is left");
    assert!(m.barrier_passed(b).unwrap().retire_from, "the last one retires the replacement");
}

#[test]
fn a_scale_in_retires_only_after_every_move_away_completed() {
    let mut m = Moves::default();
    let MoveStart::Barrier { id: a } = m.start(mv(0, 1, false), true) else { panic!() };
    let MoveStart::Barrier { id: b } = m.start(Move { keys: vec![3], ..mv(0, 2, true) }, true) else { panic!() };
    // The scale-in's barrier passes first (say the other one waits for a replay).
    assert!(!m.barrier_passed(b).unwrap().retire_from, "move a still needs the old instance");
    assert!(m.barrier_passed(a).unwrap().retire_from);
}

#[test]
fn a_scale_in_hands_over_flows_received_and_moving_in_but_not_moving_out() {
    let mut m = Moves::default();
    let MoveStart::Barrier { .. } = m.start(mv(0, 1, false), true) else { panic!() };
    let MoveStart::Barrier { .. } = m.start(Move { keys: vec![5], ..mv(1, 2, false) }, true) else { panic!() };
    let received: HashSet<u64> = [4, 5].into_iter().collect();
    let mut got: Vec<u64> = m.flows_to_hand_over(NodeId(1), &received).into_iter().collect();
    got.sort_unstable();
    assert_eq!(got, vec![1, 2, 4]);
}

#[test]
fn a_move_of_no_flows_still_holds_its_old_instance_back_from_retiring() {
    // A move of no flows (the old instance had none) still has a barrier in the old instance's
    // queue: a scale-in of that instance waits for it rather than drop it with the queue.
    let mut m = Moves::default();
    let empty = Move { from: NodeId(2), to: NodeId(0), keys: Vec::new(), retire_from: false, tag: 0 };
    let MoveStart::Barrier { id } = m.start(empty, true) else { panic!("barrier") };
    assert!(m.retire_when_moved_out(NodeId(2)), "retired with the move");
    let done = m.complete(id).unwrap();
    assert!(done.moved.retire_from, "the move's completion retires it");
    assert!(!m.busy());
}
