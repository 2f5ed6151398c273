//! `sluice bench-store`: what externalising NF state costs, measured in one process so that the
//! ratios between cases are comparable.
//!
//! Four parts, every one repeated `--repeat` times with the repeats interleaved (repeat 1 of
//! every case, then repeat 2, ...), reported as median and min–max:
//!
//! 1. **Modes**: NAT, LB and the example chain over packets held in memory (generated with
//!    `sluice_io`: 2,000 flows of 50 packets, `mix` sizes by default), with state `local` and in
//!    the store in the `external`, `cached` and `async` modes, with the embedded store and (with
//!    `--redis`) Redis. Each case runs twice: at saturation (the root keeps `--window` packets in
//!    flight, so latency measures the backlog) and **paced** (window = one batch, so a packet's
//!    trip is the service time of its batch: the added latency of a mode is
//!    `p50(mode) - p50(local)`). Throughput is given as a ratio to `local`.
//! 2. **Offloaded operations vs lock–read–modify–write**: two threads, each a NAT-like instance,
//!    share a port pool and a counter in the store. Offloaded: `Pop` on the pool and `Incr` on
//!    the counter, one blocking request each. Lock-RMW (the StatelessNF/OpenNF way): take a lock
//!    key with `CompareAndSet` (spinning), read pool and counter, modify them locally, write them
//!    back, release the lock with `Delete`.
//! 3. **Store operations per second**: `get`, `set`, `incr` through a raw [`Connection`] in
//!    batches of 1 and 64, for the embedded store (1 and 2 shard threads) and Redis, next to
//!    `redis-benchmark` run as a subprocess on the same server.
//! 4. **Failover**: NAT alone and the example chain, fault tolerant, fed at `--failover-rate`
//!    packets per second; the NAT instance crashes halfway: the recovery time and the time
//!    until latency is back to normal.
//! 5. **Flow move** (`move`): 4,000 flows of the NAT moved to a second instance halfway.
//! 6. **Open-loop latency** (`open-loop`): NAT, LB, IDS and the example chain, state local, in
//!    the embedded store and with fault tolerance, offered packets at fixed fractions of their
//!    own peak (`--loads`): p50, p99 and p99.9.
//!
//! [`Connection`]: sluice_store::Connection

mod contention;
mod failover;
mod modes;
mod moves;
mod open_loop;
mod ops;
mod report;
mod store;

use crate::bench::common::{available_cores, generate_packets, warn_if_debug_build, write_json, write_plot};
use crate::bench::machine::command_line;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use contention::{run_contention, ContentionResult};
use failover::{run_failover, FailoverResult};
use modes::{check_aims, run_modes, Aim, ModeResult};
use moves::{run_moves, MoveResult};
use open_loop::{run_open_loop, OpenLoopResult};
use ops::{run_ops, OpsResult};
use report::{plot, print_tables};
use serde::Serialize;
use sluice_io::{FrameSize, GenConfig, Workload};
use sluice_runtime::Overflow;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use store::Env;

