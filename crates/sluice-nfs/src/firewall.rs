//! Stateful firewall: ACL rules checked when a connection opens, and per-connection tracking.
//!
//! # Semantics
//!
//! * A packet that **opens** a connection is checked against the ACL (first matching rule
//!   wins, else `default`). Opening packets are a TCP SYN without ACK, and the first packet, in
//!   either direction, of any other protocol's flow (UDP, ICMP and other IP protocols form
//!   pseudo-connections keyed by the flow key; ICMP echo uses its identifier as both ports,
//!   other ICMP messages have ports 0). Allowed: connection state is created and the packet
//!   passes. Denied: dropped with `fw-acl-deny`, no state is kept, and an `acl-deny` event is
//!   emitted for this connection attempt (a retransmitted SYN is another attempt).
//! * A packet of a **known** connection passes (both directions) and refreshes its timer; TCP
//!   advances the connection's state machine.
//! * A TCP packet that is not a SYN and belongs to **no known connection** is dropped with
//!   `fw-no-connection`: the firewall does not pick up connections mid-stream (a capture that
//!   starts mid-connection loses that connection) and a SYN-ACK or RST without a SYN is not let
//!   in.
//! * IP fragments carry no ports to match or track and are dropped with `fw-fragment` (the
//!   firewall does not reassemble). IPv6 is handled like IPv4 (rules may use IPv6 prefixes).
//!
//! The TCP state machine is compact and direction-aware (the initiator is the sender of the
//! SYN): `SYN_SENT` → (SYN-ACK from the responder) `SYN_RECEIVED` → (ACK from the initiator)
//! `ESTABLISHED` → (a FIN) `CLOSING` → (FINs from both sides, or a RST at any point) `CLOSED`.
//! A `CLOSED` connection lingers for `timeouts.tcp_linger` so its last ACKs pass; a new SYN on
//! it starts a new connection (ACL checked again). With `strict_tcp` (the default) a packet that
//! does not fit the state is dropped with `fw-invalid-tcp`: during the handshake, anything but
//! SYN retransmissions, the responder's SYN-ACK, the initiator's ACK and RST; after it, a SYN
//! other than a retransmitted SYN-ACK. Sequence numbers are not checked. With `strict_tcp:
//! false` every packet of a known connection passes.
//!
//! # Timeouts (seconds, packet time)
//!
//! Each connection has one timer, re-armed by every packet, with the timeout of its state:
//! `tcp_handshake` (60), `tcp_established` (7440, as RFC 5382's NAT minimum), `tcp_closing`
//! (120), `tcp_linger` (10, after both FINs or a RST), `udp` (60), `icmp` (30), `other` (60).
//! When it fires the connection's state is removed.
//!
//! # State objects
//!
//! | id | name | scope | pattern | why |
//! |---|---|---|---|---|
//! | [`CONNS`] | `connections` | per-flow | read/write often | direction-free flow key → packed state, initiator side and FIN bits (StatelessNF's connection table); read on every packet, written on state changes |
//!
//! # Drop reasons and events
//!
//! Drops: `fw-acl-deny`, `fw-no-connection`, `fw-invalid-tcp`, `fw-fragment`, `fw-state-error`.
//! Events: `acl-deny` (subject: the packet's 5-tuple; detail: `rule <index>` or `default`), one
//! per denied connection attempt.
//!
//! # Configuration
//!
//! A chain file (see `docs/chains.md`) with one `firewall` vertex:
//!
//! ```yaml
//! name: firewall-example
//! vertices:
//!   fw:
//!     type: firewall
//!     config:
//!       default: allow            # allow | deny, when no rule matches
//!       strict_tcp: true
//!       rules:                    # first match wins; omitted fields match anything
//!         - {action: deny, proto: tcp, dport: 22}
//!         - {action: allow, src: 10.0.0.0/8, dst: any, sport: "1024-65535", dport: "80-443", proto: tcp}
//!         - {action: deny, src: "2001:db8::/32", proto: any}
//!       timeouts: {tcp_established: 3600, udp: 30}
//! edges:
//!   - { from: input, to: fw }
//!   - { from: fw, to: output }
//! ```
//! `proto` is `tcp`, `udp`, `icmp`, `icmpv6`, `any` or a protocol number; ports are a number, a
//! `"first-last"` range or `any`, and a rule with a port constraint only matches TCP and UDP.
//! `default` is `allow` so that `type: firewall` alone tracks connections without filtering.

