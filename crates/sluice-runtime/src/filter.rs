//! Traffic filters on edges and traffic classes: a small boolean language over header fields
//! and labels.
//!
//! ```text
//! tcp and dst_port == 22
//! not (src_ip in 10.0.0.0/8) or label.suspicious
//! udp and port in 53-54
//! ```
//! Atoms: protocol words (`ip`, `ipv4`, `ipv6`, `tcp`, `udp`, `icmp`, `icmpv6`, `non_ip`);
//! comparisons `FIELD == V`, `FIELD != V`, `FIELD in V` over `src_ip`, `dst_ip`, `ip` (either
//! address), `src_port`, `dst_port`, `port` (either port), `proto`, `vlan`, `in_port` (interface the packet came in on), `label.NAME`, where
//! `V` is a number, an address, a CIDR prefix or a range `A-B`; and `label.NAME` alone (set).

use sluice_nf::LabelTable;
use sluice_packet::{LabelId, Packet, Proto, L3};
use std::net::IpAddr;

/// A filter that failed to parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter `{text}`: {message}")]
pub struct FilterError {
    /// The filter text.
    pub text: String,
    /// What is wrong.
    pub message: String,
}

/// A parsed filter.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    expr: Expr,
    text: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Is(Kind),
    Cmp(Field, bool, Val),
    LabelSet(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Ip,
    V4,
    V6,
    NonIp,
    Proto(Proto),
}

#[derive(Debug, Clone, PartialEq)]
enum Field {
    SrcIp,
    DstIp,
    AnyIp,
    SrcPort,
    DstPort,
    AnyPort,
    Proto,
    Vlan,
    InPort,
    Label(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Val {
    Range(u64, u64),
    Prefix(IpAddr, u8),
}

/// A filter with its label names resolved, ready to evaluate on packets.
#[derive(Debug, Clone)]
pub struct CompiledFilter {
    filter: Filter,
    labels: Vec<(String, Option<LabelId>)>,
}

impl Filter {
    /// Parses filter text.
    pub fn parse(text: &str) -> Result<Filter, FilterError> {
        let toks = tokenize(text);
        let mut p = Parser { toks: &toks, pos: 0 };
        let fail = |m: String| FilterError { text: text.to_string(), message: m };
        if toks.is_empty() {
            return Err(fail("empty filter".into()));
        }
        let expr = p.or().map_err(fail)?;
        if p.pos != toks.len() {
            return Err(fail(format!("unexpected `{}`", toks[p.pos])));
        }
        Ok(Filter { expr, text: text.to_string() })
    }

    /// The filter's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Label names the filter reads.
    pub fn label_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        collect_labels(&self.expr, &mut out);
        out
    }

    /// Resolves label names against the chain's table (interning them).
    pub fn compile(&self, labels: &mut LabelTable) -> CompiledFilter {
        let names = self.label_names();
        CompiledFilter {
            filter: self.clone(),
            labels: names
                .into_iter()
                .map(|n| {
                    let id = labels.intern(&n);
                    (n, Some(id))
                })
                .collect(),
        }
    }
}

fn collect_labels(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::And(a, b) | Expr::Or(a, b) => {
            collect_labels(a, out);
            collect_labels(b, out);
        }
        Expr::Not(a) => collect_labels(a, out),
        Expr::LabelSet(n) | Expr::Cmp(Field::Label(n), ..) => out.push(n.clone()),
        _ => {}
    }
}

impl CompiledFilter {
    /// Whether `pkt` matches.
    pub fn matches(&self, pkt: &Packet) -> bool {
        self.eval(&self.filter.expr, pkt)
    }

    /// The source text.
    pub fn text(&self) -> &str {
        self.filter.text()
    }

    fn label(&self, name: &str, pkt: &Packet) -> Option<u32> {
        let id = self.labels.iter().find(|(n, _)| n == name).and_then(|(_, id)| *id)?;
        pkt.meta.labels.get(id)
    }

