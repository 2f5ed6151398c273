//! Source NAT (NAPT) with a dynamic port pool and endpoint-independent mapping (RFC 4787).
//!
//! # Semantics
//!
//! Each packet falls in one of three cases, checked in this order:
//!
//! * **Inbound**: the destination is `external_ip`. The reverse mapping `(protocol, destination
//!   port)` gives the internal endpoint and the destination is rewritten to it. With no mapping
//!   the packet is dropped (`nat-no-mapping`). Filtering is endpoint-independent: any external
//!   host may reach a mapped port while the mapping lives (RFC 4787 REQ-8 allows this).
//! * **Outbound**: the source is in one of the `internal` prefixes and the destination is not.
//!   The source is rewritten to `external_ip:port`. The port comes from the mapping of the
//!   internal endpoint `(ip, port, protocol)`, so an internal endpoint keeps one external port for
//!   every destination (endpoint-independent mapping, RFC 4787 REQ-1). The first packet of a
//!   connection whose internal endpoint has no mapping takes a port from the pool.
//!   TCP allocates on any packet, not only on a SYN: captures often start mid-connection, and
//!   RFC 5382 allows it. A connection picked up without its SYN is treated as established.
//! * **Anything else** is forwarded untouched and not translated: internal↔internal traffic,
//!   and external↔external traffic. A capture recorded on the inside of a NAT shows replies
//!   addressed to the internal host (not to `external_ip`); those are such packets, so a trace
//!   recorded on one side of the NAT only exercises the outbound path. Tests synthesise the
//!   inbound side by addressing replies to the external endpoint.
//!
//! Checksums are kept valid by incremental update ([`Packet::rewrite_src`]).
//!
//! Protocols: TCP and UDP translate the port, ICMP echo request/reply translates the echo
//! identifier (it plays the role of the port). Other ICMP messages (errors would need their
//! embedded header translated), other IP protocols and IP fragments (no ports to translate; the
//! NAT does not reassemble) are dropped on the outbound path with `nat-unsupported` and find no
//! mapping on the inbound path (`nat-no-mapping`); ICMPv6 (echo included) is never
//! translated and counts among these.
//!
//! IP families: the NAT translates within the family of `external_ip`. With an IPv6
//! `external_ip` and IPv6 `internal` prefixes, IPv6 TCP, UDP and their inbound replies are
//! translated exactly like IPv4. A packet whose addresses fall in no `internal` prefix and are
//! not `external_ip` is "anything else", so with the default IPv4 prefixes IPv6 passes
//! untouched. An outbound packet whose family differs from `external_ip`'s (an IPv6 prefix
//! listed as internal with an IPv4 `external_ip`, or the reverse) is dropped with
//! `nat-family-mismatch` if it is TCP, UDP or ICMP echo; the unsupported kinds above are
//! checked first, so outbound ICMPv6 (and IPv6 fragments) get `nat-unsupported` instead.
//!
//! # Expiry
//!
//! Every connection has one timer, re-armed by each packet of the connection in either
//! direction (packet time): `tcp_established` for a TCP connection that saw SYNs both ways (or
//! was picked up mid-stream) and no FIN or RST, `tcp_transitory` for TCP opening or closing
//! (any FIN or RST seen), `udp` for UDP and `icmp` for ICMP echo. Defaults follow RFC 5382
//! (2 h 4 min established, 4 min transitory), RFC 4787 (UDP at least 2 min, recommended 5 min)
//! and RFC 5508 (ICMP query 60 s). A packet that would push the timer back by less than a
//! sixteenth of the shortest of the four timeouts (at most a second) leaves it where it is
//! ([`StateDecl::idle_timers`]). When a connection expires, its internal endpoint's
//! reference count drops; the last connection of an endpoint releases the mapping, removes the
//! reverse mapping and pushes the port back to the pool.
//!
//! # State objects
//!
//! | id | name | scope | pattern | why |
//! |---|---|---|---|---|
//! | [`POOL`] | `port_pool` | global | read/write often | free ports at key `Unit` (never-used ports as a range, given-back ones as a queue: a few integers until ports come back), taken per new mapping and given back on release by custom operations, plus a "pool exhausted" episode marker; shared by all instances once externalised |
//! | [`MAPPING`] | `endpoint_mapping` | src ip, src port, proto | read-heavy | endpoint-independent mapping: internal endpoint → external port and the number of live connections using it; touched when a connection starts or ends |
//! | [`CONN`] | `conn_mapping` | per-flow | read-heavy | connection → external port and TCP progress bits: the one read on the outbound hot path; written only when the TCP bits change |
//! | [`REVERSE`] | `reverse_mapping` | dst port, proto | read-heavy | external port → internal endpoint, the one read on the inbound hot path |
//! | [`TOTAL_PACKETS`] | `total_packets` | global | write-mostly | every packet the NAT sees (`incr_nb`) |
//! | [`TCP_PACKETS`] | `total_tcp_packets` | global | write-mostly | every TCP packet the NAT sees (`incr_nb`) |
//!
//! The pool is taken from and given back to by custom operations that run where the state
//! lives ([`NatNf::custom_ops`]): the first take creates it from the taker's slice, so no
//! instance fills it or waits for another to. It is a few integers (the range of ports never
//! handed out, then the queue of those given back), not a list of every free port: a
//! replacement taking over, a checkpoint or a store scan copies it whole, and a list of 62,000
//! values cost a failover over a millisecond (docs/decisions.md).
//! Mapping reference counts are changed by custom operations ([`NatNf::custom_ops`]) that run
//! where the state lives, so concurrent instances never lose an update.
//!
//! # Several instances
//!
//! With local state every instance has its own pool, so instance `i` of `n` owns the `i`-th of
//! `n` equal, disjoint slices of `port_range`; two instances never hand out the same port. Once
//! the state is externalised to a store, all instances share one pool holding the whole range
//! (the builder is told so by `BuildCtx::shared_state`).
//!
//! # Drop reasons and events
//!
//! Drops: `nat-no-mapping`, `nat-pool-exhausted`, `nat-unsupported`, `nat-family-mismatch`,
//! `nat-truncated` (a header to rewrite lies beyond the captured bytes), `nat-state-error`.
//! Events: `port-pool-exhausted` (subject: the external IP; once per exhaustion episode, i.e.
//! again only after a port was returned to the pool).
//!
//! # Configuration
//!
//! A chain file (see `docs/chains.md`) with one `nat` vertex:
//!
//! ```yaml
//! name: nat-example
//! vertices:
//!   nat:
//!     type: nat
//!     config:
//!       external_ip: 198.51.100.1          # the NAT's public address
//!       internal: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16]
//!       port_range: [1024, 65535]          # inclusive; split among instances
//!       timeouts:                          # seconds
//!         tcp_established: 7440
//!         tcp_transitory: 240
//!         udp: 300
//!         icmp: 60
//! edges:
//!   - { from: input, to: nat }
//!   - { from: nat, to: output }
//! ```
//! Every field of `config` is optional; `type: nat` alone uses the values above.

