//! `sluice bench-store`: what externalising NF state costs, measured in one process so that the
//! ratios between cases are comparable.
//!
//! Three parts, every one repeated `--repeat` times with the repeats interleaved (repeat 1 of
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

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use plotters::prelude::*;
use serde::Serialize;
use sluice_io::{FrameSize, GenConfig, Workload};
use sluice_packet::{InstanceId, Meta, Packet};
use sluice_redis::RedisBackend;
use sluice_runtime::{
    compile_with, run, Chain, DiscardSink, MemorySource, Overflow, RunConfig, RunHooks, RunReport, StateConfig,
};
use sluice_state::{StateKey, StateOp, Value};
use sluice_store::{Backend, ClientConfig, Connection, EmbeddedStore, Replies, Request, StoreKey, StoreOp};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The example chain (NAT → portscan → LB, Trojan detector off-path).
const EXAMPLE_CHAIN: &str = include_str!("../../../chains/example.yaml");

/// Prefix of the input given to the compiler to check that splits spread the load.
const SAMPLE: usize = 4_096;

/// How long a blocking store call may take before the benchmark gives up.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Ports in the shared pool of the offload/lock comparison (refilled when empty).
const POOL: i64 = 64;

/// Distinct keys the operations-per-second part spreads its requests over.
const OPS_KEYS: u64 = 1_000;

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
    /// Packets per batch.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Most packets in flight in the saturated runs.
    #[arg(long, default_value_t = 65_536)]
    pub window: usize,
    /// Most packets in flight in the paced runs (default: one batch).
    #[arg(long)]
    pub paced_window: Option<usize>,
    /// Shard threads of the embedded store in the mode cases.
    #[arg(long, default_value_t = 1)]
    pub store_threads: usize,
    /// Checkpoint the store this often in the mode cases, milliseconds (0: never; `sluice run`
    /// defaults to 150).
    #[arg(long, default_value_t = 150)]
    pub checkpoint_ms: u64,
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
    /// Run only these parts (`modes`, `contention`, `ops`; repeatable).
    #[arg(long, value_delimiter = ',')]
    pub parts: Vec<String>,
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

/// Where state lives in a mode case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum ModeKind {
    Local,
    External,
    Cached,
    Async,
}

impl ModeKind {
    const ALL: [ModeKind; 4] = [ModeKind::Local, ModeKind::External, ModeKind::Cached, ModeKind::Async];

    fn name(self) -> &'static str {
        match self {
            ModeKind::Local => "local",
            ModeKind::External => "external",
            ModeKind::Cached => "cached",
            ModeKind::Async => "async",
        }
    }

    fn client(self) -> Option<sluice_store::Mode> {
        match self {
            ModeKind::Local => None,
            ModeKind::External => Some(sluice_store::Mode::External),
            ModeKind::Cached => Some(sluice_store::Mode::Cached),
            ModeKind::Async => Some(sluice_store::Mode::Async),
        }
    }
}

/// The store of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum StoreKind {
    /// No store (`local`).
    None,
    Embedded,
    Redis,
}

