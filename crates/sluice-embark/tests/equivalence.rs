//! The acceptance test of Embark: on every shared real trace and the demo trace, the provider
//! chain (firewall, IDS, NAT, load balancer) decides the same on the encrypted path as on the
//! plaintext path, packet for packet, and every delivered packet is byte-identical.

use rand::SeedableRng;
use sluice_embark::compare::compare;
use sluice_embark::gateway::Gateway;
use sluice_embark::rules::{encrypt_provider, ProviderConfig};
use sluice_embark::MasterKey;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn traces() -> Vec<PathBuf> {
    let shared = root().join("../shared/traces");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&shared)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "pcap")).collect()
        })
        .unwrap_or_default();
    v.sort();
    v.push(root().join("traces/demo.pcap"));
    v
}

fn plain_chain() -> ProviderConfig {
    let text = std::fs::read_to_string(root().join("chains/embark/provider.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

#[test]
fn encrypted_path_equals_plaintext_path_on_every_trace() {
    let key = MasterKey::from_bytes([7; 32]);
    let plain = plain_chain();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (enc, state) = encrypt_provider(&key, &plain, 1, &mut rng).unwrap();
    let registry = sluice_nfs::registry();
    let list = traces();
    assert!(list.len() >= 11, "shared traces missing: {list:?}");
    let mut total_alerts = 0;
    let mut total_drops = 0;
    for path in list {
        let packets = sluice_io::pcap::load(&path, None).unwrap();
        let mut gw = Gateway::new(&key, state.clone()).unwrap();
        let c = compare(&registry, &plain, &enc, &mut gw, &packets).unwrap();
        eprintln!(
            "{}: {} packets, {} forwarded, drops {:?}, {} alerts, {} token records",
            path.display(),
            c.packets,
            c.forwarded,
            c.dropped,
            c.alerts,
            c.token_records
        );
        assert!(c.differences.is_empty(), "{}: {:#?}", path.display(), c.differences);
        // Every IP packet was decided on both paths (forwarded or dropped alike).
        assert_eq!(c.forwarded + c.dropped.values().sum::<u64>(), c.packets - c.non_ip);
        assert!(c.packets > 0);
        total_alerts += c.alerts;
        total_drops += c.dropped.values().sum::<u64>();
    }
    // The chain did decide things: alerts and drops happened on the traces.
    assert!(total_alerts > 10, "{total_alerts}");
    assert!(total_drops > 10, "{total_drops}");
}
