//! Rule updates: a swap to re-encrypted rules at 50% of the demo trace decides every packet
//! before it exactly as the old rules do and every packet after it as a chain restarted with
//! the new rules does; packets of mixed generations are refused and counted.

use rand::SeedableRng;
use sluice_embark::compare::{compare_with_swap, event_key, SwapPlan};
use sluice_embark::gateway::{frame_generation, Gateway, GatewayState};
use sluice_embark::provider::{Outcome, ProviderChain};
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::swap::Provider;
use sluice_embark::{EmbarkError, MasterKey};
use sluice_packet::Packet;
use std::collections::HashSet;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn old_rules() -> ProviderConfig {
    let text = std::fs::read_to_string(root().join("chains/embark/provider.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

/// The update: the firewall denies TCP to ports 100-1000 first (the demo trace's port scan
/// goes on after 50%), the IDS gets a keyword of the IRC session that starts after 50%.
fn new_rules() -> ProviderConfig {
    let mut c = old_rules();
    let add = |c: &mut ProviderConfig, nf: &str, rule: &str, first: bool| {
        let spec = c.nfs.iter_mut().find(|n| n.name == nf).unwrap();
        let rules = spec.config.get_mut("rules").unwrap().as_sequence_mut().unwrap();
        let r: serde_yaml::Value = serde_yaml::from_str(rule).unwrap();
        if first {
            rules.insert(0, r);
        } else {
            rules.push(r);
        }
    };
    add(&mut c, "fw", "{action: deny, proto: tcp, dport: \"100-1000\"}", true);
    add(&mut c, "ids", "{id: 10, pattern: \"bot123\", msg: \"new keyword\"}", false);
    c
}

struct Setup {
    key: MasterKey,
    plain: [ProviderConfig; 2],
    enc: [ProviderConfig; 2],
    state: [GatewayState; 2],
}

fn setup() -> Setup {
    let key = MasterKey::from_bytes([11; 32]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let plain = [old_rules(), new_rules()];
    let (e1, s1) = encrypt_provider(&key, &plain[0], 1, &mut rng).unwrap();
    let (e2, s2) = encrypt_provider(&key, &plain[1], 2, &mut rng).unwrap();
    Setup { key, plain, enc: [e1, e2], state: [s1, s2] }
}

/// Per packet: outcome and sorted event keys of the plaintext chain, with the rules of
/// `cfgs[0]` before `switch` and a fresh chain of `cfgs[1]` from it on.
fn decide(cfgs: [&ProviderConfig; 2], packets: &[Packet], switch: usize) -> Vec<(Outcome, Vec<String>)> {
    let reg = sluice_nfs::registry();
    let mut ch = ProviderChain::build(&reg, cfgs[0]).unwrap();
    let mut out = Vec::new();
    for (i, orig) in packets.iter().enumerate() {
        if i == switch {
            ch = ProviderChain::build(&reg, cfgs[1]).unwrap();
        }
        let mut p = orig.clone();
        p.meta.clock = sluice_packet::Clock(i as u64);
        let o = ch.process(&mut p);
        let mut ev: Vec<String> = ch.take_events().iter().map(event_key).collect();
        ev.sort();
        out.push((o, ev));
    }
    out
}

fn is_new_rule_effect(d: &(Outcome, Vec<String>)) -> bool {
    d.1.iter().any(|e| e.starts_with("fw acl-deny") || e.contains("rule=10"))
}

#[test]
fn swap_at_half_decides_before_under_old_rules_after_under_new_and_nothing_mixed() {
    let s = setup();
    let packets = sluice_io::pcap::load(root().join("traces/demo.pcap"), None).unwrap();
    let k = packets.len() / 2;
    let in_flight = 64;
    let reg = sluice_nfs::registry();
    let mut gw = Gateway::new(&s.key, s.state[0].clone()).unwrap();
    let plan = SwapPlan { at: k, plain: &s.plain[1], enc: &s.enc[1], state: s.state[1].clone(), key: &s.key };
    let c = compare_with_swap(&reg, &s.plain[0], &s.enc[0], &mut gw, &packets, Some(plan), in_flight).unwrap();
    // Every packet decided (and delivered) as the reference: old rules before k, new after.
    assert!(c.differences.is_empty(), "{:#?}", c.differences);
    assert!(c.refused.is_empty(), "{:?}", c.refused);
    assert_eq!(c.forwarded + c.dropped.values().sum::<u64>(), c.packets - c.non_ip);
    assert_eq!(c.swap_at, Some(k as u64));
    // The packets in flight at the switch went through the old chain after the gateway had
    // switched, and the old generation was retired right after the last of them (input k-1).
    assert_eq!(c.old_after_swap, in_flight as u64);
    assert_eq!(c.retired_after, Some((k - 1) as u64));
    assert_eq!(gw.previous_generation(), None);
    assert_eq!(gw.generation(), 2);

    // The test can fail: the rules differ on both sides of the swap.
    let old = decide([&s.plain[0], &s.plain[0]], &packets, usize::MAX);
    let new = decide([&s.plain[1], &s.plain[1]], &packets, usize::MAX);
    let swapped = decide([&s.plain[0], &s.plain[1]], &packets, k);
    // Before k the new rules would have decided packets differently (denied connections,
    // alerts of the new keyword): the encrypted path, equal to `swapped`, did not.
    assert!(new[..k].iter().filter(|d| is_new_rule_effect(d)).count() > 10);
    assert_eq!(old[..k], swapped[..k]);
    assert!(!swapped[..k].iter().any(is_new_rule_effect));
    // After k the new rules act: denies and new-keyword alerts; the old rules had none.
    let after = swapped[k..].iter().filter(|d| is_new_rule_effect(d)).count();
    assert!(after > 10, "{after}");
    assert!(swapped[k..].iter().any(|d| d.1.iter().any(|e| e.contains("rule=10"))));
    assert!(!old[k..].iter().any(is_new_rule_effect));
}

#[test]
fn live_tcp_connections_restart_at_the_swap() {
    let s = setup();
    let packets = sluice_io::pcap::load(root().join("traces/demo.pcap"), None).unwrap();
    let k = packets.len() / 2;
    let flows = |r: std::ops::Range<usize>| -> HashSet<_> {
        packets[r].iter().filter_map(|p| p.tuple()).map(|t| t.flow_key()).collect()
    };
    let live: HashSet<_> = flows(0..k).intersection(&flows(k..packets.len())).copied().collect();
    assert!(live.len() > 20, "{}", live.len());
    let old = decide([&s.plain[0], &s.plain[0]], &packets, usize::MAX);
    let swapped = decide([&s.plain[0], &s.plain[1]], &packets, k);
    let no_conn = Outcome::Drop { nf: "fw".into(), reason: "fw-no-connection" };
    let (mut cut, mut kept_before) = (0, 0);
    for (i, p) in packets.iter().enumerate().skip(k) {
        if !live.contains(&p.tuple().unwrap().flow_key()) {
            continue;
        }
        // Mid-stream packets of connections open across the swap: the fresh firewall does
        // not know them (old rules would have let them through).
        if swapped[i].0 == no_conn {
            cut += 1;
            kept_before += u64::from(old[i].0 == Outcome::Forward);
        }
    }
    assert!(cut > 100, "{cut}");
    assert!(kept_before * 10 > cut * 9, "{kept_before} of {cut}");
    // And the encrypted path does the same (it equals `swapped`; see the test above), counted.
    let mut gw = Gateway::new(&s.key, s.state[0].clone()).unwrap();
    let plan = SwapPlan { at: k, plain: &s.plain[1], enc: &s.enc[1], state: s.state[1].clone(), key: &s.key };
    let reg = sluice_nfs::registry();
    let c = compare_with_swap(&reg, &s.plain[0], &s.enc[0], &mut gw, &packets, Some(plan), 0).unwrap();
    assert!(c.differences.is_empty(), "{:#?}", c.differences);
    assert!(c.dropped.get("fw: fw-no-connection").copied().unwrap_or(0) >= cut);
}

/// An encrypted demo packet with token records, under both generations.
fn both_generations(s: &Setup) -> [(Packet, Vec<Packet>); 2] {
    let packets = sluice_io::pcap::load(root().join("traces/demo.pcap"), None).unwrap();
    let mut g1 = Gateway::new(&s.key, s.state[0].clone()).unwrap();
    let mut g2 = Gateway::new(&s.key, s.state[1].clone()).unwrap();
    for p in &packets {
        let (a, b) = (g1.encrypt(p).unwrap(), g2.encrypt(p).unwrap());
        if !a.tokens.is_empty() && !b.tokens.is_empty() {
            return [(a.data, a.tokens), (b.data, b.tokens)];
        }
    }
    panic!("no packet with token records");
}

#[test]
fn packets_of_another_generation_are_refused_and_counted() {
    let s = setup();
    let reg = sluice_nfs::registry();
    let [(d1, t1), (d2, t2)] = both_generations(&s);
    assert_eq!(frame_generation(d1.data()), Some(1));
    assert_eq!(frame_generation(d2.data()), Some(2));
    assert_eq!(frame_generation(t1[0].data()), Some(1));
    assert_eq!(frame_generation(t2[0].data()), Some(2));
    // A chain never runs a packet of another generation.
    let mut c2 = ProviderChain::build(&reg, &s.enc[1]).unwrap();
    assert!(matches!(c2.process(&mut d1.clone()), Outcome::Refused(_)));
    assert!(matches!(c2.process_with_tokens(&mut d2.clone(), &mut t1.clone()), Outcome::Refused(_)));
    assert!(!matches!(c2.process_with_tokens(&mut d2.clone(), &mut t2.clone()), Outcome::Refused(_)));

    let mut prov = Provider::new(ProviderChain::build(&reg, &s.enc[0]).unwrap()).unwrap();
    assert!(prov.stage(ProviderChain::build(&reg, &s.enc[0]).unwrap()).is_err(), "not newer");
    prov.stage(ProviderChain::build(&reg, &s.enc[1]).unwrap()).unwrap();
    assert_eq!(prov.generations(), vec![1, 2]);
    // Each generation to its own chain during the swap.
    assert!(!matches!(prov.process_with_tokens(&mut d1.clone(), &mut t1.clone()), Outcome::Refused(_)));
    assert!(!matches!(prov.process_with_tokens(&mut d2.clone(), &mut t2.clone()), Outcome::Refused(_)));
    // Header fields of generation 2 with tokens of generation 1 (and the reverse): refused.
    assert!(matches!(prov.process_with_tokens(&mut d2.clone(), &mut t1.clone()), Outcome::Refused(_)));
    assert!(matches!(prov.process_with_tokens(&mut d1.clone(), &mut t2.clone()), Outcome::Refused(_)));
    prov.retire(1).unwrap();
    assert!(prov.retire(2).is_err(), "the only live generation stays");
    // A late packet of the retired generation: refused.
    assert!(matches!(prov.process_with_tokens(&mut d1.clone(), &mut []), Outcome::Refused(_)));
    assert_eq!(prov.refused().values().sum::<u64>(), 3, "{:?}", prov.refused());

    // The gateway: decrypts both generations during the swap, only the new one after.
    let mut gw = Gateway::new(&s.key, s.state[0].clone()).unwrap();
    assert!(matches!(gw.rekey(&s.key, s.state[0].clone()), Err(EmbarkError::BadRule(_))));
    gw.rekey(&s.key, s.state[1].clone()).unwrap();
    assert!(gw.decrypt(&d1).is_ok() && gw.decrypt(&d2).is_ok());
    assert!(gw.rekey(&s.key, s.state[1].clone()).is_err(), "one swap at a time");
    assert_eq!(gw.retire_previous(), Some(1));
    assert!(matches!(gw.decrypt(&d1), Err(EmbarkError::WrongKey(_))));
    assert!(gw.decrypt(&d2).is_ok());
}
