//! Fault schedules: what happens to a running physical chain, and when, for `sluice verify
//! --faults F` and `sluice run --faults F` (format: docs/faults.md).
//!
//! ```yaml
//! seed: 7                                   # seeds random delays (default 0)
//! events:
//!   - at: { percent: 40 }                   # or { packet: 20000 } (1-based input packet count)
//!     crash: { vertex: nat, instance: 0 }
//!   - at: { percent: 60 }
//!     move: { vertex: nat, from: 0, to: 1, flows: 4000 }
//! policies:
//!   - { vertex: portscan, scale_out_above: { queue: 2000 }, max_instances: 4 }
//! ```
//!
//! [`FaultSchedule::parse`] checks the shape and the ranges (errors name the file, line and
//! field); [`FaultSchedule::validate`] checks the schedule against a chain (vertex names,
//! instance indices as scaling goes on); [`FaultSchedule::resolve`] turns percentages into
//! packet counts for a trace; [`FaultSchedule::random`] draws valid schedules for property
//! tests and [`FaultSchedule::to_yaml`] writes one back out.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_yaml::Value;
use sluice_runtime::spec::locate;
use sluice_runtime::Chain;
use std::fmt;
use std::path::{Path, PathBuf};

/// Most instances a schedule may give a vertex.
pub const MAX_INSTANCES: u16 = 64;
/// Largest per-packet delay a `slow` event may add, µs (one second).
pub const MAX_DELAY_US: u64 = 1_000_000;
/// Most instances [`FaultSchedule::random`] scales a vertex to.
pub const RANDOM_MAX_INSTANCES: u16 = 4;
/// Largest delay [`FaultSchedule::random`] gives a slowed instance, µs.
pub const RANDOM_MAX_DELAY_US: u64 = 20;

/// The action keys an event may carry (exactly one of them).
const ACTIONS: [&str; 7] = ["crash", "crash_root", "crash_store", "scale", "move", "slow", "clone"];

/// A fault schedule: events at points of the input trace, and vertex-manager policies.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FaultSchedule {
    /// Seeds the random per-packet delays of `slow` events (default 0).
    pub seed: u64,
    /// The events, in file order (the run applies them in trace order, see [`Self::resolve`]).
    pub events: Vec<FaultEvent>,
    /// Operator policies the vertex managers evaluate during the run.
    pub policies: Vec<Policy>,
    /// The file the schedule came from, for error messages (`None` when built in code).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
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

/// A scaling threshold; it is crossed when any of the given measures crosses it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Threshold {
    /// Packets waiting in the queues of all the vertex's instances together.
    pub queue: Option<u64>,
    /// Fraction of time the vertex's instances are busy, averaged (0 to 1).
    pub load: Option<f64>,
}

