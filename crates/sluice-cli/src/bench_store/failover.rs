//! Part 4: an instance failover under open-loop load. NAT alone and the example chain, fault
//! tolerant (`async-ft`, embedded store), fed at a fixed packet rate; the NAT instance crashes
//! halfway through. Reported per run: the root's recovery time (crash asked → the replacement
//! serves live traffic) and the time until latency is back to normal, from the run's latency
//! per millisecond window: the first window after the crash from which five windows in a row
//! have a 99th percentile within twice the one before the crash (and at most 20 µs above it),
//! and, less sensitive to the machine's noise later on, the first window back within that
//! bound after the crash showed.

use super::store::Env;
use super::BenchStoreArgs;
use crate::bench::common::{example_chain, repeat_interleaved, single_nf_chain, Stat, NAT_CONFIG, SAMPLE};
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use sluice_packet::Packet;
use sluice_runtime::disruption::Around;
use sluice_runtime::exec::{Crash, Planned};
use sluice_runtime::RunReport;
use sluice_runtime::{compile_with, run, Chain, DiscardSink, MemorySource, Overflow, RunConfig, RunHooks, StateConfig};
use sluice_store::ClientConfig;
use std::time::Duration;

/// One case: a chain whose NAT instance fails.
pub(super) struct FailoverCase {
    name: String,
    chain: Chain,
}

/// One run of a case.
#[derive(Debug, Clone, Serialize)]
pub(super) struct FailoverSample {
    /// Crash asked → replacement serving live traffic (the root's replay drained), ms.
    pub(super) recovery_ms: f64,
    /// Latency around the crash.
    #[serde(flatten)]
    pub(super) latency: Around,
    /// Copies lost with the instance, and replayed to its replacement.
    pub(super) lost: u64,
    pub(super) replayed: u64,
    /// Packets in and out (nothing may be lost).
    pub(super) packets_in: u64,
    pub(super) packets_out: u64,
}

/// A case over its repeats.
#[derive(Debug, Clone, Serialize)]
pub(super) struct FailoverResult {
    pub(super) case: String,
    pub(super) rate_pps: f64,
    pub(super) recovery_ms: Stat,
    #[serde(flatten)]
    pub(super) latency: AroundStats,
    repeats: Vec<FailoverSample>,
}

/// Every failover case `repeat` times, interleaved.
pub(super) fn run_failover(
    a: &BenchStoreArgs,
    env: &Env,
    packets: &[Packet],
    repeat: usize,
) -> Result<Vec<FailoverResult>> {
    if !a.failover_rate.is_finite() || a.failover_rate <= 0.0 {
        bail!("--failover-rate must be a positive packet rate");
    }
    let cases = vec![
        FailoverCase {
            name: "nat/failover".into(),
            chain: single_nf_chain("nat", NAT_CONFIG, 1, "<bench-store nat>")?,
        },
        FailoverCase { name: "example/failover".into(), chain: example_chain()? },
    ];
    let registry = sluice_nfs::registry();
    let measure = |c: &FailoverCase| run_one(c, a, env, packets, &registry).with_context(|| format!("case {}", c.name));
    let samples = repeat_interleaved(&cases, repeat, !a.quick, measure, |r, c, s| {
        let back = s.latency.back_to_normal_ms.map_or("never".to_string(), |b| format!("{b:.2} ms"));
        eprintln!(
            "[failover {r}/{repeat}] {:<18} recovery {:>8.2} ms  latency normal after {back}",
            c.name, s.recovery_ms
        )
    })?;
    Ok(cases
        .iter()
        .zip(samples)
        .map(|(c, s)| FailoverResult {
            case: c.name.clone(),
            rate_pps: a.failover_rate,
            recovery_ms: Stat::of(s.iter().map(|x| x.recovery_ms)),
            latency: AroundStats::of(s.iter().map(|x| &x.latency)),
            repeats: s,
        })
        .collect())
}

