//! Failures random fault schedules found, each reduced to the fewest events that still showed
//! it, kept as tests (the fix is named in each).

mod common;

use common::*;
use sluice_coe::engine::{EngineConfig, LogPlace};
use sluice_coe::schedule::{Action, At, FaultEvent, ScaleTo};

fn http() -> Vec<sluice_packet::Packet> {
    trace("http_methods.pcap")
}

fn check(events: Vec<FaultEvent>, packets: &[sluice_packet::Packet], cfg: EngineConfig) {
    let c = chain(EXAMPLE);
    let r = run(&c, packets, events, cfg, embedded());
    assert!(r.equivalent, "{}", r.render());
    assert_eq!(r.engine.log_left, 0, "everything left the chain committed");
}

/// A NAT replacement held a live packet while a replay aimed at a portscan clone passed through
/// it first; the live copy was then dropped as a duplicate, and its output lost. Fix: a replay
/// copy passing through waits until the vertex has processed its clock.
#[test]
fn a_replay_passing_a_recovering_instance_does_not_eat_the_live_copy() {
    let events = vec![
        event(At::Packet(160), Action::Slow { vertex: "trojan".into(), instance: 0, delay_us: (7, 11) }),
        event(At::Packet(279), Action::Crash { vertex: "nat".into(), instance: 0 }),
        event(At::Percent(56.1), Action::Clone { vertex: "portscan".into(), instance: 1 }),
    ];
    check(
        events,
        &http(),
        EngineConfig { checkpoint_every: 500, log_place: LogPlace::Store, ..EngineConfig::default() },
    );
}

/// A store rebuilt before the last checkpoint lost the timers armed since it, so a load
/// balancer that crashed afterwards never expired the connections whose timers its replacement
/// should have adopted. Fix: a rebuilt store takes its timers from the instances.
#[test]
fn timers_survive_a_store_rebuild_and_a_later_crash() {
    let events = vec![
        event(At::Packet(120), Action::CrashStore),
        event(At::Percent(32.9), Action::Crash { vertex: "lb".into(), instance: 0 }),
    ];
    check(events, &http(), EngineConfig { checkpoint_every: 500, ..EngineConfig::default() });
}

/// A clone of a portscan replacement still recovering: each held live packets the other had
/// processed, and the order-sensitive vertex waited for them (a deadlock). Fix: a vertex skips
/// its own duplicates when it looks for earlier packets, and each instance waits only for its
/// own replay.
#[test]
fn a_clone_of_a_recovering_order_sensitive_instance_does_not_deadlock() {
    let events = vec![
        event(At::Packet(19), Action::Crash { vertex: "portscan".into(), instance: 0 }),
        event(At::Packet(23), Action::Clone { vertex: "portscan".into(), instance: 0 }),
        event(At::Packet(85), Action::Clone { vertex: "trojan".into(), instance: 0 }),
        event(At::Percent(34.5), Action::Scale { vertex: "nat".into(), to: ScaleTo::Exactly(1) }),
        event(At::Percent(52.2), Action::Clone { vertex: "trojan".into(), instance: 0 }),
        event(At::Packet(375), Action::Slow { vertex: "portscan".into(), instance: 1, delay_us: (3, 15) }),
        event(At::Packet(397), Action::CrashStore),
        event(At::Percent(79.1), Action::Slow { vertex: "trojan".into(), instance: 0, delay_us: (1, 19) }),
    ];
    let cfg = EngineConfig {
        roots: 3,
        log_place: LogPlace::Store,
        async_delete: true,
        checkpoint_every: 500,
        ..EngineConfig::default()
    };
    check(events, &http(), cfg);
}

/// A live packet delayed in a slow NAT reached a portscan clone after the clone's replay had
/// started: held, it made the replay copies behind it wait, and the replay never drained. Fix:
/// a live copy the replay towards an instance also carries is done on arrival.
#[test]
fn a_late_live_copy_does_not_hold_up_a_clones_replay() {
    let events = vec![
        event(At::Packet(61), Action::Scale { vertex: "lb".into(), to: ScaleTo::By(3) }),
        event(At::Percent(40.7), Action::Slow { vertex: "trojan".into(), instance: 0, delay_us: (0, 0) }),
        event(At::Packet(463), Action::Slow { vertex: "nat".into(), instance: 1, delay_us: (1, 3) }),
        event(At::Percent(91.8), Action::Clone { vertex: "portscan".into(), instance: 0 }),
    ];
    let cfg = EngineConfig { roots: 3, async_delete: true, checkpoint_every: 500, ..EngineConfig::default() };
    check(events, &http(), cfg);
}

