//! Helpers for NF tests: load the shared captures and drive one NF instance over them.
#![allow(dead_code)]

use pcap_file::pcap::PcapReader;
use sluice_nf::{Instance, Verdict};
use sluice_packet::{Clock, Meta, Packet};
use std::path::PathBuf;

/// Path of a capture in `../shared/traces`.
pub fn trace_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name)
}

/// Loads a classic pcap capture from the shared traces, stamping clocks 1, 2, ... in file order.
pub fn load_trace(name: &str) -> Vec<Packet> {
    let file = std::fs::File::open(trace_path(name)).expect("open trace");
    let mut reader = PcapReader::new(file).expect("pcap header");
    let mut out = Vec::new();
    while let Some(p) = reader.next_packet() {
        let p = p.expect("pcap record");
        let meta = Meta {
            clock: Clock::new(0, out.len() as u64 + 1),
            ts_ns: p.timestamp.as_nanos() as u64,
            ..Meta::default()
        };
        out.push(Packet::from_slice(&p.data, meta));
    }
    out
}

/// Concatenates traces, re-stamping clocks in the order given and shifting each trace's
/// timestamps so that it starts `gap_ns` after the previous one ends.
pub fn compose(traces: &[Vec<Packet>], gap_ns: u64) -> Vec<Packet> {
    let mut out: Vec<Packet> = Vec::new();
    let mut t_end = 0u64;
    for tr in traces {
        let first = tr.first().map_or(0, |p| p.meta.ts_ns);
        let base = if out.is_empty() { first } else { t_end + gap_ns };
        for p in tr {
            let mut p = p.clone();
            p.meta.ts_ns = base + (p.meta.ts_ns - first);
            t_end = t_end.max(p.meta.ts_ns);
            p.meta.clock = Clock::new(0, out.len() as u64 + 1);
            out.push(p);
        }
    }
    out
}

/// Runs every packet through `inst`, returning each verdict with the packet as it left.
pub fn run(inst: &mut Instance, packets: Vec<Packet>) -> Vec<(Verdict, Packet)> {
    packets
        .into_iter()
        .map(|mut p| {
            let v = inst.process(&mut p);
            (v, p)
        })
        .collect()
}
