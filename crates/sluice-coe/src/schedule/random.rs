//! Random runs for property tests and `sluice fuzz`: a schedule of 1 to N events of every
//! kind, on every vertex of the chain (off-path and last NFs included), and the run options
//! (`run:`) it runs under, always valid and never one of the [`Unrecoverable`] combinations.
//!
//! [`Unrecoverable`]: super::Unrecoverable

use super::model::{Action, At, FaultEvent, FaultSchedule, RunOptions, ScaleTo};
use super::unrecoverable::conflicts;
use super::{RANDOM_MAX_DELAY_US, RANDOM_MAX_INSTANCES, RANDOM_MAX_ROOTS};
use crate::engine::LogPlace;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sluice_runtime::Chain;

/// The checkpoint intervals random runs use: only after failovers, often, the default.
pub const RANDOM_CHECKPOINTS: [u64; 3] = [0, 500, 10_000];

/// The kinds of action [`Drawer::candidate`] draws from: an instance crash, a root crash, a
/// store crash, scaling, a move, a slowdown, a clone.
const ALL_KINDS: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
/// An instance crash, of [`ALL_KINDS`].
const KIND_CRASH: u32 = 0;
/// A slowdown, of [`ALL_KINDS`].
const KIND_SLOW: u32 = 5;
/// Scaling out or in, of [`ALL_KINDS`].
const KIND_SCALE: u32 = 3;
/// A flow move (with a scale-out first if the vertex has one instance), of [`ALL_KINDS`].
const KIND_MOVE: u32 = 4;
/// A root crash, of [`ALL_KINDS`].
const KIND_ROOT_CRASH: u32 = 1;
/// A store crash, of [`ALL_KINDS`].
const KIND_STORE_CRASH: u32 = 2;
/// A straggler's clone, of [`ALL_KINDS`].
const KIND_CLONE: u32 = 6;
/// What the threaded runtime applies: every kind.
const THREADED_KINDS: &[u32] =
    &[KIND_CRASH, KIND_ROOT_CRASH, KIND_STORE_CRASH, KIND_SCALE, KIND_MOVE, KIND_SLOW, KIND_CLONE];

/// How often (of 1) an event is put at the same point as an earlier one.
const SAME_POINT: f64 = 0.25;
/// Redraws of an action that would make an unrecoverable combination before giving up on it.
const REDRAWS: usize = 16;

impl FaultSchedule {
    /// A random run that is valid for `chain` over a trace of `total_packets` packets: run
    /// options (1 to [`RANDOM_MAX_ROOTS`] roots, the log at the root or in the store, the
    /// asynchronous delete on or off, a checkpoint interval from [`RANDOM_CHECKPOINTS`]) and 1
    /// to `max_events` events at random points (packet counts or percentages; about one in
    /// four at the same point as an earlier one), each an action of any kind on any vertex
    /// or root. Instance counts are followed as the schedule scales (1 to
    /// [`RANDOM_MAX_INSTANCES`]), so every index exists when its event happens; a move on a
    /// vertex with one instance is preceded by a scale-out at the same point; slow events add
    /// at most [`RANDOM_MAX_DELAY_US`]. The events are listed in trace order. No
    /// [`super::Unrecoverable`] combination is drawn, and nothing else is left out. The same
    /// seed always gives the same run; it also becomes the schedule's `seed`.
    pub fn random(seed: u64, chain: &Chain, total_packets: u64, max_events: usize) -> FaultSchedule {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let run = random_run_options(&mut rng);
        Self::random_events(rng, seed, run, ALL_KINDS, chain, total_packets, max_events)
    }

    /// A random run of the kinds of event `sluice run --faults` applies to a threaded run so
    /// far (instance, root and store crashes, slowdowns, scaling and flow moves), under the default
    /// run options: 1 to `max_events` of them on any instance of any vertex at random points,
    /// as [`FaultSchedule::random`] draws them. The same seed always gives the same run. A
    /// threaded run keeps thousands of packets in flight: one with a root crash needs the log
    /// in the store (`--log store`) for a later instance crash to replay what the old root
    /// admitted.
    pub fn random_threaded(seed: u64, chain: &Chain, total_packets: u64, max_events: usize) -> FaultSchedule {
        let rng = ChaCha8Rng::seed_from_u64(seed);
        Self::random_events(rng, seed, RunOptions::default(), THREADED_KINDS, chain, total_packets, max_events)
    }