impl StoreKind {
    fn name(self) -> &'static str {
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
enum Load {
    Saturated,
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
struct ModeSample {
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
struct ModeSummary {
    mpps: Stat,
    p5_us: Stat,
    p25_us: Stat,
    p50_us: Stat,
    p75_us: Stat,
    p95_us: Stat,
    p99_us: Stat,
    on_path_busy_ns: Stat,
    /// Per vertex: median busy Mpps.
    vertex_busy_mpps: BTreeMap<String, f64>,
}

/// A mode case's results.
#[derive(Debug, Clone, Serialize)]
struct ModeResult {
    name: String,
    nf: String,
    mode: ModeKind,
    store: StoreKind,
    load: Load,
    window: usize,
    packets: usize,
    /// NFs a packet crosses (the off-path Trojan detector excluded).
    on_path_nfs: usize,
    summary: ModeSummary,
    /// Median Mpps / median Mpps of `local` (same NF, same load).
    mpps_ratio_to_local: Option<f64>,
    /// Median p50 − median p50 of `local`, µs.
    added_p50_us: Option<f64>,
    /// `added_p50_us` / on-path NFs.
    added_p50_us_per_nf: Option<f64>,
    /// Added busy time per packet per on-path NF vs `local`, ns (service time, no queueing).
    added_busy_ns_per_nf: Option<f64>,
    repeats: Vec<ModeSample>,
}

/// Statistics of one side of the offload/lock comparison.
#[derive(Debug, Clone, Serialize)]
struct ContentionSample {
    /// Operations (port allocations) by both threads.
    ops: u64,
    wall_s: f64,
    ops_per_s: f64,
    p50_us: f64,
    p95_us: f64,
    p99_us: f64,
    /// Store requests per operation (lock retries included).
    requests_per_op: f64,
    /// Failed lock attempts per operation.
    lock_retries_per_op: f64,
}

/// One backend's offload/lock comparison.
#[derive(Debug, Clone, Serialize)]
struct ContentionResult {
    store: String,
    offload: Vec<ContentionSample>,
    lock_rmw: Vec<ContentionSample>,
    offload_ops_per_s: Stat,
    lock_rmw_ops_per_s: Stat,
    offload_p50_us: Stat,
    offload_p95_us: Stat,
    lock_rmw_p50_us: Stat,
    lock_rmw_p95_us: Stat,
    /// Median offload ops/s / median lock-RMW ops/s.
    throughput_ratio: f64,
    /// Median lock-RMW p50 / median offload p50.
    latency_ratio: f64,
}

/// Operations per second of one (store, operation, batch) or `redis-benchmark` line.
#[derive(Debug, Clone, Serialize)]
struct OpsResult {
    store: String,
    op: String,
    /// Requests per batch (`sluice`), or pipeline depth (`redis-benchmark -P`).
    batch: usize,
    /// `redis-benchmark` clients (`-c`); 1 for `sluice`'s single connection.
    clients: usize,
    ops_per_s: Stat,
    repeats: Vec<f64>,
}

/// Where the numbers were taken.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    #[serde(flatten)]
    base: crate::bench::Machine,
    redis_server: Option<String>,
}

/// An aim of the issue and whether it is met.
#[derive(Debug, Clone, Serialize)]
struct Aim {
    aim: String,
    case: String,
    value: f64,
    target: f64,
    met: bool,
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
    store_threads: usize,
    checkpoint_ms: u64,
    redis: Option<String>,
    /// Why parts did not run (`redis: not run: no --redis`, ...).
    not_run: Vec<String>,
    modes: Vec<ModeResult>,
    contention: Vec<ContentionResult>,
    ops: Vec<OpsResult>,
    aims: Vec<Aim>,
}

/// Runs `sluice bench-store`.
pub fn cmd_bench_store(a: BenchStoreArgs) -> Result<()> {
    let repeat = if a.quick { 1 } else { a.repeat };
    if repeat == 0 || a.flows == 0 || a.packets_per_flow == 0 || a.batch == 0 || a.window == 0 {
        bail!("--repeat, --flows, --packets-per-flow, --batch and --window must be positive");
    }
    if cfg!(debug_assertions) && !a.quick {
        eprintln!("sluice bench-store: warning: this is a debug build; use `cargo run --release` for real numbers");
    }
    let want = |p: &str| a.parts.is_empty() || a.parts.iter().any(|x| x == p);
    for p in &a.parts {
        if !["modes", "contention", "ops"].contains(&p.as_str()) {
            bail!("--parts takes modes, contention, ops; not `{p}`");
        }
    }
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let paced_window = a.paced_window.unwrap_or(a.batch).max(1);
    let mut not_run = Vec::new();
    let redis_arg = a.redis.clone().or_else(|| std::env::var("SLUICE_REDIS_URL").ok().filter(|s| !s.is_empty()));
    let redis = match (&redis_arg, a.quick) {
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
    };

    // The packets, generated once.
    let (flows, ppf) = if a.quick { (40, 50) } else { (a.flows, a.packets_per_flow) };
    let size: FrameSize = a.size.parse().map_err(|e| anyhow!("--size: {e}"))?;
    let workload = Workload::Custom { flows, packets_per_flow: ppf };
    let gcfg = GenConfig { size, ..GenConfig::new(workload, a.seed) };
    let packets: Vec<Packet> = sluice_io::generate(&gcfg)
        .map_err(|e| anyhow!("generating packets: {e}"))?
        .map(|(ts_ns, f)| Packet::from_slice(&f, Meta { ts_ns, ..Meta::default() }))
        .collect();
    if packets.is_empty() {
        bail!("the generator gave no packets");
    }

    let seq = AtomicU64::new(0);
    let env = Env { redis: redis.as_deref(), seq: &seq, store_threads: a.store_threads.max(1) };

    // Part 1: modes.
    let mut modes = Vec::new();
    if want("modes") {
        let cases = mode_cases(&a, redis.is_some(), packets.len())?;
        let registry = sluice_nfs::registry();
        let cfg_of = |load: Load| RunConfig {
            workers: a.workers.max(1),
            pin: !a.no_pin,
            batch: a.batch,
            window: if load == Load::Paced { paced_window } else { a.window },
            overflow: Overflow::Wait,
            root_id: 0,
            checkpoint_every: (a.checkpoint_ms > 0).then(|| Duration::from_millis(a.checkpoint_ms)),
        };
        if !a.quick {
            // One untimed run warms the allocator and the code paths.
            if let Some(c) = cases.first() {
                run_mode(c, &packets, &cfg_of(c.load), &registry, &env)?;
            }
        }
        let mut samples: Vec<Vec<ModeSample>> = cases.iter().map(|_| Vec::new()).collect();
        for r in 0..repeat {
            for (c, out) in cases.iter().zip(samples.iter_mut()) {
                let s = run_mode(c, &packets, &cfg_of(c.load), &registry, &env)
                    .with_context(|| format!("case {}", c.name))?;
                eprintln!("[modes {}/{}] {:<34} {:>8.3} Mpps  p50 {:>9.1} µs", r + 1, repeat, c.name, s.mpps, s.p50_us);
                out.push(s);
            }
        }
        modes = mode_results(&cases, samples, &a, paced_window);
    }

    // Part 2: offloaded operations vs lock-RMW.
    let mut contention = Vec::new();
    if want("contention") {
        let ops = if a.quick { 300 } else { a.contention_ops.max(1) };
        let mut stores: Vec<&str> = vec!["embedded"];
        if redis.is_some() {
            stores.push("redis");
        }
        let mut off: Vec<Vec<ContentionSample>> = vec![Vec::new(); stores.len()];
        let mut lck: Vec<Vec<ContentionSample>> = vec![Vec::new(); stores.len()];
        for r in 0..repeat {
            for (i, s) in stores.iter().enumerate() {
                let o = contend(&env, s, ops, false).with_context(|| format!("offload, {s}"))?;
                let l = contend(&env, s, ops, true).with_context(|| format!("lock-RMW, {s}"))?;
                eprintln!(
                    "[contention {}/{}] {:<9} offload {:>9.0} ops/s p50 {:>6.1} µs | lock-RMW {:>9.0} ops/s p50 {:>6.1} µs",
                    r + 1,
                    repeat,
                    s,
                    o.ops_per_s,
                    o.p50_us,
                    l.ops_per_s,
                    l.p50_us
                );
                off[i].push(o);
                lck[i].push(l);
            }
        }
        for ((s, o), l) in stores.iter().zip(off).zip(lck) {
            let st = |v: &[ContentionSample], f: fn(&ContentionSample) -> f64| Stat::of(v.iter().map(f));
            let (oo, lo) = (st(&o, |x| x.ops_per_s), st(&l, |x| x.ops_per_s));
            let (op50, lp50) = (st(&o, |x| x.p50_us), st(&l, |x| x.p50_us));
            contention.push(ContentionResult {
                store: s.to_string(),
                offload_ops_per_s: oo,
                lock_rmw_ops_per_s: lo,
                offload_p50_us: op50,
                offload_p95_us: st(&o, |x| x.p95_us),
                lock_rmw_p50_us: lp50,
                lock_rmw_p95_us: st(&l, |x| x.p95_us),
                throughput_ratio: ratio(oo.median, lo.median),
                latency_ratio: ratio(lp50.median, op50.median),
                offload: o,
                lock_rmw: l,
            });
        }
    }

    // Part 3: operations per second.
    let mut ops_results = Vec::new();
    if want("ops") {
        let n = if a.quick { 2_000 } else { a.ops.max(64) };
        let mut cases: Vec<(String, usize)> = vec![("embedded-1".into(), 1), ("embedded-2".into(), 2)];
        if redis.is_some() {
            cases.push(("redis".into(), 0));
        }
        let mut table: BTreeMap<(String, String, usize, usize), Vec<f64>> = BTreeMap::new();
        let mut order: Vec<(String, String, usize, usize)> = Vec::new();
        let mut push = |k: (String, String, usize, usize), v: f64| {
            if !table.contains_key(&k) {
                order.push(k.clone());
            }
            table.entry(k).or_default().push(v);
        };
        let bench_port = redis.as_deref().and_then(redis_port);
        let have_rb = which("redis-benchmark");
        if redis.is_some() && !have_rb {
            not_run.push("redis-benchmark: not run: not found on PATH".to_string());
        }
        for r in 0..repeat {
            for (store, threads) in &cases {
                let n = if *threads == 0 { a.redis_ops.max(64) } else { n };
                for (op, rate) in store_ops(&env, store, *threads, n)? {
                    eprintln!("[ops {}/{}] {:<11} {:<10} {:>11.0} ops/s", r + 1, repeat, store, op.0, rate);
                    push((store.clone(), op.0.to_string(), op.1, 1), rate);
                }
            }
            if let (Some(port), true) = (bench_port, have_rb) {
                for (clients, pipeline) in [(1usize, 1usize), (50, 64)] {
                    let n = if clients == 1 { a.redis_ops.max(1) } else { a.redis_benchmark_n.max(1) };
                    for (op, rate) in redis_benchmark(port, n, clients, pipeline)? {
                        eprintln!(
                            "[ops {}/{}] redis-benchmark -c {clients} -P {pipeline} {op:<5} {rate:>11.0} ops/s",
                            r + 1,
                            repeat
                        );
                        push(("redis-benchmark".into(), op, pipeline, clients), rate);
                    }
                }
            }
        }
        for k in order {
            let v = table.remove(&k).unwrap_or_default();
            ops_results.push(OpsResult {
                store: k.0,
                op: k.1,
                batch: k.2,
                clients: k.3,
                ops_per_s: Stat::of(v.iter().copied()),
                repeats: v,
            });
        }
    }

    let aims = check_aims(&modes);
    let result = BenchStoreResult {
        machine: machine_info(nproc, redis.as_deref()),
        command: crate::bench::command_line(),
        repeat,
        workload: format!("{flows} flows x {ppf} packets, size {}", a.size),
        packets: packets.len(),
        batch: a.batch,
        window: a.window,
        paced_window,
        workers: a.workers.max(1),
        store_threads: a.store_threads.max(1),
        checkpoint_ms: a.checkpoint_ms,
        redis,
        not_run,
        modes,
        contention,
        ops: ops_results,
        aims,
    };
    print_tables(&result);
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&result).context("serialising the results")?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    if let Some(path) = &a.plot {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        plot(path, &result).with_context(|| format!("drawing {}", path.display()))?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

/// `a / b`, or 0 when `b` is not positive.
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// What the measurements need to reach a store.
struct Env<'a> {
    /// The Redis URL, if the Redis cases run.
    redis: Option<&'a str>,
    /// Numbers fresh Redis keyspaces.
    seq: &'a AtomicU64,
    /// Shard threads of the embedded store in the mode cases.
    store_threads: usize,
}

impl Env<'_> {
    /// A Redis backend on a fresh keyspace.
    fn fresh_redis(&self) -> Result<Arc<RedisBackend>> {
        let url = self.redis.ok_or_else(|| anyhow!("no --redis"))?;
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let sep = if url.contains('?') { '&' } else { '?' };
        let full = format!("{url}{sep}prefix=bench-{}-{n}", std::process::id());
        Ok(Arc::new(RedisBackend::connect(&full).with_context(|| format!("connecting to {url}"))?))
    }
}

/// A chain of one NF between input and output.
fn single_nf_chain(kind: &str, config: &str) -> Result<Chain> {
    let config = if config.is_empty() { String::new() } else { format!("    config: {{ {config} }}\n") };
    let text = format!(
        "name: {kind}\nvertices:\n  {kind}:\n    type: {kind}\n    instances: 1\n{config}edges:\n  \
         - {{ from: input, to: {kind} }}\n  - {{ from: {kind}, to: output }}\n"
    );
    Chain::parse(&text, Path::new(&format!("<bench-store {kind}>"))).map_err(|e| anyhow!("{e}"))
}

/// Every mode case, in report order.
fn mode_cases(a: &BenchStoreArgs, with_redis: bool, packets: usize) -> Result<Vec<ModeCase>> {
    let chains: Vec<(&'static str, Chain)> = vec![
        ("nat", single_nf_chain("nat", "internal: [\"10.0.0.0/8\"]")?),
        ("lb", single_nf_chain("lb", "")?),
        ("example", Chain::parse(EXAMPLE_CHAIN, Path::new("chains/example.yaml")).map_err(|e| anyhow!("{e}"))?),
    ];
    let mut stores = vec![StoreKind::Embedded];
    if with_redis {
        stores.push(StoreKind::Redis);
    }
    let mut cases = Vec::new();
    for load in [Load::Saturated, Load::Paced] {
        for (nf, chain) in &chains {
            for mode in ModeKind::ALL {
                let ss: &[StoreKind] = if mode == ModeKind::Local { &[StoreKind::None] } else { &stores };
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
                    cases.push(ModeCase { name, nf, chain: chain.clone(), mode, store, load, packets: n });
                }
            }
        }
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
    let mut redis = None;
    let state = match c.mode.client() {
        None => StateConfig::Local,
        Some(mode) => {
            let backend: Arc<dyn Backend> = match c.store {
                StoreKind::Redis => {
                    let r = env.fresh_redis()?;
                    redis = Some(r.clone());
                    r
                }
                _ => Arc::new(EmbeddedStore::start(env.store_threads).context("starting the embedded store")?),
            };
            StateConfig::Store { backend, client: ClientConfig { mode, ..ClientConfig::default() } }
        }
    };
    let plan = compile_with(&c.chain, registry, &packets[..packets.len().min(SAMPLE)], &state)
        .map_err(|e| anyhow!("compiling {}: {e}", c.name))?;
    drop(state);
    let mut source = MemorySource::new(packets);
    let t = Instant::now();
    let report = run(plan, cfg, &mut source, &mut DiscardSink, RunHooks::default());
    let wall_s = t.elapsed().as_secs_f64();
    if let Some(r) = redis {
        r.clear().context("clearing the Redis keyspace")?;
    }
    Ok(mode_sample(&report?, wall_s))
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
                busy_mpps: if busy_s > 0.0 { packets_in as f64 / busy_s / 1e6 } else { 0.0 },
                busy_ns_per_packet: if packets_in > 0 { busy_s * 1e9 / packets_in as f64 } else { 0.0 },
                state,
            }
        })
        .collect();
    let on_path: f64 = vertices.iter().filter(|v| !v.off_path).map(|v| v.busy_s).sum();
    let l = &r.latency_us;
    ModeSample {
        mpps: if wall_s > 0.0 { r.packets_in as f64 / wall_s / 1e6 } else { 0.0 },
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
fn check_aims(modes: &[ModeResult]) -> Vec<Aim> {
    let mut aims = Vec::new();
    for r in modes.iter().filter(|r| r.mode == ModeKind::Async) {
        match (r.store, r.load) {
            (StoreKind::Embedded, Load::Saturated) => {
                let v = r.mpps_ratio_to_local.unwrap_or(0.0);
                aims.push(Aim {
                    aim: "async throughput >= 95% of local (embedded store)".into(),
                    case: r.name.clone(),
                    value: v,
                    target: 0.95,
                    met: v >= 0.95,
                });
            }
            (StoreKind::Redis, Load::Saturated) => {
                let v = r.mpps_ratio_to_local.unwrap_or(0.0);
                aims.push(Aim {
                    aim: "async throughput >= 50% of local (Redis)".into(),
                    case: r.name.clone(),
                    value: v,
                    target: 0.5,
                    met: v >= 0.5,
                });
            }
            (StoreKind::Embedded, Load::Paced) => {
                let v = r.added_p50_us_per_nf.unwrap_or(f64::INFINITY);
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

/// Sends `ops` as one batch, each with a reply, and waits for every answer (in `ops` order).
fn call(
    conn: &mut dyn Connection,
    me: InstanceId,
    number: &mut u64,
    next_id: &mut u64,
    ops: Vec<(StoreKey, StateOp)>,
) -> Result<Vec<Option<Value>>> {
    let first = *next_id + 1;
    let n = ops.len();
    let reqs: Vec<Request> = ops
        .into_iter()
        .map(|(key, op)| {
            *next_id += 1;
            Request { id: *next_id, client: me, tag: None, key, op: StoreOp::State(op), reply: true }
        })
        .collect();
    *number += 1;
    conn.send(*number, reqs.into()).map_err(|e| anyhow!("{e}"))?;
    let mut results: Vec<Option<Option<Value>>> = vec![None; n];
    let mut left = n;
    let mut replies = Replies::default();
    let deadline = Instant::now() + CALL_TIMEOUT;
    while left > 0 {
        conn.wait(&mut replies, Duration::from_millis(100)).map_err(|e| anyhow!("{e}"))?;
        for r in replies.responses.drain(..) {
            let Some(slot) = r.id.checked_sub(first).and_then(|i| results.get_mut(i as usize)) else {
                continue;
            };
            if slot.is_none() {
                left -= 1;
            }
            *slot = Some(r.result.map_err(|e| anyhow!("store error: {e}"))?);
        }
        replies.acked.clear();
        if left > 0 && Instant::now() > deadline {
            bail!("the store did not answer within {CALL_TIMEOUT:?}");
        }
    }
    Ok(results.into_iter().map(Option::flatten).collect())
}

/// A store, and the same store as Redis if it is one (to clear its keyspace afterwards).
type Store = (Arc<dyn Backend>, Option<Arc<RedisBackend>>);

/// A backend for parts 2 and 3: the embedded store with `threads` shards, or fresh Redis.
fn backend_of(env: &Env, store: &str, threads: usize) -> Result<Store> {
    if store.starts_with("redis") {
        let r = env.fresh_redis()?;
        Ok((r.clone(), Some(r)))
    } else {
        Ok((Arc::new(EmbeddedStore::start(threads.max(1)).context("starting the embedded store")?), None))
    }
}

/// Two NAT-like threads allocating ports from one shared pool: offloaded (`Pop` + `Incr`) or
/// under a lock (`CompareAndSet` lock, read, modify, write, `Delete` lock).
fn contend(env: &Env, store: &str, ops: usize, lock: bool) -> Result<ContentionSample> {
    let (backend, redis) = backend_of(env, store, 1)?;
    let key = |object: u16| StoreKey { vertex: 7, object, key: StateKey::Unit };
    let (pool_key, counter_key, lock_key) = (key(0), key(1), key(2));
    let full_pool = || Value::List((1..=POOL).map(|p| Value::Int(1024 + p)).collect());
    {
        let me = InstanceId::new(7, 99);
        let mut conn = backend.connect(me).map_err(|e| anyhow!("{e}"))?;
        let (mut number, mut id) = (0, 0);
        call(
            conn.as_mut(),
            me,
            &mut number,
            &mut id,
            vec![(pool_key, StateOp::Set(full_pool())), (counter_key, StateOp::Set(Value::Int(0)))],
        )?;
    }
    let threads = 2u16;
    let t0 = Instant::now();
    let results: Vec<Result<(Vec<u64>, u64, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let backend = backend.clone();
                s.spawn(move || -> Result<(Vec<u64>, u64, u64)> {
                    let me = InstanceId::new(7, t);
                    let mut conn = backend.connect(me).map_err(|e| anyhow!("{e}"))?;
                    let c = conn.as_mut();
                    let (mut number, mut id) = (0u64, 0u64);
                    let mut lat = Vec::with_capacity(ops);
                    let (mut requests, mut retries) = (0u64, 0u64);
                    let owner = Value::Int(100 + i64::from(t));
                    for _ in 0..ops {
                        let start = Instant::now();
                        if lock {
                            loop {
                                let cas = StateOp::CompareAndSet { expect: None, new: owner.clone() };
                                requests += 1;
                                let r = call(c, me, &mut number, &mut id, vec![(lock_key, cas)])?;
                                if r.first().cloned().flatten() == Some(Value::Int(1)) {
                                    break;
                                }
                                retries += 1;
                                std::hint::spin_loop();
                            }
                            let r = call(
                                c,
                                me,
                                &mut number,
                                &mut id,
                                vec![(pool_key, StateOp::Get), (counter_key, StateOp::Get)],
                            )?;
                            requests += 2;
                            let mut pool = match r.first().cloned().flatten() {
                                Some(Value::List(l)) if !l.is_empty() => l,
                                _ => match full_pool() {
                                    Value::List(l) => l,
                                    _ => Default::default(),
                                },
                            };
                            let _port = pool.pop_front();
                            let count = r.get(1).cloned().flatten().and_then(|v| v.as_int()).unwrap_or(0) + 1;
                            call(
                                c,
                                me,
                                &mut number,
                                &mut id,
                                vec![
                                    (pool_key, StateOp::Set(Value::List(pool))),
                                    (counter_key, StateOp::Set(Value::Int(count))),
                                ],
                            )?;
                            requests += 2;
                            call(c, me, &mut number, &mut id, vec![(lock_key, StateOp::Delete)])?;
                            requests += 1;
                        } else {
                            let r = call(c, me, &mut number, &mut id, vec![(pool_key, StateOp::Pop)])?;
                            requests += 1;
                            if r.first().cloned().flatten().is_none() {
                                // Empty pool: refill it (one request of POOL pushes).
                                let refill = (1..=POOL).map(|p| (pool_key, StateOp::Push(Value::Int(1024 + p))));
                                call(c, me, &mut number, &mut id, refill.collect())?;
                                requests += POOL as u64;
                                call(c, me, &mut number, &mut id, vec![(pool_key, StateOp::Pop)])?;
                                requests += 1;
                            }
                            call(c, me, &mut number, &mut id, vec![(counter_key, StateOp::Incr(1))])?;
                            requests += 1;
                        }
                        lat.push(start.elapsed().as_nanos() as u64);
                    }
                    Ok((lat, requests, retries))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a thread panicked")))).collect()
    });
    let wall_s = t0.elapsed().as_secs_f64();
    // Check that no allocation was lost: the counter equals the operations.
    let me = InstanceId::new(7, 98);
    let mut conn = backend.connect(me).map_err(|e| anyhow!("{e}"))?;
    let (mut number, mut id) = (0, 0);
    let count = call(conn.as_mut(), me, &mut number, &mut id, vec![(counter_key, StateOp::Get)])?;
    if let Some(r) = redis {
        r.clear().context("clearing the Redis keyspace")?;
    }
    let mut lat = Vec::new();
    let (mut requests, mut retries) = (0u64, 0u64);
    for r in results {
        let (l, q, t) = r?;
        lat.extend(l);
        requests += q;
        retries += t;
    }
    let total = lat.len() as u64;
    let counted = count.first().cloned().flatten().and_then(|v| v.as_int()).unwrap_or(-1);
    if counted != total as i64 {
        bail!("the shared counter is {counted} after {total} allocations: updates were lost");
    }
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |n| *n as f64 / 1e3);
    Ok(ContentionSample {
        ops: total,
        wall_s,
        ops_per_s: ratio(total as f64, wall_s),
        p50_us: pct(0.5),
        p95_us: pct(0.95),
        p99_us: pct(0.99),
        requests_per_op: ratio(requests as f64, total as f64),
        lock_retries_per_op: ratio(retries as f64, total as f64),
    })
}

/// A named operation generator.
type NamedOp = (&'static str, fn(u64) -> StateOp);

/// `get`, `set`, `incr` in batches of 1 and 64 over one connection: ((op, batch), ops/s).
fn store_ops(env: &Env, store: &str, threads: usize, n: usize) -> Result<Vec<((&'static str, usize), f64)>> {
    let (backend, redis) = backend_of(env, store, threads)?;
    let me = InstanceId::new(3, 0);
    let mut conn = backend.connect(me).map_err(|e| anyhow!("{e}"))?;
    let c = conn.as_mut();
    let ops: [NamedOp; 3] =
        [("set", |i| StateOp::Set(Value::Int(i as i64))), ("get", |_| StateOp::Get), ("incr", |_| StateOp::Incr(1))];
    let (mut number, mut id) = (0u64, 0u64);
    let mut out = Vec::new();
    for batch in [1usize, 64] {
        for (name, op) in &ops {
            let t = Instant::now();
            let mut done = 0u64;
            while done < n as u64 {
                let reqs: Vec<(StoreKey, StateOp)> = (0..batch as u64)
                    .map(|j| {
                        let key = StoreKey { vertex: 3, object: 0, key: StateKey::Id((done + j) % OPS_KEYS) };
                        (key, op(done + j))
                    })
                    .collect();
                call(c, me, &mut number, &mut id, reqs)?;
                done += batch as u64;
            }
            out.push(((*name, batch), ratio(done as f64, t.elapsed().as_secs_f64())));
        }
    }
    if let Some(r) = redis {
        r.clear().context("clearing the Redis keyspace")?;
    }
    Ok(out)
}

/// The port of a `redis://host:port...` URL.
fn redis_port(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("redis://")?;
    let hostport = rest.split(['/', '?']).next()?;
    let hostport = hostport.rsplit('@').next()?;
    hostport.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

/// Whether a program is on `PATH`.
fn which(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// Runs `redis-benchmark -t get,set,incr -q` on 127.0.0.1 and parses its requests per second.
fn redis_benchmark(port: u16, n: usize, clients: usize, pipeline: usize) -> Result<Vec<(String, f64)>> {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", "get,set,incr", "-n", &n.to_string(), "-q"])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .output()
        .context("running redis-benchmark")?;
    if !out.status.success() {
        bail!("redis-benchmark failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(parse_redis_benchmark(&String::from_utf8_lossy(&out.stdout)))
}

/// Parses `SET: 123456.79 requests per second, p50=0.207 msec` lines (progress lines, separated
/// by carriage returns, are skipped).
fn parse_redis_benchmark(text: &str) -> Vec<(String, f64)> {
    text.split(['\r', '\n'])
        .filter(|l| l.contains("requests per second"))
        .filter_map(|l| {
            let (op, rest) = l.split_once(':')?;
            let rate: f64 = rest.split_whitespace().next()?.parse().ok()?;
            Some((op.trim().to_ascii_lowercase(), rate))
        })
        .collect()
}

/// Prints the tables.
fn print_tables(r: &BenchStoreResult) {
    for n in &r.not_run {
        println!("{n}");
    }
    if !r.modes.is_empty() {
        println!(
            "\nmodes ({} packets, {}; batch {}, {} worker(s); sat = window {}, paced = window {}; medians of {}):",
            r.packets, r.workload, r.batch, r.workers, r.window, r.paced_window, r.repeat
        );
        println!(
            "{:<32} {:>8} {:>17} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "case", "Mpps", "(min..max)", "ratio", "p5 µs", "p25 µs", "p50 µs", "p75 µs", "p95 µs", "+p50/NF", "+ns/NF"
        );
        for m in &r.modes {
            let s = &m.summary;
            let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
            println!(
                "{:<32} {:>8.3} {:>17} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9} {:>9}",
                m.name,
                s.mpps.median,
                format!("({:.3}..{:.3})", s.mpps.min, s.mpps.max),
                opt(m.mpps_ratio_to_local, 2),
                s.p5_us.median,
                s.p25_us.median,
                s.p50_us.median,
                s.p75_us.median,
                s.p95_us.median,
                opt(m.added_p50_us_per_nf, 2),
                opt(m.added_busy_ns_per_nf, 0),
            );
        }
        println!(
            "ratio: Mpps / Mpps of local (same NF, same window). +p50/NF: (p50 - p50 of local) / on-path NFs, µs. \
             +ns/NF: added NF busy time per packet per on-path NF, ns."
        );
    }
    for c in &r.contention {
        println!("\noffloaded operations vs lock-read-modify-write, {} store, 2 threads:", c.store);
        println!(
            "  offload  {:>10.0} ops/s ({:.0}..{:.0})  p50 {:>7.1} µs  p95 {:>7.1} µs",
            c.offload_ops_per_s.median,
            c.offload_ops_per_s.min,
            c.offload_ops_per_s.max,
            c.offload_p50_us.median,
            c.offload_p95_us.median
        );
        println!(
            "  lock-RMW {:>10.0} ops/s ({:.0}..{:.0})  p50 {:>7.1} µs  p95 {:>7.1} µs",
            c.lock_rmw_ops_per_s.median,
            c.lock_rmw_ops_per_s.min,
            c.lock_rmw_ops_per_s.max,
            c.lock_rmw_p50_us.median,
            c.lock_rmw_p95_us.median
        );
        println!(
            "  offload / lock-RMW: throughput x{:.2}, lock-RMW p50 / offload p50 x{:.2}",
            c.throughput_ratio, c.latency_ratio
        );
    }
    if !r.ops.is_empty() {
        println!("\nstore operations per second (median, min..max):");
        println!("{:<16} {:<5} {:>6} {:>8} {:>12} {:>25}", "store", "op", "batch", "clients", "ops/s", "(min..max)");
        for o in &r.ops {
            println!(
                "{:<16} {:<5} {:>6} {:>8} {:>12.0} {:>25}",
                o.store,
                o.op,
                o.batch,
                o.clients,
                o.ops_per_s.median,
                format!("({:.0}..{:.0})", o.ops_per_s.min, o.ops_per_s.max)
            );
        }
        println!("batch: requests per batch (sluice) or pipeline depth -P (redis-benchmark).");
    }
    if !r.aims.is_empty() {
        println!("\naims:");
        for a in &r.aims {
            println!(
                "  {:<70} {:<26} {:>8.3} (target {}) -> {}",
                a.aim,
                a.case,
                a.value,
                a.target,
                if a.met { "met" } else { "NOT met" }
            );
        }
    }
}

/// The machine as `sluice bench` describes it, plus the Redis version.
fn machine_info(nproc: usize, redis: Option<&str>) -> Machine {
    let version = || {
        let out = std::process::Command::new("redis-server").arg("--version").output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    Machine { base: crate::bench::machine_info(nproc), redis_server: redis.and_then(|_| version()) }
}

/// Colour of a mode.
fn mode_colour(m: ModeKind) -> RGBColor {
    match m {
        ModeKind::Local => RGBColor(0, 0, 0),
        ModeKind::External => RGBColor(214, 39, 40),
        ModeKind::Cached => RGBColor(31, 119, 180),
        ModeKind::Async => RGBColor(44, 160, 44),
    }
}

/// Draws CHC's Figure 8 per NF and load (x: percentile, y: µs on a log scale, one line per mode
/// and store; embedded solid with dots, Redis pale with triangles), then throughput ratios to
/// `local` as bars.
fn plot(path: &Path, r: &BenchStoreResult) -> Result<()> {
    let e = |e: &dyn std::fmt::Display| anyhow!("{e}");
    let base = SVGBackend::new(path, (1500, 1150)).into_drawing_area();
    base.fill(&WHITE).map_err(|x| e(&x))?;
    let title = format!(
        "sluice bench-store: {} ({} packets), medians of {} ({}; {} cores)",
        r.workload, r.packets, r.repeat, r.machine.base.cpu_model, r.machine.base.nproc
    );
    let root = base.titled(&title, ("sans-serif", 18)).map_err(|x| e(&x))?;
    let (lat_area, bar_area) = root.split_vertically(760);
    let panels = lat_area.split_evenly((2, 3));
    let nfs = ["nat", "lb", "example"];
    let pcts = [5.0, 25.0, 50.0, 75.0, 95.0];
    for (pi, panel) in panels.iter().enumerate() {
        let load = if pi < 3 { Load::Saturated } else { Load::Paced };
        let nf = nfs[pi % 3];
        let cases: Vec<&ModeResult> = r.modes.iter().filter(|m| m.nf == nf && m.load == load).collect();
        let vals = |m: &ModeResult| {
            let s = &m.summary;
            [s.p5_us.median, s.p25_us.median, s.p50_us.median, s.p75_us.median, s.p95_us.median]
        };
        let lo = cases.iter().flat_map(|m| vals(m)).filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
        let hi = cases.iter().flat_map(|m| vals(m)).fold(0.0f64, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > lo { (lo / 1.3, hi * 1.3) } else { (0.1, 10.0) };
        let caption = match load {
            Load::Saturated => format!("{nf}: latency at saturation (window {})", r.window),
            Load::Paced => format!("{nf}: latency paced (window {})", r.paced_window),
        };
        let mut chart = ChartBuilder::on(panel)
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(55)
            .caption(caption, ("sans-serif", 14))
            .build_cartesian_2d(0f64..100f64, (lo..hi).log_scale())
            .map_err(|x| e(&x))?;
        chart.configure_mesh().x_desc("percentile").y_desc("µs").draw().map_err(|x| e(&x))?;
        for m in &cases {
            let colour = mode_colour(m.mode);
            let pts: Vec<(f64, f64)> = pcts.iter().zip(vals(m)).map(|(p, v)| (*p, v.clamp(lo, hi))).collect();
            let label = if m.store == StoreKind::None {
                m.mode.name().to_string()
            } else {
                format!("{} {}", m.mode.name(), m.store.name())
            };
            if m.store == StoreKind::Redis {
                let style = colour.mix(0.5).stroke_width(2);
                chart
                    .draw_series(LineSeries::new(pts.clone(), style))
                    .map_err(|x| e(&x))?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], style));
                chart
                    .draw_series(pts.iter().map(|p| TriangleMarker::new(*p, 4, colour.mix(0.5).filled())))
                    .map_err(|x| e(&x))?;
            } else {
                let style = colour.stroke_width(2);
                chart
                    .draw_series(LineSeries::new(pts.clone(), style))
                    .map_err(|x| e(&x))?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], style));
                chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, colour.filled()))).map_err(|x| e(&x))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 10))
            .draw()
            .map_err(|x| e(&x))?;
    }

    // Throughput ratios to local, saturated and paced.
    let bars: Vec<&ModeResult> = r.modes.iter().filter(|m| m.mode != ModeKind::Local).collect();
    let n = bars.len().max(1);
    let ymax = bars.iter().filter_map(|m| m.mpps_ratio_to_local).fold(1.1f64, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&bar_area)
        .margin(10)
        .x_label_area_size(150)
        .y_label_area_size(55)
        .caption(
            "throughput / throughput of local (bars: median; green async, blue cached, red external; pale: Redis; \
             black line at 1, grey lines at 0.95 and 0.5)",
            ("sans-serif", 14),
        )
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax)
        .map_err(|x| e(&x))?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).y_desc("ratio to local").draw().map_err(|x| e(&x))?;
    for (i, m) in bars.iter().enumerate() {
        let v = m.mpps_ratio_to_local.unwrap_or(0.0);
        let colour = mode_colour(m.mode);
        let style = if m.store == StoreKind::Redis { colour.mix(0.45).filled() } else { colour.filled() };
        chart
            .draw_series(std::iter::once(Rectangle::new([(i as f64 + 0.1, 0.0), (i as f64 + 0.9, v)], style)))
            .map_err(|x| e(&x))?;
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        let style = TextStyle::from(("sans-serif", 10).into_font()).transform(FontTransform::Rotate270);
        base.draw(&Text::new(m.name.clone(), (px - 5, py + 140), style)).map_err(|x| e(&x))?;
    }
    for (level, colour) in [(1.0, BLACK), (0.95, RGBColor(120, 120, 120)), (0.5, RGBColor(120, 120, 120))] {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, level), (n as f64, level)],
                colour.stroke_width(1),
            )))
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_benchmark_output() {
        let text = "SET: rps=0.0 (overall: nan) avg_msec=nan (overall: nan)\r\
                    SET: 94696.97 requests per second, p50=0.263 msec\n\
                    GET: 101010.10 requests per second, p50=0.247 msec\n\
                    INCR: 99009.90 requests per second\n";
        let v = parse_redis_benchmark(text);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].0, "set");
        assert!((v[1].1 - 101010.10).abs() < 1e-6);
    }

    #[test]
    fn redis_port_of_urls() {
        assert_eq!(redis_port("redis://127.0.0.1:6390"), Some(6390));
        assert_eq!(redis_port("redis://127.0.0.1:6390/0?prefix=x"), Some(6390));
        assert_eq!(redis_port("redis://127.0.0.1"), None);
    }

    #[test]
    fn chains_parse() {
        assert!(single_nf_chain("nat", "internal: [\"10.0.0.0/8\"]").is_ok());
        assert!(single_nf_chain("lb", "").is_ok());
    }
}
