//! Geneve (RFC 8926) with Sluice's per-packet metadata as options.
//!
//! A datagram is the 8-byte Geneve header, Sluice's options, then the packet's Ethernet frame
//! (protocol type 0x6558, "transparent Ethernet bridging"). The VNI names the chain. All
//! options use one option class from the range RFC 8926 leaves for experiments
//! ([`OPTION_CLASS`]); the high bit of an option's type marks it critical, as the RFC defines:
//! a receiver that does not know a critical option drops the packet, and skips a non-critical
//! one. The layout is documented in docs/wire-format.md.
//!
//! | type | critical | words | content |
//! |---|---|---|---|
//! | 0x81 packet | yes | 6 | clock u64, XOR vector u64, destination instance u32, flags u8, 0 u8, input port u16 |
//! | 0x82 replay target | yes | 1 | instance u32 (only on replay copies) |
//! | 0x03 times | no | 4 | capture time ns u64, root's ingress time ns u64 |
//! | 0x84 labels | yes | 2 per label | label id u16, 0 u16, value u32 (only when labels are set) |
//! | 0x05 link sequence | no | 2 | u64 counting the datagrams one sender sent on one link |
//!
//! Every integer is big-endian (network order).

use sluice_packet::{Clock, InstanceId, LabelId, Labels, Meta, MetaFlags, MAX_LABELS};

/// The UDP port IANA assigned to Geneve.
pub const GENEVE_PORT: u16 = 6081;
/// Geneve's protocol type for an Ethernet frame.
pub const PROTO_ETHERNET: u16 = 0x6558;
/// The option class of Sluice's options (RFC 8926 leaves 0xFFF0–0xFFFF for experiments).
pub const OPTION_CLASS: u16 = 0xFFF0;

/// The Geneve header's fixed part, in bytes.
pub(crate) const HEADER: usize = 8;
const OPTION_HEADER: usize = 4;
/// The high bit of an option's type: a receiver that does not know the option must drop.
pub(crate) const CRITICAL: u8 = 0x80;
const TYPE_PACKET: u8 = 0x81;
const TYPE_REPLAY_TARGET: u8 = 0x82;
const TYPE_TIMES: u8 = 0x03;
const TYPE_LABELS: u8 = 0x84;
pub(crate) const TYPE_SEQUENCE: u8 = 0x05;
const SEQUENCE_WORDS: u8 = 2;
const PACKET_WORDS: u8 = 6;
const TIMES_WORDS: u8 = 4;
const LABEL_WORDS: u8 = 2;
/// The destination that means "the receiving chain's root": a packet that enters the receiver's
/// chain as new input (a chain fed by another, `sluice run --from-geneve`), rather than one
/// for an NF instance the sender's splitter chose.
pub const TO_ROOT: InstanceId = InstanceId(u32::MAX);
/// The destination that means "the chain's output": a packet that left the chain on a node
/// without the root, on its way to the root's node, whose egress writes it (one chain over
/// several nodes).
pub const TO_EGRESS: InstanceId = InstanceId(u32::MAX - 1);
/// The largest VNI (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;

