//! Every NF of the library in one chain, fed random, truncated and corrupted frames mixed with
//! real traffic: nothing panics and every packet is accounted for, at the chain and at each NF.

use proptest::prelude::*;
use sluice_packet::{Meta, Packet};
use sluice_runtime::{compile, run, Chain, CollectSink, MemorySource, RunConfig, RunHooks};
use std::path::Path;

const ALL_NFS: &str = "
vertices:
  nat: { type: nat, instances: 2, config: { internal: [\"0.0.0.0/1\"] } }
  fw: { type: firewall, instances: 2 }
  scan: { type: portscan, instances: 2 }
  lb: { type: lb, instances: 2 }
  ids: { type: ids, instances: 2 }
  trojan: { type: trojan, instances: 2 }
edges:
  - { from: input, to: nat }
  - { from: nat, to: fw }
  - { from: nat, to: trojan, mirror: true }
  - { from: fw, to: scan }
  - { from: scan, to: lb }
  - { from: lb, to: ids }
  - { from: ids, to: output }
";

fn real_frames() -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for name in ["ftp_retr.pcap", "irc-basic.pcap", "ssh_single-conn.pcap", "dns-edns-cookie.pcap"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name);
        let data = std::fs::read(path).expect("trace");
        let mut off = 24;
        while off + 16 <= data.len() {
            let u = |o: usize| u32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
            let cap = u(off + 8) as usize;
            let ts = u64::from(u(off)) * 1_000_000_000 + u64::from(u(off + 4)) * 1000;
            out.push((ts, data[off + 16..off + 16 + cap].to_vec()));
            off += 16 + cap;
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Mangle {
    Keep,
    Truncate(usize),
    Corrupt(Vec<(usize, u8)>),
    Random(Vec<u8>),
}

fn mangle() -> impl Strategy<Value = Mangle> {
    prop_oneof![
        3 => Just(Mangle::Keep),
        2 => (0usize..200).prop_map(Mangle::Truncate),
        2 => proptest::collection::vec((0usize..200, any::<u8>()), 1..6).prop_map(Mangle::Corrupt),
        1 => proptest::collection::vec(any::<u8>(), 0..300).prop_map(Mangle::Random),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn all_nfs_account_for_every_packet(plan in proptest::collection::vec((0usize..400, mangle()), 50..300), workers in 1usize..3) {
        let frames = real_frames();
        let packets: Vec<Packet> = plan
            .iter()
            .enumerate()
            .map(|(i, (idx, m))| {
                let (ts, f) = &frames[idx % frames.len()];
                let bytes = match m {
                    Mangle::Keep => f.clone(),
                    Mangle::Truncate(n) => f[..(*n).min(f.len())].to_vec(),
                    Mangle::Corrupt(edits) => {
                        let mut g = f.clone();
                        let len = g.len().max(1);
                        for (p, b) in edits {
                            if let Some(x) = g.get_mut(p % len) {
                                *x = *b;
                            }
                        }
                        g
                    }
                    Mangle::Random(r) => r.clone(),
                };
                Packet::from_slice(&bytes, Meta { ts_ns: ts + i as u64, ..Meta::default() })
            })
            .collect();
        let chain = Chain::parse(ALL_NFS, Path::new("all.yaml")).expect("chain");
        let p = compile(&chain, &sluice_nfs::registry(), &packets).expect("plan");
        let cfg = RunConfig { workers, pin: false, batch: 8, window: 64, ..RunConfig::default() };
        let mut sink = CollectSink::default();
        let r = run(p, &cfg, &mut MemorySource::new(&packets), &mut sink, RunHooks::default()).expect("run");
        prop_assert_eq!(r.packets_in, packets.len() as u64);
        prop_assert!(r.balanced(), "in {} != out {} + dropped {}", r.packets_in, r.packets_out, r.dropped_total);
        prop_assert_eq!(sink.packets.len() as u64, r.packets_out);
        for v in &r.vertices {
            for i in &v.instances {
                let dropped: u64 = i.dropped.values().sum();
                prop_assert_eq!(i.packets_in, i.forwarded + dropped + i.consumed, "vertex {}", v.name);
            }
        }
        let trojan = r.vertices.iter().find(|v| v.name == "trojan").map(|v| v.packets_in()).unwrap_or(0);
        prop_assert_eq!(trojan, r.mirrored);
    }
}