use crate::util::{parse_cidrs, parse_config, Cidr, NS_PER_S};
use serde::Deserialize;
use sluice_nf::{
    AccessPattern, BuildCtx, CustomOp, InputOrder, NetworkFunction, NfContext, NfError, ObjectId, Scope, StateDecl,
    StateError, StateKey, StateOp, TimerFired, Value, Verdict,
};
use sluice_packet::{FiveTuple, HeaderField, Packet, Proto, RewriteError, L4};
use std::net::IpAddr;

/// State object: the free-port pool (at [`StateKey::Unit`], see [`pool_take`]) and its
/// "exhaustion reported" marker.
pub const POOL: ObjectId = ObjectId(0);
/// State object: internal endpoint → packed external port and connection count.
pub const MAPPING: ObjectId = ObjectId(1);
/// State object: connection (direction-free flow key) → packed external port and TCP bits.
pub const CONN: ObjectId = ObjectId(2);
/// State object: `Endpoint(external_ip, port, proto)` → internal `Endpoint`.
pub const REVERSE: ObjectId = ObjectId(3);
/// State object: packet counter at [`StateKey::Unit`].
pub const TOTAL_PACKETS: ObjectId = ObjectId(4);
/// State object: TCP packet counter at [`StateKey::Unit`].
pub const TCP_PACKETS: ObjectId = ObjectId(5);

/// Key of the pool's "exhaustion reported" marker in [`POOL`].
pub const POOL_EXHAUSTED_KEY: StateKey = StateKey::Id(1);

/// Custom operation indices (see [`NatNf::custom_ops`]).
const OP_ACQUIRE: u16 = 0;
const OP_INSTALL: u16 = 1;
const OP_RELEASE: u16 = 2;
const OP_POOL_TAKE: u16 = 3;
const OP_POOL_GIVE_BACK: u16 = 4;

