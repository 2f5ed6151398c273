//! Changes to a chain spread over node processes while it runs: with `scalable: true` in the
//! spread file, the root's node scales out and in, and moves flows between the instances of,
//! a vertex whose instances and feeders all run there (by the schedule and through its
//! control endpoint), while the packets they send go on to another node; the record of both
//! nodes verifies. A vertex with instances, or feeders, on another node is refused with the
//! reason, and so is a change in a spread that does not say `scalable: true`.

mod common;

use common::nodes::{clean_link, json, node_end, root_node, start_node, wait_for_packets_at};
use common::{sluice, spread_file_with, text, CONTROL_TOKEN};
use std::path::Path;
use std::time::Duration;

/// Every vertex but the NAT on b: the NAT's instances send every packet across.
const PLACE: [(&str, &str); 3] = [("portscan", "b"), ("lb", "b"), ("trojan", "b")];

/// Runs the example chain over a (the root's node) and b (what `place` puts there) with a `scalable` spread and
/// state in a served store, a's extra options `a_extra` (with `act` called once traffic flows,
/// given a's control endpoint when `a_extra` asks for one); checks both nodes ended cleanly,
/// the record verifies and the output has as many packets as one process gives. Returns a's
/// report.
fn run_scaled(
    dir: &Path,
    (place, fault_tolerance): (&[(&str, &str)], bool),
    a_extra: &[&str],
    act: impl FnOnce(&str),
) -> serde_json::Value {
    let spread = spread_file_with(dir, 2, place, "scalable: true\n");
    let store = common::served_store();
    // The same engine options on both nodes (a's `-w 1` is root_node's).
    let mut engine = vec!["--mode", "async", "--store", store.url.as_str()];
    if fault_tolerance {
        engine.push("--fault-tolerance");
    }
    let rec = |n: &str| dir.join(format!("rec-{n}")).to_string_lossy().into_owned();
    let b_rec = rec("b");
    let b_args = [&engine[..], &["-w", "1", "--record", &b_rec]].concat();
    let b = start_node("chains/example.yaml", &spread, "b", &dir.join("b.json"), &b_args);
    let ctl = common::nodes::free_port();
    let mut a_args: Vec<String> =
        [&engine[..], &["--record", &rec("a")], a_extra].concat().iter().map(|s| s.to_string()).collect();
    let live = a_extra.contains(&"--pace");
    if live {
        a_args.extend(["--control".into(), ctl.clone(), "--control-token".into(), CONTROL_TOKEN.into()]);
    }
    let (s, out, a_json) = (spread.clone(), dir.join("out.pcap"), dir.join("a.json"));
    let root = std::thread::spawn(move || {
        let args: Vec<&str> = a_args.iter().map(String::as_str).collect();
        root_node(&s, &out, &a_json, &args)
    });
    if live {
        // Traffic has crossed to b and back to the NAT's node.
        wait_for_packets_at(&ctl, "nat");
        act(&ctl);
    }
    let a = root.join().expect("the root's node");
    assert!(a.status.success(), "{}", text(&a));
    let (ok, err) = node_end(b, Duration::from_secs(30));
    assert!(ok, "node b: {err}");
    let rep = json(&dir.join("a.json"));
    clean_link(&rep, "a");
    clean_link(&json(&dir.join("b.json")), "b");
    if fault_tolerance {
        let log = &rep["fault_tolerance"];
        assert_eq!((&log["deleted"], &log["left_in_log"]), (&log["logged"], &serde_json::json!(0)), "{log}");
    }
    // Two NAT instances pick ports in another order than one: `verify` compares the output
    // up to the ports picked, and the count here.
    let one = dir.join("one.pcap");
    common::one_process(&one, &[]);
    assert_eq!(common::sorted_frames(&dir.join("out.pcap")).len(), common::sorted_frames(&one).len());
    let v = sluice(&["verify", "--recorded", &rec("a"), "--part", &rec("b")]);
    assert!(
        text(&v).contains("chain output equivalence: EQUIVALENT"),
        "{}\nrun kept in {}",
        text(&v),
        common::keep(dir)
    );
    rep
}

/// By the schedule: the NAT on the root's node scales out to two instances, flows move from
/// the first to the second, a third is added and the NAT scales back in to one, while the
/// portscan and Trojan detectors (which then take their input in entry order) and the LB run
/// on b. Without fault tolerance: the schedule on a turns it on in one process, not here (b is
/// given the same options as a).
#[test]
fn the_root_node_scales_and_moves_its_vertex_by_the_schedule_while_packets_cross_to_another_node() {
    let dir = tempfile::tempdir().expect("temp dir");
    let faults = common::schedule(dir.path(), "changes.yaml", "events:\n  - at: { packet: 3000 }\n    scale: { vertex: nat, to: 2 }\n  - at: { packet: 6000 }\n    move: { vertex: nat, from: 0, to: 1 }\n  - at: { packet: 9000 }\n    scale: { vertex: nat, to: 3 }\n  - at: { packet: 14000 }\n    scale: { vertex: nat, to: 1 }\n");
    let rep = run_scaled(dir.path(), (&PLACE, false), &["--faults", &faults], |_| {});
    let c = common::reconfigurations(&rep);
    let kinds: Vec<&str> = c.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(kinds, ["scale_out", "move", "scale_out", "scale_in"], "{c:?}");
    assert!(c[1].3 > 0, "no flow moved: {c:?}");
    assert_eq!((c[0].2, c[2].2, c[3].2), (2, 3, 1), "{c:?}");
}

