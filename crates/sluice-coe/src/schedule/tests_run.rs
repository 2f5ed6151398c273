//! Tests of the `run:` section, random runs, the unrecoverable combinations and shrinking.

use super::tests::{chain, content, parse_err, parsed, DEMO_PACKETS, EXAMPLE_CHAIN, SMALL_CHAIN};
use super::*;
use crate::engine::{EngineConfig, LogPlace};
use std::collections::BTreeSet;
use std::path::Path;

#[test]
fn run_section_parses_applies_and_round_trips() {
    let text = "# a run\nseed: 3\nrun:\n  roots: 2\n  log: store\n  async_delete: true\n  checkpoint_every: 500\n  chain: ../../chains/example.yaml\n  input: traces/demo.pcap\n  limit: 9000\nevents:\n  - at: { packet: 5 }\n    crash_root: { root: 1 }\n";
    let s = parsed(text);
    let r = &s.run;
    assert_eq!(
        (r.roots, r.log, r.async_delete, r.checkpoint_every),
        (Some(2), Some(LogPlace::Store), Some(true), Some(500))
    );
    assert_eq!((r.limit, r.line), (Some(9000), Some(3)));
    assert_eq!(s.run_path(r.chain.as_deref().unwrap_or(Path::new(""))), Path::new("../../chains/example.yaml"));
    let mut cfg = EngineConfig::default();
    r.apply(&mut cfg);
    assert_eq!((cfg.roots, cfg.log_place, cfg.async_delete, cfg.checkpoint_every), (2, LogPlace::Store, true, 500));
    let back = parsed(&s.to_yaml());
    assert_eq!(content(&back), content(&s), "{}", s.to_yaml());
    assert!(s.to_yaml().contains("chain: ../../chains/example.yaml"), "{}", s.to_yaml());
    // Relative to the schedule file's directory.
    let f = FaultSchedule::parse(text, Path::new("faults/regressions/x.yaml")).unwrap_or_default();
    assert_eq!(
        f.run_path(Path::new("../../chains/example.yaml")),
        Path::new("faults/regressions/../../chains/example.yaml")
    );
    // Flags override the file; what they leave out stays.
    let over = RunOptions { roots: Some(3), async_delete: Some(false), ..RunOptions::default() };
    let merged = s.run.overridden_by(&over);
    assert_eq!((merged.roots, merged.async_delete, merged.log), (Some(3), Some(false), Some(LogPlace::Store)));
    // An empty section is no options at all.
    assert!(parsed("run:\nevents: []\n").run.is_empty());
    assert!(!parsed(&s.to_yaml()).to_yaml().is_empty());
}

#[test]
fn run_section_errors_are_located() {
    let e = parse_err("run:\n  roots: 0\n");
    assert_eq!((e.line, e.field.as_str()), (Some(2), "run.roots"));
    assert!(e.message.contains("expected 1 to 64"), "{e}");
    let e = parse_err("run: { roots: 300 }\n");
    assert_eq!(e.field, "run.roots");
    let e = parse_err("run:\n  log: disk\n");
    assert_eq!((e.line, e.field.as_str()), (Some(2), "run.log"));
    assert!(e.message.contains("`root` or `store`"), "{e}");
    let e = parse_err("run:\n  async_delete: maybe\n");
    assert_eq!(e.field, "run.async_delete");
    let e = parse_err("run:\n  checkpoint_every: -1\n");
    assert_eq!(e.field, "run.checkpoint_every");
    let e = parse_err("seed: 1\nrun:\n  limit: 0\n");
    assert_eq!((e.line, e.field.as_str()), (Some(3), "run.limit"));
    let e = parse_err("run:\n  rots: 2\n");
    assert_eq!((e.line, e.field.as_str()), (Some(2), "run.rots"));
    assert!(e.message.contains("`roots`"), "{e}");
    // A root the run does not have.
    let e = parse_err("run: { roots: 2 }\nevents:\n  - at: { packet: 5 }\n    crash_root: { root: 2 }\n");
    assert_eq!((e.line, e.field.as_str()), (Some(4), "events.0.crash_root.root"));
    assert!(e.message.contains("2 root(s)"), "{e}");
}

/// The example chain with the off-path Trojan detector, and one where it is the last NF.
const NAT_TROJAN: &str = "name: nt\nvertices:\n  nat: { type: nat, config: { external_ip: 198.51.100.1, internal: [\"10.0.0.0/8\"] } }\n  trojan: { type: trojan }\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: trojan }\n  - { from: trojan, to: output }\n";

