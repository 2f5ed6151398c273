//! Every bundled fault schedule (`faults/*.yaml`, `faults/threaded/*.yaml`) through the
//! threaded runtime, with one root and with three: run on the example chain over the bundled
//! trace with `--record`, and the record checked with `sluice verify --recorded`. A file added to either directory is covered
//! without a test of its own. (`faults/regressions/` are the engine's regression cases, with
//! engine run options; `faults/unrecoverable/` are outside the guarantee by design.)

mod common;

use common::{recorded_run, repo, schedules};
use std::path::PathBuf;

#[test]
fn every_bundled_schedule_is_equivalent_in_threads() {
    let files: Vec<PathBuf> = schedules("faults").into_iter().chain(schedules("faults/threaded")).collect();
    assert!(files.len() >= 18, "the bundled schedules: {files:?}");
    for f in &files {
        let body = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let path = f.to_string_lossy().into_owned();
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        // A root crash with an NF failing after it needs the log in the store (CHC's limit
        // otherwise, reported as `beyond_replay`).
        let mut extra = vec!["-w", "2"];
        if body.contains("crash_root") {
            extra.extend(["--log", "store"]);
        }
        let report = recorded_run(&name, ("chains/example.yaml", "traces/demo.pcap", "20000"), &path, &extra);
        assert_eq!(report["packets_in"], 20000, "{name}: {report}");
    }
}

/// The same files with their input split over three roots: a change of flow allocation takes
/// effect at an entry time, a crash is replayed by every root, `crash_root` names root 0.
#[test]
fn every_bundled_schedule_is_equivalent_in_threads_with_three_roots() {
    let files: Vec<PathBuf> = schedules("faults").into_iter().chain(schedules("faults/threaded")).collect();
    for f in &files {
        let body = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(!body.contains("roots:"), "{}: a bundled file names no root count", f.display());
        let path = f.to_string_lossy().into_owned();
        let name = format!("{}-roots", f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
        let mut extra = vec!["-w", "2", "--roots", "3"];
        if body.contains("crash_root") {
            extra.extend(["--log", "store"]);
        }
        let report = recorded_run(&name, ("chains/example.yaml", "traces/demo.pcap", "20000"), &path, &extra);
        assert_eq!(report["packets_in"], 20000, "{name}: {report}");
        assert_eq!(report["roots"], 3, "{name}: {report}");
    }
}

/// Every regression file the engine's random runs found (`faults/regressions/`) through the
/// threaded runtime, on the chain, trace and packet limit its `run:` section names and its log
/// place and roots, recorded and verified.
#[test]
fn every_regression_schedule_is_equivalent_in_threads() {
    let files = schedules("faults/regressions");
    assert!(files.len() >= 50, "the regression files: {}", files.len());
    let mut ran = 0;
    for f in &files {
        let schedule = sluice_coe::schedule::FaultSchedule::load(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let name = f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let path = f.to_string_lossy().into_owned();
        let run = &schedule.run;
        let dir = repo("faults/regressions");
        let chain = dir.join(run.chain.as_ref().unwrap_or_else(|| panic!("{name}: no run.chain")));
        let input = dir.join(run.input.as_ref().unwrap_or_else(|| panic!("{name}: no run.input")));
        let (chain, input) = (chain.to_string_lossy().into_owned(), input.to_string_lossy().into_owned());
        let roots = run.roots.unwrap_or(1).to_string();
        let limit = run.limit.map_or_else(|| u64::MAX.to_string(), |l| l.to_string());
        let mut extra = vec!["-w", "2", "--roots", &roots];
        if run.log == Some(sluice_coe::engine::LogPlace::Store) {
            extra.extend(["--log", "store"]);
        }
        let report = recorded_run(&name, (&chain, &input, &limit), &path, &extra);
        assert!(report["packets_in"].as_u64().is_some_and(|n| n > 0), "{name}: {report}");
        ran += 1;
    }
    assert_eq!(ran, files.len(), "every regression file ran in threads");
}
