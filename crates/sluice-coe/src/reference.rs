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
use std::collections::HashMap;

/// Runs the logical chain of `chain` over `packets` (already parsed; malformed and truncated
/// frames are dropped at the root as the physical chain does).
pub fn run_reference(chain: &Chain, registry: &NfRegistry, packets: &[Packet]) -> Result<Observed, PlanError> {
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
        if matches!(original.hdr().status, ParseStatus::Truncated | ParseStatus::Malformed) {
            obs.root_dropped.push(input);
            continue;
        }
        let mut pkt = original.clone();
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