/// What is wrong with a datagram or an encapsulation request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The datagram ends before what its headers announce.
    #[error("truncated: {need} bytes needed, {have} present")]
    Truncated {
        /// Bytes the headers announce.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A Geneve version other than 0.
    #[error("Geneve version {0} (only version 0 exists)")]
    Version(u8),
    /// A control message (O bit set): Sluice sends none.
    #[error("a Geneve control message (O bit set); Sluice sends only data packets")]
    Control,
    /// The payload is not an Ethernet frame.
    #[error("protocol type {0:#06x}, expected Ethernet (0x6558)")]
    Protocol(u16),
    /// An option runs past the options area the header announces.
    #[error("option at offset {offset} runs past the options ({words} words announced)")]
    OptionOverrun {
        /// Offset of the option within the options area.
        offset: usize,
        /// Option words the base header announces.
        words: u8,
    },
    /// A Sluice option whose length does not match its type.
    #[error("Sluice option {kind:#04x} with {words} words")]
    OptionLength {
        /// The option's type.
        kind: u8,
        /// Its length in 4-byte words.
        words: u8,
    },
    /// A critical option this receiver does not know (RFC 8926: drop the packet).
    #[error("unknown critical option class {class:#06x} type {kind:#04x}")]
    UnknownCritical {
        /// Its class.
        class: u16,
        /// Its type.
        kind: u8,
    },
    /// A Sluice option that appears twice.
    #[error("Sluice option {0:#04x} appears twice")]
    DuplicateOption(u8),
    /// No packet option: the receiver would not know the clock or the destination.
    #[error("no Sluice packet option (clock, destination)")]
    MissingPacketOption,
    /// Flag bits no Sluice version defines.
    #[error("unknown flag bits {0:#04x}")]
    UnknownFlags(u8),
    /// More labels than a packet carries.
    #[error("{0} labels; a packet carries at most {MAX_LABELS}")]
    TooManyLabels(usize),
    /// A note of a kind no Sluice version defines (a notes datagram, [`crate::notes`]).
    #[error("unknown note kind {0}")]
    UnknownNote(u8),
    /// A chain id that does not fit the 24-bit VNI.
    #[error("VNI {0} does not fit 24 bits")]
    VniTooLarge(u32),
}

/// A datagram read back: where it goes and what travels with it. The frame borrows from the
/// datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The chain (Geneve's VNI).
    pub vni: u32,
    /// The instance the sender's splitter chose.
    pub dest: InstanceId,
    /// The packet's metadata.
    pub meta: Meta,
    /// The sender's count of the datagrams it sent on this link, if it sent one (gaps are
    /// datagrams lost on the way).
    pub seq: Option<u64>,
    /// The packet's Ethernet frame.
    pub frame: &'a [u8],
}

/// Appends to `out` the datagram that carries `frame` with `meta` to instance `dest` of chain
/// `vni`. Options absent from the packet (no replay target, no labels) are left out.
pub fn encode(meta: &Meta, dest: InstanceId, vni: u32, frame: &[u8], out: &mut Vec<u8>) -> Result<(), WireError> {
    encode_sequenced(meta, dest, vni, None, frame, out)
}

