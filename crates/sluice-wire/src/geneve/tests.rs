use super::*;
use proptest::prelude::*;

fn frame() -> Vec<u8> {
    let mut f = Vec::new();
    let b = etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
        .tcp(40000, 80, 7, 1024);
    b.write(&mut f, b"GET / HTTP/1.1\r\n").expect("frame");
    f
}

fn meta() -> Meta {
    let mut m = Meta {
        clock: Clock::new(2, 123_456),
        xor: 0xdead_beef,
        ts_ns: 1_700_000_000_123_456_789,
        ingress_ns: 42,
        in_port: 3,
        ..Meta::default()
    };
    m.flags.insert(MetaFlags::REPLAYED);
    m.flags.insert(MetaFlags::LAST);
    m.target = Some(InstanceId::new(1, 2));
    m.labels.set(LabelId(4), 99);
    m.labels.set(LabelId(7), 1);
    m
}

#[test]
fn round_trip_keeps_every_field_and_the_frame() {
    let (m, f) = (meta(), frame());
    let mut out = Vec::new();
    encode(&m, InstanceId::new(3, 1), 77, &f, &mut out).expect("encode");
    let d = decode(&out).expect("decode");
    assert_eq!(d.vni, 77);
    assert_eq!(d.dest, InstanceId::new(3, 1));
    assert_eq!(d.meta, m);
    assert_eq!(d.frame, &f[..]);
}

#[test]
fn header_is_geneve_version_0_with_critical_options_and_ethernet() {
    let mut out = Vec::new();
    encode(&Meta::default(), InstanceId::new(0, 0), 0x00ab_cdef, &frame(), &mut out).expect("encode");
    assert_eq!(out[0] >> 6, 0, "version");
    // Packet option (1 + 6 words) and times (1 + 4): no target, no labels.
    assert_eq!(out[0] & 0x3f, 12);
    assert_eq!(out[1], 0x40, "C bit set, O bit clear");
    assert_eq!(&out[2..4], &[0x65, 0x58]);
    assert_eq!(&out[4..7], &[0xab, 0xcd, 0xef]);
    assert_eq!(&out[8..12], &[0xff, 0xf0, 0x81, 6], "first option: Sluice's packet option");
}

#[test]
fn optional_options_are_left_out() {
    let mut m = Meta::default();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    encode(&m, InstanceId(0), 1, &[], &mut a).expect("encode");
    m.target = Some(InstanceId(9));
    encode(&m, InstanceId(0), 1, &[], &mut b).expect("encode");
    assert_eq!(b.len(), a.len() + 8, "a target adds one option of one word");
    assert_eq!(decode(&a).expect("decode").meta.target, None);
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut good = Vec::new();
    encode(&meta(), InstanceId(5), 1, &frame(), &mut good).expect("encode");
    assert_eq!(decode(&good[..5]), Err(WireError::Truncated { need: 8, have: 5 }));
    assert!(matches!(decode(&good[..20]), Err(WireError::Truncated { .. })));
    let mut v = good.clone();
    v[0] |= 0x40;
    assert_eq!(decode(&v), Err(WireError::Version(1)));
    let mut c = good.clone();
    c[1] |= 0x80;
    assert_eq!(decode(&c), Err(WireError::Control));
    let mut p = good.clone();
    p[2] = 0x08;
    p[3] = 0x00;
    assert_eq!(decode(&p), Err(WireError::Protocol(0x0800)));
    let mut flags = good.clone();
    flags[8 + 4 + 20] = 0x80;
    assert_eq!(decode(&flags), Err(WireError::UnknownFlags(0x80)));
    let mut len = good.clone();
    len[11] = 4;
    assert!(matches!(decode(&len), Err(WireError::OptionLength { kind: 0x81, words: 4 })), "{:?}", decode(&len));
    assert!(matches!(encode(&meta(), InstanceId(0), 1 << 24, &[], &mut Vec::new()), Err(WireError::VniTooLarge(_))));
}

/// A datagram with `extra` inserted as the first option.
fn with_option(extra: &[u8]) -> Vec<u8> {
    let mut good = Vec::new();
    encode(&meta(), InstanceId(5), 1, &frame(), &mut good).expect("encode");
    let mut out = good[..8].to_vec();
    out[0] += (extra.len() / 4) as u8;
    out.extend_from_slice(extra);
    out.extend_from_slice(&good[8..]);
    out
}