// TCP progress bits kept in a connection entry, above the 16 port bits.
const OUT_SYN: i64 = 1;
const IN_SYN: i64 = 2;
const FIN_SEEN: i64 = 4;
const RST_SEEN: i64 = 8;

/// The NAT's custom operations, in the order its state operations name them.
pub(crate) const CUSTOM_OPS: [CustomOp; 5] = [
    CustomOp { name: "nat-mapping-acquire", apply: op_acquire },
    CustomOp { name: "nat-mapping-install", apply: op_install },
    CustomOp { name: "nat-mapping-release", apply: op_release },
    CustomOp { name: "nat-pool-take", apply: pool_take },
    CustomOp { name: "nat-pool-give-back", apply: pool_give_back },
];

/// Timeouts in seconds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Idle timeout of an established TCP connection (RFC 5382: at least 2 h 4 min).
    pub tcp_established: u64,
    /// Idle timeout of a TCP connection that is opening or closing (RFC 5382: 4 min).
    pub tcp_transitory: u64,
    /// Idle timeout of a UDP flow (RFC 4787: at least 2 min, 5 min recommended).
    pub udp: u64,
    /// Idle timeout of an ICMP echo flow (RFC 5508: 60 s).
    pub icmp: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { tcp_established: 7440, tcp_transitory: 240, udp: 300, icmp: 60 }
    }
}

/// The NAT's configuration block.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatConfig {
    /// The public address internal hosts are translated to.
    pub external_ip: String,
    /// Prefixes of the internal network.
    pub internal: Vec<String>,
    /// Inclusive range of external ports, `[first, last]`.
    pub port_range: [u32; 2],
    /// Idle timeouts.
    pub timeouts: Timeouts,
}

impl Default for NatConfig {
    fn default() -> Self {
        NatConfig {
            external_ip: "198.51.100.1".into(),
            internal: vec!["10.0.0.0/8".into(), "172.16.0.0/12".into(), "192.168.0.0/16".into()],
            port_range: [1024, 65535],
            timeouts: Timeouts::default(),
        }
    }
}

/// The NAT. Holds only its validated configuration.
pub struct NatNf {
    external_ip: IpAddr,
    internal: Vec<Cidr>,
    /// This instance's slice of the port range, inclusive.
    slice: (u16, u16),
    timeouts_ns: [u64; 4],
    decls: Vec<StateDecl>,
    custom: [CustomOp; 5],
}

/// Builds an instance from its config.
pub fn build(config: &serde_yaml::Value, ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    let cfg: NatConfig = parse_config(config)?;
    // With shared state all instances draw from one pool holding the whole range.
    let (instance, instances) = if ctx.shared_state { (0, 1) } else { (ctx.instance, ctx.instances) };
    Ok(Box::new(NatNf::new(&cfg, instance, instances)?))
}

