//! Least-connections (or random) load balancer.
//!
//! # Semantics
//!
//! A new TCP or UDP connection to a virtual IP (VIP) is assigned the backend with the fewest
//! active connections (ties broken round-robin, so an idle pool is used evenly), or with
//! `policy: random` a backend drawn at random ([`NfContext::random_u64`]: a packet processed
//! again after a failure, or by a clone, draws the same backend). Its packets
//! from the client have their destination rewritten to the backend: the address always, the
//! port only when the backend names one. Packets of the same connection coming back from the
//! backend have their source rewritten to the VIP endpoint the client used.
//!
//! A connection is "new" when no mapping exists for its direction-free flow key and the packet
//! goes to a VIP. With `vips` empty every destination counts as a VIP, so the first packet seen
//! of a connection decides which side is the client. TCP connections are balanced on any
//! packet, not only on a SYN (captures start mid-connection).
//!
//! A capture recorded *in front of* the balancer shows replies coming from the VIP itself, not
//! from a backend; such a packet matches the mapping in the server-to-client direction and is
//! forwarded untouched, but its bytes are counted for the backend and its FIN/RST counts
//! towards the connection's end.
//!
//! A connection ends when both sides sent a FIN, or on a RST: its backend's active count is
//! decremented right away and the mapping's timer is set to `linger` seconds after the packet
//! that closed it, so that the last ACKs still reach the same backend. Packets of a closed
//! connection are still rewritten and counted but do not touch its timer: the mapping is
//! deleted `linger` seconds (packet time) after the close, however many packets follow. A
//! connection that is not closed has its timer re-armed to `timeout` seconds by each of its
//! packets, and ends when it fires (idle). The decrement happens exactly once: the mapping
//! carries a "closed" bit that a custom operation sets atomically (only the caller that set it
//! decrements), and the timer decrements only if its atomic delete removed a mapping that was
//! not closed. A SYN (without ACK) from the client on a lingering closed mapping starts a new
//! connection.
//!
//! Other protocols (ICMP, ...) and packets of the other IP family than the backends pass
//! untouched and are not counted.
//!
//! IP fragments carry no ports (Sluice does no reassembly, and no fragment's transport header
//! is parsed, not even the first one's), so a fragment cannot be matched to a connection. A
//! TCP or UDP fragment whose destination is a VIP address (any port; with `vips` empty, any
//! address of the backends' family) or whose source is a backend address is dropped with
//! `lb-fragment`; other fragments pass untouched.
//!
//! # State objects
//!
//! | id | name | scope | pattern | why |
//! |---|---|---|---|---|
//! | [`ACTIVE`] | `active_connections` | global | read/write often | `Ints` of per-backend active connection counts plus a round-robin cursor; changed only by the custom operations "pick least loaded and increment" and "decrement", so instances can share it without locks |
//! | [`CONNS`] | `conn_backend` | per-flow | read-heavy | client↔VIP connection → backend index, client side, FIN and closed bits; read on every packet, written at start and at FIN/RST |
//! | [`REVERSE`] | `backend_conn` | per-flow | read-heavy | backend↔client connection → the VIP endpoint to restore in replies |
//! | [`BYTES`] | `backend_bytes` | global | write-mostly | bytes (whole frames, both directions) per backend, key `Id(index)`, `incr_nb` |
//!
//! # Drop reasons and events
//!
//! Drops: `lb-truncated` (a header to rewrite lies beyond the captured bytes), `lb-fragment`
//! (a TCP/UDP IP fragment to a VIP or from a backend), `lb-state-error`. No events:
//! balancing decisions are per connection and too frequent.
//!
//! # Configuration
//!
//! A chain file (see `docs/chains.md`) with one `lb` vertex:
//!
//! ```yaml
//! name: lb-example
//! vertices:
//!   lb:
//!     type: lb
//!     config:
//!       vips: ["203.0.113.10:80", "203.0.113.10:443"]   # "ip", "ip:port", "net/len", "net/len@80-90"; empty: all
//!       backends: [10.1.0.1, 10.1.0.2, "10.1.0.3:8080"]  # "ip" or "ip:port"
//!       timeout: 300                                     # idle timeout, seconds
//!       linger: 10                                       # mapping kept after close, seconds
//!       policy: least_connections                        # or random
//! edges:
//!   - { from: input, to: lb }
//!   - { from: lb, to: output }
//! ```
//! Defaults: no VIPs (balance everything), four backends `10.1.0.1`–`10.1.0.4`, `timeout`
//! 300 s, `linger` 10 s, `policy: least_connections`, so `type: lb` works out of the box in
//! tests and demos. All backends and VIPs must be of one IP family.

