//! One conformance suite for every store backend (embedded, Redis, Redis Cluster).
//!
//! Each check takes a [`Backend`], talks to it only through the public API (raw
//! [`Connection`]s, or a [`StoreClient`] where client behaviour is the subject) and returns a
//! description of the first violation it finds. [`all`] lists them by name so a test harness
//! can generate one test per check.
//!
//! # Sharing one store
//! Every check uses its own vertex ids (1001–1034, plus 1102 and 1106 as second vertices), so
//! checks never address each other's values. Keys and packet clocks are further made unique per
//! run (derived from the wall clock and a process-wide counter, see [`fresh_base`]), so the suite
//! can be run repeatedly against a store that is never emptied (a Redis server), without a
//! previous run's values or per-clock log entries getting in the way. Two caveats:
//! - [`checkpoint_restore`] and [`checkpoint_timers`] replace the whole store's contents and
//!   [`wipe_empties_store`] empties it: run the checks listed in [`EXCLUSIVE`] alone, not
//!   concurrently with other checks on the same store.
//! - `ForgetClock(c)` lets the store forget the log of clocks `≤ c` — of every root, and the
//!   embedded store forgets in arrival order (an entry goes once every entry logged before it has
//!   a clock `≤ c`). [`forget_clock_reapplies`] therefore sends a `c` of root 255, above every
//!   clock logged before it; it too must run alone. Every other check tags with root 1.
//!
//! # Contracts the suite relies on (beyond the trait docs)
//! - Notifications about one key reach a client in the order the store generated them; "nothing
//!   was delivered" is checked by a later notification on the same key that must arrive, then
//!   counting (no timing assumptions).
//! - A failure of a request sent without `reply` arrives no later than its batch's ack.
//! - Every wait is bounded by [`TIMEOUT`].
//!
//! [`Connection`]: crate::backend::Connection
//! [`StoreClient`]: crate::client::StoreClient

// The checks, grouped by what they check; `raw` and `support` are what they share.
mod callbacks;
mod checkpoints;
mod client_modes;
mod concurrency;
mod exactly_once;
mod ownership;
mod raw;
mod semantics;
mod support;
mod timers;

pub use callbacks::{callbacks_client, callbacks_raw, reconnected_instance_notified};
pub use checkpoints::{checkpoint_restore, checkpoint_timers, ts_vector_on_reads, wipe_empties_store};
pub use client_modes::{client_modes_agree, client_modes_agree_seed};
pub use concurrency::{
    concurrent_incr, concurrent_incr_sums, concurrent_pops, concurrent_pops_unique, nonblocking_in_issue_order,
};
pub use exactly_once::{
    deferred_batches_commit_once_sent, forget_clock_reapplies, logged_results_told,
    packets_without_updates_are_marked_processed, recorded_values_repeat, replayed_reads_as_of_their_clock,
    retransmit_applied_once, tagged_reads_not_logged, timer_updates_leave_a_packets_tags, timers_keep_their_own_tags,
};
pub use ownership::{fenced_instances_refused, owner_writes_logged, ownership_handover};
pub use semantics::{ops_semantics, value_and_key_fidelity};
pub use support::{fresh_base, least_loaded_incr, Rng, BASE_STRIDE, CUSTOM_OPS};
pub use timers::{
    a_shared_timer_due_in_its_batch_fires, flow_timers_fire_in_turn_at_an_order_sensitive_vertex,
    idle_timers_copied_when_they_move, only_the_current_timer_expires,
    shared_key_timers_fire_at_any_instance_of_the_vertex, timers_fire_once, twins_share_timers,
};

use crate::backend::Backend;
use std::time::Duration;

/// The longest any check waits for something the store should deliver.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A conformance check: `Ok` if the backend behaves, else what went wrong.
pub type Check = fn(&dyn Backend) -> Result<(), String>;

/// Checks that replace the whole store's contents: run them alone on a shared store.
pub const EXCLUSIVE: &[&str] = &[
    "checkpoint_restore",
    "forget_clock_reapplies",
    "checkpoint_timers",
    "wipe_empties_store",
    "replayed_reads_as_of_their_clock",
];

/// Runs check `name` of [`all`] against `backend` and panics with what it found: what the
/// tests that [`conformance_tests!`](crate::conformance_tests) generates call.
pub fn run_check(backend: &dyn Backend, name: &str) {
    let Some((_, check)) = all().into_iter().find(|(n, _)| *n == name) else {
        panic!("no conformance check named {name}");
    };
    if let Err(e) = check(backend) {
        panic!("{name} on {}: {e}", backend.name());
    }
}

