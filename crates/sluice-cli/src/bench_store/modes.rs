//! Part 1: the modes. NAT, LB and the example chain over packets held in memory, with state
//! `local` and in the store in the `external`, `cached` and `async` modes, each at saturation
//! and paced, with the ratios and added latencies against `local`; and the aims,
//! checked on them.

use super::store::{clear_redis, Env};
use super::BenchStoreArgs;
use crate::bench::common::{example_chain, mpps, ratio, repeat_interleaved, single_nf_chain, Stat, NAT_CONFIG, SAMPLE};
use anyhow::{anyhow, Context, Result};
use serde::Serialize;
use sluice_packet::Packet;
use sluice_runtime::{
    compile_with, run, Chain, DiscardSink, MemorySource, Overflow, RunConfig, RunHooks, RunReport, StateConfig,
};
use sluice_store::ClientConfig;
use std::collections::BTreeMap;
use std::time::Instant;

/// Where state lives in a mode case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum ModeKind {
    /// In the NF instance (no store).
    Local,
    /// Every operation a round trip to the store.
    External,
    /// Reads from a cache kept fresh by callbacks.
    Cached,
    /// Cached, and updates not waited for.
    Async,
    /// `async` with the root's packet log, XOR check and egress duplicate suppression
    /// (`sluice run --fault-tolerance`); embedded store only.
    #[serde(rename = "async-ft")]
    AsyncFt,
}

impl ModeKind {
    const ALL: [ModeKind; 5] =
        [ModeKind::Local, ModeKind::External, ModeKind::Cached, ModeKind::Async, ModeKind::AsyncFt];

    /// The mode's name in case names and reports.
    pub(super) fn name(self) -> &'static str {
        match self {
            ModeKind::Local => "local",
            ModeKind::External => "external",
            ModeKind::Cached => "cached",
            ModeKind::Async => "async",
            ModeKind::AsyncFt => "async-ft",
        }
    }

    /// The store client's mode (`None`: state stays local).
    fn client(self) -> Option<sluice_store::Mode> {
        match self {
            ModeKind::Local => None,
            ModeKind::External => Some(sluice_store::Mode::External),
            ModeKind::Cached => Some(sluice_store::Mode::Cached),
            ModeKind::Async | ModeKind::AsyncFt => Some(sluice_store::Mode::Async),
        }
    }
}

/// The store of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum StoreKind {
    /// No store (`local`).
    None,
    /// The store in this process.
    Embedded,
    /// A Redis server.
    Redis,
}

impl StoreKind {
    /// The store's name in case names and reports.
    pub(super) fn name(self) -> &'static str {
        match self {
            StoreKind::None => "-",
            StoreKind::Embedded => "embedded",
            StoreKind::Redis => "redis",
        }
    }
}

/// Saturated (large window) or paced (window of one batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Load {
    /// The root keeps `--window` packets in flight.
    Saturated,
    /// One batch in flight at a time.
    Paced,
}

/// One mode case.
struct ModeCase {
    name: String,
    nf: &'static str,
    chain: Chain,
    mode: ModeKind,
    store: StoreKind,
    load: Load,
    packets: usize,
}

/// One vertex of one run.
#[derive(Debug, Clone, Serialize)]
struct VertexSample {
    name: String,
    kind: String,
    off_path: bool,
    packets_in: u64,
    busy_s: f64,
    /// Packets per second of busy time, millions.
    busy_mpps: f64,
    /// Busy nanoseconds per packet.
    busy_ns_per_packet: f64,
    /// Store counters summed over the instances (requests, round_trips, cache_hits, ...).
    state: BTreeMap<String, u64>,
}

/// One run of one mode case.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ModeSample {
    /// Input packets / wall time of `run`, millions.
    mpps: f64,
    wall_s: f64,
    packets_in: u64,
    packets_out: u64,
    dropped: u64,
    p5_us: f64,
    p25_us: f64,
    p50_us: f64,
    p75_us: f64,
    p95_us: f64,
    p99_us: f64,
    /// Busy nanoseconds per input packet, summed over the on-path vertices.
    on_path_busy_ns: f64,
    vertices: Vec<VertexSample>,
}

/// Statistics of a mode case.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct ModeSummary {
    pub(super) mpps: Stat,
    pub(super) p5_us: Stat,
    pub(super) p25_us: Stat,
    pub(super) p50_us: Stat,
    pub(super) p75_us: Stat,
    pub(super) p95_us: Stat,
    pub(super) p99_us: Stat,
    pub(super) on_path_busy_ns: Stat,
    /// Per vertex: median busy Mpps.
    pub(super) vertex_busy_mpps: BTreeMap<String, f64>,
}

