//! A Redis store backend for Sluice: the [`Backend`]/[`Connection`] protocol of `sluice-store`
//! with exactly the embedded engine's semantics, executed atomically inside Redis (≥ 7) by a
//! Redis Functions library (`src/sluice.lua` and, for checkpoints, `src/checkpoint.lua`: one
//! library, loaded with `FUNCTION LOAD REPLACE` when the backend connects, and again on a
//! node where a call finds it missing: a primary the slot map names for the first time, one
//! restarted without its data, one an operator flushed; the call is then made again).
//!
//! # URLs
//! - `redis://host:port[/db][?prefix=P&buckets=N&replicas=R]`: one Redis server.
//! - `redis+cluster://h1:p1,h2:p2,...[?prefix=P&buckets=N&replicas=R]`: a Redis Cluster, given by any of
//!   its primaries (the slot map is read with `CLUSTER SLOTS`). Cluster mode is chosen by the
//!   scheme, not detected, so that a URL says what it means; a `redis://` URL pointing at a
//!   cluster node fails on the first key the node does not serve.
//!
//! `prefix` (default `sluice`, letters, digits, `-`, `_`, `.`) names the keyspace, so several
//! stores (and tests) share a server; [`RedisBackend::clear`] deletes it. `buckets` (default 16)
//! is the number of shards, the counterpart of the embedded store's threads. `replicas` (default
//! 0) is how many replicas must acknowledge every call's writes (`WAIT R 2000` after each
//! `FCALL`) before the batch counts as applied; without it a primary that fails loses the writes
//! its replica had not received yet, which Redis acknowledged all the same. A primary with too
//! few replicas (one that has just taken over from a failed primary, until the failed machine
//! comes back) holds the batch, repeating `WAIT`, for up to 30 s before the call fails.
//!
//! # Failover
//! In cluster mode a node that does not answer (or answers `MOVED`, `ASK`, `TRYAGAIN`,
//! `CLUSTERDOWN`, `READONLY` from a primary that came back as a replica, or "Function not
//! found" from one that came back without its data and has not synced yet) makes the connection
//! read the slot map again and regroup what that node had not done, with growing pauses, for up
//! to 30 s — long enough for Redis to promote a replica (node timeout plus an election). The
//! operations are then applied again: tagged updates are answered from the per-clock log, so an
//! update whose first answer was lost applies once; with `replicas=1` no acknowledged write is
//! lost (`tests/failover.rs` kills a primary mid-run; `crates/sluice-cli/tests/correlated.rs`
//! kills one as an NF instance of a running chain crashes, and the run stays equivalent).
//!
//! A node that answers `BUSY` (another client's script past its busy threshold) or `LOADING`
//! (reading its data after a restart) did not run the command: connecting and every call wait
//! for it the same way, for up to 30 s (`tests/busy.rs`).
//!
//! # Layout: buckets
//! Every value belongs to one of `buckets` buckets, by a stable hash (FNV-1a) of its key's
//! encoding. All keys of bucket `b` carry the hash tag `{P:b}`, so a bucket lives in one cluster
//! slot: a value's string or list, its metadata hash (form, version, owner, claimant, timer),
//! its subscriber set, and the bucket's own structures — the per-clock log and its index for
//! `ForgetClock`, what each logged update found before it (for a replayed packet's read, as of
//! its clock), the TS vector, the timer index, the packet time, and one notification list per
//! client. A bucket is exactly a shard of the embedded engine: the TS vector returned with a
//! read is the bucket's (as it is the shard's there), `ForgetClock` and `AdvanceTime` are
//! applied to every bucket in request order, and a checkpoint keeps each instance's highest
//! clock over all buckets. With `buckets=1` a single server behaves like a one-thread embedded
//! store. The layout is listed at the top of `sluice.lua`.
//!
//! # Execution
//! Each connection does its round trips on a thread of its own (`io_thread`): `send` hands the
//! batch over and returns, and the answers, acknowledgements and failures wait for `poll`.
//! Batches that queue up while the thread waits for Redis are applied together, as one unit of
//! up to 128 requests, so the calls per packet fall as the load rises. A caller waits for an
//! answer at least as long as the thread waits for a cluster to fail over
//! (`Connection::patience`), since the thread reports a failure itself.
//!
//! The thread groups a unit's requests by node (the node serving each bucket's slot; broadcast
//! requests go to every node) and sends each node **one** `FCALL sluice_exec` carrying its
//! requests in order, so a batch costs one round trip per node and each node applies its part
//! atomically, in issue order. Functions are called without declared keys and with the flag
//! `allow-cross-slot-keys` (a node serves many buckets); in cluster mode the function first
//! touches every bucket it was told about, so a bucket that moved (resharding) fails the call
//! before anything changed, and the client refreshes the slot map and regroups. The batch is
//! acknowledged when every node has answered; replies are queued for `poll`.
//!
//! A batch that needs more than one call (several nodes, more than 128 operations, or an
//! operation the client applies) is not atomic as a whole: its tagged updates and timer mirrors
//! are first stored as the client's *intent* (`{P:b}I`), in the same call as the first
//! operations of the node that keeps it, and cleared by one more call once every part is
//! applied, before the batch is acknowledged. A replacement of a client that died between two
//! calls finishes the batch (`Backend::finish_interrupted_batch`, run by `takeover`) before it
//! reads anything, so it never sees half a batch (docs/decisions.md, "A batch that spans Redis
//! nodes").
//!
//! # Values
//! See [`codec`]: `Int` is stored as decimal text (Lua increments it with `INCRBY`), other
//! values as a versioned binary encoding, lists as Redis lists of element encodings.
//! Compare-and-set compares encodings in Lua.
//!
//! # What runs in the client: custom operations (optimistic)
//! Custom operations are Rust `fn`s and cannot run inside Redis; neither can a few exact
//! cases of built-ins (incrementing a float, an `i64` increment that wraps, a compare-and-set
//! whose expected value holds a float). For those, `sluice_exec` stops at the operation and
//! returns the value's encoding and version (after the per-clock-log and ownership checks);
//! the connection applies the operation with `sluice_state::ops::apply` and sends a
//! conditional write (`W`) that applies only if the version is unchanged — and checks the log
//! and ownership again, logs the tag, updates the TS vector and notifies subscribers — followed
//! by the rest of the node's requests. On a version conflict the function returns the fresh
//! value and the connection retries. Each value's operations are therefore still atomic
//! (linearised at the conditional write) and tagged ones are applied exactly once.
//!
//! # Notifications
//! Functions `RPUSH` notifications to a per-bucket, per-client list; `notifications()` hands
//! out what the thread has drained and asks it to drain the caller's lists again (one function
//! call per node, at most once a millisecond). Lists rather than Pub/Sub, client
//! tracking or keyspace notifications because a notification must not be lost while its
//! client is not listening (a timer firing for an instance that has not polled yet), must be
//! delivered exactly once, and must be produced atomically with the change that caused it.
//!
//! # Source layout
//! [`codec`] (values and keys), `config` (the URL), `topology` (buckets to nodes, node
//! connections), `request` (requests as `sluice_exec` arguments), `reply` (reading replies),
//! `connection` (an instance's connection, blocking), `io_thread` (that connection on a thread of
//! its own) and `backend` ([`RedisBackend`]); the Lua library in `sluice.lua` (layout, the
//! operations, `sluice_exec`) and `checkpoint.lua` (`sluice_dump`, `sluice_restore`).
//!
//! [`Backend`]: sluice_store::Backend
//! [`Connection`]: sluice_store::Connection

pub mod codec;

mod backend;
mod config;
mod connection;
mod io_thread;
mod reply;
mod request;
mod topology;

pub use backend::RedisBackend;

/// The Lua library (Redis Functions).
pub const LIBRARY: &str = concat!(include_str!("sluice.lua"), "\n", include_str!("checkpoint.lua"));