/// Through the root's node's control endpoint while paced traffic flows: the NAT scales out,
/// flows move, it scales back in, and a slowed instance is cloned; changes of the vertices on
/// b are refused with the reason (409), changing nothing.
#[test]
fn the_root_node_scales_and_moves_its_vertex_when_asked_through_its_endpoint() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rep = run_scaled(dir.path(), (&PLACE, true), &["--pace", "0.05"], |ctl| {
        let act = |body: &str| {
            let (code, answer) = common::http(ctl, "POST", "/api/v1/actions", Some(CONTROL_TOKEN), body);
            assert_eq!(code, 200, "{body}: {answer}");
        };
        let pause = || std::thread::sleep(Duration::from_millis(300));
        act(r#"{"scale": {"vertex": "nat", "to": 2}}"#);
        pause();
        act(r#"{"move": {"vertex": "nat", "from": 0, "to": 1, "flows": 200}}"#);
        common::refused_actions(
            ctl,
            &[
                (r#"{"scale": {"vertex": "lb", "to": 2}}"#, 409, "`lb` has instances on node `b`"),
                (r#"{"scale": {"vertex": "portscan", "by": 1}}"#, 409, "`portscan` has instances on node `b`"),
            ],
        );
        pause();
        act(r#"{"scale": {"vertex": "nat", "to": 1}}"#);
        pause();
        // A straggler on purpose, cloned: the trial keeps the faster of the two.
        act(r#"{"slow": {"vertex": "nat", "instance": 0, "delay_us": [60, 90]}}"#);
        act(r#"{"clone": {"vertex": "nat", "instance": 0}}"#);
    });
    let c = common::reconfigurations(&rep);
    let kinds: Vec<&str> = c.iter().map(|x| x.0.as_str()).collect();
    assert_eq!(kinds[..4], ["scale_out", "move", "scale_in", "clone"], "{c:?}");
    assert!(c.iter().all(|x| x.1 == "nat"), "{c:?}");
}

/// A vertex manager on the root's node: the portscan detector (behind the NAT, both on a),
/// slowed by the schedule from 10 % to 50 % of the trace, builds a queue, and its policy adds
/// instances while the queue is long and removes them once it is short; the LB and the Trojan
/// detector run on b.
#[test]
fn a_vertex_manager_on_the_root_node_scales_its_straggling_vertex() {
    let dir = tempfile::tempdir().expect("temp dir");
    let faults = common::schedule(dir.path(), "managed.yaml", "seed: 1\nevents:\n  - at: { percent: 10 }\n    slow: { vertex: portscan, instance: 0, delay_us: [1, 3] }\n  - at: { percent: 50 }\n    slow: { vertex: portscan, instance: 0, delay_us: [0, 0] }\npolicies:\n  - { vertex: portscan, scale_out_above: { queue: 64 }, scale_in_below: { queue: 4 }, max_instances: 4, min_instances: 1 }\n");
    let place = [("lb", "b"), ("trojan", "b")];
    let rep = run_scaled(dir.path(), (&place, true), &["--faults", &faults], |_| {});
    let c = common::reconfigurations(&rep);
    assert!(c.iter().any(|x| x.0 == "scale_out" && x.1 == "portscan"), "the manager never scaled out: {c:?}");
    assert!(c.iter().all(|x| x.1 == "portscan" && (1..=4).contains(&x.2)), "{c:?}");
}

/// What cannot be changed is refused before anything runs, saying why: a vertex on another
/// node, a vertex fed from another node (changes, slowdowns and vertex managers alike), and any
/// change in a spread without `scalable: true`.
#[test]
fn changes_the_root_node_cannot_make_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::served_store();
    let schedule_file = |name: &str, body: &str| common::schedule(dir.path(), &format!("{name}.yaml"), body);
    let faults = |vertex: &str| {
        schedule_file(
            vertex,
            &format!("events:\n  - at: {{ packet: 100 }}\n    scale: {{ vertex: {vertex}, to: 2 }}\n"),
        )
    };
    let run = |spread: &Path, faults: &str| {
        let out = dir.path().join("out.pcap");
        root_node(
            spread,
            &out,
            &dir.path().join("a.json"),
            &["--mode", "async", "--store", &store.url, "--faults", faults],
        )
    };
    let scalable = spread_file_with(dir.path(), 2, &[("portscan", "b")], "scalable: true\n");
    for (vertex, says) in [
        ("portscan", "`portscan` has instances on node `b`"),
        ("lb", "`portscan`, which sends packets to `lb`, has instances on node `b`"),
    ] {
        let o = run(&scalable, &faults(vertex));
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(says), "{}", text(&o));
    }
    for (faults, says) in [
        (
            schedule_file(
                "policy",
                "policies:\n  - { vertex: portscan, scale_out_above: { queue: 64 }, max_instances: 2 }\n",
            ),
            "a vertex manager's policy: `portscan` has instances on node `b`",
        ),
        (
            schedule_file(
                "slow",
                "events:\n  - at: { packet: 10 }\n    slow: { vertex: portscan, instance: 0, delay_us: [1, 2] }\n",
            ),
            "`portscan` has instances on node `b`, whose workers",
        ),
    ] {
        let o = run(&scalable, &faults);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains(says), "{}", text(&o));
    }
    let fixed = spread_file_with(dir.path(), 2, &[("portscan", "b")], "");
    let o = run(&fixed, &faults("nat"));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("`scalable: true` in the spread file"), "{}", text(&o));
}
