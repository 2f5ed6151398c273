//! The synthetic workload generator: determinism, shape of every flow, checksums, sizes.

mod common;

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use sluice_io::gen::{self, FrameSize, GenConfig, Workload};
use sluice_io::{summarize, TraceReader};
use sluice_packet::{FlowKey, Headers, ParseStatus, L3, L4};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};

fn custom(flows: u64, packets_per_flow: u32, seed: u64) -> GenConfig {
    GenConfig { concurrency: 16, ..GenConfig::new(Workload::Custom { flows, packets_per_flow }, seed) }
}

fn all(cfg: &GenConfig) -> Vec<(u64, Vec<u8>)> {
    gen::generate(cfg).unwrap().collect()
}

/// Checks the IPv4 header checksum and the TCP checksum by recomputing them with etherparse.
fn assert_checksums(frame: &[u8]) {
    let sliced = SlicedPacket::from_ethernet(frame).unwrap();
    let Some(NetSlice::Ipv4(v4)) = &sliced.net else { panic!("not IPv4") };
    let ip = v4.header().to_header();
    assert_eq!(ip.header_checksum, ip.calc_header_checksum(), "IPv4 header checksum");
    let Some(TransportSlice::Tcp(tcp)) = &sliced.transport else { panic!("not TCP") };
    let expected = tcp.to_header().calc_checksum_ipv4(&ip, tcp.payload()).unwrap();
    assert_eq!(tcp.checksum(), expected, "TCP checksum");
}

#[derive(Default)]
struct FlowCheck {
    packets: Vec<Headers>,
    payloads: Vec<usize>,
    first_ts: u64,
    last_ts: u64,
}

/// Verifies every frame and every flow of `frames`, which must come from a workload of `flows`
/// flows of `ppf` packets and at most `concurrency` flows at once. Returns the flows by key.
fn check_workload(
    frames: &[(u64, Vec<u8>)],
    flows: usize,
    ppf: usize,
    concurrency: usize,
) -> HashMap<FlowKey, FlowCheck> {
    let mut by_flow: HashMap<FlowKey, FlowCheck> = HashMap::new();
    let mut prev_ts = 0;
    let mut open = 0usize;
    let mut max_open = 0usize;
    for (ts, frame) in frames {
        assert!(*ts > prev_ts, "timestamps must strictly increase");
        prev_ts = *ts;
        assert!((64..=1500).contains(&frame.len()), "frame of {} bytes", frame.len());
        let h = Headers::parse(frame);
        assert_eq!(h.status, ParseStatus::Ok);
        assert_eq!((h.l3, h.l4), (L3::V4, L4::Tcp));
        assert_checksums(frame);
        let t = h.tuple.unwrap();
        let (client, server, cport, sport) = if h.tcp_flags.syn() && !h.tcp_flags.ack() || (t.dport < 32_768) {
            (t.src, t.dst, t.sport, t.dport)
        } else {
            (t.dst, t.src, t.dport, t.sport)
        };
        let IpAddr::V4(c) = client else { panic!() };
        let IpAddr::V4(s) = server else { panic!() };
        assert_eq!(c.octets()[0], 10, "client {c}");
        assert!(u32::from(s) & 0xfffe_0000 == u32::from(Ipv4Addr::new(198, 18, 0, 0)), "server {s}");
        assert!(cport >= 32_768, "client port {cport}");
        assert!([80, 443, 22, 21, 25, 8080, 3306].contains(&sport), "server port {sport}");
        let f = by_flow.entry(t.flow_key()).or_default();
        if f.packets.is_empty() {
            f.first_ts = *ts;
            open += 1;
            max_open = max_open.max(open);
        }
        f.last_ts = *ts;
        f.packets.push(h);
        f.payloads.push(usize::from(h.payload_len));
        if f.packets.len() == ppf {
            open -= 1;
        }
    }
    assert_eq!(by_flow.len(), flows);
    assert!(max_open <= concurrency, "{max_open} flows open at once, limit {concurrency}");
    for (key, f) in &by_flow {
        assert_eq!(f.packets.len(), ppf, "{key}");
        check_tcp_flow(key, f);
    }
    by_flow
}

