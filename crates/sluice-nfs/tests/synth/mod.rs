//! Synthetic packets and packet surgery for the detector tests (portscan, trojan, ids).
#![allow(dead_code)]

use sluice_packet::{Clock, Meta, Packet};
use std::net::{IpAddr, Ipv4Addr};

/// TCP flag bits.
pub const FIN: u8 = 0x01;
/// SYN.
pub const SYN: u8 = 0x02;
/// RST.
pub const RST: u8 = 0x04;
/// PSH.
pub const PSH: u8 = 0x08;
/// ACK.
pub const ACK: u8 = 0x10;

fn sum16(data: &[u8]) -> u32 {
    data.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Recomputes the IPv4 header checksum and the TCP checksum of an Ethernet/IPv4/TCP frame
/// whose IP total length is right.
pub fn fix_checksums(frame: &mut [u8]) {
    let l3 = 14;
    let ihl = usize::from(frame[l3] & 0x0f) * 4;
    frame[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    let c = fold(sum16(&frame[l3..l3 + ihl]));
    frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    let total = usize::from(u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]));
    let l4 = l3 + ihl;
    let seg_len = total - ihl;
    frame[l4 + 16..l4 + 18].copy_from_slice(&[0, 0]);
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&frame[l3 + 12..l3 + 20]);
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(seg_len as u16).to_be_bytes());
    let c = fold(sum16(&pseudo) + sum16(&frame[l4..l4 + seg_len]));
    frame[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
}

/// Whether the IPv4 and TCP checksums of a frame verify.
pub fn checksums_ok(frame: &[u8]) -> bool {
    let mut f = frame.to_vec();
    fix_checksums(&mut f);
    f == frame
}

/// An Ethernet/IPv4/TCP frame with valid checksums.
#[allow(clippy::too_many_arguments)]
pub fn tcp_frame(
    src: [u8; 4],
    sport: u16,
    dst: [u8; 4],
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(54 + payload.len());
    f.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
    let total = (20 + 20 + payload.len()) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&ack.to_be_bytes());
    f.extend_from_slice(&[5 << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend_from_slice(payload);
    fix_checksums(&mut f);
    f
}

/// A packet from a frame, with clock `clock` and time `ts_ns`.
pub fn pkt(frame: Vec<u8>, clock: u64, ts_ns: u64) -> Packet {
    Packet::new(frame, Meta { clock: Clock::new(0, clock), ts_ns, ..Meta::default() })
}

/// A copy of an IPv4/TCP packet with its TCP payload replaced: IP total length and both
/// checksums are fixed up; TCP options and metadata are kept.
pub fn replace_payload(p: &Packet, payload: &[u8]) -> Packet {
    let h = p.hdr();
    let l3 = usize::from(h.l3_off);
    assert_eq!(l3, 14, "untagged Ethernet expected");
    let mut f = p.data()[..usize::from(h.payload_off)].to_vec();
    f.extend_from_slice(payload);
    let total = (f.len() - l3) as u16;
    f[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
    fix_checksums(&mut f);
    Packet::new(f, p.meta)
}

/// Rewrites `old` to `new` on both ends of every packet (both directions of each flow).
pub fn rewrite_host(pkts: &mut [Packet], old: IpAddr, new: IpAddr) {
    for p in pkts {
        let Some(t) = p.tuple() else { continue };
        if t.src == old {
            p.rewrite_src(new, t.sport).expect("rewrite src");
        }
        if t.dst == old {
            p.rewrite_dst(new, t.dport).expect("rewrite dst");
        }
    }
}

/// An IPv4 address.
pub fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// A deterministic xorshift generator for shuffles.
pub struct Rng(pub u64);

impl Rng {
    /// Next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A value below `n` (> 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
