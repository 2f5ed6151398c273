//! A cached value at a store client, and what its next flush sends.

use sluice_state::{StateOp, Value};

/// A value this client caches (`None`: known absent), whether it changed since the last
/// flush, and for lists the operations that changed it.
#[derive(Debug, Clone)]
pub(super) struct Cached {
    pub(super) value: Option<Value>,
    pub(super) dirty: bool,
    /// For lists: the pushes and pops since the last flush, so a flush sends those rather than
    /// the whole list (a list may hold tens of thousands of entries). `None` while dirty
    /// means the whole value must be written. Boxed: few values are lists, and every entry
    /// of a cache of thousands of flows is smaller without an empty list in line.
    #[allow(clippy::box_collection)]
    pub(super) list_ops: Option<Box<Vec<StateOp>>>,
}

impl Cached {
    pub(super) fn new(value: Option<Value>) -> Cached {
        Cached { value, dirty: false, list_ops: None }
    }

    /// A copy of the value for a read: an integer (most cached values: a connection's port and
    /// flags) in line, without a call.
    #[inline]
    pub(super) fn read(&self) -> Option<Value> {
        match &self.value {
            Some(Value::Int(i)) => Some(Value::Int(*i)),
            v => v.clone(),
        }
    }

    /// Records an update for the next flush: `list_op` is the update if it was a push or a
    /// pop (what a list's flush sends), `None` for any other update (the whole value is written).
    pub(super) fn record(&mut self, list_op: Option<StateOp>) -> bool {
        let was_dirty = self.dirty;
        let is_list = matches!(self.value, Some(Value::List(_)));
        match list_op {
            Some(op) if is_list && (!was_dirty || self.list_ops.is_some()) => {
                let ops = self.list_ops.get_or_insert_with(Box::default);
                match (ops.last_mut(), op) {
                    // Consecutive pops travel as one pop-n.
                    (Some(StateOp::PopN(n)), StateOp::Pop) => *n = n.saturating_add(1),
                    (_, StateOp::Pop) => ops.push(StateOp::PopN(1)),
                    (_, op) => ops.push(op),
                }
            }
            _ => self.list_ops = None,
        }
        self.dirty = true;
        !was_dirty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_value_takes_a_cache_line_at_most() {
        // A client caches every flow's values: an entry's size is what its lookups touch.
        assert!(std::mem::size_of::<Cached>() <= 64, "{} bytes", std::mem::size_of::<Cached>());
    }
}
