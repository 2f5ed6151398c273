//! The comparison's rules, one test a rule, on hand-built runs.

use super::*;
use crate::observed::{Decision, OutputRecord, StateEntry};
use etherparse::PacketBuilder;
use sluice_packet::{FiveTuple, Proto};
use sluice_state::{StateKey, Value};
use std::collections::VecDeque;

const CLIENT: [u8; 4] = [10, 0, 0, 1];
const SERVER: [u8; 4] = [192, 0, 2, 80];

/// An Ethernet/IPv4/TCP frame with correct checksums.
fn tcp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(src, dst, 64)
        .tcp(sport, dport, 1000, 65535);
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).expect("frame builds");
    v
}

fn run(outputs: Vec<(u64, Vec<u8>)>, inputs: u64) -> Observed {
    Observed {
        inputs,
        outputs: outputs
            .into_iter()
            .map(|(input, bytes)| OutputRecord { input, clock: input + 1, in_port: 0, bytes })
            .collect(),
        ..Observed::default()
    }
}

fn decision(input: u64, kind: &str, subject: &str) -> Decision {
    Decision { input, vertex: "ids".into(), kind: kind.into(), subject: subject.into(), detail: String::new() }
}

fn entry(object: u16, key: StateKey, value: Value) -> StateEntry {
    StateEntry { vertex: "nat".into(), object, object_name: format!("obj{object}"), allocation: false, key, value }
}

fn kinds(c: &Comparison) -> Vec<DiffKind> {
    c.differences.iter().map(|d| d.kind).collect()
}

fn cmp(r: &Observed, p: &Observed) -> Comparison {
    compare(r, p, &CompareOptions::default())
}

/// Two flows: A (client port 1111) on inputs 0 and 2, B (port 2222) on inputs 1 and 3.
fn two_flows() -> Observed {
    run(
        vec![
            (0, tcp(CLIENT, 1111, SERVER, 80, b"a0")),
            (1, tcp(CLIENT, 2222, SERVER, 80, b"b1")),
            (2, tcp(CLIENT, 1111, SERVER, 80, b"a2")),
            (3, tcp(CLIENT, 2222, SERVER, 80, b"b3")),
        ],
        4,
    )
}

fn reorder(o: &Observed, order: &[usize]) -> Observed {
    Observed { outputs: order.iter().map(|&i| o.outputs[i].clone()).collect(), ..o.clone() }
}

#[test]
fn identical_runs_are_equivalent() {
    let mut r = two_flows();
    r.decisions = vec![decision(1, "alert", "10.0.0.1"), decision(4, "timeout", "x")];
    r.state = vec![
        entry(0, StateKey::Unit, Value::Int(4)),
        entry(1, StateKey::Unit, Value::List((5000..5003).map(Value::Int).collect())),
        entry(2, StateKey::Endpoint(CLIENT.into(), 1111, 6), Value::Endpoint(SERVER.into(), 80)),
        entry(3, StateKey::Addr(CLIENT.into()), Value::Float(0.25)),
    ];
    let c = cmp(&r, &r);
    assert!(c.equivalent, "{}", c.summary());
    assert_eq!(c.stats.outputs_compared, 4);
    assert_eq!(c.stats.decisions_compared, 2);
    assert_eq!(c.stats.state_entries_compared, 4);
    assert!(c.stats.state_compared);
    assert_eq!(c.stats.renamed_endpoints, 0);
    assert!(c.summary().contains("EQUIVALENT"));
}

#[test]
fn lost_output_is_reported() {
    let r = two_flows();
    let p = reorder(&r, &[0, 1, 3]);
    let c = cmp(&r, &p);
    assert!(!c.equivalent);
    assert_eq!(kinds(&c), vec![DiffKind::Lost]);
    assert_eq!(c.differences[0].input, Some(2));
    assert!(c.summary().contains("lost 1"), "{}", c.summary());
}

#[test]
fn duplicate_and_extra_outputs_are_reported() {
    let r = two_flows();
    let mut p = reorder(&r, &[0, 1, 1, 2, 3]);
    p.outputs.push(OutputRecord { input: 7, clock: 8, in_port: 0, bytes: tcp(CLIENT, 3333, SERVER, 80, b"x") });
    let c = cmp(&r, &p);
    assert_eq!(kinds(&c), vec![DiffKind::Duplicated, DiffKind::Duplicated]);
    assert_eq!(c.differences[0].input, Some(1));
    assert!(c.differences[1].detail.contains("extra"));
}

