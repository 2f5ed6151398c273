//! `sluice run`: a chain over a trace, generated traffic, live interfaces or Geneve datagrams,
//! with its report; the options, the sources and sinks it connects, the control endpoint and
//! the record.

use crate::bridge::{Bridge, BridgeSink, BridgeSource, LiveIo, LivePort};
use crate::ports::{GenSource, PcapSink, TraceSource};
use crate::{
    control, engine_config, exit, fail, gen_config, geneve_ports, load_chain, parse_pace, progress_bar, record,
    run_faults, state_config, state_for_run, EngineArgs, Failure,
};
use anyhow::Context;
use clap::Args;
use sluice_io::{Precision, TraceReader};
use sluice_runtime::{
    compile_with, run, Chain, DiscardSink, RunConfig, RunHooks, RunReport, Sink, Source, StateConfig,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub(crate) struct RunArgs {
    /// Chain file (YAML).
    #[arg(long, short)]
    chain: PathBuf,
    /// Input trace (pcap or pcapng).
    #[arg(
        long,
        short,
        conflicts_with_all = ["gen", "bridge", "from_geneve"],
        required_unless_present_any = ["gen", "bridge", "from_geneve", "spread"]
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
    /// Sit between two live interfaces, `IF0,IF1` (needs root): what arrives on one leaves on
    /// the other after the chain. Packets from IF1 follow the chain's `reverse_edges` if it
    /// has them.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["gen", "output"])]
    bridge: Option<Vec<String>>,
    /// With --bridge: how frames reach Sluice: `afpacket` (AF_PACKET rings, any interface) or
    /// `xdp` (AF_XDP sockets fed by an XDP program Sluice attaches and removes; faster, needs
    /// CAP_BPF and no other XDP program on the interfaces) [default: afpacket].
    #[arg(long, value_enum)]
    io: Option<LiveIo>,
    /// With --io xdp: attach the XDP program in `driver` (native) or `generic` mode, or `auto`
    /// (driver where the interface has it) [default: auto].
    #[arg(long, value_name = "MODE")]
    xdp_mode: Option<sluice_afxdp::AttachMode>,
    /// Stop after this many seconds (live runs; Ctrl-C also stops cleanly).
    #[arg(long)]
    duration: Option<f64>,
    /// Report root-to-sink latency per window of this many ms as well (`latency_timeline` in
    /// --json), and for each failover the time from the failure until latency was back to
    /// normal (five windows in a row within twice the p99 before it, starting anywhere after the
    /// failure, not only on the grid of windows).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=60_000))]
    latency_window: Option<u64>,
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
    /// On a node without the root of a spread chain: that node's part (its instances' drops and
    /// events, its vertices' state), which `sluice verify --recorded ROOT_DIR --part DIR` folds in.
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// Serve a control endpoint while the chain runs: PORT (on 127.0.0.1) or HOST:PORT (any
    /// other address only when given). `GET /api/v1/chain` lists vertices and instances with
    /// live statistics, `GET /metrics` is Prometheus text; see `sluice ctl`. On a node of a
    /// spread chain (--spread): its own instances' statistics (the others' are their nodes'),
    /// `slow` and `crash` of its own instances, and on the root's node of a spread file with
    /// `scalable: true` `scale`, `move` and `clone` of the vertices all on it; other live
    /// changes are refused.
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
    /// --fault-tolerance (not in a spread chain: give every node the same options); needs a
    /// store (not --mode local). On a live --bridge, events are placed
    /// by packet (`at: { packet: N }`): a live input has no length for percent.
    #[arg(long, value_name = "FILE")]
    faults: Option<PathBuf>,
    /// Run this process's part of a chain spread over several nodes (processes or machines): a
    /// YAML file with the nodes and the UDP address each listens on, the root's node, and
    /// which instances run where (`place: {firewall: b, nat/1: b}`; the rest stay with the
    /// root; `scalable: true` lets the root's node scale the vertices all on it). Give every
    /// node the same chain, options and file, and --node. The root's node takes the input and
    /// writes the output; the others take neither and run until the root's node ends the run.
    /// Packets cross in Geneve datagrams (docs/wire-format.md). See docs/deploy.md.
    #[arg(long, value_name = "FILE", requires = "node")]
    spread: Option<PathBuf>,
    /// With --spread: this process's node, by its name in the file.
    #[arg(long, value_name = "NAME", requires = "spread")]
    node: Option<String>,
    /// A `sluice node` hosts this run: its stdout is the node's JSON lines, so the text report
    /// goes to stderr.
    #[arg(skip)]
    pub(crate) hosted: bool,
    /// A `sluice node` hosting this run takes its live handle here, with or without
    /// `--control`: crash drills asked through etcd reach the run through it.
    #[arg(skip)]
    pub(crate) live_to: Option<Arc<std::sync::OnceLock<Arc<sluice_runtime::live::Live>>>>,
}

/// `sluice run` options given as words (a node hosting its part of a chain), checked as on the
/// command line.
pub(crate) fn parse_run_args(words: &[String]) -> Result<RunArgs, clap::Error> {
    #[derive(clap::Parser)]
    #[command(name = "sluice run", no_binary_name = true)]
    struct Words {
        #[command(flatten)]
        run: RunArgs,
    }
    <Words as clap::Parser>::try_parse_from(words).map(|w| w.run)
}

pub(crate) fn cmd_run(a: RunArgs) -> Result<(), Failure> {
    let chain = load_chain(&a.chain)?;
    let registry = sluice_nfs::registry();
    let mut cfg = engine_config(&a.engine, a.bridge.is_some());
    cfg.record = a.record.is_some();
    cfg.latency_timeline = a.latency_window.map(std::time::Duration::from_millis);
    // Options for one kind of input given with another would be ignored: say so instead.
    if a.idle_end.is_some() && a.from_geneve.is_none() {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--idle-end is for --from-geneve input")));
    }
    if a.gen.is_none() && (a.scale.is_some() || a.size.is_some()) {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--scale and --size are for --gen input")));
    }
    if a.io.is_some() && a.bridge.is_none() {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--io is for --bridge runs")));
    }
    if a.xdp_mode.is_some() && a.io != Some(LiveIo::Xdp) {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--xdp-mode is for --bridge with --io xdp")));
    }
    if let (Some(file), Some(node)) = (&a.spread, &a.node) {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading {}", file.display()))
            .map_err(fail(exit::BAD_INPUT))?;
        let spread = sluice_runtime::Spread::from_yaml(&text)
            .with_context(|| format!("--spread {}", file.display()))
            .map_err(fail(exit::INVALID))?;
        spread.node_index(node).map_err(|e| fail(exit::INVALID)(anyhow::Error::new(e)))?;
        let root = spread.root == *node;
        cfg.part = Some(sluice_runtime::Part { spread, node: node.clone() });
        if !root {
            return run_part(&a, &chain, &cfg);
        }
        if a.input.is_none() && a.gen.is_none() && a.from_geneve.is_none() && a.bridge.is_none() {
            return Err(fail(exit::INVALID)(anyhow::anyhow!(
                "node `{node}` has the root: give it the input (--input, --gen, --from-geneve or --bridge)"
            )));
        }
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
                let (source, listen) = geneve_ports::GeneveSource::bind(addr, a.vni, (idle, a.limit), links.clone())
                    .with_context(|| format!("--from-geneve {addr}"))
                    .map_err(fail(exit::INVALID))?;
                // The address actually bound (port 0 picks one), for whoever sends to it.
                eprintln!("geneve input: listening on {listen} (VNI {})", a.vni);
                geneve_in = Some(listen);
                (Box::new(source), Vec::new(), a.limit)
            }
        };
    apply_faults(&a, &chain, &mut cfg, || match &a.input {
        Some(path) => count_packets(path, a.limit),
        None => {
            total.ok_or_else(|| fail(exit::INVALID)(anyhow::anyhow!("percent positions need a known input length")))
        }
    })?;
    let state = claiming(state_config(&a.engine, &chain)?, &chain, a.engine.fresh_store, &mut cfg)?;
    let state = state_for_run(state, &cfg, takes_live_changes(&a, &cfg));
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
            let sink = geneve_ports::GeneveSink::new((any, to), a.vni, links.clone())
                .with_context(|| format!("--to-geneve {to}"))
                .map_err(fail(exit::INVALID))?;
            geneve_out = Some(to);
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
    let hooks = RunHooks { progress: Some(&progress), stop: Some(stop), live, journal: None };
    let report =
        run_recorded((a.record.as_deref(), false), &a.chain, plan, &cfg, source.as_mut(), sink.as_mut(), hooks)?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let extra = geneve_ports::report_sections(&links, geneve_in, geneve_out).context("serialising the report")?;
    print_report(a.hosted, &report, a.json.as_deref(), a.output.as_deref(), &extra)?;
    Ok(())
}