/// The flow is a clean TCP connection: handshake, data with exact sequence numbers, teardown.
#[allow(clippy::needless_range_loop)]
fn check_tcp_flow(key: &FlowKey, f: &FlowCheck) {
    let p = &f.packets;
    let n = p.len();
    let flags = |i: usize| p[i].tcp_flags.0;
    const FIN: u8 = 0x01;
    const SYN: u8 = 0x02;
    const PSH: u8 = 0x08;
    const ACK: u8 = 0x10;
    assert_eq!(flags(0), SYN, "{key}: first packet must be a SYN");
    assert_eq!(flags(1), SYN | ACK, "{key}");
    assert_eq!(flags(2), ACK, "{key}");
    assert_eq!(flags(n - 4), FIN | ACK, "{key}");
    assert_eq!(flags(n - 3), ACK, "{key}");
    assert_eq!(flags(n - 2), FIN | ACK, "{key}");
    assert_eq!(flags(n - 1), ACK, "{key}");
    let client = p[0].tuple.unwrap().src;
    let from_client = |i: usize| p[i].tuple.unwrap().src == client;
    assert!(from_client(0) && !from_client(1) && from_client(2));
    assert!(from_client(n - 4) && !from_client(n - 3) && !from_client(n - 2) && from_client(n - 1));
    // Replay the sequence space.
    let mut c_nxt = p[0].tcp_seq.wrapping_add(1);
    assert_eq!(p[1].tcp_ack, c_nxt, "{key}: SYN-ACK acks the SYN");
    let mut s_nxt = p[1].tcp_seq.wrapping_add(1);
    let (mut data_c, mut data_s) = (0, 0);
    for i in 2..n {
        let h = &p[i];
        let (seq, ack) = if from_client(i) { (c_nxt, s_nxt) } else { (s_nxt, c_nxt) };
        assert_eq!(h.tcp_seq, seq, "{key}: packet {i} seq");
        assert_eq!(h.tcp_ack, ack, "{key}: packet {i} ack");
        assert!(h.tcp_flags.ack());
        let len = f.payloads[i] as u32 + u32::from(h.tcp_flags.fin());
        if (3..n - 4).contains(&i) {
            assert_eq!(h.tcp_flags.0, ACK | PSH, "{key}: data packet {i}");
            assert!(f.payloads[i] >= 10, "{key}: data packet {i} carries data");
            if from_client(i) {
                data_c += 1
            } else {
                data_s += 1
            }
        } else {
            assert_eq!(f.payloads[i], 0, "{key}: control packet {i} carries no data");
        }
        if from_client(i) {
            c_nxt = c_nxt.wrapping_add(len)
        } else {
            s_nxt = s_nxt.wrapping_add(len)
        }
    }
    if n >= 9 {
        assert!(data_c >= 1 && data_s >= 1, "{key}: data in both directions");
    }
}

#[test]
fn small_custom_workload_is_well_formed() {
    let cfg = custom(40, 30, 7);
    assert_eq!(cfg.total_packets(), 1_200);
    let frames = all(&cfg);
    assert_eq!(frames.len(), 1_200);
    let flows = check_workload(&frames, 40, 30, 16);
    // Flows are interleaved: with 16 active at once, many flows overlap in time.
    let mut spans: Vec<(u64, u64)> = flows.values().map(|f| (f.first_ts, f.last_ts)).collect();
    spans.sort();
    let overlapping = spans.windows(2).filter(|w| w[1].0 < w[0].1).count();
    assert!(overlapping >= 30, "only {overlapping} overlapping flows");
    // Distinct client endpoints.
    let clients: HashSet<_> =
        flows.values().map(|f| (f.packets[0].tuple.unwrap().src, f.packets[0].tuple.unwrap().sport)).collect();
    assert_eq!(clients.len(), 40);
}

#[test]
fn minimal_flows_have_no_data() {
    let frames = all(&custom(5, 7, 3));
    assert_eq!(frames.len(), 35);
    check_workload(&frames, 5, 7, 16);
}

