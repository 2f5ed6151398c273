//! Part 5: a live flow move under open-loop load (CHC's 4,000-flow move). A NAT (embedded
//! store, asynchronous updates), fed at `--failover-rate`, scales to two instances at the
//! start, and halfway through 4,000 of the flows its first instance has received move to the
//! second. (The example chain is left out: its order-sensitive detectors take their input in
//! entry order in a run that can scale, and at this rate on two cores it builds a queue before
//! any move.) Reported per run: the flows moved, the pause of
//! the moved flows (from the move until it settled: the longest a moved flow's packet waited),
//! and latency around the move as for a failover.

use super::failover::{run_open_loop, AroundStats};
use super::store::Env;
use super::BenchStoreArgs;
use crate::bench::common::{generate_packets, repeat_interleaved, single_nf_chain, Stat, NAT_CONFIG};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use sluice_io::{GenConfig, Workload};
use sluice_packet::Packet;
use sluice_runtime::disruption::Around;
use sluice_runtime::exec::{Change, Planned, Reconfig};
use sluice_runtime::Chain;

/// Flows moved (at most).
const MOVED: u64 = 4_000;

/// One run of a case.
#[derive(Debug, Clone, Serialize)]
pub(super) struct MoveSample {
    pub(super) flows_moved: u64,
    /// Move → settled, ms.
    pub(super) pause_ms: f64,
    /// Of that, until every earlier clock had finished, ms.
    pub(super) drain_ms: f64,
    /// Latency around the move.
    #[serde(flatten)]
    pub(super) latency: Around,
    pub(super) packets_in: u64,
    pub(super) packets_out: u64,
}

/// A case over its repeats.
#[derive(Debug, Clone, Serialize)]
pub(super) struct MoveResult {
    pub(super) case: String,
    pub(super) rate_pps: f64,
    pub(super) flows_moved: Stat,
    pub(super) pause_ms: Stat,
    pub(super) drain_ms: Stat,
    #[serde(flatten)]
    pub(super) latency: AroundStats,
    repeats: Vec<MoveSample>,
}

/// Every move case `repeat` times, interleaved, over their own packets: 40,000 flows of 7
/// packets (so that the first instance has more than 4,000 flows halfway), 400 with
/// `--quick`.
pub(super) fn run_moves(a: &BenchStoreArgs, env: &Env, repeat: usize) -> Result<Vec<MoveResult>> {
    if !a.failover_rate.is_finite() || a.failover_rate <= 0.0 {
        bail!("--failover-rate must be a positive packet rate");
    }
    let (flows, packets_per_flow) = if a.quick { (400, 7) } else { (40_000, 7) };
    let gcfg = GenConfig::new(Workload::Custom { flows, packets_per_flow }, a.seed);
    let packets = generate_packets(&gcfg).map_err(|e| anyhow!("generating packets: {e}"))?;
    let cases = vec![("nat/move-4000".to_string(), single_nf_chain("nat", NAT_CONFIG, 1, "<bench-store nat>")?)];
    let registry = sluice_nfs::registry();
    let measure = |(name, chain): &(String, Chain)| {
        run_one(chain, a, env, &packets, &registry).with_context(|| format!("case {name}"))
    };
    let samples = repeat_interleaved(&cases, repeat, !a.quick, measure, |r, (name, _), s| {
        eprintln!(
            "[move {r}/{repeat}] {name:<18} {} flows, pause {:.3} ms ({:.3} ms draining)",
            s.flows_moved, s.pause_ms, s.drain_ms
        )
    })?;
    Ok(cases
        .iter()
        .zip(samples)
        .map(|((name, _), s)| MoveResult {
            case: name.clone(),
            rate_pps: a.failover_rate,
            flows_moved: Stat::of(s.iter().map(|x| x.flows_moved as f64)),
            pause_ms: Stat::of(s.iter().map(|x| x.pause_ms)),
            drain_ms: Stat::of(s.iter().map(|x| x.drain_ms)),
            latency: AroundStats::of(s.iter().map(|x| &x.latency)),
            repeats: s,
        })
        .collect())
}

/// One run: a fresh store, the packets at the set rate, the NAT scaled to two at once and
/// 4,000 flows moved halfway.
fn run_one(
    chain: &Chain,
    a: &BenchStoreArgs,
    env: &Env,
    packets: &[Packet],
    registry: &sluice_nf::NfRegistry,
) -> Result<MoveSample> {
    let half = packets.len() as u64 / 2;
    let planned = |nat: usize| {
        let change = |after: u64, change: Change| Planned::Change(Reconfig { after, vertex: nat, change });
        vec![change(1, Change::ScaleTo(2)), change(half, Change::Move { from: 0, to: 1, flows: Some(MOVED) })]
    };
    let report = run_open_loop(chain, (a, env, registry), packets, false, planned)?;
    let m = report.reconfigurations.get(1).ok_or_else(|| anyhow!("{}: no move happened", chain.name))?;
    Ok(MoveSample {
        flows_moved: m.flows,
        pause_ms: m.settle_ms,
        drain_ms: m.drain_ms,
        latency: report.around(m.at_ms).ok_or_else(|| anyhow!("the run kept no latency timeline"))?,
        packets_in: report.packets_in,
        packets_out: report.packets_out,
    })
}