/// Scaling the load balancer in moved the removed instance's connections but not their timers:
/// the connections never expired. Fix: the new instance takes over the moved flows' timers (and
/// an instance that goes hands the rest to one that stays).
#[test]
fn moved_flows_keep_their_timers() {
    let events = vec![
        event(At::Percent(15.0), Action::Scale { vertex: "lb".into(), to: ScaleTo::Exactly(3) }),
        event(At::Packet(345), Action::Scale { vertex: "lb".into(), to: ScaleTo::Exactly(2) }),
    ];
    let cfg = EngineConfig { roots: 3, log_place: LogPlace::Store, checkpoint_every: 500, ..EngineConfig::default() };
    check(events, &http(), cfg);
}

/// After a flow move the old instance still held its copy of a moved flow's per-flow state;
/// a store rebuilt later took that stale copy and brought back an entry the new instance had
/// deleted. Fix: the old instance drops its copies of the moved flows.
#[test]
fn a_store_rebuild_after_a_move_takes_no_stale_copy() {
    let events = vec![
        event(At::Percent(56.0), Action::Move { vertex: "portscan".into(), from: 1, to: 0, flows: Some(1254) }),
        event(At::Packet(3297), Action::CrashStore),
    ];
    check(events, &demo(0.05, 12), EngineConfig { checkpoint_every: 500, ..EngineConfig::default() });
}

/// A store crash a few packets after a NAT crash, while the NAT's replay was still draining:
/// the rebuild needed the failed NAT's write-ahead log. Fix: checkpoint at the failover.
#[test]
fn a_store_crash_right_after_an_nf_crash_is_rebuilt_exactly() {
    let events = vec![
        event(At::Percent(50.3), Action::Crash { vertex: "nat".into(), instance: 0 }),
        event(At::Percent(50.7), Action::CrashStore),
    ];
    let cfg = EngineConfig {
        roots: 3,
        log_place: LogPlace::Store,
        async_delete: true,
        checkpoint_every: 500,
        ..EngineConfig::default()
    };
    check(events, &http(), cfg);
}

/// A slow load balancer crashed: the replacement started while the failed instance's last batch
/// was still leaving in virtual time, and overtook it. Fix: the replacement starts after it.
#[test]
fn a_replacement_does_not_overtake_its_predecessors_last_batch() {
    let events = vec![
        event(At::Packet(29), Action::Slow { vertex: "lb".into(), instance: 0, delay_us: (7, 15) }),
        event(At::Percent(17.4), Action::Crash { vertex: "lb".into(), instance: 0 }),
    ];
    check(events, &http(), EngineConfig { roots: 3, checkpoint_every: 500, ..EngineConfig::default() });
}

/// A flow move right after a store crash: the moved flows' per-flow values were only in the old
/// instance's copies, which the move dropped. Fix: per-flow values no instance holds come from
/// the write-ahead logs.
#[test]
fn per_flow_state_of_moved_flows_survives_a_store_crash() {
    let events = vec![
        event(At::Packet(24), Action::Move { vertex: "portscan".into(), from: 0, to: 1, flows: None }),
        event(At::Percent(7.3), Action::CrashStore),
    ];
    let cfg = EngineConfig { roots: 2, async_delete: true, checkpoint_every: 500, ..EngineConfig::default() };
    check(events, &demo(0.05, 12), cfg);
}

/// A straggler on trial crashed: its replacement's replay copies went to the clone, and the
/// live copies the replacement dropped as covered by the replay were lost. Fix: at the target's
/// vertex a replay copy goes to the target only.
#[test]
fn a_straggler_crashing_during_its_trial_loses_nothing() {
    let events = vec![
        event(At::Packet(4), Action::Slow { vertex: "portscan".into(), instance: 0, delay_us: (9, 9) }),
        event(At::Packet(281), Action::Clone { vertex: "portscan".into(), instance: 1 }),
        event(At::Percent(44.8), Action::Crash { vertex: "portscan".into(), instance: 1 }),
    ];
    let cfg = EngineConfig { roots: 2, log_place: LogPlace::Store, checkpoint_every: 500, ..EngineConfig::default() };
    check(events, &demo(0.05, 12), cfg);
}

/// A flow move from a straggler that then lost its trial: the barrier went with the retired
/// straggler and the move never completed. Fix: moves continue with the clone kept.
#[test]
fn a_move_from_a_straggler_that_loses_its_trial_completes() {
    let events = vec![
        event(At::Percent(18.1), Action::Clone { vertex: "nat".into(), instance: 0 }),
        event(At::Percent(70.7), Action::Move { vertex: "nat".into(), from: 0, to: 1, flows: Some(282) }),
    ];
    check(events, &demo(0.05, 12), EngineConfig { roots: 2, checkpoint_every: 500, ..EngineConfig::default() });
}
