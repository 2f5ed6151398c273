//! Fault-tolerance bookkeeping of a threaded run (`RunConfig::fault_tolerance`): the root
//! thread drives the CHC core's [`Root`] (packet log, reference counts, XOR check, delete) and
//! [`Egress`] (duplicate suppression where packets leave the chain). Workers never touch them:
//! they describe what happened to copies and which updates the store acknowledged in [`Note`]s,
//! sent in batches over one queue that the root thread drains.
//!
//! Ordering: a worker that makes a mirror copy sends its [`Note::Sent`] before the copy itself
//! can reach another thread (see `Outgoing::flush_one`), and all notes about one root's clocks
//! share that root's linearizable queue, so a root never sees a copy finish before it heard the
//! copy was made. Commits and finished copies fold into the XOR vector in any order.
//!
//! With several roots (`RunConfig::roots`) each root thread keeps its own log; the egress, where
//! copies leave the chain, is one for the run (the sink is one), shared under a lock that the
//! sink takes once per batch and a root once per batch of deletes.

use crate::report::{FaultToleranceReport, RootCrashReport};
use crate::root_log::{RootLogError, StoreLog};
use sluice_chc::egress::Egress;
use sluice_chc::failover::instance_failed;
use sluice_chc::gate::Decided;
use sluice_chc::root::{Admission, Root, RootConfig};
use sluice_packet::{Clock, InstanceId, Meta, Packet};
use sluice_store::Backend;
use std::sync::{Arc, Mutex, PoisonError};

/// What a worker tells the root about copies and commits.
#[derive(Debug, Clone, Copy)]
pub(super) enum Note {
    /// A mirror copy was made (its XOR vector starts empty).
    Sent(Meta),
    /// A copy is done inside the chain: dropped, consumed off-path, or without a route.
    Finished(Meta),
    /// The store acknowledged the updates an instance made for a clock: their XOR value.
    Commit(Clock, u64),
    /// A replay copy reached its target, which processed it (a replacement's recovery waits
    /// for its replay's copies to reach it).
    Reached(Meta),
    /// A copy left the chain at the egress (the first of its clock).
    Left(Meta),
}

impl Note {
    /// The clock the note is about: the root whose log hears it.
    pub(super) fn clock(&self) -> Clock {
        match self {
            Note::Sent(m) | Note::Finished(m) | Note::Reached(m) | Note::Left(m) => m.clock,
            Note::Commit(c, _) => *c,
        }
    }
}

/// A copy reaches the chain's output: the note for the log of the root that stamped it — it
/// left (the first copy of its clock, which goes on) or it is a duplicate, to drop.
pub(super) fn at_egress(egress: &mut Egress, meta: &Meta) -> Note {
    if egress.pass(meta.clock) {
        Note::Left(*meta)
    } else {
        Note::Finished(*meta)
    }
}

/// The root thread's part: the log, the egress, and what they did.
pub(super) struct RootLog {
    root: Root,
    /// Which root this is (its clocks carry it).
    id: u8,
    capacity: usize,
    commits: u64,
    /// No clock below this sequence number is logged (one root: sequence numbers follow each
    /// other, and entries mostly go in order, so it moves up a step at a time).
    oldest: u64,
    /// With `RunConfig::log_in_store`: the log's copy in the store, which a new root reads back.
    store: Option<(StoreLog, Arc<dyn Backend>)>,
}

impl RootLog {
    /// Root `id`'s log (of `roots`), holding at most `capacity` packets (its share of the run's
    /// window: admission waits for room).
    pub(super) fn new(capacity: usize, id: u8, roots: u8) -> RootLog {
        let cfg = RootConfig {
            log_capacity: capacity,
            roots,
            xor_check: true,
            // A long-running chain keeps only what its log holds.
            remember_inputs: false,
            ..RootConfig::default()
        };
        RootLog { root: Root::new(cfg), id, capacity, commits: 0, oldest: 1, store: None }
    }

    /// Keeps a copy of the log in `backend`'s store: every admitted packet is written there,
    /// and acknowledged, before it enters the chain ([`Self::persist`]).
    pub(super) fn in_store(mut self, backend: Arc<dyn Backend>) -> Result<RootLog, RootLogError> {
        self.store = Some((StoreLog::connect(&backend)?, backend));
        Ok(self)
    }

    /// With the log in the store: writes `packets` (input number, packet; just admitted) and
    /// waits for the store to have them.
    pub(super) fn persist<'a>(
        &mut self,
        packets: impl IntoIterator<Item = (u64, &'a Packet)>,
    ) -> Result<(), RootLogError> {
        match &mut self.store {
            Some((sl, _)) => sl.write_all(packets),
            None => Ok(()),
        }
    }

