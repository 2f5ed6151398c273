//! The timers on a vertex's shared keys while the vertex has, or may get, several instances
//! in one process: one table for all of them (docs/decisions.md "Timers on shared keys in
//! threads"), and which of an instance's timers live there.

use super::*;

impl StoreClient {
    /// From now on the timers on this instance's shared keys live in `table`, one table for
    /// every instance of the vertex (those it armed so far move there). A timer on a key
    /// several instances share must fire before the first packet past its deadline, whichever
    /// instance that packet reaches — the logical NF fires it there — not when the instance
    /// that armed it next sees such a packet; whoever gets there first takes it from the table
    /// and fires it, once.
    pub fn share_vertex_timers(&mut self, table: VertexTimers) {
        let mut t = table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (o, k, d) in self.timers.armed() {
            if self.is_shared_object(o) {
                self.timers.cancel(o, &k);
                t.set(o, &k, d);
            }
        }
        drop(t);
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
        let Some(table) = self.vertex_timers.clone() else { return };
        let mut t = table.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
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
                self.timers.set(f.object, &f.key, d);
            }
        }
    }

    /// Runs `f` on the timers `obj`'s timers live in: the vertex's table for a shared object
    /// while one is attached, else this instance's own.
    pub(super) fn timers_of_object<R>(&mut self, obj: ObjectId, f: impl FnOnce(&mut Timers) -> R) -> R {
        let shared = self.is_shared_object(obj);
        match self.vertex_timers.as_ref().filter(|_| shared) {
            // A poisoned lock only means another worker panicked; the table itself is whole.
            Some(t) => f(&mut t.lock().unwrap_or_else(std::sync::PoisonError::into_inner)),
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
