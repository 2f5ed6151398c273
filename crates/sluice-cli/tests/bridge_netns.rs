//! End to end over real Linux interfaces: chains run as `sluice run --bridge` between two veth
//! pairs, and a client namespace talks to a server namespace through them. A NAT → firewall
//! chain: ping and a 10 MB download arrive intact, from the NAT's address (AF_PACKET and
//! AF_XDP). A NAT → portscan → LB chain: 20 parallel downloads of 8 MB arrive intact while
//! `sluice ctl` crashes the NAT instance, scales the NAT and the portscan detector out and in
//! and moves flows (one root or several), or while the NAT and the LB crash together. Each run
//! is recorded, and the record is equivalent to the logical chain (`sluice verify
//! --recorded`). The same chain over several node processes: `bridge_spread_netns.rs`.
//!
//! Needs root (network namespaces, AF_PACKET), iproute2, iputils-ping, ethtool and python3;
//! `.ci/run` installs them. Missing privileges or tools fail the test with the reason. All
//! traffic stays inside the namespaces this test creates; a guard removes them.

mod common;

use common::bridge::*;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn nat_firewall_chain_bridges_ping_and_a_10mb_download() {
    nat_firewall_download("a", "afpacket");
}

/// The same through AF_XDP sockets: Sluice attaches its XDP program to both interfaces (veth
/// has native XDP) and removes it when it stops.
#[test]
fn nat_firewall_chain_over_af_xdp_bridges_ping_and_a_10mb_download() {
    nat_firewall_download("x", "xdp");
}

fn xdp_attached(dev: &str) -> bool {
    String::from_utf8_lossy(&sh(&["ip", "link", "show", "dev", dev]).stdout).contains("prog/xdp")
}

