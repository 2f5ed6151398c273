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
use sluice_runtime::exec::{Crash, Planned};
use sluice_runtime::report::LatencyWindow;
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
        latency: back_to_normal(&report.latency_timeline, f.asked_ms),
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
        checkpoint_every: (a.checkpoint_ms > 0).then(|| Duration::from_millis(a.checkpoint_ms)),
        planned: planned(nat),
        latency_timeline: Some(Duration::from_millis(1)),
        ..RunConfig::default()
    };
    let mut source = MemorySource::with_rate(packets, a.failover_rate);
    Ok(run(plan, &cfg, &mut source, &mut DiscardSink, RunHooks::default())?)
}

/// Windows in a row that must be normal again.
const NORMAL_WINDOWS: usize = 5;

/// Latency around a disruption (a crash, a move) in one run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Around {
    /// Disruption → latency back to normal, ms (`None`: not within the run).
    pub(super) back_to_normal_ms: Option<f64>,
    /// Disruption → the first window back within the bound after one over it (0 if none was
    /// over it), ms: when the disruption's own effect ended, whatever noise comes later
    /// (`None`: not within the run).
    pub(super) first_normal_ms: Option<f64>,
    /// Median of the per-window p99 before it, µs.
    pub(super) baseline_p99_us: f64,
    /// Highest per-window p99 after it, µs.
    pub(super) peak_p99_us: f64,
}

/// [`Around`] over a case's repeats.
#[derive(Debug, Clone, Serialize)]
pub(super) struct AroundStats {
    pub(super) back_to_normal_ms: Stat,
    pub(super) first_normal_ms: Stat,
    pub(super) baseline_p99_us: Stat,
    pub(super) peak_p99_us: Stat,
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
            never_normal: runs.filter(|x| x.back_to_normal_ms.is_none()).count(),
        }
    }

    /// The table's columns: latency normal (min..max), first normal window (min..max), p99
    /// before, p99 peak, never normal.
    pub(super) fn columns(&self) -> String {
        let range = |s: &Stat| format!("{:.2} ({:.2}..{:.2})", s.median, s.min, s.max);
        format!(
            "{:>26} {:>24} {:>14.1} {:>14.1} {:>7}",
            range(&self.back_to_normal_ms),
            range(&self.first_normal_ms),
            self.baseline_p99_us.median,
            self.peak_p99_us.median,
            self.never_normal
        )
    }
}

/// The header of [`AroundStats::columns`].
pub(super) const AROUND_HEADER: &str =
    "latency normal ms (min..max)  first normal ms (min..max)  p99 before µs    p99 peak µs   never";

/// From a latency timeline and the time of a disruption (ms): the baseline p99 before it, the
/// time from it until latency is back to normal, and the peak p99 after it.
pub(super) fn back_to_normal(timeline: &[LatencyWindow], crash_ms: f64) -> Around {
    // Before the crash, leaving out the first tenth of it (warm-up).
    let before: Vec<f64> = timeline
        .iter()
        .filter(|w| w.start_ms >= crash_ms / 10.0 && w.start_ms + 1.0 <= crash_ms)
        .map(|w| w.p99_us)
        .collect();
    let baseline = Stat::of(before.into_iter()).median;
    let limit = (2.0 * baseline).min(baseline + 20.0);
    let after: Vec<&LatencyWindow> = timeline.iter().filter(|w| w.start_ms + 1.0 > crash_ms).collect();
    let peak = after.iter().map(|w| w.p99_us).fold(0.0, f64::max);
    let back = (0..after.len()).find_map(|i| {
        let run = after.get(i..i + NORMAL_WINDOWS)?;
        run.iter().all(|w| w.p99_us <= limit).then(|| (run[0].start_ms - crash_ms).max(0.0))
    });
    let first = match after.iter().position(|w| w.p99_us > limit) {
        None => Some(0.0),
        Some(over) => after.iter().skip(over).find(|w| w.p99_us <= limit).map(|w| (w.start_ms - crash_ms).max(0.0)),
    };
    Around { back_to_normal_ms: back, first_normal_ms: first, baseline_p99_us: baseline, peak_p99_us: peak }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start_ms: f64, p99_us: f64) -> LatencyWindow {
        LatencyWindow { start_ms, packets: 10, p50_us: p99_us / 2.0, p99_us }
    }

    #[test]
    fn latency_is_normal_again_after_five_normal_windows() {
        let mut t: Vec<LatencyWindow> = (0..20).map(|i| w(f64::from(i), 10.0)).collect();
        // The crash at 20 ms: 4 slow windows, one normal, one slow, then normal for good.
        t.extend([w(20.0, 500.0), w(21.0, 400.0), w(22.0, 300.0), w(23.0, 200.0), w(24.0, 12.0), w(25.0, 90.0)]);
        t.extend((26..40).map(|i| w(f64::from(i), 11.0)));
        let a = back_to_normal(&t, 20.0);
        assert_eq!(a.baseline_p99_us, 10.0);
        assert_eq!(a.back_to_normal_ms, Some(6.0));
        assert_eq!(a.first_normal_ms, Some(4.0), "the first window back within the bound");
        assert_eq!(a.peak_p99_us, 500.0);
        // Never normal again within the run.
        assert_eq!(back_to_normal(&t[..26], 20.0).back_to_normal_ms, None);
        assert_eq!(back_to_normal(&t[..24], 20.0).first_normal_ms, None);
        // No window over the bound: nothing to come back from.
        let quiet: Vec<LatencyWindow> = (0..40).map(|i| w(f64::from(i), 10.0)).collect();
        assert_eq!(back_to_normal(&quiet, 20.0).first_normal_ms, Some(0.0));
    }
}
