//! The protocol between [`RemoteBackend`](crate::RemoteBackend) and
//! [`StoreServer`](crate::StoreServer): frames of a little-endian `u32` length and a postcard
//! message (docs/store-protocol.md).
//!
//! A TCP connection starts with a [`Hello`] answered by a [`Welcome`]; then it is either one NF
//! instance's [`Connection`](sluice_store::Connection) (batches in, replies and notifications
//! out, both directions at any time) or an administration link (one [`AdminRequest`], its
//! answer, the next).

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sluice_packet::{Clock, InstanceId};
use sluice_state::Value;
use sluice_store::{Checkpoint, Notification, Replies, Request, StoreError, StoreKey, Takeover};
use std::io::{Read, Write};

/// The protocol's version: a server refuses a client of another. 2: an update's number
/// (`OpTag::seq`) is 32 bits.
pub const VERSION: u32 = 3;

/// The largest frame either side accepts (a checkpoint of a big store is the largest message).
pub const MAX_FRAME: usize = 1 << 30;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The frame announced more than [`MAX_FRAME`] bytes.
    #[error("frame of {0} bytes announced (at most {MAX_FRAME})")]
    TooLarge(usize),
    /// The frame's bytes are not the message expected.
    #[error("malformed message: {0}")]
    Malformed(#[from] postcard::Error),
}

/// The first message on every connection.
#[derive(Debug, Serialize, Deserialize)]
pub struct Hello {
    /// [`VERSION`] of the client.
    pub version: u32,
    /// The server's token, if it has one (empty otherwise).
    pub token: String,
    /// The store space addressed: a server keeps one independent store per space name, so
    /// processes that must not see each other's values (two runs, two halves of a split
    /// chain, whose vertex numbers overlap) share one server. Empty: the default space.
    pub space: String,
    /// What the connection is for.
    pub role: Role,
}

/// What a connection is for.
#[derive(Debug, Serialize, Deserialize)]
pub enum Role {
    /// An NF instance's connection to the store.
    Instance(InstanceId),
    /// Administration: custom operations, checkpoints, takeovers, restore, wipe.
    Admin,
    /// An NF instance's connection in an epoch: fenced once its replacement fences it
    /// ([`Backend::fence`](sluice_store::Backend::fence)). [`Role::Instance`] acts for an
    /// instance and is never fenced.
    InstanceAt(InstanceId, u32),
}

/// The server's answer to a [`Hello`].
#[derive(Debug, Serialize, Deserialize)]
pub enum Welcome {
    /// Accepted; the served store's name.
    Accepted(String),
    /// Refused, with the reason (wrong version or token, the store refusing the connection).
    Refused(String),
    /// The store refused the instance's connection (it is fenced).
    Failed(StoreError),
}

/// A batch an instance sends, as it goes out (borrowed) ...
#[derive(Debug, Serialize)]
pub struct BatchOut<'a> {
    /// The batch's number ([`Connection::send`](sluice_store::Connection::send)).
    pub number: u64,
    /// Its requests.
    pub requests: &'a [Request],
}

/// ... and as it arrives (same encoding).
#[derive(Debug, Deserialize)]
pub struct BatchIn {
    /// The batch's number.
    pub number: u64,
    /// Its requests.
    pub requests: Vec<Request>,
}

/// What the server sends an instance's connection.
#[derive(Debug, Serialize, Deserialize)]
pub enum Delivery {
    /// Replies and notifications that arrived, in the store's order.
    Arrived(Replies, Vec<Notification>),
    /// The store refused a batch or failed; the connection ends after this.
    Failed(StoreError),
}