use crate::util::{parse_config, parse_endpoint, Cidr, NS_PER_S};
use serde::Deserialize;
use sluice_nf::{
    AccessPattern, BuildCtx, CustomOp, InputOrder, NetworkFunction, NfContext, NfError, ObjectId, Scope, StateDecl,
    StateError, StateKey, TimerFired, Value, Verdict,
};
use sluice_packet::{FiveTuple, FlowKey, Packet, Proto, RewriteError};
use std::net::IpAddr;

/// State object: per-backend active connection counts (`Ints`, key [`StateKey::Unit`]).
pub const ACTIVE: ObjectId = ObjectId(0);
/// State object: client↔VIP flow key → packed backend index and connection bits.
pub const CONNS: ObjectId = ObjectId(1);
/// State object: backend↔client flow key → VIP endpoint.
pub const REVERSE: ObjectId = ObjectId(2);
/// State object: bytes per backend (key `Id(index)`).
pub const BYTES: ObjectId = ObjectId(3);

const OP_PICK: u16 = 0;
const OP_RELEASE: u16 = 1;
const OP_CLOSE: u16 = 2;
const OP_TAKE: u16 = 3;

// Bits of a connection entry above the 16-bit backend index.
const CLIENT_IS_A: i64 = 1;
const CLIENT_FIN: i64 = 2;
const SERVER_FIN: i64 = 4;
const CLOSED: i64 = 8;

/// The LB's custom operations, in the order its state operations name them.
pub(crate) const CUSTOM_OPS: [CustomOp; 4] = [
    CustomOp { name: "lb-pick-least-loaded", apply: op_pick },
    CustomOp { name: "lb-release", apply: op_release },
    CustomOp { name: "lb-close", apply: op_close },
    CustomOp { name: "lb-take", apply: op_take },
];

/// The load balancer's configuration block.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LbConfig {
    /// Virtual addresses, `ip` (any port) or `ip:port`; empty means every destination.
    pub vips: Vec<String>,
    /// Backends, `ip` (keep the client's destination port) or `ip:port`.
    pub backends: Vec<String>,
    /// Idle timeout of a connection, seconds.
    pub timeout: u64,
    /// How long a closed connection's mapping is kept for its last packets, seconds, counted
    /// from the packet that closed it.
    pub linger: u64,
    /// How a new connection's backend is chosen.
    pub policy: Policy,
}

/// How the load balancer chooses a new connection's backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// The backend with the fewest active connections (ties round-robin).
    LeastConnections,
    /// A backend drawn uniformly at random. The draw goes through
    /// [`NfContext::random_u64`], so a replayed packet gets the backend its first processing
    /// got.
    Random,
}

impl Default for LbConfig {
    fn default() -> Self {
        LbConfig {
            vips: Vec::new(),
            backends: (1..=4).map(|i| format!("10.1.0.{i}")).collect(),
            timeout: 300,
            linger: 10,
            policy: Policy::LeastConnections,
        }
    }
}

