//! Store crashes in the threaded runtime (`crash_store` in `sluice run --faults`): the state
//! store loses everything and is rebuilt while the chain holds still — shared state from the
//! last checkpoint and the instances' write-ahead logs, per-flow state and timers from the
//! instances — then the instances reconnect and send their unacknowledged requests again.
//! Recorded runs must be equivalent to the logical chain (`sluice verify --recorded`).

mod common;

use common::{recorded_run, sluice, text};

/// The report's store crashes.
fn store_crashes(report: &serde_json::Value) -> Vec<serde_json::Value> {
    report["store_crashes"].as_array().cloned().unwrap_or_default()
}

#[test]
fn the_store_fails_and_is_rebuilt_from_its_checkpoint_and_the_instances() {
    for (name, chain, extra) in [
        ("store-example", "chains/example.yaml", &["-w", "2"][..]),
        ("store-example-1w", "chains/example.yaml", &["-w", "1", "--batch", "8"][..]),
        ("store-portscan", "chains/nat-portscan.yaml", &["-w", "2", "--checkpoint-ms", "20"][..]),
    ] {
        let report = recorded_run(name, (chain, "traces/demo.pcap", "20000"), "faults/store-crash.yaml", extra);
        let crashes = store_crashes(&report);
        assert_eq!(crashes.len(), 1, "{name}: {crashes:?}");
        let detail = crashes[0]["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("values"), "{name}: the rebuild loaded nothing: {detail}");
    }
}

/// Periodic checkpoints off (`--checkpoint-ms 0`) leaves the ones a rebuild cannot do
/// without: three store crashes over 40,000 packets put more updates since the run's start in
/// the NAT's write-ahead log than it holds, and a rebuild from the first checkpoint then missed
/// the oldest (1,000 of the NAT's mappings lost, NOT EQUIVALENT) until a log half full took a
/// checkpoint whatever the period.
#[test]
fn store_crashes_without_periodic_checkpoints_still_checkpoint_before_a_log_overflows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let at = |p: u32| format!("  - at: {{ percent: {p} }}\n    crash_store: {{}}\n");
    let body = format!("events:\n{}{}{}", at(30), at(60), at(80));
    let faults = common::schedule(dir.path(), "three-store-crashes.yaml", &body);
    for roots in ["1", "2"] {
        let name = format!("store-no-periodic-{roots}");
        let input = ("chains/example.yaml", "traces/demo.pcap", "40000");
        let extra = ["-w", "2", "--checkpoint-ms", "0", "--roots", roots];
        let report = recorded_run(&name, input, &faults, &extra);
        assert_eq!(store_crashes(&report).len(), 3, "{name}");
        assert!(report["checkpoints"]["taken"].as_u64().unwrap_or(0) >= 1, "{name}: {}", report["checkpoints"]);
    }
}

#[test]
fn instances_and_the_root_fail_after_the_store_was_rebuilt() {
    let faults = "faults/threaded/store-nf-root.yaml";
    let extra = ["-w", "2", "--log", "store"];
    let report = recorded_run("store-nf-root", ("chains/example.yaml", "traces/demo.pcap", "20000"), faults, &extra);
    assert_eq!(store_crashes(&report).len(), 1);
    assert_eq!(report["root_crashes"].as_array().map(Vec::len), Some(1), "{}", report["root_crashes"]);
    let failovers = report["failovers"].as_array().cloned().unwrap_or_default();
    assert_eq!(failovers.len(), 2, "{failovers:?}");
    assert!(failovers.iter().all(|f| f["beyond_replay"] == 0), "{failovers:?}");
}