impl NatNf {
    /// Validates `cfg` and builds instance `instance` of `instances`.
    pub fn new(cfg: &NatConfig, instance: u16, instances: u16) -> Result<NatNf, NfError> {
        let external_ip: IpAddr = cfg
            .external_ip
            .trim()
            .parse()
            .map_err(|_| NfError::config("external_ip", format!("`{}` is not an IP address", cfg.external_ip)))?;
        if cfg.internal.is_empty() {
            return Err(NfError::config("internal", "at least one internal prefix is needed"));
        }
        let internal = parse_cidrs("internal", &cfg.internal)?;
        if internal.iter().any(|c| c.contains(external_ip)) {
            return Err(NfError::config("external_ip", "the external address lies inside an internal prefix"));
        }
        let [lo, hi] = cfg.port_range;
        if lo == 0 || hi > 65535 {
            return Err(NfError::config("port_range", "ports must be between 1 and 65535"));
        }
        if lo > hi {
            return Err(NfError::config("port_range", format!("range is inverted: first {lo} > last {hi}")));
        }
        let n = u32::from(instances.max(1));
        let i = u32::from(instance);
        if i >= n {
            return Err(NfError::config("", format!("instance {i} of only {n}")));
        }
        let size = hi - lo + 1;
        if size < n {
            return Err(NfError::config(
                "port_range",
                format!("{size} ports cannot be split among {n} instances (each needs at least one)"),
            ));
        }
        let first = lo + size * i / n;
        let last = lo + size * (i + 1) / n - 1;
        let t = &cfg.timeouts;
        for (name, v) in [
            ("timeouts.tcp_established", t.tcp_established),
            ("timeouts.tcp_transitory", t.tcp_transitory),
            ("timeouts.udp", t.udp),
            ("timeouts.icmp", t.icmp),
        ] {
            if v == 0 {
                return Err(NfError::config(name, "a timeout must be at least 1 second"));
            }
            if v > 365 * 86_400 {
                return Err(NfError::config(name, "a timeout must be at most one year"));
            }
        }
        let ep_scope = Scope::fields(&[HeaderField::SrcIp, HeaderField::SrcPort, HeaderField::Proto]);
        let shortest = [t.tcp_established, t.tcp_transitory, t.udp, t.icmp].into_iter().min().unwrap_or(1);
        let decls = vec![
            StateDecl::new("port_pool", Scope::global(), AccessPattern::ReadWriteOften).allocation(),
            StateDecl::new("endpoint_mapping", ep_scope, AccessPattern::ReadHeavy).allocation(),
            StateDecl::new("conn_mapping", Scope::per_flow(), AccessPattern::ReadHeavy)
                .allocation()
                .idle_timers(shortest * NS_PER_S),
            StateDecl::new(
                "reverse_mapping",
                Scope::fields(&[HeaderField::DstPort, HeaderField::Proto]),
                AccessPattern::ReadHeavy,
            ),
            StateDecl::new("total_packets", Scope::global(), AccessPattern::WriteMostly),
            StateDecl::new("total_tcp_packets", Scope::global(), AccessPattern::WriteMostly),
        ];
        Ok(NatNf {
            external_ip,
            internal,
            // Both bounds are within 1..=65535, checked above.
            slice: (first as u16, last as u16),
            timeouts_ns: [
                t.tcp_established * NS_PER_S,
                t.tcp_transitory * NS_PER_S,
                t.udp * NS_PER_S,
                t.icmp * NS_PER_S,
            ],
            decls,
            custom: CUSTOM_OPS,
        })
    }

    /// This instance's slice of the port range, inclusive.
    pub fn port_slice(&self) -> (u16, u16) {
        self.slice
    }

    fn is_internal(&self, ip: IpAddr) -> bool {
        self.internal.iter().any(|c| c.contains(ip))
    }

    fn timeout_ns(&self, proto: Proto, bits: i64) -> u64 {
        match proto {
            Proto::TCP => {
                let established = bits & (OUT_SYN | IN_SYN) == OUT_SYN | IN_SYN;
                if established && bits & (FIN_SEEN | RST_SEEN) == 0 {
                    self.timeouts_ns[0]
                } else {
                    self.timeouts_ns[1]
                }
            }
            Proto::UDP => self.timeouts_ns[2],
            _ => self.timeouts_ns[3],
        }
    }

    /// TCP bits after a packet with `flags` in direction `outbound`.
    fn tcp_bits(bits: i64, pkt: &Packet, outbound: bool) -> i64 {
        let f = pkt.hdr().tcp_flags;
        let mut b = bits;
        if f.syn() {
            b |= if outbound { OUT_SYN } else { IN_SYN };
        }
        if f.fin() {
            b |= FIN_SEEN;
        }
        if f.rst() {
            b |= RST_SEEN;
        }
        b
    }

