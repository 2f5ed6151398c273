//! `sluice`: run chains of stateful network functions over traces, generated traffic or live
//! interfaces; generate and inspect traces; validate chain files; benchmark.

mod bench;
mod bench_store;
mod cluster;
mod control;
mod embark;
mod embark_bench;
mod fuzz;
mod geneve_ports;
mod ports;
mod record;
mod run_faults;
mod verify;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use ports::{GenSource, PcapSink, TraceSource};
use sluice_io::{FrameSize, GenConfig, Pace, Precision, TraceReader, Workload};
use sluice_runtime::{
    compile, compile_with, run, Chain, DiscardSink, Overflow, RunConfig, RunHooks, RunReport, Sink, Source, StateConfig,
};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
    Run(RunArgs),
    /// Generate a synthetic TCP trace (StatelessNF workloads) as pcap.
    Gen(GenArgs),
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
    /// through its controller's (`sluice controller --control`): nodes, drain, undrain.
    Ctl(control::CtlArgs),
    /// Place a chain's roots and NF instances on the live nodes of a cluster (etcd): campaign
    /// for leadership, then keep the assignments in step as nodes join, leave or die.
    Controller(cluster::ControllerArgs),
    /// Join a cluster (etcd) as a node: register under a lease kept alive, follow this node's
    /// assignment and print each change as a JSON line. (Hosting the assigned units on the
    /// threaded runtime comes next; see docs/deploy.md.)
    Node(cluster::NodeArgs),
    /// A cluster's state in etcd: status (leader, nodes, units), drain or undrain a node.
    Cluster(cluster::ClusterCmdArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Chain file (YAML).
    #[arg(long, short)]
    chain: PathBuf,
    /// Input trace (pcap or pcapng).
    #[arg(
        long,
        short,
        conflicts_with_all = ["gen", "bridge", "from_geneve"],
        required_unless_present_any = ["gen", "bridge", "from_geneve"]
    )]
    input: Option<PathBuf>,
    /// Take the input from Geneve datagrams on this UDP address, HOST:PORT (another chain's
    /// --to-geneve, or a load balancer that speaks Geneve): each datagram's Ethernet frame
    /// enters the chain with its capture time and NF labels; datagrams that are not Sluice's
    /// Geneve for --vni are dropped and counted (docs/wire-format.md). Ends with --idle-end,
    /// --limit, --duration or Ctrl-C.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["gen", "bridge"])]
    from_geneve: Option<std::net::SocketAddr>,
    /// Send the output as Geneve datagrams to this UDP address, HOST:PORT, with Sluice's
    /// metadata as options (e.g. to another chain's --from-geneve); Wireshark and tcpdump
    /// decode them.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["output", "bridge"])]
    to_geneve: Option<std::net::SocketAddr>,
    /// The Geneve VNI (0 to 16,777,215) naming the chain on --from-geneve and --to-geneve.
    #[arg(long, default_value_t = 1)]
    vni: u32,
    /// With --from-geneve: end the input once this many seconds pass without a datagram,
    /// after the first one.
    #[arg(long, value_name = "SECS")]
    idle_end: Option<f64>,
    /// Sit between two live interfaces, `IF0,IF1` (AF_PACKET, needs CAP_NET_RAW): what arrives
    /// on one leaves on the other after the chain. Packets from IF1 follow the chain's
    /// `reverse_edges` if it has them.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["gen", "output"])]
    bridge: Option<Vec<String>>,
    /// Stop after this many seconds (live runs; Ctrl-C also stops cleanly).
    #[arg(long)]
    duration: Option<f64>,
    /// Generate the input instead: long, short, mixed, demo or FLOWSxPACKETS.
    #[arg(long)]
    gen: Option<String>,
    /// With --gen: scale factor (fraction of the workload's flows) [default: 1].
    #[arg(long)]
    scale: Option<f64>,
    /// With --gen: frame size, mix or a byte count (64..=1500) [default: mix].
    #[arg(long)]
    size: Option<String>,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output pcap file; without it the output is discarded.
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Write output timestamps with nanosecond precision.
    #[arg(long)]
    nanos: bool,
    /// Also write the report as JSON to this file (`-` for stdout, replacing the text report).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Stop after this many input packets.
    #[arg(long)]
    limit: Option<u64>,
    #[command(flatten)]
    engine: EngineArgs,
    /// Replay pace: `full` or the recorded pace times a speed factor (`1`, `2.5`, ...).
    #[arg(long, default_value = "full")]
    pace: String,
    /// Do not show a progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Record the run in this directory (created; must not hold a record): the chain, every
    /// input packet and its clock, the output, the NFs' drops and events, and the final state
    /// after the timers due by the last packet fired. Check it with `sluice verify --recorded DIR`.
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// Serve a control endpoint while the chain runs: PORT (on 127.0.0.1) or HOST:PORT (any
    /// other address only when given). `GET /api/v1/chain` lists vertices and instances with
    /// live statistics, `GET /metrics` is Prometheus text; see `sluice ctl`.
    #[arg(long, value_name = "ADDR", value_parser = control::parse_addr)]
    control: Option<std::net::SocketAddr>,
    /// The control endpoint's token (default: $SLUICE_CONTROL_TOKEN, else a random one printed
    /// on stderr). Requests send `Authorization: Bearer TOKEN`.
    #[arg(long, requires = "control")]
    control_token: Option<String>,
    /// Crash, slow, scale, move and clone while the chain runs (a fault-schedule file, as for
    /// `sluice verify`: `crash`, `crash_root`, `crash_store`, `slow`, `scale`, `move` and `clone`
    /// events, scaling and straggler policies): a crashed instance is replaced and the root
    /// replays its log to the replacement, through the NFs in front of it; a slowed one spends
    /// the extra time per packet; a moved flow's packets wait at its new instance until the old
    /// one is done with it. A `run:` section is for `sluice verify` (the chain, input, limit and
    /// log come from this command line; its `roots` must match --roots). Turns on
    /// --fault-tolerance; needs a store (not --mode local).
    #[arg(long, value_name = "FILE", conflicts_with = "bridge")]
    faults: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct EngineArgs {
    /// Worker threads (default: one per core).
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
    /// `redis+cluster://host:port,host:port,...` (`?prefix=P&buckets=N` optional; Redis >= 7).
    /// Default: the chain file's `state.store`, else embedded.
    #[arg(long)]
    store: Option<String>,
    /// Threads of the embedded store.
    #[arg(long, default_value_t = 1)]
    store_threads: usize,
    /// Checkpoint the state store this often, in milliseconds (0: never). A run that may lose
    /// its store (`crash_store` faults, or `--fault-tolerance` with `--control`, where `sluice
    /// ctl crash-store` may ask for it) holds the chain still for each, so that the instances'
    /// write-ahead logs agree with it; others take it on a thread of their own. Checkpoints
    /// that take long are spaced out to at most a tenth of the run's time.
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
    let backend: std::sync::Arc<dyn sluice_store::Backend> = match store.as_str() {
        "embedded" => std::sync::Arc::new(
            sluice_store::EmbeddedStore::start(e.store_threads)
                .map_err(|x| fail(exit::FAILED)(anyhow::Error::new(x)))?,
        ),
        url if url.starts_with("redis://") || url.starts_with("redis+cluster://") => std::sync::Arc::new(
            sluice_redis::RedisBackend::connect(url).map_err(|x| fail(exit::FAILED)(anyhow::Error::new(x)))?,
        ),
        other => {
            return Err(fail(exit::INVALID)(anyhow::anyhow!(
                "--store takes `embedded`, `redis://host:port` or `redis+cluster://host:port,...`, not `{other}`"
            )));
        }
    };
    Ok(StateConfig::Store { backend, client: sluice_store::ClientConfig { mode, ..Default::default() } })
}

