//! The client's parameters: how much of CHC's machinery it uses, and for what kind of run.

use std::time::Duration;

/// How much of CHC's machinery a client uses (the paper's models, for comparison).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every operation goes to the store and is waited for.
    External,
    /// Plus caching by scope and access pattern.
    Cached,
    /// Plus non-blocking updates that are not waited for (the default).
    Async,
}

/// Client parameters.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The mode.
    pub mode: Mode,
    /// Dirty cached values are flushed to the store every this many batches.
    pub flush_every: u32,
    /// An unacknowledged non-blocking update is sent again after this long.
    pub retransmit_after: Duration,
    /// A blocking call fails after this long without an answer.
    pub call_timeout: Duration,
    /// Entries kept in the write-ahead log of shared-state updates (what a store rebuild
    /// re-executes); 0 keeps none, for runs whose store is never rebuilt.
    pub wal_capacity: usize,
    /// Most batches sent and not yet acknowledged; past it the client waits (backpressure
    /// from a store that falls behind).
    pub max_inflight: usize,
    /// The store holds no state of this instance's flows yet (a chain starting on an empty
    /// store): a per-flow value missing from the cache is absent, no need to ask. Packets marked
    /// `FIRST` (a flow moved here) are always looked up. Off for replacement instances.
    pub fresh: bool,
    /// Fault-tolerant operation (the COE executor): per-flow values, and shared ones while this
    /// instance is their only user (`set_exclusive`), are written through to the store as
    /// tagged non-blocking updates (the local copy only serves reads), and every update is
    /// tagged, so a packet replayed from the root's log is
    /// applied at most once and a crashed instance loses only unacknowledged updates, which its
    /// packets' XOR vectors keep replayable.
    pub write_through: bool,
    /// Updates carry exactly-once tags (the default), which the store keeps per clock until
    /// the root says a replay can no longer come. Off where no packet is processed twice (a run
    /// without the root's log and without clones: `StateConfig::without_duplicates` in
    /// `sluice-runtime`): nothing is tagged, the store keeps no per-clock log, and a counter's
    /// increments of one batch travel summed, as one increment (wrapping for an integer; a
    /// float counter gets the sum in one addition). Also off to show what duplicate
    /// suppression prevents: the store then applies every copy of a duplicated update.
    pub dedupe: bool,
    /// Each packet's updates are folded into its XOR vector and reported as commits once the
    /// store has them (the default): what the root's log waits for before it forgets a packet.
    /// Off where no root keeps a log (`StateConfig::without_duplicates` in `sluice-runtime`),
    /// so that nothing is computed, gathered and handed over per packet for nobody.
    pub commits: bool,
    /// Non-deterministic values an NF draws
    /// ([`StateHandle::record`](sluice_state::StateHandle::record): random numbers, the wall
    /// clock) are recorded in the store under the packet's clock, so that a replay or a
    /// clone draws the same ones. Costs a round trip per draw; only the fault-tolerant
    /// executor, which replays, turns it on.
    pub record_nondeterminism: bool,
    /// Every packet the instance processes without updating anything leaves a mark in the
    /// store's per-clock log (one non-blocking request per such packet, sent with its batch),
    /// so that [`Backend::clocks_updated_by`](crate::Backend::clocks_updated_by) lists it as
    /// processed. For an instance that a replacement on another node may take over: the
    /// replacement learns what its predecessor processed from the store alone, and a packet
    /// that only read state, run again there against state later packets changed, could take
    /// another path (docs/decisions.md, "What a replacement of another node's instance skips").
    pub mark_processed: bool,
    /// With commits in the non-blocking mode: a batch's requests may wait for the next
    /// batch's, up to 400 µs after the last send, and go as one message (a counter's tagged
    /// increments in one request). The packets' commits wait with them; an instance between
    /// batches sends what waits once the time is up. Off by default (a client whose caller
    /// looks at the store right after a batch, as the conformance checks do); the threaded
    /// runtime's fault-tolerant runs in one process turn it on (docs/decisions.md, "A
    /// fault-tolerant client's batches go together").
    pub defer_batches: bool,
    /// The epoch the instance connects in
    /// ([`Backend::connect_at`](crate::Backend::connect_at)): 0 for an instance started with
    /// the run; a replacement is given a higher one, so that it can fence its predecessor
    /// ([`Backend::fence`](crate::Backend::fence)) and the store refuses what the predecessor
    /// still sends.
    pub epoch: u32,
}

/// The object index under which [`StateHandle::record`](sluice_state::StateHandle::record)
/// records values (no NF declares that many objects; the value itself is never written, only
/// the per-clock log entry).
pub const NONDET_OBJECT: u16 = u16::MAX - 1;

/// The object index under which a packet processed without updates is marked
/// ([`ClientConfig::mark_processed`]); like [`NONDET_OBJECT`], only the per-clock log entry is
/// kept, never a value.
pub const PROCESSED_OBJECT: u16 = u16::MAX - 2;

/// The update number of a processed mark: below [`crate::TIMER_UPDATE`], above any count of a
/// packet's own updates.
pub(crate) const PROCESSED_MARK_SEQ: u32 = crate::TIMER_UPDATE - 1;

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            mode: Mode::Async,
            flush_every: 8,
            retransmit_after: Duration::from_secs(1),
            call_timeout: Duration::from_secs(5),
            wal_capacity: 65_536,
            max_inflight: 256,
            fresh: true,
            write_through: false,
            dedupe: true,
            commits: true,
            record_nondeterminism: false,
            mark_processed: false,
            defer_batches: false,
            epoch: 0,
        }
    }
}
