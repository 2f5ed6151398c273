//! The Sluice chain runtime: chain files ([`spec`]), traffic filters ([`filter`]), compilation
//! to a physical graph ([`plan`]), execution ([`exec`]), run reports ([`report`]), live
//! statistics of a running chain ([`live`]) and what a recorded run keeps for verification
//! ([`record`]).
pub mod exec;
pub mod filter;
pub mod live;
pub mod plan;
pub mod record;
pub mod report;
pub mod spec;

pub use exec::{
    run, CollectSink, DiscardSink, Fill, MemorySource, Overflow, RunConfig, RunError, RunHooks, Sink, Source,
};
pub use plan::{compile, compile_with, Plan, PlanError, StateConfig};
pub use report::RunReport;
pub use spec::{Chain, SpecError};