#[test]
fn deterministic_per_seed() {
    let a = all(&custom(20, 25, 42));
    let b = all(&custom(20, 25, 42));
    assert_eq!(a, b);
    let c = all(&custom(20, 25, 43));
    assert_eq!(c.len(), a.len());
    assert_ne!(a, c);
    // Other seed, other flows.
    let keys = |v: &[(u64, Vec<u8>)]| -> HashSet<FlowKey> {
        v.iter().map(|(_, f)| Headers::parse(f).tuple.unwrap().flow_key()).collect()
    };
    assert!(keys(&a).is_disjoint(&keys(&c)));
}

#[test]
fn fixed_64_byte_frames() {
    let cfg = GenConfig { size: FrameSize::Fixed(64), ..custom(10, 20, 1) };
    let frames = all(&cfg);
    assert!(frames.iter().all(|(_, f)| f.len() == 64));
    check_workload(&frames, 10, 20, 16);
    let cfg = GenConfig { size: FrameSize::Fixed(1500), ..custom(3, 10, 1) };
    let frames = all(&cfg);
    assert!(frames.iter().all(|(_, f)| f.len() == 1500));
    check_workload(&frames, 3, 10, 16);
}

#[test]
fn mixed_sizes_are_bimodal() {
    let frames = all(&custom(20, 200, 5));
    let small = frames.iter().filter(|(_, f)| f.len() <= 200).count();
    let large = frames.iter().filter(|(_, f)| f.len() >= 1400).count();
    let n = frames.len();
    assert!(small > n / 4 && large > n / 4, "small {small}, large {large} of {n}");
    assert!(frames.iter().any(|(_, f)| f.len() == 1500));
    assert!(frames.iter().any(|(_, f)| f.len() == 64));
}

#[test]
fn named_workloads_scale_down() {
    // long at 1/1000: 3 flows of 10,000 packets.
    let cfg = GenConfig { scale: 0.001, ..GenConfig::new(Workload::Long, 9) };
    assert_eq!(cfg.total_flows(), 3);
    let frames = all(&cfg);
    assert_eq!(frames.len(), 30_000);
    check_workload(&frames, 3, 10_000, 4096);
    // short at 1/1000: 100 flows of 100 packets.
    let cfg = GenConfig { scale: 0.001, concurrency: 32, ..GenConfig::new(Workload::Short, 9) };
    let frames = all(&cfg);
    assert_eq!(frames.len(), 10_000);
    check_workload(&frames, 100, 100, 32);
}

#[test]
fn mixed_workload_is_half_long_half_short() {
    let cfg = GenConfig { scale: 0.002, concurrency: 64, ..GenConfig::new(Workload::Mixed, 11) };
    // 3 long flows (30,000 packets) and 300 short ones (30,000 packets).
    assert_eq!(cfg.total_flows(), 303);
    assert_eq!(cfg.total_packets(), 60_000);
    let frames = all(&cfg);
    assert_eq!(frames.len(), 60_000);
    let mut per_flow: HashMap<FlowKey, usize> = HashMap::new();
    for (_, f) in &frames {
        *per_flow.entry(Headers::parse(f).tuple.unwrap().flow_key()).or_default() += 1;
    }
    assert_eq!(per_flow.len(), 303);
    assert_eq!(per_flow.values().filter(|&&n| n == 10_000).count(), 3);
    assert_eq!(per_flow.values().filter(|&&n| n == 100).count(), 300);
}

#[test]
fn write_pcap_and_summarize() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gen.pcap");
    let cfg = custom(25, 40, 2);
    assert_eq!(gen::write_pcap(&cfg, &path).unwrap(), 1_000);
    let s = summarize(&path).unwrap();
    assert_eq!(s.packets, 1_000);
    assert_eq!(s.flows, 25);
    assert_eq!(s.protocols.tcp, 1_000);
    assert_eq!(s.out_of_order, 0);
    // Bytes and timestamps are those of the iterator.
    let mut r = TraceReader::open(&path).unwrap();
    for (ts, frame) in gen::generate(&cfg).unwrap() {
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!(rec.ts_ns, ts);
        assert_eq!(rec.data, &frame[..]);
    }
    assert!(r.next_record().unwrap().is_none());
}

#[test]
fn size_hint_is_exact() {
    let mut g = gen::generate(&custom(3, 10, 1)).unwrap();
    assert_eq!(g.size_hint(), (30, Some(30)));
    g.next();
    assert_eq!(g.remaining(), 29);
    assert_eq!(g.count(), 29);
}
