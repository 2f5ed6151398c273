//! Sluice's packets between processes and machines.
//!
//! When a chain spans several processes, a packet leaves one node for an instance on another
//! with everything the CHC protocols attached to it: its logical clock, move and replay marks,
//! the replay's target, its XOR vector, NF labels and times. [`geneve`] carries them as options
//! of a Geneve header (RFC 8926) in front of the original Ethernet frame, over UDP port 6081, so
//! tcpdump and Wireshark decode the traffic between nodes. [`link`] moves such datagrams in
//! batches (`sendmmsg`/`recvmmsg`); [`port`] turns batches of packets into datagrams to one
//! peer and back, counting what is malformed or lost. Loss between nodes is not handled here: a lost datagram is
//! a lost copy, which the root's log replays like any other (docs/wire-format.md).

pub mod geneve;
pub mod link;
pub mod notes;
pub mod port;

pub use geneve::{decode, encode, encode_sequenced, link_seq, Decoded, WireError, GENEVE_PORT, TO_EGRESS, TO_ROOT};
pub use link::{LinkError, RecvBatch, UdpLink, MAX_BATCH};
pub use notes::{decode_notes, encode_notes, is_control, is_notes, NoteKind, WireNote};
pub use port::{PortError, Receiver, RecvStats, SendStats, Sender, Sequence};
