//! KeywordMatch delimiter tokens: IDS rules with `boundary: true` match only where a word
//! starts, on the plaintext IDS and on the encrypted path alike, and the gateway sends one
//! token per word for them instead of one per byte.

#[path = "../../sluice-nfs/tests/synth/mod.rs"]
mod synth;

use proptest::prelude::*;
use rand::SeedableRng;
use sluice_embark::compare::{compare, Comparison};
use sluice_embark::gateway::Gateway;
use sluice_embark::keyword::is_delimiter;
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::MasterKey;
use sluice_packet::Packet;
use synth::{pkt, tcp_frame, ACK, PSH, SYN};

const CLI: [u8; 4] = [10, 0, 0, 1];
const SRV: [u8; 4] = [192, 0, 2, 9];

/// A client→server connection: SYN, SYN-ACK, then one data segment per entry of `segments`.
fn stream(segments: &[Vec<u8>]) -> Vec<Packet> {
    let isn = 1000u32;
    let mut v = vec![
        pkt(tcp_frame(CLI, 40_000, SRV, 80, isn, 0, SYN, &[]), 1, 1_000_000),
        pkt(tcp_frame(SRV, 80, CLI, 40_000, 5000, isn + 1, SYN | ACK, &[]), 2, 2_000_000),
    ];
    let mut seq = isn + 1;
    for (i, s) in segments.iter().enumerate() {
        let c = 3 + i as u64;
        v.push(pkt(tcp_frame(CLI, 40_000, SRV, 80, seq, 5001, ACK | PSH, s), c, c * 1_000_000));
        seq = seq.wrapping_add(s.len() as u32);
    }
    v
}

/// A provider chain of one IDS with `rules` (`(pattern, nocase, boundary)`).
fn ids_chain(rules: &[(&[u8], bool, bool)]) -> ProviderConfig {
    let rules: Vec<serde_yaml::Value> = rules
        .iter()
        .enumerate()
        .map(|(i, (p, nocase, boundary))| {
            let mut m = serde_yaml::Mapping::new();
            m.insert("id".into(), (i as u64 + 1).into());
            m.insert("pattern".into(), String::from_utf8_lossy(p).into_owned().into());
            m.insert("nocase".into(), (*nocase).into());
            m.insert("boundary".into(), (*boundary).into());
            serde_yaml::Value::Mapping(m)
        })
        .collect();
    let mut cfg = serde_yaml::Mapping::new();
    cfg.insert("rules".into(), serde_yaml::Value::Sequence(rules));
    let nf = sluice_embark::rules::NfSpec { name: "ids".into(), kind: "ids".into(), config: cfg.into() };
    ProviderConfig { key_id: None, generation: None, nfs: vec![nf] }
}

