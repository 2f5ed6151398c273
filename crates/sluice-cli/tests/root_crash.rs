//! Root crashes in the threaded runtime (`crash_root` in `sluice run --faults`): the root fails
//! and a new one takes over, resuming the logical clock past anything the old one stamped.
//! With the log at the root its entries die with it; with `--log store` every packet is in
//! the store before it enters the chain and the new root reads the log back, so a root and an
//! NF failing together recover (CHC's correlated failure). Recorded runs must be equivalent to
//! the logical chain (`sluice verify --recorded`).

mod common;

use common::{recorded_run, repo, sluice, text};

/// The report's one root crash.
fn root_crash(report: &serde_json::Value) -> serde_json::Value {
    let crashes = report["root_crashes"].as_array().cloned().unwrap_or_default();
    assert_eq!(crashes.len(), 1, "{}", report["root_crashes"]);
    let c = crashes[0].clone();
    let (at, resumed) = (c["at_packet"].as_u64().unwrap_or(0), c["resumed_at"].as_u64().unwrap_or(0));
    assert!(at > 0 && resumed > at, "the new root must resume past the old one's clocks: {c}");
    c
}

#[test]
fn the_root_fails_and_a_new_one_resumes_its_clock() {
    let faults = "faults/threaded/root-crash.yaml";
    for (name, chain, extra) in [
        ("root-example", "chains/example.yaml", &["-w", "2"][..]),
        ("root-nat", "chains/nat.yaml", &["-w", "1", "--batch", "8"][..]),
    ] {
        let report = recorded_run(name, (chain, "traces/demo.pcap", "20000"), faults, extra);
        let c = root_crash(&report);
        assert_eq!(c["lost"], true, "{name}: the log was at the root: {c}");
        // The NAT failed once what the old root admitted had finished: all of it replayable.
        let fo = &report["failovers"][0];
        assert_eq!((fo["vertex"].as_str(), fo["beyond_replay"].as_u64()), (Some("nat"), Some(0)), "{name}: {fo}");
    }
}

#[test]
fn a_root_and_an_nf_failing_together_recover_with_the_log_in_the_store() {
    let faults = "faults/root-and-nf.yaml";
    for (name, extra) in [("root-nf-2w", &["-w", "2"][..]), ("root-nf-1w", &["-w", "1", "--batch", "8"][..])] {
        let extra = [extra, &["--log", "store"][..]].concat();
        let report = recorded_run(name, ("chains/example.yaml", "traces/demo.pcap", "20000"), faults, &extra);
        let c = root_crash(&report);
        assert_eq!(c["lost"], false, "{name}: {c}");
        assert!(c["read_back"].as_u64().is_some_and(|n| n > 0), "{name}: nothing read back: {c}");
        let failovers = report["failovers"].as_array().cloned().unwrap_or_default();
        assert_eq!(failovers.len(), 3, "{name}: {failovers:?}");
        assert!(failovers.iter().all(|f| f["beyond_replay"] == 0), "{name}: {failovers:?}");
    }
}

#[test]
fn with_the_log_at_the_root_an_nf_failing_with_it_loses_packets_and_says_so() {
    // CHC's limit, not hidden: the NAT held packets whose entries died with the root. It is
    // slowed before the crashes so that it surely holds some: on its own it may have finished
    // every packet of the old root in the fraction of a millisecond between the two crashes
    // (seen in the full suite once the packet pool stopped taking a lock per packet).
    let dir = tempfile::tempdir().expect("temp dir");
    let rec = dir.path().join("rec").to_string_lossy().into_owned();
    let faults = dir.path().join("faults.yaml");
    let schedule = std::fs::read_to_string(repo("faults/root-and-nf.yaml")).expect("faults/root-and-nf.yaml");
    let slowed = schedule.replacen(
        "events:\n",
        "events:\n  - at: { percent: 30 }\n    slow: { vertex: nat, instance: 0, delay_us: [3, 10] }\n  - at: { percent: 45 }\n    slow: { vertex: nat, instance: 0, delay_us: [0, 0] }\n",
        1,
    );
    assert_ne!(slowed, schedule, "the schedule has an `events:` list");
    std::fs::write(&faults, slowed).expect("write faults");
    let faults = faults.to_string_lossy().into_owned();
    let args = ["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--limit", "20000", "-q", "--no-pin"];
    let more = ["--faults", &faults, "--window", "4096", "--record", &rec, "--json", "-"];
    let o = sluice(&[&args[..], &more[..]].concat());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("lost for good"), "no warning: {}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json report");
    assert_eq!(root_crash(&report)["lost"], true);
    let nat = &report["failovers"][0];
    assert!(nat["beyond_replay"].as_u64().is_some_and(|n| n > 0), "{nat}");
    // Together: the NAT's crash is asked once the old root has failed, never before it (the
    // old root would replay some of what the NAT held, depending on which thread ran first).
    let root_failed_ms = root_crash(&report)["at_ms"].as_f64().unwrap_or(f64::MAX);
    assert!(nat["asked_ms"].as_f64().is_some_and(|ms| ms >= root_failed_ms), "root at {root_failed_ms} ms: {nat}");
    let v = sluice(&["verify", "--recorded", &rec]);
    assert!(!v.status.success() && text(&v).contains("NOT EQUIVALENT"), "{}", text(&v));
}

#[test]
fn a_root_crash_on_redis_with_the_log_there_is_equivalent() {
    let store = common::redis_store("rc");
    let input = ("chains/example.yaml", "traces/demo.pcap", "4000");
    let report = recorded_run("root-redis", input, "faults/root-and-nf.yaml", &["--store", &store, "--log", "store"]);
    assert_eq!(root_crash(&report)["lost"], false);
}

#[test]
fn root_crashes_the_run_cannot_make_are_clear_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let second = dir.path().join("second.yaml");
    std::fs::write(&second, "events:\n  - at: { packet: 10 }\n    crash_root: { root: 1 }\n").expect("write");
    let second = second.to_string_lossy().into_owned();
    let base = ["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--limit", "2000", "-q"];
    for (extra, says) in [
        (&["--faults", second.as_str()][..], "no root 1 in a run of 1 root(s) (--roots)"),
        (&["--fault-tolerance", "--log", "store", "--mode", "local"][..], "the root's log in the store needs"),
        (&["--log", "store"][..], "the root's log in the store needs"),
    ] {
        let o = sluice(&[&base[..], extra].concat());
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{extra:?}: {}", text(&o));
    }
}

#[test]
fn a_root_crash_asked_through_the_control_endpoint_is_equivalent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().join("rec").to_string_lossy().into_owned();
    // 20,000 packets of the demo trace paced to last a few seconds; the log in the store, so
    // the NAT's crash right after the root's loses nothing.
    let (child, addr) = common::paced_live_run(&d, &["--log", "store"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    common::ctl(&addr, &["crash-root"]);
    common::ctl(&addr, &["crash", "nat:0"]);
    // Root 1 does not exist: 404, nothing changes.
    let (code, body) =
        common::http(&addr, "POST", "/api/v1/actions", Some(common::CONTROL_TOKEN), r#"{"crash_root": {"root": 1}}"#);
    assert_eq!(code, 404, "{body}");
    let out = child.wait_with_output().expect("sluice run ends");
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    assert_eq!(root_crash(&report)["lost"], false);
    assert_eq!(report["failovers"].as_array().map(Vec::len), Some(1), "{}", report["failovers"]);
    let v = sluice(&["verify", "--recorded", &d]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
}
