//! Acceptance: random runs — a fault schedule of every kind on every vertex and random run
//! options (`FaultSchedule::random`) — over the shipped chains, `traces/demo.pcap` and real
//! captures; every run must be equivalent to the reference and leave nothing in the root's
//! log, on the embedded store and on Redis. And every minimal failing case ever found
//! (`faults/regressions/*.yaml`) must now pass. A failing run prints its seed and its schedule
//! (with the `run:` section) for `sluice verify --faults`.

mod common;

use common::*;
use sluice_coe::fuzz::{self, StoreFactory, Target};
use sluice_coe::observed::Observed;
use sluice_coe::schedule::{FaultSchedule, RANDOM_MAX_EVENTS};
use sluice_nf::NfRegistry;
use sluice_packet::Packet;
use sluice_runtime::Chain;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// The shipped chains the runs take in turn.
const CHAINS: [&str; 3] = ["chains/example.yaml", "chains/nat-portscan.yaml", "chains/nat-trojan.yaml"];

/// The traces the runs take in turn, cut so that 200 runs take a few minutes on two cores:
/// the bundled demo trace (planted port scan and Trojan signature), and real captures.
fn workloads() -> Vec<(&'static str, Vec<Packet>)> {
    let demo = sluice_io::load(repo("traces/demo.pcap"), Some(6_000)).expect("traces/demo.pcap");
    vec![
        ("demo.pcap", demo),
        ("echo-connections.pcap", trace("echo-connections.pcap").into_iter().take(4_000).collect()),
        ("http_methods.pcap", trace("http_methods.pcap")),
        ("ssh_ssh.pcap", trace("ssh_ssh.pcap")),
    ]
}

/// A chain, a trace and the reference run over it (made on first use).
struct Case {
    chain_file: &'static str,
    chain: Chain,
    trace: &'static str,
    packets: Vec<Packet>,
    reference: Mutex<Option<Arc<Observed>>>,
}

impl Case {
    fn reference(&self, registry: &NfRegistry) -> Arc<Observed> {
        let mut slot = self.reference.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert_with(|| {
            let target = Target { chain: &self.chain, registry, packets: &self.packets };
            Arc::new(fuzz::reference(&target, &self.packets).expect("reference run"))
        })
        .clone()
    }
}

/// Random runs that still fail: open defects of issue 11 (docs/correctness.md, "Open"). Each
/// is run and printed with its schedule every time; the test fails on any other failing run.
/// None is open now: every failure this test found is fixed, and its minimal case is in
/// `faults/regressions/`.
const OPEN: &[u64] = &[];

/// Every chain over every workload; run `seed` takes case `seed mod len`.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (trace, packets) in workloads() {
        for chain_file in CHAINS {
            let chain = Chain::load(&repo(chain_file)).expect("shipped chain");
            out.push(Case { chain_file, chain, trace, packets: packets.clone(), reference: Mutex::new(None) });
        }
    }
    out
}

/// Runs seeds `0..n` (or those in `COE_SEEDS=3,17`, to rerun chosen ones) on `threads`
/// threads, each on a fresh store from `store`. Every run must be equivalent and leave nothing
/// in the root's log.
fn property(n: u64, threads: usize, store: &StoreFactory<'_>, label: &str) {
    let cases = cases();
    let registry = sluice_nfs::registry();
    let chosen: Option<Vec<u64>> =
        std::env::var("COE_SEEDS").ok().map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect());
    let seeds: Vec<u64> = (0..n).filter(|s| chosen.as_ref().is_none_or(|c| c.contains(s))).collect();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let outside = Mutex::new(Vec::new());
    let t0 = std::time::Instant::now();
    let run_one = |seed: u64| -> Option<String> {
        let case = cases.get((seed % cases.len() as u64) as usize)?;
        let schedule = FaultSchedule::random(seed, &case.chain, case.packets.len() as u64, RANDOM_MAX_EVENTS);
        let target = Target { chain: &case.chain, registry: &registry, packets: &case.packets };
        let o = fuzz::check(&target, &schedule, &case.reference(&registry), store, seed).expect("a store for the run");
        if o.outside_guarantee() {
            let why = o.unrecoverable.join("; ");
            outside.lock().unwrap_or_else(|e| e.into_inner()).push(format!("{label} seed {seed}: {why}"));
        }
        o.failed().then(|| {
            format!(
                "{label} seed {seed}: {} over {} — {}\n{}{}",
                case.chain_file,
                case.trace,
                o.symptom_line(),
                schedule.to_yaml(),
                o.summary
            )
        })
    };
    // Runs are independent (each has its own store or keyspace): share them out.
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                while let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Some(f) = run_one(seed) {
                        failures.lock().unwrap_or_else(|e| e.into_inner()).push((seed, f));
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort();
    // Open defects: printed in full every run, never counted as passes.
    let (open, failures): (Vec<_>, Vec<_>) = failures.into_iter().partition(|(s, _)| OPEN.contains(s));
    for (_, f) in &open {
        eprintln!("OPEN (issue 11, still failing): {f}");
    }
    let fixed: Vec<u64> =
        OPEN.iter().copied().filter(|s| seeds.contains(s) && !open.iter().any(|(o, _)| o == s)).collect();
    if !fixed.is_empty() {
        eprintln!("{label}: open runs {fixed:?} pass now: take them off OPEN");
    }
    let outside = outside.into_inner().unwrap_or_else(|e| e.into_inner());
    for o in &outside {
        eprintln!("outside the guarantee (CHC cannot recover it; not counted): {o}");
    }
    // What CHC cannot recover from is rare in a random schedule; if it were not, the runs
    // would prove little.
    assert!(
        outside.len() * 20 <= seeds.len().max(20),
        "{} of {} runs met an unrecoverable failure: the generator should rarely draw those",
        outside.len(),
        seeds.len()
    );
    let text: Vec<String> = failures.iter().map(|(_, f)| f.clone()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} {label} random runs failed (rerun one with COE_SEEDS=N, or shrink with `sluice fuzz --shrink`):\n{}",
        failures.len(),
        seeds.len(),
        text.join("\n")
    );
    eprintln!(
        "{label}: {} random runs in {:.0} s, every one equivalent except {} open and {} outside the guarantee",
        seeds.len(),
        t0.elapsed().as_secs_f64(),
        open.len(),
        outside.len()
    );
}

