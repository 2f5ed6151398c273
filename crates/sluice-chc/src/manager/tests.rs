use super::*;

fn load(i: usize, backlog: u64, ns: f64) -> InstanceLoad {
    InstanceLoad { node: NodeId(i), backlog, ns_per_packet: ns, cloning: false }
}

fn policy() -> ManagerPolicy {
    ManagerPolicy {
        max_instances: 3,
        min_instances: 1,
        scale_out_queue_above: Some(100),
        scale_in_queue_below: Some(10),
        straggler_slower_by_percent: None,
    }
}

#[test]
fn queue_depth_scales_out_and_in_within_bounds() {
    let p = policy();
    assert_eq!(evaluate(&p, &[load(0, 150, 1.0)], false), vec![Decision::ScaleTo(2)]);
    assert_eq!(evaluate(&p, &[load(0, 150, 1.0)], true), vec![], "not while a move is in progress");
    let three = [load(0, 90, 1.0), load(1, 90, 1.0), load(2, 90, 1.0)];
    assert_eq!(evaluate(&p, &three, false), vec![], "at the maximum");
    assert_eq!(evaluate(&p, &[load(0, 1, 1.0), load(1, 1, 1.0)], false), vec![Decision::ScaleTo(1)]);
    assert_eq!(evaluate(&p, &[load(0, 1, 1.0)], false), vec![], "at the minimum");
}

#[test]
fn a_straggler_is_cloned_once() {
    let p = ManagerPolicy { straggler_slower_by_percent: Some(50.0), ..policy() };
    let loads = [load(0, 50, 1_000.0), load(1, 50, 1_000.0), load(2, 50, 4_000.0)];
    assert_eq!(evaluate(&p, &loads, false), vec![Decision::Clone(NodeId(2))]);
    let cloning = [loads[0], loads[1], InstanceLoad { cloning: true, ..loads[2] }];
    assert_eq!(evaluate(&p, &cloning, false), vec![]);
}

#[test]
fn trials_end_on_time_and_the_faster_twin_stays() {
    let mut t = Trials::default();
    t.start(Trial { straggler: NodeId(0), clone: NodeId(1), until: 100 });
    t.replace(NodeId(0), NodeId(4));
    assert!(t.due(99).is_empty());
    assert_eq!(t.due(100), vec![Trial { straggler: NodeId(4), clone: NodeId(1), until: 100 }]);
    assert!(t.due(200).is_empty());
    assert!(keep_clone(&load(0, 5, 3_000.0), &load(1, 5, 1_000.0)));
    assert!(!keep_clone(&load(0, 5, 1_000.0), &load(1, 5, 3_000.0)));
    assert!(keep_clone(&load(0, 9, 1_000.0), &load(1, 5, 1_000.0)), "ties go to the smaller backlog");
}
