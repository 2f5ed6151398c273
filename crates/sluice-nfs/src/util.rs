//! Helpers shared by the NFs, and the pass-through NF.

use sluice_nf::{BuildCtx, NetworkFunction, NfContext, NfError, StateDecl, Verdict};
use sluice_packet::Packet;

/// Deserialises an NF's `config` block (`Null` meaning "all defaults").
pub fn parse_config<T: serde::de::DeserializeOwned + Default>(config: &serde_yaml::Value) -> Result<T, NfError> {
    if config.is_null() {
        return Ok(T::default());
    }
    serde_yaml::from_value(config.clone()).map_err(NfError::from_serde)
}

/// Forwards everything; keeps no state.
pub struct Passthrough;

impl NetworkFunction for Passthrough {
    fn kind(&self) -> &'static str {
        "passthrough"
    }
    fn state_objects(&self) -> &[StateDecl] {
        &[]
    }
    fn process(&self, _pkt: &mut Packet, _ctx: &mut NfContext<'_>) -> Verdict {
        Verdict::Forward
    }
}

/// Builds a [`Passthrough`]; it takes no configuration.
pub fn build_passthrough(
    config: &serde_yaml::Value,
    _ctx: &mut BuildCtx<'_>,
) -> Result<Box<dyn NetworkFunction>, NfError> {
    if !config.is_null() {
        return Err(NfError::config("", "passthrough takes no configuration"));
    }
    Ok(Box::new(Passthrough))
}

/// An IPv4 or IPv6 prefix such as `10.0.0.0/8` or `2001:db8::/32`. A bare address is a host
/// prefix (`/32` or `/128`); `any` matches every address of both families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cidr {
    /// Every address.
    Any,
    /// An IPv4 prefix: network address (host bits cleared) and network mask (kept rather than
    /// the length, so that a membership test is one AND and one comparison).
    V4(u32, u32),
    /// An IPv6 prefix: network address (host bits cleared) and network mask.
    V6(u128, u128),
}

impl Cidr {
    /// Parses `a.b.c.d/n`, `x:y::/n`, a bare address, or `any`.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("any") {
            return Ok(Cidr::Any);
        }
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: std::net::IpAddr =
            addr.parse().map_err(|_| format!("`{s}` is not an IP address or prefix (e.g. 10.0.0.0/8)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|&l| l <= max)
                .ok_or_else(|| format!("`{s}`: prefix length must be a number from 0 to {max}"))?,
            None => max,
        };
        Ok(match addr {
            std::net::IpAddr::V4(a) => Cidr::V4(u32::from(a) & mask32(len), mask32(len)),
            std::net::IpAddr::V6(a) => Cidr::V6(u128::from(a) & mask128(len), mask128(len)),
        })
    }

    /// Whether `ip` lies in the prefix (never across families, except for `any`).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        match (*self, ip) {
            (Cidr::Any, _) => true,
            (Cidr::V4(net, mask), std::net::IpAddr::V4(a)) => u32::from(a) & mask == net,
            (Cidr::V6(net, mask), std::net::IpAddr::V6(a)) => u128::from(a) & mask == net,
            _ => false,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Cidr::Any => f.write_str("any"),
            Cidr::V4(n, m) => write!(f, "{}/{}", std::net::Ipv4Addr::from(n), m.leading_ones()),
            Cidr::V6(n, m) => write!(f, "{}/{}", std::net::Ipv6Addr::from(n), m.leading_ones()),
        }
    }
}

fn mask32(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

/// Parses a list of prefixes from config field `field`, naming the offending entry on error.
pub fn parse_cidrs(field: &str, list: &[String]) -> Result<Vec<Cidr>, NfError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| Cidr::parse(s).map_err(|m| NfError::config(format!("{field}[{i}]"), m)))
        .collect()
}

/// Parses an endpoint written `ip`, `ip:port` or `[ipv6]:port`; port `None` when absent.
pub fn parse_endpoint(s: &str) -> Result<(std::net::IpAddr, Option<u16>), String> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Ok((ip, None));
    }
    match s.parse::<std::net::SocketAddr>() {
        Ok(sa) if sa.port() != 0 => Ok((sa.ip(), Some(sa.port()))),
        Ok(_) => Err(format!("`{s}`: port 0 is not a valid port")),
        Err(_) => Err(format!("`{s}` is not `ip`, `ip:port` or `[ipv6]:port`")),
    }
}

/// Nanoseconds in a second, for timeouts configured in seconds.
pub const NS_PER_S: u64 = 1_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parse_and_contains() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.200.1.2".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(!c.contains("::1".parse().unwrap()));
        assert_eq!(Cidr::parse("10.1.2.3/8").unwrap(), c);
        let h = Cidr::parse("192.168.1.7").unwrap();
        assert!(h.contains("192.168.1.7".parse().unwrap()) && !h.contains("192.168.1.8".parse().unwrap()));
        let z = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(z.contains("1.2.3.4".parse().unwrap()));
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        assert!(v6.contains("2001:db8:ffff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
        assert!(Cidr::parse("::/0").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("any").unwrap().contains("1.1.1.1".parse().unwrap()));
        for bad in ["10.0.0.0/33", "10.0.0/8", "x", "::/129", "10.0.0.0/"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(c.to_string(), "10.0.0.0/8");
        for s in ["0.0.0.0/0", "1.2.3.4/32", "::/0", "2001:db8::/32", "::1/128", "fe80::/10"] {
            assert_eq!(Cidr::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoint("10.0.0.1").unwrap(), ("10.0.0.1".parse().unwrap(), None));
        assert_eq!(parse_endpoint("10.0.0.1:80").unwrap(), ("10.0.0.1".parse().unwrap(), Some(80)));
        assert_eq!(parse_endpoint("[::1]:443").unwrap(), ("::1".parse().unwrap(), Some(443)));
        assert!(parse_endpoint("10.0.0.1:0").is_err());
        assert!(parse_endpoint("host:80").is_err());
    }
}