#[test]
fn per_flow_reorder_detected_cross_flow_interleaving_accepted() {
    let r = two_flows();
    // Flow B before flow A, but each flow in order.
    let c = cmp(&r, &reorder(&r, &[1, 3, 0, 2]));
    assert!(c.equivalent, "{}", c.summary());
    // Input 2 before input 0: flow A inverted.
    let c = cmp(&r, &reorder(&r, &[2, 1, 0, 3]));
    assert_eq!(kinds(&c), vec![DiffKind::Reordered]);
    assert_eq!(c.differences[0].input, Some(2));
    assert!(c.differences[0].flow.as_deref().is_some_and(|f| f.contains("1111")));
}

#[test]
fn equal_headers_from_two_ports_keep_no_order_between_them() {
    // The same frame entering a bridge from each side (an IPv6 multicast report from both
    // namespaces, say): two streams on two paths.
    let frame = tcp(CLIENT, 1111, SERVER, 80, b"m");
    let mut r = run(vec![(0, frame.clone()), (1, frame.clone()), (2, frame)], 3);
    r.outputs[1].in_port = 1;
    let c = cmp(&r, &reorder(&r, &[1, 0, 2]));
    assert!(c.equivalent, "{}", c.summary());
    // Within one port the order still counts.
    let c = cmp(&r, &reorder(&r, &[2, 1, 0]));
    assert_eq!(kinds(&c), vec![DiffKind::Reordered]);
}

#[test]
fn consistent_nat_renaming_is_accepted() {
    let r = run(
        vec![
            (0, tcp(CLIENT, 5000, SERVER, 80, b"hello")),
            (1, tcp(SERVER, 80, CLIENT, 5000, b"reply")),
            (2, tcp(CLIENT, 5000, SERVER, 80, b"again")),
        ],
        3,
    );
    let p = run(
        vec![
            (0, tcp(CLIENT, 6000, SERVER, 80, b"hello")),
            (1, tcp(SERVER, 80, CLIENT, 6000, b"reply")),
            (2, tcp(CLIENT, 6000, SERVER, 80, b"again")),
        ],
        3,
    );
    let c = cmp(&r, &p);
    assert!(c.equivalent, "{}", c.summary());
    assert_eq!(c.stats.renamed_endpoints, 1);
}

#[test]
fn inconsistent_renaming_is_a_conflict() {
    let r = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"a")), (1, tcp(CLIENT, 5000, SERVER, 80, b"b"))], 2);
    // One reference endpoint, two physical ones.
    let p = run(vec![(0, tcp(CLIENT, 6000, SERVER, 80, b"a")), (1, tcp(CLIENT, 6001, SERVER, 80, b"b"))], 2);
    let c = cmp(&r, &p);
    assert_eq!(kinds(&c), vec![DiffKind::RenamingConflict]);
    assert_eq!(c.differences[0].input, Some(1));
    // Two reference endpoints, one physical one.
    let r = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"a")), (1, tcp(CLIENT, 5001, SERVER, 80, b"b"))], 2);
    let p = run(vec![(0, tcp(CLIENT, 6000, SERVER, 80, b"a")), (1, tcp(CLIENT, 6000, SERVER, 80, b"b"))], 2);
    let c = cmp(&r, &p);
    assert_eq!(kinds(&c), vec![DiffKind::RenamingConflict]);
}

#[test]
fn payload_difference_is_a_header_mismatch() {
    let r = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"hello"))], 1);
    let p = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"hellO"))], 1);
    let c = cmp(&r, &p);
    assert_eq!(kinds(&c), vec![DiffKind::HeaderMismatch]);
    assert!(c.differences[0].detail.contains("payload"), "{}", c.differences[0].detail);
}

#[test]
fn bad_checksum_is_detected() {
    let frame = tcp(CLIENT, 5000, SERVER, 80, b"hello");
    let r = run(vec![(0, frame.clone())], 1);
    // Rename the source port without fixing the TCP checksum.
    let mut bad = frame;
    bad[34..36].copy_from_slice(&6000u16.to_be_bytes());
    let c = cmp(&r, &run(vec![(0, bad.clone())], 1));
    assert_eq!(kinds(&c), vec![DiffKind::HeaderMismatch]);
    assert!(c.differences[0].detail.contains("TCP checksum"), "{}", c.differences[0].detail);
    // Corrupt the IPv4 header checksum instead (the ports renamed properly).
    let mut bad = tcp(CLIENT, 6000, SERVER, 80, b"hello");
    bad[24] ^= 0xff;
    let c = cmp(&r, &run(vec![(0, bad)], 1));
    assert_eq!(kinds(&c), vec![DiffKind::HeaderMismatch]);
    assert!(c.differences[0].detail.contains("IPv4 header checksum"), "{}", c.differences[0].detail);
}

