//! Flow identifiers: the directional 5-tuple, a direction-free flow key, and the header fields
//! that state scopes and traffic filters are written over.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

/// IP protocol number, with names for the common ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize)]
pub struct Proto(pub u8);

impl Proto {
    /// ICMP.
    pub const ICMP: Proto = Proto(1);
    /// TCP.
    pub const TCP: Proto = Proto(6);
    /// UDP.
    pub const UDP: Proto = Proto(17);
    /// ICMPv6.
    pub const ICMPV6: Proto = Proto(58);

    /// Parses `tcp`, `udp`, `icmp`, `icmpv6` or a number.
    pub fn parse(s: &str) -> Option<Proto> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Proto::TCP),
            "udp" => Some(Proto::UDP),
            "icmp" => Some(Proto::ICMP),
            "icmpv6" | "icmp6" => Some(Proto::ICMPV6),
            n => n.parse().ok().map(Proto),
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Proto::TCP => f.write_str("tcp"),
            Proto::UDP => f.write_str("udp"),
            Proto::ICMP => f.write_str("icmp"),
            Proto::ICMPV6 => f.write_str("icmpv6"),
            Proto(n) => write!(f, "{n}"),
        }
    }
}

/// A header field that a state scope or an edge filter can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderField {
    /// Source IP address.
    SrcIp,
    /// Destination IP address.
    DstIp,
    /// Source transport port (0 where the protocol has none).
    SrcPort,
    /// Destination transport port.
    DstPort,
    /// IP protocol number.
    Proto,
}

impl HeaderField {
    /// All five fields, i.e. the 5-tuple scope.
    pub const FIVE_TUPLE: [HeaderField; 5] =
        [HeaderField::SrcIp, HeaderField::DstIp, HeaderField::SrcPort, HeaderField::DstPort, HeaderField::Proto];
}

/// The directional 5-tuple of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct FiveTuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port (0 for protocols without ports; ICMP echo uses the identifier).
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol.
    pub proto: Proto,
}

impl FiveTuple {
    /// The tuple of the reverse direction.
    pub fn reversed(&self) -> FiveTuple {
        FiveTuple { src: self.dst, dst: self.src, sport: self.dport, dport: self.sport, proto: self.proto }
    }
    /// The direction-free key of the flow this packet belongs to.
    pub fn flow_key(&self) -> FlowKey {
        FlowKey::from(*self)
    }
    /// Feeds the given fields into `hasher`, in a fixed order; used to partition traffic on a
    /// scope. Direction-sensitive: the scope names source and destination explicitly.
    pub fn hash_fields<H: Hasher>(&self, fields: &[HeaderField], hasher: &mut H) {
        for f in fields {
            match f {
                HeaderField::SrcIp => self.src.hash(hasher),
                HeaderField::DstIp => self.dst.hash(hasher),
                HeaderField::SrcPort => self.sport.hash(hasher),
                HeaderField::DstPort => self.dport.hash(hasher),
                HeaderField::Proto => self.proto.hash(hasher),
            }
        }
    }
}

impl fmt::Display for FiveTuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{} > {}:{}", self.proto, self.src, self.sport, self.dst, self.dport)
    }
}

/// Feeds an address into `h` as one machine word (a `u32` for IPv4, a `u128` for IPv6) rather
/// than as a length-prefixed byte slice, the way `IpAddr`'s own `Hash` does: per-packet state
/// lookups hash 128-bit (Embark's encrypted, or any IPv6) addresses as cheaply as IPv4 ones.
/// Consistent with `IpAddr`'s equality (equal addresses feed equal words).
pub fn hash_ip<H: Hasher>(ip: &IpAddr, h: &mut H) {
    match ip {
        IpAddr::V4(a) => h.write_u32(u32::from(*a)),
        IpAddr::V6(a) => h.write_u128(u128::from(*a)),
    }
}

/// The order of `IpAddr` (IPv4 before IPv6, then by value) with `(address, port)` pairs
/// compared as integers: `Ipv6Addr`'s own `Ord` goes through its eight 16-bit segments.
fn endpoint_le(x: &(IpAddr, u16), y: &(IpAddr, u16)) -> bool {
    let word = |ip: &IpAddr| match ip {
        IpAddr::V4(a) => (0u8, u128::from(u32::from(*a))),
        IpAddr::V6(a) => (1u8, u128::from(*a)),
    };
    (word(&x.0), x.1) <= (word(&y.0), y.1)
}

/// A flow key that is the same for both directions of a connection: the two endpoints in a
/// canonical (sorted) order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct FlowKey {
    /// The lower endpoint.
    pub a: (IpAddr, u16),
    /// The higher endpoint.
    pub b: (IpAddr, u16),
    /// IP protocol.
    pub proto: Proto,
}

impl Hash for FlowKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        hash_ip(&self.a.0, h);
        hash_ip(&self.b.0, h);
        h.write_u64((u64::from(self.a.1) << 24) | (u64::from(self.b.1) << 8) | u64::from(self.proto.0));
    }
}

impl From<FiveTuple> for FlowKey {
    fn from(t: FiveTuple) -> Self {
        let x = (t.src, t.sport);
        let y = (t.dst, t.dport);
        let (a, b) = if endpoint_le(&x, &y) { (x, y) } else { (y, x) };
        FlowKey { a, b, proto: t.proto }
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{} <> {}:{}", self.proto, self.a.0, self.a.1, self.b.0, self.b.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_key_is_direction_free() {
        let t = FiveTuple {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            sport: 1234,
            dport: 80,
            proto: Proto::TCP,
        };
        assert_eq!(t.flow_key(), t.reversed().flow_key());
        assert_ne!(t, t.reversed());
    }

    #[test]
    fn flow_key_order_is_that_of_ipaddr() {
        let ips: Vec<IpAddr> =
            ["10.0.0.1", "10.0.0.2", "9.255.255.255", "::1", "fe80::1", "::ffff:10.0.0.1", "2001:db8::"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
        for &x in &ips {
            for &y in &ips {
                for (px, py) in [(1, 2), (2, 1), (7, 7)] {
                    let t = FiveTuple { src: x, dst: y, sport: px, dport: py, proto: Proto::UDP };
                    let want = if (x, px) <= (y, py) { ((x, px), (y, py)) } else { ((y, py), (x, px)) };
                    let k = t.flow_key();
                    assert_eq!((k.a, k.b), want, "{t}");
                }
            }
        }
    }
}