#[test]
fn random_runs_cover_every_kind_on_every_vertex_and_stay_valid() {
    let chains = [chain(SMALL_CHAIN), chain(EXAMPLE_CHAIN), chain(NAT_TROJAN)];
    let mut seen: BTreeSet<(String, String, &str)> = BTreeSet::new();
    let (mut same_point, mut options) = (0, BTreeSet::new());
    for seed in 0..2_000u64 {
        for (ci, c) in chains.iter().enumerate() {
            for total in [DEMO_PACKETS, 3] {
                let s = FaultSchedule::random(seed, c, total, RANDOM_MAX_EVENTS);
                assert!((1..=RANDOM_MAX_EVENTS).contains(&s.events.len()));
                if let Err(e) = s.validate_for_trace(c, total).and_then(|()| s.validate(c)) {
                    panic!("seed {seed}: {e}\n{}", s.to_yaml());
                }
                assert_eq!(s.unrecoverable(c, total), None, "seed {seed}\n{}", s.to_yaml());
                let listed: Vec<u64> = s.events.iter().map(|e| e.at.resolve(total)).collect();
                assert!(listed.windows(2).all(|w| w[0] <= w[1]), "trace order: seed {seed}");
                same_point += usize::from(listed.windows(2).any(|w| w[0] == w[1]));
                let r = &s.run;
                assert!(r.roots.is_some_and(|n| (1..=RANDOM_MAX_ROOTS).contains(&n)));
                assert!(r.checkpoint_every.is_some_and(|n| RANDOM_CHECKPOINTS.contains(&n)));
                options.insert((r.roots, r.log.map(|l| l == LogPlace::Store), r.async_delete, r.checkpoint_every));
                for e in &s.events {
                    let v = e.action.vertex().unwrap_or("-").to_string();
                    seen.insert((ci.to_string(), v, e.action.key()));
                    if let Action::CrashRoot { root } = e.action {
                        assert!(root < s.run.root_count());
                    }
                }
            }
        }
        assert_eq!(FaultSchedule::random(seed, &chains[1], 9, 8), FaultSchedule::random(seed, &chains[1], 9, 8));
    }
    for (ci, c) in chains.iter().enumerate() {
        for (v, _) in &c.vertices {
            for kind in ["crash", "scale", "move", "slow", "clone"] {
                assert!(seen.contains(&(ci.to_string(), v.clone(), kind)), "{kind} on {v} never drawn ({})", c.name);
            }
        }
        for kind in ["crash_root", "crash_store"] {
            assert!(seen.contains(&(ci.to_string(), "-".to_string(), kind)), "{kind} never drawn");
        }
    }
    assert!(same_point > 500, "several events at one point: {same_point}");
    assert_eq!(options.len(), 3 * 2 * 2 * 3, "every combination of run options drawn");
}

fn schedule(run: RunOptions, events: &[(u64, Action)]) -> FaultSchedule {
    let events = events.iter().map(|(n, a)| FaultEvent { at: At::Packet(*n), action: a.clone(), line: None }).collect();
    FaultSchedule { events, run, ..FaultSchedule::default() }
}

#[test]
fn unrecoverable_combinations_are_exactly_the_documented_ones() {
    let c = chain(EXAMPLE_CHAIN);
    let crash = |v: &str| Action::Crash { vertex: v.into(), instance: 0 };
    let root = RunOptions::default();
    let store = RunOptions { log: Some(LogPlace::Store), ..RunOptions::default() };
    let asynch = RunOptions { async_delete: Some(true), ..RunOptions::default() };
    let u = |r: &RunOptions, ev: &[(u64, Action)]| schedule(r.clone(), ev).unrecoverable(&c, 1000);
    assert_eq!(u(&root, &[(5, Action::CrashStore), (5, crash("nat"))]), Some(Unrecoverable::StoreAndNf { at: 5 }));
    assert_eq!(u(&store, &[(5, crash("trojan")), (5, Action::CrashStore)]), Some(Unrecoverable::StoreAndNf { at: 5 }));
    assert_eq!(u(&root, &[(5, Action::CrashStore), (6, crash("nat"))]), None);
    assert_eq!(
        u(&root, &[(7, Action::CrashRoot { root: 0 }), (7, crash("lb"))]),
        Some(Unrecoverable::RootAndNfWithRootLog { at: 7 })
    );
    assert_eq!(u(&store, &[(7, Action::CrashRoot { root: 0 }), (7, crash("lb"))]), None);
    assert_eq!(u(&root, &[(7, Action::CrashRoot { root: 0 }), (7, Action::CrashStore)]), None);
    assert_eq!(u(&root, &[(7, crash("nat")), (7, crash("lb"))]), None);
    assert_eq!(u(&asynch, &[(9, crash("lb"))]), None, "the egress drops what a last NF re-emits");
    assert_eq!(u(&asynch, &[(9, crash("nat")), (9, crash("trojan"))]), None);
    assert_eq!(last_vertices(&c), vec!["lb".to_string()]);
}

#[test]
fn shrink_candidates_are_simpler() {
    let c = chain(EXAMPLE_CHAIN);
    let run = RunOptions {
        roots: Some(2),
        log: Some(LogPlace::Store),
        async_delete: Some(true),
        checkpoint_every: Some(500),
        ..RunOptions::default()
    };
    let s = schedule(
        run,
        &[
            (100, Action::Scale { vertex: "nat".into(), to: ScaleTo::Exactly(2) }),
            (900, Action::Crash { vertex: "nat".into(), instance: 1 }),
            (900, Action::CrashRoot { root: 1 }),
        ],
    );
    let all = shrink_candidates(&s, 10_000);
    assert!(all.iter().all(|x| x != &s));
    assert!(all.iter().any(|x| x.run.limit.is_some_and(|l| (900..10_000).contains(&l))), "a shorter trace");
    assert!(all.iter().any(|x| x.events.len() == 2), "an event fewer");
    assert!(all.iter().any(|x| x.run.roots == Some(1)), "a root fewer");
    assert!(all.iter().any(|x| x.run.async_delete == Some(false) && x.events == s.events));
    assert!(all.iter().any(|x| x.events.get(1).is_some_and(|e| e.at == At::Packet(100))), "moved to an earlier point");
    // Dropping the scale-out makes instance 1 disappear: the caller's check refuses it.
    let without_scale = all.iter().find(|x| x.events.len() == 2 && x.events[0].action.key() == "crash");
    assert!(without_scale.is_some_and(|x| x.validate_for_trace(&c, 10_000).is_err()));
    // Percentages become packet counts, in trace order.
    let p =
        parsed("events:\n  - at: { percent: 50 }\n    crash_store: {}\n  - at: { packet: 3 }\n    crash_root: {}\n");
    let a = p.absolute(1000);
    assert_eq!(a.events.iter().map(|e| e.at).collect::<Vec<_>>(), vec![At::Packet(3), At::Packet(500)]);
}
