//! The store conformance suite (`sluice_store::conformance`) against Redis: one test per check
//! on a single server (16 buckets and 1 bucket) and on the 3-node cluster, each in a fresh
//! keyspace. Needs `SLUICE_REDIS_URL` and `SLUICE_REDIS_CLUSTER_URL` (see
//! `scripts/redis-env.sh`); fails without them.

mod common;

use common::{fresh, Target};
use sluice_store::conformance;
use sluice_store::Backend;

fn run(t: Target, params: &str, name: &str) {
    let f = fresh(t, params);
    let check = conformance::all().into_iter().find(|(n, _)| *n == name).map(|(_, c)| c).expect("check exists");
    if let Err(e) = check(&f.backend) {
        panic!("{name} on {}: {e}", f.backend.name());
    }
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        mod single {
            $(#[test] fn $name() { super::run(super::Target::Single, "", stringify!($name)); })*
        }
        mod single_one_bucket {
            $(#[test] fn $name() { super::run(super::Target::Single, "buckets=1", stringify!($name)); })*
        }
        mod cluster {
            $(#[test] fn $name() { super::run(super::Target::Cluster, "", stringify!($name)); })*
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

/// The whole suite, sequentially, on one keyspace of each target (state left by one check must
/// not disturb the next).
#[test]
fn whole_suite_on_one_store() {
    for t in [Target::Single, Target::Cluster] {
        let f = fresh(t, "");
        for (name, check) in conformance::all() {
            if let Err(e) = check(&f.backend) {
                panic!("{name} on {}: {e}", f.backend.name());
            }
        }
    }
}
