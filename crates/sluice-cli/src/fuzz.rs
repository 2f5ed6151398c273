//! `sluice fuzz`: many random runs (schedule and run options drawn from a seed) over chains
//! and traces, each checked like `sluice verify`; failures are printed with their seed and
//! schedule, grouped by symptom, and optionally shrunk to minimal regression files.

use crate::{exit, fail, load_chain, Failure};
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sluice_coe::fuzz::{self, Outcome, RegressionHeader, Shrinker, StoreFactory, Target};
use sluice_coe::observed::Observed;
use sluice_coe::schedule::{FaultSchedule, RANDOM_MAX_EVENTS};
use sluice_nf::NfRegistry;
use sluice_packet::Packet;
use sluice_runtime::Chain;
use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Args)]
#[command(after_help = "Run i (0 <= i < N) uses seed SEED+i, chain i mod C and trace (i / C) mod T. Every run \
draws its own schedule (1 to --max-events events of every kind on every vertex, several at one point at times) and \
run options (roots 1-3, log at the root or in the store, asynchronous delete on or off, checkpoints every 0, 500 \
or 10000 packets), leaving out only the combinations the protocols cannot recover from (docs/faults.md, \
\"Random runs\"). A run fails when `verify` finds it not equivalent or packets are left in the root's log, unless it met a failure CHC cannot recover from (an instance failing with packets whose log entries were lost in a root or store crash): such a run is reported as outside the guarantee, neither pass nor failure.\n\
Examples:\n  sluice fuzz --chain chains/example.yaml --input traces/demo.pcap --n 200\n  \
sluice fuzz --chain chains/example.yaml --chain chains/nat-portscan.yaml --input traces/demo.pcap --n 1000 --jobs 2 \
--shrink faults/regressions\n\
Exit codes: 0 every run equivalent; 4 some run failed; 1 a run could not be made; 2 bad command line or chain; \
3 bad trace.")]
pub struct FuzzArgs {
    /// Chain file (YAML); repeatable: runs take the chains in turn.
    #[arg(long, short, required = true)]
    chain: Vec<PathBuf>,
    /// Input trace (pcap or pcapng); repeatable: runs take the traces in turn.
    #[arg(long, short, required = true)]
    input: Vec<PathBuf>,
    /// Number of random runs.
    #[arg(long, default_value_t = 100)]
    n: u64,
    /// The first run's seed; run i uses SEED+i.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The physical chain's store: `embedded`, `redis://host:port` (each run in its own key
    /// prefix, wiped afterwards) or `sluice://host:port[?token=T]` (each run in a space of
    /// its own, dropped afterwards).
    #[arg(long, default_value = "embedded")]
    store: String,
    /// Runs at a time.
    #[arg(long, short, default_value_t = 1)]
    jobs: usize,
    /// Most events per schedule.
    #[arg(long, default_value_t = RANDOM_MAX_EVENTS)]
    max_events: usize,
    /// Use only the first this many packets of every trace.
    #[arg(long)]
    limit: Option<usize>,
    /// Shrink the first failure of every symptom class to a minimal run and write it to this
    /// directory as `<chain>-<symptom>-s<seed>.yaml` (a schedule file with a `run:` section and
    /// a header saying how to reproduce it).
    #[arg(long)]
    shrink: Option<PathBuf>,
    /// Most runs spent shrinking one failure.
    #[arg(long, default_value_t = 150)]
    shrink_budget: usize,
    /// Print the result as JSON on stdout (every failure with its seed, symptoms and schedule).
    #[arg(long)]
    json: bool,
    /// Do not show progress (a bar on a terminal, otherwise a line on stderr every 5 % of
    /// the runs).
    #[arg(long, short)]
    quiet: bool,
    /// Print every run's seed, chain, trace and schedule as YAML without running anything (to see
    /// what a seed does, or to turn a run into a schedule file for `sluice verify --faults`).
    #[arg(long)]
    dry_run: bool,
}

/// One chain and one trace, with the reference run over the trace (made once, on first use).
struct Input {
    chain_path: PathBuf,
    chain: Chain,
    trace_path: PathBuf,
    packets: Vec<Packet>,
    reference: Mutex<Option<Arc<Observed>>>,
}

/// A failing run.
#[derive(serde::Serialize)]
struct FailedRun {
    seed: u64,
    chain: String,
    input: String,
    outcome: Outcome,
    schedule: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    shrunk_to: Option<String>,
}

/// Exit code for "some run is not equivalent".
const NOT_EQUIVALENT: u8 = 4;

