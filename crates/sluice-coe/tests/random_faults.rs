//! Acceptance: random fault schedules over real captures and generated workloads; `verify`
//! must find every physical run equivalent to the reference, on the embedded store and on
//! Redis. A failing case prints its seed and schedule (YAML) so it can be rerun with
//! `sluice verify --faults`.

mod common;

use common::*;
use sluice_coe::engine::EngineConfig;
use sluice_coe::schedule::{Action, FaultSchedule};
use sluice_packet::Packet;
use std::sync::Arc;

/// The workloads: generated demo traffic (two seeds), and real captures from the shared traces.
fn workloads() -> Vec<(&'static str, Vec<Packet>)> {
    vec![
        ("demo-a", demo(0.05, 11)),
        ("demo-b", demo(0.05, 12)),
        ("echo-connections", trace("echo-connections.pcap").into_iter().take(4_000).collect()),
        ("http_methods", trace("http_methods.pcap")),
    ]
}

/// Random schedules are drawn for chains whose cross-flow state does not depend on the order
/// across flows (slowing one of several instances reorders flows like a network would; see
/// docs/correctness.md): slow events go only to single-instance vertices here.
fn keep(schedule: &mut FaultSchedule) {
    schedule.events.retain(|e| {
        !matches!(e.action, Action::Slow { .. }) || matches!(&e.action, Action::Slow { vertex, .. } if vertex == "lb")
    });
}

fn property(n: u64, backend: &dyn Fn(u64) -> Arc<dyn sluice_store::Backend>, label: &str) {
    let c = chain(EXAMPLE);
    let loads = workloads();
    let mut failures = Vec::new();
    // `COE_SEEDS=3,17` reruns chosen seeds (a failure prints its seed).
    let chosen: Option<Vec<u64>> =
        std::env::var("COE_SEEDS").ok().map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect());
    for seed in (0..n).filter(|s| chosen.as_ref().is_none_or(|c| c.contains(s))) {
        let (name, packets) = &loads[(seed % loads.len() as u64) as usize];
        let mut schedule = FaultSchedule::random(seed, &c, packets.len() as u64, 4);
        keep(&mut schedule);
        let cfg = EngineConfig { checkpoint_every: 500, ..EngineConfig::default() };
        let r = run_schedule(&c, packets, &schedule, cfg, backend(seed));
        if !r.equivalent {
            failures.push(format!(
                "{label} seed {seed} on {name}:\n{}\n{}",
                schedule.to_yaml(),
                r.comparison.summary()
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {n} schedules not equivalent:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn random_schedules_embedded() {
    property(200, &|_| embedded(), "embedded");
}

#[test]
fn random_schedules_redis() {
    let Some(_) = redis("probe") else {
        panic!("SLUICE_REDIS_URL is not set: run the suite through scripts/test-all.sh, which starts Redis");
    };
    property(200, &|s| redis(&format!("r{s}")).expect("redis"), "redis");
}
