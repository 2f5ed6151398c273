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

/// An address as two 64-bit words of its value (high, low; IPv4 in the low word) and whether
/// it is IPv6. Words compare in `IpAddr`'s order within a family.
fn to_words(ip: &IpAddr) -> ([u64; 2], bool) {
    match ip {
        IpAddr::V4(a) => ([0, u64::from(u32::from(*a))], false),
        IpAddr::V6(a) => {
            let v = u128::from(*a);
            ([(v >> 64) as u64, v as u64], true)
        }
    }
}

/// The address [`to_words`] split.
fn from_words(w: [u64; 2], v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(((u128::from(w[0]) << 64) | u128::from(w[1])).into())
    } else {
        // An IPv4 address was written in the low word's low half.
        IpAddr::V4((w[1] as u32).into())
    }
}

/// A flow key that is the same for both directions of a connection: the two endpoints `a`
/// and `b` in a canonical (sorted) order.
///
/// Addresses are held as aligned 64-bit words rather than as `IpAddr`s (17 bytes, the value
/// at offset 1): every per-packet state operation hashes and compares the key just after it
/// was built, and reading a 128-bit address out of a byte-aligned `IpAddr` straddles the
/// stores it was copied with, which stalls the load (the CPU cannot forward the stored bytes
/// to it). Measured on Embark's encrypted traffic: hashing a flow key was a third dearer with
/// IPv6 addresses than with IPv4 ones before this layout (docs/benchmarks.md).
#[derive(Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(from = "FlowKeyFields", into = "FlowKeyFields")]
pub struct FlowKey {
    /// The addresses of `a` and `b`, see [`to_words`].
    addr: [[u64; 2]; 2],
    /// The ports of `a` and `b`.
    port: [u16; 2],
    /// IP protocol.
    pub proto: Proto,
    /// Bit 0: `a` is IPv6; bit 1: `b` is.
    v6: u8,
}

/// How a [`FlowKey`] is written (serde): its endpoints as `(IpAddr, port)`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename = "FlowKey")]
struct FlowKeyFields {
    a: (IpAddr, u16),
    b: (IpAddr, u16),
    proto: Proto,
}

impl From<FlowKeyFields> for FlowKey {
    fn from(f: FlowKeyFields) -> Self {
        FlowKey::new(f.a, f.b, f.proto)
    }
}

impl From<FlowKey> for FlowKeyFields {
    fn from(k: FlowKey) -> Self {
        FlowKeyFields { a: k.a(), b: k.b(), proto: k.proto }
    }
}

impl FlowKey {
    /// A key with endpoints `a` and `b` as given (no reordering: [`FlowKey::from`] a
    /// [`FiveTuple`] makes the canonical, direction-free key).
    pub fn new(a: (IpAddr, u16), b: (IpAddr, u16), proto: Proto) -> FlowKey {
        let (wa, a6) = to_words(&a.0);
        let (wb, b6) = to_words(&b.0);
        FlowKey { addr: [wa, wb], port: [a.1, b.1], proto, v6: u8::from(a6) | (u8::from(b6) << 1) }
    }

    /// The lower endpoint.
    pub fn a(&self) -> (IpAddr, u16) {
        (from_words(self.addr[0], self.v6 & 1 != 0), self.port[0])
    }

    /// The higher endpoint.
    pub fn b(&self) -> (IpAddr, u16) {
        (from_words(self.addr[1], self.v6 & 2 != 0), self.port[1])
    }

    /// Whether `t` goes from endpoint `a` (else it comes from `b`, if it is of this flow).
    pub fn source_is_a(&self, t: &FiveTuple) -> bool {
        let (w, v6) = to_words(&t.src);
        w == self.addr[0] && v6 == (self.v6 & 1 != 0) && t.sport == self.port[0]
    }

    /// The fields in the order keys sort by: that of `((IpAddr, u16), (IpAddr, u16), Proto)`.
    fn order(&self) -> (u8, [u64; 2], u16, u8, [u64; 2], u16, Proto) {
        (self.v6 & 1, self.addr[0], self.port[0], self.v6 & 2, self.addr[1], self.port[1], self.proto)
    }
}

impl PartialOrd for FlowKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FlowKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order().cmp(&other.order())
    }
}

impl fmt::Debug for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowKey").field("a", &self.a()).field("b", &self.b()).field("proto", &self.proto).finish()
    }
}

