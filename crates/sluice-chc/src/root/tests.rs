use super::*;
use crate::test_support::udp;

fn root(cap: usize) -> Root {
    Root::new(RootConfig {
        log_capacity: cap,
        clock_persist_every: 3,
        roots: 1,
        xor_check: true,
        remember_inputs: true,
    })
}

fn admit(r: &mut Root, input: u64) -> Packet {
    let mut p = udp(1, 1000 + input as u16);
    assert!(matches!(r.admit(input, &mut p, 7), Admission::Admitted { .. }));
    p
}

#[test]
fn admission_stamps_clocks_in_order_and_persists_every_n() {
    let mut r = root(10);
    let mut persisted = Vec::new();
    for i in 0..7 {
        let mut p = udp(1, 1);
        match r.admit(i, &mut p, 100) {
            Admission::Admitted { clock, persist } => {
                assert_eq!(clock, Clock::new(0, i + 1));
                assert_eq!(p.meta.clock, clock);
                assert_eq!(p.meta.ingress_ns, 100);
                persisted.extend(persist);
            }
            Admission::LogFull => panic!("log full at {i}"),
        }
    }
    assert_eq!(persisted, vec![3, 6]);
    assert_eq!(r.logged(), 7);
    assert_eq!(r.input_of(Clock::new(0, 4)), Some(3));
}

#[test]
fn a_full_log_drops_input() {
    let mut r = root(2);
    admit(&mut r, 0);
    admit(&mut r, 1);
    let mut p = udp(1, 9);
    assert_eq!(r.admit(2, &mut p, 0), Admission::LogFull);
    assert_eq!(r.stats().log_full, 1);
}

#[test]
fn an_entry_waits_for_every_copy_and_every_commit() {
    let mut r = root(10);
    let mut p = admit(&mut r, 0);
    let mirror = p.clone();
    r.copy_sent(&mirror);
    // The main copy leaves carrying one update's XOR bit; the mirror copy is consumed.
    p.meta.xor = 0x0001_0002;
    r.copy_left(&p);
    assert!(r.is_logged(p.meta.clock), "a copy is still travelling");
    r.copy_finished(&mirror);
    assert!(r.is_logged(p.meta.clock), "its update is not committed");
    r.commit(p.meta.clock, 0x0001_0002);
    assert!(!r.is_logged(p.meta.clock));
    assert_eq!(r.take_deleted(), vec![p.meta.clock]);
    assert!(r.take_deleted().is_empty());
}

#[test]
fn without_the_xor_check_done_copies_are_enough() {
    let mut r = Root::new(RootConfig { xor_check: false, ..RootConfig::default() });
    let mut p = admit(&mut r, 0);
    p.meta.xor = 5;
    r.copy_finished(&p);
    assert_eq!(r.logged(), 0);
}

#[test]
fn replay_marks_copies_and_a_drained_replay_commits_its_entries() {
    let mut r = root(10);
    let mut a = admit(&mut r, 0);
    let b = admit(&mut r, 1);
    // `a` left with an uncommitted update; `b` was lost with a crashed instance.
    a.meta.xor = 9;
    r.copy_left(&a);
    r.copy_lost(&b);
    let target = InstanceId::new(1, 0);
    let copies = r.replay_to(target);
    assert_eq!(copies.len(), 2);
    let (first, last) = (&copies[0].1, &copies[1].1);
    assert!(first.meta.flags.contains(MetaFlags::REPLAYED) && first.meta.flags.contains(MetaFlags::EMITTED));
    assert!(!last.meta.flags.contains(MetaFlags::EMITTED) && last.meta.flags.contains(MetaFlags::LAST));
    assert!(copies.iter().all(|(_, p)| p.meta.target == Some(target) && p.meta.xor == 0));
    assert!(!r.replay_drained());
    for (_, p) in &copies {
        r.copy_finished(p);
    }
    assert!(r.replay_drained());
    assert_eq!(r.logged(), 0, "replayed entries need no commit: the replay used tagged, blocking updates");
}