    fn eval(&self, e: &Expr, pkt: &Packet) -> bool {
        let h = pkt.hdr();
        match e {
            Expr::And(a, b) => self.eval(a, pkt) && self.eval(b, pkt),
            Expr::Or(a, b) => self.eval(a, pkt) || self.eval(b, pkt),
            Expr::Not(a) => !self.eval(a, pkt),
            Expr::Is(k) => match k {
                Kind::Ip => h.is_ip(),
                Kind::V4 => h.is_ip() && h.l3 == L3::V4,
                Kind::V6 => h.is_ip() && h.l3 == L3::V6,
                Kind::NonIp => !h.is_ip(),
                Kind::Proto(p) => h.tuple.is_some_and(|t| t.proto == *p),
            },
            Expr::LabelSet(n) => self.label(n, pkt).is_some(),
            Expr::Cmp(f, eq, v) => {
                let hit = match f {
                    Field::Label(n) => self.label(n, pkt).is_some_and(|x| v.has_num(u64::from(x))),
                    Field::Vlan => h.vlan.is_some_and(|x| v.has_num(u64::from(x))),
                    Field::InPort => v.has_num(u64::from(pkt.meta.in_port)),
                    _ => match h.tuple {
                        None => return false,
                        Some(t) => match f {
                            Field::SrcIp => v.has_ip(t.src),
                            Field::DstIp => v.has_ip(t.dst),
                            Field::AnyIp => v.has_ip(t.src) || v.has_ip(t.dst),
                            Field::SrcPort => v.has_num(u64::from(t.sport)),
                            Field::DstPort => v.has_num(u64::from(t.dport)),
                            Field::AnyPort => v.has_num(u64::from(t.sport)) || v.has_num(u64::from(t.dport)),
                            Field::Proto => v.has_num(u64::from(t.proto.0)),
                            Field::Label(_) | Field::Vlan | Field::InPort => false,
                        },
                    },
                };
                hit == *eq
            }
        }
    }
}

