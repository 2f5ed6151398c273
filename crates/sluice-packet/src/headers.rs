//! A packet's parsed headers, kept as offsets into its buffer plus the few values NFs read on
//! every packet. Parsing never panics: anything etherparse rejects is reported in
//! [`ParseStatus`] and the packet is handled by the runtime's stated policy.

use crate::flow::{FiveTuple, FlowKey, Proto};
use etherparse::{err, NetSlice, SlicedPacket, TransportSlice, VlanSlice};
use std::net::IpAddr;

/// Outcome of parsing a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParseStatus {
    /// Ethernet + IP parsed (transport too, where present and the packet is not an IP
    /// fragment: no fragment's transport header is parsed, not even the first one's).
    #[default]
    Ok,
    /// A well-formed Ethernet frame that does not carry IPv4 or IPv6 (ARP, LLDP, ...).
    NonIp,
    /// A header is cut short by the end of the captured bytes.
    Truncated,
    /// A header holds impossible values (bad version, lengths, ...).
    Malformed,
}

/// Network layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L3 {
    /// No IP layer.
    #[default]
    None,
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Transport layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L4 {
    /// No transport header parsed: non-IP, or any IP fragment (first or later; etherparse
    /// 0.16 does not slice a fragment's transport header, so fragments carry ports 0).
    #[default]
    None,
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// ICMPv4.
    Icmp,
    /// ICMPv6.
    Icmpv6,
    /// Another IP protocol, not parsed.
    Other,
}

/// TCP flag bits as in the header's flags byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;

    /// SYN set.
    pub fn syn(self) -> bool {
        self.0 & Self::SYN != 0
    }
    /// ACK set.
    pub fn ack(self) -> bool {
        self.0 & Self::ACK != 0
    }
    /// FIN set.
    pub fn fin(self) -> bool {
        self.0 & Self::FIN != 0
    }
    /// RST set.
    pub fn rst(self) -> bool {
        self.0 & Self::RST != 0
    }
}

/// Parsed view of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headers {
    /// Parse outcome.
    pub status: ParseStatus,
    /// Network layer kind.
    pub l3: L3,
    /// Transport layer kind.
    pub l4: L4,
    /// Outer 802.1Q VLAN id, if tagged.
    pub vlan: Option<u16>,
    /// Offset of the IP header.
    pub l3_off: u16,
    /// Offset of the transport header (valid when `l4 != None`).
    pub l4_off: u16,
    /// Offset of the transport payload (or IP payload when there is no transport header).
    pub payload_off: u16,
    /// Length of that payload as given by the IP length fields (without Ethernet padding).
    pub payload_len: u16,
    /// The packet's 5-tuple; `None` for non-IP frames. Fragments carry ports 0.
    pub tuple: Option<FiveTuple>,
    /// The direction-free key of `tuple`, made once here rather than by every NF the packet
    /// meets (and read from aligned words, see [`FlowKey`]).
    pub flow: Option<FlowKey>,
    /// TCP flags (zero for other protocols).
    pub tcp_flags: TcpFlags,
    /// TCP sequence number.
    pub tcp_seq: u32,
    /// TCP acknowledgement number.
    pub tcp_ack: u32,
    /// ICMP type (ICMPv4 or ICMPv6).
    pub icmp_type: u8,
    /// Whether the IP payload is a fragment.
    pub fragmented: bool,
}

fn offset_in(base: &[u8], part: &[u8]) -> u16 {
    // Both slices come from the same buffer; frames are at most 64 KiB (see MAX_FRAME).
    (part.as_ptr() as usize).saturating_sub(base.as_ptr() as usize).min(usize::from(u16::MAX)) as u16
}

impl Headers {
    /// Parses an Ethernet frame (optionally 802.1Q tagged).
    pub fn parse(frame: &[u8]) -> Headers {
        let mut h = Headers::default();
        h.parse_into(frame);
        h
    }

    /// [`Headers::parse`] into `self`, written in place (a pooled packet's headers: the
    /// struct is about 130 bytes, and moving it out of a return value costs as much as the
    /// common case's parse).
    pub fn parse_into(&mut self, frame: &[u8]) {
        if parse_plain_ipv4(frame, self).is_none() {
            *self = Headers::parse_sliced(frame);
        }
    }

