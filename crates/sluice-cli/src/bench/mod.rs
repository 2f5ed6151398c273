//! `sluice bench`: throughput and latency of every NF alone and of the example chain, over
//! packets held in memory, in one process so that the ratios between cases are comparable.
//!
//! Each case is a chain (one NF, or the example chain), a packet set (fixed-size generated
//! frames, the generator's `mix` sizes, or a real trace) and a worker count. Packets are
//! generated (or loaded) once; every run compiles a fresh plan (so NF state starts empty) and
//! feeds the packets through a [`MemorySource`] (which copies them into pool buffers, as a NIC
//! would) into a [`DiscardSink`]. Repeats are interleaved (repeat 1 of every case, then repeat 2,
//! ...) so that a noisy moment of the machine spreads over the cases instead of hitting one.
//!
//! Reported per case (median, min and max over the repeats):
//! - **Mpps**: input packets / wall time of [`run`];
//! - **per-core Mpps**: Mpps / cores actually busy (workers + the root thread, capped at the
//!   machine's core count);
//! - **busy Mpps**: input packets / time spent inside the NF instances (summed over every
//!   instance of the chain): the chain's own per-core cost, without the root, sink and idle time;
//! - latency percentiles (root to sink, µs) from [`RunReport::latency_us`].
//!
//! [`common`] (chains, packets, repeats, statistics, output files) and [`machine`] are shared
//! with `sluice bench-store`; [`report`] draws the table and the SVG.

pub(crate) mod common;
pub(crate) mod machine;
mod report;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use common::{
    available_cores, example_chain, generate_packets, repeat_interleaved, single_nf_chain, warn_if_debug_build,
    write_json, write_plot, Stat, NAT_CONFIG, SAMPLE,
};
use machine::{command_line, machine_info, Machine};
use report::{plot, print_table};
use serde::Serialize;
use sluice_io::{FrameSize, GenConfig, Workload};
use sluice_packet::Packet;
use sluice_runtime::report::Latency;
use sluice_runtime::{compile, run, Chain, DiscardSink, MemorySource, Overflow, RunConfig, RunHooks, RunReport};
use std::path::PathBuf;
use std::time::Instant;

/// Packets per generated flow.
const PACKETS_PER_FLOW: u32 = 100;

/// Packets in a `--quick` run.
const QUICK_PACKETS: usize = 2_000;

/// The NFs measured alone, with the configuration each gets.
const SINGLE_NFS: [(&str, &str); 7] = [
    ("passthrough", ""),
    ("nat", NAT_CONFIG),
    ("lb", ""),
    ("firewall", ""),
    ("portscan", ""),
    ("trojan", ""),
    ("ids", ""),
];

/// Aims of the issue: (NF, Mpps per core on 64-byte packets held in memory).
const AIMS: [(&str, f64); 2] = [("passthrough", 20.0), ("nat", 5.0)];

/// Arguments of `sluice bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Packets generated per packet set (flows of 100 packets); also the most read from --trace.
    #[arg(long, default_value_t = 200_000)]
    pub packets: usize,
    /// Runs per case; the median, min and max are reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Worker counts to measure. A single NF gets as many instances as workers; the example
    /// chain keeps its file's instances, spread over the workers. 0: run to completion on the
    /// root thread (one instance per NF, one thread: cases `.../w0`).
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    pub workers: Vec<usize>,
    /// Generated frame sizes: byte counts (64..=1500) and/or `mix` (the generator's trace-like
    /// size distribution).
    #[arg(long, value_delimiter = ',', default_value = "64,mix")]
    pub sizes: Vec<String>,
    /// Also measure a real trace (pcap/pcapng), held in memory, e.g.
    /// ../shared/traces/echo-connections.pcap.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Run only the cases whose name (`chain/size/wN`) contains one of these substrings
    /// (repeatable).
    #[arg(long)]
    pub filter: Vec<String>,
    /// Fast smoke run: 2,000 packets, 1 repeat, no warm-up (overrides --packets and --repeat).
    #[arg(long)]
    pub quick: bool,
    /// Print the case names and exit.
    #[arg(long)]
    pub list: bool,
    /// Write every result (machine, command line, all repeats, medians) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw throughput bars and latency percentiles per case into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Packets per batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Most packets in flight (default: `sluice run`'s for input that waits). A larger window
    /// lets the root run further ahead of a slower worker, whose queued packets then go cold.
    #[arg(long, default_value_t = Overflow::Wait.default_window())]
    pub window: usize,
    /// Do not pin worker threads to cores.
    #[arg(long)]
    pub no_pin: bool,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Where a packet set comes from.
