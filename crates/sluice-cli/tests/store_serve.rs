//! `sluice store serve`: the embedded store in a process of its own, used by `sluice run`
//! processes over TCP (`--store sluice://HOST:PORT?token=T&space=S`). Every bundled fault
//! schedule, store crashes included, stays equivalent with the store in another process, two
//! runs at a time on one server in spaces of their own; bad tokens, bad URLs and a server that
//! dies are clear errors; a store another run left its state in is refused unless emptied
//! first (`--fresh-store`), served or on Redis.

mod common;

use common::{control_endpoint, http, recorded_run, schedules, sluice, sluice_within, text, CONTROL_TOKEN};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TOKEN: &str = "t0ken";

/// A running `sluice store serve`, killed when dropped.
struct Served {
    child: Child,
    /// `HOST:PORT`.
    addr: String,
    /// Its control endpoint's `HOST:PORT` (metrics).
    control: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(tag: &str) -> Served {
    let token_file = std::env::temp_dir().join(format!("sluice-store-token-{}-{tag}", std::process::id()));
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["store", "serve", "--listen", "127.0.0.1:0", "--threads", "2", "--token-file"])
        .arg(&token_file)
        .args(["--control", "0", "--control-token", CONTROL_TOKEN])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice store serve");
    let (control, _) = control_endpoint(&mut child);
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read the address");
    let addr = line.split("sluice://").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or_default().to_string();
    assert!(addr.starts_with("127.0.0.1:"), "{line}");
    assert!(line.contains("token required"), "{line}");
    Served { child, addr, control }
}

/// The value of `metric` in the server's Prometheus text.
fn metric(server: &Served, metric: &str) -> u64 {
    let (status, body) = http(&server.control, "GET", "/metrics", Some(CONTROL_TOKEN), "");
    assert_eq!(status, 200, "{body}");
    let line =
        body.lines().find(|l| l.starts_with(&format!("{metric} "))).unwrap_or_else(|| panic!("{metric}: {body}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

#[test]
fn every_fault_schedule_is_equivalent_with_the_store_in_another_process() {
    let server = serve("faults");
    let files = schedules("faults");
    assert!(files.len() >= 7, "{files:?}");
    // Two runs at a time share the server, each in a space of its own.
    std::thread::scope(|scope| {
        for pair in files.chunks(2) {
            let runs: Vec<_> = pair
                .iter()
                .map(|f| {
                    let addr = &server.addr;
                    scope.spawn(move || {
                        let body = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                        let name = format!("served-{}", f.file_stem().map(|s| s.to_string_lossy()).unwrap_or_default());
                        let url = format!("sluice://{addr}?token={TOKEN}&space={name}");
                        let mut extra = vec!["-w", "2", "--store", &url];
                        if body.contains("crash_root") {
                            extra.extend(["--log", "store"]);
                        }
                        let path = f.to_string_lossy().into_owned();
                        let report =
                            recorded_run(&name, ("chains/example.yaml", "traces/demo.pcap", "20000"), &path, &extra);
                        assert_eq!(report["packets_in"], 20000, "{name}: {report}");
                        let store = report["state"].as_str().unwrap_or_default().to_string();
                        (name, store)
                    })
                })
                .collect();
            for r in runs {
                let (name, store) = r.join().expect("a run's thread");
                assert!(
                    store.contains("sluice://") && store.contains(&format!("space `{name}`")),
                    "{name}: store {store}"
                );
            }
        }
    });
    // Its metrics saw them: a space per run, kept; many connections, all closed; nothing refused.
    assert_eq!(metric(&server, "sluice_store_server_spaces"), files.len() as u64);
    assert!(metric(&server, "sluice_store_server_instance_connections_total") >= 4 * files.len() as u64);
    assert!(metric(&server, "sluice_store_server_batches_total") > 1000);
    assert_eq!(metric(&server, "sluice_store_server_refused_total"), 0);
    assert_eq!(metric(&server, "sluice_store_server_malformed_total"), 0);
}

#[test]
fn a_wrong_token_a_bad_url_and_a_dead_server_are_clear_errors() {
    let mut server = serve("errors");
    let run = |url: &str| sluice(&["run", "-c", "chains/nat.yaml", "-i", "traces/demo.pcap", "-q", "--store", url]);
    let o = run(&format!("sluice://{}?token=wrong", server.addr));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("wrong token"), "{}", text(&o));
    assert_eq!(metric(&server, "sluice_store_server_refused_total"), 1);
    let o = run(&format!("sluice://{}?space=a/b&token={TOKEN}", server.addr));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("space name `a/b`"), "{}", text(&o));
    for bad in ["sluice://nowhere", "sluice://127.0.0.1:1?colour=red", "memcached://x:1"] {
        let o = run(bad);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", text(&o));
        assert!(text(&o).contains("--store"), "{bad}: {}", text(&o));
    }
    // The server dies under a run: the run ends with an error naming the store, not a hang.
    let url = format!("sluice://{}?token={TOKEN}&space=dies", server.addr);
    let args = ["run", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--pace", "0.05", "--fault-tolerance"];
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let _ = server.child.kill();
        server
    });
    let o =
        sluice_within(&[&args[..], &["-q", "--store", &url]].concat(), Duration::from_secs(60)).expect("the run ended");
    drop(killer.join());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("store unavailable: store server 127.0.0.1:"), "{}", text(&o));
}

