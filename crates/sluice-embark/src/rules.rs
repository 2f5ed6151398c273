//! Rule encryption: a provider chain's plaintext NF configuration becomes the encrypted
//! configuration the provider loads, plus the gateway's secret state.
//!
//! Supported NF types and what changes in their config:
//!
//! | type | plaintext | encrypted |
//! |---|---|---|
//! | `firewall` | `src`/`dst` prefixes, `sport`/`dport` ranges | each rule expanded into one rule per combination of encrypted prefixes (order kept, so "first match wins" is preserved) |
//! | `nat` | `external_ip`, `internal` prefixes | `external_ip` a pool value, `internal` the encrypted prefixes |
//! | `lb` | `vips` (`ip`, `ip:port`, `prefix`, `prefix@ports`), `backends` | VIPs as encrypted prefixes and port ranges, backends as pool values |
//! | `ids` | `rules` (patterns) | `encrypted:` KeywordMatch rules (patterns and messages removed) |
//! | `passthrough` | — | — |
//!
//! Protocols, actions, timeouts and port pools are not secret and stay as they are.

use crate::gateway::{GatewayState, PoolEntry};
use crate::keys::{v6_bits, MasterKey};
use crate::keyword::{encrypt_rules, EncKeywordRules, KeywordKey, KeywordRule};
use crate::prefixmatch::{Domain, EncPrefix, PrefixMatch};
use crate::tokenizer::TokenizerConfig;
use crate::EmbarkError;
use serde_yaml::{Mapping, Value};
use std::net::{IpAddr, Ipv6Addr};

/// A provider chain: NFs in order.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// For encrypted files: the id of the key the rules were encrypted with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// For encrypted files: the rule generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    /// The NFs, in chain order.
    pub nfs: Vec<NfSpec>,
}

/// One NF of the provider chain.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfSpec {
    /// Vertex name.
    pub name: String,
    /// NF type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The NF's config block.
    #[serde(default)]
    pub config: Value,
}

fn bad(nf: &str, field: &str, m: impl std::fmt::Display) -> EmbarkError {
    EmbarkError::BadRule(format!("{nf}: {field}: {m}"))
}

/// An inclusive range of values.
type Range = (u128, u128);

/// An address prefix as an inclusive range of 128-bit values (`None`: any).
fn cidr_range(s: &str) -> Result<Option<(u128, u128)>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("any") {
        return Ok(None);
    }
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: IpAddr = a.parse().map_err(|_| format!("`{s}` is not an address or prefix"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len: u32 = match l {
        Some(l) => l.parse().ok().filter(|&l| l <= max).ok_or_else(|| format!("`{s}`: bad prefix length"))?,
        None => max,
    };
    let host = max - len;
    let span = if host >= 128 { u128::MAX } else { (1u128 << host) - 1 };
    let lo = v6_bits(ip) & !span;
    Ok(Some((lo, lo | span)))
}

/// A port spec (`80`, `"1024-65535"`, `"any"`, absent) as a range (`None`: any).
fn port_range(v: Option<&Value>) -> Result<Option<(u128, u128)>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let p = n.as_u64().filter(|&p| p <= 65535).ok_or_else(|| format!("{n} is not a port"))?;
            Ok(Some((u128::from(p), u128::from(p))))
        }
        Some(Value::String(s)) if s.trim().eq_ignore_ascii_case("any") => Ok(None),
        Some(Value::String(s)) => {
            let num = |x: &str| x.trim().parse::<u16>().map_err(|_| format!("`{s}` is not a port or range"));
            let (lo, hi) = match s.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(s)?, num(s)?),
            };
            if lo > hi {
                return Err(format!("`{s}` is inverted"));
            }
            Ok(Some((u128::from(lo), u128::from(hi))))
        }
        Some(_) => Err("a port must be a number or a string".into()),
    }
}

/// A load balancer VIP: `ip`, `ip:port`, `[v6]:port`, `prefix`, `prefix@port`, `prefix@lo-hi`.
fn vip_ranges(s: &str) -> Result<(Option<Range>, Option<Range>), String> {
    if let Some((a, p)) = s.split_once('@') {
        return Ok((cidr_range(a)?, port_range(Some(&Value::String(p.into())))?));
    }
    if let Ok(sa) = s.trim().parse::<std::net::SocketAddr>() {
        let v = v6_bits(sa.ip());
        return Ok((Some((v, v)), Some((u128::from(sa.port()), u128::from(sa.port())))));
    }
    Ok((cidr_range(s)?, None))
}

