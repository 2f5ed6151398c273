//! Tests of schedule parsing, checking, writing and random generation.

use super::*;
use sluice_runtime::Chain;
use std::path::{Path, PathBuf};

pub(super) const EXAMPLE_CHAIN: &str = include_str!("../../../../chains/example.yaml");
/// Packets in traces/demo.pcap.
pub(super) const DEMO_PACKETS: u64 = 65_744;
const DOC: &str = include_str!("../../../../docs/faults.md");
const FILES: [(&str, &str); 7] = [
    ("nf-crash.yaml", include_str!("../../../../faults/nf-crash.yaml")),
    ("straggler.yaml", include_str!("../../../../faults/straggler.yaml")),
    ("straggler-policy.yaml", include_str!("../../../../faults/straggler-policy.yaml")),
    ("move-4000.yaml", include_str!("../../../../faults/move-4000.yaml")),
    ("scale.yaml", include_str!("../../../../faults/scale.yaml")),
    ("root-and-nf.yaml", include_str!("../../../../faults/root-and-nf.yaml")),
    ("store-crash.yaml", include_str!("../../../../faults/store-crash.yaml")),
];
pub(super) const SMALL_CHAIN: &str = "name: small\nvertices:\n  nat:\n    type: nat\n    instances: 2\n    config: { external_ip: 198.51.100.1, internal: [\"10.0.0.0/8\"] }\n  portscan: { type: portscan }\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: portscan }\n  - { from: portscan, to: output }\n";

pub(super) fn chain(text: &str) -> Chain {
    match Chain::parse(text, Path::new("chain.yaml")) {
        Ok(c) => c,
        Err(e) => panic!("test chain: {e}"),
    }
}

pub(super) fn parse(text: &str) -> Result<FaultSchedule, ScheduleError> {
    FaultSchedule::parse(text, Path::new("f.yaml"))
}

pub(super) fn parsed(text: &str) -> FaultSchedule {
    match parse(text) {
        Ok(s) => s,
        Err(e) => panic!("{e}\n{text}"),
    }
}

pub(super) fn parse_err(text: &str) -> ScheduleError {
    match parse(text) {
        Ok(s) => panic!("expected an error for\n{text}\ngot {s:?}"),
        Err(e) => e,
    }
}

fn validate_err(text: &str, c: &Chain) -> ScheduleError {
    match parsed(text).validate(c) {
        Ok(()) => panic!("expected a validation error for\n{text}"),
        Err(e) => e,
    }
}

/// Seed, events and policies without lines or source.
pub(super) fn content(s: &FaultSchedule) -> FaultSchedule {
    let mut s = s.clone();
    s.source = None;
    s.events.iter_mut().for_each(|e| e.line = None);
    s.policies.iter_mut().for_each(|p| p.line = None);
    s.run.line = None;
    s
}

const FULL: &str = "# faults/example.yaml
seed: 7
events:
  - at: { packet: 20000 }
    crash: { vertex: nat, instance: 0 }
  - at: { percent: 40 }
    crash_root: {}
  - at: { packet: 30000 }
    crash_store: {}
  - at: { percent: 50 }
    scale: { vertex: portscan, to: 3 }
  - at: { percent: 60 }
    move: { vertex: nat, from: 0, to: 1, flows: 4000 }
  - at: { packet: 1 }
    slow: { vertex: nat, instance: 0, delay_us: [3, 10] }
  - at: { percent: 30 }
    clone: { vertex: nat, instance: 0 }
policies:
  - { vertex: portscan, scale_out_above: { queue: 2000 }, scale_in_below: { queue: 100 }, max_instances: 4, min_instances: 1 }
  - { vertex: nat, straggler_slower_by_percent: 50 }
";

