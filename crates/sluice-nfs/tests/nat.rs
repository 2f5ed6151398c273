//! NAT over real captures: translation, endpoint-independent mapping, checksums, the inbound
//! path, expiry and pool reuse, exhaustion, instance slices, and robustness.

mod common;
mod nfa_support;

use common::{compose, load_trace, run};
use nfa_support::{advance_all, checksums_ok, icmp_echo_frame, instance, instance_of, raw, udp_frame, valid_before};
use proptest::prelude::*;
use sluice_nf::{StateKey, Value, Verdict};
use sluice_nfs::nat::{CONN, MAPPING, REVERSE, TCP_PACKETS, TOTAL_PACKETS};
use sluice_packet::{FiveTuple, Packet, Proto};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

const EXT: &str = "198.51.100.1";

fn ext() -> IpAddr {
    EXT.parse().unwrap()
}

fn in_any(ip: IpAddr, nets: &[&str]) -> bool {
    nets.iter().any(|n| {
        let (a, l) = n.split_once('/').unwrap();
        let (a, l): (IpAddr, u32) = (a.parse().unwrap(), l.parse().unwrap());
        match (a, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let m = u32::MAX.checked_shl(32 - l).unwrap_or(0);
                u32::from(a) & m == u32::from(b) & m
            }
            _ => false,
        }
    })
}

struct Outcome {
    /// Internal endpoint (ip, port, proto) → external port.
    eim: BTreeMap<(IpAddr, u16, u8), u16>,
    outbound: usize,
}

/// Runs `trace` through a NAT with `internal` and checks every packet: outbound ones are
/// translated into the port range with consistent, injective mappings and valid checksums;
/// all others leave unchanged.
fn check_outbound(trace: &str, internal: &[&str], range: (u16, u16)) -> Outcome {
    let cfg = format!("internal: {internal:?}\nport_range: [{}, {}]", range.0, range.1);
    let (mut nat, probe) = instance("nat", &cfg);
    let pkts = load_trace(trace);
    let before = pkts.clone();
    let valid = valid_before(&pkts);
    let out = run(&mut nat, pkts);
    let mut eim: BTreeMap<(IpAddr, u16, u8), u16> = BTreeMap::new();
    let mut owner: BTreeMap<(u16, u8), (IpAddr, u16)> = BTreeMap::new();
    let mut outbound = 0;
    let mut verified = 0;
    for (i, ((v, p), orig)) in out.iter().zip(&before).enumerate() {
        let t = orig.tuple().unwrap();
        if in_any(t.src, internal) && !in_any(t.dst, internal) {
            outbound += 1;
            assert_eq!(*v, Verdict::Forward, "packet {i}");
            let n = p.tuple().unwrap();
            assert_eq!(n.src, ext(), "packet {i}");
            assert!(n.sport >= range.0 && n.sport <= range.1, "packet {i}: port {}", n.sport);
            assert_eq!((n.dst, n.dport), (t.dst, t.dport), "destination untouched");
            let prev = eim.insert((t.src, t.sport, t.proto.0), n.sport);
            assert!(prev.is_none() || prev == Some(n.sport), "endpoint changed port (EIM) at packet {i}");
            let o = owner.insert((n.sport, t.proto.0), (t.src, t.sport));
            assert!(o.is_none() || o == Some((t.src, t.sport)), "two endpoints share port {}", n.sport);
            if valid[i] {
                assert_eq!(checksums_ok(p.data()), Some(true), "checksum after rewrite, packet {i}");
                verified += 1;
            }
            assert_eq!(p.len(), orig.len());
        } else {
            assert_eq!(*v, Verdict::Forward, "packet {i}");
            assert_eq!(p.data(), orig.data(), "packet {i} must pass untouched");
        }
    }
    assert!(outbound > 0, "{trace}: no outbound packet");
    assert!(verified * 2 > outbound, "{trace}: most captured checksums should verify");
    // Counters.
    let tcp = before.iter().filter(|p| p.tuple().unwrap().proto == Proto::TCP).count() as i64;
    assert_eq!(probe.get(TOTAL_PACKETS, StateKey::Unit), Some(Value::Int(before.len() as i64)));
    assert_eq!(probe.get(TCP_PACKETS, StateKey::Unit), Some(Value::Int(tcp)));
    // At most one mapping and one reverse entry per internal endpoint (long captures see
    // some expire), and the two tables agree.
    assert!(probe.len(MAPPING) <= eim.len() && probe.len(MAPPING) > 0);
    assert_eq!(probe.len(REVERSE), probe.len(MAPPING));
    Outcome { eim, outbound }
}

