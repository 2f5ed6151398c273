//! `verify`: runs the reference (the logical chain) and the physical chain under a fault
//! schedule over the same input, and compares what they produced.

use crate::compare::{compare, CompareOptions, Comparison};
use crate::engine::{Engine, EngineConfig, EngineError, EngineStats, Episode, Switches};
use crate::observed::Observed;
use crate::reference::run_reference;
use crate::schedule::FaultSchedule;
use sluice_nf::NfRegistry;
use sluice_packet::Packet;
use sluice_runtime::Chain;
use sluice_store::Backend;
use std::sync::Arc;
use std::time::Instant;

/// The outcome of one verification.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyReport {
    /// Chain name.
    pub chain: String,
    /// The store the physical chain used.
    pub store: String,
    /// Input packets.
    pub inputs: u64,
    /// The schedule applied (absolute packet counts resolved).
    pub faults: FaultSchedule,
    /// Mechanisms switched on or off.
    pub switches: Switches,
    /// Whether the physical run is equivalent to the reference.
    pub equivalent: bool,
    /// Every difference found, with the flow, NF and clock.
    pub comparison: Comparison,
    /// Output packets of the reference run.
    pub reference_outputs: u64,
    /// Output packets of the physical run.
    pub physical_outputs: u64,
    /// Mechanism counters of the physical run.
    pub engine: EngineStats,
    /// Recoveries and reconfigurations of the physical run, with their times.
    pub episodes: Vec<Episode>,
    /// The events (alerts, detections) of the physical run; drops are counted, not listed.
    pub events: Vec<crate::observed::Decision>,
    /// Wall-clock seconds for both runs and the comparison.
    pub elapsed_s: f64,
}

impl VerifyReport {
    /// A readable report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "verify {}: {} input packets, store {}, {} fault event(s)\n",
            self.chain,
            self.inputs,
            self.store,
            self.faults.events.len()
        ));
        s.push_str(&format!(
            "  reference: {} packets out; physical: {} packets out\n",
            self.reference_outputs, self.physical_outputs
        ));
        let e = &self.engine;
        for u in &e.unrecoverable {
            s.push_str(&format!("  outside the guarantee (CHC cannot recover this): {u}\n"));
        }
        s.push_str(&format!(
            "  root: {} admitted, {} dropped (log full), {} malformed; {} replayed; log peak {}, left {}\n",
            e.admitted, e.root_dropped, e.malformed, e.replayed, e.log_peak, e.log_left
        ));
        s.push_str(&format!(
            "  duplicates: {} suppressed ({} at the egress), {} reached the receiver, {} store updates answered from the per-clock log\n",
            e.duplicates_suppressed, e.egress_duplicates, e.duplicate_outputs, e.store_duplicates
        ));
        for (v, n) in &e.duplicate_packets {
            let u = e.duplicate_updates.get(v).copied().unwrap_or(0);
            s.push_str(&format!("  duplicates reaching `{v}`: {n} packets, {u} state updates\n"));
        }
        s.push_str(&format!("  latency (virtual): p50 {:.1} µs, p99 {:.1} µs\n", e.latency_p50_us, e.latency_p99_us));
        for ep in &self.episodes {
            s.push_str(&format!(
                "  {} at packet {}{}: {:.0} µs wall, {:.1} µs virtual{}{}{}{}\n",
                ep.kind,
                ep.at_packet,
                ep.vertex.as_deref().map(|v| format!(" ({v})")).unwrap_or_default(),
                ep.wall_us,
                ep.virtual_us,
                if ep.replayed > 0 { format!(", {} replayed", ep.replayed) } else { String::new() },
                if ep.flows > 0 { format!(", {} flows", ep.flows) } else { String::new() },
                ep.back_to_normal_us.map(|b| format!(", latency normal after {b:.0} µs")).unwrap_or_default(),
                if ep.detail.is_empty() { String::new() } else { format!("; {}", ep.detail) },
            ));
        }
        s.push_str(&self.comparison.summary());
        s.push_str(if self.equivalent { "\nEQUIVALENT\n" } else { "\nNOT EQUIVALENT\n" });
        s
    }
}

/// Runs the reference and the physical chain (on `backend`, which must be empty) and
/// compares them.
pub fn verify(
    chain: &Chain,
    registry: &NfRegistry,
    packets: &[Packet],
    schedule: &FaultSchedule,
    backend: Arc<dyn Backend>,
    cfg: EngineConfig,
    opts: &CompareOptions,
) -> Result<VerifyReport, EngineError> {
    let t0 = Instant::now();
    let reference = run_reference(chain, registry, packets)?;
    let mut report = verify_against(&reference, chain, registry, packets, schedule, backend, cfg, opts)?;
    report.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// As [`verify`], against a reference run already made over the same `packets` (the reference
/// does not depend on the schedule, so runs of many schedules over one trace share it).
#[allow(clippy::too_many_arguments)]
pub fn verify_against(
    reference: &Observed,
    chain: &Chain,
    registry: &NfRegistry,
    packets: &[Packet],
    schedule: &FaultSchedule,
    backend: Arc<dyn Backend>,
    mut cfg: EngineConfig,
    opts: &CompareOptions,
) -> Result<VerifyReport, EngineError> {
    let t0 = Instant::now();
    cfg.seed = schedule.seed;
    let store = backend.name();
    let switches = cfg.switches;
    let faults: Vec<_> = schedule.resolve(packets.len() as u64).into_iter().map(|(at, ev)| (at, ev.clone())).collect();
    let engine = Engine::new(chain, registry, backend, cfg, schedule.policies.clone())?;
    let physical = engine.run(packets, &faults)?;
    let comparison = compare(reference, &physical.observed, opts);
    Ok(VerifyReport {
        chain: chain.name.clone(),
        store,
        inputs: packets.len() as u64,
        faults: schedule.clone(),
        switches,
        equivalent: comparison.equivalent,
        reference_outputs: reference.outputs.len() as u64,
        physical_outputs: physical.observed.outputs.len() as u64,
        comparison,
        events: physical.observed.decisions.iter().filter(|d| !d.kind.starts_with("drop:")).cloned().collect(),
        engine: physical.stats,
        episodes: physical.episodes,
        elapsed_s: t0.elapsed().as_secs_f64(),
    })
}
