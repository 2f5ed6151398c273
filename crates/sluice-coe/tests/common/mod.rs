//! Chains, traffic and helpers shared by the COE tests.
#![allow(dead_code)]

use sluice_coe::compare::CompareOptions;
use sluice_coe::engine::EngineConfig;
use sluice_coe::schedule::{Action, At, FaultEvent, FaultSchedule};
use sluice_coe::verify::{verify, VerifyReport};
use sluice_packet::{Meta, Packet};
use sluice_runtime::Chain;
use std::path::Path;
use std::sync::Arc;

/// The CHC example chain with two NAT and two portscan instances.
pub const EXAMPLE: &str = r#"
name: example
vertices:
  nat: { type: nat, instances: 2, config: { external_ip: 198.51.100.1, internal: ["10.0.0.0/8"] } }
  portscan: { type: portscan, instances: 2 }
  lb: { type: lb, config: { backends: [10.1.0.1, 10.1.0.2, 10.1.0.3, 10.1.0.4] } }
  trojan: { type: trojan }
edges:
  - { from: input, to: nat }
  - { from: nat, to: portscan }
  - { from: nat, to: trojan, mirror: true }
  - { from: portscan, to: lb }
  - { from: lb, to: output }
"#;

/// A single NAT (the straggler) in front of the portscan detector.
pub const STRAGGLER: &str = r#"
name: straggler
vertices:
  nat: { type: nat, config: { external_ip: 198.51.100.1, internal: ["10.0.0.0/8"] } }
  portscan: { type: portscan }
edges:
  - { from: input, to: nat }
  - { from: nat, to: portscan }
  - { from: portscan, to: output }
"#;

/// Three scrubbers (SSH, IRC, FTP control and passive data) in front of the Trojan detector.
/// SSH and IRC come first: their clients' ephemeral ports may fall in the FTP data range.
pub const TROJAN: &str = r#"
name: trojan-scrubbers
vertices:
  ssh_scrubber: { type: passthrough }
  ftp_scrubber: { type: passthrough }
  irc_scrubber: { type: passthrough }
  # CHC's detector: it never forgets a host, so it takes packets as they arrive and decides on
  # clocks alone (with a timeout it would ask for entry order, which hides what clocks do).
  trojan: { type: trojan, config: { host_timeout_ms: 0 } }
edges:
  - { from: input, to: ssh_scrubber, filter: "tcp and port == 22" }
  - { from: input, to: irc_scrubber, filter: "tcp and port == 6667" }
  - { from: input, to: ftp_scrubber, filter: "tcp and (port == 21 or port in 40000-50000)" }
  - { from: input, to: trojan }
  - { from: ssh_scrubber, to: trojan }
  - { from: ftp_scrubber, to: trojan }
  - { from: irc_scrubber, to: trojan }
  - { from: trojan, to: output }
"#;

pub fn chain(text: &str) -> Chain {
    Chain::parse(text, Path::new("test.yaml")).expect("chain parses")
}

/// The demo workload (planted port scan and Trojan signature, decoys) at `scale`.
pub fn demo(scale: f64, seed: u64) -> Vec<Packet> {
    let mut cfg = sluice_io::GenConfig::new(sluice_io::Workload::Demo, seed);
    cfg.scale = scale;
    sluice_io::generate(&cfg)
        .expect("generator")
        .map(|(ts_ns, f)| Packet::from_slice(&f, Meta { ts_ns, ..Default::default() }))
        .collect()
}

/// `flows` generated TCP flows of `packets` packets each.
pub fn custom(flows: u64, packets: u32, seed: u64) -> Vec<Packet> {
    let mut cfg = sluice_io::GenConfig::new(sluice_io::Workload::Custom { flows, packets_per_flow: packets }, seed);
    cfg.size = sluice_io::FrameSize::Fixed(64);
    sluice_io::generate(&cfg)
        .expect("generator")
        .map(|(ts_ns, f)| Packet::from_slice(&f, Meta { ts_ns, ..Default::default() }))
        .collect()
}

/// NAT (two instances) in front of a load balancer.
pub const NAT_LB: &str = r#"
name: nat-lb
vertices:
  nat: { type: nat, instances: 2, config: { external_ip: 198.51.100.1, internal: ["10.0.0.0/8"] } }
  lb: { type: lb, config: { backends: [10.1.0.1, 10.1.0.2, 10.1.0.3, 10.1.0.4] } }
edges:
  - { from: input, to: nat }
  - { from: nat, to: lb }
  - { from: lb, to: output }
"#;

/// A real capture from the shared traces.
pub fn trace(name: &str) -> Vec<Packet> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name);
    sluice_io::load(&path, None).expect("shared trace")
}

