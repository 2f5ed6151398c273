//! The port: socket set-up, the receive and transmit rings, statistics.

use crate::config::{RingConfig, TruncatedFrames};
use crate::error::AfPacketError;
use crate::sys;
use sluice_packet::{Batch, Meta, Packet, PacketPool};
use std::ffi::CString;
use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Counters of a port, cumulative since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames delivered by [`AfPacketPort::recv_batch`].
    pub rx_packets: u64,
    /// Bytes of the frames delivered.
    pub rx_bytes: u64,
    /// Frames the kernel dropped because the receive ring was full (`PACKET_STATISTICS`
    /// `tp_drops`); refreshed by [`AfPacketPort::stats`].
    pub rx_kernel_drops: u64,
    /// Frames the kernel truncated to fit a ring frame (`tp_snaplen < tp_len`), delivered or
    /// dropped according to [`RingConfig::truncated`].
    pub rx_truncated: u64,
    /// Frames the host was sending on the interface (`PACKET_OUTGOING`) that reached the ring
    /// and were skipped; stays zero when `PACKET_IGNORE_OUTGOING` is in force.
    pub rx_outgoing_skipped: u64,
    /// Delivered frames whose transport checksum the sender left to offload
    /// (`TP_STATUS_CSUMNOTREADY`): their checksum field is not valid on the wire. Disable
    /// transmit checksum offload on the sending side (`ethtool -K <if> tx off`) to avoid them.
    pub rx_csum_not_ready: u64,
    /// Ring frames with an inconsistent header (never expected), skipped.
    pub rx_invalid: u64,
    /// Frames placed in the transmit ring and handed to the kernel.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Calls of [`AfPacketPort::send_batch`] that stopped early because the transmit ring was
    /// full.
    pub tx_ring_full: u64,
    /// Frames rejected by [`AfPacketPort::send_batch`] for being longer than
    /// [`AfPacketPort::max_tx_len`].
    pub tx_oversize: u64,
    /// Frames rejected for being shorter than an Ethernet header.
    pub tx_runt: u64,
    /// Transmit kicks (`sendto`) that failed with a transient error (`ENOBUFS`, `EAGAIN`);
    /// the frames stay in the ring and go with the next kick.
    pub tx_kick_errors: u64,
}

/// One ring inside the mapping.
#[derive(Debug)]
struct Ring {
    /// Byte offset of the ring in the mapping.
    offset: usize,
    frames: usize,
    frame_size: usize,
    block_size: usize,
    per_block: usize,
    /// Next frame to look at.
    head: usize,
}

impl Ring {
    fn new(offset: usize, frames: usize, cfg: &RingConfig) -> Ring {
        Ring {
            offset,
            frames,
            frame_size: cfg.frame_size,
            block_size: cfg.block_size,
            per_block: cfg.frames_per_block(),
            head: 0,
        }
    }

    /// Offset in the mapping of the frame at the head; frames never straddle blocks.
    fn head_offset(&self) -> usize {
        self.offset + (self.head / self.per_block) * self.block_size + (self.head % self.per_block) * self.frame_size
    }

    fn advance(&mut self) {
        self.head += 1;
        if self.head == self.frames {
            self.head = 0;
        }
    }
}

/// The shared mapping of both rings; unmapped on drop.
#[derive(Debug)]
struct RingMap {
    base: *mut u8,
    len: usize,
}