/// The load balancer. Holds only its validated configuration.
pub struct LbNf {
    vips: Vec<Vip>,
    /// The ports any VIP takes, as sorted disjoint ranges (`None`: some VIP takes every port):
    /// a packet to no VIP port is turned away in a comparison or two, however many VIPs share
    /// the port ranges.
    vip_ports: Option<Vec<(u16, u16)>>,
    backends: Vec<(IpAddr, Option<u16>)>,
    timeout_ns: u64,
    linger_ns: u64,
    policy: Policy,
    decls: Vec<StateDecl>,
    custom: [CustomOp; 4],
}

/// Builds an instance from its config.
pub fn build(config: &serde_yaml::Value, _ctx: &mut BuildCtx<'_>) -> Result<Box<dyn NetworkFunction>, NfError> {
    let cfg: LbConfig = parse_config(config)?;
    Ok(Box::new(LbNf::new(&cfg)?))
}

/// A VIP: `ip`, `ip:port`, `[v6]:port`, a prefix `net/len` (every address in it is a VIP,
/// as a balancer announcing a whole range does), or `net/len@port` / `net/len@first-last`.
type Vip = (Cidr, Option<(u16, u16)>);

fn parse_vips(list: &[String]) -> Result<Vec<Vip>, NfError> {
    let mut out = Vec::with_capacity(list.len());
    for (i, s) in list.iter().enumerate() {
        let err = |m: String| NfError::config(format!("vips[{i}]"), m);
        let vip = if let Some((net, ports)) = s.split_once('@') {
            let net = Cidr::parse(net).map_err(err)?;
            let num = |x: &str| x.trim().parse::<u16>().map_err(|_| err(format!("`{s}`: bad port `{x}`")));
            let (lo, hi) = match ports.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(ports)?, num(ports)?),
            };
            if lo > hi {
                return Err(err(format!("`{s}`: port range is inverted")));
            }
            (net, Some((lo, hi)))
        } else if s.contains('/') {
            (Cidr::parse(s).map_err(err)?, None)
        } else {
            let (ip, port) = parse_endpoint(s).map_err(err)?;
            (Cidr::parse(&ip.to_string()).map_err(err)?, port.map(|p| (p, p)))
        };
        if vip.0 == Cidr::Any {
            return Err(err("`any` is not a VIP (leave `vips` empty to balance everything)".into()));
        }
        out.push(vip);
    }
    Ok(out)
}

/// The union of the VIPs' port ranges, sorted and merged; `None` if a VIP takes every port.
fn merged_ports(vips: &[Vip]) -> Option<Vec<(u16, u16)>> {
    let mut r: Vec<(u16, u16)> = vips.iter().map(|v| v.1).collect::<Option<_>>()?;
    r.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::with_capacity(r.len());
    for (lo, hi) in r {
        match out.last_mut() {
            Some(last) if u32::from(lo) <= u32::from(last.1) + 1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    Some(out)
}

fn parse_endpoints(field: &str, list: &[String]) -> Result<Vec<(IpAddr, Option<u16>)>, NfError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| parse_endpoint(s).map_err(|m| NfError::config(format!("{field}[{i}]"), m)))
        .collect()
}

