//! `sluice node --run`: nodes on a real etcd host the units `sluice controller` placed on them,
//! as one chain spread over their processes; the run gives the one-process output, is recorded
//! in parts that verify together, and goes on when the node hosting the NAT is SIGKILLed (by
//! the test, or by itself in a crash drill asked through etcd).

use sluice_cluster::{leader, LocalEtcd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::{json_lines, one_process, repo, sluice, sorted_frames, text, Proc};

fn cluster_args(endpoint: &str) -> [&str; 6] {
    ["--etcd", endpoint, "--cluster", "hosted", "--ttl", "2"]
}

/// A free UDP port on loopback (let go again before the node binds it).
fn free_udp() -> String {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("a free port");
    s.local_addr().expect("address").to_string()
}

/// The nodes' silence limit. Five processes and etcd share two cores here, and the root's
/// node replays to the NAT's replacement for seconds in a debug build: at 200 ms a live node
/// was now and then declared failed and fenced (the output stayed equivalent, but that node's
/// run then ends with an error, which this test counts as a failure).
const SILENCE_MS: &str = "1000";

/// A node hosting its units (its stderr in `log`), and its stdout lines as they come.
fn node(endpoint: &str, (id, roles, extra): (&str, &str, &[&str]), run: (&str, &str), log: &Path) -> (Proc, Lines) {
    let (run, root_run) = run;
    let addr = free_udp();
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.current_dir(repo(""))
        .args(["node", "--id", id, "--addr", &addr, "--roles", roles, "--silence-ms", SILENCE_MS, "--settle-ms", "500"])
        .args(cluster_args(endpoint))
        .args(extra)
        .arg(format!("--run={run}"));
    if !root_run.is_empty() {
        c.arg(format!("--root-run={root_run}"));
    }
    let err = std::fs::File::create(log).expect("a node's log");
    let mut child = c.stdout(Stdio::piped()).stderr(err).spawn().expect("node");
    let rx = json_lines(child.stdout.take().expect("stdout"));
    (Proc(child), Lines { rx, log: log.to_path_buf() })
}

/// A node's stdout lines, and where its stderr goes.
struct Lines {
    rx: mpsc::Receiver<serde_json::Value>,
    log: PathBuf,
}

impl Lines {
    /// What the node wrote to its stderr so far.
    fn said(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The next line whose event is `event`, within `limit` (or a failure showing the node's log).
fn next_event(lines: &Lines, event: &str, limit: Duration) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let v = lines
            .rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no `{event}` line ({e}); the node's log:\n{}", lines.said()));
        if v["event"] == event {
            return v;
        }
    }
}
/// What a test SIGKILLs a second into the run.
#[derive(Clone, Copy, PartialEq)]
enum Victim {
    /// The node hosting the NAT.
    NatNode,
    /// The leading controller (another one stands by).
    Leader,
    /// The node hosting the NAT, by a crash drill (`sluice cluster crash-node`): it SIGKILLs
    /// itself.
    NatNodeDrill,
    /// The NAT instance alone, by a crash drill (`sluice cluster crash nat:0`): its node's run
    /// crashes it and the root's node replaces it; the node lives on.
    NatInstanceDrill,
    /// The root, by a crash drill (`sluice cluster crash-root`): the root's node's run crashes
    /// it and a new root takes over there, reading the log back from the store (`--log store`).
    RootDrill,
}

/// A root-only node `a` and NF nodes `b` and `c` host the example chain (the controllers
/// place the root on `a` and the four NFs on `b` and `c`); `victims` are SIGKILLed together a
/// second into the paced run. The output must be the one-process output and the record must
/// verify.
fn hosted_run(victims: &[Victim]) {
    let kill = victims.contains(&Victim::NatNode) || victims.contains(&Victim::NatNodeDrill);
    let nat_fails = kill || victims.contains(&Victim::NatInstanceDrill);
    // SLUICE_HOSTED_KEEP=1 keeps the run's files (logs, reports, records, output).
    let temp = tempfile::tempdir().expect("temp dir");
    let (dir, _temp) = match std::env::var_os("SLUICE_HOSTED_KEEP") {
        Some(_) => (temp.keep(), None),
        None => (temp.path().to_path_buf(), Some(temp)),
    };
    eprintln!("files in {}", dir.display());
    let d = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let etcd = LocalEtcd::start(&dir.join("etcd")).unwrap_or_else(|e| panic!("{e}"));
    let endpoint = etcd.endpoint().to_string();
    let store = common::served_store();
    let engine =
        format!("-c chains/example.yaml --fault-tolerance --mode async --store {} -w 1 -q --no-pin", store.url);
    let run = |n: &str| format!("{engine} --record {} --json {}", d(&format!("rec-{n}")), d(&format!("{n}.json")));
    let log = if victims.contains(&Victim::RootDrill) { " --log store" } else { "" };
    let root_run = format!("-i traces/demo.pcap -o {} --pace 0.05{log}", d("out.pcap"));
    let start = |id: &str, roles: &str, extra: &[&str]| {
        node(&endpoint, (id, roles, extra), (&run(id), &root_run), &dir.join(format!("{id}.log")))
    };
    // Node a serves its metrics.
    let control = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr");
    let control_s = control.to_string();
    let (mut a, a_out) = start("a", "root", &["--control", &control_s, "--control-token", "T"]);
    let (b, b_out) = start("b", "nf", &[]);
    let (c, c_out) = start("c", "nf", &[]);
    // Every node registered before the controllers place: a node that joins later gets
    // nothing of a placement already made (nothing moves without a reason).
    let limit = Duration::from_secs(30);
    for lines in [&a_out, &b_out, &c_out] {
        next_event(lines, "joined", limit);
    }
    let controller = |name: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
        c.current_dir(repo("")).args(["controller", "--chain", "chains/example.yaml", "--name", name]);
        Proc(c.args(cluster_args(&endpoint)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("controller"))
    };
    let mut controllers = vec![controller("c1"), controller("c2")];

    // Every node runs the same spread: the root on a, every NF on b or c.
    let runs: Vec<serde_json::Value> = [&a_out, &b_out, &c_out].iter().map(|rx| next_event(rx, "run", limit)).collect();
    let spread = &runs[0]["spread"];
    assert!(runs.iter().all(|r| r["spread"] == *spread), "the nodes computed different spreads: {runs:?}");
    assert_eq!(spread["root"], "a", "{spread}");
    assert_eq!((&runs[0]["root"], &runs[1]["root"]), (&serde_json::json!(true), &serde_json::json!(false)));
    let place = spread["place"].as_object().expect("place");
    assert_eq!(place.len(), 4, "every NF instance on b or c: {spread}");
    let nat_node = place["nat/0"].as_str().expect("nat placed").to_string();
    assert!(["b", "c"].contains(&nat_node.as_str()), "{spread}");
    // The gauge follows the run at the node's next look (every 100 ms or so). The whole sample
    // line: the metric's HELP text says "sluice_node_running 1 while ...".
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, metrics) = common::http(&control_s, "GET", "/metrics", Some("T"), "");
        assert_eq!(code, 200, "{metrics}");
        if metrics.lines().any(|l| l == "sluice_node_running 1") {
            break;
        }
        assert!(Instant::now() < deadline, "node a does not say it runs its part: {metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let (mut victim, victim_out, mut survivor, survivor_out) =
        if nat_node == "b" { (b, b_out, c, c_out) } else { (c, c_out, b, b_out) };
    let survivor_id = if nat_node == "b" { "c" } else { "b" };
    let client = etcd.client().expect("etcd client");
    let leading = || leader(&client, "hosted", "controller").ok().flatten();
    let first = leading().expect("a controller leads");
    std::thread::sleep(Duration::from_secs(1));
    if victims.contains(&Victim::NatNode) {
        victim.0.kill().expect("SIGKILL the NAT's node");
    }
    if victims.contains(&Victim::NatNodeDrill) {
        let asked = sluice(&["cluster", "--etcd", &endpoint, "--cluster", "hosted", "crash-node", &nat_node]);
        assert!(asked.status.success(), "{}", text(&asked));
        let ended = common::ended_within(&mut victim.0, limit);
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&ended), Some(9), "the NAT's node: {ended:?}");
    }
    if victims.contains(&Victim::NatInstanceDrill) {
        let asked = sluice(&["cluster", "--etcd", &endpoint, "--cluster", "hosted", "crash", "nat:0"]);
        assert!(asked.status.success(), "{}", text(&asked));
        assert!(text(&asked).contains(&format!("node `{nat_node}` crashed nat:0")), "{}", text(&asked));
        let unknown = sluice(&["cluster", "--etcd", &endpoint, "--cluster", "hosted", "crash", "nat:5"]);
        assert!(!unknown.status.success() && text(&unknown).contains("no live node hosts nat:5"), "{}", text(&unknown));
    }
    if victims.contains(&Victim::RootDrill) {
        let asked = sluice(&["cluster", "--etcd", &endpoint, "--cluster", "hosted", "crash-root"]);
        assert!(asked.status.success(), "{}", text(&asked));
        assert!(text(&asked).contains("node `a` crashed the root"), "{}", text(&asked));
        // Answered once the root had failed: where in the run.
        assert!(text(&asked).contains("\"at_packet\":"), "{}", text(&asked));
    }
    if victims.contains(&Victim::Leader) {
        let i = if first == "c1" { 0 } else { 1 };
        controllers[i].0.kill().expect("SIGKILL the leading controller");
    }
    let ended = next_event(&a_out, "run-ended", Duration::from_secs(120));
    assert_eq!(ended["ok"], true, "the root's node: {ended}");
    next_event(&a_out, "left", limit);
    assert!(common::ended_within(&mut a.0, limit).success(), "node a exits with its run's code: {}", a_out.said());
    let ended = next_event(&survivor_out, "run-ended", limit);
    assert_eq!(ended["ok"], true, "node {survivor_id}: {ended}\n{}", survivor_out.said());
    assert!(common::ended_within(&mut survivor.0, limit).success(), "node {survivor_id}: {}", survivor_out.said());
    if !kill {
        assert!(common::ended_within(&mut victim.0, limit).success(), "node {nat_node}: {}", victim_out.said());
    }
    if victims.contains(&Victim::Leader) {
        // The other controller took over once the killed leader's lease expired.
        let deadline = Instant::now() + limit;
        while leading().is_none_or(|l| l == first) {
            assert!(Instant::now() < deadline, "no controller took over from {first}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(controllers);

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d("a.json")).expect("a's report")).expect("JSON");
    let failed: Vec<&str> =
        report["failovers"].as_array().into_iter().flatten().filter_map(|f| f["vertex"].as_str()).collect();
    let failed_nodes: Vec<&str> =
        report["link"]["failed_nodes"].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
    assert_eq!(failed_nodes, if kill { vec![nat_node.as_str()] } else { vec![] }, "{}", report["link"]);
    assert_eq!(failed.contains(&"nat"), nat_fails, "{}", report["failovers"]);
    let alone = u64::from(victims.contains(&Victim::NatInstanceDrill));
    assert_eq!(report["link"]["crashed_instances"], alone, "{}", report["link"]);
    let log = &report["fault_tolerance"];
    assert_eq!((&log["deleted"], &log["left_in_log"]), (&log["logged"], &serde_json::json!(0)), "{log}");
    let root_crashes = report["root_crashes"].as_array().cloned().unwrap_or_default();
    assert_eq!(root_crashes.len(), usize::from(victims.contains(&Victim::RootDrill)), "{root_crashes:?}");
    for c in &root_crashes {
        assert_eq!(c["lost"], false, "the log in the store outlives the root: {c}");
    }

    let one = dir.join("one.pcap");
    one_process(&one, &[]);
    let want = sorted_frames(&one);
    let got = sorted_frames(Path::new(&d("out.pcap")));
    assert!(want.len() > 60_000, "{}", want.len());
    if got != want {
        // The nodes' logs are in `dir` (with RUST_LOG=warn,sluice::copies=trace, where every
        // copy ended); the scratch directory goes with the test, so copy it out.
        common::differing_output(&dir, &one, &got, &want, &report["failovers"]);
    }

    // The record: the root's node's, the survivor's part, and the victim's part (or, killed,
    // the journal it left).
    let parts: Vec<PathBuf> = ["b", "c"].iter().map(|n| dir.join(format!("rec-{n}"))).collect();
    if kill {
        assert!(!dir.join(format!("rec-{nat_node}/record.json")).exists(), "the killed node wrote a part");
    }
    let mut args = vec!["verify".to_string(), "--recorded".into(), d("rec-a")];
    for p in &parts {
        args.extend(["--part".to_string(), p.to_string_lossy().into_owned()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = sluice(&args);
    assert!(v.status.success(), "{}", text(&v));
    assert!(text(&v).contains("chain output equivalence: EQUIVALENT"), "{}", text(&v));
}

#[test]
fn nodes_host_the_units_the_controller_placed_and_give_the_one_process_output() {
    hosted_run(&[]);
}

#[test]
fn the_hosting_node_of_the_nat_killed_mid_run_is_failed_over() {
    hosted_run(&[Victim::NatNode]);
}

#[test]
fn a_crash_drill_of_the_nat_node_is_failed_over_as_a_kill_is() {
    hosted_run(&[Victim::NatNodeDrill]);
}

#[test]
fn a_crash_drill_of_the_nat_instance_alone_replaces_it_on_the_root_node() {
    hosted_run(&[Victim::NatInstanceDrill]);
}

#[test]
fn a_crash_drill_of_the_root_gives_a_new_root_on_its_node() {
    hosted_run(&[Victim::RootDrill]);
}

#[test]
fn the_leading_controller_killed_mid_run_changes_nothing_for_traffic() {
    hosted_run(&[Victim::Leader]);
}

#[test]
fn the_nat_node_and_the_leading_controller_killed_together_lose_nothing() {
    hosted_run(&[Victim::NatNode, Victim::Leader]);
}

#[test]
fn bad_hosting_options_are_refused_before_joining() {
    let cases: [(&[&str], &str); 5] = [
        (&["--run=-c chains/example.yaml --spread s.yaml"], "comes from the placement"),
        (&["--run=-c chains/example.yaml --no-such-option"], "--no-such-option"),
        (&["--root-run=-i traces/demo.pcap"], "--run"),
        (&["--run=-c chains/example.yaml", "--silence-ms", "5"], "--silence-ms"),
        (&["--scalable"], "--run"),
    ];
    for (extra, says) in cases {
        // No etcd at this endpoint: the options are refused before the node tries to join.
        let mut args = vec!["node", "--id", "a", "--etcd", "http://127.0.0.1:1", "--join-timeout", "0"];
        args.extend_from_slice(extra);
        let o = sluice(&args);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{extra:?} should mention {says}: {}", text(&o));
    }
}

/// The example chain with its vertices listed so that the controller places the NAT on the
/// root's node `a` (roles root and nf) and the portscan and Trojan detectors on `b`, the LB on
/// `a` behind the detector on `b` (placement goes in listed order to the least loaded node).
const NAT_ON_THE_ROOT_NODE: &str = "name: example
vertices:
  portscan:
    type: portscan
  lb:
    type: lb
    config:
      backends: [10.1.0.1, 10.1.0.2, 10.1.0.3, 10.1.0.4]
  trojan:
    type: trojan
  nat:
    type: nat
    config:
      external_ip: 198.51.100.1
      internal: [\"10.0.0.0/8\"]
edges:
  - { from: input, to: nat }
  - { from: nat, to: portscan }
  - { from: nat, to: trojan, mirror: true }
  - { from: portscan, to: lb }
  - { from: lb, to: output }
";

/// Live changes through the controller's API while a hosted run (`sluice node --scalable`)
/// carries paced traffic: the NAT, whole on the root's node, scales out (and `sluice ctl list`
/// through the controller shows it), has flows moved, scales back in (through `sluice ctl`)
/// and is cloned (through `sluice cluster`); changes of vertices on, or fed from,
/// the other node are refused with the reason, bad requests with a 4xx, changing nothing. The
/// output has the one-process output's packets and the record verifies.
#[test]
fn the_controller_scales_moves_and_clones_a_vertex_whole_on_the_root_node_while_it_runs() {
    // SLUICE_HOSTED_KEEP=1 keeps the run's files (logs, reports, records, output).
    let temp = tempfile::tempdir().expect("temp dir");
    let (dir, _temp) = match std::env::var_os("SLUICE_HOSTED_KEEP") {
        Some(_) => (temp.keep(), None),
        None => (temp.path().to_path_buf(), Some(temp)),
    };
    let dir = dir.as_path();
    eprintln!("files in {}", dir.display());
    let d = |f: &str| dir.join(f).to_string_lossy().into_owned();
    std::fs::write(dir.join("chain.yaml"), NAT_ON_THE_ROOT_NODE).expect("chain file");
    let etcd = LocalEtcd::start(&dir.join("etcd")).unwrap_or_else(|e| panic!("{e}"));
    let endpoint = etcd.endpoint().to_string();
    let store = common::served_store();
    let engine =
        format!("-c {} --fault-tolerance --mode async --store {} -w 1 -q --no-pin", d("chain.yaml"), store.url);
    let run = |n: &str| format!("{engine} --record {} --json {}", d(&format!("rec-{n}")), d(&format!("{n}.json")));
    // About 26 s of traffic (`--pace 0.1` gives 1.3 s): every change below is asked while it
    // flows, each answered within about 200 ms (the whole sequence takes about 5 s; the rest is
    // room for a loaded machine, since a change asked once the input has ended is refused).
    let root_run = format!("-i traces/demo.pcap -o {} --pace 0.005", d("out.pcap"));
    let start = |id: &str, roles: &str| {
        node(&endpoint, (id, roles, &["--scalable"]), (&run(id), &root_run), &dir.join(format!("{id}.log")))
    };
    let (mut a, a_out) = start("a", "root,nf");
    let (mut b, b_out) = start("b", "nf");
    let limit = Duration::from_secs(30);
    for lines in [&a_out, &b_out] {
        next_event(lines, "joined", limit);
    }
    let api = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").to_string();
    let _controller = Proc(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .current_dir(repo(""))
            .args(["controller", "--chain", &d("chain.yaml"), "--name", "c1", "--control", &api])
            .args(["--control-token", common::CONTROL_TOKEN])
            .args(cluster_args(&endpoint))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("controller"),
    );
    let runs: Vec<serde_json::Value> = [&a_out, &b_out].iter().map(|rx| next_event(rx, "run", limit)).collect();
    let spread = &runs[0]["spread"];
    assert_eq!(spread["scalable"], true, "{spread}");
    let place = spread["place"].as_object().expect("place");
    assert_eq!((place.get("nat/0"), &place["portscan/0"]), (None, &serde_json::json!("b")), "the NAT on a: {spread}");
    std::thread::sleep(Duration::from_millis(800));

    let ask = |body: &str| common::http(&api, "POST", "/api/v1/actions", Some(common::CONTROL_TOKEN), body);
    let applied = |body: &str| {
        let (code, answer) = ask(body);
        assert_eq!(code, 200, "{body}: {answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
        assert_eq!(v["node"], "a", "the root's node applied it: {answer}");
        assert!(v["applied"].is_object(), "{answer}");
    };
    let pause = || std::thread::sleep(Duration::from_millis(300));
    applied(r#"{"scale": {"vertex": "nat", "to": 2}}"#);
    // The controller shows the run's live view, as the root's node has it: the NAT's second
    // instance serving there, the detector on the other node.
    let deadline = Instant::now() + limit;
    loop {
        let list = sluice(&["ctl", "--control", &api, "--token", common::CONTROL_TOKEN, "list", "--json"]);
        assert!(list.status.success(), "{}", text(&list));
        let view: serde_json::Value = serde_json::from_slice(&list.stdout).expect("the view as JSON");
        assert_eq!(view["node"], "a", "{view}");
        let vertex = |n: &str| view["vertices"].as_array().into_iter().flatten().find(|v| v["name"] == n).cloned();
        let nat = vertex("nat").expect("the NAT listed");
        let serving = nat["instances"].as_array().into_iter().flatten().filter(|i| i["retired"] == false).count();
        if serving == 2 {
            let portscan = vertex("portscan").expect("the detector listed");
            assert_eq!(portscan["instances"][0]["elsewhere"], true, "{portscan}");
            break;
        }
        assert!(Instant::now() < deadline, "the NAT never showed two instances: {nat}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let listed = sluice(&["ctl", "--control", &api, "--token", common::CONTROL_TOKEN, "list"]);
    assert!(text(&listed).contains("on another node"), "{}", text(&listed));
    // The cluster's status shows what a's run serves now next to what was placed on it.
    let nat1 = serde_json::json!({ "instance": { "vertex": "nat", "index": 1 } });
    loop {
        let nodes = sluice(&["ctl", "--control", &api, "--token", common::CONTROL_TOKEN, "nodes", "--json"]);
        assert!(nodes.status.success(), "{}", text(&nodes));
        let status: serde_json::Value = serde_json::from_slice(&nodes.stdout).expect("the status as JSON");
        let a = status["nodes"].as_array().into_iter().flatten().find(|n| n["id"] == "a").expect("node a");
        let has = |field: &str| a[field].as_array().is_some_and(|u| u.contains(&nat1));
        assert!(!has("units"), "the placement keeps what the run started with: {a}");
        if has("running") {
            let b = status["nodes"].as_array().into_iter().flatten().find(|n| n["id"] == "b").expect("node b");
            assert_eq!(b["running"], b["units"], "b's run serves what was placed on it: {b}");
            break;
        }
        assert!(Instant::now() < deadline, "a's run never said it serves nat:1: {a}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let nodes = sluice(&["ctl", "--control", &api, "--token", common::CONTROL_TOKEN, "nodes"]);
    let line = text(&nodes).lines().find(|l| l.trim_start().starts_with("a ")).map(str::to_string);
    assert!(
        line.as_deref().is_some_and(|l| l.contains("(its run serves now: root0") && l.ends_with("nat:0 nat:1)")),
        "{}",
        text(&nodes)
    );
    applied(r#"{"move": {"vertex": "nat", "from": 0, "to": 1, "flows": 200}}"#);
    for (body, code, says) in [
        (r#"{"scale": {"vertex": "portscan", "by": 1}}"#, 409, "`portscan` has instances on node `b`"),
        (
            r#"{"scale": {"vertex": "lb", "to": 2}}"#,
            409,
            "`portscan`, which sends packets to `lb`, has instances on node `b`",
        ),
        (r#"{"scale": {"vertex": "nope", "to": 2}}"#, 404, "no vertex `nope`"),
        (r#"{"move": {"vertex": "nat", "from": 0, "to": 7}}"#, 404, "has no instance 7"),
        (r#"{"scale": {"vertex": "nat"}}"#, 400, "scale needs vertex"),
        (r#"{"scale": {"vertex": "nat", "to": 0}}"#, 400, "at least one instance"),
        ("{not json", 400, "malformed JSON"),
    ] {
        let (c, answer) = ask(body);
        assert_eq!(c, code, "{body}: {answer}");
        assert!(answer.contains(says), "{body}: {answer} should say {says}");
    }
    let (c, _) =
        common::http(&api, "POST", "/api/v1/actions", Some("wrong"), r#"{"scale": {"vertex": "nat", "to": 3}}"#);
    assert_eq!(c, 401, "a wrong token changes nothing");
    pause();
    let ctl = sluice(&["ctl", "--control", &api, "--token", common::CONTROL_TOKEN, "scale", "nat=1"]);
    assert!(ctl.status.success() && text(&ctl).contains("applied"), "{}", text(&ctl));
    pause();
    // Straight through etcd, without the controller's endpoint: the same answers.
    let cluster = |args: &[&str]| sluice(&[&["cluster", "--etcd", &endpoint, "--cluster", "hosted"], args].concat());
    let refused = cluster(&["scale", "lb=2"]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(text(&refused).contains("node `a` refused it (409): `portscan`, which sends"), "{}", text(&refused));
    let bad = cluster(&["scale", "lb"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    let cloned = cluster(&["clone", "nat:0"]);
    assert!(cloned.status.success() && text(&cloned).contains("\"clone\""), "{}", text(&cloned));

    for (lines, p) in [(&a_out, &mut a), (&b_out, &mut b)] {
        let ended = next_event(lines, "run-ended", Duration::from_secs(120));
        assert_eq!(ended["ok"], true, "{ended}\n{}", lines.said());
        assert!(common::ended_within(&mut p.0, limit).success(), "{}", lines.said());
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d("a.json")).expect("a's report")).expect("JSON");
    let c = common::reconfigurations(&report);
    let kinds: Vec<&str> = c.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(kinds[..4], ["scale_out", "move", "scale_in", "clone"], "{c:?}");
    assert!(c.iter().all(|x| x.1 == "nat"), "only the NAT changed: {c:?}");
    assert!(c[1].3 > 0, "no flow moved: {c:?}");
    let log = &report["fault_tolerance"];
    assert_eq!((&log["deleted"], &log["left_in_log"]), (&log["logged"], &serde_json::json!(0)), "{log}");

    // Two NAT instances pick ports in another order than one: `verify` compares the output up
    // to the ports picked, and the count here.
    let one = d("one.pcap");
    let o = sluice(&["run", "-c", &d("chain.yaml"), "-i", "traces/demo.pcap", "-w", "1", "-q", "--no-pin", "-o", &one]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(sorted_frames(Path::new(&d("out.pcap"))).len(), sorted_frames(Path::new(&one)).len());
    let v = sluice(&["verify", "--recorded", &d("rec-a"), "--part", &d("rec-b")]);
    assert!(text(&v).contains("chain output equivalence: EQUIVALENT"), "{}", text(&v));
}