impl RingMap {
    /// Address of the frame at `offset`.
    fn frame(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset < self.len);
        // `wrapping_add` stays in bounds because every offset a `Ring` produces lies inside
        // the mapping (checked by the geometry validation at open), and it needs no `unsafe`.
        self.base.wrapping_add(offset)
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what a successful mmap returned; the mapping is
        // owned by this value alone and no reference into it outlives a method of the port.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}

/// The `tp_status` word of the frame at `frame`, for the status handshake with the kernel.
///
/// # Safety
/// `frame` must point at the start of a ring frame inside a live mapping; the returned
/// reference must not outlive the mapping.
unsafe fn status_word<'a>(frame: *mut u8) -> &'a AtomicU32 {
    // SAFETY: per the contract `frame` is the start of a ring frame: 16-byte aligned (mmap is
    // page aligned, frame and block sizes are multiples of 16) and valid for reads and writes
    // of the 32-byte header whose first field is `tp_status`. The kernel accesses that word
    // with atomic/ordered operations (smp_load_acquire / smp_store_release or WRITE_ONCE with
    // barriers) and we only access it through this atomic, so there is no mixed-size or
    // non-atomic race on it.
    unsafe { AtomicU32::from_ptr(frame.cast::<u32>()) }
}

/// A live Linux interface reached through an AF_PACKET socket with memory-mapped TPACKET_V2
/// receive and transmit rings.
///
/// The port receives the frames arriving on the interface (not the ones the host, or this
/// port, sends on it) and transmits raw Ethernet frames. It is `Send` (a worker thread can own
/// it) but not `Sync`: both rings are single-consumer/single-producer on the user side.
/// Dropping it unmaps the rings, closes the socket and so leaves promiscuous mode.
#[derive(Debug)]
pub struct AfPacketPort {
    // Field order matters for drop: the mapping goes before the socket is closed.
    map: RingMap,
    fd: OwnedFd,
    ifname: String,
    ifindex: u32,
    mtu: usize,
    rx: Ring,
    tx: Ring,
    max_tx_frame: usize,
    ignore_outgoing: bool,
    qdisc_bypass: bool,
    truncated: TruncatedFrames,
    tx_kick_pending: bool,
    scratch: Vec<u8>,
    stats: PortStats,
}

// SAFETY: the raw pointer refers to a mapping owned exclusively by this port (no other value
// holds it or copies of it), so moving the port to another thread moves sole access to the
// rings along with it; the socket descriptor is an ordinary thread-agnostic fd.
unsafe impl Send for AfPacketPort {}

impl AfPacketPort {
    /// Opens `ifname`: an AF_PACKET `SOCK_RAW` socket bound to the interface for every
    /// protocol (`ETH_P_ALL`), TPACKET_V2 receive and transmit rings mapped into memory,
    /// `PACKET_IGNORE_OUTGOING` set (on kernels before 4.20 outgoing frames are filtered in
    /// [`recv_batch`](Self::recv_batch) instead), `PACKET_LOSS` set (a frame the kernel
    /// refuses to send is discarded instead of blocking the ring), `PACKET_QDISC_BYPASS` when
    /// asked for and available, and the interface in promiscuous mode when asked for.
    ///
    /// Needs `CAP_NET_RAW` (and `CAP_NET_ADMIN` for promiscuous mode); the interface should be
    /// up. The rings are set up before the socket is bound, so no frame is ever queued outside
    /// them.
    pub fn open(ifname: &str, cfg: &RingConfig) -> Result<AfPacketPort, AfPacketError> {
        let cname = sluice_netif::check_name(ifname)
            .map_err(|reason| AfPacketError::InvalidName { ifname: ifname.to_string(), reason })?;

        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = usize::try_from(page).map_err(|_| AfPacketError::last_os(ifname, "sysconf(_SC_PAGESIZE)"))?;
        cfg.validate(page).map_err(|reason| AfPacketError::Config { ifname: ifname.to_string(), reason })?;
        let map_len = cfg.map_len().ok_or_else(|| AfPacketError::Config {
            ifname: ifname.to_string(),
            reason: "ring size overflows".to_string(),
        })?;
        let rx_len = cfg.rx_len().unwrap_or(0);

        let ifindex = sluice_netif::index(&cname).map_err(|e| AfPacketError::syscall(ifname, "if_nametoindex", e))?;

        // Protocol 0: the socket receives nothing until it is bound with ETH_P_ALL below,
        // after the rings exist.
        // SAFETY: plain syscall with integer arguments.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(AfPacketError::last_os(ifname, "socket(AF_PACKET, SOCK_RAW)"));
        }
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        setsockopt(&fd, ifname, sys::PACKET_VERSION, &sys::TPACKET_V2, "setsockopt(PACKET_VERSION)")?;
        setsockopt(&fd, ifname, sys::PACKET_LOSS, &1, "setsockopt(PACKET_LOSS)")?;
        let ignore_outgoing =
            optional(setsockopt(&fd, ifname, sys::PACKET_IGNORE_OUTGOING, &1, "setsockopt(PACKET_IGNORE_OUTGOING)"))?;
        let qdisc_bypass = cfg.qdisc_bypass
            && optional(setsockopt(&fd, ifname, sys::PACKET_QDISC_BYPASS, &1, "setsockopt(PACKET_QDISC_BYPASS)"))?;