enum InputKind {
    /// The generator, with this frame size.
    Gen(FrameSize),
    /// A trace file.
    Trace(PathBuf),
}

/// A packet set, before it is loaded.
struct InputSpec {
    /// `64B`, `mix`, `trace`, ...
    label: String,
    kind: InputKind,
}

/// A packet set held in memory.
struct Input {
    /// `64B`, `mix`, `trace`, ...
    label: String,
    /// Where it came from.
    origin: String,
    packets: Vec<Packet>,
}

impl Input {
    /// The bytes of all its packets.
    fn bytes(&self) -> u64 {
        self.packets.iter().map(|p| p.len() as u64).sum()
    }

    /// What the JSON says about it.
    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "label": self.label,
            "origin": self.origin,
            "packets": self.packets.len(),
            "bytes": self.bytes(),
        })
    }
}

/// One measured configuration.
struct Case {
    name: String,
    chain_label: String,
    input: usize,
    workers: usize,
    chain: Chain,
}

/// The vertices of one run.
#[derive(Debug, Clone, Serialize)]
struct VertexSample {
    name: String,
    kind: String,
    instances: usize,
    packets_in: u64,
    busy_s: f64,
    /// Packets per second of busy time, summed over the instances (per-core rate), millions.
    busy_mpps: f64,
}

/// One run of one case.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    /// Input packets / wall time of `run`, millions.
    mpps: f64,
    /// `mpps` / cores busy.
    per_core_mpps: f64,
    /// Input packets / time inside all NF instances, millions.
    busy_mpps: f64,
    /// Wall time of `run`, seconds.
    wall_s: f64,
    /// The runtime's own rate (its clock starts after the workers are spawned).
    run_mpps: f64,
    /// Worker threads the runtime used (at most one per instance).
    workers_used: usize,
    /// Threads that had work: workers + root, capped at the core count.
    cores_busy: usize,
    packets_in: u64,
    packets_out: u64,
    dropped: u64,
    latency_us: Latency,
    vertices: Vec<VertexSample>,
}

/// Per-metric statistics of a case.
#[derive(Debug, Clone, Default, Serialize)]
struct Summary {
    mpps: Stat,
    per_core_mpps: Stat,
    busy_mpps: Stat,
    p5_us: Stat,
    p25_us: Stat,
    p50_us: Stat,
    p75_us: Stat,
    p95_us: Stat,
    p99_us: Stat,
    max_us: Stat,
}

impl Summary {
    /// The statistics of a case's repeats.
    fn of(samples: &[Sample]) -> Summary {
        let s = |f: fn(&Sample) -> f64| Stat::of(samples.iter().map(f));
        Summary {
            mpps: s(|x| x.mpps),
            per_core_mpps: s(|x| x.per_core_mpps),
            busy_mpps: s(|x| x.busy_mpps),
            p5_us: s(|x| x.latency_us.p5),
            p25_us: s(|x| x.latency_us.p25),
            p50_us: s(|x| x.latency_us.p50),
            p75_us: s(|x| x.latency_us.p75),
            p95_us: s(|x| x.latency_us.p95),
            p99_us: s(|x| x.latency_us.p99),
            max_us: s(|x| x.latency_us.max),
        }
    }
}

/// A case's results, as written to JSON.
#[derive(Debug, Clone, Serialize)]
struct CaseResult {
    name: String,
    chain: String,
    size: String,
    workers: usize,
    packets: usize,
    bytes: u64,
    summary: Summary,
    repeats: Vec<Sample>,
}

/// Whether an aim is met for one case, by both per-core definitions.
#[derive(Debug, Clone, Serialize)]
struct AimResult {
    case: String,
    aim_mpps_per_core: f64,
    per_core_mpps: f64,
    met_per_core: bool,
    busy_mpps: f64,
    met_busy: bool,
}

/// Everything `--json` writes.
#[derive(Debug, Clone, Serialize)]
struct BenchResult {
    machine: Machine,
    command: String,
    packets: usize,
    repeat: usize,
    batch: usize,
    window: usize,
    pin: bool,
    seed: u64,
    inputs: Vec<serde_json::Value>,
    cases: Vec<CaseResult>,
    aims: Vec<AimResult>,
}

