//! Linux interface helpers shared by Sluice's live ports (`sluice-afpacket`, `sluice-afxdp`):
//! checking an interface name, its index and MTU, and waiting on several sockets at once.
//! Each port crate turns the `io::Error`s into its own error type, naming the interface.

#![warn(missing_docs)]

use std::ffi::CString;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::time::Duration;

/// The name as a C string, or why the kernel would refuse it: empty, longer than 15 bytes
/// (`IFNAMSIZ` - 1), or holding a NUL byte. Checked before any system call.
pub fn check_name(ifname: &str) -> Result<CString, &'static str> {
    if ifname.is_empty() {
        return Err("empty");
    }
    if ifname.len() >= libc::IFNAMSIZ {
        return Err("longer than 15 bytes");
    }
    CString::new(ifname).map_err(|_| "contains a NUL byte")
}

/// The interface's index (`if_nametoindex`) in this thread's network namespace.
pub fn index(name: &CString) -> io::Result<u32> {
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if i == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(i)
    }
}

/// The interface's MTU, by `SIOCGIFMTU` on a throw-away UDP socket (some socket families,
/// AF_XDP among them, do not pass interface ioctls on).
pub fn mtu(name: &CString) -> io::Result<usize> {
    // SAFETY: plain syscall with integer arguments.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is a plain C struct (with a union of plain fields); all-zero bytes are valid.
    let mut ifr: libc::ifreq = unsafe { mem::zeroed() };
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: `ifr` holds a NUL-terminated name (at most 15 bytes, the rest zero); SIOCGIFMTU
    // writes only `ifr_ifru.ifru_mtu`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU as _, ptr::addr_of_mut!(ifr)) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after a successful SIOCGIFMTU the union holds the MTU.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    usize::try_from(mtu).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// Waits until one of `fds` is readable or `timeout` passes (microsecond resolution, ppoll).
/// `Ok(false)` on timeout or when a signal interrupted the wait.
pub fn wait_readable(fds: &[RawFd], timeout: Duration) -> io::Result<bool> {
    let mut pfds: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structures, `ts` a valid timespec,
    // and a null signal mask leaves the mask unchanged.
    let r = unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, &ts, ptr::null()) };
    if r < 0 {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::EINTR) { Ok(false) } else { Err(err) };
    }
    Ok(r > 0)
}
