//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong reading, writing or generating a trace. Every variant that
/// concerns a file names it; errors about a packet record also give its 1-based record number
/// (for pcapng: the number of the packet the failing block would have been, counting packet
/// blocks only).
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The file could not be opened or created.
    #[error("{path}: cannot open: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Reading failed for a reason other than the file's content (a disk error, ...).
    #[error("{path}: read error at record {record}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The record being read.
        record: u64,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Writing failed.
    #[error("{path}: write error after {records} records: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Records written before the failure.
        records: u64,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is shorter than the format's file header (or empty).
    #[error("{path}: truncated file header: {detail}")]
    TruncatedHeader {
        /// The file.
        path: PathBuf,
        /// What is missing.
        detail: String,
    },
    /// The file header (pcap header, pcapng section header) holds impossible values.
    #[error("{path}: bad file header: {detail}")]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The first four bytes are neither a pcap nor a pcapng magic number.
    #[error("{path}: not a pcap or pcapng file (magic number {magic:#010x})")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The magic number as read, big-endian.
        magic: u32,
    },
    /// The file ends in the middle of a record (its header or its data).
    #[error("{path}: record {record}: truncated: {detail}")]
    TruncatedRecord {
        /// The file.
        path: PathBuf,
        /// The record cut short.
        record: u64,
        /// What is missing.
        detail: String,
    },
    /// A record's captured length exceeds what Sluice accepts.
    #[error("{path}: record {record}: captured length {caplen} exceeds the maximum frame size {max}")]
    RecordTooLarge {
        /// The file.
        path: PathBuf,
        /// The record.
        record: u64,
        /// Its captured length.
        caplen: u64,
        /// [`sluice_packet::MAX_FRAME`].
        max: usize,
    },
    /// The link type of the file (pcap) or of the packet's interface (pcapng) is not Ethernet.
    #[error("{path}: link type {linktype} ({name}) is not supported, only Ethernet (1) is{}",
        interface.map(|i| format!(" (record {record}, pcapng interface {i})")).unwrap_or_default())]
    UnsupportedLinkType {
        /// The file.
        path: PathBuf,
        /// The record (0 for a classic pcap file, whose header gives the link type).
        record: u64,
        /// The link type number.
        linktype: u32,
        /// Its name as libpcap spells it (`RAW`, `LINUX_SLL`, ...), or `UNKNOWN`.
        name: String,
        /// For pcapng: the interface the packet was captured on.
        interface: Option<u32>,
    },
    /// A structure holds impossible values (bad block length, unknown interface, ...).
    #[error("{path}: record {record}: malformed: {detail}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The record being read.
        record: u64,
        /// What is wrong.
        detail: String,
    },
    /// A timestamp cannot be represented (in nanoseconds since the epoch as `u64`, or in the
    /// 32-bit seconds field of a pcap record when writing).
    #[error("{path}: record {record}: timestamp out of range: {detail}")]
    TimestampRange {
        /// The file.
        path: PathBuf,
        /// The record.
        record: u64,
        /// Which timestamp.
        detail: String,
    },
    /// A frame handed to the writer is larger than [`sluice_packet::MAX_FRAME`].
    #[error("{path}: record {record}: frame of {len} bytes exceeds the maximum frame size {max}")]
    FrameTooLarge {
        /// The file.
        path: PathBuf,
        /// The record.
        record: u64,
        /// The frame's length.
        len: usize,
        /// [`sluice_packet::MAX_FRAME`].
        max: usize,
    },
    /// A generator configuration is invalid.
    #[error("invalid generator configuration: {0}")]
    InvalidConfig(String),
}
