//! Packets as Sluice moves them: owned byte buffers recycled through a pool, grouped in batches,
//! each carrying the per-packet metadata the correctness protocols need (logical clock, flags,
//! target instance, XOR vector, labels, times) and a cached parse of its headers.
//!
//! Parsing is done once, lazily, with `etherparse`; rewriting addresses and ports keeps every
//! checksum valid by incremental update (RFC 1624) instead of recomputing over the payload.

mod checksum;
mod flow;
mod headers;
mod meta;
mod packet;
mod seq_ring;

pub use checksum::{checksum_adjust, checksum_adjust_u16};
pub use flow::{hash_ip, FiveTuple, FlowKey, Fnv1a, HeaderField, Proto};
pub use headers::{Headers, ParseStatus, TcpFlags, L3, L4};
pub use meta::{Clock, InstanceId, LabelId, Labels, Meta, MetaFlags, MAX_LABELS};
pub use packet::{warm, Batch, Packet, PacketBody, PacketPool, RewriteError, MAX_FRAME};
pub use seq_ring::SeqRing;

/// A TCP (or UDP) frame 10.0.0.1 → 192.0.2.7 over IPv4 from etherparse's builder, for this
/// crate's tests.
#[cfg(test)]
pub(crate) fn test_frame(udp: bool, payload: &[u8]) -> Vec<u8> {
    let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4(
        [10, 0, 0, 1],
        [192, 0, 2, 7],
        64,
    );
    let mut f = Vec::new();
    let written = if udp {
        b.udp(5353, 53).write(&mut f, payload)
    } else {
        b.tcp(40000, 80, 7, 1024).syn().ack(99).write(&mut f, payload)
    };
    assert!(written.is_ok(), "{written:?}");
    f
}
