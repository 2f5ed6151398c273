//! What a node tells the root's node about the packets it handled: the root's notes, in
//! batches, on the same UDP socket as the packets.
//!
//! When a chain's instances sit on several nodes, the root keeps its log and its in-flight
//! window on its own node; an instance elsewhere that makes a mirror copy, drops a packet or has
//! its updates acknowledged says so in a note, as a worker thread does in one process. A notes
//! datagram is a Geneve header (RFC 8926) whose protocol type is [`PROTO_NOTES`] (0x88B5, the
//! IEEE "local experimental" EtherType) with one option, the link sequence (as on packets:
//! the receiver sees what a link lost), followed by the notes, [`NOTE_LEN`] bytes each:
//!
//! | bytes | content |
//! |---|---|
//! | 1 | kind: 1 sent, 2 finished, 3 commit, 4 reached, 5 left, 6 lost, 7 crashed, 8 processed, 16 end of the run, 17 hello, 18 stop, 19 resend, 20 last, 21 oldest, 22 admitted, 23 done, 24 flushed |
//! | 1 | the packet's flags |
//! | 2 | 0 |
//! | 4 | replay target instance, `0xFFFFFFFF` for none |
//! | 8 | logical clock (hello, end, stop, flushed: the sender's fingerprint of the chain and placement) |
//! | 8 | XOR vector (a commit: the acknowledged updates' XOR) |
//!
//! Every integer is big-endian. tcpdump and Wireshark decode the Geneve header and show the
//! notes as data. The layout is in docs/wire-format.md.

use crate::geneve::{
    header, option, read_option, Header, WireError, CRITICAL, HEADER, MAX_VNI, OPTION_CLASS, TYPE_SEQUENCE,
};
use sluice_packet::{Clock, InstanceId, Meta, MetaFlags};

/// Geneve's protocol type for a batch of notes (IEEE 802 "local experimental" EtherType).
pub const PROTO_NOTES: u16 = 0x88B5;
/// Bytes per note.
pub const NOTE_LEN: usize = 24;
/// Most notes in one datagram (keeps a datagram under 1,500 bytes).
pub const MAX_NOTES: usize = 60;
/// The sequence option: its header and 8 bytes.
const SEQUENCE_OPTION: usize = 12;
const NO_TARGET: u32 = u32::MAX;

/// What a note says about its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// A mirror copy was made.
    Sent,
    /// A copy ended inside the chain (dropped, consumed, without a route).
    Finished,
    /// The store acknowledged an instance's updates for the clock (XOR in the note).
    Commit,
    /// A replay copy reached its target.
    Reached,
    /// A copy left the chain.
    Left,
    /// From a node without the root, before its [`NoteKind::Crashed`]: one copy lost with the
    /// crashed instance (its clock, flags and replay target), which the root's log replays.
    Lost,
    /// From a node without the root, before its [`NoteKind::Crashed`]: clocks the crashed
    /// instance processed (the clock carries the first of 64, the XOR field a bit per clock),
    /// which its replacement does not run again.
    Processed,
    /// From a node without the root: one of its instances crashed (the target field names
    /// it, the XOR field carries its global index); the [`NoteKind::Lost`] notes just before
    /// are the copies it held, the [`NoteKind::Processed`] ones the clocks it processed. From
    /// here on the instance is the root's node's: it replaces it there, and the sender relays
    /// what still comes for it.
    Crashed,
    /// The run is over (from the root's node; the clock carries its fingerprint).
    End,
    /// A node is up (the clock carries its fingerprint of the chain and placement).
    Hello,
    /// The sender stops with an error: the run cannot go on (the clock carries its
    /// fingerprint).
    Stop,
    /// The sender misses datagrams of the receiver's link sequence: the clock carries the
    /// first missing sequence number, the XOR field how many follow it (gaps are asked for
    /// one range at a time, the oldest first).
    Resend,
    /// Where the run ended, from the root's node in the datagram that carries its `End`: the
    /// clock carries the last clock the root stamped, the XOR field the last input packet's
    /// capture time (ns). A recorded run's other nodes fire the timers due by then with that
    /// clock, as the root's node does.
    Last,
    /// From the root's node, every few milliseconds while it changes: the oldest clock its log
    /// still holds (in the clock). Nothing below it is replayed again, so the other nodes
    /// forget what their instances emitted for those clocks (kept for replays passing through).
    Oldest,
    /// From the root's node to a node hosting order-sensitive instances, every few tens of
    /// microseconds while it changes: the clock carries the last clock the root admitted, the
    /// XOR field a sequence number below which every clock is finished. Sent first in a
    /// datagram of [`NoteKind::Done`] notes.
    Admitted,
    /// After [`NoteKind::Admitted`]: the clock carries a first clock, the XOR field 64 bits,
    /// bit `i` set when clock `first + i` is done with as far as the vertex in the target
    /// field is concerned (finished, or gone past it for good), so that its instances may
    /// take the next clocks in entry order.
    Done,
    /// From a node without the root, after the root's node said [`NoteKind::End`]: its
    /// instances have fired the timers due at the run's end and their state is in the store,
    /// so the root's node may read the state of the vertices it shares with other nodes for a
    /// recorded run (the clock carries the sender's fingerprint).
    Flushed,
}

