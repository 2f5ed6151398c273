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
