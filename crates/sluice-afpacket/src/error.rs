//! Errors of the AF_PACKET port.

use std::io;

/// Why opening or using an [`AfPacketPort`](crate::AfPacketPort) failed. Every variant names
/// the interface.
#[derive(Debug, thiserror::Error)]
pub enum AfPacketError {
    /// The interface name is empty, too long (at most 15 bytes) or contains a NUL byte.
    #[error("{ifname:?}: invalid interface name: {reason}")]
    InvalidName {
        /// The name as given.
        ifname: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The [`RingConfig`](crate::RingConfig) breaks the kernel's rules for ring geometry.
    #[error("{ifname}: invalid ring configuration: {reason}")]
    Config {
        /// The interface.
        ifname: String,
        /// The rule broken.
        reason: String,
    },
    /// A system call failed.
    #[error("{ifname}: {syscall} failed: {source}")]
    Syscall {
        /// The interface.
        ifname: String,
        /// The failing call, e.g. `"setsockopt(PACKET_RX_RING)"`.
        syscall: &'static str,
        /// The error, carrying the errno.
        #[source]
        source: io::Error,
    },
}

impl AfPacketError {
    /// The errno of a failed system call.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            AfPacketError::Syscall { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The interface the error concerns.
    pub fn ifname(&self) -> &str {
        match self {
            AfPacketError::InvalidName { ifname, .. }
            | AfPacketError::Config { ifname, .. }
            | AfPacketError::Syscall { ifname, .. } => ifname,
        }
    }

    pub(crate) fn syscall(ifname: &str, syscall: &'static str, source: io::Error) -> Self {
        AfPacketError::Syscall { ifname: ifname.to_string(), syscall, source }
    }

    /// A failed call, with the errno of the calling thread.
    pub(crate) fn last_os(ifname: &str, syscall: &'static str) -> Self {
        Self::syscall(ifname, syscall, io::Error::last_os_error())
    }
}
