//! A node that was only slow, not dead: paused (SIGSTOP) past the spread's silence limit, it is
//! declared failed and fenced by the root's node, whose replacement serves its instances; woken
//! again (SIGCONT), it stops with an error that says it was fenced, and the run's output is the
//! one-process output; the store, told by the failover, refuses the paused node's instance
//! (whatever it still had to send when it woke). A stall of every node at once (a paused virtual machine) fails nothing
//! over: the time a node was not running itself does not count as the others' silence.

mod common;

use common::{one_process, repo, sluice_within, sorted_frames, spread_file_with, text};
use sluice_packet::InstanceId;
use sluice_state::{StateKey, StateOp};
use sluice_store::{Backend, Replies, Request, StoreError, StoreKey, StoreOp};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn a_node_paused_past_the_silence_limit_is_fenced_and_says_so() {
    let store = common::served_store();
    paused_node_fenced(&store.url, &|| {
        Box::new(sluice_store_remote::RemoteBackend::connect(&store.url).expect("store"))
    });
}

#[test]
fn a_node_paused_past_the_silence_limit_is_fenced_in_a_redis_cluster() {
    let store = common::redis_cluster_store("fence");
    paused_node_fenced(&store, &|| Box::new(sluice_redis::RedisBackend::connect(&store).expect("Redis Cluster")));
}

/// Node b (the NAT) paused past the silence limit of a paced run on `store` and woken: failed
/// over, fenced at the store (`backend` reaches it after the run), told so, and the output is
/// the one-process output.
fn paused_node_fenced(store: &str, backend: &dyn Fn() -> Box<dyn Backend>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let spread = spread_file_with(dir.path(), 2, &[("nat", "b")], "silence_ms: 300\n");
    let ft = ["--fault-tolerance", "--mode", "async", "--store", store, "-w", "1", "-q", "--no-pin"];
    let mut b = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(repo(""))
        .args(["run", "-c", "chains/example.yaml", "--spread"])
        .arg(&spread)
        .args(["--node", "b"])
        .args(ft)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node b");
    let pid = b.id().to_string();
    // Paused for three silence limits a second into the paced run, then woken.
    let pauser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        let signal = |s: &str| Command::new("kill").args([s, &pid]).status().is_ok_and(|st| st.success());
        assert!(signal("-STOP"), "SIGSTOP node b");
        std::thread::sleep(Duration::from_millis(900));
        assert!(signal("-CONT"), "SIGCONT node b");
    });
    let out = dir.path().join("out.pcap");
    let json = dir.path().join("a.json");
    let (out_s, json_s, spread_s) = (out.to_string_lossy(), json.to_string_lossy(), spread.to_string_lossy());
    let mut args = vec!["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--spread", &spread_s];
    args.extend(["--node", "a", "--pace", "0.05", "-o", &out_s, "--json", &json_s]);
    args.extend(ft);
    let a = sluice_within(&args, Duration::from_secs(120)).expect("the root's node ended");
    pauser.join().expect("pauser");
    assert!(a.status.success(), "{}", text(&a));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("report")).expect("JSON");
    assert_eq!(report["link"]["failed_nodes"], serde_json::json!(["b"]), "{}", report["link"]);
    assert_eq!(report["failovers"][0]["vertex"], "nat", "{}", report["failovers"]);
    // The store refuses the failed node's NAT instance (vertex 0, instance 0, started in
    // epoch 0): its replacement fenced it before reading what it had done.
    let store = backend();
    let nat = InstanceId::new(0, 0);
    let refused = refusal(&*store, nat, 0);
    assert!(matches!(refused, Some(StoreError::Fenced { fenced, .. }) if fenced > 0), "{refused:?}");
    assert_eq!(refusal(&*store, nat, u32::MAX), None, "a later epoch is served");

    // Woken, b hears the fence and stops with an error naming it: from the root's node, or
    // from the store, which refuses what b's workers send first (a flush of the batch they
    // had built when b was paused, most runs).
    let status = common::ended_within(&mut b, Duration::from_secs(30));
    let mut err = String::new();
    if let Some(mut e) = b.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    assert!(!status.success(), "a fenced node does not end well: {err}");
    let told = err.contains("declared this node failed") || err.contains("store refused instance");
    assert!(told && err.contains("fenced"), "{err}");

    let one = dir.path().join("one.pcap");
    one_process(&one, &[]);
    assert!(sorted_frames(&out) == sorted_frames(&one), "the output after the fence differs from one process's");
}

