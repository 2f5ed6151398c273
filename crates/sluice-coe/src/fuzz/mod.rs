//! Random runs and their verdicts, for `sluice fuzz` and the property tests: a run is a
//! chain, a trace and a random schedule with its run options
//! ([`FaultSchedule::random`]); it *fails* when `verify` finds the physical run not
//! equivalent to the reference, or when packets are left in the root's log at the end (they
//! would be replayed after any later failure). Failures are grouped by their
//! [`Symptom`]s; [`Shrinker`] minimises a failing run and [`regression_yaml`] writes it as a
//! regression file.

mod regression;
mod shrinker;

pub use regression::{regression_yaml, relative_path, RegressionHeader};
pub use shrinker::{ShrinkResult, Shrinker};

use crate::compare::{CompareOptions, DiffKind, Difference};
use crate::engine::{EngineConfig, EngineError};
use crate::observed::Observed;
use crate::reference::run_reference;
use crate::schedule::FaultSchedule;
use crate::verify::{verify_against, VerifyReport};
use sluice_nf::NfRegistry;
use sluice_packet::Packet;
use sluice_runtime::Chain;
use sluice_store::Backend;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

/// Makes a fresh, empty store for one run; the argument tells runs apart (e.g. a Redis key
/// prefix).
pub type StoreFactory<'a> = dyn Fn(u64) -> Result<Arc<dyn Backend>, String> + Sync + 'a;

/// One kind of difference at one NF and object: how failures are told apart and grouped.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Symptom {
    /// The difference kind (`lost`, `state_mismatch`, ...) or `log_left` (packets left in the
    /// root's log).
    pub kind: String,
    /// The NF (vertex) concerned, where the difference names one.
    pub vertex: Option<String>,
    /// The state object concerned (state differences), or the decision (drops, alerts).
    pub object: Option<String>,
}

impl Symptom {
    fn of(d: &Difference) -> Symptom {
        let object = match d.kind {
            DiffKind::StateMissing | DiffKind::StateExtra | DiffKind::StateMismatch => {
                // State details start with the object's name: `pending[...]`, `pool (allocations) ...`.
                d.detail.split(['[', ' ']).next().map(str::to_string)
            }
            // Decision details start with the decision's kind: `drop:scan: 1 in the reference ...`.
            DiffKind::DecisionMissing | DiffKind::DecisionExtra => {
                d.detail.split_whitespace().next().map(|w| w.trim_end_matches(':').to_string())
            }
            _ => None,
        };
        Symptom { kind: d.kind.name().to_string(), vertex: d.vertex.clone(), object }
    }
}

impl fmt::Display for Symptom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(v) = &self.vertex {
            write!(f, " {v}")?;
        }
        if let Some(o) = &self.object {
            write!(f, " `{o}`")?;
        }
        Ok(())
    }
}

/// The verdict on one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// `verify` found the runs equivalent.
    pub equivalent: bool,
    /// Packets left in the root's log at the end.
    pub log_left: u64,
    /// What differed, without repeats.
    pub symptoms: BTreeSet<Symptom>,
    /// What happened that CHC cannot recover from (`EngineStats::unrecoverable`).
    pub unrecoverable: Vec<String>,
    /// `verify`'s account of the differences.
    pub summary: String,
}

impl Outcome {
    /// Whether the run failed: not equivalent, or packets left in the log, although nothing
    /// in it was beyond what CHC recovers from.
    pub fn failed(&self) -> bool {
        self.differs() && self.unrecoverable.is_empty()
    }

    /// Whether the run differs from the reference but met a failure CHC cannot recover from
    /// (docs/correctness.md, "Correlated failures"): outside the guarantee, neither a pass nor
    /// a failure, and reported as such.
    pub fn outside_guarantee(&self) -> bool {
        self.differs() && !self.unrecoverable.is_empty()
    }

    fn differs(&self) -> bool {
        !self.equivalent || self.log_left != 0
    }