    /// The root fails and a new one takes over (CHC's root recovery): the clock resumes past
    /// anything the old root may have stamped. With the log at the root its entries are lost
    /// (their copies in flight finish unlogged and can no longer be replayed); with the log
    /// in the store the new root reads it back from there.
    /// `(at_packet, at_ms)` says when, for the report.
    pub(super) fn crash(&mut self, (at_packet, at_ms): (u64, f64)) -> Result<RootCrashReport, RootLogError> {
        let lost = self.store.is_none();
        let crash = self.root.crash(self.id, lost).map_err(|e| RootLogError::Store(format!("{e:?}")))?;
        tracing::info!(
            root = self.id,
            at_packet,
            resumed_at = crash.resumed,
            lost,
            "a root failed; a new one took over"
        );
        let mut report = RootCrashReport {
            at_packet,
            at_ms,
            resumed_at: crash.resumed,
            logged: crash.logged as u64,
            lost: crash.lost,
            ..RootCrashReport::default()
        };
        let Some((sl, backend)) = &mut self.store else { return Ok(report) };
        // Only this root's entries: the store holds every root's log.
        let id = self.id;
        report.read_back = sl.read_back(backend, &mut self.root, |c| c.root() == id)?.kept;
        Ok(report)
    }

    /// With the log in the store: the store was rebuilt from its checkpoint, which lacks the
    /// entries written since; this root still has them and writes them back (a later root
    /// crash reads a whole log back). How many.
    pub(super) fn store_rebuilt(&mut self) -> Result<u64, RootLogError> {
        let Some((sl, backend)) = &mut self.store else { return Ok(0) };
        sl.reconnect(backend)?;
        let id = self.id;
        sl.write_back(backend, &self.root, |c| c.root() == id)
    }

    /// Entries the log can still take.
    pub(super) fn room(&self) -> usize {
        self.capacity.saturating_sub(self.root.logged())
    }

    /// Stamps and logs `pkt` (input packet number `input`); its clock, or `None` if the log is
    /// full.
    pub(super) fn admit(&mut self, input: u64, pkt: &mut Packet, now_ns: u64) -> Option<Clock> {
        match self.root.admit(input, pkt, now_ns) {
            Admission::Admitted { clock, .. } => Some(clock),
            Admission::LogFull => None,
        }
    }

    /// Applies what a worker (or the root thread itself) reported.
    pub(super) fn note(&mut self, note: &Note) {
        match note {
            Note::Sent(meta) => self.root.copy_sent(meta),
            Note::Finished(meta) => self.root.copy_finished(meta),
            Note::Commit(clock, xor) => {
                self.commits += 1;
                self.root.commit(*clock, *xor);
            }
            Note::Reached(meta) => self.root.replay_reached(meta),
            Note::Left(meta) => self.root.copy_left(meta),
        }
    }

    /// Instance `failed` lost these copies (the replay towards its replacement redoes them);
    /// returns fresh copies of the replays towards *other* instances it was passing on, to
    /// send again (CHC R5, [`instance_failed`]), and how many copies are lost for good: their
    /// entries died with a root that kept its log (CHC cannot recover a root and an NF
    /// failing together unless the log is in the store).
    pub(super) fn instance_failed(&mut self, failed: InstanceId, lost: &[Meta]) -> (Vec<Packet>, usize) {
        // A threaded run does not track which clocks each vertex decided: a lost copy of an
        // unlogged clock counts as beyond replay.
        let loss = instance_failed(&mut self.root, &Decided::default(), failed, lost);
        (loss.resend.into_iter().map(|(_, p)| p).collect(), loss.beyond_replay)
    }

    /// Copies of every logged packet aimed at `target` (a replacement), in clock order, each
    /// counted as a copy on its way.
    pub(super) fn replay_to(&mut self, target: InstanceId) -> Vec<Packet> {
        self.root.replay_to(target).into_iter().map(|(_, p)| p).collect()
    }

    /// The earliest copy (clock, entry time) of the replay towards `target` still on its way
    /// to it; `None` once the replay has drained.
    pub(super) fn replay_frontier(&self, target: InstanceId) -> Option<(Clock, u64)> {
        self.root.replay_frontier(target)
    }