    /// A random run for a threaded run with `roots` roots (`sluice run --roots N`): every kind
    /// of event, crashes of any root among them, drawn as [`FaultSchedule::random_threaded`]
    /// draws them; its `run:` section names the roots.
    pub fn random_threaded_several_roots(
        seed: u64,
        chain: &Chain,
        (total_packets, max_events): (u64, usize),
        roots: u8,
    ) -> FaultSchedule {
        let rng = ChaCha8Rng::seed_from_u64(seed);
        let run = RunOptions { roots: Some(roots), ..RunOptions::default() };
        Self::random_events(rng, seed, run, THREADED_KINDS, chain, total_packets, max_events)
    }

    fn random_events(
        mut rng: ChaCha8Rng,
        seed: u64,
        run: RunOptions,
        kinds: &'static [u32],
        chain: &Chain,
        total_packets: u64,
        max_events: usize,
    ) -> FaultSchedule {
        let total = total_packets.max(1);
        let n = rng.gen_range(1..=max_events.max(1));
        let points = random_points(&mut rng, total, n);
        let mut g = Drawer {
            names: chain.vertices.iter().map(|(n, _)| n.clone()).collect(),
            counts: chain.vertices.iter().map(|(_, v)| v.instances.clamp(1, RANDOM_MAX_INSTANCES)).collect(),
            roots: run.root_count(),
            log: run.log.unwrap_or(LogPlace::Root),
            kinds,
        };
        let mut events: Vec<(u64, FaultEvent)> = Vec::with_capacity(n + 1);
        for (count, at) in points {
            if events.len() >= n {
                break;
            }
            let same: Vec<Action> = events.iter().filter(|(c, _)| *c == count).map(|(_, e)| e.action.clone()).collect();
            for action in g.draw(&mut rng, &same, n - events.len()) {
                events.push((count, FaultEvent { at, action, line: None }));
            }
        }
        FaultSchedule {
            seed,
            events: events.into_iter().map(|(_, e)| e).collect(),
            policies: Vec::new(),
            run,
            source: None,
        }
    }
}

/// The run options of a random run; all four are set, so the file describes the run fully.
fn random_run_options(rng: &mut ChaCha8Rng) -> RunOptions {
    let checkpoint = RANDOM_CHECKPOINTS.get(rng.gen_range(0..RANDOM_CHECKPOINTS.len())).copied().unwrap_or(10_000);
    RunOptions {
        roots: Some(rng.gen_range(1..=RANDOM_MAX_ROOTS)),
        log: Some(if rng.gen_bool(0.5) { LogPlace::Store } else { LogPlace::Root }),
        async_delete: Some(rng.gen_bool(0.3)),
        checkpoint_every: Some(checkpoint),
        ..RunOptions::default()
    }
}

/// `n` points of a trace of `total` packets in trace order (ties by the written value), with
/// their packet counts; some repeat an earlier point exactly.
fn random_points(rng: &mut ChaCha8Rng, total: u64, n: usize) -> Vec<(u64, At)> {
    let mut points: Vec<(u64, f64, At)> = Vec::with_capacity(n);
    for _ in 0..n {
        if !points.is_empty() && rng.gen_bool(SAME_POINT) {
            if let Some(p) = points.get(rng.gen_range(0..points.len())).copied() {
                points.push(p);
                continue;
            }
        }
        let at = if rng.gen_bool(0.5) {
            At::Packet(rng.gen_range(1..=total))
        } else {
            At::Percent(f64::from(rng.gen_range(1u16..=999)) / 10.0)
        };
        let written = match at {
            At::Packet(c) => c as f64,
            At::Percent(p) => p,
        };
        points.push((at.resolve(total), written, at));
    }
    points.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    points.into_iter().map(|(c, _, at)| (c, at)).collect()
}

/// Draws actions, following the instance counts of every vertex.
struct Drawer {
    names: Vec<String>,
    counts: Vec<u16>,
    roots: u8,
    log: LogPlace,
    /// The kinds of action to draw (of [`ALL_KINDS`]).
    kinds: &'static [u32],
}

