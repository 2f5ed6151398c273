//! Reading pcap and pcapng traces, writing classic pcap.
//!
//! [`TraceReader`] detects the format from the magic number: classic pcap with microsecond or
//! nanosecond timestamps in either byte order, or pcapng (any byte order, several sections and
//! interfaces, per-interface `if_tsresol` and `if_tsoffset`). Records are streamed one at a
//! time into a buffer owned by the reader, so steady-state reading allocates nothing.
//!
//! Decisions worth knowing:
//! - Only Ethernet (link type 1) is accepted. A classic pcap file of another link type is
//!   refused at [`TraceReader::open`]; in pcapng the error comes with the first packet captured
//!   on a non-Ethernet interface (interfaces without packets are harmless).
//! - A file that ends inside a record (a capture cut short) is an error
//!   ([`IoError::TruncatedRecord`]) rather than a silent end of trace: the records before it are
//!   returned normally, the error comes instead of the partial record.
//! - After any error the reader is finished: further calls return `Ok(None)`.
//! - pcapng Simple Packet Blocks carry no timestamp; they get the timestamp of the packet before
//!   them (0 if none), so timestamps never go backwards because of them. Their captured length is
//!   the smaller of the original length and interface 0's snap length.
//! - Blocks other than packets and section/interface descriptions (statistics, name resolution,
//!   custom blocks, ...) are skipped without being decoded.
//! - Records whose captured length exceeds [`MAX_FRAME`] are refused with
//!   [`IoError::RecordTooLarge`]. A captured length larger than the original length or the snap
//!   length is tolerated (some writers get those fields wrong).

use crate::IoError;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::blocks::{
    ENHANCED_PACKET_BLOCK, INTERFACE_DESCRIPTION_BLOCK, PACKET_BLOCK, SECTION_HEADER_BLOCK, SIMPLE_PACKET_BLOCK,
};
use pcap_file::pcapng::PcapNgReader;
use pcap_file::{DataLink, Endianness, PcapError};
use sluice_packet::{Meta, Packet, PacketPool, MAX_FRAME};
use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter, Cursor, Read, Write};
use std::path::{Path, PathBuf};

/// The Ethernet link type number (`LINKTYPE_ETHERNET`).
pub const LINKTYPE_ETHERNET: u32 = 1;

/// Snap length written in the header of the pcap files [`TraceWriter`] creates.
pub const SNAPLEN: u32 = 65_535;

const NS_PER_SEC: u64 = 1_000_000_000;
const PCAP_MAGIC_MICRO: u32 = 0xA1B2_C3D4;
const PCAP_MAGIC_NANO: u32 = 0xA1B2_3C4D;
const PCAPNG_MAGIC: u32 = 0x0A0D_0D0A;
const READ_BUF: usize = 256 * 1024;

/// Timestamp precision of a classic pcap file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Microseconds (magic `0xa1b2c3d4`), readable by every tool.
    #[default]
    Micro,
    /// Nanoseconds (magic `0xa1b23c4d`).
    Nano,
}

/// The format of a trace file, as detected from its magic number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceFormat {
    /// Classic pcap with microsecond timestamps.
    PcapMicro,
    /// Classic pcap with nanosecond timestamps.
    PcapNano,
    /// pcapng.
    PcapNg,
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceFormat::PcapMicro => "pcap (microsecond timestamps)",
            TraceFormat::PcapNano => "pcap (nanosecond timestamps)",
            TraceFormat::PcapNg => "pcapng",
        })
    }
}

/// One packet record of a trace, borrowed from the reader until the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord<'a> {
    /// Capture time, nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// The captured bytes (an Ethernet frame, possibly cut at the snap length).
    pub data: &'a [u8],
    /// The frame's length on the wire (may exceed `data.len()` when the capture was truncated).
    pub orig_len: u32,
}

/// A streaming reader of pcap and pcapng files; see the [module documentation](self).
pub struct TraceReader {
    path: PathBuf,
    format: TraceFormat,
    inner: Inner,
    buf: Vec<u8>,
    records: u64,
    done: bool,
}

impl fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceReader")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("records", &self.records)
            .field("done", &self.done)
            .finish()
    }
}

type DynRead = Box<dyn Read + Send>;

enum Inner {
    Pcap(PcapIn),
    Ng(Box<NgIn>),
}

