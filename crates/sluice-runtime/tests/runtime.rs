//! The runtime over real captures: accounting, per-flow order, mirrors, windows, splitting.

use sluice_packet::{Clock, FlowKey, Meta, Packet};
use sluice_runtime::{compile, run, Chain, CollectSink, MemorySource, Overflow, RunConfig, RunHooks};
use std::collections::HashMap;
use std::path::Path;

fn load(name: &str) -> Vec<Packet> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name);
    let data = std::fs::read(path).expect("trace");
    // Classic little-endian microsecond pcap (all shared traces are).
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= data.len() {
        let u = |o: usize| u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
        let (sec, usec, cap) = (u(off), u(off + 4), u(off + 8) as usize);
        let frame = &data[off + 16..off + 16 + cap];
        let meta = Meta { ts_ns: u64::from(sec) * 1_000_000_000 + u64::from(usec) * 1000, ..Meta::default() };
        out.push(Packet::from_slice(frame, meta));
        off += 16 + cap;
    }
    out
}

fn chain(text: &str) -> Chain {
    Chain::parse(text, Path::new("test.yaml")).expect("chain")
}

fn cfg(workers: usize) -> RunConfig {
    RunConfig { workers, pin: false, batch: 16, window: 4096, ..RunConfig::default() }
}

const TWO_STAGE: &str = "
vertices:
  a: { type: passthrough, instances: 3 }
  b: { type: passthrough, instances: 2 }
  tap: { type: passthrough }
edges:
  - { from: input, to: a }
  - { from: a, to: b }
  - { from: a, to: tap, mirror: true }
  - { from: b, to: output }
";

#[test]
fn every_packet_out_in_flow_order_with_mirror_copies_consumed() {
    let pkts = load("http_methods.pcap");
    let plan = compile(&chain(TWO_STAGE), &sluice_nfs::registry(), &pkts).expect("plan");
    let mut sink = CollectSink::default();
    let r = run(plan, &cfg(2), &mut MemorySource::new(&pkts), &mut sink, RunHooks::default()).expect("run");
    assert_eq!(r.packets_in, pkts.len() as u64);
    assert_eq!(r.packets_out, pkts.len() as u64);
    assert!(r.balanced());
    assert_eq!(r.mirrored, pkts.len() as u64);
    let tap = r.vertices.iter().find(|v| v.name == "tap").expect("tap");
    assert_eq!(tap.instances[0].consumed, pkts.len() as u64);
    // Per-flow order: clocks increase along each flow at the output.
    let mut last: HashMap<FlowKey, Clock> = HashMap::new();
    for p in &sink.packets {
        let k = p.tuple().expect("ip").flow_key();
        if let Some(prev) = last.insert(k, p.meta.clock) {
            assert!(prev < p.meta.clock, "flow {k} reordered");
        }
    }
    // Bytes unchanged by pass-through NFs.
    let mut out: Vec<_> = sink.packets.iter().map(|p| (p.meta.clock, p.data().to_vec())).collect();
    out.sort();
    for (i, (_, d)) in out.iter().enumerate() {
        assert_eq!(d.as_slice(), pkts[i].data());
    }
}

#[test]
fn tiny_window_waits_without_loss_or_drops_and_counts() {
    let pkts = load("ssh_ssh.pcap");
    let c = chain(TWO_STAGE);
    let mut wait = cfg(2);
    wait.window = 16;
    let plan = compile(&c, &sluice_nfs::registry(), &[]).expect("plan");
    let r =
        run(plan, &wait, &mut MemorySource::new(&pkts), &mut CollectSink::default(), RunHooks::default()).expect("run");
    assert_eq!(r.packets_out, pkts.len() as u64);
    let mut drop = wait.clone();
    drop.overflow = Overflow::Drop;
    let plan = compile(&c, &sluice_nfs::registry(), &[]).expect("plan");
    let r =
        run(plan, &drop, &mut MemorySource::new(&pkts), &mut CollectSink::default(), RunHooks::default()).expect("run");
    assert!(r.balanced(), "{r}");
    let full = r.dropped.get("root: window-full").copied().unwrap_or(0);
    assert_eq!(r.packets_out + full, pkts.len() as u64);
}