fn store_factory(spec: &str) -> Result<Box<StoreFactory<'static>>, Failure> {
    if spec == "embedded" {
        return Ok(Box::new(|_| {
            sluice_store::EmbeddedStore::start(1)
                .map(|s| Arc::new(s) as Arc<dyn sluice_store::Backend>)
                .map_err(|e| e.to_string())
        }));
    }
    let base = spec.to_string();
    let pid = std::process::id();
    if spec.starts_with("sluice://") {
        // Every run in a fresh space of the served store.
        crate::store_cmd::check_store_url(spec)?;
        return Ok(Box::new(move |tag| {
            let sep = if base.contains('?') { '&' } else { '?' };
            let url = format!("{base}{sep}space=fuzz-{pid}-{tag}&ephemeral=1");
            let b = sluice_store_remote::RemoteBackend::connect(&url).map_err(|e| e.to_string())?;
            Ok(Arc::new(b) as Arc<dyn sluice_store::Backend>)
        }));
    }
    if !spec.starts_with("redis://") {
        return Err(fail(exit::INVALID)(anyhow::anyhow!(
            "--store takes `embedded`, `redis://host:port` or `sluice://host:port`, not `{spec}`"
        )));
    }
    Ok(Box::new(move |tag| {
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}prefix=fuzz-{pid}-{tag}");
        let b = sluice_redis::RedisBackend::connect(&url).map_err(|e| e.to_string())?;
        b.clear().map_err(|e| e.to_string())?;
        Ok(Arc::new(b) as Arc<dyn sluice_store::Backend>)
    }))
}

fn load_inputs(a: &FuzzArgs) -> Result<Vec<Input>, Failure> {
    let mut traces = Vec::new();
    for t in &a.input {
        let p = sluice_io::load(t, a.limit)
            .with_context(|| format!("reading {}", t.display()))
            .map_err(fail(exit::BAD_INPUT))?;
        traces.push((t.clone(), p));
    }
    let mut out = Vec::new();
    for (trace_path, packets) in &traces {
        for c in &a.chain {
            out.push(Input {
                chain_path: c.clone(),
                chain: load_chain(c)?,
                trace_path: trace_path.clone(),
                packets: packets.clone(),
                reference: Mutex::new(None),
            });
        }
    }
    Ok(out)
}

impl Input {
    fn reference(&self, registry: &NfRegistry) -> anyhow::Result<Arc<Observed>> {
        let mut slot = self.reference.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = slot.as_ref() {
            return Ok(r.clone());
        }
        let target = Target { chain: &self.chain, registry, packets: &self.packets };
        let r = Arc::new(fuzz::reference(&target, &self.packets)?);
        *slot = Some(r.clone());
        Ok(r)
    }
}

fn progress(quiet: bool, n: u64) -> Option<ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let style =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} runs, {msg} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    Some(ProgressBar::new(n).with_style(style))
}

