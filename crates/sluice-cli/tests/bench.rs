//! `sluice bench --quick`: every case is measured and reported with sane numbers, and the JSON
//! and SVG files are written. No timing assertions: performance lives in benchmarks.

use std::process::Command;

/// The cases a quick run must report: every NF alone and the example chain, 64-byte and
/// trace-size (`mix`) packets, run to completion (w0), 1 and 2 workers.
fn expected_cases() -> Vec<String> {
    let chains = ["passthrough", "nat", "lb", "firewall", "portscan", "trojan", "ids", "example"];
    let mut v = Vec::new();
    for c in chains {
        for size in ["64B", "mix"] {
            for w in [0, 1, 2] {
                v.push(format!("{c}/{size}/w{w}"));
            }
        }
    }
    v
}

#[test]
fn quick_bench_writes_json_and_svg() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("tmp.json");
    let svg = dir.path().join("tmp.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "--quick", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("run sluice bench");
    assert!(
        out.status.success(),
        "sluice bench failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("aims"), "no aims in the table:\n{stdout}");

    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("read json")).expect("json");
    for key in ["nproc", "cpu_model", "kernel", "date_utc"] {
        assert!(!v["machine"][key].is_null(), "machine.{key} missing: {}", v["machine"]);
    }
    assert!(v["command"].as_str().is_some_and(|c| c.contains("bench")), "command: {}", v["command"]);
    let cases = v["cases"].as_array().expect("cases");
    for name in expected_cases() {
        let case = cases.iter().find(|c| c["name"] == name.as_str()).unwrap_or_else(|| panic!("case {name} missing"));
        let summary = &case["summary"];
        let mpps = summary["mpps"]["median"].as_f64().expect("mpps");
        assert!(mpps > 0.0, "{name}: mpps {mpps}");
        assert!(summary["busy_mpps"]["median"].as_f64().expect("busy") > 0.0, "{name}: busy mpps");
        let repeats = case["repeats"].as_array().expect("repeats");
        assert_eq!(repeats.len(), 1, "{name}: a quick run has one repeat");
        for r in repeats {
            assert!(r["mpps"].as_f64().expect("mpps") > 0.0, "{name}");
            let l = &r["latency_us"];
            let p: Vec<f64> =
                ["p5", "p25", "p50", "p75", "p95", "p99"].iter().map(|k| l[k].as_f64().expect("percentile")).collect();
            assert!(p[0] > 0.0, "{name}: p5 {}", p[0]);
            assert!(p.windows(2).all(|w| w[0] <= w[1]), "{name}: percentiles not monotonic: {p:?}");
        }
        let s: Vec<f64> = ["p5_us", "p25_us", "p50_us", "p75_us", "p95_us", "p99_us"]
            .iter()
            .map(|k| summary[k]["median"].as_f64().expect("percentile"))
            .collect();
        assert!(s.windows(2).all(|w| w[0] <= w[1]), "{name}: median percentiles not monotonic: {s:?}");
    }
    assert!(!v["aims"].as_array().expect("aims").is_empty(), "aims missing");

    let text = std::fs::read_to_string(&svg).expect("read svg");
    assert!(text.starts_with("<svg") || text.starts_with("<?xml"), "not an SVG: {}", &text[..text.len().min(80)]);
    for name in expected_cases() {
        assert!(text.contains(&name), "the plot does not label {name}");
    }
}

#[test]
fn bench_filter_and_list() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "--quick", "--list", "--filter", "nat/64B"])
        .output()
        .expect("run sluice bench");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(listed, ["nat/64B/w0", "nat/64B/w1", "nat/64B/w2"]);

    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "--quick", "--filter", "no-such-case"])
        .output()
        .expect("run sluice bench");
    assert_eq!(out.status.code(), Some(1), "an empty selection is an error");
}