#[test]
fn parses_every_field() {
    let s = parsed(FULL);
    assert_eq!(s.seed, 7);
    assert_eq!(s.events.len(), 7);
    assert_eq!(s.events[0].at, At::Packet(20000));
    assert_eq!(s.events[0].action, Action::Crash { vertex: "nat".into(), instance: 0 });
    assert_eq!(s.events[0].line, Some(4));
    assert_eq!(s.events[1].action, Action::CrashRoot { root: 0 });
    assert_eq!(s.events[1].at, At::Percent(40.0));
    assert_eq!(s.events[2].action, Action::CrashStore);
    assert_eq!(s.events[3].action, Action::Scale { vertex: "portscan".into(), to: ScaleTo::Exactly(3) });
    assert_eq!(s.events[4].action, Action::Move { vertex: "nat".into(), from: 0, to: 1, flows: Some(4000) });
    assert_eq!(s.events[5].action, Action::Slow { vertex: "nat".into(), instance: 0, delay_us: (3, 10) });
    assert_eq!(s.events[6].action, Action::Clone { vertex: "nat".into(), instance: 0 });
    assert_eq!(s.events[6].line, Some(16));
    assert_eq!(s.policies.len(), 2);
    assert_eq!(s.policies[0].scale_out_above, Some(Threshold { queue: Some(2000), load: None }));
    assert_eq!(s.policies[0].scale_in_below, Some(Threshold { queue: Some(100), load: None }));
    assert_eq!((s.policies[0].min_instances, s.policies[0].max_instances), (Some(1), Some(4)));
    assert_eq!(s.policies[1].straggler_slower_by_percent, Some(50.0));
    assert_eq!(s.policies[1].line, Some(20));
    // Scale by, crash_root without a value, defaults.
    let s = parsed("events:\n  - at: { packet: 5 }\n    scale: { vertex: nat, by: -1 }\n  - at: { packet: 6 }\n    crash_root:\n  - at: { packet: 7 }\n    crash: { vertex: nat }\n");
    assert_eq!(s.seed, 0);
    assert_eq!(s.events[0].action, Action::Scale { vertex: "nat".into(), to: ScaleTo::By(-1) });
    assert_eq!(s.events[1].action, Action::CrashRoot { root: 0 });
    assert_eq!(s.events[2].action, Action::Crash { vertex: "nat".into(), instance: 0 });
    // An example chain with two NATs takes the full example once portscan is known.
    let c = chain(&EXAMPLE_CHAIN.replace("    type: nat\n", "    type: nat\n    instances: 2\n"));
    let full = parsed(FULL);
    assert_eq!(full.validate(&c), Ok(()));
    assert_eq!(full.validate_for_trace(&c, DEMO_PACKETS), Ok(()));
}

#[test]
fn crash_root_names_a_root() {
    let s = parsed(
        "events:\n  - at: { packet: 5 }\n    crash_root: { root: 2 }\n  - at: { packet: 6 }\n    crash_root: {}\n",
    );
    assert_eq!(s.events[0].action, Action::CrashRoot { root: 2 });
    assert_eq!(s.events[1].action, Action::CrashRoot { root: 0 });
    let again = parsed(&s.to_yaml());
    assert_eq!(
        again.events.iter().map(|e| e.action.clone()).collect::<Vec<_>>(),
        vec![Action::CrashRoot { root: 2 }, Action::CrashRoot { root: 0 }]
    );
    let e = parse_err("events:\n  - at: { packet: 5 }\n    crash_root: { root: 300 }\n");
    assert_eq!(e.field, "events.0.crash_root.root");
    let e = parse_err("events:\n  - at: { packet: 5 }\n    crash_root: { rot: 1 }\n");
    assert!(e.to_string().contains("rot"), "{e}");
}

#[test]
fn serializes_for_reports() {
    let s = parsed(FULL);
    let json = serde_json::to_value(&s).unwrap_or_default();
    assert_eq!(json["events"][0]["at"]["packet"], 20000);
    assert_eq!(json["events"][0]["action"]["crash"]["vertex"], "nat");
    assert_eq!(json["events"][1]["action"]["crash_root"]["root"], 0);
    assert_eq!(json["events"][3]["action"]["scale"]["to"]["exactly"], 3);
    assert_eq!(json["policies"][0]["scale_out_above"]["queue"], 2000);
}