impl LbNf {
    /// Validates `cfg` and builds the NF.
    pub fn new(cfg: &LbConfig) -> Result<LbNf, NfError> {
        if cfg.backends.is_empty() {
            return Err(NfError::config("backends", "at least one backend is needed"));
        }
        if cfg.backends.len() > 4096 {
            return Err(NfError::config("backends", "at most 4096 backends are supported"));
        }
        let backends = parse_endpoints("backends", &cfg.backends)?;
        let vips = parse_vips(&cfg.vips)?;
        let v4 = backends[0].0.is_ipv4();
        if let Some(i) = backends.iter().position(|b| b.0.is_ipv4() != v4) {
            return Err(NfError::config(format!("backends[{i}]"), "all backends must be of one IP family"));
        }
        if let Some(i) = vips.iter().position(|b| !matches!((b.0, v4), (Cidr::V4(..), true) | (Cidr::V6(..), false))) {
            return Err(NfError::config(format!("vips[{i}]"), "VIPs must be of the backends' IP family"));
        }
        for i in 0..backends.len() {
            if backends[..i].contains(&backends[i]) {
                return Err(NfError::config(format!("backends[{i}]"), "duplicate backend"));
            }
        }
        if cfg.timeout == 0 || cfg.timeout > 365 * 86_400 {
            return Err(NfError::config("timeout", "must be between 1 second and one year"));
        }
        if cfg.linger == 0 || cfg.linger > cfg.timeout {
            return Err(NfError::config("linger", "must be at least 1 second and at most `timeout`"));
        }
        Ok(LbNf {
            vip_ports: merged_ports(&vips),
            vips,
            backends,
            timeout_ns: cfg.timeout * NS_PER_S,
            linger_ns: cfg.linger * NS_PER_S,
            policy: cfg.policy,
            decls: vec![
                StateDecl::new("active_connections", Scope::global(), AccessPattern::ReadWriteOften).allocation(),
                // `linger` is at most `timeout` (checked above): the shorter of the two.
                StateDecl::new("conn_backend", Scope::per_flow(), AccessPattern::ReadHeavy)
                    .allocation()
                    .idle_timers(cfg.linger * NS_PER_S),
                StateDecl::new("backend_conn", Scope::per_flow(), AccessPattern::ReadHeavy).allocation(),
                StateDecl::new("backend_bytes", Scope::global(), AccessPattern::WriteMostly).allocation(),
            ],
            custom: CUSTOM_OPS,
        })
    }

    /// Number of backends.
    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    fn is_vip(&self, ip: IpAddr, port: u16) -> bool {
        if self.vips.is_empty() {
            return ip.is_ipv4() == self.backends[0].0.is_ipv4();
        }
        if self.vip_ports.as_ref().is_some_and(|r| !r.iter().any(|&(lo, hi)| lo <= port && port <= hi)) {
            return false;
        }
        // The port test first: it is one comparison, the address test a mask per family.
        self.vips.iter().any(|&(v, p)| p.is_none_or(|(lo, hi)| lo <= port && port <= hi) && v.contains(ip))
    }

    /// Whether `ip` is the address of a VIP, whatever its port.
    fn is_vip_addr(&self, ip: IpAddr) -> bool {
        if self.vips.is_empty() {
            return ip.is_ipv4() == self.backends[0].0.is_ipv4();
        }
        self.vips.iter().any(|&(v, _)| v.contains(ip))
    }

    /// The backend's endpoint for a connection whose VIP port is `vport`.
    fn backend_ep(&self, idx: usize, vport: u16) -> Option<(IpAddr, u16)> {
        self.backends.get(idx).map(|&(ip, p)| (ip, p.unwrap_or(vport)))
    }

    fn is_backend(&self, ip: IpAddr, port: u16) -> bool {
        self.backends.iter().any(|&(b, p)| b == ip && (p.is_none() || p == Some(port)))
    }

    /// The key of the backend side of connection `conn` served by backend `idx`.
    fn reverse_key(&self, conn: &FlowKey, bits: i64, idx: usize) -> Option<StateKey> {
        let (client, vip) = if bits & CLIENT_IS_A != 0 { (conn.a(), conn.b()) } else { (conn.b(), conn.a()) };
        let (bip, bport) = self.backend_ep(idx, vip.1)?;
        let t = FiveTuple { src: client.0, dst: bip, sport: client.1, dport: bport, proto: conn.proto };
        Some(StateKey::Flow(t.flow_key()))
    }

    fn count_bytes(idx: i64, pkt: &Packet, ctx: &mut NfContext<'_>) {
        // Best effort: a failed non-blocking counter update must not stop the packet.
        let _ = ctx.state.incr_nb(BYTES, &StateKey::Id(idx as u64), pkt.len() as i64);
    }

