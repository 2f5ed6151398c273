//! Where NF state lives must not change what a chain does: every NF, and the example chain,
//! give byte-identical output packets and the same decisions with local state and with a store
//! — embedded, Redis, Redis Cluster — in the external, cached and async modes, on the shared
//! captures and on generated traffic.
//!
//! The Redis tests need `SLUICE_REDIS_URL` and `SLUICE_REDIS_CLUSTER_URL` (scripts/test-all.sh
//! starts the servers and sets them); without them they fail, saying so.

use sluice_packet::Packet;
use sluice_runtime::{compile_with, run, Chain, CollectSink, MemorySource, RunConfig, RunHooks, StateConfig};
use sluice_store::{ClientConfig, EmbeddedStore, Mode};
use std::path::Path;
use std::sync::Arc;

fn trace(name: &str) -> Vec<Packet> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name);
    sluice_io::load(p, None).expect("trace")
}

fn generated() -> Vec<Packet> {
    let cfg = sluice_io::GenConfig::new(sluice_io::Workload::Custom { flows: 300, packets_per_flow: 20 }, 11);
    sluice_io::generate(&cfg)
        .expect("gen")
        .map(|(ts_ns, f)| Packet::from_slice(&f, sluice_packet::Meta { ts_ns, ..Default::default() }))
        .collect()
}

fn demo_prefix(n: usize) -> Vec<Packet> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces/demo.pcap");
    sluice_io::load(p, Some(n)).expect("demo trace")
}

/// Output packets (clock, bytes) and decisions of one run.
type Outcome = (Vec<(u64, Vec<u8>)>, Vec<String>);

fn run_in(chain: &str, packets: &[Packet], state: &StateConfig) -> Outcome {
    let chain = Chain::parse(chain, Path::new("modes.yaml")).expect("chain");
    let plan = compile_with(&chain, &sluice_nfs::registry(), packets, state).expect("plan");
    let cfg = RunConfig { workers: 1, pin: false, batch: 16, window: 2048, ..RunConfig::default() };
    let mut sink = CollectSink::default();
    let r = run(plan, &cfg, &mut MemorySource::new(packets), &mut sink, RunHooks::default()).expect("run");
    assert!(r.balanced());
    assert!(r.dropped.keys().all(|k| !k.starts_with("root:")), "{:?}", r.dropped);
    let mut out: Vec<(u64, Vec<u8>)> = sink.packets.iter().map(|p| (p.meta.clock.0, p.data().to_vec())).collect();
    out.sort();
    let events =
        r.events.iter().map(|e| format!("{} {} {} {} {}", e.clock, e.nf, e.kind, e.subject, e.detail)).collect();
    (out, events)
}

/// Which store a comparison runs against.
#[derive(Clone, Copy, Debug)]
enum Store {
    /// The embedded store with this many shards.
    Embedded(usize),
    /// `SLUICE_REDIS_URL`.
    Redis,
    /// `SLUICE_REDIS_CLUSTER_URL`.
    RedisCluster,
}

fn redis_url(var: &str) -> String {
    let url = std::env::var(var).unwrap_or_default();
    assert!(!url.is_empty(), "{var} is not set: run scripts/test-all.sh, or start scripts/redis-env.sh and set it");
    // A fresh keyspace per run: clients assume an empty store.
    static RUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{url}?prefix=modes-{}-{n}", std::process::id())
}

fn store(mode: Mode, store: Store) -> (StateConfig, Option<Arc<sluice_redis::RedisBackend>>) {
    let client = ClientConfig { mode, ..ClientConfig::default() };
    match store {
        Store::Embedded(shards) => {
            (StateConfig::Store { backend: Arc::new(EmbeddedStore::start(shards).expect("store")), client }, None)
        }
        Store::Redis | Store::RedisCluster => {
            let var = if matches!(store, Store::Redis) { "SLUICE_REDIS_URL" } else { "SLUICE_REDIS_CLUSTER_URL" };
            let b = Arc::new(sluice_redis::RedisBackend::connect(&redis_url(var)).expect("redis"));
            (StateConfig::Store { backend: b.clone(), client }, Some(b))
        }
    }
}