/// Every ```yaml block in docs/faults.md is a complete schedule for chains/example.yaml.
#[test]
fn doc_examples_parse_and_validate() {
    let c = chain(EXAMPLE_CHAIN);
    let mut blocks = 0;
    let mut rest = DOC;
    while let Some(start) = rest.find("```yaml\n") {
        let body = &rest[start + 8..];
        let Some(end) = body.find("```") else { panic!("unterminated yaml block in docs/faults.md") };
        let text = &body[..end];
        let s = match FaultSchedule::parse(text, Path::new("docs/faults.md")) {
            Ok(s) => s,
            Err(e) => panic!("docs/faults.md example {blocks}: {e}\n{text}"),
        };
        if let Err(e) = s.validate_for_trace(&c, DEMO_PACKETS) {
            panic!("docs/faults.md example {blocks}: {e}\n{text}");
        }
        blocks += 1;
        rest = &body[end + 3..];
    }
    assert!(blocks >= 6, "only {blocks} yaml examples in docs/faults.md");
}

#[test]
fn fault_files_parse_and_validate() {
    let c = chain(EXAMPLE_CHAIN);
    for (name, text) in FILES {
        let s = match FaultSchedule::parse(text, Path::new(name)) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        assert!(!s.events.is_empty() || !s.policies.is_empty(), "{name} is empty");
        if let Err(e) = s.validate(&c).and_then(|()| s.validate_for_trace(&c, DEMO_PACKETS)) {
            panic!("{e}");
        }
        // Round trip of real files too.
        let back = parsed(&s.to_yaml());
        assert_eq!(content(&back), content(&s), "{name}");
    }
    // Every file under faults/ is tested here.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../faults");
    if let Ok(entries) = std::fs::read_dir(&dir) {
        // Directories (faults/regressions/) have tests of their own.
        for entry in entries.flatten().filter(|e| e.path().is_file()) {
            let name = entry.file_name().to_string_lossy().to_string();
            assert!(FILES.iter().any(|(n, _)| *n == name), "faults/{name} is not in the test's FILES");
        }
    }
}

#[test]
fn unknown_field() {
    let e = parse_err("events:\n  - at: { packet: 1 }\n    crash: { vertex: nat, instanse: 0 }\n");
    assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.crash.instanse"));
    assert!(e.message.contains("unknown field `instanse`") && e.message.contains("`instance`"), "{e}");
    let e = parse_err("seed: 1\nevnts: []\n");
    assert_eq!((e.line, e.field.as_str()), (Some(2), "evnts"));
    let e = parse_err("events:\n  - at: { packet: 1 }\n    crsh: { vertex: nat }\n");
    assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.crsh"));
    assert!(e.message.contains("`crash`"), "{e}");
    let e = parse_err("policies:\n  - vertex: nat\n    scale_out_above: { queue: 5, cpu: 1 }\n");
    assert_eq!((e.line, e.field.as_str()), (Some(3), "policies.0.scale_out_above.cpu"));
    assert_eq!(e.to_string().split(':').next(), Some("f.yaml"));
    assert!(e.to_string().starts_with("f.yaml:3: field `policies.0.scale_out_above.cpu`: unknown field"), "{e}");
}

#[test]
fn lines_in_block_style_and_unindented_lists() {
    let e = parse_err("events:\n  - at:\n      percent: 150\n    slow:\n      vertex: nat\n      delay_us: [1, 2]\n");
    assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.at.percent"));
    let e = parse_err("events:\n  - at: { packet: 1 }\n    slow:\n      vertex: nat\n      delay_us: [10, 3]\n");
    assert_eq!((e.line, e.field.as_str()), (Some(5), "events.0.slow.delay_us"));
    let text = "seed: 1\nevents:\n# first\n- at: { packet: 1 }\n  crash_root: {}\n- at: { packet: 2 }\n  crash: { vertex: nat, instanse: 0 }\npolicies:\n- { vertex: nat, straggler_slower_by_percent: 5 }\n";
    let e = parse_err(text);
    assert_eq!((e.line, e.field.as_str()), (Some(7), "events.1.crash.instanse"));
    let s = parsed(&text.replace("instanse", "instance"));
    assert_eq!(s.events.iter().map(|e| e.line).collect::<Vec<_>>(), vec![Some(4), Some(6)]);
    assert_eq!(s.policies[0].line, Some(9));
}