/// Arguments of `sluice bench-store`.
#[derive(Args, Debug)]
pub struct BenchStoreArgs {
    /// Flows generated for the mode cases (each of `--packets-per-flow` packets).
    #[arg(long, default_value_t = 2_000)]
    pub flows: u64,
    /// Packets per generated flow.
    #[arg(long, default_value_t = 50)]
    pub packets_per_flow: u32,
    /// Generated frame size: `mix` or a byte count (64..=1500).
    #[arg(long, default_value = "mix")]
    pub size: String,
    /// Most packets a Redis case runs (`cached` and `async`; tens of µs per round trip).
    #[arg(long, default_value_t = 20_000)]
    pub redis_packets: usize,
    /// Most packets a case `external` with Redis runs (one round trip per state operation).
    #[arg(long, default_value_t = 10_000)]
    pub external_redis_packets: usize,
    /// Runs per case; the median, min and max are reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Redis server (`redis://127.0.0.1:6390`): adds the Redis cases. Each run uses a fresh
    /// keyspace (`prefix=bench-<pid>-<n>`), cleared afterwards. Default: `$SLUICE_REDIS_URL`.
    #[arg(long)]
    pub redis: Option<String>,
    /// Worker threads of the mode cases.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Root threads of the mode cases (`sluice run --roots`): the input is split over them by
    /// source address.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    pub roots: u8,
    /// Packets per batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Most packets in flight in the saturated runs (and the failover part). The default is
    /// what `sluice run` gives input that waits for room (files, memory): 4,096.
    #[arg(long, default_value_t = Overflow::Wait.default_window())]
    pub window: usize,
    /// Most packets in flight in the paced runs (default: one batch).
    #[arg(long)]
    pub paced_window: Option<usize>,
    /// Shard threads of the embedded store in the mode cases.
    #[arg(long, default_value_t = 1)]
    pub store_threads: usize,
    /// Operations per thread in the offload/lock comparison.
    #[arg(long, default_value_t = 20_000)]
    pub contention_ops: usize,
    /// Operations per measurement of the operations-per-second part (embedded store).
    #[arg(long, default_value_t = 100_000)]
    pub ops: usize,
    /// Operations per measurement through a Redis connection, and `redis-benchmark -n` with
    /// one client.
    #[arg(long, default_value_t = 20_000)]
    pub redis_ops: usize,
    /// Requests per measurement of `redis-benchmark` with 50 clients and `-P 64` (`-n`).
    #[arg(long, default_value_t = 100_000)]
    pub redis_benchmark_n: usize,
    /// Packets per second the failover part feeds its chains (open loop; the example chain
    /// with fault tolerance saturates at about 0.3 Mpps on two cores).
    #[arg(long, default_value_t = 50_000.0)]
    pub failover_rate: f64,
    /// Loads of the open-loop part, in percent of each configuration's peak.
    #[arg(long, value_delimiter = ',', default_values_t = [50, 90])]
    pub loads: Vec<u32>,
    /// Run only these parts (`modes`, `contention`, `ops`, `failover`, `move`, `open-loop`;
    /// repeatable).
    #[arg(long, value_delimiter = ',')]
    pub parts: Vec<String>,
    /// Run only the mode cases (and open-loop configurations) whose name contains one of these
    /// (e.g. `nat/async`, `/sat`, `ids/`; repeatable). A ratio whose baseline case was left out
    /// is not reported.
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
    /// Fast smoke run: 2,000 packets, 1 repeat, embedded store only, few operations.
    #[arg(long)]
    pub quick: bool,
    /// Write every result (machine, command line, all repeats, medians, ratios) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw latency percentiles per mode per NF and throughput ratios into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Do not pin worker threads to cores.
    #[arg(long)]
    pub no_pin: bool,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Where the numbers were taken.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    #[serde(flatten)]
    base: crate::bench::machine::Machine,
    redis_server: Option<String>,
}

/// Everything `--json` writes.
#[derive(Debug, Clone, Serialize)]
struct BenchStoreResult {
    machine: Machine,
    command: String,
    repeat: usize,
    workload: String,
    packets: usize,
    batch: usize,
    window: usize,
    paced_window: usize,
    workers: usize,
    roots: u8,
    store_threads: usize,
    redis: Option<String>,
    /// Why parts did not run (`redis: not run: no --redis`, ...).
    not_run: Vec<String>,
    modes: Vec<ModeResult>,
    contention: Vec<ContentionResult>,
    ops: Vec<OpsResult>,
    failover: Vec<FailoverResult>,
    moves: Vec<MoveResult>,
    open_loop: Vec<OpenLoopResult>,
    aims: Vec<Aim>,
}

