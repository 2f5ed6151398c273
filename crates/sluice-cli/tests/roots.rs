//! Several roots (`sluice run --roots N`): each on its own thread, stamping its own clocks on
//! its share of the input. Recorded runs over the bundled and shared traces must be equivalent
//! to the logical chain — with scaling, moves and clones too — every root must have had a
//! share, and a bad root count is refused with the reason.

use std::path::Path;

mod common;

use common::{sluice, text};

/// Records `chain` over `trace` with `extra` options, checks the record against the logical
/// chain, and returns the roots whose clocks the record holds.
fn equivalent_run(name: &str, chain: &str, trace: &Path, extra: &[&str]) -> Vec<u64> {
    let dir = std::env::temp_dir().join(format!("sluice-roots-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().into_owned();
    let t = trace.to_string_lossy().into_owned();
    let mut args = vec!["run", "-c", chain, "-i", &t, "-q", "--no-pin", "--record", &d];
    args.extend_from_slice(extra);
    let o = sluice(&args);
    assert!(o.status.success(), "{name}: {}", text(&o));
    let v = sluice(&["verify", "--recorded", &d]);
    assert_eq!(v.status.code(), Some(0), "{name}: {}", text(&v));
    let record: serde_json::Value = std::fs::read(dir.join("record.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| panic!("{name}: no readable record.json"));
    let mut roots: Vec<u64> =
        record["admitted"].as_array().into_iter().flatten().filter_map(|c| c.as_u64()).map(|c| c >> 56).collect();
    roots.sort_unstable();
    roots.dedup();
    let _ = std::fs::remove_dir_all(dir);
    roots
}

/// The bundled trace and every shared one.
fn traces() -> Vec<std::path::PathBuf> {
    let mut all = vec![common::repo("traces/demo.pcap")];
    let shared = common::repo("../shared/traces");
    let mut found: Vec<_> = std::fs::read_dir(&shared)
        .unwrap_or_else(|e| panic!("{}: {e}", shared.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    found.sort();
    assert!(found.len() >= 5, "the shared traces: {found:?}");
    all.extend(found);
    all
}

#[test]
fn several_roots_are_equivalent_on_every_trace() {
    // Order-sensitive detectors (portscan, trojan) behind a NAT whose connections' two
    // directions enter at different roots: everything the roots feed merges them in entry order.
    let cases: [(&str, &[&str]); 3] = [
        ("chains/example.yaml", &["--roots", "2", "-w", "2", "--fault-tolerance"]),
        ("chains/nat-trojan.yaml", &["--roots", "3", "-w", "1", "--mode", "cached", "--fault-tolerance"]),
        ("chains/nat-portscan.yaml", &["--roots", "4", "-w", "2", "--batch", "5", "--mode", "external"]),
    ];
    let mut shares = 0;
    for trace in traces() {
        for (chain, extra) in cases {
            let name = format!("{}-{}", trace.file_stem().map(|s| s.to_string_lossy()).unwrap_or_default(), extra[1]);
            let roots = equivalent_run(&name, chain, &trace, extra);
            assert!(roots.iter().all(|r| *r < 4), "{name}: clocks of roots {roots:?}");
            shares += usize::from(roots.len() > 1);
        }
    }
    // Traces between few hosts may all fall to one root; most must not.
    assert!(shares >= 10, "only {shares} runs split their input over several roots");
}

#[test]
fn several_roots_split_generated_traffic_over_all_of_them_with_local_state_too() {
    let trace = std::env::temp_dir().join(format!("sluice-roots-gen-{}.pcap", std::process::id()));
    let t = trace.to_string_lossy().into_owned();
    let o = sluice(&["gen", "--workload", "300x40", "--output", &t]);
    assert!(o.status.success(), "{}", text(&o));
    let cases: [(&str, &[&str]); 2] = [
        ("gen-local", &["--roots", "3", "--mode", "local", "--window", "96", "--batch", "8"]),
        ("gen-ft", &["--roots", "5", "--fault-tolerance", "--window", "640", "--batch", "16"]),
    ];
    for (name, extra) in cases {
        let roots = equivalent_run(name, "chains/example.yaml", &trace, extra);
        let n: u64 = extra[1].parse().unwrap_or(0);
        assert_eq!(roots, (0..n).collect::<Vec<_>>(), "{name}: every root admits a share");
    }
    let _ = std::fs::remove_file(trace);
}

#[test]
fn several_roots_on_redis_are_equivalent() {
    let store = common::redis_store("roots");
    let roots = equivalent_run(
        "redis",
        "chains/example.yaml",
        &common::repo("traces/demo.pcap"),
        &["--roots", "2", "--store", &store, "--limit", "5000", "--fault-tolerance"],
    );
    assert_eq!(roots, vec![0, 1]);
}

/// Scaling, flow moves, a straggler's clone and vertex managers with several roots: each
/// change takes effect at an entry time, so every thread routes each packet by one allocation
/// and no packet before the change waits in entry order for one after it.
#[test]
fn several_roots_scale_move_and_clone_equivalently() {
    // Its input splits over every root.
    let shared_trace = common::repo("../shared/traces/ssh_ssh.pcap");
    let cases: [(&str, &str, &Path, &str); 4] = [
        ("scale", "chains/example.yaml", &common::repo("traces/demo.pcap"), "2"),
        ("move-4000", "chains/example.yaml", &common::repo("traces/demo.pcap"), "3"),
        ("straggler", "chains/example.yaml", &shared_trace, "3"),
        ("scale", "chains/example.yaml", &shared_trace, "4"),
    ];
    for (faults, chain, trace, roots) in cases {
        let name = format!("{faults}-{roots}");
        let json = std::env::temp_dir().join(format!("sluice-roots-{}-{name}.json", std::process::id()));
        let (f, j) = (common::repo(&format!("faults/{faults}.yaml")), json.to_string_lossy().into_owned());
        let f = f.to_string_lossy().into_owned();
        let extra = ["--roots", roots, "-w", "2", "--faults", &f, "--json", &j, "--limit", "30000"];
        let used = equivalent_run(&name, chain, trace, &extra);
        assert!(used.len() > 1, "{name}: one root admitted everything");
        let report: serde_json::Value = std::fs::read(&json)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_else(|| panic!("{name}: no report"));
        let changes = report["reconfigurations"].as_array().map_or(0, Vec::len);
        assert!(changes > 0, "{name}: nothing changed: {report}");
        let _ = std::fs::remove_file(json);
    }
}

#[test]
fn bad_root_counts_are_refused_with_the_reason() {
    let cases: [(&[&str], &str); 3] = [
        (&["--roots", "0"], "a run has 1 to 8"),
        (&["--roots", "9"], "a run has 1 to 8"),
        (&["--roots", "4", "--window", "64", "--batch", "32"], "must hold a batch (32) for each of the 4 roots"),
    ];
    for (extra, says) in cases {
        let mut args = vec!["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "-q", "--limit", "1000"];
        args.extend_from_slice(extra);
        let o = sluice(&args);
        assert!(!o.status.success(), "{extra:?} ran");
        assert!(text(&o).contains(says), "{extra:?}: {}", text(&o));
    }
}
