//! `sluice`: run chains of stateful network functions over traces, generated traffic or live
//! interfaces; generate and inspect traces; validate chain files; benchmark.

mod bench;
mod bench_store;
mod bridge;
mod cluster;
mod control;
mod embark;
mod embark_bench;
mod fuzz;
mod geneve_ports;
mod node_cmd;
mod node_host;
mod ports;
mod record;
mod run_cmd;
mod run_faults;
mod send_cmd;
mod store_cmd;
mod verify;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_io::{FrameSize, GenConfig, Pace, Precision, Workload};
use sluice_runtime::{compile, Chain, Overflow, RunConfig, StateConfig};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit codes scripts can rely on.
mod exit {
    /// Success (for `validate`: the chain is valid).
    pub const OK: u8 = 0;
    /// The run failed (I/O error while running, worker failure).
    pub const FAILED: u8 = 1;
    /// Bad command line, invalid chain file or NF configuration.
    pub const INVALID: u8 = 2;
    /// An input trace could not be read or is corrupt.
    pub const BAD_INPUT: u8 = 3;
}

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Run chains of stateful network functions that scale out, survive failures and stay correct",
    after_help = "Exit codes: 0 success; 1 run failed; 2 bad command line, chain file or NF config; 3 unreadable or corrupt input trace; 4 (verify) the runs are not equivalent.\nLogs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) and --log-format json for structured logs."
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a chain over a trace, generated traffic or live interfaces and print a report.
    Run(Box<run_cmd::RunArgs>),
    /// Generate a synthetic TCP trace (StatelessNF workloads) as pcap.
    Gen(GenArgs),
    /// Send a trace or generated traffic out of a live interface, as fast as it goes or at a
    /// fixed rate, looping for a duration: a load generator for bridges (needs root).
    Send(send_cmd::SendArgs),
    /// Summarise a pcap/pcapng trace: packets, flows, protocols, duration.
    Inspect(InspectArgs),
    /// Check a chain file; errors name the file, line and field.
    Validate(ValidateArgs),
    /// List the NF types that chain files can use.
    Nfs,
    /// Benchmark every NF alone and the example chain over packets held in memory: Mpps,
    /// per-core Mpps, latency percentiles; JSON and SVG output.
    Bench(bench::BenchArgs),
    /// Benchmark externalised state: NAT, LB and the example chain in the local, external,
    /// cached and async modes (embedded store and Redis), offloaded operations vs lock-RMW,
    /// store operations per second next to redis-benchmark, an instance failover and a flow
    /// move under open-loop load, open-loop latency (p50, p99, p99.9) at fractions of each
    /// chain's peak; ratios to local, JSON and SVG.
    BenchStore(bench_store::BenchStoreArgs),
    /// Check chain output equivalence: run the logical chain and the physical chain under a
    /// fault schedule (crashes, scaling, flow moves, stragglers) and compare outputs,
    /// decisions and final state. Exit 0 if and only if they are equivalent.
    Verify(verify::VerifyArgs),
    /// NFs over encrypted traffic (Embark): keygen, encrypt-rules, gateway, run, bench.
    Embark(embark::EmbarkArgs),
    /// Run many random fault schedules with random run options (roots, log place,
    /// asynchronous delete, checkpoints) over chains and traces, check each like `verify`,
    /// group the failures by symptom and shrink them to minimal regression files. Exit 0 if
    /// and only if every run is equivalent.
    Fuzz(fuzz::FuzzArgs),
    /// Look at a running chain through its control endpoint (`sluice run --control`): its
    /// vertices and instances with live statistics, or its Prometheus metrics; or at a cluster
    /// through its controller's (`sluice controller --control`): nodes, drain, undrain, crash
    /// drills, and the live view, scale, move and clone of a hosted run.
    Ctl(control::CtlArgs),
    /// Place a chain's roots and NF instances on the live nodes of a cluster (etcd): campaign
    /// for leadership, then keep the assignments in step as nodes join, leave or die.
    Controller(cluster::ControllerArgs),
    /// Join a cluster (etcd) as a node: register under a lease kept alive, follow this node's
    /// assignment and print each change as a JSON line; with --run, host this node's part of
    /// the chain once the placement settles (docs/deploy.md).
    Node(node_cmd::NodeArgs),
    /// A cluster's state in etcd: status (leader, nodes, units), drain or undrain a node, crash
    /// a node, an instance or the root as a drill, scale, move or clone in the hosted run.
    Cluster(cluster::ClusterCmdArgs),
    /// Serve a state store to the NF instances of other processes (`store serve`).
    Store(store_cmd::StoreArgs),
}