struct PcapIn {
    reader: BufReader<DynRead>,
    big_endian: bool,
    nano: bool,
    /// Bytes of the reader's buffer the record handed out last still occupies: it was lent
    /// straight from the buffer, and is consumed when the next record is asked for.
    lent: usize,
}

/// Where a record's bytes are: in the reader's buffer (this range of it), or copied into
/// [`TraceReader`]'s own buffer (a record that straddles two reads).
enum Bytes {
    Lent(std::ops::Range<usize>),
    Copied,
}

struct NgIn {
    reader: PcapNgReader<DynRead>,
    endian: Endianness,
    ifaces: Vec<Iface>,
    last_ts: u64,
}

/// What the reader needs to know about a pcapng interface.
#[derive(Debug, Clone, Copy)]
struct Iface {
    linktype: u32,
    snaplen: u32,
    tsresol: u8,
    tsoffset: u64,
}

impl Iface {
    fn from_idb(idb: &InterfaceDescriptionBlock<'_>) -> Iface {
        let mut iface = Iface { linktype: u32::from(idb.linktype), snaplen: idb.snaplen, tsresol: 6, tsoffset: 0 };
        for opt in &idb.options {
            match opt {
                InterfaceDescriptionOption::IfTsResol(r) => iface.tsresol = *r,
                InterfaceDescriptionOption::IfTsOffset(o) => iface.tsoffset = *o,
                _ => {}
            }
        }
        iface
    }
}

/// Converts a pcapng timestamp in units of `tsresol` (the `if_tsresol` encoding: most significant
/// bit clear means 10^-n seconds, set means 2^-n seconds) plus the interface's `if_tsoffset` (a
/// signed number of seconds, stored as read) to nanoseconds; `None` when the result is negative or
/// does not fit in `u64`.
fn ng_ts_to_ns(raw: u64, tsresol: u8, offset_s: u64) -> Option<u64> {
    let raw = u128::from(raw);
    let exp = u32::from(tsresol & 0x7f);
    let ns = if tsresol & 0x80 == 0 {
        if exp <= 9 {
            raw * 10u128.pow(9 - exp)
        } else if exp - 9 <= 38 {
            raw / 10u128.pow(exp - 9)
        } else {
            0
        }
    } else {
        (raw * u128::from(NS_PER_SEC)) >> exp
    };
    // Both terms are below 2^95: no overflow in i128.
    let ns = i128::try_from(ns).ok()? + i128::from(offset_s as i64) * i128::from(NS_PER_SEC);
    u64::try_from(ns).ok()
}

/// Reads until `buf` is full or the input ends; returns the number of bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let Some(rest) = buf.get_mut(n..) else { break };
        match r.read(rest) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn u32_at(b: &[u8], off: usize, big: bool) -> Option<u32> {
    let a: [u8; 4] = b.get(off..off.checked_add(4)?)?.try_into().ok()?;
    Some(if big { u32::from_be_bytes(a) } else { u32::from_le_bytes(a) })
}

fn u16_at(b: &[u8], off: usize, big: bool) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    let a = [*s.first()?, *s.get(1)?];
    Some(if big { u16::from_be_bytes(a) } else { u16::from_le_bytes(a) })
}

fn linktype_name(linktype: u32) -> String {
    match DataLink::from(linktype) {
        DataLink::Unknown(_) => "UNKNOWN".to_string(),
        d => format!("{d:?}"),
    }
}

