//! The threaded runtime's fault-tolerance bookkeeping (CHC's root log, XOR check and egress
//! duplicate suppression): it must not change what a chain does, every log entry must be
//! deleted once its copies are done and its updates committed, and nothing may pile up in the
//! instances' store clients while a long run goes.

use sluice_packet::Packet;
use sluice_runtime::{
    compile_with, run, Chain, CollectSink, MemorySource, RunConfig, RunHooks, RunReport, StateConfig,
};
use sluice_store::{ClientConfig, EmbeddedStore, Mode};
use std::path::Path;
use std::sync::Arc;

fn trace(name: &str) -> Vec<Packet> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name);
    sluice_io::load(p, None).expect("trace")
}

fn example_chain() -> Chain {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../chains/example.yaml");
    Chain::load(&p).expect("chain")
}

fn store(mode: Mode) -> StateConfig {
    let backend = Arc::new(EmbeddedStore::start(2).expect("store"));
    StateConfig::Store { backend, client: ClientConfig { mode, ..ClientConfig::default() } }
}

/// Output packets (clock, bytes), sorted by clock.
type Output = Vec<(u64, Vec<u8>)>;

/// Output, decisions, and the report.
fn run_with(packets: &[Packet], state: &StateConfig, fault_tolerance: bool) -> (Output, Vec<String>, RunReport) {
    let plan = compile_with(&example_chain(), &sluice_nfs::registry(), packets, state).expect("plan");
    let cfg = RunConfig { workers: 2, pin: false, batch: 16, window: 2048, fault_tolerance, ..RunConfig::default() };
    let mut sink = CollectSink::default();
    let r = run(plan, &cfg, &mut MemorySource::new(packets), &mut sink, RunHooks::default()).expect("run");
    assert!(r.balanced(), "{:?}", r.dropped);
    let mut out: Output = sink.packets.iter().map(|p| (p.meta.clock.0, p.data().to_vec())).collect();
    out.sort();
    let events =
        r.events.iter().map(|e| format!("{} {} {} {} {}", e.clock, e.nf, e.kind, e.subject, e.detail)).collect();
    (out, events, r)
}

/// Commit values made by the instances' store clients and not taken by the runtime.
fn waiting_commits(r: &RunReport) -> u64 {
    let sum = |k: &str| r.vertices.iter().flat_map(|v| &v.instances).filter_map(|i| i.state.get(k)).sum::<u64>();
    sum("commits_made") - sum("commits_taken")
}

#[test]
fn commits_do_not_pile_up_in_store_clients_with_or_without_the_root_log() {
    let pkts = trace("echo-connections.pcap");
    for ft in [false, true] {
        let (_, _, r) = run_with(&pkts, &store(Mode::Async), ft);
        let instances = r.vertices.iter().flat_map(|v| &v.instances).count();
        let reported = r.vertices.iter().flat_map(|v| &v.instances).filter(|i| i.state.contains_key("commits_taken"));
        assert_eq!(reported.count(), instances, "every store client reports its commits");
        let made: u64 = r.vertices.iter().flat_map(|v| &v.instances).filter_map(|i| i.state.get("commits_made")).sum();
        assert!(made > 0, "asynchronous updates make commit values");
        assert_eq!(waiting_commits(&r), 0, "fault tolerance {ft}: commits left in clients");
    }
}

#[test]
fn the_root_log_changes_nothing_the_chain_does_and_empties_by_the_end() {
    let pkts = trace("http_methods.pcap");
    for state in [StateConfig::Local, store(Mode::Cached), store(Mode::Async)] {
        let (off_out, off_events, off) = run_with(&pkts, &state, false);
        assert!(off.fault_tolerance.is_none(), "no root log without fault tolerance");
        let (on_out, on_events, on) = run_with(&pkts, &state, true);
        assert_eq!(on_out, off_out, "{}: output differs with the root log", on.state);
        assert_eq!(on_events, off_events, "{}: decisions differ with the root log", on.state);
        let ft = on.fault_tolerance.as_ref().expect("root log report");
        let admitted =
            pkts.len() as u64 - on.dropped.iter().filter(|(k, _)| k.starts_with("root:")).map(|(_, n)| n).sum::<u64>();
        assert_eq!(ft.logged, admitted, "{}: every admitted packet is logged", on.state);
        assert_eq!(ft.deleted, admitted, "{}: every entry is deleted by the end", on.state);
        assert_eq!(ft.left_in_log, 0, "{}", on.state);
        assert!(ft.log_peak >= 1 && ft.log_peak <= 2048, "{}: log peak {} within the window", on.state, ft.log_peak);
        assert_eq!(ft.duplicates_suppressed, 0, "{}: nothing replayed, nothing suppressed", on.state);
        if on.state.contains("async") {
            assert!(ft.commits > 0, "{}: asynchronous updates are committed through the root", on.state);
        }
    }
}

