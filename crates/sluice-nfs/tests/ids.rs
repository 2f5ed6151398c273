//! IDS: signatures over reassembled TCP streams, on real captures and synthetic segments.

mod common;
mod synth;

use common::{load_trace, run};
use proptest::prelude::*;
use sluice_nf::{local_instance, Event, Instance, StateKey, Value, Verdict};
use sluice_nfs::ids::{REORDER_BUFFER, STREAM};
use sluice_nfs::registry;
use sluice_packet::{FiveTuple, Packet};
use std::collections::BTreeMap;
use synth::{pkt, tcp_frame, ACK, FIN, PSH, RST, SYN};

const MS: u64 = 1_000_000;
const CLI: [u8; 4] = [10, 1, 0, 1];
const SRV: [u8; 4] = [10, 1, 0, 2];

fn instance(yaml: &str) -> Instance {
    let cfg: serde_yaml::Value = serde_yaml::from_str(yaml).expect("yaml");
    local_instance(&registry(), "ids", &cfg).expect("build ids")
}

fn alerts(inst: &Instance, rule: u32) -> Vec<Event> {
    let tag = format!("rule={rule}");
    inst.events()
        .iter()
        .filter(|e| e.kind == "alert" && e.detail.split(' ').next() == Some(tag.as_str()))
        .cloned()
        .collect()
}

/// A synthetic client→server connection with initial sequence number `isn`.
struct Conn {
    isn: u32,
    clock: u64,
}

impl Conn {
    fn new(isn: u32) -> Conn {
        Conn { isn, clock: 0 }
    }
    fn tick(&mut self) -> (u64, u64) {
        self.clock += 1;
        (self.clock, self.clock * MS)
    }
    fn syn(&mut self) -> Packet {
        let (c, t) = self.tick();
        pkt(tcp_frame(CLI, 40_000, SRV, 80, self.isn, 0, SYN, &[]), c, t)
    }
    /// Client data at stream offset `off` (0 = first byte after the SYN).
    fn data(&mut self, off: u32, bytes: &[u8]) -> Packet {
        let (c, t) = self.tick();
        let seq = self.isn.wrapping_add(1).wrapping_add(off);
        pkt(tcp_frame(CLI, 40_000, SRV, 80, seq, 1, ACK | PSH, bytes), c, t)
    }
    fn server(&mut self, flags: u8, bytes: &[u8]) -> Packet {
        let (c, t) = self.tick();
        pkt(tcp_frame(SRV, 80, CLI, 40_000, 5000, self.isn.wrapping_add(1), flags, bytes), c, t)
    }
    fn client_flags(&mut self, off: u32, flags: u8) -> Packet {
        let (c, t) = self.tick();
        pkt(tcp_frame(CLI, 40_000, SRV, 80, self.isn.wrapping_add(1).wrapping_add(off), 1, flags, &[]), c, t)
    }
    fn key() -> StateKey {
        let t =
            FiveTuple { src: CLI.into(), dst: SRV.into(), sport: 40_000, dport: 80, proto: sluice_packet::Proto::TCP };
        StateKey::Flow(t.flow_key())
    }
}

/// Test oracle: per direction, the byte stream rebuilt from the capture (first copy of each
/// byte wins); then the occurrences of `needle` (case-insensitive), counted once per segment
/// that completes one (the IDS reports a rule at most once per packet).
fn oracle_count(pkts: &[Packet], needle: &[u8]) -> usize {
    let mut dirs: BTreeMap<FiveTuple, (u32, BTreeMap<i64, Vec<u8>>)> = BTreeMap::new();
    for p in pkts {
        let Some(t) = p.tuple() else { continue };
        if p.hdr().l4 != sluice_packet::L4::Tcp {
            continue;
        }
        let h = p.hdr();
        let seq = if h.tcp_flags.syn() { h.tcp_seq.wrapping_add(1) } else { h.tcp_seq };
        let e = dirs.entry(t).or_insert((seq, BTreeMap::new()));
        if p.payload().is_empty() {
            continue;
        }
        let off = i64::from(seq.wrapping_sub(e.0) as i32);
        e.1.entry(off).or_insert_with(|| p.payload().to_vec());
    }
    let mut total = 0;
    for (_, (_, segs)) in dirs {
        let mut stream = Vec::new();
        let mut origin = Vec::new();
        let mut next = 0i64;
        for (n, (off, data)) in segs.into_iter().enumerate() {
            let skip = (next - off).max(0) as usize;
            if off > next {
                stream.push(0); // a hole: nothing matches across it
                origin.push(usize::MAX);
                next = off;
            }
            if let Some(new) = data.get(skip..) {
                stream.extend_from_slice(new);
                origin.resize(origin.len() + new.len(), n);
                next += new.len() as i64;
            }
        }
        let mut ends: Vec<usize> = stream
            .windows(needle.len())
            .enumerate()
            .filter(|(_, w)| w.eq_ignore_ascii_case(needle))
            .map(|(i, _)| origin[i + needle.len() - 1])
            .collect();
        ends.dedup();
        total += ends.len();
    }
    total
}