#[derive(Args, Clone)]
struct EngineArgs {
    /// Worker threads (default: one per core). 0: no worker threads, the root thread runs the
    /// instances itself between batches (run to completion, as Click does: the most packets
    /// per CPU second; for plain runs, without fault tolerance, faults, scaling, several
    /// roots or a control endpoint).
    #[arg(long, short)]
    workers: Option<usize>,
    /// Packets per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Roots (1 to 8), each on its own thread with its own clocks and, with
    /// --fault-tolerance, its own log; the input is split over them by source address. Every
    /// fault and change of --faults, vertex managers and --control work with several: a change
    /// of flow allocation takes effect at an entry time, whatever the root.
    #[arg(long, default_value_t = 1)]
    roots: u8,
    /// Most packets in flight in the chain. Default: 4,096 when input waits for room (files,
    /// the generator), 65,536 when it is dropped (live interfaces), which absorbs bursts.
    #[arg(long)]
    window: Option<usize>,
    /// When the window is full: wait (no loss; default for files) or drop (live traffic).
    #[arg(long, value_enum)]
    overflow: Option<OverflowArg>,
    /// Do not pin worker threads to cores.
    #[arg(long)]
    no_pin: bool,
    /// Where NF state lives: local (in each instance), or in the store with external (every
    /// operation waited for), cached (+ caching by scope and access pattern) or async
    /// (+ updates not waited for). Default: the chain file's `state.mode`, else async.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// The state store: `embedded` (in this process), `redis://host:port` or
    /// `redis+cluster://host:port,host:port,...` (`?prefix=P&buckets=N` optional; Redis >= 7),
    /// or `sluice://host:port[?token=T]` (an embedded store another process serves with
    /// `sluice store serve`). Default: the chain file's `state.store`, else embedded.
    #[arg(long)]
    store: Option<String>,
    /// Empty the store before the run (what an earlier run left in it, under this URL's
    /// `space=` or `prefix=`). Without it, a store that holds another run's state is refused:
    /// a run numbers its packets from 1, and the store would take them for replays of that
    /// run's.
    #[arg(long)]
    fresh_store: bool,
    /// Threads of the embedded store.
    #[arg(long, default_value_t = 1)]
    store_threads: usize,
    /// Checkpoint the state store this often, in milliseconds (0: not periodically), in a run
    /// that may lose its store (`crash_store` faults, or `--fault-tolerance` with `--control`,
    /// where `sluice ctl crash-store` may ask for it): the chain holds still for each, so that
    /// the instances' write-ahead logs agree with it, and such a run checkpoints whatever this
    /// says as it starts, when a write-ahead log is half full and when an instance's log is
    /// lost. Checkpoints that take long are spaced out to at most a tenth of the run's time.
    /// Other runs take none: nothing would rebuild their store from one.
    #[arg(long, default_value_t = 150)]
    checkpoint_ms: u64,
    /// Keep CHC's packet log at the root: each packet stays logged until every copy is done
    /// and the store acknowledged its updates (XOR check); copies of a clock that already
    /// left are dropped at the egress. The report gains a `root log` line.
    #[arg(long)]
    fault_tolerance: bool,
    /// With --fault-tolerance: where the root keeps its packet log. `store` writes every
    /// packet to the state store, acknowledged, before it enters the chain, so a root crash
    /// (`crash_root` in --faults) loses no entry: the new root reads the log back.
    #[arg(long, value_enum, default_value = "root")]
    log: verify::LogArg,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Local,
    External,
    Cached,
    Async,
}

/// The state configuration asked for: the command line's flags, else the chain file's
/// `state:` section, else async mode on the embedded store.
fn state_config(e: &EngineArgs, chain: &Chain) -> Result<StateConfig, Failure> {
    let from_file = match chain.state.mode.as_deref() {
        Some("local") => Some(ModeArg::Local),
        Some("external") => Some(ModeArg::External),
        Some("cached") => Some(ModeArg::Cached),
        Some("async") => Some(ModeArg::Async),
        _ => None,
    };
    let mode = match e.mode.or(from_file).unwrap_or(ModeArg::Async) {
        ModeArg::Local => return Ok(StateConfig::Local),
        ModeArg::External => sluice_store::Mode::External,
        ModeArg::Cached => sluice_store::Mode::Cached,
        ModeArg::Async => sluice_store::Mode::Async,
    };
    let store = e.store.clone().or_else(|| chain.state.store.clone()).unwrap_or_else(|| "embedded".to_string());
    let backend = store_cmd::open_store(&store, e.store_threads)?;
    Ok(StateConfig::Store { backend, client: sluice_store::ClientConfig { mode, ..Default::default() } })
}

