//! The Sluice chain runtime: chain files ([`spec`]), traffic filters ([`filter`]), compilation
//! to a physical graph ([`plan`]), execution ([`exec`]) and run reports ([`report`]).
pub mod exec;
pub mod filter;
pub mod plan;
pub mod report;
pub mod spec;

pub use exec::{
    run, CollectSink, DiscardSink, Fill, MemorySource, Overflow, RunConfig, RunError, RunHooks, Sink, Source,
};
pub use plan::{compile, compile_with, Plan, PlanError, StateConfig};
pub use report::RunReport;
pub use spec::{Chain, SpecError};
