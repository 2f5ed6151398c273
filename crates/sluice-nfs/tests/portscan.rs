//! Portscan detector: synthetic scans are flagged after the number of failures the thresholds
//! imply; benign captures flag nobody.

mod common;
mod synth;

use common::{load_trace, run};
use proptest::prelude::*;
use sluice_nf::{local_instance, Instance, Verdict};
use sluice_nfs::registry;
use sluice_packet::Packet;
use synth::{pkt, tcp_frame, ACK, RST, SYN};

const SCANNER: [u8; 4] = [10, 0, 0, 66];
const MS: u64 = 1_000_000;

fn instance(yaml: &str) -> Instance {
    let cfg: serde_yaml::Value = serde_yaml::from_str(yaml).expect("yaml");
    local_instance(&registry(), "portscan", &cfg).expect("build portscan")
}

/// Failures in a row needed to cross η1 with the given parameters.
fn failures_needed(theta0: f64, theta1: f64, pf: f64, pd: f64) -> usize {
    let step = ((1.0 - theta1) / (1.0 - theta0)).ln();
    ((pd / pf).ln() / step).ceil() as usize
}

/// SYN from the scanner to target `i` (distinct host and port), at time `t`.
fn syn(i: u32, clock: u64, t: u64) -> Packet {
    let dst = [10, 0, 1, (i % 250) as u8 + 1];
    pkt(tcp_frame(SCANNER, 40_000 + i as u16, dst, 1000 + i as u16, 7, 0, SYN, &[]), clock, t)
}

/// The target's reply to [`syn`]: RST-ACK (closed) or SYN-ACK (open).
fn reply(i: u32, open: bool, clock: u64, t: u64) -> Packet {
    let dst = [10, 0, 1, (i % 250) as u8 + 1];
    let flags = if open { SYN | ACK } else { RST | ACK };
    pkt(tcp_frame(dst, 1000 + i as u16, SCANNER, 40_000 + i as u16, 99, 8, flags, &[]), clock, t)
}

fn portscan_events(inst: &Instance) -> Vec<sluice_nf::Event> {
    inst.events().iter().filter(|e| e.kind == "portscan").cloned().collect()
}

#[test]
fn scan_with_rsts_is_flagged_after_expected_failures_then_blocked() {
    let k = failures_needed(0.8, 0.2, 0.01, 0.99);
    assert_eq!(k, 4);
    let mut inst = instance("");
    let mut clock = 0;
    let mut t = 1_000 * MS;
    for i in 0..20u32 {
        clock += 1;
        t += MS;
        let v = inst.process(&mut syn(i, clock, t));
        // SYNs pass until the host is flagged (after the k-th failure).
        if (i as usize) < k {
            assert_eq!(v, Verdict::Forward, "syn {i}");
        } else {
            assert_eq!(v, Verdict::Drop("portscan-blocked"), "syn {i}");
        }
        clock += 1;
        t += MS;
        // Replies come from the targets and are forwarded.
        assert_eq!(inst.process(&mut reply(i, false, clock, t)), Verdict::Forward);
        let ev = portscan_events(&inst);
        if (i as usize) + 1 < k {
            assert!(ev.is_empty(), "flagged too early at attempt {i}");
        } else {
            assert_eq!(ev.len(), 1, "flagged once, at attempt {}", k - 1);
        }
    }
    let ev = portscan_events(&inst);
    assert_eq!(ev[0].subject, "10.0.0.66");
    // The event carries the clock of the k-th RST: SYN/RST pairs take clocks 2i+1, 2i+2.
    assert_eq!(ev[0].clock.seq(), 2 * k as u64);
}

#[test]
fn thresholds_follow_config() {
    let (t0, t1, pf, pd) = (0.9, 0.3, 0.001, 0.999);
    let k = failures_needed(t0, t1, pf, pd);
    let mut inst = instance(&format!("theta0: {t0}\ntheta1: {t1}\np_false_positive: {pf}\np_detection: {pd}"));
    let mut flagged_at = None;
    for i in 0..40u32 {
        inst.process(&mut syn(i, 2 * u64::from(i) + 1, MS * u64::from(2 * i + 1)));
        inst.process(&mut reply(i, false, 2 * u64::from(i) + 2, MS * u64::from(2 * i + 2)));
        if flagged_at.is_none() && !portscan_events(&inst).is_empty() {
            flagged_at = Some(i as usize + 1);
        }
    }
    assert_eq!(flagged_at, Some(k));
}

#[test]
fn unanswered_syns_time_out_as_failures() {
    let mut inst = instance("timeout_ms: 500");
    // One SYN every 100 ms, never answered.
    for i in 0..30u32 {
        inst.process(&mut syn(i, u64::from(i) + 1, 100 * MS * u64::from(i)));
    }
    let ev = portscan_events(&inst);
    assert_eq!(ev.len(), 1);
    // The 4th SYN (sent at 300 ms) times out at 800 ms: the event comes from the timer fired
    // before the SYN at 800 ms, i.e. with the clock of that packet.
    assert_eq!(ev[0].clock.seq(), 9);
    assert_eq!(inst.process(&mut syn(99, 100, 4_000 * MS)), Verdict::Drop("portscan-blocked"));
}