    fn outbound(&self, pkt: &mut Packet, t: FiveTuple, ctx: &mut NfContext<'_>) -> Result<Verdict, StateError> {
        let translatable = match pkt.hdr().l4 {
            L4::Tcp | L4::Udp => true,
            L4::Icmp => matches!(pkt.hdr().icmp_type, 0 | 8),
            _ => false,
        };
        if !translatable || pkt.hdr().fragmented {
            return Ok(Verdict::Drop("nat-unsupported"));
        }
        if t.src.is_ipv4() != self.external_ip.is_ipv4() {
            return Ok(Verdict::Drop("nat-family-mismatch"));
        }
        let is_tcp = t.proto == Proto::TCP;
        let Some(fk) = pkt.flow_key() else { return Ok(Verdict::Forward) };
        let conn_key = StateKey::Flow(fk);
        let (port, bits) = match ctx.state.get(CONN, &conn_key)?.and_then(|v| v.as_int()) {
            Some(v) => {
                let (port, bits) = unpack(v);
                let nb = if is_tcp { Self::tcp_bits(bits, pkt, true) } else { bits };
                if nb != bits {
                    ctx.state.set(CONN, &conn_key, Value::Int(pack(port, nb)))?;
                }
                (port, nb)
            }
            None => {
                let ep = StateKey::Endpoint(t.src, t.sport, t.proto.0);
                let port = match self.acquire(ep, t, ctx)? {
                    Some(p) => p,
                    None => return Ok(Verdict::Drop("nat-pool-exhausted")),
                };
                let bits = if is_tcp {
                    let f = pkt.hdr().tcp_flags;
                    // Picked up without its SYN: assume it is established.
                    let start = if f.syn() && !f.ack() { 0 } else { OUT_SYN | IN_SYN };
                    Self::tcp_bits(start, pkt, true)
                } else {
                    0
                };
                ctx.state.set(CONN, &conn_key, Value::Int(pack(port, bits)))?;
                (port, bits)
            }
        };
        ctx.state.set_timer(CONN, &conn_key, ctx.now_ns.saturating_add(self.timeout_ns(t.proto, bits)));
        Ok(rewrite_verdict(pkt.rewrite_src(self.external_ip, port)))
    }

    /// A port for internal endpoint `ep` with one more connection counted on its mapping;
    /// `None` when the pool is exhausted.
    fn acquire(&self, ep: StateKey, t: FiveTuple, ctx: &mut NfContext<'_>) -> Result<Option<u16>, StateError> {
        if let Some(p) = ctx.state.custom(MAPPING, &ep, OP_ACQUIRE, Value::Int(0))?.and_then(|v| v.as_int()) {
            return Ok(Some(p as u16));
        }
        let Some(popped) = self.pop_port(ctx)? else {
            let first = ctx.state.exec(
                POOL,
                &POOL_EXHAUSTED_KEY,
                StateOp::CompareAndSet { expect: None, new: Value::Int(-1) },
            )?;
            if first == Some(Value::Int(1)) {
                let (a, b) = self.slice;
                ctx.emit(
                    "port-pool-exhausted",
                    self.external_ip,
                    format!("no free port in {a}-{b} for {} {}:{}", t.proto, t.src, t.sport),
                );
            }
            return Ok(None);
        };
        let used = ctx
            .state
            .custom(MAPPING, &ep, OP_INSTALL, Value::Int(i64::from(popped)))?
            .and_then(|v| v.as_int())
            .map_or(popped, |p| p as u16);
        if used == popped {
            ctx.state.set(
                REVERSE,
                &StateKey::Endpoint(self.external_ip, popped, t.proto.0),
                Value::Endpoint(t.src, t.sport),
            )?;
        } else {
            // Another instance installed a mapping for this endpoint meanwhile: give ours back.
            self.give_back(popped, ctx)?;
        }
        Ok(Some(used))
    }

    /// Takes a free port from the pool (which starts as this instance's slice, or as the
    /// slice of whichever instance of a shared pool takes first).
    fn pop_port(&self, ctx: &mut NfContext<'_>) -> Result<Option<u16>, StateError> {
        let (a, b) = self.slice;
        let slice = Value::Int(i64::from(a) | (i64::from(b) << 16));
        let port = ctx.state.custom(POOL, &StateKey::Unit, OP_POOL_TAKE, slice)?;
        Ok(port.and_then(|v| v.as_int()).and_then(|p| u16::try_from(p).ok()))
    }

    /// Gives `port` back to the pool, without waiting.
    fn give_back(&self, port: u16, ctx: &mut NfContext<'_>) -> Result<(), StateError> {
        let op = StateOp::Custom { op: OP_POOL_GIVE_BACK, arg: Value::Int(i64::from(port)) };
        ctx.state.exec_nb(POOL, &StateKey::Unit, op)
    }

