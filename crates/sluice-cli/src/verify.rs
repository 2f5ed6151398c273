//! `sluice verify`: is the physical chain, under a fault schedule, equivalent to the logical one?

use crate::{exit, fail, load_chain, Failure};
use anyhow::Context;
use clap::{Args, ValueEnum};
use sluice_coe::compare::CompareOptions;
use sluice_coe::engine::{EngineConfig, LogPlace, Switches};
use sluice_coe::schedule::{Action, At, FaultEvent, FaultSchedule, RunOptions, ScaleTo};
use std::path::{Path, PathBuf};

#[derive(Args)]
#[command(after_help = "A schedule's `run:` section (roots, log, async_delete, checkpoint_every, chain, input, \
limit) sets the run's options; flags given explicitly override it. Explicit actions are added to the schedule's events; AT is a packet count (`20000`) or a \
percentage of the trace (`40%`). Examples:\n  --crash nat:0@50%   --crash-root 30% (--roots 2: --crash-root 1@30%)   --crash-store 12000\n  \
--scale portscan=3@40%   --move nat:0>1x4000@60%   --slow nat:0=3-10@1   --clone nat:0@30%\n\
Exit codes: 0 equivalent; 4 not equivalent; 1 run failed; 2 bad command line, chain, schedule; 3 bad trace.")]
pub struct VerifyArgs {
    /// Check a run of the threaded runtime recorded with `sluice run --record DIR` against the
    /// logical chain over the same input (no schedule, no engine run).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["chain", "input", "faults", "store", "fresh_store", "off", "log", "roots"])]
    recorded: Option<PathBuf>,
    /// With `--recorded` (the root's node's record): another node's part of the same run of a
    /// chain spread over several (`sluice run --spread S --node N --record DIR` on that node),
    /// folded in before the check. Repeatable.
    #[arg(long, value_name = "DIR", requires = "recorded")]
    part: Vec<PathBuf>,
    /// Chain file (YAML). Default: the schedule's `run.chain`.
    #[arg(long, short)]
    chain: Option<PathBuf>,
    /// Input trace (pcap or pcapng). Default: the schedule's `run.input`.
    #[arg(long, short)]
    input: Option<PathBuf>,
    /// Fault schedule (YAML, see docs/faults.md).
    #[arg(long, short)]
    faults: Option<PathBuf>,
    /// The physical chain's store: `embedded`, `redis://host:port[?prefix=P]` or
    /// `sluice://host:port[?token=T&space=S]`. The run starts from an empty store: one
    /// another run left its state in is refused (see --fresh-store).
    #[arg(long, default_value = "embedded")]
    store: String,
    /// Delete whatever the store holds before the run (another run's state under the same
    /// Redis prefix or served space).
    #[arg(long)]
    fresh_store: bool,
    /// Print the report as JSON on stdout (every difference with flow, NF and clock).
    #[arg(long)]
    json: bool,
    /// Turn a mechanism off to see what it prevents (repeatable).
    #[arg(long, value_enum)]
    off: Vec<Mechanism>,
    /// Where the root keeps its packet log. Default: the schedule's `run.log`, else `root`.
    #[arg(long, value_enum)]
    log: Option<LogArg>,
    /// Roots over statically partitioned input (by source address), each with its own clock.
    /// Default: the schedule's `run.roots`, else 1.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=64))]
    roots: Option<u8>,
    /// The root hears that a packet is done after the last NF emitted it (saves the last NF a
    /// round trip; a crash in between delivers the packet twice). `--async-delete=false`
    /// overrides a schedule's `run.async_delete: true`. Default: the schedule's, else false.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    async_delete: Option<bool>,
    /// Virtual time between input packets, ns.
    #[arg(long, default_value_t = 2_000)]
    arrival_ns: u64,
    /// Virtual service time per packet per instance, ns.
    #[arg(long, default_value_t = 1_000)]
    service_ns: u64,
    /// Most packets in the root's log.
    #[arg(long, default_value_t = 1 << 20)]
    log_capacity: usize,
    /// The store is checkpointed every this many input packets (and after every failover);
    /// a store crash re-executes the write-ahead logs since the last one. 0: only after
    /// failovers. Default: the schedule's `run.checkpoint_every`, else 10000.
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Stop after this many input packets. Default: the schedule's `run.limit`, else the
    /// whole trace.
    #[arg(long)]
    limit: Option<u64>,
    /// Crash instance I of vertex V: `V:I@AT`.
    #[arg(long)]
    crash: Vec<String>,
    /// Crash the root at AT; with several roots, root R: `R@AT`.
    #[arg(long)]
    crash_root: Vec<String>,
    /// Crash the store at AT.
    #[arg(long)]
    crash_store: Vec<String>,
    /// Scale vertex V to N instances: `V=N@AT`.
    #[arg(long)]
    scale: Vec<String>,
    /// Move flows between instances: `V:A>B[xN]@AT` (all flows of A without `xN`).
    #[arg(long = "move")]
    moves: Vec<String>,
    /// Slow an instance by a random delay per packet: `V:I=LO-HI@AT` (µs).
    #[arg(long)]
    slow: Vec<String>,
    /// Clone instance I of vertex V (straggler mitigation): `V:I@AT`.
    #[arg(long)]
    clone: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mechanism {
    /// Logical clocks (NFs see their own arrival order).
    Clocks,
    /// Duplicate suppression (queues, store).
    Dedup,
    /// The flow-move protocol.
    Move,
    /// The XOR check on the root's log.
    Xor,
    /// Recording non-deterministic values (random numbers, wall-clock time) by clock.
    Nondet,
}

/// Where the root keeps its packet log (`--log`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogArg {
    /// At the root: lost when the root fails.
    Root,
    /// In the state store too: every packet written, and acknowledged, before it enters the
    /// chain; a new root reads the log back.
    Store,
}