        // `validate` checked that every field fits in 32 bits.
        let req = |frames: usize| sys::TpacketReq {
            tp_block_size: cfg.block_size as u32,
            tp_block_nr: (frames / cfg.frames_per_block()) as u32,
            tp_frame_size: cfg.frame_size as u32,
            tp_frame_nr: frames as u32,
        };
        setsockopt(&fd, ifname, sys::PACKET_RX_RING, &req(cfg.rx_frames), "setsockopt(PACKET_RX_RING)")?;
        setsockopt(&fd, ifname, sys::PACKET_TX_RING, &req(cfg.tx_frames), "setsockopt(PACKET_TX_RING)")?;

        // SAFETY: requesting a fresh shared mapping of the socket's rings (RX ring first, then
        // TX ring, as the kernel lays them out); no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(AfPacketError::last_os(ifname, "mmap"));
        }
        let map = RingMap { base: base.cast(), len: map_len };

        // SAFETY: sockaddr_ll is a plain C struct for which all-zero bytes are valid.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and the length passed is its size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                ptr::addr_of!(sll).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(AfPacketError::last_os(ifname, "bind"));
        }

        if cfg.promiscuous {
            let mreq = sys::PacketMreq {
                mr_ifindex: ifindex as i32,
                mr_type: sys::PACKET_MR_PROMISC,
                mr_alen: 0,
                mr_address: [0; 8],
            };
            setsockopt(&fd, ifname, sys::PACKET_ADD_MEMBERSHIP, &mreq, "setsockopt(PACKET_ADD_MEMBERSHIP)")?;
        }

        let mtu = interface_mtu(ifname, &cname)?;
        Ok(AfPacketPort {
            map,
            fd,
            ifname: ifname.to_string(),
            ifindex,
            mtu,
            rx: Ring::new(0, cfg.rx_frames, cfg),
            tx: Ring::new(rx_len, cfg.tx_frames, cfg),
            max_tx_frame: cfg.max_tx_frame(),
            ignore_outgoing,
            qdisc_bypass,
            truncated: cfg.truncated,
            tx_kick_pending: false,
            scratch: Vec::with_capacity(cfg.frame_size + sys::VLAN_HLEN),
            stats: PortStats::default(),
        })
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The interface MTU read at open (or by the last [`refresh_mtu`](Self::refresh_mtu)).
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Reads the interface MTU again (after it was changed) and returns it.
    pub fn refresh_mtu(&mut self) -> Result<usize, AfPacketError> {
        let cname = CString::new(self.ifname.as_str())
            .map_err(|_| AfPacketError::InvalidName { ifname: self.ifname.clone(), reason: "contains a NUL byte" })?;
        self.mtu = interface_mtu(&self.ifname, &cname)?;
        Ok(self.mtu)
    }

    /// Whether the kernel filters outgoing frames (`PACKET_IGNORE_OUTGOING`, Linux ≥ 4.20);
    /// when not, [`recv_batch`](Self::recv_batch) skips them itself.
    pub fn ignore_outgoing_active(&self) -> bool {
        self.ignore_outgoing
    }

    /// Whether transmitted frames bypass the queueing discipline (`PACKET_QDISC_BYPASS`).
    pub fn qdisc_bypass_active(&self) -> bool {
        self.qdisc_bypass
    }

    /// Longest untagged frame [`send_batch`](Self::send_batch) accepts: the ring frame
    /// capacity, capped at MTU + 14 (the kernel's own limit). A frame tagged with 802.1Q
    /// (ethertype 0x8100) may be 4 bytes longer, within the ring frame capacity.
    pub fn max_tx_len(&self) -> usize {
        self.max_tx_frame.min(self.mtu + sys::ETH_HLEN)
    }

    fn max_tx_len_of(&self, frame: &[u8]) -> usize {
        let tagged = frame.len() >= sys::ETH_HLEN && frame[12..14] == [0x81, 0x00];
        let mtu_limit = self.mtu + sys::ETH_HLEN + if tagged { sys::VLAN_HLEN } else { 0 };
        self.max_tx_frame.min(mtu_limit)
    }

    /// Copies up to `max` received frames out of the receive ring into packets of `pool`,
    /// appended to `out`, and hands their ring slots back to the kernel. Never blocks; returns
    /// how many packets were appended (0 when nothing is waiting).
    ///
    /// Each packet's `meta.ts_ns` is the kernel's receive timestamp (ns since the Unix epoch);
    /// the rest of `meta` is default (`in_port` is the caller's to set). A VLAN tag the kernel
    /// stripped into the ring header is put back into the frame, so packets are as they were
    /// on the wire. Frames the kernel truncated are counted and handled per
    /// [`RingConfig::truncated`]; frames the host was sending are skipped (and counted) if the
    /// kernel did not filter them.
    pub fn recv_batch(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<usize, AfPacketError> {
        let mut delivered = 0;
        // Bounded by the ring size so that a stream of skipped frames cannot keep us here.
        let mut visited = 0;
        while delivered < max && visited < self.rx.frames {
            let frame = self.map.frame(self.rx.head_offset());
            // SAFETY: `frame` is the start of an RX ring frame inside the live mapping.
            let status = unsafe { status_word(frame) };
            // Acquire pairs with the kernel's release of the frame: its contents are complete.
            let st = status.load(Ordering::Acquire);
            if st & sys::TP_STATUS_USER == 0 {
                break;
            }
            visited += 1;
            if let Some(pkt) = self.take_rx_frame(frame, st, pool) {
                out.push(pkt);
                delivered += 1;
            }
            // Release: our reads of the frame happen before the kernel may overwrite it.
            status.store(sys::TP_STATUS_KERNEL, Ordering::Release);
            self.rx.advance();
        }
        Ok(delivered)
    }

    /// Reads a user-owned RX frame; `None` when it is to be skipped.
    fn take_rx_frame(&mut self, frame: *mut u8, st: u32, pool: &PacketPool) -> Option<Packet> {
        // SAFETY: the frame is owned by user space (TP_STATUS_USER was observed with Acquire),
        // so the kernel does not write it until we give it back; the 32-byte header lies inside
        // the frame (frame_size >= 128) and is 16-byte aligned. Volatile because the memory is
        // shared with the kernel.
        let hdr = unsafe { ptr::read_volatile(frame.cast::<sys::Tpacket2Hdr>()) };
        // SAFETY: as above; the sockaddr_ll follows the header inside the frame.
        let pkttype = unsafe { ptr::read_volatile(frame.add(sys::RX_SLL_OFFSET + sys::SLL_PKTTYPE_OFFSET)) };
        if pkttype == sys::PACKET_OUTGOING {
            self.stats.rx_outgoing_skipped += 1;
            return None;
        }
        let mac = usize::from(hdr.tp_mac);
        let snap = hdr.tp_snaplen as usize;
        if mac < sys::TPACKET2_HDRLEN || mac + snap > self.rx.frame_size {
            self.stats.rx_invalid += 1;
            return None;
        }
        if (snap as u64) < u64::from(hdr.tp_len) {
            self.stats.rx_truncated += 1;
            if self.truncated == TruncatedFrames::Drop {
                return None;
            }
        }
        if st & sys::TP_STATUS_CSUMNOTREADY != 0 {
            self.stats.rx_csum_not_ready += 1;
        }
        // SAFETY: `mac + snap <= frame_size` was checked, so the range lies inside this frame,
        // which the kernel does not modify while we own it; the slice is dropped before the
        // frame is handed back.
        let data = unsafe { std::slice::from_raw_parts(frame.add(mac).cast_const(), snap) };
        let meta = Meta { ts_ns: u64::from(hdr.tp_sec) * 1_000_000_000 + u64::from(hdr.tp_nsec), ..Meta::default() };
        let pkt = if st & sys::TP_STATUS_VLAN_VALID != 0 && snap >= 12 {
            let tpid = if st & sys::TP_STATUS_VLAN_TPID_VALID != 0 && hdr.tp_vlan_tpid != 0 {
                hdr.tp_vlan_tpid
            } else {
                0x8100
            };
            self.scratch.clear();
            self.scratch.extend_from_slice(&data[..12]);
            self.scratch.extend_from_slice(&tpid.to_be_bytes());
            self.scratch.extend_from_slice(&hdr.tp_vlan_tci.to_be_bytes());
            self.scratch.extend_from_slice(&data[12..]);
            pool.packet(&self.scratch, meta)
        } else {
            pool.packet(data, meta)
        };
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += pkt.len() as u64;
        Some(pkt)
    }

    /// Whether a received frame is waiting in the ring.
    pub fn rx_ready(&self) -> bool {
        let frame = self.map.frame(self.rx.head_offset());
        // SAFETY: `frame` is the start of an RX ring frame inside the live mapping.
        let status = unsafe { status_word(frame) };
        status.load(Ordering::Acquire) & sys::TP_STATUS_USER != 0
    }

    /// Places frames into the transmit ring, in order, then kicks the kernel once (a
    /// non-blocking `sendto` with no buffer) to send everything placed.
    ///
    /// Returns `n`, the number of leading packets of `pkts` the port is done with: each was
    /// either queued for transmission (counted in `tx_packets`) or rejected because it was
    /// longer than [`max_tx_len`](Self::max_tx_len) (`tx_oversize`) or shorter than an
    /// Ethernet header (`tx_runt`). When `n < pkts.len()` the ring was full (`tx_ring_full`):
    /// `pkts[n..]` were not touched and the caller decides to retry them later or drop them.
    ///
    /// A kick failing with a transient error (`ENOBUFS`, `EAGAIN`) is counted and retried at
    /// the next call (an empty `pkts` just retries it); any other failure (e.g. `ENETDOWN`) is
    /// returned as an error, and the frames already placed stay queued in the ring for the
    /// next successful kick. The packets are only read; recycling them is the caller's job.
    pub fn send_batch(&mut self, pkts: &[Packet]) -> Result<usize, AfPacketError> {
        let mut done = 0;
        let mut queued = 0;
        for pkt in pkts {
            let data = pkt.data();
            if data.len() < sys::ETH_HLEN {
                self.stats.tx_runt += 1;
                done += 1;
                continue;
            }
            if data.len() > self.max_tx_len_of(data) {
                self.stats.tx_oversize += 1;
                done += 1;
                continue;
            }
            let frame = self.map.frame(self.tx.head_offset());
            // SAFETY: `frame` is the start of a TX ring frame inside the live mapping.
            let status = unsafe { status_word(frame) };
            // Acquire pairs with the kernel's release of the slot once it has sent the frame.
            let st = status.load(Ordering::Acquire);
            // TP_STATUS_WRONG_FORMAT (a frame the kernel refused; not set while PACKET_LOSS is
            // on) leaves the slot to us like TP_STATUS_AVAILABLE.
            if st & (sys::TP_STATUS_SEND_REQUEST | sys::TP_STATUS_SENDING) != 0 {
                // The oldest slot is still queued or in flight: the ring is full.
                self.stats.tx_ring_full += 1;
                break;
            }
            // SAFETY: the slot is available, so the kernel neither reads nor writes it until we
            // set TP_STATUS_SEND_REQUEST. The data fits: `data.len() <= max_tx_frame =
            // frame_size - TX_DATA_OFFSET`. The header fields are inside the frame and aligned.
            // `data` is an ordinary Rust buffer, so the ranges cannot overlap.
            unsafe {
                ptr::copy_nonoverlapping(data.as_ptr(), frame.add(sys::TX_DATA_OFFSET), data.len());
                let hdr = frame.cast::<sys::Tpacket2Hdr>();
                ptr::write_volatile(ptr::addr_of_mut!((*hdr).tp_len), data.len() as u32);
                ptr::write_volatile(ptr::addr_of_mut!((*hdr).tp_snaplen), data.len() as u32);
            }
            // Release: the frame bytes and length are visible before the kernel sees the request.
            status.store(sys::TP_STATUS_SEND_REQUEST, Ordering::Release);
            self.tx.advance();
            queued += 1;
            done += 1;
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += data.len() as u64;
        }
        if queued > 0 || self.tx_kick_pending {
            self.kick()?;
        }
        Ok(done)
    }

    /// Asks the kernel to send every frame marked `TP_STATUS_SEND_REQUEST`, without waiting.
    fn kick(&mut self) -> Result<(), AfPacketError> {
        // SAFETY: a null buffer of length 0 with a null address is the documented way to make
        // the kernel flush a packet socket's TX ring; nothing is read from user memory except
        // the ring itself.
        let r = unsafe { libc::sendto(self.fd.as_raw_fd(), ptr::null(), 0, libc::MSG_DONTWAIT, ptr::null(), 0) };
        if r >= 0 {
            self.tx_kick_pending = false;
            return Ok(());
        }
        let err = io::Error::last_os_error();
        self.tx_kick_pending = true;
        match err.raw_os_error() {
            Some(libc::ENOBUFS | libc::EAGAIN | libc::EINTR) => {
                self.stats.tx_kick_errors += 1;
                Ok(())
            }
            _ => Err(AfPacketError::syscall(&self.ifname, "sendto", err)),
        }
    }

    /// Waits up to `timeout` (rounded up to whole milliseconds) for a received frame, with
    /// poll(2). Returns `Ok(true)` when one is waiting, `Ok(false)` on timeout or when a
    /// signal interrupted the wait. A pending socket error (e.g. `ENETDOWN` after the
    /// interface went down) is returned as an error and cleared.
    pub fn poll_readable(&self, timeout: Duration) -> Result<bool, AfPacketError> {
        if self.rx_ready() {
            return Ok(true);
        }
        let ms = timeout.as_nanos().div_ceil(1_000_000);
        let ms = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `pfd` is a valid pollfd and the count passed is 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                return Ok(false);
            }
            return Err(AfPacketError::syscall(&self.ifname, "poll", err));
        }
        if pfd.revents & libc::POLLNVAL != 0 {
            return Err(AfPacketError::syscall(&self.ifname, "poll", io::Error::from_raw_os_error(libc::EBADF)));
        }
        if pfd.revents & libc::POLLERR != 0 {
            let e = self.take_socket_error()?;
            if e != 0 {
                return Err(AfPacketError::syscall(
                    &self.ifname,
                    "poll (socket error)",
                    io::Error::from_raw_os_error(e),
                ));
            }
        }
        Ok(self.rx_ready())
    }

    /// Reads and clears the socket's pending error (`SO_ERROR`).
    fn take_socket_error(&self) -> Result<libc::c_int, AfPacketError> {
        let mut e: libc::c_int = 0;
        let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `e` and `len` are valid for writes and `len` holds the size of `e`.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                ptr::addr_of_mut!(e).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(AfPacketError::last_os(&self.ifname, "getsockopt(SO_ERROR)"));
        }
        Ok(e)
    }

    /// The counters, after adding the kernel's ring drops since the last call
    /// (`PACKET_STATISTICS`, which the kernel resets on every read).
    pub fn stats(&mut self) -> Result<PortStats, AfPacketError> {
        let mut ks = sys::TpacketStats::default();
        let mut len = mem::size_of::<sys::TpacketStats>() as libc::socklen_t;
        // SAFETY: `ks` and `len` are valid for writes and `len` holds the size of `ks`, which
        // is the TPACKET_V2 statistics layout.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                sys::SOL_PACKET,
                sys::PACKET_STATISTICS,
                ptr::addr_of_mut!(ks).cast(),
                &mut len,
            )
        };
        if r < 0 {
            return Err(AfPacketError::last_os(&self.ifname, "getsockopt(PACKET_STATISTICS)"));
        }
        self.stats.rx_kernel_drops += u64::from(ks.tp_drops);
        Ok(self.stats)
    }

    /// The counters as they are, without a system call (`rx_kernel_drops` as of the last
    /// [`stats`](Self::stats)).
    pub fn counters(&self) -> PortStats {
        self.stats
    }
}