#[test]
fn a_root_crash_resumes_past_the_persisted_clock_and_loses_only_its_entries() {
    let mut r = Root::new(RootConfig {
        log_capacity: 100,
        clock_persist_every: 10,
        roots: 2,
        xor_check: true,
        remember_inputs: true,
    });
    let mut by_root = [0usize; 2];
    for i in 0..40u8 {
        let mut p = udp(i, 1);
        r.admit(u64::from(i), &mut p, 0);
        by_root[usize::from(p.meta.clock.root())] += 1;
    }
    assert!(by_root[0] > 0 && by_root[1] > 0, "source addresses spread over both roots");
    let crash = r.crash(1, true).unwrap();
    assert_eq!(crash.logged, by_root[1]);
    assert_eq!(crash.resumed, (by_root[1] as u64 / 10) * 10 + 10);
    assert_eq!(r.logged(), by_root[0]);
    let lost = (0..40u64).map(|s| Clock::new(1, s + 1)).filter(|c| r.lost_with_log(*c)).count();
    assert_eq!(lost, by_root[1], "every entry of root 1 was in flight and is now beyond replay");
    assert!(!r.lost_with_log(Clock::new(0, 1)), "root 0 kept its log");
    assert_eq!(r.crash(2, true), Err(NoSuchRoot { root: 2, roots: 2 }));
    // The next clock of root 1 is past anything the old root stamped.
    let mut q = (0..=255u8).map(|i| udp(i, 1)).find(|p| r.partition(p) == 1).expect("a source of root 1");
    r.admit(99, &mut q, 0);
    assert_eq!(q.meta.clock, Clock::new(1, crash.resumed + 1));
}

#[test]
fn reload_keeps_what_the_store_has_and_deletes_what_was_done() {
    let mut r = root(10);
    let a = admit(&mut r, 0);
    let b = admit(&mut r, 1);
    let mut done = admit(&mut r, 2);
    done.meta.xor = 0;
    r.copy_left(&done);
    let mut stored = BTreeMap::new();
    stored.insert(a.meta.clock, (0, a.clone()));
    stored.insert(done.meta.clock, (2, done.clone()));
    let re = r.reload(stored);
    assert_eq!(re, Reload { kept: 1, lost: 1, stale: vec![done.meta.clock] });
    assert!(r.is_logged(a.meta.clock) && !r.is_logged(b.meta.clock));
    assert!(r.lost_with_log(b.meta.clock), "b was in flight and its entry is gone");
    assert!(!r.lost_with_log(a.meta.clock) && !r.lost_with_log(done.meta.clock));
}

#[test]
fn a_replay_has_drained_to_its_target_once_every_copy_reached_it() {
    let mut r = root(10);
    admit(&mut r, 0);
    admit(&mut r, 1);
    let target = InstanceId(0x0001_0000);
    let mut copies: Vec<Packet> = r.replay_to(target).into_iter().map(|(_, p)| p).collect();
    assert!(!r.replay_drained_to(target));
    // The target processes both; downstream they are still travelling (an order-sensitive
    // vertex may hold one back).
    for p in &mut copies {
        p.meta.flags.insert(MetaFlags::REACHED);
        r.replay_reached(p);
    }
    assert!(r.replay_drained_to(target), "the target has what the log held");
    // A mirror copy made downstream of the target is not on its way to it.
    let mirror = copies[0].clone();
    r.copy_sent(&mirror);
    assert!(r.replay_drained_to(target));
    r.copy_finished(&mirror);
    assert!(!r.replay_drained(), "the copies have not left the chain");
    for p in &copies {
        r.copy_finished(p);
    }
    assert!(r.replay_drained_to(target) && r.replay_drained(), "finishing does not count twice");
    // A copy lost or suppressed before it reached the target counts when it is gone.
    let lost: Vec<Packet> = r.replay_to(target).into_iter().map(|(_, p)| p).collect();
    assert!(!r.replay_drained_to(target));
    for p in &lost {
        r.copy_lost(p);
    }
    assert!(r.replay_drained_to(target));
}

