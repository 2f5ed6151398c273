//! Fault schedules: what happens to a running physical chain, and when, for `sluice verify
//! --faults F` and `sluice run --faults F` (format: docs/faults.md).
//!
//! ```yaml
//! seed: 7                                   # seeds random delays (default 0)
//! events:
//!   - at: { percent: 40 }                   # or { packet: 20000 } (1-based input packet count)
//!     crash: { vertex: nat, instance: 0 }
//!   - at: { percent: 60 }
//!     move: { vertex: nat, from: 0, to: 1, flows: 4000 }
//! policies:
//!   - { vertex: portscan, scale_out_above: { queue: 2000 }, max_instances: 4 }
//! ```
//!
//! [`FaultSchedule::parse`] checks the shape and the ranges (errors name the file, line and
//! field); [`FaultSchedule::validate`] checks the schedule against a chain (vertex names,
//! instance indices as scaling goes on); [`FaultSchedule::resolve`] turns percentages into
//! packet counts for a trace; [`FaultSchedule::random`] draws valid schedules for property
//! tests and [`FaultSchedule::to_yaml`] writes one back out.

mod check;
mod locate;
mod model;
mod parse;
mod random;
mod shrink;
mod unrecoverable;
mod yaml;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_run;

pub use model::{Action, At, FaultEvent, FaultSchedule, Policy, RunOptions, ScaleTo, Threshold};
pub use random::RANDOM_CHECKPOINTS;
pub use shrink::shrink_candidates;
pub use unrecoverable::{conflicts, last_vertices, Unrecoverable};

/// Most instances a schedule may give a vertex.
pub const MAX_INSTANCES: u16 = 64;
/// Most roots a `run:` section may ask for.
pub const MAX_ROOTS: u8 = 64;
/// Largest per-packet delay a `slow` event may add, µs (one second).
pub const MAX_DELAY_US: u64 = 1_000_000;
/// Most instances [`FaultSchedule::random`] scales a vertex to.
pub const RANDOM_MAX_INSTANCES: u16 = 4;
/// Most roots [`FaultSchedule::random`] gives a run.
pub const RANDOM_MAX_ROOTS: u8 = 3;
/// Most events [`FaultSchedule::random`] draws for `sluice fuzz` and the property tests.
pub const RANDOM_MAX_EVENTS: usize = 8;
/// Largest delay [`FaultSchedule::random`] gives a slowed instance, µs.
pub const RANDOM_MAX_DELAY_US: u64 = 20;

/// The action keys an event may carry (exactly one of them).
pub(crate) const ACTIONS: [&str; 7] = ["crash", "crash_root", "crash_store", "scale", "move", "slow", "clone"];

/// The fields of the `run:` section.
pub(crate) const RUN_FIELDS: [&str; 7] =
    ["roots", "log", "async_delete", "checkpoint_every", "chain", "input", "limit"];

/// A fault schedule that cannot be read, or does not fit its chain: located like a chain-file
/// error (file, line, dotted field; `<schedule>` for schedules built in code).
pub type ScheduleError = sluice_runtime::SpecError;
