//! `scripts/cluster-netns.sh`, the walk-through of docs/deploy.md: etcd, a served store and a
//! controller on a bridge, three `sluice node` processes each in its own network namespace.
//! The nodes register over the bridge, pass their store check, get the chain's units and run
//! the chain together over the bridge; a node without the root SIGKILLed mid-run is failed over
//! by the root's node, whose run goes on, and has its units re-placed on the others; `down`
//! leaves no namespace, link or process behind. Needs root (network namespaces), iproute2 and etcd (scripts/test-all.sh
//! installs them).

mod common;

use common::{http, repo};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn script(state: &str, args: &[&str]) -> Output {
    Command::new(repo("scripts/cluster-netns.sh"))
        .args(args)
        .env("SLUICE", env!("CARGO_BIN_EXE_sluice"))
        .env("STATE", state)
        .env("CLUSTER", "netns-test")
        .output()
        .expect("run scripts/cluster-netns.sh")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// The cluster's status as JSON.
fn status(state: &str) -> serde_json::Value {
    let o = script(state, &["status", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

/// Node id → its units, of the live nodes.
fn units(s: &serde_json::Value) -> Vec<(String, usize)> {
    let nodes = s["nodes"].as_array().cloned().unwrap_or_default();
    nodes
        .iter()
        .map(|n| (n["id"].as_str().unwrap_or_default().to_string(), n["units"].as_array().map_or(0, Vec::len)))
        .collect()
}

/// The nodes' and the controller's logs, for a failure's message.
fn logs(state: &str) -> String {
    let mut all = String::new();
    for name in ["controller", "node1", "node2", "node3"] {
        let text = std::fs::read_to_string(format!("{state}/{name}.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        all += &format!("\n--- {name}.log (last lines)\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    }
    all
}

/// Tears the cluster down even when the test fails.
struct Down<'a>(&'a str);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = script(self.0, &["down"]);
    }
}

#[test]
fn three_nodes_in_namespaces_get_the_chain_and_survive_one_dying() {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")));
    assert_eq!(root, Some(true), "this test creates network namespaces: run it as root");
    let state = std::env::temp_dir().join(format!("sluice-cluster-netns-{}", std::process::id()));
    let state = state.to_string_lossy().into_owned();
    let down = Down(&state);
    let o = script(&state, &["up", "--nodes", "3", "--chain", "chains/example.yaml"]);
    assert!(o.status.success(), "up: {}", text(&o));
    let token = std::fs::read_to_string(format!("{state}/store.token")).expect("token");

    // Every unit of the chain (one root, four vertices of one instance) placed on live nodes.
    let s = status(&state);
    let placed = |s: &serde_json::Value| units(s).iter().map(|(_, n)| n).sum::<usize>();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut s = s;
    while placed(&s) < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        s = status(&state);
    }
    assert_eq!(units(&s).len(), 3, "{s}");
    assert_eq!(placed(&s), 5, "{s}");

    // Each node reached the served store across the bridge, from its namespace.
    for i in 1..=3 {
        let (code, body) = http(&format!("10.77.0.{}:9480", 10 + i), "GET", "/metrics", Some(&token), "");
        assert_eq!(code, 200, "node{i}: {body}");
        // Whole sample lines: these gauges' HELP texts start "1 while ...".
        let says = |sample: &str| body.lines().any(|l| l == sample);
        assert!(says("sluice_node_store_up 1"), "node{i}: {body}");
        assert!(says("sluice_node_registered 1"), "node{i}: {body}");
    }
    let (code, body) = http("127.0.0.1:9479", "GET", "/metrics", Some(&token), "");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("sluice_store_server_refused_total 0"), "{body}");

    // Every node with units runs its part of the chain.
    let running = |i: usize| {
        let (code, body) = http(&format!("10.77.0.{}:9480", 10 + i), "GET", "/metrics", Some(&token), "");
        code == 200 && body.lines().any(|l| l == "sluice_node_running 1")
    };
    let hosts: Vec<usize> = units(&s)
        .iter()
        .filter(|(_, n)| *n > 0)
        .filter_map(|(id, _)| id.trim_start_matches("node").parse().ok())
        .collect();
    assert!(hosts.len() >= 2, "the chain is placed on one node: {s}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !hosts.iter().all(|i| running(*i)) {
        assert!(Instant::now() < deadline, "the nodes did not all start the chain: {}", logs(&state));
        std::thread::sleep(Duration::from_millis(200));
    }

    // SIGKILL a node that hosts NFs but not the root: the root's node fails its instances
    // over and its run goes on; after its lease (2 s) the controller re-places its units.
    let holds_root =
        |n: &serde_json::Value| n["units"].as_array().into_iter().flatten().any(|u| u.get("root").is_some());
    let nodes = s["nodes"].as_array().cloned().unwrap_or_default();
    let root_node =
        nodes.iter().find(|n| holds_root(n)).and_then(|n| n["id"].as_str()).expect("the root's node").to_string();
    let (busy, _) = units(&s).into_iter().find(|(id, n)| *n > 0 && *id != root_node).expect("a node with NFs only");
    let index = busy.trim_start_matches("node").to_string();
    let o = script(&state, &["kill-node", &index]);
    assert!(o.status.success(), "{}", text(&o));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(&state);
        let live = units(&s);
        if live.len() == 2 && placed(&s) == 5 && live.iter().all(|(id, _)| *id != busy) {
            break;
        }
        assert!(Instant::now() < deadline, "{busy}'s units were not re-placed: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let root_log = format!("{state}/{root_node}.log");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&root_log).unwrap_or_default().contains("a node failed") {
        assert!(Instant::now() < deadline, "the root's node did not fail {busy} over: {}", logs(&state));
        std::thread::sleep(Duration::from_millis(200));
    }
    let root_index: usize = root_node.trim_start_matches("node").parse().expect("node index");
    assert!(running(root_index), "the root's node stopped running the chain: {}", logs(&state));

    drop(down);
    let ns = Command::new("ip").args(["netns", "list"]).output().expect("ip netns");
    assert!(!String::from_utf8_lossy(&ns.stdout).contains("sl-node"), "namespaces left behind");
    let br = Command::new("ip").args(["link", "show", "slbr0"]).output().expect("ip link");
    assert!(!br.status.success(), "the bridge was left behind");
    assert!(!std::path::Path::new(&state).exists(), "state left behind");
}
