//! `sluice run --record DIR` then `sluice verify --recorded DIR`: a real run of the threaded
//! runtime, checked against the logical chain over the same input. Tampering with the record is
//! caught, and a record is never overwritten.

use std::path::{Path, PathBuf};

mod common;

use common::{repo, sluice, text};

/// A fresh directory for one record.
fn record_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-record-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Records a run of `chain` over `trace` with `extra` run options; returns the directory.
fn record(name: &str, chain: &str, trace: &str, extra: &[&str]) -> PathBuf {
    let dir = record_dir(name);
    let d = dir.to_string_lossy().into_owned();
    let mut args = vec!["run", "-c", chain, "-i", trace, "-q", "--no-pin", "--record", &d];
    args.extend_from_slice(extra);
    let o = sluice(&args);
    assert!(o.status.success(), "{name}: {}", text(&o));
    for f in ["chain.yaml", "input.pcap", "output.pcap", "record.json"] {
        assert!(dir.join(f).is_file(), "{name}: {f} missing");
    }
    dir
}

fn verify(dir: &Path) -> (i32, String) {
    let o = sluice(&["verify", "--recorded", &dir.to_string_lossy()]);
    (o.status.code().unwrap_or(-1), text(&o))
}

#[test]
fn recorded_runs_are_equivalent_on_the_bundled_and_shared_traces() {
    let runs: [(&str, &str, &str, &[&str]); 6] = [
        (
            "example-async",
            "chains/example.yaml",
            "traces/demo.pcap",
            &["--mode", "async", "-w", "2", "--fault-tolerance"],
        ),
        ("example-local", "chains/example.yaml", "traces/demo.pcap", &["--mode", "local"]),
        (
            "trojan-echo",
            "chains/nat-trojan.yaml",
            "../shared/traces/echo-connections.pcap",
            &["--mode", "cached", "--fault-tolerance"],
        ),
        ("portscan-http", "chains/nat-portscan.yaml", "../shared/traces/http_methods.pcap", &["--mode", "external"]),
        // Run to completion on the root thread (no worker threads), local state and a store.
        ("example-rtc-local", "chains/example.yaml", "traces/demo.pcap", &["--mode", "local", "-w", "0"]),
        ("trojan-rtc-async", "chains/nat-trojan.yaml", "../shared/traces/echo-connections.pcap", &["-w", "0"]),
    ];
    for (name, chain, trace, extra) in runs {
        let dir = record(name, chain, trace, extra);
        let (code, out) = verify(&dir);
        assert_eq!(code, 0, "{name}: {out}");
        assert!(out.contains("EQUIVALENT") && !out.contains("NOT EQUIVALENT"), "{name}: {out}");
        assert!(out.contains("outputs: ") && !out.contains("outputs: 0 reference"), "{name}: outputs compared: {out}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn a_recorded_run_on_redis_is_equivalent() {
    let store = common::redis_store("rec");
    let dir = record(
        "redis",
        "chains/example.yaml",
        "traces/demo.pcap",
        &["--store", &store, "--limit", "20000", "--fault-tolerance"],
    );
    let (code, out) = verify(&dir);
    assert_eq!(code, 0, "{out}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_tampered_record_is_not_equivalent_or_refused() {
    let dir = record("tamper", "chains/example.yaml", "traces/demo.pcap", &["--limit", "20000"]);
    let path = dir.join("record.json");
    let original = std::fs::read_to_string(&path).expect("record.json");
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&original).expect("json");
        f(&mut v);
        std::fs::write(&path, v.to_string()).expect("write record");
    };
    // An event the run never had.
    edit(&|v| {
        if let Some(events) = v["events"].as_array_mut() {
            events.push(serde_json::json!({"clock": 5, "vertex": "portscan", "kind": "portscan", "subject": "10.9.9.9", "detail": ""}));
        }
    });
    let (code, out) = verify(&dir);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("decision_extra") || out.contains("decision"), "{out}");
    // A packet dropped instead of delivered: its output goes missing.
    edit(&|v| {
        if let Some(outs) = v["outputs"].as_array_mut() {
            outs.pop();
        }
    });
    let (code, out) = verify(&dir);
    assert_eq!(code, 2, "the frames and the record disagree: {out}");
    assert!(out.contains("output frames"), "{out}");
    // Another version of the format.
    edit(&|v| v["version"] = serde_json::json!(99));
    let (code, out) = verify(&dir);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("version 99"), "{out}");
    // Not a record at all.
    std::fs::write(&path, "{ not json").expect("write");
    let (code, out) = verify(&dir);
    assert_eq!(code, 2, "{out}");
    // A record is never overwritten.
    let d = dir.to_string_lossy().into_owned();
    let o = sluice(&["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "-q", "--record", &d]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("already holds a record"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(dir);
}

/// Scaling the order-sensitive portscan detector, and the NAT in front of it, in a real
/// threaded run: its instances take their input in entry order, so the recorded run is
/// equivalent to one instance of each (R4), and nothing warns any more.
#[test]
fn scaling_an_order_sensitive_nf_stays_equivalent() {
    let original = std::fs::read_to_string(repo("chains/example.yaml")).expect("chain");
    let scaled = original
        .replace("    type: portscan\n", "    type: portscan\n    instances: 2\n")
        .replace("    type: nat\n", "    type: nat\n    instances: 2\n");
    assert_eq!(scaled.matches("instances: 2").count(), 2, "the example chain has a NAT and a portscan vertex");
    let dir = record_dir("scaled");
    std::fs::create_dir_all(&dir).expect("dir");
    let chain = dir.join("scaled.yaml");
    std::fs::write(&chain, scaled).expect("write chain");
    let rec = dir.join("record");
    let r = rec.to_string_lossy().into_owned();
    let c = chain.to_string_lossy().into_owned();
    let o =
        sluice(&["run", "-c", &c, "-i", "traces/demo.pcap", "-q", "--limit", "6000", "--workers", "2", "--record", &r]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("across flows"), "no warning: {}", text(&o));
    let (code, out) = verify(&rec);
    assert_eq!(code, 0, "{out}");
    let _ = std::fs::remove_dir_all(dir);
}
