use super::*;
use crate::test_support::udp;

fn live(clock: u64) -> Packet {
    let mut p = udp(1, 1);
    p.meta.clock = Clock::new(0, clock);
    p
}

fn replay(clock: u64, target: InstanceId) -> Packet {
    let mut p = live(clock);
    p.meta.flags.insert(MetaFlags::REPLAYED);
    p.meta.target = Some(target);
    p
}

const ME: InstanceId = InstanceId(0x0001_0000);
const OTHER: InstanceId = InstanceId(0x0002_0000);

#[test]
fn a_recovering_instance_holds_live_packets_until_the_replay_drains() {
    let mut g = Gate::new(true);
    g.cover(&[live(1), live(2)], 1);
    assert!(matches!(g.arrive(7, live(5)), Arrival::Held));
    assert!(matches!(g.arrive(7, replay(1, ME)), Arrival::Queue(_)), "replay copies pass");
    assert!(matches!(g.arrive(7, live(2)), Arrival::Covered(_)), "the replay carries clock 2");
    assert_eq!(g.held(), 1);
    assert!(g.covers(Clock::new(0, 1)) && !g.covers(Clock::new(0, 5)));
    assert!(g.held_any(|p| p.meta.clock == Clock::new(0, 5)) && !g.held_any(|p| p.meta.clock == Clock::new(0, 1)));
    assert!(g.replay_drained(false).is_none(), "the replay has not drained");
    let held = g.replay_drained(true).map(|e| e.held).unwrap_or_default();
    assert!(g.replay_drained(true).is_none(), "ended once");
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].meta.clock, Clock::new(0, 5));
    assert!(matches!(g.arrive(7, live(6)), Arrival::Queue(_)));
    assert!(matches!(g.arrive(7, live(2)), Arrival::Queue(_)), "after the replay: dequeue suppresses it");
    assert!(g.flows().contains(&7));
}

#[test]
fn a_replay_copy_past_its_target_waits_like_a_live_packet() {
    let mut g = Gate::new(true);
    g.cover(&[live(1), live(2)], 1);
    let mut reached = replay(5, OTHER);
    reached.meta.flags.insert(MetaFlags::REACHED);
    assert!(matches!(g.arrive(7, reached), Arrival::Held), "behind the replay's clocks 1 and 2");
    let mut covered = replay(2, OTHER);
    covered.meta.flags.insert(MetaFlags::REACHED);
    assert!(matches!(g.arrive(7, covered), Arrival::Covered(_)), "this replay carries clock 2");
    assert!(matches!(g.arrive(7, replay(6, OTHER)), Arrival::Queue(_)), "on its way to its target: passes");
}

#[test]
fn a_live_packet_older_than_the_whole_replay_is_not_held() {
    // A store crash cut the root's log back: clocks 2-3 are in flight but no longer logged, so
    // the replay brings 4-5 only. Holding 3 behind it would make an order-sensitive vertex wait
    // for 3 before 4 while 3 waits for the replay to drain.
    let mut g = Gate::new(true);
    g.cover(&[live(4), live(5)], 1);
    assert!(matches!(g.arrive(7, live(3)), Arrival::Queue(_)));
    assert!(matches!(g.arrive(7, live(6)), Arrival::Held));
    // Clocks of another root are not ordered against the replay's: held.
    assert!(matches!(
        g.arrive(7, {
            let mut p = live(1);
            p.meta.clock = Clock::new(1, 1);
            p
        }),
        Arrival::Held
    ));
    assert_eq!(g.held(), 2);
}

#[test]
fn a_moved_flow_is_held_then_released_with_its_first_packet_marked() {
    let mut g = Gate::new(false);
    g.hold_flows(&[3]);
    assert!(matches!(g.arrive(3, live(1)), Arrival::Held));
    assert!(matches!(g.arrive(3, live(2)), Arrival::Held));
    assert!(matches!(g.arrive(4, live(3)), Arrival::Queue(_)), "other flows are not held");
    let out = g.release_flow(3);
    assert_eq!(out.len(), 2);
    assert!(out[0].meta.flags.contains(MetaFlags::FIRST));
    assert!(!out[1].meta.flags.contains(MetaFlags::FIRST));
    assert!(matches!(g.arrive(3, live(4)), Arrival::Queue(_)));
}