pub fn cmd_fuzz(a: FuzzArgs) -> Result<(), Failure> {
    let inputs = load_inputs(&a)?;
    if a.dry_run {
        print_schedules(&a, &inputs);
        return Ok(());
    }
    let store = store_factory(&a.store)?;
    let registry = sluice_nfs::registry();
    let pb = progress(a.quiet, a.n);
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let line_every = (a.n / 20).clamp(1, 250);
    let started = std::time::Instant::now();
    let failed = AtomicUsize::new(0);
    let failures: Mutex<Vec<FailedRun>> = Mutex::new(Vec::new());
    let error: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    let run_one = |i: u64| -> anyhow::Result<Option<FailedRun>> {
        let Some(input) = inputs.get((i % inputs.len().max(1) as u64) as usize) else { return Ok(None) };
        let seed = a.seed.wrapping_add(i);
        let schedule = FaultSchedule::random(seed, &input.chain, input.packets.len() as u64, a.max_events);
        let reference = input.reference(&registry)?;
        let target = Target { chain: &input.chain, registry: &registry, packets: &input.packets };
        let outcome = fuzz::check(&target, &schedule, &reference, &*store, seed)
            .with_context(|| format!("seed {seed}: the run could not be made"))?;
        Ok((outcome.failed() || outcome.outside_guarantee()).then(|| FailedRun {
            seed,
            chain: input.chain_path.display().to_string(),
            input: input.trace_path.display().to_string(),
            outcome,
            schedule: schedule.to_yaml(),
            shrunk_to: None,
        }))
    };
    std::thread::scope(|scope| {
        for _ in 0..a.jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= a.n || error.lock().map(|e| e.is_some()).unwrap_or(true) {
                    break;
                }
                match run_one(i) {
                    Ok(Some(f)) => {
                        let n = failed.fetch_add(1, Ordering::Relaxed) + 1;
                        // Named as soon as it is known: a long run may be stopped before its
                        // report.
                        let what = if f.outcome.outside_guarantee() { "outside the guarantee" } else { "failed" };
                        let line = format!("sluice fuzz: seed {} {what} ({})", f.seed, f.chain);
                        if let Some(pb) = &pb {
                            pb.set_message(format!("{n} failed"));
                            pb.println(line);
                        } else if !a.quiet {
                            eprintln!("{line}");
                        }
                        failures.lock().unwrap_or_else(|e| e.into_inner()).push(f);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        *error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    }
                }
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                if let Some(pb) = &pb {
                    pb.inc(1);
                } else if !a.quiet && finished.is_multiple_of(line_every) {
                    // No terminal (CI, a log file): a line now and then instead of a bar.
                    eprintln!(
                        "sluice fuzz: {finished}/{} runs, {} failed or outside the guarantee, {:.0} s",
                        a.n,
                        failed.load(Ordering::Relaxed),
                        started.elapsed().as_secs_f64()
                    );
                }
            });
        }
    });
    if let Some(pb) = &pb {
        pb.finish_and_clear();
    }
    if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(fail(exit::FAILED)(e));
    }
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort_by_key(|f| f.seed);
    // Runs that met a failure CHC cannot recover from are reported apart: neither passes nor
    // failures.
    let (outside, mut failures): (Vec<_>, Vec<_>) = failures.into_iter().partition(|f| f.outcome.outside_guarantee());
    if let Some(dir) = &a.shrink {
        shrink_all(&a, dir, &inputs, &registry, &*store, &mut failures)?;
    }
    report(&a, &failures, &outside)?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failure {
            code: NOT_EQUIVALENT,
            error: anyhow::anyhow!("{} of {} random run(s) failed", failures.len(), a.n),
        })
    }
}

/// `--dry-run`: every run's schedule, one YAML document per run, in the form `verify --faults`
/// reads.
fn print_schedules(a: &FuzzArgs, inputs: &[Input]) {
    for i in 0..a.n {
        let Some(input) = inputs.get((i % inputs.len().max(1) as u64) as usize) else { return };
        let seed = a.seed.wrapping_add(i);
        let schedule = FaultSchedule::random(seed, &input.chain, input.packets.len() as u64, a.max_events);
        println!(
            "---\n# run {i}: chain {}, input {}\n{}",
            input.chain_path.display(),
            input.trace_path.display(),
            schedule.to_yaml()
        );
    }
}

/// The failure classes, each with the seeds that show it, in order of the first seed.
fn classes(failures: &[FailedRun]) -> BTreeMap<(String, String), Vec<u64>> {
    let mut out: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for f in failures {
        let class: BTreeSet<String> =
            f.outcome.class().into_iter().map(|(k, v)| v.map_or(k.clone(), |v| format!("{k} {v}"))).collect();
        let key = (f.chain.clone(), class.into_iter().collect::<Vec<_>>().join(", "));
        out.entry(key).or_default().push(f.seed);
    }
    out
}

/// Shrinks the first failure of every class (chain and symptom classes), `--jobs` at a
/// time, and writes each to `dir`.
fn shrink_all(
    a: &FuzzArgs,
    dir: &Path,
    inputs: &[Input],
    registry: &NfRegistry,
    store: &StoreFactory<'_>,
    failures: &mut [FailedRun],
) -> Result<(), Failure> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display())).map_err(fail(exit::FAILED))?;
    let firsts: Vec<u64> = classes(failures).values().filter_map(|s| s.first().copied()).collect();
    let todo: Vec<&FailedRun> = failures.iter().filter(|f| firsts.contains(&f.seed)).collect();
    let next = AtomicUsize::new(0);
    let written: Mutex<Vec<(u64, anyhow::Result<PathBuf>)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..a.jobs.max(1) {
            scope.spawn(|| {
                while let Some(f) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let r = shrink_one(a, dir, inputs, registry, store, f);
                    written.lock().unwrap_or_else(|e| e.into_inner()).push((f.seed, r));
                }
            });
        }
    });
    for (seed, r) in written.into_inner().unwrap_or_else(|e| e.into_inner()) {
        let path = r.map_err(fail(exit::FAILED))?;
        if let Some(f) = failures.iter_mut().find(|f| f.seed == seed) {
            f.shrunk_to = Some(path.display().to_string());
        }
    }
    Ok(())
}

