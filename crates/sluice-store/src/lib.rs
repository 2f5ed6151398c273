//! Externalised NF state (CHC §4, StatelessNF §3–5): the store protocol ([`wire`]), the backend
//! interface ([`backend`]), the embedded store engine ([`engine`]) and the client each NF
//! instance uses behind the ordinary state API ([`client`]), and the rebuilding of a failed store
//! instance from a checkpoint and the NF instances' logs ([`recovery`]).

pub mod backend;
pub mod client;
mod clock_log;
pub mod conformance;
pub mod engine;
pub mod recovery;
pub mod wire;

pub use backend::{Backend, Connection, StoreError, Takeover, TakeoverParts};
pub use client::{
    Answer, Ask, ClientConfig, ClientStats, Mode, StoreClient, VertexTimerTable, VertexTimers, NONDET_OBJECT,
    PROCESSED_OBJECT,
};
pub use engine::EmbeddedStore;
pub use wire::{
    timer_update_seq, Checkpoint, Found, LoggedResult, Notification, OpTag, Replies, Request, Response, StoreKey,
    StoreOp, TsVector, TIMER_UPDATE,
};