#[test]
fn duplicates_are_suppressed_where_they_arrive() {
    let decided = Decided::default();
    let mut g = Gate::new(false);
    assert_eq!(g.dequeue(&live(1), ME, false, &decided, true), Dequeue::Process { duplicate: false });
    assert_eq!(g.dequeue(&live(1), ME, false, &decided, true), Dequeue::Suppress);
    // Suppression off: the NF sees it again, counted as a duplicate.
    assert_eq!(g.dequeue(&live(1), ME, false, &decided, false), Dequeue::Process { duplicate: true });
}

#[test]
fn replay_copies_pass_upstream_and_the_target_drops_what_it_processed() {
    let decided = Decided::default();
    let mut g = Gate::new(false);
    g.dequeue(&live(1), ME, false, &decided, true);
    // On the way to another instance: passes although this one saw the clock.
    assert_eq!(g.dequeue(&replay(1, OTHER), ME, false, &decided, true), Dequeue::Process { duplicate: false });
    // Aimed at this instance, which processed it already: dropped.
    assert_eq!(g.dequeue(&replay(1, ME), ME, false, &decided, true), Dequeue::Suppress);
    assert_eq!(g.dequeue(&replay(2, ME), ME, false, &decided, true), Dequeue::Process { duplicate: false });
}

#[test]
fn a_clock_processed_elsewhere_in_the_vertex_is_not_processed_again() {
    let mut decided = Decided::default();
    assert_eq!(decided.process(Clock::new(0, 9), false, true), Processing { record: true, duplicate: false });
    let mut twin = Gate::new(false);
    assert_eq!(twin.dequeue(&live(9), ME, false, &decided, true), Dequeue::Suppress);
    // A clone's replay skips what its straggler did; a replacement's replay does not.
    assert_eq!(twin.dequeue(&replay(9, ME), ME, true, &decided, true), Dequeue::Suppress);
    let mut fresh = Gate::new(true);
    assert_eq!(fresh.dequeue(&replay(9, ME), ME, false, &decided, true), Dequeue::Process { duplicate: false });
    // Processing it again records nothing; a live duplicate's updates are counted.
    assert_eq!(decided.process(Clock::new(0, 9), true, true), Processing { record: false, duplicate: false });
    assert_eq!(decided.process(Clock::new(0, 9), false, true), Processing { record: false, duplicate: true });
    assert_eq!(decided.process(Clock::new(0, 9), false, false), Processing { record: true, duplicate: true });
}

#[test]
fn a_crash_loses_what_was_held() {
    let mut g = Gate::new(true);
    g.hold_flows(&[1]);
    g.arrive(1, live(1));
    g.arrive(2, live(2));
    assert_eq!(g.drain_held().len(), 2);
    assert_eq!(g.held(), 0);
}

#[test]
fn barriers_of_moves_away_wait_for_the_recovery_to_end() {
    let mut g = Gate::new(false);
    assert_eq!(g.place_barrier(MoveId(1)), Some(MoveId(1)), "not recovering: queued at once");
    let mut g = Gate::new(true);
    assert_eq!(g.place_barrier(MoveId(2)), None);
    assert!(matches!(g.arrive(7, live(5)), Arrival::Held));
    assert_eq!(g.place_barrier(MoveId(3)), None);
    let end = g.replay_drained(true).unwrap_or_default();
    assert_eq!(end.held.len(), 1, "the held live packet goes first");
    assert_eq!(end.barriers, vec![MoveId(2), MoveId(3)], "then the barriers, in order");
    assert_eq!(g.place_barrier(MoveId(4)), Some(MoveId(4)));
}