#[test]
fn doc_error_message_is_real() {
    let c = chain(EXAMPLE_CHAIN);
    let text = FILES[0].1.replace("vertex: nat", "vertex: nta");
    let e = FaultSchedule::parse(&text, Path::new("faults/nf-crash.yaml")).and_then(|s| s.validate(&c)).err();
    let want = "faults/nf-crash.yaml:7: field `events.0.crash.vertex`: no vertex `nta` in chain `example` (known: nat, portscan, lb, trojan)";
    assert_eq!(e.map(|e| e.to_string()), Some(want.to_string()));
    assert!(DOC.contains(want));
    let text = "events:\n  - at: { packet: 1 }\n    crash_root: {}\n  - at: { packet: 2 }\n    slow: { vertex: nat, instance: 0, delay_us: [10, 3] }\n";
    let e = FaultSchedule::parse(text, Path::new("faults/bad.yaml")).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("faults/bad.yaml:5: field `events.1.slow.delay_us`: [10, 3]: the low bound"), "{e}");
    assert!(DOC.contains(e.as_str()), "{e}");
}

#[test]
fn one_action_per_event() {
    let e = parse_err("events:\n  - at: { packet: 1 }\n    crash: { vertex: nat, instance: 0 }\n    crash_root: {}\n");
    assert_eq!((e.line, e.field.as_str()), (Some(4), "events.0.crash_root"));
    assert!(e.message.contains("exactly one action") && e.message.contains("`crash` (line 3)"), "{e}");
    let e = parse_err("events:\n  - at: { packet: 1 }\n");
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("no action"), "{e}");
    let e = parse_err("events:\n  - crash_store: {}\n");
    assert!(e.message.contains("no `at:`"), "{e}");
    let e = parse_err("events:\n  - at: { packet: 1, percent: 5 }\n    crash_store: {}\n");
    assert!(e.message.contains("exactly one of"), "{e}");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    crash_store: { vertex: nat }\n");
    assert_eq!(e.field, "events.0.crash_store.vertex");
}

#[test]
fn unknown_vertex_lists_known_ones() {
    let c = chain(EXAMPLE_CHAIN);
    let e = validate_err("events:\n  - at: { percent: 10 }\n    crash: { vertex: nta, instance: 0 }\n", &c);
    assert_eq!((e.line, e.field.as_str()), (Some(2), "events.0.crash.vertex"));
    assert!(e.message.contains("nat, portscan, lb, trojan"), "{e}");
    assert_eq!(e.file, PathBuf::from("f.yaml"));
    let e = validate_err("policies:\n  - { vertex: lbb, straggler_slower_by_percent: 5 }\n", &c);
    assert_eq!((e.line, e.field.as_str()), (Some(2), "policies.0.vertex"));
    assert!(e.message.contains("known: nat, portscan, lb, trojan"), "{e}");
    // Off-path vertices are fine.
    let s = parsed("events:\n  - at: { percent: 10 }\n    crash: { vertex: trojan }\n");
    assert_eq!(s.validate(&c), Ok(()));
}

