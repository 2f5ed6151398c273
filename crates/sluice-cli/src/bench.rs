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

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use plotters::prelude::*;
use serde::Serialize;
use sluice_io::{FrameSize, GenConfig, Workload};
use sluice_packet::{Meta, Packet};
use sluice_runtime::report::Latency;
use sluice_runtime::{compile, run, Chain, DiscardSink, MemorySource, Overflow, RunConfig, RunHooks, RunReport};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The example chain (NAT → portscan → LB, Trojan detector off-path).
const EXAMPLE_CHAIN: &str = include_str!("../../../chains/example.yaml");

/// Packets per generated flow.
const PACKETS_PER_FLOW: u32 = 100;

/// Packets in a `--quick` run.
const QUICK_PACKETS: usize = 2_000;

/// Prefix of the input given to the compiler to check that splits spread the load.
const SAMPLE: usize = 4_096;

/// The NFs measured alone, with the configuration each gets.
const SINGLE_NFS: [(&str, &str); 7] = [
    ("passthrough", ""),
    ("nat", "internal: [\"10.0.0.0/8\"]"),
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
    /// chain keeps its file's instances, spread over the workers.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
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
    /// Most packets in flight.
    #[arg(long, default_value_t = 65_536)]
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

/// Median, min and max of one metric over the repeats.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

impl Stat {
    fn of(values: impl Iterator<Item = f64>) -> Stat {
        let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Stat::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Stat { median, min: v[0], max: v[n - 1] }
    }
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

/// Where the numbers were taken.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub(crate) nproc: usize,
    pub(crate) cpu_model: String,
    pub(crate) kernel: String,
    pub(crate) os: String,
    pub(crate) arch: String,
    pub(crate) rustc: Option<String>,
    pub(crate) build_profile: String,
    pub(crate) git_commit: Option<String>,
    pub(crate) git_dirty: Option<bool>,
    pub(crate) date_utc: String,
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
    if args.workers.is_empty() || args.workers.contains(&0) {
        bail!("--workers takes positive worker counts");
    }
    if cfg!(debug_assertions) && !args.quick {
        eprintln!("sluice bench: warning: this is a debug build; use `cargo run --release` for real numbers");
    }
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());

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
        measure(c, &input.packets, &cfg_of(c.workers), &registry, nproc)
    };

    // One untimed run warms the allocator and the caches of the code paths.
    if !args.quick {
        if let Some(first) = cases.first() {
            run_case(first)?;
        }
    }
    let mut samples: Vec<Vec<Sample>> = cases.iter().map(|_| Vec::with_capacity(repeat)).collect();
    for r in 0..repeat {
        for (c, out) in cases.iter().zip(samples.iter_mut()) {
            let s = run_case(c).with_context(|| format!("case {}", c.name))?;
            eprintln!("[{}/{}] {:<28} {:>8.3} Mpps", r + 1, repeat, c.name, s.mpps);
            out.push(s);
        }
    }

    let results: Vec<CaseResult> = cases
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
                bytes: input.map_or(0, |i| i.packets.iter().map(|p| p.len() as u64).sum()),
                summary: Summary::of(&repeats),
                repeats,
            }
        })
        .collect();
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
        inputs: inputs
            .iter()
            .flatten()
            .map(|i| {
                serde_json::json!({
                    "label": i.label,
                    "origin": i.origin,
                    "packets": i.packets.len(),
                    "bytes": i.packets.iter().map(|p| p.len() as u64).sum::<u64>(),
                })
            })
            .collect(),
        cases: results,
        aims,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&bench).context("serialising the results")?;
        write_file(path, &(text + "\n"))?;
        println!("results written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        plot(path, &bench).with_context(|| format!("drawing {}", path.display()))?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

/// Writes `text` to `path`, creating its directory.
fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
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
            let gen = sluice_io::generate(&cfg).map_err(|e| anyhow!("--sizes {label}: {e}"))?;
            let pkts: Vec<Packet> =
                gen.map(|(ts_ns, frame)| Packet::from_slice(&frame, Meta { ts_ns, ..Meta::default() })).collect();
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

/// A chain of one NF between input and output, with `instances` instances.
fn single_nf_chain(kind: &str, config: &str, instances: usize) -> String {
    let config = if config.is_empty() { String::new() } else { format!("    config: {{ {config} }}\n") };
    format!(
        "name: {kind}\nvertices:\n  {kind}:\n    type: {kind}\n    instances: {instances}\n{config}edges:\n  \
         - {{ from: input, to: {kind} }}\n  - {{ from: {kind}, to: output }}\n"
    )
}

/// Every case, in report order, filtered.
fn build_cases(args: &BenchArgs, inputs: &[InputSpec]) -> Result<Vec<Case>> {
    let mut chains: Vec<(String, Vec<(usize, Chain)>)> = Vec::new();
    for (kind, config) in SINGLE_NFS {
        let mut per_workers = Vec::new();
        for &w in &args.workers {
            let text = single_nf_chain(kind, config, w);
            let source = PathBuf::from(format!("<bench {kind} x{w}>"));
            let chain = Chain::parse(&text, &source).map_err(|e| anyhow!("{e}"))?;
            per_workers.push((w, chain));
        }
        chains.push((kind.to_string(), per_workers));
    }
    let example = Chain::parse(EXAMPLE_CHAIN, Path::new("chains/example.yaml")).map_err(|e| anyhow!("{e}"))?;
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
    let mpps = if wall_s > 0.0 { report.packets_in as f64 / wall_s / 1e6 } else { 0.0 };
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
                busy_mpps: if busy_s > 0.0 { packets_in as f64 / busy_s / 1e6 } else { 0.0 },
            }
        })
        .collect();
    let busy_total: f64 = vertices.iter().map(|v| v.busy_s).sum();
    Sample {
        mpps,
        per_core_mpps: mpps / cores_busy as f64,
        busy_mpps: if busy_total > 0.0 { report.packets_in as f64 / busy_total / 1e6 } else { 0.0 },
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

/// The human-readable report.
fn print_table(results: &[CaseResult], aims: &[AimResult], nproc: usize) {
    println!(
        "{:<24} {:>8} {:>17} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "case", "Mpps", "(min..max)", "Mpps/core", "busy Mpps", "p5 µs", "p50 µs", "p95 µs", "p99 µs"
    );
    for r in results {
        let s = &r.summary;
        println!(
            "{:<24} {:>8.3} {:>17} {:>9.3} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            r.name,
            s.mpps.median,
            format!("({:.3}..{:.3})", s.mpps.min, s.mpps.max),
            s.per_core_mpps.median,
            s.busy_mpps.median,
            s.p5_us.median,
            s.p50_us.median,
            s.p95_us.median,
            s.p99_us.median,
        );
    }
    println!(
        "Mpps: input packets / wall time of the run (median of the repeats). Mpps/core: Mpps / busy cores \
         (workers + root, at most {nproc}). busy Mpps: input packets / time inside the NF instances."
    );
    if aims.is_empty() {
        return;
    }
    println!("aims (64-byte packets held in memory):");
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    for a in aims {
        println!(
            "  {:<24} aim {:>5.1} Mpps/core: wall-clock per core {:>7.3} -> {:<8} NF busy time {:>7.3} -> {}",
            a.case,
            a.aim_mpps_per_core,
            a.per_core_mpps,
            verdict(a.met_per_core),
            a.busy_mpps,
            verdict(a.met_busy)
        );
    }
}

/// CPU, kernel, toolchain, commit and date.
pub(crate) fn machine_info(nproc: usize) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name") || l.starts_with("Model") || l.starts_with("cpu model"))
        .and_then(|l| l.split_once(':'))
        .map_or_else(|| "unknown".to_string(), |(_, v)| v.trim().to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_string(), |s| s.trim().to_string());
    let cmd = |prog: &str, args: &[&str]| -> Option<String> {
        let out = std::process::Command::new(prog).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    Machine {
        nproc,
        cpu_model,
        kernel,
        os: std::env::consts::OS.to_string(),
        arch: std::env::consts::ARCH.to_string(),
        rustc: cmd("rustc", &["--version"]),
        build_profile: if cfg!(debug_assertions) { "debug" } else { "release" }.to_string(),
        git_commit: cmd("git", &["rev-parse", "HEAD"]),
        git_dirty: cmd("git", &["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty()),
        date_utc: utc_now(),
    }
}

/// The command line, shell-quoted where needed.
pub(crate) fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c)) {
                a
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3_600, rem % 3_600 / 60, rem % 60)
}

