//! The XDP program that hands an interface's frames to the socket: one XSKMAP (queue index →
//! socket) and six instructions, `return bpf_redirect_map(&xsks, ctx->rx_queue_index,
//! XDP_PASS)`, loaded and attached with bpf(2) directly, so no C toolchain, clang or libbpf
//! is needed to build or run Sluice. Frames of a queue without a socket go to the kernel's
//! stack (the `XDP_PASS` fallback of `bpf_redirect_map`, Linux ≥ 5.3).
//!
//! The program is attached through a BPF link: closing the link's descriptor (the port is
//! dropped, or the process dies, even by SIGKILL) detaches it, so a crashed bridge never
//! leaves an interface black-holed.

use crate::sys::{self, BpfInsn};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// How the XDP program is attached to the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// Driver (native) mode when the driver has it, generic mode otherwise.
    #[default]
    Auto,
    /// Native XDP in the driver (veth, most 10G+ NICs): frames reach the program before an
    /// skb exists.
    Driver,
    /// Generic XDP on the skb, for any driver; slower.
    Generic,
}

impl std::fmt::Display for AttachMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AttachMode::Auto => "auto",
            AttachMode::Driver => "driver",
            AttachMode::Generic => "generic",
        })
    }
}

impl std::str::FromStr for AttachMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AttachMode::Auto),
            "driver" | "native" | "drv" => Ok(AttachMode::Driver),
            "generic" | "skb" => Ok(AttachMode::Generic),
            other => Err(format!("unknown XDP mode {other:?} (auto, driver or generic)")),
        }
    }
}

/// The loaded program, its map and its attachment; dropping it detaches the program.
#[derive(Debug)]
pub(crate) struct Redirect {
    // Field order is drop order: detach first, then release the program and the map.
    _link: OwnedFd,
    _prog: OwnedFd,
    _map: OwnedFd,
    /// The mode the program is attached in (never `Auto`).
    pub(crate) mode: AttachMode,
}

/// Calls bpf(2) with `attr`.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a live, initialised `bpf_attr` prefix of the size passed; the kernel
    // reads it (and for some commands writes into it) within the call only. Pointers inside it
    // were set by the callers to buffers that outlive the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), std::mem::size_of::<T>()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        libc::c_int::try_from(r).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
    }
}

fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` is a descriptor bpf(2) has just created; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The program's instructions, referring to the map by descriptor.
fn program(map_fd: libc::c_int) -> [BpfInsn; 6] {
    [
        // r2 = ((struct xdp_md *)r1)->rx_queue_index   (BPF_LDX | BPF_MEM | BPF_W)
        BpfInsn::new(0x61, 2, 1, sys::XDP_MD_RX_QUEUE_INDEX, 0),
        // r1 = the XSKMAP                               (BPF_LD | BPF_DW | BPF_IMM, two slots)
        BpfInsn::new(0x18, 1, sys::BPF_PSEUDO_MAP_FD, 0, map_fd),
        BpfInsn::new(0, 0, 0, 0, 0),
        // r3 = XDP_PASS: the verdict when the queue has no socket  (BPF_ALU64 | BPF_MOV | BPF_K)
        BpfInsn::new(0xb7, 3, 0, 0, sys::XDP_PASS),
        // r0 = bpf_redirect_map(r1, r2, r3)            (BPF_JMP | BPF_CALL)
        BpfInsn::new(0x85, 0, 0, 0, sys::BPF_FUNC_REDIRECT_MAP),
        // return r0                                      (BPF_JMP | BPF_EXIT)
        BpfInsn::new(0x95, 0, 0, 0, 0),
    ]
}

/// Loads the program over a new XSKMAP holding `socket` at index `queue`, and attaches it to
/// `ifindex` in `mode`. The socket is in the map before the program is attached, so no frame
/// of that queue reaches the stack once the port is open.
pub(crate) fn attach_redirect(
    ifname: &str,
    ifindex: u32,
    queue: u32,
    socket: &OwnedFd,
    mode: AttachMode,
) -> Result<Redirect, crate::AfXdpError> {
    let err = |what, e| crate::AfXdpError::syscall(ifname, what, e);
    let mut name = [0u8; 16];
    name[..9].copy_from_slice(b"sluice_xs");
    let mut create = sys::MapCreateAttr {
        map_type: sys::BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: queue.saturating_add(1),
        map_name: name,
        ..Default::default()
    };
    let map = owned(bpf(sys::BPF_MAP_CREATE, &mut create).map_err(|e| err("bpf(BPF_MAP_CREATE)", e))?);

    let key = queue;
    let value = u32::try_from(socket.as_raw_fd())
        .map_err(|_| err("bpf(BPF_MAP_UPDATE_ELEM)", io::ErrorKind::InvalidInput.into()))?;
    let mut update = sys::MapUpdateAttr {
        map_fd: map.as_raw_fd() as u32,
        key: std::ptr::addr_of!(key) as u64,
        value: std::ptr::addr_of!(value) as u64,
        ..Default::default()
    };
    bpf(sys::BPF_MAP_UPDATE_ELEM, &mut update).map_err(|e| err("bpf(BPF_MAP_UPDATE_ELEM)", e))?;

    let insns = program(map.as_raw_fd());
    // The program is ours (Apache-2.0) and calls no GPL-only helper.
    let license = b"Apache-2.0\0";
    let mut load = sys::ProgLoadAttr {
        prog_type: sys::BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name,
        ..Default::default()
    };
    let prog = match bpf(sys::BPF_PROG_LOAD, &mut load) {
        Ok(fd) => owned(fd),
        Err(e) => {
            // Load again with the verifier's log, to say why.
            let mut log = vec![0u8; 16 * 1024];
            load.log_level = 1;
            load.log_size = log.len() as u32;
            load.log_buf = log.as_mut_ptr() as u64;
            let _ = bpf(sys::BPF_PROG_LOAD, &mut load);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
            let e = if text.is_empty() { e } else { io::Error::new(e.kind(), format!("{e}; verifier: {text}")) };
            return Err(err("bpf(BPF_PROG_LOAD)", e));
        }
    };

    let modes: &[AttachMode] = match mode {
        AttachMode::Auto => &[AttachMode::Driver, AttachMode::Generic],
        AttachMode::Driver => &[AttachMode::Driver],
        AttachMode::Generic => &[AttachMode::Generic],
    };
    let mut last = None;
    for &m in modes {
        let mut link = sys::LinkCreateAttr {
            prog_fd: prog.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: sys::BPF_XDP,
            flags: if m == AttachMode::Driver { sys::XDP_FLAGS_DRV_MODE } else { sys::XDP_FLAGS_SKB_MODE },
            ..Default::default()
        };
        match bpf(sys::BPF_LINK_CREATE, &mut link) {
            Ok(fd) => return Ok(Redirect { _link: owned(fd), _prog: prog, _map: map, mode: m }),
            // Another program already there: no other mode will do better.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) || e.raw_os_error() == Some(libc::EEXIST) => {
                return Err(err("bpf(BPF_LINK_CREATE, BPF_XDP)", e))
            }
            Err(e) => last = Some(e),
        }
    }
    Err(err("bpf(BPF_LINK_CREATE, BPF_XDP)", last.unwrap_or_else(|| io::ErrorKind::Unsupported.into())))
}