fn str_list<'a>(cfg: &'a Value, key: &str) -> Vec<&'a str> {
    cfg.get(key).and_then(Value::as_sequence).map_or(Vec::new(), |s| s.iter().filter_map(Value::as_str).collect())
}

/// Everything the interval maps must cut at.
fn collect_ranges(nfs: &[NfSpec]) -> Result<(Vec<Range>, Vec<Range>), EmbarkError> {
    let (mut addrs, mut ports) = (Vec::new(), Vec::new());
    for nf in nfs {
        let c = &nf.config;
        match nf.kind.as_str() {
            "firewall" => {
                for (i, r) in c.get("rules").and_then(Value::as_sequence).into_iter().flatten().enumerate() {
                    for f in ["src", "dst"] {
                        if let Some(s) = r.get(f).and_then(Value::as_str) {
                            addrs.extend(cidr_range(s).map_err(|m| bad(&nf.name, &format!("rules[{i}].{f}"), m))?);
                        }
                    }
                    for f in ["sport", "dport"] {
                        ports.extend(port_range(r.get(f)).map_err(|m| bad(&nf.name, &format!("rules[{i}].{f}"), m))?);
                    }
                }
            }
            "nat" => {
                for s in str_list(c, "internal") {
                    addrs.extend(cidr_range(s).map_err(|m| bad(&nf.name, "internal", m))?);
                }
            }
            "lb" => {
                for s in str_list(c, "vips") {
                    let (a, p) = vip_ranges(s).map_err(|m| bad(&nf.name, "vips", m))?;
                    addrs.extend(a);
                    ports.extend(p);
                }
            }
            "ids" | "passthrough" => {}
            other => {
                return Err(EmbarkError::BadRule(format!(
                "{}: NF type `{other}` cannot run on Embark traffic (supported: firewall, nat, lb, ids, passthrough)",
                nf.name
            )))
            }
        }
    }
    Ok((addrs, ports))
}

fn prefix_str(p: &EncPrefix) -> String {
    format!("{}/{}", Ipv6Addr::from(p.value), p.len)
}

struct Ctx<'a> {
    addr: &'a PrefixMatch,
    port: &'a PrefixMatch,
    key: &'a MasterKey,
    pool: Vec<PoolEntry>,
}

impl Ctx<'_> {
    /// Encrypted prefixes of an address spec (`None`: any).
    fn addr_prefixes(&self, r: Option<(u128, u128)>) -> Result<Option<Vec<String>>, EmbarkError> {
        r.map(|(lo, hi)| Ok(self.addr.encrypt_range(lo, hi)?.iter().map(prefix_str).collect())).transpose()
    }

    fn port_ranges(&self, r: Option<(u128, u128)>) -> Result<Option<Vec<String>>, EmbarkError> {
        r.map(|(lo, hi)| {
            Ok(self
                .port
                .encrypt_range(lo, hi)?
                .iter()
                .map(|p| {
                    let (a, b) = p.range(16);
                    format!("{a}-{b}")
                })
                .collect())
        })
        .transpose()
    }

    /// The fixed encryption of a pool address.
    fn pool_value(&mut self, ip: IpAddr) -> Result<Ipv6Addr, EmbarkError> {
        if let Some(p) = self.pool.iter().find(|p| p.plain == ip) {
            return Ok(p.enc);
        }
        let mut purpose = b"pool/".to_vec();
        purpose.extend_from_slice(&v6_bits(ip).to_be_bytes());
        let d = self.key.derive(&purpose);
        let suffix = u128::from_be_bytes(d[..16].try_into().unwrap_or([0; 16]));
        let enc = Ipv6Addr::from(self.addr.encrypt_with_suffix(v6_bits(ip), suffix)?);
        self.pool.push(PoolEntry { plain: ip, enc });
        Ok(enc)
    }
}

fn seq(v: Vec<String>) -> Value {
    Value::Sequence(v.into_iter().map(Value::String).collect())
}