use crate::util::{parse_config, Cidr, NS_PER_S};
use serde::Deserialize;
use sluice_nf::{
    AccessPattern, BuildCtx, InputOrder, NetworkFunction, NfContext, NfError, ObjectId, Scope, StateDecl, StateError,
    StateKey, TimerFired, Value, Verdict,
};
use sluice_packet::{FiveTuple, FlowKey, Packet, Proto, L4};

/// State object: connection (direction-free flow key) → packed tracking state.
pub const CONNS: ObjectId = ObjectId(0);

// Connection states (low 4 bits of an entry).
const SYN_SENT: i64 = 1;
const SYN_RECEIVED: i64 = 2;
const ESTABLISHED: i64 = 3;
const CLOSING: i64 = 4;
const CLOSED: i64 = 5;
const PSEUDO: i64 = 6;
const STATE_MASK: i64 = 0xf;
// Flags above the state.
const INIT_IS_A: i64 = 0x10;
const FIN_INIT: i64 = 0x20;
const FIN_RESP: i64 = 0x40;

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Let the connection open.
    #[default]
    Allow,
    /// Drop the opening packet.
    Deny,
}

/// A port constraint as written: a number or a `"first-last"` / `"any"` string.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PortSpec {
    /// One port.
    Num(u64),
    /// A range `first-last`, a single port, or `any`.
    Text(String),
}

/// One ACL rule as written in the config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// `allow` or `deny`.
    pub action: Action,
    /// Source prefix (default any).
    #[serde(default)]
    pub src: Option<String>,
    /// Destination prefix (default any).
    #[serde(default)]
    pub dst: Option<String>,
    /// Source port or range (default any).
    #[serde(default)]
    pub sport: Option<PortSpec>,
    /// Destination port or range (default any).
    #[serde(default)]
    pub dport: Option<PortSpec>,
    /// Protocol (default any).
    #[serde(default)]
    pub proto: Option<String>,
}

/// Timeouts in seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// TCP connection during the handshake.
    pub tcp_handshake: u64,
    /// Established TCP connection.
    pub tcp_established: u64,
    /// TCP connection after one FIN.
    pub tcp_closing: u64,
    /// TCP connection after both FINs or a RST, kept for the last packets.
    pub tcp_linger: u64,
    /// UDP pseudo-connection.
    pub udp: u64,
    /// ICMP pseudo-connection.
    pub icmp: u64,
    /// Pseudo-connection of another protocol.
    pub other: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            tcp_handshake: 60,
            tcp_established: 7440,
            tcp_closing: 120,
            tcp_linger: 10,
            udp: 60,
            icmp: 30,
            other: 60,
        }
    }
}

/// The firewall's configuration block.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FirewallConfig {
    /// ACL, first match wins.
    pub rules: Vec<RuleConfig>,
    /// Action when no rule matches.
    pub default: Action,
    /// Drop TCP packets that do not fit the connection's state.
    pub strict_tcp: bool,
    /// Idle timeouts.
    pub timeouts: Timeouts,
}

impl Default for FirewallConfig {
    fn default() -> Self {
        FirewallConfig { rules: Vec::new(), default: Action::Allow, strict_tcp: true, timeouts: Timeouts::default() }
    }
}

/// A validated rule.
#[derive(Debug, Clone)]
struct Rule {
    action: Action,
    src: Cidr,
    dst: Cidr,
    sport: Option<(u16, u16)>,
    dport: Option<(u16, u16)>,
    proto: Option<Proto>,
}

impl Rule {
    fn matches(&self, t: &FiveTuple) -> bool {
        if self.proto.is_some_and(|p| p != t.proto) || !self.src.contains(t.src) || !self.dst.contains(t.dst) {
            return false;
        }
        let has_ports = t.proto == Proto::TCP || t.proto == Proto::UDP;
        let port_ok = |r: Option<(u16, u16)>, p: u16| match r {
            None => true,
            Some((lo, hi)) => has_ports && lo <= p && p <= hi,
        };
        port_ok(self.sport, t.sport) && port_ok(self.dport, t.dport)
    }
}