impl NoteKind {
    fn byte(self) -> u8 {
        match self {
            NoteKind::Sent => 1,
            NoteKind::Finished => 2,
            NoteKind::Commit => 3,
            NoteKind::Reached => 4,
            NoteKind::Left => 5,
            NoteKind::Lost => 6,
            NoteKind::Crashed => 7,
            NoteKind::Processed => 8,
            NoteKind::End => 16,
            NoteKind::Hello => 17,
            NoteKind::Stop => 18,
            NoteKind::Resend => 19,
            NoteKind::Last => 20,
            NoteKind::Oldest => 21,
            NoteKind::Admitted => 22,
            NoteKind::Done => 23,
            NoteKind::Flushed => 24,
        }
    }
    fn from_byte(b: u8) -> Option<NoteKind> {
        Some(match b {
            1 => NoteKind::Sent,
            2 => NoteKind::Finished,
            3 => NoteKind::Commit,
            4 => NoteKind::Reached,
            5 => NoteKind::Left,
            6 => NoteKind::Lost,
            7 => NoteKind::Crashed,
            8 => NoteKind::Processed,
            16 => NoteKind::End,
            17 => NoteKind::Hello,
            18 => NoteKind::Stop,
            19 => NoteKind::Resend,
            20 => NoteKind::Last,
            21 => NoteKind::Oldest,
            22 => NoteKind::Admitted,
            23 => NoteKind::Done,
            24 => NoteKind::Flushed,
            _ => return None,
        })
    }
}

/// One note: its kind and the packet metadata it is about (clock, flags, replay target, XOR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireNote {
    /// What it says.
    pub kind: NoteKind,
    /// The clock, flags, replay target and XOR vector (other fields are not sent).
    pub meta: Meta,
}

/// Whether `datagram` is a notes datagram of control notes (end, hello, stop, resend, ...), which
/// a sender sends alone and a receiver may act on out of sequence order.
pub fn is_control(datagram: &[u8]) -> bool {
    let Ok(h) = crate::geneve::header(datagram, PROTO_NOTES) else { return false };
    datagram.get(h.end).and_then(|k| NoteKind::from_byte(*k)).is_some_and(|k| k.byte() >= NoteKind::End.byte())
}

/// Whether `datagram` is a Geneve datagram carrying notes (rather than a packet).
pub fn is_notes(datagram: &[u8]) -> bool {
    datagram.get(2..4).is_some_and(|p| u16::from_be_bytes([p[0], p[1]]) == PROTO_NOTES)
}

