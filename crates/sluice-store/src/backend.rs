//! The interface every store backend implements.

use crate::wire::{Checkpoint, Found, Notification, Replies, Request};
use crate::StoreKey;
use sluice_packet::{Clock, InstanceId};
use sluice_state::{CustomOp, Value};
use std::sync::Arc;
use std::time::Duration;

/// Why a store operation failed at the transport level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum StoreError {
    /// The store is unreachable or closed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something that does not fit the protocol.
    #[error("store protocol: {0}")]
    Protocol(String),
    /// A request was not answered in time.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store refuses this connection's batches: its instance was failed over, and its
    /// replacement fenced every connection of an earlier epoch ([`Backend::fence`]).
    #[error(
        "store refused instance {vertex}:{index} of epoch {epoch}: it was failed over and is fenced below epoch {fenced} (a replacement serves in its place)"
    )]
    Fenced {
        /// The instance's vertex.
        vertex: u16,
        /// The instance's index in its vertex.
        index: u16,
        /// The epoch this connection was opened with.
        epoch: u32,
        /// The lowest epoch the store still accepts from the instance.
        fenced: u32,
    },
}

impl StoreError {
    /// The refusal of instance `client`'s connection of `epoch`, fenced below `fenced`.
    pub fn fenced(client: InstanceId, epoch: u32, fenced: u32) -> StoreError {
        StoreError::Fenced { vertex: client.vertex(), index: client.index(), epoch, fenced }
    }
}

/// One instance's connection. Requests go out in batches; replies and notifications are
/// collected when the client asks, so a client never blocks unless it chooses to wait. Within a
/// connection, requests on one value are applied in the order they were sent.
pub trait Connection: Send {
    /// Sends batch number `number`: numbers start at 1 and grow by one per new batch of this
    /// connection; a batch sent again (retransmission) keeps its number. The store applies each
    /// number once and in number order (holding a batch until those before it have arrived),
    /// and acknowledges it in [`Replies::acked`] once every request in it has been applied —
    /// again for a duplicate. The batch is shared, not copied, so the client can keep it.
    fn send(&mut self, number: u64, batch: Arc<[Request]>) -> Result<(), StoreError>;
    /// Appends what has arrived, without waiting.
    fn poll(&mut self, out: &mut Replies) -> Result<(), StoreError>;
    /// Waits up to `timeout` for something to arrive, appending it.
    fn wait(&mut self, out: &mut Replies, timeout: Duration) -> Result<(), StoreError>;
    /// Appends notifications that have arrived, without waiting.
    fn notifications(&mut self, out: &mut Vec<Notification>) -> Result<(), StoreError>;
    /// Tells the connection whether a batch without a call in it may wait a little for the
    /// store (applied at the store's next turn rather than with a wakeup of its own): true for
    /// a client that waits for nothing but calls' answers and, through
    /// [`Connection::wait`], acknowledgements — a run without the root's log. Ignored by
    /// default.
    fn allow_lazy_batches(&mut self, _lazy: bool) {}
    /// Asks the connection to unpark `thread` whenever replies or notifications arrive, for a
    /// caller that waits on several sources at once (a store server waits on its socket too)
    /// and therefore parks itself instead of calling [`Connection::wait`]. Returns whether the
    /// connection will: `false` (the default) means the caller must poll. A connection given
    /// a waker is not also waited on.
    fn set_waker(&mut self, _thread: std::thread::Thread) -> bool {
        false
    }
    /// How long an answer may take without anything being wrong: a connection that waits
    /// for a store to fail over before it answers (or reports the failure) says so, and a
    /// caller waits at least this long before it gives up. Zero (the default): the caller's
    /// own timeout applies.
    fn patience(&self) -> Duration {
        Duration::ZERO
    }
    /// Stops applying: a batch being applied is finished, those still queued are not (the
    /// client sends them again after it reconnects), and what has arrived is appended to
    /// `out`. Afterwards the connection applies nothing more and `send` may fail. Asked before
    /// the store is wiped and rebuilt (a store crash): the rebuild must know everything the
    /// connection will ever apply. The default suits a connection that applies a batch within
    /// `send`: it only polls.
    fn halt(&mut self, out: &mut Replies) -> Result<(), StoreError> {
        self.poll(out)
    }
}

