//! One chain over several node processes (`sluice run --spread FILE --node NAME`): the example
//! chain with its instances on two or three processes gives the one-process chain's output
//! byte for byte, with local state and with fault tolerance over a store another process
//! serves (every root log entry closed by the notes that crossed); a node SIGKILLed mid-run
//! (of two, or of three while the third goes on) is failed over to the root's node, whose
//! replay gives the same output and decisions; nodes
//! given another chain refuse each other; a node that dies without fault tolerance ends the
//! run with an error instead of a hang; bad spreads and misplaced options are refused; and in
//! a network namespace whose firewall drops datagrams between the nodes at random, what was
//! lost is asked for again and resent, and the output is still the one-process output. A
//! vertex whose instances sit on several nodes (state in a served store or Redis) is recorded
//! once, by the root's node, after the others fired their end timers; killing a node that
//! hosts one of its instances, or several instances of several vertices, loses nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::nodes::{
    clean_link, free_port, json, node_end, root_node, root_node_of, start_node, wait_for_packets_at, Node,
};
use common::{one_process, repo, sluice, sluice_within, sorted_frames, spread_file, spread_file_with, text};

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

/// The frames of a pcap file, sorted (runs with a failover may interleave flows differently).
#[test]
fn a_node_killed_mid_run_is_failed_over_to_the_root_node() {
    // The NAT, the portscan detector and the Trojan detector (mirror copies made and taken on
    // b) on b: b's drops and alerts before it died are in its journal only.
    let place = [("nat", "b"), ("portscan", "b"), ("trojan", "b")];
    let store = common::served_store();
    killed_nodes_are_failed_over(&store.url, 2, &place, &["b"], &["nat", "portscan", "trojan"]);
}

/// The same with the state in a Redis Cluster: a batch of the NAT's updates spans the
/// cluster's nodes, and the node may die after some of them applied it.
#[test]
fn a_node_killed_mid_run_is_failed_over_with_state_in_a_redis_cluster() {
    let place = [("nat", "b"), ("portscan", "b"), ("trojan", "b")];
    let store = common::redis_cluster_store("spread-kill");
    killed_nodes_are_failed_over(&store, 2, &place, &["b"], &["nat", "portscan", "trojan"]);
}

#[test]
fn one_of_three_nodes_killed_mid_run_is_failed_over_while_the_other_goes_on() {
    // The NAT on b mirrors to the Trojan detector on c (through the root's node); c, with
    // the rest of the path, dies; b goes on and ends with the run.
    let place = [("nat", "b"), ("trojan", "c"), ("portscan", "c"), ("lb", "c")];
    let store = common::served_store();
    killed_nodes_are_failed_over(&store.url, 3, &place, &["c"], &["portscan", "lb", "trojan"]);
}

#[test]
fn two_nodes_killed_one_after_the_other_are_both_failed_over() {
    // The NAT on b dies first; its replacement on the root's node then carries the replay
    // towards the replacements of c's vertices when c dies in turn.
    let place = [("nat", "b"), ("trojan", "c"), ("portscan", "c"), ("lb", "c")];
    let store = common::served_store();
    killed_nodes_are_failed_over(&store.url, 3, &place, &["b", "c"], &["nat", "portscan", "lb", "trojan"]);
}

/// The example chain over `nodes` nodes placed by `place`, with fault tolerance and its state
/// at `store`; the `victims` are SIGKILLed one after the other, the first a third of the way into a
/// paced run, the next 500 ms later, each declared failed after 200 ms of silence. The root's
/// node fails over `failed` (in that order), closes every log entry and gives the one-process
/// output and decisions; the other nodes end well; the run's record (with the killed nodes'
/// journals) passes `verify`.
fn killed_nodes_are_failed_over(store: &str, nodes: usize, place: &[(&str, &str)], victims: &[&str], failed: &[&str]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let kills = (victims, KILLS_MS, None);
    killed_nodes_of_chain_are_failed_over(dir.path(), "chains/example.yaml", store, (nodes, place), kills, failed);
}

/// When the first victim is killed (ms after the nodes start) and how long after each the next.
const KILLS_MS: (u64, u64) = (1000, 500);