/// The firewall. Holds only its validated configuration.
pub struct FirewallNf {
    rules: Vec<Rule>,
    default: Action,
    strict: bool,
    /// handshake, established, closing, linger, udp, icmp, other.
    timeouts_ns: [u64; 7],
    decls: Vec<StateDecl>,
}

/// Builds an instance from its config.
pub fn build(config: &serde_yaml::Value, _ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    let cfg: FirewallConfig = parse_config(config)?;
    Ok(Box::new(FirewallNf::new(&cfg)?))
}

fn parse_ports(field: &str, spec: &Option<PortSpec>) -> Result<Option<(u16, u16)>, NfError> {
    let bad = |m: String| NfError::config(field, m);
    let num = |s: &str| -> Result<u16, NfError> {
        s.trim().parse::<u16>().map_err(|_| bad(format!("`{s}` is not a port number (0-65535)")))
    };
    match spec {
        None => Ok(None),
        Some(PortSpec::Num(n)) => {
            let p = u16::try_from(*n).map_err(|_| bad(format!("{n} is not a port number (0-65535)")))?;
            Ok(Some((p, p)))
        }
        Some(PortSpec::Text(s)) if s.trim().eq_ignore_ascii_case("any") => Ok(None),
        Some(PortSpec::Text(s)) => {
            let (lo, hi) = match s.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(s)?, num(s)?),
            };
            if lo > hi {
                return Err(bad(format!("range `{s}` is inverted")));
            }
            Ok(Some((lo, hi)))
        }
    }
}

fn parse_cidr_opt(field: &str, s: &Option<String>) -> Result<Cidr, NfError> {
    match s {
        None => Ok(Cidr::Any),
        Some(s) => Cidr::parse(s).map_err(|m| NfError::config(field, m)),
    }
}

impl FirewallNf {
    /// Validates `cfg` and builds the NF.
    pub fn new(cfg: &FirewallConfig) -> Result<FirewallNf, NfError> {
        let mut rules = Vec::with_capacity(cfg.rules.len());
        for (i, r) in cfg.rules.iter().enumerate() {
            let f = |name: &str| format!("rules[{i}].{name}");
            let proto = match r.proto.as_deref().map(str::trim) {
                None => None,
                Some(p) if p.eq_ignore_ascii_case("any") => None,
                Some(p) => Some(Proto::parse(p).ok_or_else(|| {
                    NfError::config(f("proto"), format!("`{p}` is not tcp, udp, icmp, icmpv6, any or a number"))
                })?),
            };
            let rule = Rule {
                action: r.action,
                src: parse_cidr_opt(&f("src"), &r.src)?,
                dst: parse_cidr_opt(&f("dst"), &r.dst)?,
                sport: parse_ports(&f("sport"), &r.sport)?,
                dport: parse_ports(&f("dport"), &r.dport)?,
                proto,
            };
            if (rule.sport.is_some() || rule.dport.is_some())
                && proto.is_some_and(|p| p != Proto::TCP && p != Proto::UDP)
            {
                return Err(NfError::config(f("proto"), "port constraints need proto tcp, udp or any"));
            }
            rules.push(rule);
        }
        let t = &cfg.timeouts;
        let list = [
            ("timeouts.tcp_handshake", t.tcp_handshake),
            ("timeouts.tcp_established", t.tcp_established),
            ("timeouts.tcp_closing", t.tcp_closing),
            ("timeouts.tcp_linger", t.tcp_linger),
            ("timeouts.udp", t.udp),
            ("timeouts.icmp", t.icmp),
            ("timeouts.other", t.other),
        ];
        let mut timeouts_ns = [0u64; 7];
        for (slot, (name, v)) in timeouts_ns.iter_mut().zip(list) {
            if v == 0 || v > 365 * 86_400 {
                return Err(NfError::config(name, "a timeout must be between 1 second and one year"));
            }
            *slot = v * NS_PER_S;
        }
        Ok(FirewallNf {
            rules,
            default: cfg.default,
            strict: cfg.strict_tcp,
            timeouts_ns,
            decls: vec![StateDecl::new("connections", Scope::per_flow(), AccessPattern::ReadWriteOften)
                .idle_timers(timeouts_ns.iter().copied().min().unwrap_or(NS_PER_S))],
        })
    }

