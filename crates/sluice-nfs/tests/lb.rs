//! Load balancer over real captures: least-connections choice, stickiness, counts back to zero,
//! byte accounting, the backend→client path, and robustness.

mod common;
mod nfa_support;
mod synth;

use common::{load_trace, run};
use nfa_support::{advance_all, checksums_ok, icmp_echo_frame, instance, raw, udp_frame, valid_before, Probe};
use proptest::prelude::*;
use sluice_nf::{Instance, StateKey, Value, Verdict};
use sluice_nfs::lb::{ACTIVE, BYTES, CONNS, REVERSE};
use sluice_packet::{FlowKey, Packet, Proto};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use synth::{tcp_frame, ACK, FIN, SYN};

fn counts(probe: &Probe, n: usize) -> Vec<i64> {
    match probe.get(ACTIVE, StateKey::Unit) {
        Some(Value::Ints(v)) => v[..n].to_vec(),
        None => vec![0; n],
        other => panic!("{other:?}"),
    }
}

fn backend_index(ip: IpAddr) -> usize {
    match ip {
        IpAddr::V4(a) if a.octets()[..3] == [10, 1, 0] => usize::from(a.octets()[3]) - 1,
        _ => panic!("{ip} is not a default backend"),
    }
}

/// Runs `pkts` through `lb` (default four backends), checking on every new connection that the
/// chosen backend had the fewest active connections, and that every client packet of a
/// connection goes to one backend. Returns flow → backend and the bytes of balanced packets.
fn balance(
    lb: &mut Instance,
    probe: &Probe,
    pkts: Vec<Packet>,
    is_client: impl Fn(&Packet) -> bool,
) -> (HashMap<FlowKey, usize>, i64) {
    let mut chosen: HashMap<FlowKey, usize> = HashMap::new();
    let mut bytes = 0i64;
    let mut max_spread_before_close = 0;
    let mut closed_any = false;
    for (i, mut p) in pkts.into_iter().enumerate() {
        let orig = p.tuple().unwrap();
        let before = counts(probe, 4);
        let v = lb.process(&mut p);
        assert_eq!(v, Verdict::Forward, "packet {i}");
        bytes += p.len() as i64;
        let after = counts(probe, 4);
        if after.iter().sum::<i64>() < before.iter().sum::<i64>() {
            closed_any = true;
        }
        if !is_client(&p) && orig.proto == Proto::TCP {
            // Replies (from the VIP itself in these captures) pass untouched.
            assert_eq!(p.tuple(), Some(orig), "packet {i}");
            continue;
        }
        let t = p.tuple().unwrap();
        let b = backend_index(t.dst);
        assert_eq!(t.dport, orig.dport, "port kept");
        match chosen.get(&orig.flow_key()) {
            Some(&prev) => assert_eq!(prev, b, "packet {i}: connection moved backend"),
            None => {
                let min = *before.iter().min().unwrap();
                assert_eq!(before[b], min, "packet {i}: {b} not least loaded in {before:?}");
                chosen.insert(orig.flow_key(), b);
            }
        }
        if !closed_any {
            let spread = after.iter().max().unwrap() - after.iter().min().unwrap();
            max_spread_before_close = max_spread_before_close.max(spread);
        }
    }
    assert!(max_spread_before_close <= 1, "counts differ by more than one while only opening");
    (chosen, bytes)
}

fn assert_drained(lb: &mut Instance, probe: &Probe, end_ns: u64) {
    advance_all(lb, probe, end_ns + 400_000_000_000);
    assert_eq!(counts(probe, 4), vec![0; 4]);
    assert_eq!(probe.len(CONNS), 0);
    assert_eq!(probe.len(REVERSE), 0);
    assert_eq!(probe.timers(), 0);
}

fn bytes_per_backend(probe: &Probe) -> Vec<i64> {
    (0..4).map(|i| probe.get(BYTES, StateKey::Id(i)).and_then(|v| v.as_int()).unwrap_or(0)).collect()
}

