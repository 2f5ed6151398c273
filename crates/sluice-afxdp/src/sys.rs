//! The kernel ABI this crate talks to: `<linux/if_xdp.h>` and the parts of `<linux/bpf.h>`
//! that loading one XDP program needs, written out so the layouts the code relies on are
//! visible in one place (`libc` exports only some of them). Sizes are checked at compile time.

/// `setsockopt` level of AF_XDP sockets.
pub const SOL_XDP: libc::c_int = 283;
/// The AF_XDP address family.
pub const AF_XDP: libc::c_int = 44;

/// Socket options (`XDP_*`).
pub const XDP_MMAP_OFFSETS: libc::c_int = 1;
pub const XDP_RX_RING: libc::c_int = 2;
pub const XDP_TX_RING: libc::c_int = 3;
pub const XDP_UMEM_REG: libc::c_int = 4;
pub const XDP_UMEM_FILL_RING: libc::c_int = 5;
pub const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
pub const XDP_STATISTICS: libc::c_int = 7;
pub const XDP_OPTIONS: libc::c_int = 8;
/// `XDP_OPTIONS` bit: the socket runs in zero-copy mode.
pub const XDP_OPTIONS_ZEROCOPY: u32 = 1;

/// `sockaddr_xdp::sxdp_flags`.
pub const XDP_COPY: u16 = 1 << 1;
pub const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
/// Ring `flags` bit: the kernel wants a syscall to make progress on this ring.
pub const XDP_RING_NEED_WAKEUP: u32 = 1;

/// mmap offsets of the four rings.
pub const XDP_PGOFF_RX_RING: libc::off_t = 0;
pub const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
pub const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
pub const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;

/// `struct xdp_umem_reg`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct XdpUmemReg {
    pub addr: u64,
    pub len: u64,
    pub chunk_size: u32,
    pub headroom: u32,
    pub flags: u32,
    pub tx_metadata_len: u32,
}

/// `struct sockaddr_xdp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct SockaddrXdp {
    pub family: u16,
    pub flags: u16,
    pub ifindex: u32,
    pub queue_id: u32,
    pub shared_umem_fd: u32,
}

/// `struct xdp_ring_offset`: where a ring's fields sit in its mapping.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct XdpRingOffset {
    pub producer: u64,
    pub consumer: u64,
    pub desc: u64,
    pub flags: u64,
}

/// `struct xdp_mmap_offsets`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct XdpMmapOffsets {
    pub rx: XdpRingOffset,
    pub tx: XdpRingOffset,
    pub fill: XdpRingOffset,
    pub completion: XdpRingOffset,
}

/// `struct xdp_desc`: one frame in the RX or TX ring.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct XdpDesc {
    pub addr: u64,
    pub len: u32,
    pub options: u32,
}

/// `struct xdp_statistics`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct XdpStatistics {
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

/// bpf(2) commands.
pub const BPF_MAP_CREATE: libc::c_long = 0;
pub const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
pub const BPF_PROG_LOAD: libc::c_long = 5;
pub const BPF_LINK_CREATE: libc::c_long = 28;

pub const BPF_MAP_TYPE_XSKMAP: u32 = 17;
pub const BPF_PROG_TYPE_XDP: u32 = 6;
/// `enum bpf_attach_type`'s `BPF_XDP`.
pub const BPF_XDP: u32 = 37;
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// XDP verdict: hand the frame to the kernel's stack.
pub const XDP_PASS: i32 = 2;
/// Helper number of `bpf_redirect_map`.
pub const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// `offsetof(struct xdp_md, rx_queue_index)`.
pub const XDP_MD_RX_QUEUE_INDEX: i16 = 16;
/// `src_reg` of a 64-bit immediate load that names a map by its descriptor.
pub const BPF_PSEUDO_MAP_FD: u8 = 1;

/// `union bpf_attr` for `BPF_MAP_CREATE` (leading fields; the rest stay zero).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MapCreateAttr {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub inner_map_fd: u32,
    pub numa_node: u32,
    pub map_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_MAP_UPDATE_ELEM`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MapUpdateAttr {
    pub map_fd: u32,
    pub pad: u32,
    pub key: u64,
    pub value: u64,
    pub flags: u64,
}

/// `union bpf_attr` for `BPF_PROG_LOAD` (up to `expected_attach_type`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ProgLoadAttr {
    pub prog_type: u32,
    pub insn_cnt: u32,
    pub insns: u64,
    pub license: u64,
    pub log_level: u32,
    pub log_size: u32,
    pub log_buf: u64,
    pub kern_version: u32,
    pub prog_flags: u32,
    pub prog_name: [u8; 16],
    pub prog_ifindex: u32,
    pub expected_attach_type: u32,
}

/// `union bpf_attr` for `BPF_LINK_CREATE` with an XDP target.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkCreateAttr {
    pub prog_fd: u32,
    pub target_ifindex: u32,
    pub attach_type: u32,
    pub flags: u32,
    pub pad: [u64; 4],
}

/// `struct bpf_insn`: opcode, destination and source registers (4 bits each), offset,
/// immediate.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct BpfInsn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl BpfInsn {
    /// An instruction from its fields.
    pub const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
        BpfInsn { code, regs: (src << 4) | (dst & 0x0f), off, imm }
    }
}

const _: () = assert!(std::mem::size_of::<XdpUmemReg>() == 32);
const _: () = assert!(std::mem::size_of::<SockaddrXdp>() == 16);
const _: () = assert!(std::mem::size_of::<XdpMmapOffsets>() == 128);
const _: () = assert!(std::mem::size_of::<XdpStatistics>() == 48);
const _: () = assert!(std::mem::size_of::<XdpDesc>() == 16);
const _: () = assert!(std::mem::size_of::<BpfInsn>() == 8);
const _: () = assert!(std::mem::offset_of!(ProgLoadAttr, prog_name) == 48);
const _: () = assert!(std::mem::offset_of!(ProgLoadAttr, expected_attach_type) == 68);
const _: () = assert!(std::mem::offset_of!(MapUpdateAttr, flags) == 24);