#[test]
fn other_classes_are_skipped_unless_critical() {
    let skipped = with_option(&[0x01, 0x02, 0x05, 1, 0, 0, 0, 0]);
    assert_eq!(decode(&skipped).expect("non-critical option of another class").meta, meta());
    let critical = with_option(&[0x01, 0x02, 0x85, 1, 0, 0, 0, 0]);
    assert_eq!(decode(&critical), Err(WireError::UnknownCritical { class: 0x0102, kind: 0x85 }));
    let ours_unknown = with_option(&[0xff, 0xf0, 0x8f, 0]);
    assert_eq!(decode(&ours_unknown), Err(WireError::UnknownCritical { class: OPTION_CLASS, kind: 0x8f }));
    let ours_later = with_option(&[0xff, 0xf0, 0x0f, 0]);
    assert!(decode(&ours_later).is_ok(), "a non-critical option of a later Sluice is skipped");
    let twice = with_option(&[0xff, 0xf0, 0x82, 1, 0, 0, 0, 1]);
    assert_eq!(decode(&twice), Err(WireError::DuplicateOption(0x82)));
}

#[test]
fn missing_packet_option_is_an_error() {
    let d = [0u8, 0, 0x65, 0x58, 0, 0, 1, 0];
    assert_eq!(decode(&d), Err(WireError::MissingPacketOption));
}

#[test]
fn the_link_sequence_is_optional_and_not_critical() {
    let (m, f) = (meta(), frame());
    let (mut plain, mut numbered) = (Vec::new(), Vec::new());
    encode(&m, InstanceId(1), 5, &f, &mut plain).expect("encode");
    encode_sequenced(&m, InstanceId(1), 5, Some(u64::MAX - 3), &f, &mut numbered).expect("encode");
    assert_eq!(numbered.len(), plain.len() + 12, "one option of two words");
    assert_eq!(decode(&plain).expect("decode").seq, None);
    let d = decode(&numbered).expect("decode");
    assert_eq!((d.seq, d.meta, d.frame), (Some(u64::MAX - 3), m, &f[..]));
    assert_eq!((link_seq(&numbered), link_seq(&plain)), (Some(u64::MAX - 3), None));
    assert_eq!(link_seq(&numbered[..10]), None, "cut short: no number, no panic");
    // Not critical: its type's high bit is clear, so a receiver that does not know it skips it.
    let at = numbered.len() - f.len() - 12;
    assert_eq!(&numbered[at..at + 4], &[0xff, 0xf0, 0x05, 2]);
    // A wrong length is an error, not a guess.
    numbered[at + 3] = 1;
    numbered[0] -= 1;
    let mut short = numbered[..at + 8].to_vec();
    short.extend_from_slice(&f);
    assert_eq!(decode(&short), Err(WireError::OptionLength { kind: 0x05, words: 1 }));
}

#[test]
fn source_port_is_dynamic_and_fixed_per_flow() {
    let p = sluice_packet::Packet::from_slice(&frame(), Meta::default());
    let q = sluice_packet::Packet::from_slice(&frame(), meta());
    let port = source_port(&p);
    assert!(port >= 49152);
    assert_eq!(port, source_port(&q), "same flow, same port");
}

proptest! {
    #[test]
    fn any_meta_round_trips(
        clock in any::<u64>(), xor in any::<u64>(), dest in any::<u32>(), flags in 0u8..32,
        target in proptest::option::of(any::<u32>()), ts in any::<u64>(), ingress in any::<u64>(),
        port in any::<u16>(), vni in 0u32..=MAX_VNI,
        labels in proptest::collection::vec((any::<u16>(), any::<u32>()), 0..=MAX_LABELS),
        body in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut m = Meta { clock: Clock(clock), xor, target: target.map(InstanceId), ts_ns: ts, ingress_ns: ingress, in_port: port, ..Meta::default() };
        m.flags = MetaFlags::from_bits(flags).expect("defined flags");
        for (id, v) in labels {
            m.labels.set(LabelId(id), v);
        }
        let mut out = Vec::new();
        encode(&m, InstanceId(dest), vni, &body, &mut out).expect("encode");
        let d = decode(&out).expect("decode");
        prop_assert_eq!(d.meta, m);
        prop_assert_eq!(d.dest, InstanceId(dest));
        prop_assert_eq!(d.vni, vni);
        prop_assert_eq!(d.frame, &body[..]);
    }

    #[test]
    fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn corrupted_datagrams_decode_without_panicking(i in 0usize..64, b in any::<u8>()) {
        let mut out = Vec::new();
        encode(&meta(), InstanceId(5), 1, &frame(), &mut out).expect("encode");
        if let Some(x) = out.get_mut(i) {
            *x = b;
        }
        let _ = decode(&out);
    }
}
