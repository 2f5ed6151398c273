//! The correlated failure that one store cannot survive (docs/correctness.md, "Correlated
//! failures": the store and an NF failing at the same instant), survived with a replicated
//! store: a real `sluice run` on a Redis Cluster whose writes are acknowledged by a replica
//! (`replicas=1`) loses its NAT instance and, at the same moment, a Redis primary (SIGKILL).
//! The replica takes over holding every acknowledged write, the NAT's replacement starts from
//! it, the root replays, and the recorded run is equivalent to the logical chain.
//!
//! The test starts its own cluster (loopback ports 7430-7435) so that killing a node disturbs
//! no other test.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

#[path = "../../sluice-redis/tests/support/cluster.rs"]
mod cluster;

use cluster::{cli, Cluster};
use common::{http, repo, sluice, text};

const PORTS: [u16; 6] = [7430, 7431, 7432, 7433, 7434, 7435];
const TOKEN: &str = "correlated";

/// What the NAT has taken in so far, from the run's metrics (0 while it does not answer).
fn nat_packets_in(addr: &str) -> u64 {
    let (_, metrics) = http(addr, "GET", "/metrics", Some(TOKEN), "");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_instance_packets_in_total{vertex=\"nat\",instance=\"0\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn an_nf_and_a_redis_primary_failing_together_are_recovered_with_a_replica() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = Cluster::start(&dir.path().join("redis"), PORTS);
    let store = format!("redis+cluster://{}?prefix=correlated&replicas=1", cluster.seeds());
    let record = dir.path().join("record");
    let report = dir.path().join("report.json");
    // 8,000 packets of the demo trace paced to last about 8 s, so the failures fall in the
    // middle of the traffic.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(repo(""))
        .args(["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--pace", "0.002", "--limit", "8000"])
        .args(["--store", &store, "--fault-tolerance", "-q", "--no-pin", "--control", "0"])
        .args(["--control-token", TOKEN])
        .arg("--record")
        .arg(&record)
        .arg("--json")
        .arg(&report)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice run");
    let (addr, _) = common::control_endpoint(&mut child);

    let deadline = Instant::now() + Duration::from_secs(60);
    while nat_packets_in(&addr) < 1_000 {
        assert!(Instant::now() < deadline, "the NAT never took 1,000 packets");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Together: the NAT instance crashes and, at once, a primary dies as a machine does. The
    // crash is asked first: once the primary is gone the run's writes wait for its replica's
    // promotion and then for a replica of their own (`replicas=1`, which comes back only with
    // the restart below), and a control action waits for the run's turn — the endpoint would
    // rightly answer 503 ("busy or stalled") after 5 s.
    let victim = cluster.a_primary();
    let (code, body) =
        http(&addr, "POST", "/api/v1/actions", Some(TOKEN), r#"{"crash": {"vertex": "nat", "instance": 0}}"#);
    cluster.kill(victim);
    let killed = Instant::now();
    assert_eq!(code, 200, "the crash was applied: {body}");
    let promoted = cluster.wait_promoted(victim, Duration::from_secs(30));
    eprintln!("a replica took over {:.1} s after the kill", killed.elapsed().as_secs_f64());
    // Writes to the promoted primary wait (replicas=1) until it has a replica again: the
    // failed machine comes back, as an operator or systemd brings it back.
    cluster.restart(victim);

    let status = common::ended_within(&mut child, Duration::from_secs(180));
    assert!(status.success(), "sluice run failed: {status}");
    assert!(cli(victim, &["info", "replication"]).contains("role:slave"), "the restarted node rejoined as a replica");
    let keys: u64 = cli(promoted, &["dbsize"]).trim().parse().unwrap_or(0);
    assert!(keys > 0, "the failed primary's slots held state (the promoted replica has {keys} keys)");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the run's JSON report")).expect("JSON");
    let failovers = report["failovers"].as_array().cloned().unwrap_or_default();
    assert_eq!(failovers.len(), 1, "one failover: {failovers:?}");
    assert_eq!(failovers[0]["vertex"], "nat", "{failovers:?}");
    assert_eq!(failovers[0]["beyond_replay"], 0, "{failovers:?}");
    assert_eq!(report["fault_tolerance"]["left_in_log"], 0, "{}", report["fault_tolerance"]);
    let n = |k: &str| report[k].as_u64().unwrap_or(u64::MAX);
    assert_eq!(n("packets_in"), 8_000, "{report}");
    assert_eq!(n("packets_in"), n("packets_out") + n("dropped_total"), "nothing lost, nothing twice: {report}");

    let v = sluice(&["verify", "--recorded", &record.to_string_lossy()]);
    let out = text(&v);
    assert_eq!(v.status.code(), Some(0), "{out}");
    assert!(out.contains("EQUIVALENT") && !out.contains("NOT EQUIVALENT"), "{out}");
}
