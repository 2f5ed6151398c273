//! The port: socket and UMEM set-up, receive and transmit, statistics.

use crate::bpf::{attach_redirect, AttachMode, Redirect};
use crate::error::AfXdpError;
use crate::ring::{Mapping, Ring};
use crate::sys::{self, XdpDesc};
use sluice_packet::{Batch, Meta, Packet, PacketPool};
use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::time::Duration;

/// The geometry of a port's UMEM and rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpConfig {
    /// Frames for receiving: the fill and RX rings have this many entries, so a burst of
    /// this many frames waits in the ring while Sluice is busy (8,192 by default: ~10 ms at
    /// 0.8 Mpps, what a root thread descheduled on a busy two-core machine needs). A power of
    /// two.
    pub rx_frames: u32,
    /// Frames for transmitting, and entries of the TX and completion rings. A power of two.
    pub tx_frames: u32,
    /// Bytes per frame: a power of two from 2048 to the page size. Frames longer than this
    /// are dropped by the kernel (counted in [`XdpStats::rx_dropped`]).
    pub frame_size: u32,
    /// How the XDP program is attached.
    pub mode: AttachMode,
    /// The interface's receive queue to bind (veth has one: 0).
    pub queue: u32,
}

impl Default for XdpConfig {
    fn default() -> Self {
        XdpConfig { rx_frames: 8192, tx_frames: 1024, frame_size: 2048, mode: AttachMode::Auto, queue: 0 }
    }
}

impl XdpConfig {
    fn validate(&self, page: usize) -> Result<(), String> {
        let pow2 = |v: u32| v != 0 && v.is_power_of_two();
        if !pow2(self.frame_size) || self.frame_size < 2048 || self.frame_size as usize > page {
            return Err(format!("frame size {} is not a power of two from 2048 to {page}", self.frame_size));
        }
        for (what, n) in [("receive", self.rx_frames), ("transmit", self.tx_frames)] {
            if !pow2(n) {
                return Err(format!("{n} {what} frames: not a power of two (each is also its rings' size)"));
            }
        }
        if (u64::from(self.rx_frames) + u64::from(self.tx_frames)) * u64::from(self.frame_size) > (1 << 32) {
            return Err("the UMEM would exceed 4 GiB".to_string());
        }
        Ok(())
    }

    /// Frames in the UMEM: receive frames first, then transmit frames.
    fn frames(&self) -> u32 {
        self.rx_frames + self.tx_frames
    }
}

/// Counters of a port, cumulative since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// Frames delivered by [`XdpPort::recv_batch`].
    pub rx_packets: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// RX descriptors pointing outside the UMEM (never expected), skipped.
    pub rx_invalid: u64,
    /// Frames queued for transmission.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Calls of [`XdpPort::send_batch`] that stopped early: no free frame or TX ring full.
    pub tx_ring_full: u64,
    /// Frames rejected for being longer than a frame or the interface's MTU allows.
    pub tx_oversize: u64,
    /// Frames rejected for being shorter than an Ethernet header.
    pub tx_runt: u64,
    /// Transmit kicks that failed with a transient error (`ENOBUFS`, `EBUSY`); the frames stay
    /// in the ring and go with the next kick.
    pub tx_kick_errors: u64,
    /// The kernel's counters (`XDP_STATISTICS`), refreshed by [`XdpPort::stats`]: frames
    /// dropped for any reason (e.g. longer than a frame) …
    pub rx_dropped: u64,
    /// … dropped because the RX ring was full …
    pub rx_ring_full: u64,
    /// … and times the fill ring was empty when a frame arrived.
    pub rx_fill_ring_empty: u64,
}