/// Runs `sluice bench-store`.
pub fn cmd_bench_store(a: BenchStoreArgs) -> Result<()> {
    let repeat = if a.quick { 1 } else { a.repeat };
    if repeat == 0 || a.flows == 0 || a.packets_per_flow == 0 || a.batch == 0 || a.window == 0 {
        bail!("--repeat, --flows, --packets-per-flow, --batch and --window must be positive");
    }
    warn_if_debug_build("bench-store", a.quick);
    let want = |p: &str| a.parts.is_empty() || a.parts.iter().any(|x| x == p);
    for p in &a.parts {
        if !["modes", "contention", "ops", "failover", "move", "open-loop"].contains(&p.as_str()) {
            bail!("--parts takes modes, contention, ops, failover, move, open-loop; not `{p}`");
        }
    }
    let nproc = available_cores();
    let paced_window = a.paced_window.unwrap_or(a.batch).max(1);
    let mut not_run = Vec::new();
    let redis = redis_url(&a, &mut not_run)?;

    // The packets, generated once.
    let (flows, ppf) = if a.quick { (40, 50) } else { (a.flows, a.packets_per_flow) };
    let size: FrameSize = a.size.parse().map_err(|e| anyhow!("--size: {e}"))?;
    let workload = Workload::Custom { flows, packets_per_flow: ppf };
    let gcfg = GenConfig { size, ..GenConfig::new(workload, a.seed) };
    let packets = generate_packets(&gcfg).map_err(|e| anyhow!("generating packets: {e}"))?;
    if packets.is_empty() {
        bail!("the generator gave no packets");
    }

    let seq = AtomicU64::new(0);
    let env = Env { redis: redis.as_deref(), seq: &seq, store_threads: a.store_threads.max(1) };
    let modes = if want("modes") { run_modes(&a, &env, &packets, repeat, paced_window)? } else { Vec::new() };
    let contention = if want("contention") {
        let ops = if a.quick { 300 } else { a.contention_ops.max(1) };
        run_contention(&env, repeat, ops)?
    } else {
        Vec::new()
    };
    let ops_results = if want("ops") { run_ops(&a, &env, repeat, &mut not_run)? } else { Vec::new() };
    let failover = if want("failover") { run_failover(&a, &env, &packets, repeat)? } else { Vec::new() };
    let moves = if want("move") { run_moves(&a, &env, repeat)? } else { Vec::new() };
    let open_loop = if want("open-loop") { run_open_loop(&a, &env, &packets, repeat)? } else { Vec::new() };

    let mut aims = check_aims(&modes);
    aims.extend(open_loop::check_aims(&open_loop));
    let result = BenchStoreResult {
        machine: machine_info(nproc, redis.as_deref()),
        command: command_line(),
        repeat,
        workload: format!("{flows} flows x {ppf} packets, size {}", a.size),
        packets: packets.len(),
        batch: a.batch,
        window: a.window,
        paced_window,
        workers: a.workers.max(1),
        roots: a.roots,
        store_threads: a.store_threads.max(1),
        redis,
        not_run,
        modes,
        contention,
        ops: ops_results,
        failover,
        moves,
        open_loop,
        aims,
    };
    print_tables(&result);
    if let Some(path) = &a.json {
        write_json(path, &result)?;
    }
    if let Some(path) = &a.plot {
        write_plot(path, |p| plot(p, &result))?;
    }
    Ok(())
}

/// The Redis server of the Redis cases: `--redis`, else `$SLUICE_REDIS_URL`; `None` (and why,
/// in `not_run`) with `--quick` or without either.
fn redis_url(a: &BenchStoreArgs, not_run: &mut Vec<String>) -> Result<Option<String>> {
    let redis_arg = a.redis.clone().or_else(|| std::env::var("SLUICE_REDIS_URL").ok().filter(|s| !s.is_empty()));
    Ok(match (&redis_arg, a.quick) {
        (_, true) => {
            not_run.push("redis: not run: --quick (embedded store only)".to_string());
            None
        }
        (None, false) => {
            not_run.push("redis: not run: no --redis (nor SLUICE_REDIS_URL)".to_string());
            None
        }
        (Some(u), false) => {
            if !u.starts_with("redis://") {
                bail!("--redis takes a single-node URL redis://host:port, not `{u}`");
            }
            Some(u.clone())
        }
    })
}

/// The machine as `sluice bench` describes it, plus the Redis version.
fn machine_info(nproc: usize, redis: Option<&str>) -> Machine {
    let version = || {
        let out = std::process::Command::new("redis-server").arg("--version").output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    Machine { base: crate::bench::machine::machine_info(nproc), redis_server: redis.and_then(|_| version()) }
}