/// Both runs number their packets from 1, and the store keeps what each clock's updates did
/// for replays: a run on a store another run left its state in would be answered as that
/// run's replays (with two NATs sharing a port pool, a second trace got other ports than on
/// an empty store). It is refused, naming the run that holds the store; `--fresh-store`
/// empties the store first and gives what a run on an empty store gives.
#[test]
fn a_store_another_run_left_its_state_in_is_refused_unless_emptied_first() {
    let server = serve("reused");
    let dir = tempfile::tempdir().expect("temp dir");
    let chain = common::nodes::two_nat_chain(dir.path()).to_string_lossy().into_owned();
    let trace = |seed: &str| {
        let path = dir.path().join(format!("g{seed}.pcap")).to_string_lossy().into_owned();
        let o = sluice(&["gen", "-w", "200x20", "--seed", seed, "-q", "-o", &path]);
        assert!(o.status.success(), "{}", text(&o));
        path
    };
    let (first, second) = (trace("1"), trace("2"));
    let url = |space: &str| format!("sluice://{}?token={TOKEN}&space={space}", server.addr);
    // One packet in the chain at a time: which of the two NATs takes which port from their
    // shared pool then follows the input, not the threads' timing (with 32 packets in flight
    // about one run in eight took them in another order — equivalent, docs/correctness.md, but
    // not byte-equal, which is what this test compares).
    let run = |input: &str, space: &str, out: &str, extra: &[&str]| {
        let out = dir.path().join(out).to_string_lossy().into_owned();
        let one_at_a_time = ["--window", "1", "--batch", "1"];
        let args = ["run", "-c", &chain, "-i", input, "-w", "1", "-q", "--no-pin", "--fault-tolerance", "-o", &out];
        let args = [&args[..], &one_at_a_time[..]].concat();
        (sluice(&[&args[..], &["--store", &url(space)], extra].concat()), out)
    };
    let (o, _) = run(&first, "used", "first.pcap", &[]);
    assert!(o.status.success(), "{}", text(&o));
    let (o, _) = run(&second, "used", "refused.pcap", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let why = text(&o);
    assert!(why.contains("already holds the state of another run (chain `example`"), "{why}");
    assert!(why.contains("--fresh-store"), "{why}");
    let (o, emptied) = run(&second, "used", "emptied.pcap", &["--fresh-store"]);
    assert!(o.status.success(), "{}", text(&o));
    let (o, fresh) = run(&second, "unused", "fresh.pcap", &[]);
    assert!(o.status.success(), "{}", text(&o));
    let frames = |p: &str| common::sorted_frames(std::path::Path::new(p));
    let (emptied, fresh) = (frames(&emptied), frames(&fresh));
    assert!(!fresh.is_empty());
    assert!(emptied == fresh, "an emptied store gives what an empty one gives");
    // The same on Redis (the mark is written by its function's compare-and-set).
    let redis = common::redis_store("claimed");
    let on_redis = |input: &str, extra: &[&str]| {
        sluice(
            &[&["run", "-c", &chain, "-i", input, "-w", "1", "-q", "--no-pin", "--store", &redis][..], extra].concat(),
        )
    };
    let o = on_redis(&first, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = on_redis(&second, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("already holds the state of another run (chain `example`"), "{}", text(&o));
    let o = on_redis(&second, &["--fresh-store"]);
    assert!(o.status.success(), "{}", text(&o));
    // Only the root's node claims the store: the option has no place on another node.
    let spread = common::spread_file(dir.path(), 2, &[("lb", "b")]);
    let o = sluice(&["run", "-c", &chain, "--spread", &spread.to_string_lossy(), "--node", "b", "--fresh-store"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--fresh-store belongs on the root's node"), "{}", text(&o));
}

/// `sluice verify` claims its physical chain's store as a run does: a second verification on
/// the space the first one used is refused unless told to empty it, and is then equivalent.
#[test]
fn a_verification_on_a_store_another_run_left_its_state_in_is_refused_unless_emptied_first() {
    let server = serve("verified");
    let url = format!("sluice://{}?token={TOKEN}&space=verify", server.addr);
    let verify = |extra: &[&str]| {
        let args = ["verify", "-c", "chains/example.yaml", "-i", "traces/demo.pcap", "--limit", "3000"];
        sluice(&[&args[..], &["--crash", "nat:0@40%", "--store", &url], extra].concat())
    };
    let o = verify(&[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("EQUIVALENT"), "{}", text(&o));
    let o = verify(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("already holds the state of another run (chain `example`"), "{}", text(&o));
    let o = verify(&["--fresh-store"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("EQUIVALENT"), "{}", text(&o));
    // The store crashing before the engine's first checkpoint keeps the claim: its rebuild
    // starts from the store as the verification began, not from nothing.
    let o = verify(&["--fresh-store", "--crash-store", "1%"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("EQUIVALENT"), "{}", text(&o));
    let o = verify(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("already holds the state of another run (chain `example`"), "{}", text(&o));
}
