//! Datagrams between nodes in batches: one `sendmmsg`/`recvmmsg` system call moves a whole
//! batch, as the data plane moves packets in batches everywhere else.
//!
//! A link is a UDP socket. Nothing here retransmits: a datagram lost between nodes is a lost
//! copy of a packet, which the root's log replays like any other loss.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Most datagrams one system call moves.
pub const MAX_BATCH: usize = 64;

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
    from: Vec<Option<SocketAddr>>,
    count: usize,
    truncated: u64,
}

impl RecvBatch {
    /// Room for `count` datagrams (at most [`MAX_BATCH`]) of up to `size` bytes each.
    pub fn new(count: usize, size: usize) -> RecvBatch {
        let count = count.clamp(1, MAX_BATCH);
        RecvBatch {
            bufs: vec![vec![0; size.max(1)]; count],
            lens: vec![0; count],
            from: vec![None; count],
            count: 0,
            truncated: 0,
        }
    }

    /// The datagrams of the last receive, with their senders.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<SocketAddr>)> + '_ {
        self.bufs.iter().zip(&self.lens).zip(&self.from).take(self.count).map(|((b, l), f)| (&b[..*l], *f))
    }

    /// How many datagrams the last receive returned.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the last receive returned nothing.
    pub fn is_empty(&self) -> bool {
        self.count == 0
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
        Ok(UdpLink { socket })
    }

    /// The address the link is bound to.
    pub fn local_addr(&self) -> Result<SocketAddr, LinkError> {
        self.socket.local_addr().map_err(LinkError::Recv)
    }

    /// Sends every datagram of `batch` to `to`, [`MAX_BATCH`] per system call; returns how
    /// many were sent (all of them, unless an error stops it).
    pub fn send_batch(&self, to: SocketAddr, batch: &[&[u8]]) -> Result<usize, LinkError> {
        let (addr, addr_len) = sockaddr(to);
        let mut sent = 0;
        while sent < batch.len() {
            let chunk = &batch[sent..(sent + MAX_BATCH).min(batch.len())];
            let mut iov: Vec<libc::iovec> = chunk
                .iter()
                .map(|d| libc::iovec { iov_base: d.as_ptr() as *mut libc::c_void, iov_len: d.len() })
                .collect();
            let mut msgs: Vec<libc::mmsghdr> = iov
                .iter_mut()
                .map(|v| {
                    // SAFETY: mmsghdr is a plain C struct for which all-zero bytes are a valid
                    // (empty) value; the fields that matter are set just below.
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_name = &addr as *const libc::sockaddr_storage as *mut libc::c_void;
                    m.msg_hdr.msg_namelen = addr_len;
                    m.msg_hdr.msg_iov = v as *mut libc::iovec;
                    m.msg_hdr.msg_iovlen = 1;
                    m
                })
                .collect();
            // SAFETY: `msgs` holds `msgs.len()` initialised headers whose name, iovec and data
            // pointers (`addr`, `iov`, `batch`) outlive the call; the kernel only reads them
            // and writes each header's `msg_len`.
            let n =
                unsafe { libc::sendmmsg(self.socket.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as libc::c_uint, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(LinkError::Send { to, source: e });
            }
            sent += n as usize;
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
            .map(|(v, name)| {
                // SAFETY: as in `send_batch`, an all-zero mmsghdr is valid before it is filled in.
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = name as *mut libc::sockaddr_storage as *mut libc::c_void;
                m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                m.msg_hdr.msg_iov = v as *mut libc::iovec;
                m.msg_hdr.msg_iovlen = 1;
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
            if kept != i {
                batch.bufs.swap(kept, i);
            }
            batch.lens[kept] = len;
            batch.from[kept] = socket_addr(&names[i]);
            kept += 1;
        }
        batch.count = kept;
        Ok(kept)
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
