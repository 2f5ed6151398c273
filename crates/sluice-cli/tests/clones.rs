//! Straggler clones in the threaded runtime (`sluice run --faults` with `clone` events, vertex
//! managers' straggler policies): a clone built from the store takes its straggler's place from
//! a clock on, and once it has processed a trial's worth of packets the faster of the two keeps
//! the flows (docs/decisions.md, "Clones in threads"). Every recorded run must be equivalent to
//! the logical chain (`sluice verify --recorded`).

mod common;

use common::{recorded_run, sluice, text};

/// The bundled trace's first 20,000 packets through the example chain.
const EXAMPLE: (&str, &str, &str) = ("chains/example.yaml", "traces/demo.pcap", "20000");

/// The changes a run reports, as (kind, vertex, the trial's outcome if it ended).
fn changes(report: &serde_json::Value) -> Vec<(String, String, Option<bool>)> {
    let all = report["reconfigurations"].as_array().cloned().unwrap_or_default();
    let s = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or_default().to_string();
    all.iter().map(|r| (s(r, "kind"), s(r, "vertex"), r["trial"]["clone_kept"].as_bool())).collect()
}

#[test]
fn a_clone_faster_than_its_straggler_keeps_its_flows() {
    // The NAT takes 60-90 µs more per packet; at 30 % it is cloned, and the clone (not slowed)
    // wins its trial.
    let report = recorded_run("clone-wins", EXAMPLE, "faults/threaded/clone-wins.yaml", &["-w", "2"]);
    let c = changes(&report);
    assert_eq!(c, [("clone".to_string(), "nat".to_string(), Some(true))], "{c:?}");
}

#[test]
fn the_bundled_straggler_schedule_keeps_the_faster_instance() {
    // CHC's straggler (3-10 µs more per packet): which one wins depends on the machine; the
    // outcome must follow the measured times, and a lost trial hands the flows back.
    for (name, extra) in [("straggler-1w", &["-w", "1"][..]), ("straggler-2w", &["-w", "2", "--batch", "8"][..])] {
        let report = recorded_run(name, EXAMPLE, "faults/straggler.yaml", extra);
        let c = changes(&report);
        let trial = &report["reconfigurations"][0]["trial"];
        let (s, cl) = (trial["straggler_ns"].as_f64().unwrap_or(0.0), trial["clone_ns"].as_f64().unwrap_or(f64::MAX));
        // The core's rule (`manager::keep_clone`): strictly faster; equal times (never seen)
        // go by backlog, which the report does not carry.
        let kept = cl < s;
        assert_eq!(c.first().map(|x| (x.0.as_str(), x.2)), Some(("clone", Some(kept))), "{name}: {c:?} {trial}");
        let back = c.iter().any(|x| x.0 == "clone_back");
        assert_eq!(back, !kept, "{name}: {c:?}");
    }
}

#[test]
fn a_clone_slower_than_its_straggler_hands_the_flows_back() {
    let report = recorded_run("clone-loses", EXAMPLE, "faults/threaded/clone-loses.yaml", &["-w", "2"]);
    let c = changes(&report);
    let kinds: Vec<&str> = c.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(kinds, ["clone", "clone_back"], "{c:?}");
    assert_eq!(c[0].2, Some(false), "{c:?}");
    // The clone gave its flows back: it settled that change (flushed its updates, handed its
    // timers over, dropped its copies) and retired. Before 2026-12-07 it was not asked to
    // settle and stayed serving; the straggler could then load the vertex's values before
    // the clone's last updates reached the store (a connection given a second NAT port).
    let retired: Vec<bool> = common::instances(&report, "nat").iter().map(|i| i.1).collect();
    assert_eq!(retired, [false, true], "the NAT's instances, retired or not: {:?}", report["vertices"]);
}

#[test]
fn a_clone_that_loses_after_a_store_crash_settles_before_its_straggler_serves_again() {
    // The straggler, left alone again, loads the vertex's values: the clone's updates must all
    // be in the store by then (this schedule failed in 9 of 15 runs while they might not be).
    // The clone, slowed by 6-19 µs a packet, loses its trial on a quiet machine; on a loaded
    // one the straggler's time before the clone can be the longer (the verdict follows the
    // measured times), so the runs go on until three handed the flows back.
    let faults = "faults/threaded/clone-loses-after-store-crash.yaml";
    let extra = ["-w", "1", "--batch", "1", "--log", "store"];
    let mut handed_back = 0;
    for run in 0..8 {
        let input = ("chains/nat.yaml", "traces/demo.pcap", "12000");
        let report = recorded_run(&format!("clone-store-{run}"), input, faults, &extra);
        assert_eq!(report["store_crashes"].as_array().map(Vec::len), Some(1), "run {run}: {report}");
        let c = changes(&report);
        match c.first().and_then(|x| x.2) {
            Some(false) => {
                assert_eq!(c.get(1).map(|x| x.0.as_str()), Some("clone_back"), "run {run}: {c:?}");
                handed_back += 1;
            }
            // Kept, or its trial not ended when the input did: nothing handed back.
            _ => assert_eq!(c.len(), 1, "run {run}: {c:?}"),
        }
        if handed_back == 3 {
            break;
        }
    }
    assert!(handed_back > 0, "no run of eight handed the flows back");
}

#[test]
fn a_vertex_manager_clones_its_straggler() {
    // Two NAT instances, the second slowed from 10 %: the manager clones it.
    let report = recorded_run("straggler-policy", EXAMPLE, "faults/straggler-policy.yaml", &["-w", "2"]);
    let c = changes(&report);
    assert!(c.iter().any(|x| x.0 == "clone" && x.1 == "nat"), "no clone of the NAT: {c:?}");
}

#[test]
fn a_clone_on_redis_is_equivalent() {
    let store = common::redis_store("cl");
    let input = ("chains/example.yaml", "traces/demo.pcap", "6000");
    let report = recorded_run("clone-redis", input, "faults/straggler.yaml", &["--store", &store]);
    let c = changes(&report);
    assert_eq!(c.first().map(|x| x.0.as_str()), Some("clone"), "{c:?}");
}

#[test]
fn clones_that_cannot_be_made_are_clear_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clone_3 = "events:\n  - at: { packet: 10 }\n    clone: { vertex: nat, instance: 3 }\n";
    let missing = common::schedule(dir.path(), "missing.yaml", clone_3);
    common::refused_schedules(&[
        (missing.as_str(), &[][..], "has 1 instance(s) at this point, not an instance 3"),
        ("faults/straggler.yaml", &["--mode", "local"][..], "state in a store"),
    ]);
}

#[test]
fn a_clone_asked_through_the_control_endpoint_is_equivalent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().join("rec").to_string_lossy().into_owned();
    let (child, addr) = common::paced_live_run(&d, &[]);
    std::thread::sleep(std::time::Duration::from_millis(400));
    common::ctl(&addr, &["clone", "nat:0"]);
    // Refused, changing nothing: no such instance; no instance named.
    common::refused_actions(
        &addr,
        &[
            (r#"{"clone": {"vertex": "nat", "instance": 9}}"#, 404, "no instance 9"),
            (r#"{"clone": {"vertex": "nat"}}"#, 400, "clone needs vertex and instance"),
        ],
    );
    let out = child.wait_with_output().expect("sluice run ends");
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report JSON");
    let c = changes(&report);
    assert_eq!(c.first().map(|x| (x.0.as_str(), x.1.as_str())), Some(("clone", "nat")), "{c:?}");
    let v = sluice(&["verify", "--recorded", &d]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
}
