//! The `sluice` command as users and scripts see it: reports, pcap output that tcpdump reads,
//! located validation errors and exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).output().expect("run sluice")
}

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

fn trace(name: &str) -> String {
    repo("../shared/traces").join(name).display().to_string()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn example_chain_output_is_read_by_tcpdump_with_the_reported_count() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("out.pcap");
    let json = dir.path().join("report.json");
    let chain = repo("chains/example.yaml").display().to_string();
    let o = sluice(&[
        "run",
        "--chain",
        &chain,
        "--input",
        &trace("echo-connections.pcap"),
        "--output",
        out.to_str().expect("utf8"),
        "--json",
        json.to_str().expect("utf8"),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("packets  in        82582"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse json");
    let reported_out = report["packets_out"].as_u64().expect("packets_out");
    assert_eq!(report["packets_in"].as_u64(), Some(82_582));
    assert_eq!(
        report["packets_in"].as_u64(),
        Some(reported_out + report["dropped_total"].as_u64().expect("dropped_total"))
    );
    let names: Vec<&str> =
        report["vertices"].as_array().expect("vertices").iter().filter_map(|v| v["name"].as_str()).collect();
    assert_eq!(names, ["nat", "portscan", "lb", "trojan"]);

    let td = Command::new("tcpdump").args(["-n", "-r"]).arg(&out).output();
    let td = td.expect("tcpdump is not installed: apt-get install -y tcpdump");
    assert!(td.status.success(), "tcpdump failed: {}", text(&td));
    let lines = String::from_utf8_lossy(&td.stdout).lines().count() as u64;
    assert_eq!(lines, reported_out, "tcpdump read a different number of packets than the report says went out");
}

/// Every chain the project ships in `chains/` (the README, the docs and the scripts use them)
/// is valid. (`chains/embark/` holds Embark provider files, checked by the Embark tests.)
#[test]
fn every_shipped_chain_is_valid() {
    let mut checked = 0;
    for e in std::fs::read_dir(repo("chains")).expect("chains/").map(|e| e.expect("dir entry").path()) {
        if e.extension().is_some_and(|x| x == "yaml") {
            let o = sluice(&["validate", &e.display().to_string()]);
            assert_eq!(o.status.code(), Some(0), "{}: {}", e.display(), text(&o));
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} chain files found");
}

#[test]
fn validate_names_file_line_and_field() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = repo("chains/example.yaml").display().to_string();
    let o = sluice(&["validate", &good]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "vertices:\n  nat:\n    type: nat\n  scan:\n    type: portscann\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: scan }\n  - { from: scan, to: output }\n",
    )
    .expect("write");
    let o = sluice(&["validate", bad.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    let msg = text(&o);
    assert!(msg.contains("bad.yaml:5: field `vertices.scan.type`"), "{msg}");
    assert!(msg.contains("unknown NF type `portscann`"), "{msg}");

    // An NF's own configuration is checked too, and located.
    std::fs::write(
        &bad,
        "vertices:\n  nat:\n    type: nat\n    config:\n      external_ip: 198.51.100.1\n      port_range: [5000, 4000]\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: output }\n",
    )
    .expect("write");
    let o = sluice(&["validate", "--json", bad.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).expect("json");
    assert_eq!(v["valid"], false);
    assert_eq!(v["line"].as_u64(), Some(6), "{v}");
    assert!(v["field"].as_str().is_some_and(|f| f.ends_with("port_range")), "{v}");

    // Graph errors: a cycle, an edge to nowhere.
    std::fs::write(
        &bad,
        "vertices:\n  a: { type: passthrough }\n  b: { type: passthrough }\nedges:\n  - { from: input, to: a }\n  - { from: a, to: b }\n  - { from: b, to: a }\n  - { from: b, to: output }\n",
    )
    .expect("write");
    let o = sluice(&["validate", bad.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("cycle"), "{}", text(&o));
}

#[test]
fn exit_codes_and_help() {
    for cmd in
        [&["--help"][..], &["run", "--help"], &["gen", "--help"], &["inspect", "--help"], &["validate", "--help"]]
    {
        let o = sluice(cmd);
        assert_eq!(o.status.code(), Some(0), "{cmd:?}: {}", text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("Usage"), "{cmd:?}");
    }
    let chain = repo("chains/passthrough.yaml").display().to_string();
    let o = sluice(&["run", "--chain", &chain, "--input", "/nonexistent/x.pcap"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let dir = tempfile::tempdir().expect("tmp");
    let junk = dir.path().join("junk.pcap");
    std::fs::write(&junk, b"this is not a capture file at all").expect("write");
    let o = sluice(&["inspect", junk.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let o = sluice(&["run", "--chain", "/nonexistent/chain.yaml", "--input", &trace("irc-basic.pcap")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = sluice(&["run", "--bogus-flag"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn live_io_options_refused_where_they_mean_nothing() {
    let chain = repo("chains/passthrough.yaml").display().to_string();
    let input = trace("irc-basic.pcap");
    let o = sluice(&["run", "--chain", &chain, "--input", &input, "--io", "xdp"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--io is for --bridge"), "{}", text(&o));
    let o = sluice(&["run", "--chain", &chain, "--bridge", "a,b", "--xdp-mode", "driver"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--xdp-mode is for --bridge with --io xdp"), "{}", text(&o));
    let o = sluice(&["run", "--chain", &chain, "--bridge", "a,b", "--io", "xdp", "--xdp-mode", "turbo"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("unknown XDP mode"), "{}", text(&o));
    // A bridge on interfaces that do not exist names the interface and the call.
    let o = sluice(&["run", "--chain", &chain, "--bridge", "nosuchif0,nosuchif1", "--io", "xdp"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("nosuchif0: if_nametoindex failed"), "{}", text(&o));
    // A fault schedule on a live bridge goes by packet: a percent position is refused, before
    // any interface is opened. A latency window of 0 ms is refused.
    let example = repo("chains/example.yaml").display().to_string();
    let percent = repo("faults/nf-crash.yaml").display().to_string();
    let o = sluice(&["run", "--chain", &example, "--bridge", "nosuchif0,nosuchif1", "--faults", &percent]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("a live bridge has no known length"), "{}", text(&o));
    let o = sluice(&["run", "--chain", &chain, "--input", &input, "--latency-window", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--latency-window"), "{}", text(&o));
    // sluice send: a bad MAC, a bad rate, no input.
    let o = sluice(&["send", "--interface", "lo", "--gen", "long", "--dst-mac", "02:00:zz:00:00:01"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("bad byte \"zz\""), "{}", text(&o));
    let o = sluice(&["send", "--interface", "lo", "--gen", "long", "--rate", "-5"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = sluice(&["send", "--interface", "lo"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = sluice(&["send", "--help"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("load generator"), "{}", text(&o));
}

/// `-w 0` runs to completion on the root thread: the same output as with a worker thread, and
/// refused, with the reason, where the root would wait for workers.
#[test]
fn run_to_completion_gives_the_same_output_and_refuses_what_needs_workers() {
    let dir = tempfile::tempdir().expect("tmp");
    let input = trace("http_methods.pcap");
    let out = |w: &str| {
        let p = dir.path().join(format!("out-{w}.pcap"));
        let path = p.to_string_lossy().into_owned();
        let o = sluice(&[
            "run",
            "-c",
            &repo("chains/example.yaml").display().to_string(),
            "-i",
            &input,
            "-w",
            w,
            "-o",
            &path,
        ]);
        assert!(o.status.success(), "-w {w}: {}", text(&o));
        if w == "0" {
            assert!(text(&o).contains("run to completion on the root thread"), "{}", text(&o));
        }
        std::fs::read(p).expect("output")
    };
    let (inline, threaded) = (out("0"), out("1"));
    assert!(inline.len() > 1000, "{} bytes", inline.len());
    assert_eq!(inline, threaded, "run to completion changed the output");
    let chain = repo("chains/example.yaml").display().to_string();
    for (extra, why) in [
        (&["--fault-tolerance"][..], "fault tolerance"),
        (&["--roots", "2"][..], "several roots"),
        (&["--control", "0"][..], "a control endpoint"),
        (&["--faults", &repo("faults/scale.yaml").display().to_string()][..], "planned faults or changes"),
    ] {
        let o = sluice(&[&["run", "-c", &chain, "-i", &input, "-w", "0", "-q"][..], extra].concat());
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        let t = text(&o);
        assert!(t.contains("is for plain runs, not with") && t.contains(why), "{extra:?}: {t}");
    }
}

#[test]
fn gen_then_inspect_and_run_from_the_generator() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("g.pcap");
    let o = sluice(&["gen", "--workload", "50x20", "--seed", "3", "--output", f.to_str().expect("utf8"), "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = sluice(&["inspect", "--json", f.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", text(&o));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(s["packets"].as_u64(), Some(1000));
    assert_eq!(s["flows"].as_u64(), Some(50));
    let chain = repo("chains/example.yaml").display().to_string();
    let o = sluice(&["run", "--chain", &chain, "--gen", "50x20", "--seed", "3", "--json", "-", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json report on stdout");
    assert_eq!(r["packets_in"].as_u64(), Some(1000));
    // --limit stops the generator too.
    let o =
        sluice(&["run", "--chain", &chain, "--gen", "50x20", "--size", "64", "--limit", "300", "--json", "-", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json report on stdout");
    assert_eq!(r["packets_in"].as_u64(), Some(300));
    // Generator options with a trace would be ignored: refused instead.
    let t = repo("traces/demo.pcap").display().to_string();
    for opt in [["--scale", "0.5"], ["--size", "64"]] {
        let o = sluice(&["run", "--chain", &chain, "-i", &t, opt[0], opt[1], "-q"]);
        assert_eq!(o.status.code(), Some(2), "{opt:?}: {}", text(&o));
        assert!(text(&o).contains("are for --gen input"), "{opt:?}: {}", text(&o));
    }
}

#[test]
fn chain_file_state_section_and_mode_flag() {
    let dir = tempfile::tempdir().expect("tmp");
    let chain = dir.path().join("c.yaml");
    std::fs::write(
        &chain,
        "state: { mode: local }\nvertices:\n  nat: { type: nat }\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: output }\n",
    )
    .expect("write");
    let c = chain.to_str().expect("utf8");
    let t = trace("ftp_retr.pcap");
    let run_state = |extra: &[&str]| {
        let mut args = vec!["run", "--chain", c, "--input", t.as_str(), "--json", "-", "--quiet"];
        args.extend_from_slice(extra);
        let o = sluice(&args);
        assert!(o.status.success(), "{}", text(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        r["state"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(run_state(&[]), "local");
    assert!(run_state(&["--mode", "cached"]).starts_with("cached (embedded"));
    std::fs::write(&chain, "state: { mode: fast }\nvertices:\n  nat: { type: nat }\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: output }\n").expect("write");
    let o = sluice(&["validate", c]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("c.yaml:1: field `state.mode`"), "{}", text(&o));
}
