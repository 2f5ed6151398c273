//! Corrupt and truncated inputs give typed errors, never panics.

mod common;

use common::{read_all, read_bytes, trace};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;
use proptest::prelude::*;
use sluice_io::{IoError, TraceReader};
use std::borrow::Cow;
use std::time::Duration;

fn small_pcap() -> Vec<u8> {
    std::fs::read(trace("irc-basic.pcap")).unwrap()
}

fn small_pcapng() -> Vec<u8> {
    let recs = read_all(&trace("irc-basic.pcap"));
    let mut w = PcapNgWriter::new(Vec::new()).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 0, options: vec![] })
        .unwrap();
    for r in &recs {
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::from_nanos(r.ts_ns / 1000),
            original_len: r.orig_len,
            data: Cow::Borrowed(&r.data),
            options: vec![],
        })
        .unwrap();
    }
    w.into_inner()
}

/// Offsets at which each record of a little-endian classic pcap starts.
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut v = Vec::new();
    let mut off = 24;
    while off < bytes.len() {
        v.push(off);
        off += 16 + u32::from_le_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize;
    }
    v
}

#[test]
fn missing_file() {
    let e = TraceReader::open("/nonexistent/sluice.pcap").unwrap_err();
    assert!(matches!(e, IoError::Open { .. }));
    assert!(e.to_string().contains("/nonexistent/sluice.pcap"), "{e}");
}

#[test]
fn empty_and_truncated_headers() {
    let bytes = small_pcap();
    for len in [0, 3, 4, 10, 23] {
        let (recs, err) = read_bytes(bytes[..len].to_vec());
        assert!(recs.is_empty());
        match err {
            Some(e @ IoError::TruncatedHeader { .. }) => {
                assert!(e.to_string().contains("mem.pcap"), "{e}")
            }
            other => panic!("len {len}: {other:?}"),
        }
    }
    // A header alone is an empty trace.
    let (recs, err) = read_bytes(bytes[..24].to_vec());
    assert!(recs.is_empty() && err.is_none());
    // A pcapng section header cut short.
    let ng = small_pcapng();
    for len in [4, 12, 20] {
        let (_, err) = read_bytes(ng[..len].to_vec());
        assert!(matches!(err, Some(IoError::TruncatedHeader { .. })), "len {len}: {err:?}");
    }
}

