//! `sluice run --faults FILE`: the fault-schedule events the threaded runtime applies (NF
//! instance crashes and slowdowns so far), as the runtime's [`Crash`]es and [`Slowdown`]s.

use crate::{exit, fail, Failure};
use sluice_coe::schedule::{Action, FaultSchedule};
use sluice_runtime::exec::{Crash, Slowdown};
use sluice_runtime::Chain;
use std::path::Path;

/// What a schedule asks of a threaded run.
#[derive(Debug, Default)]
pub struct RunFaults {
    /// Instance crashes.
    pub crashes: Vec<Crash>,
    /// Instance slowdowns.
    pub slowdowns: Vec<Slowdown>,
}

/// The crashes and slowdowns of the schedule in `path` for `chain`; `total` counts the input's
/// packets (asked only if an event is placed by percentage).
pub fn faults(path: &Path, chain: &Chain, total: impl FnOnce() -> Result<u64, Failure>) -> Result<RunFaults, Failure> {
    let bad = |msg: String| fail(exit::INVALID)(anyhow::anyhow!("{}: {msg}", path.display()));
    let schedule = FaultSchedule::load(path).map_err(|e| fail(exit::INVALID)(anyhow::anyhow!("{e}")))?;
    if !schedule.run.is_empty() {
        return Err(bad(
            "`run:` options are for `sluice verify`; `sluice run` takes its options on the command line".into()
        ));
    }
    if !schedule.policies.is_empty() {
        return Err(bad("policies are not applied by the threaded runtime yet (`sluice verify` runs them)".into()));
    }
    let total =
        if schedule.events.iter().any(|e| matches!(e.at, sluice_coe::schedule::At::Percent(_))) { total()? } else { 0 };
    let names = chain.vertex_names();
    let mut out = RunFaults::default();
    for (after, e) in schedule.resolve(total) {
        let line = e.line.map(|l| format!("line {l}: ")).unwrap_or_default();
        let (Action::Crash { vertex, .. } | Action::Slow { vertex, .. }) = &e.action else {
            return Err(bad(format!(
                "{line}`{}`: the threaded runtime applies only `crash` and `slow` events so far (`sluice verify --faults` runs every kind)",
                e.action.key()
            )));
        };
        let Some(v) = names.get(vertex.as_str()).copied() else {
            return Err(bad(format!("{line}no vertex `{vertex}` in chain `{}`", chain.name)));
        };
        match &e.action {
            Action::Crash { instance, .. } => out.crashes.push(Crash { after, vertex: v, index: *instance }),
            Action::Slow { instance, delay_us, .. } => {
                out.slowdowns.push(Slowdown { after, vertex: v, index: *instance, delay_us: *delay_us });
            }
            _ => {}
        }
    }
    Ok(out)
}
