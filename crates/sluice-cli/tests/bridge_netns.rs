//! End to end over real Linux interfaces: chains run as `sluice run --bridge` between two veth
//! pairs, and a client namespace talks to a server namespace through them. A NAT → firewall
//! chain: ping and a 10 MB download arrive intact, from the NAT's address. A NAT → portscan →
//! LB chain: 20 parallel downloads of 8 MB arrive intact while `sluice ctl` crashes the NAT instance,
//! scales the NAT and the portscan detector out and in and moves flows. Each run is recorded,
//! and the record is equivalent to the logical chain (`sluice verify --recorded`). The same
//! chain over two node processes (`--spread`, the NAT on the second): the downloads complete
//! while the NAT's node is SIGKILLed and failed over to the bridge's node; over three, with
//! state in a Redis Cluster, while a Redis primary is SIGKILLed, then the NAT's node and another
//! primary together; over three `sluice node --run` processes placed by controllers on etcd,
//! while the NAT's node and the leading controller are SIGKILLed together.
//!
//! Needs root (network namespaces, AF_PACKET), iproute2, iputils-ping, ethtool, python3 and
//! redis-server; `.ci/run` installs them. Missing privileges or tools fail the test with the reason. All
//! traffic stays inside the namespaces this test creates; a guard removes them.

mod common;

#[path = "../../sluice-redis/tests/support/cluster.rs"]
mod cluster;

use cluster::Cluster;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CLIENT_IP: &str = "10.203.0.1";
const SERVER_IP: &str = "10.203.0.2";
const NAT_IP: &str = "10.203.0.100";
/// The address the LB chain's clients connect to; the LB sends it to the server.
const VIP: &str = "10.203.0.50";

fn sh(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn tool_present(tool: &str, arg: &str) -> bool {
    Command::new(tool).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Removes namespaces, links and child processes when the test ends, pass or fail.
struct Cleanup {
    namespaces: Vec<String>,
    links: Vec<String>,
    children: Vec<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for l in &self.links {
            let _ = Command::new("ip").args(["link", "del", l]).stderr(Stdio::null()).status();
        }
        for n in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", n]).stderr(Stdio::null()).status();
        }
    }
}

fn offloads_off(ns: Option<&str>, dev: &str) {
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = ns {
        args.extend(["ip", "netns", "exec", ns]);
    }
    args.extend(["ethtool", "-K", dev, "gro", "off", "tso", "off", "gso", "off", "tx", "off"]);
    // Some veth drivers refuse one of the features; the others still take effect.
    let _ = Command::new(args[0]).args(&args[1..]).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// Two namespaces, client and server, each behind a veth pair whose other ends (`m0`, `m1`)
/// sluice bridges; the server reaches the NAT's address at the client's MAC (the NAT sits in
/// the wire).
struct Wire {
    guard: Cleanup,
    nc: String,
    ns: String,
    m0: String,
    m1: String,
}

/// The tests here take turns: each saturates the machine's two cores with a live bridge and
/// its downloads, and the other's timing is not what it measures.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Wire {
    fn new(tag: &str) -> Wire {
        assert_eq!(
            // SAFETY-free check of the effective uid through /proc.
            std::fs::read_to_string("/proc/self/status").ok().and_then(|s| s
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))),
            Some(true),
            "this test creates network namespaces and AF_PACKET sockets: run it as root"
        );
        for (tool, arg) in [("ip", "-V"), ("ping", "-V"), ("ethtool", "--version"), ("python3", "--version")] {
            assert!(
                tool_present(tool, arg),
                "`{tool}` is missing: apt-get install -y iproute2 iputils-ping ethtool python3"
            );
        }
        let id = std::process::id();
        let (nc, ns) = (format!("sluice-c{tag}-{id}"), format!("sluice-s{tag}-{id}"));
        let (m0, m1) = (format!("sl{tag}0{id}"), format!("sl{tag}1{id}"));
        let guard =
            Cleanup { namespaces: vec![nc.clone(), ns.clone()], links: vec![m0.clone(), m1.clone()], children: vec![] };
        sh(&["ip", "netns", "add", &nc]);
        sh(&["ip", "netns", "add", &ns]);
        sh(&["ip", "link", "add", &m0, "type", "veth", "peer", "name", "c0", "netns", &nc]);
        sh(&["ip", "link", "add", &m1, "type", "veth", "peer", "name", "s0", "netns", &ns]);
        for (n, ip) in [(&nc, CLIENT_IP), (&ns, SERVER_IP)] {
            let dev = if n == &nc { "c0" } else { "s0" };
            sh(&["ip", "netns", "exec", n, "ip", "addr", "add", &format!("{ip}/24"), "dev", dev]);
            sh(&["ip", "netns", "exec", n, "ip", "link", "set", dev, "up"]);
            sh(&["ip", "netns", "exec", n, "ip", "link", "set", "lo", "up"]);
            offloads_off(Some(n), dev);
        }
        for m in [&m0, &m1] {
            sh(&["ip", "link", "set", m, "up"]);
            offloads_off(None, m);
        }
        let client_mac = mac_of(&nc, "c0");
        sh(&["ip", "netns", "exec", &ns, "ip", "neigh", "add", NAT_IP, "lladdr", &client_mac, "dev", "s0"]);
        Wire { guard, nc, ns, m0, m1 }
    }

    /// Starts `sluice run --chain CHAIN --bridge m0,m1 --json REPORT --record RECORD EXTRA`.
    fn start_sluice(&mut self, chain: &Path, (report, record): (&Path, &Path), extra: &[&str]) {
        let sluice = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["run", "--chain"])
            .arg(chain)
            .args(["--bridge", &format!("{},{}", self.m0, self.m1), "--json"])
            .arg(report)
            .arg("--record")
            .arg(record)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sluice");
        self.guard.children.push(sluice);
    }
}

