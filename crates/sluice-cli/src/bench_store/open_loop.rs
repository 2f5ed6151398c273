//! Part 6: open-loop latency. Each chain and state mode is first run at saturation to find its
//! peak; then packets are offered at fixed fractions of that peak (`--loads`, default 50 % and
//! 90 %), each packet due at its time whether or not the chain keeps up, and the root-to-sink
//! latency percentiles (p50, p99, p99.9) are reported — with state local, in the embedded store
//! (`async`), and with fault tolerance on (`async-ft`).
//!
//! The open-loop runs keep the saturated runs' window (`--window`, by default what `sluice run`
//! uses). Latency is measured from the root's admission: a packet that waited for room in the
//! window waited before it. A run whose source fell behind its schedule that way (achieved
//! rate under 97 % of the offered one, on the runtime's clock) is counted in `behind`, and its
//! percentiles understate what a packet saw. A much larger window does not help: with
//! 65,536 packets of the size mix in flight (tens of MB) the example chain's peak falls from
//! 0.89 to 0.63 Mpps (cache misses), so a run that falls behind never catches up.

use super::modes::{run_once, ModeKind, StoreKind};
use super::store::Env;
use super::BenchStoreArgs;
use crate::bench::common::{mpps, repeat_interleaved, single_nf_chain, Stat};
use anyhow::{bail, Result};
use serde::Serialize;
use sluice_packet::Packet;
use sluice_runtime::{Chain, MemorySource, Overflow, RunConfig};

/// A run that achieved less than this fraction of its offered rate fell behind its schedule.
const KEPT_UP: f64 = 0.97;

/// One chain in one state mode.
struct Config {
    name: String,
    nf: &'static str,
    chain: Chain,
    mode: ModeKind,
}

/// One run at one offered load.
#[derive(Debug, Clone, Serialize)]
pub(super) struct OpenSample {
    /// Packets per second offered, millions.
    pub(super) offered_mpps: f64,
    /// Packets admitted / wall time, millions.
    pub(super) achieved_mpps: f64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    pub(super) p999_us: f64,
}

/// One offered load of one configuration.
#[derive(Debug, Clone, Serialize)]
pub(super) struct LoadResult {
    /// Percent of the configuration's median peak.
    pub(super) percent: u32,
    pub(super) offered_mpps: f64,
    pub(super) achieved_mpps: Stat,
    pub(super) p50_us: Stat,
    pub(super) p99_us: Stat,
    pub(super) p999_us: Stat,
    /// Repetitions whose source fell behind (achieved < 97 % of offered).
    pub(super) fell_behind: usize,
    pub(super) repeats: Vec<OpenSample>,
}

/// One configuration's peak and loads.
#[derive(Debug, Clone, Serialize)]
pub(super) struct OpenLoopResult {
    pub(super) name: String,
    pub(super) nf: String,
    pub(super) mode: ModeKind,
    /// Saturated Mpps (window `--window`), the peak the loads are fractions of.
    pub(super) peak_mpps: Stat,
    pub(super) loads: Vec<LoadResult>,
}

/// The chains: the mode cases' (NAT and LB alone, the example chain) and the IDS alone.
fn chains() -> Result<Vec<(&'static str, Chain)>> {
    let mut chains = super::modes::mode_chains()?;
    chains.push(("ids", single_nf_chain("ids", "", 1, "<bench-store ids>")?));
    Ok(chains)
}