#[test]
fn root_dropped_inputs_are_excused() {
    let mut r = two_flows();
    r.decisions = vec![decision(1, "alert", "10.0.0.1")];
    r.state = vec![entry(0, StateKey::Unit, Value::Int(4))];
    let mut p = reorder(&r, &[0, 2, 3]);
    p.decisions.clear();
    p.state = vec![entry(0, StateKey::Unit, Value::Int(3))];
    p.root_dropped = vec![1];
    let c = cmp(&r, &p);
    assert!(c.equivalent, "{}", c.summary());
    assert_eq!(c.stats.outputs_excused, 1);
    assert_eq!(c.stats.decisions_excused, 1);
    assert!(!c.stats.state_compared);
    assert!(c.summary().contains("not compared"));
}

/// A reference that left out what the root dropped (a recorded run's) holds the state the
/// physical run should have: compared, and a difference found.
#[test]
fn state_is_compared_when_the_reference_left_out_what_the_root_dropped() {
    let mut r = two_flows();
    r.state = vec![entry(0, StateKey::Unit, Value::Int(3))];
    r.root_dropped = vec![1];
    let mut p = r.clone();
    p.state = vec![entry(0, StateKey::Unit, Value::Int(4))];
    let c = cmp(&r, &p);
    assert!(c.stats.state_compared, "{}", c.summary());
    assert!(!c.equivalent, "the physical run's extra update is a difference");
    p.state = r.state.clone();
    assert!(cmp(&r, &p).equivalent);
}

#[test]
fn decisions_missing_and_extra() {
    let mut r = two_flows();
    r.decisions = vec![decision(0, "alert", "10.0.0.1"), decision(2, "drop:blocked", "")];
    let mut p = r.clone();
    p.decisions = vec![decision(0, "alert", "10.0.0.2"), decision(2, "drop:blocked", "")];
    let c = cmp(&r, &p);
    assert_eq!(kinds(&c), vec![DiffKind::DecisionMissing, DiffKind::DecisionExtra]);
    assert_eq!(c.differences[0].vertex.as_deref(), Some("ids"));
}

#[test]
fn decision_subjects_are_renamed_and_end_of_run_events_ignore_input() {
    let ext = [198, 51, 100, 1];
    let mut r = run(vec![(0, tcp(ext, 5000, SERVER, 80, b"a"))], 1);
    let mut p = run(vec![(0, tcp(ext, 6000, SERVER, 80, b"a"))], 1);
    r.decisions = vec![decision(0, "alert", "198.51.100.1:5000"), decision(1, "expire", "x")];
    p.decisions = vec![decision(0, "alert", "198.51.100.1:6000"), decision(5, "expire", "x")];
    let c = cmp(&r, &p);
    assert!(c.equivalent, "{}", c.summary());
}

#[test]
fn state_counter_mismatch_missing_extra() {
    let mut r = two_flows();
    r.state = vec![entry(0, StateKey::Unit, Value::Int(4)), entry(1, StateKey::Id(1), Value::Int(1))];
    let mut p = r.clone();
    p.state = vec![entry(0, StateKey::Unit, Value::Int(3)), entry(1, StateKey::Id(2), Value::Int(1))];
    let c = cmp(&r, &p);
    assert_eq!(kinds(&c), vec![DiffKind::StateMismatch, DiffKind::StateMissing, DiffKind::StateExtra]);
}

#[test]
fn state_keys_and_values_are_renamed() {
    let ext = [198, 51, 100, 1];
    let mut r = run(vec![(0, tcp(ext, 5000, SERVER, 80, b"a"))], 1);
    let mut p = run(vec![(0, tcp(ext, 6000, SERVER, 80, b"a"))], 1);
    let flow = |port| FiveTuple { src: ext.into(), dst: SERVER.into(), sport: port, dport: 80, proto: Proto::TCP };
    r.state = vec![
        entry(0, StateKey::Endpoint(ext.into(), 5000, 6), Value::Endpoint(CLIENT.into(), 1234)),
        entry(1, StateKey::Flow(flow(5000).flow_key()), Value::Tuple(flow(5000))),
        entry(2, StateKey::Id(0), Value::Endpoint(ext.into(), 5000)),
    ];
    p.state = vec![
        entry(0, StateKey::Endpoint(ext.into(), 6000, 6), Value::Endpoint(CLIENT.into(), 1234)),
        entry(1, StateKey::Flow(flow(6000).flow_key()), Value::Tuple(flow(6000))),
        entry(2, StateKey::Id(0), Value::Endpoint(ext.into(), 6000)),
    ];
    let c = cmp(&r, &p);
    assert!(c.equivalent, "{}", c.summary());
    p.state[2].value = Value::Endpoint(ext.into(), 5000);
    assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::StateMismatch]);
}