/// Serves `data` as `/blob.bin` over HTTP on port 8080 of the server namespace (python's
/// threaded server); its log goes to `log`.
fn serve_blob(wire: &mut Wire, dir: &Path, data: &[u8], log: &Path) {
    let www = dir.join("www");
    std::fs::create_dir(&www).expect("www");
    std::fs::write(www.join("blob.bin"), data).expect("blob");
    let server = Command::new("ip")
        .args(["netns", "exec", &wire.ns, "python3", "-m", "http.server", "8080", "--bind", SERVER_IP, "--directory"])
        .arg(&www)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("start http server");
    wire.guard.children.push(server);
}

/// `len` random bytes.
fn random_bytes(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut data)).expect("random bytes");
    data
}

/// Stops sluice (SIGINT, as an operator would) and waits: its exit status and stderr.
fn stop(sluice: Child) -> (std::process::ExitStatus, String) {
    let pid = sluice.id().to_string();
    sh(&["kill", "-INT", &pid]);
    ended(sluice, "sluice did not stop after SIGINT")
}

/// Waits up to 30 s for `sluice` to end (failing with `late` if it does not): its exit status
/// and stderr.
fn ended(mut sluice: Child, late: &str) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = sluice.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = sluice.kill();
            let mut err = String::new();
            if let Some(mut e) = sluice.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("{late}: {err}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    if let Some(mut e) = sluice.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (status, err)
}

/// `sluice verify --recorded DIR --part PART...` says the recorded run is equivalent.
fn assert_equivalent(record: &Path, parts: &[std::path::PathBuf]) {
    // The hosts answered what the chain sent: verify feeds the logical chain its own choices.
    let json = std::fs::read_to_string(record.join("record.json")).expect("record.json");
    assert!(json.contains("\"closed_loop\":true"), "a bridge's record is closed-loop");
    let mut verify = Command::new(env!("CARGO_BIN_EXE_sluice"));
    verify.arg("verify").arg("--recorded").arg(record);
    for p in parts {
        verify.arg("--part").arg(p);
    }
    let verified = verify.output().expect("verify");
    let said = String::from_utf8_lossy(&verified.stdout).into_owned() + &String::from_utf8_lossy(&verified.stderr);
    if !verified.status.success() {
        // Kept for a look: the temporary directory goes with the test.
        let kept = std::env::temp_dir().join(format!("sluice-failed-bridge-record-{}", std::process::id()));
        let copied = Command::new("cp").arg("-r").arg(record).arg(&kept).status().is_ok_and(|s| s.success());
        let at = if copied { format!(" (record kept in {})", kept.display()) } else { String::new() };
        panic!("the recorded bridge run is not equivalent{at}: {said}");
    }
    assert!(said.contains("EQUIVALENT"), "{said}");
}

