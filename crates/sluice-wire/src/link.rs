//! Datagrams between nodes in batches: one `sendmmsg`/`recvmmsg` system call moves a whole
//! batch, as the data plane moves packets in batches everywhere else.
//!
//! Where the kernel offers it (Linux 4.18+), runs of equal-sized datagrams also travel through
//! the kernel as one: a send gives the run with its segment size (UDP GSO, `UDP_SEGMENT`), and
//! a link that asked for UDP GRO receives such a run in one buffer with its segment size and
//! splits it here. The wire is unchanged (the network still carries one datagram per packet);
//! what falls is the kernel's cost per datagram, which was half the CPU of a node's link. A
//! kernel or device that refuses a segment size is remembered and those runs go as single
//! datagrams.
//!
//! A link is a UDP socket. Nothing here retransmits: the runtime numbers the datagrams it sends
//! each node and asks for what did not arrive (`Resend` notes).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Most datagrams one system call moves.
pub const MAX_BATCH: usize = 64;

/// `UDP_SEGMENT` and `UDP_GRO` (linux/udp.h; not in every libc target).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Most segments in one GSO send (the kernel's `UDP_MAX_SEGMENTS` on older kernels).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes in one GSO send (one IP datagram's worth, less headers).
const GSO_MAX_BYTES: usize = 65_000;
/// A receive buffer a GRO run fits in whole.
const GRO_BUFFER: usize = 65_535;
/// Room for one control message holding a `u16` (`CMSG_SPACE(2)` is 24 on 64-bit Linux).
type CmsgSpace = [u64; 4];

/// What went wrong on a link.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The socket could not be opened or configured.
    #[error("socket {addr}: {source}")]
    Socket {
        /// The address it was for.
        addr: SocketAddr,
        /// The system's error.
        source: io::Error,
    },
    /// Sending failed.
    #[error("sending to {to}: {source}")]
    Send {
        /// The destination.
        to: SocketAddr,
        /// The system's error.
        source: io::Error,
    },
    /// Receiving failed.
    #[error("receiving: {0}")]
    Recv(io::Error),
}

/// One UDP socket sending and receiving datagrams in batches.
#[derive(Debug)]
pub struct UdpLink {
    socket: UdpSocket,
    /// Runs of datagrams of up to this many bytes go as one GSO send (0: none do).
    gso_below: AtomicUsize,
    /// The socket takes GRO runs: receive buffers must hold a whole run.
    gro: bool,
}

impl AsRawFd for UdpLink {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
    }
}

/// Buffers for [`UdpLink::recv_batch`], reused from one call to the next.
#[derive(Debug)]
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    /// Per buffer: the segment size of a GRO run it holds (0: one datagram).
    segs: Vec<usize>,
    from: Vec<Option<SocketAddr>>,
    /// Buffers filled by the last receive.
    count: usize,
    /// Datagrams in them.
    datagrams: usize,
    truncated: u64,
    /// Control message space per buffer (the GRO segment size).
    cmsgs: Vec<CmsgSpace>,
    /// The largest datagram taken (buffers grown for GRO runs hold more).
    max: usize,
}

impl RecvBatch {
    /// Room for `count` datagrams (at most [`MAX_BATCH`]) of up to `size` bytes each.
    pub fn new(count: usize, size: usize) -> RecvBatch {
        let count = count.clamp(1, MAX_BATCH);
        RecvBatch {
            bufs: vec![vec![0; size.max(1)]; count],
            lens: vec![0; count],
            segs: vec![0; count],
            from: vec![None; count],
            count: 0,
            datagrams: 0,
            truncated: 0,
            cmsgs: vec![[0; 4]; count],
            max: size.max(1),
        }
    }

    /// Grows the buffers to hold a whole GRO run (once, for a link that takes them).
    fn fit_gro(&mut self) {
        for b in &mut self.bufs {
            if b.len() < GRO_BUFFER {
                b.resize(GRO_BUFFER, 0);
            }
        }
    }