fn encrypt_firewall(nf: &NfSpec, cx: &Ctx<'_>) -> Result<Value, EmbarkError> {
    let mut out = nf.config.clone();
    let Some(rules) = nf.config.get("rules").and_then(Value::as_sequence) else { return Ok(out) };
    let mut enc_rules = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let f = |x: &str| format!("rules[{i}].{x}");
        let addr = |x: &str| -> Result<Option<Vec<String>>, EmbarkError> {
            let s =
                r.get(x).and_then(Value::as_str).map(cidr_range).transpose().map_err(|m| bad(&nf.name, &f(x), m))?;
            cx.addr_prefixes(s.flatten())
        };
        let port = |x: &str| -> Result<Option<Vec<String>>, EmbarkError> {
            cx.port_ranges(port_range(r.get(x)).map_err(|m| bad(&nf.name, &f(x), m))?)
        };
        let (src, dst, sport, dport) = (addr("src")?, addr("dst")?, port("sport")?, port("dport")?);
        // One rule per combination; an empty set (a range no encryption can fall in) cannot
        // occur: every range covers at least one interval.
        let opts = |o: Option<Vec<String>>| o.map_or(vec![None], |v| v.into_iter().map(Some).collect());
        for s in opts(src) {
            for d in opts(dst.clone()) {
                for sp in opts(sport.clone()) {
                    for dp in opts(dport.clone()) {
                        let mut m = r.as_mapping().cloned().unwrap_or_default();
                        for (k, v) in [("src", &s), ("dst", &d), ("sport", &sp), ("dport", &dp)] {
                            match v {
                                Some(v) => m.insert(k.into(), Value::String(v.clone())),
                                None => m.remove(k),
                            };
                        }
                        enc_rules.push(Value::Mapping(m));
                    }
                }
            }
        }
    }
    if let Some(m) = out.as_mapping_mut() {
        m.insert("rules".into(), Value::Sequence(enc_rules));
    }
    Ok(out)
}

fn encrypt_nat(nf: &NfSpec, cx: &mut Ctx<'_>) -> Result<Value, EmbarkError> {
    let mut m = nf.config.as_mapping().cloned().unwrap_or_default();
    let ext = m.get("external_ip").and_then(Value::as_str).unwrap_or("198.51.100.1");
    let ext: IpAddr = ext.trim().parse().map_err(|_| bad(&nf.name, "external_ip", "not an address"))?;
    let internal = str_list(&nf.config, "internal");
    let internal: Vec<&str> =
        if internal.is_empty() { vec!["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"] } else { internal };
    let mut enc = Vec::new();
    for s in internal {
        let r = cidr_range(s).map_err(|e| bad(&nf.name, "internal", e))?;
        enc.extend(cx.addr_prefixes(r)?.unwrap_or_else(|| vec!["::/0".into()]));
    }
    let pool = cx.pool_value(ext)?;
    m.insert("external_ip".into(), Value::String(pool.to_string()));
    m.insert("internal".into(), seq(enc));
    Ok(Value::Mapping(m))
}

fn encrypt_lb(nf: &NfSpec, cx: &mut Ctx<'_>) -> Result<Value, EmbarkError> {
    let mut m = nf.config.as_mapping().cloned().unwrap_or_default();
    let mut vips = Vec::new();
    for s in str_list(&nf.config, "vips") {
        let (a, p) = vip_ranges(s).map_err(|e| bad(&nf.name, "vips", e))?;
        let addrs = cx.addr_prefixes(a)?.unwrap_or_else(|| vec!["::/0".into()]);
        for a in addrs {
            match cx.port_ranges(p)? {
                Some(ps) => vips.extend(ps.into_iter().map(|p| format!("{a}@{p}"))),
                None => vips.push(a),
            }
        }
    }
    let plain_backends = str_list(&nf.config, "backends");
    let plain_backends: Vec<&str> =
        if plain_backends.is_empty() { vec!["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"] } else { plain_backends };
    let mut backends = Vec::new();
    for b in plain_backends {
        let (ip, port) = match b.trim().parse::<std::net::SocketAddr>() {
            Ok(sa) => (sa.ip(), Some(sa.port())),
            Err(_) => (b.trim().parse::<IpAddr>().map_err(|_| bad(&nf.name, "backends", format!("`{b}`")))?, None),
        };
        let enc = cx.pool_value(ip)?;
        backends.push(match port {
            Some(p) => format!("[{enc}]:{p}"),
            None => enc.to_string(),
        });
    }
    m.insert("vips".into(), seq(vips));
    m.insert("backends".into(), seq(backends));
    Ok(Value::Mapping(m))
}