fn mac_of(ns: &str, dev: &str) -> String {
    let out = sh(&["ip", "netns", "exec", ns, "cat", &format!("/sys/class/net/{dev}/address")]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

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

/// The NAT → portscan → LB chain over two node processes: the bridge, the root and the rest on
/// node a, the NAT on node b, state in a store a third process serves. b is SIGKILLed while
/// the downloads run; a finds it silent, replaces the NAT from the store and replays its log
/// to it, and every download completes intact.
#[test]
fn downloads_survive_the_nat_node_killed_mid_transfer() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = common::served_store();
    let run = spread_downloads(("k", Placing::File("{nat: b}")), (&store.url, 8), |pid| {
        sh(&["kill", "-KILL", &pid("b")]);
    });
    assert_eq!(run.failed_over, ["nat"], "{}", run.json["failovers"]);
    // The NAT's node died with its part of the record; its replacement on the root's node
    // redid what the log held, and the NAT's state is in the store the root's node reads.
    assert_equivalent(&run.records[0], &run.records[1..]);
}

/// The same chain over three node processes, the NAT and the LB on b, the portscan detector
/// on c: b is SIGKILLed mid-transfer and the root's node replaces both, each on the other's
/// replay path (see `downloads_survive_the_nat_and_the_lb_crashing_together`).
#[test]
fn downloads_survive_the_node_of_the_nat_and_the_lb_killed_mid_transfer() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = common::served_store();
    let run = spread_downloads(("w", Placing::File("{nat: b, lb: b, portscan: c}")), (&store.url, 8), |pid| {
        sh(&["kill", "-KILL", &pid("b")]);
    });
    assert_eq!(run.failed_over, ["nat", "lb"], "{}", run.json["failovers"]);
    assert_equivalent(&run.records[0], &run.records[1..]);
}

/// The same chain on three `sluice node --run` processes that two `sluice controller`s on
/// etcd placed (the root and the bridge on a, the NFs on b and c: the NAT shares its node with
/// another NF), state in a served store. While the downloads run, the node hosting the NAT and
/// the leading controller are SIGKILLed together: a fails over the NAT and the NF next to it,
/// the other controller takes over, and every download completes intact; the record, with the
/// other node's part and the killed node's journal, verifies.
#[test]
fn downloads_survive_the_nat_node_and_the_leading_controller_killed_on_placed_nodes() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let store = common::served_store();
    let run = spread_downloads(("h", Placing::Controllers), (&store.url, 8), |pid| {
        sh(&["kill", "-KILL", &pid("nat"), &pid("leader")]);
    });
    assert!(run.on_victim.len() >= 2, "the NAT's node held the NAT alone: {:?}", run.on_victim);
    let mut failed_over = run.failed_over.clone();
    failed_over.sort_by_key(|v| ["nat", "portscan", "lb"].iter().position(|w| w == v));
    assert_eq!(failed_over, run.on_victim, "{}", run.json["failovers"]);
    assert_equivalent(&run.records[0], &run.records[1..]);
}

/// The same chain over three node processes (the NAT on b, the LB on c), state in a Redis
/// Cluster of three primaries with a replica each (`replicas=1`: a write is acknowledged once
/// a replica has it). While the downloads run: a Redis primary is SIGKILLed alone (its replica
/// takes over, the dead one comes back as a replica); then the NAT's node and another primary
/// are SIGKILLed together — the correlated failure one store cannot recover
/// (docs/correctness.md), recovered here because the replica had every write the NAT's
/// replacement needs. Every download completes intact and the record, with c's part and b's
/// journal, verifies.
#[test]
fn downloads_survive_redis_primaries_and_the_nat_node_killed_mid_transfer() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let mut redis = Cluster::start(&dir.path().join("redis"), REDIS_PORTS);
    let store = format!("redis+cluster://{}?prefix=netns&replicas=1", redis.seeds());
    let mut promoted = Vec::new();
    // Downloads of 1 MB: NF state in Redis is far slower than in the embedded store (issue 14;
    // 250–420 packets a second through this chain here), and 2 MB took 110–150 s of the
    // downloads' 150.
    let run = spread_downloads(("r", Placing::File("{nat: b, lb: c}")), (&store, 1), |pid| {
        let first = redis.a_primary();
        let killed = Instant::now();
        redis.kill(first);
        promoted.push(redis.wait_promoted(first, Duration::from_secs(30)));
        eprintln!("a replica took over {:.1} s after the first primary was killed", killed.elapsed().as_secs_f64());
        redis.restart(first);
        cluster::wait_until("the killed primary back as a replica", Duration::from_secs(30), || {
            cluster::cli(first, &["info", "replication"]).contains("master_link_status:up")
        });
        // Together, as when a rack loses power.
        let second = redis.a_primary();
        sh(&["kill", "-KILL", &pid("b")]);
        redis.kill(second);
        promoted.push(redis.wait_promoted(second, Duration::from_secs(30)));
        redis.restart(second);
    });
    assert_eq!(promoted.len(), 2, "both primaries were replaced by their replicas");
    assert_eq!(run.failed_over, ["nat"], "{}", run.json["failovers"]);
    let f = &run.json["failovers"][0];
    eprintln!("the NAT's node: replacement serving {} ms after the root asked", f["recovery_ms"]);
    eprintln!(
        "{} packets out in {:.0} s, latency {}",
        run.json["packets_out"],
        run.json["elapsed_s"].as_f64().unwrap_or(0.0),
        run.json["latency_us"]
    );
    assert_equivalent(&run.records[0], &run.records[1..]);
}

