//! R4 without exemptions: NFs whose cross-flow decisions depend on order (the portscan
//! detector) see packets in chain-entry order, whatever reorders flows in front of them — a
//! slowed or cloned instance upstream, a slowed instance of their own, several roots.

mod common;

use common::*;
use sluice_coe::engine::EngineConfig;
use sluice_coe::schedule::{Action, At};

fn slow(vertex: &str, instance: u16, lo: u64, hi: u64) -> Action {
    Action::Slow { vertex: vertex.into(), instance, delay_us: (lo, hi) }
}

/// One NAT instance slowed: flows through the other overtake its flows at the portscan detector.
#[test]
fn a_slow_nat_instance_does_not_change_the_portscan_detectors_decisions() {
    let c = chain(EXAMPLE);
    let p = demo(0.1, 3);
    let events = vec![event(At::Percent(5.0), slow("nat", 0, 20, 60))];
    let r = run(&c, &p, events, EngineConfig::default(), embedded());
    assert!(r.equivalent, "{}", r.render());
    assert!(r.events.iter().any(|e| e.kind == "portscan"), "the planted scan is still detected");
}

/// A slowed portscan instance beside a fast one, then a clone of it, then the NAT slowed too.
#[test]
fn slow_and_cloned_portscan_instances_decide_as_the_logical_detector() {
    let c = chain(EXAMPLE);
    let p = demo(0.1, 5);
    let events = vec![
        event(At::Percent(10.0), slow("portscan", 1, 10, 40)),
        event(At::Percent(30.0), Action::Clone { vertex: "portscan".into(), instance: 1 }),
        event(At::Percent(50.0), slow("nat", 1, 5, 30)),
    ];
    let r = run(&c, &p, events, EngineConfig::default(), embedded());
    assert!(r.equivalent, "{}", r.render());
}

/// Several roots: the detector orders by entry time across roots.
#[test]
fn two_roots_and_a_slow_nat_keep_the_portscan_detectors_order() {
    let c = chain(EXAMPLE);
    let p = demo(0.1, 7);
    let events = vec![event(At::Percent(20.0), slow("nat", 1, 20, 80))];
    let r = run(&c, &p, events, EngineConfig { roots: 2, ..EngineConfig::default() }, embedded());
    assert!(r.equivalent, "{}", r.render());
}
