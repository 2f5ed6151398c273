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

/// A doorbell another thread can ring to end a [`wait_readable`] early: an `eventfd`, readable
/// from the first ring until [`Doorbell::answer`]. Why a descriptor rather than a thread
/// unpark: a thread that waits on sockets in `ppoll` can only be woken by one of the
/// descriptors it waits on.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A new doorbell, not rung.
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: plain syscall with integer arguments.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        Ok(Doorbell { fd: unsafe { OwnedFd::from_raw_fd(raw) } })
    }

    /// Rings: the descriptor is readable until answered. Ringing again before that adds
    /// nothing; a ring that fails (the counter at its maximum, which answering prevents)
    /// changes nothing the waiter would not see.
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to a descriptor this struct owns.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), ptr::addr_of!(one).cast(), mem::size_of::<u64>()) };
    }

    /// Takes the rings so far: the descriptor is not readable again until the next ring.
    /// Whether it had been rung.
    pub fn answer(&self) -> bool {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into a valid u64 from a non-blocking descriptor this
        // struct owns.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), ptr::addr_of_mut!(count).cast(), mem::size_of::<u64>()) };
        r == mem::size_of::<u64>() as isize && count > 0
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_rung_doorbell_ends_a_wait_at_once_until_answered() {
        let bell = Doorbell::new().expect("eventfd");
        assert!(!bell.answer(), "not rung yet");
        let t0 = Instant::now();
        assert!(!wait_readable(&[bell.as_raw_fd()], Duration::from_millis(20)).expect("ppoll"));
        assert!(t0.elapsed() >= Duration::from_millis(19), "a quiet bell waits the timeout out");
        bell.ring();
        bell.ring();
        assert!(wait_readable(&[bell.as_raw_fd()], Duration::from_secs(30)).expect("ppoll"));
        assert!(bell.answer(), "rung");
        assert!(!bell.answer(), "answered once for both rings");
        assert!(!wait_readable(&[bell.as_raw_fd()], Duration::ZERO).expect("ppoll"));
    }

    #[test]
    fn a_ring_from_another_thread_wakes_a_waiter() {
        let bell = std::sync::Arc::new(Doorbell::new().expect("eventfd"));
        let b = bell.clone();
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            b.ring();
        });
        let t0 = Instant::now();
        assert!(wait_readable(&[bell.as_raw_fd()], Duration::from_secs(30)).expect("ppoll"));
        assert!(t0.elapsed() < Duration::from_secs(30));
        ringer.join().expect("ringer");
    }
}