    /// [`Headers::parse`] through etherparse: every frame the common case does not take.
    fn parse_sliced(frame: &[u8]) -> Headers {
        let sliced = match SlicedPacket::from_ethernet(frame) {
            Ok(s) => s,
            Err(e) => return Headers { status: classify(&e), ..Headers::default() },
        };
        let mut h = Headers { vlan: sliced.vlan.as_ref().map(vlan_id), ..Headers::default() };
        let (src, dst, ip_payload) = match &sliced.net {
            Some(NetSlice::Ipv4(v4)) => {
                h.l3 = L3::V4;
                let hdr = v4.header();
                h.l3_off = offset_in(frame, hdr.slice());
                (IpAddr::V4(hdr.source_addr()), IpAddr::V4(hdr.destination_addr()), v4.payload())
            }
            Some(NetSlice::Ipv6(v6)) => {
                h.l3 = L3::V6;
                let hdr = v6.header();
                h.l3_off = offset_in(frame, hdr.slice());
                (IpAddr::V6(hdr.source_addr()), IpAddr::V6(hdr.destination_addr()), v6.payload())
            }
            None => {
                h.status = ParseStatus::NonIp;
                return h;
            }
        };
        h.fragmented = ip_payload.fragmented;
        let proto = Proto(ip_payload.ip_number.0);
        h.payload_off = offset_in(frame, ip_payload.payload);
        h.payload_len = ip_payload.payload.len().min(usize::from(u16::MAX)) as u16;
        let (mut sport, mut dport) = (0, 0);
        match &sliced.transport {
            Some(TransportSlice::Tcp(tcp)) => {
                h.l4 = L4::Tcp;
                h.l4_off = offset_in(frame, tcp.slice());
                sport = tcp.source_port();
                dport = tcp.destination_port();
                let hs = tcp.header_slice();
                h.tcp_flags = TcpFlags(hs.get(13).copied().unwrap_or(0));
                h.tcp_seq = tcp.sequence_number();
                h.tcp_ack = tcp.acknowledgment_number();
                h.payload_off = offset_in(frame, tcp.payload());
                h.payload_len = tcp.payload().len() as u16;
            }
            Some(TransportSlice::Udp(udp)) => {
                h.l4 = L4::Udp;
                h.l4_off = offset_in(frame, udp.slice());
                sport = udp.source_port();
                dport = udp.destination_port();
                h.payload_off = offset_in(frame, udp.payload());
                h.payload_len = udp.payload().len() as u16;
            }
            Some(TransportSlice::Icmpv4(icmp)) => {
                h.l4 = L4::Icmp;
                h.l4_off = offset_in(frame, icmp.slice());
                h.icmp_type = icmp.type_u8();
                // Echo request/reply: the identifier plays the role of both ports.
                if matches!(h.icmp_type, 0 | 8) {
                    let id = echo_id(icmp.slice());
                    (sport, dport) = (id, id);
                }
            }
            Some(TransportSlice::Icmpv6(icmp)) => {
                h.l4 = L4::Icmpv6;
                h.l4_off = offset_in(frame, icmp.slice());
                h.icmp_type = icmp.type_u8();
                if matches!(h.icmp_type, 128 | 129) {
                    let id = echo_id(icmp.slice());
                    (sport, dport) = (id, id);
                }
            }
            None if !h.fragmented => h.l4 = L4::Other,
            None => {}
        }
        let tuple = FiveTuple { src, dst, sport, dport, proto };
        h.tuple = Some(tuple);
        h.flow = Some(FlowKey::from(tuple));
        h
    }

    /// Whether this is an IP packet whose headers parsed.
    pub fn is_ip(&self) -> bool {
        self.status == ParseStatus::Ok
    }
}

