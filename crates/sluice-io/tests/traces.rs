//! Reading the real captures of shared/traces.

mod common;

use common::{all_traces, read_all, trace};
use sluice_io::{load, summarize, TraceFormat, TraceReader};
use sluice_packet::PacketPool;

const EXPECTED: [(&str, u64, u64); 10] = [
    ("echo-connections.pcap", 82_582, 500),
    ("ssh_single-conn.pcap", 94, 1),
    ("ssh_ssh.pcap", 1_797, 25),
    ("ftp_retr.pcap", 67, 2),
    ("ftp_ipv4.pcap", 95, 5),
    ("irc-basic.pcap", 34, 1),
    ("http_methods.pcap", 655, 49),
    ("http_bro.org.pcap", 751, 13),
    ("dns-edns-cookie.pcap", 20, 2),
    ("rfb_vnc-scanner.pcap", 20, 1),
];

#[test]
fn every_trace_has_the_documented_packet_count() {
    let files = all_traces();
    assert_eq!(files.len(), EXPECTED.len(), "unexpected set of traces: {files:?}");
    for (name, packets, _) in EXPECTED {
        let recs = read_all(&trace(name));
        assert_eq!(recs.len() as u64, packets, "{name}");
        // Records look like real Ethernet captures with sane timestamps (2000..2100).
        for r in &recs {
            assert!(!r.data.is_empty() && r.data.len() <= sluice_packet::MAX_FRAME, "{name}");
            assert!(r.orig_len as usize >= r.data.len(), "{name}");
            assert!(r.ts_ns > 946_684_800_000_000_000 && r.ts_ns < 4_102_444_800_000_000_000, "{name}");
        }
    }
}

#[test]
fn summaries_match_the_readme() {
    for (name, packets, flows) in EXPECTED {
        let s = summarize(trace(name)).unwrap();
        assert_eq!(s.packets, packets, "{name}");
        assert_eq!(s.format, TraceFormat::PcapMicro, "{name}");
        let p = s.protocols;
        assert_eq!(p.tcp + p.udp + p.icmp + p.icmpv6 + p.other_ip + p.non_ip + s.malformed + s.truncated, s.packets);
        assert_eq!(s.flows, flows, "{name}: {s}");
        assert_eq!(s.malformed + s.truncated, 0, "{name}: {s}");
        assert!(s.first_ts_ns.is_some() && s.last_ts_ns.is_some());
        assert!(s.bytes > 0 && s.wire_bytes >= s.bytes);
    }
}

#[test]
fn echo_connections_summary() {
    let s = summarize(trace("echo-connections.pcap")).unwrap();
    assert_eq!(s.packets, 82_582);
    assert_eq!(s.flows, 500);
    assert!(s.protocols.tcp > 80_000, "{s}");
    // 6.5 s of traffic according to the README.
    assert!(s.duration_ns > 6_000_000_000 && s.duration_ns < 7_000_000_000, "{s}");
    let text = s.to_string();
    assert!(text.contains("packets:    82582") && text.contains("flows:      500"), "{text}");
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["packets"], 82_582);
    assert_eq!(json["flows"], 500);
    assert_eq!(json["format"], "pcap_micro");
    assert!(json["protocols"]["tcp"].as_u64().unwrap() > 80_000);
}

/// The README calls this capture "DNS over UDP", but it holds DNS over TCP (port 53): 20 TCP
/// packets in 2 connections.
#[test]
fn dns_trace_is_dns_over_tcp() {
    let s = summarize(trace("dns-edns-cookie.pcap")).unwrap();
    assert_eq!(s.protocols.tcp, 20, "{s}");
    assert_eq!(s.protocols.udp, 0, "{s}");
    for p in load(trace("dns-edns-cookie.pcap"), None).unwrap() {
        let t = p.tuple().unwrap();
        assert!(t.sport == 53 || t.dport == 53, "{t}");
    }
}

#[test]
fn load_sets_timestamps_and_honours_the_limit() {
    let path = trace("ssh_single-conn.pcap");
    let recs = read_all(&path);
    let all = load(&path, None).unwrap();
    assert_eq!(all.len(), 94);
    for (p, r) in all.iter().zip(&recs) {
        assert_eq!(p.meta.ts_ns, r.ts_ns);
        assert_eq!(p.data(), &r.data[..]);
        assert_eq!(p.meta.clock.0, 0);
        assert!(p.hdr().is_ip());
    }
    assert_eq!(load(&path, Some(10)).unwrap().len(), 10);
    assert_eq!(load(&path, Some(0)).unwrap().len(), 0);
    assert_eq!(load(&path, Some(1000)).unwrap().len(), 94);
}

#[test]
fn read_packet_uses_the_pool() {
    let pool = PacketPool::new(8, 2048);
    let mut r = TraceReader::open(trace("irc-basic.pcap")).unwrap();
    let mut n = 0;
    while let Some(p) = r.read_packet(&pool).unwrap() {
        assert!(p.meta.ts_ns > 0);
        pool.recycle(p);
        n += 1;
    }
    assert_eq!(n, 34);
    assert_eq!(r.records_read(), 34);
    assert!(r.next_record().unwrap().is_none());
}
