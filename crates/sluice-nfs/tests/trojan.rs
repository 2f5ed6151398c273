//! Trojan detector over real captures rewritten so that one client runs SSH, FTP and IRC.

mod common;
mod synth;

use common::{compose, load_trace, run};
use proptest::prelude::*;
use sluice_nf::{local_instance, Event, Instance, Verdict};
use sluice_nfs::registry;
use sluice_packet::{Clock, Packet};
use std::net::IpAddr;
use synth::{checksums_ok, ip, replace_payload, rewrite_host, Rng};

fn instance() -> Instance {
    local_instance(&registry(), "trojan", &serde_yaml::Value::Null).expect("build trojan")
}

fn host_a() -> IpAddr {
    ip(10, 9, 9, 9)
}

fn host_b() -> IpAddr {
    ip(10, 8, 8, 8)
}

/// The captures' client addresses.
fn ssh_client() -> IpAddr {
    ip(192, 150, 186, 169)
}
fn ftp_retr_client() -> IpAddr {
    ip(141, 142, 228, 5)
}
fn ftp_ipv4_client() -> IpAddr {
    ip(141, 142, 220, 235)
}
fn irc_client() -> IpAddr {
    ip(192, 168, 6, 110)
}

/// Replaces the payload of the `n`-th packet whose payload starts with `RETR `.
fn rewrite_retr(pkts: &mut [Packet], n: usize, cmd: &str) {
    let i = pkts
        .iter()
        .enumerate()
        .filter(|(_, p)| p.payload().starts_with(b"RETR "))
        .nth(n)
        .map(|(i, _)| i)
        .expect("RETR command in trace");
    let new = replace_payload(&pkts[i], cmd.as_bytes());
    assert_eq!(new.payload(), cmd.as_bytes());
    assert!(checksums_ok(new.data()), "checksums fixed");
    pkts[i] = new;
}

fn ssh(host: IpAddr) -> Vec<Packet> {
    let mut t = load_trace("ssh_single-conn.pcap");
    rewrite_host(&mut t, ssh_client(), host);
    t
}

/// `ftp_retr.pcap` with its `RETR /README` turned into a download of `name`.
fn ftp_one(host: IpAddr, name: Option<&str>) -> Vec<Packet> {
    let mut t = load_trace("ftp_retr.pcap");
    if let Some(name) = name {
        rewrite_retr(&mut t, 0, &format!("RETR {name}\r\n"));
    }
    rewrite_host(&mut t, ftp_retr_client(), host);
    t
}

/// `ftp_ipv4.pcap` with its two `RETR robots.txt` turned into downloads of `a` and `b`.
fn ftp_two(host: IpAddr, a: &str, b: &str) -> Vec<Packet> {
    let mut t = load_trace("ftp_ipv4.pcap");
    rewrite_retr(&mut t, 0, &format!("RETR {a}\r\n"));
    rewrite_retr(&mut t, 1, &format!("retr {b}\r\n"));
    rewrite_host(&mut t, ftp_ipv4_client(), host);
    t
}

fn irc(host: IpAddr) -> Vec<Packet> {
    let mut t = load_trace("irc-basic.pcap");
    rewrite_host(&mut t, irc_client(), host);
    t
}

/// The four pieces of the full pattern for `host`: SSH, HTML download, ZIP+EXE downloads, IRC.
fn pieces(host: IpAddr) -> [Vec<Packet>; 4] {
    [ssh(host), ftp_one(host, Some("/pub/index.html")), ftp_two(host, "tools.ZIP", "/bin/setup.exe"), irc(host)]
}

fn trojan_events(events: &[Event]) -> Vec<&Event> {
    events.iter().filter(|e| e.kind == "trojan").collect()
}

/// Runs packets in the given order and returns the subjects of the `trojan` events.
fn flagged(packets: Vec<Packet>) -> Vec<String> {
    let mut inst = instance();
    let out = run(&mut inst, packets);
    assert!(out.iter().all(|(v, _)| *v == Verdict::Forward), "the detector never drops");
    trojan_events(inst.events()).iter().map(|e| e.subject.clone()).collect()
}

const GAP: u64 = 1_000_000_000;

#[test]
fn rewritten_traces_carry_the_events() {
    let [s, h, zx, i] = pieces(host_a());
    assert!(s.iter().any(|p| p.tuple().is_some_and(|t| t.src == host_a() && t.dport == 22)));
    let retrs: Vec<_> = h.iter().chain(&zx).filter(|p| p.payload().len() > 5).map(|p| p.payload().to_vec()).collect();
    let text: Vec<String> = retrs.iter().map(|b| String::from_utf8_lossy(b).to_string()).collect();
    assert!(text.iter().any(|t| t.starts_with("RETR /pub/index.html")));
    assert!(text.iter().any(|t| t.starts_with("RETR tools.ZIP")));
    assert!(text.iter().any(|t| t.starts_with("retr /bin/setup.exe")));
    assert!(i.iter().any(|p| p.tuple().is_some_and(|t| t.src == host_a()) && p.payload().starts_with(b"NICK")));
}

