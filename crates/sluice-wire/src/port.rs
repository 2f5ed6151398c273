//! Packets in and out of a process as Geneve datagrams: a [`Sender`] encapsulates batches of
//! packets to one peer, a [`Receiver`] takes datagrams in batches and hands on what decodes,
//! counting what does not.
//!
//! Both number their traffic per link: the sender puts its count of sent datagrams in the link
//! sequence option, and the receiver counts the gaps as datagrams lost on the way (UDP drops
//! what a full receive buffer cannot hold). Nothing is retransmitted here (docs/wire-format.md).

use crate::geneve::{decode, encode_sequenced, Decoded, WireError, MAX_VNI};
use crate::link::{LinkError, RecvBatch, UdpLink, MAX_BATCH};
use sluice_packet::{InstanceId, Packet};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

/// The socket buffers asked for on both ends: a burst of a few thousand full-size frames
/// waits in the kernel instead of being dropped (the kernel caps it at `net.core.rmem_max` /
/// `wmem_max` unless the process may raise them).
pub const SOCKET_BUFFER: usize = 8 << 20;

/// What went wrong setting up or using a port.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The link failed.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// A packet could not be encapsulated (only a VNI out of range can cause it).
    #[error("encapsulating: {0}")]
    Wire(#[from] WireError),
}

/// Counters of a [`Sender`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SendStats {
    /// Datagrams handed to the kernel.
    pub datagrams: u64,
    /// Bytes in them (Geneve header, options and frame).
    pub bytes: u64,
}

/// Encapsulates packets in Geneve and sends them to one peer in batches.
#[derive(Debug)]
pub struct Sender {
    link: UdpLink,
    to: SocketAddr,
    vni: u32,
    next_seq: u64,
    bufs: Vec<Vec<u8>>,
    stats: SendStats,
}

impl Sender {
    /// A sender from a socket bound to `bind` (port 0: any) to `to`, for chain `vni`.
    pub fn new(bind: SocketAddr, to: SocketAddr, vni: u32) -> Result<Sender, PortError> {
        if vni > MAX_VNI {
            return Err(WireError::VniTooLarge(vni).into());
        }
        let link = UdpLink::bind(bind, None)?;
        set_buffer(&link, libc::SO_SNDBUF);
        Ok(Sender { link, to, vni, next_seq: 0, bufs: Vec::new(), stats: SendStats::default() })
    }

    /// Sends `pkts`, each to instance `dest` of the peer's chain ([`crate::geneve::TO_ROOT`]
    /// for a chain that takes them as input), with their metadata.
    pub fn send(&mut self, pkts: &[Packet], dest: InstanceId) -> Result<(), PortError> {
        for chunk in pkts.chunks(MAX_BATCH) {
            if self.bufs.len() < chunk.len() {
                self.bufs.resize_with(chunk.len(), Vec::new);
            }
            for (buf, p) in self.bufs.iter_mut().zip(chunk) {
                buf.clear();
                encode_sequenced(&p.meta, dest, self.vni, Some(self.next_seq), p.data(), buf)?;
                self.next_seq += 1;
            }
            let datagrams: Vec<&[u8]> = self.bufs.iter().take(chunk.len()).map(Vec::as_slice).collect();
            self.link.send_batch(self.to, &datagrams)?;
            self.stats.datagrams += datagrams.len() as u64;
            self.stats.bytes += datagrams.iter().map(|d| d.len() as u64).sum::<u64>();
        }
        Ok(())
    }

    /// What it has sent so far.
    pub fn stats(&self) -> SendStats {
        self.stats
    }

    /// Where it sends.
    pub fn peer(&self) -> SocketAddr {
        self.to
    }
}

/// One sender's link sequence, as a receiver follows it: a gap counts as lost, a datagram
/// older than expected as late (and no longer lost: it was counted when the gap was seen).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sequence {
    next: Option<u64>,
}

impl Sequence {
    /// Expects `first` next (datagrams before it count as lost).
    pub fn expecting(first: u64) -> Sequence {
        Sequence { next: Some(first) }
    }

