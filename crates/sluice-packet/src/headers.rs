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
}
