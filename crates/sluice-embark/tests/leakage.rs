//! What the provider sees: no plaintext address, port or keyword; per-connection encryption;
//! unlinkable tokens; PrefixMatch correctness over random rule sets; bad input refused.

use proptest::prelude::*;
use rand::SeedableRng;
use sluice_embark::gateway::Gateway;
use sluice_embark::keys::FlowPrf;
use sluice_embark::keyword::{encrypt_rules, KeywordKey, KeywordMatcher, KeywordRule, StreamMatch, TokenRecord};
use sluice_embark::prefixmatch::{Domain, PrefixMatch};
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::{EmbarkError, MasterKey};
use sluice_packet::Packet;
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn setup() -> (MasterKey, ProviderConfig, ProviderConfig, sluice_embark::gateway::GatewayState) {
    let key = MasterKey::from_bytes([9; 32]);
    let text = std::fs::read_to_string(root().join("chains/embark/provider.yaml")).unwrap();
    let plain: ProviderConfig = serde_yaml::from_str(&text).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let (enc, state) = encrypt_provider(&key, &plain, 1, &mut rng).unwrap();
    (key, plain, enc, state)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

const KEYWORDS: [&str; 8] = ["robots.txt", "RETR", "NICK", "JOIN", "/etc/passwd", "SSH-2.0", "GET /", "Content-Type"];

#[test]
fn no_plaintext_addresses_ports_or_keywords_reach_the_provider() {
    let (key, _plain, enc, state) = setup();
    // The encrypted rule file.
    let file = serde_yaml::to_string(&enc).unwrap();
    for needle in ["10.0.0.0", "192.168.0.0", "198.51.100.1", "10.1.0.1", "192.150.187", "5900", "6669"] {
        assert!(!file.contains(needle), "rule file contains {needle}");
    }
    for k in KEYWORDS {
        assert!(!file.to_lowercase().contains(&k.to_lowercase()), "rule file contains {k}");
    }
    // The encrypted packets and token records.
    for trace in ["ftp_retr.pcap", "irc-basic.pcap", "http_methods.pcap", "ssh_single-conn.pcap"] {
        let packets = sluice_io::pcap::load(root().join("../shared/traces").join(trace), None).unwrap();
        let mut gw = Gateway::new(&key, state.clone()).unwrap();
        let mut addrs: HashSet<IpAddr> = HashSet::new();
        let (mut port_fields, mut port_equal) = (0u64, 0u64);
        for p in &packets {
            let Some(t) = p.tuple() else { continue };
            addrs.insert(t.src);
            addrs.insert(t.dst);
            let e = gw.encrypt(p).unwrap();
            let d = e.data.data();
            // Headers, option and transport header: no plaintext address in any form.
            let hdr_end = usize::from(e.data.hdr().payload_off);
            for a in [t.src, t.dst] {
                let IpAddr::V4(v4) = a else { continue };
                assert!(!contains(&d[..hdr_end], &v4.octets()), "{trace}: {a} in headers");
                assert!(!contains(d, &v4.to_ipv6_mapped().octets()), "{trace}: {a} mapped");
            }
            let et = e.data.tuple().unwrap();
            port_fields += 2;
            port_equal += u64::from(et.sport == t.sport) + u64::from(et.dport == t.dport);
            for frame in e.tokens.iter().map(Packet::data).chain([d]) {
                for k in KEYWORDS {
                    assert!(!contains(frame, k.as_bytes()), "{trace}: keyword {k} visible");
                }
            }
        }
        // Ports equal their plaintext only by chance (a handful of suffix bits).
        assert!(port_equal * 20 < port_fields, "{trace}: {port_equal} of {port_fields} ports in clear");
        assert!(!addrs.is_empty());
    }
}

#[test]
fn per_connection_encryption_stable_within_unlinkable_across() {
    let (key, _, _, state) = setup();
    let packets = sluice_io::pcap::load(root().join("../shared/traces/ssh_ssh.pcap"), None).unwrap();
    let mut gw = Gateway::new(&key, state).unwrap();
    // For each plaintext address: its encryption per connection.
    let mut per_conn: std::collections::HashMap<(IpAddr, sluice_packet::FlowKey), HashSet<[u8; 16]>> =
        Default::default();
    for p in &packets {
        let t = p.tuple().unwrap();
        let et = gw.encrypt(p).unwrap().data.tuple().unwrap();
        let bits = |ip: IpAddr| match ip {
            IpAddr::V6(a) => a.octets(),
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        };
        per_conn.entry((t.src, t.flow_key())).or_default().insert(bits(et.src));
        per_conn.entry((t.dst, t.flow_key())).or_default().insert(bits(et.dst));
    }
    // Stable within a connection, both directions.
    assert!(per_conn.values().all(|s| s.len() == 1));
    // The same address in different connections: all encryptions different.
    let mut by_addr: std::collections::HashMap<IpAddr, Vec<[u8; 16]>> = Default::default();
    for ((a, _), s) in &per_conn {
        by_addr.entry(*a).or_default().extend(s.iter().copied());
    }
    let multi = by_addr.values().filter(|v| v.len() > 1).count();
    assert!(multi > 0, "ssh_ssh has hosts in several connections");
    for v in by_addr.values() {
        let distinct: HashSet<_> = v.iter().collect();
        assert_eq!(distinct.len(), v.len());
    }
}

#[test]
fn equal_tokens_unlinkable_unless_they_match_a_rule() {
    let key = MasterKey::from_bytes([1; 32]);
    let kw = KeywordKey::new(&key);
    let rules =
        encrypt_rules(&kw, &[KeywordRule { id: 1, pattern: b"secret", nocase: false, drop: false, boundary: false }])
            .unwrap();
    let c = rules.classes[0];
    let r_hello = kw.rule_token(c, b"hello!");
    let r_secret = kw.rule_token(c, b"secret");
    // The same window twice in one stream, and in two streams: four different ciphertexts.
    let vals: HashSet<u64> = [(1, 0), (1, 1), (2, 0), (2, 1)]
        .iter()
        .map(|&(salt, ctr)| sluice_embark::keyword::salted(&r_hello, salt, ctr))
        .collect();
    assert_eq!(vals.len(), 4);
    // The rule's window is found each time it occurs, in any stream.
    let m = KeywordMatcher::new(&rules).unwrap();
    for salt in [5u64, 6] {
        let mut st = StreamMatch::default();
        let tokens = (0..3)
            .map(|i| sluice_embark::keyword::Token {
                class: 0,
                delta: 10 * i,
                value: sluice_embark::keyword::salted(
                    if i == 1 { &r_hello } else { &r_secret },
                    salt,
                    if i == 2 { 1 } else { 0 },
                ),
            })
            .collect();
        let rec = TokenRecord { salt, base: 100, tokens, ..TokenRecord::default() };
        let mut hits = Vec::new();
        m.scan(&mut st, &rec, &mut hits);
        assert_eq!(hits, vec![0, 0], "salt {salt}");
    }
}

fn in_any(v: u128, enc: &[sluice_embark::prefixmatch::EncPrefix], bits: u32) -> bool {
    enc.iter().any(|p| {
        let (a, b) = p.range(bits);
        a <= v && v <= b
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn encrypted_value_matches_encrypted_rule_iff_plaintext_does(
        ranges in prop::collection::vec((0u32..=65535, 0u32..=400), 1..12),
        values in prop::collection::vec(0u32..=65535, 1..40),
        addr_ranges in prop::collection::vec((any::<u128>(), 0u32..=128), 1..12),
        addr_values in prop::collection::vec(any::<u128>(), 1..20),
        seed in any::<[u8; 16]>(),
    ) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(seed[0]));
        let prf = FlowPrf::from_seed(seed);
        // Ports.
        let rs: Vec<(u128, u128)> = ranges.iter().map(|&(lo, w)| (u128::from(lo), u128::from((lo + w).min(65535)))).collect();
        let pm = PrefixMatch::build(Domain::Port, &rs, &mut rng).unwrap();
        let encs: Vec<_> = rs.iter().map(|&(lo, hi)| pm.encrypt_range(lo, hi).unwrap()).collect();
        let mut probe: Vec<u128> = values.iter().map(|&v| u128::from(v)).collect();
        probe.extend(rs.iter().flat_map(|&(lo, hi)| [lo, hi, lo.saturating_sub(1), (hi + 1).min(65535)]));
        for v in probe {
            let e = pm.encrypt(v, &prf).unwrap();
            for (r, enc) in rs.iter().zip(&encs) {
                prop_assert_eq!(r.0 <= v && v <= r.1, in_any(e, enc, 16));
            }
        }
        // Addresses as prefixes.
        let ars: Vec<(u128, u128)> = addr_ranges.iter().map(|&(net, len)| {
            let span = if len == 0 { u128::MAX } else { (1u128 << (128 - len.max(1))) - 1 };
            let span = if len == 128 { 0 } else { span };
            (net & !span, (net & !span) | span)
        }).collect();
        let am = PrefixMatch::build(Domain::Addr, &ars, &mut rng).unwrap();
        let aencs: Vec<_> = ars.iter().map(|&(lo, hi)| am.encrypt_range(lo, hi).unwrap()).collect();
        let mut aprobe = addr_values.clone();
        aprobe.extend(ars.iter().flat_map(|&(lo, hi)| [lo, hi, lo.wrapping_sub(1), hi.wrapping_add(1)]));
        for v in aprobe {
            let e = am.encrypt(v, &prf).unwrap();
            for (r, enc) in ars.iter().zip(&aencs) {
                prop_assert_eq!(r.0 <= v && v <= r.1, in_any(e, enc, 128));
            }
        }
    }
}

#[test]
fn bad_input_is_refused_never_a_panic() {
    let (key, _, _, state) = setup();
    let packets = sluice_io::pcap::load(root().join("../shared/traces/ftp_retr.pcap"), None).unwrap();
    let mut gw = Gateway::new(&key, state.clone()).unwrap();
    // The first packet with payload: it has a token record too.
    let e = packets.iter().map(|p| gw.encrypt(p).unwrap()).find(|e| !e.tokens.is_empty()).unwrap();
    assert!(gw.decrypt(&e.data).is_ok());
    // Every truncation and every single-byte corruption: an error or (for bytes the NFs may
    // legitimately change) a packet, never a panic.
    let d = e.data.data().to_vec();
    for cut in 0..d.len() {
        assert!(gw.decrypt(&Packet::from_slice(&d[..cut], e.data.meta)).is_err(), "cut {cut}");
    }
    let mut refused = 0;
    for i in 0..d.len() {
        let mut x = d.clone();
        x[i] ^= 0x41;
        refused += usize::from(gw.decrypt(&Packet::from_slice(&x, e.data.meta)).is_err());
    }
    assert!(refused > d.len() / 2);
    // The wrong key.
    let other = MasterKey::from_bytes([10; 32]);
    let mut wrong_state = state.clone();
    wrong_state.key_id = other.id();
    let wrong = Gateway::new(&other, wrong_state).unwrap();
    assert!(matches!(wrong.decrypt(&e.data), Err(EmbarkError::WrongKey(_))));
    // A gateway state (rule file) made for another key.
    assert!(matches!(Gateway::new(&other, state.clone()), Err(EmbarkError::WrongKey(_))));
    // Packets of another rule generation.
    let mut next = state;
    next.generation = 2;
    let gw2 = Gateway::new(&key, next).unwrap();
    assert!(matches!(gw2.decrypt(&e.data), Err(EmbarkError::WrongKey(_))));
    // A malformed token record reaches the IDS: a counted drop.
    let mut tok = e.tokens[0].clone();
    // Its record's magic overwritten (the IPv6 packet itself stays well-formed).
    tok.edit(|b| b[54..58].copy_from_slice(b"XXXX"));
    let (_, _, enc, _) = setup();
    let ids_cfg = &enc.nfs.iter().find(|n| n.kind == "ids").unwrap().config;
    let mut ids = sluice_nf::local_instance(&sluice_nfs::registry(), "ids", ids_cfg).unwrap();
    assert_eq!(ids.process(&mut tok), sluice_nf::Verdict::Drop("ids-bad-token-record"));
    // An encrypted rule file for the IDS that does not parse is a config error.
    let bad: serde_yaml::Value = serde_yaml::from_str(
        "encrypted: {classes: [], keywords: [{class: 3, r: zz}], rules: [{id: 1, len: 1, windows: [[0, 0]]}]}",
    )
    .unwrap();
    assert!(sluice_nf::local_instance(&sluice_nfs::registry(), "ids", &bad).is_err());
}
