//! Trace summaries: what a capture holds, in numbers.

use crate::pcap::{TraceFormat, TraceReader};
use crate::IoError;
use sluice_packet::{FlowKey, Headers, ParseStatus, L4};
use std::collections::HashSet;
use std::fmt;
use std::path::Path;

/// Packet counts per protocol. Only packets whose headers parsed are counted here: malformed and
/// truncated ones are counted in [`TraceSummary`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ProtoCounts {
    /// TCP.
    pub tcp: u64,
    /// UDP.
    pub udp: u64,
    /// ICMPv4.
    pub icmp: u64,
    /// ICMPv6.
    pub icmpv6: u64,
    /// Other IP packets (other protocols, and non-first fragments).
    pub other_ip: u64,
    /// Well-formed Ethernet frames without IP (ARP, LLDP, ...).
    pub non_ip: u64,
}

/// What [`summarize`] found in a trace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TraceSummary {
    /// The file.
    pub path: String,
    /// Its format.
    pub format: TraceFormat,
    /// Packet records.
    pub packets: u64,
    /// Captured bytes (sum of the records' captured lengths).
    pub bytes: u64,
    /// Bytes on the wire (sum of the records' original lengths).
    pub wire_bytes: u64,
    /// Records captured shorter than on the wire (snap length).
    pub snapped: u64,
    /// Distinct flows: direction-free 5-tuples ([`sluice_packet::FiveTuple::flow_key`]) of the
    /// IP packets whose headers parsed.
    pub flows: u64,
    /// Packets per protocol.
    pub protocols: ProtoCounts,
    /// Packets whose headers hold impossible values.
    pub malformed: u64,
    /// Packets whose headers are cut short by the end of the captured bytes.
    pub truncated: u64,
    /// Timestamp of the first record, nanoseconds since the epoch.
    pub first_ts_ns: Option<u64>,
    /// Timestamp of the last record.
    pub last_ts_ns: Option<u64>,
    /// Latest minus earliest timestamp (robust to records out of time order).
    pub duration_ns: u64,
    /// Records whose timestamp is earlier than their predecessor's.
    pub out_of_order: u64,
}

/// Reads the whole trace at `path` and summarizes it.
pub fn summarize(path: impl AsRef<Path>) -> Result<TraceSummary, IoError> {
    let mut reader = TraceReader::open(path.as_ref())?;
    let mut s = TraceSummary {
        path: path.as_ref().display().to_string(),
        format: reader.format(),
        packets: 0,
        bytes: 0,
        wire_bytes: 0,
        snapped: 0,
        flows: 0,
        protocols: ProtoCounts::default(),
        malformed: 0,
        truncated: 0,
        first_ts_ns: None,
        last_ts_ns: None,
        duration_ns: 0,
        out_of_order: 0,
    };
    let mut flows: HashSet<FlowKey> = HashSet::new();
    let (mut min_ts, mut max_ts) = (u64::MAX, 0u64);
    while let Some(r) = reader.next_record()? {
        s.packets += 1;
        let caplen = r.data.len() as u64;
        s.bytes += caplen;
        s.wire_bytes += u64::from(r.orig_len).max(caplen);
        if u64::from(r.orig_len) > caplen {
            s.snapped += 1;
        }
        if s.last_ts_ns.is_some_and(|prev| r.ts_ns < prev) {
            s.out_of_order += 1;
        }
        s.first_ts_ns.get_or_insert(r.ts_ns);
        s.last_ts_ns = Some(r.ts_ns);
        min_ts = min_ts.min(r.ts_ns);
        max_ts = max_ts.max(r.ts_ns);
        let h = Headers::parse(r.data);
        match h.status {
            ParseStatus::Ok => {
                let p = &mut s.protocols;
                match h.l4 {
                    L4::Tcp => p.tcp += 1,
                    L4::Udp => p.udp += 1,
                    L4::Icmp => p.icmp += 1,
                    L4::Icmpv6 => p.icmpv6 += 1,
                    L4::Other | L4::None => p.other_ip += 1,
                }
                if let Some(t) = h.tuple {
                    flows.insert(t.flow_key());
                }
            }
            ParseStatus::NonIp => s.protocols.non_ip += 1,
            ParseStatus::Truncated => s.truncated += 1,
            ParseStatus::Malformed => s.malformed += 1,
        }
    }
    s.flows = flows.len() as u64;
    s.duration_ns = max_ts.saturating_sub(min_ts.min(max_ts));
    Ok(s)
}

fn fmt_ts(ts: Option<u64>) -> String {
    match ts {
        Some(t) => format!("{}.{:09}", t / 1_000_000_000, t % 1_000_000_000),
        None => "-".to_string(),
    }
}

impl fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.protocols;
        writeln!(f, "file:       {}", self.path)?;
        writeln!(f, "format:     {}", self.format)?;
        writeln!(f, "packets:    {}", self.packets)?;
        writeln!(
            f,
            "bytes:      {} captured, {} on the wire ({} records snapped)",
            self.bytes, self.wire_bytes, self.snapped
        )?;
        writeln!(f, "flows:      {}", self.flows)?;
        writeln!(
            f,
            "protocols:  tcp {}, udp {}, icmp {}, icmpv6 {}, other ip {}, non-ip {}",
            p.tcp, p.udp, p.icmp, p.icmpv6, p.other_ip, p.non_ip
        )?;
        writeln!(f, "bad:        {} malformed, {} truncated", self.malformed, self.truncated)?;
        writeln!(f, "first:      {}", fmt_ts(self.first_ts_ns))?;
        writeln!(f, "last:       {}", fmt_ts(self.last_ts_ns))?;
        write!(f, "duration:   {:.6} s", self.duration_ns as f64 / 1e9)?;
        if self.out_of_order > 0 {
            write!(f, " ({} records out of time order)", self.out_of_order)?;
        }
        Ok(())
    }
}
