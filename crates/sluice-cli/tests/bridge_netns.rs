//! End to end over real Linux interfaces: a NAT → firewall chain runs as `sluice run --bridge`
//! between two veth pairs; a client namespace pings and downloads a 10 MB file from a server
//! namespace through it, and the file arrives intact, from the NAT's address. The run is
//! recorded, and the record is equivalent to the logical chain (`sluice verify --recorded`).
//!
//! Needs root (network namespaces, AF_PACKET), iproute2, iputils-ping, ethtool and python3;
//! `.ci/run` installs them. Missing privileges or tools fail the test with the reason. All
//! traffic stays inside the namespaces this test creates; a guard removes them.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const CLIENT_IP: &str = "10.203.0.1";
const SERVER_IP: &str = "10.203.0.2";
const NAT_IP: &str = "10.203.0.100";

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

fn mac_of(ns: &str, dev: &str) -> String {
    let out = sh(&["ip", "netns", "exec", ns, "cat", &format!("/sys/class/net/{dev}/address")]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn nat_firewall_chain_bridges_ping_and_a_10mb_download() {
    assert_eq!(
        // SAFETY-free check of the effective uid through /proc.
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0"))),
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
    let (nc, ns) = (format!("sluice-c-{id}"), format!("sluice-s-{id}"));
    let (m0, m1) = (format!("slm0{id}"), format!("slm1{id}"));
    let mut guard =
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
    // The server reaches the NAT's address at the client's MAC: the NAT sits in the wire.
    let client_mac = mac_of(&nc, "c0");
    sh(&["ip", "netns", "exec", &ns, "ip", "neigh", "add", NAT_IP, "lladdr", &client_mac, "dev", "s0"]);

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
    let sluice = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "--chain"])
        .arg(&chain)
        .args(["--bridge", &format!("{m0},{m1}"), "--duration", "90", "--workers", "1", "--json"])
        .arg(&report)
        .arg("--record")
        .arg(&record)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice");
    guard.children.push(sluice);

    // 10 MB of random bytes served over HTTP from the server namespace.
    let www = dir.path().join("www");
    std::fs::create_dir(&www).expect("www");
    let mut data = vec![0u8; 10 * 1024 * 1024];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut data)).expect("random bytes");
    std::fs::write(www.join("blob.bin"), &data).expect("blob");
    let server_log = dir.path().join("server.log");
    let server = Command::new("ip")
        .args(["netns", "exec", &ns, "python3", "-m", "http.server", "8080", "--bind", SERVER_IP, "--directory"])
        .arg(&www)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&server_log).expect("log"))
        .spawn()
        .expect("start http server");
    guard.children.push(server);

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

    // Stop sluice cleanly (SIGINT) and read its report.
    let mut sluice = guard.children.remove(0);
    let pid = sluice.id().to_string();
    sh(&["kill", "-INT", &pid]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = sluice.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "sluice did not stop after SIGINT");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    if let Some(mut e) = sluice.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "sluice exited with {status}: {err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(&report)).expect("report")).expect("report json");
    let out = json["packets_out"].as_u64().unwrap_or(0);
    assert!(out > 7000, "only {out} packets crossed the chain; a 10 MB download needs thousands");
    let denied = json["dropped"]["fw: fw-acl-deny"].as_u64().unwrap_or(0);
    assert!(denied >= 1, "the firewall should have denied the probe to port 9: {}", json["dropped"]);
    // The live run, recorded, is equivalent to the logical chain over the same packets (both
    // directions: the record keeps each packet's port).
    let verified = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("verify")
        .arg("--recorded")
        .arg(&record)
        .output()
        .expect("verify");
    let said = String::from_utf8_lossy(&verified.stdout).into_owned() + &String::from_utf8_lossy(&verified.stderr);
    assert!(verified.status.success(), "the recorded bridge run is not equivalent: {said}");
    assert!(said.contains("EQUIVALENT"), "{said}");
}