    /// Datagram `seq` arrived: adds to `lost` and `late`. A sequence made with `default()`
    /// starts at the first datagram it sees (what was sent before the receiver was up is not
    /// lost).
    pub fn arrived(&mut self, seq: u64, lost: &mut u64, late: &mut u64) {
        let Some(next) = self.next.as_mut() else {
            self.next = Some(seq + 1);
            return;
        };
        if seq >= *next {
            *lost += seq - *next;
            *next = seq + 1;
        } else {
            *late += 1;
            *lost = lost.saturating_sub(1);
        }
    }
}

/// Counters of a [`Receiver`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecvStats {
    /// Datagrams that decoded and were handed on.
    pub accepted: u64,
    /// Datagrams that were not Sluice's Geneve (or were damaged), dropped.
    pub malformed: u64,
    /// Datagrams for another chain (another VNI), dropped.
    pub other_vni: u64,
    /// Datagrams larger than the receive buffers, dropped.
    pub truncated: u64,
    /// Datagrams the senders' sequence numbers say were lost on the way.
    pub lost: u64,
    /// Datagrams that arrived after a later one of the same sender.
    pub late: u64,
    /// The last decoding error, to say what the malformed ones were.
    pub last_error: Option<String>,
}

/// Receives Geneve datagrams in batches on one socket.
#[derive(Debug)]
pub struct Receiver {
    link: UdpLink,
    batch: RecvBatch,
    vni: u32,
    /// Per sender: the sequence number expected next.
    expected: HashMap<SocketAddr, Sequence>,
    stats: RecvStats,
}

