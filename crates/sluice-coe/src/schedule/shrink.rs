//! Simpler variants of a run, for shrinking a failing one to a minimal regression case.
//! [`shrink_candidates`] only proposes; the caller runs each candidate (`verify`) and keeps
//! the first that still fails the same way, then asks again (crate::fuzz::shrink does).

use super::model::{Action, At, FaultSchedule};

impl FaultSchedule {
    /// The schedule with every point as an absolute packet count for a trace of
    /// `total_packets` packets (so that cutting the trace does not move the events), in trace
    /// order.
    pub fn absolute(&self, total_packets: u64) -> FaultSchedule {
        let mut s = self.clone();
        s.events = self
            .resolve(total_packets)
            .into_iter()
            .map(|(count, e)| {
                let mut e = e.clone();
                e.at = At::Packet(count);
                e
            })
            .collect();
        s
    }

    /// The last packet count at which an event happens (0 without events).
    fn last_point(&self) -> u64 {
        self.events.iter().filter_map(|e| if let At::Packet(n) = e.at { Some(n) } else { None }).max().unwrap_or(0)
    }
}

/// Simpler variants of `s` (absolute points, see [`FaultSchedule::absolute`]) over a trace of
/// `total_packets` packets, the most promising first: a shorter trace (`run.limit`), one event
/// fewer, fewer run options (defaults instead), an event at an earlier point or at the point
/// of the one before it, an instance index of 0. Some may be invalid for the chain or
/// unrecoverable; the caller checks.
pub fn shrink_candidates(s: &FaultSchedule, total_packets: u64) -> Vec<FaultSchedule> {
    let mut out = Vec::new();
    // A shorter trace makes every later run cheaper: try it first.
    let last = s.last_point();
    let total = s.run.limit.map_or(total_packets, |l| l.min(total_packets));
    let mut limits: Vec<u64> = [last + 64, last + 1_000, last + (total.saturating_sub(last)) / 2]
        .into_iter()
        .filter(|&l| l >= last.max(1) && l < total)
        .collect();
    limits.dedup();
    for l in limits {
        let mut c = s.clone();
        c.run.limit = Some(l);
        out.push(c);
    }
    for i in (0..s.events.len()).rev() {
        let mut c = s.clone();
        c.events.remove(i);
        out.push(c);
    }
    out.extend(fewer_options(s));
    out.extend(earlier_points(s));
    for (i, e) in s.events.iter().enumerate() {
        let mut a = e.action.clone();
        match &mut a {
            Action::Crash { instance, .. } | Action::Slow { instance, .. } | Action::Clone { instance, .. }
                if *instance > 0 =>
            {
                *instance = 0
            }
            Action::CrashRoot { root } if *root > 0 => *root = 0,
            Action::Move { flows: Some(n), .. } if *n > 1 => *n = (*n / 4).max(1),
            Action::Slow { delay_us: (lo, hi), .. } if *hi > 1 => *hi = (*hi / 2).max(*lo),
            _ => continue,
        }
        let mut c = s.clone();
        if let Some(ev) = c.events.get_mut(i) {
            ev.action = a;
        }
        out.push(c);
    }
    for i in 0..s.policies.len() {
        let mut c = s.clone();
        c.policies.remove(i);
        out.push(c);
    }
    out.retain(|c| c != s);
    out
}

/// The run options one at a time back to their defaults, and fewer roots.
fn fewer_options(s: &FaultSchedule) -> Vec<FaultSchedule> {
    let mut out = Vec::new();
    let r = &s.run;
    let mut push = |f: &dyn Fn(&mut FaultSchedule)| {
        let mut c = s.clone();
        f(&mut c);
        out.push(c);
    };
    if r.roots.is_some_and(|n| n > 1) {
        push(&|c| c.run.roots = c.run.roots.map(|n| n - 1));
    }
    if r.async_delete == Some(true) {
        push(&|c| c.run.async_delete = Some(false));
    }
    if r.log == Some(crate::engine::LogPlace::Store) {
        push(&|c| c.run.log = Some(crate::engine::LogPlace::Root));
    }
    if r.checkpoint_every.is_some_and(|n| n != 10_000) {
        push(&|c| c.run.checkpoint_every = Some(10_000));
    }
    out
}

/// Each event moved to the point of the event before it, or halfway there.
fn earlier_points(s: &FaultSchedule) -> Vec<FaultSchedule> {
    let mut out = Vec::new();
    let mut prev = 1;
    for (i, e) in s.events.iter().enumerate() {
        let At::Packet(n) = e.at else { continue };
        for target in [prev, prev + (n - prev.min(n)) / 2] {
            if target < n && target >= 1 {
                let mut c = s.clone();
                if let Some(ev) = c.events.get_mut(i) {
                    ev.at = At::Packet(target);
                }
                out.push(c);
            }
        }
        prev = n;
    }
    out
}
