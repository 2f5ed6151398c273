//! A client's non-blocking updates: counters' increments collected per batch (one request per
//! counter, summed or with every increment's tag), and any other update tagged and queued for
//! the store, or run where the value is cached or written through.

use super::{Mode, StoreClient, Strategy, MAX_INCREMENT_ROOM};
use crate::wire::{OpTag, StoreKey, StoreOp};
use sluice_state::{ObjectId, StateError, StateHandle, StateKey, StateOp};

/// Whether a client configured so numbers a packet's updates for anything: tags for the store
/// (duplicates to tell apart), the write-ahead log, commits in the packet's XOR, or a replay's
/// history. A client of a plain run does none of these, and a packet's start sets only what it
/// reads.
pub(super) fn numbers_updates(cfg: &super::ClientConfig) -> bool {
    cfg.dedupe || cfg.commits || cfg.write_through || cfg.wal_capacity > 0
}

impl StoreClient {
    /// Whether an increment of `obj` is collected for the batch as it comes
    /// ([`StoreClient::collect_increment`]): a non-blocking update of a value this client does
    /// not cache now, outside a replay (which reads and writes at the store as of its clock).
    #[inline]
    pub(super) fn collects_increments(&self, obj: ObjectId) -> bool {
        if self.cfg.mode != Mode::Async || self.replaying {
            return false;
        }
        let idx = usize::from(obj.0);
        match self.strategies.get(idx) {
            Some(Strategy::Remote) => true,
            Some(Strategy::SharedOften | Strategy::SharedWriteThrough) => {
                !self.exclusive.get(idx).copied().unwrap_or(false)
            }
            // A cached copy to forget first, or a value cached or written through here.
            Some(Strategy::Callbacks | Strategy::Owned | Strategy::WriteThrough) | None => false,
        }
    }

    /// Whether a packet's updates are numbered for anything ([`numbers_updates`]).
    #[inline]
    pub(super) fn numbers_updates(&self) -> bool {
        self.numbers
    }

    /// Numbers a non-blocking update `op` of `obj`'s `key` (its tag), keeps it in the
    /// write-ahead log where there is one, and folds it into the packet's XOR vector.
    #[inline]
    pub(super) fn tag_update(&mut self, obj: ObjectId, key: &StateKey, op: impl FnOnce() -> StateOp) -> OpTag {
        let tag = self.next_tag();
        if self.cfg.wal_capacity > 0 {
            // (Made only here: most runs keep no such log.)
            self.log_update(tag, self.key(obj, key), &op());
        }
        self.note_update(obj);
        tag
    }

    /// Collects a tagged increment of `obj`'s `key` for the batch: without tags (no duplicates
    /// to tell apart) into the counter's sum, else into its list of increments, one request
    /// per counter either way. The key (up to 40 bytes) is copied only for a counter's first
    /// increment of a batch.
    #[inline]
    pub(super) fn collect_increment(&mut self, obj: ObjectId, key: &StateKey, (tag, delta): (OpTag, i64)) {
        let same = |k: &StoreKey| k.object == obj.0 && k.key == *key;
        if !self.cfg.dedupe {
            if let Some((_, sum)) = self.sums.iter_mut().find(|(k, _)| same(k)) {
                *sum = sum.wrapping_add(delta);
                return;
            }
        } else if let Some((_, v)) = self.increments.iter_mut().find(|(k, _)| same(k)) {
            v.push((tag, delta));
            return;
        }
        self.first_increment(obj, key, (tag, delta));
    }

    /// An increment [`StoreClient::collects_increments`] does not collect (out of line: the
    /// operation it builds would make every increment's frame larger).
    #[cold]
    #[inline(never)]
    pub(super) fn incr_nb_other(&mut self, obj: ObjectId, key: &StateKey, delta: i64) -> Result<(), StateError> {
        self.exec_nb_other(obj, key, StateOp::Incr(delta))
    }

    /// A counter's first increment of a batch: a place for its sum or its list.
    #[cold]
    #[inline(never)]
    fn first_increment(&mut self, obj: ObjectId, key: &StateKey, (tag, delta): (OpTag, i64)) {
        let skey = self.key(obj, key);
        if !self.cfg.dedupe {
            self.sums.push((skey, delta));
            return;
        }
        // Sized for a batch's increments of one counter, so it rarely grows.
        let mut v = Vec::with_capacity(self.increment_room);
        v.push((tag, delta));
        self.increments.push((skey, v));
    }

    /// A non-blocking update as [`StateHandle::exec_nb`] takes it, but for an increment
    /// [`StoreClient::collects_increments`] collects: run here where the value is cached or
    /// written through (or a replay runs), else tagged and queued for the store.
    #[inline(never)]
    pub(super) fn exec_nb_other(&mut self, obj: ObjectId, key: &StateKey, op: StateOp) -> Result<(), StateError> {
        // (A shared write-through object while exclusive is covered by `caches_now`.)
        let write_through = self.strategies.get(usize::from(obj.0)) == Some(&Strategy::WriteThrough);
        if self.caches_now(obj) || self.cfg.mode != Mode::Async || write_through || self.replaying {
            return self.exec(obj, key, op).map(|_| ());
        }
        let idx = usize::from(obj.0);
        if self.strategies.get(idx) == Some(&Strategy::Callbacks) {
            if let Some(c) = self.caches.get_mut(idx) {
                c.remove(key);
            }
        }
        let tag = self.tag_update(obj, key, || op.clone());
        if let StateOp::Incr(d) = op {
            self.collect_increment(obj, key, (tag, d));
            return Ok(());
        }
        let skey = self.key(obj, key);
        self.queue_nb(skey, StoreOp::State(op), Some(tag));
        Ok(())
    }

    /// Turns collected increments into requests (for one value, or all).
    pub(super) fn emit_increments(&mut self, only: Option<&StoreKey>) {
        let wanted = |k: &StoreKey| only.is_none_or(|o| o == k);
        // Taken out while requests are made (they number themselves), then put back with
        // their buffers.
        let mut sums = std::mem::take(&mut self.sums);
        for (key, sum) in sums.extract_if(.., |(k, _)| wanted(k)) {
            let r = self.request(key, StoreOp::State(StateOp::Incr(sum)), None, false);
            self.pending.push(r);
        }
        self.sums = sums;
        let mut increments = std::mem::take(&mut self.increments);
        for (key, incrs) in increments.extract_if(.., |(k, _)| wanted(k)) {
            self.increment_room = self.increment_room.max(incrs.len()).min(MAX_INCREMENT_ROOM);
            let r = self.request(key, StoreOp::IncrMany(incrs), None, false);
            self.pending.push(r);
        }
        self.increments = increments;
    }
}