#[test]
fn ssh_sessions_translated_with_eim_and_valid_checksums() {
    // 192.168.1.32 talks to two external SSH servers; 192.168.x↔192.168.x sessions stay inside.
    let o = check_outbound("ssh_ssh.pcap", &["192.168.0.0/16"], (1024, 65535));
    assert!(o.eim.len() >= 2, "{:?}", o.eim);
    assert!(o.outbound > 400);
}

#[test]
fn http_and_ftp_clients_translated() {
    let o = check_outbound("http_methods.pcap", &["128.2.6.136/32"], (20000, 20999));
    assert_eq!(o.eim.len(), 49, "49 client connections, 49 endpoints");
    // FTP: control and PASV/PORT data connections; the server's active-mode data connection
    // comes from outside to the internal address and passes untouched (no ALG).
    check_outbound("ftp_ipv4.pcap", &["141.142.220.235/32"], (1024, 65535));
}

#[test]
fn all_internal_echo_trace_is_untouched() {
    let (mut nat, probe) = instance("nat", "internal: [127.0.0.0/8]");
    let pkts = load_trace("echo-connections.pcap");
    let n = pkts.len();
    let orig: Vec<Vec<u8>> = pkts.iter().map(|p| p.data().to_vec()).collect();
    for (i, (v, p)) in run(&mut nat, pkts).into_iter().enumerate() {
        assert_eq!(v, Verdict::Forward);
        assert_eq!(p.data(), &orig[i][..]);
    }
    assert_eq!(probe.get(TOTAL_PACKETS, StateKey::Unit), Some(Value::Int(n as i64)));
    assert_eq!(probe.len(CONN) + probe.len(MAPPING), 0);
}

#[test]
fn same_endpoint_same_port_for_every_destination() {
    let (mut nat, _) = instance("nat", "internal: [128.2.6.136/32]");
    let pkts = load_trace("http_methods.pcap");
    let first = pkts[0].clone();
    let t = first.tuple().unwrap();
    let mut ports = BTreeSet::new();
    for (k, dst) in ["173.194.75.103", "203.0.113.7", "203.0.113.8"].iter().enumerate() {
        let mut p = first.clone();
        p.rewrite_dst(dst.parse().unwrap(), 80 + k as u16).unwrap();
        assert_eq!(nat.process(&mut p), Verdict::Forward);
        let n = p.tuple().unwrap();
        assert_eq!(n.src, ext());
        ports.insert(n.sport);
    }
    assert_eq!(ports.len(), 1, "EIM: one external port for {}:{}", t.src, t.sport);
}

/// Reply `p` (server → internal client) as it would arrive at the NAT from outside.
fn to_outside(p: &Packet, port: u16) -> Packet {
    let mut q = p.clone();
    q.rewrite_dst(ext(), port).unwrap();
    q
}

#[test]
fn inbound_replies_go_back_to_the_internal_endpoint() {
    let client: IpAddr = "128.2.6.136".parse().unwrap();
    let (mut nat, _) = instance("nat", "internal: [128.2.6.136/32]");
    let pkts = load_trace("http_methods.pcap");
    let valid = valid_before(&pkts);
    let mut map: HashMap<u16, u16> = HashMap::new(); // internal port → external port
    let mut inbound = 0;
    for (i, p) in pkts.into_iter().enumerate() {
        let t = p.tuple().unwrap();
        if t.src == client {
            let mut q = p.clone();
            assert_eq!(nat.process(&mut q), Verdict::Forward);
            map.insert(t.sport, q.tuple().unwrap().sport);
        } else {
            let ext_port = map[&t.dport];
            let mut q = to_outside(&p, ext_port);
            assert_eq!(nat.process(&mut q), Verdict::Forward, "reply {i}");
            assert_eq!(q.tuple(), Some(t), "reply {i} translated back");
            if valid[i] {
                assert_eq!(checksums_ok(q.data()), Some(true), "reply {i} checksum");
            }
            inbound += 1;
        }
    }
    assert!(inbound > 300);
    // Mappings are per protocol: UDP to a port TCP uses finds none.
    let ext_port = *map.values().next().unwrap();
    let mut q = raw(&udp_frame([203, 0, 113, 9], 53, [198, 51, 100, 1], ext_port, b"x"), 0);
    assert_eq!(nat.process(&mut q), Verdict::Drop("nat-no-mapping"));
}

