//! The state API every Sluice NF uses. NFs keep no mutable state of their own: each state
//! object is *declared* (name, scope, access pattern) and reached through a [`StateHandle`] by
//! operations ([`StateOp`]) on keyed values. The declaration is what lets a backend choose a
//! strategy per object (CHC Table 1): this crate ships the local-memory backend
//! ([`LocalState`], the traditional NF); externalised backends implement the same trait.
//!
//! Operations are values, not method calls on a data structure, so that the same request can be
//! executed in place, batched to a store, logged with the packet's clock or replayed.

mod decl;
mod handle;
mod local;
pub mod ops;
mod value;

pub use decl::{
    cached_while_alone, AccessPattern, CustomOp, CustomOpFn, ObjectId, Scope, StateDecl, MAX_TIMER_SLACK_NS,
};
pub use handle::{DueTimers, StateError, StateHandle, TimerFired};
pub use local::{LocalState, Timers};
pub use value::{StateKey, StateOp, Value};