fn nat_firewall_download(tag: &str, io: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut wire = Wire::new(tag);
    let nc = wire.nc.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let chain = dir.path().join("nat-fw.yaml");
    std::fs::write(
        &chain,
        format!(
            "name: nat-firewall
vertices:
  nat:
    type: nat
    config: {{ external_ip: {NAT_IP}, internal: [\"{CLIENT_IP}/32\"] }}
  fw:
    type: firewall
    config:
      default: deny
      rules:
        - {{ action: allow, proto: icmp }}
        - {{ action: allow, proto: tcp, dst: {SERVER_IP}/32, dport: 8080 }}
edges:            # inside (first interface) to outside: NAT, then firewall
  - {{ from: input, to: nat }}
  - {{ from: nat, to: fw }}
  - {{ from: fw, to: output }}
reverse_edges:    # outside to inside: firewall, then NAT
  - {{ from: input, to: fw }}
  - {{ from: fw, to: nat }}
  - {{ from: nat, to: output }}
"
        ),
    )
    .expect("chain file");
    let report = dir.path().join("report.json");
    let record = dir.path().join("record");
    wire.start_sluice(&chain, (&report, &record), &["--duration", "90", "--workers", "1", "--io", io]);

    // 10 MB of random bytes served over HTTP from the server namespace.
    let data = random_bytes(10 * 1024 * 1024);
    let server_log = dir.path().join("server.log");
    serve_blob(&mut wire, dir.path(), &data, &server_log);

    // Ping through the chain (the first replies may wait for ARP and the bridge to start).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut pinged = false;
    while Instant::now() < deadline {
        let ok = Command::new("ip")
            .args(["netns", "exec", &nc, "ping", "-c", "3", "-i", "0.2", "-W", "1", SERVER_IP])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            pinged = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(pinged, "ping {SERVER_IP} from the client namespace never succeeded through the chain");

    // The download, with a bounded time.
    let got = dir.path().join("got.bin");
    let script = format!(
        "import urllib.request,sys\nfor i in range(30):\n    try:\n        urllib.request.urlretrieve('http://{SERVER_IP}:8080/blob.bin', sys.argv[1]); break\n    except Exception as e:\n        import time; time.sleep(0.5)\n"
    );
    let dl = Command::new("timeout")
        .args(["120", "ip", "netns", "exec", &nc, "python3", "-c", &script])
        .arg(&got)
        .output()
        .expect("run download");
    assert!(dl.status.success(), "download failed: {}", String::from_utf8_lossy(&dl.stderr));
    let received = std::fs::read(&got).expect("downloaded file");
    assert_eq!(received.len(), data.len(), "downloaded size differs");
    assert!(received == data, "downloaded bytes differ from the served file");

    // The server saw the NAT's address, not the client's.
    let log = std::fs::read_to_string(&server_log).unwrap_or_default();
    assert!(log.contains(NAT_IP), "server log does not show the NAT address {NAT_IP}: {log}");
    assert!(!log.contains(&format!("{CLIENT_IP} -")), "the client address leaked past the NAT: {log}");

    // A TCP port the firewall does not allow stays closed.
    let blocked = Command::new("ip")
        .args([
            "netns",
            "exec",
            &nc,
            "python3",
            "-c",
            &format!("import socket\ns=socket.socket(); s.settimeout(2)\ntry:\n  s.connect(('{SERVER_IP}', 9))\n  print('open')\nexcept Exception:\n  print('blocked')"),
        ])
        .output()
        .expect("probe");
    assert_eq!(String::from_utf8_lossy(&blocked.stdout).trim(), "blocked");

    let (m0, m1) = (wire.m0.clone(), wire.m1.clone());
    assert_eq!(xdp_attached(&m0) && xdp_attached(&m1), io == "xdp", "XDP programs only with --io xdp");
    // Stop sluice cleanly (SIGINT) and read its report.
    let (status, err) = stop(wire.guard.children.remove(0));
    assert!(status.success(), "sluice exited with {status}: {err}");
    assert!(!xdp_attached(&m0) && !xdp_attached(&m1), "the XDP programs must go with sluice");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(&report)).expect("report")).expect("report json");
    for m in [&m0, &m1] {
        let port = &json["ports"][m.as_str()];
        assert_eq!(port["io"], io, "{port}");
        assert!(port["rx"].as_u64().unwrap_or(0) > 100 && port["tx"].as_u64().unwrap_or(0) > 100, "{port}");
        assert_eq!(port["kernel_drops"], 0, "{port}");
    }
    let out = json["packets_out"].as_u64().unwrap_or(0);
    assert!(out > 7000, "only {out} packets crossed the chain; a 10 MB download needs thousands");
    let denied = json["dropped"]["fw: fw-acl-deny"].as_u64().unwrap_or(0);
    assert!(denied >= 1, "the firewall should have denied the probe to port 9: {}", json["dropped"]);
    // The live run, recorded, is equivalent to the logical chain over the same packets (both
    // directions: the record keeps each packet's port).
    assert_equivalent(&record, &[]);
}

#[test]
fn downloads_through_nat_portscan_lb_survive_a_crash_scaling_and_moves() {
    downloads_survive_a_crash_scaling_and_moves("1", "b");
}

/// The same with four roots: the input splits by source address, and with four roots the
/// client's packets and the server's answers enter at different roots (with two, both
/// addresses hash to root 0); every change takes effect at an entry time.
#[test]
fn downloads_survive_a_crash_scaling_and_moves_with_several_roots() {
    downloads_survive_a_crash_scaling_and_moves("4", "r");
}

/// The NAT and the LB crash together in one process while the downloads run. Each lies on the
/// other's replay path (the replay towards the LB passes the NAT's replacement, the reverse
/// replay towards the NAT passes the LB's), so neither replacement may wait for the other's
/// replay to end before it goes through its own: it goes through it in entry order as the
/// replay's earlier copies arrive (docs/faults.md, "Two instances failing together").
#[test]
fn downloads_survive_the_nat_and_the_lb_crashing_together() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut wire = Wire::new("t");
    let nc = wire.nc.clone();
    let server_mac = mac_of(&wire.ns, "s0");
    sh(&["ip", "netns", "exec", &nc, "ip", "neigh", "add", VIP, "lladdr", &server_mac, "dev", "c0"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let chain = nat_portscan_lb_chain(dir.path());
    let (report, record) = (dir.path().join("report.json"), dir.path().join("record"));
    // Both asked at the same packet, well into the transfer: both fail before either recovers.
    let at = FAULTS_AFTER_PACKETS * 3;
    let faults = common::schedule(
        dir.path(),
        "together.yaml",
        &format!(
            "events:\n  - at: {{ packet: {at} }}\n    crash: {{ vertex: nat, instance: 0 }}\n  - at: {{ packet: {at} }}\n    crash: {{ vertex: lb, instance: 0 }}\n"
        ),
    );
    let live =
        ["--duration", "120", "--workers", "2", "--fault-tolerance", "--faults", &faults, "--latency-window", "10"];
    wire.start_sluice(&chain, (&report, &record), &live);
    let downloads = start_downloads(&mut wire, dir.path(), 8);
    let finished = downloads.wait_with_output().expect("downloads");
    let said = String::from_utf8_lossy(&finished.stdout).into_owned() + &String::from_utf8_lossy(&finished.stderr);
    let (status, err) = stop(wire.guard.children.remove(0));
    assert_eq!(said.trim(), "ok", "downloads through the chain: {said}\n{err}");
    assert!(status.success(), "sluice exited with {status}: {err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("report json");
    let failovers = json["failovers"].as_array().cloned().unwrap_or_default();
    let failed: Vec<&str> = failovers.iter().filter_map(|f| f["vertex"].as_str()).collect();
    assert_eq!(failed, ["nat", "lb"], "{}", json["failovers"]);
    let replayed: Vec<u64> = failovers.iter().filter_map(|f| f["replayed"].as_u64()).collect();
    assert!(replayed.iter().all(|n| *n > 0), "each replacement got a replay: {}", json["failovers"]);
    kill_to_normal(&json);
    assert_equivalent(&record, &[]);
}

/// `roots` roots; `tag` names the namespaces.
fn downloads_survive_a_crash_scaling_and_moves(roots: &str, tag: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut wire = Wire::new(tag);
    let nc = wire.nc.clone();
    // The client reaches the VIP at the server's MAC: the LB in the wire sends it on there.
    let server_mac = mac_of(&wire.ns, "s0");
    sh(&["ip", "netns", "exec", &nc, "ip", "neigh", "add", VIP, "lladdr", &server_mac, "dev", "c0"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let chain = nat_portscan_lb_chain(dir.path());
    let report = dir.path().join("report.json");
    let record = dir.path().join("record");
    let live = [
        "--duration",
        "120",
        "--workers",
        "2",
        "--fault-tolerance",
        "--control",
        "0",
        "--control-token",
        common::CONTROL_TOKEN,
        "--roots",
        roots,
    ];
    wire.start_sluice(&chain, (&report, &record), &live);
    let (addr, _) = common::control_endpoint(wire.guard.children.first_mut().expect("sluice"));
    let ctl = |args: &[&str]| common::ctl(&addr, args);

    let downloads = start_downloads(&mut wire, dir.path(), 8);
    // While they run: crash the NAT, scale it and the portscan detector out, move flows,
    // scale both back in (each left alone caches its shared state again: with two NAT
    // instances every inbound packet reads the shared reverse mapping from the store).
    let pause = || std::thread::sleep(Duration::from_millis(300));
    wait_for_bridged_packets(&wire, 1000, Duration::from_secs(60));
    ctl(&["crash", "nat:0"]);
    pause();
    ctl(&["scale", "portscan+1"]);
    ctl(&["scale", "nat=2"]);
    pause();
    ctl(&["move", "nat:0>1"]);
    pause();
    ctl(&["scale", "portscan=1"]);
    ctl(&["scale", "nat=1"]);
    let listed = ctl(&["list"]);
    let finished = downloads.wait_with_output().expect("downloads");
    let said = String::from_utf8_lossy(&finished.stdout).into_owned() + &String::from_utf8_lossy(&finished.stderr);
    assert_eq!(said.trim(), "ok", "downloads through the chain: {said}\n{listed}");

    let (status, err) = stop(wire.guard.children.remove(0));
    assert!(status.success(), "sluice exited with {status}: {err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("report json");
    let failovers = json["failovers"].as_array().cloned().unwrap_or_default();
    assert_eq!(failovers.len(), 1, "{}", json["failovers"]);
    let kinds: Vec<String> = json["reconfigurations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(kinds, ["scale_out", "scale_out", "move", "scale_in", "scale_in"], "{}", json["reconfigurations"]);
    let out = json["packets_out"].as_u64().unwrap_or(0);
    assert!(out > 20_000, "only {out} packets crossed the chain; 20 downloads of 8 MB need many more");
    // The changes came while the downloads ran: traffic went on after the last one.
    let last = json["reconfigurations"][4]["at_packet"].as_u64().unwrap_or(u64::MAX);
    let crash = json["failovers"][0]["at_packet"].as_u64().unwrap_or(u64::MAX);
    assert!(crash < last && last + 1000 < out, "crash at {crash}, last change at {last}, {out} packets out");
    assert_equivalent(&record, &[]);
    if roots != "1" {
        // The client's packets and the server's answers were admitted by two roots (the
        // clock's top byte names its root; a few IPv6 neighbour discoveries go elsewhere).
        let rec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(record.join("record.json")).expect("record")).expect("json");
        let mut per_root = std::collections::BTreeMap::<u64, u64>::new();
        for c in rec["admitted"].as_array().into_iter().flatten().filter_map(|c| c.as_u64()) {
            *per_root.entry(c >> 56).or_default() += 1;
        }
        let busy = per_root.values().filter(|n| **n > 1000).count();
        assert!(busy >= 2, "packets admitted per root: {per_root:?}");
    }
}

/// `scripts/bench-bridge.sh` runs (one short repetition) and produces numbers for kernel
/// forwarding, the AF_PACKET bridge and the AF_XDP bridge: the smoke version of the benchmark
/// (no timing assertion).
#[test]
fn bridge_benchmark_smoke_produces_numbers_for_every_mode() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("bridge.json");
    let svg = dir.path().join("bridge.svg");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench-bridge.sh");
    let out = Command::new(script)
        .args(["1", "1"])
        .env("SLUICE", env!("CARGO_BIN_EXE_sluice"))
        .env("JSON", &json)
        .env("PLOT", &svg)
        .output()
        .expect("run scripts/bench-bridge.sh");
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench-bridge.sh failed: {said}");
    assert!(said.contains("ratio AF_XDP / AF_PACKET"), "{said}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    for mode in ["kernel", "afpacket", "xdp"] {
        let pps = v["median_peak_pps"][mode].as_f64().unwrap_or(0.0);
        assert!(pps > 1000.0, "{mode}: {pps} packets/s: {said}");
    }
    let rows = v["rows"].as_array().map_or(0, Vec::len);
    assert_eq!(rows, 5, "three peak runs and two at half the AF_XDP peak: {said}");
    let plot = std::fs::read_to_string(&svg).expect("the plot");
    assert!(plot.starts_with("<svg") && plot.contains("AF_XDP / AF_PACKET"), "{plot}");
}
