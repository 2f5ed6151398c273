//! Checks of a built schedule: ranges that need no chain, then the schedule against a chain
//! (vertex names, instance indices as scaling goes on).

use super::model::{Action, At, FaultSchedule, Policy, RunOptions, ScaleTo};
use super::yaml::number;
use super::{ScheduleError, MAX_DELAY_US, MAX_INSTANCES, MAX_ROOTS};
use sluice_runtime::Chain;
use std::path::PathBuf;

/// Where a problem found in a built schedule lies.
#[derive(Debug, Clone, Copy)]
pub(super) enum Item {
    Event(usize),
    Policy(usize),
    /// The `run:` section.
    Run,
}

/// A problem in a built schedule: the item, the field path below it, and the message.
#[derive(Debug)]
pub(super) struct Problem {
    pub(super) item: Item,
    pub(super) field: Vec<String>,
    pub(super) message: String,
}

impl Problem {
    fn event(i: usize, field: &[&str], message: String) -> Problem {
        Problem { item: Item::Event(i), field: field.iter().map(|s| s.to_string()).collect(), message }
    }

    fn policy(i: usize, field: &[&str], message: String) -> Problem {
        Problem { item: Item::Policy(i), field: field.iter().map(|s| s.to_string()).collect(), message }
    }
}

impl FaultSchedule {
    /// Checks the schedule against `chain` before a run: the ranges [`Self::parse`] checks
    /// (again, for events built in code or on the command line), that every vertex named
    /// exists, and that every instance index exists at its point of the schedule, following
    /// the instance counts from the chain file through the `scale` events. The order of the
    /// events is their trace order when every event uses `packet:` (or every one
    /// `percent:`), else the file order; [`Self::validate_for_trace`] knows the exact order.
    /// For a vertex with a scale-out policy any index below its `max_instances` is accepted,
    /// since its count is decided during the run.
    pub fn validate(&self, chain: &Chain) -> Result<(), ScheduleError> {
        self.check(chain, None)
    }

    /// As [`Self::validate`], for a trace of `total_packets` packets: the events are taken in
    /// the exact order of the run ([`Self::resolve`]) and a `packet:` past the end of the
    /// trace is an error.
    pub fn validate_for_trace(&self, chain: &Chain, total_packets: u64) -> Result<(), ScheduleError> {
        self.check(chain, Some(total_packets))
    }

    /// The checks that need no chain: the run options, events, then policies.
    pub(super) fn static_problems(&self) -> Vec<Problem> {
        let mut out = run_problems(&self.run);
        for (i, e) in self.events.iter().enumerate() {
            match e.at {
                At::Packet(0) => out.push(Problem::event(
                    i,
                    &["at", "packet"],
                    "the count starts at 1 (the first input packet); expected 1 or more".into(),
                )),
                At::Percent(p) if !(p > 0.0 && p < 100.0) => out.push(Problem::event(
                    i,
                    &["at", "percent"],
                    format!(
                        "{} is not a percentage strictly between 0 and 100 (use `packet:` for the first or last packets)",
                        number(p)
                    ),
                )),
                _ => {}
            }
            if let Some(p) = action_problem(&e.action) {
                out.push(Problem { item: Item::Event(i), ..p });
            }
            if let (Action::CrashRoot { root }, Some(roots)) = (&e.action, self.run.roots) {
                if *root >= roots {
                    out.push(Problem::event(
                        i,
                        &["crash_root", "root"],
                        format!("there is no root {root}: `run.roots` gives the run {roots} root(s), numbered from 0"),
                    ));
                }
            }
        }
        for (i, p) in self.policies.iter().enumerate() {
            out.extend(policy_problems(i, p));
            if let Some(earlier) = self.policies.iter().take(i).find(|q| q.vertex == p.vertex) {
                let first = earlier.line.map(|l| format!(" (line {l})")).unwrap_or_default();
                out.push(Problem::policy(
                    i,
                    &["vertex"],
                    format!("`{}` already has a policy{first}: give each vertex one policy", p.vertex),
                ));
            }
        }
        out
    }