/// Where [`Backend::takeover`] sends its parts.
pub type TakeoverParts = std::sync::mpsc::Sender<Option<Takeover>>;

/// (A part of) what a failed instance's replacement takes over from the store
/// ([`Backend::takeover`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Takeover {
    /// The timers its predecessor armed on its vertex's keys, with their deadlines.
    pub timers: Vec<(StoreKey, u64)>,
    /// The values of the objects asked for; `None` when not asked for, or when the backend
    /// cannot list them (the replacement then reads each value on first touch).
    pub values: Option<Vec<(StoreKey, Value)>>,
    /// What the store's per-clock log kept of the earlier values of the vertex's keys: per
    /// logged update, its clock and number and what it found. With it the replacement answers
    /// its replayed packets' reads as of their clocks itself; `None` when the backend does not
    /// list it (the replacement then asks the store for each such read).
    #[serde(default)]
    pub history: Option<Vec<(Clock, u32, Found)>>,
}

/// A store.
pub trait Backend: Send + Sync {
    /// A short name for reports (`embedded`, `redis://...`).
    fn name(&self) -> String;
    /// Registers the custom operations of a vertex's NF (same list for every instance).
    fn register_custom_ops(&self, vertex: u16, ops: &[CustomOp]) -> Result<(), StoreError>;
    /// Connects on behalf of `client` without an epoch: what acts for an instance rather than
    /// being it (a store rebuild's replayer, a takeover's roll-forward, a claim made for it).
    /// Such a connection is never fenced; an instance itself connects with
    /// [`Backend::connect_at`].
    fn connect(&self, client: InstanceId) -> Result<Box<dyn Connection>, StoreError>;
    /// Connects instance `client` in its `epoch` (0 for an instance started with the run; its
    /// replacements count up). Once [`Backend::fence`] has fenced the instance below some
    /// epoch, a connection of a lower one is refused, here and at its next batch
    /// ([`StoreError::Fenced`]).
    fn connect_at(&self, client: InstanceId, epoch: u32) -> Result<Box<dyn Connection>, StoreError>;
    /// Fences instance `client` below `epoch` (a lower `epoch` than the store has changes
    /// nothing): from the return on, the store applies no batch of a connection of `client`
    /// opened with a lower epoch, and refuses it ([`StoreError::Fenced`]); every batch of such
    /// a connection the store applies was applied before the return, entirely. What a failover
    /// of an instance on another node asks first, before it reads what its predecessor did:
    /// that node may be only paused or cut off and write on when it wakes (docs/decisions.md,
    /// "Fencing a failed node at the store"). A store that is wiped forgets its fences.
    fn fence(&self, client: InstanceId, epoch: u32) -> Result<(), StoreError>;
    /// Takes a checkpoint of all values and the TS vector.
    fn checkpoint(&self) -> Result<Checkpoint, StoreError>;
    /// The timers instance `owner` has armed on its vertex's keys, with their deadlines: what
    /// its replacement (same id) or its clone takes over. The default reads a whole checkpoint;
    /// a backend that can should answer it without copying every value.
    fn timers_of(&self, owner: InstanceId) -> Result<Vec<(StoreKey, u64)>, StoreError> {
        let cp = self.checkpoint()?;
        let mine = cp.timers.into_iter().filter(|(k, _, o)| *o == owner && k.vertex == owner.vertex());
        Ok(mine.map(|(k, d, _)| (k, d)).collect())
    }
    /// The values of `vertex`'s objects `objects` (its per-flow objects, say), all at once: what
    /// a replacement of the vertex's only instance loads before it serves, instead of reading
    /// each flow's value on the flow's first packet. `None`: this backend cannot list them
    /// without copying the whole store, and the replacement reads on first touch.
    fn values_of(&self, _vertex: u16, _objects: &[u16]) -> Result<Option<Vec<(StoreKey, Value)>>, StoreError> {
        Ok(None)
    }
    /// Whether other processes (on this machine or others) reach the same store: Redis, or an
    /// embedded store another process serves. An embedded store in this process is this
    /// process's alone, so a vertex whose instances run on several nodes cannot keep its
    /// shared state in it.
    fn is_shared(&self) -> bool {
        false
    }
    /// Whether a tagged read (a replayed packet's) returns the value as it was at the tag:
    /// before the first logged update of it at the tag's clock and number or later — the
    /// packet's own earlier updates count — (the embedded store and Redis). Otherwise it reads
    /// the value as it is now.
    fn reads_as_of(&self) -> bool {
        false
    }
    /// Whether [`Backend::takeover`] returns at once, its parts sent later by the store's own
    /// threads (the embedded store). Otherwise the caller gives it a thread of its own, so
    /// that the replacement is not held up while the backend reads.
    fn takeover_returns_at_once(&self) -> bool {
        false
    }
    /// Finishes a batch of failed instance `owner` that the store applied only in part, for a
    /// backend that can apply a batch non-atomically (Redis Cluster: one call per node). Its
    /// replacement would otherwise read some of the batch's updates and not others. Called
    /// first in [`Backend::takeover`]; returns how many operations were applied again: tagged
    /// updates (those applied before are answered from the per-clock log) and timer mirrors
    /// (idempotent). The default has none: a store that applies each batch atomically.
    fn finish_interrupted_batch(&self, owner: InstanceId) -> Result<usize, StoreError> {
        let _ = owner;
        Ok(0)
    }
    /// What the replacement of failed instance `owner` takes over: the timers its predecessor
    /// armed ([`Backend::timers_of`]) and, with `objects` (it is its vertex's only instance),
    /// the values of those objects of its vertex ([`Backend::values_of`]). Sent to `parts` in
    /// one or more parts as they are read, so that the replacement takes a part in while the
    /// store reads the next; each independent reader (the embedded store's shards) ends its
    /// parts with `None`. Returns how many `None`s come. A backend that can should answer
    /// without blocking the caller and in one pass over its contents; the default reads here.
    fn takeover(&self, owner: InstanceId, objects: Option<&[u16]>, parts: &TakeoverParts) -> Result<usize, StoreError> {
        self.finish_interrupted_batch(owner)?;
        let timers = self.timers_of(owner)?;
        let values = match objects {
            Some(objects) => self.values_of(owner.vertex(), objects)?,
            None => None,
        };
        let _ = parts.send(Some(Takeover { timers, values, history: None }));
        let _ = parts.send(None);
        Ok(1)
    }
    /// The clocks of the per-clock log that hold a tagged update of `vertex`: packets an
    /// instance of the vertex processed whose updates reached the store. What a failed node's
    /// instances did is known from here once the node is gone (docs/decisions.md, "What a
    /// replacement of another node's instance skips"). The default reads a whole checkpoint.
    fn clocks_updated_by(&self, vertex: u16) -> Result<Vec<Clock>, StoreError> {
        let mut clocks: Vec<Clock> =
            self.checkpoint()?.log.iter().filter(|l| l.vertex == vertex).map(|l| l.clock).collect();
        clocks.sort_unstable();
        clocks.dedup();
        Ok(clocks)
    }
    /// Replaces the store's contents with a checkpoint: its values, its TS vector and its
    /// timers (re-armed for the instances listed; a deadline already past fires at the next
    /// advance of packet time). Owners, subscribers and the per-clock log are cleared.
    fn restore(&self, checkpoint: &Checkpoint) -> Result<(), StoreError>;
    /// Simulates the crash of the store instance and its replacement by a fresh, empty one:
    /// every value, owner, claimant, subscriber and timer, the per-clock log, the TS vector, the
    /// packet time, pending notifications and the per-connection batch-sequence state are lost.
    /// Registered custom operations may be lost too (the embedded store loses them; the Redis
    /// backend keeps them in the client process): callers re-register them after a wipe.
    ///
    /// Connections opened before the wipe must not be used afterwards: the store no longer
    /// knows their batch numbers, so clients open a NEW [`Connection`] (whose batches are
    /// numbered from 1 again) — as they would to reach a replacement store process.
    fn wipe(&self) -> Result<(), StoreError>;
}