#[test]
fn a_clone_waiting_for_its_straggler_keeps_recovering() {
    let mut g = Gate::new(true);
    g.wait_for_straggler();
    assert!(g.waits_for_straggler());
    assert!(g.replay_drained(true).is_none(), "the straggler still holds older packets");
    assert!(g.recovering());
    g.straggler_passed();
    assert!(!g.waits_for_straggler());
    assert!(g.replay_drained(true).is_some());
    assert!(!g.recovering());
}

#[test]
fn a_forced_end_of_recovery_returns_the_deferred_barriers_too() {
    let mut g = Gate::new(true);
    g.wait_for_straggler();
    assert_eq!(g.place_barrier(MoveId(0)), None);
    let end = g.end_recovery();
    assert_eq!(end.barriers, vec![MoveId(0)]);
    assert!(!g.recovering());
}

#[test]
fn take_applies_suppression_then_the_pass_through_rules() {
    fn cx(decided: &Decided, emitted: bool) -> TakeContext<'_> {
        TakeContext { id: ME, skip_done: false, decided, suppress: true, emitted }
    }
    let mut decided = Decided::default();
    let mut g = Gate::new(false);
    // A copy of another instance's replay before this vertex processed its clock: it waits.
    let passing = replay(3, OTHER);
    assert_eq!(g.peek_take(&passing, &cx(&decided, false)), Take::WaitForClock);
    assert_eq!(g.take(&passing, &cx(&decided, false)), Take::WaitForClock);
    // Once the vertex processed it, and what it emitted is recorded: it passes through.
    decided.process(Clock::new(0, 3), false, true);
    assert_eq!(g.take(&passing, &cx(&decided, true)), Take::PassThrough);
    // Without the record it is processed (nothing to leave with).
    assert_eq!(g.take(&passing, &cx(&decided, false)), Take::Process { duplicate: false });
    // A live packet: processed once, then suppressed.
    assert_eq!(g.take(&live(4), &cx(&decided, false)), Take::Process { duplicate: false });
    assert_eq!(g.take(&live(4), &cx(&decided, false)), Take::Suppress);
    // Suppression off: the duplicate reaches the NF, and replay copies are not held back.
    let off = TakeContext { suppress: false, ..cx(&decided, true) };
    assert_eq!(g.take(&live(4), &off), Take::Process { duplicate: true });
    assert_eq!(g.take(&replay(9, OTHER), &off), Take::Process { duplicate: false });
}

#[test]
fn with_several_roots_a_live_packet_older_than_the_whole_replay_goes_first() {
    // Root 0's clock 486 entered before everything the replay brings (root 0 resumed at 1201
    // after a crash, root 1's packets entered later): it cannot overtake any of them on its flow,
    // and an order-sensitive vertex must take it first.
    let at = |root: u8, seq: u64, ts: u64| {
        let mut p = udp(1, 1);
        p.meta.clock = Clock::new(root, seq);
        p.meta.ts_ns = ts;
        p
    };
    let mut g = Gate::new(true);
    g.cover(&[at(0, 1201, 500), at(1, 7, 300)], 2);
    assert!(matches!(g.arrive(7, at(0, 486, 100)), Arrival::Queue(_)), "entered first");
    assert!(matches!(g.arrive(7, at(1, 9, 400)), Arrival::Held), "entered after a replayed packet");
    assert!(matches!(g.arrive(7, at(0, 480, 350)), Arrival::Held), "a lower clock of another root is not earlier");
}

#[test]
fn an_entry_ordered_instance_holds_nothing_for_its_recovery() {
    let mut g = Gate::new(true);
    g.take_in_entry_order();
    g.cover(&[live(1), live(2)], 1);
    assert!(matches!(g.arrive(7, live(5)), Arrival::Queue(_)), "entry order puts it after the replay");
    assert!(matches!(g.arrive(7, live(2)), Arrival::Covered(_)), "the replay carries clock 2");
    g.hold_flows(&[8]);
    assert!(matches!(g.arrive(8, live(6)), Arrival::Held), "a flow moving in is still held");
}
