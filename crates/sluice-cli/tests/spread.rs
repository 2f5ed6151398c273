//! One chain over several node processes (`sluice run --spread FILE --node NAME`): the example
//! chain with its instances on two or three processes gives the one-process chain's output
//! byte for byte, with local state and with fault tolerance over a store another process
//! serves (every root log entry closed by the notes that crossed); nodes given another chain
//! refuse each other; a node that dies without fault tolerance ends the run with an error
//! instead of a hang; bad spreads and misplaced options are refused; in a network namespace
//! whose firewall drops datagrams between the nodes at random, what was lost is asked for
//! again and resent, and the output is still the one-process output. A vertex whose instances
//! sit on several nodes (state in a served store or Redis) is recorded once, by the root's
//! node; an order-sensitive detector away from the root takes its input in entry order; each
//! node shows its part on its control endpoint. Nodes killed: `spread_kills.rs`; instances
//! crashed through a node's endpoint: `spread_crashes.rs`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::nodes::{clean_link, free_port, json, node_end, root_node, root_node_of, start_node, two_nat_chain, Node};
use common::{one_process, repo, sluice, sluice_within, sorted_frames, spread_file, text};

#[test]
fn the_example_chain_over_two_nodes_gives_the_one_process_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spread = spread_file(dir.path(), 2, &[("portscan", "b"), ("lb", "b")]);
    let b_json = dir.path().join("b.json");
    let b = start_node("chains/example.yaml", &spread, "b", &b_json, &["-w", "1"]);
    let (out, a_json) = (dir.path().join("spread.pcap"), dir.path().join("a.json"));
    let a = root_node(&spread, &out, &a_json, &[]);
    assert!(a.status.success(), "{}", text(&a));
    let (ok, err) = node_end(b, Duration::from_secs(30));
    assert!(ok, "{err}");

    let whole = one_process(&dir.path().join("one.pcap"), &[]);
    let spread_out = std::fs::read(&out).expect("spread output");
    assert!(whole.len() > 1_000_000, "{} bytes", whole.len());
    assert!(spread_out == whole, "the spread chain's output differs from the one-process chain's");

    let (a_rep, b_rep) = (json(&a_json), json(&b_json));
    let (a_link, b_link) = (clean_link(&a_rep, "a"), clean_link(&b_rep, "b"));
    // Everything the NAT forwards crosses to b; what b forwards comes back as output.
    let out_packets = a_rep["packets_out"].as_u64().expect("packets_out");
    assert_eq!(b_link["packets_sent"], out_packets, "{b_link}");
    assert_eq!(a_link["packets_received"], out_packets, "{a_link}");
    assert_eq!(a_link["packets_sent"], b_link["packets_received"], "{a_link} {b_link}");
    // Without a log the root hears only of copies that end on b: its drops.
    let b_dropped = b_rep["dropped_total"].as_u64().expect("dropped_total");
    assert!(b_dropped > 0, "{b_rep}");
    assert_eq!(b_link["notes_sent"], b_dropped, "{b_link}");
    assert_eq!(a_link["notes_received"], b_dropped, "{a_link}");
    // b ran the portscan detector and the LB, a the NAT and the Trojan detector.
    let ran = |r: &serde_json::Value| -> Vec<String> {
        r["vertices"]
            .as_array()
            .expect("vertices")
            .iter()
            .filter(|v| v["instances"].as_array().is_some_and(|i| !i.is_empty()))
            .map(|v| v["name"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(ran(&a_rep), ["nat", "trojan"]);
    assert_eq!(ran(&b_rep), ["portscan", "lb"]);
}

#[test]
fn fault_tolerance_over_three_nodes_closes_every_log_entry() {
    let server = common::served_store();
    let dir = tempfile::tempdir().expect("temp dir");
    // The NAT (which mirrors to the Trojan detector back on a) on b, the rest of the path on
    // c: copies made on b, drops on c, commits from both cross to the root's log on a.
    let spread = spread_file(dir.path(), 3, &[("nat", "b"), ("portscan", "c"), ("lb", "c")]);
    let ft = ["--fault-tolerance", "--mode", "async", "--store", &server.url];
    let nodes: Vec<(Node, PathBuf)> = ["b", "c"]
        .iter()
        .map(|n| {
            let j = dir.path().join(format!("{n}.json"));
            let rec = dir.path().join(format!("rec-{n}")).to_string_lossy().into_owned();
            (start_node("chains/example.yaml", &spread, n, &j, &[&ft[..], &["-w", "1", "--record", &rec]].concat()), j)
        })
        .collect();
    let (out, a_json) = (dir.path().join("spread.pcap"), dir.path().join("a.json"));
    let rec = |n: &str| dir.path().join(format!("rec-{n}")).to_string_lossy().into_owned();
    let a = root_node(&spread, &out, &a_json, &[&ft[..], &["--record", &rec("a")]].concat());
    assert!(a.status.success(), "{}", text(&a));
    let mut reports = Vec::new();
    for (child, j) in nodes {
        let (ok, err) = node_end(child, Duration::from_secs(30));
        assert!(ok, "{err}");
        reports.push(json(&j));
    }
    let whole = one_process(&dir.path().join("one.pcap"), &[]);
    assert!(std::fs::read(&out).expect("spread output") == whole, "the spread chain's output differs");

    let a_rep = json(&a_json);
    let log = &a_rep["fault_tolerance"];
    assert_eq!(log["logged"], a_rep["packets_in"], "{log}");
    assert_eq!(log["deleted"], log["logged"], "every logged packet closed: {log}");
    assert_eq!(log["left_in_log"], 0, "{log}");
    let a_link = clean_link(&a_rep, "a");
    let (b_link, c_link) = (clean_link(&reports[0], "b"), clean_link(&reports[1], "c"));
    // b's notes say which mirror copies it made (one per packet the NAT forwards, for the
    // Trojan detector on a) and its commits; c's say what it dropped and its commits.
    let heard = a_link["notes_received"].as_u64().expect("notes");
    let sent = b_link["notes_sent"].as_u64().expect("notes") + c_link["notes_sent"].as_u64().expect("notes");
    assert_eq!(heard, sent, "{a_link} {b_link} {c_link}");
    let mirrored = a_rep["mirrored"].as_u64().expect("mirrored") + reports[0]["mirrored"].as_u64().expect("mirrored");
    assert!(mirrored > 60_000, "the NAT on b mirrored {mirrored}");
    assert!(b_link["notes_sent"].as_u64().expect("notes") > mirrored, "copies made and commits: {b_link}");
    // The three parts of the record (state in the one store, each node's vertices in its
    // part) verify together.
    let v = sluice(&["verify", "--recorded", &rec("a"), "--part", &rec("b"), "--part", &rec("c")]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn nodes_given_different_chains_refuse_each_other() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spread = spread_file(dir.path(), 2, &[("portscan", "b")]);
    // b is given another chain that also has a portscan detector.
    let b = start_node("chains/nat-portscan.yaml", &spread, "b", &dir.path().join("b.json"), &[]);
    let a = root_node(&spread, &dir.path().join("out.pcap"), &dir.path().join("a.json"), &[]);
    assert!(!a.status.success());
    assert!(text(&a).contains("runs another chain or placement"), "{}", text(&a));
    let (ok, err) = node_end(b, Duration::from_secs(30));
    assert!(!ok);
    assert!(err.contains("another chain or placement") || err.contains("stopped"), "{err}");
}

#[test]
fn a_node_that_dies_ends_the_run_with_an_error_not_a_hang() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spread = spread_file(dir.path(), 2, &[("portscan", "b"), ("lb", "b")]);
    let mut b = start_node("chains/example.yaml", &spread, "b", &dir.path().join("b.json"), &[]);
    let started = Instant::now();
    // Paced: the run would take about eight seconds.
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        b.kill();
    });
    let a = root_node(&spread, &dir.path().join("out.pcap"), &dir.path().join("a.json"), &["--pace", "0.05"]);
    killer.join().expect("killer");
    assert!(!a.status.success(), "{}", text(&a));
    assert!(text(&a).contains("node `b` has not been heard from"), "{}", text(&a));
    assert!(text(&a).contains("needs --fault-tolerance and a store"), "{}", text(&a));
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

#[test]
fn bad_spreads_and_misplaced_options_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spread = spread_file(dir.path(), 2, &[("portscan", "b")]);
    let s = spread.to_string_lossy().into_owned();
    let run = |args: &[&str]| {
        let mut all = vec!["run", "-c", "chains/example.yaml", "--spread", &s];
        all.extend_from_slice(args);
        sluice_within(&all, Duration::from_secs(30)).expect("ended")
    };
    let cases: [(&[&str], &str); 5] = [
        (&["--node", "z", "-i", "traces/demo.pcap"], "no node `z`"),
        (&["--node", "a"], "has the root: give it the input"),
        (&["--node", "b", "-i", "traces/demo.pcap"], "input belongs on the root's node"),
        (&["--node", "b", "-o", "/tmp/nowhere.pcap"], "output belongs on the root's node"),
        (&["-i", "traces/demo.pcap"], "--node"),
    ];
    for (args, says) in cases {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
    // A vertex split over two nodes with its state in each process's own store.
    let chain = two_nat_chain(dir.path());
    let split = spread_file(dir.path(), 2, &[("nat/1", "b")]);
    for (node, input) in [("b", None), ("a", Some("traces/demo.pcap"))] {
        let mut args = vec!["run", "-c", chain.to_str().expect("path"), "--spread", split.to_str().expect("path")];
        args.extend(["--node", node]);
        args.extend(input.map(|i| ["-i", i]).into_iter().flatten());
        let o = sluice_within(&args, Duration::from_secs(30)).expect("ended");
        assert_eq!(o.status.code(), Some(2), "{node}: {}", text(&o));
        assert!(text(&o).contains("`nat` has instances on several nodes"), "{node}: {}", text(&o));
    }
    // A spread file that places a vertex the chain does not have.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "nodes: {a: 127.0.0.1:1, b: 127.0.0.1:2}\nroot: a\nplace: {firewall: b}\n").expect("file");
    let o = sluice(&["run", "-c", "chains/example.yaml", "--spread", &bad.to_string_lossy(), "--node", "b"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no vertex of that name"), "{}", text(&o));
    // Not a spread at all.
    std::fs::write(&bad, "nodes: [a, b]\n").expect("file");
    let o = sluice(&["run", "-c", "chains/example.yaml", "--spread", &bad.to_string_lossy(), "--node", "b"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("spread file"), "{}", text(&o));
}

/// A network namespace with its loopback up, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        let o = Command::new("ip").args(["netns", "add", &name]).output().expect("ip netns add");
        assert!(o.status.success(), "ip netns add {name}: {}", text(&o));
        let ns = Netns(name);
        ns.run(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn run(&self, args: &[&str]) {
        let o = Command::new("ip").args(["netns", "exec", &self.0]).args(args).output().expect("ip netns exec");
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }

    /// `sluice` inside the namespace, from the repository.
    fn sluice(&self) -> Command {
        let mut c = Command::new("ip");
        c.current_dir(repo("")).args(["netns", "exec", &self.0, env!("CARGO_BIN_EXE_sluice")]);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).stderr(Stdio::null()).status();
    }
}

#[test]
fn datagrams_lost_between_nodes_are_asked_for_again_and_resent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ns = Netns::new(format!("sl-loss-{}", std::process::id()));
    // The kernel drops 3 % of the datagrams to either node as they arrive, at random, both
    // ways (on the input hook: the sender is not told, as on a wire).
    ns.run(&["nft", "add", "table", "inet", "loss"]);
    ns.run(&["nft", "add chain inet loss wire { type filter hook input priority 0; }"]);
    ns.run(&["nft", "add rule inet loss wire udp dport { 40001, 40002 } numgen random mod 100 < 3 drop"]);
    let spread = dir.path().join("spread.yaml");
    std::fs::write(
        &spread,
        "nodes:\n  a: 127.0.0.1:40001\n  b: 127.0.0.1:40002\nroot: a\nplace:\n  portscan: b\n  lb: b\n",
    )
    .expect("spread file");
    let (b_json, a_json, out) = (dir.path().join("b.json"), dir.path().join("a.json"), dir.path().join("out.pcap"));
    let b = ns
        .sluice()
        .args(["run", "-c", "chains/example.yaml", "--spread"])
        .arg(&spread)
        .args(["--node", "b", "-w", "1", "-q", "--no-pin", "--json"])
        .arg(&b_json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node b");
    let b = Node::reading(b);
    let a = ns
        .sluice()
        .args(["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--spread"])
        .arg(&spread)
        .args(["--node", "a", "-w", "1", "-q", "--no-pin", "-o"])
        .arg(&out)
        .arg("--json")
        .arg(&a_json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node a");
    let (a_ok, a_err) = node_end(Node::reading(a), Duration::from_secs(120));
    assert!(a_ok, "{a_err}");
    let (ok, err) = node_end(b, Duration::from_secs(30));
    assert!(ok, "{err}");

    let whole = one_process(&dir.path().join("one.pcap"), &[]);
    assert!(std::fs::read(&out).expect("spread output") == whole, "the output differs from the one-process chain's");
    let (a_link, b_link) = (json(&a_json)["link"].clone(), json(&b_json)["link"].clone());
    let n = |l: &serde_json::Value, k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {l}"));
    // Tens of thousands of datagrams each way: some were lost both ways, and each node resent
    // at least what the other found missing.
    assert!(n(&a_link, "lost") > 0 && n(&b_link, "lost") > 0, "{a_link} {b_link}");
    assert!(n(&b_link, "resent") >= n(&a_link, "lost"), "{a_link} {b_link}");
    assert!(n(&a_link, "resent") >= n(&b_link, "lost"), "{a_link} {b_link}");
    for l in [&a_link, &b_link] {
        assert_eq!((n(l, "malformed"), n(l, "misaddressed"), n(l, "strangers")), (0, 0, 0), "{l}");
    }
}

#[test]
fn a_run_over_two_nodes_is_recorded_in_parts_that_verify_together() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spread = spread_file(dir.path(), 2, &[("portscan", "b"), ("lb", "b")]);
    let (a_rec, b_rec) = (dir.path().join("rec-a"), dir.path().join("rec-b"));
    let b_rec_s = b_rec.to_string_lossy().into_owned();
    let b_json = dir.path().join("b.json");
    let b = start_node("chains/example.yaml", &spread, "b", &b_json, &["-w", "1", "--record", &b_rec_s]);
    let (out, a_json) = (dir.path().join("spread.pcap"), dir.path().join("a.json"));
    let a = root_node(&spread, &out, &a_json, &["--record", &a_rec.to_string_lossy()]);
    assert!(a.status.success(), "{}", text(&a));
    let (ok, err) = node_end(b, Duration::from_secs(30));
    assert!(ok, "{err}");

    let part: serde_json::Value = json(&b_rec.join("record.json"));
    assert_eq!(part["part"], "b");
    assert!(part["admitted"].as_array().is_some_and(Vec::is_empty), "no input on b");
    let b_dropped = json(&b_json)["dropped_total"].as_u64().unwrap_or(0);
    assert!(b_dropped > 0, "the portscan detector on b drops");
    assert_eq!(part["drops"].as_array().map(Vec::len), Some(b_dropped as usize), "b's drops are in its part");
    let root: serde_json::Value = json(&a_rec.join("record.json"));
    assert_eq!(part["end_clock"], root["end_clock"], "b fired its end timers where a's run ended");

    let whole = sluice(&["verify", "--recorded", &a_rec.to_string_lossy(), "--part", &b_rec_s]);
    assert!(whole.status.success(), "root's record and b's part: {}", text(&whole));
    assert!(text(&whole).contains("chain output equivalence: EQUIVALENT"), "{}", text(&whole));
    // Without b's part, b's drops, events and state are missing: not the logical chain's run.
    let half = sluice(&["verify", "--recorded", &a_rec.to_string_lossy()]);
    assert_eq!(half.status.code(), Some(4), "the root's record alone: {}", text(&half));
    let wrong = sluice(&["verify", "--recorded", &b_rec_s]);
    assert_eq!(wrong.status.code(), Some(2), "a part given as the root's record: {}", text(&wrong));
    assert!(text(&wrong).contains("--part"), "{}", text(&wrong));
}

#[test]
fn a_vertex_split_over_two_nodes_is_recorded_once_by_the_root_node() {
    // nat/0 with the root on a, nat/1 and the portscan detector on b: the NAT's state is
    // shared through the served store; a records it after b fired its end timers.
    let store = common::served_store();
    split_vertex_recorded(&store.url, 2, &[("nat/1", "b"), ("portscan", "b")]);
}

#[test]
fn a_vertex_split_over_two_nodes_without_the_root_is_recorded_by_the_root_node() {
    // nat/0 on b, nat/1 and the LB on c: no NAT instance where the root is.
    let store = common::served_store();
    split_vertex_recorded(&store.url, 3, &[("nat/0", "b"), ("nat/1", "c"), ("lb", "c")]);
}

#[test]
fn a_vertex_split_over_two_nodes_with_its_state_in_redis_is_recorded_by_the_root_node() {
    let store = common::redis_store("spread-split");
    split_vertex_recorded(&store, 3, &[("nat/0", "b"), ("nat/1", "c"), ("lb", "c")]);
}

/// The two-NAT chain over `nodes` nodes placed by `place`, which splits the NAT over two
/// nodes, its state at `store`, every node recording: the root's node records the
/// NAT's state, the others leave it out of their parts, and the parts verify together.
fn split_vertex_recorded(store: &str, nodes: usize, place: &[(&str, &str)]) {
    let state = ["--mode", "async", "--store", store];
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = two_nat_chain(dir.path());
    let chain_s = chain.to_string_lossy().into_owned();
    let spread = spread_file(dir.path(), nodes, place);
    let rec = |n: &str| dir.path().join(format!("rec-{n}")).to_string_lossy().into_owned();
    let names: Vec<String> = (1..nodes).map(|i| ((b'a' + i as u8) as char).to_string()).collect();
    let mut others = Vec::new();
    for n in &names {
        let report = dir.path().join(format!("{n}.json"));
        let r = rec(n);
        let extra = [&state[..], &["-w", "1", "--record", &r]].concat();
        others.push(start_node(&chain_s, &spread, n, &report, &extra));
    }
    let (out, a_json) = (dir.path().join("spread.pcap"), dir.path().join("a.json"));
    let a = root_node_of(&chain_s, &spread, &out, &a_json, &[&state[..], &["--record", &rec("a")]].concat());
    assert!(a.status.success(), "{}", text(&a));
    for child in others {
        let (ok, err) = node_end(child, Duration::from_secs(30));
        assert!(ok, "{err}");
    }
    // The NAT is the chain's first vertex: its state is in the root's record only.
    let nat_state =
        |r: &serde_json::Value| r["state"].as_array().expect("state").iter().filter(|s| s["vertex"] == 0).count();
    let root = json(&dir.path().join("rec-a/record.json"));
    assert!(nat_state(&root) > 0, "the root's record holds the NAT's state");
    for n in &names {
        let part = json(&dir.path().join(format!("rec-{n}/record.json")));
        assert_eq!(nat_state(&part), 0, "node {n}'s part leaves the shared NAT's state out");
    }
    let mut args = vec!["verify".to_string(), "--recorded".into(), rec("a")];
    for n in &names {
        args.extend(["--part".to_string(), rec(n)]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = sluice(&args);
    assert!(v.status.success(), "{}", text(&v));
    assert!(text(&v).contains("chain output equivalence: EQUIVALENT"), "{}", text(&v));
}

#[test]
fn an_order_sensitive_detector_away_from_the_root_takes_its_input_in_entry_order() {
    // Two NATs on two workers with the root on a, the portscan detector (order-sensitive behind
    // them) and the LB on b, the Trojan detector on c: the detector hears the root's progress
    // from a. The state in a store every node reaches.
    let server = common::served_store();
    let state = ["--mode", "async", "--store", &server.url];
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = two_nat_chain(dir.path());
    let chain_s = chain.to_string_lossy().into_owned();
    let spread = spread_file(dir.path(), 3, &[("trojan", "c"), ("portscan", "b"), ("lb", "b")]);
    let rec = |n: &str| dir.path().join(format!("rec-{n}")).to_string_lossy().into_owned();
    let mut others = Vec::new();
    for n in ["b", "c"] {
        let report = dir.path().join(format!("{n}.json"));
        others.push((
            start_node(&chain_s, &spread, n, &report, &[&state[..], &["-w", "1", "--record", &rec(n)]].concat()),
            report,
        ));
    }
    let out = dir.path().join("spread.pcap");
    let a_json = dir.path().join("a.json");
    let a = root_node_of(&chain_s, &spread, &out, &a_json, &[&state[..], &["--record", &rec("a")]].concat());
    assert!(a.status.success(), "{}", text(&a));
    let mut reports = vec![json(&a_json)];
    for (child, report) in others {
        let (ok, err) = node_end(child, Duration::from_secs(30));
        assert!(ok, "{err}");
        reports.push(json(&report));
    }
    let a_link = clean_link(&reports[0], "a");
    let b_link = clean_link(&reports[1], "b");
    let c_link = clean_link(&reports[2], "c");
    // a told b and c (the Trojan detector takes its input in entry order too) how far the
    // root had got; the last report may cross the end of the run.
    let told = |l: &serde_json::Value| l["progress"].as_u64().expect("progress");
    assert!(told(&b_link) > 0 && told(&c_link) > 0, "{b_link} {c_link}");
    let heard = told(&b_link) + told(&c_link);
    assert!(heard <= told(&a_link) && heard + 4 >= told(&a_link), "{a_link} {b_link} {c_link}");
    let b_dropped = reports[1]["dropped_total"].as_u64().expect("dropped_total");
    assert!(b_dropped > 0, "the detector on b drops the scanner's packets: {}", reports[1]);

    // Output, drops and the detector's decisions are those of the logical chain.
    let v = sluice(&["verify", "--recorded", &rec("a"), "--part", &rec("b"), "--part", &rec("c")]);
    assert!(v.status.success(), "{}", text(&v));
    assert!(text(&v).contains("chain output equivalence: EQUIVALENT"), "{}", text(&v));
    // Every packet the one-process chain lets out left (which ports the two NATs handed out
    // depends on how their packets interleaved: `verify` judged that).
    let one = dir.path().join("one.pcap");
    let o = sluice(&[
        "run",
        "-c",
        &chain_s,
        "-i",
        "traces/demo.pcap",
        "-w",
        "1",
        "-q",
        "--no-pin",
        "-o",
        &one.to_string_lossy(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(sorted_frames(&out).len(), sorted_frames(&one).len(), "packets out");
}

/// A node's control endpoint in a chain spread over nodes: each node shows the statistics of
/// its own instances while traffic flows (those of other nodes marked so, and left out of its
/// metrics), refuses every live change with the reason, and takes a `slow` of one of its own
/// instances only.
#[test]
fn each_node_shows_its_part_on_its_control_endpoint_and_refuses_live_changes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spread = spread_file(dir.path(), 2, &[("portscan", "b"), ("lb", "b")]);
    let (a_ctl, b_ctl) = (free_port(), free_port());
    let token = common::CONTROL_TOKEN;
    let b = start_node(
        "chains/example.yaml",
        &spread,
        "b",
        &dir.path().join("b.json"),
        &["--control", &b_ctl, "--control-token", token],
    );
    let (s, out, a_json, a_addr) =
        (spread.clone(), dir.path().join("out.pcap"), dir.path().join("a.json"), a_ctl.clone());
    // Paced: about three seconds of traffic.
    let root = std::thread::spawn(move || {
        root_node(
            &s,
            &out,
            &a_json,
            &["--pace", "0.05", "--control", &a_addr, "--control-token", common::CONTROL_TOKEN],
        )
    });
    let chain_of = |addr: &str| {
        let (code, body) = common::http(addr, "GET", "/api/v1/chain", Some(token), "");
        (code == 200).then(|| serde_json::from_str::<serde_json::Value>(&body).expect("JSON"))
    };
    let instance = |v: &serde_json::Value, vertex: &str| {
        let vs = v["vertices"].as_array().cloned().unwrap_or_default();
        vs.into_iter().find(|x| x["name"] == vertex).map(|x| x["instances"][0].clone()).unwrap_or_default()
    };
    // Node b counts the LB's packets once traffic reaches it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let on_b = loop {
        if let Some(v) = chain_of(&b_ctl).filter(|v| instance(v, "lb")["packets_in"].as_u64().unwrap_or(0) > 0) {
            break v;
        }
        assert!(Instant::now() < deadline, "node b's endpoint never counted the LB's packets");
        std::thread::sleep(Duration::from_millis(50));
    };
    for (vertex, elsewhere) in [("nat", true), ("trojan", true), ("portscan", false), ("lb", false)] {
        assert_eq!(instance(&on_b, vertex)["elsewhere"], elsewhere, "{vertex} on b: {on_b}");
    }
    assert!(instance(&on_b, "portscan")["packets_in"].as_u64().unwrap_or(0) > 0, "{on_b}");
    assert_eq!(instance(&on_b, "nat")["packets_in"], 0, "{on_b}");
    // Node a (the root's) counts the NAT, and shows b's instances as b's.
    let on_a = chain_of(&a_ctl).expect("node a's endpoint");
    assert!(instance(&on_a, "nat")["packets_in"].as_u64().unwrap_or(0) > 0, "{on_a}");
    assert_eq!(instance(&on_a, "lb")["elsewhere"], true, "{on_a}");
    assert!(on_a["packets_in"].as_u64().unwrap_or(0) > 0, "the root's counters are on a: {on_a}");
    // b's metrics: its own instances' series only.
    let (code, metrics) = common::http(&b_ctl, "GET", "/metrics", Some(token), "");
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains(r#"sluice_instance_packets_in_total{vertex="lb",instance="0"}"#), "{metrics}");
    assert!(!metrics.contains(r#"vertex="nat""#), "{metrics}");
    // Live changes: refused with the reason, on both nodes; a `slow` of another node's
    // instance is refused too, one of its own taken. A crash of b's instance: not on a (it
    // runs on b), not on b either here (the run keeps no log to replay).
    // Scaling: on a, the spread file does not say `scalable: true`; b sends the asker to a.
    let spread_says = "a chain spread over nodes takes no live store crash";
    for (addr, crash_says, scale_says) in [
        (&a_ctl, "runs on another node", "does not say `scalable: true`"),
        (&b_ctl, "start it with --fault-tolerance", "the root's node (`a`) changes a chain spread over nodes"),
    ] {
        common::refused_actions(
            addr,
            &[
                (r#"{"crash": {"vertex": "portscan", "instance": 0}}"#, 409, crash_says),
                (r#"{"crash_store": {}}"#, 409, spread_says),
                (r#"{"scale": {"vertex": "lb", "to": 2}}"#, 409, scale_says),
            ],
        );
    }
    common::refused_actions(
        &b_ctl,
        &[(r#"{"slow": {"vertex": "nat", "instance": 0, "delay_us": [1, 2]}}"#, 409, "runs on another node")],
    );
    let (code, answer) = common::http(
        &b_ctl,
        "POST",
        "/api/v1/actions",
        Some(token),
        r#"{"slow": {"vertex": "lb", "instance": 0, "delay_us": [1, 2]}}"#,
    );
    assert_eq!(code, 200, "{answer}");
    assert_eq!(instance(&chain_of(&b_ctl).expect("b"), "lb")["slow_us"], serde_json::json!([1, 2]));
    // The run ends as any: the nodes' output is the one-process output.
    let a = root.join().expect("root's node");
    assert!(a.status.success(), "{}", text(&a));
    let (ok, err) = node_end(b, Duration::from_secs(30));
    assert!(ok, "node b: {err}");
    let one = dir.path().join("one.pcap");
    one_process(&one, &[]);
    let got = sorted_frames(&dir.path().join("out.pcap"));
    assert!(got == sorted_frames(&one), "the output differs from the one-process output ({} frames)", got.len());
}
