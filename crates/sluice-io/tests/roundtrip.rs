//! Writing traces and reading them back: classic pcap in both precisions and byte orders, and
//! pcapng with several interfaces of different timestamp resolutions.

mod common;

use common::{read_all, read_bytes, trace, Rec};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::blocks::simple_packet::SimplePacketBlock;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::{DataLink, Endianness};
use sluice_io::{IoError, Precision, TraceFormat, TraceReader, TraceWriter};
use std::borrow::Cow;
use std::path::Path;
use std::time::Duration;

fn write(path: &Path, recs: &[Rec], precision: Precision) {
    let mut w = TraceWriter::create(path, precision).unwrap();
    for r in recs {
        w.write_record(r.ts_ns, &r.data, r.orig_len).unwrap();
    }
    assert_eq!(w.finish().unwrap(), recs.len() as u64);
}

#[test]
fn pcap_round_trip_micro_and_nano() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["ssh_ssh.pcap", "http_bro.org.pcap", "dns-edns-cookie.pcap", "echo-connections.pcap"] {
        let orig = read_all(&trace(name));
        for precision in [Precision::Micro, Precision::Nano] {
            let out = dir.path().join(format!("{name}.{precision:?}"));
            write(&out, &orig, precision);
            let mut reader = TraceReader::open(&out).unwrap();
            let expected_format = match precision {
                Precision::Micro => TraceFormat::PcapMicro,
                Precision::Nano => TraceFormat::PcapNano,
            };
            assert_eq!(reader.format(), expected_format);
            let back = read_all(&out);
            assert_eq!(back.len(), orig.len(), "{name}");
            // The originals have microsecond timestamps: both precisions keep them exactly.
            assert_eq!(back, orig, "{name} {precision:?}");
            assert!(reader.next_record().unwrap().is_some());
        }
        // Written micro records are byte-identical to the original file's records.
        let original_bytes = std::fs::read(trace(name)).unwrap();
        let written = std::fs::read(dir.path().join(format!("{name}.Micro"))).unwrap();
        assert_eq!(written[24..], original_bytes[24..], "{name}");
        assert_eq!(written[..4], [0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(u32::from_le_bytes(written[16..20].try_into().unwrap()), 65_535);
        assert_eq!(u32::from_le_bytes(written[20..24].try_into().unwrap()), 1);
    }
}

#[test]
fn nanosecond_timestamps_survive_nano_and_are_truncated_by_micro() {
    let dir = tempfile::tempdir().unwrap();
    let frame = vec![0xabu8; 60];
    let ts = [1_600_000_000_123_456_789u64, 1_600_000_000_123_456_999, 1_600_000_001_000_000_001];
    let recs: Vec<Rec> = ts.iter().map(|&t| Rec { ts_ns: t, data: frame.clone(), orig_len: 60 }).collect();
    let nano = dir.path().join("n.pcap");
    write(&nano, &recs, Precision::Nano);
    assert_eq!(read_all(&nano), recs);
    let micro = dir.path().join("u.pcap");
    write(&micro, &recs, Precision::Micro);
    let back: Vec<u64> = read_all(&micro).iter().map(|r| r.ts_ns).collect();
    assert_eq!(back, ts.iter().map(|t| t / 1000 * 1000).collect::<Vec<_>>());
}

#[test]
fn writer_refuses_what_pcap_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = TraceWriter::create(dir.path().join("x.pcap"), Precision::default()).unwrap();
    let e = w.write(u64::from(u32::MAX) * 1_000_000_000 + 1_000_000_000, &[0; 60]).unwrap_err();
    assert!(matches!(e, IoError::TimestampRange { record: 1, .. }), "{e}");
    let e = w.write(1, &vec![0; sluice_packet::MAX_FRAME + 1]).unwrap_err();
    assert!(matches!(e, IoError::FrameTooLarge { .. }), "{e}");
    // Larger than the snap length but within MAX_FRAME: cut to the snap length, original length kept.
    w.write(5_000, &vec![7; 65_540]).unwrap();
    w.finish().unwrap();
    let back = read_all(&dir.path().join("x.pcap"));
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].data.len(), 65_535);
    assert_eq!(back[0].orig_len, 65_540);
    assert_eq!(back[0].ts_ns, 5_000);
    let e = TraceWriter::create(dir.path().join("no/such/dir/x.pcap"), Precision::Micro).unwrap_err();
    assert!(matches!(e, IoError::Open { .. }), "{e}");
}

/// Rewrites a little-endian pcap file in big-endian byte order.
fn to_big_endian(le: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(le.len());
    let swap32 = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap()).to_be_bytes();
    let swap16 = |b: &[u8]| u16::from_le_bytes(b.try_into().unwrap()).to_be_bytes();
    out.extend_from_slice(&swap32(&le[0..4]));
    out.extend_from_slice(&swap16(&le[4..6]));
    out.extend_from_slice(&swap16(&le[6..8]));
    for i in 0..4 {
        out.extend_from_slice(&swap32(&le[8 + 4 * i..12 + 4 * i]));
    }
    let mut off = 24;
    while off < le.len() {
        let caplen = u32::from_le_bytes(le[off + 8..off + 12].try_into().unwrap()) as usize;
        for i in 0..4 {
            out.extend_from_slice(&swap32(&le[off + 4 * i..off + 4 * i + 4]));
        }
        out.extend_from_slice(&le[off + 16..off + 16 + caplen]);
        off += 16 + caplen;
    }
    out
}