#[test]
fn a_store_crash_needs_a_store_and_fault_tolerance() {
    let base = ["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--limit", "2000", "-q"];
    let o = sluice(&[&base[..], &["--faults", "faults/store-crash.yaml", "--mode", "local"][..]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("crashing the store needs"), "{}", text(&o));
}

#[test]
fn a_redis_store_fails_and_is_rebuilt() {
    // Each run its own keys: the rebuild wipes only what the run's prefix holds.
    let store = common::redis_store("stc");
    let input = ("chains/example.yaml", "traces/demo.pcap", "4000");
    let report = recorded_run("store-redis", input, "faults/store-crash.yaml", &["--store", &store, "-w", "2"]);
    assert_eq!(store_crashes(&report).len(), 1);
}

#[test]
fn a_store_crash_asked_through_the_control_endpoint_is_equivalent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().join("rec").to_string_lossy().into_owned();
    // Checkpoints every 50 ms: the rebuild starts from a recent one and the logs past it.
    let (child, addr) = common::paced_live_run(&d, &["-w", "2", "--checkpoint-ms", "50"]);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let answer = common::ctl(&addr, &["crash-store"]);
    assert!(answer.contains("crash_store"), "{answer}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // An instance failing after the rebuild recovers from the rebuilt store.
    common::ctl(&addr, &["crash", "nat:0"]);
    // Malformed arguments: a 400, nothing happens.
    common::refused_actions(&addr, &[(r#"{"crash_store": {"now": true}}"#, 400, "crash_store takes {}")]);
    let out = child.wait_with_output().expect("sluice run ends");
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let crashes = store_crashes(&report);
    assert_eq!(crashes.len(), 1, "{crashes:?}");
    let detail = crashes[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("values"), "the rebuild loaded nothing: {detail}");
    assert!(report["checkpoints"]["taken"].as_u64().unwrap_or(0) > 0, "{}", report["checkpoints"]);
    assert_eq!(report["failovers"].as_array().map(Vec::len), Some(1), "{}", report["failovers"]);
    assert_eq!(report["fault_tolerance"]["left_in_log"], 0, "{}", report["fault_tolerance"]);
    let v = sluice(&["verify", "--recorded", &d]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
}

#[test]
fn a_store_crash_is_refused_by_a_run_that_cannot_rebuild_its_store() {
    for (extra, says) in [
        (&["--checkpoint-ms", "0"][..], "takes no checkpoints"),
        (&["--mode", "local"][..], "--fault-tolerance and a store"),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path().join("rec").to_string_lossy().into_owned();
        let (child, addr) = common::paced_live_run(&d, extra);
        // The endpoint answers before the run has said what it can do.
        std::thread::sleep(std::time::Duration::from_millis(500));
        common::refused_actions(&addr, &[(r#"{"crash_store": {}}"#, 409, says)]);
        let out = child.wait_with_output().expect("sluice run ends");
        assert!(out.status.success(), "{extra:?}: {}", text(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
        assert_eq!(store_crashes(&report).len(), 0, "{extra:?}: a refused action changes nothing");
    }
}

/// A worker holds still for a store crash only between two of its turns, and a turn served up
/// to four batches of each of its instances. With the NAT slowed to 1 s a packet (a straggler)
/// from the first packet and batches of four, the store crash asked at packet 1,000 came while
/// the NAT's worker had up to four batches, 16 s, ahead of it in that turn: past the 10 s the
/// root gave the workers to hold still, and the run failed ("the workers did not hold still
/// within 10s") in 4 runs of 4. A worker still getting through its batches is not stuck: it
/// holds still after the batch at hand, and the root waits as long as packets keep going.
/// With two roots the NAT takes its input in entry order, and what it held went to it in one
/// batch of whatever had come (up to the window), which no hold could wait for: that too goes
/// in batches of the run's size now.
#[test]
fn a_store_crash_waits_for_a_straggler_that_is_still_working() {
    let dir = tempfile::tempdir().expect("temp dir");
    let body = "events:\n\
                \x20 - at: { packet: 1 }\n    slow: { vertex: nat, instance: 0, delay_us: [1000000, 1000000] }\n\
                \x20 - at: { packet: 1000 }\n    crash_store: {}\n\
                \x20 - at: { packet: 1001 }\n    slow: { vertex: nat, instance: 0, delay_us: [0, 0] }\n";
    let faults = common::schedule(dir.path(), "straggler-store-crash.yaml", body);
    let input = ("chains/nat-portscan.yaml", "traces/demo.pcap", "2000");
    for roots in ["1", "2"] {
        let name = format!("store-straggler-{roots}");
        let report = recorded_run(&name, input, &faults, &["-w", "2", "--batch", "4", "--roots", roots]);
        let crashes = store_crashes(&report);
        assert_eq!(crashes.len(), 1, "{name}: {crashes:?}");
        // The hold came after the batch at hand (4 s when the NAT had begun one), not after
        // the turn's four or the held packets' all.
        let paused = crashes[0]["paused_ms"].as_f64().unwrap_or(f64::MAX);
        assert!(paused < 8_000.0, "{name}: the chain took {paused} ms to hold still: {crashes:?}");
    }
}
