//! The reference run `verify` compares against: the *logical* chain — one instance per NF with
//! state in its own memory, no faults — processing packets one at a time in chain-entry order,
//! each carried through the whole graph before the next enters. It shares nothing with the
//! fault-tolerant engine but the NFs themselves and the compiled routes.

use crate::observed::{Decision, Observed, OutputRecord, StateEntry};
use sluice_nf::{NfRegistry, Verdict};
use sluice_packet::{Clock, Packet, ParseStatus};
use sluice_runtime::plan::{direction, Routes, Target};
use sluice_runtime::{compile, Chain, PlanError};
use sluice_state::LocalState;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// Runs the logical chain of `chain` over `packets` (already parsed; malformed and truncated
/// frames are dropped at the root as the physical chain does).
pub fn run_reference(chain: &Chain, registry: &NfRegistry, packets: &[Packet]) -> Result<Observed, PlanError> {
    run(chain, registry, packets, None, &HashSet::new())
}

/// Runs the logical chain over the input of a recorded run without the packets its root did
/// not admit (`dropped`, by input index): those never entered the physical chain, so the
/// logical one does not see them either — they change no state and decide nothing, and the
/// final states compare. They are listed in the result's `root_dropped`.
pub fn run_reference_admitted(
    chain: &Chain,
    registry: &NfRegistry,
    packets: &[Packet],
    dropped: &[u64],
) -> Result<Observed, PlanError> {
    run(chain, registry, packets, None, &dropped.iter().copied().collect())
}

/// Runs the logical chain over the input of a **closed-loop** run — a live bridge, whose
/// hosts answered what the `physical` run sent them. Their answers carry the physical chain's
/// choices (the port a NAT instance allocated, the backend an LB picked), which the logical
/// chain may have made otherwise: fed as they are, a reply would reach the connection the
/// logical NAT gave that port to, not its own. So an input addressed to an endpoint the
/// physical chain sent from, or coming from one it sent to, gets the logical run's counterpart,
/// as learned from the two runs' outputs for the same earlier input (the latest binding wins:
/// ports are reused). Where both chains chose alike nothing changes. The packets the physical
/// root did not admit are left out, as in [`run_reference_admitted`]. (docs/decisions.md,
/// "Verifying a live run".)
pub fn run_reference_closed_loop(
    chain: &Chain,
    registry: &NfRegistry,
    packets: &[Packet],
    physical: &Observed,
) -> Result<Observed, PlanError> {
    let dropped = physical.root_dropped.iter().copied().collect();
    run(chain, registry, packets, Some(Echoes::new(physical)), &dropped)
}

/// An endpoint as a translation keys it: address, port, IP protocol.
type Endpoint = (IpAddr, u16, u8);

/// The physical run's choices coming back as input, and what the logical run chose instead.
struct Echoes<'a> {
    /// The physical run's output frames of each input.
    physical: HashMap<u64, Vec<&'a [u8]>>,
    /// Sources the chain sent from (a NAT's public endpoint), physical → logical: an answer
    /// is addressed to them.
    sent_from: HashMap<Endpoint, (IpAddr, u16)>,
    /// Destinations the chain sent to (an LB's backend), physical → logical: an answer comes
    /// from them.
    sent_to: HashMap<Endpoint, (IpAddr, u16)>,
}