#[test]
fn udp_and_icmp_echo_round_trip() {
    let (mut nat, _) = instance("nat", "{}");
    let mut q = raw(&udp_frame([10, 0, 0, 5], 5353, [8, 8, 8, 8], 53, b"query"), 1);
    assert_eq!(nat.process(&mut q), Verdict::Forward);
    let t = q.tuple().unwrap();
    assert_eq!(t.src, ext());
    assert_eq!(checksums_ok(q.data()), Some(true));
    // Any external host may answer (endpoint-independent filtering).
    let mut r = raw(&udp_frame([9, 9, 9, 9], 53, [198, 51, 100, 1], t.sport, b"answer"), 2);
    assert_eq!(nat.process(&mut r), Verdict::Forward);
    let rt = r.tuple().unwrap();
    assert_eq!((rt.dst, rt.dport), ("10.0.0.5".parse().unwrap(), 5353));
    assert_eq!(checksums_ok(r.data()), Some(true));

    let mut e = raw(&icmp_echo_frame([10, 0, 0, 6], [1, 1, 1, 1], 8, 77, 1), 3);
    assert_eq!(nat.process(&mut e), Verdict::Forward);
    let et = e.tuple().unwrap();
    assert_eq!(et.src, ext());
    assert_eq!(checksums_ok(e.data()), Some(true));
    let mut reply = raw(&icmp_echo_frame([1, 1, 1, 1], [198, 51, 100, 1], 0, et.sport, 1), 4);
    assert_eq!(nat.process(&mut reply), Verdict::Forward);
    let rt = reply.tuple().unwrap();
    assert_eq!((rt.dst, rt.dport, rt.proto), ("10.0.0.6".parse().unwrap(), 77, Proto::ICMP));
    assert_eq!(checksums_ok(reply.data()), Some(true));
}

fn udp_from(port: u16, ts_s: u64) -> Packet {
    raw(&udp_frame([10, 0, 0, 1], port, [192, 0, 2, 1], 53, b"q"), ts_s * 1_000_000_000)
}

#[test]
fn expiry_returns_ports_and_exhaustion_is_reported_once_per_episode() {
    let (mut nat, probe) = instance("nat", "port_range: [5000, 5003]\ntimeouts: {udp: 30}");
    let mut used = BTreeSet::new();
    for k in 0..4 {
        let mut p = udp_from(40000 + k, 100);
        assert_eq!(nat.process(&mut p), Verdict::Forward);
        used.insert(p.tuple().unwrap().sport);
    }
    assert_eq!(used, (5000..=5003).collect());
    // A known endpoint still works while the pool is empty.
    let mut p = udp_from(40001, 110);
    assert_eq!(nat.process(&mut p), Verdict::Forward);
    for k in 4..7 {
        let mut p = udp_from(40000 + k, 110);
        assert_eq!(nat.process(&mut p), Verdict::Drop("nat-pool-exhausted"));
    }
    let ev: Vec<_> = nat.events().iter().filter(|e| e.kind == "port-pool-exhausted").collect();
    assert_eq!(ev.len(), 1, "one event per exhaustion episode");
    assert_eq!(probe.len(CONN), 4);
    // 40000, 40002, 40003 expire at 130 s; 40001 was refreshed at 110 s and lives until 140 s.
    let mut p = udp_from(40004, 131);
    assert_eq!(nat.process(&mut p), Verdict::Forward, "a returned port is reused");
    assert!(used.contains(&p.tuple().unwrap().sport));
    assert_eq!(probe.len(CONN), 2);
    assert_eq!(probe.len(MAPPING), 2);
    assert_eq!(probe.len(REVERSE), 2);
    // Everything expires: only the pool (list and ready marker) remains.
    advance_all(&mut nat, &probe, 1_000 * 1_000_000_000);
    assert_eq!(probe.len(CONN) + probe.len(MAPPING) + probe.len(REVERSE), 0);
    assert_eq!(probe.timers(), 0);
    // A new episode reports again.
    for k in 0..5u16 {
        let mut p = udp_from(41000 + k, 1_001);
        let v = nat.process(&mut p);
        assert_eq!(v == Verdict::Forward, k < 4, "packet {k}: {v:?}");
    }
    assert_eq!(nat.events().iter().filter(|e| e.kind == "port-pool-exhausted").count(), 2);
}