/// [`encode`] with the link sequence option when `seq` is given: the receiver counts the
/// datagrams lost between the two ends from its gaps.
pub fn encode_sequenced(
    meta: &Meta,
    dest: InstanceId,
    vni: u32,
    seq: Option<u64>,
    frame: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    if vni > MAX_VNI {
        return Err(WireError::VniTooLarge(vni));
    }
    let labels = meta.labels.len();
    let option_words = (1 + PACKET_WORDS)
        + meta.target.map_or(0, |_| 2)
        + (1 + TIMES_WORDS)
        + if labels > 0 { 1 + LABEL_WORDS * labels as u8 } else { 0 }
        + seq.map_or(0, |_| 1 + SEQUENCE_WORDS);
    out.reserve(HEADER + usize::from(option_words) * 4 + frame.len());
    // Version 0; the C bit: critical options are present (the packet option always is).
    out.push(option_words);
    out.push(0x40);
    out.extend_from_slice(&PROTO_ETHERNET.to_be_bytes());
    out.extend_from_slice(&vni.to_be_bytes()[1..]);
    out.push(0);

    option(out, TYPE_PACKET, PACKET_WORDS);
    out.extend_from_slice(&meta.clock.0.to_be_bytes());
    out.extend_from_slice(&meta.xor.to_be_bytes());
    out.extend_from_slice(&dest.0.to_be_bytes());
    out.push(meta.flags.bits());
    out.push(0);
    out.extend_from_slice(&meta.in_port.to_be_bytes());
    if let Some(t) = meta.target {
        option(out, TYPE_REPLAY_TARGET, 1);
        out.extend_from_slice(&t.0.to_be_bytes());
    }
    option(out, TYPE_TIMES, TIMES_WORDS);
    out.extend_from_slice(&meta.ts_ns.to_be_bytes());
    out.extend_from_slice(&meta.ingress_ns.to_be_bytes());
    if labels > 0 {
        option(out, TYPE_LABELS, LABEL_WORDS * labels as u8);
        for (id, value) in meta.labels.iter() {
            out.extend_from_slice(&id.0.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
    if let Some(seq) = seq {
        option(out, TYPE_SEQUENCE, SEQUENCE_WORDS);
        out.extend_from_slice(&seq.to_be_bytes());
    }
    out.extend_from_slice(frame);
    Ok(())
}

pub(crate) fn option(out: &mut Vec<u8>, kind: u8, words: u8) {
    out.extend_from_slice(&OPTION_CLASS.to_be_bytes());
    out.push(kind);
    out.push(words & 0x1f);
}

/// Reads a datagram written by [`encode`] (or any Geneve sender that follows this layout).
/// Options of other classes are skipped unless critical; nothing in the datagram can make this
/// panic.
pub fn decode(datagram: &[u8]) -> Result<Decoded<'_>, WireError> {
    let Header { vni, words, options, end } = header(datagram, PROTO_ETHERNET)?;
    let mut meta = Meta::default();
    let mut seen = [false; 5];
    let mut dest = None;
    let mut seq = None;
    let mut at = 0;
    while at < options.len() {
        let (class, kind, words, body) = read_option(options, at, words)?;
        at += OPTION_HEADER + body.len();
        if class != OPTION_CLASS {
            if kind & CRITICAL != 0 {
                return Err(WireError::UnknownCritical { class, kind });
            }
            continue;
        }
        let slot = match kind {
            TYPE_PACKET => 0,
            TYPE_REPLAY_TARGET => 1,
            TYPE_TIMES => 2,
            TYPE_LABELS => 3,
            TYPE_SEQUENCE => 4,
            k if k & CRITICAL != 0 => return Err(WireError::UnknownCritical { class, kind }),
            _ => continue,
        };
        if std::mem::replace(&mut seen[slot], true) {
            return Err(WireError::DuplicateOption(kind));
        }
        let bad_length = WireError::OptionLength { kind, words };
        match kind {
            TYPE_PACKET => {
                let b: &[u8; 24] = body.try_into().map_err(|_| bad_length)?;
                meta.clock = Clock(u64::from_be_bytes(array(&b[0..8])));
                meta.xor = u64::from_be_bytes(array(&b[8..16]));
                dest = Some(InstanceId(u32::from_be_bytes(array(&b[16..20]))));
                meta.flags = MetaFlags::from_bits(b[20]).ok_or(WireError::UnknownFlags(b[20]))?;
                meta.in_port = u16::from_be_bytes([b[22], b[23]]);
            }
            TYPE_REPLAY_TARGET => {
                let b: &[u8; 4] = body.try_into().map_err(|_| bad_length)?;
                meta.target = Some(InstanceId(u32::from_be_bytes(*b)));
            }
            TYPE_TIMES => {
                let b: &[u8; 16] = body.try_into().map_err(|_| bad_length)?;
                meta.ts_ns = u64::from_be_bytes(array(&b[0..8]));
                meta.ingress_ns = u64::from_be_bytes(array(&b[8..16]));
            }
            TYPE_SEQUENCE => {
                let b: &[u8; 8] = body.try_into().map_err(|_| bad_length)?;
                seq = Some(u64::from_be_bytes(*b));
            }
            _ => meta.labels = labels(body, words)?,
        }
    }
    let dest = dest.ok_or(WireError::MissingPacketOption)?;
    let frame = datagram.get(end..).unwrap_or_default();
    Ok(Decoded { vni, dest, meta, seq, frame })
}

/// A Geneve header read: its VNI, the option words it announces, the options area, and where
/// the payload starts.
pub(crate) struct Header<'a> {
    pub(crate) vni: u32,
    pub(crate) words: u8,
    pub(crate) options: &'a [u8],
    pub(crate) end: usize,
}

/// Checks `datagram`'s Geneve header (version 0, not a control message, protocol type
/// `protocol`, the options area present) and reads it.
pub(crate) fn header(datagram: &[u8], protocol: u16) -> Result<Header<'_>, WireError> {
    let h = datagram.get(..HEADER).ok_or(WireError::Truncated { need: HEADER, have: datagram.len() })?;
    if h[0] >> 6 != 0 {
        return Err(WireError::Version(h[0] >> 6));
    }
    if h[1] & 0x80 != 0 {
        return Err(WireError::Control);
    }
    let found = u16::from_be_bytes([h[2], h[3]]);
    if found != protocol {
        return Err(WireError::Protocol(found));
    }
    let vni = u32::from_be_bytes([0, h[4], h[5], h[6]]);
    let words = h[0] & 0x3f;
    let end = HEADER + usize::from(words) * 4;
    let options = datagram.get(HEADER..end).ok_or(WireError::Truncated { need: end, have: datagram.len() })?;
    Ok(Header { vni, words, options, end })
}