/// Exit code for "the runs differ".
const NOT_EQUIVALENT: u8 = 4;

fn bad(msg: String) -> Failure {
    fail(exit::INVALID)(anyhow::anyhow!(msg))
}

fn parse_at(s: &str) -> Result<At, Failure> {
    let s = s.trim();
    if let Some(p) = s.strip_suffix('%') {
        let v: f64 = p.parse().map_err(|_| bad(format!("`{s}`: expected a percentage like `40%`")))?;
        return Ok(At::Percent(v));
    }
    s.parse().map(At::Packet).map_err(|_| bad(format!("`{s}`: expected a packet count or a percentage")))
}

fn split_at(s: &str) -> Result<(&str, At), Failure> {
    let (what, at) = s.rsplit_once('@').ok_or_else(|| bad(format!("`{s}`: missing `@AT`")))?;
    Ok((what, parse_at(at)?))
}

fn vertex_instance(s: &str) -> Result<(String, u16), Failure> {
    let (v, i) = s.split_once(':').ok_or_else(|| bad(format!("`{s}`: expected VERTEX:INSTANCE")))?;
    let i = i.parse().map_err(|_| bad(format!("`{s}`: instance must be a number")))?;
    Ok((v.to_string(), i))
}

/// A file the run needs: the flag when given, else the schedule's `run:` path (relative to
/// the schedule file), else an error naming both.
fn run_file(
    schedule: &FaultSchedule,
    flag: Option<&Path>,
    from_run: Option<&Path>,
    name: &str,
    field: &str,
) -> Result<PathBuf, Failure> {
    match (flag, from_run) {
        (Some(p), _) => Ok(p.to_path_buf()),
        (None, Some(p)) => Ok(schedule.run_path(p)),
        (None, None) => Err(bad(format!("{name} is required (or `run.{field}` in the --faults schedule)"))),
    }
}

/// The explicit actions of the command line as schedule events.
fn cli_events(a: &VerifyArgs) -> Result<Vec<FaultEvent>, Failure> {
    let mut out = Vec::new();
    let mut push = |at: At, action: Action| out.push(FaultEvent { at, action, line: None });
    for s in &a.crash {
        let (w, at) = split_at(s)?;
        let (vertex, instance) = vertex_instance(w)?;
        push(at, Action::Crash { vertex, instance });
    }
    for s in &a.crash_root {
        let (root, at) = match s.rsplit_once('@') {
            Some((r, at)) if !r.is_empty() => {
                let root = r.parse().map_err(|_| bad(format!("`{s}`: expected R@AT with R a root number")))?;
                (root, parse_at(at)?)
            }
            _ => (0, parse_at(s.trim_start_matches('@'))?),
        };
        push(at, Action::CrashRoot { root });
    }
    for s in &a.crash_store {
        push(parse_at(s.trim_start_matches('@'))?, Action::CrashStore);
    }
    for s in &a.scale {
        let (w, at) = split_at(s)?;
        let (v, n) = w.split_once('=').ok_or_else(|| bad(format!("`{s}`: expected VERTEX=N@AT")))?;
        let n = n.parse().map_err(|_| bad(format!("`{s}`: N must be a number")))?;
        push(at, Action::Scale { vertex: v.to_string(), to: ScaleTo::Exactly(n) });
    }
    for s in &a.moves {
        let (w, at) = split_at(s)?;
        let (v, rest) = w.split_once(':').ok_or_else(|| bad(format!("`{s}`: expected VERTEX:A>B[xN]@AT")))?;
        let (pair, flows) = match rest.split_once('x') {
            Some((p, n)) => (p, Some(n.parse().map_err(|_| bad(format!("`{s}`: N must be a number")))?)),
            None => (rest, None),
        };
        let (from, to) = pair.split_once('>').ok_or_else(|| bad(format!("`{s}`: expected A>B")))?;
        let from = from.parse().map_err(|_| bad(format!("`{s}`: A must be a number")))?;
        let to = to.parse().map_err(|_| bad(format!("`{s}`: B must be a number")))?;
        push(at, Action::Move { vertex: v.to_string(), from, to, flows });
    }
    for s in &a.slow {
        let (w, at) = split_at(s)?;
        let (vi, range) = w.split_once('=').ok_or_else(|| bad(format!("`{s}`: expected VERTEX:I=LO-HI@AT")))?;
        let (vertex, instance) = vertex_instance(vi)?;
        let (lo, hi) = range.split_once('-').ok_or_else(|| bad(format!("`{s}`: expected LO-HI microseconds")))?;
        let lo = lo.parse().map_err(|_| bad(format!("`{s}`: LO must be a number")))?;
        let hi = hi.parse().map_err(|_| bad(format!("`{s}`: HI must be a number")))?;
        push(at, Action::Slow { vertex, instance, delay_us: (lo, hi) });
    }
    for s in &a.clone {
        let (w, at) = split_at(s)?;
        let (vertex, instance) = vertex_instance(w)?;
        push(at, Action::Clone { vertex, instance });
    }
    Ok(out)
}

