//! The engine's parameters, errors and report.

use crate::observed::Observed;
use sluice_runtime::PlanError;
use sluice_store::ClientConfig;
use std::collections::BTreeMap;

pub use sluice_chc::Switches;

/// Where the root keeps its packet log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogPlace {
    /// In the root's memory: fast, lost with the root.
    Root,
    /// In the state store ([`crate::root_log`]): every packet is written, and acknowledged,
    /// before it enters the chain; survives a root crash.
    Store,
}

/// Engine parameters.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Virtual time between input packets.
    pub arrival_ns: u64,
    /// Virtual service time of one packet at one instance.
    pub service_ns: u64,
    /// Virtual time from one queue to the next.
    pub link_ns: u64,
    /// Most packets an instance takes from its queue at once.
    pub batch: usize,
    /// Most packets in the root's log; input past it is dropped and reported.
    pub log_capacity: usize,
    /// Where the log lives.
    pub log_place: LogPlace,
    /// The root persists its clock every this many packets.
    pub clock_persist_every: u64,
    /// Roots over statically partitioned input (by source address, so a host's packets all
    /// enter at one root and keep their order in its clocks), each with its own clock (root id
    /// in the high bits) and log entries.
    pub roots: u8,
    /// A store checkpoint is taken every this many input packets (0: never), and also after
    /// failovers and whenever an instance's write-ahead log is half full of updates made since
    /// the last one.
    pub checkpoint_every: u64,
    /// Entries each instance keeps in its write-ahead log.
    pub wal_capacity: usize,
    /// The root hears that a packet is done `link_ns` after the last NF emitted it (CHC's
    /// asynchronous delete, which saves the last NF a round trip) rather than before: a crash
    /// in between replays the packet, and the receiver gets it twice.
    pub async_delete: bool,
    /// Vertex managers evaluate policies every this many input packets.
    pub manager_every: u64,
    /// A clone and its straggler both run this many input packets after the replay before
    /// the slower one is retired.
    pub clone_trial: u64,
    /// Mechanism switches.
    pub switches: Switches,
    /// Seed of the random delays.
    pub seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            arrival_ns: 2_000,
            service_ns: 1_000,
            link_ns: 100,
            batch: 32,
            log_capacity: 1 << 20,
            log_place: LogPlace::Root,
            clock_persist_every: 100,
            roots: 1,
            checkpoint_every: 10_000,
            wal_capacity: ClientConfig::default().wal_capacity,
            async_delete: false,
            manager_every: 1_000,
            clone_trial: 2_000,
            switches: Switches::default(),
            seed: 0,
        }
    }
}

/// Why the engine failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The chain could not be built.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A state operation failed beyond what the protocols handle.
    #[error("state store: {0}")]
    Store(String),
    /// A fault names something that does not exist at that point of the run.
    #[error("fault at packet {at}: {msg}")]
    Fault {
        /// The packet count.
        at: u64,
        /// What is wrong.
        msg: String,
    },
    /// The run kept serving events far beyond what its input can cause: a livelock. Reported
    /// instead of spinning forever so that a random run that never ends is a failure with a seed.
    #[error("the run does not end: {events} events for {packets} input packets (livelock)")]
    DoesNotEnd {
        /// Events served when the run was stopped.
        events: u64,
        /// Input packets of the run.
        packets: u64,
    },
}

/// One recovery or reconfiguration the engine carried out.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Episode {
    /// `crash`, `crash_root`, `crash_store`, `move`, `scale`, `clone`, `retire`.
    pub kind: String,
    /// The input packet count at which it started.
    pub at_packet: u64,
    /// The vertex concerned, if any.
    pub vertex: Option<String>,
    /// Wall-clock time of the framework's own procedure (building instances, flushing,
    /// rebuilding the store), microseconds.
    pub wall_us: f64,
    /// Virtual time until the episode completed (replay drained, barrier passed), µs.
    pub virtual_us: f64,
    /// Packets replayed from the root's log.
    pub replayed: u64,
    /// Flows moved.
    pub flows: u64,
    /// Detail.
    pub detail: String,
    /// Virtual time until the output latency was back to normal (median of the 500
    /// outputs after it within 1.5x of the 500 before), µs; `None` if it never was.
    pub back_to_normal_us: Option<f64>,
}

/// Counters of the mechanisms at work.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EngineStats {
    /// Input packets admitted.
    pub admitted: u64,
    /// Input packets dropped by the root (log full), malformed frames included separately.
    pub root_dropped: u64,
    /// Malformed or truncated frames dropped at the root.
    pub malformed: u64,
    /// Copies replayed from the root's log.
    pub replayed: u64,
    /// Duplicate packets dropped at queues (including the output).
    pub duplicates_suppressed: u64,
    /// Duplicate packets that reached a vertex's NF (suppression off), by vertex.
    pub duplicate_packets: BTreeMap<String, u64>,
    /// Updates issued while processing duplicate packets, by vertex.
    pub duplicate_updates: BTreeMap<String, u64>,
    /// Duplicate packets that reached the receiver (duplicate suppression off).
    pub duplicate_outputs: u64,
    /// Later copies of a clock the chain's egress dropped (a last NF that failed before the
    /// root's delete re-emits its output after the replay).
    pub egress_duplicates: u64,
    /// Updates the store recognised as duplicates (answered from its per-clock log).
    pub store_duplicates: u64,
    /// Per vertex, over all its instances: operations that waited for the store, and
    /// operations served by an instance's local copy.
    pub round_trips: BTreeMap<String, u64>,
    /// See `round_trips`.
    pub cache_hits: BTreeMap<String, u64>,
    /// Packets still in the root's log at the end (0 when everything committed).
    pub log_left: u64,
    /// What happened in the run that CHC cannot recover from (docs/correctness.md,
    /// "Correlated failures"), e.g. an instance failing with packets whose log entries a
    /// root lost in its own crash. A run with any is outside the guarantee.
    pub unrecoverable: Vec<String>,
    /// With the log in the store: packets written to it (each acknowledged before it entered
    /// the chain) and the mean wall time of a write, µs.
    pub log_store_writes: u64,
    /// See `log_store_writes`.
    pub log_store_write_us: f64,
    /// Most packets in the log at once.
    pub log_peak: u64,
    /// Clocks persisted by the root.
    pub clock_persists: u64,
    /// Checkpoints taken.
    pub checkpoints: u64,
    /// Median output latency over the run, virtual µs.
    pub latency_p50_us: f64,
    /// 99th percentile output latency, virtual µs.
    pub latency_p99_us: f64,
}

/// What a run of the engine produced.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EngineReport {
    /// The observable result, for `verify`.
    pub observed: Observed,
    /// Mechanism counters.
    pub stats: EngineStats,
    /// Recoveries and reconfigurations.
    pub episodes: Vec<Episode>,
}