/// The root's node's part in claiming the store (`sluice_runtime::store_claim`): emptied first
/// with `fresh` (--fresh-store), and claimed by the run once its configuration is found good,
/// before anything runs (a refused configuration leaves no mark). A store another run left its
/// state in is then refused (exit 1) with what that run was.
fn claiming(state: StateConfig, chain: &Chain, fresh: bool, cfg: &mut RunConfig) -> Result<StateConfig, Failure> {
    if let StateConfig::Store { backend, .. } = &state {
        if fresh {
            backend
                .wipe()
                .map_err(|e| fail(exit::FAILED)(anyhow::anyhow!("emptying the store (--fresh-store): {e}")))?;
        }
        cfg.claim = Some(sluice_runtime::store_claim::run_mark(&chain.name));
    }
    Ok(state)
}

/// A node without the root of a spread chain: its instances, fed by the other nodes, until
/// the root's node ends the run.
fn run_part(a: &RunArgs, chain: &Chain, cfg: &RunConfig) -> Result<(), Failure> {
    let node = a.node.as_deref().unwrap_or_default();
    let elsewhere = [
        (a.input.is_some() || a.gen.is_some() || a.from_geneve.is_some() || a.bridge.is_some(), "input"),
        (a.output.is_some() || a.to_geneve.is_some(), "output"),
        (a.faults.is_some(), "--faults"),
        (a.engine.fresh_store, "--fresh-store"),
    ];
    if let Some((_, what)) = elsewhere.iter().find(|(given, _)| *given) {
        return Err(fail(exit::INVALID)(anyhow::anyhow!(
            "node `{node}` does not have the root: {what} belongs on the root's node"
        )));
    }
    let registry = sluice_nfs::registry();
    let mut cfg = cfg.clone();
    let state = state_for_run(state_config(&a.engine, chain)?, &cfg, takes_live_changes(a, &cfg));
    let mut plan =
        compile_with(chain, &registry, &[], &state).map_err(|e| fail(exit::INVALID)(anyhow::Error::new(e)))?;
    // As on the root's node: the same places for added instances on every node.
    prepare_scaling(a, &mut cfg, &mut plan);
    let cfg = &cfg;
    if !a.quiet {
        eprintln!("node {node}: waiting for the root's node (Ctrl-C to stop)");
    }
    let mut source = sluice_runtime::MemorySource::new(&[]);
    // Its part of the record (the root's node records the input and the output), journaled
    // as it goes: a node killed during the run leaves its drops and events behind.
    let journal = match a.record.as_deref() {
        Some(dir) => {
            record::Recorder::create(dir, &a.chain)?;
            Some(Arc::new(record::JournalFile::create(dir, &chain.name, node)?))
        }
        None => None,
    };
    // Its instances' live statistics (`--control`); the chain's own counters are the root's
    // node's.
    let live = start_control(a, &plan, None)?;
    let hooks = RunHooks {
        progress: None,
        stop: Some(stop_flag(a.duration)),
        live,
        journal: journal.clone().map(|j| j as Arc<dyn sluice_runtime::record::RecordJournal>),
    };
    let report = run(plan, cfg, &mut source, &mut DiscardSink, hooks).map_err(failed)?;
    if let (Some(dir), Some(j)) = (a.record.as_deref(), journal) {
        if let Some(e) = j.failure() {
            return Err(fail(exit::FAILED)(anyhow::anyhow!("writing the journal in {}: {e}", dir.display())));
        }
        record::write_part(dir, node, &report)?;
    }
    print_report(a.hosted, &report, a.json.as_deref(), None, &[])?;
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
/// Geneve counters, if it has a Geneve input or output); the statistics it serves, also made
/// for a hosting node that asks for them (`live_to`).
fn start_control(
    a: &RunArgs,
    plan: &sluice_runtime::Plan,
    links: Option<Arc<geneve_ports::LinkCounters>>,
) -> Result<Option<Arc<sluice_runtime::live::Live>>, Failure> {
    if a.control.is_none() && a.live_to.is_none() {
        return Ok(None);
    }
    let live = Arc::new(sluice_runtime::live::Live::new(plan));
    if let Some(addr) = a.control {
        control::serve(addr, a.control_token.as_deref(), live.clone(), links)?;
    }
    if let Some(to) = &a.live_to {
        let _ = to.set(live.clone());
    }
    Ok(Some(live))
}

/// A failed run as the command's failure, with the exit code its cause calls for.
fn failed(e: sluice_runtime::RunError) -> Failure {
    let code = match e {
        sluice_runtime::RunError::Source(_) => exit::BAD_INPUT,
        sluice_runtime::RunError::Config(_) => exit::INVALID,
        _ => exit::FAILED,
    };
    fail(code)(anyhow::Error::new(e))
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
    let Some(dir) = record else { return run(plan, cfg, source, sink, hooks).map_err(failed) };
    let recorder = record::Recorder::create(dir, chain_file)?.closed_loop(closed_loop);
    let (mut rsource, mut rsink) = recorder.wrap(source, sink)?;
    let report = run(plan, cfg, &mut rsource, &mut rsink, hooks).map_err(failed)?;
    recorder.finish(&report, rsource, rsink)?;
    Ok(report)
}

/// The process's stop flag: set by Ctrl-C or SIGTERM, or after `duration` seconds.
pub(crate) fn stop_flag(duration: Option<f64>) -> Arc<AtomicBool> {
    // One flag for the process: a node and the run it hosts both stop on Ctrl-C (the handler
    // can be set once).
    static STOP: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    let stop = STOP
        .get_or_init(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let _ = ctrlc::set_handler(move || s.store(true, Ordering::Relaxed));
            stop
        })
        .clone();
    if let Some(d) = duration.filter(|d| d.is_finite() && *d >= 0.0) {
        let s = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs_f64(d));
            s.store(true, Ordering::Relaxed);
        });
    }
    stop
}