pub fn cmd_verify(a: VerifyArgs) -> Result<(), Failure> {
    if let Some(dir) = &a.recorded {
        return if crate::record::verify_dir(dir, &a.part, a.json)? {
            Ok(())
        } else {
            Err(Failure {
                code: NOT_EQUIVALENT,
                error: anyhow::anyhow!("the recorded run's output differs from the logical chain's"),
            })
        };
    }
    let mut schedule = match &a.faults {
        Some(p) => FaultSchedule::load(p).map_err(|e| bad(e.to_string()))?,
        None => FaultSchedule::default(),
    };
    // Explicit flags override the schedule's `run:` section.
    let over = RunOptions {
        roots: a.roots,
        log: a.log.map(|l| if l == LogArg::Store { LogPlace::Store } else { LogPlace::Root }),
        async_delete: a.async_delete,
        checkpoint_every: a.checkpoint_every,
        limit: a.limit,
        ..RunOptions::default()
    };
    schedule.run = schedule.run.overridden_by(&over);
    let chain_path = run_file(&schedule, a.chain.as_deref(), schedule.run.chain.as_deref(), "--chain", "chain")?;
    let input = run_file(&schedule, a.input.as_deref(), schedule.run.input.as_deref(), "--input", "input")?;
    let chain = load_chain(&chain_path)?;
    schedule.events.extend(cli_events(&a)?);
    schedule.validate(&chain).map_err(|e| bad(e.to_string()))?;
    let packets = sluice_io::load(&input, schedule.run.limit.map(|l| l as usize))
        .with_context(|| format!("reading {}", input.display()))
        .map_err(fail(exit::BAD_INPUT))?;
    let backend = crate::store_cmd::open_store(&a.store, 1)?;
    let mark = sluice_runtime::store_claim::run_mark(&chain.name);
    sluice_runtime::store_claim::claim_store(&backend, &mark, a.fresh_store)
        .map_err(|e| fail(exit::FAILED)(anyhow::Error::new(e)))?;
    let switches = Switches {
        clocks: !a.off.contains(&Mechanism::Clocks),
        duplicate_suppression: !a.off.contains(&Mechanism::Dedup),
        move_protocol: !a.off.contains(&Mechanism::Move),
        xor_check: !a.off.contains(&Mechanism::Xor),
        record_nondeterminism: !a.off.contains(&Mechanism::Nondet),
    };
    let mut cfg = EngineConfig {
        arrival_ns: a.arrival_ns.max(1),
        service_ns: a.service_ns.max(1),
        log_capacity: a.log_capacity.max(1),
        switches,
        ..EngineConfig::default()
    };
    schedule.run.apply(&mut cfg);
    let registry = sluice_nfs::registry();
    let report =
        sluice_coe::verify::verify(&chain, &registry, &packets, &schedule, backend, cfg, &CompareOptions::default())
            .map_err(|e| fail(exit::FAILED)(e.into()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| fail(exit::FAILED)(e.into()))?);
    } else {
        print!("{}", report.render());
    }
    if report.equivalent {
        Ok(())
    } else {
        Err(Failure {
            code: NOT_EQUIVALENT,
            error: anyhow::anyhow!("the physical chain's output differs from the reference's"),
        })
    }
}