#[test]
fn default_rules_fire_on_http_capture() {
    let pkts = load_trace("http_methods.pcap");
    let expected = oracle_count(&pkts, b"<script");
    assert!(expected > 0);
    let mut inst = instance("");
    let out = run(&mut inst, pkts);
    assert!(out.iter().all(|(v, _)| *v == Verdict::Forward));
    assert_eq!(alerts(&inst, 1005).len(), expected);
    assert!(inst.events().iter().all(|e| e.kind == "alert"));
}

#[test]
fn ftp_password_and_custom_rule_fire_once() {
    let pkts = load_trace("ftp_retr.pcap");
    let mut inst = instance(
        "rules:\n  - {id: 1004, pattern: 'PASS ', nocase: true}\n  - {id: 7, pattern: 'RETR /README', msg: readme}\n",
    );
    run(&mut inst, pkts.clone());
    let pass = alerts(&inst, 1004);
    assert_eq!(pass.len(), 1);
    assert!(pass[0].subject.contains("141.142.228.5:50736 > 141.142.192.162:21"), "{}", pass[0].subject);
    let retr = alerts(&inst, 7);
    assert_eq!(retr.len(), 1);
    assert!(retr[0].detail.contains("msg=readme"));
    // The alert carries the clock of the packet holding the command.
    let idx = pkts.iter().position(|p| p.payload().starts_with(b"RETR /README")).expect("RETR");
    assert_eq!(retr[0].clock, pkts[idx].meta.clock);
    // Defaults also find the password once.
    let mut inst = instance("");
    run(&mut inst, pkts);
    assert_eq!(alerts(&inst, 1004).len(), 1);
}

#[test]
fn signature_split_across_segments_is_found_once() {
    let mut c = Conn::new(1000);
    let mut inst = instance("");
    inst.process(&mut c.syn());
    inst.process(&mut c.data(0, b"GET /etc/pa"));
    assert!(alerts(&inst, 1001).is_empty());
    let mut second = c.data(11, b"sswd HTTP/1.0\r\n\r\n");
    let clock = second.meta.clock;
    inst.process(&mut second);
    let a = alerts(&inst, 1001);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].clock, clock);
}

#[test]
fn split_across_sequence_wrap_and_three_segments() {
    let mut c = Conn::new(u32::MAX - 3);
    let mut inst = instance("");
    inst.process(&mut c.syn());
    inst.process(&mut c.data(0, b"xx/e"));
    inst.process(&mut c.data(4, b"tc/pa"));
    inst.process(&mut c.data(9, b"sswdyy"));
    assert_eq!(alerts(&inst, 1001).len(), 1);
}

#[test]
fn out_of_order_segments_are_found_once() {
    let mut c = Conn::new(5);
    let mut inst = instance("");
    inst.process(&mut c.syn());
    let mut first = c.data(0, b"GET /etc/pa");
    let mut second = c.data(11, b"sswd HTTP/1.0\r\n");
    let mut third = c.data(26, b"Host: cmd.exe\r\n");
    // Arrival: third, second, first.
    inst.process(&mut third);
    inst.process(&mut second);
    assert!(inst.events().is_empty(), "nothing is scanned across the gap");
    inst.process(&mut first);
    assert_eq!(alerts(&inst, 1001).len(), 1);
    assert_eq!(alerts(&inst, 1002).len(), 1);
    // Everything buffered was consumed.
    assert_eq!(inst.state().get(REORDER_BUFFER, &Conn::key()).ok(), Some(None));
}

#[test]
fn retransmissions_and_overlaps_do_not_alert_twice() {
    let mut c = Conn::new(77);
    let mut inst = instance("");
    inst.process(&mut c.syn());
    inst.process(&mut c.data(0, b"GET /etc/pa"));
    inst.process(&mut c.data(11, b"sswd HTTP/1.0\r\n"));
    // Exact retransmissions, and one segment overlapping both.
    inst.process(&mut c.data(0, b"GET /etc/pa"));
    inst.process(&mut c.data(11, b"sswd HTTP/1.0\r\n"));
    inst.process(&mut c.data(4, b"/etc/passwd HTTP/1.0\r\nAfter"));
    assert_eq!(alerts(&inst, 1001).len(), 1);
    // A whole-signature packet retransmitted.
    inst.process(&mut c.data(31, b"cmd.exe"));
    inst.process(&mut c.data(31, b"cmd.exe"));
    assert_eq!(alerts(&inst, 1002).len(), 1);
    // A second real occurrence later in the stream is a new alert.
    inst.process(&mut c.data(38, b" CMD.EXE"));
    assert_eq!(alerts(&inst, 1002).len(), 2);
}