    /// Updates the FIN/RST bits of connection `key` (entry value `v`), ends it on both FINs or
    /// a RST (decrementing its backend once, and setting its timer to `linger`), and otherwise
    /// re-arms its idle timer. A connection already closed keeps the linger deadline set when
    /// it closed: later packets do not touch its timer.
    fn track_end(
        &self,
        key: &StateKey,
        v: i64,
        from_client: bool,
        pkt: &Packet,
        ctx: &mut NfContext<'_>,
    ) -> Result<(), StateError> {
        let (idx, bits) = unpack(v);
        let f = pkt.hdr().tcp_flags;
        if bits & CLOSED != 0 {
            return Ok(());
        }
        if pkt.tuple().map(|t| t.proto) != Some(Proto::TCP) {
            ctx.state.set_timer(CONNS, key, ctx.now_ns.saturating_add(self.timeout_ns));
            return Ok(());
        }
        let mut nb = bits;
        if f.fin() {
            nb |= if from_client { CLIENT_FIN } else { SERVER_FIN };
        }
        if nb != bits {
            ctx.state.set(CONNS, key, Value::Int(pack(idx, nb)))?;
        }
        if f.rst() || nb & (CLIENT_FIN | SERVER_FIN) == CLIENT_FIN | SERVER_FIN {
            // Only the caller that flips the closed bit decrements the count.
            if let Some(i) = ctx.state.custom(CONNS, key, OP_CLOSE, Value::Int(0))?.and_then(|v| v.as_int()) {
                ctx.state.custom(ACTIVE, &StateKey::Unit, OP_RELEASE, Value::Int(i))?;
            }
            ctx.state.set_timer(CONNS, key, ctx.now_ns.saturating_add(self.linger_ns));
        } else {
            ctx.state.set_timer(CONNS, key, ctx.now_ns.saturating_add(self.timeout_ns));
        }
        Ok(())
    }