    /// The datagrams of the last receive, with their senders (a GRO run split back into its
    /// datagrams).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<SocketAddr>)> + '_ {
        let max = self.max;
        self.bufs
            .iter()
            .zip(&self.lens)
            .zip(&self.segs)
            .zip(&self.from)
            .take(self.count)
            .flat_map(|(((b, l), seg), f)| {
                let data: &[u8] = b.get(..*l).unwrap_or_default();
                let (seg, n) = if *seg == 0 { (data.len(), 1) } else { (*seg, data.len().div_ceil(*seg)) };
                (0..n).map(move |i| (data.get(i * seg..((i + 1) * seg).min(data.len())).unwrap_or_default(), *f))
            })
            // What the receive counted as too big.
            .filter(move |(d, _)| d.len() <= max)
    }

    /// How many datagrams the last receive returned.
    pub fn len(&self) -> usize {
        self.datagrams
    }

    /// Whether the last receive returned nothing.
    pub fn is_empty(&self) -> bool {
        self.datagrams == 0
    }

    /// Datagrams dropped so far because they did not fit a buffer.
    pub fn truncated(&self) -> u64 {
        self.truncated
    }
}

impl UdpLink {
    /// A link on `addr` (port 0: any free port). `timeout` bounds how long a receive waits for
    /// the first datagram (`None`: for ever).
    pub fn bind(addr: SocketAddr, timeout: Option<Duration>) -> Result<UdpLink, LinkError> {
        let socket = UdpSocket::bind(addr).map_err(|source| LinkError::Socket { addr, source })?;
        socket.set_read_timeout(timeout).map_err(|source| LinkError::Socket { addr, source })?;
        // A kernel without GRO for UDP says so here; the link then takes datagrams one by one.
        let gro = set_int_option(&socket, (libc::SOL_UDP, UDP_GRO), 1).is_ok();
        Ok(UdpLink { socket, gso_below: AtomicUsize::new(usize::MAX), gro })
    }

    /// Whether the kernel hands this link runs of datagrams in one buffer (UDP GRO).
    pub fn takes_runs(&self) -> bool {
        self.gro
    }

    /// The address the link is bound to.
    pub fn local_addr(&self) -> Result<SocketAddr, LinkError> {
        self.socket.local_addr().map_err(LinkError::Recv)
    }