#[test]
fn range_errors() {
    let e = parse_err("events:\n  - at: { percent: 150 }\n    crash_root: {}\n");
    assert_eq!((e.line, e.field.as_str()), (Some(2), "events.0.at.percent"));
    assert!(e.message.contains("between 0 and 100"), "{e}");
    for p in ["0", "100", "-1"] {
        let e = parse_err(&format!("events:\n  - at: {{ percent: {p} }}\n    crash_root: {{}}\n"));
        assert_eq!(e.field, "events.0.at.percent");
    }
    let e = parse_err("events:\n  - at: { packet: 0 }\n    crash_root: {}\n");
    assert_eq!(e.field, "events.0.at.packet");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    slow: { vertex: nat, instance: 0, delay_us: [10, 3] }\n");
    assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.slow.delay_us"));
    assert!(e.message.contains("[3, 10]"), "{e}");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    slow: { vertex: nat, delay_us: [0, 2000000] }\n");
    assert_eq!(e.field, "events.0.slow.delay_us");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    slow: { vertex: nat, delay_us: 5 }\n");
    assert!(e.message.contains("[LOW, HIGH]"), "{e}");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    scale: { vertex: nat, to: 0 }\n");
    assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.scale.to"));
    assert!(e.message.contains("at least 1 instance"), "{e}");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    scale: { vertex: nat, to: 65 }\n");
    assert_eq!(e.field, "events.0.scale.to");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    scale: { vertex: nat, to: 2, by: 1 }\n");
    assert!(e.message.contains("exactly one of `to: N`"), "{e}");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    move: { vertex: nat, from: 1, to: 1 }\n");
    assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.move.to"));
    assert!(e.message.contains("two different instances"), "{e}");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    move: { vertex: nat, from: 0, to: 1, flows: 0 }\n");
    assert_eq!(e.field, "events.0.move.flows");
    let e = parse_err("events:\n  - at: { packet: 1 }\n    crash: { vertex: nat, instance: -1 }\n");
    assert_eq!(e.field, "events.0.crash.instance");
    let e = parse_err("events:\n  - at: { packet: x }\n    crash_root: {}\n");
    assert_eq!(e.field, "events.0.at.packet");
    let e = parse_err("seed: -3\n");
    assert_eq!((e.line, e.field.as_str()), (Some(1), "seed"));
    let e = parse_err("events: [\n");
    assert!(e.message.starts_with("not valid YAML"), "{e}");
    let e = parse_err("");
    assert!(e.message.contains("empty"), "{e}");
    // Policies.
    let e = parse_err(
        "policies:\n  - { vertex: nat, max_instances: 2, min_instances: 3, scale_out_above: { queue: 9 } }\n",
    );
    assert_eq!((e.line, e.field.as_str()), (Some(2), "policies.0.min_instances"));
    let e = parse_err(
        "policies:\n  - vertex: nat\n    scale_out_above: { queue: 10 }\n    scale_in_below: { queue: 10 }\n",
    );
    assert_eq!((e.line, e.field.as_str()), (Some(4), "policies.0.scale_in_below.queue"));
    let e = parse_err("policies:\n  - { vertex: nat, scale_out_above: { load: 1.5 } }\n");
    assert_eq!(e.field, "policies.0.scale_out_above.load");
    let e = parse_err("policies:\n  - { vertex: nat, scale_out_above: {} }\n");
    assert_eq!(e.field, "policies.0.scale_out_above");
    let e = parse_err("policies:\n  - { vertex: nat }\n");
    assert!(e.message.contains("does nothing"), "{e}");
    let e = parse_err("policies:\n  - { vertex: nat, straggler_slower_by_percent: 0 }\n");
    assert_eq!(e.field, "policies.0.straggler_slower_by_percent");
    let e = parse_err(
            "policies:\n  - { vertex: nat, straggler_slower_by_percent: 5 }\n  - { vertex: nat, scale_out_above: { queue: 1 } }\n",
        );
    assert_eq!((e.line, e.field.as_str()), (Some(3), "policies.1.vertex"));
    assert!(e.message.contains("(line 2)"), "{e}");
}