/// The link sequence number of a Sluice datagram (a packet or notes), if it carries one; `None`
/// for anything else, including damaged datagrams (their full decode says why).
pub fn link_seq(datagram: &[u8]) -> Option<u64> {
    let protocol = u16::from_be_bytes(datagram.get(2..4)?.try_into().ok()?);
    if protocol != PROTO_ETHERNET && protocol != crate::notes::PROTO_NOTES {
        return None;
    }
    let h = header(datagram, protocol).ok()?;
    let mut at = 0;
    while at < h.options.len() {
        let (class, kind, _, body) = read_option(h.options, at, h.words).ok()?;
        at += OPTION_HEADER + body.len();
        if class == OPTION_CLASS && kind == TYPE_SEQUENCE {
            return Some(u64::from_be_bytes(body.try_into().ok()?));
        }
    }
    None
}

/// The option at `at`: class, type, length in words and body.
pub(crate) fn read_option(options: &[u8], at: usize, announced: u8) -> Result<(u16, u8, u8, &[u8]), WireError> {
    let overrun = WireError::OptionOverrun { offset: at, words: announced };
    let h = options.get(at..at + OPTION_HEADER).ok_or(overrun.clone())?;
    let class = u16::from_be_bytes([h[0], h[1]]);
    let kind = h[2];
    let words = h[3] & 0x1f;
    let start = at + OPTION_HEADER;
    let body = options.get(start..start + usize::from(words) * 4).ok_or(overrun)?;
    Ok((class, kind, words, body))
}

fn labels(body: &[u8], words: u8) -> Result<Labels, WireError> {
    if body.is_empty() || !body.len().is_multiple_of(8) {
        return Err(WireError::OptionLength { kind: TYPE_LABELS, words });
    }
    let n = body.len() / 8;
    if n > MAX_LABELS {
        return Err(WireError::TooManyLabels(n));
    }
    let mut labels = Labels::default();
    for l in body.chunks_exact(8) {
        let id = LabelId(u16::from_be_bytes([l[0], l[1]]));
        labels.set(id, u32::from_be_bytes(array(&l[4..8])));
    }
    Ok(labels)
}

/// `N` bytes from a slice of exactly `N` (callers slice fixed ranges of fixed-size arrays).
fn array<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0; N];
    a.copy_from_slice(s);
    a
}

/// A UDP source port for the datagram carrying `pkt`, from its flow (RFC 8926, section 3.3:
/// entropy for ECMP, in the dynamic range 49152–65535): one flow's packets take one path.
pub fn source_port(pkt: &sluice_packet::Packet) -> u16 {
    use std::hash::{Hash, Hasher};
    let mut h = sluice_packet::Fnv1a::default();
    match pkt.tuple() {
        Some(t) => t.hash(&mut h),
        None => h.write(pkt.data().get(..14).unwrap_or(pkt.data())),
    }
    49152 + (h.finish() % 16384) as u16
}

/// An Ethernet/IPv4/UDP frame carrying `datagram` from `src` to `dst` on the Geneve port, as a
/// capture of the traffic between two nodes shows it (for pcap files and tests; the kernel
/// builds these headers when a [`crate::UdpLink`] sends).
pub fn capture_frame(
    src: std::net::SocketAddrV4,
    dst: std::net::SocketAddrV4,
    datagram: &[u8],
) -> Result<Vec<u8>, etherparse::err::packet::BuildWriteError> {
    let builder = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(src.ip().octets(), dst.ip().octets(), 64)
        .udp(src.port(), dst.port());
    let mut out = Vec::with_capacity(builder.size(datagram.len()));
    builder.write(&mut out, datagram)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
