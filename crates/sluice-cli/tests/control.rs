//! The control endpoint of a running chain (`sluice run --control`) and `sluice ctl`: live
//! statistics that move while traffic flows, Prometheus metrics, and clear 4xx answers to
//! requests without the token, with a wrong one, or for what does not exist.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.current_dir(repo(""));
    c
}

/// Stops the run however the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

mod common;

fn http(addr: &str, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    common::http(addr, method, path, token, "")
}

fn http_with(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    common::http(addr, method, path, token, body)
}

fn ctl(port: &str, token: &str, args: &[&str]) -> Output {
    sluice().args(["ctl", "--control", port, "--token", token]).args(args).output().expect("run sluice ctl")
}

fn packets_in_at_nat(port: &str) -> u64 {
    let o = ctl(port, "s3cret", &["list", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["chain"], "example");
    assert_eq!(v["vertices"].as_array().map(Vec::len), Some(4), "{v}");
    v["vertices"][0]["instances"][0]["packets_in"].as_u64().unwrap_or(0)
}

#[test]
fn a_running_chain_answers_its_control_endpoint() {
    let mut child = sluice()
        // The demo trace paced to last about 40 s: traffic flows the whole time the test looks.
        .args([
            "run",
            "-c",
            "chains/example.yaml",
            "-i",
            "traces/demo.pcap",
            "--pace",
            "0.003",
            "--duration",
            "60",
            "-q",
        ])
        .args(["--no-pin", "--control", "0", "--control-token", "s3cret", "--fault-tolerance"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice run");
    let (addr, line) = common::control_endpoint(&mut child);
    let run = Running(child);
    assert!(!line.contains("s3cret"), "a given token is not printed: {line}");
    assert!(addr.starts_with("127.0.0.1:"), "a bare port listens on loopback: {addr}");
    let port = addr.rsplit(':').next().unwrap_or_default().to_string();

    // Live statistics move while traffic flows.
    let first = packets_in_at_nat(&port);
    let deadline = Instant::now() + Duration::from_secs(30);
    let later = loop {
        std::thread::sleep(Duration::from_millis(300));
        let n = packets_in_at_nat(&port);
        if n > first || Instant::now() > deadline {
            break n;
        }
    };
    assert!(later > first, "the NAT's packet count did not grow: {first} then {later}");
    let table = ctl(&port, "s3cret", &["list"]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("chain example") && table.contains("portscan"), "{table}");

    let m = ctl(&port, "s3cret", &["metrics"]);
    let metrics = String::from_utf8_lossy(&m.stdout).into_owned();
    for want in [
        "sluice_root_packets_in_total ",
        "sluice_instance_packets_in_total{vertex=\"nat\",instance=\"0\"} ",
        "sluice_instance_queued_batches{vertex=\"lb\",instance=\"0\"} ",
        "sluice_in_flight ",
        "# TYPE sluice_instance_dropped_by_reason counter",
        "# TYPE sluice_instance_state counter",
        // The default state mode is async on the embedded store: the NAT's client counts.
        "sluice_instance_state_total{vertex=\"nat\",instance=\"0\",counter=\"requests\"} ",
        // With --fault-tolerance: the root's log.
        "sluice_root_log_entries ",
        "sluice_root_log_deleted_total ",
        "sluice_root_log_commits_total ",
        "sluice_duplicates_suppressed_total 0",
    ] {
        assert!(metrics.contains(want), "no `{want}` in\n{metrics}");
    }
    let requests = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("sluice_instance_state_total{vertex=\"nat\",instance=\"0\",counter=\"requests\"} ")
        })
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(requests.is_some_and(|n| n > 0), "the NAT made store requests: {requests:?}");

    // Bad requests: a clear 4xx and JSON saying why.
    let (code, body) = http(&addr, "GET", "/api/v1/chain", None);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("missing token"), "{body}");
    let (code, body) = http(&addr, "GET", "/metrics", Some("wrong"));
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("wrong token"), "{body}");
    let (code, body) = http(&addr, "GET", "/api/v1/vertices/nope", Some("s3cret"));
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("no such endpoint"), "{body}");
    let (code, _) = http(&addr, "DELETE", "/api/v1/chain", Some("s3cret"));
    assert_eq!(code, 405);
    let o = ctl(&port, "wrong", &["list"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("401"), "{}", String::from_utf8_lossy(&o.stderr));
    // Actions: `slow` applies; bad ones are refused with a 4xx and change nothing.
    let o = ctl(&port, "s3cret", &["slow", "nat:0=20-30"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let slow_of = |vertex: usize| {
        let o = ctl(&port, "s3cret", &["list", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        v["vertices"][vertex]["instances"][0]["slow_us"].clone()
    };
    assert_eq!(slow_of(0), serde_json::json!([20, 30]));
    let post = |body: &str| http_with(&addr, "POST", "/api/v1/actions", Some("s3cret"), body);
    for (body, code, says) in [
        (r#"{"slow": {"vertex": "nope", "instance": 0, "delay_us": [1, 2]}}"#, 404, "no vertex `nope`"),
        (r#"{"slow": {"vertex": "portscan", "instance": 7, "delay_us": [1, 2]}}"#, 404, "no instance 7"),
        (r#"{"slow": {"vertex": "portscan", "instance": 0, "delay_us": [9, 2]}}"#, 400, "must not exceed"),
        (r#"{"slow": {"vertex": "portscan"}}"#, 400, "slow needs"),
        (r#"{"slow": "#, 400, "malformed JSON"),
        (r#"{"frobnicate": {}}"#, 400, "unknown action"),
        (r#"{"crash": {"vertex": "nat", "instance": 3}}"#, 404, "no instance 3"),
        (r#"{"crash": {"vertex": "nat"}}"#, 400, "crash needs"),
        (r#"{"crash_store": {"now": 1}}"#, 400, "crash_store takes {}"),
        (r#"{"scale": {"vertex": "nat", "to": 0}}"#, 400, "at least one instance"),
        (r#"{"move": {"vertex": "nat", "from": 0, "to": 4}}"#, 404, "no instance 4"),
        (r#"[1, 2]"#, 400, "send one action"),
    ] {
        let (c, answer) = post(body);
        assert_eq!(c, code, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer}");
    }
    let (c, answer) = http_with(&addr, "POST", "/api/v1/actions", None, r#"{"slow": {}}"#);
    assert_eq!(c, 401, "{answer}");
    assert_eq!(slow_of(1), serde_json::Value::Null, "nothing refused changed the portscan instance");
    assert_eq!(slow_of(0), serde_json::json!([20, 30]), "nor the NAT");
    let o = ctl(&port, "s3cret", &["slow", "nat:0=0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(slow_of(0), serde_json::Value::Null, "back to normal");
    let o = ctl(&port, "s3cret", &["slow", "nat=3"]);
    assert_eq!(o.status.code(), Some(2), "a bad spec is refused before anything is sent");
    // The run is unaffected: it still counts.
    assert!(packets_in_at_nat(&port) >= later);
    drop(run);
}

#[test]
fn bad_control_addresses_are_refused() {
    let o =
        sluice().args(["run", "-c", "chains/example.yaml", "--gen", "demo", "--control", "not-an-address"]).output();
    let o = o.expect("run");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("PORT or HOST:PORT"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = sluice().args(["ctl", "--control", "1", "list"]).env_remove("SLUICE_CONTROL_TOKEN").output().expect("ctl");
    assert_eq!(o.status.code(), Some(2), "no token");
}

#[test]
fn a_crash_is_refused_by_a_run_that_cannot_fail_over() {
    // No --fault-tolerance: no root log to replay from.
    let mut child = sluice()
        .args(["run", "-c", "chains/nat.yaml", "-i", "traces/demo.pcap", "--pace", "0.003", "--duration", "30"])
        .args(["-q", "--no-pin"])
        .args(["--control", "0", "--control-token", "s3cret"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice run");
    let (addr, _) = common::control_endpoint(&mut child);
    let run = Running(child);
    std::thread::sleep(Duration::from_millis(300));
    let (c, answer) =
        http_with(&addr, "POST", "/api/v1/actions", Some("s3cret"), r#"{"crash": {"vertex": "nat", "instance": 0}}"#);
    assert_eq!(c, 409, "{answer}");
    assert!(answer.contains("--fault-tolerance"), "{answer}");
    drop(run);
}