#[test]
fn instances_follow_the_schedule() {
    let c = chain(EXAMPLE_CHAIN);
    let e = validate_err("events:\n  - at: { percent: 10 }\n    crash: { vertex: nat, instance: 1 }\n", &c);
    assert_eq!((e.line, e.field.as_str()), (Some(2), "events.0.crash.instance"));
    assert!(e.message.contains("has 1 instance(s)") && e.message.contains("no instance 1"), "{e}");
    // A scale earlier in the schedule makes the index exist; listed later, it does not.
    let ok = "events:\n  - at: { percent: 10 }\n    scale: { vertex: nat, to: 3 }\n  - at: { percent: 20 }\n    move: { vertex: nat, from: 2, to: 0 }\n";
    assert_eq!(parsed(ok).validate(&c), Ok(()));
    let late = "events:\n  - at: { percent: 20 }\n    move: { vertex: nat, from: 2, to: 0 }\n  - at: { percent: 10 }\n    scale: { vertex: nat, to: 3 }\n";
    assert_eq!(parsed(late).validate(&c), Ok(()), "trace order, not file order, when all use percent");
    let before = "events:\n  - at: { percent: 5 }\n    move: { vertex: nat, from: 2, to: 0 }\n  - at: { percent: 10 }\n    scale: { vertex: nat, to: 3 }\n";
    let e = validate_err(before, &c);
    assert_eq!(e.field, "events.0.move.from");
    // Scaling in removes the high indices.
    let e = validate_err("events:\n  - at: { packet: 10 }\n    scale: { vertex: lb, by: 2 }\n  - at: { packet: 20 }\n    scale: { vertex: lb, by: -1 }\n  - at: { packet: 30 }\n    clone: { vertex: lb, instance: 2 }\n", &c);
    assert_eq!((e.line, e.field.as_str()), (Some(6), "events.2.clone.instance"));
    // Never 0 instances.
    let e = validate_err("events:\n  - at: { packet: 10 }\n    scale: { vertex: lb, by: -1 }\n", &c);
    assert_eq!(e.field, "events.0.scale.by");
    assert!(e.message.contains("leave it with 0"), "{e}");
    // A scale-out policy lets indices up to its max through.
    let managed = "events:\n  - at: { percent: 50 }\n    crash: { vertex: portscan, instance: 2 }\npolicies:\n  - { vertex: portscan, scale_out_above: { queue: 100 }, max_instances: 3 }\n";
    assert_eq!(parsed(managed).validate(&c), Ok(()));
    let e = validate_err(&managed.replace("instance: 2", "instance: 3"), &c);
    assert!(e.message.contains("allows up to 3"), "{e}");
    // Past the end of the trace.
    let s = parsed("events:\n  - at: { packet: 70000 }\n    crash_root: {}\n");
    assert_eq!(s.validate(&c), Ok(()));
    let e = s.validate_for_trace(&c, DEMO_PACKETS).err();
    assert!(e.is_some_and(|e| e.message.contains("past the end")));
}

#[test]
fn events_built_in_code_are_checked_and_described() {
    let c = chain(EXAMPLE_CHAIN);
    let s = FaultSchedule {
        events: vec![FaultEvent {
            at: At::Percent(10.0),
            action: Action::Move { vertex: "nat".into(), from: 0, to: 0, flows: None },
            line: None,
        }],
        ..FaultSchedule::default()
    };
    let e = s.validate(&c).err();
    assert!(e.as_ref().is_some_and(|e| e.field == "events.0.move.to" && e.line.is_none()), "{e:?}");
    let text = e.map(|e| e.to_string()).unwrap_or_default();
    assert!(text.starts_with("<schedule>: field `events.0.move.to`: move all flows of nat 0>0 at 10%:"), "{text}");
}

#[test]
fn resolve_rounds_and_sorts() {
    let s = parsed(FULL);
    let r = s.resolve(DEMO_PACKETS);
    let counts: Vec<u64> = r.iter().map(|(c, _)| *c).collect();
    assert_eq!(counts, vec![1, 19_723, 20_000, 26_298, 30_000, 32_872, 39_446]);
    assert_eq!(r[0].1.action.key(), "slow");
    assert_eq!(r[1].1.action.key(), "clone");
    // Percentages of tiny traces are at least 1; equal counts keep file order.
    let s =
        parsed("events:\n  - at: { percent: 20 }\n    crash_store: {}\n  - at: { packet: 1 }\n    crash_root: {}\n");
    let r = s.resolve(2);
    assert_eq!(
        r.iter().map(|(c, e)| (*c, e.action.key())).collect::<Vec<_>>(),
        vec![(1, "crash_store"), (1, "crash_root")]
    );
    assert_eq!(At::Percent(50.0).resolve(0), 1);
    assert_eq!(At::Percent(99.9).resolve(1000), 999);
}