fn encrypt_ids(nf: &NfSpec, kw: &KeywordKey) -> Result<(Value, TokenizerConfig), EmbarkError> {
    let c = &nf.config;
    let rules = c
        .get("rules")
        .and_then(Value::as_sequence)
        .ok_or_else(|| bad(&nf.name, "rules", "Embark needs explicit IDS rules"))?;
    let mut plain = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        let id = r.get("id").and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok());
        let pattern = r.get("pattern").and_then(Value::as_str);
        let (Some(id), Some(pattern)) = (id, pattern) else {
            return Err(bad(&nf.name, &format!("rules[{i}]"), "needs `id` and `pattern`"));
        };
        plain.push(KeywordRule {
            id,
            pattern: pattern.as_bytes(),
            nocase: r.get("nocase").and_then(Value::as_bool).unwrap_or(false),
            boundary: r.get("boundary").and_then(Value::as_bool).unwrap_or(false),
            drop: r.get("action").and_then(Value::as_str) == Some("drop"),
        });
    }
    let enc: EncKeywordRules = encrypt_rules(kw, &plain)?;
    let num = |k: &str, d: u64| c.get(k).and_then(Value::as_u64).unwrap_or(d);
    let tok = TokenizerConfig {
        classes: enc.classes.clone(),
        max_buffer_bytes: num("max_buffer_bytes", 65_536) as u32,
        idle_timeout_ms: num("idle_timeout_ms", 120_000),
        close_timeout_ms: num("close_timeout_ms", 2_000),
    };
    let mut m = Mapping::new();
    m.insert("encrypted".into(), serde_yaml::to_value(&enc).map_err(|e| EmbarkError::BadRule(e.to_string()))?);
    for k in ["max_buffer_bytes", "idle_timeout_ms", "close_timeout_ms"] {
        if let Some(v) = c.get(k) {
            m.insert(k.into(), v.clone());
        }
    }
    Ok((Value::Mapping(m), tok))
}

/// Encrypts a plaintext provider chain under `key` as rule generation `generation`: returns
/// the provider's encrypted chain and the gateway's state.
pub fn encrypt_provider<R: rand::Rng>(
    key: &MasterKey,
    plain: &ProviderConfig,
    generation: u32,
    rng: &mut R,
) -> Result<(ProviderConfig, GatewayState), EmbarkError> {
    if plain.key_id.is_some() {
        return Err(EmbarkError::BadRule("this chain is already encrypted".into()));
    }
    let (addrs, ports) = collect_ranges(&plain.nfs)?;
    let addr = PrefixMatch::build(Domain::Addr, &addrs, rng)?;
    let port = PrefixMatch::build(Domain::Port, &ports, rng)?;
    let kw = KeywordKey::new(key);
    let mut cx = Ctx { addr: &addr, port: &port, key, pool: Vec::new() };
    let mut nfs = Vec::new();
    let mut tokenizer = None;
    for nf in &plain.nfs {
        let config = match nf.kind.as_str() {
            "firewall" => encrypt_firewall(nf, &cx)?,
            "nat" => encrypt_nat(nf, &mut cx)?,
            "lb" => encrypt_lb(nf, &mut cx)?,
            "ids" => {
                if tokenizer.is_some() {
                    return Err(bad(&nf.name, "type", "one IDS per provider chain"));
                }
                let (v, t) = encrypt_ids(nf, &kw)?;
                tokenizer = Some(t);
                v
            }
            _ => nf.config.clone(),
        };
        nfs.push(NfSpec { name: nf.name.clone(), kind: nf.kind.clone(), config });
    }
    let pool = cx.pool;
    let enc = ProviderConfig { key_id: Some(key.id()), generation: Some(generation), nfs };
    let state = GatewayState { key_id: key.id(), generation, addr, port, pool, tokenizer };
    Ok((enc, state))
}
