//! Rule updates: a swap to re-encrypted rules at 50% of the demo trace decides every packet
//! before it exactly as the old rules do; after it, connections live at the swap keep the old
//! rules and their NF state (NAT mapping, LB backend) and new connections meet the new rules;
//! packets of mixed generations are refused and counted.

use rand::SeedableRng;
use sluice_embark::compare::{compare_with_swap, event_key, SwapPlan};
use sluice_embark::gateway::{frame_generation, Gateway, GatewayState};
use sluice_embark::provider::{Outcome, ProviderChain};
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::swap::Provider;
use sluice_embark::{EmbarkError, MasterKey};
use sluice_packet::Packet;
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

/// Per packet: outcome, sorted event keys and the tuple the chain delivered (after NAT and LB
/// rewrites) of the plaintext reference: packets the gateway made under generation 1 go to a
/// chain of `cfgs[0]`, the others to a chain of `cfgs[1]` built at the first of them; each
/// chain keeps its state throughout.
fn decide(cfgs: [&ProviderConfig; 2], packets: &[Packet], gens: &[u32]) -> Vec<(Outcome, Vec<String>, String)> {
    let reg = sluice_nfs::registry();
    let mut chains = [ProviderChain::build(&reg, cfgs[0]).unwrap(), ProviderChain::build(&reg, cfgs[1]).unwrap()];
    let mut out = Vec::new();
    for (i, orig) in packets.iter().enumerate() {
        let ch = &mut chains[usize::from(gens.get(i) != Some(&1))];
        let mut p = orig.clone();
        p.meta.clock = sluice_packet::Clock(i as u64);
        let o = ch.process(&mut p);
        let mut ev: Vec<String> = ch.take_events().iter().map(event_key).collect();
        ev.sort();
        out.push((o, ev, p.tuple().map(|t| t.to_string()).unwrap_or_default()));
    }
    out
}

/// The generation the gateway makes each packet under with a swap at `k` (0: refused).
fn generations(s: &Setup, packets: &[Packet], k: usize) -> Vec<u32> {
    let mut gw = Gateway::new(&s.key, s.state[0].clone()).unwrap();
    let mut v = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        if i == k {
            gw.rekey(&s.key, s.state[1].clone()).unwrap();
        }
        v.push(gw.encrypt(p).ok().and_then(|e| frame_generation(e.data.data())).unwrap_or(0));
    }
    v
}

fn is_new_rule_effect(d: &(Outcome, Vec<String>, String)) -> bool {
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
    // Every packet decided (and delivered) as the reference: old rules before k, and after
    // it for the connections kept under the old generation; new rules for the others.
    assert!(c.differences.is_empty(), "{:#?}", c.differences);
    assert!(c.refused.is_empty(), "{:?}", c.refused);
    assert_eq!(c.forwarded + c.dropped.values().sum::<u64>(), c.packets - c.non_ip);
    assert_eq!(c.swap_at, Some(k as u64));
    // Connections live at the switch kept sending under the old generation: far more old
    // packets after the switch than the ones in flight at it.
    assert!(c.old_after_swap > 10 * in_flight as u64, "{}", c.old_after_swap);
    // Retired exactly when no connection was left under it (if that happened in the trace).
    assert_eq!(gw.previous_generation().is_none(), c.retired_after.is_some());
    assert_eq!(gw.pinned_connections() == 0, c.retired_after.is_some() || gw.previous_generation().is_none());
    assert_eq!(gw.generation(), 2);

    // The test can fail: the rules differ on both sides of the swap.
    let gens = generations(&s, &packets, k);
    let old = decide([&s.plain[0], &s.plain[0]], &packets, &[]);
    let new = decide([&s.plain[1], &s.plain[1]], &packets, &[]);
    let swapped = decide([&s.plain[0], &s.plain[1]], &packets, &gens);
    // Before k the new rules would have decided packets differently (denied connections,
    // alerts of the new keyword): the encrypted path, equal to `swapped`, did not.
    assert!(new[..k].iter().filter(|d| is_new_rule_effect(d)).count() > 10);
    assert_eq!(old[..k], swapped[..k]);
    assert!(!swapped[..k].iter().any(is_new_rule_effect));
    // After k the new rules act on new connections: denies and new-keyword alerts; the old
    // rules had none.
    let after = swapped[k..].iter().filter(|d| is_new_rule_effect(d)).count();
    assert!(after > 10, "{after}");
    assert!(swapped[k..].iter().any(|d| d.1.iter().any(|e| e.contains("rule=10"))));
    assert!(!old[k..].iter().any(is_new_rule_effect));
}

#[test]
fn live_connections_keep_their_state_nat_mapping_and_lb_backend_across_the_swap() {
    let s = setup();
    let packets = sluice_io::pcap::load(root().join("traces/demo.pcap"), None).unwrap();
    let k = packets.len() / 2;
    let gens = generations(&s, &packets, k);
    let old = decide([&s.plain[0], &s.plain[0]], &packets, &[]);
    let swapped = decide([&s.plain[0], &s.plain[1]], &packets, &gens);
    // Every packet after the switch that the gateway kept under generation 1 is decided and
    // delivered (NAT source, LB backend) exactly as without any swap.
    let (mut kept, mut natted, mut balanced) = (0, 0, 0);
    for i in k..packets.len() {
        if gens[i] != 1 {
            continue;
        }
        assert_eq!(swapped[i], old[i], "packet {i}");
        kept += 1;
        natted += u64::from(old[i].2.contains("198.51.100.1"));
        balanced += u64::from(old[i].2.contains("10.1.0."));
    }
    assert!(kept > 1000, "{kept}");
    assert!(natted > 100 && balanced > 100, "{natted} NAT'd, {balanced} balanced");
    // Without pinning (every packet after k under the new rules, fresh state), these
    // connections would be cut: the test can fail.
    let restarted = decide(
        [&s.plain[0], &s.plain[1]],
        &packets,
        &gens.iter().enumerate().map(|(i, &g)| if i < k { g } else { 2 }).collect::<Vec<_>>(),
    );
    let no_conn = Outcome::Drop { nf: "fw".into(), reason: "fw-no-connection" };
    let cut = (k..packets.len()).filter(|&i| gens[i] == 1 && restarted[i].0 == no_conn).count();
    let cut_pinned =
        (k..packets.len()).filter(|&i| gens[i] == 1 && swapped[i].0 == no_conn && old[i].0 != no_conn).count();
    assert!(cut > 100, "{cut}");
    assert_eq!(cut_pinned, 0);
    // And the encrypted path does the same (it equals `swapped`; see the test above), with
    // no packet in flight.
    let mut gw = Gateway::new(&s.key, s.state[0].clone()).unwrap();
    let plan = SwapPlan { at: k, plain: &s.plain[1], enc: &s.enc[1], state: s.state[1].clone(), key: &s.key };
    let reg = sluice_nfs::registry();
    let c = compare_with_swap(&reg, &s.plain[0], &s.enc[0], &mut gw, &packets, Some(plan), 0).unwrap();
    assert!(c.differences.is_empty(), "{:#?}", c.differences);
    assert!(c.old_after_swap >= kept, "{} < {kept}", c.old_after_swap);
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