/// Peaks, then every load, for every chain in `local`, `async` and `async-ft` (embedded store).
pub(super) fn run_open_loop(
    a: &BenchStoreArgs,
    env: &Env,
    packets: &[Packet],
    repeat: usize,
) -> Result<Vec<OpenLoopResult>> {
    if a.loads.is_empty() || a.loads.iter().any(|p| !(1..=100).contains(p)) {
        bail!("--loads takes percentages from 1 to 100, not {:?}", a.loads);
    }
    let mut configs = Vec::new();
    for (nf, chain) in chains()? {
        for mode in [ModeKind::Local, ModeKind::Async, ModeKind::AsyncFt] {
            let name = format!("{nf}/{}", mode.name());
            if a.cases.is_empty() || a.cases.iter().any(|want| name.contains(want.as_str())) {
                configs.push(Config { name, nf, chain: chain.clone(), mode });
            }
        }
    }
    if configs.is_empty() {
        bail!("--cases {:?} matches no open-loop configuration (names such as nat/async-ft)", a.cases);
    }
    let registry = sluice_nfs::registry();
    let store = |c: &Config| if c.mode == ModeKind::Local { StoreKind::None } else { StoreKind::Embedded };
    let cfg = |window: usize, c: &Config| RunConfig {
        workers: a.workers.max(1),
        pin: !a.no_pin,
        batch: a.batch,
        window,
        overflow: Overflow::Wait,
        fault_tolerance: c.mode == ModeKind::AsyncFt,
        ..RunConfig::default()
    };

    let saturated = |c: &Config| {
        let (r, wall) = run_once(
            (&c.name, &c.chain),
            (c.mode, store(c)),
            MemorySource::new(packets),
            &cfg(a.window, c),
            &registry,
            env,
        )?;
        Ok(mpps(r.packets_in, wall))
    };
    let peaks = repeat_interleaved(&configs, repeat, !a.quick, saturated, |r, c, m: &f64| {
        eprintln!("[open-loop peak {r}/{repeat}] {:<22} {m:>8.3} Mpps", c.name)
    })?;
    let peak_of: Vec<Stat> = peaks.iter().map(|p| Stat::of(p.iter().copied())).collect();

    let mut loads_of: Vec<Vec<LoadResult>> = configs.iter().map(|_| Vec::new()).collect();
    for &percent in &a.loads {
        let offered = |i: usize| peak_of.get(i).map_or(0.0, |p| p.median) * 1e6 * f64::from(percent) / 100.0;
        let indexed: Vec<(usize, &Config)> = configs.iter().enumerate().collect();
        let open = |(i, c): &(usize, &Config)| {
            let pps = offered(*i);
            let source = MemorySource::with_rate(packets, pps);
            let (r, _) = run_once((&c.name, &c.chain), (c.mode, store(c)), source, &cfg(a.window, c), &registry, env)?;
            let l = &r.latency_us;
            Ok(OpenSample {
                offered_mpps: pps / 1e6,
                // The runtime's own clock: from the first admission, not from thread start-up.
                achieved_mpps: r.mpps,
                p50_us: l.p50,
                p99_us: l.p99,
                p999_us: l.p999,
            })
        };
        let samples = repeat_interleaved(&indexed, repeat, false, open, |r, (_, c), s: &OpenSample| {
            eprintln!(
                "[open-loop {percent}% {r}/{repeat}] {:<22} {:>7.3} of {:>7.3} Mpps  p50 {:>8.1}  p99 {:>8.1}  p99.9 {:>8.1} µs",
                c.name, s.achieved_mpps, s.offered_mpps, s.p50_us, s.p99_us, s.p999_us
            )
        })?;
        for ((i, _), repeats) in indexed.iter().zip(samples) {
            let st = |f: fn(&OpenSample) -> f64| Stat::of(repeats.iter().map(f));
            let fell_behind = repeats.iter().filter(|s| s.achieved_mpps < s.offered_mpps * KEPT_UP).count();
            if let Some(l) = loads_of.get_mut(*i) {
                l.push(LoadResult {
                    percent,
                    offered_mpps: offered(*i) / 1e6,
                    achieved_mpps: st(|s| s.achieved_mpps),
                    p50_us: st(|s| s.p50_us),
                    p99_us: st(|s| s.p99_us),
                    p999_us: st(|s| s.p999_us),
                    fell_behind,
                    repeats,
                });
            }
        }
    }
    Ok(configs
        .into_iter()
        .zip(peak_of)
        .zip(loads_of)
        .map(|((c, peak_mpps), loads)| OpenLoopResult {
            name: c.name,
            nf: c.nf.to_string(),
            mode: c.mode,
            peak_mpps,
            loads,
        })
        .collect())
}

/// The latency aim: the IDS's median latency under 1 ms at half its peak.
pub(super) fn check_aims(results: &[OpenLoopResult]) -> Vec<super::modes::Aim> {
    results
        .iter()
        .filter(|r| r.nf == "ids")
        .filter_map(|r| r.loads.iter().find(|l| l.percent == 50).map(|l| (r, l)))
        .map(|(r, l)| super::modes::Aim {
            aim: "IDS median latency < 1 ms at 50% of its peak (open loop)".into(),
            case: r.name.clone(),
            value: l.p50_us.median,
            target: 1000.0,
            met: l.p50_us.median < 1000.0,
        })
        .collect()
}

/// The open-loop table.
pub(super) fn print_table(results: &[OpenLoopResult], repeat: usize) {
    if results.is_empty() {
        return;
    }
    println!("\nopen-loop latency (offered at a fraction of each configuration's own peak; µs root to sink; medians of {repeat}):");
    println!(
        "{:<20} {:>9} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>7}",
        "config", "peak Mpps", "load", "offered", "achieved", "p50", "p99", "p99.9", "behind"
    );
    for r in results {
        for l in &r.loads {
            println!(
                "{:<20} {:>9.3} {:>5}% {:>9.3} {:>9.3} {:>10.1} {:>10.1} {:>10.1} {:>7}",
                r.name,
                r.peak_mpps.median,
                l.percent,
                l.offered_mpps,
                l.achieved_mpps.median,
                l.p50_us.median,
                l.p99_us.median,
                l.p999_us.median,
                format!("{}/{}", l.fell_behind, l.repeats.len())
            );
        }
    }
}
