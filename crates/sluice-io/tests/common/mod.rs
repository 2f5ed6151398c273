//! Helpers shared by the integration tests.
#![allow(dead_code)]

use sluice_io::TraceReader;
use std::path::{Path, PathBuf};

/// The shared directory of real captures.
pub fn traces_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces"))
}

/// A capture by file name.
pub fn trace(name: &str) -> PathBuf {
    traces_dir().join(name)
}

/// Every `.pcap` in the shared directory, sorted.
pub fn all_traces() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(traces_dir())
        .expect("shared/traces must exist")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    v.sort();
    v
}

/// One record, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec {
    pub ts_ns: u64,
    pub data: Vec<u8>,
    pub orig_len: u32,
}

/// Reads every record of `path`, panicking on error.
pub fn read_all(path: &Path) -> Vec<Rec> {
    let mut r = TraceReader::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut out = Vec::new();
    while let Some(rec) = r.next_record().unwrap_or_else(|e| panic!("{e}")) {
        out.push(Rec { ts_ns: rec.ts_ns, data: rec.data.to_vec(), orig_len: rec.orig_len });
    }
    out
}

/// Reads from bytes in memory until the end or the first error; returns the records read and the
/// error, if any. Also checks that the reader stays finished after an error.
pub fn read_bytes(bytes: Vec<u8>) -> (Vec<Rec>, Option<sluice_io::IoError>) {
    let mut r = match TraceReader::from_reader(std::io::Cursor::new(bytes), "mem.pcap") {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut out = Vec::new();
    loop {
        match r.next_record() {
            Ok(Some(rec)) => out.push(Rec { ts_ns: rec.ts_ns, data: rec.data.to_vec(), orig_len: rec.orig_len }),
            Ok(None) => return (out, None),
            Err(e) => {
                assert!(matches!(r.next_record(), Ok(None)), "reader must be finished after an error");
                return (out, Some(e));
            }
        }
    }
}
