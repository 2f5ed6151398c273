//! `sluice controller`, `sluice node` and `sluice cluster` as real processes on a real etcd
//! (installed by `scripts/test-all.sh`; one member, and three for the failover test): nodes join
//! and get the chain's units, an etcd member dies and everyone carries on with the others, a
//! node killed with SIGKILL has its units placed on the others once its lease expires, a node
//! stopped with SIGTERM leaves at once, when the leading controller is killed the other one
//! takes over, and a drained node gives its units away.

use sluice_cluster::{leader, stored_placement, Etcd, LocalEtcd, Unit};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn sluice(endpoint: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    c.args(args).args(["--etcd", endpoint, "--cluster", "cli", "--ttl", "2"]);
    c
}

/// A node process, and its stdout lines as they come.
fn node(endpoint: &str, id: &str) -> (Proc, mpsc::Receiver<serde_json::Value>) {
    let mut child =
        sluice(endpoint, &["node", "--id", id]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("node");
    let rx = common::json_lines(child.stdout.take().expect("stdout"));
    (Proc(child), rx)
}

fn controller(endpoint: &str, name: &str) -> Proc {
    let child = sluice(endpoint, &["controller", "--chain", "chains/example.yaml", "--name", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("controller");
    Proc(child)
}

/// Waits up to 15 s for `cond`.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The next line of `rx` whose event is `event`, within 15 s.
fn next_event(rx: &mpsc::Receiver<serde_json::Value>, event: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = rx.recv_timeout(left).unwrap_or_else(|e| panic!("no `{event}` line: {e}"));
        if v["event"] == event {
            return v;
        }
    }
}

fn units(v: &serde_json::Value) -> Vec<Unit> {
    serde_json::from_value(v["units"].clone()).expect("units")
}

fn nodes_holding(etcd: &Etcd) -> Vec<String> {
    let mut n: Vec<String> = stored_placement(etcd, "cli").expect("placement").into_values().collect();
    n.sort();
    n.dedup();
    n
}

/// The example chain's five units (one root, four single-instance vertices).
const UNITS: usize = 5;

/// On a three-member etcd, every process given all three endpoints.
#[test]
fn nodes_follow_the_controller_through_a_killed_etcd_member_node_and_leader() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut members = LocalEtcd::start_cluster(dir.path(), 3).unwrap_or_else(|e| panic!("{e}"));
    let endpoint = LocalEtcd::endpoints(&members);
    let etcd = Etcd::new(&endpoint, Duration::from_secs(3)).expect("client");

    let (a, a_out) = node(&endpoint, "a");
    let (mut b, b_out) = node(&endpoint, "b");
    assert_eq!(next_event(&a_out, "joined")["node"], "a");
    assert_eq!(next_event(&b_out, "joined")["node"], "b");
    let _c1 = controller(&endpoint, "c1");
    eventually("c1 leads", || leader(&etcd, "cli", "controller").ok().flatten().as_deref() == Some("c1"));
    // Both nodes are told their share, and together they hold the whole chain.
    let mut got_a = units(&next_event(&a_out, "assignment"));
    while got_a.is_empty() {
        got_a = units(&next_event(&a_out, "assignment"));
    }
    let mut got_b = units(&next_event(&b_out, "assignment"));
    while got_b.is_empty() {
        got_b = units(&next_event(&b_out, "assignment"));
    }
    assert_eq!(got_a.len() + got_b.len(), UNITS, "a: {got_a:?}, b: {got_b:?}");
    assert!(got_a.iter().all(|u| !got_b.contains(u)), "a unit placed twice: {got_a:?} {got_b:?}");

    // The member every process asks first dies; the rest keep a quorum.
    members[0].kill();
    std::thread::sleep(Duration::from_secs(2));
    // SIGKILL b: once its lease expires, a is told it holds everything.
    b.0.kill().expect("kill b");
    let killed = Instant::now();
    let mut now_a = units(&next_event(&a_out, "assignment"));
    while now_a.len() < UNITS {
        now_a = units(&next_event(&a_out, "assignment"));
    }
    assert!(killed.elapsed() < Duration::from_secs(10), "took {:?} (TTL 2 s)", killed.elapsed());
    assert!(got_a.iter().all(|u| now_a.contains(u)), "what a held stayed: {got_a:?} -> {now_a:?}");
    // (The controller writes a's new list before it deletes b's.)
    eventually("only a holds units", || nodes_holding(&etcd) == ["a"]);

    // A second controller waits; killing the leader hands the cluster to it, which then acts:
    // a new node c and a departing a (SIGTERM: it leaves at once) leave everything on c.
    let _c2 = controller(&endpoint, "c2");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(leader(&etcd, "cli", "controller").expect("leader").as_deref(), Some("c1"));
    drop(_c1);
    eventually("c2 leads", || leader(&etcd, "cli", "controller").ok().flatten().as_deref() == Some("c2"));
    let (_c, c_out) = node(&endpoint, "c");
    next_event(&c_out, "joined");
    let term = Command::new("kill").args(["-TERM", &a.0.id().to_string()]).status().expect("kill -TERM");
    assert!(term.success());
    assert_eq!(next_event(&a_out, "left")["node"], "a");
    let mut now_c = units(&next_event(&c_out, "assignment"));
    while now_c.len() < UNITS {
        now_c = units(&next_event(&c_out, "assignment"));
    }
    eventually("only c holds units", || nodes_holding(&etcd) == ["c"]);
    drop(a);
}

#[test]
fn bad_arguments_are_clear_errors() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .args(args)
            .output()
            .expect("run");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (code, err) = run(&["node", "--id", "a/b", "--etcd", "http://127.0.0.1:1", "--join-timeout", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("node id `a/b`"), "{err}");
    let (code, err) = run(&["node", "--id", "a", "--roles", "root,store"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("`store` is not `root` or `nf`"), "{err}");
    let (code, err) = run(&["controller", "--chain", "chains/no-such.yaml"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no-such.yaml"), "{err}");
    let (code, err) = run(&["node", "--id", "a", "--ttl", "0.5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--ttl"), "{err}");
    // Nobody listens: the node says where it tried.
    let (code, err) = run(&["node", "--id", "a", "--etcd", "http://127.0.0.1:1", "--join-timeout", "0.3"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("127.0.0.1:1"), "{err}");
}

/// `sluice cluster ARGS` against `endpoint`: its exit code and stdout.
fn cluster_cmd(endpoint: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["cluster", "--etcd", endpoint, "--cluster", "cli"])
        .args(args)
        .output()
        .expect("sluice cluster");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
}

fn status(endpoint: &str) -> serde_json::Value {
    let (code, out) = cluster_cmd(endpoint, &["status", "--json"]);
    assert_eq!(code, Some(0), "{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("status JSON: {e}: {out}"))
}

/// The units `status` shows on `node`.
fn units_on(status: &serde_json::Value, node: &str) -> Vec<Unit> {
    let nodes = status["nodes"].as_array().expect("nodes");
    let n = nodes.iter().find(|n| n["id"] == node).unwrap_or_else(|| panic!("no node {node}: {status}"));
    serde_json::from_value(n["units"].clone()).expect("units")
}

#[test]
fn a_drained_node_gives_its_units_away_and_status_shows_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = LocalEtcd::start(&dir.path().join("etcd")).unwrap_or_else(|e| panic!("{e}"));
    let endpoint = server.endpoint().to_string();
    let (_a, a_out) = node(&endpoint, "a");
    let (_b, b_out) = node(&endpoint, "b");
    next_event(&a_out, "joined");
    next_event(&b_out, "joined");
    let _c1 = controller(&endpoint, "c1");
    eventually("both nodes hold units", || {
        let s = status(&endpoint);
        !units_on(&s, "a").is_empty() && !units_on(&s, "b").is_empty()
    });
    let s = status(&endpoint);
    assert_eq!(s["leader"], "c1", "{s}");
    assert_eq!(s["nodes"][0]["drained"], false, "{s}");

    let (code, _) = cluster_cmd(&endpoint, &["drain", "a"]);
    assert_eq!(code, Some(0));
    eventually("a's units moved to b", || {
        let s = status(&endpoint);
        units_on(&s, "a").is_empty() && units_on(&s, "b").len() == UNITS
    });
    // And node a was told (its stdout may still hold older lines: read up to an empty list).
    while !units(&next_event(&a_out, "assignment")).is_empty() {}
    let s = status(&endpoint);
    let a = s["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == "a")).expect("a");
    assert_eq!(a["drained"], true, "{s}");

    // Undrained, it may host again, but nothing moves back by itself.
    let (code, _) = cluster_cmd(&endpoint, &["undrain", "a"]);
    assert_eq!(code, Some(0));
    std::thread::sleep(Duration::from_millis(800));
    let s = status(&endpoint);
    assert!(units_on(&s, "a").is_empty(), "{s}");
    assert_eq!(units_on(&s, "b").len(), UNITS, "{s}");
    assert!(s["nodes"].as_array().expect("nodes").iter().all(|n| n["drained"] == false), "{s}");
    // The text form names the leader and the drained state.
    let (code, text) = cluster_cmd(&endpoint, &["status"]);
    assert_eq!(code, Some(0));
    assert!(text.contains("`c1` leads") && text.contains("root0"), "{text}");
    let (code, _) = cluster_cmd(&endpoint, &["drain", "no/such"]);
    assert_eq!(code, Some(2));
}

/// Two different free ports on loopback (bound together, then let go: the processes under
/// test bind them next).
fn free_ports() -> (u16, u16) {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let (a, b) = (bind(), bind());
    (a.local_addr().expect("address").port(), b.local_addr().expect("address").port())
}

mod common;

use common::Proc;

/// A GET on loopback `port`: the status code and the body.
fn get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    request(port, "GET", path, token, "")
}

/// A request on loopback `port`: the status code and the body (0 if nothing listens there).
fn request(port: u16, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    common::http(&format!("127.0.0.1:{port}"), method, path, token, body)
}

/// The value of a metric without labels in Prometheus text (`NAME VALUE` or `NAME_total VALUE`).
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name || n == format!("{name}_total")).then(|| v.trim().parse().ok())?
    })
}