    fn handle(
        &self,
        pkt: &mut Packet,
        t: FiveTuple,
        fk: FlowKey,
        ctx: &mut NfContext<'_>,
    ) -> Result<Verdict, StateError> {
        if t.proto != Proto::TCP && t.proto != Proto::UDP {
            return Ok(Verdict::Forward);
        }
        // No fragment carries ports (no reassembly here), so none can be matched to a
        // connection: drop those the balancer would be responsible for.
        if pkt.hdr().fragmented {
            if self.is_vip_addr(t.dst) || self.backends.iter().any(|&(b, _)| b == t.src) {
                return Ok(Verdict::Drop("lb-fragment"));
            }
            return Ok(Verdict::Forward);
        }
        // Backend → client: restore the VIP as the source.
        if self.is_backend(t.src, t.sport) {
            let rkey = StateKey::Flow(fk);
            if let Some((vip, vport)) = ctx.state.get(REVERSE, &rkey)?.and_then(|v| v.as_endpoint()) {
                let orig = FiveTuple { src: vip, sport: vport, ..t };
                let ckey = StateKey::Flow(orig.flow_key());
                if let Some(v) = ctx.state.get(CONNS, &ckey)?.and_then(|v| v.as_int()) {
                    Self::count_bytes(unpack(v).0, pkt, ctx);
                    self.track_end(&ckey, v, false, pkt, ctx)?;
                }
                return Ok(rewrite_verdict(pkt.rewrite_src(vip, vport)));
            }
        }
        let ckey = StateKey::Flow(fk);
        let existing = ctx.state.get(CONNS, &ckey)?.and_then(|v| v.as_int());
        if let Some(v) = existing {
            let (idx, bits) = unpack(v);
            let client_is_a = bits & CLIENT_IS_A != 0;
            let from_client = fk.source_is_a(&t) == client_is_a;
            let f = pkt.hdr().tcp_flags;
            let reopen = from_client && bits & CLOSED != 0 && t.proto == Proto::TCP && f.syn() && !f.ack();
            if !reopen {
                Self::count_bytes(idx, pkt, ctx);
                self.track_end(&ckey, v, from_client, pkt, ctx)?;
                if !from_client {
                    // A reply sent by the VIP itself (capture taken in front of the balancer).
                    return Ok(Verdict::Forward);
                }
                let Some((bip, bport)) = self.backend_ep(idx as usize, t.dport) else {
                    return Ok(Verdict::Drop("lb-state-error"));
                };
                return Ok(rewrite_verdict(pkt.rewrite_dst(bip, bport)));
            }
            // A new connection reusing the ports of a lingering closed one.
            if let Some(rk) = self.reverse_key(&fk, bits, idx as usize) {
                ctx.state.delete(REVERSE, &rk)?;
            }
            ctx.state.delete(CONNS, &ckey)?;
        }
        if !self.is_vip(t.dst, t.dport) {
            return Ok(Verdict::Forward);
        }
        let n = self.backends.len() as i64;
        let idx = match self.policy {
            // Pick the least-loaded backend and count it, in one operation.
            Policy::LeastConnections => ctx
                .state
                .custom(ACTIVE, &StateKey::Unit, OP_PICK, Value::Int(n))?
                .and_then(|v| v.as_int())
                .ok_or(StateError::Custom("pick returned no backend"))?,
            Policy::Random => {
                let idx = (ctx.random_u64()? % n as u64) as i64;
                ctx.state.custom(ACTIVE, &StateKey::Unit, OP_TAKE, Value::Ints(vec![n, idx]))?;
                idx
            }
        };
        let Some((bip, bport)) = self.backend_ep(idx as usize, t.dport) else {
            return Ok(Verdict::Drop("lb-state-error"));
        };
        let bits = if fk.source_is_a(&t) { CLIENT_IS_A } else { 0 };
        ctx.state.set(CONNS, &ckey, Value::Int(pack(idx, bits)))?;
        let back = FiveTuple { dst: bip, dport: bport, ..t };
        ctx.state.set(REVERSE, &StateKey::Flow(back.flow_key()), Value::Endpoint(t.dst, t.dport))?;
        Self::count_bytes(idx, pkt, ctx);
        self.track_end(&ckey, pack(idx, bits), true, pkt, ctx)?;
        Ok(rewrite_verdict(pkt.rewrite_dst(bip, bport)))
    }

    fn expire(&self, key: StateKey, ctx: &mut NfContext<'_>) -> Result<(), StateError> {
        let StateKey::Flow(fk) = key else { return Ok(()) };
        // The delete is atomic: only one expiry can remove the mapping.
        let Some(v) = ctx.state.delete(CONNS, &key)?.and_then(|v| v.as_int()) else { return Ok(()) };
        let (idx, bits) = unpack(v);
        if bits & CLOSED == 0 {
            ctx.state.custom(ACTIVE, &StateKey::Unit, OP_RELEASE, Value::Int(idx))?;
        }
        if let Some(rk) = self.reverse_key(&fk, bits, idx as usize) {
            ctx.state.delete(REVERSE, &rk)?;
        }
        Ok(())
    }
}

fn pack(idx: i64, bits: i64) -> i64 {
    (idx & 0xffff) | (bits << 16)
}

fn unpack(v: i64) -> (i64, i64) {
    (v & 0xffff, v >> 16)
}

fn rewrite_verdict(r: Result<(), RewriteError>) -> Verdict {
    match r {
        Ok(()) => Verdict::Forward,
        // Backends and VIPs share one family (checked at build), so this is a cut-off header.
        Err(_) => Verdict::Drop("lb-truncated"),
    }
}