#[test]
fn http_connections_least_connections_sticky_and_drained() {
    let server: IpAddr = "173.194.75.103".parse().unwrap();
    let (mut lb, probe) = instance("lb", "vips: ['173.194.75.103:80']");
    let pkts = load_trace("http_methods.pcap");
    let end = pkts.iter().map(|p| p.meta.ts_ns).max().unwrap();
    let valid = valid_before(&pkts);
    let copy = pkts.clone();
    let (chosen, bytes) = balance(&mut lb, &probe, pkts, |p| p.tuple().unwrap().src != server);
    assert_eq!(chosen.len(), 49);
    let mut per: BTreeMap<usize, usize> = BTreeMap::new();
    for b in chosen.values() {
        *per.entry(*b).or_default() += 1;
    }
    assert_eq!(per.len(), 4, "every backend used: {per:?}");
    assert!(per.values().max().unwrap() - per.values().min().unwrap() <= 1, "{per:?}");
    assert_eq!(bytes_per_backend(&probe).iter().sum::<i64>(), bytes);
    // Checksums of rewritten packets still verify.
    let (mut lb2, _) = instance("lb", "vips: ['173.194.75.103:80']");
    for (i, (_, p)) in run(&mut lb2, copy).into_iter().enumerate() {
        if valid[i] {
            assert_eq!(checksums_ok(p.data()), Some(true), "packet {i}");
        }
    }
    // All connections closed with FINs: counts are already 0; the mappings linger.
    assert_eq!(counts(&probe, 4), vec![0; 4]);
    assert_drained(&mut lb, &probe, end);
}

#[test]
fn echo_connections_balanced_over_500_overlapping_connections() {
    let (mut lb, probe) = instance("lb", "vips: ['127.0.0.1:7000']\ntimeout: 60");
    let pkts = load_trace("echo-connections.pcap");
    let end = pkts.iter().map(|p| p.meta.ts_ns).max().unwrap();
    let (chosen, bytes) = balance(&mut lb, &probe, pkts, |p| p.tuple().unwrap().sport != 7000);
    assert_eq!(chosen.len(), 500);
    let mut per = [0usize; 4];
    for b in chosen.values() {
        per[*b] += 1;
    }
    assert!(per.iter().all(|&n| n >= 100), "{per:?}");
    assert_eq!(bytes_per_backend(&probe).iter().sum::<i64>(), bytes);
    assert_drained(&mut lb, &probe, end);
}

#[test]
fn backend_replies_get_the_vip_back() {
    let server: IpAddr = "173.194.75.103".parse().unwrap();
    let (mut lb, probe) = instance("lb", "vips: ['173.194.75.103:80']\nbackends: [10.1.0.1, '10.1.0.2:8080']");
    let pkts = load_trace("http_methods.pcap");
    let valid = valid_before(&pkts);
    let mut backend_of: HashMap<(IpAddr, u16), (IpAddr, u16)> = HashMap::new();
    let mut total = 0i64;
    for (i, p) in pkts.into_iter().enumerate() {
        let t = p.tuple().unwrap();
        let mut q = p.clone();
        if t.src != server {
            assert_eq!(lb.process(&mut q), Verdict::Forward);
            let n = q.tuple().unwrap();
            if n.dst.to_string() == "10.1.0.2" {
                assert_eq!(n.dport, 8080, "backend port");
            } else {
                assert_eq!(n.dport, 80);
            }
            backend_of.insert((t.src, t.sport), (n.dst, n.dport));
        } else {
            // As the reply leaves the backend, behind the balancer.
            let (bip, bport) = backend_of[&(t.dst, t.dport)];
            q.rewrite_src(bip, bport).unwrap();
            assert_eq!(lb.process(&mut q), Verdict::Forward);
            assert_eq!(q.tuple(), Some(t), "packet {i}: source restored to the VIP");
            if valid[i] {
                assert_eq!(checksums_ok(q.data()), Some(true));
            }
        }
        total += q.len() as i64;
    }
    let sum: i64 = (0..2).map(|i| probe.get(BYTES, StateKey::Id(i)).and_then(|v| v.as_int()).unwrap_or(0)).sum();
    assert_eq!(sum, total);
    assert_eq!(counts(&probe, 2), vec![0, 0], "FINs seen on the backend path close too");
}

#[test]
fn non_vip_and_other_protocols_pass_untouched() {
    let (mut lb, probe) = instance("lb", "vips: ['203.0.113.10']");
    let mut p = raw(&udp_frame([192, 0, 2, 1], 5000, [203, 0, 113, 11], 53, b"q"), 1);
    let before = p.data().to_vec();
    assert_eq!(lb.process(&mut p), Verdict::Forward);
    assert_eq!(p.data(), &before[..]);
    // UDP to the VIP is balanced; the idle timeout ends it.
    let mut p = raw(&udp_frame([192, 0, 2, 1], 5000, [203, 0, 113, 10], 53, b"q"), 1);
    assert_eq!(lb.process(&mut p), Verdict::Forward);
    assert_eq!(p.tuple().unwrap().dst.to_string(), "10.1.0.1");
    assert_eq!(checksums_ok(p.data()), Some(true));
    assert_eq!(counts(&probe, 4), vec![1, 0, 0, 0]);
    advance_all(&mut lb, &probe, 1 + 301_000_000_000);
    assert_eq!(counts(&probe, 4), vec![0; 4]);
    assert_eq!(probe.len(CONNS) + probe.len(REVERSE), 0);
}

