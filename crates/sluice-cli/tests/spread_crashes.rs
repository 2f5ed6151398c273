//! Instances of a chain spread over node processes crashed through their node's control
//! endpoint while traffic flows (of a node without the root, alone or with the root crashed
//! too, with state in a served store or a Redis Cluster, and at random; and of the root's
//! node): each is replaced and its copies replayed, the output is the one-process output,
//! every log entry is closed and the record of every node verifies.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::nodes::{
    clean_link, free_port, json, node_end, root_node, root_node_of, start_node, two_nat_chain, wait_for_packets_at,
    Node,
};
use common::{one_process, sluice, sorted_frames, spread_file, text};

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
    crashed_away_with(dir.path(), "chains/example.yaml", &store, (&place, &["nat", "portscan"]), (false, None));
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
    crashed_away_root_too(dir.path(), &chain.to_string_lossy(), (&place, &["nat/1", "lb"]), (true, None));
}

/// Random drills: the example chain or the two-NAT one over nodes a (the root's) and b, or a,
/// b and c, each instance placed on one at random (one at least away from a), and one or two
/// of the instances away from a crashed alone through their node's endpoint, in a random order
/// (in a third of the runs the root with the first, its log in the store; in half of them a
/// vertex all on a scaled out, flows moved and scaled in meanwhile): every run is failed over
/// on a and verifies. 3 runs from seed 0, or `SLUICE_DRILLS_RUNS` from `SLUICE_DRILLS_SEED` (a run
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
        // In half the runs a vertex all on a, fed from a, scales out by one instance before
        // the first crash, moves flows after it and scales back in after the last one.
        let free = common::nodes::changeable_on_a(&place);
        let scale = (draw(2) == 0 && !free.is_empty()).then(|| free[draw(free.len())]);
        eprintln!("seed {seed}: root crash {root_crash}, placed {place:?}, scaled {scale:?}");
        crashed_away_root_too(dir.path(), &chain, (&place, &crashes), (root_crash, scale));
    }
}

/// Runs `chain` over nodes a (the root's) and b (and c, if `place` names it) with `place`, and
/// crashes the instances `crashes` (`vertex` or `vertex/index`, away from a) one after the
/// other through their node's endpoint, the first one slowed beforehand; checks what the
/// tests above say.
fn crashed_away(dir: &Path, chain: &str, place: &[(&str, &str)], crashes: &[&str]) {
    crashed_away_root_too(dir, chain, (place, crashes), (false, None));
}

/// [`crashed_away`], and with `root_crash` the root crashed too through a's endpoint, just
/// after the first instance (the root's node keeping its log in the store).
fn crashed_away_root_too(
    dir: &Path,
    chain: &str,
    (place, crashes): (&[(&str, &str)], &[&str]),
    (root_crash, scale): (bool, Option<&str>),
) {
    let store = common::served_store();
    crashed_away_with(dir, chain, &store.url, (place, crashes), (root_crash, scale));
}

/// [`crashed_away`] with the state at `store`. `place` may put units on a third node, c: each
/// instance in `crashes` is then crashed through the endpoint of the node that hosts it.
fn crashed_away_with(
    dir: &Path,
    chain: &str,
    store: &str,
    (place, crashes): (&[(&str, &str)], &[&str]),
    (root_crash, scale): (bool, Option<&str>),
) {
    let nodes = if place.iter().any(|(_, n)| *n == "c") { 3 } else { 2 };
    let spread = common::spread_file_with(dir, nodes, place, if scale.is_some() { "scalable: true\n" } else { "" });
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
        a_extra.extend(["--log".to_string(), "store".into()]);
    }
    if root_crash || scale.is_some() {
        a_extra.extend(["--control", &a_ctl, "--control-token", token].iter().map(|s| s.to_string()));
    }
    // A change of a vertex all on a, asked of a's endpoint.
    let change = |body: String| {
        let (code, answer) = common::http(&a_ctl, "POST", "/api/v1/actions", Some(token), &body);
        assert_eq!(code, 200, "{body}: {answer}");
    };
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
    if let Some(v) = scale {
        change(format!(r#"{{"scale": {{"vertex": "{v}", "by": 1}}}}"#));
    }
    for (i, what) in crashes.iter().enumerate() {
        std::thread::sleep(Duration::from_millis(300));
        act(what, &format!(r#"{{"crash": {{{}}}}}"#, target(what)));
        if let Some(v) = scale {
            // Flows move while the crashed instance's replacement is replayed to, then the
            // vertex scales back in after the last crash.
            let body = if i == 0 {
                format!(r#"{{"move": {{"vertex": "{v}", "from": 0, "to": 1, "flows": 100}}}}"#)
            } else {
                format!(r#"{{"scale": {{"vertex": "{v}", "by": -1}}}}"#)
            };
            change(body);
        }
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
    if let Some(v) = scale {
        let c = common::reconfigurations(&rep);
        assert_eq!(c.first().map(|x| (x.0.as_str(), x.1.as_str())), Some(("scale_out", v)), "{c:?}");
    }
    if chain == "chains/example.yaml" && scale.is_none() {
        // One NAT: its ports do not depend on timing, so the output is the one-process output
        // byte for byte (with two, `verify` compares them up to the ports picked; a scaled
        // vertex, too, may pick other ports or backends).
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