/// What the store says to instance `id` connecting in `epoch` and asking for a value: `None`
/// if it answers (a store may refuse at the connect or at the first call).
fn refusal(store: &dyn Backend, id: InstanceId, epoch: u32) -> Option<StoreError> {
    let mut conn = match store.connect_at(id, epoch) {
        Ok(c) => c,
        Err(e) => return Some(e),
    };
    let key = StoreKey { vertex: id.vertex(), object: 0, key: StateKey::Unit };
    let get = Request { id: 1, client: id, tag: None, key, op: StoreOp::State(StateOp::Get), reply: true };
    if let Err(e) = conn.send(1, vec![get].into()) {
        return Some(e);
    }
    let mut replies = Replies::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while replies.responses.is_empty() && std::time::Instant::now() < deadline {
        if let Err(e) = conn.wait(&mut replies, Duration::from_millis(100)) {
            return Some(e);
        }
    }
    assert!(!replies.responses.is_empty(), "the store neither answered nor refused");
    None
}

#[test]
fn every_node_paused_at_once_past_the_silence_limit_fails_nothing_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::served_store();
    let spread = spread_file_with(dir.path(), 2, &[("nat", "b")], "silence_ms: 300\n");
    let ft = ["--fault-tolerance", "--mode", "async", "--store", &store.url, "-w", "1", "-q", "--no-pin"];
    let node = |name: &str, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .current_dir(repo(""))
            .args(["run", "-c", "chains/example.yaml", "--spread"])
            .arg(&spread)
            .args(["--node", name])
            .args(ft)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("a node")
    };
    let mut b = node("b", &[]);
    let (out, json) = (dir.path().join("out.pcap"), dir.path().join("a.json"));
    let (out_s, json_s) = (out.to_string_lossy(), json.to_string_lossy());
    let mut a = node("a", &["-i", "traces/demo.pcap", "--pace", "0.05", "-o", &out_s, "--json", &json_s]);
    // The whole machine stops for three silence limits a second into the paced run, then
    // resumes; the root's node runs again 50 ms before the other (on a busy machine the order
    // and the delay are anybody's guess). Paused last, the root's node has read what the other
    // sent before the stop: nothing of it waits in its socket to count as heard on waking.
    let (pa, pb) = (a.id().to_string(), b.id().to_string());
    let signal = |s: &str, pid: &str| Command::new("kill").args([s, pid]).status().is_ok_and(|st| st.success());
    std::thread::sleep(Duration::from_secs(1));
    assert!(signal("-STOP", &pb) && signal("-STOP", &pa), "SIGSTOP both nodes");
    std::thread::sleep(Duration::from_millis(900));
    assert!(signal("-CONT", &pa), "SIGCONT the root's node");
    std::thread::sleep(Duration::from_millis(50));
    assert!(signal("-CONT", &pb), "SIGCONT the other node");

    let said = |child: &mut std::process::Child| {
        let status = common::ended_within(child, Duration::from_secs(120));
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        (status.success(), err)
    };
    let (a_ok, a_err) = said(&mut a);
    let (b_ok, b_err) = said(&mut b);
    assert!(a_ok && b_ok, "both nodes end well after a stall of both: a: {a_err}\nb: {b_err}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("report")).expect("JSON");
    let none = |v: &serde_json::Value| v.as_array().is_none_or(Vec::is_empty);
    assert!(report["link"].is_object(), "{report}");
    assert!(none(&report["link"]["failed_nodes"]), "{}", report["link"]);
    assert!(none(&report["failovers"]), "{}", report["failovers"]);
    let one = dir.path().join("one.pcap");
    one_process(&one, &[]);
    assert!(sorted_frames(&out) == sorted_frames(&one), "the output after the stall differs from one process's");
}