/// A mode case's results.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ModeResult {
    pub(super) name: String,
    pub(super) nf: String,
    pub(super) mode: ModeKind,
    pub(super) store: StoreKind,
    pub(super) load: Load,
    pub(super) window: usize,
    pub(super) packets: usize,
    /// NFs a packet crosses (the off-path Trojan detector excluded).
    pub(super) on_path_nfs: usize,
    pub(super) summary: ModeSummary,
    /// Median Mpps / median Mpps of `local` (same NF, same load).
    pub(super) mpps_ratio_to_local: Option<f64>,
    /// `async-ft` only: the median over repetitions of Mpps / Mpps of `async` in the same
    /// repetition (same NF, store and load), what the root's log costs.
    pub(super) mpps_ratio_to_async: Option<f64>,
    /// Median p50 − median p50 of `local`, µs.
    pub(super) added_p50_us: Option<f64>,
    /// `added_p50_us` / on-path NFs.
    pub(super) added_p50_us_per_nf: Option<f64>,
    /// Added busy time per packet per on-path NF vs `local`, ns (service time, no queueing).
    pub(super) added_busy_ns_per_nf: Option<f64>,
    repeats: Vec<ModeSample>,
}

/// An aim of the issue and whether it is met.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Aim {
    pub(super) aim: String,
    pub(super) case: String,
    pub(super) value: f64,
    pub(super) target: f64,
    pub(super) met: bool,
}

/// Every mode case `repeat` times, interleaved, after an untimed warm-up run unless `--quick`.
pub(super) fn run_modes(
    a: &BenchStoreArgs,
    env: &Env,
    packets: &[Packet],
    repeat: usize,
    paced_window: usize,
) -> Result<Vec<ModeResult>> {
    let cases = mode_cases(a, env.redis.is_some(), packets.len())?;
    let registry = sluice_nfs::registry();
    let cfg_of = |c: &ModeCase| RunConfig {
        workers: a.workers.max(1),
        roots: a.roots,
        pin: !a.no_pin,
        batch: a.batch,
        window: if c.load == Load::Paced { paced_window } else { a.window },
        overflow: Overflow::Wait,
        fault_tolerance: c.mode == ModeKind::AsyncFt,
        record: false,
        latency_timeline: None,
        ..RunConfig::default()
    };
    let measure =
        |c: &ModeCase| run_mode(c, packets, &cfg_of(c), &registry, env).with_context(|| format!("case {}", c.name));
    let samples = repeat_interleaved(&cases, repeat, !a.quick, measure, |r, c, s| {
        eprintln!("[modes {}/{}] {:<34} {:>8.3} Mpps  p50 {:>9.1} µs", r, repeat, c.name, s.mpps, s.p50_us)
    })?;
    Ok(mode_results(&cases, samples, a, paced_window))
}

/// The chains the mode cases run: NAT and LB alone, and the example chain.
pub(super) fn mode_chains() -> Result<Vec<(&'static str, Chain)>> {
    Ok(vec![
        ("nat", single_nf_chain("nat", NAT_CONFIG, 1, "<bench-store nat>")?),
        ("lb", single_nf_chain("lb", "", 1, "<bench-store lb>")?),
        ("example", example_chain()?),
    ])
}

/// Every mode case, in report order.
fn mode_cases(a: &BenchStoreArgs, with_redis: bool, packets: usize) -> Result<Vec<ModeCase>> {
    let chains = mode_chains()?;
    let mut stores = vec![StoreKind::Embedded];
    if with_redis {
        stores.push(StoreKind::Redis);
    }
    let mut cases = Vec::new();
    for load in [Load::Saturated, Load::Paced] {
        for (nf, chain) in &chains {
            for mode in ModeKind::ALL {
                let ss: &[StoreKind] = match mode {
                    ModeKind::Local => &[StoreKind::None],
                    ModeKind::AsyncFt => &[StoreKind::Embedded],
                    _ => &stores,
                };
                for &store in ss {
                    let n = match (store, mode) {
                        (StoreKind::Redis, ModeKind::External) => packets.min(a.external_redis_packets.max(1)),
                        (StoreKind::Redis, _) => packets.min(a.redis_packets.max(1)),
                        _ => packets,
                    };
                    let load_name = if load == Load::Paced { "paced" } else { "sat" };
                    let name = match store {
                        StoreKind::None => format!("{nf}/{}/{load_name}", mode.name()),
                        _ => format!("{nf}/{}-{}/{load_name}", mode.name(), store.name()),
                    };
                    if a.cases.is_empty() || a.cases.iter().any(|want| name.contains(want.as_str())) {
                        cases.push(ModeCase { name, nf, chain: chain.clone(), mode, store, load, packets: n });
                    }
                }
            }
        }
    }
    if cases.is_empty() {
        return Err(anyhow!("--cases {:?} matches no mode case (names such as nat/async-embedded/sat)", a.cases));
    }
    Ok(cases)
}