/// Metrics, scraped again until `cond` holds of them (within 15 s).
fn metrics_until(port: u16, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        let (status, body) = get(port, "/metrics", Some("m3trics"));
        assert!(status == 200 || status == 0, "{status}: {body}");
        if status == 200 && cond(&body) {
            return body;
        }
        last = body;
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("never: {what}; last scrape:\n{last}");
}

#[test]
fn node_and_controller_serve_metrics_and_the_controller_an_api_behind_a_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = LocalEtcd::start(&dir.path().join("etcd")).unwrap_or_else(|e| panic!("{e}"));
    let endpoint = server.endpoint().to_string();
    let (node_port, ctl_port) = free_ports();
    let node_metrics = node_port.to_string();
    let mut a = sluice(&endpoint, &["node", "--id", "a", "--control", &node_metrics, "--control-token", "m3trics"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Proc)
        .expect("node");
    let ctl_metrics = ctl_port.to_string();
    let _c1 = sluice(
        &endpoint,
        &[
            "controller",
            "--chain",
            "chains/example.yaml",
            "--name",
            "c1",
            "--control",
            &ctl_metrics,
            "--control-token",
            "m3trics",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .map(Proc)
    .expect("controller");
    // The controller leads and has placed the example chain's five units on the one node.
    let c = metrics_until(ctl_port, "the controller placed everything", |m| {
        metric(m, "sluice_controller_units_placed") == Some(UNITS as u64)
    });
    assert_eq!(metric(&c, "sluice_controller_leading"), Some(1), "{c}");
    assert_eq!(metric(&c, "sluice_controller_terms"), Some(1), "{c}");
    assert_eq!(metric(&c, "sluice_controller_nodes_live"), Some(1), "{c}");
    assert!(metric(&c, "sluice_controller_placements").is_some_and(|p| p >= 1), "{c}");
    assert!(c.contains("# TYPE sluice_controller_placements counter"), "{c}");
    // The node follows: one root and four NF instances, registered.
    let n = metrics_until(node_port, "the node holds its units", |m| {
        metric(m, "sluice_node_roots") == Some(1) && metric(m, "sluice_node_instances") == Some(UNITS as u64 - 1)
    });
    assert_eq!(metric(&n, "sluice_node_registered"), Some(1), "{n}");
    assert_eq!(metric(&n, "sluice_node_joins"), Some(1), "{n}");
    // Without the token, with a wrong one, or elsewhere: a clear 4xx.
    for port in [node_port, ctl_port] {
        let (status, body) = get(port, "/metrics", None);
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("missing token"), "{body}");
        assert_eq!(get(port, "/metrics", Some("wrong")).0, 401);
    }
    let (code, body) = get(node_port, "/api/v1/chain", Some("m3trics"));
    assert_eq!(code, 404, "a node's own endpoint has no chain: {body}");
    // The controller asks the root's node for its run's view; this one runs none.
    let (code, body) = get(ctl_port, "/api/v1/chain", Some("m3trics"));
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("node `a` hosts no run"), "{body}");
    assert_eq!(get(node_port, "/api/v1/cluster", Some("m3trics")).0, 404, "a node has no cluster API");

    // The controller's API: the status as `sluice cluster status` has it, through `sluice ctl`.
    let ctl = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["ctl", "--control", &ctl_metrics, "--token", "m3trics"])
            .args(args)
            .output()
            .expect("sluice ctl")
    };
    let out = ctl(&["nodes", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(s["leader"], "c1", "{s}");
    assert_eq!(units_on(&s, "a").len(), UNITS, "{s}");
    let out = ctl(&["nodes"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("controller `c1` leads") && text.contains("root0"), "{text}");
    // Drain and undrain through it: the flag shows in the status (one node: nothing can move).
    assert!(ctl(&["drain", "a"]).status.success());
    eventually("a is drained", || status(&endpoint)["nodes"][0]["drained"] == true);
    let c = metrics_until(ctl_port, "the controller sees a drained", |m| {
        metric(m, "sluice_controller_nodes_drained") == Some(1)
    });
    assert!(metric(&c, "sluice_controller_unplaceable").is_some_and(|n| n >= 1), "nowhere to go: {c}");
    assert!(ctl(&["undrain", "a"]).status.success());
    eventually("a is not drained", || status(&endpoint)["nodes"][0]["drained"] == false);
    // Bad actions change nothing and say why.
    for (body, code, says) in [
        ("{\"drain\": {\"node\": \"zz\"}}", 404, "no live node `zz`"),
        ("{\"drain\": {}}", 400, "send one action"),
        ("{\"reboot\": {}}", 400, "unknown action `reboot`"),
        // Asked of the root's node, which runs no chain here (no --run): it says so.
        ("{\"scale\": {\"vertex\": \"nat\", \"by\": 1}}", 409, "node `a` hosts no run"),
        ("{\"move\": {\"vertex\": \"nat\", \"from\": 0}}", 400, "move needs vertex, from and to"),
        ("{\"crash\": {\"vertex\": \"nat\", \"instance\": 9}}", 404, "no live node hosts nat:9"),
        ("{\"crash\": {\"vertex\": \"nat\"}}", 400, "send one action"),
        ("{\"crash_root\": {\"root\": 4}}", 404, "no live node hosts root 4"),
        ("{\"crash_root\": {\"roots\": 1}}", 400, "crash_root takes {}"),
        ("{\"crash_node\": {\"node\": \"zz\"}}", 404, "no live node `zz`"),
        ("not json", 400, "malformed JSON"),
    ] {
        let (status, answer) = request(ctl_port, "POST", "/api/v1/actions", Some("m3trics"), body);
        assert_eq!(status, code, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer}");
    }
    assert_eq!(request(ctl_port, "POST", "/api/v1/actions", None, "{\"drain\": {\"node\": \"a\"}}").0, 401);
    assert_eq!(status(&endpoint)["nodes"][0]["drained"], false, "nothing changed");
    let out = ctl(&["drain", "zz"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no live node"), "{}", String::from_utf8_lossy(&out.stderr));
    // A crash drill through the API: the node kills its own process (SIGKILL, nothing
    // flushed, no leaving); the controller sees no live node and keeps the placement.
    let out = ctl(&["crash-node", "a"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ended = common::ended_within(&mut a.0, Duration::from_secs(10));
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&ended), Some(9), "node a: {ended:?}");
    let c = metrics_until(ctl_port, "the controller sees the node gone", |m| {
        metric(m, "sluice_controller_nodes_live") == Some(0)
    });
    assert_eq!(metric(&c, "sluice_controller_leading"), Some(1), "{c}");
}

/// A `redis-server` on loopback `port`, killed when dropped.
fn redis_on(port: u16, dir: &std::path::Path) -> Proc {
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/test-all.sh installs it)");
    Proc(child)
}

/// Runs `sluice node --id a ARGS` from the repository's root to its end: exit code, stderr.
fn node_ends(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args(["node", "--id", "a"])
        .args(args)
        .output()
        .expect("run");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_node_registers_only_once_its_store_answers_and_says_which_it_waits_for() {
    // Nothing listens on the store's port: the node says which store, retries, gives up.
    let (code, err) =
        node_ends(&["--etcd", "http://127.0.0.1:1", "--store", "redis://127.0.0.1:1", "--join-timeout", "0.5"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot reach the store redis://127.0.0.1:1"), "{err}");
    assert!(err.contains("retrying"), "it tried more than once: {err}");
    assert!(!err.contains("etcd"), "etcd is not asked before the store answers: {err}");
    // A store URL that cannot be right is a usage error at once.
    let (code, err) = node_ends(&["--store", "redis://127.0.0.1:6379?replicas=x", "--join-timeout", "30"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--store") && err.contains("replicas"), "{err}");
    // An embedded store is this process's own: no other node could reach it.
    let (code, err) = node_ends(&["--store", "embedded", "--join-timeout", "30"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--store embedded: a node's state must be reachable from other nodes"), "{err}");

    // The store comes up after the node: the node waits, then registers; when the store dies
    // later, its metrics say so.
    let dir = tempfile::tempdir().expect("temp dir");
    let server = LocalEtcd::start(&dir.path().join("etcd")).unwrap_or_else(|e| panic!("{e}"));
    let (control, store_port) = free_ports();
    let store = format!("redis://127.0.0.1:{store_port}?prefix=nodecheck");
    let _node = sluice(server.endpoint(), &["node", "--id", "a", "--store", &store, "--join-timeout", "60"])
        .args(["--control", &control.to_string(), "--control-token", "m3trics"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Proc)
        .expect("node");
    let m = metrics_until(control, "the node tried its store", |m| {
        metric(m, "sluice_node_store_errors").is_some_and(|n| n >= 2)
    });
    assert_eq!(metric(&m, "sluice_node_registered"), Some(0), "not registered without its store: {m}");
    assert_eq!(metric(&m, "sluice_node_store_up"), Some(0), "{m}");
    let nodes = status(server.endpoint())["nodes"].as_array().map_or(0, Vec::len);
    assert_eq!(nodes, 0, "nobody registered in etcd yet");
    let redis = redis_on(store_port, dir.path());
    let m = metrics_until(control, "the node registered once its store answered", |m| {
        metric(m, "sluice_node_registered") == Some(1)
    });
    assert_eq!(metric(&m, "sluice_node_store_up"), Some(1), "{m}");
    drop(redis);
    metrics_until(control, "the node noticed its store is gone", |m| metric(m, "sluice_node_store_up") == Some(0));
}