/// Whether the chain may be changed while it runs (scaled, flows moved): in one process, when
/// it has a control endpoint; in a chain spread over nodes, when the spread file says
/// `scalable: true` — the same on every node, which must compile the same plan, control
/// endpoint or not (the root's node takes the changes).
fn takes_live_changes(a: &RunArgs, cfg: &sluice_runtime::RunConfig) -> bool {
    match &cfg.part {
        None => a.control.is_some(),
        Some(p) => p.spread.scalable,
    }
}

/// A run with a control endpoint and a store can be scaled live; one with `scale` or `move`
/// faults scales. Either keeps instance slots for the instances added (before the live
/// statistics are made: they show those too).
fn prepare_scaling(a: &RunArgs, cfg: &mut sluice_runtime::RunConfig, plan: &mut sluice_runtime::Plan) {
    cfg.scalable = takes_live_changes(a, cfg) && plan.rebuilder.has_store();
    let changes = cfg.planned.iter().any(|p| matches!(p, sluice_runtime::exec::Planned::Change(_)));
    if cfg.scalable || changes || !cfg.policies.is_empty() {
        plan.reserve_spares(sluice_runtime::exec::MAX_INSTANCES_PER_VERTEX);
    }
}

fn run_bridge(a: &RunArgs, chain: Chain, cfg: &sluice_runtime::RunConfig, ifs: &[String]) -> Result<(), Failure> {
    let [if0, if1] = ifs else {
        return Err(fail(exit::INVALID)(anyhow::anyhow!("--bridge takes two interfaces, IF0,IF1")));
    };
    let mut cfg = cfg.clone();
    apply_faults(a, &chain, &mut cfg, || {
        Err(fail(exit::INVALID)(anyhow::anyhow!(
            "a live bridge has no known length: place fault events with `at: {{ packet: N }}`, not percent"
        )))
    })?;
    let state = claiming(state_config(&a.engine, &chain)?, &chain, a.engine.fresh_store, &mut cfg)?;
    let state = state_for_run(state, &cfg, takes_live_changes(a, &cfg));
    let mut plan = compile_with(&chain, &sluice_nfs::registry(), &[], &state)
        .map_err(|e| fail(exit::INVALID)(anyhow::Error::new(e)))?;
    prepare_scaling(a, &mut cfg, &mut plan);
    let cfg = &cfg;
    let opened = |e: String| fail(exit::FAILED)(anyhow::anyhow!("{e}"));
    match a.io.unwrap_or(LiveIo::Afpacket) {
        LiveIo::Afpacket => {
            let c = sluice_afpacket::RingConfig::default();
            let open = |i: &str| sluice_afpacket::AfPacketPort::open(i, &c).map_err(|e| opened(e.to_string()));
            bridge_run(a, plan, cfg, Bridge::new([open(if0)?, open(if1)?]))
        }
        LiveIo::Xdp => {
            let c = sluice_afxdp::XdpConfig { mode: a.xdp_mode.unwrap_or_default(), ..Default::default() };
            let open = |i: &str| sluice_afxdp::XdpPort::open(i, &c).map_err(|e| opened(e.to_string()));
            bridge_run(a, plan, cfg, Bridge::new([open(if0)?, open(if1)?]))
        }
    }
}

