//! One matched pair of frames: equal up to endpoints and checksums, with every checksum the
//! reference frame gets right also right in the physical one.

use super::renaming::Ep;
use sluice_packet::{Headers, L3, L4};
use std::net::IpAddr;

/// The endpoint pairs of two frames whose headers agree up to endpoints and checksums.
fn endpoint_pairs(rh: &Headers, ph: &Headers) -> Vec<(Ep, Ep)> {
    match (rh.tuple, ph.tuple) {
        (Some(r), Some(p)) if rh.is_ip() && ph.is_ip() => vec![
            ((r.src, r.sport, r.proto.0), (p.src, p.sport, p.proto.0)),
            ((r.dst, r.dport, r.proto.0), (p.dst, p.dport, p.proto.0)),
        ],
        _ => Vec::new(),
    }
}

/// Compares two matched frames; on success, returns the endpoint pairs they establish.
pub(super) fn compare_frames(r: &[u8], rh: &Headers, p: &[u8], ph: &Headers) -> Result<Vec<(Ep, Ep)>, String> {
    if r == p {
        return Ok(endpoint_pairs(rh, ph));
    }
    if !rh.is_ip() || !ph.is_ip() {
        return Err(format!(
            "frames differ and are not both parsable IP packets (reference {:?}, physical {:?})",
            rh.status, ph.status
        ));
    }
    if r.len() != p.len() {
        return Err(format!("frame length {} in the physical run, {} in the reference", p.len(), r.len()));
    }
    let layout = |h: &Headers| (h.l3, h.l4, h.l3_off, h.l4_off, h.payload_off, h.fragmented);
    if layout(rh) != layout(ph) {
        return Err(format!(
            "header layout differs: physical {:?}/{:?}, reference {:?}/{:?}",
            ph.l3, ph.l4, rh.l3, rh.l4
        ));
    }
    let ignored = ignored_ranges(rh, r);
    let first_diff = r
        .iter()
        .zip(p.iter())
        .enumerate()
        .find(|(i, (a, b))| a != b && !ignored.iter().any(|(s, e)| (*s..*e).contains(i)));
    if let Some((off, (a, b))) = first_diff {
        return Err(format!(
            "byte {off} ({}) is {b:#04x} in the physical run, {a:#04x} in the reference",
            region(off, rh)
        ));
    }
    let rc = checksums(r, rh);
    let pc = checksums(p, ph);
    for ((name, rv), (_, pv)) in rc.iter().zip(pc.iter()) {
        if *rv == Some(true) && *pv != Some(true) {
            return Err(format!("invalid {name} checksum in the physical run"));
        }
    }
    Ok(endpoint_pairs(rh, ph))
}

/// Byte ranges that may differ between renamed frames: addresses, ports and checksums.
fn ignored_ranges(h: &Headers, frame: &[u8]) -> Vec<(usize, usize)> {
    let l3 = usize::from(h.l3_off);
    let l4 = usize::from(h.l4_off);
    let mut v = Vec::with_capacity(4);
    match h.l3 {
        L3::V4 => {
            v.push((l3 + 10, l3 + 12)); // header checksum
            v.push((l3 + 12, l3 + 20)); // source and destination
        }
        L3::V6 => v.push((l3 + 8, l3 + 40)),
        L3::None => {}
    }
    if h.fragmented {
        return v;
    }
    let icmp_type = frame.get(l4).copied().unwrap_or(0);
    match h.l4 {
        L4::Tcp => {
            v.push((l4, l4 + 4));
            v.push((l4 + 16, l4 + 18));
        }
        L4::Udp => {
            v.push((l4, l4 + 4));
            v.push((l4 + 6, l4 + 8));
        }
        L4::Icmp if matches!(icmp_type, 0 | 8) => v.push((l4 + 2, l4 + 6)), // checksum, identifier
        L4::Icmpv6 if matches!(icmp_type, 128 | 129) => v.push((l4 + 2, l4 + 6)),
        L4::Icmpv6 => v.push((l4 + 2, l4 + 4)), // the pseudo-header covers the addresses
        L4::Icmp | L4::None | L4::Other => {}
    }
    v
}

fn region(off: usize, h: &Headers) -> &'static str {
    let l3 = usize::from(h.l3_off);
    let l4 = usize::from(h.l4_off);
    let pay = usize::from(h.payload_off);
    let end = pay + usize::from(h.payload_len);
    let has_l4 = !h.fragmented && !matches!(h.l4, L4::None | L4::Other);
    if off < l3 {
        "ethernet header"
    } else if off < if has_l4 { l4 } else { pay } {
        "IP header"
    } else if has_l4 && off < pay {
        "transport header"
    } else if off < end {
        "payload"
    } else {
        "trailer"
    }
}

fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Whether each checksum of a frame is valid: `[IPv4 header, transport]`, `None` where there is
/// none (or it cannot be checked).
fn checksums(frame: &[u8], h: &Headers) -> [(&'static str, Option<bool>); 2] {
    let l3 = usize::from(h.l3_off);
    let ip = match h.l3 {
        L3::V4 => frame.get(l3).and_then(|b| {
            let ihl = usize::from(b & 0x0f) * 4;
            frame.get(l3..l3 + ihl).map(|hdr| fold(ones_sum(hdr, 0)) == 0xffff)
        }),
        _ => None,
    };
    let name = match h.l4 {
        L4::Tcp => "TCP",
        L4::Udp => "UDP",
        L4::Icmp => "ICMP",
        L4::Icmpv6 => "ICMPv6",
        L4::None | L4::Other => "transport",
    };
    [("IPv4 header", ip), (name, transport_checksum(frame, h))]
}

fn transport_checksum(frame: &[u8], h: &Headers) -> Option<bool> {
    if h.fragmented || matches!(h.l4, L4::None | L4::Other) {
        return None;
    }
    let t = h.tuple?;
    let l4 = usize::from(h.l4_off);
    let end = usize::from(h.payload_off) + usize::from(h.payload_len);
    let seg = frame.get(l4..end)?;
    if h.l4 == L4::Udp && h.l3 == L3::V4 && seg.get(6..8) == Some(&[0, 0][..]) {
        return Some(true); // no checksum
    }
    let len = seg.len() as u64;
    let mut acc = 0u64;
    if h.l4 != L4::Icmp {
        acc = match (t.src, t.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => ones_sum(&d.octets(), ones_sum(&s.octets(), 0)),
            (IpAddr::V6(s), IpAddr::V6(d)) => ones_sum(&d.octets(), ones_sum(&s.octets(), 0)),
            _ => return None,
        };
        acc += (len >> 16) + (len & 0xffff) + u64::from(t.proto.0);
    }
    Some(fold(ones_sum(seg, acc)) == 0xffff)
}
