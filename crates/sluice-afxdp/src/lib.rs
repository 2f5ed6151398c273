//! Live Linux interfaces for Sluice through AF_XDP sockets, next to `sluice-afpacket`'s
//! AF_PACKET rings: the kernel hands frames to user space right after the driver, before any
//! socket buffer is built (driver mode), and takes frames to send from the same shared memory.
//!
//! An [`XdpPort`] owns a UMEM (frames shared with the kernel), its fill and completion rings,
//! an AF_XDP socket with RX and TX rings bound to one queue of the interface, and a six-
//! instruction XDP program that redirects that queue's frames to the socket.
//!
//! # Decisions
//!
//! * **No libbpf, no clang.** The program is six instructions (read the queue index, redirect
//!   into the XSKMAP, pass to the stack when the queue has no socket); it is written out in
//!   `bpf.rs` and loaded with bpf(2). Building Sluice needs no C toolchain for BPF, and
//!   running it needs no object file on disk.
//! * **Attached through a BPF link**, so the program goes when the port's descriptors do —
//!   also when the process is killed. A bridge that dies does not leave its interfaces
//!   redirecting into a closed socket.
//! * **Copies in, copies out.** The chain's packets live in `PacketPool` buffers that outlive
//!   a ring slot (the root log, replays), so a received frame is copied out of the UMEM and
//!   its frame goes straight back to the fill ring; a packet to send is copied into a free
//!   frame. Zero-copy sockets (where the driver has them) still save the kernel's copy.
//! * **Receive and transmit frames apart** (8,192 and 1,024 by default), each side's rings
//!   exactly as large as its frames, so the fill ring can always take back what was received
//!   and the completion ring can never overflow.
//! * **Timestamps** are taken when a batch is read (AF_XDP carries none).
//!
//! Only Ethernet-framed interfaces are supported; the kernel must have AF_XDP (Linux ≥ 5.9 for
//! BPF links on XDP).

#![warn(missing_docs)]

mod bpf;
mod error;
mod port;
mod ring;
// An ABI table: some entries document values the code does not use.
#[allow(dead_code)]
mod sys;

pub use bpf::AttachMode;
pub use error::AfXdpError;
pub use port::{poll_any, XdpConfig, XdpPort, XdpStats};