    /// Sends every datagram of `batch` to `to`, [`MAX_BATCH`] messages per system call, runs
    /// of equal-sized datagrams as one GSO message each; returns how many datagrams were sent
    /// (all of them, unless an error stops it).
    pub fn send_batch(&self, to: SocketAddr, batch: &[&[u8]]) -> Result<usize, LinkError> {
        let (addr, addr_len) = sockaddr(to);
        let mut sent = 0;
        while sent < batch.len() {
            let rest = &batch[sent..];
            let runs = runs(rest, self.gso_below.load(Ordering::Relaxed));
            let covered = runs.iter().map(|r| r.count).sum();
            let iov: Vec<libc::iovec> = rest
                .iter()
                .take(covered)
                .map(|d| libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() })
                .collect();
            let mut cmsgs: Vec<CmsgSpace> = vec![[0; 4]; runs.len()];
            let mut msgs: Vec<libc::mmsghdr> = Vec::with_capacity(runs.len());
            let mut first = 0;
            for (run, space) in runs.iter().zip(cmsgs.iter_mut()) {
                // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are a valid
                // (empty) value; the fields that matter are set just below.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = &addr as *const libc::sockaddr_storage as *mut libc::c_void;
                m.msg_hdr.msg_namelen = addr_len;
                m.msg_hdr.msg_iov = iov[first..].as_ptr() as *mut libc::iovec;
                m.msg_hdr.msg_iovlen = run.count as _;
                if run.count > 1 {
                    segment_size(&mut m.msg_hdr, space, run.size);
                }
                msgs.push(m);
                first += run.count;
            }
            // SAFETY: `msgs` holds `msgs.len()` initialised headers whose name, iovec, control
            // and data pointers (`addr`, `iov`, `cmsgs`, `batch`) outlive the call; the kernel
            // only reads them and writes each header's `msg_len`.
            let n =
                unsafe { libc::sendmmsg(self.socket.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as libc::c_uint, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match (e.kind(), e.raw_os_error(), runs.first()) {
                    (io::ErrorKind::Interrupted, _, _) => continue,
                    // The kernel or the device refuses this segment size: such runs go as
                    // single datagrams from now on.
                    (_, Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT), Some(r)) if r.count > 1 => {
                        self.gso_below.fetch_min(r.size.saturating_sub(1), Ordering::Relaxed);
                        continue;
                    }
                    _ => return Err(LinkError::Send { to, source: e }),
                }
            }
            sent += runs.iter().take(n as usize).map(|r| r.count).sum::<usize>();
        }
        Ok(sent)
    }

    /// Receives up to a batch: waits (up to the link's timeout) for the first datagram and takes
    /// whatever else is already there. Returns how many arrived (0 on timeout).
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> Result<usize, LinkError> {
        self.recv_flags(batch, libc::MSG_WAITFORONE)
    }

    /// Like [`UdpLink::recv_batch`], but takes only what is already there, without waiting.
    pub fn try_recv_batch(&self, batch: &mut RecvBatch) -> Result<usize, LinkError> {
        self.recv_flags(batch, libc::MSG_DONTWAIT)
    }

    fn recv_flags(&self, batch: &mut RecvBatch, flags: libc::c_int) -> Result<usize, LinkError> {
        batch.count = 0;
        batch.datagrams = 0;
        if self.gro {
            batch.fit_gro();
        }
        let n = batch.bufs.len();
        let mut iov: Vec<libc::iovec> = batch
            .bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() })
            .collect();
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
        let mut names: Vec<libc::sockaddr_storage> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .zip(names.iter_mut())
            .zip(batch.cmsgs.iter_mut())
            .map(|((v, name), space)| {
                // SAFETY: as in `send_batch`, an all-zero mmsghdr is valid before it is filled in.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = name as *mut libc::sockaddr_storage as *mut libc::c_void;
                m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                m.msg_hdr.msg_iov = v as *mut libc::iovec;
                m.msg_hdr.msg_iovlen = 1;
                if self.gro {
                    m.msg_hdr.msg_control = space.as_mut_ptr() as *mut libc::c_void;
                    m.msg_hdr.msg_controllen = std::mem::size_of::<CmsgSpace>() as _;
                }
                m
            })
            .collect();
        let got = loop {
            // SAFETY: every header points at a buffer (`batch.bufs`, via `iov`) and a name
            // (`names`) that live until after the call and are as large as the header says;
            // the kernel writes at most that much into each.
            let r = unsafe {
                libc::recvmmsg(
                    self.socket.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    n as libc::c_uint,
                    flags,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => return Ok(0),
                _ => return Err(LinkError::Recv(e)),
            }
        };
        let mut kept = 0;
        for i in 0..got.min(n) {
            let (len, flags) = (msgs[i].msg_len as usize, msgs[i].msg_hdr.msg_flags);
            if flags & libc::MSG_TRUNC != 0 {
                batch.truncated += 1;
                continue;
            }
            let seg = if self.gro { gro_segment(&msgs[i].msg_hdr).filter(|s| *s < len).unwrap_or(0) } else { 0 };
            // Datagrams over the batch's size are counted and left out (in a GRO run, every
            // one but a shorter last one has the run's size).
            let (count, too_big) = match seg {
                0 => (1, usize::from(len > batch.max)),
                _ if seg <= batch.max => (len.div_ceil(seg), 0),
                _ => (len.div_ceil(seg), len / seg + usize::from(len % seg > batch.max)),
            };
            batch.truncated += too_big as u64;
            let count = count - too_big;
            if count == 0 {
                continue;
            }
            if kept != i {
                batch.bufs.swap(kept, i);
            }
            batch.lens[kept] = len;
            batch.segs[kept] = seg;
            batch.from[kept] = socket_addr(&names[i]);
            batch.datagrams += count;
            kept += 1;
        }
        batch.count = kept;
        Ok(batch.datagrams)
    }
}

/// Datagrams that travel through the kernel as one message: `count` of `size` bytes (the
/// last may be shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    count: usize,
    size: usize,
}