/// Runs `sluice bench`.
pub fn cmd_bench(args: BenchArgs) -> Result<()> {
    let (packets, repeat) = if args.quick { (QUICK_PACKETS, 1) } else { (args.packets, args.repeat) };
    if packets == 0 || repeat == 0 {
        bail!("--packets and --repeat must be positive");
    }
    if args.workers.is_empty() {
        bail!("--workers takes worker counts (0: run to completion on the root thread)");
    }
    warn_if_debug_build("bench", args.quick);
    let nproc = available_cores();

    let specs = input_specs(&args)?;
    let cases = build_cases(&args, &specs)?;
    if args.list {
        for c in &cases {
            println!("{}", c.name);
        }
        return Ok(());
    }
    if cases.is_empty() {
        bail!("no case matches the filter {:?} (see --list)", args.filter);
    }
    // Only the packet sets some selected case uses are generated or loaded.
    let mut inputs: Vec<Option<Input>> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let used = cases.iter().any(|c| c.input == i);
        inputs.push(if used { Some(load_input(spec, packets, args.seed)?) } else { None });
    }

    let samples = measure_cases(&args, &cases, &inputs, repeat, nproc)?;
    let results = case_results(&cases, &inputs, samples);
    let aims = check_aims(&results);
    print_table(&results, &aims, nproc);

    let bench = BenchResult {
        machine: machine_info(nproc),
        command: command_line(),
        packets,
        repeat,
        batch: args.batch,
        window: args.window,
        pin: !args.no_pin,
        seed: args.seed,
        inputs: inputs.iter().flatten().map(Input::describe).collect(),
        cases: results,
        aims,
    };
    if let Some(path) = &args.json {
        write_json(path, &bench)?;
    }
    if let Some(path) = &args.plot {
        write_plot(path, |p| plot(p, &bench))?;
    }
    Ok(())
}

/// Every case `repeat` times, interleaved, after an untimed warm-up run unless `--quick`.
fn measure_cases(
    args: &BenchArgs,
    cases: &[Case],
    inputs: &[Option<Input>],
    repeat: usize,
    nproc: usize,
) -> Result<Vec<Vec<Sample>>> {
    let registry = sluice_nfs::registry();
    let cfg_of = |workers: usize| RunConfig {
        workers,
        pin: !args.no_pin,
        batch: args.batch,
        window: args.window,
        overflow: Overflow::Wait,
        ..RunConfig::default()
    };
    let run_case = |c: &Case| -> Result<Sample> {
        let input = inputs.get(c.input).and_then(Option::as_ref).ok_or_else(|| anyhow!("no input {}", c.input))?;
        measure(c, &input.packets, &cfg_of(c.workers), &registry, nproc).with_context(|| format!("case {}", c.name))
    };
    repeat_interleaved(cases, repeat, !args.quick, run_case, |r, c, s| {
        eprintln!("[{}/{}] {:<28} {:>8.3} Mpps", r, repeat, c.name, s.mpps)
    })
}

/// Each case's repeats with their summary, as written to JSON.
fn case_results(cases: &[Case], inputs: &[Option<Input>], samples: Vec<Vec<Sample>>) -> Vec<CaseResult> {
    cases
        .iter()
        .zip(samples)
        .map(|(c, repeats)| {
            let input = inputs.get(c.input).and_then(Option::as_ref);
            CaseResult {
                name: c.name.clone(),
                chain: c.chain_label.clone(),
                size: input.map(|i| i.label.clone()).unwrap_or_default(),
                workers: c.workers,
                packets: input.map_or(0, |i| i.packets.len()),
                bytes: input.map_or(0, Input::bytes),
                summary: Summary::of(&repeats),
                repeats,
            }
        })
        .collect()
}

/// The packet sets to measure: `--sizes`, then `--trace`.
fn input_specs(args: &BenchArgs) -> Result<Vec<InputSpec>> {
    let mut specs: Vec<InputSpec> = Vec::new();
    for s in &args.sizes {
        let size: FrameSize = s.parse().map_err(|e| anyhow!("--sizes: {e}"))?;
        let label = match size {
            FrameSize::Mix => "mix".to_string(),
            FrameSize::Fixed(n) => format!("{n}B"),
        };
        if !specs.iter().any(|i| i.label == label) {
            specs.push(InputSpec { label, kind: InputKind::Gen(size) });
        }
    }
    if let Some(path) = &args.trace {
        specs.push(InputSpec { label: "trace".into(), kind: InputKind::Trace(path.clone()) });
    }
    Ok(specs)
}

/// Generates (or loads) one packet set, once: `packets` generated packets in flows of 100, or
/// at most `packets` packets of the trace.
fn load_input(spec: &InputSpec, packets: usize, seed: u64) -> Result<Input> {
    let label = spec.label.clone();
    match &spec.kind {
        InputKind::Gen(size) => {
            let flows = (packets as u64).div_ceil(u64::from(PACKETS_PER_FLOW)).max(1);
            let workload = Workload::Custom { flows, packets_per_flow: PACKETS_PER_FLOW };
            let cfg = GenConfig { size: *size, ..GenConfig::new(workload, seed) };
            let pkts = generate_packets(&cfg).map_err(|e| anyhow!("--sizes {label}: {e}"))?;
            let origin = format!("generated: {workload} flows x packets, size {label}, seed {seed}");
            Ok(Input { label, origin, packets: pkts })
        }
        InputKind::Trace(path) => {
            let pkts = sluice_io::load(path, Some(packets)).with_context(|| format!("reading {}", path.display()))?;
            if pkts.is_empty() {
                bail!("{} holds no packets", path.display());
            }
            Ok(Input { label, origin: path.display().to_string(), packets: pkts })
        }
    }
}