/// An AF_XDP socket bound to one queue of one interface, with its own UMEM, and the XDP
/// program that redirects that queue's frames to it. Frames are copied into and out of the
/// UMEM (the chain's packets live in [`PacketPool`] buffers), so the port works in copy mode
/// on any driver and in zero-copy mode where the driver has it.
pub struct XdpPort {
    // Field order is drop order: detach the program before the socket goes.
    redirect: Redirect,
    rx: Ring<XdpDesc>,
    tx: Ring<XdpDesc>,
    fill: Ring<u64>,
    completion: Ring<u64>,
    fd: OwnedFd,
    umem: Mapping,
    /// Transmit frames not in flight.
    free: Vec<u64>,
    frame_size: u32,
    ifname: String,
    ifindex: u32,
    mtu: usize,
    zero_copy: bool,
    stats: XdpStats,
}

// SAFETY: the raw pointers all point into mappings owned by the port; nothing else in the
// process refers to them, so moving the port to another thread is sound (it is not `Sync`:
// the rings have a single user-space side).
unsafe impl Send for XdpPort {}

impl std::fmt::Debug for XdpPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpPort")
            .field("ifname", &self.ifname)
            .field("mode", &self.redirect.mode)
            .field("zero_copy", &self.zero_copy)
            .finish()
    }
}

