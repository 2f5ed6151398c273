//! What the root makes of the packets an instance still had when it failed or was retired
//! (CHC R5). A failed instance's copies are lost: the root's replay towards its replacement
//! redoes them, except those whose log entries went with a root or store crash (outside the
//! guarantee, counted) and the copies of *another* instance's replay it was passing on, which
//! the root sends again. A retired instance's copies are done, except those replay copies,
//! which go on through an instance that stays.

use crate::gate::Decided;
use crate::root::Root;
use sluice_packet::{InstanceId, Meta, Packet};

/// The root's account of an instance failure.
#[derive(Debug, Clone, Default)]
pub struct Loss {
    /// Packets lost for good: their log entries were lost in a root or store crash and the
    /// vertex never processed them (an NF failing with the holder of its packets' log).
    pub beyond_replay: usize,
    /// Copies of replays towards other instances that the failed one was passing on, sent
    /// again: (input packet number, copy). The driver delivers them like the root's replay.
    pub resend: Vec<(u64, Packet)>,
}

/// Instance `failed` of a vertex that has processed `decided` failed with `lost` queued or held.
/// Every copy counts as lost (its updates are redone by the replay, so its XOR vector is not
/// folded in); the returned [`Loss`] says what cannot be redone and what to send again.
/// `lost` holds the copies, or only their metadata (a driver that recycled the buffers).
pub fn instance_failed<M: AsRef<Meta>>(root: &mut Root, decided: &Decided, failed: InstanceId, lost: &[M]) -> Loss {
    for p in lost {
        root.copy_lost(p);
    }
    let meta = |p: &M| *p.as_ref();
    let beyond_replay =
        lost.iter().map(meta).filter(|m| root.lost_with_log(m.clock) && !decided.contains(m.clock)).count();
    let resend = lost
        .iter()
        .map(meta)
        .filter_map(|m| m.replay_target().map(|t| (m.clock, t)))
        .filter(|(_, t)| *t != failed)
        .filter_map(|(c, t)| root.replay_clock_to(c, t))
        .collect();
    Loss { beyond_replay, resend }
}

/// Instance `retired` left service with `leftover` still queued or held (the driver flushed its
/// updates first). Its own copies are done; the returned replay copies aimed at another
/// instance were only passing through it and go on through an instance of the vertex that stays.
pub fn instance_retired(root: &mut Root, retired: InstanceId, leftover: Vec<Packet>) -> Vec<Packet> {
    let (passing, own): (Vec<Packet>, Vec<Packet>) =
        leftover.into_iter().partition(|p| p.meta.replay_target().is_some_and(|t| t != retired));
    for p in &own {
        root.copy_finished(p);
    }
    passing
}

#[cfg(test)]
mod tests;
