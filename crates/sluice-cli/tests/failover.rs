//! Instance failover in the threaded runtime (`sluice run --faults`): NF instances the root
//! feeds crash for real while the chain runs (their queue, cache and unsent updates are lost),
//! a replacement takes over from the store and the root replays its log to it; the recorded
//! run must be equivalent to the logical chain (`sluice verify --recorded`). Faults the threaded
//! runtime cannot apply yet are clear errors.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;

use common::{repo, sluice, text};

/// Runs `chain` over the first 30,000 packets of `trace` with `faults`, recording it; checks
/// the report's failovers and that the record is equivalent.
fn failover_run(name: &str, chain: &str, trace: &str, faults: &str, extra: &[&str]) {
    failover_run_limited(name, chain, trace, faults, extra, "30000");
}

fn failover_run_limited(name: &str, chain: &str, trace: &str, faults: &str, extra: &[&str], limit: &str) {
    let dir = std::env::temp_dir().join(format!("sluice-failover-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    let mut args = vec!["run", "-c", chain, "-i", trace, "-q", "--no-pin", "--faults", faults, "--record", &d];
    // A window of 4,096 packets bounds what a replay redoes (the log holds at most a window).
    args.extend_from_slice(&["--json", "-", "--window", "4096", "--limit", limit]);
    args.extend_from_slice(extra);
    let o = sluice(&args);
    assert!(o.status.success(), "{name}: {}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{name}: {e}"));
    let failovers = report["failovers"].as_array().cloned().unwrap_or_default();
    assert_eq!(failovers.len(), 2, "{name}: {failovers:?}");
    for f in &failovers {
        assert_eq!(f["vertex"], "nat", "{name}: {f}");
        assert!(f["replayed"].as_u64().is_some_and(|n| n > 0), "{name}: nothing replayed: {f}");
    }
    let ft = &report["fault_tolerance"];
    assert_eq!(ft["left_in_log"], 0, "{name}: {ft}");
    // Every input packet is out or dropped once: nothing lost, nothing duplicated.
    let n = |k: &str| report[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(n("packets_in"), n("packets_out") + n("dropped_total"), "{name}: {report}");
    let v = sluice(&["verify", "--recorded", &d]);
    assert_eq!(v.status.code(), Some(0), "{name}: {}", text(&v));
    assert!(text(&v).contains("EQUIVALENT"), "{name}: {}", text(&v));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn crashed_instances_are_replaced_and_replayed_to_equivalently() {
    let early_late = "faults/threaded/nat-crash-early-and-late.yaml";
    let twice = "faults/threaded/nat-crash-while-recovering.yaml";
    failover_run("nat", "chains/nat.yaml", "traces/demo.pcap", early_late, &[]);
    // Downstream of the crashed NAT: an order-sensitive portscan detector, an LB, a mirrored
    // Trojan detector, with two workers.
    failover_run("example", "chains/example.yaml", "traces/demo.pcap", early_late, &["-w", "2"]);
    failover_run("example-twice", "chains/example.yaml", "traces/demo.pcap", twice, &["-w", "2"]);
    failover_run(
        "portscan-echo",
        "chains/nat-portscan.yaml",
        "../shared/traces/echo-connections.pcap",
        early_late,
        &["-w", "2"],
    );
    failover_run(
        "trojan-http",
        "chains/nat-trojan.yaml",
        "../shared/traces/http_methods.pcap",
        twice,
        &["--batch", "8"],
    );
}

#[test]
fn a_failover_on_redis_is_equivalent() {
    let Ok(url) = std::env::var("SLUICE_REDIS_URL") else {
        panic!("SLUICE_REDIS_URL is not set: run the suite through scripts/test-all.sh, which starts Redis");
    };
    let store = format!("{url}?prefix=fo{}", std::process::id());
    let faults = "faults/threaded/nat-crash-early-and-late.yaml";
    // Every write-through update is a round trip to Redis: fewer packets.
    failover_run_limited("redis", "chains/example.yaml", "traces/demo.pcap", faults, &["--store", &store], "8000");
}

#[test]
fn faults_the_threaded_runtime_cannot_apply_are_clear_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).expect("write schedule");
        p.to_string_lossy().into_owned()
    };
    let scale = write("scale.yaml", "events:\n  - at: { packet: 10 }\n    scale: { vertex: nat, by: 1 }\n");
    let downstream = write("lb.yaml", "events:\n  - at: { packet: 10 }\n    crash: { vertex: lb, instance: 0 }\n");
    let nowhere = write("nowhere.yaml", "events:\n  - at: { packet: 10 }\n    crash: { vertex: fw, instance: 0 }\n");
    let ok = "faults/threaded/nat-crash-early-and-late.yaml";
    for (faults, extra, says) in [
        (scale.as_str(), &[][..], "applies only `crash` events so far"),
        (downstream.as_str(), &[][..], "replays only to instances the root feeds directly"),
        (nowhere.as_str(), &[][..], "no vertex `fw`"),
        (ok, &["--mode", "local"][..], "state in a store"),
    ] {
        let mut args = vec!["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "-q", "--faults", faults];
        args.extend_from_slice(extra);
        let o = sluice(&args);
        assert_eq!(o.status.code(), Some(2), "{faults}: {}", text(&o));
        assert!(text(&o).contains(says), "{faults}: {}", text(&o));
    }
}

#[test]
fn a_crash_asked_through_the_control_endpoint_is_equivalent() {
    let dir = std::env::temp_dir().join(format!("sluice-failover-{}-live", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    // 20,000 packets of the demo trace paced to last a few seconds.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(repo(""))
        .args(["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--limit", "20000", "--pace", "0.01"])
        .args(["-q", "--no-pin", "--window", "4096", "--fault-tolerance", "--record", &d, "--json", "-"])
        .args(["--control", "0", "--control-token", "s3cret"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice run");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines.next().and_then(Result::ok).unwrap_or_else(|| panic!("sluice run ended without an endpoint"));
        if let Some(a) = line.strip_prefix("control endpoint: http://") {
            break a.split_whitespace().next().unwrap_or_default().to_string();
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let port = addr.rsplit(':').next().unwrap_or_default().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["ctl", "--control", &port, "--token", "s3cret", "crash", "nat:0"])
        .output()
        .expect("sluice ctl");
    assert!(o.status.success(), "{}", text(&o));
    let (code, body) =
        common::http(&addr, "POST", "/api/v1/actions", Some("s3cret"), r#"{"crash": {"vertex": "lb", "instance": 0}}"#);
    assert_eq!(code, 409, "not fed by the root: {body}");
    let out = child.wait_with_output().expect("sluice run ends");
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let failovers = report["failovers"].as_array().cloned().unwrap_or_default();
    assert_eq!(failovers.len(), 1, "{failovers:?}");
    assert_eq!(failovers[0]["vertex"], "nat");
    let v = sluice(&["verify", "--recorded", &d]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
    let _ = std::fs::remove_dir_all(dir);
}