/// A request on an administration link: one per [`Backend`](sluice_store::Backend) method.
#[derive(Debug, Serialize, Deserialize)]
pub enum AdminRequest {
    /// Register a vertex's custom operations, by name: the server runs its own copies.
    RegisterCustomOps {
        /// The vertex.
        vertex: u16,
        /// The operations' names, in the NF's order.
        names: Vec<String>,
    },
    /// A checkpoint.
    Checkpoint,
    /// An instance's timers.
    TimersOf(InstanceId),
    /// A vertex's values of some objects.
    ValuesOf {
        /// The vertex.
        vertex: u16,
        /// The objects.
        objects: Vec<u16>,
    },
    /// What a failed instance's replacement takes over; answered by parts, then `End`.
    Takeover {
        /// The failed instance.
        owner: InstanceId,
        /// The objects whose values are wanted, if any.
        objects: Option<Vec<u16>>,
    },
    /// Replace the contents with a checkpoint.
    Restore(Checkpoint),
    /// Lose everything (a store crash, for drills).
    Wipe,
    /// Forget this connection's space: the next connection to its name gets an empty store.
    /// Connections still open to it keep using it until they close.
    DropSpace,
    /// The clocks of the per-clock log with a tagged update of this vertex.
    ClocksUpdatedBy(u16),
    /// Fence an instance below an epoch.
    Fence {
        /// The instance.
        instance: InstanceId,
        /// The lowest epoch accepted from now on.
        epoch: u32,
    },
}

/// An answer on an administration link.
#[derive(Debug, Serialize, Deserialize)]
pub enum AdminAnswer {
    /// Done, nothing to return.
    Done,
    /// A checkpoint.
    Checkpoint(Checkpoint),
    /// Timers with their deadlines.
    Timers(Vec<(StoreKey, u64)>),
    /// Values, or `None` when the store cannot list them.
    Values(Option<Vec<(StoreKey, Value)>>),
    /// One part of a takeover.
    TakeoverPart(Takeover),
    /// The takeover's last part has been sent.
    TakeoverEnd,
    /// The request failed.
    Failed(StoreError),
    /// Clocks (of [`AdminRequest::ClocksUpdatedBy`]).
    Clocks(Vec<Clock>),
}

/// Writes one frame holding `msg`, reusing `buf` for its bytes.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T, buf: &mut Vec<u8>) -> Result<(), FrameError> {
    buf.clear();
    buf.extend_from_slice(&[0; 4]);
    let mut out = postcard::to_extend(msg, std::mem::take(buf))?;
    let len = out.len() - 4;
    if len > MAX_FRAME {
        *buf = out;
        return Err(FrameError::TooLarge(len));
    }
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    let r = w.write_all(&out);
    *buf = out;
    Ok(r?)
}

/// Reads one frame into `buf` and decodes it. A clean end of the stream before a frame is
/// [`FrameError::Closed`].
pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    if let Err(e) = r.read_exact(&mut len) {
        return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof { FrameError::Closed } else { e.into() });
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    // Grow with what arrives rather than trusting the announced length up front.
    buf.clear();
    r.take(len as u64).read_to_end(buf)?;
    if buf.len() < len {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "frame cut short").into());
    }
    Ok(postcard::from_bytes(buf)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_garbage_is_an_error() {
        let mut wire = Vec::new();
        let mut buf = Vec::new();
        let hello =
            Hello { version: VERSION, token: "t".into(), space: String::new(), role: Role::Instance(InstanceId(7)) };
        write_frame(&mut wire, &hello, &mut buf).unwrap();
        let back: Hello = read_frame(&mut wire.as_slice(), &mut buf).unwrap();
        assert_eq!(back.version, VERSION);
        assert!(matches!(back.role, Role::Instance(InstanceId(7))));
        // Truncated, oversized, empty and garbage frames.
        assert!(read_frame::<Hello>(&mut &wire[..wire.len() - 1], &mut buf).is_err());
        let huge = (u32::MAX).to_le_bytes();
        assert!(matches!(read_frame::<Hello>(&mut huge.as_slice(), &mut buf), Err(FrameError::TooLarge(_))));
        assert!(matches!(read_frame::<Hello>(&mut [].as_slice(), &mut buf), Err(FrameError::Closed)));
        let garbage = [3, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(matches!(read_frame::<Hello>(&mut garbage.as_slice(), &mut buf), Err(FrameError::Malformed(_))));
    }
}