/// Both paths over `packets`; the comparison (decisions, alerts per rule, bytes).
fn run(plain: &ProviderConfig, packets: &[Packet], seed: u64) -> Comparison {
    let key = MasterKey::from_bytes([9; 32]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (enc, state) = encrypt_provider(&key, plain, 1, &mut rng).expect("encrypt");
    let mut gw = Gateway::new(&key, state).expect("gateway");
    compare(&sluice_nfs::registry(), plain, &enc, &mut gw, packets).expect("compare")
}

#[test]
fn delimiter_definition_is_the_plaintext_ids_one() {
    for b in 0..=255u8 {
        assert_eq!(is_delimiter(b), sluice_nfs::ids::is_delimiter(b), "byte {b}");
    }
}

#[test]
fn boundary_rules_match_only_where_a_word_starts_on_both_paths() {
    // "JOIN" starts the stream, follows a space, sits inside "REJOIN", follows a '#' in the
    // next segment (the delimiter in one segment, the keyword in the next), and is cut across
    // two segments after a space.
    let segs: Vec<Vec<u8>> = ["JOIN a REJOIN x JOIN #", "JOIN REJOINED JO", "IN ", "nick JoIn"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let packets = stream(&segs);
    let word = run(&ids_chain(&[(b"JOIN", false, true)]), &packets, 1);
    let any = run(&ids_chain(&[(b"JOIN", false, false)]), &packets, 1);
    let word_nocase = run(&ids_chain(&[(b"join", true, true)]), &packets, 1);
    for c in [&word, &any, &word_nocase] {
        assert!(c.differences.is_empty(), "{:#?}", c.differences);
    }
    // Alerts are counted once per rule and packet. At word starts: segment 1 (start, after a
    // space), segment 2 (after '#'), segment 3 (completes "JO|IN"); anywhere: also the packets
    // with REJOIN(ED) only, which are segments 1 and 2 already. nocase adds "JoIn" (segment 4).
    assert_eq!(word.alerts, 3);
    assert_eq!(any.alerts, 3);
    assert_eq!(word_nocase.alerts, 4);
    let mid_word_only = run(&ids_chain(&[(b"JOIN", false, true)]), &stream(&[b"REJOIN xJOIN".to_vec()]), 1);
    let mid_word_any = run(&ids_chain(&[(b"JOIN", false, false)]), &stream(&[b"REJOIN xJOIN".to_vec()]), 1);
    assert!(mid_word_only.differences.is_empty() && mid_word_any.differences.is_empty());
    assert_eq!((mid_word_only.alerts, mid_word_any.alerts), (0, 1));
    // One token per word start instead of one per byte: on 1,200 bytes of six-byte words,
    // the token records are well under a third of the size.
    let text = stream(&[b"words ".repeat(200)]);
    let word = run(&ids_chain(&[(b"JOIN", false, true)]), &text, 1);
    let any = run(&ids_chain(&[(b"JOIN", false, false)]), &text, 1);
    assert!(word.token_bytes * 3 < any.token_bytes, "{} vs {}", word.token_bytes, any.token_bytes);
}

#[test]
fn long_boundary_keywords_anchor_their_first_window() {
    let segs: Vec<Vec<u8>> = ["GET /robots.txt HTTP/1.0 x/robots.txt ", "robots.txtrobots.txt"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let packets = stream(&segs);
    let word = run(&ids_chain(&[(b"robots.txt", false, true)]), &packets, 2);
    assert!(word.differences.is_empty(), "{:#?}", word.differences);
    // "/robots.txt" twice in segment 1 (after '/'), then at the start of segment 2 (after a
    // space), never mid-word ("txtrobots").
    assert_eq!(word.alerts, 2);
}

#[test]
fn equal_words_give_unlinkable_delimiter_tokens_unless_they_match() {
    let key = MasterKey::from_bytes([9; 32]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let plain = ids_chain(&[(b"JOIN", false, true)]);
    let (_, state) = encrypt_provider(&key, &plain, 1, &mut rng).expect("encrypt");
    let mut gw = Gateway::new(&key, state).expect("gateway");
    let mut values = Vec::new();
    for p in stream(&[b"JOIN JOIN words words words JOIN".to_vec()]) {
        for t in gw.encrypt(&p).expect("encrypt").tokens {
            let rec = sluice_embark::keyword::TokenRecord::decode(t.payload()).expect("record");
            values.extend(rec.tokens.iter().map(|t| (t.delta, t.value)));
        }
    }
    // One token per word start (six words; a token sits at its window's last byte), and no
    // two alike: neither the three "words" nor the three "JOIN" can be told equal from their
    // tokens (the IDS finds "JOIN" by computing the value it expects next for that keyword,
    // not by comparing tokens).
    let starts: Vec<u32> = values.iter().map(|v| v.0).collect();
    assert_eq!(starts, vec![3, 8, 13, 19, 25, 31]);
    let distinct: std::collections::HashSet<u64> = values.iter().map(|v| v.1).collect();
    assert_eq!(distinct.len(), values.len());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random keyword rules (word-bound or not, case-sensitive or not) over random streams cut
    /// into random segments: the encrypted IDS alerts for a rule on a packet iff the plaintext
    /// IDS does.
    #[test]
    fn encrypted_match_iff_plaintext_match(
        rules in prop::collection::vec(("[abAB. ]{1,11}", any::<bool>(), any::<bool>()), 1..5),
        text in "[abAB. ]{0,160}",
        cuts in prop::collection::vec(0usize..160, 0..6),
        seed in any::<u64>(),
    ) {
        let mut rules: Vec<(Vec<u8>, bool, bool)> =
            rules.into_iter().map(|(p, n, b)| (p.into_bytes(), n, b)).collect();
        // The plaintext IDS needs a delimiter byte no pattern contains to mark a stream start.
        prop_assume!(!rules.iter().any(|r| r.2) || (0..=255u8).any(|d| is_delimiter(d) && !rules.iter().any(|r| r.0.contains(&d))));
        rules.dedup();
        let text = text.into_bytes();
        let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c < text.len()).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut segs = Vec::new();
        let mut from = 0;
        for c in cuts.into_iter().chain([text.len()]) {
            if c > from {
                segs.push(text[from..c].to_vec());
                from = c;
            }
        }
        let refs: Vec<(&[u8], bool, bool)> = rules.iter().map(|(p, n, b)| (p.as_slice(), *n, *b)).collect();
        let c = run(&ids_chain(&refs), &stream(&segs), seed);
        prop_assert!(c.differences.is_empty(), "{:#?}", c.differences);
    }
}