/// One run of a mode case: a fresh plan and store, memory in, discard out.
fn run_mode(
    c: &ModeCase,
    packets: &[Packet],
    cfg: &RunConfig,
    registry: &sluice_nf::NfRegistry,
    env: &Env,
) -> Result<ModeSample> {
    let packets = &packets[..c.packets.min(packets.len())];
    let (report, wall_s) =
        run_once((&c.name, &c.chain), (c.mode, c.store), MemorySource::new(packets), cfg, registry, env)?;
    Ok(mode_sample(&report, wall_s))
}

/// One run of `chain` (`name` in errors) with state in `mode` on `store`: a fresh plan and
/// store, `source` in, discard out, the Redis keyspace cleared afterwards. The report and the
/// wall time of the run.
pub(super) fn run_once(
    (name, chain): (&str, &Chain),
    (mode, store): (ModeKind, StoreKind),
    mut source: MemorySource<'_>,
    cfg: &RunConfig,
    registry: &sluice_nf::NfRegistry,
    env: &Env,
) -> Result<(RunReport, f64)> {
    let mut redis = None;
    let state = match mode.client() {
        None => StateConfig::Local,
        Some(client) => {
            let s = env.store(store == StoreKind::Redis, env.store_threads)?;
            redis = s.redis;
            let state = StateConfig::Store {
                backend: s.backend,
                client: ClientConfig { mode: client, ..ClientConfig::default() },
            };
            // As `sluice run` configures a plain run, or one with fault tolerance.
            if mode == ModeKind::AsyncFt {
                state.fault_tolerant()
            } else {
                state.without_duplicates()
            }
        }
    };
    let sample = source.sample(SAMPLE);
    let plan = compile_with(chain, registry, sample, &state).map_err(|e| anyhow!("compiling {name}: {e}"))?;
    drop(state);
    let t = Instant::now();
    let report = run(plan, cfg, &mut source, &mut DiscardSink, RunHooks::default());
    let wall_s = t.elapsed().as_secs_f64();
    clear_redis(redis.as_deref())?;
    Ok((report?, wall_s))
}

/// The numbers of one run.
fn mode_sample(r: &RunReport, wall_s: f64) -> ModeSample {
    let vertices: Vec<VertexSample> = r
        .vertices
        .iter()
        .map(|v| {
            let busy_s: f64 = v.instances.iter().map(|i| i.busy_s).sum();
            let packets_in = v.packets_in();
            let mut state: BTreeMap<String, u64> = BTreeMap::new();
            for i in &v.instances {
                for (k, n) in &i.state {
                    *state.entry(k.clone()).or_default() += n;
                }
            }
            VertexSample {
                name: v.name.clone(),
                kind: v.kind.clone(),
                off_path: v.off_path,
                packets_in,
                busy_s,
                busy_mpps: mpps(packets_in, busy_s),
                busy_ns_per_packet: if packets_in > 0 { busy_s * 1e9 / packets_in as f64 } else { 0.0 },
                state,
            }
        })
        .collect();
    let on_path: f64 = vertices.iter().filter(|v| !v.off_path).map(|v| v.busy_s).sum();
    let l = &r.latency_us;
    ModeSample {
        mpps: mpps(r.packets_in, wall_s),
        wall_s,
        packets_in: r.packets_in,
        packets_out: r.packets_out,
        dropped: r.dropped_total,
        p5_us: l.p5,
        p25_us: l.p25,
        p50_us: l.p50,
        p75_us: l.p75,
        p95_us: l.p95,
        p99_us: l.p99,
        on_path_busy_ns: if r.packets_in > 0 { on_path * 1e9 / r.packets_in as f64 } else { 0.0 },
        vertices,
    }
}