impl Hash for FlowKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let [a, b] = self.addr;
        let rest = (u64::from(self.v6) << 40)
            | (u64::from(self.port[0]) << 24)
            | (u64::from(self.port[1]) << 8)
            | u64::from(self.proto.0);
        if self.v6 == 0 {
            // Two IPv4 addresses fill one word: one write instead of three (every per-flow
            // state operation hashes its key). Equal keys have equal `v6`, so they still hash
            // alike.
            h.write_u128((u128::from((a[1] << 32) | b[1]) << 64) | u128::from(rest));
            return;
        }
        h.write_u128((u128::from(a[0]) << 64) | u128::from(a[1]));
        h.write_u128((u128::from(b[0]) << 64) | u128::from(b[1]));
        h.write_u64(rest);
    }
}

impl From<FiveTuple> for FlowKey {
    fn from(t: FiveTuple) -> Self {
        let (ws, s6) = to_words(&t.src);
        let (wd, d6) = to_words(&t.dst);
        let (src, dst) = ((s6, ws, t.sport), (d6, wd, t.dport));
        let ((a6, wa, pa), (b6, wb, pb)) = if src <= dst { (src, dst) } else { (dst, src) };
        FlowKey { addr: [wa, wb], port: [pa, pb], proto: t.proto, v6: u8::from(a6) | (u8::from(b6) << 1) }
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ((ia, pa), (ib, pb)) = (self.a(), self.b());
        write!(f, "{} {}:{} <> {}:{}", self.proto, ia, pa, ib, pb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_keys_hash_alike_both_ways_and_apart_otherwise() {
        use std::hash::BuildHasher;
        let hasher = std::collections::hash_map::RandomState::new();
        let mut seen = std::collections::HashSet::new();
        for i in 0u32..2000 {
            let v6 = i % 5 == 0;
            let ip = |x: u32| -> IpAddr {
                if v6 {
                    IpAddr::V6(std::net::Ipv6Addr::from(u128::from(x) << 40 | 7))
                } else {
                    IpAddr::V4(std::net::Ipv4Addr::from(x))
                }
            };
            let t = FiveTuple {
                src: ip(0x0a00_0000 + i * 7),
                dst: ip(0xc000_0200 + i % 13),
                sport: (i * 31) as u16,
                dport: 80,
                proto: Proto::TCP,
            };
            let (k, r) = (t.flow_key(), t.reversed().flow_key());
            assert_eq!(hasher.hash_one(k), hasher.hash_one(r));
            seen.insert(hasher.hash_one(k));
        }
        assert_eq!(seen.len(), 2000, "distinct flows hash apart");
    }

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
                    assert_eq!((k.a(), k.b()), want, "{t}");
                    assert_eq!(k.source_is_a(&t), want.0 == (x, px), "{t}");
                }
            }
        }
    }

    /// The word layout keeps what the `(IpAddr, u16)` fields gave: keys sort as
    /// `((IpAddr, u16), (IpAddr, u16), Proto)` tuples, read back their endpoints, and are
    /// written (JSON) as those fields.
    #[test]
    fn flow_keys_sort_and_serialise_as_their_endpoints() {
        let eps: Vec<(IpAddr, u16)> = ["10.0.0.1", "255.255.255.255", "::", "::ffff:10.0.0.1", "fe80::1", "ffff::ffff"]
            .iter()
            .flat_map(|s| [(s.parse().unwrap(), 0), (s.parse().unwrap(), 65535)])
            .collect();
        let mut keys = Vec::new();
        for &a in &eps {
            for &b in &eps {
                for proto in [Proto::TCP, Proto::UDP] {
                    let k = FlowKey::new(a, b, proto);
                    assert_eq!((k.a(), k.b(), k.proto), (a, b, proto));
                    let json = serde_json::to_string(&k).unwrap();
                    assert_eq!(json, serde_json::to_string(&FlowKeyFields { a, b, proto }).unwrap());
                    assert_eq!(serde_json::from_str::<FlowKey>(&json).unwrap(), k);
                    keys.push((k, (a, b, proto)));
                }
            }
        }
        for (k1, t1) in &keys {
            for (k2, t2) in &keys {
                assert_eq!(k1.cmp(k2), t1.cmp(t2), "{k1} vs {k2}");
                assert_eq!(k1 == k2, t1 == t2);
            }
        }
    }
}

/// FNV-1a, 64 bits: a few multiplications per field, no allocation, and the same in every
/// process (the standard library's hasher and `ahash` are keyed per process), for numbers that
/// several processes or nodes must agree on.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}
