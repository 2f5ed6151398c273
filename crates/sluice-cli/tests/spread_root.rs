//! The root of a chain spread over nodes crashed through its node's control endpoint
//! (`{"crash_root": {}}`, `sluice ctl crash-root`): a new root takes over on the same node, as
//! in one process, while the other nodes go on sending their packets and notes there. With the
//! log at the root the entries it held are lost with it (and said so); with `--log store` the
//! new root reads them back, so an instance of another node that fails right after the root
//! still gets its packets replayed. Each run gives the one-process output and its record
//! verifies.

use std::path::Path;
use std::time::Duration;

mod common;

use common::nodes::{free_port, json, node_end, root_node, start_node, wait_for_packets_at};
use common::{one_process, sluice, sorted_frames, spread_file, text, CONTROL_TOKEN};

/// What a drill does besides the root crashes.
struct Drill<'a> {
    /// `--log root` or `--log store` on the root's node.
    log: &'a str,
    /// An instance of node b (`VERTEX/INDEX`) slowed before the first root crash and crashed
    /// right after it, through b's endpoint.
    crash_on_b: Option<&'a str>,
}

/// POSTs one action to the endpoint at `addr`; it must be taken.
fn act(addr: &str, body: &str) {
    let (code, answer) = common::http(addr, "POST", "/api/v1/actions", Some(CONTROL_TOKEN), body);
    assert_eq!(code, 200, "{body}: {answer}");
}

/// The example chain over nodes a (the root's, with the NAT and the LB) and b (the portscan
/// and Trojan detectors), fault tolerant over a served store, paced over about three seconds;
/// the root crashed twice through a's endpoint while traffic flows. Returns the root's node's
/// report after checking the output against the one-process output and verifying the record.
fn root_crashes(dir: &Path, drill: &Drill) -> serde_json::Value {
    let spread = spread_file(dir, 2, &[("portscan", "b"), ("trojan", "b")]);
    let (a_ctl, b_ctl) = (free_port(), free_port());
    let store = common::served_store();
    let ft = ["--fault-tolerance", "--mode", "async", "--store", store.url.as_str(), "-w", "1"];
    let rec = |n: &str| dir.join(format!("rec-{n}")).to_string_lossy().into_owned();
    let ctl =
        |addr: &str| vec!["--control".to_string(), addr.to_string(), "--control-token".into(), CONTROL_TOKEN.into()];
    let mut b_args: Vec<String> = ft.iter().map(|s| s.to_string()).collect();
    b_args.extend(["--record".into(), rec("b")]);
    b_args.extend(ctl(&b_ctl));
    let b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let b = start_node("chains/example.yaml", &spread, "b", &dir.join("b.json"), &b_args);
    let mut a_args: Vec<String> = ft[..5].iter().map(|s| s.to_string()).collect();
    a_args.extend(["--pace", "0.05", "--log", drill.log].iter().map(|s| s.to_string()));
    a_args.extend(["--record".into(), rec("a")]);
    a_args.extend(ctl(&a_ctl));
    let (s, out, a_json) = (spread.clone(), dir.join("out.pcap"), dir.join("a.json"));
    let root = std::thread::spawn(move || {
        let extra: Vec<&str> = a_args.iter().map(String::as_str).collect();
        root_node(&s, &out, &a_json, &extra)
    });
    // Traffic has reached b's detector.
    wait_for_packets_at(&b_ctl, "portscan");
    // b's endpoint sends a root crash where the root is.
    common::refused_actions(&b_ctl, &[(r#"{"crash_root": {}}"#, 409, "the root runs on node `a`")]);
    let target = drill.crash_on_b.map(|what| {
        let (vertex, index) = what.split_once('/').unwrap_or((what, "0"));
        format!(r#""vertex": "{vertex}", "instance": {index}"#)
    });
    if let Some(t) = &target {
        // Slowed so that packets the first root admitted queue up at it.
        act(&b_ctl, &format!(r#"{{"slow": {{{t}, "delay_us": [300, 500]}}}}"#));
        std::thread::sleep(Duration::from_millis(300));
    }
    act(&a_ctl, r#"{"crash_root": {}}"#);
    if let Some(t) = &target {
        act(&b_ctl, &format!(r#"{{"crash": {{{t}}}}}"#));
    }
    std::thread::sleep(Duration::from_millis(500));
    act(&a_ctl, r#"{"crash_root": {}}"#);
    let a = root.join().expect("the root's node");
    assert!(a.status.success(), "{}", text(&a));
    let (ok, err) = node_end(b, Duration::from_secs(30));
    assert!(ok, "node b: {err}");
    let one = dir.join("one.pcap");
    one_process(&one, &[]);
    let got = sorted_frames(&dir.join("out.pcap"));
    assert!(got == sorted_frames(&one), "the output differs from the one-process output ({} frames)", got.len());
    let v = sluice(&["verify", "--recorded", &rec("a"), "--part", &rec("b")]);
    assert!(text(&v).contains("chain output equivalence: EQUIVALENT"), "{}", text(&v));
    json(&dir.join("a.json"))
}

/// The root's two crashes as the report of the root's node says them.
fn crashes_of(report: &serde_json::Value) -> Vec<serde_json::Value> {
    let crashes = report["root_crashes"].as_array().cloned().unwrap_or_default();
    assert_eq!(crashes.len(), 2, "{}", report["root_crashes"]);
    crashes
}

#[test]
fn the_root_crashed_on_its_node_resumes_there_while_the_other_node_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let report = root_crashes(dir.path(), &Drill { log: "root", crash_on_b: None });
    for c in crashes_of(&report) {
        // The log died with each root: what it held is gone (the packets themselves are not).
        assert_eq!(c["lost"], true, "{c}");
        assert!(c["resumed_at"].as_u64() > c["at_packet"].as_u64(), "the clock resumes past the crash: {c}");
    }
    let log = &report["fault_tolerance"];
    assert_eq!(log["left_in_log"], 0, "{log}");
}

#[test]
fn with_the_log_in_the_store_an_instance_of_another_node_failing_with_the_root_loses_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let report = root_crashes(dir.path(), &Drill { log: "store", crash_on_b: Some("portscan") });
    for c in crashes_of(&report) {
        assert_eq!(c["lost"], false, "{c}");
        assert!(c["read_back"].as_u64().is_some_and(|n| n > 0), "the new root read the log back: {c}");
    }
    let failovers = report["failovers"].as_array().cloned().unwrap_or_default();
    assert_eq!(failovers.len(), 1, "{failovers:?}");
    assert!(failovers[0]["replayed"].as_u64().is_some_and(|n| n > 0), "the detector held packets: {failovers:?}");
    assert_eq!(failovers[0]["beyond_replay"], 0, "{failovers:?}");
    let log = &report["fault_tolerance"];
    assert_eq!((&log["deleted"], &log["left_in_log"]), (&log["logged"], &serde_json::json!(0)), "{log}");
}