    /// The ACL's decision for an opening packet: the action and the matching rule's index.
    fn acl(&self, t: &FiveTuple) -> (Action, Option<usize>) {
        match self.rules.iter().position(|r| r.matches(t)) {
            Some(i) => (self.rules[i].action, Some(i)),
            None => (self.default, None),
        }
    }

    fn timeout_ns(&self, proto: Proto, entry: i64) -> u64 {
        let i = match (proto, entry & STATE_MASK) {
            (Proto::TCP, SYN_SENT | SYN_RECEIVED) => 0,
            (Proto::TCP, ESTABLISHED) => 1,
            (Proto::TCP, CLOSING) => 2,
            (Proto::TCP, _) => 3,
            (Proto::UDP, _) => 4,
            (Proto::ICMP | Proto::ICMPV6, _) => 5,
            _ => 6,
        };
        self.timeouts_ns[i]
    }

    /// Checks the ACL for an opening packet; on allow stores `entry` for the connection.
    fn open(&self, key: &StateKey, t: &FiveTuple, entry: i64, ctx: &mut NfContext<'_>) -> Result<Verdict, StateError> {
        match self.acl(t) {
            (Action::Allow, _) => {
                ctx.state.set(CONNS, key, Value::Int(entry))?;
                ctx.state.set_timer(CONNS, key, ctx.now_ns.saturating_add(self.timeout_ns(t.proto, entry)));
                Ok(Verdict::Forward)
            }
            (Action::Deny, rule) => {
                let detail = rule.map_or_else(|| "default".to_string(), |i| format!("rule {i}"));
                ctx.emit("acl-deny", t, detail);
                Ok(Verdict::Drop("fw-acl-deny"))
            }
        }
    }

    /// The next entry of a TCP connection after a packet, or `None` if the packet does not fit
    /// (strict mode).
    fn tcp_next(&self, entry: i64, from_init: bool, pkt: &Packet) -> Option<i64> {
        let f = pkt.hdr().tcp_flags;
        let state = entry & STATE_MASK;
        let flags = entry & !STATE_MASK;
        let with = |s: i64| Some(flags | s);
        if f.rst() {
            return with(CLOSED);
        }
        let syn_only = f.syn() && !f.ack();
        let syn_ack = f.syn() && f.ack();
        let lenient = |e: i64| if self.strict { None } else { Some(e) };
        match state {
            SYN_SENT => match (from_init, syn_only, syn_ack) {
                (true, true, _) => Some(entry),
                (false, _, true) => with(SYN_RECEIVED),
                _ => lenient(entry),
            },
            SYN_RECEIVED => {
                if (from_init && syn_only) || (!from_init && syn_ack) {
                    Some(entry)
                } else if from_init && f.ack() && !f.syn() {
                    Some(Self::fin(flags | ESTABLISHED, from_init, f.fin()))
                } else {
                    lenient(entry)
                }
            }
            ESTABLISHED | CLOSING => {
                // Only a retransmitted SYN-ACK from the responder may carry SYN now.
                let retransmitted_syn_ack = syn_ack && !from_init;
                if f.syn() && !retransmitted_syn_ack {
                    return lenient(entry);
                }
                Some(Self::fin(entry, from_init, f.fin()))
            }
            // CLOSED (lingering) or anything unexpected: let the last packets through.
            _ => Some(entry),
        }
    }

    /// Records a FIN from one side; both FINs close the connection.
    fn fin(entry: i64, from_init: bool, fin: bool) -> i64 {
        if !fin {
            return entry;
        }
        let flags = (entry & !STATE_MASK) | if from_init { FIN_INIT } else { FIN_RESP };
        if flags & (FIN_INIT | FIN_RESP) == FIN_INIT | FIN_RESP {
            flags | CLOSED
        } else {
            flags | CLOSING
        }
    }