/// Shrinks one failure and writes its regression file; returns the file's path.
fn shrink_one(
    a: &FuzzArgs,
    dir: &Path,
    inputs: &[Input],
    registry: &NfRegistry,
    store: &StoreFactory<'_>,
    f: &FailedRun,
) -> anyhow::Result<PathBuf> {
    let input = inputs
        .iter()
        .find(|i| i.chain_path.display().to_string() == f.chain && i.trace_path.display().to_string() == f.input)
        .ok_or_else(|| anyhow::anyhow!("seed {}: its chain and trace are gone", f.seed))?;
    let schedule = FaultSchedule::random(f.seed, &input.chain, input.packets.len() as u64, a.max_events);
    let target = Target { chain: &input.chain, registry, packets: &input.packets };
    let mut shrinker = Shrinker::new(target, store, f.seed.wrapping_mul(1_000_003));
    eprintln!("shrinking seed {} ({}) ...", f.seed, f.outcome.symptom_line());
    let r = shrinker
        .shrink(&schedule, &f.outcome, a.shrink_budget)
        .with_context(|| format!("shrinking seed {}", f.seed))?;
    let reproduced =
        shrinker.confirm(&r.schedule, &r.outcome, 3).with_context(|| format!("rerunning seed {}", f.seed))?;
    let path = dir.join(file_name(&input.chain.name, &r.outcome, f.seed));
    let header = RegressionHeader {
        chain: format!("{} ({})", input.chain.name, input.chain_path.display()),
        input: format!("{} ({} packets)", input.trace_path.display(), input.packets.len()),
        seed: f.seed,
        symptom: r.outcome.symptom_line(),
        summary: r.outcome.summary.clone(),
        reproduced: Some((reproduced, 3)),
    };
    let text = fuzz::regression_yaml(&r.schedule, &input.chain_path, &input.trace_path, &path, &header);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("  seed {}: {} runs, {} event(s) -> {}", f.seed, r.runs, r.schedule.events.len(), path.display());
    Ok(path)
}

/// `<chain>-<first symptom>-s<seed>.yaml`, in characters safe for file names.
fn file_name(chain: &str, outcome: &Outcome, seed: u64) -> String {
    let symptom = outcome
        .symptoms
        .iter()
        .next()
        .map(|s| {
            let mut t = s.kind.clone();
            if let Some(v) = &s.vertex {
                t.push('-');
                t.push_str(v);
            }
            t
        })
        .unwrap_or_else(|| "failure".into());
    let safe =
        |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect::<String>();
    format!("{}-{}-s{seed}.yaml", safe(chain), safe(&symptom))
}

fn report(a: &FuzzArgs, failures: &[FailedRun], outside: &[FailedRun]) -> Result<(), Failure> {
    let groups = classes(failures);
    if a.json {
        let classes: Vec<serde_json::Value> = groups
            .iter()
            .map(|((chain, class), seeds)| serde_json::json!({ "chain": chain, "symptoms": class, "seeds": seeds }))
            .collect();
        let v = serde_json::json!({
            "runs": a.n,
            "first_seed": a.seed,
            "failed": failures.len(),
            "outside_guarantee": outside.len(),
            "classes": classes,
            "failures": failures,
            "outside_guarantee_runs": outside,
        });
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| fail(exit::FAILED)(e.into()))?);
        return Ok(());
    }
    for f in failures {
        println!("--- seed {} failed: {} over {}", f.seed, f.chain, f.input);
        println!("symptoms: {}", f.outcome.symptom_line());
        if let Some(p) = &f.shrunk_to {
            println!("shrunk to: {p}");
        }
        print!("{}", f.schedule);
    }
    for f in outside {
        println!("--- seed {} outside the guarantee: {} over {}", f.seed, f.chain, f.input);
        for u in &f.outcome.unrecoverable {
            println!("    {u}");
        }
    }
    let differing = (failures.len() + outside.len()) as u64;
    println!("{} of {} random run(s) equivalent", a.n - differing, a.n);
    if !outside.is_empty() {
        println!(
            "  {} run(s) outside the guarantee: they met a failure CHC cannot recover from (docs/correctness.md, \"Correlated failures\"); not counted as failures",
            outside.len()
        );
    }
    for ((chain, class), seeds) in &groups {
        let shown: Vec<String> = seeds.iter().take(8).map(u64::to_string).collect();
        let more = if seeds.len() > 8 { ", ..." } else { "" };
        println!("  {} x {chain}: {class} (seeds {}{more})", seeds.len(), shown.join(", "));
    }
    Ok(())
}