#[test]
fn big_endian_pcap_micro_and_nano() {
    let dir = tempfile::tempdir().unwrap();
    let orig = read_all(&trace("ftp_ipv4.pcap"));
    for precision in [Precision::Micro, Precision::Nano] {
        let le_path = dir.path().join("le.pcap");
        write(&le_path, &orig, precision);
        let be = to_big_endian(&std::fs::read(&le_path).unwrap());
        let magic = if precision == Precision::Micro { 0xa1b2c3d4u32 } else { 0xa1b23c4d };
        assert_eq!(be[..4], magic.to_be_bytes());
        let (back, err) = read_bytes(be);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(back, orig);
    }
}

fn idb(linktype: DataLink, options: Vec<InterfaceDescriptionOption<'static>>) -> InterfaceDescriptionBlock<'static> {
    InterfaceDescriptionBlock { linktype, snaplen: 65_535, options }
}

fn epb(interface_id: u32, raw_ts: u64, data: &[u8], orig_len: u32) -> EnhancedPacketBlock<'_> {
    EnhancedPacketBlock {
        interface_id,
        timestamp: Duration::from_nanos(raw_ts),
        original_len: orig_len,
        data: Cow::Borrowed(data),
        options: vec![],
    }
}

/// Converts records to pcapng: interface 0 with nanosecond resolution, interface 1 with the
/// default (microsecond), interface 2 with 2^-20 s units and a 10 s offset; records are spread
/// over them in turn.
fn to_pcapng(recs: &[Rec], endianness: Endianness) -> Vec<u8> {
    let mut w = PcapNgWriter::with_endianness(Vec::new(), endianness).unwrap();
    w.write_pcapng_block(idb(DataLink::ETHERNET, vec![InterfaceDescriptionOption::IfTsResol(9)])).unwrap();
    w.write_pcapng_block(idb(DataLink::ETHERNET, vec![])).unwrap();
    w.write_pcapng_block(idb(
        DataLink::ETHERNET,
        vec![InterfaceDescriptionOption::IfTsResol(0x80 | 20), InterfaceDescriptionOption::IfTsOffset(10)],
    ))
    .unwrap();
    for (i, r) in recs.iter().enumerate() {
        let iface = (i % 3) as u32;
        let raw = match iface {
            0 => r.ts_ns,
            1 => r.ts_ns / 1_000,
            // Units of 2^-20 s since epoch+10 s; exact for whole seconds only, see the test.
            _ => (r.ts_ns / 1_000_000_000 - 10) << 20,
        };
        w.write_pcapng_block(epb(iface, raw, &r.data, r.orig_len)).unwrap();
    }
    w.into_inner()
}

#[test]
fn pcapng_round_trip_with_several_interfaces() {
    let orig = read_all(&trace("http_methods.pcap"));
    for endianness in [Endianness::Little, Endianness::Big] {
        let bytes = to_pcapng(&orig, endianness);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.pcapng");
        std::fs::write(&path, &bytes).unwrap();
        let reader = TraceReader::open(&path).unwrap();
        assert_eq!(reader.format(), TraceFormat::PcapNg);
        let back = read_all(&path);
        assert_eq!(back.len(), orig.len());
        for (i, (b, o)) in back.iter().zip(&orig).enumerate() {
            assert_eq!(b.data, o.data, "record {i}");
            assert_eq!(b.orig_len, o.orig_len, "record {i}");
            let expected_ts = if i % 3 == 2 { o.ts_ns / 1_000_000_000 * 1_000_000_000 } else { o.ts_ns };
            assert_eq!(b.ts_ns, expected_ts, "record {i} ({endianness:?})");
        }
        let s = sluice_io::summarize(&path).unwrap();
        assert_eq!(s.packets, orig.len() as u64);
        assert_eq!(s.format, TraceFormat::PcapNg);
    }
}

#[test]
fn pcapng_simple_packets_and_non_ethernet_interfaces() {
    let orig = read_all(&trace("irc-basic.pcap"));
    let mut w = PcapNgWriter::new(Vec::new()).unwrap();
    // Interface 0 has a snap length of 100: simple packet blocks are cut to it.
    w.write_pcapng_block(InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 100, options: vec![] })
        .unwrap();
    w.write_pcapng_block(idb(DataLink::RAW, vec![])).unwrap();
    w.write_pcapng_block(epb(0, orig[0].ts_ns / 1000, &orig[0].data, orig[0].orig_len)).unwrap();
    let long = orig.iter().find(|r| r.data.len() > 100).unwrap();
    w.write_pcapng_block(SimplePacketBlock { original_len: long.data.len() as u32, data: Cow::Borrowed(&long.data) })
        .unwrap();
    w.write_pcapng_block(SimplePacketBlock { original_len: 60, data: Cow::Borrowed(&orig[1].data[..60]) }).unwrap();
    w.write_pcapng_block(epb(1, 0, &[0x45; 40], 40)).unwrap();
    w.write_pcapng_block(epb(0, 0, &orig[2].data, orig[2].orig_len)).unwrap();
    let (back, err) = read_bytes(w.into_inner());
    assert_eq!(back.len(), 3, "{err:?}");
    assert_eq!(back[0].data, orig[0].data);
    // A simple packet has the previous packet's timestamp and is cut at interface 0's snap length.
    assert_eq!(back[1].ts_ns, back[0].ts_ns);
    assert_eq!(back[1].data, long.data[..100]);
    assert_eq!(back[1].orig_len as usize, long.data.len());
    assert_eq!(back[2].data, orig[1].data[..60]);
    match err {
        Some(e @ IoError::UnsupportedLinkType { linktype: 101, interface: Some(1), .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("RAW") && msg.contains("101") && msg.contains("record 4"), "{msg}");
        }
        other => panic!("expected an unsupported link type error, got {other:?}"),
    }
}