#[test]
fn random_schedules_are_valid_and_deterministic() {
    let small = chain(SMALL_CHAIN);
    let example = chain(EXAMPLE_CHAIN);
    let mut kinds = std::collections::BTreeSet::new();
    for seed in 0..500u64 {
        for (c, total) in [(&small, 10_000u64), (&example, DEMO_PACKETS), (&small, 3)] {
            let s = FaultSchedule::random(seed, c, total, 6);
            assert!((1..=6).contains(&s.events.len()));
            assert_eq!(s.seed, seed);
            if let Err(e) = s.validate(c).and_then(|()| s.validate_for_trace(c, total)) {
                panic!("seed {seed}: {e}\n{}", s.to_yaml());
            }
            // File order is trace order.
            let resolved: Vec<*const FaultEvent> = s.resolve(total).iter().map(|(_, e)| *e as *const _).collect();
            let listed: Vec<*const FaultEvent> = s.events.iter().map(|e| e as *const _).collect();
            assert_eq!(resolved, listed, "seed {seed}");
            for e in &s.events {
                kinds.insert(e.action.key());
                if let Action::Slow { delay_us: (lo, hi), .. } = e.action {
                    assert!(lo <= hi && hi <= RANDOM_MAX_DELAY_US);
                }
                if let Action::Scale { to: ScaleTo::Exactly(n), .. } = e.action {
                    assert!((1..=RANDOM_MAX_INSTANCES).contains(&n));
                }
            }
        }
        assert_eq!(FaultSchedule::random(seed, &small, 10_000, 6), FaultSchedule::random(seed, &small, 10_000, 6));
    }
    assert_eq!(kinds.len(), ACTIONS.len(), "every action kind drawn: {kinds:?}");
    assert_ne!(FaultSchedule::random(1, &small, 10_000, 6), FaultSchedule::random(2, &small, 10_000, 6));
    assert_eq!(FaultSchedule::random(3, &small, 10_000, 0).events.len(), 1);
}

#[test]
fn round_trip_through_yaml() {
    let small = chain(SMALL_CHAIN);
    for seed in 0..500u64 {
        let s = FaultSchedule::random(seed, &small, 1 + seed * 97, 8);
        let text = s.to_yaml();
        let back = match FaultSchedule::parse(&text, Path::new("rt.yaml")) {
            Ok(b) => b,
            Err(e) => panic!("seed {seed}: {e}\n{text}"),
        };
        assert_eq!(content(&back), content(&s), "seed {seed}\n{text}");
        assert!(back.events.iter().all(|e| e.line.is_some()));
    }
    for text in [FULL, "events: []\n"] {
        let s = parsed(text);
        assert_eq!(content(&parsed(&s.to_yaml())), content(&s));
    }
    // Awkward numbers and names.
    let mut s = FaultSchedule { seed: u64::MAX, ..FaultSchedule::default() };
    for (i, name) in ["yes", "a b", "1x", "null", "q\"uote", "x:y", "-dash", "nat"].iter().enumerate() {
        s.events.push(FaultEvent {
            at: At::Percent(0.1 + i as f64 * 7.3),
            action: Action::Clone { vertex: name.to_string(), instance: 1 },
            line: None,
        });
    }
    s.events.push(FaultEvent { at: At::Percent(1e-7), action: Action::CrashStore, line: None });
    s.policies.push(Policy {
        vertex: "on".into(),
        scale_out_above: Some(Threshold { queue: Some(5), load: Some(0.123456789) }),
        scale_in_below: Some(Threshold { queue: None, load: Some(1e-9) }),
        max_instances: Some(64),
        min_instances: Some(1),
        straggler_slower_by_percent: Some(1e300),
        line: None,
    });
    let back = parsed(&s.to_yaml());
    assert_eq!(content(&back), content(&s), "{}", s.to_yaml());
}