#[test]
fn rst_and_idle_timeout_decrement_once() {
    let (mut lb, probe) = instance("lb", "vips: ['173.194.75.103:80']\ntimeout: 30");
    let pkts = load_trace("http_methods.pcap");
    let syn = pkts[0].clone();
    assert!(syn.hdr().tcp_flags.syn());
    let mut p = syn.clone();
    lb.process(&mut p);
    assert_eq!(counts(&probe, 4).iter().sum::<i64>(), 1);
    // A RST from the client ends the connection; a second RST changes nothing.
    for _ in 0..2 {
        let mut r = syn.clone();
        r.edit(|d| {
            let off = 14 + 20 + 13;
            d[off] = 0x04;
        });
        lb.process(&mut r);
        assert_eq!(counts(&probe, 4).iter().sum::<i64>(), 0);
    }
    // The lingering mapping expires without a second decrement.
    advance_all(&mut lb, &probe, syn.meta.ts_ns + 100_000_000_000);
    assert_eq!(counts(&probe, 4), vec![0; 4]);
    assert_eq!(probe.len(CONNS), 0);
}

const S: u64 = 1_000_000_000;

/// A packet of the connection 192.0.2.1:40000 ↔ 203.0.113.10:80 at time `ts_ns`, from the
/// client or (a capture in front of the balancer) from the VIP.
fn conn_pkt(from_client: bool, flags: u8, ts_ns: u64) -> Packet {
    let (c, v) = ([192, 0, 2, 1], [203, 0, 113, 10]);
    let f = if from_client {
        tcp_frame(c, 40000, v, 80, 1, 1, flags, b"")
    } else {
        tcp_frame(v, 80, c, 40000, 1, 1, flags, b"")
    };
    raw(&f, ts_ns)
}

#[test]
fn closed_mapping_keeps_its_linger_deadline_despite_later_packets() {
    let (mut lb, probe) = instance("lb", "vips: ['203.0.113.10:80']\ntimeout: 300\nlinger: 10");
    let t0 = S;
    for (from_client, flags, ts) in [
        (true, SYN, t0),
        (false, SYN | ACK, t0),
        (true, ACK, t0),
        (true, FIN | ACK, t0 + S),
        (false, FIN | ACK, t0 + 2 * S),
    ] {
        let mut p = conn_pkt(from_client, flags, ts);
        assert_eq!(lb.process(&mut p), Verdict::Forward);
    }
    // Both FINs seen at t0 + 2 s: closed, count released, mapping due at t0 + 12 s.
    assert_eq!(counts(&probe, 4), vec![0; 4]);
    assert_eq!(probe.len(CONNS), 1);
    // The client's last ACK, 3 s later, still reaches the connection's backend...
    let mut p = conn_pkt(true, ACK, t0 + 5 * S);
    assert_eq!(lb.process(&mut p), Verdict::Forward);
    assert_eq!(p.tuple().unwrap().dst.to_string(), "10.1.0.1");
    // ...but does not extend the mapping: it goes `linger` after the close, not after the ACK
    // (t0 + 15 s) and certainly not `timeout` after it (t0 + 305 s).
    advance_all(&mut lb, &probe, t0 + 12 * S + 1);
    assert_eq!(probe.len(CONNS), 0, "closed mapping outlived its linger time");
    assert_eq!(probe.len(REVERSE), 0);
    assert_eq!(probe.timers(), 0);
    assert_eq!(counts(&probe, 4), vec![0; 4], "no second decrement");
}

/// `frame` (Ethernet/IPv4) turned into an IP fragment: the first one (more-fragments set) or a
/// later one (offset 1480 bytes), with its IP header checksum recomputed.
fn fragment(mut frame: Vec<u8>, first: bool) -> Vec<u8> {
    let word: u16 = if first { 0x2000 } else { 1480 / 8 };
    frame[20..22].copy_from_slice(&word.to_be_bytes());
    frame[24..26].copy_from_slice(&[0, 0]);
    let mut sum: u32 = frame[14..34].chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    frame
}