/// The front of `batch` as at most [`MAX_BATCH`] runs: neighbours of the same size, up to
/// `gso_below` bytes each, go together ([`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`] at most),
/// and a shorter one ends a run (GSO sends every segment but the last at full size).
fn runs(batch: &[&[u8]], gso_below: usize) -> Vec<Run> {
    let mut out = Vec::new();
    let mut rest = batch;
    while let Some(first) = rest.first() {
        if out.len() == MAX_BATCH {
            break;
        }
        let size = first.len();
        let mut count = 1;
        if size > 0 && size <= gso_below {
            for next in rest.iter().skip(1).map(|d| d.len()) {
                if next == 0 || next > size || count == GSO_MAX_SEGMENTS || (count + 1) * size > GSO_MAX_BYTES {
                    break;
                }
                count += 1;
                if next < size {
                    break;
                }
            }
        }
        out.push(Run { count, size });
        rest = rest.get(count..).unwrap_or_default();
    }
    out
}

/// Attaches a `UDP_SEGMENT` control message of `size` held in `space` to `hdr`.
fn segment_size(hdr: &mut libc::msghdr, space: &mut CmsgSpace, size: usize) {
    hdr.msg_control = space.as_mut_ptr() as *mut libc::c_void;
    // SAFETY: CMSG_SPACE only computes a length.
    hdr.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as _;
    // SAFETY: `hdr` points at `space`, which is aligned for a cmsghdr and larger than
    // CMSG_SPACE(2), so the first header and its two data bytes lie inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(hdr);
        if c.is_null() {
            return;
        }
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, size.min(usize::from(u16::MAX)) as u16);
    }
}

/// The segment size of a GRO run the kernel reported in `hdr`'s control messages.
fn gro_segment(hdr: &libc::msghdr) -> Option<usize> {
    // SAFETY: the kernel filled `hdr`'s control buffer and set `msg_controllen` to what it
    // wrote; the CMSG macros walk only within it, and a UDP_GRO message holds an int.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                return usize::try_from(size).ok().filter(|s| *s > 0);
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    None
}

/// Sets an integer socket option (`level`, `option`) on `socket`.
pub(crate) fn set_int_option(
    socket: &impl AsRawFd,
    (level, option): (libc::c_int, libc::c_int),
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live `c_int` on a socket
    // descriptor the caller holds for the whole call.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            option,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `addr` as the C socket address the system calls take.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for every sockaddr type.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The sender's address the kernel wrote, if it is IPv4 or IPv6.
fn socket_addr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe { &*(s as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { &*(s as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(runs: &[Run]) -> Vec<(usize, usize)> {
        runs.iter().map(|r| (r.count, r.size)).collect()
    }

    #[test]
    fn equal_neighbours_form_a_run_that_a_shorter_one_ends_and_a_longer_one_breaks() {
        let (a, b, c) = (vec![0u8; 100], vec![0u8; 60], vec![0u8; 120]);
        let batch: Vec<&[u8]> = vec![&a, &a, &a, &b, &a, &c, &c, &a];
        assert_eq!(sizes(&runs(&batch, usize::MAX)), vec![(4, 100), (1, 100), (3, 120)]);
        // Sizes the kernel refused go one by one.
        assert_eq!(sizes(&runs(&batch, 110)), vec![(4, 100), (1, 100), (1, 120), (1, 120), (1, 100)]);
        assert_eq!(sizes(&runs(&batch, 0)).len(), batch.len());
    }

    #[test]
    fn a_run_stays_within_the_kernels_limits_and_a_call_within_max_batch() {
        let small = vec![0u8; 64];
        let batch: Vec<&[u8]> = vec![&small; 200];
        assert_eq!(sizes(&runs(&batch, usize::MAX)), vec![(64, 64), (64, 64), (64, 64), (8, 64)]);
        let big = vec![0u8; 1500];
        let batch: Vec<&[u8]> = vec![&big; 100];
        let r = runs(&batch, usize::MAX);
        assert!(r.iter().all(|r| r.count * r.size <= GSO_MAX_BYTES), "{r:?}");
        assert_eq!(r.iter().map(|r| r.count).sum::<usize>(), 100);
        let batch: Vec<&[u8]> = vec![small.as_slice(); 1000];
        assert_eq!(runs(&batch, 0).len(), MAX_BATCH, "one call's worth of messages");
    }
}