/// Every case, in report order, filtered.
fn build_cases(args: &BenchArgs, inputs: &[InputSpec]) -> Result<Vec<Case>> {
    let mut chains: Vec<(String, Vec<(usize, Chain)>)> = Vec::new();
    for (kind, config) in SINGLE_NFS {
        let mut per_workers = Vec::new();
        for &w in &args.workers {
            let instances = w.max(1);
            per_workers.push((w, single_nf_chain(kind, config, instances, &format!("<bench {kind} x{w}>"))?));
        }
        chains.push((kind.to_string(), per_workers));
    }
    let example = example_chain()?;
    chains.push(("example".into(), args.workers.iter().map(|&w| (w, example.clone())).collect()));

    let mut cases = Vec::new();
    for (label, per_workers) in chains {
        for (ii, input) in inputs.iter().enumerate() {
            for (w, chain) in &per_workers {
                let name = format!("{label}/{}/w{w}", input.label);
                if !args.filter.is_empty() && !args.filter.iter().any(|f| name.contains(f.as_str())) {
                    continue;
                }
                cases.push(Case { name, chain_label: label.clone(), input: ii, workers: *w, chain: chain.clone() });
            }
        }
    }
    Ok(cases)
}

/// One run of `case` over `packets`: a fresh plan, memory in, discard out.
fn measure(
    case: &Case,
    packets: &[Packet],
    cfg: &RunConfig,
    registry: &sluice_nf::NfRegistry,
    nproc: usize,
) -> Result<Sample> {
    let sample = &packets[..packets.len().min(SAMPLE)];
    let plan = compile(&case.chain, registry, sample).map_err(|e| anyhow!("compiling {}: {e}", case.name))?;
    let mut source = MemorySource::new(packets);
    let mut sink = DiscardSink;
    let t = Instant::now();
    let report = run(plan, cfg, &mut source, &mut sink, RunHooks::default())?;
    let wall_s = t.elapsed().as_secs_f64();
    Ok(sample_of(&report, wall_s, nproc))
}

/// The numbers of one run.
fn sample_of(report: &RunReport, wall_s: f64, nproc: usize) -> Sample {
    let mpps = common::mpps(report.packets_in, wall_s);
    let cores_busy = (report.workers + 1).min(nproc).max(1);
    let vertices: Vec<VertexSample> = report
        .vertices
        .iter()
        .map(|v| {
            let busy_s: f64 = v.instances.iter().map(|i| i.busy_s).sum();
            let packets_in = v.packets_in();
            VertexSample {
                name: v.name.clone(),
                kind: v.kind.clone(),
                instances: v.instances.len(),
                packets_in,
                busy_s,
                busy_mpps: common::mpps(packets_in, busy_s),
            }
        })
        .collect();
    let busy_total: f64 = vertices.iter().map(|v| v.busy_s).sum();
    Sample {
        mpps,
        per_core_mpps: mpps / cores_busy as f64,
        busy_mpps: common::mpps(report.packets_in, busy_total),
        wall_s,
        run_mpps: report.mpps,
        workers_used: report.workers,
        cores_busy,
        packets_in: report.packets_in,
        packets_out: report.packets_out,
        dropped: report.dropped_total,
        latency_us: report.latency_us.clone(),
        vertices,
    }
}

/// The aims, checked on every measured 64-byte case of their NF.
fn check_aims(results: &[CaseResult]) -> Vec<AimResult> {
    let mut out = Vec::new();
    for (nf, aim) in AIMS {
        for r in results.iter().filter(|r| r.chain == nf && r.size == "64B") {
            let per_core = r.summary.per_core_mpps.median;
            let busy = r.summary.busy_mpps.median;
            out.push(AimResult {
                case: r.name.clone(),
                aim_mpps_per_core: aim,
                per_core_mpps: per_core,
                met_per_core: per_core >= aim,
                busy_mpps: busy,
                met_busy: busy >= aim,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_nf_chains_parse() {
        for (kind, config) in SINGLE_NFS {
            let chain = single_nf_chain(kind, config, 2, "<test>");
            assert!(chain.is_ok(), "{kind}: {chain:?}");
        }
    }
}
