//! The timers on a vertex's shared keys while the vertex has, or may get, several instances
//! in one process: one table for all of them (docs/decisions.md "Timers on shared keys in
//! threads"), and which of an instance's timers live there.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// One vertex's table of timers on shared keys, and the earliest deadline in it, readable
/// without the lock: every packet of every instance asks whether a timer is due, and almost
/// always none is.
#[derive(Default)]
pub struct VertexTimerTable {
    timers: Mutex<Timers>,
    /// No timer in the table is due before this packet time (0 until first looked at).
    earliest: AtomicU64,
}

impl VertexTimerTable {
    /// Runs `f` on the table, under its lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut Timers) -> R) -> R {
        // A poisoned lock only means another worker panicked; the table itself is whole.
        let mut t = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        let r = f(&mut t);
        self.earliest.store(t.next_deadline().unwrap_or(u64::MAX), Ordering::Release);
        r
    }

    /// Whether a timer of the table may be due at packet time `now_ns`. A timer another
    /// instance arms meanwhile is seen at the next look, as it would be had that instance
    /// taken the lock a moment later.
    pub fn may_be_due(&self, now_ns: u64) -> bool {
        self.earliest.load(Ordering::Acquire) <= now_ns
    }
}

impl StoreClient {
    /// From now on the timers on this instance's shared keys live in `table`, one table for
    /// every instance of the vertex (those it armed so far move there). A timer on a key
    /// several instances share must fire before the first packet past its deadline, whichever
    /// instance that packet reaches — the logical NF fires it there — not when the instance
    /// that armed it next sees such a packet; whoever gets there first takes it from the table
    /// and fires it, once.
    pub fn share_vertex_timers(&mut self, table: VertexTimers) {
        for (o, k, d) in self.timers.armed() {
            if self.is_shared_object(o) {
                self.timers.cancel(o, &k);
                table.with(|t| t.set(o, &k, d));
            }
        }
        self.vertex_timers = Some(table);
    }

    /// Adds the due timers of the vertex's table that `fire` lets fire here to `fired` (this
    /// instance's own due timers: timer, deadline, `false`), marked `true`, keeping the
    /// earliest `max` of both in deadline order (as one wheel would fire them) and putting the
    /// others back where they came from.
    pub(super) fn take_vertex_timers(
        &mut self,
        now_ns: u64,
        max: usize,
        fired: &mut Vec<(TimerFired, u64, bool)>,
        fire: &dyn Fn(ObjectId, &StateKey) -> bool,
    ) {
        let Some(table) = self.vertex_timers.clone().filter(|t| t.may_be_due(now_ns)) else { return };
        let own = &mut self.timers;
        table.with(|t| {
            let (mut shared, mut deadlines) = (Vec::new(), Vec::new());
            t.expired_where(now_ns, max, &mut shared, &mut deadlines, fire);
            if shared.is_empty() {
                return;
            }
            fired.extend(shared.into_iter().zip(deadlines).map(|(f, d)| (f, d, true)));
            // Stable: on equal deadlines the instance's own go first.
            fired.sort_by_key(|(_, d, _)| *d);
            for (f, d, from_table) in fired.drain(max.min(fired.len())..) {
                if from_table {
                    t.set(f.object, &f.key, d);
                } else {
                    own.set(f.object, &f.key, d);
                }
            }
        });
    }

    /// Runs `f` on the timers `obj`'s timers live in: the vertex's table for a shared object
    /// while one is attached, else this instance's own.
    pub(super) fn timers_of_object<R>(&mut self, obj: ObjectId, f: impl FnOnce(&mut Timers) -> R) -> R {
        let shared = self.is_shared_object(obj);
        match self.vertex_timers.as_ref().filter(|_| shared) {
            Some(t) => t.with(f),
            None => f(&mut self.timers),
        }
    }

    /// Whether `obj`'s timers are in the vertex's table.
    pub(super) fn in_vertex_table(&self, obj: ObjectId) -> bool {
        self.vertex_timers.is_some() && self.is_shared_object(obj)
    }

    /// Whether `obj` is scoped wider than a flow.
    pub(super) fn is_shared_object(&self, obj: ObjectId) -> bool {
        self.shared_objects.get(usize::from(obj.0)).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_tells_without_its_lock_whether_a_timer_may_be_due() {
        let t = VertexTimerTable::default();
        assert!(t.may_be_due(0), "never looked at: maybe");
        t.with(|_| ());
        assert!(!t.may_be_due(u64::MAX - 1), "empty");
        t.with(|x| x.set(ObjectId(0), &StateKey::Id(1), 500));
        assert!(!t.may_be_due(499) && t.may_be_due(500));
        t.with(|x| x.set(ObjectId(0), &StateKey::Id(2), 300));
        assert!(t.may_be_due(300), "an earlier timer armed by another instance is seen");
        let mut fired = Vec::new();
        t.with(|x| x.expired(400, 8, &mut fired));
        assert_eq!(fired.len(), 1);
        assert!(!t.may_be_due(499) && t.may_be_due(500), "the next deadline after one fired");
    }
}