    /// `validate` and `validate_for_trace`.
    fn check(&self, chain: &Chain, total: Option<u64>) -> Result<(), ScheduleError> {
        if let Some(p) = self.static_problems().into_iter().next() {
            return Err(self.located(p));
        }
        let names: Vec<&str> = chain.vertices.iter().map(|(n, _)| n.as_str()).collect();
        let unknown = |v: &str| format!("no vertex `{v}` in chain `{}` (known: {})", chain.name, names.join(", "));
        for (i, e) in self.events.iter().enumerate() {
            if let Some(v) = e.action.vertex() {
                if !names.contains(&v) {
                    return Err(self.located(Problem::event(i, &[e.action.key(), "vertex"], unknown(v))));
                }
            }
            if let (Some(t), At::Packet(n)) = (total, e.at) {
                if n > t {
                    return Err(self.located(Problem::event(
                        i,
                        &["at", "packet"],
                        format!("packet {n} is past the end of the trace ({t} packets)"),
                    )));
                }
            }
        }
        for (i, p) in self.policies.iter().enumerate() {
            if !names.contains(&p.vertex.as_str()) {
                return Err(self.located(Problem::policy(i, &["vertex"], unknown(&p.vertex))));
            }
        }
        // Instance counts through the schedule, in the order the events happen.
        let order: Vec<usize> = match total {
            Some(t) => {
                let mut o: Vec<usize> = (0..self.events.len()).collect();
                o.sort_by_key(|&i| self.events.get(i).map_or(0, |e| e.at.resolve(t)));
                o
            }
            None => self.unresolved_order(),
        };
        let initial: Vec<u16> = chain.vertices.iter().map(|(_, v)| v.instances).collect();
        let mut counts = initial.clone();
        // Vertices whose count a scale-out policy decides at run time, with the policy's cap.
        let managed: Vec<Option<u16>> = names
            .iter()
            .map(|n| {
                self.policies
                    .iter()
                    .find(|p| p.vertex == *n && p.scale_out_above.is_some())
                    .map(|p| p.max_instances.unwrap_or(MAX_INSTANCES))
            })
            .collect();
        for i in order {
            let Some(e) = self.events.get(i) else { continue };
            let Some(vi) = e.action.vertex().and_then(|v| names.iter().position(|n| *n == v)) else { continue };
            let name = names.get(vi).copied().unwrap_or_default();
            let now = counts.get(vi).copied().unwrap_or(1);
            let bound = now.max(managed.get(vi).copied().flatten().unwrap_or(0));
            let from_file = initial.get(vi).copied().unwrap_or(1);
            let missing = |index: u16| {
                let managed = match managed.get(vi).copied().flatten() {
                    Some(m) => format!("; its scale-out policy allows up to {m}"),
                    None => String::new(),
                };
                let history = if now == from_file {
                    "in the chain file".to_string()
                } else {
                    format!("after earlier `scale` events; {from_file} in the chain file")
                };
                format!(
                    "vertex `{name}` has {now} instance(s) at this point of the schedule ({history}{managed}), so \
                     there is no instance {index}; expected an index below {bound}, or scale the vertex out first"
                )
            };
            let key = e.action.key();
            match &e.action {
                Action::Crash { instance, .. } | Action::Slow { instance, .. } | Action::Clone { instance, .. } => {
                    if *instance >= bound {
                        return Err(self.located(Problem::event(i, &[key, "instance"], missing(*instance))));
                    }
                }
                Action::Move { from, to, .. } => {
                    for (field, index) in [("from", *from), ("to", *to)] {
                        if index >= bound {
                            return Err(self.located(Problem::event(i, &[key, field], missing(index))));
                        }
                    }
                }
                Action::Scale { to, .. } => {
                    let target = match *to {
                        ScaleTo::Exactly(n) => i64::from(n),
                        ScaleTo::By(d) => i64::from(now) + i64::from(d),
                    };
                    if target < 1 || target > i64::from(MAX_INSTANCES) {
                        let field = if matches!(to, ScaleTo::By(_)) { "by" } else { "to" };
                        return Err(self.located(Problem::event(
                            i,
                            &[key, field],
                            format!(
                                "`{name}` has {now} instance(s) at this point, so this would leave it with {target}; \
                                 a vertex has 1 to {MAX_INSTANCES} instances"
                            ),
                        )));
                    }
                    if let Some(c) = counts.get_mut(vi) {
                        // In range by the check above.
                        *c = u16::try_from(target).unwrap_or(MAX_INSTANCES);
                    }
                }
                Action::CrashRoot { .. } | Action::CrashStore => {}
            }
        }
        Ok(())
    }