#[test]
fn tcp_timeouts_follow_connection_state() {
    // Closed connections (FINs seen) use the transitory timeout; established ones the long one.
    let cfg = "internal: [128.2.6.136/32]\ntimeouts: {tcp_established: 7440, tcp_transitory: 5}";
    let (mut nat, probe) = instance("nat", cfg);
    let pkts = load_trace("http_methods.pcap");
    let end = pkts.iter().map(|p| p.meta.ts_ns).max().unwrap();
    run(&mut nat, pkts);
    let live = probe.len(CONN);
    assert!(live > 0);
    advance_all(&mut nat, &probe, end + 6_000_000_000);
    let after = probe.len(CONN);
    assert!(after < live, "closed connections expire after the transitory timeout ({live} → {after})");
    advance_all(&mut nat, &probe, end + 7_441_000_000_000);
    assert_eq!(probe.len(CONN) + probe.len(MAPPING) + probe.len(REVERSE), 0);
}

#[test]
fn two_instances_use_disjoint_port_slices() {
    let cfg = "internal: [192.168.0.0/16, 128.2.6.136/32]\nport_range: [2000, 2999]";
    let trace = compose(&[load_trace("ssh_ssh.pcap"), load_trace("http_methods.pcap")], 1_000_000_000);
    let mut ports: Vec<BTreeSet<u16>> = Vec::new();
    for i in 0..2 {
        let (mut nat, _) = instance_of("nat", cfg, i, 2);
        let mut set = BTreeSet::new();
        for (v, p) in run(&mut nat, trace.clone()) {
            let t: FiveTuple = p.tuple().unwrap();
            if v == Verdict::Forward && t.src == ext() {
                set.insert(t.sport);
            }
        }
        let (lo, hi) = if i == 0 { (2000, 2499) } else { (2500, 2999) };
        assert!(set.iter().all(|&p| p >= lo && p <= hi), "instance {i}: {set:?}");
        assert!(set.len() > 40);
        ports.push(set);
    }
    assert!(ports[0].is_disjoint(&ports[1]));
}

#[test]
fn unsupported_and_ipv6_policies() {
    let (mut nat, _) = instance("nat", "internal: [10.0.0.0/8, 'fd00::/8']");
    // ICMP that is not echo (destination unreachable) is not translated.
    let mut f = icmp_echo_frame([10, 0, 0, 1], [1, 1, 1, 1], 8, 1, 1);
    f[34] = 3; // type 3
    let mut p = raw(&f, 0);
    assert_eq!(nat.process(&mut p), Verdict::Drop("nat-unsupported"));
    // Inbound to the external address without mapping.
    let mut p = raw(&icmp_echo_frame([1, 1, 1, 1], [198, 51, 100, 1], 0, 999, 1), 0);
    assert_eq!(nat.process(&mut p), Verdict::Drop("nat-no-mapping"));
}

/// An Ethernet/IPv6 frame carrying UDP (`next` 17, ports used) or an ICMPv6 echo request
/// (`next` 58, `sport` as identifier), with a valid transport checksum.
fn ipv6_frame(src: &str, sport: u16, dst: &str, dport: u16, next: u8) -> Vec<u8> {
    let (src, dst): (std::net::Ipv6Addr, std::net::Ipv6Addr) = (src.parse().unwrap(), dst.parse().unwrap());
    let mut l4 = Vec::new();
    if next == 17 {
        l4.extend_from_slice(&sport.to_be_bytes());
        l4.extend_from_slice(&dport.to_be_bytes());
        l4.extend_from_slice(&[0, 9, 0, 0, b'q']);
    } else {
        l4.extend_from_slice(&[128, 0, 0, 0]);
        l4.extend_from_slice(&sport.to_be_bytes());
        l4.extend_from_slice(&[0, 1]);
    }
    let mut pseudo = [src.octets(), dst.octets()].concat();
    pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, next]);
    pseudo.extend_from_slice(&l4);
    let mut sum: u32 = pseudo.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let off = if next == 17 { 6 } else { 2 };
    l4[off..off + 2].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x86, 0xdd, 0x60, 0, 0, 0];
    f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    f.extend_from_slice(&[next, 64]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&l4);
    f
}

