//! Node processes of a chain spread over nodes (`sluice run --spread FILE --node NAME`), as
//! the spread tests start and read them.

use super::{repo, sluice_within};
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// A TCP port on loopback free now (for a node's control endpoint), as `127.0.0.1:PORT`.
pub fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").to_string()
}

/// Starts node `name` of a spread chain (not the root's): `sluice run ... --node NAME`.
pub fn start_node(chain: &str, spread: &Path, name: &str, json: &Path, extra: &[&str]) -> Node {
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(repo(""))
        .args(["run", "-c", chain, "--spread"])
        .arg(spread)
        .args(["--node", name, "-q", "--no-pin", "--json"])
        .arg(json)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a node");
    Node::reading(child)
}

/// A node process the test started, and what reads its stderr.
pub struct Node {
    /// The process.
    pub child: Child,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Node {
    /// `child`, its stderr (piped) read while it runs: a node that says much (RUST_LOG=trace)
    /// would stop on a full pipe.
    pub fn reading(mut child: Child) -> Node {
        let stderr = child.stderr.take().map(|e| {
            std::thread::spawn(move || {
                let mut said = String::new();
                let _ = BufReader::new(e).read_to_string(&mut said);
                said
            })
        });
        Node { child, stderr }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a node to end; its stderr and whether it succeeded.
pub fn node_end(mut node: Node, limit: Duration) -> (bool, String) {
    let status = super::ended_within(&mut node.child, limit);
    let err = node.stderr.take().and_then(|r| r.join().ok()).unwrap_or_default();
    (status.success(), err)
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("JSON report")).expect("JSON")
}

/// The root's node of the example chain over the demo trace: its output file is `out`.
pub fn root_node(spread: &Path, out: &Path, json_out: &Path, extra: &[&str]) -> Output {
    root_node_of("chains/example.yaml", spread, out, json_out, extra)
}

/// [`root_node`] of `chain`.
pub fn root_node_of(chain: &str, spread: &Path, out: &Path, json_out: &Path, extra: &[&str]) -> Output {
    let (spread_s, out_s, json_s) = (
        spread.to_string_lossy().into_owned(),
        out.to_string_lossy().into_owned(),
        json_out.to_string_lossy().into_owned(),
    );
    let mut args = vec![
        "run",
        "-c",
        chain,
        "-i",
        "traces/demo.pcap",
        "--spread",
        &spread_s,
        "--node",
        "a",
        "-w",
        "1",
        "-q",
        "--no-pin",
        "-o",
        &out_s,
        "--json",
        &json_s,
    ];
    args.extend_from_slice(extra);
    sluice_within(&args, Duration::from_secs(120)).expect("the root's node ended")
}

/// Checks a node's link report: nothing lost, malformed or misaddressed.
pub fn clean_link(report: &serde_json::Value, node: &str) -> serde_json::Value {
    let link = report["link"].clone();
    assert_eq!(link["node"], node, "{report}");
    for k in ["lost", "malformed", "misaddressed", "strangers"] {
        assert_eq!(link[k], 0, "{k} on node {node}: {link}");
    }
    link
}

/// Waits (up to 30 s) until instance 0 of `vertex` has counted packets on the control endpoint
/// at `addr`: traffic has reached it.
pub fn wait_for_packets_at(addr: &str, vertex: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = super::http(addr, "GET", "/api/v1/chain", Some(super::CONTROL_TOKEN), "");
        let counted = serde_json::from_str::<serde_json::Value>(&body).ok().and_then(|v| {
            let vs = v["vertices"].as_array().cloned().unwrap_or_default();
            vs.into_iter().find(|x| x["name"] == vertex).and_then(|x| x["instances"][0]["packets_in"].as_u64())
        });
        if code == 200 && counted.unwrap_or(0) > 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{vertex} at {addr} never counted packets: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The example chain with two NAT instances: packets of the two reach the portscan detector
/// in any order, so it takes them in chain-entry order (CHC R4).
pub fn two_nat_chain(dir: &Path) -> PathBuf {
    let example = std::fs::read_to_string(super::repo("chains/example.yaml")).expect("example chain");
    let chain = example.replacen("    type: nat\n", "    type: nat\n    instances: 2\n", 1);
    assert_ne!(chain, example, "the NAT's line is where it was");
    let path = dir.join("two-nats.yaml");
    std::fs::write(&path, chain).expect("chain file");
    path
}

/// The example chain's vertices (one NAT or two) that the root's node `a` may change live with
/// `place` (units away from a, `vertex` or `vertex/index`): those whole on a whose feeders are
/// whole on a too (docs/decisions.md, "Changes on the root's node").
pub fn changeable_on_a(place: &[(&str, &str)]) -> Vec<&'static str> {
    let whole_on_a = |v: &str| !place.iter().any(|(u, _)| *u == v || u.split('/').next() == Some(v));
    let fed_from_a = |v: &str| match v {
        "portscan" | "trojan" => whole_on_a("nat"),
        "lb" => whole_on_a("portscan"),
        _ => true,
    };
    ["nat", "portscan", "lb", "trojan"].into_iter().filter(|v| whole_on_a(v) && fed_from_a(v)).collect()
}
