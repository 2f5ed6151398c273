use super::*;

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
