//! Changes asked of a running chain through its live handle (what a control endpoint does):
//! an answer says what the run did, so the changes answered "made" are exactly those the
//! run's report lists — also for those asked while the input runs out.

use sluice_runtime::exec::Change;
use sluice_runtime::live::{Live, LiveError};
use sluice_runtime::{compile_with, run, Chain, CollectSink, MemorySource, RunConfig, RunHooks, StateConfig};
use sluice_store::{ClientConfig, EmbeddedStore};
use std::path::Path;
use std::sync::Arc;

const CHAIN: &str = "
vertices:
  a: { type: passthrough, instances: 2 }
  b: { type: passthrough }
edges:
  - { from: input, to: a }
  - { from: a, to: b }
  - { from: b, to: output }
";

#[test]
fn changes_answered_made_are_exactly_those_the_report_lists() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/echo-connections.pcap");
    let pkts = sluice_io::load(p, None).expect("trace");
    let chain = Chain::parse(CHAIN, Path::new("live.yaml")).expect("chain");
    let backend = Arc::new(EmbeddedStore::start(1).expect("store"));
    let state = StateConfig::Store { backend, client: ClientConfig::default() };
    for round in 0..3 {
        let plan = compile_with(&chain, &sluice_nfs::registry(), &pkts, &state).expect("plan");
        let live = Arc::new(Live::new(&plan));
        let cfg = RunConfig { workers: 2, pin: false, batch: 8, scalable: true, ..RunConfig::default() };
        // Asks without a pause until the run says its input has ended: flows moved from one
        // instance to the other and back (always possible), and a scale-out now and then
        // (refused once the indices kept for scaling are used up).
        let asker = {
            let live = live.clone();
            std::thread::spawn(move || {
                let (mut made, mut refused, mut asked) = (0usize, 0usize, 0usize);
                loop {
                    let change = match asked % 8 {
                        7 => Change::ScaleBy(1),
                        n => Change::Move { from: (n % 2) as u16, to: 1 - (n % 2) as u16, flows: Some(10) },
                    };
                    asked += 1;
                    match live.request_change("a", change) {
                        Ok(done) => {
                            made += usize::from(done.change.is_some());
                            assert!(done.at_packet.is_some(), "a change made says where: {done:?}");
                        }
                        Err(LiveError::Refused(why)) if why.contains("input has ended") => return (made, refused),
                        // Before the run starts, or the indices kept for scaling used up.
                        Err(LiveError::Refused(_)) => {
                            refused += 1;
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("unexpected answer: {e}"),
                    }
                }
            })
        };
        let hooks = RunHooks { live: Some(live.clone()), ..RunHooks::default() };
        let r = run(plan, &cfg, &mut MemorySource::new(&pkts), &mut CollectSink::default(), hooks).expect("run");
        let (made, refused) = asker.join().expect("the asker");
        assert!(made >= 10, "round {round}: only {made} changes were made while the run went");
        assert_eq!(r.packets_out, pkts.len() as u64, "round {round}: nothing lost");
        assert_eq!(
            r.reconfigurations.len(),
            made,
            "round {round}: every change answered made is in the report, and only those ({refused} refused)"
        );
    }
}