    fn inbound(&self, pkt: &mut Packet, t: FiveTuple, ctx: &mut NfContext<'_>) -> Result<Verdict, StateError> {
        let rev_key = StateKey::Endpoint(self.external_ip, t.dport, t.proto.0);
        let Some((ip, port)) = ctx.state.get(REVERSE, &rev_key)?.and_then(|v| v.as_endpoint()) else {
            return Ok(Verdict::Drop("nat-no-mapping"));
        };
        if let Err(e) = pkt.rewrite_dst(ip, port) {
            return Ok(rewrite_verdict(Err(e)));
        }
        // Refresh the connection, if this remote host has one (endpoint-independent filtering
        // forwards the packet either way).
        let Some(fk) = pkt.flow_key() else { return Ok(Verdict::Forward) };
        let conn_key = StateKey::Flow(fk);
        if let Some(v) = ctx.state.get(CONN, &conn_key)?.and_then(|v| v.as_int()) {
            let (p, bits) = unpack(v);
            let nb = if t.proto == Proto::TCP { Self::tcp_bits(bits, pkt, false) } else { bits };
            if nb != bits {
                ctx.state.set(CONN, &conn_key, Value::Int(pack(p, nb)))?;
            }
            ctx.state.set_timer(CONN, &conn_key, ctx.now_ns.saturating_add(self.timeout_ns(t.proto, nb)));
        }
        Ok(Verdict::Forward)
    }

    fn expire(&self, key: StateKey, ctx: &mut NfContext<'_>) -> Result<(), StateError> {
        let StateKey::Flow(fk) = key else { return Ok(()) };
        if ctx.state.delete(CONN, &key)?.is_none() {
            return Ok(());
        }
        // The internal side of the connection is the end inside an internal prefix.
        let (ip, port) = if self.is_internal(fk.a().0) { fk.a() } else { fk.b() };
        let ep = StateKey::Endpoint(ip, port, fk.proto.0);
        if let Some(ext) = ctx.state.custom(MAPPING, &ep, OP_RELEASE, Value::Int(0))?.and_then(|v| v.as_int()) {
            let ext = ext as u16;
            ctx.state.delete(REVERSE, &StateKey::Endpoint(self.external_ip, ext, fk.proto.0))?;
            self.give_back(ext, ctx)?;
            ctx.state.delete(POOL, &POOL_EXHAUSTED_KEY)?;
        }
        Ok(())
    }
}

fn pack(port: u16, bits: i64) -> i64 {
    i64::from(port) | (bits << 16)
}

fn unpack(v: i64) -> (u16, i64) {
    ((v & 0xffff) as u16, v >> 16)
}

fn rewrite_verdict(r: Result<(), RewriteError>) -> Verdict {
    match r {
        Ok(()) => Verdict::Forward,
        Err(RewriteError::Family) => Verdict::Drop("nat-family-mismatch"),
        Err(RewriteError::Truncated) | Err(RewriteError::NotIp) => Verdict::Drop("nat-truncated"),
    }
}

/// Mapping values pack the external port (low 16 bits) and the number of live connections.
fn mapping_parts(v: &Option<Value>) -> Result<Option<(i64, i64)>, StateError> {
    match v {
        None => Ok(None),
        Some(Value::Int(x)) => Ok(Some((x & 0xffff, x >> 16))),
        Some(_) => Err(StateError::Custom("nat mapping is not an integer")),
    }
}

/// If the endpoint has a mapping, counts one more connection on it and returns its port.
fn op_acquire(slot: &mut Option<Value>, _arg: &Value) -> Result<Option<Value>, StateError> {
    match mapping_parts(slot)? {
        Some((port, refs)) => {
            *slot = Some(Value::Int(port | ((refs + 1) << 16)));
            Ok(Some(Value::Int(port)))
        }
        None => Ok(None),
    }
}

/// Installs a mapping to port `arg` with one connection, or, if one exists, counts one more
/// connection on it; returns the mapping's port.
fn op_install(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let new_port = arg.as_int().ok_or(StateError::Custom("nat install needs a port"))?;
    match mapping_parts(slot)? {
        Some(_) => op_acquire(slot, arg),
        None => {
            *slot = Some(Value::Int((new_port & 0xffff) | (1 << 16)));
            Ok(Some(Value::Int(new_port & 0xffff)))
        }
    }
}

/// Counts one connection less; the last one removes the mapping and returns its port.
fn op_release(slot: &mut Option<Value>, _arg: &Value) -> Result<Option<Value>, StateError> {
    match mapping_parts(slot)? {
        Some((port, refs)) if refs <= 1 => {
            *slot = None;
            Ok(Some(Value::Int(port)))
        }
        Some((port, refs)) => {
            *slot = Some(Value::Int(port | ((refs - 1) << 16)));
            Ok(None)
        }
        None => Ok(None),
    }
}

