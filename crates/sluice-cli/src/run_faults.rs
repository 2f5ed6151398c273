//! `sluice run --faults FILE`: the fault-schedule events the threaded runtime applies (NF
//! instance, root and store crashes, slowdowns, scaling, flow moves and clones), as the runtime's [`Planned`]
//! events, in the schedule's order.

use crate::{exit, fail, Failure};

use sluice_coe::schedule::ScaleTo;
use sluice_coe::schedule::{Action, FaultSchedule};
use sluice_runtime::exec::{Change, Crash, ManagerPolicy, Planned, Reconfig, Slowdown};
use sluice_runtime::Chain;
use std::path::Path;

/// What a schedule asks of a threaded run.
#[derive(Debug, Default)]
pub struct RunFaults {
    /// The events, in order.
    pub planned: Vec<Planned>,
    /// The vertex managers' policies: (vertex index, policy).
    pub policies: Vec<(usize, ManagerPolicy)>,
}

/// The events and policies of the schedule in `path` for `chain` in a run with `roots` roots;
/// `total` counts the input's packets (asked only if an event is placed by percentage).
pub fn faults(
    path: &Path,
    chain: &Chain,
    roots: u8,
    total: impl FnOnce() -> Result<u64, Failure>,
) -> Result<RunFaults, Failure> {
    let bad = |msg: String| fail(exit::INVALID)(anyhow::anyhow!("{}: {msg}", path.display()));
    let schedule = FaultSchedule::load(path).map_err(|e| fail(exit::INVALID)(anyhow::anyhow!("{e}")))?;
    // A schedule written for `sluice verify` (a regression file, say) runs here too: its chain,
    // input, limit and log come from the command line instead, and the engine's own options
    // (`async_delete`, `checkpoint_every`) have no counterpart in threads. Its roots must be
    // the run's: its events name them.
    if let Some(wanted) = schedule.run.roots.filter(|r| *r != roots) {
        let line = schedule.run.line.map(|l| format!("line {l}: ")).unwrap_or_default();
        return Err(bad(format!("{line}`run: roots: {wanted}`: run it with --roots {wanted} (this run has {roots})")));
    }
    if !schedule.run.is_empty() {
        tracing::info!(
            schedule = %path.display(),
            "the schedule's `run:` section is for `sluice verify`: this run takes its chain, input, limit and log from the command line"
        );
    }
    let names = chain.vertex_names();
    let mut policies = Vec::new();
    for p in &schedule.policies {
        let line = p.line.map(|l| format!("line {l}: ")).unwrap_or_default();
        let Some(v) = names.get(p.vertex.as_str()).copied() else {
            return Err(bad(format!("{line}no vertex `{}` in chain `{}`", p.vertex, chain.name)));
        };
        policies.push((v, p.manager()));
    }
    let total =
        if schedule.events.iter().any(|e| matches!(e.at, sluice_coe::schedule::At::Percent(_))) { total()? } else { 0 };
    let mut out = Vec::new();
    for (after, e) in schedule.resolve(total) {
        let line = e.line.map(|l| format!("line {l}: ")).unwrap_or_default();
        if let Action::CrashRoot { root } = &e.action {
            if *root >= roots {
                return Err(bad(format!("{line}`crash_root`: no root {root} in a run of {roots} root(s) (--roots)")));
            }
            out.push(Planned::CrashRoot(after, *root));
            continue;
        }
        if let Action::CrashStore = &e.action {
            out.push(Planned::CrashStore(after));
            continue;
        }
        // Every other action names a vertex.
        let vertex = e.action.vertex().unwrap_or_default();
        let Some(v) = names.get(vertex).copied() else {
            return Err(bad(format!("{line}no vertex `{vertex}` in chain `{}`", chain.name)));
        };
        let change = |change| Planned::Change(Reconfig { after, vertex: v, change });
        out.push(match &e.action {
            Action::Crash { instance, .. } => Planned::Crash(Crash { after, vertex: v, index: *instance }),
            Action::Slow { instance, delay_us, .. } => {
                Planned::Slow(Slowdown { after, vertex: v, index: *instance, delay_us: *delay_us })
            }
            Action::Scale { to: ScaleTo::Exactly(n), .. } => change(Change::ScaleTo(*n)),
            Action::Scale { to: ScaleTo::By(d), .. } => change(Change::ScaleBy(*d)),
            Action::Move { from, to, flows, .. } => change(Change::Move { from: *from, to: *to, flows: *flows }),
            Action::Clone { instance, .. } => change(Change::Clone { instance: *instance }),
            // Handled above.
            Action::CrashRoot { .. } | Action::CrashStore => continue,
        });
    }
    Ok(RunFaults { planned: out, policies })
}