/// Picks the backend with the fewest active connections (ties: the first after the previous
/// pick), counts one more on it and returns its index. `arg` is the number of backends; the
/// value is `Ints([count_0, ..., count_n-1, last_pick])`, created or resized as needed.
fn op_pick(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let n = arg.as_int().filter(|&n| n > 0).ok_or(StateError::Custom("pick needs the backend count"))? as usize;
    let mut v = match slot.take() {
        Some(Value::Ints(v)) => v,
        None => Vec::new(),
        Some(other) => {
            *slot = Some(other);
            return Err(StateError::Custom("active counts are not an integer record"));
        }
    };
    let last = if v.len() == n + 1 { v[n] } else { -1 };
    v.resize(n + 1, 0);
    let start = usize::try_from(last + 1).unwrap_or(0) % n;
    let mut best = start;
    for k in 1..n {
        let i = (start + k) % n;
        if v[i] < v[best] {
            best = i;
        }
    }
    v[best] += 1;
    v[n] = best as i64;
    *slot = Some(Value::Ints(v));
    Ok(Some(Value::Int(best as i64)))
}

/// Counts one more connection on a backend chosen by the caller; `arg` is `Ints([backend
/// count, index])`. Returns the new count.
fn op_take(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let (n, i) = match arg {
        Value::Ints(a) if a.len() == 2 && a[0] > 0 && (0..a[0]).contains(&a[1]) => (a[0] as usize, a[1] as usize),
        _ => return Err(StateError::Custom("take needs the backend count and an index below it")),
    };
    let mut v = match slot.take() {
        Some(Value::Ints(v)) => v,
        None => Vec::new(),
        Some(other) => {
            *slot = Some(other);
            return Err(StateError::Custom("active counts are not an integer record"));
        }
    };
    v.resize(n + 1, 0);
    v[i] += 1;
    let r = v[i];
    *slot = Some(Value::Ints(v));
    Ok(Some(Value::Int(r)))
}

/// Counts one connection less on backend `arg` (never below zero); returns the new count.
fn op_release(slot: &mut Option<Value>, arg: &Value) -> Result<Option<Value>, StateError> {
    let i = arg.as_int().and_then(|i| usize::try_from(i).ok()).ok_or(StateError::Custom("release needs an index"))?;
    match slot {
        Some(Value::Ints(v)) => match v.get_mut(i) {
            Some(c) => {
                *c = (*c - 1).max(0);
                Ok(Some(Value::Int(*c)))
            }
            None => Err(StateError::Custom("release: no such backend")),
        },
        None => Ok(None),
        Some(_) => Err(StateError::Custom("active counts are not an integer record")),
    }
}

/// Sets the closed bit of a connection entry; returns its backend index if this call closed
/// it, `None` if it was closed already or is gone.
fn op_close(slot: &mut Option<Value>, _arg: &Value) -> Result<Option<Value>, StateError> {
    match slot {
        Some(Value::Int(v)) => {
            let (idx, bits) = unpack(*v);
            if bits & CLOSED != 0 {
                return Ok(None);
            }
            *v = pack(idx, bits | CLOSED);
            Ok(Some(Value::Int(idx)))
        }
        None => Ok(None),
        Some(_) => Err(StateError::Custom("connection entry is not an integer")),
    }
}

impl NetworkFunction for LbNf {
    /// Both directions of a connection in entry order: a connection closes on the FINs of both
    /// sides and lingers from the second.
    fn input_order(&self) -> InputOrder {
        InputOrder::Connection
    }

