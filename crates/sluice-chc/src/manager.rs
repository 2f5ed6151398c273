//! Vertex managers (CHC §5.5): aggregate per-instance statistics, apply the operator's
//! policies (scale on queue depth, clone stragglers), and judge clone trials.

use crate::NodeId;

/// A vertex's policy, as the manager applies it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ManagerPolicy {
    /// Never more instances than this.
    pub max_instances: usize,
    /// Never fewer (at least 1).
    pub min_instances: usize,
    /// Scale out when the vertex's queues hold more than this many packets.
    pub scale_out_queue_above: Option<u64>,
    /// Scale in when they hold fewer.
    pub scale_in_queue_below: Option<u64>,
    /// Clone an instance whose time per packet exceeds its peers' median by this percentage.
    pub straggler_slower_by_percent: Option<f64>,
}

/// One instance's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct InstanceLoad {
    /// The instance.
    pub node: NodeId,
    /// Packets queued (and held).
    pub backlog: u64,
    /// Time spent per packet processed, ns.
    pub ns_per_packet: f64,
    /// A clone of it is already on trial.
    pub cloning: bool,
}

/// What a vertex manager decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Scale the vertex to this many instances.
    ScaleTo(usize),
    /// Start a clone trial for this straggler.
    Clone(NodeId),
}

/// Evaluates `policy` for a vertex whose members have the loads `members` (in slot order).
/// `moving`: a flow move is in progress, so no scaling now.
pub fn evaluate(policy: &ManagerPolicy, members: &[InstanceLoad], moving: bool) -> Vec<Decision> {
    let mut out = Vec::new();
    let n = members.len();
    let queue: u64 = members.iter().map(|m| m.backlog).sum();
    let min = policy.min_instances.max(1);
    let over = policy.scale_out_queue_above.is_some_and(|q| queue > q);
    let under = policy.scale_in_queue_below.is_some_and(|q| queue < q);
    if over && n < policy.max_instances && !moving {
        out.push(Decision::ScaleTo(n + 1));
    } else if under && n > min && !moving {
        out.push(Decision::ScaleTo(n - 1));
    }
    if let Some(theta) = policy.straggler_slower_by_percent {
        if n >= 2 {
            for m in members {
                // Compared with the median of its peers.
                let mut peers: Vec<f64> =
                    members.iter().filter(|x| x.node != m.node).map(|x| x.ns_per_packet).collect();
                peers.sort_by(f64::total_cmp);
                let median = peers.get(peers.len() / 2).copied().unwrap_or(m.ns_per_packet);
                if m.ns_per_packet > median * (1.0 + theta / 100.0) && !m.cloning {
                    out.push(Decision::Clone(m.node));
                }
            }
        }
    }
    out
}

/// A clone trial: a straggler and its clone both serve the straggler's flows until `until`
/// input packets, then the slower one is retired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trial {
    /// The instance found slow.
    pub straggler: NodeId,
    /// Its clone.
    pub clone: NodeId,
    /// The input packet count at which the trial ends.
    pub until: u64,
}

/// The clone trials in progress.
#[derive(Debug, Clone, Default)]
pub struct Trials {
    trials: Vec<Trial>,
}

impl Trials {
    /// Starts a trial.
    pub fn start(&mut self, t: Trial) {
        self.trials.push(t);
    }

    /// The trials that end at input packet count `count`, removed.
    pub fn due(&mut self, count: u64) -> Vec<Trial> {
        let (due, rest) = self.trials.iter().partition(|t| t.until <= count);
        self.trials = rest;
        due
    }

    /// A replacement `new` takes a failed straggler's (`old`) place in its trial.
    pub fn replace(&mut self, old: NodeId, new: NodeId) {
        for t in &mut self.trials {
            if t.straggler == old {
                t.straggler = new;
            }
        }
    }
}

/// Whether the clone is kept at the end of its trial: lower time per packet wins, a smaller
/// backlog breaks ties (the straggler is kept otherwise).
pub fn keep_clone(straggler: &InstanceLoad, clone: &InstanceLoad) -> bool {
    clone.ns_per_packet < straggler.ns_per_packet
        || (clone.ns_per_packet == straggler.ns_per_packet && clone.backlog < straggler.backlog)
}

#[cfg(test)]
mod tests;