/// With the root's log (`--fault-tolerance`), instances keep what a replay needs
/// ([`StateConfig::fault_tolerant`]).
fn fault_tolerant(state: StateConfig, on: bool) -> StateConfig {
    if on {
        state.fault_tolerant()
    } else {
        state
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
        Command::Run(a) => cmd_run(a),
        Command::Ctl(a) => control::cmd_ctl(a),
        Command::Controller(a) => cluster::cmd_controller(a),
        Command::Node(a) => cluster::cmd_node(a),
        Command::Cluster(a) => cluster::cmd_cluster(a),
        Command::Gen(a) => cmd_gen(a),
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

fn cmd_run(a: RunArgs) -> Result<(), Failure> {
    let chain = load_chain(&a.chain)?;
    let registry = sluice_nfs::registry();
    let mut cfg = engine_config(&a.engine, a.bridge.is_some());
    cfg.record = a.record.is_some();
    // Options for one kind of input given with another would be ignored: say so instead.
    if a.idle_end.is_some() && a.from_geneve.is_none() {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--idle-end is for --from-geneve input")));
    }
    if a.gen.is_none() && (a.scale.is_some() || a.size.is_some()) {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--scale and --size are for --gen input")));
    }
    if let Some(ifs) = &a.bridge {
        return run_bridge(&a, chain, &cfg, ifs);
    }
    let pace = parse_pace(&a.pace)?;
    let mut geneve_in = None;
    let links = Arc::new(geneve_ports::LinkCounters::default());
    // A prefix of the input lets the compiler check that each vertex's split spreads the load.
    let (mut source, sample, total): (Box<dyn Source>, Vec<sluice_packet::Packet>, Option<u64>) =
        match (&a.input, &a.gen) {
            (Some(path), _) => {
                let sample = sluice_io::load(path, Some(4096))
                    .with_context(|| format!("reading {}", path.display()))
                    .map_err(fail(exit::BAD_INPUT))?;
                let reader = TraceReader::open(path).map_err(|e| fail(exit::BAD_INPUT)(e.into()))?;
                (Box::new(TraceSource::new(reader, pace, a.limit)), sample, a.limit)
            }
            (None, Some(w)) => {
                let g = gen_config(w, a.scale.unwrap_or(1.0), a.size.as_deref().unwrap_or("mix"), a.seed)?;
                let total = g.total_packets();
                let sample_cfg = g.clone();
                let sample = sluice_io::generate(&sample_cfg)
                    .map_err(|e| fail(exit::INVALID)(e.into()))?
                    .take(4096)
                    .map(|(ts_ns, f)| {
                        sluice_packet::Packet::from_slice(&f, sluice_packet::Meta { ts_ns, ..Default::default() })
                    })
                    .collect();
                let gen = sluice_io::generate(&g).map_err(|e| fail(exit::INVALID)(e.into()))?;
                (Box::new(GenSource::new(gen, a.limit)), sample, Some(a.limit.map_or(total, |l| l.min(total))))
            }
            (None, None) => {
                let Some(addr) = a.from_geneve else {
                    return Err(fail(exit::INVALID)(anyhow::anyhow!("give --input, --gen, --from-geneve or --bridge")));
                };
                let idle = a.idle_end.map(|s| seconds("--idle-end", s)).transpose()?;
                let (source, stats) = geneve_ports::GeneveSource::bind(addr, a.vni, (idle, a.limit), links.clone())
                    .with_context(|| format!("--from-geneve {addr}"))
                    .map_err(fail(exit::INVALID))?;
                // The address actually bound (port 0 picks one), for whoever sends to it.
                eprintln!("geneve input: listening on {} (VNI {})", stats.borrow().listen, a.vni);
                geneve_in = Some(stats);
                (Box::new(source), Vec::new(), a.limit)
            }
        };
    if let Some(f) = &a.faults {
        let count = || match &a.input {
            Some(path) => count_packets(path, a.limit),
            None => {
                total.ok_or_else(|| fail(exit::INVALID)(anyhow::anyhow!("percent positions need a known input length")))
            }
        };
        let faults = run_faults::faults(f, &chain, a.engine.roots, count)?;
        cfg.planned = faults.planned;
        cfg.policies = faults.policies;
        cfg.fault_tolerance = true;
    }
    let state = fault_tolerant(state_config(&a.engine, &chain)?, cfg.fault_tolerance);
    let mut plan =
        compile_with(&chain, &registry, &sample, &state).map_err(|e| fail(exit::INVALID)(anyhow::Error::new(e)))?;
    prepare_scaling(&a, &mut cfg, &mut plan);
    let mut geneve_out = None;
    let mut sink: Box<dyn Sink> = match (&a.output, a.to_geneve) {
        (Some(p), _) => Box::new(
            PcapSink::create(p, if a.nanos { Precision::Nano } else { Precision::Micro })
                .with_context(|| format!("creating {}", p.display()))?,
        ),
        (None, Some(to)) => {
            let any: std::net::SocketAddr =
                if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
            let (sink, stats) = geneve_ports::GeneveSink::new((any, to), a.vni, links.clone())
                .with_context(|| format!("--to-geneve {to}"))
                .map_err(fail(exit::INVALID))?;
            geneve_out = Some((to, stats));
            Box::new(sink)
        }
        (None, None) => Box::new(DiscardSink),
    };
    let stop = stop_flag(a.duration);
    let pb = progress_bar(a.quiet, total);
    let progress = |n: u64| {
        if let Some(pb) = &pb {
            pb.set_position(n);
        }
    };
    let uses_geneve = geneve_in.is_some() || geneve_out.is_some();
    let live = start_control(&a, &plan, uses_geneve.then(|| links.clone()))?;
    let hooks = RunHooks { progress: Some(&progress), stop: Some(stop), live };
    let report =
        run_recorded((a.record.as_deref(), false), &a.chain, plan, &cfg, source.as_mut(), sink.as_mut(), hooks)?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let mut extra = Vec::new();
    if let Some(stats) = geneve_in {
        let s = stats.borrow();
        let l = &s.link;
        let mut line = format!(
            "  geneve input on {}: {} accepted in {:.3} s, {} malformed, {} for another VNI, {} not for the root, {} too large, {} lost on the way, {} late",
            s.listen, l.accepted, s.active_s, l.malformed, l.other_vni, s.not_for_root, l.truncated, l.lost, l.late
        );
        if let Some(e) = &l.last_error {
            line += &format!(" (last malformed: {e})");
        }
        extra.push(("geneve_input", serde_json::to_value(&*s).context("serialising the report")?, line));
    }
    if let Some((to, stats)) = geneve_out {
        let s = *stats.borrow();
        let line = format!("  geneve output to {to}: {} datagrams, {} bytes", s.datagrams, s.bytes);
        let value = serde_json::json!({ "to": to.to_string(), "datagrams": s.datagrams, "bytes": s.bytes });
        extra.push(("geneve_output", value, line));
    }
    print_report(&report, a.json.as_deref(), a.output.as_deref(), &extra)?;
    Ok(())
}

/// A positive, finite number of seconds given to `flag`.
fn seconds(flag: &str, s: f64) -> Result<std::time::Duration, Failure> {
    if s.is_finite() && s > 0.0 {
        Ok(std::time::Duration::from_secs_f64(s))
    } else {
        Err(fail(exit::INVALID)(anyhow::anyhow!("{flag} takes a positive number of seconds, not {s}")))
    }
}

/// The packets of the trace at `path` (at most `limit`).
fn count_packets(path: &Path, limit: Option<u64>) -> Result<u64, Failure> {
    let mut reader = TraceReader::open(path).map_err(|e| fail(exit::BAD_INPUT)(e.into()))?;
    let mut n = 0u64;
    while limit.is_none_or(|l| n < l) {
        match reader.next_record() {
            Ok(Some(_)) => n += 1,
            Ok(None) => break,
            Err(e) => return Err(fail(exit::BAD_INPUT)(e.into())),
        }
    }
    Ok(n)
}

/// Starts the control endpoint if `--control` asks for it (serving `links` too, the run's
/// Geneve counters, if it has a Geneve input or output); the statistics it serves.
fn start_control(
    a: &RunArgs,
    plan: &sluice_runtime::Plan,
    links: Option<Arc<geneve_ports::LinkCounters>>,
) -> Result<Option<Arc<sluice_runtime::live::Live>>, Failure> {
    let Some(addr) = a.control else { return Ok(None) };
    let live = Arc::new(sluice_runtime::live::Live::new(plan));
    control::serve(addr, a.control_token.as_deref(), live.clone(), links)?;
    Ok(Some(live))
}

/// Runs `plan`, recording the run in `record` if given (`cfg.record` must be set then);
/// `closed_loop`: its input answers what it sends (a live bridge).
fn run_recorded(
    (record, closed_loop): (Option<&Path>, bool),
    chain_file: &Path,
    plan: sluice_runtime::Plan,
    cfg: &RunConfig,
    source: &mut dyn Source,
    sink: &mut dyn Sink,
    hooks: RunHooks<'_>,
) -> Result<RunReport, Failure> {
    let failed = |e: sluice_runtime::RunError| {
        let code = match e {
            sluice_runtime::RunError::Source(_) => exit::BAD_INPUT,
            sluice_runtime::RunError::Config(_) => exit::INVALID,
            _ => exit::FAILED,
        };
        fail(code)(anyhow::Error::new(e))
    };
    let Some(dir) = record else { return run(plan, cfg, source, sink, hooks).map_err(failed) };
    let recorder = record::Recorder::create(dir, chain_file)?.closed_loop(closed_loop);
    let (mut rsource, mut rsink) = recorder.wrap(source, sink)?;
    let report = run(plan, cfg, &mut rsource, &mut rsink, hooks).map_err(failed)?;
    recorder.finish(&report, rsource, rsink)?;
    Ok(report)
}

/// A flag set by Ctrl-C or after `duration` seconds.
pub(crate) fn stop_flag(duration: Option<f64>) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let _ = ctrlc::set_handler(move || s.store(true, Ordering::Relaxed));
    if let Some(d) = duration.filter(|d| d.is_finite() && *d >= 0.0) {
        let s = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs_f64(d));
            s.store(true, Ordering::Relaxed);
        });
    }
    stop
}

