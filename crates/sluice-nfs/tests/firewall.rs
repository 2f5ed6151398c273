//! Stateful firewall over real captures: complete connections pass, ACL denies, unknown
//! connections dropped, strict TCP tracking, pseudo-connections, expiry, robustness.

mod common;
mod nfa_support;

use common::{compose, load_trace, run};
use nfa_support::{advance_all, icmp_echo_frame, instance, raw, udp_frame};
use proptest::prelude::*;
use sluice_nf::Verdict;
use sluice_nfs::firewall::CONNS;
use sluice_packet::Packet;
use std::collections::BTreeMap;

fn verdicts(out: &[(Verdict, Packet)]) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for (v, _) in out {
        let k = match v {
            Verdict::Forward => "forward",
            Verdict::Drop(r) => r,
            Verdict::Output(_) => "output",
        };
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

#[test]
fn allow_all_passes_complete_connections_then_expires_them() {
    for trace in ["ssh_single-conn.pcap", "ftp_retr.pcap", "http_methods.pcap", "ftp_ipv4.pcap"] {
        let (mut fw, probe) = instance("firewall", "{}");
        let pkts = load_trace(trace);
        let n = pkts.len();
        let end = pkts.iter().map(|p| p.meta.ts_ns).max().unwrap();
        let orig: Vec<Vec<u8>> = pkts.iter().map(|p| p.data().to_vec()).collect();
        let out = run(&mut fw, pkts);
        assert_eq!(verdicts(&out).get("forward"), Some(&n), "{trace}: {:?}", verdicts(&out));
        assert!(out.iter().zip(&orig).all(|((_, p), o)| p.data() == &o[..]), "the firewall rewrites nothing");
        assert!(probe.len(CONNS) > 0);
        advance_all(&mut fw, &probe, end + 7_441_000_000_000);
        assert_eq!(probe.len(CONNS), 0, "{trace}: idle connections expire");
        assert_eq!(probe.timers(), 0);
    }
}

#[test]
fn closed_connections_leave_after_the_linger_time() {
    // ssh_single-conn ends with FINs both ways: the state goes after tcp_linger, long before
    // the established timeout.
    let (mut fw, probe) = instance("firewall", "timeouts: {tcp_linger: 2}");
    let pkts = load_trace("ssh_single-conn.pcap");
    let end = pkts.iter().map(|p| p.meta.ts_ns).max().unwrap();
    run(&mut fw, pkts);
    assert_eq!(probe.len(CONNS), 1);
    advance_all(&mut fw, &probe, end + 3_000_000_000);
    assert_eq!(probe.len(CONNS), 0);
}

#[test]
fn deny_ssh_drops_its_syns_and_the_rest_as_unknown() {
    let cfg = "rules: [{action: deny, proto: tcp, dport: 22}]";
    let (mut fw, probe) = instance("firewall", cfg);
    let ssh = load_trace("ssh_single-conn.pcap");
    let ftp = load_trace("ftp_retr.pcap");
    let (n_ssh, n_ftp) = (ssh.len(), ftp.len());
    let out = run(&mut fw, compose(&[ssh, ftp], 1_000_000_000));
    let (ssh_out, ftp_out) = out.split_at(n_ssh);
    for (i, (v, p)) in ssh_out.iter().enumerate() {
        let f = p.hdr().tcp_flags;
        if f.syn() && !f.ack() {
            assert_eq!(*v, Verdict::Drop("fw-acl-deny"), "ssh packet {i}");
        } else {
            assert_eq!(*v, Verdict::Drop("fw-no-connection"), "ssh packet {i}");
        }
    }
    assert!(ftp_out.iter().all(|(v, _)| *v == Verdict::Forward), "{:?}", verdicts(ftp_out));
    assert_eq!(ftp_out.len(), n_ftp);
    let denies = verdicts(ssh_out).get("fw-acl-deny").copied().unwrap_or(0);
    assert!(denies >= 1);
    let events: Vec<_> = fw.events().iter().filter(|e| e.kind == "acl-deny").collect();
    assert_eq!(events.len(), denies, "one event per denied attempt");
    assert_eq!(events[0].detail, "rule 0");
    // Only the FTP connections hold state.
    assert_eq!(probe.len(CONNS), 2);

    // Over many SSH sessions: every packet to or from port 22 is refused.
    let (mut fw, _) = instance("firewall", cfg);
    let out = run(&mut fw, load_trace("ssh_ssh.pcap"));
    let ssh: Vec<_> = out.iter().filter(|(_, p)| p.tuple().is_some_and(|t| t.dport == 22 || t.sport == 22)).collect();
    assert!(ssh.len() > 1500);
    assert!(ssh.iter().all(|(v, _)| *v != Verdict::Forward));
}

#[test]
fn default_deny_with_allow_rule() {
    let cfg = "default: deny\nrules: [{action: allow, dst: 141.142.192.162/32, proto: tcp}]";
    let (mut fw, _) = instance("firewall", cfg);
    let out = run(&mut fw, load_trace("ftp_retr.pcap"));
    // The control connection goes to the server (allowed); the active-mode data connection
    // is opened by the server towards the client and hits the default.
    let v = verdicts(&out);
    assert!(v.get("forward").copied().unwrap_or(0) > 0, "{v:?}");
    let ev = fw.events().iter().filter(|e| e.kind == "acl-deny").count();
    assert_eq!(ev, v.get("fw-acl-deny").copied().unwrap_or(0));
    assert!(fw.events().iter().all(|e| e.detail == "default"));
}

#[test]
fn mid_connection_start_is_dropped_as_unknown() {
    let mut pkts = load_trace("ssh_single-conn.pcap");
    pkts.drain(..3); // cut the handshake off
    let n = pkts.len();
    let (mut fw, probe) = instance("firewall", "{}");
    let out = run(&mut fw, pkts);
    assert_eq!(verdicts(&out).get("fw-no-connection"), Some(&n));
    assert_eq!(probe.len(CONNS), 0);
}

#[test]
fn strict_tcp_rejects_out_of_state_packets() {
    let pkts = load_trace("ssh_single-conn.pcap");
    let (syn, synack, ack) = (pkts[0].clone(), pkts[1].clone(), pkts[2].clone());
    assert!(syn.hdr().tcp_flags.syn() && !syn.hdr().tcp_flags.ack());
    assert!(synack.hdr().tcp_flags.syn() && synack.hdr().tcp_flags.ack());
    // The initiator's ACK before the responder's SYN-ACK does not fit.
    let (mut fw, _) = instance("firewall", "{}");
    for (p, want) in [
        (&synack, Verdict::Drop("fw-no-connection")),
        (&syn, Verdict::Forward),
        (&syn, Verdict::Forward), // retransmission
        (&ack, Verdict::Drop("fw-invalid-tcp")),
        (&synack, Verdict::Forward),
        (&ack, Verdict::Forward),
        (&syn, Verdict::Drop("fw-invalid-tcp")), // SYN on an established connection
    ] {
        let mut q = p.clone();
        assert_eq!(fw.process(&mut q), want);
    }
    // Lenient mode lets every packet of a known connection through.
    let (mut fw, _) = instance("firewall", "strict_tcp: false");
    for (p, want) in [(&syn, Verdict::Forward), (&ack, Verdict::Forward), (&syn, Verdict::Forward)] {
        let mut q = p.clone();
        assert_eq!(fw.process(&mut q), want);
    }
}

#[test]
fn udp_and_icmp_pseudo_connections() {
    let cfg = "rules: [{action: deny, proto: udp, dport: 53, dst: 192.0.2.0/24}]\ntimeouts: {udp: 30, icmp: 10}";
    let (mut fw, probe) = instance("firewall", cfg);
    let s = 1_000_000_000u64;
    let mut q = raw(&udp_frame([10, 0, 0, 1], 5000, [192, 0, 2, 1], 53, b"q"), s);
    assert_eq!(fw.process(&mut q), Verdict::Drop("fw-acl-deny"));
    let mut q = raw(&udp_frame([10, 0, 0, 1], 5000, [198, 51, 100, 1], 53, b"q"), s);
    assert_eq!(fw.process(&mut q), Verdict::Forward);
    let mut r = raw(&udp_frame([198, 51, 100, 1], 53, [10, 0, 0, 1], 5000, b"a"), 2 * s);
    assert_eq!(fw.process(&mut r), Verdict::Forward, "reply of an allowed flow");
    let mut e = raw(&icmp_echo_frame([10, 0, 0, 1], [1, 1, 1, 1], 8, 9, 1), 2 * s);
    assert_eq!(fw.process(&mut e), Verdict::Forward);
    let mut e = raw(&icmp_echo_frame([1, 1, 1, 1], [10, 0, 0, 1], 0, 9, 1), 3 * s);
    assert_eq!(fw.process(&mut e), Verdict::Forward);
    assert_eq!(probe.len(CONNS), 2);
    advance_all(&mut fw, &probe, 14 * s);
    assert_eq!(probe.len(CONNS), 1, "ICMP expired after 10 s idle, UDP lives on");
    advance_all(&mut fw, &probe, 33 * s);
    assert_eq!(probe.len(CONNS), 0);
}

#[test]
fn config_is_validated() {
    let reg = sluice_nfs::registry();
    let bad = [
        ("rules: [{action: deny, dport: '100-10'}]", "rules[0].dport"),
        ("rules: [{action: deny, sport: 70000}]", "rules[0].sport"),
        ("rules: [{action: allow}, {action: deny, src: 300.0.0.0/8}]", "rules[1].src"),
        ("rules: [{action: deny, proto: sctpx}]", "rules[0].proto"),
        ("default: maybe", ""),
        ("timeouts: {tcp_linger: 0}", "timeouts.tcp_linger"),
        ("strict: true", ""),
    ];
    for (yaml, field) in bad {
        let v: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        match sluice_nf::local_instance(&reg, "firewall", &v) {
            Err(sluice_nf::NfError::Config { field: f, .. }) => assert!(f.starts_with(field), "{yaml}: {f}"),
            Err(e) => panic!("{yaml}: {e}"),
            Ok(_) => panic!("{yaml} accepted"),
        }
    }
    assert!(sluice_nf::local_instance(&reg, "firewall", &serde_yaml::Value::Null).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let (mut fw, _) = instance("firewall", "{}");
        let mut p = raw(&bytes, 1);
        let _ = fw.process(&mut p);
    }

    #[test]
    fn never_panics_on_truncated_or_corrupted_packets(
        picks in proptest::collection::vec((0usize..94, 0usize..1600, 0usize..80, any::<u8>()), 1..10)
    ) {
        thread_local!(static PKTS: Vec<Packet> = load_trace("ssh_single-conn.pcap"));
        let (mut fw, _) = instance("firewall", "rules: [{action: deny, dport: '0-21'}]");
        for (idx, cut, flip, val) in picks {
            let mut bytes = PKTS.with(|p| p[idx].data().to_vec());
            if flip < bytes.len() { bytes[flip] = val; }
            bytes.truncate(cut);
            let mut p = raw(&bytes, idx as u64);
            let _ = fw.process(&mut p);
        }
    }
}
