//! `sluice verify` as the docs show it: every bundled fault schedule names the command that runs
//! it in its header, and that command must do what the header says (exit 0: equivalent; with a
//! mechanism switched off, exit 4 and a JSON report listing the differences).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

/// The `sluice verify ...` command lines in a schedule file's header comments.
/// Splits a command line written in a test into arguments.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

fn documented_commands(file: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).expect("schedule file");
    text.lines().filter_map(|l| l.trim_start_matches('#').trim().strip_prefix("sluice verify ")).map(words).collect()
}

/// Runs `sluice verify` with `args` (paths relative to the repository) on the first `limit`
/// packets; returns the exit code and stdout.
fn verify(args: &[String], limit: &str, json: bool) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.current_dir(repo("")).arg("verify").args(args).args(["--limit", limit]);
    if json {
        cmd.arg("--json");
    }
    let o = cmd.output().expect("run sluice verify");
    let code = o.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

#[test]
fn every_bundled_schedule_runs_as_documented() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo("faults"))
        .expect("faults/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "the bundled schedules: {files:?}");
    let mut ran = 0;
    for f in &files {
        let commands = documented_commands(f);
        assert!(!commands.is_empty(), "{} names no `sluice verify` command in its header", f.display());
        for args in commands {
            // A third of the demo trace keeps the suite short; percentages scale with it.
            let (code, out) = verify(&args, "20000", false);
            let want = if args.iter().any(|a| a == "--off") { 4 } else { 0 };
            assert_eq!(code, want, "{}: sluice verify {}\n{out}", f.display(), args.join(" "));
            ran += 1;
        }
    }
    assert!(ran > files.len(), "some schedule documents a second command");
}

#[test]
fn without_duplicate_suppression_the_json_report_lists_the_duplicates() {
    let args = words(
        "--chain chains/nat-portscan.yaml --input traces/demo.pcap --faults faults/straggler.yaml --arrival-ns 4000 --off dedup",
    );
    let (code, out) = verify(&args, "30000", true);
    assert_eq!(code, 4, "{out}");
    let json_end = out.rfind('}').expect("JSON report on stdout");
    let report: serde_json::Value = serde_json::from_str(&out[..=json_end]).expect("JSON report");
    assert_eq!(report["equivalent"], false);
    let engine = &report["engine"];
    assert!(engine["duplicate_packets"]["portscan"].as_u64().unwrap_or(0) > 0, "{engine}");
    assert!(engine["duplicate_outputs"].as_u64().unwrap_or(0) > 0, "{engine}");
    let diffs = report["comparison"]["differences"].as_array().expect("differences");
    let dup = diffs.iter().find(|d| d["kind"] == "duplicated").expect("a duplicated output is listed");
    // Every difference names where it happened.
    for field in ["clock", "input", "flow"] {
        assert!(!dup[field].is_null(), "difference without {field}: {dup}");
    }
}

#[test]
fn several_roots_from_the_command_line() {
    let args = words(
        "--chain chains/example.yaml --input traces/demo.pcap --roots 2 --log store --crash-root 1@30% --crash nat:0@30%",
    );
    let (code, out) = verify(&args, "10000", false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("root 1: clock resumes"), "{out}");
    let bad = words("--chain chains/example.yaml --input traces/demo.pcap --roots 2 --crash-root 2@30%");
    let (code, out) = verify(&bad, "10000", false);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("no root 2"), "{out}");
}

#[test]
fn fuzz_dry_run_prints_schedules_that_verify_runs() {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(repo(""))
        .args(["fuzz", "--dry-run", "--seed", "40", "--n", "2", "--limit", "2000"])
        .args(["--chain", "chains/example.yaml", "--input", "traces/demo.pcap"])
        .output()
        .expect("run sluice fuzz --dry-run");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let docs: Vec<&str> = out.split("---\n").filter(|d| !d.trim().is_empty()).collect();
    assert_eq!(docs.len(), 2, "one schedule per run: {out}");
    let dir = std::env::temp_dir().join(format!("sluice-dry-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (i, doc) in docs.iter().enumerate() {
        // Run i uses seed SEED+i, and the schedule is the one a real run of that seed checks.
        assert!(doc.contains(&format!("seed: {}\n", 40 + i)), "{doc}");
        assert!(doc.contains("events:"), "{doc}");
        let file = dir.join(format!("run-{i}.yaml"));
        std::fs::write(&file, doc).expect("write schedule");
        let args = words(&format!("--chain chains/example.yaml --input traces/demo.pcap --faults {}", file.display()));
        let (code, report) = verify(&args, "2000", false);
        assert_eq!(code, 0, "seed {}: {report}", 40 + i);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