// The pool's value: `Ints[next, last, head, released...]`. Ports `next..=last` were never
// handed out; `released[head..]` were given back, oldest first. A take prefers never-used
// ports, then the oldest given back (a port is reused as late as possible, as a list of the
// whole slice popped at the front and pushed at the back would do), and the value stays a few
// integers until ports come back: a replacement, a checkpoint or a store scan copies it whole.
const POOL_NEXT: usize = 0;
const POOL_LAST: usize = 1;
const POOL_HEAD: usize = 2;
const POOL_RELEASED: usize = 3;
/// Given-back ports already taken again are dropped from the front of the value once there
/// are this many of them and they are at least half of what was given back.
const POOL_COMPACT_AT: usize = 64;

/// The pool's value, checked: its fields are in range.
fn pool_parts(slot: &Option<Value>) -> Result<Option<&[i64]>, StateError> {
    match slot {
        None => Ok(None),
        Some(Value::Ints(v))
            if v.len() >= POOL_RELEASED
                && (0..=0x1_0000).contains(&v[POOL_NEXT])
                && (0..=0xffff).contains(&v[POOL_LAST])
                && usize::try_from(v[POOL_HEAD]).is_ok_and(|h| POOL_RELEASED + h <= v.len()) =>
        {
            Ok(Some(v))
        }
        Some(_) => Err(StateError::Custom("nat port pool is not a pool record")),
    }
}

/// Takes a free port: `arg` packs the slice a pool starts from (`first | last << 16`), used
/// when the pool does not exist yet. `None` when the pool is exhausted.
fn pool_take(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let slice = arg.as_int().ok_or(StateError::Custom("pool take needs the slice"))?;
    if pool_parts(slot)?.is_none() {
        *slot = Some(Value::Ints(vec![slice & 0xffff, (slice >> 16) & 0xffff, 0]));
    }
    let Some(Value::Ints(v)) = slot else { return Ok(None) };
    if v[POOL_NEXT] <= v[POOL_LAST] {
        v[POOL_NEXT] += 1;
        return Ok(Some(Value::Int(v[POOL_NEXT] - 1)));
    }
    let head = usize::try_from(v[POOL_HEAD]).unwrap_or(usize::MAX);
    let Some(&port) = v.get(POOL_RELEASED + head) else { return Ok(None) };
    let head = head + 1;
    if head >= POOL_COMPACT_AT && 2 * head >= v.len() - POOL_RELEASED {
        v.drain(POOL_RELEASED..POOL_RELEASED + head);
        v[POOL_HEAD] = 0;
    } else {
        v[POOL_HEAD] = head as i64;
    }
    Ok(Some(Value::Int(port)))
}

/// Gives port `arg` back to the pool. Returns nothing.
fn pool_give_back(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let port = arg.as_int().filter(|p| (1..=0xffff).contains(p)).ok_or(StateError::Custom("give back needs a port"))?;
    if pool_parts(slot)?.is_none() {
        // Given back before anything was taken (not done by the NAT): an empty range.
        *slot = Some(Value::Ints(vec![1, 0, 0]));
    }
    if let Some(Value::Ints(v)) = slot {
        v.push(port);
    }
    Ok(None)
}

impl NetworkFunction for NatNf {
    /// Both directions of a connection in entry order: a connection's timeout follows the FINs and
    /// RSTs of both sides.
    fn input_order(&self) -> InputOrder {
        InputOrder::Connection
    }