pub fn embedded() -> Arc<dyn sluice_store::Backend> {
    Arc::new(sluice_store::EmbeddedStore::start(1).expect("store"))
}

/// A fresh keyspace on the test Redis (one bucket: the TS vector recovery uses is per bucket).
pub fn redis(tag: &str) -> Option<Arc<dyn sluice_store::Backend>> {
    let url = std::env::var("SLUICE_REDIS_URL").ok()?;
    Some(redis_at(&url, tag))
}

/// The single Redis servers a test may spread independent keyspaces over: `SLUICE_REDIS_URL`,
/// then those in `SLUICE_REDIS_MORE_URLS` (comma-separated). scripts/test-all.sh names the second
/// lane's server there for the random Redis schedules, which run after both lanes: one server's
/// one thread is what those runs wait for.
pub fn redis_servers() -> Vec<String> {
    let first = std::env::var("SLUICE_REDIS_URL").ok();
    let more = std::env::var("SLUICE_REDIS_MORE_URLS").unwrap_or_default();
    let more = more.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_string);
    let mut servers: Vec<String> = first.into_iter().chain(more).collect();
    servers.dedup();
    servers
}

/// A fresh keyspace on the Redis server at `url` (one bucket, as `redis`).
pub fn redis_at(url: &str, tag: &str) -> Arc<dyn sluice_store::Backend> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let url = format!("{url}?prefix=coe-{tag}-{}-{n}&buckets=1", std::process::id());
    let b = sluice_redis::RedisBackend::connect(&url).expect("redis");
    b.clear().expect("clear");
    Arc::new(b)
}

pub fn event(at: At, action: Action) -> FaultEvent {
    FaultEvent { at, action, line: None }
}

pub fn run(
    c: &Chain,
    packets: &[Packet],
    events: Vec<FaultEvent>,
    cfg: EngineConfig,
    backend: Arc<dyn sluice_store::Backend>,
) -> VerifyReport {
    let schedule = FaultSchedule { events, ..FaultSchedule::default() };
    run_schedule(c, packets, &schedule, cfg, backend)
}

pub fn run_schedule(
    c: &Chain,
    packets: &[Packet],
    schedule: &FaultSchedule,
    cfg: EngineConfig,
    backend: Arc<dyn sluice_store::Backend>,
) -> VerifyReport {
    schedule.validate(c).expect("schedule valid");
    verify(c, &sluice_nfs::registry(), packets, schedule, backend, cfg, &CompareOptions::default())
        .expect("verify runs")
}

/// Hosts the Trojan detector flagged.
pub fn flagged(r: &VerifyReport) -> Vec<String> {
    let mut v: Vec<String> = r.events.iter().filter(|d| d.kind == "trojan").map(|d| d.subject.clone()).collect();
    v.sort();
    v.dedup();
    v
}

/// The demo workload with the planted Trojan signature (SSH, FTP downloads of an HTML, a ZIP and
/// an EXE file, IRC) at `extra` more points, as CHC's R4 experiment plants it at 11: each copy is
/// the planted host's whole session, for host `192.168.77.i`, inserted back to back at
/// `i / (extra + 1)` of the trace. Returns the packets and every host that carries a signature.
pub fn trojan_workload(extra: u8, seed: u64) -> (Vec<Packet>, Vec<String>) {
    use std::net::{IpAddr, Ipv4Addr};
    let base = demo(0.1, seed);
    let host = IpAddr::V4(sluice_io::demo::DEMO_TROJAN_HOST);
    let signature: Vec<Packet> =
        base.iter().filter(|p| p.tuple().is_some_and(|t| t.src == host || t.dst == host)).cloned().collect();
    let mut hosts = vec![host.to_string()];
    let mut out = Vec::with_capacity(base.len() + signature.len() * usize::from(extra));
    let mut points: Vec<(usize, u8)> =
        (1..=extra).map(|i| (base.len() * usize::from(i) / (usize::from(extra) + 1), i)).collect();
    points.reverse();
    for (at, p) in base.into_iter().enumerate() {
        while points.last().is_some_and(|(x, _)| *x == at) {
            let Some((_, i)) = points.pop() else { break };
            let copy = IpAddr::V4(Ipv4Addr::new(192, 168, 77, i));
            hosts.push(copy.to_string());
            for s in &signature {
                let mut s = s.clone();
                let Some(t) = s.tuple() else { continue };
                let r = if t.src == host { s.rewrite_src(copy, t.sport) } else { s.rewrite_dst(copy, t.dport) };
                r.expect("rewrite the planted host");
                s.meta.ts_ns = p.meta.ts_ns;
                out.push(s);
            }
        }
        out.push(p);
    }
    hosts.sort();
    (out, hosts)
}