/// A fault schedule that cannot be read, or does not fit its chain: located like a chain-file
/// error (file, line, dotted field; `<schedule>` for schedules built in code).
pub type ScheduleError = sluice_runtime::SpecError;

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

    /// The action as the flow mapping a schedule file holds (`{ vertex: nat, instance: 0 }`).
    fn yaml_value(&self) -> String {
        match self {
            Action::Crash { vertex, instance } | Action::Clone { vertex, instance } => {
                format!("{{ vertex: {}, instance: {instance} }}", yaml_string(vertex))
            }
            Action::CrashRoot { root: 0 } | Action::CrashStore => "{}".to_string(),
            Action::CrashRoot { root } => format!("{{ root: {root} }}"),
            Action::Scale { vertex, to: ScaleTo::Exactly(n) } => {
                format!("{{ vertex: {}, to: {n} }}", yaml_string(vertex))
            }
            Action::Scale { vertex, to: ScaleTo::By(d) } => format!("{{ vertex: {}, by: {d} }}", yaml_string(vertex)),
            Action::Move { vertex, from, to, flows } => {
                let flows = flows.map(|n| format!(", flows: {n}")).unwrap_or_default();
                format!("{{ vertex: {}, from: {from}, to: {to}{flows} }}", yaml_string(vertex))
            }
            Action::Slow { vertex, instance, delay_us: (lo, hi) } => {
                format!("{{ vertex: {}, instance: {instance}, delay_us: [{lo}, {hi}] }}", yaml_string(vertex))
            }
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

/// Where a problem found in a built schedule lies.
#[derive(Debug, Clone, Copy)]
enum Item {
    Event(usize),
    Policy(usize),
}

/// A problem in a built schedule: the item, the field path below it, and the message.
#[derive(Debug)]
struct Problem {
    item: Item,
    field: Vec<String>,
    message: String,
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
    /// Reads and parses a schedule file (see [`Self::parse`]).
    pub fn load(path: &Path) -> Result<FaultSchedule, ScheduleError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScheduleError {
            file: path.to_path_buf(),
            line: None,
            field: String::new(),
            message: format!("cannot read the fault schedule: {e}"),
        })?;
        FaultSchedule::parse(&text, path)
    }

    /// Parses schedule text; `file` names it in errors. Checks the shape (known fields,
    /// exactly one action per event, types) and the ranges that need no chain (counts from
    /// 1, percentages strictly between 0 and 100, delays, scale targets, `from != to`,
    /// policy bounds). [`Self::validate`] then checks it against the chain.
    pub fn parse(text: &str, file: &Path) -> Result<FaultSchedule, ScheduleError> {
        let p = Parser { text, file };
        let mut schedule = p.schedule()?;
        schedule.source = Some(file.to_path_buf());
        if let Some(problem) = schedule.static_problems().into_iter().next() {
            return Err(p.problem(problem));
        }
        Ok(schedule)
    }

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

    /// The events with absolute packet counts for a trace of `total_packets` packets
    /// (percentages rounded, at least 1), sorted by count; events at the same count keep
    /// their file order.
    pub fn resolve(&self, total_packets: u64) -> Vec<(u64, &FaultEvent)> {
        let mut v: Vec<(u64, &FaultEvent)> = self.events.iter().map(|e| (e.at.resolve(total_packets), e)).collect();
        v.sort_by_key(|(count, _)| *count);
        v
    }

    /// A random schedule that is valid for `chain` over a trace of `total_packets` packets,
    /// for property tests: 1 to `max_events` events at random points (as packet counts or
    /// percentages), drawn from every action kind. Instance counts are followed as the
    /// schedule scales (never below 1 nor above [`RANDOM_MAX_INSTANCES`]); a move is drawn
    /// only when a vertex has two instances, else the vertex is scaled out instead; slow
    /// events add at most [`RANDOM_MAX_DELAY_US`]. The events are listed in trace order, so
    /// [`Self::validate_for_trace`] and [`Self::validate`] accept the schedule. The same
    /// seed always gives the same schedule; it also becomes the schedule's `seed`.
    pub fn random(seed: u64, chain: &Chain, total_packets: u64, max_events: usize) -> FaultSchedule {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let total = total_packets.max(1);
        let n = rng.gen_range(1..=max_events.max(1));
        // Points first, in trace order (ties by the written value), then the actions.
        let mut points: Vec<(u64, f64, At)> = (0..n)
            .map(|_| {
                let at = if rng.gen_bool(0.5) {
                    At::Packet(rng.gen_range(1..=total))
                } else {
                    At::Percent(f64::from(rng.gen_range(1u16..=999)) / 10.0)
                };
                let written = match at {
                    At::Packet(c) => c as f64,
                    At::Percent(p) => p,
                };
                (at.resolve(total), written, at)
            })
            .collect();
        points.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let names: Vec<&str> = chain.vertices.iter().map(|(n, _)| n.as_str()).collect();
        let mut counts: Vec<u16> = chain.vertices.iter().map(|(_, v)| v.instances.max(1)).collect();
        let mut events = Vec::with_capacity(points.len());
        for (_, _, at) in points {
            let action = random_action(&mut rng, &names, &mut counts);
            events.push(FaultEvent { at, action, line: None });
        }
        FaultSchedule { seed, events, policies: Vec::new(), source: None }
    }

    /// The schedule as schedule-file YAML, which [`Self::parse`] reads back to the same
    /// seed, events and policies (lines aside).
    pub fn to_yaml(&self) -> String {
        let mut s = format!("seed: {}\n", self.seed);
        if self.events.is_empty() {
            s.push_str("events: []\n");
        } else {
            s.push_str("events:\n");
            for e in &self.events {
                let at = match e.at {
                    At::Packet(n) => format!("{{ packet: {n} }}"),
                    At::Percent(p) => format!("{{ percent: {} }}", number(p)),
                };
                s.push_str(&format!("  - at: {at}\n    {}: {}\n", e.action.key(), e.action.yaml_value()));
            }
        }
        if !self.policies.is_empty() {
            s.push_str("policies:\n");
            for p in &self.policies {
                let mut parts = vec![format!("vertex: {}", yaml_string(&p.vertex))];
                let threshold = |t: &Threshold| {
                    let mut v = Vec::new();
                    if let Some(q) = t.queue {
                        v.push(format!("queue: {q}"));
                    }
                    if let Some(l) = t.load {
                        v.push(format!("load: {}", number(l)));
                    }
                    format!("{{ {} }}", v.join(", "))
                };
                if let Some(t) = &p.scale_out_above {
                    parts.push(format!("scale_out_above: {}", threshold(t)));
                }
                if let Some(t) = &p.scale_in_below {
                    parts.push(format!("scale_in_below: {}", threshold(t)));
                }
                if let Some(m) = p.max_instances {
                    parts.push(format!("max_instances: {m}"));
                }
                if let Some(m) = p.min_instances {
                    parts.push(format!("min_instances: {m}"));
                }
                if let Some(t) = p.straggler_slower_by_percent {
                    parts.push(format!("straggler_slower_by_percent: {}", number(t)));
                }
                s.push_str(&format!("  - {{ {} }}\n", parts.join(", ")));
            }
        }
        s
    }

    /// The checks that need no chain, in file order: events, then policies.
    fn static_problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
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

/// One random action for [`FaultSchedule::random`], updating the instance counts.
fn random_action(rng: &mut ChaCha8Rng, names: &[&str], counts: &mut [u16]) -> Action {
    if names.is_empty() || counts.len() != names.len() {
        return if rng.gen_bool(0.5) { Action::CrashRoot { root: 0 } } else { Action::CrashStore };
    }
    let v = rng.gen_range(0..names.len());
    let vertex = names.get(v).copied().unwrap_or_default().to_string();
    let now = counts.get(v).copied().unwrap_or(1).max(1);
    match rng.gen_range(0..7) {
        0 => Action::Crash { vertex, instance: rng.gen_range(0..now) },
        1 => Action::CrashRoot { root: 0 },
        2 => Action::CrashStore,
        3 => random_scale(rng, v, names, counts),
        4 => {
            let movable: Vec<usize> = (0..counts.len()).filter(|&i| counts.get(i).is_some_and(|c| *c >= 2)).collect();
            if movable.is_empty() {
                // No vertex has two instances yet: scale one out so later moves can happen.
                let target = now + 1;
                if let Some(c) = counts.get_mut(v) {
                    *c = target;
                }
                return Action::Scale { vertex, to: ScaleTo::By(1) };
            }
            let m = movable.get(rng.gen_range(0..movable.len())).copied().unwrap_or(0);
            let n = counts.get(m).copied().unwrap_or(2).max(2);
            let from = rng.gen_range(0..n);
            let to = (from + 1 + rng.gen_range(0..n - 1)) % n;
            let flows = if rng.gen_bool(0.5) { Some(rng.gen_range(1..=4000)) } else { None };
            Action::Move { vertex: names.get(m).copied().unwrap_or_default().to_string(), from, to, flows }
        }
        5 => {
            let delay_us = if rng.gen_bool(0.15) {
                (0, 0)
            } else {
                let lo = rng.gen_range(0..=RANDOM_MAX_DELAY_US / 2);
                (lo, rng.gen_range(lo..=RANDOM_MAX_DELAY_US))
            };
            Action::Slow { vertex, instance: rng.gen_range(0..now), delay_us }
        }
        _ => Action::Clone { vertex, instance: rng.gen_range(0..now) },
    }
}

/// A random scale event for vertex `v`, within 1..=[`RANDOM_MAX_INSTANCES`].
fn random_scale(rng: &mut ChaCha8Rng, v: usize, names: &[&str], counts: &mut [u16]) -> Action {
    let vertex = names.get(v).copied().unwrap_or_default().to_string();
    let now = counts.get(v).copied().unwrap_or(1).max(1);
    let out = now < RANDOM_MAX_INSTANCES && (now == 1 || rng.gen_bool(0.5));
    let target = if out {
        rng.gen_range(now + 1..=RANDOM_MAX_INSTANCES)
    } else {
        rng.gen_range(1..=(now - 1).min(RANDOM_MAX_INSTANCES))
    };
    if let Some(c) = counts.get_mut(v) {
        *c = target;
    }
    let to = if rng.gen_bool(0.5) { ScaleTo::Exactly(target) } else { ScaleTo::By(i32::from(target) - i32::from(now)) };
    Action::Scale { vertex, to }
}

/// A number as YAML: whole numbers without a fraction, others in the shortest form that
/// reads back to the same value.
fn number(x: f64) -> String {
    if x.is_nan() {
        ".nan".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { ".inf" } else { "-.inf" }.to_string()
    } else if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x:?}")
    }
}

/// A string as a YAML scalar: plain when it cannot be read as anything else, else quoted.
fn yaml_string(s: &str) -> String {
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !["true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf"]
            .contains(&s.to_ascii_lowercase().as_str());
    if plain {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
    }
}