    /// The clocks still logged.
    pub(super) fn logged_clocks(&self) -> impl Iterator<Item = Clock> + '_ {
        self.root.log_entries().map(|(c, _, _)| c)
    }

    /// Whether `clock` is still logged (a replay may still need its slot in the in-flight ring).
    pub(super) fn is_logged(&self, clock: Clock) -> bool {
        self.root.is_logged(clock)
    }

    /// Forgets the deleted entries at the egress (no copy of them can come again); the oldest
    /// clock still logged, below which the store's per-clock logs can go.
    pub(super) fn sync_deletes(&mut self, egress: &Mutex<Egress>) -> Option<Clock> {
        if !self.root.has_deleted() {
            return self.oldest_logged();
        }
        // A root that lost entries with its log may still see copies of clocks below its
        // oldest entry: the egress forgets deleted clocks one by one then.
        let each = self.root.lost_any_with_log();
        let mut egress = egress.lock().unwrap_or_else(PoisonError::into_inner);
        let mut store = self.store.as_mut().map(|(sl, _)| sl);
        self.root.drain_deleted(|c| {
            if each {
                egress.forget(c);
            }
            // Sent with the next write: a delete lost with the root is found again by the next.
            if let Some(sl) = store.as_mut() {
                sl.delete(c);
            }
        });
        let oldest = self.oldest_logged();
        if !each {
            // Everything of this root's below its oldest entry at once, rather than each
            // deleted clock (a clock-set update a packet): a clock deleted before older ones
            // is remembered until they go, which only costs its bit meanwhile.
            let next = || Clock::new(self.id, self.root.last_clock().seq().saturating_add(1));
            egress.forget_below(oldest.unwrap_or_else(next));
        }
        oldest
    }

    /// The oldest clock of this root still logged (`None`: none is).
    fn oldest_logged(&mut self) -> Option<Clock> {
        let last = self.root.last_clock().seq();
        while self.oldest <= last && !self.root.is_logged(Clock::new(self.id, self.oldest)) {
            self.oldest += 1;
        }
        (self.oldest <= last).then(|| Clock::new(self.id, self.oldest))
    }

    /// Packets in the log.
    pub(super) fn logged(&self) -> usize {
        self.root.logged()
    }

    /// What the log did over the run.
    pub(super) fn report(&self) -> FaultToleranceReport {
        let s = self.root.stats();
        FaultToleranceReport {
            logged: s.admitted,
            deleted: s.deleted,
            left_in_log: self.root.logged() as u64,
            log_peak: s.log_peak,
            commits: self.commits,
            // The egress's, which the run adds.
            duplicates_suppressed: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_packet::Meta;

    /// The sink's part: the egress decides, the log hears.
    fn leave(log: &mut RootLog, egress: &Mutex<Egress>, meta: &Meta) -> bool {
        let note = at_egress(&mut egress.lock().unwrap_or_else(PoisonError::into_inner), meta);
        log.note(&note);
        matches!(note, Note::Left(_))
    }

    fn packet() -> Packet {
        Packet::from_slice(&[0u8; 60], Meta::default())
    }

    #[test]
    fn an_entry_waits_for_its_copies_and_its_commits() {
        let mut log = RootLog::new(4, 0, 1);
        let egress = Mutex::new(Egress::default());
        let mut p = packet();
        let clock = log.admit(1, &mut p, 0).expect("room");
        assert_eq!(log.room(), 3);
        // A mirror copy, then the original leaves carrying an update's value.
        let mut copy = p.meta;
        copy.xor = 0;
        log.note(&Note::Sent(copy));
        p.meta.xor = 0x0001_0002;
        assert!(leave(&mut log, &egress, &p.meta));
        log.note(&Note::Finished(copy));
        assert_eq!(log.sync_deletes(&egress), Some(clock), "the update is not committed yet");
        log.note(&Note::Commit(clock, 0x0001_0002));
        assert_eq!(log.sync_deletes(&egress), None);
        let r = log.report();
        assert_eq!((r.logged, r.deleted, r.left_in_log, r.commits), (1, 1, 0, 1));
    }

    #[test]
    fn a_second_copy_of_a_clock_at_the_egress_is_suppressed_until_the_entry_is_deleted() {
        let mut log = RootLog::new(4, 0, 1);
        let egress = Mutex::new(Egress::default());
        let mut p = packet();
        let clock = log.admit(1, &mut p, 0).expect("room");
        let mut again = p.meta;
        again.xor = 0;
        log.note(&Note::Sent(again));
        assert!(leave(&mut log, &egress, &p.meta));
        assert!(!leave(&mut log, &egress, &again), "a duplicate of a clock that left");
        assert_eq!(egress.lock().map(|e| e.dropped()).unwrap_or(0), 1);
        assert_eq!(log.sync_deletes(&egress), None, "both copies are done");
        assert!(leave(&mut log, &egress, &Meta { clock, ..Meta::default() }), "forgotten once deleted");
    }

    #[test]
    fn a_full_log_refuses_admission() {
        let mut log = RootLog::new(1, 0, 1);
        assert!(log.admit(1, &mut packet(), 0).is_some());
        assert_eq!(log.room(), 0);
        assert!(log.admit(2, &mut packet(), 0).is_none());
    }
}