/// Summaries and ratios to `local`.
fn mode_results(
    cases: &[ModeCase],
    samples: Vec<Vec<ModeSample>>,
    a: &BenchStoreArgs,
    paced_window: usize,
) -> Vec<ModeResult> {
    let mut out: Vec<ModeResult> = cases
        .iter()
        .zip(samples)
        .map(|(c, repeats)| {
            let s = |f: fn(&ModeSample) -> f64| Stat::of(repeats.iter().map(f));
            let mut vertex_busy_mpps = BTreeMap::new();
            if let Some(first) = repeats.first() {
                for (i, v) in first.vertices.iter().enumerate() {
                    let st = Stat::of(repeats.iter().filter_map(|r| r.vertices.get(i)).map(|v| v.busy_mpps));
                    vertex_busy_mpps.insert(v.name.clone(), st.median);
                }
            }
            let on_path_nfs = c
                .chain
                .vertices
                .iter()
                .enumerate()
                .filter(|(vi, _)| c.chain.edges.iter().any(|e| e.to == Some(*vi) && !e.mirror))
                .count()
                .max(1);
            ModeResult {
                name: c.name.clone(),
                nf: c.nf.to_string(),
                mode: c.mode,
                store: c.store,
                load: c.load,
                window: if c.load == Load::Paced { paced_window } else { a.window },
                packets: c.packets,
                on_path_nfs,
                summary: ModeSummary {
                    mpps: s(|x| x.mpps),
                    p5_us: s(|x| x.p5_us),
                    p25_us: s(|x| x.p25_us),
                    p50_us: s(|x| x.p50_us),
                    p75_us: s(|x| x.p75_us),
                    p95_us: s(|x| x.p95_us),
                    p99_us: s(|x| x.p99_us),
                    on_path_busy_ns: s(|x| x.on_path_busy_ns),
                    vertex_busy_mpps,
                },
                mpps_ratio_to_local: None,
                mpps_ratio_to_async: None,
                added_p50_us: None,
                added_p50_us_per_nf: None,
                added_busy_ns_per_nf: None,
                repeats,
            }
        })
        .collect();
    let locals: Vec<(String, Load, f64, f64, f64)> = out
        .iter()
        .filter(|r| r.mode == ModeKind::Local)
        .map(|r| {
            (r.nf.clone(), r.load, r.summary.mpps.median, r.summary.p50_us.median, r.summary.on_path_busy_ns.median)
        })
        .collect();
    let asyncs: Vec<(String, StoreKind, Load, Vec<f64>)> = out
        .iter()
        .filter(|r| r.mode == ModeKind::Async)
        .map(|r| (r.nf.clone(), r.store, r.load, r.repeats.iter().map(|x| x.mpps).collect()))
        .collect();
    for r in out.iter_mut().filter(|r| r.mode == ModeKind::AsyncFt) {
        if let Some((_, _, _, off)) = asyncs.iter().find(|x| x.0 == r.nf && x.1 == r.store && x.2 == r.load) {
            // Pair by pair: the cases run interleaved, so a repetition's two runs saw the same
            // machine (a median of medians would mix a quiet run of one with a noisy one of
            // the other).
            let pairs = r.repeats.iter().zip(off).map(|(on, off)| ratio(on.mpps, *off));
            r.mpps_ratio_to_async = Some(Stat::of(pairs).median);
        }
    }
    for r in &mut out {
        if let Some((_, _, mpps, p50, busy)) = locals.iter().find(|l| l.0 == r.nf && l.1 == r.load) {
            let n = r.on_path_nfs as f64;
            r.mpps_ratio_to_local = Some(ratio(r.summary.mpps.median, *mpps));
            let added = r.summary.p50_us.median - p50;
            r.added_p50_us = Some(added);
            r.added_p50_us_per_nf = Some(added / n);
            r.added_busy_ns_per_nf = Some((r.summary.on_path_busy_ns.median - busy) / n);
        }
    }
    out
}

/// The aims, checked on the mode results.
pub(super) fn check_aims(modes: &[ModeResult]) -> Vec<Aim> {
    let mut aims = Vec::new();
    // A case whose baseline was not run (`--cases`) has no ratio, and no aim to check.
    for r in modes.iter().filter(|r| r.mode == ModeKind::AsyncFt && r.load == Load::Saturated) {
        let Some(v) = r.mpps_ratio_to_async else { continue };
        aims.push(Aim {
            aim: "fault tolerance on (root log, XOR check, egress) >= 90% of off (async, embedded store)".into(),
            case: r.name.clone(),
            value: v,
            target: 0.9,
            met: v >= 0.9,
        });
    }
    for r in modes.iter().filter(|r| r.mode == ModeKind::Async) {
        match (r.store, r.load) {
            (StoreKind::Embedded, Load::Saturated) => {
                let Some(v) = r.mpps_ratio_to_local else { continue };
                aims.push(Aim {
                    aim: "async throughput >= 95% of local (embedded store)".into(),
                    case: r.name.clone(),
                    value: v,
                    target: 0.95,
                    met: v >= 0.95,
                });
            }
            (StoreKind::Redis, Load::Saturated) => {
                let Some(v) = r.mpps_ratio_to_local else { continue };
                aims.push(Aim {
                    aim: "async throughput >= 50% of local (Redis)".into(),
                    case: r.name.clone(),
                    value: v,
                    target: 0.5,
                    met: v >= 0.5,
                });
            }
            (StoreKind::Embedded, Load::Paced) => {
                let Some(v) = r.added_p50_us_per_nf else { continue };
                aims.push(Aim {
                    aim: "async median added latency <= 0.5 µs per NF (paced, embedded store)".into(),
                    case: r.name.clone(),
                    value: v,
                    target: 0.5,
                    met: v <= 0.5,
                });
            }
            _ => {}
        }
    }
    aims
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_parse() {
        assert!(mode_chains().is_ok());
    }
}