/// A short rendering of a YAML value for messages.
fn shown(v: &Value) -> String {
    let s = match v {
        Value::Null => "nothing".to_string(),
        Value::String(s) => format!("\"{s}\""),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().replace('\n', " "),
    };
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

/// The 1-based line of a field path in schedule text (`events.2.slow.delay_us`), or of the
/// deepest part of it that is found. Items of the top-level lists are found here, indented or
/// not (`events:` followed by `- at:` at column 0 is common YAML), and so is an item's field,
/// even when the item's first line holds a flow mapping (`- at: { packet: 1 }`), where
/// [`locate`] would stop; `locate` goes on from there.
fn line_of(text: &str, path: &[&str]) -> Option<usize> {
    (1..=path.len()).rev().find_map(|n| path.get(..n).and_then(|p| line_of_exactly(text, p)))
}

fn indent_of(l: &str) -> usize {
    l.len() - l.trim_start().len()
}

fn significant(l: &str) -> bool {
    !l.trim().is_empty() && !l.trim_start().starts_with('#')
}

/// The 1-based line of item `index` of the top-level list `list`.
fn item_line(text: &str, list: &str, index: usize) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let header = lines.iter().position(|l| {
        l.strip_prefix(list)
            .and_then(|r| r.strip_prefix(':'))
            .is_some_and(|rest| rest.trim().is_empty() || rest.trim_start().starts_with('#'))
    })?;
    let mut item_indent = None;
    let mut n = 0;
    for (j, l) in lines.iter().enumerate().skip(header + 1) {
        if !significant(l) {
            continue;
        }
        let t = l.trim_start();
        let is_item = t.starts_with("- ") || t == "-";
        if indent_of(l) == 0 && !is_item {
            break;
        }
        if is_item && *item_indent.get_or_insert(indent_of(l)) == indent_of(l) {
            if n == index {
                return Some(j + 1);
            }
            n += 1;
        }
    }
    None
}

fn line_of_exactly(text: &str, path: &[&str]) -> Option<usize> {
    let (Some(list), Some(Ok(index))) = (path.first(), path.get(1).map(|i| i.parse::<usize>())) else {
        return locate(text, path);
    };
    let item = item_line(text, list, index)?;
    let Some(key) = path.get(2) else { return Some(item) };
    let lines: Vec<&str> = text.lines().collect();
    // A line's key indentation and the text from the key on (`- a: 1` has its key at +2).
    let key_of = |l: &str| {
        let t = l.trim_start();
        match t.strip_prefix("- ") {
            Some(rest) => (indent_of(l) + 2 + rest.len() - rest.trim_start().len(), rest.trim_start().to_string()),
            None => (indent_of(l), t.to_string()),
        }
    };
    let start = item.checked_sub(1)?;
    let base = indent_of(lines.get(start)?);
    let end = (start + 1..lines.len())
        .find(|&j| lines.get(j).is_some_and(|l| significant(l) && indent_of(l) <= base))
        .unwrap_or(lines.len());
    let wanted = [format!("{key}:"), format!("\"{key}\":")];
    let at = (start..end).find(|&j| {
        lines.get(j).is_some_and(|l| {
            let (ki, rest) = key_of(l);
            ki == base + 2 && wanted.iter().any(|w| rest.starts_with(w.as_str()))
        })
    })?;
    let sub = lines.get(at..end)?.join("\n");
    locate(&sub, path.get(2..)?).map(|l| l + at)
}

/// Reads schedule text into a [`FaultSchedule`], with errors located in the text.
struct Parser<'a> {
    text: &'a str,
    file: &'a Path,
}

/// A mapping's entries, with string keys, in file order.
type Entries<'v> = Vec<(String, &'v Value)>;