    fn kind(&self) -> &'static str {
        "nat"
    }

    fn state_objects(&self) -> &[StateDecl] {
        &self.decls
    }

    /// `0` acquire (count a connection on an existing mapping), `1` install (create a mapping
    /// with a taken port, or join one created meanwhile), `2` release (count a connection
    /// less; the last one removes the mapping and returns the port to give back), `3` take a
    /// port from the pool, `4` give one back.
    fn custom_ops(&self) -> &[CustomOp] {
        &self.custom
    }

    fn process(&self, pkt: &mut Packet, ctx: &mut NfContext<'_>) -> Verdict {
        let Some(t) = pkt.tuple() else { return Verdict::Forward };
        // Counters are best effort: a failed non-blocking update must not stop the packet.
        let _ = ctx.state.incr_nb(TOTAL_PACKETS, &StateKey::Unit, 1);
        if t.proto == Proto::TCP {
            let _ = ctx.state.incr_nb(TCP_PACKETS, &StateKey::Unit, 1);
        }
        let r = if t.dst == self.external_ip {
            self.inbound(pkt, t, ctx)
        } else if self.is_internal(t.src) && !self.is_internal(t.dst) {
            self.outbound(pkt, t, ctx)
        } else {
            Ok(Verdict::Forward)
        };
        r.unwrap_or_else(|e| Verdict::state_error(pkt, "nat-state-error", &e))
    }

    fn on_timer(&self, fired: TimerFired, ctx: &mut NfContext<'_>) {
        if fired.object == CONN {
            // A state error leaves the entry to a later expiry; nothing else can be done here.
            let _ = self.expire(fired.key, ctx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_hands_out_fresh_ports_first_then_given_back_ones_oldest_first() {
        let slice = Value::Int(5000 | (5002 << 16));
        let mut pool = None;
        let take = |pool: &mut Option<Value>| pool_take(pool, &slice).unwrap().and_then(|v| v.as_int());
        assert_eq!(take(&mut pool), Some(5000));
        assert_eq!(take(&mut pool), Some(5001));
        pool_give_back(&mut pool, &Value::Int(5001)).unwrap();
        pool_give_back(&mut pool, &Value::Int(5000)).unwrap();
        assert_eq!(take(&mut pool), Some(5002));
        assert_eq!(take(&mut pool), Some(5001));
        assert_eq!(take(&mut pool), Some(5000));
        assert_eq!(take(&mut pool), None);
        pool_give_back(&mut pool, &Value::Int(5002)).unwrap();
        assert_eq!(take(&mut pool), Some(5002));
        assert_eq!(take(&mut pool), None);
    }

    #[test]
    fn the_pool_stays_small_under_churn_and_refuses_what_is_not_a_pool() {
        let slice = Value::Int(1 | (100 << 16));
        let mut pool = None;
        for _ in 0..100 {
            pool_take(&mut pool, &slice).unwrap();
        }
        // Every port in use: 10,000 connections come and go, one at a time.
        for round in 0..10_000i64 {
            pool_give_back(&mut pool, &Value::Int(1 + round % 100)).unwrap();
            assert_eq!(pool_take(&mut pool, &slice).unwrap(), Some(Value::Int(1 + round % 100)));
        }
        let Some(Value::Ints(v)) = &pool else { panic!("not a pool: {pool:?}") };
        assert!(v.len() <= POOL_RELEASED + 2 * POOL_COMPACT_AT, "{} integers", v.len());
        for bad in [
            Value::Int(3),
            Value::Ints(vec![1, 2]),
            Value::Ints(vec![1, 2, 9]),
            Value::Ints(vec![i64::MAX, i64::MAX, 0]),
        ] {
            let mut slot = Some(bad.clone());
            assert!(pool_take(&mut slot, &slice).is_err());
            assert!(pool_give_back(&mut slot, &Value::Int(7)).is_err());
            assert_eq!(slot, Some(bad), "an operation that fails leaves the value as it was");
        }
        assert!(pool_give_back(&mut pool, &Value::Int(0)).is_err());
        assert!(pool_take(&mut pool, &Value::Float(1.0)).is_err());
    }

    #[test]
    fn mapping_ops_count_references() {
        let mut s = None;
        assert_eq!(op_acquire(&mut s, &Value::Int(0)).unwrap(), None);
        assert_eq!(op_install(&mut s, &Value::Int(5000)).unwrap(), Some(Value::Int(5000)));
        assert_eq!(op_install(&mut s, &Value::Int(6000)).unwrap(), Some(Value::Int(5000)));
        assert_eq!(op_acquire(&mut s, &Value::Int(0)).unwrap(), Some(Value::Int(5000)));
        assert_eq!(op_release(&mut s, &Value::Int(0)).unwrap(), None);
        assert_eq!(op_release(&mut s, &Value::Int(0)).unwrap(), None);
        assert_eq!(op_release(&mut s, &Value::Int(0)).unwrap(), Some(Value::Int(5000)));
        assert_eq!(s, None);
        assert_eq!(op_release(&mut s, &Value::Int(0)).unwrap(), None);
    }

    #[test]
    fn slices_are_disjoint_and_cover_the_range() {
        let cfg = NatConfig { port_range: [1000, 1009], ..NatConfig::default() };
        let s: Vec<_> = (0..3).map(|i| NatNf::new(&cfg, i, 3).unwrap().port_slice()).collect();
        assert_eq!(s, vec![(1000, 1002), (1003, 1005), (1006, 1009)]);
        assert!(NatNf::new(&NatConfig { port_range: [10, 11], ..NatConfig::default() }, 0, 3).is_err());
    }
}