/// One run: a fresh store, the packets at the set rate, the NAT instance crashing halfway.
fn run_one(
    c: &FailoverCase,
    a: &BenchStoreArgs,
    env: &Env,
    packets: &[Packet],
    registry: &sluice_nf::NfRegistry,
) -> Result<FailoverSample> {
    let crash = |nat: usize| vec![Planned::Crash(Crash { after: packets.len() as u64 / 2, vertex: nat, index: 0 })];
    let report = run_open_loop(&c.chain, (a, env, registry), packets, true, crash)?;
    let f = report.failovers.first().ok_or_else(|| anyhow!("{}: no failover happened", c.name))?;
    Ok(FailoverSample {
        recovery_ms: f.recovery_ms,
        latency: report.around(f.asked_ms).ok_or_else(|| anyhow!("the run kept no latency timeline"))?,
        lost: f.lost,
        replayed: f.replayed,
        packets_in: report.packets_in,
        packets_out: report.packets_out,
    })
}

/// Runs `chain` on a fresh embedded store (`fault_tolerant` or not) over `packets` fed at
/// `--failover-rate`, with the events `planned` gives for the NAT's vertex index, keeping
/// latency per millisecond.
pub(super) fn run_open_loop(
    chain: &Chain,
    (a, env, registry): (&BenchStoreArgs, &Env, &sluice_nf::NfRegistry),
    packets: &[Packet],
    fault_tolerant: bool,
    planned: impl FnOnce(usize) -> Vec<Planned>,
) -> Result<RunReport> {
    let store = env.store(false, env.store_threads)?;
    let state = StateConfig::Store { backend: store.backend, client: ClientConfig::default() };
    let state = if fault_tolerant { state.fault_tolerant() } else { state };
    let plan = compile_with(chain, registry, &packets[..packets.len().min(SAMPLE)], &state)
        .map_err(|e| anyhow!("compiling {}: {e}", chain.name))?;
    let nat = plan.vertices.iter().position(|v| v.kind == "nat").ok_or_else(|| anyhow!("no NAT in {}", chain.name))?;
    let cfg = RunConfig {
        workers: a.workers.max(1),
        pin: !a.no_pin,
        batch: a.batch,
        window: a.window,
        overflow: Overflow::Wait,
        fault_tolerance: fault_tolerant,
        planned: planned(nat),
        latency_timeline: Some(Duration::from_millis(1)),
        ..RunConfig::default()
    };
    let mut source = MemorySource::with_rate(packets, a.failover_rate);
    Ok(run(plan, &cfg, &mut source, &mut DiscardSink, RunHooks::default())?)
}

/// [`Around`] over a case's repeats.
#[derive(Debug, Clone, Serialize)]
pub(super) struct AroundStats {
    pub(super) back_to_normal_ms: Stat,
    pub(super) first_normal_ms: Stat,
    pub(super) baseline_p99_us: Stat,
    pub(super) peak_p99_us: Stat,
    /// [`Around::baseline_normal_share`]: how often the run's own noise alone fails the rule.
    pub(super) baseline_normal_share: Stat,
    /// Runs in which latency did not come back to normal before the input ended.
    pub(super) never_normal: usize,
}

impl AroundStats {
    pub(super) fn of<'a>(runs: impl Iterator<Item = &'a Around> + Clone) -> AroundStats {
        AroundStats {
            back_to_normal_ms: Stat::of(runs.clone().filter_map(|x| x.back_to_normal_ms)),
            first_normal_ms: Stat::of(runs.clone().filter_map(|x| x.first_normal_ms)),
            baseline_p99_us: Stat::of(runs.clone().map(|x| x.baseline_p99_us)),
            peak_p99_us: Stat::of(runs.clone().map(|x| x.peak_p99_us)),
            baseline_normal_share: Stat::of(runs.clone().filter_map(|x| x.baseline_normal_share)),
            never_normal: runs.filter(|x| x.back_to_normal_ms.is_none()).count(),
        }
    }

    /// The table's columns: latency normal (min..max), first normal window (min..max), p99
    /// before, p99 peak, the share of stretches normal before, never normal.
    pub(super) fn columns(&self) -> String {
        let range = |s: &Stat| format!("{:.2} ({:.2}..{:.2})", s.median, s.min, s.max);
        format!(
            "{:>26} {:>24} {:>14.1} {:>14.1} {:>13.0} {:>7}",
            range(&self.back_to_normal_ms),
            range(&self.first_normal_ms),
            self.baseline_p99_us.median,
            self.peak_p99_us.median,
            self.baseline_normal_share.median * 100.0,
            self.never_normal
        )
    }
}

/// The header of [`AroundStats::columns`].
pub(super) const AROUND_HEADER: &str =
    "latency normal ms (min..max)  first normal ms (min..max)  p99 before µs    p99 peak µs  normal before %   never";