    fn kind(&self) -> &'static str {
        "lb"
    }

    fn state_objects(&self) -> &[StateDecl] {
        &self.decls
    }

    /// `0` pick the least-loaded backend and increment it, `1` decrement a backend's count,
    /// `2` mark a connection closed (once), `3` increment a chosen backend's count.
    fn custom_ops(&self) -> &[CustomOp] {
        &self.custom
    }

    fn process(&self, pkt: &mut Packet, ctx: &mut NfContext<'_>) -> Verdict {
        let (Some(t), Some(fk)) = (pkt.tuple(), pkt.flow_key()) else { return Verdict::Forward };
        self.handle(pkt, t, fk, ctx).unwrap_or_else(|e| Verdict::state_error(pkt, "lb-state-error", &e))
    }

    fn on_timer(&self, fired: TimerFired, ctx: &mut NfContext<'_>) {
        if fired.object == CONNS {
            // A state error leaves the entry; nothing else can be done from a timer.
            let _ = self.expire(fired.key, ctx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_counts_the_chosen_backend_and_refuses_bad_arguments() {
        let mut s = None;
        let take = |s: &mut Option<Value>, i: i64| op_take(s, &Value::Ints(vec![3, i]));
        assert_eq!(take(&mut s, 2).unwrap(), Some(Value::Int(1)));
        assert_eq!(take(&mut s, 2).unwrap(), Some(Value::Int(2)));
        assert_eq!(take(&mut s, 0).unwrap(), Some(Value::Int(1)));
        assert_eq!(s, Some(Value::Ints(vec![1, 0, 2, 0])));
        for bad in [Value::Ints(vec![3, 3]), Value::Ints(vec![3, -1]), Value::Ints(vec![0, 0]), Value::Int(1)] {
            assert!(op_take(&mut s, &bad).is_err(), "{bad:?}");
        }
        assert_eq!(s, Some(Value::Ints(vec![1, 0, 2, 0])), "a refused take leaves the counts");
    }

    #[test]
    fn vip_port_filter_is_the_union_of_the_vips_ports() {
        let lb = |vips: &[&str]| {
            let cfg = LbConfig { vips: vips.iter().map(|s| s.to_string()).collect(), ..LbConfig::default() };
            LbNf::new(&cfg).unwrap()
        };
        let x = lb(&[
            "0.0.0.0/0@80",
            "10.0.0.0/8@21",
            "10.0.0.0/8@22-23",
            "1.2.3.4:81",
            "5.0.0.0/8@100-200",
            "6.0.0.0/8@150-160",
        ]);
        assert_eq!(x.vip_ports, Some(vec![(21, 23), (80, 81), (100, 200)]));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (a, p, want) in [
            ("9.9.9.9", 80, true),
            ("9.9.9.9", 21, false),
            ("10.1.1.1", 23, true),
            ("1.2.3.4", 81, true),
            ("1.2.3.5", 81, false),
            ("6.1.1.1", 155, true),
            ("6.1.1.1", 170, false),
            ("5.1.1.1", 170, true),
            ("10.1.1.1", 24, false),
        ] {
            assert_eq!(x.is_vip(ip(a), p), want, "{a}:{p}");
        }
        // A VIP without a port takes every port: no filter.
        let y = lb(&["10.0.0.0/8@80", "192.0.2.1"]);
        assert_eq!(y.vip_ports, None);
        assert!(y.is_vip(ip("192.0.2.1"), 9999));
        assert!(!y.is_vip(ip("10.0.0.1"), 9999));
    }

    #[test]
    fn pick_is_least_loaded_with_round_robin_ties() {
        let mut s = None;
        let n = Value::Int(3);
        let picks: Vec<_> = (0..4).map(|_| op_pick(&mut s, &n).unwrap().unwrap().as_int().unwrap()).collect();
        assert_eq!(picks, vec![0, 1, 2, 0]);
        op_release(&mut s, &Value::Int(2)).unwrap();
        op_release(&mut s, &Value::Int(2)).unwrap();
        assert_eq!(s, Some(Value::Ints(vec![2, 1, 0, 0])));
        assert_eq!(op_pick(&mut s, &n).unwrap(), Some(Value::Int(2)));
        let mut c = Some(Value::Int(pack(3, CLIENT_IS_A)));
        assert_eq!(op_close(&mut c, &Value::Int(0)).unwrap(), Some(Value::Int(3)));
        assert_eq!(op_close(&mut c, &Value::Int(0)).unwrap(), None);
    }
}
