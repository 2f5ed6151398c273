//! Acceptance: random fault schedules over real captures and generated workloads; `verify`
//! must find every physical run equivalent to the reference, on the embedded store and on
//! Redis. A failing case prints its seed and schedule (YAML) so it can be rerun with
//! `sluice verify --faults`.

mod common;

use common::*;
use sluice_coe::engine::EngineConfig;
use sluice_coe::schedule::{Action, FaultSchedule};
use sluice_packet::Packet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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

/// Runs schedules `0..n` (or the seeds in `COE_SEEDS=3,17`, to rerun chosen ones) over the
/// workloads cut to `limit` packets, on `threads` threads, each schedule on a fresh store from
/// `backend`. Every schedule must be equivalent and leave nothing in the root's log.
fn property(
    n: u64,
    limit: usize,
    threads: usize,
    backend: &(dyn Fn(u64) -> Arc<dyn sluice_store::Backend> + Sync),
    label: &str,
) {
    let c = chain(EXAMPLE);
    let loads: Vec<(&str, Vec<Packet>)> =
        workloads().into_iter().map(|(n, p)| (n, p.into_iter().take(limit).collect())).collect();
    let chosen: Option<Vec<u64>> =
        std::env::var("COE_SEEDS").ok().map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect());
    let seeds: Vec<u64> = (0..n).filter(|s| chosen.as_ref().is_none_or(|c| c.contains(s))).collect();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let run_one = |seed: u64| -> Option<String> {
        let (name, packets) = &loads[(seed % loads.len() as u64) as usize];
        let mut schedule = FaultSchedule::random(seed, &c, packets.len() as u64, 4);
        keep(&mut schedule);
        let cfg = EngineConfig { checkpoint_every: 500, ..EngineConfig::default() };
        let store = backend(seed);
        let r = run_schedule(&c, packets, &schedule, cfg, store.clone());
        // Leave the test server as it was found.
        let _ = store.wipe();
        // Equivalent, and nothing left behind: every packet the root logged has left the
        // chain with all its updates committed (a packet stuck in the log would be replayed
        // after any later failure, and the log would fill).
        (!r.equivalent || r.engine.log_left != 0).then(|| {
            format!(
                "{label} seed {seed} on {name}: {} packet(s) left in the root's log\n{}\n{}",
                r.engine.log_left,
                schedule.to_yaml(),
                r.comparison.summary()
            )
        })
    };
    // Schedules are independent (each has its own store or keyspace): share them out.
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                while let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Some(f) = run_one(seed) {
                        failures.lock().unwrap_or_else(|e| e.into_inner()).push((seed, f));
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort();
    let text: Vec<String> = failures.iter().map(|(_, f)| f.clone()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} {label} schedules failed:\n{}",
        failures.len(),
        seeds.len(),
        text.join("\n")
    );
    eprintln!("{label}: {} random schedules, every one equivalent", seeds.len());
}

#[test]
fn random_schedules_embedded() {
    property(200, usize::MAX, 2, &|_| embedded(), "embedded");
}

#[test]
fn random_schedules_redis() {
    let Some(_) = redis("probe") else {
        panic!("SLUICE_REDIS_URL is not set: run the suite through scripts/test-all.sh, which starts Redis");
    };
    // The same schedules over the same workloads as on the embedded store. Every operation of
    // the physical chain that must wait for the store is a round trip to Redis, so four
    // schedules run at a time (the threads mostly wait on the network). `COE_REDIS_SCHEDULES`
    // changes the count, `COE_REDIS_PACKETS` cuts the workloads (quicker local runs).
    let n = std::env::var("COE_REDIS_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let limit = std::env::var("COE_REDIS_PACKETS").ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX);
    property(n, limit, 4, &|s| redis(&format!("r{s}")).expect("redis"), "redis");
}
