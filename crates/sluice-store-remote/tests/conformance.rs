//! The store conformance suite (`sluice_store::conformance`) against the embedded store served
//! over TCP: every check sees the served store only through `RemoteBackend`, so the remote
//! backend must carry the store's semantics (ordering, exactly-once, notifications, timers,
//! checkpoints, takeovers, wipes) unchanged.

use sluice_store::conformance;
use sluice_store::{Backend, EmbeddedStore};
use sluice_store_remote::{CustomOpRegistry, RemoteBackend, StoreFactory, StoreServer};
use std::sync::Arc;

/// A server of a fresh embedded store (with `threads` shards) that knows the suite's custom
/// operations, and a remote backend connected to it.
fn served(threads: usize) -> (StoreServer, RemoteBackend) {
    let registry: CustomOpRegistry = conformance::CUSTOM_OPS.iter().map(|o| (o.name, *o)).collect();
    let factory: StoreFactory = Box::new(move || Ok(Arc::new(EmbeddedStore::start(threads)?) as Arc<dyn Backend>));
    let server = StoreServer::start(factory, "127.0.0.1:0", "secret", registry).expect("serve");
    let url = format!("sluice://{}?token=secret", server.local_addr());
    let remote = RemoteBackend::connect(&url).expect("connect");
    (server, remote)
}

fn run(threads: usize, name: &str) {
    let (_server, remote) = served(threads);
    let check = conformance::all().into_iter().find(|(n, _)| *n == name).map(|(_, c)| c).expect("check exists");
    if let Err(e) = check(&remote) {
        panic!("{name} on {}: {e}", remote.name());
    }
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        mod one_shard {
            $(#[test] fn $name() { super::run(1, stringify!($name)); })*
        }
        mod two_shards {
            $(#[test] fn $name() { super::run(2, stringify!($name)); })*
        }
        #[test]
        fn every_check_has_a_test() {
            let listed: Vec<&str> = conformance::all().into_iter().map(|(n, _)| n).collect();
            let tested = [$(stringify!($name)),*];
            assert_eq!(listed, tested, "conformance::all() and the tests here list different checks");
        }
    };
}

checks!(
    ops_semantics,
    value_and_key_fidelity,
    concurrent_pops_unique,
    concurrent_incr_sums,
    nonblocking_in_issue_order,
    retransmit_applied_once,
    forget_clock_reapplies,
    callbacks_raw,
    callbacks_client,
    ownership_handover,
    timers_fire_once,
    only_the_current_timer_expires,
    twins_share_timers,
    a_shared_timer_due_in_its_batch_fires,
    shared_key_timers_fire_at_any_instance_of_the_vertex,
    checkpoint_restore,
    ts_vector_on_reads,
    client_modes_agree,
    reconnected_instance_notified,
    checkpoint_timers,
    wipe_empties_store,
    tagged_reads_not_logged,
    recorded_values_repeat,
);

/// The whole suite, one check after the other, on one served store with several clients'
/// connections coming and going.
#[test]
fn whole_suite_on_one_served_store() {
    let (server, remote) = served(2);
    for (name, check) in conformance::all() {
        if let Err(e) = check(&remote) {
            panic!("{name}: {e}");
        }
    }
    assert!(server.stats().instances.load(std::sync::atomic::Ordering::Relaxed) > 20);
}