fn assert_same_in_all_modes(chain: &str, packets: &[Packet], what: &str) {
    let stores = [
        (Mode::External, Store::Embedded(1)),
        (Mode::Cached, Store::Embedded(2)),
        (Mode::Async, Store::Embedded(1)),
        (Mode::Async, Store::Embedded(3)),
    ];
    assert_same_with(chain, packets, what, &stores);
}

fn assert_same_with(chain: &str, packets: &[Packet], what: &str, stores: &[(Mode, Store)]) {
    let reference = run_in(chain, packets, &StateConfig::Local);
    assert!(!reference.0.is_empty(), "{what}: no output at all");
    for &(mode, where_) in stores {
        let (state, redis) = store(mode, where_);
        let got = run_in(chain, packets, &state);
        if let Some(r) = redis {
            let _ = r.clear();
        }
        let mode = format!("{mode:?} on {where_:?}");
        assert_eq!(got.0.len(), reference.0.len(), "{what}: {mode} output count");
        for (a, b) in got.0.iter().zip(&reference.0) {
            assert!(a == b, "{what}: {mode} differs at clock {}", b.0);
        }
        assert_eq!(got.1, reference.1, "{what}: {mode} decisions differ");
    }
}

fn single(kind: &str, config: &str) -> String {
    format!(
        "vertices:\n  nf: {{ type: {kind}, config: {config} }}\nedges:\n  - {{ from: input, to: nf }}\n  - {{ from: nf, to: output }}\n"
    )
}

const NF_CONFIGS: [(&str, &str); 6] = [
    ("nat", "{ internal: [\"10.0.0.0/8\", \"192.150.186.0/24\", \"141.142.0.0/16\", \"192.168.0.0/16\"] }"),
    ("lb", "{ backends: [10.1.0.1, 10.1.0.2, 10.1.0.3] }"),
    ("firewall", "{ default: allow, rules: [ { action: deny, proto: tcp, dport: 22 } ] }"),
    ("portscan", "{}"),
    ("trojan", "{}"),
    ("ids", "{}"),
];

#[test]
fn every_nf_is_identical_in_all_modes_on_the_shared_captures() {
    let mut packets = Vec::new();
    for t in ["ssh_ssh.pcap", "http_methods.pcap", "ftp_ipv4.pcap", "irc-basic.pcap", "dns-edns-cookie.pcap"] {
        packets.extend(trace(t));
    }
    for (kind, config) in NF_CONFIGS {
        assert_same_in_all_modes(&single(kind, config), &packets, kind);
    }
}

#[test]
fn every_nf_is_identical_in_all_modes_on_generated_traffic() {
    let packets = generated();
    for (kind, config) in NF_CONFIGS {
        assert_same_in_all_modes(&single(kind, config), &packets, kind);
    }
}

#[test]
fn example_chain_is_identical_in_all_modes_with_its_decisions() {
    let chain = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../chains/example.yaml"))
        .expect("example chain");
    let packets = demo_prefix(20_000);
    let reference = run_in(&chain, &packets, &StateConfig::Local);
    assert!(reference.1.iter().any(|e| e.contains("portscan")), "the demo's scan is detected: {:?}", reference.1);
    assert_same_in_all_modes(&chain, &packets, "example chain");
}

const REDIS_MODES: [(Mode, Store); 3] =
    [(Mode::External, Store::Redis), (Mode::Cached, Store::Redis), (Mode::Async, Store::Redis)];

#[test]
fn every_nf_is_identical_in_all_modes_with_redis() {
    let mut packets = Vec::new();
    for t in ["ssh_ssh.pcap", "http_methods.pcap", "ftp_ipv4.pcap", "irc-basic.pcap", "dns-edns-cookie.pcap"] {
        packets.extend(trace(t));
    }
    let generated = generated();
    for (kind, config) in NF_CONFIGS {
        assert_same_with(&single(kind, config), &packets, &format!("{kind} on captures"), &REDIS_MODES);
        assert_same_with(&single(kind, config), &generated, &format!("{kind} on generated traffic"), &REDIS_MODES);
    }
}

#[test]
fn every_nf_is_identical_in_async_mode_with_redis_cluster() {
    let mut packets = trace("http_methods.pcap");
    packets.extend(generated());
    for (kind, config) in NF_CONFIGS {
        assert_same_with(&single(kind, config), &packets, kind, &[(Mode::Async, Store::RedisCluster)]);
    }
}