/// With `--faults`: the schedule's events and policies go into `cfg` (fault tolerance on, but
/// in a spread chain, where every node must be given the same options and the schedule takes
/// no crash); `count` gives the input's length for percent positions.
fn apply_faults(
    a: &RunArgs,
    chain: &Chain,
    cfg: &mut sluice_runtime::RunConfig,
    count: impl FnOnce() -> Result<u64, Failure>,
) -> Result<(), Failure> {
    let Some(f) = &a.faults else { return Ok(()) };
    let faults = run_faults::faults(f, chain, a.engine.roots, count)?;
    cfg.planned = faults.planned;
    cfg.policies = faults.policies;
    cfg.fault_tolerance |= cfg.part.is_none();
    Ok(())
}

/// Runs the chain between the bridge's ports until stopped, and prints the report with the
/// ports' counters.
fn bridge_run<P: LivePort>(
    a: &RunArgs,
    plan: sluice_runtime::Plan,
    cfg: &sluice_runtime::RunConfig,
    bridge: Bridge<P>,
) -> Result<(), Failure> {
    let shared = std::rc::Rc::new(std::cell::RefCell::new(bridge));
    let mut source = BridgeSource(shared.clone());
    let mut sink = BridgeSink(shared.clone());
    let stop = stop_flag(a.duration);
    let live = start_control(a, &plan, None)?;
    let hooks = RunHooks { progress: None, stop: Some(stop), live, journal: None };
    let report = run_recorded((a.record.as_deref(), true), &a.chain, plan, cfg, &mut source, &mut sink, hooks)?;
    let (ports, lines) = shared.borrow_mut().report();
    print_report(a.hosted, &report, a.json.as_deref(), None, &[("ports", ports, lines)])
}

/// Prints a run's report as text, or as JSON to stdout or a file (`json`), with `extra`
/// sections of the run's ports: each a JSON key, its value, and its line of text.
fn print_report(
    hosted: bool,
    report: &RunReport,
    json: Option<&Path>,
    output: Option<&Path>,
    extra: &[(&str, serde_json::Value, String)],
) -> Result<(), Failure> {
    let to_stdout = json.is_some_and(|p| p == Path::new("-"));
    if !to_stdout {
        let mut text = report.to_string();
        if let Some(o) = output {
            text += &format!("  output written to {}\n", o.display());
        }
        for (_, _, line) in extra {
            text += &format!("{line}\n");
        }
        if hosted {
            eprint!("{text}");
        } else {
            print!("{text}");
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
