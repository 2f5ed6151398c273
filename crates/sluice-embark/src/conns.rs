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
        let side = if fk.source_is_a(&t) { 1 } else { 2 };
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

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_packet::Meta;

    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const FIN: u8 = 0x01;
    const RST: u8 = 0x04;

    /// Ethernet/IPv4 with TCP (`proto` 6) or UDP (17) from 10.0.0.1:1000 to 10.0.0.2:80, or
    /// the reverse, at `ts` seconds.
    fn pkt(reverse: bool, proto: u8, flags: u8, ts: u64) -> Packet {
        let (a, b) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let (src, dst, sp, dp) = if reverse { (b, a, 80u16, 1000u16) } else { (a, b, 1000, 80) };
        let l4: Vec<u8> = if proto == 6 {
            let mut t = [sp.to_be_bytes(), dp.to_be_bytes()].concat();
            t.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 5 << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
            t
        } else {
            [sp.to_be_bytes(), dp.to_be_bytes(), 8u16.to_be_bytes(), [0, 0]].concat()
        };
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0];
        f.extend_from_slice(&(20 + l4.len() as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&l4);
        Packet::new(f, Meta { ts_ns: ts * NS, ..Meta::default() })
    }

    #[test]
    fn connections_live_until_closed_or_idle_like_the_firewall() {
        let mut t = ConnTable::default();
        // A SYN nobody answers: live for the handshake timeout only.
        t.track(&pkt(false, 6, SYN, 0));
        assert!(t.is_live(&pkt(false, 6, ACK, 60)));
        assert!(!t.is_live(&pkt(false, 6, ACK, 61)));
        // Answered: established, live for 7,440 s of silence.
        t.track(&pkt(false, 6, SYN, 100));
        t.track(&pkt(true, 6, SYN | ACK, 100));
        assert!(t.is_live(&pkt(false, 6, ACK, 7540)));
        assert!(!t.is_live(&pkt(false, 6, ACK, 7541)));
        // Both FINs: lingers 10 s; a new SYN then opens another connection (not live).
        t.track(&pkt(false, 6, FIN | ACK, 200));
        assert!(t.is_live(&pkt(false, 6, ACK, 215)));
        t.track(&pkt(true, 6, FIN | ACK, 205));
        assert!(t.is_live(&pkt(false, 6, ACK, 215)));
        assert!(!t.is_live(&pkt(false, 6, ACK, 216)));
        assert!(!t.is_live(&pkt(false, 6, SYN, 206)));
        // A RST closes at once.
        t.track(&pkt(false, 6, SYN, 300));
        t.track(&pkt(true, 6, RST | ACK, 300));
        assert!(!t.is_live(&pkt(false, 6, ACK, 311)));
        // UDP: 60 s from the last packet, either direction.
        t.track(&pkt(false, 17, 0, 400));
        t.track(&pkt(true, 17, 0, 430));
        assert!(t.is_live(&pkt(false, 17, 0, 490)) && !t.is_live(&pkt(false, 17, 0, 491)));
        assert_eq!(t.live_at(490 * NS), 1);
    }
}
