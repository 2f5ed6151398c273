//! The benchmark scripts of a chain over several processes (`scripts/bench-spread.sh`,
//! `scripts/bench-hosted.sh`, docs/benchmarks.md), run short on a small generated trace: each
//! runs to its end and prints numbers for both of its parts. No timing assertions:
//! performance lives in benchmarks.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

/// Runs `script` on `trace` once, with `env`; its stdout.
fn run_script(script: &str, trace: &Path, env: &[(&str, &str)]) -> String {
    let out = Command::new("bash")
        .arg(repo(script))
        .arg(trace)
        .arg("1")
        .env("SLUICE", env!("CARGO_BIN_EXE_sluice"))
        .envs(env.iter().copied())
        .output()
        .expect("run the script");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{script}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The number after `label` in `line` (the first word after it, as a float).
fn number_after(line: &str, label: &str) -> f64 {
    let rest = line.split(label).nth(1).unwrap_or_else(|| panic!("no `{label}` in: {line}"));
    let word = rest.split_whitespace().next().unwrap_or_default();
    word.parse().unwrap_or_else(|_| panic!("`{label}` is not followed by a number in: {line}"))
}

/// Checks a script's two lines: the throughput ratio, then the low load's latencies.
fn both_parts_measured(stdout: &str) {
    let lines: Vec<&str> = stdout.lines().collect();
    let ratio = lines.iter().find(|l| l.contains("ratio")).unwrap_or_else(|| panic!("no ratio: {stdout}"));
    let r = number_after(ratio, "ratio");
    assert!(r > 0.0 && r.is_finite(), "{ratio}");
    let low = lines.iter().find(|l| l.starts_with("low load:")).unwrap_or_else(|| panic!("no low load: {stdout}"));
    // "low load: one p50 X p99 Y us | two ... p50 X p99 Y us | added ...": both forms' medians.
    let parts: Vec<&str> = low.split('|').collect();
    assert!(parts.len() >= 2, "{low}");
    for part in &parts[..2] {
        assert!(number_after(part, "p50") > 0.0, "{low}");
    }
}

#[test]
fn the_spread_and_hosted_benchmarks_run_and_produce_numbers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let trace = dir.path().join("g.pcap");
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["gen", "-w", "200x50", "--size", "64", "-q", "-o"])
        .arg(&trace)
        .output()
        .expect("sluice gen");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let short = [("PACE", "0.05"), ("LIMIT", "2000")];
    both_parts_measured(&run_script("scripts/bench-spread.sh", &trace, &short));
    both_parts_measured(&run_script("scripts/bench-spread.sh", &trace, &[short[0], short[1], ("PLACE", "lb")]));
    // Placed by a controller over a real etcd (installed by scripts/test-all.sh).
    both_parts_measured(&run_script("scripts/bench-hosted.sh", &trace, &short));
}
