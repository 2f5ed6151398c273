//! Membership and leader election against a real etcd server (installed by
//! `scripts/test-all.sh`), started here on loopback ports of its own and stopped by its process.

use sluice_cluster::{
    answer_run_request, ask_crash, ask_run, ask_unit, assignment, campaign, crash_asked, leader, nodes,
    publish_running, running, stored_placement, take_run_requests, wait_for_answer, watch_nodes, Controller, Demand,
    Etcd, EtcdError, LocalEtcd, Membership, NodeChange, NodeInfo, RunAnswer, Unit,
};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One etcd member on loopback with its data in a temporary directory, killed when dropped.
struct EtcdServer {
    server: LocalEtcd,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn start_etcd() -> EtcdServer {
    start_etcd_on(free_port())
}

fn start_etcd_on(client: u16) -> EtcdServer {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = LocalEtcd::start_on(&dir.path().join("data"), client)
        .unwrap_or_else(|e| panic!("{e} (run the suite through scripts/test-all.sh, which installs it)"));
    EtcdServer { server, _dir: dir }
}

fn client_of(s: &EtcdServer) -> Etcd {
    s.server.client().expect("client")
}

fn node(id: &str) -> NodeInfo {
    NodeInfo { id: id.into(), addr: format!("127.0.0.1:{}", 6000 + id.len()), roles: vec!["nf".into()] }
}

/// Membership changes of `cluster` from revision `from`, as a thread watching them sends them.
fn watch_changes(etcd: &Etcd, cluster: &str, from: i64) -> std::sync::mpsc::Receiver<NodeChange> {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut w = watch_nodes(etcd, cluster, from).expect("watch");
    std::thread::spawn(move || {
        while let Some(Ok(changes)) = w.next_changes() {
            for c in changes {
                if tx.send(c).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[test]
fn nodes_join_and_leave_and_a_watcher_sees_both() {
    let server = start_etcd();
    let etcd = client_of(&server);
    let (before, rev) = nodes(&etcd, "c1").expect("nodes");
    assert!(before.is_empty());
    let seen = watch_changes(&etcd, "c1", rev + 1);
    let a = Membership::join(&etcd, "c1", &node("a"), Duration::from_secs(5)).expect("join a");
    let b = Membership::join(&etcd, "c1", &node("b"), Duration::from_secs(5)).expect("join b");
    let (now, _) = nodes(&etcd, "c1").expect("nodes");
    assert_eq!(now, vec![node("a"), node("b")]);
    // One id, one live node.
    assert!(matches!(
        Membership::join(&etcd, "c1", &node("a"), Duration::from_secs(5)),
        Err(sluice_cluster::ClusterError::NodeIdTaken(id)) if id == "a"
    ));
    // Other clusters are apart.
    assert!(nodes(&etcd, "c2").expect("nodes").0.is_empty());
    a.leave().expect("leave");
    let wait = Duration::from_secs(10);
    assert_eq!(seen.recv_timeout(wait).ok(), Some(NodeChange::Joined(node("a"))));
    assert_eq!(seen.recv_timeout(wait).ok(), Some(NodeChange::Joined(node("b"))));
    assert_eq!(seen.recv_timeout(wait).ok(), Some(NodeChange::Left { id: "a".into() }));
    assert_eq!(nodes(&etcd, "c1").expect("nodes").0, vec![node("b")]);
    assert!(!b.is_lost());
    // Leases are renewed: after three TTLs b is still there.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(nodes(&etcd, "c1").expect("nodes").0, vec![node("b")], "b's lease was kept alive");
    b.leave().expect("leave");
}

#[test]
fn a_crash_drill_is_asked_of_a_live_node_only_and_goes_with_it() {
    let server = start_etcd();
    let etcd = client_of(&server);
    assert!(!ask_crash(&etcd, "c1", "a").expect("ask"), "no live node `a` yet");
    let a = Membership::join(&etcd, "c1", &node("a"), Duration::from_secs(5)).expect("join a");
    let ab = Membership::join(&etcd, "c1", &node("ab"), Duration::from_secs(5)).expect("join ab");
    assert!(!crash_asked(&etcd, "c1", "a").expect("read"));
    assert!(ask_crash(&etcd, "c1", "a").expect("ask"));
    assert!(crash_asked(&etcd, "c1", "a").expect("read"));
    // Only that node, of that cluster (`ab` shares the prefix).
    assert!(!crash_asked(&etcd, "c1", "ab").expect("read"));
    assert!(!crash_asked(&etcd, "c2", "a").expect("read"));
    // The request went with the node's lease: `a` registered again is not crashed by it.
    a.leave().expect("leave");
    assert!(!crash_asked(&etcd, "c1", "a").expect("read"));
    let again = Membership::join(&etcd, "c1", &node("a"), Duration::from_secs(5)).expect("join a again");
    assert!(!crash_asked(&etcd, "c1", "a").expect("read"));
    assert!(ask_crash(&etcd, "c1", "a b").is_err(), "a bad node id is refused");
    again.leave().expect("leave");
    ab.leave().expect("leave");
}

#[test]
fn a_live_change_is_asked_of_a_live_node_taken_once_in_order_and_answered() {
    let server = start_etcd();
    let etcd = client_of(&server);
    let scale = serde_json::json!({ "scale": { "vertex": "nat", "to": 2 } });
    assert_eq!(ask_run(&etcd, "c1", "a", &scale).expect("ask"), None, "no live node `a` yet");
    let a = Membership::join(&etcd, "c1", &node("a"), Duration::from_secs(5)).expect("join a");
    let ab = Membership::join(&etcd, "c1", &node("ab"), Duration::from_secs(5)).expect("join ab");
    let moved = serde_json::json!({ "move": { "vertex": "nat", "from": 0, "to": 1 } });
    let first = ask_run(&etcd, "c1", "a", &scale).expect("ask").expect("a is live");
    let second = ask_run(&etcd, "c1", "a", &moved).expect("ask").expect("a is live");
    assert_ne!(first, second);
    // Nothing for another node with the same prefix, nor in another cluster.
    assert!(take_run_requests(&etcd, "c1", "ab").expect("take").is_empty());
    assert!(take_run_requests(&etcd, "c2", "a").expect("take").is_empty());
    let taken = take_run_requests(&etcd, "c1", "a").expect("take");
    let got: Vec<(&str, &serde_json::Value)> = taken.iter().map(|c| (c.id.as_str(), &c.action)).collect();
    assert_eq!(got, [(first.as_str(), &scale), (second.as_str(), &moved)], "in the order asked");
    assert!(take_run_requests(&etcd, "c1", "a").expect("take").is_empty(), "each is taken once");
    // The answer reaches the asker once; none comes for the other request.
    let answer = RunAnswer { status: 409, body: serde_json::json!({ "error": "why" }) };
    answer_run_request(&etcd, "c1", "a", &first, &answer).expect("answer");
    let short = Duration::from_millis(200);
    assert_eq!(wait_for_answer(&etcd, "c1", "a", &first, short).expect("wait"), Some(answer));
    assert_eq!(wait_for_answer(&etcd, "c1", "a", &first, short).expect("wait"), None, "read once");
    let started = Instant::now();
    assert_eq!(wait_for_answer(&etcd, "c1", "a", &second, short).expect("wait"), None);
    assert!(started.elapsed() >= short, "it waited for the answer");
    // A request that is not JSON is answered 400 by the taker, not handed on.
    let lease = {
        let (kvs, _) = etcd.get_prefix("/sluice/c1/nodes/a").expect("get");
        kvs.iter().find(|kv| kv.key == "/sluice/c1/nodes/a").map(|kv| kv.lease).expect("a's lease")
    };
    etcd.put("/sluice/c1/ask/a/bad", b"{not json", lease).expect("put");
    assert!(take_run_requests(&etcd, "c1", "a").expect("take").is_empty());
    let bad = wait_for_answer(&etcd, "c1", "a", "bad", short).expect("wait").expect("answered");
    assert_eq!(bad.status, 400, "{bad:?}");
    // Requests go with the node's lease.
    ask_run(&etcd, "c1", "a", &scale).expect("ask").expect("a is live");
    a.leave().expect("leave");
    let again = Membership::join(&etcd, "c1", &node("a"), Duration::from_secs(5)).expect("join a again");
    assert!(take_run_requests(&etcd, "c1", "a").expect("take").is_empty(), "nothing stale for a new `a`");
    assert!(ask_run(&etcd, "c1", "a b", &scale).is_err(), "a bad node id is refused");
    again.leave().expect("leave");
    ab.leave().expect("leave");
}

#[test]
fn what_a_node_runs_now_is_filed_under_its_lease() {
    let server = start_etcd();
    let etcd = client_of(&server);
    let nat = |index| Unit::Instance { vertex: "nat".into(), index };
    assert!(!publish_running(&etcd, "c1", "a", &[nat(0)]).expect("publish"), "no live node `a` yet");
    assert!(running(&etcd, "c1").expect("running").is_empty());
    let a = Membership::join(&etcd, "c1", &node("a"), Duration::from_secs(5)).expect("join a");
    let b = Membership::join(&etcd, "c1", &node("b"), Duration::from_secs(5)).expect("join b");
    assert!(publish_running(&etcd, "c1", "a", &[Unit::Root(0), nat(0)]).expect("publish"));
    assert!(publish_running(&etcd, "c1", "b", &[]).expect("publish"));
    // A scale-out: the latest list holds.
    assert!(publish_running(&etcd, "c1", "a", &[Unit::Root(0), nat(0), nat(1)]).expect("publish"));
    let now = running(&etcd, "c1").expect("running");
    assert_eq!(now.get("a"), Some(&vec![Unit::Root(0), nat(0), nat(1)]));
    assert_eq!(now.get("b"), Some(&Vec::new()));
    assert!(running(&etcd, "c2").expect("running").is_empty(), "another cluster's are apart");
    a.leave().expect("leave");
    let now = running(&etcd, "c1").expect("running");
    assert_eq!(now.keys().collect::<Vec<_>>(), ["b"], "a's record went with its lease");
    assert!(publish_running(&etcd, "c1", "a b", &[]).is_err(), "a bad node id is refused");
    b.leave().expect("leave");
}

/// Run by `a_killed_node_leaves_when_its_lease_expires` as a separate process, which it then
/// kills with SIGKILL; alone it has nothing to do.
#[test]
#[ignore = "the node process of a_killed_node_leaves_when_its_lease_expires"]
fn node_process() {
    let endpoint = std::env::var("SLUICE_TEST_ETCD").expect("started by a_killed_node_leaves_when_its_lease_expires");
    let etcd = Etcd::new(&endpoint, Duration::from_secs(3)).expect("client");
    let _m = Membership::join(&etcd, "kill", &node("doomed"), Duration::from_secs(2)).expect("join");
    println!("joined");
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

#[test]
fn a_killed_node_leaves_when_its_lease_expires() {
    let server = start_etcd();
    let etcd = client_of(&server);
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--exact", "node_process", "--ignored", "--nocapture"])
        .env("SLUICE_TEST_ETCD", server.server.endpoint())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the node process");
    let deadline = Instant::now() + Duration::from_secs(20);
    let rev = loop {
        let (n, rev) = nodes(&etcd, "kill").expect("nodes");
        if n == vec![node("doomed")] {
            break rev;
        }
        assert!(Instant::now() < deadline, "the node never joined");
        std::thread::sleep(Duration::from_millis(50));
    };
    let seen = watch_changes(&etcd, "kill", rev + 1);
    // Alive for longer than its TTL: it renews.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(nodes(&etcd, "kill").expect("nodes").0, vec![node("doomed")]);
    child.kill().expect("SIGKILL the node");
    let killed = Instant::now();
    let _ = child.wait();
    let change = seen.recv_timeout(Duration::from_secs(10)).ok();
    let took = killed.elapsed();
    assert_eq!(change, Some(NodeChange::Left { id: "doomed".into() }));
    // Gone within its TTL (2 s), plus etcd's lease check granularity.
    assert!(took <= Duration::from_millis(4500), "noticed {took:?} after the kill");
    assert!(nodes(&etcd, "kill").expect("nodes").0.is_empty());
}

#[test]
fn one_leader_at_a_time_and_the_next_takes_over_when_it_dies() {
    let server = start_etcd();
    let etcd = client_of(&server);
    assert_eq!(leader(&etcd, "c", "controller").expect("leader"), None);
    let first = campaign(&etcd, "c", "controller", "ctl-1", Duration::from_secs(2)).expect("campaign");
    assert_eq!(leader(&etcd, "c", "controller").expect("leader").as_deref(), Some("ctl-1"));
    let e2 = etcd.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let second = campaign(&e2, "c", "controller", "ctl-2", Duration::from_secs(2));
        let _ = tx.send((second, Instant::now()));
    });
    // The second candidate waits while the first leads and renews.
    assert!(rx.recv_timeout(Duration::from_secs(4)).is_err(), "two leaders at once");
    assert_eq!(leader(&etcd, "c", "controller").expect("leader").as_deref(), Some("ctl-1"));
    // The first dies (stops renewing without resigning): the second leads within the TTL.
    let died = Instant::now();
    first.abandon();
    let (second, at) = rx.recv_timeout(Duration::from_secs(10)).expect("the second candidate took over");
    let second = second.expect("campaign");
    assert!(at.duration_since(died) <= Duration::from_millis(4500), "took over after {:?}", at.duration_since(died));
    assert_eq!(leader(&etcd, "c", "controller").expect("leader").as_deref(), Some("ctl-2"));
    // Resigning frees the role at once.
    second.resign().expect("resign");
    assert_eq!(leader(&etcd, "c", "controller").expect("leader"), None);
}

#[test]
fn unreachable_etcd_and_bad_names_are_clear_errors() {
    let port = free_port();
    let etcd = Etcd::new(&format!("http://127.0.0.1:{port}"), Duration::from_secs(1)).expect("client");
    let e = etcd.grant(Duration::from_secs(1)).expect_err("nothing listens there");
    assert!(matches!(e, EtcdError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "the error names the endpoint: {e}");
    let e = Membership::join(&etcd, "c", &node("a/b"), Duration::from_secs(1)).expect_err("a bad id");
    assert!(e.to_string().contains("node id `a/b`"), "{e}");
}

#[test]
fn a_node_retries_until_etcd_is_there_and_gives_up_when_told() {
    let port = free_port();
    let etcd = Etcd::new(&format!("http://127.0.0.1:{port}"), Duration::from_secs(1)).expect("client");
    // Nobody there and a short patience: the error says where it tried.
    let started = Instant::now();
    let e = Membership::join_retrying(&etcd, "r", &node("a"), Duration::from_secs(2), Duration::from_millis(700))
        .expect_err("etcd is not running");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(started.elapsed() >= Duration::from_millis(300), "it retried before giving up");
    // etcd comes up after the node started trying: the node joins.
    let e2 = etcd.clone();
    let joining = std::thread::spawn(move || {
        Membership::join_retrying(&e2, "r", &node("a"), Duration::from_secs(2), Duration::from_secs(30))
    });
    std::thread::sleep(Duration::from_millis(1500));
    let _server = start_etcd_on(port);
    let m = joining.join().expect("thread").expect("joined once etcd was up");
    assert_eq!(nodes(&etcd, "r").expect("nodes").0, vec![node("a")]);
    m.leave().expect("leave");
}

/// Waits until `cond` holds, up to 10 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_controller_places_units_replaces_a_departed_node_s_and_a_new_leader_moves_nothing() {
    let server = start_etcd();
    let etcd = client_of(&server);
    let a = NodeInfo { id: "a".into(), addr: "10.0.0.1:6081".into(), roles: vec!["root".into(), "nf".into()] };
    let b = NodeInfo { id: "b".into(), addr: "10.0.0.2:6081".into(), roles: vec!["nf".into()] };
    let _ma = Membership::join(&etcd, "ctl", &a, Duration::from_secs(2)).expect("join a");
    let mb = Membership::join(&etcd, "ctl", &b, Duration::from_secs(2)).expect("join b");
    let demand = Demand { roots: 1, vertices: vec![("nat".into(), 2), ("fw".into(), 1)] };
    let controller = |name: &str| Controller {
        cluster: "ctl".into(),
        name: name.into(),
        demand: demand.clone(),
        ttl: Duration::from_secs(2),
        stats: Arc::default(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (c1, e1, s1) = (controller("ctl-1"), etcd.clone(), stop.clone());
    let stats = c1.stats.clone();
    let first = std::thread::spawn(move || c1.run(&e1, &s1));
    eventually("four units placed over a and b", || {
        let p = stored_placement(&etcd, "ctl").unwrap_or_default();
        p.len() == 4 && p.values().any(|n| n == "b")
    });
    assert!(assignment(&etcd, "ctl", "a").expect("a's units").contains(&Unit::Root(0)), "only a hosts roots");
    // A request of one instance (a crash drill), or of the root, is asked of the node the
    // placement gives it, taken once.
    let fw = Unit::Instance { vertex: "fw".into(), index: 0 };
    let fw_on = stored_placement(&etcd, "ctl").expect("placement")[&fw].clone();
    let crash = serde_json::json!({ "crash": { "vertex": "fw", "instance": 0 } });
    let (node, id) = ask_unit(&etcd, "ctl", &fw, &crash).expect("ask").expect("placed on a live node");
    assert_eq!(node, fw_on);
    let other = if fw_on == "a" { "b" } else { "a" };
    assert!(take_run_requests(&etcd, "ctl", other).expect("take").is_empty(), "asked of {fw_on} only");
    let taken = take_run_requests(&etcd, "ctl", &fw_on).expect("take");
    assert_eq!(taken.iter().map(|r| (&r.id, &r.action)).collect::<Vec<_>>(), [(&id, &crash)]);
    assert!(take_run_requests(&etcd, "ctl", &fw_on).expect("take").is_empty(), "taken once");
    let root = serde_json::json!({ "crash_root": {} });
    let (node, _) = ask_unit(&etcd, "ctl", &Unit::Root(0), &root).expect("ask").expect("placed");
    assert_eq!(node, "a", "the root is on a");
    assert_eq!(take_run_requests(&etcd, "ctl", "a").expect("take").len(), 1);
    let unplaced = Unit::Instance { vertex: "fw".into(), index: 7 };
    assert_eq!(ask_unit(&etcd, "ctl", &unplaced, &crash).expect("ask"), None, "no such instance placed");
    assert_eq!(ask_unit(&etcd, "ctl", &Unit::Root(3), &root).expect("ask"), None, "no such root placed");
    let bad = Unit::Instance { vertex: "f w".into(), index: 0 };
    assert!(ask_unit(&etcd, "ctl", &bad, &crash).is_err(), "a bad vertex name is refused");
    // b leaves: its units go to a.
    mb.leave().expect("b leaves");
    eventually("everything on a", || {
        let p = stored_placement(&etcd, "ctl").unwrap_or_default();
        p.len() == 4 && p.values().all(|n| n == "a")
    });
    assert!(assignment(&etcd, "ctl", "b").expect("b's units").is_empty());
    // What the leader says of itself (its metrics): one term, leading, two placements at least
    // (over a and b, then on a alone), the four units, one live node now.
    eventually("the leader's statistics show a alone", || stats.nodes_live.load(Ordering::Acquire) == 1);
    assert!(stats.leading.load(Ordering::Acquire));
    assert_eq!(stats.terms.load(Ordering::Acquire), 1);
    assert!(stats.placements.load(Ordering::Acquire) >= 2);
    assert_eq!(stats.units_placed.load(Ordering::Acquire), 4);
    let before = stored_placement(&etcd, "ctl").expect("placement");
    // The leader stops; a second controller takes over from the stored placement.
    stop.store(true, Ordering::Release);
    first.join().expect("thread").expect("the first controller resigned cleanly");
    assert!(!stats.leading.load(Ordering::Acquire), "resigned");
    let stop2 = Arc::new(AtomicBool::new(false));
    let (c2, e2, s2) = (controller("ctl-2"), etcd.clone(), stop2.clone());
    let second = std::thread::spawn(move || c2.run(&e2, &s2));
    eventually("ctl-2 leads", || leader(&etcd, "ctl", "controller").ok().flatten().as_deref() == Some("ctl-2"));
    // A node joins: nothing placed moves, since nothing needs to.
    let c = NodeInfo { id: "c".into(), addr: "10.0.0.3:6081".into(), roles: vec!["nf".into()] };
    let _mc = Membership::join(&etcd, "ctl", &c, Duration::from_secs(2)).expect("join c");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stored_placement(&etcd, "ctl").expect("placement"), before);
    stop2.store(true, Ordering::Release);
    second.join().expect("thread").expect("resigned");
}

/// An etcd that cannot start (its client port is taken) is reported as such at once, with what
/// it said, instead of after the whole wait for an answer (found when a test's etcd "did not
/// answer within 20 s" under load, with nothing to tell why).
#[test]
fn an_etcd_that_cannot_start_says_why_at_once() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("addr").port();
    let dir = tempfile::tempdir().expect("temp dir");
    let t0 = Instant::now();
    let err = LocalEtcd::start_on(&dir.path().join("data"), port).expect_err("the port is taken");
    assert!(t0.elapsed() < Duration::from_secs(15), "reported after {:?}: {err}", t0.elapsed());
    let text = err.to_string();
    assert!(text.contains("exited"), "{text}");
    assert!(text.contains("address already in use") || text.contains("bind"), "etcd's own words: {text}");
    // A start on a free port of its own still works.
    let started = LocalEtcd::start(&dir.path().join("fresh")).expect("etcd on free ports");
    assert!(started.client().expect("client").grant(Duration::from_secs(1)).is_ok());
}