impl XdpPort {
    /// Opens `ifname`: registers a UMEM, creates the four rings, binds queue
    /// [`XdpConfig::queue`] and attaches the redirecting XDP program. Needs root (or
    /// CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF); the interface should be up. Fails if another XDP
    /// program is attached to the interface.
    pub fn open(ifname: &str, cfg: &XdpConfig) -> Result<XdpPort, AfXdpError> {
        let cname = sluice_netif::check_name(ifname)
            .map_err(|reason| AfXdpError::InvalidName { ifname: ifname.to_string(), reason })?;
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        cfg.validate(page).map_err(|reason| AfXdpError::Config { ifname: ifname.to_string(), reason })?;
        let ifindex = sluice_netif::index(&cname).map_err(|e| AfXdpError::syscall(ifname, "if_nametoindex", e))?;
        let mtu = sluice_netif::mtu(&cname).map_err(|e| AfXdpError::syscall(ifname, "ioctl(SIOCGIFMTU)", e))?;
        let err = |what| move |e| AfXdpError::syscall(ifname, what, e);

        // SAFETY: plain syscall with integer arguments.
        let raw = unsafe { libc::socket(sys::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(AfXdpError::last_os(ifname, "socket(AF_XDP)"));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let umem_len = cfg.frames() as usize * cfg.frame_size as usize;
        let umem = Mapping::new(umem_len, None, 0).map_err(err("mmap(UMEM)"))?;
        let reg = sys::XdpUmemReg {
            addr: umem.base as u64,
            len: umem_len as u64,
            chunk_size: cfg.frame_size,
            ..Default::default()
        };
        setsockopt(&fd, sys::XDP_UMEM_REG, &reg).map_err(err("setsockopt(XDP_UMEM_REG)"))?;
        for (opt, size, what) in [
            (sys::XDP_UMEM_FILL_RING, cfg.rx_frames, "setsockopt(XDP_UMEM_FILL_RING)"),
            (sys::XDP_UMEM_COMPLETION_RING, cfg.tx_frames, "setsockopt(XDP_UMEM_COMPLETION_RING)"),
            (sys::XDP_RX_RING, cfg.rx_frames, "setsockopt(XDP_RX_RING)"),
            (sys::XDP_TX_RING, cfg.tx_frames, "setsockopt(XDP_TX_RING)"),
        ] {
            setsockopt(&fd, opt, &size).map_err(err(what))?;
        }
        let mut off = sys::XdpMmapOffsets::default();
        getsockopt(&fd, sys::XDP_MMAP_OFFSETS, &mut off).map_err(err("getsockopt(XDP_MMAP_OFFSETS)"))?;

        let (rn, tn) = (cfg.rx_frames, cfg.tx_frames);
        let raw_fd = Some(fd.as_raw_fd());
        let map = |o: &sys::XdpRingOffset, n: u32, entry: usize, pgoff, what| {
            let len = o.desc as usize + n as usize * entry;
            Mapping::new(len, raw_fd, pgoff).map_err(err(what))
        };
        let bad =
            || AfXdpError::Config { ifname: ifname.to_string(), reason: "the kernel's ring offsets do not fit".into() };
        let desc = mem::size_of::<XdpDesc>();
        // SAFETY: each mapping is the ring at the offset XDP_MMAP_OFFSETS gave, with the
        // number of entries it was created with.
        let (rx, tx, mut fill, completion) = unsafe {
            (
                Ring::new(map(&off.rx, rn, desc, sys::XDP_PGOFF_RX_RING, "mmap(RX ring)")?, &off.rx, rn)
                    .ok_or_else(bad)?,
                Ring::new(map(&off.tx, tn, desc, sys::XDP_PGOFF_TX_RING, "mmap(TX ring)")?, &off.tx, tn)
                    .ok_or_else(bad)?,
                Ring::<u64>::new(
                    map(&off.fill, rn, 8, sys::XDP_UMEM_PGOFF_FILL_RING, "mmap(fill ring)")?,
                    &off.fill,
                    rn,
                )
                .ok_or_else(bad)?,
                Ring::<u64>::new(
                    map(&off.completion, tn, 8, sys::XDP_UMEM_PGOFF_COMPLETION_RING, "mmap(completion ring)")?,
                    &off.completion,
                    tn,
                )
                .ok_or_else(bad)?,
            )
        };

        // The receive frames wait in the fill ring for arriving frames; the rest are for
        // transmission.
        let rx_frames = cfg.rx_frames;
        let got = fill.reserve(rx_frames);
        for i in 0..got {
            fill.put(i, u64::from(i) * u64::from(cfg.frame_size));
        }
        fill.submit(got);
        let free: Vec<u64> = (rx_frames..cfg.frames()).map(|i| u64::from(i) * u64::from(cfg.frame_size)).collect();

        let mut flags = sys::XDP_USE_NEED_WAKEUP;
        if cfg.mode == AttachMode::Generic {
            flags |= sys::XDP_COPY;
        }
        let addr =
            sys::SockaddrXdp { family: sys::AF_XDP as u16, flags, ifindex, queue_id: cfg.queue, shared_umem_fd: 0 };
        // SAFETY: `addr` is a valid sockaddr_xdp and the length passed is its size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                ptr::addr_of!(addr).cast(),
                mem::size_of::<sys::SockaddrXdp>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(AfXdpError::last_os(ifname, "bind(AF_XDP)"));
        }
        let mut options = 0u32;
        getsockopt(&fd, sys::XDP_OPTIONS, &mut options).map_err(err("getsockopt(XDP_OPTIONS)"))?;
        let redirect = attach_redirect(ifname, ifindex, cfg.queue, &fd, cfg.mode)?;
        Ok(XdpPort {
            redirect,
            rx,
            tx,
            fill,
            completion,
            fd,
            umem,
            free,
            frame_size: cfg.frame_size,
            ifname: ifname.to_string(),
            ifindex,
            mtu,
            zero_copy: options & sys::XDP_OPTIONS_ZEROCOPY != 0,
            stats: XdpStats::default(),
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

    /// The mode the XDP program runs in (driver or generic).
    pub fn mode(&self) -> AttachMode {
        self.redirect.mode
    }

    /// Whether the socket runs in zero-copy mode (the driver supports it); copy mode otherwise.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The longest frame [`send_batch`](Self::send_batch) accepts: the MTU plus an Ethernet
    /// header and one VLAN tag, at most a UMEM frame.
    pub fn max_tx_len(&self) -> usize {
        (self.mtu + 18).min(self.frame_size as usize)
    }

    /// Copies up to `max` received frames into packets from `pool`, appended to `out`, and
    /// gives their UMEM frames back to the fill ring. Never blocks; returns how many packets
    /// were appended. Each packet's `meta.ts_ns` is the time of this call (AF_XDP has no
    /// receive timestamp); the rest of `meta` is default.
    pub fn recv_batch(&mut self, pool: &PacketPool, out: &mut Batch, max: usize) -> Result<usize, AfXdpError> {
        let n = self.rx.peek(u32::try_from(max).unwrap_or(u32::MAX));
        let mut delivered = 0;
        if n > 0 {
            let meta = Meta { ts_ns: now_ns(), ..Meta::default() };
            // Always room: the fill ring holds every receive frame (checked at open), and
            // these `n` are out of it.
            let room = self.fill.reserve(n);
            let chunk_mask = !(u64::from(self.frame_size) - 1);
            for i in 0..n {
                let d = self.rx.get(i);
                let (start, len) = (d.addr as usize, d.len as usize);
                if start.checked_add(len).is_some_and(|end| end <= self.umem.len) {
                    // SAFETY: the range lies inside the UMEM (checked) and the frame belongs to
                    // us until it goes back to the fill ring below; the slice is dropped
                    // before that.
                    let data = unsafe { std::slice::from_raw_parts(self.umem.base.add(start).cast_const(), len) };
                    out.push(pool.packet(data, meta));
                    self.stats.rx_packets += 1;
                    self.stats.rx_bytes += len as u64;
                    delivered += 1;
                } else {
                    self.stats.rx_invalid += 1;
                }
                if i < room {
                    self.fill.put(i, d.addr & chunk_mask);
                }
            }
            self.rx.release(n);
            self.fill.submit(room);
        }
        if self.fill.needs_wakeup() {
            self.wake_rx();
        }
        Ok(delivered)
    }

    /// Whether a received frame is waiting.
    pub fn rx_ready(&self) -> bool {
        self.rx.ready()
    }

    fn wake_rx(&self) {
        // SAFETY: a zero-length, non-blocking recvfrom with no buffer only makes the kernel
        // process the fill ring; no user memory is written.
        unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                ptr::null_mut(),
                ptr::null_mut(),
            );
        }
    }

    /// Copies frames into free UMEM frames and the TX ring, in order, then kicks the kernel.
    /// Returns `n`, the number of leading packets the port is done with (queued, or rejected
    /// as too long or too short, counted). When `n < pkts.len()` there was no free frame or
    /// TX slot (`tx_ring_full`): `pkts[n..]` were not touched and the caller retries or drops
    /// them. A kick failing with a transient error is counted and retried at the next call;
    /// any other failure (e.g. `ENETDOWN`) is returned.
    pub fn send_batch(&mut self, pkts: &[Packet]) -> Result<usize, AfXdpError> {
        self.reclaim();
        let want = u32::try_from(pkts.len()).unwrap_or(u32::MAX).min(self.free.len() as u32);
        let slots = self.tx.reserve(want);
        let max_len = self.max_tx_len();
        let (mut done, mut queued) = (0usize, 0u32);
        for pkt in pkts {
            let data = pkt.data();
            if data.len() < 14 {
                self.stats.tx_runt += 1;
                done += 1;
                continue;
            }
            if data.len() > max_len {
                self.stats.tx_oversize += 1;
                done += 1;
                continue;
            }
            if queued == slots {
                self.stats.tx_ring_full += 1;
                break;
            }
            let Some(addr) = self.free.pop() else { break };
            // SAFETY: `addr` is the start of a free frame inside the UMEM (only such addresses
            // enter `free`), `data.len() <= frame_size`, and the kernel does not touch a frame
            // before its descriptor is submitted. `data` is a Rust buffer: no overlap.
            unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.umem.base.add(addr as usize), data.len()) };
            self.tx.put(queued, XdpDesc { addr, len: data.len() as u32, options: 0 });
            queued += 1;
            done += 1;
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += data.len() as u64;
        }
        if queued > 0 {
            self.tx.submit(queued);
        }
        if self.tx.outstanding() {
            self.kick_tx()?;
        }
        Ok(done)
    }