fn embedded_store(_: u64) -> Result<Arc<dyn sluice_store::Backend>, String> {
    Ok(embedded())
}

#[test]
fn random_runs_embedded() {
    let n = std::env::var("COE_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    property(n, 2, &embedded_store, "embedded");
}

#[test]
fn random_runs_redis() {
    let servers = redis_servers();
    if servers.is_empty() {
        panic!("SLUICE_REDIS_URL is not set: run the suite through scripts/test-all.sh, which starts Redis");
    }
    // The first runs of the embedded test, on Redis: five of each chain and trace. Every
    // operation of the physical chain that must wait for the store is a round trip to Redis,
    // so four runs go at a time per server; a server's one thread is then busy (eight at a
    // time on one went no faster) and a run over the demo trace takes 35-55 s: 120 runs took
    // 10 minutes, half the suite's budget. Seeds alternate between the servers
    // (`SLUICE_REDIS_MORE_URLS`); `COE_REDIS_RUNS` changes the count.
    let n = std::env::var("COE_REDIS_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let store = |s: u64| Ok(redis_at(&servers[s as usize % servers.len()], &format!("r{s}")));
    property(n, 4 * servers.len(), &store, "redis");
}

/// The `*.yaml` schedule files in `dir` (each with a `run:` section naming its chain and
/// trace), each run on the embedded store and checked: (file, outcome). Only files under
/// `faults/unrecoverable/` may hold a combination unrecoverable by design (`Unrecoverable`).
fn run_files(dir: &str) -> Vec<(PathBuf, fuzz::Outcome)> {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(repo(dir)).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|x| x == "yaml"));
    files.sort();
    let registry = sluice_nfs::registry();
    let mut out = Vec::new();
    for f in files {
        let schedule = FaultSchedule::load(&f).unwrap_or_else(|e| panic!("{e}"));
        let (Some(c), Some(i)) = (&schedule.run.chain, &schedule.run.input) else {
            panic!("{}: a schedule file here names its `chain` and `input` in its `run:` section", f.display());
        };
        let chain = Chain::load(&schedule.run_path(c)).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let limit = schedule.run.limit.map(|l| l as usize);
        let packets = sluice_io::load(schedule.run_path(i), limit).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        schedule.validate_for_trace(&chain, packets.len() as u64).unwrap_or_else(|e| panic!("{e}"));
        let by_design = schedule.unrecoverable(&chain, packets.len() as u64);
        assert!(dir.contains("unrecoverable") || by_design.is_none(), "{}: {by_design:?}", f.display());
        let target = Target { chain: &chain, registry: &registry, packets: &packets };
        let reference = fuzz::reference(&target, &packets).expect("reference run");
        let o = fuzz::check(&target, &schedule, &reference, &embedded_store, 0).expect("store");
        out.push((f, o));
    }
    out
}

/// Every minimal failing case found so far (`faults/regressions/*.yaml`, written by `sluice
/// fuzz --shrink`) names its chain, trace, packet limit and engine options in its `run:`
/// section; each must now be equivalent and leave nothing in the root's log, without a failure
/// CHC cannot recover from to excuse it.
#[test]
fn regressions_are_equivalent() {
    let runs = run_files("faults/regressions");
    assert!(runs.len() >= 30, "the regression files are there");
    let failed: Vec<String> = runs
        .iter()
        .filter(|(_, o)| o.failed() || o.outside_guarantee())
        .map(|(f, o)| format!("{}: {} {:?}", f.display(), o.symptom_line(), o.unrecoverable))
        .collect();
    assert!(failed.is_empty(), "{} of {} regression(s) fail:\n{}", failed.len(), runs.len(), failed.join("\n"));
}

/// Runs that meet a failure CHC cannot recover from (`faults/unrecoverable/*.yaml`: an
/// instance failing with packets whose log entries went with a root or a store, or failing
/// with the store) differ from the reference, and the engine says why: they are outside the
/// guarantee, not failures.
#[test]
fn unrecoverable_runs_are_flagged() {
    let runs = run_files("faults/unrecoverable");
    assert!(!runs.is_empty(), "faults/unrecoverable holds examples");
    for (f, o) in &runs {
        assert!(o.outside_guarantee(), "{}: {} {:?}", f.display(), o.summary, o.unrecoverable);
        assert!(!o.failed(), "{}", f.display());
    }
}