#[test]
fn garbage_magic() {
    let (_, err) = read_bytes(b"GET / HTTP/1.1\r\n\r\nhello world, definitely not pcap".to_vec());
    match err {
        Some(e @ IoError::BadMagic { magic: 0x4745_5420, .. }) => {
            assert!(e.to_string().contains("0x47455420"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn non_ethernet_pcap_is_refused_with_its_link_type() {
    let mut bytes = small_pcap();
    bytes[20..24].copy_from_slice(&113u32.to_le_bytes()); // LINUX_SLL
    match read_bytes(bytes).1 {
        Some(e @ IoError::UnsupportedLinkType { linktype: 113, interface: None, .. }) => {
            assert!(e.to_string().contains("LINUX_SLL"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn truncated_records_are_reported_with_their_number() {
    let bytes = small_pcap();
    let offs = record_offsets(&bytes);
    assert_eq!(offs.len(), 34);
    // Cut inside the 10th record's data, inside its header, and right after its header.
    for (cut, what) in [(offs[9] + 16 + 5, "data"), (offs[9] + 7, "header"), (offs[9] + 16, "data")] {
        let (recs, err) = read_bytes(bytes[..cut].to_vec());
        assert_eq!(recs.len(), 9);
        match err {
            Some(e @ IoError::TruncatedRecord { record: 10, .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("mem.pcap") && msg.contains("record 10") && msg.contains(what), "{msg}");
            }
            other => panic!("{other:?}"),
        }
    }
    // A cut exactly at a record boundary is a clean end.
    let (recs, err) = read_bytes(bytes[..offs[9]].to_vec());
    assert_eq!(recs.len(), 9);
    assert!(err.is_none());
}

#[test]
fn huge_caplen() {
    let mut bytes = small_pcap();
    let offs = record_offsets(&bytes);
    bytes[offs[3] + 8..offs[3] + 12].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    let (recs, err) = read_bytes(bytes);
    assert_eq!(recs.len(), 3);
    match err {
        Some(IoError::RecordTooLarge { record: 4, caplen: 0x7fff_ffff, .. }) => {}
        other => panic!("{other:?}"),
    }
    // Just above MAX_FRAME, in pcapng.
    let mut w = PcapNgWriter::new(Vec::new()).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 0, options: vec![] })
        .unwrap();
    let big = vec![0u8; sluice_packet::MAX_FRAME + 1];
    w.write_pcapng_block(EnhancedPacketBlock {
        interface_id: 0,
        timestamp: Duration::ZERO,
        original_len: big.len() as u32,
        data: Cow::Borrowed(&big),
        options: vec![],
    })
    .unwrap();
    let (recs, err) = read_bytes(w.into_inner());
    assert!(recs.is_empty());
    assert!(matches!(err, Some(IoError::RecordTooLarge { record: 1, .. })), "{err:?}");
}

#[test]
fn truncated_pcapng() {
    let ng = small_pcapng();
    let (all, err) = read_bytes(ng.clone());
    assert!(err.is_none());
    assert_eq!(all.len(), 34);
    let (recs, err) = read_bytes(ng[..ng.len() - 10].to_vec());
    assert_eq!(recs.len(), 33);
    assert!(matches!(err, Some(IoError::TruncatedRecord { record: 34, .. })), "{err:?}");
}

#[test]
fn pcapng_packet_for_unknown_interface() {
    let mut w = PcapNgWriter::with_endianness(Vec::new(), pcap_file::Endianness::Big).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 0, options: vec![] })
        .unwrap();
    let mut bytes = w.into_inner();
    // An EPB naming interface 5 (hand-written: the writer refuses it).
    let data = [0u8; 60];
    let total = 32 + data.len() as u32;
    for v in [6u32, total, 5, 0, 0, data.len() as u32, data.len() as u32] {
        bytes.extend_from_slice(&v.to_be_bytes());
    }
    bytes.extend_from_slice(&data);
    bytes.extend_from_slice(&total.to_be_bytes());
    let (_, err) = read_bytes(bytes);
    match err {
        Some(e @ IoError::Malformed { record: 1, .. }) => {
            assert!(e.to_string().contains("interface 5"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

/// Reads `bytes` to the end; any outcome but a panic is fine, and what was read is consistent.
fn read_never_panics(bytes: Vec<u8>) {
    let (recs, _err) = read_bytes(bytes);
    for r in recs {
        assert!(r.data.len() <= sluice_packet::MAX_FRAME);
    }
}

proptest! {

    #[test]
    fn random_bytes_after_each_magic(magic in 0usize..5, rest in proptest::collection::vec(any::<u8>(), 0..600)) {
        let magics: [[u8; 4]; 5] =
            [[0xd4, 0xc3, 0xb2, 0xa1], [0xa1, 0xb2, 0xc3, 0xd4], [0x4d, 0x3c, 0xb2, 0xa1], [0xa1, 0xb2, 0x3c, 0x4d], [0x0a, 0x0d, 0x0d, 0x0a]];
        let mut bytes = magics[magic].to_vec();
        bytes.extend(rest);
        read_never_panics(bytes);
    }

    #[test]
    fn truncated_real_files(cut in 0usize..100_000, ng in any::<bool>()) {
        let bytes = if ng { small_pcapng() } else { small_pcap() };
        let cut = cut % (bytes.len() + 1);
        let (recs, err) = read_bytes(bytes[..cut].to_vec());
        // Truncation never invents records, and either ends cleanly or says why.
        prop_assert!(recs.len() <= 34);
        if let Some(e) = err {
            prop_assert!(matches!(e, IoError::TruncatedHeader { .. } | IoError::TruncatedRecord { .. }), "{e}");
        }
    }

    #[test]
    fn mutated_real_files(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..12),
        ng in any::<bool>(),
    ) {
        let mut bytes = if ng { small_pcapng() } else { small_pcap() };
        for (pos, val) in edits {
            let n = bytes.len();
            bytes[pos % n] = val;
        }
        read_never_panics(bytes);
    }
}
