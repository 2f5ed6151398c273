//! A replay copy passing through an NF whose record of what it emitted died with its node is
//! processed there again *emulated* (CHC: nothing applied, `Instance::process_emulated`). It
//! must leave as its first processing left it, so its updates are answered as that
//! processing's were, from the store's per-clock log. Before, they were computed on the state
//! as it is now: a NAT's replacement gave every emulated SYN the pool's next free port (the
//! Redis Cluster node-kill failure of docs/correctness.md, where the detector behind the NAT
//! keyed 90 connection attempts by one port).

use sluice_nf::{Instance, LabelTable, Verdict};
use sluice_packet::{Clock, Meta, MetaFlags, Packet};
use sluice_runtime::{plan::build_instance, Chain, StateConfig};
use sluice_store::{ClientConfig, EmbeddedStore, Mode};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;

const NAT_CHAIN: &str = "name: nat
vertices:
  nat:
    type: nat
    config: { external_ip: 198.51.100.1, internal: [10.0.0.0/8] }
edges:
  - { from: input, to: nat }
  - { from: nat, to: output }
";

/// A SYN from internal host `i` (its own endpoint) at clock `i + 1`.
fn syn(i: u8, replayed: bool) -> Packet {
    let mut frame = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 0, 0, i], [198, 18, 0, 1], 64)
        .tcp(40_000 + u16::from(i), 80, 1, 64_240)
        .syn()
        .write(&mut frame, &[])
        .expect("frame");
    let flags = if replayed { MetaFlags::REPLAYED } else { MetaFlags::default() };
    let meta = Meta { clock: Clock::new(0, u64::from(i) + 1), ts_ns: 1_000 * u64::from(i), flags, ..Meta::default() };
    Packet::new(frame, meta)
}

/// The translated source port of `pkt`, if it was forwarded.
fn nat_port(verdict: Verdict, pkt: &Packet) -> Option<u16> {
    if verdict != Verdict::Forward {
        return None;
    }
    let t = pkt.tuple()?;
    (t.src == std::net::IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1))).then_some(t.sport)
}

fn nat_instance(chain: &Chain, state: &StateConfig) -> Instance {
    let labels = Arc::new(LabelTable::default());
    build_instance(chain, &sluice_nfs::registry(), &labels, 0, 0, 1, state).expect("instance")
}

#[test]
fn an_emulated_nat_packet_leaves_with_the_port_its_first_processing_gave() {
    let chain = Chain::parse(NAT_CHAIN, Path::new("nat.yaml")).expect("chain");
    let backend = Arc::new(EmbeddedStore::start(2).expect("store"));
    let client = ClientConfig { mode: Mode::Async, ..ClientConfig::default() };
    let state = StateConfig::Store { backend: backend.clone(), client: client.clone() }.fault_tolerant();
    // A replacement reads what the store holds instead of starting from nothing.
    let taking_over = StateConfig::Store { backend, client: ClientConfig { fresh: false, ..client } }.fault_tolerant();

    // The first processing: eight connections, eight ports, every update in the store.
    let mut first = nat_instance(&chain, &state);
    first.begin_batch();
    let mut ports = Vec::new();
    for i in 0..8 {
        let mut p = syn(i, false);
        let v = first.process(&mut p);
        ports.push(nat_port(v, &p).expect("translated"));
    }
    first.end_batch();
    first.state().flush().expect("flush");
    drop(first);
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "a port per connection: {ports:?}");

    // Its replacement on another node lets replay copies of those clocks pass through
    // towards a later vertex: emulated, each leaves as it first left.
    let mut replacement = nat_instance(&chain, &taking_over);
    replacement.begin_batch();
    let again: Vec<Option<u16>> = (0..8)
        .map(|i| {
            let mut p = syn(i, true);
            let v = replacement.process_emulated(&mut p);
            nat_port(v, &p)
        })
        .collect();
    replacement.end_batch();
    assert_eq!(again, ports.iter().copied().map(Some).collect::<Vec<_>>(), "emulated, the first ports");

    // Emulation applied nothing: a new connection takes the port after the first run's last.
    replacement.begin_batch();
    let mut p = syn(8, false);
    let v = replacement.process(&mut p);
    replacement.end_batch();
    let next = nat_port(v, &p).expect("translated");
    assert_eq!(Some(next), ports.last().map(|p| p + 1), "the pool as the first run left it ({ports:?})");
}