#[test]
fn the_replay_frontier_is_the_earliest_copy_still_on_its_way() {
    let mut r = root(10);
    for i in 0..3 {
        admit(&mut r, i);
    }
    let target = InstanceId(0x0002_0000);
    assert_eq!(r.replay_frontier(target), None, "no replay yet");
    let copies: Vec<Packet> = r.replay_to(target).into_iter().map(|(_, p)| p).collect();
    let clock = |i: usize| copies[i].meta.clock;
    let entered = |i: usize| copies[i].meta.ingress_ns;
    assert_eq!(r.replay_frontier(target), Some((clock(0), entered(0))));
    // A later copy arriving first moves nothing; the earliest arriving moves it past both.
    let mut reached = copies[2].clone();
    reached.meta.flags.insert(MetaFlags::REACHED);
    r.replay_reached(&reached);
    assert_eq!(r.replay_frontier(target).map(|f| f.0), Some(clock(0)));
    // One that ends on the way (dropped in front of the target) counts as gone.
    r.copy_finished(&copies[0]);
    assert_eq!(r.replay_frontier(target).map(|f| f.0), Some(clock(1)));
    let mut reached = copies[1].clone();
    reached.meta.flags.insert(MetaFlags::REACHED);
    r.replay_reached(&reached);
    assert_eq!(r.replay_frontier(target), None, "every copy reached it or ended");
    assert!(r.replay_drained_to(target));
}

#[test]
fn a_retargeted_replay_copy_counts_for_its_new_target() {
    let mut r = root(10);
    admit(&mut r, 0);
    let (old, new) = (InstanceId(0x0001_0000), InstanceId(0x0001_0001));
    let mut copies: Vec<Packet> = r.replay_to(old).into_iter().map(|(_, p)| p).collect();
    assert!(!r.replay_drained_to(old));
    r.retarget(&mut copies[0], new);
    assert_eq!(copies[0].meta.target, Some(new));
    assert!(r.replay_drained_to(old), "the old target no longer waits for it");
    assert!(!r.replay_drained_to(new));
    copies[0].meta.flags.insert(MetaFlags::REACHED);
    r.replay_reached(&copies[0]);
    assert!(r.replay_drained_to(new));
    // A live packet, or a copy past its target, is left alone.
    let mut live = admit(&mut r, 1);
    r.retarget(&mut live, new);
    assert_eq!(live.meta.target, None);
}

#[test]
fn a_long_running_root_forgets_inputs_with_their_entries_and_counts_deletes() {
    let mut r = Root::new(RootConfig { remember_inputs: false, ..RootConfig::default() });
    let p = admit(&mut r, 0);
    assert_eq!(r.input_of(p.meta.clock), None, "no index of every clock ever stamped");
    // Copies are accounted by their metadata alone (what a threaded driver sends its root).
    r.copy_sent(&p.meta);
    r.copy_finished(&p.meta);
    r.copy_left(&p.meta);
    assert_eq!(r.logged(), 0);
    assert_eq!(r.stats().deleted, 1);
    assert_eq!(r.take_deleted(), vec![p.meta.clock]);
}

#[test]
fn a_burst_of_a_whole_log_reuses_every_buffer() {
    let cap = 3_000;
    let mut r = root(cap);
    let mut buffers = Vec::new();
    // Kept to the end, so that no address a test copy had comes back from the allocator.
    let mut kept = Vec::new();
    for round in 0..2u64 {
        let copies: Vec<Packet> = (0..cap as u64).map(|i| admit(&mut r, round * 10_000 + i)).collect();
        let mut now: Vec<usize> = r.log_entries().map(|(_, _, p)| p.data().as_ptr() as usize).collect();
        now.sort_unstable();
        if round == 1 {
            assert_eq!(now, buffers, "the second burst copied into the buffers the first left");
        }
        buffers = now;
        for p in &copies {
            r.copy_finished(p);
        }
        assert_eq!(r.logged(), 0);
        kept.push(copies);
    }
}

#[test]
fn a_hosts_packets_enter_at_one_root_and_hosts_spread_over_all() {
    let mut seen = [false; 4];
    for src in 0..=255u8 {
        let root = partition(&udp(src, 7), 4);
        assert_eq!(root, partition(&udp(src, 9000), 4), "host 10.0.0.{src}: its flows went to two roots");
        if let Some(s) = seen.get_mut(usize::from(root)) {
            *s = true;
        }
    }
    assert_eq!(seen, [true; 4], "256 hosts spread over every root");
}
