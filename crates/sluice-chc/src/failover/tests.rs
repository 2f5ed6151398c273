use super::*;
use crate::root::{Admission, RootConfig};
use crate::test_support::udp;
use sluice_packet::MetaFlags;

const FAILED: InstanceId = InstanceId(0x0001_0000);
const OTHER: InstanceId = InstanceId(0x0002_0000);

fn root() -> Root {
    Root::new(RootConfig {
        log_capacity: 16,
        clock_persist_every: 100,
        roots: 1,
        xor_check: true,
        remember_inputs: true,
    })
}

fn admit(r: &mut Root, input: u64) -> Packet {
    let mut p = udp(1, 1000 + input as u16);
    assert!(matches!(r.admit(input, &mut p, 0), Admission::Admitted { .. }));
    p
}

#[test]
fn lost_copies_stay_logged_for_the_replay() {
    let mut r = root();
    let p = admit(&mut r, 0);
    let loss = instance_failed(&mut r, &Decided::default(), FAILED, std::slice::from_ref(&p));
    assert_eq!(loss.beyond_replay, 0);
    assert!(loss.resend.is_empty());
    assert!(r.is_logged(p.meta.clock), "the replay towards the replacement redoes it");
    let replay = r.replay_to(FAILED);
    assert_eq!(replay.len(), 1);
}

#[test]
fn a_copy_of_another_instances_replay_is_sent_again() {
    let mut r = root();
    admit(&mut r, 0);
    let copies = r.replay_to(OTHER);
    let passing: Vec<Packet> = copies.into_iter().map(|(_, p)| p).collect();
    assert!(!r.replay_drained_to(OTHER));
    let loss = instance_failed(&mut r, &Decided::default(), FAILED, &passing);
    assert_eq!(loss.resend.len(), 1, "the copy was on its way to another instance");
    let (input, again) = &loss.resend[0];
    assert_eq!(*input, 0);
    assert_eq!(again.meta.replay_target(), Some(OTHER));
    assert!(again.meta.flags.contains(MetaFlags::REPLAYED));
    assert!(!r.replay_drained_to(OTHER), "the new copy is travelling");
    // A copy of the failed instance's own replay is not resent: the replacement gets a new one.
    let own: Vec<Packet> = r.replay_to(FAILED).into_iter().map(|(_, p)| p).collect();
    let loss = instance_failed(&mut r, &Decided::default(), FAILED, &own);
    assert!(loss.resend.is_empty());
}

#[test]
fn packets_whose_log_entry_went_with_the_root_are_beyond_replay() {
    let mut r = root();
    let (a, b) = (admit(&mut r, 0), admit(&mut r, 1));
    let Ok(_) = r.crash(0, true) else { panic!("root 0 exists") };
    let mut decided = Decided::default();
    decided.process(b.meta.clock, false, true);
    let loss = instance_failed(&mut r, &decided, FAILED, &[a, b]);
    assert_eq!(loss.beyond_replay, 1, "only the packet the vertex never processed is lost for good");
}

#[test]
fn a_retired_instance_finishes_its_own_copies() {
    let mut r = root();
    let own = admit(&mut r, 0);
    let on = instance_retired(&mut r, FAILED, vec![own.clone()]);
    assert!(on.is_empty());
    assert!(!r.is_logged(own.meta.clock), "its only copy is done and nothing is uncommitted");
}

#[test]
fn a_retired_instance_passes_on_copies_of_other_replays() {
    let mut r = root();
    let p = admit(&mut r, 0);
    let passing: Vec<Packet> = r.replay_to(OTHER).into_iter().map(|(_, p)| p).collect();
    let on = instance_retired(&mut r, FAILED, passing);
    assert_eq!(on.len(), 1);
    assert_eq!(on[0].meta.replay_target(), Some(OTHER));
    assert!(!r.replay_drained_to(OTHER), "still on its way");
    assert!(r.is_logged(p.meta.clock));
}