#[test]
fn full_pattern_flags_exactly_that_host_once() {
    let [s, h, zx, i] = pieces(host_a());
    let subjects = flagged(compose(&[s, h, zx, i], GAP));
    assert_eq!(subjects, vec![host_a().to_string()]);
}

#[test]
fn file_types_in_any_order_among_themselves() {
    let [s, h, zx, i] = pieces(host_a());
    assert_eq!(flagged(compose(&[s.clone(), zx, h.clone(), i.clone()], GAP)), vec![host_a().to_string()]);
    // Exe first, then html, then zip.
    let xz = ftp_two(host_a(), "a.exe", "b.zip");
    let h2 = ftp_one(host_a(), Some("c.htm"));
    assert_eq!(flagged(compose(&[s, xz.clone(), h2, i.clone()], GAP)), vec![host_a().to_string()]);
}

#[test]
fn wrong_orders_flag_nobody() {
    let [s, h, zx, i] = pieces(host_a());
    let orders: [[&Vec<Packet>; 4]; 6] = [
        [&i, &s, &h, &zx], // IRC first
        [&s, &i, &h, &zx], // IRC before the FTP downloads
        [&h, &zx, &s, &i], // FTP before SSH
        [&h, &zx, &i, &s], // SSH last
        [&s, &h, &i, &zx], // a download after IRC
        [&zx, &s, &h, &i], // zip/exe before SSH
    ];
    for (n, o) in orders.iter().enumerate() {
        let traces: Vec<Vec<Packet>> = o.iter().map(|t| (*t).clone()).collect();
        assert!(flagged(compose(&traces, GAP)).is_empty(), "order {n} must not flag");
    }
}

#[test]
fn missing_steps_flag_nobody() {
    let [s, h, zx, i] = pieces(host_a());
    assert!(flagged(compose(&[h.clone(), zx.clone(), i.clone()], GAP)).is_empty(), "no SSH");
    assert!(flagged(compose(&[s.clone(), h.clone(), zx.clone()], GAP)).is_empty(), "no IRC");
    // Only two of the three types: the original RETR /README is no html file.
    let readme = ftp_one(host_a(), None);
    assert!(flagged(compose(&[s.clone(), readme, zx, i.clone()], GAP)).is_empty(), "no html");
    let two_zips = ftp_two(host_a(), "a.zip", "b.zip");
    assert!(flagged(compose(&[s, h, two_zips, i], GAP)).is_empty(), "no exe");
}

/// Delivers `packets` in an arrival order that keeps each trace's own order but interleaves
/// the traces, with `first` delivered before everything else. Clocks are untouched.
fn interleave(parts: Vec<Vec<Packet>>, first: usize, rng: &mut Rng) -> Vec<Packet> {
    let mut queues: Vec<std::collections::VecDeque<Packet>> = parts.into_iter().map(Into::into).collect();
    let mut out: Vec<Packet> = queues[first].drain(..).collect();
    while queues.iter().any(|q| !q.is_empty()) {
        let live: Vec<usize> = (0..queues.len()).filter(|&i| !queues[i].is_empty()).collect();
        let q = live[rng.below(live.len())];
        out.extend(queues[q].pop_front());
    }
    out
}

/// Splits a composed trace back into its pieces by clock ranges.
fn split(composed: Vec<Packet>, lens: &[usize]) -> Vec<Vec<Packet>> {
    let mut it = composed.into_iter();
    lens.iter().map(|&n| it.by_ref().take(n).collect()).collect()
}

#[test]
fn out_of_order_arrival_with_right_clocks_still_flags() {
    let pieces = pieces(host_a());
    let lens: Vec<usize> = pieces.iter().map(Vec::len).collect();
    let composed = compose(&pieces, GAP);
    // Clocks say SSH < FTP < IRC; the IRC flow reaches the detector first.
    let parts = split(composed.clone(), &lens);
    let mut arrival: Vec<Packet> = parts[3].clone();
    arrival.extend(parts[2].iter().cloned());
    arrival.extend(parts[1].iter().cloned());
    arrival.extend(parts[0].iter().cloned());
    assert_eq!(flagged(arrival), vec![host_a().to_string()]);
    // Random interleavings that keep each flow's own order.
    for seed in 1..=8u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let parts = split(composed.clone(), &lens);
        let arrival = interleave(parts, 3, &mut rng);
        assert_eq!(flagged(arrival), vec![host_a().to_string()], "seed {seed}");
    }
}