impl Drawer {
    /// The actions of one point (one, or a scale-out and a move when `budget` allows),
    /// given the actions already at the same point. An action that would make an
    /// unrecoverable combination is drawn again; a slowdown, which never does, is the last
    /// resort.
    fn draw(&mut self, rng: &mut ChaCha8Rng, same: &[Action], budget: usize) -> Vec<Action> {
        let same: Vec<&Action> = same.iter().collect();
        for _ in 0..REDRAWS {
            let v = rng.gen_range(0..self.names.len().max(1));
            // With every kind, the draw is the one seeds of earlier runs were made with.
            let kinds = u32::try_from(self.kinds.len()).unwrap_or(1).max(1);
            let kind = self.kinds.get(rng.gen_range(0..kinds) as usize).copied().unwrap_or(KIND_CRASH);
            let candidate = self.candidate(rng, kind, v, budget);
            let ok = candidate.iter().all(|a| !conflicts(a, &same, self.log));
            if ok {
                for a in &candidate {
                    self.follow(a);
                }
                return candidate;
            }
        }
        if self.kinds.contains(&KIND_SLOW) {
            vec![self.slow(rng, 0)]
        } else {
            Vec::new()
        }
    }

    /// A candidate action of `kind` on vertex `v` (not yet applied to the counts).
    fn candidate(&self, rng: &mut ChaCha8Rng, kind: u32, v: usize, budget: usize) -> Vec<Action> {
        let Some(vertex) = self.names.get(v).cloned() else {
            // A chain without vertices: only the root and the store can fail.
            return vec![if rng.gen_bool(0.5) { Action::CrashRoot { root: 0 } } else { Action::CrashStore }];
        };
        let now = self.counts.get(v).copied().unwrap_or(1).max(1);
        match kind {
            0 => vec![Action::Crash { vertex, instance: rng.gen_range(0..now) }],
            1 => vec![Action::CrashRoot { root: rng.gen_range(0..self.roots.max(1)) }],
            2 => vec![Action::CrashStore],
            3 => vec![random_scale(rng, vertex, now)],
            4 => {
                let flows = if rng.gen_bool(0.5) { Some(rng.gen_range(1..=4000)) } else { None };
                if now >= 2 {
                    let from = rng.gen_range(0..now);
                    let to = (from + 1 + rng.gen_range(0..now - 1)) % now;
                    return vec![Action::Move { vertex, from, to, flows }];
                }
                // One instance: scale out first (at the same point) so the flows have
                // somewhere to go.
                let scale = Action::Scale { vertex: vertex.clone(), to: ScaleTo::By(1) };
                if budget < 2 {
                    return vec![scale];
                }
                let (from, to) = if rng.gen_bool(0.5) { (0, 1) } else { (1, 0) };
                vec![scale, Action::Move { vertex, from, to, flows }]
            }
            5 => vec![self.slow(rng, v)],
            _ => vec![Action::Clone { vertex, instance: rng.gen_range(0..now) }],
        }
    }

    /// A slowdown of an instance of vertex `v` (or its end: `[0, 0]`).
    fn slow(&self, rng: &mut ChaCha8Rng, v: usize) -> Action {
        let vertex = self.names.get(v).cloned().unwrap_or_default();
        let now = self.counts.get(v).copied().unwrap_or(1).max(1);
        let delay_us = if rng.gen_bool(0.15) {
            (0, 0)
        } else {
            let lo = rng.gen_range(0..=RANDOM_MAX_DELAY_US / 2);
            (lo, rng.gen_range(lo..=RANDOM_MAX_DELAY_US))
        };
        Action::Slow { vertex, instance: rng.gen_range(0..now), delay_us }
    }

    /// Follows the instance counts through a drawn action.
    fn follow(&mut self, a: &Action) {
        let Action::Scale { vertex, to } = a else { return };
        let Some(v) = self.names.iter().position(|n| n == vertex) else { return };
        if let Some(c) = self.counts.get_mut(v) {
            let target = match *to {
                ScaleTo::Exactly(n) => i32::from(n),
                ScaleTo::By(d) => i32::from(*c) + d,
            };
            *c = u16::try_from(target.clamp(1, i32::from(RANDOM_MAX_INSTANCES))).unwrap_or(1);
        }
    }
}

/// A random scale event for a vertex with `now` instances, within 1..=[`RANDOM_MAX_INSTANCES`].
fn random_scale(rng: &mut ChaCha8Rng, vertex: String, now: u16) -> Action {
    let out = now < RANDOM_MAX_INSTANCES && (now == 1 || rng.gen_bool(0.5));
    let target = if out {
        rng.gen_range(now + 1..=RANDOM_MAX_INSTANCES)
    } else {
        rng.gen_range(1..=(now - 1).clamp(1, RANDOM_MAX_INSTANCES))
    };
    let to = if rng.gen_bool(0.5) { ScaleTo::Exactly(target) } else { ScaleTo::By(i32::from(target) - i32::from(now)) };
    Action::Scale { vertex, to }
}