    /// The symptoms without the objects, e.g. `state_mismatch lb`: the class of a failure.
    pub fn class(&self) -> BTreeSet<(String, Option<String>)> {
        self.symptoms.iter().map(|s| (s.kind.clone(), s.vertex.clone())).collect()
    }

    /// The symptoms on one line.
    pub fn symptom_line(&self) -> String {
        self.symptoms.iter().map(Symptom::to_string).collect::<Vec<_>>().join("; ")
    }

    /// A run the engine gave up on. The symptom's object is the message with its numbers
    /// taken out, so that the same failure at other packets groups together.
    fn engine_error(e: &EngineError) -> Outcome {
        let text = e.to_string();
        let mut object = String::new();
        for c in text.chars() {
            if c.is_ascii_digit() {
                if !object.ends_with('N') {
                    object.push('N');
                }
            } else {
                object.push(c);
            }
        }
        let symptom = Symptom { kind: "engine_error".into(), vertex: None, object: Some(object) };
        Outcome {
            equivalent: false,
            log_left: 0,
            symptoms: [symptom].into(),
            unrecoverable: Vec::new(),
            summary: format!("the run failed: {text}\n"),
        }
    }

    fn of(r: &VerifyReport) -> Outcome {
        let mut symptoms: BTreeSet<Symptom> = r.comparison.differences.iter().map(Symptom::of).collect();
        if r.engine.log_left != 0 {
            symptoms.insert(Symptom { kind: "log_left".into(), vertex: None, object: None });
        }
        Outcome {
            equivalent: r.equivalent,
            log_left: r.engine.log_left,
            symptoms,
            unrecoverable: r.engine.unrecoverable.clone(),
            summary: r.comparison.summary(),
        }
    }
}

/// What random runs are made of: a chain and the packets of one trace.
pub struct Target<'a> {
    /// The chain.
    pub chain: &'a Chain,
    /// The NFs.
    pub registry: &'a NfRegistry,
    /// The whole trace (a schedule's `run.limit` cuts it).
    pub packets: &'a [Packet],
}

/// The engine configuration a schedule's `run:` section asks for (defaults elsewhere).
pub fn engine_config(schedule: &FaultSchedule) -> EngineConfig {
    let mut cfg = EngineConfig::default();
    schedule.run.apply(&mut cfg);
    cfg
}

/// The packets a schedule runs over: the trace cut at `run.limit`.
pub fn cut<'p>(packets: &'p [Packet], schedule: &FaultSchedule) -> &'p [Packet] {
    let n = schedule.run.limit.map_or(packets.len(), |l| usize::try_from(l).unwrap_or(usize::MAX).min(packets.len()));
    packets.get(..n).unwrap_or(packets)
}

/// The reference run over `packets`.
pub fn reference(target: &Target<'_>, packets: &[Packet]) -> Result<Observed, EngineError> {
    Ok(run_reference(target.chain, target.registry, packets)?)
}

/// Runs `schedule` (its `run:` options, its `run.limit`) on a fresh store from `store` and
/// judges it against `reference`, the reference run over the same (cut) packets. The store
/// is wiped afterwards (a shared test server is left as it was found). A run the engine
/// gives up on (an [`EngineError`] during the run) is a failure with the symptom
/// `engine_error`; only a store that cannot be made is an error.
pub fn check(
    target: &Target<'_>,
    schedule: &FaultSchedule,
    reference: &Observed,
    store: &StoreFactory<'_>,
    tag: u64,
) -> Result<Outcome, EngineError> {
    let packets = cut(target.packets, schedule);
    let backend = store(tag).map_err(EngineError::Store)?;
    let r = verify_against(
        reference,
        target.chain,
        target.registry,
        packets,
        schedule,
        backend.clone(),
        engine_config(schedule),
        &CompareOptions::default(),
    );
    let _ = backend.wipe();
    Ok(match r {
        Ok(r) => Outcome::of(&r),
        Err(e) => Outcome::engine_error(&e),
    })
}