/// [`killed_nodes_are_failed_over`] for `chain`, in `dir`, the victims killed at `kills_ms`,
/// and with `root_crash_ms` the root crashed too through a's endpoint that long after the
/// first kill (the root's node keeping its log in the store). A chain other than the example's
/// (whose output and decisions are those of one process with one worker) is judged by
/// `verify` alone: with two instances of an NF that shares state, which instance handed out
/// what depends on how their packets interleaved.
fn killed_nodes_of_chain_are_failed_over(
    dir: &Path,
    chain: &str,
    store: &str,
    (nodes, place): (usize, &[(&str, &str)]),
    (victims, kills_ms, root_crash_ms): (&[&str], (u64, u64), Option<u64>),
    failed: &[&str],
) {
    let spread = spread_file_with(dir, nodes, place, "silence_ms: 200\n");
    let example = chain == "chains/example.yaml";
    let ft = ["--fault-tolerance", "--mode", "async", "--store", store, "-w", "1"];
    let a_ctl = free_port();
    let mut survivors: Vec<(Node, PathBuf)> = Vec::new();
    let mut doomed = Vec::new();
    for i in 1..nodes {
        let name = ((b'a' + i as u8) as char).to_string();
        let report = dir.join(format!("{name}.json"));
        let rec = dir.join(format!("rec-{name}")).to_string_lossy().into_owned();
        let child = start_node(chain, &spread, &name, &report, &[&ft[..], &["--record", &rec]].concat());
        if victims.contains(&name.as_str()) {
            doomed.push((victims.iter().position(|v| *v == name), child));
        } else {
            survivors.push((child, report));
        }
    }
    assert_eq!(doomed.len(), victims.len(), "every victim is a node without the root");
    doomed.sort_by_key(|(order, _)| *order);
    // Paced: the run takes about three seconds.
    let ctl = a_ctl.clone();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(kills_ms.0));
        let mut said = Vec::new();
        for (i, (_, mut child)) in doomed.into_iter().enumerate() {
            child.kill();
            let killed = Instant::now();
            if let Some(after) = root_crash_ms.filter(|_| i == 0) {
                std::thread::sleep(Duration::from_millis(after));
                let (code, answer) =
                    common::http(&ctl, "POST", "/api/v1/actions", Some(common::CONTROL_TOKEN), r#"{"crash_root": {}}"#);
                said.push(format!("crash_root: {code} {answer}"));
            }
            said.push(node_end(child, Duration::from_secs(5)).1);
            std::thread::sleep(Duration::from_millis(kills_ms.1).saturating_sub(killed.elapsed()));
        }
        said
    });
    let (out, a_json) = (dir.join("spread.pcap"), dir.join("a.json"));
    let rec = |n: &str| dir.join(format!("rec-{n}")).to_string_lossy().into_owned();
    let a_rec = rec("a");
    let mut a_args: Vec<&str> = [&ft[..5], &["--pace", "0.05", "--record", &a_rec]].concat();
    if root_crash_ms.is_some() {
        a_args.extend(["--log", "store", "--control", &a_ctl, "--control-token", common::CONTROL_TOKEN]);
    }
    let a = root_node_of(chain, &spread, &out, &a_json, &a_args);
    let victims_said = killer.join().expect("killer");
    if !a.status.success() {
        // What the surviving nodes said tells whether they or the root's node gave up first.
        let others: Vec<String> =
            survivors.into_iter().map(|(child, _)| node_end(child, Duration::from_secs(30)).1).collect();
        panic!("the root's node: {}\nthe surviving nodes: {others:?}\nthe killed nodes: {victims_said:?}", text(&a));
    }
    let rep = json(&a_json);
    // The decisions made on the root's node and on the nodes that lived.
    let mut decided: Vec<serde_json::Value> = rep["events"].as_array().cloned().unwrap_or_default();
    let mut said = vec![("a".to_string(), String::from_utf8_lossy(&a.stderr).into_owned())];
    for (child, report) in survivors {
        let (ok, err) = node_end(child, Duration::from_secs(30));
        assert!(ok, "a surviving node: {err}");
        decided.extend(json(&report)["events"].as_array().cloned().unwrap_or_default());
        said.push((report.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(), err));
    }
    said.extend(victims_said.iter().enumerate().map(|(i, s)| (format!("killed-{i}"), s.clone())));
    let link = clean_link(&rep, "a");
    assert_eq!(link["failed_nodes"], serde_json::json!(victims), "{link}");
    let got: Vec<&str> =
        rep["failovers"].as_array().expect("failovers").iter().filter_map(|f| f["vertex"].as_str()).collect();
    assert_eq!(got, failed, "{}", rep["failovers"]);
    assert!(rep["failovers"][0]["replayed"].as_u64().expect("replayed") > 0, "{}", rep["failovers"]);
    let log = &rep["fault_tolerance"];
    assert_eq!((&log["deleted"], &log["left_in_log"]), (&log["logged"], &serde_json::json!(0)), "{log}");
    let root_crashes = rep["root_crashes"].as_array().cloned().unwrap_or_default();
    assert_eq!(root_crashes.len(), usize::from(root_crash_ms.is_some()), "{root_crashes:?} {victims_said:?}");
    assert!(root_crashes.iter().all(|c| c["lost"] == false), "{root_crashes:?}");

    // Decisions only the killed nodes made (before they died): in their journals alone.
    let lost = if example {
        let one = dir.join("one.pcap");
        let one_json = dir.join("one.json");
        one_process(&one, &["--json", &one_json.to_string_lossy()]);
        let (got, want) = (sorted_frames(&out), sorted_frames(&one));
        assert!(want.len() > 60_000, "{}", want.len());
        if got != want {
            // What each node said (with RUST_LOG=sluice::copies=trace, where every copy ended).
            for (node, text) in &said {
                let _ = std::fs::write(dir.join(format!("{node}.stderr")), text);
            }
            common::differing_output(dir, &one, &got, &want, &rep["failovers"]);
        }
        // Every decision of the one-process run was made again, except those the failed node
        // made before it failed (they were made, and died with its report).
        let failed_at = |nf: &str| {
            rep["failovers"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|f| f["vertex"] == nf)
                .and_then(|f| f["at_packet"].as_u64())
        };
        let key =
            |e: &serde_json::Value| (e["clock"].clone(), e["nf"].clone(), e["kind"].clone(), e["subject"].clone());
        let made: Vec<_> = decided.iter().map(key).collect();
        let one_rep = json(&one_json);
        let wanted = one_rep["events"].as_array().expect("events");
        assert!(!wanted.is_empty());
        for e in wanted {
            let nf = e["nf"].as_str().unwrap_or_default();
            let before_on_victim = failed_at(nf).is_some_and(|at| e["clock"].as_u64().is_some_and(|c| c < at));
            assert!(made.contains(&key(e)) || before_on_victim, "decision {e} was not made again ({decided:?})");
        }
        assert!(made.len() <= wanted.len(), "decisions made twice: {decided:?}");
        wanted.iter().filter(|e| !made.contains(&key(e))).count()
    } else {
        0
    };

    // The record: the root's, the parts of the nodes that lived, and the journal the killed
    // node left (it never wrote its part).
    for victim in victims {
        assert!(!dir.join(format!("rec-{victim}/record.json")).exists(), "killed node {victim} wrote a part");
    }
    let mut args = vec!["verify".to_string(), "--recorded".into(), rec("a")];
    for i in 1..nodes {
        args.extend(["--part".to_string(), rec(&((b'a' + i as u8) as char).to_string())]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = sluice(&args);
    if !v.status.success() || !text(&v).contains("chain output equivalence: EQUIVALENT") {
        for (node, text) in &said {
            let _ = std::fs::write(dir.join(format!("{node}.stderr")), text);
        }
        panic!("the recorded run with the killed nodes' journals: {}\nrun kept in {}", text(&v), common::keep(dir));
    }
    if lost > 0 {
        // Without the journal, the decisions only the killed node made are missing.
        let mut without = vec!["verify".to_string(), "--recorded".into(), rec("a")];
        for i in 1..nodes {
            let n = ((b'a' + i as u8) as char).to_string();
            if !victims.contains(&n.as_str()) {
                without.extend(["--part".to_string(), rec(&n)]);
            }
        }
        let without: Vec<&str> = without.iter().map(String::as_str).collect();
        let w = sluice(&without);
        assert_eq!(w.status.code(), Some(4), "{lost} decisions only in the journal: {}", text(&w));
    }
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

#[test]
fn a_node_sharing_a_split_vertex_killed_mid_run_is_failed_over() {
    // nat/0 on b, nat/1 and the LB on c; c dies: the NAT stays split (nat/1's replacement on
    // a, nat/0 on b), b's part leaves the NAT's state to the root's record, and the copies
    // lost at the LB of flows through the NAT that lives are replayed through it.
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = two_nat_chain(dir.path());
    let store = common::served_store();
    let place = [("nat/0", "b"), ("nat/1", "c"), ("lb", "c")];
    let chain = chain.to_string_lossy();
    killed_nodes_of_chain_are_failed_over(
        dir.path(),
        &chain,
        &store.url,
        (3, &place),
        (&["c"], KILLS_MS, None),
        &["nat", "lb"],
    );
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

/// The example chain with two NAT instances: packets of the two reach the portscan detector
/// in any order, so it takes them in chain-entry order (CHC R4).
fn two_nat_chain(dir: &Path) -> PathBuf {
    let example = std::fs::read_to_string(repo("chains/example.yaml")).expect("example chain");
    let chain = example.replacen("    type: nat\n", "    type: nat\n    instances: 2\n", 1);
    assert_ne!(chain, example, "the NAT's line is where it was");
    let path = dir.join("two-nats.yaml");
    std::fs::write(&path, chain).expect("chain file");
    path
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

#[test]
fn the_node_after_an_order_sensitive_detector_killed_mid_run_is_failed_over() {
    // Two NATs with the root on a, the portscan detector (order-sensitive behind them) on b,
    // the LB after it on c. c dies: the LB's replacement on a replays through the detector
    // on b, which goes on taking its live packets in entry order meanwhile.
    nodes_around_the_detector_killed(&["c"], &["lb"]);
}

#[test]
fn the_node_of_an_order_sensitive_detector_killed_mid_run_is_failed_over() {
    // The same chain; b, with the detector, dies: its replacement on a reads the root's
    // progress where the root is.
    nodes_around_the_detector_killed(&["b"], &["portscan"]);
}

#[test]
fn the_nodes_after_the_root_killed_one_while_the_other_recovers_are_failed_over() {
    // The same chain; c dies, then b while the LB's replacement on a may still take its replay:
    // a replay copy bound for the LB that had not gone past b meets the detector's replacement,
    // which has no record of what its predecessor emitted (CHC: NF + NF failures recover).
    nodes_around_the_detector_killed(&["c", "b"], &["lb", "portscan"]);
}

/// Two NATs with the root on a, the portscan detector on b, the LB on c; `victims` killed.
fn nodes_around_the_detector_killed(victims: &[&str], failed: &[&str]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = two_nat_chain(dir.path());
    let store = common::served_store();
    let place = [("portscan", "b"), ("lb", "c")];
    killed_nodes_of_chain_are_failed_over(
        dir.path(),
        &chain.to_string_lossy(),
        &store.url,
        (3, &place),
        (victims, KILLS_MS, None),
        failed,
    );
}

#[test]
fn both_nats_and_the_lb_on_a_node_killed_mid_run_are_failed_over() {
    // Two NATs and the LB on b, the order-sensitive detector between them on a; b dies. The
    // copies lost with b are reported with the last of its instances to crash: reported with
    // the first, that NAT's replay (which ends at the other NAT) closed the log entries of
    // packets lost at the other before its own replay was sent, and they never left.
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = two_nat_chain(dir.path());
    let store = common::served_store();
    let place = [("nat", "b"), ("lb", "b")];
    let chain = chain.to_string_lossy();
    killed_nodes_of_chain_are_failed_over(
        dir.path(),
        &chain,
        &store.url,
        (2, &place),
        (&["b"], KILLS_MS, None),
        &["nat", "nat", "lb"],
    );
}

/// Random placements of the two-NAT chain's instances over two or three nodes, and one or
/// two of the nodes without the root killed (in a random order, at random moments), in a third
/// of the runs the root crashed too just after the first kill, state in a served store: every
/// packet left and the record verifies. 4 runs from seed 0, or
/// `SLUICE_SPREAD_RANDOM_RUNS` from `SLUICE_SPREAD_RANDOM_SEED` (a run prints its placement).
#[test]
fn random_placements_with_nodes_killed_are_failed_over() {
    for seed in common::seeds_from_env("SLUICE_SPREAD_RANDOM", 0, 4) {
        random_placement_killed(seed);
    }
}

/// One run of [`random_placements_with_nodes_killed_are_failed_over`].
fn random_placement_killed(seed: u64) {
    // xorshift64: a few draws, the same on every machine.
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut draw = move |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    let nodes = 2 + draw(2);
    let names = ["a", "b", "c"];
    // Instances in global order (what the root's node fails over, node by node).
    let instances = [("nat/0", "nat"), ("nat/1", "nat"), ("portscan", "portscan"), ("lb", "lb"), ("trojan", "trojan")];
    let on: Vec<&str> = instances.iter().map(|_| names[draw(nodes)]).collect();
    // At least one instance away from the root.
    let on: Vec<&str> = if on.iter().all(|n| *n == "a") { [&["b"], &on[1..]].concat() } else { on };
    let place: Vec<(&str, &str)> =
        instances.iter().zip(&on).filter(|(_, n)| **n != "a").map(|((what, _), n)| (*what, *n)).collect();
    let mut victims: Vec<&str> = names[1..nodes].iter().copied().filter(|n| on.contains(n)).collect();
    if victims.len() > 1 && draw(2) == 0 {
        victims.swap(0, 1);
    }
    if victims.len() > 1 && draw(2) == 0 {
        victims.truncate(1);
    }
    let failed: Vec<&str> = victims
        .iter()
        .flat_map(|v| instances.iter().zip(&on).filter(move |(_, n)| *n == v).map(|((_, vertex), _)| *vertex))
        .collect();
    // Within the paced run's three seconds, the last kill before its last half second.
    let kills_ms = (400 + 100 * draw(13) as u64, 50 + 50 * draw(12) as u64);
    // In a third of the runs the root crashes too, before, while or after the root's node
    // finds the first victim silent (the spread's silence is 200 ms).
    let root_crash_ms = (draw(3) == 0).then(|| 40 * draw(10) as u64);
    eprintln!("seed {seed}: {nodes} nodes, placed {place:?}, killed {victims:?} at {kills_ms:?} ms, root crash (ms after the first kill) {root_crash_ms:?}");
    // SLUICE_SPREAD_KEEP=1 keeps the run's files (reports, records, output) to look into.
    let temp = tempfile::tempdir().expect("temp dir");
    let (dir, _temp) = match std::env::var_os("SLUICE_SPREAD_KEEP") {
        Some(_) => (temp.keep(), None),
        None => (temp.path().to_path_buf(), Some(temp)),
    };
    eprintln!("seed {seed}: files in {}", dir.display());
    let chain = two_nat_chain(&dir);
    let store = common::served_store();
    let chain = chain.to_string_lossy();
    let kills = (&victims[..], kills_ms, root_crash_ms);
    killed_nodes_of_chain_are_failed_over(&dir, &chain, &store.url, (nodes, &place), kills, &failed);
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
    let spread_says = "a chain spread over nodes takes no live store crash";
    for (addr, crash_says) in [(&a_ctl, "runs on another node"), (&b_ctl, "start it with --fault-tolerance")] {
        common::refused_actions(
            addr,
            &[
                (r#"{"crash": {"vertex": "portscan", "instance": 0}}"#, 409, crash_says),
                (r#"{"crash_store": {}}"#, 409, spread_says),
                (r#"{"scale": {"vertex": "lb", "to": 2}}"#, 409, spread_says),
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

/// Instances of a node without the root crashed through that node's control endpoint while
/// traffic flows: the node carries each crash out and tells the root's node which copies the
/// instance held; the root's node replaces it from the store and replays them from its log, and
/// the node relays what still comes for it. The output is the one-process output, every log
/// entry is closed, and the record of both nodes (the crashed instances' decisions in b's part,
/// their replacements' in a's) verifies.
#[test]
fn instances_of_another_node_crashed_through_its_endpoint_are_replaced_on_the_root_node() {
    // The LB first (slowed, so that its crash loses packets), then the detector in front of
    // it, whose replay then crosses to the LB's replacement on a.
    let dir = tempfile::tempdir().expect("temp dir");
    crashed_away(dir.path(), "chains/example.yaml", &[("portscan", "b"), ("lb", "b")], &["lb", "portscan"]);
}

/// [`instances_of_another_node_crashed_through_its_endpoint_are_replaced_on_the_root_node`]
/// with the state in a Redis Cluster: the NAT on b crashes (its port pool, a value it has
/// alone, read as of each replayed packet's clock by Redis), then the detector.
#[test]
fn an_instance_of_another_node_crashed_with_state_in_a_redis_cluster_is_replaced_on_the_root_node() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::redis_cluster_store("spread-drill");
    let place = [("nat", "b"), ("portscan", "b"), ("lb", "b")];
    crashed_away_with(dir.path(), "chains/example.yaml", &store, (&place, &["nat", "portscan"]), false);
}

/// [`instances_of_another_node_crashed_through_its_endpoint_are_replaced_on_the_root_node`]
/// with two NATs, one on b in front of the detector there, which takes its input in entry
/// order from both (on the root's progress a tells b): the NAT on b crashes, then the detector.
#[test]
fn an_instance_in_front_of_an_order_sensitive_one_on_its_node_crashed_there_is_replaced_on_the_root_node() {
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = two_nat_chain(dir.path());
    let place = [("nat/1", "b"), ("portscan", "b"), ("lb", "b")];
    crashed_away(dir.path(), &chain.to_string_lossy(), &place, &["nat/1", "portscan"]);
}

/// The failure of docs/correctness.md's "a root crash just after another node's instance
/// crash hung a spread run", over three nodes: the second NAT on b crashes and the root with
/// it, while the Trojan detector on c takes its input in entry order on the progress a tells
/// it, through the replay and the new root's skipped clocks; then the LB on c crashes.
#[test]
fn a_root_crash_with_an_instance_of_one_node_leaves_an_order_sensitive_one_on_a_third_waiting_for_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = two_nat_chain(dir.path());
    let place = [("nat/1", "b"), ("lb", "c"), ("trojan", "c")];
    crashed_away_root_too(dir.path(), &chain.to_string_lossy(), (&place, &["nat/1", "lb"]), true);
}

/// Random drills: the example chain or the two-NAT one over nodes a (the root's) and b, or a,
/// b and c, each instance placed on one at random (one at least away from a), and one or two
/// of the instances away from a crashed alone through their node's endpoint, in a random order
/// (in a third of the runs the root with the first, its log in the store): every run is
/// failed over on a and verifies. 3 runs from seed 0, or `SLUICE_DRILLS_RUNS` from `SLUICE_DRILLS_SEED` (a run
/// prints what it does).
#[test]
fn random_placements_with_instances_crashed_alone_on_another_node_are_failed_over() {
    for seed in common::seeds_from_env("SLUICE_DRILLS", 0, 3) {
        // xorshift64, as for the random placements above.
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1;
        let mut draw = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let two_nats = draw(2) == 0;
        let mut units = vec!["nat/0", "portscan", "lb", "trojan"];
        if two_nats {
            units.push("nat/1");
        }
        let mut on_b: Vec<&str> = units.iter().copied().filter(|_| draw(2) == 0).collect();
        if on_b.is_empty() {
            on_b.push(units[draw(units.len())]);
        }
        let place: Vec<(&str, &str)> = on_b.iter().map(|u| (*u, "b")).collect();
        let mut crashes = vec![on_b[draw(on_b.len())]];
        if on_b.len() > 1 && draw(2) == 0 {
            let second = on_b.iter().copied().find(|u| *u != crashes[0]).unwrap_or(crashes[0]);
            crashes.push(second);
        }
        eprintln!("seed {seed}: two NATs {two_nats}, on b {on_b:?}, crashed {crashes:?}");
        let chain = if two_nats {
            two_nat_chain(dir.path()).to_string_lossy().into_owned()
        } else {
            "chains/example.yaml".into()
        };
        // The placement names the one NAT `nat`, the two `nat/0` and `nat/1`.
        let name = |u: &str| if two_nats { u.to_string() } else { u.trim_end_matches("/0").to_string() };
        let place: Vec<(String, &str)> = place.iter().map(|(u, n)| (name(u), *n)).collect();
        let place: Vec<(&str, &str)> = place.iter().map(|(u, n)| (u.as_str(), *n)).collect();
        let crashes: Vec<String> = crashes.iter().map(|u| name(u)).collect();
        let crashes: Vec<&str> = crashes.iter().map(String::as_str).collect();
        // In a third of the runs the root fails with the first instance (its log in the store).
        let root_crash = draw(3) == 0;
        // In half the runs a third node, c, takes some of what was drawn for b.
        let three = draw(2) == 0;
        let place: Vec<(&str, &str)> =
            place.iter().map(|(u, n)| (*u, if three && draw(2) == 0 { "c" } else { *n })).collect();
        eprintln!("seed {seed}: root crash {root_crash}, placed {place:?}");
        crashed_away_root_too(dir.path(), &chain, (&place, &crashes), root_crash);
    }
}

/// Runs `chain` over nodes a (the root's) and b (and c, if `place` names it) with `place`, and
/// crashes the instances `crashes` (`vertex` or `vertex/index`, away from a) one after the
/// other through their node's endpoint, the first one slowed beforehand; checks what the
/// tests above say.
fn crashed_away(dir: &Path, chain: &str, place: &[(&str, &str)], crashes: &[&str]) {
    crashed_away_root_too(dir, chain, (place, crashes), false);
}

/// [`crashed_away`], and with `root_crash` the root crashed too through a's endpoint, just
/// after the first instance (the root's node keeping its log in the store).
fn crashed_away_root_too(dir: &Path, chain: &str, (place, crashes): (&[(&str, &str)], &[&str]), root_crash: bool) {
    let store = common::served_store();
    crashed_away_with(dir, chain, &store.url, (place, crashes), root_crash);
}

/// [`crashed_away`] with the state at `store`. `place` may put units on a third node, c: each
/// instance in `crashes` is then crashed through the endpoint of the node that hosts it.
fn crashed_away_with(
    dir: &Path,
    chain: &str,
    store: &str,
    (place, crashes): (&[(&str, &str)], &[&str]),
    root_crash: bool,
) {
    let nodes = if place.iter().any(|(_, n)| *n == "c") { 3 } else { 2 };
    let spread = spread_file(dir, nodes, place);
    let a_ctl = free_port();
    let token = common::CONTROL_TOKEN;
    let ft = ["--fault-tolerance", "--mode", "async", "--store", store, "-w", "1"];
    let rec = |n: &str| dir.join(format!("rec-{n}")).to_string_lossy().into_owned();
    // The nodes without the root: name, control endpoint, report, process.
    let mut others: Vec<(String, String, PathBuf, Node)> = Vec::new();
    for i in 1..nodes {
        let name = ((b'a' + i as u8) as char).to_string();
        let (ctl, r, report) = (free_port(), rec(&name), dir.join(format!("{name}.json")));
        let args: Vec<&str> = [&ft[..], &["--record", &r, "--control", &ctl, "--control-token", token]].concat();
        let node = start_node(chain, &spread, &name, &report, &args);
        others.push((name, ctl, report, node));
    }
    let mut a_extra: Vec<String> =
        [&ft[..5], &["--pace", "0.05", "--record", &rec("a")]].concat().iter().map(|s| s.to_string()).collect();
    if root_crash {
        let ctl = ["--log", "store", "--control", &a_ctl, "--control-token", token];
        a_extra.extend(ctl.iter().map(|s| s.to_string()));
    }
    let (s, out, a_json, c) = (spread.clone(), dir.join("out.pcap"), dir.join("a.json"), chain.to_string());
    let root = std::thread::spawn(move || {
        let extra: Vec<&str> = a_extra.iter().map(String::as_str).collect();
        root_node_of(&c, &s, &out, &a_json, &extra)
    });
    // The node hosting `what` (placed by its own name, or by its vertex's).
    let node_of = |what: &str| {
        let vertex = what.split_once('/').map_or(what, |(v, _)| v);
        let placed = place.iter().find(|(u, _)| *u == what).or_else(|| place.iter().find(|(u, _)| *u == vertex));
        placed.map_or("a", |(_, n)| *n).to_string()
    };
    let ctl_of = |what: &str| {
        let n = node_of(what);
        others.iter().find(|o| o.0 == n).map(|o| o.1.clone()).unwrap_or_else(|| panic!("{what} is not on another node"))
    };
    let act = |what: &str, body: &str| {
        let (code, answer) = common::http(&ctl_of(what), "POST", "/api/v1/actions", Some(token), body);
        assert_eq!(code, 200, "{body}: {answer}");
    };
    let shown = |what: &str| {
        let (vertex, index) = what.split_once('/').unwrap_or((what, "0"));
        let (_, body) = common::http(&ctl_of(what), "GET", "/api/v1/chain", Some(token), "");
        let v = serde_json::from_str::<serde_json::Value>(&body).unwrap_or_default();
        let vs = v["vertices"].as_array().cloned().unwrap_or_default();
        let i: usize = index.parse().expect("an index");
        vs.into_iter().find(|x| x["name"] == vertex).map(|x| x["instances"][i].clone()).unwrap_or_default()
    };
    let target = |what: &str| {
        let (vertex, index) = what.split_once('/').unwrap_or((what, "0"));
        format!(r#""vertex": "{vertex}", "instance": {index}"#)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while shown(crashes[0])["packets_in"].as_u64().unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "{} on {} never counted packets", crashes[0], node_of(crashes[0]));
        std::thread::sleep(Duration::from_millis(50));
    }
    // The first one slowed so that packets queue up at it: its crash loses them.
    act(crashes[0], &format!(r#"{{"slow": {{{}, "delay_us": [300, 500]}}}}"#, target(crashes[0])));
    for (i, what) in crashes.iter().enumerate() {
        std::thread::sleep(Duration::from_millis(300));
        act(what, &format!(r#"{{"crash": {{{}}}}}"#, target(what)));
        if root_crash && i == 0 {
            // The root fails with the instance: its log, in the store, is read back by the new
            // root, which replays what the instance held.
            let (code, answer) = common::http(&a_ctl, "POST", "/api/v1/actions", Some(token), r#"{"crash_root": {}}"#);
            assert_eq!(code, 200, "{answer}");
        }
        // Carried out at once: the instance is the root's node's from then on, on its node's
        // endpoint too, which takes no second crash of it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while shown(what)["elsewhere"] != true {
            assert!(Instant::now() < deadline, "the crashed {what} is still {}'s: {}", node_of(what), shown(what));
            std::thread::sleep(Duration::from_millis(20));
        }
        let again = format!(r#"{{"crash": {{{}}}}}"#, target(what));
        common::refused_actions(&ctl_of(what), &[(again.as_str(), 409, "runs on another node")]);
    }
    let a = root.join();
    if !a.as_ref().is_ok_and(|a| a.status.success()) {
        // What the other nodes held is half of the story.
        let said: Vec<String> = others
            .into_iter()
            .map(|(name, _, _, mut node)| {
                node.kill();
                format!("node {name}: {}", node_end(node, Duration::from_secs(5)).1)
            })
            .collect();
        let a = a.as_ref().map_or_else(|_| "did not end in time (what it said is above)".into(), text);
        panic!("the root's node: {a}\n{}", said.join("\n"));
    }
    let a = a.expect("the root's node");
    let crashed_on = |n: &str| crashes.iter().filter(|w| node_of(w) == n).count();
    let mut parts = vec!["verify".to_string(), "--recorded".into(), rec("a")];
    for (name, _, report, node) in others {
        let (ok, err) = node_end(node, Duration::from_secs(30));
        assert!(ok, "node {name}: {err}");
        let n_rep = json(&report);
        assert_eq!(clean_link(&n_rep, &name)["crashed_instances"], crashed_on(&name), "{}", n_rep["link"]);
        let handed = n_rep["vertices"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|v| v["instances"].as_array().cloned().unwrap_or_default())
            .filter(|i| i["handed_over"] == true)
            .count();
        assert_eq!(
            handed,
            crashed_on(&name),
            "{name}'s report shows its crashed instances, up to their crash: {n_rep}"
        );
        parts.extend(["--part".to_string(), rec(&name)]);
    }
    let rep = json(&dir.join("a.json"));
    let failovers = rep["failovers"].as_array().cloned().unwrap_or_default();
    let got: Vec<String> =
        failovers.iter().map(|f| format!("{}/{}", f["vertex"].as_str().unwrap_or_default(), f["instance"])).collect();
    let want: Vec<String> =
        crashes.iter().map(|w| if w.contains('/') { w.to_string() } else { format!("{w}/0") }).collect();
    assert_eq!(got, want, "{failovers:?}");
    assert!(failovers[0]["replayed"].as_u64().is_some_and(|n| n > 0), "the first one held packets: {failovers:?}");
    assert!(failovers.iter().all(|f| f["beyond_replay"] == 0), "{failovers:?}");
    let log = &rep["fault_tolerance"];
    assert_eq!((&log["deleted"], &log["left_in_log"]), (&log["logged"], &serde_json::json!(0)), "{log}");
    let root_crashes = rep["root_crashes"].as_array().cloned().unwrap_or_default();
    assert_eq!(root_crashes.len(), usize::from(root_crash), "{root_crashes:?}");
    assert!(root_crashes.iter().all(|c| c["lost"] == false), "{root_crashes:?}");
    assert_eq!(clean_link(&rep, "a")["crashed_instances"], crashes.len(), "{}", rep["link"]);
    if chain == "chains/example.yaml" {
        // One NAT: its ports do not depend on timing, so the output is the one-process output
        // byte for byte (with two, `verify` compares them up to the ports picked).
        let one = dir.join("one.pcap");
        one_process(&one, &[]);
        let (got, want) = (sorted_frames(&dir.join("out.pcap")), sorted_frames(&one));
        if got != want {
            let _ = std::fs::write(dir.join("a.stderr"), &a.stderr);
            common::differing_output(dir, &one, &got, &want, &rep["failovers"]);
        }
    }
    let args: Vec<&str> = parts.iter().map(String::as_str).collect();
    let v = sluice(&args);
    if !text(&v).contains("chain output equivalence: EQUIVALENT") {
        let _ = std::fs::write(dir.join("a.stderr"), &a.stderr);
        panic!("{}\nrun kept in {}", text(&v), common::keep(dir));
    }
}

/// Instances of the root's node crashed through its control endpoint while traffic flows,
/// one of them (the LB) behind a vertex on another node, so that its replay crosses that
/// node: each is replaced from the store and replayed to from the root's log, as in one
/// process; the output is the one-process output and the record verifies.
#[test]
fn instances_of_the_root_node_crashed_through_its_endpoint_are_failed_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spread = spread_file(dir.path(), 2, &[("portscan", "b"), ("trojan", "b")]);
    let (a_ctl, b_ctl) = (free_port(), free_port());
    let token = common::CONTROL_TOKEN;
    let store = common::served_store();
    let ft = ["--fault-tolerance", "--mode", "async", "--store", store.url.as_str(), "-w", "1"];
    let rec = |n: &str| dir.path().join(format!("rec-{n}")).to_string_lossy().into_owned();
    let ctl = |addr: &str| ["--control".to_string(), addr.to_string(), "--control-token".into(), token.into()];
    let b_extra: Vec<String> = [&ft[..], &["--record", &rec("b")]]
        .iter()
        .flat_map(|x| x.iter().map(|s| s.to_string()))
        .chain(ctl(&b_ctl))
        .collect();
    let b_args: Vec<&str> = b_extra.iter().map(String::as_str).collect();
    let b = start_node("chains/example.yaml", &spread, "b", &dir.path().join("b.json"), &b_args);
    let mut a_extra: Vec<String> = ft[..5].iter().map(|s| s.to_string()).collect();
    a_extra.extend(["--pace".into(), "0.05".into(), "--record".into(), rec("a")]);
    a_extra.extend(ctl(&a_ctl));
    let (s, out, a_json) = (spread.clone(), dir.path().join("out.pcap"), dir.path().join("a.json"));
    let root = std::thread::spawn(move || {
        let extra: Vec<&str> = a_extra.iter().map(String::as_str).collect();
        root_node(&s, &out, &a_json, &extra)
    });
    let act = |body: &str| {
        let (code, answer) = common::http(&a_ctl, "POST", "/api/v1/actions", Some(token), body);
        assert_eq!(code, 200, "{body}: {answer}");
    };
    // Traffic has come back from b to the LB on a.
    wait_for_packets_at(&a_ctl, "lb");
    // The LB slowed so that packets queue up at it: its crash loses them, and their replay
    // goes from the root through the portscan detector on b.
    act(r#"{"slow": {"vertex": "lb", "instance": 0, "delay_us": [300, 500]}}"#);
    std::thread::sleep(Duration::from_millis(300));
    act(r#"{"crash": {"vertex": "lb", "instance": 0}}"#);
    act(r#"{"slow": {"vertex": "lb", "instance": 0, "delay_us": [0, 0]}}"#);
    std::thread::sleep(Duration::from_millis(300));
    act(r#"{"crash": {"vertex": "nat", "instance": 0}}"#);
    let a = root.join().expect("the root's node");
    assert!(a.status.success(), "{}", text(&a));
    let (ok, err) = node_end(b, Duration::from_secs(30));
    assert!(ok, "node b: {err}");
    let rep = json(&dir.path().join("a.json"));
    let failovers = rep["failovers"].as_array().cloned().unwrap_or_default();
    let got: Vec<&str> = failovers.iter().filter_map(|f| f["vertex"].as_str()).collect();
    assert_eq!(got, ["lb", "nat"], "{failovers:?}");
    assert!(failovers[0]["replayed"].as_u64().is_some_and(|n| n > 0), "the LB held packets: {failovers:?}");
    assert!(failovers.iter().all(|f| f["beyond_replay"] == 0), "{failovers:?}");
    let log = &rep["fault_tolerance"];
    assert_eq!((&log["deleted"], &log["left_in_log"]), (&log["logged"], &serde_json::json!(0)), "{log}");
    clean_link(&rep, "a");
    let one = dir.path().join("one.pcap");
    one_process(&one, &[]);
    let got = sorted_frames(&dir.path().join("out.pcap"));
    assert!(got == sorted_frames(&one), "the output differs from the one-process output ({} frames)", got.len());
    let v = sluice(&["verify", "--recorded", &rec("a"), "--part", &rec("b")]);
    assert!(text(&v).contains("chain output equivalence: EQUIVALENT"), "{}", text(&v));
}