impl TraceReader {
    /// Opens a pcap or pcapng file, detecting the format from its magic number and reading its
    /// file header (the pcapng section header).
    pub fn open(path: impl AsRef<Path>) -> Result<TraceReader, IoError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| IoError::Open { path: path.clone(), source })?;
        TraceReader::from_reader(file, path)
    }

    /// Reads a trace from any byte stream; `name` is used in error messages in place of a path.
    pub fn from_reader<R: Read + Send + 'static>(
        mut reader: R,
        name: impl Into<PathBuf>,
    ) -> Result<TraceReader, IoError> {
        let path = name.into();
        let mut magic = [0u8; 4];
        let n = read_full(&mut reader, &mut magic).map_err(|source| IoError::Read {
            path: path.clone(),
            record: 0,
            source,
        })?;
        if n < magic.len() {
            return Err(IoError::TruncatedHeader {
                path,
                detail: format!("{n} bytes, too short for a pcap or pcapng magic number"),
            });
        }
        let magic_be = u32::from_be_bytes(magic);
        let (format, big_endian) = match magic_be {
            PCAP_MAGIC_MICRO => (TraceFormat::PcapMicro, true),
            PCAP_MAGIC_NANO => (TraceFormat::PcapNano, true),
            m if m.swap_bytes() == PCAP_MAGIC_MICRO => (TraceFormat::PcapMicro, false),
            m if m.swap_bytes() == PCAP_MAGIC_NANO => (TraceFormat::PcapNano, false),
            PCAPNG_MAGIC => (TraceFormat::PcapNg, false),
            _ => return Err(IoError::BadMagic { path, magic: magic_be }),
        };
        let inner = if format == TraceFormat::PcapNg {
            let chained: DynRead = Box::new(Cursor::new(magic).chain(reader));
            let ng = PcapNgReader::new(chained).map_err(|e| match e {
                PcapError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => IoError::TruncatedHeader {
                    path: path.clone(),
                    detail: "the pcapng section header block is cut short".to_string(),
                },
                PcapError::IoError(source) => IoError::Read { path: path.clone(), record: 0, source },
                PcapError::IncompleteBuffer => IoError::TruncatedHeader {
                    path: path.clone(),
                    detail: "the pcapng section header block is cut short".to_string(),
                },
                other => IoError::BadHeader { path: path.clone(), detail: format!("pcapng section header: {other}") },
            })?;
            let endian = ng.section().endianness;
            Inner::Ng(Box::new(NgIn { reader: ng, endian, ifaces: Vec::new(), last_ts: 0 }))
        } else {
            let mut rest = [0u8; 20];
            let n = read_full(&mut reader, &mut rest).map_err(|source| IoError::Read {
                path: path.clone(),
                record: 0,
                source,
            })?;
            if n < rest.len() {
                return Err(IoError::TruncatedHeader {
                    path,
                    detail: format!("{} bytes, a pcap file header needs 24", n + magic.len()),
                });
            }
            // Link type is the low 16 bits; the upper bits may carry FCS information.
            let linktype = u32_at(&rest, 16, big_endian).unwrap_or(0) & 0xffff;
            if linktype != LINKTYPE_ETHERNET {
                return Err(IoError::UnsupportedLinkType {
                    path,
                    record: 0,
                    linktype,
                    name: linktype_name(linktype),
                    interface: None,
                });
            }
            let boxed: DynRead = Box::new(reader);
            Inner::Pcap(PcapIn {
                reader: BufReader::with_capacity(READ_BUF, boxed),
                big_endian,
                nano: format == TraceFormat::PcapNano,
                lent: 0,
            })
        };
        Ok(TraceReader { path, format, inner, buf: Vec::with_capacity(2048), records: 0, done: false })
    }

    /// The detected file format.
    pub fn format(&self) -> TraceFormat {
        self.format
    }

    /// The path (or name) the reader was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Packet records returned so far.
    pub fn records_read(&self) -> u64 {
        self.records
    }

    /// The next packet record, `Ok(None)` at the end of the file. The record borrows the
    /// reader's buffer, which is reused for the next record.
    pub fn next_record(&mut self) -> Result<Option<TraceRecord<'_>>, IoError> {
        if self.done {
            return Ok(None);
        }
        let record = self.records + 1;
        let res = match &mut self.inner {
            Inner::Pcap(p) => next_pcap(p, &mut self.buf, &self.path, record),
            Inner::Ng(ng) => {
                next_ng(ng, &mut self.buf, &self.path, record).map(|r| r.map(|(t, o)| (t, o, Bytes::Copied)))
            }
        };
        match res {
            Ok(Some((ts_ns, orig_len, bytes))) => {
                self.records = record;
                let data = match (bytes, &self.inner) {
                    (Bytes::Lent(range), Inner::Pcap(p)) => p.reader.buffer().get(range).unwrap_or_default(),
                    _ => &self.buf[..],
                };
                Ok(Some(TraceRecord { ts_ns, data, orig_len }))
            }
            Ok(None) => {
                self.done = true;
                Ok(None)
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }

    /// The next record as a [`Packet`] taken from `pool`, with `meta.ts_ns` set to the capture
    /// time (other metadata left at its default); `Ok(None)` at the end of the file.
    pub fn read_packet(&mut self, pool: &PacketPool) -> Result<Option<Packet>, IoError> {
        Ok(self.next_record()?.map(|r| pool.packet(r.data, Meta { ts_ns: r.ts_ns, ..Meta::default() })))
    }
}

