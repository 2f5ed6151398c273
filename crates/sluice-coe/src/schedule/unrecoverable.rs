//! The fault combinations the protocols cannot recover from by design, defined precisely so
//! that random schedules (and shrinking) leave out exactly these and nothing else.
//!
//! docs/correctness.md ("Correlated failures", after CHC's dissertation Table 3.11) lists
//! what may fail together. Two of its rows are not recoverable:
//!
//! * **store + NF**: a `crash_store` and a `crash` at the same packet count (nothing runs in
//!   between): the store's rebuild needs the failed instance's write-ahead log;
//! * **root + NF with the log at the root**: a `crash_root` and a `crash` at the same packet
//!   count while `run.log` is `root` (the default): the packets the NF held can no longer be
//!   replayed (with `log: store` this is recoverable and is drawn).
//!
//! (A crash of a last NF with the asynchronous delete is recoverable: the chain's egress passes
//! the first copy of each clock, so the packets it re-emits do not reach the receiver twice.)

use super::model::{Action, FaultSchedule};
use crate::engine::LogPlace;
use sluice_runtime::Chain;
use std::fmt;

/// A fault combination the protocols cannot recover from (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrecoverable {
    /// The store and an NF instance fail at the same packet count.
    StoreAndNf {
        /// The packet count.
        at: u64,
    },
    /// A root and an NF instance fail at the same packet count with the log at the root.
    RootAndNfWithRootLog {
        /// The packet count.
        at: u64,
    },
}

impl fmt::Display for Unrecoverable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unrecoverable::StoreAndNf { at } => {
                write!(f, "the store and an NF instance fail together at packet {at}")
            }
            Unrecoverable::RootAndNfWithRootLog { at } => {
                write!(f, "a root and an NF instance fail together at packet {at} with the log at the root")
            }
        }
    }
}

/// The vertices (by name) with an edge to the chain's output.
pub fn last_vertices(chain: &Chain) -> Vec<String> {
    let mut out: Vec<String> = chain
        .edges
        .iter()
        .chain(chain.reverse_edges.iter().flatten())
        .filter(|e| e.to.is_none())
        .filter_map(|e| e.from.and_then(|i| chain.vertices.get(i)).map(|(n, _)| n.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether `action`, happening at the same packet count as every one of `same_point`, would
/// make an unrecoverable combination with the log at `log`.
pub fn conflicts(action: &Action, same_point: &[&Action], log: LogPlace) -> bool {
    same_point.iter().any(|other| pair(action, other, log).is_some() || pair(other, action, log).is_some())
}

/// The unrecoverable kind of two actions at the same point, if any (`a` the failure that
/// makes it so, `b` the NF crash).
fn pair(a: &Action, b: &Action, log: LogPlace) -> Option<fn(u64) -> Unrecoverable> {
    match (a, b) {
        (Action::CrashStore, Action::Crash { .. }) => Some(|at| Unrecoverable::StoreAndNf { at }),
        (Action::CrashRoot { .. }, Action::Crash { .. }) if log == LogPlace::Root => {
            Some(|at| Unrecoverable::RootAndNfWithRootLog { at })
        }
        _ => None,
    }
}

impl FaultSchedule {
    /// The first unrecoverable combination in the schedule for a trace of `total_packets`
    /// packets, under its `run:` options (defaults where absent: log at the root,
    /// synchronous delete), or `None` if every fault in it is one the protocols recover from.
    pub fn unrecoverable(&self, _chain: &Chain, total_packets: u64) -> Option<Unrecoverable> {
        let log = self.run.log.unwrap_or(LogPlace::Root);
        let resolved = self.resolve(total_packets);
        for (i, (at, e)) in resolved.iter().enumerate() {
            for (other_at, other) in resolved.iter().skip(i + 1).take_while(|(c, _)| c == at) {
                let found = pair(&e.action, &other.action, log).or_else(|| pair(&other.action, &e.action, log));
                if let Some(make) = found {
                    return Some(make(*other_at));
                }
            }
        }
        None
    }
}