    /// The order of the events without a trace: by count when all use `packet:`, by
    /// percentage when all use `percent:`, else the file order.
    fn unresolved_order(&self) -> Vec<usize> {
        let mut o: Vec<usize> = (0..self.events.len()).collect();
        let key = |i: usize| match self.events.get(i).map(|e| e.at) {
            Some(At::Packet(n)) => n as f64,
            Some(At::Percent(p)) => p,
            None => 0.0,
        };
        let packets = self.events.iter().all(|e| matches!(e.at, At::Packet(_)));
        let percents = self.events.iter().all(|e| matches!(e.at, At::Percent(_)));
        if packets || percents {
            o.sort_by(|&a, &b| key(a).total_cmp(&key(b)));
        }
        o
    }

    /// An error for a problem in a built schedule, located by the item's line.
    fn located(&self, p: Problem) -> ScheduleError {
        let (list, index, line, what) = match p.item {
            Item::Event(i) => {
                let e = self.events.get(i);
                ("events", i, e.and_then(|e| e.line), e.map(|e| e.to_string()))
            }
            Item::Policy(i) => ("policies", i, self.policies.get(i).and_then(|p| p.line), None),
            Item::Run => {
                let mut field = vec!["run".to_string()];
                field.extend(p.field);
                return ScheduleError {
                    file: self.source.clone().unwrap_or_else(|| PathBuf::from("<schedule>")),
                    line: self.run.line,
                    field: field.join("."),
                    message: p.message,
                };
            }
        };
        let mut field = vec![list.to_string(), index.to_string()];
        field.extend(p.field);
        let message = match (line, what) {
            // Without a line (built in code or on the command line), say which event it is.
            (None, Some(w)) => format!("{w}: {}", p.message),
            _ => p.message,
        };
        ScheduleError {
            file: self.source.clone().unwrap_or_else(|| PathBuf::from("<schedule>")),
            line,
            field: field.join("."),
            message,
        }
    }
}

/// Range problems of the `run:` section.
fn run_problems(r: &RunOptions) -> Vec<Problem> {
    let mut out = Vec::new();
    let p = |field: &str, message: String| Problem { item: Item::Run, field: vec![field.to_string()], message };
    if let Some(n) = r.roots.filter(|n| !(1..=MAX_ROOTS).contains(n)) {
        out.push(p("roots", format!("{n} root(s): expected 1 to {MAX_ROOTS}")));
    }
    if r.limit == Some(0) {
        out.push(p("limit", "expected at least 1 input packet (leave `limit` out for the whole trace)".into()));
    }
    out
}