    fn handle(&self, pkt: &Packet, t: FiveTuple, fk: FlowKey, ctx: &mut NfContext<'_>) -> Result<Verdict, StateError> {
        if pkt.hdr().fragmented || pkt.hdr().l4 == L4::None {
            return Ok(Verdict::Drop("fw-fragment"));
        }
        let key = StateKey::Flow(fk);
        let src_is_a = fk.source_is_a(&t);
        let existing = ctx.state.get(CONNS, &key)?.and_then(|v| v.as_int());
        if t.proto != Proto::TCP {
            return match existing {
                Some(e) => {
                    ctx.state.set_timer(CONNS, &key, ctx.now_ns.saturating_add(self.timeout_ns(t.proto, e)));
                    Ok(Verdict::Forward)
                }
                None => self.open(&key, &t, PSEUDO | if src_is_a { INIT_IS_A } else { 0 }, ctx),
            };
        }
        let f = pkt.hdr().tcp_flags;
        let opening = f.syn() && !f.ack() && !f.rst();
        let syn_entry = SYN_SENT | if src_is_a { INIT_IS_A } else { 0 };
        let Some(entry) = existing else {
            return if opening { self.open(&key, &t, syn_entry, ctx) } else { Ok(Verdict::Drop("fw-no-connection")) };
        };
        if opening && entry & STATE_MASK == CLOSED {
            // A new connection on the ports of a lingering closed one.
            return self.open(&key, &t, syn_entry, ctx);
        }
        let from_init = src_is_a == (entry & INIT_IS_A != 0);
        let Some(next) = self.tcp_next(entry, from_init, pkt) else {
            return Ok(Verdict::Drop("fw-invalid-tcp"));
        };
        if next != entry {
            ctx.state.set(CONNS, &key, Value::Int(next))?;
        }
        ctx.state.set_timer(CONNS, &key, ctx.now_ns.saturating_add(self.timeout_ns(t.proto, next)));
        Ok(Verdict::Forward)
    }
}

impl NetworkFunction for FirewallNf {
    /// Both directions of a connection in entry order: the TCP state machine follows both sides of
    /// a connection.
    fn input_order(&self) -> InputOrder {
        InputOrder::Connection
    }

    fn kind(&self) -> &'static str {
        "firewall"
    }

    fn state_objects(&self) -> &[StateDecl] {
        &self.decls
    }

    fn process(&self, pkt: &mut Packet, ctx: &mut NfContext<'_>) -> Verdict {
        let (Some(t), Some(fk)) = (pkt.tuple(), pkt.flow_key()) else { return Verdict::Forward };
        self.handle(pkt, t, fk, ctx).unwrap_or_else(|e| Verdict::state_error(pkt, "fw-state-error", &e))
    }

    fn on_timer(&self, fired: TimerFired, ctx: &mut NfContext<'_>) {
        if fired.object == CONNS {
            // The timer is re-armed by every packet, so firing means idle (or done lingering).
            let _ = ctx.state.delete(CONNS, &fired.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> Result<FirewallNf, NfError> {
        let v: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        let c: FirewallConfig = parse_config(&v)?;
        FirewallNf::new(&c)
    }

    #[test]
    fn rules_parse_and_match() {
        let fw = cfg("rules: [{action: deny, proto: tcp, dport: 22}, {action: allow, src: 10.0.0.0/8, sport: '1024-65535'}]\ndefault: deny").unwrap();
        let t = |s: &str, sp, d: &str, dp, p| FiveTuple {
            src: s.parse().unwrap(),
            dst: d.parse().unwrap(),
            sport: sp,
            dport: dp,
            proto: p,
        };
        assert_eq!(fw.acl(&t("10.0.0.1", 4000, "1.1.1.1", 22, Proto::TCP)), (Action::Deny, Some(0)));
        assert_eq!(fw.acl(&t("10.0.0.1", 4000, "1.1.1.1", 80, Proto::TCP)), (Action::Allow, Some(1)));
        assert_eq!(fw.acl(&t("10.0.0.1", 80, "1.1.1.1", 80, Proto::TCP)), (Action::Deny, None));
        assert_eq!(fw.acl(&t("10.0.0.1", 7, "1.1.1.1", 7, Proto::ICMP)), (Action::Deny, None));
        assert!(cfg("rules: [{action: deny, dport: '90-80'}]").is_err());
        assert!(cfg("rules: [{action: deny, dport: 70000}]").is_err());
        assert!(cfg("rules: [{action: deny, src: 10.0.0.0/40}]").is_err());
        assert!(cfg("rules: [{action: maybe}]").is_err());
        assert!(cfg("rules: [{action: deny, port: 1}]").is_err());
        assert!(cfg("rules: [{action: deny, proto: icmp, dport: 1}]").is_err());
        assert!(cfg("timeouts: {udp: 0}").is_err());
        assert!(cfg("rules: [{action: allow, proto: any, sport: any, dst: '::/0'}]").is_ok());
    }
}