fn next_pcap(
    p: &mut PcapIn,
    buf: &mut Vec<u8>,
    path: &Path,
    record: u64,
) -> Result<Option<(u64, u32, Bytes)>, IoError> {
    use std::io::BufRead;
    p.reader.consume(std::mem::take(&mut p.lent));
    // The common case: the whole record is in the reader's buffer, and its bytes are lent from
    // there (no copy, no zeroing). One record per buffer refill takes the copying path below.
    let buffered = p.reader.buffer();
    if let Some(hdr) = buffered.get(..16) {
        let (ts_ns, caplen, orig_len) = record_header(p, hdr, path, record)?;
        let end = 16 + caplen;
        if buffered.len() >= end {
            p.lent = end;
            return Ok(Some((ts_ns, orig_len, Bytes::Lent(16..end))));
        }
    }
    let read_err = |source| IoError::Read { path: path.to_path_buf(), record, source };
    let mut hdr = [0u8; 16];
    let n = read_full(&mut p.reader, &mut hdr).map_err(read_err)?;
    if n == 0 {
        return Ok(None);
    }
    if n < hdr.len() {
        return Err(IoError::TruncatedRecord {
            path: path.to_path_buf(),
            record,
            detail: format!("record header has {n} of 16 bytes"),
        });
    }
    let (ts_ns, caplen, orig_len) = record_header(p, &hdr, path, record)?;
    buf.resize(caplen, 0);
    let got = read_full(&mut p.reader, buf).map_err(read_err)?;
    if got < caplen {
        return Err(IoError::TruncatedRecord {
            path: path.to_path_buf(),
            record,
            detail: format!("packet data has {got} of {caplen} bytes"),
        });
    }
    Ok(Some((ts_ns, orig_len, Bytes::Copied)))
}

/// A pcap record header's capture time (ns), captured length and length on the wire.
fn record_header(p: &PcapIn, hdr: &[u8], path: &Path, record: u64) -> Result<(u64, usize, u32), IoError> {
    let field = |off| u32_at(hdr, off, p.big_endian).unwrap_or(0);
    let (sec, frac, caplen, orig_len) = (field(0), field(4), field(8), field(12));
    let caplen_usize = usize::try_from(caplen).unwrap_or(usize::MAX);
    if caplen_usize > MAX_FRAME {
        return Err(IoError::RecordTooLarge {
            path: path.to_path_buf(),
            record,
            caplen: caplen.into(),
            max: MAX_FRAME,
        });
    }
    let frac_ns = if p.nano { u64::from(frac) } else { u64::from(frac) * 1_000 };
    // Cannot overflow: u32::MAX * 1e9 + u32::MAX * 1e3 < u64::MAX.
    Ok((u64::from(sec) * NS_PER_SEC + frac_ns, caplen_usize, orig_len))
}

fn map_ng_err(e: PcapError, path: &Path, record: u64) -> IoError {
    let truncated = || IoError::TruncatedRecord {
        path: path.to_path_buf(),
        record,
        detail: "pcapng block cut short by the end of the file (or larger than the 8 MB block limit)".to_string(),
    };
    match e {
        PcapError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => truncated(),
        PcapError::IncompleteBuffer => truncated(),
        PcapError::IoError(source) => IoError::Read { path: path.to_path_buf(), record, source },
        other => IoError::Malformed { path: path.to_path_buf(), record, detail: format!("pcapng: {other}") },
    }
}