impl Receiver {
    /// A receiver on `addr` for chain `vni`; a receive waits at most `timeout` for the first
    /// datagram. Buffers hold frames of up to `mtu` bytes plus the encapsulation.
    pub fn bind(addr: SocketAddr, vni: u32, timeout: Duration, mtu: usize) -> Result<Receiver, PortError> {
        if vni > MAX_VNI {
            return Err(WireError::VniTooLarge(vni).into());
        }
        let link = UdpLink::bind(addr, Some(timeout))?;
        set_buffer(&link, libc::SO_RCVBUF);
        // The Geneve header and the largest set of Sluice options fit in 256 bytes.
        let batch = RecvBatch::new(MAX_BATCH, mtu + 256);
        Ok(Receiver { link, batch, vni, expected: HashMap::new(), stats: RecvStats::default() })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, PortError> {
        Ok(self.link.local_addr()?)
    }

    /// Waits for a batch and calls `each` with every datagram that decodes for this chain;
    /// counts and drops the rest. Returns how many were handed on (0 after a quiet timeout).
    pub fn recv(&mut self, each: impl FnMut(Decoded<'_>)) -> Result<usize, PortError> {
        self.recv_waiting(true, each)
    }

    /// [`Receiver::recv`] without waiting: only what has already arrived.
    pub fn try_recv(&mut self, each: impl FnMut(Decoded<'_>)) -> Result<usize, PortError> {
        self.recv_waiting(false, each)
    }

    fn recv_waiting(&mut self, wait: bool, mut each: impl FnMut(Decoded<'_>)) -> Result<usize, PortError> {
        let truncated = self.batch.truncated();
        if wait {
            self.link.recv_batch(&mut self.batch)?;
        } else {
            self.link.try_recv_batch(&mut self.batch)?;
        }
        self.stats.truncated += self.batch.truncated() - truncated;
        let mut accepted = 0;
        for (datagram, from) in self.batch.iter() {
            match decode(datagram) {
                Ok(d) if d.vni != self.vni => self.stats.other_vni += 1,
                Ok(d) => {
                    if let (Some(seq), Some(from)) = (d.seq, from) {
                        let s = self.expected.entry(from).or_insert(Sequence::expecting(0));
                        s.arrived(seq, &mut self.stats.lost, &mut self.stats.late);
                    }
                    accepted += 1;
                    each(d);
                }
                Err(e) => {
                    self.stats.malformed += 1;
                    self.stats.last_error = Some(e.to_string());
                }
            }
        }
        self.stats.accepted += accepted as u64;
        Ok(accepted)
    }

    /// What it has received so far.
    pub fn stats(&self) -> &RecvStats {
        &self.stats
    }
}

/// Times `rounds` round trips of `batch` packets of `size` bytes over loopback: a sender to a
/// receiver on a thread that sends every batch back (a measurement, for `examples/linkbench`
/// and its smoke test). Returns each round trip's duration; half of one is a crossing.
pub fn round_trips(rounds: usize, batch: usize, size: usize) -> Result<Vec<Duration>, PortError> {
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let wait = Duration::from_secs(2);
    let mut a_rx = Receiver::bind(any, 1, wait, size.max(64))?;
    let mut b_rx = Receiver::bind(any, 1, wait, size.max(64))?;
    let (a_addr, b_addr) = (a_rx.local_addr()?, b_rx.local_addr()?);
    let batch = batch.clamp(1, MAX_BATCH);
    let packets: Vec<Packet> = (0..batch).map(|_| Packet::from_slice(&vec![0u8; size], Default::default())).collect();
    // The far end: whatever arrives goes back.
    let echo = std::thread::spawn(move || -> Result<(), PortError> {
        let mut back = Sender::new(any, a_addr, 1)?;
        let mut got = Vec::new();
        for _ in 0..rounds {
            while got.len() < batch {
                if b_rx.recv(|d| got.push(Packet::from_slice(d.frame, d.meta)))? == 0 {
                    return Ok(());
                }
            }
            back.send(&got, crate::geneve::TO_ROOT)?;
            got.clear();
        }
        Ok(())
    });
    let mut to_b = Sender::new(any, b_addr, 1)?;
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = std::time::Instant::now();
        to_b.send(&packets, crate::geneve::TO_ROOT)?;
        let mut n = 0;
        while n < batch {
            let got = a_rx.recv(|_| {})?;
            if got == 0 {
                // The far end stopped answering (a lost datagram on loopback, or it failed).
                return Err(PortError::Link(LinkError::Recv(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "a round trip timed out",
                ))));
            }
            n += got;
        }
        times.push(start.elapsed());
    }
    match echo.join() {
        Ok(r) => r?,
        Err(_) => {
            return Err(PortError::Link(LinkError::Recv(std::io::Error::other("the echo thread panicked"))));
        }
    }
    Ok(times)
}

/// Asks for [`SOCKET_BUFFER`] bytes of socket buffer (`option`: `SO_SNDBUF` or `SO_RCVBUF`),
/// beyond the system's cap when the process may (`SO_*BUFFORCE`, CAP_NET_ADMIN); best effort: a
/// smaller buffer only means more loss in bursts, which the counters show.
/// Asks for [`SOCKET_BUFFER`]-byte send and receive buffers on `link` (forced where allowed):
/// a burst between nodes waits in them rather than being dropped.
pub fn grow_buffers(link: &UdpLink) {
    set_buffer(link, libc::SO_SNDBUF);
    set_buffer(link, libc::SO_RCVBUF);
}

fn set_buffer(link: &UdpLink, option: libc::c_int) {
    let forced = if option == libc::SO_RCVBUF { libc::SO_RCVBUFFORCE } else { libc::SO_SNDBUFFORCE };
    // Beyond the system's cap when the process may, else up to it.
    for opt in [forced, option] {
        if crate::link::set_int_option(link, (libc::SOL_SOCKET, opt), SOCKET_BUFFER as libc::c_int).is_ok() {
            return;
        }
    }
}

#[cfg(test)]
mod sequence_tests {
    use super::Sequence;

    #[test]
    fn gaps_are_lost_until_the_late_one_arrives() {
        let (mut lost, mut late) = (0, 0);
        let mut s = Sequence::expecting(0);
        for seq in [0, 1, 4, 2, 5] {
            s.arrived(seq, &mut lost, &mut late);
        }
        // 2 and 3 missing at 4; 2 came late.
        assert_eq!((lost, late), (1, 1));
        // From the first seen: what came before is not lost.
        let (mut lost, mut late) = (0, 0);
        let mut s = Sequence::default();
        for seq in [7, 8, 9] {
            s.arrived(seq, &mut lost, &mut late);
        }
        assert_eq!((lost, late), (0, 0));
    }
}
