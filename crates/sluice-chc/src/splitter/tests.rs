use super::*;

fn n(i: usize) -> NodeId {
    NodeId(i)
}

#[test]
fn flows_follow_the_hash_unless_pinned() {
    let mut s = Splitter::new(vec![n(0), n(1)]);
    assert_eq!(s.slot_of(42, |k| 1 % k), Some(n(1)));
    s.pin(&[42], n(0));
    assert_eq!(s.slot_of(42, |_| 1), Some(n(0)));
    assert_eq!(Splitter::default().slot_of(1, |_| 0), None);
}

#[test]
fn scaling_out_pins_existing_flows_so_nothing_moves() {
    let mut s = Splitter::new(vec![n(0)]);
    let flows: HashSet<u64> = [1, 2, 3].into_iter().collect();
    s.scale_out(&[n(1)], |m| (m == n(0)).then_some(&flows));
    assert_eq!(s.members(), &[n(0), n(1)]);
    for k in [1, 2, 3] {
        assert_eq!(s.slot_of(k, |_| 1), Some(n(0)), "flow {k} stays");
    }
    assert_eq!(s.slot_of(4, |_| 1), Some(n(1)), "new flows spread");
}

#[test]
fn scaling_in_hands_only_the_removed_instances_flows_over() {
    let mut s = Splitter::new(vec![n(0), n(1), n(2)]);
    let f2: HashSet<u64> = [5, 6, 7].into_iter().collect();
    s.pin(&[9], n(2));
    let plan = s.scale_in(2, |m| (m == n(2)).then_some(&f2));
    assert_eq!(s.members(), &[n(0), n(1)]);
    assert_eq!(plan.len(), 1);
    let (removed, groups) = &plan[0];
    assert_eq!(*removed, n(2));
    let mut moved: Vec<u64> = groups.iter().flat_map(|(_, k)| k.iter().copied()).collect();
    moved.sort_unstable();
    assert_eq!(moved, vec![5, 6, 7]);
    assert!(groups.iter().all(|(t, _)| *t != n(2)));
    assert_eq!(s.slot_of(9, |_| 0), Some(n(0)), "pins to the removed instance are gone");
}

#[test]
fn a_clone_gets_the_stragglers_live_traffic_and_its_replays() {
    let mut s = Splitter::new(vec![n(0)]);
    s.add_clone(n(0), n(5));
    assert_eq!(s.place(1, false, |_| 0), Some(Placement { node: n(0), copy_to: Some(n(5)) }));
    assert_eq!(s.place(1, true, |_| 0), Some(Placement { node: n(5), copy_to: None }));
    assert_eq!(s.twin_of(n(5)), Some(n(0)));
    // The straggler fails: its replacement takes its place in the trial.
    s.replace(n(0), n(7));
    assert_eq!(s.clone_of(n(7)), Some(n(5)));
    s.end_trial(n(5));
    assert_eq!(s.place(1, false, |_| 0), Some(Placement { node: n(7), copy_to: None }));
}

#[test]
fn a_new_root_relearns_every_flow_where_it_is() {
    let mut s = Splitter::new(vec![n(0), n(1)]);
    let (a, b): (HashSet<u64>, HashSet<u64>) = ([1, 2].into_iter().collect(), [3].into_iter().collect());
    let learnt = s.relearn(|m| if m == n(0) { Some(&a) } else { Some(&b) });
    assert_eq!(learnt, 3);
    assert_eq!(s.slot_of(1, |_| 1), Some(n(0)));
    assert_eq!(s.slot_of(3, |_| 0), Some(n(1)));
}

#[test]
fn reachability_follows_routes_including_itself() {
    // 0 -> 1 -> 2, 0 -> 3 (off-path)
    let r = reachability(&[vec![1, 3], vec![2], vec![], vec![]]);
    assert_eq!(r[0], vec![true, true, true, true]);
    assert_eq!(r[1], vec![false, true, true, false]);
    assert_eq!(r[3], vec![false, false, false, true]);
}

#[test]
fn a_replay_copy_goes_to_its_target_only() {
    let mut s = Splitter::new(vec![NodeId(0), NodeId(1)]);
    s.add_clone(NodeId(1), NodeId(5));
    let slot = |n: usize| 1 % n;
    // The slot's instance is the target.
    assert_eq!(s.place_replay_at_target(7, slot, |n| n == NodeId(1), || None), Some(NodeId(1)));
    // Its clone is the target (the clone's own replay).
    assert_eq!(s.place_replay_at_target(7, slot, |n| n == NodeId(5), || None), Some(NodeId(5)));
    // Neither: the old instance of a move still in progress, or nowhere.
    assert_eq!(s.place_replay_at_target(7, slot, |n| n == NodeId(9), || Some(NodeId(9))), Some(NodeId(9)));
    assert_eq!(s.place_replay_at_target(7, slot, |n| n == NodeId(0), || None), None);
}