#[test]
fn directions_are_separate_streams() {
    let mut c = Conn::new(1);
    let mut inst = instance("");
    inst.process(&mut c.syn());
    inst.process(&mut c.data(0, b"/etc/pa"));
    inst.process(&mut c.server(ACK | PSH, b"sswd"));
    assert!(alerts(&inst, 1001).is_empty(), "halves in opposite directions do not match");
}

#[test]
fn reorder_buffer_is_bounded_and_overflow_resyncs() {
    let mut c = Conn::new(1);
    let mut inst = instance("max_buffer_bytes: 1000");
    inst.process(&mut c.syn());
    // Byte 0 never arrives: 30 segments of 100 bytes pile up behind the gap.
    for i in 0..30u32 {
        inst.process(&mut c.data(1 + 100 * i, &[b'a'; 100]));
        let len = match inst.state().get(REORDER_BUFFER, &Conn::key()) {
            Ok(Some(Value::Bytes(b))) => b.len(),
            _ => 0,
        };
        assert!(len <= 1000 + 7 * 10, "buffer {len} bytes");
    }
    let overflows = inst.events().iter().filter(|e| e.kind == "reassembly-overflow").count();
    assert!(overflows >= 1);
    // After resynchronising, the stream is scanned again.
    inst.process(&mut c.data(3001, b"/etc/passwd"));
    assert_eq!(alerts(&inst, 1001).len(), 1);
}

#[test]
fn drop_rule_drops_packet_and_blocks_flow() {
    let mut c = Conn::new(1);
    let mut inst = instance("rules: [{id: 9, pattern: evil, action: drop}, {id: 10, pattern: meh}]");
    assert_eq!(inst.process(&mut c.syn()), Verdict::Forward);
    assert_eq!(inst.process(&mut c.data(0, b"meh ev")), Verdict::Forward);
    assert_eq!(inst.process(&mut c.data(6, b"il")), Verdict::Drop("ids-drop-rule"));
    assert_eq!(inst.process(&mut c.data(6, b"il")), Verdict::Drop("ids-blocked"));
    assert_eq!(inst.process(&mut c.server(ACK, b"")), Verdict::Drop("ids-blocked"));
    assert_eq!(alerts(&inst, 9).len(), 1);
    assert_eq!(alerts(&inst, 10).len(), 1);
    assert!(alerts(&inst, 9)[0].detail.contains("action=drop"));
}

#[test]
fn rst_and_fin_release_state() {
    let mut c = Conn::new(1);
    let mut inst = instance("close_timeout_ms: 10");
    inst.process(&mut c.syn());
    inst.process(&mut c.data(0, b"hello"));
    assert!(matches!(inst.state().get(STREAM, &Conn::key()), Ok(Some(_))));
    inst.process(&mut c.server(RST | ACK, b""));
    assert_eq!(inst.state().get(STREAM, &Conn::key()).ok(), Some(None));
    // Pure ACKs create no state.
    inst.process(&mut c.client_flags(5, ACK));
    assert_eq!(inst.state().get(STREAM, &Conn::key()).ok(), Some(None));

    let mut c = Conn::new(1);
    let mut inst = instance("close_timeout_ms: 10");
    inst.process(&mut c.syn());
    inst.process(&mut c.data(0, b"x/etc/passwd"));
    inst.process(&mut c.client_flags(12, FIN | ACK));
    inst.process(&mut c.server(FIN | ACK, b""));
    // A late retransmission during the linger is recognised as old.
    inst.process(&mut c.data(0, b"x/etc/passwd"));
    assert_eq!(alerts(&inst, 1001).len(), 1);
    inst.advance_time(1_000 * MS, sluice_packet::Clock::new(0, 999));
    assert_eq!(inst.state().get(STREAM, &Conn::key()).ok(), Some(None));
}

