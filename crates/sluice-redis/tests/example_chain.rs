//! The example chain (NAT → portscan → LB, Trojan detector off-path) over `traces/demo.pcap`
//! with its state in Redis (single server and cluster) in the external, cached and async modes
//! gives byte-identical output packets and the same events as with local state. Each run uses
//! a fresh keyspace (`ClientConfig::fresh` assumes an empty store). Needs `SLUICE_REDIS_URL` /
//! `SLUICE_REDIS_CLUSTER_URL`.

mod common;

use common::{fresh, Target};
use sluice_packet::Packet;
use sluice_runtime::{compile_with, run, Chain, CollectSink, MemorySource, RunConfig, RunHooks, StateConfig};
use sluice_store::{Backend, ClientConfig, Mode};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Output packets (clock, bytes) and events of one run, sorted by clock.
type Outcome = (Vec<(u64, Vec<u8>)>, Vec<String>);

fn run_in(chain: &Chain, packets: &[Packet], state: &StateConfig) -> Outcome {
    let plan = compile_with(chain, &sluice_nfs::registry(), packets, state).expect("plan");
    // No periodic checkpoints: this test compares outputs across modes, and a checkpoint dumps
    // the whole keyspace while the chain waits (checkpoint cost is measured in bench-store).
    let cfg =
        RunConfig { workers: 1, pin: false, batch: 32, window: 2048, checkpoint_every: None, ..RunConfig::default() };
    let mut sink = CollectSink::default();
    let r = run(plan, &cfg, &mut MemorySource::new(packets), &mut sink, RunHooks::default()).expect("run");
    assert!(r.balanced());
    assert!(r.dropped.keys().all(|k| !k.starts_with("root:")), "{:?}", r.dropped);
    let mut out: Vec<(u64, Vec<u8>)> = sink.packets.iter().map(|p| (p.meta.clock.0, p.data().to_vec())).collect();
    out.sort();
    let mut events: Vec<(u64, String)> = r
        .events
        .iter()
        .map(|e| (e.clock.0, format!("{} {} {} {} {}", e.clock, e.nf, e.kind, e.subject, e.detail)))
        .collect();
    events.sort();
    (out, events.into_iter().map(|e| e.1).collect())
}

#[test]
fn redis_backend_runs_the_example_chain_identically() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let chain = Chain::load(&root.join("chains/example.yaml")).expect("example chain");
    let packets = sluice_io::load(root.join("traces/demo.pcap"), None).expect("demo trace");
    let reference = run_in(&chain, &packets, &StateConfig::Local);
    assert!(!reference.0.is_empty(), "no output");
    assert!(reference.1.iter().any(|e| e.contains("portscan")), "the demo's scan is detected: {:?}", reference.1);
    // Only the async mode on a single server takes the whole trace; the other runs take its
    // first 20,000 packets (the portscan is in them): the external mode costs a round trip per
    // operation (it took most of the test's four minutes over the whole trace), the cached mode
    // one per flow's first packet, and the cluster one drain per node per batch.
    let prefix = 20_000.min(packets.len());
    let reference_prefix = run_in(&chain, &packets[..prefix], &StateConfig::Local);
    // The six runs wait on Redis round trips, each in its own keyspace: all at once.
    let runs: Vec<(Target, Mode)> = [Target::Single, Target::Cluster]
        .into_iter()
        .flat_map(|t| [Mode::External, Mode::Cached, Mode::Async].map(|m| (t, m)))
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .map(|&(target, mode)| {
                let (packets, reference) = match (target, mode) {
                    (Target::Single, Mode::Async) => (&packets[..], &reference),
                    _ => (&packets[..prefix], &reference_prefix),
                };
                let chain = &chain;
                scope.spawn(move || {
                    let f = fresh(target, "");
                    let name = f.backend.name();
                    let backend: Arc<dyn Backend> = Arc::new(f.backend.clone());
                    let state =
                        StateConfig::Store { backend, client: ClientConfig { mode, ..ClientConfig::default() } };
                    let t = Instant::now();
                    let got = run_in(chain, packets, &state);
                    eprintln!("{mode:?} on {name}: {} packets in {:.2?}", packets.len(), t.elapsed());
                    assert_eq!(got.0.len(), reference.0.len(), "{mode:?} on {name}: output count");
                    for (a, b) in got.0.iter().zip(&reference.0) {
                        assert!(a == b, "{mode:?} on {name}: output differs at clock {}", b.0);
                    }
                    assert_eq!(got.1, reference.1, "{mode:?} on {name}: events differ");
                })
            })
            .collect();
        for h in handles {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
    assert!(reference.1.iter().any(|e| e.contains("portscan")), "no portscan event in the reference");
}