#[test]
fn ipv6_is_translated_with_an_ipv6_external_ip() {
    let (mut nat, _) = instance("nat", "external_ip: '2001:db8::1'\ninternal: ['fd00::/8']\nport_range: [2000, 2000]");
    let mut p = raw(&ipv6_frame("fd00::5", 5000, "2001:db8:9::9", 53, 17), 0);
    assert_eq!(nat.process(&mut p), Verdict::Forward);
    let t = p.tuple().unwrap();
    assert_eq!((t.src.to_string(), t.sport), ("2001:db8::1".to_string(), 2000));
    // The reply comes back to the internal endpoint.
    let mut p = raw(&ipv6_frame("2001:db8:9::9", 53, "2001:db8::1", 2000, 17), 0);
    assert_eq!(nat.process(&mut p), Verdict::Forward);
    let t = p.tuple().unwrap();
    assert_eq!((t.dst.to_string(), t.dport), ("fd00::5".to_string(), 5000));
    // ICMPv6, even echo, is not translated.
    let mut p = raw(&ipv6_frame("fd00::5", 7, "2001:db8:9::9", 7, 58), 0);
    assert_eq!(p.tuple().unwrap().proto, Proto(58));
    assert_eq!(nat.process(&mut p), Verdict::Drop("nat-unsupported"));
    // IPv4 from an IPv4 internal prefix would need an IPv4 external address.
    let (mut nat, _) = instance("nat", "external_ip: '2001:db8::1'\ninternal: [10.0.0.0/8, 'fd00::/8']");
    let mut p = raw(&udp_frame([10, 0, 0, 1], 5000, [1, 1, 1, 1], 53, b"q"), 0);
    assert_eq!(nat.process(&mut p), Verdict::Drop("nat-family-mismatch"));
}

#[test]
fn ipv6_with_an_ipv4_external_ip() {
    // Default IPv4 prefixes: IPv6 is "anything else" and passes untouched.
    let (mut nat, _) = instance("nat", "{}");
    let f = ipv6_frame("fd00::5", 5000, "2001:db8:9::9", 53, 17);
    let mut p = raw(&f, 0);
    assert_eq!(nat.process(&mut p), Verdict::Forward);
    assert_eq!(p.data(), &f[..]);
    // An IPv6 internal prefix: UDP/TCP cannot be translated to the IPv4 address, and ICMPv6
    // is unsupported before the family is looked at.
    let (mut nat, _) = instance("nat", "internal: [10.0.0.0/8, 'fd00::/8']");
    let mut p = raw(&f, 0);
    assert_eq!(nat.process(&mut p), Verdict::Drop("nat-family-mismatch"));
    let mut p = raw(&ipv6_frame("fd00::5", 7, "2001:db8:9::9", 7, 58), 0);
    assert_eq!(nat.process(&mut p), Verdict::Drop("nat-unsupported"));
}

#[test]
fn config_is_validated() {
    let reg = sluice_nfs::registry();
    let bad = [
        ("port_range: [3000, 2000]", "port_range"),
        ("port_range: [0, 10]", "port_range"),
        ("internal: ['10.0.0.0/33']", "internal[0]"),
        ("internal: []", "internal"),
        ("external_ip: nope", "external_ip"),
        ("external_ip: 10.0.0.1", "external_ip"),
        ("timeouts: {udp: 0}", "timeouts.udp"),
        ("ports: [1, 2]", ""),
    ];
    for (yaml, field) in bad {
        let v: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        match sluice_nf::local_instance(&reg, "nat", &v) {
            Err(sluice_nf::NfError::Config { field: f, .. }) => {
                assert!(f.starts_with(field), "{yaml}: field {f}")
            }
            Err(e) => panic!("{yaml}: {e}"),
            Ok(_) => panic!("{yaml} accepted"),
        }
    }
    assert!(sluice_nf::local_instance(&reg, "nat", &serde_yaml::Value::Null).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let (mut nat, _) = instance("nat", "internal: [0.0.0.0/1]");
        let mut p = raw(&bytes, 1);
        let _ = nat.process(&mut p);
    }

    #[test]
    fn never_panics_on_truncated_or_corrupted_packets(idx in 0usize..655, cut in 0usize..1600, flip in 0usize..80, val in any::<u8>()) {
        thread_local!(static PKTS: Vec<Packet> = load_trace("http_methods.pcap"));
        let mut bytes = PKTS.with(|p| p[idx].data().to_vec());
        if flip < bytes.len() { bytes[flip] = val; }
        bytes.truncate(cut);
        let (mut nat, _) = instance("nat", "internal: [128.2.6.136/32, 173.194.0.0/16]");
        let mut p = raw(&bytes, 1);
        let _ = nat.process(&mut p);
        // And with the destination made the external address (inbound path).
        let mut q = raw(&bytes, 2);
        if q.rewrite_dst(ext(), 1024).is_ok() { let _ = nat.process(&mut q); }
    }
}