fn next_ng(ng: &mut NgIn, buf: &mut Vec<u8>, path: &Path, record: u64) -> Result<Option<(u64, u32)>, IoError> {
    let malformed = |detail: String| IoError::Malformed { path: path.to_path_buf(), record, detail };
    loop {
        let raw = match ng.reader.next_raw_block() {
            None => return Ok(None),
            Some(Ok(raw)) => raw,
            Some(Err(e)) => return Err(map_ng_err(e, path, record)),
        };
        let ty = raw.type_;
        if matches!(ty, ENHANCED_PACKET_BLOCK | PACKET_BLOCK | SIMPLE_PACKET_BLOCK) {
            let big = ng.endian == Endianness::Big;
            let body: &[u8] = &raw.body;
            let field = |off| {
                u32_at(body, off, big)
                    .ok_or_else(|| malformed(format!("packet block of {} bytes is too short", body.len())))
            };
            let (iface_id, ts_raw, caplen, orig_len, data_off) = if ty == SIMPLE_PACKET_BLOCK {
                let orig_len = field(0)?;
                let snaplen = ng
                    .ifaces
                    .first()
                    .ok_or_else(|| malformed("simple packet block without an interface description".to_string()))?
                    .snaplen;
                let avail = u32::try_from(body.len().saturating_sub(4)).unwrap_or(u32::MAX);
                let mut caplen = orig_len.min(avail);
                if snaplen != 0 {
                    caplen = caplen.min(snaplen);
                }
                (0, None, caplen, orig_len, 4usize)
            } else {
                let iface_id = if ty == PACKET_BLOCK {
                    u16_at(body, 0, big)
                        .map(u32::from)
                        .ok_or_else(|| malformed("packet block too short".to_string()))?
                } else {
                    field(0)?
                };
                let ts = (u64::from(field(4)?) << 32) | u64::from(field(8)?);
                (iface_id, Some(ts), field(12)?, field(16)?, 20)
            };
            let iface = *usize::try_from(iface_id).ok().and_then(|i| ng.ifaces.get(i)).ok_or_else(|| {
                malformed(format!("packet refers to interface {iface_id}, the section describes {}", ng.ifaces.len()))
            })?;
            if iface.linktype != LINKTYPE_ETHERNET {
                return Err(IoError::UnsupportedLinkType {
                    path: path.to_path_buf(),
                    record,
                    linktype: iface.linktype,
                    name: linktype_name(iface.linktype),
                    interface: Some(iface_id),
                });
            }
            let caplen_usize = usize::try_from(caplen).unwrap_or(usize::MAX);
            if caplen_usize > MAX_FRAME {
                return Err(IoError::RecordTooLarge {
                    path: path.to_path_buf(),
                    record,
                    caplen: caplen.into(),
                    max: MAX_FRAME,
                });
            }
            let data = data_off
                .checked_add(caplen_usize)
                .and_then(|end| body.get(data_off..end))
                .ok_or_else(|| malformed(format!("captured length {caplen} exceeds the packet block")))?;
            let ts_ns = match ts_raw {
                Some(t) => ng_ts_to_ns(t, iface.tsresol, iface.tsoffset).ok_or_else(|| IoError::TimestampRange {
                    path: path.to_path_buf(),
                    record,
                    detail: format!("pcapng timestamp {t} (if_tsresol {:#x}) overflows u64 nanoseconds", iface.tsresol),
                })?,
                None => ng.last_ts,
            };
            buf.clear();
            buf.extend_from_slice(data);
            ng.last_ts = ts_ns;
            return Ok(Some((ts_ns, orig_len)));
        }
        if matches!(ty, SECTION_HEADER_BLOCK | INTERFACE_DESCRIPTION_BLOCK) {
            ng.endian = ng.reader.section().endianness;
            ng.ifaces.clear();
            ng.ifaces.extend(ng.reader.interfaces().iter().map(Iface::from_idb));
        }
    }
}

/// Reads a whole trace into memory as [`Packet`]s with `meta.ts_ns` set (the clock and other
/// metadata left at their defaults), stopping after `limit` packets when given.
pub fn load(path: impl AsRef<Path>, limit: Option<usize>) -> Result<Vec<Packet>, IoError> {
    let mut reader = TraceReader::open(path)?;
    let mut out = Vec::new();
    while limit.is_none_or(|l| out.len() < l) {
        match reader.next_record()? {
            Some(r) => out.push(Packet::from_slice(r.data, Meta { ts_ns: r.ts_ns, ..Meta::default() })),
            None => break,
        }
    }
    Ok(out)
}

/// Writes classic pcap files: little-endian, Ethernet link type, snap length [`SNAPLEN`],
/// microsecond or nanosecond timestamps, through a buffered writer. Call [`TraceWriter::finish`]
/// to flush and see write errors (dropping the writer flushes too, but ignores errors).
#[derive(Debug)]
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<File>,
    precision: Precision,
    records: u64,
}