impl Parser<'_> {
    /// An error at a field path; the line is that of the deepest part of the path found.
    fn err(&self, path: &[String], message: impl Into<String>) -> ScheduleError {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        let line = line_of(self.text, &refs);
        ScheduleError { file: self.file.to_path_buf(), line, field: path.join("."), message: message.into() }
    }

    /// An error for a problem found in the built schedule.
    fn problem(&self, p: Problem) -> ScheduleError {
        let (list, i) = match p.item {
            Item::Event(i) => ("events", i),
            Item::Policy(i) => ("policies", i),
        };
        let mut path = vec![list.to_string(), i.to_string()];
        path.extend(p.field);
        self.err(&path, p.message)
    }

    fn schedule(&self) -> Result<FaultSchedule, ScheduleError> {
        let doc: Value = serde_yaml::from_str(self.text).map_err(|e| ScheduleError {
            file: self.file.to_path_buf(),
            line: e.location().map(|l| l.line()),
            field: String::new(),
            message: format!("not valid YAML: {e}"),
        })?;
        if doc.is_null() {
            return Err(self.err(&[], "the schedule is empty; expected a mapping with `events:` and/or `policies:`"));
        }
        let top = self.entries(&doc, &[], &["seed", "events", "policies"], "the schedule")?;
        let mut s = FaultSchedule::default();
        for (k, v) in top {
            let path = [k.clone()];
            match k.as_str() {
                "seed" => s.seed = self.uint(v, &path, "a seed (a whole number, 0 or more)")?,
                "events" => {
                    for (i, e) in self.list(v, &path, "a list of events")?.iter().enumerate() {
                        s.events.push(self.event(i, e)?);
                    }
                }
                _ => {
                    for (i, p) in self.list(v, &path, "a list of policies")?.iter().enumerate() {
                        s.policies.push(self.policy(i, p)?);
                    }
                }
            }
        }
        Ok(s)
    }

    /// A mapping's entries, checking that every key is one of `allowed`.
    fn entries<'v>(
        &self,
        v: &'v Value,
        path: &[String],
        allowed: &[&str],
        what: &str,
    ) -> Result<Entries<'v>, ScheduleError> {
        let expected = allowed.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", ");
        let Value::Mapping(m) = v else {
            return Err(self.err(path, format!("expected {what}: a mapping with {expected}; found {}", shown(v))));
        };
        let mut out = Vec::with_capacity(m.len());
        for (k, val) in m {
            let Some(key) = k.as_str() else {
                return Err(self.err(path, format!("field names must be strings, found {}", shown(k))));
            };
            if !allowed.contains(&key) {
                let mut at = path.to_vec();
                at.push(key.to_string());
                return Err(self.err(&at, format!("unknown field `{key}` in {what}; expected {expected}")));
            }
            out.push((key.to_string(), val));
        }
        Ok(out)
    }

    fn list<'v>(&self, v: &'v Value, path: &[String], what: &str) -> Result<&'v [Value], ScheduleError> {
        match v {
            Value::Sequence(s) => Ok(s),
            Value::Null => Ok(&[]),
            other => Err(self.err(path, format!("expected {what} (`- ...` items); found {}", shown(other)))),
        }
    }

    fn uint(&self, v: &Value, path: &[String], what: &str) -> Result<u64, ScheduleError> {
        v.as_u64().ok_or_else(|| self.err(path, format!("expected {what}; found {}", shown(v))))
    }

    fn small(&self, v: &Value, path: &[String], what: &str) -> Result<u16, ScheduleError> {
        let n = self.uint(v, path, what)?;
        u16::try_from(n).map_err(|_| self.err(path, format!("{n} is too large; expected {what}")))
    }

    fn float(&self, v: &Value, path: &[String], what: &str) -> Result<f64, ScheduleError> {
        match v {
            Value::Number(n) => n.as_f64(),
            _ => None,
        }
        .ok_or_else(|| self.err(path, format!("expected {what}; found {}", shown(v))))
    }

    fn string(&self, v: &Value, path: &[String], what: &str) -> Result<String, ScheduleError> {
        v.as_str().map(str::to_string).ok_or_else(|| self.err(path, format!("expected {what}; found {}", shown(v))))
    }

    fn event(&self, i: usize, v: &Value) -> Result<FaultEvent, ScheduleError> {
        let path = vec!["events".to_string(), i.to_string()];
        let mut allowed = vec!["at"];
        allowed.extend(ACTIONS);
        let entries = self.entries(v, &path, &allowed, "an event (`at:` and one action)")?;
        let line = item_line(self.text, "events", i);
        let mut at = None;
        let mut action: Option<(String, &Value)> = None;
        for (k, val) in &entries {
            let mut p = path.clone();
            p.push(k.clone());
            if k == "at" {
                at = Some(self.at(val, &p)?);
            } else if let Some((first, _)) = &action {
                let first_line = line_of(self.text, &["events", &i.to_string(), first.as_str()])
                    .map(|l| format!(" (line {l})"))
                    .unwrap_or_default();
                return Err(self.err(
                    &p,
                    format!(
                        "an event has exactly one action, and this one already has `{first}`{first_line}; \
                         put `{k}` in an event of its own"
                    ),
                ));
            } else {
                action = Some((k.clone(), val));
            }
        }
        let Some(at) = at else {
            return Err(self.err(&path, "the event has no `at:`; expected `at: { packet: N }` or `at: { percent: P }`"));
        };
        let Some((key, value)) = action else {
            return Err(self.err(&path, format!("the event has no action; expected one of {}", ACTIONS.join(", "))));
        };
        let mut p = path.clone();
        p.push(key.clone());
        let action = self.action(&key, value, &p)?;
        Ok(FaultEvent { at, action, line })
    }

    fn at(&self, v: &Value, path: &[String]) -> Result<At, ScheduleError> {
        let entries = self.entries(v, path, &["packet", "percent"], "a point of the trace")?;
        let mut it = entries.into_iter();
        let (Some((k, val)), None) = (it.next(), it.next()) else {
            return Err(self.err(path, "expected exactly one of `packet: N` and `percent: P`"));
        };
        let mut p = path.to_vec();
        p.push(k.clone());
        if k == "packet" {
            Ok(At::Packet(self.uint(val, &p, "a packet count (1 is the first input packet)")?))
        } else {
            Ok(At::Percent(self.float(val, &p, "a percentage of the trace, strictly between 0 and 100")?))
        }
    }

    fn action(&self, key: &str, v: &Value, path: &[String]) -> Result<Action, ScheduleError> {
        let field = |f: &str| {
            let mut p = path.to_vec();
            p.push(f.to_string());
            p
        };
        let vertex_of = |entries: &Entries<'_>| -> Result<String, ScheduleError> {
            match entries.iter().find(|(k, _)| k == "vertex") {
                Some((_, v)) => self.string(v, &field("vertex"), "a vertex name"),
                None => Err(self.err(path, format!("`{key}` needs `vertex:` (a vertex of the chain)"))),
            }
        };
        let index = |entries: &Entries<'_>, f: &str, default: Option<u16>| -> Result<u16, ScheduleError> {
            match (entries.iter().find(|(k, _)| k == f), default) {
                (Some((_, v)), _) => self.small(v, &field(f), "an instance index (0 is the first instance)"),
                (None, Some(d)) => Ok(d),
                (None, None) => Err(self.err(path, format!("`{key}` needs `{f}:` (an instance index)"))),
            }
        };
        match key {
            "crash_store" => {
                if !v.is_null() {
                    self.entries(v, path, &[], &format!("`{key}`, which takes no fields (write `{key}: {{}}`)"))?;
                }
                Ok(Action::CrashStore)
            }
            "crash_root" => {
                if v.is_null() {
                    return Ok(Action::CrashRoot { root: 0 });
                }
                let e = self.entries(v, path, &["root"], "`crash_root`")?;
                let root = match e.iter().find(|(k, _)| k == "root") {
                    Some((_, v)) => {
                        let r = self.small(v, &field("root"), "a root number (0 is the first root)")?;
                        u8::try_from(r).map_err(|_| self.err(&field("root"), "a root number below 256"))?
                    }
                    None => 0,
                };
                Ok(Action::CrashRoot { root })
            }
            "crash" | "clone" => {
                let e = self.entries(v, path, &["vertex", "instance"], &format!("`{key}`"))?;
                let vertex = vertex_of(&e)?;
                let instance = index(&e, "instance", Some(0))?;
                Ok(if key == "crash" { Action::Crash { vertex, instance } } else { Action::Clone { vertex, instance } })
            }
            "scale" => {
                let e = self.entries(v, path, &["vertex", "to", "by"], "`scale`")?;
                let vertex = vertex_of(&e)?;
                let to = e.iter().find(|(k, _)| k == "to");
                let by = e.iter().find(|(k, _)| k == "by");
                let to = match (to, by) {
                    (Some((_, t)), None) => {
                        ScaleTo::Exactly(self.small(t, &field("to"), "an instance count (1 to 64)")?)
                    }
                    (None, Some((_, b))) => {
                        let what = "a change in the instance count (e.g. 1 or -1)";
                        let d = b
                            .as_i64()
                            .ok_or_else(|| self.err(&field("by"), format!("expected {what}; found {}", shown(b))))?;
                        ScaleTo::By(
                            i32::try_from(d)
                                .map_err(|_| self.err(&field("by"), format!("{d} is out of range; expected {what}")))?,
                        )
                    }
                    _ => {
                        return Err(
                            self.err(path, "`scale` needs exactly one of `to: N` (instances) and `by: N` (change)")
                        )
                    }
                };
                Ok(Action::Scale { vertex, to })
            }
            "move" => {
                let e = self.entries(v, path, &["vertex", "from", "to", "flows"], "`move`")?;
                let vertex = vertex_of(&e)?;
                let from = index(&e, "from", None)?;
                let to = index(&e, "to", None)?;
                let flows = match e.iter().find(|(k, _)| k == "flows") {
                    Some((_, f)) if !f.is_null() => Some(self.uint(f, &field("flows"), "a number of flows")?),
                    _ => None,
                };
                Ok(Action::Move { vertex, from, to, flows })
            }
            _ => {
                let e = self.entries(v, path, &["vertex", "instance", "delay_us"], "`slow`")?;
                let vertex = vertex_of(&e)?;
                let instance = index(&e, "instance", Some(0))?;
                let what = "a delay range in µs, `[LOW, HIGH]`";
                let delay_us = match e.iter().find(|(k, _)| k == "delay_us") {
                    Some((_, Value::Sequence(s))) if s.len() == 2 => {
                        let lo = s.first().and_then(Value::as_u64);
                        let hi = s.get(1).and_then(Value::as_u64);
                        match (lo, hi) {
                            (Some(lo), Some(hi)) => (lo, hi),
                            _ => return Err(self.err(&field("delay_us"), format!("expected {what} of whole numbers"))),
                        }
                    }
                    Some((_, other)) => {
                        return Err(self.err(&field("delay_us"), format!("expected {what}; found {}", shown(other))))
                    }
                    None => {
                        return Err(self.err(path, format!("`slow` needs `delay_us:`, {what} ([0, 0] ends a slowdown)")))
                    }
                };
                Ok(Action::Slow { vertex, instance, delay_us })
            }
        }
    }

    fn threshold(&self, v: &Value, path: &[String]) -> Result<Threshold, ScheduleError> {
        let e = self.entries(v, path, &["queue", "load"], "a threshold")?;
        let mut t = Threshold::default();
        for (k, val) in e {
            let mut p = path.to_vec();
            p.push(k.clone());
            if k == "queue" {
                t.queue = Some(self.uint(val, &p, "a number of queued packets")?);
            } else {
                t.load = Some(self.float(val, &p, "a fraction of busy time, 0 to 1")?);
            }
        }
        Ok(t)
    }

    fn policy(&self, i: usize, v: &Value) -> Result<Policy, ScheduleError> {
        let path = vec!["policies".to_string(), i.to_string()];
        let allowed = [
            "vertex",
            "scale_out_above",
            "scale_in_below",
            "max_instances",
            "min_instances",
            "straggler_slower_by_percent",
        ];
        let entries = self.entries(v, &path, &allowed, "a policy")?;
        let mut p = Policy { line: item_line(self.text, "policies", i), ..Policy::default() };
        let mut vertex = None;
        for (k, val) in entries {
            let mut f = path.clone();
            f.push(k.clone());
            match k.as_str() {
                "vertex" => vertex = Some(self.string(val, &f, "a vertex name")?),
                "scale_out_above" => p.scale_out_above = Some(self.threshold(val, &f)?),
                "scale_in_below" => p.scale_in_below = Some(self.threshold(val, &f)?),
                "max_instances" => p.max_instances = Some(self.small(val, &f, "an instance count (1 to 64)")?),
                "min_instances" => p.min_instances = Some(self.small(val, &f, "an instance count (1 to 64)")?),
                _ => {
                    p.straggler_slower_by_percent =
                        Some(self.float(val, &f, "a percentage above 0 (time per packet above the median)")?)
                }
            }
        }
        p.vertex = vertex.ok_or_else(|| self.err(&path, "the policy needs `vertex:` (a vertex of the chain)"))?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE_CHAIN: &str = include_str!("../../../chains/example.yaml");
    /// Packets in traces/demo.pcap.
    const DEMO_PACKETS: u64 = 65_744;
    const DOC: &str = include_str!("../../../docs/faults.md");
    const FILES: [(&str, &str); 7] = [
        ("nf-crash.yaml", include_str!("../../../faults/nf-crash.yaml")),
        ("straggler.yaml", include_str!("../../../faults/straggler.yaml")),
        ("straggler-policy.yaml", include_str!("../../../faults/straggler-policy.yaml")),
        ("move-4000.yaml", include_str!("../../../faults/move-4000.yaml")),
        ("scale.yaml", include_str!("../../../faults/scale.yaml")),
        ("root-and-nf.yaml", include_str!("../../../faults/root-and-nf.yaml")),
        ("store-crash.yaml", include_str!("../../../faults/store-crash.yaml")),
    ];
    const SMALL_CHAIN: &str = "name: small\nvertices:\n  nat:\n    type: nat\n    instances: 2\n    config: { external_ip: 198.51.100.1, internal: [\"10.0.0.0/8\"] }\n  portscan: { type: portscan }\nedges:\n  - { from: input, to: nat }\n  - { from: nat, to: portscan }\n  - { from: portscan, to: output }\n";

    fn chain(text: &str) -> Chain {
        match Chain::parse(text, Path::new("chain.yaml")) {
            Ok(c) => c,
            Err(e) => panic!("test chain: {e}"),
        }
    }

    fn parse(text: &str) -> Result<FaultSchedule, ScheduleError> {
        FaultSchedule::parse(text, Path::new("f.yaml"))
    }

    fn parsed(text: &str) -> FaultSchedule {
        match parse(text) {
            Ok(s) => s,
            Err(e) => panic!("{e}\n{text}"),
        }
    }

    fn parse_err(text: &str) -> ScheduleError {
        match parse(text) {
            Ok(s) => panic!("expected an error for\n{text}\ngot {s:?}"),
            Err(e) => e,
        }
    }

    fn validate_err(text: &str, c: &Chain) -> ScheduleError {
        match parsed(text).validate(c) {
            Ok(()) => panic!("expected a validation error for\n{text}"),
            Err(e) => e,
        }
    }

    /// Seed, events and policies without lines or source.
    fn content(s: &FaultSchedule) -> FaultSchedule {
        let mut s = s.clone();
        s.source = None;
        s.events.iter_mut().for_each(|e| e.line = None);
        s.policies.iter_mut().for_each(|p| p.line = None);
        s
    }

    const FULL: &str = "# faults/example.yaml
seed: 7
events:
  - at: { packet: 20000 }
    crash: { vertex: nat, instance: 0 }
  - at: { percent: 40 }
    crash_root: {}
  - at: { packet: 30000 }
    crash_store: {}
  - at: { percent: 50 }
    scale: { vertex: portscan, to: 3 }
  - at: { percent: 60 }
    move: { vertex: nat, from: 0, to: 1, flows: 4000 }
  - at: { packet: 1 }
    slow: { vertex: nat, instance: 0, delay_us: [3, 10] }
  - at: { percent: 30 }
    clone: { vertex: nat, instance: 0 }
policies:
  - { vertex: portscan, scale_out_above: { queue: 2000 }, scale_in_below: { queue: 100 }, max_instances: 4, min_instances: 1 }
  - { vertex: nat, straggler_slower_by_percent: 50 }
";

    #[test]
    fn parses_every_field() {
        let s = parsed(FULL);
        assert_eq!(s.seed, 7);
        assert_eq!(s.events.len(), 7);
        assert_eq!(s.events[0].at, At::Packet(20000));
        assert_eq!(s.events[0].action, Action::Crash { vertex: "nat".into(), instance: 0 });
        assert_eq!(s.events[0].line, Some(4));
        assert_eq!(s.events[1].action, Action::CrashRoot { root: 0 });
        assert_eq!(s.events[1].at, At::Percent(40.0));
        assert_eq!(s.events[2].action, Action::CrashStore);
        assert_eq!(s.events[3].action, Action::Scale { vertex: "portscan".into(), to: ScaleTo::Exactly(3) });
        assert_eq!(s.events[4].action, Action::Move { vertex: "nat".into(), from: 0, to: 1, flows: Some(4000) });
        assert_eq!(s.events[5].action, Action::Slow { vertex: "nat".into(), instance: 0, delay_us: (3, 10) });
        assert_eq!(s.events[6].action, Action::Clone { vertex: "nat".into(), instance: 0 });
        assert_eq!(s.events[6].line, Some(16));
        assert_eq!(s.policies.len(), 2);
        assert_eq!(s.policies[0].scale_out_above, Some(Threshold { queue: Some(2000), load: None }));
        assert_eq!(s.policies[0].scale_in_below, Some(Threshold { queue: Some(100), load: None }));
        assert_eq!((s.policies[0].min_instances, s.policies[0].max_instances), (Some(1), Some(4)));
        assert_eq!(s.policies[1].straggler_slower_by_percent, Some(50.0));
        assert_eq!(s.policies[1].line, Some(20));
        // Scale by, crash_root without a value, defaults.
        let s = parsed("events:\n  - at: { packet: 5 }\n    scale: { vertex: nat, by: -1 }\n  - at: { packet: 6 }\n    crash_root:\n  - at: { packet: 7 }\n    crash: { vertex: nat }\n");
        assert_eq!(s.seed, 0);
        assert_eq!(s.events[0].action, Action::Scale { vertex: "nat".into(), to: ScaleTo::By(-1) });
        assert_eq!(s.events[1].action, Action::CrashRoot { root: 0 });
        assert_eq!(s.events[2].action, Action::Crash { vertex: "nat".into(), instance: 0 });
        // An example chain with two NATs takes the full example once portscan is known.
        let c = chain(&EXAMPLE_CHAIN.replace("    type: nat\n", "    type: nat\n    instances: 2\n"));
        let full = parsed(FULL);
        assert_eq!(full.validate(&c), Ok(()));
        assert_eq!(full.validate_for_trace(&c, DEMO_PACKETS), Ok(()));
    }

    #[test]
    fn crash_root_names_a_root() {
        let s = parsed(
            "events:\n  - at: { packet: 5 }\n    crash_root: { root: 2 }\n  - at: { packet: 6 }\n    crash_root: {}\n",
        );
        assert_eq!(s.events[0].action, Action::CrashRoot { root: 2 });
        assert_eq!(s.events[1].action, Action::CrashRoot { root: 0 });
        let again = parsed(&s.to_yaml());
        assert_eq!(
            again.events.iter().map(|e| e.action.clone()).collect::<Vec<_>>(),
            vec![Action::CrashRoot { root: 2 }, Action::CrashRoot { root: 0 }]
        );
        let e = parse_err("events:\n  - at: { packet: 5 }\n    crash_root: { root: 300 }\n");
        assert_eq!(e.field, "events.0.crash_root.root");
        let e = parse_err("events:\n  - at: { packet: 5 }\n    crash_root: { rot: 1 }\n");
        assert!(e.to_string().contains("rot"), "{e}");
    }

    #[test]
    fn serializes_for_reports() {
        let s = parsed(FULL);
        let json = serde_json::to_value(&s).unwrap_or_default();
        assert_eq!(json["events"][0]["at"]["packet"], 20000);
        assert_eq!(json["events"][0]["action"]["crash"]["vertex"], "nat");
        assert_eq!(json["events"][1]["action"]["crash_root"]["root"], 0);
        assert_eq!(json["events"][3]["action"]["scale"]["to"]["exactly"], 3);
        assert_eq!(json["policies"][0]["scale_out_above"]["queue"], 2000);
    }

    /// Every ```yaml block in docs/faults.md is a complete schedule for chains/example.yaml.
    #[test]
    fn doc_examples_parse_and_validate() {
        let c = chain(EXAMPLE_CHAIN);
        let mut blocks = 0;
        let mut rest = DOC;
        while let Some(start) = rest.find("```yaml\n") {
            let body = &rest[start + 8..];
            let Some(end) = body.find("```") else { panic!("unterminated yaml block in docs/faults.md") };
            let text = &body[..end];
            let s = match FaultSchedule::parse(text, Path::new("docs/faults.md")) {
                Ok(s) => s,
                Err(e) => panic!("docs/faults.md example {blocks}: {e}\n{text}"),
            };
            if let Err(e) = s.validate_for_trace(&c, DEMO_PACKETS) {
                panic!("docs/faults.md example {blocks}: {e}\n{text}");
            }
            blocks += 1;
            rest = &body[end + 3..];
        }
        assert!(blocks >= 6, "only {blocks} yaml examples in docs/faults.md");
    }

    #[test]
    fn fault_files_parse_and_validate() {
        let c = chain(EXAMPLE_CHAIN);
        for (name, text) in FILES {
            let s = match FaultSchedule::parse(text, Path::new(name)) {
                Ok(s) => s,
                Err(e) => panic!("{e}"),
            };
            assert!(!s.events.is_empty() || !s.policies.is_empty(), "{name} is empty");
            if let Err(e) = s.validate(&c).and_then(|()| s.validate_for_trace(&c, DEMO_PACKETS)) {
                panic!("{e}");
            }
            // Round trip of real files too.
            let back = parsed(&s.to_yaml());
            assert_eq!(content(&back), content(&s), "{name}");
        }
        // Every file under faults/ is tested here.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../faults");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                assert!(FILES.iter().any(|(n, _)| *n == name), "faults/{name} is not in the test's FILES");
            }
        }
    }

    #[test]
    fn unknown_field() {
        let e = parse_err("events:\n  - at: { packet: 1 }\n    crash: { vertex: nat, instanse: 0 }\n");
        assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.crash.instanse"));
        assert!(e.message.contains("unknown field `instanse`") && e.message.contains("`instance`"), "{e}");
        let e = parse_err("seed: 1\nevnts: []\n");
        assert_eq!((e.line, e.field.as_str()), (Some(2), "evnts"));
        let e = parse_err("events:\n  - at: { packet: 1 }\n    crsh: { vertex: nat }\n");
        assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.crsh"));
        assert!(e.message.contains("`crash`"), "{e}");
        let e = parse_err("policies:\n  - vertex: nat\n    scale_out_above: { queue: 5, cpu: 1 }\n");
        assert_eq!((e.line, e.field.as_str()), (Some(3), "policies.0.scale_out_above.cpu"));
        assert_eq!(e.to_string().split(':').next(), Some("f.yaml"));
        assert!(e.to_string().starts_with("f.yaml:3: field `policies.0.scale_out_above.cpu`: unknown field"), "{e}");
    }

    #[test]
    fn lines_in_block_style_and_unindented_lists() {
        let e =
            parse_err("events:\n  - at:\n      percent: 150\n    slow:\n      vertex: nat\n      delay_us: [1, 2]\n");
        assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.at.percent"));
        let e = parse_err("events:\n  - at: { packet: 1 }\n    slow:\n      vertex: nat\n      delay_us: [10, 3]\n");
        assert_eq!((e.line, e.field.as_str()), (Some(5), "events.0.slow.delay_us"));
        let text = "seed: 1\nevents:\n# first\n- at: { packet: 1 }\n  crash_root: {}\n- at: { packet: 2 }\n  crash: { vertex: nat, instanse: 0 }\npolicies:\n- { vertex: nat, straggler_slower_by_percent: 5 }\n";
        let e = parse_err(text);
        assert_eq!((e.line, e.field.as_str()), (Some(7), "events.1.crash.instanse"));
        let s = parsed(&text.replace("instanse", "instance"));
        assert_eq!(s.events.iter().map(|e| e.line).collect::<Vec<_>>(), vec![Some(4), Some(6)]);
        assert_eq!(s.policies[0].line, Some(9));
    }

    #[test]
    fn doc_error_message_is_real() {
        let c = chain(EXAMPLE_CHAIN);
        let text = FILES[0].1.replace("vertex: nat", "vertex: nta");
        let e = FaultSchedule::parse(&text, Path::new("faults/nf-crash.yaml")).and_then(|s| s.validate(&c)).err();
        let want = "faults/nf-crash.yaml:7: field `events.0.crash.vertex`: no vertex `nta` in chain `example` (known: nat, portscan, lb, trojan)";
        assert_eq!(e.map(|e| e.to_string()), Some(want.to_string()));
        assert!(DOC.contains(want));
        let text = "events:\n  - at: { packet: 1 }\n    crash_root: {}\n  - at: { packet: 2 }\n    slow: { vertex: nat, instance: 0, delay_us: [10, 3] }\n";
        let e =
            FaultSchedule::parse(text, Path::new("faults/bad.yaml")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.starts_with("faults/bad.yaml:5: field `events.1.slow.delay_us`: [10, 3]: the low bound"), "{e}");
        assert!(DOC.contains(e.as_str()), "{e}");
    }

    #[test]
    fn one_action_per_event() {
        let e =
            parse_err("events:\n  - at: { packet: 1 }\n    crash: { vertex: nat, instance: 0 }\n    crash_root: {}\n");
        assert_eq!((e.line, e.field.as_str()), (Some(4), "events.0.crash_root"));
        assert!(e.message.contains("exactly one action") && e.message.contains("`crash` (line 3)"), "{e}");
        let e = parse_err("events:\n  - at: { packet: 1 }\n");
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("no action"), "{e}");
        let e = parse_err("events:\n  - crash_store: {}\n");
        assert!(e.message.contains("no `at:`"), "{e}");
        let e = parse_err("events:\n  - at: { packet: 1, percent: 5 }\n    crash_store: {}\n");
        assert!(e.message.contains("exactly one of"), "{e}");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    crash_store: { vertex: nat }\n");
        assert_eq!(e.field, "events.0.crash_store.vertex");
    }

    #[test]
    fn unknown_vertex_lists_known_ones() {
        let c = chain(EXAMPLE_CHAIN);
        let e = validate_err("events:\n  - at: { percent: 10 }\n    crash: { vertex: nta, instance: 0 }\n", &c);
        assert_eq!((e.line, e.field.as_str()), (Some(2), "events.0.crash.vertex"));
        assert!(e.message.contains("nat, portscan, lb, trojan"), "{e}");
        assert_eq!(e.file, PathBuf::from("f.yaml"));
        let e = validate_err("policies:\n  - { vertex: lbb, straggler_slower_by_percent: 5 }\n", &c);
        assert_eq!((e.line, e.field.as_str()), (Some(2), "policies.0.vertex"));
        assert!(e.message.contains("known: nat, portscan, lb, trojan"), "{e}");
        // Off-path vertices are fine.
        let s = parsed("events:\n  - at: { percent: 10 }\n    crash: { vertex: trojan }\n");
        assert_eq!(s.validate(&c), Ok(()));
    }

    #[test]
    fn range_errors() {
        let e = parse_err("events:\n  - at: { percent: 150 }\n    crash_root: {}\n");
        assert_eq!((e.line, e.field.as_str()), (Some(2), "events.0.at.percent"));
        assert!(e.message.contains("between 0 and 100"), "{e}");
        for p in ["0", "100", "-1"] {
            let e = parse_err(&format!("events:\n  - at: {{ percent: {p} }}\n    crash_root: {{}}\n"));
            assert_eq!(e.field, "events.0.at.percent");
        }
        let e = parse_err("events:\n  - at: { packet: 0 }\n    crash_root: {}\n");
        assert_eq!(e.field, "events.0.at.packet");
        let e =
            parse_err("events:\n  - at: { packet: 1 }\n    slow: { vertex: nat, instance: 0, delay_us: [10, 3] }\n");
        assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.slow.delay_us"));
        assert!(e.message.contains("[3, 10]"), "{e}");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    slow: { vertex: nat, delay_us: [0, 2000000] }\n");
        assert_eq!(e.field, "events.0.slow.delay_us");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    slow: { vertex: nat, delay_us: 5 }\n");
        assert!(e.message.contains("[LOW, HIGH]"), "{e}");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    scale: { vertex: nat, to: 0 }\n");
        assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.scale.to"));
        assert!(e.message.contains("at least 1 instance"), "{e}");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    scale: { vertex: nat, to: 65 }\n");
        assert_eq!(e.field, "events.0.scale.to");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    scale: { vertex: nat, to: 2, by: 1 }\n");
        assert!(e.message.contains("exactly one of `to: N`"), "{e}");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    move: { vertex: nat, from: 1, to: 1 }\n");
        assert_eq!((e.line, e.field.as_str()), (Some(3), "events.0.move.to"));
        assert!(e.message.contains("two different instances"), "{e}");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    move: { vertex: nat, from: 0, to: 1, flows: 0 }\n");
        assert_eq!(e.field, "events.0.move.flows");
        let e = parse_err("events:\n  - at: { packet: 1 }\n    crash: { vertex: nat, instance: -1 }\n");
        assert_eq!(e.field, "events.0.crash.instance");
        let e = parse_err("events:\n  - at: { packet: x }\n    crash_root: {}\n");
        assert_eq!(e.field, "events.0.at.packet");
        let e = parse_err("seed: -3\n");
        assert_eq!((e.line, e.field.as_str()), (Some(1), "seed"));
        let e = parse_err("events: [\n");
        assert!(e.message.starts_with("not valid YAML"), "{e}");
        let e = parse_err("");
        assert!(e.message.contains("empty"), "{e}");
        // Policies.
        let e = parse_err(
            "policies:\n  - { vertex: nat, max_instances: 2, min_instances: 3, scale_out_above: { queue: 9 } }\n",
        );
        assert_eq!((e.line, e.field.as_str()), (Some(2), "policies.0.min_instances"));
        let e = parse_err(
            "policies:\n  - vertex: nat\n    scale_out_above: { queue: 10 }\n    scale_in_below: { queue: 10 }\n",
        );
        assert_eq!((e.line, e.field.as_str()), (Some(4), "policies.0.scale_in_below.queue"));
        let e = parse_err("policies:\n  - { vertex: nat, scale_out_above: { load: 1.5 } }\n");
        assert_eq!(e.field, "policies.0.scale_out_above.load");
        let e = parse_err("policies:\n  - { vertex: nat, scale_out_above: {} }\n");
        assert_eq!(e.field, "policies.0.scale_out_above");
        let e = parse_err("policies:\n  - { vertex: nat }\n");
        assert!(e.message.contains("does nothing"), "{e}");
        let e = parse_err("policies:\n  - { vertex: nat, straggler_slower_by_percent: 0 }\n");
        assert_eq!(e.field, "policies.0.straggler_slower_by_percent");
        let e = parse_err(
            "policies:\n  - { vertex: nat, straggler_slower_by_percent: 5 }\n  - { vertex: nat, scale_out_above: { queue: 1 } }\n",
        );
        assert_eq!((e.line, e.field.as_str()), (Some(3), "policies.1.vertex"));
        assert!(e.message.contains("(line 2)"), "{e}");
    }

    #[test]
    fn instances_follow_the_schedule() {
        let c = chain(EXAMPLE_CHAIN);
        let e = validate_err("events:\n  - at: { percent: 10 }\n    crash: { vertex: nat, instance: 1 }\n", &c);
        assert_eq!((e.line, e.field.as_str()), (Some(2), "events.0.crash.instance"));
        assert!(e.message.contains("has 1 instance(s)") && e.message.contains("no instance 1"), "{e}");
        // A scale earlier in the schedule makes the index exist; listed later, it does not.
        let ok = "events:\n  - at: { percent: 10 }\n    scale: { vertex: nat, to: 3 }\n  - at: { percent: 20 }\n    move: { vertex: nat, from: 2, to: 0 }\n";
        assert_eq!(parsed(ok).validate(&c), Ok(()));
        let late = "events:\n  - at: { percent: 20 }\n    move: { vertex: nat, from: 2, to: 0 }\n  - at: { percent: 10 }\n    scale: { vertex: nat, to: 3 }\n";
        assert_eq!(parsed(late).validate(&c), Ok(()), "trace order, not file order, when all use percent");
        let before = "events:\n  - at: { percent: 5 }\n    move: { vertex: nat, from: 2, to: 0 }\n  - at: { percent: 10 }\n    scale: { vertex: nat, to: 3 }\n";
        let e = validate_err(before, &c);
        assert_eq!(e.field, "events.0.move.from");
        // Scaling in removes the high indices.
        let e = validate_err("events:\n  - at: { packet: 10 }\n    scale: { vertex: lb, by: 2 }\n  - at: { packet: 20 }\n    scale: { vertex: lb, by: -1 }\n  - at: { packet: 30 }\n    clone: { vertex: lb, instance: 2 }\n", &c);
        assert_eq!((e.line, e.field.as_str()), (Some(6), "events.2.clone.instance"));
        // Never 0 instances.
        let e = validate_err("events:\n  - at: { packet: 10 }\n    scale: { vertex: lb, by: -1 }\n", &c);
        assert_eq!(e.field, "events.0.scale.by");
        assert!(e.message.contains("leave it with 0"), "{e}");
        // A scale-out policy lets indices up to its max through.
        let managed = "events:\n  - at: { percent: 50 }\n    crash: { vertex: portscan, instance: 2 }\npolicies:\n  - { vertex: portscan, scale_out_above: { queue: 100 }, max_instances: 3 }\n";
        assert_eq!(parsed(managed).validate(&c), Ok(()));
        let e = validate_err(&managed.replace("instance: 2", "instance: 3"), &c);
        assert!(e.message.contains("allows up to 3"), "{e}");
        // Past the end of the trace.
        let s = parsed("events:\n  - at: { packet: 70000 }\n    crash_root: {}\n");
        assert_eq!(s.validate(&c), Ok(()));
        let e = s.validate_for_trace(&c, DEMO_PACKETS).err();
        assert!(e.is_some_and(|e| e.message.contains("past the end")));
    }

    #[test]
    fn events_built_in_code_are_checked_and_described() {
        let c = chain(EXAMPLE_CHAIN);
        let s = FaultSchedule {
            events: vec![FaultEvent {
                at: At::Percent(10.0),
                action: Action::Move { vertex: "nat".into(), from: 0, to: 0, flows: None },
                line: None,
            }],
            ..FaultSchedule::default()
        };
        let e = s.validate(&c).err();
        assert!(e.as_ref().is_some_and(|e| e.field == "events.0.move.to" && e.line.is_none()), "{e:?}");
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.starts_with("<schedule>: field `events.0.move.to`: move all flows of nat 0>0 at 10%:"), "{text}");
    }

    #[test]
    fn resolve_rounds_and_sorts() {
        let s = parsed(FULL);
        let r = s.resolve(DEMO_PACKETS);
        let counts: Vec<u64> = r.iter().map(|(c, _)| *c).collect();
        assert_eq!(counts, vec![1, 19_723, 20_000, 26_298, 30_000, 32_872, 39_446]);
        assert_eq!(r[0].1.action.key(), "slow");
        assert_eq!(r[1].1.action.key(), "clone");
        // Percentages of tiny traces are at least 1; equal counts keep file order.
        let s = parsed(
            "events:\n  - at: { percent: 20 }\n    crash_store: {}\n  - at: { packet: 1 }\n    crash_root: {}\n",
        );
        let r = s.resolve(2);
        assert_eq!(
            r.iter().map(|(c, e)| (*c, e.action.key())).collect::<Vec<_>>(),
            vec![(1, "crash_store"), (1, "crash_root")]
        );
        assert_eq!(At::Percent(50.0).resolve(0), 1);
        assert_eq!(At::Percent(99.9).resolve(1000), 999);
    }

    #[test]
    fn random_schedules_are_valid_and_deterministic() {
        let small = chain(SMALL_CHAIN);
        let example = chain(EXAMPLE_CHAIN);
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..500u64 {
            for (c, total) in [(&small, 10_000u64), (&example, DEMO_PACKETS), (&small, 3)] {
                let s = FaultSchedule::random(seed, c, total, 6);
                assert!((1..=6).contains(&s.events.len()));
                assert_eq!(s.seed, seed);
                if let Err(e) = s.validate(c).and_then(|()| s.validate_for_trace(c, total)) {
                    panic!("seed {seed}: {e}\n{}", s.to_yaml());
                }
                // File order is trace order.
                let resolved: Vec<*const FaultEvent> = s.resolve(total).iter().map(|(_, e)| *e as *const _).collect();
                let listed: Vec<*const FaultEvent> = s.events.iter().map(|e| e as *const _).collect();
                assert_eq!(resolved, listed, "seed {seed}");
                for e in &s.events {
                    kinds.insert(e.action.key());
                    if let Action::Slow { delay_us: (lo, hi), .. } = e.action {
                        assert!(lo <= hi && hi <= RANDOM_MAX_DELAY_US);
                    }
                    if let Action::Scale { to: ScaleTo::Exactly(n), .. } = e.action {
                        assert!((1..=RANDOM_MAX_INSTANCES).contains(&n));
                    }
                }
            }
            assert_eq!(FaultSchedule::random(seed, &small, 10_000, 6), FaultSchedule::random(seed, &small, 10_000, 6));
        }
        assert_eq!(kinds.len(), ACTIONS.len(), "every action kind drawn: {kinds:?}");
        assert_ne!(FaultSchedule::random(1, &small, 10_000, 6), FaultSchedule::random(2, &small, 10_000, 6));
        assert_eq!(FaultSchedule::random(3, &small, 10_000, 0).events.len(), 1);
    }

    #[test]
    fn round_trip_through_yaml() {
        let small = chain(SMALL_CHAIN);
        for seed in 0..500u64 {
            let s = FaultSchedule::random(seed, &small, 1 + seed * 97, 8);
            let text = s.to_yaml();
            let back = match FaultSchedule::parse(&text, Path::new("rt.yaml")) {
                Ok(b) => b,
                Err(e) => panic!("seed {seed}: {e}\n{text}"),
            };
            assert_eq!(content(&back), content(&s), "seed {seed}\n{text}");
            assert!(back.events.iter().all(|e| e.line.is_some()));
        }
        for text in [FULL, "events: []\n"] {
            let s = parsed(text);
            assert_eq!(content(&parsed(&s.to_yaml())), content(&s));
        }
        // Awkward numbers and names.
        let mut s = FaultSchedule { seed: u64::MAX, ..FaultSchedule::default() };
        for (i, name) in ["yes", "a b", "1x", "null", "q\"uote", "x:y", "-dash", "nat"].iter().enumerate() {
            s.events.push(FaultEvent {
                at: At::Percent(0.1 + i as f64 * 7.3),
                action: Action::Clone { vertex: name.to_string(), instance: 1 },
                line: None,
            });
        }
        s.events.push(FaultEvent { at: At::Percent(1e-7), action: Action::CrashStore, line: None });
        s.policies.push(Policy {
            vertex: "on".into(),
            scale_out_above: Some(Threshold { queue: Some(5), load: Some(0.123456789) }),
            scale_in_below: Some(Threshold { queue: None, load: Some(1e-9) }),
            max_instances: Some(64),
            min_instances: Some(1),
            straggler_slower_by_percent: Some(1e300),
            line: None,
        });
        let back = parsed(&s.to_yaml());
        assert_eq!(content(&back), content(&s), "{}", s.to_yaml());
    }
}