/// Ports of the Redis Cluster [`downloads_survive_redis_primaries_and_the_nat_node_killed_mid_transfer`] starts.
const REDIS_PORTS: [u16; 6] = [7440, 7441, 7442, 7443, 7444, 7445];

/// What [`spread_downloads`] leaves for its test to check.
struct SpreadRun {
    /// The root node's JSON report.
    json: serde_json::Value,
    /// The vertices the root's node failed over, in order.
    failed_over: Vec<String>,
    /// The vertices placed on the killed node, in chain order.
    on_victim: Vec<String>,
    /// The root node's record, then the other nodes' (a part, or a killed node's journal).
    records: Vec<std::path::PathBuf>,
    _dir: tempfile::TempDir,
}

/// How the chain's instances get to their nodes.
enum Placing<'a> {
    /// A spread file every `sluice run --spread` is given, with this `place` (a YAML map,
    /// vertex: node); the instances it does not name stay with the root on node a.
    File(&'a str),
    /// `sluice node --run` processes a (roles `root,nf`) and b and c (`nf`) on an etcd
    /// started here, placed by two `sluice controller`s; the NAT must land on b or c.
    Controllers,
}

/// Runs the NAT → portscan → LB chain as node processes bridging namespaces `tag`: node a has
/// the root and the bridge, b and c instances as `placing` puts them. State at `store`, fault
/// tolerance, every node records. Starts 20 parallel downloads of `mb` MB, waits until the
/// bridge has sent [`FAULTS_AFTER_PACKETS`], calls `faults` with a way to get a process's pid
/// (a node's by name; with controllers, `nat` is the NAT's node and `leader` the leading
/// controller), and checks that every download completed intact, that the nodes that lived
/// ended well, that the NAT's node (b with a file) failed and nothing was lost between nodes,
/// and that the first failover came mid-transfer.
fn spread_downloads(
    (tag, placing): (&str, Placing),
    (store, mb): (&str, usize),
    faults: impl FnOnce(&dyn Fn(&str) -> String),
) -> SpreadRun {
    let mut wire = Wire::new(tag);
    let server_mac = mac_of(&wire.ns, "s0");
    sh(&["ip", "netns", "exec", &wire.nc, "ip", "neigh", "add", VIP, "lladdr", &server_mac, "dev", "c0"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let chain = nat_portscan_lb_chain(dir.path());
    let record = |n: &str| dir.path().join(format!("record-{n}"));
    let report = dir.path().join("report.json");
    let report_s = report.to_string_lossy().into_owned();
    // A window the link's socket buffers hold whole (each datagram lost on the way stalls
    // the link until it is resent).
    let bridge =
        format!("--bridge {},{} --window 1024 --duration 150 --latency-window 10 --json {report_s}", wire.m0, wire.m1);
    let engine = |name: &str| {
        format!(
            "--chain {} --fault-tolerance --store {store} --workers 1 -q --record {}",
            chain.display(),
            record(name).display()
        )
    };
    let mut pids: Vec<(String, String)> = Vec::new();
    let mut others = Vec::new();
    let names: Vec<String>;
    let mut _cluster = None;
    // The node whose failure the checks expect, and what it holds (with a placement file, the
    // caller knows).
    let mut victim = "b".to_string();
    let mut on_victim = Vec::new();
    // The nodes' stdout, read until the end (a node whose reader went away loses its lines).
    let mut _node_lines = Vec::new();
    match placing {
        Placing::File(place) => {
            names = ["b", "c"].iter().filter(|n| place.contains(&format!(": {n}"))).map(|n| n.to_string()).collect();
            let ports: Vec<std::net::UdpSocket> =
                (0..=names.len()).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("a free port")).collect();
            let addr = |i: usize| ports[i].local_addr().expect("addr").to_string();
            let nodes: Vec<String> = std::iter::once("a".to_string())
                .chain(names.iter().cloned())
                .enumerate()
                .map(|(i, n)| format!("{n}: {}", addr(i)))
                .collect();
            let spread = dir.path().join("spread.yaml");
            let yaml = format!("nodes: {{{}}}\nroot: a\nsilence_ms: 300\nplace: {place}\n", nodes.join(", "));
            std::fs::write(&spread, yaml).expect("spread file");
            drop(ports);
            let node = |name: &str, extra: &str| {
                Command::new(env!("CARGO_BIN_EXE_sluice"))
                    .arg("run")
                    .args(engine(name).split_whitespace())
                    .arg("--spread")
                    .arg(&spread)
                    .args(["--node", name])
                    .args(extra.split_whitespace())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start a node")
            };
            for n in &names {
                let child = node(n, "");
                pids.push((n.clone(), child.id().to_string()));
                if n == "b" {
                    wire.guard.children.push(child);
                } else {
                    others.push(child);
                }
            }
            wire.guard.children.insert(0, node("a", &bridge));
        }
        Placing::Controllers => {
            names = vec!["b".into(), "c".into()];
            let etcd = sluice_cluster::LocalEtcd::start(&dir.path().join("etcd")).unwrap_or_else(|e| panic!("{e}"));
            let endpoint = etcd.endpoint().to_string();
            let cluster = ["--etcd", &endpoint, "--cluster", "netns", "--ttl", "2"];
            let mut lines = Vec::new();
            let mut started = Vec::new();
            // The root's node hosts the root only: the NAT's node holds another NF too (the
            // LB, whose replay passes through the NAT's replacement and the other way round).
            for (name, roles) in [("a", "root"), ("b", "nf"), ("c", "nf")] {
                let port = std::net::UdpSocket::bind("127.0.0.1:0").expect("a free port");
                let addr = port.local_addr().expect("addr").to_string();
                drop(port);
                let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
                    .args(["node", "--id", name, "--addr", &addr, "--roles", roles, "--silence-ms", "300"])
                    .args(["--settle-ms", "500"])
                    .args(cluster)
                    .arg(format!("--run={}", engine(name)))
                    .arg(format!("--root-run={bridge}"))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start a node");
                lines.push(common::json_lines(child.stdout.take().expect("stdout")));
                pids.push((name.to_string(), child.id().to_string()));
                if name == "a" {
                    wire.guard.children.insert(0, child);
                } else {
                    started.push((name, child));
                }
            }
            // Every node registered before the controllers place (a node joining later gets
            // nothing of a placement already made).
            for l in &lines {
                next_line(l, "joined");
            }
            for name in ["c1", "c2"] {
                let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
                    .args(["controller", "--chain"])
                    .arg(&chain)
                    .args(["--name", name])
                    .args(cluster)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start a controller");
                pids.push((name.to_string(), child.id().to_string()));
                wire.guard.children.push(child);
            }
            let spreads: Vec<serde_json::Value> = lines.iter().map(|l| next_line(l, "run")["spread"].clone()).collect();
            assert!(spreads.iter().all(|s| *s == spreads[0]), "the nodes run different spreads: {spreads:?}");
            victim = spreads[0]["place"]["nat/0"].as_str().unwrap_or("a").to_string();
            assert_ne!(victim, "a", "the controller put the NAT away from the root's node: {}", spreads[0]);
            on_victim = ["nat", "portscan", "lb"]
                .into_iter()
                .filter(|v| spreads[0]["place"][format!("{v}/0")] == victim.as_str())
                .map(String::from)
                .collect();
            for (name, child) in started {
                if name == victim {
                    pids.push(("nat".into(), child.id().to_string()));
                    wire.guard.children.push(child);
                } else {
                    others.push(child);
                }
            }
            let client = etcd.client().expect("etcd client");
            let leader = sluice_cluster::leader(&client, "netns", "controller").ok().flatten().expect("a leader");
            let leader_pid = pids.iter().find(|(n, _)| *n == leader).map(|(_, p)| p.clone()).unwrap_or_default();
            pids.push(("leader".into(), leader_pid));
            _cluster = Some(etcd);
            _node_lines = lines;
        }
    }
    let downloads = start_downloads(&mut wire, dir.path(), mb);
    let pid = |n: &str| pids.iter().find(|(m, _)| m == n).map_or_else(String::new, |(_, p)| p.clone());
    // By traffic, not by the clock: on a busy machine the nodes and the downloads may take
    // seconds to get going, and a fault timed by the clock then came before the transfer did.
    wait_for_bridged_packets(&wire, FAULTS_AFTER_PACKETS, Duration::from_secs(60));
    faults(&pid);
    let finished = downloads.wait_with_output().expect("downloads");
    let said = String::from_utf8_lossy(&finished.stdout).into_owned() + &String::from_utf8_lossy(&finished.stderr);
    let (status, err) = stop(wire.guard.children.remove(0));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default()).unwrap_or_default();
    let told = |k: &str| format!("{k}: {}", json[k]);
    let summary =
        ["elapsed_s", "packets_in", "packets_out", "dropped", "latency_us", "failovers", "checkpoints", "link"]
            .map(told)
            .join("\n");
    assert_eq!(
        said.trim(),
        "ok",
        "downloads through the chain over {} nodes: {said}\nnode a's report:\n{summary}\nnode a: {err}",
        names.len() + 1
    );
    assert!(status.success(), "node a exited with {status}: {err}");
    for other in others {
        let (status, err) = ended(other, "a surviving node did not end with the run");
        assert!(status.success(), "a surviving node exited with {status}: {err}");
    }
    assert!(json.is_object(), "node a wrote no JSON report: {err}");
    assert_eq!(json["link"]["failed_nodes"], serde_json::json!([victim]), "{}", json["link"]);
    assert_eq!(json["link"]["lost"], 0, "{}", json["link"]);
    let failed_over = json["failovers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["vertex"].as_str().map(String::from))
        .collect();
    let out = json["packets_out"].as_u64().unwrap_or(0);
    let at = json["failovers"][0]["at_packet"].as_u64().unwrap_or(u64::MAX);
    // Mid-transfer: a quarter of the traffic or more came after it.
    assert!(at > 1000 && at < out - out / 4, "the NAT's node failed at packet {at} of {out} out: not mid-transfer");
    kill_to_normal(&json);
    let records = std::iter::once("a").chain(names.iter().map(String::as_str)).map(record).collect();
    SpreadRun { json, failed_over, on_victim, records, _dir: dir }
}

/// Reports, per failover in a run's JSON report (run with `--latency-window`), the time from
/// the failure (the kill: the node last heard from, or the crash asked) until latency was
/// back to normal, or that it was not within the run. Not asserted: the TCP transfers keep
/// this closed-loop chain saturated, its p99 per 10 ms window moving between 5 and 25 ms
/// with the transfers' windows (debug build), and the crash comes while they still ramp up;
/// five windows in a row within 20 µs of the p99 before the failure then come only as the
/// transfers end, if at all — a measure of TCP, not of the recovery (docs/decisions.md,
/// "Latency back to normal in the bridge tests"). Asserted: the failure and the recovery
/// were timed. The open-loop measure is `sluice bench-store --parts failover`.
fn kill_to_normal(json: &serde_json::Value) {
    for f in json["failovers"].as_array().into_iter().flatten() {
        let vertex = f["vertex"].as_str().unwrap_or("?");
        let ms = |k: &str| f[k].as_f64();
        assert!(
            ms("failed_ms").is_some() && ms("recovery_ms").is_some_and(|r| r > 0.0),
            "the failover of {vertex} was not timed: {f}"
        );
        let normal = ms("latency_normal_ms")
            .map_or_else(|| "not within the run".to_string(), |n| format!("{n:.1} ms after the failure"));
        eprintln!(
            "failover of {vertex}: failed {:.1} ms into the run, serving again {:.1} ms after the crash was asked, latency back to normal: {normal}",
            ms("failed_ms").unwrap_or_default(),
            ms("recovery_ms").unwrap_or_default(),
        );
    }
}

/// The next line of a node's stdout whose event is `event`, within 30 s.
fn next_line(lines: &std::sync::mpsc::Receiver<serde_json::Value>, event: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = lines.recv_timeout(left).unwrap_or_else(|e| panic!("no `{event}` line from a node: {e}"));
        if v["event"] == event {
            return v;
        }
    }
}