impl TraceWriter {
    /// Creates (or truncates) `path` and writes the pcap file header.
    pub fn create(path: impl AsRef<Path>, precision: Precision) -> Result<TraceWriter, IoError> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).map_err(|source| IoError::Open { path: path.clone(), source })?;
        let mut w = TraceWriter { path, out: BufWriter::with_capacity(256 * 1024, file), precision, records: 0 };
        let magic = match precision {
            Precision::Micro => PCAP_MAGIC_MICRO,
            Precision::Nano => PCAP_MAGIC_NANO,
        };
        let mut hdr = [0u8; 24];
        let fields: [&[u8]; 7] = [
            &magic.to_le_bytes(),
            &2u16.to_le_bytes(),
            &4u16.to_le_bytes(),
            &0i32.to_le_bytes(),
            &0u32.to_le_bytes(),
            &SNAPLEN.to_le_bytes(),
            &LINKTYPE_ETHERNET.to_le_bytes(),
        ];
        let mut off = 0;
        for f in fields {
            if let Some(dst) = hdr.get_mut(off..off + f.len()) {
                dst.copy_from_slice(f);
            }
            off += f.len();
        }
        w.put(&hdr)?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), IoError> {
        self.out.write_all(bytes).map_err(|source| IoError::Write {
            path: self.path.clone(),
            records: self.records,
            source,
        })
    }

    /// Appends a frame captured at `ts_ns` (nanoseconds since the epoch); its original length is
    /// its length.
    pub fn write(&mut self, ts_ns: u64, data: &[u8]) -> Result<(), IoError> {
        let orig_len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.write_record(ts_ns, data, orig_len)
    }

    /// Appends a frame with an explicit original length (for frames that were captured
    /// truncated). Frames longer than [`SNAPLEN`] are cut to it, as a capture would; frames
    /// longer than [`MAX_FRAME`] are refused. In microsecond files the timestamp is truncated to
    /// the microsecond.
    pub fn write_record(&mut self, ts_ns: u64, data: &[u8], orig_len: u32) -> Result<(), IoError> {
        let record = self.records + 1;
        if data.len() > MAX_FRAME {
            return Err(IoError::FrameTooLarge { path: self.path.clone(), record, len: data.len(), max: MAX_FRAME });
        }
        let sec = u32::try_from(ts_ns / NS_PER_SEC).map_err(|_| IoError::TimestampRange {
            path: self.path.clone(),
            record,
            detail: format!("{ts_ns} ns is past the 32-bit seconds of pcap (year 2106)"),
        })?;
        let sub = ts_ns % NS_PER_SEC;
        let frac = match self.precision {
            Precision::Micro => sub / 1_000,
            Precision::Nano => sub,
        } as u32; // < 1e9, fits.
        let snap = usize::try_from(SNAPLEN).unwrap_or(usize::MAX);
        let cap = data.get(..snap).unwrap_or(data);
        let caplen = u32::try_from(cap.len()).unwrap_or(SNAPLEN);
        let mut hdr = [0u8; 16];
        for (i, v) in [sec, frac, caplen, orig_len.max(caplen)].into_iter().enumerate() {
            if let Some(dst) = hdr.get_mut(i * 4..i * 4 + 4) {
                dst.copy_from_slice(&v.to_le_bytes());
            }
        }
        self.put(&hdr)?;
        self.put(cap)?;
        self.records = record;
        Ok(())
    }

    /// Records written so far.
    pub fn records_written(&self) -> u64 {
        self.records
    }

    /// The timestamp precision of the file.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Flushes the buffer and closes the file; returns the number of records written.
    pub fn finish(mut self) -> Result<u64, IoError> {
        self.out.flush().map_err(|source| IoError::Write { path: self.path.clone(), records: self.records, source })?;
        Ok(self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ng_timestamp_resolutions() {
        assert_eq!(ng_ts_to_ns(1_500_000, 6, 0), Some(1_500_000_000));
        assert_eq!(ng_ts_to_ns(7, 9, 0), Some(7));
        assert_eq!(ng_ts_to_ns(7_000, 12, 0), Some(7));
        assert_eq!(ng_ts_to_ns(3, 0, 10), Some(13_000_000_000));
        // 2^-10 s units: 1024 units = 1 s.
        assert_eq!(ng_ts_to_ns(1024, 0x80 | 10, 0), Some(NS_PER_SEC));
        assert_eq!(ng_ts_to_ns(u64::MAX, 0, 0), None);
        assert_eq!(ng_ts_to_ns(u64::MAX, 127, 0), Some(0));
        // Negative offsets (if_tsoffset is signed).
        assert_eq!(ng_ts_to_ns(5_000_000, 6, (-2i64) as u64), Some(3 * NS_PER_SEC));
        assert_eq!(ng_ts_to_ns(1_000_000, 6, (-2i64) as u64), None);
    }
}