    /// Frames the kernel has sent go back to the free list.
    fn reclaim(&mut self) {
        let n = self.completion.peek(u32::MAX);
        for i in 0..n {
            self.free.push(self.completion.get(i));
        }
        self.completion.release(n);
    }

    /// Makes the kernel send what the TX ring holds. In copy mode each call sends a bounded
    /// number of frames and says `EAGAIN` while more wait, so it repeats (a bounded number of
    /// times).
    fn kick_tx(&mut self) -> Result<(), AfXdpError> {
        for _ in 0..64 {
            // SAFETY: a zero-length, non-blocking sendto with no buffer and no address is how
            // an AF_XDP socket is told to process its TX ring; only the ring is read.
            let r = unsafe { libc::sendto(self.fd.as_raw_fd(), ptr::null(), 0, libc::MSG_DONTWAIT, ptr::null(), 0) };
            if r >= 0 {
                if !self.tx.outstanding() {
                    return Ok(());
                }
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => continue,
                Some(libc::EBUSY | libc::ENOBUFS) => {
                    self.stats.tx_kick_errors += 1;
                    return Ok(());
                }
                _ => return Err(AfXdpError::syscall(&self.ifname, "sendto(AF_XDP)", e)),
            }
        }
        Ok(())
    }

    /// Counters, with the kernel's refreshed.
    pub fn stats(&mut self) -> Result<XdpStats, AfXdpError> {
        let mut k = sys::XdpStatistics::default();
        getsockopt(&self.fd, sys::XDP_STATISTICS, &mut k)
            .map_err(|e| AfXdpError::syscall(&self.ifname, "getsockopt(XDP_STATISTICS)", e))?;
        self.stats.rx_dropped = k.rx_dropped;
        self.stats.rx_ring_full = k.rx_ring_full;
        self.stats.rx_fill_ring_empty = k.rx_fill_ring_empty_descs;
        Ok(self.stats)
    }

