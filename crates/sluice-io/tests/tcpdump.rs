//! Files written by TraceWriter are readable by tcpdump. tcpdump must be installed (the CI
//! script installs it): without it this test fails rather than silently passing.

mod common;

use common::{read_all, trace};
use sluice_io::gen::{self, GenConfig, Workload};
use sluice_io::{Precision, TraceWriter};
use std::path::Path;
use std::process::Command;

/// Runs `tcpdump -nn -r path` plus `extra` and returns its standard output.
fn tcpdump(path: &Path, extra: &[&str]) -> String {
    let out = Command::new("tcpdump").args(["-nn", "-r"]).arg(path).args(extra).output().unwrap_or_else(|e| {
        panic!("tcpdump is required for this test and could not be run ({e}); install it: apt-get install -y tcpdump")
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tcpdump failed on {}: {stderr}", path.display());
    assert!(!stderr.contains("truncated"), "tcpdump: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn tcpdump_reads_written_files() {
    let dir = tempfile::tempdir().unwrap();
    let recs = read_all(&trace("http_methods.pcap"));
    for precision in [Precision::Micro, Precision::Nano] {
        let path = dir.path().join(format!("{precision:?}.pcap"));
        let mut w = TraceWriter::create(&path, precision).unwrap();
        for r in &recs {
            w.write(r.ts_ns, &r.data).unwrap();
        }
        w.finish().unwrap();
        let out = tcpdump(&path, &[]);
        assert_eq!(out.lines().count(), recs.len(), "{precision:?}");
        // Same decoding as tcpdump gives for the original capture.
        assert_eq!(out, tcpdump(&trace("http_methods.pcap"), &[]), "{precision:?}");
    }
}

#[test]
fn tcpdump_reads_generated_traffic_and_finds_checksums_correct() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gen.pcap");
    let cfg = GenConfig { concurrency: 8, ..GenConfig::new(Workload::Custom { flows: 12, packets_per_flow: 15 }, 3) };
    assert_eq!(gen::write_pcap(&cfg, &path).unwrap(), 180);
    let out = tcpdump(&path, &[]);
    assert_eq!(out.lines().count(), 180);
    // -vv makes tcpdump verify the IP and TCP checksums.
    let verbose = tcpdump(&path, &["-vv"]);
    assert!(!verbose.contains("incorrect"), "{verbose}");
    assert!(verbose.matches("cksum").count() >= 180, "{verbose}");
    let syns = out.lines().filter(|l| l.contains("Flags [S],")).count();
    let fins = out.lines().filter(|l| l.contains("Flags [F.]")).count();
    assert_eq!((syns, fins), (12, 24));
}
