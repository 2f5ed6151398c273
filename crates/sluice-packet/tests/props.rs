//! The parser and the rewriters on arbitrary, truncated and corrupted frames: no panic, and
//! whatever parses stays consistent.

use proptest::prelude::*;
use sluice_packet::{Headers, Meta, Packet, ParseStatus};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn real_frames() -> Vec<Vec<u8>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/http_methods.pcap");
    let data = std::fs::read(path).expect("trace");
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= data.len() && out.len() < 200 {
        let cap = u32::from_le_bytes([data[off + 8], data[off + 9], data[off + 10], data[off + 11]]) as usize;
        out.push(data[off + 16..off + 16 + cap].to_vec());
        off += 16 + cap;
    }
    out
}

fn check(frame: Vec<u8>, ip4: [u8; 4], port: u16) {
    let h = Headers::parse(&frame);
    let mut p = Packet::new(frame, Meta::default());
    let pl = p.payload();
    assert!(pl.len() <= p.len());
    if h.status == ParseStatus::Ok {
        assert!(h.tuple.is_some());
        assert!(usize::from(h.payload_off) <= p.len());
    } else {
        assert!(pl.is_empty());
    }
    let _ = p.rewrite_src(IpAddr::V4(Ipv4Addr::from(ip4)), port);
    let _ = p.rewrite_dst(IpAddr::V6(Ipv6Addr::LOCALHOST), port);
    if p.rewrite_src(IpAddr::V4(Ipv4Addr::from(ip4)), port).is_ok() {
        assert_eq!(p.tuple().map(|t| t.src), Some(IpAddr::V4(Ipv4Addr::from(ip4))));
        // The bytes say what the cached headers say.
        let again = Headers::parse(p.data());
        assert_eq!(again.tuple.map(|t| t.src), p.tuple().map(|t| t.src));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes(frame in proptest::collection::vec(any::<u8>(), 0..1600), ip in any::<[u8; 4]>(), port in any::<u16>()) {
        check(frame, ip, port);
    }

    #[test]
    fn truncated_real_frames(idx in 0usize..200, cut in 0usize..1600, ip in any::<[u8; 4]>(), port in any::<u16>()) {
        let frames = real_frames();
        let f = &frames[idx % frames.len()];
        check(f[..cut.min(f.len())].to_vec(), ip, port);
    }

    #[test]
    fn corrupted_real_frames(idx in 0usize..200, edits in proptest::collection::vec((0usize..1600, any::<u8>()), 1..8), port in any::<u16>()) {
        let frames = real_frames();
        let mut f = frames[idx % frames.len()].clone();
        let n = f.len().max(1);
        for (pos, b) in edits {
            if let Some(x) = f.get_mut(pos % n) {
                *x = b;
            }
        }
        check(f, [192, 0, 2, 1], port);
    }
}

#[test]
fn rewrite_keeps_checksums_valid_on_real_traffic() {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    let mut verified = 0;
    for frame in real_frames() {
        let mut p = Packet::new(frame, Meta::default());
        if p.hdr().status != ParseStatus::Ok || p.hdr().fragmented {
            continue;
        }
        let ok_before = tcp_ok(p.data());
        if p.rewrite_src(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7)), 40_000).is_err() {
            continue;
        }
        p.rewrite_dst(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9)), 8080).expect("dst rewrite");
        let s = SlicedPacket::from_ethernet(p.data()).expect("still parses");
        let Some(NetSlice::Ipv4(ip)) = s.net else { continue };
        let hdr = ip.header().to_header();
        assert_eq!(hdr.header_checksum, hdr.calc_header_checksum(), "IPv4 header checksum");
        if ok_before {
            if let Some(TransportSlice::Tcp(t)) = s.transport {
                let want = t.to_header().calc_checksum_ipv4(&hdr, t.payload()).expect("checksum");
                assert_eq!(t.checksum(), want, "TCP checksum after rewrite");
                verified += 1;
            }
        }
    }
    assert!(verified > 100, "only {verified} packets verified");

    fn tcp_ok(data: &[u8]) -> bool {
        let Ok(s) = SlicedPacket::from_ethernet(data) else { return false };
        let (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(t))) = (s.net, s.transport) else { return false };
        t.to_header().calc_checksum_ipv4(&ip.header().to_header(), t.payload()).is_ok_and(|c| c == t.checksum())
    }
}

#[test]
fn a_pool_copies_a_batch_into_recycled_and_new_buffers_alike() {
    use sluice_packet::PacketPool;
    let frames = real_frames();
    assert!(frames.len() >= 4, "the shared traces give a few frames");
    let originals: Vec<Packet> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| Packet::from_slice(f, Meta { ts_ns: i as u64 + 7, ..Meta::default() }))
        .collect();
    let pool = PacketPool::new(64, 2048);
    // Two spare buffers holding other bytes: the rest of the batch gets new buffers.
    let mut spares =
        vec![Packet::from_slice(&[0xEE; 1400], Meta::default()), Packet::from_slice(&[1; 60], Meta::default())];
    pool.recycle_batch(&mut spares);
    let mut out = Vec::new();
    pool.copy_all(&originals, &mut out);
    assert_eq!(out.len(), originals.len());
    for (copy, orig) in out.iter().zip(&originals) {
        assert_eq!(copy.data(), orig.data());
        assert_eq!(copy.meta.ts_ns, orig.meta.ts_ns);
        assert_eq!(copy.flow_key(), orig.flow_key());
        assert_eq!(copy.tuple(), orig.tuple());
    }
}