impl<'a> Echoes<'a> {
    fn new(physical: &'a Observed) -> Echoes<'a> {
        let mut by_input: HashMap<u64, Vec<&'a [u8]>> = HashMap::new();
        for o in &physical.outputs {
            by_input.entry(o.input).or_default().push(&o.bytes);
        }
        Echoes { physical: by_input, sent_from: HashMap::new(), sent_to: HashMap::new() }
    }

    /// Rewrites `pkt`, if it answers a physical choice (addressed to a source the chain sent
    /// from, or coming from a destination it sent to), to the logical run's choice.
    fn translate(&self, pkt: &mut Packet) {
        if self.sent_from.is_empty() && self.sent_to.is_empty() {
            return;
        }
        let Some(t) = pkt.tuple() else { return };
        // A frame the rewrite cannot handle (no ports) goes as it is.
        if let Some((ip, port)) = self.sent_to.get(&(t.src, t.sport, t.proto.0)) {
            let _ = pkt.rewrite_src(*ip, *port);
        }
        if let Some((ip, port)) = self.sent_from.get(&(t.dst, t.dport, t.proto.0)) {
            let _ = pkt.rewrite_dst(*ip, *port);
        }
    }

    /// Input `input` left the logical chain as `logical` (its frames): where the physical run's
    /// only frame for it has other endpoints than the logical run's only one, those are bound.
    fn learn(&mut self, input: u64, logical: &[OutputRecord]) {
        let (Some([physical]), [logical]) = (self.physical.get(&input).map(Vec::as_slice), logical) else {
            return;
        };
        let tuple = |b: &[u8]| Packet::from_slice(b, sluice_packet::Meta::default()).tuple();
        let (Some(p), Some(l)) = (tuple(physical), tuple(&logical.bytes)) else { return };
        if p.proto != l.proto {
            return;
        }
        let sides = [
            (&mut self.sent_from, (p.src, p.sport), (l.src, l.sport)),
            (&mut self.sent_to, (p.dst, p.dport), (l.dst, l.dport)),
        ];
        for (map, pe, le) in sides {
            let key = (pe.0, pe.1, p.proto.0);
            if pe == le {
                map.remove(&key);
            } else {
                map.insert(key, le);
            }
        }
    }
}

fn run(
    chain: &Chain,
    registry: &NfRegistry,
    packets: &[Packet],
    mut echoes: Option<Echoes<'_>>,
    not_admitted: &HashSet<u64>,
) -> Result<Observed, PlanError> {
    let mut logical = chain.clone();
    for (_, v) in &mut logical.vertices {
        v.instances = 1;
    }
    let plan = compile(&logical, registry, &[])?;
    let mut instances: Vec<_> = plan.instances.into_iter().map(|(_, i)| i).collect();
    let mut obs = Observed { inputs: packets.len() as u64, ..Observed::default() };
    let mut clock_input: HashMap<Clock, u64> = HashMap::new();
    let mut last_ts = 0u64;
    let mut seq = 0u64;
    for (input, original) in packets.iter().enumerate() {
        let input = input as u64;
        if not_admitted.contains(&input)
            || matches!(original.hdr().status, ParseStatus::Truncated | ParseStatus::Malformed)
        {
            obs.root_dropped.push(input);
            continue;
        }
        let mut pkt = original.clone();
        if let Some(e) = &echoes {
            e.translate(&mut pkt);
        }
        let first_output = obs.outputs.len();
        seq += 1;
        pkt.meta.clock = Clock::new(0, seq);
        clock_input.insert(pkt.meta.clock, input);
        last_ts = last_ts.max(pkt.meta.ts_ns);
        if plan.traffic.as_ref().is_some_and(|f| !f.matches(&pkt)) {
            obs.outputs.push(OutputRecord {
                input,
                clock: pkt.meta.clock.0,
                in_port: pkt.meta.in_port,
                bytes: pkt.data().to_vec(),
            });
            continue;
        }
        let routes = &plan.entry[direction(&pkt, plan.entry.len())];
        let mut work: Vec<(Target, Packet)> = Vec::new();
        fan_out(routes, pkt, &mut work, &mut obs, input, "input");
        while let Some((target, mut pkt)) = work.pop() {
            let v = match target {
                Target::Output => {
                    obs.outputs.push(OutputRecord {
                        input,
                        clock: pkt.meta.clock.0,
                        in_port: pkt.meta.in_port,
                        bytes: pkt.data().to_vec(),
                    });
                    continue;
                }
                Target::Vertex(v) => v,
            };
            let Some(vp) = plan.vertices.get(v) else { continue };
            let Some(inst) = vp.instances.first().and_then(|&g| instances.get_mut(g)) else { continue };
            let verdict = inst.process(&mut pkt);
            let out = match verdict {
                Verdict::Forward => 0,
                Verdict::Output(i) => usize::from(i) + 1,
                Verdict::Drop(reason) => {
                    obs.decisions.push(drop_decision(input, &vp.name, reason));
                    continue;
                }
            };
            if vp.off_path {
                continue;
            }
            match vp.routes.get(direction(&pkt, vp.routes.len())).and_then(|r| r.get(out)) {
                Some(routes) => fan_out(routes, pkt, &mut work, &mut obs, input, &vp.name),
                None => obs.decisions.push(drop_decision(input, &vp.name, "no-route")),
            }
        }
        if let (Some(e), Some(out)) = (echoes.as_mut(), obs.outputs.get(first_output..)) {
            e.learn(input, out);
        }
    }
    // Timers due by the last packet's time fire, as they do in the physical run.
    let end = Clock::new(0, seq);
    for inst in &mut instances {
        inst.advance_time(last_ts, end);
    }
    for inst in &mut instances {
        for e in inst.take_events() {
            let input = clock_input.get(&e.clock).copied().unwrap_or(obs.inputs);
            obs.decisions.push(Decision {
                input,
                vertex: e.nf.clone(),
                kind: e.kind.to_string(),
                subject: e.subject,
                detail: e.detail,
            });
        }
        let vertex = inst.vertex().to_string();
        let decls = inst.nf().state_objects().to_vec();
        if let Some(local) = inst.state().as_any_mut().and_then(|a| a.downcast_mut::<LocalState>()) {
            for (o, key, value) in local.snapshot() {
                let decl = decls.get(usize::from(o.0));
                let object_name = decl.map_or("?", |d| d.name).to_string();
                let allocation = decl.is_some_and(|d| d.allocation);
                obs.state.push(StateEntry { vertex: vertex.clone(), object: o.0, object_name, allocation, key, value });
            }
        }
    }
    obs.decisions.sort();
    obs.state.sort_by(|a, b| (&a.vertex, a.object, a.key).cmp(&(&b.vertex, b.object, b.key)));
    Ok(obs)
}

/// A drop decision.
pub(crate) fn drop_decision(input: u64, vertex: &str, reason: &str) -> Decision {
    Decision {
        input,
        vertex: vertex.to_string(),
        kind: format!("drop:{reason}"),
        subject: String::new(),
        detail: String::new(),
    }
}

/// Queues `pkt` for the on-path edge that takes it and copies for the mirror edges.
fn fan_out(routes: &Routes, pkt: Packet, work: &mut Vec<(Target, Packet)>, obs: &mut Observed, input: u64, at: &str) {
    for t in routes.mirror_targets(&pkt) {
        let mut copy = pkt.clone();
        copy.meta.xor = 0;
        work.push((t, copy));
    }
    match routes.main_target(&pkt) {
        Some(t) => work.push((t, pkt)),
        None => obs.decisions.push(drop_decision(input, at, "no-route")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;
    use sluice_packet::Meta;
    use std::path::Path;

    const PUBLIC: [u8; 4] = [198, 51, 100, 1];
    const SERVER: [u8; 4] = [192, 0, 2, 80];

    fn nat() -> Chain {
        let yaml = "name: t\nvertices:\n  nat:\n    type: nat\n    config: { external_ip: 198.51.100.1, internal: [\"10.0.0.0/8\"] }\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: output }\n";
        Chain::parse(yaml, Path::new("t.yaml")).unwrap_or_else(|e| panic!("{e}"))
    }

    fn tcp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(src, dst, 64)
            .tcp(sport, dport, 1, 65535);
        let mut v = Vec::with_capacity(b.size(0));
        b.write(&mut v, &[]).unwrap_or_else(|e| panic!("{e}"));
        v
    }

    fn packet(frame: &[u8]) -> Packet {
        Packet::from_slice(frame, Meta::default())
    }

    fn tuple(frame: &[u8]) -> sluice_packet::FiveTuple {
        packet(frame).tuple().unwrap_or_else(|| panic!("a TCP frame"))
    }

    /// Two clients connect; the physical NAT gave them each other's ports (two instances,
    /// allocating in another order), and the server's answers come back to those ports. The
    /// logical run, translated, delivers each answer to the client it was for.
    #[test]
    fn a_closed_loop_run_feeds_the_logical_chain_its_own_choices() {
        let registry = sluice_nfs::registry();
        let syns = [tcp([10, 0, 0, 1], 1111, SERVER, 80), tcp([10, 0, 0, 2], 2222, SERVER, 80)];
        let alone = run_reference(&nat(), &registry, &syns.iter().map(|f| packet(f)).collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("{e}"));
        let ports: Vec<u16> = alone.outputs.iter().map(|o| tuple(&o.bytes).sport).collect();
        let [first, second] = ports[..] else { panic!("two SYNs out: {ports:?}") };
        assert_ne!(first, second);
        // The physical run: swapped ports, and the answers to them.
        let out = |input: u64, bytes: Vec<u8>| OutputRecord { input, clock: input + 1, in_port: 0, bytes };
        let physical = Observed {
            inputs: 4,
            outputs: vec![
                out(0, tcp(PUBLIC, second, SERVER, 80)),
                out(1, tcp(PUBLIC, first, SERVER, 80)),
                out(2, tcp(SERVER, 80, [10, 0, 0, 1], 1111)),
                out(3, tcp(SERVER, 80, [10, 0, 0, 2], 2222)),
            ],
            ..Observed::default()
        };
        let answers = [tcp(SERVER, 80, PUBLIC, second), tcp(SERVER, 80, PUBLIC, first)];
        let inputs: Vec<Packet> = syns.iter().chain(&answers).map(|f| packet(f)).collect();
        let delivered = |obs: &Observed| -> Vec<(std::net::IpAddr, u16)> {
            obs.outputs.iter().filter(|o| o.input >= 2).map(|o| tuple(&o.bytes)).map(|t| (t.dst, t.dport)).collect()
        };
        let client = |last: u8, port: u16| (std::net::IpAddr::from([10, 0, 0, last]), port);
        let translated =
            run_reference_closed_loop(&nat(), &registry, &inputs, &physical).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(delivered(&translated), vec![client(1, 1111), client(2, 2222)]);
        // As they are, each answer reaches the other client: what the translation is for.
        let raw = run_reference(&nat(), &registry, &inputs).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(delivered(&raw), vec![client(2, 2222), client(1, 1111)]);
    }
}