/// Generates, for each `module => run` pair, a module with one `#[test]` per check of [`all`]
/// calling `run(name)` (a closure or function taking the check's name, which typically makes a
/// backend and calls [`run_check`]), plus a test that the list here and [`all`] agree. The one
/// list of check names for every backend's test suite:
///
/// ```text
/// sluice_store::conformance_tests!(one_shard => |name| super::run(1, name), three_shards => |name| super::run(3, name));
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($($module:ident => $run:expr),+ $(,)?) => {
        $(
            mod $module {
                $crate::conformance_tests!(@tests $run;
                    ops_semantics, value_and_key_fidelity, concurrent_pops_unique, concurrent_incr_sums,
                    nonblocking_in_issue_order, retransmit_applied_once, forget_clock_reapplies,
                    callbacks_raw, callbacks_client, ownership_handover, timers_fire_once,
                    only_the_current_timer_expires, twins_share_timers,
                    a_shared_timer_due_in_its_batch_fires,
                    shared_key_timers_fire_at_any_instance_of_the_vertex,
                    flow_timers_fire_in_turn_at_an_order_sensitive_vertex, checkpoint_restore,
                    ts_vector_on_reads, client_modes_agree, reconnected_instance_notified,
                    checkpoint_timers, wipe_empties_store, tagged_reads_not_logged,
                    recorded_values_repeat, owner_writes_logged, timer_updates_leave_a_packets_tags,
                    timers_keep_their_own_tags, replayed_reads_as_of_their_clock,
                    packets_without_updates_are_marked_processed, logged_results_told,
                    fenced_instances_refused, idle_timers_copied_when_they_move,
                    deferred_batches_commit_once_sent);
            }
        )+
    };
    (@tests $run:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                let run: &dyn Fn(&str) = &$run;
                run(stringify!($name));
            }
        )*
        #[test]
        fn every_check_has_a_test() {
            let listed: Vec<&str> = $crate::conformance::all().into_iter().map(|(n, _)| n).collect();
            assert_eq!(listed, [$(stringify!($name)),*], "conformance::all() and conformance_tests! list different checks");
        }
    };
}

/// Every check, by name.
pub fn all() -> Vec<(&'static str, Check)> {
    vec![
        ("ops_semantics", ops_semantics as Check),
        ("value_and_key_fidelity", value_and_key_fidelity),
        ("concurrent_pops_unique", concurrent_pops_unique),
        ("concurrent_incr_sums", concurrent_incr_sums),
        ("nonblocking_in_issue_order", nonblocking_in_issue_order),
        ("retransmit_applied_once", retransmit_applied_once),
        ("forget_clock_reapplies", forget_clock_reapplies),
        ("callbacks_raw", callbacks_raw),
        ("callbacks_client", callbacks_client),
        ("ownership_handover", ownership_handover),
        ("timers_fire_once", timers_fire_once),
        ("only_the_current_timer_expires", only_the_current_timer_expires),
        ("twins_share_timers", twins_share_timers),
        ("a_shared_timer_due_in_its_batch_fires", a_shared_timer_due_in_its_batch_fires),
        ("shared_key_timers_fire_at_any_instance_of_the_vertex", shared_key_timers_fire_at_any_instance_of_the_vertex),
        (
            "flow_timers_fire_in_turn_at_an_order_sensitive_vertex",
            flow_timers_fire_in_turn_at_an_order_sensitive_vertex,
        ),
        ("checkpoint_restore", checkpoint_restore),
        ("ts_vector_on_reads", ts_vector_on_reads),
        ("client_modes_agree", client_modes_agree),
        ("reconnected_instance_notified", reconnected_instance_notified),
        ("checkpoint_timers", checkpoint_timers),
        ("wipe_empties_store", wipe_empties_store),
        ("tagged_reads_not_logged", tagged_reads_not_logged),
        ("recorded_values_repeat", recorded_values_repeat),
        ("owner_writes_logged", owner_writes_logged),
        ("timer_updates_leave_a_packets_tags", timer_updates_leave_a_packets_tags),
        ("timers_keep_their_own_tags", timers_keep_their_own_tags),
        ("replayed_reads_as_of_their_clock", replayed_reads_as_of_their_clock),
        ("packets_without_updates_are_marked_processed", packets_without_updates_are_marked_processed),
        ("logged_results_told", logged_results_told),
        ("fenced_instances_refused", fenced_instances_refused),
        ("idle_timers_copied_when_they_move", idle_timers_copied_when_they_move),
        ("deferred_batches_commit_once_sent", deferred_batches_commit_once_sent),
    ]
}
