//! Shrinking a failing run: simpler variants ([`shrink_candidates`]) are run one after the
//! other and the first that still fails the same way replaces the run, until none does or
//! the budget of runs is spent.

use super::{check, cut, reference, Outcome, StoreFactory, Target};
use crate::engine::EngineError;
use crate::observed::Observed;
use crate::schedule::{shrink_candidates, FaultSchedule};
use std::collections::HashMap;

/// Minimises failing runs over one target, keeping the reference run of every cut of the
/// trace it has needed.
pub struct Shrinker<'a> {
    target: Target<'a>,
    store: &'a StoreFactory<'a>,
    references: HashMap<usize, Observed>,
    tag: u64,
}

/// A minimised run.
#[derive(Debug, Clone)]
pub struct ShrinkResult {
    /// The minimal schedule (absolute points, `run.limit` where the trace could be cut).
    pub schedule: FaultSchedule,
    /// Its verdict.
    pub outcome: Outcome,
    /// Runs made while shrinking.
    pub runs: usize,
}

impl<'a> Shrinker<'a> {
    /// A shrinker over `target`, each run on a fresh store from `store` (`tag_base` and up
    /// tell the runs apart).
    pub fn new(target: Target<'a>, store: &'a StoreFactory<'a>, tag_base: u64) -> Shrinker<'a> {
        Shrinker { target, store, references: HashMap::new(), tag: tag_base }
    }

    /// Runs `schedule` against the reference of its cut of the trace (made once per cut).
    pub fn run(&mut self, schedule: &FaultSchedule) -> Result<Outcome, EngineError> {
        let packets = cut(self.target.packets, schedule);
        if !self.references.contains_key(&packets.len()) {
            let r = reference(&self.target, packets)?;
            self.references.insert(packets.len(), r);
        }
        self.tag += 1;
        match self.references.get(&packets.len()) {
            Some(r) => check(&self.target, schedule, r, self.store, self.tag),
            None => Err(EngineError::Store("reference run missing".into())),
        }
    }

    /// How many of `n` reruns of `schedule` fail with one of the symptom classes of
    /// `outcome`. The engine drives real store threads, so a run can depend on timing; a
    /// regression file says how reliably its case fails.
    pub fn confirm(&mut self, schedule: &FaultSchedule, outcome: &Outcome, n: usize) -> Result<usize, EngineError> {
        let class = outcome.class();
        let mut failed = 0;
        for _ in 0..n {
            let o = self.run(schedule)?;
            failed += usize::from(o.failed() && o.class().iter().any(|c| class.contains(c)));
        }
        Ok(failed)
    }

    /// Whether `candidate` is a run worth trying: valid for the chain over its cut of the
    /// trace and not one of the unrecoverable combinations.
    fn admissible(&self, candidate: &FaultSchedule) -> bool {
        let total = cut(self.target.packets, candidate).len() as u64;
        candidate.validate_for_trace(self.target.chain, total).is_ok()
            && candidate.unrecoverable(self.target.chain, total).is_none()
    }

    /// Shrinks `failing`, whose verdict was `outcome`, making at most `budget` runs. A
    /// candidate replaces the run when it fails with at least one symptom class (difference
    /// kind and NF) of the original, so shrinking does not wander off to another bug.
    pub fn shrink(
        &mut self,
        failing: &FaultSchedule,
        outcome: &Outcome,
        budget: usize,
    ) -> Result<ShrinkResult, EngineError> {
        let total = self.target.packets.len() as u64;
        let class = outcome.class();
        let mut best = failing.absolute(cut(self.target.packets, failing).len() as u64);
        best.source = None;
        let mut best_outcome = outcome.clone();
        let mut runs = 0;
        'outer: while runs < budget {
            for candidate in shrink_candidates(&best, total) {
                if runs >= budget {
                    break 'outer;
                }
                if !self.admissible(&candidate) {
                    continue;
                }
                runs += 1;
                let o = self.run(&candidate)?;
                if o.failed() && o.class().iter().any(|c| class.contains(c)) {
                    best = candidate;
                    best_outcome = o;
                    continue 'outer;
                }
            }
            break;
        }
        Ok(ShrinkResult { schedule: best, outcome: best_outcome, runs })
    }
}