/// How many packets the bridge has sent before [`spread_downloads`] injects its faults: well
/// into the transfer (the check wants the first failover past packet 1,000), far from its end.
const FAULTS_AFTER_PACKETS: u64 = 2500;

/// Waits until sluice has sent `packets` packets out of the bridged links (their transmit
/// counters, in this namespace), or fails the test after `limit`.
fn wait_for_bridged_packets(wire: &Wire, packets: u64, limit: Duration) {
    let sent = |dev: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{dev}/statistics/tx_packets"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let start = Instant::now();
    let mut seen = 0;
    while start.elapsed() < limit {
        seen = sent(&wire.m0) + sent(&wire.m1);
        if seen >= packets {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the bridge sent {seen} packets in {limit:?}, not the {packets} the faults wait for");
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

/// The NAT → portscan → LB chain between the client and the server (both directions), in
/// `dir`.
fn nat_portscan_lb_chain(dir: &Path) -> std::path::PathBuf {
    let chain = dir.join("nat-portscan-lb.yaml");
    std::fs::write(
        &chain,
        format!(
            "name: nat-portscan-lb
vertices:
  nat:
    type: nat
    config: {{ external_ip: {NAT_IP}, internal: [\"{CLIENT_IP}/32\"] }}
  portscan:
    type: portscan
  lb:
    type: lb
    config: {{ vips: [\"{VIP}:8080\"], backends: [\"{SERVER_IP}:8080\"] }}
edges:
  - {{ from: input, to: nat }}
  - {{ from: nat, to: portscan }}
  - {{ from: portscan, to: lb }}
  - {{ from: lb, to: output }}
reverse_edges:
  - {{ from: input, to: lb }}
  - {{ from: lb, to: portscan }}
  - {{ from: portscan, to: nat }}
  - {{ from: nat, to: output }}
"
        ),
    )
    .expect("chain file");
    chain
}

/// Serves a random file of `mb` MB from the server namespace and starts 20 parallel downloads of it
/// from the client namespace (each retried while the bridge starts); the child prints `ok`
/// when every download arrived with the file's SHA-256.
fn start_downloads(wire: &mut Wire, dir: &Path, mb: usize) -> Child {
    let data = random_bytes(mb * 1024 * 1024);
    serve_blob(wire, dir, &data, &dir.join("server.log"));
    // 20 downloads in parallel (each retried while the bridge starts), each file checked.
    let script = format!(
        "import urllib.request,sys,threading,hashlib,time
want=sys.argv[1]
res=[None]*20
def get(i):
    for _ in range(60):
        try:
            b=urllib.request.urlopen('http://{VIP}:8080/blob.bin', timeout=30).read()
            res[i]=hashlib.sha256(b).hexdigest(); return
        except Exception as e:
            res[i]=repr(e); time.sleep(0.5)
ts=[threading.Thread(target=get,args=(i,)) for i in range(20)]
[t.start() for t in ts]
[t.join() for t in ts]
bad=[r for r in res if r!=want]
print('ok' if not bad else 'bad: %r' % bad)
"
    );
    let want = sha256_hex(&data);
    Command::new("timeout")
        .args(["150", "ip", "netns", "exec", &wire.nc, "python3", "-c", &script, &want])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start downloads")
}

/// SHA-256 of `data` as hex, by `sha256sum` (coreutils).
fn sha256_hex(data: &[u8]) -> String {
    use std::io::Write;
    let mut c = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("sha256sum");
    c.stdin.take().expect("stdin").write_all(data).expect("write");
    let o = c.wait_with_output().expect("sha256sum");
    String::from_utf8_lossy(&o.stdout).split_whitespace().next().unwrap_or_default().to_string()
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