    /// Counters as last refreshed, without a syscall.
    pub fn counters(&self) -> XdpStats {
        self.stats
    }
}

impl AsRawFd for XdpPort {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for XdpPort {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// Sets a `SOL_XDP` option.
fn setsockopt<T>(fd: &OwnedFd, opt: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points at a live `T` of the size passed; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            sys::SOL_XDP,
            opt,
            ptr::from_ref(value).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Reads a `SOL_XDP` option into `value`, which must be exactly the kernel's size for it.
fn getsockopt<T>(fd: &OwnedFd, opt: libc::c_int, value: &mut T) -> io::Result<()> {
    let mut len = mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` is a live `T` of `len` bytes; the kernel writes at most `len` bytes.
    let r = unsafe { libc::getsockopt(fd.as_raw_fd(), sys::SOL_XDP, opt, ptr::from_mut(value).cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != mem::size_of::<T>() {
        // An older kernel's shorter layout: not one this code can read.
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("option of {len} bytes, expected {}", mem::size_of::<T>()),
        ));
    }
    Ok(())
}

/// Waits until one of `ports` has a frame ready or `timeout` passes (microsecond resolution).
/// Returns the index of the first ready port, or `None` on timeout or interruption.
pub fn poll_any(ports: &[&XdpPort], timeout: Duration) -> Result<Option<usize>, AfXdpError> {
    if let Some(i) = ports.iter().position(|p| p.rx_ready()) {
        return Ok(Some(i));
    }
    let fds: Vec<RawFd> = ports.iter().map(|p| p.fd.as_raw_fd()).collect();
    if let Err(e) = sluice_netif::wait_readable(&fds, timeout) {
        return Err(AfXdpError::syscall(ports.first().map_or("", |p| p.ifname.as_str()), "ppoll", e));
    }
    Ok(ports.iter().position(|p| p.rx_ready()))
}