#[test]
fn tcp_and_udp_fragments_to_a_vip_or_from_a_backend_are_dropped() {
    let (c, v) = ([192, 0, 2, 1], [203, 0, 113, 10]);
    for vips in ["[]", "['203.0.113.10:80']", "['203.0.113.10']"] {
        let (mut lb, probe) = instance("lb", &format!("vips: {vips}"));
        let frames = [
            tcp_frame(c, 40000, v, 80, 1, 0, SYN, b""),
            tcp_frame(c, 40000, v, 80, 1, 1, ACK, b"data"),
            udp_frame(c, 5000, v, 80, b"q"),
            // A backend's reply to a client, e.g. behind the balancer.
            udp_frame([10, 1, 0, 2], 80, c, 5000, b"r"),
        ];
        for (i, f) in frames.into_iter().enumerate() {
            for first in [true, false] {
                let mut p = raw(&fragment(f.clone(), first), 1);
                assert!(p.hdr().fragmented);
                let before = p.data().to_vec();
                assert_eq!(lb.process(&mut p), Verdict::Drop("lb-fragment"), "vips {vips}, frame {i}, first {first}");
                assert_eq!(p.data(), &before[..]);
            }
        }
        assert_eq!(counts(&probe, 4), vec![0; 4], "fragments are not balanced");
        assert_eq!(probe.len(CONNS) + probe.len(REVERSE), 0);
        assert_eq!(probe.timers(), 0);
        // Fragments outside the balancer's addresses, or of other protocols, pass untouched.
        for f in [udp_frame(c, 5000, [198, 51, 100, 7], 80, b"q"), icmp_echo_frame(c, v, 8, 7, 1)] {
            let mut p = raw(&fragment(f, true), 1);
            let before = p.data().to_vec();
            if vips == "[]" && p.tuple().unwrap().proto == Proto::UDP {
                // With no VIPs every destination is a VIP.
                assert_eq!(lb.process(&mut p), Verdict::Drop("lb-fragment"));
            } else {
                assert_eq!(lb.process(&mut p), Verdict::Forward, "vips {vips}");
                assert_eq!(p.data(), &before[..]);
            }
        }
    }
}

#[test]
fn config_is_validated() {
    let reg = sluice_nfs::registry();
    let bad = [
        ("backends: []", "backends"),
        ("backends: [10.0.0.1, nope]", "backends[1]"),
        ("backends: [10.0.0.1, '::1']", "backends[1]"),
        ("backends: [10.0.0.1, 10.0.0.1]", "backends[1]"),
        ("vips: ['10.9.9.9:0']", "vips[0]"),
        ("vips: ['::1']", "vips[0]"),
        ("timeout: 0", "timeout"),
        ("linger: 0", "linger"),
        ("servers: []", ""),
    ];
    for (yaml, field) in bad {
        let v: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        match sluice_nf::local_instance(&reg, "lb", &v) {
            Err(sluice_nf::NfError::Config { field: f, .. }) => assert!(f.starts_with(field), "{yaml}: {f}"),
            Err(e) => panic!("{yaml}: {e}"),
            Ok(_) => panic!("{yaml} accepted"),
        }
    }
    assert!(sluice_nf::local_instance(&reg, "lb", &serde_yaml::Value::Null).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let (mut lb, _) = instance("lb", "{}");
        let mut p = raw(&bytes, 1);
        let _ = lb.process(&mut p);
    }

    #[test]
    fn never_panics_on_truncated_or_corrupted_packets(
        picks in proptest::collection::vec((0usize..655, 0usize..1600, 0usize..80, any::<u8>()), 1..8)
    ) {
        thread_local!(static PKTS: Vec<Packet> = load_trace("http_methods.pcap"));
        let (mut lb, _) = instance("lb", "vips: ['173.194.75.103']\nbackends: [10.1.0.1, '173.194.75.104:80']");
        let mut seen = BTreeSet::new();
        for (idx, cut, flip, val) in picks {
            let mut bytes = PKTS.with(|p| p[idx].data().to_vec());
            if flip < bytes.len() { bytes[flip] = val; }
            bytes.truncate(cut);
            let mut p = raw(&bytes, idx as u64);
            let _ = lb.process(&mut p);
            seen.insert(idx);
        }
    }
}

/// `policy: random`: every connection sticks to the backend drawn for it, draws spread over all
/// backends, and the active counts still add up to the open connections.
#[test]
fn random_policy_sticks_per_connection_and_spreads() {
    let (mut lb, probe) = instance("lb", "policy: random");
    let mut chosen: HashMap<FlowKey, usize> = HashMap::new();
    for i in 0..400u16 {
        let client = [192, 168, 7, (i % 200) as u8 + 1];
        for flags in [SYN, ACK] {
            let mut p = raw(&tcp_frame(client, 30_000 + i, [203, 0, 113, 10], 80, 1, 1, flags, b""), 0);
            let key = p.tuple().map(|t| t.flow_key()).expect("tcp");
            assert_eq!(lb.process(&mut p), Verdict::Forward);
            let b = backend_index(p.tuple().expect("tcp").dst);
            assert_eq!(*chosen.entry(key).or_insert(b), b, "connection {i} moved between backends");
        }
    }
    let per_backend = chosen.values().fold([0usize; 4], |mut n, b| {
        n[*b] += 1;
        n
    });
    assert!(per_backend.iter().all(|n| *n > 40), "uneven draws: {per_backend:?}");
    assert_eq!(counts(&probe, 4).iter().sum::<i64>(), 400);
}