/// A run with a control endpoint and a store can be scaled live; one with `scale` or `move`
/// faults scales. Either keeps instance slots for the instances added (before the live
/// statistics are made: they show those too).
fn prepare_scaling(a: &RunArgs, cfg: &mut sluice_runtime::RunConfig, plan: &mut sluice_runtime::Plan) {
    cfg.scalable = a.control.is_some() && plan.rebuilder.has_store();
    let changes = cfg.planned.iter().any(|p| matches!(p, sluice_runtime::exec::Planned::Change(_)));
    if cfg.scalable || changes || !cfg.policies.is_empty() {
        plan.reserve_spares(sluice_runtime::exec::MAX_INSTANCES_PER_VERTEX);
    }
}

fn run_bridge(a: &RunArgs, chain: Chain, cfg: &sluice_runtime::RunConfig, ifs: &[String]) -> Result<(), Failure> {
    let [if0, if1] = ifs else {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--bridge takes two interfaces, IF0,IF1")));
    };
    let state = fault_tolerant(state_config(&a.engine, &chain)?, cfg.fault_tolerance);
    let mut plan = compile_with(&chain, &sluice_nfs::registry(), &[], &state)
        .map_err(|e| fail(exit::INVALID)(anyhow::Error::new(e)))?;
    let mut cfg = cfg.clone();
    prepare_scaling(a, &mut cfg, &mut plan);
    let cfg = &cfg;
    let bridge = ports::Bridge::open(if0, if1).map_err(|e| fail(exit::FAILED)(anyhow::Error::new(e)))?;
    let shared = std::rc::Rc::new(std::cell::RefCell::new(bridge));
    let mut source = ports::BridgeSource(shared.clone());
    let mut sink = ports::BridgeSink(shared.clone());
    let stop = stop_flag(a.duration);
    let live = start_control(a, &plan, None)?;
    let hooks = RunHooks { progress: None, stop: Some(stop), live };
    let report = run_recorded((a.record.as_deref(), true), &a.chain, plan, cfg, &mut source, &mut sink, hooks)?;
    print_report(&report, a.json.as_deref(), None, &[])?;
    let mut b = shared.borrow_mut();
    if a.json.as_deref() != Some(Path::new("-")) {
        for (name, s) in b.stats() {
            println!(
                "  port {name}: rx {} tx {} kernel-drops {} truncated {} tx-ring-full {}",
                s.rx_packets, s.tx_packets, s.rx_kernel_drops, s.rx_truncated, s.tx_ring_full
            );
        }
        if b.tx_dropped > 0 {
            println!("  frames dropped on full transmit rings: {}", b.tx_dropped);
        }
    }
    Ok(())
}

/// Prints a run's report as text, or as JSON to stdout or a file (`json`), with `extra`
/// sections of the run's ports: each a JSON key, its value, and its line of text.
fn print_report(
    report: &RunReport,
    json: Option<&Path>,
    output: Option<&Path>,
    extra: &[(&str, serde_json::Value, String)],
) -> Result<(), Failure> {
    let to_stdout = json.is_some_and(|p| p == Path::new("-"));
    if !to_stdout {
        print!("{report}");
        if let Some(o) = output {
            println!("  output written to {}", o.display());
        }
        for (_, _, line) in extra {
            println!("{line}");
        }
    }
    if let Some(p) = json {
        let mut value = serde_json::to_value(report).context("serialising the report")?;
        if let Some(map) = value.as_object_mut() {
            for (key, v, _) in extra {
                map.insert((*key).to_string(), v.clone());
            }
        }
        let text = serde_json::to_string_pretty(&value).context("serialising the report")?;
        if to_stdout {
            println!("{text}");
        } else {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
        }
    }
    Ok(())
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
