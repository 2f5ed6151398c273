//! Chain output equivalence (COE) for Sluice chains.
//!
//! * [`observed`]: what a run produced (outputs, decisions, final state), keyed by input packet;
//! * [`reference`]: the logical chain's run (one instance per NF, no faults, entry order);
//! * [`engine`]: the physical chain under faults, with CHC's protocols;
//! * [`fuzz`]: random runs, their verdicts grouped by symptom, shrinking, regression files;
//! * [`root_log`]: the root's packet log kept in the state store (`--log store`);
//! * [`recorded`]: verifying a recorded run of the threaded runtime (`sluice verify --recorded`);
//! * [`compare`]: the comparison `sluice verify` makes between the reference and the physical run;
//! * [`schedule`]: fault schedules (YAML) and random schedules for property tests;
//! * [`verify`]: both runs and the comparison, as `sluice verify` does them.
pub mod compare;
pub mod engine;
pub mod fuzz;
pub mod observed;
pub mod recorded;
pub mod reference;
/// The root's packet log in the state store lives with the runtime, which keeps it too.
pub use sluice_runtime::root_log;
pub mod schedule;
pub mod verify;

pub use observed::{Decision, Observed, OutputRecord, StateEntry};