#[test]
fn successes_keep_a_host_benign_and_mixed_outcomes_are_weighed() {
    let mut inst = instance("");
    let mut c = 0;
    // Pattern: 3 failures, 1 success, repeated: Λ drifts up by 2 steps per 4 attempts.
    // A pure success run must never flag.
    for i in 0..200u32 {
        c += 2;
        inst.process(&mut syn(i, c - 1, c * MS));
        inst.process(&mut reply(i, true, c, c * MS));
    }
    assert!(portscan_events(&inst).is_empty());
    // Alternating failure/success stays between the thresholds.
    for i in 200..400u32 {
        c += 2;
        inst.process(&mut syn(i, c - 1, c * MS));
        inst.process(&mut reply(i, i % 2 == 0, c, c * MS));
    }
    assert!(portscan_events(&inst).is_empty());
}

#[test]
fn only_first_contacts_count() {
    // The same dead service, retried from new source ports: one first contact.
    let retry = |n: u32, c: u64| {
        let s = pkt(tcp_frame(SCANNER, 50_000 + n as u16, [10, 0, 1, 1], 80, 1, 0, SYN, &[]), c, c * MS);
        let r = pkt(tcp_frame([10, 0, 1, 1], 80, SCANNER, 50_000 + n as u16, 0, 2, RST | ACK, &[]), c + 1, c * MS + 1);
        [s, r]
    };
    let mut inst = instance("");
    for n in 0..20 {
        run(&mut inst, retry(n, 10 * u64::from(n) + 1).to_vec());
    }
    assert!(portscan_events(&inst).is_empty());
    let mut inst = instance("first_contact: false");
    for n in 0..20 {
        run(&mut inst, retry(n, 10 * u64::from(n) + 1).to_vec());
    }
    assert_eq!(portscan_events(&inst).len(), 1);
}

#[test]
fn retransmitted_syns_count_once() {
    let mut inst = instance("first_contact: false");
    for i in 0..3u32 {
        for r in 0..5 {
            inst.process(&mut syn(i, 100 * u64::from(i) + r, MS * (100 * u64::from(i) + r)));
        }
        inst.process(&mut reply(i, false, 100 * u64::from(i) + 50, MS * (100 * u64::from(i) + 50)));
    }
    assert!(portscan_events(&inst).is_empty(), "three attempts, not fifteen");
}

#[test]
fn block_false_only_reports() {
    let mut inst = instance("block: false");
    for i in 0..10u32 {
        assert_eq!(inst.process(&mut syn(i, 2 * u64::from(i) + 1, MS)), Verdict::Forward);
        inst.process(&mut reply(i, false, 2 * u64::from(i) + 2, MS));
    }
    assert_eq!(portscan_events(&inst).len(), 1);
}

#[test]
fn block_expires_with_host_state() {
    let mut inst = instance("host_timeout_ms: 1000");
    for i in 0..5u32 {
        inst.process(&mut syn(i, 2 * u64::from(i) + 1, MS));
        inst.process(&mut reply(i, false, 2 * u64::from(i) + 2, MS));
    }
    assert_eq!(inst.process(&mut syn(50, 20, 500 * MS)), Verdict::Drop("portscan-blocked"));
    assert_eq!(inst.process(&mut syn(51, 21, 2_000 * MS)), Verdict::Forward);
}

#[test]
fn benign_captures_flag_nobody() {
    for (name, packets) in [("http_methods.pcap", 655), ("ssh_ssh.pcap", 1_797), ("echo-connections.pcap", 82_582)] {
        let mut inst = instance("");
        let out = run(&mut inst, load_trace(name));
        assert_eq!(out.len(), packets, "{name}");
        assert!(portscan_events(&inst).is_empty(), "{name}: {:?}", portscan_events(&inst));
        assert!(out.iter().all(|(v, _)| *v == Verdict::Forward), "{name}");
    }
}

#[test]
fn bad_config_is_rejected() {
    for y in ["theta1: 0.9", "theta0: 1.5", "p_false_positive: 0.5\np_detection: 0.4", "timeout_ms: 0", "x: 1"] {
        let cfg: serde_yaml::Value = serde_yaml::from_str(y).expect("yaml");
        assert!(local_instance(&registry(), "portscan", &cfg).is_err(), "{y}");
    }
}

fn sample_packets() -> &'static [Packet] {
    static P: std::sync::OnceLock<Vec<Packet>> = std::sync::OnceLock::new();
    P.get_or_init(|| load_trace("http_methods.pcap").into_iter().take(200).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn never_panics(
        raw in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 0..8),
        synthetic in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u16>(), any::<u8>()), 0..40),
        picks in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 0..40),
    ) {
        let mut inst = instance("timeout_ms: 1");
        for (n, bytes) in raw.into_iter().enumerate() {
            let _ = inst.process(&mut pkt(bytes, n as u64, n as u64));
        }
        for (n, (a, b, port, flags)) in synthetic.into_iter().enumerate() {
            let f = tcp_frame([10, 0, 0, a % 4], port, [10, 0, 0, b % 4], port ^ 1, 0, 0, flags, &[]);
            let v = inst.process(&mut pkt(f, 100 + n as u64, MS * n as u64));
            prop_assert!(matches!(v, Verdict::Forward | Verdict::Drop("portscan-blocked")));
        }
        let sample = sample_packets();
        for (n, (which, cut, flip)) in picks.into_iter().enumerate() {
            let p = which.get(sample);
            let mut data = p.data().to_vec();
            let at = cut.index(data.len() + 1);
            data.truncate(at);
            if let Some(b) = data.get_mut(at / 2) {
                *b ^= flip;
            }
            let v = inst.process(&mut pkt(data, 1000 + n as u64, p.meta.ts_ns));
            prop_assert!(matches!(v, Verdict::Forward | Verdict::Drop("portscan-blocked")));
        }
    }
}
