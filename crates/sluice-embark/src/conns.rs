//! The gateway's record of the connections it encrypted, so that during a rule swap the
//! connections open at the swap stay under the rule generation they started with (see
//! [`crate::swap`]).
//!
//! A connection is live until it has been idle for the provider firewall's default timeout
//! (TCP 60 s until both sides have sent, then 7,440 s; other protocols 60 s) or, once closed (a RST, or a FIN from both sides), for
//! the firewall's linger time (10 s) after its last packet. A SYN on a closed TCP connection,
//! or any packet after the connection expired, starts a new one.

use sluice_packet::{FlowKey, Packet, Proto};

const NS: u64 = 1_000_000_000;
/// Idle timeout of a TCP connection only one side has sent on (the firewall's
/// `tcp_handshake`).
const TCP_HALF_NS: u64 = 60 * NS;
/// Idle timeout of an open TCP connection (the firewall's `tcp_established`).
const TCP_OPEN_NS: u64 = 7440 * NS;
/// How long a closed TCP connection lingers (the firewall's `tcp_linger`).
const TCP_CLOSED_NS: u64 = 10 * NS;
/// Idle timeout of a UDP, ICMP or other pseudo-connection.
const OTHER_NS: u64 = 60 * NS;
/// Expired entries are swept every this many packets.
const SWEEP_EVERY: u64 = 1 << 16;

#[derive(Debug, Clone, Copy)]
struct Conn {
    last_ns: u64,
    /// FIN seen from endpoint `a` (bit 0) and `b` (bit 1) of the flow key.
    fins: u8,
    /// Packets seen from endpoint `a` (bit 0) and `b` (bit 1).
    sent: u8,
    closed: bool,
    tcp: bool,
}

impl Conn {
    fn new(now: u64, tcp: bool) -> Conn {
        Conn { last_ns: now, fins: 0, sent: 0, closed: false, tcp }
    }

    fn deadline(&self) -> u64 {
        let idle = match (self.tcp, self.closed) {
            (true, false) if self.sent == 3 => TCP_OPEN_NS,
            (true, false) => TCP_HALF_NS,
            (true, true) => TCP_CLOSED_NS,
            (false, _) => OTHER_NS,
        };
        self.last_ns.saturating_add(idle)
    }
}

/// Connections by direction-free flow key (plaintext), in packet time. One lookup per packet
/// the gateway encrypts: a fast keyed hash, as in the NFs' local state.
#[derive(Debug, Default)]
pub(crate) struct ConnTable {
    map: hashbrown::HashMap<FlowKey, Conn, ahash::RandomState>,
    now: u64,
    packets: u64,
}

impl ConnTable {
    /// Records a packet the gateway encrypted.
    pub(crate) fn track(&mut self, pkt: &Packet) {
        let Some(t) = pkt.tuple() else { return };
        self.now = self.now.max(pkt.meta.ts_ns);
        let now = self.now;
        let fk = t.flow_key();
        let tcp = t.proto == Proto::TCP;
        let f = pkt.hdr().tcp_flags;
        let c = self.map.entry(fk).or_insert_with(|| Conn::new(now, tcp));
        if now > c.deadline() || (tcp && c.closed && f.syn() && !f.ack()) {
            *c = Conn::new(now, tcp);
        }
        c.last_ns = now;
        let side = if fk.a == (t.src, t.sport) { 1 } else { 2 };
        c.sent |= side;
        if tcp {
            if f.fin() {
                c.fins |= side;
            }
            c.closed |= f.rst() || c.fins == 3;
        }
        self.packets += 1;
        if self.packets.is_multiple_of(SWEEP_EVERY) {
            self.map.retain(|_, c| c.deadline() >= now);
        }
    }

    /// Whether the connection of `pkt` is live at `pkt`'s time (a SYN on a closed connection
    /// opens a new one: not live).
    pub(crate) fn is_live(&self, pkt: &Packet) -> bool {
        let Some(t) = pkt.tuple() else { return false };
        let f = pkt.hdr().tcp_flags;
        self.map
            .get(&t.flow_key())
            .is_some_and(|c| pkt.meta.ts_ns <= c.deadline() && !(c.tcp && c.closed && f.syn() && !f.ack()))
    }

    /// Connections live at packet time `now`.
    pub(crate) fn live_at(&self, now: u64) -> usize {
        self.map.values().filter(|c| now <= c.deadline()).count()
    }

    /// The latest packet time seen.
    pub(crate) fn now(&self) -> u64 {
        self.now
    }
}
