//! Errors of the AF_XDP port.

use std::io;

/// Why opening or using an [`XdpPort`](crate::XdpPort) failed. Every variant names the
/// interface.
#[derive(Debug, thiserror::Error)]
pub enum AfXdpError {
    /// The interface name is empty, too long (at most 15 bytes) or contains a NUL byte.
    #[error("{ifname:?}: invalid interface name: {reason}")]
    InvalidName {
        /// The name as given.
        ifname: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The [`XdpConfig`](crate::XdpConfig) breaks a rule of the UMEM or ring geometry.
    #[error("{ifname}: invalid AF_XDP configuration: {reason}")]
    Config {
        /// The interface.
        ifname: String,
        /// The rule broken.
        reason: String,
    },
    /// A system call failed.
    #[error("{ifname}: {syscall} failed: {source}{hint}")]
    Syscall {
        /// The interface.
        ifname: String,
        /// The failing call, e.g. `"setsockopt(XDP_UMEM_REG)"`.
        syscall: &'static str,
        /// The error, carrying the errno.
        #[source]
        source: io::Error,
        /// What the errno most likely means here (empty when nothing useful can be said).
        hint: String,
    },
}

impl AfXdpError {
    /// The errno of a failed system call.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            AfXdpError::Syscall { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The interface the error concerns.
    pub fn ifname(&self) -> &str {
        match self {
            AfXdpError::InvalidName { ifname, .. }
            | AfXdpError::Config { ifname, .. }
            | AfXdpError::Syscall { ifname, .. } => ifname,
        }
    }

    pub(crate) fn syscall(ifname: &str, syscall: &'static str, source: io::Error) -> Self {
        let hint = match source.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => {
                "; AF_XDP needs CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF (or root)".to_string()
            }
            Some(libc::EBUSY) if syscall.starts_with("bpf(BPF_LINK_CREATE") => {
                "; another XDP program is attached to this interface (see `ip link show`)".to_string()
            }
            Some(libc::EBUSY) if syscall.starts_with("bind") => {
                "; this queue of the interface already has an AF_XDP socket (another port open on it?)".to_string()
            }
            Some(libc::EAFNOSUPPORT) => "; this kernel has no AF_XDP (CONFIG_XDP_SOCKETS)".to_string(),
            _ => String::new(),
        };
        AfXdpError::Syscall { ifname: ifname.to_string(), syscall, source, hint }
    }

    /// A failed call, with the errno of the calling thread.
    pub(crate) fn last_os(ifname: &str, syscall: &'static str) -> Self {
        Self::syscall(ifname, syscall, io::Error::last_os_error())
    }
}