impl AsRawFd for AfPacketPort {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for AfPacketPort {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Sets a `SOL_PACKET` option to `value`.
fn setsockopt<T>(
    fd: &OwnedFd,
    ifname: &str,
    opt: libc::c_int,
    value: &T,
    what: &'static str,
) -> Result<(), AfPacketError> {
    // SAFETY: `value` points at a live, initialised `T` and the length passed is its size; the
    // kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            sys::SOL_PACKET,
            opt,
            ptr::from_ref(value).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(AfPacketError::last_os(ifname, what))
    } else {
        Ok(())
    }
}

/// Turns "option not supported by this kernel" into `Ok(false)`.
fn optional(r: Result<(), AfPacketError>) -> Result<bool, AfPacketError> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOPROTOOPT | libc::EINVAL)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The MTU of the interface (`SIOCGIFMTU`), the error naming the interface.
fn interface_mtu(ifname: &str, cname: &CString) -> Result<usize, AfPacketError> {
    sluice_netif::mtu(cname).map_err(|e| AfPacketError::syscall(ifname, "ioctl(SIOCGIFMTU)", e))
}

/// Waits until one of `ports` has a frame ready or `timeout` passes (microsecond resolution,
/// unlike [`AfPacketPort::poll_readable`]'s milliseconds). Returns the index of the first ready
/// port, or `None` on timeout or interruption.
pub fn poll_any(ports: &[&AfPacketPort], timeout: Duration) -> Result<Option<usize>, AfPacketError> {
    if let Some(i) = ports.iter().position(|p| p.rx_ready()) {
        return Ok(Some(i));
    }
    let fds: Vec<RawFd> = ports.iter().map(|p| p.fd.as_raw_fd()).collect();
    if let Err(e) = sluice_netif::wait_readable(&fds, timeout) {
        return Err(AfPacketError::syscall(ports.first().map_or("", |p| p.ifname.as_str()), "ppoll", e));
    }
    Ok(ports.iter().position(|p| p.rx_ready()))
}