/// The common case read straight from the bytes: untagged Ethernet, IPv4 without a fragment
/// and TCP or UDP, every length consistent. Anything else (VLAN tags, IPv6, ICMP, fragments,
/// IP options carrying an authentication header, a length that does not add up) is `None` and
/// goes to etherparse, which reports what is wrong. Where it answers, the answer is exactly
/// etherparse's (tested against it on generated and real frames): this path exists because
/// slicing with etherparse and copying its result cost about 500 instructions a packet, a
/// quarter of a pass-through chain's work (docs/benchmarks.md, "Headers read in one pass").
///
/// Writes the headers into `h` where it can (`None`: `h` holds anything).
#[inline]
fn parse_plain_ipv4(frame: &[u8], h: &mut Headers) -> Option<()> {
    const ETH: usize = 14;
    let byte = |i: usize| frame.get(i).copied();
    let be16 = |i: usize| Some(u16::from_be_bytes([byte(i)?, byte(i + 1)?]));
    let be32 = |i: usize| Some(u32::from_be_bytes(frame.get(i..i + 4)?.try_into().ok()?));
    if be16(12)? != 0x0800 {
        return None;
    }
    let vihl = byte(ETH)?;
    let ihl = usize::from(vihl & 0x0f) * 4;
    let total = usize::from(be16(ETH + 2)?);
    // Version 4, a header of 20 bytes or more inside the total length, the total inside the
    // frame, and no fragment (more-fragments bit or an offset).
    if vihl >> 4 != 4 || ihl < 20 || total < ihl || frame.len() < ETH + total || be16(ETH + 6)? & 0x3fff != 0 {
        return None;
    }
    let src = std::net::Ipv4Addr::from(be32(ETH + 12)?);
    let dst = std::net::Ipv4Addr::from(be32(ETH + 16)?);
    let l4 = ETH + ihl;
    let ip_payload = total - ihl;
    let proto = byte(ETH + 9)?;
    *h = Headers { l3: L3::V4, l3_off: ETH as u16, l4_off: l4 as u16, ..Headers::default() };
    let (sport, dport) = (be16(l4)?, be16(l4 + 2)?);
    let (payload_off, payload_len) = match proto {
        6 => {
            let doff = usize::from(byte(l4 + 12)? & 0xf0) >> 2;
            if ip_payload < 20 || doff < 20 || doff > ip_payload {
                return None;
            }
            h.l4 = L4::Tcp;
            h.tcp_flags = TcpFlags(byte(l4 + 13)?);
            h.tcp_seq = be32(l4 + 4)?;
            h.tcp_ack = be32(l4 + 8)?;
            (l4 + doff, ip_payload - doff)
        }
        17 => {
            // A length of 0 means "to the end of the IP payload", as in etherparse.
            let len = match usize::from(be16(l4 + 4)?) {
                0 => ip_payload,
                n => n,
            };
            if ip_payload < 8 || len < 8 || len > ip_payload {
                return None;
            }
            h.l4 = L4::Udp;
            (l4 + 8, len - 8)
        }
        _ => return None,
    };
    // Frames are at most MAX_FRAME bytes, so offsets and lengths fit in 16 bits.
    h.payload_off = u16::try_from(payload_off).ok()?;
    h.payload_len = u16::try_from(payload_len).ok()?;
    let tuple = FiveTuple { src: IpAddr::V4(src), dst: IpAddr::V4(dst), sport, dport, proto: Proto(proto) };
    h.tuple = Some(tuple);
    h.flow = Some(FlowKey::from(tuple));
    Some(())
}

fn echo_id(icmp: &[u8]) -> u16 {
    match icmp.get(4..6) {
        Some(b) => u16::from_be_bytes([b[0], b[1]]),
        None => 0,
    }
}

fn vlan_id(v: &VlanSlice<'_>) -> u16 {
    match v {
        VlanSlice::SingleVlan(s) => s.vlan_identifier().value(),
        VlanSlice::DoubleVlan(d) => d.outer().vlan_identifier().value(),
    }
}