/// Appends to `out` the datagram carrying `notes` (at most [`MAX_NOTES`]; the rest are left
/// out: callers chunk) for chain `vni`, number `seq` of its sender on this link.
pub fn encode_notes(vni: u32, seq: u64, notes: &[WireNote], out: &mut Vec<u8>) -> Result<(), WireError> {
    if vni > MAX_VNI {
        return Err(WireError::VniTooLarge(vni));
    }
    let notes = notes.get(..MAX_NOTES.min(notes.len())).unwrap_or_default();
    out.reserve(HEADER + SEQUENCE_OPTION + notes.len() * NOTE_LEN);
    // Version 0, the sequence option's 3 words, not a control message (the payload is the
    // notes), no critical option.
    out.extend_from_slice(&[(SEQUENCE_OPTION / 4) as u8, 0]);
    out.extend_from_slice(&PROTO_NOTES.to_be_bytes());
    out.extend_from_slice(&vni.to_be_bytes()[1..]);
    out.push(0);
    option(out, TYPE_SEQUENCE, 2);
    out.extend_from_slice(&seq.to_be_bytes());
    for n in notes {
        out.push(n.kind.byte());
        out.push(n.meta.flags.bits());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&n.meta.target.map_or(NO_TARGET, |t| t.0).to_be_bytes());
        out.extend_from_slice(&n.meta.clock.0.to_be_bytes());
        out.extend_from_slice(&n.meta.xor.to_be_bytes());
    }
    Ok(())
}

/// Reads a notes datagram into `out` (cleared first) and returns its VNI and link sequence
/// number, if it has one. All or nothing: a datagram with one bad note gives an error and no
/// notes; nothing in it can make this panic.
pub fn decode_notes(datagram: &[u8], out: &mut Vec<WireNote>) -> Result<(u32, Option<u64>), WireError> {
    out.clear();
    let Header { vni, words, options, end: start } = header(datagram, PROTO_NOTES)?;
    let mut seq = None;
    let mut at = 0;
    while at < options.len() {
        let (class, kind, words_here, body) = read_option(options, at, words)?;
        at += 4 + body.len();
        match (class == OPTION_CLASS, kind) {
            (true, TYPE_SEQUENCE) => {
                let b: [u8; 8] = body.try_into().map_err(|_| WireError::OptionLength { kind, words: words_here })?;
                seq = Some(u64::from_be_bytes(b));
            }
            _ if kind & CRITICAL != 0 => return Err(WireError::UnknownCritical { class, kind }),
            _ => {}
        }
    }
    let body = datagram.get(start..).unwrap_or_default();
    if !body.len().is_multiple_of(NOTE_LEN) {
        let need = start + body.len().div_ceil(NOTE_LEN) * NOTE_LEN;
        return Err(WireError::Truncated { need, have: datagram.len() });
    }
    for n in body.chunks_exact(NOTE_LEN) {
        let Some(kind) = NoteKind::from_byte(n[0]) else {
            out.clear();
            return Err(WireError::UnknownNote(n[0]));
        };
        let Some(flags) = MetaFlags::from_bits(n[1]) else {
            out.clear();
            return Err(WireError::UnknownFlags(n[1]));
        };
        let target = u32::from_be_bytes([n[4], n[5], n[6], n[7]]);
        let meta = Meta {
            clock: Clock(u64::from_be_bytes(eight(&n[8..16]))),
            flags,
            target: (target != NO_TARGET).then_some(InstanceId(target)),
            xor: u64::from_be_bytes(eight(&n[16..24])),
            ..Meta::default()
        };
        out.push(WireNote { kind, meta });
    }
    Ok((vni, seq))
}

