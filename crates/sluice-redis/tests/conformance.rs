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
    conformance::run_check(&f.backend, name);
}

sluice_store::conformance_tests!(
    single => |name| super::run(super::Target::Single, "", name),
    single_one_bucket => |name| super::run(super::Target::Single, "buckets=1", name),
    cluster => |name| super::run(super::Target::Cluster, "", name),
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