fn classify(e: &err::packet::SliceError) -> ParseStatus {
    match e {
        err::packet::SliceError::Len(_) => ParseStatus::Truncated,
        _ => ParseStatus::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet/IPv4/UDP frame 192.0.2.1:5000 → 192.0.2.2:53 with fragment word `frag`.
    fn udp_fragment(frag: u16) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
        f.extend_from_slice(&[0x45, 0, 0, 29, 0, 7]);
        f.extend_from_slice(&frag.to_be_bytes());
        f.extend_from_slice(&[64, 17, 0, 0, 192, 0, 2, 1, 192, 0, 2, 2]);
        f.extend_from_slice(&[0x13, 0x88, 0, 53, 0, 9, 0, 0, b'q']);
        f
    }

    #[test]
    fn no_fragment_has_its_transport_header_parsed() {
        let whole = Headers::parse(&udp_fragment(0));
        assert!(!whole.fragmented);
        assert_eq!((whole.l4, whole.tuple.map(|t| (t.sport, t.dport))), (L4::Udp, Some((5000, 53))));
        // The first fragment (more-fragments set, offset 0) and a later one alike.
        for frag in [0x2000, 0x2000 | 185, 185] {
            let h = Headers::parse(&udp_fragment(frag));
            assert_eq!(h.status, ParseStatus::Ok);
            assert!(h.fragmented, "{frag:#x}");
            assert_eq!(h.l4, L4::None, "{frag:#x}");
            let t = h.tuple.map(|t| (t.proto, t.sport, t.dport));
            assert_eq!(t, Some((Proto::UDP, 0, 0)), "{frag:#x}");
        }
    }

    /// Every frame of the bundled and shared traces (classic pcap, little-endian, Ethernet).
    fn trace_frames() -> Vec<Vec<u8>> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut paths: Vec<_> = ["traces", "../shared/traces"]
            .iter()
            .filter_map(|d| std::fs::read_dir(root.join(d)).ok())
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
            .collect();
        paths.sort();
        assert!(paths.len() >= 5, "traces found: {paths:?}");
        let mut out = Vec::new();
        for path in paths {
            let data = std::fs::read(&path).unwrap();
            if data.get(..4) != Some(&[0xd4, 0xc3, 0xb2, 0xa1][..])
                && data.get(..4) != Some(&[0x4d, 0x3c, 0xb2, 0xa1][..])
            {
                continue;
            }
            let mut off = 24;
            while let Some(h) = data.get(off..off + 16) {
                let cap = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
                let Some(f) = data.get(off + 16..off + 16 + cap) else { break };
                out.push(f.to_vec());
                off += 16 + cap;
            }
        }
        out
    }

    /// The direct path's answer, where it gives one, is etherparse's.
    fn same_as_sliced(frame: &[u8]) -> bool {
        direct(frame).is_none_or(|h| h == Headers::parse_sliced(frame))
    }

    /// The direct path's answer, if it gives one.
    fn direct(frame: &[u8]) -> Option<Headers> {
        let mut h = Headers { status: ParseStatus::Malformed, ..Headers::default() };
        parse_plain_ipv4(frame, &mut h).map(|()| h)
    }

    #[test]
    fn plain_tcp_and_udp_take_the_direct_path_with_etherparse_s_answer() {
        for udp in [false, true] {
            for payload in [&b""[..], b"hello", &[7u8; 1400][..]] {
                let mut f = crate::test_frame(udp, payload);
                let answer = direct(&f).expect("a plain frame takes the direct path");
                assert_eq!(answer, Headers::parse_sliced(&f));
                assert_eq!((answer.l4 == L4::Udp, usize::from(answer.payload_len)), (udp, payload.len()));
                // Ethernet padding after the IP packet is not payload.
                f.extend_from_slice(&[0; 6]);
                assert_eq!(direct(&f), Some(answer));
                assert_eq!(Headers::parse_sliced(&f), answer);
            }
        }
        // What it leaves to etherparse: fragments, ICMP, IPv6, VLAN tags.
        assert_eq!(direct(&udp_fragment(0x2000)), None);
        assert!(direct(&udp_fragment(0)).is_some());
        let icmp = {
            let b =
                etherparse::PacketBuilder::ethernet2([2; 6], [3; 6]).ipv4([1; 4], [2; 4], 9).icmpv4_echo_request(1, 2);
            let mut f = Vec::new();
            b.write(&mut f, b"x").unwrap();
            f
        };
        assert_eq!(direct(&icmp), None);
        assert_eq!(Headers::parse(&icmp).l4, L4::Icmp);
    }

    #[test]
    fn every_frame_of_the_traces_parses_as_etherparse_parses_it() {
        let frames = trace_frames();
        let taken = frames.iter().filter(|f| direct(f).is_some()).count();
        for (i, f) in frames.iter().enumerate() {
            assert!(same_as_sliced(f), "frame {i}: {:?} vs {:?}", direct(f), Headers::parse_sliced(f));
        }
        // The traces are mostly plain TCP and UDP over IPv4: the direct path is the common one.
        assert!(taken * 2 > frames.len(), "{taken} of {} frames took the direct path", frames.len());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// Header bytes overwritten (lengths, version, flags, data offset, protocol, ...), the
        /// frame cut or grown: the direct path answers as etherparse does or leaves it.
        #[test]
        fn damaged_frames_parse_as_etherparse_parses_them(
            udp in proptest::prelude::any::<bool>(),
            len in 0usize..80,
            edits in proptest::collection::vec((0usize..60, proptest::prelude::any::<u8>()), 0..4),
            cut in 0usize..140,
            grow in 0usize..8,
        ) {
            let mut f = crate::test_frame(udp, &vec![0xab; len]);
            for (at, v) in edits {
                if let Some(b) = f.get_mut(at) {
                    *b = v;
                }
            }
            f.truncate(cut.max(14));
            f.extend(std::iter::repeat_n(0u8, grow));
            proptest::prop_assert!(same_as_sliced(&f));
        }
    }
}