#[test]
fn a_payloadless_syn_creates_state_other_payloadless_packets_do_not() {
    // Pure ACKs, FINs and RSTs of an untracked flow create no state.
    for flags in [ACK, FIN | ACK, RST, SYN | RST] {
        let mut c = Conn::new(1);
        let mut inst = instance("");
        inst.process(&mut c.client_flags(0, flags));
        assert_eq!(inst.state().get(STREAM, &Conn::key()).ok(), Some(None), "flags {flags:#x}");
    }
    // A SYN, or a SYN-ACK, without payload does: the stream starts at its sequence number.
    let mut c = Conn::new(1);
    let mut inst = instance("");
    inst.process(&mut c.syn());
    assert!(matches!(inst.state().get(STREAM, &Conn::key()), Ok(Some(_))));
    let mut c = Conn::new(1);
    let mut inst = instance("");
    inst.process(&mut c.server(SYN | ACK, b""));
    assert!(matches!(inst.state().get(STREAM, &Conn::key()), Ok(Some(_))));
}

#[test]
fn reused_tuple_after_close_is_a_new_stream() {
    let mut c = Conn::new(1000);
    let mut inst = instance("close_timeout_ms: 5000");
    inst.process(&mut c.syn());
    inst.process(&mut c.data(0, b"/etc/passwd"));
    inst.process(&mut c.client_flags(11, FIN | ACK));
    inst.process(&mut c.server(FIN | ACK, b""));
    // Same ports, new ISN, while the old state lingers; its bytes lie "behind" the old stream.
    let mut d = Conn::new(500);
    d.clock = 100;
    inst.process(&mut d.syn());
    inst.process(&mut d.data(0, b"/etc/passwd"));
    assert_eq!(alerts(&inst, 1001).len(), 2);
    // A SYN in the middle of a live connection does not reset it.
    let mut inst = instance("");
    let mut c = Conn::new(1000);
    inst.process(&mut c.syn());
    inst.process(&mut c.data(0, b"/etc/pa"));
    inst.process(&mut Conn::new(9).syn());
    inst.process(&mut c.data(7, b"sswd"));
    assert_eq!(alerts(&inst, 1001).len(), 1);
}

#[test]
fn idle_flows_expire() {
    let mut c = Conn::new(1);
    let mut inst = instance("idle_timeout_ms: 100");
    inst.process(&mut c.syn());
    inst.process(&mut c.data(10, b"gap"));
    // Still active at 50 ms: the timer re-arms instead of deleting.
    inst.advance_time(50 * MS, sluice_packet::Clock::new(0, 50));
    assert!(matches!(inst.state().get(STREAM, &Conn::key()), Ok(Some(_))));
    inst.advance_time(500 * MS, sluice_packet::Clock::new(0, 51));
    assert_eq!(inst.state().get(STREAM, &Conn::key()).ok(), Some(None));
    assert_eq!(inst.state().get(REORDER_BUFFER, &Conn::key()).ok(), Some(None));
}

#[test]
fn bad_config_is_rejected() {
    for y in [
        "rules: []",
        "rules: [{id: 1, pattern: ''}]",
        "rules: [{id: 1, pattern: a}, {id: 1, pattern: b}]",
        "rules: [{id: 1, pattern: a, action: explode}]",
        "rules: [{pattern: a}]",
        "idle_timeout_ms: 0",
        "other: 1",
    ] {
        let cfg: serde_yaml::Value = serde_yaml::from_str(y).expect("yaml");
        assert!(local_instance(&registry(), "ids", &cfg).is_err(), "{y}");
    }
}

fn sample_packets() -> &'static [Packet] {
    static P: std::sync::OnceLock<Vec<Packet>> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let mut v = load_trace("ftp_retr.pcap");
        v.extend(load_trace("http_methods.pcap").into_iter().take(100));
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn never_panics(
        raw in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 0..8),
        segs in proptest::collection::vec((any::<u32>(), any::<u8>(), proptest::collection::vec(any::<u8>(), 0..64)), 0..40),
        picks in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 0..40),
    ) {
        let mut inst = instance("max_buffer_bytes: 256\nrules: [{id: 1, pattern: ab, action: drop}, {id: 2, pattern: Cd, nocase: true}]");
        for (n, bytes) in raw.into_iter().enumerate() {
            let _ = inst.process(&mut pkt(bytes, n as u64, n as u64));
        }
        for (n, (seq, flags, data)) in segs.into_iter().enumerate() {
            // Small sequence space so that segments overlap, reorder and wrap.
            let seq = (u32::MAX - 64).wrapping_add(seq % 256);
            let (s, d) = if flags & 0x80 != 0 { (SRV, CLI) } else { (CLI, SRV) };
            let f = tcp_frame(s, 1, d, 1, seq, 0, flags & 0x1f, &data);
            let v = inst.process(&mut pkt(f, 100 + n as u64, MS * n as u64));
            prop_assert!(matches!(v, Verdict::Forward | Verdict::Drop(_)));
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
            prop_assert!(matches!(v, Verdict::Forward | Verdict::Drop(_)));
        }
    }
}
