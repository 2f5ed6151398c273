//! The Sluice chain runtime: chain files ([`spec`]), traffic filters ([`filter`]), compilation
//! to a physical graph ([`plan`]), execution ([`exec`]) between sources and sinks ([`ports`]),
//! run reports ([`report`]), one chain over several nodes ([`spread`]), the root's packet log in the store ([`root_log`]), live statistics of a running chain ([`live`]) and what a recorded
//! run keeps for verification ([`record`]).
mod clocks;
pub mod disruption;
pub mod exec;
pub mod filter;
pub mod live;
mod order;
pub mod plan;
pub mod ports;
pub mod record;
pub mod report;
pub mod root_log;
pub mod spec;
pub mod spread;
pub mod store_claim;

pub use exec::{run, Overflow, RunConfig, RunError, RunHooks};
pub use plan::{compile, compile_with, Plan, PlanError, StateConfig};
pub use ports::{CollectSink, DiscardSink, Fill, MemorySource, Sink, Source};
pub use report::RunReport;
pub use spec::{Chain, SpecError};
pub use spread::{Part, Spread, SpreadError};