/// The state configuration of a threaded run: with the root's log (`--fault-tolerance`),
/// instances keep what a replay needs ([`StateConfig::fault_tolerant`]), and in a chain
/// spread over nodes also mark the packets they process without updates
/// ([`StateConfig::across_nodes`]); without it and without a control endpoint (which could
/// clone a straggler), no packet is processed twice and updates travel untagged
/// ([`StateConfig::without_duplicates`]).
fn state_for_run(state: StateConfig, cfg: &sluice_runtime::RunConfig, live_control: bool) -> StateConfig {
    match (cfg.fault_tolerance, live_control) {
        (true, _) if cfg.part.is_some() => state.fault_tolerant().across_nodes(),
        (true, _) => state.fault_tolerant(),
        (false, false) => state.without_duplicates(),
        (false, true) => state,
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum OverflowArg {
    Wait,
    Drop,
}

#[derive(Args)]
struct GenArgs {
    /// Workload: long (3,000 flows x 10,000 packets), short (100,000 x 100), mixed, demo (background
    /// traffic with a planted port scan and Trojan signature), or FLOWSxPACKETS.
    #[arg(long, short, default_value = "short")]
    workload: String,
    /// Scale factor applied to the number of flows.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Frame size: mix (64..1500, bimodal) or a byte count.
    #[arg(long, default_value = "mix")]
    size: String,
    /// Seed; the same seed gives the same bytes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output pcap file.
    #[arg(long, short)]
    output: PathBuf,
    /// Do not show a progress bar.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args)]
struct InspectArgs {
    /// The trace.
    trace: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ValidateArgs {
    /// The chain file.
    chain: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// An error with the exit code it maps to.
struct Failure {
    code: u8,
    error: anyhow::Error,
}

fn fail(code: u8) -> impl FnOnce(anyhow::Error) -> Failure {
    move |error| Failure { code, error }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Failure {
        Failure { code: exit::FAILED, error }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let r = match cli.command {
        Command::Run(a) => run_cmd::cmd_run(*a),
        Command::Ctl(a) => control::cmd_ctl(a),
        Command::Controller(a) => cluster::cmd_controller(a),
        Command::Node(a) => node_cmd::cmd_node(a),
        Command::Cluster(a) => cluster::cmd_cluster(a),
        Command::Store(a) => store_cmd::cmd_store(a),
        Command::Gen(a) => cmd_gen(a),
        Command::Send(a) => send_cmd::cmd_send(a),
        Command::Inspect(a) => cmd_inspect(a),
        Command::Validate(a) => cmd_validate(a),
        Command::Bench(a) => bench::cmd_bench(a).map_err(fail(exit::FAILED)),
        Command::BenchStore(a) => bench_store::cmd_bench_store(a).map_err(fail(exit::FAILED)),
        Command::Verify(a) => verify::cmd_verify(a),
        Command::Embark(a) => match embark::cmd(a) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(4),
            Err(e) => Err(fail(exit::FAILED)(e)),
        },
        Command::Fuzz(a) => fuzz::cmd_fuzz(a),
        Command::Nfs => {
            for (name, about) in sluice_nfs::registry().types() {
                println!("{name:<12} {about}");
            }
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::from(exit::OK),
        Err(f) => {
            eprintln!("sluice: error: {:#}", f.error);
            ExitCode::from(f.code)
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => b.try_init(),
        LogFormat::Json => b.json().try_init(),
    };
}

fn load_chain(path: &Path) -> Result<Chain, Failure> {
    Chain::load(path).map_err(|e| Failure { code: exit::INVALID, error: anyhow::anyhow!("{e}") })
}

fn progress_bar(quiet: bool, total: Option<u64>) -> Option<ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = match total {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} packets ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {pos} packets ({per_sec})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        ),
    };
    Some(pb)
}

fn engine_config(e: &EngineArgs, live: bool) -> RunConfig {
    let d = RunConfig::default();
    let overflow = match e.overflow {
        Some(OverflowArg::Wait) => Overflow::Wait,
        Some(OverflowArg::Drop) => Overflow::Drop,
        None if live => Overflow::Drop,
        None => Overflow::Wait,
    };
    RunConfig {
        workers: e.workers.unwrap_or(d.workers),
        pin: !e.no_pin,
        batch: e.batch,
        roots: e.roots,
        window: e.window.unwrap_or_else(|| overflow.default_window()),
        overflow,
        fault_tolerance: e.fault_tolerance,
        log_in_store: e.log == verify::LogArg::Store,
        checkpoint_every: (e.checkpoint_ms > 0).then(|| std::time::Duration::from_millis(e.checkpoint_ms)),
        record: false,
        planned: Vec::new(),
        scalable: false,
        policies: Vec::new(),
        latency_timeline: None,
        part: None,
        claim: None,
    }
}

fn parse_pace(s: &str) -> Result<Pace, Failure> {
    if s == "full" {
        return Ok(Pace::FullSpeed);
    }
    match s.trim_end_matches('x').parse::<f64>() {
        Ok(speed) if speed.is_finite() && speed > 0.0 => Ok(Pace::Recorded { speed }),
        _ => Err(fail(exit::INVALID)(anyhow::anyhow!("--pace takes `full` or a positive speed factor, not `{s}`"))),
    }
}

fn gen_config(workload: &str, scale: f64, size: &str, seed: u64) -> Result<GenConfig, Failure> {
    let invalid = fail(exit::INVALID);
    let workload: Workload = workload.parse().map_err(|e| invalid(anyhow::Error::new(e)))?;
    let size: FrameSize = size.parse().map_err(|e| fail(exit::INVALID)(anyhow::Error::new(e)))?;
    let cfg = GenConfig { scale, size, ..GenConfig::new(workload, seed) };
    cfg.validate().map_err(|e| fail(exit::INVALID)(anyhow::Error::new(e)))?;
    Ok(cfg)
}

fn cmd_gen(a: GenArgs) -> Result<(), Failure> {
    let cfg = gen_config(&a.workload, a.scale, &a.size, a.seed)?;
    let total = cfg.total_packets();
    let gen = sluice_io::generate(&cfg).map_err(|e| fail(exit::INVALID)(e.into()))?;
    let mut w = sluice_io::TraceWriter::create(&a.output, Precision::Nano)
        .with_context(|| format!("creating {}", a.output.display()))?;
    let pb = progress_bar(a.quiet, Some(total));
    let mut n = 0u64;
    for (ts, frame) in gen {
        w.write(ts, &frame).with_context(|| format!("writing {}", a.output.display()))?;
        n += 1;
        if n.is_multiple_of(65_536) {
            if let Some(pb) = &pb {
                pb.set_position(n);
            }
        }
    }
    w.finish().with_context(|| format!("writing {}", a.output.display()))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    println!(
        "wrote {n} packets ({} flows, workload {}, seed {}) to {}",
        cfg.total_flows(),
        cfg.workload,
        cfg.seed,
        a.output.display()
    );
    Ok(())
}

fn cmd_inspect(a: InspectArgs) -> Result<(), Failure> {
    let s = sluice_io::summarize(&a.trace).map_err(|e| fail(exit::BAD_INPUT)(e.into()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s).context("serialising")?);
    } else {
        print!("{s}");
    }
    Ok(())
}

fn cmd_validate(a: ValidateArgs) -> Result<(), Failure> {
    let chain = match Chain::load(&a.chain) {
        Ok(c) => c,
        Err(e) => {
            if a.json {
                let v = serde_json::json!({"valid": false, "file": e.file, "line": e.line, "field": e.field, "message": e.message});
                println!("{v}");
                return Err(Failure { code: exit::INVALID, error: anyhow::anyhow!("{e}") });
            }
            return Err(Failure { code: exit::INVALID, error: anyhow::anyhow!("{e}") });
        }
    };
    // Building the instances checks every NF's configuration too.
    if let Err(e) = compile(&chain, &sluice_nfs::registry(), &[]) {
        let text = std::fs::read_to_string(&a.chain).unwrap_or_default();
        let (vertex, field) = match &e {
            sluice_runtime::PlanError::Nf { vertex, source: sluice_nf::NfError::Config { field, .. } } => {
                (vertex.clone(), field.clone())
            }
            sluice_runtime::PlanError::Nf { vertex, .. } | sluice_runtime::PlanError::UnknownOutput { vertex, .. } => {
                (vertex.clone(), String::new())
            }
            sluice_runtime::PlanError::Store(_) => (String::new(), String::new()),
        };
        let mut path = vec!["vertices", vertex.as_str(), "config"];
        path.extend(field.split('.').filter(|s| !s.is_empty()));
        let line = sluice_runtime::spec::locate(&text, &path);
        let loc = match line {
            Some(l) => format!("{}:{l}", a.chain.display()),
            None => a.chain.display().to_string(),
        };
        if a.json {
            let v = serde_json::json!({"valid": false, "file": a.chain, "line": line, "field": path.join("."), "message": e.to_string()});
            println!("{v}");
        }
        return Err(Failure { code: exit::INVALID, error: anyhow::anyhow!("{loc}: field `{}`: {e}", path.join(".")) });
    }
    if a.json {
        let v = serde_json::json!({"valid": true, "file": a.chain, "name": chain.name,
            "vertices": chain.vertices.iter().map(|(n, v)| serde_json::json!({"name": n, "type": v.kind, "instances": v.instances})).collect::<Vec<_>>(),
            "edges": chain.edges.len()});
        println!("{v}");
    } else {
        println!("{}: chain `{}` is valid", a.chain.display(), chain.name);
        for (n, v) in &chain.vertices {
            println!("  vertex {n:<14} type {:<11} instances {}", v.kind, v.instances);
        }
        println!("  {} edge(s)", chain.edges.len());
    }
    Ok(())
}
