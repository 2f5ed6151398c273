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
    /// means the whole value must be written.
    pub(super) list_ops: Option<Vec<StateOp>>,
}

impl Cached {
    pub(super) fn new(value: Option<Value>) -> Cached {
        Cached { value, dirty: false, list_ops: None }
    }

    /// Records an update for the next flush: `list_op` is the update if it was a push or a
    /// pop (what a list's flush sends), `None` for any other update (the whole value is written).
    pub(super) fn record(&mut self, list_op: Option<StateOp>) -> bool {
        let was_dirty = self.dirty;
        let is_list = matches!(self.value, Some(Value::List(_)));
        match list_op {
            Some(op) if is_list && (!was_dirty || self.list_ops.is_some()) => {
                let ops = self.list_ops.get_or_insert_with(Vec::new);
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