impl Val {
    fn has_num(&self, x: u64) -> bool {
        matches!(self, Val::Range(a, b) if *a <= x && x <= *b)
    }
    fn has_ip(&self, ip: IpAddr) -> bool {
        let Val::Prefix(net, len) = self else { return false };
        match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if *len == 0 { 0 } else { u32::MAX << (32 - u32::from(*len)) };
                u32::from(*n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if *len == 0 { 0 } else { u128::MAX << (128 - u32::from(*len)) };
                u128::from(*n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

fn tokenize(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        if !cur.is_empty() {
            out.push(std::mem::take(cur));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '(' | ')' => {
                flush(&mut cur, &mut out);
                out.push(c.to_string());
            }
            '=' | '!' => {
                flush(&mut cur, &mut out);
                if chars.peek() == Some(&'=') {
                    chars.next();
                    out.push(format!("{c}="));
                } else {
                    out.push(c.to_string());
                }
            }
            c if c.is_whitespace() => flush(&mut cur, &mut out),
            c => cur.push(c),
        }
    }
    flush(&mut cur, &mut out);
    out
}

struct Parser<'a> {
    toks: &'a [String],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.toks.get(self.pos).map(String::as_str)
    }
    fn next(&mut self) -> Option<&str> {
        let t = self.toks.get(self.pos).map(String::as_str);
        self.pos += 1;
        t
    }
    fn or(&mut self) -> Result<Expr, String> {
        let mut e = self.and()?;
        while matches!(self.peek(), Some("or") | Some("||")) {
            self.pos += 1;
            e = Expr::Or(Box::new(e), Box::new(self.and()?));
        }
        Ok(e)
    }
    fn and(&mut self) -> Result<Expr, String> {
        let mut e = self.not()?;
        while matches!(self.peek(), Some("and") | Some("&&")) {
            self.pos += 1;
            e = Expr::And(Box::new(e), Box::new(self.not()?));
        }
        Ok(e)
    }
    fn not(&mut self) -> Result<Expr, String> {
        if matches!(self.peek(), Some("not") | Some("!")) {
            self.pos += 1;
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.atom()
    }
    fn atom(&mut self) -> Result<Expr, String> {
        let t = self.next().ok_or("expression ends too early")?.to_string();
        if t == "(" {
            let e = self.or()?;
            return match self.next() {
                Some(")") => Ok(e),
                _ => Err("missing `)`".into()),
            };
        }
        let kind = match t.as_str() {
            "ip" => Some(Kind::Ip),
            "ipv4" | "ip4" => Some(Kind::V4),
            "ipv6" | "ip6" => Some(Kind::V6),
            "non_ip" => Some(Kind::NonIp),
            "tcp" => Some(Kind::Proto(Proto::TCP)),
            "udp" => Some(Kind::Proto(Proto::UDP)),
            "icmp" => Some(Kind::Proto(Proto::ICMP)),
            "icmpv6" => Some(Kind::Proto(Proto::ICMPV6)),
            _ => None,
        };
        if let Some(k) = kind {
            return Ok(Expr::Is(k));
        }
        let field = match t.as_str() {
            "src_ip" => Field::SrcIp,
            "dst_ip" => Field::DstIp,
            "ip_addr" | "host" => Field::AnyIp,
            "src_port" => Field::SrcPort,
            "dst_port" => Field::DstPort,
            "port" => Field::AnyPort,
            "proto" => Field::Proto,
            "vlan" => Field::Vlan,
            "in_port" => Field::InPort,
            l if l.starts_with("label.") && l.len() > 6 => Field::Label(l[6..].to_string()),
            other => return Err(format!("unknown word `{other}`")),
        };
        let op = match self.peek() {
            Some("==") => true,
            Some("!=") => false,
            Some("in") => true,
            _ => {
                if let Field::Label(n) = field {
                    return Ok(Expr::LabelSet(n));
                }
                return Err(format!("`{t}` needs `==`, `!=` or `in` and a value"));
            }
        };
        self.pos += 1;
        let v = self.next().ok_or_else(|| format!("`{t}` needs a value"))?.to_string();
        let val = match field {
            Field::SrcIp | Field::DstIp | Field::AnyIp => parse_prefix(&v)?,
            Field::Proto => match Proto::parse(&v) {
                Some(p) => Val::Range(u64::from(p.0), u64::from(p.0)),
                None => return Err(format!("`{v}` is not a protocol")),
            },
            _ => parse_range(&v)?,
        };
        Ok(Expr::Cmp(field, op, val))
    }
}

fn parse_prefix(v: &str) -> Result<Val, String> {
    let (a, len) = match v.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (v, None),
    };
    let ip: IpAddr = a.parse().map_err(|_| format!("`{v}` is not an address or prefix"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max).ok_or_else(|| format!("bad prefix length in `{v}`"))?,
        None => max,
    };
    Ok(Val::Prefix(ip, len))
}

fn parse_range(v: &str) -> Result<Val, String> {
    let num = |s: &str| s.parse::<u64>().map_err(|_| format!("`{v}` is not a number or range A-B"));
    match v.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (num(a)?, num(b)?);
            if a > b {
                return Err(format!("range `{v}` is empty"));
            }
            Ok(Val::Range(a, b))
        }
        None => {
            let n = num(v)?;
            Ok(Val::Range(n, n))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_packet::Meta;

    fn tcp_pkt(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Packet {
        let mut v = Vec::new();
        let b = etherparse_builder(src, dst, sport, dport);
        v.extend_from_slice(&b);
        Packet::new(v, Meta::default())
    }

    fn etherparse_builder(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        // Ethernet + IPv4 + TCP, built by hand to keep this crate free of a builder dependency.
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12] = 0x08;
        f[14] = 0x45;
        f[16..18].copy_from_slice(&40u16.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[46] = 0x50;
        f[47] = 0x02;
        f
    }

    #[test]
    fn evaluates() {
        let p = tcp_pkt([10, 0, 0, 1], [8, 8, 8, 8], 1234, 22);
        let mut labels = LabelTable::default();
        let m = |s: &str, labels: &mut LabelTable| Filter::parse(s).map(|f| f.compile(labels).matches(&p));
        assert_eq!(m("tcp and dst_port == 22", &mut labels), Ok(true));
        assert_eq!(m("udp or dst_port != 22", &mut labels), Ok(false));
        assert_eq!(m("src_ip in 10.0.0.0/8 and not (port in 80-90)", &mut labels), Ok(true));
        assert_eq!(m("ip_addr == 8.8.8.8", &mut labels), Ok(true));
        assert_eq!(m("label.x", &mut labels), Ok(false));
        assert_eq!(m("proto == tcp && ipv4", &mut labels), Ok(true));
        assert!(Filter::parse("tcp and").is_err());
        assert!(Filter::parse("dst_port == 9-1").is_err());
        assert!(Filter::parse("src_ip == 10.0.0.0/33").is_err());
        assert!(Filter::parse("(tcp").is_err());
        assert!(Filter::parse("bogus").is_err());
    }

    #[test]
    fn labels_match() {
        let mut p = tcp_pkt([10, 0, 0, 1], [8, 8, 8, 8], 1234, 22);
        let mut labels = LabelTable::default();
        let f = Filter::parse("label.suspicious == 2").map(|f| f.compile(&mut labels));
        let Ok(f) = f else { panic!("parse") };
        let id = labels.intern("suspicious");
        assert!(!f.matches(&p));
        p.meta.labels.set(id, 2);
        assert!(f.matches(&p));
    }
}
