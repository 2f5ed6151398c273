//! Chains that take their input from, and send their output as, Geneve datagrams
//! (`sluice run --from-geneve`, `--to-geneve`): the example chain split over two processes gives
//! the one-process chain's output frame for frame; what is not Sluice's Geneve for the chain is
//! dropped and counted; bad options are refused.

use sluice_packet::{Clock, InstanceId, Meta};
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

use common::{repo, sluice, text};

/// The frames of a classic pcap file, in order.
fn frames(path: &Path) -> Vec<Vec<u8>> {
    let mut reader = sluice_io::TraceReader::open(path).expect("pcap");
    let mut out = Vec::new();
    while let Some(r) = reader.next_record().expect("record") {
        out.push(r.data.to_vec());
    }
    out
}

/// Starts `sluice run ARGS --from-geneve 127.0.0.1:0`; the child and the address it listens on.
fn receiving_run(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(repo(""))
        .arg("run")
        .args(args)
        .args(["--from-geneve", "127.0.0.1:0", "-q", "--no-pin"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice run");
    let line = common::announced(&mut child, "geneve input: listening on ");
    let addr = line.trim_start_matches("geneve input: listening on ").split_whitespace().next().unwrap_or_default();
    (child, addr.to_string())
}

fn report(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("JSON report")).expect("JSON")
}

#[test]
fn the_example_chain_split_over_two_processes_gives_the_one_process_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (back_out, one_out) = (dir.path().join("back.pcap"), dir.path().join("one.pcap"));
    let (back_json, record) = (dir.path().join("back.json"), dir.path().join("record"));
    // One worker per process keeps each chain's output in its input order, so the two outputs
    // can be compared frame for frame.
    let (mut back, addr) = receiving_run(&[
        "-c",
        "chains/split/example-back.yaml",
        "-w",
        "1",
        "--idle-end",
        "2",
        "-o",
        &back_out.to_string_lossy(),
        "--json",
        &back_json.to_string_lossy(),
        "--record",
        &record.to_string_lossy(),
    ]);
    // Paced (about 2.4 s for 20,000 packets), so the receiver is never overrun and nothing is
    // lost on the way.
    let front = sluice(&[
        "run",
        "-c",
        "chains/split/example-front.yaml",
        "-i",
        "traces/demo.pcap",
        "--limit",
        "20000",
        "--pace",
        "0.05",
        "-w",
        "1",
        "-q",
        "--no-pin",
        "--to-geneve",
        &addr,
        "--json",
        "-",
    ]);
    assert!(front.status.success(), "{}", text(&front));
    let front: serde_json::Value = serde_json::from_slice(&front.stdout).expect("JSON");
    assert!(common::ended_within(&mut back, Duration::from_secs(60)).success());
    let back = report(&back_json);

    let sent = front["packets_out"].as_u64().expect("packets_out");
    assert_eq!(front["geneve_output"]["datagrams"], sent, "{front}");
    let input = &back["geneve_input"];
    assert_eq!(input["accepted"], sent, "{input}");
    assert_eq!((input["lost"].as_u64(), input["malformed"].as_u64()), (Some(0), Some(0)), "{input}");
    assert_eq!(back["packets_in"], sent, "{back}");

    let one = sluice(&[
        "run",
        "-c",
        "chains/example.yaml",
        "-i",
        "traces/demo.pcap",
        "--limit",
        "20000",
        "-w",
        "1",
        "-q",
        "--no-pin",
        "-o",
        &one_out.to_string_lossy(),
    ]);
    assert!(one.status.success(), "{}", text(&one));
    let (split, whole) = (frames(&back_out), frames(&one_out));
    assert!(whole.len() > 19_000, "the one-process chain emitted {}", whole.len());
    assert_eq!(split.len(), whole.len());
    assert!(split == whole, "the split chain's output differs from the one-process chain's");

    // The second half's run is recorded like any other and checks out against its own chain.
    let v = sluice(&["verify", "--recorded", &record.to_string_lossy()]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
}

#[test]
fn datagrams_that_are_not_for_the_chain_are_dropped_and_counted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("report.json");
    let control = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
    let control = control.to_string();
    let (mut run, addr) = receiving_run(&[
        "-c",
        "chains/nat.yaml",
        "--vni",
        "42",
        "--idle-end",
        "2",
        "--json",
        &json.to_string_lossy(),
        "--control",
        &control,
        "--control-token",
        "t",
    ]);
    let packets = sluice_io::load(repo("traces/demo.pcap"), Some(50)).expect("trace");
    let socket = UdpSocket::bind("127.0.0.1:0").expect("socket");
    let datagram = |i: usize, vni: u32, dest: InstanceId| {
        let meta = Meta { clock: Clock::new(0, i as u64 + 1), ..packets[i].meta };
        let mut d = Vec::new();
        sluice_wire::encode_sequenced(&meta, dest, vni, Some(i as u64), packets[i].data(), &mut d).expect("encode");
        d
    };
    for i in 0..packets.len() {
        let d = match i {
            // Not Geneve at all, a truncated header, and a datagram cut inside its options.
            5 => b"hello".to_vec(),
            6 => datagram(i, 42, sluice_wire::TO_ROOT)[..6].to_vec(),
            7 => datagram(i, 42, sluice_wire::TO_ROOT)[..20].to_vec(),
            // Another chain's.
            8 => datagram(i, 41, sluice_wire::TO_ROOT),
            // Meant for an NF instance of a chain spread over nodes, not for a chain's input.
            9 => datagram(i, 42, InstanceId::new(0, 0)),
            _ => datagram(i, 42, sluice_wire::TO_ROOT),
        };
        socket.send_to(&d, &addr).expect("send");
    }
    // While the run goes, its metrics count them too.
    let wants = [
        "sluice_geneve_input_datagrams_total{outcome=\"malformed\"} 3",
        "sluice_geneve_input_datagrams_total{outcome=\"accepted\"} 46",
        "sluice_geneve_input_datagrams_total{outcome=\"other_vni\"} 1",
        "sluice_geneve_input_datagrams_total{outcome=\"not_for_root\"} 1",
        "sluice_geneve_output_datagrams_total 0",
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (_, m) = common::http(&control, "GET", "/metrics", Some("t"), "");
        if wants.iter().all(|w| m.contains(w)) || std::time::Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for want in wants {
        assert!(metrics.contains(want), "no `{want}` in\n{metrics}");
    }
    assert!(common::ended_within(&mut run, Duration::from_secs(60)).success());
    let report = report(&json);
    let input = &report["geneve_input"];
    assert_eq!(input["malformed"], 3, "{input}");
    assert_eq!(input["other_vni"], 1, "{input}");
    assert_eq!(input["not_for_root"], 1, "{input}");
    assert_eq!(input["accepted"], 46, "{input}");
    assert!(input["last_error"].as_str().is_some_and(|e| !e.is_empty()), "{input}");
    // The 45 datagrams for the chain's root entered it; the dropped ones left no trace.
    assert_eq!(report["packets_in"], 45, "{report}");
}

#[test]
fn bad_geneve_options_are_refused() {
    for (args, want) in [
        (&["--from-geneve", "127.0.0.1:0", "--idle-end", "0"][..], "--idle-end takes a positive number"),
        (&["--from-geneve", "127.0.0.1:0", "--vni", "16777216"][..], "VNI"),
        (&["-i", "traces/demo.pcap", "--to-geneve", "127.0.0.1:9", "--vni", "16777216"][..], "VNI"),
        (&["-i", "traces/demo.pcap", "--from-geneve", "127.0.0.1:0"][..], "cannot be used with"),
        (&["-i", "traces/demo.pcap", "--idle-end", "1"][..], "--from-geneve"),
        (&["--from-geneve", "not-an-address"][..], "invalid"),
    ] {
        let mut all = vec!["run", "-c", "chains/nat.yaml", "-q"];
        all.extend_from_slice(args);
        let o = sluice(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: no `{want}` in {}", text(&o));
    }
}
