//! The schedule's data model: events, their points and actions, policies.

use super::yaml::number;
use crate::engine::{EngineConfig, LogPlace};
use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// A fault schedule: events at points of the input trace, and vertex-manager policies.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FaultSchedule {
    /// Seeds the random per-packet delays of `slow` events (default 0).
    pub seed: u64,
    /// The events, in file order (the run applies them in trace order, see [`Self::resolve`]).
    pub events: Vec<FaultEvent>,
    /// Operator policies the vertex managers evaluate during the run.
    pub policies: Vec<Policy>,
    /// How to run the schedule (`run:`): engine options, and the chain and trace it was made
    /// for; explicit command-line flags override them.
    #[serde(skip_serializing_if = "RunOptions::is_empty")]
    pub run: RunOptions,
    /// The file the schedule came from, for error messages (`None` when built in code).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
}

/// The optional `run:` section of a schedule file: the engine options and inputs of the run
/// the schedule was made for, so that a file alone describes a reproducible run. Every field
/// is optional; an absent one leaves the engine's default (or the command line's value).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunOptions {
    /// Roots over statically partitioned input (1 to [`super::MAX_ROOTS`]; default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roots: Option<u8>,
    /// Where the root keeps its packet log (default: at the root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<LogPlace>,
    /// The root hears that a packet is done after the last NF emitted it (default: before).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_delete: Option<bool>,
    /// Store checkpoint every this many input packets (0: only after failovers; default
    /// 10,000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u64>,
    /// The chain file, relative to the schedule file's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<PathBuf>,
    /// The input trace, relative to the schedule file's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<PathBuf>,
    /// Only the first this many packets of the input (at least 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// The 1-based line of `run:` in its file.
    #[serde(skip_serializing)]
    pub line: Option<usize>,
}

impl RunOptions {
    /// Whether no option is set.
    pub fn is_empty(&self) -> bool {
        *self == RunOptions { line: self.line, ..RunOptions::default() }
    }

    /// Sets the options that are given on `cfg`; the others keep `cfg`'s values.
    pub fn apply(&self, cfg: &mut EngineConfig) {
        if let Some(r) = self.roots {
            cfg.roots = r;
        }
        if let Some(l) = self.log {
            cfg.log_place = l;
        }
        if let Some(a) = self.async_delete {
            cfg.async_delete = a;
        }
        if let Some(c) = self.checkpoint_every {
            cfg.checkpoint_every = c;
        }
    }

    /// The options of `self`, overridden by those `over` gives (command-line flags given
    /// explicitly override the file).
    pub fn overridden_by(&self, over: &RunOptions) -> RunOptions {
        RunOptions {
            roots: over.roots.or(self.roots),
            log: over.log.or(self.log),
            async_delete: over.async_delete.or(self.async_delete),
            checkpoint_every: over.checkpoint_every.or(self.checkpoint_every),
            chain: over.chain.clone().or_else(|| self.chain.clone()),
            input: over.input.clone().or_else(|| self.input.clone()),
            limit: over.limit.or(self.limit),
            line: self.line,
        }
    }

    /// The roots the run has (the option, else 1).
    pub fn root_count(&self) -> u8 {
        self.roots.unwrap_or(1).max(1)
    }
}

impl FaultSchedule {
    /// A path of the `run:` section resolved against the schedule file's directory (as is
    /// when the schedule was built in code or the path is absolute).
    pub fn run_path(&self, path: &Path) -> PathBuf {
        match self.source.as_deref().and_then(Path::parent) {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }
}

/// One event: an action at a point of the input trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultEvent {
    /// When it happens.
    pub at: At,
    /// What happens.
    pub action: Action,
    /// The 1-based line of the event in its file (`None` when built in code or on the
    /// command line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

/// A point of the input trace.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum At {
    /// Right after the root admitted this many input packets (1 is the first packet).
    Packet(u64),
    /// After this percentage of the trace's packets (strictly between 0 and 100), rounded
    /// to a packet count, at least 1.
    Percent(f64),
}

/// What an event does to the physical chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Instance `instance` of `vertex` fails: its queue, cache and unacknowledged operations
    /// are lost; a replacement with the same index takes over from the store and the root
    /// replays the logged packets.
    Crash {
        /// The vertex.
        vertex: String,
        /// The instance index (0-based).
        instance: u16,
    },
    /// A root fails: in-flight input is lost like network drops; a new root resumes the
    /// logical clock at the last persisted value plus the persistence interval and reads the
    /// flow allocation back from the instances.
    CrashRoot {
        /// Which root, with several (`EngineConfig::roots`); 0 is the first.
        root: u8,
    },
    /// The store instance fails and is rebuilt: per-flow state from the instances' caches,
    /// shared state from the last checkpoint plus the instances' write-ahead logs.
    CrashStore,
    /// The vertex is scaled out or in; the splitter in front of it re-partitions its flows.
    Scale {
        /// The vertex.
        vertex: String,
        /// The new instance count.
        to: ScaleTo,
    },
    /// Flows move from one instance of a vertex to another with the loss-free,
    /// order-preserving move protocol.
    Move {
        /// The vertex.
        vertex: String,
        /// The instance the flows leave.
        from: u16,
        /// The instance that takes them.
        to: u16,
        /// How many flows (at most); `None` moves them all.
        flows: Option<u64>,
    },
    /// From this point on, every packet instance `instance` of `vertex` processes takes an
    /// extra delay drawn uniformly from `delay_us` (µs, inclusive); `(0, 0)` ends it.
    Slow {
        /// The vertex.
        vertex: String,
        /// The instance index.
        instance: u16,
        /// Low and high bound of the extra delay, µs.
        delay_us: (u64, u64),
    },
    /// Straggler mitigation: a clone of the instance is initialised from the store, the
    /// root replays the logged packets to it, both get the live traffic and the faster one
    /// is kept; duplicate outputs and updates are suppressed.
    Clone {
        /// The vertex.
        vertex: String,
        /// The instance cloned.
        instance: u16,
    },
}