/// Range problems of an action (the item is filled in by the caller).
fn action_problem(a: &Action) -> Option<Problem> {
    let p = |field: &[&str], message: String| Some(Problem::event(0, field, message));
    match a {
        Action::Scale { to: ScaleTo::Exactly(0), .. } => {
            p(&["scale", "to"], "a vertex keeps at least 1 instance; expected `to:` from 1 to 64".into())
        }
        Action::Scale { to: ScaleTo::Exactly(n), .. } if *n > MAX_INSTANCES => {
            p(&["scale", "to"], format!("{n} instances is too many; expected `to:` from 1 to {MAX_INSTANCES}"))
        }
        Action::Scale { to: ScaleTo::By(0), .. } => {
            p(&["scale", "by"], "`by: 0` changes nothing; expected a positive or negative number".into())
        }
        Action::Scale { to: ScaleTo::By(d), .. } if d.unsigned_abs() >= u32::from(MAX_INSTANCES) => p(
            &["scale", "by"],
            format!("{d} is out of range; a vertex has 1 to {MAX_INSTANCES} instances, so expected -63 to 63"),
        ),
        Action::Move { from, to, .. } if from == to => {
            p(&["move", "to"], format!("`from` and `to` are both instance {to}; a move needs two different instances"))
        }
        Action::Move { flows: Some(0), .. } => {
            p(&["move", "flows"], "expected at least 1 flow (leave `flows` out to move them all)".into())
        }
        Action::Slow { delay_us: (lo, hi), .. } if lo > hi => p(
            &["slow", "delay_us"],
            format!("[{lo}, {hi}]: the low bound is above the high one; expected [LOW, HIGH], e.g. [{hi}, {lo}]"),
        ),
        Action::Slow { delay_us: (_, hi), .. } if *hi > MAX_DELAY_US => {
            p(&["slow", "delay_us"], format!("{hi} µs is more than the {MAX_DELAY_US} µs (1 s) a delay may be"))
        }
        _ => None,
    }
}

/// Range problems of a policy.
fn policy_problems(i: usize, p: &Policy) -> Vec<Problem> {
    let mut out = Vec::new();
    if p.scale_out_above.is_none() && p.scale_in_below.is_none() && p.straggler_slower_by_percent.is_none() {
        out.push(Problem::policy(
            i,
            &[],
            "the policy does nothing; expected `scale_out_above`, `scale_in_below` or `straggler_slower_by_percent`"
                .into(),
        ));
    }
    for (field, t) in [("scale_out_above", &p.scale_out_above), ("scale_in_below", &p.scale_in_below)] {
        let Some(t) = t else { continue };
        if t.queue.is_none() && t.load.is_none() {
            out.push(Problem::policy(
                i,
                &[field],
                "expected `queue:` (packets waiting at the vertex) and/or `load:` (busy fraction, 0 to 1)".into(),
            ));
        }
        if let Some(l) = t.load {
            if !(0.0..=1.0).contains(&l) {
                out.push(Problem::policy(
                    i,
                    &[field, "load"],
                    format!("{} is not a fraction of busy time; expected 0 to 1", number(l)),
                ));
            }
        }
    }
    if let (Some(out_t), Some(in_t)) = (&p.scale_out_above, &p.scale_in_below) {
        if let (Some(a), Some(b)) = (out_t.queue, in_t.queue) {
            if b >= a {
                out.push(Problem::policy(
                    i,
                    &["scale_in_below", "queue"],
                    format!("{b} is not below `scale_out_above.queue` ({a}); the vertex would scale out and in again"),
                ));
            }
        }
        if let (Some(a), Some(b)) = (out_t.load, in_t.load) {
            if b >= a {
                out.push(Problem::policy(
                    i,
                    &["scale_in_below", "load"],
                    format!(
                        "{} is not below `scale_out_above.load` ({}); the vertex would scale out and in again",
                        number(b),
                        number(a)
                    ),
                ));
            }
        }
    }
    for (field, m) in [("max_instances", p.max_instances), ("min_instances", p.min_instances)] {
        if let Some(m) = m {
            if m == 0 || m > MAX_INSTANCES {
                out.push(Problem::policy(i, &[field], format!("{m}: expected 1 to {MAX_INSTANCES}")));
            }
        }
    }
    if let (Some(lo), Some(hi)) = (p.min_instances, p.max_instances) {
        if lo > hi {
            out.push(Problem::policy(
                i,
                &["min_instances"],
                format!("{lo} is above `max_instances` ({hi}); expected min_instances <= max_instances"),
            ));
        }
    }
    if let Some(t) = p.straggler_slower_by_percent {
        if !(t.is_finite() && t > 0.0) {
            out.push(Problem::policy(
                i,
                &["straggler_slower_by_percent"],
                format!("{}: expected a percentage above 0 (50 = half as fast again as the median)", number(t)),
            ));
        }
    }
    out
}