#[test]
fn right_arrival_order_with_wrong_clocks_flags_nobody() {
    let [s, h, zx, i] = pieces(host_a());
    let lens = [i.len(), s.len(), h.len(), zx.len()];
    // Chain entry saw IRC first ...
    let parts = split(compose(&[i, s, h, zx], GAP), &lens);
    // ... but the detector receives SSH, FTP, IRC.
    let arrival: Vec<Packet> = [1, 2, 3, 0].iter().flat_map(|&k| parts[k].clone()).collect();
    assert!(flagged(arrival).is_empty());
}

#[test]
fn second_host_with_partial_pattern_is_not_flagged() {
    let [s, h, zx, i] = pieces(host_a());
    // Host B: SSH, html only, IRC.
    let sb = ssh(host_b());
    let hb = ftp_one(host_b(), Some("b.html"));
    let ib = irc(host_b());
    let composed = compose(&[sb, s, hb, h, zx, ib, i], GAP);
    let mut inst = instance();
    run(&mut inst, composed);
    let ev = trojan_events(inst.events());
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].subject, host_a().to_string());
    assert_eq!(ev[0].kind, "trojan");
    // The event carries the clock of the first IRC command of host A.
    assert!(ev[0].clock > Clock::new(0, 0));
}

#[test]
fn host_state_expires() {
    let cfg: serde_yaml::Value = serde_yaml::from_str("host_timeout_ms: 1000").expect("yaml");
    let mut inst = local_instance(&registry(), "trojan", &cfg).expect("build");
    let [s, h, zx, i] = pieces(host_a());
    // 10 s gaps: the SSH record is forgotten before the downloads.
    run(&mut inst, compose(&[s, h, zx, i], 10 * GAP));
    assert!(trojan_events(inst.events()).is_empty());
    let key = sluice_nf::StateKey::Addr(host_a());
    // Once packet time passes the timeout, the host's record is gone.
    inst.advance_time(u64::MAX / 2, Clock::new(0, 1 << 40));
    assert_eq!(inst.state().get(sluice_nfs::trojan::HOST_EVENTS, &key).ok(), Some(None));
}

#[test]
fn bad_config_is_rejected() {
    for y in ["ssh_ports: []", "host_timeout_ms: -1", "max_clocks_per_type: 1", "nope: 1"] {
        let cfg: serde_yaml::Value = serde_yaml::from_str(y).expect("yaml");
        assert!(local_instance(&registry(), "trojan", &cfg).is_err(), "{y}");
    }
}

fn sample_packets() -> &'static [Packet] {
    static P: std::sync::OnceLock<Vec<Packet>> = std::sync::OnceLock::new();
    P.get_or_init(|| pieces(host_a()).concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn never_panics(
        raw in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 0..8),
        picks in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 0..40),
    ) {
        let mut inst = instance();
        for (n, bytes) in raw.into_iter().enumerate() {
            let mut p = synth::pkt(bytes, n as u64, n as u64);
            let _ = inst.process(&mut p);
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
            let mut q = synth::pkt(data, 1000 + n as u64, p.meta.ts_ns);
            let v = inst.process(&mut q);
            prop_assert!(matches!(v, Verdict::Forward | Verdict::Drop(_) | Verdict::Output(_)));
        }
    }
}

/// With a timeout the detector needs chain-entry order (forgetting a host is decided in time
/// order); with `host_timeout_ms: 0` it never forgets, arms no timer and takes arrival order,
/// deciding on clocks alone.
#[test]
fn only_a_detector_that_forgets_asks_for_entry_order() {
    let order = |y: &str| {
        let cfg: serde_yaml::Value = serde_yaml::from_str(y).expect("yaml");
        local_instance(&registry(), "trojan", &cfg).expect("trojan").nf().input_order()
    };
    assert_eq!(order("host_timeout_ms: 1000"), sluice_nf::InputOrder::Clock);
    assert_eq!(order("host_timeout_ms: 0"), sluice_nf::InputOrder::Arrival);
    let cfg: serde_yaml::Value = serde_yaml::from_str("host_timeout_ms: 0").expect("yaml");
    let mut inst = local_instance(&registry(), "trojan", &cfg).expect("trojan");
    for p in sample_packets() {
        let mut p = p.clone();
        inst.process(&mut p);
    }
    let key = sluice_nf::StateKey::Addr(host_a());
    inst.advance_time(u64::MAX / 2, Clock::new(0, 1 << 40));
    let kept = inst.state().get(sluice_nfs::trojan::HOST_EVENTS, &key).ok().flatten();
    assert!(kept.is_some(), "a detector that never forgets lost the host's record");
}