#[test]
fn port_pool_compared_by_length_when_ports_renamed() {
    let pool = |ports: &[i64]| Value::List(ports.iter().map(|&p| Value::Int(p)).collect::<VecDeque<_>>());
    let mut r = run(vec![(0, tcp(CLIENT, 5000, SERVER, 80, b"a"))], 1);
    let mut p = run(vec![(0, tcp(CLIENT, 5001, SERVER, 80, b"a"))], 1);
    r.state = vec![entry(0, StateKey::Unit, pool(&[5001, 5002]))];
    p.state = vec![entry(0, StateKey::Unit, pool(&[5002, 5000]))];
    assert!(cmp(&r, &p).equivalent);
    p.state = vec![entry(0, StateKey::Unit, pool(&[5002]))];
    assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::StateMismatch]);
    // Without renamed ports the pool's contents must agree (as a multiset).
    let mut p = r.clone();
    p.state = vec![entry(0, StateKey::Unit, pool(&[5002, 5001]))];
    assert!(cmp(&r, &p).equivalent);
    p.state = vec![entry(0, StateKey::Unit, pool(&[5002, 5003]))];
    assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::StateMismatch]);
}

#[test]
fn floats_within_tolerance() {
    let mut r = two_flows();
    r.state = vec![entry(0, StateKey::Unit, Value::Float(0.3))];
    let mut p = r.clone();
    p.state = vec![entry(0, StateKey::Unit, Value::Float(0.1 + 0.2))];
    assert!(cmp(&r, &p).equivalent);
    p.state = vec![entry(0, StateKey::Unit, Value::Float(0.3001))];
    assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::StateMismatch]);
}

#[test]
fn differences_beyond_the_limit_are_counted() {
    let r = two_flows();
    let p = run(Vec::new(), 4);
    let c = compare(&r, &p, &CompareOptions { max_differences: 1, ..CompareOptions::default() });
    assert!(c.truncated);
    assert_eq!(c.differences.len(), 1);
    assert_eq!(c.stats.total_differences, 4);
    assert_eq!(c.stats.differences_by_kind.get(&DiffKind::Lost), Some(&4));
    assert!(c.summary().contains("lost 4"));
    let json = serde_json::to_string(&c).expect("serialises");
    assert!(json.contains("\"lost\""), "{json}");
}

#[test]
fn ipv6_udp_and_icmp_echo_renaming_accepted() {
    let eth = || PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let (a, b) = (
        [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
    );
    let udp6 = |sport: u16| {
        let bld = eth().ipv6(a, b, 64).udp(sport, 53);
        let mut v = Vec::new();
        bld.write(&mut v, b"query").expect("frame builds");
        v
    };
    let echo = |id: u16| {
        let bld = eth().ipv4(CLIENT, SERVER, 64).icmpv4_echo_request(id, 1);
        let mut v = Vec::new();
        bld.write(&mut v, b"ping").expect("frame builds");
        v
    };
    let r = run(vec![(0, udp6(4000)), (1, echo(7))], 2);
    let p = run(vec![(0, udp6(4001)), (1, echo(8))], 2);
    let c = cmp(&r, &p);
    assert!(c.equivalent, "{}", c.summary());
    // UDP source, and the echo identifier on both sides (it stands for both ports).
    assert_eq!(c.stats.renamed_endpoints, 3);
    let mut bad = udp6(4001);
    let n = bad.len();
    bad[n - 1] ^= 1;
    let c = cmp(&run(vec![(0, udp6(4000))], 1), &run(vec![(0, bad)], 1));
    assert_eq!(kinds(&c), vec![DiffKind::HeaderMismatch]);
}

#[test]
fn garbage_frames_do_not_panic() {
    let r = run(vec![(0, vec![1, 2, 3]), (1, vec![0; 20])], 2);
    let p = run(vec![(0, vec![1, 2, 4]), (1, vec![0; 20])], 2);
    assert_eq!(kinds(&cmp(&r, &p)), vec![DiffKind::HeaderMismatch]);
}
