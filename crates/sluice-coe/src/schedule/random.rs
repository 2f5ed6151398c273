//! Random schedules for property tests and `sluice fuzz`.

use super::model::{Action, At, FaultEvent, FaultSchedule, ScaleTo};
use super::{RANDOM_MAX_DELAY_US, RANDOM_MAX_INSTANCES};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sluice_runtime::Chain;

impl FaultSchedule {
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
