//! Chain output equivalence (COE) for Sluice chains.
//!
//! * [`observed`]: what a run produced (outputs, decisions, final state), keyed by input packet;
//! * [`compare`]: the comparison `sluice verify` makes between the reference and the physical run;
//! * [`schedule`]: fault schedules (YAML) and random schedules for property tests.
pub mod compare;
pub mod observed;
pub mod schedule;

pub use observed::{Decision, Observed, OutputRecord, StateEntry};
pub mod engine;
pub mod reference;
pub mod verify;
