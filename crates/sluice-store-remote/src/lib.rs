//! A Sluice state store shared by several processes: [`StoreServer`] serves a store (the
//! embedded one, in `sluice store serve`) over TCP, and [`RemoteBackend`] is the
//! [`Backend`](sluice_store::Backend) NF instances of other processes use to reach it
//! (`--store sluice://HOST:PORT`).
//!
//! The server applies everything with the served store's own semantics (exactly-once tags,
//! per-clock log, timers, ownership, notifications): the remote backend only carries the
//! store protocol ([`sluice_store::wire`]) over a socket, one TCP connection per NF instance
//! so that batches of one instance stay in order, plus one for administration. Custom
//! operations cannot travel as code: a client registers them by name and the server runs its
//! own copies, from the registry it was started with (the NF library's, for `sluice store
//! serve`). The wire format is in `docs/store-protocol.md`.

mod client;
pub mod protocol;
mod server;

pub use client::{RemoteBackend, RemoteUrl};
pub use server::{CustomOpRegistry, ServeError, ServerStats, StoreFactory, StoreServer, MAX_SPACES};
