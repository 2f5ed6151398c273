//! The kernel ABI this crate talks to: `<linux/if_packet.h>` constants and structures, written
//! out here so that the ring layout the code relies on is visible in one place and does not
//! depend on which of them a given `libc` release exports.

// An ABI table: it lists every status value the handshakes can see, including ones the code
// only mentions in comments.
#![allow(dead_code)]

/// `setsockopt` level for packet sockets.
pub const SOL_PACKET: libc::c_int = 263;

/// Socket options (`PACKET_*`).
pub const PACKET_ADD_MEMBERSHIP: libc::c_int = 1;
pub const PACKET_RX_RING: libc::c_int = 5;
pub const PACKET_STATISTICS: libc::c_int = 6;
pub const PACKET_VERSION: libc::c_int = 10;
pub const PACKET_TX_RING: libc::c_int = 13;
pub const PACKET_LOSS: libc::c_int = 14;
pub const PACKET_QDISC_BYPASS: libc::c_int = 20;
pub const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// `packet_mreq::mr_type` for promiscuous mode.
pub const PACKET_MR_PROMISC: libc::c_ushort = 1;

/// `enum tpacket_versions`: `TPACKET_V1 = 0, TPACKET_V2 = 1, TPACKET_V3 = 2`.
pub const TPACKET_V2: libc::c_int = 1;

/// `sockaddr_ll::sll_pkttype` of a frame the host is sending.
pub const PACKET_OUTGOING: u8 = 4;

/// RX `tp_status` bits.
pub const TP_STATUS_KERNEL: u32 = 0;
pub const TP_STATUS_USER: u32 = 1 << 0;
pub const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
pub const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
pub const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;

/// TX `tp_status` values.
pub const TP_STATUS_AVAILABLE: u32 = 0;
pub const TP_STATUS_SEND_REQUEST: u32 = 1 << 0;
pub const TP_STATUS_SENDING: u32 = 1 << 1;
pub const TP_STATUS_WRONG_FORMAT: u32 = 1 << 2;

/// Alignment of everything inside a ring frame.
pub const TPACKET_ALIGNMENT: usize = 16;

/// Rounds `x` up to [`TPACKET_ALIGNMENT`].
pub const fn tpacket_align(x: usize) -> usize {
    (x + TPACKET_ALIGNMENT - 1) & !(TPACKET_ALIGNMENT - 1)
}

/// `struct tpacket2_hdr`, the header at the start of every TPACKET_V2 frame.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Tpacket2Hdr {
    pub tp_status: u32,
    pub tp_len: u32,
    pub tp_snaplen: u32,
    pub tp_mac: u16,
    pub tp_net: u16,
    pub tp_sec: u32,
    pub tp_nsec: u32,
    pub tp_vlan_tci: u16,
    pub tp_vlan_tpid: u16,
    pub tp_padding: [u8; 4],
}

/// `struct tpacket_req`, the ring geometry given to `PACKET_RX_RING` / `PACKET_TX_RING`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TpacketReq {
    pub tp_block_size: libc::c_uint,
    pub tp_block_nr: libc::c_uint,
    pub tp_frame_size: libc::c_uint,
    pub tp_frame_nr: libc::c_uint,
}

/// `struct tpacket_stats`, read (and reset) by `PACKET_STATISTICS` for TPACKET_V1/V2.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TpacketStats {
    pub tp_packets: libc::c_uint,
    pub tp_drops: libc::c_uint,
}

/// `struct packet_mreq`, for `PACKET_ADD_MEMBERSHIP`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PacketMreq {
    pub mr_ifindex: libc::c_int,
    pub mr_type: libc::c_ushort,
    pub mr_alen: libc::c_ushort,
    pub mr_address: [libc::c_uchar; 8],
}

/// Offset of the `sockaddr_ll` that follows the header in an RX frame.
pub const RX_SLL_OFFSET: usize = tpacket_align(std::mem::size_of::<Tpacket2Hdr>());

/// Offset of `sll_pkttype` inside `sockaddr_ll` (family 2, protocol 2, ifindex 4, hatype 2).
pub const SLL_PKTTYPE_OFFSET: usize = 10;

/// `TPACKET2_HDRLEN`: aligned header plus `sockaddr_ll`.
pub const TPACKET2_HDRLEN: usize = RX_SLL_OFFSET + std::mem::size_of::<libc::sockaddr_ll>();

/// Where the kernel places the Ethernet header of a received frame when no `PACKET_RESERVE`
/// is set: the network header goes at `TPACKET_ALIGN(TPACKET2_HDRLEN + 16)`, the 14-byte MAC
/// header right before it.
pub const RX_MAC_OFFSET: usize = tpacket_align(TPACKET2_HDRLEN + 16) - ETH_HLEN;

/// Where user space writes the frame in a TX slot when `PACKET_TX_HAS_OFF` is not set:
/// `TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)`.
pub const TX_DATA_OFFSET: usize = TPACKET2_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();

/// Length of an Ethernet header.
pub const ETH_HLEN: usize = 14;

/// Length of an 802.1Q tag.
pub const VLAN_HLEN: usize = 4;

const _: () = assert!(std::mem::size_of::<Tpacket2Hdr>() == 32);
const _: () = assert!(std::mem::size_of::<libc::sockaddr_ll>() == 20);
const _: () = assert!(TPACKET2_HDRLEN == 52);
const _: () = assert!(RX_MAC_OFFSET == 66);
const _: () = assert!(TX_DATA_OFFSET == 32);
const _: () = assert!(std::mem::size_of::<PacketMreq>() == 16);