/// The target of a `scale` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleTo {
    /// Exactly this many instances (`to: N`).
    Exactly(u16),
    /// This many more (positive) or fewer (negative) instances than at that point (`by: N`).
    By(i32),
}

/// An operator policy for one vertex, evaluated by its vertex manager during the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Policy {
    /// The vertex.
    pub vertex: String,
    /// Add an instance when the vertex's statistics exceed this.
    pub scale_out_above: Option<Threshold>,
    /// Remove an instance when the vertex's statistics fall below this.
    pub scale_in_below: Option<Threshold>,
    /// Never scale out beyond this many instances (the vertex manager's default applies
    /// when absent).
    pub max_instances: Option<u16>,
    /// Never scale in below this many instances (default 1).
    pub min_instances: Option<u16>,
    /// Clone an instance whose time per packet is this many percent above the median of its
    /// vertex's instances (CHC's straggler θ).
    pub straggler_slower_by_percent: Option<f64>,
    /// The 1-based line of the policy in its file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

impl Policy {
    /// The policy as the core's vertex manager applies it (at most 8 instances unless said).
    pub fn manager(&self) -> sluice_chc::manager::ManagerPolicy {
        sluice_chc::manager::ManagerPolicy {
            max_instances: usize::from(self.max_instances.unwrap_or(8)),
            min_instances: usize::from(self.min_instances.unwrap_or(1)),
            scale_out_queue_above: self.scale_out_above.as_ref().and_then(|t| t.queue),
            scale_in_queue_below: self.scale_in_below.as_ref().and_then(|t| t.queue),
            straggler_slower_by_percent: self.straggler_slower_by_percent,
        }
    }
}

/// A scaling threshold; it is crossed when any of the given measures crosses it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Threshold {
    /// Packets waiting in the queues of all the vertex's instances together.
    pub queue: Option<u64>,
    /// Fraction of time the vertex's instances are busy, averaged (0 to 1).
    pub load: Option<f64>,
}

impl At {
    /// The packet count this point stands for in a trace of `total_packets` packets
    /// (percentages rounded to the nearest count; never below 1).
    pub fn resolve(&self, total_packets: u64) -> u64 {
        match *self {
            At::Packet(n) => n.max(1),
            // `as` saturates (and maps NaN to 0), so any value gives a count.
            At::Percent(p) => ((p / 100.0 * total_packets as f64).round() as u64).max(1),
        }
    }
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Packet(n) => write!(f, "packet {n}"),
            At::Percent(p) => write!(f, "{}%", number(*p)),
        }
    }
}

impl Action {
    /// The action's key in a schedule file (`crash`, `crash_root`, ...).
    pub fn key(&self) -> &'static str {
        match self {
            Action::Crash { .. } => "crash",
            Action::CrashRoot { .. } => "crash_root",
            Action::CrashStore => "crash_store",
            Action::Scale { .. } => "scale",
            Action::Move { .. } => "move",
            Action::Slow { .. } => "slow",
            Action::Clone { .. } => "clone",
        }
    }

    /// The vertex the action concerns, if any.
    pub fn vertex(&self) -> Option<&str> {
        match self {
            Action::Crash { vertex, .. }
            | Action::Scale { vertex, .. }
            | Action::Move { vertex, .. }
            | Action::Slow { vertex, .. }
            | Action::Clone { vertex, .. } => Some(vertex),
            Action::CrashRoot { .. } | Action::CrashStore => None,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Crash { vertex, instance } => write!(f, "crash {vertex}:{instance}"),
            Action::CrashRoot { root: 0 } => write!(f, "crash the root"),
            Action::CrashRoot { root } => write!(f, "crash root {root}"),
            Action::CrashStore => write!(f, "crash the store"),
            Action::Scale { vertex, to: ScaleTo::Exactly(n) } => write!(f, "scale {vertex} to {n}"),
            Action::Scale { vertex, to: ScaleTo::By(d) } => write!(f, "scale {vertex} by {d:+}"),
            Action::Move { vertex, from, to, flows: Some(n) } => write!(f, "move {n} flow(s) of {vertex} {from}>{to}"),
            Action::Move { vertex, from, to, flows: None } => write!(f, "move all flows of {vertex} {from}>{to}"),
            Action::Slow { vertex, instance, delay_us: (lo, hi) } => {
                write!(f, "slow {vertex}:{instance} by {lo}-{hi} µs")
            }
            Action::Clone { vertex, instance } => write!(f, "clone {vertex}:{instance}"),
        }
    }
}

impl fmt::Display for FaultEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.action, self.at)
    }
}

impl FaultSchedule {
    /// The events with absolute packet counts for a trace of `total_packets` packets
    /// (percentages rounded, at least 1), sorted by count; events at the same count keep
    /// their file order.
    pub fn resolve(&self, total_packets: u64) -> Vec<(u64, &FaultEvent)> {
        let mut v: Vec<(u64, &FaultEvent)> = self.events.iter().map(|e| (e.at.resolve(total_packets), e)).collect();
        v.sort_by_key(|(count, _)| *count);
        v
    }
}