#[test]
fn filters_route_and_unrouted_packets_are_counted() {
    let pkts = load("ftp_ipv4.pcap");
    let text = "
vertices:
  ctl: { type: passthrough }
  data: { type: passthrough }
edges:
  - { from: input, to: ctl, filter: \"tcp and port == 21\" }
  - { from: input, to: data, filter: \"tcp\" }
  - { from: ctl, to: output }
  - { from: data, to: output, filter: \"port in 1024-65535\" }
";
    let plan = compile(&chain(text), &sluice_nfs::registry(), &[]).expect("plan");
    let r = run(plan, &cfg(1), &mut MemorySource::new(&pkts), &mut CollectSink::default(), RunHooks::default())
        .expect("run");
    let port = |p: &Packet, n: u16| p.tuple().is_some_and(|t| t.sport == n || t.dport == n);
    let ctl = pkts.iter().filter(|p| port(p, 21)).count() as u64;
    let v = |n: &str| r.vertices.iter().find(|v| v.name == n).map(|v| v.packets_in()).unwrap_or(0);
    assert_eq!(v("ctl"), ctl);
    assert_eq!(v("data"), pkts.len() as u64 - ctl);
    assert!(r.balanced());
    let data_out: u64 = pkts
        .iter()
        .filter(|p| !port(p, 21))
        .filter(|p| p.tuple().is_some_and(|t| t.sport >= 1024 || t.dport >= 1024))
        .count() as u64;
    assert_eq!(r.packets_out, ctl + data_out);
}

/// Live statistics end equal to the run's report, and a slowed instance spends its delay on
/// every packet; bad control requests change nothing.
#[test]
fn live_statistics_match_the_report_and_slow_instances_take_longer() {
    use sluice_runtime::live::{Live, LiveError};
    let pkts = load("http_methods.pcap");
    let plan = compile(&chain(TWO_STAGE), &sluice_nfs::registry(), &pkts).expect("plan");
    let live = std::sync::Arc::new(Live::new(&plan));
    assert_eq!(live.set_slow("nope", 0, 1, 2), Err(LiveError::NoVertex("nope".into())));
    assert!(matches!(live.set_slow("b", 9, 1, 2), Err(LiveError::NoInstance { index: 9, .. })));
    assert!(matches!(live.set_slow("b", 0, 5, 1), Err(LiveError::BadDelay { .. })));
    assert!(live.snapshot().vertices.iter().flat_map(|v| &v.instances).all(|i| i.slow_us.is_none()));
    live.set_slow("b", 0, 20, 20).expect("slow b:0");
    let hooks = RunHooks { live: Some(live.clone()), ..RunHooks::default() };
    let r = run(plan, &cfg(2), &mut MemorySource::new(&pkts), &mut CollectSink::default(), hooks).expect("run");
    let s = live.snapshot();
    assert_eq!((s.packets_in, s.packets_out), (r.packets_in, r.packets_out));
    assert_eq!(s.in_flight, 0, "nothing left in the chain");
    for (lv, rv) in s.vertices.iter().zip(&r.vertices) {
        assert_eq!(lv.name, rv.name);
        let mut report: Vec<(u16, u64, u64)> =
            rv.instances.iter().map(|i| (i.index, i.packets_in, i.forwarded)).collect();
        let mut seen: Vec<(u16, u64, u64)> =
            lv.instances.iter().map(|i| (i.index, i.packets_in, i.forwarded)).collect();
        report.sort_unstable();
        seen.sort_unstable();
        assert_eq!(seen, report, "vertex {}", lv.name);
    }
    let b0 = s.vertices.iter().find(|v| v.name == "b").and_then(|v| v.instances.iter().find(|i| i.index == 0));
    let b0 = b0.expect("b:0");
    assert!(b0.packets_in > 0);
    assert!(b0.busy_s >= b0.packets_in as f64 * 20e-6, "{} packets in {} s", b0.packets_in, b0.busy_s);
    assert_eq!(b0.slow_us, Some((20, 20)));
    // A run whose input has ended takes no more changes: they are refused, not left untaken.
    let ended = |r: Result<sluice_runtime::live::Done, LiveError>| matches!(r, Err(LiveError::Refused(why)) if why.contains("input has ended"));
    assert!(ended(live.request_crash("b", 0)));
    assert!(ended(live.request_change("b", sluice_runtime::exec::Change::ScaleTo(2))));
    assert!(ended(live.request_root_crash(0)));
}