#[test]
fn the_root_log_empties_with_redis() {
    let url = std::env::var("SLUICE_REDIS_URL").unwrap_or_default();
    assert!(
        !url.is_empty(),
        "SLUICE_REDIS_URL is not set: run scripts/test-all.sh, or start scripts/redis-env.sh and set it"
    );
    let url = format!("{url}?prefix=ft-{}", std::process::id());
    let backend = Arc::new(sluice_redis::RedisBackend::connect(&url).expect("redis"));
    let state = StateConfig::Store {
        backend: backend.clone(),
        client: ClientConfig { mode: Mode::Async, ..ClientConfig::default() },
    };
    let pkts = trace("http_methods.pcap");
    let (out, events, r) = run_with(&pkts, &state, true);
    let _ = backend.clear();
    let (ref_out, ref_events, _) = run_with(&pkts, &StateConfig::Local, false);
    assert_eq!(out, ref_out, "output with Redis and the root log");
    assert_eq!(events, ref_events, "decisions with Redis and the root log");
    let ft = r.fault_tolerance.clone().expect("root log report");
    assert_eq!((ft.deleted, ft.left_in_log), (ft.logged, 0), "{ft:?}");
    assert!(ft.commits > 0, "Redis acknowledged updates through the log: {ft:?}");
    assert_eq!(waiting_commits(&r), 0);
}

/// A run's claim on its store (the mark that makes a second run on it refused) survives the
/// store crashing, also before the first checkpoint: a rebuild from no checkpoint at all must
/// not hand the next run a store that looks like no run's.
#[test]
fn a_store_rebuilt_before_any_checkpoint_still_holds_the_runs_claim() {
    let pkts = trace("echo-connections.pcap");
    for checkpoint_every in [None, Some(std::time::Duration::from_millis(1))] {
        let backend: Arc<dyn sluice_store::Backend> = Arc::new(EmbeddedStore::start(2).expect("store"));
        let state = StateConfig::Store { backend: backend.clone(), client: ClientConfig::default() };
        let plan = compile_with(&example_chain(), &sluice_nfs::registry(), &pkts, &state).expect("plan");
        let cfg = RunConfig {
            workers: 2,
            pin: false,
            fault_tolerance: true,
            checkpoint_every,
            planned: vec![sluice_runtime::exec::Planned::CrashStore(20)],
            claim: Some("the first run".into()),
            ..RunConfig::default()
        };
        let mut sink = CollectSink::default();
        let r = run(plan, &cfg, &mut MemorySource::new(&pkts), &mut sink, RunHooks::default()).expect("run");
        assert!(r.balanced(), "{:?}", r.dropped);
        assert_eq!(r.store_crashes.len(), 1, "the store crashed and was rebuilt once");
        let again = sluice_runtime::store_claim::claim_store(&backend, "a second run", false);
        match again {
            Err(sluice_runtime::store_claim::ClaimError::Taken(by)) => assert_eq!(by, "the first run"),
            other => panic!("checkpoints {checkpoint_every:?}: a second run's claim gave {other:?}"),
        }
    }
}

/// A run that cannot lose its store takes no checkpoint of it, however often checkpoints are
/// asked for: nothing would rebuild from one, and each copies the whole store. A run that
/// plans a store crash takes them.
#[test]
fn only_a_run_that_may_lose_its_store_checkpoints_it() {
    let pkts = trace("echo-connections.pcap");
    let pkts = &pkts[..pkts.len().min(20_000)];
    for store_crash in [false, true] {
        let backend: Arc<dyn sluice_store::Backend> = Arc::new(EmbeddedStore::start(2).expect("store"));
        let state = StateConfig::Store { backend, client: ClientConfig::default() };
        let plan = compile_with(&example_chain(), &sluice_nfs::registry(), pkts, &state).expect("plan");
        let cfg = RunConfig {
            workers: 2,
            pin: false,
            fault_tolerance: true,
            checkpoint_every: Some(std::time::Duration::from_millis(1)),
            planned: if store_crash { vec![sluice_runtime::exec::Planned::CrashStore(15_000)] } else { vec![] },
            ..RunConfig::default()
        };
        let r = run(plan, &cfg, &mut MemorySource::new(pkts), &mut CollectSink::default(), RunHooks::default())
            .expect("run");
        assert!(r.balanced(), "{:?}", r.dropped);
        if store_crash {
            assert!(r.checkpoints.taken > 0, "a run that may lose its store checkpoints it: {:?}", r.checkpoints);
        } else {
            assert_eq!(r.checkpoints.taken, 0, "{:?}", r.checkpoints);
        }
    }
}