/// Colour of a case's bar by packet set.
fn size_colour(size: &str) -> RGBColor {
    match size {
        "64B" => RGBColor(31, 119, 180),
        "mix" => RGBColor(255, 127, 14),
        "trace" => RGBColor(44, 160, 44),
        _ => RGBColor(148, 103, 189),
    }
}

/// Draws the SVG: throughput bars (median, whiskers min..max) on the left, latency percentiles
/// on a log scale on the right (line p5..p99, box p25..p75, dot p50, tick p95), one row per case.
fn plot(path: &Path, bench: &BenchResult) -> Result<()> {
    let cases = &bench.cases;
    let n = cases.len().max(1);
    let row = 20u32;
    let height = 140 + row * n as u32;
    let base = SVGBackend::new(path, (1400, height)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("{e}");
    base.fill(&WHITE).map_err(|x| e(&x))?;
    let title = format!(
        "sluice bench: {} packets in memory, median of {} ({}; {} cores). Blue 64 B, orange mix, green trace; \
         pale: 2+ workers",
        bench.packets, bench.repeat, bench.machine.cpu_model, bench.machine.nproc
    );
    let root = base.titled(&title, ("sans-serif", 18)).map_err(|x| e(&x))?;
    let (left, right) = root.split_horizontally(760);
    let y_range = 0f64..n as f64;

    // Throughput.
    let max_mpps = cases.iter().map(|c| c.summary.mpps.max.max(c.summary.busy_mpps.median)).fold(0.0f64, f64::max);
    let x_max = if max_mpps > 0.0 { max_mpps * 1.1 } else { 1.0 };
    let mut chart = ChartBuilder::on(&left)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(190)
        .caption("throughput, Mpps (bar: wall clock; line: min..max; cross: NF busy-time rate)", ("sans-serif", 13))
        .build_cartesian_2d(0f64..x_max, y_range.clone())
        .map_err(|x| e(&x))?;
    chart.configure_mesh().disable_y_mesh().y_labels(0).x_desc("Mpps").draw().map_err(|x| e(&x))?;
    for (i, c) in cases.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let s = &c.summary;
        let colour = size_colour(&c.size);
        let style = if c.workers > 1 { colour.mix(0.55).filled() } else { colour.filled() };
        chart
            .draw_series(std::iter::once(Rectangle::new([(0.0, y + 0.15), (s.mpps.median, y + 0.85)], style)))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(s.mpps.min, y + 0.5), (s.mpps.max, y + 0.5)],
                BLACK.stroke_width(1),
            )))
            .map_err(|x| e(&x))?;
        let busy = s.busy_mpps.median.min(x_max);
        chart.draw_series(std::iter::once(Cross::new((busy, y + 0.5), 4, RED.stroke_width(2)))).map_err(|x| e(&x))?;
        // Backend coordinates are absolute, so the label goes on the whole (untitled) area.
        let (px, py) = chart.backend_coord(&(0.0, y + 0.5));
        let label = Text::new(c.name.clone(), (px - 185, py - 6), ("monospace", 12).into_font());
        base.draw(&label).map_err(|x| e(&x))?;
    }

    // Latency.
    let lo = cases.iter().map(|c| c.summary.p5_us.median).filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
    let hi = cases.iter().map(|c| c.summary.p99_us.median).fold(0.0f64, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo / 1.5, hi * 1.5) } else { (0.1, 10.0) };
    let mut lat = ChartBuilder::on(&right)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(10)
        .caption("latency µs, log scale (line p5..p99, box p25..p75, dot p50, tick p95)", ("sans-serif", 13))
        .build_cartesian_2d((lo..hi).log_scale(), y_range)
        .map_err(|x| e(&x))?;
    lat.configure_mesh().disable_y_mesh().y_labels(0).x_desc("µs (root to sink)").draw().map_err(|x| e(&x))?;
    for (i, c) in cases.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let s = &c.summary;
        let clamp = |v: f64| v.clamp(lo, hi);
        let colour = size_colour(&c.size);
        lat.draw_series(std::iter::once(PathElement::new(
            vec![(clamp(s.p5_us.median), y + 0.5), (clamp(s.p99_us.median), y + 0.5)],
            colour.stroke_width(1),
        )))
        .map_err(|x| e(&x))?;
        lat.draw_series(std::iter::once(Rectangle::new(
            [(clamp(s.p25_us.median), y + 0.25), (clamp(s.p75_us.median), y + 0.75)],
            colour.mix(0.5).filled(),
        )))
        .map_err(|x| e(&x))?;
        lat.draw_series(std::iter::once(PathElement::new(
            vec![(clamp(s.p95_us.median), y + 0.2), (clamp(s.p95_us.median), y + 0.8)],
            BLACK.stroke_width(1),
        )))
        .map_err(|x| e(&x))?;
        lat.draw_series(std::iter::once(Circle::new((clamp(s.p50_us.median), y + 0.5), 3, BLACK.filled())))
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_median_of_odd_and_even_counts() {
        let s = Stat::of([3.0, 1.0, 2.0].into_iter());
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Stat::of([4.0, 1.0, 2.0, 3.0].into_iter());
        assert_eq!(s.median, 2.5);
        assert_eq!(Stat::of(std::iter::empty()).median, 0.0);
    }

    #[test]
    fn single_nf_chains_parse() {
        for (kind, config) in SINGLE_NFS {
            let text = single_nf_chain(kind, config, 2);
            let chain = Chain::parse(&text, Path::new("<test>"));
            assert!(chain.is_ok(), "{kind}: {chain:?}\n{text}");
        }
    }

    #[test]
    fn utc_date_is_well_formed() {
        let d = utc_now();
        assert_eq!(d.len(), 20, "{d}");
        assert!(d.starts_with("20") && d.ends_with('Z'), "{d}");
    }
}