fn eight(s: &[u8]) -> [u8; 8] {
    let mut a = [0; 8];
    a.copy_from_slice(s);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(kind: NoteKind, clock: u64) -> WireNote {
        let mut meta = Meta { clock: Clock(clock), xor: clock.wrapping_mul(0x9E37), ..Meta::default() };
        if clock.is_multiple_of(2) {
            meta.flags.insert(MetaFlags::REPLAYED);
            meta.target = Some(InstanceId(7));
        }
        WireNote { kind, meta }
    }

    #[test]
    fn notes_travel_unchanged() {
        let kinds = [
            NoteKind::Sent,
            NoteKind::Finished,
            NoteKind::Commit,
            NoteKind::Reached,
            NoteKind::Left,
            NoteKind::End,
            NoteKind::Hello,
            NoteKind::Stop,
            NoteKind::Resend,
            NoteKind::Last,
            NoteKind::Oldest,
            NoteKind::Admitted,
            NoteKind::Done,
            NoteKind::Flushed,
        ];
        let notes: Vec<WireNote> = kinds.iter().enumerate().map(|(i, k)| note(*k, i as u64 + 1)).collect();
        let mut d = Vec::new();
        encode_notes(42, 9, &notes, &mut d).unwrap();
        assert!(is_notes(&d));
        assert_eq!(d.len(), HEADER + SEQUENCE_OPTION + notes.len() * NOTE_LEN);
        let mut back = Vec::new();
        assert_eq!(decode_notes(&d, &mut back).unwrap(), (42, Some(9)));
        assert_eq!(back, notes);
        assert_eq!(crate::link_seq(&d), Some(9));
        assert!(!is_control(&d), "data notes first");
        for (kind, control) in [
            (NoteKind::Hello, true),
            (NoteKind::Resend, true),
            (NoteKind::Admitted, true),
            (NoteKind::Flushed, true),
            (NoteKind::Commit, false),
        ] {
            let mut c = Vec::new();
            encode_notes(42, 10, &[note(kind, 1)], &mut c).unwrap();
            assert_eq!(is_control(&c), control, "{kind:?}");
        }
        assert!(!is_control(&d[..10]), "cut short");
    }

    #[test]
    fn one_datagram_holds_at_most_max_notes() {
        let notes: Vec<WireNote> = (0..100).map(|c| note(NoteKind::Finished, c)).collect();
        let mut d = Vec::new();
        encode_notes(1, 0, &notes, &mut d).unwrap();
        assert!(d.len() <= 1500, "{} bytes", d.len());
        let mut back = Vec::new();
        decode_notes(&d, &mut back).unwrap();
        assert_eq!(back, notes[..MAX_NOTES]);
    }

    #[test]
    fn damaged_notes_are_refused_whole() {
        let notes: Vec<WireNote> = (0..3).map(|c| note(NoteKind::Sent, c)).collect();
        let mut d = Vec::new();
        encode_notes(1, 0, &notes, &mut d).unwrap();
        let mut back = Vec::new();
        // A cut in the middle of a note.
        assert!(matches!(decode_notes(&d[..d.len() - 5], &mut back), Err(WireError::Truncated { .. })));
        assert!(back.is_empty());
        // An unknown kind in the second note.
        let mut bad = d.clone();
        bad[HEADER + SEQUENCE_OPTION + NOTE_LEN] = 99;
        assert_eq!(decode_notes(&bad, &mut back), Err(WireError::UnknownNote(99)));
        assert!(back.is_empty());
        // Unknown flag bits.
        let mut bad = d.clone();
        bad[HEADER + SEQUENCE_OPTION + 1] = 0xff;
        assert!(matches!(decode_notes(&bad, &mut back), Err(WireError::UnknownFlags(_))));
        // A packet datagram is not notes, and the reverse.
        let mut pkt = Vec::new();
        crate::geneve::encode(&Meta::default(), InstanceId(1), 1, &[0; 20], &mut pkt).unwrap();
        assert!(!is_notes(&pkt));
        assert!(matches!(decode_notes(&pkt, &mut back), Err(WireError::Protocol(_))));
        assert!(matches!(crate::geneve::decode(&d), Err(WireError::Protocol(PROTO_NOTES))));
        // Anything short.
        for n in 0..HEADER {
            assert!(decode_notes(&d[..n], &mut back).is_err());
        }
    }

    #[test]
    fn any_bytes_decode_without_panicking() {
        let mut d = Vec::new();
        encode_notes(3, 1, &[note(NoteKind::Commit, 5)], &mut d).unwrap();
        let mut back = Vec::new();
        for i in 0..d.len() {
            for b in [0u8, 0x3f, 0x80, 0xff] {
                let mut x = d.clone();
                x[i] = b;
                let _ = decode_notes(&x, &mut back);
            }
        }
        // No sequence option: still notes, without a number.
        let mut bare = d[..HEADER].to_vec();
        bare[0] = 0;
        bare.extend_from_slice(&d[HEADER + SEQUENCE_OPTION..]);
        assert_eq!(decode_notes(&bare, &mut back).unwrap(), (3, None));
        assert_eq!(back.len(), 1);
    }

    #[test]
    fn vni_must_fit() {
        assert_eq!(encode_notes(MAX_VNI + 1, 0, &[], &mut Vec::new()), Err(WireError::VniTooLarge(MAX_VNI + 1)));
    }
}
