//! Packets for the core's unit tests.

use sluice_packet::{Meta, Packet};

/// A UDP packet from `10.0.0.<src>` to `192.0.2.1`, port `sport` to 53.
pub fn udp(src: u8, sport: u16) -> Packet {
    let b =
        etherparse::PacketBuilder::ethernet2([1; 6], [2; 6]).ipv4([10, 0, 0, src], [192, 0, 2, 1], 64).udp(sport, 53);
    let payload = [0u8; 8];
    let mut frame = Vec::with_capacity(b.size(payload.len()));
    if b.write(&mut frame, &payload).is_err() {
        frame.clear();
    }
    Packet::new(frame, Meta::default())
}
