//! Live Linux interfaces for Sluice through AF_PACKET sockets with memory-mapped rings, so a
//! chain can sit between two interfaces and forward real traffic.
//!
//! An [`AfPacketPort`] is an AF_PACKET `SOCK_RAW` socket bound to one interface for every
//! protocol, with a TPACKET_V2 receive ring and a TPACKET_V2 transmit ring shared with the
//! kernel through one `mmap`. [`AfPacketPort::recv_batch`] copies waiting frames into
//! [`sluice_packet::PacketPool`] packets without blocking, [`AfPacketPort::send_batch`] places
//! frames in the transmit ring and kicks the kernel once per batch, and
//! [`AfPacketPort::poll_readable`] lets an idle worker sleep in poll(2).
//!
//! # Decisions
//!
//! * **TPACKET_V2 for both rings.** The version is per socket, so V3 receive would mean V3
//!   transmit too (or a second socket). V2 hands frames over one at a time, so a frame is
//!   visible as soon as it is written; V3 hands over whole blocks, retired when full or after
//!   a timeout of milliseconds, which adds that latency at low rates — wrong for a bridge that
//!   must carry pings and TCP handshakes promptly. V2 costs a fixed frame size per packet
//!   (more ring memory for small packets), acceptable here.
//! * **Own frames are never received back.** `PACKET_IGNORE_OUTGOING` (Linux ≥ 4.20) makes
//!   the kernel deliver only frames arriving on the interface; on older kernels frames of type
//!   `PACKET_OUTGOING` are skipped in `recv_batch` (the kernel also never loops a socket's own
//!   transmissions back to it). A port therefore does not see what the host stack sends on the
//!   interface either — the right view for a bridge port.
//! * **`PACKET_QDISC_BYPASS`** is on by default ([`RingConfig::qdisc_bypass`]): cheaper
//!   transmission, at the price of skipping `tc` shaping and taps like `tcpdump` on the
//!   transmit side. veth devices have no qdisc by default, so it changes nothing there.
//! * **`PACKET_LOSS`** is on: a frame the kernel refuses to send is discarded instead of
//!   halting the transmit ring. `send_batch` rejects frames longer than the MTU allows before
//!   they reach the kernel (which would otherwise log an error for each).
//! * **Truncated frames** (longer than a ring frame holds, e.g. GSO/GRO super-packets on veth
//!   with offloads on) are counted and dropped by default ([`TruncatedFrames`]); disable the
//!   offloads (`ethtool -K <if> gro off tso off gso off`) or use larger frames.
//! * **VLAN tags** that the kernel strips into the ring header are re-inserted, so packets
//!   are the frames that were on the wire.
//! * **Checksums**: frames sent by a local stack through a veth may carry a checksum left to
//!   offload (counted in [`PortStats::rx_csum_not_ready`]); forwarding such a frame yields a
//!   bad checksum. Disable transmit checksum offload on the sending side
//!   (`ethtool -K <if> tx off`).
//!
//! Only Ethernet-framed interfaces (Ethernet, veth, loopback) are supported.

#![warn(missing_docs)]

mod config;
mod error;
mod port;
mod sys;

pub use config::{RingConfig, TruncatedFrames};
pub use error::AfPacketError;
pub use port::{poll_any, AfPacketPort, PortStats};
