//! Nodes of a chain spread over node processes SIGKILLed mid-run (of two, or of three while
//! the third goes on, one after the other, around an order-sensitive detector, sharing a split
//! vertex, and at random placements and moments, sometimes with a root crash): the root's node
//! fails their instances over to itself, and its replay gives the one-process output and
//! decisions; every log entry is closed and the record (with the killed nodes' journals)
//! verifies.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::nodes::{clean_link, free_port, json, node_end, root_node_of, start_node, two_nat_chain, Node};
use common::{one_process, sluice, sorted_frames, spread_file_with, text};

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
    let kills = (victims, KILLS_MS, (None, None));
    killed_nodes_of_chain_are_failed_over(dir.path(), "chains/example.yaml", store, (nodes, place), kills, failed);
}

/// The nodes killed, when (the first, ms after the nodes start; then between two), how long
/// after the first the root crashes too, and the vertex scaled meanwhile.
type Kills<'a> = (&'a [&'a str], (u64, u64), (Option<u64>, Option<&'a str>));

/// When the first victim is killed (ms after the nodes start) and how long after each the next.
const KILLS_MS: (u64, u64) = (1000, 500);

/// [`killed_nodes_are_failed_over`] for `chain`, in `dir`, the victims killed at `kills_ms`,
/// and with `root_crash_ms` the root crashed too through a's endpoint that long after the
/// first kill (the root's node keeping its log in the store), and with `scale` that vertex
/// (whole on a) scaled out before the first kill, flows moved after it and scaled in after the
/// last, through a's endpoint (the spread `scalable`). A chain other than the example's
/// (whose output and decisions are those of one process with one worker) is judged by
/// `verify` alone: with two instances of an NF that shares state, which instance handed out
/// what depends on how their packets interleaved.
fn killed_nodes_of_chain_are_failed_over(
    dir: &Path,
    chain: &str,
    store: &str,
    (nodes, place): (usize, &[(&str, &str)]),
    (victims, kills_ms, (root_crash_ms, scale)): Kills<'_>,
    failed: &[&str],
) {
    let extra = if scale.is_some() { "silence_ms: 200\nscalable: true\n" } else { "silence_ms: 200\n" };
    let spread = spread_file_with(dir, nodes, place, extra);
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
    let scaled = scale.map(str::to_string);
    let killer = std::thread::spawn(move || {
        let ask = |body: &str| {
            let (code, answer) = common::http(&ctl, "POST", "/api/v1/actions", Some(common::CONTROL_TOKEN), body);
            format!("{body}: {code} {answer}")
        };
        let mut said = Vec::new();
        // A vertex whole on a scales out halfway to the first kill, moves flows after it and
        // scales back in after the last.
        let change = |what: &str| scaled.as_ref().map(|v| ask(&what.replace("V", v)));
        std::thread::sleep(Duration::from_millis(kills_ms.0 / 2));
        said.extend(change(r#"{"scale": {"vertex": "V", "by": 1}}"#));
        std::thread::sleep(Duration::from_millis(kills_ms.0 - kills_ms.0 / 2));
        let last = doomed.len() - 1;
        for (i, (_, mut child)) in doomed.into_iter().enumerate() {
            child.kill();
            let killed = Instant::now();
            if let Some(after) = root_crash_ms.filter(|_| i == 0) {
                std::thread::sleep(Duration::from_millis(after));
                said.push(ask(r#"{"crash_root": {}}"#));
            }
            if i == 0 {
                said.extend(change(r#"{"move": {"vertex": "V", "from": 0, "to": 1, "flows": 100}}"#));
            }
            said.push(node_end(child, Duration::from_secs(5)).1);
            if i == last {
                said.extend(change(r#"{"scale": {"vertex": "V", "by": -1}}"#));
            }
            std::thread::sleep(Duration::from_millis(kills_ms.1).saturating_sub(killed.elapsed()));
        }
        said
    });
    let (out, a_json) = (dir.join("spread.pcap"), dir.join("a.json"));
    let rec = |n: &str| dir.join(format!("rec-{n}")).to_string_lossy().into_owned();
    let a_rec = rec("a");
    let mut a_args: Vec<&str> = [&ft[..5], &["--pace", "0.05", "--record", &a_rec]].concat();
    if root_crash_ms.is_some() {
        a_args.extend(["--log", "store"]);
    }
    if root_crash_ms.is_some() || scale.is_some() {
        a_args.extend(["--control", &a_ctl, "--control-token", common::CONTROL_TOKEN]);
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
    if let Some(v) = scale {
        let c = common::reconfigurations(&rep);
        assert_eq!(c.first().map(|x| (x.0.as_str(), x.1.as_str())), Some(("scale_out", v)), "{c:?} {victims_said:?}");
    }

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
        (&["c"], KILLS_MS, (None, None)),
        &["nat", "lb"],
    );
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
        (victims, KILLS_MS, (None, None)),
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
        (&["b"], KILLS_MS, (None, None)),
        &["nat", "nat", "lb"],
    );
}

/// Random placements of the two-NAT chain's instances over two or three nodes, and one or
/// two of the nodes without the root killed (in a random order, at random moments), in a third
/// of the runs the root crashed too just after the first kill, in half of them a vertex whole
/// on a scaled out, flows moved and scaled back in meanwhile, state in a served store: every
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
    // In half the runs a vertex whole on a and fed from a scales out and in meanwhile.
    let free = common::nodes::changeable_on_a(&place);
    let scale = (draw(2) == 0 && !free.is_empty()).then(|| free[draw(free.len())]);
    eprintln!("seed {seed}: {nodes} nodes, placed {place:?}, killed {victims:?} at {kills_ms:?} ms, root crash (ms after the first kill) {root_crash_ms:?}, scaled {scale:?}");
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
    let kills = (&victims[..], kills_ms, (root_crash_ms, scale));
    killed_nodes_of_chain_are_failed_over(&dir, &chain, &store.url, (nodes, &place), kills, &failed);
}
